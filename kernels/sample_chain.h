/* sample_chain.h — owns the part of device sampling (sample.cu) that is computed one
 * element or one thread at a time, written once for both compilers so that the host can
 * run it too: the per-row parameters, the 64-bit rank keys that order tokens the way
 * sampler.c's sort does, the plan that says how many sorted candidates a row needs, and
 * the chain over sorted candidates (top-p, min-p, temperature, the draw) in sampler.c's
 * arithmetic.  sample.cu runs the element functions in parallel and the scans on one
 * thread; sample_chain_pick below composes the same steps in one thread, and
 * tests/test_sample_chain.c checks it against sampler_sample_uniform on the host.
 * Plain C11 and CUDA C++; no CUDA headers. */
#ifndef LLMI_SAMPLE_CHAIN_H
#define LLMI_SAMPLE_CHAIN_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LLMI_HD static inline __host__ __device__
#else
#define LLMI_HD static inline
#endif

/* One logit row's sampling request (sampler.h's meanings and defaults). */
typedef struct llmi_cuda_sample_params {
    double uniform;              /* the request's draw in [0, 1) from its sampler_rng; read when temperature > 0 */
    float temperature;           /* <= 0: greedy */
    float top_p;                 /* >= 1: off; <= 0 keeps the top token */
    float min_p;                 /* <= 0: off */
    float log_min_p;             /* logf(min_p), taken on the host as sampler.c takes it */
    float repeat_penalty;        /* 1: off */
    float frequency_penalty;     /* 0: off */
    float presence_penalty;      /* 0: off */
    int top_k;                   /* <= 0 or >= n_vocab: off */
    int hist_start, hist_len;    /* the row's penalty window in the hist array */
} llmi_cuda_sample_params;

/* Sorted candidates one block holds in shared memory; a row whose kept prefix can be
 * longer takes the bisection ("wide") path of sample.cu. */
#define LLMI_SAMPLE_CAP 2048

/* An order-preserving map of a logit to 32 bits.  NaN ranks last; -0 and +0 compare equal
 * in sampler.c, so they share a key and the id decides. */
LLMI_HD uint32_t sample_order_key(float x) {
    union { float f; uint32_t u; } v;
    if (x != x) x = -INFINITY;
    if (x == 0.0f) x = 0.0f;
    v.f = x;
    return (v.u & 0x80000000u) ? ~v.u : (v.u | 0x80000000u);
}
/* (logit desc, id asc), sampler.c's candidate order, as one descending 64-bit key.
 * No token's key is 0 (the smallest, -inf with id 0xffffffff, is 0x007fffff_00000000). */
LLMI_HD uint64_t sample_rank_key(float x, int32_t id) {
    return ((uint64_t)sample_order_key(x) << 32) | (uint64_t)(0xffffffffu - (uint32_t)id);
}
LLMI_HD int32_t sample_key_id(uint64_t key) { return (int32_t)(0xffffffffu - (uint32_t)key); }
LLMI_HD float sample_key_logit(uint64_t key) {
    uint32_t o = (uint32_t)(key >> 32);
    union { float f; uint32_t u; } v;
    v.u = (o & 0x80000000u) ? (o & 0x7fffffffu) : ~o;
    return v.f;
}

/* sampler.c's argmax (the first maximum; a NaN at id 0 keeps id 0) from the largest rank
 * key and the row's first logit. */
LLMI_HD int32_t sample_greedy_id(uint64_t best_key, float x0) { return x0 != x0 ? 0 : sample_key_id(best_key); }

typedef struct sample_plan {
    int n_sel;                   /* candidates after top-k: top_k when 0 < top_k < n_vocab, else n_vocab */
    int len;                     /* sorted candidates the chain reads: the len best by rank */
    int z_sorted;                /* top-p's normaliser is summed in order over the len = n_sel sorted
                                    candidates (sampler.c's order); else it is given, summed over the
                                    n_sel best in parallel */
    int wide;                    /* len > LLMI_SAMPLE_CAP: too many to sort in shared memory */
} sample_plan;

/* cnt_minp: tokens whose (penalised) logit is >= max + log_min_p, read when min_p > 0.
 * Top-p and min-p both keep a prefix of the top-k candidates in rank order, so the chain
 * never reads past min(n_sel, max(cnt_minp, 1)) candidates, except that top-p's
 * normaliser covers all n_sel. */
