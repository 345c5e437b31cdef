/* cpu/norm.c — owns RMSNorm, the fused residual-add + RMSNorm, and the per-head q/k norm. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

void cpu_rmsnorm_row(const float *x, const float *w, int dim, float eps, float *out) {
    float ss = vec_dot_f32(x, x, dim) / (float)dim;
    float r = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < dim; i++) out[i] = x[i] * r * w[i];
}

void cpu_add_rmsnorm_row(float *residual, const float *delta, const float *w, int dim, float eps, float *out) {
    for (int i = 0; i < dim; i++) residual[i] += delta[i];
    cpu_rmsnorm_row(residual, w, dim, eps, out);
}

void cpu_rmsnorm(const float *x, const float *w, int n, int dim, float eps, float *out) {
#pragma omp parallel for schedule(static) if (n > 16)
    for (int t = 0; t < n; t++) cpu_rmsnorm_row(x + (size_t)t * dim, w, dim, eps, out + (size_t)t * dim);
}

void cpu_add_rmsnorm(float *residual, const float *delta, const float *w, int n, int dim, float eps, float *out) {
#pragma omp parallel for schedule(static) if (n > 16)
    for (int t = 0; t < n; t++)
        cpu_add_rmsnorm_row(residual + (size_t)t * dim, delta + (size_t)t * dim, w, dim, eps, out + (size_t)t * dim);
}

void cpu_head_rmsnorm(float *x, int64_t stride, int n, int h0, int h1, int head_dim, const float *w, float eps) {
    for (int t = 0; t < n; t++)
        for (int h = h0; h < h1; h++) {
            float *r = x + (size_t)t * stride + (size_t)h * head_dim;
            cpu_rmsnorm_row(r, w, head_dim, eps, r);
        }
}
