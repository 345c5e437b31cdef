/* test_cpu_ops.c — every CPU op twin (cpu/ops.h) against a naive double-precision
 * reference written here, on fresh random inputs with odd shapes. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"
#include "core/fileio.h"
#include "test.h"

typedef struct { uint64_t s; } rng;
static uint64_t rng_next(rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float rng_unif(rng *r) { return (float)((rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }
static int rng_int(rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); }
static rng rng_make(const char *what) {
    unsigned long long seed = test_seed();
    rng r = {seed};
    for (const char *p = what; *p; p++) r.s = r.s * 131 + (unsigned char)*p;
    return r;
}

static void put_half(uint8_t *p, float f) { uint16_t h = f32_to_fp16(f); memcpy(p, &h, 2); }
static double get_half(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_f32(h); }
/* Whether t is stored in super-blocks of 256 values (the k-quants, IQ4_XS). */
static int superblock(llmi_dtype t) { return dtype_block_elems(t) == 256; }
/* IQ4_NL's and IQ4_XS's values (ggml-common.h's kvalues_iq4nl, FORMATS.md), the test's own copy. */
static const int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* A random (rows, cols) weight in dtype t; data is malloc'ed into owned. */
static llmi_tensor make_weight(rng *r, llmi_dtype t, int rows, int cols) {
    llmi_tensor w = {0};
    w.dtype = t;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = (size_t)(cols / dtype_block_elems(t)) * dtype_block_bytes(t);
    uint8_t *d = malloc(w.row_bytes * rows);
    for (size_t i = 0; i < w.row_bytes * rows; i++) d[i] = (uint8_t)rng_next(r);
    for (int row = 0; row < rows; row++) {
        uint8_t *p = d + w.row_bytes * row;
        for (int c = 0; c < cols / dtype_block_elems(t); c++) {
            float sc = 0.002f + 0.02f * (rng_unif(r) + 1.0f);
            switch (t) {
            case LLMI_F32: { float f = rng_unif(r); memcpy(p + 4 * c, &f, 4); break; }
            case LLMI_F16: put_half(p + 2 * c, rng_unif(r)); break;
            case LLMI_BF16: { uint16_t h = f32_to_bf16(rng_unif(r)); memcpy(p + 2 * c, &h, 2); break; }
            case LLMI_Q8_0: put_half(p + 34 * c, sc); if (c == 0) p[2] = 0x81; break;   /* -127 */
            case LLMI_Q4_0: put_half(p + 18 * c, sc); break;
            case LLMI_Q4_1: put_half(p + 20 * c, sc); put_half(p + 20 * c + 2, -8 * sc * (rng_unif(r) + 1.2f)); break;
            case LLMI_Q5_0: put_half(p + 22 * c, sc); break;
            case LLMI_Q5_1: put_half(p + 24 * c, sc); put_half(p + 24 * c + 2, -16 * sc * (rng_unif(r) + 1.1f)); break;
            case LLMI_IQ4_NL: put_half(p + 18 * c, sc / 16); if (c == 0) p[2] = 0; break;   /* value -127 */
            case LLMI_IQ4_XS: {   /* random 6-bit scales; row 0's first super-block all -32 and -127 */
                uint8_t *blk = p + 136 * c;
                if (row == 0 && c == 0) memset(blk + 2, 0, 134);
                put_half(blk, (rng_int(r, 2) ? 1 : -1) * exp2f(-12.0f + rng_unif(r)));
                break;
            }
            case LLMI_Q2_K: case LLMI_Q3_K: case LLMI_Q4_K: case LLMI_Q5_K: case LLMI_Q6_K: {
                /* random scales, mins and codes under fp16 super-block scales d of 2^-9 ..
                 * 2^-7 (Q6_K's of either sign) and dmin that centres the values on 0 on average
                 * (mean code times d), as a quantizer's mins do: scripts/make-kquant-refs.py's
                 * wider d and independent dmin would give the rows a large common part, and
                 * the activations' rounding noise on it is one draw for all rows, too few for
                 * the NMSEs above to average.  The first super-block of row 0 has every code
                 * at its maximum. */
                uint8_t *blk = p + dtype_block_bytes(t) * c;
                if (row == 0 && c == 0) {
                    if (t == LLMI_Q6_K) memset(blk, 0xff, 192);                   /* ql, qh */
                    else if (t == LLMI_Q3_K) memset(blk, 0xff, 96), memset(blk + 96, 0, 12);   /* codes 7, scales -32 */
                    else if (t == LLMI_Q2_K) memset(blk, 0xff, 80);   /* scales, mins 15, codes 3 */
                    else memset(blk + 16, 0xff, dtype_block_bytes(t) - 16);       /* (qh,) qs */
                }
                float mag = exp2f(-8.0f + rng_unif(r));
                if (t == LLMI_Q6_K) put_half(blk + 208, rng_int(r, 2) ? mag : -mag);
                else if (t == LLMI_Q3_K) put_half(blk + 108, rng_int(r, 2) ? mag : -mag);
                else if (t == LLMI_Q2_K) put_half(blk + 80, mag), put_half(blk + 82, mag * 1.5f);
                else put_half(blk, mag), put_half(blk + 2, mag * (t == LLMI_Q5_K ? 15.5f : 7.5f));
                break;
            }
            default: break;
            }
        }
    }
    w.data = d;
    w.owned = d;
    return w;
}

/* The test's own reading of a k-quant super-block blk (the layouts of core/tensor.c's
 * comment): value e's unsigned code, and the fp32 factors of its sub-block (exact products
 * of the fp16 and integer scales): value = f[0] * code + f[1] for Q4_K and Q5_K,
 * f[e % 32 / 16] * (code - 32) for Q6_K, f[e % 32 / 16] * (code - 4) for Q3_K. */
static int kq_code(llmi_dtype t, const uint8_t *blk, int e) {
    if (t == LLMI_IQ4_NL || t == LLMI_IQ4_XS) {   /* an index: nibbles as Q4_0's, 16 bytes per 32 values */
        const uint8_t *qs = t == LLMI_IQ4_NL ? blk + 2 : blk + 8 + 16 * (e / 32);
        return e % 32 < 16 ? qs[e % 32] & 15 : qs[e % 32 - 16] >> 4;
    }
    if (t == LLMI_Q5_0 || t == LLMI_Q5_1) {   /* blk a block of 32: nibbles, then bit e of qh */
        const uint8_t *qs = blk + (t == LLMI_Q5_1 ? 8 : 6), *qh = blk + (t == LLMI_Q5_1 ? 4 : 2);
        return (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) | ((qh[e / 8] >> (e % 8)) & 1) << 4;
    }
    if (t == LLMI_Q2_K) {   /* bit pair k of qs[32 * half + l] */
        int half = e / 128, k = e % 128 / 32, l = e % 32;
        return blk[16 + 32 * half + l] >> (2 * k) & 3;
    }
    if (t == LLMI_Q3_K) {   /* bit pair k of qs[32 * half + l], third bit e / 32 of hmask[l] */
        int half = e / 128, k = e % 128 / 32, l = e % 32;
        return (blk[32 + 32 * half + l] >> (2 * k) & 3) | (blk[l] >> (e / 32) & 1) << 2;
    }
    if (t == LLMI_Q6_K) {
        int half = e / 128, k = e % 128 / 32, l = e % 32;
        uint8_t lo = blk[64 * half + l + (k == 1 || k == 3 ? 32 : 0)], hi = blk[128 + 32 * half + l];
        return (k < 2 ? lo & 15 : lo >> 4) | ((hi >> (2 * k)) & 3) << 4;
    }
    int s = e / 32, i = e % 32;
    uint8_t q = blk[(t == LLMI_Q5_K ? 48 : 16) + 32 * (s / 2) + i];
    int v = s % 2 ? q >> 4 : q & 15;
    if (t == LLMI_Q5_K) v += 16 * ((blk[16 + i] >> s) & 1);
    return v;
}
static void kq_factors(llmi_dtype t, const uint8_t *blk, int s, float f[2]) {
    if (t == LLMI_IQ4_NL || t == LLMI_IQ4_XS) {   /* x = f[0] * iq4_values[code] */
        int sc = 0;
        if (t == LLMI_IQ4_XS) {   /* low 4 bits: nibble s % 2 of scales_l[s / 2]; top 2: bits 2s of scales_h */
            uint16_t hi;
            memcpy(&hi, blk + 2, 2);
            sc = ((blk[4 + s / 2] >> (4 * (s % 2)) & 15) | (hi >> (2 * s) & 3) << 4) - 32;
        }
        f[0] = t == LLMI_IQ4_NL ? (float)get_half(blk) : (float)get_half(blk) * (float)sc;
        f[1] = 0.0f;
        return;
    }
    if (t == LLMI_Q5_0 || t == LLMI_Q5_1) {   /* x = d * q + m; Q5_0's m is -16 d */
        f[0] = (float)get_half(blk);
        f[1] = t == LLMI_Q5_1 ? (float)get_half(blk + 2) : -16.0f * f[0];
        return;
    }
    if (t == LLMI_Q3_K) {   /* scale j: low 4 bits from bytes 0-7 (low nibbles first), top 2 from 8-11 */
        float d = (float)get_half(blk + 108);
        for (int h = 0; h < 2; h++) {
            int j = 2 * s + h, lo = j < 8 ? blk[96 + j] & 15 : blk[96 + j - 8] >> 4, hi = blk[104 + j % 4] >> (2 * (j / 4)) & 3;
            f[h] = d * (float)((lo | hi << 4) - 32);
        }
        return;
    }
    if (t == LLMI_Q6_K) {
        float d = (float)get_half(blk + 208);
        f[0] = d * (float)(int8_t)blk[192 + 2 * s];
        f[1] = d * (float)(int8_t)blk[192 + 2 * s + 1];
        return;
    }
    int sc, mn;
    kquant_scale_min(blk + 4, s, &sc, &mn);
    f[0] = (float)get_half(blk) * (float)sc;
    f[1] = -((float)get_half(blk + 2) * (float)mn);
}

/* Q2_K's four factors of sub-block s: scale (f[h]) and min (f[2 + h]) of its halves h, as
 * d * (scales[j] & 15) and -(dmin * (scales[j] >> 4)), j = 2s + h; d, dmin at bytes 80, 82. */
