/* cpu/attention.c — owns causal paged attention over the KV caches with an online
 * (streaming) softmax in fp32.  One tile is up to ATTN_QTILE consecutive tokens of one
 * sequence times the query heads that share one kv head (GQA): each cached K/V row is
 * loaded and converted to fp32 once per tile, not once per token and head, which is what
 * keeps long prompts from being dominated by f16/bf16/q8 conversions.  Positions are
 * walked in ascending order in chunks of ATTN_CHUNK aligned to position 0, and each
 * (token, head) row keeps its own scores, running max, sum and output, so a token's
 * result depends only on its own q and the cache, never on what else is in the batch
 * or which rows share its tile. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define ATTN_CHUNK 16         /* positions scored before one softmax update */
#define ATTN_MAX_HD 512
#define ATTN_ACC_FLOATS 8192  /* stack floats for the running outputs of a tile's rows */
#define ATTN_QTILE 16         /* tokens of one sequence per tile */
#define ATTN_ROWS 64          /* (token, head) rows per tile */

/* The vector bodies' e^x for x <= 0 (scores minus their running max), ~1 ulp: Cephes expf,
 * x - n ln2 with ln2 in two parts, a degree-5 polynomial in r, scaled by 2^n. */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define ATTN_EXP_LOG2E 1.44269504088896341f
static const float attn_exp_ln2[2] = {0.693359375f, -2.12194440e-4f};
static const float attn_exp_poly[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                       4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
#endif

#if defined(__AVX512F__)
static inline __m512 attn_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(ATTN_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(attn_exp_ln2[0]), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(attn_exp_ln2[1]), r);
    __m512 p = _mm512_set1_ps(attn_exp_poly[0]);
    for (int k = 1; k < 6; k++) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(attn_exp_poly[k]));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

#if defined(__AVX512F__)
/* Lane j of the result = the sum of the 16 lanes of v[j]: a transpose-and-add tree,
 * ~3 shuffles+adds per vector instead of a full horizontal reduction each. */
static inline __m512 attn_hsum16(const __m512 *v) {
    __m512 u[8], w[4];
    for (int k = 0; k < 8; k++) u[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++)
        w[k] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(w[2], w[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define ATTN_AVX2 1
/* attn_exp on 8 lanes; 2^n built in the exponent field (n >= -126 after the clamp, so the
 * result stays normal). */
static inline __m256 attn_exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(ATTN_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(attn_exp_ln2[0]), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(attn_exp_ln2[1]), r);
    __m256 p = _mm256_set1_ps(attn_exp_poly[0]);
    for (int k = 1; k < 6; k++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(attn_exp_poly[k]));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
/* Lane j of the result = the sum of the 8 lanes of v[j] (horizontal adds, then the two
 * 128-bit halves). */
static inline __m256 attn_hsum8(const __m256 *v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
/* The 16 lanes of a chunk from s (cn of them), the rest set to fill. */
static inline void attn_load16(const float *s, int cn, float fill, __m256 *lo, __m256 *hi) {
    float t[ATTN_CHUNK];
    for (int j = 0; j < ATTN_CHUNK; j++) t[j] = j < cn ? s[j] : fill;
    *lo = _mm256_loadu_ps(t);
    *hi = _mm256_loadu_ps(t + 8);
}
#endif

/* p[j] = exp(s[j] - mx) for j < cn; returns their sum (fixed order). */
static float attn_probs(const float *s, int cn, float mx, float *p) {
#if defined(__AVX512F__)
    __mmask16 m = (__mmask16)((1u << cn) - 1);
    __m512 e = attn_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s), _mm512_set1_ps(mx)));
    e = _mm512_maskz_mov_ps(m, e);
    _mm512_storeu_ps(p, e);
    return _mm512_reduce_add_ps(e);
#elif defined(ATTN_AVX2)
    __m256 lo, hi;
    attn_load16(s, cn, mx, &lo, &hi);   /* lanes past cn: exp(0), then zeroed */
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 e0 = attn_exp8(_mm256_sub_ps(lo, vm)), e1 = attn_exp8(_mm256_sub_ps(hi, vm));
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    e0 = _mm256_and_ps(e0, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(cn), lane)));
    e1 = _mm256_and_ps(e1, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(cn - 8), lane)));
    _mm256_storeu_ps(p, e0);
    _mm256_storeu_ps(p + 8, e1);
    __m256 t = _mm256_add_ps(e0, e1);
    __m128 h = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#else
    float sum = 0.0f;
    for (int j = 0; j < cn; j++) sum += (p[j] = expf(s[j] - mx));
    return sum;
