/* quantize.c — the layer-by-layer quantization driver and its memory estimate (see
 * quantize.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quant/awq.h"
#include "quant/calib.h"
#include "quant/linalg.h"
#include "quant/quant_cuda.h"
#include "quant/quantize.h"
#include "quant/write_hf.h"

double quant_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The GPTQ / AWQ input sets: linears [first, last) share the input of tap `set`. */
static const struct { int first, last; } qm_sets[QS_COUNT] = {
    {QL_Q, QL_V + 1}, {QL_O, QL_O + 1}, {QL_GATE, QL_UP + 1}, {QL_DOWN, QL_DOWN + 1}};
static const char *const qm_set_names[QS_COUNT] = {"q/k/v", "o", "gate/up", "down"};

int quant_check_shapes(const llmi_config *c, const quant_opts *o, llmi_status *st) {
    /* write_hf.c writes Llama/Qwen checkpoints: Gemma's norm names, its 1 + w and its config
     * keys are not written yet */
    if (c->arch == LLMI_ARCH_PHI3)
        return llmi_fail(st, LLMI_E_USAGE, "llmi quantize: %s is a phi3 model, whose fused qkv_proj and gate_up_proj "
                         "quantize does not write yet (supported: llama, mistral, qwen2, qwen3, smollm3, granite)", c->name);
    if (config_is_gemma(c))
        return llmi_fail(st, LLMI_E_USAGE, "llmi quantize: %s is a %s model, which quantize does not write yet "
                         "(supported: llama, mistral, qwen2, qwen3, smollm3, granite)", c->name,
                         c->arch == LLMI_ARCH_GEMMA2 ? "gemma2" : "gemma3");
    if (c->n_experts > 0)
        return llmi_fail(st, LLMI_E_USAGE, "llmi quantize: %s is a mixture-of-experts model (%d experts), which quantize "
                         "does not support yet (supported: dense llama, mistral, qwen2, qwen3)", c->name, c->n_experts);
    for (int i = 0; i < QL_COUNT; i++) {
        int rows, cols;
        quant_linear_shape(c, i, &rows, &cols);
        if (cols % o->group_size != 0) {
            int hint = 0; /* the largest group size the common kernels (Marlin, exllama) take */
            for (int gs = 128; gs >= 32 && !hint; gs /= 2)
                if (c->dim % gs == 0 && c->ffn_dim % gs == 0 && (c->n_heads * c->head_dim) % gs == 0) hint = gs;
            if (hint)
                return llmi_fail(st, LLMI_E_USAGE, "--group-size %d does not divide the input dim %d of %s (try "
                                 "--group-size %d)", o->group_size, cols, quant_linear_names[i], hint);
            return llmi_fail(st, LLMI_E_USAGE, "--group-size %d does not divide the input dim %d of %s",
                             o->group_size, cols, quant_linear_names[i]);
        }
        if (rows % 8 != 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: %s has %d outputs, not a multiple of 8 (int4 packing)",
                             quant_linear_names[i], rows);
    }
    return 0;
}

/* ---- memory ------------------------------------------------------------------------ */

#define QM_ERR_ROWS 256          /* rows per chunk of the output-error measurement */
#define QM_RUNTIME (128u << 20)  /* the binary, libraries, thread stacks, allocator slack */
#define QM_GPU_RUNTIME ((size_t)512 << 20)  /* logit chunk, cuBLAS/cuSOLVER workspaces, allocator */

static size_t qm_grid_bytes(size_t rows, size_t cols, int gs) { return rows * cols + rows * (cols / gs) * 3 + cols * 4; }

/* Set k's input width, and its linears' rows summed and the most of one. */
static void qm_set_rows(const llmi_config *c, int k, int *cols, int *total, int *maxr) {
    int rows;
    *total = *maxr = 0;
    for (int i = qm_sets[k].first; i < qm_sets[k].last; i++) {
        quant_linear_shape(c, i, &rows, cols);
        *total += rows, *maxr = rows > *maxr ? rows : *maxr;
    }
}

