/* sampler.c — penalties, truncation and seeded draws (see sampler.h).
 * The chain follows llama.cpp's default order: repetition penalty, top-k, top-p, min-p,
 * then temperature and the draw, so the same flags mean the same thing in both. */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand { int32_t id; float logit; } cand;

llmi_sampling sampling_defaults(void) {
    llmi_sampling s = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                       .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 0};
    return s;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void sampler_rng_seed(sampler_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double sampler_rng_uniform(sampler_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return (double)(result >> 11) * 0x1.0p-53;
}

size_t sampler_scratch_bytes(int n_vocab) { return (size_t)n_vocab * sizeof(cand); }

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int cmp_cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

int sampler_penalty_window(const llmi_sampling *p, int n_history, int *start) {
    *start = 0;
    int last_n = p->repeat_last_n;
    if (p->repeat_penalty == 1.0f || n_history <= 0 || last_n == 0) return 0;
    *start = (last_n < 0 || last_n >= n_history) ? 0 : n_history - last_n;
    return n_history - *start;
}

static void apply_repeat_penalty(float *logits, int n_vocab, float penalty, const int32_t *win, int n_win) {
    if (penalty == 1.0f || !win || n_win <= 0) return;
    /* Each distinct token is penalised once, however often it repeats (llama.cpp's rule).
     * Short windows (the default 64) scan quadratically; long ones use a visited map. */
    unsigned char *seen_map = (n_win > 128) ? calloc((size_t)n_vocab, 1) : NULL;
    for (int i = 0; i < n_win; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= n_vocab) continue;
        int seen = 0;
        if (seen_map) {
            seen = seen_map[t];
            seen_map[t] = 1;
        } else {
            for (int j = 0; j < i; j++) seen |= win[j] == t;
        }
        if (seen) continue;
        logits[t] = logits[t] > 0 ? logits[t] / penalty : logits[t] * penalty;
    }
    free(seen_map);
}

int32_t sampler_sample(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history, int n_history,
                       sampler_rng *rng, void *scratch) {
    int start = 0;
    int n_win = history ? sampler_penalty_window(p, n_history, &start) : 0;
    double u = p->temperature > 0.0f ? sampler_rng_uniform(rng) : 0.0;
    return sampler_sample_uniform(logits, n_vocab, p, history ? history + start : NULL, n_win, u, scratch);
}

/* After the penalty: the candidates the draw chooses among (c, sorted best first, cut
 * by top-k, top-p and min-p); returns how many.  Only for temperature > 0. */
static int truncate_candidates(const float *logits, int n_vocab, const llmi_sampling *p, cand *c) {
    int n = n_vocab;
    if (p->top_k > 0 && p->top_k < n_vocab) {
        /* Keep the k best in a min-heap (c[0] is the weakest kept): O(V log k) instead of
         * sorting the whole vocabulary for every token. */
        int k = p->top_k;
        for (int i = 0; i < n_vocab; i++) {
            cand x = {i, logits[i]};
            if (i < k) {
                int j = i;
                c[j] = x;
                while (j > 0 && cmp_cand_desc(&c[(j - 1) / 2], &c[j]) < 0) {
                    cand t = c[j]; c[j] = c[(j - 1) / 2]; c[(j - 1) / 2] = t;
                    j = (j - 1) / 2;
                }
            } else if (cmp_cand_desc(&x, &c[0]) < 0) {
                c[0] = x;
                int j = 0;
                for (;;) {
                    int l = 2 * j + 1, r = l + 1, m = j;
                    if (l < k && cmp_cand_desc(&c[l], &c[m]) > 0) m = l;
                    if (r < k && cmp_cand_desc(&c[r], &c[m]) > 0) m = r;
                    if (m == j) break;
                    cand t = c[j]; c[j] = c[m]; c[m] = t;
                    j = m;
                }
            }
        }
        n = k;
    } else {
        for (int i = 0; i < n_vocab; i++) c[i] = (cand){i, logits[i]};
    }
    qsort(c, (size_t)n, sizeof *c, cmp_cand_desc);

    if (p->top_p < 1.0f) {
        double sum = 0, acc = 0;
        for (int i = 0; i < n; i++) sum += exp((double)c[i].logit - c[0].logit);
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += exp((double)c[i].logit - c[0].logit) / sum;
            if (acc >= p->top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0.0f) {
        float floor_logit = c[0].logit + logf(p->min_p);
        int keep = 1;
        while (keep < n && c[keep].logit >= floor_logit) keep++;
        n = keep;
    }
    return n;
}

/* The candidate's unnormalised probability after temperature. */
static double cand_weight(const cand *c, int i, double inv_t) { return exp(((double)c[i].logit - c[0].logit) * inv_t); }

/* Draws from the candidates' distribution with uniform in [0, 1), leaving out id `skip`
 * (-1: none) and renormalising the rest: the residual of a rejected draft.  Returns -1
 * when nothing but skip has any weight. */
static int32_t draw_candidate(const cand *c, int n, double inv_t, double uniform, int32_t skip) {
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (c[i].id != skip) sum += cand_weight(c, i, inv_t);
    if (!(sum > 0)) return -1;
    double r = uniform * sum, acc = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++) {
        if (c[i].id == skip) continue;
        acc += cand_weight(c, i, inv_t);
        last = c[i].id;
        if (r < acc) return last;
    }
    return last;
}

