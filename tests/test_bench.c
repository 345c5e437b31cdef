/* test_bench.c — bench/profile arithmetic and building blocks: statistics against
 * numpy's definitions, Poisson arrivals, the four report formats and reading them back,
 * the compact md view, --compare's ratios and noise flags, SLO accounting, depth (the
 * KV holds the context before the timed part), synthetic weights, and perplexity's
 * window/scoring rule against a brute-force re-evaluation. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "cli/bench_compare.h"
#include "cli/bench_view.h"
#include "cli/workload.h"
#include "engine/engine.h"
#include "metrics/slo.h"
#include "model/model.h"
#include "model/model_dummy.h"
#include "metrics/perplexity.h"
#include "cli/report.h"
#include "metrics/stats.h"
#include "test.h"

#ifndef TESTDATA_DIR
#define TESTDATA_DIR "testdata"
#endif

static bool near(double a, double b, double rel) { return fabs(a - b) <= rel * fmax(1e-12, fmax(fabs(a), fabs(b))); }

TEST(bench_stats_mean_sd) {
    const double x[8] = {2, 4, 4, 4, 5, 5, 7, 9};
    CHECK(stats_mean(x, 8) == 5.0);
    CHECK(near(stats_sd(x, 8), sqrt(32.0 / 7.0), 1e-12));   /* sample sd, n - 1 */
    CHECK(stats_sd(x, 1) == 0 && stats_mean(x, 0) == 0);
    /* Shifting data leaves sd unchanged, scaling scales it. */
    stats_rng r;
    stats_rng_seed(&r, test_seed());
    double y[100], z[100], w[100];
    for (int i = 0; i < 100; i++) {
        y[i] = stats_rng_uniform(&r) * 10 - 3;
        z[i] = y[i] + 1000;
        w[i] = y[i] * -4;
    }
    CHECK(near(stats_sd(y, 100), stats_sd(z, 100), 1e-9));
    CHECK(near(4 * stats_sd(y, 100), stats_sd(w, 100), 1e-12));
    CHECK(near(stats_mean(z, 100), stats_mean(y, 100) + 1000, 1e-12));
}

TEST(bench_stats_percentiles_numpy) {
    /* Values from numpy.percentile (linear interpolation), computed by hand. */
    const double a[5] = {50, 15, 40, 20, 35};   /* unsorted on purpose */
    CHECK(stats_percentile(a, 5, 50) == 35);
    CHECK(near(stats_percentile(a, 5, 90), 46.0, 1e-12));
    CHECK(near(stats_percentile(a, 5, 99), 49.6, 1e-12));
    CHECK(stats_percentile(a, 5, 25) == 20);
    CHECK(stats_percentile(a, 5, 0) == 15 && stats_percentile(a, 5, 100) == 50);
    double b[10];
    for (int i = 0; i < 10; i++) b[i] = 10 - i;
    CHECK(near(stats_percentile(b, 10, 50), 5.5, 1e-12));
    CHECK(near(stats_percentile(b, 10, 90), 9.1, 1e-12));
    CHECK(near(stats_percentile(b, 10, 99), 9.91, 1e-12));
    const double one = 7;
    CHECK(stats_percentile(&one, 1, 99) == 7);
    /* Random data: the p-th percentile has at most ceil(p/100*(n-1))... count below it. */
    stats_rng r;
    stats_rng_seed(&r, test_seed());
    double c[257];
    for (int i = 0; i < 257; i++) c[i] = stats_rng_uniform(&r);
    double p90 = stats_percentile(c, 257, 90);
    int below = 0;
    for (int i = 0; i < 257; i++) below += c[i] < p90;
    CHECK_MSG(below == 230 || below == 231, "below=%d", below);   /* rank 0.9*256 = 230.4 */
}

TEST(bench_poisson_rate) {
    stats_rng r;
    unsigned long long seed = test_seed();
    stats_rng_seed(&r, seed);
    const int n = 40000;
    const double rate = 4.0;
    double *t = malloc(n * sizeof *t), *gap = malloc(n * sizeof *gap);
    stats_poisson_arrivals(&r, rate, n, t);
    for (int i = 0; i < n; i++) gap[i] = i ? t[i] - t[i - 1] : t[0];
    bool mono = true;
    for (int i = 1; i < n; i++) mono &= t[i] >= t[i - 1];
    CHECK(mono);
    double mean = stats_mean(gap, n), sd = stats_sd(gap, n);
    /* Exponential gaps: mean 1/rate, sd 1/rate; 5 standard errors of slack. */
    CHECK_MSG(fabs(mean - 0.25) < 5 * 0.25 / sqrt(n), "mean gap %g (seed %llu)", mean, seed);
    CHECK_MSG(fabs(sd - 0.25) < 0.02 * 0.25 * 5, "sd gap %g", sd);
    CHECK_MSG(fabs(n / t[n - 1] - rate) < 0.05 * rate, "rate %g", n / t[n - 1]);
    /* Same seed, same arrivals; no rate, all at 0. */
    stats_rng r2;
    stats_rng_seed(&r2, seed);
    double t2[10];
    stats_poisson_arrivals(&r2, rate, 10, t2);
    CHECK(!memcmp(t, t2, sizeof t2));
    stats_poisson_arrivals(&r2, 0, 10, t2);
    CHECK(t2[0] == 0 && t2[9] == 0);
    free(t);
    free(gap);
}

TEST(bench_rng_range) {
    stats_rng r;
    stats_rng_seed(&r, test_seed());
    int hist[5] = {0};
    for (int i = 0; i < 50000; i++) {
        int64_t v = stats_rng_range(&r, 3, 7);
        if (v < 3 || v > 7) { CHECK(false); break; }
        hist[v - 3]++;
    }
    for (int i = 0; i < 5; i++) CHECK_MSG(abs(hist[i] - 10000) < 500, "bucket %d: %d", i, hist[i]);
    CHECK(stats_rng_range(&r, 9, 9) == 9);
}

static char *render(const report *r, report_format f) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    report_write(r, f, m);
    fclose(m);
    return buf;
}

