/* sample.cu — owns token selection on the device: greedy argmax and the seeded sampling
 * chain of src/sampler.c (repetition penalty, top-k, top-p, min-p, temperature, draw).
 *
 * sampler.c sorts the candidates by (logit desc, id asc) and truncates prefixes of that
 * order.  Here every token gets a 64-bit rank key with the same order (an order-preserving
 * map of the logit in the high half, ~id in the low half), and each truncation point is
 * found by bisection over the key bits: 64 block-wide reductions per stage instead of a
 * sort, giving exactly the prefixes sampler.c keeps (sums in double, as there). */
#include "common.cuh"

#define SAMPLE_THREADS 1024

__device__ __forceinline__ uint32_t float_order_key(float x) {
    if (x != x) x = -INFINITY;   /* NaN ranks last */
    uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t rank_key(float x, int id) {
    return ((uint64_t)float_order_key(x) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}

__device__ double block_sum_d(double v, double *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ uint64_t block_max_u64(uint64_t v, uint64_t *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t y = __shfl_xor_sync(0xffffffffu, v, o);
        v = y > v ? y : v;
    }
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) {
        uint64_t y = __shfl_xor_sync(0xffffffffu, v, o);
        v = y > v ? y : v;
    }
    return v;
}

/* What a bisection stage weighs each kept token by. */
enum { W_COUNT = 0, W_PROB, W_TEMP };

/* Sum over tokens with key >= max(tau, lo) of the stage's weight. */
__device__ double stage_sum(const float *x, int n, uint64_t tau, uint64_t lo, int mode, float m, double inv_t,
                            double *red) {
    uint64_t th = tau > lo ? tau : lo;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        if (rank_key(v, i) < th) continue;
        if (mode == W_COUNT) s += 1.0;
        else if (mode == W_PROB) s += exp((double)v - m);
        else s += exp(((double)v - m) * inv_t);
    }
    return block_sum_d(s, red);
}

/* Largest tau with stage_sum(tau) >= target (ge) or > target (!ge); the sum is
 * non-increasing in tau, so the answer is built bit by bit from the top. */
__device__ uint64_t bisect(const float *x, int n, uint64_t lo, int mode, float m, double inv_t, double target, bool ge,
                           double *red) {
    uint64_t tau = 0;
    for (int bit = 63; bit >= 0; bit--) {
        uint64_t c = tau | (1ull << bit);
        double s = stage_sum(x, n, c, lo, mode, m, inv_t, red);
        if (ge ? s >= target : s > target) tau = c;
    }
    return tau;
}

/* grid (n_rows), block SAMPLE_THREADS. */
__global__ void __launch_bounds__(SAMPLE_THREADS) llmi_sample_kernel(const float *logits, int n_vocab, const llmi_cuda_sample_params *params,
                                   const int32_t *hist, float *scratch, int32_t *out) {
    __shared__ double red[32];
    __shared__ uint64_t redu[32];
    const int row = blockIdx.x;
    const llmi_cuda_sample_params p = params[row];
    const float *lg = logits + (int64_t)row * n_vocab;
    float *x = scratch + (int64_t)row * n_vocab;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) x[i] = lg[i];
    __syncthreads();
    if (p.repeat_penalty != 1.0f && p.hist_len > 0) {
        const int32_t *h = hist + p.hist_start;
        for (int i = threadIdx.x; i < p.hist_len; i += blockDim.x) {
            int32_t t = h[i];
            if (t < 0 || t >= n_vocab) continue;
            bool seen = false;   /* each distinct token once: the first occurrence applies it */
            for (int j = 0; j < i && !seen; j++) seen = h[j] == t;
            if (seen) continue;
            float v = x[t];
            x[t] = v > 0 ? v / p.repeat_penalty : v * p.repeat_penalty;
        }
        __syncthreads();
    }

    uint64_t best = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        uint64_t k = rank_key(x[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, redu);
    const int top_id = (int)(0xffffffffu - (uint32_t)best);
    if (p.temperature <= 0.0f) {
        if (threadIdx.x == 0) out[row] = top_id;
        return;
    }
    const float m = x[top_id];
    uint64_t lo = 0;
    if (p.top_k > 0 && p.top_k < n_vocab) lo = bisect(x, n_vocab, 0, W_COUNT, m, 1.0, (double)p.top_k, true, red);
    if (p.top_p < 1.0f) {
        double z = stage_sum(x, n_vocab, 0, lo, W_PROB, m, 1.0, red);
        lo = bisect(x, n_vocab, lo, W_PROB, m, 1.0, (double)p.top_p * z, true, red);
    }
    if (p.min_p > 0.0f) {
        float floor_logit = m + logf(p.min_p);
        uint64_t th = (uint64_t)float_order_key(floor_logit) << 32;
        if (th > best) th = best;   /* the top token always stays */
        if (th > lo) lo = th;
    }
    const double inv_t = 1.0 / (double)p.temperature;
    double z = stage_sum(x, n_vocab, 0, lo, W_TEMP, m, inv_t, red);
    double r = p.uniform * z;
    /* the first token (in rank order) whose running sum exceeds r: the largest tau with
     * sum(key >= tau) > r; when rounding leaves none, the last kept token (key lo) */
    uint64_t tau = bisect(x, n_vocab, lo, W_TEMP, m, inv_t, r, false, red);
    if (tau < lo) tau = lo;
    if (threadIdx.x == 0) out[row] = (int32_t)(0xffffffffu - (uint32_t)tau);
}

/* grid (n_rows), block 1024: argmax, lowest id on ties (the largest rank key). */
__global__ void __launch_bounds__(1024) llmi_argmax_kernel(const float *logits, int n_vocab, int32_t *out) {
    __shared__ uint64_t redu[32];
    const float *lg = logits + (int64_t)blockIdx.x * n_vocab;
    uint64_t best = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        uint64_t k = rank_key(lg[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best, redu);
    if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)(0xffffffffu - (uint32_t)best);
}

extern "C" cudaError_t llmi_cuda_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    if (n_vocab <= 0) return cudaErrorInvalidValue;
    llmi_argmax_kernel<<<n_rows, 1024, 0, s>>>(logits, n_vocab, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_sample(const float *logits, int n_rows, int n_vocab,
                                        const llmi_cuda_sample_params *params, const int32_t *hist, float *scratch,
                                        int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    if (n_vocab <= 0) return cudaErrorInvalidValue;
    llmi_sample_kernel<<<n_rows, SAMPLE_THREADS, 0, s>>>(logits, n_vocab, params, hist, scratch, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
