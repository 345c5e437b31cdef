/* test_engine.c — the scheduler, KV block pool and sampler, driven through a mock
 * backend.  The mock stores each token id in its KV slot and derives the logits of a
 * position from the whole context it reads back through the block table, so any
 * mistake in slot mapping, block tables, chunking or preemption changes the output. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "test.h"

typedef struct mock {
    int32_t *slot_token;  /* (num_blocks * block_size) token id stored in each slot */
    int32_t *slot_pos;    /* (num_blocks * block_size) position stored in each slot */
    int num_blocks;
    int bad_reads;        /* context reads that found the wrong position in a slot */
    int max_tokens_seen;
    float *rows;          /* (max rows, n_vocab) forward_sample's logits */
    void *scratch;        /* sampler_scratch_bytes(n_vocab) */
    int sampled_rows;     /* rows forward_sample picked a token for */
} mock;

static size_t mock_block_bytes(const llmi_backend *b) { return (size_t)b->opts.block_size * 8; }
static size_t mock_budget(const llmi_backend *b) { return (size_t)1 << 20; }

static int mock_kv_alloc(llmi_backend *b, int num_blocks, llmi_status *st) {
    mock *mk = b->impl;
    size_t n = (size_t)num_blocks * b->opts.block_size;
    mk->slot_token = malloc(n * sizeof(int32_t));
    mk->slot_pos = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) mk->slot_pos[i] = -1;
    mk->num_blocks = num_blocks;
    b->num_blocks = num_blocks;
    return LLMI_OK;
}

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
}

static int mock_forward(llmi_backend *b, const llmi_batch *bt, float *logits, llmi_status *st) {
    mock *mk = b->impl;
    int bs = b->opts.block_size, V = b->model->cfg.n_vocab;
    if (bt->n_tokens > mk->max_tokens_seen) mk->max_tokens_seen = bt->n_tokens;
    for (int t = 0; t < bt->n_tokens; t++) {
        mk->slot_token[bt->slot_mapping[t]] = bt->tokens[t];
        mk->slot_pos[bt->slot_mapping[t]] = bt->positions[t];
    }
    for (int r = 0; r < bt->n_logits; r++) {
        int t = bt->logit_rows[r];
        int s = bt->seq_of_token[t];
        const int32_t *table = bt->block_tables + (size_t)s * bt->max_blocks_per_seq;
        uint64_t h = 1469598103934665603ull;
        for (int p = 0; p <= bt->positions[t]; p++) {
            int slot = table[p / bs] * bs + p % bs;
            if (mk->slot_pos[slot] != p) mk->bad_reads++;
            h = mix(h, (uint64_t)mk->slot_token[slot]);
        }
        for (int v = 0; v < V; v++) logits[(size_t)r * V + v] = (float)(mix(h, (uint64_t)v) >> 40) / (float)(1 << 24) * 4.0f;
    }
    return LLMI_OK;
}

/* A backend that samples "on the device": the same logits, then sampler_sample_uniform
 * with the window and uniform the engine sent, as a GPU backend must. */
static int mock_forward_sample(llmi_backend *b, const llmi_batch *bt, const llmi_sample_row *rows, int32_t *tokens,
                               llmi_status *st) {
    mock *mk = b->impl;
    int V = b->model->cfg.n_vocab;
    if (mock_forward(b, bt, mk->rows, st)) return st->code;
    for (int r = 0; r < bt->n_logits; r++) {
        float *x = mk->rows + (size_t)r * V;
        if (rows[r].logits) memcpy(rows[r].logits, x, (size_t)V * sizeof(float));
        llmi_sampling sp = {.temperature = rows[r].temperature, .top_k = rows[r].top_k, .top_p = rows[r].top_p,
                            .min_p = rows[r].min_p, .repeat_penalty = rows[r].repeat_penalty, .repeat_last_n = 0};
        tokens[r] = sampler_sample_uniform(x, V, &sp, rows[r].window, rows[r].n_window, rows[r].uniform, mk->scratch);
        mk->sampled_rows++;
    }
    return LLMI_OK;
}

static void mock_destroy(llmi_backend *b) {
    mock *mk = b->impl;
    free(mk->rows);
    free(mk->scratch);
    free(mk->slot_token);
    free(mk->slot_pos);
    free(mk);
    free(b);
}

