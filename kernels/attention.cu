/* attention.cu — owns paged attention (twin: cpu_paged_attention).
 *
 * Two paths, chosen per sequence by llmi_cuda_attn_plan:
 *  - decode (and short query ranges): flash-decoding.  One block per (KV head, token,
 *    split) reads each KV tile once into shared memory and scores it against all the
 *    query heads of that KV head (GQA), with an online softmax; long contexts are split
 *    over positions and a combine pass merges the partial (m, l, o) triples.
 *  - prefill chunks: tiled causal flash-attention 2 on tensor cores (mma.sync m16n8k16,
 *    bf16 or f16 inputs, fp32 accumulation).  One block per (64-token tile, query head);
 *    each of its 4 warps owns 16 query rows and keeps their scores and output in
 *    registers, so only the K/V tile loads need block barriers; with a bf16/f16 cache
 *    they come by cp.async, each while the tile before it is being computed on.
 * Both read K/V through the sequence's block table and mask positions > the token's own,
 * so prefill chunks and decode tokens can share one batch.  With a window (sliding
 * layers: llmi_cuda_attn.window) a query at p sees keys [p - window + 1, p] only: the
 * decode path splits just that range, and the prefill starts at its tile's lowest
 * first key and masks the keys before each row's own. */
#include "common.cuh"

#define DEC_T 32          /* KV positions per decode tile (one per lane in the softmax) */
#define DEC_THREADS 128

/* A 32-bit division by a value known only at run time is ~20 instructions; the tile loaders
 * below ran two or three an item (the block of a position, the row and column of an item),
 * about as many instructions as a prefill tile's products and softmax.  A power-of-two block
 * size (16, the default) takes a shift and a mask; others (--block-size takes 1..1024)
 * keep the division. */
static __device__ __forceinline__ int64_t kv_index(const int32_t *bt, int block_size, int n_kv_heads, int head_dim,
                                                   int pos, int kvh) {
    int b, o;
    if ((block_size & (block_size - 1)) == 0) {
        b = pos >> (__ffs(block_size) - 1);
        o = pos & (block_size - 1);
    } else {
        b = pos / block_size;
        o = pos - b * block_size;
    }
    return (((int64_t)bt[b] * block_size + o) * n_kv_heads + kvh) * (int64_t)head_dim;
}

/* A key's score from its q.k product: times the scale, then with a soft cap (Gemma 2)
 * cap * tanh(score / cap), as cpu_paged_attention scores it. */
static __device__ __forceinline__ float attn_score(const llmi_cuda_attn &a, float dot) {
    const float x = dot * a.scale;
    return a.softcap > 0.0f ? a.softcap * tanhf(x / a.softcap) : x;
}

/* The fp8 scale of KV head kvh (1 for the other dtypes, which carry no scale). */
static __device__ __forceinline__ float kv_scale_of(llmi_kv_dtype dt, const float *scale, int kvh) {
    return dt == LLMI_KV_FP8 && scale ? scale[kvh] : 1.0f;
}

/* Tile loads of K and V: positions [p0, p0 + n_rows) of KV head kvh into Ks (row stride ldk)
 * and Vs (ldv) as E; positions at or past `end` as zeros (never NaN).  Thread i0 of n_thr
 * takes items i0, i0 + n_thr, ..., and issues BATCH of them (a K and a V load each) before
 * storing any: the loops these replace stored each item before loading the next, which the
 * compiler must keep in order (the tiles and the cache may alias, for all it knows), so a
 * thread waited for memory once an item, 8 times a tile at head_dim 128 for the tensor-core
 * kernels (in PTX, one load pair per loop trip).  BATCH 4 of 16-byte items costs ~10-20
 * registers. */
template <typename E> __device__ __forceinline__ E kv_elem(float v);
template <> __device__ __forceinline__ float kv_elem<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 kv_elem<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half kv_elem<__half>(float v) { return __float2half_rn(v); }

/* 16 bytes an item, from a cache that already holds E (hd a multiple of 16 / sizeof(E)). */
template <int BATCH, typename E>
__device__ __forceinline__ void kv_tile_load16(const llmi_cuda_attn &a, const int32_t *bt, int kvh, int p0, int n_rows,
                                               int end, E *Ks, int ldk, E *Vs, int ldv, int i0, int n_thr) {
    constexpr int per = 16 / sizeof(E);
    const int hd = a.head_dim;
    uint4 kr[BATCH], vr[BATCH];
    llmi_walk_batches<BATCH>(
        i0, n_thr, hd / per, n_rows,
        [&](int u, int r, int c) {
            kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
            if (r < n_rows && p0 + r < end) {
                const int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, p0 + r, kvh) + c * per;
                kr[u] = *(const uint4 *)((const E *)a.k_cache + off);
                vr[u] = *(const uint4 *)((const E *)a.v_cache + off);
            }
        },
        [&](int u, int r, int c) {
            *(uint4 *)(Ks + r * ldk + c * per) = kr[u];
            *(uint4 *)(Vs + r * ldv + c * per) = vr[u];
        });
}

/* cp.async (sm_80 on): 16 bytes from global to shared memory without a register between;
 * a thread's copies have landed once its cp_async_wait_all returns, the block's after the
 * barrier that follows. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* closes the thread's open copies into a group; wait_group<N> returns once at most the N
 * newest groups are still in flight */
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* One tile of a cache that holds E (K or V: positions [p0, p0 + n_rows) of KV head kvh)
 * into dst (row stride ld) by cp.async, 16 bytes an item; positions at or past `end` as
 * zeros, stored at once.  Nothing waits here: the caller's wait (wait_all, wait_group) does. */
template <typename E>
__device__ __forceinline__ void kv_tile_async16(const llmi_cuda_attn &a, const void *cache, const int32_t *bt, int kvh,
                                                int p0, int n_rows, int end, E *dst, int ld, int i0, int n_thr) {
    constexpr int per = 16 / sizeof(E);
    const int hd = a.head_dim;
    for (llmi_walk w(i0, n_thr, hd / per); w.r < n_rows; w.next()) {
        const int d = w.c * per, p = p0 + w.r;
        E *s = dst + w.r * ld + d;
        if (p < end)
            cp_async16(s, (const E *)cache + kv_index(bt, a.block_size, a.n_kv_heads, hd, p, kvh) + d);
        else
            *(uint4 *)s = make_uint4(0, 0, 0, 0);
    }
}

/* An element an item, converted from any cache dtype (llmi_kv_load) and times the head's
 * scales ksc, vsc. */
template <int BATCH, typename E>
__device__ __forceinline__ void kv_tile_load_conv(const llmi_cuda_attn &a, const int32_t *bt, int kvh, int p0,
                                                  int n_rows, int end, float ksc, float vsc, E *Ks, int ldk, E *Vs,
                                                  int ldv, int i0, int n_thr) {
    const int hd = a.head_dim;
    float kf[BATCH], vf[BATCH];
    llmi_walk_batches<BATCH>(
        i0, n_thr, hd, n_rows,
        [&](int u, int r, int c) {
            kf[u] = vf[u] = 0.0f;
            if (r < n_rows && p0 + r < end) {
                const int64_t off = kv_index(bt, a.block_size, a.n_kv_heads, hd, p0 + r, kvh) + c;
                kf[u] = llmi_kv_load(a.k_cache, a.kv_dt, off) * ksc;
                vf[u] = llmi_kv_load(a.v_cache, a.kv_dt, off) * vsc;
            }
        },
        [&](int u, int r, int c) {
            Ks[r * ldk + c] = kv_elem<E>(kf[u]);
            Vs[r * ldv + c] = kv_elem<E>(vf[u]);
        });
}

