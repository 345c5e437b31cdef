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

#include "engine/dry.h"
#include "engine/sampler.h"
#include "test.h"
#include "tok/tokenizer.h"

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
    char path[1024];
    char *all = test_read_text(test_data_path(path, sizeof path, "sampler/llamacpp.jsonl"));
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
        void *scratch = malloc(sampler_scratch_bytes(V, 0));
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

/* ---- DRY against llama.cpp's llama_sampler_init_dry: testdata/sampler/dry*.json* -------- */

/* A tail list of head h in our table, as a JSON-comparable set check: every reference tail
 * is ours and the counts are equal. */
static bool same_tails(const dry_breakers *b, int32_t h, const cJSON *ref_tails) {
    int ours = b ? b->first[h + 1] - b->first[h] : 0;
    if (ours != cJSON_GetArraySize(ref_tails)) return false;
    const cJSON *t;
    cJSON_ArrayForEach(t, ref_tails) {
        int n = cJSON_GetArraySize(t);
        bool found = false;
        for (int32_t j = b->first[h]; j < b->first[h + 1] && !found; j++) {
            if (b->tail_at[j + 1] - b->tail_at[j] != n) continue;
            found = true;
            for (int k = 0; k < n && found; k++) found = b->tail_ids[b->tail_at[j] + k] == cJSON_GetArrayItem(t, k)->valueint;
        }
        if (!found) return false;
    }
    return true;
}

/* The breakers of a JSON list as C strings (borrowed from the JSON). */
static int json_breakers(const cJSON *list, const char **out) {
    int n = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, list) if (n < DRY_MAX_BREAKERS) out[n++] = s->valuestring;
    return n;
}

