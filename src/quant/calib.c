/* calib.c — calibration through the engine's forward, and the served view of a model
 * being quantized (see calib.h). */
#include "quant/calib.h"
#include "quant/linalg.h"
#include "quant/quant_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- quant_view ------------------------------------------------------------------ */

int quant_view_init(quant_view *v, const llmi_model *src, llmi_status *st) {
    memset(v, 0, sizeof *v);
    int L = src->cfg.n_layers;
    v->model = *src;
    /* The view never unmaps or frees what the source owns: only its own pieces. */
    v->model.n_maps = 0;
    v->model.layers = malloc((size_t)L * sizeof *v->model.layers);
    v->int4 = calloc((size_t)L, sizeof *v->int4);
    v->norms = calloc((size_t)L * 2, sizeof *v->norms);
    v->biases = calloc((size_t)L * 3, sizeof *v->biases);
    if (!v->model.layers || !v->int4 || !v->norms || !v->biases) {
        quant_view_free(v);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for a view of %d layers", L);
    }
    memcpy(v->model.layers, src->layers, (size_t)L * sizeof *v->model.layers);
    return LLMI_OK;
}

void quant_view_free(quant_view *v) {
    int L = v->model.cfg.n_layers;
    for (int l = 0; v->int4 && l < L; l++)
        for (int i = 0; i < QL_COUNT; i++) free(v->int4[l][i].owned);
    for (int i = 0; v->norms && i < 2 * L; i++) free(v->norms[i]);
    for (int i = 0; v->biases && i < 3 * L; i++) free(v->biases[i]);
    free(v->int4);
    free(v->norms);
    free(v->biases);
    free(v->model.layers);
    memset(v, 0, sizeof *v);
}

static llmi_tensor *layer_linear(llmi_layer *L, int which) {
    llmi_tensor *ts[QL_COUNT] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ts[which];
}

int quant_view_set_linear(quant_view *v, int l, int which, const quant_grid *g, llmi_status *st) {
    llmi_tensor t;
    if (quant_tensor_from_grid(g, &t, st)) return st->code;
    free(v->int4[l][which].owned);
    v->int4[l][which] = t;
    *layer_linear(&v->model.layers[l], which) = t;
    return LLMI_OK;
}

void quant_view_release_layer(quant_view *v, int l, const llmi_model *src) {
    for (int i = 0; i < QL_COUNT; i++) {
        if (!v->int4[l][i].dtype) continue;
        free(v->int4[l][i].owned);
        memset(&v->int4[l][i], 0, sizeof v->int4[l][i]);
        *layer_linear(&v->model.layers[l], i) = *layer_linear(&src->layers[l], i);
    }
}

static int swap_copy(float **slot, float **dst, const float *src, int n, llmi_status *st) {
    float *copy = malloc((size_t)n * sizeof *copy);
    if (!copy) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    memcpy(copy, src, (size_t)n * sizeof *copy);
    free(*slot);
    *slot = copy;
    *dst = copy;
    return LLMI_OK;
}

int quant_view_set_norms(quant_view *v, int l, const float *attn_norm, const float *ffn_norm, llmi_status *st) {
    llmi_layer *L = &v->model.layers[l];
    int dim = v->model.cfg.dim;
    if (swap_copy(&v->norms[2 * l], &L->attn_norm, attn_norm, dim, st) ||
        swap_copy(&v->norms[2 * l + 1], &L->ffn_norm, ffn_norm, dim, st))
        return st->code;
    return LLMI_OK;
}

int quant_view_set_biases(quant_view *v, int l, const float *const bias[3], llmi_status *st) {
    llmi_layer *L = &v->model.layers[l];
    const llmi_config *c = &v->model.cfg;
    float **dst[3] = {&L->bq, &L->bk, &L->bv};
    int n[3] = {c->n_heads * c->head_dim, c->n_kv_heads * c->head_dim, c->n_kv_heads * c->head_dim};
    for (int b = 0; b < 3; b++)
        if (bias[b] && swap_copy(&v->biases[3 * l + b], dst[b], bias[b], n[b], st)) return st->code;
    return LLMI_OK;
}

