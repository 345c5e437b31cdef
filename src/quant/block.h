/* block.h — owns quant_block, the fp32 working copy of one decoder layer's linears,
 * norms and biases that the quantization algorithms edit (AWQ folds scales into the
 * norms; GPTQ reads the weights column by column), the QL_* names of the seven
 * linears, and the small dense linear algebra the algorithms share.  Activations never
 * pass through here: they come from the engine's forward (calib.h). */
#ifndef LLMI_QUANT_BLOCK_H
#define LLMI_QUANT_BLOCK_H

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

#endif
