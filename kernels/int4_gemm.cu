/* int4_gemm.cu — owns the W4A16 kernels for LLMI_I4G (GPTQ/AWQ) weights: a GEMV for up to
 * LLMI_I4_GEMV_MAX_N tokens a pass (decode and small batches), a tensor-core kernel for
 * LLMI_I4_MMA_MIN_N to LLMI_I4_MMA_MAX_N tokens a pass, and dequantization to a dense
 * matrix (prefill's cuBLASLt path, and load).  Layouts and
 * semantics: int4_gemm.h; CPU twin cpu_matmul on LLMI_I4G. */
#include <cuda_fp16.h>
#include "common.cuh"
#include "int4_gemm.h"


/* Scale and zero of (row, input column k). */
__device__ __forceinline__ void i4_group(const llmi_i4g_dev &w, int row, int k, float *s, int *z) {
    int g = w.g_idx ? w.g_idx[k] : k / w.group_size;
    *s = __half2float(__ushort_as_half(w.scales[(size_t)g * w.rows + row]));
    *z = w.zeros[(size_t)g * w.rows + row];
}

/* Activations of token t, columns k..k+7 (k a multiple of 8), as fp32: two 16-byte loads
 * (fp32) or one (bf16); x rows are cols long, cols a multiple of 8, so each load is aligned
 * when the buffer is. */
template <typename XT>
__device__ __forceinline__ void i4_load_x8(const XT *x, int64_t off, float v[8]);
template <>
__device__ __forceinline__ void i4_load_x8<float>(const float *x, int64_t off, float v[8]) {
    float4 a = *(const float4 *)(x + off), b = *(const float4 *)(x + off + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <>
__device__ __forceinline__ void i4_load_x8<__nv_bfloat16>(const __nv_bfloat16 *x, int64_t off, float v[8]) {
    llmi_bf16x8_f32(*(const uint4 *)(x + off), v);
}

/* (float)(q - z) for a nibble q and zero z, exact: 0x4B400000 is 1.5 * 2^23, whose last
 * mantissa bits hold a small signed integer as is; one integer add and one float add where
 * an int-to-float conversion would run at a quarter of the FMA rate. */
__device__ __forceinline__ float i4_centered(uint32_t q, int zbias) {
    return __int_as_float((int)q + zbias) - 12582912.0f;
}

/* The 8 columns c*8 .. c*8+7 of a row from their u32 of nibbles: v[j] = (q - z) exactly and
 * the group's scale returned, to be applied once; with g_idx (act order: a group per column)
 * v[j] = scale * (q - z) already, as i4_group gives it, and 1 is returned.  gshift: words
 * per group as a shift, or -1 to divide. */
__device__ __forceinline__ float i4_word(const llmi_i4g_dev &w, int row, int c, uint32_t word, int gshift,
                                         float v[8]) {
    if (!w.g_idx) {
        int g = gshift >= 0 ? c >> gshift : c / (w.group_size / 8);
        int zbias = 0x4B400000 - (int)w.zeros[(size_t)g * w.rows + row];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = i4_centered((word >> (4 * j)) & 15u, zbias);
        return __half2float(__ushort_as_half(w.scales[(size_t)g * w.rows + row]));
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float s;
        int z;
        i4_group(w, row, c * 8 + j, &s, &z);
        v[j] = __fmul_rn(s, i4_centered((word >> (4 * j)) & 15u, 0x4B400000 - z));
    }
    return 1.0f;
}

/* A GEMV's start: its NT x R sums zeroed, and its R rows from row0 (a missing last row
 * repeats the one before, unstored) with their packed nibbles as V (u32 or 16-byte) words. */
template <int NT, int R, typename V>
__device__ __forceinline__ void i4_gemv_begin(const llmi_i4g_dev &w, int row0, float (&acc)[NT][R], int (&rows)[R],
                                              const V *(&qr)[R]) {
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[t][r] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = min(row0 + r, w.rows - 1);
        qr[r] = (const V *)(w.q + (size_t)rows[r] * (w.cols / 2));
    }
}

/* A GEMV's inner step: acc[t][r] += sc[r] * sum_j x[t][8 cw + j] * wq[r][j] for the n <= NT
 * real tokens, each activation load serving all R rows. */
template <int NT, int R, typename XT>
__device__ __forceinline__ void i4_gemv_word(const XT *x, int cols, int n, int cw, const float (&wq)[R][8],
                                             const float (&sc)[R], float (&acc)[NT][R]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
        float xv[8];
        i4_load_x8<XT>(x, (int64_t)t * cols + (int64_t)cw * 8, xv);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float part = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) part = fmaf(xv[j], wq[r][j], part);
            acc[t][r] = fmaf(sc[r], part, acc[t][r]);
        }
    }
}

