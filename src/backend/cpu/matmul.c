/* cpu/matmul.c — owns y = x @ W^T for every weight dtype: the hot path of the CPU backend.
 *
 * Numeric recipe (one per dtype, used for every n so results are batch invariant):
 *  - F32/F16/BF16 weights: fp32 FMA dot products over the row, 16 fixed lanes, reduced
 *    in a fixed order.
 *  - Q8_0/Q4_0/Q4_1 weights: each activation row is quantized to int8 blocks of 32 with
 *    one fp32 scale per block (as llama.cpp's Q8_0/Q8_1 activations); block dots are exact
 *    int32 (AVX-512 VNNI vpdpbusd: unsigned weight nibble/byte x signed activation byte),
 *    scaled by d_w * d_x in fp32.  vpdpbusd wants an unsigned operand, so Q4_0 (q - 8)
 *    and Q8_0 (q, signed) are computed as (u - k) with u = q + k unsigned and the exact
 *    integer correction -k * sum(x_q) preloaded into the accumulator; Q4_1's "+ m" term
 *    is sum_b m_b * d_x,b * sum(x_q,b), one short fp32 dot per row.
 *  - LLMI_I4G (GPTQ/AWQ int4) weights: a block of rows is dequantized exactly
 *    (scale * (q - zero) in fp32, as quant_dequant_row) into a thread's fp32 buffer, then
 *    the dense kernel runs over it; the int4 weights are read once per call.
 * A token's dot products never mix with another token's, and the per-token operation
 * sequence is identical whatever tile of tokens it was computed in. */
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/ops.h"
#include "core/int4.h"
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#define MM_ROW_BLOCK 16   /* rows whose weights stay in L1 while a token tile passes */
#define MM_MAX_MULTI 8    /* weights one cpu_matmul_multi call shares activations across */
#define MM_TILE 8         /* tokens computed together: a weight block is unpacked once per tile */
/* Tokens whose int8 activations every row block reads before the next ones: at 64
 * (~75-300 KB of activations, scales and corrections for 576-1536 columns) they stay in
 * L2 while all the rows pass, where 512 tokens' (1.7 MB and more, re-read once per row
 * block) fell out of it. */
#define MM_TOKEN_CHUNK 64

/* ---------------------------------------------------------------- dense weights */

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define MM_AVX512 1
#endif

#if defined(__AVX512F__)
static inline __m512 dense_load(const void *w, llmi_dtype t, int64_t c, __mmask16 m) {
    if (t == LLMI_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + c);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + c);
    if (t == LLMI_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Register tile of R rows x T tokens: per 16 columns, R weight loads and T activation
 * loads feed R*T FMAs.  Each (row, token) keeps one accumulator walked over the columns
 * in order, so the tile shape never changes a result. */
#define DENSE_INSTANCE(R, T)                                                                             \
    static void dense_##R##x##T(const llmi_tensor *w, int64_t r0, const float *x, int t0, float *y, int64_t rows) { \
        int64_t cols = w->cols;                                                                          \
        __m512 acc[R][T];                                                                                \
        for (int i = 0; i < R; i++)                                                                      \
            for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();                                 \
        for (int64_t c = 0; c < cols; c += 16) {                                                         \
            __mmask16 m = cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);      \
            __m512 xv[T];                                                                                \
            for (int j = 0; j < T; j++) xv[j] = _mm512_maskz_loadu_ps(m, x + (size_t)(t0 + j) * cols + c); \
            for (int i = 0; i < R; i++) {                                                                \
                __m512 wv = dense_load((const uint8_t *)w->data + (size_t)(r0 + i) * w->row_bytes, w->dtype, c, m); \
                for (int j = 0; j < T; j++) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);           \
            }                                                                                            \
        }                                                                                                \
        for (int i = 0; i < R; i++)                                                                      \
            for (int j = 0; j < T; j++) y[(size_t)(t0 + j) * rows + r0 + i] = _mm512_reduce_add_ps(acc[i][j]); \
    }
DENSE_INSTANCE(4, 4)
DENSE_INSTANCE(1, 4)
DENSE_INSTANCE(4, 1)
DENSE_INSTANCE(1, 1)

/* Rows [r0, r1) for tokens [t0, t0 + tn), tn <= 4. */
static void dense_rows(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, float *y,
                       int64_t rows) {
    int64_t r = r0;
    if (tn == 4) {
        for (; r + 4 <= r1; r += 4) dense_4x4(w, r, x, t0, y, rows);
        for (; r < r1; r++) dense_1x4(w, r, x, t0, y, rows);
        return;
    }
    for (int j = 0; j < tn; j++) {
        for (r = r0; r + 4 <= r1; r += 4) dense_4x1(w, r, x, t0 + j, y, rows);
        for (; r < r1; r++) dense_1x1(w, r, x, t0 + j, y, rows);
    }
}
#else
static float dense_elem(const uint8_t *wr, llmi_dtype t, int64_t c) {
    if (t == LLMI_F32) { float f; memcpy(&f, wr + 4 * c, 4); return f; }
    uint16_t h;
    memcpy(&h, wr + 2 * c, 2);
    return t == LLMI_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}