/* ---- decode ----
 * The K/V tiles in shared memory hold the cache's own values when they are bf16 or f16
 * and head_dim is a multiple of 8 (KT = that type: 16-byte copies, half the bytes of fp32,
 * converted as the products read them), fp32 otherwise (KT = float: f32, q8 and fp8
 * caches, converted and scaled as they are loaded, and 16-bit rows that 16-byte loads
 * cannot cover).  q, the scores and the output accumulator are fp32 either way, and each
 * product adds its terms in the same order, so both tile types give the same bits.
 * Counted per 32-position tile at head_dim 128, G 4 (128-byte shared-memory wavefronts,
 * a 16-byte read that every lane takes from one address counted as 4): fp32 tiles with one
 * float read per multiply-add ~2,048 for the products and ~1,536 for the stores (a float
 * at a time, each bank hit 4 or 8 times); 16-byte fp32 reads ~1,700; bf16 tiles ~1,200
 * and ~128 (q's broadcasts then the largest part: scoring a position against all G heads
 * in one lane would read and convert K once), in 21 KiB a block instead of 37. */
static __host__ __device__ int dec_hd4(int hd) { return (hd + 3) / 4 * 4; }
template <typename KT> struct dec_tile;
template <> struct dec_tile<float> {
    /* rows of head_dim rounded up to 4 (zeros past it), read 16 bytes at a time; K's 4
     * longer so a quarter-warp's reads of 8 positions start on distinct banks */
    static __host__ __device__ int ld(int hd) { return dec_hd4(hd); }
    static __host__ __device__ int ldk(int hd) { return ld(hd) + 4; }
};
static __device__ __forceinline__ float dec_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ float dec_f32(__half v) { return __half2float(v); }
template <typename T> struct dec_tile16 {
    /* K's rows an odd number of 16-byte units, for the same reason */
    static __host__ __device__ int ld(int hd) { return hd; }
    static __host__ __device__ int ldk(int hd) { return 8 * (hd / 8 | 1); }
    static __device__ __forceinline__ void to_f32(const T *p, float *f, int n) {
#pragma unroll
        for (int j = 0; j < n; j++) f[j] = dec_f32(p[j]);
    }
};
template <> struct dec_tile<__nv_bfloat16> : dec_tile16<__nv_bfloat16> {};
template <> struct dec_tile<__half> : dec_tile16<__half> {};

/* Split `split` of n_splits of the positions a decode token at pos attends to, [lo, pos]
 * (lo = pos - window + 1 with a window, else 0): [*start, *end), whole DEC_T tiles from lo,
 * empty (end <= start) past the range.  Each token splits its own range, so the launch does
 * not depend on the batch's longest one (a captured graph replays with any positions), and
 * the keys before a window are never loaded. */
static __device__ __forceinline__ void dec_split(int pos, int window, int n_splits, int split, int *start, int *end) {
    const int lo = window > 0 && pos >= window ? pos - window + 1 : 0;
    const int chunk = ((pos - lo + n_splits) / n_splits + DEC_T - 1) / DEC_T * DEC_T;
    *start = lo + split * chunk;
    *end = min(pos + 1, *start + chunk);
}

/* grid (n_kv_heads, n_tokens_listed, n_splits), block DEC_THREADS.  Shared, hd4 =
 * dec_hd4(hd) (columns hd..hd4 zero): qs (G, hd4) f32 | ks (DEC_T, ldk) KT | vs (DEC_T,
 * ld) KT | S (G, DEC_T) f32 | acc (G, hd4) f32 | m, l, alpha (G) f32. */
