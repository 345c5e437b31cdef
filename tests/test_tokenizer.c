/* test_tokenizer.c — the tokenizer against Hugging Face `tokenizers` reference encodings
 * (testdata/tokenizer/, made by scripts/make-tokenizer-refs.py), llama.cpp's own vocab test
 * vectors, jinja2 chat-template renderings, and fresh random round trips each run. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <utf8proc.h>
#include <zstd.h>
#include "model/gguf.h"
#include "test.h"
#include "quant/write_hf.h"
#include "tok/tokenizer.h"

#ifndef TESTDATA_DIR
#define TESTDATA_DIR "testdata"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static const char *testdata(void) {
    const char *e = getenv("TESTDATA");
    return e ? e : TESTDATA_DIR;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[sz] = 0; *n = (size_t)sz; }
    return b;
}

/* Whole .zst file decompressed, NUL-terminated. */
static char *slurp_zst(const char *path, size_t *n) {
    size_t cn;
    char *c = slurp(path, &cn);
    if (!c) return NULL;
    ZSTD_DStream *ds = ZSTD_createDStream();
    size_t cap = cn * 8 + 1024, len = 0;
    char *out = malloc(cap);
    ZSTD_inBuffer in = {c, cn, 0};
    while (out && in.pos < in.size) {
        if (cap - len < ZSTD_DStreamOutSize()) {
            char *q = realloc(out, cap * 2);
            if (!q) { free(out); out = NULL; break; }
            out = q;
            cap *= 2;
        }
        ZSTD_outBuffer ob = {out + len, cap - len - 1, 0};
        size_t r = ZSTD_decompressStream(ds, &ob, &in);
        len += ob.pos;
        if (ZSTD_isError(r)) { free(out); out = NULL; break; }
        if (r == 0 && in.pos == in.size) break;
    }
    ZSTD_freeDStream(ds);
    free(c);
    if (!out) return NULL;
    out[len] = 0;
    *n = len;
    return out;
}

/* The next JSON object of a JSONL text (cut in place at each newline), NULL at the end. */
static cJSON *next_json_line(char **cur) {
    while (*cur && **cur) {
        char *line = *cur, *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        *cur = nl ? nl + 1 : NULL;
        cJSON *r = cJSON_Parse(line);
        if (r) return r;
    }
    return NULL;
}

/* tokenizer.json.zst -> a temporary HF directory -> tok_load_hf */
static tokenizer *load_hf_zst(const char *dir, llmi_status *st) {
    char p[1024], tmp[] = "/tmp/llmi-tok-XXXXXX", jp[1100];
    snprintf(p, sizeof p, "%s/tokenizer.json.zst", dir);
    size_t n;
    char *js = slurp_zst(p, &n);
    if (!js || !mkdtemp(tmp)) { free(js); return NULL; }
    snprintf(jp, sizeof jp, "%s/tokenizer.json", tmp);
    FILE *f = fopen(jp, "wb");
    if (f) { fwrite(js, 1, n, f); fclose(f); }
    free(js);
    tokenizer *t = NULL;
    tok_load_hf(tmp, &t, st);
    unlink(jp);
    rmdir(tmp);
    return t;
}

/* The tokenizer a GGUF file describes, built as the model loader builds it. */
static tokenizer *load_gguf(const char *path, llmi_status *st) {
    gguf_file g;
    if (gguf_open(path, &g, st)) return NULL;
    tokenizer *t = NULL;
    tok_load_gguf(&g, &t, st);
    gguf_close(&g);
    return t;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "    %s (%d):", what, n);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int json_ids(const cJSON *a, int32_t **out) {
    int n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a)(*out)[i++] = (int32_t)x->valueint;
    return n;
}

/* Concatenated tok_stream pushes + flush for ids. */
static char *stream_decode(const tokenizer *t, const int32_t *ids, int n, bool skip, size_t *len) {
    tok_stream s;
    tok_stream_init(&s, t, skip);
    size_t cap = tok_stream_cap(t), total = 0, bufcap = (size_t)n * cap + cap + 1;
    char *out = malloc(bufcap);
    for (int i = 0; i < n; i++) total += (size_t)tok_stream_push(&s, ids[i], out + total, cap);
    total += (size_t)tok_stream_flush(&s, out + total, cap);
    out[total] = 0;
    *len = total;
    return out;
}

typedef struct { int records, id_fail, np_fail, dec_fail, stream_fail, rt_checked; } ref_stats;

/* One JSONL reference file against a tokenizer. */
static void check_refs_min(test_ctx *t_, const tokenizer *tk, const char *refs_path, const char *label, int min_records) {
    size_t n;
    char *txt = slurp_zst(refs_path, &n);
    CHECK_MSG(txt != NULL, "cannot read %s", refs_path);
    if (!txt) return;
    ref_stats rs = {0};
    int shown = 0;
    cJSON *r;
    for (char *cur = txt; (r = next_json_line(&cur)) != NULL;) {
        rs.records++;
        const cJSON *jt = cJSON_GetObjectItem(r, "t");
        const char *text = jt->valuestring;
        size_t tlen = strlen(text);
        bool add = cJSON_IsTrue(cJSON_GetObjectItem(r, "a"));
        int32_t *want, *wnp = NULL, *got = NULL, *gnp = NULL;
        int nw = json_ids(cJSON_GetObjectItem(r, "ids"), &want), nwnp = 0, ng = 0, ngnp = 0;
        const cJSON *jnp = cJSON_GetObjectItem(r, "np");
        if (jnp) nwnp = json_ids(jnp, &wnp);
        else { wnp = want; nwnp = nw; }
        llmi_status st = {0};
        tok_encode(tk, text, tlen, add, true, &got, &ng, &st);
        tok_encode(tk, text, tlen, add, false, &gnp, &ngnp, &st);
        bool ok = ng == nw && memcmp(got, want, sizeof(int32_t) * (size_t)nw) == 0;
        bool oknp = ngnp == nwnp && memcmp(gnp, wnp, sizeof(int32_t) * (size_t)nwnp) == 0;
        if (!ok) rs.id_fail++;
        if (!oknp) rs.np_fail++;
        if ((!ok || !oknp) && shown < 4) {
            shown++;
            fprintf(stderr, "  %s: ids differ for %.200s%s (len %zu, add_special %d)\n", label, text,
                    tlen > 200 ? "..." : "", tlen, add);
            if (!ok) { print_ids("hf  ", want, nw); print_ids("llmi", got, ng); }
            if (!oknp) { print_ids("hf   no-parse", wnp, nwnp); print_ids("llmi no-parse", gnp, ngnp); }
        }
        /* decode of the reference ids: HF's decode, and the stream must agree with it */
        const cJSON *jd = cJSON_GetObjectItem(r, "d"), *jds = cJSON_GetObjectItem(r, "ds");
        const char *wd = jd ? jd->valuestring : text, *wds = jds ? jds->valuestring : wd;
        for (int skip = 0; skip < 2; skip++) {
            const char *w = skip ? wds : wd;
            char *d = NULL;
            size_t dl = 0, sl = 0;
            tok_decode(tk, want, nw, skip, &d, &dl, &st);
            if (!jd) rs.rt_checked += !skip;
            if (!d || dl != strlen(w) || memcmp(d, w, dl) != 0) {
                if (rs.dec_fail++ < 3)
                    fprintf(stderr, "  %s: decode(skip=%d) differs for %.120s\n    hf  : %.120s\n    llmi: %.120s\n", label,
                            skip, text, w, d ? d : "(null)");
            }
            char *sd = stream_decode(tk, want, nw, skip, &sl);
            if (!d || sl != dl || memcmp(sd, d, dl) != 0) rs.stream_fail++;
            free(sd);
            free(d);
        }
        free(got); free(gnp); free(want);
        if (jnp) free(wnp);
        cJSON_Delete(r);
    }
    free(txt);
    fprintf(stderr, "  %s: %d strings, %d id mismatches, %d no-parse mismatches, %d decode mismatches, %d stream "
            "mismatches\n", label, rs.records, rs.id_fail, rs.np_fail, rs.dec_fail, rs.stream_fail);
    CHECK(rs.records >= min_records);
    CHECK(rs.id_fail == 0);
    CHECK(rs.np_fail == 0);
    CHECK(rs.dec_fail == 0);
    CHECK(rs.stream_fail == 0);
}

