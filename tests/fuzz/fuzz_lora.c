/* fuzz_lora.c — a --lora adapter (model/lora.c), in either form: an input that starts with
 * "GGUF" is a GGUF adapter file; any other is a PEFT directory, adapter_config.json, then
 * "\n#--\n", then adapter_model.safetensors.  Merged into the tiny f32 HF llama of
 * testdata/hf/llama-gqa-rope3 (loaded afresh per input: a merge changes the weights) as
 * `llmi -m DIR --lora ADAPTER` does.  Beyond one clear line on failure: a merge that
 * succeeds leaves every weight of the model finite.  Seeds: the adapters of testdata/lora
 * (and testdata/lora/gguf) made for that model, and broken ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "core/dtype.h"
#include "model/lora.h"
#include "model/model.h"

static bool tensor_finite(const llmi_tensor *t) {
    if (t->dtype != LLMI_F32) return true;   /* the test model is f32 throughout */
    const float *x = t->data;
    for (int64_t i = 0; i < t->rows * t->cols; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], adapter[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    const bool gguf = size >= 4 && !memcmp(data, "GGUF", 4);
    snprintf(adapter, sizeof adapter, "%s", dir);
    if (gguf ? fuzz_write(dir, "adapter.gguf", data, size, adapter, sizeof adapter)
             : fuzz_write_pair(dir, "adapter_config.json", "adapter_model.safetensors", data, size)) {
        fuzz_scratch_remove(dir);
        return 0;
    }
    llmi_model m;
    llmi_status st = {0};
    fuzz_load_test_model("llama-gqa-rope3", &m);
    int rc = model_merge_lora(&m, adapter, 1.0f, &st);
    fuzz_check_status(rc, &st);
    for (int l = 0; rc == 0 && l < m.cfg.n_layers; l++) {
        const llmi_layer *L = &m.layers[l];
        const llmi_tensor *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int k = 0; k < 7; k++)
            if (!tensor_finite(w[k])) abort();
    }
    model_free(&m);
    fuzz_scratch_remove(dir);
    return 0;
}
