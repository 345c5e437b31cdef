/* int4_tensor.c — owns LLMI_I4G tensors: building them from a quantization grid and
 * the exact dequantization of one row that every int4 matmul is checked against. */
#include <stdlib.h>
#include <string.h>
#include "core/int4.h"

int quant_tensor_from_grid(const quant_grid *g, llmi_tensor *t, llmi_status *st) {
    memset(t, 0, sizeof *t);
    if (g->cols % 2 != 0) return llmi_fail(st, LLMI_E_RUNTIME, "int4 tensor: odd input dim %d", g->cols);
    size_t n_gidx = g->g_idx ? (size_t)g->cols : 0;
    size_t n_sz = (size_t)g->n_groups * g->rows;
    /* One allocation so that whoever frees t->owned frees all of it: g_idx (int32),
     * scales (u16), zeros (u8), nibbles (u8), in that order for alignment. */
    size_t bytes = n_gidx * 4 + n_sz * 2 + n_sz + (size_t)g->rows * g->cols / 2;
    uint8_t *mem = malloc(bytes ? bytes : 1);
    if (!mem) return llmi_fail(st, LLMI_E_RUNTIME, "int4 tensor: out of memory (%zu bytes)", bytes);
    int32_t *gidx = n_gidx ? (int32_t *)mem : NULL;
    uint16_t *scales = (uint16_t *)(mem + n_gidx * 4);
    uint8_t *zeros = mem + n_gidx * 4 + n_sz * 2;
    uint8_t *data = zeros + n_sz;
    if (gidx) memcpy(gidx, g->g_idx, n_gidx * 4);
    memcpy(scales, g->scales, n_sz * 2);
    memcpy(zeros, g->zeros, n_sz);
    for (size_t r = 0; r < (size_t)g->rows; r++)
        for (int k = 0; k < g->cols; k += 2) {
            const uint8_t *q = g->q + r * g->cols + k;
            data[r * (g->cols / 2) + k / 2] = (uint8_t)((q[0] & 15) | ((q[1] & 15) << 4));
        }
    t->dtype = LLMI_I4G;
    t->rows = g->rows;
    t->cols = g->cols;
    t->row_bytes = (size_t)g->cols / 2;
    t->data = data;
    t->owned = mem;
    t->qscales = scales;
    t->qzeros = zeros;
    t->g_idx = gidx;
    t->group_size = g->group_size;
    t->n_groups = g->n_groups;
    return 0;
}

void quant_dequant_row(const llmi_tensor *t, int64_t r, float *out) {
    const uint8_t *row = (const uint8_t *)t->data + (size_t)r * t->row_bytes;
    int64_t rows = t->rows;
    if (t->g_idx) {
        for (int64_t k = 0; k < t->cols; k++) {
            int g = t->g_idx[k];
            float s = fp16_to_f32(t->qscales[(size_t)g * rows + r]);
            int z = t->qzeros[(size_t)g * rows + r];
            int q = (row[k / 2] >> (4 * (k & 1))) & 15;
            out[k] = s * (float)(q - z);
        }
        return;
    }
    int gs = t->group_size;
    for (int g = 0; g < t->n_groups; g++) {
        float s = fp16_to_f32(t->qscales[(size_t)g * rows + r]);
        int z = t->qzeros[(size_t)g * rows + r];
        const uint8_t *p = row + (size_t)g * gs / 2;
        float *o = out + (size_t)g * gs;
        for (int k = 0; k < gs / 2; k++) {
            o[2 * k] = s * (float)((p[k] & 15) - z);
            o[2 * k + 1] = s * (float)((p[k] >> 4) - z);
        }
    }
}
