/* fuzz_stats.c — a `quantize --load-stats FILE` statistics file (one zstd stream:
 * "LLMIQST1", the shapes, per layer and input set mean|x| and the Gram matrix's upper
 * triangle) through quant_stats_load for a small fixed configuration (2 layers, hidden 8,
 * 2 heads of 4, ffn 16: input dims 8/8/8/16).  Seeds: scripts/make-fuzz-seeds.py writes
 * one file of those shapes and one of another model's. */
#include <string.h>
#include "common.h"
#include "quant/calib_stats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "stats.zst", data, size, path, sizeof path) == 0) {
        llmi_config c;
        memset(&c, 0, sizeof c);
        c.n_layers = 2, c.dim = 8, c.n_heads = 2, c.head_dim = 4, c.ffn_dim = 16;
        quant_stats s;
        llmi_status st = {0};
        int rc = quant_stats_load(path, &c, &s, &st);
        fuzz_check_status(rc, &st);
        if (rc == 0) quant_stats_free(&s);
    }
    fuzz_scratch_remove(dir);
    return 0;
}