#define I4_GEMV_ROWS 2    /* output rows per warp: each activation load serves both */
#define I4_GEMV_UNROLL 4  /* u32 words per lane and row loaded before the first is used */

/* The decode GEMV for NT tokens: a warp owns I4_GEMV_ROWS output rows; each lane takes one
 * u32 of nibbles (8 input columns) per row and step, I4_GEMV_UNROLL steps' words loaded
 * together, so the weights are read from memory exactly once, 128 contiguous bytes per warp
 * and row.  Without g_idx the 8 columns share one group (group_size % 8 == 0): the scale is
 * applied once per word to the sum of x * (q - z), each (q - z) exact.  With g_idx (act
 * order) every column has its own group, as in i4_group. */
template <int NT, typename XT>
__global__ void __launch_bounds__(256) llmi_int4_gemv_kernel(llmi_i4g_dev w, const XT *x, int n, int gshift,
                                                             const float *bias, float *y, int ldy) {
    const int lane = threadIdx.x % 32;
    const int row0 = (int)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * I4_GEMV_ROWS;
    if (row0 >= w.rows) return;
    const int nwords = w.cols / 8;
    float acc[NT][I4_GEMV_ROWS];
    int rows[I4_GEMV_ROWS];
    const uint32_t *qr[I4_GEMV_ROWS];
    i4_gemv_begin(w, row0, acc, rows, qr);
    for (int base = 0; base < nwords; base += 32 * I4_GEMV_UNROLL) {
        uint32_t word[I4_GEMV_UNROLL][I4_GEMV_ROWS];
#pragma unroll
        for (int u = 0; u < I4_GEMV_UNROLL; u++) {
            int c = base + u * 32 + lane;
#pragma unroll
            for (int r = 0; r < I4_GEMV_ROWS; r++) word[u][r] = c < nwords ? __ldg(qr[r] + c) : 0u;
        }
#pragma unroll
        for (int u = 0; u < I4_GEMV_UNROLL; u++) {
            int c = base + u * 32 + lane;
            if (c >= nwords) break;
            float wq[I4_GEMV_ROWS][8], sc[I4_GEMV_ROWS];
#pragma unroll
            for (int r = 0; r < I4_GEMV_ROWS; r++) sc[r] = i4_word(w, rows[r], c, word[u][r], gshift, wq[r]);
            i4_gemv_word(x, w.cols, n, c, wq, sc, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n) break;
#pragma unroll
        for (int r = 0; r < I4_GEMV_ROWS; r++) {
            float v = llmi_warp_sum(acc[t][r]);
            int row = row0 + r;
            if (lane == 0 && row < w.rows) y[(size_t)t * ldy + row] = v + (bias ? bias[row] : 0.0f);
        }
    }
}

/* The GEMV for rows of whole 16-byte chunks (cols % 32 == 0, q 16-byte aligned): a block of
 * I4C_THREADS threads owns I4C_ROWS output rows and splits their columns, thread t taking
 * chunks t, t + I4C_THREADS, ... of 32 columns (4 words), I4C_UNROLL chunks a row loaded
 * before the first is used.  Against the warp kernel above: one 16-byte load where that
 * takes four 4-byte ones, and a grid of rows / 2 blocks whatever the width, so a
 * 1024-row k/v projection still fills every SM and each SM holds ~4x the bytes in flight
 * (the warp kernel reached ~0.8 TB/s of packed weights on an H200 at one token,
 * 2026-11-27).  With groups of 32 columns or more (gshift >= 2) a chunk's 4 words share
 * one group: its scale and zero are read once a chunk, and (q - z) takes three
 * instructions a nibble.  Partial sums: warp shuffles, then
 * shared memory across the block's warps. */
#define I4C_THREADS 128
#define I4C_ROWS 2
#define I4C_UNROLL 2
template <int NT, typename XT>
__global__ void __launch_bounds__(I4C_THREADS) llmi_int4_gemv_chunk_kernel(llmi_i4g_dev w, const XT *x, int n,
                                                                         int gshift, const float *bias, float *y,
                                                                         int ldy) {
    __shared__ float partial[I4C_THREADS / 32][NT][I4C_ROWS];   /* a warp's sums */
    const int row0 = blockIdx.x * I4C_ROWS, nchunks = w.cols / 32;
    const bool chunk_group = !w.g_idx && gshift >= 2;
    float acc[NT][I4C_ROWS];
    int rows[I4C_ROWS];
    const uint4 *qr[I4C_ROWS];
    i4_gemv_begin(w, row0, acc, rows, qr);
    for (int base = threadIdx.x; base < nchunks; base += I4C_THREADS * I4C_UNROLL) {
        uint4 chunk[I4C_UNROLL][I4C_ROWS];
        llmi_gemv_load<I4C_UNROLL, I4C_ROWS, I4C_THREADS>(qr, base, nchunks, chunk);
#pragma unroll
        for (int u = 0; u < I4C_UNROLL; u++) {
            const int c = base + u * I4C_THREADS;
            if (c >= nchunks) break;
            float sc[I4C_ROWS], zoff[I4C_ROWS];
            if (chunk_group) {
                const int g = (c * 4) >> gshift;
#pragma unroll
                for (int r = 0; r < I4C_ROWS; r++) {
                    sc[r] = __half2float(__ushort_as_half(w.scales[(size_t)g * w.rows + rows[r]]));
                    zoff[r] = 8388608.0f + (float)w.zeros[(size_t)g * w.rows + rows[r]];
                }
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int cw = c * 4 + k;   /* the word: columns cw*8 .. cw*8+7 */
                float wq[I4C_ROWS][8];
#pragma unroll
                for (int r = 0; r < I4C_ROWS; r++) {
                    const uint32_t word = k == 0 ? chunk[u][r].x : k == 1 ? chunk[u][r].y : k == 2 ? chunk[u][r].z
                                                                                                   : chunk[u][r].w;
                    if (chunk_group) {
                        /* 2^23 + q, its bits one AND-OR (lop3) of the shifted word, minus
                         * 2^23 + z: (q - z) exactly in three instructions, not i4_centered's four */
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            wq[r][j] = __uint_as_float(0x4B000000u | ((word >> (4 * j)) & 15u)) - zoff[r];
                    } else {
                        sc[r] = i4_word(w, rows[r], cw, word, gshift, wq[r]);
                    }
                }
                i4_gemv_word(x, w.cols, n, cw, wq, sc, acc);
            }
        }
    }
    llmi_gemv_finish<NT, I4C_ROWS, I4C_THREADS>(acc, partial, n, row0, w.rows, bias, y, ldy);
}

/* ---- tensor cores: LLMI_I4_MMA_MIN_N to LLMI_I4_MMA_MAX_N tokens a pass ----
 * At 16 tokens the GEMVs spend ~16 fp32 FMAs and as many activation loads a weight (the warp
 * kernel took 30.4 ms a step for an int4 llama-3-8b at batch 16 on the H200); mma.sync
 * m16n8k16 does a 16 x 16 x 8 product in one instruction.  A block of I4M_WARPS warps owns
 * 16 output rows (M) and splits their columns (K) in segments of 64; the tokens are N, in
 * tiles of 8.  The A fragment (PTX ISA, "matrix fragments for mma.m16n8k16": g = lane / 4,
 * t = lane % 4; rows g and g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9 of each 16) is
 * (q - z) as bf16, exact for |q - z| <= 16, so the products are exact and only the fp32
 * sums round; each group's sums are scaled once (group_size % 16 == 0: a 16-column step
 * never straddles two groups).  Lane t loads bytes 8t..8t+7 of a row's 32-byte segment,
 * which are the 16 columns of step t; each step's 4 lanes of a row trade them by shuffles. */
#define I4M_WARPS 8
#define PTX_T "bf16"
/* (the emulation of CUDA rewrites this exact statement, in the form attention.cu has it) */
__device__ __forceinline__ void i4_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_T "." PTX_T ".f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#undef PTX_T

/* bf16 (q_lo - z, q_hi - z) of byte b's two nibbles (lo: the lower column, in the low half),
 * exact: 2^23 + q minus 2^23 + z in fp32, then one conversion of the pair. */
__device__ __forceinline__ uint32_t i4_pair_bf16(uint32_t b, float zoff) {
    const float lo = __uint_as_float(0x4B000000u | (b & 15u)) - zoff;
    const float hi = __uint_as_float(0x4B000000u | ((b >> 4) & 15u)) - zoff;
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* A group's sums into the totals, scaled (rows g: sa, g + 8: sb, in C's fragment layout),
 * and zeroed for the next group. */
template <int NTILE>
__device__ __forceinline__ void i4_mma_flush(float sa, float sb, float (&part)[NTILE][4], float (&acc)[NTILE][4]) {
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++) {
        acc[nt][0] = fmaf(sa, part[nt][0], acc[nt][0]), acc[nt][1] = fmaf(sa, part[nt][1], acc[nt][1]);
        acc[nt][2] = fmaf(sb, part[nt][2], acc[nt][2]), acc[nt][3] = fmaf(sb, part[nt][3], acc[nt][3]);
#pragma unroll
        for (int i = 0; i < 4; i++) part[nt][i] = 0.0f;
    }
}