template <typename KT>
__global__ void llmi_attn_decode_kernel(llmi_cuda_attn a, const int32_t *tokens, int n_splits, float *work) {
    extern __shared__ __align__(16) float sm[];
    constexpr bool f32_tile = sizeof(KT) == 4;
    const int hd = a.head_dim, G = a.n_heads / a.n_kv_heads, hd4 = dec_hd4(hd), hq = hd4 / 4;
    const int ld = dec_tile<KT>::ld(hd), ldk = dec_tile<KT>::ldk(hd);
    float *qs = sm;
    KT *ks = (KT *)(qs + G * hd4), *vs = ks + DEC_T * ldk;
    float *S = (float *)(vs + DEC_T * ld), *acc = S + G * DEC_T;
    float *mrow = acc + G * hd4, *lrow = mrow + G, *alpha = lrow + G;
    const int item = blockIdx.y, kvh = blockIdx.x, split = blockIdx.z;
    const int t = tokens[item];
    const int pos = a.positions[t];
    const int32_t *bt = a.block_tables + (int64_t)a.seq_of_token[t] * a.max_blocks_per_seq;
    const int h0 = kvh * G;
    int start, end;
    dec_split(pos, a.window, n_splits, split, &start, &end);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    /* fp32 tiles from an f32 cache: 16-byte loads where rows allow, else one element at a time */
    const int vw = f32_tile && a.kv_dt == LLMI_KV_F32 && hd % 4 == 0 ? 4 : 1;
    const float ksc = kv_scale_of(a.kv_dt, a.k_scale, kvh), vsc = kv_scale_of(a.kv_dt, a.v_scale, kvh);

    for (int i = tid; i < G * hd4; i += blockDim.x) {
        int g = i / hd4, d = i % hd4;
        qs[i] = d < hd ? a.q[(int64_t)t * a.q_stride + (int64_t)(h0 + g) * hd + d] : 0.0f;
        acc[i] = 0.0f;
    }
    if constexpr (f32_tile)   /* the pad columns, which the tile loads never write, read as zeros */
        for (int i = tid; i < DEC_T * (hd4 - hd); i += blockDim.x) {
            int tt = i / (hd4 - hd), d = hd + i % (hd4 - hd);
            ks[tt * ldk + d] = 0.0f;
            vs[tt * ld + d] = 0.0f;
        }
    for (int g = tid; g < G; g += blockDim.x) { mrow[g] = -INFINITY; lrow[g] = 0.0f; }
    __syncthreads();

    for (int t0 = start; t0 < end; t0 += DEC_T) {
        const int nt = min(DEC_T, end - t0);
        if (!f32_tile || vw > 1) {   /* 16-byte copies: 8 16-bit values or 4 floats a thread */
            kv_tile_load16<4>(a, bt, kvh, t0, nt, end, ks, ldk, vs, ld, tid, blockDim.x);
        } else if constexpr (f32_tile) {
            kv_tile_load_conv<8>(a, bt, kvh, t0, nt, end, ksc, vsc, ks, ldk, vs, ld, tid, blockDim.x);
        }
        __syncthreads();
        /* a warp's lanes score 32 positions against one query head: q's reads are broadcasts;
         * column c goes to partial sum c % 4 on both tile types */
        for (int i = tid; i < G * DEC_T; i += blockDim.x) {
            int g = i / DEC_T, tt = i % DEC_T;
            if (tt >= nt) continue;
            const float4 *qg = (const float4 *)(qs + g * hd4);
            float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
            if constexpr (f32_tile) {
                const float4 *kt = (const float4 *)(ks + tt * ldk);
                for (int c = 0; c < hq; c++) {
                    float4 x = qg[c], y = kt[c];
                    d0 = fmaf(x.x, y.x, d0), d1 = fmaf(x.y, y.y, d1), d2 = fmaf(x.z, y.z, d2), d3 = fmaf(x.w, y.w, d3);
                }
            } else {
                const uint4 *kt = (const uint4 *)(ks + tt * ldk);
                for (int c = 0; c < hd / 8; c++) {
                    uint4 raw = kt[c];
                    float k[8];
                    dec_tile<KT>::to_f32((const KT *)&raw, k, 8);
                    float4 x = qg[2 * c], y = qg[2 * c + 1];
                    d0 = fmaf(x.x, k[0], d0), d1 = fmaf(x.y, k[1], d1), d2 = fmaf(x.z, k[2], d2), d3 = fmaf(x.w, k[3], d3);
                    d0 = fmaf(y.x, k[4], d0), d1 = fmaf(y.y, k[5], d1), d2 = fmaf(y.z, k[6], d2), d3 = fmaf(y.w, k[7], d3);
                }
            }
            S[i] = attn_score(a, (d0 + d1) + (d2 + d3));
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
        /* 4 output columns a thread: V's 4 values of a row in one read, acc's 16 bytes, p a broadcast */
        for (int i = tid; i < G * hq; i += blockDim.x) {
            int g = i / hq, c = i % hq;
            const float *pg = S + g * DEC_T;
            const float al = alpha[g];
            float4 o = ((float4 *)acc)[i];
            o.x *= al, o.y *= al, o.z *= al, o.w *= al;
            for (int tt = 0; tt < nt; tt++) {
                float p = pg[tt];
                float4 v;
                if constexpr (f32_tile) {
                    v = ((const float4 *)(vs + tt * ld))[c];
                } else {
                    uint2 raw = ((const uint2 *)(vs + tt * ld))[c];
                    float f[4];
                    dec_tile<KT>::to_f32((const KT *)&raw, f, 4);
                    v = make_float4(f[0], f[1], f[2], f[3]);
                }
                o.x = fmaf(p, v.x, o.x), o.y = fmaf(p, v.y, o.y), o.z = fmaf(p, v.z, o.z), o.w = fmaf(p, v.w, o.w);
            }
            ((float4 *)acc)[i] = o;
        }
        __syncthreads();
    }

    if (n_splits == 1) {
        for (int i = tid; i < G * hd; i += blockDim.x) {
            int g = i / hd, d = i % hd;
            float l = lrow[g];
            llmi_store(a.out, a.out_dt, (int64_t)t * a.out_stride + (int64_t)h0 * hd + i,
                       l > 0 ? acc[g * hd4 + d] / l : 0.0f);
        }
        return;
    }
    /* partials: o (items, n_heads, n_splits, hd) then (m, l) (items, n_heads, n_splits, 2) */
    const int64_t n_items = gridDim.y;
    float *wo = work, *wml = work + n_items * a.n_heads * n_splits * (int64_t)hd;
    for (int i = tid; i < G * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        wo[(((int64_t)item * a.n_heads + h0 + g) * n_splits + split) * hd + d] = acc[g * hd4 + d];
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

template <typename KT> static size_t decode_smem_bytes(int G, int hd) {
    return sizeof(float) * ((size_t)2 * G * dec_hd4(hd) + (size_t)G * DEC_T + 3 * (size_t)G) +
           sizeof(KT) * (size_t)DEC_T * (dec_tile<KT>::ldk(hd) + dec_tile<KT>::ld(hd));
}

/* shared memory above 48 KiB needs llmi_cuda_attn_init first */
template <typename KT>
static void launch_decode(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits, float *work,
                          cudaStream_t s) {
    const size_t smem = decode_smem_bytes<KT>(a->n_heads / a->n_kv_heads, a->head_dim);
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)n, (unsigned)n_splits);
    llmi_attn_decode_kernel<KT><<<grid, DEC_THREADS, smem, s>>>(*a, tokens, n_splits, work);
}

extern "C" size_t llmi_cuda_attn_work_floats(int n_decode, int n_heads, int head_dim, int n_splits) {
    if (n_splits <= 1) return 0;
    return (size_t)n_decode * n_heads * n_splits * ((size_t)head_dim + 2);
}

extern "C" int llmi_cuda_attn_splits(int n_decode, int n_kv_heads, int n_heads, int head_dim, int max_pos, int window,
                                     int n_sms, size_t work_floats) {
    if (n_decode <= 0) return 1;
    long blocks = (long)n_decode * n_kv_heads;
    long target = 2L * (n_sms > 0 ? n_sms : 1);
    long splits = (target + blocks - 1) / blocks;
    /* a split under 256 positions costs more than it saves; a window bounds the positions */
    long len = window > 0 && window < (long)max_pos + 1 ? window : (long)max_pos + 1;
    long by_len = (len + 255) / 256;
    if (splits > by_len) splits = by_len;
    if (splits > 64) splits = 64;
    if (splits < 1) splits = 1;
    while (splits > 1 && llmi_cuda_attn_work_floats(n_decode, n_heads, head_dim, (int)splits) > work_floats) splits--;
    return (int)splits;
}


/* ---- prefill: tensor cores ---- */
#define PF_BQ LLMI_ATTN_TILE_Q   /* query rows per block (16 per warp) */
#define PF_BK 64                 /* KV positions per tile */
#define PF_WARPS 4

template <typename T> struct tc_conv;
/* T's cache dtype (the one already in T), two values packed as one 32-bit operand (lo in the
 * low half: the lower k index; rounded as kv_elem<T> rounds one) and mma.sync m16n8k16 with
 * T inputs and fp32 accumulation; the two types differ only in these names. */
#define LLMI_TC_CONV(T, T2, KV, PACK2, PTX_T)                                                                  \
    template <> struct tc_conv<T> {                                                                            \
        static constexpr llmi_kv_dtype kv = KV;                                                                \
        static __device__ __forceinline__ uint32_t pack(float lo, float hi) {                                  \
            T2 h = PACK2(lo, hi);                                                                              \
            return *(uint32_t *)&h;                                                                            \
        }                                                                                                      \
        static __device__ __forceinline__ void mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {     \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_T "." PTX_T ".f32 {%0,%1,%2,%3}, "       \
                         "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                              \
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                  \
        }                                                                                                      \
    };
LLMI_TC_CONV(__nv_bfloat16, __nv_bfloat162, LLMI_KV_BF16, __floats2bfloat162_rn, "bf16")
LLMI_TC_CONV(__half, __half2, LLMI_KV_F16, __floats2half2_rn, "f16")
#undef LLMI_TC_CONV

/* The B operand of an m16n8k16 product from a row-major (k, n) tile in shared memory:
 * lanes 0..15 name rows k0..k0+15 (16-byte aligned, 8 elements from column n0), and
 * .trans hands each lane the column-pairs that mma's B fragment wants. */
__device__ __forceinline__ void ldsm_x2_trans(uint32_t b[2], const void *row) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(addr));
}

/* The fragment loads come in two forms: X4, four 8x8 matrices an ldmatrix (2026-11-27, not
 * yet run on a device), and the 32-bit loads and ldmatrix.x2.trans that ran on the H200,
 * which the kernels with register-loaded tiles (LLMI_ATTN_TILES=sync) keep, so that the
 * switch falls back to what a device has proved.  Both hand mma the same fragments. */

/* B operands of two m16n8k16 products from a row-major (k, n) tile in shared memory: lanes
 * 0..15 name rows k0..k0+15 from column n0, lanes 16..31 the same rows from n0 + 8 (16-byte
 * aligned, 8 elements each), and .trans hands each lane the column pairs that mma's B
 * fragment wants: b[0], b[1] for columns n0 .. n0 + 7, b[2], b[3] for the next 8. */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t b[4], const void *row) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
}

