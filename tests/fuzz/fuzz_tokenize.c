/* fuzz_tokenize.c — encode and decode arbitrary bytes with real vocabularies: SmolLM2's
 * byte-level BPE (the default model's, testdata/tokenizer/smollm2) and Llama's
 * SentencePiece BPE (testdata/tokenizer/llama-spm), loaded once per process.
 *
 * The first input byte picks the vocabulary and the flags (add_special, parse_special,
 * skip_special); the rest is the text.  Beyond "no crash" it checks what tokenizer.h
 * promises: every id is in the vocabulary, the streaming detokenizer's pushes plus flush
 * equal tok_decode, and byte-level BPE gives valid UTF-8 text back unchanged when every
 * byte of it has a token (SmolLM2 has none for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xf1,
 * 0xf2, ...; HF tokenizers drops those bytes too).  The text read as little-endian int32
 * ids (any value) is decoded too. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "tok/tokenizer.h"

/* Loaded by LLVMFuzzerInitialize, read-only afterwards (harness state, not llmi's). */
static tokenizer *vocab[2];
static bool byte_has_token[256];   /* of vocab[0]: some token's piece is exactly this byte */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const char *const dirs[2] = {"tokenizer/smollm2", "tokenizer/llama-spm"};
    for (int i = 0; i < 2; i++) {
        char dir[1024];
        llmi_status st = {0};
        snprintf(dir, sizeof dir, "%s/%s", fuzz_testdata(), dirs[i]);
        if (tok_load_hf(dir, &vocab[i], &st)) {
            fprintf(stderr, "fuzz_tokenize: %s (run from the repository root or set LLMI_TESTDATA)\n", st.msg);
            exit(1);
        }
    }
    for (int id = 0; id < tok_n_vocab(vocab[0]); id++) {
        char p[8];
        if (tok_piece(vocab[0], id, p, sizeof p) == 1) byte_has_token[(uint8_t)p[0]] = true;
    }
    return 0;
}

static bool utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        size_t need = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3
                    : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (!need || i + need > n) return false;
        for (size_t k = 1; k < need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        if ((b == 0xE0 && s[i + 1] < 0xA0) || (b == 0xED && s[i + 1] > 0x9F) || (b == 0xF0 && s[i + 1] < 0x90) ||
            (b == 0xF4 && s[i + 1] > 0x8F))
            return false;
        i += need;
    }
    return true;
}

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "fuzz_tokenize: %s\n", #c); abort(); } } while (0)

/* tok_decode and the streaming detokenizer must agree byte for byte. */
static void decode_both(const tokenizer *t, const int32_t *ids, int n, bool skip, char **out, size_t *len) {
    llmi_status st = {0};
    REQUIRE(tok_decode(t, ids, n, skip, out, len, &st) == 0);
    size_t cap = tok_stream_cap(t), got = 0;
    char *buf = malloc(*len + cap + 16), *piece = malloc(cap);
    REQUIRE(buf && piece);
    tok_stream s;
    tok_stream_init(&s, t, skip);
    for (int i = 0; i < n; i++) {
        int k = tok_stream_push(&s, ids[i], piece, cap);
        REQUIRE(k >= 0 && got + (size_t)k <= *len);
        memcpy(buf + got, piece, (size_t)k);
        got += (size_t)k;
        char p[512];
        int pn = tok_piece(t, ids[i], p, sizeof p);
        REQUIRE(pn >= 0 && (size_t)pn <= sizeof p);
    }
    int k = tok_stream_flush(&s, piece, cap);
    REQUIRE(k >= 0 && got + (size_t)k <= *len);
    memcpy(buf + got, piece, (size_t)k);
    got += (size_t)k;
    REQUIRE(got == *len && memcmp(buf, *out, got) == 0);
    free(buf);
    free(piece);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const tokenizer *t = vocab[data[0] & 1];
    bool add_special = data[0] & 2, parse_special = data[0] & 4, skip = data[0] & 8;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;

    int32_t *ids = NULL;
    int n_ids = 0;
    llmi_status st = {0};
    int rc = tok_encode(t, text, n, add_special, parse_special, &ids, &n_ids, &st);
    fuzz_check_status(rc, &st);
    if (rc == 0) {
        for (int i = 0; i < n_ids; i++) REQUIRE(ids[i] >= 0 && ids[i] < tok_n_vocab(t));
        char *out = NULL;
        size_t len = 0;
        decode_both(t, ids, n_ids, skip, &out, &len);
        bool covered = true;
        for (size_t i = 0; i < n && covered; i++) covered = byte_has_token[data[1 + i]];
        if (t == vocab[0] && !add_special && !parse_special && covered && utf8_valid(data + 1, n))
            REQUIRE(len == n && memcmp(out, text, n) == 0);
        free(out);
        free(ids);
    }

    int n_raw = (int)(n / 4);
    int32_t *raw = malloc((size_t)(n_raw ? n_raw : 1) * sizeof *raw);
    if (raw) {
        memcpy(raw, text, (size_t)n_raw * 4);
        char *out = NULL;
        size_t len = 0;
        decode_both(t, raw, n_raw, skip, &out, &len);
        free(out);
        free(raw);
    }
    return 0;
}