void quant_memory_estimate(const llmi_model *m, const quant_opts *o, int n_windows, int seqlen, bool calib,
                           bool save_stats, quant_mem *e) {
    const llmi_config *c = &m->cfg;
    const llmi_layer *L0 = &m->layers[0];
    const llmi_tensor *src[QL_COUNT] = {&L0->wq, &L0->wk, &L0->wv, &L0->wo, &L0->w_gate, &L0->w_up, &L0->w_down};
    memset(e, 0, sizeof *e);
    size_t layer_src = 0, params = 0, grids = 0, view = 0;
    for (int i = 0; i < QL_COUNT; i++) {
        int rows, cols;
        quant_linear_shape(c, i, &rows, &cols);
        layer_src += src[i]->row_bytes * (size_t)src[i]->rows;
        params += (size_t)rows * cols;
        grids += qm_grid_bytes((size_t)rows, (size_t)cols, o->group_size);
        view += (size_t)rows * cols / 2 + (size_t)rows * (cols / o->group_size) * 3;
    }
    e->source = model_weights_from_file(m) ? layer_src : m->weight_bytes;
    e->calib = calib ? quant_calib_bytes(c, n_windows, seqlen, o->hidden_dtype, o->cuda != NULL) : 0;
    e->layer = grids + (calib ? view : 0);
    size_t step = 0;
    if (o->method == QUANT_AWQ) {
        /* every set's Gram matrix and every fp32 linear at once, then one group's search */
        size_t grams = 0, search = 0;
        for (int k = 0; k < QS_COUNT; k++) {
            int cols, total, maxr;
            qm_set_rows(c, k, &cols, &total, &maxr);
            grams += (size_t)cols * cols * 4 * (save_stats ? 2 : 1) + (size_t)cols * 1024;
            size_t s = (size_t)cols * ((size_t)total * 8 + (size_t)maxr * 8 + 256 * 4);
            if (s > search) search = s;
        }
        step = grams + params * 4 + search;
    } else {
        for (int k = 0; k < QS_COUNT; k++) {
            int cols, total, maxr;
            qm_set_rows(c, k, &cols, &total, &maxr);
            size_t cc = (size_t)cols * cols, s;
            size_t h = cc * 4 * (save_stats ? 2 : 1);
            size_t err = (size_t)QM_ERR_ROWS * cols * 16 + (size_t)cols * 1024;   /* 2 x (2 nr, cols) + packing */
            if (!calib && o->method == QUANT_RTN) {
                s = (size_t)maxr * cols * 4;                              /* one fp32 linear */
            } else if (o->method == QUANT_GPTQ) {
                size_t prep = h + cc * 8 + (size_t)cols * 256 * 8 * 2;   /* + fp64 factorisation */
                size_t walk = h + cc * 4 + (size_t)maxr * cols * 8 + (size_t)maxr * 128 * 4 + err;
                s = prep > walk ? prep : walk;
            } else {
                s = h + (size_t)maxr * cols * 4 + err;                    /* RTN with error report */
            }
            if (calib) s = s > h + (size_t)cols * 1024 ? s : h + (size_t)cols * 1024;
            if (s > step) step = s;
        }
    }
    e->step = step;
    e->writer = quant_writer_bytes(c, o);
    if (save_stats && calib)
        for (int k = 0; k < QS_COUNT; k++) {
            int rows, cols;
            quant_linear_shape(c, qm_sets[k].first, &rows, &cols);
            e->stats += (size_t)c->n_layers * ((size_t)cols * cols + cols) * 4;
        }
    e->total = e->source + e->calib + e->layer + e->step + e->writer + e->stats + QM_RUNTIME;
    if (o->cuda) {
        /* quant_cuda: every tap's Gram slot stays allocated; GPTQ's prepare holds H (a slot's,
         * or an uploaded copy), its fp64 copy, U and cuSOLVER's workspace (~24 cols^2 bytes),
         * its walk U, H and the weights (~9 rows cols), then the error's selected rows (D and
         * W, and those times H); AWQ's search three fp32 copies of a group's weights and H;
         * AWQ's and RTN's error measure one linear's fp32 weights, grid and H (under either) */
        size_t grams = 0, gstep = 0;
        for (int k = 0; k < QS_COUNT; k++) {
            int cols, total, maxr;
            qm_set_rows(c, k, &cols, &total, &maxr);
            const size_t cc = (size_t)cols * cols;
            grams += (cc + (size_t)cols) * 4;
            const int stride = quant_err_stride(maxr, cols);
            const size_t n_sel = (size_t)(maxr + stride - 1) / stride;
            const size_t prep = 24 * cc, walk = 8 * cc + 9 * (size_t)maxr * cols + 16 * n_sel * cols;
            size_t s = o->method == QUANT_AWQ ? 12 * (size_t)total * cols + 4 * cc : prep > walk ? prep : walk;
            if (s > gstep) gstep = s;
        }
        e->device = (calib ? quant_calib_device_bytes(c, n_windows, seqlen, o->hidden_dtype) + grams : 0) + gstep +
                    QM_GPU_RUNTIME;
    }
}

