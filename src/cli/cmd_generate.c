/* cmd_generate.c — `llmi generate`: one prompt streamed to stdout, or many prompts
 * (--prompts FILE) served together by continuous batching; stats on stderr, or one
 * JSON object per request with --json. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/bench_util.h"
#include "cli/cli.h"
#include "cli/prompts.h"
#include "core/fileio.h"
#include "core/jsonw.h"
#include "engine/dry.h"
#include "engine/stop.h"
#include "tok/tokenizer.h"

typedef struct gen_request {
    int index;                       /* position in the input; with sample, the output order */
    int sample;                      /* which of the prompt's --samples / "n" completions */
    bool shares_input;               /* sample > 0: the prompt text, stop strings, grammar, bias and
                                        breakers are sample 0's (freed with it) */
    char *prompt;                    /* the text as given (before chat formatting) */
    int32_t *prompt_ids;             /* (n_prompt) */
    int n_prompt;
    llmi_request_params params;
    char *stops[LLMI_MAX_STOP];      /* owned copies behind params.stop */
    bool own_seed;                   /* its --prompts line gave "seed" */
    grammar *own_grammar;            /* its --prompts line's grammar, behind params.grammar */
    llmi_logit_bias *own_bias;       /* its --prompts line's logit_bias, behind params.sampling */
    char **own_breakers;             /* its --prompts line's dry_sequence_breakers, behind params.sampling */
    char *system;                    /* its --prompts line's "messages": the system message or NULL, */
    char **turns;                    /* (n_turns) and user, assistant, ..., user */
    int n_turns;
    int32_t *given_ids;              /* (n_given) its --prompts line's "prompt_token_ids", or NULL */
    int n_given;
    int32_t *own_allowed;            /* its --prompts line's "allowed_token_ids", behind params */
    char **bad_words;                /* (n_bad_words) its --prompts line's "bad_words" */
    int n_bad_words;
    int32_t *bad_ids, *bad_off;      /* the bad words' token sequences behind params (this
                                        request's own, samples too) */
    bool include_stop;               /* "include_stop_str_in_output" */
    int truncate;                    /* "truncate_prompt_tokens": the prompt's last N tokens; 0 = all */
    int engine_id;                   /* -1 when the request was refused */
    char *error;                     /* why it was refused */
    /* output */
    tok_stream stream;
    char *text;                      /* (text_cap) decoded output */
    size_t text_len, text_cap, printed;
    int32_t *gen_ids;                /* (cap_gen) generated ids */
    float *lp;                       /* (cap_gen) logprob of each generated id */
    int32_t *top_ids;                /* (cap_gen, logprobs) */
    float *top_lp;                   /* (cap_gen, logprobs) */
    int n_gen, cap_gen;
    /* prompt logprobs, copied from the engine when the request ends: entries 1..n_scored */
    float *plp;                      /* (n_prompt) */
    int32_t *plp_top_ids;            /* (n_prompt, params.prompt_top) */
    float *plp_top_lp;               /* (n_prompt, params.prompt_top) */
    int n_scored;
    bool done, emitted;
    llmi_finish finish;
    double ttft, latency, prefill_s; /* seconds */
    size_t stop_after;               /* text bytes of the first min_tokens tokens: a stop string
                                        completed within them did not stop the request */
    int n_preempted;
    int n_cached;                    /* prompt tokens served from the prefix cache */
    long spec_steps, spec_proposed, spec_accepted;   /* speculation: verification steps, proposals */
} gen_request;

typedef struct gen_opts {
    const char *prompt, *prompt_file, *prompts_file, *system;
    const char *grammar_flag, *grammar_value;   /* the one of --grammar, --grammar-file, -j,
                                                   --json-schema-file given, and its value */
    bool chat, json, verbose_prompt, no_stats;
    bool conversation;               /* -cnv: turns from stdin, one request each on the tokens so far */
    int samples;                     /* --samples: completions of each prompt (a line's "n" wins) */
    llmi_request_params params;
    bool seed_given;
    llmi_logit_bias *bias;           /* (n_bias) --logit-bias, behind params.sampling.logit_bias */
    int n_bias, cap_bias;
    const char *breakers[DRY_MAX_BREAKERS];   /* --dry-sequence-breaker values (argv's) */
} gen_opts;

typedef struct gen_ctx {
    llmi_engine *engine;
    gen_request *reqs;               /* (n_reqs) */
    int n_reqs;
    const tokenizer *tok;
    bool stream_out;                 /* single prompt, plain text: print as tokens arrive */
    bool json;
    int next_emit;                   /* requests are emitted in input order */
    int out_errno;                   /* stdout failed (disk full, closed pipe): its errno */
    bool oom;                        /* an output could not be kept */
    int n_failed_late;               /* requests that failed after they were admitted (a grammar) */
    int *finished;                   /* (n_reqs) engine ids finished in this step, to release */
    int n_finished;
    bool keep_ids;                   /* emitting leaves gen_ids (a conversation builds the next turn on them) */
} gen_ctx;

