/* attention.cu — owns paged attention (twin: cpu_paged_attention).
 *
 * Two paths, chosen per sequence by llmi_cuda_attn_plan:
 *  - decode (and short query ranges): flash-decoding.  One block per (KV head, token,
 *    split) reads each KV tile once into shared memory and scores it against all the
 *    query heads of that KV head (GQA), with an online softmax; long contexts are split
 *    over positions and a combine pass merges the partial (m, l, o) triples.
 *  - prefill chunks: tiled causal flash-attention on tensor cores (wmma 16x16x16, bf16 or
 *    f16 inputs, fp32 accumulation).  One block per (64-token tile, query head); each of
 *    its 4 warps owns 16 query rows, so only the K/V tile loads need block barriers.
 * Both read K/V through the sequence's block table and mask positions > the token's own,
 * so prefill chunks and decode tokens can share one batch. */
#include <mma.h>
#include "common.cuh"

using namespace nvcuda;

#define DEC_T 32          /* KV positions per decode tile (one per lane in the softmax) */
#define DEC_THREADS 128

static __device__ __forceinline__ int64_t kv_index(const int32_t *bt, int block_size, int n_kv_heads, int head_dim,
                                                   int pos, int kvh) {
    int64_t blk = bt[pos / block_size];
    return ((blk * block_size + pos % block_size) * n_kv_heads + kvh) * (int64_t)head_dim;
}

/* Elements per 16-byte load of a KV row segment (8 for f16/bf16, 4 for f32), or 1 when
 * head_dim does not divide into them (then rows are not 16-byte aligned either) and for
 * q8/fp8, which are read element by element (llmi_kv_load). */
static __device__ __forceinline__ int kv_vec_width(llmi_kv_dtype dt, int hd) {
    if (dt == LLMI_KV_Q8 || dt == LLMI_KV_FP8) return 1;
    int w = dt == LLMI_KV_F32 ? 4 : 8;
    return hd % w == 0 ? w : 1;
}

/* The fp8 scale of KV head kvh (1 for the other dtypes, which carry no scale). */
static __device__ __forceinline__ float kv_scale_of(llmi_kv_dtype dt, const float *scale, int kvh) {
    return dt == LLMI_KV_FP8 && scale ? scale[kvh] : 1.0f;
}

/* dst[0 .. 16 bytes of elements) as fp32 <- cache[off ..], off a multiple of the width. */
static __device__ __forceinline__ void load_kv16(const void *cache, llmi_kv_dtype dt, int64_t off, float *dst) {
    if (dt == LLMI_KV_F32) {
        float4 v = *(const float4 *)((const float *)cache + off);
        dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
        return;
    }
    uint4 raw = *(const uint4 *)((const uint16_t *)cache + off);
    const unsigned short *h = (const unsigned short *)&raw;
#pragma unroll
    for (int j = 0; j < 8; j++)
        dst[j] = dt == LLMI_KV_BF16 ? __bfloat162float(__ushort_as_bfloat16(h[j])) : __half2float(__ushort_as_half(h[j]));
}

/* grid (n_kv_heads, n_tokens_listed, n_splits), block DEC_THREADS.  Shared (floats):
 * qs (G, hd) | ks (DEC_T, hd+1; padded so per-position dot products hit distinct banks)
 * | vs (DEC_T, hd) | S (G, DEC_T) | acc (G, hd) | m, l, alpha (G). */
