/* int4_gemm.cu — owns the W4A16 kernels for LLMI_I4G (GPTQ/AWQ) weights: a decode GEMV,
 * a tensor-core GEMM for prefill, and dequantization to a dense matrix.  Layouts and
 * semantics: int4_gemm.h; CPU twin cpu_matmul on LLMI_I4G. */
#include <cuda_fp16.h>
#include <mma.h>
#include "common.cuh"
#include "int4_gemm.h"


/* Scale and zero of (row, input column k). */
__device__ __forceinline__ void i4_group(const llmi_i4g_dev &w, int row, int k, float *s, int *z) {
    int g = w.g_idx ? w.g_idx[k] : k / w.group_size;
    *s = __half2float(__ushort_as_half(w.scales[(size_t)g * w.rows + row]));
    *z = w.zeros[(size_t)g * w.rows + row];
}

/* One warp per output row; each lane takes 8 input columns (one u32 of nibbles) per step
 * and all n tokens, so the row's weights are read from memory exactly once. */
__global__ void __launch_bounds__(256) llmi_int4_gemv_kernel(llmi_i4g_dev w, const void *x, llmi_dtype x_dt, int n,
                                                             const float *bias, float *y, int ldy) {
    int warp = (int)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = threadIdx.x % 32;
    if (warp >= w.rows) return;
    int row = warp;
    float acc[LLMI_I4_GEMV_MAX_N];
#pragma unroll
    for (int t = 0; t < LLMI_I4_GEMV_MAX_N; t++) acc[t] = 0.0f;
    const uint32_t *qr = (const uint32_t *)(w.q + (size_t)row * (w.cols / 2));
    for (int c8 = lane; c8 < w.cols / 8; c8 += 32) {
        uint32_t word = qr[c8];
        int k0 = c8 * 8;
        float s;
        int z;
        if (!w.g_idx) i4_group(w, row, k0, &s, &z); /* 8 columns share a group when gs % 8 == 0 */
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (w.g_idx) i4_group(w, row, k0 + j, &s, &z);
            float wv = __fmul_rn(s, (float)((int)((word >> (4 * j)) & 15u) - z));
#pragma unroll
            for (int t = 0; t < LLMI_I4_GEMV_MAX_N; t++)
                if (t < n) acc[t] = fmaf(llmi_load(x, x_dt, (int64_t)t * w.cols + k0 + j), wv, acc[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < LLMI_I4_GEMV_MAX_N; t++) {
        if (t >= n) break;
        float v = llmi_warp_sum(acc[t]);
        if (lane == 0) y[(size_t)t * ldy + row] = v + (bias ? bias[row] : 0.0f);
    }
}

/* Tensor-core GEMM: block tile 64 tokens x 64 output rows, k step 32.  Eight warps each
 * own a 16x32 piece of the 64x64 tile (two 16x16 wmma accumulators). */
#define I4_BM 64
#define I4_BN 64
#define I4_BK 32

__global__ void __launch_bounds__(256) llmi_int4_gemm_kernel(llmi_i4g_dev w, const void *x, llmi_dtype x_dt, int n,
                                                             const float *bias, float *y, int ldy) {
    using namespace nvcuda;
    __shared__ __align__(32) __nv_bfloat16 xs[I4_BM][I4_BK + 8];  /* (tokens, k) activations in bf16 */
    __shared__ __align__(32) __nv_bfloat16 ws[I4_BN][I4_BK + 8];  /* (rows, k) dequantized weights */
    __shared__ __align__(32) float cs[I4_BM][I4_BN + 4]; /* (tokens, rows) fp32 results */
    int m0 = blockIdx.y * I4_BM, r0 = blockIdx.x * I4_BN;
    int tid = threadIdx.x, warp = tid / 32;
    int wm = (warp / 2) * 16, wn = (warp % 2) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
    wmma::fill_fragment(acc[0], 0.0f);
    wmma::fill_fragment(acc[1], 0.0f);
    for (int k0 = 0; k0 < w.cols; k0 += I4_BK) {
        for (int i = tid; i < I4_BM * I4_BK; i += blockDim.x) {
            int m = i / I4_BK, k = i % I4_BK;
            float v = (m0 + m < n && k0 + k < w.cols) ? llmi_load(x, x_dt, (int64_t)(m0 + m) * w.cols + k0 + k) : 0.0f;
            xs[m][k] = __float2bfloat16_rn(v);
        }
        for (int i = tid; i < I4_BN * I4_BK / 2; i += blockDim.x) {
            int r = i / (I4_BK / 2), kk = (i % (I4_BK / 2)) * 2, row = r0 + r, k = k0 + kk;
            float v0 = 0.0f, v1 = 0.0f;
            if (row < w.rows && k < w.cols) {
                uint8_t b = w.q[(size_t)row * (w.cols / 2) + k / 2];
                float s;
                int z;
                i4_group(w, row, k, &s, &z);
                v0 = __fmul_rn(s, (float)((int)(b & 15) - z));
                if (w.g_idx) i4_group(w, row, k + 1, &s, &z);
                v1 = __fmul_rn(s, (float)((int)(b >> 4) - z));
            }
            ws[r][kk] = __float2bfloat16_rn(v0);
            ws[r][kk + 1] = __float2bfloat16_rn(v1);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < I4_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
            wmma::load_matrix_sync(a, &xs[wm][kk], I4_BK + 8);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                /* ws is (rows, k) row-major = W^T (k, rows) col-major */
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
                wmma::load_matrix_sync(b, &ws[wn + 16 * j][kk], I4_BK + 8);
                wmma::mma_sync(acc[j], a, b, acc[j]);
            }
        }
        __syncthreads();
    }
    wmma::store_matrix_sync(&cs[wm][wn], acc[0], I4_BN + 4, wmma::mem_row_major);
    wmma::store_matrix_sync(&cs[wm][wn + 16], acc[1], I4_BN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < I4_BM * I4_BN; i += blockDim.x) {
        int m = i / I4_BN, r = i % I4_BN;
        if (m0 + m < n && r0 + r < w.rows) y[(size_t)(m0 + m) * ldy + r0 + r] = cs[m][r] + (bias ? bias[r0 + r] : 0.0f);
    }
}

__global__ void llmi_int4_dequant_kernel(llmi_i4g_dev w, void *out, llmi_dtype out_dt) {
    int64_t total = (int64_t)w.rows * w.cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int row = (int)(i / w.cols), k = (int)(i % w.cols);
        uint8_t b = w.q[(size_t)row * (w.cols / 2) + k / 2];
        float s;
        int z;
        i4_group(w, row, k, &s, &z);
        float v = __fmul_rn(s, (float)((int)((k & 1) ? (b >> 4) : (b & 15)) - z));
        llmi_store(out, out_dt, i, v);
    }
}

