/* blas.cpp — owns the emulated cuBLAS, cuBLASLt and cuSOLVER calls llmi makes: plain loops
 * (double accumulation, so tolerances that pass here hold for the library's fp32 up to its
 * own rounding), queued on the handle's stream like the library's kernels.  Each call first
 * checks its operands lie inside one device allocation and, for cuBLASLt, that shapes agree
 * with the layouts and pointers are as aligned as the heuristic was told. */
#include "cuda_runtime.h"
#include "cublasLt.h"
#include "cublas_v2.h"
#include "cusolverDn.h"
#include <memory>

void emu_error(const char *fmt, ...);
long emu_enqueue(cudaStream_t s, const char *what, std::function<void()> op);
bool emu_dev_range(const void *p, size_t n);

struct cublasContext { cudaStream_t s = nullptr; cublasMath_t math = CUBLAS_DEFAULT_MATH; };
struct cublasLtContext { int x; };
struct emuLtDesc { cublasComputeType_t ct; cudaDataType_t scale; cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N; };
struct emuLtLayout { cudaDataType t; uint64_t rows, cols; int64_t ld; };
struct emuLtPref { uint64_t ws = 0; uint32_t align[4] = {256, 256, 256, 256}; };
struct cusolverDnContext { cudaStream_t s = nullptr; };

extern "C" const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated error)"; }
extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

static double ld_elem(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_64F: return ((const double *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    }
    return NAN;
}
static size_t tsize(cudaDataType t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }

/* column-major C(m,n) = alpha op(A) op(B) + beta C; op(A) is m x k */
static void gemm_ref(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const void *A, cudaDataType at,
                     int64_t lda, const void *B, cudaDataType bt, int64_t ldb, double beta, void *C, cudaDataType ct,
                     int64_t ldc) {
    std::vector<double> a((size_t)m * k), b((size_t)k * n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t l = 0; l < k; l++) a[(size_t)i * k + l] = ld_elem(A, at, ta ? (size_t)(i * lda + l) : (size_t)(l * lda + i));
    for (int64_t l = 0; l < k; l++)
        for (int64_t j = 0; j < n; j++) b[(size_t)j * k + l] = ld_elem(B, bt, tb ? (size_t)(l * ldb + j) : (size_t)(j * ldb + l));
#pragma omp parallel for schedule(static) if ((double)m * n * k > 1e6)
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            double s = 0;
            for (int64_t l = 0; l < k; l++) s += a[(size_t)i * k + l] * b[(size_t)j * k + l];
            size_t ci = (size_t)(j * ldc + i);
            double c = beta != 0.0 ? beta * ld_elem(C, ct, ci) : 0.0;
            double v = alpha * s + c;
            if (ct == CUDA_R_32F) ((float *)C)[ci] = (float)v;
            else if (ct == CUDA_R_64F) ((double *)C)[ci] = v;
            else if (ct == CUDA_R_16BF) ((__nv_bfloat16 *)C)[ci] = __float2bfloat16_rn((float)v);
            else ((__half *)C)[ci] = __float2half_rn((float)v);
        }
}
/* the extent a column-major (rows, cols, ld) operand covers, checked against its allocation */
static bool operand_ok(const char *who, const char *which, const void *p, cudaDataType t, int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 0 || cols <= 0) return true;
    if (ld < rows) { emu_error("%s: %s ld %lld < rows %lld", who, which, (long long)ld, (long long)rows); return false; }
    size_t n = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * tsize(t);
    if (!emu_dev_range(p, n)) { emu_error("%s: %s (%lld x %lld, ld %lld) is not inside one device allocation", who, which, (long long)rows, (long long)cols, (long long)ld); return false; }
    return true;
}

