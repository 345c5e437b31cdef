/* test_backend_cpu.c — the CPU backend's forward pass on tiny random models built in
 * memory: (a) batch invariance (one batch vs chunked prefill vs mixed with other
 * sequences, random block tables), (b) a 1-layer model against a dense double-precision
 * Llama block written here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "model/model.h"
#include "test.h"

typedef struct { uint64_t s; } brng;
static uint64_t brng_next(brng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float brng_unif(brng *r) { return (float)((brng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

/* A (rows, cols) weight of uniform values scaled by 1/sqrt(cols), in dtype t. */
static llmi_tensor tw(brng *r, llmi_dtype t, int rows, int cols) {
    llmi_tensor w = {0};
    w.dtype = t;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = (size_t)(cols / dtype_block_elems(t)) * dtype_block_bytes(t);
    uint8_t *d = malloc(w.row_bytes * rows);
    float a = 1.7f / sqrtf((float)cols);
    for (int i = 0; i < rows; i++) {
        uint8_t *p = d + w.row_bytes * i;
        if (t == LLMI_F32) {
            for (int c = 0; c < cols; c++) { float f = brng_unif(r) * a; memcpy(p + 4 * c, &f, 4); }
        } else if (t == LLMI_Q4_1) {   /* random nibbles, d and m spanning [-a, a] */
            for (int b = 0; b < cols / 32; b++) {
                uint16_t dh = f32_to_fp16(2 * a / 15), mh = f32_to_fp16(-a);
                memcpy(p + 20 * b, &dh, 2);
                memcpy(p + 20 * b + 2, &mh, 2);
                for (int j = 0; j < 16; j++) p[20 * b + 4 + j] = (uint8_t)brng_next(r);
            }
        } else if (t == LLMI_Q8_0) {   /* random int8 q, d = a / 127 */
            for (int b = 0; b < cols / 32; b++) {
                uint16_t dh = f32_to_fp16(a / 127);
                memcpy(p + 34 * b, &dh, 2);
                for (int j = 0; j < 32; j++) p[34 * b + 2 + j] = (uint8_t)brng_next(r);
            }
        } else {   /* k-quants: random codes and 6-/8-bit scales, super-block scales for values of ~[-a, a] */
            const size_t bb = dtype_block_bytes(t);
            for (size_t j = 0; j < w.row_bytes; j++) p[j] = (uint8_t)brng_next(r);
            for (int b = 0; b < cols / 256; b++) {
                /* Q4_K/Q5_K: d * scale * q up to 63 * 15 (31) d, minus dmin * min up to 63 dmin;
                 * Q6_K: d * scale * (q - 32) up to 128 * 32 d */
                uint16_t dh = f32_to_fp16(t == LLMI_Q6_K ? a / 2048 : t == LLMI_Q5_K ? a / 980 : a / 470);
                uint16_t mh = f32_to_fp16(a / 63);
                memcpy(p + bb * b + (t == LLMI_Q6_K ? 208 : 0), &dh, 2);
                if (t != LLMI_Q6_K) memcpy(p + bb * b + 2, &mh, 2);
            }
        }
    }
    w.data = d;
    w.owned = d;
    return w;
}

static float *tvec(brng *r, int n, float base, float amp) {
    float *v = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) v[i] = base + amp * brng_unif(r);
    return v;
}

/* A model of 4 heads (2 KV heads) of dim / 4 and ffn_dim ffn, its weights in dtypes dt:
 * the embedding, the lm_head, then each layer's q, k, v, o, gate, up, down. */
