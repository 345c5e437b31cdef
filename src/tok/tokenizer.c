/* tokenizer.c — the tokenizer core: building the tables from what a front end parsed
 * (tok_gguf.c, tok_hf.c), encoding (added-token split, normalization, pre-tokenization, BPE),
 * decoding and the streaming detokenizer.  Behaviour follows Hugging Face `tokenizers`
 * (AddedVocabulary, BPE::merge_word, ByteLevel / ByteFallback decoders); notes in
 * ../shared/docs/FORMATS.md. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "core/utf8.h"
#include "tok/tok_internal.h"

/* (TOK_PRE_KINDS) each kind's regex: GPT-2's (SmolLM's too), Llama-3's, Qwen2's (Llama-3's
 * with single digits), none, o200k's (tiktoken's, as GPT-4o and Phi-4-mini ship it),
 * Tekken's (o200k's without the contractions, single digits) */
#define TOK_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
static const char *const k_pre_regex[TOK_PRE_KINDS] = {
    [TOK_PRE_GPT2] = TOK_RE_GPT2,
    [TOK_PRE_SMOLLM] = TOK_RE_GPT2,
    [TOK_PRE_LLAMA3] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                       "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_QWEN2] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                      "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_O200K] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                      "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                      "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                      "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOK_PRE_TEKKEN] = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                       "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                       "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

const char *tok_pre_regex(tok_pre_kind k) { return k >= 0 && k < TOK_PRE_KINDS ? k_pre_regex[k] : NULL; }

bool tok_pre_ignores_merges(tok_pre_kind k) { return k == TOK_PRE_LLAMA3 || k == TOK_PRE_TEKKEN; }

/* llama.cpp's names (src/llama-vocab.cpp) whose pre-tokenizer, ignore_merges and add_bos
 * are those of a kind llmi has */
static const struct {
    const char *name;
    tok_pre_kind kind;
    bool add_bos;
} k_gguf_pres[] = {
    {"gpt-2", TOK_PRE_GPT2, false},          {"smollm", TOK_PRE_SMOLLM, false},
    {"llama-bpe", TOK_PRE_LLAMA3, true},     {"llama3", TOK_PRE_LLAMA3, true},
    {"llama-v3", TOK_PRE_LLAMA3, true},      {"falcon3", TOK_PRE_LLAMA3, true},
    {"pixtral", TOK_PRE_LLAMA3, true},       {"qwen2", TOK_PRE_QWEN2, false},
    {"deepseek-r1-qwen", TOK_PRE_QWEN2, false}, {"gpt-4o", TOK_PRE_O200K, false},
    {"tekken", TOK_PRE_TEKKEN, true},        {"refact", TOK_PRE_SMOLLM, false},
    {"starcoder", TOK_PRE_SMOLLM, false},
};

bool tok_gguf_pre_of(const char *name, size_t len, tok_pre_kind *kind, bool *add_bos) {
    for (size_t i = 0; i < sizeof k_gguf_pres / sizeof k_gguf_pres[0]; i++)
        if (strlen(k_gguf_pres[i].name) == len && memcmp(k_gguf_pres[i].name, name, len) == 0) {
            *kind = k_gguf_pres[i].kind;
            *add_bos = k_gguf_pres[i].add_bos;
            return true;
        }
    return false;
}

#define SPM_SPACE "\xE2\x96\x81"   /* U+2581 "▁" */

/* ------------------------------------------------------------------ small helpers */

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

