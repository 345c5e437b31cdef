/* quant_kernels.h — owns the C-callable launchers of the offline quantizer's device kernels
 * (kernels/quant_gptq.cu), tier 2: raw device pointers, shapes, a stream; the cuBLAS and
 * cuSOLVER calls around them and the checks are tier 3, src/quant/quant_cuda.c.  CPU
 * twins: quant_abs_mean_acc and quant_gram_mirror (src/quant/linalg.c),
 * quant_gptq_prepare's matrix setup and quant_gptq_apply's in-block walk
 * (src/quant/gptq.c), awq_fake_quant (src/quant/awq.c);
 * the group parameters are quant_range_params' (src/core/int4_pack.c), bit for bit.
 * Layouts: h, u (n, n) row-major fp32; the GPTQ working weights are transposed, wt (cols,
 * rows), so the threads of a block (one per row) read consecutive addresses. */
#ifndef LLMI_KERNELS_QUANT_KERNELS_H
#define LLMI_KERNELS_QUANT_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* m (k) += scale * sum over rows of |x| for x (n, k) in dt (F32, F16 or BF16): AWQ's mean
 * input magnitude, quant_abs_mean_acc's twin. */
cudaError_t llmi_cuda_quant_abs_mean_acc(const void *x, llmi_dtype dt, int n, int k, float scale, float *m,
                                         cudaStream_t s);
/* h (k, k): the lower triangle := the upper one. */
cudaError_t llmi_cuda_quant_mirror(float *h, int k, cudaStream_t s);
/* a (n, n) fp64 = J P^T (h_scale H) P J + damp I, P the permutation perm (position ->
 * column), dead columns' diagonal 1: the matrix whose Cholesky factor gives GPTQ's H^-1.
 * h_scale * H is formed in fp32, as the host scales H before its fill. */
cudaError_t llmi_cuda_quant_hinv_fill(const float *h, float h_scale, const int32_t *perm, const uint8_t *dead, int n,
                                      double damp, double *a, cudaStream_t s);
/* u (n, n) row-major fp32 = J X J for X = L^-1 held column-major in x (cuSOLVER's layout). */
cudaError_t llmi_cuda_quant_hinv_upper(const double *x, int n, float *u, cudaStream_t s);
/* wt (cols, rows) = w (rows, cols) with columns permuted (wt[i] = w[:, perm[i]]), dead ones 0. */
cudaError_t llmi_cuda_gptq_load(const float *w, const int32_t *perm, const uint8_t *dead, int rows, int cols, float *wt,
                                cudaStream_t s);
/* The in-block column walk of GPTQ over positions [i1, i2) (at most 128) for every row:
 * group parameters when a group starts (fp16 scale, GPTQ style), q into q (rows, cols) at
 * the original column perm[i], the scaled error into et (i2 - i1, rows); the in-block
 * updates stay in the kernel (wt is read, its block columns left as they were, and the
 * caller's lazy update adds the block's errors to the later columns); s_row, z_row (rows)
 * carry each row's current group; loss += sum e^2 (fp64). */
cudaError_t llmi_cuda_gptq_block(const float *wt, const float *u, int rows, int cols, int i1, int i2, int group_size,
                                 int sym, const int32_t *perm, uint8_t *q, uint16_t *scales, uint8_t *zeros, float *et,
                                 float *s_row, int32_t *z_row, double *loss, cudaStream_t s);
/* The rows the relative output error measures, r = j * stride for j < n_sel: out (2 n_sel,
 * cols) holds D = W - dequant(q) in rows [0, n_sel) and W in rows [n_sel, 2 n_sel), from w
 * (rows, cols), q (rows, cols) at original columns, scales and zeros (groups, rows) of
 * position i's group i / gs, perm (cols) position -> column (NULL: the identity).  quantize.c's
 * qm_rel_err twin. */
cudaError_t llmi_cuda_quant_err_rows(const float *w, const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                     const int32_t *perm, int rows, int cols, int gs, int stride, int n_sel,
                                     float *out, cudaStream_t s);
/* AWQ: d (rows, cols) = w - fakequant(w * sc) / sc, RTN in AWQ style per group of gs. */
cudaError_t llmi_cuda_awq_fake_quant_err(const float *w, const float *sc, int rows, int cols, int gs, float *d,
                                         cudaStream_t s);
/* AWQ's clipping search, quant_awq_clip_search's twin: best_mv (rows, cols / gs) = for each
 * (row, group) of w (rows, cols) the max_val amax (1 - i/20), i < n_shrink, whose clipped
 * AWQ-style RTN error d minimises d^T H_g d, H_g = hb[g] (cols / gs, gs, gs), symmetric: H's diagonal
 * blocks, all the search reads; the first of equal losses (sums in fp64, in another order
 * than the CPU's).  gs <= LLMI_AWQ_CLIP_MAX_GS; llmi_cuda_awq_clip_init(gs) once first. */
#define LLMI_AWQ_CLIP_MAX_GS 128
cudaError_t llmi_cuda_awq_clip_search(const float *w, int rows, int cols, const float *hb, int gs, int n_shrink,
                                      float *best_mv, cudaStream_t s);
cudaError_t llmi_cuda_awq_clip_init(int gs);
/* out (one fp64, device) = sum a[i] * b[i] over n. */
cudaError_t llmi_cuda_quant_dot(const float *a, const float *b, size_t n, double *out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
