/* cpu/activation.c — owns the SwiGLU gate: silu(gate) * up. */
#include <math.h>
#include "backend/cpu/ops.h"

void cpu_swiglu(const float *gate, const float *up, int n, int d, float *out) {
    size_t total = (size_t)n * (size_t)d;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (size_t i = 0; i < total; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