/* Length of the UTF-8 sequence at s (1 for an invalid byte) and its code point (-1 if invalid). */
static int u8_next(const char *s, size_t n, int32_t *cp) {
    int k = utf8_next(s, n, cp);
    if (!k) { *cp = -1; return 1; }
    return k;
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes, in
 * ascending order, to U+0100.. . Computed per call: no process-wide tables. */
static void bytelevel_alphabet(int32_t cp_of_byte[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp_of_byte[b] = keep ? b : 256 + n++;
    }
}

/* White_Space as Rust's char::is_whitespace / regex \s (used for lstrip/rstrip). */
static bool is_white_space(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation, join controls. */
static bool is_word_char(int32_t c) {
    if (c < 0) return false;
    if (c == 0x200C || c == 0x200D) return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

static bool is_numeric_cp(int32_t c) {
    if (c < 0) return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* Code point ending at s[end) (scanning back over continuation bytes). */
static int32_t u8_prev(const char *s, size_t end, size_t *start) {
    size_t i = end;
    int back = 0;
    while (i > 0 && back < 4) {
        i--; back++;
        if (((uint8_t)s[i] & 0xC0) != 0x80) break;
    }
    int32_t cp;
    int k = u8_next(s + i, end - i, &cp);
    if ((size_t)k != end - i) { *start = end - 1; return -1; }
    *start = i;
    return cp;
}

tokenizer *tok_alloc(void) {
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bos_id = t->eos_id = t->unk_id = t->pad_id = -1;
    for (int i = 0; i < 256; i++) t->byte_sym[i] = t->byte_tok[i] = -1;
    return t;
}

void tok_free(tokenizer *t) {
    if (!t) return;
    free(t->text); free(t->str_off); free(t->str_len); free(t->flags);
    free(t->pieces); free(t->piece_off); free(t->piece_len);
    free(t->vh); free(t->mh_key); free(t->mh_rank); free(t->mh_new);
    free(t->added); free(t->added_text);
    if (t->re) pcre2_code_free(t->re);
    free(t->chat_template);
    free(t);
}

int tok_vocab_find(const tokenizer *t, const char *s, size_t n) {
    if (!t->vh) return -1;
    uint32_t mask = t->vh_cap - 1;
    for (uint32_t h = (uint32_t)fnv1a(s, n) & mask;; h = (h + 1) & mask) {
        int32_t id = t->vh[h];
        if (id < 0) return -1;
        if (t->str_len[id] == n && memcmp(t->text + t->str_off[id], s, n) == 0) return id;
    }
}

/* Later duplicates win, as in a JSON/HashMap vocabulary and llama.cpp's token_to_id. */
static void vocab_insert(tokenizer *t, int32_t id) {
    const char *s = t->text + t->str_off[id];
    size_t n = t->str_len[id];
    uint32_t mask = t->vh_cap - 1;
    for (uint32_t h = (uint32_t)fnv1a(s, n) & mask;; h = (h + 1) & mask) {
        int32_t o = t->vh[h];
        if (o < 0) { t->vh[h] = id; return; }
        if (t->str_len[o] == n && memcmp(t->text + t->str_off[o], s, n) == 0) { t->vh[h] = id; return; }
    }
}

static uint64_t mkey(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static bool merge_find(const tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *nid) {
    if (!t->mh_key) return false;
    uint64_t k = mkey(a, b);
    uint32_t mask = t->mh_cap - 1;
    for (uint32_t h = (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & mask;; h = (h + 1) & mask) {
        if (t->mh_key[h] == UINT64_MAX) return false;
        if (t->mh_key[h] == k) { *rank = t->mh_rank[h]; *nid = t->mh_new[h]; return true; }
    }
}

/* A later duplicate pair overwrites the earlier one, like HF's merge HashMap. */
static void merge_insert(tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t nid) {
    uint64_t k = mkey(a, b);
    uint32_t mask = t->mh_cap - 1;
    for (uint32_t h = (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & mask;; h = (h + 1) & mask) {
        if (t->mh_key[h] == UINT64_MAX || t->mh_key[h] == k) {
            t->mh_key[h] = k; t->mh_rank[h] = rank; t->mh_new[h] = nid;
            return;
        }
    }
}

static int alloc_merges(tokenizer *t, uint64_t n) {
    t->mh_cap = pow2_at_least(n * 2 + 1);
    t->mh_key = malloc(sizeof(uint64_t) * t->mh_cap);
    t->mh_rank = malloc(sizeof(int32_t) * t->mh_cap);
    t->mh_new = malloc(sizeof(int32_t) * t->mh_cap);
    if (!t->mh_key || !t->mh_rank || !t->mh_new) return -1;
    memset(t->mh_key, 0xFF, sizeof(uint64_t) * t->mh_cap);
    return 0;
}

/* --------------------------------------------- SentencePiece merges from scores */

typedef struct { float score; int32_t lcp, rcp, l, r; int64_t seq; } spm_cand;

static int cmp_local(const void *a, const void *b) {
    const spm_cand *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    if (x->r != y->r) return x->r < y->r ? -1 : 1;
    return 0;
}

static int cmp_global(const void *a, const void *b) {
    const spm_cand *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->lcp != y->lcp) return x->lcp > y->lcp ? -1 : 1;
    if (x->rcp != y->rcp) return x->rcp > y->rcp ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq);
}

/* A GGUF SentencePiece vocab has scores but no merges.  Derive merges the way transformers'
 * GGUF converter does (generate_merges): every split of a token into two vocab pieces, ranked
 * by the token's score, then longer left piece, then longer right piece, stable otherwise.
 * Merging by these ranks equals llama.cpp's "highest-scoring adjacent pair first". */
static int spm_merges_from_scores(tokenizer *t, const float *scores, llmi_status *st, const char *origin) {
    size_t cap = 1024, n = 0;
    spm_cand *c = malloc(cap * sizeof *c);
    if (!c) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory deriving merges", origin);
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len = t->str_len[id];
        const char *s = t->text + t->str_off[id];
        if (len < 2 || tok_vocab_find(t, s, len) != id) continue;
        size_t first = n;
        int32_t ncp = 0, cp;
        for (uint32_t i = 0; i < len; i += (uint32_t)u8_next(s + i, len - i, &cp)) ncp++;
        int32_t lcp = 0;
        for (uint32_t i = 0; i < len;) {
            i += (uint32_t)u8_next(s + i, len - i, &cp);
            lcp++;
            if (i >= len) break;
            int32_t l = tok_vocab_find(t, s, i), r = tok_vocab_find(t, s + i, len - i);
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                spm_cand *nc = realloc(c, (cap *= 2) * sizeof *c);
                if (!nc) { free(c); return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory deriving merges", origin); }
                c = nc;
            }
            c[n++] = (spm_cand){scores[id], lcp, ncp - lcp, l, r, 0};
        }
        qsort(c + first, n - first, sizeof *c, cmp_local);
        for (size_t k = first; k < n; k++) c[k].seq = (int64_t)k;
    }
    qsort(c, n, sizeof *c, cmp_global);
    if (n > TOK_MAX_MERGES || alloc_merges(t, n) != 0) {
        free(c);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot hold %zu derived merges", origin, n);
    }
    for (size_t k = 0; k < n; k++) {
        uint32_t ll = t->str_len[c[k].l], rl = t->str_len[c[k].r];
        char buf[2 * TOK_MAX_TOKLEN];
        memcpy(buf, t->text + t->str_off[c[k].l], ll);
        memcpy(buf + ll, t->text + t->str_off[c[k].r], rl);
        merge_insert(t, c[k].l, c[k].r, (int32_t)k, tok_vocab_find(t, buf, ll + rl));
    }
    t->n_merges = (int)n;
    free(c);
    return 0;
}

/* ------------------------------------------------------------------ building */

/* HF tokenizers matches with Oniguruma, whose \s is Unicode White_Space.  PCRE2's \s (UCP)
 * also takes U+180E MONGOLIAN VOWEL SEPARATOR (from its \h list), so \s / \S are spelled out
 * as explicit classes before compiling.  Returns a malloc'ed pattern. */
#define WS_CLASS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static char *onig_spaces(const char *pat) {
    size_t n = strlen(pat), k = 0;
    char *out = malloc(n * 16 + 1);
    if (!out) return NULL;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        if (pat[i] == '\\' && i + 1 < n) {
            char c = pat[i + 1];
            const char *rep = NULL;
            if (c == 's') rep = in_class ? WS_CLASS : "[" WS_CLASS "]";
            else if (c == 'S' && !in_class) rep = "[^" WS_CLASS "]";
            if (rep) { memcpy(out + k, rep, strlen(rep)); k += strlen(rep); }
            else { out[k++] = pat[i]; out[k++] = c; }
            i++;
            continue;
        }
        if (pat[i] == '[' && !in_class) in_class = true;
        else if (pat[i] == ']' && in_class) in_class = false;
        out[k++] = pat[i];
    }
    out[k] = '\0';
    return out;
}

int tok_compile_regex(tokenizer *t, const char *pattern_in, const char *origin, llmi_status *st) {
    int err;
    PCRE2_SIZE off;
    char *pattern = onig_spaces(pattern_in);
    if (!pattern) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin);
    /* MATCH_INVALID_UTF: the caller's bytes are untrusted; invalid bytes simply never match
     * and fall into the gaps, which become their own pieces. */
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    free(pattern);
    if (!t->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: pre-tokenizer regex does not compile at %zu: %s", origin,
                         (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter if JIT is absent */
    return 0;
}

static int cmp_added(const void *a, const void *b, void *ctx) {
    const tok_added *x = a, *y = b;
    const char *txt = ctx;
    uint8_t fx = (uint8_t)txt[x->off], fy = (uint8_t)txt[y->off];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* Decoded bytes of one token for the tokenizer's decoder. */
static size_t piece_of(const tokenizer *t, const char *s, size_t n, const int32_t *byte_of_cp, char *out,
                       bool *is_byte) {
    *is_byte = false;
    if (t->dec == TOK_DEC_BYTELEVEL) {
        size_t k = 0;
        int32_t cp;
        for (size_t i = 0; i < n;) {
            i += (size_t)u8_next(s + i, n - i, &cp);
            if (cp < 0 || cp >= 324 || byte_of_cp[cp] < 0) { memcpy(out, s, n); return n; }
            out[k++] = (char)byte_of_cp[cp];
        }
        return k;
    }
    /* SentencePiece: "▁" -> " ", "<0xNN>" -> the byte */
    if (n == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        char hex[3] = {s[3], s[4], 0}, *end;
        long v = strtol(hex, &end, 16);
        if (end == hex + 2 && hex[0] != '-' && hex[0] != '+' && hex[0] != ' ') {
            out[0] = (char)v; *is_byte = true;
            return 1;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0) { out[k++] = ' '; i += 3; }
        else out[k++] = s[i++];
    }
    return k;
}

/* Worst-case bytes one push writes for a piece: up to 3 held-back bytes turned into U+FFFD
 * (3 bytes each), plus the piece with every invalid byte widened to U+FFFD. */
static size_t piece_worst_case(const char *p, size_t n) {
    size_t out = 9;
    int32_t cp;
    for (size_t i = 0; i < n;) {
        int k = u8_next(p + i, n - i, &cp);
        out += cp < 0 ? 3 : (size_t)k;
        i += (size_t)k;
    }
    return out;
}

/* The vocabulary: every string copied into one text block, its flags, the string->id table. */
static int build_vocab(tokenizer *t, const tok_build *b, llmi_status *st) {
    const char *origin = b->origin;
    if (b->n_vocab <= 0 || b->n_vocab > TOK_MAX_VOCAB)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: vocabulary size %d out of range", origin, b->n_vocab);
    int n = t->n_vocab = b->n_vocab;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!b->tokens[i]) continue;
        if (b->token_lens[i] > TOK_MAX_TOKLEN)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: token %d is %u bytes (max %d)", origin, i, b->token_lens[i],
                             TOK_MAX_TOKLEN);
        total += b->token_lens[i];
    }
    t->text = malloc(total + 1);
    t->str_off = calloc((size_t)n, sizeof(uint32_t));
    t->str_len = calloc((size_t)n, sizeof(uint32_t));
    t->flags = calloc((size_t)n, 1);
    t->piece_off = calloc((size_t)n, sizeof(uint32_t));
    t->piece_len = calloc((size_t)n, sizeof(uint32_t));
    t->pieces = malloc(total * 3 + 1);
    t->vh_cap = pow2_at_least((uint64_t)n * 2 + 1);
    t->vh = malloc(sizeof(int32_t) * t->vh_cap);
    if (!t->text || !t->str_off || !t->str_len || !t->flags || !t->piece_off || !t->piece_len || !t->pieces ||
        !t->vh)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory for a %d-token vocabulary", origin, n);
    memset(t->vh, 0xFF, sizeof(int32_t) * t->vh_cap);
    uint32_t off = 0;
    for (int i = 0; i < n; i++) {
        t->str_off[i] = off;
        if (!b->tokens[i]) continue;
        memcpy(t->text + off, b->tokens[i], b->token_lens[i]);
        t->str_len[i] = b->token_lens[i];
        off += b->token_lens[i];
        if (b->flags) t->flags[i] = b->flags[i];
    }
    for (int i = 0; i < n; i++)
        if (b->tokens[i] && t->str_len[i] > 0) vocab_insert(t, i);
    return 0;
}

/* The ids of the byte-level alphabet and of the <0xNN> byte-fallback tokens; byte_of_cp
 * (324) maps an alphabet code point back to its byte, -1 elsewhere. */
static void build_byte_tables(tokenizer *t, int32_t *byte_of_cp) {
    int32_t cp_of_byte[256];
    bytelevel_alphabet(cp_of_byte);
    for (int i = 0; i < 324; i++) byte_of_cp[i] = -1;
    for (int i = 0; i < 256; i++) byte_of_cp[cp_of_byte[i]] = i;
    for (int i = 0; i < 256; i++) {
        char buf[8];
        int k = utf8_encode(cp_of_byte[i], buf);
        t->byte_sym[i] = tok_vocab_find(t, buf, (size_t)k);
        snprintf(buf, sizeof buf, "<0x%02X>", i);
        t->byte_tok[i] = tok_vocab_find(t, buf, 6);
    }
}

/* The merge table: from the merge list (each "a b" must make a third token), else from
 * SentencePiece scores. */
static int build_merges(tokenizer *t, const tok_build *b, llmi_status *st) {
    const char *origin = b->origin;
    if (!b->merges) return b->scores ? spm_merges_from_scores(t, b->scores, st, origin) : 0;
    if (b->n_merges < 0 || b->n_merges > TOK_MAX_MERGES || alloc_merges(t, (uint64_t)b->n_merges) != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot hold %d merges", origin, b->n_merges);
    for (int m = 0; m < b->n_merges; m++) {
        const tok_merge_str *g = &b->merges[m];
        int32_t l = g->a && g->alen <= TOK_MAX_TOKLEN ? tok_vocab_find(t, g->a, g->alen) : -1;
        int32_t r = g->b && g->blen <= TOK_MAX_TOKLEN ? tok_vocab_find(t, g->b, g->blen) : -1;
        int32_t nid = -1;
        if (l >= 0 && r >= 0) {
            char buf[2 * TOK_MAX_TOKLEN];
            memcpy(buf, g->a, g->alen);
            memcpy(buf + g->alen, g->b, g->blen);
            nid = tok_vocab_find(t, buf, g->alen + g->blen);
        }
        if (nid < 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: merge %d (\"%.*s %.*s\") is not two vocabulary tokens "
                             "making a third", origin, m, g->a ? (int)(g->alen > 40 ? 40 : g->alen) : 0,
                             g->a ? g->a : "", g->b ? (int)(g->blen > 40 ? 40 : g->blen) : 0, g->b ? g->b : "");
        merge_insert(t, l, r, m, nid);
    }
    t->n_merges = b->n_merges;
    return 0;
}

/* The added tokens, matched in the text before the model sees it: contents (normalized
 * for the normalized ones), sorted by first byte then longest first, indexed by first byte. */
static int build_added(tokenizer *t, const tok_build *b, llmi_status *st) {
    const char *origin = b->origin;
    const int n = t->n_vocab;
    if (b->n_added > 0) {
        size_t tl = 0;
        for (int i = 0; i < b->n_added; i++) tl += b->added[i].len;
        /* normalized tokens are matched in normalized text, so their content is normalized
         * too (HF refresh_added_tokens); NFC can grow a string, SPM-legacy adds "▁"s */
        size_t cap = tl * 3 + 3 * (size_t)b->n_added + 1;
        t->added = malloc(sizeof(tok_added) * (size_t)b->n_added);
        t->added_text = malloc(cap);
        if (!t->added || !t->added_text) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin);
        uint32_t ao = 0;
        for (int i = 0; i < b->n_added; i++) {
            tok_added a = b->added[i];
            if (a.id < 0 || a.id >= n || a.len == 0)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: added token %d is invalid", origin, a.id);
            const char *src = b->added_text + a.off;
            utf8proc_uint8_t *nfc = NULL;
            size_t len = a.len;
            if (a.normalized && t->norm == TOK_NORM_NFC) {
                utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)src, (utf8proc_ssize_t)a.len, &nfc,
                                                  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                if (r > 0) { src = (const char *)nfc; len = (size_t)r; }
            }
            if (ao + len * 3 + 3 > cap) {
                char *q = realloc(t->added_text, cap = (ao + len * 3 + 3) * 2);
                if (!q) { free(nfc); return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", origin); }
                t->added_text = q;
            }
            if (a.normalized && (t->norm == TOK_NORM_SPM_LEGACY || t->norm == TOK_NORM_SPM)) {
                size_t k = 0;
                if (t->norm == TOK_NORM_SPM_LEGACY) {
                    memcpy(t->added_text + ao, SPM_SPACE, 3);
                    k = 3;
                }
                for (size_t j = 0; j < len; j++) {
                    if (src[j] == ' ') { memcpy(t->added_text + ao + k, SPM_SPACE, 3); k += 3; }
                    else t->added_text[ao + k++] = src[j];
                }
                len = k;
            } else {
                memcpy(t->added_text + ao, src, len);
            }
            free(nfc);
            a.off = ao;
            a.len = (uint32_t)len;
            ao += (uint32_t)len;
            t->added[t->n_added++] = a;
            t->flags[a.id] |= TOKF_ADDED | (a.special ? TOKF_SPECIAL : 0);
            if (a.normalized) t->any_normalized_added = true;
        }
        qsort_r(t->added, (size_t)t->n_added, sizeof(tok_added), cmp_added, t->added_text);
    }
    int ai = 0;
    for (int c = 0; c <= 256; c++) {
        while (ai < t->n_added && (uint8_t)t->added_text[t->added[ai].off] < c) ai++;
        t->added_first[c] = (uint32_t)ai;
    }
    return 0;
}

/* The decoded bytes of every token, and the worst case one streamed token may write. */
static void build_pieces(tokenizer *t, const int32_t *byte_of_cp) {
    uint32_t po = 0;
    t->stream_cap = 16;
    for (int i = 0; i < t->n_vocab; i++) {
        bool is_byte;
        t->piece_off[i] = po;
        t->piece_len[i] = (uint32_t)piece_of(t, t->text + t->str_off[i], t->str_len[i], byte_of_cp, t->pieces + po,
                                             &is_byte);
        if (is_byte) t->flags[i] |= TOKF_BYTE;
        size_t w = piece_worst_case(t->pieces + po, t->piece_len[i]);
        if (w > t->stream_cap) t->stream_cap = w;
        po += t->piece_len[i];
    }
}

int tok_build_common(tokenizer *t, const tok_build *b, llmi_status *st) {
    int32_t byte_of_cp[324];
    int rc = build_vocab(t, b, st);
    if (rc) return rc;
    build_byte_tables(t, byte_of_cp);
    if ((rc = build_merges(t, b, st)) || (rc = build_added(t, b, st))) return rc;
    build_pieces(t, byte_of_cp);
    return 0;
}

/* ------------------------------------------------------------------ accessors */

int tok_n_vocab(const tokenizer *t) { return t->n_vocab; }
int tok_bos(const tokenizer *t) { return t->bos_id; }
int tok_eos(const tokenizer *t) { return t->eos_id; }
bool tok_add_bos(const tokenizer *t) { return t->add_bos; }
tok_pre_kind tok_pre(const tokenizer *t) { return t->pre; }
bool tok_is_eog(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_EOG);
}
bool tok_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_SPECIAL);
}
size_t tok_stream_cap(const tokenizer *t) { return t->stream_cap; }

