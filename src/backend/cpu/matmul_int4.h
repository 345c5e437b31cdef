/* cpu/matmul_int4.h — owns the CPU int4 (LLMI_I4G) matmul that cpu_matmul dispatches to. */
#ifndef LLMI_CPU_MATMUL_INT4_H
#define LLMI_CPU_MATMUL_INT4_H

#include "core/tensor.h"

/* y (n, rows) = x (n, cols) @ W^T (+ bias (rows)), W an LLMI_I4G tensor. */
void cpu_matmul_i4g(const llmi_tensor *w, const float *x, int n, const float *bias, float *y);

#endif