__global__ void llmi_attn_decode_kernel(llmi_cuda_attn a, const int32_t *tokens, int n_splits, float *work) {
    extern __shared__ float sm[];
    const int hd = a.head_dim, G = a.n_heads / a.n_kv_heads, hdp = hd + 1;
    float *qs = sm, *ks = qs + G * hd, *vs = ks + DEC_T * hdp, *S = vs + DEC_T * hd, *acc = S + G * DEC_T;
    float *mrow = acc + G * hd, *lrow = mrow + G, *alpha = lrow + G;
    const int item = blockIdx.y, kvh = blockIdx.x, split = blockIdx.z;
    const int t = tokens[item];
    const int pos = a.positions[t];
    const int32_t *bt = a.block_tables + (int64_t)a.seq_of_token[t] * a.max_blocks_per_seq;
    const int h0 = kvh * G;
    /* each token splits its own context, so the launch does not depend on the batch's
     * longest one (a captured graph replays with any positions) */
    const int chunk = ((pos + n_splits) / n_splits + DEC_T - 1) / DEC_T * DEC_T;
    const int start = split * chunk, end = min(pos + 1, start + chunk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int vw = kv_vec_width(a.kv_dt, hd);
    const float ksc = kv_scale_of(a.kv_dt, a.k_scale, kvh), vsc = kv_scale_of(a.kv_dt, a.v_scale, kvh);

    for (int i = tid; i < G * hd; i += blockDim.x) {
        qs[i] = a.q[(int64_t)t * a.q_stride + (int64_t)h0 * hd + i];
        acc[i] = 0.0f;
    }
    for (int g = tid; g < G; g += blockDim.x) { mrow[g] = -INFINITY; lrow[g] = 0.0f; }
    __syncthreads();

    for (int t0 = start; t0 < end; t0 += DEC_T) {
        const int nt = min(DEC_T, end - t0);
        if (vw > 1) {   /* 16-byte loads: vw elements of a (position, head) row per thread */
            const int hv = hd / vw;
            for (int i = tid; i < nt * hv; i += blockDim.x) {
                int tt = i / hv, d = (i % hv) * vw;
                int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, t0 + tt, kvh) + d;
                load_kv16(a.k_cache, a.kv_dt, off, ks + tt * hdp + d);
                load_kv16(a.v_cache, a.kv_dt, off, vs + tt * hd + d);
            }
        } else {
            for (int i = tid; i < nt * hd; i += blockDim.x) {
                int tt = i / hd, d = i % hd;
                int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, t0 + tt, kvh) + d;
                ks[tt * hdp + d] = llmi_kv_load(a.k_cache, a.kv_dt, off) * ksc;
                vs[tt * hd + d] = llmi_kv_load(a.v_cache, a.kv_dt, off) * vsc;
            }
        }
        __syncthreads();
        for (int i = tid; i < G * DEC_T; i += blockDim.x) {
            int g = i / DEC_T, tt = i % DEC_T;
            if (tt >= nt) continue;
            const float *qg = qs + g * hd, *kt = ks + tt * hdp;
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += qg[d] * kt[d];
            S[i] = dot * a.scale;
        }
        __syncthreads();
        for (int g = warp; g < G; g += nw) {
            float s = lane < nt ? S[g * DEC_T + lane] : -INFINITY;
            float m_old = mrow[g];
            float m_new = fmaxf(m_old, llmi_warp_max(s));
            float p = lane < nt ? expf(s - m_new) : 0.0f;
            float sum = llmi_warp_sum(p);
            S[g * DEC_T + lane] = p;
            __syncwarp();   /* every lane has read mrow[g] before lane 0 overwrites it */
            if (lane == 0) {
                float al = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
                alpha[g] = al;
                lrow[g] = lrow[g] * al + sum;
                mrow[g] = m_new;
            }
        }
        __syncthreads();
        for (int i = tid; i < G * hd; i += blockDim.x) {
            int g = i / hd, d = i % hd;
            const float *pg = S + g * DEC_T;
            float o = acc[i] * alpha[g];
            for (int tt = 0; tt < nt; tt++) o += pg[tt] * vs[tt * hd + d];
            acc[i] = o;
        }
        __syncthreads();
    }

    if (n_splits == 1) {
        for (int i = tid; i < G * hd; i += blockDim.x) {
            int g = i / hd;
            float l = lrow[g];
            llmi_store(a.out, a.out_dt, (int64_t)t * a.out_stride + (int64_t)h0 * hd + i, l > 0 ? acc[i] / l : 0.0f);
        }
        return;
    }
    /* partials: o (items, n_heads, n_splits, hd) then (m, l) (items, n_heads, n_splits, 2) */
    const int64_t n_items = gridDim.y;
    float *wo = work, *wml = work + n_items * a.n_heads * n_splits * (int64_t)hd;
    for (int i = tid; i < G * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        wo[(((int64_t)item * a.n_heads + h0 + g) * n_splits + split) * hd + d] = acc[i];
    }
    for (int g = tid; g < G; g += blockDim.x) {
        int64_t j = (((int64_t)item * a.n_heads + h0 + g) * n_splits + split) * 2;
        wml[j] = mrow[g];
        wml[j + 1] = lrow[g];
    }
}

