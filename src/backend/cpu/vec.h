/* cpu/vec.h — owns the small vector helpers the CPU op families share: fp32 dot
 * products and conversions between fp32 and the KV cache dtypes.  Each has an
 * AVX-512 body and a portable scalar body chosen at compile time (-march=native);
 * one build always uses the same body, so results never depend on batch shape. */
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
    for (int i = 0; i < n; i++) h[i] = t == LLMI_KV_F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
}

#endif
