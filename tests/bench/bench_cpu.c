/* bench_cpu.c — speed of the CPU compute path, outside the unit tests (built by
 * scripts/bench-cpu-ops.sh with the Makefile's flags).
 *   bench_cpu matmul [reps]                  GFLOP/s and weight GB/s of cpu_matmul on the
 *                                            SmolLM2-135M shapes at n = 1 and n = 512
 *   bench_cpu model PATH [n_prompt] [n_gen] [threads] [kv f32|f16|bf16]
 *                                            llama-bench-like pp/tg through backend->forward */
#include <omp.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "model/model.h"

/* Process CPU seconds: on a machine shared with other jobs, with 1 thread this is the
 * time the work itself took, unlike wall time. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t bench_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int bench_matmul(int reps) {
    const int shapes[][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
    const llmi_dtype dts[] = {LLMI_Q4_1, LLMI_Q4_0, LLMI_Q8_0, LLMI_F16, LLMI_F32};
    const int ns[] = {1, 512};
    uint64_t s = 42;
    printf("| dtype | rows x cols | n | ms/call | GFLOP/s | weight GB/s | cpu ms/call (all threads) |\n|---|---|---|---|---|---|---|\n");
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t ni = 0; ni < 2; ni++) {
                llmi_dtype t = dts[di];
                int rows = shapes[si][0], cols = shapes[si][1], n = ns[ni];
                if (t == LLMI_F32 && rows == 49152 && n == 512) continue;
                llmi_tensor w = {0};
                w.dtype = t; w.rows = rows; w.cols = cols;
                w.row_bytes = (size_t)(cols / dtype_block_elems(t)) * dtype_block_bytes(t);
                uint8_t *d = malloc(w.row_bytes * rows);
                for (size_t i = 0; i < w.row_bytes * rows; i++) d[i] = (uint8_t)bench_rand(&s);
                if (t != LLMI_F32) /* keep scales finite: a small fp16 in every block header / element */
                    for (size_t i = 0; i + 1 < w.row_bytes * rows; i += (t == LLMI_F16 ? 2 : dtype_block_bytes(t))) {
                        d[i + 1] = (uint8_t)(0x20 | (d[i + 1] & 0x83));
                        if (t == LLMI_Q4_1) d[i + 3] = (uint8_t)(0x20 | (d[i + 3] & 0x83));
                    }
                else
                    for (size_t i = 0; i < (size_t)rows * cols; i++) ((float *)d)[i] = (float)(bench_rand(&s) % 1000) * 1e-3f;
                w.data = d;
                float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
                for (int i = 0; i < n * cols; i++) x[i] = (float)((int)(bench_rand(&s) % 2001) - 1000) * 1e-3f;
                int r = n == 1 ? reps * 20 : (rows > 10000 ? 1 : reps);
                cpu_matmul(&w, x, n, NULL, y);   /* warm up */
                double t0 = omp_get_wtime(), c0 = cpu_now();
                for (int i = 0; i < r; i++) cpu_matmul(&w, x, n, NULL, y);
                double dt = (omp_get_wtime() - t0) / r, dc = (cpu_now() - c0) / r;
                printf("| %s | %d x %d | %d | %.3f | %.1f | %.1f | %.3f |\n", dtype_name(t), rows, cols, n, dt * 1e3,
                       2.0 * n * rows * cols / dt * 1e-9, (double)w.row_bytes * rows / dt * 1e-9, dc * 1e3);
                fflush(stdout);
                free(d); free(x); free(y);
            }
    return 0;
}

