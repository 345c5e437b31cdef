/* prompts.c — the --prompts file of `llmi generate` (see prompts.h). */
#include "cli/prompts.h"
#include "cli/cli.h"
#include "engine/dry.h"
#include "engine/json_schema.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int prompts_add_stop(llmi_request_params *p, char **owned, const char *s, const char *where, llmi_status *st) {
    if (p->n_stop >= LLMI_MAX_STOP) return llmi_fail(st, LLMI_E_USAGE, "%s: at most %d stop strings", where, LLMI_MAX_STOP);
    if (!*s) return llmi_fail(st, LLMI_E_USAGE, "%s: empty stop string", where);
    owned[p->n_stop] = strdup(s);
    if (!owned[p->n_stop]) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    p->stop[p->n_stop] = owned[p->n_stop];
    p->n_stop++;
    return LLMI_OK;
}

int prompts_add_logit_bias(llmi_logit_bias **list, int *n, int *cap, int32_t id, float bias, const char *where,
                           llmi_status *st) {
    if (*n >= LLMI_MAX_LOGIT_BIAS) return llmi_fail(st, LLMI_E_USAGE, "%s: at most %d logit biases", where, LLMI_MAX_LOGIT_BIAS);
    if (id < 0) return llmi_fail(st, LLMI_E_USAGE, "%s: token id %d is negative", where, id);
    if (!(bias <= 100.0f && (bias >= -100.0f || bias == -INFINITY)))
        return llmi_fail(st, LLMI_E_USAGE, "%s: bias %g for token %d is not in -100..100 or -inf", where, (double)bias, id);
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 8;
        llmi_logit_bias *m = realloc(*list, (size_t)c * sizeof *m);
        if (!m) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        *list = m;
        *cap = c;
    }
    (*list)[(*n)++] = (llmi_logit_bias){id, bias};
    return LLMI_OK;
}

/* A line's "logit_bias": {"id": bias, ...} as OpenAI and vLLM take it, or [[id, bias], ...]
 * as llama.cpp's server does; a bias of false bans the token (-inf), as there. */
static int parse_logit_bias(const cJSON *v, const char *file, int lineno, prompt_entry *r, llmi_status *st) {
    char where[96];
    snprintf(where, sizeof where, "--prompts: %s:%d: \"logit_bias\"", file, lineno);
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v))
        return llmi_fail(st, LLMI_E_USAGE, "%s must be an object {\"id\": bias} or a list [[id, bias]]", where);
    int n = 0, cap = 0;
    llmi_logit_bias *list = NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        const cJSON *idv = NULL, *bv = e;
        double id;
        if (cJSON_IsObject(v)) {
            char *end;
            long k = strtol(e->string, &end, 10);
            if (!*e->string || *end || k < 0 || k > INT32_MAX) {
                free(list);
                return llmi_fail(st, LLMI_E_USAGE, "%s: key '%.40s' is not a token id", where, e->string);
            }
            id = (double)k;
        } else {
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(idv = cJSON_GetArrayItem(e, 0))) {
                free(list);
                return llmi_fail(st, LLMI_E_USAGE, "%s: entries must be [token id, bias]", where);
            }
            bv = cJSON_GetArrayItem(e, 1);
            id = idv->valuedouble;
            if (id != floor(id) || id < 0 || id > INT32_MAX) {
                free(list);
                return llmi_fail(st, LLMI_E_USAGE, "%s: %g is not a token id", where, id);
            }
        }
        float bias;
        if (cJSON_IsFalse(bv)) bias = -INFINITY;
        else if (cJSON_IsNumber(bv)) bias = (float)bv->valuedouble;
        else {
            free(list);
            return llmi_fail(st, LLMI_E_USAGE, "%s: a bias must be a number or false (ban)", where);
        }
        if (prompts_add_logit_bias(&list, &n, &cap, (int32_t)id, bias, where, st)) {
            free(list);
            return st->code;
        }
    }
    /* the line's biases replace the command line's */
    free(r->own_bias);
    r->own_bias = list;
    r->params.sampling.logit_bias = list;
    r->params.sampling.n_logit_bias = n;
    return LLMI_OK;
}

