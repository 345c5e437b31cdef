/* cpu/moe.c — owns mixture-of-experts routing (which experts each token goes to and with
 * what weight) and the data movement around the experts' matmuls, which are the backend's
 * ordinary ones on gathered rows: the twins of kernels/moe.cu. */
#include <math.h>
#include <string.h>
#include "backend/cpu/ops.h"

void cpu_moe_route(const float *logits, int n, int n_experts, int k, bool norm, int32_t *experts, float *weights) {
#pragma omp parallel for schedule(static) if (n > 64)
    for (int t = 0; t < n; t++) {
        const float *lg = logits + (size_t)t * n_experts;
        int32_t *sel = experts + (size_t)t * k;
        float *w = weights + (size_t)t * k;
        float mx = lg[0];
        for (int e = 1; e < n_experts; e++) mx = fmaxf(mx, lg[e]);
        double sum = 0;   /* the softmax's denominator; the top k are picked on the logits, the same order */
        for (int e = 0; e < n_experts; e++) sum += expf(lg[e] - mx);
        /* selection by insertion into the k best so far (descending logit, the lower expert
         * first on a tie); k is small (2-8) */
        int kept = 0;
        for (int e = 0; e < n_experts; e++) {
            int at = kept < k ? kept : k;
            while (at > 0 && lg[sel[at - 1]] < lg[e]) at--;
            if (at >= k) continue;
            for (int j = (kept < k ? kept : k - 1); j > at; j--) sel[j] = sel[j - 1];
            sel[at] = e;
            if (kept < k) kept++;
        }
        float total = 0;
        for (int j = 0; j < k; j++) {
            w[j] = (float)(expf(lg[sel[j]] - mx) / sum);
            total += w[j];
        }
        if (norm)
            for (int j = 0; j < k; j++) w[j] /= total;
        /* ascending expert order, the order the MLP output sums them in */
        for (int i = 1; i < k; i++)
            for (int j = i; j > 0 && sel[j - 1] > sel[j]; j--) {
                int32_t e = sel[j]; sel[j] = sel[j - 1]; sel[j - 1] = e;
                float x = w[j]; w[j] = w[j - 1]; w[j - 1] = x;
            }
    }
}

void cpu_gather_rows(const float *x, int64_t width, const int32_t *rows, int m, float *out) {
    for (int i = 0; i < m; i++) memcpy(out + (size_t)i * width, x + (size_t)rows[i] * width, (size_t)width * sizeof(float));
}

void cpu_moe_combine(const float *y, const int32_t *row, const float *weights, int n, int k, int dim, int64_t j0,
                     int64_t j1, float *out) {
    for (int t = 0; t < n; t++) {
        float *d = out + (size_t)t * dim;
        for (int64_t j = j0; j < j1; j++) d[j] = 0.0f;
        for (int q = 0; q < k; q++) {
            const float *yr = y + (size_t)row[(size_t)t * k + q] * dim, w = weights[(size_t)t * k + q];
            for (int64_t j = j0; j < j1; j++) d[j] += yr[j] * w;
        }
    }
}