static const char *gen_help =
    "usage: llmi generate [options]\n"
    "Generates text from a prompt given with -p, -f, --prompts, or on stdin.\n"
    "Prompt and output:\n"
    "  -p, --prompt TEXT       the prompt\n"
    "  -f, --file FILE         read the prompt from FILE ('-' = stdin)\n"
    "  --prompts FILE          many prompts, one per line; a line starting with '{' is JSON with\n"
    "                          \"prompt\" and optional max_tokens, temperature, top_k, top_p, min_p,\n"
    "                          typical_p, top_n_sigma, xtc_probability, xtc_threshold,\n"
    "                          repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n,\n"
    "                          logit_bias ({\"id\": bias} or [[id, bias]]; false bans), dry_multiplier,\n"
    "                          dry_base, dry_allowed_length, dry_penalty_last_n,\n"
    "                          dry_sequence_breakers, seed, stop,\n"
    "                          ignore_eos, logprobs, spec, spec_k, spec_ngram_min, spec_ngram_max,\n"
    "                          grammar, json_schema, n, min_tokens, stop_token_ids, mirostat,\n"
    "                          mirostat_tau, mirostat_eta, prompt_logprobs, allowed_token_ids,\n"
    "                          bad_words, include_stop_str_in_output, skip_special_tokens,\n"
    "                          truncate_prompt_tokens; served together.\n"
    "                          Instead of \"prompt\", \"messages\": OpenAI's [{\"role\", \"content\"},\n"
    "                          ...] (system first, then user/assistant alternating, ending with\n"
    "                          user) in the chat template, or \"prompt_token_ids\": [id, ...] as given\n"
    "  --chat                  format the prompt with the model's chat template\n"
    "  -cnv, --conversation    chat: each line of stdin is a user turn ('\\' at the end goes on to\n"
    "                          the next line), answered on the conversation so far (its K/V\n"
    "                          reused from the prefix cache); ends at end of input\n"
    "  --system TEXT           system message for --chat, and for --prompts \"messages\" lines without one\n"
    "  -n, --n-predict N       tokens to generate (default 128; 0 = prompt only; -1 = until EOS/context)\n"
    "  --stop STR              stop when the output contains STR (repeatable, up to 8)\n"
    "  --ignore-eos            keep generating past end-of-generation tokens\n"
    "  --stop-token-id ID      stop when token ID is generated (vLLM's stop_token_ids; it stays in\n"
    "                          \"tokens\", not in the text; repeatable, up to 32)\n"
    "  -sp, --special          special tokens' text is part of the output (llama.cpp's flag; vLLM's\n"
    "                          skip_special_tokens false)\n"
    "  --min-tokens N          the first N tokens cannot end the request (vLLM's min_tokens):\n"
    "                          end-of-generation and --stop-token-id tokens are masked out, stop\n"
    "                          strings they complete do not count (default 0)\n"
    "  --samples N             N completions of each prompt (vLLM's n; default 1): sample j is\n"
    "                          seeded seed + j, and the prompt is computed once (the others\n"
    "                          wait a step for its K/V in the prefix cache)\n"
    "  --json                  one JSON object per request on stdout (index, sample, text, token\n"
    "                          counts, finish reason, ttft_ms, latency_ms, prompt_ids, tokens)\n"
    "  --logprobs N            add each generated token's logprob and the top N (<= 20) to --json\n"
    "  --prompt-logprobs N     add each prompt token's logprob given the tokens before it and the\n"
    "                          top N (0..20) there to --json (vLLM's prompt_logprobs; the prompt\n"
    "                          is then computed whole, not taken from the prefix cache)\n"
    "  --verbose-prompt        print the prompt's token ids and pieces to stderr\n"
    "  --no-stats              do not print stats to stderr\n"
    "Sampling (llama.cpp's defaults and order: logit bias, penalties, DRY, top-n-sigma, top-k,\n"
    "typical, top-p, min-p, XTC, temperature):\n"
    "  --temp T                temperature (default 0.8; 0 = greedy)\n"
    "  --top-k N               (default 40; 0 = off)\n"
    "  --top-p P               (default 0.95; 1 = off)\n"
    "  --min-p P               (default 0.05; 0 = off)\n"
    "  --typical P             locally typical sampling (default 1 = off)\n"
    "  --top-nsigma N          keep logits within N standard deviations of the best (default -1 = off)\n"
    "  --xtc-probability P     how often XTC removes the top choices (default 0 = off)\n"
    "  --xtc-threshold T       the probability that makes a token a top choice (default 0.1; > 0.5 = off)\n"
    "  --repeat-penalty P      (default 1.0 = off)\n"
    "  --frequency-penalty F   subtracted per occurrence in the window (default 0 = off)\n"
    "  --presence-penalty F    subtracted once for a token in the window (default 0 = off)\n"
    "  --repeat-last-n N       tokens the three penalties look back over (default 64; -1 = all)\n"
    "  --dry-multiplier M      DRY: penalise tokens that would extend a repeat of the recent text\n"
    "                          by M x base^(length - allowed) (default 0 = off)\n"
    "  --dry-base B            (default 1.75)    --dry-allowed-length N  (default 2)\n"
    "  --dry-penalty-last-n N  tokens DRY looks back over (default 64; -1 = all)\n"
    "  --dry-sequence-breaker S  a repeat never reaches back past S (repeatable; the first replaces\n"
    "                          the default '\\n' ':' '\"' '*'; 'none' for no breakers)\n"
    "  -l, --logit-bias ID+B   add B to token ID's logit, or ID-B to subtract; ID-inf bans the token\n"
    "                          (repeatable; B in 0..100)\n"
    "  --mirostat N            Mirostat 1 or 2.0 in place of the chain after the logit bias (as\n"
    "                          llama.cpp: temperature, then mirostat's cut at its running target;\n"
    "                          default 0 = off; not with --spec)\n"
    "  --mirostat-ent T        target surprise tau (default 5)  --mirostat-lr E  learning rate (0.1)\n"
    "  -s, --seed N            RNG seed (default: random, printed in the stats)\n"
    "Speculative decoding (exact: greedy output is unchanged, sampled output keeps its distribution):\n"
    "  --spec ngram|draft|off  propose tokens by prompt lookup (an n-gram of the prompt and output\n"
    "                          so far that recurs) or by a draft model's greedy decoding, and verify\n"
    "                          them in one step (default off)\n"
    "  --draft-model PATH      the draft model for --spec draft: GGUF file or HF directory with the\n"
    "                          target's vocabulary; it shares the KV budget (--kv-mem) with the target\n"
    "  --spec-k K              tokens proposed per step, 1..32 (default 5)\n"
    "  --spec-ngram MIN,MAX    n-gram lengths prompt lookup tries, longest first (default 2,4)\n"
    "Constrained output (llama.cpp's GBNF; every request, unless its --prompts line has its own):\n"
    "  --grammar GBNF          the output must be a sentence of this grammar (start rule: root)\n"
    "  --grammar-file FILE     the grammar from FILE\n"
    "  -j, --json-schema JSON  the output must be JSON that this schema accepts\n"
    "  --json-schema-file FILE the schema from FILE\n";

/* ---- output ---------------------------------------------------------------------- */

static bool text_grow(gen_request *r, size_t extra) {
    if (r->text_len + extra + 1 <= r->text_cap) return true;
    size_t cap = r->text_cap ? r->text_cap : 256;
    while (cap < r->text_len + extra + 1) cap *= 2;
    char *nt = realloc(r->text, cap);
    if (!nt) return false;
    r->text = nt;
    r->text_cap = cap;
    return true;
}

/* Cuts the text at the first stop string (the stop string is not part of the output,
 * unless include_stop_str_in_output asked for it: then the cut is right after it). */
static void trim_at_stop(gen_request *r) {
    size_t end, cut = stop_first(r->text, r->text_len, r->stop_after, r->params.stop, r->params.n_stop, &end);
    if (r->include_stop) cut = end;
    r->text_len = cut;
    if (r->text) r->text[cut] = '\0';
    if (r->printed > cut) r->printed = cut;
}

/* stdout is buffered: a full disk shows at the flush, so every flush is checked. */
static void out_failed(gen_ctx *g) {
    if (!g->out_errno) g->out_errno = errno ? errno : EIO;
}

static void out_flush(gen_ctx *g) {
    if (fflush(stdout) != 0 || ferror(stdout)) out_failed(g);
}

/* One scored token as --json writes it: {"id", "piece", "logprob", "top": [{"id", "piece",
 * "logprob"}, ...]} (top: the n_top most likely tokens there). */
static void json_scored_token(const tokenizer *tok, jsonw *w, int32_t id, float lp, const int32_t *top_ids,
                              const float *top_lp, int n_top) {
    char piece[256];
    jw_obj_begin(w);
    jw_key(w, "id"); jw_int(w, id);
    int pl = tok_piece(tok, id, piece, sizeof piece);
    jw_key(w, "piece"); jw_str(w, piece, (size_t)(pl > 0 ? pl : 0));
    jw_key(w, "logprob"); jw_num(w, lp);
    jw_key(w, "top");
    jw_arr_begin(w);
    for (int k = 0; k < n_top; k++) {
        jw_obj_begin(w);
        jw_key(w, "id"); jw_int(w, top_ids[k]);
        pl = tok_piece(tok, top_ids[k], piece, sizeof piece);
        jw_key(w, "piece"); jw_str(w, piece, (size_t)(pl > 0 ? pl : 0));
        jw_key(w, "logprob"); jw_num(w, top_lp[k]);
        jw_obj_end(w);
    }
    jw_arr_end(w);
    jw_obj_end(w);
}

/* "prompt_logprobs": null for the first prompt token (nothing before it), then one scored
 * token per prompt token, as vLLM lists them; shorter when the request ended before its
 * prompt was computed. */
static void emit_prompt_logprobs(gen_ctx *g, const gen_request *r, jsonw *w) {
    int nt = r->params.prompt_top;
    jw_key(w, "prompt_logprobs");
    jw_arr_begin(w);
    if (r->n_prompt > 0 && r->plp) jw_null(w);
    for (int i = 1; r->plp && i <= r->n_scored; i++)
        json_scored_token(g->tok, w, r->prompt_ids[i], r->plp[i], r->plp_top_ids + (size_t)i * nt,
                          r->plp_top_lp + (size_t)i * nt, nt);
    jw_arr_end(w);
}

