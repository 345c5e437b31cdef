/* sample.cu — owns token selection on the device: greedy argmax and the seeded sampling
 * chain of src/engine/sampler.c (repetition, frequency and presence penalties, top-k,
 * top-p, min-p, temperature, the draw), one block per logit row.  Rows that use
 * sampler.c's host-only stages (logit bias, DRY, typical, top-n-sigma, XTC) never come here.
 *
 * sampler.c sorts candidates by (logit desc, id asc) and keeps prefixes of that order.
 * Here every token has a 64-bit rank key with the same order (sample_chain.h).  The fast
 * path finds the key of rank len (the candidates the chain needs: top-k, cut further by
 * min-p's floor) with an 8-bit radix select (at most 8 histogram passes over the row,
 * usually 4), gathers those len keys into shared memory, sorts them (bitonic), and runs
 * sampler.c's scans over them with the sample_chain.h functions: per-candidate exps in
 * parallel, the running sums on one thread in rank order, in double.  Only a row whose
 * kept prefix may exceed LLMI_SAMPLE_CAP (top-k off or above the cap, and min-p not
 * cutting it short) takes the wide path: each of top-p's and the draw's cut points is
 * found by a 64-step bisection over the keys with block-wide double sums.
 *
 * Same logits, window and uniform as sampler_sample_uniform give the same token, except
 * where a running sum lands within rounding of a cut point: the device's exp() may differ
 * from glibc's in the last bit, and the wide path (and top-p's normaliser when top-k is
 * off) sums in another order.  Logits must be finite (sampler.c's sort is undefined on
 * NaN). */
#include "common.cuh"
#include "sample_chain.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_BINS 256

struct sample_smem {
    uint64_t keys[LLMI_SAMPLE_CAP];   /* the len best rank keys, then sorted descending */
    double w[LLMI_SAMPLE_CAP];        /* per-candidate weights */
    unsigned hist[SAMPLE_BINS];       /* radix-select histogram */
    double red_d[32];
    uint64_t red_u[32];
    int red_i[32];
    int n_keys;
    int sel[3];                       /* radix select: bin, rank left, bin taken whole */
    int n_keep;
    double z;
};

/* Block-wide reductions (blockDim.x a multiple of 32); every thread gets the result. */
template <typename T, typename Op> __device__ T block_reduce(T v, T identity, Op op, T *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
struct op_add_d { __device__ double operator()(double a, double b) const { return a + b; } };
struct op_add_i { __device__ int operator()(int a, int b) const { return a + b; } };
struct op_max_u { __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; } };
struct op_min_u { __device__ uint64_t operator()(uint64_t a, uint64_t b) const { return a < b ? a : b; } };

/* The k-th largest rank key of the row (1 <= k <= n): MSD radix select over 8-bit digits.
 * Each pass histograms the keys that match the digits found so far; it ends as soon as
 * the bin holding rank k is taken whole, so then the keys >= the result are exactly k. */
__device__ uint64_t radix_select(const float *x, int n, int k, sample_smem *sm) {
    uint64_t prefix = 0, mask = 0;
    int remaining = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < SAMPLE_BINS; i += blockDim.x) sm->hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            uint64_t key = sample_rank_key(x[i], i);
            if ((key & mask) == prefix) atomicAdd(&sm->hist[(key >> shift) & 0xff], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            /* lane l owns bins 255-8l .. 248-8l (descending); find the bin where the count
             * from the top reaches `remaining` */
            const int lane = threadIdx.x;
            int cnt[8], tot = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                cnt[j] = (int)sm->hist[255 - 8 * lane - j];
                tot += cnt[j];
            }
            int incl = tot;
            for (int o = 1; o < 32; o <<= 1) {
                int y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += y;
            }
            const int excl = incl - tot;
            const unsigned bal = __ballot_sync(0xffffffffu, excl < remaining && remaining <= incl);
            if (lane == __ffs(bal) - 1) {
                int above = excl, j = 0;
                while (j < 7 && above + cnt[j] < remaining) above += cnt[j++];
                sm->sel[0] = 255 - 8 * lane - j;
                sm->sel[1] = remaining - above;
                sm->sel[2] = cnt[j] == remaining - above;
            }
        }
        __syncthreads();
        const int bin = sm->sel[0];
        const bool whole = sm->sel[2] != 0;
        remaining = sm->sel[1];
        prefix |= (uint64_t)bin << shift;
        mask |= (uint64_t)0xff << shift;
        if (whole) break;
    }
    __syncthreads();   /* sel and hist are reused by the next call */
    return prefix;
}

/* Sorts s (P, a power of two) descending. */
__device__ void bitonic_sort_desc(uint64_t *s, int P) {
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += blockDim.x) {
                const int ixj = i ^ j;
                if (ixj > i) {
                    const uint64_t a = s[i], b = s[ixj];
                    const bool desc = (i & k) == 0;
                    if (desc ? a < b : a > b) {
                        s[i] = b;
                        s[ixj] = a;
                    }
                }
            }
            __syncthreads();
        }
}