/* grid (n_heads, n_items), block 128: merges the split partials of one (token, head). */
__global__ void llmi_attn_combine_kernel(llmi_cuda_attn a, const int32_t *tokens, int n_splits, const float *work) {
    const int h = blockIdx.x, item = blockIdx.y, hd = a.head_dim;
    const int64_t n_items = gridDim.y;
    const float *wo = work + (((int64_t)item * a.n_heads + h) * n_splits) * hd;
    const float *wml = work + n_items * a.n_heads * n_splits * (int64_t)hd + ((int64_t)item * a.n_heads + h) * n_splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, wml[2 * s]);
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++) L += wml[2 * s] == -INFINITY ? 0.0f : expf(wml[2 * s] - M) * wml[2 * s + 1];
    const int t = tokens[item];
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < n_splits; s++)
            if (wml[2 * s] != -INFINITY) o += expf(wml[2 * s] - M) * wo[(int64_t)s * hd + d];
        llmi_store(a.out, a.out_dt, (int64_t)t * a.out_stride + (int64_t)h * hd + d, L > 0 ? o / L : 0.0f);
    }
}

static size_t decode_smem_bytes(int G, int hd) {
    return sizeof(float) * ((size_t)2 * G * hd + (size_t)DEC_T * (hd + 1) + (size_t)DEC_T * hd + (size_t)G * DEC_T +
                            3 * (size_t)G);
}

extern "C" size_t llmi_cuda_attn_work_floats(int n_decode, int n_heads, int head_dim, int n_splits) {
    if (n_splits <= 1) return 0;
    return (size_t)n_decode * n_heads * n_splits * ((size_t)head_dim + 2);
}

extern "C" int llmi_cuda_attn_splits(int n_decode, int n_kv_heads, int n_heads, int head_dim, int max_pos, int n_sms,
                                     size_t work_floats) {
    if (n_decode <= 0) return 1;
    long blocks = (long)n_decode * n_kv_heads;
    long target = 2L * (n_sms > 0 ? n_sms : 1);
    long splits = (target + blocks - 1) / blocks;
    long by_len = ((long)max_pos + 1 + 255) / 256;   /* a split under 256 positions costs more than it saves */
    if (splits > by_len) splits = by_len;
    if (splits > 64) splits = 64;
    if (splits < 1) splits = 1;
    while (splits > 1 && llmi_cuda_attn_work_floats(n_decode, n_heads, head_dim, (int)splits) > work_floats) splits--;
    return (int)splits;
}

extern "C" cudaError_t llmi_cuda_attn_decode(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits,
                                             float *work, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || n_splits < 1 || n > 65535) return cudaErrorInvalidValue;
    if (n_splits > 1 && !work) return cudaErrorInvalidValue;
    int G = a->n_heads / a->n_kv_heads;
    size_t smem = decode_smem_bytes(G, a->head_dim);   /* above 48 KiB needs llmi_cuda_attn_init first */
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)n, (unsigned)n_splits);
    llmi_attn_decode_kernel<<<grid, DEC_THREADS, smem, s>>>(*a, tokens, n_splits, work);
    LLMI_LAUNCH_CHECK();
    if (n_splits > 1) {
        llmi_attn_combine_kernel<<<dim3((unsigned)a->n_heads, (unsigned)n), 128, 0, s>>>(*a, tokens, n_splits, work);
        LLMI_LAUNCH_CHECK();
    }
    return cudaSuccess;
}

/* ---- prefill: tensor cores ---- */
#define PF_BQ LLMI_ATTN_TILE_Q   /* query rows per block (16 per warp) */
#define PF_BK 64                 /* KV positions per tile */
#define PF_WARPS 4

