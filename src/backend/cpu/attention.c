/* cpu/attention.c — owns causal paged attention over the KV caches with an online
 * (streaming) softmax in fp32.  One task is (token, kv head): the query heads that share
 * that kv head (GQA) are processed together so each cached K/V row is loaded and
 * converted once.  Positions are walked in ascending order in chunks of ATTN_CHUNK
 * aligned to position 0, so a token's result depends only on its own q and the cache,
 * never on what else is in the batch or which heads share its task. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

#define ATTN_CHUNK 16         /* positions scored before one softmax update */
#define ATTN_MAX_HD 512
#define ATTN_ACC_FLOATS 8192  /* stack floats for the running outputs of a head group */

#if defined(__AVX512F__)
/* e^x for x <= 0 (scores minus their running max), ~1 ulp: Cephes expf polynomial on
 * x - n ln2, scaled by 2^n. */
static inline __m512 attn_exp(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
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

/* p[j] = exp(s[j] - mx) for j < cn; returns their sum (fixed order). */
static float attn_probs(const float *s, int cn, float mx, float *p) {
#if defined(__AVX512F__)
    __mmask16 m = (__mmask16)((1u << cn) - 1);
    __m512 e = attn_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s), _mm512_set1_ps(mx)));
    e = _mm512_maskz_mov_ps(m, e);
    _mm512_storeu_ps(p, e);
    return _mm512_reduce_add_ps(e);
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