/* The end of both tensor-core kernels: each warp's C fragments (rows g, g + 8; tokens 2t,
 * 2t + 1 of each tile of 8) into shared memory, then their sum over the WARPS warps (and the
 * bias) into y for the real tokens and rows. */
template <int NTILE, int WARPS>
__device__ __forceinline__ void i4_mma_store(const float (&acc)[NTILE][4], float (&partial)[WARPS][NTILE * 8][16],
                                             int row0, int n, int rows, const float *bias, float *y, int ldy) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++) {
        partial[warp][nt * 8 + 2 * t][g] = acc[nt][0];
        partial[warp][nt * 8 + 2 * t + 1][g] = acc[nt][1];
        partial[warp][nt * 8 + 2 * t][g + 8] = acc[nt][2];
        partial[warp][nt * 8 + 2 * t + 1][g + 8] = acc[nt][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < NTILE * 8 * 16; i += 32 * WARPS) {
        const int tok = i / 16, r = i % 16, row = row0 + r;
        if (tok >= n || row >= rows) continue;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < WARPS; k++) v += partial[k][tok][r];
        y[(size_t)tok * ldy + row] = v + (bias ? bias[row] : 0.0f);
    }
}

template <int NTILE>
__global__ void __launch_bounds__(32 * I4M_WARPS) llmi_int4_mma_kernel(llmi_i4g_dev w, const __nv_bfloat16 *x, int n,
                                                                       const float *bias, float *y, int ldy) {
    __shared__ float partial[I4M_WARPS][NTILE * 8][16];   /* a warp's sums: (token, row of the block) */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    /* rows past the last repeat it, unstored; tokens past n repeat the last, unstored */
    const int ra = min(row0 + g, w.rows - 1), rb = min(row0 + g + 8, w.rows - 1);
    const uint2 *qa = (const uint2 *)(w.q + (size_t)ra * (w.cols / 2));
    const uint2 *qb = (const uint2 *)(w.q + (size_t)rb * (w.cols / 2));
    const uint32_t *xr[NTILE];   /* token rows, as bf16 pairs */
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++) xr[nt] = (const uint32_t *)(x + (size_t)min(nt * 8 + g, n - 1) * w.cols);
    float acc[NTILE][4], part[NTILE][4];
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = part[nt][i] = 0.0f;
    const int nseg = w.cols / 64;
    for (int base = warp; base < nseg; base += 2 * I4M_WARPS) {
        uint2 va[2], vb[2];   /* this segment and the warp's next, loaded together */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int seg = base + u * I4M_WARPS;
            va[u] = seg < nseg ? __ldg(qa + seg * 4 + t) : make_uint2(0, 0);
            vb[u] = seg < nseg ? __ldg(qb + seg * 4 + t) : make_uint2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int seg = base + u * I4M_WARPS;
            if (seg >= nseg) break;   /* (the same for the whole warp) */
            float sa = 0.0f, sb = 0.0f, za = 0.0f, zb = 0.0f;
            int group_end = 0;   /* the column after the current group: a division per group, not per step */
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const int k0 = seg * 64 + s * 16;
                if (s == 0 || k0 >= group_end) {
                    if (s != 0) i4_mma_flush(sa, sb, part, acc);   /* the group before ends here */
                    const int g = k0 / w.group_size;
                    group_end = (g + 1) * w.group_size;
                    const size_t gi = (size_t)g * w.rows;
                    sa = __half2float(__ushort_as_half(w.scales[gi + ra]));
                    sb = __half2float(__ushort_as_half(w.scales[gi + rb]));
                    za = 8388608.0f + (float)w.zeros[gi + ra];
                    zb = 8388608.0f + (float)w.zeros[gi + rb];
                }
                /* step s's 16 columns are lane s's 8 bytes (of this row group) */
                const int src = (lane & ~3) | s;
                const uint32_t a_lo = __shfl_sync(0xffffffffu, va[u].x, src);
                const uint32_t a_hi = __shfl_sync(0xffffffffu, va[u].y, src);
                const uint32_t b_lo = __shfl_sync(0xffffffffu, vb[u].x, src);
                const uint32_t b_hi = __shfl_sync(0xffffffffu, vb[u].y, src);
                const uint32_t afrag[4] = {i4_pair_bf16(a_lo >> (8 * t), za), i4_pair_bf16(b_lo >> (8 * t), zb),
                                           i4_pair_bf16(a_hi >> (8 * t), za), i4_pair_bf16(b_hi >> (8 * t), zb)};
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++) {
                    const uint32_t bfrag[2] = {__ldg(xr[nt] + (k0 + 2 * t) / 2), __ldg(xr[nt] + (k0 + 2 * t + 8) / 2)};
                    i4_mma(part[nt], afrag, bfrag);
                }
            }
            i4_mma_flush(sa, sb, part, acc);
        }
    }
    i4_mma_store<NTILE, I4M_WARPS>(acc, partial, row0, n, w.rows, bias, y, ldy);
}

