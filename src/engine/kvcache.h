/* kvcache.h — owns the host-side bookkeeping of the paged KV cache: a pool of
 * fixed-size blocks, per-sequence block tables grown on demand, and automatic prefix
 * caching over the pool.  The storage itself belongs to the backend (kv_alloc); this
 * module only hands out ids.
 *
 * Prefix caching (vLLM's automatic prefix caching, at block granularity): a full block
 * is named by a chained 128-bit hash of (its parent block's hash, its tokens), rooted in
 * a salt that names everything else its K/V depends on (model, KV dtype, block size).
 * Blocks are reference-counted, so many sequences share one physical block.  A block
 * nobody references but whose hash is registered stays cached, in an LRU list, until the
 * pool needs it: allocation takes never-cached free blocks first, then evicts the least
 * recently released cached block.  So caching never takes a block a request could have
 * used.  A match also compares the block's tokens; the hash chain covers the prefix. */
#ifndef LLMI_KVCACHE_H
#define LLMI_KVCACHE_H

#include <stdbool.h>
#include <stdint.h>
#include "core/status.h"

typedef struct kv_hash { uint64_t lo, hi; } kv_hash;

typedef struct kvcache {
    int num_blocks;
    int block_size;       /* tokens per block */
    int32_t *free_ids;    /* (num_blocks) stack of free, uncached block ids; the top is free_ids[n_free - 1] */
    int n_free;
    int peak_used;        /* most blocks referenced at once since init */
    /* prefix caching */
    bool prefix_cache;
    kv_hash salt;         /* root of every hash chain */
    int32_t *ref;         /* (num_blocks) sequences holding each block */
    bool *cached;         /* (num_blocks) the block's hash is registered */
    kv_hash *hash;        /* (num_blocks) chained hash of a cached block */
    int32_t *tokens;      /* (num_blocks, block_size) token ids of a cached block */
    int32_t *lru_prev, *lru_next;  /* (num_blocks) cached blocks with ref 0: head is evicted first */
    int lru_head, lru_tail, n_evictable;
    int32_t *slots;       /* (n_slots) open-addressing table of cached block ids, -1 = empty */
    int n_slots;          /* a power of two, at least 2 * num_blocks */
    long n_evicted;       /* cached blocks given to new work since init */
} kvcache;

/* A sequence's block table: block i holds its positions [i*block_size, (i+1)*block_size). */
typedef struct kvcache_table {
    int32_t *blocks;      /* (cap) physical block ids */
    kv_hash *hashes;      /* (cap) chain hash of each full block, [0, n_hashed) valid */
    int n_blocks;
    int n_hashed;         /* leading full blocks whose hash is computed (and offered to the cache) */
    int cap;
} kvcache_table;

/* prefix_cache false: a plain pool (no hashing, blocks freed at once). */
int kvcache_init(kvcache *kv, int num_blocks, int block_size, bool prefix_cache, kv_hash salt, llmi_status *st);
void kvcache_free(kvcache *kv);
/* Blocks referenced by sequences (cached blocks nobody holds are not counted). */
int kvcache_used(const kvcache *kv);
/* Blocks a new reservation could get now: free plus evictable. */
int kvcache_available(const kvcache *kv);
/* Blocks a sequence needs in all to hold n_tokens positions. */
int kvcache_blocks_for(const kvcache *kv, int n_tokens);
/* Grows t so it covers n_tokens positions; returns 0, or -1 (t unchanged) when the pool
 * has too few available blocks or memory for the table runs out. */
int kvcache_reserve(kvcache *kv, kvcache_table *t, int n_tokens);
/* Drops t's reference to every block and empties it (the table memory is kept).
 * Cached blocks go to the LRU list (t's last block first, so it is evicted first);
 * others to the free list. */
void kvcache_release(kvcache *kv, kvcache_table *t);
void kvcache_table_free(kvcache_table *t);
/* Drops t's references to its blocks from n_blocks on (its last ones), as release does. */
void kvcache_shrink(kvcache *kv, kvcache_table *t, int n_blocks);

/* The hash of a full block of tokens (block_size) after parent (kv->salt for block 0). */
kv_hash kvcache_chain(kv_hash parent, const int32_t *tokens, int block_size);
/* Extends an empty table t over the longest cached prefix of tokens (n_tokens), taking a
 * reference to each matched block, leaving at least one token uncovered (its logits are
 * needed).  Returns the number of tokens covered (a multiple of block_size). */
int kvcache_match_prefix(kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_tokens);
/* Hashes t's blocks that are now full (the first n_full_tokens positions have K/V) and
 * registers each one not cached yet; tokens are the sequence's tokens. */
int kvcache_commit_full(kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_full_tokens);
/* The cached block with hash h and these tokens, or -1. */
int kvcache_lookup(const kvcache *kv, kv_hash h, const int32_t *tokens);
/* Appends cached block `block` (found by kvcache_lookup) to t, taking a reference. */
int kvcache_share(kvcache *kv, kvcache_table *t, int block);

#endif
