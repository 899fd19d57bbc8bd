// The split reduction's passes with one planted fault each: a final pass that returns at once, and
// a first pass that writes one partial past the end of the scratch buffer.
#define CHUNK 2048
#define BLOCK 256

__device__ void partial_sums(const float* __restrict__ x, float* __restrict__ partials, int rows, int cols, bool overflow)
{
    __shared__ float warp_sums[BLOCK / 32];
    const int chunk = blockIdx.x, row = blockIdx.y, chunks = gridDim.x;
    const float* xr = x + static_cast<size_t>(row) * cols;
    const int end = min(cols, (chunk + 1) * CHUNK);
    float sum = 0.0f;
    for (int c = chunk * CHUNK + threadIdx.x; c < end; c += BLOCK) sum += xr[c];
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x < 32) {
        sum = threadIdx.x < BLOCK / 32 ? warp_sums[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        if (threadIdx.x == 0) {
            partials[static_cast<size_t>(row) * chunks + chunk] = sum;
            if (overflow && row == rows - 1 && chunk == chunks - 1) partials[static_cast<size_t>(rows) * chunks] = sum;
        }
    }
}

extern "C" __global__ void row_partials(const float* __restrict__ x, float* __restrict__ partials, int rows, int cols)
{
    partial_sums(x, partials, rows, cols, false);
}

extern "C" __global__ void row_partials_past_scratch(const float* __restrict__ x, float* __restrict__ partials,
                                                     int rows, int cols)
{
    partial_sums(x, partials, rows, cols, true);
}

extern "C" __global__ void row_finish(const float* __restrict__ partials, float* __restrict__ y, int rows, int cols)
{
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const int chunks = (cols + CHUNK - 1) / CHUNK;
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += partials[static_cast<size_t>(row) * chunks + c];
    y[row] = sum;
}

extern "C" __global__ void row_finish_skipped(const float* __restrict__ partials, float* __restrict__ y, int rows, int cols)
{
}