#endif
}

/* Head kvh of position p's cached row: slots of slot_bytes, heads of head_bytes. */
static const void *kv_row(const void *cache, const int32_t *table, int block_size, int p, size_t slot_bytes,
                          int kvh, size_t head_bytes) {
    size_t slot = (size_t)table[p / block_size] * block_size + (size_t)(p % block_size);
    return (const char *)cache + slot * slot_bytes + (size_t)kvh * head_bytes;
}

typedef struct attn_args {
    const float *q;          /* (n_tokens, n_heads, head_dim) */
    const void *k_cache, *v_cache;
    llmi_kv_dtype kv_dtype;
    const float *k_scale, *v_scale;
    const llmi_batch *b;
    int n_heads, n_kv_heads, head_dim, block_size;
    float scale;
    float softcap;           /* 0 = none */
    int window;              /* keys a query sees, itself included; 0 = all */
    size_t slot_bytes, head_bytes;
    float *out;              /* (n_tokens, n_heads, head_dim) */
} attn_args;

/* rows[j] = fp32 head kvh of positions p0 + j, j < cn: the cache itself for f32, else
 * converted into buf (cn, head_dim) once for the whole tile. */
static void chunk_rows(const attn_args *a, const void *cache, const int32_t *table, int p0, int cn, int kvh,
                       float scale, float *buf, const float **rows) {
    for (int j = 0; j < cn; j++) {
        const void *src = kv_row(cache, table, a->block_size, p0 + j, a->slot_bytes, kvh, a->head_bytes);
        rows[j] = (const float *)src;
        if (a->kv_dtype != LLMI_KV_F32) {
            vec_kv_to_f32(src, a->kv_dtype, scale, buf + (size_t)j * a->head_dim, a->head_dim);
            rows[j] = buf + (size_t)j * a->head_dim;
        }
    }
}

#if defined(__AVX512F__)
/* For four rows that share a full chunk, over 64 dims: a[i] = a[i] * corr[i] +
 * sum_j p[i][j] v_j.  Each V vector is loaded once for the four rows (the one-row loop
 * loads it once per row: at long contexts these loads were its bound); every row's own
 * operations, in their order, are the one-row loop's, so results are bit-identical. */
static inline void attn_pv_4x64(float *const a[4], const float *const p[4], const float corr[4],
                                const float *const *vrows, int c0) {
    __m512 v[4][4];
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 4; c++) v[i][c] = _mm512_mul_ps(_mm512_loadu_ps(a[i] + c0 + 16 * c), _mm512_set1_ps(corr[i]));
    for (int j = 0; j < ATTN_CHUNK; j++) {
        __m512 x[4];
        for (int c = 0; c < 4; c++) x[c] = _mm512_loadu_ps(vrows[j] + c0 + 16 * c);
        for (int i = 0; i < 4; i++) {
            __m512 pj = _mm512_set1_ps(p[i][j]);
            for (int c = 0; c < 4; c++) v[i][c] = _mm512_fmadd_ps(pj, x[c], v[i][c]);
        }
    }
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(a[i] + c0 + 16 * c, v[i][c]);
}
#endif

/* Heads per sub-group that shares a tile, and tokens per tile for that many heads. */
static int attn_gmax(int head_dim) {
    return ATTN_ACC_FLOATS / head_dim < ATTN_CHUNK ? ATTN_ACC_FLOATS / head_dim : ATTN_CHUNK;
}
static int attn_tile_tokens(int ng, int head_dim) {
    int nt = ATTN_QTILE;
    if (nt * ng > ATTN_ROWS) nt = ATTN_ROWS / ng;
    if (nt * ng * head_dim > ATTN_ACC_FLOATS) nt = ATTN_ACC_FLOATS / (ng * head_dim);
    return nt > 0 ? nt : 1;
}

/* Tokens [t0, t0 + nt) (one sequence) x heads [h0, h0 + ng) of kv head kvh; nt * ng rows
 * fit ATTN_ROWS and ATTN_ACC_FLOATS (attn_tile_tokens). */