static void tiny_model_of(llmi_model *m, brng *r, int n_layers, int dim, int ffn, const llmi_dtype dt[9]) {
    memset(m, 0, sizeof *m);
    llmi_config *c = &m->cfg;
    c->n_vocab = 53; c->dim = dim; c->n_layers = n_layers; c->n_heads = 4; c->n_kv_heads = 2; c->head_dim = dim / 4;
    c->ffn_dim = ffn; c->max_ctx = 256; c->norm_eps = 1e-5f; c->rope_theta = 10000.0f; c->rope_dim = dim / 4;
    m->tok_embd = tw(r, dt[0], c->n_vocab, c->dim);
    m->lm_head = tw(r, dt[1], c->n_vocab, c->dim);
    m->out_norm = tvec(r, c->dim, 1.0f, 0.2f);
    m->layers = calloc(n_layers, sizeof(llmi_layer));
    for (int l = 0; l < n_layers; l++) {
        llmi_layer *L = &m->layers[l];
        L->attn_norm = tvec(r, c->dim, 1.0f, 0.2f);
        L->ffn_norm = tvec(r, c->dim, 1.0f, 0.2f);
        L->wq = tw(r, dt[2], dim, dim); L->wk = tw(r, dt[3], dim / 2, dim); L->wv = tw(r, dt[4], dim / 2, dim);
        L->wo = tw(r, dt[5], dim, dim);
        L->w_gate = tw(r, dt[6], ffn, dim); L->w_up = tw(r, dt[7], ffn, dim); L->w_down = tw(r, dt[8], dim, ffn);
    }
}

static void tiny_model(llmi_model *m, brng *r, int n_layers, llmi_dtype t) {
    const llmi_dtype dt[9] = {t, t, t, t, t, t, t, t, t};
    tiny_model_of(m, r, n_layers, 64, 96, dt);
}

/* The same with a mixture of 6 experts of ffn 32, 2 per token, in every layer (stacked as
 * model.h lays them out), and an f32 router scaled up so its choices are clear. */
static void tiny_moe_model(llmi_model *m, brng *r, int n_layers, llmi_dtype t) {
    tiny_model(m, r, n_layers, t);
    llmi_config *c = &m->cfg;
    c->n_experts = 6; c->n_experts_used = 2; c->moe_norm_topk = true; c->ffn_dim = 32;
    for (int l = 0; l < n_layers; l++) {
        llmi_layer *L = &m->layers[l];
        free(L->w_gate.owned); free(L->w_up.owned); free(L->w_down.owned);
        L->w_gate = tw(r, t, 6 * 32, c->dim); L->w_up = tw(r, t, 6 * 32, c->dim); L->w_down = tw(r, t, 6 * c->dim, 32);
        L->w_router = tw(r, LLMI_F32, 6, c->dim);
        float *rw = L->w_router.owned;
        for (int i = 0; i < 6 * c->dim; i++) rw[i] *= 8.0f;
    }
}

/* As llama-quantize's Q4_K_M mixes them: Q4_K, with Q6_K for the lm_head, v and down (and
 * here one Q8_0 and one Q5_K), so that one layer's matmuls share activations across k-quants
 * and a Q8_0. */
static void tiny_model_kquant(llmi_model *m, brng *r, int n_layers) {
    const llmi_dtype dt[9] = {LLMI_Q4_K, LLMI_Q6_K, LLMI_Q4_K, LLMI_Q8_0, LLMI_Q6_K,
                              LLMI_Q5_K, LLMI_Q4_K, LLMI_Q4_K, LLMI_Q6_K};
    tiny_model_of(m, r, n_layers, 256, 512, dt);
}

static void tiny_free(llmi_model *m) {
    free(m->tok_embd.owned); free(m->lm_head.owned); free(m->out_norm);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        llmi_layer *L = &m->layers[l];
        free(L->attn_norm); free(L->ffn_norm);
        free(L->wq.owned); free(L->wk.owned); free(L->wv.owned); free(L->wo.owned);
        free(L->w_gate.owned); free(L->w_up.owned); free(L->w_down.owned); free(L->w_router.owned);
    }
    free(m->layers);
}

/* dst = src with every weight dequantized to f32 (tensor_dequant_row) and its own copies
 * of the norms (tiny_free frees both). */
