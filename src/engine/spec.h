/* spec.h — owns proposing tokens for speculative decoding: prompt lookup (an n-gram
 * match in the sequence's own prompt and output, no second model) and a draft model (a
 * smaller model of the same vocabulary, with its own KV pool and block tables, decoding
 * greedily for every speculating sequence at once through its backend's forward).
 * Verifying the proposals is the sampler's (sampler_verify_draft); carrying them through
 * a step, the engine's and the scheduler's. */
#ifndef LLMI_SPEC_H
#define LLMI_SPEC_H

#include <stdint.h>
#include "backend/backend.h"
#include "core/status.h"
#include "engine/kvcache.h"
#include "engine/sched.h"
#include "engine/sequence.h"
#include "model/model.h"

/* Prompt lookup (vLLM's n-gram proposer): the longest n in [ngram_max down to ngram_min]
 * whose last n tokens also occur earlier in tokens (n_tokens), at their earliest such
 * occurrence; proposes the up to k tokens that followed it, clipped to what exists.
 * Writes them to out (k) and returns how many (0: no match). */
int spec_ngram_propose(const int32_t *tokens, int n_tokens, int ngram_min, int ngram_max, int k, int32_t *out);

/* The draft model proposes its greedy continuation (argmax of its logits, lowest id on
 * ties, no penalties).  Its proposal distribution q is therefore one-hot, so the accept
 * rule prompt lookup uses (accept with p(x), else resample from p without x) stays exact
 * for sampled requests too; greedy requests keep a proposal exactly when the target's
 * argmax is the same token. */
typedef struct spec_draft {
    const llmi_model *model;      /* borrowed */
    llmi_backend *backend;        /* borrowed; holds the draft's K/V storage */
    kvcache kv;                   /* the draft's pool: plain, no prefix caching */
    int max_tokens, max_seqs;     /* what one draft forward takes (the engine's step limits) */
    sched_batch_bufs bufs;        /* (max_tokens, max_seqs) one draft forward's batch */
    float *logits;                /* (max_seqs, n_vocab) */
    void *scratch;                /* sampler_scratch_bytes(n_vocab, 0): greedy drafts, no DRY */
    int *sel, *take;              /* (max_seqs) the sequences of one draft forward, tokens each */
    bool *stopped;                /* (cap) candidates whose pool ran out this step */
    int cap;
} spec_draft;

/* Whether draft can propose for target: the same vocabulary (size, and where both have
 * tokenizers every token's text and the BOS, EOS, end-of-generation and special ids) and
 * a context at least max_ctx long.  Errors name the draft's file. */
int spec_draft_check(const llmi_model *target, const llmi_model *draft, int max_ctx, llmi_status *st);
/* Sets up the draft's pool of num_blocks blocks of block_size tokens (its backend
 * allocates the storage) and its batch buffers. */
int spec_draft_init(spec_draft *d, const llmi_model *m, llmi_backend *b, int num_blocks, int block_size,
                    int max_tokens, int max_seqs, int max_blocks_per_seq, llmi_status *st);
void spec_draft_free(spec_draft *d);
/* Proposes up to k[i] >= 1 tokens for each seqs[i] (all decoding), written at
 * tokens[n_tokens, n_tokens + n_draft): first the draft catches up on the tokens it has not
 * seen (prompt chunks as the step limits allow), then it decodes one token per forward
 * for all of them together.  A sequence whose draft K/V does not fit in the pool proposes
 * what it has (its blocks are given back when it has nothing yet). */
int spec_draft_propose(spec_draft *d, llmi_seq *const *seqs, const int *k, int n, llmi_status *st);
/* Rolls s's draft K/V back to what its tokens still agree with: every token but the last
 * (pending) one is either old or an accepted proposal; later blocks go back to the pool. */
void spec_draft_trim(spec_draft *d, llmi_seq *s);
/* Gives all of s's draft blocks back (finish, release, preemption). */
void spec_draft_release(spec_draft *d, llmi_seq *s);

#endif