static void emit_json(gen_ctx *g, gen_request *r) {
    jsonw w;
    jw_init(&w);
    jw_obj_begin(&w);
    jw_key(&w, "index"); jw_int(&w, r->index);
    jw_key(&w, "sample"); jw_int(&w, r->sample);
    if (r->error) {
        jw_key(&w, "error"); jw_cstr(&w, r->error);
    } else {
        jw_key(&w, "text"); jw_str(&w, r->text ? r->text : "", r->text_len);
        jw_key(&w, "finish_reason"); jw_cstr(&w, finish_name(r->finish));
        jw_key(&w, "prompt_tokens"); jw_int(&w, r->n_prompt);
        jw_key(&w, "cached_tokens"); jw_int(&w, r->n_cached);
        jw_key(&w, "generated_tokens"); jw_int(&w, r->n_gen);
        jw_key(&w, "ttft_ms"); jw_num(&w, r->n_gen > 0 ? r->ttft * 1e3 : NAN);
        jw_key(&w, "prefill_ms"); jw_num(&w, r->prefill_s * 1e3);
        jw_key(&w, "latency_ms"); jw_num(&w, r->latency * 1e3);
        jw_key(&w, "preempted"); jw_int(&w, r->n_preempted);
        if (r->params.spec.mode != LLMI_SPEC_OFF) {
            jw_key(&w, "spec"); jw_cstr(&w, spec_mode_name(r->params.spec.mode));
            jw_key(&w, "spec_steps"); jw_int(&w, r->spec_steps);
            jw_key(&w, "spec_proposed"); jw_int(&w, r->spec_proposed);
            jw_key(&w, "spec_accepted"); jw_int(&w, r->spec_accepted);
            jw_key(&w, "spec_acceptance_rate");
            jw_num(&w, r->spec_proposed > 0 ? (double)r->spec_accepted / r->spec_proposed : NAN);
            jw_key(&w, "spec_mean_accepted_len");
            jw_num(&w, r->spec_steps > 0 ? 1.0 + (double)r->spec_accepted / r->spec_steps : NAN);
        }
        jw_key(&w, "decode_tok_s");
        jw_num(&w, r->n_gen > 1 && r->latency > r->ttft ? (r->n_gen - 1) / (r->latency - r->ttft) : NAN);
        jw_key(&w, "prompt_ids");
        jw_arr_begin(&w);
        for (int i = 0; i < r->n_prompt; i++) jw_int(&w, r->prompt_ids[i]);
        jw_arr_end(&w);
        jw_key(&w, "tokens");
        jw_arr_begin(&w);
        for (int i = 0; i < r->n_gen; i++) jw_int(&w, r->gen_ids[i]);
        jw_arr_end(&w);
        int nl = r->params.logprobs;
        if (nl > 0 && g->tok) {
            jw_key(&w, "logprobs");
            jw_arr_begin(&w);
            for (int i = 0; i < r->n_gen; i++)
                json_scored_token(g->tok, &w, r->gen_ids[i], r->lp[i], r->top_ids + (size_t)i * nl,
                                  r->top_lp + (size_t)i * nl, nl);
            jw_arr_end(&w);
        }
        if (r->params.prompt_logprobs && g->tok) emit_prompt_logprobs(g, r, &w);
    }
    jw_obj_end(&w);
    if (jw_flush_line(&w, stdout)) out_failed(g);
    jw_free(&w);
}

/* Emits every finished request at the head of the input order. */
static void emit_ready(gen_ctx *g) {
    while (g->next_emit < g->n_reqs && g->reqs[g->next_emit].done) {
        gen_request *r = &g->reqs[g->next_emit++];
        if (r->emitted) continue;
        r->emitted = true;
        if (g->json) {
            emit_json(g, r);
        } else if (!g->stream_out && !r->error) {
            fwrite(r->text ? r->text : "", 1, r->text_len, stdout);
            fputc('\n', stdout);
        }
        /* Printed: only the counts stay (the stats need them), so that a long --prompts
         * run holds the outputs of the requests in flight, not of every one done. */
        free(r->text), free(r->lp), free(r->top_ids), free(r->top_lp);
        r->text = NULL, r->lp = NULL, r->top_ids = NULL, r->top_lp = NULL;
        free(r->plp), free(r->plp_top_ids), free(r->plp_top_lp);
        r->plp = NULL, r->plp_top_ids = NULL, r->plp_top_lp = NULL;
        r->text_len = r->text_cap = 0;
        if (!g->keep_ids) {
            free(r->gen_ids);
            r->gen_ids = NULL;
            r->cap_gen = 0;
        }
    }
    out_flush(g);
}

/* Copies the prompt logprobs of r's ending request out of the engine (which frees them
 * with the request). */
static int keep_prompt_logprobs(gen_request *r, const llmi_request_info *info) {
    size_t n = (size_t)info->n_prompt, top = n * (size_t)info->prompt_top;
    r->plp = malloc(n * sizeof *r->plp);
    r->plp_top_ids = malloc((top ? top : 1) * sizeof *r->plp_top_ids);
    r->plp_top_lp = malloc((top ? top : 1) * sizeof *r->plp_top_lp);
    if (!r->plp || !r->plp_top_ids || !r->plp_top_lp) return -1;
    memcpy(r->plp, info->prompt_logprobs, n * sizeof *r->plp);
    if (top) memcpy(r->plp_top_ids, info->prompt_top_ids, top * sizeof *r->plp_top_ids);
    if (top) memcpy(r->plp_top_lp, info->prompt_top_logprobs, top * sizeof *r->plp_top_lp);
    r->n_scored = info->n_prompt_scored;
    return 0;
}

static void on_token(void *ctx, const llmi_token_event *ev) {
    gen_ctx *g = ctx;
    gen_request *r = ev->user;
    if (ev->token >= 0) {
        if (r->n_gen == r->cap_gen) {
            int cap = r->cap_gen ? 2 * r->cap_gen : 64;
            int nl = r->params.logprobs;
            int32_t *ni = realloc(r->gen_ids, (size_t)cap * sizeof *ni);
            if (ni) r->gen_ids = ni;
            float *nlp = realloc(r->lp, (size_t)cap * sizeof *nlp);
            if (nlp) r->lp = nlp;
            int32_t *nti = nl ? realloc(r->top_ids, (size_t)cap * nl * sizeof *nti) : NULL;
            if (nti) r->top_ids = nti;
            float *ntl = nl ? realloc(r->top_lp, (size_t)cap * nl * sizeof *ntl) : NULL;
            if (ntl) r->top_lp = ntl;
            if (!ni || !nlp || (nl && (!nti || !ntl))) {
                g->oom = true;
                return;
            }
            r->cap_gen = cap;
        }
        int nl = r->params.logprobs;
        r->gen_ids[r->n_gen] = ev->token;
        r->lp[r->n_gen] = ev->logprob;
        for (int k = 0; k < nl; k++) {
            r->top_ids[(size_t)r->n_gen * nl + k] = k < ev->n_top ? ev->top_ids[k] : -1;
            r->top_lp[(size_t)r->n_gen * nl + k] = k < ev->n_top ? ev->top_logprobs[k] : -INFINITY;
        }
        r->n_gen++;
        /* The token that ended the request (end-of-generation, a stop id) is not part of
         * the text unless include_stop_str_in_output, as vLLM renders it. */
        bool hide = ev->by_token && !r->include_stop;
        if (g->tok && !hide && text_grow(r, tok_stream_cap(g->tok))) {
            int n = tok_stream_push(&r->stream, ev->token, r->text + r->text_len, tok_stream_cap(g->tok));
            r->text_len += (size_t)(n > 0 ? n : 0);
            r->text[r->text_len] = '\0';
        }
        if (r->n_gen == r->params.min_tokens) r->stop_after = r->text_len;
    }
    if (ev->finished) {
        if (g->tok && text_grow(r, tok_stream_cap(g->tok))) {
            int n = tok_stream_flush(&r->stream, r->text + r->text_len, tok_stream_cap(g->tok));
            r->text_len += (size_t)(n > 0 ? n : 0);
            r->text[r->text_len] = '\0';
        }
        if (ev->reason == LLMI_FINISH_STOP) trim_at_stop(r);
        const llmi_request_info *info = engine_request(g->engine, ev->request_id);
        if (info) {
            r->ttft = info->t_first_token - info->t_arrival;
            r->latency = info->t_finish - info->t_arrival;
            r->prefill_s = info->t_prefill_done - info->t_arrival;
            r->n_preempted = info->n_preempted;
            r->n_cached = info->n_cached_tokens;
            r->spec_steps = info->n_spec_steps;
            r->spec_proposed = info->n_spec_proposed;
            r->spec_accepted = info->n_spec_accepted;
            if (info->prompt_logprobs && keep_prompt_logprobs(r, info)) g->oom = true;
            if (info->error) {
                fprintf(stderr, "llmi: request %d: %s\n", r->index, info->error);
                g->n_failed_late++;
            }
        }
        r->done = true;
        r->finish = ev->reason;
        g->finished[g->n_finished++] = ev->request_id;
    }
    if (g->stream_out && r->text) {
        size_t upto = r->done ? r->text_len : r->text_len - stop_holdback(r->text, r->text_len, r->params.stop, r->params.n_stop);
        if (upto > r->printed) {
            if (fwrite(r->text + r->printed, 1, upto - r->printed, stdout) != upto - r->printed) out_failed(g);
            r->printed = upto;
            out_flush(g);
        }
        if (r->done) {
            fputc('\n', stdout);
            out_flush(g);
        }
    }
    if (ev->finished) emit_ready(g);
}

