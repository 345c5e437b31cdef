/* sched.c — step planning and batch building (see sched.h). */
#include "engine/sched.h"

#include <stdlib.h>
#include <string.h>

int sched_init(sched *s, const llmi_engine_opts *o, llmi_status *st) {
    memset(s, 0, sizeof *s);
    s->policy = o->policy;
    s->max_batch_tokens = o->max_batch_tokens;
    s->prefill_chunk = o->prefill_chunk;
    s->max_seqs = o->max_seqs;
    long rows = (long)o->max_seqs * (1 + (o->spec_max_k > 0 ? o->spec_max_k : 0));
    s->max_logit_rows = rows < o->max_batch_tokens ? (int)rows : o->max_batch_tokens;
    return LLMI_OK;
}

void sched_free(sched *s) {
    free(s->waiting);
    free(s->running);
    memset(s, 0, sizeof *s);
}

int sched_enqueue(sched *s, int id, llmi_status *st) {
    if (s->n_waiting + s->n_running >= s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        int *nw = realloc(s->waiting, (size_t)cap * sizeof *nw);
        if (!nw) return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: out of memory for requests");
        s->waiting = nw;
        int *nr = realloc(s->running, (size_t)cap * sizeof *nr);
        if (!nr) return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: out of memory for requests");
        s->running = nr;
        s->cap = cap;
    }
    s->waiting[s->n_waiting++] = id;
    return LLMI_OK;
}

static void remove_id(int *list, int *n, int id) {
    for (int i = 0; i < *n; i++)
        if (list[i] == id) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof *list);
            (*n)--;
            return;
        }
}

void sched_remove(sched *s, int id) {
    remove_id(s->waiting, &s->n_waiting, id);
    remove_id(s->running, &s->n_running, id);
}

int sched_plan_alloc(sched_plan *p, const sched *s, llmi_status *st) {
    memset(p, 0, sizeof *p);
    p->seq_ids = malloc((size_t)s->max_seqs * sizeof *p->seq_ids);
    p->n_new = malloc((size_t)s->max_seqs * sizeof *p->n_new);
    if (!p->seq_ids || !p->n_new) {
        sched_plan_free(p);
        return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: out of memory for a plan of %d sequences", s->max_seqs);
    }
    return LLMI_OK;
}

void sched_plan_free(sched_plan *p) {
    free(p->seq_ids);
    free(p->n_new);
    free(p->dropped);
    memset(p, 0, sizeof *p);
}

static bool in_plan(const sched_plan *p, int id) {
    for (int j = 0; j < p->n_seqs; j++)
        if (p->seq_ids[j] == id) return true;
    return false;
}

/* Frees the victim's KV and puts it back in the waiting queue, in arrival order so the
 * oldest work resumes first. */
static void preempt(sched *s, kvcache *kv, llmi_seq **seqs, llmi_seq *v) {
    kvcache_release(kv, &v->table);
    if (s->draft_kv) kvcache_release(s->draft_kv, &v->draft_table);
    v->draft_computed = 0;
    v->n_computed = 0;
    v->n_draft = 0;
    v->state = SEQ_WAITING;
    v->info.n_preempted++;
    remove_id(s->running, &s->n_running, v->id);
    int pos = 0;
    while (pos < s->n_waiting && seqs[s->waiting[pos]]->order < v->order) pos++;
    memmove(s->waiting + pos + 1, s->waiting + pos, (size_t)(s->n_waiting - pos) * sizeof(int));
    s->waiting[pos] = v->id;
    s->n_waiting++;
}

/* Tokens this sequence would like to process this step, before budgets. */
static int seq_want(const sched *s, const llmi_seq *q) {
    if (seq_in_decode(q)) return 1 + q->n_draft;
    int pending = seq_pending(q);
    if (pending > 1 && s->prefill_chunk > 0 && pending > s->prefill_chunk) pending = s->prefill_chunk;
    return pending;
}

/* Adds up to `budget` tokens of q to the plan, reserving KV (preempting later-admitted
 * sequences when allowed); returns tokens added, 0 if q must wait this step, -1 when q
 * cannot fit even with the whole cache to itself. */
