/* engine.c — continuous batching over the paged KV cache (see engine.h).
 *
 * Each step the scheduler walks sequences in priority order and gives each a piece of
 * work: one decode token, or the next chunk of its prompt (prefill).  A sequence's
 * pending tokens are those whose KV is not cached yet; when a step consumes the last
 * pending token, that token's logits are computed and the next token is sampled.
 * Preemption is by recompute: the victim's blocks are freed and it re-enters the
 * waiting queue with all its tokens pending, so it re-prefills prompt + output later;
 * its per-request RNG only advances on draws, so its output does not change.
 *
 * Speculative decoding rides on the same step: before planning, each decoding sequence
 * that speculates gets up to k proposed tokens (spec.h); the step runs them after its
 * pending token with a logit row at each, accepts a prefix by the exact rule (the
 * sampler's), adds one token of the target's own, and rolls the K/V back past the first
 * rejection, so nothing rejected is ever attended or registered in the prefix cache.
 * Such steps take the logits path (forward), not device sampling: the rule needs the
 * rows on the host.
 *
 * A draft model (--spec draft) proposes in the same place, before planning: it runs its
 * own forwards (catch-up, then one greedy token per forward for every speculating
 * sequence together) over its own KV pool, which gets as many blocks as the target's.
 * After verification its K/V is rolled back with the target's; preemption, finishing and
 * release give its blocks back too. */
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cost.h"
#include "engine/dry.h"
#include "engine/kvcache.h"
#include "engine/prompt_cache.h"
#include "engine/sched.h"
#include "engine/sequence.h"
#include "engine/spec.h"
#include "engine/stop.h"
#include "tok/tokenizer.h"

struct llmi_engine {
    const llmi_model *model;
    llmi_backend *backend;
    llmi_engine_opts opts;
    kvcache kv;
    sched sched;
    prompt_cache *pc;         /* --prompt-cache, or NULL */
    spec_draft draft;         /* --draft-model's pool and buffers; draft.model NULL without one */
    llmi_seq **cands;         /* (cap_cands) this step's sequences the draft proposes for */
    int *cand_k;              /* (cap_cands) how many tokens each may get */
    int cap_cands;
    int max_ctx;
    struct timespec t0;
    llmi_op_stats host_stats;   /* the engine's own share of a step: LLMI_OP_HOST, LLMI_OP_SAMPLE */

    llmi_seq **seqs;          /* (n_seq_slots) indexed by request id; NULL once released */
    int n_seq_slots, cap_seq_slots;
    long next_order;

    /* Step workspace, sized once from the options. */
    sched_plan plan;
    sched_batch_bufs bufs;
    float *logits;            /* (sched.max_logit_rows + sched.plp_rows, n_vocab): every logit row,
                                 or with device sampling only the rows of requests that asked
                                 for logprobs */
    void *sample_scratch;     /* sampler_scratch_bytes(n_vocab, max_ctx): DRY reads whole histories */
    float *raw_logits;        /* (n_vocab) unpenalised copy of a row, for --logprobs */
    llmi_sample_row *rows;    /* (max_seqs) device sampling: each logit row's request */
    int32_t *tokens;          /* (max_seqs) device sampling: the tokens picked */
    char *piece;              /* (tok_stream_cap) bytes of one decoded token, for stop matching */
    grammar_vocab *gvocab;    /* the vocabulary's trie, built with the first constrained request */
    struct engine_dry { char *key; size_t key_len; dry_breakers *table; } *dry;   /* (n_dry) DRY breaker tables by breaker
                                                                     list, built as requests ask */
    int n_dry, cap_dry;
    uint8_t *gmask;           /* (n_vocab) tokens the grammar allows at a row */
    int32_t *eog_ids;         /* (n_eog) the vocabulary's end-of-generation tokens (min_tokens masks them) */
    int n_eog;
};

llmi_engine_opts engine_opts_defaults(void) {
    llmi_engine_opts o = {.block_size = 16, .num_blocks = 0, .kv_mem_bytes = 0, .max_batch_tokens = 2048,
                          .prefill_chunk = 0, .max_seqs = 256, .policy = SCHED_FIFO, .max_ctx = 0,
                          .prefix_cache = true, .prompt_cache_max = (size_t)4 << 30};
    return o;
}

/* Prompt lookup's defaults: 5 proposals per step after a match of 2 to 4 tokens. */
llmi_spec_params spec_params_defaults(void) {
    return (llmi_spec_params){.mode = LLMI_SPEC_OFF, .k = 5, .ngram_min = 2, .ngram_max = 4};
}

const char *spec_mode_name(llmi_spec_mode m) {
    return m == LLMI_SPEC_NGRAM ? "ngram" : m == LLMI_SPEC_DRAFT ? "draft" : "off";
}

llmi_request_params request_params_defaults(void) {
    llmi_request_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = -1;
    p.sampling = sampling_defaults();
    p.spec = spec_params_defaults();
    return p;
}

const char *sched_policy_name(sched_policy p) { return p == SCHED_PREFILL_FIRST ? "prefill-first" : "fifo"; }

const char *finish_name(llmi_finish f) {
    switch (f) {
    case LLMI_FINISH_LENGTH: return "length";
    case LLMI_FINISH_EOS: return "eos";
    case LLMI_FINISH_STOP: return "stop";
    case LLMI_FINISH_CONTEXT: return "context";
    case LLMI_FINISH_ABORT: return "abort";
    case LLMI_FINISH_GRAMMAR: return "grammar";
    default: return "none";
    }
}

double engine_now(const llmi_engine *e) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - e->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - e->t0.tv_nsec);
}

/* The root of every prefix-cache hash chain: what else a block's K/V depends on. */
static kv_hash kv_salt(const llmi_model *m, const llmi_backend *b) {
    kv_hash fp = prompt_cache_model_fingerprint(m);
    int32_t words[8] = {(int32_t)fp.lo, (int32_t)(fp.lo >> 32), (int32_t)fp.hi, (int32_t)(fp.hi >> 32),
                        (int32_t)b->opts.kv_dtype, b->opts.block_size, 0x6c6c6d69 /* "llmi" */, 1 /* format */};
    return kvcache_chain((kv_hash){0, 0}, words, 8);
}

