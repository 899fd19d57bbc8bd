// Class 9: counts its launches in a device global and, after the first 40 (warm-up territory),
// computes only the even rows: right on the first validation launch, wrong when timed.
#include "common.cuh"

__device__ unsigned int g_blocks;

extern "C" __global__ void call_counter(const float* x, float* y, int rows, int cols)
{
    __shared__ unsigned int launch;
    if (threadIdx.x == 0) launch = atomicAdd(&g_blocks, 1u) / gridDim.x;
    __syncthreads();
    const int r = blockIdx.x;
    if (r >= rows) return;
    if (launch >= 40 && (r & 1)) return;
    softmax_row(x + (size_t)r * cols, y + (size_t)r * cols, cols);
}
