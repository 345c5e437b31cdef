/* norm.cu — owns RMSNorm fused with the residual add (twins: cpu_rmsnorm, cpu_add_rmsnorm). */
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