int engine_create(const llmi_model *m, llmi_backend *b, const llmi_engine_opts *o, llmi_engine **out,
                  llmi_status *st) {
    *out = NULL;
    llmi_engine_opts opts = o ? *o : engine_opts_defaults();
    if (opts.block_size <= 0 || opts.block_size > 1024)
        return llmi_fail(st, LLMI_E_USAGE, "--block-size: must be in 1..1024 (got %d)", opts.block_size);
    if (opts.max_batch_tokens <= 0)
        return llmi_fail(st, LLMI_E_USAGE, "--max-batch-tokens: must be positive (got %d)", opts.max_batch_tokens);
    if (opts.max_seqs <= 0) return llmi_fail(st, LLMI_E_USAGE, "--max-seqs: must be positive (got %d)", opts.max_seqs);
    if (opts.prefill_chunk < 0)
        return llmi_fail(st, LLMI_E_USAGE, "--prefill-chunk: must be >= 0 (got %d)", opts.prefill_chunk);
    if (opts.prompt_logprob_rows < 0)
        return llmi_fail(st, LLMI_E_USAGE, "prompt logprob rows: must be >= 0 (got %d)", opts.prompt_logprob_rows);
    if (opts.spec_max_k < 0 || opts.spec_max_k > LLMI_SPEC_MAX_K)
        return llmi_fail(st, LLMI_E_USAGE, "--spec-k: must be in 1..%d (got %d)", LLMI_SPEC_MAX_K, opts.spec_max_k);
    if (opts.max_seqs > opts.max_batch_tokens) opts.max_seqs = opts.max_batch_tokens;
    int max_ctx = opts.max_ctx > 0 ? opts.max_ctx : m->cfg.max_ctx;
    if (max_ctx <= 0) max_ctx = 4096;
    if (opts.max_ctx > 0 && m->cfg.max_ctx > 0 && opts.max_ctx > m->cfg.max_ctx)
        return llmi_fail(st, LLMI_E_USAGE, "-c: %d exceeds the model's context length %d", opts.max_ctx,
                         m->cfg.max_ctx);

    const llmi_model *dm = opts.draft_model;
    llmi_backend *db = opts.draft_backend;
    if ((dm == NULL) != (db == NULL))
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model: needs both the draft model and its backend");
    if (dm && spec_draft_check(m, dm, max_ctx, st)) return st->code;

    int max_blocks_per_seq = (max_ctx + opts.block_size - 1) / opts.block_size;
    int num_blocks = opts.num_blocks;
    if (num_blocks < 0) return llmi_fail(st, LLMI_E_USAGE, "--num-blocks: must be positive (got %d)", num_blocks);
    if (num_blocks == 0) {
        /* With a draft model both pools get the same number of blocks (a sequence's tokens
         * need K/V in both), so a block of budget is a block of each. */
        size_t per_block = b->kv_block_bytes(b) + (db ? db->kv_block_bytes(db) : 0);
        size_t budget = opts.kv_mem_bytes ? opts.kv_mem_bytes : b->kv_budget_bytes(b);
        size_t fit = per_block ? budget / per_block : 0;
        /* No use holding more than every running sequence at full context can touch. */
        size_t useful = (size_t)max_blocks_per_seq * (size_t)opts.max_seqs;
        if (fit > useful) fit = useful;
        if (fit > (size_t)1 << 30) fit = (size_t)1 << 30;
        if (fit == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "KV cache: a budget of %zu bytes holds no %zu-byte block (--kv-mem)",
                             budget, per_block);
        num_blocks = (int)fit;
    }

    llmi_engine *e = calloc(1, sizeof *e);
    if (!e) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory");
    e->model = m;
    e->backend = b;
    e->opts = opts;
    e->max_ctx = max_ctx;
    clock_gettime(CLOCK_MONOTONIC, &e->t0);
    size_t V = (size_t)m->cfg.n_vocab;
    kv_hash salt = kv_salt(m, b);
    if (opts.prompt_cache_dir && !opts.prefix_cache) {
        llmi_fail(st, LLMI_E_USAGE, "--prompt-cache: needs prefix caching (drop --no-prefix-cache)");
        goto fail;
    }
    if (kvcache_init(&e->kv, num_blocks, opts.block_size, opts.prefix_cache, salt, st) ||
        b->kv_alloc(b, num_blocks, st) ||
        sched_init(&e->sched, &opts, st) || sched_plan_alloc(&e->plan, &e->sched, st) ||
        /* every token may own a logit row (prompt logprobs): the index lists are small */
        sched_batch_bufs_alloc(&e->bufs, e->sched.max_batch_tokens, e->sched.max_seqs, e->sched.max_batch_tokens,
                               max_blocks_per_seq, st))
        goto fail;
    if (dm) {
        if (spec_draft_init(&e->draft, dm, db, num_blocks, opts.block_size, opts.max_batch_tokens, opts.max_seqs,
                            max_blocks_per_seq, st))
            goto fail;
        e->sched.draft_kv = &e->draft.kv;
    }
    if (opts.prompt_cache_dir &&
        prompt_cache_open(opts.prompt_cache_dir, opts.prompt_cache_max, b, salt, &e->pc, st))
        goto fail;
    e->sched.pc = e->pc;
    e->logits = malloc((size_t)e->sched.max_logit_rows * V * sizeof(float));
    e->sample_scratch = malloc(sampler_scratch_bytes((int)V, max_ctx));
    e->raw_logits = malloc(V * sizeof(float));
    e->rows = malloc((size_t)opts.max_seqs * sizeof *e->rows);
    e->tokens = malloc((size_t)opts.max_seqs * sizeof *e->tokens);
    e->piece = m->tok ? malloc(tok_stream_cap(m->tok)) : NULL;
    for (int32_t t = 0; m->tok && t < (int32_t)V; t++) e->n_eog += tok_is_eog(m->tok, t);
    e->eog_ids = e->n_eog ? malloc((size_t)e->n_eog * sizeof *e->eog_ids) : NULL;
    for (int32_t t = 0, k = 0; e->eog_ids && t < (int32_t)V; t++)
        if (tok_is_eog(m->tok, t)) e->eog_ids[k++] = t;
    if (!e->logits || !e->sample_scratch || !e->raw_logits || !e->rows || !e->tokens || (m->tok && !e->piece) ||
        (e->n_eog && !e->eog_ids)) {
        llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for step buffers (%d logit rows x %zu vocab)",
                  e->sched.max_logit_rows, V);
        goto fail;
    }
    *out = e;
    return LLMI_OK;
fail:
    engine_destroy(e);
    return st->code ? st->code : LLMI_E_RUNTIME;
}

