// Per-row float8_e4m3 quantisation: y = x * 448 / max|x[row]|, the row's absolute maximum found
// with cub::BlockReduce, each element rounded once to __nv_fp8_e4m3.
#include <cuda_fp8.h>
#include <cub/block/block_reduce.cuh>

struct Larger {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <int BLOCK>
__global__ void quantize(const float* __restrict__ x, __nv_fp8_e4m3* __restrict__ y, int rows, int cols)
{
    using Reduce = cub::BlockReduce<float, BLOCK>;
    __shared__ typename Reduce::TempStorage temp;
    __shared__ float amax;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* xr = x + static_cast<size_t>(r) * cols;
    float m = 0.0f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, fabsf(xr[c]));
    const float reduced = Reduce(temp).Reduce(m, Larger());
    if (threadIdx.x == 0) amax = reduced;
    __syncthreads();
    const float scale = 448.0f / amax;
    for (int c = threadIdx.x; c < cols; c += BLOCK) y[static_cast<size_t>(r) * cols + c] = __nv_fp8_e4m3(xr[c] * scale);
}
