/* backend_cpu.c — owns the CPU backend: the workspaces, the paged KV cache in host
 * memory, the packed copies of the quantized weights, and the Llama-block forward pass
 * built from the op twins in cpu/ops.h.  Q8_0/Q4_0/Q4_1 linear weights are packed once
 * (cpu_qweight_pack) and their file pages dropped; every other weight is read in place
 * from the model (mmap or loader-owned memory). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/backend.h"
#include "backend/cost.h"
#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/ops.h"


static size_t cpu_kv_block_bytes(const llmi_backend *b) {
    return backend_kv_block_bytes(&b->model->cfg, b->opts.block_size, b->opts.kv_dtype);
}

/* Half of what the kernel calls available (page cache counts as reclaimable). */
static size_t cpu_kv_budget_bytes(const llmi_backend *b) {
    (void)b;
    size_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) { avail = (size_t)kb * 1024; break; }
        fclose(f);
    }
    if (!avail) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        if (pages > 0 && psz > 0) avail = (size_t)pages * (size_t)psz;
    }
    return avail / 2;
}

static int cpu_kv_alloc(llmi_backend *b, int num_blocks, llmi_status *st) {
    cpu_impl *im = b->impl;
    if (num_blocks <= 0) return llmi_fail(st, LLMI_E_USAGE, "cpu backend: KV block count %d must be positive", num_blocks);
    size_t per = cpu_kv_block_bytes(b);
    if (per == 0 || (size_t)num_blocks > SIZE_MAX / per)
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: KV cache of %d blocks overflows size_t", num_blocks);
    free(im->kv);
    im->kv = NULL;
    im->kv_bytes = 0;
    b->num_blocks = 0;
    im->kv = calloc((size_t)num_blocks, per);
    if (!im->kv)
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: cannot allocate %zu MiB of KV cache (%d blocks)",
                         per * (size_t)num_blocks >> 20, num_blocks);
    im->kv_bytes = per * (size_t)num_blocks;
    b->num_blocks = num_blocks;
    return 0;
}

/* Layer l's K region is (num_blocks, block_size, kvd) and its V region follows: one
 * block's part of either is contiguous. */
static int cpu_kv_block_copy(llmi_backend *b, int block, void *host, bool to_host, llmi_status *st) {
    cpu_impl *im = b->impl;
    if (block < 0 || block >= b->num_blocks)
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: KV block %d outside the cache of %d", block, b->num_blocks);
    const llmi_config *c = &b->model->cfg;
    size_t part = (size_t)b->opts.block_size * kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)c->n_kv_heads * c->head_dim);
    size_t region = part * (size_t)b->num_blocks;
    char *h = host;
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++, h += part) {
            char *dev = (char *)im->kv + ((size_t)l * 2 + kv) * region + (size_t)block * part;
            memcpy(to_host ? h : dev, to_host ? dev : h, part);
        }
    return 0;
}
static int cpu_kv_read_block(llmi_backend *b, int block, void *dst, llmi_status *st) {
    return cpu_kv_block_copy(b, block, dst, true, st);
}
static int cpu_kv_write_block(llmi_backend *b, int block, const void *src, llmi_status *st) {
    return cpu_kv_block_copy(b, block, (void *)src, false, st);
}

static const llmi_tensor *layer_weight(const llmi_layer *L, int i) {
    const llmi_tensor *w[CPU_W_PER_LAYER] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down,
                                             &L->w_router};
    return w[i];
}

/* Whether [p, p + len) lies inside one of the model's file mappings. */
static size_t tensor_bytes(const llmi_tensor *t) { return (size_t)t->rows * t->row_bytes; }

/* The forward's weight at slot: the packed copy of src when it packs, else src itself. */
static int refresh_one(llmi_backend *b, cpu_packed *slot, const llmi_tensor *src, const llmi_tensor **use,
                       llmi_status *st) {
    if (!src->data || !cpu_qweight_packable(src)) {
        *use = src;
        return LLMI_OK;
    }
    if (slot->src != src->data || slot->dtype != src->dtype || slot->rows != src->rows || slot->cols != src->cols) {
        free(slot->t.owned);
        memset(slot, 0, sizeof *slot);
        if (cpu_qweight_pack(src, &slot->t, st)) return st->code;
        *slot = (cpu_packed){src->data, src->dtype, src->rows, src->cols, slot->t};
        /* the embedding table stays in use (a tied lm_head reads the same bytes) */
        if (src->data != b->model->tok_embd.data) model_release_pages(b->model, src->data, tensor_bytes(src));
    }
    *use = &slot->t;
    return LLMI_OK;
}

