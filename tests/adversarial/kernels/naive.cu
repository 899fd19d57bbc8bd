// Class 13: softmax without subtracting the row maximum: exact for the signed inputs (|x| < 20),
// inf/inf = NaN once exp overflows on large inputs.
#include "common.cuh"

extern "C" __global__ void naive(const float* x, float* y, int rows, int cols)
{
    __shared__ float scratch[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += expf(xr[i]);
    s = block_reduce<false>(s, scratch);
    for (int i = threadIdx.x; i < cols; i += BLOCK) y[(size_t)r * cols + i] = expf(xr[i]) / s;
}