TEST(bench_report_formats) {
    report r;
    report_init(&r);
    report_row(&r);
    report_str(&r, "model", "a,b \"q\"");
    report_int(&r, "n_prompt", 512);
    report_num(&r, "tps_mean", 1234.56789, 2);
    report_num(&r, "tps_sd", 0.5, 2);
    report_num(&r, "missing", NAN, 2);
    report_raw_json(&r, "series", "[[0,0.5],[1,0.75]]");
    report_row(&r);
    report_str(&r, "model", "m2");
    report_int(&r, "n_prompt", 7);
    report_num(&r, "tps_mean", 1e-3, 2);
    report_num(&r, "tps_sd", 0, 2);
    CHECK(r.n_rows == 2 && r.n_cols == 6);
    CHECK(report_get(&r, 1, "n_prompt") == 7 && isnan(report_get(&r, 1, "missing")));

    char *js = render(&r, REPORT_JSON);
    cJSON *a = cJSON_Parse(js);
    CHECK(cJSON_IsArray(a) && cJSON_GetArraySize(a) == 2);
    cJSON *o = cJSON_GetArrayItem(a, 0);
    CHECK(!strcmp(cJSON_GetObjectItem(o, "model")->valuestring, "a,b \"q\""));
    CHECK(cJSON_GetObjectItem(o, "tps_mean")->valuedouble == 1234.56789);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(o, "missing")));
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(o, "series")) == 2);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 1), "series")));
    cJSON_Delete(a);
    free(js);

    char *jl = render(&r, REPORT_JSONL);
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(jl, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *x = cJSON_Parse(l);
        CHECK(cJSON_IsObject(x));
        cJSON_Delete(x);
        lines++;
    }
    CHECK(lines == 2);
    free(jl);

    char *csv = render(&r, REPORT_CSV);
    CHECK_MSG(!strncmp(csv, "model,n_prompt,tps_mean,tps_sd,missing\n", 39), "%s", csv);
    CHECK_MSG(strstr(csv, "\"a,b \"\"q\"\"\",512,1234.56789,0.5,\n") != NULL, "%s", csv);
    CHECK(strstr(csv, "m2,7,0.001,0,\n") != NULL);
    CHECK(strstr(csv, "series") == NULL);   /* raw JSON is json-only */
    free(csv);

    char *md = render(&r, REPORT_MD);
    /* padded to the widest cell, numbers right-aligned */
    CHECK_MSG(strstr(md, "| model   | n_prompt |            tps | missing |") != NULL, "%s", md);
    CHECK_MSG(strstr(md, "| ------- | -------: | -------------: | ------: |") != NULL, "%s", md);
    CHECK_MSG(strstr(md, "| a,b \"q\" |      512 | 1234.57 ± 0.50 |         |") != NULL, "%s", md);
    CHECK_MSG(strstr(md, "| m2      |        7 |    0.00 ± 0.00 |         |") != NULL, "%s", md);
    /* every line has the same number of cells */
    int pipes = -1;
    bool same = true;
    for (char *save = NULL, *l = strtok_r(md, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int n = 0;
        for (char *p = l; *p; p++) n += *p == '|';
        if (pipes < 0) pipes = n;
        same &= n == pipes;
    }
    CHECK(same && pipes == 5);
    free(md);
    report_free(&r);

    llmi_status st = {0};
    report_format f;
    CHECK(report_format_parse("jsonl", &f, &st) == 0 && f == REPORT_JSONL);
    CHECK(report_format_parse("xml", &f, &st) == LLMI_E_USAGE && strstr(st.msg, "-o xml"));
}

static double params_of(const llmi_config *c) {
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    /* a MoE layer: every expert's three matrices and the router */
    double mlp = 3.0 * c->dim * c->ffn_dim * config_experts(c) + (double)c->n_experts * c->dim;
    double layer = c->dim * qd * 2 + c->dim * kvd * 2 + mlp + (c->post_norms ? 4.0 : 2.0) * c->dim +
                   (c->qkv_bias ? qd + 2 * kvd : 0) + (c->qk_norm ? 2.0 * c->head_dim : 0);
    return layer * c->n_layers + (double)c->n_vocab * c->dim * (c->tie_embeddings ? 1 : 2) + c->dim;
}

