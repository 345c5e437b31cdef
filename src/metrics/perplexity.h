/* perplexity.h — owns `llmi bench --ppl`: llama-perplexity's scoring rule, reproduced
 * from its documented behaviour (tools/perplexity/perplexity.cpp):
 *   - the whole file (less one trailing newline, as llama.cpp's -f) is tokenized once,
 *     with BOS when the model adds one;
 *   - it is cut into n_chunk = n_tokens / n_ctx windows of n_ctx tokens (--chunks caps it);
 *   - each window is evaluated from an empty cache, its first token replaced by BOS;
 *   - only the second half is scored: logits at positions n_ctx/2 .. n_ctx-2 predict the
 *     next token (n_ctx - n_ctx/2 - 1 scores per window);
 *   - ppl = exp(mean NLL); ± = ppl * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).
 * The forward drives the backend directly: the engine samples one row per sequence, a
 * window needs the logits of every scored position. */
#ifndef LLMI_PERPLEXITY_H
#define LLMI_PERPLEXITY_H

#include <stdint.h>
#include <stdio.h>
#include "backend/backend.h"
#include "model/model.h"
#include "core/status.h"

#define PPL_SCORING "llama.cpp: windows of n_ctx tokens, BOS replaces the first, second half scored"

typedef struct ppl_acc {
    double nll, nll2;     /* sums of -log p and its square */
    long count;
} ppl_acc;

/* -log softmax(logits)[tok] as llama.cpp computes it: float max, double sum of expf. */
double ppl_nll(const float *logits, int n_vocab, int32_t tok);
void ppl_add(ppl_acc *a, double nll);
double ppl_value(const ppl_acc *a);            /* exp(nll / count) */
double ppl_stderr(const ppl_acc *a);           /* NaN when count < 2 or the variance is not positive */

typedef struct ppl_opts {
    int n_ctx;            /* window (-c), default 512 */
    int n_chunks;         /* --chunks; <= 0 = all */
    int n_batch;          /* tokens per forward (<= backend max_batch_tokens) */
    FILE *progress;       /* running estimate "[i]ppl," lines, or NULL */
    /* Called after each window with the estimate so far, or NULL; a non-zero return stops
     * the run there (Ctrl-C): ppl_run then fills res with the windows done and returns
     * LLMI_E_INTERRUPT. */
    int (*on_chunk)(void *ctx, int done, int total, double ppl);
    void *ctx;
} ppl_opts;

typedef struct ppl_result {
    double ppl, ppl_stderr;
    int chunks, ctx;
    long n_tokens;        /* of the tokenized file */
    long scored;          /* count */
    double seconds;
} ppl_result;

struct tokenizer;
/* The tokens llama.cpp scores for a text file's bytes text (len): one trailing newline
 * dropped (as its -f does), then tokenized once with the model's BOS rule.  *ids (*n)
 * is malloc'ed. */
int ppl_tokenize(const struct tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, llmi_status *st);

/* Scores tokens (n, already tokenized, BOS first when the model adds one) with bos the
 * id that replaces each window's first token (-1: none).  The backend must have at least
 * ceil(n_ctx / block_size) KV blocks allocated. */
int ppl_run(llmi_backend *b, const int32_t *tokens, long n, int32_t bos, const ppl_opts *o, ppl_result *res,
            llmi_status *st);

#endif
