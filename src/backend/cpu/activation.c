/* cpu/activation.c — owns the SwiGLU gate: silu(gate) * up. */
#include <math.h>
#include "backend/cpu/ops.h"

void cpu_swiglu_range(const float *gate, const float *up, size_t i0, size_t i1, float *out) {
    for (size_t i = i0; i < i1; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out) {
    size_t total = (size_t)n * (size_t)d, chunk = 4096;
    size_t nc = (total + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (size_t c = 0; c < nc; c++) cpu_swiglu_range(gate, up, c * chunk, (c + 1) * chunk < total ? (c + 1) * chunk : total, out);
}
