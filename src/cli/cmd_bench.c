/* cmd_bench.c — `llmi bench`: three measurements over one engine.
 *
 *   sweep       (default) llama-bench-shaped: every combination of -p, -n, -b, --kv-type,
 *               --block-size, each run -r times after a warm-up; one row per combination.
 *   throughput  (--num-requests / --dataset) `vllm bench throughput`-shaped: N requests
 *               served by continuous batching, all at t = 0 or as Poisson arrivals
 *               (--request-rate); one row of rates and latency percentiles.
 *   perplexity  (--ppl FILE) llama-perplexity's rule (perplexity.h); one row.
 *
 * How the sweep splits time: a step that carries any prompt token is prefill time (its
 * prompt tokens count); a step of decode tokens only is decode time.  With -b 1 that is
 * exactly "tokens after the first over the time after the first token", the figure
 * `llmi generate` reports.  Wall time is taken around each engine_step, callbacks included.
 * stdout carries only the report; progress and the running perplexity go to stderr. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "model/model_dummy.h"
#include "metrics/perplexity.h"
#include "cli/report.h"
#include "metrics/stats.h"
#include "tok/tokenizer.h"

#define BENCH_MAX_KV 3

typedef struct bench_args {
    cli_model_opts mo;
    long *p, *n, *b, *bs;        /* sweep lists: (np), (nn), (nb), (nbs) */
    int np, nn, nb, nbs;
    llmi_kv_dtype kv[BENCH_MAX_KV];
    int nkv;
    int reps, warmup;
    report_format fmt;
    uint64_t seed;
    /* throughput */
    bool throughput;
    int num_requests;            /* 0 = every dataset line */
    int input_len, output_len;
    double range_ratio;
    const char *dataset;
    double request_rate;         /* requests/s; 0 = all at t = 0 */
    const char *per_request;     /* jsonl of every request, or NULL */
    /* perplexity */
    const char *ppl;
    int chunks;
    /* --out FMT:FILE: the same rows in more formats, from the same run */
    int n_out;
    report_format out_fmt[4];
    const char *out_path[4];
} bench_args;

/* A growable array of doubles (samples). */
typedef struct dvec { double *v; int n, cap; } dvec;

static int dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        double *v = realloc(d->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
    return 0;
}

static bool interrupted(void) { return cli_interrupted && *cli_interrupted; }

static const char *bench_usage(void) {
    return "usage: llmi bench [-m MODEL | --dummy PRESET|config.json] [options]\n"
           "sweep (default; every list is comma-separated and every combination runs):\n"
           "  -p LIST                 prompt lengths (default 512)\n"
           "  -n LIST                 generated lengths (default 128; 0 = prefill only)\n"
           "  -b LIST                 concurrent sequences (default 1)\n"
           "  --kv-type LIST          KV cache dtypes: f32, f16, bf16 (default f32)\n"
           "  --block-size LIST       KV block sizes in tokens (default 16)\n"
           "  -r N                    repetitions (default 5)   --warmup N  warm-up runs (default 1)\n"
           "throughput (--num-requests or --dataset):\n"
           "  --num-requests N        requests to serve (default 1000 with random prompts)\n"
           "  --input-len N           prompt tokens (default 128)   --output-len N  generated (default 128)\n"
           "  --range-ratio R         lengths uniform in [L*(1-R), L*(1+R)] (default 0)\n"
           "  --dataset FILE          prompts: text lines or JSONL {\"prompt\", \"max_tokens\"} (needs a tokenizer)\n"
           "  --request-rate R        Poisson arrivals, R requests/s (default: all at t = 0)\n"
           "  --per-request FILE      write one JSON line per request\n"
           "perplexity:\n"
           "  --ppl FILE              llama-perplexity rule; -c window (default 512), --chunks N\n"
           "output:\n"
           "  -o md|csv|json|jsonl    (default md)   --seed N  prompts, lengths, arrivals (default 42)\n"
           "  --out FMT:FILE          also write the same rows as FMT to FILE (repeatable)\n";
}

