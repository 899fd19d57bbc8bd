// A tunable SIMT SGEMM: C(M×N) = A(M×K)·B(K×N), row-major float32, float32 accumulation, with the
// entry and signature of the shipped kernel (matmul_f32 in matmul.cu). It is the `tuning_source` of
// matmul_f32 in cudagate.yaml: `cudagate optimize --proposer autotune` builds its candidates from
// this file with the -D constants below; the gate never compiles it unless a winner replaces matmul.cu.
//
// A thread block computes a BM×BN tile of C, stepping through K BK at a time. Each thread keeps a
// TM×TN tile of C in registers and, per k, reads TM values of A and TN of B from shared memory
// (as float4 where TM/TN are multiples of 4), so every shared word read feeds TN or TM FMAs.
// Its rows are ty*4 + {0..3} + c*(BM/2) for TM=8 (columns alike): a warp's float4 reads of a shared row
// are contiguous or broadcast, and its stores of C are whole float4s of neighbouring columns.
// Double buffering: tile t+1 is loaded from global memory into registers while tile t is multiplied
// out of shared memory, then stored into the other shared buffer: one barrier per tile. (When that
// would hold more than 32 registers a thread, with few threads and large tiles, tile t+1 is copied
// straight to the other buffer after the multiply instead, so no point of the space spills.)
// STAGES >= 3 replaces that with an asynchronous pipeline (cp.async, sm_80+): STAGES shared buffers, and
// STAGES-1 tiles in flight while one is multiplied, no registers held for them. On µs-sized problems the
// chain of memory round trips along K, not the arithmetic, sets the time, and more tiles in flight
// shorten it; B moves as 16-byte copies, A (transposed on the way) as 4-byte ones.
// SK > 1 splits K inside the block: SK groups of threads (threadIdx.z) each multiply their own run of K
// tiles through their own buffers, and their partial sums meet in shared memory at the end. Small
// outputs (a 384×256 C is 96 blocks of 32×32) then get SK times the threads, and each group's chain
// along K is SK times shorter.
// Global loads are float4 (A along K, B along N) when the matrix is 16-byte aligned, its row length a
// multiple of 4 and the four elements in range; anything else (edges, odd sizes such as 31×37×29)
// takes a scalar path with bounds checks, so every M, N, K is correct.
// A is stored transposed (as[k][m], so a thread's TM rows are contiguous), each row padded by PAD
// floats: PAD=4 moves the four transposed stores of neighbouring threads to distinct banks.
// Launch: grid (cdiv(n, BN), cdiv(m, BM)), block (BN / TN, BM / TM, SK),
//         shared_bytes max(SK * STAGES * BK * (BM + PAD + BN), (SK - 1) * BM * BN) * 4.
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif
#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 8
#endif
#ifndef PAD
#define PAD 4
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef SK
#define SK 1
#endif

#define SG_TX (BN / TN)  // threads along N
#define SG_TY (BM / TM)  // threads along M
#define SG_THREADS (SG_TX * SG_TY)
#define SG_VA (TM % 4 == 0 ? 4 : TM)  // a thread's rows come in runs of SG_VA (one shared read each)
#define SG_VB (TN % 4 == 0 ? 4 : TN)  // and its columns in runs of SG_VB
#define SG_LDA (BM + PAD)  // row pitch of the transposed A tile in shared memory
#define SG_A_VECS (BM * BK / 4)  // float4s per A tile
#define SG_B_VECS (BK * BN / 4)
#define SG_A_STEPS ((SG_A_VECS + SG_THREADS - 1) / SG_THREADS)
#define SG_B_STEPS ((SG_B_VECS + SG_THREADS - 1) / SG_THREADS)
#define SG_STAGE (BK * SG_LDA + BK * BN)  // floats per buffer: A tile, then B tile
#define SG_STAGED (SG_A_STEPS + SG_B_STEPS <= 8)
#define SG_ISSUE_UNROLL (SG_STAGED ? 8 : 1)  // a long copy unrolled would hold every address in registers

