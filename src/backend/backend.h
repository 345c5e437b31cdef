/* backend.h — owns the interface every compute backend implements (CPU with OpenMP,
 * CUDA), the options they are created with, the per-op profiling counters, and what all
 * backends share beyond the interface: the model-shape check, the KV block size in bytes
 * and the RoPE frequency table.  A forward pass takes an llmi_batch (batch.h); the
 * scheduler never touches backend memory and backends never touch scheduling. */
#ifndef LLMI_BACKEND_H
#define LLMI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/batch.h"
#include "model/model.h"
#include "core/status.h"


/* Op classes that `llmi profile` reports; backends add time to these when profiling. */
typedef enum {
    LLMI_OP_EMBED = 0, LLMI_OP_NORM, LLMI_OP_QKV, LLMI_OP_ROPE_KV, LLMI_OP_ATTN, LLMI_OP_O_PROJ,
    LLMI_OP_MLP_UP, LLMI_OP_ACT, LLMI_OP_MLP_DOWN, LLMI_OP_LM_HEAD, LLMI_OP_SAMPLE, LLMI_OP_HOST,
    LLMI_OP_COUNT
} llmi_op_class;
const char *op_class_name(llmi_op_class c);

/* Checks that every tensor has the shape the config promises and a consistent row size;
 * who ("cpu", "cuda") starts the message.  Backends add their own dtype and size limits. */
int backend_check_model(const llmi_model *m, const char *who, llmi_status *st);
/* Checks that this model can keep its KV cache in t: a known dtype, and for q8 a head_dim
 * that is whole 32-value blocks (each head's row quantized on its own, on every backend). */
int backend_check_kv_dtype(const llmi_config *c, llmi_kv_dtype t, const char *who, llmi_status *st);
/* Bytes one KV block takes across all layers, K and V. */
size_t backend_kv_block_bytes(const llmi_config *c, int block_size, llmi_kv_dtype t);
/* A MoE layer's (token, expert) choices sel (n, k) grouped by expert, for its expert-by-
 * expert MLP: start (n_experts + 1), expert e's grouped rows [start[e], start[e + 1]); tok
 * (n * k), the token of each grouped row, ascending within an expert; row (n * k), the
 * grouped row of choice (t, j).  An error (st filled) for a choice outside [0, n_experts)
 * or an expert chosen twice by one token (more rows than tokens): a router's output is
 * checked before it sizes any work. */
int backend_moe_group(const int32_t *sel, int n, int k, int n_experts, int32_t *start, int32_t *tok, int32_t *row,
                      llmi_status *st);
/* inv_freq (head_dim / 2): RoPE inverse frequencies with the config's scaling, as
 * transformers computes them (modeling_rope_utils.py), in double rounded once to fp32; the
 * first rope_dim / 2 used, the rest 0. */
void backend_rope_inv_freq(const llmi_config *c, float *inv_freq);
/* The same for the sliding layers of a model with rope_theta_local (Gemma 3): that base,
 * no scaling (config_layer_rope_local says which layers take it). */
void backend_rope_inv_freq_local(const llmi_config *c, float *inv_freq);

typedef struct llmi_op_stats {
    double seconds[LLMI_OP_COUNT];
    double bytes[LLMI_OP_COUNT];   /* bytes moved (weights + activations + KV read/written) */
    double flops[LLMI_OP_COUNT];
    long calls[LLMI_OP_COUNT];
} llmi_op_stats;

typedef struct llmi_backend_opts {
    int n_threads;                 /* CPU: threads (0 = every CPU in the affinity mask; the CPU backend
                                      stores the count it resolved) */
    int gpu_index;                 /* CUDA: --gpu N */
    float gpu_mem_util;            /* CUDA: fraction of device memory to use (default below) */
    llmi_kv_dtype kv_dtype;
    int block_size;                /* KV block size in tokens */
    int max_batch_tokens;          /* the most tokens one forward will be given */
    int max_seqs;                  /* the most sequences one forward will be given */
    int max_ctx;                   /* the engine's context length (-c); 0 = the model's.  CUDA sizes
                                      its decode graphs' block tables from it */
} llmi_backend_opts;