static int parse_args(int argc, char **argv, bench_args *a, bool *help, llmi_status *st) {
    cli_model_opts_init(&a->mo);
    a->reps = 5;
    a->warmup = 1;
    a->fmt = REPORT_MD;
    a->seed = 42;
    a->input_len = 128;
    a->output_len = 128;
    a->chunks = -1;
    a->nkv = 0;
    bool lists_sweep = false;
    for (int i = 0; i < argc; i++) {  /* main.c passes the arguments after "bench" */
        const char *f = argv[i], *v;
        long n;
        double d;
        int rc;
#define VAL() do { if (!(v = cli_flag_value(argc, argv, &i, st))) return st->code; } while (0)
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { *help = true; return 0; }
        if (!strcmp(f, "-p")) { VAL(); free(a->p); if (cli_parse_long_list(f, v, 1, 1 << 20, &a->p, &a->np, st)) return st->code; lists_sweep = true; continue; }
        if (!strcmp(f, "-n")) { VAL(); free(a->n); if (cli_parse_long_list(f, v, 0, 1 << 20, &a->n, &a->nn, st)) return st->code; lists_sweep = true; continue; }
        if (!strcmp(f, "-b")) { VAL(); free(a->b); if (cli_parse_long_list(f, v, 1, 1 << 16, &a->b, &a->nb, st)) return st->code; lists_sweep = true; continue; }
        if (!strcmp(f, "--block-size")) { VAL(); free(a->bs); if (cli_parse_long_list(f, v, 1, 1024, &a->bs, &a->nbs, st)) return st->code; continue; }
        if (!strcmp(f, "--kv-type")) {
            VAL();
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            a->nkv = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (a->nkv == BENCH_MAX_KV || bench_kv_parse(t, &a->kv[a->nkv]))
                    return llmi_fail(st, LLMI_E_USAGE, "--kv-type: '%s' is not a list of f32, f16, bf16", v);
                a->nkv++;
            }
            if (a->nkv == 0) return llmi_fail(st, LLMI_E_USAGE, "--kv-type: empty list");
            continue;
        }
        if (!strcmp(f, "-r")) { VAL(); if (cli_parse_long(f, v, 1, 1000, &n, st)) return st->code; a->reps = (int)n; continue; }
        if (!strcmp(f, "--warmup")) { VAL(); if (cli_parse_long(f, v, 0, 100, &n, st)) return st->code; a->warmup = (int)n; continue; }
        if (!strcmp(f, "-o")) { VAL(); if (report_format_parse(v, &a->fmt, st)) return st->code; continue; }
        if (!strcmp(f, "--seed")) { VAL(); if (cli_parse_long(f, v, 0, 0x7fffffffL, &n, st)) return st->code; a->seed = (uint64_t)n; continue; }
        if (!strcmp(f, "--num-requests")) { VAL(); if (cli_parse_long(f, v, 1, 1000000, &n, st)) return st->code; a->num_requests = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--input-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->input_len = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--output-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->output_len = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--range-ratio")) { VAL(); if (cli_parse_float(f, v, 0, 0.999, &d, st)) return st->code; a->range_ratio = d; a->throughput = true; continue; }
        if (!strcmp(f, "--dataset")) { VAL(); a->dataset = v; a->throughput = true; continue; }
        if (!strcmp(f, "--request-rate")) { VAL(); if (cli_parse_float(f, v, 1e-6, 1e9, &d, st)) return st->code; a->request_rate = d; a->throughput = true; continue; }
        if (!strcmp(f, "--per-request")) { VAL(); a->per_request = v; continue; }
        if (!strcmp(f, "--out")) {
            VAL();
            const char *colon = strchr(v, ':');
            char fmt[16];
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof fmt || !colon[1])
                return llmi_fail(st, LLMI_E_USAGE, "--out %s: expected FORMAT:FILE, e.g. csv:bench.csv", v);
            if (a->n_out == 4) return llmi_fail(st, LLMI_E_USAGE, "--out: at most 4 of them");
            memcpy(fmt, v, (size_t)(colon - v));
            fmt[colon - v] = '\0';
            if (report_format_parse(fmt, &a->out_fmt[a->n_out], st)) return st->code;
            a->out_path[a->n_out++] = colon + 1;
            continue;
        }
        if (!strcmp(f, "--ppl")) { VAL(); a->ppl = v; continue; }
        if (!strcmp(f, "--chunks")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 24, &n, st)) return st->code; a->chunks = (int)n; continue; }
#undef VAL
        rc = cli_parse_model_flag(&a->mo, argc, argv, &i, st);
        if (rc < 0) return st->code;
        if (rc == 0) return llmi_fail(st, LLMI_E_USAGE, "bench: unknown flag '%s' (see llmi bench --help)", f);
    }
    if (a->ppl && (a->throughput || lists_sweep))
        return llmi_fail(st, LLMI_E_USAGE, "--ppl: cannot be combined with sweep (-p/-n/-b) or throughput flags");
    if (a->throughput && lists_sweep)
        return llmi_fail(st, LLMI_E_USAGE, "bench: -p/-n/-b (sweep) and --num-requests/--dataset (throughput) are different modes");
    if (a->ppl && a->mo.dummy) return llmi_fail(st, LLMI_E_USAGE, "--ppl: needs a tokenizer, which --dummy models lack");
    if (a->dataset && a->mo.dummy) return llmi_fail(st, LLMI_E_USAGE, "--dataset: needs a tokenizer, which --dummy models lack");
    if (!a->p) { a->p = malloc(sizeof(long)); if (!a->p) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->p[0] = 512; a->np = 1; }
    if (!a->n) { a->n = malloc(sizeof(long)); if (!a->n) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->n[0] = 128; a->nn = 1; }
    if (!a->b) { a->b = malloc(sizeof(long)); if (!a->b) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->b[0] = 1; a->nb = 1; }
    if (!a->bs) { a->bs = malloc(sizeof(long)); if (!a->bs) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->bs[0] = a->mo.engine.block_size; a->nbs = 1; }
    if (a->nkv == 0) { a->kv[0] = a->mo.backend.kv_dtype; a->nkv = 1; }
    if (a->throughput && !a->dataset && a->num_requests == 0) a->num_requests = 1000;
    return 0;
}

static long blocks_for(long tokens, long bs) { return (tokens + bs - 1) / bs; }

static int ctx_of(const bench_args *a, const llmi_model *m) {
    return a->mo.engine.max_ctx > 0 ? a->mo.engine.max_ctx : m->cfg.max_ctx;
}

/* Opens backend + engine for one (kv dtype, block size); need_blocks sizes the KV cache
 * unless --num-blocks / --kv-mem said otherwise; max_seqs at least max_b. */
