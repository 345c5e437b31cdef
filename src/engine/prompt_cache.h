/* prompt_cache.h — owns the prefix cache across runs (--prompt-cache DIR): the K/V of
 * full blocks written to DIR, zstd-compressed, one file per block named by the block's
 * chained hash (kvcache.h), whose chain is rooted in the model's fingerprint, the KV
 * dtype and the block size; and read back when a later request's prefix goes past what
 * memory holds, so a repeated preamble costs a disk read instead of a prefill.
 *
 * A cache can make llmi faster, never wrong and never crash: every entry is checked
 * (magic, model fingerprint, KV dtype, block size, shapes, its own hash and tokens, size,
 * checksum of the decompressed K/V) before use; one that fails is removed with one
 * warning line on stderr and its tokens are recomputed.  Entries are written to a temporary
 * file and renamed into place, so processes sharing DIR never see a torn entry.  The
 * directory is kept under --prompt-cache-max bytes by deleting the least recently used
 * entries (modification time, refreshed on every hit). */
#ifndef LLMI_PROMPT_CACHE_H
#define LLMI_PROMPT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "core/status.h"
#include "engine/kvcache.h"

typedef struct prompt_cache prompt_cache;

/* The fingerprint of what the model computes: its file identity (path, size, modification
 * time of every weight file) and configuration, or the --dummy spec. */
kv_hash prompt_cache_model_fingerprint(const llmi_model *m);

/* Opens (creating it if needed) dir for backend b, whose engine roots its hash chains in
 * salt.  max_bytes 0: no cap. */
int prompt_cache_open(const char *dir, size_t max_bytes, llmi_backend *b, kv_hash salt, prompt_cache **out,
                      llmi_status *st);
void prompt_cache_close(prompt_cache *pc);

/* Extends t (which covers a prefix of tokens already, from memory) with blocks read from
 * disk, registering each in kv; stops at the first block missing, invalid or that does not
 * fit the pool, and always leaves the last token uncovered.  Returns tokens covered now. */
int prompt_cache_extend(prompt_cache *pc, kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_tokens);
/* Writes t's full blocks [from, t->n_hashed) that DIR does not hold yet. */
void prompt_cache_store(prompt_cache *pc, const kvcache_table *t, int from, const int32_t *tokens);

typedef struct prompt_cache_stats {
    long hits, writes, rejected, evicted;   /* blocks */
} prompt_cache_stats;
prompt_cache_stats prompt_cache_get_stats(const prompt_cache *pc);

#endif