/* Expert e's matrix `which` (CPU_E_*) of a MoE layer: rows of the stacked tensor. */
static llmi_tensor expert_view(const llmi_layer *L, const llmi_config *c, int e, int which) {
    const llmi_tensor *s = which == CPU_E_GATE ? &L->w_gate : which == CPU_E_UP ? &L->w_up : &L->w_down;
    llmi_tensor v = *s;
    v.owned = NULL;
    v.rows = which == CPU_E_DOWN ? c->dim : c->ffn_dim;
    v.data = (const uint8_t *)s->data + (size_t)e * (size_t)v.rows * s->row_bytes;
    return v;
}

int cpu_weights_refresh(llmi_backend *b, llmi_status *st) {
    cpu_impl *im = b->impl;
    const llmi_model *m = b->model;
    const llmi_config *c = &m->cfg;
    const int L = c->n_layers, E = c->n_experts;
    size_t bytes = tensor_bytes(&m->tok_embd);
    for (int l = 0; l < L; l++)
        for (int i = 0; i < CPU_W_PER_LAYER; i++) {
            const llmi_tensor *src = layer_weight(&m->layers[l], i), **use = &im->lw[(size_t)l * CPU_W_PER_LAYER + i];
            if (E > 0 && (i == CPU_W_GATE || i == CPU_W_UP || i == CPU_W_DOWN)) {
                *use = src;   /* read expert by expert, below */
                continue;
            }
            if (refresh_one(b, &im->packed[(size_t)l * CPU_W_PER_LAYER + i], src, use, st)) return st->code;
            bytes += (*use)->layout == LLMI_LAYOUT_CPU16 ? cpu_qweight_bytes(*use) : tensor_bytes(*use);
        }
    /* a stacked matrix's experts are looked at again only when its data changed (this runs
     * every forward; a MoE has n_layers * 3 * n_experts of them) */
    for (int l = 0; l < L && E > 0; l++)
        for (int i = 0; i < CPU_E_PER_EXPERT; i++) {
            const size_t li = (size_t)l * CPU_E_PER_EXPERT + i;
            const void *data = layer_weight(&m->layers[l], CPU_W_GATE + i)->data;
            if (im->expert_src[li] != data) {
                size_t sum = 0;
                for (int e = 0; e < E; e++) {
                    size_t at = ((size_t)l * E + e) * CPU_E_PER_EXPERT + i;
                    im->expert_views[at] = expert_view(&m->layers[l], c, e, i);
                    if (refresh_one(b, &im->expert_packed[at], &im->expert_views[at], &im->experts[at], st))
                        return st->code;
                    sum += im->experts[at]->layout == LLMI_LAYOUT_CPU16 ? cpu_qweight_bytes(im->experts[at])
                                                                         : tensor_bytes(im->experts[at]);
                }
                im->expert_src[li] = data;
                im->expert_bytes[li] = sum;
            }
            bytes += im->expert_bytes[li];
        }
    if (refresh_one(b, &im->packed[(size_t)L * CPU_W_PER_LAYER], &m->lm_head, &im->lm_head, st)) return st->code;
    if (im->lm_head->layout == LLMI_LAYOUT_CPU16) bytes += cpu_qweight_bytes(im->lm_head);
    else if (im->lm_head->data != m->tok_embd.data) bytes += tensor_bytes(im->lm_head);
    im->weight_bytes = bytes;
    return LLMI_OK;
}

static void cpu_memory(const llmi_backend *b, size_t *weights, size_t *kv, size_t *activations) {
    const cpu_impl *im = b->impl;
    if (weights) *weights = im->weight_bytes;
    if (kv) *kv = im->kv_bytes;
    if (activations) *activations = im->ws_bytes;
}

