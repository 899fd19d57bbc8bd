"""Kernels found in a real NVRTC cubin by the C++ name a suite writes, with their parameter types."""

import time

import pytest

from cudagate_harness.compiler import compile_kernel
from cudagate_harness.params import ParamInfoError
from cudagate_harness import symbols

SOURCE = """#include <cuda_bf16.h>
template <class T, int N> __global__ void reduce0(T* a, const T* __restrict__ b, unsigned int n, float s) { a[0] = b[n] * s * N; }
namespace ns { __global__ void scale(__nv_bfloat16* x, long long n, const char* tag, int4 v) {} }
extern "C" __global__ void plain(float* x) {}
template __global__ void reduce0<double, 3>(double*, const double*, unsigned, float);
"""


@pytest.fixture(scope="module")
def cubin():
    result = compile_kernel(SOURCE, entry="reduce0<float, 256>", arch="sm_90", use_cache=False)
    assert result.ok, result.log
    return result.cubin


def test_every_kernel_is_listed_with_its_cpp_name_and_parameter_types(cubin):
    found = {k.name: k.params for k in symbols.kernels(cubin)}
    assert found == {"reduce0<float, 256>": ("float*", "float const*", "unsigned int", "float"),
                     "reduce0<double, 3>": ("double*", "double const*", "unsigned int", "float"),
                     "ns::scale": ("__nv_bfloat16*", "long long", "char const*", "int4"),
                     "plain": None}


def test_an_entry_is_found_as_a_suite_spells_it(cubin):
    assert symbols.find(cubin, "reduce0<float,256>")[0].symbol == "_Z7reduce0IfLi256EEvPT_PKS0_jf"
    assert symbols.find(cubin, "scale")[0].name == "ns::scale"  # unqualified, where it is the only one
    assert symbols.find(cubin, "plain")[0].params is None
    kernel, every = symbols.find(cubin, "reduce0<int, 256>")
    assert kernel is None and len(every) == 4


def test_c_types_map_to_signature_dtypes(cubin):
    params = symbols.find(cubin, "ns::scale")[0].params
    assert [symbols.pointee_dtype(t) for t in params] == ["bfloat16", None, "int8", None]
    assert [symbols.scalar_dtype(t) for t in params] == [None, "int64", None, None]
    assert symbols.pointee_dtype("float const* __restrict__") == "float32"
    assert symbols.pointee_dtype("float**") is None


def test_a_damaged_cubin_is_one_error_not_a_crash(cubin):
    with pytest.raises(ParamInfoError):
        symbols.kernels(cubin[:200])
    assert symbols.demangle("not_mangled") is None


def test_an_unsigned_template_argument_is_found_without_its_suffix():
    source = ("template <unsigned B> __global__ void tile(float* x) { x[B] = 0; }\n"
              "template __global__ void tile<256>(float*);\n")
    result = compile_kernel(source, entry="tile<256>", arch="sm_90", use_cache=False)
    assert result.ok, result.log
    assert symbols.find(result.cubin, "tile<256u>")[0].name == "tile<256u>"
    assert symbols.find(result.cubin, "tile<256>")[0].name == "tile<256u>"
    assert symbols.find(result.cubin, "tile<25>")[0] is None


def test_a_name_that_demangles_to_gigabytes_is_left_mangled_within_bounds():
    """Each typedef of a pair of the previous doubles what the name demangles to; the bounded child
    gives up on that one name, and the kernels beside it keep their C++ names."""
    depth = 22
    source = ("template <typename A, typename B> struct p {};\ntypedef int T0;\n"
              + "".join(f"typedef p<T{i}, T{i}> T{i + 1};\n" for i in range(depth))
              + f"template <typename T> __global__ void big(float* x) {{ x[0] = 2; }}\n"
              f"template __global__ void big<T{depth}>(float*);\n"
              "namespace ops { __global__ void small(float* x) {} }\n")
    result = compile_kernel(source, entry="ops::small", arch="sm_90", use_cache=False)
    assert result.ok, result.log
    start = time.perf_counter()
    found = {k.symbol[:8]: k for k in symbols.kernels(result.cubin)}
    assert time.perf_counter() - start < symbols.DEMANGLE_SECONDS + 2
    assert found["_Z3bigI1"].params is None and found["_Z3bigI1"].name.startswith("_Z3bigI1")
    assert found["_ZN3ops5"].name == "ops::small" and found["_ZN3ops5"].params == ("float*",)


def test_a_loose_spelling_that_fits_two_kernels_names_none():
    """`k<256>` fits the global `k<256u>` (a suffix) and `evil::k<256>` (a scope): the gate must not
    pick one of them for the suite."""
    source = ("template <unsigned N> __global__ void k(float* x) { x[0] = N; }\n"
              "namespace evil { template <int N> __global__ void k(float* x) { x[0] = -1; } }\n"
              "template __global__ void k<256>(float*);\ntemplate __global__ void evil::k<256>(float*);\n")
    result = compile_kernel(source, entry="k<256u>", arch="sm_90", use_cache=False)
    assert result.ok, result.log
    kernel, every = symbols.find(result.cubin, "k<256>")
    assert kernel is None and {k.name for k in every} == {"k<256u>", "evil::k<256>"}
    assert symbols.find(result.cubin, "k<256u>")[0].name == "k<256u>"
    assert symbols.find(result.cubin, "evil::k<256>")[0].name == "evil::k<256>"
