/* backend_cuda.c — owns the CUDA backend: device selection and checks, the weights in
 * device memory (bf16 for every dense dtype, fp16 models included; GPTQ/AWQ int4 linears
 * kept packed for the W4A16 kernels), the paged KV cache, the activation workspaces, the
 * stream and cuBLASLt context, the forward pass that runs the op sequence of
 * backend_cpu.c through the launchers of kernels/kernels.h, decode graphs, and sampling
 * on the device (forward_sample).  Decisions that need no GPU live in cuda_plan.c.
 *
 * Tier 3 of the kernel tiers: shapes and dtypes are checked here, once per model or per
 * batch, so the launchers can trust their arguments.  Every CUDA / cuBLAS call goes
 * through CU_CHECK, which turns a failure into an llmi_status naming file, line and call.
 * Built without CUDA, only the two entry points remain and say so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cost.h"
#include "core/int4.h"

#ifndef LLMI_CUDA

bool backend_cuda_compiled(void) { return false; }
int backend_cuda_device_count(void) { return 0; }

int backend_cuda_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st) {
    (void)m;
    (void)o;
    *out = NULL;
    return llmi_fail(st, LLMI_E_USAGE, "--device cuda: this llmi was built without CUDA (nvcc not found at build time)");
}

#else

#include <cuda_runtime_api.h>
#include "backend/cuda/cuda_plan.h"
#include "int4_gemm.h"
#include "kernels.h"

#define CU_CHECK(st, call)                                                                                \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess)                                                                            \
            return llmi_fail((st), LLMI_E_RUNTIME, "cuda backend: %s:%d: %s: %s", __FILE__, __LINE__, #call, \
                             cudaGetErrorString(e_));                                                     \
    } while (0)

_Static_assert(CUDA_I4_GEMV_MAX_N == LLMI_I4_GEMV_MAX_N, "cuda_plan.h and int4_gemm.h disagree on the GEMV batch");
_Static_assert(CUDA_GEMM_TUNE_MAX == LLMI_GEMM_TUNE_MAX, "cuda_plan.h and kernels.h disagree on the tuning limit");

/* Staging for the weight upload: two pinned host buffers and two device buffers, so the
 * memcpy out of the mmap, the host-to-device copy and the dequant of neighbouring chunks
 * overlap. */
#define STAGE_BYTES ((size_t)32 << 20)
#define GEMM_WORKSPACE ((size_t)32 << 20)
#define LOGIT_CHUNK 256   /* logit rows per lm_head GEMM (bounds the logits buffer) */

/* One linear layer's weight: dense bf16, or int4 (GPTQ/AWQ) kept packed and served by
 * the W4A16 kernels of int4_gemm.cu. */
typedef struct cuda_linear {
    void *dense;              /* (rows, cols) bf16, or NULL when int4 */
    llmi_i4g_dev q4;          /* int4: nibbles, scales, zeros, g_idx on the device */
    int64_t rows, cols;
    size_t bytes;             /* on the GPU (for costs) */
} cuda_linear;

/* What a layer was uploaded from: forward_layers uploads a part of a layer again when the
 * caller has put other tensors there (the quantizer moves a one-layer window down the model
 * and swaps its quantized linears in, one group at a time). */
typedef struct cuda_layer_src {
    const void *w[8];         /* data of q, k, v, o, gate, up, down, router (NULL for a dense MLP) */
    llmi_dtype dt[8];
    const float *f[11];       /* attn_norm, ffn_norm, q_norm, k_norm, post_attn_norm, post_ffn_norm, control, bq, bk,
                                 bv, bo */
} cuda_layer_src;

/* The parts of a layer that are uploaded (and replaced) on their own: a quantizer step
 * swaps one group of linears, and the rest of the layer, its bf16 bulk, stays put. */
typedef enum { LP_NORMS, LP_QKV, LP_O, LP_GU, LP_DOWN, LP_ROUTER, LP_COUNT } cuda_layer_part;

typedef struct cuda_layer {
    cuda_layer_src src;
    size_t part_bytes[LP_COUNT];   /* device bytes of each part's buffers below */
    float *attn_norm;         /* (dim) */
    float *ffn_norm;          /* (dim) */
    float *q_norm, *k_norm;   /* (head_dim) each, or NULL without qk_norm (Qwen3) */
    float *post_attn_norm, *post_ffn_norm;   /* (dim) each, or NULL without post_norms (Gemma 3) */
    float *control;           /* (dim) the layer's control vector, or NULL without one */
    cuda_linear qkv[3];       /* [0] is (q_dim + 2*kv_dim, dim), wq rows then wk then wv, dense
                                 or int4; int4 parts that cannot stack: q, k, v, each writing
                                 its columns of the qkv buffer */
    int n_qkv;                /* 1 (stacked) or 3 */
    float *b_qkv;             /* (q_dim + 2*kv_dim) or NULL without bias */
    float *b_o;               /* (dim) or NULL without o_proj bias */
    cuda_linear wo;           /* (dim, q_dim) */
    cuda_linear gu[2];        /* [0] is (2*ffn_dim, dim), gate rows then up; or gate, up apart as qkv.
                                 MoE: [0] is (n_experts * 2*ffn_dim, dim) bf16, expert e's gate rows
                                 then its up rows at [e * 2*ffn_dim, (e + 1) * 2*ffn_dim) */
    int n_gu;
    cuda_linear down;         /* (dim, ffn_dim); MoE: (n_experts * dim, ffn_dim) bf16, expert e's rows
                                 [e * dim, (e + 1) * dim) */
    cuda_linear router;       /* MoE: (n_experts, dim) bf16; empty for a dense MLP */
} cuda_layer;

/* Weights cross through two pinned stages, each with its device twin: one fills while the
 * other is copied and converted. */
typedef struct uploader {
    void *host[2];            /* (STAGE_BYTES) pinned */
    void *dev[2];             /* (STAGE_BYTES) device */
    cudaEvent_t done[2];      /* chunk i's dequant finished: its buffers may be reused */
    int turn;
    size_t bytes_in;          /* bytes read from the model */
} uploader;
static void uploader_free(uploader *u);

typedef struct cuda_prof_mark { llmi_op_class cls; llmi_op_cost cost; } cuda_prof_mark;

typedef struct cuda_graph_slot {
    cudaGraphExec_t exec;     /* NULL until captured */
    bool seen;                /* ran eagerly once */
    bool failed;              /* capture failed: this bucket stays eager */
} cuda_graph_slot;

typedef struct cuda_impl {
    int device;
    int n_sms;
    cudaStream_t stream;
    llmi_cuda_gemm gemm;
    int max_tokens, max_seqs;
    int q_dim, kv_dim, qkv_dim;

    cuda_layer *layers;       /* (n_layers) host array of device pointers */
    void *tok_embd;           /* (n_vocab, dim) bf16 */
    void *lm_head;            /* (n_vocab, dim) bf16; == tok_embd when tied */
    float *out_norm;          /* (dim) */
    float *inv_freq;          /* (head_dim/2) */
    float *inv_freq_local;    /* (head_dim/2) the sliding layers' (config_layer_rope_local), or NULL
                                 without rope_theta_local */
    void *i4_scratch;         /* (i4_scratch_cap) bf16: an int4 weight dequantized for a prefill GEMM */
    size_t i4_scratch_elems;  /* the largest int4 linear uploaded (a stacked group whole) */
    size_t i4_scratch_cap;
    int i4_as_bf16;           /* int4 weights the W4A16 kernels cannot take, stored as bf16 */

    void *kv;                 /* (n_layers, 2, num_blocks, block_size, n_kv_heads, head_dim) kv dtype */
    size_t kv_bytes;

    float *x;                 /* (max_tokens, dim) residual stream */
    void *xn;                 /* (max_tokens, dim) bf16: normed input of the current sub-block */
    float *qkv;               /* (max_tokens, qkv_dim): q | k | v per token */
    void *att;                /* (max_tokens, q_dim) bf16: attention output */
    float *delta;             /* (max_tokens, dim) o_proj / down_proj output */
    float *gu;                /* (max_tokens, 2*ffn_dim): gate | up per token */
    void *act;                /* (max_tokens, ffn_dim) bf16: silu(gate) * up */
    void *lgn;                /* (LOGIT_CHUNK, dim) bf16: final-normed logit rows */
    int gu_width;             /* floats a token has in gu: 2*ffn_dim, or more where a tap's rows (dim,
                                 q_dim) are wider (a MoE's small experts) */

    /* mixture of experts (n_experts > 0; NULL otherwise), T = max_tokens, K = n_experts_used */
    float *moe_logits;        /* (T, n_experts) the router's logits */
    int32_t *moe_sel_d;       /* (T, K) each token's experts, ascending */
    float *moe_wt;            /* (T, K) their weights */
    int32_t *moe_sel_h;       /* (T, K) pinned: moe_sel_d on the host */
    int32_t *moe_idx_h;       /* (2, T*K) pinned: the token of each grouped row (expert by expert, tokens
                                 ascending) | the grouped row of each (token, j) */
    int32_t *moe_idx_d;       /* (2, T*K) device copy */
    int32_t *moe_start;       /* (n_experts + 1) host: expert e's grouped rows [start[e], start[e+1]) */
    void *moe_xg;             /* (T*K, dim) bf16: the normed rows of the grouped rows */
    float *moe_y;             /* (T*K, dim) each grouped row's expert output */
    float *logits;            /* (LOGIT_CHUNK, n_vocab) */
    float *attn_work;         /* (attn_work_floats) split-K partials */
    size_t attn_work_floats;

    int32_t *meta_h;          /* (meta_cap) pinned: the batch's index arrays, packed */
    int32_t *meta_d;          /* (meta_cap) device copy */
    size_t meta_cap;
    int32_t *plan_dec;        /* (max_tokens) host: decode-path token list */
    int32_t *plan_tiles;      /* (max_tokens, 2) host: prefill tiles */
    int32_t *seq_maxpos;      /* (max_seqs) host: check_batch scratch */

    /* device sampling: what crosses is pinned */
    llmi_cuda_sample_params *sp_h;   /* (max_tokens) pinned: each logit row's request */
    llmi_cuda_sample_params *sp_d;   /* (max_tokens) device */
    int32_t *tok_h, *tok_d;          /* (max_tokens) pinned / device: the tokens picked */
    int32_t *hist_h, *hist_d;        /* (hist_cap) pinned / device: the rows' penalty windows, packed */
    size_t hist_cap;
    float *lp_h;                     /* (lp_cap, n_vocab) pinned: raw logits of the rows that asked */
    int lp_cap;
    int32_t *lp_slot;                /* (max_tokens) host: each logit row's lp_h row, or -1 */

    float *tap_h;             /* (tap_cap) pinned: an activation handed to the tap */
    size_t tap_cap;

    size_t weight_bytes, act_bytes;
    uploader refresh_up;      /* forward_layers' staging for replaced layer parts, kept once made */
    bool refresh_up_ready;

    bool graphs_on;           /* decode graphs enabled (LLMI_CUDA_GRAPHS=0 turns them off) */
    llmi_i4_kernel i4_kernel; /* LLMI_I4_GEMV=auto|mma|chunk|warp: the int4 kernels allowed (llmi_i4g_dev.kernel) */
    int decode_tc;            /* LLMI_ATTN_DECODE=tc (default) | fp32: llmi_cuda_attn.decode_tc */
    int tiles_async;          /* LLMI_ATTN_TILES=async (default) | sync: llmi_cuda_attn.tiles_async */
    int i4_dequant_min_n;     /* int4 batches from this many tokens dequantize and GEMM (cuda_i4_choose) */
    int graph_max_bucket;     /* largest bucket: min(max_seqs, LOGIT_CHUNK, max_tokens) rounded down to 2^k */
    int graph_mbps;           /* block-table stride of graph batches, from the engine's context */
    cuda_graph_slot graphs[CUDA_GRAPH_BUCKETS];    /* bucket 2^k at [k] */
    size_t graph_region_off[CUDA_GRAPH_BUCKETS];   /* int32 offset of bucket k's region in gmeta */
    int32_t *gmeta_h;         /* (sum of regions) pinned */
    int32_t *gmeta_d;         /* (sum of regions) device */

    cudaEvent_t *events;      /* (prof_cap + 1) when profiling: op boundaries */
    cuda_prof_mark *marks;    /* (prof_cap) */
    int prof_cap, prof_n;
} cuda_impl;

#define WDT LLMI_BF16         /* weights and GEMM inputs: bf16 keeps fp32's range (fp16 models too) */
#define WDT_BYTES 2

static size_t cuda_kv_block_bytes(const llmi_backend *b) {
    return backend_kv_block_bytes(&b->model->cfg, b->opts.block_size, b->opts.kv_dtype);
}