/* ---- one layer ----------------------------------------------------------------------- */

int quant_err_stride(int rows, int cols) {
    const double cost = 2.0 * rows * (double)cols * cols, budget = 17179869184.0;
    return cost > budget ? (int)ceil(cost / budget) : 1;
}

/* Relative output error |X(W-Q)^T|^2 / |XW^T|^2 = tr(D H D^T) / tr(W H W^T), D = W - Q,
 * over the rows quant_err_stride picks (quant_cuda_gptq_apply measures it on the GPU). */
static double qm_rel_err(const float *w, const quant_grid *g, const float *h, llmi_status *st) {
    const int rows = g->rows, cols = g->cols;
    const int stride = quant_err_stride(rows, cols);
    float *d = malloc((size_t)QM_ERR_ROWS * cols * 2 * sizeof(float)); /* (2 nr, cols): nr rows of D, then of W */
    float *t = malloc((size_t)QM_ERR_ROWS * cols * 2 * sizeof(float)); /* (2 nr, cols): -(those rows) H */
    double num = 0, den = 0;
    bool ok = d && t;
    for (int r0 = 0; r0 < rows && ok; r0 += QM_ERR_ROWS * stride) {
        int nr = 0;
        for (int r = r0; r < rows && nr < QM_ERR_ROWS; r += stride) nr++;
        for (int i = 0; i < nr; i++) {
            const int r = r0 + i * stride;
            float *dr = d + (size_t)i * cols, *wr = d + (size_t)(nr + i) * cols;
            for (int k = 0; k < cols; k++) {
                int gi = quant_grid_group(g, k);
                float s = fp16_to_f32(g->scales[(size_t)gi * rows + r]);
                float q = s * (float)((int)g->q[(size_t)r * cols + k] - (int)g->zeros[(size_t)gi * rows + r]);
                wr[k] = w[(size_t)r * cols + k];
                dr[k] = wr[k] - q;
            }
        }
        memset(t, 0, (size_t)2 * nr * cols * sizeof(float));
        ok = quant_gemm_sub_f(2 * nr, cols, cols, d, cols, h, cols, false, false, t, cols) == 0;
        for (int i = 0; i < nr && ok; i++)
            for (int k = 0; k < cols; k++) {
                num -= (double)d[(size_t)i * cols + k] * t[(size_t)i * cols + k];
                den -= (double)d[(size_t)(nr + i) * cols + k] * t[(size_t)(nr + i) * cols + k];
            }
    }
    free(d), free(t);
    if (!ok) {
        llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory measuring a %dx%d layer's error", rows, cols);
        return NAN;
    }
    return den > 0 ? num / den : 0.0;
}