static llmi_backend *mock_create(const llmi_model *m, int block_size) {
    llmi_backend *b = calloc(1, sizeof *b);
    b->name = "mock";
    b->model = m;
    b->opts.block_size = block_size;
    b->impl = calloc(1, sizeof(mock));
    b->kv_block_bytes = mock_block_bytes;
    b->kv_budget_bytes = mock_budget;
    b->kv_alloc = mock_kv_alloc;
    b->forward = mock_forward;
    b->destroy = mock_destroy;
    return b;
}

static llmi_model mock_model(int n_vocab) {
    llmi_model m;
    memset(&m, 0, sizeof m);
    m.cfg.n_vocab = n_vocab;
    m.cfg.max_ctx = 4096;
    return m;
}

typedef struct run_out {
    int32_t *toks[64];    /* generated ids per request */
    int n[64];
    llmi_finish fin[64];
    int preempted;
    int bad_reads;
    int max_step_tokens;
    int sampled_on_device;
    double logprob_sum;   /* of every event's logprob and top logprobs */
} run_out;

static void collect(void *ctx, const llmi_token_event *ev) {
    run_out *o = ctx;
    int i = (int)(intptr_t)ev->user;
    if (ev->token >= 0) o->toks[i][o->n[i]++] = ev->token;
    if (ev->token >= 0 && ev->n_top > 0) {
        o->logprob_sum += ev->logprob;
        for (int k = 0; k < ev->n_top; k++) o->logprob_sum += ev->top_logprobs[k] + ev->top_ids[k];
    }
    if (ev->finished) o->fin[i] = ev->reason;
}

/* Runs the prompts through a fresh engine; together = all queued at once, else one by
 * one; on_device: the backend samples (forward_sample) instead of the engine. */
static int run_engine_on(const llmi_model *m, int32_t **prompts, const int *lens, int n_req, int max_new,
                         llmi_engine_opts eo, bool together, const llmi_sampling *samp, int logprobs, bool on_device,
                         run_out *out) {
    memset(out, 0, sizeof *out);
    llmi_backend *b = mock_create(m, eo.block_size);
    if (on_device) {
        mock *mk = b->impl;
        mk->rows = malloc((size_t)eo.max_seqs * m->cfg.n_vocab * sizeof(float));
        mk->scratch = malloc(sampler_scratch_bytes(m->cfg.n_vocab));
        b->forward_sample = mock_forward_sample;
    }
    llmi_engine *e = NULL;
    llmi_status st = {0};
    if (engine_create(m, b, &eo, &e, &st)) {
        fprintf(stderr, "  engine_create: %s\n", st.msg);
        b->destroy(b);
        return -1;
    }
    llmi_request_params p = request_params_defaults();
    p.max_tokens = max_new;
    p.sampling.temperature = 0;
    if (samp) p.sampling = *samp;
    p.logprobs = logprobs;
    for (int i = 0; i < n_req; i++) out->toks[i] = calloc((size_t)max_new + 1, sizeof(int32_t));
    int rc = 0;
    for (int start = 0; start < n_req && !rc; start = together ? n_req : start + 1) {
        int end = together ? n_req : start + 1;
        for (int i = start; i < end; i++) {
            int id;
            if (engine_add_request(e, prompts[i], lens[i], &p, (void *)(intptr_t)i, &id, &st)) {
                fprintf(stderr, "  add: %s\n", st.msg);
                rc = -1;
            }
        }
        while (!rc && engine_has_work(e)) {
            llmi_step_info info;
            if (engine_step(e, collect, out, &info, &st)) {
                fprintf(stderr, "  step: %s\n", st.msg);
                rc = -1;
            }
            out->preempted += info.n_preempted;
            if (info.n_prefill_tokens + info.n_decode_tokens > out->max_step_tokens)
                out->max_step_tokens = info.n_prefill_tokens + info.n_decode_tokens;
        }
    }
    out->bad_reads = ((mock *)b->impl)->bad_reads;
    out->sampled_on_device = ((mock *)b->impl)->sampled_rows;
    engine_destroy(e);
    b->destroy(b);
    return rc;
}

static int run_engine(const llmi_model *m, int32_t **prompts, const int *lens, int n_req, int max_new,
                      llmi_engine_opts eo, bool together, const llmi_sampling *samp, run_out *out) {
    return run_engine_on(m, prompts, lens, n_req, max_new, eo, together, samp, 0, false, out);
}

