"""The matmul example's cuBLAS SGEMM baseline on a real GPU: every performance case reports the kernel's
time as a finite multiple of cuBLAS's with an interval, and cuBLAS's output matched the reference, both
when the kernel is timed alone (no approval) and when it is compared with its approved version; and
`cudagate optimize` tells the model each candidate's multiple of cuBLAS.
cuBLAS comes from pip's wheels (torch brings nvidia/cu13/lib) or $CUDAGATE_CUBLAS."""

import json
import math
import re
from pathlib import Path

import pytest

from gpu_support import EXAMPLES, cli, copy_suite, gate, require_module

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


# A case line of the openai proposer's evidence: the candidate's multiple of cuBLAS, derived via the initial kernel.
DERIVED = re.compile(r"case (\w+): median [0-9.]+ µs \(initial [^;]*; ratio [0-9.]+, 99% CI [^;]*; "
                     r"([0-9.]+)× cuBLAS SGEMM \(derived via the initial kernel, 98% interval \[([0-9.]+), ([0-9.]+)\]; "
                     r"cuBLAS SGEMM median ([0-9.]+) µs\)\)")


def test_the_optimizer_tells_the_model_each_candidates_multiple_of_cublas(tmp_path, monkeypatch, pytestconfig):
    """The initial kernel and one candidate (the naive proposal), each case's multiple of cuBLAS in what the
    model reads next; cuBLAS is timed once per case, beside the initial kernel. Without the 2048³ case: seconds."""
    require_module(pytestconfig, "openai")
    from optimize_fakes import ScriptedServer, answer
    from pytest_cudagate.optimize.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", "sk-gpu-test-not-a-key")
    suite = copy_suite("matmul", tmp_path) / "cudagate.yaml"
    naive = (EXAMPLES / "matmul" / "proposals" / "01-naive.cu").read_text()
    launch = {"grid": ["cdiv(n, 16)", "cdiv(m, 16)"], "block": ["16", "16"]}
    # round 2 repeats round 1's answer: a duplicate is never measured, so only two kernels run
    script = [answer(naive, title="naive", **launch), answer(naive, title="naive again", **launch)]
    with ScriptedServer(script) as server:
        code = main([str(suite), "matmul_f32", "--proposer", "openai", "--base-url", server.url, "--allow-unsigned",
                     "--max-iterations", "2", "--results", str(tmp_path / "results"), "--quiet"])
    pack = sorted((tmp_path / "results").glob("run-*"))[-1]
    summary = json.loads((pack / "summary.json").read_text())
    history = json.loads((pack / "history.json").read_text())
    assert code in (0, 1) and [a["stage"] for a in history["attempts"]] == ["done", "done", "duplicate"], summary
    first, second = (request["messages"][-1]["content"] for request in server.requests)
    assert first.count("the initial kernel takes") == 2, first  # both performance cases, measured beside cuBLAS
    found = {m.group(1): [float(v) for v in m.groups()[1:]] for m in DERIVED.finditer(second)}
    assert set(found) == {"perf_256x256x256", "perf_384x256x320"}, second
    for case, (ratio, low, high, library_us) in found.items():
        assert all(math.isfinite(v) for v in (ratio, low, high, library_us)), (case, second)
        assert 0 < low <= ratio <= high and library_us > 0, (case, found[case])
    cases = [{c["case"]: c for c in a["cases"]} for a in history["attempts"][:2]]
    for case in found:  # one measurement of cuBLAS per case, shared by the initial kernel and the candidate
        assert cases[0][case]["vs_library"]["initial_vs_library"] == cases[1][case]["vs_library"]["initial_vs_library"]
    print(f"GPU {summary['usage'].get('gpu_seconds')} s;", json.dumps(found))
