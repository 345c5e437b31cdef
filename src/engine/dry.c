/* dry.c — DRY's breaker table and penalties (dry.h).  The semantics are llama.cpp's
 * llama_sampler_dry (itself KoboldCpp's), as testdata/sampler/DRY-PROVENANCE.md states
 * them; the repeat lengths come from a Z-array over the reversed window. */
#include "engine/dry.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "core/grow.h"
#include "core/strbuf.h"
#include "core/utf8.h"
#include "tok/tokenizer.h"

typedef struct { int32_t head, at, len; } tail_ref;   /* a tail: tail_ids[at, at + len) */

typedef struct {
    tail_ref *refs;
    int32_t n_refs, cap_refs;
    int32_t *ids;
    int32_t n_ids, cap_ids;
} table_build;

/* Adds (head, tail); a non-empty tail only when head has no equal one (from any breaker),
 * an empty one always: llama.cpp's table, entry for entry. */
static bool add_tail(table_build *tb, int32_t head, const int32_t *tail, int32_t len) {
    for (int32_t r = 0; len > 0 && r < tb->n_refs; r++)
        if (tb->refs[r].head == head && tb->refs[r].len == len &&
            !memcmp(tb->ids + tb->refs[r].at, tail, (size_t)len * sizeof *tail))
            return true;
    if (!grow_array((void **)&tb->refs, &tb->cap_refs, tb->n_refs + 1, sizeof *tb->refs) ||
        !grow_array((void **)&tb->ids, &tb->cap_ids, tb->n_ids + len, sizeof *tb->ids))
        return false;
    if (len) memcpy(tb->ids + tb->n_ids, tail, (size_t)len * sizeof *tail);
    tb->refs[tb->n_refs++] = (tail_ref){head, tb->n_ids, len};
    tb->n_ids += len;
    return true;
}

static int cmp_ref(const void *a, const void *b) {
    const tail_ref *x = a, *y = b;
    if (x->head != y->head) return x->head < y->head ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;   /* order of finding: stable */
}

/* Tokens of a breaker's rest s[0, n).  Cut inside a character, it starts with bytes that
 * are no UTF-8 on their own: each becomes U+FFFD, one per byte, as llama.cpp's tokenizer
 * reads invalid UTF-8 (unicode_cpts_from_utf8), so the tables are llama.cpp's. */
static int tail_tokens(const tokenizer *t, const char *s, size_t n, int32_t **ids, int *m, llmi_status *st) {
    strbuf b = {0};
    for (size_t i = 0; i < n;) {
        int32_t cp;
        int k = utf8_next(s + i, n - i, &cp);
        if (k) strbuf_put(&b, s + i, (size_t)k), i += (size_t)k;
        else strbuf_puts(&b, "\xEF\xBF\xBD"), i++;
    }
    if (b.oom) {
        free(b.p);
        return llmi_fail(st, LLMI_E_RUNTIME, "DRY: out of memory");
    }
    int rc = tok_encode(t, b.p ? b.p : "", b.n, false, false, ids, m, st);
    free(b.p);
    return rc;
}

int dry_breakers_build(const tokenizer *t, const char *const *breakers, int n, dry_breakers **out, llmi_status *st) {
    *out = NULL;
    if (n < 0 || n > DRY_MAX_BREAKERS)
        return llmi_fail(st, LLMI_E_USAGE, "DRY: %d sequence breakers (at most %d)", n, DRY_MAX_BREAKERS);
    const int32_t V = tok_n_vocab(t);
    table_build tb = {0};
    int32_t *tails[DRY_MAX_BREAKER_BYTES] = {0};   /* per breaker: the rest after i bytes, tokenized */
    int n_tail[DRY_MAX_BREAKER_BYTES];
    char word[512];
    int rc = LLMI_OK;
    for (int k = 0; k < n && !rc; k++) {
        const char *s = breakers[k];
        size_t L = strlen(s);
        if (L == 0) continue;
        if (L > DRY_MAX_BREAKER_BYTES) L = DRY_MAX_BREAKER_BYTES;
        for (size_t i = 0; i < DRY_MAX_BREAKER_BYTES; i++) free(tails[i]), tails[i] = NULL, n_tail[i] = -1;
        for (int32_t id = 0; id < V && !rc; id++) {
            size_t wl = (size_t)tok_piece(t, id, word, sizeof word);
            if (wl >= L && memmem(word, wl, s, L)) {
                if (!add_tail(&tb, id, NULL, 0)) rc = llmi_fail(st, LLMI_E_RUNTIME, "DRY: out of memory");
                continue;
            }
            /* the token's text ends with the breaker's first i bytes */
            for (size_t pos = 0; pos < wl && !rc; pos++) {
                if (word[pos] != s[0]) continue;
                size_t i = 1;
                while (i < L && pos + i < wl && word[pos + i] == s[i]) i++;
                if (pos + i != wl || i >= L) continue;   /* a mismatch inside the token */
                if (n_tail[i] < 0) {
                    int32_t *ids = NULL;
                    int m = 0;
                    if (tail_tokens(t, s + i, L - i, &ids, &m, st)) {
                        rc = st->code;
                        break;
                    }
                    tails[i] = ids;
                    n_tail[i] = m > DRY_MAX_TAIL ? DRY_MAX_TAIL : m;
                }
                if (!add_tail(&tb, id, tails[i], n_tail[i])) rc = llmi_fail(st, LLMI_E_RUNTIME, "DRY: out of memory");
            }
        }
    }
    for (size_t i = 0; i < DRY_MAX_BREAKER_BYTES; i++) free(tails[i]);
    dry_breakers *b = rc ? NULL : calloc(1, sizeof *b);
    if (!rc && !b) rc = llmi_fail(st, LLMI_E_RUNTIME, "DRY: out of memory");
    if (!rc) {
        /* several breakers: a head's tails may sit in several runs; sort by head */
        qsort(tb.refs, (size_t)tb.n_refs, sizeof *tb.refs, cmp_ref);
        b->n_vocab = V;
        b->n_tails = tb.n_refs;
        b->first = calloc((size_t)V + 1, sizeof *b->first);
        b->tail_at = malloc(((size_t)tb.n_refs + 1) * sizeof *b->tail_at);
        b->tail_ids = malloc(((size_t)tb.n_ids + 1) * sizeof *b->tail_ids);
        if (!b->first || !b->tail_at || !b->tail_ids) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "DRY: out of memory");
        } else {
            int32_t at = 0;
            for (int32_t r = 0; r < tb.n_refs; r++) {
                b->first[tb.refs[r].head + 1]++;
                b->tail_at[r] = at;
                if (tb.refs[r].len) memcpy(b->tail_ids + at, tb.ids + tb.refs[r].at, (size_t)tb.refs[r].len * sizeof *b->tail_ids);
                at += tb.refs[r].len;
            }
            b->tail_at[tb.n_refs] = at;
            for (int32_t h = 0; h < V; h++) b->first[h + 1] += b->first[h];
        }
    }
    free(tb.refs);
    free(tb.ids);
    if (rc) {
        dry_breakers_free(b);
        return rc;
    }
    *out = b;
    return LLMI_OK;
}

