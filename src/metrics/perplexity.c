/* perplexity.c — see perplexity.h. */
#include "metrics/perplexity.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tok/tokenizer.h"

double ppl_nll(const float *logits, int n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - mx);
    return -((double)(logits[tok] - mx) - log(sum));
}

void ppl_add(ppl_acc *a, double nll) {
    a->nll += nll;
    a->nll2 += nll * nll;
    a->count++;
}

double ppl_value(const ppl_acc *a) { return a->count > 0 ? exp(a->nll / (double)a->count) : NAN; }

double ppl_stderr(const ppl_acc *a) {
    if (a->count < 2) return NAN;
    double mean = a->nll / (double)a->count;
    double var = a->nll2 / (double)a->count - mean * mean;
    if (!(var > 0)) return NAN;
    return sqrt(var / (double)(a->count - 1)) * exp(mean);
}

int ppl_tokenize(const struct tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n, llmi_status *st) {
    if (len > 0 && text[len - 1] == '\n') len--;
    return tok_encode(tok, text, len, true, false, ids, n, st);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int ppl_run(llmi_backend *b, const int32_t *tokens, long n, int32_t bos, const ppl_opts *o, ppl_result *res,
            llmi_status *st) {
    const int n_ctx = o->n_ctx, V = b->model->cfg.n_vocab, bs = b->opts.block_size;
    memset(res, 0, sizeof *res);
    if (n_ctx < 4) return llmi_fail(st, LLMI_E_USAGE, "-c: a perplexity window needs at least 4 tokens (got %d)", n_ctx);
    if (n < 2L * n_ctx)
        return llmi_fail(st, LLMI_E_USAGE,
                         "--ppl: the file tokenizes to %ld tokens; a window of %d (-c) needs at least %d", n, n_ctx,
                         2 * n_ctx);
    const int n_batch = o->n_batch > 0 && o->n_batch < n_ctx ? o->n_batch : n_ctx;
    const int n_blocks = (n_ctx + bs - 1) / bs;
    if (b->num_blocks < n_blocks)
        return llmi_fail(st, LLMI_E_RUNTIME, "--ppl: window of %d tokens needs %d KV blocks, backend has %d", n_ctx,
                         n_blocks, b->num_blocks);
    int n_chunk = (int)(n / n_ctx);
    if (o->n_chunks > 0 && o->n_chunks < n_chunk) n_chunk = o->n_chunks;
    const int first = n_ctx / 2;

    int32_t *tok = malloc((size_t)n_batch * sizeof *tok);          /* (n_batch) */
    int32_t *pos = malloc((size_t)n_batch * sizeof *pos);          /* (n_batch) */
    int32_t *slot = malloc((size_t)n_batch * sizeof *slot);        /* (n_batch) */
    int32_t *seq = calloc((size_t)n_batch, sizeof *seq);           /* (n_batch) all sequence 0 */
    int32_t *rows = malloc((size_t)n_batch * sizeof *rows);        /* (n_batch) */
    int32_t *table = malloc((size_t)n_blocks * sizeof *table);     /* (1, n_blocks) */
    float *logits = malloc((size_t)n_batch * (size_t)V * sizeof *logits); /* (n_batch, n_vocab) */
    int rc = 0;
    if (!tok || !pos || !slot || !seq || !rows || !table || !logits) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "--ppl: out of memory for a %d-token batch", n_batch);
        goto done;
    }
    for (int i = 0; i < n_blocks; i++) table[i] = i;

    ppl_acc acc = {0};
    double t0 = now_s();
    for (int c = 0; c < n_chunk; c++) {
        const long start = (long)c * n_ctx;
        /* The cache is rewritten from position 0 each window, so no clearing is needed:
         * attention only reads positions up to the current one. */
        for (int j = 0; j < n_ctx; j += n_batch) {
            int nb = n_ctx - j < n_batch ? n_ctx - j : n_batch, nl = 0;
            for (int k = 0; k < nb; k++) {
                int p = j + k;
                tok[k] = (p == 0 && bos >= 0) ? bos : tokens[start + p];
                pos[k] = p;
                slot[k] = table[p / bs] * bs + p % bs;
                if (p >= first && p <= n_ctx - 2) rows[nl++] = k;
            }
            int32_t qs[2] = {0, nb};
            llmi_batch batch = {.n_tokens = nb, .tokens = tok, .positions = pos, .slot_mapping = slot,
                                .seq_of_token = seq, .n_seqs = 1, .query_start = qs,
                                .block_tables = table, .max_blocks_per_seq = n_blocks, .n_logits = nl,
                                .logit_rows = rows};
            if ((rc = b->forward(b, &batch, logits, st))) goto done;
            for (int r = 0; r < nl; r++) {
                int p = j + rows[r];
                double v = ppl_nll(logits + (size_t)r * V, V, tokens[start + p + 1]);
                ppl_add(&acc, v);
            }
        }
        if (o->progress) {
            fprintf(o->progress, "[%d]%.4f,", c + 1, ppl_value(&acc));
            fflush(o->progress);
        }
        if (o->on_chunk && o->on_chunk(o->ctx, c + 1, n_chunk, ppl_value(&acc)) && c + 1 < n_chunk) {
            rc = llmi_fail(st, LLMI_E_INTERRUPT, "--ppl: interrupted after %d of %d windows", c + 1, n_chunk);
            n_chunk = c + 1;
            break;
        }
    }
    if (o->progress) fputc('\n', o->progress);
    res->ppl = ppl_value(&acc);
    res->ppl_stderr = ppl_stderr(&acc);
    res->chunks = n_chunk;
    res->ctx = n_ctx;
    res->n_tokens = n;
    res->scored = acc.count;
    res->seconds = now_s() - t0;
done:
    free(tok); free(pos); free(slot); free(seq); free(rows); free(table); free(logits);
    return rc;
}