/* qm_rel_err, on the GPU where the run has one (the grid's columns in order: the device's
 * measure reads no g_idx); NAN with *st set on failure. */
static double qm_layer_err(const quant_opts *o, const float *w, const quant_grid *g, const float *h, llmi_status *st) {
    double e;
    if (o->cuda && !g->g_idx) return quant_cuda_rel_err(o->cuda, w, g, h, &e, st) ? NAN : e;
    return qm_rel_err(w, g, h, st);
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

typedef struct qm_run {
    const llmi_model *m;
    const quant_opts *o;
    quant_view *v;                 /* the served model (calibration), or NULL */
    quant_calib *cal;              /* NULL without a calibration forward */
    const quant_stats *in;
    quant_stats *out;
    int layer, step, n_steps;
    quant_layer_times times;       /* the current layer's */
} qm_run;

/* Adds the seconds since *t0 to stage s and restarts the clock. */
static void qm_lap(qm_run *q, quant_stage s, double *t0) {
    double t = quant_now();
    q->times.stage[s] += t - *t0;
    *t0 = t;
}

static int qm_cancelled(const quant_opts *o, llmi_status *st) {
    return o->cancel && *o->cancel ? llmi_fail(st, LLMI_E_INTERRUPT, "quantize: interrupted") : 0;
}

static void qm_step(qm_run *q, const char *what) {
    quant_progress *p = q->o->progress;
    if (p && ++q->step < q->n_steps) p->fn(p, q->layer, q->m->cfg.n_layers, q->step, q->n_steps, what, NULL, NULL);
}

/* GPTQ (or RTN with error reporting) of set k of layer l on the statistics h = X^T X / n
 * (host h, or Gram slot k of o->cuda when h_on_gpu): one factorisation for the set, then
 * each linear loaded, walked and dropped; each result is served by the view from then on,
 * so later sets calibrate on it. */
static int qm_quantize_set(qm_run *q, int k, quant_block *b, float *h, bool h_on_gpu, quant_grid *grids, double *errs,
                           llmi_status *st) {
    const llmi_config *c = &q->m->cfg;
    const quant_opts *o = q->o;
    int rows, cols;
    quant_linear_shape(c, qm_sets[k].first, &rows, &cols);
    quant_gptq_opts go = {.group_size = o->group_size, .sym = o->sym, .desc_act = o->desc_act,
                          .damp_percent = o->damp_percent, .block_size = 128};
    quant_gptq_hinv hv = {0};
    const bool gptq = o->method == QUANT_GPTQ && (h || h_on_gpu);
    double t0 = quant_now();
    /* GPTQ's H = 2 X^T X / n */
    if (gptq && o->cuda) {
        if (quant_cuda_gptq_prepare(o->cuda, h_on_gpu ? NULL : h, k, 2.0f, cols, &go, &hv, st)) return st->code;
        qm_lap(q, QT_SOLVE, &t0);
    } else if (gptq) {
        for (size_t i = 0; i < (size_t)cols * cols; i++) h[i] *= 2.0f;
        if (quant_gptq_prepare(h, cols, &go, &hv, st)) return st->code;
        qm_lap(q, QT_SOLVE, &t0);
    }
    int rc = 0;
    for (int i = qm_sets[k].first; i < qm_sets[k].last && !rc; i++) {
        quant_linear_shape(c, i, &rows, &cols);
        if ((rc = qm_cancelled(o, st)) || (rc = quant_block_load_linears(q->m, q->layer, i, i + 1, b, st))) break;
        qm_lap(q, QT_LOAD, &t0);
        double loss;
        if (gptq && o->cuda) {
            /* the walk and the error measure on the device, where the weights and H are */
            rc = quant_cuda_gptq_apply(o->cuda, b->w[i], rows, &hv, &go, &grids[i], &loss, &errs[i], st);
            qm_lap(q, QT_QUANTIZE, &t0);
        } else {
            rc = gptq ? quant_gptq_apply(b->w[i], rows, &hv, &go, &grids[i], &loss, st)
                      : quant_rtn(b->w[i], rows, cols, o->group_size, o->sym, QUANT_STYLE_GPTQ, &grids[i], st);
            qm_lap(q, QT_QUANTIZE, &t0);
            if (!rc && h && isnan(errs[i] = qm_layer_err(o, b->w[i], &grids[i], h, st))) rc = st->code;
            qm_lap(q, QT_ERROR, &t0);
        }
        if (!rc && q->v) rc = quant_view_set_linear(q->v, q->layer, i, &grids[i], st);
        quant_block_drop_linear(b, i);
        qm_lap(q, QT_SERVE, &t0);
    }
    quant_gptq_hinv_free(&hv);
    return rc;
}

static int qm_gptq_layer(qm_run *q, quant_block *b, quant_grid *grids, double *errs, llmi_status *st) {
    const llmi_config *c = &q->m->cfg;
    const int l = q->layer;
    /* GPTQ on a GPU from its own calibration: H never leaves the device */
    const bool h_on_gpu = q->cal && q->cal->cuda && q->cal->grams_stay_on_gpu;
    int rc = 0;
    for (int k = 0; k < QS_COUNT && !rc; k++) {
        quant_tap_stats ts[LLMI_TAP_COUNT] = {{0}};
        float *h = NULL, *xm = NULL;
        int rows, cols;
        quant_linear_shape(c, qm_sets[k].first, &rows, &cols);
        double t0 = quant_now();
        if (q->cal && (rc = quant_calib_layer(q->cal, 1u << k, false, ts, st))) break;
        qm_step(q, "calibrate");
        if (!h_on_gpu && (q->cal || q->in)) rc = qm_input_stats(l, k, cols, &ts[k], q->in, q->out, &h, &xm, st);
        qm_lap(q, QT_CALIBRATE, &t0);
        free(xm);
        if (!rc) rc = qm_quantize_set(q, k, b, h, h_on_gpu, grids, errs, st);
        qm_step(q, qm_set_names[k]);
        free(h);
        for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&ts[t]);
    }
    if (!rc && q->cal) {
        quant_tap_stats ts[LLMI_TAP_COUNT] = {{0}};
        double t0 = quant_now();
        rc = quant_calib_layer(q->cal, 0, true, ts, st);
        qm_lap(q, QT_CALIBRATE, &t0);
    }
    return rc;
}

