/* cpu/activation.c — owns the SwiGLU gate: silu(gate) * up. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

static inline float swiglu_one(float g, float u) { return g / (1.0f + expf(-g)) * u; }

void cpu_swiglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    size_t i = i0;
#if defined(__AVX512F__)
    /* the scalar formula's float operations on 16 lanes, with vec_expf16 giving expf's
     * bits, so results are identical; a vector with a lane outside |g| < 88 (or NaN)
     * takes the scalar path */
    const __m512 one = _mm512_set1_ps(1.0f), lim = _mm512_set1_ps(88.0f);
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        if (_mm512_cmp_ps_mask(_mm512_abs_ps(g), lim, _CMP_NLT_UQ)) {
            for (size_t j = i; j < i + 16; j++) out[j] = swiglu_one(gate[j], up[j]);
            continue;
        }
        __m512 e = vec_expf16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN))));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i < i1; i++) out[i] = swiglu_one(gate[i], up[i]);
}

void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out) {
    size_t total = (size_t)n * (size_t)d, chunk = 4096;
    size_t nc = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (size_t c = 0; c < nc; c++) cpu_swiglu_range(gate, up, c * chunk, (c + 1) * chunk < total ? (c + 1) * chunk : total, out);
}
