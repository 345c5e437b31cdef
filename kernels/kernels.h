/* kernels.h — owns the C-callable launchers of every CUDA op family in kernels/ (one .cu per family).
 *
 * Tier 2 of the three kernel tiers (STYLE.md): each launcher takes raw device pointers,
 * explicit shapes and a stream, launches its __global__ kernel(s), and returns the
 * cudaError_t of the launch (cudaGetLastError), never aborting.  Shape and dtype checks
 * belong to tier 3, src/backend/cuda/backend_cuda.c.  Each op has a CPU twin in src/backend/cpu/ops.h with the
 * same semantics and layouts; tests/test_cuda_ops.c compares them.
 *
 * Activations are fp32 unless an `out_dt` says otherwise (LLMI_F32, LLMI_F16 or LLMI_BF16:
 * the dtype the next GEMM reads).  "Stride" arguments count elements between consecutive
 * token rows, so ops can read and write views into a fused QKV or gate|up buffer.
 * KV cache layout (per layer): (num_blocks, block_size, n_kv_heads, head_dim) in kv_dt. */
#ifndef LLMI_KERNELS_H
#define LLMI_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/batch.h"     /* C declarations keep C linkage from the .cu files */
#include "core/dtype.h"
#include "sample_chain.h"

/* ---- embed.cu ---- */
/* out (n, dim) f32 = rows of table (n_vocab, dim) in tdt (F32/F16/BF16) picked by tokens (n),
 * each value times scale in fp32 (Gemma's sqrt(dim); 1 leaves the row as it is); a token
 * outside [0, n_vocab) yields a zero row. */
cudaError_t llmi_cuda_embed(const void *table, llmi_dtype tdt, int64_t n_vocab, int dim, const int32_t *tokens, int n,
                            float scale, float *out, cudaStream_t s);

/* ---- norm.cu ---- */
/* Row i (< n) reads r = rows ? rows[i] : i, x = residual[r] (+ delta[r] when delta != NULL)
 * and writes out[i] (n, dim) in out_dt = x * rsqrt(mean(x^2) + eps) * w.  Without rows and
 * with delta, residual[r] = x is written back (cpu_add_rmsnorm); with rows it is not (the
 * final norm of just the logit rows).  Without delta and rows, out may be residual itself
 * in F32: an RMSNorm in place (cpu_rmsnorm; Gemma 3's post-norms of a sub-block's output).
 * residual, delta (*, dim) f32; w (dim) f32; dim <= LLMI_NORM_MAX_DIM (cudaErrorInvalidValue
 * otherwise). */
#define LLMI_NORM_MAX_DIM 16384
cudaError_t llmi_cuda_add_rmsnorm(float *residual, const float *delta, const float *w, const int32_t *rows, int n,
                                  int dim, float eps, void *out, llmi_dtype out_dt, cudaStream_t s);
/* Qwen3's q/k norm (cpu_head_rmsnorm), in place: in each of the n token rows of x (row
 * stride `stride` floats), the n_q_heads heads at columns [0, n_q_heads*head_dim) with q_w
 * and the n_kv_heads heads right after them with k_w each become
 * head * rsqrt(mean(head^2) + eps) * w; the rest of the row is left alone.  q_w, k_w
 * (head_dim) f32; head_dim <= LLMI_HEAD_NORM_MAX_DIM and (n_q_heads + n_kv_heads) *
 * head_dim <= stride (cudaErrorInvalidValue otherwise). */
#define LLMI_HEAD_NORM_MAX_DIM 1024
cudaError_t llmi_cuda_head_rmsnorm(float *x, int stride, int n, int n_q_heads, int n_kv_heads, int head_dim,
                                   const float *q_w, const float *k_w, float eps, cudaStream_t s);

