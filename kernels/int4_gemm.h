/* int4_gemm.h — owns the C-callable launchers of the W4A16 kernels for LLMI_I4G weights
 * (GPTQ/AWQ int4 in llmi's canonical layout, see core/tensor.h and core/int4.h):
 *   q       u8 (rows, cols/2) nibbles, low nibble = even input column
 *   scales  fp16 (n_groups, rows), zeros u8 (n_groups, rows), g_idx int32 (cols) or NULL
 * CPU twin: cpu_matmul on LLMI_I4G (src/backend/cpu/matmul.c); dequantized values are
 * scale * (q - zero) in fp32, as quant_dequant_row computes them. */
#ifndef LLMI_INT4_GEMM_H
#define LLMI_INT4_GEMM_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "core/dtype.h"

typedef struct llmi_i4g_dev {
    const uint8_t *q;        /* (rows, cols/2) */
    const uint16_t *scales;  /* (n_groups, rows) fp16 bits */
    const uint8_t *zeros;    /* (n_groups, rows) */
    const int32_t *g_idx;    /* (cols) or NULL */
    int rows, cols, group_size;
} llmi_i4g_dev;

/* Batches of at most this many tokens run the GEMV. */
#define LLMI_I4_GEMV_MAX_N 16

/* y (n, ldy) f32, columns [0, rows) = x (n, cols) in x_dt (F32 or BF16) @ W^T (+ bias
 * (rows)).  n <= LLMI_I4_GEMV_MAX_N runs the decode GEMV (a warp per two output rows,
 * the weights read once, fp32 products; x must be 16-byte aligned, else
 * cudaErrorMisalignedAddress); larger n the tensor-core GEMM that dequantizes
 * 64x32 weight tiles to bf16 in shared memory next to bf16 activations (fp32
 * accumulation; bf16 keeps the activations' range, which fp16 would clip at 65504).
 * Needs cols and group_size multiples of 8. */
cudaError_t llmi_cuda_int4_matmul(const llmi_i4g_dev *w, const void *x, llmi_dtype x_dt, int n, const float *bias,
                                  float *y, int ldy, cudaStream_t s);
/* out (rows, cols) in out_dt (F32, F16 or BF16): the dense weight, each value
 * scale * (q - zero) in fp32 rounded once. */
cudaError_t llmi_cuda_int4_dequant(const llmi_i4g_dev *w, void *out, llmi_dtype out_dt, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