static void check_refs(test_ctx *t_, const tokenizer *tk, const char *refs_path, const char *label) {
    check_refs_min(t_, tk, refs_path, label, 2000);
}

static char *path_in(char *buf, size_t cap, const char *sub) {
    snprintf(buf, cap, "%s/tokenizer/%s", testdata(), sub);
    return buf;
}

TEST(tok_ref_smollm2_hf) {
    char d[1024], r[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load_hf(path_in(d, sizeof d, "smollm2"), &tk, &st) == 0, "%s", st.msg);
    if (!tk) return;
    CHECK(tok_n_vocab(tk) == 49152);
    CHECK(tok_bos(tk) == 1 && tok_eos(tk) == 2 && !tok_add_bos(tk));
    CHECK(tok_is_eog(tk, 2) && tok_is_special(tk, 1) && !tok_is_special(tk, 100));
    CHECK(strcmp(tok_chat_template_name(tk), "chatml") == 0);
    CHECK(tok_pre(tk) == TOK_PRE_SMOLLM);
    check_refs(t_, tk, path_in(r, sizeof r, "smollm2/refs.jsonl.zst"), "smollm2 tokenizer.json");
    tok_free(tk);
}

/* The real model file: the GGUF path (tok_create) must give the same ids as HF. */
TEST(tok_ref_smollm2_gguf) {
    const char *m = getenv("MODEL");
    if (!m) m = "/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(m, R_OK) != 0) SKIP("%s not present (scripts/fetch-model.sh)", m);
    llmi_status st = {0};
    tokenizer *tk = load_gguf(m, &st);
    CHECK_MSG(tk != NULL, "%s", st.msg);
    if (!tk) return;
    char r[1024];
    check_refs(t_, tk, path_in(r, sizeof r, "smollm2/refs.jsonl.zst"), "smollm2 gguf");
    tok_free(tk);
}

TEST(tok_ref_llama_spm_hf) {
    char d[1024], r[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load_hf(path_in(d, sizeof d, "llama-spm"), &tk, &st) == 0, "%s", st.msg);
    if (!tk) return;
    CHECK(tok_bos(tk) == 1 && tok_add_bos(tk) && tok_eos(tk) == 2);
    CHECK(strcmp(tok_chat_template_name(tk), "llama2") == 0);
    CHECK(tok_pre(tk) == TOK_PRE_NONE);
    check_refs(t_, tk, path_in(r, sizeof r, "llama-spm/refs.jsonl.zst"), "llama-spm tokenizer.json");
    tok_free(tk);
}

/* The older Metaspace form: prepend "▁" always, split into words before every "▁".  Its
 * tokenizer.json is the committed one with that one object edited (as the script does). */
TEST(tok_ref_llama_spm_metaspace_split) {
    char p[1024], r[1024], tmp[] = "/tmp/llmi-tok-XXXXXX", jp[1100];
    size_t n;
    char *js = slurp(path_in(p, sizeof p, "llama-spm/tokenizer.json"), &n);
    CHECK(js != NULL && mkdtemp(tmp) != NULL);
    if (!js) return;
    const char *from = "\"prepend_scheme\":\"first\",\"split\":false}";
    const char *to = "\"prepend_scheme\":\"always\",\"split\":true}";   /* same length */
    char *at = strstr(js, from);
    CHECK(at != NULL && strlen(from) == strlen(to));
    if (at && strlen(from) == strlen(to)) memcpy(at, to, strlen(to));
    snprintf(jp, sizeof jp, "%s/tokenizer.json", tmp);
    FILE *f = fopen(jp, "wb");
    if (f) { fwrite(js, 1, n, f); fclose(f); }
    free(js);
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load_hf(tmp, &tk, &st) == 0, "%s", st.msg);
    unlink(jp);
    rmdir(tmp);
    if (!tk) return;
    check_refs_min(t_, tk, path_in(r, sizeof r, "llama-spm/refs-split.jsonl.zst"), "llama-spm Metaspace(split)", 700);
    tok_free(tk);
}

/* llama.cpp's SentencePiece behaviour = HF's legacy Llama-2 form (prepend "▁" to every segment). */
TEST(tok_ref_llama_spm_gguf) {
    char g[1024], r[1024];
    llmi_status st = {0};
    tokenizer *tk = load_gguf(path_in(g, sizeof g, "llama-spm/ggml-vocab-llama-spm.gguf"), &st);
    CHECK_MSG(tk != NULL, "%s", st.msg);
    if (!tk) return;
    check_refs(t_, tk, path_in(r, sizeof r, "llama-spm/refs-legacy.jsonl.zst"), "llama-spm gguf (legacy)");
    tok_free(tk);
}

static void trimmed(test_ctx *t_, const char *name, tok_pre_kind want_pre) {
    char d[1024], r[1024];
    llmi_status st = {0};
    tokenizer *tk = load_hf_zst(path_in(d, sizeof d, name), &st);
    CHECK_MSG(tk != NULL, "%s: %s", name, st.msg);
    if (!tk) return;
    CHECK_MSG(tok_pre(tk) == want_pre, "%s: pre-tokenizer detected as %d, want %d", name, (int)tok_pre(tk), (int)want_pre);
    snprintf(r, sizeof r, "%s/tokenizer/%s/refs.jsonl.zst", testdata(), name);
    check_refs(t_, tk, r, name);
    tok_free(tk);
}

TEST(tok_ref_llama3_trim) { trimmed(t_, "llama3-trim", TOK_PRE_LLAMA3); }
TEST(tok_ref_qwen2_trim) { trimmed(t_, "qwen2-trim", TOK_PRE_QWEN2); }
TEST(tok_ref_gpt2_trim) { trimmed(t_, "gpt2-trim", TOK_PRE_GPT2); }
/* The o200k (GPT-4o, Phi-4-mini) and Tekken (Mistral-Nemo, Mistral-Small 3) Split regexes on a
 * trimmed Llama-3 vocabulary: HF's tokenizer.json, and the same vocabulary as a GGUF with
 * llama.cpp's pre name ("gpt-4o", "tekken": Tekken's BOS by default, ignore_merges), against
 * HF `tokenizers`' encodings. */
/* A committed .gguf.zst unpacked into tmp (a mkstemp template), for the GGUF reader, which
 * maps a file: false when it cannot be read or written. */
static bool unzst_to_file(test_ctx *t_, const char *zst, char *tmp) {
    size_t n;
    char *bytes = slurp_zst(zst, &n);
    CHECK_MSG(bytes != NULL, "cannot read %s", zst);
    int fd = bytes ? mkstemp(tmp) : -1;
    bool ok = fd >= 0 && write(fd, bytes, n) == (ssize_t)n;
    if (fd >= 0) close(fd);
    CHECK_MSG(!bytes || ok, "cannot write %s", tmp);
    free(bytes);
    return ok;
}

