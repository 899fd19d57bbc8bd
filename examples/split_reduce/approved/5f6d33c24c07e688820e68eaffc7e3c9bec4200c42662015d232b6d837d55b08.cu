// Row sums in two launches, as a split-K reduction is written: row_partials sums each chunk of
// CHUNK columns of a row into partials[row * chunks + chunk] (one block per chunk and row), and
// row_finish adds a row's partials in chunk order (one thread per row).
#define CHUNK 2048
#define BLOCK 256

extern "C" __global__ void row_partials(const float* __restrict__ x, float* __restrict__ partials, int rows, int cols)
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
        if (threadIdx.x == 0) partials[static_cast<size_t>(row) * chunks + chunk] = sum;
    }
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