/* ---- calibration ------------------------------------------------------------------ */

#define CALIB_BLOCK 16              /* KV block size of the calibration forward, tokens */
#define CALIB_BATCH_TOKENS 2048     /* tokens per forward: whole windows, at least one */

static int tap_cols(const llmi_config *c, llmi_tap t) {
    switch (t) {
    case LLMI_TAP_O_IN: return c->n_heads * c->head_dim;
    case LLMI_TAP_DOWN_IN: return c->ffn_dim;
    default: return c->dim;
    }
}

static int calib_windows_per_batch(int n_windows, int seqlen) {
    int w = CALIB_BATCH_TOKENS / seqlen;
    if (w < 1) w = 1;
    return w > n_windows ? n_windows : w;
}

size_t quant_calib_bytes(const llmi_config *c, int n_windows, int seqlen, llmi_dtype hidden_dtype, bool on_gpu) {
    const int W = calib_windows_per_batch(n_windows, seqlen), bpw = (seqlen + CALIB_BLOCK - 1) / CALIB_BLOCK;
    size_t bytes = (size_t)W * seqlen * 4 * sizeof(int32_t);                      /* batch index arrays */
    if (on_gpu) return bytes;   /* hidden states, workspaces and KV in the GPU's memory */
    size_t esz = hidden_dtype == LLMI_F32 ? 4 : 2;
    bytes += (size_t)n_windows * seqlen * c->dim * esz;                           /* hidden */
    if (hidden_dtype != LLMI_F32) bytes += (size_t)W * seqlen * c->dim * sizeof(float); /* stage */
    llmi_config one = *c;   /* the backend sees a one-layer window (quant_calib.window) */
    one.n_layers = 1;
    bytes += backend_cpu_workspace_bytes(c, W * seqlen);
    bytes += (size_t)W * bpw * backend_kv_block_bytes(&one, CALIB_BLOCK, LLMI_KV_F32);
    return bytes;
}

size_t quant_calib_device_bytes(const llmi_config *c, int n_windows, int seqlen, llmi_dtype hidden_dtype) {
    const int W = calib_windows_per_batch(n_windows, seqlen), bpw = (seqlen + CALIB_BLOCK - 1) / CALIB_BLOCK;
    const size_t B = (size_t)W * seqlen, dim = (size_t)c->dim, ffn = (size_t)c->ffn_dim;
    const size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    llmi_config one = *c;
    one.n_layers = 1;
    size_t bytes = (size_t)n_windows * seqlen * dim * (hidden_dtype == LLMI_F32 ? 4 : 2);   /* hidden */
    bytes += 2 * (size_t)c->n_vocab * dim * 2;                                 /* embeddings, lm_head (bf16) */
    bytes += (dim * (qd + 2 * kvd) + qd * dim + 3 * dim * ffn) * 2;            /* one layer's weights (bf16) */
    bytes += B * (dim * 4 + dim * 2 + (qd + 2 * kvd) * 4 + qd * 2 + dim * 4 + 2 * ffn * 4 + ffn * 2); /* activations */
    bytes += (size_t)W * bpw * backend_kv_block_bytes(&one, CALIB_BLOCK, LLMI_KV_BF16);
    return bytes;
}

/* Where windows [w0, ...) of hidden are for a forward that writes them: on the GPU when
 * they are kept there, else fp32 on the host (hidden itself, or the stage). */
static void calib_batch_target(quant_calib *c, int w0, llmi_layer_run *run) {
    const size_t off = (size_t)w0 * c->seqlen * c->view->model.cfg.dim;
    const size_t esz = c->hidden_dtype == LLMI_F32 ? 4 : 2;
    if (c->cuda) {
        run->hidden_device = (char *)c->hidden + off * esz;
        run->hidden_dtype = c->hidden_dtype;
    } else {
        run->hidden = c->hidden_dtype == LLMI_F32 ? (float *)c->hidden + off : c->stage;
    }
}