// Elements (row, col..col+3) of a row-major matrix with `rows` rows, `cols` columns; zero outside it.
__device__ __forceinline__ float4 sg_load4(const float* __restrict__ p, int row, int col, int rows, int cols,
                                           bool vector)
{
    if (row >= rows)
        return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float* r = p + static_cast<long long>(row) * cols;
    if (vector && col + 3 < cols)
        return *reinterpret_cast<const float4*>(r + col);
    return make_float4(col < cols ? r[col] : 0.0f, col + 1 < cols ? r[col + 1] : 0.0f,
                       col + 2 < cols ? r[col + 2] : 0.0f, col + 3 < cols ? r[col + 3] : 0.0f);
}

__device__ __forceinline__ bool sg_aligned(const void* p)
{
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// Asynchronous copies global -> shared (STAGES >= 3). A 4-byte copy of `bytes` = 0 reads nothing and
// writes a zero, which fills the tile's edges; `src` must then still be a valid address.
__device__ __forceinline__ void sg_copy4(float* dst, const float* src, bool in_range)
{
    const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(in_range ? 4u : 0u)
                 : "memory");
}
__device__ __forceinline__ void sg_copy16(float* dst, const float* src)
{
    const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void sg_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void sg_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }

extern "C" __global__ void __launch_bounds__(SG_THREADS * SK)
matmul_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n, int k)
{
    static_assert(BM % TM == 0 && BN % TN == 0, "BM must be a multiple of TM, and BN of TN");
    static_assert(TM % SG_VA == 0 && TN % SG_VB == 0, "TM and TN: 1, 2 or a multiple of 4");
    static_assert(BK % 4 == 0 && BN % 4 == 0 && BM % 4 == 0 && PAD % 4 == 0,
                  "BM, BN, BK and PAD multiples of 4: tiles are moved as float4");
    static_assert(STAGES >= 2, "STAGES >= 2: one buffer is multiplied while the next ones load");
    static_assert(SK >= 1, "SK >= 1 groups of threads along K");
    // SK groups × STAGES buffers of SG_STAGE floats; after the last tile, (SK-1) × BM × BN partial sums
    extern __shared__ float4 smem4[];
    const int group = threadIdx.z;
    float* smem = reinterpret_cast<float*>(smem4) + group * (STAGES * SG_STAGE);  // this group's buffers

    const int tid = threadIdx.y * SG_TX + threadIdx.x;
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;
    const int tiles = ((k + BK - 1) / BK + SK - 1) / SK;  // per group; tiles past K load as zeros
    const int first = group * tiles;                       // this group's first tile of K
    const bool vec_a = (k % 4 == 0) && sg_aligned(a);
    const bool vec_b = (n % 4 == 0) && sg_aligned(b);

    // Step s of a tile's copy: this thread's float4 of A (consecutive threads: consecutive k of a row)
    // or of B (consecutive columns), read from global memory, then written to shared buffer `buffer`.
    auto load_a = [&](int t, int s) {
        const int i = s * SG_THREADS + tid;
        return sg_load4(a, row0 + i / (BK / 4), (first + t) * BK + (i % (BK / 4)) * 4, m, k, vec_a);
    };
    auto load_b = [&](int t, int s) {
        const int i = s * SG_THREADS + tid;
        return sg_load4(b, (first + t) * BK + i / (BN / 4), col0 + (i % (BN / 4)) * 4, k, n, vec_b);
    };
    auto store_a = [&](int buffer, int s, float4 v) {
        const int i = s * SG_THREADS + tid;
        float* as = smem + buffer * SG_STAGE + (i % (BK / 4)) * 4 * SG_LDA + i / (BK / 4);
        as[0] = v.x, as[SG_LDA] = v.y, as[2 * SG_LDA] = v.z, as[3 * SG_LDA] = v.w;
    };
    auto store_b = [&](int buffer, int s, float4 v) {
        const int i = s * SG_THREADS + tid;
        *reinterpret_cast<float4*>(smem + buffer * SG_STAGE + BK * SG_LDA + (i / (BN / 4)) * BN + (i % (BN / 4)) * 4) = v;
    };
    auto a_step = [&](int s) { return SG_A_VECS % SG_THREADS == 0 || s * SG_THREADS + tid < SG_A_VECS; };
    auto b_step = [&](int s) { return SG_B_VECS % SG_THREADS == 0 || s * SG_THREADS + tid < SG_B_VECS; };
    // The next tile waits in registers while this one is multiplied (SG_STAGED), unless that takes more than
    // 32 registers a thread (few threads, large tiles): then it is copied straight through after the multiply.
    float4 ra[SG_A_STEPS], rb[SG_B_STEPS];
    auto fetch = [&](int t) {
#pragma unroll
        for (int s = 0; s < SG_A_STEPS; ++s)
            if (a_step(s))
                ra[s] = load_a(t, s);
#pragma unroll
        for (int s = 0; s < SG_B_STEPS; ++s)
            if (b_step(s))
                rb[s] = load_b(t, s);
    };
    auto stash = [&](int buffer) {
#pragma unroll
        for (int s = 0; s < SG_A_STEPS; ++s)
            if (a_step(s))
                store_a(buffer, s, ra[s]);
#pragma unroll
        for (int s = 0; s < SG_B_STEPS; ++s)
            if (b_step(s))
                store_b(buffer, s, rb[s]);
    };
    auto copy = [&](int t, int buffer) {
#pragma unroll 1
        for (int s = 0; s < SG_A_STEPS; ++s)
            if (a_step(s))
                store_a(buffer, s, load_a(t, s));
#pragma unroll 1
        for (int s = 0; s < SG_B_STEPS; ++s)
            if (b_step(s))
                store_b(buffer, s, load_b(t, s));
    };
    // STAGES >= 3: tile t's copies into `buffer`, issued without waiting (the same elements as load_a/b,
    // and zeros past the edges).
    auto issue = [&](int t, int buffer) {
#pragma unroll SG_ISSUE_UNROLL
        for (int s = 0; s < SG_A_STEPS; ++s) {
            if (!a_step(s))
                continue;
            const int i = s * SG_THREADS + tid;
            const int row = row0 + i / (BK / 4), col = (first + t) * BK + (i % (BK / 4)) * 4;
            float* as = smem + buffer * SG_STAGE + (i % (BK / 4)) * 4 * SG_LDA + i / (BK / 4);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool ok = row < m && col + e < k;
                sg_copy4(as + e * SG_LDA, ok ? a + static_cast<long long>(row) * k + col + e : a, ok);
            }
        }
#pragma unroll SG_ISSUE_UNROLL
        for (int s = 0; s < SG_B_STEPS; ++s) {
            if (!b_step(s))
                continue;
            const int i = s * SG_THREADS + tid;
            const int row = (first + t) * BK + i / (BN / 4), col = col0 + (i % (BN / 4)) * 4;
            float* bs = smem + buffer * SG_STAGE + BK * SG_LDA + (i / (BN / 4)) * BN + (i % (BN / 4)) * 4;
            const float* src = b + static_cast<long long>(row) * n + col;
            if (vec_b && row < k && col + 3 < n) {
                sg_copy16(bs, src);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool ok = row < k && col + e < n;
                    sg_copy4(bs + e, ok ? src + e : b, ok);
                }
            }
        }
    };

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            acc[i][j] = 0.0f;

    auto multiply = [&](int buffer) {
        const float* as = smem + buffer * SG_STAGE;
        const float* bs = as + BK * SG_LDA;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM], bv[TN];