static void dense_rows(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, float *y,
                       int64_t rows) {
    for (int64_t r = r0; r < r1; r++) {
    const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
    for (int i = 0; i < tn; i++) {
        const float *xt = x + (size_t)(t0 + i) * w->cols;
        float s = 0.0f;
        for (int64_t c = 0; c < w->cols; c++) s += dense_elem(wr, w->dtype, c) * xt[c];
        y[(size_t)(t0 + i) * rows + r] = s;
    }
    }
}
#endif

/* Rows [r0, r1) of y (n, rows) for all n tokens, 4 tokens per register tile. */
static void dense_range(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int n, float *y) {
    for (int t0 = 0; t0 < n; t0 += 4) dense_rows(w, r0, r1, x, t0, n - t0 < 4 ? n - t0 : 4, y, w->rows);
}

static void matmul_dense(const llmi_tensor *w, const float *x, int n, float *y) {
    int64_t rows = w->rows;
    int64_t nrb = (rows + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
#pragma omp parallel for schedule(static) if (rows * w->cols * (int64_t)n > 32768)
    for (int64_t rb = 0; rb < nrb; rb++)
        dense_range(w, rb * MM_ROW_BLOCK, (rb + 1) * MM_ROW_BLOCK < rows ? (rb + 1) * MM_ROW_BLOCK : rows, x, n, y);
}

/* ---------------------------------------------------------------- int4 (I4G) weights */

static void matmul_i4g(const llmi_tensor *w, const float *x, int n, float *y) {
    const int64_t rows = w->rows, cols = w->cols;
    const int64_t nrb = (rows + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
#pragma omp parallel if (rows * cols * (int64_t)n > 32768)
    {
        float *buf = malloc((size_t)MM_ROW_BLOCK * (size_t)cols * sizeof(float)); /* (MM_ROW_BLOCK, cols) */
#pragma omp for schedule(static)
        for (int64_t rb = 0; rb < nrb; rb++) {
            const int64_t r0 = rb * MM_ROW_BLOCK, r1 = r0 + MM_ROW_BLOCK < rows ? r0 + MM_ROW_BLOCK : rows;
            if (!buf) {   /* no scratch: one row at a time through the same exact dequantization */
                for (int64_t r = r0; r < r1; r++)
                    for (int t = 0; t < n; t++) {
                        float acc = 0.0f;
                        for (int64_t k = 0; k < cols; k++) {
                            int g = w->g_idx ? w->g_idx[k] : (int)(k / w->group_size);
                            float sc = fp16_to_f32(w->qscales[(size_t)g * rows + r]);
                            int q = (((const uint8_t *)w->data)[(size_t)r * w->row_bytes + k / 2] >> (4 * (k & 1))) & 15;
                            acc += x[(size_t)t * cols + k] * (sc * (float)(q - w->qzeros[(size_t)g * rows + r]));
                        }
                        y[(size_t)t * rows + r] = acc;
                    }
                continue;
            }
            for (int64_t r = r0; r < r1; r++) quant_dequant_row(w, r, buf + (size_t)(r - r0) * cols);
            const llmi_tensor block = {.dtype = LLMI_F32, .rows = r1 - r0, .cols = cols,
                                       .row_bytes = (size_t)cols * sizeof(float), .data = buf};
            for (int t0 = 0; t0 < n; t0 += 4) dense_rows(&block, 0, r1 - r0, x, t0, n - t0 < 4 ? n - t0 : 4, y + r0, rows);
        }
        free(buf);
    }
}

/* ---------------------------------------------------------------- quantized weights */

/* Whether the AVX-512 kernel reads this format's activations in "nibble order": per block
 * pair, x0[0:16] x1[0:16] x0[16:32] x1[16:32], the order two Q4 blocks' low then high
 * nibbles come out of one 256-bit load, so unpacking needs no lane shuffle. */
static int nibble_order(llmi_dtype t) {
#if defined(MM_AVX512)
    return t == LLMI_Q4_0 || t == LLMI_Q4_1;
#else
    (void)t;
    return 0;
#endif
}

#if !defined(MM_AVX512)
/* Activation row t -> int8 blocks (d = amax/127, q = round-to-even(x * 127/amax)). */
static void quantize_token(const float *x, const cpu_qact *qx, int t, int k, int nib) {
    int8_t *q = qx->q + (size_t)t * qx->nbp * 32;
    float *dxe = qx->dxe + (size_t)t * qx->nbp * 8;
    int32_t *corr = qx->corr + (size_t)t * qx->nbp * 8;
    float *sx = qx->sx + (size_t)t * qx->nbp;
    for (int p = 0; p < qx->nbp / 2; p++) {
        int8_t tmp[64];   /* the pair's two blocks in natural order */
        float d[2];
        for (int h = 0; h < 2; h++) {
            int b = 2 * p + h;
            if (b >= qx->nb) {
                memset(tmp + 32 * h, 0, 32);
                d[h] = 0.0f;
                sx[b] = 0.0f;
                continue;
            }
            const float *xb = x + (size_t)b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            d[h] = amax / 127.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                int v = (int)nearbyintf(xb[j] * id);   /* round half to even, inlined */
                v = v > 127 ? 127 : (v < -127 ? -127 : v);
                tmp[32 * h + j] = (int8_t)v;
                sum += v;
            }
            sx[b] = d[h] * (float)sum;
        }
        int8_t *o = q + (size_t)p * 64;
        if (nib) {
            memcpy(o, tmp, 16);
            memcpy(o + 16, tmp + 32, 16);
            memcpy(o + 32, tmp + 16, 16);
            memcpy(o + 48, tmp + 48, 16);
        } else {
            memcpy(o, tmp, 64);
        }
        for (int l = 0; l < 16; l++) {   /* int32 lane l multiplies bytes 4l..4l+3 */
            const int8_t *g = o + 4 * l;
            dxe[p * 16 + l] = d[nib ? (l >> 2) & 1 : l >> 3];
            corr[p * 16 + l] = -k * (g[0] + g[1] + g[2] + g[3]);
        }
    }
}

#endif

#if defined(MM_AVX512)
/* Activation row t -> int8 blocks (d = amax/127, q = round-to-even(x * 127/amax)),
 * 16 lanes at a time (cvtps rounds to nearest even, as nearbyintf does in the scalar
 * build). */
static void quantize_token(const float *x, const cpu_qact *qx, int t, int k, int nib) {
    int8_t *q = qx->q + (size_t)t * qx->nbp * 32;
    float *dxe = qx->dxe + (size_t)t * qx->nbp * 8;
    int32_t *corr = qx->corr + (size_t)t * qx->nbp * 8;
    float *sx = qx->sx + (size_t)t * qx->nbp;
    const __m512i pick = nib ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)
                             : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ones = _mm512_set1_epi8(1);
    for (int p = 0; p < qx->nbp / 2; p++) {
        __m128i part[2][2];   /* (block, half) 16 int8 each */
        float d[2];
        for (int h = 0; h < 2; h++) {
            int b = 2 * p + h;
            if (b >= qx->nb) {
                part[h][0] = part[h][1] = _mm_setzero_si128();
                d[h] = 0.0f;
                sx[b] = 0.0f;
                continue;
            }
            __m512 x0 = _mm512_loadu_ps(x + (size_t)b * 32), x1 = _mm512_loadu_ps(x + (size_t)b * 32 + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            d[h] = amax / 127.0f;
            __m512i lim = _mm512_set1_epi32(127);
            __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
            __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
            i0 = _mm512_max_epi32(_mm512_min_epi32(i0, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
            i1 = _mm512_max_epi32(_mm512_min_epi32(i1, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
            sx[b] = d[h] * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
            part[h][0] = _mm512_cvtepi32_epi8(i0);
            part[h][1] = _mm512_cvtepi32_epi8(i1);
        }
        int8_t *o = q + (size_t)p * 64;
        /* nibble order: x0[0:16] x1[0:16] x0[16:32] x1[16:32]; natural: x0 then x1 */
        _mm_storeu_si128((__m128i *)o, part[0][0]);
        _mm_storeu_si128((__m128i *)(o + 16), nib ? part[1][0] : part[0][1]);
        _mm_storeu_si128((__m128i *)(o + 32), nib ? part[0][1] : part[1][0]);
        _mm_storeu_si128((__m128i *)(o + 48), part[1][1]);
        __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(o));
        _mm512_storeu_si512(corr + (size_t)p * 16, _mm512_mullo_epi32(sum4, _mm512_set1_epi32(-k)));
        __m512 dv = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_set_ps(0.0f, 0.0f, d[1], d[0])));
        _mm512_storeu_ps(dxe + (size_t)p * 16, dv);
    }
}
#endif

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_to_f32(h);
#endif
}

#define MM_MAX_NB 2048   /* blocks per row the AVX-512 kernel keeps scales of on the stack */

#if defined(MM_AVX512)
/* Row scales (and Q4_1 mins) as fp32, nb rounded up to a multiple of 16 with zeros.
 * Per 16 block headers: the headers' 64-word windows loaded whole (masked at the row's
 * end) and the d (and m) words picked out by vpermt2w, lanes 0-15 the scales, 16-31 the
 * mins.  A 16-lane gather did the same in one instruction, but it is microcoded on some
 * cores (17% of AMD Zen 4 decode time sat on it). */
static void row_scales(const uint8_t *wr, llmi_dtype t, int nb, float *dwf, float *mf) {
    const int wpb = (int)dtype_block_bytes(t) / 2;   /* 16-bit words per block: 9, 10 or 17 */
    const int q41 = t == LLMI_Q4_1;
    const uint16_t *w16 = (const uint16_t *)wr;
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                          15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i blk = _mm512_and_si512(lane, _mm512_set1_epi16(15));
    /* (lane) word offset of the header word lane wants, from the group's first word */
    const __m512i idx = _mm512_add_epi16(_mm512_mullo_epi16(blk, _mm512_set1_epi16((short)wpb)),
                                         _mm512_srli_epi16(lane, 4));
    const int group_words = 16 * wpb, row_words = nb * wpb;
    for (int b0 = 0; b0 < nb; b0 += 16) {
        const int base = b0 * wpb, left = row_words - base;   /* words of the row from the group on */
        const __mmask32 valid = nb - b0 >= 16 ? 0xffffffffu
                                              : (((1u << (nb - b0)) - 1) * 0x10001u);
        __m512i h = _mm512_setzero_si512();
        for (int w0 = 0; w0 < group_words; w0 += 64) {
            int n0 = left - w0, n1 = left - w0 - 32;   /* words loadable in each half of the window */
            __mmask32 m0 = n0 >= 32 ? 0xffffffffu : n0 > 0 ? (1u << n0) - 1 : 0;
            __mmask32 m1 = n1 >= 32 ? 0xffffffffu : n1 > 0 ? (1u << n1) - 1 : 0;
            __m512i lo = _mm512_maskz_loadu_epi16(m0, w16 + base + w0);
            __m512i hi = _mm512_maskz_loadu_epi16(m1, w16 + base + w0 + 32);
            __mmask32 in = _mm512_cmpge_epi16_mask(idx, _mm512_set1_epi16((short)w0)) &
                           _mm512_cmplt_epi16_mask(idx, _mm512_set1_epi16((short)(w0 + 64)));
            h = _mm512_mask_mov_epi16(h, in & valid, _mm512_permutex2var_epi16(lo, idx, hi));
        }
        _mm512_storeu_ps(dwf + b0, _mm512_cvtph_ps(_mm512_castsi512_si256(h)));
        if (q41) _mm512_storeu_ps(mf + b0, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
    }
}

/* Unsigned weights of blocks b, b+1 in the lane order of the activations. */
static inline __m512i unpack_pair(const uint8_t *wr, llmi_dtype t, int b, int nb) {
    size_t bb = dtype_block_bytes(t);
    const uint8_t *b0 = wr + (size_t)b * bb, *b1 = b0 + bb;
    int two = b + 1 < nb;
    if (t == LLMI_Q8_0) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b0 + 2));
        __m256i hi = two ? _mm256_loadu_si256((const __m256i *)(b1 + 2)) : _mm256_set1_epi8((char)0x80);
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    }
    int off = t == LLMI_Q4_1 ? 4 : 2;
    /* [qs0 qs1 qs0 qs1] from two broadcast loads, then the upper half shifted by 4:
     * lo0 lo1 hi0 hi1 (nibble order) in three ALU ops */
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b0 + off)));
    v = two ? _mm512_mask_broadcast_i32x4(v, 0xF0F0, _mm_loadu_si128((const __m128i *)(b1 + off)))
            : _mm512_maskz_mov_epi32(0x0F0F, v);
    v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0));
    return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

