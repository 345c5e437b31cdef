/* workload.c — see workload.h. */
#include "cli/workload.h"

#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"

void workload_random_tokens(stats_rng *rng, int32_t *t, int n, int n_vocab) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)stats_rng_range(rng, 0, n_vocab - 1);
}

/* Steps e until it has no work, h's step hooks around each step (h may not be NULL). */
static int run_steps(llmi_engine *e, const workload_hooks *h, const char *who, llmi_status *st) {
    while (engine_has_work(e)) {
        if (cli_was_interrupted()) return llmi_fail(st, LLMI_E_INTERRUPT, "%s: interrupted", who);
        if (h->before_step) h->before_step(h->ctx);
        llmi_step_info info;
        const double t0 = engine_now(e);
        int rc = engine_step(e, NULL, NULL, &info, st);
        if (rc) return rc;
        if (h->after_step) h->after_step(h->ctx, &info, t0, engine_now(e) - t0);
    }
    return LLMI_OK;
}

static const workload_hooks no_hooks = {0};

/* Prefills ctx (n_requests, n_depth) untimed, as prompt-only requests, and releases them:
 * their full blocks stay in the prefix cache for the timed requests to find. */
static int prefill_context(llmi_engine *e, workload_shape w, const int32_t *ctx, const char *who, llmi_status *st) {
    llmi_request_params rp = request_params_defaults();
    rp.max_tokens = 0;
    int *ids = malloc((size_t)w.n_requests * sizeof *ids);   /* (n_requests) */
    int rc = 0, added = 0;
    if (!ids) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", who);
    for (int i = 0; i < w.n_requests && !rc; i++) {
        rc = engine_add_request(e, ctx + (size_t)i * w.n_depth, w.n_depth, &rp, NULL, &ids[i], st);
        added += rc == 0;
    }
    if (!rc) rc = run_steps(e, &no_hooks, who, st);
    if (rc) engine_abort_all(e, NULL, NULL);
    for (int i = 0; i < added; i++) engine_release(e, ids[i]);
    free(ids);
    return rc;
}