static size_t cuda_kv_budget_bytes(const llmi_backend *b) {
    const cuda_impl *im = b->impl;
    size_t free_b = 0, total = 0;
    if (cudaSetDevice(im->device) != cudaSuccess || cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
    return cuda_kv_budget(total, free_b, b->opts.gpu_mem_util, im->kv_bytes);
}

static int cuda_kv_alloc(llmi_backend *b, int num_blocks, llmi_status *st) {
    cuda_impl *im = b->impl;
    if (num_blocks <= 0) return llmi_fail(st, LLMI_E_USAGE, "cuda backend: KV block count %d must be positive", num_blocks);
    size_t per = cuda_kv_block_bytes(b);
    if (per == 0 || (size_t)num_blocks > SIZE_MAX / per)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: KV cache of %d blocks overflows size_t", num_blocks);
    CU_CHECK(st, cudaSetDevice(im->device));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    /* captured graphs hold the old cache's addresses and block count */
    for (int k = 0; k < CUDA_GRAPH_BUCKETS; k++) {
        if (im->graphs[k].exec) CU_CHECK(st, cudaGraphExecDestroy(im->graphs[k].exec));
        im->graphs[k] = (cuda_graph_slot){0};
    }
    if (im->kv) CU_CHECK(st, cudaFree(im->kv));
    im->kv = NULL;
    im->kv_bytes = 0;
    b->num_blocks = 0;
    size_t bytes = per * (size_t)num_blocks;
    if (cudaMalloc(&im->kv, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        im->kv = NULL;
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: cannot allocate %.2f GiB of KV cache (%d blocks); %.2f GiB free",
                         bytes / 1073741824.0, num_blocks, free_b / 1073741824.0);
    }
    /* never-written slots are read only under a zero softmax weight; zero keeps them finite */
    CU_CHECK(st, cudaMemsetAsync(im->kv, 0, bytes, im->stream));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    im->kv_bytes = bytes;
    b->num_blocks = num_blocks;
    return 0;
}

/* Same layout as the CPU backend's cache: per layer a K then a V region of
 * (num_blocks, block_size, kvd), one block's part of either contiguous. */
static int cuda_kv_block_copy(llmi_backend *b, int block, void *host, bool to_host, llmi_status *st) {
    cuda_impl *im = b->impl;
    if (block < 0 || block >= b->num_blocks)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: KV block %d outside the cache of %d", block, b->num_blocks);
    const llmi_config *c = &b->model->cfg;
    size_t part = (size_t)b->opts.block_size * kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)c->n_kv_heads * c->head_dim);
    size_t region = part * (size_t)b->num_blocks;
    CU_CHECK(st, cudaSetDevice(im->device));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    char *h = host;
    for (int l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++, h += part) {
            char *dev = (char *)im->kv + ((size_t)l * 2 + kv) * region + (size_t)block * part;
            /* on our stream: a plain cudaMemcpy from pageable memory may return before its DMA
             * lands, unordered with the non-blocking stream the next forward reads the cache on */
            CU_CHECK(st, cudaMemcpyAsync(to_host ? (void *)h : (void *)dev, to_host ? (const void *)dev : (const void *)h,
                                         part, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, im->stream));
        }
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    return 0;
}
static int cuda_kv_read_block(llmi_backend *b, int block, void *dst, llmi_status *st) {
    return cuda_kv_block_copy(b, block, dst, true, st);
}
static int cuda_kv_write_block(llmi_backend *b, int block, const void *src, llmi_status *st) {
    return cuda_kv_block_copy(b, block, (void *)src, false, st);
}

static void cuda_memory(const llmi_backend *b, size_t *weights, size_t *kv, size_t *activations) {
    const cuda_impl *im = b->impl;
    if (weights) *weights = im->weight_bytes;
    if (kv) *kv = im->kv_bytes;
    if (activations) *activations = im->act_bytes;
}

static void dfree(void *p) {
    if (p) cudaFree(p);
}
static void hfree(void *p) {
    if (p) cudaFreeHost(p);
}

static void linear_free(cuda_linear *w) {
    dfree(w->dense);
    dfree((void *)w->q4.q); dfree((void *)w->q4.scales); dfree((void *)w->q4.zeros); dfree((void *)w->q4.g_idx);
}

/* Frees part p of L (its buffers NULL after; the byte counts are the caller's). */
static void layer_part_free(cuda_layer *L, cuda_layer_part p) {
    switch (p) {
    case LP_NORMS:
        dfree(L->attn_norm), dfree(L->ffn_norm), dfree(L->q_norm), dfree(L->k_norm);
        dfree(L->post_attn_norm), dfree(L->post_ffn_norm), dfree(L->control);
        L->attn_norm = L->ffn_norm = L->q_norm = L->k_norm = L->post_attn_norm = L->post_ffn_norm = L->control = NULL;
        break;
    case LP_QKV:
        for (int i = 0; i < 3; i++) linear_free(&L->qkv[i]);
        memset(L->qkv, 0, sizeof L->qkv);
        L->n_qkv = 0;
        dfree(L->b_qkv);
        L->b_qkv = NULL;
        break;
    case LP_O:
        linear_free(&L->wo);
        memset(&L->wo, 0, sizeof L->wo);
        dfree(L->b_o);
        L->b_o = NULL;
        break;
    case LP_GU:
        for (int i = 0; i < 2; i++) linear_free(&L->gu[i]);
        memset(L->gu, 0, sizeof L->gu);
        L->n_gu = 0;
        break;
    case LP_DOWN:
        linear_free(&L->down);
        memset(&L->down, 0, sizeof L->down);
        break;
    case LP_ROUTER:
        linear_free(&L->router);
        memset(&L->router, 0, sizeof L->router);
        break;
    case LP_COUNT:
        break;
    }
}

static void layer_free(cuda_layer *L) {
    for (int p = 0; p < LP_COUNT; p++) layer_part_free(L, (cuda_layer_part)p);
    memset(L, 0, sizeof *L);
}

static void cuda_destroy(llmi_backend *b) {
    if (!b) return;
    cuda_impl *im = b->impl;
    if (im) {
        cudaSetDevice(im->device);
        if (im->stream) cudaStreamSynchronize(im->stream);
        if (im->layers) {
            for (int l = 0; l < b->model->cfg.n_layers; l++) layer_free(&im->layers[l]);
            free(im->layers);
        }
        if (im->lm_head != im->tok_embd) dfree(im->lm_head);
        if (im->refresh_up_ready) uploader_free(&im->refresh_up);
        dfree(im->tok_embd); dfree(im->out_norm); dfree(im->inv_freq); dfree(im->inv_freq_local); dfree(im->kv);
        dfree(im->i4_scratch);
        dfree(im->x); dfree(im->xn); dfree(im->qkv); dfree(im->att); dfree(im->delta); dfree(im->gu);
        dfree(im->act); dfree(im->lgn); dfree(im->logits); dfree(im->attn_work); dfree(im->meta_d);
        dfree(im->moe_logits); dfree(im->moe_sel_d); dfree(im->moe_wt); dfree(im->moe_idx_d); dfree(im->moe_xg);
        dfree(im->moe_y); hfree(im->moe_sel_h); hfree(im->moe_idx_h); free(im->moe_start);
        hfree(im->meta_h);
        free(im->plan_dec); free(im->plan_tiles); free(im->seq_maxpos); free(im->lp_slot);
        hfree(im->sp_h); dfree(im->sp_d); hfree(im->tok_h); dfree(im->tok_d); hfree(im->hist_h); dfree(im->hist_d);
        hfree(im->lp_h);
        hfree(im->tap_h);
        if (im->events) {
            for (int i = 0; i <= im->prof_cap; i++) cudaEventDestroy(im->events[i]);
            free(im->events);
        }
        free(im->marks);
        for (int k = 0; k < CUDA_GRAPH_BUCKETS; k++)
            if (im->graphs[k].exec) cudaGraphExecDestroy(im->graphs[k].exec);
        hfree(im->gmeta_h);
        dfree(im->gmeta_d);
        llmi_cuda_gemm_free(&im->gemm);
        if (im->stream) cudaStreamDestroy(im->stream);
        free(im);
    }
    free(b);
}

/* ---- model checks and weight upload ---- */

static int check_model(const llmi_model *m, llmi_status *st) {
    if (backend_check_model(m, "cuda", st)) return st->code;
    const llmi_config *c = &m->cfg;
    if (c->n_experts > LLMI_MOE_MAX_EXPERTS)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: %d experts are more than the %d the routing kernel takes",
                         c->n_experts, LLMI_MOE_MAX_EXPERTS);
    if (c->head_dim > 256 || c->head_dim % 2)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: head_dim %d must be even and at most 256", c->head_dim);
    if (c->dim > LLMI_NORM_MAX_DIM)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: hidden size %d is more than the %d the norm kernel takes",
                         c->dim, LLMI_NORM_MAX_DIM);
    if (c->n_heads / c->n_kv_heads > 64)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: %d query heads per KV head is more than the 64 supported",
                         c->n_heads / c->n_kv_heads);
    if (c->act != LLMI_ACT_SILU && c->act != LLMI_ACT_GELU_TANH)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: MLP activation %d is neither SwiGLU nor GeGLU",
                         (int)c->act);
    if (c->sliding_window < 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: sliding window %d is negative", c->sliding_window);
    return 0;
}

/* A GGUF Q4_0 weight is an int4 grid as it stands: groups of 32 columns, an fp16 scale d
 * each and w = d (q - 8), so it is an I4G weight with every zero 8, exactly, and the W4A16
 * kernels serve it packed (~0.59 bytes a weight where the bf16 copy took 2). */
static bool q4_0_servable(const llmi_tensor *t) {
    return t->dtype == LLMI_Q4_0 && t->layout == LLMI_LAYOUT_ROWS && t->cols % 32 == 0;
}

/* An int4 weight the W4A16 kernels can serve (else it is converted to bf16): GPTQ/AWQ's as it
 * is, GGUF Q4_0 through q4_0_as_i4g. */
static bool i4_servable(const llmi_tensor *t) {
    return (t->dtype == LLMI_I4G && t->cols % 8 == 0 && t->group_size > 0 && t->group_size % 8 == 0) ||
           q4_0_servable(t);
}

/* *out (an owned LLMI_I4G tensor, core/int4.h's packing) <- t (q4_0_servable): the grid of
 * its blocks.  A Q4_0 block holds column j (< 16) in the low nibble of byte j and column
 * j + 16 in its high one. */
static int q4_0_as_i4g(const llmi_tensor *t, llmi_tensor *out, llmi_status *st) {
    const int rows = (int)t->rows, cols = (int)t->cols;
    int gs;   /* 32: a block's columns */
    int64_t n_groups;
    const int32_t *g_idx;
    cuda_i4_grid(t, &gs, &n_groups, &g_idx);
    quant_grid g;
    if (quant_grid_alloc(&g, rows, cols, gs, g_idx != NULL, st)) return st->code;
    memset(g.zeros, 8, (size_t)g.n_groups * (size_t)rows);
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < g.n_groups; b++) {
            const uint8_t *blk = (const uint8_t *)t->data + (size_t)r * t->row_bytes + (size_t)b * 18;
            memcpy(&g.scales[(size_t)b * rows + r], blk, 2);
            uint8_t *q = g.q + (size_t)r * cols + (size_t)b * gs;
            for (int j = 0; j < 16; j++) {
                q[j] = blk[2 + j] & 15;
                q[j + 16] = blk[2 + j] >> 4;
            }
        }
    int rc = quant_tensor_from_grid(&g, out, st);
    quant_grid_free(&g);
    return rc;
}

/* Linears of one fused group (q/k/v, gate/up) stay int4 only if all of them can. */
static bool group_int4(const llmi_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        if (!i4_servable(ts[i])) return false;
    return true;
}

/* An int4 group whose parts share width, groups and g_idx is stacked into one packed
 * weight (rows one after another), so that a step runs one W4A16 launch for q/k/v and one
 * for gate/up: fewer launches, and grids wide enough to fill the GPU where a 1024-row k/v
 * projection alone does not. */
static bool group_i4_stackable(const llmi_tensor *const *ts, int n) {
    int gs0, gs;
    int64_t ng0, ng;
    const int32_t *gi0, *gi;
    cuda_i4_grid(ts[0], &gs0, &ng0, &gi0);
    for (int i = 1; i < n; i++) {
        cuda_i4_grid(ts[i], &gs, &ng, &gi);
        if (ts[i]->cols != ts[0]->cols || gs != gs0 || ng != ng0 || !gi != !gi0 ||
            (gi && memcmp(gi, gi0, (size_t)ts[0]->cols * 4) != 0))
            return false;
    }
    return true;
}

static int uploader_init(uploader *u, llmi_status *st) {
    memset(u, 0, sizeof *u);
    for (int i = 0; i < 2; i++) {
        CU_CHECK(st, cudaMallocHost(&u->host[i], STAGE_BYTES));
        CU_CHECK(st, cudaMalloc(&u->dev[i], STAGE_BYTES));
        CU_CHECK(st, cudaEventCreateWithFlags(&u->done[i], cudaEventDisableTiming));
    }
    return 0;
}

static void uploader_free(uploader *u) {
    for (int i = 0; i < 2; i++) {
        if (u->done[i]) {
            cudaEventSynchronize(u->done[i]);
            cudaEventDestroy(u->done[i]);
        }
        hfree(u->host[i]);
        dfree(u->dev[i]);
    }
}

static int dalloc(cuda_impl *im, void **p, size_t bytes, size_t *counter, llmi_status *st) {
    *p = NULL;
    if (bytes == 0) return 0;
    if (cudaMalloc(p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: cannot allocate %.1f MiB on GPU %d (%.2f GiB free)",
                         bytes / 1048576.0, im->device, free_b / 1073741824.0);
    }
    if (counter) *counter += bytes;
    return 0;
}

static int check_i4g(const llmi_tensor *t, llmi_status *st) {
    if (!t->qscales || !t->qzeros || t->group_size <= 0 || t->n_groups <= 0 || t->cols % 2 ||
        (int64_t)t->n_groups * t->group_size < t->cols)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: an int4 (I4G) weight lacks consistent scales/zeros/groups");
    return 0;
}

/* Copies n int4 weights of one width (n > 1: group_i4_stackable) to the device as one,
 * their rows one after another: (*w) then serves them.  Nibbles and g_idx go as they are;
 * scales and zeros (n_groups, rows) are interleaved on the host, each group's row of all
 * the parts together. */
