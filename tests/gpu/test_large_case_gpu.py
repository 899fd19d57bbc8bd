"""The matmul example's generated 2048³ case on a real GPU: rebuilt from its seed, checked against its
signed digests and sample by reference.cu, then judged like any case (signed: no trust override)."""

import json

import pytest

from gpu_support import EXAMPLES, REPO, gate

pytestmark = pytest.mark.gpu

NODE = "examples/matmul/cudagate.yaml::matmul_f32::large_2048x2048x2048"


def test_the_large_matmul_case_passes_through_the_gate(tmp_path):
    result = gate(EXAMPLES / "matmul", "--cuda-gate-class", "large", "--cuda-gate-report", str(tmp_path), cwd=REPO,
                  signed=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"PASSED {NODE}" in output and "perf_256x256x256" not in output.split("short test summary")[-1], output
    items = {i["case"]: i for i in json.loads((tmp_path / "report.json").read_text())["items"]}
    large = items["large_2048x2048x2048"]
    assert large["class"] == "large" and large["correctness"]["passed"], large["message"]
    assert large["samples_ms"].get("current"), "the large case was not timed"