template <typename T> struct tc_conv;
template <> struct tc_conv<__nv_bfloat16> {
    static constexpr llmi_kv_dtype kv = LLMI_KV_BF16;   /* the cache dtype that is already T */
    static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <> struct tc_conv<__half> {
    static constexpr llmi_kv_dtype kv = LLMI_KV_F16;
    static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
};

struct pf_layout {
    int ldq, ldk, lds, ldp, ldo;                  /* leading dims in elements */
    size_t q_off, k_off, v_off, s_off, p_off, o_off, m_off, l_off, mp_off, bytes;
};

static __host__ __device__ size_t pf_align(size_t x) { return (x + 127) & ~(size_t)127; }

template <typename T> static __host__ __device__ pf_layout pf_make_layout(int hd) {
    pf_layout L;
    L.ldq = hd + 8; L.ldk = hd + 8; L.lds = PF_BK + 4; L.ldp = PF_BK + 8; L.ldo = hd + 4;
    size_t o = 0;
    L.q_off = o; o = pf_align(o + (size_t)PF_BQ * L.ldq * sizeof(T));
    L.k_off = o; o = pf_align(o + (size_t)PF_BK * L.ldk * sizeof(T));
    L.v_off = o; o = pf_align(o + (size_t)PF_BK * L.ldk * sizeof(T));
    L.s_off = o; o = pf_align(o + (size_t)PF_BQ * L.lds * sizeof(float));
    L.p_off = o; o = pf_align(o + (size_t)PF_BQ * L.ldp * sizeof(T));
    L.o_off = o; o = pf_align(o + (size_t)PF_BQ * L.ldo * sizeof(float));
    L.m_off = o; o = pf_align(o + PF_BQ * sizeof(float));
    L.l_off = o; o = pf_align(o + PF_BQ * sizeof(float));
    L.mp_off = o; o = pf_align(o + sizeof(int));
    L.bytes = o;
    return L;
}

/* grid (n_tiles, n_heads), block 32*PF_WARPS. */
template <typename T>
__global__ void __launch_bounds__(32 * PF_WARPS) llmi_attn_prefill_kernel(llmi_cuda_attn a, const int32_t *tiles) {
    extern __shared__ __align__(128) unsigned char smraw[];
    const int hd = a.head_dim;
    const pf_layout L = pf_make_layout<T>(hd);
    T *Qs = (T *)(smraw + L.q_off), *Ks = (T *)(smraw + L.k_off), *Vs = (T *)(smraw + L.v_off);
    float *Ss = (float *)(smraw + L.s_off), *Os = (float *)(smraw + L.o_off);
    T *Ps = (T *)(smraw + L.p_off);
    float *mrow = (float *)(smraw + L.m_off), *lrow = (float *)(smraw + L.l_off);
    int *max_pos_sh = (int *)(smraw + L.mp_off);

    const int t0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    const int h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int32_t *bt = a.block_tables + (int64_t)a.seq_of_token[t0] * a.max_blocks_per_seq;

    for (int i = tid; i < PF_BQ * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        float v = r < nq ? a.q[(int64_t)(t0 + r) * a.q_stride + (int64_t)h * hd + d] : 0.0f;
        Qs[r * L.ldq + d] = tc_conv<T>::from(v);
        Os[r * L.ldo + d] = 0.0f;
    }
    if (tid < PF_BQ) { mrow[tid] = -INFINITY; lrow[tid] = 0.0f; }
    if (warp == 0) {
        int mp = -1;
        for (int r = lane; r < nq; r += 32) mp = max(mp, a.positions[t0 + r]);
        for (int o = 16; o > 0; o >>= 1) mp = max(mp, __shfl_xor_sync(0xffffffffu, mp, o));
        if (lane == 0) *max_pos_sh = mp;
    }
    __syncthreads();
    const int max_pos = *max_pos_sh;
    const bool same_type = a.kv_dt == tc_conv<T>::kv;
    const float ksc = kv_scale_of(a.kv_dt, a.k_scale, kvh), vsc = kv_scale_of(a.kv_dt, a.v_scale, kvh);
    const int r0 = warp * 16;   /* this warp's first query row */

    for (int kv0 = 0; kv0 <= max_pos; kv0 += PF_BK) {
        __syncthreads();   /* every warp is done with the previous K/V tile */
        if (same_type) {   /* the cache already holds T: 16-byte copies (hd % 16 == 0) */
            const int hv = hd / 8;
            for (int i = tid; i < PF_BK * hv; i += blockDim.x) {
                int tt = i / hv, d = (i % hv) * 8, p = kv0 + tt;
                uint4 kr = make_uint4(0, 0, 0, 0), vr = make_uint4(0, 0, 0, 0);
                if (p <= max_pos) {
                    int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, p, kvh) + d;
                    kr = *(const uint4 *)((const uint16_t *)a.k_cache + off);
                    vr = *(const uint4 *)((const uint16_t *)a.v_cache + off);
                }
                *(uint4 *)(Ks + tt * L.ldk + d) = kr;
                *(uint4 *)(Vs + tt * L.ldk + d) = vr;
            }
        } else {
            for (int i = tid; i < PF_BK * hd; i += blockDim.x) {
                int tt = i / hd, d = i % hd, p = kv0 + tt;
                float kv = 0.0f, vv = 0.0f;
                if (p <= max_pos) {
                    int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, p, kvh) + d;
                    kv = llmi_kv_load(a.k_cache, a.kv_dt, off) * ksc;
                    vv = llmi_kv_load(a.v_cache, a.kv_dt, off) * vsc;
                }
                Ks[tt * L.ldk + d] = tc_conv<T>::from(kv);
                Vs[tt * L.ldk + d] = tc_conv<T>::from(vv);
            }
        }
        __syncthreads();
        if (r0 >= nq) continue;   /* warp-uniform: rows past the tile have nothing to do */

        /* S (16, PF_BK) = Q_w (16, hd) @ K^T */
        for (int j = 0; j < PF_BK / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::fill_fragment(c, 0.0f);
            for (int kk = 0; kk < hd; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Qs + r0 * L.ldq + kk, L.ldq);
                wmma::load_matrix_sync(fb, Ks + (16 * j) * L.ldk + kk, L.ldk);
                wmma::mma_sync(c, fa, fb, c);
            }
            wmma::store_matrix_sync(Ss + r0 * L.lds + 16 * j, c, L.lds, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax over this warp's rows; P in the input type, O rows rescaled */
        for (int i = 0; i < 16; i++) {
            int r = r0 + i;
            int pos_r = r < nq ? a.positions[t0 + r] : -1;
            float s0, s1;
            {
                int c0 = lane, c1 = lane + 32;
                s0 = kv0 + c0 <= pos_r ? Ss[r * L.lds + c0] * a.scale : -INFINITY;
                s1 = kv0 + c1 <= pos_r ? Ss[r * L.lds + c1] * a.scale : -INFINITY;
            }
            float m_old = mrow[r];
            float m_new = fmaxf(m_old, llmi_warp_max(fmaxf(s0, s1)));
            float p0 = 0.0f, p1 = 0.0f, al = 1.0f;
            if (m_new != -INFINITY) {
                p0 = expf(s0 - m_new);
                p1 = expf(s1 - m_new);
                al = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
            }
            float sum = llmi_warp_sum(p0 + p1);
            Ps[r * L.ldp + lane] = tc_conv<T>::from(p0);
            Ps[r * L.ldp + lane + 32] = tc_conv<T>::from(p1);
            for (int d = lane; d < hd; d += 32) Os[r * L.ldo + d] *= al;
            __syncwarp();
            if (lane == 0) {
                lrow[r] = lrow[r] * al + sum;
                mrow[r] = m_new;
            }
        }
        __syncwarp();

        /* O_w (16, hd) += P_w (16, PF_BK) @ V (PF_BK, hd) */
        for (int j = 0; j < hd / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            wmma::load_matrix_sync(c, Os + r0 * L.ldo + 16 * j, L.ldo, wmma::mem_row_major);
            for (int kk = 0; kk < PF_BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Ps + r0 * L.ldp + kk, L.ldp);
                wmma::load_matrix_sync(fb, Vs + kk * L.ldk + 16 * j, L.ldk);
                wmma::mma_sync(c, fa, fb, c);
            }
            wmma::store_matrix_sync(Os + r0 * L.ldo + 16 * j, c, L.ldo, wmma::mem_row_major);
        }
        __syncwarp();
    }
    __syncthreads();
    for (int i = tid; i < PF_BQ * hd; i += blockDim.x) {
        int r = i / hd, d = i % hd;
        if (r >= nq) continue;
        float l = lrow[r];
        llmi_store(a.out, a.out_dt, (int64_t)(t0 + r) * a.out_stride + (int64_t)h * hd + d,
                   l > 0 ? Os[r * L.ldo + d] / l : 0.0f);
    }
}

