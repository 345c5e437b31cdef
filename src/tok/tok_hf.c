/* tok_hf.c — owns loading a Hugging Face tokenizer directory: tokenizer.json (BPE model,
 * added tokens, normalizer, pre-tokenizer, decoder, post-processor), tokenizer_config.json
 * (BOS/EOS, add_bos/add_eos, chat template) and generation_config.json (end-of-generation
 * ids).  Only the constructs llmi implements exactly are accepted; anything else is refused
 * with a message naming tokenizer.json and the construct. */
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/fileio.h"
#include "tok/tok_internal.h"

#define HF_MAX_FILE (512u << 20)   /* tokenizer.json of a 256k vocabulary is ~20 MB */

static cJSON *parse_json(const char *path, bool optional, bool *missing, llmi_status *st) {
    char *txt;
    size_t n;
    *missing = false;
    fileio_opts fo = {.max_bytes = HF_MAX_FILE, .optional = optional};
    if (fileio_read(path, &fo, &txt, &n, st)) return NULL;
    if (!txt) { *missing = true; return NULL; }
    cJSON *j = cJSON_ParseWithLength(txt, n);
    free(txt);
    if (!j) llmi_fail(st, LLMI_E_RUNTIME, "%s: not valid JSON", path);
    return j;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static bool jtype_is(const cJSON *o, const char *type) {
    const char *s = jstr(o, "type");
    return s && strcmp(s, type) == 0;
}

/* A token given as "text" or {"content": "text"}. */
static const char *token_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* Pattern of Split/Replace: {"String": s} or {"Regex": r}. */
static const char *pattern_of(const cJSON *o, bool *is_regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    *is_regex = false;
    if (!cJSON_IsObject(p)) return NULL;
    const char *s = jstr(p, "String");
    if (s) return s;
    *is_regex = true;
    return jstr(p, "Regex");
}

typedef struct {
    const char *path;
    llmi_status *st;
} hf_ctx;

#define UNSUPPORTED(ctx, ...) llmi_fail((ctx)->st, LLMI_E_RUNTIME, __VA_ARGS__)

static int hf_normalizer(tokenizer *t, const cJSON *n, hf_ctx *c) {
    if (!n || cJSON_IsNull(n)) return 0;
    if (jtype_is(n, "NFC")) { t->norm = TOK_NORM_NFC; return 0; }
    if (jtype_is(n, "Replace")) {   /* Gemma: spaces as "▁", no prefix */
        bool rx;
        const char *pat = pattern_of(n, &rx), *rep = jstr(n, "content");
        if (pat && !rx && strcmp(pat, " ") == 0 && rep && strcmp(rep, "\xE2\x96\x81") == 0) {
            t->norm = TOK_NORM_SPM;
            return 0;
        }
    }
    if (jtype_is(n, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        int k = cJSON_GetArraySize(list);
        if (k == 0) return 0;
        if (k == 1) return hf_normalizer(t, cJSON_GetArrayItem(list, 0), c);
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        bool rx;
        const char *pat = pattern_of(b, &rx);
        const char *pre = jstr(a, "prepend"), *rep = jstr(b, "content");
        if (k == 2 && jtype_is(a, "Prepend") && jtype_is(b, "Replace") && pre && strcmp(pre, "\xE2\x96\x81") == 0 &&
            pat && !rx && strcmp(pat, " ") == 0 && rep && strcmp(rep, "\xE2\x96\x81") == 0) {
            t->norm = TOK_NORM_SPM_LEGACY;
            return 0;
        }
    }
    char *s = cJSON_PrintUnformatted(n);
    int rc = UNSUPPORTED(c, "%s: unsupported normalizer %.120s (llmi knows NFC, Replace(\" \", \"\xE2\x96\x81\") and "
                         "Sequence[Prepend(\"\xE2\x96\x81\"), Replace(\" \", \"\xE2\x96\x81\")])", c->path, s ? s : "?");
    free(s);
    return rc;
}

static int hf_bytelevel(const cJSON *p, bool want_regex, hf_ctx *c) {
    if (jbool(p, "add_prefix_space", false))
        return UNSUPPORTED(c, "%s: pre_tokenizer ByteLevel with add_prefix_space=true is not supported", c->path);
    if (jbool(p, "use_regex", true) != want_regex)
        return UNSUPPORTED(c, "%s: pre_tokenizer ByteLevel use_regex=%s is not supported here", c->path,
                           want_regex ? "false" : "true");
    return 0;
}

static int hf_pre_tokenizer(tokenizer *t, const cJSON *p, hf_ctx *c) {
    if (!p || cJSON_IsNull(p)) { t->pre = TOK_PRE_NONE; return 0; }
    if (jtype_is(p, "ByteLevel")) {
        if (!jbool(p, "use_regex", true)) {
            if (jbool(p, "add_prefix_space", false))
                return UNSUPPORTED(c, "%s: pre_tokenizer ByteLevel with add_prefix_space=true is not supported", c->path);
            t->pre = TOK_PRE_NONE;
            return 0;
        }
        if (hf_bytelevel(p, true, c)) return c->st->code;
        t->pre = TOK_PRE_GPT2;
        return tok_compile_regex(t, tok_pre_regex(TOK_PRE_GPT2), c->path, c->st);
    }
    if (jtype_is(p, "Split") && t->norm == TOK_NORM_SPM) {
        /* Gemma's Split(" ", merged_with_previous) runs after its normalizer has turned
         * every space into "▁": there is nothing left to split */
        bool rx;
        const char *pat = pattern_of(p, &rx);
        if (pat && !rx && strcmp(pat, " ") == 0 && !jbool(p, "invert", false)) {
            t->pre = TOK_PRE_NONE;
            return 0;
        }
    }
    if (jtype_is(p, "Metaspace")) {
        const char *r = jstr(p, "replacement");
        if (!r || strcmp(r, "\xE2\x96\x81") != 0)
            return UNSUPPORTED(c, "%s: pre_tokenizer Metaspace with a replacement other than \"\xE2\x96\x81\"", c->path);
        const char *scheme = jstr(p, "prepend_scheme");
        if (!scheme) scheme = jbool(p, "add_prefix_space", true) ? "always" : "never";
        if (strcmp(scheme, "always") == 0) t->metaspace = TOK_MS_ALWAYS;
        else if (strcmp(scheme, "first") == 0) t->metaspace = TOK_MS_FIRST;
        else if (strcmp(scheme, "never") == 0) t->metaspace = TOK_MS_NEVER;
        else return UNSUPPORTED(c, "%s: pre_tokenizer Metaspace prepend_scheme \"%s\"", c->path, scheme);
        t->metaspace_split = jbool(p, "split", true);
        t->pre = TOK_PRE_NONE;
        return 0;
    }
    if (jtype_is(p, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        int k = cJSON_GetArraySize(list);
        const cJSON *a = cJSON_GetArrayItem(list, 0), *b = cJSON_GetArrayItem(list, 1);
        if (k == 1) return hf_pre_tokenizer(t, a, c);
        if (k == 2 && jtype_is(a, "Digits") && jtype_is(b, "ByteLevel")) {
            if (!jbool(a, "individual_digits", false))
                return UNSUPPORTED(c, "%s: pre_tokenizer Digits(individual_digits=false) is not supported", c->path);
            if (hf_bytelevel(b, true, c)) return c->st->code;
            t->pre = TOK_PRE_SMOLLM;
            t->digits_split = true;
            return tok_compile_regex(t, tok_pre_regex(TOK_PRE_GPT2), c->path, c->st);
        }
        if (k == 2 && jtype_is(a, "Split") && jtype_is(b, "ByteLevel")) {
            bool rx;
            const char *pat = pattern_of(a, &rx);
            const char *beh = jstr(a, "behavior");
            if (!pat || !rx || !beh || strcmp(beh, "Isolated") != 0 || jbool(a, "invert", false))
                return UNSUPPORTED(c, "%s: pre_tokenizer Split must be a Regex with behavior Isolated", c->path);
            if (hf_bytelevel(b, false, c)) return c->st->code;
            static const tok_pre_kind split_kinds[] = {TOK_PRE_LLAMA3, TOK_PRE_QWEN2, TOK_PRE_GPT2, TOK_PRE_O200K,
                                                       TOK_PRE_TEKKEN};
            t->pre = TOK_PRE_NONE;
            for (size_t i = 0; i < sizeof split_kinds / sizeof split_kinds[0] && t->pre == TOK_PRE_NONE; i++)
                if (strcmp(pat, tok_pre_regex(split_kinds[i])) == 0) t->pre = split_kinds[i];
            if (t->pre == TOK_PRE_NONE)
                return UNSUPPORTED(c, "%s: pre_tokenizer Split regex %.80s... is not one llmi knows (GPT-2, Llama-3, "
                                   "Qwen2, o200k, Tekken)", c->path, pat);
            return tok_compile_regex(t, pat, c->path, c->st);
        }
    }
    char *s = cJSON_PrintUnformatted(p);
    int rc = UNSUPPORTED(c, "%s: unsupported pre_tokenizer %.160s", c->path, s ? s : "?");
    free(s);
    return rc;
}

static int hf_decoder(tokenizer *t, const cJSON *d, hf_ctx *c) {
    if (jtype_is(d, "ByteLevel")) { t->dec = TOK_DEC_BYTELEVEL; return 0; }
    if (jtype_is(d, "Metaspace")) {
        const char *scheme = jstr(d, "prepend_scheme");
        t->dec = TOK_DEC_SPM;
        t->dec_strip_space = scheme ? strcmp(scheme, "never") != 0 : jbool(d, "add_prefix_space", true);
        return 0;
    }
    if (jtype_is(d, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders"), *x;
        bool replace = false, ok = true;
        t->dec = TOK_DEC_SPM;
        cJSON_ArrayForEach(x, list) {
            bool rx;
            const char *pat = pattern_of(x, &rx), *content = jstr(x, "content");
            if (jtype_is(x, "Replace") && pat && !rx && strcmp(pat, "\xE2\x96\x81") == 0 && content &&
                strcmp(content, " ") == 0)
                replace = true;
            else if (jtype_is(x, "ByteFallback") || jtype_is(x, "Fuse")) {}
            else if (jtype_is(x, "Strip") && content && strcmp(content, " ") == 0) {
                const cJSON *sv = cJSON_GetObjectItemCaseSensitive(x, "start");
                const cJSON *ev = cJSON_GetObjectItemCaseSensitive(x, "stop");
                if (!cJSON_IsNumber(sv) || sv->valueint != 1 || (cJSON_IsNumber(ev) && ev->valueint != 0)) ok = false;
                t->dec_strip_space = true;
            } else ok = false;
        }
        if (ok && replace) return 0;
    }
    char *s = cJSON_PrintUnformatted(d);
    int rc = UNSUPPORTED(c, "%s: unsupported decoder %.160s (llmi knows ByteLevel and Sequence[Replace(\"\xE2\x96\x81\", "
                         "\" \"), ByteFallback, Fuse, Strip])", c->path, s ? s : "null");
    free(s);
    return rc;
}

/* TemplateProcessing "single": special tokens before $A add BOS, after it EOS. */
static int hf_post_processor(tokenizer *t, const cJSON *p, int *bos, int *eos, hf_ctx *c) {
    if (!p || cJSON_IsNull(p) || jtype_is(p, "ByteLevel")) return 0;
    if (jtype_is(p, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(p, "processors"))
            if (hf_post_processor(t, x, bos, eos, c)) return c->st->code;
        return 0;
    }
    if (!jtype_is(p, "TemplateProcessing"))
        return UNSUPPORTED(c, "%s: unsupported post_processor type \"%s\"", c->path, jstr(p, "type") ? jstr(p, "type") : "?");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *x;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    bool seen_seq = false;
    cJSON_ArrayForEach(x, single) {
        if (cJSON_GetObjectItemCaseSensitive(x, "Sequence")) { seen_seq = true; continue; }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(x, "SpecialToken");
        const char *name = sp ? jstr(sp, "id") : NULL;
        if (!name) continue;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name), "ids");
        const cJSON *id0 = cJSON_GetArrayItem(ids, 0);
        if (cJSON_GetArraySize(ids) != 1 || !cJSON_IsNumber(id0))
            return UNSUPPORTED(c, "%s: post_processor special token \"%s\" must map to one id", c->path, name);
        int id = id0->valueint;
        if (id < 0 || id >= t->n_vocab)
            return UNSUPPORTED(c, "%s: post_processor special token \"%s\" id %d out of range", c->path, name, id);
        if (!seen_seq) { *bos = id; t->add_bos = true; }
        else { *eos = id; t->add_eos = true; }
    }
    return 0;
}

static int hf_chat_template(tokenizer *t, const cJSON *v, hf_ctx *c) {
    const char *tpl = NULL;
    if (cJSON_IsString(v)) tpl = v->valuestring;
    else if (cJSON_IsArray(v)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, v) {
            const char *name = jstr(x, "name"), *tt = jstr(x, "template");
            if (!tt) continue;
            if (!tpl || (name && strcmp(name, "default") == 0)) tpl = tt;
        }
    }
    if (!tpl) return 0;
    t->chat_template = strdup(tpl);
    if (!t->chat_template) return llmi_fail(c->st, LLMI_E_RUNTIME, "%s: out of memory", c->path);
    return 0;
}

static int token_id_of(const tokenizer *t, const char *s) {
    return s ? tok_vocab_find(t, s, strlen(s)) : -1;
}

/* The BPE model's options: only those llmi implements exactly. */
static int hf_model_check(const cJSON *model, hf_ctx *c) {
    if (!cJSON_IsObject(model) || !jtype_is(model, "BPE"))
        return UNSUPPORTED(c, "%s: model.type \"%s\" is not supported (llmi knows BPE)", c->path,
                           jstr(model, "type") ? jstr(model, "type") : "?");
    const char *cswp = jstr(model, "continuing_subword_prefix"), *eows = jstr(model, "end_of_word_suffix");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if ((cswp && *cswp) || (eows && *eows) || (cJSON_IsNumber(dropout) && dropout->valuedouble != 0))
        return UNSUPPORTED(c, "%s: BPE continuing_subword_prefix / end_of_word_suffix / dropout are not supported",
                           c->path);
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(model, "vocab")))
        return UNSUPPORTED(c, "%s: model.vocab is not an object", c->path);
    if (jm && !cJSON_IsArray(jm) && !cJSON_IsNull(jm)) return UNSUPPORTED(c, "%s: model.merges is not a list", c->path);
    return 0;
}

