/* test_quant_cuda.c — the W4A16 CUDA kernels (kernels/int4_gemm.cu) against their CPU twin
 * cpu_matmul (LLMI_I4G) on fresh random grids, with and without act-order g_idx, and the
 * quantizer's device path (src/quant/quant_cuda.c: Hessian, GPTQ) against src/quant.  Built
 * only into a CUDA build; without a usable device there the test is skipped, never passed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/dtype.h"
#include "quant/quant.h"
#include "backend/cpu/ops.h"
#include "quant/linalg.h"
#include "quant/quant_cuda.h"
#include "quant/quantize.h"
#include "quant/awq.h"
#include "quant/calib.h"
#include "model/model.h"
#include "test.h"

#ifdef LLMI_CUDA
#include <cuda_runtime_api.h>
#include "int4_gemm.h"

/* A CUDA device is visible (the error of asking, when none is, cleared). */
static bool tqc_device(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
    (void)cudaGetLastError();
    return false;
}

static void *tqc_up(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    /* a copy from pageable memory may still be in flight when cudaMemcpy returns, and only
     * the legacy stream is ordered after it: the quantizer's own stream is not */
    cudaDeviceSynchronize();
    return d;
}

TEST(quant_cuda_int4_matmul_vs_cpu) {
    if (!tqc_device()) SKIP("no CUDA device");
    unsigned long long s = test_seed() | 1;
    /* Shapes 2 and 3: an odd row count (the GEMV's warp pairs rows), a word count that is no
     * multiple of 32 and a group of 5 words (no shift).  Shapes 4 and 5: whole 16-byte chunks (cols % 32 == 0) more than a block's threads take
     * at once (146 of them), so the chunk GEMV loops and leaves threads idle on the last pass,
     * its groups of 32 columns one per chunk; 73 segments of 64 columns for the shuffle-fed
     * tensor-core kernel's 8 warps, two groups to a segment, and 67 rows (a partial last block
     * of 16).  Shapes 0 (g64) and 4 (g32) without act order take that kernel from
     * LLMI_I4_MMA_MIN_N tokens with bf16 activations (n 11, 16, 70: passes of 32, 32, 6).
     * Shapes 6 and 7 (g128, g384) take the tensor-core GEMV at every n with bf16 activations
     * under auto: 10 steps of 128 columns over its 8 warps (two take a second step), 203 rows
     * (a partial last block); 9 steps, three to a group (a division, not a shift), 37 rows.
     * Shape 8 is shape 6 in act order: no tensor cores. */
    static const struct { int rows, cols, gs, ao; } shapes[] = {
        {200, 384, 64, 0}, {200, 384, 64, 1}, {201, 360, 40, 0}, {201, 360, 40, 1}, {67, 4672, 32, 0},
        {67, 4672, 32, 1}, {203, 1280, 128, 0}, {37, 1152, 384, 0}, {203, 1280, 128, 1}};
    for (int sa = 0; sa < (int)(sizeof shapes / sizeof shapes[0]); sa++) {
        int ao = shapes[sa].ao, rows = shapes[sa].rows, cols = shapes[sa].cols, gs = shapes[sa].gs;
        quant_grid g;
        llmi_status st = {0};
        CHECK(quant_grid_alloc(&g, rows, cols, gs, ao, &st) == 0);
        for (size_t i = 0; i < (size_t)rows * cols; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, g.q[i] = s & 15;
        for (size_t i = 0; i < (size_t)rows * g.n_groups; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            g.scales[i] = f32_to_fp16(0.001f + (float)(s % 1000) * 1e-5f);
            /* 0..16: a GPTQ v1 checkpoint's stored zero 15 is 16 once its +1 is added back */
            g.zeros[i] = (uint8_t)((s >> 20) % 17);
        }
        if (ao)
            for (int k = 0; k < cols; k++) g.g_idx[k] = (int32_t)((k * 7919) % g.n_groups);
        llmi_tensor t;
        CHECK(quant_tensor_from_grid(&g, &t, &st) == 0);
        int ns[5] = {1, 3, 11, LLMI_I4_GEMV_MAX_N, 70};
        for (int ni = 0; ni < 5; ni++) {
            int n = ns[ni], ldy = rows + 5;
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * ldy);
            float *yr = malloc(sizeof(float) * n * rows), *bias = malloc(sizeof(float) * rows);
            float *yp = malloc(sizeof(float) * n * rows), *xr = malloc(sizeof(float) * n * cols);
            uint16_t *xb = malloc(sizeof(uint16_t) * n * cols);
            for (int i = 0; i < n * cols; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, x[i] = (float)(s % 2001) / 1000 - 1;
            for (int i = 0; i < rows; i++) bias[i] = (float)i / rows;
            llmi_i4g_dev w = {tqc_up(t.data, (size_t)rows * cols / 2), tqc_up(t.qscales, (size_t)g.n_groups * rows * 2),
                              tqc_up(t.qzeros, (size_t)g.n_groups * rows),
                              ao ? tqc_up(t.g_idx, (size_t)cols * 4) : NULL, rows, cols, gs, LLMI_I4_AUTO};
            float *db = tqc_up(bias, sizeof(float) * rows), *dy = NULL;
            cudaMalloc((void **)&dy, sizeof(float) * n * ldy);
            /* f32 activations, then the bf16 ones the forward feeds (the CPU gets the same rounded values) */
            /* f32 and bf16 activations on each kernel choice: auto (tensor cores where they
             * apply), 6e0b768's choice (the shuffle-fed tensor cores from LLMI_I4_MMA_MIN_N
             * tokens), the GEMVs only (the chunk one where it applies), the warp GEMV only */
            const llmi_i4_kernel kinds[4] = {LLMI_I4_AUTO, LLMI_I4_MMA, LLMI_I4_CHUNK, LLMI_I4_WARP};
            for (int xi = 0; xi < 8; xi++) {
                const bool bf = xi % 2 == 1;
                w.kernel = kinds[xi / 2];
                /* (the names gpu-check's kernel_fallbacks looks for in a failure) */
                const bool tc = w.kernel == LLMI_I4_AUTO && bf && !ao && cols % 128 == 0 && gs % 128 == 0;
                const bool mma = (w.kernel == LLMI_I4_AUTO || w.kernel == LLMI_I4_MMA) && bf && !ao &&
                                 cols % 64 == 0 && gs % 16 == 0 && n >= LLMI_I4_MMA_MIN_N;
                const char *kname = tc    ? "tc GEMV"
                                    : mma ? "tensor-core"
                                    : w.kernel != LLMI_I4_WARP && cols % 32 == 0 ? "chunk GEMV"
                                                                                   : "warp GEMV";
                for (int i = 0; i < n * cols; i++) {
                    xb[i] = f32_to_bf16(x[i]);
                    xr[i] = bf ? bf16_to_f32(xb[i]) : x[i];
                }
                cpu_matmul(&t, xr, n, bias, yr);
                void *dx = bf ? tqc_up(xb, sizeof(uint16_t) * n * cols) : tqc_up(x, sizeof(float) * n * cols);
                cudaMemset(dy, 0xff, sizeof(float) * n * ldy);
                CHECK(llmi_cuda_int4_matmul(&w, dx, bf ? LLMI_BF16 : LLMI_F32, n, db, dy, ldy, 0) == cudaSuccess);
                /* a fault in the kernel surfaces here, named, not as a wrong nmse */
                CHECK(cudaDeviceSynchronize() == cudaSuccess);
                CHECK(cudaMemcpy(y, dy, sizeof(float) * n * ldy, cudaMemcpyDeviceToHost) == cudaSuccess);
                int nan_pad = 0;
                for (int i = 0; i < n; i++) {
                    memcpy(yp + (size_t)i * rows, y + (size_t)i * ldy, sizeof(float) * rows);
                    for (int j = rows; j < ldy; j++) nan_pad += y[(size_t)i * ldy + j] != y[(size_t)i * ldy + j];
                }
                CHECK_MSG(nan_pad == n * 5, "n %d: columns past rows were written", n);
                double e = test_nmse(yp, yr, (long)n * rows);
                /* fp32 products over passes of LLMI_I4_GEMV_MAX_N tokens: only the summation order
                 * differs; the tensor cores' products of bf16 (q - z) and x are exact too, their
                 * fp32 sums rounded as the hardware does */
                CHECK_MSG(e < (tc || mma ? 1e-9 : 1e-10), "%dx%d g%d n %d act-order %d x %s %s: nmse %g", rows, cols, gs, n,
                          ao, bf ? "bf16" : "f32", kname, e);
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
                              ao ? tqc_up(t.g_idx, (size_t)cols * 4) : NULL, rows, cols, gs, LLMI_I4_AUTO};
            void *dd = NULL;
            cudaMalloc(&dd, sizeof(uint16_t) * (rows * cols + 1));
            /* at the allocation's start (16-byte stores) and one element in (column by column,
             * as for a matrix placed at an odd offset) */
            for (int shift = 0; shift < 2; shift++) {
                uint16_t *dst = (uint16_t *)dd + shift;
                CHECK(llmi_cuda_int4_dequant(&w, dst, LLMI_BF16, 0) == cudaSuccess);
                CHECK(cudaDeviceSynchronize() == cudaSuccess);
                CHECK(cudaMemcpy(hb, dst, sizeof(uint16_t) * rows * cols, cudaMemcpyDeviceToHost) == cudaSuccess);
                int bad = 0;
                for (long i = 0; i < (long)rows * cols; i++) bad += hb[i] != f32_to_bf16(dq[i]);
                CHECK_MSG(bad == 0, "act-order %d shift %d: %d bf16 values differ from quant_dequant_row", ao, shift,
                          bad);
            }
            cudaFree((void *)w.q), cudaFree((void *)w.scales), cudaFree((void *)w.zeros), cudaFree((void *)w.g_idx);
            cudaFree(dd);
            free(dq), free(hb);
        }
        free(t.owned);
        quant_grid_free(&g);
    }
}


/* The Hessian X^T X (cuBLAS syrk + the mirror kernel) and the mean |x| against
 * quant_gram_acc and quant_abs_mean_acc, from fp32 and from bf16 on the device (the
 * calibration tap's path: a tensor-core GEMM on bf16 values, exact products, fp32 sums),
 * then GPTQ's factorisation and column walk against quant_gptq_prepare/apply on that
 * Hessian.  Widths off the 128-column block (320 = 2.5 blocks), two accumulation calls,
 * correlated inputs. */
/* tr(D H D^T) / tr(W H W^T) in fp64, D = w - dq, all (rows, k), h (k, k). */
static double tqc_rel_err(const float *w, const float *dq, const float *h, int rows, int k) {
    double num = 0, den = 0;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k; i++) {
            const float *hi = h + (size_t)i * k, *wr = w + (size_t)r * k, *qr = dq + (size_t)r * k;
            double ti = 0, ui = 0;
            for (int j = 0; j < k; j++) ti += (double)hi[j] * (wr[j] - qr[j]), ui += (double)hi[j] * wr[j];
            num += ti * (wr[i] - qr[i]);
            den += ui * wr[i];
        }
    return num / den;
}