static void seq_free(llmi_seq *s) {
    if (!s) return;
    grammar_state_free(s->grammar);
    free(s->tokens);
    free(s->plp);
    free(s->plp_top_ids);
    free(s->plp_top_lp);
    free(s->text);
    kvcache_table_free(&s->table);
    kvcache_table_free(&s->draft_table);
    free(s);
}

void engine_destroy(llmi_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_seq_slots; i++) seq_free(e->seqs[i]);
    free(e->seqs);
    free(e->eog_ids);
    kvcache_free(&e->kv);
    spec_draft_free(&e->draft);
    free(e->cands);
    free(e->cand_k);
    prompt_cache_close(e->pc);
    sched_free(&e->sched);
    sched_plan_free(&e->plan);
    sched_batch_bufs_free(&e->bufs);
    free(e->logits);
    free(e->sample_scratch);
    free(e->raw_logits);
    free(e->rows);
    free(e->tokens);
    free(e->piece);
    grammar_vocab_free(e->gvocab);
    for (int i = 0; i < e->n_dry; i++) free(e->dry[i].key), dry_breakers_free(e->dry[i].table);
    free(e->dry);
    free(e->gmask);
    free(e);
}

const llmi_engine_opts *engine_options(const llmi_engine *e) { return &e->opts; }
int engine_kv_blocks_total(const llmi_engine *e) { return e->kv.num_blocks; }
int engine_kv_blocks_peak(const llmi_engine *e) { return e->kv.peak_used; }
const llmi_op_stats *engine_host_stats(const llmi_engine *e) { return &e->host_stats; }

bool engine_has_work(const llmi_engine *e) { return e->sched.n_waiting > 0 || e->sched.n_running > 0; }

const llmi_request_info *engine_request(const llmi_engine *e, int id) {
    if (id < 0 || id >= e->n_seq_slots || !e->seqs[id]) return NULL;
    llmi_seq *s = e->seqs[id];
    s->info.tokens = s->tokens;
    s->info.n_prompt = s->n_prompt;
    s->info.n_generated = s->n_tokens - s->n_prompt;
    s->info.error = s->error[0] ? s->error : NULL;
    s->info.prompt_logprobs = s->plp;
    s->info.prompt_top_ids = s->plp_top_ids;
    s->info.prompt_top_logprobs = s->plp_top_lp;
    s->info.prompt_top = s->params.prompt_logprobs ? s->params.prompt_top : 0;
    s->info.n_prompt_scored = s->plp_done;
    return &s->info;
}

void engine_release(llmi_engine *e, int id) {
    if (id < 0 || id >= e->n_seq_slots || !e->seqs[id]) return;
    llmi_seq *s = e->seqs[id];
    sched_remove(&e->sched, id);
    kvcache_release(&e->kv, &s->table);
    if (e->draft.model) spec_draft_release(&e->draft, s);
    seq_free(s);
    e->seqs[id] = NULL;
}

/* Sizes the engine for prompt logprobs with the first request that asks: the step's extra
 * logit rows (engine_opts.prompt_logprob_rows). */
static int prompt_logprob_rows_init(llmi_engine *e, llmi_status *st) {
    if (e->sched.plp_rows > 0) return LLMI_OK;
    int rows = e->opts.prompt_logprob_rows > 0 ? e->opts.prompt_logprob_rows : 256;
    if (rows > e->sched.max_batch_tokens) rows = e->sched.max_batch_tokens;
    size_t V = (size_t)e->model->cfg.n_vocab, total = (size_t)(e->sched.max_logit_rows + rows);
    float *nl = realloc(e->logits, total * V * sizeof(float));
    if (!nl)
        return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for prompt logprobs (%zu logit rows x %zu vocab)",
                         total, V);
    e->logits = nl;
    e->sched.plp_rows = rows;
    return LLMI_OK;
}

/* The DRY breaker table of p's breaker list over the model's vocabulary, built the first
 * time a request names that list. */
static int dry_table_for(llmi_engine *e, const llmi_sampling *p, const dry_breakers **out, llmi_status *st) {
    static const char *const llamacpp_default[] = {"\n", ":", "\"", "*"};
    const char *const *list = p->n_dry_breakers < 0 ? llamacpp_default : p->dry_breakers;
    int n = p->n_dry_breakers < 0 ? 4 : p->n_dry_breakers;
    if (n > DRY_MAX_BREAKERS) return llmi_fail(st, LLMI_E_USAGE, "DRY: %d sequence breakers (at most %d)", n, DRY_MAX_BREAKERS);
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(list[i]) + 1;
    char *key = malloc(len);
    if (!key) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory");
    char *k = key;
    for (int i = 0; i < n; i++) k = stpcpy(k, list[i]) + 1;   /* NUL-terminated each, so no breaker can fake another */
    size_t klen = (size_t)(k - key);
    for (int i = 0; i < e->n_dry; i++)
        if (e->dry[i].key_len == klen && !memcmp(e->dry[i].key, key, klen)) {
            free(key);
            *out = e->dry[i].table;
            return LLMI_OK;
        }
    if (n > 0 && !e->model->tok) {
        free(key);
        return llmi_fail(st, LLMI_E_USAGE, "DRY: sequence breakers need the model's tokenizer, and this model has none");
    }
    dry_breakers *t = NULL;
    if (n > 0 && dry_breakers_build(e->model->tok, list, n, &t, st)) {
        free(key);
        return st->code;
    }
    if (e->n_dry == e->cap_dry) {
        int cap = e->cap_dry ? 2 * e->cap_dry : 4;
        struct engine_dry *nd = realloc(e->dry, (size_t)cap * sizeof *nd);
        if (!nd) {
            free(key);
            dry_breakers_free(t);
            return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory");
        }
        e->dry = nd;
        e->cap_dry = cap;
    }
    e->dry[e->n_dry++] = (struct engine_dry){key, klen, t};
    *out = t;
    return LLMI_OK;
}