void cpu_paged_attention(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                         const float *k_scale, const float *v_scale, const llmi_batch *b, int n_heads,
                         int n_kv_heads, int head_dim, int block_size, float scale, float *out) {
    int group = n_heads / n_kv_heads;
    int gmax = ATTN_ACC_FLOATS / head_dim < ATTN_CHUNK ? ATTN_ACC_FLOATS / head_dim : ATTN_CHUNK;
    size_t slot_bytes = kv_dtype_row_bytes(kv_dtype, (size_t)n_kv_heads * head_dim);
    size_t head_bytes = kv_dtype_row_bytes(kv_dtype, (size_t)head_dim);
    int n = b->n_tokens;
    /* Work in q.k products; a single decode token over a short context is cheaper than
     * waking the team (and its kv-head tasks split unevenly over 2 threads anyway). */
    double work = 0;
    for (int t = 0; t < n; t++) work += (double)(b->positions[t] + 1) * n_heads * head_dim;
#pragma omp parallel for collapse(2) schedule(dynamic, 1) if (work > (double)(1 << 20))
    for (int t = 0; t < n; t++) {
        for (int kvh = 0; kvh < n_kv_heads; kvh++) {
            float acc[ATTN_ACC_FLOATS];                   /* (heads of the sub-group, head_dim) */
            float kbuf[ATTN_CHUNK * ATTN_MAX_HD];         /* (chunk, head_dim) converted K rows */
            float vbuf[ATTN_CHUNK * ATTN_MAX_HD];         /* (chunk, head_dim) converted V rows */
            const float *vrows[ATTN_CHUNK];
            float s[ATTN_CHUNK][ATTN_CHUNK];              /* (head, position) scores of the chunk */
            float pr[ATTN_CHUNK][ATTN_CHUNK];             /* (head, position) probabilities */
            float m[ATTN_CHUNK], l[ATTN_CHUNK], corr[ATTN_CHUNK];
            const int32_t *table = b->block_tables + (size_t)b->seq_of_token[t] * b->max_blocks_per_seq;
            int len = b->positions[t] + 1;
            for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += gmax) {
                int ng = (kvh + 1) * group - h0 < gmax ? (kvh + 1) * group - h0 : gmax;
                const float *qh = q + ((size_t)t * n_heads + h0) * head_dim;   /* (ng, head_dim) */
                for (int g = 0; g < ng; g++) { m[g] = -INFINITY; l[g] = 0.0f; }
                for (int i = 0; i < ng * head_dim; i++) acc[i] = 0.0f;
                for (int p0 = 0; p0 < len; p0 += ATTN_CHUNK) {
                    int cn = len - p0 < ATTN_CHUNK ? len - p0 : ATTN_CHUNK;
                    const float *krows[ATTN_CHUNK];
                    for (int j = 0; j < cn; j++) {
                        const void *kp = kv_row(k_cache, table, block_size, p0 + j, slot_bytes, kvh, head_bytes);
                        krows[j] = (const float *)kp;
                        if (kv_dtype != LLMI_KV_F32) {
                            vec_kv_to_f32(kp, kv_dtype, k_scale ? k_scale[kvh] : 1.0f, kbuf + (size_t)j * head_dim,
                                          head_dim);
                            krows[j] = kbuf + (size_t)j * head_dim;
                        }
                    }
#if defined(__AVX512F__)
                    if (head_dim % 16 == 0) {
                        for (int g = 0; g < ng; g++) {
                            const float *qg = qh + (size_t)g * head_dim;
                            __m512 d[ATTN_CHUNK];
                            for (int j = 0; j < ATTN_CHUNK; j++) d[j] = _mm512_setzero_ps();
                            for (int i = 0; i < head_dim; i += 16) {
                                __m512 qv = _mm512_loadu_ps(qg + i);
                                for (int j = 0; j < cn; j++) d[j] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(krows[j] + i), d[j]);
                            }
                            _mm512_storeu_ps(s[g], _mm512_mul_ps(attn_hsum16(d), _mm512_set1_ps(scale)));
                        }
                    } else
#endif
                    for (int j = 0; j < cn; j++)
                        for (int g = 0; g < ng; g++) s[g][j] = vec_dot_f32(qh + (size_t)g * head_dim, krows[j], head_dim) * scale;
                    for (int g = 0; g < ng; g++) {
                        float cm = m[g];
                        for (int j = 0; j < cn; j++) cm = s[g][j] > cm ? s[g][j] : cm;
                        corr[g] = expf(m[g] - cm);   /* 0 on the first chunk (m = -inf) */
                        l[g] = l[g] * corr[g] + attn_probs(s[g], cn, cm, pr[g]);
                        m[g] = cm;
                    }
                    for (int j = 0; j < cn; j++) {
                        const void *vp = kv_row(v_cache, table, block_size, p0 + j, slot_bytes, kvh, head_bytes);
                        vrows[j] = (const float *)vp;
                        if (kv_dtype != LLMI_KV_F32) {
                            vec_kv_to_f32(vp, kv_dtype, v_scale ? v_scale[kvh] : 1.0f, vbuf + (size_t)j * head_dim,
                                          head_dim);
                            vrows[j] = vbuf + (size_t)j * head_dim;
                        }
                    }
                    /* acc = acc * corr + sum_j p_j v_j, 16 dims at a time kept in a register */
                    for (int g = 0; g < ng; g++) {
                        float *ag = acc + (size_t)g * head_dim;
#if defined(__AVX512F__)
                        for (int i = 0; i < head_dim; i += 16) {
                            __mmask16 mk = head_dim - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (head_dim - i)) - 1);
                            __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, ag + i), _mm512_set1_ps(corr[g]));
                            for (int j = 0; j < cn; j++)
                                a = _mm512_fmadd_ps(_mm512_set1_ps(pr[g][j]), _mm512_maskz_loadu_ps(mk, vrows[j] + i), a);
                            _mm512_mask_storeu_ps(ag + i, mk, a);
                        }
#else
                        for (int i = 0; i < head_dim; i++) {
                            float a = ag[i] * corr[g];
                            for (int j = 0; j < cn; j++) a += pr[g][j] * vrows[j][i];
                            ag[i] = a;
                        }
#endif
                    }
                }
                for (int g = 0; g < ng; g++) {
                    float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
                    float *oh = out + ((size_t)t * n_heads + h0 + g) * head_dim;
                    for (int i = 0; i < head_dim; i++) oh[i] = acc[(size_t)g * head_dim + i] * inv;
                }
            }
        }
    }
}
