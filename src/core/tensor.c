/* tensor.c — owns the exact dequantization of one weight row: the reference every
 * fast path (cpu/matmul*.c, kernels/) is measured against. */
#include "core/int4.h"
#include "core/tensor.h"

/* Q4_K / Q5_K: sub-block s (32 values) is d * scale_s * q - dmin * min_s, with the
 * products d * scale_s and dmin * min_s formed first in fp32 (exact: an fp16 times a 6-bit
 * integer), as llama.cpp does.  The 4-bit codes: byte i of the 32-byte run k (k = s / 2)
 * holds value i of sub-block 2k in its low nibble and of sub-block 2k + 1 in its high one;
 * Q5_K's fifth bit of that value is bit s of qh[i].
 * Q6_K: value e is d * scales[e / 16] * (q - 32), q 6 bits: per 128-value half h and
 * l < 32, values l, l + 32, l + 64, l + 96 take the low nibble of ql[64h + l], of
 * ql[64h + l + 32], the high nibble of ql[64h + l], of ql[64h + l + 32], and bit pairs 0-1,
 * 2-3, 4-5, 6-7 of qh[32h + l] as bits 4-5.
 * Q3_K: value e is d * (scale[e / 16] - 32) * (q - 4), q 3 bits: per 128-value half h and
 * l < 32, values l + 32k (k = 0..3) take bit pair k of qs[32h + l], and value e's third bit
 * is bit e / 32 of hmask[e % 32] (kquant_q3_scale reads the scales).
 * Q2_K: value e is d * scale[e / 16] * q - dmin * min[e / 16] (scales[j]: scale low nibble,
 * min high), q 2 bits: per 128-value half h and l < 32, values l + 32k (k = 0..3) take bit
 * pair k of qs[32h + l]; d, dmin at bytes 80, 82.
 * IQ4_NL (a block of 32) and IQ4_XS sub-block s: 16 bytes of nibbles in Q4_0's order (byte
 * l: value l low, value 16 + l high), each an index into iq4nl_value's table. */
void kquant_sub_block(llmi_dtype t, const uint8_t *blk, int s, uint8_t u[32], float f[4]) {
    uint16_t h;
    f[0] = f[1] = f[2] = f[3] = 0.0f;
    if (t == LLMI_IQ4_NL) {
        for (int c = 0; c < 32; c++) u[c] = (uint8_t)(c < 16 ? blk[2 + c] & 15 : blk[2 + c - 16] >> 4);
        memcpy(&h, blk, 2);
        f[0] = fp16_to_f32(h);
        return;
    }
    if (t == LLMI_Q5_0 || t == LLMI_Q5_1) {   /* a block of 32 is its one sub-block */
        const bool q51 = t == LLMI_Q5_1;
        const uint8_t *qs = blk + (q51 ? 8 : 6);
        uint32_t qh;
        memcpy(&qh, blk + (q51 ? 4 : 2), 4);
        memcpy(&h, blk, 2);
        f[0] = fp16_to_f32(h);
        memcpy(&h, blk + 2, 2);
        f[1] = q51 ? fp16_to_f32(h) : -16.0f * f[0];   /* exact: d * (q - 16) = d * q - 16 d */
        for (int c = 0; c < 32; c++) u[c] = (uint8_t)((c < 16 ? qs[c] & 15 : qs[c - 16] >> 4) | (qh >> c & 1) << 4);
        return;
    }
    float sup[2];
    int isc[4];
    kquant_sub_scales(t, blk, s, sup, isc);
    if (t == LLMI_IQ4_XS) {   /* sub-block s: 16 bytes of nibbles from byte 8 + 16 s */
        const uint8_t *qs = blk + 8 + 16 * s;
        for (int c = 0; c < 32; c++) u[c] = (uint8_t)(c < 16 ? qs[c] & 15 : qs[c - 16] >> 4);
        f[0] = sup[0] * (float)isc[0];
        return;
    }
    if (t == LLMI_Q2_K) {   /* sub-block s = 4 * half + k */
        const uint8_t *qs = blk + 16 + 32 * (s / 4);
        for (int l = 0; l < 32; l++) u[l] = (uint8_t)(qs[l] >> (2 * (s % 4)) & 3);
        for (int k = 0; k < 2; k++) {
            f[k] = sup[0] * (float)isc[k];
            f[2 + k] = -(sup[1] * (float)isc[2 + k]);
        }
        return;
    }
    if (t == LLMI_Q3_K) {   /* sub-block s = 4 * half + k */
        const uint8_t *qs = blk + 32 + 32 * (s / 4);
        for (int l = 0; l < 32; l++) u[l] = (uint8_t)((qs[l] >> (2 * (s % 4)) & 3) | (blk[l] >> s & 1) << 2);
        f[0] = sup[0] * (float)isc[0];
        f[1] = sup[1] * (float)isc[1];
        return;
    }
    if (t == LLMI_Q6_K) {
        /* sub-block s = 4 * half + k: k's nibble is the low (k < 2) or high one of ql's
         * run k % 2, its top bits pair k of qh */
        const uint8_t *ql = blk + 64 * (s / 4) + 32 * (s % 2), *qh = blk + 128 + 32 * (s / 4);
        const int k = s % 4;
        for (int l = 0; l < 32; l++) u[l] = (uint8_t)((ql[l] >> (4 * (k / 2)) & 15) | (qh[l] >> (2 * k) & 3) << 4);
        f[0] = sup[0] * (float)isc[0];
        f[1] = sup[1] * (float)isc[1];
        return;
    }
    const uint8_t *qh = blk + 16, *q = blk + (t == LLMI_Q5_K ? 48 : 16) + 32 * (s / 2);
    for (int i = 0; i < 32; i++) {
        int v = q[i] >> (4 * (s % 2)) & 15;
        if (t == LLMI_Q5_K) v |= (qh[i] >> s & 1) << 4;
        u[i] = (uint8_t)v;
    }
    f[0] = sup[0] * (float)isc[0];
    f[1] = -(sup[1] * (float)isc[1]);
}

