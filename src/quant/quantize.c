/* quantize.c — the layer-by-layer quantization driver (see quantize.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quant/awq.h"
#include "quant/calib.h"
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
 * given (no forward needed), else taken over from the calibration forward's tap
 * statistics ts; copied into `out` when given. */
static int qm_input_stats(int l, int k, int cols, quant_tap_stats *ts, const quant_stats *in, quant_stats *out,
                          float **g, float **xm, llmi_status *st) {
    if (in) {
        *g = malloc((size_t)cols * cols * sizeof(float));
        *xm = malloc((size_t)cols * sizeof(float));
        if (!*g || !*xm) {
            free(*g), free(*xm);
            *g = *xm = NULL;
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for a %dx%d Hessian", cols, cols);
        }
        memcpy(*g, in->gram[l][k], (size_t)cols * cols * sizeof(float));
        memcpy(*xm, in->xmean[l][k], (size_t)cols * sizeof(float));
    } else {
        *g = ts->gram, *xm = ts->xmean;
        ts->gram = ts->xmean = NULL;
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
static int qm_hessian(int l, int k, int cols, quant_tap_stats *ts, const quant_stats *in, quant_stats *out, float **h,
                      llmi_status *st) {
    float *xm;
    if (qm_input_stats(l, k, cols, ts, in, out, h, &xm, st)) return st->code;
    free(xm);
    for (size_t i = 0; i < (size_t)cols * cols; i++) (*h)[i] *= 2.0f;
    return 0;
}

/* GPTQ (or RTN when o->method == QUANT_RTN) on linears [first, last) of b that share h;
 * each result is served by v (when given) from then on, so later stages calibrate on
 * the quantized layer. */
static int qm_quantize_set(const llmi_config *c, int l, quant_block *b, int first, int last, float *h,
                           const quant_opts *o, quant_view *v, quant_grid *grids, double *errs, llmi_status *st) {
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
        if (v && quant_view_set_linear(v, l, i, &grids[i], st)) return st->code;
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
/* ts: the fp layer's tap statistics (unused when they come from `in`). */
static int qm_awq_block(const llmi_config *c, int l, quant_block *b, quant_tap_stats *ts, const quant_stats *in,
                        quant_stats *out, const quant_opts *o, quant_grid *grids, double *errs, llmi_status *st) {
    struct { int prev; int first, last; int cols; } groups[4] = {
        {-1, QL_Q, QL_V + 1, c->dim},
        {QL_V, QL_O, QL_O + 1, c->n_heads * c->head_dim},
        {-2, QL_GATE, QL_UP + 1, c->dim},
        {QL_UP, QL_DOWN, QL_DOWN + 1, c->ffn_dim},
    };
    float *hs[4] = {0};
    int rc = 0;
    for (int gi = 0; gi < 4 && !rc; gi++) {
        int cols = groups[gi].cols;
        /* v -> o only when v's rows are o's columns one to one (no GQA). */
        bool scale_it = !(gi == 1 && c->n_kv_heads != c->n_heads);
        float *xm;
        if ((rc = qm_input_stats(l, gi, cols, &ts[gi], in, out, &hs[gi], &xm, st))) break;
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
    quant_view v = {0};
    quant_calib cal = {0};
    if (calib && (quant_view_init(&v, m, st) || quant_calib_init(&cal, &v, tokens, n_windows, seqlen, st))) {
        quant_view_free(&v);
        quant_result_free(r);
        return st->code;
    }
    int rc = 0;
    for (int l = 0; l < L && !rc; l++) {
        double tl = qm_now();
        quant_block b;
        if ((rc = quant_block_load(m, l, &b, st))) break;
        double errs[QL_COUNT];
        for (int i = 0; i < QL_COUNT; i++) errs[i] = NAN;
        quant_grid *g = r->grids[l];
        quant_tap_stats ts[LLMI_TAP_COUNT] = {{0}};
        if (o->method == QUANT_RTN && !calib) {
            rc = qm_quantize_set(c, l, &b, 0, QL_COUNT, NULL, o, NULL, g, errs, st);
        } else if (o->method == QUANT_GPTQ || o->method == QUANT_RTN) {
            /* True-sequential, as the GPTQ reference: each set of linears sees inputs that
             * come through the sets of this layer already quantized, and the next layer
             * sees this one's quantized output. */
            static const struct { int first, last; } sets[QS_COUNT] = {
                {QL_Q, QL_V + 1}, {QL_O, QL_O + 1}, {QL_GATE, QL_UP + 1}, {QL_DOWN, QL_DOWN + 1}};
            for (int k = 0; k < QS_COUNT && !rc; k++) {
                float *h = NULL;
                int rows, cols;
                quant_linear_shape(c, sets[k].first, &rows, &cols);
                if (calib) rc = quant_calib_layer(&cal, 1u << k, false, ts, st);
                if (!rc && !(rc = qm_hessian(l, k, cols, &ts[k], in, out, &h, st)))
                    rc = qm_quantize_set(c, l, &b, sets[k].first, sets[k].last, h, o, calib ? &v : NULL, g, errs, st);
                free(h);
                for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&ts[t]);
            }
            if (!rc && calib) rc = quant_calib_layer(&cal, 0, true, ts, st);
        } else {
            /* AWQ: every linear's input from the fp layer, whose output the next layer sees. */
            if (calib) rc = quant_calib_layer(&cal, (1u << LLMI_TAP_COUNT) - 1, true, ts, st);
            if (!rc) rc = qm_awq_block(c, l, &b, ts, in, out, o, g, errs, st);
        }
        for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&ts[t]);
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
    quant_calib_free(&cal);
    quant_view_free(&v);
    if (rc) {
        quant_result_free(r);
        return rc;
    }
    r->seconds = qm_now() - t0;
    return 0;
}

int quant_result_view(const llmi_model *m, const quant_result *r, quant_view *v, llmi_status *st) {
    if (quant_view_init(v, m, st)) return st->code;
    for (int l = 0; l < r->n_layers; l++) {
        const float *bias[3] = {r->bias[0][l], r->bias[1][l], r->bias[2][l]};
        for (int i = 0; i < QL_COUNT; i++)
            if (quant_view_set_linear(v, l, i, &r->grids[l][i], st)) goto fail;
        if (quant_view_set_norms(v, l, r->attn_norm[l], r->ffn_norm[l], st) || quant_view_set_biases(v, l, bias, st))
            goto fail;
    }
    return LLMI_OK;
fail:
    quant_view_free(v);
    return st->code;
}
