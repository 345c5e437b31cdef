/* sched.h — owns the scheduling of one engine step: the waiting and running queues,
 * admission in arrival order, the token budget, chunked prefill, the fifo and
 * prefill-first policies, KV block reservation, and preemption by recompute when blocks
 * run out (the victim is the most recently admitted sequence not in this step; its
 * blocks go back to the pool and it re-enters the waiting queue in arrival order).
 *
 * A speculating decode asks for 1 + n_draft tokens; when the token budget or the free
 * KV blocks fall short its proposals are cut (to none at worst): it never preempts
 * another sequence to make room for them.
 *
 * sched_plan picks which sequences run and how many of their pending tokens;
 * sched_build_batch turns that plan into the llmi_batch a backend runs.  The scheduler
 * never touches backend memory, sampling or timings. */
#ifndef LLMI_SCHED_H
#define LLMI_SCHED_H

#include <stdint.h>
#include "backend/batch.h"
#include "core/status.h"
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/prompt_cache.h"
#include "engine/sequence.h"

typedef struct sched {
    sched_policy policy;
    int max_batch_tokens;     /* token budget of one step */
    int prefill_chunk;        /* longest prefill piece of one sequence per step; 0 = unlimited */
    int max_seqs;             /* most sequences in one step */
    int max_logit_rows;       /* most logit rows in one step for sampling: one per sequence, 1 + k
                                 when speculating */
    int plp_rows;             /* and at most this many more for prompt logprobs (0 until a
                                 request asks for them: engine.c sizes its logits then) */
    prompt_cache *pc;         /* borrowed: prefixes found on disk past what memory holds, or NULL */
    kvcache *draft_kv;        /* borrowed: the draft model's pool, whose blocks a preempted
                                 sequence gives back too; NULL without a draft model */
    int *waiting;             /* (cap) sequence ids, arrival order, front first */
    int n_waiting;
    int *running;             /* (cap) sequence ids in admission order */
    int n_running;
    int cap;
} sched;

/* One step's work: sequence seq_ids[k] processes its next n_new[k] pending tokens (for a
 * speculating decode: its pending token and n_new[k] - 1 proposed ones, its n_draft cut
 * to that). */
typedef struct sched_plan {
    int n_seqs;
    int *seq_ids;             /* (max_seqs) */
    int *n_new;               /* (max_seqs) */
    int n_tokens;             /* sum of n_new */
    int n_plp_rows;           /* prompt-logprob rows (at most sched.plp_rows) */
    int n_preempted;          /* sequences preempted while planning */
    int *dropped;             /* (cap) running sequences that cannot fit even with the whole
                                 cache to themselves: removed, their blocks freed; the engine
                                 finishes them */
    int n_dropped;
} sched_plan;

int sched_init(sched *s, const llmi_engine_opts *o, llmi_status *st);
void sched_free(sched *s);
/* Queues sequence id at the back of the waiting queue. */
int sched_enqueue(sched *s, int id, llmi_status *st);
/* Takes id out of whichever queue holds it. */
void sched_remove(sched *s, int id);

int sched_plan_alloc(sched_plan *p, const sched *s, llmi_status *st);
void sched_plan_free(sched_plan *p);
/* Plans the next step over seqs (indexed by id), reserving KV blocks in kv. */
int sched_plan_step(sched *s, llmi_seq **seqs, kvcache *kv, sched_plan *p, llmi_status *st);

/* The step's batch arrays, sized once. */
typedef struct sched_batch_bufs {
    int32_t *tokens, *positions, *slots, *seq_of;   /* (max_batch_tokens) */
    int32_t *query_start;     /* (max_seqs + 1) */
    int32_t *block_tables;    /* (max_seqs, max_blocks_per_seq) */
    int32_t *logit_rows;      /* (max_logit_rows) flat token indices */
    int32_t *logit_seq;       /* (max_logit_rows) the plan index (seq_ids[k]) each logit row belongs to */
    int max_blocks_per_seq;   /* the widest table any sequence can need: ceil(max_ctx / block_size) */
} sched_batch_bufs;

/* For batches of up to max_tokens tokens of max_seqs sequences with max_logit_rows logit rows. */
int sched_batch_bufs_alloc(sched_batch_bufs *b, int max_tokens, int max_seqs, int max_logit_rows,
                           int max_blocks_per_seq, llmi_status *st);
void sched_batch_bufs_free(sched_batch_bufs *b);
/* Puts tokens[pos0, pos0 + n) of one sequence into b as batch sequence k from flat index t,
 * their K/V slots and the block-table row (width columns, -1 past the table) taken from
 * table; returns t + n.  The one way a batch gets its rows (sched_build_batch, and the
 * draft model's batches in spec.c). */
int sched_batch_put(sched_batch_bufs *b, int k, int t, const int32_t *tokens, int pos0, int n,
                    const kvcache_table *table, int width, int block_size);
/* The llmi_batch over b's first n_seqs sequences, n_tokens tokens and n_logits rows (closes
 * query_start). */
llmi_batch sched_batch_view(sched_batch_bufs *b, int n_seqs, int n_tokens, int width, int n_logits);
/* Fills out from the plan.  Logits are asked for where a token will be sampled: the last
 * pending token of a sequence that still has tokens to generate, and every token of a
 * speculating decode (each proposal is checked against the row before it); before those,
 * a sequence's prompt positions that owe prompt logprobs (seq_plp_rows), in order.  The block-table stride
 * is the widest table in this step, not the widest possible one, so a backend copies
 * only columns in use. */
void sched_build_batch(const sched_plan *p, llmi_seq *const *seqs, int block_size, sched_batch_bufs *b,
                       llmi_batch *out);

#endif
