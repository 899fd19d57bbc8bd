"""Real NVRTC compilation (the PyPI NVRTC, no GPU needed) and its on-disk cache."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cudagate_harness import compiler
from cudagate_harness.compiler import CompileOptionError, cache_key, check_options, compile_kernel, parse_resources
from helpers import BROKEN_CU, KERNEL_CU, write_suite
from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.suite.includes import local_headers
from pytest_cudagate.worker.requests import kernel_spec
from pytest_cudagate.suite.loader import load_suite

SHARED_CU = """\
extern "C" __global__ void tile(const float* x, float* y)
{
    __shared__ float buf[256];
    buf[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = buf[255 - threadIdx.x];
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "nvrtc"


def test_compiles_a_cubin_for_sm_90(cache):
    result = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90", source_name="scale.cu")
    assert result.ok, result.log
    assert result.arch == "sm_90"
    assert result.cubin[:4] == b"\x7fELF"
    assert result.lowered_name == "scale2"
    assert result.cache_hit is False
    assert len(result.key) == 64
    assert result.resources["registers"] > 0
    assert "sm_90" in result.log  # ptxas -v output is kept


def test_resources_include_static_shared_memory(cache):
    result = compile_kernel(SHARED_CU, entry="tile", arch="sm_90")
    assert result.ok, result.log
    assert result.resources["shared_static_bytes"] == 1024
    assert result.resources["registers"] > 0
    assert result.resources["spill_store_bytes"] == 0


def test_parse_resources_of_a_ptxas_log():
    log = ("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
           "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 2112 bytes smem, 368 bytes cmem[0]\n")
    assert parse_resources(log) == {"registers": 40, "barriers": 1, "shared_static_bytes": 2112, "constant_bytes": 368,
                                    "stack_frame_bytes": 16, "spill_store_bytes": 8, "spill_load_bytes": 4}
    assert parse_resources("") == {}


def test_a_cpp_entry_is_found_by_its_name(cache):
    source = "template <int N> __global__ void twice(float* y) { y[threadIdx.x] *= N; }\ntemplate __global__ void twice<2>(float*);\n"
    result = compile_kernel(source, entry="twice<2>", arch="sm_90")
    assert result.ok, result.log
    assert result.lowered_name.startswith("_Z")


def test_second_compile_is_a_cache_hit(cache):
    first = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    second = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.ok and second.cubin == first.cubin
    assert second.key == first.key
    assert second.resources == first.resources
    assert second.lowered_name == first.lowered_name
    assert sorted(p.suffix for p in cache.iterdir()) == [".cubin", ".json"]


def test_use_cache_false_neither_reads_nor_writes(cache):
    result = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90", use_cache=False)
    assert result.ok and not result.cache_hit
    assert not cache.exists() or not any(cache.iterdir())


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "a"))
    assert compiler.cache_dir() == tmp_path / "a" / "nvrtc"
    monkeypatch.delenv("CUDAGATE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compiler.cache_dir() == tmp_path / "xdg" / "cudagate" / "nvrtc"


def key(source=KERNEL_CU, entry="scale2", options=(), headers=None, arch="sm_90", source_name="scale2.cu"):
    return cache_key(source, entry=entry, options=list(options), headers=headers or {}, arch=arch,
                     source_name=source_name)


def test_cache_key_covers_everything_that_changes_the_binary():
    base = key()
    assert key() == base
    variants = [
        key(source=KERNEL_CU + "\n// comment\n"),
        key(entry="other"),
        key(options=["-DBLOCK=128"]),
        key(options=["-use_fast_math"]),
        key(arch="sm_80"),
        key(arch="sm_90a"),
        key(headers={"a.cuh": "#define X 1\n"}),
        key(headers={"a.cuh": "#define X 2\n"}),
        key(headers={"b.cuh": "#define X 1\n"}),
        key(source_name="other.cu"),  # __FILE__ and the cubin's line info
    ]
    assert base not in variants
    assert len(set(variants)) == len(variants)


def test_cache_key_ignores_header_order():
    assert key(headers={"a.h": "1", "b.h": "2"}) == key(headers={"b.h": "2", "a.h": "1"})


def test_different_options_compile_separately(cache):
    a = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    b = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90", options=["-DUNUSED=1"])
    assert a.key != b.key and not b.cache_hit


@pytest.mark.parametrize("damage", ["cubin", "meta", "truncate"])
def test_a_corrupt_cache_entry_is_ignored_and_recompiled(cache, damage):
    first = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    cubin_path, meta_path = cache / f"{first.key}.cubin", cache / f"{first.key}.json"
    if damage == "cubin":
        data = bytearray(cubin_path.read_bytes())
        data[100] ^= 0xFF
        cubin_path.write_bytes(bytes(data))
    elif damage == "meta":
        meta_path.write_text("{not json")
    else:
        cubin_path.write_bytes(cubin_path.read_bytes()[:10])
    again = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    assert again.ok and again.cache_hit is False
    assert again.cubin == first.cubin
    # ... and the entry is repaired
    assert json.loads(meta_path.read_text())["cubin_sha256"]
    assert compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90").cache_hit is True


def test_an_unwritable_cache_costs_only_speed(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(blocker))
    result = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90")
    assert result.ok and not result.cache_hit


def test_a_compile_error_is_a_result_with_nvrtcs_log(cache):
    result = compile_kernel(BROKEN_CU, entry="scale2", arch="sm_90", source_name="bad.cu")
    assert result.ok is False
    assert result.cubin is None
    assert "bad.cu(3): error" in result.log
    assert "undefined_value_here" in result.log
    assert result.resources == {}
    # errors never reach the on-disk cache (this process remembers them: tests/harness/test_bounded_compile.py)
    assert not any(cache.glob(f"{result.key}*"))


def test_a_missing_entry_is_named(cache):
    result = compile_kernel(KERNEL_CU, entry="x", arch="sm_90", source_name="scale.cu")
    assert result.ok is False
    assert "entry 'x' is not defined" in result.log
    assert "scale.cu" in result.log
    assert "__nv_name_map" not in result.log


@pytest.mark.parametrize("option", ["-rdc=true", "-arch=sm_80", "--relocatable-device-code=true", "-dc",
                                    "-rdc", "--relocatable-device-code=1", "--device-c", "--gpu-architecture=sm_80",
                                    "-gencode=arch=compute_80,code=sm_80", "-dlto", "--dlink-time-opt",
                                    # NVRTC trims options, so a padded one would slip past the anchored rules
                                    " -I/usr/include", "-DX=1 ", "-DX=1\n#include", "--use-pch=/tmp/x.pch",
                                    "--create-pch=/tmp/x.pch", "--pch-dir=/tmp", "--pch"])
def test_refused_options(cache, option):
    with pytest.raises(CompileOptionError) as excinfo:
        compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90", options=[option])
    assert repr(option) in str(excinfo.value)
    assert "not allowed" in str(excinfo.value)
    assert not cache.exists()  # refused before anything is compiled or cached


@pytest.mark.parametrize("option", ["-rdc=false", "--relocatable-device-code=false", "-DARCH=1", "-use_fast_math",
                                    "-std=c++17", "--extra-device-vectorization"])
def test_allowed_options(option):
    check_options([option])


def test_refused_options_become_a_failed_build_result(tmp_path):
    text = (Path(write_suite(tmp_path / "s", data=False)).read_text()
            .replace("    source: scale.cu\n", "    source: scale.cu\n    options: [-rdc=true]\n"))
    path = tmp_path / "s" / "cudagate.yaml"
    path.write_text(text)
    result = compile_program(load_suite(path).kernels[0], "sm_90")
    assert result.ok is False
    assert "-rdc=true" in result.log and "relocatable device code" in result.log


def test_quoted_includes_are_found_recursively_and_compiled(tmp_path, cache):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "ops.cuh").write_text('#pragma once\n#include "consts.cuh"\n'
                                              "__device__ float twice(float v) { return v * TWO; }\n")
    (tmp_path / "inc" / "consts.cuh").write_text("#pragma once\n#define TWO 2.0f\n")
    (tmp_path / "extra.cuh").write_text("#define EXTRA 1\n")
    source = tmp_path / "main.cu"
    text = ('#include "inc/ops.cuh"\n#include "extra.cuh"\n#include <cuda_fp16.h>\n'
            '// #include "missing.cuh" is skipped: not a file next to the source\n#include "missing.cuh"\n'
            'extern "C" __global__ void k(float* y) { y[threadIdx.x] = twice(1.0f) + EXTRA; }\n')
    source.write_text(text)
    headers = local_headers(source)
    assert headers == {
        "inc/ops.cuh": (tmp_path / "inc" / "ops.cuh").read_text(),
        "inc/consts.cuh": (tmp_path / "inc" / "consts.cuh").read_text(),
        "extra.cuh": "#define EXTRA 1\n",
    }
    text = text.replace('#include "missing.cuh"\n', "").replace("#include <cuda_fp16.h>\n", "")
    compiled = compile_kernel(text, entry="k", arch="sm_90", source_name="main.cu", headers=headers)
    assert compiled.ok, compiled.log
    # a header change is a different binary
    changed = dict(headers, **{"inc/consts.cuh": "#pragma once\n#define TWO 3.0f\n"})
    again = compile_kernel(text, entry="k", arch="sm_90", source_name="main.cu", headers=changed)
    assert again.ok and not again.cache_hit and again.key != compiled.key


