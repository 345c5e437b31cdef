/* common.cuh — owns the device helpers every op family shares: loads and stores in the
 * activation, weight and KV dtypes (fp32 math throughout, round to nearest even on store),
 * warp/block reductions, and the launch-error check. */
#ifndef LLMI_KERNELS_COMMON_CUH
#define LLMI_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
__device__ __forceinline__ float llmi_kv_load(const void *p, llmi_kv_dtype dt, int64_t i) {
    if (dt == LLMI_KV_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == LLMI_KV_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}
__device__ __forceinline__ void llmi_kv_store(void *p, llmi_kv_dtype dt, int64_t i, float v) {
    if (dt == LLMI_KV_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (dt == LLMI_KV_F16) ((__half *)p)[i] = __float2half_rn(v);
    else ((float *)p)[i] = v;
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

static inline unsigned llmi_div_up(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

#endif
