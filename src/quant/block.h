/* block.h — owns quant_block, the fp32 working copy of one decoder layer's linears,
 * norms and biases that the quantization algorithms edit (AWQ folds scales into the
 * norms; GPTQ reads the weights column by column) and the QL_* names of the seven
 * linears.  Linears are dequantized one at a time when a step needs them and dropped
 * when it is done, so a layer never holds more fp32 weights than its widest step.
 * Activations never pass through here: they come from the engine's forward (calib.h). */
#ifndef LLMI_QUANT_BLOCK_H
#define LLMI_QUANT_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "model/model.h"
#include "core/status.h"

enum { QL_Q = 0, QL_K, QL_V, QL_O, QL_GATE, QL_UP, QL_DOWN, QL_COUNT };
extern const char *const quant_linear_names[QL_COUNT]; /* "self_attn.q_proj", ... */

/* One decoder block in fp32, the quantizers' working copy. */
typedef struct quant_block {
    float *attn_norm, *ffn_norm;   /* (dim) each */
    float *w[QL_COUNT];            /* (rows, cols) of each linear (quant_linear_shape), or NULL when not loaded */
    float *bq, *bk, *bv;           /* (q rows), (kv rows), (kv rows) or NULL */
} quant_block;

void quant_linear_shape(const llmi_config *c, int which, int *rows, int *cols);
/* Copies layer l's norms and biases of m into b (allocated here); linears [first, last)
 * are dequantized too (quant_block_load_linears adds more later). */
int quant_block_load(const llmi_model *m, int l, int first, int last, quant_block *b, llmi_status *st);
int quant_block_load_linears(const llmi_model *m, int l, int first, int last, quant_block *b, llmi_status *st);
void quant_block_drop_linear(quant_block *b, int which);
void quant_block_free(quant_block *b);

/* Drops layer l's linears from this process once quantized, where they are a mapped file's
 * (model_release_pages): a run holds one layer of a mapped model at a time, not all of it. */
void quant_source_release_layer(const llmi_model *m, int l);

#endif