TEST(bench_dummy_presets) {
    llmi_status st = {0};
    llmi_config c;
    CHECK(model_dummy_config("llama-3-8b", &c, &st) == 0);
    CHECK(params_of(&c) == 8030261248.0);            /* Meta-Llama-3-8B: 8.03B parameters */
    CHECK(model_dummy_config("llama-2-7b", &c, &st) == 0);
    CHECK(params_of(&c) == 6738415616.0);            /* Llama-2-7b: 6.74B */
    CHECK(model_dummy_config("mistral-7b", &c, &st) == 0);
    CHECK(params_of(&c) == 7241732096.0);            /* Mistral-7B-v0.1: 7.24B */
    CHECK(model_dummy_config("qwen2.5-7b", &c, &st) == 0);
    CHECK(params_of(&c) == 7615616512.0);            /* Qwen2.5-7B: 7.62B */
    CHECK(model_dummy_config("smollm2-135m", &c, &st) == 0);
    CHECK(params_of(&c) == 134515008.0);             /* SmolLM2-135M: 134.5M */
    CHECK(c.tie_embeddings && c.n_kv_heads == 3);
    /* Gemma2ForCausalLM's own count (transformers 5.24 on the meta device): 2.61B and 9.24B;
     * every other layer slides over 4096 keys, scores capped at 50 and logits at 30 */
    CHECK(model_dummy_config("gemma-2-2b", &c, &st) == 0);
    CHECK(params_of(&c) == 2614341888.0);
    CHECK(c.sliding_window == 4096 && c.layer_sliding[0] && !c.layer_sliding[1] && c.layer_sliding[24] &&
          !c.layer_sliding[25] && c.attn_softcap == 50.0f && c.final_softcap == 30.0f && c.embed_scale == 48.0f);
    CHECK(model_dummy_config("gemma-2-9b", &c, &st) == 0);
    CHECK(params_of(&c) == 9241705984.0);
    /* Phi3ForCausalLM's count (the same way): 3.82B, 14.66B and 3.84B; the mini's window on
     * every layer; Phi-4-mini's partial RoPE */
    CHECK(model_dummy_config("phi-3-mini", &c, &st) == 0);
    CHECK(params_of(&c) == 3821079552.0 && config_layer_window(&c, 0) == 2047 && config_layer_window(&c, 31) == 2047);
    CHECK(model_dummy_config("phi-4", &c, &st) == 0);
    CHECK(params_of(&c) == 14659507200.0 && config_layer_window(&c, 0) == 0);
    CHECK(model_dummy_config("phi-4-mini", &c, &st) == 0);
    CHECK(params_of(&c) == 3836021760.0 && c.rope_dim == 96 && c.head_dim == 128 && c.tie_embeddings);
    /* SmolLM3ForCausalLM's count (the same way): 3.08B; no RoPE on layers 3, 7, ..., 35 */
    CHECK(model_dummy_config("smollm3-3b", &c, &st) == 0);
    CHECK(params_of(&c) == 3075098624.0 && !c.layer_nope[0] && !c.layer_nope[2] && c.layer_nope[3] &&
          c.layer_nope[35] && !c.layer_nope[34] && config_layer_rope_dim(&c, 3) == 0 && config_layer_rope_dim(&c, 4) == 128);
    /* GraniteForCausalLM's count (the same way): 2.53B and 8.17B; the four multipliers */
    CHECK(model_dummy_config("granite-3.3-2b", &c, &st) == 0);
    CHECK(params_of(&c) == 2533539840.0 && !strcmp(c.arch_name, "granite") && c.attn_scale == 0.015625f &&
          c.logit_scale == 8.0f);
    CHECK(model_dummy_config("granite-3.3-8b", &c, &st) == 0);
    CHECK(params_of(&c) == 8170864640.0 && c.embed_scale == 12.0f && c.attn_scale == 0.0078125f &&
          c.residual_scale == 0.22f && c.logit_scale == 16.0f && c.tie_embeddings);
    /* Qwen3MoeForCausalLM's and MixtralForCausalLM's (the same way): 30.53B and 46.70B; then
     * GraniteMoeForCausalLM's: 3.30B */
    CHECK(model_dummy_config("qwen3-30b-a3b", &c, &st) == 0);
    CHECK_MSG(params_of(&c) == 30532122624.0, "qwen3-30b-a3b: %.0f", params_of(&c));
    CHECK(model_dummy_config("mixtral-8x7b", &c, &st) == 0);
    CHECK_MSG(params_of(&c) == 46702792704.0, "mixtral-8x7b: %.0f", params_of(&c));
    CHECK(model_dummy_config("granite-3.1-3b-a800m", &c, &st) == 0);
    CHECK(params_of(&c) == 3298793472.0 && c.n_experts == 40 && c.n_experts_used == 8 && !strcmp(c.arch_name, "granitemoe"));
    llmi_status_clear(&st);
    CHECK(model_dummy_config("llama-9b", &c, &st) == LLMI_E_USAGE);
    CHECK(strstr(st.msg, "unknown preset") && strstr(st.msg, "llama-9b"));
}

TEST(bench_dummy_config_json) {
    llmi_status st = {0};
    llmi_config c;
    CHECK(model_dummy_config(TESTDATA_DIR "/bench/tiny-llama.json", &c, &st) == 0);
    CHECK(c.n_vocab == 512 && c.dim == 64 && c.n_layers == 2 && c.n_heads == 4 && c.n_kv_heads == 2 &&
          c.head_dim == 16 && c.ffn_dim == 128 && !c.tie_embeddings && c.arch == LLMI_ARCH_LLAMA);
    CHECK(!strcmp(c.name, "tiny-llama-test"));
    CHECK(model_dummy_config(TESTDATA_DIR "/bench/tiny-qwen2.json", &c, &st) == 0);
    CHECK(c.arch == LLMI_ARCH_QWEN2 && c.qkv_bias && c.tie_embeddings && c.head_dim == 32);
    llmi_status_clear(&st);
    CHECK(model_dummy_config(TESTDATA_DIR "/bench/malformed.json", &c, &st) == LLMI_E_RUNTIME);
    CHECK_MSG(strstr(st.msg, "malformed.json") && strstr(st.msg, "malformed"), "%s", st.msg);
    llmi_status_clear(&st);
    CHECK(model_dummy_config(TESTDATA_DIR "/bench/bad-shape.json", &c, &st) == LLMI_E_RUNTIME);
    CHECK_MSG(strstr(st.msg, "intermediate_size"), "%s", st.msg);
    llmi_status_clear(&st);
    /* a --dummy path that does not open is a bad flag value (exit 2), named with the flag */
    CHECK(model_dummy_config(TESTDATA_DIR "/bench/absent.json", &c, &st) == LLMI_E_USAGE);
    CHECK_MSG(strstr(st.msg, "--dummy") && strstr(st.msg, "absent.json"), "%s", st.msg);
}

