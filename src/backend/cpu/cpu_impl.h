/* cpu/cpu_impl.h — owns the CPU backend's state (workspaces, KV pool) as backend_cpu.c
 * (the layer-by-layer forward) and step.c (the fused small-batch forward) share it, and
 * the profiling helpers both use. */
#ifndef LLMI_CPU_IMPL_H
#define LLMI_CPU_IMPL_H

#include <omp.h>
#include "backend/backend.h"
#include "backend/cost.h"
#include "backend/cpu/ops.h"

typedef struct cpu_step cpu_step;

/* A layer's linear weights, in the order the forward uses them (a MoE layer's GATE, UP and
 * DOWN are its stacked experts, which the forward reads expert by expert: cpu_impl.experts). */
enum { CPU_W_Q, CPU_W_K, CPU_W_V, CPU_W_O, CPU_W_GATE, CPU_W_UP, CPU_W_DOWN, CPU_W_ROUTER, CPU_W_PER_LAYER };
/* An expert's three matrices, in cpu_impl.experts (in the order of CPU_W_GATE, CPU_W_UP, CPU_W_DOWN). */
enum { CPU_E_GATE, CPU_E_UP, CPU_E_DOWN, CPU_E_PER_EXPERT };

/* One weight position's packed copy (cpu_qweight_pack), remade when the model's tensor at
 * that position changes (the quantizer swaps layers and tensors under a live backend). */
typedef struct cpu_packed {
    const void *src;            /* data of the model tensor it was packed from; NULL = none */
    llmi_dtype dtype;
    int64_t rows, cols;
    llmi_tensor t;              /* t.owned: the packed bytes */
} cpu_packed;

typedef struct cpu_impl {
    int max_tokens, max_seqs;
    float *x;        /* (max_tokens, dim) residual stream */
    float *xn;       /* (max_tokens, dim) normed input of the current sub-block */
    float *q;        /* (max_tokens, n_heads*head_dim) */
    float *k;        /* (max_tokens, n_kv_heads*head_dim) */
    float *v;        /* (max_tokens, n_kv_heads*head_dim) */
    float *att;      /* (max_tokens, n_heads*head_dim) attention output */
    float *delta;    /* (max_tokens, dim) o_proj / down_proj output, added to x */
    float *gate;     /* (max_tokens, ffn_dim); holds silu(gate)*up after the activation */
    float *up;       /* (max_tokens, ffn_dim) */
    float *lg;       /* (max_tokens, dim) final-normed rows that need logits */
    float *inv_freq; /* (head_dim/2) */
    float *rope_cs;  /* (max_tokens, head_dim/2) cos of each batch token's RoPE angles, shared by the layers */
    float *rope_sn;  /* (max_tokens, head_dim/2) sin of the same */
    float *inv_freq_local, *rope_cs_local, *rope_sn_local;   /* the same three for the sliding layers'
                                                                 RoPE (rope_theta_local > 0), else unused */
    /* mixture of experts (16 floats each for a dense model) */
    float *moe_logits;   /* (max_tokens, n_experts) router logits */
    int32_t *moe_sel;    /* (max_tokens, k) each token's experts, ascending */
    float *moe_wt;       /* (max_tokens, k) their routing weights */
    int32_t *moe_tok;    /* (max_tokens * k) the token of each grouped row (backend_moe_group) */
    int32_t *moe_row;    /* (max_tokens * k) the grouped row of each choice (token, j) */
    int32_t *moe_start;  /* (n_experts + 1) expert e's grouped rows [moe_start[e], moe_start[e + 1]) */
    float *moe_x;        /* (max_tokens, dim) one expert's tokens' normed rows, gathered */
    float *moe_y;        /* (max_tokens * k, dim) each grouped row's expert output */
    int32_t *seq_maxpos; /* (max_seqs) highest position a batch touches per sequence */
    void *mm_scratch;    /* quantized activations of one matmul: cpu_matmul_scratch_bytes(max_tokens, widest in) */
    size_t mm_scratch_bytes;
    void *kv;        /* (n_layers, 2, num_blocks, block_size, n_kv_heads, head_dim) in kv dtype */
    float *kv_scale; /* (n_layers, 2, n_kv_heads) fp8 scales of K and V: fixed at 1, as vLLM without
                        calibrated scales (a per-batch calibration would make outputs batch dependent) */
    size_t kv_bytes, ws_bytes;
    cpu_step *step;  /* the fused small-batch forward's team state (NULL: every batch takes run_layers) */
    cpu_packed *packed;          /* (n_layers * CPU_W_PER_LAYER + 1) packed copies; the last is lm_head's */
    const llmi_tensor **lw;      /* (n_layers, CPU_W_PER_LAYER) the weights the forward reads: a packed
                                    copy, or the model's own tensor (dense, int4) */
    const llmi_tensor *lm_head;  /* likewise */
    llmi_tensor *expert_views;   /* (n_layers, n_experts, CPU_E_PER_EXPERT) row views of the stacked experts */
    cpu_packed *expert_packed;   /* (same) their packed copies */
    const llmi_tensor **experts; /* (same) the weights the forward reads: packed copy or view; NULL when dense */
    const void **expert_src;     /* (n_layers, CPU_E_PER_EXPERT) the stacked matrix's data those were made from */
    size_t *expert_bytes;        /* (n_layers, CPU_E_PER_EXPERT) their bytes as the kernels read them */
    size_t weight_bytes;         /* packed copies + the tensors read in place (embedding table included) */
} cpu_impl;

/* Points lw / lm_head at packed copies of the model's current Q8_0/Q4_0/Q4_1 weights,
 * packing those that changed since the last call (all of them the first time). */
int cpu_weights_refresh(llmi_backend *b, llmi_status *st);

/* Profiling: adds the time since *t0 and the op's cost to class c. */
static inline void prof(llmi_backend *b, llmi_op_class c, double *t0, llmi_op_cost cost) {
    if (!b->profiling) return;
    double now = omp_get_wtime();
    op_stats_add(&b->stats, c, now - *t0, cost);
    *t0 = now;
}

/* The bytes a matmul reads are its weight's as the kernels hold it: a packed one's (the
 * k-quants pack larger than their GGUF bytes, ops.h). */
static inline llmi_op_cost mm_cost(const llmi_tensor *w, int n) {
    const double bytes = w->layout == LLMI_LAYOUT_CPU16 ? (double)cpu_qweight_bytes(w) : (double)w->rows * (double)w->row_bytes;
    return cost_matmul(w->rows, w->cols, bytes, n, sizeof(float));
}
static inline llmi_op_cost cost_sum(llmi_op_cost a, llmi_op_cost b) { return (llmi_op_cost){a.bytes + b.bytes, a.flops + b.flops}; }


/* Decode-sized batches (at most this many tokens) take the fused forward of step.c. */
#define CPU_STEP_MAX_TOKENS 8

/* The team's state for at most max_tokens tokens and n_threads threads; NULL when out of memory. */
cpu_step *cpu_step_create(const llmi_config *c, int n_threads, int max_tokens, size_t *bytes);
void cpu_step_destroy(cpu_step *s);
/* Whether cpu_step_forward can run this model (every weight has a row kernel). */
bool cpu_step_supports(const llmi_model *m);
/* The whole forward of bt (bt->n_tokens <= the create's max_tokens) in one parallel region:
 * logits (n_logits, n_vocab) for bt->logit_rows, the same numbers as run_layers + lm_head. */
void cpu_step_forward(llmi_backend *b, const llmi_batch *bt, float *logits);

#endif