extern "C" cudaError_t llmi_cuda_int4_matmul(const llmi_i4g_dev *w, const void *x, llmi_dtype x_dt, int n,
                                             const float *bias, float *y, int ldy, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (w->cols % 8 != 0 || w->group_size <= 0 || w->group_size % 8 != 0 || ldy < w->rows ||
        (x_dt != LLMI_F32 && x_dt != LLMI_BF16))
        return cudaErrorInvalidValue;
    if (n <= LLMI_I4_GEMV_MAX_N) {
        llmi_int4_gemv_kernel<<<llmi_div_up(w->rows, 8), 256, 0, s>>>(*w, x, x_dt, n, bias, y, ldy);
    } else {
        dim3 grid(llmi_div_up(w->rows, I4_BN), llmi_div_up(n, I4_BM));
        llmi_int4_gemm_kernel<<<grid, 256, 0, s>>>(*w, x, x_dt, n, bias, y, ldy);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t llmi_cuda_int4_dequant(const llmi_i4g_dev *w, void *out, llmi_dtype out_dt, cudaStream_t s) {
    int64_t total = (int64_t)w->rows * w->cols;
    if (total <= 0) return cudaSuccess;
    if (out_dt != LLMI_F32 && out_dt != LLMI_F16 && out_dt != LLMI_BF16) return cudaErrorInvalidValue;
    int64_t g = (total + 255) / 256;
    if (g > 65535L * 16) g = 65535L * 16;
    llmi_int4_dequant_kernel<<<(unsigned)g, 256, 0, s>>>(*w, out, out_dt);
    return cudaGetLastError();
}