static void attn_tile(const attn_args *a, int t0, int nt, int kvh, int h0, int ng) {
    const int hd = a->head_dim, nr = nt * ng;
    float acc[ATTN_ACC_FLOATS];                   /* (rows, head_dim) running outputs */
    float kbuf[ATTN_CHUNK * ATTN_MAX_HD];         /* (chunk, head_dim) converted K rows */
    float vbuf[ATTN_CHUNK * ATTN_MAX_HD];         /* (chunk, head_dim) converted V rows */
    const float *krows[ATTN_CHUNK], *vrows[ATTN_CHUNK];
    float s[ATTN_ROWS][ATTN_CHUNK];               /* (row, position) scores of the chunk */
    float pr[ATTN_ROWS][ATTN_CHUNK];              /* (row, position) probabilities */
    float m[ATTN_ROWS], l[ATTN_ROWS], corr[ATTN_ROWS];
    int len[ATTN_QTILE], first[ATTN_QTILE];       /* token i attends to positions [first[i], len[i]) */
    const llmi_batch *b = a->b;
    const int32_t *table = b->block_tables + (size_t)b->seq_of_token[t0] * b->max_blocks_per_seq;
    int maxlen = 0, minfirst = INT32_MAX;
    for (int i = 0; i < nt; i++) {
        len[i] = b->positions[t0 + i] + 1;
        first[i] = a->window > 0 && len[i] > a->window ? len[i] - a->window : 0;
        maxlen = len[i] > maxlen ? len[i] : maxlen;
        minfirst = first[i] < minfirst ? first[i] : minfirst;
    }
    for (int r = 0; r < nr; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
    for (int i = 0; i < nr * hd; i++) acc[i] = 0.0f;
    const float ks = a->k_scale ? a->k_scale[kvh] : 1.0f, vs = a->v_scale ? a->v_scale[kvh] : 1.0f;
    /* Chunks stay aligned to position 0 and a row skips the chunks wholly before its
     * window, so its chunks, and its result, are the same whatever tile it is in; inside
     * the chunk where its window starts, the positions before the start are masked. */
    for (int p0 = minfirst / ATTN_CHUNK * ATTN_CHUNK; p0 < maxlen; p0 += ATTN_CHUNK) {
        int cmax = maxlen - p0 < ATTN_CHUNK ? maxlen - p0 : ATTN_CHUNK;
        chunk_rows(a, a->k_cache, table, p0, cmax, kvh, ks, kbuf, krows);
#define ROW_SKIPS(i) (len[i] <= p0 || first[i] >= p0 + ATTN_CHUNK)
        /* row r = (token i, head g): scores of the chunk */
        for (int r = 0; r < nr; r++) {
            int i = r / ng, g = r % ng, cn = len[i] - p0 < ATTN_CHUNK ? len[i] - p0 : ATTN_CHUNK;
            if (ROW_SKIPS(i)) continue;
            const float *qg = a->q + ((size_t)(t0 + i) * a->n_heads + h0 + g) * hd;
#if defined(__AVX512F__)
            if (hd % 16 == 0) {
                __m512 d[ATTN_CHUNK];
                for (int j = 0; j < ATTN_CHUNK; j++) d[j] = _mm512_setzero_ps();
                /* a full chunk with a constant trip count keeps d[] in registers */
                if (cn == ATTN_CHUNK)
                    for (int c = 0; c < hd; c += 16) {
                        __m512 qv = _mm512_loadu_ps(qg + c);
                        for (int j = 0; j < ATTN_CHUNK; j++) d[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(krows[j] + c), d[j]);
                    }
                else
                    for (int c = 0; c < hd; c += 16) {
                        __m512 qv = _mm512_loadu_ps(qg + c);
                        for (int j = 0; j < cn; j++) d[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(krows[j] + c), d[j]);
                    }
                _mm512_storeu_ps(s[r], _mm512_mul_ps(attn_hsum16(d), _mm512_set1_ps(a->scale)));
            } else
#elif defined(ATTN_AVX2)
            if (hd % 8 == 0) {
                /* 8 positions at a time (8 accumulators and q: 9 of the 16 registers) */
                for (int j0 = 0; j0 < cn; j0 += 8) {
                    const int jn = cn - j0 < 8 ? cn - j0 : 8;
                    __m256 d[8];
                    for (int j = 0; j < 8; j++) d[j] = _mm256_setzero_ps();
                    if (jn == 8)   /* (a constant trip count keeps d[] in registers) */
                        for (int c = 0; c < hd; c += 8) {
                            __m256 qv = _mm256_loadu_ps(qg + c);
                            for (int j = 0; j < 8; j++) d[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krows[j0 + j] + c), d[j]);
                        }
                    else
                        for (int c = 0; c < hd; c += 8) {
                            __m256 qv = _mm256_loadu_ps(qg + c);
                            for (int j = 0; j < jn; j++) d[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krows[j0 + j] + c), d[j]);
                        }
                    _mm256_storeu_ps(s[r] + j0, _mm256_mul_ps(attn_hsum8(d), _mm256_set1_ps(a->scale)));
                }
            } else
#endif
            for (int j = 0; j < cn; j++) s[r][j] = vec_dot_f32(qg, krows[j], hd) * a->scale;
            if (a->softcap > 0) vec_softcap(s[r], cn, a->softcap);
            for (int j = 0; j < first[i] - p0; j++) s[r][j] = -INFINITY;   /* before the window */
        }
        /* the softmax update in its own pass: each row's is a chain of dependent
         * reductions, and rows next to each other in one loop overlap those latencies
         * (15% less attention time at 512 tokens than scoring and updating row by row) */
        for (int r = 0; r < nr; r++) {
            int i = r / ng, cn = len[i] - p0 < ATTN_CHUNK ? len[i] - p0 : ATTN_CHUNK;
            if (ROW_SKIPS(i)) continue;
#if defined(__AVX512F__)
            /* one reduction instead of a chain of cn dependent scalar maxes, the latency
             * that bounded attention at long contexts; the same maximum (a signed zero
             * aside, which exp(s - max) cannot tell apart) */
            float cx = _mm512_mask_reduce_max_ps((__mmask16)((1u << cn) - 1),
                                                 _mm512_maskz_loadu_ps((__mmask16)((1u << cn) - 1), s[r]));
            float cm = cx > m[r] ? cx : m[r];
#elif defined(ATTN_AVX2)
            __m256 lo, hi;
            attn_load16(s[r], cn, -INFINITY, &lo, &hi);
            __m256 mx8 = _mm256_max_ps(lo, hi);
            __m128 mx4 = _mm_max_ps(_mm256_extractf128_ps(mx8, 1), _mm256_castps256_ps128(mx8));
            mx4 = _mm_max_ps(mx4, _mm_movehl_ps(mx4, mx4));
            const float cx = _mm_cvtss_f32(_mm_max_ss(mx4, _mm_movehdup_ps(mx4)));
            float cm = cx > m[r] ? cx : m[r];
#else
            float cm = m[r];
            for (int j = 0; j < cn; j++) cm = s[r][j] > cm ? s[r][j] : cm;
#endif
            /* 0 on the first chunk (m = -inf); expf(0) is exactly 1, so an unchanged max
             * (the usual case deep into a sequence) skips the call */
            corr[r] = cm == m[r] ? 1.0f : expf(m[r] - cm);
            l[r] = l[r] * corr[r] + attn_probs(s[r], cn, cm, pr[r]);
            /* the vector exps clamp at e^-87, not 0: masked positions get exactly 0 (their
             * e^-87 in l is far below l's last bit, since l >= 1) */
            for (int j = 0; j < first[i] - p0; j++) pr[r][j] = 0.0f;
            m[r] = cm;
        }
        chunk_rows(a, a->v_cache, table, p0, cmax, kvh, vs, vbuf, vrows);
        /* acc = acc * corr + sum_j p_j v_j, 16 dims at a time kept in a register */
        for (int r = 0; r < nr; r++) {
            int cn = len[r / ng] - p0 < ATTN_CHUNK ? len[r / ng] - p0 : ATTN_CHUNK;
            if (ROW_SKIPS(r / ng)) continue;
            float *ag = acc + (size_t)r * hd;
#if defined(__AVX512F__)
            int full4 = hd % 64 == 0 && r + 4 <= nr;
            for (int k = 0; k < 4 && full4; k++) full4 = len[(r + k) / ng] - p0 >= ATTN_CHUNK && !ROW_SKIPS((r + k) / ng);
            if (full4) {   /* rows r..r+3 all take a full chunk */
                float *a4[4] = {ag, ag + hd, ag + 2 * hd, ag + 3 * hd};
                const float *p4[4] = {pr[r], pr[r + 1], pr[r + 2], pr[r + 3]};
                for (int c0 = 0; c0 < hd; c0 += 64) attn_pv_4x64(a4, p4, corr + r, vrows, c0);
                r += 3;
                continue;
            }
            for (int c = 0; c < hd; c += 16) {
                __mmask16 mk = hd - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (hd - c)) - 1);
                __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, ag + c), _mm512_set1_ps(corr[r]));
                if (cn == ATTN_CHUNK)
                    for (int j = 0; j < ATTN_CHUNK; j++)
                        v = _mm512_fmadd_ps(_mm512_set1_ps(pr[r][j]), _mm512_maskz_loadu_ps(mk, vrows[j] + c), v);
                else
                    for (int j = 0; j < cn; j++)
                        v = _mm512_fmadd_ps(_mm512_set1_ps(pr[r][j]), _mm512_maskz_loadu_ps(mk, vrows[j] + c), v);
                _mm512_mask_storeu_ps(ag + c, mk, v);
            }
