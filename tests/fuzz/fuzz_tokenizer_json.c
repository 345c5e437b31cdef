/* fuzz_tokenizer_json.c — tokenizer.json and tokenizer_config.json (one input split at
 * "\n#--\n", tokenizer.json first) through tok_load_hf, as a model directory's tokenizer
 * is read; an accepted tokenizer then encodes, decodes and chat-formats a fixed text.
 * Seeds: real tokenizers (GPT-2, Llama-3, Qwen2, SmolLM2, Llama SentencePiece) cut to
 * 300 ids by scripts/make-fuzz-seeds.py, and testdata/hf's byte-level test tokenizer. */
#include <stdbool.h>
#include <stdlib.h>
#include "common.h"
#include "tok/tokenizer.h"

static void exercise(const tokenizer *t) {
    static const char text[] = "Hello world! <|endoftext|> 12345 \xc3\xa9l\xc3\xa0n \xe6\x9d\xb1\xe4\xba\xac  \n\t<s>";
    llmi_status st = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(t, text, sizeof text - 1, true, true, &ids, &n, &st) == 0) {
        char *out = NULL;
        size_t len = 0;
        if (tok_decode(t, ids, n, false, &out, &len, &st) == 0) free(out);
        free(ids);
    }
    char *chat = NULL;
    llmi_status cst = {0};
    if (tok_chat_format(t, "be brief", "hi", &chat, &cst) == 0) free(chat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *tj, *tc;
    size_t ntj, ntc;
    fuzz_split(data, size, &tj, &ntj, &tc, &ntc);
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "tokenizer.json", tj, ntj, path, sizeof path) == 0 &&
        (!tc || fuzz_write(dir, "tokenizer_config.json", tc, ntc, path, sizeof path) == 0)) {
        tokenizer *t = NULL;
        llmi_status st = {0};
        int rc = tok_load_hf(dir, &t, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) {
            exercise(t);
            tok_free(t);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