static void trimmed_gguf(test_ctx *t_, const char *name, tok_pre_kind want_pre) {
    char z[1024], r[1024], tmp[] = "/tmp/llmi-vocab-XXXXXX";
    snprintf(z, sizeof z, "%s/tokenizer/%s/vocab.gguf.zst", testdata(), name);
    snprintf(r, sizeof r, "%s/tokenizer/%s/refs.jsonl.zst", testdata(), name);
    if (unzst_to_file(t_, z, tmp)) {
        llmi_status st = {0};
        tokenizer *tk = load_gguf(tmp, &st);
        CHECK_MSG(tk != NULL, "%s: %s", z, st.msg);
        if (tk) {
            CHECK_MSG(tok_pre(tk) == want_pre, "%s: pre-tokenizer %d, want %d", z, (int)tok_pre(tk), (int)want_pre);
            CHECK(tok_add_bos(tk) == (want_pre == TOK_PRE_TEKKEN));
            check_refs(t_, tk, r, z);
            tok_free(tk);
        }
        /* llmi quantize's tokenizer.json for a GGUF input: read back, the same tokenizer */
        char dir[] = "/tmp/llmi-tokjson-XXXXXX", label[1100];
        CHECK(mkdtemp(dir) != NULL);
        int wrc = quant_write_gguf_tokenizer(tmp, dir, &st);
        CHECK_MSG(wrc == 0, "writing tokenizer.json of %s: %s", z, st.msg);
        tk = NULL;
        if (!wrc && tok_load_hf(dir, &tk, &st) == 0) {
            snprintf(label, sizeof label, "%s as quantize's tokenizer.json", name);
            CHECK_MSG(tok_pre(tk) == want_pre, "%s: pre-tokenizer %d", label, (int)tok_pre(tk));
            check_refs(t_, tk, r, label);
            tok_free(tk);
        } else {
            CHECK_MSG(0, "reading back %s: %s", dir, st.msg);
        }
        char f[1200];
        const char *files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
        for (int i = 0; i < 3; i++) snprintf(f, sizeof f, "%s/%s", dir, files[i]), unlink(f);
        rmdir(dir);
        unlink(tmp);
    }
}
TEST(tok_ref_o200k_trim) { trimmed(t_, "o200k-trim", TOK_PRE_O200K); }
TEST(tok_ref_tekken_trim) { trimmed(t_, "tekken-trim", TOK_PRE_TEKKEN); }
TEST(tok_ref_o200k_trim_gguf) { trimmed_gguf(t_, "o200k-trim", TOK_PRE_O200K); }
TEST(tok_ref_tekken_trim_gguf) { trimmed_gguf(t_, "tekken-trim", TOK_PRE_TEKKEN); }

/* llama.cpp's own vectors (models/ggml-vocab-*.gguf.inp/.out): encode without BOS, special
 * strings as text.  All four sets are committed (testdata/tokenizer/PROVENANCE.md); a
 * missing file is a failure, not a skip. */
static void llamacpp_vectors(test_ctx *t_, const char *label, const char *gguf, const char *inp, const char *outp,
                             tok_pre_kind want_pre) {
    llmi_status st = {0};
    tokenizer *tk = load_gguf(gguf, &st);
    CHECK_MSG(tk != NULL, "%s: %s", label, st.msg);
    size_t ni, no;
    char *in = slurp(inp, &ni), *out = slurp(outp, &no);
    CHECK_MSG(in && out, "cannot read %s or %s", inp, outp);
    if (!tk || !in || !out) { tok_free(tk); free(in); free(out); return; }
    CHECK_MSG(tok_pre(tk) == want_pre, "%s: pre-tokenizer %d, want %d", label, (int)tok_pre(tk), (int)want_pre);
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = in, *o = out;
    int cases = 0, bad = 0;
    while (p && *p) {
        char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *onl = strchr(o, '\n');
        if (!onl) break;
        *onl = 0;
        int32_t want[4096];
        int nw = 0;
        for (char *q = o, *end; *q && nw < 4096; q = end) {
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *got;
        int ng;
        tok_encode(tk, p, len, false, false, &got, &ng, &st);
        cases++;
        if (ng != nw || memcmp(got, want, sizeof(int32_t) * (size_t)nw) != 0) {
            if (bad++ < 3) {
                fprintf(stderr, "  %s: case %d \"%.*s\"\n", label, cases, (int)(len > 80 ? 80 : len), p);
                print_ids("llama.cpp", want, nw);
                print_ids("llmi     ", got, ng);
            }
        }
        free(got);
        o = onl + 1;
        p = e ? e + strlen(sep) : NULL;
    }
    fprintf(stderr, "  %s: %d cases, %d mismatches\n", label, cases, bad);
    CHECK(cases > 10);
    CHECK(bad == 0);
    free(in); free(out);
    tok_free(tk);
}

TEST(tok_llamacpp_vectors) {
    char g[1024], i[1100], o[1100];
    llamacpp_vectors(t_, "ggml-vocab-llama-spm", path_in(g, sizeof g, "llama-spm/ggml-vocab-llama-spm.gguf"),
                     path_in(i, sizeof i, "llama-spm/ggml-vocab-llama-spm.gguf.inp"),
                     path_in(o, sizeof o, "llama-spm/ggml-vocab-llama-spm.gguf.out"), TOK_PRE_NONE);
    /* The byte-level vocabularies are committed zstd-compressed (7.8 MB -> 1.6 MB for
     * llama-bpe): unpacked to a temporary file for the GGUF reader, which maps a file. */
    const char *names[] = {"gpt-2", "llama-bpe", "qwen2"};
    const tok_pre_kind pres[] = {TOK_PRE_GPT2, TOK_PRE_LLAMA3, TOK_PRE_QWEN2};
    for (int k = 0; k < 3; k++) {
        char z[1100], tmp[] = "/tmp/llmi-vocab-XXXXXX";
        snprintf(z, sizeof z, "%s/tokenizer/llamacpp-vocab/ggml-vocab-%s.gguf.zst", testdata(), names[k]);
        snprintf(i, sizeof i, "%s/tokenizer/llamacpp-vocab/ggml-vocab-%s.gguf.inp", testdata(), names[k]);
        snprintf(o, sizeof o, "%s/tokenizer/llamacpp-vocab/ggml-vocab-%s.gguf.out", testdata(), names[k]);
        if (unzst_to_file(t_, z, tmp)) {
            llamacpp_vectors(t_, z, tmp, i, o, pres[k]);
            unlink(tmp);
        }
    }
}

/* ------------------------------------------------------------------ fresh random inputs */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static size_t rand_text(uint64_t *rng, char *out, size_t cap) {
    static const char *const parts[] = {
        " ", "  ", "\t", "\n", "\r\n", "\n\n", "   ", "\u00a0", "\u3000", "the", "Hello", "WORLD", "don't", "'s",
        "'LL", "123", "4567890", "3.14", "!", "?!", "...", "—", "“q”", "😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "中文", "日本語",
        "한국어", "العربية", "עברית", "हिन्दी", "русский", "e\u0301", "a\u0308\u0323", "ǅ", "ſ", "K", "<|im_start|>",
        "<s>", "</s>", "<|endoftext|>", "<0x41>", "  x", "\x01", "\x7f", "\u200d", "\ufeff", "\xc2\x85"};
    size_t n = 0;
    int k = 1 + (int)(rng_next(rng) % 24);
    for (int i = 0; i < k; i++) {
        uint64_t r = rng_next(rng);
        char tmp[8];
        const char *p;
        size_t pl;
        if (r % 5 == 0) {   /* a random assigned code point from a few blocks */
            static const int32_t lo[] = {0x20, 0xA1, 0x370, 0x4E00, 0xAC00, 0x1F300, 0x600, 0x900};
            static const int32_t span[] = {95, 0x17E, 0x80, 0x5000, 0x2B00, 0x200, 0xFF, 0x7F};
            int b = (int)((r >> 8) % 8);
            int32_t cp = lo[b] + (int32_t)((r >> 16) % (uint64_t)span[b]);
            if (utf8proc_category(cp) == UTF8PROC_CATEGORY_CN) cp = 'x';
            pl = (size_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)tmp);
            p = tmp;
        } else {
            p = parts[(r >> 8) % (sizeof parts / sizeof parts[0])];
            pl = strlen(p);
        }
        if (n + pl + 1 > cap) break;
        memcpy(out + n, p, pl);
        n += pl;
    }
    out[n] = 0;
    return n;
}

