/* cuda_plan.h — owns the CUDA backend's decisions that need no GPU, kept apart from
 * backend_cuda.c so that they build in every configuration (CUDA or not, ASan) and are
 * tested on any machine (tests/test_cuda_plan.c): which models and batches a decode graph
 * may run and with what block-table stride, the token buckets of the GEMM algorithm cache, which
 * int4 kernel serves a batch, the bytes a weight takes on the GPU, and the KV budget with
 * the headroom left for what is allocated after the cache. */
#ifndef LLMI_CUDA_PLAN_H
#define LLMI_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include "backend/batch.h"
#include "core/tensor.h"

/* Decode graphs exist for batches of 1, 2, 4, ..., CUDA_GRAPH_MAX sequences. */
#define CUDA_GRAPH_BUCKETS 9
#define CUDA_GRAPH_MAX (1 << (CUDA_GRAPH_BUCKETS - 1))

/* The graph bucket of a decode batch of n sequences: the next power of two >= n. */
int cuda_graph_bucket(int n);
/* Block-table columns a graph batch carries: ceil(ctx / block_size), ctx the engine's
 * context (-c) when given, else the model's (4096 when it has none). */
int cuda_graph_stride(int max_ctx, int model_max_ctx, int block_size);
/* A batch a decode graph can run: every sequence exactly one token (query_start[i] == i),
 * logits for every token in order, bucket <= max_bucket, every position inside the
 * graph's table stride.  The caller has run batch_check on it. */
bool cuda_graph_eligible(const llmi_batch *bt, int block_size, int graph_stride, int max_bucket);
/* Whether a model's decode steps may run as graphs at all: not a mixture of experts
 * (n_experts > 0), whose layers bring each step's expert choices to the host to size the
 * experts' GEMMs (a graph would replay the captured step's choices). */
bool cuda_graph_model_ok(int n_experts);

/* The token count the GEMM algorithm cache keys n on: the next power of two up to
 * CUDA_GRAPH_MAX, so a graph bucket and every batch it pads share one entry; beyond that
 * n rounded up to a multiple of CUDA_GRAPH_MAX.  Never less than n. */
int cuda_gemm_bucket(int n);

/* Which kernel an int4 (LLMI_I4G) linear runs for a batch of n tokens: the GEMV (weights
 * read once per CUDA_I4_GEMV_MAX_N tokens; n < CUDA_I4_DEQUANT_MIN_N), or a dequantization
 * into a bf16 scratch matrix followed by the cuBLASLt GEMM (where writing and reading the
 * dense matrix, ~4.5 bytes a weight, costs less than the GEMV's passes: from 33 tokens, by
 * the GEMV's ~16 FMAs a weight a pass; the H200 figures in docs/PERF.md are the first
 * version's). */
#define CUDA_I4_GEMV_MAX_N 16
#define CUDA_I4_DEQUANT_MIN_N 33
typedef enum { CUDA_I4_GEMV = 0, CUDA_I4_DEQUANT_GEMM } cuda_i4_path;
/* dequant_min_n: the batch from which the dequantization path runs (CUDA_I4_DEQUANT_MIN_N,
 * or LLMI_I4_DEQUANT_MIN_N's value: at batch 16 on the H200 the GEMV took 30 ms a step,
 * which writing and reading the dense matrix may beat; a device session times both) */
cuda_i4_path cuda_i4_choose(int n, int dequant_min_n);
/* A word-valued environment switch: *idx = the index of env in words (n_words), 0 (the
 * default, words[0]) when env is NULL; -1 when env is none of them. */
int cuda_env_word(const char *env, const char *const *words, int n_words, int *idx);
/* LLMI_I4_DEQUANT_MIN_N's value (env, may be NULL) as *n, else CUDA_I4_DEQUANT_MIN_N; -1
 * when it is not a whole number from 1 to 65536. */
int cuda_i4_dequant_min_n(const char *env, int *n);
/* LLMI_GEMM_TUNE's value (env, may be NULL) as *n: how many of cuBLASLt's candidates each new
 * GEMM shape times (llmi_cuda_gemm.tune), 1 (the heuristic's first, untimed) when unset; -1
 * when it is not a whole number from 1 to CUDA_GEMM_TUNE_MAX. */
#define CUDA_GEMM_TUNE_MAX 16
int cuda_gemm_tune(const char *env, int *n);

/* The int4 grid of a weight the W4A16 kernels serve: an I4G weight's own, or GGUF Q4_0's
 * groups of 32 (an fp16 scale each, every zero 8, no g_idx). */
void cuda_i4_grid(const llmi_tensor *t, int *group_size, int64_t *n_groups, const int32_t **g_idx);
/* Bytes the CUDA backend keeps on the GPU for weight t: int4 tensors it serves with the
 * W4A16 kernels (keep_int4: GPTQ/AWQ, and GGUF Q4_0 as groups of 32) as packed nibbles +
 * fp16 scales + u8 zeros (+ int32 g_idx), everything else converted to bf16. */
size_t cuda_weight_bytes(const llmi_tensor *t, bool keep_int4);

/* Device memory kept free beyond the KV cache for what is allocated after it: graph
 * instantiation, growth of the index and sampling buffers, the driver's own. */
size_t cuda_kv_headroom(size_t total);
/* Bytes the KV cache may take: util of total, less what is in use now (by this backend
 * and anyone sharing the GPU), plus the cache already held, less the headroom. */
size_t cuda_kv_budget(size_t total, size_t free_b, double util, size_t kv_held);

#endif
