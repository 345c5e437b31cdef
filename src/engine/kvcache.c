/* kvcache.c — block pool, block tables and prefix caching (see kvcache.h). */
#include "engine/kvcache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int kvcache_init(kvcache *kv, int num_blocks, int block_size, bool prefix_cache, kv_hash salt, llmi_status *st) {
    memset(kv, 0, sizeof *kv);
    kv->lru_head = kv->lru_tail = -1;
    if (num_blocks <= 0 || block_size <= 0)
        return llmi_fail(st, LLMI_E_USAGE, "KV cache: need at least one block of at least one token (got %d x %d)",
                         num_blocks, block_size);
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->prefix_cache = prefix_cache;
    kv->salt = salt;
    kv->free_ids = malloc((size_t)num_blocks * sizeof *kv->free_ids);
    kv->ref = calloc((size_t)num_blocks, sizeof *kv->ref);
    if (!kv->free_ids || !kv->ref) goto oom;
    if (prefix_cache) {
        kv->n_slots = 16;
        while (kv->n_slots < 2 * num_blocks) kv->n_slots *= 2;
        kv->cached = calloc((size_t)num_blocks, sizeof *kv->cached);
        kv->hash = calloc((size_t)num_blocks, sizeof *kv->hash);
        kv->tokens = malloc((size_t)num_blocks * block_size * sizeof *kv->tokens);
        kv->lru_prev = malloc((size_t)num_blocks * sizeof *kv->lru_prev);
        kv->lru_next = malloc((size_t)num_blocks * sizeof *kv->lru_next);
        kv->slots = malloc((size_t)kv->n_slots * sizeof *kv->slots);
        if (!kv->cached || !kv->hash || !kv->tokens || !kv->lru_prev || !kv->lru_next || !kv->slots) goto oom;
        for (int i = 0; i < kv->n_slots; i++) kv->slots[i] = -1;
    }
    /* Hand out low ids first, so small workloads touch a compact region of the pool. */
    for (int i = 0; i < num_blocks; i++) kv->free_ids[i] = num_blocks - 1 - i;
    kv->n_free = num_blocks;
    return LLMI_OK;
oom:
    kvcache_free(kv);
    return llmi_fail(st, LLMI_E_RUNTIME, "KV cache: out of memory for the bookkeeping of %d blocks", num_blocks);
}

void kvcache_free(kvcache *kv) {
    free(kv->free_ids);
    free(kv->ref);
    free(kv->cached);
    free(kv->hash);
    free(kv->tokens);
    free(kv->lru_prev);
    free(kv->lru_next);
    free(kv->slots);
    memset(kv, 0, sizeof *kv);
    kv->lru_head = kv->lru_tail = -1;
}

int kvcache_used(const kvcache *kv) { return kv->num_blocks - kv->n_free - kv->n_evictable; }
int kvcache_available(const kvcache *kv) { return kv->n_free + kv->n_evictable; }

int kvcache_blocks_for(const kvcache *kv, int n_tokens) {
    return n_tokens <= 0 ? 0 : (n_tokens + kv->block_size - 1) / kv->block_size;
}

/* ---- the hash table of cached blocks (linear probing, backward-shift deletion) ---- */

static int slot_of(const kvcache *kv, kv_hash h) { return (int)(h.lo & (uint64_t)(kv->n_slots - 1)); }
static bool hash_eq(kv_hash a, kv_hash b) { return a.lo == b.lo && a.hi == b.hi; }

static int table_find(const kvcache *kv, kv_hash h) {
    for (int i = slot_of(kv, h);; i = (i + 1) & (kv->n_slots - 1)) {
        int b = kv->slots[i];
        if (b < 0) return -1;
        if (hash_eq(kv->hash[b], h)) return b;
    }
}

static void table_insert(kvcache *kv, int block) {
    int i = slot_of(kv, kv->hash[block]);
    while (kv->slots[i] >= 0) i = (i + 1) & (kv->n_slots - 1);
    kv->slots[i] = block;
}

static void table_remove(kvcache *kv, int block) {
    int mask = kv->n_slots - 1, i = slot_of(kv, kv->hash[block]);
    while (kv->slots[i] != block) i = (i + 1) & mask;
    /* Shift later members of the probe run back so lookups never stop early. */
    for (int j = (i + 1) & mask; kv->slots[j] >= 0; j = (j + 1) & mask) {
        int home = slot_of(kv, kv->hash[kv->slots[j]]);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            kv->slots[i] = kv->slots[j];
            i = j;
        }
    }
    kv->slots[i] = -1;
}

/* ---- the LRU list of cached blocks nobody holds --------------------------------- */

static void lru_push_tail(kvcache *kv, int b) {
    kv->lru_prev[b] = kv->lru_tail;
    kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b; else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_evictable++;
}

static void lru_unlink(kvcache *kv, int b) {
    int p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n; else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p; else kv->lru_tail = p;
    kv->n_evictable--;
}

/* ---- blocks and tables ------------------------------------------------------------ */

static int table_grow(kvcache_table *t, int need) {
    if (need <= t->cap) return 0;
    int cap = t->cap ? t->cap : 8;
    while (cap < need) cap *= 2;
    int32_t *nb = realloc(t->blocks, (size_t)cap * sizeof *nb);
    if (!nb) return -1;
    t->blocks = nb;
    kv_hash *nh = realloc(t->hashes, (size_t)cap * sizeof *nh);
    if (!nh) return -1;
    t->hashes = nh;
    t->cap = cap;
    return 0;
}

