/* cpu/matmul.c — owns y = x @ W^T for every weight dtype: the hot path of the CPU backend.
 *
 * Numeric recipe (one per dtype, used for every n so results are batch invariant):
 *  - F32/F16/BF16 weights: fp32 FMA dot products over the row, 16 fixed lanes, reduced
 *    in a fixed order.
 *  - Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL and Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_XS weights, packed at load
 *    (cpu_qweight_pack: rows in groups of 16, so one 64-byte load holds 4 codes of 16
 *    rows; a k-quant's integer sub-block scales and its super-block's fp32 d kept apart,
 *    their product exact): each activation row is quantized to int8 blocks of 32 with one
 *    fp32 scale d_x per block (as llama.cpp's Q8_0/Q8_1 activations; llama.cpp reads
 *    k-quants with Q8_K's blocks of 256, so its results differ from these by that rounding
 *    only).  Per (row, token), over the 32-column blocks b in order, starting from 0:
 *        is  = sum_j u_j * x_q,j - k * sum_j x_q,j      exact int32 (AVX-512 VNNI vpdpbusd:
 *                                                       unsigned weight x signed activation)
 *        acc = fma((float)is, d_w * d_x, acc)           d_w * d_x rounded to fp32 first
 *        acc = fma(m_w, d_x * sum_j x_q,j, acc)         Q4_1, Q5_1, Q4_K, Q5_K ("+ m")
 *    where u = q + k is the unsigned weight (Q4_0 k = 8, Q5_0 k = 16, Q8_0 and IQ4 k = 128,
 *    else 0; IQ4's q the value its index names) and d_w, m_w the block's fp16 scale and
 *    min (Q4_K/Q5_K: the fp32 d * scale and -dmin * min of its sub-block; IQ4_XS the fp32
 *    d * (scale - 32)).  Q6_K and Q3_K have a scale per 16 columns, d_0 and
 *    d_1 (fp32 d * scales[]), and u = q + k (Q6_K k = 32, Q3_K 4): a block is two dots,
 *    is_h over columns 16h .. 16h + 15, each carrying -k times the sum of its 16 x_q, then
 *        acc = fma((float)is_0, d_0 * d_x, acc);  acc = fma((float)is_1, d_1 * d_x, acc)
 *    Q2_K has those two (k = 0) and a min per 16 columns, m_h = -dmin * min_h, after them:
 *        acc = fma(m_0, d_x * (float)sum_0, acc);  acc = fma(m_1, d_x * (float)sum_1, acc)
 *    The AVX-512 kernel computes 16 rows per lane vector, the AVX2 one 8, the portable one
 *    the same operations one (row, token) at a time, so all give the same bits.
 *  - LLMI_I4G (GPTQ/AWQ int4) weights: a block of rows is dequantized exactly
 *    (scale * (q - zero) in fp32, as quant_dequant_row) into a thread's fp32 buffer, then
 *    the dense kernel runs over it; the int4 weights are read once per call.
 * A token's dot products never mix with another token's, and the per-token operation
 * sequence is identical whatever tile of tokens it was computed in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "backend/cpu/ops.h"
#include "core/int4.h"
#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MM_ROW_BLOCK 16   /* rows of a dense weight per task */
#define MM_MAX_MULTI 8    /* weights one cpu_matmul_multi call shares activations across */
#define MM_TILE 8         /* tokens computed together: a weight block is unpacked once per tile */
/* Tokens whose int8 activations every row group reads before the next ones: at 64
 * (~45-400 KB of activations and block sums for 576-5632 columns) they stay in L2 while
 * all the rows pass, where 512 tokens' (re-read once per row group) fell out of it. */
#define MM_TOKEN_CHUNK 64

/* ---------------------------------------------------------------- dense weights */

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MM_X86V3 1   /* x86-64-v3's vector instructions: the AVX2 bodies below */
#endif
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define MM_AVX512 1  /* the quantized weights' AVX-512 VNNI kernel */
#elif defined(MM_X86V3)
#define MM_AVX2 1    /* the quantized weights' AVX2 kernel */
#endif

const char *backend_cpu_kernels(void) {
#if defined(MM_AVX512)
    return "avx512-vnni";
#elif defined(MM_AVX2) && defined(__AVX512F__)
    return "avx512 + avx2";
#elif defined(MM_AVX2)
    return "avx2";
#else
    return "portable";
#endif
}

static inline float dense_elem(const uint8_t *wr, llmi_dtype t, int64_t c) {
    if (t == LLMI_F32) { float f; memcpy(&f, wr + 4 * c, 4); return f; }
    uint16_t h;
    memcpy(&h, wr + 2 * c, 2);
    return t == LLMI_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
}

#define DENSE_PF_ROWS 4   /* rows ahead a decode pass prefetches (4-16 measured alike) */
#if defined(__AVX512F__)
/* 16 weights from column c as fp32; m masks the columns past the row's end. */
static inline __m512 dense_load(const void *w, llmi_dtype t, int64_t c, __mmask16 m) {
    if (t == LLMI_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + c);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + c);
    if (t == LLMI_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Register tile of R rows x T tokens, the dtype a compile-time constant: per 16 columns,
 * R weight loads (converted once) and T activation loads feed R*T FMAs.  Each (row, token)
 * keeps one accumulator walked over the columns in order and reduced once, so the tile
 * shape never changes a result. */
/* One 16-column step of the tile at column c; m masks the columns past the row's end (a
 * constant 0xffff in the main loop, so its loads need no mask). */
#define DENSE_STEP(DT, R, T, c, m)                                                                       \
    do {                                                                                                 \
        __m512 wv[R]; /* the rows' 16 weights, then one token's activations at a time */                \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) {                                            \
            if (T == 1)   /* decode streams the weights once: the rows after these */                     \
                _mm_prefetch((const char *)w0 + (size_t)(i + DENSE_PF_ROWS) * w->row_bytes +               \
                             (c) * dtype_block_bytes(DT), _MM_HINT_T0);                                   \
            wv[i] = dense_load(w0 + (size_t)i * w->row_bytes, DT, (c), (m));                               \
        }                                                                                                \
        _Pragma("GCC unroll 6") for (int j = 0; j < T; j++) {                                            \
            __m512 xj = _mm512_maskz_loadu_ps((m), x + (size_t)(t0 + j) * cols + (c));                   \
            _Pragma("GCC unroll 4") for (int i = 0; i < R; i++) acc[i][j] = _mm512_fmadd_ps(wv[i], xj, acc[i][j]); \
        }                                                                                                \
    } while (0)
#define DENSE_INSTANCE(SFX, DT, R, T)                                                                    \
    static void dense_##SFX##_##R##x##T(const llmi_tensor *w, int64_t r0, const float *x, int t0, float *y, \
                                        int64_t rows) {                                                  \
        const int64_t cols = w->cols;                                                                    \
        const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;                        \
        __m512 acc[R][T];                                                                                \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 6") for (int j = 0; j < T; j++) acc[i][j] = _mm512_setzero_ps();         \
        int64_t c = 0;                                                                                   \
        for (; c + 16 <= cols; c += 16) DENSE_STEP(DT, R, T, c, (__mmask16)0xffff);                      \
        if (c < cols) DENSE_STEP(DT, R, T, c, (__mmask16)((1u << (cols - c)) - 1));                      \
        _Pragma("GCC unroll 4") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 6") for (int j = 0; j < T; j++)                                          \
                y[(size_t)(t0 + j) * rows + r0 + i] = _mm512_reduce_add_ps(acc[i][j]);                   \
    }
/* Rows [r0, r1) for tokens [t0, t0 + tn): 4-row tiles of 6, 4 and 2 tokens, single rows for one. */
#define DENSE_FORMAT(SFX, DT)                                                                            \
    DENSE_INSTANCE(SFX, DT, 4, 6) DENSE_INSTANCE(SFX, DT, 1, 6) DENSE_INSTANCE(SFX, DT, 4, 4)            \
    DENSE_INSTANCE(SFX, DT, 1, 4) DENSE_INSTANCE(SFX, DT, 4, 2) DENSE_INSTANCE(SFX, DT, 1, 2)            \
    DENSE_INSTANCE(SFX, DT, 1, 1)                                                                        \
    static void dense_rows_##SFX(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, \
                                 float *y, int64_t rows) {                                               \
        for (int j = 0; j < tn;) {                                                                       \
            int64_t r = r0;                                                                              \
            if (tn - j >= 6) {                                                                           \
                for (; r + 4 <= r1; r += 4) dense_##SFX##_4x6(w, r, x, t0 + j, y, rows);                 \
                for (; r < r1; r++) dense_##SFX##_1x6(w, r, x, t0 + j, y, rows);                         \
                j += 6;                                                                                  \
            } else if (tn - j >= 4) {                                                                    \
                for (; r + 4 <= r1; r += 4) dense_##SFX##_4x4(w, r, x, t0 + j, y, rows);                 \
                for (; r < r1; r++) dense_##SFX##_1x4(w, r, x, t0 + j, y, rows);                         \
                j += 4;                                                                                  \
            } else if (tn - j >= 2) {                                                                    \
                for (; r + 4 <= r1; r += 4) dense_##SFX##_4x2(w, r, x, t0 + j, y, rows);                 \
                for (; r < r1; r++) dense_##SFX##_1x2(w, r, x, t0 + j, y, rows);                         \
                j += 2;                                                                                  \
            } else {   /* one row at a time: one sequential stream (+5% decode over 4 rows at once) */ \
                for (; r < r1; r++) dense_##SFX##_1x1(w, r, x, t0 + j, y, rows);                         \
                j += 1;                                                                                  \
            }                                                                                            \
        }                                                                                                \
    }