/* Opens the model and the engine for requests that may use a draft model (any_draft) and
 * propose up to max_spec_k tokens (the engine's logit rows are sized for the longest
 * proposal); the model must have a tokenizer.  On failure nothing stays open. */
static int open_for_generate(cli_model_opts *mo, bool any_draft, int max_spec_k, llmi_model *m, llmi_backend **b,
                             llmi_engine **e, llmi_status *st) {
    *b = NULL, *e = NULL;
    if (cli_check_draft_flags(mo, any_draft, st) || cli_open_model(mo, m, st)) return st->code;
    if (max_spec_k > mo->engine.spec_max_k) mo->engine.spec_max_k = max_spec_k;
    int rc = cli_open_engine(mo, m, NULL, b, e, st);
    if (!rc && !m->tok) rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: the model has no tokenizer", m->source_path);
    if (rc) {
        cli_close_engine(*b, *e);
        *b = NULL, *e = NULL;
        model_free(m);
    }
    return rc;
}

/* Steps the engine until its work is done, releasing each finished request (the engine
 * keeps one, its tokens and block table, until released: over a long --prompts run that
 * would grow with every request served).  Stops early when stdout failed or an output
 * could not be kept (g says which), or on SIGINT: the requests are aborted, *interrupted. */
static int drive(gen_ctx *g, llmi_engine *e, bool *interrupted, llmi_status *st) {
    *interrupted = false;
    while (engine_has_work(e)) {
        if (cli_was_interrupted()) {
            *interrupted = true;
            engine_abort_all(e, on_token, g);
            return LLMI_OK;
        }
        if (engine_step(e, on_token, g, NULL, st)) return st->code;
        for (int i = 0; i < g->n_finished; i++) engine_release(e, g->finished[i]);
        g->n_finished = 0;
        if (g->out_errno || g->oom) break;
    }
    return LLMI_OK;
}

/* ---- input ----------------------------------------------------------------------- */

#define GEN_MAX_TEXT ((size_t)2 << 30)   /* a prompt file beyond this is a mistake */

/* The text of a prompt file ('-' = stdin; pipes and /dev/null welcome); flag NULL: stdin. */
static char *read_file_text(const char *flag, const char *path, llmi_status *st) {
    char *s;
    size_t len;
    fileio_opts fo = {.flag = flag, .max_bytes = GEN_MAX_TEXT, .allow_stream = true};
    if (fileio_read(path, &fo, &s, &len, st)) return NULL;
    if (strlen(s) != len) {
        free(s);
        if (flag) llmi_fail(st, LLMI_E_USAGE, "%s %s: contains NUL bytes; prompts are text", flag, path);
        else llmi_fail(st, LLMI_E_USAGE, "stdin: contains NUL bytes; prompts are text");
        return NULL;
    }
    return s;
}

/* Appends one spelling (n ids) to r's bad-word sequences (cap: bad_ids' room). */
static int add_bad_spelling(gen_request *r, int *cap, const int32_t *ids, int n, llmi_status *st) {
    const int used = r->bad_off[r->params.n_bad];
    if (used + n > *cap) {
        while (used + n > *cap) *cap *= 2;
        int32_t *grown = realloc(r->bad_ids, (size_t)*cap * sizeof *grown);
        if (!grown) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        r->bad_ids = grown;
    }
    memcpy(r->bad_ids + used, ids, (size_t)n * sizeof *ids);
    r->bad_off[++r->params.n_bad] = used + n;
    return LLMI_OK;
}

/* vLLM's bad_words as token sequences behind r->params: each word as written, and after a
 * space when that spelling starts with another token and is as long (the word inside a
 * text). */
static int tokenize_bad_words(const tokenizer *tok, gen_request *r, llmi_status *st) {
    int cap = 64;
    r->bad_ids = malloc((size_t)cap * sizeof *r->bad_ids);
    r->bad_off = malloc((size_t)(2 * r->n_bad_words + 1) * sizeof *r->bad_off);
    if (!r->bad_ids || !r->bad_off) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    r->bad_off[0] = 0;
    r->params.n_bad = 0;
    for (int w = 0; w < r->n_bad_words && !st->code; w++) {
        const char *word = r->bad_words[w];
        char *spaced = malloc(strlen(word) + 2);
        int32_t *a = NULL, *b = NULL;
        int na = 0, nb = 0;
        if (!spaced) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        snprintf(spaced, strlen(word) + 2, " %s", word);
        if (!tok_encode(tok, word, strlen(word), false, true, &a, &na, st) &&
            !tok_encode(tok, spaced, strlen(spaced), false, true, &b, &nb, st)) {
            if (na == 0) llmi_fail(st, LLMI_E_USAGE, "bad_words: \"%.100s\" spells to no tokens", word);
            else if (!add_bad_spelling(r, &cap, a, na, st) && nb == na && b[0] != a[0])
                add_bad_spelling(r, &cap, b, nb, st);
        }
        free(spaced), free(a), free(b);
    }
    r->params.bad_ids = r->bad_ids;
    r->params.bad_off = r->bad_off;
    return st->code;
}

static void request_free(gen_request *r) {
    if (!r->shares_input) {
        grammar_free(r->own_grammar);
        free(r->own_bias);
        if (r->own_breakers) prompts_free_strings(r->own_breakers, r->params.sampling.n_dry_breakers);
        prompts_free_strings(r->turns, r->n_turns);
        free(r->system);
        free(r->prompt);
        free(r->given_ids);
        for (int i = 0; i < r->params.n_stop; i++) free(r->stops[i]);
        free(r->own_allowed);
        prompts_free_strings(r->bad_words, r->n_bad_words);
    }
    free(r->bad_ids);
    free(r->bad_off);
    free(r->prompt_ids);
    free(r->error);
    free(r->text);
    free(r->gen_ids);
    free(r->lp);
    free(r->top_ids);
    free(r->top_lp);
    free(r->plp);
    free(r->plp_top_ids);
    free(r->plp_top_lp);
}

/* Takes over e's prompt, parameters and stop strings. */
static void request_from_entry(gen_request *r, prompt_entry *e) {
    r->prompt = e->prompt;
    r->params = e->params;
    memcpy(r->stops, e->stops, sizeof r->stops);
    r->own_seed = e->own_seed;
    r->own_grammar = e->own_grammar;
    r->own_bias = e->own_bias;
    r->own_breakers = e->own_breakers;
    r->system = e->system;
    r->turns = e->turns;
    r->n_turns = e->n_turns;
    r->given_ids = e->prompt_ids;
    r->n_given = e->n_prompt_ids;
    r->own_allowed = e->own_allowed;
    r->bad_words = e->bad_words;
    r->n_bad_words = e->n_bad_words;
    r->include_stop = e->include_stop;
    r->truncate = e->truncate;
    memset(e, 0, sizeof *e);
}

/* The requests of entries[0, n) (whose contents they take over), each line as many times
 * as its "n" or flag_samples says, in input order; samples after the first borrow the
 * first's input (shares_input).  entries is freed either way. */
