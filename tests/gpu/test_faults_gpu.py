"""Fault isolation on a real GPU: a kernel that faults, hangs, leaves outputs unwritten, asks for
too much memory or too large a launch fails alone; every other item still runs and passes."""

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.worker.requests import run_request
from pytest_cudagate.suite.loader import load_suite

from gpu_support import copy_suite, gate, suite_yaml

pytestmark = pytest.mark.gpu

BAD_KERNELS = {
    # Writes far outside any allocation: a sticky CUDA_ERROR_ILLEGAL_ADDRESS that kills the context.
    "illegal": """
        extern "C" __global__ void illegal(const float* x, float* y, int rows, int cols) {
            y[(size_t)1 << 40] = x[0];
        }""",
    # Spins forever on a value it never changes: only the watchdog ends it.
    "hang": """
        extern "C" __global__ void hang(const float* x, float* y, int rows, int cols) {
            volatile const float* p = x;
            while (p[0] < 1e30f) { }
            y[0] = p[0];
        }""",
    # Computes only the even rows: the odd ones keep whatever the buffer held.
    "even_rows": """
        extern "C" __global__ void even_rows(const float* x, float* y, int rows, int cols) {
            int r = blockIdx.x;
            if (r % 2) return;
            float m = -1e30f, s = 0.f;
            for (int i = 0; i < cols; ++i) m = fmaxf(m, x[r * cols + i]);
            for (int i = 0; i < cols; ++i) s += expf(x[r * cols + i] - m);
            for (int i = threadIdx.x; i < cols; i += blockDim.x) y[r * cols + i] = expf(x[r * cols + i] - m) / s;
        }""",
}


@pytest.fixture()
def faulty_suite(tmp_path: Path) -> Path:
    root = copy_suite("softmax", tmp_path)
    raw = yaml.safe_load((root / "cudagate.yaml").read_text())
    good = raw["kernels"][0]
    kernels = [dict(good, name="good_first", entry="softmax_rows")]
    for name, source in BAD_KERNELS.items():
        (root / f"{name}.cu").write_text(textwrap.dedent(source))
        kernels.append({"name": name, "source": f"{name}.cu", "launch": good["launch"]})
    kernels.append(dict(good, name="good_last", entry="softmax_rows"))
    raw["kernels"] = kernels
    raw["cases"] = [c for c in raw["cases"] if c["name"] in ("correct_7x33", "perf_256x1024")]
    (root / "cudagate.yaml").write_text(suite_yaml(raw))
    return root


def test_each_bad_kernel_fails_alone(faulty_suite: Path):
    result = gate(faulty_suite / "cudagate.yaml", "--cuda-gate-timeout", "8")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    for kernel in ("good_first", "good_last"):
        for case in ("compile", "correct_7x33", "perf_256x1024"):
            assert f"PASSED cudagate.yaml::{kernel}::{case}" in out, out
    for case in ("correct_7x33", "perf_256x1024"):
        for kernel in BAD_KERNELS:
            assert f"FAILED cudagate.yaml::{kernel}::{case}" in out, out
    assert "the kernel faulted" in out and "CUDA_ERROR_ILLEGAL_ADDRESS" in out, out
    assert "timeout: no answer within 8 s" in out, out
    assert re.search(r"\d+ elements were never written by the kernel", out), out


def test_impossible_requests_are_refused_whole_and_the_worker_carries_on(tmp_path: Path):
    """A 1 TiB buffer and a 4096-thread block never reach the device: the worker refuses the request,
    naming both, before it allocates anything, and serves the next request as if nothing happened."""
    suite = load_suite(copy_suite("softmax", tmp_path) / "cudagate.yaml")
    program, case = suite.kernels[0], suite.case("correct_7x33")
    request = run_request(suite, program, [case, case, case], output_dir=tmp_path / "out")
    for spec, name in zip(request["cases"], ["before", "oom", "too_many_threads"]):
        spec["name"] = name
    request["cases"][1]["buffers"]["y"]["count"] = 1 << 38  # 1 TiB of float32: more than any GPU has
    request["cases"][2]["launch"]["block"] = [4096, 1, 1]  # over the 1024-thread limit
    with HarnessClient(timeout_s=30) as client:
        client.start()
        with pytest.raises(RuntimeError) as refused:
            client.run(request)
        after = client.run(run_request(suite, program, [case], output_dir=tmp_path / "after"))
    text = str(refused.value)
    assert "refused run request" in text, text
    assert "case 'oom': buffers.y.count must be an integer from 0 up to" in text, text
    assert "case 'too_many_threads': launch.block [4096, 1, 1] is outside the device's limits" in text, text
    assert after.cases[case.name]["status"] == "ok", after.cases
    assert client.restarts == 0
    expected = np.load(suite.expected_path(case, suite.outputs[0]))
    output = np.load(after.cases[case.name]["outputs"]["y"]["path"]).reshape(expected.shape)
    assert np.allclose(output, expected, atol=1e-6, rtol=1e-4)


def test_worker_restarts_after_a_fault_and_keeps_earlier_answers(tmp_path: Path):
    root = copy_suite("softmax", tmp_path)
    (root / "illegal.cu").write_text(textwrap.dedent(BAD_KERNELS["illegal"]))
    suite = load_suite(root / "cudagate.yaml")
    good = suite.kernels[0]
    case = suite.case("correct_7x33")
    with HarnessClient(timeout_s=30) as client:
        client.start()
        first = client.run(run_request(suite, good, [case], output_dir=tmp_path / "a"))
        bad_request = run_request(suite, good, [case], output_dir=tmp_path / "b")
        bad_request["kernel"].update(name="illegal", entry="illegal", source=(root / "illegal.cu").read_text())
        bad = client.run(bad_request)
        after = client.run(run_request(suite, good, [case], output_dir=tmp_path / "c"))
    assert first.cases[case.name]["status"] == "ok"
    assert bad.cases[case.name]["error"]["kind"] == "fault"
    assert after.cases[case.name]["status"] == "ok"
    assert client.restarts == 1