static void q2k_factors(const uint8_t *blk, int s, float f[4]) {
    for (int h = 0; h < 2; h++) {
        f[h] = (float)get_half(blk + 80) * (float)(blk[2 * s + h] & 15);
        f[2 + h] = -((float)get_half(blk + 82) * (float)(blk[2 * s + h] >> 4));
    }
}

/* The test's own dequantizer (FORMATS.md), in double. */
static double ref_w(const llmi_tensor *w, int row, int c) {
    const uint8_t *p = (const uint8_t *)w->data + w->row_bytes * row;
    int b = c / 32, j = c % 32;
    if (w->dtype == LLMI_IQ4_NL || w->dtype == LLMI_IQ4_XS) {
        const uint8_t *blk = p + dtype_block_bytes(w->dtype) * (size_t)(w->dtype == LLMI_IQ4_NL ? b : c / 256);
        float f[2];
        kq_factors(w->dtype, blk, w->dtype == LLMI_IQ4_NL ? 0 : c % 256 / 32, f);
        return (double)f[0] * iq4_values[kq_code(w->dtype, blk, w->dtype == LLMI_IQ4_NL ? j : c % 256)];
    }
    if (w->dtype == LLMI_Q5_0 || w->dtype == LLMI_Q5_1) {
        const uint8_t *blk = p + dtype_block_bytes(w->dtype) * (size_t)b;
        float f[2];
        kq_factors(w->dtype, blk, 0, f);
        return (double)f[0] * kq_code(w->dtype, blk, j) + f[1];
    }
    if (superblock(w->dtype)) {
        const uint8_t *blk = p + dtype_block_bytes(w->dtype) * (size_t)(c / 256);
        float f[4];
        if (w->dtype == LLMI_Q2_K) {
            q2k_factors(blk, c % 256 / 32, f);
            return (double)f[j / 16] * kq_code(w->dtype, blk, c % 256) + f[2 + j / 16];
        }
        kq_factors(w->dtype, blk, c % 256 / 32, f);
        int q = kq_code(w->dtype, blk, c % 256);
        if (w->dtype == LLMI_Q6_K || w->dtype == LLMI_Q3_K) return (double)f[j / 16] * (q - (w->dtype == LLMI_Q6_K ? 32 : 4));
        return (double)f[0] * q + f[1];
    }
    switch (w->dtype) {
    case LLMI_F32: { float f; memcpy(&f, p + 4 * c, 4); return f; }
    case LLMI_F16: return get_half(p + 2 * c);
    case LLMI_BF16: { uint16_t h; memcpy(&h, p + 2 * c, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    case LLMI_Q8_0: return (int8_t)p[34 * b + 2 + j] * get_half(p + 34 * b);
    case LLMI_Q4_0: { uint8_t q = p[18 * b + 2 + j % 16]; int v = j < 16 ? (q & 15) : (q >> 4); return (v - 8) * get_half(p + 18 * b); }
    case LLMI_Q4_1: { uint8_t q = p[20 * b + 4 + j % 16]; int v = j < 16 ? (q & 15) : (q >> 4);
                      return v * get_half(p + 20 * b) + get_half(p + 20 * b + 2); }
    default: return NAN;
    }
}

static float *rand_vec(rng *r, size_t n, float scale) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = rng_unif(r) * scale;
    return v;
}

/* The weight dtypes make_weight builds (every one but LLMI_I4G, tested in test_quant*.c). */
#define FOR_WEIGHT_DTYPES(t, first) for (int t = (first); t < LLMI_DTYPE_COUNT; t += (t + 1 == LLMI_I4G ? 2 : 1))

TEST(cpu_dequant_row_and_embed) {
    rng r = rng_make("dequant");
    FOR_WEIGHT_DTYPES(t, LLMI_F32) {
        const int cols = superblock((llmi_dtype)t) ? 512 : 96;
        llmi_tensor w = make_weight(&r, (llmi_dtype)t, 11, cols);
        float row[512];
        double maxd = 0;   /* relative above 1: a k-quant's d * q + m rounds once to fp32 */
        for (int i = 0; i < 11; i++) {
            tensor_dequant_row(&w, i, row);
            for (int c = 0; c < cols; c++) maxd = fmax(maxd, fabs(row[c] - ref_w(&w, i, c)) / fmax(1, fabs(ref_w(&w, i, c))));
        }
        CHECK_MSG(maxd < 1e-6, "%s dequant max diff %g", dtype_name((llmi_dtype)t), maxd);
        int32_t toks[5] = {3, 0, 10, 3, 7};
        float out[5 * 512];
        cpu_embed(&w, toks, 5, out);
        maxd = 0;
        for (int i = 0; i < 5; i++)
            for (int c = 0; c < cols; c++)
                maxd = fmax(maxd, fabs(out[i * cols + c] - ref_w(&w, toks[i], c)) / fmax(1, fabs(ref_w(&w, toks[i], c))));
        CHECK_MSG(maxd < 1e-6, "%s embed max diff %g", dtype_name((llmi_dtype)t), maxd);
        free(w.owned);
    }
}

/* The int8-activation recipe done in double: what the quantized kernels must compute
 * up to fp32 rounding. */
static void quant_x_ref(const float *x, int cols, double *xq) {
    for (int b = 0; b < cols / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; j++) xq[b * 32 + j] = (double)nearbyintf(x[b * 32 + j] * id) * d;
    }
}

TEST(cpu_matmul_all_dtypes) {
    rng r = rng_make("matmul");
    /* rows off the 16-row groups; the last shape a long row (over 2048 blocks of 32) */
    const int shapes[][2] = {{37, 96}, {65, 160}, {1, 32}, {130, 224}, {17, 576}, {3, 65568}};
    const int kshapes[][2] = {{37, 256}, {65, 512}, {1, 256}, {130, 768}, {17, 1536}, {3, 65792}};   /* k-quants */
    const int ns[] = {1, 37, 3, 9};
    FOR_WEIGHT_DTYPES(t, LLMI_F32) {
        int quant = t >= LLMI_Q8_0, kq = superblock((llmi_dtype)t);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = kq ? kshapes[si][0] : shapes[si][0];
            int cols = kq ? kshapes[si][1] : shapes[si][1] + (quant ? 0 : rng_int(&r, 2) * 3);   /* odd dense cols too */
            llmi_tensor w = make_weight(&r, (llmi_dtype)t, rows, cols);
            float *bias = rand_vec(&r, rows, 1.0f);
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                int n = ns[ni];
                float *x = rand_vec(&r, (size_t)n * cols, 1.0f);
                if (n > 2) for (int c = 0; c < 32; c++) x[cols + c] = 0.0f;   /* an all-zero block */
                float *y = malloc(sizeof(float) * n * rows), *y1 = malloc(sizeof(float) * rows);
                float *ref = malloc(sizeof(float) * n * rows), *refq = malloc(sizeof(float) * n * rows);
                double *xq = malloc(sizeof(double) * cols), num = 0, den = 0;
                const float *bb = (ni & 1) ? bias : NULL;
                cpu_matmul(&w, x, n, bb, y);
                for (int i = 0; i < n; i++) {
                    if (quant) quant_x_ref(x + (size_t)i * cols, cols, xq);
                    for (int o = 0; o < rows; o++) {
                        double s = bb ? bb[o] : 0, sq = s;
                        for (int c = 0; c < cols; c++) {
                            double wv = ref_w(&w, o, c);
                            s += wv * x[(size_t)i * cols + c];
                            if (quant) sq += wv * xq[c];
                        }
                        double sa = 0;
                        for (int c = 0; c < cols; c++) sa += fabs(ref_w(&w, o, c) * x[(size_t)i * cols + c]);
                        den += sa * sa;
                        ref[(size_t)i * rows + o] = (float)s;
                        refq[(size_t)i * rows + o] = (float)sq;
                    }
                }
                /* int8 activations add rounding noise of step amax/127 per block: for
                 * uniform x that is NMSE ~ (1/127)^2/12 / (1/3) = 1.6e-5 on the output.
                 * NMSE is a statistical bound: a handful of outputs (which may cancel to
                 * near 0) is instead measured against the scale sum|w*x| of each dot. */
                double e = test_nmse(y, ref, (long)n * rows), lim = quant ? 1e-4 : 1e-10;
                if ((long)n * rows < 100) {
                    for (long i = 0; i < (long)n * rows; i++) num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
                    e = num / den;
                    /* one int8-rounded block against one dot's |w*x| scale: 1e-5 failed about
                     * once in 150 seeds (Q4_1 1x32: 1.03e-5); the bits themselves are held
                     * exactly by cpu_matmul_quant_recipe_exact */
                    lim = quant ? 5e-5 : 1e-12;
                }
                CHECK_MSG(e < lim, "%s %dx%d n=%d NMSE %g vs exact-dequant reference (limit %g)",
                          dtype_name((llmi_dtype)t), rows, cols, n, e, lim);
                if (quant) {
                    /* fp32 accumulation against a double reference: relative to the
                     * scale of the dots when there are too few outputs for an NMSE (a
                     * single output near 0 fails a plain NMSE by rounding alone) */
                    double eq = test_nmse(y, refq, (long)n * rows);
                    if ((long)n * rows < 100) {
                        double nq = 0;
                        for (long i = 0; i < (long)n * rows; i++) nq += ((double)y[i] - refq[i]) * ((double)y[i] - refq[i]);
                        eq = nq / den;
                    }
                    CHECK_MSG(eq < 1e-10, "%s %dx%d n=%d NMSE %g vs int8-activation reference",
                              dtype_name((llmi_dtype)t), rows, cols, n, eq);
                }
                /* batch invariance: each token alone gives bit-identical rows */
                for (int i = 0; i < n; i += (n > 5 ? 5 : 1)) {
                    cpu_matmul(&w, x + (size_t)i * cols, 1, bb, y1);
                    CHECK_MSG(memcmp(y1, y + (size_t)i * rows, sizeof(float) * rows) == 0,
                              "%s %dx%d token %d of %d differs from n=1", dtype_name((llmi_dtype)t), rows, cols, i, n);
                }
                free(x); free(y); free(y1); free(ref); free(refq); free(xq);
            }
            free(bias);
            free(w.owned);
        }
    }
}