static void tiny_dequantized(const llmi_model *src, llmi_model *dst) {
    *dst = *src;
    const int D = src->cfg.dim;
    const llmi_tensor *from[7] = {&src->tok_embd, &src->lm_head};
    llmi_tensor *to[7] = {&dst->tok_embd, &dst->lm_head};
    dst->layers = calloc((size_t)src->cfg.n_layers, sizeof(llmi_layer));
    dst->out_norm = malloc(sizeof(float) * D);
    memcpy(dst->out_norm, src->out_norm, sizeof(float) * D);
    for (int l = -1; l < src->cfg.n_layers; l++) {
        int nt = 2;
        if (l >= 0) {
            const llmi_layer *S = &src->layers[l];
            llmi_layer *L = &dst->layers[l];
            const llmi_tensor *sf[7] = {&S->wq, &S->wk, &S->wv, &S->wo, &S->w_gate, &S->w_up, &S->w_down};
            llmi_tensor *st[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) from[i] = sf[i], to[i] = st[i];
            nt = 7;
            L->attn_norm = malloc(sizeof(float) * D);
            L->ffn_norm = malloc(sizeof(float) * D);
            memcpy(L->attn_norm, S->attn_norm, sizeof(float) * D);
            memcpy(L->ffn_norm, S->ffn_norm, sizeof(float) * D);
        }
        for (int i = 0; i < nt; i++) {
            llmi_tensor w = {.dtype = LLMI_F32, .rows = from[i]->rows, .cols = from[i]->cols,
                             .row_bytes = sizeof(float) * (size_t)from[i]->cols};
            float *d = malloc(w.row_bytes * (size_t)w.rows);   /* (rows, cols) */
            for (int64_t row = 0; row < w.rows; row++) tensor_dequant_row(from[i], row, d + (size_t)row * w.cols);
            w.data = w.owned = d;
            *to[i] = w;
        }
    }
}

#define BS 4
#define MAXB 16
/* One sequence's view for building batches: its tokens and its block table. */
typedef struct { const int32_t *tok; int32_t table[MAXB]; } tseq;

/* Runs one forward over pieces [start, start+len) of several sequences; logits for
 * every token of the batch, in batch order. */
static int run_pieces(llmi_backend *b, tseq *seqs, const int *which, const int *start, const int *len, int np,
                      float *logits, llmi_status *st) {
    int32_t tokens[64], pos[64], slot[64], sot[64], qs[9], tables[8 * MAXB], rows[64];
    int n = 0;
    qs[0] = 0;
    for (int p = 0; p < np; p++) {
        tseq *s = &seqs[which[p]];
        memcpy(tables + p * MAXB, s->table, sizeof s->table);
        for (int i = 0; i < len[p]; i++, n++) {
            tokens[n] = s->tok[start[p] + i];
            pos[n] = start[p] + i;
            slot[n] = s->table[pos[n] / BS] * BS + pos[n] % BS;
            sot[n] = p;
            rows[n] = n;
        }
        qs[p + 1] = n;
    }
    llmi_batch bt = {n, tokens, pos, slot, sot, np, qs, tables, MAXB, n, rows};
    return b->forward(b, &bt, logits, st);
}

static void deal_blocks(brng *r, tseq *seqs, int ns, int nblocks) {
    int perm[256];
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    for (int i = nblocks - 1; i > 0; i--) { int j = (int)(brng_next(r) % (uint64_t)(i + 1)); int t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int s = 0; s < ns; s++) memcpy(seqs[s].table, perm + s * MAXB, sizeof seqs[s].table);
}

static int argmax(const float *v, int n) {
    int a = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[a]) a = i;
    return a;
}