TEST(quant_cuda_gram_and_gptq_vs_cpu) {
    if (!tqc_device()) SKIP("no CUDA device");
    unsigned long long s = test_seed() | 1;
    const int k = 320, n = 333, rows = 96, split = 150;
    float *x = malloc(sizeof(float) * n * k), *w = malloc(sizeof(float) * rows * k);
    float *hc = calloc((size_t)k * k, sizeof(float)), *hg = malloc(sizeof(float) * k * k);
    float *mc = calloc((size_t)k, sizeof(float)), *mg = malloc(sizeof(float) * k);
    for (int t = 0; t < n; t++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float common = (float)(s % 2001) / 1000 - 1;   /* shared by every channel: off-diagonal mass */
        for (int c = 0; c < k; c++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[(size_t)t * k + c] = 0.5f * common + (float)(s % 2001) / 1000 - 1 + (c % 17 == 0 ? 3.0f : 0.0f);
        }
    }
    for (int i = 0; i < rows * k; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, w[i] = (float)(s % 2001) / 20000 - 0.05f;
    CHECK(quant_gram_acc(x, split, k, 2.0f / n, hc) == 0);
    CHECK(quant_gram_acc(x + (size_t)split * k, n - split, k, 2.0f / n, hc) == 0);
    quant_gram_mirror(hc, k);
    quant_abs_mean_acc(x, split, k, 1.0f / n, mc);
    quant_abs_mean_acc(x + (size_t)split * k, n - split, k, 1.0f / n, mc);

    llmi_status st = {0};
    quant_cuda *q = NULL;
    float *xd32 = NULL;
    if (quant_cuda_create(&q, 0, &st) || !(xd32 = tqc_up(x, sizeof(float) * n * k)) ||
        quant_cuda_gram_begin(q, 1, k, &st) ||
        quant_cuda_gram_acc_device(q, 1, xd32, LLMI_F32, split, 2.0f / n, &st) ||
        quant_cuda_gram_acc_device(q, 1, xd32 + (size_t)split * k, LLMI_F32, n - split, 2.0f / n, &st) ||
        quant_cuda_gram_end(q, 1, hg, mg, &st)) {
        CHECK_MSG(0, "%s", xd32 ? st.msg : "cannot upload x");
        if (q) quant_cuda_destroy(q);
        cudaFree(xd32);
        free(x), free(w), free(hc), free(hg), free(mc), free(mg);
        return;
    }
    cudaFree(xd32);
    /* xmean was accumulated with scale 2/n alongside the Gram matrix: twice mc */
    double em = 0;
    for (int c = 0; c < k; c++) em = fmax(em, fabs(mg[c] - 2 * mc[c]) / (2 * mc[c]));
    CHECK_MSG(em < 1e-5, "mean |x|: max relative difference %g", em);
    {
        /* the same from bf16 on the device, against the CPU on the bf16-rounded values */
        uint16_t *xb = malloc(sizeof(uint16_t) * n * k);
        float *xr = malloc(sizeof(float) * n * k), *hr = calloc((size_t)k * k, sizeof(float));
        float *hb = malloc(sizeof(float) * k * k), *mr = calloc((size_t)k, sizeof(float));
        for (long i = 0; i < (long)n * k; i++) xb[i] = f32_to_bf16(x[i]), xr[i] = bf16_to_f32(xb[i]);
        CHECK(quant_gram_acc(xr, n, k, 1.0f / n, hr) == 0);
        quant_gram_mirror(hr, k);
        quant_abs_mean_acc(xr, n, k, 1.0f / n, mr);
        uint16_t *xd = tqc_up(xb, sizeof(uint16_t) * n * k);
        CHECK(xd != NULL);
        if (xd && (quant_cuda_gram_begin(q, 3, k, &st) ||
                   quant_cuda_gram_acc_device(q, 3, xd, LLMI_BF16, split, 1.0f / n, &st) ||
                   quant_cuda_gram_acc_device(q, 3, xd + (size_t)split * k, LLMI_BF16, n - split, 1.0f / n, &st) ||
                   quant_cuda_gram_end(q, 3, hb, mg, &st)))
            CHECK_MSG(0, "bf16 on the device: %s", st.msg);
        else if (xd) {
            double eb = test_nmse(hb, hr, (long)k * k), mb = 0;
            for (int c = 0; c < k; c++) mb = fmax(mb, fabs(mg[c] - mr[c]) / mr[c]);
            CHECK_MSG(eb < 1e-10, "bf16 Gram matrix nmse %g", eb);
            CHECK_MSG(mb < 1e-5, "bf16 mean |x|: max relative difference %g", mb);
        }
        cudaFree(xd);
        free(xb), free(xr), free(hr), free(hb), free(mr);
    }
    int asym = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < i; j++) asym += hg[(size_t)i * k + j] != hg[(size_t)j * k + i];
    CHECK_MSG(asym == 0, "%d entries of the device Gram matrix are not symmetric", asym);
    double e = test_nmse(hg, hc, (long)k * k);
    CHECK_MSG(e < 1e-10, "Gram matrix nmse %g (a triangle left zero gives ~0.5)", e);

    /* H three ways: the host's uploaded; half of it with h_scale 2 (the quantizer's GPTQ
     * scaling on the device: the same fp32 values, so the same grid bit for bit); and Gram
     * slot 1 where gram_end left it (never on the host) */
    float *hhalf = malloc(sizeof(float) * k * k);
    for (long i = 0; i < (long)k * k; i++) hhalf[i] = 0.5f * hc[i];
    for (int ao = 0; ao < 2; ao++) {
        quant_gptq_opts o = {.group_size = 64, .sym = ao == 0, .desc_act = ao == 1, .damp_percent = 0.01f,
                             .block_size = 128};
        quant_gptq_hinv hvc = {0}, hvg = {0}, hvh = {0}, hvs = {0};
        quant_grid gc = {0}, gg = {0}, gh = {0}, gs = {0};
        double ec = 0, eg = 0, eh = 0, es = 0, rg = -1, rh = -1, rs = -1;
        if (quant_gptq_prepare(hc, k, &o, &hvc, &st) || quant_gptq_apply(w, rows, &hvc, &o, &gc, &ec, &st) ||
            quant_cuda_gptq_prepare(q, hc, -1, 1.0f, k, &o, &hvg, &st) ||
            quant_cuda_gptq_apply(q, w, rows, &hvg, &o, &gg, &eg, &rg, &st) ||
            quant_cuda_gptq_prepare(q, hhalf, -1, 2.0f, k, &o, &hvh, &st) ||
            quant_cuda_gptq_apply(q, w, rows, &hvh, &o, &gh, &eh, &rh, &st) ||
            quant_cuda_gptq_prepare(q, NULL, 1, 1.0f, k, &o, &hvs, &st) ||
            quant_cuda_gptq_apply(q, w, rows, &hvs, &o, &gs, &es, &rs, &st)) {
            CHECK_MSG(0, "act-order %d: %s", ao, st.msg);
            quant_grid_free(&gc), quant_grid_free(&gg), quant_grid_free(&gh), quant_grid_free(&gs);
            quant_gptq_hinv_free(&hvc), quant_gptq_hinv_free(&hvg), quant_gptq_hinv_free(&hvh);
            quant_gptq_hinv_free(&hvs);
            continue;
        }
        int perm_diff = 0, q_diff = 0, half_diff = 0, slot_diff = 0;
        for (int c = 0; c < k; c++) perm_diff += hvc.perm[c] != hvg.perm[c];
        for (long i = 0; i < (long)rows * k; i++)
            q_diff += gc.q[i] != gg.q[i], half_diff += gh.q[i] != gg.q[i], slot_diff += gs.q[i] != gg.q[i];
        CHECK_MSG(perm_diff == 0, "act-order %d: %d column positions differ", ao, perm_diff);
        /* fp64 Cholesky on both sides; the device's fused multiply-adds move values that sit on a
         * rounding boundary, and a flipped value moves the rest of its row a little */
        CHECK_MSG(q_diff <= rows * k / 100, "act-order %d: %d of %d int4 values differ", ao, q_diff, rows * k);
        CHECK_MSG(half_diff == 0 && eh == eg, "act-order %d: H/2 with h_scale 2: %d int4 values differ, loss %g vs %g",
                  ao, half_diff, eh, eg);
        /* the slot's H is the device's own sums (nmse ~1e-10 from the host's, above) */
        CHECK_MSG(slot_diff <= rows * k / 100, "act-order %d: from the Gram slot %d of %d int4 values differ", ao,
                  slot_diff, rows * k);
        CHECK_MSG(fabs(eg - ec) <= 0.02 * ec, "act-order %d: GPTQ loss %g on the GPU, %g on the CPU", ao, eg, ec);
        float *dc = malloc(sizeof(float) * rows * k), *dg = malloc(sizeof(float) * rows * k);
        quant_grid_dequant(&gc, dc), quant_grid_dequant(&gg, dg);
        e = test_nmse(dg, dc, (long)rows * k);
        CHECK_MSG(e < 1e-3, "act-order %d: dequantized weights nmse %g", ao, e);
        /* each device grid's relative output error, against tr(D H D^T) / tr(W H W^T) of that
         * grid here in fp64 (every row: 96 x 320^2 is far under the sampling budget) */
        CHECK_MSG(quant_err_stride(rows, k) == 1, "stride %d", quant_err_stride(rows, k));
        const double want_g = tqc_rel_err(w, dg, hc, rows, k);
        quant_grid_dequant(&gs, dc);
        const double want_s = tqc_rel_err(w, dc, hc, rows, k);
        CHECK_MSG(fabs(rg - want_g) <= 1e-4 * want_g && fabs(rh - rg) <= 1e-6 * rg,
                  "act-order %d: relative output error %g on the GPU (%g from H/2 x 2), %g here", ao, rg, rh, want_g);
        CHECK_MSG(fabs(rs - want_s) <= 1e-4 * want_s, "act-order %d: relative output error %g from the slot, %g here",
                  ao, rs, want_s);
        free(dc), free(dg);
        quant_grid_free(&gc), quant_grid_free(&gg), quant_grid_free(&gh), quant_grid_free(&gs);
        quant_gptq_hinv_free(&hvc), quant_gptq_hinv_free(&hvg), quant_gptq_hinv_free(&hvh), quant_gptq_hinv_free(&hvs);
    }
    /* a slot's H whose width is not the prepare's is refused, not read past */
    {
        quant_gptq_opts o = {.group_size = 64, .damp_percent = 0.01f, .block_size = 128};
        quant_gptq_hinv hv = {0};
        CHECK(quant_cuda_gptq_prepare(q, NULL, 1, 1.0f, k + 64, &o, &hv, &st) != 0);
        CHECK_MSG(strstr(st.msg, "Gram matrix") != NULL, "%s", st.msg);
    }
    free(hhalf);
    quant_cuda_destroy(q);
    free(x), free(w), free(hc), free(hg), free(mc), free(mg);
}