/* The quantized recipe of matmul.c's comment, written here from the GGUF block layout
 * (FORMATS.md) with plain C arithmetic: int8 activations, exact int32 block dots with the
 * signed weights (Q5_0's q - 16 as Q4_0's q - 8), then per block
 * acc = fmaf(dot, d_w * d_x, acc) (Q4_1, Q5_1: then acc = fmaf(m_w, d_x * sum(x_q), acc)).  cpu_matmul (which packs the raw weight into
 * 16-row groups first) must give exactly these bits, on shapes whose rows do not fill the
 * last group, for any number of tokens. */
/* The k-quants, per 32-column block (sub-block s of a super-block), the same with the
 * fp32 factors of kq_factors as the scale and min: Q4_K, Q5_K dot = sum(code * x_q), then
 * acc = fmaf(dot, f0 * d_x, acc), acc = fmaf(f1, d_x * sum(x_q), acc); Q6_K a dot per half
 * block, dot_h = sum((code - 32) * x_q) over columns 16h .. 16h + 15, then
 * acc = fmaf(dot_0, f0 * d_x, acc), acc = fmaf(dot_1, f1 * d_x, acc). */
static float quant_recipe_ref(const llmi_tensor *w, int row, const float *x) {
    const uint8_t *p = (const uint8_t *)w->data + w->row_bytes * row;
    const llmi_dtype t = w->dtype;
    const int kq = superblock(t);
    size_t bb = dtype_block_bytes(t);
    float acc = 0.0f;
    for (int b = 0; b < w->cols / 32; b++) {
        const uint8_t *blk = kq ? p + bb * (size_t)(b / 8) : p + bb * b;
        const int sub = kq ? b % 8 : 0;
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t dot[2] = {0, 0}, sum = 0, hsum[2] = {0, 0};   /* dot[1]: a second half's (Q6_K, Q3_K, Q2_K) */
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            int q;
            switch (t) {
            case LLMI_Q8_0: q = (int8_t)blk[2 + j]; break;
            case LLMI_Q4_0: q = (j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4)) - 8; break;
            case LLMI_Q4_1: q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4); break;
            case LLMI_Q6_K: q = kq_code(t, blk, 32 * sub + j) - 32; break;
            case LLMI_Q3_K: q = kq_code(t, blk, 32 * sub + j) - 4; break;
            case LLMI_Q5_0: q = kq_code(t, blk, j) - 16; break;
            case LLMI_IQ4_NL: case LLMI_IQ4_XS: q = iq4_values[kq_code(t, blk, 32 * sub + j)]; break;
            default: q = kq_code(t, blk, 32 * sub + j); break;
            }
            dot[(t == LLMI_Q6_K || t == LLMI_Q3_K || t == LLMI_Q2_K) && j >= 16] += q * v;
            sum += v;
            hsum[j >= 16] += v;
        }
        if (t == LLMI_Q2_K) {   /* halves' dots, then halves' mins */
            float f[4];
            q2k_factors(blk, sub, f);
            acc = fmaf((float)dot[0], f[0] * d, acc);
            acc = fmaf((float)dot[1], f[1] * d, acc);
            acc = fmaf(f[2], d * (float)hsum[0], acc);
            acc = fmaf(f[3], d * (float)hsum[1], acc);
            continue;
        }
        if (kq || t == LLMI_IQ4_NL) {
            float f[2];
            kq_factors(t, blk, sub, f);
            acc = fmaf((float)dot[0], f[0] * d, acc);
            if (t == LLMI_IQ4_NL || t == LLMI_IQ4_XS) continue;   /* no min term */
            if (t == LLMI_Q6_K || t == LLMI_Q3_K) acc = fmaf((float)dot[1], f[1] * d, acc);
            else acc = fmaf(f[1], d * (float)sum, acc);
            continue;
        }
        float s = (float)get_half(blk) * d;
        acc = fmaf((float)dot[0], s, acc);
        if (t == LLMI_Q4_1 || t == LLMI_Q5_1) acc = fmaf((float)get_half(blk + 2), d * (float)sum, acc);
    }
    return acc;
}

TEST(cpu_matmul_quant_recipe_exact) {
    rng r = rng_make("quant_recipe");
    const int shapes[][2] = {{1, 32}, {17, 96}, {37, 576}, {48, 160}, {5, 1536}};
    const int kshapes[][2] = {{1, 256}, {17, 512}, {37, 768}, {48, 256}, {5, 1536}};   /* k-quants */
    const int ns[] = {1, 2, 5, 8, 13};
    long bad = 0, total = 0;
    FOR_WEIGHT_DTYPES(t, LLMI_Q8_0)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int kq = superblock((llmi_dtype)t);
            int rows = kq ? kshapes[si][0] : shapes[si][0], cols = kq ? kshapes[si][1] : shapes[si][1], n = ns[si];
            llmi_tensor w = make_weight(&r, (llmi_dtype)t, rows, cols);
            float *x = rand_vec(&r, (size_t)n * cols, 2.0f), *y = malloc(sizeof(float) * n * rows);
            if (n > 1) for (int c = 0; c < 32; c++) x[cols + c] = 0.0f;   /* an all-zero block */
            /* a token of activations all +127 (against a k-quant's row 0, whose first
             * super-block has maximal codes: the largest integer dots, where a kernel's
             * narrower partial sums would overflow or saturate) */
            if (n > 2) for (int c = 0; c < cols; c++) x[2 * (size_t)cols + c] = 1.0f;
            cpu_matmul(&w, x, n, NULL, y);
            for (int i = 0; i < n; i++)
                for (int o = 0; o < rows; o++, total++) {
                    float want = quant_recipe_ref(&w, o, x + (size_t)i * cols);
                    if (memcmp(&want, &y[(size_t)i * rows + o], 4) != 0 && bad++ < 3)
                        fprintf(stderr, "  %s %dx%d token %d row %d: %a, recipe %a\n", dtype_name((llmi_dtype)t), rows,
                                cols, i, o, y[(size_t)i * rows + o], want);
                }
            free(x); free(y); free(w.owned);
        }
    CHECK_MSG(bad == 0, "%ld of %ld outputs differ from the recipe", bad, total);
}

/* The dense recipe of matmul.c's comment, written here with plain C arithmetic: 16 lanes,
 * lane l an fmaf chain over columns c = l (mod 16) in order, zeros past the row's end, then
 * the 16 sums reduced as GCC's _mm512_reduce_add_ps does (lane l + lane l + 8, then + 4,
 * then lanes 0 + 2 and 1 + 3, then those two).  Every build (AVX-512, AVX2, portable) must
 * give exactly these bits: a model's outputs then do not depend on the CPU's vector width. */
