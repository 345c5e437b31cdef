/* gptq.c — owns the GPTQ algorithm (Frantar et al.; IST-DASLab/gptq gptq.py) for one
 * linear layer, in two steps: quant_gptq_prepare conditions the Hessian and factors its
 * inverse once for every linear that shares it (q/k/v, gate/up), and quant_gptq_apply
 * walks one weight matrix's columns with error feedback in lazy blocks.  Rows are
 * independent given Hinv: the in-block walk runs across OpenMP threads by rows, the
 * lazy update of the later columns is one blocked GEMM per block (linalg.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/linalg.h"
#include "quant/quant.h"

static int gptq_cmp_desc(const void *a, const void *b, void *ctx) {
    const float *d = ctx;
    int i = *(const int *)a, j = *(const int *)b;
    if (d[i] > d[j]) return -1;
    if (d[i] < d[j]) return 1;
    return i - j; /* stable, like torch.argsort on ties in practice */
}

void quant_gptq_hinv_free(quant_gptq_hinv *hv) {
    free(hv->perm), free(hv->dead), free(hv->u);
    memset(hv, 0, sizeof *hv);
}

/* The upper Cholesky factor U of H^-1 (H^-1 = U^T U) by the reversal identity: with J
 * the reversal, J H J = L L^T gives U = J L^-1 J — one factorisation and one triangular
 * inverse, in place in one fp64 buffer a (n, n) that already holds J H J.  U replaces a
 * as fp32 (a is shrunk to n*n floats and returned). */
static float *gptq_hinv_upper(double *a, int n, int *rc) {
    if ((*rc = quant_cholesky_d(a, n))) return NULL;
    if (quant_trinv_lower_d(a, n)) {
        *rc = -1;
        return NULL;
    }
    /* J X J of a row-major matrix is its flat reversal; then fp64 -> fp32 front to back
     * (float e overwrites bytes 4e.., double e sits at 8e: never ahead of the reader). */
    size_t nn = (size_t)n * n;
    for (size_t i = 0, j = nn - 1; i < j; i++, j--) {
        double t = a[i];
        a[i] = a[j], a[j] = t;
    }
    float *u = (float *)a;
    for (size_t i = 0; i < nn; i++) u[i] = (float)a[i];
    float *shrunk = realloc(a, nn * sizeof(float));
    return shrunk ? shrunk : u;
}

int quant_gptq_order(const float *h_diag, int cols, const quant_gptq_opts *o, quant_gptq_hinv *hv, double *mean_diag,
                     llmi_status *st) {
    memset(hv, 0, sizeof *hv);
    hv->cols = cols;
    hv->perm = malloc((size_t)cols * sizeof(int));
    hv->dead = calloc((size_t)cols, sizeof(bool));
    float *diag = malloc((size_t)cols * sizeof(float)); /* (cols) */
    if (!hv->perm || !hv->dead || !diag) {
        free(diag);
        quant_gptq_hinv_free(hv);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for a %dx%d Hessian", cols, cols);
    }
    /* Inputs that never fire carry no information: pin them (H_kk = 1), drop their weights. */
    for (int k = 0; k < cols; k++) {
        diag[k] = h_diag[k];
        hv->perm[k] = k;
        if (diag[k] == 0.0f) hv->dead[k] = true, diag[k] = 1.0f;
    }
    if (o->desc_act) qsort_r(hv->perm, (size_t)cols, sizeof(int), gptq_cmp_desc, diag);
    double mean = 0.0;
    for (int k = 0; k < cols; k++) mean += diag[k];
    *mean_diag = mean / cols;
    free(diag);
    return 0;
}

int quant_gptq_prepare(const float *h, int cols, const quant_gptq_opts *o, quant_gptq_hinv *hv, llmi_status *st) {
    double mean;
    float *h_diag = malloc((size_t)cols * sizeof(float)); /* (cols) */
    if (!h_diag) return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for a %dx%d Hessian", cols, cols);
    for (int k = 0; k < cols; k++) h_diag[k] = h[(size_t)k * cols + k];
    int order_rc = quant_gptq_order(h_diag, cols, o, hv, &mean, st);
    free(h_diag);
    if (order_rc) return st->code;
    double *a = malloc((size_t)cols * cols * sizeof(double)); /* (cols, cols) J P^T H P J, then U */
    if (!a) {
        quant_gptq_hinv_free(hv);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for a %dx%d Hessian", cols, cols);
    }
    double damp = o->damp_percent > 0 ? o->damp_percent : 0.01;
    int rc = 1;
    const int *perm = hv->perm;
    for (int attempt = 0; attempt < 6 && rc == 1; attempt++, damp *= 10.0) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < cols; i++) {
            int pi = perm[cols - 1 - i];
            double *ai = a + (size_t)i * cols;
            for (int j = 0; j < cols; j++) ai[j] = h[(size_t)pi * cols + perm[cols - 1 - j]];
            ai[i] = (hv->dead[pi] ? 1.0 : ai[i]) + damp * mean;
        }
        hv->u = gptq_hinv_upper(a, cols, &rc);
    }
    if (rc) {
        free(a);
        quant_gptq_hinv_free(hv);
        if (rc < 0) return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory factoring a %dx%d Hessian", cols, cols);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: Hessian of a %dx%d layer is not positive definite even with "
                         "dampening %.3g", cols, cols, damp / 10.0);
    }
    hv->damp = (float)(damp / 10.0);
    return 0;
}

