/* quant_awq.c — owns the AWQ algorithm (Lin et al.; mit-han-lab/llm-awq auto_scale.py,
 * auto_clip.py): per scaling group, the grid search over alpha for input-channel
 * scales s = mean|x|^alpha, folded into the previous op, then the per-(row, group)
 * clipping search.  Output errors are measured exactly over every calibration token
 * through the input Gram matrix H = X^T X / n:  |X d|^2 / n = d^T H d. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/awq.h"
#include "quant/linalg.h"

/* sum over rows of d_r^T H d_r for d (rows, cols), H (cols, cols); NAN when out of memory. */
static double awq_quad(const float *d, int rows, int cols, const float *h, float *tmp) {
    memset(tmp, 0, (size_t)rows * cols * sizeof(float));
    if (quant_gemm_sub_f(rows, cols, cols, d, cols, h, cols, false, false, tmp, cols)) return NAN;   /* tmp = -d H */
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t i = 0; i < (size_t)rows * cols; i++) s -= (double)d[i] * tmp[i];
    return s;
}

/* w (rows, cols) -> wq (rows, cols) dequantized AWQ-style RTN of w. */
static void awq_fake_quant(const float *w, int rows, int cols, int gs, float *wq) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int g = 0; g < cols / gs; g++) {
            const float *x = w + (size_t)r * cols + (size_t)g * gs;
            uint16_t sh;
            uint8_t z;
            quant_group_params(x, gs, false, QUANT_STYLE_AWQ, &sh, &z);
            float s = fp16_to_f32(sh);
            for (int k = 0; k < gs; k++) wq[(size_t)r * cols + (size_t)g * gs + k] = s * (float)(quant_q(x[k], s, z) - z);
        }
}

void quant_awq_scales(const float *x_mean, int cols, float alpha, float *s) {
    float mx = 0, mn = INFINITY;
    for (int k = 0; k < cols; k++) {
        s[k] = fmaxf(powf(x_mean[k], alpha), 1e-4f);
        mx = fmaxf(mx, s[k]), mn = fminf(mn, s[k]);
    }
    float norm = sqrtf(mx * mn);
    for (int k = 0; k < cols; k++) s[k] /= norm;
}

int quant_awq_search_scale(float *const *ws, const int *rows, int n_lin, int cols, const float *x_mean,
                           const float *h, int group_size, int n_grid, float *best_s, double *best_loss,
                           llmi_status *st) {
    int total = 0, maxr = 0;
    for (int i = 0; i < n_lin; i++) total += rows[i], maxr = rows[i] > maxr ? rows[i] : maxr;
    float *d = malloc((size_t)total * cols * sizeof(float));   /* (total rows, cols) weight errors */
    float *tmp = malloc((size_t)total * cols * sizeof(float)); /* (total rows, cols) d @ H */
    float *sw = malloc((size_t)maxr * cols * sizeof(float));   /* (rows, cols) scaled weights */
    float *s = malloc((size_t)cols * sizeof(float));           /* (cols) */
    if (!d || !tmp || !sw || !s) {
        free(d), free(tmp), free(sw), free(s);
        return llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory in the scale search");
    }
    double best = INFINITY;
    for (int a = 0; a < n_grid; a++) {
        quant_awq_scales(x_mean, cols, (float)a / (float)n_grid, s);
        size_t off = 0;
        for (int i = 0; i < n_lin; i++) {
            for (int r = 0; r < rows[i]; r++)
                for (int k = 0; k < cols; k++) sw[(size_t)r * cols + k] = ws[i][(size_t)r * cols + k] * s[k];
            awq_fake_quant(sw, rows[i], cols, group_size, d + off);
            for (int r = 0; r < rows[i]; r++)
                for (int k = 0; k < cols; k++) {
                    size_t j = off + (size_t)r * cols + k;
                    d[j] = ws[i][(size_t)r * cols + k] - d[j] / s[k];
                }
            off += (size_t)rows[i] * cols;
        }
        double loss = awq_quad(d, total, cols, h, tmp);
        if (isnan(loss)) {
            free(d), free(tmp), free(sw), free(s);
            return llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory in the scale search");
        }
        if (loss < best) {
            best = loss;
            memcpy(best_s, s, (size_t)cols * sizeof(float));
        }
    }
    *best_loss = best;
    free(d), free(tmp), free(sw), free(s);
    return 0;
}

