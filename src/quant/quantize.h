/* quantize.h — owns quantizing a whole model (RTN, GPTQ or AWQ over the decoder layers
 * in order), layer by layer in bounded memory: each finished layer is handed to a sink
 * (the streaming checkpoint writer, or a quant_result that collects every layer), with
 * calibration statistics from the engine's forward (calib.h) or from a saved statistics
 * file; the memory a run needs, worked out before it starts; and the served view of a
 * result. */
#ifndef LLMI_QUANTIZE_H
#define LLMI_QUANTIZE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include "quant/quant.h"
#include "quant/calib.h"
#include "quant/calib_stats.h"
#include "quant/quant_cuda.h"

typedef struct quant_opts {
    quant_method method;
    int bits;                  /* 4 */
    int group_size;            /* 128 */
    bool sym;                  /* GPTQ only; AWQ is always asymmetric */
    bool desc_act;             /* GPTQ act-order */
    float damp_percent;        /* GPTQ 0.01 */
    int awq_grid;              /* AWQ alpha grid points, 20 */
    bool awq_clip;             /* AWQ clipping search */
    llmi_dtype hidden_dtype;   /* calibration hidden states between layers: LLMI_BF16 (default), F16, F32 */
    struct quant_progress *progress; /* told of every step, or NULL */
    struct quant_cuda *cuda;   /* --device cuda: Gram matrices, GPTQ and AWQ's search on this GPU; NULL: CPU */
    const volatile sig_atomic_t *cancel; /* set by a signal handler (Ctrl-C, SIGTERM): the run stops
                                  with LLMI_E_INTERRUPT at the next linear or calibration batch */
} quant_opts;

/* Where a layer's wall time went, in seconds, by stage (the rest, between stages, is
 * total minus their sum): so that a slow run on a device says which stage to look at. */
typedef enum {
    QT_CALIBRATE,   /* calibration forwards through the served model, Gram matrices */
    QT_LOAD,        /* the layer's linears from the source file as fp32 */
    QT_SOLVE,       /* GPTQ's damped Cholesky and inverse of H, once per input set */
    QT_QUANTIZE,    /* the GPTQ column walk, AWQ's searches, RTN */
    QT_ERROR,       /* each linear's relative output error */
    QT_SERVE,       /* the quantized linear handed to the served model */
    QT_WRITE,       /* packing and writing the layer */
    QT_COUNT
} quant_stage;
typedef struct quant_layer_times {
    double total;
    double stage[QT_COUNT];
    double gpu[QCT_COUNT];     /* --device cuda: the device calls' share of the stages */
} quant_layer_times;

/* The relative output error of a (rows, cols) linear is measured over rows 0, s, 2s, ...:
 * every row when that costs at most 2^34 multiply-adds (2 rows cols^2), else the stride s
 * that keeps it there (an estimate; an 8B down_proj would cost 1.7e12). */
int quant_err_stride(int rows, int cols);
/* Monotonic seconds: the clock of quant_layer_times (and of quant_cuda's stage times). */
double quant_now(void);

/* Progress: after each step of a layer (step < n_steps), and when the layer is done
 * (step == n_steps, with each linear's relative output error |X(W-Q)^T|^2 / |XW^T|^2 and
 * the layer's times; errs and times are NULL before). */
typedef struct quant_progress {
    void (*fn)(struct quant_progress *p, int layer, int n_layers, int step, int n_steps, const char *what,
               const double *errs, const quant_layer_times *times);
    void *ctx;
} quant_progress;

/* Checks, before any work, that every linear of c can be quantized with o (the group
 * size divides every input dim, int4 packing fits the outputs). */
int quant_check_shapes(const llmi_config *c, const quant_opts *o, llmi_status *st);

/* Bytes a run needs at its peak, by part (quant_memory_estimate).  The formula is in
 * docs/QUANT.md ("Memory"). */
typedef struct quant_mem {
    size_t source;             /* source weights resident: the whole model when it lives in memory
                                  (--dummy), else one layer of the mapped file at a time */
    size_t calib;              /* hidden states (n_windows * seqlen * dim), fp32 batch stage, CPU backend
                                  workspaces and KV of one batch of windows (with o->cuda all in
                                  the GPU's memory: the batch's index arrays only) */
    size_t layer;              /* one layer's int4 grids and their served copies */
    size_t step;               /* the largest step: Hessian + its factorisation + fp32 weights + walk */
    size_t writer;             /* streaming writer buffers */
    size_t stats;              /* --save-stats: every layer's Gram matrices, kept until the end */
    size_t total;
    size_t device;             /* with o->cuda, the GPU's (an estimate): the calibration's (hidden
                                  states, the forward's one layer, activations and KV), the four
                                  Gram matrices and the largest GPTQ/AWQ step, plus slack */
} quant_mem;
void quant_memory_estimate(const llmi_model *m, const quant_opts *o, int n_windows, int seqlen, bool calib,
                           bool save_stats, quant_mem *e);

/* A finished layer: its seven grids (QL_*) and the block holding its (possibly AWQ-scaled)
 * norms and biases.  The sink may take any of them over (zeroing what it took). */
typedef int (*quant_layer_sink)(void *ctx, int layer, quant_grid grids[QL_COUNT], quant_block *b, llmi_status *st);

/* Quantizes m layer by layer; tokens (n_windows * seqlen) calibration windows (RTN
 * ignores them; NULL with in).  in: statistics instead of a calibration forward; out
 * (initialised by quant_stats_init): the statistics the run saw. */
int quant_model_stream(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                       const quant_stats *in, quant_stats *out, quant_layer_sink sink, void *sink_ctx,
                       llmi_status *st);

/* Every layer kept in memory: for tests and small models (the CLI streams instead). */
typedef struct quant_result {
    int n_layers;
    quant_grid (*grids)[QL_COUNT];  /* (n_layers, QL_COUNT) */
    float **attn_norm;              /* (n_layers) x (dim): AWQ folds scales into these */
    float **ffn_norm;               /* (n_layers) x (dim) */
    float **bias[3];                /* q, k, v biases (n_layers) x (rows) or NULL entries */
    double seconds;
} quant_result;

int quant_model_run(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                    quant_result *r, llmi_status *st);
int quant_model_run_stats(const llmi_model *m, const quant_opts *o, const int32_t *tokens, int n_windows, int seqlen,
                          const quant_stats *in, quant_stats *out, quant_result *r, llmi_status *st);
void quant_result_free(quant_result *r);

/* v = m served with r's int4 linears, norms and biases (quant_view_free releases it). */
int quant_result_view(const llmi_model *m, const quant_result *r, quant_view *v, llmi_status *st);

#endif
