/* gemm.cu — owns the dense projections: cuBLASLt bf16 (or fp16) GEMMs with fp32
 * accumulation and fp32 output, and a bf16 GEMV for a few tokens (twin: cpu_matmul).  Row-major y = x W^T is the
 * column-major y^T = W x^T, so W is passed as A with op T and x as B without transpose. */
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

#define LT_CHECK(st, call)                                                                              \
    do {                                                                                                \
        cublasStatus_t s_ = (call);                                                                     \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                \
            return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: %s:%d: %s: %s", __FILE__, __LINE__, #call, \
                             cublasLtGetStatusString(s_));                                              \
    } while (0)
#define RT_CHECK(st, call)                                                                              \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess)                                                                          \
            return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: %s:%d: %s: %s", __FILE__, __LINE__, #call, \
                             cudaGetErrorString(e_));                                                   \
    } while (0)

static_assert(sizeof(cublasLtMatmulAlgo_t) <= 64, "llmi_cuda_gemm_algo.algo too small");

extern "C" int llmi_cuda_gemm_init(llmi_cuda_gemm *g, llmi_dtype dt, size_t workspace_bytes, llmi_status *st) {
    memset(g, 0, sizeof *g);
    if (dt != LLMI_BF16 && dt != LLMI_F16) return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: dtype must be bf16 or f16");
    g->dt = dt;
    cublasLtHandle_t h;
    LT_CHECK(st, cublasLtCreate(&h));
    g->handle = h;
    cublasLtMatmulDesc_t d;
    LT_CHECK(st, cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    g->desc = d;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(st, cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(st, cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtMatmulPreference_t p;
    LT_CHECK(st, cublasLtMatmulPreferenceCreate(&p));
    g->pref = p;
    uint64_t wb = workspace_bytes;
    LT_CHECK(st, cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wb, sizeof wb));
    if (workspace_bytes) RT_CHECK(st, cudaMalloc(&g->workspace, workspace_bytes));
    g->workspace_bytes = workspace_bytes;
    g->tune = 1;
    g->cache = (llmi_cuda_gemm_algo *)calloc(LLMI_GEMM_CACHE, sizeof *g->cache);
    if (!g->cache) return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: out of host memory");
    return 0;
}

static void algo_release(llmi_cuda_gemm_algo *a) {
    if (a->a_desc) cublasLtMatrixLayoutDestroy((cublasLtMatrixLayout_t)a->a_desc);
    if (a->b_desc) cublasLtMatrixLayoutDestroy((cublasLtMatrixLayout_t)a->b_desc);
    if (a->c_desc) cublasLtMatrixLayoutDestroy((cublasLtMatrixLayout_t)a->c_desc);
    memset(a, 0, sizeof *a);
}

extern "C" void llmi_cuda_gemm_free(llmi_cuda_gemm *g) {
    if (g->cache)
        for (int i = 0; i < LLMI_GEMM_CACHE; i++) algo_release(&g->cache[i]);
    free(g->cache);
    if (g->pref) cublasLtMatmulPreferenceDestroy((cublasLtMatmulPreference_t)g->pref);
    if (g->desc) cublasLtMatmulDescDestroy((cublasLtMatmulDesc_t)g->desc);
    if (g->handle) cublasLtDestroy((cublasLtHandle_t)g->handle);
    if (g->workspace) cudaFree(g->workspace);
    for (int i = 0; i < 2; i++)
        if (g->tune_ev[i]) cudaEventDestroy((cudaEvent_t)g->tune_ev[i]);
    memset(g, 0, sizeof *g);
}

static uint64_t key_hash(int64_t m, int64_t k, int64_t key_n, int64_t ldc, int64_t align) {
    uint64_t h = 1469598103934665603ull;
    const int64_t v[5] = {m, k, key_n, ldc, align};
    for (int i = 0; i < 5; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* The alignment (a power of two, at most 256) of an operand's pointer and row stride in
 * bytes.  The heuristic assumes 256 unless told, and may then pick an algorithm that
 * cannot run on an int4 linear's output, written at a column offset into the fused one. */
static uint32_t lt_align(const void *p, uint64_t ld_bytes) {
    const uint64_t a = (uint64_t)(uintptr_t)p | ld_bytes | 256u;
    return (uint32_t)(a & (~a + 1));
}

/* Points the entry's B and C layouts at n tokens (host-side attributes, no GPU work). */
static int algo_set_n(llmi_cuda_gemm_algo *a, int64_t n, llmi_status *st) {
    if (a->cur_n == n) return 0;
    uint64_t cols = (uint64_t)n;
    LT_CHECK(st, cublasLtMatrixLayoutSetAttribute((cublasLtMatrixLayout_t)a->b_desc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                  sizeof cols));
    LT_CHECK(st, cublasLtMatrixLayoutSetAttribute((cublasLtMatrixLayout_t)a->c_desc, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                  sizeof cols));
    a->cur_n = n;
    return 0;
}

/* The first `count` heuristic results, timed on the operands at n tokens (a's layouts set
 * to n): the index of the fastest that runs, 0 when none does (the caller's run then
 * reports why). */
static int tune_pick(llmi_cuda_gemm *g, llmi_cuda_gemm_algo *a, const cublasLtMatmulHeuristicResult_t *res, int count,
                     const void *w, const void *x, float *y, cudaStream_t s, int *pick, llmi_status *st) {
    *pick = 0;
    for (int i = 0; i < 2; i++)
        if (!g->tune_ev[i]) {
            cudaEvent_t e;
            RT_CHECK(st, cudaEventCreate(&e));
            g->tune_ev[i] = e;
        }
    cudaEvent_t e0 = (cudaEvent_t)g->tune_ev[0], e1 = (cudaEvent_t)g->tune_ev[1];
    const float alpha = 1.0f, beta = 0.0f;
    float best = 0;
    bool any = false;
    for (int i = 0; i < count; i++) {
        bool ran = true;
        RT_CHECK(st, cudaEventRecord(e0, s));
        /* the first run is the warm-up, and the check that this algorithm takes n */
        for (int r = 0; r <= LLMI_GEMM_TUNE_REPS && ran; r++) {
            if (r == 1) RT_CHECK(st, cudaEventRecord(e0, s));
            ran = cublasLtMatmul((cublasLtHandle_t)g->handle, (cublasLtMatmulDesc_t)g->desc, &alpha, w,
                                 (cublasLtMatrixLayout_t)a->a_desc, x, (cublasLtMatrixLayout_t)a->b_desc, &beta, y,
                                 (cublasLtMatrixLayout_t)a->c_desc, y, (cublasLtMatrixLayout_t)a->c_desc,
                                 &res[i].algo, g->workspace, g->workspace_bytes, s) == CUBLAS_STATUS_SUCCESS;
            g->tune_runs += ran;
        }
        g->tune_candidates += ran;
        RT_CHECK(st, cudaEventRecord(e1, s));
        RT_CHECK(st, cudaEventSynchronize(e1));
        float ms = 0;
        RT_CHECK(st, cudaEventElapsedTime(&ms, e0, e1));
        if (ran && (!any || ms < best)) best = ms, *pick = i, any = true;
    }
    if (any) g->tuned_keys++;
    return 0;
}

/* The cached entry for (m, k, key_n, ldc, align), asking the heuristic for key_n tokens on a
 * miss (and, with g->tune > 1 outside a graph capture, timing its candidates on w, x, y at
 * n tokens). */
static int algo_for(llmi_cuda_gemm *g, int64_t m, int64_t k, int64_t key_n, int64_t ldc, int64_t align, const void *w,
                    const void *x, int64_t n, float *y, cudaStream_t s, llmi_cuda_gemm_algo **out, llmi_status *st) {
    const uint64_t h = key_hash(m, k, key_n, ldc, align);
    llmi_cuda_gemm_algo *victim = NULL;
    for (int p = 0; p < LLMI_GEMM_PROBE; p++) {
        llmi_cuda_gemm_algo *a = &g->cache[(h + (uint64_t)p) & (LLMI_GEMM_CACHE - 1)];
        if (a->m == m && a->k == k && a->key_n == key_n && a->ldc == ldc && a->align == align) {
            a->last_use = ++g->clock;
            *out = a;
            return 0;
        }
        if (!victim || a->last_use < victim->last_use) victim = a;   /* empty slots have last_use 0 */
    }
    llmi_cuda_gemm_algo *a = victim;
    algo_release(a);
    cudaDataType_t t = g->dt == LLMI_F16 ? CUDA_R_16F : CUDA_R_16BF;
    cublasLtMatrixLayout_t A, B, C;
    LT_CHECK(st, cublasLtMatrixLayoutCreate(&A, t, (uint64_t)k, (uint64_t)m, k));   /* W^T view: (k, m), ld k */
    a->a_desc = A;
    LT_CHECK(st, cublasLtMatrixLayoutCreate(&B, t, (uint64_t)k, (uint64_t)key_n, k));   /* x^T: (k, n), ld k */
    a->b_desc = B;
    LT_CHECK(st, cublasLtMatrixLayoutCreate(&C, CUDA_R_32F, (uint64_t)m, (uint64_t)key_n, ldc));   /* y^T: (m, n), ld ldc */
    a->c_desc = C;
    a->cur_n = key_n;
    /* A, B, C and D (D is C) alignments, unpacked from the key */
    const uint32_t al[4] = {(uint32_t)(align >> 18) & 511u, (uint32_t)(align >> 9) & 511u, (uint32_t)align & 511u,
                            (uint32_t)align & 511u};
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        LT_CHECK(st, cublasLtMatmulPreferenceSetAttribute((cublasLtMatmulPreference_t)g->pref, which[i], &al[i],
                                                          sizeof al[i]));
    /* timing needs the stream to run: during a graph capture the heuristic's first is taken */
    int want = g->tune < 1 ? 1 : g->tune > LLMI_GEMM_TUNE_MAX ? LLMI_GEMM_TUNE_MAX : g->tune;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (want > 1) RT_CHECK(st, cudaStreamIsCapturing(s, &cs));
    if (cs != cudaStreamCaptureStatusNone) want = 1;
    cublasLtMatmulHeuristicResult_t res[LLMI_GEMM_TUNE_MAX];
    int n_res = 0, pick = 0;
    g->heuristic_calls++;
    LT_CHECK(st, cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)g->handle, (cublasLtMatmulDesc_t)g->desc, A, B, C,
                                                C, (cublasLtMatmulPreference_t)g->pref, want, res, &n_res));
    if (n_res < 1) {
        algo_release(a);
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: cuBLASLt has no algorithm for %s %lldx%lldx%lld",
                         dtype_name(g->dt), (long long)m, (long long)key_n, (long long)k);
    }
    if (n_res > 1 && (algo_set_n(a, n, st) || tune_pick(g, a, res, n_res, w, x, y, s, &pick, st))) {
        algo_release(a);
        return st->code;
    }
    memcpy(a->algo, &res[pick].algo, sizeof res[pick].algo);
    a->m = m; a->k = k; a->key_n = key_n; a->ldc = ldc; a->align = align;
    a->last_use = ++g->clock;
    *out = a;
    return 0;
}

/* ---- the decode GEMV: up to LLMI_GEMV_MAX_N tokens ----
 * At one token cuBLASLt read the small projections of a llama-3-8b at 2.0-2.6 TB/s on the
 * H200 (o_proj, qkv; 2026-11-26 profile) where the large ones reached 3.9.  The weights
 * are read once, whatever n: a block of GV_THREADS threads owns GV_ROWS rows and splits
 * their columns in 16-byte chunks (8 weights), GV_UNROLL chunks a row loaded before the
 * first is used, each activation chunk serving every row (the structure of int4_gemm.cu's
 * chunk GEMV).  fp32 products and sums (exact products of bf16 values; only the order of
 * the sums differs from cuBLASLt's and the CPU's); warp shuffles, then shared memory across
 * the block's warps. */
#define GV_THREADS 128
#define GV_ROWS 4
#define GV_UNROLL 2
template <int NT>
__global__ void __launch_bounds__(GV_THREADS) llmi_gemv_bf16_kernel(const __nv_bfloat16 *w, int rows, int cols,
                                                                    const __nv_bfloat16 *x, int n, float *y, int ldy) {
    __shared__ float partial[GV_THREADS / 32][NT][GV_ROWS];   /* a warp's sums */
    const int row0 = blockIdx.x * GV_ROWS, nchunks = cols / 8;
    const uint4 *wr[GV_ROWS];   /* a missing last row repeats the one before, unstored */
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) wr[r] = (const uint4 *)(w + (size_t)min(row0 + r, rows - 1) * cols);
    float acc[NT][GV_ROWS];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int r = 0; r < GV_ROWS; r++) acc[t][r] = 0.0f;
    for (int base = threadIdx.x; base < nchunks; base += GV_THREADS * GV_UNROLL) {
        uint4 chunk[GV_UNROLL][GV_ROWS];
        llmi_gemv_load<GV_UNROLL, GV_ROWS, GV_THREADS>(wr, base, nchunks, chunk);
#pragma unroll
        for (int u = 0; u < GV_UNROLL; u++) {
            const int c = base + u * GV_THREADS;
            if (c >= nchunks) break;
            float wv[GV_ROWS][8];
#pragma unroll
            for (int r = 0; r < GV_ROWS; r++) llmi_bf16x8_f32(chunk[u][r], wv[r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n) break;
                float xv[8];
                llmi_bf16x8_f32(__ldg((const uint4 *)(x + (size_t)t * cols) + c), xv);
#pragma unroll
                for (int r = 0; r < GV_ROWS; r++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[t][r] = fmaf(xv[j], wv[r][j], acc[t][r]);
            }
        }
    }
    llmi_gemv_finish<NT, GV_ROWS, GV_THREADS>(acc, partial, n, row0, rows, nullptr, y, ldy);
}

extern "C" bool llmi_cuda_gemv_fits(llmi_dtype dt, const void *w, int64_t rows, int64_t cols, const void *x, int n) {
    return dt == LLMI_BF16 && n >= 1 && n <= LLMI_GEMV_MAX_N && rows >= 1 && rows <= INT32_MAX / 2 && cols >= 8 &&
           cols % 8 == 0 && cols <= INT32_MAX && (uintptr_t)w % 16 == 0 && (uintptr_t)x % 16 == 0;
}

extern "C" cudaError_t llmi_cuda_gemv(const void *w, int64_t rows, int64_t cols, const void *x, int n, float *y,
                                      int64_t ldy, cudaStream_t s) {
    if (!llmi_cuda_gemv_fits(LLMI_BF16, w, rows, cols, x, n) || ldy < rows || ldy > INT32_MAX)
        return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)((rows + GV_ROWS - 1) / GV_ROWS);
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)w, *xb = (const __nv_bfloat16 *)x;
    const int r = (int)rows, c = (int)cols, ld = (int)ldy;
    if (n == 1) llmi_gemv_bf16_kernel<1><<<blocks, GV_THREADS, 0, s>>>(wb, r, c, xb, n, y, ld);
    else if (n == 2) llmi_gemv_bf16_kernel<2><<<blocks, GV_THREADS, 0, s>>>(wb, r, c, xb, n, y, ld);
    else llmi_gemv_bf16_kernel<4><<<blocks, GV_THREADS, 0, s>>>(wb, r, c, xb, n, y, ld);
    LLMI_LAUNCH_CHECK();
    return cudaSuccess;
}