/* out[i] = the 16 partial-sum lanes of token t0 + i against one row, i < TN (their sum is
 * y[t0 + i][r]); TN is a compile-time constant per instance. */
#define QROW_INSTANCE(TN)                                                                              \
    static void qrow_##TN(const uint8_t *wr, llmi_dtype t, const cpu_qact *qx, int t0, __m512 *out) {    \
        float dwf[MM_MAX_NB + 16], mf[MM_MAX_NB + 16]; /* (nb rounded to 16) row scales, mins */       \
        int nb = qx->nb, nbp = qx->nbp, q41 = t == LLMI_Q4_1;                                          \
        row_scales(wr, t, nb, dwf, mf);                                                                \
        const __m512i pick = nibble_order(t)                                                           \
            ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)                         \
            : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);                        \
        __m512 acc[TN];                                                                                \
        _Pragma("GCC unroll 16") for (int i = 0; i < TN; i++) acc[i] = _mm512_setzero_ps();            \
        for (int b = 0; b < nb; b += 2) {                                                              \
            __m512i u = unpack_pair(wr, t, b, nb);                                                     \
            __m512 dw = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(                            \
                                                        _mm_castpd_ps(_mm_load_sd((const double *)(dwf + b))))); \
            for (int i = 0; i < TN; i++) {                                                             \
                size_t tk = (size_t)(t0 + i);                                                          \
                __m512i xq = _mm512_loadu_si512(qx->q + tk * nbp * 32 + (size_t)b * 32);               \
                __m512i d = q41 ? _mm512_setzero_si512()                                               \
                                : _mm512_loadu_si512(qx->corr + tk * nbp * 8 + (size_t)b * 8);         \
                d = _mm512_dpbusd_epi32(d, u, xq);                                                     \
                __m512 s = _mm512_mul_ps(dw, _mm512_loadu_ps(qx->dxe + tk * nbp * 8 + (size_t)b * 8)); \
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), s, acc[i]);                            \
            }                                                                                          \
        }                                                                                              \
        if (q41) /* + sum_b m_b * d_x,b * sum(x_q,b) */                                                \
            for (int b = 0; b < nb; b += 16) {                                                         \
                __mmask16 m = nb - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - b)) - 1);    \
                __m512 mv = _mm512_loadu_ps(mf + b);                                                   \
                for (int i = 0; i < TN; i++)                                                           \
                    acc[i] = _mm512_fmadd_ps(mv, _mm512_maskz_loadu_ps(m, qx->sx + (size_t)(t0 + i) * nbp + b), acc[i]); \
            }                                                                                          \
        for (int i = 0; i < TN; i++) out[i] = acc[i];                                                  \
    }