int quant_gptq_apply(const float *w, int rows, const quant_gptq_hinv *hv, const quant_gptq_opts *o, quant_grid *g,
                     double *err, llmi_status *st) {
    const int cols = hv->cols, gs = o->group_size;
    const int bs = o->block_size > 0 && o->block_size <= 128 ? o->block_size : 128;
    const int *perm = hv->perm;
    const float *u = hv->u;
    if (quant_grid_alloc(g, rows, cols, gs, o->desc_act, st)) return st->code;
    float *wp = malloc((size_t)rows * cols * sizeof(float)); /* (rows, cols) permuted working weights */
    float *eb = malloc((size_t)rows * bs * sizeof(float));   /* (rows, bs) scaled errors of the current block */
    float *s = malloc((size_t)rows * sizeof(float));         /* (rows) scale of each row's current group */
    int *z = malloc((size_t)rows * sizeof(int));             /* (rows) its zero */
    if (!wp || !eb || !s || !z) {
        free(wp), free(eb), free(s), free(z);
        quant_grid_free(g);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for a %dx%d layer", rows, cols);
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols; k++) wp[(size_t)r * cols + k] = hv->dead[perm[k]] ? 0.0f : w[(size_t)r * cols + perm[k]];
    /* Group of each processing position: fixed by position, so act-order groups are
     * contiguous in processing order and g_idx maps original columns to them. */
    if (g->g_idx)
        for (int i = 0; i < cols; i++) g->g_idx[perm[i]] = i / gs;
    double total = 0.0;
    int rc = 0;
    for (int i1 = 0; i1 < cols && !rc; i1 += bs) {
        const int i2 = i1 + bs < cols ? i1 + bs : cols, nb = i2 - i1;
#pragma omp parallel for schedule(static) reduction(+ : total)
        for (int r = 0; r < rows; r++) {
            float *wr = wp + (size_t)r * cols, *er = eb + (size_t)r * nb;
            for (int i = i1; i < i2; i++) {
                const float *urow = u + (size_t)i * cols;
                if (i % gs == 0) {
                    /* group parameters from the already-updated weights of the group */
                    uint16_t sh;
                    uint8_t zz;
                    quant_group_params(wr + i, gs, o->sym, QUANT_STYLE_GPTQ, &sh, &zz);
                    g->scales[(size_t)(i / gs) * rows + r] = sh;
                    g->zeros[(size_t)(i / gs) * rows + r] = zz;
                    s[r] = fp16_to_f32(sh);
                    z[r] = zz;
                }
                int q = quant_q(wr[i], s[r], z[r]);
                g->q[(size_t)r * cols + perm[i]] = (uint8_t)q;
                float e = (wr[i] - s[r] * (float)(q - z[r])) / urow[i];
                total += (double)e * e;
                er[i - i1] = e;
                for (int j = i + 1; j < i2; j++) wr[j] -= e * urow[j];
            }
        }
        /* Lazy update: the block's errors reach the later columns in one GEMM. */
        if (i2 < cols)
            rc = quant_gemm_sub_f(rows, cols - i2, nb, eb, nb, u + (size_t)i1 * cols + i2, cols, false, false, wp + i2,
                                  cols);
    }
    free(wp), free(eb), free(s), free(z);
    if (rc) {
        quant_grid_free(g);
        return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory for the lazy update of a %dx%d layer", rows, cols);
    }
    *err = total / 2.0;
    return 0;
}

int quant_gptq(const float *w, int rows, int cols, const float *h, const quant_gptq_opts *o, quant_grid *g,
               double *err, llmi_status *st) {
    quant_gptq_hinv hv;
    if (quant_gptq_prepare(h, cols, o, &hv, st)) return st->code;
    int rc = quant_gptq_apply(w, rows, &hv, o, g, err, st);
    quant_gptq_hinv_free(&hv);
    return rc;
}