static float dense_recipe_ref(const llmi_tensor *w, int row, const float *x) {
    float a[16] = {0};
    for (int c = 0; c < w->cols; c++) {
        const uint8_t *p = (const uint8_t *)w->data + w->row_bytes * row;
        float v;
        if (w->dtype == LLMI_F32) memcpy(&v, p + 4 * (size_t)c, 4);
        else if (w->dtype == LLMI_F16) v = (float)get_half(p + 2 * (size_t)c);
        else { uint16_t h; memcpy(&h, p + 2 * (size_t)c, 2); v = bf16_to_f32(h); }
        a[c % 16] = fmaf(v, x[c], a[c % 16]);
    }
    /* (a lane past the end adds fmaf(0, 0, a) = a: -0 + +0 aside, which it turns to +0) */
    for (int c = w->cols; c % 16; c++) a[c % 16] = fmaf(0.0f, 0.0f, a[c % 16]);
    float h8[8], h4[4];
    for (int l = 0; l < 8; l++) h8[l] = a[l + 8] + a[l];
    for (int l = 0; l < 4; l++) h4[l] = h8[l + 4] + h8[l];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

TEST(cpu_matmul_dense_recipe_exact) {
    rng r = rng_make("dense_recipe");
    const int shapes[][2] = {{1, 1}, {3, 15}, {5, 16}, {7, 17}, {33, 100}, {9, 576}, {4, 1000}};
    const int ns[] = {1, 2, 3, 5, 1, 7, 4};
    long bad = 0, total = 0;
    for (int t = LLMI_F32; t <= LLMI_BF16; t++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = shapes[si][0], cols = shapes[si][1], n = ns[si];
            llmi_tensor w = make_weight(&r, (llmi_dtype)t, rows, cols);
            float *x = rand_vec(&r, (size_t)n * cols, 2.0f), *y = malloc(sizeof(float) * n * rows);
            cpu_matmul(&w, x, n, NULL, y);
            for (int i = 0; i < n; i++)
                for (int o = 0; o < rows; o++, total++) {
                    float want = dense_recipe_ref(&w, o, x + (size_t)i * cols);
                    if (memcmp(&want, &y[(size_t)i * rows + o], 4) != 0 && bad++ < 3)
                        fprintf(stderr, "  %s %dx%d token %d row %d: %a, recipe %a\n", dtype_name((llmi_dtype)t), rows,
                                cols, i, o, y[(size_t)i * rows + o], want);
                }
            free(x); free(y); free(w.owned);
        }
    CHECK_MSG(bad == 0, "%ld of %ld outputs differ from the recipe", bad, total);
}

/* Packing keeps every row's scales (mins) and codes where ops.h says, read back here from
 * the GGUF bytes with the test's own decoders: fp16 heads copied (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1), the k-quants' super-block fp32 d (-dmin) and integer sub-block scales (mins)
 * whose products are the exact factors, codes as nibbles plus top-bit quads; padding rows
 * are zero; the bytes per weight are the stated ones; a packed weight multiplies as the
 * raw one. */
static int packed_code(int bits, const uint8_t *q, int i, int c) {   /* ops.h's layout, independently */
    if (bits == 8) return q[64 * (c / 4) + 4 * i + c % 4];
    if (bits <= 3) {   /* operand j = c / 4: bit pair j % 4 of quad j / 4; third bit j of quad 2 */
        const int j = c / 4;
        return (q[64 * (j / 4) + 4 * i + c % 4] >> (2 * (j % 4)) & 3) | (bits == 3 ? (q[128 + 4 * i + c % 4] >> j & 1) << 2 : 0);
    }
    const int j = c % 16 / 4, hi = c >= 16, w = bits - 4;
    int v = q[64 * j + 4 * i + c % 4] >> (4 * hi) & 15;
    if (w) {
        const int per = 4 / w;   /* nibble quads whose top bits one quad holds */
        v |= (q[64 * (4 + j / per) + 4 * i + c % 4] >> (w * (j % per) + 4 * hi) & ((1 << w) - 1)) << 4;
    }
    return v;
}
TEST(cpu_qweight_pack_layout) {
    rng r = rng_make("qpack");
    FOR_WEIGHT_DTYPES(t, LLMI_Q8_0) {
        const int kq = superblock((llmi_dtype)t), rows = 21, cols = kq ? 512 : 96, nb = cols / 32;
        llmi_tensor w = make_weight(&r, (llmi_dtype)t, rows, cols), pk;
        llmi_status st;
        CHECK(cpu_qweight_pack(&w, &pk, &st) == 0);
        CHECK(pk.layout == LLMI_LAYOUT_CPU16 && pk.rows == rows && pk.cols == cols);
        const int bits = t == LLMI_Q8_0 ? 8 : t == LLMI_Q6_K ? 6 : (t == LLMI_Q5_0 || t == LLMI_Q5_1 || t == LLMI_Q5_K) ? 5
                       : t == LLMI_Q3_K ? 3 : t == LLMI_Q2_K ? 2 : 4;
        const size_t head = t == LLMI_Q4_1 || t == LLMI_Q5_1 || t == LLMI_Q2_K ? 64 : t == LLMI_IQ4_XS ? 16 : 32;
        const size_t pb = head + 64 * (size_t)bits;
        const int halves = t == LLMI_Q6_K || t == LLMI_Q3_K;   /* a signed scale per 16 columns, d alone */
        const int dalone = halves || t == LLMI_IQ4_XS;          /* int8 scales under d alone */
        const size_t shead = kq ? (dalone ? 64 : 128) : 0, gb = kq ? (size_t)nb / 8 * (shead + 8 * pb) : (size_t)nb * pb;
        const double bpw[] = {[LLMI_Q8_0] = 8.5, [LLMI_Q4_0] = 4.5, [LLMI_Q4_1] = 5, [LLMI_Q4_K] = 4.75,
                              [LLMI_Q5_K] = 5.75, [LLMI_Q6_K] = 6.625, [LLMI_Q5_0] = 5.5, [LLMI_Q5_1] = 6,
                              [LLMI_Q3_K] = 3.625, [LLMI_IQ4_NL] = 4.5, [LLMI_IQ4_XS] = 4.375, [LLMI_Q2_K] = 3.25};
        CHECK_MSG(cpu_qweight_bytes(&w) == 2 * gb && (double)gb * 8 == bpw[t] * 16 * cols,
                  "%s: %zu packed bytes", dtype_name((llmi_dtype)t), cpu_qweight_bytes(&w));
        int mism = 0;
        size_t bb = dtype_block_bytes(w.dtype);
        for (int row = 0; row < 32; row++)
            for (int b = 0; b < nb; b++) {
                const uint8_t *gp = (const uint8_t *)pk.data + (size_t)(row / 16) * gb;
                const uint8_t *sh = kq ? gp + (size_t)(b / 8) * (shead + 8 * pb) : NULL;   /* super-block head */
                const uint8_t *g = kq ? sh + shead + (size_t)(b % 8) * pb : gp + (size_t)b * pb;
                const int i = row % 16, sub = kq ? b % 8 : 0;
                const uint8_t *blk = row < rows ? (const uint8_t *)w.data + w.row_bytes * row + bb * (size_t)(kq ? b / 8 : b) : NULL;
                if (t == LLMI_Q2_K) {   /* d times scales, -dmin times mins, per half */
                    float f[4] = {0, 0, 0, 0}, sd, snd, got[4];
                    if (blk) q2k_factors(blk, sub, f);
                    memcpy(&sd, sh + 4 * i, 4);
                    memcpy(&snd, sh + 64 + 4 * i, 4);
                    for (int k = 0; k < 4; k++) got[k] = (k < 2 ? sd : snd) * (float)g[16 * k + i];
                    mism += memcmp(got, f, sizeof f) != 0;
                    if (blk) mism += sd != (float)get_half(blk + 80) || snd != -(float)get_half(blk + 82);
                } else if (kq) {   /* fp32 d (-dmin) times the sub-block's integer scale (min): the exact factors */
                    float f[2] = {0, 0}, sd, snd = 0;
                    if (blk) kq_factors((llmi_dtype)t, blk, sub, f);
                    memcpy(&sd, sh + 4 * i, 4);
                    if (!dalone) memcpy(&snd, sh + 64 + 4 * i, 4);
                    const int s0 = dalone ? (int8_t)g[i] : g[i];
                    const int s1 = t == LLMI_IQ4_XS ? 0 : halves ? (int8_t)g[16 + i] : g[16 + i];
                    const float got[2] = {sd * (float)s0, (halves ? sd : snd) * (float)s1};
                    mism += memcmp(got, f, sizeof f) != 0;
                    if (blk) mism += sd != (float)get_half(blk + (t == LLMI_Q6_K ? 208 : t == LLMI_Q3_K ? 108 : 0));
                } else {    /* the block's fp16 d (and m) bytes */
                    for (int k = 0; k < 2; k++) mism += g[2 * i + k] != (blk ? blk[k] : 0);
                    if (head == 64) for (int k = 0; k < 2; k++) mism += g[32 + 2 * i + k] != (blk ? blk[2 + k] : 0);
                }
                for (int c = 0; c < 32; c++) {
                    int want = 0;
                    if (blk) switch (t) {
                        case LLMI_Q8_0: want = (int8_t)blk[2 + c] + 128; break;
                        case LLMI_Q4_0: case LLMI_Q4_1: case LLMI_IQ4_NL: {
                            const uint8_t qb = blk[(t == LLMI_Q4_1 ? 4 : 2) + c % 16];
                            want = c < 16 ? qb & 15 : qb >> 4;
                            break;
                        }
                        default: want = kq_code((llmi_dtype)t, blk, 32 * sub + c); break;
                        }
                    mism += packed_code(bits, g + head, i, c) != want;
                }
            }
        CHECK_MSG(mism == 0, "%s: %d packed values out of place", dtype_name((llmi_dtype)t), mism);
        float x[3 * 512], y0[3 * 21], y1[3 * 21];
        for (int i = 0; i < 3 * cols; i++) x[i] = rng_unif(&r);
        cpu_matmul(&w, x, 3, NULL, y0);
        cpu_matmul(&pk, x, 3, NULL, y1);
        CHECK(memcmp(y0, y1, sizeof y0) == 0);
        llmi_tensor again;
        CHECK(cpu_qweight_pack(&pk, &again, &st) != 0);   /* a packed weight is not packed twice */
        free(pk.owned);
        free(w.owned);
    }
}

TEST(cpu_norms_and_swiglu) {
    rng r = rng_make("norm");
    int n = 7, dim = 203;
    float *x = rand_vec(&r, (size_t)n * dim, 3.0f), *w = rand_vec(&r, dim, 1.0f), *d = rand_vec(&r, (size_t)n * dim, 1.0f);
    float *out = malloc(sizeof(float) * n * dim), *ref = malloc(sizeof(float) * n * dim);
    float *res = malloc(sizeof(float) * n * dim), *resref = malloc(sizeof(float) * n * dim);
    float eps = 1e-5f;
    cpu_rmsnorm(x, w, n, dim, eps, out);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)x[t * dim + i] * x[t * dim + i];
        double s = 1.0 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++) ref[t * dim + i] = (float)(x[t * dim + i] * s * w[i]);
    }
    CHECK_MSG(test_nmse(out, ref, (long)n * dim) < 1e-12, "rmsnorm NMSE %g", test_nmse(out, ref, (long)n * dim));
    memcpy(res, x, sizeof(float) * n * dim);
    cpu_add_rmsnorm(res, d, w, n, dim, eps, out);
    for (int t = 0; t < n; t++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            resref[t * dim + i] = x[t * dim + i] + d[t * dim + i];
            ss += (double)resref[t * dim + i] * resref[t * dim + i];
        }
        double s = 1.0 / sqrt(ss / dim + eps);
        for (int i = 0; i < dim; i++) ref[t * dim + i] = (float)(resref[t * dim + i] * s * w[i]);
    }
    CHECK(memcmp(res, resref, sizeof(float) * n * dim) == 0);
    CHECK_MSG(test_nmse(out, ref, (long)n * dim) < 1e-12, "add_rmsnorm NMSE %g", test_nmse(out, ref, (long)n * dim));
    cpu_swiglu(x, d, n, dim, out);
    for (int i = 0; i < n * dim; i++) ref[i] = (float)(x[i] / (1.0 + exp(-(double)x[i])) * d[i]);
    CHECK_MSG(test_nmse(out, ref, (long)n * dim) < 1e-12, "swiglu NMSE %g", test_nmse(out, ref, (long)n * dim));
    free(x); free(w); free(d); free(out); free(ref); free(res); free(resref);
}

/* SwiGLU's vector body reproduces the scalar formula with libm's expf bit for bit: random
 * bit patterns (NaN, inf, subnormals included), values near the |g| < 88 switch to the
 * scalar path, and ordinary activations, at every offset so the vector and tail paths mix. */
TEST(cpu_swiglu_bits_equal_libm) {
    rng r = rng_make("swiglu_bits");
    enum { N = 1 << 16 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)rng_next(&r);
        switch (i % 4) {
        case 0: memcpy(&g[i], &bits, 4); break;                             /* any float */
        case 1: g[i] = 88.0f + 0.01f * (float)rng_int(&r, 200) - 1.0f; if (i & 8) g[i] = -g[i]; break;
        default: g[i] = rng_unif(&r) * (i % 4 == 2 ? 12.0f : 90.0f); break;
        }
        u[i] = rng_unif(&r) * 4.0f;
    }
    long bad = 0;
    for (int off = 0; off < 17; off++) {
        cpu_swiglu_range(g, u, (size_t)off, N, out);
        for (int i = off; i < N; i++) {
            float want = g[i] / (1.0f + expf(-g[i])) * u[i];
            if (memcmp(&want, &out[i], 4) != 0) {
                if (bad++ < 3) fprintf(stderr, "  g=%a u=%a: %a, libm formula %a\n", g[i], u[i], out[i], want);
            }
        }
    }
    CHECK_MSG(bad == 0, "%ld SwiGLU values differ from the scalar formula", bad);
    free(g); free(u); free(out);
}

/* GeGLU: against torch's gelu(approximate="tanh") formula in double on ordinary
 * activations, and its vector body against the scalar formula bit for bit on the inputs of
 * the SwiGLU test (any bit pattern, the |y| < 88 switch, every offset). */
