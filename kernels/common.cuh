/* common.cuh — owns the device helpers every op family shares: loads and stores in the
 * activation, weight and KV dtypes (fp32 math throughout, round to nearest even on store),
 * warp/block reductions, and the launch-error check. */
#ifndef LLMI_KERNELS_COMMON_CUH
#define LLMI_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include "kernels.h"

/* Returns the launch error of the kernel just launched (configuration errors surface here;
 * faults during execution surface at the next synchronising call). */
#define LLMI_LAUNCH_CHECK()                           \
    do {                                              \
        cudaError_t e_ = cudaGetLastError();          \
        if (e_ != cudaSuccess) return e_;             \
    } while (0)

__device__ __forceinline__ float llmi_ld(const float *p, int64_t i) { return p[i]; }

/* Element i of a buffer in dtype dt (F32, F16 or BF16) as fp32. */
__device__ __forceinline__ float llmi_load(const void *p, llmi_dtype dt, int64_t i) {
    if (dt == LLMI_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == LLMI_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ void llmi_store(void *p, llmi_dtype dt, int64_t i, float v) {
    if (dt == LLMI_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == LLMI_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
}
/* Element i of a KV cache in dt as fp32.  Q8: llama.cpp's q8_0 blocks of 32 (fp16 d, then 32
 * int8), block i/32 at byte (i/32)*34 (a cache row of n_kv_heads*head_dim is whole blocks);
 * FP8: e4m3 before its (layer, head) scale, which the caller applies. */
__device__ __forceinline__ float llmi_kv_load(const void *p, llmi_kv_dtype dt, int64_t i) {
    if (dt == LLMI_KV_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == LLMI_KV_F16) return __half2float(((const __half *)p)[i]);
    if (dt == LLMI_KV_Q8) {
        const unsigned char *blk = (const unsigned char *)p + (i / KV_Q8_BLOCK) * KV_Q8_BLOCK_BYTES;
        float d = __half2float(*(const __half *)blk);   /* 34-byte blocks keep d 2-byte aligned */
        return d * (float)(signed char)blk[2 + i % KV_Q8_BLOCK];
    }
    if (dt == LLMI_KV_FP8) {
        __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t *)p)[i], __NV_E4M3);
        return __half2float(__half(h));   /* every e4m3 value is exact in f16 */
    }
    return ((const float *)p)[i];
}
/* Stores v at element i in f32, f16, bf16 (round to nearest even) or fp8 (v already divided
 * by its scale; RNE, saturating to +-448 as the CPU's f32_to_e4m3).  Q8 is written a whole
 * block at a time (llmi_kv_store_q8_block). */
__device__ __forceinline__ void llmi_kv_store(void *p, llmi_kv_dtype dt, int64_t i, float v) {
    if (dt == LLMI_KV_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == LLMI_KV_F16) ((__half *)p)[i] = __float2half_rn(v);
    else if (dt == LLMI_KV_FP8) ((__nv_fp8_storage_t *)p)[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    else ((float *)p)[i] = v;
}
/* Block b (KV_Q8_BLOCK values of x) of a q8 cache, as the CPU's q8_block_quantize: d =
 * amax/127 rounded to fp16, q = roundf(x / d) (IEEE division and roundf's ties away from
 * zero, so the bytes equal the CPU's for the same x). */
__device__ __forceinline__ void llmi_kv_store_q8_block(void *p, int64_t b, const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < KV_Q8_BLOCK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    unsigned char *blk = (unsigned char *)p + b * KV_Q8_BLOCK_BYTES;
    *(__half *)blk = __float2half_rn(d);
    for (int j = 0; j < KV_Q8_BLOCK; j++) blk[2 + j] = (unsigned char)(signed char)roundf(x[j] * id);
}

/* Eight bf16 values packed in 16 bytes (lowest address first) as fp32, exactly: a bf16 is
 * the top half of its fp32. */
__device__ __forceinline__ void llmi_bf16x8_f32(uint4 u, float v[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float llmi_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float llmi_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * red: __shared__ float[32].  Synchronises, so all threads must call it. */
/* A GEMV thread's next 16-byte chunks: chunk[u][r] = chunk base + u * THREADS of row r
 * (nchunks a row; zero past the end), all U * R loads issued before any is used. */
template <int U, int R, int THREADS>
__device__ __forceinline__ void llmi_gemv_load(const uint4 *const (&row)[R], int base, int nchunks,
                                               uint4 (&chunk)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = base + u * THREADS;
#pragma unroll
        for (int r = 0; r < R; r++) chunk[u][r] = c < nchunks ? __ldg(row[r] + c) : make_uint4(0, 0, 0, 0);
    }
}

/* The end of a GEMV whose THREADS threads each hold partial sums acc[t][r] for NT tokens and
 * R output rows row0 + r: summed over each warp by shuffles, then over the block's warps
 * through partial (shared) in a fixed order; y[t * ldy + row] = the sum (+ bias[row]) for the
 * n real tokens and the rows below `rows`.  Every thread of the block calls it. */
template <int NT, int R, int THREADS>
__device__ __forceinline__ void llmi_gemv_finish(const float (&acc)[NT][R], float (&partial)[THREADS / 32][NT][R],
                                                 int n, int row0, int rows, const float *bias, float *y, int ldy) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float v = llmi_warp_sum(acc[t][r]);
            if (lane == 0) partial[warp][t][r] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NT * R; i += THREADS) {
        const int t = i / R, r = i % R, row = row0 + r;
        if (t >= n || row >= rows) continue;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < THREADS / 32; k++) v += partial[k][t][r];
        y[(size_t)t * ldy + row] = v + (bias ? bias[row] : 0.0f);
    }
}

__device__ __forceinline__ float llmi_block_sum(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = llmi_warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return llmi_warp_sum(v);
}
__device__ __forceinline__ float llmi_block_max(float v, float *red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = llmi_warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return llmi_warp_max(v);
}

/* Items i0, i0 + step, i0 + 2 step, ... of a grid `cols` wide, as (row r, column c) without
 * a division an item: a 32-bit division by a value known only at run time is ~20
 * instructions, and a loop over items that divides each one spends more issue slots on its
 * indices than on its work.  The step's rows and columns are worked out once and carried. */
struct llmi_walk {
    int r, c, dr, dc, cols;
    __device__ __forceinline__ llmi_walk(int i0, int step, int cols_)
        : r(i0 / cols_), c(i0 % cols_), dr(step / cols_), dc(step % cols_), cols(cols_) {}
    __device__ __forceinline__ void next() {
        r += dr, c += dc;
        if (c >= cols) c -= cols, r++;
    }
};

/* Items i0, i0 + step, ... of an (n_rows, cols) grid, BATCH at a time: load(u, r, c) for each
 * item u of a batch (r may be n_rows or more: the load leaves those), then store(u, r, c) for
 * the ones inside, so a thread's BATCH loads are all issued before its first store (a loop
 * storing after each load waits for memory once a trip: the compiler cannot tell the
 * destination from the source). */
template <int BATCH, typename Load, typename Store>
__device__ __forceinline__ void llmi_walk_batches(int i0, int step, int cols, int n_rows, Load &&load, Store &&store) {
    for (llmi_walk w(i0, step, cols); w.r < n_rows;) {
        llmi_walk ws = w;   /* the batch's first item, walked again for the stores */
#pragma unroll
        for (int u = 0; u < BATCH; u++, w.next()) load(u, w.r, w.c);
#pragma unroll
        for (int u = 0; u < BATCH; u++, ws.next())
            if (ws.r < n_rows) store(u, ws.r, ws.c);
    }
}

static inline unsigned llmi_div_up(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

#endif
