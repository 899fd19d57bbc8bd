"""CUDA headers on a machine without a toolkit: <cuda_bf16.h>, <cuda_fp8.h>, CUB and libcu++ from the
pinned nvidia-cuda-runtime, -crt and -cccl packages, compiled by the real NVRTC in its confined child.

Each kernel compiles from the packages (``CUDA_HOME`` naming no toolkit, as a user picks them on a
machine that has one), from a toolkit-like folder made of those packages (the toolkit route on a clean
CI machine), and from this machine's toolkit when it has one (CUDA 13.0's CCCL 3.0 here).
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cudagate_harness import compiler, toolkit
from cudagate_harness.compiler import cache_key, compile_kernel, toolkit_include_dirs
from helpers import KERNEL_CU, write_suite

pytest_plugins = ["pytester"]

BF16_CU = """\
#include <cuda_bf16.h>
extern "C" __global__ void axpy_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, float a, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(a) * x[i] + y[i] + __hmul(x[i], x[i]);
}
"""

FP8_CU = """\
#include <cuda_fp8.h>
extern "C" __global__ void requantise(const __nv_fp8_e4m3* x, __nv_fp8_e5m2* y, float* back, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = static_cast<float>(x[i]);
    y[i] = __nv_fp8_e5m2(2.0f * v);
    back[i] = static_cast<float>(y[i]);
}
"""

CUB_CU = """\
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void block_sums(const float* x, float* sums)
{
    using Reduce = cub::BlockReduce<float, 256>;
    __shared__ typename Reduce::TempStorage scratch;
    const float total = Reduce(scratch).Sum(x[blockIdx.x * 256 + threadIdx.x]);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}