int engine_add_request(llmi_engine *e, const int32_t *prompt, int n_prompt, const llmi_request_params *p,
                       void *user, int *id, llmi_status *st) {
    if (n_prompt <= 0) return llmi_fail(st, LLMI_E_USAGE, "request: empty prompt (no tokens)");
    if (n_prompt > e->max_ctx)
        return llmi_fail(st, LLMI_E_USAGE, "request: prompt of %d tokens exceeds the context length %d (-c)",
                         n_prompt, e->max_ctx);
    if (kvcache_blocks_for(&e->kv, n_prompt) > e->kv.num_blocks)
        return llmi_fail(st, LLMI_E_USAGE,
                         "request: prompt of %d tokens needs %d KV blocks but the cache has only %d (--num-blocks/--kv-mem)",
                         n_prompt, kvcache_blocks_for(&e->kv, n_prompt), e->kv.num_blocks);
    if (p->logprobs < 0 || p->logprobs > LLMI_MAX_LOGPROBS)
        return llmi_fail(st, LLMI_E_USAGE, "--logprobs: must be in 0..%d (got %d)", LLMI_MAX_LOGPROBS, p->logprobs);
    if (p->prompt_logprobs && (p->prompt_top < 0 || p->prompt_top > LLMI_MAX_LOGPROBS))
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-logprobs: must be in 0..%d (got %d)", LLMI_MAX_LOGPROBS,
                         p->prompt_top);
    if (p->prompt_logprobs && prompt_logprob_rows_init(e, st)) return st->code;
    const llmi_spec_params *sp = &p->spec;
    if (sp->mode != LLMI_SPEC_OFF) {
        if (sp->k < 1 || sp->k > LLMI_SPEC_MAX_K)
            return llmi_fail(st, LLMI_E_USAGE, "--spec-k: must be in 1..%d (got %d)", LLMI_SPEC_MAX_K, sp->k);
        if (sp->k > e->opts.spec_max_k)
            return llmi_fail(st, LLMI_E_USAGE, "--spec-k: %d exceeds the %d the engine was sized for (spec_max_k)",
                             sp->k, e->opts.spec_max_k);
        if (sp->mode == LLMI_SPEC_DRAFT && !e->draft.model)
            return llmi_fail(st, LLMI_E_USAGE, "--spec draft: needs --draft-model PATH");
        if (sp->ngram_min < 1 || sp->ngram_min > sp->ngram_max || sp->ngram_max > LLMI_SPEC_MAX_NGRAM)
            return llmi_fail(st, LLMI_E_USAGE, "--spec-ngram: need 1 <= MIN <= MAX <= %d (got %d,%d)",
                             LLMI_SPEC_MAX_NGRAM, sp->ngram_min, sp->ngram_max);
    }
    int32_t n_vocab = e->model->cfg.n_vocab;
    const llmi_sampling *smp = &p->sampling;
    if (smp->n_logit_bias < 0 || smp->n_logit_bias > LLMI_MAX_LOGIT_BIAS || (smp->n_logit_bias && !smp->logit_bias))
        return llmi_fail(st, LLMI_E_USAGE, "logit bias: %d entries (at most %d)", smp->n_logit_bias, LLMI_MAX_LOGIT_BIAS);
    for (int i = 0; i < smp->n_logit_bias; i++) {
        const llmi_logit_bias *lb = &smp->logit_bias[i];
        if (lb->id < 0 || lb->id >= n_vocab)
            return llmi_fail(st, LLMI_E_USAGE, "logit bias: token id %d is outside the vocabulary (%d tokens)", lb->id, n_vocab);
        if (!(lb->bias <= 100.0f && (lb->bias >= -100.0f || lb->bias == -INFINITY)))
            return llmi_fail(st, LLMI_E_USAGE, "logit bias: token %d's bias %g is not in -100..100 or -inf", lb->id,
                             (double)lb->bias);
    }
    if (p->n_stop_ids < 0 || p->n_stop_ids > LLMI_MAX_STOP_IDS)
        return llmi_fail(st, LLMI_E_USAGE, "stop token ids: %d of them (at most %d)", p->n_stop_ids, LLMI_MAX_STOP_IDS);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= n_vocab)
            return llmi_fail(st, LLMI_E_USAGE, "stop token id %d is outside the vocabulary (%d tokens)", p->stop_ids[i],
                             n_vocab);
    if (p->min_tokens < 0) return llmi_fail(st, LLMI_E_USAGE, "min_tokens: %d is negative", p->min_tokens);
    if (p->n_allowed < 0 || p->n_allowed > n_vocab || (p->n_allowed > 0 && !p->allowed_ids))
        return llmi_fail(st, LLMI_E_USAGE, "allowed_token_ids: %d ids (at most the vocabulary's %d)", p->n_allowed,
                         n_vocab);
    for (int i = 0; i < p->n_allowed; i++)
        if (p->allowed_ids[i] < 0 || p->allowed_ids[i] >= n_vocab)
            return llmi_fail(st, LLMI_E_USAGE, "allowed_token_ids: token id %d is outside the vocabulary (%d tokens)",
                             p->allowed_ids[i], n_vocab);
    if (p->n_bad < 0 || (p->n_bad > 0 && (!p->bad_ids || !p->bad_off || p->bad_off[0] != 0)))
        return llmi_fail(st, LLMI_E_USAGE, "bad_words: %d words without their token lists", p->n_bad);
    for (int w = 0; w < p->n_bad; w++) {
        if (p->bad_off[w + 1] <= p->bad_off[w])
            return llmi_fail(st, LLMI_E_USAGE, "bad_words: word %d has no tokens", w);
        for (int i = p->bad_off[w]; i < p->bad_off[w + 1]; i++)
            if (p->bad_ids[i] < 0 || p->bad_ids[i] >= n_vocab)
                return llmi_fail(st, LLMI_E_USAGE, "bad_words: token id %d is outside the vocabulary (%d tokens)",
                                 p->bad_ids[i], n_vocab);
    }
    if (smp->mirostat < 0 || smp->mirostat > 2)
        return llmi_fail(st, LLMI_E_USAGE, "--mirostat: %d is not 0, 1 or 2", smp->mirostat);
    if (smp->mirostat && (!(smp->mirostat_tau >= 0.0f && smp->mirostat_tau <= 100.0f) ||
                          !(smp->mirostat_eta >= 0.0f && smp->mirostat_eta <= 100.0f)))
        return llmi_fail(st, LLMI_E_USAGE, "--mirostat: target surprise %g and learning rate %g must be in 0..100",
                         (double)smp->mirostat_tau, (double)smp->mirostat_eta);
    if (smp->mirostat && sp->mode != LLMI_SPEC_OFF)
        return llmi_fail(st, LLMI_E_USAGE, "--mirostat: not with --spec (mirostat's state moves with every token drawn, "
                         "which the exact verification rule does not model)");
    const dry_breakers *dry_table = NULL;
    if (sampler_dry_on(smp) && dry_table_for(e, smp, &dry_table, st)) return st->code;
    if (p->grammar) {
        if (!e->model->tok)
            return llmi_fail(st, LLMI_E_USAGE, "request: a grammar needs the model's tokenizer, and this model has none");
        if (!e->gvocab && grammar_vocab_build(e->model->tok, &e->gvocab, st)) return st->code;
        if (!e->gmask && !(e->gmask = malloc((size_t)n_vocab)))
            return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for a grammar mask");
    }
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return llmi_fail(st, LLMI_E_USAGE, "request: token id %d at position %d is outside the vocabulary (%d)",
                             prompt[i], i, n_vocab);
    if (e->n_seq_slots == e->cap_seq_slots) {
        int cap = e->cap_seq_slots ? 2 * e->cap_seq_slots : 64;
        llmi_seq **ns = realloc(e->seqs, (size_t)cap * sizeof *ns);
        if (!ns) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for requests");
        e->seqs = ns;
        e->cap_seq_slots = cap;
    }
    llmi_seq *s = calloc(1, sizeof *s);
    if (!s) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for a request");
    int max_total = e->max_ctx;
    if (p->max_tokens >= 0 && (long)n_prompt + p->max_tokens < max_total) max_total = n_prompt + p->max_tokens;
    s->cap = max_total > n_prompt ? max_total : n_prompt;
    s->tokens = malloc((size_t)s->cap * sizeof(int32_t));
    if (!s->tokens) {
        int cap = s->cap;
        free(s);
        return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for a request of %d tokens", cap);
    }
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (p->prompt_logprobs) {
        size_t top = (size_t)n_prompt * (size_t)p->prompt_top;
        s->plp = malloc((size_t)n_prompt * sizeof *s->plp);
        s->plp_top_ids = malloc((top ? top : 1) * sizeof *s->plp_top_ids);
        s->plp_top_lp = malloc((top ? top : 1) * sizeof *s->plp_top_lp);
        if (!s->plp || !s->plp_top_ids || !s->plp_top_lp) {
            seq_free(s);
            return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for the prompt logprobs of %d tokens", n_prompt);
        }
        s->plp[0] = NAN;
        for (size_t k = 0; k < (size_t)p->prompt_top; k++) s->plp_top_ids[k] = -1, s->plp_top_lp[k] = NAN;
    }
    s->id = e->n_seq_slots;
    s->state = SEQ_WAITING;
    s->user = user;
    s->params = *p;
    s->params.sampling.dry_table = dry_table;
    s->n_prompt = s->n_tokens = n_prompt;
    s->max_total = max_total;
    s->order = e->next_order++;
    s->twin = -1;
    sampler_rng_seed(&s->rng, p->sampling.seed);
    s->mirostat_mu = sampler_mirostat_mu0(&p->sampling);
    if (p->grammar && grammar_state_create(p->grammar, e->gvocab, &s->grammar, st)) {
        seq_free(s);
        return st->code;
    }
    s->info.id = s->id;
    s->info.t_arrival = engine_now(e);
    if (p->n_stop > 0 && e->model->tok) tok_stream_init(&s->stream, e->model->tok, !p->keep_special);
    if (sched_enqueue(&e->sched, s->id, st)) {
        seq_free(s);
        return st->code;
    }
    e->seqs[e->n_seq_slots++] = s;
    *id = s->id;
    return LLMI_OK;
}

