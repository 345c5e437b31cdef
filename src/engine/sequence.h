/* sequence.h — owns llmi_seq: one request's state inside the engine.  The scheduler
 * (sched.h) plans with it, the engine samples into it; nothing outside src/engine sees it.
 *
 * A sequence's tokens are its prompt followed by what it generated.  Its pending tokens
 * are those whose K/V is not in the cache yet (n_computed <= i < n_tokens): a prompt
 * waiting for prefill, one generated token waiting to be fed back, or everything after
 * a preemption (recompute).
 *
 * A decoding sequence that speculates also carries n_draft proposed tokens right after
 * its tokens, at tokens[n_tokens, n_tokens + n_draft): not part of it until verified.  A
 * step runs them with the pending token; whatever is rejected is dropped and its K/V
 * rolled back (n_computed and the block table trimmed) before anything reads it.
 *
 * With a draft model (--spec draft) the sequence also has K/V in the draft's own pool:
 * draft_table, valid for its first draft_computed tokens.  The draft catches up from
 * there before it proposes; a rollback only lowers draft_computed (and trims the table),
 * since whatever the draft's K/V holds past it is rewritten before it is read. */
#ifndef LLMI_SEQUENCE_H
#define LLMI_SEQUENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "tok/tokenizer.h"

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_FINISHED } seq_state;

typedef struct llmi_seq {
    int id;
    seq_state state;
    void *user;
    llmi_request_params params;
    int32_t *tokens;          /* (cap) prompt then generated tokens */
    int n_prompt, n_tokens, cap;
    int n_computed;           /* leading tokens whose K/V are in the cache */
    int n_draft;              /* proposed tokens after tokens[n_tokens - 1], set each step for
                                 decoding sequences that speculate; 0 otherwise */
    int max_total;            /* n_tokens may not exceed this (context and -n) */
    kvcache_table table;
    kvcache_table draft_table;  /* blocks of the draft model's pool (spec.h), --spec draft only */
    int draft_computed;       /* leading tokens whose draft K/V is in draft_table */
    sampler_rng rng;
    float mirostat_mu;        /* --mirostat's state: the surprise it now cuts at */
    llmi_request_info info;
    grammar_state *grammar;   /* where the output stands in params.grammar, or NULL */
    char error[sizeof(((llmi_status *)0)->msg)];   /* why it ended early, for info.error; "" none */
    tok_stream stream;        /* only with stop strings: decoded output for matching */
    char *text;               /* (text_cap) decoded output so far */
    size_t text_len, text_cap;
    long order;               /* arrival order, the FIFO key */
    /* In-flight prefix sharing (sched.c): while waiting, the running sequence computing
     * blocks this one can reuse (its id, -1 none) and the prompt length those blocks reach. */
    int twin, twin_until;
    /* Prompt logprobs (params.prompt_logprobs): the rows at positions [0, plp_done) are
     * scored, i.e. prompt tokens 1..plp_done; a preempted sequence recomputes those
     * positions without rows. */
    int plp_done;
    float *plp;               /* (n_prompt) logprob of prompt token i; [0] NaN */
    int32_t *plp_top_ids;     /* (n_prompt, params.prompt_top) */
    float *plp_top_lp;        /* (n_prompt, params.prompt_top) */
} llmi_seq;

/* Tokens of s not yet in the KV cache. */
static inline int seq_pending(const llmi_seq *s) { return s->n_tokens - s->n_computed; }
/* Whether s's only pending token is one it generated, fed back: a decode.  Anything
 * else pending (prompt tokens, even a single one left by chunking, or a recompute after
 * preemption) is prefill work. */
static inline bool seq_in_decode(const llmi_seq *s) { return seq_pending(s) == 1 && s->n_tokens > s->n_prompt; }

/* Whether s still owes prompt logprobs: a prompt position whose logit row is not scored. */
static inline bool seq_owes_prompt_logprobs(const llmi_seq *s) {
    return s->params.prompt_logprobs && s->plp_done < s->n_prompt - 1;
}
/* The first position a prompt-logprob row is owed at, if s owes any (the row at position
 * p scores prompt token p + 1, so the last prompt position owes none). */
static inline int seq_plp_from(const llmi_seq *s) { return s->n_computed > s->plp_done ? s->n_computed : s->plp_done; }
/* Prompt-logprob rows among s's next n pending tokens. */
static inline int seq_plp_rows(const llmi_seq *s, int n) {
    if (!seq_owes_prompt_logprobs(s)) return 0;
    int lo = seq_plp_from(s), hi = s->n_computed + n < s->n_prompt - 1 ? s->n_computed + n : s->n_prompt - 1;
    return hi > lo ? hi - lo : 0;
}

#endif