/* ------------------------------------------------------------------ encoding */

typedef struct { int32_t id, prev, next; bool dead; } bpe_sym;
typedef struct { int32_t rank, pos, new_id; } bpe_merge;

typedef struct enc_ctx {
    const tokenizer *t;
    bool parse_special;
    int32_t *ids; int n_ids, cap_ids;       /* output */
    bpe_sym *sym; int cap_sym;              /* scratch per word */
    bpe_merge *heap; int n_heap, cap_heap;
    char *buf; size_t cap_buf;              /* scratch: mapped / normalized text */
    char *buf2; size_t cap_buf2;
    pcre2_match_data *md;
    bool oom;
    int regex_err;                          /* a PCRE2 error other than "no match" */
} enc_ctx;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void emit(enc_ctx *c, int32_t id) {
    size_t cap = (size_t)c->cap_ids;
    if (!grow((void **)&c->ids, &cap, (size_t)c->n_ids + 1, sizeof(int32_t))) { c->oom = true; return; }
    c->cap_ids = (int)cap;
    c->ids[c->n_ids++] = id;
}

static bool merge_less(const bpe_merge *a, const bpe_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(enc_ctx *c, bpe_merge m) {
    size_t cap = (size_t)c->cap_heap;
    if (!grow((void **)&c->heap, &cap, (size_t)c->n_heap + 1, sizeof(bpe_merge))) { c->oom = true; return; }
    c->cap_heap = (int)cap;
    int i = c->n_heap++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!merge_less(&m, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = m;
}

static bpe_merge heap_pop(enc_ctx *c) {
    bpe_merge top = c->heap[0], last = c->heap[--c->n_heap];
    int i = 0, n = c->n_heap;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const bpe_merge *best = &last;
        if (l < n && merge_less(&c->heap[l], best)) { m = l; best = &c->heap[l]; }
        if (r < n && merge_less(&c->heap[r], best)) { m = r; }
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n > 0) c->heap[i] = last;
    return top;
}

static void add_sym(enc_ctx *c, int *n, int32_t id) {
    size_t cap = (size_t)c->cap_sym;
    if (!grow((void **)&c->sym, &cap, (size_t)*n + 1, sizeof(bpe_sym))) { c->oom = true; return; }
    c->cap_sym = (int)cap;
    c->sym[*n] = (bpe_sym){id, *n - 1, *n + 1, false};
    (*n)++;
}

/* HF BPE::merge_word: lowest rank first, ties leftmost; stale queue entries are recognised by
 * the pair no longer producing the same id. */
static void bpe_merge_syms(enc_ctx *c, int n) {
    const tokenizer *t = c->t;
    c->n_heap = 0;
    int32_t rank, nid;
    for (int i = 0; i + 1 < n; i++)
        if (merge_find(t, c->sym[i].id, c->sym[i + 1].id, &rank, &nid)) heap_push(c, (bpe_merge){rank, i, nid});
    while (c->n_heap > 0 && !c->oom) {
        bpe_merge top = heap_pop(c);
        bpe_sym *s = &c->sym[top.pos];
        if (s->dead || s->next >= n) continue;
        bpe_sym *r = &c->sym[s->next];
        if (!merge_find(t, s->id, r->id, &rank, &nid) || nid != top.new_id) continue;
        s->id = top.new_id;
        r->dead = true;
        s->next = r->next;
        if (s->next < n) c->sym[s->next].prev = top.pos;
        if (s->prev >= 0 && merge_find(t, c->sym[s->prev].id, s->id, &rank, &nid))
            heap_push(c, (bpe_merge){rank, s->prev, nid});
        if (s->next < n && merge_find(t, s->id, c->sym[s->next].id, &rank, &nid))
            heap_push(c, (bpe_merge){rank, top.pos, nid});
    }
    for (int i = 0; i < n && !c->oom; i = c->sym[i].next) emit(c, c->sym[i].id);
}

/* One pre-token through the model. */
static void bpe_word(enc_ctx *c, const char *w, size_t n) {
    const tokenizer *t = c->t;
    if (n == 0) return;
    int ns = 0;
    if (t->dec == TOK_DEC_BYTELEVEL) {
        if (t->ignore_merges) {
            /* c->buf, not buf2: w may live in buf2 (Metaspace) */
            if (!grow((void **)&c->buf, &c->cap_buf, n * 2 + 1, 1)) { c->oom = true; return; }
            int32_t cpb[256];
            bytelevel_alphabet(cpb);
            size_t k = 0;
            for (size_t i = 0; i < n; i++) k += (size_t)utf8_encode(cpb[(uint8_t)w[i]], c->buf + k);
            int id = tok_vocab_find(t, c->buf, k);
            if (id >= 0) { emit(c, id); return; }
        }
        int32_t unk = -1;   /* pending (fused) unknown */
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_sym[(uint8_t)w[i]];
            if (id >= 0) {
                if (unk >= 0) { add_sym(c, &ns, unk); unk = -1; }
                add_sym(c, &ns, id);
            } else if (t->unk_id >= 0) {
                if (unk >= 0 && !t->fuse_unk) add_sym(c, &ns, unk);
                unk = t->unk_id;
            }
        }
        if (unk >= 0) add_sym(c, &ns, unk);
    } else {
        if (t->ignore_merges) {
            int id = tok_vocab_find(t, w, n);
            if (id >= 0) { emit(c, id); return; }
        }
        int32_t unk = -1;
        for (size_t i = 0; i < n;) {
            int32_t cp;
            size_t k = (size_t)u8_next(w + i, n - i, &cp);
            int id = tok_vocab_find(t, w + i, k);
            if (id >= 0) {
                if (unk >= 0) { add_sym(c, &ns, unk); unk = -1; }
                add_sym(c, &ns, id);
            } else {
                bool all = t->byte_fallback;
                for (size_t j = 0; all && j < k; j++) all = t->byte_tok[(uint8_t)w[i + j]] >= 0;
                if (all) {
                    for (size_t j = 0; j < k; j++) add_sym(c, &ns, t->byte_tok[(uint8_t)w[i + j]]);
                } else if (t->unk_id >= 0) {
                    if (unk >= 0 && !t->fuse_unk) add_sym(c, &ns, unk);
                    unk = t->unk_id;
                }
            }
            i += k;
        }
        if (unk >= 0) add_sym(c, &ns, unk);
    }
    if (c->oom || ns == 0) return;
    bpe_merge_syms(c, ns);
}

