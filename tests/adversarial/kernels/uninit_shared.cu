// Class 7 (shared memory): warp 0 reduces all 32 scratch slots though only 8 warps wrote theirs;
// the other 24 hold whatever shared memory held. Zeros there are harmless (max with 0 and sum with
// 0 leave softmax unchanged), so only garbage -- the gate's scrub -- exposes the bug.
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float wmax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float wsum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void uninit_shared(const float* x, float* y, int rows, int cols)
{
    __shared__ float scratch[32];
    const int r = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float m = NEG_INF;
    for (int i = threadIdx.x; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    m = wmax(m);
    if (lane == 0) scratch[warp] = m;
    __syncthreads();
    if (warp == 0) m = wmax(scratch[lane]);  // the bug: lanes 8..31 read slots nobody wrote
    __syncthreads();
    if (threadIdx.x == 0) scratch[0] = m;
    __syncthreads();
    m = scratch[0];
    __syncthreads();
    float s = 0.0f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) s += __expf(xr[i] - m);
    s = wsum(s);
    if (lane == 0) scratch[warp] = s;
    __syncthreads();
    if (warp == 0) s = wsum(scratch[lane]);
    __syncthreads();
    if (threadIdx.x == 0) scratch[0] = s;
    __syncthreads();
    const float inv = 1.0f / scratch[0];
    for (int i = threadIdx.x; i < cols; i += BLOCK) y[(size_t)r * cols + i] = __expf(xr[i] - m) * inv;
}
