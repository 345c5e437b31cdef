/* kernel_bench.c — single-thread microbenchmarks of the CPU op twins that dominate a
 * forward, timed in thread CPU time (best of REPS), so that two builds can be compared
 * side by side on a busy machine where wall-clock rates of the whole binary scatter.
 *   build/kernel_bench matmul ROWS COLS N [REPS [DTYPE]]  a DTYPE weight (q4_1 default, q4_0, q8_0,
 *                                                  q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs
 *                                                  packed; f16, bf16)
 *                                                  x N tokens (cpu_matmul)
 *   build/kernel_bench attention N [REPS]          causal prefill of N tokens, SmolLM2's
 *                                                  9 heads / 3 KV heads of 64, f16 KV
 *   build/kernel_bench swiglu N [REPS]             N elements of silu(gate) * up
 *   build/kernel_bench grammar MASKS.jsonl TOKDIR  every walk of testdata/grammar/masks.jsonl
 *                                                  (grammar_state_mask then accept, a fresh
 *                                                  state per walk) over TOKDIR's vocabulary
 *                                                  (testdata/tokenizer/smollm2): ms per mask,
 *                                                  first masks of a walk and the rest apart
 * One thread.  Each prints one line: the op, its shape, best ms, and a rate.  Inputs are fixed
 * pseudo-random values; a checksum of the output is printed so that two builds can be
 * seen to compute the same thing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>
#include "backend/cpu/ops.h"
#include "core/fileio.h"
#include <cJSON.h>
#include "engine/grammar.h"
#include "tok/tokenizer.h"

static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float unif(uint64_t *s) { return (float)((mix(s) >> 40) * (1.0 / 16777216.0)) - 0.5f; }

static double checksum(const float *y, size_t n) {
    double c = 0;
    for (size_t i = 0; i < n; i++) c += y[i];
    return c;
}

static int bench_matmul(int rows, int cols, int n, int reps, const char *dtype) {
    llmi_dtype t = !strcmp(dtype, "q4_1") ? LLMI_Q4_1 : !strcmp(dtype, "q4_0") ? LLMI_Q4_0
                 : !strcmp(dtype, "q8_0") ? LLMI_Q8_0 : !strcmp(dtype, "f16") ? LLMI_F16
                 : !strcmp(dtype, "bf16") ? LLMI_BF16 : !strcmp(dtype, "q4_k") ? LLMI_Q4_K
                 : !strcmp(dtype, "q5_k") ? LLMI_Q5_K : !strcmp(dtype, "q6_k") ? LLMI_Q6_K
                 : !strcmp(dtype, "q3_k") ? LLMI_Q3_K : !strcmp(dtype, "q5_0") ? LLMI_Q5_0
                 : !strcmp(dtype, "q5_1") ? LLMI_Q5_1 : !strcmp(dtype, "iq4_nl") ? LLMI_IQ4_NL
                 : !strcmp(dtype, "iq4_xs") ? LLMI_IQ4_XS : !strcmp(dtype, "q2_k") ? LLMI_Q2_K : LLMI_DTYPE_COUNT;
    if (rows <= 0 || cols <= 0 || n <= 0 || t == LLMI_DTYPE_COUNT || cols % dtype_block_elems(t)) {
        fprintf(stderr, "kernel_bench: matmul needs ROWS > 0, COLS a multiple of 32 (256: k-quants), N > 0, "
                        "DTYPE q4_1|q4_0|q8_0|q5_0|q5_1|q2_k|q3_k|q4_k|q5_k|q6_k|iq4_nl|iq4_xs|f16|bf16\n");
        return 2;
    }
    uint64_t s = 7;
    const size_t bb = dtype_block_bytes(t), be = (size_t)dtype_block_elems(t);
    llmi_tensor w = {.dtype = t, .rows = rows, .cols = cols, .row_bytes = (size_t)cols / be * bb};
    uint8_t *d = malloc(w.row_bytes * (size_t)rows);   /* (rows, row_bytes) in dtype t */
    float *x = malloc(sizeof(float) * (size_t)n * cols), *y = malloc(sizeof(float) * (size_t)n * rows);
    if (!d || !x || !y) return 1;
    for (size_t i = 0; i < w.row_bytes * (size_t)rows; i++) d[i] = (uint8_t)mix(&s);
    for (size_t b = 0; b < (size_t)rows * cols / be; b++) {   /* sane values: scales (and mins), or the weights */
        uint16_t sc = f32_to_fp16(0.01f + 0.01f * (unif(&s) + 0.5f)), mn = f32_to_fp16(-0.05f);
        if (t == LLMI_F16) sc = f32_to_fp16(0.05f * unif(&s));
        if (t == LLMI_BF16) sc = f32_to_bf16(0.05f * unif(&s));
        if (dtype_block_elems(t) == 256) sc = f32_to_fp16(0.001f);   /* a super-block scale (Q4_K/Q5_K: and dmin) */
        memcpy(d + b * bb + (t == LLMI_Q6_K ? 208 : t == LLMI_Q3_K ? 108 : t == LLMI_Q2_K ? 80 : 0), &sc, 2);
        if (t == LLMI_Q2_K) memcpy(d + b * bb + 82, &sc, 2);
        if (t == LLMI_Q4_1 || t == LLMI_Q5_1 || t == LLMI_Q4_K || t == LLMI_Q5_K)
            memcpy(d + b * bb + 2, dtype_is_kquant(t) ? &sc : &mn, 2);
    }
    w.data = d;
    llmi_tensor pk = w;   /* the layout the backend runs on: quantized weights packed once, as at load */
    llmi_status st;
    if (cpu_qweight_packable(&w) && cpu_qweight_pack(&w, &pk, &st)) { fprintf(stderr, "kernel_bench: %s\n", st.msg); return 1; }
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = unif(&s);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = thread_cpu_s();
        cpu_matmul(&pk, x, n, NULL, y);
        double el = thread_cpu_s() - t0;
        best = el < best ? el : best;
    }
    printf("matmul %s %dx%d n=%d: best %.3f ms, %.1f GMAC/s, checksum %.9g\n", dtype_name(t), rows, cols, n, best * 1e3,
           (double)rows * cols * n / best * 1e-9, checksum(y, (size_t)n * rows));
    free(d); free(x); free(y);
    if (pk.owned) free(pk.owned);
    return 0;
}

