/* test_quant_cuda.c — the W4A16 CUDA kernels (kernels/int4_gemm.cu) against their CPU twin
 * cpu_matmul (LLMI_I4G) on fresh random grids, with and without act-order g_idx.  Built
 * only into a CUDA build; without a usable device there the test is skipped, never passed. */
#include <stdlib.h>
#include <string.h>
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
            int n = ns[ni];
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
            float *yr = malloc(sizeof(float) * n * rows), *bias = malloc(sizeof(float) * rows);
            for (int i = 0; i < n * cols; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, x[i] = (float)(s % 2001) / 1000 - 1;
            for (int i = 0; i < rows; i++) bias[i] = (float)i / rows;
            cpu_matmul(&t, x, n, bias, yr);
            llmi_i4g_dev w = {tqc_up(t.data, (size_t)rows * cols / 2), tqc_up(t.qscales, (size_t)g.n_groups * rows * 2),
                              tqc_up(t.qzeros, (size_t)g.n_groups * rows),
                              ao ? tqc_up(t.g_idx, (size_t)cols * 4) : NULL, rows, cols, gs};
            float *dx = tqc_up(x, sizeof(float) * n * cols), *db = tqc_up(bias, sizeof(float) * rows), *dy = NULL;
            cudaMalloc((void **)&dy, sizeof(float) * n * rows);
            CHECK(llmi_cuda_int4_matmul(&w, dx, n, db, dy, 0) == cudaSuccess);
            cudaMemcpy(y, dy, sizeof(float) * n * rows, cudaMemcpyDeviceToHost);
            double e = test_nmse(y, yr, (long)n * rows);
            /* GEMV: fp32 products; GEMM: fp16 operands, fp32 accumulation */
            CHECK_MSG(e < (n <= 8 ? 1e-10 : 5e-6), "n %d act-order %d: nmse %g", n, ao, e);
            cudaFree((void *)w.q), cudaFree((void *)w.scales), cudaFree((void *)w.zeros), cudaFree((void *)w.g_idx);
            cudaFree(dx), cudaFree(db), cudaFree(dy);
            free(x), free(y), free(yr), free(bias);
        }
        free(t.owned);
        quant_grid_free(&g);
    }
}

#endif
