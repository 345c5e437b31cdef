/* batch.h — owns llmi_batch, the one input of a forward pass, and the check every
 * backend runs on it before touching memory.
 *
 * A batch is a flat list of tokens from many sequences.  Each sequence contributes a
 * contiguous range [query_start[s], query_start[s+1]) of tokens: a prefill chunk or one
 * decode token.  KV for every token is written to its slot (block * block_size + offset)
 * before attention, and each token attends causally over its sequence's first
 * positions[i] + 1 cached positions, found through the sequence's block table.  The
 * scheduler (engine/sched.h) builds batches; backends only read them. */
#ifndef LLMI_BATCH_H
#define LLMI_BATCH_H

#include <stdint.h>
#include "core/status.h"

typedef struct llmi_batch {
    int n_tokens;
    const int32_t *tokens;         /* (n_tokens) */
    const int32_t *positions;      /* (n_tokens) position of each token in its sequence */
    const int32_t *slot_mapping;   /* (n_tokens) KV slot each token's K/V is written to */
    const int32_t *seq_of_token;   /* (n_tokens) index into the per-sequence arrays below */
    int n_seqs;
    const int32_t *query_start;    /* (n_seqs + 1) token range of each sequence */
    const int32_t *block_tables;   /* (n_seqs, max_blocks_per_seq) physical block ids */
    int max_blocks_per_seq;        /* the tables' row stride */
    int n_logits;
    const int32_t *logit_rows;     /* (n_logits) flat token indices whose logits are wanted */
} llmi_batch;

/* What a backend can take: its workspaces, vocabulary and KV pool. */
typedef struct batch_limits {
    const char *who;               /* "cpu", "cuda": starts every message */
    int max_tokens, max_seqs;
    int n_vocab;
    int num_blocks, block_size;
} batch_limits;

/* Rejects anything that would index outside the workspaces, the vocabulary or the KV
 * cache, and query ranges that are out of order or disagree with seq_of_token.
 * seq_maxpos: (max_seqs) scratch. */
int batch_check(const llmi_batch *bt, const batch_limits *lim, int32_t *seq_maxpos, llmi_status *st);

/* The key positions the batch's tokens attend to, summed over its tokens (a token at
 * position p attends to p + 1 keys, at most window of them when window > 0): what an
 * attention reads, for profiling. */
double batch_attended_keys(const llmi_batch *bt, int window);

#endif