DENSE_FORMAT(f32, LLMI_F32)
DENSE_FORMAT(f16, LLMI_F16)
DENSE_FORMAT(bf16, LLMI_BF16)

#elif defined(MM_X86V3)
/* The AVX-512 kernel's recipe on AVX2: a 16-lane step is two 8-lane vectors (lanes 0-7,
 * 8-15), each lane one FMA chain over its columns in order, the tail zero-filled as the
 * masked loads do, and the 16 lanes reduced in _mm512_reduce_add_ps's order (GCC's: the two
 * halves added, then their halves, then lanes 0 + 2 and 1 + 3, then those two): the same
 * bits as the AVX-512 build. */
static inline __m256 dense2_load(const void *w, llmi_dtype t, int64_t c) {
    if (t == LLMI_F32) return _mm256_loadu_ps((const float *)w + c);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + c));
    if (t == LLMI_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float dense2_reduce(__m256 lo, __m256 hi) {
    __m256 t3 = _mm256_add_ps(hi, lo);
    __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, 1));
}
/* R rows x T tokens; the last partial step goes through zero-padded copies (wt, xt). */
#define DENSE2_STEP(LOADW, LOADX)                                                                        \
    do {                                                                                                 \
        __m256 wv[R][2];                                                                                 \
        _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                                            \
            wv[i][0] = LOADW(i, 0);                                                                      \
            wv[i][1] = LOADW(i, 8);                                                                      \
        }                                                                                                \
        _Pragma("GCC unroll 4") for (int j = 0; j < T; j++) {                                            \
            const __m256 x0 = LOADX(j, 0), x1 = LOADX(j, 8);                                             \
            _Pragma("GCC unroll 2") for (int i = 0; i < R; i++) {                                        \
                acc[i][j][0] = _mm256_fmadd_ps(wv[i][0], x0, acc[i][j][0]);                              \
                acc[i][j][1] = _mm256_fmadd_ps(wv[i][1], x1, acc[i][j][1]);                              \
            }                                                                                            \
        }                                                                                                \
    } while (0)
#define DENSE2_INSTANCE(SFX, DT, R_, T_)                                                                 \
    static void dense2_##SFX##_##R_##x##T_(const llmi_tensor *w, int64_t r0, const float *x, int t0, float *y, \
                                          int64_t rows) {                                                \
        enum { R = R_, T = T_ };                                                                         \
        const llmi_dtype dt = DT;                                                                        \
        const int64_t cols = w->cols;                                                                    \
        const uint8_t *w0 = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;                        \
        __m256 acc[R][T][2];                                                                             \
        _Pragma("GCC unroll 2") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < T; j++) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps(); \
        int64_t c = 0;                                                                                   \
        for (; c + 16 <= cols; c += 16) {                                                                \
            if (T == 1)   /* decode streams the weights once: the rows after these */                    \
                for (int i = 0; i < R; i++)                                                              \
                    _mm_prefetch((const char *)w0 + (size_t)(i + DENSE_PF_ROWS) * w->row_bytes +          \
                                 c * dtype_block_bytes(DT), _MM_HINT_T0);                                \
            DENSE2_STEP(DENSE2_W_ROW, DENSE2_X_ROW);                                                     \
        }                                                                                                \
        if (c < cols) {                                                                                  \
            float wt[R][16] = {{0}}, xt[T][16] = {{0}};                                                  \
            for (int i = 0; i < R; i++)                                                                  \
                for (int64_t k = c; k < cols; k++) wt[i][k - c] = dense_elem(w0 + (size_t)i * w->row_bytes, DT, k); \
            for (int j = 0; j < T; j++)                                                                  \
                for (int64_t k = c; k < cols; k++) xt[j][k - c] = x[(size_t)(t0 + j) * cols + k];        \
            DENSE2_STEP(DENSE2_W_PAD, DENSE2_X_PAD);                                                     \
        }                                                                                                \
        _Pragma("GCC unroll 2") for (int i = 0; i < R; i++)                                              \
            _Pragma("GCC unroll 4") for (int j = 0; j < T; j++)                                          \
                y[(size_t)(t0 + j) * rows + r0 + i] = dense2_reduce(acc[i][j][0], acc[i][j][1]);         \
    }
#define DENSE2_W_ROW(i, o) dense2_load(w0 + (size_t)(i) * w->row_bytes, dt, c + (o))
#define DENSE2_X_ROW(j, o) _mm256_loadu_ps(x + (size_t)(t0 + (j)) * cols + c + (o))
#define DENSE2_W_PAD(i, o) _mm256_loadu_ps(wt[i] + (o))
#define DENSE2_X_PAD(j, o) _mm256_loadu_ps(xt[j] + (o))
/* Rows [r0, r1) for tokens [t0, t0 + tn): 2-row tiles of 2 tokens (14 of the 16 vector
 * registers), single rows for an odd last row, and one row at a time for one token. */
#define DENSE2_FORMAT(SFX, DT)                                                                           \
    DENSE2_INSTANCE(SFX, DT, 2, 2) DENSE2_INSTANCE(SFX, DT, 1, 2) DENSE2_INSTANCE(SFX, DT, 1, 1)         \
    static void dense_rows_##SFX(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, \
                                 float *y, int64_t rows) {                                               \
        int j = 0;                                                                                       \
        for (; j + 2 <= tn; j += 2) {                                                                    \
            int64_t r = r0;                                                                              \
            for (; r + 2 <= r1; r += 2) dense2_##SFX##_2x2(w, r, x, t0 + j, y, rows);                    \
            for (; r < r1; r++) dense2_##SFX##_1x2(w, r, x, t0 + j, y, rows);                            \
        }                                                                                                \
        for (; j < tn; j++)                                                                              \
            for (int64_t r = r0; r < r1; r++) dense2_##SFX##_1x1(w, r, x, t0 + j, y, rows);              \
    }
DENSE2_FORMAT(f32, LLMI_F32)
DENSE2_FORMAT(f16, LLMI_F16)
DENSE2_FORMAT(bf16, LLMI_BF16)

#else
/* The recipe one (row, token) at a time: 16 lanes, lane l the FMA chain over columns
 * c = l (mod 16) in order (zeros past the end), reduced as _mm512_reduce_add_ps does: the
 * same bits as the vector builds. */
static void dense_rows(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, float *y,
                       int64_t rows) {
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int i = 0; i < tn; i++) {
            const float *xt = x + (size_t)(t0 + i) * w->cols;
            float a[16] = {0};
            for (int64_t c = 0; c < w->cols; c += 16)
                for (int l = 0; l < 16; l++) {
                    const int64_t k = c + l;
                    a[l] = fmaf(k < w->cols ? dense_elem(wr, w->dtype, k) : 0.0f, k < w->cols ? xt[k] : 0.0f, a[l]);
                }
            float t6[4];
            for (int l = 0; l < 4; l++) t6[l] = (a[l + 12] + a[l + 4]) + (a[l + 8] + a[l]);
            y[(size_t)(t0 + i) * rows + r] = (t6[0] + t6[2]) + (t6[1] + t6[3]);
        }
    }
}
#endif

#if defined(__AVX512F__) || defined(MM_X86V3)
/* Rows [r0, r1) for tokens [t0, t0 + tn): the dtype's vector kernel. */
static void dense_rows(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int t0, int tn, float *y,
                       int64_t rows) {
    if (w->dtype == LLMI_F16) dense_rows_f16(w, r0, r1, x, t0, tn, y, rows);
    else if (w->dtype == LLMI_BF16) dense_rows_bf16(w, r0, r1, x, t0, tn, y, rows);
    else dense_rows_f32(w, r0, r1, x, t0, tn, y, rows);
}
#endif

/* Rows [r0, r1) of y (n, rows) for all n tokens, up to 24 tokens a pass (the row block's
 * weights stay in L1/L2 while the tiles of those tokens walk them). */