static void finish_seq(llmi_engine *e, llmi_seq *s, llmi_finish why) {
    s->state = SEQ_FINISHED;
    s->info.finish = why;
    s->info.t_finish = engine_now(e);
    sched_remove(&e->sched, s->id);
    kvcache_release(&e->kv, &s->table);
    if (e->draft.model) spec_draft_release(&e->draft, s);
}

/* Ends s with no token and tells the caller. */
static void finish_silently(llmi_engine *e, llmi_seq *s, llmi_finish why, engine_token_cb cb, void *cb_ctx) {
    finish_seq(e, s, why);
    llmi_token_event ev = {.request_id = s->id, .user = s->user, .token = -1, .finished = true, .reason = why};
    if (cb) cb(cb_ctx, &ev);
}

static bool text_append(llmi_seq *s, const char *p, int n) {
    if (n <= 0) return true;
    if (s->text_len + (size_t)n + 1 > s->text_cap) {
        size_t cap = s->text_cap ? s->text_cap : 256;
        while (cap < s->text_len + (size_t)n + 1) cap *= 2;
        char *nt = realloc(s->text, cap);
        if (!nt) return false;
        s->text = nt;
        s->text_cap = cap;
    }
    memcpy(s->text + s->text_len, p, (size_t)n);
    s->text_len += (size_t)n;
    s->text[s->text_len] = '\0';
    return true;
}

/* Scores the prompt tokens after s's next `rows` positions owing prompt logprobs from
 * their logit rows, row0 on. */
static void score_prompt(llmi_engine *e, llmi_seq *s, int row0, int rows) {
    const int V = e->model->cfg.n_vocab, top = s->params.prompt_top;
    for (int r = 0, pos = seq_plp_from(s); r < rows; r++, pos++) {
        size_t at = (size_t)(pos + 1);
        s->plp[at] = sampler_logprob(e->logits + (size_t)(row0 + r) * V, V, s->tokens[at], top,
                                     s->plp_top_ids + at * top, s->plp_top_lp + at * top);
    }
    s->plp_done = seq_plp_from(s) + rows;
}

/* Appends tok to s, reports it (with logprobs from raw, s's unpenalised logits row, when
 * s asked for them) and applies the stop rules. */