static void cpu_destroy(llmi_backend *b) {
    if (!b) return;
    cpu_impl *im = b->impl;
    if (im) {
        free(im->x); free(im->xn); free(im->q); free(im->k); free(im->v); free(im->att);
        free(im->delta); free(im->gate); free(im->up); free(im->lg); free(im->inv_freq);
        free(im->rope_cs); free(im->rope_sn);
        free(im->inv_freq_local); free(im->rope_cs_local); free(im->rope_sn_local);
        free(im->seq_maxpos); free(im->kv); free(im->mm_scratch); free(im->kv_scale);
        cpu_step_destroy(im->step);
        for (int i = 0; im->packed && i <= b->model->cfg.n_layers * CPU_W_PER_LAYER; i++) free(im->packed[i].t.owned);
        free(im->packed);
        free(im->lw);
        size_t n_exp = (size_t)b->model->cfg.n_layers * b->model->cfg.n_experts * CPU_E_PER_EXPERT;
        for (size_t i = 0; im->expert_packed && i < n_exp; i++) free(im->expert_packed[i].t.owned);
        free(im->expert_views); free(im->expert_packed); free(im->experts); free(im->expert_src); free(im->expert_bytes);
        free(im->moe_logits); free(im->moe_sel); free(im->moe_wt); free(im->moe_tok); free(im->moe_row);
        free(im->moe_start); free(im->moe_x); free(im->moe_y);
        free(im);
    }
    free(b);
}

static int check_batch(const llmi_backend *b, const llmi_batch *bt, llmi_status *st) {
    cpu_impl *im = b->impl;
    if (!im->kv) return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: forward before kv_alloc");
    if (b->tap_device)
        return llmi_fail(st, LLMI_E_USAGE, "cpu backend: taps on the device are the cuda backend's (set tap instead)");
    batch_limits lim = {.who = "cpu", .max_tokens = im->max_tokens, .max_seqs = im->max_seqs,
                        .n_vocab = b->model->cfg.n_vocab, .num_blocks = b->num_blocks,
                        .block_size = b->opts.block_size};
    return batch_check(bt, &lim, im->seq_maxpos, st);
}

static void cpu_matmul_1(cpu_impl *im, const llmi_tensor *w, const float *x, int n, float *y) {
    cpu_matmul_multi(1, &w, x, n, NULL, &y, im->mm_scratch, im->mm_scratch_bytes);
}

/* Calls the tap, if any; returns 1 when the forward must stop here. */
static int tap(llmi_backend *b, int l, llmi_tap t, const float *x, int n, int width, int *rc, llmi_status *st) {
    if (!b->tap || (b->tap_skip >> t & 1u)) return 0;
    int r = b->tap(b->tap_ctx, l, t, x, n, width, st);
    if (r == LLMI_TAP_STOP) return 1;
    *rc = r;
    return r != 0;
}

/* A MoE layer's MLP: im->delta (n, dim) = for each token the sum over its experts, in
 * ascending expert order, of routing weight * expert(xn), from im->xn (n, dim).  Each
 * expert runs once on the rows of the tokens routed to it, gathered, so a step reads only
 * the experts its tokens chose; a token's sum does not depend on the rest of the batch. */
static int moe_mlp(llmi_backend *b, int l, int n, double *t0, llmi_status *st) {
    cpu_impl *im = b->impl;
    const llmi_config *c = &b->model->cfg;
    const int dim = c->dim, ffn = c->ffn_dim, E = c->n_experts, k = c->n_experts_used;
    const llmi_tensor *router = im->lw[(size_t)l * CPU_W_PER_LAYER + CPU_W_ROUTER];
    cpu_matmul_1(im, router, im->xn, n, im->moe_logits);
    cpu_moe_route(im->moe_logits, n, E, k, c->moe_norm_topk, im->moe_sel, im->moe_wt);
    if (backend_moe_group(im->moe_sel, n, k, E, im->moe_start, im->moe_tok, im->moe_row, st)) return st->code;
    prof(b, LLMI_OP_MLP_UP, t0, mm_cost(router, n));
    const llmi_tensor *const *X = im->experts + (size_t)l * E * CPU_E_PER_EXPERT;
    for (int e = 0; e < E; e++) {
        const int p0 = im->moe_start[e], cnt = im->moe_start[e + 1] - p0;
        if (cnt == 0) continue;
        const llmi_tensor *const *W = X + (size_t)e * CPU_E_PER_EXPERT;
        cpu_gather_rows(im->xn, dim, im->moe_tok + p0, cnt, im->moe_x);
        const llmi_tensor *gu_w[2] = {W[CPU_E_GATE], W[CPU_E_UP]};
        float *gu_y[2] = {im->gate, im->up};
        cpu_matmul_multi(2, gu_w, im->moe_x, cnt, NULL, gu_y, im->mm_scratch, im->mm_scratch_bytes);
        prof(b, LLMI_OP_MLP_UP, t0, cost_sum(mm_cost(W[CPU_E_GATE], cnt), mm_cost(W[CPU_E_UP], cnt)));
        cpu_swiglu(im->gate, im->up, cnt, ffn, im->gate);
        prof(b, LLMI_OP_ACT, t0, cost_swiglu(cnt, ffn, sizeof(float)));
        cpu_matmul_1(im, W[CPU_E_DOWN], im->gate, cnt, im->moe_y + (size_t)p0 * dim);
        prof(b, LLMI_OP_MLP_DOWN, t0, mm_cost(W[CPU_E_DOWN], cnt));
    }
    cpu_moe_combine(im->moe_y, im->moe_row, im->moe_wt, n, k, dim, 0, dim, im->delta);
    return 0;
}

