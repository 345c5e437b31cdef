/* test_quant_io.c — quantize -> write HF directory -> load -> dequantize equals the
 * quantizer's own grid; config/tensor disagreements and existing outputs are refused;
 * llmi's checkpoints in testdata/quant/ dequantize to what an independent reader
 * (AutoGPTQ / AutoAWQ unpacking, scripts/quant-reference-check.py) produced. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "quant/write_hf.h"
#include "test.h"

static float tio_rand(unsigned long long *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void tio_mat(llmi_tensor *t, int rows, int cols, float scale, unsigned long long *s) {
    memset(t, 0, sizeof *t);
    float *d = malloc((size_t)rows * cols * sizeof(float));
    for (size_t i = 0; i < (size_t)rows * cols; i++) d[i] = tio_rand(s) * scale * (1.0f + 3.0f * (i % 17 == 0));
    t->dtype = LLMI_F32, t->rows = rows, t->cols = cols, t->row_bytes = (size_t)cols * 4;
    t->data = t->owned = d;
}

static float *tio_vec(int n, float base, unsigned long long *s) {
    float *v = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) v[i] = base + 0.2f * tio_rand(s);
    return v;
}

/* A tiny llama: vocab 96, dim 64, 4 heads / 2 kv heads of 16, ffn 128, 2 layers, tied;
 * with qwen3, Qwen3's per-head q/k norms too. */
static void tio_model_arch(llmi_model *m, unsigned long long seed, bool qwen3) {
    memset(m, 0, sizeof *m);
    llmi_config *c = &m->cfg;
    c->arch = qwen3 ? LLMI_ARCH_QWEN3 : LLMI_ARCH_LLAMA;
    c->qk_norm = qwen3;
    snprintf(c->arch_name, sizeof c->arch_name, qwen3 ? "qwen3" : "llama");
    snprintf(c->name, sizeof c->name, "tiny");
    c->n_vocab = 96, c->dim = 64, c->n_layers = 2, c->n_heads = 4, c->n_kv_heads = 2, c->head_dim = 16;
    c->ffn_dim = 128, c->max_ctx = 256, c->norm_eps = 1e-5f, c->rope_theta = 10000.0f, c->rope_dim = 16;
    c->tie_embeddings = true;
    snprintf(m->format, sizeof m->format, "dummy");
    unsigned long long s = seed | 1;
    tio_mat(&m->tok_embd, 96, 64, 1.0f, &s);
    m->lm_head = m->tok_embd;
    m->lm_head.owned = NULL;
    m->out_norm = tio_vec(64, 1.0f, &s);
    m->layers = calloc(2, sizeof *m->layers);
    for (int l = 0; l < 2; l++) {
        llmi_layer *L = &m->layers[l];
        L->attn_norm = tio_vec(64, 1.0f, &s);
        L->ffn_norm = tio_vec(64, 1.0f, &s);
        tio_mat(&L->wq, 64, 64, 0.2f, &s);
        tio_mat(&L->wk, 32, 64, 0.2f, &s);
        tio_mat(&L->wv, 32, 64, 0.2f, &s);
        tio_mat(&L->wo, 64, 64, 0.2f, &s);
        tio_mat(&L->w_gate, 128, 64, 0.2f, &s);
        tio_mat(&L->w_up, 128, 64, 0.2f, &s);
        tio_mat(&L->w_down, 64, 128, 0.1f, &s);
        if (qwen3) L->q_norm = tio_vec(16, 1.0f, &s), L->k_norm = tio_vec(16, 1.0f, &s);
    }
}

static void tio_model(llmi_model *m, unsigned long long seed) { tio_model_arch(m, seed, false); }

static void tio_model_free(llmi_model *m) {
    free(m->tok_embd.owned);
    free(m->out_norm);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        llmi_layer *L = &m->layers[l];
        free(L->attn_norm), free(L->ffn_norm), free(L->q_norm), free(L->k_norm);
        llmi_tensor *ts[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) free(ts[i]->owned);
    }
    free(m->layers);
}

typedef struct tio_case { const char *name; quant_method method; bool sym, desc_act; } tio_case;
static const tio_case kCases[] = {
    {"rtn", QUANT_RTN, true, false},
    {"gptq", QUANT_GPTQ, true, false},
    {"gptq-actorder", QUANT_GPTQ, false, true},
    {"awq", QUANT_AWQ, false, false},
};