extern "C" int llmi_cuda_gemm_run(llmi_cuda_gemm *g, const void *w, int64_t rows, int64_t cols, const void *x, int n,
                                  int key_n, float *y, int64_t ldy, cudaStream_t s, llmi_status *st) {
    if (n <= 0) return 0;
    if (rows <= 0 || cols <= 0 || ldy < rows || key_n < n)
        return llmi_fail(st, LLMI_E_RUNTIME, "cuda gemm: bad shape %lldx%lld, %d tokens (key %d), ldy %lld",
                         (long long)rows, (long long)cols, n, key_n, (long long)ldy);
    if (n <= g->gemv_max_n && llmi_cuda_gemv_fits(g->dt, w, rows, cols, x, n)) {
        g->gemv_runs++;
        RT_CHECK(st, llmi_cuda_gemv(w, rows, cols, x, n, y, ldy, s));
        return 0;
    }
    const uint64_t in_ld = (uint64_t)cols * 2;   /* bf16 or f16 rows of W and x */
    const int64_t align = ((int64_t)lt_align(w, in_ld) << 18) | ((int64_t)lt_align(x, in_ld) << 9) |
                          (int64_t)lt_align(y, (uint64_t)ldy * 4);
    llmi_cuda_gemm_algo *a;
    if (algo_for(g, rows, cols, key_n, ldy, align, w, x, n, y, s, &a, st) || algo_set_n(a, n, st)) return st->code;
    const float alpha = 1.0f, beta = 0.0f;
    cublasLtMatmulAlgo_t algo;
    memcpy(&algo, a->algo, sizeof algo);
    cublasStatus_t r = cublasLtMatmul((cublasLtHandle_t)g->handle, (cublasLtMatmulDesc_t)g->desc, &alpha, w,
                                      (cublasLtMatrixLayout_t)a->a_desc, x, (cublasLtMatrixLayout_t)a->b_desc, &beta,
                                      y, (cublasLtMatrixLayout_t)a->c_desc, y, (cublasLtMatrixLayout_t)a->c_desc, &algo,
                                      g->workspace, g->workspace_bytes, s);
    if ((r == CUBLAS_STATUS_NOT_SUPPORTED || r == CUBLAS_STATUS_INVALID_VALUE) && key_n != n) {
        /* the bucket's algorithm does not take this n: an exact entry for it, counted when it
         * is made (every later call with this n is refused again and reuses the entry, so
         * counting refusals would break heuristic_calls - exact_fallbacks == buckets asked) */
        const long asked = g->heuristic_calls;
        const int rc = llmi_cuda_gemm_run(g, w, rows, cols, x, n, n, y, ldy, s, st);
        if (g->heuristic_calls > asked) g->exact_fallbacks++;
        return rc;
    }
    LT_CHECK(st, r);
    return 0;
}
