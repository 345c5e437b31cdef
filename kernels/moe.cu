/* moe.cu — owns mixture-of-experts routing and the data movement around the experts'
 * GEMMs: the top-k choice of each token's experts and their weights (twin: cpu_moe_route),
 * the gather of routed rows into expert order (twin: cpu_gather_rows), and the weighted sum
 * of each token's expert outputs (twin: cpu_moe_combine).  The experts' products
 * themselves are the ordinary GEMMs (gemm.cu) on row views of the stacked weights. */
#include "common.cuh"

#define MOE_ROUTE_WARPS 4

/* a (logit va of expert a) comes before b among a token's experts: the larger logit, the
 * lower expert on a tie, a NaN after every number (a strict total order, so the ranks are
 * a permutation and exactly k experts are taken whatever the logits hold) */
__device__ __forceinline__ bool moe_before(float va, int a, float vb, int b) {
    const bool na = va != va, nb = vb != vb;
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return a < b;
}

/* grid (n / MOE_ROUTE_WARPS up), block MOE_ROUTE_WARPS warps, a warp per token; dynamic
 * shared memory (MOE_ROUTE_WARPS, E + 2k) floats: the token's logits, then its chosen
 * experts' probabilities and ids by rank.  The twin's arithmetic: the max of the non-NaN
 * logits, expf(l - max) summed in double (per lane, then across the warp: the order differs
 * from the twin's, far below fp32's rounding), each chosen probability rounded to fp32 from
 * the double quotient; with norm, each divided by their fp32 sum taken in rank order as the
 * twin's.  A warp past the last token leaves as a whole. */
__global__ void llmi_moe_route_kernel(const float *logits, int n, int E, int k, int norm, int32_t *sel, float *wt) {
    extern __shared__ float llmi_moe_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t = (int64_t)blockIdx.x * MOE_ROUTE_WARPS + warp;
    if (t >= n) return;
    float *lg = llmi_moe_smem + (size_t)warp * (E + 2 * k), *p_rank = lg + E;
    int32_t *e_rank = (int32_t *)(p_rank + k);
    const float *row = logits + t * E;
    float mx = __int_as_float(0x7fc00000);   /* NaN: fmaxf keeps the other operand, as the twin's fold from lg[0] */
    for (int e = lane; e < E; e += 32) {
        lg[e] = row[e];
        mx = fmaxf(mx, lg[e]);
    }
    mx = llmi_warp_max(mx);
    __syncwarp();
    double sum = 0.0;
    for (int e = lane; e < E; e += 32) sum += expf(lg[e] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    /* each expert's rank among the token's, counted only as far as k */
    for (int e = lane; e < E; e += 32) {
        const float v = lg[e];
        int rank = 0;
        for (int j = 0; j < E && rank < k; j++) rank += moe_before(lg[j], j, v, e);
        if (rank < k) {
            p_rank[rank] = (float)((double)expf(v - mx) / sum);
            e_rank[rank] = e;
        }
    }
    __syncwarp();
    float total = 0.0f;
    for (int r = 0; r < k; r++) total += p_rank[r];
    /* ascending expert order: a chosen expert's place is the number of chosen ones below it */
    for (int r = lane; r < k; r += 32) {
        const int e = e_rank[r];
        int at = 0;
        for (int j = 0; j < k; j++) at += e_rank[j] < e;
        sel[t * k + at] = e;
        wt[t * k + at] = norm ? p_rank[r] / total : p_rank[r];
    }
}

/* grid (16-byte chunks (or bytes) of a row / 256 up, min(m, 65535)), rows strided by
 * gridDim.y: out row i = x row rows[i], bit for bit. */
template <bool VEC>
__global__ void llmi_gather_rows_kernel(const void *x, int64_t row_bytes, const int32_t *rows, int m, void *out) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t units = VEC ? row_bytes / 16 : row_bytes;
    if (j >= units) return;
    for (int i = blockIdx.y; i < m; i += gridDim.y) {
        const int64_t src = (int64_t)rows[i] * units + j, dst = (int64_t)i * units + j;
        if (VEC) ((uint4 *)out)[dst] = ((const uint4 *)x)[src];
        else ((unsigned char *)out)[dst] = ((const unsigned char *)x)[src];
    }
}