/* Gemma 2's soft cap (cpu_logits_finish, the vector tanh of vec.h in an AVX-512 build)
 * against cap * tanh(x / cap) in double: 200,001 values across [-300, 300] (both tanh
 * branches, the switch at |x / cap| = 0.625, saturation) for three caps, on strided rows
 * whose other columns stay untouched. */
TEST(cpu_softcap_vs_tanh) {
    const float caps[3] = {0.5f, 30.0f, 50.0f};
    const int n = 200001, stride = n + 3;
    float *y = malloc(sizeof(float) * 2 * stride), *x = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) x[i] = -300.0f + 600.0f * (float)i / (float)(n - 1);
    for (int k = 0; k < 3; k++) {
        for (int r = 0; r < 2; r++) {
            memcpy(y + (size_t)r * stride, x, sizeof(float) * n);
            for (int j = n; j < stride; j++) y[(size_t)r * stride + j] = 7.0f;
        }
        cpu_logits_finish(y, 2, stride, 0, n, 1.0f, caps[k]);
        double worst = 0;
        int tail = 0;
        for (int r = 0; r < 2; r++) {
            for (int i = 0; i < n; i++) {
                const double want = caps[k] * tanh((double)x[i] / caps[k]), got = y[(size_t)r * stride + i];
                const double e = fabs(got - want) / (fabs(want) > 1e-30 ? fabs(want) : 1.0);
                worst = e > worst ? e : worst;
            }
            for (int j = n; j < stride; j++) tail += y[(size_t)r * stride + j] != 7.0f;
        }
        fprintf(stderr, "  softcap %g: max relative error %.3g\n", (double)caps[k], worst);
        CHECK_MSG(worst < 5e-7 && tail == 0, "softcap %g: max relative error %g, %d columns past c1 changed",
                  (double)caps[k], worst, tail);
    }
    float z[2] = {0.0f, -0.0f};
    cpu_logits_finish(z, 1, 2, 0, 2, 1.0f, 30.0f);
    CHECK(z[0] == 0.0f && z[1] == 0.0f);
    free(y);
    free(x);
}

/* Granite's logits_scaling (cpu_logits_finish's divisor): each logit of columns [c0, c1) is
 * x / d exactly as a float division (transformers' logits / logits_scaling), the columns
 * outside untouched; with a cap as well, the division comes first (cap * tanh((x / d) / cap)
 * in double). */
TEST(cpu_logits_divisor) {
    rng r = rng_make("logits_divisor");
    const float divs[3] = {16.0f, 8.0f, 3.3f};
    const int n = 3, stride = 1003, c0 = 5, c1 = 990;
    float *y = malloc(sizeof(float) * n * stride), *x = malloc(sizeof(float) * n * stride);
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < n * stride; i++) x[i] = 100.0f * rng_unif(&r);
        memcpy(y, x, sizeof(float) * n * stride);
        const float cap = k == 2 ? 5.0f : 0.0f;
        cpu_logits_finish(y, n, stride, c0, c1, divs[k], cap);
        long bad = 0;
        double worst = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < stride; j++) {
                const float xv = x[(size_t)t * stride + j], got = y[(size_t)t * stride + j];
                if (j < c0 || j >= c1) {
                    bad += got != xv;
                } else if (cap == 0) {
                    bad += got != xv / divs[k];
                } else {
                    const double want = cap * tanh((double)(xv / divs[k]) / cap);
                    const double e = fabs(got - want) / (fabs(want) > 1e-30 ? fabs(want) : 1.0);
                    worst = e > worst ? e : worst;
                }
            }
        CHECK_MSG(bad == 0 && worst < 5e-7, "divisor %g cap %g: %ld values wrong, max relative error %g",
                  (double)divs[k], (double)cap, bad, worst);
    }
    free(y);
    free(x);
}

TEST(cpu_geglu_vs_tanh_formula) {
    rng r = rng_make("geglu");
    enum { N = 1 << 14 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * N);
    float *ref = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        g[i] = rng_unif(&r) * (i % 3 == 0 ? 12.0f : 4.0f);
        u[i] = rng_unif(&r) * 3.0f;
        double x = g[i];
        ref[i] = (float)(0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i]);
    }
    cpu_geglu(g, u, 4, N / 4, out);
    double e = test_nmse(out, ref, N);
    CHECK_MSG(e < 1e-12, "geglu NMSE %g vs 0.5 x (1 + tanh(...))", e);
    for (int i = 0; i < N; i++) {
        uint32_t bits = (uint32_t)rng_next(&r);
        if (i % 4 == 0) memcpy(&g[i], &bits, 4);
        if (i % 4 == 1) g[i] = (i & 8 ? -1.0f : 1.0f) * (3.8f + 0.005f * (float)rng_int(&r, 100));   /* |y| near 88 */
    }
    long bad = 0;
    for (int off = 0; off < 17; off++) {
        cpu_geglu_range(g, u, (size_t)off, N, out);
        for (int i = off; i < N; i++) {
            float want = g[i] / (1.0f + expf(-1.5957691216057308f * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
            if (memcmp(&want, &out[i], 4) != 0 && bad++ < 3)
                fprintf(stderr, "  g=%a u=%a: %a, scalar formula %a\n", g[i], u[i], out[i], want);
        }
    }
    CHECK_MSG(bad == 0, "%ld GeGLU values differ from the scalar formula", bad);
    free(g); free(u); free(out); free(ref);
}

#if defined(__AVX512F__)
/* vec_expf16 against libm's expf directly, on every 509th float of |x| < 88 (4.4 million,
 * every table entry and exponent): a wrong bit in a table entry or coefficient shows here
 * where the SwiGLU test above would round it away.  (All 2.24e9 floats of the range were
 * compared once when it was written: none differ.) */
TEST(cpu_vec_expf_bits_equal_libm) {
    long bad = 0, n = 0;
    float x[16], got[16];
    int k = 0;
    for (uint64_t bits = 0; bits < (1ull << 32); bits += 509) {
        float f;
        uint32_t b = (uint32_t)bits;
        memcpy(&f, &b, 4);
        if (!(fabsf(f) < 88.0f)) continue;
        x[k++] = f;
        if (k < 16) continue;
        _mm512_storeu_ps(got, vec_expf16(_mm512_loadu_ps(x)));
        for (int i = 0; i < 16; i++, n++) {
            float want = expf(x[i]);
            if (memcmp(&want, &got[i], 4) != 0 && bad++ < 3) fprintf(stderr, "  expf(%a) = %a, vec %a\n", x[i], want, got[i]);
        }
        k = 0;
    }
    CHECK(n > 4000000);
    CHECK_MSG(bad == 0, "%ld of %ld differ", bad, n);
}
#endif

/* The KV write's f16/bf16 conversion equals the scalar f32_to_fp16 / f32_to_bf16 (round to
 * nearest even, overflow to inf, subnormals, NaN) on random bit patterns and ordinary
 * values, at every length so the vector and tail paths both run. */
TEST(cpu_kv_write_f16_bf16_bits_equal_scalar) {
    rng r = rng_make("kv_write_bits");
    enum { N = 4099 };
    float *x = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++) {
        uint32_t b = (uint32_t)rng_next(&r);
        if (i % 3 == 0) memcpy(&x[i], &b, 4);
        else if (i % 3 == 1) x[i] = rng_unif(&r) * 70000.0f;               /* around fp16's range */
        else x[i] = rng_unif(&r) * 1e-5f;                                  /* fp16 subnormals */
    }
    long bad = 0;
    for (int kind = 0; kind < 2; kind++) {
        llmi_kv_dtype t = kind ? LLMI_KV_BF16 : LLMI_KV_F16;
        for (int n = 1; n <= 40; n++) {
            vec_f32_to_kv(x, t, 1.0f, h, n);
            for (int i = 0; i < n; i++) bad += h[i] != (kind ? f32_to_bf16(x[i]) : f32_to_fp16(x[i]));
        }
        vec_f32_to_kv(x, t, 1.0f, h, N);
        for (int i = 0; i < N; i++) {
            uint16_t want = kind ? f32_to_bf16(x[i]) : f32_to_fp16(x[i]);
            if (h[i] != want && bad++ < 3) fprintf(stderr, "  %s(%a) = %04x, scalar %04x\n", kind ? "bf16" : "f16", x[i], h[i], want);
        }
    }
    CHECK_MSG(bad == 0, "%ld conversions differ", bad);
    free(x); free(h);
}

/* transformers' _compute_default_rope_parameters / _compute_llama3_parameters, in double. */
static double ref_inv_freq(const llmi_config *c, int i) {
    double f = pow(c->rope_theta, -(2.0 * i) / c->head_dim);
    if (c->rope_scaling == LLMI_ROPE_SCALING_LINEAR) return f / c->rope_factor;
    if (c->rope_scaling != LLMI_ROPE_SCALING_LLAMA3) return f;
    double wl = 2 * M_PI / f, lo_wl = c->rope_orig_max_pos / c->rope_low_freq_factor;
    double hi_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;
    if (wl < hi_wl) return f;
    if (wl > lo_wl) return f / c->rope_factor;
    double sm = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return (1 - sm) * f / c->rope_factor + sm * f;
}

TEST(cpu_rope_inv_freq_scalings) {
    llmi_config c = {0};
    c.head_dim = 128;
    c.rope_dim = 128;
    c.rope_theta = 500000.0f;
    float f[64];
    for (int s = 0; s < 3; s++) {
        c.rope_scaling = s == 0 ? LLMI_ROPE_SCALING_NONE : s == 1 ? LLMI_ROPE_SCALING_LINEAR : LLMI_ROPE_SCALING_LLAMA3;
        c.rope_factor = 8.0f;
        c.rope_low_freq_factor = 1.0f;
        c.rope_high_freq_factor = 4.0f;
        c.rope_orig_max_pos = 8192;
        backend_rope_inv_freq(&c, f);
        int n_lo = 0, n_mid = 0;
        for (int i = 0; i < 64; i++) {
            double rf = ref_inv_freq(&c, i);
            CHECK_MSG(fabs(f[i] - rf) <= 1e-6 * rf, "scaling %d inv_freq[%d] = %g, want %g", s, i, f[i], rf);
            double wl = 2 * M_PI / pow(c.rope_theta, -(2.0 * i) / 128);
            n_lo += wl > 8192;
            n_mid += wl <= 8192 && wl >= 2048;
        }
        if (s == 2) CHECK(n_lo > 0 && n_mid > 0);   /* the test covers all three llama3 bands */
    }
    /* Llama-3.1 published values (factor 8, low 1, high 4, 8192): the last is base / 8 */
    c.rope_scaling = LLMI_ROPE_SCALING_LLAMA3;
    backend_rope_inv_freq(&c, f);
    CHECK(fabs(f[63] - pow(500000.0, -126.0 / 128) / 8) < 1e-12);
    CHECK(f[0] == 1.0f);
}