template <typename T> static cudaError_t launch_prefill(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles,
                                                        cudaStream_t s) {
    pf_layout L = pf_make_layout<T>(a->head_dim);   /* above 48 KiB needs llmi_cuda_attn_init first */
    llmi_attn_prefill_kernel<T><<<dim3((unsigned)n_tiles, (unsigned)a->n_heads), 32 * PF_WARPS, L.bytes, s>>>(*a, tiles);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

/* Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KiB.
 * The limit is per kernel, not per backend: never lower what another live backend (the
 * target beside a draft model with a smaller head_dim) still launches with. */
template <typename K> static cudaError_t allow_smem(K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return cudaSuccess;
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, kernel);
    if (e != cudaSuccess) return e;
    if ((size_t)fa.maxDynamicSharedSizeBytes >= bytes) return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

extern "C" cudaError_t llmi_cuda_attn_init(int n_heads, int n_kv_heads, int head_dim) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0) return cudaErrorInvalidValue;
    cudaError_t e = allow_smem(llmi_attn_decode_kernel, decode_smem_bytes(n_heads / n_kv_heads, head_dim));
    if (e == cudaSuccess && head_dim % 16 == 0 && head_dim <= 256) {
        e = allow_smem(llmi_attn_prefill_kernel<__nv_bfloat16>, pf_make_layout<__nv_bfloat16>(head_dim).bytes);
        if (e == cudaSuccess) e = allow_smem(llmi_attn_prefill_kernel<__half>, pf_make_layout<__half>(head_dim).bytes);
    }
    return e;
}