static int upload_i4g_parts(cuda_impl *im, const llmi_tensor *const *ts, int n, llmi_i4g_dev *w, size_t *counter,
                            llmi_status *st) {
    const llmi_tensor *t = ts[0];
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        if (check_i4g(ts[i], st)) return st->code;
        rows += ts[i]->rows;
    }
    if (rows > INT32_MAX)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: an int4 group of %lld rows is too tall", (long long)rows);
    size_t qb = (size_t)rows * (size_t)t->cols / 2, gb = (size_t)t->n_groups * (size_t)rows;
    void *q = NULL, *sc = NULL, *z = NULL, *gi = NULL;
    *w = (llmi_i4g_dev){.rows = (int)rows, .cols = (int)t->cols, .group_size = t->group_size, .kernel = im->i4_kernel};
    if (dalloc(im, &q, qb, counter, st)) return st->code;
    w->q = q;
    if (dalloc(im, &sc, gb * 2, counter, st)) return st->code;
    w->scales = sc;
    if (dalloc(im, &z, gb, counter, st)) return st->code;
    w->zeros = z;
    if (t->g_idx) {
        if (dalloc(im, &gi, (size_t)t->cols * 4, counter, st)) return st->code;
        w->g_idx = gi;
    }
    /* from pageable memory: each call returns once its source is staged */
    size_t q_off = 0;
    for (int i = 0; i < n; i++) {
        size_t part = (size_t)ts[i]->rows * (size_t)t->cols / 2;
        CU_CHECK(st, cudaMemcpyAsync((char *)q + q_off, ts[i]->data, part, cudaMemcpyHostToDevice, im->stream));
        q_off += part;
    }
    /* (one part: the same bytes as its own arrays; a few percent of its nibbles' size) */
    uint16_t *hs = malloc(gb * 2);   /* (n_groups, rows) */
    uint8_t *hz = malloc(gb);
    if (!hs || !hz) {
        free(hs), free(hz);
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    }
    for (int64_t g = 0; g < t->n_groups; g++) {
        size_t at = (size_t)g * (size_t)rows;
        for (int i = 0; i < n; i++) {
            size_t r = (size_t)ts[i]->rows, from = (size_t)g * r;
            memcpy(hs + at, ts[i]->qscales + from, r * 2);
            memcpy(hz + at, ts[i]->qzeros + from, r);
            at += r;
        }
    }
    cudaError_t e = cudaMemcpyAsync(sc, hs, gb * 2, cudaMemcpyHostToDevice, im->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(z, hz, gb, cudaMemcpyHostToDevice, im->stream);
    free(hs), free(hz);
    CU_CHECK(st, e);
    if (gi) CU_CHECK(st, cudaMemcpyAsync(gi, t->g_idx, (size_t)t->cols * 4, cudaMemcpyHostToDevice, im->stream));
    return 0;
}

/* dst (t->rows, t->cols) bf16 <- t: whole-row chunks through the stages and the dequant
 * kernel; an int4 tensor (an embedding, or a linear the W4A16 kernels cannot take) through
 * int4_gemm.cu's dequant. */
static int upload_dense(cuda_impl *im, uploader *u, const llmi_tensor *t, void *dst, llmi_status *st) {
    if (t->dtype == LLMI_I4G) {
        llmi_i4g_dev w = {0};   /* freed below even when upload_i4g_parts fails before filling it */
        int rc = upload_i4g_parts(im, &t, 1, &w, NULL, st);
        cudaError_t e = rc ? cudaSuccess : llmi_cuda_int4_dequant(&w, dst, WDT, im->stream);
        if (!rc && e == cudaSuccess) e = cudaStreamSynchronize(im->stream);   /* before the parts are freed */
        if (!rc && e != cudaSuccess)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: dequantizing an int4 weight (%lldx%lld): %s",
                           (long long)t->rows, (long long)t->cols, cudaGetErrorString(e));
        dfree((void *)w.q); dfree((void *)w.scales); dfree((void *)w.zeros); dfree((void *)w.g_idx);
        u->bytes_in += cuda_weight_bytes(t, true);
        return rc;
    }
    size_t rb = t->row_bytes, out_rb = (size_t)t->cols * WDT_BYTES;
    if (rb > STAGE_BYTES)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: a weight row of %zu bytes exceeds the %zu-byte staging buffer",
                         rb, (size_t)STAGE_BYTES);
    int64_t rows_per = (int64_t)(STAGE_BYTES / rb);
    for (int64_t r0 = 0; r0 < t->rows; r0 += rows_per) {
        int64_t nr = t->rows - r0 < rows_per ? t->rows - r0 : rows_per;
        int i = u->turn;
        u->turn ^= 1;
        CU_CHECK(st, cudaEventSynchronize(u->done[i]));
        memcpy(u->host[i], (const char *)t->data + (size_t)r0 * rb, (size_t)nr * rb);
        CU_CHECK(st, cudaMemcpyAsync(u->dev[i], u->host[i], (size_t)nr * rb, cudaMemcpyHostToDevice, im->stream));
        CU_CHECK(st, llmi_cuda_dequant(u->dev[i], t->dtype, nr * t->cols, (char *)dst + (size_t)r0 * out_rb, WDT,
                                       im->stream));
        CU_CHECK(st, cudaEventRecord(u->done[i], im->stream));
        u->bytes_in += (size_t)nr * rb;
    }
    return 0;
}

/* n weights of one width stacked into one dense bf16 matrix, *out, their rows one after
 * another. */
static int upload_stacked_bf16(cuda_impl *im, uploader *u, const llmi_tensor *const *ts, int n, cuda_linear *out,
                               llmi_status *st) {
    int64_t rows = 0;
    for (int i = 0; i < n; i++) rows += ts[i]->rows;
    out->rows = rows;
    out->cols = ts[0]->cols;
    out->bytes = (size_t)rows * (size_t)ts[0]->cols * WDT_BYTES;
    if (dalloc(im, &out->dense, out->bytes, &im->weight_bytes, st)) return st->code;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (upload_dense(im, u, ts[i], (char *)out->dense + off, st)) return st->code;
        off += (size_t)ts[i]->rows * (size_t)ts[i]->cols * WDT_BYTES;
    }
    return 0;
}

/* Rows [r0, r0 + rows) of t as a tensor of their own (the data stays t's). */
static llmi_tensor row_view(const llmi_tensor *t, int64_t r0, int64_t rows) {
    llmi_tensor v = *t;
    v.owned = NULL;
    v.rows = rows;
    v.data = (const char *)t->data + (size_t)r0 * t->row_bytes;
    return v;
}

/* A MoE layer's stacked gate and up (n_experts * ffn_dim, dim) each into one bf16 matrix
 * with each expert's gate rows and up rows side by side (cuda_layer.gu), so that an
 * expert's gate|up is one GEMM as a dense layer's is.  Whatever their dtype, experts are
 * stored as bf16 (the W4A16 kernels do not serve them). */
static int upload_experts_gu(cuda_impl *im, uploader *u, const llmi_config *c, const llmi_layer *L, cuda_linear *out,
                             llmi_status *st) {
    const int E = c->n_experts;
    llmi_tensor *views = malloc((size_t)2 * E * sizeof *views);
    const llmi_tensor **ts = malloc((size_t)2 * E * sizeof *ts);
    int rc = 0;
    if (!views || !ts) rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    for (int e = 0; !rc && e < E; e++) {
        views[2 * e] = row_view(&L->w_gate, (int64_t)e * c->ffn_dim, c->ffn_dim);
        views[2 * e + 1] = row_view(&L->w_up, (int64_t)e * c->ffn_dim, c->ffn_dim);
        ts[2 * e] = &views[2 * e];
        ts[2 * e + 1] = &views[2 * e + 1];
    }
    if (!rc) rc = upload_stacked_bf16(im, u, ts, 2 * E, out, st);
    /* the copies from pageable memory return once their source is staged; the views are
     * only pointers into the model */
    free(views);
    free(ts);
    return rc;
}

/* A group of linears (q/k/v or gate/up, n of them, or one alone): int4 kept packed (all
 * stacked into out[0], or each on its own where group_i4_stackable says no), or all of them
 * stacked into one dense bf16 matrix in out[0]. */
static int upload_linears(cuda_impl *im, uploader *u, const llmi_tensor *const *ts, int n, cuda_linear *out,
                          int *n_out, llmi_status *st) {
    if (group_int4(ts, n)) {
        /* GGUF Q4_0 parts as I4G copies on the host first (freed once uploaded: each copy
         * from pageable memory returns once its source is staged) */
        llmi_tensor conv[3] = {{0}};
        const llmi_tensor *src[3];
        int rc = 0;
        for (int i = 0; i < n && !rc; i++) {
            src[i] = ts[i];
            if (ts[i]->dtype == LLMI_Q4_0 && !(rc = q4_0_as_i4g(ts[i], &conv[i], st))) src[i] = &conv[i];
        }
        /* stacked into out[0] where the parts allow it, else each kept on its own */
        const int parts = group_i4_stackable(ts, n) ? n : 1;   /* (as weights_needed decided) */
        *n_out = n / parts;
        for (int i = 0; i < *n_out && !rc; i++) {
            size_t before = im->weight_bytes;
            if ((rc = upload_i4g_parts(im, src + i * parts, parts, &out[i].q4, &im->weight_bytes, st))) break;
            out[i].rows = out[i].q4.rows;
            out[i].cols = out[i].q4.cols;
            out[i].bytes = im->weight_bytes - before;
            u->bytes_in += out[i].bytes;
            size_t elems = (size_t)out[i].rows * (size_t)out[i].cols;
            if (elems > im->i4_scratch_elems) im->i4_scratch_elems = elems;
        }
        for (int i = 0; i < n; i++) free(conv[i].owned);
        return rc;
    }
    for (int i = 0; i < n; i++) im->i4_as_bf16 += ts[i]->dtype == LLMI_I4G;
    *n_out = 1;
    return upload_stacked_bf16(im, u, ts, n, &out[0], st);
}

static int upload_floats(cuda_impl *im, float **dst, const float *src, size_t n, llmi_status *st) {
    if (dalloc(im, (void **)dst, n * sizeof(float), &im->weight_bytes, st)) return st->code;
    /* async on our stream (a plain cudaMemcpy from pageable memory may still be in DMA when
     * it returns, unordered with our non-blocking stream); the source is staged on return */
    CU_CHECK(st, cudaMemcpyAsync(*dst, src, n * sizeof(float), cudaMemcpyHostToDevice, im->stream));
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Device bytes of the weights as load_weights will store them, and the largest int4
 * linear, a stacked group counted whole (its dequant scratch for prefill GEMMs).  A MoE
 * layer's experts and router are bf16 whatever their dtype. */
static size_t weights_needed(const llmi_model *m, bool tied, size_t *i4_max_elems) {
    const llmi_config *c = &m->cfg;
    const bool moe = c->n_experts > 0;
    size_t dim = (size_t)c->dim, total = 0;
    *i4_max_elems = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        const llmi_tensor *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
        const llmi_tensor *wo[1] = {&L->wo}, *dn[1] = {&L->w_down};
        const llmi_tensor *const *groups[4] = {qkv, gu, wo, dn};
        const int sizes[4] = {3, 2, 1, 1};
        for (int g = 0; g < 4; g++) {
            const bool experts = moe && (g == 1 || g == 3);   /* gate/up, down */
            bool i4 = !experts && group_int4(groups[g], sizes[g]), stacked = i4 && group_i4_stackable(groups[g], sizes[g]);
            size_t elems = 0;   /* of the largest int4 linear as upload_linears stores it */
            for (int i = 0; i < sizes[g]; i++) {
                total += cuda_weight_bytes(groups[g][i], i4);
                size_t part = (size_t)groups[g][i]->rows * (size_t)groups[g][i]->cols;
                elems = stacked ? elems + part : part > elems ? part : elems;
            }
            if (i4 && elems > *i4_max_elems) *i4_max_elems = elems;
        }
        if (moe) total += cuda_weight_bytes(&L->w_router, false);
        total += 2 * dim * 4 + (c->qkv_bias ? ((size_t)c->n_heads + 2 * (size_t)c->n_kv_heads) * c->head_dim * 4 : 0) +
                 (L->q_norm ? (size_t)c->head_dim * 4 : 0) + (L->k_norm ? (size_t)c->head_dim * 4 : 0) +
                 (L->post_attn_norm ? dim * 4 : 0) + (L->post_ffn_norm ? dim * 4 : 0) + (L->control ? dim * 4 : 0);
    }
    size_t embd = (size_t)c->n_vocab * dim * WDT_BYTES;
    return total + embd * (tied ? 1 : 2) + dim * 4 + (size_t)c->head_dim * 2 * (c->rope_theta_local > 0 ? 2 : 1);
}

/* Floats a token has in the gate|up buffer: 2*ffn_dim, or the widest tap (dim, q_dim) that
 * converts through it when that is more (a MoE's experts may be narrower than the model). */
static int gu_width(const llmi_config *c) {
    int w = 2 * c->ffn_dim, qd = c->n_heads * c->head_dim;
    if (c->dim > w) w = c->dim;
    return qd > w ? qd : w;
}

/* Device bytes of a MoE's routing buffers for T tokens (0 for a dense model): logits,
 * choices and weights, the grouped index arrays, the gathered rows and their outputs. */
static size_t moe_workspace(const llmi_config *c, size_t T) {
    if (c->n_experts <= 0) return 0;
    size_t tk = T * (size_t)c->n_experts_used, dim = (size_t)c->dim;
    return T * (size_t)c->n_experts * 4 + tk * 4 * 2 + tk * 4 * 2 + tk * dim * WDT_BYTES + tk * dim * 4;
}