static double kv_get(const void *cache, llmi_kv_dtype t, size_t i) {
    if (t == LLMI_KV_F32) return ((const float *)cache)[i];
    uint16_t h = ((const uint16_t *)cache)[i];
    return t == LLMI_KV_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

/* Full, partial and no RoPE (Phi-4-mini rotates each head's first rope_dim values, the rest
 * pass through unchanged; SmolLM3's NoPE layers none), the partial ones with an attention factor on cos and sin
 * (longrope's, which must not touch the passed-through values), against the rotate-half
 * formula in double. */
TEST(cpu_rope_kv_write) {
    rng r = rng_make("rope");
    int n = 6, nh = 6, nkv = 2, hd = 34, nslots = 40;
    llmi_config c = {0};
    c.head_dim = hd;
    c.rope_theta = 10000.0f;
    float inv[17];
    for (int run = 0; run < 6; run++) {
        llmi_kv_dtype kd = (llmi_kv_dtype)(run % 3);
        /* even, [2, hd - 2]; the last 0, a layer without RoPE (SmolLM3's NoPE) */
        const int rd = run < 3 ? hd : run == 5 ? 0 : 2 + 2 * rng_int(&r, hd / 2 - 1);
        const float ms = run < 3 ? 1.0f : 1.1547f;
        c.rope_dim = rd;
        backend_rope_inv_freq(&c, inv);
        float *q = rand_vec(&r, (size_t)n * nh * hd, 1), *k = rand_vec(&r, (size_t)n * nkv * hd, 1);
        float *v = rand_vec(&r, (size_t)n * nkv * hd, 1);
        float *q0 = malloc(sizeof(float) * n * nh * hd), *k0 = malloc(sizeof(float) * n * nkv * hd);
        memcpy(q0, q, sizeof(float) * n * nh * hd);
        memcpy(k0, k, sizeof(float) * n * nkv * hd);
        int32_t pos[6], slot[6];
        for (int i = 0; i < n; i++) { pos[i] = rng_int(&r, 5000); slot[i] = i * 7 % nslots; }
        size_t esz = kd == LLMI_KV_F32 ? 4 : 2;
        void *kc = calloc((size_t)nslots * nkv * hd, esz), *vc = calloc((size_t)nslots * nkv * hd, esz);
        cpu_rope_kv_write(q, k, v, pos, slot, n, nh, nkv, hd, rd, inv, ms, kc, vc, kd, NULL, NULL);
        double maxq = 0, maxk = 0, maxc = 0;
        int passed_changed = 0;
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < nh + nkv; h++) {
                const float *src = h < nh ? q0 + ((size_t)t * nh + h) * hd : k0 + ((size_t)t * nkv + h - nh) * hd;
                const float *got = h < nh ? q + ((size_t)t * nh + h) * hd : k + ((size_t)t * nkv + h - nh) * hd;
                for (int i = 0; i < rd / 2; i++) {
                    double ang = (double)pos[t] * pow(10000.0, -2.0 * i / rd);
                    double a = src[i], b = src[i + rd / 2];
                    double ra = ms * (a * cos(ang) - b * sin(ang)), rb = ms * (b * cos(ang) + a * sin(ang));
                    double e = fmax(fabs(got[i] - ra), fabs(got[i + rd / 2] - rb));
                    if (h < nh) maxq = fmax(maxq, e); else maxk = fmax(maxk, e);
                }
                for (int i = rd; i < hd; i++) passed_changed += got[i] != src[i];
            }
            for (int i = 0; i < nkv * hd; i++) {
                size_t ci = (size_t)slot[t] * nkv * hd + i;
                double tol = kd == LLMI_KV_F32 ? 0 : kd == LLMI_KV_F16 ? 1e-3 : 8e-3;
                double ek = fabs(kv_get(kc, kd, ci) - k[(size_t)t * nkv * hd + i]);
                double ev = fabs(kv_get(vc, kd, ci) - v[(size_t)t * nkv * hd + i]);
                if (ek > tol || ev > tol) maxc = fmax(maxc, fmax(ek, ev));
            }
        }
        /* fp32 angles at positions up to 5000 lose ~pos * 2^-24 rad: 3e-4 abs */
        CHECK_MSG(maxq < 1e-3 && maxk < 1e-3, "rope_dim %d: rope max err q %g k %g", rd, maxq, maxk);
        CHECK_MSG(passed_changed == 0, "rope_dim %d: %d values past it changed", rd, passed_changed);
        CHECK_MSG(maxc == 0, "kv cache %d write err %g", (int)kd, maxc);
        free(q); free(k); free(v); free(q0); free(k0); free(kc); free(vc);
    }
}

TEST(cpu_paged_attention_vs_dense) {
    rng r = rng_make("attn");
    int nh = 6, nkv = 2, bs = 4, n_seqs = 4, maxb = 12, nblocks = 48;
    /* each KV dtype, with a head_dim off and on the 16-lane grid; each without a window and
     * with windows of 1 key, a random one inside a 16-position chunk, and one past a chunk;
     * each without and with a soft cap (Gemma 2) small enough to bend most scores */
    for (int kw = 0; kw < 48; kw++) {
        const int kt = kw % 6, wi = (kw / 6) % 4;
        const float softcap = kw < 24 ? 0.0f : 1.5f + rng_unif(&r);
        const int window = wi == 0 ? 0 : wi == 1 ? 1 : wi == 2 ? 2 + rng_int(&r, 14) : 17 + rng_int(&r, 20);
        llmi_kv_dtype kd = (llmi_kv_dtype)(kt % 3);
        int hd = kt < 3 ? 40 : 64;
        size_t esz = kd == LLMI_KV_F32 ? 4 : 2, row = (size_t)nkv * hd;
        /* random block tables: a shuffled permutation of all blocks, dealt to sequences */
        int32_t perm[48], tables[4 * 12], qs[5], seqlen[4];
        for (int i = 0; i < nblocks; i++) perm[i] = i;
        for (int i = nblocks - 1; i > 0; i--) { int j = rng_int(&r, i + 1); int tmp = perm[i]; perm[i] = perm[j]; perm[j] = tmp; }
        memcpy(tables, perm, sizeof tables);
        /* seq 0: decode token, seq 1: whole prefill, seq 2: prefill chunk after cache, seq 3: decode */
        int newtok[4] = {1, 1 + rng_int(&r, 20), 2 + rng_int(&r, 9), 1};
        seqlen[0] = 1 + rng_int(&r, 40); seqlen[1] = newtok[1]; seqlen[2] = newtok[2] + 5 + rng_int(&r, 20);
        seqlen[3] = 1 + rng_int(&r, 47);
        int n = 0;
        qs[0] = 0;
        for (int s = 0; s < n_seqs; s++) { n += newtok[s]; qs[s + 1] = n; }
        int32_t *pos = malloc(sizeof(int32_t) * n), *sot = malloc(sizeof(int32_t) * n), *slot = malloc(sizeof(int32_t) * n);
        for (int s = 0; s < n_seqs; s++)
            for (int i = qs[s]; i < qs[s + 1]; i++) {
                sot[i] = s;
                pos[i] = seqlen[s] - newtok[s] + (i - qs[s]);
                slot[i] = tables[s * maxb + pos[i] / bs] * bs + pos[i] % bs;
            }
        size_t cache_elems = (size_t)nblocks * bs * row;
        float *kf = rand_vec(&r, cache_elems, 2.0f), *vf = rand_vec(&r, cache_elems, 1.0f);
        void *kc = malloc(cache_elems * esz), *vc = malloc(cache_elems * esz);
        for (size_t i = 0; i < cache_elems; i++) {
            if (kd == LLMI_KV_F32) { ((float *)kc)[i] = kf[i]; ((float *)vc)[i] = vf[i]; }
            else if (kd == LLMI_KV_F16) { ((uint16_t *)kc)[i] = f32_to_fp16(kf[i]); ((uint16_t *)vc)[i] = f32_to_fp16(vf[i]); }
            else { ((uint16_t *)kc)[i] = f32_to_bf16(kf[i]); ((uint16_t *)vc)[i] = f32_to_bf16(vf[i]); }
        }
        float *q = rand_vec(&r, (size_t)n * nh * hd, 1.0f), *out = malloc(sizeof(float) * n * nh * hd);
        float *ref = malloc(sizeof(float) * n * nh * hd);
        llmi_batch b = {0};
        b.n_tokens = n; b.positions = pos; b.slot_mapping = slot; b.seq_of_token = sot; b.n_seqs = n_seqs;
        b.query_start = qs; b.block_tables = tables; b.max_blocks_per_seq = maxb;
        float scale = 1.0f / sqrtf((float)hd);
        const cpu_attn_scores sco = {.scale = scale, .softcap = softcap, .window = window};
        cpu_paged_attention(q, kc, vc, kd, NULL, NULL, &b, nh, nkv, hd, bs, sco, out);
        double sc[64];
        for (int t = 0; t < n; t++)
            for (int h = 0; h < nh; h++) {
                int s = sot[t], kvh = h / (nh / nkv), len = pos[t] + 1, p0 = window && len > window ? len - window : 0;
                double mx = -INFINITY, sum = 0;
                for (int p = 0; p < p0; p++) sc[p] = 0;   /* outside the window: weight 0 */
                for (int p = p0; p < len; p++) {
                    size_t base = ((size_t)tables[s * maxb + p / bs] * bs + p % bs) * row + (size_t)kvh * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[((size_t)t * nh + h) * hd + i] * kv_get(kc, kd, base + i);
                    sc[p] = softcap > 0 ? softcap * tanh(d * scale / softcap) : d * scale;
                    mx = fmax(mx, sc[p]);
                }
                for (int p = p0; p < len; p++) sum += (sc[p] = exp(sc[p] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int p = 0; p < len; p++) {
                        size_t base = ((size_t)tables[s * maxb + p / bs] * bs + p % bs) * row + (size_t)kvh * hd;
                        o += sc[p] / sum * kv_get(vc, kd, base + i);
                    }
                    ref[((size_t)t * nh + h) * hd + i] = (float)o;
                }
            }
        double e = test_nmse(out, ref, (long)n * nh * hd);
        CHECK_MSG(e < 1e-10, "attention kv dtype %d head_dim %d window %d softcap %g NMSE %g", kt % 3, hd, window,
                  (double)softcap, e);
        /* the decode step's share-by-share form: the same bits whatever units share a call */
        float *part = malloc(sizeof(float) * n * nh * hd);
        int split = 1 + rng_int(&r, n * nh - 1);
        cpu_paged_attention_part(q, kc, vc, kd, NULL, NULL, &b, nh, nkv, hd, bs, sco, 0, split, part);
        cpu_paged_attention_part(q, kc, vc, kd, NULL, NULL, &b, nh, nkv, hd, bs, sco, split, n * nh, part);
        CHECK_MSG(memcmp(part, out, sizeof(float) * n * nh * hd) == 0, "window %d: attention_part differs from attention",
                  window);
        free(part);
        free(pos); free(sot); free(slot); free(kf); free(vf); free(kc); free(vc); free(q); free(out); free(ref);
    }
}