static void dense_range(const llmi_tensor *w, int64_t r0, int64_t r1, const float *x, int n, float *y) {
    for (int t0 = 0; t0 < n; t0 += 24) dense_rows(w, r0, r1, x, t0, n - t0 < 24 ? n - t0 : 24, y, w->rows);
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

/* The dtypes the packed kernels read (ops.h): int8 activations, 16-row groups. */
static int is_qpacked(llmi_dtype t) {
    return t == LLMI_Q8_0 || t == LLMI_Q4_0 || t == LLMI_Q4_1 || t == LLMI_Q5_0 || t == LLMI_Q5_1 || t == LLMI_IQ4_NL ||
           t == LLMI_IQ4_XS || dtype_is_kquant(t);
}

/* Packed layout (ops.h): per group of QP_ROWS rows, the 32-column blocks in order, each a
 * head of the rows' scales (and mins) then qp_bits(t) quads of (QP_ROWS rows x 4 bytes);
 * a k-quant's 8 blocks follow a super-block head of the rows' fp32 d (and -dmin).  The
 * codes are unsigned so that every weight operand of vpdpbusd is: a Q8_0 quant is stored
 * as u = q + 128, a Q4_0 nibble as u = q, a Q5_0 code as u = q, their -128, -8, -16 (and
 * Q6_K's -32, Q3_K's -4) applied as a correction; an IQ4 nibble is an index, its value
 * + 128 looked up in the kernel, the -128 a correction.  Heads:
 *   Q8_0, Q4_0, Q5_0, IQ4_NL: d (16) fp16        Q4_1, Q5_1: d (16) fp16, m (16) fp16
 *   Q4_K, Q5_K: super d (16), -dmin (16) fp32;   per block scale (16), min (16) uint8
 *   Q6_K, Q3_K: super d (16) fp32;               per block scales of columns 0-15 (16),
 *                                                16-31 (16) int8 (Q3_K's minus 32)
 *   IQ4_XS:     super d (16) fp32;               per block scale (16) int8 (minus 32)
 *   Q2_K:       super d (16), -dmin (16) fp32;   per block scales of columns 0-15, 16-31,
 *                                                then mins of the same (16 each) uint8
 * so a k-quant block's fp32 factors d * scale and -dmin * min are the kernels' exact
 * products, the same numbers as kquant_sub_block's, and a k-quant is Q4_1's form
 * (x = d_w * u + m_w) or, for Q6_K and Q3_K, a Q4_0-like one with a scale per half block. */
#define QP_ROWS 16
/* Bits per code, which is also the quads per block: 8 one byte per column (quad j
 * columns 4j..4j+3); 4 to 6: 4 quads of nibbles (quad j: low nibble column 4j + e, high
 * nibble 16 + 4j + e) and, for 5 and 6 bits, 1 or 2 quads of the codes' top bits; 2 and 3:
 * 2 quads of bit pairs (quad k: bits 2m, 2m + 1 the low 2 bits of column 4(4k + m) + e)
 * and, for 3 bits, 1 quad of the third bits (bit j: column 4j + e's). */
static int qp_bits(llmi_dtype t) {
    switch (t) {
    case LLMI_Q8_0: return 8;
    case LLMI_Q5_0: case LLMI_Q5_1: case LLMI_Q5_K: return 5;
    case LLMI_Q6_K: return 6;
    case LLMI_Q3_K: return 3;
    case LLMI_Q2_K: return 2;
    default: return 4;
    }
}
/* Whether t has a scale per 16 columns (Q6_K, Q3_K, Q2_K): a block is two dots, one per
 * half (Q2_K: and a min per half). */
#define QP_HALVES(t) ((t) == LLMI_Q6_K || (t) == LLMI_Q3_K || (t) == LLMI_Q2_K)
/* Whether t's nibbles index iq4nl_value's table (IQ4_NL, IQ4_XS): the kernels look the
 * unsigned weight u = value + 128 up (one byte shuffle), so k = 128 as Q8_0's. */
#define QP_LUT(t) ((t) == LLMI_IQ4_NL || (t) == LLMI_IQ4_XS)
/* Top bits of codes wider than 4: top-bit quad 4 + j / (4 / w) (w = bits - 4) holds, at
 * byte 4r + e, the w top bits of column 4j + e at bit qp_top_shift and of column
 * 16 + 4j + e at bit 4 + qp_top_shift: one 64-byte load holds 4 (w = 1) or 2 (w = 2)
 * nibble quads' top bits, each extracted by one shift and mask. */
static inline int qp_top_quad(int bits, int j) { return 4 + j / (4 / (bits - 4)); }
static inline int qp_top_shift(int bits, int j) { return (bits - 4) * (j % (4 / (bits - 4))); }
static size_t qp_head(llmi_dtype t) {
    return (t == LLMI_Q4_1 || t == LLMI_Q5_1 || t == LLMI_Q2_K ? 4 : t == LLMI_IQ4_XS ? 1 : 2) * QP_ROWS;
}
static size_t qp_block(llmi_dtype t) { return qp_head(t) + (size_t)qp_bits(t) * 4 * QP_ROWS; }
/* Super-blocks of 256 (the k-quants, IQ4_XS): 8 blocks after a head of the rows' fp32 d
 * (Q4_K, Q5_K: and -dmin). */
static int qp_per_super(llmi_dtype t) { return dtype_block_elems(t) == 256 ? 8 : 1; }
static size_t qp_super_head(llmi_dtype t) {
    return dtype_block_elems(t) != 256 ? 0 : (t == LLMI_Q6_K || t == LLMI_Q3_K || t == LLMI_IQ4_XS ? 4 : 8) * QP_ROWS;
}
static size_t qp_super(llmi_dtype t) { return qp_super_head(t) + (size_t)qp_per_super(t) * qp_block(t); }
/* A group's packed bytes (nb 32-column blocks) and its block b. */
static size_t qp_group_bytes(llmi_dtype t, int64_t nb) { return (size_t)(nb / qp_per_super(t)) * qp_super(t); }
static inline const uint8_t *qp_block_at(const uint8_t *gp, llmi_dtype t, int64_t b) {
    return gp + (size_t)(b / qp_per_super(t)) * qp_super(t) + qp_super_head(t) + (size_t)(b % qp_per_super(t)) * qp_block(t);
}
/* The unsigned weights are q + k: the block's integer dot (Q6_K's, Q3_K's each half's)
 * carries -k * sum(x_q). */
static int qp_k(llmi_dtype t) {
    switch (t) {
    case LLMI_Q3_K: return 4;
    case LLMI_Q4_0: return 8;
    case LLMI_Q5_0: return 16;
    case LLMI_Q6_K: return 32;
    case LLMI_Q8_0: case LLMI_IQ4_NL: case LLMI_IQ4_XS: return 128;
    default: return 0;
    }
}
/* Whether the block's "+ m" term applies (the head's second half holds m; Q2_K's, one
 * per half, are its last two quarters). */
static int qp_has_min(llmi_dtype t) {
    return t == LLMI_Q4_1 || t == LLMI_Q5_1 || t == LLMI_Q4_K || t == LLMI_Q5_K || t == LLMI_Q2_K;
}

int cpu_qweight_packable(const llmi_tensor *w) {
    return is_qpacked(w->dtype) && w->layout == LLMI_LAYOUT_ROWS && w->cols % dtype_block_elems(w->dtype) == 0;
}

size_t cpu_qweight_bytes(const llmi_tensor *w) {
    return (size_t)((w->rows + QP_ROWS - 1) / QP_ROWS) * qp_group_bytes(w->dtype, w->cols / 32);
}

/* Row r's 32 codes u into a block's code quads q (zeroed before). */
static void qp_put_codes(int bits, const uint8_t u[32], int r, uint8_t *q) {
    for (int c = 0; c < 32; c++) {
        if (bits == 8) {
            q[(size_t)(c / 4) * 4 * QP_ROWS + 4 * r + c % 4] = u[c];
            continue;
        }
        if (bits <= 3) {   /* operand j = c / 4: bit pair j % 4 of pair quad j / 4, third bit j */
            const int j = c / 4, e = c % 4;
            q[(size_t)(j / 4) * 4 * QP_ROWS + 4 * r + e] |= (uint8_t)((u[c] & 3) << (2 * (j % 4)));
            if (bits == 3) q[(size_t)2 * 4 * QP_ROWS + 4 * r + e] |= (uint8_t)((u[c] >> 2 & 1) << j);
            continue;
        }
        const int j = c % 16 / 4, e = c % 4, hi = c >= 16;
        q[(size_t)j * 4 * QP_ROWS + 4 * r + e] |= (uint8_t)((u[c] & 15) << (4 * hi));
        if (bits > 4)
            q[(size_t)qp_top_quad(bits, j) * 4 * QP_ROWS + 4 * r + e] |= (uint8_t)((u[c] >> 4) << (qp_top_shift(bits, j) + 4 * hi));
    }
}

/* Row i of a group, 32-column block b of a Q5_0/Q5_1, k-quant or IQ4_XS row (a super-block
 * b / 8's sub-block b % 8) into the group's packed bytes og. */
static void pack_decoded(llmi_dtype t, const uint8_t *row, int64_t b, int i, uint8_t *og) {
    const int per = qp_per_super(t), s = (int)(b % per);
    const uint8_t *blk = row + (size_t)(b / per) * dtype_block_bytes(t);
    uint8_t u[32], *o = (uint8_t *)qp_block_at(og, t, b);
    float f[4];
    kquant_sub_block(t, blk, s, u, f);
    if (per == 8) {
        float sup[2];
        int isc[4];
        kquant_sub_scales(t, blk, s, sup, isc);
        uint8_t *sh = o - qp_super_head(t) - (size_t)s * qp_block(t);
        if (s == 0) {
            memcpy(sh + 4 * i, &sup[0], 4);
            if (qp_super_head(t) == 8 * QP_ROWS) {   /* Q4_K, Q5_K: -dmin too */
                const float nd = -sup[1];
                memcpy(sh + 4 * QP_ROWS + 4 * i, &nd, 4);
            }
        }
        /* one byte per row of each of the head's 1, 2 or 4 arrays (Q6_K's, Q3_K's, IQ4_XS's
         * int8 scales as their two's complement bytes) */
        for (size_t k = 0; k < qp_head(t) / QP_ROWS; k++) o[k * QP_ROWS + i] = (uint8_t)isc[k];
    } else {
        memcpy(o + 2 * i, blk, 2);                                            /* d */
        if (t == LLMI_Q5_1) memcpy(o + 2 * QP_ROWS + 2 * i, blk + 2, 2);       /* m */
    }
    qp_put_codes(qp_bits(t), u, i, o + qp_head(t));
}

int cpu_qweight_pack(const llmi_tensor *w, llmi_tensor *out, llmi_status *st) {
    if (!cpu_qweight_packable(w))
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: cannot pack a %s weight of %lld x %lld",
                         dtype_name(w->dtype), (long long)w->rows, (long long)w->cols);
    const llmi_dtype t = w->dtype;
    const int64_t groups = (w->rows + QP_ROWS - 1) / QP_ROWS, nb = w->cols / 32;
    const size_t bb = dtype_block_bytes(t), head = qp_head(t), gbytes = qp_group_bytes(t, nb), bytes = cpu_qweight_bytes(w);
    /* 2 MB aligned and advised as huge pages where the kernel allows (THP "madvise"): a
     * decode pass streams every packed byte once, one TLB entry per 2 MB instead of 4 KB */
    const size_t huge = (size_t)2 << 20, alloc = bytes >= huge ? (bytes + huge - 1) / huge * huge : (bytes + 63) / 64 * 64;
    uint8_t *p = aligned_alloc(bytes >= huge ? huge : 64, alloc);
    if (p && bytes >= huge) madvise(p, alloc, MADV_HUGEPAGE);
    if (!p)
        return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: out of memory packing a %lld x %lld %s weight (%zu MiB)",
                         (long long)w->rows, (long long)w->cols, dtype_name(t), bytes >> 20);