TEST(bench_dummy_weights) {
    /* (int4: groups of 32 columns, the tiny model's widths being 64 and 128) */
    const llmi_dtype dts[7] = {LLMI_F32, LLMI_F16, LLMI_BF16, LLMI_Q8_0, LLMI_Q4_0, LLMI_Q4_1, LLMI_I4G};
    for (int k = 0; k < 7; k++) {
        llmi_status st = {0};
        llmi_model m, m2;
        const int gs = dts[k] == LLMI_I4G ? 32 : 0;
        if (model_load_dummy(TESTDATA_DIR "/bench/tiny-llama.json", dts[k], gs, &m, &st)) {
            CHECK_MSG(false, "%s", st.msg);
            continue;
        }
        CHECK(model_load_dummy(TESTDATA_DIR "/bench/tiny-llama.json", dts[k], gs, &m2, &st) == 0);
        CHECK(!strcmp(m.format, "dummy") && m.tok == NULL && m.cfg.n_layers == 2);
        const llmi_layer *L = &m.layers[1];
        CHECK(L->wq.rows == 64 && L->wq.cols == 64 && L->wk.rows == 32 && L->w_down.rows == 64 &&
              L->w_down.cols == 128 && L->wq.dtype == dts[k] && m.lm_head.data != m.tok_embd.data);
        /* deterministic: a second build is bit-identical; tensors differ from each other */
        CHECK(!memcmp(L->w_up.data, m2.layers[1].w_up.data, L->w_up.row_bytes * (size_t)L->w_up.rows));
        CHECK(memcmp(L->w_up.data, L->w_gate.data, L->w_up.row_bytes * (size_t)L->w_up.rows) != 0);
        /* values within +-1/sqrt(cols) (quantized: +- one step), mean ~0, spread like uniform */
        float row[128];
        double s = 0, s2 = 0, mx = 0;
        long cnt = 0;
        for (int64_t r = 0; r < L->w_down.rows; r++) {
            tensor_dequant_row(&L->w_down, r, row);
            for (int j = 0; j < 128; j++) {
                s += row[j];
                s2 += (double)row[j] * row[j];
                mx = fmax(mx, fabs(row[j]));
                cnt++;
            }
        }
        double scale = 1 / sqrt(128.0), mean = s / cnt, rms = sqrt(s2 / cnt);
        /* int4: (q - z) reaches 8 steps of 2 scale / 15 */
        const double top = dts[k] == LLMI_I4G ? 16.0 / 15.0 : 1.0;
        CHECK_MSG(mx <= scale * top * 1.01 + 1e-6 && mx > scale * 0.8, "dtype %d max %g scale %g", k, mx, scale);
        CHECK_MSG(fabs(mean) < 0.08 * scale, "dtype %d mean %g", k, mean);   /* q4_0 levels -8..7: -s/16 */
        CHECK_MSG(rms > 0.45 * scale && rms < 0.7 * scale, "dtype %d rms %g", k, rms);   /* uniform: 0.577 */
        CHECK(L->attn_norm[5] == 1.f && m.out_norm[63] == 1.f && L->bq == NULL);
        if (dts[k] == LLMI_I4G) {
            /* a GPTQ/AWQ grid: fp16 scales, zeros 7 or 8 (round to nearest of +-scale), no
             * act order; embeddings and lm_head bf16; scales and zeros in the weight bytes */
            CHECK(L->w_down.group_size == 32 && L->w_down.n_groups == 4 && L->w_down.g_idx == NULL &&
                  L->w_down.row_bytes == 64 && L->wq.n_groups == 2);
            int sevens = 0;
            for (int i = 0; i < L->w_down.n_groups * 64; i++) {
                CHECK(L->w_down.qscales[i] == f32_to_fp16((float)(2 * scale / 15)));
                CHECK(L->w_down.qzeros[i] == 7 || L->w_down.qzeros[i] == 8);
                sevens += L->w_down.qzeros[i] == 7;
            }
            CHECK_MSG(sevens > 64 && sevens < 192, "%d of 256 zeros are 7", sevens);
            CHECK(!memcmp(L->w_down.qzeros, m2.layers[1].w_down.qzeros, 256));
            CHECK(m.tok_embd.dtype == LLMI_BF16 && m.lm_head.dtype == LLMI_BF16);
            size_t lin = 0;
            for (int i = 0; i < m.cfg.n_layers; i++) {
                const llmi_tensor *ts[7] = {&m.layers[i].wq, &m.layers[i].wk, &m.layers[i].wv, &m.layers[i].wo,
                                            &m.layers[i].w_gate, &m.layers[i].w_up, &m.layers[i].w_down};
                for (int j = 0; j < 7; j++) lin += ts[j]->row_bytes * ts[j]->rows + (size_t)ts[j]->n_groups * ts[j]->rows * 3;
            }
            const size_t embd = 2 * (size_t)m.cfg.n_vocab * m.cfg.dim * 2, norms = (2 * 2 + 1) * (size_t)m.cfg.dim * 4;
            CHECK_MSG(m.weight_bytes == lin + embd + norms, "weight bytes %zu, want %zu", m.weight_bytes, lin + embd + norms);
        }
        model_free(&m);
        model_free(&m2);
    }
    llmi_status st = {0};
    llmi_model m;
    CHECK(model_load_dummy(TESTDATA_DIR "/bench/tiny-qwen2.json", LLMI_BF16, 0, &m, &st) == 0);
    CHECK(m.layers[0].bq && m.layers[0].bk && m.lm_head.data == m.tok_embd.data);
    model_free(&m);
    /* 8B shapes with a block-size mismatch are refused before allocating anything */
    llmi_status_clear(&st);
    CHECK(model_load_dummy(TESTDATA_DIR "/bench/tiny-qwen2.json", LLMI_DTYPE_COUNT, 0, &m, &st) == LLMI_E_USAGE);
    /* an int4 group that does not divide the widths (64, 128): refused, naming the group */
    llmi_status_clear(&st);
    CHECK(model_load_dummy(TESTDATA_DIR "/bench/tiny-llama.json", LLMI_I4G, 0, &m, &st) == LLMI_E_USAGE &&
          strstr(st.msg, "group size 128"));
}

TEST(bench_ppl_arithmetic) {
    /* nll = logsumexp - logit, and the llama.cpp ± formula on known values */
    const float lg[4] = {1, 2, 3, 4};
    double lse = log(exp(1) + exp(2) + exp(3) + exp(4));
    CHECK(near(ppl_nll(lg, 4, 2), lse - 3, 1e-6));
    ppl_acc a = {0};
    const double v[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) ppl_add(&a, v[i]);
    CHECK(near(ppl_value(&a), exp(2.5), 1e-12));
    /* var = mean(v^2) - mean^2 = 7.5 - 6.25 = 1.25;  stderr = sqrt(1.25/3) * ppl */
    CHECK(near(ppl_stderr(&a), sqrt(1.25 / 3) * exp(2.5), 1e-12));
    ppl_acc one = {0};
    ppl_add(&one, 2);
    CHECK(isnan(ppl_stderr(&one)));
}

/* tiny-llama.json in f32 on a CPU backend with options bo (and kv_blocks KV blocks when > 0),
 * or NULL after a failed check, with nothing left open. */
static llmi_backend *tiny_cpu(test_ctx *t_, llmi_model *m, const llmi_backend_opts *bo, int kv_blocks) {
    llmi_status st = {0};
    if (model_load_dummy(TESTDATA_DIR "/bench/tiny-llama.json", LLMI_F32, 0, m, &st)) {
        CHECK_MSG(false, "%s", st.msg);
        return NULL;
    }
    llmi_backend *b = NULL;
    if (backend_cpu_create(m, bo, &b, &st) || (kv_blocks > 0 && b->kv_alloc(b, kv_blocks, &st))) {
        CHECK_MSG(false, "%s", st.msg);
        if (b) b->destroy(b);
        model_free(m);
        return NULL;
    }
    return b;
}