/* Each dtype alone, then weights of mixed quantized dtypes (a Q4_K_M file's layers mix
 * Q4_K and Q6_K, some Q8_0) sharing one quantization of x. */
TEST(cpu_matmul_multi_matches_single) {
    rng r = rng_make("multi");
    const llmi_dtype mixes[][3] = {{LLMI_Q4_K, LLMI_Q6_K, LLMI_Q8_0}, {LLMI_Q5_K, LLMI_Q4_0, LLMI_Q6_K},
                                   {LLMI_Q4_1, LLMI_Q4_K, LLMI_F16}, {LLMI_Q3_K, LLMI_Q5_0, LLMI_Q4_K},
                                   {LLMI_IQ4_XS, LLMI_IQ4_NL, LLMI_Q6_K}, {LLMI_Q2_K, LLMI_Q3_K, LLMI_Q4_K}};
    const int n_single = LLMI_DTYPE_COUNT, n_mix = sizeof mixes / sizeof mixes[0];
    for (int k = 0; k < n_single + n_mix; k++) {
        if (k == LLMI_I4G) continue;
        llmi_dtype dt[3];
        for (int i = 0; i < 3; i++) dt[i] = k < n_single ? (llmi_dtype)k : mixes[k - n_single][i];
        int kq = superblock(dt[0]) || superblock(dt[1]) || superblock(dt[2]);
        int n = 1 + rng_int(&r, 20), cols = kq ? 512 : 96, t = k;
        llmi_tensor w[3] = {make_weight(&r, dt[0], 64, cols), make_weight(&r, dt[1], 17, cols),
                            make_weight(&r, dt[2], 33, cols)};
        const llmi_tensor *wp[3] = {&w[0], &w[1], &w[2]};
        float *x = rand_vec(&r, (size_t)n * cols, 1.0f), *bias = rand_vec(&r, 64, 1.0f);
        const float *bp[3] = {bias, NULL, bias};
        float *y[3], *y1 = malloc(sizeof(float) * n * 64);
        for (int i = 0; i < 3; i++) y[i] = malloc(sizeof(float) * n * w[i].rows);
        size_t sb = cpu_matmul_scratch_bytes(n, cols);
        void *scratch = aligned_alloc(64, sb);
        cpu_matmul_multi(3, wp, x, n, bp, y, scratch, sb);
        free(scratch);
        for (int i = 0; i < 3; i++) {
            cpu_matmul(&w[i], x, n, bp[i], y1);
            CHECK_MSG(memcmp(y1, y[i], sizeof(float) * n * w[i].rows) == 0, "case %d (%s) weight %d differs", t,
                      dtype_name(dt[i]), i);
            free(y[i]);
            free(w[i].owned);
        }
        free(x); free(bias); free(y1);
    }
}

/* ---- quantized KV cache: formats against outside references, attention against f32 KV ---- */