static void random_roundtrips(test_ctx *t_, const tokenizer *tk, const char *label, bool nfc, bool spm_first,
                              uint64_t seed) {
    uint64_t rng = seed | 1;
    char text[2048];
    int bad_rt = 0, bad_stream = 0, bad_rand_stream = 0;
    for (int it = 0; it < 400; it++) {
        size_t n = rand_text(&rng, text, sizeof text);
        if (spm_first && text[0] == ' ') text[0] = 'y';   /* Metaspace(first) drops one leading space: HF does too */
        int32_t *ids;
        int ni;
        llmi_status st = {0};
        CHECK(tok_encode(tk, text, n, false, false, &ids, &ni, &st) == 0);
        char *d;
        size_t dl;
        tok_decode(tk, ids, ni, false, &d, &dl, &st);
        const char *want = text;
        size_t wl = n;
        char *norm = NULL;
        if (nfc) {
            norm = (char *)utf8proc_NFC((const utf8proc_uint8_t *)text);
            want = norm;
            wl = strlen(norm);
        }
        if (dl != wl || memcmp(d, want, wl) != 0) {
            if (bad_rt++ < 3) fprintf(stderr, "  %s: round trip failed for \"%s\" -> \"%s\"\n", label, text, d);
        }
        size_t sl;
        char *sd = stream_decode(tk, ids, ni, false, &sl);
        if (sl != dl || memcmp(sd, d, dl) != 0) bad_stream++;
        free(sd);
        free(d);
        free(norm);
        free(ids);
        /* arbitrary id sequences (broken UTF-8 included): stream == one-shot, skip or not */
        int32_t rid[64];
        int nr = 1 + (int)(rng_next(&rng) % 64);
        for (int i = 0; i < nr; i++) rid[i] = (int32_t)(rng_next(&rng) % (uint64_t)tok_n_vocab(tk));
        for (int skip = 0; skip < 2; skip++) {
            tok_decode(tk, rid, nr, skip, &d, &dl, &st);
            sd = stream_decode(tk, rid, nr, skip, &sl);
            if (sl != dl || memcmp(sd, d, dl) != 0) bad_rand_stream++;
            /* the decode is always valid UTF-8 */
            utf8proc_int32_t cp;
            for (size_t i = 0; i < dl;) {
                utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)d + i, (utf8proc_ssize_t)(dl - i), &cp);
                if (k <= 0) { bad_rand_stream++; break; }
                i += (size_t)k;
            }
            free(sd);
            free(d);
        }
    }
    CHECK_MSG(bad_rt == 0, "%s: %d round-trip failures (seed %llu)", label, bad_rt, (unsigned long long)seed);
    CHECK_MSG(bad_stream == 0, "%s: %d stream != decode", label, bad_stream);
    CHECK_MSG(bad_rand_stream == 0, "%s: %d random-id stream/UTF-8 failures", label, bad_rand_stream);
}