/* Regex pre-tokenization (Split, behaviour Isolated): matches and the gaps between them are
 * pieces.  The subject is exactly the segment, so lookaheads never see past it. */
static void regex_split(enc_ctx *c, const char *s, size_t n) {
    size_t off = 0;
    while (off < n && !c->oom && !c->regex_err) {
        int rc = pcre2_match(c->t->re, (PCRE2_SPTR)s, n, off, 0, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) { bpe_word(c, s + off, n - off); return; }
        if (rc < 0) { c->regex_err = rc; return; }   /* a resource limit: fail, never mis-split */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (ms > off) bpe_word(c, s + off, ms - off);
        if (me <= ms) {   /* an empty match cannot come from our patterns; step one char */
            int32_t cp;
            me = ms + (size_t)u8_next(s + ms, n - ms, &cp);
        }
        bpe_word(c, s + ms, me - ms);
        off = me;
    }
}

static void pretokenize(enc_ctx *c, const char *s, size_t n, bool at_start) {
    const tokenizer *t = c->t;
    if (n == 0) return;
    if (t->metaspace != TOK_MS_NONE) {
        /* Metaspace: " " -> "▁", prepend "▁" per scheme, optionally split before each "▁" */
        if (!grow((void **)&c->buf2, &c->cap_buf2, n * 3 + 4, 1)) { c->oom = true; return; }
        size_t k = 0;
        bool starts = n >= 3 ? memcmp(s, SPM_SPACE, 3) == 0 || s[0] == ' ' : s[0] == ' ';
        if (!starts && (t->metaspace == TOK_MS_ALWAYS || (t->metaspace == TOK_MS_FIRST && at_start))) {
            memcpy(c->buf2, SPM_SPACE, 3);
            k = 3;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') { memcpy(c->buf2 + k, SPM_SPACE, 3); k += 3; }
            else c->buf2[k++] = s[i];
        }
        char *w = c->buf2;
        /* bpe_word may reuse buf2 only for byte-level; Metaspace tokenizers are not byte-level */
        if (!t->metaspace_split) { bpe_word(c, w, k); return; }
        size_t st = 0;
        for (size_t i = 1; i + 3 <= k; i++)
            if (memcmp(w + i, SPM_SPACE, 3) == 0) { bpe_word(c, w + st, i - st); st = i; i += 2; }
        bpe_word(c, w + st, k - st);
        return;
    }
    if (!t->re) { bpe_word(c, s, n); return; }
    if (!t->digits_split) { regex_split(c, s, n); return; }
    /* Digits(individual_digits): every numeric char is its own piece; the regex runs on the rest */
    size_t st = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = (size_t)u8_next(s + i, n - i, &cp);
        if (is_numeric_cp(cp)) {
            if (i > st) regex_split(c, s + st, i - st);
            bpe_word(c, s + i, k);
            st = i + k;
        }
        i += k;
    }
    if (st < n) regex_split(c, s + st, n - st);
}

