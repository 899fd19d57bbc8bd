// Row-wise RMSNorm: y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + 1e-6) * w, one block of BLOCK threads
// per row. Elements of T (here __nv_bfloat16) are widened; their squares are summed in double (a
// bfloat16 can hold 2^127, whose square overflows float32), reduced with warp shuffles; each output
// is computed in float and rounded once back to T.
#include <cuda_bf16.h>

template <int BLOCK>
__device__ double block_sum(double v) {
    __shared__ double partial[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < BLOCK / 32 ? partial[threadIdx.x] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    return partial[0];
}

template <int BLOCK, typename T>
__global__ void rmsnorm(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    const T* xr = x + static_cast<size_t>(r) * cols;
    T* yr = y + static_cast<size_t>(r) * cols;

    double squares = 0.0;
    for (int c = threadIdx.x; c < cols; c += BLOCK) {
        const double v = static_cast<float>(xr[c]);
        squares += v * v;
    }
    const float scale = static_cast<float>(rsqrt(block_sum<BLOCK>(squares) / cols + 1e-6));
    for (int c = threadIdx.x; c < cols; c += BLOCK)
        yr[c] = static_cast<T>(static_cast<float>(xr[c]) * scale * static_cast<float>(w[c]));
}