/* ---- rope_kv.cu ---- */
/* Rotate-half RoPE of q (n, n_heads*head_dim; row stride q_stride) and k (n,
 * n_kv_heads*head_dim; k_stride) in place by positions (n): each head's first rope_dim
 * values (even, <= head_dim, 0 for none; the rest pass through), cos and sin times mscale.  Then K and V
 * (v_stride) into k_cache/v_cache at slot_mapping (n); a negative slot writes nothing.
 * inv_freq (head_dim/2) from backend_rope_inv_freq, uploaded once.  head_dim even, <= 1024.  fp8
 * stores value / k_scale[h] (v_scale[h]) (n_kv_heads each; NULL = 1); q8 needs head_dim
 * a multiple of 32. */
cudaError_t llmi_cuda_rope_kv(float *q, int q_stride, float *k, int k_stride, const float *v, int v_stride,
                              const int32_t *positions, const int32_t *slot_mapping, int n, int n_heads,
                              int n_kv_heads, int head_dim, int rope_dim, const float *inv_freq, float mscale,
                              void *k_cache, void *v_cache, llmi_kv_dtype kv_dt, const float *k_scale,
                              const float *v_scale, cudaStream_t s);

/* ---- activation.cu ---- */
/* out (n, d) in out_dt (row stride d) = silu(gate) * up; gate and up rows are in_stride apart. */
cudaError_t llmi_cuda_swiglu(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                             llmi_dtype out_dt, cudaStream_t s);
/* The same shapes with gelu_tanh(gate) * up (Gemma's GeGLU, cpu_geglu's expression). */
cudaError_t llmi_cuda_geglu(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                            llmi_dtype out_dt, cudaStream_t s);
/* y (n, cols; row stride) += bias (cols). */
cudaError_t llmi_cuda_add_bias(float *y, int stride, const float *bias, int n, int cols, cudaStream_t s);
/* The final logits y (n rows of stride, the first cols of each) divided by divisor (Granite's
 * logits_scaling; 1: none), then cap * tanh(y / cap) (Gemma 2's final soft cap; cap <= 0:
 * none); twin: cpu_logits_finish.  Neither: launches nothing. */
cudaError_t llmi_cuda_logits_finish(float *y, int stride, int n, int cols, float divisor, float cap, cudaStream_t s);
/* y (n) *= scale (Granite's residual scale on a sub-block's output; twin: cpu_scale). */
cudaError_t llmi_cuda_scale(float *y, size_t n, float scale, cudaStream_t s);

/* ---- moe.cu (mixture of experts) ---- */
/* Each token's experts (cpu_moe_route): sel (n, k) int32 and weights (n, k) f32 from the
 * router's logits (n, n_experts) f32.  A softmax over all n_experts, the k most probable
 * taken (the larger logit first, the lower expert on a tie; a NaN logit ranks last), their
 * probabilities as weights, divided by their sum when norm; each row's choices in ascending
 * expert order.  1 <= k <= n_experts <= LLMI_MOE_MAX_EXPERTS (cudaErrorInvalidValue
 * otherwise).  The choices equal the twin's; the weights agree to fp32 rounding (the
 * softmax's double sum is taken in another order, and expf may differ by an ulp). */
#define LLMI_MOE_MAX_EXPERTS 1024
cudaError_t llmi_cuda_moe_route(const float *logits, int n, int n_experts, int k, bool norm, int32_t *sel,
                                float *weights, cudaStream_t s);
/* out (m, row_bytes) row i = x (*, row_bytes) row rows[i] (m), bit for bit: the routed
 * tokens' normed rows in expert order. */
cudaError_t llmi_cuda_gather_rows(const void *x, int64_t row_bytes, const int32_t *rows, int m, void *out,
                                  cudaStream_t s);
/* out (n, dim) f32 row t = sum over j < k, in j order from zero, of weights[t*k + j] *
 * y row pos[t*k + j] (y (*, dim) f32: the experts' outputs, a row per routed (token,
 * expert) pair), each product and sum rounded as cpu_moe_combine's; with the choices in
 * ascending expert order a token's sum does not depend on what else is in the batch. */
