/* tensor.h — owns llmi_tensor, the view of one weight matrix or vector that every
 * backend reads.  Shapes follow Hugging Face: a linear weight is (rows=out, cols=in),
 * row-major, each row a whole number of dtype blocks.  (GGUF's dims[0] is our cols.) */
#ifndef LLMI_TENSOR_H
#define LLMI_TENSOR_H

#include <stdint.h>
#include "core/dtype.h"

/* How a tensor's bytes are ordered.  ROWS: row-major as below (every loader, every
 * backend's input).  CPU16: quantized rows regrouped by 16 for the CPU kernels
 * (backend/cpu/ops.h, cpu_qweight_pack); made and read only inside the CPU backend. */
typedef enum llmi_layout { LLMI_LAYOUT_ROWS = 0, LLMI_LAYOUT_CPU16 } llmi_layout;

typedef struct llmi_tensor {
    llmi_dtype dtype;
    llmi_layout layout;
    int64_t rows;        /* out features (1 for a vector) */
    int64_t cols;        /* in features; a multiple of dtype_block_elems(dtype) */
    size_t row_bytes;    /* bytes of one row = cols / block_elems * block_bytes */
    const void *data;    /* (rows, cols) in dtype; points into an mmap or into owned */
    void *owned;         /* non-NULL when the loader had to copy (permuted rows, converted dtype) */
    /* LLMI_I4G only (GPTQ/AWQ int4, see core/int4.h); W[r][k] = scale[g][r] * (q[r][k] - zero[g][r])
     * with g = g_idx ? g_idx[k] : k / group_size.  All point into owned. */
    const uint16_t *qscales; /* (n_groups, rows) fp16 */
    const uint8_t *qzeros;   /* (n_groups, rows) zero points 0..15, already +1 for GPTQ v1 files */
    const int32_t *g_idx;    /* (cols) group of each input column, or NULL = k / group_size */
    int group_size;          /* input columns per group */
    int n_groups;            /* cols / group_size */
} llmi_tensor;

/* One Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS super-block, or Q5_0 / Q5_1 / IQ4_NL block
 * (dtype_block_bytes(t) bytes) ->
 * dtype_block_elems(t) floats, as ggml's dequantize_row_* computes them. */
void kquant_dequant_block(llmi_dtype t, const uint8_t *blk, float *out);
/* Sub-block s (values 32s .. 32s + 31: 0..7 of a super-block, 0 of a Q5_0/Q5_1/IQ4_NL
 * block), the one decoder of these layouts (tensor.c): codes u (32, in value order; 0..3
 * Q2_K, 0..7 Q3_K, 0..15 Q4_K, 0..31 Q5_K, Q5_0, Q5_1, 0..63 Q6_K, an index 0..15 IQ4_*)
 * and four fp32 factors, each an exact product of the block's fp16 and integer scales,
 * such that value i is, in fp32 (h = i / 16, the half of the sub-block),
 *   Q4_K, Q5_K:  f[0] * u[i] + f[1]            f[0] = d * scale_s, f[1] = -(dmin * min_s)
 *   Q5_0, Q5_1:  f[0] * u[i] + f[1]            f[0] = d, f[1] = -16 d (Q5_0) or m (Q5_1)
 *   Q6_K:        f[h] * (u[i] - 32)            f[h] = d * scales[2s + h]
 *   Q3_K:        f[h] * (u[i] - 4)             f[h] = d * (scale_{2s + h} - 32)
 *   Q2_K:        f[h] * u[i] + f[2 + h]        f[h] = d * scale_{2s + h}, f[2 + h] = -(dmin * min_{2s + h})
 *   IQ4_NL:      f[0] * iq4nl_value(u[i])      f[0] = d
 *   IQ4_XS:      the same                      f[0] = d * (scale_s - 32)
 * (the factors a type does not use are 0). */
void kquant_sub_block(llmi_dtype t, const uint8_t *blk, int s, uint8_t u[32], float f[4]);
/* The factors of a k-quant's (or IQ4_XS's) sub-block s before their products: the
 * super-block's d and dmin (Q6_K, Q3_K, IQ4_XS: d twice) in fp32 and the integer scales
 * and mins: kquant_sub_block's factors are
 *   Q4_K, Q5_K:       sup[0] * isc[0], -(sup[1] * isc[1])
 *   Q6_K, Q3_K:       sup[0] * isc[0], sup[1] * isc[1] (the halves' signed scales)
 *   Q2_K:             sup[0] * isc[h], -(sup[1] * isc[2 + h]) for the halves h
 *   IQ4_XS:           sup[0] * isc[0] (the signed scale; isc[1..3] 0). */
void kquant_sub_scales(llmi_dtype t, const uint8_t *blk, int s, float sup[2], int isc[4]);
/* Dequantizes row r of t (layout ROWS) into out (cols floats).  The CPU backend's reference path. */
void tensor_dequant_row(const llmi_tensor *t, int64_t r, float *out);

#endif
