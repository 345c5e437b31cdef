/* quant_gptq.cu — the offline quantizer's device kernels (launchers in quant_kernels.h): the
 * Hessian's mirror and factorisation setup, GPTQ's in-block column walk and AWQ's
 * fake-quantized error.  The GEMMs (X^T X, the lazy update, d H) are cuBLAS and the
 * Cholesky / triangular inverse cuSOLVER, called from src/quant/quant_cuda.c. */
#include "common.cuh"
#include "quant_kernels.h"

#define QK_MAXQ 15

/* quant_range_params (src/core/int4_pack.c), GPTQ and AWQ styles: the scale is rounded to
 * fp16 before the zero is chosen, so device and host grids agree bit for bit. */
__device__ __forceinline__ void qk_range_params(float mn, float mx, int sym, int awq, uint16_t *scale, int *zero) {
    float s;
    if (awq) {
        s = fmaxf(mx - mn, 1e-5f) / QK_MAXQ;
        uint16_t sh = __half_as_ushort(__float2half_rn(s));
        if ((sh & 0x7fff) == 0) sh = 1;
        s = __half2float(__ushort_as_half(sh));
        float zf = -rintf(mn / s);
        *zero = zf < 0 ? 0 : zf > QK_MAXQ ? QK_MAXQ : (int)zf;
        *scale = sh;
        return;
    }
    mn = fminf(mn, 0.0f);
    mx = fmaxf(mx, 0.0f);
    if (sym) {
        mx = fmaxf(-mn, mx);
        if (mn < 0) mn = -mx;
    }
    if (mn == 0.0f && mx == 0.0f) mn = -1.0f, mx = 1.0f;
    s = (mx - mn) / QK_MAXQ;
    uint16_t sh = __half_as_ushort(__float2half_rn(s));
    if ((sh & 0x7fff) == 0) sh = 1;
    s = __half2float(__ushort_as_half(sh));
    if (sym) {
        *zero = (QK_MAXQ + 1) / 2;
    } else {
        float zf = rintf(-mn / s);
        *zero = zf < 1 ? 1 : zf > QK_MAXQ ? QK_MAXQ : (int)zf;
    }
    *scale = sh;
}

/* quant_q (src/core/int4.h). */
__device__ __forceinline__ int qk_q(float w, float s, int z) {
    float v = s != 0.0f ? rintf(w / s) + (float)z : (float)z;
    return v < 0.0f ? 0 : v > (float)QK_MAXQ ? QK_MAXQ : (int)v;
}

/* Sum over the block in fp64 (blockDim.x a multiple of 32, every thread calls it): the
 * twins sum losses in double, and a float per block loses what the AWQ grid compares. */
__device__ __forceinline__ double qk_block_sum(double v, double *red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__global__ void qk_mirror(float *h, int k) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)k * k) return;
    int i = (int)(idx / k), j = (int)(idx % k);
    if (j < i) h[idx] = h[(int64_t)j * k + i];
}

/* A block sums 32 columns: its 8 warps take every 8th row, so a warp reads 32 neighbours
 * of one row; the 8 partial sums are added in a fixed order. */
__global__ void qk_abs_mean_acc(const void *x, llmi_dtype dt, int n, int k, float scale, float *m) {
    __shared__ float part[8][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < k)
        for (int t = threadIdx.y; t < n; t += 8) acc += fabsf(llmi_load(x, dt, (int64_t)t * k + c));
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < k) {
        float sum = 0.0f;
        for (int w = 0; w < 8; w++) sum += part[w][threadIdx.x];
        m[c] += sum * scale;
    }
}

cudaError_t llmi_cuda_quant_abs_mean_acc(const void *x, llmi_dtype dt, int n, int k, float scale, float *m,
                                         cudaStream_t s) {
    if (n <= 0 || k <= 0) return cudaSuccess;
    qk_abs_mean_acc<<<(unsigned)((k + 31) / 32), dim3(32, 8), 0, s>>>(x, dt, n, k, scale, m);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

cudaError_t llmi_cuda_quant_mirror(float *h, int k, cudaStream_t s) {
    int64_t n = (int64_t)k * k;
    qk_mirror<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(h, k);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* Rows of a by blockIdx.y (grid-strided past 65535): no 64-bit division per element. */
__global__ void qk_hinv_fill(const float *h, float h_scale, const int32_t *perm, const uint8_t *dead, int n,
                             double damp, double *a) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const int pj = perm[n - 1 - j];
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        const int pi = perm[n - 1 - i];
        double v = h_scale * h[(int64_t)pi * n + pj];
        if (i == j) v = (dead[pi] ? 1.0 : v) + damp;
        a[(int64_t)i * n + j] = v;
    }
}

