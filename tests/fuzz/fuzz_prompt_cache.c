/* fuzz_prompt_cache.c — a --prompt-cache entry file (engine/prompt_cache.c: header,
 * tokens, zstd frame of the K/V) read back by prompt_cache_extend, as the engine does
 * when a prompt's prefix goes past what memory holds.  The model is the tiny GGUF llama
 * of the fuzz_gguf corpus on the CPU backend (f32 KV, blocks of 4 tokens); the input is
 * the entry of the first block of a fixed 9-token prompt.
 *
 * An entry names the model by a fingerprint of its file's path, size and modification
 * time, which differ per checkout: an input whose fingerprint field (bytes 16..31) is all
 * zero gets the running model's, so committed seeds stay valid entries everywhere.
 * LLMI_FUZZ_WRITE_SEED=FILE makes the harness write one valid entry (zeroed fingerprint)
 * to FILE at start-up: how tests/fuzz/corpus/fuzz_prompt_cache/valid-entry was made. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "common.h"
#include "engine/kvcache.h"
#include "engine/prompt_cache.h"
#include "model/model.h"

enum { BS = 4, N_TOK = 2 * BS + 1, N_BLOCKS = 8 };
static const int32_t tokens[N_TOK] = {1, 5, 7, 3, 9, 2, 4, 6, 8};
static const kv_hash salt = {0x6c6c6d69, 15};

/* Built by LLVMFuzzerInitialize, used read-only afterwards (harness state, not llmi's). */
static llmi_model model;
static llmi_backend *backend;

static void die(const char *what, const llmi_status *st) {
    fprintf(stderr, "fuzz_prompt_cache: %s: %s\n", what, st->msg);
    exit(1);
}

static void entry_name(const char *dir, kv_hash h, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%016llx%016llx.kvb", dir, (unsigned long long)h.hi, (unsigned long long)h.lo);
}

/* Stores both full blocks of the prompt with deterministic K/V and copies block 0's entry. */
static void write_seed(const char *out) {
    char dir[512], path[1024];
    llmi_status st = {0};
    prompt_cache *pc;
    kvcache kv;
    kvcache_table t = {0};
    if (fuzz_scratch(dir, sizeof dir) || prompt_cache_open(dir, 0, backend, salt, &pc, &st) ||
        kvcache_init(&kv, N_BLOCKS, BS, true, salt, &st) || kvcache_reserve(&kv, &t, 2 * BS) ||
        kvcache_commit_full(&kv, &t, tokens, 2 * BS) < 0)
        die("seed", &st);
    size_t nb = backend->kv_block_bytes(backend);
    float *kvb = malloc(nb);
    for (size_t i = 0; i < nb / sizeof(float); i++) kvb[i] = (float)(i % 97) * 0.01f - 0.3f;
    for (int b = 0; b < 2; b++)
        if (backend->kv_write_block(backend, t.blocks[b], kvb, &st)) die("seed", &st);
    prompt_cache_store(pc, &t, 0, tokens);
    entry_name(dir, t.hashes[0], path, sizeof path);
    FILE *f = fopen(path, "rb");
    unsigned char *buf = malloc(1 << 20);
    size_t n = f ? fread(buf, 1, 1 << 20, f) : 0;
    if (f) fclose(f);
    if (n < 32) die("seed", &(llmi_status){1, "no entry written"});
    memset(buf + 16, 0, 16);
    f = fopen(out, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f)) die("seed", &(llmi_status){1, "cannot write the seed"});
    free(buf);
    free(kvb);
    kvcache_table_free(&t);
    kvcache_free(&kv);
    prompt_cache_close(pc);
    fuzz_scratch_remove(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    llmi_status st = {0};
    llmi_load_opts lo = {.no_tokenizer = true};
    if (model_load("tests/fuzz/corpus/fuzz_gguf/tiny-llama.gguf", &lo, &model, &st))
        die("model (run from the repository root)", &st);
    llmi_backend_opts bo = {.n_threads = 1, .kv_dtype = LLMI_KV_F32, .block_size = BS, .max_batch_tokens = 16,
                            .max_seqs = 1};
    if (backend_cpu_create(&model, &bo, &backend, &st) || backend->kv_alloc(backend, N_BLOCKS, &st))
        die("backend", &st);
    const char *seed = getenv("LLMI_FUZZ_WRITE_SEED");
    if (seed) write_seed(seed);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    kv_hash h = kvcache_chain(salt, tokens, BS);
    entry_name(dir, h, path, sizeof path);
    uint8_t *entry = malloc(size ? size : 1);
    if (entry) {
        memcpy(entry, data, size);
        static const uint8_t zero[16];
        if (size >= 32 && !memcmp(entry + 16, zero, 16)) {
            kv_hash fp = prompt_cache_model_fingerprint(&model);
            memcpy(entry + 16, &fp.lo, 8);
            memcpy(entry + 24, &fp.hi, 8);
        }
        FILE *f = fopen(path, "wb");
        bool ok = f && (size == 0 || fwrite(entry, 1, size, f) == size);
        if (f && fclose(f)) ok = false;
        free(entry);
        prompt_cache *pc = NULL;
        kvcache kv;
        llmi_status st = {0};
        if (ok && prompt_cache_open(dir, 0, backend, salt, &pc, &st) == 0) {
            if (kvcache_init(&kv, N_BLOCKS, BS, true, salt, &st) == 0) {
                kvcache_table t = {0};
                int covered = prompt_cache_extend(pc, &kv, &t, tokens, N_TOK);
                if (covered != 0 && covered != BS) abort();
                kvcache_release(&kv, &t);
                kvcache_table_free(&t);
                kvcache_free(&kv);
            }
            prompt_cache_close(pc);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