/* grid (column quads / 256 up, min(n, 65535)), rows strided by gridDim.y: a thread sums
 * columns 4c..4c+3 of token t's k expert rows of y, term by term in j order from 0, each
 * product and sum rounded on its own (__fmul_rn/__fadd_rn: no FMA contraction), as the
 * twin's d[j] += y[j] * w.  VEC: dim a multiple of 4 and y, out 16-byte aligned. */
template <bool VEC>
__global__ void llmi_moe_combine_kernel(const float *y, const int32_t *pos, const float *wt, int n, int k, int dim,
                                        float *out) {
    const int c0 = (int)(blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (c0 >= dim) return;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int j = 0; j < k; j++) {
            const float w = wt[(int64_t)t * k + j];
            const float *yr = y + (int64_t)pos[(int64_t)t * k + j] * dim + c0;
            if (VEC) {
                const float4 v = *(const float4 *)yr;
                acc[0] = __fadd_rn(acc[0], __fmul_rn(v.x, w));
                acc[1] = __fadd_rn(acc[1], __fmul_rn(v.y, w));
                acc[2] = __fadd_rn(acc[2], __fmul_rn(v.z, w));
                acc[3] = __fadd_rn(acc[3], __fmul_rn(v.w, w));
            } else {
                for (int q = 0; q < 4 && c0 + q < dim; q++) acc[q] = __fadd_rn(acc[q], __fmul_rn(yr[q], w));
            }
        }
        float *o = out + (int64_t)t * dim + c0;
        if (VEC) *(float4 *)o = make_float4(acc[0], acc[1], acc[2], acc[3]);
        else
            for (int q = 0; q < 4 && c0 + q < dim; q++) o[q] = acc[q];
    }
}

extern "C" cudaError_t llmi_cuda_moe_route(const float *logits, int n, int n_experts, int k, bool norm, int32_t *sel,
                                           float *weights, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (!logits || !sel || !weights || n_experts < 1 || n_experts > LLMI_MOE_MAX_EXPERTS || k < 1 || k > n_experts)
        return cudaErrorInvalidValue;
    const size_t smem = (size_t)MOE_ROUTE_WARPS * ((size_t)n_experts + 2 * (size_t)k) * sizeof(float);
    llmi_moe_route_kernel<<<(unsigned)llmi_div_up(n, MOE_ROUTE_WARPS), MOE_ROUTE_WARPS * 32, smem, s>>>(
        logits, n, n_experts, k, norm ? 1 : 0, sel, weights);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_gather_rows(const void *x, int64_t row_bytes, const int32_t *rows, int m, void *out,
                                             cudaStream_t s) {
    if (m <= 0 || row_bytes <= 0) return cudaSuccess;
    if (!x || !rows || !out) return cudaErrorInvalidValue;
    const bool vec = row_bytes % 16 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0;
    const int64_t units = vec ? row_bytes / 16 : row_bytes;
    const dim3 grid((unsigned)llmi_div_up(units, 256), (unsigned)(m < 65535 ? m : 65535));
    if (vec) llmi_gather_rows_kernel<true><<<grid, 256, 0, s>>>(x, row_bytes, rows, m, out);
    else llmi_gather_rows_kernel<false><<<grid, 256, 0, s>>>(x, row_bytes, rows, m, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_moe_combine(const float *y, const int32_t *pos, const float *weights, int n, int k,
                                             int dim, float *out, cudaStream_t s) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    if (!y || !pos || !weights || !out || k < 1) return cudaErrorInvalidValue;
    const dim3 grid((unsigned)llmi_div_up(llmi_div_up(dim, 4), 256), (unsigned)(n < 65535 ? n : 65535));
    const bool vec = dim % 4 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)out % 16 == 0;
    if (vec) llmi_moe_combine_kernel<true><<<grid, 256, 0, s>>>(y, pos, weights, n, k, dim, out);
    else llmi_moe_combine_kernel<false><<<grid, 256, 0, s>>>(y, pos, weights, n, k, dim, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
