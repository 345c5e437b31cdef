/* linalg.c — the quantizer's dense linear algebra on the CPU (see linalg.h).
 *
 * The register tiles use GCC vector types, one source for fp32 and fp64: 64 bytes (16 floats
 * or 8 doubles) where the target has AVX-512's 32 vector registers, 32 bytes elsewhere, so
 * that an AVX2 build's tiles (16 registers) do not spill (a 64-byte tile there took 5x the
 * time of AVX-512's on SmolLM2's GPTQ, 2026-11-27).  Every output element is one
 * accumulation chain over the tokens (Gram) or one K panel's columns (GEMM) in order,
 * whatever the tile's shape, so both widths give the same bits.  Blocking is the usual one for a two-core cache hierarchy: a K panel of 256
 * packed into 64-byte aligned strips that stay in L1/L2 while a block of 64 rows of A
 * passes over them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "quant/linalg.h"

/* The tiles below say acc += a * b on vectors.  ISO C mode (-std=c11) keeps that a multiply
 * and an add: two roundings and two micro-ops on the ports that could run one fused
 * multiply-add.  These are the quantizer's hot loops (56% of GPTQ's time on a Llama-3-8B
 * layer), so this file contracts them. */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif

#if defined(__AVX512F__)
#define LA_VBYTES 64
#define GR_A 8       /* rows of h per tile (divides GR_P: a tile's rows sit in one panel) */
#else
#define LA_VBYTES 32
#define GR_A 4
#endif
typedef float vfl __attribute__((vector_size(LA_VBYTES)));   /* LA_VBYTES / 4 fp32 lanes */
typedef double vdl __attribute__((vector_size(LA_VBYTES)));  /* LA_VBYTES / 8 fp64 lanes */
#define VF_LANES (LA_VBYTES / 4)
#define VD_LANES (LA_VBYTES / 8)

/* ---- Gram matrix: upper triangle of X^T X, GR_A x GR_P register tiles ---------------- */
#define GR_TOK 256   /* tokens packed per pass: (GR_P-column panels, 256, GR_P) */
#define GR_P (2 * VF_LANES)   /* columns per panel = two vectors */

int quant_gram_acc(const float *x, int n, int k, float scale, float *h) {
    const int np = (k + GR_P - 1) / GR_P, nab = (k + GR_A - 1) / GR_A;
    float *pk = aligned_alloc(64, (size_t)np * GR_TOK * GR_P * sizeof(float)); /* (np, GR_TOK, GR_P) */
    if (!pk) return -1;
    for (int t0 = 0; t0 < n; t0 += GR_TOK) {
        const int nt = n - t0 < GR_TOK ? n - t0 : GR_TOK;
#pragma omp parallel for schedule(static)
        for (int p = 0; p < np; p++)
            for (int t = 0; t < nt; t++)
                for (int j = 0; j < GR_P; j++) {
                    int col = p * GR_P + j;
                    pk[((size_t)p * GR_TOK + t) * GR_P + j] = col < k ? x[(size_t)(t0 + t) * k + col] : 0.0f;
                }
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
        for (int ab = 0; ab < nab; ab++)
            for (int p = 0; p < np; p++) {
                const int a0 = ab * GR_A;
                if (p * GR_P + GR_P - 1 < a0) continue;   /* entirely below the diagonal */
                const float *pa = pk + (size_t)(a0 / GR_P) * GR_TOK * GR_P + a0 % GR_P;
                const float *pb = pk + (size_t)p * GR_TOK * GR_P;
                vfl acc[GR_A][2];
                memset(acc, 0, sizeof acc);
                for (int t = 0; t < nt; t++) {
                    vfl b0 = *(const vfl *)(pb + (size_t)t * GR_P), b1 = *(const vfl *)(pb + (size_t)t * GR_P + VF_LANES);
                    const float *ar = pa + (size_t)t * GR_P;
                    for (int r = 0; r < GR_A; r++) {
                        acc[r][0] += ar[r] * b0;
                        acc[r][1] += ar[r] * b1;
                    }
                }
                for (int r = 0; r < GR_A && a0 + r < k; r++) {
                    float *hr = h + (size_t)(a0 + r) * k;
                    for (int j = 0; j < GR_P && p * GR_P + j < k; j++)
                        hr[p * GR_P + j] += scale * acc[r][j / VF_LANES][j % VF_LANES];
                }
            }
    }
    free(pk);
    return 0;
}

void quant_gram_mirror(float *h, int k) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < k; i++)
        for (int j = 0; j < i; j++) h[(size_t)i * k + j] = h[(size_t)j * k + i];
}

