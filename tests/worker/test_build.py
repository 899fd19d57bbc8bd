"""A kernel cannot tell at compile time which copy it is: the current, approved and released builds
of a comparison reach NVRTC under one source name (``__FILE__``), the kernel's signed name and never
its file's path, so the same text gives the same cubin whatever the file is called."""

from __future__ import annotations

import dataclasses

import pytest

from cudagate_harness.compiler import compile_kernel
from helpers import write_suite
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.trust.release import ReleasedApproval
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.worker.requests import KernelVersion, compare_request, current_version, kernel_spec

# Keeps __FILE__ in the cubin, as a kernel that branches on it would.
PROBE_CU = """\
__device__ const char probe_file[] = __FILE__;
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[r * cols + c] = 2.0f * x[r * cols + c] + (float)probe_file[c % sizeof(probe_file)] * 0.0f;
}
"""


@pytest.fixture
def suite(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    return load_suite(write_suite(tmp_path / "scale", kernel_source=PROBE_CU))


def cubin(spec: dict) -> bytes:
    result = compile_kernel(spec["source"], entry=spec["entry"], arch="sm_90", source_name=spec["source_name"],
                            options=spec["options"], headers=spec["headers"], use_cache=False)
    assert result.ok, result.log
    return result.cubin


def request_against(suite, baseline: KernelVersion, tmp_path) -> dict:
    return compare_request(suite, suite.case("perf"), current=current_version(suite.kernels[0]), baseline=baseline,
                           output_dir=tmp_path / "out", chunk=10)


def test_the_probe_sees_its_source_name(suite):
    spec = {"source": PROBE_CU, "entry": "scale2", "options": [], "headers": {}}
    assert cubin({**spec, "source_name": "scale.cu"}) != cubin({**spec, "source_name": "scale2@approved/0123.cu"})


def test_the_approved_build_compiles_to_the_current_cubin(suite, tmp_path):
    ledger = Ledger.for_suite(suite)
    approval = approval_for(ledger, suite.kernels[0], approved_by="alice", approved_at="2026-12-03", git={},
                            tool_version="test")
    kernels = request_against(suite, ledger.approved_version(approval), tmp_path)["kernels"]
    assert kernels["approved"]["source_name"] == kernels["current"]["source_name"]
    assert cubin(kernels["approved"]) == cubin(kernels["current"])


def test_the_released_build_compiles_to_the_current_cubin(suite, tmp_path):
    program = suite.kernels[0]
    released = ReleasedApproval(kernel="scale2", label="v1.0.0", commit="0" * 40, source=PROBE_CU,
                                source_sha256="0" * 64, headers={}, entry="scale2", options=(),
                                arch_suffix=program.arch_suffix, launch=program.launch.to_json(),
                                launch_overrides={}, build=None)
    kernels = request_against(suite, released.version, tmp_path)["kernels"]
    assert cubin(kernels["approved"]) == cubin(kernels["current"])


def test_a_renamed_file_keeps_the_name_nvrtc_sees(suite):
    """A pull request may rename the source file and keep the approval (the path is not the kernel's
    identity): the build must not see the new name, or a kernel could be slow only under it."""
    program = suite.kernels[0]
    renamed = program.source.with_name("scale_v2.cu")
    renamed.write_text(program.source.read_text())
    moved = dataclasses.replace(program, source=renamed)
    assert kernel_spec(moved)["source_name"] == kernel_spec(program)["source_name"] == "scale2.cu"
    assert cubin(kernel_spec(moved)) == cubin(kernel_spec(program))


def test_a_compile_error_still_names_the_file(suite):
    program = suite.kernels[0]
    program.source.write_text(PROBE_CU.replace("2.0f", "undefined_here"))
    result = compile_program(program, "sm_90")
    assert not result.ok and f"{program.source.name}(" in result.log and "scale2.cu" not in result.log