/* What a wide-path stage weighs each kept token by. */
enum { W_PROB = 0, W_TEMP };

/* Sum over tokens with key >= max(tau, lo) of the stage's weight. */
__device__ double stage_sum(const float *x, int n, uint64_t tau, uint64_t lo, int mode, float m, double inv_t,
                            sample_smem *sm) {
    const uint64_t th = tau > lo ? tau : lo;
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        if (sample_rank_key(v, i) < th) continue;
        s += mode == W_PROB ? sample_w_prob(v, m) : sample_w_temp(v, m, inv_t);
    }
    return block_reduce(s, 0.0, op_add_d(), sm->red_d);
}

/* Largest tau with stage_sum(tau) >= target (ge) or > target (!ge); the sum does not grow
 * with tau, so tau is built bit by bit from the top.  0 when no tau qualifies. */
__device__ uint64_t bisect(const float *x, int n, uint64_t lo, int mode, float m, double inv_t, double target, bool ge,
                           sample_smem *sm) {
    uint64_t tau = 0;
    for (int bit = 63; bit >= 0; bit--) {
        const uint64_t c = tau | (1ull << bit);
        const double s = stage_sum(x, n, c, lo, mode, m, inv_t, sm);
        if (ge ? s >= target : s > target) tau = c;
    }
    return tau;
}

/* The fast path: the chain over the pl->len best keys, sorted in shared memory. */
__device__ int32_t sample_sorted(const float *x, int n_vocab, const llmi_cuda_sample_params &p, const sample_plan &pl,
                                 float m, sample_smem *sm) {
    const int tid = threadIdx.x, len = pl.len;
    const uint64_t T = len < n_vocab ? radix_select(x, n_vocab, len, sm) : 0;
    if (tid == 0) sm->n_keys = 0;
    __syncthreads();
    for (int i = tid; i < n_vocab; i += blockDim.x) {
        const uint64_t key = sample_rank_key(x[i], i);
        if (key >= T) sm->keys[atomicAdd(&sm->n_keys, 1)] = key;   /* exactly len keys are >= T */
    }
    int P = 1;
    while (P < len) P <<= 1;
    __syncthreads();
    for (int i = len + tid; i < P; i += blockDim.x) sm->keys[i] = 0;   /* below every token's key */
    __syncthreads();
    bitonic_sort_desc(sm->keys, P);

    int n = pl.n_sel;
    if (p.top_p < 1.0f) {
        for (int i = tid; i < len; i += blockDim.x) sm->w[i] = sample_w_prob(sample_key_logit(sm->keys[i]), m);
        double z = 0.0;
        if (!pl.z_sorted) {
            /* the normaliser over all n_sel candidates, more than are sorted */
            const uint64_t Ts = pl.n_sel < n_vocab ? radix_select(x, n_vocab, pl.n_sel, sm) : 0;
            double s = 0.0;
            for (int i = tid; i < n_vocab; i += blockDim.x)
                if (sample_rank_key(x[i], i) >= Ts) s += sample_w_prob(x[i], m);
            z = block_reduce(s, 0.0, op_add_d(), sm->red_d);
        }
        __syncthreads();
        if (tid == 0) sm->z = pl.z_sorted ? sample_seq_sum(sm->w, len) : z;
        __syncthreads();
        z = sm->z;
        for (int i = tid; i < len; i += blockDim.x) sm->w[i] = sm->w[i] / z;
        __syncthreads();
        if (tid == 0) sm->n_keep = sample_top_p_keep(sm->w, len, p.top_p, pl.n_sel);
        __syncthreads();
        n = sm->n_keep;
    }
    if (p.min_p > 0.0f) {
        __syncthreads();
        if (tid == 0) sm->n_keep = sample_min_p_keep(sm->keys, len, n, p.log_min_p);
        __syncthreads();
        n = sm->n_keep;
    }
    const double inv_t = sample_inv_temp(p.temperature);
    __syncthreads();
    for (int i = tid; i < n; i += blockDim.x) sm->w[i] = sample_w_temp(sample_key_logit(sm->keys[i]), m, inv_t);
    __syncthreads();
    return tid == 0 ? sample_draw(sm->keys, sm->w, n, p.uniform) : -1;   /* thread 0's is the answer */
}