void quant_abs_mean_acc(const float *x, int n, int k, float scale, float *m) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < k; c++) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) acc += fabsf(x[(size_t)t * k + c]);
        m[c] += acc * scale;
    }
}

/* ---- C -= A B, fp32 and fp64 from one source --------------------------------------- */
#define GM_KC 256    /* K panel */
#define GM_MB 64     /* rows of C per task */
#define GM_MR 4      /* rows per register tile */

/* NAME: the function; T: scalar; V: its 64-byte vector; NL: lanes per vector.  A strip is
 * two vectors wide (NR = 2 NL columns). */
#define GEMM_SUB_DEF(NAME, T, V, NL)                                                                            \
    int NAME(int m, int n, int kk, const T *a, int lda, const T *b, int ldb, bool b_trans, bool b_lower, T *c, \
             int ldc) {                                                                                         \
        enum { NR = 2 * NL };                                                                                   \
        if (m <= 0 || n <= 0 || kk <= 0) return 0;                                                              \
        const int n_strips = (n + NR - 1) / NR, n_mb = (m + GM_MB - 1) / GM_MB;                                 \
        T *bp = aligned_alloc(64, (size_t)n_strips * GM_KC * NR * sizeof(T)); /* (strips, GM_KC, NR) */         \
        if (!bp) return -1;                                                                                     \
        for (int k0 = 0; k0 < kk; k0 += GM_KC) {                                                                \
            const int kc = kk - k0 < GM_KC ? kk - k0 : GM_KC;                                                   \
            int ns = n_strips;                                                                                  \
            if (b_lower && (k0 + kc - 1) / NR + 1 < ns) ns = (k0 + kc - 1) / NR + 1; /* the rest is zero */     \
            _Pragma("omp parallel for schedule(static)") for (int s = 0; s < ns; s++) {                         \
                T *d = bp + (size_t)s * GM_KC * NR;                                                             \
                for (int p = 0; p < kc; p++)                                                                    \
                    for (int j = 0; j < NR; j++) {                                                              \
                        int col = s * NR + j;                                                                   \
                        d[(size_t)p * NR + j] = col >= n ? (T)0                                                 \
                                                : b_trans ? b[(size_t)col * ldb + k0 + p]                       \
                                                          : b[(size_t)(k0 + p) * ldb + col];                    \
                    }                                                                                           \
            }                                                                                                   \
            _Pragma("omp parallel for collapse(2) schedule(dynamic, 1)") for (int mb = 0; mb < n_mb; mb++)      \
                for (int s = 0; s < ns; s++) {                                                                  \
                    const T *bs = bp + (size_t)s * GM_KC * NR;                                                  \
                    const int j0 = s * NR, nc = n - j0 < NR ? n - j0 : NR;                                      \
                    const int r_end = (mb + 1) * GM_MB < m ? (mb + 1) * GM_MB : m;                              \
                    for (int r0 = mb * GM_MB; r0 < r_end; r0 += GM_MR) {                                        \
                        const int mr = r_end - r0 < GM_MR ? r_end - r0 : GM_MR;                                 \
                        const T *ar[GM_MR];                                                                     \
                        for (int r = 0; r < GM_MR; r++)                                                         \
                            ar[r] = a + (size_t)(r < mr ? r0 + r : r0) * lda + k0;                              \
                        V acc[GM_MR][2];                                                                        \
                        memset(acc, 0, sizeof acc);                                                             \
                        for (int p = 0; p < kc; p++) {                                                          \
                            V b0 = *(const V *)(bs + (size_t)p * NR), b1 = *(const V *)(bs + (size_t)p * NR + NL); \
                            for (int r = 0; r < GM_MR; r++) {                                                   \
                                acc[r][0] += ar[r][p] * b0;                                                     \
                                acc[r][1] += ar[r][p] * b1;                                                     \
                            }                                                                                   \
                        }                                                                                       \
                        for (int r = 0; r < mr; r++) {                                                          \
                            T *cr = c + (size_t)(r0 + r) * ldc + j0;                                            \
                            if (nc == NR) { /* a whole strip: two vector subtractions, the same per element */   \
                                V c0, c1;                                                                       \
                                memcpy(&c0, cr, sizeof c0);                                                     \
                                memcpy(&c1, cr + NL, sizeof c1);                                                \
                                c0 -= acc[r][0];                                                                \
                                c1 -= acc[r][1];                                                                \
                                memcpy(cr, &c0, sizeof c0);                                                     \
                                memcpy(cr + NL, &c1, sizeof c1);                                                \
                            } else                                                                              \
                                for (int j = 0; j < nc; j++) cr[j] -= acc[r][j / NL][j % NL];                   \
                        }                                                                                       \
                    }                                                                                           \
                }                                                                                               \
        }                                                                                                       \
        free(bp);                                                                                               \
        return 0;                                                                                               \
    }