/* ---- tensor cores with 16-byte loads: 1 to LLMI_I4_MMA_MAX_N tokens a pass, group sizes
 * that are multiples of 128 ----
 * The kernel above moves 8 bytes a lane and row, two segments in flight, 2 blocks an SM for a
 * 4096-row product: ~16 KiB in flight an SM where an H200's bandwidth wants ~30, so it is
 * latency-bound (1,596 tok/s for an int4 llama-3-8b at batch 16, 0.4 TB/s of packed weights;
 * batch 1 on the chunk GEMV, 1.2 TB/s).  Here a warp owns 16 rows and steps through their
 * columns 128 at a time (a block of I4T_WARPS warps splits the steps): lane (g, t) loads 16
 * bytes of row g and of row g + 8 (columns 32t .. 32t + 31 of the step), UNROLL steps
 * ahead, no shuffles.  A u32 of 8 nibbles (columns c .. c + 7) becomes four bf16 pairs by
 * one AND-OR each (0x4300 | q is 128 + q in bf16) and one bf16x2 subtraction of 128 + z:
 * (q0, q4), (q1, q5), (q2, q6), (q3, q7), each (q - z) exact.  The mma's k order is ours to
 * choose as long as x follows it: logical k 2t, 2t + 1 of an mma are columns c + j, c + j + 4
 * and k 2t + 8, 2t + 9 are c + j + 1, c + j + 5 (j = 0, then 2 for the word's second mma),
 * and x's pairs are made to match by PRMT.  A step's 128 columns lie in one group (group_size
 * % 128 == 0), so its sums are scaled once; tokens past n load no x (B is zero there). */
