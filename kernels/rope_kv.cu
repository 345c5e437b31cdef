/* rope_kv.cu — owns rotate-half RoPE fused with the paged K/V cache write (twin:
 * cpu_rope_kv_write).  The angle is pos * inv_freq[i] in fp32 and cos/sin are the
 * accurate (non-intrinsic) functions, as transformers and the CPU twin compute them.  q8
 * and fp8 caches get the CPU twin's bytes for the same rotated values. */
#include "common.cuh"

/* grid (n), block 128, 2 * (head_dim / 2) floats of dynamic shared memory: one token per
 * block; the token's cos/sin per pair first (the angle does not depend on the head, and
 * the accurate functions cost tens of instructions: once a pair, not once per head and
 * pair), then threads stride over (head, pair) for the rotation and over the slot's
 * n_kv_heads*head_dim elements for the cache write. */
__global__ void llmi_rope_kv_kernel(float *q, int q_stride, float *k, int k_stride, const float *v, int v_stride,
                                    const int32_t *positions, const int32_t *slot_mapping, int n_heads,
                                    int n_kv_heads, int head_dim, const float *inv_freq, void *k_cache,
                                    void *v_cache, llmi_kv_dtype kv_dt, const float *k_scale, const float *v_scale) {
    extern __shared__ float trig[];   /* (2, half): cos, then sin, of pair i's angle */
    int t = blockIdx.x;
    int half = head_dim / 2;
    float p = (float)positions[t];
    float *qt = q + (int64_t)t * q_stride;
    float *kt = k + (int64_t)t * k_stride;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = p * inv_freq[i];
        trig[i] = cosf(ang);
        trig[half + i] = sinf(ang);
    }
    __syncthreads();
    int pairs = (n_heads + n_kv_heads) * half;
    for (int idx = threadIdx.x; idx < pairs; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float cs = trig[i], sn = trig[half + i];
        float *x = h < n_heads ? qt + h * head_dim : kt + (h - n_heads) * head_dim;
        float a = x[i], b = x[i + half];
        x[i] = a * cs - b * sn;
        x[i + half] = b * cs + a * sn;
    }
    int32_t slot = slot_mapping[t];
    if (slot < 0) return;
    __syncthreads();   /* the rotated k must be complete before it is copied */
    int row = n_kv_heads * head_dim;
    int64_t base = (int64_t)slot * row;
    const float *vt = v + (int64_t)t * v_stride;
    if (kv_dt == LLMI_KV_Q8) {   /* one thread per 32-value block (row is whole blocks) */
        for (int j = threadIdx.x; j < row / KV_Q8_BLOCK; j += blockDim.x) {
            llmi_kv_store_q8_block(k_cache, base / KV_Q8_BLOCK + j, kt + j * KV_Q8_BLOCK);
            llmi_kv_store_q8_block(v_cache, base / KV_Q8_BLOCK + j, vt + j * KV_Q8_BLOCK);
        }
        return;
    }
    for (int j = threadIdx.x; j < row; j += blockDim.x) {
        float ki = kt[j], vi = vt[j];
        if (kv_dt == LLMI_KV_FP8) {   /* x * (1/scale), as the CPU's vec_f32_to_kv */
            int h = j / head_dim;
            if (k_scale) ki *= 1.0f / k_scale[h];
            if (v_scale) vi *= 1.0f / v_scale[h];
        }
        llmi_kv_store(k_cache, kv_dt, base + j, ki);
        llmi_kv_store(v_cache, kv_dt, base + j, vi);
    }
}

extern "C" cudaError_t llmi_cuda_rope_kv(float *q, int q_stride, float *k, int k_stride, const float *v, int v_stride,
                                         const int32_t *positions, const int32_t *slot_mapping, int n, int n_heads,
                                         int n_kv_heads, int head_dim, const float *inv_freq, void *k_cache,
                                         void *v_cache, llmi_kv_dtype kv_dt, const float *k_scale,
                                         const float *v_scale, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (kv_dt == LLMI_KV_Q8 && head_dim % KV_Q8_BLOCK != 0) return cudaErrorInvalidValue;   /* blocks within a head, as the CPU */
    const size_t trig_bytes = (size_t)(head_dim / 2) * 2 * sizeof(float);
    llmi_rope_kv_kernel<<<n, 128, trig_bytes, s>>>(q, q_stride, k, k_stride, v, v_stride, positions, slot_mapping,
                                                   n_heads, n_kv_heads, head_dim, inv_freq, k_cache, v_cache, kv_dt,
                                                   k_scale, v_scale);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