/* tokenizer.json's vocabulary, added tokens and merges as tok_build_common takes them;
 * the strings are borrowed from the cJSON tree. */
typedef struct hf_lists {
    int n_vocab;                  /* highest id of the vocab and added tokens, plus one */
    const char **tokens;          /* (n_vocab) NULL for holes */
    uint32_t *lens;               /* (n_vocab) */
    tok_added *added;             /* (n_added) offsets into atext */
    int n_added;
    char *atext;
    tok_merge_str *merges;        /* (n_merges) */
    int n_merges;
} hf_lists;

static void hf_lists_free(hf_lists *l) {
    free(l->tokens);
    free(l->lens);
    free(l->added);
    free(l->atext);
    free(l->merges);
}

/* The vocabulary size: the highest id among vocab and added tokens, every id checked. */
static int hf_vocab_size(const cJSON *vocab, const cJSON *jadded, int *n, hf_ctx *c) {
    long max_id = -1;
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= TOK_MAX_VOCAB)
            return UNSUPPORTED(c, "%s: vocab entry \"%.40s\" has a bad id", c->path, x->string ? x->string : "");
        if (x->valueint > max_id) max_id = x->valueint;
    }
    cJSON_ArrayForEach(x, jadded) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TOK_MAX_VOCAB || !jstr(x, "content"))
            return UNSUPPORTED(c, "%s: added_tokens entry without a valid id and content", c->path);
        if (id->valueint > max_id) max_id = id->valueint;
    }
    *n = (int)(max_id + 1);
    if (*n <= 0) return UNSUPPORTED(c, "%s: empty vocabulary", c->path);
    return 0;
}