#define I4T_WARPS 8
__device__ __forceinline__ uint32_t i4t_pair(uint32_t word, uint32_t zpair) {
    uint32_t v = (word & 0x000F000Fu) | 0x43004300u;
    __nv_bfloat162 d = __hsub2(*(const __nv_bfloat162 *)&v, *(const __nv_bfloat162 *)&zpair);
    return *(uint32_t *)&d;
}

template <int NTILE, int UNROLL>
__global__ void __launch_bounds__(32 * I4T_WARPS) llmi_int4_tc_gemv_kernel(llmi_i4g_dev w, const __nv_bfloat16 *x,
                                                                           int n, int steps_per_group,
                                                                           const float *bias, float *y, int ldy) {
    __shared__ float partial[I4T_WARPS][NTILE * 8][16];   /* a warp's sums: (token, row of the block) */
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, nsteps = w.cols / 128;
    /* rows past the last repeat it, unstored */
    const int ra = min(row0 + g, w.rows - 1), rb = min(row0 + g + 8, w.rows - 1);
    const uint4 *qa = (const uint4 *)(w.q + (size_t)ra * (w.cols / 2));
    const uint4 *qb = (const uint4 *)(w.q + (size_t)rb * (w.cols / 2));
    const __nv_bfloat16 *xr[NTILE];   /* this lane's token of each tile, NULL past n */
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++) xr[nt] = nt * 8 + g < n ? x + (size_t)(nt * 8 + g) * w.cols : NULL;
    float acc[NTILE][4];
