/* dtype.h — owns the element types llmi stores weights and caches in, their block
 * geometry and the scalar fp16/bf16 conversions every backend shares. */
#ifndef LLMI_DTYPE_H
#define LLMI_DTYPE_H

#include <math.h>
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
    /* GGUF k-quants: super-blocks of 256 values (ggml's QK_K), layouts in tensor.c */
    LLMI_Q4_K,   /* fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins (8 sub-blocks of 32), 128 qs (144 bytes) */
    LLMI_Q5_K,   /* as Q4_K + 32 bytes qh of fifth bits (176 bytes) */
    LLMI_Q6_K,   /* 128 ql low nibbles, 64 qh high 2-bit pairs, 16 int8 scales (sub-blocks of 16), fp16 d (210 bytes) */
    /* GGUF 5-bit legacy quants (what llama-quantize's k-quant mixes fall back to where a row is
     * not whole super-blocks): blocks of 32, value j's fifth bit is bit j of the u32 qh */
    LLMI_Q5_0,   /* fp16 d, u32 qh, u8 qs[16]: x = d * (q - 16)        (22 bytes) */
    LLMI_Q5_1,   /* fp16 d, fp16 m, u32 qh, u8 qs[16]: x = d * q + m   (24 bytes) */
    LLMI_Q3_K,   /* k-quant: 32 hmask (third bits), 64 qs (2-bit pairs), 12 bytes of 6-bit scales
                    (sub-blocks of 16), fp16 d: x = d * (scale - 32) * (q - 4) (110 bytes) */
    /* GGUF non-linear 4-bit quants: a 4-bit index q into the 16 int8 values of iq4nl_value */
    LLMI_IQ4_NL, /* blocks of 32: fp16 d, u8 qs[16] (Q4_0's nibble order): x = d * v[q]  (18 bytes) */
    LLMI_IQ4_XS, /* super-blocks of 256: fp16 d, u16 scales_h, u8 scales_l[4], u8 qs[128]; sub-block j
                    (32) has the 6-bit scale s_j: x = d * (s_j - 32) * v[q]              (136 bytes) */
    LLMI_Q2_K,   /* k-quant: 16 bytes of 4-bit scale (low) and min (high) per 16 values, 64 qs (2-bit
                    codes), fp16 d, fp16 dmin: x = d * scale * q - dmin * min             (84 bytes) */
    LLMI_DTYPE_COUNT
} llmi_dtype;

/* Element types of the KV cache (--kv-type).  Backends and kernels both need it, so it
 * lives with the other storage types.
 *  q8:  llama.cpp's q8_0 blocks: 32 values as one fp16 scale d = amax/127 and 32 int8
 *       q = round(x/d), x ~ q*d; 34 bytes per 32 values (head_dim a multiple of 32).
 *  fp8: OCP e4m3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities,
 *       max 448) of x / scale, with one scale per (layer, KV head) that the backend keeps;
 *       rounded to nearest even, saturating at +-448. */
typedef enum { LLMI_KV_F32 = 0, LLMI_KV_F16, LLMI_KV_BF16, LLMI_KV_Q8, LLMI_KV_FP8, LLMI_KV_DTYPE_COUNT } llmi_kv_dtype;
#define KV_Q8_BLOCK 32
#define KV_Q8_BLOCK_BYTES 34
#define KV_FP8_MAX 448.0f

/* Bytes n values take in the KV dtype (n a multiple of KV_Q8_BLOCK for q8). */
static inline size_t kv_dtype_row_bytes(llmi_kv_dtype t, size_t n) {
    switch (t) {
    case LLMI_KV_F32: return 4 * n;
    case LLMI_KV_Q8: return n / KV_Q8_BLOCK * KV_Q8_BLOCK_BYTES;
    case LLMI_KV_FP8: return n;
    default: return 2 * n;
    }
}
const char *kv_dtype_name(llmi_kv_dtype t);     /* "f32", "f16", "bf16", "q8", "fp8" */
int kv_dtype_parse(const char *s, llmi_kv_dtype *out);   /* 0, or -1 for an unknown name */