/* ---------------- cuBLAS ---------------- */
extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new cublasContext; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h) { cudaDeviceSynchronize(); delete h; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->s = s; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) { h->math = m; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                       cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                       cublasComputeType_t ctype, cublasGemmAlgo_t) {
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (ctype == CUBLAS_COMPUTE_32F && h->math == CUBLAS_PEDANTIC_MATH && at != CUDA_R_32F) {
        emu_error("cublasGemmEx: 16-bit inputs under CUBLAS_PEDANTIC_MATH (refused on tensor cores)");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!operand_ok("cublasGemmEx", "A", A, at, ta ? k : m, ta ? m : k, lda) ||
        !operand_ok("cublasGemmEx", "B", B, bt, tb ? n : k, tb ? k : n, ldb) || !operand_ok("cublasGemmEx", "C", C, ct, m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    double al = *(const float *)alpha, be = *(const float *)beta;
    emu_enqueue(h->s, "cublasGemmEx", [=]() { gemm_ref(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc); });
    return CUBLAS_STATUS_SUCCESS;
}
/* the fp32 GEMM is GemmEx's on fp32 operands */
extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                      const float *alpha, const float *A, int lda, const float *B, int ldb,
                                      const float *beta, float *C, int ldc) {
    return cublasGemmEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
extern "C" cublasStatus_t cublasSsyrk(cublasHandle_t h, cublasFillMode_t uplo, cublasOperation_t trans, int n, int k,
                                      const float *alpha, const float *A, int lda, const float *beta, float *C, int ldc) {
    if (!operand_ok("cublasSsyrk", "A", A, CUDA_R_32F, trans ? k : n, trans ? n : k, lda) ||
        !operand_ok("cublasSsyrk", "C", C, CUDA_R_32F, n, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    double al = *alpha, be = *beta;
    emu_enqueue(h->s, "cublasSsyrk", [=]() {
        for (int j = 0; j < n; j++)
            for (int i = uplo == CUBLAS_FILL_MODE_LOWER ? j : 0; i < (uplo == CUBLAS_FILL_MODE_LOWER ? n : j + 1); i++) {
                double s = 0;
                for (int l = 0; l < k; l++) {
                    double x = trans ? A[(size_t)i * lda + l] : A[(size_t)l * lda + i];
                    double y = trans ? A[(size_t)j * lda + l] : A[(size_t)l * lda + j];
                    s += x * y;
                }
                float *c = &C[(size_t)j * ldc + i];
                *c = (float)(al * s + (be != 0.0 ? be * *c : 0.0));
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------- cuBLASLt ---------------- */
extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = new cublasLtContext; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t sc) {
    *d = new emuLtDesc{ct, sc};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *v, size_t n) {
    if (n != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_DESC_TRANSA) d->ta = *(const cublasOperation_t *)v;
    else if (a == CUBLASLT_MATMUL_DESC_TRANSB) d->tb = *(const cublasOperation_t *)v;
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new emuLtLayout{t, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, const void *v, size_t n) {
    if (n != 8) return CUBLAS_STATUS_INVALID_VALUE;
    uint64_t x = *(const uint64_t *)v;
    if (a == CUBLASLT_MATRIX_LAYOUT_ROWS) l->rows = x;
    else if (a == CUBLASLT_MATRIX_LAYOUT_COLS) l->cols = x;
    else if (a == CUBLASLT_MATRIX_LAYOUT_LD) l->ld = (int64_t)x;
    else return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { *p = new emuLtPref; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const void *v, size_t n) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) { if (n != 8) return CUBLAS_STATUS_INVALID_VALUE; p->ws = *(const uint64_t *)v; return CUBLAS_STATUS_SUCCESS; }
    if (n != 4) return CUBLAS_STATUS_INVALID_VALUE;
    int i = a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
    if (i < 0 || i > 3) return CUBLAS_STATUS_INVALID_VALUE;
    p->align[i] = *(const uint32_t *)v;
    return CUBLAS_STATUS_SUCCESS;
}
/* the algorithm remembers the alignments it was promised: a matmul with operands less aligned
 * is refused, as a real kernel chosen for them may be.  It remembers the n it was chosen for
 * too: with LLMI_EMU_LT_EXACT_N=1 a matmul with another n is refused (CUBLAS_STATUS_NOT_SUPPORTED),
 * as cuBLASLt may refuse an algorithm outside the shape it was asked for, so that the caller's
 * fallback (gemm.cu's exact entry for n) runs here too. */
/* variant: which of the heuristic's candidates (all compute the same; llmi's autotuning
 * times them) */
struct EmuAlgo { uint32_t magic, align[4]; uint64_t ws; int64_t n; uint32_t variant; };
static_assert(sizeof(EmuAlgo) <= sizeof(cublasLtMatmulAlgo_t), "EmuAlgo fits the opaque algo");
extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                                         cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                         cublasLtMatmulPreference_t p, int req, cublasLtMatmulHeuristicResult_t *res, int *n_res) {
    if (req < 1) return CUBLAS_STATUS_INVALID_VALUE;
    for (int i = 0; i < 4; i++)
        if (p->align[i] & (p->align[i] - 1)) return CUBLAS_STATUS_INVALID_VALUE;
    const int n = req < 3 ? req : 3;   /* up to three candidates, as a real heuristic offers several */
    memset(res, 0, sizeof *res * (size_t)n);
    for (int i = 0; i < n; i++) {
        EmuAlgo a{0xA160A160u, {p->align[0], p->align[1], p->align[2], p->align[3]}, 0,
                  (int64_t)(d->tb ? B->rows : B->cols), (uint32_t)i};
        memcpy(&res[i].algo, &a, sizeof a);
    }
    (void)A; (void)C; (void)D;
    *n_res = n;
    return CUBLAS_STATUS_SUCCESS;
}
static uint32_t ptr_align(const void *p, int64_t ld_bytes) {
    uint64_t a = (uint64_t)(uintptr_t)p | (uint64_t)ld_bytes | 256u;
    return (uint32_t)(a & (~a + 1));
}
extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                                         cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                                         const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                                         const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s) {
    EmuAlgo a;
    memcpy(&a, algo, sizeof a);
    if (a.magic != 0xA160A160u) { emu_error("cublasLtMatmul: algo not from the heuristic"); return CUBLAS_STATUS_INVALID_VALUE; }
    const void *ptrs[4] = {A, B, C, D};
    const cublasLtMatrixLayout_t ls[4] = {Ad, Bd, Cd, Dd};
    for (int i = 0; i < 4; i++)
        if (ptr_align(ptrs[i], ls[i]->ld * (int64_t)tsize(ls[i]->t)) < a.align[i]) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int64_t m = d->ta ? Ad->cols : Ad->rows, k = d->ta ? Ad->rows : Ad->cols;
    const int64_t kb = d->tb ? Bd->cols : Bd->rows, n = d->tb ? Bd->rows : Bd->cols;
    static const bool exact_n = getenv("LLMI_EMU_LT_EXACT_N") && !strcmp(getenv("LLMI_EMU_LT_EXACT_N"), "1");
    if (exact_n && n != a.n) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (k != kb || (int64_t)Cd->rows != m || (int64_t)Cd->cols != n || Dd->rows != Cd->rows || Dd->cols != Cd->cols) {
        emu_error("cublasLtMatmul: shapes disagree: op(A) %lldx%lld op(B) %lldx%lld C %llux%llu", (long long)m, (long long)k,
                  (long long)kb, (long long)n, (unsigned long long)Cd->rows, (unsigned long long)Cd->cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (Ad->t != Bd->t || (Ad->t != CUDA_R_16BF && Ad->t != CUDA_R_16F) || Cd->t != CUDA_R_32F || Dd->t != CUDA_R_32F) {
        emu_error("cublasLtMatmul: types A %d B %d C %d D %d not emulated", Ad->t, Bd->t, Cd->t, Dd->t);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (ws_bytes && !emu_dev_range(ws, ws_bytes)) { emu_error("cublasLtMatmul: workspace not device memory"); return CUBLAS_STATUS_INVALID_VALUE; }
    if (!operand_ok("cublasLtMatmul", "A", A, Ad->t, Ad->rows, Ad->cols, Ad->ld) ||
        !operand_ok("cublasLtMatmul", "B", B, Bd->t, Bd->rows, Bd->cols, Bd->ld) ||
        !operand_ok("cublasLtMatmul", "D", D, Dd->t, Dd->rows, Dd->cols, Dd->ld))
        return CUBLAS_STATUS_INVALID_VALUE;
    double al = *(const float *)alpha, be = *(const float *)beta;
    if (be != 0.0 && C != D) { emu_error("cublasLtMatmul: C != D with beta (not emulated)"); return CUBLAS_STATUS_NOT_SUPPORTED; }
    const int ta = d->ta, tb = d->tb;
    const cudaDataType at = Ad->t;
    const int64_t lda = Ad->ld, ldb = Bd->ld, ldd = Dd->ld;
    emu_enqueue(s, "cublasLtMatmul", [=]() { gemm_ref(ta, tb, m, n, k, al, A, at, lda, B, at, ldb, be, D, CUDA_R_32F, ldd); });
    return CUBLAS_STATUS_SUCCESS;
}

/* ---------------- cuSOLVER ---------------- */
extern "C" cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *h) { *h = new cusolverDnContext; return CUSOLVER_STATUS_SUCCESS; }
extern "C" cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t h) { cudaDeviceSynchronize(); delete h; return CUSOLVER_STATUS_SUCCESS; }
extern "C" cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t h, cudaStream_t s) { h->s = s; return CUSOLVER_STATUS_SUCCESS; }
extern "C" cusolverStatus_t cusolverDnDpotrf_bufferSize(cusolverDnHandle_t, cublasFillMode_t, int n, double *, int, int *lwork) {
    *lwork = n > 0 ? n : 1;
    return CUSOLVER_STATUS_SUCCESS;
}
extern "C" cusolverStatus_t cusolverDnDpotrf(cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double *A, int lda,
                                             double *work, int lwork, int *info) {
    if (uplo != CUBLAS_FILL_MODE_LOWER) { emu_error("cusolverDnDpotrf: only lower emulated"); return CUSOLVER_STATUS_INVALID_VALUE; }
    if (!operand_ok("cusolverDnDpotrf", "A", A, CUDA_R_64F, n, n, lda) || !emu_dev_range(work, (size_t)lwork * 8) || !emu_dev_range(info, 4))
        return CUSOLVER_STATUS_INVALID_VALUE;
    emu_enqueue(h->s, "cusolverDnDpotrf", [=]() {
        *info = 0;
        for (int j = 0; j < n; j++) {
            double s = A[(size_t)j * lda + j];
            for (int l = 0; l < j; l++) s -= A[(size_t)l * lda + j] * A[(size_t)l * lda + j];
            if (!(s > 0)) { *info = j + 1; return; }
            double d = sqrt(s);
            A[(size_t)j * lda + j] = d;
            for (int i = j + 1; i < n; i++) {
                double t = A[(size_t)j * lda + i];
                for (int l = 0; l < j; l++) t -= A[(size_t)l * lda + i] * A[(size_t)l * lda + j];
                A[(size_t)j * lda + i] = t / d;
            }
        }
    });
    return CUSOLVER_STATUS_SUCCESS;
}
extern "C" cusolverStatus_t cusolverDnXtrtri_bufferSize(cusolverDnHandle_t, cublasFillMode_t, cublasDiagType_t, int64_t n,
                                                        cudaDataType, void *, int64_t, size_t *dws, size_t *hws) {
    *dws = (size_t)(n > 0 ? n : 1) * 8;
    *hws = 0;
    return CUSOLVER_STATUS_SUCCESS;
}
extern "C" cusolverStatus_t cusolverDnXtrtri(cusolverDnHandle_t h, cublasFillMode_t uplo, cublasDiagType_t diag, int64_t n,
                                             cudaDataType t, void *Av, int64_t lda, void *dwork, size_t dws, void *, size_t,
                                             int *info) {
    if (uplo != CUBLAS_FILL_MODE_LOWER || diag != CUBLAS_DIAG_NON_UNIT || t != CUDA_R_64F) {
        emu_error("cusolverDnXtrtri: only lower, non-unit, fp64 emulated");
        return CUSOLVER_STATUS_INVALID_VALUE;
    }
    double *A = (double *)Av;
    if (!operand_ok("cusolverDnXtrtri", "A", A, CUDA_R_64F, n, n, lda) || !emu_dev_range(dwork, dws) || !emu_dev_range(info, 4))
        return CUSOLVER_STATUS_INVALID_VALUE;
    emu_enqueue(h->s, "cusolverDnXtrtri", [=]() {
        *info = 0;
        for (int64_t j = 0; j < n; j++)
            if (A[j * lda + j] == 0.0) { *info = (int)j + 1; return; }
        std::vector<double> X((size_t)(n * n), 0.0);   /* inverse, column-major */
        for (int64_t j = 0; j < n; j++) {
            X[(size_t)(j * n + j)] = 1.0 / A[j * lda + j];
            for (int64_t i = j + 1; i < n; i++) {
                double s = 0;
                for (int64_t l = j; l < i; l++) s += A[l * lda + i] * X[(size_t)(j * n + l)];
                X[(size_t)(j * n + i)] = -s / A[i * lda + i];
            }
        }
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = j; i < n; i++) A[j * lda + i] = X[(size_t)(j * n + i)];
    });
    return CUSOLVER_STATUS_SUCCESS;
}