static int open_engine(const bench_args *a, const llmi_model *m, llmi_kv_dtype kv, int bs, long need_blocks,
                       int max_b, llmi_backend **b, llmi_engine **e, llmi_status *st) {
    cli_model_opts o = a->mo;
    o.backend.kv_dtype = kv;
    o.engine.block_size = bs;
    if (o.engine.max_seqs < max_b) o.engine.max_seqs = max_b;
    const bool sized_by_us = o.engine.num_blocks == 0 && o.engine.kv_mem_bytes == 0;
    if (sized_by_us) o.engine.num_blocks = (int)(need_blocks < (1L << 30) ? need_blocks : (1L << 30));
    *e = NULL;
    if (cli_open_backend(&o, m, b, st)) return st->code;
    llmi_engine_opts eo = o.engine;
    /* More than the backend can hold (many long requests): let the engine size the cache
     * from the backend's budget; requests then queue or get preempted. */
    size_t per_block = (*b)->kv_block_bytes(*b);
    if (sized_by_us && per_block && (size_t)eo.num_blocks > (*b)->kv_budget_bytes(*b) / per_block) eo.num_blocks = 0;
    eo.max_batch_tokens = (*b)->opts.max_batch_tokens;
    if (eo.max_seqs > eo.max_batch_tokens) eo.max_seqs = eo.max_batch_tokens;
    if (engine_create(m, *b, &eo, e, st)) {
        (*b)->destroy(*b);
        *b = NULL;
        return st->code;
    }
    return 0;
}

static void close_engine(llmi_backend *b, llmi_engine *e) {
    engine_destroy(e);
    if (b) b->destroy(b);
}

static void add_memory(report *r, const llmi_backend *b, const llmi_engine *e, size_t peak_rss) {
    size_t w = 0, kv = 0, act = 0;
    if (b->memory) b->memory(b, &w, &kv, &act);
    const double MiB = 1024.0 * 1024.0;
    report_num(r, "peak_rss_mib", (double)peak_rss / MiB, 1);
    report_num(r, "mem_weights_mib", (double)b->model->weight_bytes / MiB, 1);
    report_num(r, "mem_backend_weights_mib", (double)w / MiB, 1);
    report_num(r, "mem_kv_mib", (double)kv / MiB, 1);
    report_num(r, "mem_act_mib", (double)act / MiB, 1);
    report_int(r, "kv_blocks_total", engine_kv_blocks_total(e));
    report_int(r, "kv_blocks_peak", engine_kv_blocks_peak(e));
}

/* ------------------------------------------------------------------ sweep */

typedef struct sweep_run {
    double prefill_tokens, prefill_s, decode_tokens, decode_s;
    int preempted;
} sweep_run;

static void fill_random(stats_rng *rng, int32_t *t, int n, int n_vocab) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)stats_rng_range(rng, 0, n_vocab - 1);
}

/* One run of b requests of p random tokens, n generated each; appends per-request
 * TTFT and TPOT (seconds) to ttft/tpot when they are non-NULL. */