/* n prompts of 1..max_len tokens below n_vocab, from rand(); free each prompts[i]. */
static void random_prompts(int32_t **prompts, int *lens, int n, int max_len, int n_vocab) {
    for (int i = 0; i < n; i++) {
        lens[i] = 1 + rand() % max_len;
        prompts[i] = malloc((size_t)lens[i] * sizeof(int32_t));
        for (int k = 0; k < lens[i]; k++) prompts[i][k] = rand() % n_vocab;
    }
}

static void free_out(run_out *o, int n) {
    for (int i = 0; i < n; i++) free(o->toks[i]);
}

static bool same_outputs(const run_out *a, const run_out *b, int n) {
    for (int i = 0; i < n; i++) {
        if (a->n[i] != b->n[i]) return false;
        if (memcmp(a->toks[i], b->toks[i], (size_t)a->n[i] * sizeof(int32_t))) return false;
    }
    return true;
}

TEST(kvcache_pool_accounting) {
    kvcache kv;
    llmi_status st = {0};
    CHECK(kvcache_init(&kv, 10, 4, false, (kv_hash){0, 0}, &st) == 0);
    kvcache_table a = {0}, b = {0};
    CHECK(kvcache_reserve(&kv, &a, 9) == 0);  /* 3 blocks */
    CHECK(a.n_blocks == 3);
    CHECK(kvcache_reserve(&kv, &a, 12) == 0); /* still 3 */
    CHECK(a.n_blocks == 3);
    CHECK(kvcache_reserve(&kv, &b, 29) == -1); /* 8 blocks, only 7 free */
    CHECK(b.n_blocks == 0 && kvcache_used(&kv) == 3);
    CHECK(kvcache_reserve(&kv, &b, 28) == 0);  /* exactly the 7 left */
    CHECK(kvcache_used(&kv) == 10 && kv.peak_used == 10);
    kvcache_release(&kv, &a);
    kvcache_release(&kv, &b);
    CHECK(kvcache_used(&kv) == 0);
    CHECK(kvcache_reserve(&kv, &b, 41) == -1); /* 11 blocks never fit */
    CHECK(b.n_blocks == 0);
    /* All ids distinct while held. */
    kvcache_table c = {0};
    CHECK(kvcache_reserve(&kv, &c, 40) == 0);
    int seen[10] = {0};
    for (int i = 0; i < c.n_blocks; i++) seen[c.blocks[i]]++;
    for (int i = 0; i < 10; i++) CHECK(seen[i] == 1);
    kvcache_release(&kv, &c);
    kvcache_table_free(&a);
    kvcache_table_free(&b);
    kvcache_table_free(&c);
    kvcache_free(&kv);
}

TEST(engine_batch_invariance_chunking_preemption) {
    srand((unsigned)test_seed());
    llmi_model m = mock_model(97);
    enum { N = 18 };
    int32_t *prompts[N];
    int lens[N];
    random_prompts(prompts, lens, N, 70, 97);
    int max_new = 24;
    llmi_engine_opts base = engine_opts_defaults();
    base.num_blocks = 256;
    base.block_size = 16;
    base.max_batch_tokens = 256;
    run_out alone, together, chunk1, chunk3, chunk16, tight, pf;
    CHECK(run_engine(&m, prompts, lens, N, max_new, base, false, NULL, &alone) == 0);
    CHECK(run_engine(&m, prompts, lens, N, max_new, base, true, NULL, &together) == 0);
    llmi_engine_opts o = base;
    o.prefill_chunk = 1;
    CHECK(run_engine(&m, prompts, lens, N, max_new, o, true, NULL, &chunk1) == 0);
    o.prefill_chunk = 3;
    o.block_size = 5;
    CHECK(run_engine(&m, prompts, lens, N, max_new, o, true, NULL, &chunk3) == 0);
    o = base;
    o.prefill_chunk = 16;
    o.max_batch_tokens = 40;
    CHECK(run_engine(&m, prompts, lens, N, max_new, o, true, NULL, &chunk16) == 0);
    CHECK(chunk16.max_step_tokens <= 40);
    o = base;
    o.num_blocks = 12; /* 192 slots for 18 requests of up to 94 tokens: must preempt */
    CHECK(run_engine(&m, prompts, lens, N, max_new, o, true, NULL, &tight) == 0);
    o = base;
    o.policy = SCHED_PREFILL_FIRST;
    o.prefill_chunk = 7;
    CHECK(run_engine(&m, prompts, lens, N, max_new, o, true, NULL, &pf) == 0);

    for (int i = 0; i < N; i++) CHECK_MSG(alone.n[i] == max_new, "request %d generated %d", i, alone.n[i]);
    CHECK(alone.bad_reads == 0 && together.bad_reads == 0 && chunk1.bad_reads == 0 && chunk3.bad_reads == 0 &&
          chunk16.bad_reads == 0 && tight.bad_reads == 0 && pf.bad_reads == 0);
    CHECK(same_outputs(&alone, &together, N));
    CHECK(same_outputs(&alone, &chunk1, N));
    CHECK(same_outputs(&alone, &chunk3, N));
    CHECK(same_outputs(&alone, &chunk16, N));
    CHECK(same_outputs(&alone, &pf, N));
    CHECK_MSG(tight.preempted > 0, "a 12-block cache should force preemption");
    CHECK(same_outputs(&alone, &tight, N));
    free_out(&alone, N);
    free_out(&together, N);
    free_out(&chunk1, N);
    free_out(&chunk3, N);
    free_out(&chunk16, N);
    free_out(&tight, N);
    free_out(&pf, N);
    for (int i = 0; i < N; i++) free(prompts[i]);
}

