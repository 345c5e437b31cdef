/* cpu/rope.c — owns rotate-half RoPE (Hugging Face convention: pairs x[i], x[i+rd/2] of
 * a head's first rope_dim values rd; the rest pass through, Phi-4-mini's partial RoPE)
 * and the write of K/V into the paged caches.  The inverse frequencies come from
 * backend_rope_inv_freq (backend.h), shared with the CUDA backend; a forward computes
 * each token's cos/sin once (cpu_rope_table) and every layer reuses them. */
#include <math.h>
#include "backend/cpu/ops.h"
#include "backend/cpu/vec.h"

static void rotate(float *x, const float *cs, const float *sn, int half) {
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

static void angles(int32_t pos, const float *inv_freq, float mscale, int half, float *cs, float *sn) {
    float p = (float)pos;
    for (int i = 0; i < half; i++) {
        /* fp32 angle as transformers computes it (inv_freq @ positions in fp32), cos and sin
         * then times the attention factor as its rotary embeddings' forward */
        float ang = p * inv_freq[i];
        cs[i] = cosf(ang) * mscale;
        sn[i] = sinf(ang) * mscale;
    }
}

void cpu_rope_table(const int32_t *positions, int n, int head_dim, int rope_dim, const float *inv_freq, float mscale,
                    float *cs, float *sn) {
    int half = head_dim / 2;
#pragma omp parallel for schedule(static) if (n > 16)
    for (int t = 0; t < n; t++)
        angles(positions[t], inv_freq, mscale, rope_dim / 2, cs + (size_t)t * half, sn + (size_t)t * half);
}

void cpu_rope_heads(float *x, const float *cs, const float *sn, int h0, int h1, int head_dim, int rope_dim) {
    for (int h = h0; h < h1; h++) rotate(x + (size_t)h * head_dim, cs, sn, rope_dim / 2);
}

void cpu_rope_kv_write_heads(float *k, const float *v, const float *cs, const float *sn, int32_t slot, int h0, int h1,
                             int n_kv_heads, int head_dim, int rope_dim, void *k_cache, void *v_cache,
                             llmi_kv_dtype kv_dtype, const float *k_scale, const float *v_scale) {
    size_t slot_bytes = kv_dtype_row_bytes(kv_dtype, (size_t)n_kv_heads * head_dim);
    size_t head_bytes = kv_dtype_row_bytes(kv_dtype, (size_t)head_dim);
    char *kd = (char *)k_cache + (size_t)slot * slot_bytes, *vd = (char *)v_cache + (size_t)slot * slot_bytes;
    for (int h = h0; h < h1; h++) {
        float *kh = k + (size_t)h * head_dim;
        rotate(kh, cs, sn, rope_dim / 2);
        vec_f32_to_kv(kh, kv_dtype, k_scale ? k_scale[h] : 1.0f, kd + h * head_bytes, head_dim);
        vec_f32_to_kv(v + (size_t)h * head_dim, kv_dtype, v_scale ? v_scale[h] : 1.0f, vd + h * head_bytes, head_dim);
    }
}

/* Token t of q, k, v with its cos/sin rows. */
static void rope_kv_token(float *q, float *k, const float *v, const float *cs, const float *sn, int32_t slot, int t,
                          int n_heads, int n_kv_heads, int head_dim, int rope_dim, void *k_cache, void *v_cache,
                          llmi_kv_dtype kv_dtype, const float *k_scale, const float *v_scale) {
    size_t kv_row = (size_t)n_kv_heads * head_dim;
    cpu_rope_heads(q + (size_t)t * n_heads * head_dim, cs, sn, 0, n_heads, head_dim, rope_dim);
    cpu_rope_kv_write_heads(k + (size_t)t * kv_row, v + (size_t)t * kv_row, cs, sn, slot, 0, n_kv_heads, n_kv_heads,
                            head_dim, rope_dim, k_cache, v_cache, kv_dtype, k_scale, v_scale);
}

void cpu_rope_kv_write(float *q, float *k, const float *v, const int32_t *positions, const int32_t *slot_mapping,
                       int n, int n_heads, int n_kv_heads, int head_dim, int rope_dim, const float *inv_freq,
                       float mscale, void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                       const float *v_scale) {
#pragma omp parallel for schedule(static) if (n > 4)
    for (int t = 0; t < n; t++) {
        float cs[512], sn[512];   /* (half); head_dim <= 1024 is checked by the backend */
        angles(positions[t], inv_freq, mscale, rope_dim / 2, cs, sn);
        rope_kv_token(q, k, v, cs, sn, slot_mapping[t], t, n_heads, n_kv_heads, head_dim, rope_dim, k_cache, v_cache,
                      kv_dtype, k_scale, v_scale);
    }
}

void cpu_rope_kv_write_table(float *q, float *k, const float *v, const float *cs, const float *sn,
                             const int32_t *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                             int rope_dim, void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                             const float *v_scale) {
    size_t half = (size_t)head_dim / 2;
#pragma omp parallel for schedule(static) if (n > 4)
    for (int t = 0; t < n; t++)
        rope_kv_token(q, k, v, cs + t * half, sn + t * half, slot_mapping[t], t, n_heads, n_kv_heads, head_dim, rope_dim,
                      k_cache, v_cache, kv_dtype, k_scale, v_scale);
}
