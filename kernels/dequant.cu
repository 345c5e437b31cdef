/* dequant.cu — owns the load-time conversion of stored weights (GGUF Q8_0/Q4_0/Q4_1,
 * Q5_0/Q5_1, Q2_K/Q3_K/Q4_K/Q5_K/Q6_K, IQ4_NL/IQ4_XS, f32/f16/bf16) to the GEMM dtype (bf16, or f16 for fp16 models), and the conversions of
 * activations between fp32 and a stored dtype.  Twins: tensor_dequant_row, whose products
 * it reproduces without fused multiply-adds so the fp32 value before the final rounding is
 * the same; f32_to_bf16 / f32_to_fp16 (core/dtype.h) for the stores. */
#include "common.cuh"

__device__ __forceinline__ float half_bits(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Value e (0..255) of a k-quant super-block, as kquant_dequant_block (core/tensor.c)
 * computes it: the same products in the same order, none fused. */
__device__ float kquant_value(const uint8_t *blk, llmi_dtype dt, int e) {
    if (dt == LLMI_Q2_K) {   /* bit pair of qs; 4-bit scale (low) and min (high) per 16 */
        const int half = e >> 7, k = (e >> 5) & 3, l = e & 31;
        const int q = (blk[16 + 32 * half + l] >> (2 * k)) & 3, sm = blk[e >> 4];
        const float dl = __fmul_rn(half_bits(blk + 80), (float)(sm & 15)), ml = __fmul_rn(half_bits(blk + 82), (float)(sm >> 4));
        return __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
    if (dt == LLMI_Q3_K) {   /* bit pair of qs, third bit of hmask, signed 6-bit scale per 16 */
        const int half = e >> 7, k = (e >> 5) & 3, l = e & 31;
        const int q = ((blk[32 + 32 * half + l] >> (2 * k)) & 3 | ((blk[l] >> (e >> 5)) & 1) << 2) - 4;
        return __fmul_rn(__fmul_rn(half_bits(blk + 108), (float)kquant_q3_scale(blk + 96, e >> 4)), (float)q);
    }
    if (dt == LLMI_Q6_K) {
        const int half = e >> 7, k = (e >> 5) & 3, l = e & 31;
        const uint8_t lo = blk[64 * half + l + 32 * (k & 1)], hb = blk[128 + 32 * half + l];
        const int q = ((k < 2 ? lo & 15 : lo >> 4) | ((hb >> (2 * k)) & 3) << 4) - 32;
        return __fmul_rn(__fmul_rn(half_bits(blk + 208), (float)(int8_t)blk[192 + e / 16]), (float)q);
    }
    const int j = e >> 5, i = e & 31;
    int sc, mn;
    kquant_scale_min(blk + 4, j, &sc, &mn);
    const uint8_t q = blk[(dt == LLMI_Q5_K ? 48 : 16) + 32 * (j >> 1) + i];
    int v = (j & 1) ? q >> 4 : q & 15;
    if (dt == LLMI_Q5_K && ((blk[16 + i] >> j) & 1)) v += 16;
    const float dj = __fmul_rn(half_bits(blk), (float)sc), mj = __fmul_rn(half_bits(blk + 2), (float)mn);
    return __fsub_rn(__fmul_rn(dj, (float)v), mj);
}

__global__ void llmi_dequant_kernel(const uint8_t *src, llmi_dtype src_dt, int64_t n, void *dst, llmi_dtype dst_dt) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v;
        int64_t b = i >> 5;
        int j = (int)(i & 31);
        switch (src_dt) {
        case LLMI_Q8_0: {
            const uint8_t *blk = src + b * 34;
            v = __fmul_rn((float)(int8_t)blk[2 + j], half_bits(blk));
            break;
        }
        case LLMI_Q4_0: {
            const uint8_t *blk = src + b * 18;
            uint8_t q = blk[2 + (j & 15)];
            int nib = j < 16 ? (q & 15) : (q >> 4);
            v = __fmul_rn((float)(nib - 8), half_bits(blk));
            break;
        }
        case LLMI_Q4_1: {
            const uint8_t *blk = src + b * 20;
            uint8_t q = blk[4 + (j & 15)];
            int nib = j < 16 ? (q & 15) : (q >> 4);
            v = __fadd_rn(__fmul_rn((float)nib, half_bits(blk)), half_bits(blk + 2));
            break;
        }
        case LLMI_Q5_0:
        case LLMI_Q5_1: {
            const bool q51 = src_dt == LLMI_Q5_1;
            const uint8_t *blk = src + b * (q51 ? 24 : 22), *qh = blk + (q51 ? 4 : 2);
            const uint8_t q = blk[(q51 ? 8 : 6) + (j & 15)];
            const int qv = (j < 16 ? q & 15 : q >> 4) | ((qh[j >> 3] >> (j & 7)) & 1) << 4;   /* qh: a little-endian u32 */
            v = q51 ? __fadd_rn(__fmul_rn((float)qv, half_bits(blk)), half_bits(blk + 2))
                    : __fmul_rn((float)(qv - 16), half_bits(blk));
            break;
        }
        case LLMI_IQ4_NL: {   /* d * v[q], q a nibble in Q4_0's order */
            const uint8_t *blk = src + b * 18;
            const uint8_t q = blk[2 + (j & 15)];
            v = __fmul_rn(half_bits(blk), (float)iq4nl_value(j < 16 ? q & 15 : q >> 4));
            break;
        }
        case LLMI_IQ4_XS: {   /* (d * (s - 32)) * v[q], sub-block i / 32 of super-block i / 256 */
            const uint8_t *blk = src + (i >> 8) * 136;
            const int s = (int)((i >> 5) & 7);
            const uint8_t q = blk[8 + 16 * s + (j & 15)];
            v = __fmul_rn(__fmul_rn(half_bits(blk), (float)iq4xs_scale(blk, s)), (float)iq4nl_value(j < 16 ? q & 15 : q >> 4));
            break;
        }
        case LLMI_Q2_K:
        case LLMI_Q3_K:
        case LLMI_Q4_K:
        case LLMI_Q5_K:
        case LLMI_Q6_K:
            v = kquant_value(src + (i >> 8) * dtype_block_bytes(src_dt), src_dt, (int)(i & 255));
            break;
        default:
            v = llmi_load(src, src_dt, i);
            break;
        }
        llmi_store(dst, dst_dt, i, v);
    }
}