GEMM_SUB_DEF(quant_gemm_sub_f, float, vfl, VF_LANES)
GEMM_SUB_DEF(quant_gemm_sub_d, double, vdl, VD_LANES)

/* ---- Cholesky and triangular inverse: 128-wide blocks, updates through the GEMM ----- */
#define LA_NB 128
#define LA_RB 256    /* rows of the trailing update per GEMM call */

int quant_cholesky_d(double *a, int n) {
    for (int k0 = 0; k0 < n; k0 += LA_NB) {
        const int k1 = k0 + LA_NB < n ? k0 + LA_NB : n;
        /* diagonal block, row by row: every inner loop is a contiguous dot product */
        for (int i = k0; i < k1; i++) {
            double *ai = a + (size_t)i * n;
            for (int j = k0; j <= i; j++) {
                const double *aj = a + (size_t)j * n;
                double s = ai[j];
                for (int q = k0; q < j; q++) s -= ai[q] * aj[q];
                if (j < i) {
                    ai[j] = s / aj[j];
                } else {
                    if (!(s > 0.0)) return 1;
                    ai[i] = sqrt(s);
                }
            }
        }
        /* panel below it: rows solve against the block's factor */
#pragma omp parallel for schedule(static)
        for (int i = k1; i < n; i++) {
            double *ai = a + (size_t)i * n;
            for (int j = k0; j < k1; j++) {
                const double *aj = a + (size_t)j * n;
                double s = ai[j];
                for (int q = k0; q < j; q++) s -= ai[q] * aj[q];
                ai[j] = s / aj[j];
            }
        }
        /* trailing lower triangle -= panel panel^T, a band of rows at a time */
        for (int r0 = k1; r0 < n; r0 += LA_RB) {
            const int r1 = r0 + LA_RB < n ? r0 + LA_RB : n;
            if (quant_gemm_sub_d(r1 - r0, r1 - k1, k1 - k0, a + (size_t)r0 * n + k0, n, a + (size_t)k1 * n + k0, n,
                                 true, false, a + (size_t)r0 * n + k1, n))
                return -1;
        }
    }
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memset(a + (size_t)i * n + i + 1, 0, (size_t)(n - 1 - i) * sizeof(double));
    return 0;
}

int quant_trinv_lower_d(double *l, int n) {
    double *t = malloc((size_t)LA_NB * n * sizeof(double));   /* (LA_NB, n) L_i X of one block row */
    double *row = malloc((size_t)LA_NB * sizeof(double));     /* (LA_NB) */
    if (!t || !row) {
        free(t), free(row);
        return -1;
    }
    int rc = 0;
    for (int i0 = 0; i0 < n && !rc; i0 += LA_NB) {
        const int i1 = i0 + LA_NB < n ? i0 + LA_NB : n, nb = i1 - i0;
        /* t = -L[i0:i1, 0:i0] X[0:i0, 0:i0]: the rows above are already inverted in place */
        if (i0 > 0) {
            memset(t, 0, (size_t)nb * i0 * sizeof(double));
            rc = quant_gemm_sub_d(nb, i0, i0, l + (size_t)i0 * n, n, l, n, false, true, t, i0);
            if (rc) break;
        }
        /* X_ii = L_ii^-1 in place, row by row: row i from the finished rows above it */
        for (int i = i0; i < i1; i++) {
            double *li = l + (size_t)i * n;
            for (int c = i0; c < i; c++) {
                double s = 0.0;
                for (int q = c; q < i; q++) s += li[q] * l[(size_t)q * n + c];
                row[c - i0] = -s / li[i];
            }
            row[i - i0] = 1.0 / li[i];
            memcpy(li + i0, row, (size_t)(i - i0 + 1) * sizeof(double));
        }
        /* X[i0:i1, 0:i0] = -X_ii (L_i X) = X_ii t */
        if (i0 > 0) {
            for (int r = i0; r < i1; r++) memset(l + (size_t)r * n, 0, (size_t)i0 * sizeof(double));
            rc = quant_gemm_sub_d(nb, i0, nb, l + (size_t)i0 * n + i0, n, t, i0, false, false, l + (size_t)i0 * n, n);
#pragma omp parallel for schedule(static)
            for (int r = i0; r < i1; r++)
                for (int c = 0; c < i0; c++) l[(size_t)r * n + c] = -l[(size_t)r * n + c];
        }
    }
    free(t), free(row);
    return rc;
}
