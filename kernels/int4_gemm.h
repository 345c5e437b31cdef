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

/* LLMI_I4_AUTO: the tensor-core GEMV (16-byte loads) for any token count where the shape
 * allows, else as LLMI_I4_MMA; LLMI_I4_MMA: the shuffle-fed tensor-core kernel from
 * LLMI_I4_MMA_MIN_N tokens where the shape allows, else the chunk GEMV where it allows,
 * else the warp GEMV (the default of 6e0b768); LLMI_I4_CHUNK: no tensor cores;
 * LLMI_I4_WARP: the warp GEMV only. */
typedef enum { LLMI_I4_AUTO = 0, LLMI_I4_MMA, LLMI_I4_CHUNK, LLMI_I4_WARP } llmi_i4_kernel;

typedef struct llmi_i4g_dev {
    const uint8_t *q;        /* (rows, cols/2) */
    const uint16_t *scales;  /* (n_groups, rows) fp16 bits */
    const uint8_t *zeros;    /* (n_groups, rows) */
    const int32_t *g_idx;    /* (cols) or NULL */
    int rows, cols, group_size;
    /* which kernels may serve it (LLMI_I4_GEMV in the CUDA backend), so that a device
     * session can time each: see llmi_cuda_int4_matmul */
    llmi_i4_kernel kernel;
} llmi_i4g_dev;

/* Tokens per GEMV pass (each pass reads the weights once). */
#define LLMI_I4_GEMV_MAX_N 16
/* The tensor-core kernel: from this many tokens, in passes of up to LLMI_I4_MMA_MAX_N. */
#define LLMI_I4_MMA_MIN_N 5
#define LLMI_I4_MMA_MAX_N 32

/* y (n, ldy) f32, columns [0, rows) = x (n, cols) in x_dt (F32 or BF16) @ W^T (+ bias
 * (rows)), fp32 products, by the first kernel w->kernel allows (llmi_i4_kernel) whose
 * conditions hold:
 *   - tensor cores fed by 16-byte loads, any token count (passes of up to LLMI_I4_MMA_MAX_N):
 *     bf16 x, no g_idx, cols and group_size multiples of 128, q 16-byte aligned;
 *   - tensor cores fed by shuffles, from LLMI_I4_MMA_MIN_N tokens (passes of up to
 *     LLMI_I4_MMA_MAX_N): bf16 x, no g_idx, cols % 64 == 0, group_size % 16 == 0, q 8-byte
 *     aligned.  Both run mma.sync m16n8k16 on the exact bf16 (q - z) and x, each group's
 *     fp32 sums scaled once;
 *   - a GEMV over passes of up to LLMI_I4_GEMV_MAX_N tokens: a block per two output rows
 *     splitting their 16-byte chunks where cols % 32 == 0 and q is 16-byte aligned, else a
 *     warp per two rows.
 * Needs cols and group_size multiples of 8 and x 16-byte aligned (else
 * cudaErrorMisalignedAddress).  Prefill-sized batches go through llmi_cuda_int4_dequant and
 * a dense GEMM instead (the caller's choice). */
cudaError_t llmi_cuda_int4_matmul(const llmi_i4g_dev *w, const void *x, llmi_dtype x_dt, int n, const float *bias,
                                  float *y, int ldy, cudaStream_t s);
/* out (rows, cols) in out_dt (F32, F16 or BF16): the dense weight, each value
 * scale * (q - zero) in fp32 rounded once. */
cudaError_t llmi_cuda_int4_dequant(const llmi_i4g_dev *w, void *out, llmi_dtype out_dt, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
