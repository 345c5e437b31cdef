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
/* One row of each on the calling thread (x, residual, delta, out (dim)). */
void cpu_rmsnorm_row(const float *x, const float *w, int dim, float eps, float *out);
void cpu_add_rmsnorm_row(float *residual, const float *delta, const float *w, int dim, float eps, float *out);
/* Qwen3's q/k norm, in place: heads [h0, h1) of n tokens' rows x (n, stride), head h at
 * x + t * stride + h * head_dim, each RMS-normalised over head_dim with the weights w
 * (head_dim) shared by all heads.  Serial: callers split the tokens or heads. */
void cpu_head_rmsnorm(float *x, int64_t stride, int n, int h0, int h1, int head_dim, const float *w, float eps);

/* y (n, rows) = x (n, cols) @ W^T (+ bias (rows) when non-NULL), W in any llmi_dtype. */
void cpu_matmul(const llmi_tensor *w, const float *x, int n, const float *bias, float *y);

/* y[i] (n, w[i]->rows) = x (n, cols) @ W[i]^T (+ bias[i]) for nw weights that read the
 * same x (Q/K/V, gate/up).  Bit-identical to nw cpu_matmul calls; when the weights are all
 * quantized (any mix of the packed dtypes below, as a Q4_K_M file's Q4_K and Q6_K) and of
 * one width, x is quantized once and one parallel region covers all rows.  bias may be
 * NULL, or hold NULL entries.  scratch (scratch_bytes, 64-byte aligned) holds the quantized
 * activations when it is at least cpu_matmul_scratch_bytes(n, cols); otherwise the call
 * allocates its own. */
void cpu_matmul_multi(int nw, const llmi_tensor *const *w, const float *x, int n, const float *const *bias,
                      float *const *y, void *scratch, size_t scratch_bytes);
size_t cpu_matmul_scratch_bytes(int n, int64_t cols);

/* Quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) as the CPU kernels
 * read them, "packed": the rows in groups of 16 (the last group padded with zero rows), a
 * group's 32-column blocks in order (a k-quant's or IQ4_XS's 8 blocks after a super-block
 * head of the rows' fp32 d, and -dmin for Q2_K/Q4_K/Q5_K), each block a head then its code quads:
 *   Q8_0, Q4_0, Q5_0, IQ4_NL  d (16) fp16 scales, one per row
 *   Q4_1, Q5_1        d (16) fp16 scales, m (16) fp16 mins: x = d * q + m
 *   Q4_K, Q5_K        scale (16), min (16) uint8: x = (d * scale) * q + (-dmin * min)
 *   Q6_K, Q3_K        scale of columns 0-15 (16), of 16-31 (16) int8: x = (d * scale) * (q - 32)
 *                     (Q3_K: scale - 32, and q - 4)
 *   Q2_K              scales of columns 0-15, 16-31 (16 each), then mins of the same (16 each)
 *                     uint8: x = (d * scale_h) * q + (-dmin * min_h)
 *   IQ4_XS            signed scale s (16) int8 (the file's 6-bit scale - 32): x = (d * s) * v[q]
 *                     (IQ4_NL: d * v[q]), q an index into iq4nl_value's table
 * (each product exact in fp32: the factors are the file's, nothing is re-quantized), then
 * quads of (16 rows, 4 bytes) at byte 4 * row + e:
 *   Q8_0     8 quads, quad j bytes q + 128 of columns 4j + e
 *   Q2_K, Q3_K  2 quads of bit pairs, quad k bits 2m, 2m + 1 the low 2 bits of column
 *            4(4k + m) + e; Q3_K then 1 quad whose bit j is column 4j + e's third bit
 *   the rest 4 quads, quad j the low 4 bits of column 4j + e (low nibble) and of column
 *            16 + 4j + e (high nibble); then 5-bit codes (Q5_*) 1 quad, 6-bit (Q6_K) 2,
 *            of the top bits: top quad 4 + j / (4 / w) (w = bits - 4) holds, at bit
 *            w * (j % (4 / w)), column 4j + e's and, 4 bits higher, column 16 + 4j + e's
 * so one 64-byte load is one column quad of 16 rows: the operand of one VNNI dot product
 * against 4 activation bytes.  Bits per weight: Q8_0 8.5, Q4_0 4.5, Q4_1 5, Q5_0 5.5, Q5_1
 * 6, IQ4_NL 4.5 (the GGUF layout's), Q2_K 3.25, Q3_K 3.625, Q4_K 4.75, Q5_K 5.75, Q6_K
 * 6.625, IQ4_XS 4.375 (GGUF 2.625, 3.4375, 4.5, 5.5, 6.5625, 4.25).
 * cpu_qweight_pack makes one (out->owned: free it) with layout LLMI_LAYOUT_CPU16. */