static int tio_quantize(const llmi_model *m, const tio_case *k, unsigned long long seed, quant_result *r,
                        quant_opts *o, llmi_status *st) {
    memset(o, 0, sizeof *o);
    o->method = k->method, o->bits = 4, o->group_size = 32, o->sym = k->sym, o->desc_act = k->desc_act;
    o->damp_percent = 0.01f, o->awq_grid = 20, o->awq_clip = true;
    int32_t tokens[4 * 32];
    unsigned long long s = seed | 1;
    for (int i = 0; i < 4 * 32; i++) tokens[i] = (int32_t)((tio_rand(&s) + 1.0f) * 47.9f) % 96;
    return quant_model_run(m, o, tokens, 4, 32, r, st);
}

static const llmi_tensor *tio_linear(const llmi_layer *L, int i) {
    const llmi_tensor *ts[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ts[i];
}

static void tio_roundtrip(test_ctx *t_, bool qwen3) {
    unsigned long long seed = test_seed();
    llmi_model m;
    tio_model_arch(&m, seed, qwen3);
    char dir[] = "/tmp/llmi-qtest-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    for (size_t ci = 0; ci < sizeof kCases / sizeof *kCases; ci++) {
        quant_result r;
        quant_opts o;
        llmi_status st = {0};
        CHECK_MSG(tio_quantize(&m, &kCases[ci], seed, &r, &o, &st) == 0, "%s: %s", kCases[ci].name, st.msg);
        if (st.code) continue;
        char out[256];
        snprintf(out, sizeof out, "%s/%s", dir, kCases[ci].name);
        CHECK_MSG(quant_write_hf(out, false, &m, &r, &o, "(synthetic)", &st) == 0, "%s", st.msg);
        /* an existing output is refused without --force, replaced with it */
        llmi_status st2 = {0};
        CHECK(quant_write_hf(out, false, &m, &r, &o, "(synthetic)", &st2) == LLMI_E_USAGE);
        CHECK(strstr(st2.msg, "exists") != NULL);
        llmi_status_clear(&st2);
        CHECK(quant_write_hf(out, true, &m, &r, &o, "(synthetic)", &st2) == 0);
        llmi_model q;
        llmi_load_opts lo = {.no_tokenizer = true};
        CHECK_MSG(model_load_hf(out, &lo, &q, &st) == 0, "%s", st.msg);
        if (st.code) {
            quant_result_free(&r);
            continue;
        }
        int mism = 0, wrong_dtype = 0, gidx = 0;
        float *a = malloc(128 * 128 * sizeof(float)), *b = malloc(128 * sizeof(float));
        for (int l = 0; l < 2; l++)
            for (int i = 0; i < QL_COUNT; i++) {
                const llmi_tensor *t = tio_linear(&q.layers[l], i);
                const quant_grid *g = &r.grids[l][i];
                wrong_dtype += t->dtype != LLMI_I4G;
                gidx += t->g_idx != NULL;
                quant_grid_dequant(g, a);
                for (int row = 0; row < g->rows; row++) {
                    tensor_dequant_row(t, row, b);
                    mism += memcmp(b, a + (size_t)row * g->cols, (size_t)g->cols * sizeof(float)) != 0;
                }
            }
        CHECK_MSG(mism == 0 && wrong_dtype == 0, "%s: %d rows differ, %d not I4G", kCases[ci].name, mism, wrong_dtype);
        CHECK((gidx > 0) == kCases[ci].desc_act);
        /* AWQ folds its scales into the norms: the file must carry them */
        for (int k = 0; k < 64; k++)
            mism += q.layers[1].attn_norm[k] != fp16_to_f32(f32_to_fp16(r.attn_norm[1][k]));
        CHECK(mism == 0);
        /* the architecture survives, and Qwen3's q/k norms are written as they were */
        CHECK_MSG(q.cfg.arch == m.cfg.arch && q.cfg.qk_norm == qwen3, "%s: arch %s", kCases[ci].name,
                  q.cfg.arch_name);
        for (int l = 0; l < 2 && qwen3 && q.cfg.qk_norm; l++)
            for (int k = 0; k < 16; k++)
                mism += q.layers[l].q_norm[k] != fp16_to_f32(f32_to_fp16(m.layers[l].q_norm[k])) ||
                        q.layers[l].k_norm[k] != fp16_to_f32(f32_to_fp16(m.layers[l].k_norm[k]));
        CHECK_MSG(mism == 0, "%s: %d q/k norm weights differ", kCases[ci].name, mism);
        free(a), free(b);
        model_free(&q);
        quant_result_free(&r);
    }
    quant_rmtree(dir);
    tio_model_free(&m);
}

TEST(quant_roundtrip_write_load) { tio_roundtrip(t_, false); }
TEST(quant_roundtrip_write_load_qwen3) { tio_roundtrip(t_, true); }

static void tio_edit_config(const char *path, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    char buf[8192];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    char *p = strstr(buf, from);
    if (!p) return;
    char out[8192];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(p - buf), buf, to, p + strlen(from));
    f = fopen(path, "wb");
    if (f) fputs(out, f), fclose(f);
}