"""

LIBCUXX_CU = """\
#include <cuda/std/limits>
#include <cuda/std/type_traits>
template <typename T>
__global__ void clamp_to_max(T* y, int n)
{
    static_assert(cuda::std::is_floating_point_v<T>);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] > cuda::std::numeric_limits<T>::max() ? cuda::std::numeric_limits<T>::max() : y[i];
}
template __global__ void clamp_to_max<float>(float*, int);
"""

KERNELS = {"bf16": (BF16_CU, "axpy_bf16"), "fp8": (FP8_CU, "requantise"), "cub": (CUB_CU, "block_sums"),
           "libcu++": (LIBCUXX_CU, "clamp_to_max<float>")}


MACHINE_TOOLKIT = Path("/usr/local/cuda")


def _has_toolkit() -> bool:
    return (MACHINE_TOOLKIT / "include" / "cuda_fp16.h").is_file()


@pytest.fixture
def fresh_headers():
    """The include folders looked up again for this test (they are found once per process)."""
    compiler.toolkit_headers.cache_clear()
    yield
    compiler.toolkit_headers.cache_clear()


def _use_packages(monkeypatch, tmp_path: Path) -> None:
    """The header packages, as a user picks them: $CUDA_HOME names a folder holding no toolkit."""
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-toolkit"))


def _package_toolkit(monkeypatch, tmp_path: Path) -> None:
    """A toolkit's layout (include/ with crt/ and cccl/) made of the installed header packages, named by
    $CUDA_HOME: the toolkit route, on a machine that has no toolkit."""
    packages = Path(toolkit.wheel_headers(int(compiler.nvrtc_version().split(".")[0])).dirs[0])
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "include").symlink_to(packages, target_is_directory=True)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))


def _machine_toolkit(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)


HEADER_SOURCES = {"packages": _use_packages, "package-toolkit": _package_toolkit, "toolkit": _machine_toolkit}


@pytest.fixture
def packages_only(fresh_headers, monkeypatch, tmp_path):
    """No toolkit: the header packages are all there is, as on a clean CI machine."""
    _use_packages(monkeypatch, tmp_path)


@pytest.fixture
def headers_from(request, fresh_headers, monkeypatch, tmp_path):
    HEADER_SOURCES[request.param](monkeypatch, tmp_path)
    return request.param


def _matrix(kinds: list[str], quick: str) -> list:
    """Every kind from every header source. The fast run keeps each kind from the packages (a clean CI
    machine) and each source for the quick kind; the other pairs are real compiles of seconds, `slow`."""
    pairs = []
    for source in HEADER_SOURCES:
        marks = [pytest.mark.skipif(not _has_toolkit(), reason=f"no CUDA toolkit at {MACHINE_TOOLKIT} on this machine")
                 ] if source == "toolkit" else []
        for kind in kinds:
            slow = [pytest.mark.slow] if source != "packages" and kind != quick else []
            pairs.append(pytest.param(kind, source, marks=marks + slow, id=f"{source}-{kind}"))
    return pairs


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "nvrtc"


@pytest.mark.parametrize(("kind", "headers_from"), _matrix(list(KERNELS), quick="bf16"), indirect=["headers_from"])
def test_a_kernel_using_cuda_headers_compiles_for_sm_90(kind, headers_from, cache):
    source, entry = KERNELS[kind]
    result = compile_kernel(source, entry=entry, arch="sm_90", source_name=f"{kind}.cu")
    assert result.ok, result.log
    assert result.cubin[:4] == b"\x7fELF"
    if "<" in entry:
        assert result.lowered_name.startswith("_Z")  # found through its name expression
    else:
        assert result.lowered_name == entry


CONSTANTS_CU = """\
#if INT_MAX != 2147483647 || CHAR_BIT != 8 || LLONG_MAX != 9223372036854775807LL
#error the integer limits
#endif
static_assert(FLT_MAX == 0x1.fffffep127f && FLT_MIN == 0x1p-126f && FLT_EPSILON == 0x1p-23f, "float.h");
static_assert(DBL_MAX == 0x1.fffffffffffffp1023 && DBL_EPSILON == 0x1p-52, "float.h");
static_assert(INFINITY > FLT_MAX && -INFINITY < -FLT_MAX && NAN != NAN && HUGE_VAL > DBL_MAX, "math.h");
static_assert(M_PI > 3.14159265358 && M_PI < 3.14159265359 && M_E > 2.71828182845 && M_E < 2.71828182846, "math.h");
static_assert(M_SQRT2 * M_SQRT2 > 1.99999999 && M_LN2 > 0.69314718 && M_LN2 < 0.69314719, "math.h");
__device__ constexpr float kBig = FLT_MAX;
extern "C" __global__ void clamp_inf(float* y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && (y[i] == INFINITY || isnan(y[i]))) y[i] = kBig / static_cast<float>(M_PI) - INT_MAX;
}
"""

C_LIBRARY_CU = """\
#include <stdio.h>
#include <math.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <cstdio>
#include <cmath>
#include <cfloat>
#include <climits>
#include <cstdint>
extern "C" __global__ void norms(const float* x, float* y, int n)
{
    const std::int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint64_t wide = UINT32_MAX;
    if (i >= n) return;
    if (i == 0) printf("n = %d, wide = %llu\\n", n, (unsigned long long)wide);
    y[i] = std::sqrt(std::fabs(x[i])) + (std::isnan(x[i]) ? FLT_MAX : 0.0f) + sqrtf(M_PI);
}
"""

OWN_DEFINITIONS_CU = """\
#define M_PI 3.14f
#define FLT_MAX 1.0e30f
#include <cuda/std/cmath>
static_assert(M_PI == 3.14f && FLT_MAX == 1.0e30f, "the kernel's own definitions hold");
extern "C" __global__ void own(float* y) { y[0] = M_PI + FLT_MAX + INFINITY + NAN + (DBL_MAX > M_E); }
"""

CUB_UMBRELLA_CU = """\
#include <cub/cub.cuh>
#include <cuda/std/limits>
extern "C" __global__ void block_max(const float* x, float* out)
{
    using Reduce = cub::BlockReduce<float, 128>;
    using Warp = cub::WarpReduce<float>;
    __shared__ typename Reduce::TempStorage block;
    __shared__ typename Warp::TempStorage warp[4];
    const float v = x[blockIdx.x * 128 + threadIdx.x];
    const float top = Reduce(block).Reduce(v, cuda::maximum<>{});
    const float lane = Warp(warp[threadIdx.x / 32]).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = top > cuda::std::numeric_limits<float>::max() ? 0.0f : top + lane;
}
"""

NVRTC_STD = {"constants": (CONSTANTS_CU, "clamp_inf"), "C library": (C_LIBRARY_CU, "norms"),
             "own definitions": (OWN_DEFINITIONS_CU, "own"), "cub.cuh": (CUB_UMBRELLA_CU, "block_max")}


# cub.cuh from every source: it reaches include/cccl, where CCCL 3.0 broke it (bf16 never does).
@pytest.mark.parametrize(("kind", "headers_from"), _matrix(list(NVRTC_STD), quick="cub.cuh"),
                         indirect=["headers_from"])
def test_what_nvcc_gets_from_the_host_compiles_under_nvrtc(kind, headers_from, cache):
    """The standard constants without an #include, the C library's headers a kernel file includes, and
    <cub/cub.cuh>'s block and warp primitives: from the packages, a toolkit made of them, and this
    machine's toolkit (CCCL 3.0, where cub.cuh pulled in CUB's host-side device algorithms)."""
    source, entry = NVRTC_STD[kind]
    result = compile_kernel(source, entry=entry, arch="sm_90", source_name="k.cu")
    assert result.ok, result.log
    assert "warning" not in result.log  # a kernel's own #define takes the harness's place silently


def test_the_harness_headers_are_part_of_the_compile_cache_key(tmp_path, monkeypatch):
    before = _key()
    copy = tmp_path / "nvrtc_include"
    shutil.copytree(compiler.NVRTC_INCLUDE, copy)
    (copy / compiler.NVRTC_PRELUDE).write_text((copy / compiler.NVRTC_PRELUDE).read_text() + "#define EXTRA 1\n")
    monkeypatch.setattr(compiler, "NVRTC_INCLUDE", copy)
    compiler.nvrtc_std_identity.cache_clear()
    try:
        assert _key() != before
    finally:
        compiler.nvrtc_std_identity.cache_clear()


def test_cuda_home_naming_no_toolkit_picks_the_packages(tmp_path, fresh_headers, monkeypatch):
    """A user picks the header packages with CUDA_HOME, even where /usr/local/cuda holds a toolkit."""
    _use_packages(monkeypatch, tmp_path)
    assert [line.split()[0] for line in compiler.toolkit_headers().identity] == [
        "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl"]


def test_the_packages_give_their_folders_and_name_their_versions(packages_only):
    dirs = toolkit_include_dirs()
    names = [line.split()[0] for line in compiler.toolkit_headers().identity]
    assert names == ["nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl"]
    for name, line in zip(names, compiler.toolkit_headers().identity):
        assert line == f"{name} {metadata.version(name)}"
    # the CUDA headers (crt/ beneath them), then CCCL's own include root; real paths, each once
    assert len(dirs) == 2 and Path(dirs[1]) == Path(dirs[0]) / "cccl"
    assert (Path(dirs[0]) / "cuda_bf16.h").is_file() and (Path(dirs[0]) / "crt" / "mma.h").is_file()
    assert (Path(dirs[1]) / "cub" / "cub.cuh").is_file()
    assert all(str(Path(d).resolve()) == d for d in dirs)


def test_the_projects_install_pulls_the_header_packages_of_nvrtcs_major():
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    pins = {req.name: req for req in map(Requirement, tomllib.loads(pyproject.read_text())["project"]["dependencies"])}
    nvrtc_ceiling = {s.version for s in pins["nvidia-cuda-nvrtc"].specifier if s.operator == "<"}
    for name, _, _ in toolkit.HEADER_PACKAGES:
        assert name in pins, f"pyproject.toml: add {name} to dependencies"
        assert {s.version for s in pins[name].specifier if s.operator == "<"} == nvrtc_ceiling
        assert pins[name].specifier.contains(metadata.version(name))


def _fake_toolkit(root: Path, *, cccl: bool = True) -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_fp16.h").write_text("#pragma once\n")
    if cccl:
        (root / "include" / "cccl" / "cub").mkdir(parents=True)
    (root / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.2"}}))
    return root


def test_a_toolkit_gives_all_the_headers_never_mixed_with_the_packages(tmp_path, fresh_headers, monkeypatch):
    root = _fake_toolkit(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(root))
    include = (root / "include").resolve()
    assert toolkit_include_dirs() == (str(include), str(include / "cccl"))
    assert compiler.toolkit_headers().identity[0].startswith("toolkit version.json sha256 ")
    # CUDA 12 kept CUB in include/ itself: one folder, and still none of the packages' folders
    compiler.toolkit_headers.cache_clear()
    old = _fake_toolkit(tmp_path / "cuda12", cccl=False)
    monkeypatch.setenv("CUDA_HOME", str(old))
    assert toolkit_include_dirs() == (str((old / "include").resolve()),)


def _key() -> str:
    return cache_key(KERNEL_CU, entry="scale2", options=[], headers={}, arch="sm_90")


@pytest.mark.slow
def test_a_new_header_package_version_never_reuses_a_cached_cubin(packages_only, cache, monkeypatch):
    first = compile_kernel(CUB_CU, entry="block_sums", arch="sm_90")
    assert first.ok, first.log
    assert compile_kernel(CUB_CU, entry="block_sums", arch="sm_90").cache_hit
    before = _key()
    real = metadata.distribution

    class Upgraded:
        """nvidia-cuda-cccl's files where they are, under the next version's number."""

        def __init__(self, dist):
            self.version, self._dist = "13.9.0", dist

        def locate_file(self, path):
            return self._dist.locate_file(path)

    monkeypatch.setattr(metadata, "distribution", lambda name: Upgraded(real(name)) if name == "nvidia-cuda-cccl" else real(name))
    compiler.toolkit_headers.cache_clear()
    assert "nvidia-cuda-cccl 13.9.0" in compiler.toolkit_headers().identity
    assert _key() != before
    again = compile_kernel(CUB_CU, entry="block_sums", arch="sm_90")
    assert again.ok and not again.cache_hit and again.key != first.key


def test_a_toolkit_upgrade_changes_the_cache_key(tmp_path, fresh_headers, monkeypatch):
    root = _fake_toolkit(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(root))
    before = _key()
    (root / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": "13.0.3"}}))
    compiler.toolkit_headers.cache_clear()
    assert _key() != before
    # without version.json, the headers' own version defines name it
    (root / "version.json").unlink()
    (root / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    compiler.toolkit_headers.cache_clear()
    assert compiler.toolkit_headers().identity == ("toolkit CUDA_VERSION 13000",)
    (root / "include" / "cuda.h").write_text("#define CUDA_VERSION 13010\n")
    compiler.toolkit_headers.cache_clear()
    assert compiler.toolkit_headers().identity == ("toolkit CUDA_VERSION 13010",)


SUITE_KERNEL_CU = """\
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cub/block/block_reduce.cuh>
#include <cuda/std/limits>
extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float two = __bfloat162float(__float2bfloat16(2.0f)) * static_cast<float>(__nv_fp8_e4m3(1.0f));
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[r * cols + c] = cuda::std::numeric_limits<float>::is_iec559 ? two * x[r * cols + c] : 0.0f;
}
"""


@pytest.mark.slow
def test_the_compile_item_of_a_suite_using_them_passes_without_a_toolkit(pytester, packages_only, cache):
    write_suite(pytester.path, kernel_source=SUITE_KERNEL_CU)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-v", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*cudagate.yaml::scale2::compile PASSED*"])
