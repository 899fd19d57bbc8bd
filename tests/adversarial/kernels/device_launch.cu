// Class 10: launches its work from the device, where the timing events cannot see it.
#include "common.cuh"

__global__ void child(const float* x, float* y, int rows, int cols)
{
    softmax_row(x + (size_t)blockIdx.x * cols, y + (size_t)blockIdx.x * cols, cols);
}

extern "C" __global__ void device_launch(const float* x, float* y, int rows, int cols)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) child<<<rows, BLOCK>>>(x, y, rows, cols);
}
