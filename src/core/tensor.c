/* tensor.c — owns the exact dequantization of one weight row: the reference every
 * fast path (cpu/matmul*.c, kernels/) is measured against. */
#include "core/int4.h"
#include "core/tensor.h"

/* Q4_K / Q5_K: sub-block j (32 values) is d * scale_j * q - dmin * min_j, with the
 * products d * scale_j and dmin * min_j formed first in fp32 (exact: an fp16 times a 6-bit
 * integer), as llama.cpp does.  The 4-bit codes: byte i of the 32-byte run k (k = j / 2)
 * holds value i of sub-block 2k in its low nibble and of sub-block 2k + 1 in its high one;
 * Q5_K's fifth bit of that value is bit j of qh[i].
 * Q6_K: value e is d * scales[e / 16] * (q - 32), q 6 bits: per 128-value half h and
 * l < 32, values l, l + 32, l + 64, l + 96 take the low nibble of ql[64h + l], of
 * ql[64h + l + 32], the high nibble of ql[64h + l], of ql[64h + l + 32], and bit pairs 0-1,
 * 2-3, 4-5, 6-7 of qh[32h + l] as bits 4-5. */
void kquant_dequant_block(llmi_dtype t, const uint8_t *blk, float *out) {
    uint16_t h;
    if (t == LLMI_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        memcpy(&h, blk + 208, 2);
        const float d = fp16_to_f32(h);
        for (int half = 0; half < 2; half++)
            for (int l = 0; l < 32; l++) {
                const uint8_t a = ql[64 * half + l], b = ql[64 * half + l + 32], hb = qh[32 * half + l];
                const int q[4] = {(a & 15) | (hb & 3) << 4, (b & 15) | (hb >> 2 & 3) << 4, (a >> 4) | (hb >> 4 & 3) << 4,
                                  (b >> 4) | (hb >> 6 & 3) << 4};
                for (int k = 0; k < 4; k++) {
                    const int e = 128 * half + 32 * k + l;
                    out[e] = d * (float)sc[e / 16] * (float)(q[k] - 32);
                }
            }
        return;
    }
    memcpy(&h, blk, 2);
    const float d = fp16_to_f32(h);
    memcpy(&h, blk + 2, 2);
    const float dmin = fp16_to_f32(h);
    const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + (t == LLMI_Q5_K ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        kquant_scale_min(scales, j, &sc, &mn);
        const float dj = d * (float)sc, mj = dmin * (float)mn;
        const uint8_t *q = qs + 32 * (j / 2);
        for (int i = 0; i < 32; i++) {
            int v = j % 2 ? q[i] >> 4 : q[i] & 15;
            if (t == LLMI_Q5_K && (qh[i] >> j & 1)) v += 16;
            out[32 * j + i] = dj * (float)v - mj;
        }
    }
}

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
    case LLMI_Q5_0:
    case LLMI_Q5_1:
        for (int64_t b = 0; b < n / 32; b++) {
            const bool q51 = t->dtype == LLMI_Q5_1;
            const uint8_t *blk = row + b * (q51 ? 24 : 22), *qs = blk + (q51 ? 8 : 6);
            uint16_t dh, mh;
            uint32_t qh;
            memcpy(&dh, blk, 2);
            memcpy(&mh, blk + 2, 2);
            memcpy(&qh, blk + (q51 ? 4 : 2), 4);
            const float d = fp16_to_f32(dh), m = fp16_to_f32(mh);
            for (int j = 0; j < 32; j++) {
                const int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | (int)(qh >> j & 1) << 4;
                out[b * 32 + j] = q51 ? (float)q * d + m : (float)(q - 16) * d;
            }
        }
        break;
    case LLMI_I4G:
        quant_dequant_row(t, r, out); /* GPTQ/AWQ int4: quant_tensor.c */
        break;
    case LLMI_Q4_K:
    case LLMI_Q5_K:
    case LLMI_Q6_K:
        for (int64_t b = 0; b < n / 256; b++) kquant_dequant_block(t->dtype, row + b * dtype_block_bytes(t->dtype), out + b * 256);
        break;
    default:
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
        break;
    }
}