TEST(backend_cpu_batch_invariance) {
    unsigned long long seed = test_seed();
    for (int variant = 0; variant < 4; variant++) {   /* dense f32, dense Q4_1, MoE f32, MoE Q4_1 */
        const int dt = variant & 1;
        const bool moe = variant >= 2;
        brng r = {seed + (unsigned)variant};
        llmi_model m;
        if (moe) tiny_moe_model(&m, &r, 2, dt ? LLMI_Q4_1 : LLMI_F32);
        else tiny_model(&m, &r, 2, dt ? LLMI_Q4_1 : LLMI_F32);
        llmi_backend_opts o = {0};
        o.n_threads = 2; o.kv_dtype = dt ? LLMI_KV_F16 : LLMI_KV_F32; o.block_size = BS;
        o.max_batch_tokens = 64; o.max_seqs = 8;
        llmi_backend *b = NULL;
        llmi_status st = {0};
        CHECK(backend_cpu_create(&m, &o, &b, &st) == 0);
        if (!b) { fprintf(stderr, "  %s\n", st.msg); tiny_free(&m); return; }
        CHECK(b->kv_block_bytes(b) == (size_t)2 * 2 * BS * 2 * 16 * (dt ? 2 : 4));
        CHECK(b->kv_budget_bytes(b) > 0);
        CHECK(b->kv_alloc(b, 3 * MAXB, &st) == 0);
        int V = m.cfg.n_vocab, L = 29;
        int32_t toks[3][40];
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 40; i++) toks[s][i] = (int32_t)(brng_next(&r) % (uint64_t)V);
        tseq seqs[3] = {{toks[0], {0}}, {toks[1], {0}}, {toks[2], {0}}};
        float *ref = malloc(sizeof(float) * 64 * V), *got = malloc(sizeof(float) * 64 * V);
        float *cmp = malloc(sizeof(float) * L * V);
        deal_blocks(&r, seqs, 3, 3 * MAXB);
        int w0 = 0, s0 = 0;
        CHECK(run_pieces(b, seqs, &w0, &s0, &L, 1, ref, &st) == 0);
        double worst = 0;
        int argmax_bad = 0;
        const int chunks[3] = {1, 3, 16};
        for (int ci = 0; ci < 4; ci++) {
            deal_blocks(&r, seqs, 3, 3 * MAXB);   /* fresh physical blocks each scenario */
            for (int p = 0; p < L;) {
                int c = ci < 3 ? chunks[ci] : 5;
                if (p + c > L) c = L - p;
                if (ci < 3) {
                    CHECK(run_pieces(b, seqs, &w0, &p, &c, 1, got, &st) == 0);
                    memcpy(cmp + (size_t)p * V, got, sizeof(float) * c * V);
                } else {
                    /* mixed: seq 1 prefill piece, our chunk, seq 2 decode token */
                    int which[3] = {1, 0, 2}, start[3] = {p, p, p}, len[3] = {c + 2 < 40 - p ? c + 2 : 40 - p, c, 1};
                    CHECK(run_pieces(b, seqs, which, start, len, 3, got, &st) == 0);
                    memcpy(cmp + (size_t)p * V, got + (size_t)len[0] * V, sizeof(float) * c * V);
                }
                p += c;
            }
            for (int i = 0; i < L; i++) {
                for (int j = 0; j < V; j++) worst = fmax(worst, fabs(cmp[(size_t)i * V + j] - ref[(size_t)i * V + j]));
                argmax_bad += argmax(cmp + (size_t)i * V, V) != argmax(ref + (size_t)i * V, V);
            }
        }
        CHECK_MSG(worst < 1e-5, "%s%s: logits differ by %g across batchings", dt ? "Q4_1" : "F32", moe ? " MoE" : "",
                  worst);
        CHECK_MSG(argmax_bad == 0, "%s%s: %d argmax changes across batchings", dt ? "Q4_1" : "F32", moe ? " MoE" : "",
                  argmax_bad);
        if (moe) printf("  MoE %s: max |logit diff| across batchings %g\n", dt ? "Q4_1" : "F32", worst);
        if (st.code) fprintf(stderr, "  %s\n", st.msg);
        /* a batch beyond the workspaces fails cleanly */
        llmi_status st2 = {0};
        int32_t bad_tok = V;
        int32_t pos0 = 0, slot0 = 0, sot0 = 0, qs[2] = {0, 1}, row0 = 0;
        llmi_batch bb = {65, &bad_tok, &pos0, &slot0, &sot0, 1, qs, seqs[0].table, MAXB, 1, &row0};
        CHECK(b->forward(b, &bb, got, &st2) != 0 && strstr(st2.msg, "max_batch_tokens"));
        llmi_status_clear(&st2);
        bb.n_tokens = 1;
        CHECK(b->forward(b, &bb, got, &st2) != 0 && strstr(st2.msg, "vocab"));
        llmi_status_clear(&st2);
        bad_tok = 0;
        slot0 = 3 * MAXB * BS;
        CHECK(b->forward(b, &bb, got, &st2) != 0 && strstr(st2.msg, "slot"));
        free(ref); free(got); free(cmp);
        b->destroy(b);
        tiny_free(&m);
    }
}

/* Decode-sized batches (at most 8 tokens) take the fused one-region forward (cpu/step.c),
 * larger ones the op-by-op forward: both, with 1, 2 or 3 threads (3 > n_kv_heads: a
 * thread owns no kv head), give bit-identical logits for the same tokens, for dense and
 * mixture-of-experts models. */