void kquant_sub_scales(llmi_dtype t, const uint8_t *blk, int s, float sup[2], int isc[4]) {
    uint16_t h;
    isc[0] = isc[1] = isc[2] = isc[3] = 0;
    if (t == LLMI_Q2_K) {   /* scales[j] of values 16j..: scale in the low nibble, min in the high */
        memcpy(&h, blk + 80, 2);
        sup[0] = fp16_to_f32(h);
        memcpy(&h, blk + 82, 2);
        sup[1] = fp16_to_f32(h);
        for (int k = 0; k < 2; k++) {
            isc[k] = blk[2 * s + k] & 15;
            isc[2 + k] = blk[2 * s + k] >> 4;
        }
        return;
    }
    if (t == LLMI_IQ4_XS) {
        memcpy(&h, blk, 2);
        sup[0] = sup[1] = fp16_to_f32(h);
        isc[0] = iq4xs_scale(blk, s);
        return;
    }
    if (t == LLMI_Q3_K) {
        memcpy(&h, blk + 108, 2);
        sup[0] = sup[1] = fp16_to_f32(h);
        isc[0] = kquant_q3_scale(blk + 96, 2 * s);
        isc[1] = kquant_q3_scale(blk + 96, 2 * s + 1);
        return;
    }
    if (t == LLMI_Q6_K) {
        const int8_t *sc = (const int8_t *)(blk + 192);
        memcpy(&h, blk + 208, 2);
        sup[0] = sup[1] = fp16_to_f32(h);
        isc[0] = sc[2 * s];
        isc[1] = sc[2 * s + 1];
        return;
    }
    memcpy(&h, blk, 2);
    sup[0] = fp16_to_f32(h);
    memcpy(&h, blk + 2, 2);
    sup[1] = fp16_to_f32(h);
    kquant_scale_min(blk + 4, s, &isc[0], &isc[1]);
}

void kquant_dequant_block(llmi_dtype t, const uint8_t *blk, float *out) {
    for (int s = 0; s < dtype_block_elems(t) / 32; s++) {
        uint8_t u[32];
        float f[4];
        kquant_sub_block(t, blk, s, u, f);
        /* (x + -m is x - m: the same fp32 result; Q5_0 keeps ggml's d * (q - 16), whose zero
         * takes d's sign where d * q - 16 d would give +0) */
        for (int i = 0; i < 32; i++)
            out[32 * s + i] = t == LLMI_Q6_K   ? f[i / 16] * (float)(u[i] - 32)
                              : t == LLMI_Q3_K ? f[i / 16] * (float)(u[i] - 4)
                              : t == LLMI_Q2_K ? f[i / 16] * (float)u[i] + f[2 + i / 16]
                              : (t == LLMI_IQ4_NL || t == LLMI_IQ4_XS) ? f[0] * (float)iq4nl_value(u[i])
                              : t == LLMI_Q5_0 ? f[0] * (float)(u[i] - 16)
                                               : f[0] * (float)u[i] + f[1];
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
    case LLMI_I4G:
        quant_dequant_row(t, r, out); /* GPTQ/AWQ int4: quant_tensor.c */
        break;
    case LLMI_IQ4_NL:
    case LLMI_IQ4_XS:
    case LLMI_Q2_K:
    case LLMI_Q3_K:
    case LLMI_Q4_K:
    case LLMI_Q5_K:
    case LLMI_Q6_K:
    case LLMI_Q5_0:
    case LLMI_Q5_1: {
        const int64_t be = dtype_block_elems(t->dtype);
        for (int64_t b = 0; b < n / be; b++)
            kquant_dequant_block(t->dtype, row + b * dtype_block_bytes(t->dtype), out + b * be);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
        break;
    }
}
