/* fuzz_control_vector.c — a --control-vector file (model/control_vector.c): the input is the
 * GGUF file, its last byte also picks the layer range (START = bits 0-2, END = bits 3-5, 0
 * the defaults, as --control-vector-layer-range).  Added to the tiny Gemma 3 of
 * testdata/hf/gemma3-swa (6 layers of 64, loaded afresh per input) as `llmi -m DIR
 * --control-vector FILE` does.  Beyond one clear line on failure: a file that is taken gives
 * layer 0 and every layer outside the range no vector, and finite values to the rest.
 * Seeds: random vectors of that shape, llama.cpp's SmolLM2 vectors (another size), and
 * broken ones. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "model/control_vector.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "cvec.gguf", data, size, path, sizeof path)) {
        fuzz_scratch_remove(dir);
        return 0;
    }
    llmi_model m;
    llmi_status st = {0};
    fuzz_load_test_model("gemma3-swa", &m);
    const int pick = size ? data[size - 1] : 0, start = pick & 7, end = (pick >> 3) & 7;
    const char *paths[1] = {path};
    const float scale[1] = {1.0f};
    int rc = model_add_control_vectors(&m, paths, scale, 1, start, end, &st);
    fuzz_check_status(rc, &st);
    const int lo_l = start > 0 ? start : 1, hi_l = end > 0 ? end : m.cfg.n_layers;
    for (int l = 0; l < m.cfg.n_layers; l++) {
        const float *v = m.layers[l].control;
        if (rc && v) abort();   /* refused: nothing changed */
        if (v && (l == 0 || l < lo_l || l > hi_l)) abort();
        for (int j = 0; v && j < m.cfg.dim; j++)
            if (!isfinite(v[j])) abort();
    }
    model_free(&m);
    fuzz_scratch_remove(dir);
    return 0;
}
