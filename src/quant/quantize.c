/* quant_model.c — owns the block-by-block quantization driver (see quant_model.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quant/awq.h"
#include "quant/quantize.h"

static double qm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void quant_result_free(quant_result *r) {
    for (int l = 0; l < r->n_layers; l++) {
        if (r->grids)
            for (int i = 0; i < QL_COUNT; i++) quant_grid_free(&r->grids[l][i]);
        if (r->attn_norm) free(r->attn_norm[l]);
        if (r->ffn_norm) free(r->ffn_norm[l]);
        for (int b = 0; b < 3; b++)
            if (r->bias[b]) free(r->bias[b][l]);
    }
    free(r->grids), free(r->attn_norm), free(r->ffn_norm);
    for (int b = 0; b < 3; b++) free(r->bias[b]);
    memset(r, 0, sizeof *r);
}

/* Replaces the fp32 weights with their dequantized grid: later stages see what the
 * quantized model will compute. */
static void qm_apply(quant_block *b, int i, const quant_grid *g) { quant_grid_dequant(g, b->w[i]); }

/* Relative output error |X(W-Q)^T|^2 / |XW^T|^2 through H. */
static double qm_rel_err(const float *w, const quant_grid *g, const float *h, llmi_status *st) {
    size_t n = (size_t)g->rows * g->cols;
    float *d = malloc(n * sizeof(float)), *t = malloc(n * sizeof(float));
    if (!d || !t) {
        free(d), free(t);
        return NAN;
    }
    quant_grid_dequant(g, d);
    double num = 0, den = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *v = d;
        if (pass == 0)
            for (size_t i = 0; i < n; i++) d[i] = w[i] - d[i];
        else
            v = w;
        quant_sgemm_nt(v, g->rows, g->cols, h, g->cols, NULL, t);
        double s = 0;
        for (size_t i = 0; i < n; i++) s += (double)v[i] * t[i];
        if (pass == 0) num = s; else den = s;
    }
    free(d), free(t);
    (void)st;
    return den > 0 ? num / den : 0.0;
}

/* g = X^T X / n and xm = mean |x| (cols) of input set k of layer l: from `in` when
 * given (no forward needed), else from x (n, cols); copied into `out` when given. */
static int qm_input_stats(int l, int k, const float *x, int n, int cols, const quant_stats *in, quant_stats *out,
                          float **g, float **xm, llmi_status *st) {
    *g = calloc((size_t)cols * cols, sizeof(float));
    *xm = calloc((size_t)cols, sizeof(float));
    if (!*g || !*xm) {
        free(*g), free(*xm);
        *g = *xm = NULL;
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for a %dx%d Hessian", cols, cols);
    }
    if (in) {
        memcpy(*g, in->gram[l][k], (size_t)cols * cols * sizeof(float));
        memcpy(*xm, in->xmean[l][k], (size_t)cols * sizeof(float));
    } else {
        quant_gram_acc(x, n, cols, 1.0f / (float)n, *g);
        for (int t = 0; t < n; t++)
            for (int c = 0; c < cols; c++) (*xm)[c] += fabsf(x[(size_t)t * cols + c]);
        for (int c = 0; c < cols; c++) (*xm)[c] /= (float)n;
    }
    if (out) {
        out->gram[l][k] = malloc((size_t)cols * cols * sizeof(float));
        out->xmean[l][k] = malloc((size_t)cols * sizeof(float));
        if (!out->gram[l][k] || !out->xmean[l][k]) {
            free(*g), free(*xm);
            *g = *xm = NULL;
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for statistics");
        }
        memcpy(out->gram[l][k], *g, (size_t)cols * cols * sizeof(float));
        memcpy(out->xmean[l][k], *xm, (size_t)cols * sizeof(float));
    }
    return 0;
}