/* Windows [w0, w0 + nw) of hidden as a forward's input: the target, with the stage
 * filled from hidden when that is how the host holds them. */
static void calib_batch_in(quant_calib *c, int w0, int nw, llmi_layer_run *run) {
    calib_batch_target(c, w0, run);
    if (c->cuda || c->hidden_dtype == LLMI_F32) return;
    const size_t off = (size_t)w0 * c->seqlen * c->view->model.cfg.dim;
    const size_t n = (size_t)nw * c->seqlen * c->view->model.cfg.dim;
    const uint16_t *h = (const uint16_t *)c->hidden + off;
    const bool bf = c->hidden_dtype == LLMI_BF16;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) c->stage[i] = bf ? bf16_to_f32(h[i]) : fp16_to_f32(h[i]);
}

/* A forward's output (a layer's) into hidden: the stage rounded into it on the host (the
 * GPU has rounded its own); fp16 refuses what it cannot hold. */
static int calib_batch_out(quant_calib *c, int w0, int nw, int layer, const llmi_layer_run *run, llmi_status *st) {
    long bad = 0;
    if (c->cuda) {
        bad = run->overflow;
    } else if (c->hidden_dtype != LLMI_F32) {
        const size_t off = (size_t)w0 * c->seqlen * c->view->model.cfg.dim;
        const size_t n = (size_t)nw * c->seqlen * c->view->model.cfg.dim;
        uint16_t *h = (uint16_t *)c->hidden + off;
        const bool bf = c->hidden_dtype == LLMI_BF16;
#pragma omp parallel for schedule(static) reduction(+ : bad)
        for (size_t i = 0; i < n; i++) {
            h[i] = bf ? f32_to_bf16(c->stage[i]) : f32_to_fp16(c->stage[i]);
            bad += !bf && isfinite(c->stage[i]) && !isfinite(fp16_to_f32(h[i]));
        }
    }
    if (bad)
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: %ld hidden values after layer %d are beyond fp16's range "
                         "(use --calib-dtype bf16 or f32)", bad, layer);
    return 0;
}

