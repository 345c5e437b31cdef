/* engine.h — owns the serving loop that every subcommand shares: requests in,
 * continuous batching over a paged KV cache (kvcache.h; the step's plan comes from the
 * scheduler, sched.h) through one backend, sampling (sampler.h), stop rules (stop.h),
 * per-request timings, tokens out through a callback.
 *
 * One engine_step() is one forward pass: it may mix prefill chunks of some sequences
 * with decode tokens of others.  An engine holds no process-wide state, so bench and
 * profile build and tear down as many as they like. */
#ifndef LLMI_ENGINE_H
#define LLMI_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "model/model.h"
#include "engine/sampler.h"
#include "engine/grammar.h"
#include "core/status.h"

typedef enum { SCHED_FIFO = 0, SCHED_PREFILL_FIRST } sched_policy;

typedef struct llmi_engine_opts {
    int block_size;          /* tokens per KV block (--block-size, default 16) */
    int num_blocks;          /* --num-blocks; 0 = from kv_mem_bytes */
    size_t kv_mem_bytes;     /* KV budget when num_blocks is 0; 0 = backend's budget */
    int max_batch_tokens;    /* token budget of one step (--max-batch-tokens) */
    int prefill_chunk;       /* longest prefill piece of one sequence per step; 0 = unlimited */
    int prompt_logprob_rows; /* logit rows one step may spend on prompt logprobs, which bounds
                                the prompt chunk of requests that ask for them (the rows are
                                allocated with the first such request); 0 = 256, at most
                                max_batch_tokens */
    int max_seqs;            /* most sequences running at once */
    sched_policy policy;
    int max_ctx;             /* context length (-c); 0 = the model's */
    bool prefix_cache;       /* reuse the K/V of cached prompt prefixes (default on; --no-prefix-cache) */
    const char *prompt_cache_dir;   /* --prompt-cache DIR: prefix blocks kept across runs, or NULL */
    size_t prompt_cache_max;        /* --prompt-cache-max: bytes DIR may hold; 0 = no cap */
    int spec_max_k;          /* the longest draft any request may carry (sizes the logit rows);
                                0 = no speculation */
    /* --draft-model: the model that proposes for requests with --spec draft, and the backend
     * (of the target's kind, no KV yet) that runs it; borrowed, or NULL.  Its KV pool gets
     * as many blocks as the target's: a byte budget is split in proportion to the two
     * models' bytes per KV block. */
    const llmi_model *draft_model;
    llmi_backend *draft_backend;
} llmi_engine_opts;

llmi_engine_opts engine_opts_defaults(void);
/* "fifo" or "prefill-first", as --sched spells them. */
const char *sched_policy_name(sched_policy p);

typedef enum {
    LLMI_FINISH_NONE = 0, LLMI_FINISH_LENGTH, LLMI_FINISH_EOS, LLMI_FINISH_STOP, LLMI_FINISH_CONTEXT,
    LLMI_FINISH_ABORT,
    LLMI_FINISH_GRAMMAR     /* the grammar allows no token of the vocabulary here (a dead end),
                               or grew too ambiguous to follow, or allowed_ids and bad words
                               leave no token (llmi_request_info.error) */
} llmi_finish;
const char *finish_name(llmi_finish f);

/* Speculative decoding: a decoding sequence carries up to k proposed tokens; one step
 * verifies them all (k + 1 positions in the same batch) and keeps the prefix the exact
 * rule accepts (sampler_verify_draft) plus one token of the target's own.  Proposals come
 * from prompt lookup (ngram) or from a smaller model's greedy decoding (draft, see
 * engine_opts.draft_model). */
typedef enum { LLMI_SPEC_OFF = 0, LLMI_SPEC_NGRAM, LLMI_SPEC_DRAFT } llmi_spec_mode;
#define LLMI_SPEC_MAX_K 32
#define LLMI_SPEC_MAX_NGRAM 64
typedef struct llmi_spec_params {
    llmi_spec_mode mode;            /* --spec */
    int k;                          /* --spec-k: tokens proposed per step, 1..LLMI_SPEC_MAX_K */
    int ngram_min, ngram_max;       /* --spec-ngram: suffix lengths prompt lookup tries, longest first */
} llmi_spec_params;
llmi_spec_params spec_params_defaults(void);
const char *spec_mode_name(llmi_spec_mode m);

#define LLMI_MAX_STOP 8
#define LLMI_MAX_STOP_IDS 32
#define LLMI_MAX_LOGPROBS 20

typedef struct llmi_request_params {
    int max_tokens;                 /* -n: tokens to generate; 0 = prompt only; <0 = until EOS/context */
    llmi_sampling sampling;
    const char *stop[LLMI_MAX_STOP];/* stop strings (borrowed until the request finishes) */
    int n_stop;
    int32_t stop_ids[LLMI_MAX_STOP_IDS];   /* vLLM's stop_token_ids: generating one ends the request
                                       (finish stop; the token is part of the output) */
    int n_stop_ids;
    /* vLLM's min_tokens: the first min_tokens generated tokens cannot end the request but by
     * the length or the context: end-of-generation tokens (unless ignore_eos) and stop_ids
     * are masked out of their rows, and a stop string they complete does not count. */
    int min_tokens;
    bool ignore_eos;
    int logprobs;                   /* 0..LLMI_MAX_LOGPROBS alternatives per generated token */
    /* vLLM's prompt_logprobs: each prompt token's logprob given the tokens before it, and the
     * prompt_top (0..LLMI_MAX_LOGPROBS) most likely tokens there (llmi_request_info).  Every
     * position needs its logit row, so the prompt is computed whole: not taken from the
     * prefix cache (its blocks still go there for others). */
    bool prompt_logprobs;
    int prompt_top;
    llmi_spec_params spec;
    /* Constrained decoding (--grammar, --json-schema): every generated token keeps the text
     * a prefix of a sentence of this grammar, and end-of-generation is allowed only once the
     * text is a whole one.  Borrowed until the request is released; NULL: unconstrained. */
    const struct grammar *grammar;
    /* vLLM's allowed_token_ids: only these ids may be generated (borrowed until the request
     * is released; n_allowed 0: any). */
    const int32_t *allowed_ids;
    int n_allowed;
    /* vLLM's bad_words as token sequences (borrowed): word w is bad_ids[bad_off[w],
     * bad_off[w + 1]); its last token is taken out of a row whenever the tokens generated so
     * far (not the prompt) end with the ones before it, so a one-token word never appears. */
    const int32_t *bad_ids;
    const int32_t *bad_off;         /* (n_bad + 1) */
    int n_bad;
    /* vLLM's skip_special_tokens false: special tokens' text is part of the output text,
     * which stop strings are matched against. */
    bool keep_special;
} llmi_request_params;

