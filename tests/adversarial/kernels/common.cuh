// Shared by the planted kernels: a correct row softmax (one block of BLOCK threads per row), so each
// planted kernel differs from an honest one only by its trick.
#pragma once
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <bool IsMax>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = IsMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = (threadIdx.x < (BLOCK / 32)) ? scratch[lane] : (IsMax ? NEG_INF : 0.0f);
    if (warp == 0) v = IsMax ? warp_max(v) : warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

__device__ void softmax_row(const float* xr, float* yr, int cols) {
    __shared__ float scratch[32];
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    m = block_reduce<true>(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += __expf(xr[i] - m);
    s = block_reduce<false>(s, scratch);
    const float inv = 1.0f / s;
    for (int i = threadIdx.x; i < cols; i += BLOCK) yr[i] = __expf(xr[i] - m) * inv;
}
