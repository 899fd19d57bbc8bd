"""The matmul example's cuBLAS SGEMM baseline on a real GPU: every performance case reports the kernel's
time as a finite multiple of cuBLAS's with an interval, and cuBLAS's output matched the reference, both
when the kernel is timed alone (no approval) and when it is compared with its approved version.
cuBLAS comes from pip's wheels (torch brings nvidia/cu13/lib) or $CUDAGATE_CUBLAS."""

import json
import math
from pathlib import Path

import pytest

from gpu_support import cli, copy_suite, gate

pytestmark = pytest.mark.gpu


def library_items(folder: Path) -> dict[str, dict]:
    document = json.loads((folder / "report.json").read_text())
    return {i["case"]: i for i in document["items"] if i["kind"] == "performance" and i["status"] != "skipped"}


def assert_finite_ratios(items: dict[str, dict], output: str) -> None:
    assert items, output
    for case, item in items.items():
        lib = item["library"]
        assert lib is not None and lib["label"] == "cuBLAS SGEMM", (case, output)
        assert lib["error"] is None, (case, lib["error"])  # the output check passed: no error
        est = lib["estimate"]
        assert math.isfinite(est["ratio"]) and 0 < est["low"] <= est["ratio"] <= est["high"] < math.inf, (case, est)
        assert est["n"] == 100 and lib["library"]["median"] > 0, (case, lib)


def test_every_performance_case_reports_a_finite_multiple_of_cublas(tmp_path):
    suite = copy_suite("matmul", tmp_path) / "cudagate.yaml"
    result = gate(suite, "--cuda-gate-report", str(tmp_path / "alone"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "× cuBLAS SGEMM [99% CI]" in output, output
    assert_finite_ratios(library_items(tmp_path / "alone"), output)

    approved = cli("approve", str(suite), "--approved-by", "gpu-test", "--runs", "1", cwd=suite.parent)
    assert approved.returncode == 0, approved.stdout + approved.stderr
    source = suite.parent / "matmul.cu"
    source.write_text(source.read_text() + "\n// changed: compared with the approved version\n")
    result = gate(suite, "--cuda-gate-report", str(tmp_path / "compared"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    items = library_items(tmp_path / "compared")
    assert all(i["latency"]["estimate"] is not None for i in items.values()), output  # the interleaved path
    assert_finite_ratios(items, output)
