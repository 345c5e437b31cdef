/* kvcache.c — block pool and block tables (see kvcache.h). */
#include "engine/kvcache.h"

#include <stdlib.h>

int kvcache_init(kvcache *kv, int num_blocks, int block_size, llmi_status *st) {
    kv->free_ids = NULL;
    kv->n_free = 0;
    kv->peak_used = 0;
    if (num_blocks <= 0 || block_size <= 0)
        return llmi_fail(st, LLMI_E_USAGE, "KV cache: need at least one block of at least one token (got %d x %d)",
                         num_blocks, block_size);
    kv->free_ids = malloc((size_t)num_blocks * sizeof *kv->free_ids);
    if (!kv->free_ids) return llmi_fail(st, LLMI_E_RUNTIME, "KV cache: out of memory for %d block ids", num_blocks);
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    /* Hand out low ids first, so small workloads touch a compact region of the pool. */
    for (int i = 0; i < num_blocks; i++) kv->free_ids[i] = num_blocks - 1 - i;
    kv->n_free = num_blocks;
    return LLMI_OK;
}

void kvcache_free(kvcache *kv) {
    free(kv->free_ids);
    kv->free_ids = NULL;
    kv->n_free = kv->num_blocks = 0;
}

int kvcache_used(const kvcache *kv) { return kv->num_blocks - kv->n_free; }

int kvcache_blocks_for(const kvcache *kv, int n_tokens) {
    return n_tokens <= 0 ? 0 : (n_tokens + kv->block_size - 1) / kv->block_size;
}

int kvcache_reserve(kvcache *kv, kvcache_table *t, int n_tokens) {
    int need = kvcache_blocks_for(kv, n_tokens);
    if (need <= t->n_blocks) return 0;
    if (need - t->n_blocks > kv->n_free) return -1;
    if (need > t->cap) {
        int cap = t->cap ? t->cap : 8;
        while (cap < need) cap *= 2;
        int32_t *nb = realloc(t->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return -1;
        t->blocks = nb;
        t->cap = cap;
    }
    while (t->n_blocks < need) t->blocks[t->n_blocks++] = kv->free_ids[--kv->n_free];
    int used = kvcache_used(kv);
    if (used > kv->peak_used) kv->peak_used = used;
    return 0;
}

void kvcache_release(kvcache *kv, kvcache_table *t) {
    /* Push in reverse so the sequence's first block is the next one handed out. */
    for (int i = t->n_blocks - 1; i >= 0; i--) kv->free_ids[kv->n_free++] = t->blocks[i];
    t->n_blocks = 0;
}

void kvcache_table_free(kvcache_table *t) {
    free(t->blocks);
    t->blocks = NULL;
    t->n_blocks = t->cap = 0;
}
