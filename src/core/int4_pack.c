/* int4_pack.c — owns quant_grid storage, the group parameter rules of GPTQ and AWQ, and
 * the bit layouts of GPTQ v1/v2 and AWQ-GEMM checkpoints (FORMATS.md). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/int4.h"

/* AWQ's interleave: nibble i of a word holds column 8c + kAwqOrder[i], so that its GEMM
 * kernel can unpack two fp16x2 pairs with one shift each. */
static const int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

int quant_grid_alloc(quant_grid *g, int rows, int cols, int group_size, bool with_g_idx, llmi_status *st) {
    memset(g, 0, sizeof *g);
    if (rows <= 0 || cols <= 0 || group_size <= 0 || cols % group_size != 0)
        return llmi_fail(st, LLMI_E_USAGE, "quantize: group size %d does not divide the input dim %d", group_size,
                         cols);
    g->rows = rows;
    g->cols = cols;
    g->group_size = group_size;
    g->n_groups = cols / group_size;
    g->q = malloc((size_t)rows * cols);
    g->scales = malloc((size_t)g->n_groups * rows * sizeof(uint16_t));
    g->zeros = malloc((size_t)g->n_groups * rows);
    g->g_idx = with_g_idx ? malloc((size_t)cols * sizeof(int32_t)) : NULL;
    if (!g->q || !g->scales || !g->zeros || (with_g_idx && !g->g_idx)) {
        quant_grid_free(g);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for a %dx%d grid", rows, cols);
    }
    if (g->g_idx)
        for (int k = 0; k < cols; k++) g->g_idx[k] = k / group_size;
    return 0;
}

void quant_grid_free(quant_grid *g) {
    free(g->q);
    free(g->scales);
    free(g->zeros);
    free(g->g_idx);
    memset(g, 0, sizeof *g);
}

void quant_grid_dequant(const quant_grid *g, float *out) {
    for (int r = 0; r < g->rows; r++)
        for (int k = 0; k < g->cols; k++) {
            int gi = quant_grid_group(g, k);
            float s = fp16_to_f32(g->scales[(size_t)gi * g->rows + r]);
            int z = g->zeros[(size_t)gi * g->rows + r];
            out[(size_t)r * g->cols + k] = s * (float)((int)g->q[(size_t)r * g->cols + k] - z);
        }
}

void quant_range_params(float mn, float mx, bool sym, quant_style style, uint16_t *scale, uint8_t *zero) {
    float s;
    int z;
    if (style == QUANT_STYLE_AWQ) {
        /* AutoAWQ pseudo_quantize_tensor with zero_point (no sym variant in its GEMM format). */
        s = fmaxf(mx - mn, 1e-5f) / QUANT_MAXQ;
        uint16_t sh = f32_to_fp16(s);
        if ((sh & 0x7fff) == 0) sh = 1;
        s = fp16_to_f32(sh);
        float zf = -__builtin_nearbyintf(mn / s);
        z = zf < 0 ? 0 : zf > QUANT_MAXQ ? QUANT_MAXQ : (int)zf;
        *scale = sh;
        *zero = (uint8_t)z;
        return;
    }
    /* GPTQ's Quantizer.find_params: the range always includes 0. */
    mn = fminf(mn, 0.0f);
    mx = fmaxf(mx, 0.0f);
    if (sym) {
        mx = fmaxf(-mn, mx);
        if (mn < 0) mn = -mx;
    }
    if (mn == 0.0f && mx == 0.0f) {
        mn = -1.0f;
        mx = 1.0f;
    }
    s = (mx - mn) / QUANT_MAXQ;
    uint16_t sh = f32_to_fp16(s);
    if ((sh & 0x7fff) == 0) sh = 1;
    s = fp16_to_f32(sh);
    if (sym) {
        z = (QUANT_MAXQ + 1) / 2;
    } else {
        /* v1 files store zero-1 in a nibble, so zero 0 cannot be written: the grid starts
         * at 1 (its range becomes [-s, 14s] for an all-positive group). */
        float zf = __builtin_nearbyintf(-mn / s);
        z = zf < 1 ? 1 : zf > QUANT_MAXQ ? QUANT_MAXQ : (int)zf;
    }
    *scale = sh;
    *zero = (uint8_t)z;
}

void quant_group_params(const float *x, int n, bool sym, quant_style style, uint16_t *scale, uint8_t *zero) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        mn = fminf(mn, x[i]);
        mx = fmaxf(mx, x[i]);
    }
    quant_range_params(mn, mx, sym, style, scale, zero);
}

