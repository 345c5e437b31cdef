/* fuzz_safetensors.c — a safetensors file (header JSON, tensor table, data offsets) as
 * model.safetensors of a Hugging Face directory whose config.json is fixed (the tiny
 * llama of scripts/make-fuzz-seeds.py), loaded with model_load as `llmi -m DIR` does;
 * then the reader alone, which sees every file, including ones the model would refuse. */
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "model/safetensors.h"

/* HF_CONFIG of scripts/make-fuzz-seeds.py */
static const char config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 32,"
    " \"intermediate_size\": 32, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    " \"num_hidden_layers\": 1, \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 256,"
    " \"vocab_size\": 12, \"tie_word_embeddings\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024], cpath[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "config.json", config, strlen(config), cpath, sizeof cpath) == 0 &&
        fuzz_write(dir, "model.safetensors", data, size, path, sizeof path) == 0) {
        fuzz_model_load(dir, true);
        safetensors_file f;
        llmi_status sst = {0};
        int rc = safetensors_open(path, &f, &sst);
        fuzz_check_status(rc, &sst);
        if (rc == 0) {
            for (int i = 0; i < f.n_tensors; i++)
                if (safetensors_find(&f, f.tensors[i].name) == NULL) abort();
            safetensors_close(&f);
        }
    }
    fuzz_scratch_remove(dir);
    return 0;
}