/* A sub-block's output rows im->delta (n, dim) made what the residual add takes, in place:
 * RMS-normed by post_w (Gemma's sandwich norm; none without it), then times Granite's residual
 * scale (step.c's sub_block_out_row per row, the CUDA backend's sub_block_out). */
static void sub_block_out(llmi_backend *b, const float *post_w, int n, double *t0) {
    cpu_impl *im = b->impl;
    const llmi_config *c = &b->model->cfg;
    if (post_w) {
        cpu_rmsnorm(im->delta, post_w, n, c->dim, c->norm_eps, im->delta);
        prof(b, LLMI_OP_NORM, t0, cost_rmsnorm(n, c->dim, false, sizeof(float)));
    }
    if (config_residual_scale(c) != 1.0f) cpu_scale(im->delta, (size_t)n * c->dim, config_residual_scale(c));
}

/* Decoder layers [first, last) over the batch.  The residual stream is im->x plus, when
 * *pending, im->delta: each layer folds the previous one's output into x inside its
 * first norm, so the stream is never written twice.  Returns 0 with *stopped set when a
 * tap asked to stop. */
static int run_layers(llmi_backend *b, const llmi_batch *bt, int first, int last, bool *pending, bool *stopped,
                      double *t0, llmi_status *st) {
    cpu_impl *im = b->impl;
    const llmi_model *m = b->model;
    const llmi_config *c = &m->cfg;
    const int n = bt->n_tokens, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim;
    const int qd = nh * hd, kvd = nkv * hd;
    const size_t layer_kv = (size_t)b->num_blocks * b->opts.block_size *
                            kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)kvd);   /* one of K or V */
    const double esz = (double)kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)kvd) / kvd;   /* per value */
    /* keys attended, summed over tokens, for attention stats: full layers, sliding layers */
    const double ctx_sum = batch_attended_keys(bt, 0), ctx_sum_win = batch_attended_keys(bt, c->sliding_window);
    cpu_rope_table(bt->positions, n, hd, c->rope_dim, im->inv_freq, config_rope_mscale(c, false), im->rope_cs,
                   im->rope_sn);
    if (c->rope_theta_local > 0)
        cpu_rope_table(bt->positions, n, hd, c->rope_dim, im->inv_freq_local, config_rope_mscale(c, true),
                       im->rope_cs_local, im->rope_sn_local);
    int rc = 0;
    *stopped = false;
