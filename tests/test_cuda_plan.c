/* test_cuda_plan.c — the CUDA backend's host-only decisions (src/backend/cuda/cuda_plan.h),
 * which run in every build: decode-graph eligibility and stride, the GEMM cache's token
 * buckets against the graph buckets, the int4 kernel choice, weight bytes on the GPU, and
 * the KV budget's headroom. */
#include <string.h>
#include "backend/cuda/cuda_plan.h"
#include "test.h"

/* A pure-decode batch of n sequences, sequence i at position pos0 + i. */
typedef struct decode_batch {
    int32_t tok[8], pos[8], slot[8], seq[8], qs[9], rows[8], tables[8 * 4];
    llmi_batch b;
} decode_batch;

static void decode_batch_make(decode_batch *d, int n, int pos0) {
    memset(d, 0, sizeof *d);
    for (int i = 0; i < n; i++) {
        d->pos[i] = pos0 + i;
        d->seq[i] = i;
        d->qs[i] = i;
        d->rows[i] = i;
    }
    d->qs[n] = n;
    d->b = (llmi_batch){.n_tokens = n, .tokens = d->tok, .positions = d->pos, .slot_mapping = d->slot,
                        .seq_of_token = d->seq, .n_seqs = n, .query_start = d->qs, .block_tables = d->tables,
                        .max_blocks_per_seq = 4, .n_logits = n, .logit_rows = d->rows};
}

TEST(cuda_plan_graph_eligibility) {
    decode_batch d;
    decode_batch_make(&d, 5, 3);
    CHECK(cuda_graph_eligible(&d.b, 16, 4, 8));
    /* issue 8 item 7: as many tokens as sequences, but sequence 0 has two and sequence 1
     * none (batch_check allows empty ranges): not a decode batch */
    d.qs[1] = 2;
    d.seq[1] = 0;
    CHECK(!cuda_graph_eligible(&d.b, 16, 4, 8));
    decode_batch_make(&d, 5, 3);
    d.rows[2] = 3;   /* logit rows out of order */
    CHECK(!cuda_graph_eligible(&d.b, 16, 4, 8));
    decode_batch_make(&d, 5, 3);
    d.b.n_logits = 4;
    CHECK(!cuda_graph_eligible(&d.b, 16, 4, 8));
    decode_batch_make(&d, 5, 3);
    CHECK(!cuda_graph_eligible(&d.b, 16, 4, 4));   /* bucket 8 above the largest */
    decode_batch_make(&d, 2, 63);                  /* positions 63, 64: block 4 is past a stride of 4 */
    CHECK(!cuda_graph_eligible(&d.b, 16, 4, 8));
    CHECK(cuda_graph_eligible(&d.b, 16, 5, 8));
    /* a mixture of experts waits for its routing on the host every layer: never a graph */
    CHECK(cuda_graph_model_ok(0));
    CHECK(!cuda_graph_model_ok(8));
}

TEST(cuda_plan_graph_stride_from_engine_context) {
    /* issue 8 item 2: the engine's -c sizes the graph tables, not the model's 128k */
    CHECK(cuda_graph_stride(4096, 131072, 16) == 256);
    CHECK(cuda_graph_stride(4097, 131072, 16) == 257);
    CHECK(cuda_graph_stride(0, 2048, 16) == 128);
    CHECK(cuda_graph_stride(0, 0, 16) == 256);
    CHECK(cuda_graph_bucket(1) == 1 && cuda_graph_bucket(3) == 4 && cuda_graph_bucket(256) == 256);
}

TEST(cuda_plan_gemm_buckets) {
    /* issue 8 item 6: every batch a graph bucket pads shares that bucket's GEMM key, so the
     * eager run of n sequences warms the algorithm the padded graph uses */
    for (int B = 1; B <= CUDA_GRAPH_MAX; B *= 2)
        for (int n = B / 2 + 1; n <= B; n++)
            CHECK_MSG(cuda_gemm_bucket(n) == cuda_gemm_bucket(B) && cuda_gemm_bucket(B) == B, "n %d, bucket %d", n, B);
    int distinct = 0, prev = 0;
    for (int n = 1; n <= 65535; n++) {
        int k = cuda_gemm_bucket(n);
        CHECK(k >= n);
        if (k != prev) distinct++;
        prev = k;
    }
    /* few keys per weight shape: the cache (512 entries) holds a model's worth */
    CHECK_MSG(distinct <= 9 + 65535 / CUDA_GRAPH_MAX, "%d distinct keys", distinct);
}

