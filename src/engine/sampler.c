/* sampler.c — penalties, truncation and seeded draws (see sampler.h).
 * The chain follows llama.cpp's default order (common_sampler's): logit bias, penalties,
 * top-n-sigma, top-k, typical, top-p, min-p, XTC, then temperature and the draw, so the
 * same flags mean the same thing in both. */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/dry.h"
#include "sample_chain.h"   /* sample_rank_key: the device sampler's candidate order, shared */

typedef struct cand { int32_t id; float logit; } cand;

llmi_sampling sampling_defaults(void) {
    llmi_sampling s = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .typical_p = 1.0f,
                       .top_n_sigma = -1.0f, .xtc_probability = 0.0f, .xtc_threshold = 0.1f,
                       .dry_multiplier = 0.0f, .dry_base = 1.75f, .dry_allowed_length = 2, .dry_penalty_last_n = 64,
                       .n_dry_breakers = -1,
                       .repeat_penalty = 1.0f, .repeat_last_n = 64, .mirostat = 0, .mirostat_tau = 5.0f,
                       .mirostat_eta = 0.1f, .seed = 0};
    return s;
}

/* Every stage added after the first release is off when zero, so that a zero-filled
 * llmi_sampling still means the older chain. */
static bool xtc_on(const llmi_sampling *p) { return p->xtc_probability > 0.0f && p->xtc_threshold <= 0.5f; }
static bool typical_on(const llmi_sampling *p) { return p->typical_p > 0.0f && p->typical_p < 1.0f; }

bool sampler_dry_on(const llmi_sampling *p) {
    return p->dry_multiplier != 0.0f && p->dry_base >= 1.0f && p->dry_penalty_last_n != 0;
}

bool sampler_needs_host(const llmi_sampling *p) {
    return p->n_logit_bias > 0 || sampler_dry_on(p) || typical_on(p) || p->top_n_sigma > 0.0f || xtc_on(p) ||
           p->mirostat != 0;
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

/* scratch: candidates (n_vocab), then typical's order (n_vocab cands) and scores (n_vocab
 * doubles), then DRY's (max_history) ints; the penalties' counts (n_vocab ints) reuse the
 * candidates' space, the radix sort's keys (2 x n_vocab uint64) typical's, DRY's per-token
 * lengths the candidates'. */
size_t sampler_scratch_bytes(int n_vocab, int max_history) {
    return (size_t)n_vocab * (2 * sizeof(cand) + sizeof(double)) + (size_t)(max_history > 0 ? max_history : 0) * sizeof(int);
}

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

static bool penalties_on(const llmi_sampling *p) {
    return p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
}

int sampler_penalty_window(const llmi_sampling *p, int n_history, int *start) {
    *start = 0;
    int last_n = p->repeat_last_n;
    if (!penalties_on(p) || n_history <= 0 || last_n == 0) return 0;
    *start = (last_n < 0 || last_n >= n_history) ? 0 : n_history - last_n;
    return n_history - *start;
}

/* sample_penalty (sample_chain.h, shared with the device) once for each distinct token. */
static void penalise(float *logit, const llmi_sampling *p, int count) {
    *logit = sample_penalty(*logit, p->repeat_penalty, p->frequency_penalty, p->presence_penalty, count);
}

static void apply_penalties(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *win, int n_win,
                            void *scratch) {
    if (!penalties_on(p) || !win || n_win <= 0) return;
    if (n_win <= 128) {
        /* short windows (the default 64): count each token at its first occurrence */
        for (int i = 0; i < n_win; i++) {
            int32_t t = win[i];
            if (t < 0 || t >= n_vocab) continue;
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = win[j] == t;
            if (seen) continue;
            int count = 1;
            for (int j = i + 1; j < n_win; j++) count += win[j] == t;
            penalise(&logits[t], p, count);
        }
        return;
    }
    int *count = scratch;   /* (n_vocab) */
    memset(count, 0, (size_t)n_vocab * sizeof *count);
    for (int i = 0; i < n_win; i++)
        if (win[i] >= 0 && win[i] < n_vocab) count[win[i]]++;
    for (int i = 0; i < n_win; i++) {
        int32_t t = win[i];
        if (t < 0 || t >= n_vocab || !count[t]) continue;
        penalise(&logits[t], p, count[t]);
        count[t] = 0;
    }
}

static void apply_logit_bias(float *logits, int n_vocab, const llmi_sampling *p) {
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].id;
        if (t >= 0 && t < n_vocab) logits[t] += p->logit_bias[i].bias;
    }
}

