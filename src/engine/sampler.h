/* sampler.h — owns turning one row of logits into a token: repetition penalty,
 * temperature, top-k, top-p, min-p, seeded draws (llama.cpp's order and meanings),
 * the speculative accept/reject rule over that same distribution, and the top-N
 * log-probabilities that --logprobs reports. */
#ifndef LLMI_SAMPLER_H
#define LLMI_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct llmi_sampling {
    float temperature;      /* <= 0: greedy (argmax, lowest id on ties) */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off */
    float min_p;            /* <= 0: off */
    float repeat_penalty;   /* 1: off */
    int repeat_last_n;      /* how many recent tokens the penalty looks at */
    uint64_t seed;
} llmi_sampling;

llmi_sampling sampling_defaults(void);

/* xoshiro-style generator, one per request so results do not depend on batching. */
typedef struct sampler_rng { uint64_t s[4]; } sampler_rng;
void sampler_rng_seed(sampler_rng *r, uint64_t seed);
double sampler_rng_uniform(sampler_rng *r);   /* [0, 1) */

/* Samples from logits (n_vocab), which it may modify (penalties).  history holds the
 * sequence's tokens so far for the repetition penalty.  scratch: caller-owned workspace
 * of sampler_scratch_bytes(n_vocab).  Draws one uniform from rng exactly when
 * temperature > 0, and hands it to sampler_sample_uniform. */
int32_t sampler_sample(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history, int n_history,
                       sampler_rng *rng, void *scratch);
size_t sampler_scratch_bytes(int n_vocab);

/* The tokens the repetition penalty looks at: history[*start, *start + return value).
 * 0 when the penalty is off (repeat_penalty 1, repeat_last_n 0, no history). */
int sampler_penalty_window(const llmi_sampling *p, int n_history, int *start);
/* sampler_sample with the draw given instead of an rng: the penalty applies once to each
 * distinct token of window (n_window, already cut by sampler_penalty_window; p's
 * repeat_last_n is not read), and uniform in [0, 1) is read only when temperature > 0.
 * A device sampler that gets the same window and uniform picks the same token. */
int32_t sampler_sample_uniform(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window,
                               int n_window, double uniform, void *scratch);

/* Speculative verification of one proposed token (draft) against logits, the target's row
 * at the draft's position, with history as in sampler_sample.  Greedy: the argmax, accepted
 * when it is the draft.  Sampling (Leviathan et al. 2023 with a one-hot proposal, as prompt
 * lookup makes): accepted with probability p(draft) under the whole chain; on rejection the
 * token comes from p with the draft removed, renormalised.  Either way the token returned
 * is distributed exactly as sampler_sample's.  Draws one uniform to decide and, on
 * rejection, a second to resample (none when greedy). */
int32_t sampler_verify_draft(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history,
                             int n_history, int32_t draft, sampler_rng *rng, void *scratch, bool *accepted);

/* log-softmax value of token id, and the n_top best (id, logprob), from raw logits. */
float sampler_logprob(const float *logits, int n_vocab, int32_t id, int n_top, int32_t *top_ids, float *top_lp);

#endif