void prompts_free_strings(char **list, int n) {
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}

int prompts_grammar(const char *gbnf, const char *schema, size_t len, const char *where, grammar **out, llmi_status *st) {
    *out = NULL;
    if (gbnf) return grammar_parse(gbnf, len, where, out, st);
    char *made = NULL;
    llmi_status cst = {0};
    if (json_schema_to_gbnf(schema, len, &made, &cst))
        return llmi_fail(st, cst.code, "%s: %s", where, cst.msg);
    char what[256];
    snprintf(what, sizeof what, "%s (its grammar)", where);
    int rc = grammar_parse(made, strlen(made), what, out, st);
    free(made);
    return rc;
}

int prompts_entry_init(prompt_entry *e, const llmi_request_params *defaults, llmi_status *st) {
    e->params = *defaults;
    e->params.n_stop = 0;
    for (int i = 0; i < defaults->n_stop; i++)
        if (prompts_add_stop(&e->params, e->stops, defaults->stop[i], "--stop", st)) return st->code;
    return LLMI_OK;
}

void prompts_entry_free(prompt_entry *e) {
    prompts_free_strings(e->turns, e->n_turns);
    e->turns = NULL;
    e->n_turns = 0;
    free(e->system);
    e->system = NULL;
    grammar_free(e->own_grammar);
    e->own_grammar = NULL;
    free(e->own_bias);
    e->own_bias = NULL;
    if (e->own_breakers) prompts_free_strings(e->own_breakers, e->params.sampling.n_dry_breakers);
    e->own_breakers = NULL;
    free(e->prompt);
    free(e->prompt_ids);
    e->prompt_ids = NULL;
    e->n_prompt_ids = 0;
    for (int i = 0; i < e->params.n_stop; i++) free(e->stops[i]);
    e->prompt = NULL;
    e->params.n_stop = 0;
    free(e->own_allowed);
    e->own_allowed = NULL;
    e->params.allowed_ids = NULL;
    e->params.n_allowed = 0;
    prompts_free_strings(e->bad_words, e->n_bad_words);
    e->bad_words = NULL;
    e->n_bad_words = 0;
}

void prompts_free(prompt_entry *e, int n) {
    for (int i = 0; i < n; i++) prompts_entry_free(&e[i]);
    free(e);
}

/* OpenAI's "messages": an optional system message first, then user and assistant messages
 * alternating from a user message to a user message (the one answered), each
 * {"role": ..., "content": string}. */
static int parse_messages(const cJSON *msgs, const char *file, int lineno, prompt_entry *r, llmi_status *st) {
    int n = cJSON_IsArray(msgs) ? cJSON_GetArraySize(msgs) : -1;
    if (n < 1 || n > PROMPTS_MAX_MESSAGES)
        return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"messages\" must be a list of 1 to %d messages", file,
                         lineno, PROMPTS_MAX_MESSAGES);
    if (!(r->turns = calloc((size_t)n, sizeof *r->turns))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !cJSON_IsString(content))
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: message %d must be {\"role\": ..., \"content\": a string}",
                             file, lineno, i + 1);
        const char *want = r->n_turns % 2 == 0 ? "user" : "assistant";
        bool system = i == 0 && !strcmp(role->valuestring, "system");
        if (!system && strcmp(role->valuestring, want))
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: message %d has role \"%.32s\" where \"%s\" must come "
                             "(a system message first, then user and assistant alternating)",
                             file, lineno, i + 1, role->valuestring, want);
        char *c = strdup(content->valuestring);
        if (!c) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        if (system) r->system = c;
        else r->turns[r->n_turns++] = c;
        i++;
    }
    if (r->n_turns % 2 == 0)
        return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"messages\" must end with a user message (the one answered)",
                         file, lineno);
    if (!(r->prompt = strdup(r->turns[r->n_turns - 1]))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    return LLMI_OK;
}

/* A line's list of 1..max_n token ids under key into *out (malloc'ed, *n ids; the engine
 * checks them against the vocabulary). */
