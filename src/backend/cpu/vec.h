/* cpu/vec.h — owns the small vector helpers the CPU op families share: fp32 dot
 * products, an expf bit-identical to glibc's, a tanh soft cap, and conversions between
 * fp32 and the KV cache dtypes.  Each has an AVX-512 body and a portable scalar body chosen at compile
 * time (-march=native); one build always uses the same body, so results never depend on
 * batch shape. */
#ifndef LLMI_CPU_VEC_H
#define LLMI_CPU_VEC_H

#include <math.h>
#include <stdint.h>
#include "backend/backend.h"
#include "core/dtype.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* sum a[i]*b[i], i < n, accumulated in 16 fixed lanes then reduced in a fixed order. */
static inline float vec_dot_f32(const float *a, const float *b, int n) {
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
#else
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
#endif
}

#if defined(__AVX512F__)
/* expf of 8 doubles holding floats with |x| < 88, in glibc's steps (ARM optimized-routines
 * expf, its x86-64 FMA build): x*32/ln2 = k + r, 2^(k/32) from a 32-entry table scaled by
 * k's integer part, times a cubic in r, rounded to float by the caller.  Bit-identical to
 * expf on every float of that range (all 2.24e9 compared on this machine's glibc); the
 * table is 2^(i/32) rounded to double, minus i << 47 so that adding k << 47 scales it. */
static inline __m512d vec_expf_pd(__m512d xd) {
    static const uint64_t tab[32] = {
        0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
        0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
        0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
        0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
        0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da, 0x3fefd0765b6e4540};
    const __m512d inv_ln2_32 = _mm512_set1_pd(0x1.71547652b82fep+0 * 32), shift = _mm512_set1_pd(0x1.8p+52);
    __m512d kd = _mm512_fmadd_pd(inv_ln2_32, xd, shift);         /* k in the low mantissa bits */
    __m512i ki = _mm512_castpd_si512(kd);
    kd = _mm512_sub_pd(kd, shift);
    __m512d r = _mm512_fmsub_pd(inv_ln2_32, xd, kd);              /* in [-1/2, 1/2] */
    __m512i t01 = _mm512_loadu_si512(tab), t23 = _mm512_loadu_si512(tab + 8);
    __m512i t45 = _mm512_loadu_si512(tab + 16), t67 = _mm512_loadu_si512(tab + 24);
    __m512i lo = _mm512_permutex2var_epi64(t01, ki, t23), hi = _mm512_permutex2var_epi64(t45, ki, t67);
    __mmask8 upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    __m512i t = _mm512_add_epi64(_mm512_mask_mov_epi64(lo, upper, hi), _mm512_slli_epi64(ki, 47));
    __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
    return _mm512_mul_pd(y, _mm512_castsi512_pd(t));
}

/* expf of 16 floats, each |x| < 88 (callers send the others to expf). */
static inline __m512 vec_expf16(__m512 x) {
    __m256 lo = _mm512_cvtpd_ps(vec_expf_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    __m256 hi = _mm512_cvtpd_ps(vec_expf_pd(_mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
#endif

#if defined(__AVX512F__)
/* tanh of 16 floats as Cephes tanhf computes it: below 0.625 in magnitude the odd polynomial
 * x + x^3 P(x^2), above it 1 - 2 / (e^(2|x|) + 1) with the sign of x (|x| clamped at 9,
 * where tanh rounds to 1); within ~2.4e-7 relative of tanh. */
static inline __m512 vec_tanh16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f), z = _mm512_abs_ps(x);
    const __m512 zc = _mm512_min_ps(z, _mm512_set1_ps(9.0f));
    const __m512 e = vec_expf16(_mm512_add_ps(zc, zc));
    __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
    big = _mm512_mask_sub_ps(big, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), big);
    const __m512 s2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(-5.70498872745E-3f), s2, _mm512_set1_ps(2.06390887954E-2f));
    p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(-5.37397155531E-2f));
    p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(1.33314422036E-1f));
    p = _mm512_fmadd_ps(p, s2, _mm512_set1_ps(-3.33332819422E-1f));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, s2), x, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, _mm512_set1_ps(0.625f), _CMP_LT_OQ), big, small);
}
#endif