#ifdef __CUDACC__
#define LLMI_DTYPE_HD __host__ __device__   /* the block geometry and decoders below are also kernels/dequant.cu's, so both read one layout */
#else
#define LLMI_DTYPE_HD
#endif

/* Weights per block and bytes per block; dense types have a block of 1. */
static inline LLMI_DTYPE_HD int dtype_block_elems(llmi_dtype t) {
    if (t == LLMI_I4G) return 2;
    if (t == LLMI_Q2_K || t == LLMI_Q3_K || t == LLMI_Q4_K || t == LLMI_Q5_K || t == LLMI_Q6_K || t == LLMI_IQ4_XS)
        return 256;
    return (t == LLMI_Q8_0 || t == LLMI_Q4_0 || t == LLMI_Q4_1 || t == LLMI_Q5_0 || t == LLMI_Q5_1 || t == LLMI_IQ4_NL)
               ? 32
               : 1;
}
static inline LLMI_DTYPE_HD size_t dtype_block_bytes(llmi_dtype t) {
    switch (t) {
    case LLMI_F32: return 4;
    case LLMI_F16: case LLMI_BF16: return 2;
    case LLMI_Q8_0: return 34;
    case LLMI_Q4_0: return 18;
    case LLMI_Q4_1: return 20;
    case LLMI_I4G: return 1;
    case LLMI_Q4_K: return 144;
    case LLMI_Q5_K: return 176;
    case LLMI_Q6_K: return 210;
    case LLMI_Q5_0: return 22;
    case LLMI_Q5_1: return 24;
    case LLMI_Q3_K: return 110;
    case LLMI_IQ4_NL: return 18;
    case LLMI_IQ4_XS: return 136;
    case LLMI_Q2_K: return 84;
    default: return 0;
    }
}
const char *dtype_name(llmi_dtype t);
/* Whether t is one of the k-quants (super-blocks of 256). */
static inline int dtype_is_kquant(llmi_dtype t) {
    return t == LLMI_Q2_K || t == LLMI_Q3_K || t == LLMI_Q4_K || t == LLMI_Q5_K || t == LLMI_Q6_K;
}
/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block from its 12
 * packed bytes: j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 split between a
 * nibble of byte j + 4 and the top 2 bits of bytes j - 4 (scale) and j (min). */
static inline LLMI_DTYPE_HD void kquant_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* IQ4_NL's and IQ4_XS's 16 values (ggml's kvalues_iq4nl), index q 0..15. */
static inline LLMI_DTYPE_HD int iq4nl_value(int q) {
    const int8_t v[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return v[q & 15];
}
/* The signed scale of sub-block j (0..7, 32 values each) of an IQ4_XS super-block: the low
 * 4 bits in nibble j % 2 of scales_l[j / 2], the top 2 in bits 2j of the u16 scales_h. */
static inline LLMI_DTYPE_HD int iq4xs_scale(const uint8_t *blk, int j) {
    const int h = blk[2] | blk[3] << 8;
    return ((blk[4 + j / 2] >> (4 * (j % 2)) & 15) | (h >> (2 * j) & 3) << 4) - 32;
}
/* The signed scale of sub-block j (0..15, 16 values each) of a Q3_K super-block from its
 * 12 packed bytes: the low 4 bits in nibble j / 8 of byte j % 8, the top 2 in bits
 * 2 (j / 4) of byte 8 + j % 4, minus 32 (gguf-py's Q3_K.dequantize_blocks). */
static inline LLMI_DTYPE_HD int kquant_q3_scale(const uint8_t *s, int j) {
    return ((s[j % 8] >> (4 * (j / 8)) & 15) | (s[8 + j % 4] >> (2 * (j / 4)) & 3) << 4) - 32;
}

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

/* e4m3 (OCP FP8, "fn": no infinities, one NaN pattern 0x7f/0xff) from fp32: round to nearest
 * even, saturating to +-448 (as CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE). */
static inline uint8_t f32_to_e4m3(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7f);          /* NaN */
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7e);         /* >= 448 (and inf): saturate */
    int e = (int)(ax >> 23) - 127;                                 /* unbiased exponent */
    if (e < -6) {
        /* subnormal in e4m3: value = m * 2^-9, m in 0..7 (8 rounds up to the smallest normal) */
        float a;
        memcpy(&a, &ax, 4);
        float m = a * 512.0f;                                      /* exact: power-of-two scaling */
        float r = __builtin_nearbyintf(m);                         /* ties to even (default mode) */
        return (uint8_t)(sign | (uint8_t)r);                       /* r = 8 is 0x08, the smallest normal */
    }
    uint32_t mant = ax & 0x7fffffu, keep = mant >> 20, rest = mant & 0xfffffu;
    uint32_t v = ((uint32_t)(e + 7) << 3) | keep;
    if (rest > 0x80000u || (rest == 0x80000u && (keep & 1))) v++;  /* may carry into the exponent */
    if (v > 0x7e) v = 0x7e;
    return (uint8_t)(sign | v);
}

