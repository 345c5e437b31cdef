/* engine.c — continuous batching over the paged KV cache (see engine.h).
 *
 * Each step the scheduler walks sequences in priority order and gives each a piece of
 * work: one decode token, or the next chunk of its prompt (prefill).  A sequence's
 * pending tokens are those whose KV is not cached yet; when a step consumes the last
 * pending token, that token's logits are computed and the next token is sampled.
 * Preemption is by recompute: the victim's blocks are freed and it re-enters the
 * waiting queue with all its tokens pending, so it re-prefills prompt + output later;
 * its per-request RNG only advances on draws, so its output does not change. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kvcache.h"
#include "tok/tokenizer.h"

typedef enum { SEQ_WAITING = 0, SEQ_RUNNING, SEQ_FINISHED } seq_state;

typedef struct seq {
    int id;
    seq_state state;
    void *user;
    llmi_request_params params;
    int32_t *tokens;          /* (cap) prompt then generated tokens */
    int n_prompt, n_tokens, cap;
    int n_computed;           /* leading tokens whose K/V are in the cache */
    int max_total;            /* n_tokens may not exceed this (context and -n) */
    kvcache_table table;
    sampler_rng rng;
    llmi_request_info info;
    tok_stream stream;        /* only with stop strings: decoded output for matching */
    char *text;               /* (text_cap) decoded output so far */
    size_t text_len, text_cap;
    long order;               /* arrival order, the FIFO key */
} seq;

struct llmi_engine {
    const llmi_model *model;
    llmi_backend *backend;
    llmi_engine_opts opts;
    kvcache kv;
    int max_ctx;
    int max_blocks_per_seq;
    struct timespec t0;

    seq **seqs;               /* (n_seq_slots) indexed by request id; NULL once released */
    int n_seq_slots, cap_seq_slots;
    int *waiting;             /* (cap_seq_slots) ids, front first */
    int n_waiting;
    int *running;             /* (cap_seq_slots) ids in admission order */
    int n_running;
    long next_order;

    /* Step workspace, sized once from the options. */
    int32_t *b_tokens, *b_positions, *b_slots, *b_seq_of; /* (max_batch_tokens) */
    int32_t *b_query_start;   /* (max_seqs + 1) */
    int32_t *b_context_lens;  /* (max_seqs) */
    int32_t *b_block_tables;  /* (max_seqs, max_blocks_per_seq) */
    int32_t *b_logit_rows;    /* (max_seqs) */
    int *b_seq_ids;           /* (max_seqs) which request each batch sequence is */
    int *b_n_new;             /* (max_seqs) tokens of that request in the batch */
    float *logits;            /* (max_seqs, n_vocab) */
    void *sample_scratch;     /* sampler_scratch_bytes(n_vocab) */
    float *raw_logits;        /* (n_vocab) unpenalised copy of a row, for --logprobs */
};

llmi_engine_opts engine_opts_defaults(void) {
    llmi_engine_opts o = {.block_size = 16, .num_blocks = 0, .kv_mem_bytes = 0, .max_batch_tokens = 2048,
                          .prefill_chunk = 0, .max_seqs = 256, .policy = SCHED_FIFO, .max_ctx = 0};
    return o;
}

llmi_request_params request_params_defaults(void) {
    llmi_request_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = -1;
    p.sampling = sampling_defaults();
    return p;
}

const char *finish_name(llmi_finish f) {
    switch (f) {
    case LLMI_FINISH_LENGTH: return "length";
    case LLMI_FINISH_EOS: return "eos";
    case LLMI_FINISH_STOP: return "stop";
    case LLMI_FINISH_CONTEXT: return "context";
    case LLMI_FINISH_ABORT: return "abort";
    default: return "none";
    }
}

