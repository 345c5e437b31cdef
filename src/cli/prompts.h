/* prompts.h — owns the requests of `llmi generate`'s --prompts FILE: one request per
 * line, plain text or a JSON object ("prompt" and optional max_tokens, temperature,
 * top_k, top_p, min_p, repeat_penalty, seed, stop, ignore_eos, logprobs, spec, spec_k,
 * spec_ngram_min, spec_ngram_max, grammar, json_schema) over the
 * command line's defaults; blank lines are skipped.  Parsed from memory so that the
 * fuzz target (tests/fuzz/fuzz_prompts_jsonl.c) reads exactly what the binary reads. */
#ifndef LLMI_PROMPTS_H
#define LLMI_PROMPTS_H

#include "core/status.h"
#include "engine/engine.h"

typedef struct prompt_entry {
    char *prompt;                    /* the text as given, owned */
    llmi_request_params params;      /* the defaults with the line's fields over them */
    char *stops[LLMI_MAX_STOP];      /* owned copies behind params.stop */
    bool own_seed;                   /* the line gave "seed": keep it as given */
    grammar *own_grammar;            /* the line's "grammar" or "json_schema", behind params.grammar */
} prompt_entry;

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
