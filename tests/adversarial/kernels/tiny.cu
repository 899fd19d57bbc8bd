// Class 3 suite: y = 1e-6 * x, tolerance atol 1e-4 (chosen for outputs of order one).
extern "C" __global__ void tiny_scale(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = 1.0e-6f * x[r * cols + c];
}

extern "C" __global__ void tiny_zeros(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = 0.0f;
}

extern "C" __global__ void tiny_constant(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] = 1.0e-7f;
}
