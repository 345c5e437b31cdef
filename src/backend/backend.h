/* backend.h — owns the interface every compute backend implements (CPU with OpenMP,
 * CUDA) and llmi_batch, the one input of a forward pass.
 *
 * A batch is a flat list of tokens from many sequences.  Each sequence contributes a
 * contiguous range [query_start[s], query_start[s+1]) of tokens: a prefill chunk or one
 * decode token.  KV for every token is written to its slot (block * block_size + offset)
 * before attention, and each token attends causally over its sequence's first
 * positions[i] + 1 cached positions, found through the sequence's block table.  The
 * scheduler never touches backend memory; backends never touch scheduling. */
#ifndef LLMI_BACKEND_H
#define LLMI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"
#include "core/status.h"

typedef struct llmi_batch {
    int n_tokens;
    const int32_t *tokens;         /* (n_tokens) */
    const int32_t *positions;      /* (n_tokens) position of each token in its sequence */
    const int32_t *slot_mapping;   /* (n_tokens) KV slot each token's K/V is written to */
    const int32_t *seq_of_token;   /* (n_tokens) index into the per-sequence arrays below */
    int n_seqs;
    const int32_t *query_start;    /* (n_seqs + 1) token range of each sequence */
    const int32_t *context_lens;   /* (n_seqs) cached length after this step = last position + 1 */
    const int32_t *block_tables;   /* (n_seqs, max_blocks_per_seq) physical block ids */
    int max_blocks_per_seq;
    int n_logits;
    const int32_t *logit_rows;     /* (n_logits) flat token indices whose logits are wanted */
} llmi_batch;

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

typedef struct llmi_op_stats {
    double seconds[LLMI_OP_COUNT];
    double bytes[LLMI_OP_COUNT];   /* bytes moved (weights + activations + KV read/written) */
    double flops[LLMI_OP_COUNT];
    long calls[LLMI_OP_COUNT];
} llmi_op_stats;

typedef enum { LLMI_KV_F32 = 0, LLMI_KV_F16, LLMI_KV_BF16 } llmi_kv_dtype;

typedef struct llmi_backend_opts {
    int n_threads;                 /* CPU: OpenMP threads (0 = all cores) */
    int gpu_index;                 /* CUDA: --gpu N */
    float gpu_mem_util;            /* CUDA: fraction of device memory to use */
    llmi_kv_dtype kv_dtype;
    int block_size;                /* KV block size in tokens */
    int max_batch_tokens;          /* the most tokens one forward will be given */
    int max_seqs;                  /* the most sequences one forward will be given */
} llmi_backend_opts;

typedef struct llmi_backend llmi_backend;
struct llmi_backend {
    const char *name;              /* "cpu" or "cuda" */
    char device_name[128];         /* CPU model or GPU name, for reports */
    const llmi_model *model;
    llmi_backend_opts opts;
    int num_blocks;                /* KV blocks allocated by kv_alloc */
    bool profiling;                /* when true, forward fills stats */
    llmi_op_stats stats;
    void *impl;

    /* Bytes of KV storage one block takes across all layers (K and V). */
    size_t (*kv_block_bytes)(const llmi_backend *b);
    /* Bytes the backend could give to the KV cache now (memory budget helper). */
    size_t (*kv_budget_bytes)(const llmi_backend *b);
    int (*kv_alloc)(llmi_backend *b, int num_blocks, llmi_status *st);
    /* Runs the model over the batch; writes (n_logits, n_vocab) floats to logits (host). */
    int (*forward)(llmi_backend *b, const llmi_batch *batch, float *logits, llmi_status *st);
    /* Bytes the backend holds: weights it copied or converted, KV, activations, workspaces. */
    void (*memory)(const llmi_backend *b, size_t *weights, size_t *kv, size_t *activations);
    void (*destroy)(llmi_backend *b);
};

int backend_cpu_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st);
/* Fails with a clear message when llmi was built without CUDA or no usable GPU exists. */
int backend_cuda_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st);
bool backend_cuda_compiled(void);
/* CUDA devices visible through a working driver; 0 without CUDA, driver or GPU. */
int backend_cuda_device_count(void);

#endif