double engine_now(const llmi_engine *e) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - e->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - e->t0.tv_nsec);
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
    if (opts.max_seqs > opts.max_batch_tokens) opts.max_seqs = opts.max_batch_tokens;
    int max_ctx = opts.max_ctx > 0 ? opts.max_ctx : m->cfg.max_ctx;
    if (max_ctx <= 0) max_ctx = 4096;
    if (opts.max_ctx > 0 && m->cfg.max_ctx > 0 && opts.max_ctx > m->cfg.max_ctx)
        return llmi_fail(st, LLMI_E_USAGE, "-c: %d exceeds the model's context length %d", opts.max_ctx,
                         m->cfg.max_ctx);

    int max_blocks_per_seq = (max_ctx + opts.block_size - 1) / opts.block_size;
    int num_blocks = opts.num_blocks;
    if (num_blocks < 0) return llmi_fail(st, LLMI_E_USAGE, "--num-blocks: must be positive (got %d)", num_blocks);
    if (num_blocks == 0) {
        size_t per_block = b->kv_block_bytes(b);
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
    e->max_blocks_per_seq = max_blocks_per_seq;
    clock_gettime(CLOCK_MONOTONIC, &e->t0);
    if (kvcache_init(&e->kv, num_blocks, opts.block_size, st)) goto fail;
    if (b->kv_alloc(b, num_blocks, st)) goto fail;

    size_t T = (size_t)opts.max_batch_tokens, S = (size_t)opts.max_seqs, V = (size_t)m->cfg.n_vocab;
    e->b_tokens = malloc(T * sizeof(int32_t));
    e->b_positions = malloc(T * sizeof(int32_t));
    e->b_slots = malloc(T * sizeof(int32_t));
    e->b_seq_of = malloc(T * sizeof(int32_t));
    e->b_query_start = malloc((S + 1) * sizeof(int32_t));
    e->b_context_lens = malloc(S * sizeof(int32_t));
    e->b_block_tables = malloc(S * (size_t)max_blocks_per_seq * sizeof(int32_t));
    e->b_logit_rows = malloc(S * sizeof(int32_t));
    e->b_seq_ids = malloc(S * sizeof(int));
    e->b_n_new = malloc(S * sizeof(int));
    e->logits = malloc(S * V * sizeof(float));
    e->sample_scratch = malloc(sampler_scratch_bytes((int)V));
    e->raw_logits = malloc(V * sizeof(float));
    if (!e->b_tokens || !e->b_positions || !e->b_slots || !e->b_seq_of || !e->b_query_start || !e->b_context_lens ||
        !e->b_block_tables || !e->b_logit_rows || !e->b_seq_ids || !e->b_n_new || !e->logits || !e->sample_scratch || !e->raw_logits) {
        llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for step buffers (%zu sequences x %zu vocab)", S, V);
        goto fail;
    }
    *out = e;
    return LLMI_OK;
fail:
    engine_destroy(e);
    return st->code ? st->code : LLMI_E_RUNTIME;
}

static void seq_free(seq *s) {
    if (!s) return;
    free(s->tokens);
    free(s->text);
    kvcache_table_free(&s->table);
    free(s);
}

void engine_destroy(llmi_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->n_seq_slots; i++) seq_free(e->seqs[i]);
    free(e->seqs);
    free(e->waiting);
    free(e->running);
    kvcache_free(&e->kv);
    free(e->b_tokens);
    free(e->b_positions);
    free(e->b_slots);
    free(e->b_seq_of);
    free(e->b_query_start);
    free(e->b_context_lens);
    free(e->b_block_tables);
    free(e->b_logit_rows);
    free(e->b_seq_ids);
    free(e->b_n_new);
    free(e->logits);
    free(e->sample_scratch);
    free(e->raw_logits);
    free(e);
}

int engine_kv_blocks_total(const llmi_engine *e) { return e->kv.num_blocks; }
int engine_kv_blocks_peak(const llmi_engine *e) { return e->kv.peak_used; }
int engine_max_ctx(const llmi_engine *e) { return e->max_ctx; }

bool engine_has_work(const llmi_engine *e) { return e->n_waiting > 0 || e->n_running > 0; }