TEST(dry_matches_llamacpp) {
    char path[1024];
    llmi_status st = {0};
    tokenizer *tk = test_smollm2_tokenizer(&st);
    CHECK_MSG(tk != NULL, "%s", st.msg);
    char *tables_text = test_read_text(test_data_path(path, sizeof path, "sampler/dry-breakers.json"));
    char *cases_text = test_read_text(test_data_path(path, sizeof path, "sampler/dry.jsonl"));
    cJSON *tables = tables_text ? cJSON_Parse(tables_text) : NULL;
    CHECK_MSG(tables && cases_text, "cannot read testdata/sampler/dry-breakers.json or dry.jsonl");
    if (!tk || !tables || !cases_text) goto done;
    const int V = tok_n_vocab(tk);
    /* the breaker tables: ours from our tokenizer, llama.cpp's as the script recorded them */
    enum { MAX_LISTS = 32 };
    char *keys[MAX_LISTS];
    dry_breakers *built[MAX_LISTS];
    int n_lists = 0, heads_checked = 0, lists_differ = 0;
    const cJSON *tb;
    cJSON_ArrayForEach(tb, tables) {
        if (n_lists == MAX_LISTS) break;
        const char *br[DRY_MAX_BREAKERS];
        const cJSON *list = cJSON_GetObjectItem(tb, "breakers");
        int n = json_breakers(list, br);
        dry_breakers *b = NULL;
        CHECK_MSG(n == 0 || dry_breakers_build(tk, br, n, &b, &st) == 0, "%s", st.msg);
        keys[n_lists] = cJSON_PrintUnformatted(list);
        built[n_lists++] = b;
        const cJSON *heads = cJSON_GetObjectItem(tb, "heads");
        int ref_heads = cJSON_GetArraySize(heads), our_heads = 0;
        for (int32_t h = 0; b && h < V; h++) our_heads += b->first[h + 1] > b->first[h];
        CHECK_MSG(our_heads == ref_heads, "breakers %s: %d heads, llama.cpp %d", keys[n_lists - 1], our_heads, ref_heads);
        lists_differ += our_heads != ref_heads;
        const cJSON *hd;
        cJSON_ArrayForEach(hd, heads) {
            int32_t h = atoi(hd->string);
            heads_checked++;
            if (h < 0 || h >= V || !same_tails(b, h, hd)) {
                CHECK_MSG(0, "breakers %s: head %d's tails differ from llama.cpp's", keys[n_lists - 1], h);
                lists_differ += our_heads == ref_heads;
                break;
            }
        }
    }
    float *logits = malloc(sizeof(float) * (size_t)V);
    int cases = 0, with_penalties = 0, wrong = 0;
    char *save = NULL;
    for (char *line = strtok_r(cases_text, "\n", &save); line && logits; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = cJSON_Parse(line);
        if (!c) continue;
        const cJSON *pj = cJSON_GetObjectItem(c, "params"), *hj = cJSON_GetObjectItem(c, "history"),
                    *rj = cJSON_GetObjectItem(c, "penalties");
        char *key = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "breakers"));
        const dry_breakers *b = NULL;
        bool known = false;
        for (int i = 0; i < n_lists && !known; i++)
            if (!strcmp(keys[i], key)) b = built[i], known = true;
        CHECK_MSG(known, "case %s: breakers %s not in dry-breakers.json", cJSON_GetObjectItem(c, "case")->valuestring, key);
        free(key);
        int nh = cJSON_GetArraySize(hj);
        int32_t *hist = malloc(sizeof(int32_t) * (size_t)(nh + 1));
        for (int i = 0; i < nh; i++) hist[i] = cJSON_GetArrayItem(hj, i)->valueint;
        const dry_params dp = {(float)param(pj, "dry_multiplier"), (float)param(pj, "dry_base"),
                               (int)param(pj, "dry_allowed_length")};
        int last_n = (int)param(pj, "dry_penalty_last_n");
        int n = last_n <= 0 ? 0 : (last_n < nh ? last_n : nh);   /* llama.cpp: last_n 0 (or below, clamped) is off */
        int *scratch = malloc(sizeof(int) * dry_scratch_ints(V, n));
        for (int i = 0; i < V; i++) logits[i] = 0.0f;
        dry_apply(logits, V, &dp, b, hist + nh - n, n, scratch);
        char why[256] = "";
        int nz = 0;
        for (int i = 0; i < V; i++) nz += logits[i] != 0.0f;
        if (nz != cJSON_GetArraySize(rj)) snprintf(why, sizeof why, "%d tokens penalised, llama.cpp %d", nz, cJSON_GetArraySize(rj));
        const cJSON *e;
        cJSON_ArrayForEach(e, rj) {
            if (*why) break;
            int32_t id = cJSON_GetArrayItem(e, 0)->valueint;
            double want = num(cJSON_GetArrayItem(e, 1));
            if (id < 0 || id >= V || !(logits[id] == want || fabs(logits[id] - want) <= 1e-6 * fmax(1.0, fabs(want))))
                snprintf(why, sizeof why, "token %d: %.9g, llama.cpp %.9g", id, id >= 0 && id < V ? logits[id] : NAN, want);
        }
        cases++;
        with_penalties += cJSON_GetArraySize(rj) > 0;
        if (*why) {
            wrong++;
            CHECK_MSG(0, "DRY case %s: %s", cJSON_GetObjectItem(c, "case")->valuestring, why);
        }
        free(hist);
        free(scratch);
        cJSON_Delete(c);
    }
    free(logits);
    CHECK_MSG(cases >= 100 && with_penalties >= 50, "only %d cases (%d with penalties)", cases, with_penalties);
    printf("  %d breaker lists (%d heads): %d differ from llama.cpp's tables; %d cases (%d with penalties): %d differ\n",
           n_lists, heads_checked, lists_differ, cases, with_penalties, wrong);
    for (int i = 0; i < n_lists; i++) free(keys[i]), dry_breakers_free(built[i]);
done:
    cJSON_Delete(tables);
    free(tables_text);
    free(cases_text);
    tok_free(tk);
}

/* ---- Mirostat against llama.cpp's llama_sampler_init_mirostat(_v2): testdata/sampler/mirostat.jsonl
 * (scripts/make-mirostat-refs.py, MIROSTAT-PROVENANCE.md).  Each case is one sampler's
 * trajectory: step by step, the candidates llama.cpp's chain (temperature, mirostat) left
 * and the token its own generator drew.  llmi replays it from mu = 2 tau: at every step the
 * same candidates with the same probabilities (the same float arithmetic: equal, or within
 * 1e-6 where the sums' order of equal logits may differ), then mu moves by the drawn token's
 * surprise, so a wrong update shows in every later step's cut.  Candidates of equal logit
 * may come in either order (llama.cpp's sort is not stable), or be cut between. */
