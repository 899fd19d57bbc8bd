"""The gpu skip hook of tests/conftest.py: without a usable GPU, `gpu` tests skip naming the cause, and
fail with it where a GPU is required (--require-gpu, CUDAGATE_REQUIRE_GPU=1)."""

import shutil
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(pytester, monkeypatch):
    shutil.copy(TESTS / "conftest.py", pytester.path / "conftest.py")
    shutil.copy(TESTS / "helpers.py", pytester.path / "helpers.py")
    (pytester.path / "gpu").mkdir()
    shutil.copy(TESTS / "gpu" / "gpu_support.py", pytester.path / "gpu" / "gpu_support.py")
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    pytester.makepyfile(test_device="""
        import pytest

        @pytest.mark.gpu
        def test_on_the_device():
            pass

        def test_on_the_cpu():
            pass
    """)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no device here even on a GPU machine
    monkeypatch.delenv("CUDAGATE_REQUIRE_GPU", raising=False)
    return pytester


def test_without_a_gpu_the_skip_names_the_cause(project):
    result = project.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.re_match_lines([r".*no CUDA device \((cuda\.bindings is not importable|the CUDA driver is unusable"
                                  r"|cuInit failed|cuDeviceGetCount failed|the driver reports no CUDA device).*"])


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_required_gpu_fails_with_the_underlying_error(project, monkeypatch, how):
    args = ["-p", "no:cacheprovider"]
    if how == "option":
        args.append("--require-gpu")
    else:
        monkeypatch.setenv("CUDAGATE_REQUIRE_GPU", "1")
    result = project.runpytest_subprocess(*args)
    result.assert_outcomes(passed=1, errors=1)  # fails at setup, before any fixture
    result.stdout.fnmatch_lines(["*a GPU is required here (--require-gpu / CUDAGATE_REQUIRE_GPU) but none is usable: *"])


def test_zero_does_not_require_a_gpu(project, monkeypatch):
    monkeypatch.setenv("CUDAGATE_REQUIRE_GPU", "0")
    project.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, skipped=1)


@pytest.mark.parametrize("required", [False, True])
def test_a_missing_tool_of_a_gpu_test_skips_or_fails_where_required(project, monkeypatch, required):
    """The GPU tests' own skips (compute-sanitizer, ncu, openai) go through gpu_support: on a machine that
    must run every GPU test they fail with the reason instead of passing unseen."""
    project.makepyfile(test_device="""
        from gpu_support import require_module, unavailable

        def test_tool(pytestconfig):
            unavailable(pytestconfig, "ncu (Nsight Compute) not found")

        def test_module(pytestconfig):
            require_module(pytestconfig, "no_such_module_for_cudagate")
    """)
    if required:
        monkeypatch.setenv("CUDAGATE_REQUIRE_GPU", "1")
    result = project.runpytest_subprocess("-rs", "-p", "no:cacheprovider")
    if required:
        result.assert_outcomes(failed=2)
        result.stdout.fnmatch_lines(["*required here (--require-gpu / CUDAGATE_REQUIRE_GPU) but unavailable: "
                                     "ncu (Nsight Compute) not found*",
                                     "*unavailable: no_such_module_for_cudagate is not importable*"])
    else:
        result.assert_outcomes(skipped=2)
        result.stdout.fnmatch_lines(["*ncu (Nsight Compute) not found*"])