/* Four 8x8 matrices of 16-bit values from shared memory: lanes 8m .. 8m + 7 name the rows
 * (16-byte aligned, 8 elements each) of matrix m, and each lane gets, in r[m], row lane / 4,
 * columns 2 (lane % 4) and + 1 of matrix m: mma's A fragment of a row-major 16x16 tile (the
 * matrices its rows 0-7 / 8-15 by columns 0-7 / 8-15), or B fragments for two 8-key pieces
 * of a K tile stored a key a row.  One instruction where 32-bit loads took four. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *row) {
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* A's fragment (mma.m16n8k16) of rows r0 .. r0 + 15, columns 16 kd .. 16 kd + 15 of a
 * row-major tile (row stride ld). */
template <bool X4, typename T>
__device__ __forceinline__ void tc_load_a(uint32_t (&fa)[4], const T *tile, int ld, int r0, int kd, int lane) {
    if (X4) {
        const int m = lane >> 3;
        ldsm_x4(fa, tile + (r0 + (m & 1) * 8 + (lane & 7)) * ld + 16 * kd + (m >> 1) * 8);
    } else {
        const T *qa = tile + (r0 + (lane >> 2)) * ld + 16 * kd + 2 * (lane & 3);
        fa[0] = *(const uint32_t *)qa, fa[1] = *(const uint32_t *)(qa + 8 * ld);
        fa[2] = *(const uint32_t *)(qa + 8), fa[3] = *(const uint32_t *)(qa + 8 * ld + 8);
    }
}

/* S (16, NJ * 8) += A (16, 16) K^T for head columns 16 kd .. 16 kd + 15: A is the lane's
 * fragment of Q's rows, K's rows come from ktile (row stride ld); piece j holds keys
 * 8j .. 8j + 7 of the tile (NJ even).  Lanes 8m .. 8m + 7 name key 8 (2p + m / 2) + lane % 8,
 * columns 8 (m % 2) on: pieces 2p and 2p + 1's B fragments in one ldmatrix. */
template <bool X4, typename T, int NJ>
__device__ __forceinline__ void tc_qk_step(float (&sc)[NJ][4], const uint32_t (&fa)[4], const T *ktile, int ld, int kd,
                                           int lane) {
    static_assert(NJ % 2 == 0, "K pieces come two at a time");
    const int m = lane >> 3;
#pragma unroll
    for (int p = 0; p < NJ / 2; p++) {
        uint32_t fb[4];   /* piece 2p: fb[0], fb[1]; piece 2p + 1: fb[2], fb[3] */
        if (X4) {
            ldsm_x4(fb, ktile + (16 * p + (m >> 1) * 8 + (lane & 7)) * ld + 16 * kd + (m & 1) * 8);
        } else {
            const T *kb = ktile + (16 * p + (lane >> 2)) * ld + 16 * kd + 2 * (lane & 3);
            fb[0] = *(const uint32_t *)kb, fb[1] = *(const uint32_t *)(kb + 8);
            fb[2] = *(const uint32_t *)(kb + 8 * ld), fb[3] = *(const uint32_t *)(kb + 8 * ld + 8);
        }
        tc_conv<T>::mma(sc[2 * p], fa, fb);
        tc_conv<T>::mma(sc[2 * p + 1], fa, fb + 2);
    }
}

/* One tile's step of the online softmax in mma's fragment layout (see the prefill kernel),
 * its exponentials by __expf (ex2.approx of x log2 e: two instructions where expf's accurate
 * range reduction took ~8, 34 a lane a tile; the prefill kernel's PTX went from 3,475 to
 * 2,931 instructions; a few ulp, against P's rounding to bf16/f16 right after).
 * sc (NJ pieces of 8 keys) holds the tile's scaled scores, masked keys -inf; element e of a
 * piece is row g + 8 (e / 2).  Updates the lane's two rows' running max m_run and sum l_run
 * (its own columns only), rescales o_acc (NJD pieces of the output) and leaves the
 * probabilities in sc. */
template <int NJ, int NJD>
__device__ __forceinline__ void tc_softmax_step(float (&sc)[NJ][4], float (&m_run)[2], float (&l_run)[2],
                                                float (&o_acc)[NJD][4]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        float m_new = fmaxf(m_run[i], mx[i]);
        alpha[i] = m_new == -INFINITY ? 1.0f : m_run[i] == -INFINITY ? 0.0f : __expf(m_run[i] - m_new);
        m_run[i] = m_new;
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float m = m_run[e >> 1];
            float p = m == -INFINITY ? 0.0f : __expf(sc[j][e] - m);
            sc[j][e] = p;
            rs[e >> 1] += p;
        }
#pragma unroll
    for (int i = 0; i < 2; i++) l_run[i] = l_run[i] * alpha[i] + rs[i];
#pragma unroll
    for (int jd = 0; jd < NJD; jd++) {
        o_acc[jd][0] *= alpha[0]; o_acc[jd][1] *= alpha[0];
        o_acc[jd][2] *= alpha[1]; o_acc[jd][3] *= alpha[1];
    }
}

/* O (16, hd) += P V for one tile: P's 16-key slices are sc's pieces (2kk, 2kk + 1), rounded
 * to T as mma's A fragments; V's rows come from vtile (NJ * 8 rows, row stride ld) through
 * ldmatrix.trans, two 8-column pieces at a time; n_jd of O's NJD pieces are in use. */
template <bool X4, typename T, int NJ, int NJD>
__device__ __forceinline__ void tc_pv_step(const float (&sc)[NJ][4], const T *vtile, int ld, int lane, int n_jd,
                                           float (&o_acc)[NJD][4]) {
#pragma unroll
    for (int kk = 0; kk < NJ / 2; kk++) {
        const uint32_t fa[4] = {tc_conv<T>::pack(sc[2 * kk][0], sc[2 * kk][1]),
                                tc_conv<T>::pack(sc[2 * kk][2], sc[2 * kk][3]),
                                tc_conv<T>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                tc_conv<T>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
        const T *vrow = vtile + (16 * kk + (lane & 15)) * ld + (X4 ? (lane >> 4) * 8 : 0);
#pragma unroll
        for (int jd = 0; jd < NJD; jd += 2) {   /* (n_jd = hd / 8 is even: hd % 16 == 0) */
            if (jd >= n_jd) break;
            uint32_t fb[4];
            if (X4) {
                ldsm_x4_trans(fb, vrow + 8 * jd);
            } else {
                ldsm_x2_trans(fb, vrow + 8 * jd);
                ldsm_x2_trans(fb + 2, vrow + 8 * jd + 8);
            }
            tc_conv<T>::mma(o_acc[jd], fa, fb);
            tc_conv<T>::mma(o_acc[jd + 1], fa, fb + 2);
        }
    }
}

/* Each of the lane's two rows' sums over the row's 4 lanes. */
__device__ __forceinline__ void tc_row_sums(float (&l_run)[2]) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
    }
}