/* ppl_run against re-running every scored prefix on its own: checks the window
 * boundaries, the BOS substitution, which positions are scored and the targets. */
TEST(bench_ppl_windows_bruteforce) {
    llmi_status st = {0};
    llmi_model m;
    const int n_ctx = 16, bos = 1;
    llmi_backend_opts bo = {.n_threads = 1, .kv_dtype = LLMI_KV_F32, .block_size = 8, .max_batch_tokens = n_ctx, .max_seqs = 1};
    llmi_backend *b = tiny_cpu(t_, &m, &bo, 2);
    if (!b) return;
    stats_rng r;
    stats_rng_seed(&r, test_seed());
    int32_t toks[53];
    for (int i = 0; i < 53; i++) toks[i] = (int32_t)stats_rng_range(&r, 2, 511);
    ppl_opts po = {.n_ctx = n_ctx, .n_chunks = -1, .n_batch = 8, .progress = NULL};
    ppl_result res;
    CHECK(ppl_run(b, toks, 53, bos, &po, &res, &st) == 0);
    CHECK(res.chunks == 3 && res.scored == 3 * (16 - 8 - 1));

    ppl_acc acc = {0};
    float *logits = malloc(512 * sizeof(float));
    int32_t win[16], pos[16], slot[16], seq[16] = {0}, table[2] = {0, 1};
    for (int c = 0; c < 3; c++) {
        for (int p = 0; p < n_ctx; p++) win[p] = p == 0 ? bos : toks[c * n_ctx + p];
        for (int p = 8; p <= 14; p++) {
            for (int k = 0; k <= p; k++) { pos[k] = k; slot[k] = k; }
            int32_t qs[2] = {0, p + 1}, row = p;
            llmi_batch bt = {.n_tokens = p + 1, .tokens = win, .positions = pos, .slot_mapping = slot,
                             .seq_of_token = seq, .n_seqs = 1, .query_start = qs,
                             .block_tables = table, .max_blocks_per_seq = 2, .n_logits = 1, .logit_rows = &row};
            CHECK(b->forward(b, &bt, logits, &st) == 0);
            ppl_add(&acc, ppl_nll(logits, 512, toks[c * n_ctx + p + 1]));
        }
    }
    CHECK_MSG(near(ppl_value(&acc), res.ppl, 1e-4), "brute %g vs run %g", ppl_value(&acc), res.ppl);
    CHECK(near(ppl_stderr(&acc), res.ppl_stderr, 1e-3));
    CHECK(isfinite(res.ppl) && res.ppl > 1);
    /* --chunks caps the windows; too few tokens is a usage error */
    po.n_chunks = 2;
    CHECK(ppl_run(b, toks, 53, bos, &po, &res, &st) == 0 && res.chunks == 2 && res.scored == 14);
    CHECK(ppl_run(b, toks, 31, bos, &po, &res, &st) == LLMI_E_USAGE && strstr(st.msg, "at least 32"));
    free(logits);
    b->destroy(b);
    model_free(&m);
}

/* ------------------------------------------------------------------ views, compare, SLOs */

/* A sweep row as bench writes it (the fields the views read). */
static void sweep_row(report *r, const char *kv, int batch, double pre, double pre_sd, double dec, double dec_sd) {
    report_row(r);
    report_str(r, "commit", "abc1234");
    report_str(r, "date", "2026-01-02T03:04:05Z");
    report_str(r, "backend", "cpu");
    report_str(r, "device", "Some CPU");
    report_str(r, "model", "/models/x/m.gguf");
    report_num(r, "params_m", 134.5, 1);
    report_num(r, "weights_gib", 0.09, 3);
    report_str(r, "weight_dtype", "Q4_1");
    report_int(r, "threads", 4);
    report_str(r, "kv_type", kv);
    report_str(r, "prefix_cache", "on");
    report_int(r, "block_size", 16);
    report_int(r, "n_prompt", 512);
    report_int(r, "n_gen", 128);
    report_int(r, "n_batch", batch);
    report_int(r, "reps", 5);
    report_num(r, "prefill_tps_mean", pre, 2);
    report_num(r, "prefill_tps_sd", pre_sd, 2);
    report_num(r, "decode_tps_mean", dec, 2);
    report_num(r, "decode_tps_sd", dec_sd, 2);
}

/* The cells of an md table line, trimmed. */
static int md_cells(const char *line, char cells[][64], int max) {
    int n = 0;
    const char *end = strchr(line, '\n'), *p = strchr(line, '|');
    if (!end) end = line + strlen(line);
    while (p && p < end && n < max) {
        const char *q = strchr(p + 1, '|');
        if (!q || q > end) break;
        const char *a = p + 1, *b = q;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        snprintf(cells[n++], 64, "%.*s", (int)(b - a), a);
        p = q;
    }
    return n;
}