#pragma unroll
    for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
    for (int base = warp; base < nsteps; base += I4T_WARPS * UNROLL) {
        uint4 va[UNROLL], vb[UNROLL];
        float sa[UNROLL], sb[UNROLL];
        uint32_t za[UNROLL], zb[UNROLL];   /* 128 + z as a bf16 pair */
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int step = base + u * I4T_WARPS;
            va[u] = vb[u] = make_uint4(0, 0, 0, 0);
            sa[u] = sb[u] = 0.0f;
            za[u] = zb[u] = 0;
            if (step < nsteps) {
                va[u] = __ldg(qa + step * 4 + t);
                vb[u] = __ldg(qb + step * 4 + t);
                const size_t gi = (size_t)(step / steps_per_group) * w.rows;
                sa[u] = __half2float(__ushort_as_half(w.scales[gi + ra]));
                sb[u] = __half2float(__ushort_as_half(w.scales[gi + rb]));
                za[u] = (0x4300u | w.zeros[gi + ra]) * 0x10001u;
                zb[u] = (0x4300u | w.zeros[gi + rb]) * 0x10001u;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int step = base + u * I4T_WARPS;
            if (step >= nsteps) break;   /* (the same for the whole warp) */
            float part[NTILE][4];
#pragma unroll
            for (int nt = 0; nt < NTILE; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[nt][i] = 0.0f;
#pragma unroll
            for (int wd = 0; wd < 4; wd++) {
                const uint32_t wa = wd == 0 ? va[u].x : wd == 1 ? va[u].y : wd == 2 ? va[u].z : va[u].w;
                const uint32_t wb = wd == 0 ? vb[u].x : wd == 1 ? vb[u].y : wd == 2 ? vb[u].z : vb[u].w;
                const int c = step * 128 + t * 32 + wd * 8;   /* the word's first column */
                uint4 xv[NTILE];   /* x[c .. c + 7] of each tile's token: (x0 x1) (x2 x3) (x4 x5) (x6 x7) */
#pragma unroll
                for (int nt = 0; nt < NTILE; nt++)
                    xv[nt] = xr[nt] ? __ldg((const uint4 *)(xr[nt] + c)) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int h = 0; h < 2; h++) {   /* columns (c + 2h, c + 2h + 4) and (c + 2h + 1, c + 2h + 5) */
                    const uint32_t afrag[4] = {i4t_pair(wa >> (8 * h), za[u]), i4t_pair(wb >> (8 * h), zb[u]),
                                               i4t_pair(wa >> (8 * h + 4), za[u]), i4t_pair(wb >> (8 * h + 4), zb[u])};
#pragma unroll
                    for (int nt = 0; nt < NTILE; nt++) {
                        const uint32_t lo = h == 0 ? xv[nt].x : xv[nt].y, hi = h == 0 ? xv[nt].z : xv[nt].w;
                        const uint32_t bfrag[2] = {__byte_perm(lo, hi, 0x5410), __byte_perm(lo, hi, 0x7632)};
                        i4_mma(part[nt], afrag, bfrag);
                    }
                }
            }
            i4_mma_flush(sa[u], sb[u], part, acc);
        }
    }
    i4_mma_store<NTILE, I4T_WARPS>(acc, partial, row0, n, w.rows, bias, y, ldy);
}

/* NT: the tokens the kernel is compiled for; n <= NT of them are real.  The chunk kernel
 * where the shape allows it and w->kernel does not ask for the warp one. */
template <int NT>
static void i4_gemv_launch(const llmi_i4g_dev *w, const void *x, llmi_dtype x_dt, int n, int gshift, const float *bias,
                           float *y, int ldy, cudaStream_t s) {
    if (w->kernel != LLMI_I4_WARP && w->cols % 32 == 0 && (uintptr_t)w->q % 16 == 0) {
        const int blocks = llmi_div_up(w->rows, I4C_ROWS);
        if (x_dt == LLMI_BF16)
            llmi_int4_gemv_chunk_kernel<NT, __nv_bfloat16><<<blocks, I4C_THREADS, 0, s>>>(
                *w, (const __nv_bfloat16 *)x, n, gshift, bias, y, ldy);
        else
            llmi_int4_gemv_chunk_kernel<NT, float><<<blocks, I4C_THREADS, 0, s>>>(*w, (const float *)x, n, gshift,
                                                                                  bias, y, ldy);
        return;
    }
    int warps = llmi_div_up(w->rows, I4_GEMV_ROWS);
    if (x_dt == LLMI_BF16)
        llmi_int4_gemv_kernel<NT, __nv_bfloat16><<<llmi_div_up(warps, 8), 256, 0, s>>>(
            *w, (const __nv_bfloat16 *)x, n, gshift, bias, y, ldy);
    else
        llmi_int4_gemv_kernel<NT, float><<<llmi_div_up(warps, 8), 256, 0, s>>>(*w, (const float *)x, n, gshift,
                                                                               bias, y, ldy);
}

