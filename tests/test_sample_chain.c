/* test_sample_chain.c — the device sampling algorithm (kernels/sample.cu), run on the
 * host, against sampler_sample_uniform.  The host reference below takes the steps the
 * kernel takes: the penalty in place once per distinct window token, the largest rank
 * key, min-p's count, sample_plan_make, the len best keys in rank order (the kernel's
 * radix select + bitonic sort; here a sort), top-p's normaliser summed in id order when
 * the plan says it is not summed over the sorted candidates (the kernel's parallel sum),
 * and sample_chain_pick, the chain the kernel runs from sample_chain.h.  It must pick the
 * token sampler.c picks for every logits row, window, parameter set and uniform.  (The
 * kernel's wide path, for rows whose kept prefix exceeds LLMI_SAMPLE_CAP, is covered by
 * the CUDA test cuda_sample; here such rows run the same chain over all candidates.) */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "engine/sampler.h"
#include "sample_chain.h"
#include "test.h"

static int cmp_key_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : (x > y ? -1 : 0);
}

/* The kernel's algorithm on the host: logits (V) are penalised in place, as the kernel does. */
static int32_t device_reference(float *x, int V, const llmi_cuda_sample_params *p, const int32_t *hist,
                                uint64_t *keys, double *w) {
    if (sample_penalties_on(p))
        for (int i = 0; i < p->hist_len; i++) {
            int32_t t = hist[p->hist_start + i];
            if (t < 0 || t >= V) continue;
            bool seen = false;
            for (int j = 0; j < i && !seen; j++) seen = hist[p->hist_start + j] == t;
            int count = 1;
            for (int j = i + 1; j < p->hist_len; j++) count += hist[p->hist_start + j] == t;
            if (!seen) x[t] = sample_penalise(x[t], p, count);
        }
    uint64_t best = 0;
    for (int i = 0; i < V; i++) {
        uint64_t k = sample_rank_key(x[i], i);
        if (k > best) best = k;
    }
    if (p->temperature <= 0.0f) return sample_greedy_id(best, x[0]);
    const float m = sample_key_logit(best);
    int cnt = 0;
    if (p->min_p > 0.0f)
        for (int i = 0; i < V; i++) cnt += x[i] >= m + p->log_min_p;
    sample_plan pl = sample_plan_make(p, V, cnt);
    for (int i = 0; i < V; i++) keys[i] = sample_rank_key(x[i], i);
    qsort(keys, (size_t)V, sizeof *keys, cmp_key_desc);
    double z = 0;
    if (p->top_p < 1.0f && !pl.z_sorted) {
        uint64_t ts = keys[pl.n_sel - 1];
        for (int i = 0; i < V; i++)
            if (sample_rank_key(x[i], i) >= ts) z += sample_w_prob(x[i], m);
    }
    return sample_chain_pick(keys, &pl, z, p, w);
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

TEST(sample_chain_matches_sampler) {
    unsigned long long seed = test_seed();
    printf("  sample_chain seed %llu\n", seed);
    uint64_t s = seed * 2654435761ull + 7;
    const int max_v = 5000, max_h = 300;
    float *logits = malloc(sizeof(float) * max_v), *a = malloc(sizeof(float) * max_v), *b = malloc(sizeof(float) * max_v);
    uint64_t *keys = malloc(sizeof(uint64_t) * max_v);
    double *w = malloc(sizeof(double) * max_v);
    void *scratch = malloc(sampler_scratch_bytes(max_v, 0));
    int32_t hist[300];
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
    const float top_ps[] = {0.0f, 1e-6f, 0.5f, 0.9f, 0.95f, 1.0f};
    const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.3f, 1.0f};
    int cases = 0, wrong = 0, wide = 0, unsorted_z = 0;
    for (int c = 0; c < 3000; c++) {
        const int V = 1 + (int)(xs(&s) % (uint64_t)(c % 10 == 0 ? max_v : 400));
        const int style = (int)(xs(&s) % 4);
        for (int i = 0; i < V; i++) {
            uint64_t r = xs(&s);
            if (style == 0) logits[i] = (float)((double)(r >> 11) * 0x1.0p-53 * 16.0 - 8.0);
            else if (style == 1) logits[i] = (float)(int)(r % 40) * 0.25f - 5.0f;   /* many exact ties */
            else if (style == 2) logits[i] = (r % 3 == 0) ? ((r & 8) ? -0.0f : 0.0f) : (float)(int)(r % 9) - 4.0f;
            else logits[i] = (r % 50 == 0) ? -INFINITY : (float)((double)(r >> 11) * 0x1.0p-53 * 3.0);
        }
        llmi_sampling sp = sampling_defaults();
        sp.temperature = temps[xs(&s) % 5];
        const int ks[] = {0, 1, 5, 40, V, V + 3, 2100, 3000};
        sp.top_k = ks[xs(&s) % 8];
        sp.top_p = top_ps[xs(&s) % 6];
        sp.min_p = min_ps[xs(&s) % 5];
        sp.repeat_penalty = (xs(&s) % 2) ? 1.3f : 1.0f;
        const float fps[] = {0.0f, 0.0f, 0.4f, -0.3f}, pps[] = {0.0f, 0.0f, 0.7f, 2.0f};
        sp.frequency_penalty = fps[xs(&s) % 4];
        sp.presence_penalty = pps[xs(&s) % 4];
        sp.repeat_last_n = -1;
        const int nh = (int)(xs(&s) % (uint64_t)max_h);
        for (int i = 0; i < nh; i++) hist[i] = (int32_t)(xs(&s) % (uint64_t)(V + 2)) - 1;   /* repeats, -1, V */
        const double u = (double)(xs(&s) >> 11) * 0x1.0p-53;
        llmi_cuda_sample_params p = {.uniform = u, .temperature = sp.temperature, .top_p = sp.top_p,
                                     .min_p = sp.min_p, .log_min_p = sp.min_p > 0 ? logf(sp.min_p) : 0.0f,
                                     .repeat_penalty = sp.repeat_penalty, .frequency_penalty = sp.frequency_penalty,
                                     .presence_penalty = sp.presence_penalty, .top_k = sp.top_k, .hist_start = 0,
                                     .hist_len = nh};
        memcpy(a, logits, sizeof(float) * V);
        memcpy(b, logits, sizeof(float) * V);
        int32_t want = sampler_sample_uniform(a, V, &sp, hist, nh, u, scratch);
        int32_t got = device_reference(b, V, &p, hist, keys, w);
        if (sp.temperature > 0) {
            int cnt = 0;
            float m = -INFINITY;
            for (int i = 0; i < V; i++) m = b[i] > m ? b[i] : m;
            for (int i = 0; i < V; i++) cnt += b[i] >= m + p.log_min_p;
            sample_plan pl = sample_plan_make(&p, V, cnt);
            wide += pl.wide;
            unsorted_z += p.top_p < 1.0f && !pl.z_sorted;
        }
        cases++;
        if (got != want) {
            if (wrong++ < 5)
                fprintf(stderr, "  case %d: V %d style %d T %g k %d p %g minp %g pen %g u %.17g: %d, sampler %d\n", c, V,
                        style, sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repeat_penalty, u, got, want);
        }
        CHECK(memcmp(a, b, sizeof(float) * V) == 0);   /* the same penalised logits */
    }
    printf("  %d cases (%d on the wide path, %d with an unsorted top-p normaliser): %d differ\n", cases, wide,
           unsorted_z, wrong);
    CHECK_MSG(wrong == 0, "%d of %d rows differ from sampler_sample_uniform", wrong, cases);
    CHECK(wide > 0 && unsorted_z > 0);
    free(logits); free(a); free(b); free(keys); free(w); free(scratch);
}

