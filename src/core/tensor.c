/* tensor.c — owns the exact dequantization of one weight row: the reference every
 * fast path (cpu/matmul*.c, kernels/) is measured against. */
#include "core/int4.h"
#include "core/tensor.h"

void tensor_dequant_row(const llmi_tensor *t, int64_t r, float *out) {
    const uint8_t *row = (const uint8_t *)t->data + (size_t)r * t->row_bytes;
    int64_t n = t->cols;
    switch (t->dtype) {
    case LLMI_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        break;
    case LLMI_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            out[i] = fp16_to_f32(h);
        }
        break;
    case LLMI_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            out[i] = bf16_to_f32(h);
        }
        break;
    case LLMI_Q8_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + b * 34;
            uint16_t dh;
            memcpy(&dh, blk, 2);
            float d = fp16_to_f32(dh);
            for (int j = 0; j < 32; j++) out[b * 32 + j] = (float)(int8_t)blk[2 + j] * d;
        }
        break;
    case LLMI_Q4_0:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + b * 18;
            uint16_t dh;
            memcpy(&dh, blk, 2);
            float d = fp16_to_f32(dh);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = (float)((blk[2 + j] & 15) - 8) * d;
                out[b * 32 + j + 16] = (float)((blk[2 + j] >> 4) - 8) * d;
            }
        }
        break;
    case LLMI_Q4_1:
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *blk = row + b * 20;
            uint16_t dh, mh;
            memcpy(&dh, blk, 2);
            memcpy(&mh, blk + 2, 2);
            float d = fp16_to_f32(dh), m = fp16_to_f32(mh);
            for (int j = 0; j < 16; j++) {
                out[b * 32 + j] = (float)(blk[4 + j] & 15) * d + m;
                out[b * 32 + j + 16] = (float)(blk[4 + j] >> 4) * d + m;
            }
        }
        break;
    case LLMI_I4G:
        quant_dequant_row(t, r, out); /* GPTQ/AWQ int4: quant_tensor.c */
        break;
    default:
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
        break;
    }
}