/* The share of GPU memory llmi takes unless --gpu-mem-util says otherwise (vLLM's
 * default): the rest stays for the CUDA context, cuBLAS workspaces and other processes.
 * A plain literal so the help text can print it (see cli_common.c). */
#define LLMI_GPU_MEM_UTIL_DEFAULT 0.9

/* One logit row's sampling request for forward_sample: sampler.h's chain without its
 * host-only stages (sampler_needs_host), with what the engine takes from the request
 * itself: the draw from its rng and the penalty window. */
typedef struct llmi_sample_row {
    float temperature, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty;
    int top_k;
    double uniform;                /* in [0, 1); drawn when temperature > 0, else unused */
    const int32_t *window;         /* (n_window) host: the tokens the penalties see */
    int n_window;
    float *logits;                 /* (n_vocab) host or NULL: the row's raw logits are copied here
                                      (for --logprobs) */
} llmi_sample_row;

/* Points inside a decoder layer where a caller may read the activations that feed each
 * group of linears, as llama.cpp's eval callback does: `llmi quantize` collects its
 * calibration statistics here, from the one forward that serves the model. */
typedef enum {
    LLMI_TAP_ATTN_IN = 0,          /* (n_tokens, dim) input of q/k/v: attn_norm(h) */
    LLMI_TAP_O_IN,                 /* (n_tokens, n_heads*head_dim) input of o_proj: attention output */
    LLMI_TAP_MLP_IN,               /* (n_tokens, dim) input of gate/up: ffn_norm(h + o_proj) */
    LLMI_TAP_DOWN_IN,              /* (n_tokens, ffn_dim) input of down_proj: silu(gate) * up */
    LLMI_TAP_COUNT
} llmi_tap;

/* Called at every tap of every layer the forward runs; x (n_tokens, width).  Returns 0
 * to go on, LLMI_TAP_STOP to end the forward right after this tap (nothing after it is
 * computed or written), or an LLMI_E code with st set to fail the forward. */
#define LLMI_TAP_STOP (-1)
typedef int (*llmi_tap_fn)(void *ctx, int layer, llmi_tap tap, const float *x, int n_tokens, int width,
                           llmi_status *st);
/* The CUDA backend's other way to hand a tap over: x (n_tokens, width) of dtype dt (the
 * backend's activation type) stays in the device memory of the backend's GPU, valid until
 * the call returns, with the backend's stream idle.  A caller that reduces activations on
 * that GPU (`llmi quantize --device cuda`: Gram matrices) skips a copy to the host and
 * back.  Same returns as llmi_tap_fn. */
typedef int (*llmi_tap_device_fn)(void *ctx, int layer, llmi_tap tap, const void *x, llmi_dtype dt, int n_tokens,
                                  int width, llmi_status *st);

/* A partial forward: layers [first_layer, last_layer) over a batch, on hidden states the
 * caller holds between calls (calibration runs a model one layer at a time). */
typedef struct llmi_layer_run {
    int first_layer, last_layer;
    bool embed;                    /* hidden's input is the embedding of the batch's tokens */
    float *hidden;                 /* (n_tokens, dim) in: the input of first_layer (unless embed);
                                      out: the output of last_layer - 1 (unless a tap stopped it) */
    bool stopped;                  /* out: a tap returned LLMI_TAP_STOP */
    void *hidden_device;           /* CUDA only, instead of hidden when set: (n_tokens, dim) in
                                      hidden_dtype in the memory of the backend's GPU, in and out as
                                      hidden, rounded once from the fp32 sum (the calibration keeps
                                      its hidden states there between layers) */
    llmi_dtype hidden_dtype;       /* of hidden_device: F32, BF16 or F16 */
    long overflow;                 /* out, F16 hidden_device: sums finite in fp32 it could not hold */
} llmi_layer_run;