static int plan_take(sched *s, llmi_seq **seqs, kvcache *kv, sched_plan *p, llmi_seq *q, int budget,
                     bool may_preempt) {
    int n = seq_want(s, q);
    q->n_draft = 0;
    if (n > budget) n = budget;
    if (seq_owes_prompt_logprobs(q)) {
        /* Its chunk ends where the step's prompt-logprob rows run out, unless every row it
         * still owes fits. */
        int lo = seq_plp_from(q), left = s->plp_rows - p->n_plp_rows;
        if (lo + left < q->n_prompt - 1 && n > lo - q->n_computed + left) n = lo - q->n_computed + left;
    }
    if (n <= 0 || p->n_seqs >= s->max_seqs) return 0;
    /* Proposals only take blocks that are free: with too few, verify none this step. */
    if (seq_in_decode(q) && n > 1 && kvcache_reserve(kv, &q->table, q->n_computed + n) != 0) n = 1;
    while (kvcache_reserve(kv, &q->table, q->n_computed + n) != 0) {
        if (!may_preempt) return 0;
        llmi_seq *victim = NULL;
        for (int i = s->n_running - 1; i >= 0 && !victim; i--) {
            llmi_seq *c = seqs[s->running[i]];
            if (c != q && !in_plan(p, c->id)) victim = c;
        }
        if (!victim) {
            /* Everyone else holding blocks is in this step: wait for them to finish,
             * unless q could not fit even with the whole cache to itself. */
            return kvcache_blocks_for(kv, q->n_computed + n) > kv->num_blocks ? -1 : 0;
        }
        preempt(s, kv, seqs, victim);
        p->n_preempted++;
    }
    if (seq_in_decode(q)) q->n_draft = n - 1;
    int k = p->n_seqs++;
    p->seq_ids[k] = q->id;
    p->n_new[k] = n;
    p->n_tokens += n;
    p->n_plp_rows += seq_plp_rows(q, n);
    return n;
}

static int drop(sched *s, kvcache *kv, sched_plan *p, llmi_seq *q, llmi_status *st) {
    if (p->n_dropped % 16 == 0) {
        int *nd = realloc(p->dropped, (size_t)(p->n_dropped + 16) * sizeof *nd);
        if (!nd) return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: out of memory");
        p->dropped = nd;
    }
    p->dropped[p->n_dropped++] = q->id;
    remove_id(s->running, &s->n_running, q->id);
    kvcache_release(kv, &q->table);
    return LLMI_OK;
}

/* In-flight prefix sharing.  The prefix cache only knows blocks whose K/V is computed, so
 * requests that arrive together with a common prefix (the samples of one prompt, a shared
 * system prompt) would each compute it.  Instead a waiting sequence whose next full blocks a
 * running sequence is computing waits for them: admitted once they are committed, it finds
 * them in the cache.  Later arrivals may be admitted meanwhile; the wait ends when the twin
 * has computed the shared blocks, or stops running (finished, preempted). */
static bool twin_still_computing(llmi_seq *q, llmi_seq **seqs) {
    if (q->twin < 0) return false;
    const llmi_seq *r = seqs[q->twin];
    if (r && r->state == SEQ_RUNNING && r->n_computed < q->twin_until) return true;
    q->twin = -1;
    return false;
}

/* Looks for a running sequence that has yet to compute full blocks q could take from the
 * prefix cache past its `cached` tokens (whose blocks q's table holds): the same blocks
 * before `cached`, the same tokens after, up to q's last token (always computed).  Found:
 * remembered in q->twin and twin_until, true. */