static int parse_id_list(const cJSON *ids, const char *key, int max_n, const char *file, int lineno, int32_t **out,
                         int *n_out, llmi_status *st) {
    int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
    if (n < 1 || n > max_n)
        return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"%s\" must be a list of 1 to %d token ids", file, lineno,
                         key, max_n);
    if (!(*out = malloc((size_t)n * sizeof **out))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    const cJSON *id;
    cJSON_ArrayForEach(id, ids) {
        if (!cJSON_IsNumber(id) || !(id->valuedouble >= 0 && id->valuedouble <= INT32_MAX) ||
            id->valuedouble != floor(id->valuedouble))
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"%s\": item %d is not a token id (a non-negative "
                             "integer)", file, lineno, key, *n_out + 1);
        (*out)[(*n_out)++] = (int32_t)id->valuedouble;
    }
    return LLMI_OK;
}

/* vLLM's TokensPrompt: the prompt as token ids, used as given. */
static int parse_prompt_ids(const cJSON *ids, const char *file, int lineno, prompt_entry *r, llmi_status *st) {
    if (!(r->prompt = strdup(""))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    return parse_id_list(ids, "prompt_token_ids", PROMPTS_MAX_PROMPT_IDS, file, lineno, &r->prompt_ids,
                         &r->n_prompt_ids, st);
}

/* vLLM's allowed_token_ids, bad_words, include_stop_str_in_output, skip_special_tokens and
 * truncate_prompt_tokens (null: not given). */
static int parse_vllm_controls(const cJSON *j, const char *file, int lineno, prompt_entry *r, llmi_status *st) {
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "allowed_token_ids");
    if (al && !cJSON_IsNull(al)) {
        r->params.n_allowed = 0;
        if (parse_id_list(al, "allowed_token_ids", PROMPTS_MAX_ALLOWED, file, lineno, &r->own_allowed,
                          &r->params.n_allowed, st))
            return st->code;
        r->params.allowed_ids = r->own_allowed;
    }
    const cJSON *bw = cJSON_GetObjectItemCaseSensitive(j, "bad_words");
    if (bw && !cJSON_IsNull(bw)) {
        int n = cJSON_IsArray(bw) ? cJSON_GetArraySize(bw) : -1;
        if (n < 0 || n > PROMPTS_MAX_BAD_WORDS)
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"bad_words\" must be a list of at most %d strings",
                             file, lineno, PROMPTS_MAX_BAD_WORDS);
        if (!(r->bad_words = calloc((size_t)n + 1, sizeof *r->bad_words)))
            return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        const cJSON *w;
        cJSON_ArrayForEach(w, bw) {
            const char *t = cJSON_IsString(w) ? w->valuestring : NULL;
            while (t && (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r')) t++;   /* vLLM lstrips each word */
            if (!t || !*t)
                return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"bad_words\" entries must be strings with "
                                 "more than white space", file, lineno);
            if (!(r->bad_words[r->n_bad_words] = strdup(t))) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            r->n_bad_words++;
        }
    }
    struct { const char *key; bool *dst; bool invert; } flags[] = {
        {"include_stop_str_in_output", &r->include_stop, false},
        {"skip_special_tokens", &r->params.keep_special, true},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, flags[i].key);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsBool(v))
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"%s\" must be true or false", file, lineno,
                             flags[i].key);
        *flags[i].dst = cJSON_IsTrue(v) != flags[i].invert;
    }
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "truncate_prompt_tokens");
    if (tr && !cJSON_IsNull(tr)) {
        if (!cJSON_IsNumber(tr) || !(tr->valuedouble >= 1 && tr->valuedouble <= PROMPTS_MAX_PROMPT_IDS) ||
            tr->valuedouble != floor(tr->valuedouble))
            return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"truncate_prompt_tokens\" must be null or an integer "
                             "in 1..%d", file, lineno, PROMPTS_MAX_PROMPT_IDS);
        r->truncate = (int)tr->valuedouble;
    }
    return LLMI_OK;
}

