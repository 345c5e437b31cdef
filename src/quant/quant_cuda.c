/* quant_cuda.c — the GPU path of the quantizer (see quant_cuda.h): tier 3 around the
 * kernels of kernels/quant_gptq.cu, cuBLAS (syrk, gemm) and cuSOLVER (potrf, trtri).  Every
 * CUDA, cuBLAS and cuSOLVER call goes through a check that turns a failure into an
 * llmi_status naming file, line and call. */
#include <stdlib.h>
#include <string.h>
#include "quant/awq.h"
#include "quant/quant_cuda.h"
#include "quant/quantize.h"

const char *const quant_cuda_stage_names[QCT_COUNT] = {"gram", "gram_end", "factor", "upload", "walk", "error",
                                                       "download", "clip"};

#ifndef LLMI_CUDA

int quant_cuda_create(quant_cuda **q, int gpu, llmi_status *st) {
    (void)gpu;
    *q = NULL;
    return llmi_fail(st, LLMI_E_USAGE, "--device cuda: this llmi was built without CUDA (nvcc not found at build time)");
}
void quant_cuda_destroy(quant_cuda *q) { (void)q; }
const char *quant_cuda_device_name(const quant_cuda *q) { (void)q; return "none"; }
int quant_cuda_gpu(const quant_cuda *q) { (void)q; return -1; }
#define QC_NONE(...) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: built without CUDA")
int quant_cuda_alloc(quant_cuda *q, size_t bytes, const char *what, void **p, llmi_status *st) {
    (void)q, (void)bytes, (void)what;
    *p = NULL;
    QC_NONE();
}
void quant_cuda_free(quant_cuda *q, void *p) { (void)q, (void)p; }
int quant_cuda_mem_free(quant_cuda *q, size_t *free_bytes, llmi_status *st) {
    (void)q;
    *free_bytes = 0;
    QC_NONE();
}
int quant_cuda_gram_begin(quant_cuda *q, int slot, int k, llmi_status *st) { (void)q, (void)slot, (void)k; QC_NONE(); }
int quant_cuda_gram_acc_device(quant_cuda *q, int slot, const void *x, llmi_dtype dt, int n, float scale,
                               llmi_status *st) {
    (void)q, (void)slot, (void)x, (void)dt, (void)n, (void)scale;
    QC_NONE();
}
int quant_cuda_gram_end(quant_cuda *q, int slot, float *h, float *xmean, llmi_status *st) {
    (void)q, (void)slot, (void)h, (void)xmean;
    QC_NONE();
}
int quant_cuda_gptq_prepare(quant_cuda *q, const float *h, int slot, float h_scale, int cols, const quant_gptq_opts *o,
                            quant_gptq_hinv *hv, llmi_status *st) {
    (void)q, (void)h, (void)slot, (void)h_scale, (void)cols, (void)o, (void)hv;
    QC_NONE();
}
int quant_cuda_gptq_apply(quant_cuda *q, const float *w, int rows, const quant_gptq_hinv *hv,
                          const quant_gptq_opts *o, quant_grid *g, double *err, double *rel_err, llmi_status *st) {
    (void)q, (void)w, (void)rows, (void)hv, (void)o, (void)g, (void)err, (void)rel_err;
    QC_NONE();
}
void quant_cuda_take_times(quant_cuda *q, double t[QCT_COUNT]) { (void)q, (void)t; }
int quant_cuda_rel_err(quant_cuda *q, const float *w, const quant_grid *g, const float *h, double *rel_err,
                       llmi_status *st) {
    (void)q, (void)w, (void)g, (void)h, (void)rel_err;
    QC_NONE();
}
int quant_cuda_awq_clip(quant_cuda *q, float *w, int rows, int cols, const float *h, int group_size, int n_shrink,
                        llmi_status *st) {
    (void)q, (void)w, (void)rows, (void)cols, (void)h, (void)group_size, (void)n_shrink;
    QC_NONE();
}
int quant_cuda_awq_search_scale(quant_cuda *q, float *const *ws, const int *rows, int n_lin, int cols,
                                const float *x_mean, const float *h, int group_size, int n_grid, float *best_s,
                                double *best_loss, llmi_status *st) {
    (void)q, (void)ws, (void)rows, (void)n_lin, (void)cols, (void)x_mean, (void)h, (void)group_size, (void)n_grid;
    (void)best_s, (void)best_loss;
    QC_NONE();
}

#else

#include <math.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cusolverDn.h>
#include "quant_kernels.h"

#define QC_CUDA(st, call)                                                                                        \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess)                                                                                   \
            return llmi_fail((st), LLMI_E_RUNTIME, "quantize cuda: %s:%d: %s: %s", __FILE__, __LINE__, #call,   \
                             cudaGetErrorString(e_));                                                            \
    } while (0)