static bool find_twin(const sched *s, llmi_seq **seqs, const kvcache *kv, llmi_seq *q, int cached) {
    const int bs = kv->block_size, cached_blocks = cached / bs;
    for (int i = 0; i < s->n_running; i++) {
        const llmi_seq *r = seqs[s->running[i]];
        if (seq_in_decode(r) || r->n_computed >= r->n_tokens) continue;
        if (r->table.n_blocks < cached_blocks) continue;
        bool same = true;
        for (int b = 0; b < cached_blocks && same; b++) same = r->table.blocks[b] == q->table.blocks[b];
        if (!same) continue;
        int limit = q->n_tokens - 1 < r->n_tokens ? q->n_tokens - 1 : r->n_tokens, len = cached;
        while (len < limit && q->tokens[len] == r->tokens[len]) len++;
        int until = len / bs * bs;
        if (until > cached && r->n_computed < until) {
            q->twin = r->id;
            q->twin_until = until;
            return true;
        }
    }
    return false;
}

int sched_plan_step(sched *s, llmi_seq **seqs, kvcache *kv, sched_plan *p, llmi_status *st) {
    p->n_seqs = p->n_tokens = p->n_plp_rows = p->n_preempted = p->n_dropped = 0;
    int budget = s->max_batch_tokens;
    /* Which running sequences get work, in order.  Prefill-first serves sequences still
     * in their prompt (and new admissions) before decodes; FIFO serves by age. */
    for (int pass = 0; pass < 2; pass++) {
        bool want_prefill = pass == 0;
        if (s->policy == SCHED_FIFO && pass == 1) break;
        for (int i = 0; i < s->n_running && budget > 0; i++) {
            llmi_seq *q = seqs[s->running[i]];
            bool in_prefill = !seq_in_decode(q);
            if (s->policy == SCHED_PREFILL_FIRST && in_prefill != want_prefill) continue;
            if (in_plan(p, q->id)) continue;
            int got = plan_take(s, seqs, kv, p, q, budget, true);
            if (got < 0) {
                /* It alone exceeds the whole cache: end it rather than stall everyone. */
                if (drop(s, kv, p, q, st)) return st->code;
                i--;
                continue;
            }
            budget -= got;
            /* Preemption may have shifted the running list: find q again. */
            for (int j = 0; j < s->n_running; j++)
                if (s->running[j] == q->id) i = j;
        }
        if (pass == 0) {
            /* Admit waiting sequences in arrival order while blocks, seats and tokens allow:
             * --max-seqs bounds the sequences running, not only those in this step (under
             * prefill-first the decoding ones sit out pass 0, and admitting against the
             * plan alone let the running set grow past it).  A sequence starts after its
             * longest cached prefix (a preempted one finds its own blocks again unless they
             * were evicted meanwhile). */
            int w = 0;
            while (w < s->n_waiting && budget > 0 && p->n_seqs < s->max_seqs && s->n_running < s->max_seqs) {
                llmi_seq *q = seqs[s->waiting[w]];
                if (twin_still_computing(q, seqs)) {
                    w++;
                    continue;
                }
                /* Rows owed to prompt logprobs need their positions computed. */
                int cached = 0;
                if (!seq_owes_prompt_logprobs(q)) {
                    cached = kvcache_match_prefix(kv, &q->table, q->tokens, q->n_tokens);
                    if (s->pc) cached = prompt_cache_extend(s->pc, kv, &q->table, q->tokens, q->n_tokens);
                    if (kv->prefix_cache && find_twin(s, seqs, kv, q, cached)) {
                        kvcache_release(kv, &q->table);
                        w++;
                        continue;
                    }
                }
                q->n_computed = cached;
                int got = plan_take(s, seqs, kv, p, q, budget, false);
                if (got <= 0) {
                    kvcache_release(kv, &q->table);
                    q->n_computed = 0;
                    break;
                }
                if (q->info.n_preempted == 0) q->info.n_cached_tokens = cached;
                budget -= got;
                remove_id(s->waiting, &s->n_waiting, q->id);
                q->state = SEQ_RUNNING;
                s->running[s->n_running++] = q->id;
            }
        }
    }
    return LLMI_OK;
}

