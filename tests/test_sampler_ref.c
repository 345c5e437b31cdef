/* test_sampler_ref.c — sampler.c's chain against llama.cpp's own samplers: for each case of
 * testdata/sampler/llamacpp.jsonl (scripts/make-sampler-refs.py: random logits, history and
 * parameters through common_sampler's default chain of llama_sampler_init_* calls), the
 * distribution the final draw chooses from must be the same: the same tokens kept, and
 * each probability within 2e-5 (llama.cpp sums in float, sampler.c in double).  In cases
 * whose "order_dependent" lists a stage, that stage's cut fell inside a group of equal
 * logits, where the two sorts may keep different ids of the same logit: there the kept
 * probabilities are compared as sorted lists. */
#include <cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "test.h"

#ifndef TESTDATA_DIR
#define TESTDATA_DIR "testdata"
#endif

static double num(const cJSON *v) {
    if (cJSON_IsString(v) && strcmp(v->valuestring, "-inf") == 0) return -INFINITY;
    if (cJSON_IsString(v) && strcmp(v->valuestring, "inf") == 0) return INFINITY;
    return v->valuedouble;
}

static double param(const cJSON *p, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, k);
    return v ? num(v) : NAN;
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Drops zero probabilities (llama.cpp keeps -inf candidates in its array). */
static int nonzero(int32_t *ids, double *p, int n) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) ids[m] = ids[i], p[m++] = p[i];
    return m;
}

