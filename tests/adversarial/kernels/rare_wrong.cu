// Wrong on one launch in EVERY: each block counts its own launches in a device global and, on every
// EVERY-th, writes zeros instead of its row; honest on every other launch, validation launch 1
// included. Only a check of every timed launch's outputs catches it reliably: the last launch on each
// buffer copy is right EVERY-1 times in EVERY.
#include "common.cuh"
#ifndef EVERY
#define EVERY 64
#endif
#define MAX_ROWS 4096

__device__ unsigned int g_launches[MAX_ROWS];

extern "C" __global__ void rare_wrong(const float* x, float* y, int rows, int cols)
{
    __shared__ unsigned int launch;
    const int r = blockIdx.x;
    if (threadIdx.x == 0) launch = r < MAX_ROWS ? g_launches[r]++ : 0u;
    __syncthreads();
    if (r >= rows) return;
    float* yr = y + (size_t)r * cols;
    if (launch % EVERY == EVERY - 1) {
        for (int i = threadIdx.x; i < cols; i += BLOCK) yr[i] = 0.0f;
        return;
    }
    softmax_row(x + (size_t)r * cols, yr, cols);
}
