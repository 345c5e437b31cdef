/* tok_gguf.c — owns the GGUF front end of the tokenizer: tok_load_gguf reads the
 * tokenizer.ggml.* metadata (model and pre-tokenizer kind, vocabulary, scores, token
 * types, merges, special ids, chat template) into a tok_spec, and tok_create turns a
 * tok_spec into a tokenizer with llama.cpp's reading of it (control tokens special,
 * SentencePiece defaults).  Everything from the file is untrusted and bounded. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "model/gguf.h"
#include "tok/tok_internal.h"

#define TOK_GGUF_MAX_TOKENS (1u << 24)
#define TOK_GGUF_MAX_MERGES (1u << 24)

/* What tok_load_gguf gathers for tok_create; the arrays are freed after the call (the
 * spec borrows them, and the token strings point into the file's mapping). */
typedef struct gguf_tok {
    tok_spec s;
    const char **tokens; uint32_t *token_lens;   /* (n_tokens) */
    float *scores; int32_t *types;               /* (n_tokens) or NULL */
    const char **merges; uint32_t *merge_lens;   /* (n_merges) or NULL */
    int32_t eog[TOK_EOG_ROLES];                  /* the ids the file names per tok_eog_role, -1 for none */
    char *chat_template;
} gguf_tok;

static void gguf_tok_free(gguf_tok *a) {
    free(a->tokens); free(a->token_lens); free(a->scores); free(a->types);
    free(a->merges); free(a->merge_lens); free(a->chat_template);
}

/* tokenizer.ggml.model and .pre: which model and pre-tokenizer, and llama.cpp's add_bos
 * default that goes with them. */
static int gguf_tok_kind(const gguf_file *g, tok_spec *s, llmi_status *st) {
    gguf_str model, pre = {0};
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.model", g->path);
    if (gguf_str_eq(model, "gpt2")) s->model = TOK_MODEL_BYTELEVEL_BPE;
    else if (gguf_str_eq(model, "llama")) s->model = TOK_MODEL_SPM_BPE;
    else
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported tokenizer model %.*s (supported: gpt2, llama)", g->path,
                         (int)(model.len > 32 ? 32 : model.len), model.p);
    rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    bool bpe = s->model == TOK_MODEL_BYTELEVEL_BPE;
    s->pre = bpe ? TOK_PRE_GPT2 : TOK_PRE_NONE;
    s->add_bos = !bpe;
    if (rc == 0 || gguf_str_eq(pre, "default")) return 0;
    if (!tok_gguf_pre_of(pre.p, pre.len, &s->pre, &s->add_bos))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported pre-tokenizer %.*s", g->path,
                         (int)(pre.len > 32 ? 32 : pre.len), pre.p);
    return 0;
}

/* The result rc of reading an optional per-token array of key: absent, or one entry per token. */
static int gguf_tok_per_token(const gguf_file *g, const char *key, int rc, uint64_t got, uint64_t n_tokens,
                              llmi_status *st) {
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc > 0 && got != n_tokens)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s has %llu entries, tokens %llu", g->path, key,
                         (unsigned long long)got, (unsigned long long)n_tokens);
    return 0;
}

/* The per-token arrays (tokens; scores and types, which must match them in length) and
 * the merges, which byte-level BPE needs and SentencePiece files may lack. */
