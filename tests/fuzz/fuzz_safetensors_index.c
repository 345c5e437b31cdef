/* fuzz_safetensors_index.c — model.safetensors.index.json of a sharded Hugging Face
 * directory (weight_map: which shard holds each tensor), loaded with model_load as
 * `llmi -m DIR` does.  The directory holds testdata/hf/mistral-sharded's config.json and
 * its two real shards (links), so the index is the only thing the fuzzer changes: shard
 * names (plain file names only: "..", "/", control bytes), tensors missing, listed twice,
 * put in the wrong shard, or in a shard the index never names. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common.h"

static const char *const linked[] = {"config.json", "model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024], src[PATH_MAX + 64], abs_src[PATH_MAX];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    int ok = 1;
    for (size_t i = 0; i < sizeof linked / sizeof *linked && ok; i++) {
        snprintf(src, sizeof src, "%s/hf/mistral-sharded/%s", fuzz_testdata(), linked[i]);
        snprintf(path, sizeof path, "%s/%s", dir, linked[i]);
        ok = realpath(src, abs_src) != NULL && symlink(abs_src, path) == 0;
    }
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors_index: testdata/hf/mistral-sharded not found (run from the repository root)\n");
        abort();
    }
    if (fuzz_write(dir, "model.safetensors.index.json", data, size, path, sizeof path) == 0)
        fuzz_model_load(dir, true);
    fuzz_scratch_remove(dir);
    return 0;
}