def test_quoted_includes_stop_at_cycles(tmp_path):
    (tmp_path / "a.cuh").write_text('#ifndef A\n#define A\n#include "b.cuh"\n#endif\n')
    (tmp_path / "b.cuh").write_text('#ifndef B\n#define B\n#include "a.cuh"\n#endif\n')
    (tmp_path / "main.cu").write_text('#include "a.cuh"\n')
    assert sorted(local_headers(tmp_path / "main.cu")) == ["a.cuh", "b.cuh"]


def test_a_header_reached_by_two_spellings_is_included_once(tmp_path, cache):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "utils.cuh").write_text(
        '#pragma once\n#include "math.cuh"\n__device__ float twice(float v) { return mul(v, 2.0f); }\n')
    (tmp_path / "inc" / "math.cuh").write_text("#pragma once\n__device__ float mul(float a, float b) { return a * b; }\n")
    text = ('#include "inc/utils.cuh"\n#include "inc/math.cuh"\n'
            'extern "C" __global__ void k(float* y) { y[threadIdx.x] = mul(twice(1.0f), 3.0f); }\n')
    (tmp_path / "main.cu").write_text(text)
    result = compile_kernel(text, entry="k", arch="sm_90", source_name="main.cu",
                            headers=local_headers(tmp_path / "main.cu"))
    assert result.ok, result.log