/* AWQ's clipping search on the device (quant_cuda_awq_clip) against quant_awq_clip on the
 * same weights and a correlated H: the (row, group) max values it picks, at group sizes 32,
 * 64 and 128 (128: a 64 KiB H block, past the default shared-memory limit) and 160 (searched
 * on the CPU: the same clip exactly).  Ties and fp64 sums in another order may flip a
 * near-equal pair; a wrong group block or candidate flips most. */
TEST(quant_cuda_awq_clip_vs_cpu) {
    if (!tqc_device()) SKIP("no CUDA device");
    unsigned long long s = test_seed() | 1;
    const int k = 640, n = 200, rows = 37;
    float *x = malloc(sizeof(float) * n * k), *h = calloc((size_t)k * k, sizeof(float));
    float *w = malloc(sizeof(float) * rows * k), *wc = malloc(sizeof(float) * rows * k);
    float *wg = malloc(sizeof(float) * rows * k);
    for (int t = 0; t < n; t++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float common = (float)(s % 2001) / 1000 - 1;
        for (int c = 0; c < k; c++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[(size_t)t * k + c] = 0.7f * common + (float)(s % 2001) / 1000 - 1;
        }
    }
    /* weights with outliers, so that clipping pays on some groups and not on others */
    for (int i = 0; i < rows * k; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        w[i] = (float)(s % 2001) / 20000 - 0.05f + (s % 97 == 0 ? 0.4f : 0.0f);
    }
    CHECK(quant_gram_acc(x, n, k, 1.0f / n, h) == 0);
    quant_gram_mirror(h, k);
    llmi_status st = {0};
    quant_cuda *q = NULL;
    CHECK_MSG(quant_cuda_create(&q, 0, &st) == 0, "%s", st.msg);
    const int gss[4] = {32, 64, 128, 160};
    for (int gi = 0; gi < 4 && q; gi++) {
        const int gs = gss[gi], ng = k / gs;
        memcpy(wc, w, sizeof(float) * rows * k), memcpy(wg, w, sizeof(float) * rows * k);
        if (quant_awq_clip(wc, rows, k, h, gs, 10, &st) || quant_cuda_awq_clip(q, wg, rows, k, h, gs, 10, &st)) {
            CHECK_MSG(0, "gs %d: %s", gs, st.msg);
            continue;
        }
        int differ = 0, clipped = 0;
        for (int r = 0; r < rows; r++)
            for (int g = 0; g < ng; g++) {
                float mc = 0, mg = 0, ma = 0;
                for (int c = g * gs; c < (g + 1) * gs; c++) {
                    mc = fmaxf(mc, fabsf(wc[(size_t)r * k + c])), mg = fmaxf(mg, fabsf(wg[(size_t)r * k + c]));
                    ma = fmaxf(ma, fabsf(w[(size_t)r * k + c]));
                }
                differ += mc != mg;
                clipped += mc < ma;
            }
        printf("  awq clip gs %d: %d of %d groups clipped on the cpu, %d pick another max\n", gs, clipped, rows * ng,
               differ);
        CHECK_MSG(clipped > 0 && clipped < rows * ng, "gs %d: %d of %d groups clipped: the test clips nothing or all",
                  gs, clipped, rows * ng);
        CHECK_MSG(gs > 128 ? differ == 0 : differ <= rows * ng / 100 + 1, "gs %d: %d of %d groups differ", gs, differ,
                  rows * ng);
    }
    if (q) quant_cuda_destroy(q);
    free(x), free(h), free(w), free(wc), free(wg);
}