TEST(engine_refuses_what_cannot_fit) {
    llmi_model m = mock_model(50);
    m.cfg.max_ctx = 64;
    llmi_engine_opts eo = engine_opts_defaults();
    eo.num_blocks = 2;
    eo.block_size = 16;
    llmi_backend *b = mock_create(&m, 16);
    llmi_engine *e = NULL;
    llmi_status st = {0};
    CHECK(engine_create(&m, b, &eo, &e, &st) == 0);
    int32_t prompt[100] = {0};
    llmi_request_params p = request_params_defaults();
    int id;
    llmi_status s1 = {0}, s2 = {0}, s3 = {0};
    CHECK(engine_add_request(e, prompt, 40, &p, NULL, &id, &s1) != 0); /* 3 blocks > 2 */
    CHECK(strstr(s1.msg, "KV blocks") != NULL);
    CHECK(engine_add_request(e, prompt, 65, &p, NULL, &id, &s2) != 0); /* > context */
    CHECK(strstr(s2.msg, "context") != NULL);
    prompt[0] = 50;
    CHECK(engine_add_request(e, prompt, 3, &p, NULL, &id, &s3) != 0);  /* id outside vocab */
    engine_destroy(e);
    b->destroy(b);
}

TEST(engine_prompt_only_and_length) {
    llmi_model m = mock_model(31);
    int32_t p1[5] = {1, 2, 3, 4, 5};
    int32_t *prompts[1] = {p1};
    int lens[1] = {5};
    run_out o0, o7;
    llmi_engine_opts eo = engine_opts_defaults();
    eo.num_blocks = 8;
    CHECK(run_engine(&m, prompts, lens, 1, 0, eo, true, NULL, &o0) == 0);
    CHECK(o0.n[0] == 0 && o0.fin[0] == LLMI_FINISH_LENGTH);
    CHECK(run_engine(&m, prompts, lens, 1, 7, eo, true, NULL, &o7) == 0);
    CHECK(o7.n[0] == 7 && o7.fin[0] == LLMI_FINISH_LENGTH);
    /* Context end: a 16-token context leaves 11 tokens to generate. */
    m.cfg.max_ctx = 16;
    run_out oc;
    CHECK(run_engine(&m, prompts, lens, 1, 100, eo, true, NULL, &oc) == 0);
    CHECK(oc.n[0] == 11 && oc.fin[0] == LLMI_FINISH_CONTEXT);
    free_out(&o0, 1);
    free_out(&o7, 1);
    free_out(&oc, 1);
}

