/* quant.h — owns the offline int4 algorithms that `llmi quantize` runs: round to
 * nearest (RTN) and GPTQ, producing the grids of core/int4.h (AWQ's searches are in
 * awq.h; the driver over a whole model in quantize.h). */
#ifndef LLMI_QUANT_H
#define LLMI_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/int4.h"
#include "core/status.h"

typedef enum { QUANT_RTN = 0, QUANT_GPTQ, QUANT_AWQ } quant_method;

/* ---- quant_rtn.c: round-to-nearest baseline -------------------------------------- */
/* w (rows, cols) -> g (allocated here). */
int quant_rtn(const float *w, int rows, int cols, int group_size, bool sym, quant_style style, quant_grid *g,
              llmi_status *st);

/* ---- quant_gptq.c ------------------------------------------------------------------ */
typedef struct quant_gptq_opts {
    int group_size;
    bool sym;
    bool desc_act;           /* act-order: columns in descending diag(H), g_idx written */
    float damp_percent;      /* 0.01 = 1% of mean(diag H); raised x10 on Cholesky failure */
    int block_size;          /* lazy-update block, 128 */
} quant_gptq_opts;
/* w (rows, cols) weights; h (cols, cols) = (2/n) sum x x^T of the layer's inputs (modified
 * in place).  Fills g; *err = sum of the GPTQ loss (w - q)^2 / Uinv^2 for the progress line. */
int quant_gptq(const float *w, int rows, int cols, float *h, const quant_gptq_opts *o, quant_grid *g, double *err,
               llmi_status *st);

#endif
