"""Kernels found in a real NVRTC cubin by the C++ name a suite writes, with their parameter types."""

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