TEST(backend_cpu_step_bit_identical) {
    unsigned long long seed = test_seed();
    const char *names[5] = {"F32", "Q4_1", "k-quant mix", "MoE F32", "MoE Q4_1"};
    for (int dt = 0; dt < 5; dt++) {
        brng r = {seed + 7u + (unsigned)dt};
        llmi_model m;
        if (dt == 2) tiny_model_kquant(&m, &r, 2);
        else if (dt >= 3) tiny_moe_model(&m, &r, 2, dt == 4 ? LLMI_Q4_1 : LLMI_F32);
        else tiny_model(&m, &r, 2, dt ? LLMI_Q4_1 : LLMI_F32);
        int V = m.cfg.n_vocab, L = 24;
        int32_t toks[2][40];
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 40; i++) toks[s][i] = (int32_t)(brng_next(&r) % (uint64_t)V);
        float *ref = malloc(sizeof(float) * 64 * V), *got = malloc(sizeof(float) * 64 * V);
        for (int nt = 1; nt <= 3; nt++) {
            llmi_backend_opts o = {0};
            o.n_threads = nt; o.kv_dtype = LLMI_KV_F16; o.block_size = BS; o.max_batch_tokens = 64; o.max_seqs = 8;
            llmi_backend *b = NULL;
            llmi_status st = {0};
            CHECK(backend_cpu_create(&m, &o, &b, &st) == 0);
            if (!b) break;
            CHECK(b->kv_alloc(b, 2 * MAXB, &st) == 0);
            tseq seqs[2] = {{toks[0], {0}}, {toks[1], {0}}};
            deal_blocks(&r, seqs, 2, 2 * MAXB);
            int w0 = 0, s0 = 0;
            if (nt == 1) CHECK(run_pieces(b, seqs, &w0, &s0, &L, 1, ref, &st) == 0);   /* 24 tokens: op by op */
            deal_blocks(&r, seqs, 2, 2 * MAXB);
            int bad = 0, p1 = 0;   /* p1: the other sequence's next position */
            for (int p = 0; p < L;) {
                int c = p < 8 ? 8 : (p < 14 ? 3 : 1);   /* every piece fused: at most 8 tokens with the other seq's */
                int which[2] = {1, 0}, start[2] = {p1, p}, len[2] = {c > 4 ? 0 : 1, c};
                p1 += len[0];
                CHECK(run_pieces(b, seqs, which + (len[0] == 0), start, len + (len[0] == 0), len[0] ? 2 : 1, got, &st) == 0);
                bad += memcmp(got + (size_t)len[0] * V, ref + (size_t)p * V, sizeof(float) * c * V) != 0;
                p += c;
            }
            CHECK_MSG(bad == 0, "%s, %d threads: %d fused steps differ from the op-by-op forward", names[dt], nt, bad);
            b->destroy(b);
        }
        free(ref); free(got);
        tiny_free(&m);
    }
}

/* The backend packs the model's Q4_1 weights once, and again when a tensor at some
 * position is replaced under it (the quantizer's calibration swaps layers and tensors under
 * a live backend): after swapping two layer weights and the lm_head for another model's,
 * both forwards (op by op: 12 tokens; fused: 1 token) give exactly what a backend created on
 * the changed model gives, and not what they gave before. */