extern "C" cudaError_t llmi_cuda_attn_prefill(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles,
                                              cudaStream_t s) {
    if (n_tiles <= 0) return cudaSuccess;
    if (a->head_dim % 16 != 0 || a->head_dim > 256 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        a->n_heads > 65535)
        return cudaErrorInvalidValue;
    /* f16 caches keep f16 on the tensor cores, and so do q8 (d*q: an fp16 scale times an int8
     * rounds less in f16 than in bf16) and fp8 (every e4m3 value is exact in f16; a scale
     * above 1 could overflow, but llmi's are 1); bf16 and f32 caches use bf16 (f32's range) */
    if (a->kv_dt == LLMI_KV_F16 || a->kv_dt == LLMI_KV_Q8 || a->kv_dt == LLMI_KV_FP8)
        return launch_prefill<__half>(a, tiles, n_tiles, s);
    return launch_prefill<__nv_bfloat16>(a, tiles, n_tiles, s);
}

extern "C" void llmi_cuda_attn_plan(const llmi_batch *b, int head_dim, int32_t *decode_tokens, int *n_decode,
                                    int32_t *tiles, int *n_tiles, int *max_pos) {
    const bool tc_ok = head_dim % 16 == 0 && head_dim <= 256;
    int nd = 0, nt = 0, mp = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int qs = b->query_start[s], qe = b->query_start[s + 1];
        if (tc_ok && qe - qs >= LLMI_ATTN_PREFILL_MIN) {
            for (int t0 = qs; t0 < qe; t0 += LLMI_ATTN_TILE_Q) {
                tiles[2 * nt] = t0;
                tiles[2 * nt + 1] = qe - t0 < LLMI_ATTN_TILE_Q ? qe - t0 : LLMI_ATTN_TILE_Q;
                nt++;
            }
        } else {
            for (int t = qs; t < qe; t++) {
                decode_tokens[nd++] = t;
                if (b->positions[t] > mp) mp = b->positions[t];
            }
        }
    }
    *n_decode = nd;
    *n_tiles = nt;
    *max_pos = mp;
}