/* Rows t0 .. t0 + PF_BQ - 1 of head h's queries (fp32; q 16-byte aligned, q_stride and hd
 * multiples of 4, as the launcher checks) into Qs (row stride ld) as T, rows from nq on
 * zero.  Each thread issues TC_Q_BATCH float4 loads before storing any: a loop storing
 * after each load waited for memory once a float, 64 times a thread at head_dim 128,
 * before the block's first K/V tile. */
#define TC_Q_BATCH 8
template <typename T>
__device__ __forceinline__ void tc_load_q(const llmi_cuda_attn &a, int t0, int nq, int h, int hd, int ld, T *Qs,
                                          int i0, int n_thr) {
    const float *qh = a.q + (int64_t)h * hd;
    float4 v[TC_Q_BATCH];
    llmi_walk_batches<TC_Q_BATCH>(
        i0, n_thr, hd / 4, PF_BQ,   /* (row, 4-float column) */
        [&](int u, int r, int c) {
            v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < nq) v[u] = *(const float4 *)(qh + (int64_t)(t0 + r) * a.q_stride + c * 4);
        },
        [&](int u, int r, int c) {
            *(uint2 *)(Qs + r * ld + c * 4) =
                make_uint2(tc_conv<T>::pack(v[u].x, v[u].y), tc_conv<T>::pack(v[u].z, v[u].w));
        });
}

/* Shared memory (elements of T): Q (PF_BQ, hd+8) | K (PF_BK, hd+8) | V (PF_BK, hd+8); the
 * 8-element pad puts the 8 rows one fragment load touches on distinct banks. */
static __host__ __device__ int pf_ld(int hd) { return hd + 8; }
template <typename T> static __host__ __device__ size_t pf_smem_bytes(int hd) {
    return (size_t)(PF_BQ + 2 * PF_BK) * pf_ld(hd) * sizeof(T);
}

/* grid (n_heads, n_tiles), block 32*PF_WARPS; head_dim % 16 == 0 and <= HDMAX.
 * Flash-attention 2 on mma.sync m16n8k16: each warp owns 16 query rows; its scores S
 * (16, PF_BK), the probabilities P and the output O (16, hd) stay in registers in mma's
 * fragment layout (PTX ISA, "matrix fragments for mma.m16n8k16": with g = lane / 4,
 * q = lane % 4, a lane holds rows g and g + 8, columns 2q and 2q + 1 of each 8-column
 * piece), so the online softmax is per lane plus a reduction over the 4 lanes of a row.
 * Only the K/V tile loads need block barriers.  ASYNC (a cache in T, llmi_cuda_attn.
 * tiles_async): the tiles come by cp.async, V's while the scores are computed and the
 * next K's while P V is, so the block waits for memory only where a copy is not done yet;
 * otherwise each tile is loaded through registers between two barriers, the block idle
 * for the round trips (converting q8/fp8/f32 caches always). */