/* Top-n-sigma (Tang et al. 2024): logits below max - n x std become -inf, the mean and
 * std over the finite ones, in llama.cpp's float arithmetic and vocabulary order. */
static void apply_top_n_sigma(float *logits, int n_vocab, float n_sigma) {
    if (n_sigma <= 0.0f || n_vocab <= 1) return;
    float max = -INFINITY, sum = 0.0f;
    int valid = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        max = logits[i] > max ? logits[i] : max;
        sum += logits[i];
        valid++;
    }
    if (!valid) return;
    float mean = sum / (float)valid, acc = 0.0f;
    for (int i = 0; i < n_vocab; i++) {
        if (logits[i] == -INFINITY) continue;
        double d = (double)(logits[i] - mean);
        acc = (float)((double)acc + d * d);
    }
    float floor_logit = max - n_sigma * sqrtf(acc / (float)valid);
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] < floor_logit) logits[i] = -INFINITY;
}

/* DRY over the last dry_penalty_last_n of history[0, n_history). */
static void apply_dry(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history, int n_history,
                      void *scratch) {
    if (!sampler_dry_on(p) || !history || n_history <= 0) return;
    int n = p->dry_penalty_last_n < 0 || p->dry_penalty_last_n > n_history ? n_history : p->dry_penalty_last_n;
    const dry_params dp = {p->dry_multiplier, p->dry_base, p->dry_allowed_length};
    /* DRY's n_vocab + n ints from the start: 4 (n_vocab + n) bytes fit in the 24 n_vocab +
     * 4 max_history that sampler_scratch_bytes gives, n <= max_history */
    dry_apply(logits, n_vocab, &dp, p->dry_table, history + n_history - n, n, scratch);
}

/* The logit edits before truncation, in chain order.  history: the whole sequence so far,
 * for DRY (NULL: none). */
static void edit_logits(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *win, int n_win,
                        const int32_t *history, int n_history, void *scratch) {
    apply_logit_bias(logits, n_vocab, p);
    apply_penalties(logits, n_vocab, p, win, n_win, scratch);
    apply_dry(logits, n_vocab, p, history, n_history, scratch);
    apply_top_n_sigma(logits, n_vocab, p->top_n_sigma);
}

/* Softmax of c[0, n)'s logits (c[0] the best) in w, un-tempered. */
static void cand_softmax(const cand *c, int n, double *w) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (w[i] = exp((double)c[i].logit - c[0].logit));
    for (int i = 0; i < n; i++) w[i] /= sum;
}

typedef struct { float score; int32_t rank; } typ_key;   /* float scores, as llama.cpp's */
static int cmp_typ(const void *a, const void *b) {
    const typ_key *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return x->rank - y->rank;
}

/* Locally typical sampling over c[0, n) (sorted): the tokens whose surprise is closest to
 * the entropy, fewest first, until their mass passes typical_p (llama.cpp: cum > p).
 * Tokens of probability 0 have infinite surprise and no share of the entropy.  The kept
 * ones stay in rank order. */