static int requests_from_entries(prompt_entry *entries, int n, int flag_samples, gen_request **out, int *n_out,
                                 llmi_status *st) {
    long total = 0;
    for (int i = 0; i < n; i++) total += entries[i].n_samples > 0 ? entries[i].n_samples : flag_samples;
    gen_request *reqs = total <= INT32_MAX ? calloc((size_t)total, sizeof *reqs) : NULL;
    if (!reqs) {
        prompts_free(entries, n);
        return llmi_fail(st, LLMI_E_RUNTIME, "out of memory for %ld requests", total);
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        int count = entries[i].n_samples > 0 ? entries[i].n_samples : flag_samples;
        gen_request *first = &reqs[k];
        request_from_entry(first, &entries[i]);
        for (int j = 0; j < count; j++, k++) {
            if (j > 0) reqs[k] = *first;
            reqs[k].index = i;
            reqs[k].sample = j;
            reqs[k].shares_input = j > 0;
            /* the samples share one prompt: its logprobs come once, with sample 0 (and the
             * others may take its K/V from the prefix cache) */
            if (j > 0) reqs[k].params.prompt_logprobs = false;
        }
    }
    free(entries);
    *out = reqs;
    *n_out = k;
    return LLMI_OK;
}

/* Builds the request list from -p / -f / stdin / --prompts. */
static int collect_prompts(const gen_opts *o, gen_request **out, int *n_out, llmi_status *st) {
    *out = NULL;
    *n_out = 0;
    int given = (o->prompt != NULL) + (o->prompt_file != NULL) + (o->prompts_file != NULL);
    if (given > 1) return llmi_fail(st, LLMI_E_USAGE, "-p, -f and --prompts: give only one");
    if (given == 0 && isatty(STDIN_FILENO))
        return llmi_fail(st, LLMI_E_USAGE, "no prompt: give -p TEXT, -f FILE, --prompts FILE or pipe text on stdin");
    prompt_entry *entries;
    int n;
    if (!o->prompts_file) {
        if (!(entries = calloc(1, sizeof *entries))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        n = 1;
        entries[0].prompt = o->prompt ? strdup(o->prompt) : read_file_text(o->prompt_file ? "-f" : NULL,
                                                                             o->prompt_file ? o->prompt_file : "-", st);
        if (!entries[0].prompt || prompts_entry_init(&entries[0], &o->params, st)) {
            prompts_free(entries, n);
            return st->code ? st->code : llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        }
    } else {
        char *all = read_file_text("--prompts", o->prompts_file, st);
        if (!all) return st->code;
        int rc = prompts_parse(all, o->prompts_file, &o->params, &entries, &n, st);
        free(all);
        if (rc) return rc;
    }
    return requests_from_entries(entries, n, o->samples, out, n_out, st);
}

/* The grammar of --grammar, --grammar-file, -j/--json-schema or --json-schema-file. */
static int flag_grammar(const gen_opts *o, grammar **out, llmi_status *st) {
    const char *a = o->grammar_flag, *v = o->grammar_value;
    bool from_file = strstr(a, "-file") != NULL;
    bool schema = !strcmp(a, "-j") || !strncmp(a, "--json-schema", 13);
    char *text = from_file ? read_file_text(a, v, st) : strdup(v);
    if (!text) return st->code ? st->code : llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    char where[512];
    if (from_file) snprintf(where, sizeof where, "%s %s", a, v);
    else snprintf(where, sizeof where, "%s", a);
    int rc = prompts_grammar(schema ? NULL : text, schema ? text : NULL, strlen(text), where, out, st);
    free(text);
    return rc;
}

static void print_prompt_tokens(const tokenizer *tok, const gen_request *r) {
    fprintf(stderr, "prompt: '%s'\nnumber of tokens in prompt = %d\n", r->prompt, r->n_prompt);
    char piece[256];
    for (int i = 0; i < r->n_prompt; i++) {
        int n = tok_piece(tok, r->prompt_ids[i], piece, sizeof piece - 1);
        piece[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "%6d -> '%s'\n", r->prompt_ids[i], piece);
    }
}

static void print_stats(const gen_ctx *g, llmi_engine *e, const llmi_backend *b, double wall, uint64_t seed,
                        bool seed_random) {
    long prompt = 0, gen = 0, cached = 0;
    double ttft_sum = 0, prefill_sum = 0, decode_time = 0;
    long decode_tokens = 0;
    int n_ttft = 0, preemptions = 0;
    for (int i = 0; i < g->n_reqs; i++) {
        const gen_request *r = &g->reqs[i];
        if (r->error) continue;
        prompt += r->n_prompt;
        cached += r->n_cached;
        gen += r->n_gen;
        preemptions += r->n_preempted;
        prefill_sum += r->prefill_s;
        if (r->n_gen > 0) {
            ttft_sum += r->ttft;
            n_ttft++;
        }
        if (r->n_gen > 1) {
            decode_tokens += r->n_gen - 1;
            decode_time += r->latency - r->ttft;
        }
    }
    long spec_steps = 0, spec_proposed = 0, spec_accepted = 0;
    int n_spec = 0;
    for (int i = 0; i < g->n_reqs; i++) {
        const gen_request *r = &g->reqs[i];
        if (r->error || r->params.spec.mode == LLMI_SPEC_OFF) continue;
        n_spec++;
        spec_steps += r->spec_steps;
        spec_proposed += r->spec_proposed;
        spec_accepted += r->spec_accepted;
    }
    size_t wb = 0, kvb = 0, ab = 0;
    if (b->memory) b->memory(b, &wb, &kvb, &ab);
    fprintf(stderr, "\nllmi: %d request%s | prompt %ld tokens (%ld cached) | generated %ld tokens", g->n_reqs,
            g->n_reqs == 1 ? "" : "s", prompt, cached, gen);
    if (g->n_reqs == 1 && !g->reqs[0].error) fprintf(stderr, " | finish %s", finish_name(g->reqs[0].finish));
    fprintf(stderr, "\n");
    if (n_ttft) fprintf(stderr, "llmi: TTFT %.1f ms%s", 1e3 * ttft_sum / n_ttft, n_ttft > 1 ? " (mean)" : "");
    else fprintf(stderr, "llmi: TTFT -");
    if (g->n_reqs == 1) {
        fprintf(stderr, " | prefill %.1f tok/s", prefill_sum > 0 ? prompt / prefill_sum : 0.0);
        fprintf(stderr, " | decode %.1f tok/s", decode_time > 0 ? decode_tokens / decode_time : 0.0);
        if (decode_tokens > 0 && decode_time > 0) fprintf(stderr, " (%.2f ms/token)", 1e3 * decode_time / decode_tokens);
    } else {
        fprintf(stderr, " | throughput %.1f prompt tok/s, %.1f generated tok/s over %.2f s", wall > 0 ? prompt / wall : 0,
                wall > 0 ? gen / wall : 0, wall);
    }
    if (n_spec > 0)
        fprintf(stderr, "\nllmi: speculation (%d request%s): %ld proposed, %ld accepted (%.1f%%) | mean accepted length "
                "%.2f tokens per verification step (%ld steps, bonus token included)", n_spec, n_spec == 1 ? "" : "s",
                spec_proposed, spec_accepted, spec_proposed > 0 ? 100.0 * spec_accepted / spec_proposed : 0.0,
                spec_steps > 0 ? 1.0 + (double)spec_accepted / spec_steps : 0.0, spec_steps);
    fprintf(stderr, "\nllmi: peak memory %.1f MiB (weights %.1f MiB, KV %.1f MiB", bench_peak_rss() / 1048576.0,
            (wb ? wb : b->model->weight_bytes) / 1048576.0, kvb / 1048576.0);
    const llmi_backend *db = engine_options(e)->draft_backend;
    if (db) {
        size_t dwb = 0, dkvb = 0, dab = 0;
        if (db->memory) db->memory(db, &dwb, &dkvb, &dab);
        fprintf(stderr, "; draft model: weights %.1f MiB, KV %.1f MiB", (dwb ? dwb : db->model->weight_bytes) / 1048576.0,
                dkvb / 1048576.0);
    }
    fprintf(stderr, ") | KV blocks %d/%d peak | preemptions %d | %s (%s)", engine_kv_blocks_peak(e),
            engine_kv_blocks_total(e), preemptions, b->name, b->device_name);
    if (!strcmp(b->name, "cpu"))
        fprintf(stderr, ", %d threads", b->opts.n_threads > 0 ? b->opts.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(stderr, " | seed %llu%s\n", (unsigned long long)seed, seed_random ? " (random)" : "");
}

static int parse_logit_bias_flag(const char *flag, const char *v, gen_opts *o, llmi_status *st);

static int parse_gen_flags(int argc, char **argv, gen_opts *o, cli_model_opts *mo, bool *help, llmi_status *st) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        int r = cli_parse_model_flag(mo, argc, argv, &i, st);
        if (r == 0) r = cli_parse_sampling_flag(&o->params.sampling, argc, argv, &i, st);
        if (r < 0) return st->code;
        if (r > 0) continue;
#define VALUE() do { if (!(v = cli_flag_value(argc, argv, &i, st))) return st->code; } while (0)
#define IS(x) (!strcmp(a, x))
        if (IS("-h") || IS("--help")) *help = true;
        else if (IS("-p") || IS("--prompt")) { VALUE(); o->prompt = v; }
        else if (IS("-f") || IS("--file")) { VALUE(); o->prompt_file = v; }
        else if (IS("--prompts")) { VALUE(); o->prompts_file = v; }
        else if (IS("--system")) { VALUE(); o->system = v; }
        else if (IS("--chat")) o->chat = true;
        else if (IS("-cnv") || IS("--conversation")) o->conversation = o->chat = true;
        else if (IS("--json")) o->json = true;
        else if (IS("--verbose-prompt")) o->verbose_prompt = true;
        else if (IS("--no-stats")) o->no_stats = true;
        else if (IS("--ignore-eos")) o->params.ignore_eos = true;
        else if (IS("-sp") || IS("--special")) o->params.keep_special = true;
        else if (IS("--min-tokens")) {
            VALUE();
            if (cli_parse_long(a, v, 0, 1 << 24, &n, st)) return st->code;
            o->params.min_tokens = (int)n;
        } else if (IS("--stop-token-id")) {
            VALUE();
            if (cli_parse_long(a, v, 0, INT32_MAX, &n, st)) return st->code;
            if (o->params.n_stop_ids >= LLMI_MAX_STOP_IDS)
                return llmi_fail(st, LLMI_E_USAGE, "%s: at most %d", a, LLMI_MAX_STOP_IDS);
            o->params.stop_ids[o->params.n_stop_ids++] = (int32_t)n;
        } else if (IS("--samples")) {
            VALUE();
            if (cli_parse_long(a, v, 1, PROMPTS_MAX_SAMPLES, &n, st)) return st->code;
            o->samples = (int)n;
        }
        else if (IS("-n") || IS("--n-predict")) {
            VALUE();
            if (cli_parse_long(a, v, -1, 1 << 24, &n, st)) return st->code;
            o->params.max_tokens = (int)n;
        } else if (IS("--stop")) {
            VALUE();
            if (o->params.n_stop >= LLMI_MAX_STOP) return llmi_fail(st, LLMI_E_USAGE, "--stop: at most %d", LLMI_MAX_STOP);
            if (!*v) return llmi_fail(st, LLMI_E_USAGE, "--stop: empty string");
            o->params.stop[o->params.n_stop++] = v;
        } else if (IS("--logprobs")) {
            VALUE();
            if (cli_parse_long(a, v, 0, LLMI_MAX_LOGPROBS, &n, st)) return st->code;
            o->params.logprobs = (int)n;
        } else if (IS("--prompt-logprobs")) {
            VALUE();
            if (cli_parse_long(a, v, 0, LLMI_MAX_LOGPROBS, &n, st)) return st->code;
            o->params.prompt_logprobs = true;
            o->params.prompt_top = (int)n;
        } else if (IS("--spec")) {
            VALUE();
            if (cli_parse_spec_mode(a, v, &o->params.spec.mode, st)) return st->code;
        } else if (IS("--draft-model")) {
            VALUE();
            mo->draft_model = v;
        } else if (IS("--spec-k")) {
            VALUE();
            if (cli_parse_long(a, v, 1, LLMI_SPEC_MAX_K, &n, st)) return st->code;
            o->params.spec.k = (int)n;
        } else if (IS("--spec-ngram")) {
            VALUE();
            if (cli_parse_spec_ngram(a, v, &o->params.spec, st)) return st->code;
        } else if (IS("--grammar") || IS("--grammar-file") || IS("-j") || IS("--json-schema") ||
                   IS("--json-schema-file")) {
            VALUE();
            if (o->grammar_flag)
                return llmi_fail(st, LLMI_E_USAGE, "%s: %s was given already; give one grammar or schema", a, o->grammar_flag);
            o->grammar_flag = a;
            o->grammar_value = v;
        } else if (IS("--dry-sequence-breaker")) {
            VALUE();
            /* the first one replaces llama.cpp's default list; "none" empties it */
            if (o->params.sampling.n_dry_breakers < 0) o->params.sampling.n_dry_breakers = 0;
            if (!strcmp(v, "none")) {
                o->params.sampling.n_dry_breakers = 0;
            } else {
                if (!*v) return llmi_fail(st, LLMI_E_USAGE, "%s: empty breaker", a);
                if (o->params.sampling.n_dry_breakers >= DRY_MAX_BREAKERS)
                    return llmi_fail(st, LLMI_E_USAGE, "%s: at most %d breakers", a, DRY_MAX_BREAKERS);
                o->breakers[o->params.sampling.n_dry_breakers++] = v;
            }
            o->params.sampling.dry_breakers = o->breakers;
        } else if (IS("-l") || IS("--logit-bias")) {
            VALUE();
            if (parse_logit_bias_flag(a, v, o, st)) return st->code;
        } else if (IS("--repeat-last-n")) {
            VALUE();
            if (cli_parse_long(a, v, -1, 1 << 24, &n, st)) return st->code;
            o->params.sampling.repeat_last_n = (int)n;
        } else if (IS("-s") || IS("--seed")) {
            VALUE();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-')
                return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not a non-negative integer", a, v);
            o->params.sampling.seed = s;
            o->seed_given = true;
        } else if (a[0] == '-') {
            return llmi_fail(st, LLMI_E_USAGE, "generate: unknown flag '%s' (see llmi generate --help)", a);
        } else {
            return llmi_fail(st, LLMI_E_USAGE, "generate: unexpected argument '%s' (the prompt goes after -p)", a);
        }
#undef VALUE
#undef IS
    }
    if (o->system && !o->chat && !o->prompts_file)
        return llmi_fail(st, LLMI_E_USAGE, "--system: needs --chat (or --prompts with \"messages\" lines)");
    if (o->params.logprobs > 0 && !o->json) return llmi_fail(st, LLMI_E_USAGE, "--logprobs: needs --json");
    if (o->params.prompt_logprobs && !o->json) return llmi_fail(st, LLMI_E_USAGE, "--prompt-logprobs: needs --json");
    if (o->params.prompt_logprobs && o->conversation)
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-logprobs: not with --conversation (each turn's prompt is the "
                         "conversation so far, served from the prefix cache)");
    return LLMI_OK;
}