typedef void (*segment_fn)(enc_ctx *c, const char *s, size_t n, bool at_start);

/* HF AddedVocabulary::find_matches: leftmost-longest, non-overlapping; single_word, lstrip,
 * rstrip; special tokens are skipped (left in the text) when parse_special is off. */
static void split_added(enc_ctx *c, const char *s, size_t n, bool normalized, bool at_start, segment_fn seg) {
    const tokenizer *t = c->t;
    size_t pos = 0, i = 0;
    while (i < n && !c->oom) {
        uint8_t fb = (uint8_t)s[i];
        const tok_added *hit = NULL;
        for (uint32_t a = t->added_first[fb]; a < t->added_first[fb + 1]; a++) {
            const tok_added *ad = &t->added[a];
            if (ad->normalized != normalized || ad->len > n - i) continue;
            if (memcmp(s + i, t->added_text + ad->off, ad->len) == 0) { hit = ad; break; }
        }
        if (!hit) { i++; continue; }
        size_t ms = i, me = i + hit->len;
        i = me;
        if (hit->special && !c->parse_special) continue;
        if (hit->single_word) {
            size_t ps;
            int32_t before = ms > 0 ? u8_prev(s, ms, &ps) : -1, after = -1;
            if (me < n) u8_next(s + me, n - me, &after);
            if ((ms > 0 && is_word_char(before)) || (me < n && is_word_char(after))) continue;
        }
        if (hit->lstrip) {
            size_t ns = ms;
            while (ns > pos) {
                size_t ps;
                int32_t cp = u8_prev(s, ns, &ps);
                if (!is_white_space(cp)) break;
                ns = ps;
            }
            ms = ns;
        }
        if (hit->rstrip) {
            while (me < n) {
                int32_t cp;
                int k = u8_next(s + me, n - me, &cp);
                if (!is_white_space(cp)) break;
                me += (size_t)k;
            }
            i = me;
        }
        if (ms > pos) seg(c, s + pos, ms - pos, at_start && pos == 0);
        emit(c, hit->id);
        pos = me;
    }
    if (pos < n && !c->oom) seg(c, s + pos, n - pos, at_start && pos == 0);
}