TEST(tok_random_roundtrip) {
    uint64_t seed = test_seed();
    fprintf(stderr, "  seed %llu\n", (unsigned long long)seed);
    char d[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    if (tok_load_hf(path_in(d, sizeof d, "smollm2"), &tk, &st) == 0) {
        random_roundtrips(t_, tk, "smollm2", false, false, seed);
        tok_free(tk);
    } else CHECK_MSG(0, "%s", st.msg);
    if (tok_load_hf(path_in(d, sizeof d, "llama-spm"), &tk, &st) == 0) {
        random_roundtrips(t_, tk, "llama-spm", false, true, seed + 1);
        tok_free(tk);
    } else CHECK_MSG(0, "%s", st.msg);
    tk = load_gguf(path_in(d, sizeof d, "llama-spm/ggml-vocab-llama-spm.gguf"), &st);
    if (tk) { random_roundtrips(t_, tk, "llama-spm gguf", false, false, seed + 2); tok_free(tk); }
    else CHECK_MSG(0, "%s", st.msg);
    tk = load_hf_zst(path_in(d, sizeof d, "qwen2-trim"), &st);
    if (tk) { random_roundtrips(t_, tk, "qwen2-trim", true, false, seed + 3); tok_free(tk); }
    else CHECK_MSG(0, "%s", st.msg);
}

/* 100 KB of mixed text must encode well under a second (optimized build). */
TEST(tok_speed_100k) {
    char d[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK(tok_load_hf(path_in(d, sizeof d, "smollm2"), &tk, &st) == 0);
    if (!tk) return;
    uint64_t rng = test_seed() | 1;
    size_t cap = 100 * 1024, n = 0;
    char *text = malloc(cap + 2048);
    while (n < cap) n += rand_text(&rng, text + n, 2048);
    /* plus one 20 KB run with no spaces, the BPE worst case */
    for (size_t i = 0; i < 20000 && n < cap + 2000; i++) text[n++] = "abcdefgh"[i % 8];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int32_t *ids;
    int ni;
    CHECK(tok_encode(tk, text, n, false, true, &ids, &ni, &st) == 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    fprintf(stderr, "  %zu bytes -> %d tokens in %.3f s\n", n, ni, s);
    CHECK(s < (UNDER_ASAN ? 5.0 : 0.5));
    free(ids);
    free(text);
    tok_free(tk);
}

/* ------------------------------------------------------------------ errors and edge cases */

TEST(tok_errors) {
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK(tok_load_hf("/nonexistent-dir", &tk, &st) != 0 && tk == NULL);
    CHECK(strstr(st.msg, "tokenizer.json") != NULL);
    /* an unsupported construct names tokenizer.json and the construct */
    char tmp[] = "/tmp/llmi-tokerr-XXXXXX", p[256];
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(p, sizeof p, "%s/tokenizer.json", tmp);
    FILE *f = fopen(p, "w");
    fputs("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", f);
    fclose(f);
    llmi_status st2 = {0};
    CHECK(tok_load_hf(tmp, &tk, &st2) != 0);
    CHECK_MSG(strstr(st2.msg, "tokenizer.json") && strstr(st2.msg, "WordPiece"), "%s", st2.msg);
    f = fopen(p, "w");
    fputs("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]},"
          "\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"decoder\":{\"type\":\"ByteLevel\"}}", f);
    fclose(f);
    llmi_status st3 = {0};
    CHECK(tok_load_hf(tmp, &tk, &st3) != 0);
    CHECK_MSG(strstr(st3.msg, "pre_tokenizer") && strstr(st3.msg, "Whitespace"), "%s", st3.msg);
    unlink(p);
    rmdir(tmp);
    /* a spec with a merge naming unknown tokens is refused */
    const char *toks[] = {"a", "b"};
    uint32_t lens[] = {1, 1};
    const char *merges[] = {"a c"};
    uint32_t mlens[] = {3};
    tok_spec s = {.model = TOK_MODEL_BYTELEVEL_BPE, .pre = TOK_PRE_GPT2, .n_tokens = 2, .tokens = toks,
                  .token_lens = lens, .n_merges = 1, .merges = merges, .merge_lens = mlens,
                  .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    llmi_status st4 = {0};
    CHECK(tok_create(&s, &tk, &st4) != 0 && tk == NULL);
    CHECK(strstr(st4.msg, "merge") != NULL);
}

/* ids of text by a byte-level BPE of the tokens toks (ids in order) and their merges, under
 * llama.cpp's pre-tokenizer name (*add_bos: what the name defaults to); how many ids (at
 * most 4 kept in out), -1 when the name is unknown or the tokenizer is refused. */
static int encode_under_pre(const char *name, const char *const *toks, int n_toks, const char *const *merges,
                            int n_merges, const char *text, bool *add_bos, int32_t out[4]) {
    uint32_t lens[8], mlens[4];
    for (int i = 0; i < n_toks; i++) lens[i] = (uint32_t)strlen(toks[i]);
    for (int i = 0; i < n_merges; i++) mlens[i] = (uint32_t)strlen(merges[i]);
    tok_pre_kind kind;
    if (!tok_gguf_pre_of(name, strlen(name), &kind, add_bos)) return -1;
    tok_spec s = {.model = TOK_MODEL_BYTELEVEL_BPE, .pre = kind, .n_tokens = n_toks, .tokens = toks,
                  .token_lens = lens, .n_merges = n_merges, .merges = merges, .merge_lens = mlens,
                  .bos_id = -1, .eos_id = -1, .unk_id = -1, .pad_id = -1};
    tokenizer *tk = NULL;
    llmi_status st = {0};
    if (tok_create(&s, &tk, &st) != 0) return -1;
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(tk, text, strlen(text), false, false, &ids, &n, &st) != 0) n = -1;
    for (int i = 0; i < n && i < 4; i++) out[i] = ids[i];
    free(ids);
    tok_free(tk);
    return n;
}

/* llama.cpp's ignore_merges by pre-tokenizer: a pre-token found whole in the vocabulary is
 * one token for Llama-3's and Tekken's names, merged pair by pair for the others ("abc" is
 * in the vocabulary, but the only merge is "a b"). */
TEST(tok_gguf_pre_ignore_merges) {
    const char *toks[] = {"a", "b", "c", "ab", "abc"};
    const char *merges[] = {"a b"};
    const char *names[] = {"llama-bpe", "tekken", "gpt-4o", "qwen2", "gpt-2", "pixtral", "deepseek-r1-qwen"};
    const bool whole[] = {true, true, false, false, false, true, false};
    for (int i = 0; i < 7; i++) {
        bool add_bos;
        int32_t ids[4] = {-1, -1, -1, -1};
        int n = encode_under_pre(names[i], toks, 5, merges, 1, "abc", &add_bos, ids);
        CHECK_MSG(whole[i] ? (n == 1 && ids[0] == 4) : (n == 2 && ids[0] == 3 && ids[1] == 2),
                  "%s: \"abc\" as %d tokens", names[i], n);
    }
    tok_pre_kind k;
    bool b;
    CHECK(!tok_gguf_pre_of("gpt-4", 5, &k, &b) && !tok_gguf_pre_of("tekken2", 7, &k, &b));
}

/* llama.cpp's StarCoder family (its case list with smollm's: starcoder, refact; Granite 3's
 * tokenizer): every digit its own pre-token before GPT-2's regex, no BOS; "12" is in the
 * vocabulary and "1 2" merges, so GPT-2's kind would make it one token. */
TEST(tok_gguf_pre_starcoder_digits) {
    const char *toks[] = {"1", "2", "12"};
    const char *merges[] = {"1 2"};
    const char *names[] = {"smollm", "refact", "starcoder", "gpt-2"};
    for (int i = 0; i < 4; i++) {
        bool add_bos = true;
        int32_t ids[4] = {-1, -1, -1, -1};
        int n = encode_under_pre(names[i], toks, 3, merges, 1, "12", &add_bos, ids);
        const bool split = i < 3;
        CHECK_MSG(!add_bos && (split ? (n == 2 && ids[0] == 0 && ids[1] == 1) : (n == 1 && ids[0] == 2)),
                  "%s: \"12\" as %d tokens, add_bos %d", names[i], n, add_bos);
    }
}

/* The streaming detokenizer holds incomplete UTF-8 back and drops the SentencePiece leading
 * space only at the very start. */
TEST(tok_stream_utf8) {
    char d[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK(tok_load_hf(path_in(d, sizeof d, "llama-spm"), &tk, &st) == 0);
    if (!tk) return;
    const char *txt = "中 😀 x";
    int32_t *ids;
    int n;
    tok_encode(tk, txt, strlen(txt), false, false, &ids, &n, &st);
    tok_stream s;
    tok_stream_init(&s, tk, true);
    char buf[512];
    int held = 0;
    for (int i = 0; i < n; i++) {
        int k = tok_stream_push(&s, ids[i], buf, sizeof buf);
        /* every push emits only whole characters */
        utf8proc_int32_t cp;
        for (int j = 0; j < k;) {
            utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)buf + j, k - j, &cp);
            CHECK(m > 0);
            if (m <= 0) break;
            j += (int)m;
        }
        if (k == 0) held++;
    }
    CHECK(held > 0);   /* the emoji is four byte tokens: three pushes emit nothing */
    free(ids);
    tok_free(tk);
}

/* ------------------------------------------------------------------ chat formatting */

static tokenizer *chat_tok(const char *tpl, const char *bos, const char *eos) {
    const char *toks[] = {"<unk>", bos[0] ? bos : "<bos>", eos[0] ? eos : "<eos>", "a"};
    uint32_t lens[] = {5, (uint32_t)strlen(toks[1]), (uint32_t)strlen(toks[2]), 1};
    float scores[] = {0, 0, 0, -1};
    int32_t types[] = {2, 3, 3, 1};
    tok_spec s = {.model = TOK_MODEL_SPM_BPE, .pre = TOK_PRE_NONE, .n_tokens = 4, .tokens = toks, .token_lens = lens,
                  .scores = scores, .token_types = types, .bos_id = bos[0] ? 1 : -1, .eos_id = 2, .unk_id = 0,
                  .pad_id = -1, .chat_template = tpl};
    tokenizer *t = NULL;
    llmi_status st = {0};
    tok_create(&s, &t, &st);
    return t;
}

/* The tokenizer of a rendering record: its template, bos and eos. */
static tokenizer *chat_tok_of(const cJSON *r) {
    return chat_tok(cJSON_GetObjectItem(r, "template")->valuestring, cJSON_GetObjectItem(r, "bos")->valuestring,
                    cJSON_GetObjectItem(r, "eos")->valuestring);
}

TEST(tok_chat_templates) {
    char p[1024];
    size_t n;
    char *txt = slurp(path_in(p, sizeof p, "chat.jsonl"), &n);
    CHECK(txt != NULL);
    if (!txt) return;
    int cases = 0;
    cJSON *r;
    for (char *cur = txt; (r = next_json_line(&cur)) != NULL;) {
        const char *kind = cJSON_GetObjectItem(r, "kind")->valuestring;
        const cJSON *js = cJSON_GetObjectItem(r, "system");
        tokenizer *tk = chat_tok_of(r);
        CHECK(tk != NULL);
        if (tk) {
            CHECK_MSG(strcmp(tok_chat_template_name(tk), kind) == 0, "%s detected as %s",
                      cJSON_GetObjectItem(r, "name")->valuestring, tok_chat_template_name(tk));
            char *out = NULL;
            llmi_status st = {0};
            tok_chat_format(tk, cJSON_IsString(js) ? js->valuestring : NULL,
                            cJSON_GetObjectItem(r, "user")->valuestring, &out, &st);
            const char *want0 = cJSON_GetObjectItem(r, "out")->valuestring;
            const cJSON *jtoday = cJSON_GetObjectItem(r, "today"), *jfmt = cJSON_GetObjectItem(r, "today_fmt");
            const size_t wcap = strlen(want0) + 64;   /* Devstral's default system message is 6 KB */
            char *want = malloc(wcap);
            snprintf(want, wcap, "%s", want0);
            if (cJSON_IsString(jtoday)) {
                /* Llama-3.2 and Mistral-Small 3.2 write today's date: the rendering's becomes this run's */
                char today[64];
                time_t now = time(NULL);
                struct tm tm;
                localtime_r(&now, &tm);
                strftime(today, sizeof today, cJSON_IsString(jfmt) ? jfmt->valuestring : "%d %b %Y", &tm);
                char *at = strstr(want, jtoday->valuestring);
                size_t ol = strlen(jtoday->valuestring), nl2 = strlen(today);
                if (at && strlen(want) - ol + nl2 < wcap) {
                    memmove(at + nl2, at + ol, strlen(at + ol) + 1);
                    memcpy(at, today, nl2);
                }
            }
            CHECK_MSG(out && strcmp(out, want) == 0, "%s: got\n%s\nwant\n%s", cJSON_GetObjectItem(r, "name")->valuestring,
                      out ? out : st.msg, want);
            free(want);
            free(out);
            tok_free(tk);
        }
        cases++;
        cJSON_Delete(r);
    }
    free(txt);
    CHECK(cases >= 20);
    /* an unknown template is refused with the agreed message; so are SmolLM3's, whose ChatML
     * turns follow a system turn of its own making, and a Mistral v7 one whose default system
     * message is not literals and today's date (lines of llama.cpp's models/templates copies) */
    const char *const refused[] = {"{{ messages }}",
                                   "{{- \"<|im_start|>system\\n\" -}}{{- \"## Metadata\\n\\n\" -}}"
                                   "{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}"
                                   "{{ \"<|im_start|>\" + message.role + \"\\n\" + content + \"<|im_end|>\\n\" }}",
                                   "{%- set default_system_message = load('system.txt') %}"
                                   "{{- bos_token }}{{- '[SYSTEM_PROMPT]' + system_prompt + '[/SYSTEM_PROMPT]' }}"
                                   "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{{- '[INST]' }}"};
    for (int i = 0; i < 3; i++) {
        tokenizer *tk = chat_tok(refused[i], "<s>", "</s>");
        char *out = NULL;
        llmi_status st = {0};
        CHECK(tk && tok_chat_format(tk, NULL, "hi", &out, &st) != 0);
        CHECK_MSG(strstr(st.msg, "not one of chatml, llama3, llama2, mistral") != NULL, "template %d: %s", i, st.msg);
        tok_free(tk);
    }
}

/* A conversation going on (bench --turns): format(system, user1) + answer + next_turn(user2)
 * is jinja2's rendering of [system?, user1, assistant(answer), user2] + generation prompt
 * (testdata/bench/chat-turns.jsonl, scripts/make-chat-turn-refs.py). */
TEST(tok_chat_next_turn_jinja) {
    size_t n;
    char p[1024];
    snprintf(p, sizeof p, "%s/bench/chat-turns.jsonl", testdata());
    char *txt = slurp(p, &n);
    CHECK(txt != NULL);
    if (!txt) return;
    int cases = 0;
    cJSON *r;
    for (char *cur = txt; (r = next_json_line(&cur)) != NULL;) {
        const cJSON *js = cJSON_GetObjectItem(r, "system");
        tokenizer *tk = chat_tok_of(r);
        char *one = NULL, *two = NULL;
        llmi_status st = {0};
        CHECK(tk && tok_chat_format(tk, cJSON_IsString(js) ? js->valuestring : NULL,
                                    cJSON_GetObjectItem(r, "user1")->valuestring, &one, &st) == 0);
        CHECK(tk && tok_chat_next_turn(tk, cJSON_GetObjectItem(r, "user2")->valuestring, &two, &st) == 0);
        if (one && two) {
            const char *answer = cJSON_GetObjectItem(r, "answer")->valuestring;
            const size_t gcap = strlen(one) + strlen(answer) + strlen(two) + 1;
            char *got = malloc(gcap);
            snprintf(got, gcap, "%s%s%s", one, answer, two);
            const char *want = cJSON_GetObjectItem(r, "out")->valuestring;
            CHECK_MSG(!strcmp(got, want), "%s: got\n%s\nwant\n%s", cJSON_GetObjectItem(r, "name")->valuestring, got, want);
            free(got);
        }
        free(one);
        free(two);
        tok_free(tk);
        cJSON_Delete(r);
        cases++;
    }
    free(txt);
    CHECK(cases >= 10);
    tokenizer *tk = chat_tok("", "<s>", "</s>");
    char *out = NULL;
    llmi_status st = {0};
    CHECK(tk && tok_chat_next_turn(tk, "hi", &out, &st) == LLMI_E_USAGE && strstr(st.msg, "--turns") && !out);
    tok_free(tk);
    /* Mistral v3-Tekken moves the system message to the latest user turn: a conversation that
     * grows turn by turn (-cnv) with one is refused, without one it is built */
    tk = chat_tok("{{- bos_token }}{{- \"[AVAILABLE_TOOLS][\" }}{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
                  "<s>", "</s>");
    tok_chat_pieces pc;
    llmi_status st2 = {0};
    CHECK(tk && tok_chat_pieces_make(tk, "Be terse.", &pc, &st2) == LLMI_E_USAGE &&
          strstr(st2.msg, "latest user message"));
    CHECK(tk && tok_chat_pieces_make(tk, NULL, &pc, &st2) == 0);
    if (tk) tok_chat_pieces_free(&pc);
    tok_free(tk);
}

/* A --prompts line's "messages": tok_chat_messages(system, user, assistant, ..., user) is
 * jinja2's rendering of the same messages with the generation prompt, for every template
 * (testdata/bench/chat-messages.jsonl, scripts/make-chat-turn-refs.py): assistant messages
 * in the history written as each template writes them (trimmed, stripped, with a leading
 * space, a reasoning block dropped), contents with spaces, newlines, quotes and UTF-8. */
TEST(tok_chat_messages_jinja) {
    size_t n;
    char p[1024];
    snprintf(p, sizeof p, "%s/bench/chat-messages.jsonl", testdata());
    char *txt = slurp(p, &n);
    CHECK(txt != NULL);
    if (!txt) return;
    int cases = 0, with_answers = 0;
    cJSON *r;
    for (char *cur = txt; (r = next_json_line(&cur)) != NULL;) {
        const cJSON *msgs = cJSON_GetObjectItem(r, "messages"), *m;
        const char *system = NULL, *turns[16];
        int nt = 0;
        cJSON_ArrayForEach(m, msgs) {
            const char *role = cJSON_GetObjectItem(m, "role")->valuestring, *c = cJSON_GetObjectItem(m, "content")->valuestring;
            if (!strcmp(role, "system")) system = c;
            else if (nt < 16) turns[nt++] = c;
        }
        tokenizer *tk = chat_tok_of(r);
        char *got = NULL;
        llmi_status st = {0};
        CHECK_MSG(tk && tok_chat_messages(tk, system, turns, nt, &got, &st) == 0, "%s: %s",
                  cJSON_GetObjectItem(r, "name")->valuestring, st.msg);
        const char *want = cJSON_GetObjectItem(r, "out")->valuestring;
        if (got) CHECK_MSG(!strcmp(got, want), "%s (%d messages): got\n%s\nwant\n%s", cJSON_GetObjectItem(r, "name")->valuestring,
                           cJSON_GetArraySize(msgs), got, want);
        with_answers += nt > 1;
        free(got);
        tok_free(tk);
        cJSON_Delete(r);
        cases++;
    }
    free(txt);
    printf("  %d conversations (%d with assistant messages) as jinja2 renders them\n", cases, with_answers);
    CHECK(cases >= 20 && with_answers >= 10);
    /* an even number of turns (ending with an answer) is refused */
    tokenizer *tk = chat_tok("<|im_start|>", "", "");
    const char *two[2] = {"hi", "hello"};
    char *out = NULL;
    llmi_status st = {0};
    CHECK(tk && tok_chat_messages(tk, NULL, two, 2, &out, &st) == LLMI_E_USAGE && !out && strstr(st.msg, "messages"));
    tok_free(tk);
}

/* Added tokens with lstrip / rstrip / single_word / normalized flags and overlapping contents
 * (Qwen2 vocab + NFC normalizer), against HF. */
TEST(tok_ref_added_flags) { trimmed(t_, "added-flags", TOK_PRE_QWEN2); }

/* ------------------------------------------------------------------ untrusted vocabularies */

/* Whether a byte-level vocabulary has the symbol of byte b: GPT-2's bytes_to_unicode keeps
 * the printable bytes as themselves and maps the others to U+0100 onwards, in order. */
static bool bytelevel_has_symbol(const tok_spec *s, uint8_t b) {
    int cp = -1, n = 0;
    for (int x = 0; x < 256 && cp < 0; x++) {
        bool keep = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
        if (x == b) cp = keep ? x : 256 + n;
        if (!keep) n++;
    }
    char u[4];
    uint32_t ul = (uint32_t)utf8proc_encode_char(cp, (utf8proc_uint8_t *)u);
    for (int i = 0; i < s->n_tokens; i++)
        if (s->token_lens[i] == ul && !memcmp(s->tokens[i], u, ul)) return true;
    return false;
}

/* Random, often malformed tok_specs: creation either fails with a message or gives a
 * tokenizer that encodes arbitrary bytes and decodes arbitrary ids without tripping ASan. */
TEST(tok_fuzz_specs) {
    uint64_t rng = test_seed() * 2654435761u + 7;
    int created = 0, round_trips = 0;
    for (int it = 0; it < 300; it++) {
        int n = 1 + (int)(rng_next(&rng) % 300);
        char **toks = calloc((size_t)n, sizeof *toks);
        uint32_t *lens = calloc((size_t)n, sizeof *lens);
        float *scores = calloc((size_t)n, sizeof *scores);
        int32_t *types = calloc((size_t)n, sizeof *types);
        for (int i = 0; i < n; i++) {
            uint64_t r = rng_next(&rng);
            int len = (int)(r % 9);
            toks[i] = malloc(16);
            if (r % 7 == 0) len = snprintf(toks[i], 16, "<0x%02X>", (unsigned)(r >> 8) & 0xFF);
            else if (r % 11 == 0) len = snprintf(toks[i], 16, "%s", i < 256 ? "\xC4\xA0" : "<s>");
            else for (int j = 0; j < len; j++) toks[i][j] = (char)(rng_next(&rng) % 4 ? 'a' + rng_next(&rng) % 6 : rng_next(&rng));
            lens[i] = (uint32_t)len;
            scores[i] = (float)(int)(rng_next(&rng) % 100) - 50.0f;
            types[i] = (int32_t)(rng_next(&rng) % 8);
        }
        int nm = (int)(rng_next(&rng) % 40);
        char **merges = calloc((size_t)nm + 1, sizeof *merges);
        uint32_t *mlens = calloc((size_t)nm + 1, sizeof *mlens);
        /* Half the specs get merges that are valid by construction (a token cut in two
         * where both halves are tokens), so byte-level specs are accepted often enough for
         * the round trip below to run; the others keep random pairs. */
        bool valid_merges = rng_next(&rng) % 2;
        for (int m = 0; m < nm; m++) {
            int a = (int)(rng_next(&rng) % (uint64_t)n), b = (int)(rng_next(&rng) % (uint64_t)n);
            for (int tries = 0; valid_merges && tries < 50; tries++) {
                int c = (int)(rng_next(&rng) % (uint64_t)n);
                if (lens[c] < 2) continue;
                uint32_t cut = 1 + (uint32_t)(rng_next(&rng) % (lens[c] - 1));
                int x = -1, y = -1;
                for (int i = 0; i < n; i++) {
                    if (lens[i] == cut && !memcmp(toks[i], toks[c], cut)) x = i;
                    if (lens[i] == lens[c] - cut && !memcmp(toks[i], toks[c] + cut, lens[c] - cut)) y = i;
                }
                if (x >= 0 && y >= 0) {
                    a = x;
                    b = y;
                    break;
                }
            }
            merges[m] = malloc(40);
            memcpy(merges[m], toks[a], lens[a]);
            merges[m][lens[a]] = ' ';
            memcpy(merges[m] + lens[a] + 1, toks[b], lens[b]);
            mlens[m] = lens[a] + 1 + lens[b];
        }
        tok_spec s = {.model = (tok_model_kind)(rng_next(&rng) % 2), .pre = (tok_pre_kind)(rng_next(&rng) % TOK_PRE_KINDS),
                      .n_tokens = n, .tokens = (const char *const *)toks, .token_lens = lens,
                      .scores = rng_next(&rng) % 4 ? scores : NULL, .token_types = types, .n_merges = nm,
                      .merges = rng_next(&rng) % 3 ? (const char *const *)merges : NULL, .merge_lens = mlens,
                      .bos_id = (int)(rng_next(&rng) % 400) - 50, .eos_id = (int)(rng_next(&rng) % 400) - 50,
                      .unk_id = (int)(rng_next(&rng) % 400) - 50, .pad_id = -1, .add_bos = true,
                      .chat_template = rng_next(&rng) % 2 ? "<|im_start|>" : "[INST] <<SYS>>"};
        tokenizer *tk = NULL;
        llmi_status st = {0};
        int rc = tok_create(&s, &tk, &st);
        CHECK((rc == 0) == (tk != NULL));
        if (rc) CHECK(st.msg[0] != 0);
        if (tk) {
            created++;
            char text[256];
            size_t tl = (size_t)(rng_next(&rng) % sizeof text);
            for (size_t i = 0; i < tl; i++) text[i] = (char)(rng_next(&rng) % 3 ? 'a' + rng_next(&rng) % 6 : rng_next(&rng));
            int32_t *ids;
            int ni;
            for (int ps = 0; ps < 2; ps++) {
                CHECK(tok_encode(tk, text, tl, true, ps, &ids, &ni, &st) == 0);
                for (int i = 0; i < ni; i++) CHECK(ids[i] >= 0 && ids[i] < n);
                char *d;
                size_t dl;
                CHECK(tok_decode(tk, ids, ni, ps, &d, &dl, &st) == 0);
                free(d);
                free(ids);
            }
            if (s.model == TOK_MODEL_BYTELEVEL_BPE) {
                /* Byte-level: the raw pieces of the ids spell the input back, for text made of
                 * bytes whose symbol (GPT-2's bytes_to_unicode) the vocabulary has. */
                char kept[256], back[4096];
                size_t kl = 0, bl = 0;
                for (size_t i = 0; i < tl; i++)
                    if (bytelevel_has_symbol(&s, (uint8_t)text[i])) kept[kl++] = text[i];
                CHECK(tok_encode(tk, kept, kl, false, false, &ids, &ni, &st) == 0);
                for (int i = 0; i < ni && bl < 3000; i++) bl += (size_t)tok_piece(tk, ids[i], back + bl, sizeof back - bl);
                CHECK_MSG(bl == kl && memcmp(back, kept, kl) == 0, "spec %d: %zu bytes encode to pieces of %zu bytes",
                          it, kl, bl);
                round_trips += kl > 0;
                free(ids);
            }
            int32_t rid[32];
            for (int i = 0; i < 32; i++) rid[i] = (int32_t)(rng_next(&rng) % (uint64_t)(n + 10)) - 5;
            char *d;
            size_t dl, sl;
            CHECK(tok_decode(tk, rid, 32, false, &d, &dl, &st) == 0);
            char *sd = stream_decode(tk, rid, 32, false, &sl);
            CHECK(sl == dl && memcmp(sd, d, dl) == 0);
            free(sd);
            free(d);
            char *chat = NULL;
            if (tok_chat_format(tk, "sys", "user", &chat, &st) == 0) free(chat);
            tok_free(tk);
        }
        for (int i = 0; i < n; i++) free(toks[i]);
        for (int m = 0; m < nm; m++) free(merges[m]);
        free(toks); free(lens); free(scores); free(types); free(merges); free(mlens);
    }
    fprintf(stderr, "  %d of 300 random specs accepted, %d byte-level round trips\n", created, round_trips);
    CHECK(created > 0);
    CHECK(round_trips > 0);
}

/* Arbitrary bytes (invalid UTF-8 included) through a byte-level vocabulary that has all 256
 * byte symbols (SmolLM2's lacks some, which HF then drops): the raw pieces of the ids spell
 * the input back exactly. */
TEST(tok_bytes_roundtrip) {
    char d[1024];
    llmi_status st = {0};
    tokenizer *tk = load_hf_zst(path_in(d, sizeof d, "gpt2-trim"), &st);
    CHECK_MSG(tk != NULL, "%s", st.msg);
    if (!tk) return;
    uint64_t rng = test_seed() ^ 0xABCDEFull;
    int bad = 0;
    for (int it = 0; it < 200; it++) {
        char text[512], back[8192];
        size_t tl = (size_t)(rng_next(&rng) % sizeof text), bl = 0;
        for (size_t i = 0; i < tl; i++) text[i] = (char)rng_next(&rng);
        int32_t *ids;
        int ni;
        CHECK(tok_encode(tk, text, tl, false, false, &ids, &ni, &st) == 0);
        for (int i = 0; i < ni; i++) bl += (size_t)tok_piece(tk, ids[i], back + bl, sizeof back - bl);
        if (bl != tl || memcmp(back, text, tl) != 0) bad++;
        free(ids);
    }
    CHECK(bad == 0);
    tok_free(tk);
}

/* tokenizer_config.json / generation_config.json: named chat templates, add_bos_token,
 * bos/eos as {"content": ...} objects, an eos_token_id list. */
TEST(tok_hf_configs) {
    char d[1024], tmp[] = "/tmp/llmi-tokcfg-XXXXXX", p[1100];
    size_t n;
    char *js = slurp(path_in(d, sizeof d, "smollm2/tokenizer.json"), &n);
    CHECK(js != NULL && mkdtemp(tmp) != NULL);
    if (!js) return;
    snprintf(p, sizeof p, "%s/tokenizer.json", tmp);
    FILE *f = fopen(p, "wb");
    fwrite(js, 1, n, f);
    fclose(f);
    free(js);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", tmp);
    f = fopen(p, "w");
    fputs("{\"add_bos_token\": true, \"bos_token\": {\"content\": \"<|endoftext|>\", \"special\": true},"
          " \"eos_token\": \"<|im_end|>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"},"
          " {\"name\": \"default\", \"template\": \"{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}\"}]}", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/generation_config.json", tmp);
    f = fopen(p, "w");
    fputs("{\"eos_token_id\": [2, 5]}", f);
    fclose(f);
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load_hf(tmp, &tk, &st) == 0, "%s", st.msg);
    if (tk) {
        CHECK(tok_add_bos(tk) && tok_bos(tk) == 0 && tok_eos(tk) == 2);
        CHECK(tok_is_eog(tk, 2) && tok_is_eog(tk, 5) && !tok_is_eog(tk, 100));
        CHECK(strcmp(tok_chat_template_name(tk), "mistral") == 0);
        int32_t *ids;
        int ni;
        CHECK(tok_encode(tk, "hi", 2, true, true, &ids, &ni, &st) == 0);
        CHECK(ni >= 2 && ids[0] == 0);
        free(ids);
        char *out = NULL;
        CHECK(tok_chat_format(tk, NULL, "hi", &out, &st) == 0);
        CHECK(out && strcmp(out, "<|endoftext|>[INST] hi [/INST]") == 0);
        free(out);
        tok_free(tk);
    }
    const char *names[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, names[i]);
        unlink(p);
    }
    rmdir(tmp);
}