#define TAP(l, t, x, w)                                             \
    do {                                                            \
        if (tap(b, (l), (t), (x), n, (w), &rc, st)) {               \
            *stopped = rc == 0;                                     \
            return rc;                                              \
        }                                                           \
    } while (0)

    for (int l = first; l < last; l++) {
        const llmi_layer *L = &m->layers[l];
        bool add = *pending;
        if (add)
            cpu_add_rmsnorm(im->x, im->delta, L->attn_norm, n, dim, c->norm_eps, im->xn);
        else
            cpu_rmsnorm(im->x, L->attn_norm, n, dim, c->norm_eps, im->xn);
        *pending = false;
        prof(b, LLMI_OP_NORM, t0, cost_rmsnorm(n, dim, add, sizeof(float)));
        TAP(l, LLMI_TAP_ATTN_IN, im->xn, dim);

        const llmi_tensor *const *W = im->lw + (size_t)l * CPU_W_PER_LAYER;
        const llmi_tensor *qkv_w[3] = {W[CPU_W_Q], W[CPU_W_K], W[CPU_W_V]};
        const float *qkv_b[3] = {L->bq, L->bk, L->bv};
        float *qkv_y[3] = {im->q, im->k, im->v};
        cpu_matmul_multi(3, qkv_w, im->xn, n, qkv_b, qkv_y, im->mm_scratch, im->mm_scratch_bytes);
        prof(b, LLMI_OP_QKV, t0, cost_sum(mm_cost(W[CPU_W_Q], n), cost_sum(mm_cost(W[CPU_W_K], n), mm_cost(W[CPU_W_V], n))));

        if (L->q_norm) {   /* Qwen3: each head normalised before RoPE (cfg.qk_norm) */
#pragma omp parallel for schedule(static) if (n > 16)
            for (int t = 0; t < n; t++) {
                cpu_head_rmsnorm(im->q + (size_t)t * qd, qd, 1, 0, nh, hd, L->q_norm, c->norm_eps);
                cpu_head_rmsnorm(im->k + (size_t)t * kvd, kvd, 1, 0, nkv, hd, L->k_norm, c->norm_eps);
            }
            prof(b, LLMI_OP_NORM, t0, cost_rmsnorm(n, qd + kvd, false, sizeof(float)));
        }
        char *kc = (char *)im->kv + (size_t)l * 2 * layer_kv, *vc = kc + layer_kv;
        const bool local = config_layer_rope_local(c, l);
        cpu_rope_kv_write_table(im->q, im->k, im->v, local ? im->rope_cs_local : im->rope_cs,
                                local ? im->rope_sn_local : im->rope_sn, bt->slot_mapping, n, nh, nkv, hd,
                                config_layer_rope_dim(c, l), kc, vc, b->opts.kv_dtype, im->kv_scale + ((size_t)l * 2) * nkv,
                                im->kv_scale + ((size_t)l * 2 + 1) * nkv);
        prof(b, LLMI_OP_ROPE_KV, t0, cost_rope_kv(n, qd, kvd, esz));

        cpu_paged_attention(im->q, kc, vc, b->opts.kv_dtype, im->kv_scale + ((size_t)l * 2) * nkv,
                            im->kv_scale + ((size_t)l * 2 + 1) * nkv, bt, nh, nkv, hd, b->opts.block_size,
                            cpu_layer_scores(c, l), im->att);
        prof(b, LLMI_OP_ATTN, t0, cost_attention(config_layer_window(c, l) ? ctx_sum_win : ctx_sum, n, qd, kvd, esz,
                                                  sizeof(float)));
        TAP(l, LLMI_TAP_O_IN, im->att, qd);

        const float *bo[1] = {L->bo};
        const llmi_tensor *wo[1] = {W[CPU_W_O]};
        cpu_matmul_multi(1, wo, im->att, n, bo, &im->delta, im->mm_scratch, im->mm_scratch_bytes);
        prof(b, LLMI_OP_O_PROJ, t0, mm_cost(W[CPU_W_O], n));
        sub_block_out(b, L->post_attn_norm, n, t0);

        cpu_add_rmsnorm(im->x, im->delta, L->ffn_norm, n, dim, c->norm_eps, im->xn);
        prof(b, LLMI_OP_NORM, t0, cost_rmsnorm(n, dim, true, sizeof(float)));
        TAP(l, LLMI_TAP_MLP_IN, im->xn, dim);

        if (c->n_experts > 0) {
            if (moe_mlp(b, l, n, t0, st)) return st->code;
        } else {
            const llmi_tensor *gu_w[2] = {W[CPU_W_GATE], W[CPU_W_UP]};
            float *gu_y[2] = {im->gate, im->up};
            cpu_matmul_multi(2, gu_w, im->xn, n, NULL, gu_y, im->mm_scratch, im->mm_scratch_bytes);
            prof(b, LLMI_OP_MLP_UP, t0, cost_sum(mm_cost(W[CPU_W_GATE], n), mm_cost(W[CPU_W_UP], n)));

            if (c->act == LLMI_ACT_GELU_TANH) cpu_geglu(im->gate, im->up, n, ffn, im->gate);
            else cpu_swiglu(im->gate, im->up, n, ffn, im->gate);
            prof(b, LLMI_OP_ACT, t0, cost_swiglu(n, ffn, sizeof(float)));
            TAP(l, LLMI_TAP_DOWN_IN, im->gate, ffn);

            cpu_matmul_1(im, W[CPU_W_DOWN], im->gate, n, im->delta);
            prof(b, LLMI_OP_MLP_DOWN, t0, mm_cost(W[CPU_W_DOWN], n));
        }
        sub_block_out(b, L->post_ffn_norm, n, t0);
        /* a control vector joins the layer's output: x + (delta + v), the sum step.c forms */
        if (L->control) cpu_add_bias(im->delta, n, dim, L->control);
        *pending = true;
    }
