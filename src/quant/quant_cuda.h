/* quant_cuda.h — owns the GPU path of `llmi quantize --device cuda`: a device context
 * (stream, cuBLAS and cuSOLVER handles, buffers) and device versions of the quantizer's
 * heavy steps with the host-side contracts of their CPU twins: the Gram matrices X^T X
 * of calibration activations (cuBLAS syrk), GPTQ's H^-1 (cuSOLVER Cholesky and triangular
 * inverse in fp64) and column walk (kernels/quant_gptq.cu + cuBLAS for the lazy update),
 * and AWQ's scale search (fake quantization on the device, d H through cuBLAS).  The
 * calibration forward runs on the CUDA backend of the same GPU (quant/calib.c).  Built
 * without CUDA, quant_cuda_create says so and nothing else is reachable. */
#ifndef LLMI_QUANT_CUDA_H
#define LLMI_QUANT_CUDA_H

#include <stdbool.h>
#include "core/int4.h"
#include "core/status.h"
#include "quant/quant.h"

#define QUANT_CUDA_SLOTS 4          /* Gram matrices accumulated at once (one per tap) */

typedef struct quant_cuda quant_cuda;

/* Fails with a clear message when llmi was built without CUDA or GPU gpu is unusable. */
int quant_cuda_create(quant_cuda **q, int gpu, llmi_status *st);
void quant_cuda_destroy(quant_cuda *q);
const char *quant_cuda_device_name(const quant_cuda *q);
/* The CUDA device index of q (the calibration forward's backend runs there). */
int quant_cuda_gpu(const quant_cuda *q);

/* Gram matrix slot (< QUANT_CUDA_SLOTS) of width k: zeroed by begin, += scale * x^T x for
 * host x (n, k) by acc, copied whole (both triangles) into host h (k, k) by end. */
int quant_cuda_gram_begin(quant_cuda *q, int slot, int k, llmi_status *st);
int quant_cuda_gram_acc(quant_cuda *q, int slot, const float *x, int n, float scale, llmi_status *st);
int quant_cuda_gram_end(quant_cuda *q, int slot, float *h, llmi_status *st);

/* quant_gptq_prepare on the device: hv gets perm and dead on the host; U stays on the
 * device (hv->u is NULL) for the quant_cuda_gptq_apply calls that follow. */
int quant_cuda_gptq_prepare(quant_cuda *q, const float *h, int cols, const quant_gptq_opts *o, quant_gptq_hinv *hv,
                            llmi_status *st);
int quant_cuda_gptq_apply(quant_cuda *q, const float *w, int rows, const quant_gptq_hinv *hv,
                          const quant_gptq_opts *o, quant_grid *g, double *err, llmi_status *st);

/* quant_awq_search_scale on the device (same arguments, host arrays). */
int quant_cuda_awq_search_scale(quant_cuda *q, float *const *ws, const int *rows, int n_lin, int cols,
                                const float *x_mean, const float *h, int group_size, int n_grid, float *best_s,
                                double *best_loss, llmi_status *st);

#endif