cudaError_t llmi_cuda_moe_combine(const float *y, const int32_t *pos, const float *weights, int n, int k, int dim,
                                  float *out, cudaStream_t s);

/* ---- attention.cu ---- */
typedef struct llmi_cuda_attn {
    const float *q;              /* (n_tokens, q_stride) f32; head h at q + h*head_dim */
    int q_stride;
    const void *k_cache;         /* (num_blocks, block_size, n_kv_heads, head_dim) in kv_dt */
    const void *v_cache;         /* same */
    llmi_kv_dtype kv_dt;
    const float *k_scale;        /* (n_kv_heads) fp8 scales of this layer's K and V; NULL = 1 */
    const float *v_scale;
    const int32_t *positions;    /* (n_tokens) */
    const int32_t *seq_of_token; /* (n_tokens) */
    const int32_t *block_tables; /* (n_seqs, max_blocks_per_seq) */
    int max_blocks_per_seq;
    int n_heads, n_kv_heads, head_dim, block_size;
    float scale;                 /* of q.k (config_attn_scale) */
    float softcap;               /* > 0: a scaled score s becomes softcap * tanh(s / softcap) (Gemma 2's
                                    attn_logit_softcapping); 0: none */
    int window;                  /* keys a query at position p attends to: [p - window + 1, p]; 0: [0, p]
                                    (the layer's config_layer_window) */
    void *out;                   /* (n_tokens, out_stride) in out_dt; head h at out + h*head_dim */
    int out_stride;
    llmi_dtype out_dt;
    int decode_tc;               /* decode on tensor cores where the cache and shape allow (bf16/f16,
                                    head_dim % 16 == 0 and <= 256, <= 16 query heads per KV head),
                                    q and the probabilities rounded to the cache type; 0: fp32 */
    int tiles_async;             /* the tensor-core kernels' K/V tiles (prefill, decode_tc) copied by
                                    cp.async while the tile before is computed on, mma fragments
                                    by ldmatrix.x4; 0: tiles through registers, 32-bit fragment
                                    loads, as run on the H200 (same results) */
} llmi_cuda_attn;

/* Sets the attention kernels' shared-memory limits for these head shapes (cudaFuncSetAttribute
 * where a kernel needs more than 48 KiB): once per device before any launch, at backend
 * creation, so that no launch pays for it. */
cudaError_t llmi_cuda_attn_init(int n_heads, int n_kv_heads, int head_dim);

/* Host-side split of a batch (host arrays) into the two attention paths: tokens of
 * sequences with fewer than LLMI_ATTN_PREFILL_MIN query tokens go to the split-K
 * "decode" kernel (decode_tokens, n_tokens entries at most); longer query ranges are cut
 * into tiles of up to LLMI_ATTN_TILE_Q consecutive tokens for the tensor-core kernel
 * (tiles: (n_tiles, 2) = first token, token count; at most n_tokens/1 entries).  When
 * the head_dim does not suit the tensor-core kernel every token goes to the decode path.
 * *max_pos gets the largest position among decode tokens. */
#define LLMI_ATTN_PREFILL_MIN 16
#define LLMI_ATTN_TILE_Q 64
void llmi_cuda_attn_plan(const llmi_batch *b, int head_dim, int32_t *decode_tokens, int *n_decode, int32_t *tiles,
                         int *n_tiles, int *max_pos);
/* Splits for the decode path: enough blocks to fill the GPU, each split >= 256 positions of
 * the longest range a token attends to (max_pos + 1, or window when that is shorter:
 * llmi_cuda_attn.window), capped by work_floats (the workspace the caller holds). */
int llmi_cuda_attn_splits(int n_decode, int n_kv_heads, int n_heads, int head_dim, int max_pos, int window, int n_sms,
                          size_t work_floats);