static int bench_attention(int n, int reps) {
    if (n <= 0) {
        fprintf(stderr, "kernel_bench: attention needs N > 0\n");
        return 2;
    }
    const int nh = 9, nkv = 3, hd = 64, bs = 16, nblk = (n + bs - 1) / bs;
    const size_t slot = (size_t)nkv * hd;
    uint64_t s = 11;
    float *q = malloc(sizeof(float) * (size_t)n * nh * hd);     /* (n, nh, hd) */
    float *out = malloc(sizeof(float) * (size_t)n * nh * hd);   /* (n, nh, hd) */
    uint16_t *kc = malloc(2 * slot * (size_t)nblk * bs);          /* (slots, nkv, hd) f16 */
    uint16_t *vc = malloc(2 * slot * (size_t)nblk * bs);          /* (slots, nkv, hd) f16 */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq = calloc((size_t)n, sizeof(int32_t));
    int32_t *table = malloc(sizeof(int32_t) * (size_t)nblk), qs[2] = {0, n};
    if (!q || !out || !kc || !vc || !pos || !seq || !table) return 1;
    for (size_t i = 0; i < (size_t)n * nh * hd; i++) q[i] = unif(&s);
    for (size_t i = 0; i < slot * (size_t)nblk * bs; i++) {
        kc[i] = f32_to_fp16(unif(&s));
        vc[i] = f32_to_fp16(unif(&s));
    }
    for (int i = 0; i < n; i++) pos[i] = i;
    for (int i = 0; i < nblk; i++) table[i] = i;
    llmi_batch b = {.n_tokens = n, .positions = pos, .slot_mapping = pos, .seq_of_token = seq, .n_seqs = 1,
                    .query_start = qs, .block_tables = table, .max_blocks_per_seq = nblk};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = thread_cpu_s();
        cpu_paged_attention(q, kc, vc, LLMI_KV_F16, NULL, NULL, &b, nh, nkv, hd, bs, (cpu_attn_scores){0.125f, 0, 0}, out);
        double t = thread_cpu_s() - t0;
        best = t < best ? t : best;
    }
    double pairs = (double)nh * n * (n + 1) / 2;   /* (query row, key position) pairs */
    printf("attention f16 n=%d: best %.3f ms, %.2f ns per (row, position), checksum %.9g\n", n, best * 1e3,
           best / pairs * 1e9, checksum(out, (size_t)n * nh * hd));
    free(q); free(out); free(kc); free(vc); free(pos); free(seq); free(table);
    return 0;
}

static int bench_swiglu(int n, int reps) {
    if (n <= 0) {
        fprintf(stderr, "kernel_bench: swiglu needs N > 0\n");
        return 2;
    }
    uint64_t s = 13;
    float *g = malloc(sizeof(float) * (size_t)n), *u = malloc(sizeof(float) * (size_t)n);
    float *o = malloc(sizeof(float) * (size_t)n);
    if (!g || !u || !o) return 1;
    for (int i = 0; i < n; i++) { g[i] = 8.0f * unif(&s); u[i] = unif(&s); }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = thread_cpu_s();
        cpu_swiglu_range(g, u, 0, (size_t)n, o);
        double t = thread_cpu_s() - t0;
        best = t < best ? t : best;
    }
    printf("swiglu n=%d: best %.3f ms, %.2f ns per element, checksum %.9g\n", n, best * 1e3, best / n * 1e9,
           checksum(o, (size_t)n));
    free(g); free(u); free(o);
    return 0;
}

