/* activation.cu — owns the gated activations, SwiGLU and GeGLU (twins: cpu_swiglu,
 * cpu_geglu), the bias add of biased projections and control vectors (cpu_add_bias), a
 * scale in place (cpu_scale), and the final logits' divisor and tanh soft cap
 * (cpu_logits_finish). */
#include "common.cuh"

/* same expressions as the twins: silu, g / (1 + exp(-g)) * up; gelu_tanh, g * sigmoid(2y)
 * with y = sqrt(2/pi) (g + 0.044715 g^3), one expf as the CPU's geglu_one */
struct act_silu {
    static __device__ __forceinline__ float f(float g, float u) { return g / (1.0f + expf(-g)) * u; }
};
struct act_gelu_tanh {
    static __device__ __forceinline__ float f(float g, float u) {
        return g / (1.0f + expf(-1.5957691216057308f * (g + 0.044715f * g * g * g))) * u;
    }
};

/* grid (column quads / 256 rounded up, min(n, 65535)), rows strided by gridDim.y: a thread
 * turns columns 4j..4j+3 of a row into ACT::f(gate, up).  VEC (d and in_stride multiples of 4, the buffers
 * 16-byte aligned) reads each input as one 16-byte load and writes one 16-byte (f32) or
 * 8-byte (bf16, f16) store; no 64-bit division per element, which the one-thread-per-
 * element version spent (prefill's act took 5.2 ms of a 2048-token llama-3-8b TTFT on an
 * H200, 2026-11-26, where reading and writing its bytes takes ~2.3). */
template <bool VEC, typename ACT>
__global__ void llmi_glu_kernel(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                                llmi_dtype out_dt) {
    const int j0 = (int)(blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (j0 >= d) return;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const float *gr = gate + (int64_t)t * in_stride, *ur = up + (int64_t)t * in_stride;
        const int64_t o = (int64_t)t * d + j0;
        if (!VEC) {
            for (int j = 0; j < 4 && j0 + j < d; j++) llmi_store(out, out_dt, o + j, ACT::f(gr[j0 + j], ur[j0 + j]));
            continue;
        }
        const float4 g = *(const float4 *)(gr + j0), u = *(const float4 *)(ur + j0);
        const float v[4] = {ACT::f(g.x, u.x), ACT::f(g.y, u.y), ACT::f(g.z, u.z), ACT::f(g.w, u.w)};
        if (out_dt == LLMI_F32) {
            *(float4 *)((float *)out + o) = make_float4(v[0], v[1], v[2], v[3]);
        } else {
            uint16_t h[4];
            for (int j = 0; j < 4; j++)
                h[j] = out_dt == LLMI_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v[j]))
                                           : __half_as_ushort(__float2half_rn(v[j]));
            *(uint2 *)((uint16_t *)out + o) = make_uint2((uint32_t)h[0] | (uint32_t)h[1] << 16,
                                                         (uint32_t)h[2] | (uint32_t)h[3] << 16);
        }
    }
}

/* grid (cols / 256 rounded up, min(n, 65535)), rows strided by gridDim.y */
__global__ void llmi_add_bias_kernel(float *y, int stride, const float *bias, int n, int cols) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    const float b = bias[j];
    for (int t = blockIdx.y; t < n; t += gridDim.y) y[(int64_t)t * stride + j] += b;
}

/* grid (cols / 256 rounded up, min(n, 65535)), rows strided by gridDim.y */
__global__ void llmi_logits_finish_kernel(float *y, int stride, int n, int cols, float divisor, float cap) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        float *p = y + (int64_t)t * stride + j, v = *p;
        if (divisor != 1.0f) v /= divisor;
        if (cap > 0.0f) v = cap * tanhf(v / cap);
        *p = v;
    }
}

/* grid-stride over n values */
__global__ void llmi_scale_kernel(float *y, size_t n, float scale) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] *= scale;
}

template <typename ACT>
static cudaError_t glu_launch(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                              llmi_dtype out_dt, cudaStream_t s) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    const dim3 grid((unsigned)llmi_div_up(llmi_div_up(d, 4), 256), (unsigned)(n < 65535 ? n : 65535));
    const bool vec = d % 4 == 0 && in_stride % 4 == 0 && (uintptr_t)gate % 16 == 0 && (uintptr_t)up % 16 == 0 &&
                     (uintptr_t)out % 16 == 0;
    if (vec) llmi_glu_kernel<true, ACT><<<grid, 256, 0, s>>>(gate, up, in_stride, n, d, out, out_dt);
    else llmi_glu_kernel<false, ACT><<<grid, 256, 0, s>>>(gate, up, in_stride, n, d, out, out_dt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_swiglu(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                                        llmi_dtype out_dt, cudaStream_t s) {
    return glu_launch<act_silu>(gate, up, in_stride, n, d, out, out_dt, s);
}

extern "C" cudaError_t llmi_cuda_geglu(const float *gate, const float *up, int in_stride, int n, int d, void *out,
                                       llmi_dtype out_dt, cudaStream_t s) {
    return glu_launch<act_gelu_tanh>(gate, up, in_stride, n, d, out, out_dt, s);
}

extern "C" cudaError_t llmi_cuda_add_bias(float *y, int stride, const float *bias, int n, int cols, cudaStream_t s) {
    if (n <= 0 || cols <= 0) return cudaSuccess;
    const dim3 grid((unsigned)llmi_div_up(cols, 256), (unsigned)(n < 65535 ? n : 65535));
    llmi_add_bias_kernel<<<grid, 256, 0, s>>>(y, stride, bias, n, cols);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_logits_finish(float *y, int stride, int n, int cols, float divisor, float cap,
                                               cudaStream_t s) {
    if (n <= 0 || cols <= 0 || (divisor == 1.0f && !(cap > 0.0f))) return cudaSuccess;
    const dim3 grid((unsigned)llmi_div_up(cols, 256), (unsigned)(n < 65535 ? n : 65535));
    llmi_logits_finish_kernel<<<grid, 256, 0, s>>>(y, stride, n, cols, divisor, cap);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_scale(float *y, size_t n, float scale, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    const size_t blocks = (n + 255) / 256;
    llmi_scale_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(y, n, scale);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
