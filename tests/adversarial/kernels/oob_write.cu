// Class 5: correct, but the last row also writes four floats past the end of y.
#include "common.cuh"

extern "C" __global__ void oob_write(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    softmax_row(x + (size_t)r * cols, y + (size_t)r * cols, cols);
    if (r == rows - 1 && threadIdx.x < 4) y[(size_t)rows * cols + threadIdx.x] = 0.0f;
}
