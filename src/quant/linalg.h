/* linalg.h — owns the dense linear algebra the offline quantizer runs on the CPU: the
 * Gram matrix X^T X of calibration activations (upper triangle, accumulated in place),
 * y = x W^T, the blocked update C -= A B in fp32 and fp64, and the blocked Cholesky
 * factorisation and lower-triangular inverse GPTQ needs.  Everything works in place or
 * in scratch bounded by a panel, never a second (k, k) matrix: an 8B model's down_proj
 * Hessian is 14336 x 14336 (0.8 GiB in fp32). */
#ifndef LLMI_QUANT_LINALG_H
#define LLMI_QUANT_LINALG_H

#include <stdbool.h>

/* h (k, k): upper triangle (j >= i) += scale * x^T x for x (n, k); the lower triangle
 * holds scratch until quant_gram_mirror copies the upper one onto it.  Returns -1 when
 * its (256, k) packing buffer cannot be allocated. */
int quant_gram_acc(const float *x, int n, int k, float scale, float *h);
void quant_gram_mirror(float *h, int k);
/* m (k) += scale * sum over rows of |x| for x (n, k): AWQ's mean input magnitude, in the
 * pass that accumulates the Gram matrix (each column summed in fp32, then scaled). */
void quant_abs_mean_acc(const float *x, int n, int k, float scale, float *m);

/* C (m, n; ldc) -= A (m, kk; lda) @ B, B (kk, n; ldb) row-major, or B^T stored (n, kk)
 * when b_trans.  b_lower: B's entry (p, j) is zero for p < j (a lower-triangular B),
 * and those blocks are skipped.  Returns -1 when its panel scratch cannot be allocated. */
int quant_gemm_sub_f(int m, int n, int kk, const float *a, int lda, const float *b, int ldb, bool b_trans,
                     bool b_lower, float *c, int ldc);
int quant_gemm_sub_d(int m, int n, int kk, const double *a, int lda, const double *b, int ldb, bool b_trans,
                     bool b_lower, double *c, int ldc);

/* In place: a (n, n) SPD -> its lower Cholesky factor L (a = L L^T; upper triangle
 * zeroed).  Returns 0, 1 when a is not positive definite, -1 when out of memory. */
int quant_cholesky_d(double *a, int n);
/* In place: l (n, n) lower triangular with a nonzero diagonal -> l^-1. */
int quant_trinv_lower_d(double *l, int n);

#endif
