/* fuzz_gguf.c — a GGUF file (header, key/values, tensor table, tensor data) through
 * model_load, as `llmi -m FILE` reads it, then through the GGUF tokenizer on its own
 * (vocabulary-only files never get that far in a model load), which then encodes and
 * decodes a fixed text.  Seeds: the vocabulary-only GGUFs of testdata/tokenizer/eog and
 * a tiny whole model (scripts/make-fuzz-seeds.py). */
#include "common.h"
#include "model/gguf.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "model.gguf", data, size, path, sizeof path) == 0) {
        fuzz_model_load(path, false);
        gguf_file g;
        llmi_status st = {0};
        int rc = gguf_open(path, &g, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) {
            tokenizer *t = NULL;
            llmi_status tst = {0};
            int trc = tok_load_gguf(&g, &t, &tst);
            fuzz_check_status(trc, &tst);
            if (trc == 0) {
                fuzz_tok_exercise(t);
                tok_free(t);
            }
            gguf_close(&g);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