static int sweep_once(llmi_engine *e, const llmi_model *m, int p, int n, int b, stats_rng *rng, sweep_run *out,
                      dvec *ttft, dvec *tpot, llmi_status *st) {
    memset(out, 0, sizeof *out);
    int32_t *prompt = malloc((size_t)p * sizeof *prompt);   /* (p) */
    int *ids = malloc((size_t)b * sizeof *ids);             /* (b) */
    int rc = 0, added = 0;
    if (!prompt || !ids) { rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory"); goto done; }
    llmi_request_params rp = request_params_defaults();
    rp.max_tokens = n;
    rp.ignore_eos = true;
    rp.sampling.temperature = 0;
    for (int i = 0; i < b; i++) {
        fill_random(rng, prompt, p, m->cfg.n_vocab);
        if ((rc = engine_add_request(e, prompt, p, &rp, NULL, &ids[i], st))) goto done;
        added++;
    }
    while (engine_has_work(e)) {
        if (interrupted()) { rc = llmi_fail(st, LLMI_E_INTERRUPT, "bench: interrupted"); goto done; }
        llmi_step_info info;
        double t0 = engine_now(e);
        if ((rc = engine_step(e, NULL, NULL, &info, st))) goto done;
        double dt = engine_now(e) - t0;
        out->preempted += info.n_preempted;
        if (info.n_prefill_tokens > 0) {
            out->prefill_tokens += info.n_prefill_tokens;
            out->prefill_s += dt;
        } else {
            out->decode_tokens += info.n_decode_tokens;
            out->decode_s += dt;
        }
    }
    for (int i = 0; i < b; i++) {
        const llmi_request_info *ri = engine_request(e, ids[i]);
        if (!ri) continue;
        if (ttft) {
            double first = ri->n_generated > 0 ? ri->t_first_token : ri->t_prefill_done;
            if (dvec_push(ttft, first - ri->t_arrival)) { rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory"); goto done; }
        }
        if (tpot && ri->n_generated > 1 &&
            dvec_push(tpot, (ri->t_finish - ri->t_first_token) / (ri->n_generated - 1))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
            goto done;
        }
    }
done:
    if (rc) engine_abort_all(e, NULL, NULL);
    for (int i = 0; i < added; i++) engine_release(e, ids[i]);
    free(prompt);
    free(ids);
    return rc;
}

static void add_mean_sd(report *r, const char *key, const double *x, int n, double scale, int dec) {
    char k1[REPORT_KEY_LEN], k2[REPORT_KEY_LEN];
    snprintf(k1, sizeof k1, "%s_mean", key);
    snprintf(k2, sizeof k2, "%s_sd", key);
    report_num(r, k1, n > 0 ? stats_mean(x, n) * scale : NAN, dec);
    report_num(r, k2, n > 0 ? stats_sd(x, n) * scale : NAN, dec);
}

static int bench_sweep(const bench_args *a, const llmi_model *m, const char *label, report *rep, llmi_status *st) {
    const int ctx = ctx_of(a, m);
    int max_b = 1;
    for (int i = 0; i < a->nb; i++) max_b = a->b[i] > max_b ? (int)a->b[i] : max_b;
    /* Every row checked before any work: a request that cannot fit alone is an error. */
    for (int i = 0; i < a->np; i++)
        for (int j = 0; j < a->nn; j++)
            if (a->p[i] + a->n[j] > ctx)
                return llmi_fail(st, LLMI_E_USAGE, "-p %ld -n %ld: %ld tokens exceed the context length %d (-c)",
                                 a->p[i], a->n[j], a->p[i] + a->n[j], ctx);
    const int total_rows = a->nkv * a->nbs * a->np * a->nn * a->nb;
    bench_progress prog;
    bench_progress_init(&prog, "bench", total_rows * (a->reps + a->warmup));
    int done_runs = 0, rc = 0;
    stats_rng rng;
    stats_rng_seed(&rng, a->seed);
    for (int ik = 0; ik < a->nkv && !rc; ik++) {
        for (int ib = 0; ib < a->nbs && !rc; ib++) {
            const int bs = (int)a->bs[ib];
            long need = 0;
            for (int i = 0; i < a->np; i++)
                for (int j = 0; j < a->nn; j++)
                    for (int k = 0; k < a->nb; k++) {
                        long nb = a->b[k] * blocks_for(a->p[i] + a->n[j], bs);
                        need = nb > need ? nb : need;
                    }
            llmi_backend *b;
            llmi_engine *e;
            if ((rc = open_engine(a, m, a->kv[ik], bs, need, max_b, &b, &e, st))) break;
            const int total = engine_kv_blocks_total(e);
            for (int i = 0; i < a->np && !rc; i++)
                for (int j = 0; j < a->nn && !rc; j++)
                    if (blocks_for(a->p[i] + a->n[j], bs) > total)
                        rc = llmi_fail(st, LLMI_E_USAGE,
                                       "-p %ld -n %ld: one request needs %ld KV blocks of %d tokens, the cache has %d "
                                       "(--num-blocks/--kv-mem)",
                                       a->p[i], a->n[j], blocks_for(a->p[i] + a->n[j], bs), bs, total);
            for (int ip = 0; ip < a->np && !rc; ip++)
                for (int in = 0; in < a->nn && !rc; in++)
                    for (int ibt = 0; ibt < a->nb && !rc; ibt++) {
                        const int p = (int)a->p[ip], n = (int)a->n[in], nb = (int)a->b[ibt];
                        sweep_run run;
                        bench_peak_reset();
                        for (int w = 0; w < a->warmup && !rc; w++) {
                            /* Short: pages weights in and sizes workspaces, nothing more. */
                            rc = sweep_once(e, m, p < 32 ? p : 32, n < 2 ? n : 2, nb, &rng, &run, NULL, NULL, st);
                            bench_progress_update(&prog, ++done_runs);
                        }
                        double *pre = calloc((size_t)a->reps, sizeof *pre), *dec = calloc((size_t)a->reps, sizeof *dec);
                        dvec ttft = {0}, tpot = {0};
                        int preempted = 0, n_pre = 0, n_dec = 0;
                        if (!pre || !dec) rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
                        for (int r = 0; r < a->reps && !rc; r++) {
                            rc = sweep_once(e, m, p, n, nb, &rng, &run, &ttft, &tpot, st);
                            if (rc) break;
                            if (run.prefill_s > 0) pre[n_pre++] = run.prefill_tokens / run.prefill_s;
                            if (run.decode_s > 0 && run.decode_tokens > 0) dec[n_dec++] = run.decode_tokens / run.decode_s;
                            preempted += run.preempted;
                            bench_progress_update(&prog, ++done_runs);
                        }
                        if (!rc) {
                            report_row(rep);
                            bench_meta(rep, m, b, label, a->mo.backend.n_threads);
                            report_str(rep, "kv_type", bench_kv_name(a->kv[ik]));
                            report_int(rep, "block_size", bs);
                            report_int(rep, "n_prompt", p);
                            report_int(rep, "n_gen", n);
                            report_int(rep, "n_batch", nb);
                            report_int(rep, "reps", a->reps);
                            add_mean_sd(rep, "prefill_tps", pre, n_pre, 1, 2);
                            add_mean_sd(rep, "decode_tps", dec, n_dec, 1, 2);
                            add_mean_sd(rep, "ttft_ms", ttft.v, ttft.n, 1e3, 2);
                            add_mean_sd(rep, "tpot_ms", tpot.v, tpot.n, 1e3, 2);
                            report_int(rep, "preemptions", preempted);
                            add_memory(rep, b, e, bench_peak_rss());
                        }
                        free(pre);
                        free(dec);
                        free(ttft.v);
                        free(tpot.v);
                    }
            close_engine(b, e);
        }
    }
    bench_progress_end(&prog);
    return rc;
}

/* ------------------------------------------------------------------ throughput */

typedef struct tp_req {
    int32_t *prompt;      /* (n_prompt) */
    int n_prompt;
    int max_tokens;
    int id;               /* engine id once submitted, else -1 */
    double arrival;       /* scheduled arrival, seconds after the start */
    double submitted;     /* when the loop handed it to the engine (>= arrival) */
    double last_token;    /* engine clock of the latest token */
    /* copied from the engine when the request finishes */
    int n_generated, n_preempted;
    llmi_finish finish;
    double ttft, latency, t_first, t_finish;
} tp_req;

typedef struct tp_ctx {
    llmi_engine *e;
    tp_req *reqs;
    dvec itl;             /* every gap between consecutive tokens of a request (s) */
    bool oom;
} tp_ctx;

static void tp_on_token(void *ctx, const llmi_token_event *ev) {
    tp_ctx *c = ctx;
    tp_req *r = &c->reqs[(intptr_t)ev->user];
    if (ev->token < 0) return;
    double now = engine_now(c->e);
    if (r->last_token > 0 && dvec_push(&c->itl, now - r->last_token)) c->oom = true;
    r->last_token = now;
}

static int read_dataset(const bench_args *a, const llmi_model *m, tp_req **out, int *n_out, llmi_status *st) {
    FILE *f = fopen(a->dataset, "rb");
    if (!f) return llmi_fail(st, LLMI_E_USAGE, "--dataset %s: cannot open it", a->dataset);
    tp_req *reqs = NULL;
    int n = 0, cap = 0, rc = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    long lineno = 0;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        const char *text = line;
        size_t tlen = (size_t)len;
        int max_tokens = a->output_len;
        cJSON *j = NULL;
        if (line[0] == '{') {
            j = cJSON_Parse(line);
            const cJSON *pr = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt") : NULL;
            if (!cJSON_IsString(pr)) {
                cJSON_Delete(j);
                rc = llmi_fail(st, LLMI_E_USAGE, "--dataset %s:%ld: a JSON line needs a string \"prompt\"", a->dataset, lineno);
                break;
            }
            text = pr->valuestring;
            tlen = strlen(text);
            const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
            if (mt) {
                if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > (1 << 20) ||
                    mt->valuedouble != floor(mt->valuedouble)) {
                    cJSON_Delete(j);
                    rc = llmi_fail(st, LLMI_E_USAGE, "--dataset %s:%ld: \"max_tokens\" must be a positive integer",
                                   a->dataset, lineno);
                    break;
                }
                max_tokens = (int)mt->valuedouble;
            }
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            tp_req *nr = realloc(reqs, (size_t)cap * sizeof *nr);
            if (!nr) { cJSON_Delete(j); rc = llmi_fail(st, LLMI_E_RUNTIME, "--dataset: out of memory"); break; }
            reqs = nr;
        }
        tp_req *r = &reqs[n];
        memset(r, 0, sizeof *r);
        rc = tok_encode(m->tok, text, tlen, true, false, &r->prompt, &r->n_prompt, st);
        cJSON_Delete(j);
        if (rc) break;
        if (r->n_prompt == 0) { free(r->prompt); continue; }
        r->max_tokens = max_tokens;
        n++;
        if (a->num_requests > 0 && n >= a->num_requests) break;
    }
    free(line);
    fclose(f);
    if (!rc && n == 0) rc = llmi_fail(st, LLMI_E_USAGE, "--dataset %s: no prompts in it", a->dataset);
    /* Fewer lines than --num-requests: cycle through them. */
    if (!rc && a->num_requests > n) {
        tp_req *nr = realloc(reqs, (size_t)a->num_requests * sizeof *nr);
        if (!nr) rc = llmi_fail(st, LLMI_E_RUNTIME, "--dataset: out of memory");
        else {
            reqs = nr;
            const int n_lines = n;
            for (int i = n_lines; i < a->num_requests; i++) {
                const tp_req *src = &reqs[i % n_lines];
                reqs[i] = *src;
                reqs[i].prompt = malloc((size_t)src->n_prompt * sizeof(int32_t));
                if (!reqs[i].prompt) { rc = llmi_fail(st, LLMI_E_RUNTIME, "--dataset: out of memory"); break; }
                memcpy(reqs[i].prompt, src->prompt, (size_t)src->n_prompt * sizeof(int32_t));
                n = i + 1;
            }
        }
    }
    *out = reqs;
    *n_out = n;
    return rc;
}