def test_a_name_through_a_folder_and_back_compiles_as_the_file_system_opens_it(tmp_path, cache):
    """#include "sub/../ok.h" opens sub first: the header tree holds that folder (issue 41, fuzz 10); a
    name spelled through folders the tree has anyway keeps its one entry (the kernel's identity)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "inc").mkdir()
    (tmp_path / "ok.h").write_text("#pragma once\n__device__ float one() { return 1.0f; }\n")
    (tmp_path / "inc" / "two.h").write_text('#pragma once\n#include "../sub/../ok.h"\n'
                                            "__device__ float two() { return one() + one(); }\n")
    text = ('#include "sub/../ok.h"\n#include "ok.h"\n#include "inc/../inc/two.h"\n'
            'extern "C" __global__ void k(float* y) { y[threadIdx.x] = two(); }\n')
    (tmp_path / "main.cu").write_text(text)
    headers = local_headers(tmp_path / "main.cu")
    assert sorted(headers) == ["inc/../sub/../ok.h", "inc/two.h", "ok.h", "sub/../ok.h"]
    result = compile_kernel(text, entry="k", arch="sm_90", source_name="main.cu", headers=headers)
    assert result.ok, result.log
    # a folder that is not there is not made up: the compiler says so, as it would on the suite's own disk
    (tmp_path / "main.cu").write_text(text.replace("sub/../ok.h", "nowhere/../ok.h"))
    assert "nowhere/../ok.h" not in local_headers(tmp_path / "main.cu")


@pytest.mark.parametrize("headers, refusal", [
    ({"sub/..": ""}, "'sub/..' lies outside the request's header tree"),
    ({"x.h": "", "x.h/../y.h": ""}, "'x.h/../y.h': 'x.h' is a file and a folder of the header tree"),
], ids=["a folder", "through a file"])
def test_a_header_name_the_tree_cannot_hold_is_refused_by_the_compiler(headers, refusal, cache):
    with pytest.raises(CompileOptionError, match=re.escape(refusal)):
        compile_kernel('extern "C" __global__ void k() {}', entry="k", arch="sm_90", source_name="k.cu", headers=headers)


def test_a_float16_kernel_including_cuda_fp16_compiles(cache):
    source = ('#include <cuda_fp16.h>\n'
              'extern "C" __global__ void h(const __half* x, __half* y) { y[threadIdx.x] = __hmul(x[threadIdx.x], x[threadIdx.x]); }\n')
    result = compile_kernel(source, entry="h", arch="sm_90", source_name="h.cu")
    assert result.ok, result.log


def test_kernel_spec_carries_headers_inline(tmp_path):
    path = write_suite(tmp_path / "s", data=False,
                       kernel_source='#include "common.cuh"\n' + KERNEL_CU.replace("2.0f", "FACTOR"))
    (path.parent / "common.cuh").write_text("#define FACTOR 2.0f\n")
    suite = load_suite(path)
    spec = kernel_spec(suite.kernels[0])
    assert spec["headers"] == {"common.cuh": "#define FACTOR 2.0f\n"}
    assert spec["entry"] == "scale2"
    assert spec["source_name"] == "scale2.cu" and spec["source_path"].endswith("scale.cu")
    result = compile_program(suite.kernels[0], "sm_90")
    assert result.ok, result.log


def test_compile_program_applies_the_arch_suffix(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    path.write_text(path.read_text().replace("    source: scale.cu\n", "    source: scale.cu\n    arch_suffix: a\n"))
    result = compile_program(load_suite(path).kernels[0], "sm_90")
    assert result.ok, result.log
    assert result.arch == "sm_90a"


def test_compiles_for_another_arch(cache):
    result = compile_kernel(KERNEL_CU, entry="scale2", arch="sm_80")
    assert result.ok and result.arch == "sm_80"
    assert result.key != compile_kernel(KERNEL_CU, entry="scale2", arch="sm_90").key