static int bench_model(const char *path, int n_prompt, int n_gen, int threads, llmi_kv_dtype kvd) {
    llmi_model m;
    memset(&m, 0, sizeof m);
    llmi_status st = {0};
    llmi_load_opts lo = {0};
    lo.no_tokenizer = true;
    if (model_load(path, &lo, &m, &st)) { fprintf(stderr, "bench: %s\n", st.msg); return 1; }
    int bs = 16, nblk = (n_prompt + n_gen) / bs + 2;
    llmi_backend_opts o = {0};
    o.n_threads = threads; o.kv_dtype = kvd; o.block_size = bs; o.max_batch_tokens = n_prompt; o.max_seqs = 1;
    llmi_backend *b = NULL;
    if (backend_cpu_create(&m, &o, &b, &st) || b->kv_alloc(b, nblk, &st)) {
        fprintf(stderr, "bench: %s\n", st.msg);
        if (b) b->destroy(b);
        model_free(&m);
        return 1;
    }
    int32_t *tok = malloc(sizeof(int32_t) * (n_prompt + n_gen)), *pos = malloc(sizeof(int32_t) * n_prompt);
    int32_t *slot = malloc(sizeof(int32_t) * n_prompt), *sot = calloc(n_prompt, sizeof(int32_t));
    int32_t *table = malloc(sizeof(int32_t) * nblk);
    float *logits = malloc(sizeof(float) * m.cfg.n_vocab);
    uint64_t s = 7;
    for (int i = 0; i < n_prompt + n_gen; i++) tok[i] = (int32_t)(bench_rand(&s) % (uint64_t)m.cfg.n_vocab);
    for (int i = 0; i < nblk; i++) table[i] = nblk - 1 - i;
    for (int i = 0; i < n_prompt; i++) { pos[i] = i; slot[i] = table[i / bs] * bs + i % bs; }
    printf("model %s (%s, lm_head %s, %d layers, dim %d), device %s, %d threads, kv %s\n", m.cfg.name,
           dtype_name(m.layers[0].wq.dtype), dtype_name(m.lm_head.dtype),
           m.cfg.n_layers, m.cfg.dim, b->device_name, threads, kvd == LLMI_KV_F32 ? "f32" : kvd == LLMI_KV_F16 ? "f16" : "bf16");
    for (int rep = 0; rep < 3; rep++) {
        int32_t qs[2] = {0, n_prompt}, ctx = n_prompt, last = n_prompt - 1;
        llmi_batch bt = {n_prompt, tok, pos, slot, sot, 1, qs, &ctx, table, nblk, 1, &last};
        b->profiling = rep == 2;
        memset(&b->stats, 0, sizeof b->stats);
        double t0 = omp_get_wtime(), c0 = cpu_now();
        if (b->forward(b, &bt, logits, &st)) { fprintf(stderr, "bench: %s\n", st.msg); return 1; }
        double tp = omp_get_wtime() - t0, cp = cpu_now() - c0;
        t0 = omp_get_wtime();
        c0 = cpu_now();
        for (int g = 0; g < n_gen; g++) {
            int32_t p = n_prompt + g, sl = table[p / bs] * bs + p % bs, q1[2] = {0, 1}, c1 = p + 1, r0 = 0, s0 = 0;
            llmi_batch bd = {1, tok + p, &p, &sl, &s0, 1, q1, &c1, table, nblk, 1, &r0};
            if (b->forward(b, &bd, logits, &st)) { fprintf(stderr, "bench: %s\n", st.msg); return 1; }
        }
        double tg = omp_get_wtime() - t0, cg = cpu_now() - c0;
        printf("rep %d%s: pp%d %.1f tok/s (%.3f s wall, %.3f s cpu)   tg%d %.1f tok/s (%.3f s wall, %.3f s cpu)\n", rep,
               rep == 2 ? " (profiled)" : "", n_prompt, n_prompt / tp, tp, cp, n_gen, n_gen / tg, tg, cg);
    }
    printf("profile of the last rep (prefill + decode):\n| op | s | GFLOP/s | GB/s |\n|---|---|---|---|\n");
    for (int c = 0; c < LLMI_OP_COUNT; c++)
        if (b->stats.calls[c])
            printf("| %s | %.3f | %.1f | %.1f |\n", op_class_name((llmi_op_class)c), b->stats.seconds[c],
                   b->stats.flops[c] / b->stats.seconds[c] * 1e-9, b->stats.bytes[c] / b->stats.seconds[c] * 1e-9);
    free(tok); free(pos); free(slot); free(sot); free(table); free(logits);
    b->destroy(b);
    model_free(&m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "matmul") == 0) return bench_matmul(argc > 2 ? atoi(argv[2]) : 5);
    if (argc >= 3 && strcmp(argv[1], "model") == 0) {
        llmi_kv_dtype kvd = LLMI_KV_F32;
        if (argc > 6) kvd = strcmp(argv[6], "f16") == 0 ? LLMI_KV_F16 : strcmp(argv[6], "bf16") == 0 ? LLMI_KV_BF16 : LLMI_KV_F32;
        return bench_model(argv[2], argc > 3 ? atoi(argv[3]) : 512, argc > 4 ? atoi(argv[4]) : 128,
                           argc > 5 ? atoi(argv[5]) : 2, kvd);
    }
    fprintf(stderr, "usage: bench_cpu matmul [reps] | bench_cpu model PATH [n_prompt] [n_gen] [threads] [kv]\n");
    return 2;
}