void dry_breakers_free(dry_breakers *b) {
    if (!b) return;
    free(b->first);
    free(b->tail_at);
    free(b->tail_ids);
    free(b);
}

size_t dry_scratch_ints(int n_vocab, int n_win) { return (size_t)n_vocab + (size_t)n_win; }

void dry_apply(float *logits, int n_vocab, const dry_params *p, const dry_breakers *b, const int32_t *win, int n_win,
               int *scratch) {
    if (p->multiplier == 0.0f || p->base < 1.0f || n_win <= p->allowed_length) return;
    const int N = n_win;
#define R(j) win[N - 1 - (j)]   /* the window reversed: R(0) is the newest token */
    /* A breaker ending the window (its head i tokens back, its tail after it) bounds how far
     * back a repeat may reach: the newest one found wins. */
    int rep_limit = N;
    for (int i = 0; b && i < N; i++) {
        int32_t head = R(i);
        if (head < 0 || head >= b->n_vocab || b->first[head] == b->first[head + 1]) continue;
        int longest = -1;
        for (int32_t j = b->first[head]; j < b->first[head + 1]; j++) {
            int len = b->tail_at[j + 1] - b->tail_at[j];
            if (len <= longest || len > i) continue;
            const int32_t *tail = b->tail_ids + b->tail_at[j];
            bool match = true;
            for (int o = 0; o < len && match; o++) match = tail[o] == R(i - o - 1);
            if (match) longest = len;
        }
        if (longest >= 0) {
            rep_limit = i - longest;
            break;
        }
    }
    if (rep_limit < p->allowed_length) return;
    /* z[k]: how many newest tokens repeat k tokens further back (the Z-array of R) */
    int *z = scratch + n_vocab, *best = scratch;   /* (N), (n_vocab) longest repeat each token would extend */
    /* only the window's tokens are read or written: clear those, not the vocabulary */
    for (int i = 0; i < N; i++)
        if (win[i] >= 0 && win[i] < n_vocab) best[win[i]] = -1;
    for (int k = 1, l = 0, r = 0; k < N; k++) {
        int v = k < r ? (r - k < z[k - l] ? r - k : z[k - l]) : 0;
        while (k + v < N && R(v) == R(k + v)) v++;
        z[k] = v;
        if (k + v > r) l = k, r = k + v;
        int len = v < rep_limit ? v : rep_limit;
        /* the token after that earlier occurrence would make the repeat len + 1 long */
        int32_t next = R(k - 1);
        if (len >= p->allowed_length && next >= 0 && next < n_vocab && len > best[next]) best[next] = len;
    }
#undef R
    int max_exp = 0;
    if (p->base > 1.000001f) max_exp = (int)(88.7228391f / logf(p->base));   /* pow() stays inside float */
    for (int k = 1; k < N; k++) {
        int32_t tok = win[N - k];
        if (tok < 0 || tok >= n_vocab || best[tok] < 0) continue;
        int len = best[tok];
        best[tok] = -1;   /* once per token */
        bool single_breaker = false;
        for (int32_t j = b ? b->first[tok] : 0; b && j < b->first[tok + 1] && !single_breaker; j++)
            single_breaker = b->tail_at[j + 1] == b->tail_at[j];
        if (single_breaker) continue;
        int e = len - p->allowed_length;
        if (max_exp > 0 && e > max_exp) e = max_exp;
        logits[tok] -= (float)((double)p->multiplier * pow((double)p->base, (double)e));
    }
}
