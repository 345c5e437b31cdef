/* norm.cu — owns RMSNorm fused with the residual add (twins: cpu_rmsnorm, cpu_add_rmsnorm). */
#include "common.cuh"

/* grid (n), block 256: one row per block.  The residual row is written back (when asked)
 * in the first pass and re-read by the same thread in the second, so no sync is needed
 * between the two beyond the reduction's. */
__global__ void llmi_add_rmsnorm_kernel(float *residual, const float *delta, const float *w, const int32_t *rows,
                                        int dim, float eps, void *out, llmi_dtype out_dt) {
    __shared__ float red[32];
    int i = blockIdx.x;
    int64_t r = rows ? rows[i] : i;
    float *x = residual + r * dim;
    const float *d = delta ? delta + r * dim : nullptr;
    bool write_back = d && !rows;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = x[j];
        if (d) v += d[j];
        if (write_back) x[j] = v;
        ss += v * v;
    }
    ss = llmi_block_sum(ss, red);
    float rs = 1.0f / sqrtf(ss / (float)dim + eps);
    int64_t ob = (int64_t)i * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = x[j];
        if (d && !write_back) v += d[j];
        llmi_store(out, out_dt, ob + j, v * rs * w[j]);
    }
}

extern "C" cudaError_t llmi_cuda_add_rmsnorm(float *residual, const float *delta, const float *w, const int32_t *rows,
                                             int n, int dim, float eps, void *out, llmi_dtype out_dt, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    llmi_add_rmsnorm_kernel<<<n, 256, 0, s>>>(residual, delta, w, rows, dim, eps, out, out_dt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
