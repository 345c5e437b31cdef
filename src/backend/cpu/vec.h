/* cpu/vec.h — owns the small vector helpers the CPU op families share: fp32 dot
 * products and conversions between fp32 and the KV cache dtypes.  Each has an
 * AVX-512 body and a portable scalar body chosen at compile time (-march=native);
 * one build always uses the same body, so results never depend on batch shape. */
#ifndef LLMI_CPU_VEC_H
#define LLMI_CPU_VEC_H

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

/* dst (n) fp32 <- src (n) in the KV dtype. */
static inline void vec_kv_to_f32(const void *src, llmi_kv_dtype t, float *dst, int n) {
    if (t == LLMI_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
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

/* dst (n) in the KV dtype <- src (n) fp32, round to nearest even. */
static inline void vec_f32_to_kv(const float *src, llmi_kv_dtype t, void *dst, int n) {
    if (t == LLMI_KV_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *h = (uint16_t *)dst;
    for (int i = 0; i < n; i++) h[i] = t == LLMI_KV_F16 ? f32_to_fp16(src[i]) : f32_to_bf16(src[i]);
}

#endif