/* GPTQ's H = 2 X^T X / n for set k. */
static int qm_hessian(int l, int k, const float *x, int n, int cols, const quant_stats *in, quant_stats *out,
                      float **h, llmi_status *st) {
    float *xm;
    if (qm_input_stats(l, k, x, n, cols, in, out, h, &xm, st)) return st->code;
    free(xm);
    for (size_t i = 0; i < (size_t)cols * cols; i++) (*h)[i] *= 2.0f;
    return 0;
}

/* GPTQ (or RTN when o->method == QUANT_RTN) on linears [first, last) of b that share h. */
static int qm_quantize_set(const llmi_config *c, quant_block *b, int first, int last, float *h, const quant_opts *o,
                           quant_grid *grids, double *errs, llmi_status *st) {
    int cols = 0;
    for (int i = first; i < last; i++) {
        int rows;
        quant_linear_shape(c, i, &rows, &cols);
        if (o->method == QUANT_GPTQ && h) {
            float *hc = malloc((size_t)cols * cols * sizeof(float));
            if (!hc) return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory");
            memcpy(hc, h, (size_t)cols * cols * sizeof(float));
            quant_gptq_opts go = {.group_size = o->group_size, .sym = o->sym, .desc_act = o->desc_act,
                                  .damp_percent = o->damp_percent, .block_size = 128};
            double loss;
            int rc = quant_gptq(b->w[i], rows, cols, hc, &go, &grids[i], &loss, st);
            free(hc);
            if (rc) return rc;
        } else {
            quant_style style = o->method == QUANT_AWQ ? QUANT_STYLE_AWQ : QUANT_STYLE_GPTQ;
            if (quant_rtn(b->w[i], rows, cols, o->group_size, o->method == QUANT_AWQ ? false : o->sym, style,
                          &grids[i], st))
                return st->code;
        }
        errs[i] = h ? qm_rel_err(b->w[i], &grids[i], h, st) : NAN;
        qm_apply(b, i, &grids[i]);
    }
    return 0;
}