/* Floats of workspace the decode path needs for n_decode tokens and n_splits > 1. */
size_t llmi_cuda_attn_work_floats(int n_decode, int n_heads, int head_dim, int n_splits);
/* Flash-decoding over paged KV, GQA-aware (one block reads a KV tile once for all the
 * query heads of its KV head), split-K with a combine pass when n_splits > 1: each
 * token's positions [0, pos] (with a window, [pos - window + 1, pos]) are cut into n_splits
 * equal chunks.  tokens (n) device list
 * of token indices; work (llmi_cuda_attn_work_floats) device floats. */
cudaError_t llmi_cuda_attn_decode(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits, float *work,
                                  cudaStream_t s);
/* Tiled causal flash-attention over paged KV on tensor cores (mma.sync, bf16 or f16 inputs,
 * fp32 accumulation); with a window each tile starts at its lowest row's first key and masks
 * the keys before each row's own; tiles (n_tiles, 2) device array from llmi_cuda_attn_plan.
 * Needs head_dim % 16 == 0 and head_dim <= 256, q 16-byte aligned and q_stride a multiple
 * of 4 (cudaErrorInvalidValue otherwise). */
cudaError_t llmi_cuda_attn_prefill(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles, cudaStream_t s);

/* ---- sample.cu ---- */
/* out (n_rows) = argmax of each logits row (n_rows, n_vocab); lowest id on ties, NaN loses. */
cudaError_t llmi_cuda_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s);

/* Samples one token per row (params, sample_chain.h): repetition penalty once per distinct
 * token of the row's window in hist, applied to the logits in place; then top-k, top-p,
 * min-p, temperature and the inverse-CDF draw with the row's uniform, in sampler.c's
 * order and arithmetic (sample.cu says where rounding may still differ).  logits
 * (n_rows, n_vocab) device, penalised on return; params (n_rows) and hist device arrays;
 * out (n_rows) device. */
cudaError_t llmi_cuda_sample(float *logits, int n_rows, int n_vocab, const llmi_cuda_sample_params *params,
                             const int32_t *hist, int32_t *out, cudaStream_t s);

/* ---- dequant.cu ---- */
/* dst (n_elems) in dst_dt (F16 or BF16) <- src (n_elems) in src_dt (F32/F16/BF16/Q8_0/Q4_0/Q4_1,
 * contiguous GGUF blocks); n_elems a multiple of dtype_block_elems(src_dt). */
cudaError_t llmi_cuda_dequant(const void *src, llmi_dtype src_dt, int64_t n_elems, void *dst, llmi_dtype dst_dt,
                              cudaStream_t s);
/* dst (n) f32 <- src (n) in F32/F16/BF16. */
cudaError_t llmi_cuda_to_f32(const void *src, llmi_dtype src_dt, int64_t n, float *dst, cudaStream_t s);
/* dst (n) in dst_dt (F32, F16 or BF16) <- a + b (b NULL: a), summed in fp32 and rounded
 * once to nearest even; overflow (device, or NULL) := how many sums finite in fp32 the
 * dtype could not hold (F16 past 65504). */
cudaError_t llmi_cuda_sum_store(const float *a, const float *b, int64_t n, void *dst, llmi_dtype dst_dt,
                                int32_t *overflow, cudaStream_t s);

/* ---- gemm.cu (cuBLASLt, and a GEMV for a few tokens) ---- */
/* y (n, ldy) f32, columns [0, rows) = x (n, cols) @ W^T with W (rows, cols) and x in dt
 * (BF16 or F16), fp32 accumulation, all row-major and dense.  The context owns the
 * cuBLASLt handle, its workspace and a hashed cache of algorithms keyed on (rows, cols,
 * key_n, ldy, the operands' alignments): key_n >= n is the token count the caller buckets n into (the heuristic is
 * asked once per key for key_n tokens, and every n sharing the key reuses its answer).
 * Should cuBLASLt refuse a bucket's algorithm for a smaller n, that n gets an exact entry
 * of its own (counted in exact_fallbacks).  With tune > 1 a new key asks for the
 * heuristic's best `tune` candidates and keeps the fastest on the call's own operands
 * (each run once, then timed over LLMI_GEMM_TUNE_REPS runs with events), unless the stream
 * is capturing a graph: then the first is taken untimed.  One backend and one stream at a
 * time. */