QROW_INSTANCE(1)
QROW_INSTANCE(2)
QROW_INSTANCE(4)
QROW_INSTANCE(8)

/* One token against QR_ROWS rows at once (decode): each row's operations are qrow_1's in
 * qrow_1's order (bit-identical), with the format a compile-time constant and the token's
 * int8 activations, scales and corrections loaded once for all the rows.  out[k] = the
 * 16 partial-sum lanes of row w + k * row_bytes. */
#define QR_ROWS 4   /* 2 and 8 measured slower on AMD Zen 4 */
#define QROW1XR_INSTANCE(NAME, DT)                                                                     \
    static void NAME(const uint8_t *w, size_t row_bytes, const cpu_qact *qx, int tk, __m512 *out) {    \
        float dw[QR_ROWS][MM_MAX_NB + 16], mf[QR_ROWS][MM_MAX_NB + 16]; /* (row, nb rounded to 16) */  \
        const int nb = qx->nb, nbp = qx->nbp, q41 = DT == LLMI_Q4_1;                                   \
        for (int k = 0; k < QR_ROWS; k++) row_scales(w + k * row_bytes, DT, nb, dw[k], mf[k]);         \
        const __m512i pick = nibble_order(DT)                                                          \
            ? _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0)                         \
            : _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);                        \
        const int8_t *xq = qx->q + (size_t)tk * nbp * 32;                                              \
        const float *dxe = qx->dxe + (size_t)tk * nbp * 8;                                             \
        const int32_t *corr = qx->corr + (size_t)tk * nbp * 8;                                         \
        __m512 acc[QR_ROWS];                                                                           \
        for (int k = 0; k < QR_ROWS; k++) acc[k] = _mm512_setzero_ps();                                \
        for (int b = 0; b < nb; b += 2) {                                                              \
            __m512i x = _mm512_loadu_si512(xq + (size_t)b * 32);                                       \
            __m512 dx = _mm512_loadu_ps(dxe + (size_t)b * 8);                                          \
            __m512i c0 = q41 ? _mm512_setzero_si512() : _mm512_loadu_si512(corr + (size_t)b * 8);      \
            for (int k = 0; k < QR_ROWS; k++) {                                                        \
                __m512 sk = _mm512_mul_ps(_mm512_permutexvar_ps(pick, _mm512_castps128_ps512(          \
                                _mm_castpd_ps(_mm_load_sd((const double *)(dw[k] + b))))), dx);        \
                __m512i dk = _mm512_dpbusd_epi32(c0, unpack_pair(w + k * row_bytes, DT, b, nb), x);    \
                acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dk), sk, acc[k]);                          \
            }                                                                                          \
        }                                                                                              \
        if (q41) /* + sum_b m_b * d_x,b * sum(x_q,b) */                                                \
            for (int b = 0; b < nb; b += 16) {                                                         \
                __mmask16 m = nb - b >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nb - b)) - 1);    \
                __m512 sx = _mm512_maskz_loadu_ps(m, qx->sx + (size_t)tk * nbp + b);                   \
                for (int k = 0; k < QR_ROWS; k++) acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(mf[k] + b), sx, acc[k]); \
            }                                                                                          \
        for (int k = 0; k < QR_ROWS; k++) out[k * MM_TILE] = acc[k];                                   \
    }