static cJSON *kvq_refs(test_ctx *t_) {
    const char *td = getenv("TESTDATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/kvquant/refs.json", td && *td ? td : "testdata");
    char *text = NULL;
    size_t len = 0;
    llmi_status st = {0};
    fileio_opts fo = {.flag = "refs", .max_bytes = 1 << 24};
    if (fileio_read(path, &fo, &text, &len, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    CHECK_MSG(j != NULL, "%s: not JSON", path);
    return j;
}

/* Every e4m3 code decodes as ml_dtypes' float8_e4m3fn does, and fp32 values (random over
 * the whole range, every representable value, every midpoint and its neighbours,
 * saturating ones) encode to ml_dtypes' round-to-nearest-even code. */
TEST(kv_fp8_e4m3_matches_ml_dtypes) {
    cJSON *j = kvq_refs(t_);
    if (!j) return;
    const cJSON *dec = cJSON_GetObjectItem(j, "e4m3_decode"), *enc = cJSON_GetObjectItem(j, "e4m3_encode");
    CHECK(cJSON_GetArraySize(dec) == 256 && cJSON_GetArraySize(enc) > 3000);
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        const cJSON *v = cJSON_GetArrayItem(dec, b);
        float got = e4m3_to_f32((uint8_t)b);
        if (cJSON_IsNull(v) ? !isnan(got) : got != (float)v->valuedouble) bad++;
    }
    CHECK_MSG(bad == 0, "%d e4m3 codes decode differently", bad);
    bad = 0;
    const cJSON *pair;
    cJSON_ArrayForEach(pair, enc) {
        float x = (float)cJSON_GetArrayItem(pair, 0)->valuedouble;
        int want = cJSON_GetArrayItem(pair, 1)->valueint, got = f32_to_e4m3(x);
        if (got != want && bad++ < 5) fprintf(stderr, "  e4m3(%.9g) = 0x%02x, ml_dtypes 0x%02x\n", x, got, want);
    }
    CHECK_MSG(bad == 0, "%d of %d encodings differ", bad, cJSON_GetArraySize(enc));
    cJSON_Delete(j);
}

/* q8 blocks are byte for byte what ggml's quantize_row_q8_0 (via gguf-py) writes. */
TEST(kv_q8_matches_ggml_q8_0) {
    cJSON *j = kvq_refs(t_);
    if (!j) return;
    const cJSON *blocks = cJSON_GetObjectItem(j, "q8_0"), *blk;
    int bad = 0, n = 0;
    cJSON_ArrayForEach(blk, blocks) {
        float x[KV_Q8_BLOCK];
        uint8_t got[KV_Q8_BLOCK_BYTES];
        const cJSON *xs = cJSON_GetObjectItem(blk, "x"), *want = cJSON_GetObjectItem(blk, "bytes");
        for (int i = 0; i < KV_Q8_BLOCK; i++) x[i] = (float)cJSON_GetArrayItem(xs, i)->valuedouble;
        q8_block_quantize(x, got);
        for (int i = 0; i < KV_Q8_BLOCK_BYTES; i++) bad += got[i] != cJSON_GetArrayItem(want, i)->valueint;
        n++;
    }
    CHECK(n > 40);
    CHECK_MSG(bad == 0, "%d bytes of %d blocks differ from ggml's q8_0", bad, n);
    cJSON_Delete(j);
}

/* Attention over a q8 / fp8 cache written by the real write path, against the same
 * attention over an f32 cache.  Bounds from the formats: q8 rounds each value to within
 * d/2, d = amax/127 of its block of 32, i.e. ~0.6% of sigma rms for Gaussian data, a
 * relative MSE ~3e-5 per K and V value; e4m3 keeps 3 mantissa bits, ~2^-4/sqrt(3) = 3.6%
 * relative rms, MSE ~1.3e-3.  Attention output mixes both; the bounds are ~10x those. */
TEST(kv_quant_attention_vs_f32_kv) {
    rng r = rng_make("kvq");
    const int nh = 8, nkv = 2, hd = 64, bs = 16, n = 96, nblocks = 8;
    llmi_config c = {0};
    c.head_dim = hd, c.rope_dim = hd, c.rope_theta = 10000.0f;
    float inv[32];
    backend_rope_inv_freq(&c, inv);
    float *q0 = rand_vec(&r, (size_t)n * nh * hd, 1.0f), *k0 = rand_vec(&r, (size_t)n * nkv * hd, 3.0f);
    float *v0 = rand_vec(&r, (size_t)n * nkv * hd, 1.0f);
    int32_t pos[96], slot[96], sot[96], table[8], qs[2] = {0, n};
    for (int i = 0; i < nblocks; i++) table[i] = (i * 5 + 3) % nblocks;
    for (int i = 0; i < n; i++) pos[i] = i, sot[i] = 0, slot[i] = table[i / bs] * bs + i % bs;
    llmi_batch b = {.n_tokens = n, .positions = pos, .slot_mapping = slot, .seq_of_token = sot, .n_seqs = 1,
                    .query_start = qs, .block_tables = table, .max_blocks_per_seq = nblocks};
    float *ref = malloc(sizeof(float) * n * nh * hd), *out = malloc(sizeof(float) * n * nh * hd);
    const float k_scale[2] = {1.0f, 0.5f}, v_scale[2] = {1.0f, 2.0f};   /* per-head scales are applied */
    const llmi_kv_dtype types[3] = {LLMI_KV_F32, LLMI_KV_Q8, LLMI_KV_FP8};
    const double bound[3] = {0, 1e-3, 1e-2};
    for (int ti = 0; ti < 3; ti++) {
        llmi_kv_dtype t = types[ti];
        size_t bytes = (size_t)nblocks * bs * kv_dtype_row_bytes(t, (size_t)nkv * hd);
        void *kc = calloc(1, bytes), *vc = calloc(1, bytes);
        float *q = malloc(sizeof(float) * n * nh * hd), *k = malloc(sizeof(float) * n * nkv * hd);
        memcpy(q, q0, sizeof(float) * n * nh * hd);
        memcpy(k, k0, sizeof(float) * n * nkv * hd);
        const float *ks = t == LLMI_KV_FP8 ? k_scale : NULL, *vs = t == LLMI_KV_FP8 ? v_scale : NULL;
        cpu_rope_kv_write(q, k, v0, pos, slot, n, nh, nkv, hd, hd, inv, 1.0f, kc, vc, t, ks, vs);
        cpu_paged_attention(q, kc, vc, t, ks, vs, &b, nh, nkv, hd, bs, (cpu_attn_scores){1.0f / sqrtf((float)hd), 0, 0},
                            ti == 0 ? ref : out);
        if (ti > 0) {
            double e = test_nmse(out, ref, (long)n * nh * hd);
            fprintf(stderr, "  %s KV: attention NMSE vs f32 KV %.2e (bound %.0e)\n", kv_dtype_name(t), e, bound[ti]);
            CHECK_MSG(e < bound[ti] && e > 0, "%s KV: NMSE %g", kv_dtype_name(t), e);
        }
        free(kc), free(vc), free(q), free(k);
    }
    free(q0), free(k0), free(v0), free(ref), free(out);
}

/* ---- GGUF k-quants and Q5_0/Q5_1: llmi's dequantization against gguf-py's ---- */

/* testdata/kquant/<name>.bin (rows x cols of raw super-blocks) and <name>.f32 (gguf-py's
 * values), written by scripts/make-kquant-refs.py; 0 and the tensor (owning the blocks),
 * or -1 after a failed CHECK. */
#define KQ_ROWS 6
#define KQ_COLS 768
static int kq_load(test_ctx *t_, const char *name, llmi_dtype dt, llmi_tensor *w, float **want) {
    const char *td = getenv("TESTDATA");
    char path[1024];
    void *bufs[2] = {NULL, NULL};
    size_t lens[2] = {0, 0}, need[2] = {(size_t)KQ_ROWS * KQ_COLS / dtype_block_elems(dt) * dtype_block_bytes(dt),
                                        (size_t)KQ_ROWS * KQ_COLS * sizeof(float)};
    const char *ext[2] = {"bin", "f32"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/kquant/%s.%s", td && *td ? td : "testdata", name, ext[k]);
        llmi_status st = {0};
        fileio_opts fo = {.flag = "kquant", .max_bytes = 1 << 20};
        char *text = NULL;
        if (fileio_read(path, &fo, &text, &lens[k], &st) || lens[k] != need[k]) {
            CHECK_MSG(0, "%s: %s (%zu bytes, want %zu)", path, st.msg, lens[k], need[k]);
            free(text), free(bufs[0]);
            return -1;
        }
        bufs[k] = text;
    }
    memset(w, 0, sizeof *w);
    w->dtype = dt, w->rows = KQ_ROWS, w->cols = KQ_COLS, w->row_bytes = need[0] / KQ_ROWS;
    w->data = w->owned = bufs[0];
    *want = bufs[1];
    return 0;
}

static const struct { const char *name; llmi_dtype dt; } kq_types[] = {
    {"q4_k", LLMI_Q4_K}, {"q5_k", LLMI_Q5_K}, {"q6_k", LLMI_Q6_K}, {"q5_0", LLMI_Q5_0}, {"q5_1", LLMI_Q5_1},
    {"q3_k", LLMI_Q3_K}, {"iq4_nl", LLMI_IQ4_NL}, {"iq4_xs", LLMI_IQ4_XS}, {"q2_k", LLMI_Q2_K}};

/* Every value bit for bit, the corner row (all scales and codes at their maximum) included. */
TEST(cpu_kquant_dequant_vs_gguf_py) {
    for (size_t k = 0; k < sizeof kq_types / sizeof kq_types[0]; k++) {
        llmi_tensor w;
        float *want, got[KQ_COLS];
        if (kq_load(t_, kq_types[k].name, kq_types[k].dt, &w, &want)) continue;
        long bad = 0;
        for (int r = 0; r < KQ_ROWS; r++) {
            tensor_dequant_row(&w, r, got);
            for (int c = 0; c < KQ_COLS; c++)
                if (memcmp(&got[c], &want[(size_t)r * KQ_COLS + c], 4) != 0 && bad++ < 3)
                    fprintf(stderr, "  %s row %d col %d: %a, gguf-py %a\n", kq_types[k].name, r, c, got[c],
                            want[(size_t)r * KQ_COLS + c]);
        }
        CHECK_MSG(bad == 0, "%s: %ld of %d values differ from gguf-py's", kq_types[k].name, bad, KQ_ROWS * KQ_COLS);
        free(w.owned), free(want);
    }
}

/* The packed matmul of gguf-py's k-quant blocks, against a double-precision product of
 * gguf-py's values with the same int8 activations: only the kernels' fp32 rounding differs
 * (the corner row's maximal scales and codes included).  The test's own decoder (ref_w,
 * which the random-weight tests measure against) reads every value as gguf-py does. */
TEST(cpu_kquant_matmul_vs_gguf_py) {
    rng r = rng_make("kquant_matmul");
    const int n = 19;
    for (size_t k = 0; k < sizeof kq_types / sizeof kq_types[0]; k++) {
        llmi_tensor w;
        float *want;
        if (kq_load(t_, kq_types[k].name, kq_types[k].dt, &w, &want)) continue;
        long bad = 0;
        for (int o = 0; o < KQ_ROWS; o++)
            for (int c = 0; c < KQ_COLS; c++) bad += (float)ref_w(&w, o, c) != want[(size_t)o * KQ_COLS + c];
        CHECK_MSG(bad == 0, "%s: the test's decoder reads %ld values unlike gguf-py", kq_types[k].name, bad);
        float *x = rand_vec(&r, (size_t)n * KQ_COLS, 1.0f), *y = malloc(sizeof(float) * n * KQ_ROWS);
        float *ref = malloc(sizeof(float) * n * KQ_ROWS);
        double xq[KQ_COLS];
        for (int c = 0; c < 32; c++) x[KQ_COLS + c] = 0.0f;   /* an all-zero block */
        cpu_matmul(&w, x, n, NULL, y);
        for (int i = 0; i < n; i++) {
            quant_x_ref(x + (size_t)i * KQ_COLS, KQ_COLS, xq);
            for (int o = 0; o < KQ_ROWS; o++) {
                double s = 0;
                for (int c = 0; c < KQ_COLS; c++) s += (double)want[(size_t)o * KQ_COLS + c] * xq[c];
                ref[(size_t)i * KQ_ROWS + o] = (float)s;
            }
        }
        double e = test_nmse(y, ref, (long)n * KQ_ROWS);
        fprintf(stderr, "  %s: NMSE %.2e vs gguf-py's values x int8 activations\n", kq_types[k].name, e);
        CHECK_MSG(e < 1e-10, "%s: NMSE %g", kq_types[k].name, e);
        free(x), free(y), free(ref), free(w.owned), free(want);
    }
}

/* MoE routing against the definition computed independently in double: softmax over all
 * experts, the k largest by a full sort (ties to the lower expert), renormalised or not,
 * listed by ascending expert.  Logits drawn from a few values make exact ties common. */
static const double *moe_ref_cmp_p;
static int moe_ref_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (moe_ref_cmp_p[x] != moe_ref_cmp_p[y]) return moe_ref_cmp_p[x] > moe_ref_cmp_p[y] ? -1 : 1;
    return x - y;
}
static int moe_int_cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

TEST(cpu_moe_route_vs_definition) {
    rng r = rng_make("moe_route");
    const int shapes[][2] = {{1, 1}, {4, 2}, {8, 2}, {8, 8}, {60, 4}, {128, 8}, {7, 3}};
    long bad_sel = 0, bad_w = 0, cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int norm = 0; norm < 2; norm++) {
            const int E = shapes[s][0], k = shapes[s][1], n = 1 + rng_int(&r, 37);
            float *lg = malloc(sizeof(float) * n * E), *w = malloc(sizeof(float) * n * k);
            int32_t *sel = malloc(sizeof(int32_t) * n * k);
            double *p = malloc(sizeof(double) * E);
            int *order = malloc(sizeof(int) * E);
            for (int i = 0; i < n * E; i++)
                lg[i] = (i % 5 == 0) ? (float)rng_int(&r, 3) : rng_unif(&r) * 6.0f;   /* ties among 0, 1, 2 */
            cpu_moe_route(lg, n, E, k, norm, sel, w);
            for (int t = 0; t < n; t++, cases++) {
                double mx = -INFINITY, sum = 0, top = 0;
                for (int e = 0; e < E; e++) mx = fmax(mx, lg[(size_t)t * E + e]);
                for (int e = 0; e < E; e++) sum += p[e] = exp((double)lg[(size_t)t * E + e] - mx);
                for (int e = 0; e < E; e++) { p[e] /= sum; order[e] = e; }
                moe_ref_cmp_p = p;
                qsort(order, (size_t)E, sizeof *order, moe_ref_cmp);
                qsort(order, (size_t)k, sizeof *order, moe_int_cmp);
                for (int j = 0; j < k; j++) top += p[order[j]];
                for (int j = 0; j < k; j++) {
                    double want = p[order[j]] / (norm ? top : 1.0);
                    if (sel[(size_t)t * k + j] != order[j] && bad_sel++ < 3)
                        fprintf(stderr, "  E=%d k=%d token %d slot %d: expert %d, want %d\n", E, k, t, j,
                                sel[(size_t)t * k + j], order[j]);
                    if (fabs(w[(size_t)t * k + j] - want) > 1e-6 * want + 1e-12 && bad_w++ < 3)
                        fprintf(stderr, "  E=%d k=%d token %d slot %d: weight %.9g, want %.9g\n", E, k, t, j,
                                (double)w[(size_t)t * k + j], want);
                }
            }
            free(lg); free(w); free(sel); free(p); free(order);
        }
    CHECK_MSG(bad_sel == 0, "%ld expert choices differ from the definition", bad_sel);
    CHECK_MSG(bad_w == 0, "%ld routing weights differ from the definition", bad_w);
    printf("  moe routing: %ld tokens over 14 (experts, k, norm) cases as defined\n", cases);
}

/* The profile's attention bytes on a sliding layer count the keys inside the window only. */
TEST(batch_attended_keys_window) {
    int32_t pos[4] = {0, 3, 10, 600};
    llmi_batch bt = {.n_tokens = 4, .positions = pos};
    CHECK(batch_attended_keys(&bt, 0) == 1 + 4 + 11 + 601);
    CHECK(batch_attended_keys(&bt, 8) == 1 + 4 + 8 + 8);
    CHECK(batch_attended_keys(&bt, 1) == 4);
}