/* vLLM's random dataset: each length uniform in [L*(1-R), L*(1+R)], at least 1. */
static int random_requests(const bench_args *a, const llmi_model *m, stats_rng *rng, tp_req **out, int *n_out,
                           llmi_status *st) {
    int n = a->num_requests;
    tp_req *reqs = calloc((size_t)n, sizeof *reqs);
    if (!reqs) return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory for %d requests", n);
    *out = reqs;
    long in_lo = (long)floor(a->input_len * (1 - a->range_ratio)), in_hi = (long)floor(a->input_len * (1 + a->range_ratio));
    long out_lo = (long)floor(a->output_len * (1 - a->range_ratio)), out_hi = (long)floor(a->output_len * (1 + a->range_ratio));
    if (in_lo < 1) in_lo = 1;
    if (out_lo < 1) out_lo = 1;
    for (int i = 0; i < n; i++) {
        reqs[i].n_prompt = (int)stats_rng_range(rng, in_lo, in_hi);
        reqs[i].max_tokens = (int)stats_rng_range(rng, out_lo, out_hi);
        reqs[i].prompt = malloc((size_t)reqs[i].n_prompt * sizeof(int32_t));
        if (!reqs[i].prompt) { *n_out = i; return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory"); }
        fill_random(rng, reqs[i].prompt, reqs[i].n_prompt, m->cfg.n_vocab);
    }
    *n_out = n;
    return 0;
}

static void add_percentiles(report *r, const char *key, dvec *d, double scale) {
    char k[REPORT_KEY_LEN];
    static const double qs[3] = {50, 90, 99};
    static const char *names[3] = {"p50", "p90", "p99"};
    snprintf(k, sizeof k, "%s_mean", key);
    report_num(r, k, d->n ? stats_mean(d->v, d->n) * scale : NAN, 2);
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof k, "%s_%s", key, names[i]);
        report_num(r, k, d->n ? stats_percentile(d->v, d->n, qs[i]) * scale : NAN, 2);
    }
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