const llmi_request_info *engine_request(const llmi_engine *e, int id) {
    if (id < 0 || id >= e->n_seq_slots || !e->seqs[id]) return NULL;
    seq *s = e->seqs[id];
    s->info.tokens = s->tokens;
    s->info.n_prompt = s->n_prompt;
    s->info.n_generated = s->n_tokens - s->n_prompt;
    return &s->info;
}

static void remove_id(int *list, int *n, int id) {
    for (int i = 0; i < *n; i++)
        if (list[i] == id) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
}

void engine_release(llmi_engine *e, int id) {
    if (id < 0 || id >= e->n_seq_slots || !e->seqs[id]) return;
    seq *s = e->seqs[id];
    remove_id(e->waiting, &e->n_waiting, id);
    remove_id(e->running, &e->n_running, id);
    kvcache_release(&e->kv, &s->table);
    seq_free(s);
    e->seqs[id] = NULL;
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
    int32_t n_vocab = e->model->cfg.n_vocab;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab)
            return llmi_fail(st, LLMI_E_USAGE, "request: token id %d at position %d is outside the vocabulary (%d)",
                             prompt[i], i, n_vocab);
    if (e->n_seq_slots == e->cap_seq_slots) {
        int cap = e->cap_seq_slots ? 2 * e->cap_seq_slots : 64;
        seq **ns = realloc(e->seqs, (size_t)cap * sizeof *ns);
        if (!ns) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for requests");
        e->seqs = ns;
        int *nw = realloc(e->waiting, (size_t)cap * sizeof *nw);
        if (!nw) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for requests");
        e->waiting = nw;
        int *nr = realloc(e->running, (size_t)cap * sizeof *nr);
        if (!nr) return llmi_fail(st, LLMI_E_RUNTIME, "engine: out of memory for requests");
        e->running = nr;
        e->cap_seq_slots = cap;
    }
    seq *s = calloc(1, sizeof *s);
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
    s->id = e->n_seq_slots;
    s->state = SEQ_WAITING;
    s->user = user;
    s->params = *p;
    s->n_prompt = s->n_tokens = n_prompt;
    s->max_total = max_total;
    s->order = e->next_order++;
    sampler_rng_seed(&s->rng, p->sampling.seed);
    s->info.id = s->id;
    s->info.t_arrival = engine_now(e);
    if (p->n_stop > 0 && e->model->tok) tok_stream_init(&s->stream, e->model->tok, true);
    e->seqs[e->n_seq_slots++] = s;
    e->waiting[e->n_waiting++] = s->id;
    *id = s->id;
    return LLMI_OK;
}

/* Frees the victim's KV and puts it at the front of the waiting queue. */
static void preempt(llmi_engine *e, seq *v) {
    kvcache_release(&e->kv, &v->table);
    v->n_computed = 0;
    v->state = SEQ_WAITING;
    v->info.n_preempted++;
    remove_id(e->running, &e->n_running, v->id);
    /* Keep the waiting queue in arrival order so the oldest work resumes first. */
    int pos = 0;
    while (pos < e->n_waiting && e->seqs[e->waiting[pos]]->order < v->order) pos++;
    memmove(e->waiting + pos + 1, e->waiting + pos, (size_t)(e->n_waiting - pos) * sizeof(int));
    e->waiting[pos] = v->id;
    e->n_waiting++;
}

typedef struct plan {
    int n_tokens, n_seqs, n_preempted;
} plan;

/* Tokens this sequence would like to process this step, before budgets. */
static int seq_want(const llmi_engine *e, const seq *s) {
    int pending = s->n_tokens - s->n_computed;
    if (pending > 1 && e->opts.prefill_chunk > 0 && pending > e->opts.prefill_chunk) pending = e->opts.prefill_chunk;
    return pending;
}

/* Adds up to `want` tokens of s to the plan, reserving KV (preempting later-admitted
 * sequences when allowed); returns tokens added, 0 if s must wait this step, -1 when s
 * cannot fit even with the whole cache to itself. */