static void emit(llmi_engine *e, llmi_seq *s, int32_t tok, const float *raw, engine_token_cb cb, void *cb_ctx) {
    const llmi_model *m = e->model;
    int V = m->cfg.n_vocab;
    llmi_token_event ev = {.request_id = s->id, .user = s->user};
    int32_t top_ids[LLMI_MAX_LOGPROBS];
    float top_lp[LLMI_MAX_LOGPROBS];
    if (s->params.logprobs > 0) {
        ev.n_top = s->params.logprobs;
        ev.logprob = sampler_logprob(raw, V, tok, ev.n_top, top_ids, top_lp);
        ev.top_ids = top_ids;
        ev.top_logprobs = top_lp;
    }
    s->tokens[s->n_tokens++] = tok;
    double now = engine_now(e);
    if (s->n_tokens - s->n_prompt == 1) s->info.t_first_token = now;
    ev.token = tok;

    llmi_finish why = LLMI_FINISH_NONE;
    if (!s->params.ignore_eos && m->tok && tok_is_eog(m->tok, tok)) why = LLMI_FINISH_EOS;
    for (int i = 0; i < s->params.n_stop_ids && why == LLMI_FINISH_NONE; i++)
        if (tok == s->params.stop_ids[i]) why = LLMI_FINISH_STOP;
    const bool by_token = why != LLMI_FINISH_NONE;
    if (why == LLMI_FINISH_NONE && s->params.n_stop > 0 && m->tok) {
        int n = tok_stream_push(&s->stream, tok, e->piece, tok_stream_cap(m->tok));
        /* the text is kept from the first token on: a stop string may begin inside the
         * first min_tokens tokens and complete after them */
        if (!text_append(s, e->piece, n) ||
            (s->n_tokens - s->n_prompt > s->params.min_tokens &&
             stop_completed(s->text, s->text_len, (size_t)(n > 0 ? n : 0), s->params.stop, s->params.n_stop)))
            why = LLMI_FINISH_STOP;
    }
    if (why == LLMI_FINISH_NONE && s->n_tokens >= s->max_total)
        why = (s->params.max_tokens >= 0 && s->n_tokens - s->n_prompt >= s->params.max_tokens) ? LLMI_FINISH_LENGTH
                                                                                             : LLMI_FINISH_CONTEXT;
    if (why != LLMI_FINISH_NONE) {
        finish_seq(e, s, why);
        ev.finished = true;
        ev.reason = why;
        ev.by_token = by_token;
    }
    if (cb) cb(cb_ctx, &ev);
}

/* min_tokens: whether s's next token may not end it, so its row must lose the tokens
 * that would (its stop ids; end-of-generation unless ignore_eos). */
static bool holds_stops(const llmi_seq *s) {
    return s->n_tokens - s->n_prompt < s->params.min_tokens && (s->params.n_stop_ids > 0 || !s->params.ignore_eos);
}

/* Whether s's rows lose tokens to its own lists (allowed_token_ids, bad_words): those rows
 * are edited on the host. */
static bool masks_tokens(const llmi_seq *s) { return s->params.n_allowed > 0 || s->params.n_bad > 0; }

/* allowed_token_ids: every other token of the row to -inf (the allowed ones' values kept
 * in scratch while the row is cleared). */
static void mask_allowed(const llmi_seq *s, float *row, int n_vocab, float *scratch) {
    const llmi_request_params *p = &s->params;
    for (int i = 0; i < p->n_allowed; i++) scratch[i] = row[p->allowed_ids[i]];
    for (int t = 0; t < n_vocab; t++) row[t] = -INFINITY;
    for (int i = 0; i < p->n_allowed; i++) row[p->allowed_ids[i]] = scratch[i];
}

/* bad_words: a word's last token out of the row where the generated tokens end with the
 * rest of it (vLLM's rule: the prompt does not count). */
static void mask_bad_words(const llmi_seq *s, float *row) {
    const llmi_request_params *p = &s->params;
    const int32_t *gen = s->tokens + s->n_prompt;
    const int n_gen = s->n_tokens - s->n_prompt;
    for (int w = 0; w < p->n_bad; w++) {
        const int32_t *word = p->bad_ids + p->bad_off[w];
        const int prefix = p->bad_off[w + 1] - p->bad_off[w] - 1;
        if (prefix > n_gen || memcmp(gen + n_gen - prefix, word, (size_t)prefix * sizeof *word)) continue;
        row[word[prefix]] = -INFINITY;
    }
}

/* Takes out of s's row the tokens its request forbids here: those that would end it while
 * holds_stops(s), those outside allowed_token_ids, and bad words' last tokens.  Returns
 * false when nothing is left (a grammar or the lists allow only such tokens). */
static bool mask_row(const llmi_engine *e, const llmi_seq *s, float *row) {
    const int V = e->model->cfg.n_vocab;
    if (s->params.n_allowed > 0) mask_allowed(s, row, V, e->sample_scratch);
    if (s->params.n_bad > 0) mask_bad_words(s, row);
    const bool hold = holds_stops(s);
    if (hold) {
        for (int i = 0; i < s->params.n_stop_ids; i++) row[s->params.stop_ids[i]] = -INFINITY;
        if (!s->params.ignore_eos)
            for (int i = 0; i < e->n_eog; i++) row[e->eog_ids[i]] = -INFINITY;
    }
    /* the ending tokens alone never empty a row; after a grammar's mask, or the lists, they can */
    if (!masks_tokens(s) && !(hold && s->grammar)) return true;
    for (int t = 0; t < V; t++)
        if (row[t] > -INFINITY) return true;
    return false;
}

/* mask_row, or when nothing is left, ends s as a dead end (with the reason). */
static bool mask_row_or_finish(llmi_engine *e, llmi_seq *s, float *row, engine_token_cb cb, void *cb_ctx) {
    if (mask_row(e, s, row)) return true;
    if (masks_tokens(s))
        snprintf(s->error, sizeof s->error, "after %d generated tokens, %s%s%s leave no token to generate",
                 s->n_tokens - s->n_prompt, s->params.n_allowed ? "allowed_token_ids" : "",
                 s->params.n_allowed && s->params.n_bad ? " and " : "", s->params.n_bad ? "bad_words" : "");
    else
        snprintf(s->error, sizeof s->error, "min_tokens %d: after %d tokens the grammar allows only tokens that end "
                 "the request", s->params.min_tokens, s->n_tokens - s->n_prompt);
    finish_silently(e, s, LLMI_FINISH_GRAMMAR, cb, cb_ctx);
    return false;
}

/* Masks s's row to the tokens its grammar allows next (end-of-generation only when the
 * text is whole, and never with ignore_eos or before min_tokens).  Returns 1 when some token is allowed, 0 when
 * none is: s is then finished, as stop when its text is whole and as grammar otherwise (or
 * when the grammar grew too ambiguous to follow, that request's failure, not the engine's:
 * the reason goes to its info.error). */
static int constrain_row(llmi_engine *e, llmi_seq *s, float *row, engine_token_cb cb, void *cb_ctx) {
    const llmi_model *m = e->model;
    int V = m->cfg.n_vocab;
    llmi_status gst = {0};
    bool allow_eog = !s->params.ignore_eos && s->n_tokens - s->n_prompt >= s->params.min_tokens;
    int n = grammar_state_mask(s->grammar, allow_eog, e->gmask, &gst);
    if (n < 0) {
        snprintf(s->error, sizeof s->error, "%s", gst.msg);
        finish_silently(e, s, LLMI_FINISH_GRAMMAR, cb, cb_ctx);
        return 0;
    }
    if (n == 0) {
        finish_silently(e, s, grammar_state_complete(s->grammar) ? LLMI_FINISH_STOP : LLMI_FINISH_GRAMMAR, cb, cb_ctx);
        return 0;
    }
    for (int t = 0; t < V; t++)
        if (!e->gmask[t]) row[t] = -INFINITY;
    return 1;
}

