/* cusolverDn.h (emulated) — the cuSOLVER calls llmi makes; blas.cpp defines them. */
#pragma once
#include "cublas_api.h"
typedef struct cusolverDnContext *cusolverDnHandle_t;
typedef enum { CUSOLVER_STATUS_SUCCESS = 0, CUSOLVER_STATUS_INVALID_VALUE = 3, CUSOLVER_STATUS_INTERNAL_ERROR = 7 } cusolverStatus_t;
#ifdef __cplusplus
extern "C" {
#endif
cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t *h);
cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t h);
cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t h, cudaStream_t s);
cusolverStatus_t cusolverDnDpotrf_bufferSize(cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double *A, int lda, int *lwork);
cusolverStatus_t cusolverDnDpotrf(cusolverDnHandle_t h, cublasFillMode_t uplo, int n, double *A, int lda, double *work, int lwork, int *info);
cusolverStatus_t cusolverDnXtrtri_bufferSize(cusolverDnHandle_t h, cublasFillMode_t uplo, cublasDiagType_t diag, int64_t n,
                                             cudaDataType t, void *A, int64_t lda, size_t *dws, size_t *hws);
cusolverStatus_t cusolverDnXtrtri(cusolverDnHandle_t h, cublasFillMode_t uplo, cublasDiagType_t diag, int64_t n,
                                  cudaDataType t, void *A, int64_t lda, void *dwork, size_t dws, void *hwork, size_t hws, int *info);
#ifdef __cplusplus
}
#endif