/* x[i] = cap * tanh(x[i] / cap), i < n (a soft cap: Gemma 2's scores and logits); the
 * portable body is tanhf itself. */
static inline void vec_softcap(float *x, int n, float cap) {
#if defined(__AVX512F__)
    const __m512 vc = _mm512_set1_ps(cap);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), vc);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(vc, vec_tanh16(v)));
    }
#else
    for (int i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
#endif
}

/* y[i] = y[i]*c + p*x[i] (the online-softmax rescale and accumulate in one pass). */
static inline void vec_scale_axpy(float *y, float c, float p, const float *x, int n) {
#if defined(__AVX512F__)
    __m512 vc = _mm512_set1_ps(c), vp = _mm512_set1_ps(p);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vp, _mm512_loadu_ps(x + i), _mm512_mul_ps(vc, _mm512_loadu_ps(y + i))));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 r = _mm512_fmadd_ps(vp, _mm512_maskz_loadu_ps(m, x + i), _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(m, y + i)));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
#else
    for (int i = 0; i < n; i++) y[i] = y[i] * c + p * x[i];
#endif
}

/* dst (n) fp32 <- src (n values, kv_dtype_row_bytes(t, n) bytes) in the KV dtype; scale
 * multiplies fp8 values (the (layer, head) scale), the other dtypes ignore it. */
static inline void vec_kv_to_f32(const void *src, llmi_kv_dtype t, float scale, float *dst, int n) {
    if (t == LLMI_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (t == LLMI_KV_Q8) {
        for (int b = 0; b < n / KV_Q8_BLOCK; b++)
            q8_block_dequantize((const uint8_t *)src + (size_t)b * KV_Q8_BLOCK_BYTES, dst + (size_t)b * KV_Q8_BLOCK);
        return;
    }
    if (t == LLMI_KV_FP8) {
        const uint8_t *e = (const uint8_t *)src;
        for (int i = 0; i < n; i++) dst[i] = e4m3_to_f32(e[i]) * scale;
        return;
    }
    const uint16_t *h = (const uint16_t *)src;
    int i = 0;
#if defined(__AVX512F__)
    if (t == LLMI_KV_F16) {
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    } else {
        for (; i + 16 <= n; i += 16) {
            __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    }
#endif
    for (; i < n; i++) dst[i] = t == LLMI_KV_F16 ? fp16_to_f32(h[i]) : bf16_to_f32(h[i]);
}

/* dst (kv_dtype_row_bytes(t, n)) in the KV dtype <- src (n) fp32, round to nearest even
 * (q8: llama.cpp's q8_0 rounding); fp8 stores src / scale. */
static inline void vec_f32_to_kv(const float *src, llmi_kv_dtype t, float scale, void *dst, int n) {
    if (t == LLMI_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    if (t == LLMI_KV_Q8) {
        for (int b = 0; b < n / KV_Q8_BLOCK; b++)
            q8_block_quantize(src + (size_t)b * KV_Q8_BLOCK, (uint8_t *)dst + (size_t)b * KV_Q8_BLOCK_BYTES);
        return;
    }
    if (t == LLMI_KV_FP8) {
        uint8_t *e = (uint8_t *)dst;
        const float inv = 1.0f / scale;
        for (int i = 0; i < n; i++) e[i] = f32_to_e4m3(src[i] * inv);
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    int i = 0;
#if defined(__AVX512F__)
    /* f32_to_fp16 / f32_to_bf16's bits 16 values at a time (vcvtps2ph rounds to nearest
     * even as they do; bf16 is their integer rounding); a vector holding a NaN takes the
     * scalar path, whose quiet-NaN pattern the hardware's payload-keeping one is not */
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(src + i);
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
            for (int j = i; j < i + 16; j++) h[j] = t == LLMI_KV_F16 ? f32_to_fp16(src[j]) : f32_to_bf16(src[j]);
            continue;
        }
        __m256i r;
        if (t == LLMI_KV_F16) {
            r = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
            __m512i x = _mm512_castps_si512(v);
            __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
            x = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
            r = _mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16));
        }
        _mm256_storeu_si256((__m256i *)(h + i), r);
    }
#endif
    for (; i < n; i++) h[i] = t == LLMI_KV_F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
}

#endif