int cpu_qweight_packable(const llmi_tensor *w);
size_t cpu_qweight_bytes(const llmi_tensor *w);
int cpu_qweight_pack(const llmi_tensor *w, llmi_tensor *out, llmi_status *st);

/* Activations quantized for the packed kernels (matmul.c's numeric recipe), laid
 * over a scratch of cpu_matmul_scratch_bytes(n, cols).  nb = cols / 32 blocks. */
typedef struct cpu_qact {
    int nb;
    int8_t *q;        /* (n, nb*32) int8 activations, columns in order */
    float *dx;        /* (n, nb) block scale d_x = amax / 127 */
    int32_t *isx;     /* (n, nb) sum of the block's 32 x_q (the -k * sum correction) */
    float *sx;        /* (n, nb) d_x * sum(x_q) (the min term of Q4_1, Q5_1, Q4_K, Q5_K) */
    int32_t *isx16;   /* (n, nb, 2) sums of the x_q of columns 0-15 and 16-31 (Q6_K's -32 *
                         sum correction, one per scale of 16 columns) */
} cpu_qact;
void cpu_qact_init(cpu_qact *qa, void *scratch, int n, int64_t cols);
/* Quantizes tokens [t0, t1) of x (n, cols) into qa (every quantized dtype reads the same). */
void cpu_qact_quantize(const cpu_qact *qa, const float *x, int64_t cols, int t0, int t1);
/* Which activation layout dtype t reads: equal values share one quantization (0 for every
 * quantized dtype); -1 = none (dense weights read fp32 x). */
int cpu_qact_layout(llmi_dtype t);
/* Rows [r0, r1) of y (n, w->rows) = x (n, cols) @ W^T (+ bias) on the calling thread, the
 * same numbers cpu_matmul gives: quantized dtypes must be packed (cpu_qweight_pack) and
 * read qa (x quantized for w's layout), dense dtypes read x.  Not for LLMI_I4G
 * (cpu_matmul_rows_ok). */
void cpu_matmul_rows(const llmi_tensor *w, const float *x, const cpu_qact *qa, int n, int64_t r0, int64_t r1,
                     const float *bias, float *y);
int cpu_matmul_rows_ok(llmi_dtype t);

/* Mixture-of-experts routing of n tokens from their router logits (n, n_experts): a softmax
 * over all experts (fp32 values, fp64 sum), the k most probable (a tie goes to the lower
 * expert), their probabilities divided by their sum when norm.  experts (n, k) in ascending
 * expert order per token, weights (n, k) in the same order. */
void cpu_moe_route(const float *logits, int n, int n_experts, int k, bool norm, int32_t *experts, float *weights);
/* out (m, width) row i = x row rows[i] (rows (m)): the routed tokens' rows in expert order. */
void cpu_gather_rows(const float *x, int64_t width, const int32_t *rows, int m, float *out);
/* Columns [j0, j1) of out (n, dim): for each token t the sum over j < k, in j order from
 * zero, of weights[t*k + j] * y row row[t*k + j] (y (*, dim): the experts' outputs, a row
 * per grouped choice; row as backend_moe_group's), each product and sum rounded on its own.
 * With the choices in ascending expert order a token's sum does not depend on the batch. */
void cpu_moe_combine(const float *y, const int32_t *row, const float *weights, int n, int k, int dim, int64_t j0,
                     int64_t j1, float *out);

/* Rotates q (n, n_heads, head_dim) in place and k (n, n_kv_heads, head_dim) in place by
 * positions (n), HF rotate-half convention over each head's first rope_dim values (the rest
 * pass through; rope_dim even, <= head_dim, 0 for none), cos and sin times mscale, then writes k and v (n, n_kv_heads, head_dim)
 * into the caches at slot_mapping (n), each head in kv_dtype (fp8 divided by its head's
 * k_scale / v_scale (n_kv_heads), NULL = 1). */
void cpu_rope_kv_write(float *q, float *k, const float *v, const int32_t *positions, const int32_t *slot_mapping,
                       int n, int n_heads, int n_kv_heads, int head_dim, int rope_dim, const float *inv_freq,
                       float mscale, void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                       const float *v_scale);