static size_t workspace_needed(const llmi_config *c, size_t T, size_t attn_floats, size_t i4_elems) {
    size_t e = WDT_BYTES, dim = (size_t)c->dim, qd = (size_t)c->n_heads * c->head_dim;
    size_t qkv = qd + 2 * (size_t)c->n_kv_heads * c->head_dim, ffn = (size_t)c->ffn_dim;
    size_t L = LOGIT_CHUNK < T ? LOGIT_CHUNK : T;
    return T * dim * 4 + T * dim * e + T * qkv * 4 + T * qd * e + T * dim * 4 + T * (size_t)gu_width(c) * 4 +
           T * ffn * e + L * dim * e + L * (size_t)c->n_vocab * 4 + attn_floats * 4 + GEMM_WORKSPACE +
           2 * STAGE_BYTES + i4_elems * e + T * (sizeof(llmi_cuda_sample_params) + 4) + moe_workspace(c, T);
}

static cuda_layer_src layer_src(const llmi_layer *L) {
    cuda_layer_src s;
    memset(&s, 0, sizeof s);
    const llmi_tensor *ts[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->w_router};
    for (int i = 0; i < 8; i++) {
        s.w[i] = ts[i]->data;
        s.dt[i] = ts[i]->dtype;
    }
    const float *f[11] = {L->attn_norm, L->ffn_norm, L->q_norm, L->k_norm, L->post_attn_norm, L->post_ffn_norm,
                          L->control, L->bq, L->bk, L->bv, L->bo};
    memcpy(s.f, f, sizeof f);
    return s;
}

/* The linears (first index, count in layer_src's w) and floats (f) of each part. */
static const struct { int w0, nw, f0, nf; } layer_part_src[LP_COUNT] = {
    [LP_NORMS] = {0, 0, 0, 7}, [LP_QKV] = {0, 3, 7, 3}, [LP_O] = {3, 1, 10, 1}, [LP_GU] = {4, 2, 0, 0},
    [LP_DOWN] = {6, 1, 0, 0}, [LP_ROUTER] = {7, 1, 0, 0}};

static bool layer_part_same(const cuda_layer_src *a, const cuda_layer_src *b, cuda_layer_part p) {
    const int w0 = layer_part_src[p].w0, f0 = layer_part_src[p].f0;
    for (int i = w0; i < w0 + layer_part_src[p].nw; i++)
        if (a->w[i] != b->w[i] || a->dt[i] != b->dt[i]) return false;
    for (int i = f0; i < f0 + layer_part_src[p].nf; i++)
        if (a->f[i] != b->f[i]) return false;
    return true;
}

/* Part p of layer L into D (where that part is empty). */
static int upload_layer_part(cuda_impl *im, uploader *u, const llmi_config *c, const llmi_layer *L, cuda_layer *D,
                             cuda_layer_part p, llmi_status *st) {
    const size_t dim = (size_t)c->dim, qd = (size_t)im->q_dim, kvd = (size_t)im->kv_dim, before = im->weight_bytes;
    const llmi_tensor *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w_gate, &L->w_up};
    const llmi_tensor *wo[1] = {&L->wo}, *dn[1] = {&L->w_down}, *rt[1] = {&L->w_router};
    const bool moe = c->n_experts > 0;
    int one = 0, rc = 0;
    switch (p) {
    case LP_NORMS:
        rc = upload_floats(im, &D->attn_norm, L->attn_norm, dim, st);
        if (!rc) rc = upload_floats(im, &D->ffn_norm, L->ffn_norm, dim, st);
        if (!rc && L->q_norm) rc = upload_floats(im, &D->q_norm, L->q_norm, (size_t)c->head_dim, st);
        if (!rc && L->k_norm) rc = upload_floats(im, &D->k_norm, L->k_norm, (size_t)c->head_dim, st);
        if (!rc && L->post_attn_norm) rc = upload_floats(im, &D->post_attn_norm, L->post_attn_norm, dim, st);
        if (!rc && L->post_ffn_norm) rc = upload_floats(im, &D->post_ffn_norm, L->post_ffn_norm, dim, st);
        if (!rc && L->control) rc = upload_floats(im, &D->control, L->control, dim, st);
        break;
    case LP_QKV:
        rc = upload_linears(im, u, qkv, 3, D->qkv, &D->n_qkv, st);
        if (!rc && (L->bq || L->bk || L->bv)) {
            /* a missing part of the bias is zero */
            float *hb = calloc((size_t)im->qkv_dim, sizeof(float));
            if (!hb) return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
            if (L->bq) memcpy(hb, L->bq, qd * sizeof(float));
            if (L->bk) memcpy(hb + qd, L->bk, kvd * sizeof(float));
            if (L->bv) memcpy(hb + qd + kvd, L->bv, kvd * sizeof(float));
            rc = upload_floats(im, &D->b_qkv, hb, (size_t)im->qkv_dim, st);
            /* the copy above returns once hb is staged */
            free(hb);
        }
        break;
    case LP_O:
        if (L->bo) rc = upload_floats(im, &D->b_o, L->bo, dim, st);
        if (!rc) rc = upload_linears(im, u, wo, 1, &D->wo, &one, st);
        break;
    case LP_GU:
        if (!moe) rc = upload_linears(im, u, gu, 2, D->gu, &D->n_gu, st);
        else if (!(rc = upload_experts_gu(im, u, c, L, &D->gu[0], st))) D->n_gu = 1;
        break;
    case LP_DOWN:
        rc = moe ? upload_stacked_bf16(im, u, dn, 1, &D->down, st) : upload_linears(im, u, dn, 1, &D->down, &one, st);
        break;
    case LP_ROUTER:
        if (moe) rc = upload_stacked_bf16(im, u, rt, 1, &D->router, st);
        break;
    case LP_COUNT: break;
    }
    D->part_bytes[p] = im->weight_bytes - before;
    return rc;
}

/* Layer L into D (empty): norms, biases and the four groups of linears. */
static int upload_layer(cuda_impl *im, uploader *u, const llmi_config *c, const llmi_layer *L, cuda_layer *D,
                        llmi_status *st) {
    int rc = 0;
    for (int p = 0; p < LP_COUNT && !rc; p++) rc = upload_layer_part(im, u, c, L, D, (cuda_layer_part)p, st);
    if (!rc) D->src = layer_src(L);
    return rc;
}

