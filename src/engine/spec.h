/* spec.h — owns proposing tokens for speculative decoding: prompt lookup (an n-gram
 * match in the sequence's own prompt and output, no second model).  Verifying the
 * proposals is the sampler's (sampler_verify_draft); carrying them through a step, the
 * engine's and the scheduler's. */
#ifndef LLMI_SPEC_H
#define LLMI_SPEC_H

#include <stdint.h>

/* Prompt lookup (vLLM's n-gram proposer): the longest n in [ngram_max down to ngram_min]
 * whose last n tokens also occur earlier in tokens (n_tokens), at their earliest such
 * occurrence; proposes the up to k tokens that followed it, clipped to what exists.
 * Writes them to out (k) and returns how many (0: no match). */
int spec_ngram_propose(const int32_t *tokens, int n_tokens, int ngram_min, int ngram_max, int k, int32_t *out);

#endif