int quant_calib_init(quant_calib *c, quant_view *v, const int32_t *tokens, int n_windows, int seqlen,
                     llmi_dtype hidden_dtype, struct quant_cuda *cuda, llmi_status *st) {
    memset(c, 0, sizeof *c);
    const int gpu = cuda ? quant_cuda_gpu(cuda) : -1;
    const llmi_config *cfg = &v->model.cfg;
    if (hidden_dtype != LLMI_F32 && hidden_dtype != LLMI_BF16 && hidden_dtype != LLMI_F16)
        return llmi_fail(st, LLMI_E_USAGE, "quantize: calibration hidden states must be f32, bf16 or f16");
    c->view = v;
    c->cuda = cuda;
    c->tokens = tokens;
    c->n_windows = n_windows;
    c->seqlen = seqlen;
    c->hidden_dtype = hidden_dtype;
    c->windows_per_batch = calib_windows_per_batch(n_windows, seqlen);
    c->blocks_per_window = (seqlen + CALIB_BLOCK - 1) / CALIB_BLOCK;
    const int W = c->windows_per_batch, T = seqlen, bpw = c->blocks_per_window;
    /* The backend's defaults, as `llmi generate` serves the model on that device (f32 KV on
     * the CPU, bf16 on CUDA), over a window of one layer that moves down the model: each
     * layer runs exactly as in the whole model (the KV cache is per layer), and the cache
     * holds one layer's instead of every layer's.  The backend sees the window's layer
     * change under it (the CPU packs it again, CUDA uploads it again). */
    c->window = v->model;
    c->window.cfg.n_layers = 1;
    llmi_backend_opts bo = {.n_threads = 0, .gpu_index = gpu, .gpu_mem_util = LLMI_GPU_MEM_UTIL_DEFAULT,
                            .kv_dtype = gpu >= 0 ? LLMI_KV_BF16 : LLMI_KV_F32, .block_size = CALIB_BLOCK,
                            .max_batch_tokens = W * T, .max_seqs = W};
    if (gpu >= 0 ? backend_cuda_create(&c->window, &bo, &c->backend, st)
                 : backend_cpu_create(&c->window, &bo, &c->backend, st))
        return st->code;
    if (c->backend->kv_alloc(c->backend, W * bpw, st)) goto fail;
    const size_t hidden_bytes = (size_t)n_windows * T * (size_t)cfg->dim * (hidden_dtype == LLMI_F32 ? 4 : 2);
    if (cuda) {
        if (quant_cuda_alloc(cuda, hidden_bytes, "the calibration hidden states", &c->hidden, st)) goto fail;
    } else {
        c->hidden = malloc(hidden_bytes);
        if (hidden_dtype != LLMI_F32) c->stage = malloc((size_t)W * T * cfg->dim * sizeof(float));
    }
    c->pos = malloc((size_t)W * T * sizeof(int32_t));
    c->slot = malloc((size_t)W * T * sizeof(int32_t));
    c->seq_of = malloc((size_t)W * T * sizeof(int32_t));
    c->query_start = malloc((size_t)(W + 1) * sizeof(int32_t));
    c->tables = malloc((size_t)W * bpw * sizeof(int32_t));
    if (!c->hidden || (!cuda && hidden_dtype != LLMI_F32 && !c->stage) || !c->pos || !c->slot || !c->seq_of ||
        !c->query_start || !c->tables) {
        llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for %d x %d calibration hidden states", n_windows, T);
        goto fail;
    }
    /* Window j of a batch is sequence j, with blocks [j * bpw, (j + 1) * bpw); a shorter
     * last batch uses a prefix of the same arrays. */
    for (int j = 0; j < W; j++) {
        c->query_start[j] = j * T;
        for (int i = 0; i < bpw; i++) c->tables[j * bpw + i] = j * bpw + i;
        for (int p = 0; p < T; p++) {
            c->pos[j * T + p] = p;
            c->slot[j * T + p] = (j * bpw + p / CALIB_BLOCK) * CALIB_BLOCK + p % CALIB_BLOCK;
            c->seq_of[j * T + p] = j;
        }
    }
    c->query_start[W] = W * T;
    /* hidden starts as the embeddings: a run of zero layers. */
    c->next_layer = 0;
    for (int w0 = 0; w0 < n_windows; w0 += W) {
        int nw = n_windows - w0 < W ? n_windows - w0 : W;
        llmi_batch bt = {.n_tokens = nw * T, .tokens = tokens + (size_t)w0 * T, .positions = c->pos,
                         .slot_mapping = c->slot, .seq_of_token = c->seq_of, .n_seqs = nw,
                         .query_start = c->query_start, .block_tables = c->tables, .max_blocks_per_seq = bpw};
        llmi_layer_run run = {.first_layer = 0, .last_layer = 0, .embed = true};
        calib_batch_target(c, w0, &run);
        if (c->backend->forward_layers(c->backend, &bt, &run, st) || calib_batch_out(c, w0, nw, -1, &run, st))
            goto fail;
    }
    return LLMI_OK;
fail:
    quant_calib_free(c);
    return st->code ? st->code : LLMI_E_RUNTIME;
}

void quant_calib_free(quant_calib *c) {
    if (c->backend) c->backend->destroy(c->backend);
    if (c->cuda) quant_cuda_free(c->cuda, c->hidden);
    else free(c->hidden);
    free(c->stage);
    free(c->pos);
    free(c->slot);
    free(c->seq_of);
    free(c->query_start);
    free(c->tables);
    memset(c, 0, sizeof *c);
}

