"""A kernel template over two types (`instantiate: {T: [float32, bfloat16]}`) on a real GPU: each
instantiation compiles from its C++ spelling, passes on its own case data, and is approved apart."""

import json
from pathlib import Path

import pytest

from gpu_support import cli, gate
from instantiated import write_gelu

pytestmark = pytest.mark.gpu

KERNELS = ("gelu[T=float32]", "gelu[T=bfloat16]")


def test_each_instantiation_is_gated_and_approved_on_its_own(tmp_path: Path):
    suite = write_gelu(tmp_path / "gelu")
    root = suite.parent
    result = cli("cases", "generate", str(suite), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr

    result = cli("approve", str(suite), KERNELS[0], "--approved-by", "gpu-test", "--runs", "2", cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    ledger = json.loads((root / "cudagate.approvals.json").read_text())
    assert set(ledger["approvals"]) == {KERNELS[0]}  # approving gelu<float> says nothing of gelu<__nv_bfloat16>

    report = tmp_path / "report"
    result = gate(suite, "--cuda-gate-report", str(report))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for kernel in KERNELS:
        for case in ("small", "perf"):
            assert f"PASSED cudagate.yaml::{kernel}::{case}" in out, out
    items = json.loads((report / "report.json").read_text())["items"]
    assert {(i["kernel"], i["case"]) for i in items} == {(k, c) for k in KERNELS for c in ("small", "perf")}

    result = cli("approve", str(suite), KERNELS[1], "--approved-by", "gpu-test", "--runs", "2", cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    ledger = json.loads((root / "cudagate.approvals.json").read_text())
    assert set(ledger["approvals"]) == set(KERNELS)
    assert ledger["approvals"][KERNELS[0]]["entry"] == "gelu<float>"
    assert ledger["approvals"][KERNELS[1]]["entry"] == "gelu<__nv_bfloat16>"

    with (root / "gelu.cu").open("a") as source:  # A/A: each instantiation timed against its own approval
        source.write("\n// identical copy (A/A)\n")
    result = gate(suite, "--cuda-gate-report", str(report))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    perf = [i for i in json.loads((report / "report.json").read_text())["items"] if i["case"] == "perf"]
    assert sorted(i["kernel"] for i in perf) == sorted(KERNELS), out
