/* norm.cu — owns RMSNorm fused with the residual add (twins: cpu_rmsnorm, cpu_add_rmsnorm)
 * and the per-head RMSNorm of q and k before RoPE, Qwen3's q_norm/k_norm (twin:
 * cpu_head_rmsnorm). */
#include "common.cuh"

/* A thread's elements of a row: j = threadIdx.x + k * blockDim.x for k < NORM_PER_THREAD,
 * the block sized so that they cover dim (norm_threads). */
#define NORM_PER_THREAD 16
static_assert(LLMI_NORM_MAX_DIM <= NORM_PER_THREAD * 1024, "a row must fit one block's registers");

/* grid (n), block norm_threads(dim): one row per block.  Each thread loads all its
 * elements of x (and delta) before it stores any and keeps them in registers for the
 * output: the residual is read once, and the loads are in flight together.  (The loop this
 * replaces stored each sum back before loading the next element, which the compiler must
 * keep in order (residual and delta may alias), so a thread waited for memory 16 times a
 * pass at dim 4096: at one token, ~65 norms a step of a few microseconds each.) */
__global__ void llmi_add_rmsnorm_kernel(float *residual, const float *delta, const float *w, const int32_t *rows,
                                        int dim, float eps, void *out, llmi_dtype out_dt) {
    __shared__ float red[32];
    const int i = blockIdx.x, bd = blockDim.x;
    const int64_t r = rows ? rows[i] : i;
    float *x = residual + r * dim;
    const float *d = delta ? delta + r * dim : nullptr;
    const bool write_back = d && !rows;
    float v[NORM_PER_THREAD];
#pragma unroll
    for (int k = 0; k < NORM_PER_THREAD; k++) {
        const int j = threadIdx.x + k * bd;
        v[k] = j < dim ? x[j] + (d ? d[j] : 0.0f) : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_PER_THREAD; k++) {
        const int j = threadIdx.x + k * bd;
        if (write_back && j < dim) x[j] = v[k];
        ss += v[k] * v[k];
    }
    ss = llmi_block_sum(ss, red);
    const float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    const int64_t ob = (int64_t)i * dim;
#pragma unroll
    for (int k = 0; k < NORM_PER_THREAD; k++) {
        const int j = threadIdx.x + k * bd;
        if (j < dim) llmi_store(out, out_dt, ob + j, v[k] * rs * w[j]);
    }
}

/* Whole warps covering dim in NORM_PER_THREAD passes (dim 4096: 256 threads). */
static int norm_threads(int dim) {
    const int t = llmi_div_up(llmi_div_up(dim, NORM_PER_THREAD), 32) * 32;
    return t < 32 ? 32 : t;
}

extern "C" cudaError_t llmi_cuda_add_rmsnorm(float *residual, const float *delta, const float *w, const int32_t *rows,
                                             int n, int dim, float eps, void *out, llmi_dtype out_dt, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (dim <= 0 || dim > LLMI_NORM_MAX_DIM) return cudaErrorInvalidValue;
    llmi_add_rmsnorm_kernel<<<n, norm_threads(dim), 0, s>>>(residual, delta, w, rows, dim, eps, out, out_dt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* grid (ceil(n * (n_q_heads + n_kv_heads) / HEAD_NORM_WARPS)), block HEAD_NORM_WARPS * 32:
 * one warp per (token, head) row, rows in token-major order.  A head is at most a few
 * hundred values, so a block per row (as above) would leave most of its threads idle and
 * pay for __syncthreads; a warp holds the row in registers (PER values a lane, lane + 32 k)
 * and reduces by shuffles alone.  The q heads come first in a token's row and the k heads
 * right after them, which is the fused QKV buffer's layout, so one launch norms both.  A
 * warp past the last row leaves as a whole, so every shuffle sees its full warp. */
#define HEAD_NORM_WARPS 8
template <int PER>
__global__ void llmi_head_rmsnorm_kernel(float *x, int stride, int n, int n_q_heads, int n_kv_heads, int head_dim,
                                         const float *q_w, const float *k_w, float eps) {
    const int heads = n_q_heads + n_kv_heads, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * HEAD_NORM_WARPS + (threadIdx.x >> 5);
    if (row >= (int64_t)n * heads) return;
    const int64_t t = row / heads;
    const int h = (int)(row - t * heads);
    float *r = x + t * stride + (int64_t)h * head_dim;
    const float *w = h < n_q_heads ? q_w : k_w;
    float v[PER];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int j = lane + 32 * k;
        v[k] = j < head_dim ? r[j] : 0.0f;
        ss += v[k] * v[k];
    }
    ss = llmi_warp_sum(ss);
    /* the CPU twin's order: mean first, then 1/sqrt, then (x * r) * w */
    const float rs = 1.0f / sqrtf(ss / (float)head_dim + eps);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int j = lane + 32 * k;
        if (j < head_dim) r[j] = v[k] * rs * w[j];
    }
}

extern "C" cudaError_t llmi_cuda_head_rmsnorm(float *x, int stride, int n, int n_q_heads, int n_kv_heads, int head_dim,
                                              const float *q_w, const float *k_w, float eps, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    const int64_t heads = (int64_t)n_q_heads + n_kv_heads;
    if (!x || n_q_heads < 0 || n_kv_heads < 0 || head_dim <= 0 || head_dim > LLMI_HEAD_NORM_MAX_DIM ||
        heads * head_dim > stride || (n_q_heads && !q_w) || (n_kv_heads && !k_w))
        return cudaErrorInvalidValue;
    if (heads == 0) return cudaSuccess;
    const unsigned grid = llmi_div_up(n * heads, HEAD_NORM_WARPS);
    const int threads = HEAD_NORM_WARPS * 32;
    /* the fewest registers a lane that hold the head: the sizes in use (64 to 256) load and
     * test only what they have, not the bound's 32 */
    if (head_dim <= 4 * 32)
        llmi_head_rmsnorm_kernel<4><<<grid, threads, 0, s>>>(x, stride, n, n_q_heads, n_kv_heads, head_dim, q_w, k_w,
                                                              eps);
    else if (head_dim <= 8 * 32)
        llmi_head_rmsnorm_kernel<8><<<grid, threads, 0, s>>>(x, stride, n, n_q_heads, n_kv_heads, head_dim, q_w, k_w,
                                                              eps);
    else
        llmi_head_rmsnorm_kernel<LLMI_HEAD_NORM_MAX_DIM / 32><<<grid, threads, 0, s>>>(x, stride, n, n_q_heads,
                                                                                   n_kv_heads, head_dim, q_w, k_w, eps);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