static void qm_progress(const quant_opts *o, int l, int n_layers, const double *errs, double secs) {
    if (!o->progress) return;
    fprintf(o->progress, "quantize: layer %2d/%d", l + 1, n_layers);
    static const char *const short_names[QL_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    for (int i = 0; i < QL_COUNT; i++)
        if (!isnan(errs[i])) fprintf(o->progress, " %s %.2e", short_names[i], errs[i]);
    fprintf(o->progress, "  (rel. output error; %.1fs)\n", secs);
    fflush(o->progress);
}

/* AWQ on one block: scales per group, folded into the previous op, clipping, then RTN. */
static int qm_awq_block(const llmi_config *c, int l, quant_block *b, const quant_acts *a, const quant_stats *in,
                        quant_stats *out, const quant_opts *o, quant_grid *grids, double *errs, llmi_status *st) {
    struct { int prev; int first, last; const float *x; int cols; } groups[4] = {
        {-1, QL_Q, QL_V + 1, a->x_attn, c->dim},
        {QL_V, QL_O, QL_O + 1, a->x_o, c->n_heads * c->head_dim},
        {-2, QL_GATE, QL_UP + 1, a->x_mlp, c->dim},
        {QL_UP, QL_DOWN, QL_DOWN + 1, a->gate, c->ffn_dim},
    }; /* the x pointers are unused (NULL acts) when statistics come from `in` */
    float *hs[4] = {0};
    int rc = 0;
    for (int gi = 0; gi < 4 && !rc; gi++) {
        int cols = groups[gi].cols, n = a->n;
        /* v -> o only when v's rows are o's columns one to one (no GQA). */
        bool scale_it = !(gi == 1 && c->n_kv_heads != c->n_heads);
        float *xm;
        if ((rc = qm_input_stats(l, gi, groups[gi].x, n, cols, in, out, &hs[gi], &xm, st))) break;
        if (!scale_it) {
            free(xm);
            continue;
        }
        float *s = malloc((size_t)cols * sizeof(float));
        if (!s) {
            free(xm);
            rc = llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory");
            break;
        }
        float *ws[3];
        int rows[3], nl = 0;
        for (int i = groups[gi].first; i < groups[gi].last; i++) {
            int cc;
            quant_linear_shape(c, i, &rows[nl], &cc);
            ws[nl++] = b->w[i];
        }
        double loss;
        rc = quant_awq_search_scale(ws, rows, nl, cols, xm, hs[gi], o->group_size, o->awq_grid, s, &loss, st);
        if (!rc) {
            for (int j = 0; j < nl; j++)
                for (int r = 0; r < rows[j]; r++)
                    for (int k = 0; k < cols; k++) ws[j][(size_t)r * cols + k] *= s[k];
            int prev = groups[gi].prev;
            if (prev == -1) {
                for (int k = 0; k < cols; k++) b->attn_norm[k] /= s[k];
            } else if (prev == -2) {
                for (int k = 0; k < cols; k++) b->ffn_norm[k] /= s[k];
            } else {
                int pr, pc;
                quant_linear_shape(c, prev, &pr, &pc);
                for (int r = 0; r < pr; r++)
                    for (int k = 0; k < pc; k++) b->w[prev][(size_t)r * pc + k] /= s[r];
                if (prev == QL_V && b->bv)
                    for (int r = 0; r < pr; r++) b->bv[r] /= s[r];
            }
            /* The input is now x / s: its Gram matrix follows. */
            for (int i = 0; i < cols; i++)
                for (int j = 0; j < cols; j++) hs[gi][(size_t)i * cols + j] /= s[i] * s[j];
        }
        free(xm), free(s);
    }
    for (int gi = 0; gi < 4 && !rc; gi++)
        for (int i = groups[gi].first; i < groups[gi].last && !rc; i++) {
            int rows, cols;
            quant_linear_shape(c, i, &rows, &cols);
            float *orig = malloc((size_t)rows * cols * sizeof(float));
            if (!orig) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory");
                break;
            }
            memcpy(orig, b->w[i], (size_t)rows * cols * sizeof(float));
            if (o->awq_clip && i != QL_Q && i != QL_K) quant_awq_clip(b->w[i], rows, cols, hs[gi], o->group_size, 10);
            rc = quant_rtn(b->w[i], rows, cols, o->group_size, false, QUANT_STYLE_AWQ, &grids[i], st);
            if (!rc) errs[i] = qm_rel_err(orig, &grids[i], hs[gi], st);
            free(orig);
        }
    for (int gi = 0; gi < 4; gi++) free(hs[gi]);
    return rc;
}

int quant_model_run(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                    quant_result *r, llmi_status *st) {
    return quant_model_run_stats(m, o, tokens, n_windows, seqlen, NULL, NULL, r, st);
}

