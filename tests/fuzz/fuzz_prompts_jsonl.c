/* fuzz_prompts_jsonl.c — the --prompts file of `llmi generate` (plain lines and JSON
 * request objects) through prompts_parse, with defaults that carry --stop strings as
 * the command line's would.  The binary refuses text with NUL bytes before parsing
 * (read_file_text), so such inputs are left out.  Seeds: testdata/llamacpp/prompts.jsonl
 * and hand-written lines with every field. */
#include <stdlib.h>
#include <string.h>
#include "cli/prompts.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (memchr(data, 0, size)) return -1;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    llmi_request_params d = request_params_defaults();
    d.stop[0] = "\n\n";
    d.stop[1] = "###";
    d.n_stop = 2;
    prompt_entry *e = NULL;
    int n = 0;
    llmi_status st = {0};
    int rc = prompts_parse(text, "prompts.jsonl", &d, &e, &n, &st);
    fuzz_check_status(rc, &st);
    if (rc == 0) {
        if (n < 1) abort();
        for (int i = 0; i < n; i++)
            if (!e[i].prompt || e[i].params.n_stop > LLMI_MAX_STOP ||
                (e[i].prompt_ids != NULL) != (e[i].n_prompt_ids > 0) ||
                (e[i].params.prompt_logprobs && (e[i].params.prompt_top < 0 || e[i].params.prompt_top > LLMI_MAX_LOGPROBS)))
                abort();
        prompts_free(e, n);
    }
    free(text);
    return 0;
}
