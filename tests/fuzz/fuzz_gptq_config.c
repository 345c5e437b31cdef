/* fuzz_gptq_config.c — a GPTQ/AWQ checkpoint: config.json (its quantization_config) and
 * model.safetensors (qweight/qzeros/scales/g_idx per linear), given as one input split at
 * "\n#--\n" (config first), loaded with model_load as `llmi -m DIR` does.  Seeds:
 * scripts/make-fuzz-seeds.py's tiny GPTQ model and testdata/quant's configs. */
#include <stdbool.h>
#include "common.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cfg, *st_bytes;
    size_t ncfg, nst;
    fuzz_split(data, size, &cfg, &ncfg, &st_bytes, &nst);
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "config.json", cfg, ncfg, path, sizeof path) == 0 &&
        (!st_bytes || fuzz_write(dir, "model.safetensors", st_bytes, nst, path, sizeof path) == 0)) {
        llmi_model m;
        llmi_status st = {0};
        llmi_load_opts o = {.no_tokenizer = true};
        int rc = model_load(dir, &o, &m, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) model_free(&m);
    }
    fuzz_scratch_remove(dir);
    return 0;
}
