/* fuzz_grammar.c — GBNF text through grammar_parse, as --grammar and a --prompts line's
 * "grammar" reach it, and when it parses, a walk of up to 48 tokens over SmolLM2's
 * vocabulary (testdata/tokenizer/smollm2, loaded once per process).
 *
 * The input is the grammar, optionally followed by "\n#--\n" and a text: the walk takes the
 * text's tokens while the mask allows them, and otherwise the lowest allowed id.  Beyond
 * "no crash" it checks what grammar.h promises: the count returned is the number of ids
 * set, accepting an allowed token never fails, and end-of-generation is allowed exactly
 * when the state says the text is complete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "engine/grammar.h"
#include "tok/tokenizer.h"

/* Loaded by LLVMFuzzerInitialize, read-only afterwards (harness state, not llmi's). */
static tokenizer *vocab;
static grammar_vocab *trie;
static uint8_t *mask;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char dir[1024];
    llmi_status st = {0};
    snprintf(dir, sizeof dir, "%s/tokenizer/smollm2", fuzz_testdata());
    if (tok_load_hf(dir, &vocab, &st) || grammar_vocab_build(vocab, &trie, &st) ||
        !(mask = malloc((size_t)tok_n_vocab(vocab)))) {
        fprintf(stderr, "fuzz_grammar: %s (run from the repository root or set LLMI_TESTDATA)\n", st.msg);
        exit(1);
    }
    return 0;
}

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "fuzz_grammar: %s\n", #c); abort(); } } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data, *walk = NULL;
    size_t glen = size, wlen = 0;
    for (size_t i = 0; i + 5 <= size; i++)
        if (memcmp(data + i, "\n#--\n", 5) == 0) {
            glen = i + 1;
            walk = text + i + 5;
            wlen = size - i - 5;
            break;
        }
    grammar *g = NULL;
    llmi_status st = {0};
    int rc = grammar_parse(text, glen, "fuzz.gbnf", &g, &st);
    fuzz_check_status(rc, &st);
    if (rc) return 0;
    grammar_state *gs = NULL;
    int32_t *ids = NULL;
    int n_ids = 0;
    if (grammar_state_create(g, trie, &gs, &st) == 0) {
        char *w = walk ? malloc(wlen + 1) : NULL;
        if (w) {
            memcpy(w, walk, wlen);
            w[wlen] = '\0';
            if (tok_encode(vocab, w, strlen(w), false, false, &ids, &n_ids, &st)) n_ids = 0;
            free(w);
        }
        int V = tok_n_vocab(vocab), eos = tok_eos(vocab);
        for (int step = 0; step < 48; step++) {
            llmi_status ms = {0};
            int n = grammar_state_mask(gs, true, mask, &ms);
            if (n < 0) {   /* too ambiguous: one clear line, and the state stays refused */
                fuzz_check_status(ms.code ? ms.code : 1, &ms);
                break;
            }
            int count = 0, first = -1;
            for (int t = 0; t < V; t++) {
                count += mask[t];
                if (mask[t] && first < 0 && !tok_is_eog(vocab, t)) first = t;
            }
            REQUIRE(count == n);
            REQUIRE(mask[eos] == grammar_state_complete(gs));
            int32_t pick = step < n_ids && mask[ids[step]] && !tok_is_eog(vocab, ids[step]) ? ids[step] : first;
            if (pick < 0) break;
            llmi_status as = {0};
            REQUIRE(grammar_state_accept(gs, pick, &as) == 0);
        }
    } else {
        fuzz_check_status(1, &st);
    }
    free(ids);
    grammar_state_free(gs);
    grammar_free(g);
    return 0;
}