TEST(engine_seeds_reproduce_and_differ) {
    llmi_model m = mock_model(200);
    int32_t p1[3] = {7, 8, 9};
    int32_t *prompts[2] = {p1, p1};
    int lens[2] = {3, 3};
    llmi_engine_opts eo = engine_opts_defaults();
    eo.num_blocks = 32;
    llmi_sampling s = sampling_defaults();
    s.temperature = 1.5f;
    s.top_k = 0;
    s.top_p = 1.0f;
    s.min_p = 0;
    s.seed = test_seed();
    run_out a, b, c;
    CHECK(run_engine(&m, prompts, lens, 1, 32, eo, true, &s, &a) == 0);
    CHECK(run_engine(&m, prompts, lens, 2, 32, eo, true, &s, &b) == 0); /* batched with a twin */
    s.seed += 1;
    CHECK(run_engine(&m, prompts, lens, 1, 32, eo, true, &s, &c) == 0);
    CHECK(a.n[0] == 32 && memcmp(a.toks[0], b.toks[0], 32 * sizeof(int32_t)) == 0);
    CHECK(memcmp(b.toks[0], b.toks[1], 32 * sizeof(int32_t)) == 0);
    CHECK(memcmp(a.toks[0], c.toks[0], 32 * sizeof(int32_t)) != 0);
    free_out(&a, 1);
    free_out(&b, 2);
    free_out(&c, 1);
}

TEST(sampler_rules) {
    enum { V = 1000 };
    float logits[V], work[V];
    void *scratch = malloc(sampler_scratch_bytes(V));
    srand((unsigned)test_seed());
    for (int i = 0; i < V; i++) logits[i] = (float)(rand() % 10000) / 1000.0f;
    int best = 0;
    for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
    sampler_rng rng;
    sampler_rng_seed(&rng, test_seed());
    llmi_sampling p = sampling_defaults();
    p.temperature = 0;
    memcpy(work, logits, sizeof work);
    CHECK(sampler_sample(work, V, &p, NULL, 0, &rng, scratch) == best);
    p.temperature = 1.0f;
    p.top_k = 1;
    memcpy(work, logits, sizeof work);
    CHECK(sampler_sample(work, V, &p, NULL, 0, &rng, scratch) == best);
    p.top_k = 0;
    p.top_p = 1e-6f;
    p.min_p = 0;
    memcpy(work, logits, sizeof work);
    CHECK(sampler_sample(work, V, &p, NULL, 0, &rng, scratch) == best);
    /* top-k draws only among the k best, and reaches each of them. */
    {
        llmi_sampling tk = {.temperature = 3.0f, .top_k = 5, .top_p = 1.0f, .min_p = 0, .repeat_penalty = 1.0f};
        float sorted[V];
        memcpy(sorted, logits, sizeof sorted);
        for (int i = 0; i < 5; i++)
            for (int j = i + 1; j < V; j++)
                if (sorted[j] > sorted[i]) { float t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t; }
        int hits[V];
        memset(hits, 0, sizeof hits);
        for (int k = 0; k < 3000; k++) {
            memcpy(work, logits, sizeof work);
            int32_t t = sampler_sample(work, V, &tk, NULL, 0, &rng, scratch);
            CHECK(logits[t] >= sorted[4]);
            hits[t]++;
        }
        int distinct = 0;
        for (int i = 0; i < V; i++) distinct += hits[i] > 0;
        CHECK_MSG(distinct >= 4, "top-k 5 at temperature 3 reached only %d tokens", distinct);
    }
    /* min-p keeps only tokens within log(min_p) of the best. */
    p.top_p = 1.0f;
    p.min_p = 0.5f;
    for (int k = 0; k < 200; k++) {
        memcpy(work, logits, sizeof work);
        int32_t t = sampler_sample(work, V, &p, NULL, 0, &rng, scratch);
        CHECK(logits[t] >= logits[best] + logf(0.5f) - 1e-6f);
    }
    /* Frequencies follow softmax(logits / T) over a 3-token vocabulary. */
    float three[3] = {0.0f, 1.0f, 2.0f}, w3[3];
    void *s3 = malloc(sampler_scratch_bytes(3));
    llmi_sampling q = {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .repeat_penalty = 1.0f};
    int counts[3] = {0};
    int draws = 60000;
    for (int k = 0; k < draws; k++) {
        memcpy(w3, three, sizeof w3);
        counts[sampler_sample(w3, 3, &q, NULL, 0, &rng, s3)]++;
    }
    double z = 0, pr[3];
    for (int i = 0; i < 3; i++) z += exp(three[i] / 0.7);
    for (int i = 0; i < 3; i++) {
        pr[i] = exp(three[i] / 0.7) / z;
        double sd = sqrt(draws * pr[i] * (1 - pr[i]));
        CHECK_MSG(fabs(counts[i] - draws * pr[i]) < 5 * sd, "token %d drawn %d times, expected %.0f", i, counts[i],
                  draws * pr[i]);
    }
    /* Repetition penalty: a repeated best token loses to the runner-up. */
    float rp[3] = {2.0f, 1.9f, -1.0f};
    int32_t hist[4] = {0, 0, 2, 0};
    llmi_sampling g = {.temperature = 0, .repeat_penalty = 1.2f, .repeat_last_n = 64};
    CHECK(sampler_sample(rp, 3, &g, hist, 4, &rng, s3) == 1);
    CHECK(fabsf(rp[0] - 2.0f / 1.2f) < 1e-6f && fabsf(rp[2] - (-1.2f)) < 1e-6f && rp[1] == 1.9f);
    /* Log-probabilities: top list sorted and normalised. */
    int32_t ids[5];
    float lps[5];
    float lp = sampler_logprob(logits, V, best, 5, ids, lps);
    CHECK(ids[0] == best && fabsf(lp - lps[0]) < 1e-6f);
    for (int i = 1; i < 5; i++) CHECK(lps[i] <= lps[i - 1]);
    double total = 0;
    for (int i = 0; i < V; i++) total += exp(sampler_logprob(logits, V, i, 0, NULL, NULL));
    CHECK(fabs(total - 1.0) < 1e-4);
    free(scratch);
    free(s3);
}