static int bench_throughput(const bench_args *a, const llmi_model *m, const char *label, report *rep,
                            llmi_status *st) {
    stats_rng rng;
    stats_rng_seed(&rng, a->seed);
    tp_req *reqs = NULL;
    int n = 0, rc;
    if (a->dataset) {
        if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "--dataset: the model has no tokenizer");
        rc = read_dataset(a, m, &reqs, &n, st);
    } else {
        rc = random_requests(a, m, &rng, &reqs, &n, st);
    }
    const int ctx = ctx_of(a, m), bs = (int)a->bs[0];
    long need = 0, requested = 0, prompt_tokens = 0;
    for (int i = 0; i < n && !rc; i++) {
        reqs[i].id = -1;
        if (reqs[i].n_prompt + reqs[i].max_tokens > ctx)
            rc = llmi_fail(st, LLMI_E_USAGE, "bench: request %d needs %d prompt + %d generated tokens, more than the context %d (-c)",
                           i, reqs[i].n_prompt, reqs[i].max_tokens, ctx);
        need += blocks_for(reqs[i].n_prompt + reqs[i].max_tokens, bs);
        requested += reqs[i].max_tokens;
        prompt_tokens += reqs[i].n_prompt;
    }
    double *arrivals = rc ? NULL : malloc((size_t)n * sizeof *arrivals);
    if (!rc && !arrivals) rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    if (!rc) stats_poisson_arrivals(&rng, a->request_rate, n, arrivals);

    llmi_backend *b = NULL;
    llmi_engine *e = NULL;
    if (!rc) rc = open_engine(a, m, a->kv[0], bs, need, 1, &b, &e, st);
    if (!rc) {
        int total = engine_kv_blocks_total(e);
        for (int i = 0; i < n && !rc; i++)
            if (blocks_for(reqs[i].n_prompt + reqs[i].max_tokens, bs) > total)
                rc = llmi_fail(st, LLMI_E_USAGE,
                               "bench: request %d (%d + %d tokens) needs %ld KV blocks alone, the cache has %d "
                               "(--num-blocks/--kv-mem)",
                               i, reqs[i].n_prompt, reqs[i].max_tokens,
                               blocks_for(reqs[i].n_prompt + reqs[i].max_tokens, bs), total);
    }
    tp_ctx cx = {.e = e, .reqs = reqs};
    dvec kv_t = {0}, kv_u = {0};
    int preemptions = 0, next = 0, n_done = 0;
    double t_start = 0, t_end = 0;
    bench_progress prog;
    bench_progress_init(&prog, "bench", rc ? 0 : n);
    llmi_request_params rp = request_params_defaults();
    rp.sampling.temperature = 0;
    /* Random prompts have no meaningful EOS; dataset prompts stop as the model says. */
    rp.ignore_eos = a->dataset == NULL;
    if (!rc) {
        bench_peak_reset();
        t_start = engine_now(e);
    }
    while (!rc && (next < n || engine_has_work(e))) {
        if (interrupted()) { rc = llmi_fail(st, LLMI_E_INTERRUPT, "bench: interrupted"); break; }
        double now = engine_now(e) - t_start;
        while (next < n && arrivals[next] <= now) {
            rp.max_tokens = reqs[next].max_tokens;
            if ((rc = engine_add_request(e, reqs[next].prompt, reqs[next].n_prompt, &rp, (void *)(intptr_t)next,
                                         &reqs[next].id, st)))
                break;
            reqs[next].arrival = arrivals[next];
            reqs[next].submitted = now;
            next++;
        }
        if (rc) break;
        if (!engine_has_work(e)) {
            sleep_s(arrivals[next] - (engine_now(e) - t_start));
            continue;
        }
        llmi_step_info info;
        if ((rc = engine_step(e, tp_on_token, &cx, &info, st))) break;
        if (cx.oom) { rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory"); break; }
        preemptions += info.n_preempted;
        double t = engine_now(e) - t_start;
        if (info.kv_blocks_total > 0 &&
            (dvec_push(&kv_t, t) || dvec_push(&kv_u, (double)info.kv_blocks_used / info.kv_blocks_total))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
            break;
        }
        /* Harvest finished requests so the engine's memory does not grow with N. */
        for (int i = 0; i < next; i++) {
            if (reqs[i].id < 0) continue;
            const llmi_request_info *ri = engine_request(e, reqs[i].id);
            if (!ri || ri->finish == LLMI_FINISH_NONE) continue;
            reqs[i].n_generated = ri->n_generated;
            reqs[i].n_preempted = ri->n_preempted;
            reqs[i].finish = ri->finish;
            reqs[i].t_first = ri->n_generated > 0 ? ri->t_first_token : ri->t_prefill_done;
            reqs[i].t_finish = ri->t_finish;
            /* Latencies count from the scheduled arrival: a request due while a step runs
             * waits for it, and that wait is part of what a client would see. */
            double due = t_start + arrivals[i];
            reqs[i].ttft = reqs[i].t_first - due;
            reqs[i].latency = ri->t_finish - due;
            engine_release(e, reqs[i].id);
            reqs[i].id = -2;
            n_done++;
            bench_progress_update(&prog, n_done);
        }
    }
    bench_progress_end(&prog);
    if (e) t_end = engine_now(e) - t_start;

    if (!rc) {
        dvec ttft = {0}, tpot = {0}, e2e = {0};
        long generated = 0;
        int by_len = 0, by_eos = 0, other = 0;
        for (int i = 0; i < n; i++) {
            tp_req *r = &reqs[i];
            generated += r->n_generated;
            if (r->finish == LLMI_FINISH_LENGTH) by_len++;
            else if (r->finish == LLMI_FINISH_EOS) by_eos++;
            else other++;
            if (dvec_push(&ttft, r->ttft) || dvec_push(&e2e, r->latency) ||
                (r->n_generated > 1 && dvec_push(&tpot, (r->t_finish - r->t_first) / (r->n_generated - 1)))) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
                break;
            }
        }
        if (!rc) {
            report_row(rep);
            bench_meta(rep, m, b, label, a->mo.backend.n_threads);
            report_str(rep, "kv_type", bench_kv_name(a->kv[0]));
            report_int(rep, "block_size", bs);
            report_str(rep, "dataset", a->dataset ? a->dataset : "random");
            report_int(rep, "num_requests", n);
            report_int(rep, "input_len", a->dataset ? 0 : a->input_len);
            report_int(rep, "output_len", a->output_len);
            report_num(rep, "range_ratio", a->range_ratio, 2);
            report_num(rep, "request_rate", a->request_rate > 0 ? a->request_rate : INFINITY, 2);
            report_int(rep, "seed", (long long)a->seed);
            report_num(rep, "elapsed_s", t_end, 3);
            report_num(rep, "requests_per_s", n / t_end, 3);
            report_num(rep, "output_tps", generated / t_end, 2);
            report_num(rep, "total_tps", (generated + prompt_tokens) / t_end, 2);
            report_int(rep, "prompt_tokens", prompt_tokens);
            report_int(rep, "output_tokens", generated);
            report_int(rep, "requested_output_tokens", requested);
            report_int(rep, "finished_length", by_len);
            report_int(rep, "finished_eos", by_eos);
            report_int(rep, "finished_other", other);
            add_percentiles(rep, "ttft_ms", &ttft, 1e3);
            add_percentiles(rep, "tpot_ms", &tpot, 1e3);
            add_percentiles(rep, "itl_ms", &cx.itl, 1e3);
            add_percentiles(rep, "e2e_ms", &e2e, 1e3);
            report_int(rep, "preemptions", preemptions);
            double umax = 0;
            for (int i = 0; i < kv_u.n; i++) umax = kv_u.v[i] > umax ? kv_u.v[i] : umax;
            report_num(rep, "kv_util_mean", stats_mean(kv_u.v, kv_u.n), 3);
            report_num(rep, "kv_util_max", umax, 3);
            add_memory(rep, b, e, bench_peak_rss());
            /* KV utilisation over time, at most 200 [t, util] points (json/jsonl only). */
            size_t cap = 64 + (size_t)(kv_u.n < 200 ? kv_u.n : 200) * 40;
            char *js = malloc(cap);
            if (js) {
                size_t o = (size_t)snprintf(js, cap, "[");
                int stride = kv_u.n > 200 ? (kv_u.n + 199) / 200 : 1;
                for (int i = 0; i < kv_u.n && o < cap - 48; i += stride)
                    o += (size_t)snprintf(js + o, cap - o, "%s[%.4f,%.4f]", o > 1 ? "," : "", kv_t.v[i], kv_u.v[i]);
                snprintf(js + o, cap - o, "]");
                report_raw_json(rep, "kv_util_series", js);
                free(js);
            }
        }
        if (!rc && a->per_request) {
            FILE *f = fopen(a->per_request, "w");
            if (!f) rc = llmi_fail(st, LLMI_E_RUNTIME, "--per-request %s: cannot write it", a->per_request);
            for (int i = 0; f && i < n; i++) {
                tp_req *r = &reqs[i];
                fprintf(f,
                        "{\"index\":%d,\"n_prompt\":%d,\"max_tokens\":%d,\"n_generated\":%d,\"finish\":\"%s\","
                        "\"arrival_s\":%.6f,\"submitted_s\":%.6f,\"ttft_ms\":%.6f,\"latency_ms\":%.6f,\"tpot_ms\":%.6f,"
                        "\"preempted\":%d}\n",
                        i, r->n_prompt, r->max_tokens, r->n_generated, finish_name(r->finish), r->arrival, r->submitted,
                        r->ttft * 1e3, r->latency * 1e3,
                        r->n_generated > 1 ? (r->t_finish - r->t_first) / (r->n_generated - 1) * 1e3 : 0.0,
                        r->n_preempted);
            }
            if (f && fclose(f)) rc = llmi_fail(st, LLMI_E_RUNTIME, "--per-request %s: write failed", a->per_request);
        }
        free(ttft.v);
        free(tpot.v);
        free(e2e.v);
    }
    if (e && rc) engine_abort_all(e, NULL, NULL);
    close_engine(b, e);
    for (int i = 0; i < n; i++) free(reqs[i].prompt);
    free(reqs);
    free(arrivals);
    free(cx.itl.v);
    free(kv_t.v);
    free(kv_u.v);
    return rc;
}