/* llama.cpp's -l/--logit-bias form: ID+BIAS or ID-BIAS, BIAS a number or inf (ID-inf bans). */
static int parse_logit_bias_flag(const char *flag, const char *v, gen_opts *o, llmi_status *st) {
    char *end;
    errno = 0;
    long id = strtol(v, &end, 10);
    if (errno || end == v || *v == '-' || *v == '+' || (*end != '+' && *end != '-') || id > INT32_MAX)
        return llmi_fail(st, LLMI_E_USAGE, "%s: '%s' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf)", flag, v);
    char sign = *end;
    const char *b = end + 1;
    double bias;
    if (strcmp(b, "inf") == 0 && sign == '-') {
        bias = -INFINITY;
    } else {
        char *bend;
        errno = 0;
        bias = strtod(b, &bend);
        if (errno || bend == b || *bend || *b == '-' || *b == '+' || !isfinite(bias) || bias > 100)
            return llmi_fail(st, LLMI_E_USAGE, "%s: '%s': the bias after '%c' must be a number in 0..100%s", flag, v, sign,
                             sign == '-' ? " or inf" : "");
        if (sign == '-') bias = -bias;
    }
    if (prompts_add_logit_bias(&o->bias, &o->n_bias, &o->cap_bias, (int32_t)id, (float)bias, flag, st)) return st->code;
    o->params.sampling.logit_bias = o->bias;
    o->params.sampling.n_logit_bias = o->n_bias;
    return LLMI_OK;
}