typedef struct llmi_backend llmi_backend;
struct llmi_backend {
    const char *name;              /* "cpu" or "cuda" */
    char device_name[128];         /* CPU model or GPU name, for reports */
    const llmi_model *model;
    llmi_backend_opts opts;
    int num_blocks;                /* KV blocks allocated by kv_alloc */
    bool profiling;                /* when true, forward fills stats */
    llmi_op_stats stats;
    llmi_tap_fn tap;               /* when set, forward and forward_layers call it at every tap */
    void *tap_ctx;
    llmi_tap_device_fn tap_device; /* CUDA only, instead of tap (with tap_ctx and tap_skip); a backend
                                      without device memory refuses a forward with it set */
    unsigned tap_skip;             /* taps (bits 1 << llmi_tap) not handed over: the cuda backend
                                      copies each one it hands to tap to the host */
    void *impl;

    /* Bytes of KV storage one block takes across all layers (K and V). */
    size_t (*kv_block_bytes)(const llmi_backend *b);
    /* Bytes the backend could give to the KV cache now (memory budget helper). */
    size_t (*kv_budget_bytes)(const llmi_backend *b);
    int (*kv_alloc)(llmi_backend *b, int num_blocks, llmi_status *st);
    /* One block's K and V of every layer, to or from host memory of kv_block_bytes in the
     * layout (n_layers, 2 (K, V), block_size, n_kv_heads, head_dim) of the KV dtype, the
     * same for every backend (the prompt cache's files).  NULL where unsupported. */
    int (*kv_read_block)(llmi_backend *b, int block, void *dst, llmi_status *st);
    int (*kv_write_block)(llmi_backend *b, int block, const void *src, llmi_status *st);
    /* Runs the model over the batch; writes (n_logits, n_vocab) floats to logits (host). */
    int (*forward)(llmi_backend *b, const llmi_batch *batch, float *logits, llmi_status *st);
    /* The forward, then one token per logit row picked on the device with rows (n_logits)
     * into tokens (n_logits): what sampler_sample_uniform would pick from the same logits
     * (kernels/sample.cu says where rounding may differ).  Only the rows that ask get their
     * logits back.  NULL where the backend leaves sampling to the engine (CPU). */
    int (*forward_sample)(llmi_backend *b, const llmi_batch *batch, const llmi_sample_row *rows, int32_t *tokens,
                          llmi_status *st);
    /* The same layers, a range at a time (see llmi_layer_run); NULL where unsupported. */
    int (*forward_layers)(llmi_backend *b, const llmi_batch *batch, llmi_layer_run *run, llmi_status *st);
    /* Bytes: the weights its forward reads (its own copies, and the model's bytes it reads in
 * place: the CPU's packed layout beside the F16 rows it uses as they are), KV,
 * activations, workspaces. */
    void (*memory)(const llmi_backend *b, size_t *weights, size_t *kv, size_t *activations);
    void (*destroy)(llmi_backend *b);
};

int backend_cpu_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st);
/* Bytes of the workspaces backend_cpu_create allocates for max_batch_tokens (KV aside):
 * what a caller that must fit in memory (llmi quantize) plans with. */
size_t backend_cpu_workspace_bytes(const llmi_config *c, int max_batch_tokens);
/* The CPU kernels this build runs, as `llmi version` names them: "avx512-vnni", "avx512 +
 * avx2" (AVX-512 without VNNI: its quantized matmuls on AVX2), "avx2" (with FMA and F16C) or
 * "portable". */
const char *backend_cpu_kernels(void);
/* Fails with a clear message when llmi was built without CUDA or no usable GPU exists. */
int backend_cuda_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st);
bool backend_cuda_compiled(void);
/* CUDA devices visible through a working driver; 0 without CUDA, driver or GPU. */
int backend_cuda_device_count(void);

#endif