TEST(backend_cpu_repacks_changed_weights) {
    unsigned long long seed = test_seed();
    brng r = {seed + 41u};
    llmi_model m, other;
    tiny_model(&m, &r, 2, LLMI_Q4_1);
    tiny_model(&other, &r, 2, LLMI_Q4_1);
    const int V = m.cfg.n_vocab, L = 12;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(brng_next(&r) % (uint64_t)V);
    llmi_backend_opts o = {0};
    o.n_threads = 2; o.kv_dtype = LLMI_KV_F16; o.block_size = BS; o.max_batch_tokens = 64; o.max_seqs = 8;
    float *before = malloc(sizeof(float) * 16 * V), *after = malloc(sizeof(float) * 16 * V);
    float *fresh = malloc(sizeof(float) * 16 * V);
    llmi_backend *b = NULL, *b2 = NULL;
    llmi_status st = {0};
    CHECK(backend_cpu_create(&m, &o, &b, &st) == 0);
    if (!b) { tiny_free(&m); tiny_free(&other); return; }
    CHECK(b->kv_alloc(b, MAXB, &st) == 0);
    tseq seq = {toks, {0}};
    for (int i = 0; i < MAXB; i++) seq.table[i] = i;
    int w0 = 0, s0 = 0, one = 1, at = L;
    /* before: 12 tokens op by op, then token 12 fused */
    CHECK(run_pieces(b, &seq, &w0, &s0, &L, 1, before, &st) == 0);
    CHECK(run_pieces(b, &seq, &w0, &at, &one, 1, before + (size_t)L * V, &st) == 0);
    llmi_tensor keep[3] = {m.layers[1].wq, m.layers[0].w_down, m.lm_head};
    m.layers[1].wq = other.layers[1].wq;
    m.layers[0].w_down = other.layers[0].w_down;
    m.lm_head = other.lm_head;
    CHECK(run_pieces(b, &seq, &w0, &s0, &L, 1, after, &st) == 0);
    CHECK(run_pieces(b, &seq, &w0, &at, &one, 1, after + (size_t)L * V, &st) == 0);
    CHECK(backend_cpu_create(&m, &o, &b2, &st) == 0);
    if (b2) {
        CHECK(b2->kv_alloc(b2, MAXB, &st) == 0);
        CHECK(run_pieces(b2, &seq, &w0, &s0, &L, 1, fresh, &st) == 0);
        CHECK(run_pieces(b2, &seq, &w0, &at, &one, 1, fresh + (size_t)L * V, &st) == 0);
        CHECK_MSG(memcmp(after, fresh, sizeof(float) * (L + 1) * V) == 0,
                  "the live backend's logits after the swap differ from a new backend's");
        CHECK_MSG(memcmp(after, before, sizeof(float) * (L + 1) * V) != 0, "the swap changed nothing");
        b2->destroy(b2);
    }
    m.layers[1].wq = keep[0];
    m.layers[0].w_down = keep[1];
    m.lm_head = keep[2];
    b->destroy(b);
    free(before); free(after); free(fresh);
    tiny_free(&m);
    tiny_free(&other);
}

/* A backend drops the pages of a model file's weights once it has packed them (they fault
 * back in from the file), never --dummy's: that memory holds the only copy, and dropped
 * anonymous pages come back as zeros, so the next backend on the same model (bench opens one
 * per KV type and block size, a draft model another) would pack zeros. */
TEST(backend_cpu_keeps_dummy_weights) {
    const llmi_dtype dts[3] = {LLMI_Q8_0, LLMI_Q4_0, LLMI_Q4_1};
    for (int k = 0; k < 3; k++) {
        llmi_status st = {0};
        llmi_model m, ref;
        if (model_load_dummy("smollm2-135m", dts[k], 0, &m, &st)) {
            CHECK_MSG(false, "%s", st.msg);
            continue;
        }
        CHECK(model_load_dummy("smollm2-135m", dts[k], 0, &ref, &st) == 0);
        CHECK(!model_weights_from_file(&m));
        llmi_backend_opts o = {0};
        o.n_threads = 2; o.kv_dtype = LLMI_KV_F16; o.block_size = BS; o.max_batch_tokens = 16; o.max_seqs = 2;
        llmi_backend *b = NULL;
        CHECK(backend_cpu_create(&m, &o, &b, &st) == 0);
        if (b) b->destroy(b);
        int bad = 0;
        for (int l = 0; l < m.cfg.n_layers; l++) {
            const llmi_tensor *a = &m.layers[l].w_down, *r = &ref.layers[l].w_down;
            bad += memcmp(a->data, r->data, a->row_bytes * (size_t)a->rows) != 0;
        }
        CHECK_MSG(bad == 0, "%s: %d layers' down_proj changed under the backend", dtype_name(dts[k]), bad);
        model_free(&m);
        model_free(&ref);
    }
}

