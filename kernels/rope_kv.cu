/* rope_kv.cu — owns rotate-half RoPE fused with the paged K/V cache write (twin:
 * cpu_rope_kv_write): pairs (i, i + rope_dim/2) of each head's first rope_dim values, the
 * rest passing through (Phi-4-mini's partial RoPE; rope_dim 0, SmolLM3's NoPE layers, rotates
 * none).  The angle is pos * inv_freq[i] in fp32 and cos/sin are the accurate
 * (non-intrinsic) functions, as transformers and the CPU twin compute them, then times
 * mscale (config_rope_mscale) as the CPU's table.  q8 and fp8
 * caches get the CPU twin's bytes for the same rotated values. */
#include "common.cuh"

/* grid (n), block ROPE_THREADS, 2 * (rope_dim / 2) floats of dynamic shared memory: one
 * token per block; the token's cos/sin per pair first (the angle does not depend on the
 * head, and the accurate functions cost tens of instructions: once a pair, not once per
 * head and pair), then threads stride over (head, pair) for the rotation and over the
 * slot's n_kv_heads*head_dim elements for the cache write, ROPE_BATCH of a thread's loads
 * issued before its first store (a loop storing after each load waits for memory once a
 * trip, as q and k may alias: at one token, 20 trips a thread for a llama-3-8b's 40 heads). */
#define ROPE_THREADS 256
#define ROPE_BATCH 4
__global__ void llmi_rope_kv_kernel(float *q, int q_stride, float *k, int k_stride, const float *v, int v_stride,
                                    const int32_t *positions, const int32_t *slot_mapping, int n_heads,
                                    int n_kv_heads, int head_dim, int rope_dim, const float *inv_freq, float mscale,
                                    void *k_cache, void *v_cache, llmi_kv_dtype kv_dt, const float *k_scale,
                                    const float *v_scale) {
    extern __shared__ float trig[];   /* (2, half): cos, then sin, of pair i's angle */
    int t = blockIdx.x;
    int half = rope_dim / 2;
    float p = (float)positions[t];
    float *qt = q + (int64_t)t * q_stride;
    float *kt = k + (int64_t)t * k_stride;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float ang = p * inv_freq[i];
        trig[i] = cosf(ang) * mscale;
        trig[half + i] = sinf(ang) * mscale;
    }
    __syncthreads();
    const int heads = n_heads + n_kv_heads, bd = blockDim.x;
    /* pair (head r, index c) of the heads' half-width grid */
    float a[ROPE_BATCH], b[ROPE_BATCH];
    float *xs[ROPE_BATCH];
    if (half > 0)   /* 0: a layer without RoPE (SmolLM3's NoPE), only the cache write */
        llmi_walk_batches<ROPE_BATCH>(
            threadIdx.x, bd, half, heads,
            [&](int u, int r, int c) {
                xs[u] = (r < n_heads ? qt + r * head_dim : kt + (r - n_heads) * head_dim) + c;
                if (r < heads) a[u] = xs[u][0], b[u] = xs[u][half];
            },
            [&](int u, int r, int c) {
                const float cs = trig[c], sn = trig[half + c];
                xs[u][0] = a[u] * cs - b[u] * sn;
                xs[u][half] = b[u] * cs + a[u] * sn;
            });
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
    for (int j0 = threadIdx.x; j0 < row; j0 += ROPE_BATCH * bd) {
        float ki[ROPE_BATCH], vi[ROPE_BATCH];
#pragma unroll
        for (int u = 0; u < ROPE_BATCH; u++) {
            const int j = j0 + u * bd;
            if (j < row) ki[u] = kt[j], vi[u] = vt[j];
        }
#pragma unroll
        for (int u = 0; u < ROPE_BATCH; u++) {
            const int j = j0 + u * bd;
            if (j < row) {
                if (kv_dt == LLMI_KV_FP8) {   /* x * (1/scale), as the CPU's vec_f32_to_kv */
                    const int h = j / head_dim;
                    if (k_scale) ki[u] *= 1.0f / k_scale[h];
                    if (v_scale) vi[u] *= 1.0f / v_scale[h];
                }
                llmi_kv_store(k_cache, kv_dt, base + j, ki[u]);
                llmi_kv_store(v_cache, kv_dt, base + j, vi[u]);
            }
        }
    }
}

extern "C" cudaError_t llmi_cuda_rope_kv(float *q, int q_stride, float *k, int k_stride, const float *v, int v_stride,
                                         const int32_t *positions, const int32_t *slot_mapping, int n, int n_heads,
                                         int n_kv_heads, int head_dim, int rope_dim, const float *inv_freq,
                                         float mscale, void *k_cache, void *v_cache, llmi_kv_dtype kv_dt,
                                         const float *k_scale, const float *v_scale, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (rope_dim < 0 || rope_dim > head_dim || rope_dim % 2) return cudaErrorInvalidValue;
    if (kv_dt == LLMI_KV_Q8 && head_dim % KV_Q8_BLOCK != 0) return cudaErrorInvalidValue;   /* blocks within a head, as the CPU */
    const size_t trig_bytes = (size_t)(rope_dim / 2) * 2 * sizeof(float);
    llmi_rope_kv_kernel<<<n, ROPE_THREADS, trig_bytes, s>>>(q, q_stride, k, k_stride, v, v_stride, positions,
                                                            slot_mapping, n_heads, n_kv_heads, head_dim, rope_dim,
                                                            inv_freq, mscale, k_cache, v_cache, kv_dt, k_scale,
                                                            v_scale);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