cudaError_t llmi_cuda_quant_hinv_fill(const float *h, float h_scale, const int32_t *perm, const uint8_t *dead, int n,
                                      double damp, double *a, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    const dim3 grid((unsigned)((n + 255) / 256), (unsigned)(n < 65535 ? n : 65535));
    qk_hinv_fill<<<grid, 256, 0, s>>>(h, h_scale, perm, dead, n, damp, a);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* X column-major: X(r, c) = x[r + c n]; u(i, j) = X(n-1-i, n-1-j), zero below the diagonal. */
__global__ void qk_hinv_upper(const double *x, int n, float *u) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)n * n) return;
    int i = (int)(idx / n), j = (int)(idx % n);
    u[idx] = j < i ? 0.0f : (float)x[(int64_t)(n - 1 - i) + (int64_t)(n - 1 - j) * n];
}

cudaError_t llmi_cuda_quant_hinv_upper(const double *x, int n, float *u, cudaStream_t s) {
    int64_t nn = (int64_t)n * n;
    qk_hinv_upper<<<(unsigned)((nn + 255) / 256), 256, 0, s>>>(x, n, u);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

__global__ void qk_gptq_load(const float *w, const int32_t *perm, const uint8_t *dead, int rows, int cols, float *wt) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)rows * cols) return;
    int i = (int)(idx / rows), r = (int)(idx % rows);   /* wt[i][r]: consecutive threads, consecutive r */
    int c = perm[i];
    wt[idx] = dead[c] ? 0.0f : w[(int64_t)r * cols + c];
}