/* The wide path: the same cut points found by bisection over the whole row. */
__device__ int32_t sample_wide(const float *x, int n_vocab, const llmi_cuda_sample_params &p, const sample_plan &pl,
                               float m, uint64_t best, sample_smem *sm) {
    uint64_t lo = pl.n_sel < n_vocab ? radix_select(x, n_vocab, pl.n_sel, sm) : 0;
    if (p.top_p < 1.0f) {
        const double z = stage_sum(x, n_vocab, 0, lo, W_PROB, m, 1.0, sm);
        uint64_t tau = bisect(x, n_vocab, lo, W_PROB, m, 1.0, (double)p.top_p * z, true, sm);
        if (tau > best) tau = best;   /* top_p <= 0: sampler.c keeps the top token */
        if (tau > lo) lo = tau;
    }
    if (p.min_p > 0.0f) {
        uint64_t th = (uint64_t)sample_order_key(m + p.log_min_p) << 32;
        if (th > best) th = best;     /* the top token always stays */
        if (th > lo) lo = th;
    }
    const double inv_t = sample_inv_temp(p.temperature);
    const double zt = stage_sum(x, n_vocab, 0, lo, W_TEMP, m, inv_t, sm);
    /* the first token (rank order) whose running sum exceeds r: the largest tau with
     * sum(key >= tau) > r */
    uint64_t tau = bisect(x, n_vocab, lo, W_TEMP, m, inv_t, p.uniform * zt, false, sm);
    if (tau == 0) {
        /* rounding left r at or past the whole sum: the last kept token, as sampler.c */
        uint64_t least = (uint64_t)~0ull;
        for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
            const uint64_t key = sample_rank_key(x[i], i);
            if (key >= lo && key < least) least = key;
        }
        tau = block_reduce(least, (uint64_t)~0ull, op_min_u(), sm->red_u);
    }
    return sample_key_id(tau);
}

/* grid (n_rows), block SAMPLE_THREADS. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
    llmi_sample_kernel(float *logits, int n_vocab, const llmi_cuda_sample_params *params, const int32_t *hist,
                       int32_t *out) {
    __shared__ sample_smem sm;
    const int row = blockIdx.x, tid = threadIdx.x;
    const llmi_cuda_sample_params p = params[row];
    float *x = logits + (int64_t)row * n_vocab;
    if (sample_penalties_on(&p) && p.hist_len > 0) {
        const int32_t *h = hist + p.hist_start;
        for (int i = tid; i < p.hist_len; i += blockDim.x) {
            const int32_t t = h[i];
            if (t < 0 || t >= n_vocab) continue;
            bool seen = false;   /* each distinct token once: its first occurrence applies it */
            for (int j = 0; j < i && !seen; j++) seen = h[j] == t;
            if (seen) continue;
            int count = 1;
            for (int j = i + 1; j < p.hist_len; j++) count += h[j] == t;
            x[t] = sample_penalise(x[t], &p, count);
        }
        __syncthreads();
    }

    uint64_t best = 0;
    for (int i = tid; i < n_vocab; i += blockDim.x) {
        const uint64_t k = sample_rank_key(x[i], i);
        best = k > best ? k : best;
    }
    best = block_reduce(best, (uint64_t)0, op_max_u(), sm.red_u);
    if (p.temperature <= 0.0f) {
        if (tid == 0) out[row] = sample_greedy_id(best, x[0]);
        return;
    }
    const float m = sample_key_logit(best);
    int cnt = 0;
    if (p.min_p > 0.0f) {
        const float floor_logit = m + p.log_min_p;
        for (int i = tid; i < n_vocab; i += blockDim.x) cnt += x[i] >= floor_logit;
        cnt = block_reduce(cnt, 0, op_add_i(), sm.red_i);
    }
    const sample_plan pl = sample_plan_make(&p, n_vocab, cnt);
    const int32_t id = pl.wide ? sample_wide(x, n_vocab, p, pl, m, best, &sm) : sample_sorted(x, n_vocab, p, pl, m, &sm);
    if (tid == 0) out[row] = id;
}

/* grid (n_rows), block 1024: argmax, lowest id on ties (the largest rank key). */
__global__ void __launch_bounds__(1024) llmi_argmax_kernel(const float *logits, int n_vocab, int32_t *out) {
    __shared__ uint64_t red[32];
    const float *lg = logits + (int64_t)blockIdx.x * n_vocab;
    uint64_t best = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        const uint64_t k = sample_rank_key(lg[i], i);
        best = k > best ? k : best;
    }
    best = block_reduce(best, (uint64_t)0, op_max_u(), red);
    if (threadIdx.x == 0) out[blockIdx.x] = sample_greedy_id(best, lg[0]);
}

extern "C" cudaError_t llmi_cuda_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    if (n_vocab <= 0) return cudaErrorInvalidValue;
    llmi_argmax_kernel<<<n_rows, 1024, 0, s>>>(logits, n_vocab, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_sample(float *logits, int n_rows, int n_vocab, const llmi_cuda_sample_params *params,
                                        const int32_t *hist, int32_t *out, cudaStream_t s) {
    if (n_rows <= 0) return cudaSuccess;
    if (n_vocab <= 0) return cudaErrorInvalidValue;
    llmi_sample_kernel<<<n_rows, SAMPLE_THREADS, 0, s>>>(logits, n_vocab, params, hist, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