void quant_tap_stats_free(quant_tap_stats *s) {
    free(s->gram);
    free(s->xmean);
    memset(s, 0, sizeof *s);
}

typedef struct tap_acc {
    quant_cuda *cuda;               /* Gram matrices on this GPU (slot = tap), or NULL */
    unsigned want;
    int stop;                       /* tap after which the forward stops, -1 = none */
    quant_tap_stats *stats;         /* (LLMI_TAP_COUNT) */
    float inv_n;                    /* 1 / all calibration tokens */
} tap_acc;

/* A wanted tap whose width is not its statistics' would overrun them. */
static int tap_width_check(const tap_acc *a, int layer, llmi_tap tap, int width, llmi_status *st) {
    if (width == a->stats[tap].cols) return 0;
    return llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d tap %d is %d wide, its statistics %d", layer, (int)tap,
                     width, a->stats[tap].cols);
}

static int tap_collect(void *ctx, int layer, llmi_tap tap, const float *x, int n, int width, llmi_status *st) {
    tap_acc *a = ctx;
    if (a->want & (1u << tap)) {
        quant_tap_stats *s = &a->stats[tap];
        if (tap_width_check(a, layer, tap, width, st)) return st->code;
        if (quant_gram_acc(x, n, width, a->inv_n, s->gram))
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory accumulating layer %d's Gram matrix", layer);
        quant_abs_mean_acc(x, n, width, a->inv_n, s->xmean);
    }
    return (int)tap == a->stop ? LLMI_TAP_STOP : 0;
}

/* tap_collect on the GPU: the activation stays where the CUDA backend computed it. */
static int tap_collect_device(void *ctx, int layer, llmi_tap tap, const void *x, llmi_dtype dt, int n, int width,
                              llmi_status *st) {
    tap_acc *a = ctx;
    if ((a->want & (1u << tap)) && (tap_width_check(a, layer, tap, width, st) ||
                                    quant_cuda_gram_acc_device(a->cuda, (int)tap, x, dt, n, a->inv_n, st)))
        return st->code;
    return (int)tap == a->stop ? LLMI_TAP_STOP : 0;
}

/* The backend runs layer 0 of the window: its taps are told the model's layer. */
static int calib_tap(void *ctx, int layer, llmi_tap tap, const float *x, int n, int width, llmi_status *st) {
    quant_calib *c = ctx;
    (void)layer;
    return c->user_tap(c->user_ctx, c->next_layer, tap, x, n, width, st);
}

static int calib_tap_device(void *ctx, int layer, llmi_tap tap, const void *x, llmi_dtype dt, int n, int width,
                            llmi_status *st) {
    quant_calib *c = ctx;
    (void)layer;
    return c->user_tap_device(c->user_ctx, c->next_layer, tap, x, dt, n, width, st);
}

