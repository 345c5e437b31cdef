/* block.c — the quantizers' fp32 working copy of a layer (see block.h). */
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

int quant_block_load_linears(const llmi_model *m, int l, int first, int last, quant_block *b, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    const llmi_layer *L = &m->layers[l];
    const llmi_tensor *src[QL_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = first; i < last; i++) {
        if (b->w[i]) continue;
        int rows, cols;
        quant_linear_shape(c, i, &rows, &cols);
        if (src[i]->rows != rows || src[i]->cols != cols)
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d %s is %lldx%lld, expected %dx%d", l,
                             quant_linear_names[i], (long long)src[i]->rows, (long long)src[i]->cols, rows, cols);
        if (!(b->w[i] = qc_dequant(src[i])))
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory dequantizing layer %d %s", l,
                             quant_linear_names[i]);
    }
    return 0;
}

void quant_block_drop_linear(quant_block *b, int which) {
    free(b->w[which]);
    b->w[which] = NULL;
}

int quant_block_load(const llmi_model *m, int l, int first, int last, quant_block *b, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    const llmi_layer *L = &m->layers[l];
    memset(b, 0, sizeof *b);
    int q = c->n_heads * c->head_dim, kv = c->n_kv_heads * c->head_dim;
    int ok = 1;
    b->attn_norm = qc_copy(L->attn_norm, c->dim);
    b->ffn_norm = qc_copy(L->ffn_norm, c->dim);
    ok &= b->attn_norm && b->ffn_norm;
    if (L->bq) ok &= (b->bq = qc_copy(L->bq, q)) != NULL;
    if (L->bk) ok &= (b->bk = qc_copy(L->bk, kv)) != NULL;
    if (L->bv) ok &= (b->bv = qc_copy(L->bv, kv)) != NULL;
    if (!ok) {
        quant_block_free(b);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory copying layer %d's norms", l);
    }
    if (quant_block_load_linears(m, l, first, last, b, st)) {
        quant_block_free(b);
        return st->code;
    }
    return 0;
}

void quant_block_free(quant_block *b) {
    for (int i = 0; i < QL_COUNT; i++) free(b->w[i]);
    free(b->attn_norm), free(b->ffn_norm), free(b->bq), free(b->bk), free(b->bv);
    memset(b, 0, sizeof *b);
}

void quant_source_release_layer(const llmi_model *m, int l) {
    const llmi_layer *L = &m->layers[l];
    const llmi_tensor *ts[QL_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < QL_COUNT; i++) model_release_pages(m, ts[i]->data, ts[i]->row_bytes * (size_t)ts[i]->rows);
}