TEST(quant_load_rejects_config_mismatch) {
    unsigned long long seed = test_seed();
    llmi_model m;
    tio_model(&m, seed);
    char dir[] = "/tmp/llmi-qtest-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    quant_result r;
    quant_opts o;
    llmi_status st = {0};
    CHECK(tio_quantize(&m, &kCases[1], seed, &r, &o, &st) == 0);
    char out[256], cfg[300];
    snprintf(out, sizeof out, "%s/q", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    CHECK(quant_write_hf(out, false, &m, &r, &o, "(synthetic)", &st) == 0);
    struct { const char *from, *to, *expect; } edits[] = {
        {"\"group_size\":\t32", "\"group_size\":\t64", "disagrees with quantization_config"},
        {"\"bits\":\t4", "\"bits\":\t8", "bits 8 is not supported"},
        {"\"quant_method\":\t\"gptq\"", "\"quant_method\":\t\"awq\"", "disagrees with quantization_config"},
        {"\"checkpoint_format\":\t\"gptq\"", "\"checkpoint_format\":\t\"marlin\"", "not supported"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        CHECK(quant_write_hf(out, true, &m, &r, &o, "(synthetic)", &st) == 0);
        tio_edit_config(cfg, edits[i].from, edits[i].to);
        llmi_model q;
        llmi_load_opts lo = {.no_tokenizer = true};
        llmi_status ls = {0};
        int rc = model_load_hf(out, &lo, &q, &ls);
        CHECK_MSG(rc != 0 && strstr(ls.msg, edits[i].expect), "edit %zu: rc %d, '%s'", i, rc, ls.msg);
        CHECK(strchr(ls.msg, '\n') == NULL);
        if (rc == 0) model_free(&q);
    }
    quant_result_free(&r);
    quant_rmtree(dir);
    tio_model_free(&m);
}

/* LLMI_QUANT_TESTDATA=DIR writes the fixed-seed checkpoints committed in testdata/quant/. */
TEST(quant_testdata_checkpoints) {
    const char *gen = getenv("LLMI_QUANT_TESTDATA");
    llmi_model m;
    if (gen) {
        tio_model(&m, 20261121);
        for (size_t ci = 1; ci < sizeof kCases / sizeof *kCases; ci++) {
            quant_result r;
            quant_opts o;
            llmi_status st = {0};
            CHECK(tio_quantize(&m, &kCases[ci], 20261121, &r, &o, &st) == 0);
            char out[512];
            snprintf(out, sizeof out, "%s/%s", gen, kCases[ci].name);
            CHECK_MSG(quant_write_hf(out, true, &m, &r, &o, "(synthetic)", &st) == 0, "%s", st.msg);
            quant_result_free(&r);
        }
        tio_model_free(&m);
    }
    /* the independent reader's dequantization of each committed checkpoint, bit for bit */
    const char *td = getenv("TESTDATA") ? getenv("TESTDATA") : "testdata";
    for (size_t ci = 1; ci < sizeof kCases / sizeof *kCases; ci++) {
        char dirp[512], refp[600];
        snprintf(dirp, sizeof dirp, "%s/quant/%s", td, kCases[ci].name);
        llmi_model q;
        llmi_load_opts lo = {.no_tokenizer = true};
        llmi_status st = {0};
        CHECK_MSG(model_load_hf(dirp, &lo, &q, &st) == 0, "%s", st.msg);
        if (st.code) continue;
        int mism = 0, missing = 0;
        for (int l = 0; l < q.cfg.n_layers; l++)
            for (int i = 0; i < QL_COUNT; i++) {
                snprintf(refp, sizeof refp, "%s/quant/ref/%s.layers.%d.%s.f32", td, kCases[ci].name, l,
                         quant_linear_names[i]);
                const llmi_tensor *t = tio_linear(&q.layers[l], i);
                size_t n = (size_t)t->rows * t->cols;
                float *ref = malloc(n * sizeof(float)), *row = malloc((size_t)t->cols * sizeof(float));
                FILE *f = fopen(refp, "rb");
                if (!f || fread(ref, sizeof(float), n, f) != n) {
                    missing++;
                } else {
                    for (int64_t r = 0; r < t->rows; r++) {
                        tensor_dequant_row(t, r, row);
                        mism += memcmp(row, ref + (size_t)r * t->cols, (size_t)t->cols * sizeof(float)) != 0;
                    }
                }
                if (f) fclose(f);
                free(ref), free(row);
            }
        CHECK_MSG(missing == 0 && mism == 0, "%s: %d reference files missing, %d rows differ", kCases[ci].name,
                  missing, mism);
        model_free(&q);
    }
}

/* --save-stats / --load-stats: an AWQ re-run from saved statistics gives the same grids
 * with no calibration forward; a file for other shapes is refused. */
TEST(quant_stats_roundtrip) {
    unsigned long long seed = test_seed();
    llmi_model m;
    tio_model(&m, seed);
    quant_result r1, r2;
    quant_opts o;
    quant_stats out, in;
    llmi_status st = {0};
    CHECK(quant_stats_init(&out, &m.cfg, &st) == 0);
    memset(&o, 0, sizeof o);
    o.method = QUANT_AWQ, o.bits = 4, o.group_size = 32, o.awq_grid = 20, o.awq_clip = true;
    int32_t tokens[4 * 32];
    for (int i = 0; i < 4 * 32; i++) tokens[i] = (int32_t)(((seed >> (i % 50)) + (unsigned)i * 7u) % 96u);
    CHECK(quant_model_run_stats(&m, &o, tokens, 4, 32, NULL, &out, &r1, &st) == 0);
    char path[] = "/tmp/llmi-qstats-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_MSG(quant_stats_save(path, &out, &st) == 0, "%s", st.msg);
    CHECK_MSG(quant_stats_load(path, &m.cfg, &in, &st) == 0, "%s", st.msg);
    CHECK(quant_model_run_stats(&m, &o, NULL, 0, 0, &in, NULL, &r2, &st) == 0);
    int diff = 0;
    for (int l = 0; l < 2 && !st.code; l++)
        for (int i = 0; i < QL_COUNT; i++) {
            const quant_grid *a = &r1.grids[l][i], *b = &r2.grids[l][i];
            diff += memcmp(a->q, b->q, (size_t)a->rows * a->cols) != 0;
            diff += memcmp(a->scales, b->scales, (size_t)a->rows * a->n_groups * 2) != 0;
        }
    CHECK(diff == 0);
    llmi_config other = m.cfg;
    other.ffn_dim = 256;
    quant_stats bad;
    llmi_status st2 = {0};
    CHECK(quant_stats_load(path, &other, &bad, &st2) == LLMI_E_USAGE);
    CHECK(strstr(st2.msg, "different model") != NULL);
    unlink(path);
    quant_stats_free(&out);
    quant_stats_free(&in);
    quant_result_free(&r1);
    quant_result_free(&r2);
    tio_model_free(&m);
}

/* A statistics file is untrusted: a NaN or infinity (it would become NaN scales) and data
 * past the statistics (two files run together) are refused with a line naming the file. */
static void qstats_fill(quant_stats *s, float poison) {
    for (int l = 0; l < s->n_layers; l++)
        for (int k = 0; k < QS_COUNT; k++) {
            int n = s->cols[k];
            s->gram[l][k] = calloc((size_t)n * n, sizeof(float));
            s->xmean[l][k] = calloc((size_t)n, sizeof(float));
            for (int i = 0; i < n; i++) s->gram[l][k][(size_t)i * n + i] = 1.0f, s->xmean[l][k][i] = 0.5f;
        }
    s->gram[s->n_layers - 1][QS_DOWN][1] = poison;
    s->gram[s->n_layers - 1][QS_DOWN][s->cols[QS_DOWN]] = poison;
}

TEST(quant_stats_load_rejects_nonfinite_and_trailing_data) {
    llmi_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 2, c.dim = 8, c.n_heads = 2, c.head_dim = 4, c.ffn_dim = 16;
    char path[] = "/tmp/llmi-qstats-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    const float poisons[2] = {NAN, INFINITY};
    for (int p = 0; p < 3; p++) {
        quant_stats out, in;
        llmi_status st = {0};
        CHECK(quant_stats_init(&out, &c, &st) == 0);
        qstats_fill(&out, p < 2 ? poisons[p] : 0.25f);
        CHECK_MSG(quant_stats_save(path, &out, &st) == 0, "%s", st.msg);
        quant_stats_free(&out);
        if (p == 2) {
            /* a second statistics stream appended: valid zstd, but past the end */
            FILE *f = fopen(path, "rb");
            char buf[1 << 14];
            size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f) fclose(f);
            f = fopen(path, "ab");
            CHECK(f && n > 0 && fwrite(buf, 1, n, f) == n);
            if (f) fclose(f);
        }
        int rc = quant_stats_load(path, &c, &in, &st);
        CHECK(rc == LLMI_E_RUNTIME);
        CHECK_MSG(strstr(st.msg, path) && strstr(st.msg, p < 2 ? "non-finite" : "past the end"), "%s", st.msg);
        if (rc == 0) quant_stats_free(&in);
    }
    unlink(path);
}