TEST(bench_view_compact_2x2) {
    report r;
    report_init(&r);
    const char *kv[2] = {"f32", "f16"};
    const int bt[2] = {1, 4};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) sweep_row(&r, kv[i], bt[j], 1000 + 10 * i + j, 5, 50 + i, 0.25);
    char *out = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&out, &len);
    CHECK(bench_view_write(&r, m) == 0);
    fclose(m);
    /* two header lines: what every row shares, nothing that varies */
    CHECK_MSG(strstr(out, "m.gguf (134.5 M params, Q4_1, 0.090 GiB)") && strstr(out, "cpu: Some CPU") &&
                  strstr(out, "4 threads") && strstr(out, "commit abc1234") && strstr(out, "mean ± sd of 5 runs") &&
                  strstr(out, "block 16") && strstr(out, "2026-01-02 03:04 UTC"),
              "%s", out);
    char cells[16][64];
    const char *table = strstr(out, "\n|");
    CHECK_MSG(table && !memmem(out, (size_t)(table - out), "KV f", 4) && !memmem(out, (size_t)(table - out), "batch", 5),
              "%s", out);
    CHECK(table != NULL);
    if (table) {
        const char *want[7] = {"model", "backend", "kv_type", "n_batch", "test", "pp t/s", "tg t/s"};
        int n = md_cells(table + 1, cells, 16);
        CHECK_MSG(n == 7, "%d columns:\n%s", n, out);
        for (int k = 0; k < 7 && k < n; k++) CHECK_MSG(!strcmp(cells[k], want[k]), "column %d: %s", k, cells[k]);
        const char *row = strchr(strchr(table + 1, '\n') + 1, '\n') + 1;   /* after the separator */
        n = md_cells(row, cells, 16);
        CHECK_MSG(n == 7 && !strcmp(cells[0], "m.gguf") && !strcmp(cells[1], "cpu") && !strcmp(cells[2], "f32") &&
                      !strcmp(cells[3], "1") && !strcmp(cells[4], "pp512+tg128") && !strcmp(cells[5], "1000.00 ± 5.00") &&
                      !strcmp(cells[6], "50.00 ± 0.25"),
                  "%s", row);
        int lines = 0;
        for (const char *p = table + 1; *p; p++) lines += *p == '\n';
        CHECK_MSG(lines == 6, "%d table lines", lines);   /* header, separator, 4 rows */
    }
    free(out);
    /* a depth and a prefill-only test name */
    report_num_at(&r, 3, "depth", 4096, 0);
    char test[64];
    bench_view_test(&r, 3, test, sizeof test);
    CHECK_MSG(!strcmp(test, "pp512+tg128 @ d4096"), "%s", test);
    report_free(&r);
}

TEST(bench_report_read_back) {
    report r, back;
    report_init(&r);
    report_init(&back);
    sweep_row(&r, "f32", 1, 1000.125, 5, 50, 0.25);
    report_raw_json(&r, "series", "[[0,1]]");
    sweep_row(&r, "f16", 8, 999, 4, 51, 0.5);
    char *jl = render(&r, REPORT_JSONL), *js = render(&r, REPORT_JSON);
    llmi_status st = {0};
    CHECK(report_read_json(&back, jl, "a.jsonl", &st) == 0 && back.n_rows == 2);
    CHECK(report_get(&back, 0, "prefill_tps_mean") == 1000.125 && report_get(&back, 1, "n_batch") == 8);
    CHECK(!strcmp(report_get_str(&back, 1, "kv_type"), "f16") && report_varies(&back, "kv_type"));
    CHECK(!report_varies(&back, "threads") && report_has(&back, "series"));
    report_free(&back);
    report_init(&back);
    CHECK(report_read_json(&back, js, "a.json", &st) == 0 && back.n_rows == 2);
    CHECK(report_get(&back, 1, "decode_tps_sd") == 0.5);
    report_free(&back);
    report_init(&back);
    CHECK(report_read_json(&back, "{\"a\":1}\nnot json\n", "b.jsonl", &st) == LLMI_E_USAGE && strstr(st.msg, "b.jsonl:2"));
    llmi_status st2 = {0};
    report_free(&back);
    report_init(&back);
    CHECK(report_read_json(&back, "  \n", "c.jsonl", &st2) == LLMI_E_USAGE && strstr(st2.msg, "no rows"));
    free(jl);
    free(js);
    report_free(&back);
    report_free(&r);
}

/* Ratios and noise flags computed by hand: new/base for rates, base/new for latencies;
 * flagged when |new - base| > sqrt(sd_base^2 + sd_new^2). */
TEST(bench_compare_hand) {
    report base, cur, out;
    report_init(&base);
    report_init(&cur);
    report_init(&out);
    sweep_row(&base, "f32", 1, 100, 2, 50, 1);
    sweep_row(&cur, "f32", 1, 110, 3, 49.5, 1);      /* +10 > 3.61: better; -0.5 < 1.41: noise */
    sweep_row(&base, "f32", 4, 400, 1, 80, 1);       /* no match in cur (b = 4) */
    report_int(&cur, "depth", 0);                    /* a field base lacks is ignored */
    llmi_status st = {0};
    CHECK(bench_compare_rows(&base, &cur, &out, &st) == 0);
    CHECK_MSG(out.n_rows == 2, "%d rows", out.n_rows);
    CHECK(!strcmp(report_get_str(&out, 0, "metric"), "prefill t/s") && !strcmp(report_get_str(&out, 0, "flag"), "better"));
    CHECK(near(report_get(&out, 0, "ratio"), 1.1, 1e-12) && report_get(&out, 0, "base_sd") == 2);
    CHECK(!strcmp(report_get_str(&out, 1, "metric"), "decode t/s") && !strcmp(report_get_str(&out, 1, "flag"), "~"));
    CHECK(near(report_get(&out, 1, "ratio"), 0.99, 1e-12));
    CHECK(!strcmp(report_get_str(&out, 0, "test"), "pp512+tg128"));
    report_free(&base);
    report_free(&cur);
    report_free(&out);
    /* throughput rows have no sd: the flag says so; a latency ratio is base/new */
    report_init(&base);
    report_init(&cur);
    report_init(&out);
    report *both[2] = {&base, &cur};
    const double tps[2] = {200, 150}, ttft[2] = {100, 80};
    for (int k = 0; k < 2; k++) {
        report_row(both[k]);
        report_str(both[k], "model", k ? "/b/m.gguf" : "/a/m.gguf");   /* same file name, other directory */
        report_int(both[k], "num_requests", 100);
        report_num(both[k], "output_tps", tps[k], 2);
        report_num(both[k], "ttft_ms_p50", ttft[k], 2);
    }
    CHECK(bench_compare_rows(&base, &cur, &out, &st) == 0 && out.n_rows == 2);
    CHECK(near(report_get(&out, 0, "ratio"), 0.75, 1e-12) && !strcmp(report_get_str(&out, 0, "flag"), "no sd"));
    CHECK(near(report_get(&out, 1, "ratio"), 1.25, 1e-12) && !strcmp(report_get_str(&out, 1, "metric"), "TTFT p50 ms"));
    /* --spec off,ngram: each row pairs with the other file's row of the same spec (the
     * first row of the same shape would pair ngram with off: 210 / 100) */
    report sb, sc, so;
    report_init(&sb);
    report_init(&sc);
    report_init(&so);
    const char *specs[2][2] = {{"off", "ngram"}, {"ngram", "off"}};
    const double stps[2][2] = {{100, 200}, {210, 90}};
    report *pair[2] = {&sb, &sc};
    for (int k = 0; k < 2; k++)
        for (int q = 0; q < 2; q++) {
            report_row(pair[k]);
            report_str(pair[k], "model", "m.gguf");
            report_int(pair[k], "num_requests", 100);
            report_str(pair[k], "spec", specs[k][q]);
            report_num(pair[k], "output_tps", stps[k][q], 2);
        }
    CHECK(bench_compare_rows(&sb, &sc, &so, &st) == 0 && so.n_rows == 2);
    CHECK_MSG(near(report_get(&so, 0, "ratio"), 0.9, 1e-12) && near(report_get(&so, 1, "ratio"), 1.05, 1e-12),
              "spec rows paired wrongly: ratios %g %g", report_get(&so, 0, "ratio"), report_get(&so, 1, "ratio"));
    report_free(&sb);
    report_free(&sc);
    report_free(&so);
    /* nothing in common: an error, not an empty table */
    report_str(&cur, "model", "other.gguf");
    report_free(&out);
    report_init(&out);
    llmi_status st2 = {0};
    CHECK(bench_compare_rows(&base, &cur, &out, &st2) == LLMI_E_RUNTIME && strstr(st2.msg, "no configuration"));
    report_free(&base);
    report_free(&cur);
    report_free(&out);
}