static uint64_t random_seed(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return ((uint64_t)t.tv_nsec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)t.tv_sec ^ ((uint64_t)getpid() << 32);
}

/* One user turn from in: a line, joined with the next while it ends in '\\' (the
 * backslash dropped, the newline kept); blank turns skipped.  0 at end of input. */
static int read_turn(FILE *in, bool prompt, char **buf, size_t *cap, size_t *len) {
    char *line = NULL;
    size_t lcap = 0;
    for (;;) {
        *len = 0;
        if (*buf) **buf = '\0';
        bool more = true;
        while (more) {
            if (prompt) fputs(*len ? ". " : "> ", stderr), fflush(stderr);
            ssize_t n = getline(&line, &lcap, in);
            if (n < 0) {
                free(line);
                return *len > 0;
            }
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
            more = n > 0 && line[n - 1] == '\\';
            if (more) line[n - 1] = '\n';
            if (*len + (size_t)n + 1 > *cap) {
                size_t c = (*len + (size_t)n + 1) * 2;
                char *b = realloc(*buf, c);
                if (!b) {
                    free(line);
                    return -1;
                }
                *buf = b, *cap = c;
            }
            memcpy(*buf + *len, line, (size_t)n);
            *len += (size_t)n;
            (*buf)[*len] = '\0';
        }
        for (size_t i = 0; i < *len; i++)
            if (!strchr(" \t\n", (*buf)[i])) {
                free(line);
                return 1;
            }
    }
}

/* -cnv: a chat on stdin.  Each turn is one request whose prompt is the conversation's
 * tokens so far (the previous prompt and answer, as generated) with the template's text
 * to the next user message, that message and the assistant turn opened
 * (tok_chat_pieces), so the prefix cache serves the earlier turns' K/V. */
static int conversation_run(const gen_opts *o, const cli_model_opts *mo_in, llmi_status *st) {
    if (o->prompt || o->prompt_file || o->prompts_file)
        return llmi_fail(st, LLMI_E_USAGE, "--conversation: the user turns come from stdin, one per line; drop %s",
                         o->prompt ? "-p" : o->prompt_file ? "-f" : "--prompts");
    if (o->samples > 1) return llmi_fail(st, LLMI_E_USAGE, "--samples: one answer per turn in --conversation");
    cli_model_opts mo = *mo_in;
    llmi_model m;
    llmi_backend *b = NULL;
    llmi_engine *e = NULL;
    tok_chat_pieces pc = {0};
    int32_t *conv = NULL, *user = NULL;   /* (n_conv) the tokens so far, (n_user) this turn's message */
    int n_conv = 0, n_user = 0, turn = 0, fin[1];
    char *text = NULL;
    size_t text_cap = 0, text_len = 0;
    gen_request r = {0};
    int rc = open_for_generate(&mo, o->params.spec.mode == LLMI_SPEC_DRAFT,
                               o->params.spec.mode != LLMI_SPEC_OFF ? o->params.spec.k : 0, &m, &b, &e, st);
    if (rc) return rc;
    if ((rc = tok_chat_pieces_make(m.tok, o->system, &pc, st))) goto out;
    const bool tty = isatty(0) && isatty(2);
    int got;
    while ((got = read_turn(stdin, tty, &text, &text_cap, &text_len)) > 0) {
        free(user);
        user = NULL;
        if ((rc = tok_encode(m.tok, text, text_len, false, false, &user, &n_user, st))) goto out;
        /* the prompt: the conversation so far, the template to this message, it, the answer opened */
        const int32_t *part[4] = {conv, turn ? pc.next : pc.first, user, turn ? pc.after_next : pc.after};
        const int len[4] = {n_conv, turn ? pc.n_next : pc.n_first, n_user, turn ? pc.n_after_next : pc.n_after};
        int n = 0;
        for (int i = 0; i < 4; i++) n += len[i];
        r = (gen_request){.index = turn, .params = o->params, .engine_id = -1};
        r.params.sampling.seed += (uint64_t)turn;
        if (!(r.prompt_ids = malloc((size_t)n * sizeof *r.prompt_ids))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            goto out;
        }
        for (int i = 0; i < 4; i++) {
            if (len[i]) memcpy(r.prompt_ids + r.n_prompt, part[i], (size_t)len[i] * sizeof *r.prompt_ids);
            r.n_prompt += len[i];
        }
        tok_stream_init(&r.stream, m.tok, !o->params.keep_special);
        if (o->verbose_prompt) print_prompt_tokens(m.tok, &r);
        llmi_status ast = {0};
        if (engine_add_request(e, r.prompt_ids, r.n_prompt, &r.params, &r, &r.engine_id, &ast)) {
            rc = llmi_fail(st, ast.code, "--conversation: turn %d: %s", turn + 1, ast.msg);
            goto out;
        }
        gen_ctx g = {.engine = e, .reqs = &r, .n_reqs = 1, .tok = m.tok, .json = o->json, .stream_out = !o->json,
                     .finished = fin, .keep_ids = true};
        bool interrupted;
        if ((rc = drive(&g, e, &interrupted, st))) goto out;
        if (interrupted) rc = llmi_fail(st, LLMI_E_INTERRUPT, "interrupted");
        else if (g.out_errno) rc = llmi_fail(st, LLMI_E_RUNTIME, "generate: cannot write to stdout: %s", strerror(g.out_errno));
        else if (g.oom) rc = llmi_fail(st, LLMI_E_RUNTIME, "generate: out of memory keeping the outputs");
        else if (g.n_failed_late) rc = llmi_fail(st, LLMI_E_RUNTIME, "--conversation: turn %d failed (see above)", turn + 1);
        else if (r.finish == LLMI_FINISH_CONTEXT)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "--conversation: turn %d: the conversation filled the context (%d tokens, -c)",
                           turn + 1, r.n_prompt + r.n_gen);
        if (rc) goto out;
        if (!o->no_stats)
            fprintf(stderr, "llmi: turn %d: prompt %d tokens (%d cached) | generated %d | finish %s | TTFT %.1f ms | "
                    "decode %.1f tok/s\n", turn + 1, r.n_prompt, r.n_cached, r.n_gen, finish_name(r.finish),
                    r.n_gen > 0 ? r.ttft * 1e3 : 0.0,
                    r.n_gen > 1 && r.latency > r.ttft ? (r.n_gen - 1) / (r.latency - r.ttft) : 0.0);
        /* the next turn builds on this prompt and its answer, the end-of-generation token
         * left out: the template's text after an answer closes the turn itself */
        int n_answer = r.n_gen - (r.finish == LLMI_FINISH_EOS ? 1 : 0);
        int32_t *nc = realloc(r.prompt_ids, (size_t)(r.n_prompt + n_answer + 1) * sizeof *nc);
        if (!nc) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            goto out;
        }
        r.prompt_ids = NULL;
        if (n_answer > 0) memcpy(nc + r.n_prompt, r.gen_ids, (size_t)n_answer * sizeof *nc);
        free(conv);
        conv = nc;
        n_conv = r.n_prompt + n_answer;
        request_free(&r);
        r = (gen_request){0};
        turn++;
    }
    if (got < 0) rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory reading stdin");
