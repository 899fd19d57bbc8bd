// Shared-memory tiled SGEMM with 32×32 tiles (the shipped kernel uses 16×16).
#define TILE 32
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE + 1];  // +1 column: no bank conflicts on the transposed read

    const int row = blockIdx.y * TILE + threadIdx.y;
    const int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;

    for (int t = 0; t < k; t += TILE) {
        const int ak = t + threadIdx.x;
        const int bk = t + threadIdx.y;
        as[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? a[row * k + ak] : 0.0f;
        bs[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? b[bk * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i)
            acc = fmaf(as[threadIdx.y][i], bs[i][threadIdx.x], acc);
        __syncthreads();
    }
    if (row < m && col < n)
        c[row * n + col] = acc;
}