/* quant_calib_run with the tap on the host (tap) or on the device (tap_device, CUDA only). */
static int calib_run(quant_calib *c, llmi_tap_fn tap, llmi_tap_device_fn tap_device, void *tap_ctx, unsigned skip,
                     bool advance, llmi_status *st) {
    const llmi_config *cfg = &c->view->model.cfg;
    const int l = c->next_layer, T = c->seqlen, W = c->windows_per_batch;
    if (l >= cfg->n_layers) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: calibration is past the last layer");
    llmi_backend *b = c->backend;
    c->window.layers = c->view->model.layers + l;
    c->user_tap = tap;
    c->user_tap_device = tap_device;
    c->user_ctx = tap_ctx;
    b->tap = tap ? calib_tap : NULL;
    b->tap_device = tap_device ? calib_tap_device : NULL;
    b->tap_ctx = c;
    b->tap_skip = skip;
    int rc = 0;
    for (int w0 = 0; w0 < c->n_windows && !rc; w0 += W) {
        if (c->cancel && *c->cancel) {
            rc = llmi_fail(st, LLMI_E_INTERRUPT, "quantize: interrupted");
            break;
        }
        int nw = c->n_windows - w0 < W ? c->n_windows - w0 : W;
        llmi_batch bt = {.n_tokens = nw * T, .tokens = c->tokens + (size_t)w0 * T, .positions = c->pos,
                         .slot_mapping = c->slot, .seq_of_token = c->seq_of, .n_seqs = nw,
                         .query_start = c->query_start, .block_tables = c->tables,
                         .max_blocks_per_seq = c->blocks_per_window};
        llmi_layer_run run = {.first_layer = 0, .last_layer = 1};
        calib_batch_in(c, w0, nw, &run);
        c->batch_window = w0;
        rc = b->forward_layers(b, &bt, &run, st);
        if (!rc && advance && run.stopped)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize: a tap stopped layer %d that had to run to its end", l);
        /* the forward wrote its output over its input (in place on the GPU or in fp32) */
        if (!rc && !advance && !run.stopped)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d ran to its end in a pass that does not advance", l);
        if (!rc && advance) rc = calib_batch_out(c, w0, nw, l, &run, st);
    }
    b->tap = NULL;
    b->tap_device = NULL;
    b->tap_ctx = NULL;
    b->tap_skip = 0;
    if (!rc && advance) c->next_layer++;
    return rc;
}

int quant_calib_run(quant_calib *c, llmi_tap_fn tap, void *tap_ctx, unsigned skip, bool advance, llmi_status *st) {
    return calib_run(c, tap, NULL, tap_ctx, skip, advance, st);
}

int quant_calib_layer(quant_calib *c, unsigned want, bool advance, quant_tap_stats stats[LLMI_TAP_COUNT],
                      llmi_status *st) {
    const llmi_config *cfg = &c->view->model.cfg;
    tap_acc acc = {.cuda = c->cuda, .want = want, .stop = -1, .stats = stats,
                   .inv_n = 1.0f / ((float)c->n_windows * (float)c->seqlen)};
    for (int t = 0; t < LLMI_TAP_COUNT; t++) {
        memset(&stats[t], 0, sizeof stats[t]);
        if (!(want & (1u << t))) continue;
        int cols = tap_cols(cfg, (llmi_tap)t);
        stats[t].cols = cols;
        if (!advance) acc.stop = t;
        if (c->cuda && c->grams_stay_on_gpu) continue;
        stats[t].gram = calloc((size_t)cols * cols, sizeof(float));
        stats[t].xmean = calloc((size_t)cols, sizeof(float));
        if (!stats[t].gram || !stats[t].xmean) {
            for (int u = 0; u <= t; u++) quant_tap_stats_free(&stats[u]);
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for a %dx%d Gram matrix", cols, cols);
        }
    }
    int rc = 0;
    for (int t = 0; t < LLMI_TAP_COUNT && c->cuda && !rc; t++)
        if (stats[t].cols) rc = quant_cuda_gram_begin(c->cuda, t, stats[t].cols, st);
    /* (the stop tap is always a wanted one) */
    const unsigned skip = ~want & ((1u << LLMI_TAP_COUNT) - 1);
    if (!rc) rc = c->cuda ? calib_run(c, NULL, tap_collect_device, &acc, skip, advance, st)
                          : calib_run(c, tap_collect, NULL, &acc, skip, advance, st);
    for (int t = 0; t < LLMI_TAP_COUNT && !rc; t++) {
        if (!stats[t].cols) continue;
        if (c->cuda) rc = quant_cuda_gram_end(c->cuda, t, stats[t].gram, stats[t].xmean, st);
        else quant_gram_mirror(stats[t].gram, stats[t].cols);
    }
    if (rc)
        for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&stats[t]);
    return rc;
}