TEST(cuda_plan_int4_paths) {
    const int dmin = CUDA_I4_DEQUANT_MIN_N;
    CHECK(cuda_i4_choose(1, dmin) == CUDA_I4_GEMV && cuda_i4_choose(CUDA_I4_GEMV_MAX_N, dmin) == CUDA_I4_GEMV);
    /* two GEMV passes still beat writing and reading the dense matrix */
    CHECK(cuda_i4_choose(CUDA_I4_GEMV_MAX_N + 1, dmin) == CUDA_I4_GEMV &&
          cuda_i4_choose(2 * CUDA_I4_GEMV_MAX_N, dmin) == CUDA_I4_GEMV);
    CHECK(cuda_i4_choose(dmin, dmin) == CUDA_I4_DEQUANT_GEMM && cuda_i4_choose(2048, dmin) == CUDA_I4_DEQUANT_GEMM);
    CHECK(CUDA_I4_DEQUANT_MIN_N == 2 * CUDA_I4_GEMV_MAX_N + 1);
    /* LLMI_I4_DEQUANT_MIN_N moves the switch; a value that is no token count is refused */
    CHECK(cuda_i4_choose(9, 9) == CUDA_I4_DEQUANT_GEMM && cuda_i4_choose(8, 9) == CUDA_I4_GEMV);
    int v = 0;
    CHECK(cuda_i4_dequant_min_n(NULL, &v) == 0 && v == CUDA_I4_DEQUANT_MIN_N);
    CHECK(cuda_i4_dequant_min_n("9", &v) == 0 && v == 9);
    CHECK(cuda_i4_dequant_min_n("1", &v) == 0 && v == 1);
    const char *bad[] = {"", "0", "-3", "9x", "x", "65537", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK_MSG(cuda_i4_dequant_min_n(bad[i], &v) == -1, "'%s'", bad[i]);
    static const char *const words[] = {"tc", "fp32"};
    CHECK(cuda_env_word(NULL, words, 2, &v) == 0 && v == 0);
    CHECK(cuda_env_word("fp32", words, 2, &v) == 0 && v == 1);
    CHECK(cuda_env_word("tc", words, 2, &v) == 0 && v == 0);
    CHECK(cuda_env_word("simt", words, 2, &v) == -1 && cuda_env_word("", words, 2, &v) == -1);
    CHECK(cuda_gemm_tune(NULL, &v) == 0 && v == 1);
    CHECK(cuda_gemm_tune("8", &v) == 0 && v == 8);
    CHECK(cuda_gemm_tune("16", &v) == 0 && v == CUDA_GEMM_TUNE_MAX);
    const char *bad_tune[] = {"0", "17", "8x", "", "-1"};
    for (size_t i = 0; i < sizeof bad_tune / sizeof *bad_tune; i++)
        CHECK_MSG(cuda_gemm_tune(bad_tune[i], &v) == -1, "LLMI_GEMM_TUNE '%s'", bad_tune[i]);
    /* a 4096 x 4096 group-128 int4 weight: 8 MiB of nibbles + 96 KiB of scales and zeros,
     * not the 32 MiB it takes as bf16 */
    llmi_tensor t = {.dtype = LLMI_I4G, .rows = 4096, .cols = 4096, .group_size = 128, .n_groups = 32};
    CHECK(cuda_weight_bytes(&t, true) == (size_t)4096 * 2048 + (size_t)32 * 4096 * 3);
    CHECK(cuda_weight_bytes(&t, false) == (size_t)4096 * 4096 * 2);
    int32_t g_idx[1] = {0};
    t.g_idx = g_idx;
    CHECK(cuda_weight_bytes(&t, true) == (size_t)4096 * 2048 + (size_t)32 * 4096 * 3 + 4096 * 4);
    llmi_tensor f16 = {.dtype = LLMI_F16, .rows = 10, .cols = 64};
    CHECK(cuda_weight_bytes(&f16, true) == 10 * 64 * 2);   /* fp16 models are held in bf16 */
}

TEST(cuda_plan_kv_headroom) {
    const size_t G = (size_t)1 << 30, total = 80 * G;
    /* issue 8 item 8: util 1.0 with the whole card free still leaves the headroom */
    size_t b = cuda_kv_budget(total, total, 1.0, 0);
    CHECK(b == total - cuda_kv_headroom(total) && cuda_kv_headroom(total) >= ((size_t)256 << 20));
    /* 0.9 of the card, 20 GiB in use (weights, workspaces, others), a 30 GiB cache held */
    b = cuda_kv_budget(total, total - 20 * G, 0.9, 30 * G);
    CHECK(b == (size_t)(0.9 * (double)total) - 20 * G + 30 * G - cuda_kv_headroom(total));
    CHECK(cuda_kv_budget(total, G, 0.9, 0) == 0);   /* nearly full: nothing, not a wrapped size_t */
    CHECK(cuda_kv_headroom(4 * G) <= 4 * G / 20);    /* small cards keep a proportional headroom */
}