/* Reads per-request fields of one JSONL line over the defaults. */
static int parse_json_request(const char *line, const char *file, int lineno, prompt_entry *r, llmi_status *st) {
    cJSON *j = cJSON_Parse(line);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: not a JSON object", file, lineno);
    }
    int rc = LLMI_OK;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt"), *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "prompt_token_ids");
    if ((p != NULL) + (msgs != NULL) + (ids != NULL) > 1) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: give one of \"prompt\", \"messages\" and \"prompt_token_ids\"",
                       file, lineno);
        goto out;
    }
    if (msgs) {
        if ((rc = parse_messages(msgs, file, lineno, r, st))) goto out;
    } else if (ids) {
        if ((rc = parse_prompt_ids(ids, file, lineno, r, st))) goto out;
    } else if (!cJSON_IsString(p)) {
        rc = llmi_fail(st, LLMI_E_USAGE,
                       "--prompts: %s:%d: \"prompt\" must be a string (or give \"messages\" or \"prompt_token_ids\")", file,
                       lineno);
        goto out;
    } else if (!(r->prompt = strdup(p->valuestring))) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
        goto out;
    }
    struct { const char *key; double min, max; int kind; void *dst; } fields[] = {
        {"max_tokens", -1, 1 << 24, 0, &r->params.max_tokens},
        {"n_predict", -1, 1 << 24, 0, &r->params.max_tokens},
        {"temperature", 0, 100, 1, &r->params.sampling.temperature},
        {"temp", 0, 100, 1, &r->params.sampling.temperature},
        {"top_k", 0, 1 << 24, 0, &r->params.sampling.top_k},
        {"top_p", 0, 1, 1, &r->params.sampling.top_p},
        {"min_p", 0, 1, 1, &r->params.sampling.min_p},
        {"typical_p", 0, 1, 1, &r->params.sampling.typical_p},
        {"top_n_sigma", -1, 100, 1, &r->params.sampling.top_n_sigma},
        {"xtc_probability", 0, 1, 1, &r->params.sampling.xtc_probability},
        {"xtc_threshold", 0, 1, 1, &r->params.sampling.xtc_threshold},
        {"repeat_penalty", 0.01, 100, 1, &r->params.sampling.repeat_penalty},   /* as --repeat-penalty: 0 divides */
        {"frequency_penalty", -100, 100, 1, &r->params.sampling.frequency_penalty},
        {"presence_penalty", -100, 100, 1, &r->params.sampling.presence_penalty},
        {"repeat_last_n", -1, 1 << 24, 0, &r->params.sampling.repeat_last_n},
        {"dry_multiplier", 0, 100, 1, &r->params.sampling.dry_multiplier},
        {"dry_base", 0, 100, 1, &r->params.sampling.dry_base},
        {"dry_allowed_length", 0, 1 << 20, 0, &r->params.sampling.dry_allowed_length},
        {"dry_penalty_last_n", -1, 1 << 24, 0, &r->params.sampling.dry_penalty_last_n},
        {"logprobs", 0, LLMI_MAX_LOGPROBS, 0, &r->params.logprobs},
        {"spec_k", 1, LLMI_SPEC_MAX_K, 0, &r->params.spec.k},
        {"spec_ngram_min", 1, LLMI_SPEC_MAX_NGRAM, 0, &r->params.spec.ngram_min},
        {"spec_ngram_max", 1, LLMI_SPEC_MAX_NGRAM, 0, &r->params.spec.ngram_max},
        {"n", 1, PROMPTS_MAX_SAMPLES, 0, &r->n_samples},
        {"min_tokens", 0, 1 << 24, 0, &r->params.min_tokens},
        {"mirostat", 0, 2, 0, &r->params.sampling.mirostat},
        {"mirostat_tau", 0, 100, 1, &r->params.sampling.mirostat_tau},
        {"mirostat_eta", 0, 100, 1, &r->params.sampling.mirostat_eta},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, fields[i].key);
        if (!v) continue;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= fields[i].min && v->valuedouble <= fields[i].max) ||
            (fields[i].kind == 0 && v->valuedouble != floor(v->valuedouble))) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"%s\" must be a number in %.10g..%.10g", file, lineno,
                           fields[i].key, fields[i].min, fields[i].max);
            goto out;
        }
        if (fields[i].kind == 0) *(int *)fields[i].dst = (int)v->valuedouble;
        else *(float *)fields[i].dst = (float)v->valuedouble;
    }
    const cJSON *spec = cJSON_GetObjectItemCaseSensitive(j, "spec");
    if (spec) {
        char flag[64];
        snprintf(flag, sizeof flag, "--prompts: %s:%d: \"spec\"", file, lineno);
        if (!cJSON_IsString(spec)) {
            rc = llmi_fail(st, LLMI_E_USAGE, "%s must be \"ngram\", \"draft\" or \"off\"", flag);
            goto out;
        }
        if ((rc = cli_parse_spec_mode(flag, spec->valuestring, &r->params.spec.mode, st))) goto out;
    }
    if (r->params.spec.ngram_min > r->params.spec.ngram_max) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: spec_ngram_min %d exceeds spec_ngram_max %d", file, lineno,
                       r->params.spec.ngram_min, r->params.spec.ngram_max);
        goto out;
    }
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (seed) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble < 0 || seed->valuedouble > 9007199254740992.0) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"seed\" must be a non-negative integer", file, lineno);
            goto out;
        }
        r->params.sampling.seed = (uint64_t)seed->valuedouble;
        r->own_seed = true;
    }
    const cJSON *plp = cJSON_GetObjectItemCaseSensitive(j, "prompt_logprobs");
    if (plp) {
        /* null: none, whatever --prompt-logprobs says */
        if (!cJSON_IsNull(plp) && (!cJSON_IsNumber(plp) || !(plp->valuedouble >= 0 && plp->valuedouble <= LLMI_MAX_LOGPROBS) ||
                                   plp->valuedouble != floor(plp->valuedouble))) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"prompt_logprobs\" must be null or a number in 0..%d",
                           file, lineno, LLMI_MAX_LOGPROBS);
            goto out;
        }
        r->params.prompt_logprobs = !cJSON_IsNull(plp);
        r->params.prompt_top = r->params.prompt_logprobs ? (int)plp->valuedouble : 0;
    }
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(j, "stop_token_ids");
    if (sid) {
        /* the line's list replaces the command line's --stop-token-id */
        int n = cJSON_IsArray(sid) ? cJSON_GetArraySize(sid) : -1;
        if (n < 0 || n > LLMI_MAX_STOP_IDS) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"stop_token_ids\" must be a list of at most %d token ids",
                           file, lineno, LLMI_MAX_STOP_IDS);
            goto out;
        }
        r->params.n_stop_ids = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, sid) {
            if (!cJSON_IsNumber(id) || !(id->valuedouble >= 0 && id->valuedouble <= INT32_MAX) ||
                id->valuedouble != floor(id->valuedouble)) {
                rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"stop_token_ids\": each must be a token id "
                               "(a non-negative integer)", file, lineno);
                goto out;
            }
            r->params.stop_ids[r->params.n_stop_ids++] = (int32_t)id->valuedouble;
        }
    }
    const cJSON *ie = cJSON_GetObjectItemCaseSensitive(j, "ignore_eos");
    if (ie) {
        if (!cJSON_IsBool(ie)) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"ignore_eos\" must be true or false", file, lineno);
            goto out;
        }
        r->params.ignore_eos = cJSON_IsTrue(ie);
    }
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(j, "grammar");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "json_schema");
    if (gr || js) {
        char where[128];
        snprintf(where, sizeof where, "--prompts: %s:%d: \"%s\"", file, lineno, gr ? "grammar" : "json_schema");
        if (gr && js) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: give \"grammar\" or \"json_schema\", not both", file, lineno);
            goto out;
        }
        if (gr && !cJSON_IsString(gr)) {
            rc = llmi_fail(st, LLMI_E_USAGE, "%s must be a string of GBNF", where);
            goto out;
        }
        if (js && !cJSON_IsObject(js) && !cJSON_IsString(js)) {
            rc = llmi_fail(st, LLMI_E_USAGE, "%s must be a JSON schema (an object, or a string holding one)", where);
            goto out;
        }
        char *schema = js ? (cJSON_IsString(js) ? strdup(js->valuestring) : cJSON_PrintUnformatted(js)) : NULL;
        if (js && !schema) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            goto out;
        }
        const char *text = gr ? gr->valuestring : schema;
        rc = prompts_grammar(gr ? text : NULL, schema, strlen(text), where, &r->own_grammar, st);
        free(schema);
        if (rc) goto out;
        r->params.grammar = r->own_grammar;
    }
    const cJSON *br = cJSON_GetObjectItemCaseSensitive(j, "dry_sequence_breakers");
    if (br) {
        /* the line's breakers replace the command line's ([] for none) */
        int n = cJSON_GetArraySize(br);
        if (!cJSON_IsArray(br) || n > DRY_MAX_BREAKERS) {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"dry_sequence_breakers\" must be a list of at most %d strings",
                           file, lineno, DRY_MAX_BREAKERS);
            goto out;
        }
        char **list = calloc((size_t)n + 1, sizeof *list);
        if (!list) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            goto out;
        }
        int k = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, br) {
            if (!cJSON_IsString(e) || !*e->valuestring) {
                rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"dry_sequence_breakers\" entries must be non-empty strings",
                               file, lineno);
                break;
            }
            if (!(list[k++] = strdup(e->valuestring))) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
                break;
            }
        }
        if (rc) {
            prompts_free_strings(list, k);
            goto out;
        }
        if (r->own_breakers) prompts_free_strings(r->own_breakers, r->params.sampling.n_dry_breakers);
        r->own_breakers = list;
        r->params.sampling.dry_breakers = (const char *const *)list;
        r->params.sampling.n_dry_breakers = n;
    }
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(j, "logit_bias");
    if (lb && (rc = parse_logit_bias(lb, file, lineno, r, st))) goto out;
    if ((rc = parse_vllm_controls(j, file, lineno, r, st))) goto out;
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
    if (stop) {
        /* Per-request stops replace the command line's. */
        for (int i = 0; i < r->params.n_stop; i++) free(r->stops[i]);
        r->params.n_stop = 0;
        char where[64];
        snprintf(where, sizeof where, "--prompts line %d", lineno);
        if (cJSON_IsString(stop)) {
            rc = prompts_add_stop(&r->params, r->stops, stop->valuestring, where, st);
        } else if (cJSON_IsArray(stop)) {
            const cJSON *s;
            cJSON_ArrayForEach(s, stop) {
                if (!cJSON_IsString(s)) {
                    rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"stop\" entries must be strings", file, lineno);
                    goto out;
                }
                if ((rc = prompts_add_stop(&r->params, r->stops, s->valuestring, where, st))) goto out;
            }
        } else {
            rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: %s:%d: \"stop\" must be a string or a list", file, lineno);
        }
    }