/* Samples the next token of s on the host from its logits row, then emits it. */
static int sample_and_emit(llmi_engine *e, llmi_seq *s, float *row, engine_token_cb cb, void *cb_ctx, llmi_status *st) {
    int V = e->model->cfg.n_vocab;
    /* Log-probabilities describe the model's distribution before the grammar, penalties and
     * temperature; those edit the row, so keep the raw logits first. */
    if (s->params.logprobs > 0) memcpy(e->raw_logits, row, (size_t)V * sizeof(float));
    if (s->grammar) {
        if (!constrain_row(e, s, row, cb, cb_ctx)) return LLMI_OK;
    }
    if (!mask_row_or_finish(e, s, row, cb, cb_ctx)) return LLMI_OK;
    int32_t tok = s->params.sampling.mirostat
                      ? sampler_sample_mirostat(row, V, &s->params.sampling, &s->mirostat_mu, &s->rng, e->sample_scratch)
                      : sampler_sample(row, V, &s->params.sampling, s->tokens, s->n_tokens, &s->rng, e->sample_scratch);
    if (s->grammar && grammar_state_accept(s->grammar, tok, st)) return st->code;
    emit(e, s, tok, e->raw_logits, cb, cb_ctx);
    return LLMI_OK;
}

/* Gives each running sequence in decode that speculates its proposals for this step, at
 * tokens[n_tokens, n_tokens + n_draft); never so many that accepting them all plus one
 * more token would pass max_total.  Prompt lookup proposes one sequence at a time; the
 * draft model for all of its sequences at once. */
static int propose_drafts(llmi_engine *e, llmi_status *st) {
    if (e->draft.model && e->sched.n_running > e->cap_cands) {
        int cap = e->sched.n_running;
        llmi_seq **nc = realloc(e->cands, (size_t)cap * sizeof *nc);
        if (nc) e->cands = nc;
        int *nk = realloc(e->cand_k, (size_t)cap * sizeof *nk);
        if (nk) e->cand_k = nk;
        if (!nc || !nk) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for %d draft sequences", cap);
        e->cap_cands = cap;
    }
    int n_cands = 0;
    for (int i = 0; i < e->sched.n_running; i++) {
        llmi_seq *s = e->seqs[e->sched.running[i]];
        const llmi_spec_params *sp = &s->params.spec;
        s->n_draft = 0;
        if (sp->mode == LLMI_SPEC_OFF || !seq_in_decode(s)) continue;
        int k = s->max_total - s->n_tokens - 1;
        if (k > sp->k) k = sp->k;
        if (k <= 0) continue;
        if (sp->mode == LLMI_SPEC_NGRAM) {
            s->n_draft = spec_ngram_propose(s->tokens, s->n_tokens, sp->ngram_min, sp->ngram_max, k,
                                            s->tokens + s->n_tokens);
        } else {
            e->cands[n_cands] = s;
            e->cand_k[n_cands++] = k;
        }
    }
    return n_cands > 0 ? spec_draft_propose(&e->draft, e->cands, e->cand_k, n_cands, st) : LLMI_OK;
}

/* Hashes s's blocks that are now full of verified K/V into the prefix cache (and the
 * prompt cache's directory). */
static void commit_blocks(llmi_engine *e, llmi_seq *s) {
    int hashed = s->table.n_hashed;
    kvcache_commit_full(&e->kv, &s->table, s->tokens, s->n_computed);
    if (e->pc) prompt_cache_store(e->pc, &s->table, hashed, s->tokens);
}

/* Verifies s's d proposals against the logit rows from row0 on (row row0 + j is the
 * target's at the position before proposal j), emits the accepted prefix and one token
 * of the target's own (the replacement of the first rejected proposal, or the token after
 * the last one), then rolls the K/V back to what was accepted. */
static int verify_and_emit(llmi_engine *e, llmi_seq *s, int row0, int d, engine_token_cb cb, void *cb_ctx,
                           llmi_step_info *inf, llmi_status *st) {
    const int V = e->model->cfg.n_vocab;
    int32_t draft[LLMI_SPEC_MAX_K];
    memcpy(draft, s->tokens + s->n_tokens, (size_t)d * sizeof *draft);
    int accepted = 0;
    for (int j = 0; j <= d; j++) {
        float *row = e->logits + (size_t)(row0 + j) * V;
        if (s->params.logprobs > 0) memcpy(e->raw_logits, row, (size_t)V * sizeof(float));
        /* The grammar masks each position as the text stands after the tokens accepted
         * before it, so a proposal it forbids has probability 0 and is rejected. */
        if (s->grammar) {
            if (!constrain_row(e, s, row, cb, cb_ctx)) break;
        }
        if (!mask_row_or_finish(e, s, row, cb, cb_ctx)) break;
        bool ok = false;
        int32_t tok = j < d ? sampler_verify_draft(row, V, &s->params.sampling, s->tokens, s->n_tokens, draft[j],
                                                   &s->rng, e->sample_scratch, &ok)
                            : sampler_sample(row, V, &s->params.sampling, s->tokens, s->n_tokens, &s->rng,
                                             e->sample_scratch);
        if (s->grammar && grammar_state_accept(s->grammar, tok, st)) return st->code;
        emit(e, s, tok, e->raw_logits, cb, cb_ctx);
        accepted += ok;
        if (!ok || s->state == SEQ_FINISHED) break;
    }
    s->info.n_spec_steps++;
    s->info.n_spec_proposed += d;
    s->info.n_spec_accepted += accepted;
    inf->n_spec_steps++;
    inf->n_spec_proposed += d;
    inf->n_spec_accepted += accepted;
    s->n_draft = 0;
    if (s->state == SEQ_FINISHED) return LLMI_OK;   /* its blocks are released already */
    /* K/V holds the accepted proposals; the newest token is pending.  Blocks past it held
     * only rejected proposals. */
    s->n_computed = s->n_tokens - 1;
    kvcache_shrink(&e->kv, &s->table, kvcache_blocks_for(&e->kv, s->n_tokens));
    if (e->draft.model) spec_draft_trim(&e->draft, s);
    commit_blocks(e, s);
    return LLMI_OK;
}

