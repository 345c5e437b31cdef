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

typedef struct llmi_i4g_dev {
    const uint8_t *q;        /* (rows, cols/2) */
    const uint16_t *scales;  /* (n_groups, rows) fp16 bits */
    const uint8_t *zeros;    /* (n_groups, rows) */
    const int32_t *g_idx;    /* (cols) or NULL */
    int rows, cols, group_size;
} llmi_i4g_dev;

/* y (n, rows) f32 = x (n, cols) f32 @ W^T (+ bias (rows)).  n <= 8 runs the decode GEMV
 * (one warp per output row, weights read once); larger n the tensor-core GEMM that
 * dequantizes 64x32 weight tiles to fp16 in shared memory (fp32 accumulation). */
cudaError_t llmi_cuda_int4_matmul(const llmi_i4g_dev *w, const float *x, int n, const float *bias, float *y,
                                  cudaStream_t s);
/* out (rows, cols) in fp16 (out_f16) or fp32: the dense weight, for backends that keep one. */
cudaError_t llmi_cuda_int4_dequant(const llmi_i4g_dev *w, void *out, int out_f16, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