/* By a table of all 256 values: the formula per element made the CPU's fp8 KV decode 3.5x
 * slower than f16's at 512 tokens of context (docs/PERF.md). */
static inline float e4m3_to_f32(uint8_t b) {
    /* c / 8 % 16 is the exponent field, c % 8 the mantissa (arithmetic, not bit masks: C++
     * compilers warn on masked constants compared, and kernels/ include this header) */
#define E4M3_MAG(c) ((c) / 8 % 16 == 0 ? (float)((c) % 8) / 512.0f \
                     : (1.0f + (float)((c) % 8) / 8.0f) * (float)(1 << ((c) / 8 % 16)) / 128.0f)
#define E4M3_VAL(c) ((c) % 128 == 127 ? NAN : (c) >= 128 ? -E4M3_MAG(c) : E4M3_MAG(c))
#define E4M3_8(c) E4M3_VAL(c), E4M3_VAL(c + 1), E4M3_VAL(c + 2), E4M3_VAL(c + 3), E4M3_VAL(c + 4), \
                  E4M3_VAL(c + 5), E4M3_VAL(c + 6), E4M3_VAL(c + 7)
#define E4M3_64(c) E4M3_8(c), E4M3_8(c + 8), E4M3_8(c + 16), E4M3_8(c + 24), E4M3_8(c + 32), \
                   E4M3_8(c + 40), E4M3_8(c + 48), E4M3_8(c + 56)
    static const float value[256] = {E4M3_64(0), E4M3_64(64), E4M3_64(128), E4M3_64(192)};
#undef E4M3_64
#undef E4M3_8
#undef E4M3_VAL
#undef E4M3_MAG
    return value[b];
}

/* One q8 block: dst (KV_Q8_BLOCK_BYTES) from x (KV_Q8_BLOCK), llama.cpp's quantize_row_q8_0. */
static inline void q8_block_quantize(const float *x, uint8_t *dst) {
    float amax = 0.0f;
    for (int i = 0; i < KV_Q8_BLOCK; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint16_t h = f32_to_fp16(d);
    memcpy(dst, &h, 2);
    for (int i = 0; i < KV_Q8_BLOCK; i++) {
        dst[2 + i] = (uint8_t)(int8_t)__builtin_roundf(x[i] * id);   /* half away from zero, as roundf */
    }
}

static inline void q8_block_dequantize(const uint8_t *src, float *y) {
    uint16_t h;
    memcpy(&h, src, 2);
    const float d = fp16_to_f32(h);
    for (int i = 0; i < KV_Q8_BLOCK; i++) y[i] = (float)(int8_t)src[2 + i] * d;
}

#endif
