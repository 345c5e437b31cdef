/* cpu/ops.h — owns the CPU implementations of every op family in kernels/: the CPU
 * backend runs them, and each CUDA kernel is tested against its twin here.
 * Raw pointers, explicit shapes; OpenMP inside.  Activations are fp32.
 *
 * KV cache layout (per layer, K and V alike): (num_blocks, block_size, n_kv_heads, head_dim)
 * in the cache dtype; a token's slot s lives at block s / block_size, offset s % block_size. */
#ifndef LLMI_CPU_OPS_H
#define LLMI_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "model/model.h"
#include "core/tensor.h"

/* out (n, dim) = rows of embd (n_vocab, dim) picked by tokens (n). */
void cpu_embed(const llmi_tensor *embd, const int32_t *tokens, int n, float *out);

/* out (n, dim) = x * rsqrt(mean(x^2) + eps) * w;  x (n, dim), w (dim). out may equal x. */
void cpu_rmsnorm(const float *x, const float *w, int n, int dim, float eps, float *out);
/* Fused residual add then norm: residual (n, dim) += delta (n, dim); out = rmsnorm(residual). */
void cpu_add_rmsnorm(float *residual, const float *delta, const float *w, int n, int dim, float eps, float *out);

/* y (n, rows) = x (n, cols) @ W^T (+ bias (rows) when non-NULL), W in any llmi_dtype. */
void cpu_matmul(const llmi_tensor *w, const float *x, int n, const float *bias, float *y);

/* y[i] (n, w[i]->rows) = x (n, cols) @ W[i]^T (+ bias[i]) for nw weights that read the
 * same x (Q/K/V, gate/up).  Bit-identical to nw cpu_matmul calls; when the weights share
 * a quantized dtype and width, x is quantized once and one parallel region covers all
 * rows.  bias may be NULL, or hold NULL entries.  scratch (scratch_bytes, 64-byte
 * aligned) holds the quantized activations when it is at least
 * cpu_matmul_scratch_bytes(n, cols); otherwise the call allocates its own. */
void cpu_matmul_multi(int nw, const llmi_tensor *const *w, const float *x, int n, const float *const *bias,
                      float *const *y, void *scratch, size_t scratch_bytes);
size_t cpu_matmul_scratch_bytes(int n, int64_t cols);

/* Rotates q (n, n_heads, head_dim) in place and k (n, n_kv_heads, head_dim) in place by
 * positions (n), HF rotate-half convention, then writes k and v (n, n_kv_heads, head_dim)
 * into the caches at slot_mapping (n), each head in kv_dtype (fp8 divided by its head's
 * k_scale / v_scale (n_kv_heads), NULL = 1). */
void cpu_rope_kv_write(float *q, float *k, const float *v, const int32_t *positions, const int32_t *slot_mapping,
                       int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq,
                       void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                       const float *v_scale);

/* out (n_tokens, n_heads * head_dim) = causal attention of each token's q over its
 * sequence's cached K/V positions [0, positions[i]] through the batch's block tables,
 * the cache dequantized to fp32 first (fp8 times k_scale / v_scale (n_kv_heads), NULL = 1).
 * GQA: head h reads kv head h / (n_heads / n_kv_heads).  scale = 1/sqrt(head_dim). */
void cpu_paged_attention(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                         const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                         int n_kv_heads, int head_dim, int block_size, float scale, float *out);

/* out (n, d) = silu(gate) * up;  gate, up (n, d). */
void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out);

#endif