void quant_pack_gptq(const quant_grid *g, bool v1, int32_t *qweight, int32_t *qzeros, uint16_t *scales,
                     int32_t *g_idx) {
    int rows = g->rows, cols = g->cols;
    for (int w = 0; w < cols / 8; w++)
        for (int n = 0; n < rows; n++) {
            uint32_t word = 0;
            for (int j = 0; j < 8; j++) word |= (uint32_t)(g->q[(size_t)n * cols + 8 * w + j] & 15) << (4 * j);
            qweight[(size_t)w * rows + n] = (int32_t)word;
        }
    for (int gi = 0; gi < g->n_groups; gi++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = 0;
            for (int j = 0; j < 8; j++) {
                int z = g->zeros[(size_t)gi * rows + 8 * c + j] - (v1 ? 1 : 0);
                word |= (uint32_t)(z & 15) << (4 * j);
            }
            qzeros[(size_t)gi * (rows / 8) + c] = (int32_t)word;
        }
    memcpy(scales, g->scales, (size_t)g->n_groups * rows * sizeof(uint16_t));
    for (int k = 0; k < cols; k++) g_idx[k] = quant_grid_group(g, k);
}

int quant_unpack_gptq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, const int32_t *g_idx,
                      bool v1, quant_grid *g, const char *what, llmi_status *st) {
    int rows = g->rows, cols = g->cols;
    for (int w = 0; w < cols / 8; w++)
        for (int n = 0; n < rows; n++) {
            uint32_t word = (uint32_t)qweight[(size_t)w * rows + n];
            for (int j = 0; j < 8; j++) g->q[(size_t)n * cols + 8 * w + j] = (uint8_t)((word >> (4 * j)) & 15);
        }
    for (int gi = 0; gi < g->n_groups; gi++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = (uint32_t)qzeros[(size_t)gi * (rows / 8) + c];
            /* v1 readers add 1 after unpacking; a nibble of 15 gives 16, which they keep. */
            for (int j = 0; j < 8; j++)
                g->zeros[(size_t)gi * rows + 8 * c + j] = (uint8_t)(((word >> (4 * j)) & 15) + (v1 ? 1 : 0));
        }
    memcpy(g->scales, scales, (size_t)g->n_groups * rows * sizeof(uint16_t));
    if (g->g_idx) {
        for (int k = 0; k < cols; k++) {
            if (g_idx[k] < 0 || g_idx[k] >= g->n_groups)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: g_idx[%d] = %d is outside [0, %d)", what, k, g_idx[k],
                                 g->n_groups);
            g->g_idx[k] = g_idx[k];
        }
    }
    return 0;
}

void quant_pack_awq(const quant_grid *g, int32_t *qweight, int32_t *qzeros, uint16_t *scales) {
    int rows = g->rows, cols = g->cols;
    for (int k = 0; k < cols; k++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = 0;
            for (int i = 0; i < 8; i++)
                word |= (uint32_t)(g->q[(size_t)(8 * c + kAwqOrder[i]) * cols + k] & 15) << (4 * i);
            qweight[(size_t)k * (rows / 8) + c] = (int32_t)word;
        }
    for (int gi = 0; gi < g->n_groups; gi++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = 0;
            for (int i = 0; i < 8; i++)
                word |= (uint32_t)(g->zeros[(size_t)gi * rows + 8 * c + kAwqOrder[i]] & 15) << (4 * i);
            qzeros[(size_t)gi * (rows / 8) + c] = (int32_t)word;
        }
    memcpy(scales, g->scales, (size_t)g->n_groups * rows * sizeof(uint16_t));
}

void quant_unpack_awq(const int32_t *qweight, const int32_t *qzeros, const uint16_t *scales, quant_grid *g) {
    int rows = g->rows, cols = g->cols;
    for (int k = 0; k < cols; k++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = (uint32_t)qweight[(size_t)k * (rows / 8) + c];
            for (int i = 0; i < 8; i++)
                g->q[(size_t)(8 * c + kAwqOrder[i]) * cols + k] = (uint8_t)((word >> (4 * i)) & 15);
        }
    for (int gi = 0; gi < g->n_groups; gi++)
        for (int c = 0; c < rows / 8; c++) {
            uint32_t word = (uint32_t)qzeros[(size_t)gi * (rows / 8) + c];
            for (int i = 0; i < 8; i++)
                g->zeros[(size_t)gi * rows + 8 * c + kAwqOrder[i]] = (uint8_t)((word >> (4 * i)) & 15);
        }
    memcpy(g->scales, scales, (size_t)g->n_groups * rows * sizeof(uint16_t));
}
