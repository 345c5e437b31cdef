/* calib.h — owns how `llmi quantize` sees activations: calibration windows run through
 * the engine's own forward (backend->forward_layers of the CPU backend, or of the CUDA
 * backend with --device cuda, where hidden states and taps stay on the GPU), one decoder
 * layer at a time, and the statistics of every linear's input are read at the backend's
 * activation taps (backend.h), as llama.cpp's eval callback does.  So GPTQ and AWQ
 * calibrate on exactly what inference computes: the same RoPE (scaling included), norms,
 * attention and matmul kernels, with the layers quantized so far served from their int4
 * grids.
 *
 * quant_view is the model as it will be served after quantization: a shallow copy of
 * the source model whose linears, norms and biases can be replaced one by one.  The
 * calibration forward runs on a view; so does the perplexity check of a result. */
#ifndef LLMI_QUANT_CALIB_H
#define LLMI_QUANT_CALIB_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"
#include "core/int4.h"
#include "model/model.h"
#include "quant/block.h"

typedef struct quant_view {
    llmi_model model;              /* the served model: shares the source's tensors except below */
    llmi_tensor (*int4)[QL_COUNT]; /* (n_layers, QL_COUNT) I4G tensors swapped in (owned), dtype 0 = none */
    float **norms;                 /* (n_layers, 2) attn/ffn norm copies swapped in (owned) or NULL */
    float **biases;                /* (n_layers, 3) q/k/v bias copies swapped in (owned) or NULL */
} quant_view;

int quant_view_init(quant_view *v, const llmi_model *src, llmi_status *st);
void quant_view_free(quant_view *v);
/* Serves linear `which` (QL_*) of layer l from grid g (copied) from now on. */
int quant_view_set_linear(quant_view *v, int l, int which, const quant_grid *g, llmi_status *st);
/* Frees layer l's int4 copies and serves the source's linears again: calibration is past
 * it, so a run keeps one layer's int4 weights, not the model's. */
void quant_view_release_layer(quant_view *v, int l, const llmi_model *src);
/* Serves layer l's norms (dim each) and q/k/v biases (NULL: keep) from copies of these. */
int quant_view_set_norms(quant_view *v, int l, const float *attn_norm, const float *ffn_norm, llmi_status *st);
int quant_view_set_biases(quant_view *v, int l, const float *const bias[3], llmi_status *st);

/* Statistics of the inputs of one group of linears (one tap), averaged over all
 * calibration tokens. */
typedef struct quant_tap_stats {
    int cols;
    float *gram;                   /* (cols, cols) X^T X / n */
    float *xmean;                  /* (cols) mean |x| */
} quant_tap_stats;

typedef struct quant_calib {
    quant_view *view;
    llmi_model window;             /* one-layer window onto view->model: layers points at the layer
                                      being run, so the backend's KV cache holds one layer, not all */
    llmi_backend *backend;         /* over window: the CPU backend, or the CUDA backend of the GPU
                                      that quantizes (--device cuda) */
    llmi_tap_fn user_tap;          /* quant_calib_run's tap, told the real layer index */
    llmi_tap_device_fn user_tap_device; /* the same on the device (Gram matrices on the GPU) */
    void *user_ctx;
    const int32_t *tokens;         /* (n_windows * seqlen) borrowed */
    int n_windows, seqlen, windows_per_batch;
    llmi_dtype hidden_dtype;       /* LLMI_F32, LLMI_BF16 or LLMI_F16: how hidden is stored */
    void *hidden;                  /* (n_windows * seqlen, dim) input of the next layer, in hidden_dtype:
                                      host memory, or the GPU's with cuda */
    float *stage;                  /* (windows_per_batch * seqlen, dim) host: one batch in fp32, or NULL
                                      when hidden is fp32 or on the GPU and the forward runs on it in place */
    int next_layer;                /* the layer hidden feeds */
    int batch_window;              /* first window of the forward running now (for taps) */
    int32_t *pos, *slot, *seq_of;  /* (windows_per_batch * seqlen) */
    int32_t *query_start;          /* (windows_per_batch + 1) */
    int32_t *tables;               /* (windows_per_batch, blocks_per_window) */
    int blocks_per_window;
    struct quant_cuda *cuda;       /* when set, the forward, hidden and the Gram matrices are on this GPU */
    bool grams_stay_on_gpu;        /* with cuda: quant_calib_layer leaves each Gram matrix in its tap's
                                      slot of cuda (stats[t].gram and .xmean NULL, .cols set) */
    const volatile sig_atomic_t *cancel; /* when set and non-zero, the run stops between batches */
} quant_calib;

/* Embeds the windows (n_windows, seqlen) of tokens and gets ready to run layer 0, on the
 * CPU backend, or with cuda on the CUDA backend of its GPU, where the Gram matrices then
 * accumulate too.  The hidden states between layers are kept in hidden_dtype: fp32
 * (exactly what inference computes), bf16 or fp16 (half the memory; every layer's input
 * rounded once), on the host, or in the GPU's memory with cuda. */
int quant_calib_init(quant_calib *c, quant_view *v, const int32_t *tokens, int n_windows, int seqlen,
                     llmi_dtype hidden_dtype, struct quant_cuda *cuda, llmi_status *st);
/* Host bytes quant_calib_init allocates for these shapes (hidden states, staging, the CPU
 * backend's workspaces and KV cache; on_gpu: the batch's index arrays only): the memory
 * estimate's calibration term. */
size_t quant_calib_bytes(const llmi_config *c, int n_windows, int seqlen, llmi_dtype hidden_dtype, bool on_gpu);
/* GPU bytes of the same with cuda: the hidden states, and the CUDA backend's embeddings,
 * one layer's bf16 weights, activations and KV for one batch (an estimate). */
size_t quant_calib_device_bytes(const llmi_config *c, int n_windows, int seqlen, llmi_dtype hidden_dtype);
void quant_calib_free(quant_calib *c);
/* Runs layer c->next_layer over every window, as the view serves it now, with tap
 * installed as the backend's tap (it may stop the layer early; c->batch_window tells
 * which windows the current forward holds) at every tap but those in skip (bits
 * 1 << llmi_tap: each tap handed over costs the cuda backend a copy to the host).
 * advance: the layer must run to its end, and hidden moves to its output (next_layer + 1);
 * otherwise the tap must stop it (a layer run to its end writes its output in place). */
int quant_calib_run(quant_calib *c, llmi_tap_fn tap, void *tap_ctx, unsigned skip, bool advance, llmi_status *st);
/* Runs layer c->next_layer over every window, as the view serves it now, filling
 * stats[t] (allocated here; on the GPU only with c->grams_stay_on_gpu) for each tap t
 * whose bit is set in want.  advance: run the
 * whole layer and move hidden to its output (next_layer + 1); otherwise stop after the
 * last wanted tap, so the layer can be run again once more of it is quantized. */
int quant_calib_layer(quant_calib *c, unsigned want, bool advance, quant_tap_stats stats[LLMI_TAP_COUNT],
                      llmi_status *st);
void quant_tap_stats_free(quant_tap_stats *s);

#endif