/* Dense double-precision Llama forward for one sequence: logits (n, vocab). */
static void dense_ref(const llmi_model *m, const int32_t *tok, int n, double *logits) {
    const llmi_config *c = &m->cfg;
    int D = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, F = c->ffn_dim, V = c->n_vocab;
    double *x = calloc((size_t)n * D, 8), *xn = calloc((size_t)n * D, 8), *q = calloc((size_t)n * H * hd, 8);
    double *k = calloc((size_t)n * KV * hd, 8), *v = calloc((size_t)n * KV * hd, 8), *a = calloc((size_t)n * H * hd, 8);
    double *g = calloc((size_t)n * F, 8), *u = calloc((size_t)n * F, 8), *sc = calloc((size_t)n, 8);
#define W(t, r, cc) ((double)((const float *)(t).data)[(size_t)(r) * (t).cols + (cc)])
    for (int i = 0; i < n; i++) for (int j = 0; j < D; j++) x[i * D + j] = W(m->tok_embd, tok[i], j);
    for (int l = 0; l < c->n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        for (int pass = 0; pass < 2; pass++) {
            const float *nw = pass ? L->ffn_norm : L->attn_norm;
            for (int i = 0; i < n; i++) {
                double ss = 0;
                for (int j = 0; j < D; j++) ss += x[i * D + j] * x[i * D + j];
                double s = 1 / sqrt(ss / D + c->norm_eps);
                for (int j = 0; j < D; j++) xn[i * D + j] = x[i * D + j] * s * nw[j];
            }
            if (pass == 0) {
                for (int i = 0; i < n; i++) {
                    for (int o = 0; o < H * hd; o++) { double s = 0; for (int j = 0; j < D; j++) s += W(L->wq, o, j) * xn[i * D + j]; q[i * H * hd + o] = s; }
                    for (int o = 0; o < KV * hd; o++) {
                        double s = 0, s2 = 0;
                        for (int j = 0; j < D; j++) { s += W(L->wk, o, j) * xn[i * D + j]; s2 += W(L->wv, o, j) * xn[i * D + j]; }
                        k[i * KV * hd + o] = s; v[i * KV * hd + o] = s2;
                    }
                    for (int h = 0; h < H + KV; h++) {
                        double *vec = h < H ? q + (i * H + h) * hd : k + (i * KV + h - H) * hd;
                        for (int j = 0; j < hd / 2; j++) {
                            double ang = i * pow(c->rope_theta, -2.0 * j / hd), x0 = vec[j], x1 = vec[j + hd / 2];
                            vec[j] = x0 * cos(ang) - x1 * sin(ang);
                            vec[j + hd / 2] = x1 * cos(ang) + x0 * sin(ang);
                        }
                    }
                }
                for (int i = 0; i < n; i++)
                    for (int h = 0; h < H; h++) {
                        int kh = h / (H / KV);
                        double mx = -INFINITY, sum = 0;
                        for (int p = 0; p <= i; p++) {
                            double s = 0;
                            for (int j = 0; j < hd; j++) s += q[(i * H + h) * hd + j] * k[(p * KV + kh) * hd + j];
                            sc[p] = s / sqrt((double)hd);
                            mx = fmax(mx, sc[p]);
                        }
                        for (int p = 0; p <= i; p++) sum += (sc[p] = exp(sc[p] - mx));
                        for (int j = 0; j < hd; j++) {
                            double o = 0;
                            for (int p = 0; p <= i; p++) o += sc[p] / sum * v[(p * KV + kh) * hd + j];
                            a[(i * H + h) * hd + j] = o;
                        }
                    }
                for (int i = 0; i < n; i++)
                    for (int o = 0; o < D; o++) { double s = 0; for (int j = 0; j < H * hd; j++) s += W(L->wo, o, j) * a[i * H * hd + j]; x[i * D + o] += s; }
            } else {
                for (int i = 0; i < n; i++) {
                    for (int o = 0; o < F; o++) {
                        double s = 0, s2 = 0;
                        for (int j = 0; j < D; j++) { s += W(L->w_gate, o, j) * xn[i * D + j]; s2 += W(L->w_up, o, j) * xn[i * D + j]; }
                        g[i * F + o] = s / (1 + exp(-s)) * s2;
                    }
                    for (int o = 0; o < D; o++) { double s = 0; for (int j = 0; j < F; j++) s += W(L->w_down, o, j) * g[i * F + j]; x[i * D + o] += s; }
                }
            }
        }
    }
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += x[i * D + j] * x[i * D + j];
        double s = 1 / sqrt(ss / D + c->norm_eps);
        for (int j = 0; j < D; j++) xn[i * D + j] = x[i * D + j] * s * m->out_norm[j];
        for (int o = 0; o < V; o++) { double t = 0; for (int j = 0; j < D; j++) t += W(m->lm_head, o, j) * xn[i * D + j]; logits[i * V + o] = t; }
    }