/* AWQ on one block: scales per group, folded into the previous op, clipping, then RTN.
 * ts: the fp layer's tap statistics (unused when they come from `in`). */
static int qm_awq_layer(qm_run *q, quant_block *b, quant_grid *grids, double *errs, llmi_status *st) {
    const llmi_config *c = &q->m->cfg;
    const quant_opts *o = q->o;
    const int l = q->layer;
    quant_tap_stats ts[LLMI_TAP_COUNT] = {{0}};
    int rc = 0;
    double t0 = quant_now();
    if (q->cal) rc = quant_calib_layer(q->cal, (1u << LLMI_TAP_COUNT) - 1, true, ts, st);
    qm_step(q, "calibrate");
    qm_lap(q, QT_CALIBRATE, &t0);
    if (!rc) rc = quant_block_load_linears(q->m, l, 0, QL_COUNT, b, st);
    qm_lap(q, QT_LOAD, &t0);
    struct { int prev; int cols; } groups[QS_COUNT] = {
        {-1, c->dim}, {QL_V, c->n_heads * c->head_dim}, {-2, c->dim}, {QL_UP, c->ffn_dim}};
    float *hs[QS_COUNT] = {0};
    for (int gi = 0; gi < QS_COUNT && !rc; gi++) {
        int cols = groups[gi].cols;
        /* v -> o only when v's rows are o's columns one to one (no GQA). */
        bool scale_it = !(gi == QS_O && c->n_kv_heads != c->n_heads);
        float *xm;
        if ((rc = qm_input_stats(l, gi, cols, &ts[gi], q->in, q->out, &hs[gi], &xm, st))) break;
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
        for (int i = qm_sets[gi].first; i < qm_sets[gi].last; i++) {
            int cc;
            quant_linear_shape(c, i, &rows[nl], &cc);
            ws[nl++] = b->w[i];
        }
        double loss;
        rc = o->cuda ? quant_cuda_awq_search_scale(o->cuda, ws, rows, nl, cols, xm, hs[gi], o->group_size, o->awq_grid, s,
                                                   &loss, st)
                     : quant_awq_search_scale(ws, rows, nl, cols, xm, hs[gi], o->group_size, o->awq_grid, s, &loss, st);
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
        qm_step(q, qm_set_names[gi]);
        qm_lap(q, QT_QUANTIZE, &t0);
    }
    for (int gi = 0; gi < QS_COUNT && !rc; gi++)
        for (int i = qm_sets[gi].first; i < qm_sets[gi].last && !rc; i++) {
            int rows, cols;
            quant_linear_shape(c, i, &rows, &cols);
            float *orig = malloc((size_t)rows * cols * sizeof(float));
            if (!orig) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory");
                break;
            }
            memcpy(orig, b->w[i], (size_t)rows * cols * sizeof(float));
            if (o->awq_clip && i != QL_Q && i != QL_K)
                rc = o->cuda ? quant_cuda_awq_clip(o->cuda, b->w[i], rows, cols, hs[gi], o->group_size, 10, st)
                             : quant_awq_clip(b->w[i], rows, cols, hs[gi], o->group_size, 10, st);
            if (!rc) rc = quant_rtn(b->w[i], rows, cols, o->group_size, false, QUANT_STYLE_AWQ, &grids[i], st);
            qm_lap(q, QT_QUANTIZE, &t0);
            if (!rc && isnan(errs[i] = qm_layer_err(o, orig, &grids[i], hs[gi], st))) rc = st->code;
            qm_lap(q, QT_ERROR, &t0);
            free(orig);
        }
    for (int gi = 0; gi < QS_COUNT; gi++) free(hs[gi]);
    for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&ts[t]);
    for (int i = 0; i < QL_COUNT; i++) quant_block_drop_linear(b, i);
    return rc;
}

