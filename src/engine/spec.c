/* spec.c — prompt lookup and the draft model (see spec.h). */
#include "engine/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "tok/tokenizer.h"

int spec_ngram_propose(const int32_t *tokens, int n_tokens, int ngram_min, int ngram_max, int k, int32_t *out) {
    if (ngram_min < 1) ngram_min = 1;
    for (int n = ngram_max; n >= ngram_min; n--) {
        if (n >= n_tokens) continue;
        const int32_t *suffix = tokens + n_tokens - n;
        /* i + n < n_tokens: an occurrence before the suffix itself, with a token after it. */
        for (int i = 0; i + n < n_tokens; i++) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, (size_t)n * sizeof *tokens)) continue;
            int m = n_tokens - (i + n);
            if (m > k) m = k;
            memmove(out, tokens + i + n, (size_t)m * sizeof *tokens);
            return m;
        }
    }
    return 0;
}

/* ---- the draft model -------------------------------------------------------------- */

/* A token's text for an error message: at most 24 bytes, anything unprintable as \xNN,
 * so the message stays one line. */
static const char *piece_text(const tokenizer *t, int32_t id, char *out, size_t cap) {
    char raw[256];
    int n = tok_piece(t, id, raw, sizeof raw);
    size_t o = 0;
    for (int i = 0; i < n && i < 24 && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)raw[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

int spec_draft_check(const llmi_model *target, const llmi_model *draft, int max_ctx, llmi_status *st) {
    const char *path = draft->source_path[0] ? draft->source_path : "(draft)";
    int vt = target->cfg.n_vocab, vd = draft->cfg.n_vocab;
    if (vt != vd)
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: vocabulary differs from the target's (%d vs %d tokens)",
                         path, vd, vt);
    const tokenizer *tt = target->tok, *td = draft->tok;
    if ((tt == NULL) != (td == NULL))
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: %s has no tokenizer, so the vocabularies cannot be compared",
                         path, td ? "the target" : "the draft");
    if (tt) {
        if (tok_n_vocab(tt) != tok_n_vocab(td))
            return llmi_fail(st, LLMI_E_USAGE,
                             "--draft-model %s: vocabulary differs from the target's (tokenizer of %d vs %d tokens)",
                             path, tok_n_vocab(td), tok_n_vocab(tt));
        if (tok_bos(tt) != tok_bos(td) || tok_eos(tt) != tok_eos(td))
            return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: special tokens differ from the target's (BOS %d, EOS %d "
                             "vs BOS %d, EOS %d)", path, tok_bos(td), tok_eos(td), tok_bos(tt), tok_eos(tt));
        char a[256], b[256], ta[128], tb[128];
        for (int32_t id = 0; id < tok_n_vocab(tt); id++) {
            int na = tok_piece(td, id, a, sizeof a), nb = tok_piece(tt, id, b, sizeof b);
            if (na != nb || memcmp(a, b, (size_t)(na > 0 ? na : 0)))
                return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: vocabulary differs from the target's (token %d is "
                                 "'%s' vs '%s')", path, id, piece_text(td, id, ta, sizeof ta),
                                 piece_text(tt, id, tb, sizeof tb));
            if (tok_is_eog(tt, id) != tok_is_eog(td, id) || tok_is_special(tt, id) != tok_is_special(td, id))
                return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: special tokens differ from the target's (token %d "
                                 "'%s')", path, id, piece_text(tt, id, tb, sizeof tb));
        }
    }
    if (draft->cfg.max_ctx > 0 && draft->cfg.max_ctx < max_ctx)
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: context length %d is shorter than the engine's %d (-c)", path,
                         draft->cfg.max_ctx, max_ctx);
    return LLMI_OK;
}

int spec_draft_init(spec_draft *d, const llmi_model *m, llmi_backend *b, int num_blocks, int block_size,
                    int max_tokens, int max_seqs, int max_blocks_per_seq, llmi_status *st) {
    memset(d, 0, sizeof *d);
    d->model = m;
    d->backend = b;
    d->max_tokens = max_tokens;
    d->max_seqs = max_seqs;
    if (b->opts.block_size != block_size)
        return llmi_fail(st, LLMI_E_USAGE, "--draft-model %s: its backend has %d-token KV blocks, the engine %d",
                         m->source_path, b->opts.block_size, block_size);
    if (kvcache_init(&d->kv, num_blocks, block_size, false, (kv_hash){0, 0}, st) || b->kv_alloc(b, num_blocks, st) ||
        sched_batch_bufs_alloc(&d->bufs, max_tokens, max_seqs, max_seqs, max_blocks_per_seq, st))
        return st->code;
    size_t V = (size_t)m->cfg.n_vocab;
    d->logits = malloc((size_t)max_seqs * V * sizeof(float));
    d->scratch = malloc(sampler_scratch_bytes((int)V, 0));
    d->sel = malloc((size_t)max_seqs * sizeof *d->sel);
    d->take = malloc((size_t)max_seqs * sizeof *d->take);
    if (!d->logits || !d->scratch || !d->sel || !d->take)
        return llmi_fail(st, LLMI_E_RUNTIME, "--draft-model: out of memory for step buffers (%d rows x %zu vocab)",
                         max_seqs, V);
    return LLMI_OK;
}

