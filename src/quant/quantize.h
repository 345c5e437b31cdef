/* quantize.h — owns quantizing a whole model (RTN, GPTQ or AWQ over the decoder layers
 * in order) into a quant_result, with calibration statistics from the engine's forward
 * (calib.h) or from a saved statistics file, and the served view of a result. */
#ifndef LLMI_QUANTIZE_H
#define LLMI_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "quant/quant.h"
#include "quant/calib.h"
#include "quant/calib_stats.h"

typedef struct quant_opts {
    quant_method method;
    int bits;                  /* 4 */
    int group_size;            /* 128 */
    bool sym;                  /* GPTQ only; AWQ is always asymmetric */
    bool desc_act;             /* GPTQ act-order */
    float damp_percent;        /* GPTQ 0.01 */
    int awq_grid;              /* AWQ alpha grid points, 20 */
    bool awq_clip;             /* AWQ clipping search */
    FILE *progress;            /* per-layer lines (stderr), or NULL */
} quant_opts;

typedef struct quant_result {
    int n_layers;
    quant_grid (*grids)[QL_COUNT];  /* (n_layers, QL_COUNT) */
    float **attn_norm;              /* (n_layers) x (dim): AWQ folds scales into these */
    float **ffn_norm;               /* (n_layers) x (dim) */
    float **bias[3];                /* q, k, v biases (n_layers) x (rows) or NULL entries */
    double seconds;
} quant_result;

/* tokens (n_windows * seqlen) calibration windows; RTN ignores them (may be NULL). */
int quant_model_run(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                    quant_result *r, llmi_status *st);
/* Same with statistics: from `in` instead of a calibration forward (tokens unused), and/or
 * recorded into `out` (initialised by quant_stats_init). */
int quant_model_run_stats(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                          const quant_stats *in, quant_stats *out, quant_result *r, llmi_status *st);
void quant_result_free(quant_result *r);

/* v = m served with r's int4 linears, norms and biases (quant_view_free releases it). */
int quant_result_view(const llmi_model *m, const quant_result *r, quant_view *v, llmi_status *st);

#endif
