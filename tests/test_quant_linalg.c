/* test_quant_linalg.c — the quantizer's blocked linear algebra (quant/linalg.h) against
 * plain loops in double on fresh random inputs, at sizes that are not multiples of any
 * block or tile (so every edge path runs): the Gram matrix, C -= A B in both layouts and
 * with a lower-triangular B, the Cholesky factor and the triangular inverse. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/linalg.h"
#include "test.h"

static double tl_rand(unsigned long long *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return ((*s >> 11) + 0.5) / 9007199254740992.0 * 2.0 - 1.0;
}

TEST(quant_linalg_gram_matches_loops) {
    unsigned long long s = test_seed() | 1;
    const int n = 300, k = 77;   /* two token chunks (256 + 44), a partial panel and tile */
    float *x = malloc(sizeof(float) * n * k), *h = calloc((size_t)k * k, sizeof(float));
    for (int i = 0; i < n * k; i++) x[i] = (float)tl_rand(&s);
    CHECK(quant_gram_acc(x, 100, k, 0.5f, h) == 0);               /* two calls accumulate */
    CHECK(quant_gram_acc(x + 100 * k, n - 100, k, 0.5f, h) == 0);
    quant_gram_mirror(h, k);
    double worst = 0;
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++) {
            double ref = 0;
            for (int t = 0; t < n; t++) ref += 0.5 * x[t * k + a] * x[t * k + b];
            worst = fmax(worst, fabs(h[a * k + b] - ref) / (1.0 + fabs(ref)));
        }
    CHECK_MSG(worst < 1e-5, "worst relative error %.3g", worst);
    free(x), free(h);
}

TEST(quant_linalg_gemm_sub_matches_loops) {
    unsigned long long s = test_seed() | 1;
    const int m = 70, n = 45, kk = 300;   /* row, strip and K-panel edges */
    double *a = malloc(sizeof(double) * m * kk), *b = malloc(sizeof(double) * kk * n), *bt = malloc(sizeof(double) * n * kk);
    double *c = malloc(sizeof(double) * m * n), *c2 = malloc(sizeof(double) * m * n), *ref = malloc(sizeof(double) * m * n);
    float *af = malloc(sizeof(float) * m * kk), *bf = malloc(sizeof(float) * kk * n), *cf = malloc(sizeof(float) * m * n);
    for (int i = 0; i < m * kk; i++) af[i] = (float)(a[i] = tl_rand(&s));
    for (int p = 0; p < kk; p++)
        for (int j = 0; j < n; j++) bf[p * n + j] = (float)(b[p * n + j] = bt[j * kk + p] = (p >= j ? tl_rand(&s) : 0.0));
    for (int i = 0; i < m * n; i++) cf[i] = (float)(c[i] = c2[i] = tl_rand(&s));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = c[i * n + j];
            for (int p = 0; p < kk; p++) acc -= a[i * kk + p] * b[p * n + j];
            ref[i * n + j] = acc;
        }
    CHECK(quant_gemm_sub_d(m, n, kk, a, kk, b, n, false, true, c, n) == 0);     /* lower B, blocks skipped */
    CHECK(quant_gemm_sub_d(m, n, kk, a, kk, bt, kk, true, false, c2, n) == 0);  /* B^T stored */
    CHECK(quant_gemm_sub_f(m, n, kk, af, kk, bf, n, false, false, cf, n) == 0);
    double wd = 0, wt = 0, wf = 0;
    for (int i = 0; i < m * n; i++) {
        wd = fmax(wd, fabs(c[i] - ref[i]));
        wt = fmax(wt, fabs(c2[i] - ref[i]));
        wf = fmax(wf, fabs(cf[i] - ref[i]));
    }
    CHECK_MSG(wd < 1e-12 && wt < 1e-12 && wf < 1e-4, "max error fp64 %.3g, fp64 B^T %.3g, fp32 %.3g", wd, wt, wf);
    free(a), free(b), free(bt), free(c), free(c2), free(ref), free(af), free(bf), free(cf);
}

TEST(quant_linalg_cholesky_and_inverse) {
    unsigned long long s = test_seed() | 1;
    const int n = 700;   /* 128-wide blocks: five full, one partial; K panels beyond one */
    double *g = malloc(sizeof(double) * n * n), *a = malloc(sizeof(double) * n * n), *l = malloc(sizeof(double) * n * n);
    for (int i = 0; i < n * n; i++) g[i] = tl_rand(&s);
    for (int i = 0; i < n; i++)   /* a = g g^T / n + I: SPD */
        for (int j = 0; j < n; j++) {
            double acc = i == j ? 1.0 : 0.0;
            for (int p = 0; p < n; p++) acc += g[i * n + p] * g[j * n + p] / n;
            a[i * n + j] = acc;
        }
    memcpy(l, a, sizeof(double) * n * n);
    CHECK(quant_cholesky_d(l, n) == 0);
    double wc = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < n; p++) acc += l[i * n + p] * l[j * n + p];
            wc = fmax(wc, fabs(acc - a[i * n + j]));
            if (j > i) CHECK(l[i * n + j] == 0.0);
        }
    memcpy(g, l, sizeof(double) * n * n);   /* g = L, l becomes L^-1 */
    CHECK(quant_trinv_lower_d(l, n) == 0);
    double wi = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < n; p++) acc += l[i * n + p] * g[p * n + j];
            wi = fmax(wi, fabs(acc - (i == j)));
        }
    CHECK_MSG(wc < 1e-10 && wi < 1e-10, "L L^T error %.3g, L^-1 L error %.3g", wc, wi);
    a[5 * n + 5] = -1.0;   /* not positive definite */
    CHECK(quant_cholesky_d(a, n) == 1);
    free(g), free(a), free(l);
}
