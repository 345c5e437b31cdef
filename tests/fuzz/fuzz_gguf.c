/* fuzz_gguf.c — a GGUF file (header, key/values, tensor table, tensor data) through
 * model_load, as `llmi -m FILE` reads it, then through the GGUF tokenizer on its own
 * (vocabulary-only files never get that far in a model load).  Seeds: the vocabulary-only
 * GGUFs of testdata/tokenizer/eog and a tiny whole model (tests/fuzz/corpus/fuzz_gguf). */
#include <stdbool.h>
#include <stdlib.h>
#include "common.h"
#include "model/gguf.h"
#include "model/model.h"
#include "tok/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "model.gguf", data, size, path, sizeof path) == 0) {
        llmi_model m;
        llmi_status st = {0};
        int rc = model_load(path, NULL, &m, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) model_free(&m);

        gguf_file g;
        llmi_status gst = {0};
        rc = gguf_open(path, &g, &gst);
        fuzz_check_status(rc, &gst);
        if (rc == 0) {
            tokenizer *t = NULL;
            llmi_status tst = {0};
            int trc = tok_load_gguf(&g, &t, &tst);
            fuzz_check_status(trc, &tst);
            if (trc == 0) {
                static const char text[] = "Hello <|im_start|>world\xe2\x96\x81 12345 \xff!";
                int32_t *ids = NULL;
                int n = 0;
                if (tok_encode(t, text, sizeof text - 1, true, true, &ids, &n, &tst) == 0) {
                    char *out = NULL;
                    size_t len = 0;
                    if (tok_decode(t, ids, n, false, &out, &len, &tst) == 0) free(out);
                    free(ids);
                }
                tok_free(t);
            }
            gguf_close(&g);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
