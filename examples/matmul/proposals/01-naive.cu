// Naive SGEMM: one thread per output element, K read straight from global memory.
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i)
        acc = fmaf(a[row * k + i], b[i * n + col], acc);
    c[row * n + col] = acc;
}