static int typical_keep(cand *c, int n, float typical_p, int n_vocab) {
    if (!(c[0].logit > -INFINITY)) return n;
    typ_key *k = (typ_key *)(c + n_vocab);               /* (n) the scratch after the candidates */
    double *w = (double *)(c + 2 * (size_t)n_vocab);     /* (n) */
    cand_softmax(c, n, w);
    double entropy = 0;
    for (int i = 0; i < n; i++)
        if (w[i] > 0) entropy -= w[i] * log(w[i]);
    for (int i = 0; i < n; i++) k[i] = (typ_key){w[i] > 0 ? (float)fabs(-log(w[i]) - entropy) : INFINITY, i};
    qsort(k, (size_t)n, sizeof *k, cmp_typ);
    double cum = 0;
    int keep = n;
    for (int i = 0; i < n; i++) {
        cum += w[k[i].rank];
        if (cum > typical_p) { keep = i + 1; break; }
    }
    for (int i = 0; i < keep; i++) w[k[i].rank] = -1.0;   /* marks the kept */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (w[i] == -1.0) c[m++] = c[i];
    return m;
}

/* XTC (Exclude Top Choices): when its draw says so and at least two candidates reach the
 * threshold, all of them but the least likely go. */
static int xtc_cut(cand *c, int n, const llmi_sampling *p, double uniform, int n_vocab) {
    if (n < 2 || uniform > p->xtc_probability || !(c[0].logit > -INFINITY)) return n;   /* llama.cpp: chance > probability skips */
    double *w = (double *)(c + 2 * (size_t)n_vocab);     /* (n) the scratch after typical's keys */
    cand_softmax(c, n, w);
    int last = 0;
    while (last + 1 < n && w[last + 1] >= p->xtc_threshold) last++;
    if (last == 0 || w[0] < p->xtc_threshold) return n;
    memmove(c, c + last, (size_t)(n - last) * sizeof *c);
    return n - last;
}

/* Sorts c[0, n) best first in sample_rank_key order (cmp_cand_desc's order, -0/+0 by id):
 * an LSD radix sort over the keys' bytes, O(n), for whole-vocabulary candidate lists (top-k
 * off), where qsort was most of a sampled token's time.  keys, tmp: (n) each. */
static void radix_sort_desc(cand *c, int n, const float *logits, uint64_t *keys, uint64_t *tmp) {
    for (int i = 0; i < n; i++) keys[i] = sample_rank_key(c[i].logit, c[i].id);
    for (int shift = 0; shift < 64; shift += 8) {
        int start[257] = {0};
        /* bucket 255 - digit first: descending */
        for (int i = 0; i < n; i++) start[256 - ((keys[i] >> shift) & 255)]++;
        if (start[256 - ((keys[0] >> shift) & 255)] == n) continue;   /* one digit for all: nothing moves */
        for (int b = 1; b <= 256; b++) start[b] += start[b - 1];
        for (int i = 0; i < n; i++) tmp[start[255 - ((keys[i] >> shift) & 255)]++] = keys[i];
        uint64_t *t = keys;
        keys = tmp, tmp = t;
    }
    for (int i = 0; i < n; i++) {
        int32_t id = sample_key_id(keys[i]);
        c[i] = (cand){id, logits[id]};
    }
}

/* Sorts c[0, n) best first: a radix sort for long lists, qsort for short ones (the order is
 * the same).  c has the scratch's n_vocab candidates and the typical region after it. */
static void sort_candidates(cand *c, int n, const float *logits, int n_vocab) {
    if (n > 1024) {
        uint64_t *keys = (uint64_t *)(c + n_vocab);   /* typical's space, free until it runs */
        radix_sort_desc(c, n, logits, keys, keys + n_vocab);
    } else {
        qsort(c, (size_t)n, sizeof *c, cmp_cand_desc);
    }
}

/* The candidates the draw chooses among, from logits after edit_logits: c sorted best
 * first, cut by top-k, typical, top-p, min-p and XTC; returns how many. */