int quant_model_stream(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                       const quant_stats *in, quant_stats *out, quant_layer_sink sink, void *sink_ctx,
                       llmi_status *st) {
    const llmi_config *c = &m->cfg;
    if (quant_check_shapes(c, o, st)) return st->code;
    /* RTN needs no calibration; given tokens it runs the GPTQ pipeline's forward only to
     * report each layer's output error. */
    bool calib = (o->method != QUANT_RTN || tokens) && !in;
    if (!calib) out = NULL;   /* RTN with calibration text records what its forward saw */
    quant_view v = {0};
    quant_calib cal = {0};
    if (calib && (quant_view_init(&v, m, st) ||
                  quant_calib_init(&cal, &v, tokens, n_windows, seqlen, o->hidden_dtype, o->cuda, st))) {
        quant_view_free(&v);
        return st->code;
    }
    cal.cancel = o->cancel;
    /* GPTQ's Hessians stay where the GPU made them unless statistics are saved */
    cal.grams_stay_on_gpu = o->cuda && o->method == QUANT_GPTQ && !out;
    /* the embedding rows the windows touched are not needed again */
    if (calib) model_release_pages(m, m->tok_embd.data, m->tok_embd.row_bytes * (size_t)m->tok_embd.rows);
    qm_run q = {.m = m, .o = o, .v = calib ? &v : NULL, .cal = calib ? &cal : NULL, .in = in, .out = out,
                .n_steps = o->method == QUANT_AWQ ? 1 + QS_COUNT + 1 : 2 * QS_COUNT + 1};
    int rc = 0;
    for (int l = 0; l < c->n_layers && !rc; l++) {
        double tl = quant_now();
        q.layer = l, q.step = 0;
        q.times = (quant_layer_times){0};
        quant_block b;
        if ((rc = qm_cancelled(o, st)) || (rc = quant_block_load(m, l, 0, 0, &b, st))) break;
        double errs[QL_COUNT];
        quant_grid grids[QL_COUNT];
        memset(grids, 0, sizeof grids);
        for (int i = 0; i < QL_COUNT; i++) errs[i] = NAN;
        if (o->method == QUANT_RTN && !calib) {
            for (int i = 0; i < QL_COUNT && !rc; i++) {
                int rows, cols;
                quant_linear_shape(c, i, &rows, &cols);
                if (!(rc = quant_block_load_linears(m, l, i, i + 1, &b, st)))
                    rc = quant_rtn(b.w[i], rows, cols, o->group_size, o->sym, QUANT_STYLE_GPTQ, &grids[i], st);
                quant_block_drop_linear(&b, i);
            }
        } else if (o->method == QUANT_AWQ) {
            rc = qm_awq_layer(&q, &b, grids, errs, st);
        } else {
            rc = qm_gptq_layer(&q, &b, grids, errs, st);
        }
        double tw = quant_now();
        if (!rc) rc = sink(sink_ctx, l, grids, &b, st);
        qm_lap(&q, QT_WRITE, &tw);
        for (int i = 0; i < QL_COUNT; i++) quant_grid_free(&grids[i]);
        quant_block_free(&b);
        if (calib) quant_view_release_layer(&v, l, m);
        quant_source_release_layer(m, l);
        q.times.total = quant_now() - tl;
        if (o->cuda) quant_cuda_take_times(o->cuda, q.times.gpu);
        if (!rc && o->progress)
            o->progress->fn(o->progress, l, c->n_layers, q.n_steps, q.n_steps, "done", errs, &q.times);
    }
    quant_calib_free(&cal);
    quant_view_free(&v);
    return rc;
}