static void normalized_segment(enc_ctx *c, const char *s, size_t n, bool at_start) {
    pretokenize(c, s, n, at_start);
}

/* A raw-text segment between non-normalized added tokens: normalize, split out normalized
 * added tokens, pre-tokenize. */
static void raw_segment(enc_ctx *c, const char *s, size_t n, bool at_start) {
    const tokenizer *t = c->t;
    char *norm = NULL;
    size_t nn = n;
    const char *p = s;
    if (t->norm == TOK_NORM_NFC) {
        utf8proc_uint8_t *o = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &o,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r >= 0) { norm = (char *)o; nn = (size_t)r; p = norm; }
        else free(o);   /* invalid UTF-8: left as is, bytes still encodable */
    } else if (t->norm == TOK_NORM_SPM_LEGACY || t->norm == TOK_NORM_SPM) {
        norm = malloc(n * 3 + 4);
        if (!norm) { c->oom = true; return; }
        size_t k = 0;
        if (t->norm == TOK_NORM_SPM_LEGACY) {
            memcpy(norm, SPM_SPACE, 3);
            k = 3;
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') { memcpy(norm + k, SPM_SPACE, 3); k += 3; }
            else norm[k++] = s[i];
        }
        nn = k;
        p = norm;
    }
    if (t->any_normalized_added) split_added(c, p, nn, true, at_start, normalized_segment);
    else pretokenize(c, p, nn, at_start);
    free(norm);
}