template <typename T, int HDMAX, bool ASYNC>
__global__ void __launch_bounds__(32 * PF_WARPS) llmi_attn_prefill_kernel(llmi_cuda_attn a, const int32_t *tiles) {
    extern __shared__ __align__(128) unsigned char smraw[];
    const int hd = a.head_dim, ld = pf_ld(hd);
    T *Qs = (T *)smraw, *Ks = Qs + PF_BQ * ld, *Vs = Ks + PF_BK * ld;

    /* blocks start in the order of their index, heads first: every head of a tile, then the
     * tile before.  The plan lists a sequence's tiles first to last, the longest (most keys)
     * last, so taken last to first the long blocks start in the first wave and the short
     * ones fill the end (instead of the last long blocks starting when the rest are nearly
     * done), and the query heads of a KV head read its tile at about the same time (L2). */
    const int tile = gridDim.y - 1 - blockIdx.y;
    const int t0 = tiles[2 * tile], nq = tiles[2 * tile + 1];
    const int h = blockIdx.x, kvh = h / (a.n_heads / a.n_kv_heads);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q2 = 2 * (lane & 3);
    const int32_t *bt = a.block_tables + (int64_t)a.seq_of_token[t0] * a.max_blocks_per_seq;

    /* the tile's last key, and its first: 0, or with a window the lowest row's first (the
     * keys before it are never loaded), found by every warp alike (no static shared memory
     * beside the dynamic buffer, whose 16-byte alignment the vector copies rely on) */
    int max_pos = -1, min_pos = INT_MAX;
    for (int r = lane; r < nq; r += 32) {
        const int p = a.positions[t0 + r];
        max_pos = max(max_pos, p);
        min_pos = min(min_pos, p);
    }
    for (int o = 16; o > 0; o >>= 1) {
        max_pos = max(max_pos, __shfl_xor_sync(0xffffffffu, max_pos, o));
        min_pos = min(min_pos, __shfl_xor_sync(0xffffffffu, min_pos, o));
    }
    const int kv_first = a.window > 0 ? max(0, min_pos - a.window + 1) : 0;
    /* the first K tile on its way while Q is loaded */
    if (ASYNC) kv_tile_async16<T>(a, a.k_cache, bt, kvh, kv_first, PF_BK, max_pos + 1, Ks, ld, tid, blockDim.x);
    tc_load_q(a, t0, nq, h, hd, ld, Qs, tid, blockDim.x);
    __syncthreads();
    const bool same_type = a.kv_dt == tc_conv<T>::kv;
    const float ksc = kv_scale_of(a.kv_dt, a.k_scale, kvh), vsc = kv_scale_of(a.kv_dt, a.v_scale, kvh);
    const int r0 = warp * 16;   /* this warp's first query row */
    /* positions of this lane's two rows (-1: a row past the tile, which every key masks), and
     * their first keys (a row sees keys lo_r <= key <= pos_r) */
    const int pos_r[2] = {r0 + g < nq ? a.positions[t0 + r0 + g] : -1, r0 + g + 8 < nq ? a.positions[t0 + r0 + g + 8] : -1};
    const int lo_r[2] = {a.window > 0 ? pos_r[0] - a.window + 1 : 0, a.window > 0 ? pos_r[1] - a.window + 1 : 0};
    int warp_max_pos = max(pos_r[0], pos_r[1]);
    for (int o = 16; o > 0; o >>= 1) warp_max_pos = max(warp_max_pos, __shfl_xor_sync(0xffffffffu, warp_max_pos, o));
    /* the smallest position and the smallest and largest first key among the warp's rows in
     * the tile (rows past it are never stored) */
    int warp_min_pos = min(pos_r[0] < 0 ? INT_MAX : pos_r[0], pos_r[1] < 0 ? INT_MAX : pos_r[1]);
    int warp_min_lo = min(pos_r[0] < 0 ? INT_MAX : lo_r[0], pos_r[1] < 0 ? INT_MAX : lo_r[1]);
    int warp_max_lo = max(pos_r[0] < 0 ? INT_MIN : lo_r[0], pos_r[1] < 0 ? INT_MIN : lo_r[1]);
    for (int o = 16; o > 0; o >>= 1) {
        warp_min_pos = min(warp_min_pos, __shfl_xor_sync(0xffffffffu, warp_min_pos, o));
        warp_min_lo = min(warp_min_lo, __shfl_xor_sync(0xffffffffu, warp_min_lo, o));
        warp_max_lo = max(warp_max_lo, __shfl_xor_sync(0xffffffffu, warp_max_lo, o));
    }
    const int n_kd = hd / 16, n_jd = hd / 8;

    float o_acc[HDMAX / 8][4];   /* O (16, hd): 8-column piece jd, fragment layout */
#pragma unroll
    for (int jd = 0; jd < HDMAX / 8; jd++) o_acc[jd][0] = o_acc[jd][1] = o_acc[jd][2] = o_acc[jd][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};   /* l: this lane's columns only */

    for (int kv0 = kv_first; kv0 <= max_pos; kv0 += PF_BK) {
        if (ASYNC) {
            cp_async_wait_all();
            __syncthreads();   /* K is in for every thread; every warp is done with the previous V */
            kv_tile_async16<T>(a, a.v_cache, bt, kvh, kv0, PF_BK, max_pos + 1, Vs, ld, tid, blockDim.x);
        } else {
            __syncthreads();   /* every warp is done with the previous K/V tile */
            if (same_type)   /* the cache already holds T: 16-byte copies (hd % 16 == 0) */
                kv_tile_load16<4>(a, bt, kvh, kv0, PF_BK, max_pos + 1, Ks, ld, Vs, ld, tid, blockDim.x);
            else
                kv_tile_load_conv<8>(a, bt, kvh, kv0, PF_BK, max_pos + 1, ksc, vsc, Ks, ld, Vs, ld, tid, blockDim.x);
            __syncthreads();
        }
        /* warp-uniform: else every key of the tile is masked (past every row, or before every
         * row's window) */
        const bool active = kv0 <= warp_max_pos && kv0 + PF_BK > warp_min_lo;

        /* S (16, PF_BK) = Q_w (16, hd) @ K^T: piece j holds keys kv0 + 8j .. + 7 */
        float sc[PF_BK / 8][4];
        if (active) {
#pragma unroll
            for (int j = 0; j < PF_BK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
            for (int kd = 0; kd < HDMAX / 16; kd++) {
                if (kd >= n_kd) break;
                uint32_t fa[4];
                tc_load_a<ASYNC>(fa, Qs, ld, r0, kd, lane);
                tc_qk_step<ASYNC>(sc, fa, Ks, ld, kd, lane);
            }

            /* mask and scale: element e of piece j is row g + 8 * (e / 2), key kv0 + 8j + q2 + e % 2;
             * a tile wholly before every row's position and inside every row's window (all
             * but the last one or two of a row range, and the first one or two with a
             * window) has nothing to mask: scale only */
            if (kv0 + PF_BK - 1 <= warp_min_pos && kv0 >= warp_max_lo) {
#pragma unroll
                for (int j = 0; j < PF_BK / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[j][e] = attn_score(a, sc[j][e]);
            } else {
#pragma unroll
                for (int j = 0; j < PF_BK / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int key = kv0 + 8 * j + q2 + (e & 1);
                        sc[j][e] = key <= pos_r[e >> 1] && key >= lo_r[e >> 1] ? attn_score(a, sc[j][e]) : -INFINITY;
                    }
            }
            tc_softmax_step(sc, m_run, l_run, o_acc);
        }
        if (ASYNC) {
            cp_async_wait_all();
            __syncthreads();   /* V is in for every thread; every warp is done with K */
            if (kv0 + PF_BK <= max_pos)
                kv_tile_async16<T>(a, a.k_cache, bt, kvh, kv0 + PF_BK, PF_BK, max_pos + 1, Ks, ld, tid, blockDim.x);
        }

        /* O_w (16, hd) += P (16, PF_BK) @ V (PF_BK, hd) */
        if (active) tc_pv_step<ASYNC>(sc, Vs, ld, lane, n_jd, o_acc);
    }
    tc_row_sums(l_run);
#pragma unroll
    for (int jd = 0; jd < HDMAX / 8; jd++) {
        if (jd >= n_jd) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int r = r0 + g + 8 * (e >> 1), d = 8 * jd + q2 + (e & 1);
            float l = l_run[e >> 1];
            if (r < nq)
                llmi_store(a.out, a.out_dt, (int64_t)(t0 + r) * a.out_stride + (int64_t)h * hd + d,
                           l > 0 ? o_acc[jd][e] / l : 0.0f);
        }
    }
}

template <typename T, int HDMAX>
static cudaError_t launch_prefill_hd(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles, cudaStream_t s) {
    /* above 48 KiB needs llmi_cuda_attn_init first */
    const dim3 grid((unsigned)a->n_heads, (unsigned)n_tiles);
    const size_t smem = pf_smem_bytes<T>(a->head_dim);
    if (a->tiles_async && a->kv_dt == tc_conv<T>::kv)
        llmi_attn_prefill_kernel<T, HDMAX, true><<<grid, 32 * PF_WARPS, smem, s>>>(*a, tiles);
    else
        llmi_attn_prefill_kernel<T, HDMAX, false><<<grid, 32 * PF_WARPS, smem, s>>>(*a, tiles);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}
template <typename T> static cudaError_t launch_prefill(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles,
                                                        cudaStream_t s) {
    if (a->head_dim <= 64) return launch_prefill_hd<T, 64>(a, tiles, n_tiles, s);
    if (a->head_dim <= 128) return launch_prefill_hd<T, 128>(a, tiles, n_tiles, s);
    return launch_prefill_hd<T, 256>(a, tiles, n_tiles, s);
}

/* ---- decode on tensor cores ----
 * For bf16/f16 caches with head_dim % 16 == 0 and G = n_heads / n_kv_heads <= 16 query heads
 * per KV head (llmi_cuda_attn.decode_tc): one block per (KV head, token, split) as the fp32
 * kernel's, whose chunking, partials and combine it shares.  The G heads are the rows of an
 * m16n8k16 product (rows G..15 zero), so a KV position is read once for all of them.  Each
 * of the DT_WARPS warps streams its own 16-position tiles (positions start + 16 w, then every
 * 64th) through its own shared K/V tile with the prefill's online softmax in registers, and
 * needs no block barrier until the warps' (m, l, O) are merged at the end.  q and the
 * probabilities are rounded to the cache type as the prefill's are (the fp32 kernel keeps them
 * fp32: ~1e-5 NMSE apart).  ASYNC (llmi_cuda_attn.tiles_async): a warp's tiles come by
 * cp.async, the next on its way while this one is computed on (dt_stages). */
#define DT_WARPS 4
#define DT_BK 16   /* positions per warp tile */

/* Tile stages of the decode: two with cp.async up to head_dim 128 (the next tile comes in
 * while this one is computed on; 70 KiB a block at 128, still 3 blocks an SM), one above
 * (a second stage would halve the blocks an SM at 256) and with register loads. */
template <bool ASYNC, int HDMAX> struct dt_stages { static constexpr int n = ASYNC && HDMAX <= 128 ? 2 : 1; };

/* K/V tiles (DT_WARPS, stages, 2, DT_BK, hd + 8) of T; the merge reuses them as fp32 m, l
 * (DT_WARPS, 16) each and O (DT_WARPS, G, hd), which fit for G <= 16. */
template <typename T> static __host__ __device__ size_t dt_smem_bytes(int hd, int stages) {
    return (size_t)DT_WARPS * stages * 2 * DT_BK * pf_ld(hd) * sizeof(T);
}

template <typename T, int HDMAX, bool ASYNC>
__global__ void __launch_bounds__(32 * DT_WARPS)
llmi_attn_decode_tc_kernel(llmi_cuda_attn a, const int32_t *tokens, int n_splits, float *work) {
    extern __shared__ __align__(128) unsigned char smraw[];
    constexpr int STAGES = dt_stages<ASYNC, HDMAX>::n;
    const int hd = a.head_dim, ld = pf_ld(hd), G = a.n_heads / a.n_kv_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q2 = 2 * (lane & 3);
    T *const Kw = (T *)smraw + (size_t)warp * STAGES * 2 * DT_BK * ld;   /* this warp's stages: K then V */
    const int item = blockIdx.y, kvh = blockIdx.x, split = blockIdx.z;
    const int t = tokens[item];
    const int pos = a.positions[t];
    const int32_t *bt = a.block_tables + (int64_t)a.seq_of_token[t] * a.max_blocks_per_seq;
    const int h0 = kvh * G;
    int start, end;   /* the fp32 kernel's chunks */
    dec_split(pos, a.window, n_splits, split, &start, &end);
    const int n_kd = hd / 16, n_jd = hd / 8;

    /* Q (16, hd) as mma's A fragments: rows g and g + 8 of this lane, heads h0 + row */
    uint32_t qf[HDMAX / 16][4];
    const float *qt = a.q + (int64_t)t * a.q_stride + (int64_t)h0 * hd;
#pragma unroll
    for (int kd = 0; kd < HDMAX / 16; kd++) {
        if (kd >= n_kd) break;
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int r = g + 8 * (f & 1), c = 16 * kd + q2 + 8 * (f >> 1);
            qf[kd][f] = r < G ? tc_conv<T>::pack(qt[(int64_t)r * hd + c], qt[(int64_t)r * hd + c + 1])
                              : tc_conv<T>::pack(0.0f, 0.0f);
        }
    }
    float o_acc[HDMAX / 8][4];
#pragma unroll
    for (int jd = 0; jd < HDMAX / 8; jd++) o_acc[jd][0] = o_acc[jd][1] = o_acc[jd][2] = o_acc[jd][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};   /* l: this lane's columns only */

    /* ASYNC: the warp's tiles by cp.async, the first issued here, each next one as soon as a
     * stage is free: at the top of the loop with two stages, after the products with one */
    const int step = DT_WARPS * DT_BK;
    if (ASYNC && start + warp * DT_BK < end) {
        kv_tile_async16<T>(a, a.k_cache, bt, kvh, start + warp * DT_BK, DT_BK, end, Kw, ld, lane, 32);
        kv_tile_async16<T>(a, a.v_cache, bt, kvh, start + warp * DT_BK, DT_BK, end, Kw + DT_BK * ld, ld, lane, 32);
        cp_async_commit();
    }
    for (int kv0 = start + warp * DT_BK, it = 0; kv0 < end; kv0 += step, it++) {
        T *const Ks = Kw + (size_t)(it % STAGES) * 2 * DT_BK * ld, *const Vs = Ks + DT_BK * ld;
        const int next = kv0 + step;
        if (ASYNC) {
            if (STAGES == 2 && next < end) {
                /* the other stage: the warp was done with it at the end of the last trip */
                T *const Kn = Kw + (size_t)((it + 1) % STAGES) * 2 * DT_BK * ld;
                kv_tile_async16<T>(a, a.k_cache, bt, kvh, next, DT_BK, end, Kn, ld, lane, 32);
                kv_tile_async16<T>(a, a.v_cache, bt, kvh, next, DT_BK, end, Kn + DT_BK * ld, ld, lane, 32);
                cp_async_commit();
                cp_async_wait_group<1>();   /* this tile's group is in */
            } else {
                cp_async_wait_group<0>();
            }
            __syncwarp();   /* every lane's copies of this tile are in */
        } else {
            __syncwarp();   /* the warp is done with its previous tile */
            kv_tile_load16<HDMAX <= 128 ? 4 : 2>(a, bt, kvh, kv0, DT_BK, end, Ks, ld, Vs, ld, lane, 32);
            __syncwarp();
        }

        /* S (16, DT_BK) = Q K^T: piece j holds positions kv0 + 8j .. + 7 */
        float sc[DT_BK / 8][4];
#pragma unroll
        for (int j = 0; j < DT_BK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < HDMAX / 16; kd++) {
            if (kd >= n_kd) break;
            tc_qk_step<ASYNC>(sc, qf[kd], Ks, ld, kd, lane);
        }
        /* mask and scale: element e of piece j is row g + 8 (e / 2), position kv0 + 8j + q2 + e % 2 */
#pragma unroll
        for (int j = 0; j < DT_BK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[j][e] = kv0 + 8 * j + q2 + (e & 1) < end ? attn_score(a, sc[j][e]) : -INFINITY;
        tc_softmax_step(sc, m_run, l_run, o_acc);
        /* O (16, hd) += P (16, DT_BK) V (DT_BK, hd) */
        tc_pv_step<ASYNC>(sc, Vs, ld, lane, n_jd, o_acc);
        if (ASYNC) {
            __syncwarp();   /* the warp is done with this stage */
            if (STAGES == 1 && next < end) {
                kv_tile_async16<T>(a, a.k_cache, bt, kvh, next, DT_BK, end, Ks, ld, lane, 32);
                kv_tile_async16<T>(a, a.v_cache, bt, kvh, next, DT_BK, end, Vs, ld, lane, 32);
                cp_async_commit();
            }
        }
    }
    tc_row_sums(l_run);

    /* the warps' states into shared memory (over the tiles), then merged per (head, column) */
    __syncthreads();
    float *Ms = (float *)smraw, *Ls = Ms + DT_WARPS * 16, *Os = Ls + DT_WARPS * 16;
    if ((lane & 3) == 0)
        for (int i = 0; i < 2; i++) Ms[warp * 16 + g + 8 * i] = m_run[i], Ls[warp * 16 + g + 8 * i] = l_run[i];
#pragma unroll
    for (int jd = 0; jd < HDMAX / 8; jd++) {
        if (jd >= n_jd) break;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = g + 8 * (e >> 1), d = 8 * jd + q2 + (e & 1);
            if (r < G) Os[((int64_t)warp * G + r) * hd + d] = o_acc[jd][e];
        }
    }
    __syncthreads();
    const int64_t n_items = gridDim.y;
    float *wo = work, *wml = work ? work + n_items * a.n_heads * n_splits * (int64_t)hd : NULL;
    for (int i = tid; i < G * hd; i += blockDim.x) {
        const int r = i / hd, d = i % hd;
        float M = -INFINITY;
        for (int w = 0; w < DT_WARPS; w++) M = fmaxf(M, Ms[w * 16 + r]);
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < DT_WARPS; w++) {
            const float mw = Ms[w * 16 + r];
            if (mw == -INFINITY) continue;
            const float f = expf(mw - M);
            L += f * Ls[w * 16 + r];
            o += f * Os[((int64_t)w * G + r) * hd + d];
        }
        if (n_splits == 1) {
            llmi_store(a.out, a.out_dt, (int64_t)t * a.out_stride + (int64_t)(h0 + r) * hd + d, L > 0 ? o / L : 0.0f);
            continue;
        }
        /* partials as the fp32 kernel's: o (items, n_heads, n_splits, hd), (m, l) after them */
        const int64_t j = ((int64_t)item * a.n_heads + h0 + r) * n_splits + split;
        wo[j * hd + d] = o;
        if (d == 0) wml[2 * j] = M, wml[2 * j + 1] = L;
    }
}