#define QC_BLAS(st, call)                                                                                        \
    do {                                                                                                         \
        cublasStatus_t s_ = (call);                                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                         \
            return llmi_fail((st), LLMI_E_RUNTIME, "quantize cuda: %s:%d: %s: %s", __FILE__, __LINE__, #call,   \
                             cublasGetStatusString(s_));                                                         \
    } while (0)
#define QC_SOLVER(st, call)                                                                                      \
    do {                                                                                                         \
        cusolverStatus_t s_ = (call);                                                                            \
        if (s_ != CUSOLVER_STATUS_SUCCESS)                                                                       \
            return llmi_fail((st), LLMI_E_RUNTIME, "quantize cuda: %s:%d: %s: cusolver status %d", __FILE__,     \
                             __LINE__, #call, (int)s_);                                                          \
    } while (0)

struct quant_cuda {
    int device;
    char name[128];
    cudaStream_t stream;
    cublasHandle_t blas;
    cusolverDnHandle_t solver;
    float *gram[QUANT_CUDA_SLOTS];  /* (k, k) each, device */
    float *xmean[QUANT_CUDA_SLOTS]; /* (k) each, device: the slot's mean |x| */
    int gram_k[QUANT_CUDA_SLOTS];
    float *u;                       /* (u_cols, u_cols) device: U of the last prepare */
    int u_cols;
    int32_t *perm;                  /* (u_cols) device */
    uint8_t *dead;                  /* (u_cols) device */
    float *h_own;                   /* (h_own_cols, h_own_cols) device: a host H the last prepare uploaded */
    int h_own_cols;
    const float *h_cur;             /* (u_cols, u_cols) device: the last prepare's H (h_own or a Gram slot) */
    double *scalar;                 /* (1) device: losses and dots */
    int clip_gs;                    /* the group size llmi_cuda_awq_clip_init was run for, 0: none */
    double times[QCT_COUNT];        /* seconds by stage since quant_cuda_take_times */
};

/* Adds the seconds since *t0 to stage s and restarts the clock. */
static void qc_lap(quant_cuda *q, quant_cuda_stage s, double *t0) {
    double t = quant_now();
    q->times[s] += t - *t0;
    *t0 = t;
}

void quant_cuda_take_times(quant_cuda *q, double t[QCT_COUNT]) {
    for (int i = 0; i < QCT_COUNT; i++) t[i] += q->times[i], q->times[i] = 0;
}

const char *quant_cuda_device_name(const quant_cuda *q) { return q->name; }
int quant_cuda_gpu(const quant_cuda *q) { return q->device; }

void quant_cuda_destroy(quant_cuda *q) {
    if (!q) return;
    cudaSetDevice(q->device);
    for (int i = 0; i < QUANT_CUDA_SLOTS; i++) cudaFree(q->gram[i]), cudaFree(q->xmean[i]);
    cudaFree(q->u), cudaFree(q->perm), cudaFree(q->dead), cudaFree(q->h_own), cudaFree(q->scalar);
    if (q->solver) cusolverDnDestroy(q->solver);
    if (q->blas) cublasDestroy(q->blas);
    if (q->stream) cudaStreamDestroy(q->stream);
    free(q);
}

int quant_cuda_create(quant_cuda **out, int gpu, llmi_status *st) {
    *out = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        return llmi_fail(st, LLMI_E_USAGE, "--device cuda: no usable CUDA device (driver missing or no GPU)");
    if (gpu < 0 || gpu >= count)
        return llmi_fail(st, LLMI_E_USAGE, "--gpu %d: out of range, this machine has %d CUDA device(s)", gpu, count);
    quant_cuda *q = calloc(1, sizeof *q);
    if (!q) return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: out of host memory");
    q->device = gpu;
    int rc = 0;
    struct cudaDeviceProp prop;
    cudaError_t ce = cudaSetDevice(gpu);
    if (!ce) ce = cudaGetDeviceProperties(&prop, gpu);
    if (!ce) ce = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
    if (!ce) ce = cudaMalloc((void **)&q->scalar, sizeof(double));
    if (ce) rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot set up GPU %d: %s", gpu, cudaGetErrorString(ce));
    cublasStatus_t bs = rc ? CUBLAS_STATUS_SUCCESS : cublasCreate(&q->blas);
    if (!rc && !bs) bs = cublasSetStream(q->blas, q->stream);
    if (!rc && !bs) bs = cublasSetMathMode(q->blas, CUBLAS_PEDANTIC_MATH);   /* exact fp32: the CPU twin's, not TF32 */
    if (bs) rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cuBLAS on GPU %d: %s", gpu, cublasGetStatusString(bs));
    cusolverStatus_t ss = rc ? CUSOLVER_STATUS_SUCCESS : cusolverDnCreate(&q->solver);
    if (!rc && !ss) ss = cusolverDnSetStream(q->solver, q->stream);
    if (ss) rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cuSOLVER on GPU %d: status %d", gpu, (int)ss);
    if (rc) {
        quant_cuda_destroy(q);
        return rc;
    }
    snprintf(q->name, sizeof q->name, "%.127s", prop.name);
    *out = q;
    return 0;
}

int quant_cuda_alloc(quant_cuda *q, size_t bytes, const char *what, void **p, llmi_status *st) {
    *p = NULL;
    QC_CUDA(st, cudaSetDevice(q->device));
    if (cudaMalloc(p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot allocate %.2f GiB for %s on GPU %d (%.2f GiB free)",
                         (double)bytes / 1073741824.0, what, q->device, (double)free_b / 1073741824.0);
    }
    return 0;
}

void quant_cuda_free(quant_cuda *q, void *p) {
    if (!p) return;
    cudaSetDevice(q->device);
    cudaFree(p);
}

int quant_cuda_mem_free(quant_cuda *q, size_t *free_bytes, llmi_status *st) {
    size_t total = 0;
    *free_bytes = 0;
    QC_CUDA(st, cudaSetDevice(q->device));
    QC_CUDA(st, cudaMemGetInfo(free_bytes, &total));
    return 0;
}

/* ---- Gram matrices ---- */

int quant_cuda_gram_begin(quant_cuda *q, int slot, int k, llmi_status *st) {
    QC_CUDA(st, cudaSetDevice(q->device));
    if (q->h_cur == q->gram[slot]) q->h_cur = NULL;   /* the last prepare's H is gone */
    if (q->gram_k[slot] != k) {
        cudaFree(q->gram[slot]), cudaFree(q->xmean[slot]);
        q->gram[slot] = q->xmean[slot] = NULL;
        q->gram_k[slot] = 0;
        QC_CUDA(st, cudaMalloc((void **)&q->gram[slot], (size_t)k * k * sizeof(float)));
        QC_CUDA(st, cudaMalloc((void **)&q->xmean[slot], (size_t)k * sizeof(float)));
        q->gram_k[slot] = k;
    }
    QC_CUDA(st, cudaMemsetAsync(q->gram[slot], 0, (size_t)k * k * sizeof(float), q->stream));
    QC_CUDA(st, cudaMemsetAsync(q->xmean[slot], 0, (size_t)k * sizeof(float), q->stream));
    return 0;
}

int quant_cuda_gram_acc_device(quant_cuda *q, int slot, const void *x, llmi_dtype dt, int n, float scale,
                               llmi_status *st) {
    const int k = q->gram_k[slot];
    if (dt != LLMI_F32 && dt != LLMI_BF16 && dt != LLMI_F16)
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: activations in %s have no Gram matrix path", dtype_name(dt));
    if (n <= 0) return 0;
    double t0 = quant_now();
    /* x (n, k) row-major is x^T (k, n) column-major: h += scale * (x^T)(x^T)^T.  Column-major
     * lower is row-major upper, the triangle quant_gram_mirror (and the mirror kernel) copy
     * from; the 16-bit path's GEMM fills both, and the mirror makes them equal. */
    const float one = 1.0f;
    if (dt == LLMI_F32) {
        QC_BLAS(st, cublasSsyrk(q->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, k, n, &scale, x, k, &one, q->gram[slot],
                                k));
    } else {
        /* pedantic math would refuse tensor cores; the products of 16-bit values are exact in
         * fp32 and the sums are fp32 (CUBLAS_COMPUTE_32F: the tensor cores' accumulation, a
         * few ulps from round-to-nearest at every add) */
        const cudaDataType t = dt == LLMI_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        QC_BLAS(st, cublasSetMathMode(q->blas, CUBLAS_DEFAULT_MATH));
        cublasStatus_t gs = cublasGemmEx(q->blas, CUBLAS_OP_N, CUBLAS_OP_T, k, k, n, &scale, x, t, k, x, t, k, &one,
                                         q->gram[slot], CUDA_R_32F, k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        QC_BLAS(st, cublasSetMathMode(q->blas, CUBLAS_PEDANTIC_MATH));
        QC_BLAS(st, gs);
    }
    QC_CUDA(st, llmi_cuda_quant_abs_mean_acc(x, dt, n, k, scale, q->xmean[slot], q->stream));
    /* x is the caller's again when this returns */
    QC_CUDA(st, cudaStreamSynchronize(q->stream));
    qc_lap(q, QCT_GRAM, &t0);
    return 0;
}

int quant_cuda_gram_end(quant_cuda *q, int slot, float *h, float *xmean, llmi_status *st) {
    const int k = q->gram_k[slot];
    double t0 = quant_now();
    /* the row-major upper triangle is filled (see gram_acc_device): its lower := upper */
    QC_CUDA(st, llmi_cuda_quant_mirror(q->gram[slot], k, q->stream));
    if (h)
        QC_CUDA(st, cudaMemcpyAsync(h, q->gram[slot], (size_t)k * k * sizeof(float), cudaMemcpyDeviceToHost,
                                    q->stream));
    if (xmean)
        QC_CUDA(st, cudaMemcpyAsync(xmean, q->xmean[slot], (size_t)k * sizeof(float), cudaMemcpyDeviceToHost,
                                    q->stream));
    QC_CUDA(st, cudaStreamSynchronize(q->stream));
    qc_lap(q, QCT_GRAM_END, &t0);
    return 0;
}

/* ---- GPTQ ---- */

/* J H J = L L^T (potrf, lower, column-major) then L^-1 (trtri) in one fp64 buffer a.
 * Returns 1 when H is not positive definite, -1 (st set) when a call fails: llmi_fail's
 * LLMI_E_RUNTIME is also 1, and the caller retries a 1 with more dampening. */
static int qc_factor(quant_cuda *q, double *a, int n, llmi_status *st) {
    int lwork = 0, info = 0, *dinfo = NULL;
    double *work = NULL;
    size_t dws = 0, hws = 0;
    void *dwork = NULL, *hwork = NULL;
    int rc = 0;
    if (cudaMalloc((void **)&dinfo, sizeof(int)) != cudaSuccess) {
        llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot allocate the Cholesky status: %s",
                  cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    if (cusolverDnDpotrf_bufferSize(q->solver, CUBLAS_FILL_MODE_LOWER, n, a, n, &lwork) != CUSOLVER_STATUS_SUCCESS ||
        cudaMalloc((void **)&work, (size_t)lwork * sizeof(double)) != cudaSuccess ||
        cusolverDnDpotrf(q->solver, CUBLAS_FILL_MODE_LOWER, n, a, n, work, lwork, dinfo) != CUSOLVER_STATUS_SUCCESS ||
        cudaMemcpyAsync(&info, dinfo, sizeof(int), cudaMemcpyDeviceToHost, q->stream) != cudaSuccess ||
        cudaStreamSynchronize(q->stream) != cudaSuccess)
        rc = (llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: Cholesky of a %dx%d Hessian failed to run", n, n), -1);
    if (!rc && info < 0)
        rc = (llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: Cholesky rejected its argument %d", -info), -1);
    if (!rc && info > 0) rc = 1;
    if (!rc && (cusolverDnXtrtri_bufferSize(q->solver, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, n, CUDA_R_64F, a,
                                            n, &dws, &hws) != CUSOLVER_STATUS_SUCCESS ||
                cudaMalloc(&dwork, dws ? dws : 1) != cudaSuccess || !(hwork = malloc(hws ? hws : 1)) ||
                cusolverDnXtrtri(q->solver, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, n, CUDA_R_64F, a, n, dwork,
                                 dws, hwork, hws, dinfo) != CUSOLVER_STATUS_SUCCESS ||
                cudaMemcpyAsync(&info, dinfo, sizeof(int), cudaMemcpyDeviceToHost, q->stream) != cudaSuccess ||
                cudaStreamSynchronize(q->stream) != cudaSuccess || info != 0))
        rc = (llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: triangular inverse of a %dx%d factor failed", n, n), -1);
    cudaFree(dinfo), cudaFree(work), cudaFree(dwork), free(hwork);
    return rc;
}

/* H's diagonal (cols) from device h (cols, cols) into host diag, times h_scale in fp32 (as
 * the host's scaled H holds it). */
static int qc_diag(quant_cuda *q, const float *h, int cols, float h_scale, float *diag, llmi_status *st) {
    QC_CUDA(st, cudaMemcpy2DAsync(diag, sizeof(float), h, ((size_t)cols + 1) * sizeof(float), sizeof(float),
                                  (size_t)cols, cudaMemcpyDeviceToHost, q->stream));
    QC_CUDA(st, cudaStreamSynchronize(q->stream));
    for (int k = 0; k < cols; k++) diag[k] *= h_scale;
    return 0;
}

int quant_cuda_gptq_prepare(quant_cuda *q, const float *h, int slot, float h_scale, int cols, const quant_gptq_opts *o,
                            quant_gptq_hinv *hv, llmi_status *st) {
    memset(hv, 0, sizeof *hv);
    double t0 = quant_now();
    const size_t cc = (size_t)cols * cols;
    QC_CUDA(st, cudaSetDevice(q->device));
    q->h_cur = NULL;
    const float *hsrc;   /* (cols, cols) device */
    if (h) {
        if (q->h_own_cols != cols) {
            cudaFree(q->h_own);
            q->h_own = NULL, q->h_own_cols = 0;
            if (cudaMalloc((void **)&q->h_own, cc * sizeof(float)) != cudaSuccess) {
                q->h_own = NULL;
                return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot place a %dx%d Hessian on the GPU: %s",
                                 cols, cols, cudaGetErrorString(cudaGetLastError()));
            }
            q->h_own_cols = cols;
        }
        QC_CUDA(st, cudaMemcpyAsync(q->h_own, h, cc * sizeof(float), cudaMemcpyHostToDevice, q->stream));
        hsrc = q->h_own;
    } else {
        if (slot < 0 || slot >= QUANT_CUDA_SLOTS || !q->gram[slot] || q->gram_k[slot] != cols)
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: no %dx%d Gram matrix in slot %d to prepare", cols,
                             cols, slot);
        hsrc = q->gram[slot];
    }
    float *diag = malloc((size_t)cols * sizeof(float)); /* (cols) */
    if (!diag) return llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory");
    double mean;
    int rc = qc_diag(q, hsrc, cols, h_scale, diag, st) || quant_gptq_order(diag, cols, o, hv, &mean, st) ? st->code : 0;
    free(diag);
    if (rc) return rc;
    double *a = NULL;
    uint8_t *dead8 = malloc((size_t)cols);
    if (!dead8) rc = llmi_fail(st, LLMI_E_RUNTIME, "gptq: out of memory");
    for (int k = 0; !rc && k < cols; k++) dead8[k] = hv->dead[k];
    cudaFree(q->u), cudaFree(q->perm), cudaFree(q->dead);
    q->u = NULL, q->perm = NULL, q->dead = NULL, q->u_cols = 0;
    cudaError_t ce = cudaSuccess;
    if (!rc) {
        ce = cudaMalloc((void **)&a, cc * sizeof(double));
        if (!ce) ce = cudaMalloc((void **)&q->u, cc * sizeof(float));
        if (!ce) ce = cudaMalloc((void **)&q->perm, (size_t)cols * sizeof(int32_t));
        if (!ce) ce = cudaMalloc((void **)&q->dead, (size_t)cols);
        if (!ce)
            ce = cudaMemcpyAsync(q->perm, hv->perm, (size_t)cols * sizeof(int32_t), cudaMemcpyHostToDevice, q->stream);
        if (!ce) ce = cudaMemcpyAsync(q->dead, dead8, (size_t)cols, cudaMemcpyHostToDevice, q->stream);
        if (ce)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot place a %dx%d Hessian's factor on the GPU: %s",
                           cols, cols, cudaGetErrorString(ce));
    }
    double damp = o->damp_percent > 0 ? o->damp_percent : 0.01;
    int f = 1;
    for (int attempt = 0; !rc && attempt < 6 && f == 1; attempt++, damp *= 10.0) {
        if ((ce = llmi_cuda_quant_hinv_fill(hsrc, h_scale, q->perm, q->dead, cols, damp * mean, a, q->stream)) !=
            cudaSuccess)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: hinv_fill: %s", cudaGetErrorString(ce));
        else if ((f = qc_factor(q, a, cols, st)) < 0 || (f != 0 && f != 1))
            rc = st->code;
    }
    if (!rc && f == 1)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "gptq: Hessian of a %dx%d layer is not positive definite even with "
                       "dampening %.3g", cols, cols, damp / 10.0);
    if (!rc && (ce = llmi_cuda_quant_hinv_upper(a, cols, q->u, q->stream)) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: hinv_upper: %s", cudaGetErrorString(ce));
    if (!rc && (ce = cudaStreamSynchronize(q->stream)) != cudaSuccess)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: preparing a %dx%d Hessian: %s", cols, cols,
                       cudaGetErrorString(ce));
    cudaFree(a), free(dead8);
    qc_lap(q, QCT_FACTOR, &t0);
    if (rc) {
        quant_gptq_hinv_free(hv);
        return rc;
    }
    q->u_cols = cols;
    q->h_cur = hsrc;
    hv->damp = (float)(damp / 10.0);
    return 0;
}

/* *rel_err of a linear: w (rows, cols) its fp32 weights, qd, sd, zd its grid (walked in
 * perm's order; NULL: columns in order) and hd (cols, cols) the H, all on the device (H's
 * scale cancels in the ratio). */
static int qc_rel_err(quant_cuda *q, const float *w, const uint8_t *qd, const uint16_t *sd, const uint8_t *zd,
                      const int32_t *perm, const float *hd, int rows, int cols, int gs, double *rel_err,
                      llmi_status *st) {
    const int stride = quant_err_stride(rows, cols), n_sel = (rows + stride - 1) / stride;
    const size_t n = (size_t)n_sel * cols;   /* one half of dw */
    float *dw = NULL, *t = NULL;             /* (2 n_sel, cols) each: D's rows then W's; then those times H */
    double num = 0, den = 0;
    int rc = 0;
    cudaError_t ce = cudaMalloc((void **)&dw, 2 * n * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&t, 2 * n * sizeof(float));
    if (!ce) ce = llmi_cuda_quant_err_rows(w, qd, sd, zd, perm, rows, cols, gs, stride, n_sel, dw, q->stream);
    /* t = dw H, row-major: column-major that is H' dw' with H' = H (symmetric) */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t bs = ce ? CUBLAS_STATUS_SUCCESS
                           : cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, 2 * n_sel, cols, &one, hd, cols, dw,
                                         cols, &zero, t, cols);
    if (!ce && !bs) ce = llmi_cuda_quant_dot(dw, t, n, q->scalar, q->stream);
    if (!ce && !bs) ce = cudaMemcpyAsync(&num, q->scalar, sizeof(double), cudaMemcpyDeviceToHost, q->stream);
    if (!ce && !bs) ce = cudaStreamSynchronize(q->stream);
    if (!ce && !bs) ce = llmi_cuda_quant_dot(dw + n, t + n, n, q->scalar, q->stream);
    if (!ce && !bs) ce = cudaMemcpyAsync(&den, q->scalar, sizeof(double), cudaMemcpyDeviceToHost, q->stream);
    if (!ce && !bs) ce = cudaStreamSynchronize(q->stream);
    if (ce || bs)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: a %dx%d layer's output error: %s", rows, cols,
                       bs ? cublasGetStatusString(bs) : cudaGetErrorString(ce));
    cudaFree(dw), cudaFree(t);
    if (!rc) *rel_err = den > 0 ? num / den : 0.0;
    return rc;
}