#undef TAP
    return 0;
}

static int cpu_threads(const llmi_backend_opts *o) { return o->n_threads > 0 ? o->n_threads : omp_get_num_procs(); }

/* The nthreads ICV belongs to the calling thread: set for one call, restored after. */
static int threads_enter(const llmi_backend *b) {
    int prev = omp_get_max_threads();
    omp_set_num_threads(cpu_threads(&b->opts));
    return prev;
}

static int cpu_forward(llmi_backend *b, const llmi_batch *bt, float *logits, llmi_status *st) {
    if (check_batch(b, bt, st) || cpu_weights_refresh(b, st)) return st->code;
    cpu_impl *im = b->impl;
    const llmi_model *m = b->model;
    const llmi_config *c = &m->cfg;
    const int n = bt->n_tokens, dim = c->dim;
    if (im->step && n <= CPU_STEP_MAX_TOKENS && !b->tap) {
        cpu_step_forward(b, bt, logits);
        return 0;
    }
    int prev_threads = threads_enter(b);
    double t0 = omp_get_wtime();

    cpu_embed(&m->tok_embd, bt->tokens, n, im->x);
    if (config_embed_scale(c) != 1.0f) cpu_scale(im->x, (size_t)n * dim, config_embed_scale(c));
    prof(b, LLMI_OP_EMBED, &t0, cost_embed(n, dim, (double)m->tok_embd.row_bytes, sizeof(float)));
    bool pending = false, stopped = false;
    int rc = run_layers(b, bt, 0, c->n_layers, &pending, &stopped, &t0, st);

    /* Only the rows that need logits go through the final norm and lm_head. */
    int nl = rc || stopped ? 0 : bt->n_logits;
    for (int i = 0; i < nl; i++) {
        size_t r = (size_t)bt->logit_rows[i] * dim;
        for (int j = 0; j < dim; j++) im->lg[(size_t)i * dim + j] = im->x[r + j] + im->delta[r + j];
    }
    if (nl > 0) {
        cpu_rmsnorm(im->lg, m->out_norm, nl, dim, c->norm_eps, im->lg);
        prof(b, LLMI_OP_NORM, &t0, cost_rmsnorm(nl, dim, true, sizeof(float)));
        cpu_matmul_1(im, im->lm_head, im->lg, nl, logits);
        cpu_logits_finish(logits, nl, c->n_vocab, 0, c->n_vocab, config_logit_scale(c), c->final_softcap);
        prof(b, LLMI_OP_LM_HEAD, &t0, mm_cost(im->lm_head, nl));
    }
    omp_set_num_threads(prev_threads);
    return rc;
}

static int cpu_forward_layers(llmi_backend *b, const llmi_batch *bt, llmi_layer_run *run, llmi_status *st) {
    if (check_batch(b, bt, st) || cpu_weights_refresh(b, st)) return st->code;
    cpu_impl *im = b->impl;
    const llmi_model *m = b->model;
    const int n = bt->n_tokens, dim = m->cfg.dim;
    if (run->first_layer < 0 || run->last_layer > m->cfg.n_layers || run->first_layer > run->last_layer)
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: layer range %d..%d outside the model's %d layers",
                         run->first_layer, run->last_layer, m->cfg.n_layers);
    if (run->hidden_device)
        return llmi_fail(st, LLMI_E_USAGE, "cpu backend: hidden states on a device are the cuda backend's");
    int prev_threads = threads_enter(b);
    double t0 = omp_get_wtime();
    if (run->embed) {
        cpu_embed(&m->tok_embd, bt->tokens, n, im->x);
        if (config_embed_scale(&m->cfg) != 1.0f) cpu_scale(im->x, (size_t)n * dim, config_embed_scale(&m->cfg));
        prof(b, LLMI_OP_EMBED, &t0, cost_embed(n, dim, (double)m->tok_embd.row_bytes, sizeof(float)));
    } else {
        memcpy(im->x, run->hidden, (size_t)n * dim * sizeof(float));
    }
    bool pending = false;
    int rc = run_layers(b, bt, run->first_layer, run->last_layer, &pending, &run->stopped, &t0, st);
    if (!rc && !run->stopped) {
        /* The same sum the next layer's fused norm would form. */
        size_t total = (size_t)n * dim;
        for (size_t i = 0; i < total; i++) run->hidden[i] = pending ? im->x[i] + im->delta[i] : im->x[i];
    }
    omp_set_num_threads(prev_threads);
    return rc;
}