static int gguf_tok_vocab(const gguf_file *g, gguf_tok *a, llmi_status *st) {
    const char *path = g->path;
    tok_spec *s = &a->s;
    uint64_t n = 0, n2 = 0;
    int rc = gguf_get_str_array(g, "tokenizer.ggml.tokens", TOK_GGUF_MAX_TOKENS, &a->tokens, &a->token_lens, &n, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0 || n == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.tokens", path);
    s->n_tokens = (int)n;
    s->tokens = a->tokens;
    s->token_lens = a->token_lens;
    rc = gguf_get_f32_array(g, "tokenizer.ggml.scores", TOK_GGUF_MAX_TOKENS, &a->scores, &n2, st);
    if (gguf_tok_per_token(g, "tokenizer.ggml.scores", rc, n2, n, st)) return LLMI_E_RUNTIME;
    rc = gguf_get_i32_array(g, "tokenizer.ggml.token_type", TOK_GGUF_MAX_TOKENS, &a->types, &n2, st);
    if (gguf_tok_per_token(g, "tokenizer.ggml.token_type", rc, n2, n, st)) return LLMI_E_RUNTIME;
    s->scores = a->scores;
    s->token_types = a->types;
    n2 = 0; /* stays 0 when the key is absent (SentencePiece files) */
    rc = gguf_get_str_array(g, "tokenizer.ggml.merges", TOK_GGUF_MAX_MERGES, &a->merges, &a->merge_lens, &n2, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0 && s->model == TOK_MODEL_BYTELEVEL_BPE)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.merges", path);
    s->n_merges = (int)n2;
    s->merges = a->merges;
    s->merge_lens = a->merge_lens;
    return 0;
}

/* bos/eos must name real tokens (prompts and stopping depend on them).  The optional ids
 * (unk, pad, the end-of-generation roles) are dropped when out of range, as llama.cpp
 * does: files in the wild store "none" as -1 or as the vocabulary size. */
static int gguf_special_id(const gguf_file *g, const char *key, int n_tokens, bool strict, int *id, llmi_status *st) {
    int64_t v;
    int rc = gguf_get_int(g, key, INT64_MIN, INT64_MAX, &v, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return 0;
    if (v < 0 || v >= n_tokens) {
        if (!strict) {
            *id = -1;
            return 0;
        }
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s = %lld is outside the %d tokens", g->path, key, (long long)v,
                         n_tokens);
    }
    *id = (int)v;
    return 0;
}

/* The special ids and the add_bos/add_eos rules. */
static int gguf_tok_specials(const gguf_file *g, gguf_tok *a, llmi_status *st) {
    static const char *const eog_keys[TOK_EOG_ROLES] = {
        "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id",
        "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
    };
    tok_spec *s = &a->s;
    const int n = s->n_tokens;
    /* SentencePiece files default to <unk>=0 <s>=1 </s>=2 (as llama.cpp does) */
    s->bos_id = s->eos_id = s->unk_id = s->pad_id = -1;
    if (s->model == TOK_MODEL_SPM_BPE) {
        s->unk_id = 0 < n ? 0 : -1;
        s->bos_id = 1 < n ? 1 : -1;
        s->eos_id = 2 < n ? 2 : -1;
    }
    if (gguf_special_id(g, "tokenizer.ggml.bos_token_id", n, true, &s->bos_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.eos_token_id", n, true, &s->eos_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.unknown_token_id", n, false, &s->unk_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.padding_token_id", n, false, &s->pad_id, st))
        return LLMI_E_RUNTIME;
    for (int r = 0; r < TOK_EOG_ROLES; r++) {
        a->eog[r] = -1;
        if (gguf_special_id(g, eog_keys[r], n, false, &a->eog[r], st)) return LLMI_E_RUNTIME;
    }
    s->eog_ids = a->eog;
    bool space_prefix = true;   /* llama.cpp's default for SentencePiece */
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &s->add_bos, st) < 0 ||
        gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &s->add_eos, st) < 0 ||
        gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &space_prefix, st) < 0)
        return LLMI_E_RUNTIME;
    s->no_space_prefix = !space_prefix;
    return 0;
}

static int gguf_tok_template(const gguf_file *g, gguf_tok *a, llmi_status *st) {
    gguf_str tmpl;
    int rc = gguf_get_str(g, "tokenizer.chat_template", &tmpl, st);
    if (rc <= 0) return rc < 0 ? LLMI_E_RUNTIME : 0;
    a->chat_template = malloc((size_t)tmpl.len + 1);
    if (!a->chat_template) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", g->path);
    memcpy(a->chat_template, tmpl.p, (size_t)tmpl.len);
    a->chat_template[tmpl.len] = '\0';
    a->s.chat_template = a->chat_template;
    return 0;
}

int tok_load_gguf(const gguf_file *g, tokenizer **out, llmi_status *st) {
    *out = NULL;
    gguf_tok a;
    memset(&a, 0, sizeof a);
    int rc = LLMI_E_RUNTIME;
    if (!gguf_tok_kind(g, &a.s, st) && !gguf_tok_vocab(g, &a, st) && !gguf_tok_specials(g, &a, st) &&
        !gguf_tok_template(g, &a, st)) {
        llmi_status tst = {0};
        rc = tok_create(&a.s, out, &tst);
        if (rc) llmi_fail(st, LLMI_E_RUNTIME, "%s: %s", g->path, tst.msg);
    }
    gguf_tok_free(&a);
    return rc ? LLMI_E_RUNTIME : 0;
}