int tok_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
               int32_t **ids, int *n_ids, llmi_status *st) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0) return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: NULL text");
    if (len > (size_t)INT32_MAX / 2) return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: input of %zu bytes is too long", len);
    enc_ctx c = {.t = t, .parse_special = parse_special};
    if (t->re) {
        c.md = pcre2_match_data_create_from_pattern(t->re, NULL);
        if (!c.md) return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: out of memory");
    }
    if (add_special && t->add_bos && t->bos_id >= 0) emit(&c, t->bos_id);
    if (len > 0) split_added(&c, text, len, false, true, raw_segment);
    if (add_special && t->add_eos && t->eos_id >= 0) emit(&c, t->eos_id);
    free(c.sym);
    free(c.heap);
    free(c.buf);
    free(c.buf2);
    if (c.md) pcre2_match_data_free(c.md);
    if (c.oom || c.regex_err) {
        free(c.ids);
        if (c.regex_err) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(c.regex_err, msg, sizeof msg);
            return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: pre-tokenizer regex failed on %zu bytes: %s", len,
                             (const char *)msg);
        }
        return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: out of memory encoding %zu bytes", len);
    }
    if (!c.ids) {   /* empty result: still hand back a freeable pointer */
        c.ids = malloc(sizeof(int32_t));
        if (!c.ids) return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: out of memory");
    }
    *ids = c.ids;
    *n_ids = c.n_ids;
    return 0;
}