#pragma omp parallel for schedule(static) if (bytes > (1u << 20))
    for (int64_t g = 0; g < groups; g++) {
        const int nr = w->rows - g * QP_ROWS < QP_ROWS ? (int)(w->rows - g * QP_ROWS) : QP_ROWS;
        uint8_t *og = p + (size_t)g * gbytes;
        memset(og, 0, gbytes);   /* rows past the end stay zero; codes are or-ed in */
        for (int i = 0; i < nr; i++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)(g * QP_ROWS + i) * w->row_bytes;
            if (t != LLMI_Q8_0 && t != LLMI_Q4_0 && t != LLMI_Q4_1 && t != LLMI_IQ4_NL) {
                for (int64_t b = 0; b < nb; b++) pack_decoded(t, row, b, i, og);
                continue;
            }
            /* Q8_0, Q4_0, Q4_1, IQ4_NL: the GGUF block's bytes in place (a block's qs[4j..4j+3]
             * is nibble quad j's, or byte quad j's) */
            const uint8_t *src = row;
            for (int64_t b = 0; b < nb; b++, src += bb) {
                uint8_t *o = og + (size_t)b * qp_block(t);
                memcpy(o + 2 * i, src, 2);                                           /* d */
                if (t == LLMI_Q4_1) memcpy(o + 2 * QP_ROWS + 2 * i, src + 2, 2);      /* m */
                const uint8_t *qs = src + (t == LLMI_Q4_1 ? 4 : 2);
                for (int j = 0; j < qp_bits(t); j++) {
                    uint32_t v;
                    memcpy(&v, qs + 4 * j, 4);
                    if (t == LLMI_Q8_0) v ^= 0x80808080u;
                    memcpy(o + head + (size_t)j * 4 * QP_ROWS + 4 * i, &v, 4);
                }
            }
        }
    }
    *out = *w;
    out->layout = LLMI_LAYOUT_CPU16;
    out->data = p;
    out->owned = p;
    return LLMI_OK;
}

/* The bytes of the five arrays cpu_qact_init lays out, each rounded up to 64. */
static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

size_t cpu_matmul_scratch_bytes(int n, int64_t cols) {
    size_t nb = (size_t)(cols / 32);
    return round64((size_t)n * nb * 32) + 3 * round64((size_t)n * nb * 4) + round64((size_t)n * nb * 8);
}

int cpu_qact_layout(llmi_dtype t) { return is_qpacked(t) ? 0 : -1; }

void cpu_qact_init(cpu_qact *qa, void *scratch, int n, int64_t cols) {
    qa->nb = (int)(cols / 32);
    size_t nb = (size_t)qa->nb, a = round64((size_t)n * nb * 32), f = round64((size_t)n * nb * 4);
    char *buf = scratch;
    qa->q = (int8_t *)buf;
    qa->dx = (float *)(buf + a);
    qa->isx = (int32_t *)(buf + a + f);
    qa->sx = (float *)(buf + a + 2 * f);
    qa->isx16 = (int32_t *)(buf + a + 3 * f);
}

/* Activation row t -> int8 blocks: d = amax/127, q = round-to-even(x * 127/amax) clamped
 * to +-127 (llama.cpp's Q8_0 activations); the AVX-512 body rounds with cvtps (to nearest
 * even, as nearbyintf), so both bodies give the same bytes. */
static void quantize_token(const float *x, const cpu_qact *qx, int t) {
    const int nb = qx->nb;
    int8_t *q = qx->q + (size_t)t * nb * 32;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + (size_t)b * 32;
        float amax = 0.0f, d, id;
        int sum0 = 0, sum1 = 0;   /* of columns 0-15, 16-31 */
#if defined(MM_AVX512)
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d = amax / 127.0f;
        const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
        __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
        __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
        i0 = _mm512_max_epi32(_mm512_min_epi32(i0, lim), nlim);
        i1 = _mm512_max_epi32(_mm512_min_epi32(i1, lim), nlim);
        sum0 = _mm512_reduce_add_epi32(i0);
        sum1 = _mm512_reduce_add_epi32(i1);
        _mm_storeu_si128((__m128i *)(q + (size_t)b * 32), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + (size_t)b * 32 + 16), _mm512_cvtepi32_epi8(i1));
#else
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d = amax / 127.0f;
        for (int j = 0; j < 32; j++) {
            int v = (int)nearbyintf(xb[j] * id);
            v = v > 127 ? 127 : (v < -127 ? -127 : v);
            q[(size_t)b * 32 + j] = (int8_t)v;
            if (j < 16) sum0 += v;
            else sum1 += v;
        }
#endif
        const size_t tb = (size_t)t * nb + b;
        qx->dx[tb] = d;
        qx->isx[tb] = sum0 + sum1;
        qx->sx[tb] = d * (float)(sum0 + sum1);
        qx->isx16[2 * tb] = sum0;
        qx->isx16[2 * tb + 1] = sum1;
    }
}

void cpu_qact_quantize(const cpu_qact *qa, const float *x, int64_t cols, int t0, int t1) {
    for (int tk = t0; tk < t1; tk++) quantize_token(x + (size_t)tk * cols, qa, tk);
}

/* Bytes ahead of the current block that a pass prefetches: a decode pass streams every
 * weight once, and the hardware prefetcher alone leaves it waiting for memory at each
 * 4 KB page. */
#define MM_PREFETCH_BYTES 4096   /* 2-16 KB ahead, to L1 or L2, measured alike on Zen 4 */

#if defined(MM_AVX512) || defined(MM_AVX2)
/* IQ4's 16 unsigned weights iq4nl_value(q) + 128 (1..241) as one 16-byte shuffle table. */
static inline __m128i qp_lut128(void) {
    uint8_t v[16];
    for (int q = 0; q < 16; q++) v[q] = (uint8_t)(iq4nl_value(q) + 128);
    return _mm_loadu_si128((const __m128i *)v);
}
#endif

#if defined(MM_AVX512)
/* acc[i] (QP_ROWS lanes: the group's rows) for tokens t0 + i, i < TN, over all blocks of
 * one packed group, in the recipe's order (see the file comment).  The block's weight
 * operands are unpacked once for the TN tokens.  DT is a constant: each instance keeps
 * only its dtype's branches. */