static int load_weights(llmi_backend *b, cuda_impl *im, llmi_status *st) {
    const llmi_model *m = b->model;
    const llmi_config *c = &m->cfg;
    size_t dim = (size_t)c->dim;
    uploader u;
    int rc = uploader_init(&u, st);
    double t0 = now_s();
    bool tied = m->lm_head.data == m->tok_embd.data && m->lm_head.dtype == m->tok_embd.dtype;
    size_t embd_bytes = (size_t)c->n_vocab * dim * WDT_BYTES;
    if (!rc) rc = dalloc(im, &im->tok_embd, embd_bytes, &im->weight_bytes, st);
    if (!rc) rc = upload_dense(im, &u, &m->tok_embd, im->tok_embd, st);
    if (!rc && tied) im->lm_head = im->tok_embd;
    if (!rc && !tied) rc = dalloc(im, &im->lm_head, embd_bytes, &im->weight_bytes, st);
    if (!rc && !tied) rc = upload_dense(im, &u, &m->lm_head, im->lm_head, st);
    if (!rc) rc = upload_floats(im, &im->out_norm, m->out_norm, dim, st);
    if (!rc && !(im->layers = calloc((size_t)c->n_layers, sizeof *im->layers)))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    for (int l = 0; !rc && l < c->n_layers; l++) rc = upload_layer(im, &u, c, &m->layers[l], &im->layers[l], st);
    if (!rc && cudaStreamSynchronize(im->stream) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: weight upload failed: %s", cudaGetErrorString(cudaGetLastError()));
    double dt = now_s() - t0;
    if (!rc && im->i4_as_bf16)
        fprintf(stderr, "cuda: %d int4 weights stored as bf16 (the W4A16 kernels need widths and group sizes that are "
                "multiples of 8, for a whole q/k/v or gate/up group)\n", im->i4_as_bf16);
    if (!rc)
        fprintf(stderr, "cuda: loaded %.2f GB of weights (%.2f GB on GPU: bf16%s) in %.2f s, %.2f GB/s\n",
                u.bytes_in / 1e9, im->weight_bytes / 1e9, im->i4_scratch_elems ? ", int4 linears kept packed" : "",
                dt, dt > 0 ? u.bytes_in / 1e9 / dt : 0.0);
    uploader_free(&u);
    return rc;
}

static int alloc_workspaces(cuda_impl *im, const llmi_config *c, llmi_status *st) {
    size_t T = (size_t)im->max_tokens, e = WDT_BYTES, dim = (size_t)c->dim, ffn = (size_t)c->ffn_dim;
    size_t L = LOGIT_CHUNK < T ? LOGIT_CHUNK : T;
    size_t *a = &im->act_bytes;
    if (dalloc(im, (void **)&im->x, T * dim * 4, a, st) || dalloc(im, &im->xn, T * dim * e, a, st) ||
        dalloc(im, (void **)&im->qkv, T * (size_t)im->qkv_dim * 4, a, st) ||
        dalloc(im, &im->att, T * (size_t)im->q_dim * e, a, st) || dalloc(im, (void **)&im->delta, T * dim * 4, a, st) ||
        dalloc(im, (void **)&im->gu, T * (size_t)gu_width(c) * 4, a, st) || dalloc(im, &im->act, T * ffn * e, a, st) ||
        dalloc(im, &im->lgn, L * dim * e, a, st) || dalloc(im, (void **)&im->logits, L * (size_t)c->n_vocab * 4, a, st) ||
        dalloc(im, (void **)&im->attn_work, im->attn_work_floats * 4, a, st) ||
        dalloc(im, &im->i4_scratch, im->i4_scratch_elems * e, a, st) ||
        dalloc(im, (void **)&im->sp_d, T * sizeof(llmi_cuda_sample_params), a, st) ||
        dalloc(im, (void **)&im->tok_d, T * sizeof(int32_t), a, st))
        return st->code;
    im->i4_scratch_cap = im->i4_scratch_elems;
    im->gu_width = gu_width(c);
    im->act_bytes += GEMM_WORKSPACE;
    if (c->n_experts > 0) {
        const size_t E = (size_t)c->n_experts, tk = T * (size_t)c->n_experts_used;
        if (dalloc(im, (void **)&im->moe_logits, T * E * 4, a, st) || dalloc(im, (void **)&im->moe_sel_d, tk * 4, a, st) ||
            dalloc(im, (void **)&im->moe_wt, tk * 4, a, st) || dalloc(im, (void **)&im->moe_idx_d, 2 * tk * 4, a, st) ||
            dalloc(im, &im->moe_xg, tk * dim * e, a, st) || dalloc(im, (void **)&im->moe_y, tk * dim * 4, a, st))
            return st->code;
        CU_CHECK(st, cudaMallocHost((void **)&im->moe_sel_h, tk * sizeof(int32_t)));
        CU_CHECK(st, cudaMallocHost((void **)&im->moe_idx_h, 2 * tk * sizeof(int32_t)));
        if (!(im->moe_start = malloc((E + 1) * sizeof(int32_t))))
            return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    }
    CU_CHECK(st, cudaMallocHost((void **)&im->sp_h, T * sizeof(llmi_cuda_sample_params)));
    CU_CHECK(st, cudaMallocHost((void **)&im->tok_h, T * sizeof(int32_t)));
    im->plan_dec = malloc(T * sizeof(int32_t));
    im->plan_tiles = malloc(2 * T * sizeof(int32_t));
    im->seq_maxpos = malloc((size_t)im->max_seqs * sizeof(int32_t));
    im->lp_slot = malloc(T * sizeof(int32_t));
    if (!im->plan_dec || !im->plan_tiles || !im->seq_maxpos || !im->lp_slot)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    /* the RoPE tables: the model's, and the sliding layers' own where they have one (Gemma 3) */
    const size_t half = (size_t)c->head_dim / 2;
    float *h = malloc(2 * half * sizeof(float));
    if (!h) return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    backend_rope_inv_freq(c, h);
    const bool local = c->rope_theta_local > 0;
    if (local) backend_rope_inv_freq_local(c, h + half);
    int rc = dalloc(im, (void **)&im->inv_freq, half * 4, a, st);
    if (!rc && local) rc = dalloc(im, (void **)&im->inv_freq_local, half * 4, a, st);
    if (!rc && (cudaMemcpyAsync(im->inv_freq, h, half * 4, cudaMemcpyHostToDevice, im->stream) != cudaSuccess ||
                (local && cudaMemcpyAsync(im->inv_freq_local, h + half, half * 4, cudaMemcpyHostToDevice, im->stream) !=
                              cudaSuccess)))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: uploading RoPE frequencies: %s", cudaGetErrorString(cudaGetLastError()));
    /* pageable sources: each copy returns once h is staged */
    free(h);
    return rc;
}

/* Layout of bucket B's region (int32 offsets from its start): tok | pos | slot (written
 * every step) | seq | lr | dec (0..B-1, written once) | block tables (B, gmbps). */
static size_t graph_region_ints(int B, int gmbps) { return (size_t)B * (6 + (size_t)gmbps); }

/* Sizes the decode-graph buckets and their fixed index regions (graphs stay off when
 * LLMI_CUDA_GRAPHS=0 or the regions would be unreasonably large). */
static int graphs_init(llmi_backend *b, cuda_impl *im, llmi_status *st) {
    const char *env = getenv("LLMI_CUDA_GRAPHS");
    int cap = im->max_seqs < im->max_tokens ? im->max_seqs : im->max_tokens;
    if (cap > LOGIT_CHUNK) cap = LOGIT_CHUNK;
    int maxb = 1;
    while (maxb * 2 <= cap && maxb * 2 <= CUDA_GRAPH_MAX) maxb *= 2;
    im->graph_mbps = cuda_graph_stride(b->opts.max_ctx, b->model->cfg.max_ctx, b->opts.block_size);
    im->graph_max_bucket = maxb;
    size_t total = 0;
    for (int k = 0; k < CUDA_GRAPH_BUCKETS && (1 << k) <= maxb; k++) {
        im->graph_region_off[k] = total;
        total += graph_region_ints(1 << k, im->graph_mbps);
    }
    im->graphs_on = !(env && strcmp(env, "0") == 0) && total <= ((size_t)16 << 20) &&
                    cuda_graph_model_ok(b->model->cfg.n_experts);
    if (!im->graphs_on) return 0;
    CU_CHECK(st, cudaMallocHost((void **)&im->gmeta_h, total * sizeof(int32_t)));
    if (dalloc(im, (void **)&im->gmeta_d, total * sizeof(int32_t), &im->act_bytes, st)) return st->code;
    return 0;
}

/* ---- forward ---- */

static int check_batch(const llmi_backend *b, const llmi_batch *bt, llmi_status *st) {
    const cuda_impl *im = b->impl;
    if (!im->kv) return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: forward before kv_alloc");
    batch_limits lim = {.who = "cuda", .max_tokens = im->max_tokens, .max_seqs = im->max_seqs,
                        .n_vocab = b->model->cfg.n_vocab, .num_blocks = b->num_blocks,
                        .block_size = b->opts.block_size};
    return batch_check(bt, &lim, im->seq_maxpos, st);
}

/* Grows a pinned host buffer and its device twin to hold n elements of esz bytes (between
 * forwards: the stream is idle). */
static int pair_reserve(cuda_impl *im, void **h, void **d, size_t *cap, size_t n, size_t esz, llmi_status *st) {
    if (n <= *cap) return 0;
    size_t c = n + n / 2 + 1024;
    hfree(*h);
    dfree(*d);
    *h = *d = NULL;
    *cap = 0;
    CU_CHECK(st, cudaMallocHost(h, c * esz));
    if (dalloc(im, d, c * esz, NULL, st)) return st->code;
    *cap = c;
    return 0;
}

/* Profiling marks: an event after each op; op i's time is event[i+1] - event[i]. */
static int prof_start(llmi_backend *b, cuda_impl *im, llmi_status *st) {
    if (!b->profiling) return 0;
    if (!im->events) {
        /* a MoE layer marks each expert's gate|up, activation and down */
        int cap = b->model->cfg.n_layers * (16 + 3 * b->model->cfg.n_experts) + 64 + 3 * (im->max_tokens / LOGIT_CHUNK + 1);
        im->events = calloc((size_t)cap + 1, sizeof(cudaEvent_t));
        im->marks = calloc((size_t)cap, sizeof(cuda_prof_mark));
        if (!im->events || !im->marks) return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
        for (int i = 0; i <= cap; i++) {
            CU_CHECK(st, cudaEventCreate(&im->events[i]));
            im->prof_cap = i;   /* events[0..i] exist */
        }
    }
    im->prof_n = 0;
    CU_CHECK(st, cudaEventRecord(im->events[0], im->stream));
    return 0;
}

static int prof_mark(llmi_backend *b, cuda_impl *im, llmi_op_class c, llmi_op_cost cost, llmi_status *st) {
    if (!b->profiling || !im->events || im->prof_n >= im->prof_cap) return 0;
    im->marks[im->prof_n] = (cuda_prof_mark){c, cost};
    im->prof_n++;
    CU_CHECK(st, cudaEventRecord(im->events[im->prof_n], im->stream));
    return 0;
}

static int prof_collect(llmi_backend *b, cuda_impl *im, llmi_status *st) {
    if (!b->profiling || !im->events) return 0;
    for (int i = 0; i < im->prof_n; i++) {
        float ms = 0;
        CU_CHECK(st, cudaEventElapsedTime(&ms, im->events[i], im->events[i + 1]));
        op_stats_add(&b->stats, im->marks[i].cls, ms * 1e-3, im->marks[i].cost);
    }
    return 0;
}

#define MARK(cls, cost)                                           \
    do {                                                          \
        if (prof_mark(b, im, (cls), (cost), st)) return st->code; \
    } while (0)

/* y (n, ldy), columns [0, w->rows) = x (n, w->cols) bf16 @ W^T, by the kernel that suits
 * the weight and the batch. */
static int linear_run(cuda_impl *im, const cuda_linear *w, const void *x, int n, float *y, int ldy, llmi_status *st) {
    const void *dense = w->dense;
    if (!dense) {
        cuda_i4_path path = cuda_i4_choose(n, im->i4_dequant_min_n);
        if (path != CUDA_I4_DEQUANT_GEMM) {
            CU_CHECK(st, llmi_cuda_int4_matmul(&w->q4, x, WDT, n, NULL, y, ldy, im->stream));
            return 0;
        }
        CU_CHECK(st, llmi_cuda_int4_dequant(&w->q4, im->i4_scratch, WDT, im->stream));
        dense = im->i4_scratch;
    }
    return llmi_cuda_gemm_run(&im->gemm, dense, w->rows, w->cols, x, n, cuda_gemm_bucket(n), y, ldy, im->stream, st);
}

/* A group's linears into one output buffer: dense groups are one fused matrix; int4 parts
 * each write their own columns of y (n, ldy). */
static int linears_run(cuda_impl *im, const cuda_linear *ws, int n_ws, const void *x, int n, float *y, int ldy,
                       llmi_status *st) {
    int64_t col = 0;
    for (int i = 0; i < n_ws; i++) {
        if (linear_run(im, &ws[i], x, n, y + col, ldy, st)) return st->code;
        col += ws[i].rows;
    }
    return 0;
}

/* Weights as stored (bf16, or int4 packed), inputs bf16, outputs fp32. */
static llmi_op_cost linears_cost(const cuda_linear *ws, int n_ws, int n) {
    llmi_op_cost c = {0};
    for (int i = 0; i < n_ws; i++) {
        llmi_op_cost k = cost_matmul(ws[i].rows, ws[i].cols, (double)ws[i].bytes, n, WDT_BYTES);
        c.bytes += k.bytes;
        c.flops += k.flops;
    }
    return c;
}

/* The device-side view of one forward: where its index arrays live and how the work is
 * split, and what happens to the logit rows.  An eager forward points into meta_d; a
 * graph replay into its bucket's fixed region of gmeta_d, so a captured graph's kernel
 * arguments stay valid. */
typedef struct fwd_plan {
    int n, nl, n_dec, n_tiles, max_blocks_per_seq;
    int n_splits, n_splits_win;   /* decode splits of the layers without and with a window (sliding_window) */
    const int32_t *tok, *pos, *slot, *seq, *bt, *lr, *dec, *tiles;   /* device */
    double ctx_sum, ctx_sum_win;   /* keys attended summed over tokens (stats): full layers, sliding layers */
    float *host_logits;       /* (nl, n_vocab) host: every logit row copied here, or NULL */
    const llmi_sample_row *rows;   /* (nl) host: sample every logit row on the device, or NULL */
} fwd_plan;

/* After lm_head wrote logit rows [r0, r0 + cnt) into im->logits: the copies the host
 * asked for (all rows, or the raw rows of requests that want logprobs, before the sampler
 * penalises them in place), then the device sampler on those rows. */
static int logits_out(llmi_backend *b, cuda_impl *im, const fwd_plan *f, int r0, int cnt, llmi_status *st) {
    const size_t V = (size_t)b->model->cfg.n_vocab;
    if (f->host_logits)
        CU_CHECK(st, cudaMemcpyAsync(f->host_logits + (size_t)r0 * V, im->logits, (size_t)cnt * V * sizeof(float),
                                     cudaMemcpyDeviceToHost, im->stream));
    if (!f->rows) return 0;
    for (int i = 0; i < cnt; i++)
        if (im->lp_slot[r0 + i] >= 0)
            CU_CHECK(st, cudaMemcpyAsync(im->lp_h + (size_t)im->lp_slot[r0 + i] * V, im->logits + (size_t)i * V,
                                         V * sizeof(float), cudaMemcpyDeviceToHost, im->stream));
    CU_CHECK(st, llmi_cuda_sample(im->logits, cnt, (int)V, im->sp_d + r0, im->hist_d, im->tok_d + r0, im->stream));
    MARK(LLMI_OP_SAMPLE, ((llmi_op_cost){.bytes = (double)cnt * V * 4.0}));
    return 0;
}

/* Grows the pinned tap buffer to n floats (the stream is idle: every use synchronizes). */
static int tap_reserve(cuda_impl *im, size_t n, llmi_status *st) {
    if (n <= im->tap_cap) return 0;
    hfree(im->tap_h);
    im->tap_h = NULL;
    im->tap_cap = 0;
    CU_CHECK(st, cudaMallocHost((void **)&im->tap_h, n * sizeof(float)));
    im->tap_cap = n;
    return 0;
}

/* The tap at (layer l, t), if one is set: x (n, width) on the device in dt, handed over
 * where it is (tap_device) or as fp32 on the host, converted through im->gu (free at
 * every tap point: nothing reads it between SwiGLU and the next gate/up GEMM).  Returns 0,
 * LLMI_TAP_STOP or an error. */
static int cuda_tap(llmi_backend *b, cuda_impl *im, int l, llmi_tap t, const void *x, llmi_dtype dt, int n, int width,
                    llmi_status *st) {
    if ((!b->tap && !b->tap_device) || (b->tap_skip >> t & 1u)) return 0;
    if (b->tap_device) {
        CU_CHECK(st, cudaStreamSynchronize(im->stream));
        return b->tap_device(b->tap_ctx, l, t, x, dt, n, width, st);
    }
    const size_t cnt = (size_t)n * (size_t)width;
    const float *src = x;
    if (dt != LLMI_F32) {
        if (width > im->gu_width)
            return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: a tap of width %d exceeds its fp32 scratch", width);
        CU_CHECK(st, llmi_cuda_to_f32(x, dt, (int64_t)cnt, im->gu, im->stream));
        src = im->gu;
    }
    if (tap_reserve(im, cnt, st)) return st->code;
    CU_CHECK(st, cudaMemcpyAsync(im->tap_h, src, cnt * sizeof(float), cudaMemcpyDeviceToHost, im->stream));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    return b->tap(b->tap_ctx, l, t, im->tap_h, n, width, st);
}

/* A sub-block's output rows im->delta (n, dim) made what the residual add takes (the next
 * norm, the final norm before lm_head, or forward_layers' hidden output), in place: RMS-normed
 * by w (Gemma's sandwich norm; none without w), then times Granite's residual scale. */
static int sub_block_out(llmi_backend *b, cuda_impl *im, const float *w, int n, llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    if (w) {
        CU_CHECK(st, llmi_cuda_add_rmsnorm(im->delta, NULL, w, NULL, n, c->dim, c->norm_eps, im->delta, LLMI_F32,
                                           im->stream));
        MARK(LLMI_OP_NORM, cost_rmsnorm(n, c->dim, false, sizeof(float)));
    }
    if (config_residual_scale(c) != 1.0f) {
        CU_CHECK(st, llmi_cuda_scale(im->delta, (size_t)n * c->dim, config_residual_scale(c), im->stream));
        MARK(LLMI_OP_NORM, ((llmi_op_cost){.bytes = 2.0 * n * c->dim * sizeof(float)}));
    }
    return 0;
}

/* The end of layer L: sub_block_out of its MLP's output, then its control vector added to it,
 * as the CPU's run_layers (the residual add takes im->delta next). */
static int layer_out(llmi_backend *b, cuda_impl *im, const cuda_layer *L, int n, llmi_status *st) {
    if (sub_block_out(b, im, L->post_ffn_norm, n, st)) return st->code;
    if (L->control) CU_CHECK(st, llmi_cuda_add_bias(im->delta, b->model->cfg.dim, L->control, n, b->model->cfg.dim,
                                                    im->stream));
    return 0;
}

/* A MoE layer's MLP (the CPU's moe_mlp) on im->xn (n, dim) bf16 into im->delta (n, dim):
 * the router GEMM and the routing kernel on the device; the choices to the host, the one
 * wait of the layer, to count each expert's tokens; the (token, expert) pairs grouped by
 * expert, tokens ascending, as the CPU groups them, and that grouping uploaded; the routed
 * rows gathered; for each expert with tokens, its gate|up GEMM, SwiGLU and down GEMM on
 * row views of the stacked weights, into its rows of moe_y; then each token's outputs
 * weighted and summed in ascending expert order.  The wait is why a MoE model runs no
 * decode graphs (cuda_graph_model_ok). */
static int moe_mlp(llmi_backend *b, cuda_impl *im, const cuda_layer *L, int n, llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    const int dim = c->dim, ffn = c->ffn_dim, E = c->n_experts, k = c->n_experts_used;
    const size_t e = WDT_BYTES, nk = (size_t)n * k;
    if (linear_run(im, &L->router, im->xn, n, im->moe_logits, E, st)) return st->code;
    CU_CHECK(st, llmi_cuda_moe_route(im->moe_logits, n, E, k, c->moe_norm_topk, im->moe_sel_d, im->moe_wt, im->stream));
    MARK(LLMI_OP_MLP_UP, linears_cost(&L->router, 1, n));
    CU_CHECK(st, cudaMemcpyAsync(im->moe_sel_h, im->moe_sel_d, nk * sizeof(int32_t), cudaMemcpyDeviceToHost, im->stream));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));

    /* checked there: at most n rows an expert, so an expert's rows fit gu and act */
    const int32_t *start = im->moe_start;
    if (backend_moe_group(im->moe_sel_h, n, k, E, im->moe_start, im->moe_idx_h, im->moe_idx_h + nk, st))
        return st->code;
    CU_CHECK(st, cudaMemcpyAsync(im->moe_idx_d, im->moe_idx_h, 2 * nk * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 im->stream));
    CU_CHECK(st, llmi_cuda_gather_rows(im->xn, (int64_t)dim * e, im->moe_idx_d, (int)nk, im->moe_xg, im->stream));
    MARK(LLMI_OP_HOST, ((llmi_op_cost){.bytes = 3.0 * nk * sizeof(int32_t) + 2.0 * nk * dim * e}));

    for (int x = 0; x < E; x++) {
        const int p0 = start[x], cnt = start[x + 1] - p0;
        if (cnt == 0) continue;
        const cuda_linear gu = {.dense = (char *)L->gu[0].dense + (size_t)x * 2 * ffn * dim * e, .rows = 2 * ffn,
                                .cols = dim, .bytes = (size_t)2 * ffn * dim * e};
        const cuda_linear down = {.dense = (char *)L->down.dense + (size_t)x * dim * ffn * e, .rows = dim,
                                  .cols = ffn, .bytes = (size_t)dim * ffn * e};
        if (linear_run(im, &gu, (const char *)im->moe_xg + (size_t)p0 * dim * e, cnt, im->gu, 2 * ffn, st))
            return st->code;
        MARK(LLMI_OP_MLP_UP, linears_cost(&gu, 1, cnt));
        CU_CHECK(st, llmi_cuda_swiglu(im->gu, im->gu + ffn, 2 * ffn, cnt, ffn, im->act, WDT, im->stream));
        MARK(LLMI_OP_ACT, cost_swiglu(cnt, ffn, e));
        if (linear_run(im, &down, im->act, cnt, im->moe_y + (size_t)p0 * dim, dim, st)) return st->code;
        MARK(LLMI_OP_MLP_DOWN, linears_cost(&down, 1, cnt));
    }
    CU_CHECK(st, llmi_cuda_moe_combine(im->moe_y, im->moe_idx_d + nk, im->moe_wt, n, k, dim, im->delta, im->stream));
    MARK(LLMI_OP_MLP_DOWN, ((llmi_op_cost){.bytes = (double)nk * dim * 4 + (double)n * dim * 4 + nk * 8.0}));
    return 0;
}