static int plan_take(llmi_engine *e, plan *pl, seq *s, int budget, bool may_preempt) {
    int n = seq_want(e, s);
    if (n > budget) n = budget;
    if (n <= 0 || pl->n_seqs >= e->opts.max_seqs) return 0;
    while (kvcache_reserve(&e->kv, &s->table, s->n_computed + n) != 0) {
        if (!may_preempt) return 0;
        /* Victim: the most recently admitted running sequence not already in this batch. */
        seq *victim = NULL;
        for (int i = e->n_running - 1; i >= 0; i--) {
            seq *c = e->seqs[e->running[i]];
            bool in_batch = false;
            for (int j = 0; j < pl->n_seqs; j++) in_batch |= e->b_seq_ids[j] == c->id;
            if (c != s && !in_batch) { victim = c; break; }
        }
        if (!victim) {
            /* Everyone else holding blocks is in this batch: wait for them to finish,
             * unless s could not fit even with the whole cache to itself. */
            return kvcache_blocks_for(&e->kv, s->n_computed + n) > e->kv.num_blocks ? -1 : 0;
        }
        preempt(e, victim);
        pl->n_preempted++;
    }
    int k = pl->n_seqs++;
    e->b_seq_ids[k] = s->id;
    e->b_n_new[k] = n;
    pl->n_tokens += n;
    return n;
}

static void build_batch(llmi_engine *e, const plan *pl, llmi_batch *b) {
    int t = 0, n_logits = 0, bs = e->opts.block_size;
    for (int k = 0; k < pl->n_seqs; k++) {
        seq *s = e->seqs[e->b_seq_ids[k]];
        int n = e->b_n_new[k];
        e->b_query_start[k] = t;
        for (int i = 0; i < n; i++, t++) {
            int pos = s->n_computed + i;
            e->b_tokens[t] = s->tokens[pos];
            e->b_positions[t] = pos;
            e->b_slots[t] = s->table.blocks[pos / bs] * bs + pos % bs;
            e->b_seq_of[t] = k;
        }
        e->b_context_lens[k] = s->n_computed + n;
        int32_t *row = e->b_block_tables + (size_t)k * e->max_blocks_per_seq;
        memcpy(row, s->table.blocks, (size_t)s->table.n_blocks * sizeof(int32_t));
        for (int i = s->table.n_blocks; i < e->max_blocks_per_seq; i++) row[i] = -1;
        /* Logits only where a token will be sampled: the last pending token of a sequence
         * that still has tokens to generate. */
        if (s->n_computed + n == s->n_tokens && s->n_tokens < s->max_total) e->b_logit_rows[n_logits++] = t - 1;
    }
    e->b_query_start[pl->n_seqs] = t;
    *b = (llmi_batch){.n_tokens = t, .tokens = e->b_tokens, .positions = e->b_positions, .slot_mapping = e->b_slots,
                      .seq_of_token = e->b_seq_of, .n_seqs = pl->n_seqs, .query_start = e->b_query_start,
                      .context_lens = e->b_context_lens, .block_tables = e->b_block_tables,
                      .max_blocks_per_seq = e->max_blocks_per_seq, .n_logits = n_logits,
                      .logit_rows = e->b_logit_rows};
}

static void finish_seq(llmi_engine *e, seq *s, llmi_finish why) {
    s->state = SEQ_FINISHED;
    s->info.finish = why;
    s->info.t_finish = engine_now(e);
    remove_id(e->running, &e->n_running, s->id);
    remove_id(e->waiting, &e->n_waiting, s->id);
    kvcache_release(&e->kv, &s->table);
}