template <typename T, int HDMAX>
static void launch_decode_tc(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits, float *work,
                             cudaStream_t s) {
    dim3 grid((unsigned)a->n_kv_heads, (unsigned)n, (unsigned)n_splits);
    if (a->tiles_async)
        llmi_attn_decode_tc_kernel<T, HDMAX, true><<<grid, 32 * DT_WARPS,
            dt_smem_bytes<T>(a->head_dim, dt_stages<true, HDMAX>::n), s>>>(*a, tokens, n_splits, work);
    else
        llmi_attn_decode_tc_kernel<T, HDMAX, false><<<grid, 32 * DT_WARPS,
            dt_smem_bytes<T>(a->head_dim, dt_stages<false, HDMAX>::n), s>>>(*a, tokens, n_splits, work);
}
template <typename T>
static void launch_decode_tc_hd(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits, float *work,
                                cudaStream_t s) {
    if (a->head_dim <= 64) launch_decode_tc<T, 64>(a, tokens, n, n_splits, work, s);
    else if (a->head_dim <= 128) launch_decode_tc<T, 128>(a, tokens, n, n_splits, work, s);
    else launch_decode_tc<T, 256>(a, tokens, n, n_splits, work, s);
}
/* The tensor-core decode takes this shape and cache. */
static bool decode_tc_ok(const llmi_cuda_attn *a) {
    return a->decode_tc && (a->kv_dt == LLMI_KV_BF16 || a->kv_dt == LLMI_KV_F16) && a->head_dim % 16 == 0 &&
           a->head_dim <= 256 && a->n_heads / a->n_kv_heads <= 16;
}

