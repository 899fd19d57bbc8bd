// Class 7 (global memory): accumulates into y without ever clearing it, so it reads y before writing.
#include "common.cuh"

extern "C" __global__ void uninit_global(const float* x, float* y, int rows, int cols)
{
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float* yr = y + (size_t)r * cols;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    m = block_reduce<true>(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += __expf(xr[i] - m);
    s = block_reduce<false>(s, scratch);
    for (int i = threadIdx.x; i < cols; i += BLOCK) yr[i] += __expf(xr[i] - m) / s;
}