int32_t sampler_sample_uniform(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window,
                               int n_window, double uniform, void *scratch) {
    apply_repeat_penalty(logits, n_vocab, p->repeat_penalty, window, n_window);
    if (p->temperature <= 0.0f) return argmax(logits, n_vocab);
    cand *c = scratch;
    int n = truncate_candidates(logits, n_vocab, p, c);
    int32_t tok = draw_candidate(c, n, 1.0 / p->temperature, uniform, -1);
    /* no candidate has weight (every logit -inf): the first candidate, as argmax and the
     * device sampler choose, never -1 */
    return tok >= 0 ? tok : c[0].id;
}

int32_t sampler_verify_draft(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history,
                             int n_history, int32_t draft, sampler_rng *rng, void *scratch, bool *accepted) {
    int start = 0;
    int n_win = history ? sampler_penalty_window(p, n_history, &start) : 0;
    apply_repeat_penalty(logits, n_vocab, p->repeat_penalty, history ? history + start : NULL, n_win);
    if (p->temperature <= 0.0f) {
        int32_t best = argmax(logits, n_vocab);
        *accepted = best == draft;
        return best;
    }
    cand *c = scratch;
    int n = truncate_candidates(logits, n_vocab, p, c);
    double inv_t = 1.0 / p->temperature, sum = 0, w_draft = 0;
    for (int i = 0; i < n; i++) {
        double w = cand_weight(c, i, inv_t);
        sum += w;
        if (c[i].id == draft) w_draft = w;
    }
    /* Accept with probability min(1, p/q), q = 1 for a one-hot proposal (a draft outside
     * the candidates has p = 0: always rejected). */
    if (sampler_rng_uniform(rng) < w_draft / sum) {
        *accepted = true;
        return draft;
    }
    *accepted = false;
    int32_t tok = draw_candidate(c, n, inv_t, sampler_rng_uniform(rng), draft);
    return tok >= 0 ? tok : draft;
}

float sampler_logprob(const float *logits, int n_vocab, int32_t id, int n_top, int32_t *top_ids, float *top_lp) {
    float mx = -FLT_MAX;
    for (int i = 0; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - mx);
    float lse = mx + (float)log(sum);
    /* Insertion into a short sorted list: n_top is at most LLMI_MAX_LOGPROBS. */
    int k = 0;
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float v = logits[i];
        if (k == n_top && v <= top_lp[k - 1]) continue;
        int pos = k < n_top ? k++ : n_top - 1;
        while (pos > 0 && top_lp[pos - 1] < v) {
            top_lp[pos] = top_lp[pos - 1];
            top_ids[pos] = top_ids[pos - 1];
            pos--;
        }
        top_lp[pos] = v;
        top_ids[pos] = i;
    }
    for (int i = 0; i < k; i++) top_lp[i] -= lse;
    return logits[id] - lse;
}
