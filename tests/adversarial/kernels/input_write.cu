// Class 5: correct, but uses its input as scratch afterwards (the first element of each row).
#include "common.cuh"

extern "C" __global__ void input_write(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    softmax_row(x + (size_t)r * cols, y + (size_t)r * cols, cols);
    __syncthreads();
    if (threadIdx.x == 0) const_cast<float*>(x)[(size_t)r * cols] = 0.0f;
}