out:
    cJSON_Delete(j);
    return rc;
}

int prompts_parse(const char *text, const char *file, const llmi_request_params *defaults, prompt_entry **out,
                  int *n_out, llmi_status *st) {
    *out = NULL;
    *n_out = 0;
    char *all = strdup(text);
    if (!all) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    int cap = 16, n = 0;
    prompt_entry *reqs = calloc((size_t)cap, sizeof *reqs);
    int lineno = 0, rc = LLMI_OK;
    char *save = NULL;
    for (char *line = strtok_r(all, "\n", &save); line && reqs; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        size_t L = strlen(line);
        if (L && line[L - 1] == '\r') line[--L] = '\0';
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) continue;
        if (n == cap) {
            prompt_entry *nr = realloc(reqs, (size_t)cap * 2 * sizeof *nr);
            if (!nr) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
                break;
            }
            memset(nr + cap, 0, (size_t)cap * sizeof *nr);
            reqs = nr;
            cap *= 2;
        }
        prompt_entry *r = &reqs[n++];
        if ((rc = prompts_entry_init(r, defaults, st))) break;
        if (*p == '{') {
            if ((rc = parse_json_request(p, file, lineno, r, st))) break;
        } else if (!(r->prompt = strdup(line))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
            break;
        }
    }
    free(all);
    if (!reqs) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory");
    if (!rc && n == 0) rc = llmi_fail(st, LLMI_E_USAGE, "--prompts: '%s' holds no prompts", file);
    if (rc) {
        prompts_free(reqs, n);
        return rc;
    }
    *out = reqs;
    *n_out = n;
    return LLMI_OK;
}