#define QGROUP_INSTANCE(NAME, DT, TN, ATTR)                                                                \
    static ATTR void NAME(const uint8_t *gp, const cpu_qact *qx, int t0, int pf, __m512 *out) {        \
        const int nb = qx->nb, k = qp_k(DT), bits = qp_bits(DT), per = qp_per_super(DT);                \
        const size_t pb = qp_block(DT), head = qp_head(DT), sh = qp_super_head(DT), sb = sh + per * pb; \
        const __m512i m4 = _mm512_set1_epi8(15), top = _mm512_set1_epi8(bits == 6 ? 0x30 : 0x10);        \
        const __m512i lut = _mm512_broadcast_i32x4(qp_lut128());                                         \
        __m512 acc[TN];                                                                                 \
        _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) acc[i] = _mm512_setzero_ps();              \
        for (int b = 0; b < nb; b++) {                                                                  \
            const uint8_t *sp = gp + (size_t)(b / per) * sb, *p = sp + sh + (size_t)(b % per) * pb;     \
            if (pf) /* (the last block of a super-block also the next one's head) */                   \
                for (size_t off = 0; off < pb + (b % per == per - 1 ? sh : 0); off += 64)              \
                    _mm_prefetch((const char *)p + MM_PREFETCH_BYTES + off, _MM_HINT_T0);               \
            /* the rows' scales d and mins m (Q6_K: the scales of columns 0-15 and 16-31) */           \
            __m512 d, mn, mh0 = _mm512_setzero_ps(), mh1 = _mm512_setzero_ps(); /* mh: Q2_K's mins */   \
            if (QP_HALVES(DT)) {                                                                        \
                const __m512 sd = _mm512_loadu_ps(sp);                                                  \
                d = _mm512_mul_ps(sd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)))); \
                mn = _mm512_mul_ps(sd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))))); \
                if (DT == LLMI_Q2_K) {                                                                  \
                    const __m512 snd = _mm512_loadu_ps(sp + 64);                                        \
                    mh0 = _mm512_mul_ps(snd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 32))))); \
                    mh1 = _mm512_mul_ps(snd, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 48))))); \
                }                                                                                       \
            } else if (DT == LLMI_IQ4_XS) {                                                             \
                d = _mm512_mul_ps(_mm512_loadu_ps(sp),                                                  \
                                  _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)))); \
                mn = _mm512_setzero_ps();                                                               \
            } else if (dtype_is_kquant(DT)) {                                                           \
                d = _mm512_mul_ps(_mm512_loadu_ps(sp),                                                  \
                                  _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)))); \
                mn = _mm512_mul_ps(_mm512_loadu_ps(sp + 64),                                            \
                                   _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16))))); \
            } else {                                                                                    \
                d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));                            \
                mn = qp_has_min(DT) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)))    \
                                    : _mm512_setzero_ps();                                              \
            }                                                                                           \
            __m512i u[8]; /* operand j pairs with activation bytes 4j..4j+3 */                          \
            if (bits <= 3) { /* bit pairs (and third bits) to bits 0-1 (2) */                           \
                const __m512i m3 = _mm512_set1_epi8(3), b2 = _mm512_set1_epi8(4);                       \
                const __m512i c0 = _mm512_loadu_si512(p + head), c1 = _mm512_loadu_si512(p + head + 64); \
                const __m512i t3 = bits == 3 ? _mm512_loadu_si512(p + head + 128) : _mm512_setzero_si512(); \
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                  \
                    u[j] = _mm512_and_si512(_mm512_srli_epi16(j < 4 ? c0 : c1, 2 * (j % 4)), m3);       \
                    if (bits == 3)                                                                      \
                        u[j] = _mm512_or_si512(u[j], _mm512_and_si512(j < 2 ? _mm512_slli_epi16(t3, 2 - j) \
                                                                            : _mm512_srli_epi16(t3, j - 2), b2)); \
                }                                                                                       \
            }                                                                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4 && bits > 3; j++) {                          \
                if (bits == 8) {                                                                        \
                    u[j] = _mm512_loadu_si512(p + head + (size_t)j * 64);                               \
                    u[4 + j] = _mm512_loadu_si512(p + head + (size_t)(4 + j) * 64);                     \
                    continue;                                                                           \
                }                                                                                       \
                const __m512i v = _mm512_loadu_si512(p + head + (size_t)j * 64);                         \
                u[j] = _mm512_and_si512(v, m4);                                                         \
                u[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);                               \
                if (bits > 4) { /* the top bits to bit 4 (no 16-bit shift crosses a byte's mask) */    \
                    const __m512i tq = _mm512_loadu_si512(p + head + (size_t)qp_top_quad(bits, j) * 64); \
                    const int sft = qp_top_shift(bits, j);                                              \
                    u[j] = _mm512_or_si512(u[j], _mm512_and_si512(_mm512_slli_epi16(tq, 4 - sft), top)); \
                    u[4 + j] = _mm512_or_si512(u[4 + j], _mm512_and_si512(_mm512_srli_epi16(tq, sft), top)); \
                }                                                                                       \
                if (QP_LUT(DT)) { /* the index's value + 128 */                                         \
                    u[j] = _mm512_shuffle_epi8(lut, u[j]);                                              \
                    u[4 + j] = _mm512_shuffle_epi8(lut, u[4 + j]);                                      \
                }                                                                                       \
            }                                                                                           \
            _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) { /* (unrolled: acc stays in registers) */ \
                const size_t tb = (size_t)(t0 + i) * nb + b;                                            \
                const int8_t *xq = qx->q + tb * 32;                                                     \
                const __m512 dx = _mm512_set1_ps(qx->dx[tb]);                                           \
                if (QP_HALVES(DT)) { /* a dot per half block: is_h = sum u * x_q - k * sum x_q */      \
                    __m512i is0 = _mm512_set1_epi32(-k * qx->isx16[2 * tb]);                            \
                    __m512i is1 = _mm512_set1_epi32(-k * qx->isx16[2 * tb + 1]);                        \
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                              \
                        int32_t x4;                                                                     \
                        memcpy(&x4, xq + 4 * j, 4);                                                     \
                        if (j < 4) is0 = _mm512_dpbusd_epi32(is0, u[j], _mm512_set1_epi32(x4));         \
                        else is1 = _mm512_dpbusd_epi32(is1, u[j], _mm512_set1_epi32(x4));               \
                    }                                                                                   \
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is0), _mm512_mul_ps(d, dx), acc[i]);     \
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is1), _mm512_mul_ps(mn, dx), acc[i]);    \
                    if (DT == LLMI_Q2_K) { /* its mins: m_h * (d_x * sum of the half's x_q) */           \
                        acc[i] = _mm512_fmadd_ps(mh0, _mm512_set1_ps(qx->dx[tb] * (float)qx->isx16[2 * tb]), acc[i]); \
                        acc[i] = _mm512_fmadd_ps(mh1, _mm512_set1_ps(qx->dx[tb] * (float)qx->isx16[2 * tb + 1]), acc[i]); \
                    }                                                                                   \
                    continue;                                                                           \
                }                                                                                       \
                __m512i is = _mm512_set1_epi32(-k * qx->isx[tb]);                                       \
                _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                  \
                    int32_t x4;                                                                         \
                    memcpy(&x4, xq + 4 * j, 4);                                                         \
                    is = _mm512_dpbusd_epi32(is, u[j], _mm512_set1_epi32(x4));                          \
                }                                                                                       \
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d, dx), acc[i]);          \
                if (qp_has_min(DT)) acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(qx->sx[tb]), acc[i]);     \
            }                                                                                           \
        }                                                                                               \
        _Pragma("GCC unroll 8") for (int i = 0; i < TN; i++) out[i] = acc[i];                           \
    }
