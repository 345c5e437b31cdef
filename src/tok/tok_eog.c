/* tok_eog.c — owns which tokens end generation (TOKF_EOG), for GGUF and Hugging Face
 * tokenizers alike: llama.cpp's rule (llama_vocab::impl::load, src/llama-vocab.cpp at
 * commit 0c1e570, the llama.cpp docs/REFERENCES.md names), which goes mostly by token text
 * because converters rarely store more than eos:
 *   - the FIM pad / repo / file-separator tokens: the ids the file names, else the token
 *     with one of their known texts;
 *   - every token whose text is in the end-of-generation list below, whatever its type;
 *   - eos, and the eot / eom ids the file names (their text forms are in the list);
 *   - then two exceptions: <|end|> is not an end where <|return|> and <|call|> (gpt-oss)
 *     or <|calls|> and <|flush|> (solar-open) are, and </s> is not where <|tool_response>
 *     or <|plamo:eos|> is.
 * llama.cpp takes the first FIM text match its hash map yields; we take the lowest id, so
 * a vocabulary with two spellings gives one answer. */
#include <string.h>
#include "tok/tok_internal.h"

static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",   /* <｜end▁of▁sentence｜> */
    "[e~[",
};
static const char *const k_fim_pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
static const char *const k_fim_rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
static const char *const k_fim_sep[] = {"<|file_sep|>"};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int32_t tok_eog_find(const tokenizer *t, const char *text) {
    return tok_vocab_find(t, text, strlen(text));
}

/* The lowest id among the tokens spelled as one of texts, or -1. */
static int32_t tok_eog_find_any(const tokenizer *t, const char *const *texts, size_t n) {
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok_eog_find(t, texts[i]);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

static void tok_eog_set(tokenizer *t, int32_t id) {
    if (id >= 0 && id < t->n_vocab) t->flags[id] |= TOKF_EOG;
}

static bool tok_eog_has(const tokenizer *t, const char *text) {
    int32_t id = tok_eog_find(t, text);
    return id >= 0 && (t->flags[id] & TOKF_EOG);
}

static void tok_eog_clear(tokenizer *t, const char *text) {
    int32_t id = tok_eog_find(t, text);
    if (id >= 0) t->flags[id] &= (uint8_t)~TOKF_EOG;
}

void tok_eog_mark(tokenizer *t, const int32_t *named) {
    static const struct { tok_eog_role role; const char *const *texts; size_t n; } fim[] = {
        {TOK_EOG_FIM_PAD, k_fim_pad, N_OF(k_fim_pad)},
        {TOK_EOG_FIM_REP, k_fim_rep, N_OF(k_fim_rep)},
        {TOK_EOG_FIM_SEP, k_fim_sep, N_OF(k_fim_sep)},
    };
    for (size_t k = 0; k < N_OF(fim); k++) {
        int32_t id = named ? named[fim[k].role] : -1;
        tok_eog_set(t, id >= 0 ? id : tok_eog_find_any(t, fim[k].texts, fim[k].n));
    }
    for (size_t k = 0; k < N_OF(k_eog_texts); k++) tok_eog_set(t, tok_eog_find(t, k_eog_texts[k]));
    tok_eog_set(t, t->eos_id);
    if (named) {
        tok_eog_set(t, named[TOK_EOG_EOT]);
        tok_eog_set(t, named[TOK_EOG_EOM]);
    }
    bool call = tok_eog_has(t, "<|call|>") || tok_eog_has(t, "<|calls|>");
    if (call && (tok_eog_has(t, "<|return|>") || tok_eog_has(t, "<|flush|>"))) tok_eog_clear(t, "<|end|>");
    if (tok_eog_has(t, "<|tool_response>") || tok_eog_has(t, "<|plamo:eos|>")) tok_eog_clear(t, "</s>");
}