int sched_batch_bufs_alloc(sched_batch_bufs *b, int max_tokens, int max_seqs, int max_logit_rows,
                           int max_blocks_per_seq, llmi_status *st) {
    memset(b, 0, sizeof *b);
    size_t T = (size_t)max_tokens, S = (size_t)max_seqs, L = (size_t)max_logit_rows;
    b->max_blocks_per_seq = max_blocks_per_seq;
    b->tokens = malloc(T * sizeof(int32_t));
    b->positions = malloc(T * sizeof(int32_t));
    b->slots = malloc(T * sizeof(int32_t));
    b->seq_of = malloc(T * sizeof(int32_t));
    b->query_start = malloc((S + 1) * sizeof(int32_t));
    b->block_tables = malloc(S * (size_t)max_blocks_per_seq * sizeof(int32_t));
    b->logit_rows = malloc(L * sizeof(int32_t));
    b->logit_seq = malloc(L * sizeof(int32_t));
    if (!b->tokens || !b->positions || !b->slots || !b->seq_of || !b->query_start || !b->block_tables ||
        !b->logit_rows || !b->logit_seq) {
        sched_batch_bufs_free(b);
        return llmi_fail(st, LLMI_E_RUNTIME, "scheduler: out of memory for step buffers (%zu tokens, %zu sequences)",
                         T, S);
    }
    return LLMI_OK;
}

void sched_batch_bufs_free(sched_batch_bufs *b) {
    free(b->tokens);
    free(b->positions);
    free(b->slots);
    free(b->seq_of);
    free(b->query_start);
    free(b->block_tables);
    free(b->logit_rows);
    free(b->logit_seq);
    memset(b, 0, sizeof *b);
}

int sched_batch_put(sched_batch_bufs *b, int k, int t, const int32_t *tokens, int pos0, int n,
                    const kvcache_table *table, int width, int block_size) {
    b->query_start[k] = t;
    for (int i = 0; i < n; i++, t++) {
        int pos = pos0 + i;
        b->tokens[t] = tokens[pos];
        b->positions[t] = pos;
        b->slots[t] = table->blocks[pos / block_size] * block_size + pos % block_size;
        b->seq_of[t] = k;
    }
    int32_t *row = b->block_tables + (size_t)k * width;
    memcpy(row, table->blocks, (size_t)table->n_blocks * sizeof(int32_t));
    for (int i = table->n_blocks; i < width; i++) row[i] = -1;
    return t;
}

llmi_batch sched_batch_view(sched_batch_bufs *b, int n_seqs, int n_tokens, int width, int n_logits) {
    b->query_start[n_seqs] = n_tokens;
    return (llmi_batch){.n_tokens = n_tokens, .tokens = b->tokens, .positions = b->positions,
                        .slot_mapping = b->slots, .seq_of_token = b->seq_of, .n_seqs = n_seqs,
                        .query_start = b->query_start, .block_tables = b->block_tables,
                        .max_blocks_per_seq = width, .n_logits = n_logits, .logit_rows = b->logit_rows};
}

void sched_build_batch(const sched_plan *p, llmi_seq *const *seqs, int block_size, sched_batch_bufs *b,
                       llmi_batch *out) {
    int width = 1;
    for (int k = 0; k < p->n_seqs; k++) {
        int w = seqs[p->seq_ids[k]]->table.n_blocks;
        if (w > width) width = w;
    }
    int t = 0, n_logits = 0;
    for (int k = 0; k < p->n_seqs; k++) {
        const llmi_seq *s = seqs[p->seq_ids[k]];
        int n = p->n_new[k];
        t = sched_batch_put(b, k, t, s->tokens, s->n_computed, n, &s->table, width, block_size);
        for (int r = 0, rows = seq_plp_rows(s, n), row0 = t - n + seq_plp_from(s) - s->n_computed; r < rows; r++) {
            b->logit_seq[n_logits] = k;
            b->logit_rows[n_logits++] = row0 + r;
        }
        if (s->n_draft > 0) {
            for (int i = 0; i < n; i++) {
                b->logit_seq[n_logits] = k;
                b->logit_rows[n_logits++] = t - n + i;
            }
        } else if (s->n_computed + n == s->n_tokens && s->n_tokens < s->max_total) {
            b->logit_seq[n_logits] = k;
            b->logit_rows[n_logits++] = t - 1;
        }
    }
    *out = sched_batch_view(b, p->n_seqs, t, width, n_logits);
}
