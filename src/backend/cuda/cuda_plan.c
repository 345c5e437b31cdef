/* cuda_plan.c — the CUDA backend's host-only decisions (see cuda_plan.h). */
#include "backend/cuda/cuda_plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"

int cuda_graph_bucket(int n) {
    int b = 1;
    while (b < n) b <<= 1;
    return b;
}

int cuda_graph_stride(int max_ctx, int model_max_ctx, int block_size) {
    int ctx = max_ctx > 0 ? max_ctx : (model_max_ctx > 0 ? model_max_ctx : 4096);
    return (ctx + block_size - 1) / block_size;
}

bool cuda_graph_eligible(const llmi_batch *bt, int block_size, int graph_stride, int max_bucket) {
    if (bt->n_tokens != bt->n_seqs || bt->n_logits != bt->n_tokens) return false;
    if (cuda_graph_bucket(bt->n_tokens) > max_bucket) return false;
    /* n_tokens == n_seqs alone allows one sequence two tokens and another none */
    for (int i = 0; i < bt->n_seqs; i++)
        if (bt->query_start[i] != i) return false;
    for (int i = 0; i < bt->n_tokens; i++)
        if (bt->logit_rows[i] != i || bt->positions[i] / block_size >= graph_stride) return false;
    return true;
}

bool cuda_graph_model_ok(int n_experts) { return n_experts <= 0; }

int cuda_gemm_bucket(int n) {
    if (n <= CUDA_GRAPH_MAX) return cuda_graph_bucket(n);
    return (n + CUDA_GRAPH_MAX - 1) / CUDA_GRAPH_MAX * CUDA_GRAPH_MAX;
}

cuda_i4_path cuda_i4_choose(int n, int dequant_min_n) {
    return n < dequant_min_n ? CUDA_I4_GEMV : CUDA_I4_DEQUANT_GEMM;
}

/* A whole number in [lo, hi] from env into *n, else dflt when env is NULL; -1 when it is not. */
static int env_count(const char *env, int dflt, long lo, long hi, int *n) {
    *n = dflt;
    if (!env) return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(env, &end, 10);
    if (errno || end == env || *end || v < lo || v > hi) return -1;
    *n = (int)v;
    return 0;
}

int cuda_env_word(const char *env, const char *const *words, int n_words, int *idx) {
    *idx = 0;
    if (!env) return 0;
    for (int i = 0; i < n_words; i++)
        if (strcmp(env, words[i]) == 0) return *idx = i, 0;
    return -1;
}

int cuda_i4_dequant_min_n(const char *env, int *n) { return env_count(env, CUDA_I4_DEQUANT_MIN_N, 1, 65536, n); }

int cuda_gemm_tune(const char *env, int *n) { return env_count(env, 1, 1, CUDA_GEMM_TUNE_MAX, n); }

void cuda_i4_grid(const llmi_tensor *t, int *group_size, int64_t *n_groups, const int32_t **g_idx) {
    const bool q40 = t->dtype == LLMI_Q4_0;
    *group_size = q40 ? 32 : t->group_size;
    *n_groups = q40 ? t->cols / 32 : t->n_groups;
    *g_idx = q40 ? NULL : t->g_idx;
}

size_t cuda_weight_bytes(const llmi_tensor *t, bool keep_int4) {
    size_t rows = (size_t)t->rows, cols = (size_t)t->cols;
    if ((t->dtype == LLMI_I4G || t->dtype == LLMI_Q4_0) && keep_int4) {
        int gs;
        int64_t ng;
        const int32_t *g_idx;
        cuda_i4_grid(t, &gs, &ng, &g_idx);
        size_t groups = (size_t)ng * rows;
        return rows * cols / 2 + groups * 2 + groups + (g_idx ? cols * 4 : 0);
    }
    return rows * cols * 2;
}

size_t cuda_kv_headroom(size_t total) {
    size_t h = (size_t)512 << 20;
    return total / 20 < h ? total / 20 : h;
}

size_t cuda_kv_budget(size_t total, size_t free_b, double util, size_t kv_held) {
    if (!(util > 0 && util <= 1)) util = LLMI_GPU_MEM_UTIL_DEFAULT;
    double allowed = (double)total * util - (double)(total - free_b) + (double)kv_held - (double)cuda_kv_headroom(total);
    return allowed > 0 ? (size_t)allowed : 0;
}