/* ------------------------------------------------------------------ perplexity */

static int bench_ppl(const bench_args *a, const llmi_model *m, const char *label, report *rep, llmi_status *st) {
    if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "--ppl: the model has no tokenizer");
    FILE *f = fopen(a->ppl, "rb");
    if (!f) return llmi_fail(st, LLMI_E_USAGE, "--ppl %s: cannot open it", a->ppl);
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 65536 > cap) {
            cap = cap ? cap * 2 : 1 << 20;
            if (cap > ((size_t)1 << 31)) { free(text); fclose(f); return llmi_fail(st, LLMI_E_USAGE, "--ppl %s: larger than 2 GiB", a->ppl); }
            char *t = realloc(text, cap);
            if (!t) { free(text); fclose(f); return llmi_fail(st, LLMI_E_RUNTIME, "--ppl: out of memory"); }
            text = t;
        }
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
    }
    fclose(f);
    int32_t *ids = NULL;
    int n_ids = 0;
    int rc = ppl_tokenize(m->tok, text, len, &ids, &n_ids, st);
    free(text);
    if (rc) return rc;
    const int n_ctx = a->mo.engine.max_ctx > 0 ? a->mo.engine.max_ctx : 512;
    if (n_ctx > m->cfg.max_ctx) {
        free(ids);
        return llmi_fail(st, LLMI_E_USAGE, "-c %d: exceeds the model's context length %d", n_ctx, m->cfg.max_ctx);
    }
    if (n_ids < 2 * n_ctx) {
        free(ids);
        return llmi_fail(st, LLMI_E_USAGE, "--ppl %s: tokenizes to %d tokens; -c %d needs at least %d", a->ppl, n_ids,
                         n_ctx, 2 * n_ctx);
    }
    cli_model_opts o = a->mo;
    o.backend.kv_dtype = a->kv[0];
    o.engine.block_size = (int)a->bs[0];
    o.engine.max_seqs = 1;
    if (!o.max_batch_tokens_set || o.engine.max_batch_tokens > n_ctx) {
        o.engine.max_batch_tokens = n_ctx;   /* one forward per window, as llama.cpp's default n_batch */
        o.max_batch_tokens_set = true;
    }
    llmi_backend *b = NULL;
    if ((rc = cli_open_backend(&o, m, &b, st))) { free(ids); return rc; }
    int nblk = (n_ctx + o.engine.block_size - 1) / o.engine.block_size;
    if ((rc = b->kv_alloc(b, nblk, st))) { b->destroy(b); free(ids); return rc; }
    bench_peak_reset();
    ppl_opts po = {.n_ctx = n_ctx, .n_chunks = a->chunks, .n_batch = b->opts.max_batch_tokens, .progress = stderr};
    ppl_result res;
    int bos = tok_add_bos(m->tok) ? tok_bos(m->tok) : -1;
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, scoring: %s\n", n_ids,
            a->chunks > 0 && a->chunks < n_ids / n_ctx ? a->chunks : n_ids / n_ctx, n_ctx, PPL_SCORING);
    rc = ppl_run(b, ids, n_ids, bos, &po, &res, st);
    if (!rc) {
        fprintf(stderr, "Final estimate: PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_stderr);
        report_row(rep);
        bench_meta(rep, m, b, label, a->mo.backend.n_threads);
        report_str(rep, "kv_type", bench_kv_name(o.backend.kv_dtype));
        report_str(rep, "file", a->ppl);
        report_num(rep, "ppl", res.ppl, 4);
        report_num(rep, "ppl_stderr", res.ppl_stderr, 5);
        report_int(rep, "chunks", res.chunks);
        report_int(rep, "ctx", res.ctx);
        report_int(rep, "tokens", res.n_tokens);
        report_int(rep, "scored", res.scored);
        report_str(rep, "scoring", PPL_SCORING);
        report_num(rep, "seconds", res.seconds, 2);
        report_num(rep, "tps", (double)res.chunks * res.ctx / res.seconds, 2);
        report_num(rep, "peak_rss_mib", (double)bench_peak_rss() / (1024.0 * 1024.0), 1);
    }
    b->destroy(b);
    free(ids);
    return rc;
}