/* Grid (chunks of 8 columns in a row / 256 rounded up, min(rows, 65535)), rows strided by
 * gridDim.y: a thread turns 8 columns of a row into scale * (q - zero) each.  VEC (cols and
 * group_size multiples of 8, out 16-byte aligned: every linear the W4A16 kernels take) reads
 * them as one u32 of nibbles with one group and writes one or two 16-byte stores; otherwise
 * (an odd shape that load dequantizes once) column by column. */
template <bool VEC>
__global__ void llmi_int4_dequant_kernel(llmi_i4g_dev w, void *out, llmi_dtype out_dt, int gshift) {
    const int nchunks = (w.cols + 7) / 8, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= nchunks) return;
    for (int row = blockIdx.y; row < w.rows; row += gridDim.y) {
        const size_t off = (size_t)row * w.cols + (size_t)c * 8;
        if (!VEC) {
            for (int j = 0; j < 8 && c * 8 + j < w.cols; j++) {
                int k = c * 8 + j;
                uint8_t b = w.q[(size_t)row * (w.cols / 2) + k / 2];
                float sc;
                int z;
                i4_group(w, row, k, &sc, &z);
                llmi_store(out, out_dt, (int64_t)off + j, __fmul_rn(sc, i4_centered((k & 1) ? b >> 4 : b & 15u, 0x4B400000 - z)));
            }
            continue;
        }
        uint32_t word = __ldg((const uint32_t *)(w.q + (size_t)row * (w.cols / 2)) + c);
        float v[8];
        float sc = i4_word(w, row, c, word, gshift, v);   /* 1 with g_idx: v scaled already */
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = __fmul_rn(sc, v[j]);
        if (out_dt == LLMI_F32) {
            float4 *o = (float4 *)((float *)out + off);
            o[0] = make_float4(v[0], v[1], v[2], v[3]);
            o[1] = make_float4(v[4], v[5], v[6], v[7]);
        } else {
            uint32_t h[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint16_t lo, hi;
                if (out_dt == LLMI_BF16) {
                    lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i]));
                    hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1]));
                } else {
                    lo = __half_as_ushort(__float2half_rn(v[2 * i]));
                    hi = __half_as_ushort(__float2half_rn(v[2 * i + 1]));
                }
                h[i] = (uint32_t)lo | (uint32_t)hi << 16;
            }
            *(uint4 *)((uint16_t *)out + off) = make_uint4(h[0], h[1], h[2], h[3]);
        }
    }
}

/* Words per group as a shift when a power of two (32, 64, 128...), else -1: no division per word. */
static int i4_group_shift(const llmi_i4g_dev *w) {
    int wpg = w->group_size / 8, gshift = -1;
    if ((wpg & (wpg - 1)) == 0)
        for (gshift = 0; (1 << gshift) < wpg; gshift++) {}
    return gshift;
}