int tok_create(const tok_spec *spec, tokenizer **out, llmi_status *st) {
    *out = NULL;
    const char *origin = "GGUF tokenizer";
    if (!spec || spec->n_tokens <= 0 || spec->n_tokens > TOK_MAX_VOCAB || !spec->tokens || !spec->token_lens)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: no token list", origin);
    if (spec->model != TOK_MODEL_BYTELEVEL_BPE && spec->model != TOK_MODEL_SPM_BPE)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unknown tokenizer model %d", origin, (int)spec->model);
    if (spec->model == TOK_MODEL_BYTELEVEL_BPE && (!spec->merges || !spec->merge_lens || spec->n_merges <= 0))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: byte-level BPE (gpt2) without tokenizer.ggml.merges", origin);
    /* an empty merge list counts as none: a SentencePiece vocab then merges by scores */
    bool have_merges = spec->merges && spec->n_merges > 0;
    if (spec->model == TOK_MODEL_SPM_BPE && !have_merges && !spec->scores)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: SentencePiece vocabulary without scores", origin);
    if (have_merges && (spec->n_merges > TOK_MAX_MERGES || !spec->merge_lens))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: bad merge list (%d entries)", origin, spec->n_merges);
    int n = spec->n_tokens;
    for (int i = 0; i < n; i++)
        if (!spec->tokens[i]) return llmi_fail(st, LLMI_E_RUNTIME, "%s: token %d missing", origin, i);
    tokenizer *t = tok_alloc();
    uint8_t *flags = calloc((size_t)n, 1);
    tok_added *added = calloc((size_t)n, sizeof *added);
    tok_merge_str *ms = have_merges ? calloc((size_t)spec->n_merges + 1, sizeof *ms) : NULL;
    char *atext = NULL;
    int rc = 0;
    if (!t || !flags || !added || (have_merges && !ms)) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin);
        goto done;
    }
    t->model = spec->model;
    t->pre = spec->pre;
    t->bos_id = spec->bos_id >= 0 && spec->bos_id < n ? spec->bos_id : -1;
    t->eos_id = spec->eos_id >= 0 && spec->eos_id < n ? spec->eos_id : -1;
    t->unk_id = spec->unk_id >= 0 && spec->unk_id < n ? spec->unk_id : -1;
    t->pad_id = spec->pad_id >= 0 && spec->pad_id < n ? spec->pad_id : -1;
    t->add_bos = spec->add_bos && t->bos_id >= 0;
    t->add_eos = spec->add_eos && t->eos_id >= 0;

    /* Control and unknown tokens become special added tokens, user-defined ones plain added
     * tokens: what transformers' GGUF converter and llama.cpp both do. */
    int n_added = 0;
    size_t tl = 0;
    for (int i = 0; i < n; i++) {
        int ty = spec->token_types ? spec->token_types[i] : 1;
        if ((ty == 2 || ty == 3 || ty == 4) && spec->token_lens[i] > 0 && spec->token_lens[i] <= TOK_MAX_TOKLEN) {
            added[n_added++] = (tok_added){.id = i, .len = spec->token_lens[i], .special = ty != 4};
            tl += spec->token_lens[i];
        }
    }
    atext = malloc(tl + 1);
    if (!atext) { rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin); goto done; }
    uint32_t ao = 0;
    for (int i = 0; i < n_added; i++) {
        memcpy(atext + ao, spec->tokens[added[i].id], added[i].len);
        added[i].off = ao;
        ao += added[i].len;
    }
    for (int m = 0; ms && m < spec->n_merges; m++) {
        const char *s = spec->merges[m];
        uint32_t len = spec->merge_lens[m];
        const char *sp = s && len <= 2 * TOK_MAX_TOKLEN + 1 ? memchr(s, ' ', len) : NULL;
        if (!sp) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: merge %d is not \"a b\"", origin, m);
            goto done;
        }
        ms[m] = (tok_merge_str){s, (uint32_t)(sp - s), sp + 1, len - (uint32_t)(sp - s) - 1};
    }

    if (spec->model == TOK_MODEL_BYTELEVEL_BPE) {
        t->dec = TOK_DEC_BYTELEVEL;
        if (tok_pre_regex(spec->pre)) {   /* NULL for TOK_PRE_NONE */
            t->digits_split = spec->pre == TOK_PRE_SMOLLM;
            t->ignore_merges = tok_pre_ignores_merges(spec->pre);
            if (spec->pre == TOK_PRE_QWEN2) t->norm = TOK_NORM_NFC;
            rc = tok_compile_regex(t, tok_pre_regex(spec->pre), origin, st);
        }
    } else {
        /* llama.cpp's SentencePiece path: a space before the text, spaces as "▁", unknown
         * characters as <0xNN> bytes, one leading space dropped when decoding. */
        t->dec = TOK_DEC_SPM;
        t->dec_strip_space = !spec->no_space_prefix;
        t->norm = spec->no_space_prefix ? TOK_NORM_SPM : TOK_NORM_SPM_LEGACY;
        t->byte_fallback = true;
        t->fuse_unk = true;
        t->pre = TOK_PRE_NONE;
    }
    if (rc) goto done;

    tok_build b = {.n_vocab = n, .tokens = spec->tokens, .token_lens = spec->token_lens, .flags = flags,
                   .scores = spec->model == TOK_MODEL_SPM_BPE && !ms ? spec->scores : NULL,
                   .n_merges = ms ? spec->n_merges : 0, .merges = ms,
                   .n_added = n_added, .added = added, .added_text = atext, .origin = origin};
    rc = tok_build_common(t, &b, st);
    if (rc) goto done;
    tok_eog_mark(t, spec->eog_ids);
    if (spec->chat_template) {
        t->chat_template = strdup(spec->chat_template);
        if (!t->chat_template) { rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin); goto done; }
    }
    tok_detect_chat(t);
done:
    free(flags);
    free(added);
    free(ms);
    free(atext);
    if (rc) { tok_free(t); return rc; }
    *out = t;
    return 0;
}