#define LLMI_GEMM_CACHE 512      /* entries; a power of two */
#define LLMI_GEMM_PROBE 8        /* slots searched from a key's hash */
#define LLMI_GEMM_TUNE_MAX 16    /* candidates a key may time */
#define LLMI_GEMM_TUNE_REPS 3
typedef struct llmi_cuda_gemm_algo {
    int64_t m, k, key_n, ldc;    /* m = rows of W, k = cols; 0 m: empty */
    int64_t align;               /* alignments (<= 256 bytes) of W, x, y packed 9 bits each */
    int64_t cur_n;               /* the token count b_desc and c_desc describe now */
    void *a_desc, *b_desc, *c_desc;   /* cublasLtMatrixLayout_t */
    unsigned char algo[64];      /* cublasLtMatmulAlgo_t (opaque, 64 bytes) */
    long last_use;               /* for eviction within a probe window */
} llmi_cuda_gemm_algo;
typedef struct llmi_cuda_gemm {
    void *handle;                /* cublasLtHandle_t */
    void *desc;                  /* cublasLtMatmulDesc_t: op(A)=T, compute 32F */
    void *pref;                  /* cublasLtMatmulPreference_t */
    void *workspace;             /* (workspace_bytes) device */
    size_t workspace_bytes;
    llmi_dtype dt;
    llmi_cuda_gemm_algo *cache;  /* (LLMI_GEMM_CACHE) host */
    long clock;                  /* calls so far, the last_use stamp */
    long heuristic_calls;        /* how many keys were asked (tests check the cache) */
    long exact_fallbacks;        /* exact entries made for an n whose bucket algorithm cuBLASLt refused */
    int tune;                    /* candidates timed per new key, 1..LLMI_GEMM_TUNE_MAX (init: 1, untimed) */
    long tuned_keys;             /* keys whose algorithm was chosen by timing */
    long tune_candidates;        /* heuristic results timed (that ran for n: cuBLASLt offers up to tune) */
    long tune_runs;              /* GEMMs run to time them */
    void *tune_ev[2];            /* cudaEvent_t, made on the first timing */
    int gemv_max_n;              /* batches of 1..gemv_max_n (<= LLMI_GEMV_MAX_N) tokens take llmi_cuda_gemv
                                    where it fits (init: 0, never) */
    long gemv_runs;              /* products the GEMV ran */
} llmi_cuda_gemm;
int llmi_cuda_gemm_init(llmi_cuda_gemm *g, llmi_dtype dt, size_t workspace_bytes, llmi_status *st);
void llmi_cuda_gemm_free(llmi_cuda_gemm *g);
int llmi_cuda_gemm_run(llmi_cuda_gemm *g, const void *w, int64_t rows, int64_t cols, const void *x, int n, int key_n,
                       float *y, int64_t ldy, cudaStream_t s, llmi_status *st);
/* The same product for 1..LLMI_GEMV_MAX_N tokens without cuBLASLt, bf16 only (W and x
 * 16-byte aligned, cols a multiple of 8: llmi_cuda_gemv_fits): a GEMV that reads W once
 * (gemm.cu); cudaErrorInvalidValue for what does not fit. */
#define LLMI_GEMV_MAX_N 4
bool llmi_cuda_gemv_fits(llmi_dtype dt, const void *w, int64_t rows, int64_t cols, const void *x, int n);
cudaError_t llmi_cuda_gemv(const void *w, int64_t rows, int64_t cols, const void *x, int n, float *y, int64_t ldy,
                           cudaStream_t s);

/* embed.cu: cudaSuccess when this build's kernels can run on the current device
 * (cudaErrorNoKernelImageForDevice or similar when built for another architecture). */
cudaError_t llmi_cuda_probe(void);

#ifdef __cplusplus
}
#endif
#endif
