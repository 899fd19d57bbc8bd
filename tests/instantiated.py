"""A suite over two types (``instantiate: {T: [float32, bfloat16]}``): GELU of n elements, one
kernel template ``gelu<T>`` whose entry each instantiation spells in C++ (``gelu<float>``,
``gelu<__nv_bfloat16>``). Its reference is Python, so its case data is generated without a GPU."""

from __future__ import annotations

from pathlib import Path

GELU_YAML = """\
suite: gelu
instantiate: {T: [float32, bfloat16]}
signature:
  - {name: x, buffer: "{T}", intent: in, size: n}
  - {name: y, buffer: "{T}", intent: out, size: n}
  - {name: n, scalar: int32}
reference:
  python: reference.py:gelu
tolerance:
  y:
    float32: {atol: 1.0e-6, rtol: 1.0e-5}
    bfloat16: {atol: 1.0e-2, rtol: 1.6e-2}
kernels:
  - name: gelu
    source: gelu.cu
    entry: "gelu<{T}>"
    launch: {grid: ["cdiv(n, 256)"], block: [256]}
cases:
  - {name: small, kind: correctness, scalars: {n: 1000}}
  - {name: perf, kind: performance, scalars: {n: 65536}}
"""

# The reference computes in float64 and rounds to the type it is given (numpy float32, or
# ml_dtypes' bfloat16 for the bfloat16 instantiation).
GELU_REFERENCE = """\
import numpy as np


def gelu(x, n):
    v = x.astype(np.float64)
    return (0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))).astype(x.dtype)
"""

GELU_CU = """\
#include <cuda_bf16.h>

template <typename T>
__global__ void gelu(const T* __restrict__ x, T* __restrict__ y, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = static_cast<float>(x[i]);
    y[i] = static_cast<T>(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
}
"""


def write_gelu(folder: Path, yaml_text: str = GELU_YAML, source: str = GELU_CU) -> Path:
    """The suite's files in ``folder`` (no case data)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gelu.cu").write_text(source, encoding="utf-8")
    (folder / "reference.py").write_text(GELU_REFERENCE, encoding="utf-8")
    path = folder / "cudagate.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    return path