static int hf_lists_read(const cJSON *j, const cJSON *model, hf_lists *l, hf_ctx *c) {
    const char *path = c->path;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *jadded = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    int n = 0;
    if (hf_vocab_size(vocab, jadded, &n, c)) return c->st->code;
    l->n_vocab = n;
    int n_added = cJSON_GetArraySize(jadded), n_merges = cJSON_IsArray(jm) ? cJSON_GetArraySize(jm) : 0;
    l->tokens = calloc((size_t)n, sizeof *l->tokens);
    l->lens = calloc((size_t)n, sizeof *l->lens);
    l->added = calloc((size_t)n_added + 1, sizeof *l->added);
    l->merges = calloc((size_t)n_merges + 1, sizeof *l->merges);
    if (!l->tokens || !l->lens || !l->added || !l->merges)
        return llmi_fail(c->st, LLMI_E_RUNTIME, "%s: out of memory", path);
    const cJSON *x;
    cJSON_ArrayForEach(x, vocab) {
        l->tokens[x->valueint] = x->string;
        l->lens[x->valueint] = (uint32_t)strlen(x->string);
    }
    size_t tl = 0;
    cJSON_ArrayForEach(x, jadded) tl += strlen(jstr(x, "content"));
    l->atext = malloc(tl + 1);
    if (!l->atext) return llmi_fail(c->st, LLMI_E_RUNTIME, "%s: out of memory", path);
    uint32_t ao = 0;
    cJSON_ArrayForEach(x, jadded) {
        const char *content = jstr(x, "content");
        int id = cJSON_GetObjectItemCaseSensitive(x, "id")->valueint;
        size_t len = strlen(content);
        if (len == 0 || len > TOK_MAX_TOKLEN) continue;
        if (!l->tokens[id]) { l->tokens[id] = content; l->lens[id] = (uint32_t)len; }
        memcpy(l->atext + ao, content, len);
        l->added[l->n_added++] = (tok_added){.id = id, .off = ao, .len = (uint32_t)len,
                                             .special = jbool(x, "special", false), .lstrip = jbool(x, "lstrip", false),
                                             .rstrip = jbool(x, "rstrip", false),
                                             .single_word = jbool(x, "single_word", false),
                                             .normalized = jbool(x, "normalized", true)};
        ao += (uint32_t)len;
    }
    cJSON_ArrayForEach(x, jm) {
        int nm = l->n_merges;
        if (cJSON_IsString(x)) {
            const char *s = x->valuestring, *sp = strchr(s, ' ');
            if (!sp) return UNSUPPORTED(c, "%s: merge %d \"%.40s\" is not \"a b\"", path, nm, s);
            l->merges[l->n_merges++] = (tok_merge_str){s, (uint32_t)(sp - s), sp + 1, (uint32_t)strlen(sp + 1)};
        } else if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == 2 && cJSON_IsString(cJSON_GetArrayItem(x, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(x, 1))) {
            const char *a = cJSON_GetArrayItem(x, 0)->valuestring, *b = cJSON_GetArrayItem(x, 1)->valuestring;
            l->merges[l->n_merges++] = (tok_merge_str){a, (uint32_t)strlen(a), b, (uint32_t)strlen(b)};
        } else {
            return UNSUPPORTED(c, "%s: merge %d is neither \"a b\" nor [a, b]", path, nm);
        }
    }
    return 0;
}

