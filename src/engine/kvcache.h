/* kvcache.h — owns the host-side bookkeeping of the paged KV cache: a pool of
 * fixed-size blocks, its free list, and per-sequence block tables grown on demand.
 * The storage itself belongs to the backend (kv_alloc); this module only hands out ids. */
#ifndef LLMI_KVCACHE_H
#define LLMI_KVCACHE_H

#include <stdint.h>
#include "core/status.h"

typedef struct kvcache {
    int num_blocks;
    int block_size;       /* tokens per block */
    int32_t *free_ids;    /* (num_blocks) stack of free block ids; the top is free_ids[n_free - 1] */
    int n_free;
    int peak_used;        /* most blocks in use at once since init */
} kvcache;

/* A sequence's block table: block i holds its positions [i*block_size, (i+1)*block_size). */
typedef struct kvcache_table {
    int32_t *blocks;      /* (cap) physical block ids */
    int n_blocks;
    int cap;
} kvcache_table;

int kvcache_init(kvcache *kv, int num_blocks, int block_size, llmi_status *st);
void kvcache_free(kvcache *kv);
int kvcache_used(const kvcache *kv);
/* Blocks a sequence needs in all to hold n_tokens positions. */
int kvcache_blocks_for(const kvcache *kv, int n_tokens);
/* Grows t so it covers n_tokens positions; returns 0, or -1 (t unchanged) when the pool
 * has too few free blocks or memory for the table runs out. */
int kvcache_reserve(kvcache *kv, kvcache_table *t, int n_tokens);
/* Returns every block of t to the pool and empties it (the table memory is kept). */
void kvcache_release(kvcache *kv, kvcache_table *t);
void kvcache_table_free(kvcache_table *t);

#endif
