/* cpu/attention.c — owns causal paged attention over the KV caches with an online
 * (streaming) softmax in fp32.  Each (token, head) walks its sequence's block table
 * position by position in ascending order, so a token's result depends only on its
 * own q and the cache, never on what else is in the batch. */
#include <math.h>
#include "cpu/ops.h"
#include "cpu/vec.h"

#define ATTN_CHUNK 32   /* positions scored before one softmax update */
#define ATTN_MAX_HD 1024

void cpu_paged_attention(const float *q, const void *k_cache, const void *v_cache, llmi_kv_dtype kv_dtype,
                         const llmi_batch *b, int n_heads, int n_kv_heads, int head_dim, int block_size,
                         float scale, float *out) {
    int group = n_heads / n_kv_heads;
    size_t kv_row = (size_t)n_kv_heads * head_dim;
    size_t esz = vec_kv_elem_bytes(kv_dtype);
    int n = b->n_tokens;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int t = 0; t < n; t++) {
        for (int h = 0; h < n_heads; h++) {
            float acc[ATTN_MAX_HD];                 /* (head_dim) running sum of p * v */
            float kbuf[ATTN_MAX_HD], vbuf[ATTN_MAX_HD];
            float s[ATTN_CHUNK];                    /* scores of the current chunk */
            const float *qh = q + ((size_t)t * n_heads + h) * head_dim;
            float *oh = out + ((size_t)t * n_heads + h) * head_dim;
            int kvh = h / group;
            int seq = b->seq_of_token[t];
            const int32_t *table = b->block_tables + (size_t)seq * b->max_blocks_per_seq;
            int len = b->positions[t] + 1;
            float m = -INFINITY, l = 0.0f;
            for (int i = 0; i < head_dim; i++) acc[i] = 0.0f;
            for (int p0 = 0; p0 < len; p0 += ATTN_CHUNK) {
                int cn = len - p0 < ATTN_CHUNK ? len - p0 : ATTN_CHUNK;
                float cm = m;
                for (int j = 0; j < cn; j++) {
                    int p = p0 + j;
                    size_t slot = (size_t)table[p / block_size] * block_size + (size_t)(p % block_size);
                    const char *kp = (const char *)k_cache + (slot * kv_row + (size_t)kvh * head_dim) * esz;
                    const float *kf = (const float *)kp;
                    if (kv_dtype != LLMI_KV_F32) {
                        vec_kv_to_f32(kp, kv_dtype, kbuf, head_dim);
                        kf = kbuf;
                    }
                    s[j] = vec_dot_f32(qh, kf, head_dim) * scale;
                    if (s[j] > cm) cm = s[j];
                }
                float corr = expf(m - cm);   /* 0 on the first chunk (m = -inf) */
                l *= corr;
                for (int j = 0; j < cn; j++) {
                    int p = p0 + j;
                    size_t slot = (size_t)table[p / block_size] * block_size + (size_t)(p % block_size);
                    const char *vp = (const char *)v_cache + (slot * kv_row + (size_t)kvh * head_dim) * esz;
                    const float *vf = (const float *)vp;
                    if (kv_dtype != LLMI_KV_F32) {
                        vec_kv_to_f32(vp, kv_dtype, vbuf, head_dim);
                        vf = vbuf;
                    }
                    float pj = expf(s[j] - cm);
                    l += pj;
                    vec_scale_axpy(acc, j == 0 ? corr : 1.0f, pj, vf, head_dim);
                }
                m = cm;
            }
            float inv = l > 0 ? 1.0f / l : 0.0f;
            for (int i = 0; i < head_dim; i++) oh[i] = acc[i] * inv;
        }
    }
}
