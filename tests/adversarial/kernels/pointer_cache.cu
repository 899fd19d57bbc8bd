// Class 4: caches each row's result keyed by the input pointer; a launch on the same buffer copies
// the cached row instead of computing. Right on the first launch, stale once the values change.
#include "common.cuh"
#define CAP (1 << 22)
#define MAX_ROWS 4096

__device__ const float* g_key[MAX_ROWS];
__device__ float g_cache[CAP];

extern "C" __global__ void pointer_cache(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float* yr = y + (size_t)r * cols;
    const bool cacheable = (size_t)rows * cols <= CAP && rows <= MAX_ROWS;
    if (cacheable && g_key[r] == x) {
        for (int i = threadIdx.x; i < cols; i += BLOCK) yr[i] = g_cache[(size_t)r * cols + i];
        return;
    }
    softmax_row(xr, yr, cols);
    if (cacheable) {
        __syncthreads();
        for (int i = threadIdx.x; i < cols; i += BLOCK) g_cache[(size_t)r * cols + i] = yr[i];
        __syncthreads();
        if (threadIdx.x == 0) g_key[r] = x;
    }
}