#undef W
    free(x); free(xn); free(q); free(k); free(v); free(a); free(g); free(u); free(sc);
}

TEST(backend_cpu_one_layer_vs_dense_reference) {
    brng r = {test_seed() ^ 0x51ull};
    llmi_model m;
    tiny_model(&m, &r, 1, LLMI_F32);
    llmi_backend_opts o = {0};
    o.n_threads = 2; o.kv_dtype = LLMI_KV_F32; o.block_size = BS; o.max_batch_tokens = 64; o.max_seqs = 2;
    llmi_backend *b = NULL;
    llmi_status st = {0};
    CHECK(backend_cpu_create(&m, &o, &b, &st) == 0);
    if (!b) { fprintf(stderr, "  %s\n", st.msg); tiny_free(&m); return; }
    CHECK(b->kv_alloc(b, MAXB, &st) == 0);
    int n = 37, V = m.cfg.n_vocab;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(brng_next(&r) % (uint64_t)V);
    tseq s = {toks, {0}};
    deal_blocks(&r, &s, 1, MAXB);
    float *got = malloc(sizeof(float) * 64 * V), *reff = malloc(sizeof(float) * n * V);
    double *ref = malloc(sizeof(double) * n * V);
    int w0 = 0, s0 = 0;
    b->profiling = true;
    CHECK(run_pieces(b, &s, &w0, &s0, &n, 1, got, &st) == 0);
    CHECK(b->stats.calls[LLMI_OP_ATTN] == 1 && b->stats.flops[LLMI_OP_QKV] > 0 && b->stats.seconds[LLMI_OP_MLP_UP] > 0);
    dense_ref(&m, toks, n, ref);
    for (int i = 0; i < n * V; i++) reff[i] = (float)ref[i];
    double e = test_nmse(got, reff, (long)n * V);
    CHECK_MSG(e < 1e-10, "1-layer forward NMSE %g vs dense reference", e);
    free(got); free(reff); free(ref);
    b->destroy(b);
    tiny_free(&m);
}

/* A k-quant model (Q4_K_M's mix, tiny_model_kquant) against the same model with every
 * weight dequantized to f32 by the reference that matches gguf-py: the same logits but for
 * the int8 activations' rounding (~1.6e-5 relative MSE per matmul, 2-4e-4 on these logits,
 * as for a Q4_1 model of these shapes; a misread code or scale gives ~1). */
TEST(backend_cpu_kquant_vs_dequantized) {
    brng r = {test_seed() ^ 0x6b71ull};
    llmi_model m, f;
    tiny_model_kquant(&m, &r, 2);
    tiny_dequantized(&m, &f);
    const int V = m.cfg.n_vocab;
    int n = 24;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (int32_t)(brng_next(&r) % (uint64_t)V);
    float *got[2] = {malloc(sizeof(float) * 64 * V), malloc(sizeof(float) * 64 * V)};
    for (int k = 0; k < 2; k++) {
        llmi_backend_opts o = {0};
        o.n_threads = 2; o.kv_dtype = LLMI_KV_F32; o.block_size = BS; o.max_batch_tokens = 64; o.max_seqs = 2;
        llmi_backend *b = NULL;
        llmi_status st = {0};
        CHECK(backend_cpu_create(k ? &f : &m, &o, &b, &st) == 0);
        if (!b) { fprintf(stderr, "  %s\n", st.msg); break; }
        CHECK(b->kv_alloc(b, MAXB, &st) == 0);
        tseq s = {toks, {0}};
        for (int i = 0; i < MAXB; i++) s.table[i] = i;
        int w0 = 0, s0 = 0;
        CHECK(run_pieces(b, &s, &w0, &s0, &n, 1, got[k], &st) == 0);
        b->destroy(b);
    }
    double e = test_nmse(got[0], got[1], (long)n * V);
    fprintf(stderr, "  k-quant model vs its f32 dequantization: logits NMSE %.2e\n", e);
    CHECK_MSG(e < 1e-3, "logits NMSE %g", e);
    free(got[0]); free(got[1]);
    tiny_free(&m);
    tiny_free(&f);
}