#define QGROUP_FORMAT(DT, SFX, ATTR)                                                                    \
    QGROUP_INSTANCE(qgroup_##SFX##_1, DT, 1, ATTR)                                                      \
    QGROUP_INSTANCE(qgroup_##SFX##_2, DT, 2, ATTR)                                                      \
    QGROUP_INSTANCE(qgroup_##SFX##_4, DT, 4, ATTR)                                                      \
    QGROUP_INSTANCE(qgroup_##SFX##_8, DT, 8, ATTR)                                                      \
    static void qgroup_##SFX(const uint8_t *gp, const cpu_qact *qx, int t0, int tn, int pf, __m512 *acc) { \
        int i = 0;                                                                                      \
        for (; i + 8 <= tn; i += 8) qgroup_##SFX##_8(gp, qx, t0 + i, pf, acc + i);                     \
        for (; i + 4 <= tn; i += 4) qgroup_##SFX##_4(gp, qx, t0 + i, pf, acc + i);                     \
        for (; i + 2 <= tn; i += 2) qgroup_##SFX##_2(gp, qx, t0 + i, pf, acc + i);                     \
        for (; i < tn; i++) qgroup_##SFX##_1(gp, qx, t0 + i, pf, acc + i);                             \
    }
/* The wider codes' kernels are kept out of quant_range: inlined there, their decode
 * (one token) runs 1.3x slower (register allocation over the larger function). */
#define QG_OWN __attribute__((noinline))
QGROUP_FORMAT(LLMI_Q4_0, q4_0, )
QGROUP_FORMAT(LLMI_Q4_1, q4_1, )
QGROUP_FORMAT(LLMI_Q8_0, q8_0, )
QGROUP_FORMAT(LLMI_Q5_0, q5_0, QG_OWN)
QGROUP_FORMAT(LLMI_Q5_1, q5_1, QG_OWN)
QGROUP_FORMAT(LLMI_Q4_K, q4_k, QG_OWN)
QGROUP_FORMAT(LLMI_Q5_K, q5_k, QG_OWN)
QGROUP_FORMAT(LLMI_Q6_K, q6_k, QG_OWN)
QGROUP_FORMAT(LLMI_Q3_K, q3_k, QG_OWN)
QGROUP_FORMAT(LLMI_IQ4_NL, iq4_nl, QG_OWN)
QGROUP_FORMAT(LLMI_IQ4_XS, iq4_xs, QG_OWN)
QGROUP_FORMAT(LLMI_Q2_K, q2_k, QG_OWN)
#elif defined(MM_AVX2)
/* The same recipe on AVX2, 8 rows a vector: half h of the group (rows 8h .. 8h + 7) is 32
 * bytes of each 64-byte quad.  vpmaddubsw multiplies unsigned by signed bytes and sums the
 * pairs into int16, saturating, so the operands' int16 sums are widened by vpmaddwd (by
 * ones) to int32 before they can overflow: a pair of codes of at most U times activations
 * (|x| <= 127) is at most 254 U, so MM_I16_RUN operands of a block are summed in int16 where
 * 254 U times that many is at most 32,767: 8 for nibbles (U = 15: 30,480), 4 for the Q5 types
 * (5-bit codes: 31,496), 2 for Q6_K's 6-bit ones (32,004).  A Q8_0 byte u = q + 128 (up to
 * 255) would saturate one pair alone: it is split into its nibbles, u = 16 u_hi + u_lo, two
 * such dots.  The block's integer dots are then the same int32s as vpdpbusd's, and their
 * float steps (fp16 scales by F16C, the products rounded, the FMAs) are the AVX-512
 * kernel's per lane: the same bits.  The weights of a half are unpacked once for TN tokens. */
static inline __m256i mm_bcast4(const int8_t *x) {   /* 4 activation bytes in every lane */
    int32_t x4;
    memcpy(&x4, x, 4);
    return _mm256_set1_epi32(x4);
}
/* (an expression of DT, not qp_bits(DT): GCC's unroll pragmas want a bound it can read) */
#define MM_I16_RUN(DT)                                                                                          \
    ((DT) == LLMI_Q6_K ? 2                                                                                      \
     : ((DT) == LLMI_Q5_0 || (DT) == LLMI_Q5_1 || (DT) == LLMI_Q5_K || (DT) == LLMI_Q3_K || (DT) == LLMI_Q2_K) ? 4 \
                                                                                                              : 8)
#define QGROUP2_INSTANCE(NAME, DT, TN)                                                                  \
    static void NAME(const uint8_t *gp, const cpu_qact *qx, int t0, int pf, float *out) {               \
        const int nb = qx->nb, k = qp_k(DT), bits = qp_bits(DT), per = qp_per_super(DT);                \
        const size_t pb = qp_block(DT), head = qp_head(DT), sh = qp_super_head(DT), sb = sh + per * pb; \
        const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);                          \
        const __m256i lut = _mm256_broadcastsi128_si256(qp_lut128());                                    \
        for (int h = 0; h < 2; h++) {                                                                   \
            __m256 acc[TN];                                                                             \
            _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) acc[i] = _mm256_setzero_ps();          \
            for (int b = 0; b < nb; b++) {                                                              \
                const uint8_t *sp = gp + (size_t)(b / per) * sb, *p = sp + sh + (size_t)(b % per) * pb; \
                if (pf && h == 0)                                                                       \
                    for (size_t off = 0; off < pb + (b % per == per - 1 ? sh : 0); off += 64)          \
                        _mm_prefetch((const char *)p + MM_PREFETCH_BYTES + off, _MM_HINT_T0);           \
                /* the rows' scales d and mins m (Q6_K: the scales of columns 0-15 and 16-31) */       \
                __m256 d, mn, mh0 = _mm256_setzero_ps(), mh1 = _mm256_setzero_ps(); /* mh: Q2_K's mins */ \
                if (QP_HALVES(DT)) {                                                                    \
                    const __m256 sd = _mm256_loadu_ps((const float *)(sp + 32 * h));                    \
                    d = _mm256_mul_ps(sd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * h))))); \
                    mn = _mm256_mul_ps(sd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * h))))); \
                    if (DT == LLMI_Q2_K) {                                                              \
                        const __m256 snd = _mm256_loadu_ps((const float *)(sp + 64 + 32 * h));          \
                        mh0 = _mm256_mul_ps(snd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 32 + 8 * h))))); \
                        mh1 = _mm256_mul_ps(snd, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 48 + 8 * h))))); \
                    }                                                                                   \
                } else if (DT == LLMI_IQ4_XS) {                                                         \
                    d = _mm256_mul_ps(_mm256_loadu_ps((const float *)(sp + 32 * h)),                    \
                                      _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * h))))); \
                    mn = _mm256_setzero_ps();                                                           \
                } else if (dtype_is_kquant(DT)) {                                                       \
                    d = _mm256_mul_ps(_mm256_loadu_ps((const float *)(sp + 32 * h)),                    \
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * h))))); \
                    mn = _mm256_mul_ps(_mm256_loadu_ps((const float *)(sp + 64 + 32 * h)),              \
                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 + 8 * h))))); \
                } else {                                                                                \
                    d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));                \
                    mn = qp_has_min(DT) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * h))) \
                                        : _mm256_setzero_ps();                                          \
                }                                                                                       \
                __m256i u[8]; /* operand j pairs with activation bytes 4j..4j+3 (Q8_0: split below) */  \
                if (bits <= 3) { /* bit pairs (and third bits) to bits 0-1 (2) */                       \
                    const __m256i m3 = _mm256_set1_epi8(3), b2 = _mm256_set1_epi8(4);                   \
                    const __m256i c0 = _mm256_loadu_si256((const __m256i *)(p + head + 32 * h));        \
                    const __m256i c1 = _mm256_loadu_si256((const __m256i *)(p + head + 64 + 32 * h));   \
                    const __m256i t3 = bits == 3 ? _mm256_loadu_si256((const __m256i *)(p + head + 128 + 32 * h)) \
                                                 : _mm256_setzero_si256();                              \
                    _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                              \
                        u[j] = _mm256_and_si256(_mm256_srli_epi16(j < 4 ? c0 : c1, 2 * (j % 4)), m3);   \
                        if (bits == 3)                                                                  \
                            u[j] = _mm256_or_si256(u[j], _mm256_and_si256(j < 2 ? _mm256_slli_epi16(t3, 2 - j) \
                                                                                : _mm256_srli_epi16(t3, j - 2), b2)); \
                    }                                                                                   \
                }                                                                                       \
                _Pragma("GCC unroll 4") for (int j = 0; j < 4 && bits > 3; j++) {                      \
                    if (bits == 8) {                                                                    \
                        u[j] = _mm256_loadu_si256((const __m256i *)(p + head + (size_t)j * 64 + 32 * h)); \
                        u[4 + j] = _mm256_loadu_si256((const __m256i *)(p + head + (size_t)(4 + j) * 64 + 32 * h)); \
                        continue;                                                                       \
                    }                                                                                   \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(p + head + (size_t)j * 64 + 32 * h)); \
                    u[j] = _mm256_and_si256(v, m4);                                                     \
                    u[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);                           \
                    if (bits > 4) { /* the top bits to bit 4 */                                         \
                        const __m256i top = _mm256_set1_epi8(bits == 6 ? 0x30 : 0x10);                   \
                        const __m256i tq = _mm256_loadu_si256(                                           \
                            (const __m256i *)(p + head + (size_t)qp_top_quad(bits, j) * 64 + 32 * h));   \
                        const int sft = qp_top_shift(bits, j);                                          \
                        u[j] = _mm256_or_si256(u[j], _mm256_and_si256(_mm256_slli_epi16(tq, 4 - sft), top)); \
                        u[4 + j] = _mm256_or_si256(u[4 + j], _mm256_and_si256(_mm256_srli_epi16(tq, sft), top)); \
                    }                                                                                   \
                    if (QP_LUT(DT)) { /* the index's value + 128 */                                     \
                        u[j] = _mm256_shuffle_epi8(lut, u[j]);                                          \
                        u[4 + j] = _mm256_shuffle_epi8(lut, u[4 + j]);                                  \
                    }                                                                                   \
                }                                                                                       \
                _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++) {                                  \
                    const size_t tb = (size_t)(t0 + i) * nb + b;                                        \
                    const int8_t *xq = qx->q + tb * 32;                                                 \
                    const __m256 dx = _mm256_set1_ps(qx->dx[tb]);                                       \
                    if (DT == LLMI_Q8_0 || QP_LUT(DT)) { /* bytes to 255: split per token (u_lo/u_hi kept would take 16 ymm) */ \
                        __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256(); /* int16 pair sums */ \
                        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                           \
                            const __m256i xv = mm_bcast4(xq + 4 * j);                                   \
                            lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(u[j], m4), xv)); \
                            const __m256i uh = _mm256_and_si256(_mm256_srli_epi16(u[j], 4), m4);        \
                            hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(uh, xv));                    \
                        }                                                                               \
                        __m256i is = _mm256_add_epi32(_mm256_set1_epi32(-k * qx->isx[tb]), _mm256_madd_epi16(lo, ones)); \
                        is = _mm256_add_epi32(is, _mm256_slli_epi32(_mm256_madd_epi16(hi, ones), 4));   \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, dx), acc[i]); \
                        continue;                                                                       \
                    }                                                                                   \
                    /* is0: the block's dot (Q6_K: of columns 0-15, is1 of 16-31) */                    \
                    __m256i is0 = _mm256_set1_epi32(-k * (QP_HALVES(DT) ? qx->isx16[2 * tb] : qx->isx[tb])); \
                    __m256i is1 = _mm256_set1_epi32(QP_HALVES(DT) ? -k * qx->isx16[2 * tb + 1] : 0);      \
                    _Pragma("GCC unroll 8") for (int j0 = 0; j0 < 8; j0 += MM_I16_RUN(DT)) {            \
                        __m256i s16 = _mm256_maddubs_epi16(u[j0], mm_bcast4(xq + 4 * j0));              \
                        _Pragma("GCC unroll 8") for (int j = j0 + 1; j < j0 + MM_I16_RUN(DT); j++)      \
                            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[j], mm_bcast4(xq + 4 * j))); \
                        if (QP_HALVES(DT) && j0 >= 4) is1 = _mm256_add_epi32(is1, _mm256_madd_epi16(s16, ones)); \
                        else is0 = _mm256_add_epi32(is0, _mm256_madd_epi16(s16, ones));                 \
                    }                                                                                   \
                    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is0), _mm256_mul_ps(d, dx), acc[i]);    \
                    if (QP_HALVES(DT)) {                                                                \
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is1), _mm256_mul_ps(mn, dx), acc[i]); \
                        if (DT == LLMI_Q2_K) { /* its mins: m_h * (d_x * sum of the half's x_q) */      \
                            acc[i] = _mm256_fmadd_ps(mh0, _mm256_set1_ps(qx->dx[tb] * (float)qx->isx16[2 * tb]), acc[i]); \
                            acc[i] = _mm256_fmadd_ps(mh1, _mm256_set1_ps(qx->dx[tb] * (float)qx->isx16[2 * tb + 1]), acc[i]); \
                        }                                                                               \
                    } else if (qp_has_min(DT))                                                          \
                        acc[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(qx->sx[tb]), acc[i]);               \
                }                                                                                       \
            }                                                                                           \
            _Pragma("GCC unroll 4") for (int i = 0; i < TN; i++)                                        \
                _mm256_storeu_ps(out + (size_t)i * QP_ROWS + 8 * h, acc[i]);                            \
        }                                                                                               \
    }
