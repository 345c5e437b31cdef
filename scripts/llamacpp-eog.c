/* llamacpp-eog.c — prints, for each GGUF given, the ids llama.cpp's vocabulary treats as
 * end-of-generation (llama_vocab_is_eog), as "FILE: id id ...".  Reference-data tool for
 * scripts/ref-llamacpp-eog.py (docs/REFERENCES.md); not part of llmi.  Build against a
 * llama.cpp checkout L and its build B:
 *   cc -O1 -o eog scripts/llamacpp-eog.c -IL/include -IL/ggml/include -LB/bin -lllama -Wl,-rpath,B/bin */
#include <stdio.h>
#include "llama.h"

static void quiet(enum ggml_log_level l, const char *t, void *u) { (void)l; (void)t; (void)u; }

int main(int argc, char **argv) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    for (int a = 1; a < argc; a++) {
        struct llama_model_params mp = llama_model_default_params();
        mp.vocab_only = 1;
        struct llama_model *m = llama_model_load_from_file(argv[a], mp);
        if (!m) { printf("%s: load failed\n", argv[a]); continue; }
        const struct llama_vocab *v = llama_model_get_vocab(m);
        printf("%s:", argv[a]);
        for (int i = 0; i < llama_vocab_n_tokens(v); i++)
            if (llama_vocab_is_eog(v, i)) printf(" %d", i);
        printf("\n");
        llama_model_free(m);
    }
    return 0;
}
