/* quant_gptq.c — owns the GPTQ algorithm (Frantar et al.; IST-DASLab/gptq gptq.py) for
 * one linear layer: Hessian conditioning, the upper Cholesky factor of its inverse, and
 * the column walk with error feedback in lazy blocks.  Rows are independent given
 * Hinv, so rows are processed in tiles across OpenMP threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/quant.h"

#define GPTQ_ROW_TILE 8

/* In-place lower Cholesky of a (n, n) SPD matrix, row by row so every inner loop is a
 * contiguous dot product; returns 0 or -1 when not positive definite. */
static int gptq_cholesky(double *a, int n) {
    for (int i = 0; i < n; i++) {
        double *ai = a + (size_t)i * n;
        for (int j = 0; j <= i; j++) {
            const double *aj = a + (size_t)j * n;
            double s = ai[j];
            for (int k = 0; k < j; k++) s -= ai[k] * aj[k];
            if (j < i) {
                ai[j] = s / aj[j];
            } else {
                if (!(s > 0.0)) return -1;
                ai[i] = sqrt(s);
            }
        }
        for (int j = i + 1; j < n; j++) ai[j] = 0.0;
    }
    return 0;
}

/* Upper factor U of H^-1 (H^-1 = U^T U) by the reversal identity: with J the
 * reversal, J H J = L L^T gives U = J L^-1 J — one factorisation and one triangular
 * inverse instead of the reference's three steps.  h (n, n) in, u (n, n) out. */
static int gptq_hinv_upper(const double *h, int n, double *u) {
    double *l = malloc((size_t)n * n * sizeof(double)); /* (n, n) */
    if (!l) return -2;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) l[(size_t)i * n + j] = h[(size_t)(n - 1 - i) * n + (n - 1 - j)];
    if (gptq_cholesky(l, n)) {
        free(l);
        return -1;
    }
    /* inv = L^-1 row by row: row i = (e_i - sum_{k<i} L[i][k] inv[k]) / L[i][i], each a
     * contiguous axpy over the already finished rows. */
    double *inv = calloc((size_t)n * n, sizeof(double)); /* (n, n) lower */
    if (!inv) {
        free(l);
        return -2;
    }
    for (int i = 0; i < n; i++) {
        double *xi = inv + (size_t)i * n;
        const double *li = l + (size_t)i * n;
        xi[i] = 1.0;
        for (int k = 0; k < i; k++) {
            double f = li[k];
            const double *xk = inv + (size_t)k * n;
            for (int c = 0; c <= k; c++) xi[c] -= f * xk[c];
        }
        double d = 1.0 / li[i];
        for (int c = 0; c <= i; c++) xi[c] *= d;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) u[(size_t)i * n + j] = inv[(size_t)(n - 1 - i) * n + (n - 1 - j)];
    free(inv);
    free(l);
    return 0;
}

static int gptq_cmp_desc(const void *a, const void *b, void *ctx) {
    const float *d = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (d[i] > d[j]) return -1;
    if (d[i] < d[j]) return 1;
    return i - j; /* stable, like torch.argsort on ties in practice */
}