#else
#if defined(ATTN_AVX2)
            if (hd % 8 == 0) {
                for (int c = 0; c < hd; c += 8) {
                    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(ag + c), _mm256_set1_ps(corr[r]));
                    for (int j = 0; j < cn; j++) v = _mm256_fmadd_ps(_mm256_set1_ps(pr[r][j]), _mm256_loadu_ps(vrows[j] + c), v);
                    _mm256_storeu_ps(ag + c, v);
                }
                continue;
            }
#endif
            for (int c = 0; c < hd; c++) {
                float v = ag[c] * corr[r];
                for (int j = 0; j < cn; j++) v += pr[r][j] * vrows[j][c];
                ag[c] = v;
            }
#endif
        }
#undef ROW_SKIPS
    }
    for (int r = 0; r < nr; r++) {
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        float *oh = a->out + ((size_t)(t0 + r / ng) * a->n_heads + h0 + r % ng) * hd;
        for (int c = 0; c < hd; c++) oh[c] = acc[(size_t)r * hd + c] * inv;
    }
}

static attn_args attn_make(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                           const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                           int n_kv_heads, int head_dim, int block_size, cpu_attn_scores sc, float *out) {
    return (attn_args){q, k_cache, v_cache, kv_dtype, k_scale, v_scale, b, n_heads, n_kv_heads, head_dim, block_size,
                       sc.scale, sc.softcap, sc.window, kv_dtype_row_bytes(kv_dtype, (size_t)n_kv_heads * head_dim),
                       kv_dtype_row_bytes(kv_dtype, (size_t)head_dim), out};
}