extern "C" cudaError_t llmi_cuda_attn_decode(const llmi_cuda_attn *a, const int32_t *tokens, int n, int n_splits,
                                             float *work, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 || n_splits < 1 || n > 65535) return cudaErrorInvalidValue;
    if (n_splits > 1 && !work) return cudaErrorInvalidValue;
    const bool tc = decode_tc_ok(a);
    if (tc && a->kv_dt == LLMI_KV_BF16)
        launch_decode_tc_hd<__nv_bfloat16>(a, tokens, n, n_splits, work, s);
    else if (tc)
        launch_decode_tc_hd<__half>(a, tokens, n, n_splits, work, s);
    else if (a->kv_dt == LLMI_KV_BF16 && a->head_dim % 8 == 0)
        launch_decode<__nv_bfloat16>(a, tokens, n, n_splits, work, s);
    else if (a->kv_dt == LLMI_KV_F16 && a->head_dim % 8 == 0)
        launch_decode<__half>(a, tokens, n, n_splits, work, s);
    else
        launch_decode<float>(a, tokens, n, n_splits, work, s);
    LLMI_LAUNCH_CHECK();
    if (n_splits > 1) {
        llmi_attn_combine_kernel<<<dim3((unsigned)a->n_heads, (unsigned)n), 128, 0, s>>>(*a, tokens, n_splits, work);
        LLMI_LAUNCH_CHECK();
    }
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

/* The tensor-core kernels of one head_dim tier: the prefill's, and the decode's when its
 * query heads per KV head fit (decode), each for bf16 and f16. */
template <int HDMAX> static cudaError_t allow_tc_smem(int head_dim, bool decode) {
    const size_t pb = pf_smem_bytes<__nv_bfloat16>(head_dim), ph = pf_smem_bytes<__half>(head_dim);
    cudaError_t e = allow_smem(llmi_attn_prefill_kernel<__nv_bfloat16, HDMAX, false>, pb);
    if (e == cudaSuccess) e = allow_smem(llmi_attn_prefill_kernel<__nv_bfloat16, HDMAX, true>, pb);
    if (e == cudaSuccess) e = allow_smem(llmi_attn_prefill_kernel<__half, HDMAX, false>, ph);
    if (e == cudaSuccess) e = allow_smem(llmi_attn_prefill_kernel<__half, HDMAX, true>, ph);
    constexpr int s1 = dt_stages<false, HDMAX>::n, s2 = dt_stages<true, HDMAX>::n;
    if (e == cudaSuccess && decode)
        e = allow_smem(llmi_attn_decode_tc_kernel<__nv_bfloat16, HDMAX, false>, dt_smem_bytes<__nv_bfloat16>(head_dim, s1));
    if (e == cudaSuccess && decode)
        e = allow_smem(llmi_attn_decode_tc_kernel<__nv_bfloat16, HDMAX, true>, dt_smem_bytes<__nv_bfloat16>(head_dim, s2));
    if (e == cudaSuccess && decode)
        e = allow_smem(llmi_attn_decode_tc_kernel<__half, HDMAX, false>, dt_smem_bytes<__half>(head_dim, s1));
    if (e == cudaSuccess && decode)
        e = allow_smem(llmi_attn_decode_tc_kernel<__half, HDMAX, true>, dt_smem_bytes<__half>(head_dim, s2));
    return e;
}

extern "C" cudaError_t llmi_cuda_attn_init(int n_heads, int n_kv_heads, int head_dim) {
    if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || head_dim <= 0) return cudaErrorInvalidValue;
    const int G = n_heads / n_kv_heads;
    cudaError_t e = allow_smem(llmi_attn_decode_kernel<float>, decode_smem_bytes<float>(G, head_dim));
    if (e == cudaSuccess && head_dim % 8 == 0) {
        e = allow_smem(llmi_attn_decode_kernel<__nv_bfloat16>, decode_smem_bytes<__nv_bfloat16>(G, head_dim));
        if (e == cudaSuccess) e = allow_smem(llmi_attn_decode_kernel<__half>, decode_smem_bytes<__half>(G, head_dim));
    }
    if (e == cudaSuccess && head_dim % 16 == 0 && head_dim <= 256)
        e = head_dim <= 64    ? allow_tc_smem<64>(head_dim, G <= 16)
            : head_dim <= 128 ? allow_tc_smem<128>(head_dim, G <= 16)
                              : allow_tc_smem<256>(head_dim, G <= 16);
    return e;
}

extern "C" cudaError_t llmi_cuda_attn_prefill(const llmi_cuda_attn *a, const int32_t *tiles, int n_tiles,
                                              cudaStream_t s) {
    if (n_tiles <= 0) return cudaSuccess;
    if (a->head_dim % 16 != 0 || a->head_dim > 256 || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads != 0 ||
        n_tiles > 65535 || (uintptr_t)a->q % 16 != 0 || a->q_stride % 4 != 0)
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
