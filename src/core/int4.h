/* int4.h — owns the int4 weight grid of one linear layer (quant_grid), the GPTQ (v1/v2)
 * and AWQ-GEMM checkpoint packings of it, and LLMI_I4G tensors built from it: what the
 * offline quantizer (src/quant) produces, the loader (src/model) reads back, and the
 * backends serve.
 *
 * The grid is the one truth: W[r][k] = scale[g][r] * (q[r][k] - zero[g][r]) with
 * g = g_idx[k] (k / group_size without act-order), scales rounded to fp16 *before*
 * q is chosen, so what is written, what is loaded and what the quantizer measured
 * are bit-identical. */
#ifndef LLMI_INT4_H
#define LLMI_INT4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"
#include "core/tensor.h"

#define QUANT_MAXQ 15   /* 4 bits */

/* How q, scale and zero are chosen from a group's range (FORMATS.md):
 * GPTQ: s = (max-min)/15 (sym: 2*amax/15, z = 8), z = round(-min/s);
 * AWQ:  s = max(max-min, 1e-5)/15, z = clamp(-round(min/s), 0, 15). */
typedef enum { QUANT_STYLE_GPTQ = 0, QUANT_STYLE_AWQ } quant_style;

typedef struct quant_grid {
    int rows, cols;          /* out, in features */
    int group_size;          /* columns per group; cols % group_size == 0 */
    int n_groups;            /* cols / group_size */
    uint8_t *q;              /* (rows, cols) 0..15 */
    uint16_t *scales;        /* (n_groups, rows) fp16 */
    uint8_t *zeros;          /* (n_groups, rows) 0..15 (the true zero, v2 semantics) */
    int32_t *g_idx;          /* (cols) group of each column, or NULL = k / group_size */
} quant_grid;

int quant_grid_alloc(quant_grid *g, int rows, int cols, int group_size, bool with_g_idx, llmi_status *st);
void quant_grid_free(quant_grid *g);
/* out (rows, cols) = the dequantized weights, fp32 arithmetic on fp16 scales. */
void quant_grid_dequant(const quant_grid *g, float *out);
static inline int quant_grid_group(const quant_grid *g, int k) {
    return g->g_idx ? g->g_idx[k] : k / g->group_size;
}

/* Scale and zero of one group of one row from its values x (n), rounded to fp16. */
void quant_group_params(const float *x, int n, bool sym, quant_style style, uint16_t *scale, uint8_t *zero);
/* Same from a given [min, max] range (min <= 0 <= max is enforced inside). */
void quant_range_params(float mn, float mx, bool sym, quant_style style, uint16_t *scale, uint8_t *zero);
static inline int quant_q(float w, float s, int z) {
    float v = s != 0.0f ? __builtin_nearbyintf(w / s) + (float)z : (float)z;
    return v < 0.0f ? 0 : v > (float)QUANT_MAXQ ? QUANT_MAXQ : (int)v;
}

/* ---- int4_pack.c: checkpoint layouts (FORMATS.md "GPTQ/AWQ checkpoints") --------- */
/* GPTQ: qweight int32 (cols/8, rows), qzeros int32 (n_groups, rows/8), scales fp16
 * (n_groups, rows), g_idx int32 (cols).  v1 stores zero-1. */
void quant_pack_gptq(const quant_grid *g, bool v1, int32_t *qweight, int32_t *qzeros, uint16_t *scales,
                     int32_t *g_idx);
/* Inverse; fails (names `what`) when a v1 zero word decodes to zero 16 or g_idx is out of range. */
int quant_unpack_gptq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, const int32_t *g_idx,
                      bool v1, quant_grid *g, const char *what, llmi_status *st);
/* AWQ GEMM: qweight int32 (cols, rows/8), qzeros int32 (n_groups, rows/8), scales fp16
 * (n_groups, rows); nibble i of word c holds column 8c + {0,2,4,6,1,3,5,7}[i]. */
void quant_pack_awq(const quant_grid *g, int32_t *qweight, int32_t *qzeros, uint16_t *scales);
void quant_unpack_awq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, quant_grid *g);

/* ---- int4_tensor.c: LLMI_I4G tensors ---------------------------------------------- */
/* Builds an owned LLMI_I4G tensor from a grid (copies). */
int quant_tensor_from_grid(const quant_grid *g, llmi_tensor *t, llmi_status *st);
/* Row r of an LLMI_I4G tensor as floats (cols); the reference every fast path matches. */
void quant_dequant_row(const llmi_tensor *t, int64_t r, float *out);

#endif
