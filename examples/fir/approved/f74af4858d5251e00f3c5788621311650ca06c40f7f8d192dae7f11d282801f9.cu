// FIR filter (valid correlation), float32: y[i] = sum_{k < taps} h[k] * x[i + k], for i < n.
// One output per thread. The taps are walked in tiles of BLOCK: each tile stages the block's
// window of x (BLOCK + BLOCK values) and BLOCK taps in shared memory, so each x value is read from
// global memory about twice per tile instead of once per tap.
#ifndef BLOCK
#define BLOCK 256
#endif

extern "C" __global__ void fir_valid(const float* __restrict__ x, const float* __restrict__ h,
                                     float* __restrict__ y, int n, int taps)
{
    __shared__ float xs[2 * BLOCK];
    __shared__ float hs[BLOCK];
    const int base = blockIdx.x * BLOCK;
    const int len = n + taps - 1;
    float acc = 0.0f;
    for (int k0 = 0; k0 < taps; k0 += BLOCK) {
        for (int j = threadIdx.x; j < 2 * BLOCK; j += BLOCK) {
            const int g = base + k0 + j;
            xs[j] = g < len ? x[g] : 0.0f;
        }
        hs[threadIdx.x] = k0 + threadIdx.x < taps ? h[k0 + threadIdx.x] : 0.0f;
        __syncthreads();
        const int kmax = min(BLOCK, taps - k0);
        for (int k = 0; k < kmax; ++k) acc = fmaf(hs[k], xs[threadIdx.x + k], acc);
        __syncthreads();
    }
    const int i = base + threadIdx.x;
    if (i < n) y[i] = acc;
}