cudaError_t llmi_cuda_gptq_load(const float *w, const int32_t *perm, const uint8_t *dead, int rows, int cols, float *wt,
                                cudaStream_t s) {
    int64_t n = (int64_t)rows * cols;
    qk_gptq_load<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(w, perm, dead, rows, cols, wt);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* One thread per row walks the block's columns in order (rows are independent given U).
 * The block's columns of the CTA's rows sit in shared memory (wb, one column of it per
 * thread): the walk's ~nb^2/2 read-modify-writes per row are then shared-memory latency,
 * not L2's.  U's rows are the same for every thread and come through the read-only cache.
 * Columns past i2 that a group reaches are read from wt, as the lazy updates left them;
 * the block's own columns are not written back (nothing reads them again). */
#define QK_WALK_THREADS 64
#define QK_WALK_MAX_BLOCK 128
__global__ void __launch_bounds__(QK_WALK_THREADS)
qk_gptq_block(const float *wt, const float *__restrict__ u, int rows, int cols, int i1, int i2, int gs, int sym,
              const int32_t *perm, uint8_t *q, uint16_t *scales, uint8_t *zeros, float *et, float *s_row,
              int32_t *z_row, double *loss) {
    __shared__ float wb[QK_WALK_MAX_BLOCK * QK_WALK_THREADS];   /* (i2 - i1, threads) */
    __shared__ double red[32];
    const int t = threadIdx.x, r = blockIdx.x * QK_WALK_THREADS + t;
    double acc = 0.0;
    if (r < rows) {
        for (int j = i1; j < i2; j++) wb[(j - i1) * QK_WALK_THREADS + t] = wt[(int64_t)j * rows + r];
        float s = s_row[r];
        int z = z_row[r];
        for (int i = i1; i < i2; i++) {
            const float *ui = u + (int64_t)i * cols;
            if (i % gs == 0) {
                float mn = wb[(i - i1) * QK_WALK_THREADS + t], mx = mn;
                for (int k = i + 1; k < i + gs; k++) {
                    float v = k < i2 ? wb[(k - i1) * QK_WALK_THREADS + t] : wt[(int64_t)k * rows + r];
                    mn = fminf(mn, v), mx = fmaxf(mx, v);
                }
                uint16_t sh;
                qk_range_params(mn, mx, sym, 0, &sh, &z);
                scales[(int64_t)(i / gs) * rows + r] = sh;
                zeros[(int64_t)(i / gs) * rows + r] = (uint8_t)z;
                s = __half2float(__ushort_as_half(sh));
            }
            float w = wb[(i - i1) * QK_WALK_THREADS + t];
            int qi = qk_q(w, s, z);
            q[(int64_t)r * cols + perm[i]] = (uint8_t)qi;
            float e = (w - s * (float)(qi - z)) / __ldg(ui + i);
            acc += (double)e * e;
            et[(int64_t)(i - i1) * rows + r] = e;
            for (int j = i + 1; j < i2; j++) wb[(j - i1) * QK_WALK_THREADS + t] -= e * __ldg(ui + j);
        }
        s_row[r] = s;
        z_row[r] = z;
    }
    double blk = qk_block_sum(acc, red);
    if (t == 0) atomicAdd(loss, blk);
}

cudaError_t llmi_cuda_gptq_block(const float *wt, const float *u, int rows, int cols, int i1, int i2, int group_size,
                                 int sym, const int32_t *perm, uint8_t *q, uint16_t *scales, uint8_t *zeros, float *et,
                                 float *s_row, int32_t *z_row, double *loss, cudaStream_t s) {
    if (i2 - i1 > QK_WALK_MAX_BLOCK || i2 <= i1) return cudaErrorInvalidValue;
    qk_gptq_block<<<(unsigned)((rows + QK_WALK_THREADS - 1) / QK_WALK_THREADS), QK_WALK_THREADS, 0, s>>>(
        wt, u, rows, cols, i1, i2, group_size, sym, perm, q, scales, zeros, et, s_row, z_row, loss);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* One thread per position i, selected rows by blockIdx.y (grid-strided past 65535). */
__global__ void qk_err_rows(const float *w, const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                            const int32_t *perm, int rows, int cols, int gs, int stride, int n_sel, float *out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    const int c = perm ? perm[i] : i;
    const int64_t g = i / gs;
    for (int j = blockIdx.y; j < n_sel; j += gridDim.y) {
        const int64_t r = (int64_t)j * stride;
        const float wv = w[r * cols + c], sv = __half2float(__ushort_as_half(scales[g * rows + r]));
        out[(int64_t)j * cols + c] = wv - sv * (float)((int)q[r * cols + c] - (int)zeros[g * rows + r]);
        out[(int64_t)(n_sel + j) * cols + c] = wv;
    }
}

cudaError_t llmi_cuda_quant_err_rows(const float *w, const uint8_t *q, const uint16_t *scales, const uint8_t *zeros,
                                     const int32_t *perm, int rows, int cols, int gs, int stride, int n_sel,
                                     float *out, cudaStream_t s) {
    if (n_sel <= 0 || cols <= 0) return cudaSuccess;
    const dim3 grid((unsigned)((cols + 255) / 256), (unsigned)(n_sel < 65535 ? n_sel : 65535));
    qk_err_rows<<<grid, 256, 0, s>>>(w, q, scales, zeros, perm, rows, cols, gs, stride, n_sel, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* One thread per (row, group): awq_fake_quant of the scaled weights, divided back. */
__global__ void qk_awq_err(const float *w, const float *sc, int rows, int cols, int gs, float *d) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int ng = cols / gs;
    if (idx >= (int64_t)rows * ng) return;
    int r = (int)(idx / ng), g = (int)(idx % ng);
    const float *wr = w + (int64_t)r * cols + (int64_t)g * gs;
    const float *sg = sc + (int64_t)g * gs;
    float mn = wr[0] * sg[0], mx = mn;
    for (int k = 1; k < gs; k++) {
        float v = wr[k] * sg[k];
        mn = fminf(mn, v), mx = fmaxf(mx, v);
    }
    uint16_t sh;
    int z;
    qk_range_params(mn, mx, 0, 1, &sh, &z);
    float s = __half2float(__ushort_as_half(sh));
    float *dr = d + (int64_t)r * cols + (int64_t)g * gs;
    for (int k = 0; k < gs; k++) {
        float v = wr[k] * sg[k];
        dr[k] = wr[k] - s * (float)(qk_q(v, s, z) - z) / sg[k];
    }
}

cudaError_t llmi_cuda_awq_fake_quant_err(const float *w, const float *sc, int rows, int cols, int gs, float *d,
                                         cudaStream_t s) {
    int64_t n = (int64_t)rows * (cols / gs);
    qk_awq_err<<<(unsigned)((n + 127) / 128), 128, 0, s>>>(w, sc, rows, cols, gs, d);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* AWQ's clipping search: a block per (group, QK_CLIP_ROWS rows) holds the group's H block
 * in shared memory; each warp takes a row at a time, its lanes the group's columns k = lane,
 * lane + 32, ...; d goes through shared memory so each lane can form its columns' (H d)_a. */
#define QK_CLIP_WARPS 4
#define QK_CLIP_ROWS 16
static size_t qk_clip_smem(int gs) { return ((size_t)gs * gs + (size_t)QK_CLIP_WARPS * gs) * sizeof(float); }

__global__ void __launch_bounds__(32 * QK_CLIP_WARPS)
qk_awq_clip(const float *w, int rows, int cols, const float *hb, int gs, int n_shrink, float *best_mv) {
    extern __shared__ __align__(16) float csm[];
    float *hg = csm, *dw = csm + (size_t)gs * gs + (size_t)(threadIdx.x >> 5) * gs;   /* (gs, gs) | (warps, gs) */
    const int g = blockIdx.x, ng = cols / gs, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < gs * gs; i += blockDim.x) hg[i] = hb[(int64_t)g * gs * gs + i];
    __syncthreads();
    const int r_end = min(rows, (int)(blockIdx.y + 1) * QK_CLIP_ROWS);
    for (int r = (int)blockIdx.y * QK_CLIP_ROWS + warp; r < r_end; r += QK_CLIP_WARPS) {
        const float *x = w + (int64_t)r * cols + (int64_t)g * gs;
        float amax = 0.0f;
        for (int k = lane; k < gs; k += 32) amax = fmaxf(amax, fabsf(x[k]));
        amax = llmi_warp_max(amax);
        double best = INFINITY;
        float best_v = amax;
        for (int i = 0; i < n_shrink; i++) {
            const float mv = amax * (1.0f - (float)i / 20.0f);
            float mn = INFINITY, mx = -INFINITY;
            for (int k = lane; k < gs; k += 32) {
                const float c = fminf(fmaxf(x[k], -mv), mv);
                mn = fminf(mn, c), mx = fmaxf(mx, c);
            }
            mn = -llmi_warp_max(-mn);   /* the warp's min, exactly */
            mx = llmi_warp_max(mx);
            uint16_t sh;
            int z;
            qk_range_params(mn, mx, 0, 1, &sh, &z);
            const float sc = __half2float(__ushort_as_half(sh));
            __syncwarp();   /* every lane is done reading the previous candidate's d */
            for (int k = lane; k < gs; k += 32) {
                const float c = fminf(fmaxf(x[k], -mv), mv);
                dw[k] = x[k] - sc * (float)(qk_q(c, sc, z) - z);
            }
            __syncwarp();
            double part = 0.0;
            /* H is symmetric: (H d)_a read down column a, so the lanes' reads are consecutive
             * words (row a would put all 32 on one bank at gs 128) */
            for (int a = lane; a < gs; a += 32) {
                double t = 0.0;
                for (int b = 0; b < gs; b++) t += (double)hg[b * gs + a] * dw[b];
                part += t * dw[a];
            }
            for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (part < best) best = part, best_v = mv;
        }
        if (lane == 0) best_mv[(int64_t)r * ng + g] = best_v;
    }
}

cudaError_t llmi_cuda_awq_clip_init(int gs) {
    if (gs <= 0 || gs > LLMI_AWQ_CLIP_MAX_GS) return cudaErrorInvalidValue;
    const size_t bytes = qk_clip_smem(gs);
    if (bytes <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(qk_awq_clip, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

cudaError_t llmi_cuda_awq_clip_search(const float *w, int rows, int cols, const float *hb, int gs, int n_shrink,
                                      float *best_mv, cudaStream_t s) {
    if (rows <= 0) return cudaSuccess;
    if (gs <= 0 || gs > LLMI_AWQ_CLIP_MAX_GS || cols % gs != 0) return cudaErrorInvalidValue;
    const int row_blocks = (rows + QK_CLIP_ROWS - 1) / QK_CLIP_ROWS;
    if (row_blocks > 65535) return cudaErrorInvalidValue;
    qk_awq_clip<<<dim3((unsigned)(cols / gs), (unsigned)row_blocks), 32 * QK_CLIP_WARPS, qk_clip_smem(gs), s>>>(
        w, rows, cols, hb, gs, n_shrink, best_mv);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

__global__ void qk_dot(const float *a, const float *b, size_t n, double *out) {
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (double)a[i] * b[i];
    __shared__ double red[32];
    double blk = qk_block_sum(acc, red);
    if (threadIdx.x == 0) atomicAdd(out, blk);
}

cudaError_t llmi_cuda_quant_dot(const float *a, const float *b, size_t n, double *out, cudaStream_t s) {
    cudaError_t e = cudaMemsetAsync(out, 0, sizeof(double), s);
    if (e != cudaSuccess) return e;
    if (n == 0) return cudaSuccess;
    const size_t blocks = (n + 255) / 256;   /* at most 1024, each thread then striding */
    qk_dot<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, s>>>(a, b, n, out);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