out:
    request_free(&r);
    free(conv);
    free(user);
    free(text);
    tok_chat_pieces_free(&pc);
    cli_close_engine(b, e);
    model_free(&m);
    return rc;
}

/* What the flags ask of the requests that only the whole list can tell: --system used by
 * someone, prompt logprobs only with --json. */
static int check_request_flags(const gen_opts *o, const gen_request *reqs, int n_reqs, llmi_status *st) {
    bool system_used = o->chat;
    for (int i = 0; i < n_reqs; i++) system_used |= reqs[i].n_turns > 0 && !reqs[i].system;
    if (o->system && !system_used)
        return llmi_fail(st, LLMI_E_USAGE, "--system: no request takes it (plain lines need --chat; every \"messages\" "
                         "line has its own system message)");
    for (int i = 0; i < n_reqs && !o->json; i++)
        if (reqs[i].params.prompt_logprobs)
            return llmi_fail(st, LLMI_E_USAGE, "--prompts %s: request %d asks for \"prompt_logprobs\", which only --json "
                             "shows", o->prompts_file, reqs[i].index + 1);
    return LLMI_OK;
}

/* The run after the flags; o's lists stay the caller's to free. */
static int generate_run(gen_opts o, cli_model_opts mo, llmi_status *st) {
    if (mo.dummy) return llmi_fail(st, LLMI_E_USAGE, "--dummy: generate needs a tokenizer; use llmi bench for synthetic weights");
    bool seed_random = !o.seed_given;
    if (seed_random) o.params.sampling.seed = random_seed();

    grammar *grammar = NULL;   /* every request's, unless its --prompts line has its own */
    if (o.grammar_flag && flag_grammar(&o, &grammar, st)) return st->code;
    o.params.grammar = grammar;
    if (o.conversation) {
        int crc = conversation_run(&o, &mo, st);
        grammar_free(grammar);
        return crc;
    }
    gen_request *reqs = NULL;
    int n_reqs = 0;
    if (collect_prompts(&o, &reqs, &n_reqs, st)) {
        grammar_free(grammar);
        return st->code;
    }

    llmi_model m;
    llmi_backend *b = NULL;
    llmi_engine *e = NULL;
    gen_ctx g = {0};
    bool any_draft = false;
    int max_spec_k = 0;
    for (int i = 0; i < n_reqs; i++) {
        const llmi_spec_params *sp = &reqs[i].params.spec;
        any_draft |= sp->mode == LLMI_SPEC_DRAFT;
        if (sp->mode != LLMI_SPEC_OFF && sp->k > max_spec_k) max_spec_k = sp->k;
    }
    int rc = check_request_flags(&o, reqs, n_reqs, st);
    if (!rc) rc = open_for_generate(&mo, any_draft, max_spec_k, &m, &b, &e, st);
    if (rc) goto out_reqs;

    g = (gen_ctx){.engine = e, .reqs = reqs, .n_reqs = n_reqs, .tok = m.tok, .json = o.json,
                  .stream_out = n_reqs == 1 && !o.json && !o.prompts_file};
    if (!(g.finished = malloc((size_t)n_reqs * sizeof *g.finished))) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        goto out;
    }
    double t0 = engine_now(e);
    int n_failed = 0;
    for (int i = 0; i < n_reqs; i++) {
        gen_request *r = &reqs[i];
        r->engine_id = -1;
        /* Requests without their own seed get distinct but reproducible ones; a line's
         * "seed" is used as given (comparing it with -s could not tell the two apart), and
         * its samples count up from it, as vLLM seeds the n completions of a request. */
        r->params.sampling.seed += r->own_seed ? (uint64_t)r->sample : (uint64_t)i;
        tok_stream_init(&r->stream, m.tok, !r->params.keep_special);
        llmi_status rst = {0};
        char *text = r->prompt;
        char *chat = NULL;
        /* a line's "messages" in the model's chat template, --chat or not (its system
         * message, else --system) */
        bool templated = o.chat || r->n_turns > 0;
        if (r->given_ids) {
            /* "prompt_token_ids": the prompt as given, --chat or not */
            if ((r->prompt_ids = malloc((size_t)r->n_given * sizeof *r->prompt_ids))) {
                memcpy(r->prompt_ids, r->given_ids, (size_t)r->n_given * sizeof *r->prompt_ids);
                r->n_prompt = r->n_given;
            } else {
                llmi_fail(&rst, LLMI_E_RUNTIME, "out of memory");
            }
        } else if (r->n_turns > 0) {
            if (tok_chat_messages(m.tok, r->system ? r->system : o.system, (const char *const *)r->turns, r->n_turns,
                                  &chat, &rst) == LLMI_OK)
                text = chat;
        } else if (o.chat && tok_chat_format(m.tok, o.system, r->prompt, &chat, &rst) == LLMI_OK) {
            text = chat;
        }
        if (!rst.code && !r->given_ids)
            tok_encode(m.tok, text, strlen(text), !templated, true, &r->prompt_ids, &r->n_prompt, &rst);
        free(chat);
        if (!rst.code && r->truncate > 0 && r->n_prompt > r->truncate) {
            /* vLLM's truncate_prompt_tokens: the prompt's last N tokens */
            memmove(r->prompt_ids, r->prompt_ids + (r->n_prompt - r->truncate), (size_t)r->truncate * sizeof *r->prompt_ids);
            r->n_prompt = r->truncate;
        }
        if (!rst.code && r->n_bad_words > 0) {
            if (m.tok) tokenize_bad_words(m.tok, r, &rst);
            else llmi_fail(&rst, LLMI_E_USAGE, "bad_words: the model has no tokenizer to spell them with");
        }
        if (!rst.code && o.verbose_prompt) print_prompt_tokens(m.tok, r);
        if (!rst.code) engine_add_request(e, r->prompt_ids, r->n_prompt, &r->params, r, &r->engine_id, &rst);
        if (rst.code) {
            if (n_reqs == 1) {
                rc = llmi_fail(st, rst.code, "%s", rst.msg);
                goto out;
            }
            fprintf(stderr, "llmi: request %d: %s\n", i, rst.msg);
            r->error = strdup(rst.msg);
            r->done = true;
            n_failed++;
        }
    }
    emit_ready(&g);

    bool interrupted;
    if ((rc = drive(&g, e, &interrupted, st))) goto out;
    double wall = engine_now(e) - t0;
    emit_ready(&g);
    out_flush(&g);
    if (!o.no_stats) print_stats(&g, e, b, wall, o.params.sampling.seed, seed_random);
    if (g.out_errno) rc = llmi_fail(st, LLMI_E_RUNTIME, "generate: cannot write to stdout: %s", strerror(g.out_errno));
    else if (g.oom) rc = llmi_fail(st, LLMI_E_RUNTIME, "generate: out of memory keeping the outputs");
    else if (interrupted) rc = llmi_fail(st, LLMI_E_INTERRUPT, "interrupted");
    else if (n_failed + g.n_failed_late)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%d of %d requests failed (see above)", n_failed + g.n_failed_late, n_reqs);
out:
    free(g.finished);
    cli_close_engine(b, e);
    model_free(&m);
out_reqs:
    for (int i = 0; i < n_reqs; i++) request_free(&reqs[i]);
    free(reqs);
    grammar_free(grammar);
    return rc;
}

int cmd_generate(int argc, char **argv, llmi_status *st) {
    gen_opts o = {0};
    o.params = request_params_defaults();
    o.params.max_tokens = 128;
    o.samples = 1;
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    bool help = false;
    int rc = parse_gen_flags(argc, argv, &o, &mo, &help, st);
    if (!rc && help) printf("%s%s", gen_help, cli_model_flags_help());
    if (!rc && !help) rc = generate_run(o, mo, st);
    free(o.bias);
    return rc;
}
