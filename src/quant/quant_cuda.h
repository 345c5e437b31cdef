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
#include "core/dtype.h"
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

/* bytes of device memory on q's GPU into *p (what: named in the error), and back. */
int quant_cuda_alloc(quant_cuda *q, size_t bytes, const char *what, void **p, llmi_status *st);
void quant_cuda_free(quant_cuda *q, void *p);
/* The memory free on q's GPU now (cudaMemGetInfo). */
int quant_cuda_mem_free(quant_cuda *q, size_t *free_bytes, llmi_status *st);

/* Gram matrix slot (< QUANT_CUDA_SLOTS) of width k, with its inputs' mean magnitude:
 * zeroed by begin; acc_device adds scale * x^T x and scale * the column sums of |x| for x
 * (n, k) in dt in the memory of q's GPU (a calibration tap of the CUDA backend) and
 * returns with x free again: fp32 through a pedantic syrk, bf16/f16 through a tensor-core
 * GEMM (products of 16-bit values are exact in fp32, its fp32 sums round a few ulps
 * differently from a syrk's).  end makes the matrix whole (both triangles) and copies it
 * into host h (k, k) and the magnitudes into host xmean (k), each when not NULL: with h
 * NULL the matrix stays on the device only, for quant_cuda_gptq_prepare, until the slot's
 * next begin. */
int quant_cuda_gram_begin(quant_cuda *q, int slot, int k, llmi_status *st);
int quant_cuda_gram_acc_device(quant_cuda *q, int slot, const void *x, llmi_dtype dt, int n, float scale,
                               llmi_status *st);
int quant_cuda_gram_end(quant_cuda *q, int slot, float *h, float *xmean, llmi_status *st);
/* quant_gptq_prepare on the device of H = h_scale * (host h (cols, cols), uploaded; or,
 * when h is NULL, Gram slot `slot` as gram_end left it): hv gets perm and dead on the host;
 * U and H stay on the device (hv->u is NULL) for the quant_cuda_gptq_apply calls that
 * follow.  (GPTQ's H is 2 X^T X / n: h_scale 2 on a Gram matrix; the host path scales in
 * place, bit for bit the same.) */
int quant_cuda_gptq_prepare(quant_cuda *q, const float *h, int slot, float h_scale, int cols, const quant_gptq_opts *o,
                            quant_gptq_hinv *hv, llmi_status *st);
/* quant_gptq_apply on the device, and *rel_err = the relative output error
 * |X(W-Q)^T|^2 / |XW^T|^2 = tr(D H D^T) / tr(W H W^T) (D = W - Q) through the prepare's H,
 * over the rows quant_err_stride picks: quantize.c's measure on the host, here beside the
 * weights. */
int quant_cuda_gptq_apply(quant_cuda *q, const float *w, int rows, const quant_gptq_hinv *hv,
                          const quant_gptq_opts *o, quant_grid *g, double *err, double *rel_err, llmi_status *st);
/* *rel_err of a finished linear, as quant_cuda_gptq_apply measures it, from host arrays:
 * w (rows, cols) its fp32 weights, g its grid (no g_idx: columns in order), h (cols, cols)
 * the H it is measured through.  For AWQ and RTN, whose grids are made on the host: the
 * measure's GEMM (2 n_sel x cols x cols) was the largest CPU step of a GPU run. */
int quant_cuda_rel_err(quant_cuda *q, const float *w, const quant_grid *g, const float *h, double *rel_err,
                       llmi_status *st);
/* quant_awq_clip on the device: the search there (on H's diagonal blocks, all it reads),
 * the clip of w (rows, cols, host) in place here.  Group sizes above
 * LLMI_AWQ_CLIP_MAX_GS (128) search on the CPU (their H block outgrows shared memory). */
int quant_cuda_awq_clip(quant_cuda *q, float *w, int rows, int cols, const float *h, int group_size, int n_shrink,
                        llmi_status *st);
/* Where the calls above spent their wall time (each waits for its GPU work), so that a
 * slow layer on a device says which part: the Gram accumulation (the calibration taps),
 * gram_end's copies, the prepare's factorisation (diagonal, fill, Cholesky, inverse),
 * apply's weight upload, column walk, error measure and result download, AWQ's clipping
 * search (with its copies). */
typedef enum {
    QCT_GRAM, QCT_GRAM_END, QCT_FACTOR, QCT_UPLOAD, QCT_WALK, QCT_ERROR, QCT_DOWNLOAD, QCT_CLIP, QCT_COUNT
} quant_cuda_stage;
extern const char *const quant_cuda_stage_names[QCT_COUNT];
/* t[i] += the seconds of stage i since the last call; the counters restart at 0. */
void quant_cuda_take_times(quant_cuda *q, double t[QCT_COUNT]);
/* quant_awq_search_scale on the device (same arguments, host arrays). */
int quant_cuda_awq_search_scale(quant_cuda *q, float *const *ws, const int *rows, int n_lin, int cols,
                                const float *x_mean, const float *h, int group_size, int n_grid, float *best_s,
                                double *best_loss, llmi_status *st);

#endif