/* quant_cuda_rel_err (AWQ's and RTN's output error on the GPU) against the formula done
 * here in double over every row: tr(D H D^T) / tr(W H W^T), D = W - dequant(grid), on an
 * RTN grid of random weights and an H with off-diagonal mass; rows 96 keep
 * quant_err_stride at 1, so every row counts on both sides.  A grid with g_idx is refused
 * (the device measure reads columns in order). */
TEST(quant_cuda_rel_err_vs_formula) {
    if (!tqc_device()) SKIP("no CUDA device");
    unsigned long long s = test_seed() | 1;
    const int k = 256, n = 300, rows = 96, gs = 64;
    float *x = malloc(sizeof(float) * n * k), *h = calloc((size_t)k * k, sizeof(float));
    float *w = malloc(sizeof(float) * rows * k), *wq = malloc(sizeof(float) * rows * k);
    for (int t = 0; t < n; t++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const float common = (float)(s % 2001) / 1000 - 1;
        for (int c = 0; c < k; c++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            x[(size_t)t * k + c] = 0.6f * common + (float)(s % 2001) / 1000 - 1 + (c % 13 == 0 ? 2.0f : 0.0f);
        }
    }
    for (int i = 0; i < rows * k; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, w[i] = (float)(s % 2001) / 20000 - 0.05f;
    CHECK(quant_gram_acc(x, n, k, 1.0f / n, h) == 0);
    quant_gram_mirror(h, k);
    llmi_status st = {0};
    quant_grid g = {0};
    quant_cuda *q = NULL;
    CHECK_MSG(quant_rtn(w, rows, k, gs, false, QUANT_STYLE_AWQ, &g, &st) == 0, "%s", st.msg);
    CHECK_MSG(quant_cuda_create(&q, 0, &st) == 0, "%s", st.msg);
    if (q && g.q) {
        quant_grid_dequant(&g, wq);
        double num = 0, den = 0;
        for (int r = 0; r < rows; r++)
            for (int a = 0; a < k; a++) {
                double td = 0, tw = 0;
                for (int b = 0; b < k; b++) {
                    const double hv = h[(size_t)a * k + b];
                    td += hv * ((double)w[(size_t)r * k + b] - wq[(size_t)r * k + b]);
                    tw += hv * w[(size_t)r * k + b];
                }
                num += td * ((double)w[(size_t)r * k + a] - wq[(size_t)r * k + a]);
                den += tw * w[(size_t)r * k + a];
            }
        const double want = num / den;
        double got = -1;
        CHECK_MSG(quant_cuda_rel_err(q, w, &g, h, &got, &st) == 0, "%s", st.msg);
        printf("  rel err: device %.9g, formula %.9g\n", got, want);
        CHECK_MSG(want > 1e-5 && fabs(got - want) <= 1e-4 * want, "device %g, formula %g", got, want);
        /* a weight changed after quantization changes the error: the device reads w, not the grid's */
        w[5 * k + 7] += 0.05f;
        double moved = -1;
        CHECK_MSG(quant_cuda_rel_err(q, w, &g, h, &moved, &st) == 0, "%s", st.msg);
        CHECK_MSG(fabs(moved - got) > 1e-3 * want, "a moved weight left the error at %g", moved);
        quant_grid gi = {0};
        if (quant_grid_alloc(&gi, rows, k, gs, true, &st) == 0) {
            CHECK(quant_cuda_rel_err(q, w, &gi, h, &moved, &st) != 0 && strstr(st.msg, "g_idx"));
            quant_grid_free(&gi);
        }
    }
    if (q) quant_cuda_destroy(q);
    quant_grid_free(&g);
    free(x), free(h), free(w), free(wq);
}

/* The calibration of `llmi quantize --device cuda` (quant/calib.c with a quant_cuda: the
 * CUDA backend's forward, its taps read on the device, the hidden states kept there)
 * against the CPU's on the Llama-3-style HF test model (GQA, llama3 rope_scaling), with
 * the hidden states in bf16, f16 and f32 and 60 windows of 40 tokens (two forwards a
 * layer, the second a short one): a pass stopped at o_proj's input as GPTQ runs one, then
 * every layer's four Gram matrices and mean |x| with the layer run to its end.  The GPU
 * feeds bf16 activations to its GEMMs (and its taps), the CPU fp32: that rounding gives
 * Gram nmse ~3e-7..2e-6 here, a dropped window 0.15, another layer's statistics ~1.
 * (Named outside gpu-check's racecheck list, "quant_cuda": a whole forward under racecheck
 * takes minutes.) */
TEST(calib_cuda_vs_cpu) {
    if (!tqc_device()) SKIP("no CUDA device");
    llmi_model m;
    llmi_status st = {0};
    if (test_load_hf("llama-gqa-rope3", &m, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        return;
    }
    enum { NW = 60, LEN = 40 };
    static int32_t tokens[NW * LEN];
    test_random_tokens(tokens, NW * LEN, m.cfg.n_vocab);
    quant_cuda *q = NULL;
    CHECK_MSG(quant_cuda_create(&q, 0, &st) == 0, "%s", st.msg);
    const llmi_dtype dts[3] = {LLMI_BF16, LLMI_F16, LLMI_F32};
    const unsigned all = (1u << LLMI_TAP_COUNT) - 1;
    for (int di = 0; di < 3 && q; di++) {
        quant_view vc = {0}, vg = {0};
        quant_calib cc = {0}, cg = {0};
        int ok = quant_view_init(&vc, &m, &st) == 0 && quant_view_init(&vg, &m, &st) == 0 &&
                 quant_calib_init(&cc, &vc, tokens, NW, LEN, dts[di], NULL, &st) == 0 &&
                 quant_calib_init(&cg, &vg, tokens, NW, LEN, dts[di], q, &st) == 0;
        CHECK_MSG(ok, "%s: %s", dtype_name(dts[di]), st.msg);
        CHECK(!ok || cg.windows_per_batch < NW);   /* more than one forward a layer */
        double worst = 0;
        for (int l = 0; ok && l < m.cfg.n_layers; l++)
            for (int pass = l > 0; pass < 2 && ok; pass++) {
                /* layer 0: first a pass that stops after o_proj's input, as GPTQ's are */
                const unsigned want = pass == 0 ? 1u << LLMI_TAP_O_IN : all;
                quant_tap_stats tc[LLMI_TAP_COUNT], tg[LLMI_TAP_COUNT];
                if (quant_calib_layer(&cc, want, pass == 1, tc, &st)) {
                    CHECK_MSG(0, "%s layer %d on the cpu: %s", dtype_name(dts[di]), l, st.msg);
                    ok = 0;
                    break;
                }
                if (quant_calib_layer(&cg, want, pass == 1, tg, &st)) {
                    CHECK_MSG(0, "%s layer %d on the gpu: %s", dtype_name(dts[di]), l, st.msg);
                    for (int t = 0; t < LLMI_TAP_COUNT; t++) quant_tap_stats_free(&tc[t]);
                    ok = 0;
                    break;
                }
                for (int t = 0; t < LLMI_TAP_COUNT; t++) {
                    if (!(want >> t & 1u)) {
                        CHECK(!tc[t].gram && !tg[t].gram);
                        continue;
                    }
                    const long k = tc[t].cols;
                    double eg = test_nmse(tg[t].gram, tc[t].gram, k * k), em = test_nmse(tg[t].xmean, tc[t].xmean, k);
                    worst = fmax(worst, fmax(eg, em));
                    CHECK_MSG(eg <= 1e-4 && em <= 1e-4, "%s layer %d tap %d%s: Gram nmse %g, mean |x| nmse %g",
                              dtype_name(dts[di]), l, t, pass ? "" : " (stopped)", eg, em);
                    quant_tap_stats_free(&tc[t]), quant_tap_stats_free(&tg[t]);
                }
                CHECK(cc.next_layer == cg.next_layer && cc.next_layer == l + pass);
            }
        printf("  calibration, hidden states in %s: worst Gram / mean |x| nmse %.3g over %d layers\n",
               dtype_name(dts[di]), worst, m.cfg.n_layers);
        quant_calib_free(&cc), quant_calib_free(&cg);
        quant_view_free(&vc), quant_view_free(&vg);
    }
    if (q) quant_cuda_destroy(q);
    model_free(&m);
}

#endif