QROW1XR_INSTANCE(qrow1xr_q4_0, LLMI_Q4_0)
QROW1XR_INSTANCE(qrow1xr_q4_1, LLMI_Q4_1)
QROW1XR_INSTANCE(qrow1xr_q8_0, LLMI_Q8_0)

/* acc[i] = the 16 partial sums of token t0 + i against one row, i < tn. */
static void qrow(const uint8_t *wr, llmi_dtype t, const cpu_qact *qx, int t0, int tn, __m512 *acc) {
    int i = 0;
    for (; i + 8 <= tn; i += 8) qrow_8(wr, t, qx, t0 + i, acc + i);
    for (; i + 4 <= tn; i += 4) qrow_4(wr, t, qx, t0 + i, acc + i);
    for (; i + 2 <= tn; i += 2) qrow_2(wr, t, qx, t0 + i, acc + i);
    for (; i < tn; i++) qrow_1(wr, t, qx, t0 + i, acc + i);
}

/* Lane k = _mm512_reduce_add_ps(v[k]) bit for bit (the same association: halves of 256,
 * then of 128, then lanes i and i + 2, then 0 and 1, as GCC's intrinsic adds), for 16
 * rows at once: ~3 operations per row instead of ~8, and one vector store of 16 outputs. */
static inline __m512 hsum16_reduce_order(const __m512 *v) {
    __m512 a[8], b[4], c[2];
    for (int k = 0; k < 8; k++)   /* [v[2k] lanes i + (i+8) | v[2k+1] likewise], i < 8 */
        a[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)));
    for (int k = 0; k < 4; k++)   /* 128-bit lane q = row 4k + q: its lanes i + (i+4), i < 4 */
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)));
    for (int k = 0; k < 2; k++)   /* per 128-bit lane: [i + (i+2) of row 8k+q, i < 2; same of row 8k+4+q] */
        c[k] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * k], b[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* per 128-bit lane q: rows q, 4 + q, 8 + q, 12 + q; row r sits in lane 4 (r % 4) + r / 4 */
    __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), d);
}
#define MM_FAST_NB(nb) ((nb) <= MM_MAX_NB)
#else
#define MM_FAST_NB(nb) 0
#endif