/* Decoder layers [first, last) over the plan's batch, on the residual stream in im->x:
 * layer `first` reads it as it is, each later one adds the previous layer's output
 * (im->delta) inside its first norm, and the last layer's stays in im->delta.  Taps (only
 * outside graph capture) may stop it: *stopped, 0 returned. */
static int layers_run(llmi_backend *b, cuda_impl *im, const fwd_plan *f, int first, int last, bool *stopped,
                      llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    const int n = f->n, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim,
              qd = im->q_dim, kvd = im->kv_dim, W = im->qkv_dim;
    const size_t e = WDT_BYTES, row_bytes = kv_dtype_row_bytes(b->opts.kv_dtype, (size_t)kvd);
    const double esz = (double)row_bytes / kvd;   /* bytes per KV value (q8: 34/32) */
    const size_t layer_kv = (size_t)b->num_blocks * b->opts.block_size * row_bytes;   /* one of K or V */
    *stopped = false;
#define TAP(l, t, x, w)                                                      \
    do {                                                                     \
        int r_ = cuda_tap(b, im, (l), (t), (x), WDT, n, (w), st);            \
        if (r_ == LLMI_TAP_STOP) {                                           \
            *stopped = true;                                                 \
            return 0;                                                        \
        }                                                                    \
        if (r_) return r_;                                                   \
    } while (0)

    for (int l = first; l < last; l++) {
        const cuda_layer *L = &im->layers[l];
        CU_CHECK(st, llmi_cuda_add_rmsnorm(im->x, l == first ? NULL : im->delta, L->attn_norm, NULL, n, dim,
                                           c->norm_eps, im->xn, WDT, im->stream));
        MARK(LLMI_OP_NORM, cost_rmsnorm(n, dim, l > first, e));
        TAP(l, LLMI_TAP_ATTN_IN, im->xn, dim);

        if (linears_run(im, L->qkv, L->n_qkv, im->xn, n, im->qkv, W, st)) return st->code;
        if (L->b_qkv) CU_CHECK(st, llmi_cuda_add_bias(im->qkv, W, L->b_qkv, n, W, im->stream));
        MARK(LLMI_OP_QKV, linears_cost(L->qkv, L->n_qkv, n));
        if (L->q_norm || L->k_norm) {   /* Qwen3: each q and k head normed before RoPE (a lone one fails the launch) */
            CU_CHECK(st, llmi_cuda_head_rmsnorm(im->qkv, W, n, nh, nkv, hd, L->q_norm, L->k_norm, c->norm_eps,
                                                im->stream));
            MARK(LLMI_OP_NORM, cost_rmsnorm(n, qd + kvd, false, sizeof(float)));
        }

        char *kc = (char *)im->kv + (size_t)l * 2 * layer_kv, *vc = kc + layer_kv;
        /* fp8 scales NULL = 1 in rope_kv and attention, as the CPU backend's fixed kv_scale */
        const bool local = config_layer_rope_local(c, l);
        CU_CHECK(st, llmi_cuda_rope_kv(im->qkv, W, im->qkv + qd, W, im->qkv + qd + kvd, W, f->pos, f->slot, n, nh, nkv,
                                       hd, config_layer_rope_dim(c, l), local ? im->inv_freq_local : im->inv_freq,
                                       config_rope_mscale(c, local), kc, vc, b->opts.kv_dtype, NULL, NULL,
                                       im->stream));
        MARK(LLMI_OP_ROPE_KV, cost_rope_kv(n, qd, kvd, esz));

        const int window = config_layer_window(c, l);   /* the whole context's K/V stays; the kernels skip it */
        llmi_cuda_attn a = {
            .q = im->qkv, .q_stride = W, .k_cache = kc, .v_cache = vc, .kv_dt = b->opts.kv_dtype,
            .positions = f->pos, .seq_of_token = f->seq, .block_tables = f->bt,
            .max_blocks_per_seq = f->max_blocks_per_seq, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
            .block_size = b->opts.block_size, .scale = config_attn_scale(c), .softcap = c->attn_softcap,
            .window = window, .out = im->att, .out_stride = qd, .out_dt = WDT, .decode_tc = im->decode_tc, .tiles_async = im->tiles_async,
        };
        CU_CHECK(st, llmi_cuda_attn_decode(&a, f->dec, f->n_dec, window ? f->n_splits_win : f->n_splits, im->attn_work,
                                           im->stream));
        CU_CHECK(st, llmi_cuda_attn_prefill(&a, f->tiles, f->n_tiles, im->stream));
        MARK(LLMI_OP_ATTN, cost_attention(window ? f->ctx_sum_win : f->ctx_sum, n, qd, kvd, esz, e));
        TAP(l, LLMI_TAP_O_IN, im->att, qd);

        if (linear_run(im, &L->wo, im->att, n, im->delta, dim, st)) return st->code;
        if (L->b_o) CU_CHECK(st, llmi_cuda_add_bias(im->delta, dim, L->b_o, n, dim, im->stream));
        MARK(LLMI_OP_O_PROJ, linears_cost(&L->wo, 1, n));
        if (sub_block_out(b, im, L->post_attn_norm, n, st)) return st->code;

        CU_CHECK(st, llmi_cuda_add_rmsnorm(im->x, im->delta, L->ffn_norm, NULL, n, dim, c->norm_eps, im->xn, WDT,
                                           im->stream));
        MARK(LLMI_OP_NORM, cost_rmsnorm(n, dim, true, e));
        TAP(l, LLMI_TAP_MLP_IN, im->xn, dim);

        if (c->n_experts > 0) {   /* no down_proj tap, as the CPU's moe_mlp */
            if (moe_mlp(b, im, L, n, st)) return st->code;
            if (layer_out(b, im, L, n, st)) return st->code;
            continue;
        }
        if (linears_run(im, L->gu, L->n_gu, im->xn, n, im->gu, 2 * ffn, st)) return st->code;
        MARK(LLMI_OP_MLP_UP, linears_cost(L->gu, L->n_gu, n));

        if (c->act == LLMI_ACT_GELU_TANH)
            CU_CHECK(st, llmi_cuda_geglu(im->gu, im->gu + ffn, 2 * ffn, n, ffn, im->act, WDT, im->stream));
        else
            CU_CHECK(st, llmi_cuda_swiglu(im->gu, im->gu + ffn, 2 * ffn, n, ffn, im->act, WDT, im->stream));
        MARK(LLMI_OP_ACT, cost_swiglu(n, ffn, e));
        TAP(l, LLMI_TAP_DOWN_IN, im->act, ffn);

        if (linear_run(im, &L->down, im->act, n, im->delta, dim, st)) return st->code;
        MARK(LLMI_OP_MLP_DOWN, linears_cost(&L->down, 1, n));
        if (layer_out(b, im, L, n, st)) return st->code;
    }
#undef TAP
    return 0;
}

/* Everything between the index upload and the logits: enqueued on im->stream only, so it
 * can be captured into a graph (then with neither host_logits nor rows, and no tap), except
 * a MoE layer's wait for its routing (moe_mlp): such models are never captured. */
static int forward_body(llmi_backend *b, cuda_impl *im, const fwd_plan *f, llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    const int n = f->n, dim = c->dim;
    const size_t e = WDT_BYTES;

    CU_CHECK(st, llmi_cuda_embed(im->tok_embd, WDT, c->n_vocab, dim, f->tok, n, config_embed_scale(c), im->x,
                                 im->stream));
    MARK(LLMI_OP_EMBED, cost_embed(n, dim, (double)dim * e, sizeof(float)));
    bool stopped = false;
    if (layers_run(b, im, f, 0, c->n_layers, &stopped, st)) return st->code;

    /* Only the rows that need logits get the final residual add, norm and lm_head. */
    for (int r0 = 0; r0 < f->nl; r0 += LOGIT_CHUNK) {
        int cnt = f->nl - r0 < LOGIT_CHUNK ? f->nl - r0 : LOGIT_CHUNK;
        CU_CHECK(st, llmi_cuda_add_rmsnorm(im->x, im->delta, im->out_norm, f->lr + r0, cnt, dim, c->norm_eps, im->lgn,
                                           WDT, im->stream));
        MARK(LLMI_OP_NORM, cost_rmsnorm(cnt, dim, true, e));
        if (llmi_cuda_gemm_run(&im->gemm, im->lm_head, c->n_vocab, dim, im->lgn, cnt, cuda_gemm_bucket(cnt), im->logits,
                               c->n_vocab, im->stream, st))
            return st->code;
        MARK(LLMI_OP_LM_HEAD, cost_matmul(c->n_vocab, dim, (double)c->n_vocab * dim * e, cnt, e));
        CU_CHECK(st, llmi_cuda_logits_finish(im->logits, c->n_vocab, cnt, c->n_vocab, config_logit_scale(c),
                                             c->final_softcap, im->stream));
        if ((f->host_logits || f->rows) && logits_out(b, im, f, r0, cnt, st)) return st->code;
    }
    return 0;
}

/* An eager forward's plan of bt into *f, and one upload of its index arrays into meta_d. */
static int plan_batch(llmi_backend *b, cuda_impl *im, const llmi_batch *bt, fwd_plan *f, llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    const int n = bt->n_tokens, nl = bt->n_logits;
    f->n = n;
    f->nl = nl;
    f->max_blocks_per_seq = bt->max_blocks_per_seq;
    int max_pos = 0;
    llmi_cuda_attn_plan(bt, c->head_dim, im->plan_dec, &f->n_dec, im->plan_tiles, &f->n_tiles, &max_pos);
    f->n_splits = llmi_cuda_attn_splits(f->n_dec, c->n_kv_heads, c->n_heads, c->head_dim, max_pos, 0, im->n_sms,
                                        im->attn_work_floats);
    f->n_splits_win = c->sliding_window > 0 ? llmi_cuda_attn_splits(f->n_dec, c->n_kv_heads, c->n_heads, c->head_dim,
                                                                     max_pos, c->sliding_window, im->n_sms,
                                                                     im->attn_work_floats)
                                            : f->n_splits;
    f->ctx_sum = batch_attended_keys(bt, 0);
    f->ctx_sum_win = batch_attended_keys(bt, c->sliding_window);

    /* one upload of every index array: tokens | positions | slots | seq_of_token |
     * block_tables (the step's widest table: only columns in use) | logit_rows | decode
     * list | tiles */
    size_t nbt = (size_t)bt->n_seqs * bt->max_blocks_per_seq;
    size_t total = 4 * (size_t)n + nbt + (size_t)nl + (size_t)f->n_dec + 2 * (size_t)f->n_tiles;
    if (pair_reserve(im, (void **)&im->meta_h, (void **)&im->meta_d, &im->meta_cap, total, sizeof(int32_t), st))
        return st->code;
    int32_t *h = im->meta_h;
    size_t o_pos = n, o_slot = 2 * (size_t)n, o_seq = 3 * (size_t)n, o_bt = 4 * (size_t)n;
    size_t o_lr = o_bt + nbt, o_dec = o_lr + nl, o_tiles = o_dec + f->n_dec;
    memcpy(h, bt->tokens, n * sizeof(int32_t));
    memcpy(h + o_pos, bt->positions, n * sizeof(int32_t));
    memcpy(h + o_slot, bt->slot_mapping, n * sizeof(int32_t));
    memcpy(h + o_seq, bt->seq_of_token, n * sizeof(int32_t));
    memcpy(h + o_bt, bt->block_tables, nbt * sizeof(int32_t));
    if (nl) memcpy(h + o_lr, bt->logit_rows, nl * sizeof(int32_t));
    if (f->n_dec) memcpy(h + o_dec, im->plan_dec, f->n_dec * sizeof(int32_t));
    if (f->n_tiles) memcpy(h + o_tiles, im->plan_tiles, 2 * (size_t)f->n_tiles * sizeof(int32_t));
    if (prof_start(b, im, st)) return st->code;
    CU_CHECK(st, cudaMemcpyAsync(im->meta_d, h, total * sizeof(int32_t), cudaMemcpyHostToDevice, im->stream));
    const int32_t *d = im->meta_d;
    f->tok = d; f->pos = d + o_pos; f->slot = d + o_slot; f->seq = d + o_seq; f->bt = d + o_bt;
    f->lr = d + o_lr; f->dec = d + o_dec; f->tiles = d + o_tiles;
    MARK(LLMI_OP_HOST, ((llmi_op_cost){.bytes = total * 4.0}));
    return 0;
}