/* ------------------------------------------------------------------ end of generation */

/* A SentencePiece vocabulary of the given texts (types: 1 normal, 3 control), eos and
 * the ids a GGUF file would name per end-of-generation role (or NULL). */
static tokenizer *eog_tok(const char *const *texts, const int32_t *types, int n, int eos, const int32_t *named) {
    uint32_t lens[32];
    float scores[32];
    for (int i = 0; i < n; i++) {
        lens[i] = (uint32_t)strlen(texts[i]);
        scores[i] = -(float)i;
    }
    tok_spec s = {.model = TOK_MODEL_SPM_BPE, .pre = TOK_PRE_NONE, .n_tokens = n, .tokens = texts, .token_lens = lens,
                  .scores = scores, .token_types = types, .bos_id = -1, .eos_id = eos, .unk_id = 0, .pad_id = -1,
                  .eog_ids = named};
    tokenizer *t = NULL;
    llmi_status st = {0};
    if (tok_create(&s, &t, &st)) fprintf(stderr, "  tok_create: %s\n", st.msg);
    return t;
}

/* The ids tok_is_eog says end generation must be exactly want (ascending). */
static bool eog_is(const tokenizer *t, const int *want, int n_want) {
    int k = 0;
    for (int id = 0; id < tok_n_vocab(t); id++) {
        if (!tok_is_eog(t, id)) continue;
        if (k >= n_want || want[k] != id) {
            fprintf(stderr, "  unexpected end-of-generation id %d\n", id);
            return false;
        }
        k++;
    }
    if (k != n_want) fprintf(stderr, "  %d of %d end-of-generation ids found\n", k, n_want);
    return k == n_want;
}