static int check_model(const llmi_model *m, llmi_status *st) {
    if (backend_check_model(m, "cpu", st)) return st->code;
    const llmi_config *c = &m->cfg;
    if (c->head_dim > 512 || c->head_dim % 2)   /* cpu/attention.c keeps (16, head_dim) rows on the stack */
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: head_dim %d must be even and at most 512", c->head_dim);
    return 0;
}

static void read_cpu_name(char *dst, size_t cap) {
    snprintf(dst, cap, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ' || *p == '\t') p++;
                p[strcspn(p, "\n")] = '\0';
                snprintf(dst, cap, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* Workspace sizes for T batch tokens: floats of x, xn, q, k, v, att, delta, gate, up, lg,
 * inv_freq, rope_cs, rope_sn, the local RoPE's three (16 floats without one), the MoE
 * routing's eight (16 floats each for a dense model; int32 arrays counted as floats) (the
 * order of cpu_impl), then the matmul scratch in bytes. */
enum { CPU_WS_COUNT = 25 };
static void cpu_ws_sizes(const llmi_config *c, int max_batch_tokens, size_t sz[CPU_WS_COUNT]) {
    size_t T = (size_t)max_batch_tokens;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    const bool local = c->rope_theta_local > 0, moe = c->n_experts > 0;
    const size_t k = (size_t)c->n_experts_used;
    size_t f[CPU_WS_COUNT - 1] = {T * c->dim, T * c->dim, T * qd, T * kvd, T * kvd, T * qd, T * c->dim,
                                  T * c->ffn_dim, T * c->ffn_dim, T * c->dim, (size_t)c->head_dim / 2,
                                  T * c->head_dim / 2, T * c->head_dim / 2, local ? (size_t)c->head_dim / 2 : 16,
                                  local ? T * c->head_dim / 2 : 16, local ? T * c->head_dim / 2 : 16,
                                  moe ? T * c->n_experts : 16, moe ? T * k : 16, moe ? T * k : 16, moe ? T * k : 16,
                                  moe ? T * k : 16, moe ? (size_t)c->n_experts + 1 : 16, moe ? T * c->dim : 16,
                                  moe ? T * k * c->dim : 16};
    memcpy(sz, f, sizeof f);
    int64_t widest = c->dim > c->ffn_dim ? c->dim : c->ffn_dim;
    if ((int64_t)qd > widest) widest = (int64_t)qd;
    sz[CPU_WS_COUNT - 1] = cpu_matmul_scratch_bytes(max_batch_tokens, widest);
}

size_t backend_cpu_workspace_bytes(const llmi_config *c, int max_batch_tokens) {
    size_t sz[CPU_WS_COUNT], total = 0;
    cpu_ws_sizes(c, max_batch_tokens, sz);
    for (int i = 0; i < CPU_WS_COUNT - 1; i++) total += (sz[i] * sizeof(float) + 63) / 64 * 64;
    return total + sz[CPU_WS_COUNT - 1];
}

static float *ws_alloc(cpu_impl *im, size_t n_floats, int *fail) {
    float *p = aligned_alloc(64, (n_floats * sizeof(float) + 63) / 64 * 64);
    if (!p) *fail = 1;
    im->ws_bytes += n_floats * sizeof(float);
    return p;
}

int backend_cpu_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st) {
    *out = NULL;
    if (check_model(m, st)) return st->code;
    if (o->block_size <= 0 || o->max_batch_tokens <= 0 || o->max_seqs <= 0)
        return llmi_fail(st, LLMI_E_USAGE, "cpu backend: block_size, max_batch_tokens and max_seqs must be positive");
    if (backend_check_kv_dtype(&m->cfg, o->kv_dtype, "cpu", st)) return st->code;
    llmi_backend *b = calloc(1, sizeof *b);
    cpu_impl *im = calloc(1, sizeof *im);
    if (!b || !im) {
        free(b); free(im);
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: out of memory");
    }
    const llmi_config *c = &m->cfg;
    b->name = "cpu";
    read_cpu_name(b->device_name, sizeof b->device_name);
    b->model = m;
    b->opts = *o;
    b->opts.n_threads = cpu_threads(o);   /* resolved once: reports and every forward use this count */
    b->impl = im;
    b->kv_block_bytes = cpu_kv_block_bytes;
    b->kv_budget_bytes = cpu_kv_budget_bytes;
    b->kv_alloc = cpu_kv_alloc;
    b->kv_read_block = cpu_kv_read_block;
    b->kv_write_block = cpu_kv_write_block;
    b->forward = cpu_forward;
    b->forward_layers = cpu_forward_layers;
    b->memory = cpu_memory;
    b->destroy = cpu_destroy;
    im->max_tokens = o->max_batch_tokens;
    im->max_seqs = o->max_seqs;
    size_t sz[CPU_WS_COUNT];
    cpu_ws_sizes(c, o->max_batch_tokens, sz);
    int fail = 0;
    float **ws[CPU_WS_COUNT - 1] = {&im->x, &im->xn, &im->q, &im->k, &im->v, &im->att, &im->delta, &im->gate, &im->up,
                                    &im->lg, &im->inv_freq, &im->rope_cs, &im->rope_sn, &im->inv_freq_local,
                                    &im->rope_cs_local, &im->rope_sn_local, &im->moe_logits, NULL, &im->moe_wt, NULL,
                                    NULL, NULL, &im->moe_x, &im->moe_y};
    for (int i = 0; i < CPU_WS_COUNT - 1; i++)
        if (ws[i]) *ws[i] = ws_alloc(im, sz[i], &fail);
    im->moe_sel = (int32_t *)ws_alloc(im, sz[17], &fail);   /* the int32 arrays of that list */
    im->moe_tok = (int32_t *)ws_alloc(im, sz[19], &fail);
    im->moe_row = (int32_t *)ws_alloc(im, sz[20], &fail);
    im->moe_start = (int32_t *)ws_alloc(im, sz[21], &fail);
    im->seq_maxpos = calloc((size_t)o->max_seqs, sizeof(int32_t));
    size_t n_scales = (size_t)c->n_layers * 2 * c->n_kv_heads;
    im->kv_scale = malloc(n_scales * sizeof(float));
    for (size_t i = 0; im->kv_scale && i < n_scales; i++) im->kv_scale[i] = 1.0f;
    im->mm_scratch_bytes = sz[CPU_WS_COUNT - 1];
    im->mm_scratch = aligned_alloc(64, im->mm_scratch_bytes);
    im->ws_bytes += im->mm_scratch_bytes;
    im->packed = calloc((size_t)c->n_layers * CPU_W_PER_LAYER + 1, sizeof *im->packed);
    im->lw = calloc((size_t)c->n_layers * CPU_W_PER_LAYER, sizeof *im->lw);
    if (c->n_experts > 0) {
        size_t n_exp = (size_t)c->n_layers * c->n_experts * CPU_E_PER_EXPERT;
        im->expert_views = calloc(n_exp, sizeof *im->expert_views);
        im->expert_packed = calloc(n_exp, sizeof *im->expert_packed);
        im->experts = calloc(n_exp, sizeof *im->experts);
        im->expert_src = calloc((size_t)c->n_layers * CPU_E_PER_EXPERT, sizeof *im->expert_src);
        im->expert_bytes = calloc((size_t)c->n_layers * CPU_E_PER_EXPERT, sizeof *im->expert_bytes);
        fail |= !im->expert_views || !im->expert_packed || !im->experts || !im->expert_src || !im->expert_bytes;
    }
    if (fail || !im->seq_maxpos || !im->mm_scratch || !im->kv_scale || !im->packed || !im->lw) {
        cpu_destroy(b);
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: cannot allocate workspaces for %d tokens", o->max_batch_tokens);
    }
    if (cpu_step_supports(m)) {
        int st_tokens = o->max_batch_tokens < CPU_STEP_MAX_TOKENS ? o->max_batch_tokens : CPU_STEP_MAX_TOKENS;
        im->step = cpu_step_create(c, cpu_threads(o), st_tokens, &im->ws_bytes);
        if (!im->step) {
            cpu_destroy(b);
            return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: cannot allocate the decode workspaces");
        }
    }
    backend_rope_inv_freq(c, im->inv_freq);
    if (c->rope_theta_local > 0) backend_rope_inv_freq_local(c, im->inv_freq_local);
    if (cpu_weights_refresh(b, st)) {   /* packed now, so the first forward's TTFT does not pay for it */
        cpu_destroy(b);
        return st->code;
    }
    *out = b;
    return 0;
}
