/* fuzz_gptq_config.c — a GPTQ/AWQ checkpoint: config.json (its quantization_config) and
 * model.safetensors (qweight/qzeros/scales/g_idx per linear), given as one input split at
 * "\n#--\n" (config first), loaded with model_load as `llmi -m DIR` does.  Seeds:
 * scripts/make-fuzz-seeds.py's tiny GPTQ model and testdata/quant's configs. */
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write_pair(dir, "config.json", "model.safetensors", data, size) == 0) fuzz_model_load(dir, true);
    fuzz_scratch_remove(dir);
    return 0;
}