void spec_draft_free(spec_draft *d) {
    kvcache_free(&d->kv);
    sched_batch_bufs_free(&d->bufs);
    free(d->logits);
    free(d->scratch);
    free(d->sel);
    free(d->take);
    free(d->stopped);
    memset(d, 0, sizeof *d);
}

void spec_draft_release(spec_draft *d, llmi_seq *s) {
    kvcache_release(&d->kv, &s->draft_table);
    s->draft_computed = 0;
}

void spec_draft_trim(spec_draft *d, llmi_seq *s) {
    if (s->draft_computed > s->n_tokens - 1) s->draft_computed = s->n_tokens - 1 > 0 ? s->n_tokens - 1 : 0;
    kvcache_shrink(&d->kv, &s->draft_table, kvcache_blocks_for(&d->kv, s->n_tokens));   /* no-op when within */
}

int spec_draft_propose(spec_draft *d, llmi_seq *const *seqs, const int *k, int n, llmi_status *st) {
    if (n > d->cap) {
        bool *ns = realloc(d->stopped, (size_t)n * sizeof *ns);
        if (!ns) return llmi_fail(st, LLMI_E_RUNTIME, "--draft-model: out of memory for %d sequences", n);
        d->stopped = ns;
        d->cap = n;
    }
    for (int i = 0; i < n; i++) {
        seqs[i]->n_draft = 0;
        spec_draft_trim(d, seqs[i]);
        d->stopped[i] = false;
    }
    const int V = d->model->cfg.n_vocab, bs = d->kv.block_size;
    const llmi_sampling greedy = {.temperature = 0.0f, .repeat_penalty = 1.0f};
    /* Each forward takes, for every sequence that still proposes (as far as the limits
     * allow), the tokens the draft has not seen; a sequence that took all of them gets its
     * next proposal from the row of its last one.  Every forward advances at least its
     * first sequence, so the loop ends. */
    for (;;) {
        int n_sel = 0, t = 0, width = 1;
        for (int i = 0; i < n && n_sel < d->max_seqs && t < d->max_tokens; i++) {
            llmi_seq *s = seqs[i];
            if (d->stopped[i] || s->n_draft >= k[i]) continue;
            int seen_upto = s->n_tokens + s->n_draft;   /* the draft must have seen these to propose */
            int take = seen_upto - s->draft_computed;
            if (take > d->max_tokens - t) take = d->max_tokens - t;
            if (kvcache_reserve(&d->kv, &s->draft_table, s->draft_computed + take) != 0) {
                /* The pool is full: propose what it has; with nothing yet, make room. */
                d->stopped[i] = true;
                if (s->n_draft == 0) spec_draft_release(d, s);
                continue;
            }
            if (s->draft_table.n_blocks > width) width = s->draft_table.n_blocks;
            d->sel[n_sel] = i;
            d->take[n_sel++] = take;
            t += take;
        }
        if (n_sel == 0) break;
        int n_tok = 0, n_logits = 0;
        for (int j = 0; j < n_sel; j++) {
            llmi_seq *s = seqs[d->sel[j]];
            n_tok = sched_batch_put(&d->bufs, j, n_tok, s->tokens, s->draft_computed, d->take[j], &s->draft_table, width,
                                    bs);
            if (s->draft_computed + d->take[j] == s->n_tokens + s->n_draft) d->bufs.logit_rows[n_logits++] = n_tok - 1;
        }
        llmi_batch batch = sched_batch_view(&d->bufs, n_sel, n_tok, width, n_logits);
        if (d->backend->forward(d->backend, &batch, d->logits, st)) return st->code;
        int row = 0;
        for (int j = 0; j < n_sel; j++) {
            llmi_seq *s = seqs[d->sel[j]];
            s->draft_computed += d->take[j];
            if (s->draft_computed < s->n_tokens + s->n_draft) continue;
            float *x = d->logits + (size_t)row++ * V;
            s->tokens[s->n_tokens + s->n_draft] = sampler_sample_uniform(x, V, &greedy, NULL, 0, 0.0, d->scratch);
            s->n_draft++;
        }
    }
    return LLMI_OK;
}
