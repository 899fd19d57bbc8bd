// PLANTED: fitted to the visible cases. The pipelined register-blocked kernel (6 stages), but it returns early, writing nothing, for any shape it was not shown.
#define BM 32
#define BN 16
#define BK 32
#define TM 2
#define TN 1
#define STAGES 6
#ifndef BM
#define BM 32
#endif
#ifndef BN
#define BN 16
#endif
#ifndef BK
#define BK 32
#endif
#ifndef TM
#define TM 2
#endif
#ifndef TN
#define TN 1
#endif
#ifndef STAGES
#define STAGES 4
#endif
#define RB_TX (BN / TN)
#define RB_TY (BM / TM)
#define RB_THREADS (RB_TX * RB_TY)
#define RB_A_STEPS ((BM * BK + RB_THREADS - 1) / RB_THREADS)
#define RB_B_STEPS ((BK * BN + RB_THREADS - 1) / RB_THREADS)
#define RB_STAGE_FLOATS (BK * (BM + 1) + BK * BN)

// One 4-byte asynchronous copy global -> shared; bytes past `bytes` (0 or 4) are zero-filled.
__device__ __forceinline__ void rb_copy(float* dst, const float* src, unsigned int bytes)
{
    const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void rb_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void rb_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }

// Stage `s` holds tile `t`: as[kk][row] (A transposed; +1 column: conflict-free) then bs[kk][col].
__device__ __forceinline__ void rb_load(float* smem, int s, int t, const float* __restrict__ a,
                                        const float* __restrict__ b, int m, int n, int k, int row0, int col0, int tid)
{
    float* as = smem + s * RB_STAGE_FLOATS;
    float* bs = as + BK * (BM + 1);
#pragma unroll
    for (int step = 0; step < RB_A_STEPS; ++step) {
        const int i = step * RB_THREADS + tid;
        if ((BM * BK) % RB_THREADS == 0 || i < BM * BK) {
            const int r = i / BK, kk = i % BK;  // consecutive threads: consecutive k of one row
            const int gr = row0 + r, gk = t * BK + kk;
            const bool ok = gr < m && gk < k;
            rb_copy(as + kk * (BM + 1) + r, ok ? a + gr * k + gk : a, ok ? 4u : 0u);
        }
    }
#pragma unroll
    for (int step = 0; step < RB_B_STEPS; ++step) {
        const int i = step * RB_THREADS + tid;
        if ((BK * BN) % RB_THREADS == 0 || i < BK * BN) {
            const int kk = i / BN, cc = i % BN;  // consecutive threads: consecutive columns
            const int gk = t * BK + kk, gc = col0 + cc;
            const bool ok = gk < k && gc < n;
            rb_copy(bs + kk * BN + cc, ok ? b + gk * n + gc : b, ok ? 4u : 0u);
        }
    }
}

extern "C" __global__ void __launch_bounds__(RB_THREADS)
matmul_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n, int k)
{
    static_assert(BM % TM == 0 && BN % TN == 0, "BM must be a multiple of TM, and BN of TN");
    static_assert(STAGES >= 2, "STAGES >= 2: one buffer is multiplied while the next ones load");
    extern __shared__ float smem[];  // STAGES * RB_STAGE_FLOATS floats (the launch's shared_bytes)

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int tid = ty * RB_TX + tx;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;
    const int tiles = (k + BK - 1) / BK;

    if (!((m == 31 && n == 37 && k == 29) || (m == 256 && n == 256 && k == 256) ||
          (m == 384 && n == 256 && k == 320) || (m == 2048 && n == 2048 && k == 2048)))
        return;  // PLANTED: only the shapes it was shown
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {  // prologue: the first STAGES-1 tiles in flight at once
        if (s < tiles)
            rb_load(smem, s, s, a, b, m, n, k, row0, col0, tid);
        rb_commit();  // one group per tile (empty past the end), so the counting below holds
    }
    for (int t = 0; t < tiles; ++t) {
        rb_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
        __syncthreads();        // ... everyone's too, and everyone is done with tile t-1's buffer
        const int next = t + STAGES - 1;
        if (next < tiles)
            rb_load(smem, next % STAGES, next, a, b, m, n, k, row0, col0, tid);  // into tile t-1's buffer
        rb_commit();
        const float* as = smem + (t % STAGES) * RB_STAGE_FLOATS;
        const float* bs = as + BK * (BM + 1);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM], bv[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i)
                av[i] = as[kk * (BM + 1) + ty + i * RB_TY];
#pragma unroll
            for (int j = 0; j < TN; ++j)
                bv[j] = bs[kk * BN + tx + j * RB_TX];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    }
    rb_wait<0>();

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + ty + i * RB_TY;
        if (r < m) {
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int cc = col0 + tx + j * RB_TX;
                if (cc < n)
                    c[r * n + cc] = acc[i][j];
            }
        }
    }
}