int quant_cuda_gptq_apply(quant_cuda *q, const float *w, int rows, const quant_gptq_hinv *hv,
                          const quant_gptq_opts *o, quant_grid *g, double *err, double *rel_err, llmi_status *st) {
    /* the lazy-update block, as gptq.c takes it (et and the block kernel hold at most 128 columns) */
    const int cols = hv->cols, gs = o->group_size, bs = o->block_size > 0 && o->block_size <= 128 ? o->block_size : 128;
    if (q->u_cols != cols || !q->h_cur)
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: apply without its prepare");
    if (quant_grid_alloc(g, rows, cols, gs, o->desc_act, st)) return st->code;
    double t0 = quant_now();
    float *wd = NULL, *wt = NULL, *et = NULL, *s_row = NULL;
    int32_t *z_row = NULL;
    uint8_t *qd = NULL, *zd = NULL;
    uint16_t *sd = NULL;
    const size_t rc_n = (size_t)rows * cols, sg = (size_t)g->n_groups * rows;
    int rc = 0;
    cudaError_t ce = cudaMalloc((void **)&wd, rc_n * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&wt, rc_n * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&et, (size_t)bs * rows * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&s_row, rows * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&z_row, rows * sizeof(int32_t));
    if (!ce) ce = cudaMalloc((void **)&qd, rc_n);
    if (!ce) ce = cudaMalloc((void **)&zd, sg);
    if (!ce) ce = cudaMalloc((void **)&sd, sg * sizeof(uint16_t));
    if (!ce) ce = cudaMemcpyAsync(wd, w, rc_n * sizeof(float), cudaMemcpyHostToDevice, q->stream);
    if (!ce) ce = cudaMemsetAsync(q->scalar, 0, sizeof(double), q->stream);
    if (!ce) ce = llmi_cuda_gptq_load(wd, q->perm, q->dead, rows, cols, wt, q->stream);
    if (!ce) ce = cudaStreamSynchronize(q->stream);
    if (ce)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot place a %dx%d layer on the GPU: %s", rows, cols,
                       cudaGetErrorString(ce));
    qc_lap(q, QCT_UPLOAD, &t0);
    const float one = 1.0f, minus = -1.0f;
    for (int i1 = 0; i1 < cols && !rc; i1 += bs) {
        const int i2 = i1 + bs < cols ? i1 + bs : cols, nb = i2 - i1, m = cols - i2;
        if ((ce = llmi_cuda_gptq_block(wt, q->u, rows, cols, i1, i2, gs, o->sym, q->perm, qd, sd, zd, et, s_row, z_row,
                                       q->scalar, q->stream)) != cudaSuccess) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: gptq_block: %s", cudaGetErrorString(ce));
            break;
        }
        /* wt[i2:, :] (m, rows) -= U[i1:i2, i2:]^T (m, nb) et (nb, rows), all row-major:
         * column-major that is wt' (rows, m) -= et' (rows, nb) U'^T with U' = U[i1:i2, i2:]^T. */
        if (m == 0) continue;
        cublasStatus_t lazy = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_T, rows, m, nb, &minus, et, rows,
                                          q->u + (size_t)i1 * cols + i2, cols, &one, wt + (size_t)i2 * rows, rows);
        if (lazy != CUBLAS_STATUS_SUCCESS)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: lazy-update GEMM: %s", cublasGetStatusString(lazy));
    }
    double loss = 0.0;
    if (!rc) {
        ce = cudaMemcpyAsync(&loss, q->scalar, sizeof(double), cudaMemcpyDeviceToHost, q->stream);
        if (!ce) ce = cudaStreamSynchronize(q->stream);
        if (ce)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: a %dx%d layer's walk: %s", rows, cols,
                           cudaGetErrorString(ce));
    }
    qc_lap(q, QCT_WALK, &t0);
    /* cuSOLVER's Cholesky is not documented to report a NaN through info, as the CPU's
     * does (it stops at !(d > 0)): a non-finite error is that, caught here */
    if (!rc && !isfinite(loss))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "gptq: a %dx%d layer's quantization error is not finite (NaN or inf in "
                       "its weights or Hessian)", rows, cols);
    /* the walk's buffers go back before the error measure takes its own */
    cudaFree(wt), cudaFree(et), cudaFree(s_row), cudaFree(z_row);
    if (!rc) rc = qc_rel_err(q, wd, qd, sd, zd, q->perm, q->h_cur, rows, cols, gs, rel_err, st);
    qc_lap(q, QCT_ERROR, &t0);
    if (!rc) {
        ce = cudaMemcpyAsync(g->q, qd, rc_n, cudaMemcpyDeviceToHost, q->stream);
        if (!ce) ce = cudaMemcpyAsync(g->scales, sd, sg * sizeof(uint16_t), cudaMemcpyDeviceToHost, q->stream);
        if (!ce) ce = cudaMemcpyAsync(g->zeros, zd, sg, cudaMemcpyDeviceToHost, q->stream);
        if (!ce) ce = cudaStreamSynchronize(q->stream);
        if (ce)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: a %dx%d layer's grid to the host: %s", rows, cols,
                           cudaGetErrorString(ce));
    }
    cudaFree(wd), cudaFree(qd), cudaFree(zd), cudaFree(sd);
    qc_lap(q, QCT_DOWNLOAD, &t0);
    if (rc) {
        quant_grid_free(g);
        return rc;
    }
    if (g->g_idx)
        for (int i = 0; i < cols; i++) g->g_idx[hv->perm[i]] = i / gs;
    *err = loss / 2.0;
    return 0;
}