/* Portable recipe (and the one for rows longer than MM_MAX_NB blocks): the same int8
 * activations, exact int32 block dots, fp32 accumulation in block order. */
static void qrow_scalar(const uint8_t *wr, llmi_dtype t, const cpu_qact *qx, int t0, int tn, float *y, int64_t rows,
                        int64_t r) {
    size_t bb = dtype_block_bytes(t);
    int nib = nibble_order(t);
    for (int i = 0; i < tn; i++) {
        size_t tk = (size_t)(t0 + i);
        const int8_t *xq = qx->q + tk * qx->nbp * 32;
        const float *dxe = qx->dxe + tk * qx->nbp * 8;
        float s = 0.0f, sm = 0.0f;
        for (int b = 0; b < qx->nb; b++) {
            const uint8_t *blk = wr + (size_t)b * bb;
            /* the block's 32 weights (signed) and activations, both in element order;
             * (kept as separate simple loops: GCC 12's vectorizer miscompiled the fused
             * per-format loop at -O3) */
            const int8_t *xp = xq + (size_t)(b / 2) * 64;
            int h = b & 1, dot = 0, wv[32], xv[32];
            if (t == LLMI_Q8_0) {
                for (int j = 0; j < 32; j++) wv[j] = (int8_t)blk[2 + j];
            } else {
                const uint8_t *qs = blk + (t == LLMI_Q4_1 ? 4 : 2);
                int k = t == LLMI_Q4_0 ? 8 : 0;
                for (int j = 0; j < 16; j++) {
                    wv[j] = (qs[j] & 15) - k;
                    wv[j + 16] = (qs[j] >> 4) - k;
                }
            }
            if (nib) {
                for (int j = 0; j < 16; j++) {
                    xv[j] = xp[16 * h + j];
                    xv[j + 16] = xp[32 + 16 * h + j];
                }
            } else {
                for (int j = 0; j < 32; j++) xv[j] = xp[32 * h + j];
            }
            for (int j = 0; j < 32; j++) dot += wv[j] * xv[j];
            s += half_at(blk) * dxe[(b / 2) * 16 + (nib ? 4 * h : 8 * h)] * (float)dot;
            if (t == LLMI_Q4_1) sm += half_at(blk + 2) * qx->sx[tk * qx->nbp + b];
        }
        y[tk * rows + r] = s + sm;
    }
}

size_t cpu_matmul_scratch_bytes(int n, int64_t cols) {
    size_t nbp = (size_t)((cols / 32 + 1) & ~1);
    return ((size_t)n * (nbp * 32 + nbp * 8 * 8 + nbp * 4) + 63) / 64 * 64;
}

static int is_q8_q4(llmi_dtype t) { return t == LLMI_Q8_0 || t == LLMI_Q4_0 || t == LLMI_Q4_1; }