/* The whole file, NUL-terminated (core/fileio.h's reader), or NULL. */
static char *read_all(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    llmi_status st = {0};
    fileio_opts fo = {.max_bytes = (size_t)64 << 20};
    return fileio_read(path, &fo, &buf, &len, &st) ? NULL : buf;
}

/* A walk's first mask pays for the trie walk from the start state; later ones often hit a
 * state seen before (the per-state cache), so the two are reported apart. */
static int bench_grammar(const char *masks_path, const char *tok_dir) {
    char *all = read_all(masks_path);
    tokenizer *tk = NULL;
    grammar_vocab *gv = NULL;
    llmi_status st = {0};
    if (!all || tok_load_hf(tok_dir, &tk, &st) || grammar_vocab_build(tk, &gv, &st)) {
        fprintf(stderr, "kernel_bench grammar: %s\n", all ? st.msg : "cannot read the masks file");
        return 1;
    }
    int V = tok_n_vocab(tk);
    uint8_t *mask = malloc((size_t)V);
    double t_first = 0, t_rest = 0, worst = 0;
    long n_first = 0, n_rest = 0;
    double t0 = thread_cpu_s();
    for (int rep = 0; rep < 3; rep++) {   /* the trie build, timed once */
        grammar_vocab_free(gv);
        grammar_vocab_build(tk, &gv, &st);
    }
    double t_trie = (thread_cpu_s() - t0) / 3;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *gtext = cJSON_GetObjectItem(j, "grammar");
        grammar *g = NULL;
        grammar_state *gs = NULL;
        if (!gtext || grammar_parse(gtext->valuestring, strlen(gtext->valuestring), "bench", &g, &st) ||
            grammar_state_create(g, gv, &gs, &st)) {
            cJSON_Delete(j);
            grammar_free(g);
            continue;
        }
        const cJSON *toks = cJSON_GetObjectItem(j, "tokens");
        int accepted = cJSON_GetObjectItem(j, "accepted")->valueint;
        for (int i = 0; i <= accepted; i++) {
            double a = thread_cpu_s();
            grammar_state_mask(gs, true, mask, &st);
            double dt = thread_cpu_s() - a;
            if (i == 0) t_first += dt, n_first++;
            else t_rest += dt, n_rest++;
            if (dt > worst) worst = dt;
            if (i == accepted || grammar_state_accept(gs, cJSON_GetArrayItem(toks, i)->valueint, &st)) break;
        }
        grammar_state_free(gs);
        grammar_free(g);
        cJSON_Delete(j);
    }
    printf("grammar | vocab %d | trie build %.2f ms | first mask of a walk %.3f ms (%ld) | later masks %.3f ms (%ld) | "
           "worst %.2f ms\n", V, 1e3 * t_trie, 1e3 * t_first / (n_first ? n_first : 1), n_first,
           1e3 * t_rest / (n_rest ? n_rest : 1), n_rest, 1e3 * worst);
    free(mask);
    grammar_vocab_free(gv);
    tok_free(tk);
    free(all);
    return 0;
}

int main(int argc, char **argv) {
    /* the ops parallelise with OpenMP; the thread CPU time of one thread of a team would
     * count only its share of the work */
    omp_set_num_threads(1);
    const char *op = argc > 1 ? argv[1] : "";
    if (!strcmp(op, "matmul") && argc >= 5 && argc <= 7)
        return bench_matmul(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), argc >= 6 ? atoi(argv[5]) : 20,
                            argc == 7 ? argv[6] : "q4_1");
    if (!strcmp(op, "attention") && (argc == 3 || argc == 4))
        return bench_attention(atoi(argv[2]), argc == 4 ? atoi(argv[3]) : 20);
    if (!strcmp(op, "swiglu") && (argc == 3 || argc == 4))
        return bench_swiglu(atoi(argv[2]), argc == 4 ? atoi(argv[3]) : 200);
    if (!strcmp(op, "grammar") && argc == 4) return bench_grammar(argv[2], argv[3]);
    fprintf(stderr, "usage: kernel_bench matmul ROWS COLS N [REPS [DTYPE]] | attention N [REPS] | swiglu N [REPS] | "
                    "grammar MASKS.jsonl TOKDIR\n");
    return 2;
}