#pragma unroll
            for (int run = 0; run < TM / SG_VA; ++run) {
                const float* p = as + kk * SG_LDA + run * (SG_TY * SG_VA) + ty * SG_VA;
                if constexpr (SG_VA == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(p);
                    av[run * 4 + 0] = v.x, av[run * 4 + 1] = v.y, av[run * 4 + 2] = v.z, av[run * 4 + 3] = v.w;
                } else {
#pragma unroll
                    for (int r = 0; r < SG_VA; ++r)
                        av[run * SG_VA + r] = p[r];
                }
            }
#pragma unroll
            for (int run = 0; run < TN / SG_VB; ++run) {
                const float* p = bs + kk * BN + run * (SG_TX * SG_VB) + tx * SG_VB;
                if constexpr (SG_VB == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(p);
                    bv[run * 4 + 0] = v.x, bv[run * 4 + 1] = v.y, bv[run * 4 + 2] = v.z, bv[run * 4 + 3] = v.w;
                } else {
#pragma unroll
                    for (int r = 0; r < SG_VB; ++r)
                        bv[run * SG_VB + r] = p[r];
                }
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
    };

    if constexpr (STAGES >= 3) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {  // the first STAGES-1 tiles in flight at once
            if (s < tiles)
                issue(s, s);
            sg_commit();  // one group per tile, empty past the end, so the count below holds
        }
        for (int t = 0; t < tiles; ++t) {
            sg_wait<STAGES - 2>();  // this thread's copies of tile t have landed ...
            __syncthreads();        // ... everyone's, and everyone is done with tile t-1's buffer
            if (t + STAGES - 1 < tiles)
                issue(t + STAGES - 1, (t + STAGES - 1) % STAGES);  // into tile t-1's buffer
            sg_commit();
            multiply(t % STAGES);
        }
        sg_wait<0>();
    } else {
        if (tiles > 0)
            copy(0, 0);
        __syncthreads();
        for (int t = 0; t < tiles; ++t) {
            const int buffer = t & 1;
            if constexpr (SG_STAGED) {
                if (t + 1 < tiles)
                    fetch(t + 1);  // in flight while this tile is multiplied
            }
            multiply(buffer);
            if (t + 1 < tiles) {  // buffer ^ 1's last readers finished before the previous barrier
                if constexpr (SG_STAGED)
                    stash(buffer ^ 1);
                else
                    copy(t + 1, buffer ^ 1);
            }
            __syncthreads();
        }
    }

    if constexpr (SK > 1) {  // groups 1..SK-1 hand their sums to group 0, which adds them in a fixed order
        float* partial = reinterpret_cast<float*>(smem4);  // the tile buffers, once every group is done with them
        __syncthreads();
        if (group > 0) {
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    partial[((group - 1) * TM * TN + i * TN + j) * SG_THREADS + tid] = acc[i][j];
        }
        __syncthreads();
        if (group > 0)
            return;
#pragma unroll 1
        for (int g = 1; g < SK; ++g)
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j)
                    acc[i][j] += partial[((g - 1) * TM * TN + i * TN + j) * SG_THREADS + tid];
    }

    const bool vec_c = (n % 4 == 0) && sg_aligned(c);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = row0 + (i / SG_VA) * (SG_TY * SG_VA) + ty * SG_VA + i % SG_VA;
        if (r >= m)
            continue;
        float* out = c + static_cast<long long>(r) * n;
#pragma unroll
        for (int run = 0; run < TN / SG_VB; ++run) {
            const int col = col0 + run * (SG_TX * SG_VB) + tx * SG_VB;
            if constexpr (SG_VB == 4) {
                if (vec_c && col + 3 < n) {
                    *reinterpret_cast<float4*>(out + col) = make_float4(acc[i][run * 4 + 0], acc[i][run * 4 + 1],
                                                                        acc[i][run * 4 + 2], acc[i][run * 4 + 3]);
                    continue;
                }
            }
#pragma unroll
            for (int j = 0; j < SG_VB; ++j)
                if (col + j < n)
                    out[col + j] = acc[i][run * SG_VB + j];
        }
    }
}