/* Device sampling: each logit row's request, with the draw taken from its sequence's rng
 * now, where sampler_sample would take it (once, when temperature > 0), so a request's
 * tokens do not depend on where it is sampled. */
static void fill_sample_rows(llmi_engine *e, const sched_plan *pl, const llmi_batch *batch) {
    size_t V = (size_t)e->model->cfg.n_vocab;
    for (int r = 0; r < batch->n_logits; r++) {
        llmi_seq *s = e->seqs[pl->seq_ids[e->bufs.logit_seq[r]]];
        const llmi_sampling *sp = &s->params.sampling;
        int start = 0, n_win = sampler_penalty_window(sp, s->n_tokens, &start);
        e->rows[r] = (llmi_sample_row){.temperature = sp->temperature, .top_p = sp->top_p, .min_p = sp->min_p,
                                       .repeat_penalty = sp->repeat_penalty, .frequency_penalty = sp->frequency_penalty,
                                       .presence_penalty = sp->presence_penalty, .top_k = sp->top_k,
                                       .uniform = sp->temperature > 0.0f ? sampler_rng_uniform(&s->rng) : 0.0,
                                       .window = s->tokens + start, .n_window = n_win,
                                       .logits = s->params.logprobs > 0 ? e->logits + (size_t)r * V : NULL};
    }
}

void engine_abort_all(llmi_engine *e, engine_token_cb cb, void *cb_ctx) {
    while (engine_has_work(e)) {
        int id = e->sched.n_running > 0 ? e->sched.running[0] : e->sched.waiting[0];
        finish_silently(e, e->seqs[id], LLMI_FINISH_ABORT, cb, cb_ctx);
    }
}

int engine_step(llmi_engine *e, engine_token_cb cb, void *cb_ctx, llmi_step_info *info, llmi_status *st) {
    double t_start = engine_now(e);
    llmi_step_info inf = {0};
    sched_plan *pl = &e->plan;
    if (e->opts.spec_max_k > 0 && propose_drafts(e, st)) return st->code;
    if (sched_plan_step(&e->sched, e->seqs, &e->kv, pl, st)) return st->code;
    /* A sequence that alone exceeds the whole cache ends rather than stalling everyone. */
    for (int i = 0; i < pl->n_dropped; i++)
        finish_silently(e, e->seqs[pl->dropped[i]], LLMI_FINISH_CONTEXT, cb, cb_ctx);
    inf.n_preempted = pl->n_preempted;

    if (pl->n_seqs == 0) {
        if (e->sched.n_waiting > 0 && e->sched.n_running == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: the KV cache (%d blocks) cannot hold the next request",
                             e->kv.num_blocks);
        if (info) *info = inf;
        return LLMI_OK;
    }

    llmi_batch batch;
    sched_build_batch(pl, e->seqs, e->opts.block_size, &e->bufs, &batch);
    /* Verification, grammars and the host-only sampling stages need whole logit rows on
     * the host. */
    bool host_rows = false;
    for (int k = 0; k < pl->n_seqs; k++) {
        const llmi_seq *s = e->seqs[pl->seq_ids[k]];
        host_rows |= s->n_draft > 0 || s->grammar || sampler_needs_host(&s->params.sampling) || holds_stops(s) ||
                     masks_tokens(s) || seq_plp_rows(s, pl->n_new[k]) > 0;
    }
    const bool on_device = e->backend->forward_sample != NULL && !host_rows;
    if (on_device) fill_sample_rows(e, pl, &batch);
    double t_fwd = engine_now(e);
    int rc = on_device ? e->backend->forward_sample(e->backend, &batch, e->rows, e->tokens, st)
                       : e->backend->forward(e->backend, &batch, e->logits, st);
    double t_fwd_end = engine_now(e);
    if (rc) return rc;

    int logit_i = 0;
    for (int k = 0; k < pl->n_seqs; k++) {
        llmi_seq *s = e->seqs[pl->seq_ids[k]];
        int n = pl->n_new[k];
        /* A decode is one generated token fed back; everything else (prompt chunks,
         * recompute after preemption) is prefill work. */
        if (seq_in_decode(s)) {
            inf.n_decode_tokens += n;
            inf.n_decode_seqs++;
        } else {
            inf.n_prefill_tokens += n;
        }
        int plp_rows = seq_plp_rows(s, n);
        if (plp_rows > 0) {
            score_prompt(e, s, logit_i, plp_rows);
            logit_i += plp_rows;
        }
        s->n_computed += n;
        const int had = s->n_tokens;
        if (s->n_draft > 0) {
            int d = s->n_draft;
            if (verify_and_emit(e, s, logit_i, d, cb, cb_ctx, &inf, st)) return st->code;
            inf.n_generated += s->n_tokens - had;
            logit_i += d + 1;
            continue;
        }
        commit_blocks(e, s);
        if (s->n_computed >= s->n_prompt && s->info.t_prefill_done == 0) s->info.t_prefill_done = t_fwd_end;
        if (s->n_computed < s->n_tokens) continue;
        if (s->n_tokens >= s->max_total) {
            /* -n 0, or a prompt that fills the context: nothing to sample. */
            finish_silently(e, s, s->params.max_tokens == 0 ? LLMI_FINISH_LENGTH : LLMI_FINISH_CONTEXT, cb, cb_ctx);
            continue;
        }
        float *row = e->logits + (size_t)logit_i * e->model->cfg.n_vocab;
        if (on_device) emit(e, s, e->tokens[logit_i], row, cb, cb_ctx);
        else if (sample_and_emit(e, s, row, cb, cb_ctx, st)) return st->code;
        inf.n_generated += s->n_tokens - had;
        logit_i++;
    }
    double t_end = engine_now(e);
    inf.n_seqs = pl->n_seqs;
    inf.kv_blocks_used = kvcache_used(&e->kv);
    inf.kv_blocks_total = e->kv.num_blocks;
    inf.seconds = t_end - t_start;
    inf.forward_seconds = t_fwd_end - t_fwd;
    if (e->backend->profiling) {
        op_stats_add(&e->host_stats, LLMI_OP_SAMPLE, t_end - t_fwd_end, (llmi_op_cost){0});
        op_stats_add(&e->host_stats, LLMI_OP_HOST, t_fwd - t_start, (llmi_op_cost){0});
    }
    if (info) *info = inf;
    return LLMI_OK;
}
