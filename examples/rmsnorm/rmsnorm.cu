// Row-wise RMSNorm: y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + 1e-6) * w, one block of BLOCK threads
// per row. Elements of T (here __nv_bfloat16) are widened to float, squared and summed in float32,
// reduced with warp shuffles, and each output is rounded once back to T.
#include <cuda_bf16.h>

template <int BLOCK>
__device__ float block_sum(float v) {
    __shared__ float partial[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < BLOCK / 32 ? partial[threadIdx.x] : 0.0f;
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

    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += BLOCK) {
        const float v = static_cast<float>(xr[c]);
        squares += v * v;
    }
    const float scale = rsqrtf(block_sum<BLOCK>(squares) / cols + 1e-6f);
    for (int c = threadIdx.x; c < cols; c += BLOCK)
        yr[c] = static_cast<T>(static_cast<float>(xr[c]) * scale * static_cast<float>(w[c]));
}