void cpu_paged_attention(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                         const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                         int n_kv_heads, int head_dim, int block_size, cpu_attn_scores sc, float *out) {
    const attn_args a = attn_make(q, k_cache, v_cache, kv_dtype, k_scale, v_scale, b, n_heads, n_kv_heads, head_dim,
                                  block_size, sc, out);
    const int window = sc.window;
    const int group = n_heads / n_kv_heads, gmax = attn_gmax(head_dim);
    const int nsub = (group + gmax - 1) / gmax, ng0 = group < gmax ? group : gmax;
    const int nt = attn_tile_tokens(ng0, head_dim), n = b->n_tokens, ntiles = (n + nt - 1) / nt;
    /* Work in q.k products; a single decode token over a short context is cheaper than
     * waking the team (and its kv-head tasks split unevenly over 2 threads anyway). */
    double work = 0;
    for (int t = 0; t < n; t++)
        work += (double)(window > 0 && b->positions[t] >= window ? window : b->positions[t] + 1) * n_heads * head_dim;
#pragma omp parallel for collapse(3) schedule(dynamic, 1) if (work > (double)(1 << 20))
    for (int ti = 0; ti < ntiles; ti++)
        for (int kvh = 0; kvh < n_kv_heads; kvh++)
            for (int sg = 0; sg < nsub; sg++) {
                int h0 = kvh * group + sg * gmax, ng = group - sg * gmax < gmax ? group - sg * gmax : gmax;
                int t1 = (ti + 1) * nt < n ? (ti + 1) * nt : n;
                /* a tile of token indices may span sequences: one run per sequence */
                for (int t = ti * nt; t < t1;) {
                    int e = t + 1;
                    while (e < t1 && b->seq_of_token[e] == b->seq_of_token[t]) e++;
                    attn_tile(&a, t, e - t, kvh, h0, ng);
                    t = e;
                }
            }
}

void cpu_paged_attention_part(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                              const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                              int n_kv_heads, int head_dim, int block_size, cpu_attn_scores sc, int u0, int u1,
                              float *out) {
    const attn_args a = attn_make(q, k_cache, v_cache, kv_dtype, k_scale, v_scale, b, n_heads, n_kv_heads, head_dim,
                                  block_size, sc, out);
    const int group = n_heads / n_kv_heads, gmax = attn_gmax(head_dim);
    for (int u = u0; u < u1;) {
        int t = u / n_heads, h0 = u % n_heads, kvh = h0 / group;
        int ng = 1;   /* the run of heads of this token that share kv head kvh, up to gmax */
        while (u + ng < u1 && h0 + ng < (kvh + 1) * group && ng < gmax) ng++;
        attn_tile(&a, t, 1, kvh, h0, ng);
        u += ng;
    }
}