int quant_model_run_stats(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                          const quant_stats *in, quant_stats *out, quant_result *r, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    memset(r, 0, sizeof *r);
    double t0 = qm_now();
    int L = c->n_layers;
    r->n_layers = L;
    r->grids = calloc((size_t)L, sizeof *r->grids);
    r->attn_norm = calloc((size_t)L, sizeof(float *));
    r->ffn_norm = calloc((size_t)L, sizeof(float *));
    for (int b = 0; b < 3; b++) r->bias[b] = calloc((size_t)L, sizeof(float *));
    if (!r->grids || !r->attn_norm || !r->ffn_norm || !r->bias[0] || !r->bias[1] || !r->bias[2]) {
        quant_result_free(r);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    }
    for (int i = 0; i < QL_COUNT; i++) {
        int rows, cols;
        quant_linear_shape(c, i, &rows, &cols);
        if (cols % o->group_size != 0) {
            quant_result_free(r);
            int hint = 0; /* the largest group size the common kernels (Marlin, exllama) take */
            for (int gs = 128; gs >= 32 && !hint; gs /= 2)
                if (c->dim % gs == 0 && c->ffn_dim % gs == 0 && (c->n_heads * c->head_dim) % gs == 0) hint = gs;
            if (hint)
                return llmi_fail(st, LLMI_E_USAGE, "--group-size %d does not divide the input dim %d of %s (try "
                                 "--group-size %d)", o->group_size, cols, quant_linear_names[i], hint);
            return llmi_fail(st, LLMI_E_USAGE, "--group-size %d does not divide the input dim %d of %s",
                             o->group_size, cols, quant_linear_names[i]);
        }
        if (rows % 8 != 0) {
            quant_result_free(r);
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: %s has %d outputs, not a multiple of 8 (int4 packing)",
                             quant_linear_names[i], rows);
        }
    }
    /* RTN needs no calibration; given tokens it runs the GPTQ pipeline's forward only to
     * report each layer's output error. */
    bool calib = (o->method != QUANT_RTN || tokens) && !in;
    if (o->method == QUANT_RTN) out = NULL;
    float *x = NULL;
    quant_acts a = {0};
    if (calib) {
        x = malloc((size_t)n_windows * seqlen * c->dim * sizeof(float)); /* (n, dim) hidden states */
        if (!x) {
            quant_result_free(r);
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for calibration hidden states");
        }
        if (quant_acts_alloc(c, n_windows, seqlen, &a, st)) {
            free(x);
            quant_result_free(r);
            return st->code;
        }
        quant_embed(m, tokens, n_windows * seqlen, x);
    }
    int rc = 0;
    for (int l = 0; l < L && !rc; l++) {
        double tl = qm_now();
        quant_block b;
        if ((rc = quant_block_load(m, l, &b, st))) break;
        double errs[QL_COUNT];
        for (int i = 0; i < QL_COUNT; i++) errs[i] = NAN;
        quant_grid *g = r->grids[l];
        if (o->method == QUANT_RTN && !calib) {
            rc = qm_quantize_set(c, &b, 0, QL_COUNT, NULL, o, g, errs, st);
        } else if (o->method == QUANT_GPTQ || o->method == QUANT_RTN) {
            /* Each stage's inputs come from the already-quantized stages before it. */
            float *h = NULL;
            int n = a.n, qd = c->n_heads * c->head_dim;
            if (calib) quant_fwd_attn_in(c, &b, x, &a);
            if (!(rc = qm_hessian(l, QS_ATTN, a.x_attn, n, c->dim, in, out, &h, st)))
                rc = qm_quantize_set(c, &b, QL_Q, QL_V + 1, h, o, g, errs, st);
            free(h), h = NULL;
            if (!rc) {
                if (calib) quant_fwd_attention(c, &b, &a);
                if (!(rc = qm_hessian(l, QS_O, a.x_o, n, qd, in, out, &h, st)))
                    rc = qm_quantize_set(c, &b, QL_O, QL_O + 1, h, o, g, errs, st);
                free(h), h = NULL;
            }
            if (!rc) {
                if (calib) quant_fwd_mlp_in(c, &b, x, &a);
                if (!(rc = qm_hessian(l, QS_MLP, a.x_mlp, n, c->dim, in, out, &h, st)))
                    rc = qm_quantize_set(c, &b, QL_GATE, QL_UP + 1, h, o, g, errs, st);
                free(h), h = NULL;
            }
            if (!rc) {
                if (calib) quant_fwd_mlp_act(c, &b, &a);
                if (!(rc = qm_hessian(l, QS_DOWN, a.gate, n, c->ffn_dim, in, out, &h, st)))
                    rc = qm_quantize_set(c, &b, QL_DOWN, QL_DOWN + 1, h, o, g, errs, st);
                free(h), h = NULL;
            }
            if (!rc && calib) quant_fwd_out(c, &b, x, &a);
        } else {
            /* AWQ: every linear's input from the fp block; the next block sees fp outputs. */
            if (calib) quant_fwd_block(c, &b, x, &a);
            rc = qm_awq_block(c, l, &b, &a, in, out, o, g, errs, st);
        }
        if (!rc) {
            r->attn_norm[l] = b.attn_norm, b.attn_norm = NULL;
            r->ffn_norm[l] = b.ffn_norm, b.ffn_norm = NULL;
            r->bias[0][l] = b.bq, b.bq = NULL;
            r->bias[1][l] = b.bk, b.bk = NULL;
            r->bias[2][l] = b.bv, b.bv = NULL;
            qm_progress(o, l, L, errs, qm_now() - tl);
        }
        quant_block_free(&b);
    }
    free(x);
    quant_acts_free(&a);
    if (rc) {
        quant_result_free(r);
        return rc;
    }
    r->seconds = qm_now() - t0;
    return 0;
}

