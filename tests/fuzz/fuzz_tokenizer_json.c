/* fuzz_tokenizer_json.c — tokenizer.json and tokenizer_config.json (one input split at
 * "\n#--\n", tokenizer.json first) through tok_load_hf, as a model directory's tokenizer
 * is read; an accepted tokenizer then encodes, decodes and chat-formats a fixed text.
 * Seeds: real tokenizers (GPT-2, Llama-3, Qwen2, SmolLM2, Llama SentencePiece) cut to
 * 300 ids by scripts/make-fuzz-seeds.py, and testdata/hf's byte-level test tokenizer. */
#include "common.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write_pair(dir, "tokenizer.json", "tokenizer_config.json", data, size) == 0) {
        tokenizer *t = NULL;
        llmi_status st = {0};
        int rc = tok_load_hf(dir, &t, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) {
            fuzz_tok_exercise(t);
            tok_free(t);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