TEST(bench_slo_accounting) {
    const double ttft[5] = {100, 250, 50, 300, 120}, tpot[5] = {20, NAN, 60, 10, 45},
                 e2e[5] = {1000, 400, 2000, 900, 1500};
    slo_spec s = {.ttft_ms = 200, .tpot_ms = 50, .e2e_ms = 1500};
    slo_result r;
    slo_account(&s, ttft, tpot, e2e, 5, 4.0, &r);
    /* by hand: ttft 1,3,5 met; tpot all but the 60 (one token: no TPOT, met); e2e all but 2000
     * (1500 <= 1500); every limit: requests 1 and 5 */
    CHECK(r.n == 5 && r.ttft_met == 0.6 && r.tpot_met == 0.8 && r.e2e_met == 0.8);
    CHECK(r.all_met == 0.4 && r.goodput_rps == 0.5);
    slo_spec only = {.ttft_ms = 200};
    slo_account(&only, ttft, tpot, e2e, 5, 2.0, &r);
    CHECK(r.all_met == 0.6 && isnan(r.tpot_met) && isnan(r.e2e_met) && r.goodput_rps == 1.5);
    const double rates[4] = {1, 2, 4, 8}, met[4] = {1.0, 0.95, 0.9, 0.5}, low[4] = {0.5, 0.2, 0.1, 0};
    CHECK(slo_max_rate(rates, met, 4, SLO_TARGET) == 4);
    CHECK(isnan(slo_max_rate(rates, low, 4, SLO_TARGET)));
    const double r2[3] = {8, 1, 4}, m2[3] = {0.95, 1, 0.2};
    CHECK(slo_max_rate(r2, m2, 3, SLO_TARGET) == 8);
    llmi_status st = {0};
    slo_spec p;
    CHECK(slo_parse("ttft=200,tpot=50", &p, &st) == 0 && p.ttft_ms == 200 && p.tpot_ms == 50 && p.e2e_ms == 0);
    CHECK(slo_parse("e2e=2.5", &p, &st) == 0 && p.e2e_ms == 2.5 && !p.ttft_ms);
    const char *bad[] = {"", "ttft=200,ttft=3", "foo=1", "ttft=-1", "ttft=", "ttft=1x", "tpot"};
    for (int i = 0; i < 7; i++) {
        llmi_status e = {0};
        CHECK_MSG(slo_parse(bad[i], &p, &e) == LLMI_E_USAGE && strstr(e.msg, "--slo"), "'%s' accepted", bad[i]);
    }
}

/* -d: the context is prefilled untimed and the engine's own accounting shows it in the
 * KV cache when the timed part starts: the timed steps prefill only b x p tokens, the
 * first of them finds 2 context blocks per sequence in use, and every request reports its
 * d context tokens as cached. */
typedef struct depth_probe { int steps, prefill, first_used; int cached[4], n_prompt[4], n_req; } depth_probe;

static void depth_after_step(void *ctx, const llmi_step_info *info, double t0, double dt) {
    depth_probe *p = ctx;
    if (p->steps++ == 0) p->first_used = info->kv_blocks_used;
    p->prefill += info->n_prefill_tokens;
}

static int depth_on_request(void *ctx, const llmi_request_info *ri, llmi_status *st) {
    depth_probe *p = ctx;
    if (p->n_req < 4) {
        p->cached[p->n_req] = ri->n_cached_tokens;
        p->n_prompt[p->n_req++] = ri->n_prompt;
    }
    return 0;
}

