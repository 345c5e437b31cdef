/* test_quant_cuda.c — the W4A16 CUDA kernels (kernels/int4_gemm.cu) against their CPU twin
 * cpu_matmul (LLMI_I4G) on fresh random grids, with and without act-order g_idx.  Built
 * only into a CUDA build; without a usable device there the test is skipped, never passed. */
#include <stdlib.h>
#include <string.h>
#include "core/dtype.h"
#include "quant/quant.h"
#include "backend/cpu/ops.h"
#include "test.h"

#ifdef LLMI_CUDA
#include <cuda_runtime_api.h>
#include "int4_gemm.h"

static void *tqc_up(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}

TEST(quant_cuda_int4_matmul_vs_cpu) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        (void)cudaGetLastError();
        SKIP("no CUDA device");
    }
    unsigned long long s = test_seed() | 1;
    for (int ao = 0; ao < 2; ao++) {
        int rows = 200, cols = 384, gs = 64;
        quant_grid g;
        llmi_status st = {0};
        CHECK(quant_grid_alloc(&g, rows, cols, gs, ao, &st) == 0);
        for (size_t i = 0; i < (size_t)rows * cols; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, g.q[i] = s & 15;
        for (size_t i = 0; i < (size_t)rows * g.n_groups; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            g.scales[i] = f32_to_fp16(0.001f + (float)(s % 1000) * 1e-5f);
            g.zeros[i] = (uint8_t)(s >> 20) & 15;
        }
        if (ao)
            for (int k = 0; k < cols; k++) g.g_idx[k] = (int32_t)((k * 7919) % g.n_groups);
        llmi_tensor t;
        CHECK(quant_tensor_from_grid(&g, &t, &st) == 0);
        int ns[2] = {3, 70};
        for (int ni = 0; ni < 2; ni++) {
            int n = ns[ni], ldy = rows + 5;
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * ldy);
            float *yr = malloc(sizeof(float) * n * rows), *bias = malloc(sizeof(float) * rows);
            float *yp = malloc(sizeof(float) * n * rows), *xr = malloc(sizeof(float) * n * cols);
            uint16_t *xb = malloc(sizeof(uint16_t) * n * cols);
            for (int i = 0; i < n * cols; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, x[i] = (float)(s % 2001) / 1000 - 1;
            for (int i = 0; i < rows; i++) bias[i] = (float)i / rows;
            llmi_i4g_dev w = {tqc_up(t.data, (size_t)rows * cols / 2), tqc_up(t.qscales, (size_t)g.n_groups * rows * 2),
                              tqc_up(t.qzeros, (size_t)g.n_groups * rows),
                              ao ? tqc_up(t.g_idx, (size_t)cols * 4) : NULL, rows, cols, gs};
            float *db = tqc_up(bias, sizeof(float) * rows), *dy = NULL;
            cudaMalloc((void **)&dy, sizeof(float) * n * ldy);
            /* f32 activations, then the bf16 ones the forward feeds (the CPU gets the same rounded values) */
            for (int xi = 0; xi < 2; xi++) {
                const bool bf = xi == 1;
                for (int i = 0; i < n * cols; i++) {
                    xb[i] = f32_to_bf16(x[i]);
                    xr[i] = bf ? bf16_to_f32(xb[i]) : x[i];
                }
                cpu_matmul(&t, xr, n, bias, yr);
                void *dx = bf ? tqc_up(xb, sizeof(uint16_t) * n * cols) : tqc_up(x, sizeof(float) * n * cols);
                cudaMemset(dy, 0xff, sizeof(float) * n * ldy);
                CHECK(llmi_cuda_int4_matmul(&w, dx, bf ? LLMI_BF16 : LLMI_F32, n, db, dy, ldy, 0) == cudaSuccess);
                cudaMemcpy(y, dy, sizeof(float) * n * ldy, cudaMemcpyDeviceToHost);
                int nan_pad = 0;
                for (int i = 0; i < n; i++) {
                    memcpy(yp + (size_t)i * rows, y + (size_t)i * ldy, sizeof(float) * rows);
                    for (int j = rows; j < ldy; j++) nan_pad += y[(size_t)i * ldy + j] != y[(size_t)i * ldy + j];
                }
                CHECK_MSG(nan_pad == n * 5, "n %d: columns past rows were written", n);
                double e = test_nmse(yp, yr, (long)n * rows);
                /* GEMV: fp32 products; GEMM: bf16 operands (the weights rounded once), fp32 accumulation */
                CHECK_MSG(e < (n <= LLMI_I4_GEMV_MAX_N ? 1e-10 : 1e-4), "n %d act-order %d x %s: nmse %g", n, ao,
                          bf ? "bf16" : "f32", e);
                cudaFree(dx);
            }
            cudaFree((void *)w.q), cudaFree((void *)w.scales), cudaFree((void *)w.zeros), cudaFree((void *)w.g_idx);
            cudaFree(db), cudaFree(dy);
            free(x), free(y), free(yr), free(bias), free(yp), free(xr), free(xb);
        }
        /* dequantization to bf16: each value rounded once from the CPU's fp32 */
        {
            float *dq = malloc(sizeof(float) * rows * cols);
            uint16_t *hb = malloc(sizeof(uint16_t) * rows * cols);
            for (int rr = 0; rr < rows; rr++) quant_dequant_row(&t, rr, dq + (size_t)rr * cols);
            llmi_i4g_dev w = {tqc_up(t.data, (size_t)rows * cols / 2), tqc_up(t.qscales, (size_t)g.n_groups * rows * 2),
                              tqc_up(t.qzeros, (size_t)g.n_groups * rows),
                              ao ? tqc_up(t.g_idx, (size_t)cols * 4) : NULL, rows, cols, gs};
            void *dd = NULL;
            cudaMalloc(&dd, sizeof(uint16_t) * rows * cols);
            CHECK(llmi_cuda_int4_dequant(&w, dd, LLMI_BF16, 0) == cudaSuccess);
            cudaMemcpy(hb, dd, sizeof(uint16_t) * rows * cols, cudaMemcpyDeviceToHost);
            int bad = 0;
            for (long i = 0; i < (long)rows * cols; i++) bad += hb[i] != f32_to_bf16(dq[i]);
            CHECK_MSG(bad == 0, "act-order %d: %d bf16 values differ from quant_dequant_row", ao, bad);
            cudaFree((void *)w.q), cudaFree((void *)w.scales), cudaFree((void *)w.zeros), cudaFree((void *)w.g_idx);
            cudaFree(dd);
            free(dq), free(hb);
        }
        free(t.owned);
        quant_grid_free(&g);
    }
}

#endif