void quant_awq_h_blocks(const float *h, int cols, int gs, float *hb) {
    for (int g = 0; g < cols / gs; g++)
        for (int a = 0; a < gs; a++)
            memcpy(hb + ((size_t)g * gs + a) * gs, h + ((size_t)g * gs + a) * cols + (size_t)g * gs,
                   (size_t)gs * sizeof(float));
}

void quant_awq_clip_search(const float *w, int rows, int cols, const float *hb, int group_size, int n_shrink,
                           float *best_mv) {
    int ng = cols / group_size;
#pragma omp parallel
    {
        float *d = malloc((size_t)group_size * sizeof(float));              /* (gs) */
        float *cw = malloc((size_t)group_size * sizeof(float));             /* (gs) clipped weights */
#pragma omp for collapse(2) schedule(static)
        for (int g = 0; g < ng; g++)
            for (int r = 0; r < rows; r++) {
                const float *x = w + (size_t)r * cols + (size_t)g * group_size;
                const float *hg = hb + (size_t)g * group_size * group_size;   /* (gs, gs) */
                float amax = 0;
                for (int k = 0; k < group_size; k++) amax = fmaxf(amax, fabsf(x[k]));
                best_mv[(size_t)r * ng + g] = amax;   /* (also what an allocation failure leaves) */
                if (!d || !cw) continue;
                double best = INFINITY;
                for (int i = 0; i < n_shrink; i++) {
                    float mv = amax * (1.0f - (float)i / 20.0f);
                    for (int k = 0; k < group_size; k++) cw[k] = fminf(fmaxf(x[k], -mv), mv);
                    uint16_t sh;
                    uint8_t z;
                    quant_group_params(cw, group_size, false, QUANT_STYLE_AWQ, &sh, &z);
                    float s = fp16_to_f32(sh);
                    for (int k = 0; k < group_size; k++) d[k] = x[k] - s * (float)(quant_q(cw[k], s, z) - z);
                    double loss = 0;
                    for (int a = 0; a < group_size; a++) {
                        double t = 0;
                        for (int b = 0; b < group_size; b++) t += (double)hg[(size_t)a * group_size + b] * d[b];
                        loss += t * d[a];
                    }
                    if (loss < best) best = loss, best_mv[(size_t)r * ng + g] = mv;
                }
            }
        free(d), free(cw);
    }
}

void quant_awq_clip_apply(float *w, int rows, int cols, int group_size, const float *best_mv) {
    const int ng = cols / group_size;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) {
            const float mv = best_mv[(size_t)r * ng + k / group_size];
            float *x = w + (size_t)r * cols + k;
            *x = fminf(fmaxf(*x, -mv), mv);
        }
}

int quant_awq_clip(float *w, int rows, int cols, const float *h, int group_size, int n_shrink, llmi_status *st) {
    float *best_mv = malloc((size_t)rows * (cols / group_size) * sizeof(float)); /* (rows, groups) */
    float *hb = malloc((size_t)cols * group_size * sizeof(float));               /* (groups, gs, gs) */
    if (!best_mv || !hb) {
        free(best_mv), free(hb);
        return llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory for a %dx%d clipping search", rows, cols);
    }
    quant_awq_h_blocks(h, cols, group_size, hb);
    quant_awq_clip_search(w, rows, cols, hb, group_size, n_shrink, best_mv);
    quant_awq_clip_apply(w, rows, cols, group_size, best_mv);
    free(best_mv), free(hb);
    return 0;
}