/* The same with each token's cos/sin rows precomputed: cs, sn (n, head_dim/2). */
void cpu_rope_kv_write_table(float *q, float *k, const float *v, const float *cs, const float *sn,
                             const int32_t *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                             int rope_dim, void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                             const float *v_scale);
/* cs, sn (n, head_dim/2) = cos, sin of positions (n) times inv_freq (head_dim/2), in fp32,
 * each times mscale (config_rope_mscale): the first rope_dim/2 of each row, all a rotation
 * reads (a partial RoPE's rest is not computed). */
void cpu_rope_table(const int32_t *positions, int n, int head_dim, int rope_dim, const float *inv_freq, float mscale,
                    float *cs, float *sn);
/* Rotates heads [h0, h1) of one token's row x (heads, head_dim) by its cos/sin row: each
 * head's first rope_dim values. */
void cpu_rope_heads(float *x, const float *cs, const float *sn, int h0, int h1, int head_dim, int rope_dim);
/* Rotates kv heads [h0, h1) of one token's k row (n_kv_heads, head_dim) in place and writes
 * them and the same heads of its v row into the caches at slot (as cpu_rope_kv_write). */
void cpu_rope_kv_write_heads(float *k, const float *v, const float *cs, const float *sn, int32_t slot, int h0, int h1,
                             int n_kv_heads, int head_dim, int rope_dim, void *k_cache, void *v_cache,
                             llmi_kv_dtype kv_dtype, const float *k_scale, const float *v_scale);

/* How a layer's attention scores a key: q.k times scale (config_attn_scale), then with
 * softcap > 0 softcap * tanh(score / softcap) (Gemma 2); with window > 0 a query at p sees
 * the keys [p - window + 1, p] only (config_layer_window). */
typedef struct cpu_attn_scores {
    float scale;
    float softcap;
    int window;
} cpu_attn_scores;

/* out (n_tokens, n_heads * head_dim) = causal attention of each token's q over its
 * sequence's cached K/V positions [0, positions[i]] through the batch's block tables (with
 * a window only the last window of them), scored as sc says, the cache dequantized to fp32
 * first (fp8 times k_scale / v_scale (n_kv_heads), NULL = 1).  GQA: head h reads kv head
 * h / (n_heads / n_kv_heads). */
void cpu_paged_attention(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                         const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                         int n_kv_heads, int head_dim, int block_size, cpu_attn_scores sc, float *out);

/* The same for the (token, head) units [u0, u1) only (unit u = token u / n_heads, head
 * u % n_heads) on the calling thread: a share of one step's attention. */
void cpu_paged_attention_part(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                              const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                              int n_kv_heads, int head_dim, int block_size, cpu_attn_scores sc, int u0, int u1,
                              float *out);

/* out (n, d) = silu(gate) * up;  gate, up (n, d). */
void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out);
/* Elements [i0, i1) of the same on the calling thread. */
void cpu_swiglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out);
/* out (n, d) = gelu_tanh(gate) * up (Gemma's GeGLU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))));
 * and elements [i0, i1) of it on the calling thread. */
void cpu_geglu(const float *gate, const float *up, int n, int d, float *out);
void cpu_geglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out);
/* The model's gated activation (cfg.act) of elements [i0, i1). */
void cpu_glu_range(llmi_act act, const float *gate, const float *up, size_t i0, size_t i1, float *out);
/* x (n) *= s, in place (Gemma's and Granite's embedding scale, Granite's residual scale; the
 * twin of kernels' llmi_cuda_scale). */
void cpu_scale(float *x, size_t n, float s);
/* y (n, cols) += bias (cols) on every row: a linear's bias, a layer's control vector (the
 * twin of kernels' llmi_cuda_add_bias). */
void cpu_add_bias(float *y, int n, int cols, const float *bias);
/* Columns [c0, c1) of the final logits y (n, stride) divided by divisor (Granite's
 * logits_scaling; 1: none), then capped to cap * tanh(y / cap) (Gemma 2's final soft cap;
 * cap 0: none); the twin of kernels' llmi_cuda_logits_finish. */
void cpu_logits_finish(float *y, int n, int stride, int c0, int c1, float divisor, float cap);

/* Layer l's attention scoring. */
static inline cpu_attn_scores cpu_layer_scores(const llmi_config *c, int l) {
    return (cpu_attn_scores){.scale = config_attn_scale(c), .softcap = c->attn_softcap,
                             .window = config_layer_window(c, l)};
}

#endif
