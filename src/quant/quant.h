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

/* ---- rtn.c: round-to-nearest baseline -------------------------------------- */
/* w (rows, cols) -> g (allocated here). */
int quant_rtn(const float *w, int rows, int cols, int group_size, bool sym, quant_style style, quant_grid *g,
              llmi_status *st);

/* ---- gptq.c ------------------------------------------------------------------ */
typedef struct quant_gptq_opts {
    int group_size;
    bool sym;
    bool desc_act;           /* act-order: columns in descending diag(H), g_idx written */
    float damp_percent;      /* 0.01 = 1% of mean(diag H); raised x10 on Cholesky failure */
    int block_size;          /* lazy-update block, 128 */
} quant_gptq_opts;
/* H^-1 of one input set, shared by the linears that read it (q/k/v, gate/up). */
typedef struct quant_gptq_hinv {
    int cols;
    int *perm;               /* (cols) processing position -> input column */
    bool *dead;              /* (cols) inputs that never fire: their weights are dropped */
    float *u;                /* (cols, cols) upper Cholesky factor of (P^T H P + damp)^-1 */
    float damp;              /* the dampening that made H positive definite (x mean diag) */
} quant_gptq_hinv;
/* The column order (act-order or identity), dead inputs and mean of diag H (dead ones
 * counted as 1) from H's diagonal h_diag (cols): allocates hv->perm and hv->dead. */
int quant_gptq_order(const float *h_diag, int cols, const quant_gptq_opts *o, quant_gptq_hinv *hv, double *mean_diag,
                     llmi_status *st);
/* h (cols, cols) = (2/n) sum x x^T of the layer's inputs (not modified).  Peak memory:
 * one fp64 (cols, cols) buffer, which ends as hv->u in fp32. */
int quant_gptq_prepare(const float *h, int cols, const quant_gptq_opts *o, quant_gptq_hinv *hv, llmi_status *st);
void quant_gptq_hinv_free(quant_gptq_hinv *hv);
/* w (rows, hv->cols) -> g (allocated here); *err = sum of the GPTQ loss (w - q)^2 / U_ii^2 / 2. */
int quant_gptq_apply(const float *w, int rows, const quant_gptq_hinv *hv, const quant_gptq_opts *o, quant_grid *g,
                     double *err, llmi_status *st);
/* Both steps for one linear. */
int quant_gptq(const float *w, int rows, int cols, const float *h, const quant_gptq_opts *o, quant_grid *g,
               double *err, llmi_status *st);

#endif
