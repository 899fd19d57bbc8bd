// Causal attention's softmax between two cuBLAS GEMMs (cudagate.yaml's steps): scores = scale·Q·Kᵀ
// arrive in a scratch buffer, H·T rows of T; these two kernels turn each row into probabilities in
// place, keys after the query's position (j > i) masked to 0.
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)

// A float's maximum by integer atomics: non-negative floats order as ints, negative ones in reverse
// as unsigned ints. The accumulator must start at -inf (the memset step before row_max).
__device__ void atomic_max_float(float* address, float value)
{
    if (value >= 0.0f) atomicMax(reinterpret_cast<int*>(address), __float_as_int(value));
    else atomicMin(reinterpret_cast<unsigned int*>(address), __float_as_uint(value));
}

__device__ float block_reduce(float value, bool take_max)
{
    __shared__ float partial[BLOCK];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            float other = partial[threadIdx.x + stride];
            partial[threadIdx.x] = take_max ? fmaxf(partial[threadIdx.x], other) : partial[threadIdx.x] + other;
        }
        __syncthreads();
    }
    float result = partial[0];
    __syncthreads();
    return result;
}

// Grid (cdiv(T, BLOCK), H·T): each block takes BLOCK keys of one row and folds their maximum into rowmax.
extern "C" __global__ void row_max(const float* scores, float* rowmax, int T)
{
    int row = blockIdx.y;
    int i = row % T;
    int j = blockIdx.x * BLOCK + threadIdx.x;
    float value = (j < T && j <= i) ? scores[(size_t)row * T + j] : NEG_INF;
    float most = block_reduce(value, true);
    if (threadIdx.x == 0 && most > NEG_INF) atomic_max_float(&rowmax[row], most);
}

// Grid (H·T): one block per row; p = exp(s - max) / sum over the unmasked keys, 0 past the query.
extern "C" __global__ void softmax_rows(float* scores, const float* rowmax, int T)
{
    int row = blockIdx.x;
    int i = row % T;
    float* s = scores + (size_t)row * T;
    float most = rowmax[row];
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= i; j += BLOCK) sum += expf(s[j] - most);
    float total = block_reduce(sum, false);
    for (int j = threadIdx.x; j < T; j += BLOCK) s[j] = j <= i ? expf(s[j] - most) / total : 0.0f;
}
