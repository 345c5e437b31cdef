/* cpu/rope.c — owns rotate-half RoPE (Hugging Face convention: pairs x[i], x[i+hd/2])
 * and the write of K/V into the paged caches.  The inverse frequencies come from
 * backend_rope_inv_freq (backend.h), shared with the CUDA backend. */
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

void cpu_rope_kv_write(float *q, float *k, const float *v, const int32_t *positions, const int32_t *slot_mapping,
                       int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq,
                       void *k_cache, void *v_cache, llmi_kv_dtype kv_dtype, const float *k_scale,
                       const float *v_scale) {
    int half = head_dim / 2;
    size_t kv_row = (size_t)n_kv_heads * head_dim;             /* values of one slot */
    size_t slot_bytes = kv_dtype_row_bytes(kv_dtype, kv_row);
    size_t head_bytes = kv_dtype_row_bytes(kv_dtype, (size_t)head_dim);
#pragma omp parallel for schedule(static) if (n > 4)
    for (int t = 0; t < n; t++) {
        float cs[512], sn[512];   /* (half); head_dim <= 1024 is checked by the backend */
        float p = (float)positions[t];
        for (int i = 0; i < half; i++) {
            /* fp32 angle as transformers computes it (inv_freq @ positions in fp32) */
            float ang = p * inv_freq[i];
            cs[i] = cosf(ang);
            sn[i] = sinf(ang);
        }
        for (int h = 0; h < n_heads; h++) rotate(q + ((size_t)t * n_heads + h) * head_dim, cs, sn, half);
        float *kt = k + (size_t)t * kv_row;
        for (int h = 0; h < n_kv_heads; h++) rotate(kt + (size_t)h * head_dim, cs, sn, half);
        size_t slot = (size_t)slot_mapping[t];
        char *kd = (char *)k_cache + slot * slot_bytes, *vd = (char *)v_cache + slot * slot_bytes;
        for (int h = 0; h < n_kv_heads; h++) {
            vec_f32_to_kv(kt + (size_t)h * head_dim, kv_dtype, k_scale ? k_scale[h] : 1.0f, kd + h * head_bytes,
                          head_dim);
            vec_f32_to_kv(v + (size_t)t * kv_row + (size_t)h * head_dim, kv_dtype, v_scale ? v_scale[h] : 1.0f,
                          vd + h * head_bytes, head_dim);
        }
    }
}
