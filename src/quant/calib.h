/* quant_calib.h — owns the fp32 reference forward the quantizers run over calibration
 * (and evaluation) windows: one decoder block at a time over (n_windows, seqlen)
 * tokens, so each stage can capture its linear layers' real inputs and be fed the
 * outputs of already-quantized stages.  Dense fp32 weights, OpenMP, no KV cache. */
#ifndef LLMI_QUANT_CALIB_H
#define LLMI_QUANT_CALIB_H

#include <stdint.h>
#include "model/model.h"
#include "core/status.h"

enum { QL_Q = 0, QL_K, QL_V, QL_O, QL_GATE, QL_UP, QL_DOWN, QL_COUNT };
extern const char *const quant_linear_names[QL_COUNT]; /* "self_attn.q_proj", ... */

/* One decoder block in fp32, the quantizers' working copy. */
typedef struct quant_block {
    float *attn_norm, *ffn_norm;   /* (dim) each */
    float *w[QL_COUNT];            /* (rows, cols) of each linear, see quant_linear_shape */
    float *bq, *bk, *bv;           /* (q rows), (kv rows), (kv rows) or NULL */
} quant_block;

void quant_linear_shape(const llmi_config *c, int which, int *rows, int *cols);
/* Dequantizes layer l of m into b (allocated here). */
int quant_block_load(const llmi_model *m, int l, quant_block *b, llmi_status *st);
void quant_block_free(quant_block *b);

/* y (n, m) = x (n, k) @ w (m, k)^T (+ bias (m)). */
void quant_sgemm_nt(const float *x, int n, int k, const float *w, int m, const float *bias, float *y);
/* h (k, k) += scale * x^T x for x (n, k). */
void quant_gram_acc(const float *x, int n, int k, float scale, float *h);
void quant_rmsnorm(const float *x, const float *w, int n, int dim, float eps, float *out);

/* Calibration activations of one block, (n = n_windows * seqlen) tokens. */
typedef struct quant_acts {
    int n_windows, seqlen, n;
    float *x_attn;   /* (n, dim) input of q/k/v (after attn_norm) */
    float *x_o;      /* (n, n_heads*head_dim) input of o_proj (attention output) */
    float *h_mid;    /* (n, dim) residual after attention */
    float *x_mlp;    /* (n, dim) input of gate/up (after ffn_norm) */
    float *gate;     /* (n, ffn) gate outputs, then silu(gate)*up: the input of down_proj */
    float *up;       /* (n, ffn) */
} quant_acts;
int quant_acts_alloc(const llmi_config *c, int n_windows, int seqlen, quant_acts *a, llmi_status *st);
void quant_acts_free(quant_acts *a);

/* Stages of the block forward on x (n, dim); each reads what the previous wrote. */
void quant_fwd_attn_in(const llmi_config *c, const quant_block *b, const float *x, quant_acts *a);
void quant_fwd_attention(const llmi_config *c, const quant_block *b, quant_acts *a);
void quant_fwd_mlp_in(const llmi_config *c, const quant_block *b, const float *x, quant_acts *a);
void quant_fwd_mlp_act(const llmi_config *c, const quant_block *b, quant_acts *a);
/* x (n, dim) += down(x_mlp-path): finishes the block in place. */
void quant_fwd_out(const llmi_config *c, const quant_block *b, float *x, quant_acts *a);
/* The whole block in place on x (n, dim). */
void quant_fwd_block(const llmi_config *c, const quant_block *b, float *x, quant_acts *a);

/* x (n, dim) = embedding rows of tokens (n). */
void quant_embed(const llmi_model *m, const int32_t *tokens, int n, float *x);

#endif