/* ------------------------------------------------------------------ entry */

int cmd_bench(int argc, char **argv, llmi_status *st) {
    bench_args a;
    memset(&a, 0, sizeof a);
    bool help = false;
    int rc = parse_args(argc, argv, &a, &help, st);
    if (!rc && help) {
        fputs(bench_usage(), stdout);
        fputs(cli_model_flags_help(), stdout);
    }
    llmi_model m;
    memset(&m, 0, sizeof m);
    bool loaded = false;
    report rep;
    report_init(&rep);
    if (!rc && !help) {
        rc = cli_open_model(&a.mo, &m, st);
        loaded = rc == 0;
    }
    char label[1024];
    if (loaded) {
        snprintf(label, sizeof label, "%s", a.mo.dummy ? a.mo.dummy : m.source_path);
        if (a.ppl) rc = bench_ppl(&a, &m, label, &rep, st);
        else if (a.throughput) rc = bench_throughput(&a, &m, label, &rep, st);
        else rc = bench_sweep(&a, &m, label, &rep, st);
        /* Perplexity is one result: -o json gives the object itself, not a list of one. */
        if (!rc) rc = report_write(&rep, a.ppl && a.fmt == REPORT_JSON ? REPORT_JSONL : a.fmt, stdout);
        if (rc == LLMI_E_RUNTIME && !st->code) llmi_fail(st, rc, "bench: cannot write the report to stdout");
        for (int i = 0; i < a.n_out && !rc; i++) {
            FILE *f = fopen(a.out_path[i], "w");
            if (!f) { rc = llmi_fail(st, LLMI_E_RUNTIME, "--out %s: cannot write it", a.out_path[i]); break; }
            rc = report_write(&rep, a.out_fmt[i], f);
            if (fclose(f) || rc) rc = llmi_fail(st, LLMI_E_RUNTIME, "--out %s: write failed", a.out_path[i]);
        }
    }
    report_free(&rep);
    if (loaded) model_free(&m);
    free(a.p);
    free(a.n);
    free(a.b);
    free(a.bs);
    return rc ? (st->code ? st->code : LLMI_E_RUNTIME) : 0;
}
