// Class 6: a shared-memory tree reduction without the barrier between its steps.
#define BLOCK 256

extern "C" __global__ void race(const float* x, float* y, int rows, int cols)
{
    __shared__ float s[BLOCK];
    const int r = blockIdx.x, t = threadIdx.x;
    if (r >= rows) return;
    const float* xr = x + (size_t)r * cols;
    float m = -3.0e38f;
    for (int i = t; i < cols; i += BLOCK) m = fmaxf(m, xr[i]);
    s[t] = m;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] = fmaxf(s[t], s[t + stride]);
        // missing __syncthreads(): warps read partial maxima other warps have not written yet
    }
    __syncthreads();
    m = s[0];
    __syncthreads();
    float sum = 0.0f;
    for (int i = t; i < cols; i += BLOCK) sum += __expf(xr[i] - m);
    s[t] = sum;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (t < stride) s[t] += s[t + stride];
    }
    __syncthreads();
    const float inv = 1.0f / s[0];
    for (int i = t; i < cols; i += BLOCK) y[(size_t)r * cols + i] = __expf(xr[i] - m) * inv;
}