/* llama.cpp's own answer (testdata/tokenizer/eog/eog.json, written by
 * scripts/ref-llamacpp-eog.py with llama.cpp 0c1e570's llama_vocab_is_eog): every vocabulary
 * there, loaded as the model loader loads a GGUF, ends generation at exactly those ids.
 * The cases cover listed texts of any token type, FIM spellings, ids named by keys, the
 * <|end|> and </s> exceptions, SentencePiece defaults, and SmolLM2 itself. */
TEST(tok_eog_vs_llamacpp) {
    char p[1024];
    size_t n;
    snprintf(p, sizeof p, "%s/tokenizer/eog/eog.json", testdata());
    char *txt = slurp(p, &n);
    CHECK(txt != NULL);
    if (!txt) return;
    cJSON *ref = cJSON_Parse(txt);
    free(txt);
    CHECK(cJSON_GetArraySize(ref) >= 8);
    bool model_missing = false;
    char model_path[1024] = "";
    const cJSON *e;
    cJSON_ArrayForEach(e, ref) {
        const char *name = e->string;
        if (!strcmp(name, "SmolLM2-135M-Instruct.Q4_1.gguf")) {
            const char *m = getenv("MODEL");
            snprintf(p, sizeof p, "%s", m ? m : "/root/.cache/llmi/SmolLM2-135M-Instruct.Q4_1.gguf");
            if (access(p, R_OK) != 0) {
                model_missing = true;
                snprintf(model_path, sizeof model_path, "%s", p);
                continue;
            }
        } else if (!strcmp(name, "ggml-vocab-llama-spm.gguf")) {
            path_in(p, sizeof p, "llama-spm/ggml-vocab-llama-spm.gguf");
        } else {
            snprintf(p, sizeof p, "%s/tokenizer/eog/%s", testdata(), name);
        }
        int want[64], n_want = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, e) if (n_want < 64) want[n_want++] = x->valueint;
        llmi_status st = {0};
        tokenizer *tk = load_gguf(p, &st);
        CHECK_MSG(tk != NULL, "%s: %s", name, st.msg);
        if (tk) CHECK_MSG(eog_is(tk, want, n_want), "%s", name);
        tok_free(tk);
    }
    cJSON_Delete(ref);
    /* The other vocabularies ran; the model's case did not, so the test did not pass. */
    if (model_missing) SKIP("%s not present (scripts/fetch-model.sh): its case not run", model_path);
}