static void note_peak(kvcache *kv) {
    int used = kvcache_used(kv);
    if (used > kv->peak_used) kv->peak_used = used;
}

/* A block for new K/V: a never-cached free one, else the least recently used cached one. */
static int take_block(kvcache *kv) {
    if (kv->n_free > 0) return kv->free_ids[--kv->n_free];
    int b = kv->lru_head;
    lru_unlink(kv, b);
    table_remove(kv, b);
    kv->cached[b] = false;
    kv->n_evicted++;
    return b;
}

int kvcache_reserve(kvcache *kv, kvcache_table *t, int n_tokens) {
    int need = kvcache_blocks_for(kv, n_tokens);
    if (need <= t->n_blocks) return 0;
    if (need - t->n_blocks > kvcache_available(kv)) return -1;
    if (table_grow(t, need)) return -1;
    while (t->n_blocks < need) {
        int b = take_block(kv);
        kv->ref[b] = 1;
        t->blocks[t->n_blocks++] = b;
    }
    note_peak(kv);
    return 0;
}

void kvcache_shrink(kvcache *kv, kvcache_table *t, int n_blocks) {
    /* Last block first: the tail of a sequence is the least likely to be shared, so it
     * is the first evicted; a free block pushed last is the next handed out. */
    for (int i = t->n_blocks - 1; i >= n_blocks; i--) {
        int b = t->blocks[i];
        if (--kv->ref[b] > 0) continue;
        if (kv->prefix_cache && kv->cached[b]) lru_push_tail(kv, b);
        else kv->free_ids[kv->n_free++] = b;
    }
    if (t->n_blocks > n_blocks) t->n_blocks = n_blocks;
    if (t->n_hashed > n_blocks) t->n_hashed = n_blocks;
}

void kvcache_release(kvcache *kv, kvcache_table *t) { kvcache_shrink(kv, t, 0); }

void kvcache_table_free(kvcache_table *t) {
    free(t->blocks);
    free(t->hashes);
    memset(t, 0, sizeof *t);
}

kv_hash kvcache_chain(kv_hash parent, const int32_t *tokens, int block_size) {
    /* (parent, tokens) hashed as one message; block_size <= 1024 (engine_create checks). */
    unsigned char msg[sizeof(kv_hash) + 1024 * sizeof(int32_t)];
    size_t n = (size_t)block_size * sizeof *tokens;
    memcpy(msg, &parent, sizeof parent);
    memcpy(msg + sizeof parent, tokens, n);
    XXH128_hash_t h = XXH3_128bits(msg, sizeof parent + n);
    return (kv_hash){h.low64, h.high64};
}

int kvcache_lookup(const kvcache *kv, kv_hash h, const int32_t *tokens) {
    if (!kv->prefix_cache) return -1;
    int b = table_find(kv, h);
    if (b < 0) return -1;
    const int bs = kv->block_size;
    return memcmp(kv->tokens + (size_t)b * bs, tokens, (size_t)bs * sizeof *tokens) == 0 ? b : -1;
}

int kvcache_share(kvcache *kv, kvcache_table *t, int block) {
    if (table_grow(t, t->n_blocks + 1)) return -1;
    if (kv->ref[block]++ == 0) lru_unlink(kv, block);
    t->hashes[t->n_blocks] = kv->hash[block];
    t->blocks[t->n_blocks++] = block;
    t->n_hashed = t->n_blocks;
    note_peak(kv);
    return 0;
}

int kvcache_match_prefix(kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_tokens) {
    if (!kv->prefix_cache || t->n_blocks > 0) return 0;
    const int bs = kv->block_size, max_blocks = (n_tokens - 1) / bs;
    kv_hash h = kv->salt;
    for (int i = 0; i < max_blocks; i++) {
        h = kvcache_chain(h, tokens + (size_t)i * bs, bs);
        int b = kvcache_lookup(kv, h, tokens + (size_t)i * bs);
        if (b < 0 || kvcache_share(kv, t, b)) break;
    }
    return t->n_blocks * bs;
}

int kvcache_commit_full(kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_full_tokens) {
    if (!kv->prefix_cache) return 0;
    const int bs = kv->block_size;
    int full = n_full_tokens / bs;
    if (full > t->n_blocks) full = t->n_blocks;
    int added = 0;
    for (int i = t->n_hashed; i < full; i++) {
        kv_hash parent = i == 0 ? kv->salt : t->hashes[i - 1];
        kv_hash h = kvcache_chain(parent, tokens + (size_t)i * bs, bs);
        t->hashes[i] = h;
        int b = t->blocks[i];
        /* A block computed twice (two sequences prefilling the same prefix at once) is
         * cached once; the copy stays private and is freed with its sequence. */
        if (kv->cached[b] || table_find(kv, h) >= 0) continue;
        kv->cached[b] = true;
        kv->hash[b] = h;
        memcpy(kv->tokens + (size_t)b * bs, tokens + (size_t)i * bs, (size_t)bs * sizeof *tokens);
        table_insert(kv, b);
        added++;
    }
    if (full > t->n_hashed) t->n_hashed = full;
    return added;
}