extern "C" cudaError_t llmi_cuda_int4_matmul(const llmi_i4g_dev *w, const void *x, llmi_dtype x_dt, int n,
                                             const float *bias, float *y, int ldy, cudaStream_t s) {
    if (n <= 0 || w->rows <= 0) return cudaSuccess;   /* (a grid of 0 blocks is a launch error) */
    if (w->cols % 8 != 0 || w->group_size <= 0 || w->group_size % 8 != 0 || ldy < w->rows ||
        (x_dt != LLMI_F32 && x_dt != LLMI_BF16))
        return cudaErrorInvalidValue;
    if ((uintptr_t)x % 16 != 0) return cudaErrorMisalignedAddress; /* 16-byte activation loads */
    if (w->kernel == LLMI_I4_AUTO && x_dt == LLMI_BF16 && !w->g_idx && w->cols % 128 == 0 &&
        w->group_size % 128 == 0 && (uintptr_t)w->q % 16 == 0) {
        const int blocks = llmi_div_up(w->rows, 16), spg = w->group_size / 128;
        for (int t0 = 0; t0 < n; t0 += LLMI_I4_MMA_MAX_N) {
            const int nt = n - t0 < LLMI_I4_MMA_MAX_N ? n - t0 : LLMI_I4_MMA_MAX_N;
            const __nv_bfloat16 *xt = (const __nv_bfloat16 *)x + (size_t)t0 * w->cols;
            float *yt = y + (size_t)t0 * ldy;
            /* fewer steps in flight at 32 tokens: its sums and x take the registers */
            if (nt <= 8) llmi_int4_tc_gemv_kernel<1, 4><<<blocks, 32 * I4T_WARPS, 0, s>>>(*w, xt, nt, spg, bias, yt, ldy);
            else if (nt <= 16) llmi_int4_tc_gemv_kernel<2, 4><<<blocks, 32 * I4T_WARPS, 0, s>>>(*w, xt, nt, spg, bias, yt, ldy);
            else llmi_int4_tc_gemv_kernel<4, 2><<<blocks, 32 * I4T_WARPS, 0, s>>>(*w, xt, nt, spg, bias, yt, ldy);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    if ((w->kernel == LLMI_I4_AUTO || w->kernel == LLMI_I4_MMA) && n >= LLMI_I4_MMA_MIN_N && x_dt == LLMI_BF16 && !w->g_idx && w->cols % 64 == 0 &&
        w->group_size % 16 == 0 && (uintptr_t)w->q % 8 == 0) {
        const int blocks = llmi_div_up(w->rows, 16);
        for (int t0 = 0; t0 < n; t0 += LLMI_I4_MMA_MAX_N) {
            const int nt = n - t0 < LLMI_I4_MMA_MAX_N ? n - t0 : LLMI_I4_MMA_MAX_N;
            const __nv_bfloat16 *xt = (const __nv_bfloat16 *)x + (size_t)t0 * w->cols;
            float *yt = y + (size_t)t0 * ldy;
            if (nt <= 8) llmi_int4_mma_kernel<1><<<blocks, 32 * I4M_WARPS, 0, s>>>(*w, xt, nt, bias, yt, ldy);
            else if (nt <= 16) llmi_int4_mma_kernel<2><<<blocks, 32 * I4M_WARPS, 0, s>>>(*w, xt, nt, bias, yt, ldy);
            else llmi_int4_mma_kernel<4><<<blocks, 32 * I4M_WARPS, 0, s>>>(*w, xt, nt, bias, yt, ldy);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    const int gshift = i4_group_shift(w);
    const size_t x_row = (size_t)w->cols * (x_dt == LLMI_BF16 ? 2 : 4);
    /* LLMI_I4_GEMV_MAX_N tokens per pass: each pass reads the weights once */
    for (int t0 = 0; t0 < n; t0 += LLMI_I4_GEMV_MAX_N) {
        const int nt = n - t0 < LLMI_I4_GEMV_MAX_N ? n - t0 : LLMI_I4_GEMV_MAX_N;
        const void *xt = (const char *)x + (size_t)t0 * x_row;
        float *yt = y + (size_t)t0 * ldy;
        /* compiled for 1, 2, 4, 8 and 16 tokens (each a few hundred KiB of machine code) */
        if (nt == 1) i4_gemv_launch<1>(w, xt, x_dt, nt, gshift, bias, yt, ldy, s);
        else if (nt == 2) i4_gemv_launch<2>(w, xt, x_dt, nt, gshift, bias, yt, ldy, s);
        else if (nt <= 4) i4_gemv_launch<4>(w, xt, x_dt, nt, gshift, bias, yt, ldy, s);
        else if (nt <= 8) i4_gemv_launch<8>(w, xt, x_dt, nt, gshift, bias, yt, ldy, s);
        else i4_gemv_launch<LLMI_I4_GEMV_MAX_N>(w, xt, x_dt, nt, gshift, bias, yt, ldy, s);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

extern "C" cudaError_t llmi_cuda_int4_dequant(const llmi_i4g_dev *w, void *out, llmi_dtype out_dt, cudaStream_t s) {
    if ((int64_t)w->rows * w->cols <= 0) return cudaSuccess;
    if (out_dt != LLMI_F32 && out_dt != LLMI_F16 && out_dt != LLMI_BF16) return cudaErrorInvalidValue;
    dim3 grid((unsigned)llmi_div_up((w->cols + 7) / 8, 256), (unsigned)(w->rows < 65535 ? w->rows : 65535));
    if (w->cols % 8 == 0 && w->group_size > 0 && w->group_size % 8 == 0 && (uintptr_t)out % 16 == 0)
        llmi_int4_dequant_kernel<true><<<grid, 256, 0, s>>>(*w, out, out_dt, i4_group_shift(w));
    else
        llmi_int4_dequant_kernel<false><<<grid, 256, 0, s>>>(*w, out, out_dt, -1);
    return cudaGetLastError();
}