int quant_cuda_rel_err(quant_cuda *q, const float *w, const quant_grid *g, const float *h, double *rel_err,
                       llmi_status *st) {
    const int rows = g->rows, cols = g->cols;
    if (g->g_idx) return llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: output error of a grid with g_idx");
    double t0 = quant_now();
    QC_CUDA(st, cudaSetDevice(q->device));
    const size_t rc_n = (size_t)rows * cols, sg = (size_t)g->n_groups * rows;
    float *wd = NULL, *hd = NULL;
    uint8_t *qd = NULL, *zd = NULL;
    uint16_t *sd = NULL;
    cudaError_t ce = cudaMalloc((void **)&wd, rc_n * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&hd, (size_t)cols * cols * sizeof(float));
    if (!ce) ce = cudaMalloc((void **)&qd, rc_n);
    if (!ce) ce = cudaMalloc((void **)&zd, sg);
    if (!ce) ce = cudaMalloc((void **)&sd, sg * sizeof(uint16_t));
    if (!ce) ce = cudaMemcpyAsync(wd, w, rc_n * sizeof(float), cudaMemcpyHostToDevice, q->stream);
    if (!ce) ce = cudaMemcpyAsync(hd, h, (size_t)cols * cols * sizeof(float), cudaMemcpyHostToDevice, q->stream);
    if (!ce) ce = cudaMemcpyAsync(qd, g->q, rc_n, cudaMemcpyHostToDevice, q->stream);
    if (!ce) ce = cudaMemcpyAsync(zd, g->zeros, sg, cudaMemcpyHostToDevice, q->stream);
    if (!ce) ce = cudaMemcpyAsync(sd, g->scales, sg * sizeof(uint16_t), cudaMemcpyHostToDevice, q->stream);
    int rc = ce ? llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot place a %dx%d layer and its H on the GPU: %s",
                            rows, cols, cudaGetErrorString(ce))
                : qc_rel_err(q, wd, qd, sd, zd, NULL, hd, rows, cols, g->group_size, rel_err, st);
    cudaFree(wd), cudaFree(hd), cudaFree(qd), cudaFree(zd), cudaFree(sd);
    qc_lap(q, QCT_ERROR, &t0);
    return rc;
}