/* ------------------------------------------------------------------ decoding */

int tok_piece(const tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab || !buf) return 0;
    size_t n = t->piece_len[id];
    if (n > cap) n = cap;
    memcpy(buf, t->pieces + t->piece_off[id], n);
    return (int)n;
}

void tok_stream_init(tok_stream *s, const tokenizer *t, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    s->first = true;
}

typedef struct { char *buf; size_t n, cap; } outbuf;

static void out_byte(tok_stream *s, outbuf *o, char ch) {
    if (s->first) {
        s->first = false;
        if (s->t->dec_strip_space && ch == ' ') return;
    }
    if (o->n < o->cap) o->buf[o->n] = ch;
    o->n++;
}

static void out_fffd(tok_stream *s, outbuf *o, int count) {
    for (int i = 0; i < count; i++) {
        out_byte(s, o, (char)0xEF); out_byte(s, o, (char)0xBF); out_byte(s, o, (char)0xBD);
    }
}

/* Bytes a UTF-8 sequence starting with lead byte b needs (0 = not a valid lead). */
static int u8_need(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

static bool u8_cont_ok(const char *pending, int n, uint8_t b) {
    if (n == 1) {
        uint8_t l = (uint8_t)pending[0];
        if (l == 0xE0) return b >= 0xA0 && b <= 0xBF;
        if (l == 0xED) return b >= 0x80 && b <= 0x9F;
        if (l == 0xF0) return b >= 0x90 && b <= 0xBF;
        if (l == 0xF4) return b >= 0x80 && b <= 0x8F;
    }
    return b >= 0x80 && b <= 0xBF;
}

/* Invalid bytes become U+FFFD: one per maximal invalid subpart for byte-level (Rust
 * from_utf8_lossy), one per byte for SentencePiece byte fallback (HF ByteFallback). */
static void feed_byte(tok_stream *s, outbuf *o, uint8_t b) {
    int per_byte = s->t->dec == TOK_DEC_SPM;
    for (;;) {
        if (s->n_pending == 0) {
            int need = u8_need(b);
            if (need == 1) out_byte(s, o, (char)b);
            else if (need == 0) out_fffd(s, o, 1);
            else s->pending[s->n_pending++] = (char)b;
            return;
        }
        if (u8_cont_ok(s->pending, s->n_pending, b)) {
            s->pending[s->n_pending++] = (char)b;
            if (s->n_pending == u8_need((uint8_t)s->pending[0])) {
                for (int i = 0; i < s->n_pending; i++) out_byte(s, o, s->pending[i]);
                s->n_pending = 0;
            }
            return;
        }
        out_fffd(s, o, per_byte ? s->n_pending : 1);
        s->n_pending = 0;   /* and look at b again as a fresh start */
    }
}

static size_t stream_push(tok_stream *s, int32_t id, outbuf *o) {
    const tokenizer *t = s->t;
    if (id < 0 || id >= t->n_vocab) return o->n;
    if (s->skip_special && (t->flags[id] & TOKF_SPECIAL)) return o->n;
    const char *p = t->pieces + t->piece_off[id];
    for (uint32_t i = 0; i < t->piece_len[id]; i++) feed_byte(s, o, (uint8_t)p[i]);
    return o->n;
}

int tok_stream_push(tok_stream *s, int32_t id, char *buf, size_t cap) {
    outbuf o = {buf, 0, cap};
    stream_push(s, id, &o);
    return (int)(o.n > cap ? cap : o.n);
}

int tok_stream_flush(tok_stream *s, char *buf, size_t cap) {
    outbuf o = {buf, 0, cap};
    if (s->n_pending > 0) out_fffd(s, &o, s->t->dec == TOK_DEC_SPM ? s->n_pending : 1);
    s->n_pending = 0;
    return (int)(o.n > cap ? cap : o.n);
}

int tok_decode(const tokenizer *t, const int32_t *ids, int n, bool skip_special, char **out, size_t *len,
               llmi_status *st) {
    *out = NULL;
    *len = 0;
    tok_stream s;
    tok_stream_init(&s, t, skip_special);
    /* first pass measures, second writes: same code path as streaming, so they agree */
    outbuf o = {NULL, 0, 0};
    for (int i = 0; i < n; i++) stream_push(&s, ids[i], &o);
    if (s.n_pending > 0) out_fffd(&s, &o, t->dec == TOK_DEC_SPM ? s.n_pending : 1);
    char *buf = malloc(o.n + 1);
    if (!buf) return llmi_fail(st, LLMI_E_RUNTIME, "tokenizer: out of memory decoding %d tokens", n);
    tok_stream_init(&s, t, skip_special);
    outbuf w = {buf, 0, o.n};
    for (int i = 0; i < n; i++) stream_push(&s, ids[i], &w);
    if (s.n_pending > 0) out_fffd(&s, &w, t->dec == TOK_DEC_SPM ? s.n_pending : 1);
    buf[w.n] = '\0';
    *out = buf;
    *len = w.n;
    return 0;
}