/* tokenizer_config.json: bos/eos/pad by content, add_bos/add_eos, the chat template. */
static int hf_tokenizer_config(tokenizer *t, const cJSON *cfg, int *bos, int *eos, hf_ctx *c) {
    int id = token_id_of(t, token_content(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token")));
    if (id >= 0) *bos = id;
    id = token_id_of(t, token_content(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token")));
    if (id >= 0) *eos = id;
    t->pad_id = token_id_of(t, token_content(cJSON_GetObjectItemCaseSensitive(cfg, "pad_token")));
    /* transformers rebuilds the post-processor from these flags when they are given */
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab);
    if (cJSON_IsBool(ae)) t->add_eos = cJSON_IsTrue(ae);
    return hf_chat_template(t, cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), c);
}

/* generation_config.json: eos_token_id (one id or a list) also ends generation, as
 * transformers' generate stops on it. */
static void hf_generation_config(tokenizer *t, const cJSON *gen) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"), *x;
    if (cJSON_IsNumber(e) && e->valueint >= 0 && e->valueint < t->n_vocab) t->flags[e->valueint] |= TOKF_EOG;
    if (cJSON_IsArray(e))
        cJSON_ArrayForEach(x, e)
            if (cJSON_IsNumber(x) && x->valueint >= 0 && x->valueint < t->n_vocab) t->flags[x->valueint] |= TOKF_EOG;
}

/* tokenizer.json: the tables, then the normalizer, pre-tokenizer and decoder that go
 * with them, then bos/eos from the post-processor. */
static int hf_tokenizer_json(tokenizer *t, const cJSON *j, int *bos, int *eos, hf_ctx *c) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
    hf_lists l;
    memset(&l, 0, sizeof l);
    int rc;
    if ((rc = hf_model_check(model, c)) || (rc = hf_lists_read(j, model, &l, c))) goto done;
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    if ((rc = hf_normalizer(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"), c))) goto done;
    if ((rc = hf_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"), c))) goto done;
    if ((rc = hf_decoder(t, cJSON_GetObjectItemCaseSensitive(j, "decoder"), c))) goto done;
    t->model = t->dec == TOK_DEC_BYTELEVEL ? TOK_MODEL_BYTELEVEL_BPE : TOK_MODEL_SPM_BPE;
    tok_build b = {.n_vocab = l.n_vocab, .tokens = l.tokens, .token_lens = l.lens, .n_merges = l.n_merges,
                   .merges = l.merges, .n_added = l.n_added, .added = l.added, .added_text = l.atext,
                   .origin = c->path};
    if ((rc = tok_build_common(t, &b, c->st))) goto done;
    /* an unk_token missing from the vocab only matters when a character has no token; HF
     * fails then, llmi drops the character */
    t->unk_id = token_id_of(t, jstr(model, "unk_token"));
    rc = hf_post_processor(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor"), bos, eos, c);
done:
    hf_lists_free(&l);
    return rc;
}

int tok_load_hf(const char *dir, tokenizer **out, llmi_status *st) {
    *out = NULL;
    char path[4096], cpath[4096], gpath[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
    hf_ctx c = {path, st};
    bool missing;
    cJSON *j = parse_json(path, false, &missing, st), *cfg = NULL, *gen = NULL;
    if (!j) return st->code ? st->code : llmi_fail(st, LLMI_E_RUNTIME, "%s: missing", path);
    tokenizer *t = tok_alloc();
    int rc = 0, bos = -1, eos = -1;
    if (!t) { rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path); goto done; }
    if ((rc = hf_tokenizer_json(t, j, &bos, &eos, &c))) goto done;
    cfg = parse_json(cpath, true, &missing, st);
    if (!cfg && !missing) { rc = st->code; goto done; }
    c.path = cpath;
    if (cfg && (rc = hf_tokenizer_config(t, cfg, &bos, &eos, &c))) goto done;
    t->bos_id = bos;
    t->eos_id = eos;
    if (t->add_bos && bos < 0) t->add_bos = false;
    if (t->add_eos && eos < 0) t->add_eos = false;
    gen = parse_json(gpath, true, &missing, st);
    if (!gen && !missing) { rc = st->code; goto done; }
    if (gen) hf_generation_config(t, gen);
    tok_eog_mark(t, NULL);
    tok_detect_chat(t);
done:
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    if (rc) { tok_free(t); return rc; }
    *out = t;
    return 0;
}
