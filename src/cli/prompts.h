/* prompts.h — owns the requests of `llmi generate`'s --prompts FILE: one request per
 * line, plain text or a JSON object ("prompt" and optional max_tokens, temperature,
 * top_k, top_p, min_p, typical_p, top_n_sigma, xtc_probability, xtc_threshold,
 * repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, logit_bias,
 * dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers, seed,
 * stop, ignore_eos, logprobs, spec, spec_k, spec_ngram_min, spec_ngram_max, grammar,
 * json_schema, n, min_tokens, stop_token_ids, mirostat, mirostat_tau, mirostat_eta,
 * prompt_logprobs, allowed_token_ids, bad_words, include_stop_str_in_output,
 * skip_special_tokens, truncate_prompt_tokens; or "messages", OpenAI's list of
 * {"role", "content"}, or
 * "prompt_token_ids", the prompt as token ids, instead of "prompt") over the
 * command line's defaults; blank lines are skipped.  Parsed from memory so that the
 * fuzz target (tests/fuzz/fuzz_prompts_jsonl.c) reads exactly what the binary reads. */
#ifndef LLMI_PROMPTS_H
#define LLMI_PROMPTS_H

#include "core/status.h"
#include "engine/engine.h"

/* Most completions of one prompt (--samples, a line's "n"). */
#define PROMPTS_MAX_SAMPLES 1024
/* Most messages in a line's "messages". */
#define PROMPTS_MAX_MESSAGES 1024
/* Most ids in a line's "prompt_token_ids". */
#define PROMPTS_MAX_PROMPT_IDS (1 << 24)
/* Most entries in a line's "allowed_token_ids" and "bad_words". */
#define PROMPTS_MAX_ALLOWED (1 << 20)
#define PROMPTS_MAX_BAD_WORDS 1024

typedef struct prompt_entry {
    char *prompt;                    /* the text as given, owned */
    llmi_request_params params;      /* the defaults with the line's fields over them */
    char *stops[LLMI_MAX_STOP];      /* owned copies behind params.stop */
    bool own_seed;                   /* the line gave "seed": keep it as given */
    grammar *own_grammar;            /* the line's "grammar" or "json_schema", behind params.grammar */
    llmi_logit_bias *own_bias;       /* the line's "logit_bias", behind params.sampling.logit_bias */
    char **own_breakers;             /* the line's "dry_sequence_breakers" (each owned), behind
                                        params.sampling.dry_breakers */
    int n_samples;                   /* the line's "n": completions of this prompt; 0 = not given */
    /* the line's "messages" instead of "prompt": a system message (owned, or NULL) and the
     * turns after it, user, assistant, ..., user (each owned); prompt is then the last user
     * message, for display */
    char *system;
    char **turns;                    /* (n_turns) */
    int n_turns;
    /* the line's "prompt_token_ids" instead of "prompt": the ids (owned; prompt is "") */
    int32_t *prompt_ids;             /* (n_prompt_ids) */
    int n_prompt_ids;
    int32_t *own_allowed;            /* the line's "allowed_token_ids", behind params.allowed_ids */
    char **bad_words;                /* (n_bad_words) the line's "bad_words", each owned (generate
                                        tokenizes them into params.bad_ids) */
    int n_bad_words;
    bool include_stop;               /* the line's "include_stop_str_in_output" */
    int truncate;                    /* the line's "truncate_prompt_tokens": keep the prompt's
                                        last N tokens; 0 = all */
} prompt_entry;

/* Frees a list of n owned strings and the array (a line's turns, DRY breakers, bad words). */
void prompts_free_strings(char **list, int n);

/* Appends (id, bias) to the list *list (n, cap; grown with realloc); where names the flag
 * or line.  The engine checks ids against the vocabulary. */
int prompts_add_logit_bias(llmi_logit_bias **list, int *n, int *cap, int32_t id, float bias, const char *where,
                           llmi_status *st);

/* A grammar from GBNF text or from a JSON schema's text (exactly one non-NULL); where names
 * the flag or line for messages. */
int prompts_grammar(const char *gbnf, const char *schema, size_t len, const char *where, grammar **out, llmi_status *st);

/* Appends stop string s to p, its copy owned by owned[]; where names the flag or line. */
int prompts_add_stop(llmi_request_params *p, char **owned, const char *s, const char *where, llmi_status *st);
/* Copies defaults into e (stop strings duplicated). */
int prompts_entry_init(prompt_entry *e, const llmi_request_params *defaults, llmi_status *st);
/* Parses text (NUL-terminated, no NUL inside) read from file into *out (n_out entries,
 * malloc'ed; free with prompts_free).  Errors name file and line; no entries is an error. */
int prompts_parse(const char *text, const char *file, const llmi_request_params *defaults, prompt_entry **out,
                  int *n_out, llmi_status *st);
void prompts_entry_free(prompt_entry *e);
void prompts_free(prompt_entry *e, int n);

#endif
