/* dry.h — owns DRY ("Don't Repeat Yourself", llama.cpp's and KoboldCpp's repetition
 * sampler): the restart-sequence table a list of sequence breakers makes over one
 * tokenizer's vocabulary, and the penalty on every token that would extend a repeat of
 * the recent history: multiplier x base^(length - allowed_length) for a repeat of at least
 * allowed_length tokens, a repeat never reaching back past a breaker.  Checked against
 * llama.cpp's own sampler in tests/test_sampler_ref.c (testdata/sampler/dry.jsonl). */
#ifndef LLMI_DRY_H
#define LLMI_DRY_H

#include <stdint.h>
#include "core/status.h"

struct tokenizer;

/* For each head token, the tails (token sequences, possibly empty) that complete a breaker
 * after it: a token whose text holds a breaker is a head with an empty tail; a token whose
 * text ends with the start of a breaker is a head whose tail is the rest of the breaker,
 * tokenized (at most DRY_MAX_TAIL tokens), as llama.cpp's get_overlapping_token_sequences. */
typedef struct dry_breakers {
    int32_t n_vocab;
    int32_t *first;          /* (n_vocab + 1) head h's tails are [first[h], first[h + 1]) */
    int32_t *tail_at;        /* (n_tails + 1) tail j is tail_ids[tail_at[j], tail_at[j + 1]) */
    int32_t *tail_ids;
    int32_t n_tails;
} dry_breakers;

#define DRY_MAX_BREAKER_BYTES 40   /* llama.cpp cuts longer breakers */
#define DRY_MAX_TAIL 20
#define DRY_MAX_BREAKERS 64

/* Builds the table of breakers[0, n) (UTF-8 strings; empty ones skipped) over t's
 * vocabulary. */
int dry_breakers_build(const struct tokenizer *t, const char *const *breakers, int n, dry_breakers **out,
                       llmi_status *st);
void dry_breakers_free(dry_breakers *b);

typedef struct dry_params {
    float multiplier;        /* 0: off */
    float base;              /* < 1: off */
    int allowed_length;      /* repeats of this many tokens or fewer go free */
} dry_params;

/* Subtracts DRY's penalties from logits (n_vocab) for the history window win[0, n_win)
 * (already cut to the last penalty_last_n tokens).  scratch: (2 * n_win + n_vocab) ints. */
void dry_apply(float *logits, int n_vocab, const dry_params *p, const dry_breakers *b, const int32_t *win, int n_win,
               int *scratch);
/* Ints of scratch dry_apply needs. */
size_t dry_scratch_ints(int n_vocab, int n_win);

#endif