/* Where a vocabulary spells a FIM role twice, llama.cpp takes whichever its hash map
 * yields first; llmi takes the lowest id, whatever the order of the texts. */
TEST(tok_eog_fim_lowest_id) {
    const char *texts[] = {"<unk>", "<s>", "</s>", "<|repo_name|>", "<reponame>", "<fim_pad>", "<|fim_pad|>",
                           "\xE2\x96\x81"};
    const int32_t types[] = {2, 3, 3, 3, 3, 3, 3, 1};
    tokenizer *t = eog_tok(texts, types, 8, 2, NULL);
    const int want[] = {2, 3, 5};
    CHECK(t && eog_is(t, want, 3));
    tok_free(t);
}

/* SmolLM2's tokenizer.json ends generation where llama.cpp ends its GGUF's: {0, 2, 4}
 * (<|endoftext|>, <|im_end|> = eos, <reponame> = llama.cpp's FIM-repo token). */
TEST(tok_eog_smollm2_hf) {
    const int want[] = {0, 2, 4};
    char d[1024];
    llmi_status st = {0};
    tokenizer *tk = NULL;
    CHECK_MSG(tok_load_hf(path_in(d, sizeof d, "smollm2"), &tk, &st) == 0, "%s", st.msg);
    if (tk) CHECK(eog_is(tk, want, 3));
    tok_free(tk);
}
