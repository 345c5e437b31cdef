/* fuzz_config_json.c — a Hugging Face config.json through config_json_read, the one
 * reader behind model directories and `--dummy config.json`.  Seeds: the config.json
 * files of testdata/hf and testdata/quant. */
#include <cJSON.h>
#include "common.h"
#include "model/config_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], path[1024];
    if (fuzz_scratch(dir, sizeof dir)) return 0;
    if (fuzz_write(dir, "config.json", data, size, path, sizeof path) == 0) {
        llmi_config c;
        cJSON *root = NULL;
        llmi_status st = {0};
        int rc = config_json_read(path, "--dummy", &c, &root, &st);
        fuzz_check_status(rc, &st);
        cJSON_Delete(root);
    }
    fuzz_scratch_remove(dir);
    return 0;
}