static int forward_eager(llmi_backend *b, cuda_impl *im, const llmi_batch *bt, fwd_plan f, llmi_status *st) {
    if (plan_batch(b, im, bt, &f, st)) return st->code;
    return forward_body(b, im, &f, st);
}

/* ---- CUDA graphs for pure-decode batches ----
 * A batch of B sequences with one token each (the steady state of serving) runs as the
 * graph of its bucket (the next power of two >= B), padded with harmless rows: token 0 at
 * position 0 of block 0, slot -1 (no KV write).  The first batch of a bucket runs eagerly:
 * its GEMMs key the algorithm cache by the same bucket (cuda_gemm_bucket), so that run
 * asks cuBLASLt for exactly the algorithms the graph then captures.  The second is
 * captured.  Index arrays live at fixed addresses in gmeta_d with a fixed block-table
 * stride (the engine's context); each step uploads tokens, positions, slots and only the
 * table columns in use (a 2D copy into the strided table).  The decode attention splits
 * each token's own context by a per-bucket split count.  Sampling and the logit copies run
 * after the replay, outside the graph. */

static int graph_forward(llmi_backend *b, cuda_impl *im, const llmi_batch *bt, const fwd_plan *outer, bool *done,
                         llmi_status *st) {
    const llmi_config *c = &b->model->cfg;
    const int n = bt->n_tokens, B = cuda_graph_bucket(n), k = __builtin_ctz((unsigned)B), gm = im->graph_mbps;
    cuda_graph_slot *g = &im->graphs[k];
    *done = false;
    if (g->failed) return 0;
    if (!g->exec && !g->seen) {
        g->seen = true;   /* first sight of this bucket: run eager */
        return 0;
    }
    size_t off = im->graph_region_off[k];
    int32_t *h = im->gmeta_h + off, *d = im->gmeta_d + off;
    int32_t *tok = h, *pos = h + B, *slot = h + 2 * B, *tab = h + 6 * B;
    for (int i = 0; i < B; i++) {
        bool real = i < n;
        tok[i] = real ? bt->tokens[i] : 0;
        pos[i] = real ? bt->positions[i] : 0;
        slot[i] = real ? bt->slot_mapping[i] : -1;
    }
    /* columns in use: every real row's table reaches its position (batch_check), and
     * eligibility keeps positions inside the stride; padding rows need column 0 only */
    const int W = bt->max_blocks_per_seq < gm ? bt->max_blocks_per_seq : gm;
    for (int i = 0; i < B; i++) {
        if (i < n) memcpy(tab + (size_t)i * W, bt->block_tables + (size_t)i * bt->max_blocks_per_seq, (size_t)W * 4);
        else memset(tab + (size_t)i * W, 0, (size_t)W * 4);
    }
    fwd_plan f = {.n = B, .nl = B, .n_dec = B, .n_tiles = 0, .max_blocks_per_seq = gm, .tok = d, .pos = d + B,
                  .slot = d + 2 * B, .seq = d + 3 * B, .lr = d + 4 * B, .dec = d + 5 * B, .bt = d + 6 * B,
                  .tiles = d};
    /* fixed per bucket, for the longest position the table stride allows (a window bounds
     * the sliding layers' ranges at any position) */
    f.n_splits = llmi_cuda_attn_splits(B, c->n_kv_heads, c->n_heads, c->head_dim, gm * b->opts.block_size - 1, 0,
                                       im->n_sms, im->attn_work_floats);
    f.n_splits_win = llmi_cuda_attn_splits(B, c->n_kv_heads, c->n_heads, c->head_dim, gm * b->opts.block_size - 1,
                                           c->sliding_window, im->n_sms, im->attn_work_floats);
    CU_CHECK(st, cudaMemcpyAsync(d, h, 3 * (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice, im->stream));
    CU_CHECK(st, cudaMemcpy2DAsync(d + 6 * B, (size_t)gm * 4, tab, (size_t)W * 4, (size_t)W * 4, (size_t)B,
                                   cudaMemcpyHostToDevice, im->stream));
    if (!g->exec) {
        /* the constant part of the region: every row its own sequence, logit row, decode token */
        for (int i = 0; i < B; i++) h[3 * B + i] = h[4 * B + i] = h[5 * B + i] = i;
        CU_CHECK(st, cudaMemcpyAsync(d + 3 * B, h + 3 * B, 3 * (size_t)B * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     im->stream));
        /* capture; any failure turns graphs off for this bucket and the step runs eager */
        CU_CHECK(st, cudaStreamSynchronize(im->stream));
        llmi_status cst = {0};
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamBeginCapture(im->stream, cudaStreamCaptureModeRelaxed);
        int rc = e == cudaSuccess ? forward_body(b, im, &f, &cst) : 1;
        if (e == cudaSuccess) e = cudaStreamEndCapture(im->stream, &graph);
        if (!rc && e == cudaSuccess) e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (rc || e != cudaSuccess) {
            (void)cudaGetLastError();
            g->exec = NULL;
            g->failed = true;
            fprintf(stderr, "cuda: no graph for decode batches of %d (%s); running them eagerly\n", B,
                    rc ? cst.msg : cudaGetErrorString(e));
            return 0;
        }
    }
    CU_CHECK(st, cudaGraphLaunch(g->exec, im->stream));
    fwd_plan out = *outer;
    out.nl = n;
    if ((out.host_logits || out.rows) && logits_out(b, im, &out, 0, n, st)) return st->code;
    *done = true;
    return 0;
}

/* Packs each logit row's sampling request, penalty window and logprob slot into the
 * pinned buffers and sends them ahead of the forward. */
static int sample_prepare(llmi_backend *b, cuda_impl *im, const llmi_batch *bt, const llmi_sample_row *rows,
                          llmi_status *st) {
    const int nl = bt->n_logits, V = b->model->cfg.n_vocab;
    size_t hist_total = 0;
    int n_lp = 0;
    for (int r = 0; r < nl; r++) {
        if (rows[r].n_window < 0 || (rows[r].n_window > 0 && !rows[r].window))
            return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: sampling row %d has a bad penalty window", r);
        hist_total += (size_t)rows[r].n_window;
        n_lp += rows[r].logits != NULL;
    }
    if (hist_total > INT32_MAX)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: %zu penalty-window tokens in one step", hist_total);
    if (pair_reserve(im, (void **)&im->hist_h, (void **)&im->hist_d, &im->hist_cap, hist_total, sizeof(int32_t), st))
        return st->code;
    if (n_lp > im->lp_cap) {
        hfree(im->lp_h);
        im->lp_h = NULL;
        im->lp_cap = 0;
        CU_CHECK(st, cudaMallocHost((void **)&im->lp_h, (size_t)n_lp * V * sizeof(float)));
        im->lp_cap = n_lp;
    }
    size_t at = 0;
    n_lp = 0;
    for (int r = 0; r < nl; r++) {
        const llmi_sample_row *q = &rows[r];
        im->sp_h[r] = (llmi_cuda_sample_params){
            .uniform = q->uniform, .temperature = q->temperature, .top_p = q->top_p, .min_p = q->min_p,
            .log_min_p = q->min_p > 0.0f ? logf(q->min_p) : 0.0f, .repeat_penalty = q->repeat_penalty,
            .frequency_penalty = q->frequency_penalty, .presence_penalty = q->presence_penalty, .top_k = q->top_k, .hist_start = (int)at, .hist_len = q->n_window};
        if (q->n_window) memcpy(im->hist_h + at, q->window, (size_t)q->n_window * sizeof(int32_t));
        at += (size_t)q->n_window;
        im->lp_slot[r] = q->logits ? n_lp++ : -1;
    }
    if (nl) CU_CHECK(st, cudaMemcpyAsync(im->sp_d, im->sp_h, (size_t)nl * sizeof *im->sp_h, cudaMemcpyHostToDevice, im->stream));
    if (at) CU_CHECK(st, cudaMemcpyAsync(im->hist_d, im->hist_h, at * sizeof(int32_t), cudaMemcpyHostToDevice, im->stream));
    return 0;
}

/* forward (rows NULL: every logit row to logits) or forward_sample (rows: tokens out, and
 * the raw logits of the rows that ask). */
static int cuda_run(llmi_backend *b, const llmi_batch *bt, float *logits, const llmi_sample_row *rows, int32_t *tokens,
                    llmi_status *st) {
    if (b->tap || b->tap_device)
        return llmi_fail(st, LLMI_E_USAGE, "cuda backend: activation taps are not supported by forward (use forward_layers)");
    cuda_impl *im = b->impl;
    if (check_batch(b, bt, st)) return st->code;
    CU_CHECK(st, cudaSetDevice(im->device));
    /* a forward that failed midway may have left copies from the pinned buffers in flight */
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    const int nl = bt->n_logits;
    if (rows && sample_prepare(b, im, bt, rows, st)) return st->code;
    fwd_plan outer = {.host_logits = rows ? NULL : logits, .rows = rows};
    bool done = false;
    if (im->graphs_on && !b->profiling &&
        cuda_graph_eligible(bt, b->opts.block_size, im->graph_mbps, im->graph_max_bucket) &&
        graph_forward(b, im, bt, &outer, &done, st))
        return st->code;
    if (!done && forward_eager(b, im, bt, outer, st)) return st->code;
    if (rows && nl) CU_CHECK(st, cudaMemcpyAsync(im->tok_h, im->tok_d, (size_t)nl * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, im->stream));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    if (!done && prof_collect(b, im, st)) return st->code;
    if (rows) {
        const size_t V = (size_t)b->model->cfg.n_vocab;
        memcpy(tokens, im->tok_h, (size_t)nl * sizeof(int32_t));
        for (int r = 0; r < nl; r++)
            if (im->lp_slot[r] >= 0) memcpy(rows[r].logits, im->lp_h + (size_t)im->lp_slot[r] * V, V * sizeof(float));
    }
    return 0;
}

static int cuda_forward(llmi_backend *b, const llmi_batch *bt, float *logits, llmi_status *st) {
    return cuda_run(b, bt, logits, NULL, NULL, st);
}

static int cuda_forward_sample(llmi_backend *b, const llmi_batch *bt, const llmi_sample_row *rows, int32_t *tokens,
                               llmi_status *st) {
    return cuda_run(b, bt, NULL, rows, tokens, st);
}

/* Layers [first, last) as the model holds them now: each part of a layer whose tensors
 * were replaced since its upload (other data or dtype) is freed and uploaded again, the
 * rest left where it is, and the int4 prefill scratch grows with the widest int4 linear.
 * The staging buffers are made on the first upload and kept (im->refresh_up): the
 * quantizer refreshes several times a layer. */
static int refresh_layers(llmi_backend *b, cuda_impl *im, int first, int last, llmi_status *st) {
    const llmi_model *m = b->model;
    bool synced = false;
    int rc = 0;
    for (int l = first; l < last && !rc; l++) {
        cuda_layer *D = &im->layers[l];
        const cuda_layer_src now = layer_src(&m->layers[l]);
        for (int p = 0; p < LP_COUNT && !rc; p++) {
            if (layer_part_same(&D->src, &now, (cuda_layer_part)p)) continue;
            if (!synced) {
                synced = true;
                CU_CHECK(st, cudaStreamSynchronize(im->stream));   /* nothing in flight reads the old buffers */
            }
            if (!im->refresh_up_ready) {
                if ((rc = uploader_init(&im->refresh_up, st))) {
                    uploader_free(&im->refresh_up);
                    break;
                }
                im->refresh_up_ready = true;
            }
            im->weight_bytes -= D->part_bytes[p];
            D->part_bytes[p] = 0;
            layer_part_free(D, (cuda_layer_part)p);
            rc = upload_layer_part(im, &im->refresh_up, &m->cfg, &m->layers[l], D, (cuda_layer_part)p, st);
        }
        /* a part that failed keeps its old source, so the next call tries it again */
        if (!rc) D->src = now;
    }
    if (synced && !rc && cudaStreamSynchronize(im->stream) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: weight upload failed: %s", cudaGetErrorString(cudaGetLastError()));
    if (!rc && im->i4_scratch_elems > im->i4_scratch_cap) {
        im->act_bytes -= im->i4_scratch_cap * WDT_BYTES;
        dfree(im->i4_scratch);
        im->i4_scratch = NULL;
        im->i4_scratch_cap = 0;
        if ((rc = dalloc(im, &im->i4_scratch, im->i4_scratch_elems * WDT_BYTES, &im->act_bytes, st))) return rc;
        im->i4_scratch_cap = im->i4_scratch_elems;
    }
    return rc;
}

/* Layers [run->first_layer, run->last_layer) eagerly, on run->hidden (host) or
 * run->hidden_device (this GPU) or the embeddings, with the taps the CPU backend has (each
 * activation handed over as fp32 on the host, or where it is to tap_device): what
 * `llmi quantize --device cuda` calibrates through. */
static int cuda_forward_layers(llmi_backend *b, const llmi_batch *bt, llmi_layer_run *run, llmi_status *st) {
    cuda_impl *im = b->impl;
    const llmi_config *c = &b->model->cfg;
    if (check_batch(b, bt, st)) return st->code;
    if (run->first_layer < 0 || run->last_layer > c->n_layers || run->first_layer > run->last_layer)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: layer range %d..%d outside the model's %d layers",
                         run->first_layer, run->last_layer, c->n_layers);
    CU_CHECK(st, cudaSetDevice(im->device));
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    if (refresh_layers(b, im, run->first_layer, run->last_layer, st)) return st->code;
    llmi_batch nb = *bt;   /* no logits: the hidden states are the output */
    nb.n_logits = 0;
    fwd_plan f = {0};
    if (plan_batch(b, im, &nb, &f, st)) return st->code;
    const int n = bt->n_tokens, dim = c->dim;
    const size_t bytes = (size_t)n * dim * sizeof(float);
    const llmi_dtype hdt = run->hidden_dtype;
    if (run->hidden_device && hdt != LLMI_F32 && hdt != LLMI_BF16 && hdt != LLMI_F16)
        return llmi_fail(st, LLMI_E_USAGE, "cuda backend: hidden states on the device in %s (f32, bf16 or f16 only)",
                         dtype_name(hdt));
    run->overflow = 0;
    if (run->embed)
        CU_CHECK(st, llmi_cuda_embed(im->tok_embd, WDT, c->n_vocab, dim, f.tok, n, config_embed_scale(c), im->x,
                                     im->stream));
    else if (run->hidden_device)
        CU_CHECK(st, llmi_cuda_to_f32(run->hidden_device, hdt, (int64_t)n * dim, im->x, im->stream));
    else
        CU_CHECK(st, cudaMemcpyAsync(im->x, run->hidden, bytes, cudaMemcpyHostToDevice, im->stream));
    if (layers_run(b, im, &f, run->first_layer, run->last_layer, &run->stopped, st)) return st->code;
    if (!run->stopped) {
        /* the residual plus the last layer's pending output, the sum the next layer's first
         * norm would form, rounded once into hidden_device, or in place in fp32 for the host;
         * the overflow count goes through the sampler's token buffers, which a
         * forward_layers call never uses */
        const bool pending = run->last_layer > run->first_layer;
        void *dst = run->hidden_device ? run->hidden_device : (void *)im->x;
        CU_CHECK(st, llmi_cuda_sum_store(im->x, pending ? im->delta : NULL, (int64_t)n * dim, dst,
                                         run->hidden_device ? hdt : LLMI_F32, run->hidden_device ? im->tok_d : NULL,
                                         im->stream));
        if (run->hidden_device)
            CU_CHECK(st, cudaMemcpyAsync(im->tok_h, im->tok_d, sizeof(int32_t), cudaMemcpyDeviceToHost, im->stream));
        else
            CU_CHECK(st, cudaMemcpyAsync(run->hidden, im->x, bytes, cudaMemcpyDeviceToHost, im->stream));
        CU_CHECK(st, cudaStreamSynchronize(im->stream));
        if (run->hidden_device) run->overflow = im->tok_h[0];
    }
    CU_CHECK(st, cudaStreamSynchronize(im->stream));
    return 0;
}

/* ---- creation ---- */

static int pick_device(const llmi_backend_opts *o, int *count, llmi_status *st) {
    int drv = 0, rt = 0;
    cudaError_t e = cudaDriverGetVersion(&drv);
    if (e != cudaSuccess || drv == 0)
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: no CUDA driver found (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "libcuda not loaded");
    cudaRuntimeGetVersion(&rt);
    e = cudaGetDeviceCount(count);
    /* within a major version a newer runtime runs on an older driver (minor version
     * compatibility); across majors it does not */
    if (e == cudaErrorInsufficientDriver || drv / 1000 < rt / 1000)
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: driver too old: it supports CUDA %d.%d, llmi was built with CUDA %d.%d",
                         drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && *count == 0))
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: no CUDA device found");
    if (e != cudaSuccess) return llmi_fail(st, LLMI_E_USAGE, "--device cuda: cannot query devices: %s", cudaGetErrorString(e));
    if (o->gpu_index < 0 || o->gpu_index >= *count)
        return llmi_fail(st, LLMI_E_USAGE, "--gpu %d: out of range, this machine has %d CUDA device%s (0..%d)", o->gpu_index,
                         *count, *count == 1 ? "" : "s", *count - 1);
    return 0;
}

