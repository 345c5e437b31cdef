/* dtype.h — owns the element types llmi stores weights and caches in, their block
 * geometry and the scalar fp16/bf16 conversions every backend shares. */
#ifndef LLMI_DTYPE_H
#define LLMI_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum llmi_dtype {
    LLMI_F32 = 0,
    LLMI_F16,
    LLMI_BF16,
    LLMI_Q8_0,   /* GGUF: blocks of 32, fp16 d + int8 q[32]          (34 bytes) */
    LLMI_Q4_0,   /* GGUF: blocks of 32, fp16 d + u8 qs[16]            (18 bytes) */
    LLMI_Q4_1,   /* GGUF: blocks of 32, fp16 d, fp16 m + u8 qs[16]    (20 bytes) */
    LLMI_I4G,    /* GPTQ/AWQ int4: data u8 (rows, cols/2) nibbles, low nibble = even col;
                    per-group fp16 scales + u8 zeros (+ optional g_idx) in llmi_tensor (core/int4.h) */
    LLMI_DTYPE_COUNT
} llmi_dtype;

/* Element types of the KV cache (--kv-type).  Backends and kernels both need it, so it
 * lives with the other storage types. */
typedef enum { LLMI_KV_F32 = 0, LLMI_KV_F16, LLMI_KV_BF16 } llmi_kv_dtype;
static inline size_t kv_dtype_bytes(llmi_kv_dtype t) { return t == LLMI_KV_F32 ? 4 : 2; }

/* Weights per block and bytes per block; dense types have a block of 1. */
static inline int dtype_block_elems(llmi_dtype t) {
    if (t == LLMI_I4G) return 2;
    return (t == LLMI_Q8_0 || t == LLMI_Q4_0 || t == LLMI_Q4_1) ? 32 : 1;
}
static inline size_t dtype_block_bytes(llmi_dtype t) {
    switch (t) {
    case LLMI_F32: return 4;
    case LLMI_F16: case LLMI_BF16: return 2;
    case LLMI_Q8_0: return 34;
    case LLMI_Q4_0: return 18;
    case LLMI_Q4_1: return 20;
    case LLMI_I4G: return 1;
    default: return 0;
    }
}
const char *dtype_name(llmi_dtype t);

static inline float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, as numpy and torch do. */
static inline uint16_t f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t mant = x & 0x7fffffu;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)h;
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

#endif
