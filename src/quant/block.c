/* block.c — the quantizers' fp32 working copy of a layer and their dense algebra (see block.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/block.h"

const char *const quant_linear_names[QL_COUNT] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

void quant_linear_shape(const llmi_config *c, int which, int *rows, int *cols) {
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    switch (which) {
    case QL_Q: *rows = q, *cols = c->dim; break;
    case QL_K: case QL_V: *rows = kv, *cols = c->dim; break;
    case QL_O: *rows = c->dim, *cols = q; break;
    case QL_GATE: case QL_UP: *rows = c->ffn_dim, *cols = c->dim; break;
    default: *rows = c->dim, *cols = c->ffn_dim; break;
    }
}

static float *qc_dequant(const llmi_tensor *t) {
    float *out = malloc((size_t)t->rows * t->cols * sizeof(float));
    if (!out) return NULL;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < t->rows; r++) tensor_dequant_row(t, r, out + (size_t)r * t->cols);
    return out;
}

static float *qc_copy(const float *v, int n) {
    if (!v) return NULL;
    float *o = malloc((size_t)n * sizeof(float));
    if (o) memcpy(o, v, (size_t)n * sizeof(float));
    return o;
}

int quant_block_load(const llmi_model *m, int l, quant_block *b, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    const llmi_layer *L = &m->layers[l];
    const llmi_tensor *src[QL_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    memset(b, 0, sizeof *b);
    int ok = 1;
    for (int i = 0; i < QL_COUNT; i++) {
        int rows, cols;
        quant_linear_shape(c, i, &rows, &cols);
        if (src[i]->rows != rows || src[i]->cols != cols) {
            quant_block_free(b);
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d %s is %lldx%lld, expected %dx%d", l,
                             quant_linear_names[i], (long long)src[i]->rows, (long long)src[i]->cols, rows, cols);
        }
        b->w[i] = qc_dequant(src[i]);
        ok &= b->w[i] != NULL;
    }
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    b->attn_norm = qc_copy(L->attn_norm, c->dim);
    b->ffn_norm = qc_copy(L->ffn_norm, c->dim);
    ok &= b->attn_norm && b->ffn_norm;
    if (L->bq) ok &= (b->bq = qc_copy(L->bq, q)) != NULL;
    if (L->bk) ok &= (b->bk = qc_copy(L->bk, kv)) != NULL;
    if (L->bv) ok &= (b->bv = qc_copy(L->bv, kv)) != NULL;
    if (!ok) {
        quant_block_free(b);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory dequantizing layer %d", l);
    }
    return 0;
}

void quant_block_free(quant_block *b) {
    for (int i = 0; i < QL_COUNT; i++) free(b->w[i]);
    free(b->attn_norm), free(b->ffn_norm), free(b->bq), free(b->bk), free(b->bv);
    memset(b, 0, sizeof *b);
}

/* ---- sgemm: panels of 16 output columns, 4 rows of x at a time -------------------- */
#define QC_NR 16
#define QC_MR 4
#define QC_NB 128

void quant_sgemm_nt(const float *x, int n, int k, const float *w, int m, const float *bias, float *y) {
    int n_panels = (m + QC_NR - 1) / QC_NR;
    float *wt = malloc((size_t)n_panels * k * QC_NR * sizeof(float)); /* (panels, k, 16) packed W^T */
    if (!wt) { /* no scratch: plain dot products */
#pragma omp parallel for schedule(static)
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                float a = bias ? bias[j] : 0.0f;
                for (int p = 0; p < k; p++) a += x[(size_t)i * k + p] * w[(size_t)j * k + p];
                y[(size_t)i * m + j] = a;
            }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int pn = 0; pn < n_panels; pn++)
        for (int p = 0; p < k; p++)
            for (int j = 0; j < QC_NR; j++) {
                int col = pn * QC_NR + j;
                wt[((size_t)pn * k + p) * QC_NR + j] = col < m ? w[(size_t)col * k + p] : 0.0f;
            }
    int n_rb = (n + QC_NB - 1) / QC_NB;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int rb = 0; rb < n_rb; rb++)
        for (int pn = 0; pn < n_panels; pn++) {
            const float *wp = wt + (size_t)pn * k * QC_NR;
            int i0 = rb * QC_NB, i1 = i0 + QC_NB < n ? i0 + QC_NB : n;
            int c0 = pn * QC_NR, nc = m - c0 < QC_NR ? m - c0 : QC_NR;
            for (int i = i0; i < i1; i += QC_MR) {
                int nr = i1 - i < QC_MR ? i1 - i : QC_MR;
                float acc[QC_MR][QC_NR] = {{0}};
                const float *x0 = x + (size_t)i * k;
                if (nr == QC_MR) {
                    for (int p = 0; p < k; p++) {
                        const float *wv = wp + (size_t)p * QC_NR;
                        float a0 = x0[p], a1 = x0[k + p], a2 = x0[2 * (size_t)k + p], a3 = x0[3 * (size_t)k + p];
                        for (int j = 0; j < QC_NR; j++) {
                            acc[0][j] += a0 * wv[j];
                            acc[1][j] += a1 * wv[j];
                            acc[2][j] += a2 * wv[j];
                            acc[3][j] += a3 * wv[j];
                        }
                    }
                } else {
                    for (int r = 0; r < nr; r++)
                        for (int p = 0; p < k; p++) {
                            float a = x0[(size_t)r * k + p];
                            for (int j = 0; j < QC_NR; j++) acc[r][j] += a * wp[(size_t)p * QC_NR + j];
                        }
                }
                for (int r = 0; r < nr; r++)
                    for (int j = 0; j < nc; j++)
                        y[(size_t)(i + r) * m + c0 + j] = acc[r][j] + (bias ? bias[c0 + j] : 0.0f);
            }
        }
    free(wt);
}

void quant_gram_acc(const float *x, int n, int k, float scale, float *h) {
    float *xt = malloc((size_t)n * k * sizeof(float));      /* (k, n) */
    float *tmp = malloc((size_t)k * k * sizeof(float));     /* (k, k) */
    if (!xt || !tmp) {
        free(xt), free(tmp);
#pragma omp parallel for schedule(static)
        for (int a = 0; a < k; a++)
            for (int i = 0; i < n; i++)
                for (int c = 0; c < k; c++) h[(size_t)a * k + c] += scale * x[(size_t)i * k + a] * x[(size_t)i * k + c];
        return;
    }
#pragma omp parallel for schedule(static)
    for (int a = 0; a < k; a++)
        for (int i = 0; i < n; i++) xt[(size_t)a * n + i] = x[(size_t)i * k + a];
    quant_sgemm_nt(xt, k, n, xt, k, NULL, tmp);
    for (size_t i = 0; i < (size_t)k * k; i++) h[i] += scale * tmp[i];
    free(xt), free(tmp);
}