/* ---- every layer in memory ----------------------------------------------------------- */

static int qm_collect(void *ctx, int l, quant_grid grids[QL_COUNT], quant_block *b, llmi_status *st) {
    quant_result *r = ctx;
    (void)st;
    for (int i = 0; i < QL_COUNT; i++) {
        r->grids[l][i] = grids[i];
        memset(&grids[i], 0, sizeof grids[i]);
    }
    r->attn_norm[l] = b->attn_norm, b->attn_norm = NULL;
    r->ffn_norm[l] = b->ffn_norm, b->ffn_norm = NULL;
    r->bias[0][l] = b->bq, b->bq = NULL;
    r->bias[1][l] = b->bk, b->bk = NULL;
    r->bias[2][l] = b->bv, b->bv = NULL;
    return 0;
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

int quant_model_run(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                    quant_result *r, llmi_status *st) {
    return quant_model_run_stats(m, o, tokens, n_windows, seqlen, NULL, NULL, r, st);
}

int quant_model_run_stats(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                          const quant_stats *in, quant_stats *out, quant_result *r, llmi_status *st) {
    memset(r, 0, sizeof *r);
    double t0 = quant_now();
    int L = m->cfg.n_layers;
    r->n_layers = L;
    r->grids = calloc((size_t)L, sizeof *r->grids);
    r->attn_norm = calloc((size_t)L, sizeof(float *));
    r->ffn_norm = calloc((size_t)L, sizeof(float *));
    for (int b = 0; b < 3; b++) r->bias[b] = calloc((size_t)L, sizeof(float *));
    if (!r->grids || !r->attn_norm || !r->ffn_norm || !r->bias[0] || !r->bias[1] || !r->bias[2]) {
        quant_result_free(r);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    }
    if (quant_model_stream(m, o, tokens, n_windows, seqlen, in, out, qm_collect, r, st)) {
        quant_result_free(r);
        return st->code;
    }
    r->seconds = quant_now() - t0;
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