static int qact_k(llmi_dtype t) { return t == LLMI_Q4_0 ? 8 : (t == LLMI_Q8_0 ? 128 : 0); }

int cpu_qact_layout(llmi_dtype t) { return is_q8_q4(t) ? qact_k(t) * 2 + nibble_order(t) : -1; }

void cpu_qact_init(cpu_qact *qa, void *scratch, int n, int64_t cols) {
    qa->nb = (int)(cols / 32);
    qa->nbp = (qa->nb + 1) & ~1;
    size_t per_q = (size_t)qa->nbp * 32, per_l = (size_t)qa->nbp * 8;
    char *buf = scratch;
    qa->q = (int8_t *)buf;
    qa->dxe = (float *)(buf + (size_t)n * per_q);
    qa->corr = (int32_t *)(buf + (size_t)n * (per_q + per_l * 4));
    qa->sx = (float *)(buf + (size_t)n * (per_q + per_l * 8));
}

void cpu_qact_quantize(const cpu_qact *qa, llmi_dtype t, const float *x, int64_t cols, int t0, int t1) {
    for (int tk = t0; tk < t1; tk++) quantize_token(x + (size_t)tk * cols, qa, tk, qact_k(t), nibble_order(t));
}

/* Bytes ahead of the current row that a few-token pass prefetches: each row's first
 * touch is the gather of its block scales, which otherwise waits for memory every row
 * (half the decode time went there); 4 KB ahead measured best on SmolLM2 (1-4 KB tried). */
#ifndef MM_PREFETCH_BYTES
#define MM_PREFETCH_BYTES 4096
#endif

/* Rows [r0, r1) of a quantized weight for tokens [ta, tb), MM_TILE tokens per pass. */
static void quant_range(const llmi_tensor *w, const cpu_qact *qx, int ta, int tb, int64_t r0, int64_t r1, float *y) {
    for (int t0 = ta; t0 < tb; t0 += MM_TILE) {
        int tn = tb - t0 < MM_TILE ? tb - t0 : MM_TILE;
#if defined(MM_AVX512)
        if (MM_FAST_NB(qx->nb)) {
            for (int64_t rb = r0; rb < r1; rb += 16) {
                int nr = r1 - rb < 16 ? (int)(r1 - rb) : 16;
                __m512 acc[16][MM_TILE];   /* (row of the block, token of the tile) partial sums */
                int k0 = 0;
                if (tn == 1)   /* decode: QR_ROWS rows per pass */
                    for (; k0 + QR_ROWS <= nr; k0 += QR_ROWS) {
                        const uint8_t *wr = (const uint8_t *)w->data + (size_t)(rb + k0) * w->row_bytes;
                        if (t0 == ta)
                            for (size_t off = 0; off < QR_ROWS * w->row_bytes; off += 64)
                                _mm_prefetch((const char *)wr + MM_PREFETCH_BYTES + off, _MM_HINT_T0);
                        if (w->dtype == LLMI_Q4_1) qrow1xr_q4_1(wr, w->row_bytes, qx, t0, &acc[k0][0]);
                        else if (w->dtype == LLMI_Q4_0) qrow1xr_q4_0(wr, w->row_bytes, qx, t0, &acc[k0][0]);
                        else qrow1xr_q8_0(wr, w->row_bytes, qx, t0, &acc[k0][0]);
                    }
                for (int k = k0; k < nr; k++) {
                    const uint8_t *wr = (const uint8_t *)w->data + (size_t)(rb + k) * w->row_bytes;
                    /* prefetches are hints: past the end of the weights they are dropped, never fault */
                    if (t0 == ta && rb + k + 1 < r1)
                        for (size_t off = 0; off < w->row_bytes; off += 64)
                            _mm_prefetch((const char *)wr + MM_PREFETCH_BYTES + off, _MM_HINT_T0);
                    qrow(wr, w->dtype, qx, t0, tn, acc[k]);
                }
                __mmask16 keep = (__mmask16)((1u << nr) - 1);
                for (int i = 0; i < tn; i++) {
                    __m512 v[16];
                    for (int k = 0; k < 16; k++) v[k] = k < nr ? acc[k][i] : _mm512_setzero_ps();
                    _mm512_mask_storeu_ps(y + (size_t)(t0 + i) * w->rows + rb, keep, hsum16_reduce_order(v));
                }
            }
            continue;
        }
#endif
        for (int64_t r = r0; r < r1; r++)
            qrow_scalar((const uint8_t *)w->data + (size_t)r * w->row_bytes, w->dtype, qx, t0, tn, y, w->rows, r);
    }
}

/* nw quantized weights of one dtype and width sharing the activations x: x is quantized
 * once and one parallel region walks the row blocks of all of them. */
