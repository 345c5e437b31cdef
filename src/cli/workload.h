/* workload.h — owns the synthetic workload that bench's sweep and profile measure:
 * b requests of p random prompt tokens (uniform over the vocabulary), each generating n
 * tokens greedily with EOS ignored, added at once and stepped until all finish, optionally
 * after a context of d tokens already in the KV cache (depth).  The
 * callers keep their own accounting through hooks: bench splits prefill from decode time
 * and collects TTFT/TPOT, profile reads its op counters around each step and traces it. */
#ifndef LLMI_WORKLOAD_H
#define LLMI_WORKLOAD_H

#include <stdint.h>
#include "core/status.h"
#include "engine/engine.h"
#include "metrics/stats.h"

typedef struct workload_shape {
    int n_prompt;                  /* p: prompt tokens per request */
    int n_gen;                     /* n: tokens generated per request */
    int n_requests;                /* b: requests running together */
    const int32_t *prefix;         /* (n_prefix) the first tokens of every prompt, or NULL */
    int n_prefix;                  /* < n_prompt */
    int n_depth;                   /* d: context tokens already in the KV cache (see workload_run) */
    llmi_spec_params spec;         /* speculation of every timed request (zero: off) */
} workload_shape;

/* Any hook may be NULL. */
typedef struct workload_hooks {
    void *ctx;
    /* Right before each engine_step. */
    void (*before_step)(void *ctx);
    /* Right after each engine_step; t0 is the engine clock when the step began and dt the
     * wall time taken around it (token callbacks included). */
    void (*after_step)(void *ctx, const llmi_step_info *info, double t0, double dt);
    /* Once per request after all have finished, before the engine forgets it. */
    int (*on_request)(void *ctx, const llmi_request_info *ri, llmi_status *st);
} workload_hooks;

/* t (n): token ids uniform in [0, n_vocab). */
void workload_random_tokens(stats_rng *rng, int32_t *t, int n, int n_vocab);

/* Runs the workload on e; who ("bench", "profile") starts the error messages.  On
 * failure or Ctrl-C every request is aborted; the engine is left empty either way.
 *
 * Depth (llama-bench -d): with n_depth > 0 each request first gets a context of n_depth
 * random tokens, prefilled untimed (no hooks) by a prompt-only request whose full blocks
 * stay in the prefix cache; the timed requests' prompts are that context + n_prompt new
 * tokens, so their prefill computes only the new ones while attending to all.  Needs
 * prefix caching and n_depth a multiple of the block size; fails if any timed request
 * found fewer than n_depth of its tokens cached (the pool was too small). */
int workload_run(llmi_engine *e, int n_vocab, workload_shape w, stats_rng *rng, const workload_hooks *h,
                 const char *who, llmi_status *st);

/* The warm-up run: the same workload with at most max(WORKLOAD_WARMUP_PROMPT, the step's
 * token budget / b) prompt tokens a request and WORKLOAD_WARMUP_GEN generated tokens, no
 * depth and no shared prefix: it pages the weights in and sizes the workspaces, and its
 * prefill steps run the timed ones' token count wherever those fill the budget (at b = 1
 * the whole prompt, as llama-bench's warm-up), so that each GEMM shape has had its
 * cuBLASLt choice made before timing.  Three tokens are two decode steps of the b
 * sequences: the CUDA backend runs a batch size's first decode step eagerly and captures its
 * graph at the second (backend_cuda.c), which the timed runs then only replay.  No hooks. */
#define WORKLOAD_WARMUP_PROMPT 32
#define WORKLOAD_WARMUP_GEN 3
int workload_warmup(llmi_engine *e, int n_vocab, workload_shape w, stats_rng *rng, const char *who, llmi_status *st);

/* The warm-up of a serving run (bench's offline mode), untimed and forgotten: up to
 * max_batch requests of random prompts short enough to be prefilled in one step where the
 * token budget allows (a step's GEMMs and attention at about its full token count), then
 * decoding with generation lengths that halve the decoding batch every second step, from
 * max_batch down to one sequence.  So every decode batch size the run can meet, rounded up
 * to a power of two, decodes twice and has its CUDA graph captured (see above), and every
 * kernel has run once: the timed run pays none of that, as vLLM's benchmarks capture their
 * graphs before timing.  ctx bounds the requests' lengths; the KV cache (sized for the timed
 * run) shortens the prompts and then max_batch until every sequence fits at once.
 * Of h (may be NULL) only before_step and after_step are called. */
int workload_warm_serving(llmi_engine *e, int n_vocab, int ctx, int max_batch, stats_rng *rng, const workload_hooks *h,
                          const char *who, llmi_status *st);

#endif