TEST(sampler_matches_llamacpp_chain) {
    const char *td = getenv("TESTDATA") ? getenv("TESTDATA") : TESTDATA_DIR;
    char path[1024];
    snprintf(path, sizeof path, "%s/sampler/llamacpp.jsonl", td);
    char *all = test_read_text(path);
    CHECK_MSG(all != NULL, "cannot read %s", path);
    if (!all) return;
    static const char *stages[] = {"logit_bias", "penalties", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temp"};
    enum { N_STAGES = sizeof stages / sizeof stages[0] };
    int cases = 0, wrong = 0, tie_cases = 0, stage_hits[N_STAGES] = {0};
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = cJSON_Parse(line);
        CHECK_MSG(c != NULL, "%s: a line is not JSON", path);
        if (!c) continue;
        const cJSON *pj = cJSON_GetObjectItem(c, "params"), *lj = cJSON_GetObjectItem(c, "logits"),
                    *hj = cJSON_GetObjectItem(c, "history"), *ij = cJSON_GetObjectItem(c, "ids"),
                    *rj = cJSON_GetObjectItem(c, "probs");
        const char *name = cJSON_GetObjectItem(c, "case")->valuestring;
        /* the stages whose cut fell inside a group of equal logits (ids there depend on sort order) */
        bool ties = cJSON_GetArraySize(cJSON_GetObjectItem(c, "order_dependent")) > 0;
        int V = cJSON_GetObjectItem(c, "n_vocab")->valueint, nh = cJSON_GetArraySize(hj), nr = cJSON_GetArraySize(ij);
        float *logits = malloc(sizeof(float) * (size_t)V);
        int32_t *hist = malloc(sizeof(int32_t) * (size_t)(nh + 1)), *ids = malloc(sizeof(int32_t) * (size_t)V),
                *ref_ids = malloc(sizeof(int32_t) * (size_t)(nr + 1));
        double *probs = malloc(sizeof(double) * (size_t)V), *ref_p = malloc(sizeof(double) * (size_t)(nr + 1));
        void *scratch = malloc(sampler_scratch_bytes(V));
        int nb = cJSON_GetArraySize(cJSON_GetObjectItem(pj, "logit_bias"));
        llmi_logit_bias *bias = malloc(sizeof *bias * (size_t)(nb + 1));
        for (int i = 0; i < V; i++) logits[i] = (float)num(cJSON_GetArrayItem(lj, i));
        for (int i = 0; i < nh; i++) hist[i] = cJSON_GetArrayItem(hj, i)->valueint;
        for (int i = 0; i < nr; i++) ref_ids[i] = cJSON_GetArrayItem(ij, i)->valueint, ref_p[i] = num(cJSON_GetArrayItem(rj, i));
        for (int i = 0; i < nb; i++) {
            const cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(pj, "logit_bias"), i);
            bias[i] = (llmi_logit_bias){cJSON_GetArrayItem(e, 0)->valueint, (float)num(cJSON_GetArrayItem(e, 1))};
        }
        llmi_sampling sp = {
            .temperature = (float)param(pj, "temperature"), .top_k = (int)param(pj, "top_k"),
            .top_p = (float)param(pj, "top_p"), .min_p = (float)param(pj, "min_p"),
            .typical_p = (float)param(pj, "typical_p"), .top_n_sigma = (float)param(pj, "top_n_sigma"),
            .xtc_probability = (float)param(pj, "xtc_probability"), .xtc_threshold = (float)param(pj, "xtc_threshold"),
            .repeat_penalty = (float)param(pj, "repeat_penalty"), .frequency_penalty = (float)param(pj, "frequency_penalty"),
            .presence_penalty = (float)param(pj, "presence_penalty"), .repeat_last_n = (int)param(pj, "penalty_last_n"),
            .logit_bias = bias, .n_logit_bias = nb};
        /* llama_sampler_init_penalties clamps a negative window to 0 (off); llmi's -1 means the
         * whole history (tests/test_engine.c), so those cases run with llama.cpp's meaning */
        if (sp.repeat_last_n < 0) sp.repeat_last_n = 0;
        /* the stages that changed something in llama.cpp's run */
        const cJSON *eff;
        cJSON_ArrayForEach(eff, cJSON_GetObjectItem(c, "effective"))
            for (int k = 0; k < N_STAGES; k++) stage_hits[k] += strcmp(eff->valuestring, stages[k]) == 0;
        int start = 0, nw = sampler_penalty_window(&sp, nh, &start);
        /* XTC's draw: the reference runs it at probability 0 or 1 only, where any draw in
         * [0, 1) decides the same way */
        int n = sampler_distribution(logits, V, &sp, hist + start, nw, 0.5, scratch, ids, probs);
        n = nonzero(ids, probs, n);
        nr = nonzero(ref_ids, ref_p, nr);
        char why[256] = "";
        if (n != nr) {
            snprintf(why, sizeof why, "llmi keeps %d tokens, llama.cpp %d", n, nr);
        } else if (ties) {
            qsort(probs, (size_t)n, sizeof *probs, cmp_desc);
            qsort(ref_p, (size_t)n, sizeof *ref_p, cmp_desc);
            for (int i = 0; i < n && !*why; i++)
                if (fabs(probs[i] - ref_p[i]) > 2e-5)
                    snprintf(why, sizeof why, "probability %d: %.7f, llama.cpp %.7f", i, probs[i], ref_p[i]);
        } else {
            for (int i = 0; i < nr && !*why; i++) {
                int at = -1;
                for (int k = 0; k < n && at < 0; k++)
                    if (ids[k] == ref_ids[i]) at = k;
                if (at < 0) snprintf(why, sizeof why, "llama.cpp keeps token %d, llmi does not", ref_ids[i]);
                else if (fabs(probs[at] - ref_p[i]) > 2e-5)
                    snprintf(why, sizeof why, "token %d: p %.7f, llama.cpp %.7f", ref_ids[i], probs[at], ref_p[i]);
            }
        }
        cases++;
        tie_cases += ties;
        if (*why) {
            wrong++;
            CHECK_MSG(0, "case %s (V %d): %s", name, V, why);
        }
        free(logits), free(hist), free(ids), free(ref_ids), free(probs), free(ref_p), free(scratch), free(bias);
        cJSON_Delete(c);
    }
    free(all);
    CHECK_MSG(cases >= 100, "only %d cases in %s", cases, path);
    printf("  %d cases (%d with a cut inside equal logits): %d differ from llama.cpp; cases where a stage changed "
           "something:", cases, tie_cases, wrong);
    for (int k = 0; k < N_STAGES; k++) {
        printf(" %s %d", stages[k], stage_hits[k]);
        CHECK_MSG(stage_hits[k] >= 20, "%s changed something in only %d cases", stages[k], stage_hits[k]);
    }
    printf("\n");
}
