// Trusted reference for C(M×N) = A(M×K)·B(K×N), row-major float32.
// Deliberately simple: one thread per output, accumulated in double so the oracle's own rounding
// error is far below the tolerance the shipped kernel is held to.
extern "C" __global__ void matmul_ref(const float* a, const float* b, float* c, int m, int n, int k)
{
    const int row = blockIdx.y * blockDim.y + threadIdx.y;
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    double acc = 0.0;
    for (int i = 0; i < k; ++i)
        acc += static_cast<double>(a[row * k + i]) * static_cast<double>(b[i * n + col]);
    c[row * n + col] = static_cast<float>(acc);
}