static int truncate_candidates(const float *logits, int n_vocab, const llmi_sampling *p, double xtc_uniform, cand *c) {
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
    sort_candidates(c, n, logits, n_vocab);

    if (typical_on(p)) n = typical_keep(c, n, p->typical_p, n_vocab);
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
    if (xtc_on(p)) n = xtc_cut(c, n, p, xtc_uniform, n_vocab);
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

/* Whether greedy decoding must run the truncation: typical and XTC can drop the best
 * token, the other stages never do. */
static bool greedy_truncates(const llmi_sampling *p) { return typical_on(p) || xtc_on(p); }

/* The chain up to the draw, DRY over history[0, n_history) (NULL: none).  Greedy: *n_out 0
 * and the token returned (argmax of what the chain keeps); else the candidates in
 * c[0, *n_out) and -1. */
static int32_t run_chain(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window, int n_window,
                         const int32_t *history, int n_history,
                         double xtc_uniform, void *scratch, int *n_out) {
    cand *c = scratch;
    *n_out = 0;
    edit_logits(logits, n_vocab, p, window, n_window, history, n_history, scratch);
    if (p->temperature <= 0.0f && !greedy_truncates(p)) return argmax(logits, n_vocab);
    int n = truncate_candidates(logits, n_vocab, p, xtc_uniform, c);
    if (p->temperature <= 0.0f) return c[0].id;   /* c stays sorted best first */
    *n_out = n;
    return -1;
}

/* run_chain on a sequence's history: its penalty window cut, XTC's uniform drawn (first,
 * when XTC is on). */
static int32_t run_chain_on_history(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history,
                                    int n_history, sampler_rng *rng, void *scratch, int *n_out) {
    int start = 0;
    int n_win = history ? sampler_penalty_window(p, n_history, &start) : 0;
    double xu = xtc_on(p) ? sampler_rng_uniform(rng) : 1.0;
    return run_chain(logits, n_vocab, p, history ? history + start : NULL, n_win, history, n_history, xu, scratch, n_out);
}

/* The draw over run_chain's n candidates; when none has weight (every logit -inf), the
 * first candidate, as argmax and the device sampler choose, never -1. */
static int32_t draw(const cand *c, int n, const llmi_sampling *p, double uniform) {
    int32_t tok = draw_candidate(c, n, 1.0 / p->temperature, uniform, -1);
    return tok >= 0 ? tok : c[0].id;
}

int32_t sampler_sample(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history, int n_history,
                       sampler_rng *rng, void *scratch) {
    int n;
    int32_t tok = run_chain_on_history(logits, n_vocab, p, history, n_history, rng, scratch, &n);
    return n ? draw(scratch, n, p, sampler_rng_uniform(rng)) : tok;
}

int32_t sampler_sample_uniform(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window,
                               int n_window, double uniform, void *scratch) {
    int n;
    int32_t tok = run_chain(logits, n_vocab, p, window, n_window, NULL, 0, 1.0, scratch, &n);
    return n ? draw(scratch, n, p, uniform) : tok;
}

int sampler_distribution(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window, int n_window,
                         double xtc_uniform, void *scratch, int32_t *ids, double *probs) {
    int n;
    int32_t tok = run_chain(logits, n_vocab, p, window, n_window, NULL, 0, xtc_uniform, scratch, &n);
    if (!n) {
        ids[0] = tok, probs[0] = 1.0;
        return 1;
    }
    const cand *c = scratch;
    double inv_t = 1.0 / p->temperature, sum = 0;
    for (int i = 0; i < n; i++) sum += (probs[i] = cand_weight(c, i, inv_t));
    for (int i = 0; i < n; i++) ids[i] = c[i].id, probs[i] /= sum;
    return n;
}

int32_t sampler_verify_draft(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history,
                             int n_history, int32_t draft, sampler_rng *rng, void *scratch, bool *accepted) {
    int n;
    int32_t best = run_chain_on_history(logits, n_vocab, p, history, n_history, rng, scratch, &n);
    if (!n) {
        *accepted = best == draft;
        return best;
    }
    const cand *c = scratch;
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

/* ---- Mirostat, in llama.cpp's float arithmetic (src/llama-sampler.cpp at 0c1e570:
 * llama_sampler_temp_impl, llama_sampler_softmax_impl, llama_sampler_mirostat_apply,
 * llama_sampler_mirostat_v2_apply; testdata/sampler/MIROSTAT-PROVENANCE.md) ---- */

float sampler_mirostat_mu0(const llmi_sampling *p) { return 2.0f * p->mirostat_tau; }

/* softmax over c[0, n) (sorted best first) into w, float: exp of the difference to the
 * best, summed in order, divided. */
static void mirostat_softmax(const cand *c, int n, float *w) {
    float sum = 0.0f;
    for (int i = 0; i < n; i++) sum += (w[i] = expf(c[i].logit - c[0].logit));
    for (int i = 0; i < n; i++) w[i] /= sum;
}

/* llama.cpp truncates k to int as x86 does: a value out of int's range (or NaN) becomes
 * INT_MIN, which max(k, 1) then makes 1.  Spelled out, since the C conversion is undefined. */
static int mirostat_int(float k) {
    return k > -2147483648.0f && k < 2147483648.0f ? (int)k : INT32_MIN;
}

int sampler_mirostat_distribution(float *logits, int n_vocab, const llmi_sampling *p, float mu, void *scratch,
                                  int32_t *ids, float *probs) {
    cand *c = scratch;
    apply_logit_bias(logits, n_vocab, p);
    if (p->temperature <= 0.0f) {
        /* the first highest logit stays, the rest become -inf */
        int32_t best = argmax(logits, n_vocab);
        for (int i = 0; i < n_vocab; i++)
            if (i != best) logits[i] = -INFINITY;
    } else {
        for (int i = 0; i < n_vocab; i++) logits[i] /= p->temperature;
    }
    for (int i = 0; i < n_vocab; i++) c[i] = (cand){i, logits[i]};
    sort_candidates(c, n_vocab, logits, n_vocab);
    mirostat_softmax(c, n_vocab, probs);
    int n = n_vocab;
    if (p->mirostat == 1) {
        /* s_hat: Zipf's exponent fitted over the m = 100 most likely tokens */
        const int m = 100;
        float sum_ti_bi = 0.0f, sum_ti_sq = 0.0f;
        for (int i = 0; i < m - 1 && i < n - 1; i++) {
            float t_i = logf((float)(i + 2) / (float)(i + 1));
            float b_i = logf(probs[i] / probs[i + 1]);
            sum_ti_bi += t_i * b_i;
            sum_ti_sq += t_i * t_i;
        }
        float s_hat = sum_ti_bi / sum_ti_sq, epsilon_hat = s_hat - 1;
        float k = powf((epsilon_hat * powf(2, mu)) / (1 - powf((float)n_vocab, -epsilon_hat)), 1 / s_hat);
        int ki = mirostat_int(k);
        if (ki < 1) ki = 1;
        if (ki < n) n = ki;
    } else {
        int keep = 0;
        while (keep < n && !(-log2f(probs[keep]) > mu)) keep++;
        n = keep > 0 ? keep : 1;
    }
    mirostat_softmax(c, n, probs);
    for (int i = 0; i < n; i++) ids[i] = c[i].id;
    return n;
}

void sampler_mirostat_update(const llmi_sampling *p, float *mu, float p_drawn) {
    float observed_surprise = -log2f(p_drawn);
    *mu = *mu - p->mirostat_eta * (observed_surprise - p->mirostat_tau);
}

int32_t sampler_sample_mirostat(float *logits, int n_vocab, const llmi_sampling *p, float *mu, sampler_rng *rng,
                                void *scratch) {
    /* ids and probabilities after the candidates: the scratch's typical/sort regions */
    int32_t *ids = (int32_t *)((cand *)scratch + n_vocab);
    float *probs = (float *)((cand *)scratch + 2 * (size_t)n_vocab);
    int n = sampler_mirostat_distribution(logits, n_vocab, p, *mu, scratch, ids, probs);
    double r = sampler_rng_uniform(rng), acc = 0;
    int pick = n - 1;
    for (int i = 0; i < n; i++) {
        acc += probs[i];
        if (r < acc) { pick = i; break; }
    }
    sampler_mirostat_update(p, mu, probs[pick]);
    return ids[pick];
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