/* ---- AWQ ---- */

int quant_cuda_awq_search_scale(quant_cuda *q, float *const *ws, const int *rows, int n_lin, int cols,
                                const float *x_mean, const float *h, int group_size, int n_grid, float *best_s,
                                double *best_loss, llmi_status *st) {
    int total = 0;
    for (int i = 0; i < n_lin; i++) total += rows[i];
    const size_t wn = (size_t)total * cols;
    float *wd = NULL, *d = NULL, *t = NULL, *hd = NULL, *sd = NULL;
    float *s = malloc((size_t)cols * sizeof(float));
    int rc = s ? 0 : llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory");
    if (!rc && (cudaMalloc((void **)&wd, wn * sizeof(float)) || cudaMalloc((void **)&d, wn * sizeof(float)) ||
                cudaMalloc((void **)&t, wn * sizeof(float)) ||
                cudaMalloc((void **)&hd, (size_t)cols * cols * sizeof(float)) ||
                cudaMalloc((void **)&sd, (size_t)cols * sizeof(float)) ||
                cudaMemcpyAsync(hd, h, (size_t)cols * cols * sizeof(float), cudaMemcpyHostToDevice, q->stream)))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: cannot place an AWQ group of %dx%d on the GPU", total, cols);
    for (int i = 0, off = 0; !rc && i < n_lin; off += rows[i], i++)
        if (cudaMemcpyAsync(wd + (size_t)off * cols, ws[i], (size_t)rows[i] * cols * sizeof(float),
                            cudaMemcpyHostToDevice, q->stream))
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: upload failed");
    double best = INFINITY;
    const float one = 1.0f, zero = 0.0f;
    for (int a = 0; a < n_grid && !rc; a++) {
        quant_awq_scales(x_mean, cols, (float)a / (float)n_grid, s);
        double loss = 0;
        cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
        cudaError_t ce = cudaMemcpyAsync(sd, s, (size_t)cols * sizeof(float), cudaMemcpyHostToDevice, q->stream);
        if (!ce) ce = llmi_cuda_awq_fake_quant_err(wd, sd, total, cols, group_size, d, q->stream);
        /* t = d H: row-major (total, cols) is column-major (cols, total) = H d' */
        if (!ce)
            bs = cublasSgemm(q->blas, CUBLAS_OP_N, CUBLAS_OP_N, cols, total, cols, &one, hd, cols, d, cols, &zero, t,
                             cols);
        if (!ce && !bs) ce = llmi_cuda_quant_dot(d, t, wn, q->scalar, q->stream);
        if (!ce && !bs) ce = cudaMemcpyAsync(&loss, q->scalar, sizeof(double), cudaMemcpyDeviceToHost, q->stream);
        if (!ce && !bs) ce = cudaStreamSynchronize(q->stream);
        if (ce || bs) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: AWQ scale search: %s",
                           bs ? cublasGetStatusString(bs) : cudaGetErrorString(ce));
            break;
        }
        if (loss < best) {
            best = loss;
            memcpy(best_s, s, (size_t)cols * sizeof(float));
        }
    }
    cudaFree(wd), cudaFree(d), cudaFree(t), cudaFree(hd), cudaFree(sd), free(s);
    if (!rc) *best_loss = best;
    return rc;
}