/* Device sampling (forward_sample) gives every request the tokens and logprobs host
 * sampling gives it: the engine draws each uniform from the request's own rng exactly
 * when sampler_sample would, hands over the penalty window, and takes logprobs from the
 * raw logits the backend copies back for the rows that ask.  Batched, chunked and
 * preempted runs included. */
TEST(engine_device_sampling_matches_host) {
    srand((unsigned)test_seed());
    llmi_model m = mock_model(211);
    enum { N = 12 };
    int32_t *prompts[N];
    int lens[N];
    random_prompts(prompts, lens, N, 50, 211);
    llmi_engine_opts eo = engine_opts_defaults();
    eo.num_blocks = 64;
    eo.block_size = 8;
    eo.max_batch_tokens = 64;
    eo.max_seqs = 8;
    eo.prefill_chunk = 9;
    llmi_sampling cfgs[4] = {sampling_defaults(), sampling_defaults(), sampling_defaults(), sampling_defaults()};
    cfgs[0].temperature = 0;                                            /* greedy: no draws */
    cfgs[1].repeat_penalty = 1.3f; cfgs[1].repeat_last_n = 16;          /* defaults + a penalty window */
    cfgs[2].top_k = 0; cfgs[2].top_p = 1.0f; cfgs[2].min_p = 0; cfgs[2].temperature = 1.4f;
    cfgs[3].top_p = 0.0f; cfgs[3].repeat_penalty = 1.1f; cfgs[3].repeat_last_n = -1;
    for (int c = 0; c < 4; c++) {
        cfgs[c].seed = test_seed() + (uint64_t)c;
        for (int tight = 0; tight < 2; tight++) {
            llmi_engine_opts o = eo;
            if (tight) o.num_blocks = 14;   /* forces preemption */
            run_out host, dev;
            int lp = c == 1 ? 3 : 0;
            CHECK(run_engine_on(&m, prompts, lens, N, 20, o, true, &cfgs[c], lp, false, &host) == 0);
            CHECK(run_engine_on(&m, prompts, lens, N, 20, o, true, &cfgs[c], lp, true, &dev) == 0);
            CHECK(dev.sampled_on_device >= N * 20 && host.sampled_on_device == 0);
            CHECK_MSG(same_outputs(&host, &dev, N), "sampling config %d%s: device and host tokens differ", c,
                      tight ? " (preempted)" : "");
            CHECK(host.logprob_sum == dev.logprob_sum);
            if (lp) CHECK(host.logprob_sum != 0);
            if (tight) CHECK(dev.preempted > 0);
            free_out(&host, N);
            free_out(&dev, N);
        }
    }
    for (int i = 0; i < N; i++) free(prompts[i]);
}