llmi_request_params request_params_defaults(void);

/* Delivered for every generated token, in order, per request. */
typedef struct llmi_token_event {
    int request_id;
    void *user;
    int32_t token;
    float logprob;                  /* only when the request asked for logprobs */
    int n_top;
    const int32_t *top_ids;         /* (n_top) */
    const float *top_logprobs;      /* (n_top) */
    bool finished;                  /* this is the request's last event */
    llmi_finish reason;
    bool by_token;                  /* finished by this token itself (end-of-generation or a stop
                                       id), not by the text or a limit: vLLM leaves its text out */
} llmi_token_event;
typedef void (*engine_token_cb)(void *ctx, const llmi_token_event *ev);

/* What the engine remembers of a request until engine_release(). */
typedef struct llmi_request_info {
    int id;
    int n_prompt;
    int n_generated;
    const int32_t *tokens;          /* (n_prompt + n_generated) */
    llmi_finish finish;
    int n_preempted;
    int n_cached_tokens;            /* prompt tokens whose K/V came from the prefix cache */
    double t_arrival, t_first_token, t_finish;   /* seconds, engine clock */
    double t_prefill_done;          /* when the last prompt token's logits were computed */
    long n_spec_steps;              /* steps that verified proposed tokens */
    long n_spec_proposed, n_spec_accepted;   /* proposed tokens verified, and accepted */
    const char *error;              /* why the request ended early (LLMI_FINISH_GRAMMAR), or NULL */
    /* With prompt_logprobs: entry i (1 <= i <= n_prompt_scored) is prompt token i's logprob
     * given tokens 0..i-1, with the prompt_top alternatives there, best first (ties: lower
     * id first); entry 0 has nothing before it (NaN).  Complete (n_prompt_scored ==
     * n_prompt - 1) once the prompt is computed; NULL without prompt_logprobs. */
    const float *prompt_logprobs;       /* (n_prompt) */
    const int32_t *prompt_top_ids;      /* (n_prompt, prompt_top) */
    const float *prompt_top_logprobs;   /* (n_prompt, prompt_top) */
    int prompt_top, n_prompt_scored;
} llmi_request_info;

typedef struct llmi_step_info {
    int n_prefill_tokens, n_decode_tokens, n_seqs;
    int n_decode_seqs;              /* sequences past their prompt, each decoding (or verifying) */
    int n_preempted;                /* sequences preempted during this step's planning */
    int n_generated;                /* tokens delivered this step (a verification step may deliver
                                       several per sequence) */
    int n_spec_steps;               /* sequences that verified proposals this step */
    int n_spec_proposed, n_spec_accepted;    /* proposed tokens verified this step, and accepted */
    int kv_blocks_used, kv_blocks_total;
    double seconds;                 /* wall time of the whole step */
    double forward_seconds;
} llmi_step_info;

typedef struct llmi_engine llmi_engine;

int engine_create(const llmi_model *m, llmi_backend *b, const llmi_engine_opts *o, llmi_engine **out,
                  llmi_status *st);
void engine_destroy(llmi_engine *e);
/* The options the engine was created with (the draft model and backend its creator lent). */
const llmi_engine_opts *engine_options(const llmi_engine *e);

/* Queues a request; arrival time is now.  Fails (that request only) when the prompt
 * alone cannot fit the context or the whole KV cache. */
int engine_add_request(llmi_engine *e, const int32_t *prompt, int n_prompt, const llmi_request_params *p,
                       void *user, int *id, llmi_status *st);
bool engine_has_work(const llmi_engine *e);
/* Runs one scheduling step and forward pass; calls cb for each token sampled. */
int engine_step(llmi_engine *e, engine_token_cb cb, void *cb_ctx, llmi_step_info *info, llmi_status *st);
/* Stops every unfinished request (finish reason abort), e.g. on Ctrl-C. */
void engine_abort_all(llmi_engine *e, engine_token_cb cb, void *cb_ctx);
const llmi_request_info *engine_request(const llmi_engine *e, int id);
void engine_release(llmi_engine *e, int id);
double engine_now(const llmi_engine *e);
int engine_kv_blocks_total(const llmi_engine *e);
int engine_kv_blocks_peak(const llmi_engine *e);
/* Time the engine itself spent in profiled steps (backend->profiling): scheduling and
 * batch building as LLMI_OP_HOST, sampling and stop rules as LLMI_OP_SAMPLE.  The
 * backend's own op classes are in backend->stats. */
const llmi_op_stats *engine_host_stats(const llmi_engine *e);

#endif
