// Class 12: right on every shape it was shown (cols <= 128, or a multiple of 128), but on other
// wide rows handles only the columns up to the last multiple of 128.
#include "common.cuh"

extern "C" __global__ void tail_drop(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int handled = cols > 128 ? cols & ~127 : cols;
    __shared__ float scratch[32];
    const float* xr = x + (size_t)r * cols;
    float* yr = y + (size_t)r * cols;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    m = block_reduce<true>(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += __expf(xr[i] - m);
    s = block_reduce<false>(s, scratch);
    for (int i = threadIdx.x; i < handled; i += BLOCK) yr[i] = __expf(xr[i] - m) / s;
}