int workload_run(llmi_engine *e, int n_vocab, workload_shape w, stats_rng *rng, const workload_hooks *h,
                 const char *who, llmi_status *st) {
    if (!h) h = &no_hooks;
    const int n_total = w.n_depth + w.n_prompt;
    int32_t *prompt = malloc((size_t)n_total * sizeof *prompt);     /* (n_depth + n_prompt) */
    int *ids = malloc((size_t)w.n_requests * sizeof *ids);           /* (n_requests) */
    int32_t *ctx = w.n_depth ? malloc((size_t)w.n_requests * w.n_depth * sizeof *ctx) : NULL;   /* (n_requests, n_depth) */
    int rc = 0, added = 0;
    if (!prompt || !ids || (w.n_depth && !ctx)) { rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", who); goto done; }
    if (w.n_depth) {
        workload_random_tokens(rng, ctx, w.n_requests * w.n_depth, n_vocab);
        if ((rc = prefill_context(e, w, ctx, who, st))) goto done;
    }
    llmi_request_params rp = request_params_defaults();
    rp.max_tokens = w.n_gen;
    rp.ignore_eos = true;
    rp.sampling.temperature = 0;
    if (w.spec.mode != LLMI_SPEC_OFF) rp.spec = w.spec;
    for (int i = 0; i < w.n_requests; i++) {
        int shared = w.prefix ? w.n_prefix : 0;
        if (w.n_depth) memcpy(prompt, ctx + (size_t)i * w.n_depth, (size_t)w.n_depth * sizeof *prompt);
        if (shared) memcpy(prompt + w.n_depth, w.prefix, (size_t)shared * sizeof *prompt);
        workload_random_tokens(rng, prompt + w.n_depth + shared, w.n_prompt - shared, n_vocab);
        if ((rc = engine_add_request(e, prompt, n_total, &rp, NULL, &ids[i], st))) goto done;
        added++;
    }
    if ((rc = run_steps(e, h, who, st))) goto done;
    for (int i = 0; i < added; i++) {
        const llmi_request_info *ri = engine_request(e, ids[i]);
        if (!ri) continue;
        if (ri->n_cached_tokens < w.n_depth) {
            rc = llmi_fail(st, LLMI_E_RUNTIME,
                           "%s: -d %d: only %d context tokens of a request were still in the KV cache when its timed "
                           "part began (too few blocks: --num-blocks/--kv-mem)",
                           who, w.n_depth, ri->n_cached_tokens);
            goto done;
        }
        if (h->on_request && (rc = h->on_request(h->ctx, ri, st))) goto done;
    }
done:
    if (rc) engine_abort_all(e, NULL, NULL);
    for (int i = 0; i < added; i++) engine_release(e, ids[i]);
    free(prompt);
    free(ids);
    free(ctx);
    return rc;
}

int workload_warmup(llmi_engine *e, int n_vocab, workload_shape w, stats_rng *rng, const char *who, llmi_status *st) {
    int cut = engine_options(e)->max_batch_tokens / (w.n_requests > 0 ? w.n_requests : 1);
    if (cut < WORKLOAD_WARMUP_PROMPT) cut = WORKLOAD_WARMUP_PROMPT;
    if (w.n_prompt > cut) w.n_prompt = cut;
    if (w.n_gen > WORKLOAD_WARMUP_GEN) w.n_gen = WORKLOAD_WARMUP_GEN;
    w.n_depth = 0;
    w.prefix = NULL;
    w.n_prefix = 0;
    return workload_run(e, n_vocab, w, rng, NULL, who, st);
}

/* Halvings of b before it reaches 1: b's decode batch sizes, as powers of two, are levels+1. */
static int halvings(int b) {
    int n = 0;
    while ((1 << n) < b) n++;
    return n;
}

int workload_warm_serving(llmi_engine *e, int n_vocab, int ctx, int max_batch, stats_rng *rng, const workload_hooks *h,
                          const char *who, llmi_status *st) {
    if (!h) h = &no_hooks;
    const llmi_engine_opts *o = engine_options(e);
    if (max_batch > o->max_seqs) max_batch = o->max_seqs;
    /* Every sequence's blocks at once, so that none is preempted out of the pattern: the
     * prompts shrink (to WORKLOAD_WARMUP_PROMPT at most, and to one step's budget shared)
     * until the cache, sized for the timed run, holds them all, then the batch does. */
    const long pool = engine_kv_blocks_total(e);
    int levels = 0, longest = 0, p = 0;
    for (; max_batch > 0; max_batch--) {
        levels = halvings(max_batch);
        longest = 1 + 2 * (levels + 1);   /* sequence 0: two decode steps a level, after the prompt's token */
        const long room = pool / max_batch * o->block_size - longest;   /* prompt tokens a sequence can have */
        p = o->max_batch_tokens / max_batch;
        if (p > WORKLOAD_WARMUP_PROMPT) p = WORKLOAD_WARMUP_PROMPT;
        if (p > room) p = (int)room;
        if (p >= 1) break;
    }
    if (max_batch < 1 || p + longest > ctx) return LLMI_OK;   /* nothing worth warming fits */
    int32_t *prompt = malloc((size_t)p * sizeof *prompt);             /* (p) */
    int *ids = malloc((size_t)max_batch * sizeof *ids);               /* (max_batch) */
    int rc = 0, added = 0;
    if (!prompt || !ids) { rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", who); goto done; }
    llmi_request_params rp = request_params_defaults();
    rp.ignore_eos = true;
    rp.sampling.temperature = 0;
    for (int i = 0; i < max_batch; i++) {
        /* sequence i decodes while the batch is above 2^(level - 1): level(0) = 0, level(1) = 1,
         * level(2..3) = 2, level(4..7) = 3, ... so the batch halves every second step */
        rp.max_tokens = 1 + 2 * (levels + 1 - halvings(i + 1));
        workload_random_tokens(rng, prompt, p, n_vocab);
        if ((rc = engine_add_request(e, prompt, p, &rp, NULL, &ids[i], st))) goto done;
        added++;
    }
    rc = run_steps(e, h, who, st);
done:
    if (rc) engine_abort_all(e, NULL, NULL);
    for (int i = 0; i < added; i++) engine_release(e, ids[i]);
    free(prompt);
    free(ids);
    return rc;
}