/* Issue 8 items 3: top_p == 0 keeps the top token; a uniform just under a cumulative
 * boundary (exact in double, not in float) picks the token before the boundary. */
TEST(sample_chain_edge_cases) {
    float x[4] = {1.0f, 3.0f, 3.0f, -2.0f};
    uint64_t keys[4];
    double w[4];
    llmi_cuda_sample_params p = {.uniform = 0.999, .temperature = 1.0f, .top_p = 0.0f, .min_p = 0.0f,
                                 .repeat_penalty = 1.0f, .top_k = 0};
    float c[4];
    memcpy(c, x, sizeof x);
    CHECK(device_reference(c, 4, &p, NULL, keys, w) == 1);   /* the top token, lowest id of the tie */
    /* two equal tokens: each holds half; u = 0.5 - 2^-30 is 0.5 in float and would pick id 2 */
    p.top_p = 1.0f;
    p.uniform = 0.5 - 0x1.0p-30;
    float two[2] = {2.0f, 2.0f};
    CHECK(device_reference(two, 2, &p, NULL, keys, w) == 0);
    p.uniform = 0.5;
    float two2[2] = {2.0f, 2.0f};
    CHECK(device_reference(two2, 2, &p, NULL, keys, w) == 1);
    /* keys order (logit desc, id asc), -0 and +0 tie by id, and map back exactly */
    CHECK(sample_rank_key(1.0f, 5) > sample_rank_key(1.0f, 6));
    CHECK(sample_rank_key(-0.0f, 3) > sample_rank_key(0.0f, 4));
    CHECK(sample_rank_key(-1.0f, 0) < sample_rank_key(-0.5f, 9));
    CHECK(sample_key_logit(sample_rank_key(-1.25f, 7)) == -1.25f && sample_key_id(sample_rank_key(-1.25f, 7)) == 7);
    CHECK(sample_key_logit(sample_rank_key(-INFINITY, 0)) == -INFINITY);
    CHECK(sample_rank_key(-INFINITY, 0x7fffffff) > 0);
    /* greedy: a NaN first logit keeps id 0 (sampler.c's argmax), elsewhere it loses */
    CHECK(sample_greedy_id(sample_rank_key(4.0f, 2), NAN) == 0);
    CHECK(sample_greedy_id(sample_rank_key(4.0f, 2), 1.0f) == 2);
}
