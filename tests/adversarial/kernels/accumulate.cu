// The atomics suite (class 8): c += a·b, c in/out. acc_rows: one thread per output element, a fixed
// summation order (deterministic). acc_split_k: the K dimension split over 8 blocks that add their
// partial sums with atomicAdd in whatever order they finish (correct within tolerance, not bitwise
// reproducible).
#define SPLIT 8

extern "C" __global__ void acc_rows(const float* a, const float* b, float* c, int m, int n, int k)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (row >= m || col >= n) return;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) acc = fmaf(a[row * k + i], b[i * n + col], acc);
    c[row * n + col] += acc;
}

extern "C" __global__ void acc_split_k(const float* a, const float* b, float* c, int m, int n, int k)
{
    const int part = blockIdx.x % SPLIT;  // the split is the fastest-varying index: parts run side by side
    const int col = (blockIdx.x / SPLIT) * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (row >= m || col >= n) return;
    const int chunk = (k + SPLIT - 1) / SPLIT, lo = part * chunk, hi = min(k, lo + chunk);
    float acc = 0.0f;
    for (int i = lo; i < hi; ++i) acc = fmaf(a[row * k + i], b[i * n + col], acc);
    atomicAdd(&c[row * n + col], acc);
}