int quant_cuda_awq_clip(quant_cuda *q, float *w, int rows, int cols, const float *h, int group_size, int n_shrink,
                        llmi_status *st) {
    if (group_size > LLMI_AWQ_CLIP_MAX_GS) return quant_awq_clip(w, rows, cols, h, group_size, n_shrink, st);
    double t0 = quant_now();
    const int gs = group_size, ng = cols / gs;
    QC_CUDA(st, cudaSetDevice(q->device));
    if (q->clip_gs != gs) {
        QC_CUDA(st, llmi_cuda_awq_clip_init(gs));
        q->clip_gs = gs;
    }
    float *hb = malloc((size_t)ng * gs * gs * sizeof(float));   /* (ng, gs, gs): H's diagonal blocks */
    float *mv = malloc((size_t)rows * ng * sizeof(float));      /* (rows, ng) */
    float *wd = NULL, *hbd = NULL, *mvd = NULL;
    int rc = hb && mv ? 0 : llmi_fail(st, LLMI_E_RUNTIME, "awq: out of memory for a %dx%d clipping search", rows, cols);
    if (!rc) quant_awq_h_blocks(h, cols, gs, hb);
    cudaError_t ce = cudaSuccess;
    if (!rc) {
        ce = cudaMalloc((void **)&wd, (size_t)rows * cols * sizeof(float));
        if (!ce) ce = cudaMalloc((void **)&hbd, (size_t)ng * gs * gs * sizeof(float));
        if (!ce) ce = cudaMalloc((void **)&mvd, (size_t)rows * ng * sizeof(float));
        if (!ce) ce = cudaMemcpyAsync(wd, w, (size_t)rows * cols * sizeof(float), cudaMemcpyHostToDevice, q->stream);
        if (!ce) ce = cudaMemcpyAsync(hbd, hb, (size_t)ng * gs * gs * sizeof(float), cudaMemcpyHostToDevice, q->stream);
        if (!ce) ce = llmi_cuda_awq_clip_search(wd, rows, cols, hbd, gs, n_shrink, mvd, q->stream);
        if (!ce) ce = cudaMemcpyAsync(mv, mvd, (size_t)rows * ng * sizeof(float), cudaMemcpyDeviceToHost, q->stream);
        if (!ce) ce = cudaStreamSynchronize(q->stream);
        if (ce)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize cuda: AWQ clipping search of a %dx%d layer: %s", rows, cols,
                           cudaGetErrorString(ce));
    }
    if (!rc) quant_awq_clip_apply(w, rows, cols, gs, mv);
    cudaFree(wd), cudaFree(hbd), cudaFree(mvd);
    free(hb), free(mv);
    qc_lap(q, QCT_CLIP, &t0);
    return rc;
}

#endif