bool backend_cuda_compiled(void) { return true; }

int backend_cuda_device_count(void) {
    int drv = 0, count = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess || drv == 0) return 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
    return count;
}

int backend_cuda_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st) {
    *out = NULL;
    int count = 0;
    if (pick_device(o, &count, st)) return st->code;
    if (check_model(m, st)) return st->code;
    if (o->block_size <= 0 || o->max_batch_tokens <= 0 || o->max_seqs <= 0)
        return llmi_fail(st, LLMI_E_USAGE, "cuda backend: block_size, max_batch_tokens and max_seqs must be positive");
    if (o->max_batch_tokens > 65535)
        return llmi_fail(st, LLMI_E_USAGE, "cuda backend: max_batch_tokens %d is above the 65535 one launch can cover",
                         o->max_batch_tokens);
    if (backend_check_kv_dtype(&m->cfg, o->kv_dtype, "cuda", st)) return st->code;
    const llmi_config *c = &m->cfg;

    CU_CHECK(st, cudaSetDevice(o->gpu_index));
    struct cudaDeviceProp prop;
    CU_CHECK(st, cudaGetDeviceProperties(&prop, o->gpu_index));
    if (prop.major < 8)
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: GPU %d (%s) has compute capability %d.%d; llmi needs 8.0 or newer",
                         o->gpu_index, prop.name, prop.major, prop.minor);
    cudaError_t pe = llmi_cuda_probe();
    if (pe != cudaSuccess)
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: this llmi's kernels do not run on %s (sm_%d%d): %s; rebuild with "
                         "make CUDA_ARCH=%d%d", prop.name, prop.major, prop.minor, cudaGetErrorString(pe), prop.major, prop.minor);
    /* kernel attributes once here, never per launch */
    cudaError_t ae = llmi_cuda_attn_init(c->n_heads, c->n_kv_heads, c->head_dim);
    if (ae != cudaSuccess)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: attention kernels cannot get their shared memory for head_dim %d: %s",
                         c->head_dim, cudaGetErrorString(ae));

    llmi_backend *b = calloc(1, sizeof *b);
    cuda_impl *im = calloc(1, sizeof *im);
    if (!b || !im) {
        free(b);
        free(im);
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: out of host memory");
    }
    b->name = "cuda";
    snprintf(b->device_name, sizeof b->device_name, "%.127s", prop.name);
    b->model = m;
    b->opts = *o;
    b->impl = im;
    b->kv_block_bytes = cuda_kv_block_bytes;
    b->kv_budget_bytes = cuda_kv_budget_bytes;
    b->kv_alloc = cuda_kv_alloc;
    b->kv_read_block = cuda_kv_read_block;
    b->kv_write_block = cuda_kv_write_block;
    b->forward = cuda_forward;
    b->forward_sample = cuda_forward_sample;
    b->forward_layers = cuda_forward_layers;
    b->memory = cuda_memory;
    b->destroy = cuda_destroy;
    im->device = o->gpu_index;
    im->n_sms = prop.multiProcessorCount;
    im->max_tokens = o->max_batch_tokens;
    im->max_seqs = o->max_seqs;
    im->q_dim = c->n_heads * c->head_dim;
    im->kv_dim = c->n_kv_heads * c->head_dim;
    im->qkv_dim = im->q_dim + 2 * im->kv_dim;
    /* split-K partials for up to max(max_seqs, 64) decode tokens at 16 splits */
    int dec_tokens = o->max_seqs > 64 ? o->max_seqs : 64;
    if (dec_tokens > o->max_batch_tokens) dec_tokens = o->max_batch_tokens;
    im->attn_work_floats = llmi_cuda_attn_work_floats(dec_tokens, c->n_heads, c->head_dim, 16);

    bool tied = m->lm_head.data == m->tok_embd.data && m->lm_head.dtype == m->tok_embd.dtype;
    size_t i4_elems = 0;
    size_t need_w = weights_needed(m, tied, &i4_elems);
    size_t need_ws = workspace_needed(c, (size_t)o->max_batch_tokens, im->attn_work_floats, i4_elems);
    size_t free_b = 0, total = 0;
    int rc = 0;
    if (cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: cannot create a stream on GPU %d: %s", o->gpu_index,
                       cudaGetErrorString(cudaGetLastError()));
    /* the kernel switches: the first word of each is the default */
    static const char *const i4_words[] = {"auto", "mma", "chunk", "warp"}, *const dec_words[] = {"tc", "fp32"},
                             *const tiles_words[] = {"async", "sync"};
    static const llmi_i4_kernel i4_kernels[] = {LLMI_I4_AUTO, LLMI_I4_MMA, LLMI_I4_CHUNK, LLMI_I4_WARP};
    const char *i4_env = getenv("LLMI_I4_GEMV"), *dec_env = getenv("LLMI_ATTN_DECODE"),
               *tiles_env = getenv("LLMI_ATTN_TILES");
    int i4_word = 0, dec_word = 0, tiles_word = 0;
    if (!rc && cuda_env_word(i4_env, i4_words, 4, &i4_word))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_I4_GEMV=%s: not auto, mma, chunk or warp", i4_env);
    if (!rc && cuda_env_word(dec_env, dec_words, 2, &dec_word))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_ATTN_DECODE=%s: not tc or fp32", dec_env);
    if (!rc && cuda_env_word(tiles_env, tiles_words, 2, &tiles_word))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_ATTN_TILES=%s: not async or sync", tiles_env);
    im->i4_kernel = i4_kernels[i4_word];
    im->decode_tc = dec_word == 0;
    im->tiles_async = tiles_word == 0;
    const char *dmin_env = getenv("LLMI_I4_DEQUANT_MIN_N");
    if (!rc && cuda_i4_dequant_min_n(dmin_env, &im->i4_dequant_min_n))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_I4_DEQUANT_MIN_N=%s: not a token count from 1 to 65536",
                       dmin_env);
    if (!rc && cudaMemGetInfo(&free_b, &total) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: cudaMemGetInfo: %s", cudaGetErrorString(cudaGetLastError()));
    if (!rc && need_w + need_ws > free_b)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "cuda backend: the model does not fit on GPU %d (%s): needs %.2f GiB "
                       "(weights %.2f GiB + workspaces %.2f GiB for %d batch tokens), %.2f GiB free of %.2f GiB",
                       o->gpu_index, prop.name, (need_w + need_ws) / 1073741824.0, need_w / 1073741824.0,
                       need_ws / 1073741824.0, o->max_batch_tokens, free_b / 1073741824.0, total / 1073741824.0);
    const char *tune_env = getenv("LLMI_GEMM_TUNE");
    int tune = 1;
    if (!rc && cuda_gemm_tune(tune_env, &tune))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_GEMM_TUNE=%s: not a candidate count from 1 to %d",
                       tune_env, CUDA_GEMM_TUNE_MAX);
    /* The dense products of a one-token step through llmi_cuda_gemv instead of cuBLASLt
     * (LLMI_DENSE_GEMV=b1, the default: llama-3-8b batch-1 decode 194.2 tok/s against
     * 179.8 on the H200, 2026-11-27); =on takes batches of up to LLMI_GEMV_MAX_N tokens
     * (2-4 unmeasured), =off none */
    static const char *const gemv_words[] = {"b1", "off", "on"};
    static const int gemv_max_n[] = {1, 0, LLMI_GEMV_MAX_N};
    const char *gemv_env = getenv("LLMI_DENSE_GEMV");
    int gemv_word = 0;
    if (!rc && cuda_env_word(gemv_env, gemv_words, 3, &gemv_word))
        rc = llmi_fail(st, LLMI_E_USAGE, "cuda backend: LLMI_DENSE_GEMV=%s: not b1, off or on", gemv_env);
    if (!rc) rc = llmi_cuda_gemm_init(&im->gemm, WDT, GEMM_WORKSPACE, st);
    if (!rc) im->gemm.tune = tune;
    if (!rc) im->gemm.gemv_max_n = gemv_max_n[gemv_word];
    if (!rc) rc = load_weights(b, im, st);
    if (!rc) rc = alloc_workspaces(im, c, st);
    if (!rc) rc = graphs_init(b, im, st);
    if (rc) {
        cuda_destroy(b);
        return rc;
    }
    *out = b;
    return 0;
}

#endif
