/* sampler.h — owns turning one row of logits into a token: logit bias, the repetition,
 * frequency and presence penalties, DRY (engine/dry.h), top-n-sigma, top-k, typical,
 * top-p, min-p, XTC,
 * temperature and seeded draws (llama.cpp's default chain: its order and meanings, checked
 * against its samplers in tests/test_sampler_ref.c), the speculative accept/reject rule
 * over that same distribution, and the top-N log-probabilities that --logprobs reports. */
#ifndef LLMI_SAMPLER_H
#define LLMI_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct llmi_logit_bias { int32_t id; float bias; } llmi_logit_bias;
#define LLMI_MAX_LOGIT_BIAS 4096   /* entries per request */

typedef struct llmi_sampling {
    float temperature;      /* <= 0: greedy (argmax, lowest id on ties) */
    int top_k;              /* <= 0: off */
    float top_p;            /* >= 1: off */
    float min_p;            /* <= 0: off */
    float typical_p;        /* 0 or >= 1: off; locally typical sampling (Meister et al. 2022) */
    float top_n_sigma;      /* <= 0: off; keeps logits within n standard deviations of the best */
    float xtc_probability;  /* <= 0: off; how often XTC cuts the top choices */
    float xtc_threshold;    /* > 0.5: off; the probability that makes a token a top choice */
    float repeat_penalty;   /* 1: off; divides a positive logit, multiplies a negative one */
    float frequency_penalty;/* 0: off; subtracted once per occurrence in the window */
    float presence_penalty; /* 0: off; subtracted once for a token that occurs in the window */
    int repeat_last_n;      /* how many recent tokens the three penalties look at (-1: all) */
    const llmi_logit_bias *logit_bias;   /* (n_logit_bias) added to the logits first; an id may
                                            repeat (the biases add up); borrowed until the
                                            request finishes */
    int n_logit_bias;
    /* DRY (engine/dry.h): off when dry_multiplier is 0 */
    float dry_multiplier;
    float dry_base;               /* < 1: off */
    int dry_allowed_length;
    int dry_penalty_last_n;       /* the window it looks back over (0: off; -1: all) */
    const char *const *dry_breakers;   /* (n_dry_breakers) borrowed; n_dry_breakers < 0: llama.cpp's
                                          default "\n", ":", "\"", "*" */
    int n_dry_breakers;
    const struct dry_breakers *dry_table;   /* those breakers over the model's vocabulary: the
                                               engine's, set when the request is added */
    /* Mirostat (Basu et al. 2021), llama.cpp's: 0 off, 1 or 2 (Mirostat 2.0).  As in
     * llama.cpp it replaces the chain after the logit bias: temperature, then mirostat's
     * own truncation and draw (penalties, DRY and the other stages do not run). */
    int mirostat;
    float mirostat_tau;           /* target surprise (--mirostat-ent, default 5) */
    float mirostat_eta;           /* learning rate (--mirostat-lr, default 0.1) */
    uint64_t seed;
} llmi_sampling;

llmi_sampling sampling_defaults(void);

/* xoshiro-style generator, one per request so results do not depend on batching. */
typedef struct sampler_rng { uint64_t s[4]; } sampler_rng;
void sampler_rng_seed(sampler_rng *r, uint64_t seed);
double sampler_rng_uniform(sampler_rng *r);   /* [0, 1) */

/* Samples from logits (n_vocab), which it may modify (penalties).  history holds the
 * sequence's tokens so far for the penalties and DRY.  scratch: caller-owned workspace of
 * sampler_scratch_bytes(n_vocab, the longest history passed with DRY on).  Draws one uniform from rng for XTC when it is on, then
 * one for the draw exactly when temperature > 0 (the one sampler_sample_uniform takes). */
int32_t sampler_sample(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history, int n_history,
                       sampler_rng *rng, void *scratch);
size_t sampler_scratch_bytes(int n_vocab, int max_history);

/* The tokens the penalties look at: history[*start, *start + return value).  0 when they
 * are off (repeat_penalty 1 and no frequency or presence penalty, repeat_last_n 0, no
 * history). */
int sampler_penalty_window(const llmi_sampling *p, int n_history, int *start);
/* Whether p uses a stage that only the host sampler has (logit bias, DRY, typical,
 * top-n-sigma, XTC): a device sampler must hand such rows to sampler_sample. */
bool sampler_dry_on(const llmi_sampling *p);
bool sampler_needs_host(const llmi_sampling *p);
/* sampler_sample with the draw given instead of an rng, for p without host-only stages
 * (DRY, which reads the whole history, included):
 * the penalties apply once to each distinct token of window (n_window, already cut by
 * sampler_penalty_window; p's repeat_last_n is not read), and uniform in [0, 1) is read
 * only when temperature > 0.  A device sampler that gets the same window and uniform picks
 * the same token. */
int32_t sampler_sample_uniform(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window,
                               int n_window, double uniform, void *scratch);

/* The distribution the draw chooses from: the whole chain but the draw applied to logits
 * (modified), the kept ids in ids[] and their probabilities at p's temperature in probs[]
 * (both n_vocab long), most likely first; returns how many.  Greedy (temperature <= 0):
 * the one token it picks, probability 1.  xtc_uniform is XTC's draw (read when XTC is on).
 * DRY does not run here (it reads the whole history; dry_apply is its own check). */
int sampler_distribution(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *window, int n_window,
                         double xtc_uniform, void *scratch, int32_t *ids, double *probs);

/* Speculative verification of one proposed token (draft) against logits, the target's row
 * at the draft's position, with history as in sampler_sample.  Greedy: the argmax, accepted
 * when it is the draft.  Sampling (Leviathan et al. 2023 with a one-hot proposal, as prompt
 * lookup makes): accepted with probability p(draft) under the whole chain; on rejection the
 * token comes from p with the draft removed, renormalised.  Either way the token returned
 * is distributed exactly as sampler_sample's.  Draws one uniform to decide and, on
 * rejection, a second to resample (none when greedy). */
int32_t sampler_verify_draft(float *logits, int n_vocab, const llmi_sampling *p, const int32_t *history,
                             int n_history, int32_t draft, sampler_rng *rng, void *scratch, bool *accepted);

/* Mirostat.  The state is mu (start: 2 x tau), one per request, which every draw updates
 * by the surprise of the token drawn.  sampler_mirostat_distribution gives what the draw
 * chooses among for the state mu: logits (modified: bias, temperature) reduced to ids[] and
 * their probabilities (float, llama.cpp's arithmetic), most likely first, n_vocab long
 * each; returns how many.  sampler_mirostat_update moves mu after token with probability
 * p_drawn was drawn.  sampler_sample_mirostat does both, drawing one uniform from rng. */
float sampler_mirostat_mu0(const llmi_sampling *p);
int sampler_mirostat_distribution(float *logits, int n_vocab, const llmi_sampling *p, float mu, void *scratch,
                                  int32_t *ids, float *probs);
void sampler_mirostat_update(const llmi_sampling *p, float *mu, float p_drawn);
int32_t sampler_sample_mirostat(float *logits, int n_vocab, const llmi_sampling *p, float *mu, sampler_rng *rng,
                                void *scratch);

/* log-softmax value of token id, and the n_top best (id, logprob), from raw logits. */
float sampler_logprob(const float *logits, int n_vocab, int32_t id, int n_top, int32_t *top_ids, float *top_lp);

#endif
