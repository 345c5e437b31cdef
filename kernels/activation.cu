/* activation.cu — owns SwiGLU (twin: cpu_swiglu) and the bias add of biased projections. */
#include "common.cuh"

__global__ void llmi_swiglu_kernel(const float *gate, const float *up, int in_stride, int64_t n, int d, void *out,
                                   llmi_dtype out_dt) {
    int64_t total = n * d;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = idx / d, j = idx % d;
        float g = gate[t * in_stride + j];
        /* same expression as the twin: g / (1 + exp(-g)) * up */
        llmi_store(out, out_dt, idx, g / (1.0f + expf(-g)) * up[t * in_stride + j]);
    }
}

__global__ void llmi_add_bias_kernel(float *y, int stride, const float *bias, int64_t n, int cols) {
    int64_t total = n * cols;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = idx / cols, j = idx % cols;
        y[t * stride + j] += bias[j];
    }
}

static unsigned llmi_grid_for(int64_t total) {
    int64_t g = (total + 255) / 256;
    return (unsigned)(g < 65535 * 8 ? (g > 0 ? g : 1) : 65535 * 8);
}

extern "C" cudaError_t llmi_cuda_swiglu(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                                        llmi_dtype out_dt, cudaStream_t s) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    llmi_swiglu_kernel<<<llmi_grid_for((int64_t)n * d), 256, 0, s>>>(gate, up, in_stride, n, d, out, out_dt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_add_bias(float *y, int stride, const float *bias, int n, int cols, cudaStream_t s) {
    if (n <= 0 || cols <= 0) return cudaSuccess;
    llmi_add_bias_kernel<<<llmi_grid_for((int64_t)n * cols), 256, 0, s>>>(y, stride, bias, n, cols);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