static bool text_append(seq *s, const char *p, int n) {
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

/* True when the newest text completes a stop string (searched only near the end). */
static bool hits_stop(seq *s, int n_new_bytes) {
    for (int i = 0; i < s->params.n_stop; i++) {
        const char *stop = s->params.stop[i];
        size_t sl = strlen(stop);
        if (sl == 0 || sl > s->text_len) continue;
        size_t from = s->text_len >= sl + (size_t)n_new_bytes ? s->text_len - sl - (size_t)n_new_bytes : 0;
        if (memmem(s->text + from, s->text_len - from, stop, sl)) return true;
    }
    return false;
}

/* Samples the next token of s from its logits row and applies the stop rules. */
static void sample_and_emit(llmi_engine *e, seq *s, float *row, engine_token_cb cb, void *cb_ctx) {
    const llmi_model *m = e->model;
    int V = m->cfg.n_vocab;
    llmi_token_event ev = {.request_id = s->id, .user = s->user};
    int32_t top_ids[LLMI_MAX_LOGPROBS];
    float top_lp[LLMI_MAX_LOGPROBS];
    /* Log-probabilities describe the model's distribution before penalties and
     * temperature; sampling edits the row, so keep the raw logits first. */
    if (s->params.logprobs > 0) memcpy(e->raw_logits, row, (size_t)V * sizeof(float));
    int32_t tok = sampler_sample(row, V, &s->params.sampling, s->tokens, s->n_tokens, &s->rng, e->sample_scratch);
    if (s->params.logprobs > 0) {
        ev.n_top = s->params.logprobs;
        ev.logprob = sampler_logprob(e->raw_logits, V, tok, ev.n_top, top_ids, top_lp);
        ev.top_ids = top_ids;
        ev.top_logprobs = top_lp;
    }
    s->tokens[s->n_tokens++] = tok;
    double now = engine_now(e);
    if (s->n_tokens - s->n_prompt == 1) s->info.t_first_token = now;
    ev.token = tok;

    llmi_finish why = LLMI_FINISH_NONE;
    if (!s->params.ignore_eos && m->tok && tok_is_eog(m->tok, tok)) why = LLMI_FINISH_EOS;
    if (why == LLMI_FINISH_NONE && s->params.n_stop > 0 && m->tok) {
        size_t cap = tok_stream_cap(m->tok);
        char *buf = malloc(cap);
        int n = buf ? tok_stream_push(&s->stream, tok, buf, cap) : 0;
        if (!buf || !text_append(s, buf, n) || hits_stop(s, n)) why = LLMI_FINISH_STOP;
        free(buf);
    }
    if (why == LLMI_FINISH_NONE && s->n_tokens >= s->max_total)
        why = (s->params.max_tokens >= 0 && s->n_tokens - s->n_prompt >= s->params.max_tokens) ? LLMI_FINISH_LENGTH
                                                                                             : LLMI_FINISH_CONTEXT;
    if (why != LLMI_FINISH_NONE) {
        finish_seq(e, s, why);
        ev.finished = true;
        ev.reason = why;
    }
    if (cb) cb(cb_ctx, &ev);
}

void engine_abort_all(llmi_engine *e, engine_token_cb cb, void *cb_ctx) {
    while (e->n_running > 0 || e->n_waiting > 0) {
        int id = e->n_running > 0 ? e->running[0] : e->waiting[0];
        seq *s = e->seqs[id];
        finish_seq(e, s, LLMI_FINISH_ABORT);
        llmi_token_event ev = {.request_id = id, .user = s->user, .token = -1, .finished = true,
                               .reason = LLMI_FINISH_ABORT};
        if (cb) cb(cb_ctx, &ev);
    }
}

int engine_step(llmi_engine *e, engine_token_cb cb, void *cb_ctx, llmi_step_info *info, llmi_status *st) {
    double t_start = engine_now(e);
    plan pl = {0};
    int budget = e->opts.max_batch_tokens;
    llmi_step_info inf = {0};

    /* Which running sequences get work, in order.  Prefill-first serves sequences still
     * in their prompt (and new admissions) before decodes; FIFO serves by age. */
    for (int pass = 0; pass < 2; pass++) {
        bool want_prefill = pass == 0;
        if (e->opts.policy == SCHED_FIFO && pass == 1) break;
        for (int i = 0; i < e->n_running && budget > 0; i++) {
            seq *s = e->seqs[e->running[i]];
            bool in_prefill = s->n_tokens - s->n_computed > 1;
            if (e->opts.policy == SCHED_PREFILL_FIRST && in_prefill != want_prefill) continue;
            bool already = false;
            for (int j = 0; j < pl.n_seqs; j++) already |= e->b_seq_ids[j] == s->id;
            if (already) continue;
            int got = plan_take(e, &pl, s, budget, true);
            if (got < 0) {
                /* It alone exceeds the whole cache: end it rather than stall everyone. */
                finish_seq(e, s, LLMI_FINISH_CONTEXT);
                llmi_token_event ev = {.request_id = s->id, .user = s->user, .token = -1, .finished = true,
                                       .reason = LLMI_FINISH_CONTEXT};
                if (cb) cb(cb_ctx, &ev);
                i--;
                continue;
            }
            budget -= got;
            /* Preemption may have shifted the running list: find s again. */
            for (int j = 0; j < e->n_running; j++)
                if (e->running[j] == s->id) i = j;
        }
        if (pass == 0) {
            /* Admit waiting sequences in arrival order while blocks, seats and tokens allow. */
            while (e->n_waiting > 0 && budget > 0 && pl.n_seqs < e->opts.max_seqs) {
                seq *s = e->seqs[e->waiting[0]];
                int got = plan_take(e, &pl, s, budget, false);
                if (got <= 0) break;
                budget -= got;
                remove_id(e->waiting, &e->n_waiting, s->id);
                s->state = SEQ_RUNNING;
                e->running[e->n_running++] = s->id;
            }
        }
    }
    inf.n_preempted = pl.n_preempted;

    if (pl.n_seqs == 0) {
        if (e->n_waiting > 0 && e->n_running == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: the KV cache (%d blocks) cannot hold the next request",
                             e->kv.num_blocks);
        if (info) *info = inf;
        return LLMI_OK;
    }

    llmi_batch batch;
    build_batch(e, &pl, &batch);
    double t_fwd = engine_now(e);
    int rc = e->backend->forward(e->backend, &batch, e->logits, st);
    double t_fwd_end = engine_now(e);
    if (rc) return rc;

    int logit_i = 0;
    for (int k = 0; k < pl.n_seqs; k++) {
        seq *s = e->seqs[e->b_seq_ids[k]];
        int n = e->b_n_new[k];
        /* A decode is one generated token fed back; everything else (prompt chunks,
         * recompute after preemption) is prefill work. */
        bool is_decode = n == 1 && s->n_computed == s->n_tokens - 1 && s->n_tokens > s->n_prompt;
        if (is_decode) inf.n_decode_tokens += n; else inf.n_prefill_tokens += n;
        s->n_computed += n;
        if (s->n_computed >= s->n_prompt && s->info.t_prefill_done == 0) s->info.t_prefill_done = t_fwd_end;
        if (s->n_computed < s->n_tokens) continue;
        if (s->n_tokens >= s->max_total) {
            /* -n 0, or a prompt that fills the context: nothing to sample. */
            finish_seq(e, s, s->params.max_tokens == 0 ? LLMI_FINISH_LENGTH : LLMI_FINISH_CONTEXT);
            llmi_token_event ev = {.request_id = s->id, .user = s->user, .token = -1, .finished = true,
                                   .reason = s->info.finish};
            if (cb) cb(cb_ctx, &ev);
            continue;
        }
        sample_and_emit(e, s, e->logits + (size_t)logit_i * e->model->cfg.n_vocab, cb, cb_ctx);
        logit_i++;
    }
    double t_end = engine_now(e);
    inf.n_seqs = pl.n_seqs;
    inf.kv_blocks_used = kvcache_used(&e->kv);
    inf.kv_blocks_total = e->kv.num_blocks;
    inf.seconds = t_end - t_start;
    inf.forward_seconds = t_fwd_end - t_fwd;
    if (e->backend->profiling) {
        e->backend->stats.seconds[LLMI_OP_SAMPLE] += t_end - t_fwd_end;
        e->backend->stats.calls[LLMI_OP_SAMPLE]++;
        e->backend->stats.seconds[LLMI_OP_HOST] += t_fwd - t_start;
        e->backend->stats.calls[LLMI_OP_HOST]++;
    }
    if (info) *info = inf;
    return LLMI_OK;
}