TEST(mirostat_matches_llamacpp) {
    char path[1024];
    char *all = test_read_text(test_data_path(path, sizeof path, "sampler/mirostat.jsonl"));
    CHECK_MSG(all != NULL, "cannot read %s", path);
    if (!all) return;
    int cases = 0, steps = 0, wrong = 0, tie_steps = 0, by_version[3] = {0}, one_kept = 0, all_kept = 0;
    double max_dp = 0;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *c = cJSON_Parse(line);
        CHECK_MSG(c != NULL, "%s: a line is not JSON", path);
        if (!c) continue;
        int V = (int)param(c, "n_vocab"), version = (int)param(c, "version"), id = (int)param(c, "case");
        llmi_sampling sp = sampling_defaults();
        sp.mirostat = version;
        sp.mirostat_tau = (float)param(c, "tau");
        sp.mirostat_eta = (float)param(c, "eta");
        sp.temperature = (float)param(c, "temp");
        float mu = sampler_mirostat_mu0(&sp), *logits = malloc(sizeof(float) * (size_t)V),
              *raw = malloc(sizeof(float) * (size_t)V), *probs = malloc(sizeof(float) * (size_t)V);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)V);
        void *scratch = malloc(sampler_scratch_bytes(V, 0));
        bool bad = false;
        const cJSON *st;
        int k_step = 0;
        cJSON_ArrayForEach(st, cJSON_GetObjectItem(c, "steps")) {
            const cJSON *lj = cJSON_GetObjectItem(st, "logits"), *kj = cJSON_GetObjectItem(st, "kept"),
                        *pj = cJSON_GetObjectItem(st, "p");
            int32_t sel = cJSON_GetObjectItem(st, "selected")->valueint;
            for (int i = 0; i < V; i++) raw[i] = logits[i] = (float)num(cJSON_GetArrayItem(lj, i));
            int n = sampler_mirostat_distribution(logits, V, &sp, mu, scratch, ids, probs), nr = cJSON_GetArraySize(kj);
            char why[256] = "";
            bool tie = false;
            if (n != nr) snprintf(why, sizeof why, "llmi keeps %d tokens, llama.cpp %d", n, nr);
            for (int i = 0; i < n && !*why; i++) {
                int32_t rid = cJSON_GetArrayItem(kj, i)->valueint;
                double rp = num(cJSON_GetArrayItem(pj, i)), dp = fabs(probs[i] - rp);
                if (ids[i] != rid) {
                    if (raw[ids[i]] != raw[rid]) snprintf(why, sizeof why, "candidate %d: token %d, llama.cpp %d", i, ids[i], rid);
                    tie = true;
                }
                if (dp > 1e-6) snprintf(why, sizeof why, "candidate %d: p %.9g, llama.cpp %.9g", i, probs[i], rp);
                if (dp > max_dp) max_dp = dp;
            }
            int at = -1;
            for (int i = 0; i < n && at < 0; i++) {
                if (ids[i] == sel) at = i;
                else if (tie && raw[ids[i]] == raw[sel]) at = i;   /* its equal, where ids were cut or swapped */
            }
            if (!*why && at < 0) snprintf(why, sizeof why, "llama.cpp drew token %d, which llmi does not keep", sel);
            if (*why) {
                CHECK_MSG(0, "case %d (mirostat %d, V %d) step %d: %s", id, version, V, k_step, why);
                bad = true;
                break;
            }
            one_kept += n == 1;
            all_kept += n == V;
            tie_steps += tie;
            sampler_mirostat_update(&sp, &mu, probs[at]);
            steps++;
            k_step++;
        }
        cases++;
        wrong += bad;
        by_version[version == 2 ? 2 : 1]++;
        free(logits), free(raw), free(probs), free(ids), free(scratch);
        cJSON_Delete(c);
    }
    free(all);
    printf("  %d cases (mirostat 1: %d, 2: %d), %d steps (%d with ties swapped or cut, %d keeping one token, %d the "
           "whole vocabulary): %d differ from llama.cpp; largest probability difference %.3g\n",
           cases, by_version[1], by_version[2], steps, tie_steps, one_kept, all_kept, wrong, max_dp);
    CHECK_MSG(by_version[1] >= 20 && by_version[2] >= 20, "too few cases of a version (%d, %d)", by_version[1],
              by_version[2]);
}