int quant_eval_ppl(const llmi_model *m, const quant_result *r, const int32_t *tokens, int n_windows, int seqlen,
                   double *ppl, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    int n = n_windows * seqlen;
    float *x = malloc((size_t)n * c->dim * sizeof(float)); /* (n, dim) */
    quant_acts a;
    if (!x) return llmi_fail(st, LLMI_E_RUNTIME, "ppl: out of memory");
    if (quant_acts_alloc(c, n_windows, seqlen, &a, st)) {
        free(x);
        return st->code;
    }
    quant_embed(m, tokens, n, x);
    int rc = 0;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        quant_block b;
        if ((rc = quant_block_load(m, l, &b, st))) break;
        if (r) {
            for (int i = 0; i < QL_COUNT; i++) quant_grid_dequant(&r->grids[l][i], b.w[i]);
            memcpy(b.attn_norm, r->attn_norm[l], (size_t)c->dim * sizeof(float));
            memcpy(b.ffn_norm, r->ffn_norm[l], (size_t)c->dim * sizeof(float));
            if (b.bv && r->bias[2][l])
                memcpy(b.bv, r->bias[2][l], (size_t)c->n_kv_heads * c->head_dim * sizeof(float));
        }
        quant_fwd_block(c, &b, x, &a);
        quant_block_free(&b);
    }
    quant_acts_free(&a);
    if (rc) {
        free(x);
        return rc;
    }
    quant_rmsnorm(x, m->out_norm, n, c->dim, c->norm_eps, x);
    const llmi_tensor *head = &m->lm_head;
    float *w = malloc((size_t)head->rows * head->cols * sizeof(float)); /* (vocab, dim) */
    int chunk = 64;
    float *logits = malloc((size_t)chunk * head->rows * sizeof(float)); /* (chunk, vocab) */
    if (!w || !logits) {
        free(x), free(w), free(logits);
        return llmi_fail(st, LLMI_E_RUNTIME, "ppl: out of memory for the lm_head");
    }
#pragma omp parallel for schedule(static)
    for (int64_t v = 0; v < head->rows; v++) tensor_dequant_row(head, v, w + (size_t)v * head->cols);
    double nll = 0;
    long count = 0;
    for (int i0 = 0; i0 < n; i0 += chunk) {
        int nc = n - i0 < chunk ? n - i0 : chunk;
        quant_sgemm_nt(x + (size_t)i0 * c->dim, nc, c->dim, w, (int)head->rows, NULL, logits);
        for (int i = 0; i < nc; i++) {
            int t = i0 + i;
            if ((t + 1) % seqlen == 0) continue; /* the window's last token predicts nothing scored */
            if (tokens[t + 1] < 0 || tokens[t + 1] >= head->rows) continue;
            const float *lg = logits + (size_t)i * head->rows;
            float mx = -INFINITY;
            for (int64_t v = 0; v < head->rows; v++) mx = fmaxf(mx, lg[v]);
            double se = 0;
            for (int64_t v = 0; v < head->rows; v++) se += exp((double)lg[v] - mx);
            nll += log(se) + mx - lg[tokens[t + 1]];
            count++;
        }
    }
    free(x), free(w), free(logits);
    *ppl = exp(nll / (double)count);
    return 0;
}