static void matmul_quant(int nw, const llmi_tensor *const *ws, const float *x, int n, float *const *ys, void *scratch,
                         size_t scratch_bytes) {
    const llmi_tensor *w0 = ws[0];
    int64_t cols = w0->cols;
    size_t need = cpu_matmul_scratch_bytes(n, cols);
    char *buf = scratch_bytes >= need ? (char *)scratch : aligned_alloc(64, need);
    if (!buf) { /* no error channel in the op API: make the failure impossible to miss */
        for (int i = 0; i < nw; i++)
            for (size_t j = 0; j < (size_t)n * ws[i]->rows; j++) ys[i][j] = NAN;
        return;
    }
    cpu_qact qx;
    cpu_qact_init(&qx, buf, n, cols);
    llmi_dtype t = w0->dtype;
    int64_t rb_end[MM_MAX_MULTI];   /* cumulative row-block counts of the weights */
    int64_t nrb = 0, work = 0;
    for (int i = 0; i < nw; i++) {
        nrb += (ws[i]->rows + MM_ROW_BLOCK - 1) / MM_ROW_BLOCK;
        rb_end[i] = nrb;
        work += ws[i]->rows * cols * (int64_t)n;
    }
    /* Decode-sized batches are quantized before the parallel region: one barrier fewer
     * per matmul, which matters when the cores are shared and a waiting thread spins. */
    int serial_q = n <= 4;
    if (serial_q) cpu_qact_quantize(&qx, t, x, cols, 0, n);
#pragma omp parallel if (work > 32768)
    {
        if (!serial_q) {
#pragma omp for schedule(static)
            for (int tk = 0; tk < n; tk++) cpu_qact_quantize(&qx, t, x, cols, tk, tk + 1);
        }
        /* static schedules of one trip count give every chunk's row blocks to the same
         * threads (OpenMP's rule), so no barrier is needed between chunks and each
         * thread's weights stay in its caches */
        for (int c0 = 0; c0 < n; c0 += MM_TOKEN_CHUNK) {
            int c1 = n - c0 < MM_TOKEN_CHUNK ? n : c0 + MM_TOKEN_CHUNK;
#pragma omp for schedule(static) nowait
            for (int64_t gb = 0; gb < nrb; gb++) {
                int wi = 0;
                while (gb >= rb_end[wi]) wi++;
                int64_t rb = gb - (wi ? rb_end[wi - 1] : 0), rows = ws[wi]->rows;
                int64_t r1 = (rb + 1) * MM_ROW_BLOCK < rows ? (rb + 1) * MM_ROW_BLOCK : rows;
                quant_range(ws[wi], &qx, c0, c1, rb * MM_ROW_BLOCK, r1, ys[wi]);
            }
        }
    }
    if (buf != scratch) free(buf);
}

static void add_bias(const llmi_tensor *w, int n, const float *bias, float *y) {
    if (!bias) return;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < w->rows; r++) y[(size_t)t * w->rows + r] += bias[r];
}


void cpu_matmul_multi(int nw, const llmi_tensor *const *w, const float *x, int n, const float *const *bias,
                      float *const *y, void *scratch, size_t scratch_bytes) {
    if (n <= 0 || nw <= 0) return;
    int shared = nw <= MM_MAX_MULTI && is_q8_q4(w[0]->dtype);
    for (int i = 1; i < nw && shared; i++) shared = w[i]->dtype == w[0]->dtype && w[i]->cols == w[0]->cols;
    if (!shared) {
        for (int i = 0; i < nw; i++) cpu_matmul(w[i], x, n, bias ? bias[i] : NULL, y[i]);
        return;
    }
    matmul_quant(nw, w, x, n, y, scratch, scratch_bytes);
    for (int i = 0; i < nw; i++) add_bias(w[i], n, bias ? bias[i] : NULL, y[i]);
}

void cpu_matmul(const llmi_tensor *w, const float *x, int n, const float *bias, float *y) {
    if (n <= 0) return;
    if (w->dtype == LLMI_I4G)
        matmul_i4g(w, x, n, y);
    else if (is_q8_q4(w->dtype))
        matmul_quant(1, &w, x, n, &y, NULL, 0);
    else
        matmul_dense(w, x, n, y);
    if (bias) {
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < w->rows; r++) y[(size_t)t * w->rows + r] += bias[r];
    }
}

void cpu_matmul_rows(const llmi_tensor *w, const float *x, const cpu_qact *qa, int n, int64_t r0, int64_t r1,
                     const float *bias, float *y) {
    if (is_q8_q4(w->dtype))
        quant_range(w, qa, 0, n, r0, r1, y);
    else
        dense_range(w, r0, r1, x, n, y);
    if (bias)
        for (int t = 0; t < n; t++)
            for (int64_t r = r0; r < r1; r++) y[(size_t)t * w->rows + r] += bias[r];
}

int cpu_matmul_rows_ok(llmi_dtype t) { return t != LLMI_I4G; }
