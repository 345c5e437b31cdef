/* batch.c — the batch check every backend runs (see batch.h). */
#include "backend/batch.h"

int batch_check(const llmi_batch *bt, const batch_limits *lim, int32_t *seq_maxpos, llmi_status *st) {
    const char *who = lim->who;
    const int bs = lim->block_size;
    if (lim->num_blocks <= 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: forward before kv_alloc", who);
    if (bt->n_tokens <= 0 || bt->n_tokens > lim->max_tokens)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: batch of %d tokens outside 1..%d (max_batch_tokens)", who,
                         bt->n_tokens, lim->max_tokens);
    if (bt->n_seqs <= 0 || bt->n_seqs > lim->max_seqs)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: batch of %d sequences outside 1..%d (max_seqs)", who,
                         bt->n_seqs, lim->max_seqs);
    if (bt->n_logits < 0 || bt->n_logits > bt->n_tokens)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: %d logit rows for %d tokens", who, bt->n_logits,
                         bt->n_tokens);
    if (bt->max_blocks_per_seq <= 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: max_blocks_per_seq must be positive", who);
    if (bt->query_start[0] != 0 || bt->query_start[bt->n_seqs] != bt->n_tokens)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: query_start does not cover the %d tokens", who,
                         bt->n_tokens);
    for (int s = 0; s < bt->n_seqs; s++) {
        seq_maxpos[s] = -1;
        if (bt->query_start[s] > bt->query_start[s + 1])
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: query_start of sequence %d is out of order", who, s);
        for (int i = bt->query_start[s]; i < bt->query_start[s + 1]; i++)
            if (bt->seq_of_token[i] != s)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: token %d is in the range of sequence %d but names %d",
                                 who, i, s, bt->seq_of_token[i]);
    }
    long max_pos = (long)bt->max_blocks_per_seq * bs;
    long n_slots = (long)lim->num_blocks * bs;
    for (int i = 0; i < bt->n_tokens; i++) {
        if (bt->tokens[i] < 0 || bt->tokens[i] >= lim->n_vocab)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: token id %d outside vocab of %d", who, bt->tokens[i],
                             lim->n_vocab);
        if (bt->positions[i] < 0 || bt->positions[i] >= max_pos)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: position %d outside its block table (%ld)", who,
                             bt->positions[i], max_pos);
        if (bt->slot_mapping[i] < 0 || bt->slot_mapping[i] >= n_slots)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: KV slot %d outside cache of %ld", who,
                             bt->slot_mapping[i], n_slots);
        int s = bt->seq_of_token[i];
        if (bt->positions[i] > seq_maxpos[s]) seq_maxpos[s] = bt->positions[i];
    }
    for (int s = 0; s < bt->n_seqs; s++) {
        const int32_t *tab = bt->block_tables + (size_t)s * bt->max_blocks_per_seq;
        for (int j = 0; seq_maxpos[s] >= 0 && j <= seq_maxpos[s] / bs; j++)
            if (tab[j] < 0 || tab[j] >= lim->num_blocks)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: block table of sequence %d holds block %d of %d",
                                 who, s, tab[j], lim->num_blocks);
    }
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= bt->n_tokens)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: logit row %d outside batch of %d", who,
                             bt->logit_rows[i], bt->n_tokens);
    return LLMI_OK;
}

double batch_attended_keys(const llmi_batch *bt, int window) {
    double sum = 0;
    for (int i = 0; i < bt->n_tokens; i++) {
        double keys = (double)bt->positions[i] + 1;
        sum += window > 0 && keys > window ? window : keys;
    }
    return sum;
}