#define QGROUP2_FORMAT(DT, SFX)                                                                         \
    QGROUP2_INSTANCE(qgroup2_##SFX##_1, DT, 1)                                                          \
    QGROUP2_INSTANCE(qgroup2_##SFX##_2, DT, 2)                                                          \
    QGROUP2_INSTANCE(qgroup2_##SFX##_4, DT, 4)                                                          \
    static void qgroup2_##SFX(const uint8_t *gp, const cpu_qact *qx, int t0, int tn, int pf, float *acc) { \
        int i = 0;                                                                                      \
        for (; i + 4 <= tn; i += 4) qgroup2_##SFX##_4(gp, qx, t0 + i, pf, acc + (size_t)i * QP_ROWS);  \
        for (; i + 2 <= tn; i += 2) qgroup2_##SFX##_2(gp, qx, t0 + i, pf, acc + (size_t)i * QP_ROWS);  \
        for (; i < tn; i++) qgroup2_##SFX##_1(gp, qx, t0 + i, pf, acc + (size_t)i * QP_ROWS);          \
    }
QGROUP2_FORMAT(LLMI_Q4_0, q4_0)
QGROUP2_FORMAT(LLMI_Q4_1, q4_1)
QGROUP2_FORMAT(LLMI_Q8_0, q8_0)
QGROUP2_FORMAT(LLMI_Q5_0, q5_0)
QGROUP2_FORMAT(LLMI_Q5_1, q5_1)
QGROUP2_FORMAT(LLMI_Q4_K, q4_k)
QGROUP2_FORMAT(LLMI_Q5_K, q5_k)
QGROUP2_FORMAT(LLMI_Q6_K, q6_k)
QGROUP2_FORMAT(LLMI_Q3_K, q3_k)
QGROUP2_FORMAT(LLMI_IQ4_NL, iq4_nl)
QGROUP2_FORMAT(LLMI_IQ4_XS, iq4_xs)
QGROUP2_FORMAT(LLMI_Q2_K, q2_k)
#else
/* The same recipe one (row, token) at a time: the same integers, products and fused
 * multiply-adds in the same order, so every body gives the same bits. */
/* Code c of row r in a block's code quads q (the layout above). */
static int qp_code(int bits, const uint8_t *q, int r, int c) {
    if (bits == 8) return q[(size_t)(c / 4) * 4 * QP_ROWS + 4 * r + c % 4];
    if (bits <= 3) {
        const int j = c / 4, e = c % 4;
        int v = q[(size_t)(j / 4) * 4 * QP_ROWS + 4 * r + e] >> (2 * (j % 4)) & 3;
        if (bits == 3) v |= (q[(size_t)2 * 4 * QP_ROWS + 4 * r + e] >> j & 1) << 2;
        return v;
    }
    const int j = c % 16 / 4, e = c % 4, hi = c >= 16;
    int v = q[(size_t)j * 4 * QP_ROWS + 4 * r + e] >> (4 * hi) & 15;
    if (bits > 4) {
        const int top = q[(size_t)qp_top_quad(bits, j) * 4 * QP_ROWS + 4 * r + e];
        v |= (top >> (qp_top_shift(bits, j) + 4 * hi) & ((1 << (bits - 4)) - 1)) << 4;
    }
    return v;
}
static float qp_head_value(const uint8_t *gp, llmi_dtype t, int b, int k, int r) {   /* head array k, row r */
    const uint8_t *p = qp_block_at(gp, t, b);
    if (qp_per_super(t) == 8) {   /* the super-block's d (-dmin) times the integer scale (min) */
        const uint8_t *sp = p - qp_super_head(t) - (size_t)(b % qp_per_super(t)) * qp_block(t);
        float f;
        const int sgn = qp_super_head(t) == 4 * QP_ROWS;   /* d alone: int8 (signed) scales */
        const int mins = t == LLMI_Q2_K ? k >= 2 : !sgn && k == 1;             /* a min: times -dmin */
        memcpy(&f, sp + (mins ? 4 * QP_ROWS : 0) + 4 * r, 4);
        const int s = sgn ? (int8_t)p[QP_ROWS * k + r] : p[QP_ROWS * k + r];
        return f * (float)s;
    }
    uint16_t h;
    memcpy(&h, p + 2 * QP_ROWS * k + 2 * r, 2);
    return fp16_to_f32(h);
}
static void qgroup_scalar(const uint8_t *gp, llmi_dtype t, const cpu_qact *qx, int t0, int tn, float *acc) {
    const int nb = qx->nb, k = qp_k(t);
    for (int i = 0; i < tn; i++)
        for (int r = 0; r < QP_ROWS; r++) {
            float a = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *q = qp_block_at(gp, t, b) + qp_head(t);
                const size_t tb = (size_t)(t0 + i) * nb + b;
                const int8_t *xq = qx->q + tb * 32;
                /* is[0]: the block's dot (Q6_K: of columns 0-15, is[1] of 16-31) */
                int32_t is[2] = {-k * (QP_HALVES(t) ? qx->isx16[2 * tb] : qx->isx[tb]),
                                 QP_HALVES(t) ? -k * qx->isx16[2 * tb + 1] : 0};
                for (int c = 0; c < 32; c++) {
                    const int u = qp_code(qp_bits(t), q, r, c);
                    is[QP_HALVES(t) && c >= 16] += (QP_LUT(t) ? iq4nl_value(u) + 128 : u) * xq[c];
                }
                a = fmaf((float)is[0], qp_head_value(gp, t, b, 0, r) * qx->dx[tb], a);
                if (QP_HALVES(t)) {
                    a = fmaf((float)is[1], qp_head_value(gp, t, b, 1, r) * qx->dx[tb], a);
                    if (t == LLMI_Q2_K)
                        for (int h = 0; h < 2; h++)
                            a = fmaf(qp_head_value(gp, t, b, 2 + h, r), qx->dx[tb] * (float)qx->isx16[2 * tb + h], a);
                } else if (qp_has_min(t)) {
                    a = fmaf(qp_head_value(gp, t, b, 1, r), qx->sx[tb], a);
                }
            }
            acc[(size_t)i * QP_ROWS + r] = a;
        }
}
#endif

/* Rows [r0, r1) of y (n, w->rows) for tokens [ta, tb) of a packed weight, MM_TILE tokens
 * per pass over a group's blocks. */
static void quant_range(const llmi_tensor *w, const cpu_qact *qx, int ta, int tb, int64_t r0, int64_t r1, float *y) {
    if (w->layout != LLMI_LAYOUT_CPU16) {   /* callers pack first (cpu_qweight_pack): a broken invariant */
        fprintf(stderr, "llmi: internal error: cpu matmul on an unpacked %s weight\n", dtype_name(w->dtype));
        abort();
    }
    const size_t gbytes = qp_group_bytes(w->dtype, qx->nb);
    for (int64_t g = r0 / QP_ROWS; g * QP_ROWS < r1; g++) {
        const uint8_t *gp = (const uint8_t *)w->data + (size_t)g * gbytes;
        const int64_t lo = g * QP_ROWS > r0 ? g * QP_ROWS : r0, hi = (g + 1) * QP_ROWS < r1 ? (g + 1) * QP_ROWS : r1;
        for (int t0 = ta; t0 < tb; t0 += MM_TILE) {
            int tn = tb - t0 < MM_TILE ? tb - t0 : MM_TILE, pf = t0 == ta;
#if defined(MM_AVX512)
            __m512 acc[MM_TILE];   /* (token of the tile) the group's QP_ROWS rows */
            switch (w->dtype) {
            case LLMI_Q4_1: qgroup_q4_1(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q4_0: qgroup_q4_0(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_0: qgroup_q5_0(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_1: qgroup_q5_1(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q4_K: qgroup_q4_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_K: qgroup_q5_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q6_K: qgroup_q6_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q3_K: qgroup_q3_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_IQ4_NL: qgroup_iq4_nl(gp, qx, t0, tn, pf, acc); break;
            case LLMI_IQ4_XS: qgroup_iq4_xs(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q2_K: qgroup_q2_k(gp, qx, t0, tn, pf, acc); break;
            default: qgroup_q8_0(gp, qx, t0, tn, pf, acc); break;
            }
            __mmask16 keep = (__mmask16)(((1u << (hi - lo)) - 1) << (lo - g * QP_ROWS));
            for (int i = 0; i < tn; i++)
                _mm512_mask_storeu_ps(y + (size_t)(t0 + i) * w->rows + g * QP_ROWS, keep, acc[i]);
#else
            float acc[MM_TILE * QP_ROWS];   /* (token of the tile, row of the group) */
#if defined(MM_AVX2)
            switch (w->dtype) {
            case LLMI_Q4_1: qgroup2_q4_1(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q4_0: qgroup2_q4_0(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_0: qgroup2_q5_0(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_1: qgroup2_q5_1(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q4_K: qgroup2_q4_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q5_K: qgroup2_q5_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q6_K: qgroup2_q6_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q3_K: qgroup2_q3_k(gp, qx, t0, tn, pf, acc); break;
            case LLMI_IQ4_NL: qgroup2_iq4_nl(gp, qx, t0, tn, pf, acc); break;
            case LLMI_IQ4_XS: qgroup2_iq4_xs(gp, qx, t0, tn, pf, acc); break;
            case LLMI_Q2_K: qgroup2_q2_k(gp, qx, t0, tn, pf, acc); break;
            default: qgroup2_q8_0(gp, qx, t0, tn, pf, acc); break;
            }
#else
            (void)pf;
            qgroup_scalar(gp, w->dtype, qx, t0, tn, acc);
#endif
            for (int i = 0; i < tn; i++)
                for (int64_t r = lo; r < hi; r++) y[(size_t)(t0 + i) * w->rows + r] = acc[(size_t)i * QP_ROWS + (r - g * QP_ROWS)];
#endif
        }
    }
}

/* nw packed weights of one width sharing the activations x: x is quantized once and one
 * parallel region walks the row groups of all of them. */
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
    int64_t gb_end[MM_MAX_MULTI];   /* cumulative row-group counts of the weights */
    int64_t ngb = 0, work = 0;
    for (int i = 0; i < nw; i++) {
        ngb += (ws[i]->rows + QP_ROWS - 1) / QP_ROWS;
        gb_end[i] = ngb;
        work += ws[i]->rows * cols * (int64_t)n;
    }
    /* Decode-sized batches are quantized before the parallel region: one barrier fewer
     * per matmul, which matters when the cores are shared and a waiting thread spins. */
    int serial_q = n <= 4;
    if (serial_q) cpu_qact_quantize(&qx, x, cols, 0, n);
#pragma omp parallel if (work > 32768)
    {
        if (!serial_q) {
#pragma omp for schedule(static)
            for (int tk = 0; tk < n; tk++) cpu_qact_quantize(&qx, x, cols, tk, tk + 1);
        }
        /* static schedules of one trip count give every chunk's row groups to the same
         * threads (OpenMP's rule), so no barrier is needed between chunks and each
         * thread's weights stay in its caches */
        for (int c0 = 0; c0 < n; c0 += MM_TOKEN_CHUNK) {
            int c1 = n - c0 < MM_TOKEN_CHUNK ? n : c0 + MM_TOKEN_CHUNK;
#pragma omp for schedule(static) nowait
            for (int64_t gi = 0; gi < ngb; gi++) {
                int wi = 0;
                while (gi >= gb_end[wi]) wi++;
                int64_t g = gi - (wi ? gb_end[wi - 1] : 0), rows = ws[wi]->rows;
                int64_t r1 = (g + 1) * QP_ROWS < rows ? (g + 1) * QP_ROWS : rows;
                quant_range(ws[wi], &qx, c0, c1, g * QP_ROWS, r1, ys[wi]);
            }
        }
    }
    if (buf != scratch) free(buf);
}

static void add_bias(const llmi_tensor *w, int n, const float *bias, float *y) {
    if (bias) cpu_add_bias(y, n, (int)w->rows, bias);
}


/* The packed form of a quantized weight for one call (tests and callers that hold raw
 * GGUF-layout tensors; the backend packs once at load). */
static const llmi_tensor *packed_for_call(const llmi_tensor *w, llmi_tensor *tmp) {
    if (!cpu_qweight_packable(w)) return w;
    llmi_status st;
    if (cpu_qweight_pack(w, tmp, &st)) return NULL;
    return tmp;
}

void cpu_matmul_multi(int nw, const llmi_tensor *const *w, const float *x, int n, const float *const *bias,
                      float *const *y, void *scratch, size_t scratch_bytes) {
    if (n <= 0 || nw <= 0) return;
    int shared = nw <= MM_MAX_MULTI && is_qpacked(w[0]->dtype);
    for (int i = 1; i < nw && shared; i++) shared = is_qpacked(w[i]->dtype) && w[i]->cols == w[0]->cols;
    if (!shared) {
        for (int i = 0; i < nw; i++) cpu_matmul(w[i], x, n, bias ? bias[i] : NULL, y[i]);
        return;
    }
    llmi_tensor tmp[MM_MAX_MULTI];
    const llmi_tensor *pw[MM_MAX_MULTI];
    int ok = 1;
    for (int i = 0; i < nw; i++) {
        tmp[i].owned = NULL;
        pw[i] = packed_for_call(w[i], &tmp[i]);
        ok &= pw[i] != NULL;
    }
    if (ok) matmul_quant(nw, pw, x, n, y, scratch, scratch_bytes);
    for (int i = 0; i < nw; i++) {
        if (pw[i] == &tmp[i]) free(tmp[i].owned);
        if (!ok)   /* out of memory while packing: no error channel here, make it impossible to miss */
            for (size_t j = 0; j < (size_t)n * w[i]->rows; j++) y[i][j] = NAN;
        else add_bias(w[i], n, bias ? bias[i] : NULL, y[i]);
    }
}

void cpu_matmul(const llmi_tensor *w, const float *x, int n, const float *bias, float *y) {
    if (n <= 0) return;
    if (is_qpacked(w->dtype)) {
        const float *b1[1] = {bias};
        cpu_matmul_multi(1, &w, x, n, b1, &y, NULL, 0);
        return;
    }
    if (w->dtype == LLMI_I4G)
        matmul_i4g(w, x, n, y);
    else
        matmul_dense(w, x, n, y);
    add_bias(w, n, bias, y);
}

void cpu_matmul_rows(const llmi_tensor *w, const float *x, const cpu_qact *qa, int n, int64_t r0, int64_t r1,
                     const float *bias, float *y) {
    if (is_qpacked(w->dtype))
        quant_range(w, qa, 0, n, r0, r1, y);
    else
        dense_range(w, r0, r1, x, n, y);
    if (bias)
        for (int t = 0; t < n; t++)
            for (int64_t r = r0; r < r1; r++) y[(size_t)t * w->rows + r] += bias[r];
}

int cpu_matmul_rows_ok(llmi_dtype t) { return t != LLMI_I4G; }