int quant_gptq(const float *w, int rows, int cols, float *h, const quant_gptq_opts *o, quant_grid *g, double *err,
               llmi_status *st) {
    int gs = o->group_size, bs = o->block_size > 0 && o->block_size <= 128 ? o->block_size : 128;
    if (quant_grid_alloc(g, rows, cols, gs, o->desc_act, st)) return st->code;
    int *perm = malloc((size_t)cols * sizeof(int));          /* (cols) processing order -> column */
    float *diag = malloc((size_t)cols * sizeof(float));      /* (cols) */
    float *wp = malloc((size_t)rows * cols * sizeof(float)); /* (rows, cols) permuted working weights */
    double *hp = malloc((size_t)cols * cols * sizeof(double));  /* (cols, cols) permuted, damped H */
    double *ud = malloc((size_t)cols * cols * sizeof(double));  /* (cols, cols) upper chol of H^-1 */
    float *u = malloc((size_t)cols * cols * sizeof(float));     /* (cols, cols) same in fp32 */
    if (!perm || !diag || !wp || !hp || !ud || !u) {
        free(perm), free(diag), free(wp), free(hp), free(ud), free(u);
        quant_grid_free(g);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for a %dx%d layer", rows, cols);
    }
    for (int k = 0; k < cols; k++) {
        diag[k] = h[(size_t)k * cols + k];
        perm[k] = k;
    }
    /* Inputs that never fire carry no information: pin them and drop their weights. */
    bool *dead = calloc((size_t)cols, 1);
    for (int k = 0; k < cols && dead; k++)
        if (diag[k] == 0.0f) {
            dead[k] = true;
            h[(size_t)k * cols + k] = 1.0f;
            diag[k] = 1.0f;
        }
    if (o->desc_act) qsort_r(perm, (size_t)cols, sizeof(int), gptq_cmp_desc, diag);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++)
            wp[(size_t)r * cols + k] = (dead && dead[perm[k]]) ? 0.0f : w[(size_t)r * cols + perm[k]];
    free(dead);

    double mean = 0.0;
    for (int k = 0; k < cols; k++) mean += diag[k];
    mean /= cols;
    double damp = o->damp_percent > 0 ? o->damp_percent : 0.01;
    int rc = -1;
    for (int attempt = 0; attempt < 6 && rc == -1; attempt++, damp *= 10.0) {
        for (int i = 0; i < cols; i++)
            for (int j = 0; j < cols; j++) hp[(size_t)i * cols + j] = h[(size_t)perm[i] * cols + perm[j]];
        for (int i = 0; i < cols; i++) hp[(size_t)i * cols + i] += damp * mean;
        rc = gptq_hinv_upper(hp, cols, ud);
    }
    if (rc) {
        free(perm), free(diag), free(wp), free(hp), free(ud), free(u);
        quant_grid_free(g);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: Hessian of a %dx%d layer is not positive definite even with "
                         "dampening %.3g", rows, cols, damp / 10.0);
    }
    for (size_t i = 0; i < (size_t)cols * cols; i++) u[i] = (float)ud[i];
    free(hp);
    free(ud);

    /* Group of each processing position: fixed by position, so act-order groups are
     * contiguous in processing order and g_idx maps original columns to them. */
    if (g->g_idx)
        for (int i = 0; i < cols; i++) g->g_idx[perm[i]] = i / gs;
    double total = 0.0;
    int n_tiles = (rows + GPTQ_ROW_TILE - 1) / GPTQ_ROW_TILE;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : total)
    for (int t = 0; t < n_tiles; t++) {
        int r0 = t * GPTQ_ROW_TILE, r1 = r0 + GPTQ_ROW_TILE < rows ? r0 + GPTQ_ROW_TILE : rows;
        float errb[GPTQ_ROW_TILE][128]; /* (tile rows, block) scaled errors of the current block */
        float s[GPTQ_ROW_TILE];
        int z[GPTQ_ROW_TILE];
        for (int i1 = 0; i1 < cols; i1 += bs) {
            int i2 = i1 + bs < cols ? i1 + bs : cols;
            for (int i = i1; i < i2; i++) {
                float d = u[(size_t)i * cols + i];
                const float *urow = u + (size_t)i * cols;
                for (int r = r0; r < r1; r++) {
                    float *wr = wp + (size_t)r * cols;
                    if (i % gs == 0) {
                        uint16_t sh;
                        uint8_t zz;
                        quant_group_params(wr + i, gs, o->sym, QUANT_STYLE_GPTQ, &sh, &zz);
                        g->scales[(size_t)(i / gs) * rows + r] = sh;
                        g->zeros[(size_t)(i / gs) * rows + r] = zz;
                        s[r - r0] = fp16_to_f32(sh);
                        z[r - r0] = zz;
                    }
                    int q = quant_q(wr[i], s[r - r0], z[r - r0]);
                    g->q[(size_t)r * cols + perm[i]] = (uint8_t)q;
                    float wq = s[r - r0] * (float)(q - z[r - r0]);
                    float e = (wr[i] - wq) / d;
                    total += (double)e * e;
                    errb[r - r0][i - i1] = e;
                    for (int j = i + 1; j < i2; j++) wr[j] -= e * urow[j];
                }
            }
            /* Lazy update: the block's errors reach the later columns in one pass. */
            for (int r = r0; r < r1; r++) {
                float *wr = wp + (size_t)r * cols;
                for (int i = i1; i < i2; i++) {
                    float e = errb[r - r0][i - i1];
                    const float *urow = u + (size_t)i * cols;
#pragma omp simd
                    for (int j = i2; j < cols; j++) wr[j] -= e * urow[j];
                }
            }
        }
    }
    *err = total / 2.0;
    free(perm), free(diag), free(wp), free(u);
    return 0;
}
