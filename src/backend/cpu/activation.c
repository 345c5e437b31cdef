/* cpu/activation.c — owns the gated activations: SwiGLU, silu(gate) * up, and GeGLU,
 * gelu_tanh(gate) * up; the plain scale of a vector, the bias add and the tanh soft cap. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

/* gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g * sigmoid(2y), y = sqrt(2/pi) (g + 0.044715 g^3), so
 * both gates are g / (1 + e^-x) * u with x = g (silu) or 2y (gelu): one expf each (GeGLU's
 * value is torch's gelu(approximate="tanh") up to rounding). */
#define GELU_2SQRT2PI 1.5957691216057308f
static inline float glu_one(llmi_act act, float g, float u) {
    const float x = act == LLMI_ACT_GELU_TANH ? GELU_2SQRT2PI * (g + 0.044715f * g * g * g) : g;
    return g / (1.0f + expf(-x)) * u;
}

static void glu_range(llmi_act act, const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    size_t i = i0;
#if defined(__AVX512F__)
    /* the scalar formula's float operations on 16 lanes, with vec_expf16 giving expf's
     * bits, so results are identical; a vector with a lane outside |x| < 88 (or NaN)
     * takes the scalar path */
    const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(88.0f), c = _mm512_set1_ps(0.044715f);
    const __m512 k = _mm512_set1_ps(GELU_2SQRT2PI);
    const bool gelu = act == LLMI_ACT_GELU_TANH;
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 x = gelu ? _mm512_mul_ps(k, _mm512_add_ps(g, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(c, g), g), g))) : g;
        if (_mm512_cmp_ps_mask(_mm512_abs_ps(x), lim, _CMP_NLT_UQ)) {
            for (size_t j = i; j < i + 16; j++) out[j] = glu_one(act, gate[j], up[j]);
            continue;
        }
        __m512 e = vec_expf16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i < i1; i++) out[i] = glu_one(act, gate[i], up[i]);
}

static void glu(llmi_act act, const float *gate, const float *up, int n, int d, float *out) {
    size_t total = (size_t)n * (size_t)d, chunk = 4096;
    size_t nc = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (size_t ci = 0; ci < nc; ci++)
        glu_range(act, gate, up, ci * chunk, (ci + 1) * chunk < total ? (ci + 1) * chunk : total, out);
}

void cpu_swiglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    glu_range(LLMI_ACT_SILU, gate, up, i0, i1, out);
}
void cpu_geglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    glu_range(LLMI_ACT_GELU_TANH, gate, up, i0, i1, out);
}
void cpu_glu_range(llmi_act act, const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    glu_range(act, gate, up, i0, i1, out);
}
void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out) { glu(LLMI_ACT_SILU, gate, up, n, d, out); }
void cpu_geglu(const float *gate, const float *up, int n, int d, float *out) {
    glu(LLMI_ACT_GELU_TANH, gate, up, n, d, out);
}

void cpu_scale(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void cpu_add_bias(float *y, int n, int cols, const float *bias) {
    for (int t = 0; t < n; t++)
        for (int c = 0; c < cols; c++) y[(size_t)t * cols + c] += bias[c];
}

void cpu_logits_finish(float *y, int n, int stride, int c0, int c1, float divisor, float cap) {
    for (int t = 0; t < n; t++) {
        float *row = y + (size_t)t * stride + c0;
        if (divisor != 1.0f)   /* divided, as transformers' Granite: x * (1 / d) rounds differently */
            for (int j = 0; j < c1 - c0; j++) row[j] /= divisor;
        if (cap > 0) vec_softcap(row, c1 - c0, cap);
    }
}