__global__ void llmi_to_f32_kernel(const void *src, llmi_dtype src_dt, int64_t n, float *dst) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = llmi_load(src, src_dt, i);
}

__global__ void llmi_sum_store_kernel(const float *a, const float *b, int64_t n, void *dst, llmi_dtype dst_dt,
                                      int32_t *overflow) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = b ? a[i] + b[i] : a[i];
        llmi_store(dst, dst_dt, i, v);
        if (overflow && dst_dt == LLMI_F16 && isfinite(v) && !isfinite(llmi_load(dst, dst_dt, i)))
            atomicAdd(overflow, 1);
    }
}

static unsigned grid_for(int64_t n) {
    int64_t g = (n + 255) / 256;
    if (g > 65535L * 16) g = 65535L * 16;
    return (unsigned)(g > 0 ? g : 1);
}

extern "C" cudaError_t llmi_cuda_dequant(const void *src, llmi_dtype src_dt, int64_t n_elems, void *dst,
                                         llmi_dtype dst_dt, cudaStream_t s) {
    if (n_elems <= 0) return cudaSuccess;
    /* LLMI_I4G keeps its scales outside the data: int4_gemm.cu dequantizes it */
    if (src_dt < 0 || src_dt >= LLMI_DTYPE_COUNT || src_dt == LLMI_I4G || n_elems % dtype_block_elems(src_dt) != 0)
        return cudaErrorInvalidValue;
    if (dst_dt != LLMI_BF16 && dst_dt != LLMI_F16 && dst_dt != LLMI_F32) return cudaErrorInvalidValue;
    llmi_dequant_kernel<<<grid_for(n_elems), 256, 0, s>>>((const uint8_t *)src, src_dt, n_elems, dst, dst_dt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_to_f32(const void *src, llmi_dtype src_dt, int64_t n, float *dst, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    llmi_to_f32_kernel<<<grid_for(n), 256, 0, s>>>(src, src_dt, n, dst);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_sum_store(const float *a, const float *b, int64_t n, void *dst, llmi_dtype dst_dt,
                                           int32_t *overflow, cudaStream_t s) {
    if (dst_dt != LLMI_BF16 && dst_dt != LLMI_F16 && dst_dt != LLMI_F32) return cudaErrorInvalidValue;
    if (overflow) {
        cudaError_t e = cudaMemsetAsync(overflow, 0, sizeof *overflow, s);
        if (e != cudaSuccess) return e;
    }
    if (n <= 0) return cudaSuccess;
    llmi_sum_store_kernel<<<grid_for(n), 256, 0, s>>>(a, b, n, dst, dst_dt, overflow);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