TEST(bench_depth_kv_holds_context) {
    llmi_status st = {0};
    llmi_model m;
    llmi_backend_opts bo = {.n_threads = 1, .kv_dtype = LLMI_KV_F32, .block_size = 16, .max_batch_tokens = 256, .max_seqs = 4};
    llmi_engine_opts eo = engine_opts_defaults();
    eo.block_size = 16;
    eo.max_batch_tokens = 256;
    eo.max_seqs = 4;
    eo.num_blocks = 2 * 4;    /* b x ceil((d + p + n) / block) = 2 x 3, and room to spare */
    llmi_backend *b = tiny_cpu(t_, &m, &bo, 0);
    llmi_engine *e = NULL;
    if (!b) return;
    if (engine_create(&m, b, &eo, &e, &st)) {
        CHECK_MSG(false, "%s", st.msg);
        b->destroy(b);
        model_free(&m);
        return;
    }
    stats_rng rng;
    stats_rng_seed(&rng, test_seed());
    depth_probe p = {0};
    const workload_hooks h = {.ctx = &p, .after_step = depth_after_step, .on_request = depth_on_request};
    workload_shape w = {.n_prompt = 8, .n_gen = 3, .n_requests = 2, .n_depth = 32};
    CHECK_MSG(workload_run(e, m.cfg.n_vocab, w, &rng, &h, "test", &st) == 0, "%s", st.msg);
    CHECK_MSG(p.prefill == 2 * 8, "timed prefill tokens %d (want b x p = 16)", p.prefill);
    CHECK_MSG(p.first_used == 2 * 3, "blocks in use at the first timed step: %d (want 2 x (2 context + 1))", p.first_used);
    CHECK(p.n_req == 2);
    for (int i = 0; i < p.n_req; i++) CHECK_MSG(p.cached[i] == 32 && p.n_prompt[i] == 40, "%d %d", p.cached[i], p.n_prompt[i]);
    /* without depth the same shape computes and holds no context */
    depth_probe q = {0};
    const workload_hooks hq = {.ctx = &q, .after_step = depth_after_step, .on_request = depth_on_request};
    w.n_depth = 0;
    CHECK(workload_run(e, m.cfg.n_vocab, w, &rng, &hq, "test", &st) == 0);
    CHECK(q.prefill == 16 && q.first_used == 2 && q.cached[0] == 0 && q.n_prompt[0] == 8);
    engine_destroy(e);
    /* a pool too small to keep the context: an error naming -d, not a silent re-prefill */
    eo.num_blocks = 3;
    eo.max_seqs = 1;
    llmi_status st2 = {0};
    if (engine_create(&m, b, &eo, &e, &st2) == 0) {
        w = (workload_shape){.n_prompt = 8, .n_gen = 3, .n_requests = 2, .n_depth = 32};
        CHECK(workload_run(e, m.cfg.n_vocab, w, &rng, NULL, "test", &st2) == LLMI_E_RUNTIME && strstr(st2.msg, "-d 32"));
        engine_destroy(e);
    }
    b->destroy(b);
    model_free(&m);
}

/* The offline warm-up (workload_warm_serving): one step prefills every prompt, then the
 * decoding batch halves every second step down to one sequence, so each power-of-two batch
 * size decodes exactly twice (the CUDA backend's eager step and graph capture); the KV cache,
 * sized for the timed run, bounds the prompts and then how many run; nothing is left running. */
typedef struct warm_probe { int steps, prefill_steps, prefill_tokens, dec[32], n_dec; } warm_probe;

static void warm_after_step(void *ctx, const llmi_step_info *info, double t0, double dt) {
    warm_probe *p = ctx;
    p->steps++;
    if (info->n_prefill_tokens > 0) {
        p->prefill_steps++;
        p->prefill_tokens += info->n_prefill_tokens;
    } else if (p->n_dec < 32) {
        p->dec[p->n_dec++] = info->n_decode_seqs;
    }
}

TEST(bench_warm_serving_halves_the_batch) {
    llmi_status st = {0};
    llmi_model m;
    llmi_backend_opts bo = {.n_threads = 1, .kv_dtype = LLMI_KV_F32, .block_size = 16, .max_batch_tokens = 256, .max_seqs = 16};
    llmi_backend *b = tiny_cpu(t_, &m, &bo, 0);
    if (!b) return;
    static const struct { int max_batch, num_blocks, p, want[12], n_want; } cases[] = {
        /* 12 prompts of 21 tokens (256 / 12) in one step; the buckets 16, 8, 4, 2, 1 as 12, 8, 4, 2, 1 */
        {12, 64, 21, {12, 12, 8, 8, 4, 4, 2, 2, 1, 1}, 10},
        {5, 64, 32, {5, 5, 4, 4, 2, 2, 1, 1}, 8},
        {1, 64, 32, {1, 1}, 2},
        /* 7 blocks of 16 tokens: the prompts shrink to fit and then the batch, down to 7
         * sequences of one block (7-token prompts, at most 9 tokens generated) */
        {12, 7, 7, {7, 7, 4, 4, 2, 2, 1, 1}, 8},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        llmi_engine_opts eo = engine_opts_defaults();
        eo.block_size = 16;
        eo.max_batch_tokens = 256;
        eo.max_seqs = 16;
        eo.num_blocks = cases[c].num_blocks;
        llmi_engine *e = NULL;
        if (engine_create(&m, b, &eo, &e, &st)) {
            CHECK_MSG(false, "%s", st.msg);
            break;
        }
        stats_rng rng;
        stats_rng_seed(&rng, test_seed());
        warm_probe p = {0};
        const workload_hooks h = {.ctx = &p, .after_step = warm_after_step};
        CHECK_MSG(workload_warm_serving(e, m.cfg.n_vocab, 1024, cases[c].max_batch, &rng, &h, "test", &st) == 0, "%s",
                  st.msg);
        const int ran = cases[c].want[0];
        CHECK_MSG(p.prefill_steps == 1 && p.prefill_tokens == ran * cases[c].p,
                  "case %zu: %d prefill steps of %d tokens (want 1 of %d x %d)", c, p.prefill_steps, p.prefill_tokens, ran,
                  cases[c].p);
        bool same = p.n_dec == cases[c].n_want;
        for (int i = 0; same && i < p.n_dec; i++) same = p.dec[i] == cases[c].want[i];
        char got[128] = "";
        for (int i = 0; i < p.n_dec; i++) snprintf(got + strlen(got), sizeof got - strlen(got), " %d", p.dec[i]);
        CHECK_MSG(same, "case %zu: decode batches%s", c, got);
        CHECK(!engine_has_work(e));
        engine_destroy(e);
    }
    b->destroy(b);
    model_free(&m);
}

static int stop_after_first(void *ctx, int done, int total, double ppl) { return 1; }

TEST(bench_ppl_interrupt_keeps_windows_done) {
    llmi_status st = {0};
    llmi_model m;
    llmi_backend_opts bo = {.n_threads = 1, .kv_dtype = LLMI_KV_F32, .block_size = 8, .max_batch_tokens = 16, .max_seqs = 1};
    llmi_backend *b = tiny_cpu(t_, &m, &bo, 2);
    if (!b) return;
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = 2 + i * 7 % 500;
    ppl_opts po = {.n_ctx = 16, .n_chunks = -1, .n_batch = 16, .on_chunk = stop_after_first};
    ppl_result res;
    CHECK(ppl_run(b, toks, 64, 1, &po, &res, &st) == LLMI_E_INTERRUPT);
    CHECK(res.chunks == 1 && res.scored == 7 && isfinite(res.ppl));
    b->destroy(b);
    model_free(&m);
}
