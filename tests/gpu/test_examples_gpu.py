"""The examples end to end on a real GPU: every kernel compiles, replays and passes."""

import pytest

from gpu_support import EXAMPLES, REPO, gate

pytestmark = pytest.mark.gpu


def test_examples_pass_end_to_end():
    result = gate(EXAMPLES, cwd=REPO, signed=True)  # the examples are signed: no trust override
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for node in ("examples/matmul/cudagate.yaml::matmul_f32::correct_31x37x29",
                 "examples/matmul/cudagate.yaml::matmul_f32::perf_384x256x320",
                 "examples/softmax/cudagate.yaml::softmax_rows::perf_256x1024",
                 "examples/rmsnorm/cudagate.yaml::rmsnorm_bf16::perf_4096x4096",
                 "examples/split_reduce/cudagate.yaml::row_sums_split::perf_64x65536"):
        assert f"PASSED {node}" in output, output
    summary = output.strip().splitlines()[-1]
    assert "passed" in summary and "failed" not in summary and "skipped" not in summary, summary