LLMI_HD sample_plan sample_plan_make(const llmi_cuda_sample_params *p, int n_vocab, int cnt_minp) {
    sample_plan s;
    s.n_sel = (p->top_k > 0 && p->top_k < n_vocab) ? p->top_k : n_vocab;
    int keep = s.n_sel;
    if (p->min_p > 0.0f) {
        int c = cnt_minp > 1 ? cnt_minp : 1;
        if (c < keep) keep = c;
    }
    s.z_sorted = p->top_p < 1.0f && s.n_sel <= LLMI_SAMPLE_CAP;
    s.len = s.z_sorted ? s.n_sel : keep;
    s.wide = s.len > LLMI_SAMPLE_CAP;
    return s;
}

/* Per-candidate weights, as sampler.c writes them (c0: the best logit). */
/* llama.cpp's penalties, in its float arithmetic, on one logit of a token that occurs count
 * times in the window: the repetition penalty once, then count x frequency + presence
 * subtracted.  sampler.c and the device kernel both call this. */
LLMI_HD float sample_penalty(float v, float repeat, float frequency, float presence, int count) {
    v = v > 0 ? v / repeat : v * repeat;
    return v - ((float)count * frequency + presence);
}
LLMI_HD float sample_penalise(float v, const llmi_cuda_sample_params *p, int count) {
    return sample_penalty(v, p->repeat_penalty, p->frequency_penalty, p->presence_penalty, count);
}
LLMI_HD int sample_penalties_on(const llmi_cuda_sample_params *p) {
    return p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

LLMI_HD double sample_w_prob(float logit, float c0) { return exp((double)logit - c0); }
LLMI_HD double sample_inv_temp(float temperature) { return 1.0 / temperature; }
LLMI_HD double sample_w_temp(float logit, float c0, double inv_t) { return exp(((double)logit - c0) * inv_t); }

/* The sequential steps, each over candidates in rank order. */
LLMI_HD double sample_seq_sum(const double *w, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += w[i];
    return s;
}
/* q (len): each candidate's probability w / z.  The shortest prefix reaching top_p; n_sel
 * when the len candidates read do not reach it. */
LLMI_HD int sample_top_p_keep(const double *q, int len, float top_p, int n_sel) {
    double acc = 0;
    for (int i = 0; i < len; i++) {
        acc += q[i];
        if (acc >= top_p) return i + 1;
    }
    return n_sel;
}
/* Of the first n candidates, those at or above the best logit + log(min_p), at least one. */
LLMI_HD int sample_min_p_keep(const uint64_t *keys, int len, int n, float log_min_p) {
    float floor_logit = sample_key_logit(keys[0]) + log_min_p;
    int keep = 1;
    while (keep < n && keep < len && sample_key_logit(keys[keep]) >= floor_logit) keep++;
    return keep;
}
/* The inverse-CDF draw over the n kept candidates with weights t (n). */
LLMI_HD int32_t sample_draw(const uint64_t *keys, const double *t, int n, double uniform) {
    double r = uniform * sample_seq_sum(t, n), acc = 0;
    for (int i = 0; i < n; i++) {
        acc += t[i];
        if (r < acc) return sample_key_id(keys[i]);
    }
    return sample_key_id(keys[n - 1]);
}

/* The whole chain over keys (len), the best len rank keys in descending order, in one
 * thread: the steps sample.cu's fast path runs, the element loops serial.  z: top-p's
 * normaliser when !pl->z_sorted.  w (len) doubles of scratch. */
LLMI_HD int32_t sample_chain_pick(const uint64_t *keys, const sample_plan *pl, double z,
                                  const llmi_cuda_sample_params *p, double *w) {
    const int len = pl->len;
    const float c0 = sample_key_logit(keys[0]);
    int n = pl->n_sel;
    if (p->top_p < 1.0f) {
        for (int i = 0; i < len; i++) w[i] = sample_w_prob(sample_key_logit(keys[i]), c0);
        if (pl->z_sorted) z = sample_seq_sum(w, len);
        for (int i = 0; i < len; i++) w[i] = w[i] / z;
        n = sample_top_p_keep(w, len, p->top_p, pl->n_sel);
    }
    if (p->min_p > 0.0f) n = sample_min_p_keep(keys, len, n, p->log_min_p);
    const double inv_t = sample_inv_temp(p->temperature);
    for (int i = 0; i < n; i++) w[i] = sample_w_temp(sample_key_logit(keys[i]), c0, inv_t);
    return sample_draw(keys, w, n, p->uniform);
}

#endif
