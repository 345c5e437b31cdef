/* cmd_bench.c — `llmi bench`: three measurements, one table of rows.
 *
 *   sweep       (default) llama-bench-shaped: every combination of -p, -n, -b, -d, --kv-type,
 *               --block-size, each run -r times after a warm-up; one row per combination
 *               (the workload is workload.h's; one engine per kv type and block size).
 *   throughput  (--num-requests / --dataset / --turns) `vllm bench throughput`-shaped: N
 *               requests (or N conversations of --turns T requests) served by continuous
 *               batching, all at t = 0 or as Poisson arrivals; one row per --request-rate,
 *               with rates, latency percentiles and --slo attainment.
 *   perplexity  (--ppl FILE) llama-perplexity's rule (perplexity.h); one row.
 * and --compare BASE NEW, which reads two earlier results instead (bench_compare.h).
 *
 * How the sweep splits time: a step that carries any prompt token is prefill time (its
 * prompt tokens count); a step of decode tokens only is decode time.  With -b 1 that is
 * exactly "tokens after the first over the time after the first token", the figure
 * `llmi generate` reports.  Wall time is taken around each engine_step, callbacks included.
 * stdout carries only the report (md: bench_view.h's compact table unless --columns all);
 * the progress bar and the running perplexity go to stderr.  Ctrl-C ends the run with the
 * rows measured so far printed, then exit 130. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli/bench_compare.h"
#include "cli/bench_plot.h"
#include "cli/bench_util.h"
#include "cli/bench_view.h"
#include "cli/cli.h"
#include "cli/prompts.h"
#include "core/fileio.h"
#include "metrics/perplexity.h"
#include "cli/report.h"
#include "cli/workload.h"
#include "metrics/slo.h"
#include "metrics/stats.h"
#include "tok/tokenizer.h"

#define BENCH_MAX_KV LLMI_KV_DTYPE_COUNT
#define BENCH_MAX_TURNS 16
#define BENCH_MAX_RATES 16   /* one plot line each */

typedef struct bench_args {
    cli_model_opts mo;
    long *p, *n, *b, *bs, *d;    /* sweep lists: (np), (nn), (nb), (nbs), (nd) */
    int np, nn, nb, nbs, nd;
    llmi_kv_dtype kv[BENCH_MAX_KV];
    int nkv;
    llmi_spec_mode spec[3];      /* --spec list: (nspec); none given = off, and no spec columns */
    int nspec;
    llmi_spec_params spec_p;     /* --spec-k, --spec-ngram for the ngram rows */
    bool kv_given;               /* --kv-type was given; else the backend's default */
    int reps, warmup;
    report_format fmt;
    uint64_t seed;
    /* throughput */
    bool throughput;
    int num_requests;            /* 0 = every dataset line */
    int input_len, output_len;
    double range_ratio;
    int prefix_len;              /* tokens of a prefix shared by requests (random prompts only) */
    int num_prefixes;            /* distinct shared prefixes, dealt round robin */
    const char *dataset;
    double *rates;               /* (n_rates) --request-rate list, requests/s; none = all at t = 0 */
    int n_rates;
    int turns;                   /* requests per conversation (--turns); 1 = independent requests */
    int samples;                 /* --samples: sequences sampled from each prompt (vLLM's n); 0 = 1 */
    int max_concurrency;         /* --max-concurrency: requests in flight at most (0: no limit) */
    slo_spec slo;                /* --slo; all 0 = none */
    const char *per_request;     /* jsonl of every request, or NULL */
    llmi_sampling sampling;      /* --temp, --top-k, ...: every request's (default greedy) */
    const char *sampling_flag;   /* the first sampling flag given, or NULL */
    /* perplexity */
    const char *ppl;
    int chunks;
    /* --out FMT:FILE: the same rows in more formats, from the same run */
    int n_out;
    report_format out_fmt[4];
    const char *out_path[4];
    bool depth_default;          /* -d not given: rows carry no depth field */
    bool columns_all;            /* --columns all: md shows every field, not the compact view */
    const char *plot;            /* --plot FILE.svg, or NULL */
    const char *cmp_base, *cmp_new;   /* --compare BASE NEW */
    double fail_below;           /* --fail-below R; 0 = off */
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

static const char *bench_usage(void) {
    return "usage: llmi bench [-m MODEL | --dummy PRESET|config.json] [options]\n"
           "       llmi bench --compare BASE.jsonl NEW.jsonl [--fail-below R] [-o FMT]\n"
           "sweep (default; every list is comma-separated and every combination runs):\n"
           "  -p LIST                 prompt lengths (default 512)\n"
           "  -n LIST                 generated lengths (default 128; 0 = prefill only)\n"
           "  -b LIST                 concurrent sequences (default 1)\n"
           "  -d LIST                 context depths: tokens already in the KV cache, prefilled untimed\n"
           "                          before each test (default 0; multiples of --block-size)\n"
           "  --kv-type LIST          KV cache dtypes: f32, f16, bf16, q8, fp8 (default f32 on cpu, bf16 on cuda)\n"
           "  --block-size LIST       KV block sizes in tokens (default 16); throughput and --ppl take one\n"
           "                          value of this and --kv-type\n"
           "  --spec LIST             speculative decoding: off, ngram (prompt lookup; random prompts rarely\n"
           "                          repeat, so use --dataset for its speed), draft (--draft-model PATH);\n"
           "                          adds acceptance columns.  Throughput takes one value.  --spec-k K,\n"
           "                          --spec-ngram MIN,MAX as generate's\n"
           "  -r N                    repetitions (default 5)   --warmup N  warm-up runs (default 1;\n"
           "                          throughput: 0 skips its untimed warm-up of every decode batch size)\n"
           "throughput (--num-requests, --dataset or --turns):\n"
           "  --num-requests N        requests to serve (default 1000 with random prompts; with --turns:\n"
           "                          conversations)\n"
           "  --input-len N           prompt tokens (default 128)   --output-len N  generated (default 128)\n"
           "  --range-ratio R         lengths uniform in [L*(1-R), L*(1+R)] (default 0)\n"
           "  --prefix-len N          every prompt starts with a shared prefix of N random tokens, then\n"
           "                          its own --input-len tokens (vLLM's prefix-repetition workload)\n"
           "  --num-prefixes K        distinct shared prefixes, dealt round robin (default 1)\n"
           "  --dataset FILE          prompts: text lines or JSONL {\"prompt\", \"max_tokens\"} (needs a tokenizer)\n"
           "  --turns T               conversations of T requests: each prompt is the previous one + its answer\n"
           "                          + a new user message (--input-len random tokens or a --dataset line),\n"
           "                          in the model's chat template; per-turn TTFT (T <= 16)\n"
           "  --samples N             N sequences sampled from each prompt, arriving together (vLLM's\n"
           "                          --n; default 1); a request is the prompt with its N samples\n"
           "  --max-concurrency N     at most N requests in flight (vLLM's client-side limit): a request\n"
           "                          due while N are served waits for one to end, and its latencies\n"
           "                          count from then (default: no limit)\n"
           "  --request-rate LIST     Poisson arrivals, R requests/s (conversations/s with --turns); a list\n"
           "                          runs once per rate (default: all at t = 0)\n"
           "  --slo ttft=MS,tpot=MS[,e2e=MS]  goodput and the share of requests within each limit; with a\n"
           "                          --request-rate list, the highest rate meeting them for >= 90%\n"
           "  --per-request FILE      write one JSON line per request\n"
           "  --temp T, --top-k N, --top-p P, --min-p P, --typical P, --top-nsigma N, --xtc-probability P,\n"
           "  --xtc-threshold T, --repeat-penalty P, --frequency-penalty F, --presence-penalty F,\n"
           "  --mirostat N, --mirostat-ent T, --mirostat-lr E,\n"
           "  --repeat-last-n N       every request's sampling, as generate's (default greedy; vLLM's\n"
           "                          throughput benchmark samples at --temp 1 --top-k 0 --top-p 1 --min-p 0)\n"
           "perplexity:\n"
           "  --ppl FILE              llama-perplexity rule; -c window (default 512), --chunks N\n"
           "output:\n"
           "  -o md|csv|json|jsonl    (default md: a compact table under a line of what every row shares)\n"
           "  --columns all           md with every field, as csv/json/jsonl have them\n"
           "  --out FMT:FILE          also write the same rows as FMT to FILE (repeatable)\n"
           "  --plot FILE.svg         sweep: tok/s vs the swept list; throughput: TTFT/ITL CDFs, KV use\n"
           "  --seed N                prompts, lengths, arrivals (default 42)\n"
           "compare (two earlier -o jsonl or -o json results; no model is loaded):\n"
           "  --compare BASE NEW      both figures and NEW's ratio to BASE for every configuration in both,\n"
           "                          flagged when the difference is past the measured noise (sd)\n"
           "  --fail-below R          exit 1 when any ratio is below R (e.g. 0.95 in CI)\n";
}

static int parse_args(int argc, char **argv, bench_args *a, bool *help, llmi_status *st) {
    *a = (bench_args){.reps = 5, .warmup = 1, .fmt = REPORT_MD, .seed = 42, .input_len = 128, .output_len = 128,
                      .chunks = -1, .spec_p = spec_params_defaults()};
    a->sampling = sampling_defaults();
    a->sampling.temperature = 0;
    cli_model_opts_init(&a->mo);
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
        if (!strcmp(f, "-d") || !strcmp(f, "--depth")) { VAL(); free(a->d); if (cli_parse_long_list(f, v, 0, 1 << 20, &a->d, &a->nd, st)) return st->code; lists_sweep = true; continue; }
        if (!strcmp(f, "--block-size")) { VAL(); free(a->bs); if (cli_parse_long_list(f, v, 1, 1024, &a->bs, &a->nbs, st)) return st->code; continue; }
        if (!strcmp(f, "--kv-type")) {
            VAL();
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            a->nkv = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (a->nkv == BENCH_MAX_KV || kv_dtype_parse(t, &a->kv[a->nkv]))
                    return llmi_fail(st, LLMI_E_USAGE, "--kv-type: '%s' is not a list of f32, f16, bf16, q8, fp8", v);
                a->nkv++;
            }
            if (a->nkv == 0) return llmi_fail(st, LLMI_E_USAGE, "--kv-type: empty list");
            a->kv_given = true;
            continue;
        }
        if (!strcmp(f, "--spec")) {
            VAL();
            char buf[64];
            snprintf(buf, sizeof buf, "%s", v);
            a->nspec = 0;
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (a->nspec == 3) return llmi_fail(st, LLMI_E_USAGE, "--spec: '%s' lists more than off, ngram and draft", v);
                if (cli_parse_spec_mode(f, t, &a->spec[a->nspec++], st)) return st->code;
            }
            if (a->nspec == 0) return llmi_fail(st, LLMI_E_USAGE, "--spec: empty list");
            continue;
        }
        if (!strcmp(f, "--draft-model")) { VAL(); a->mo.draft_model = v; continue; }
        if (!strcmp(f, "--spec-k")) { VAL(); if (cli_parse_long(f, v, 1, LLMI_SPEC_MAX_K, &n, st)) return st->code; a->spec_p.k = (int)n; continue; }
        if (!strcmp(f, "--spec-ngram")) { VAL(); if (cli_parse_spec_ngram(f, v, &a->spec_p, st)) return st->code; continue; }
        if (!strcmp(f, "-r")) { VAL(); if (cli_parse_long(f, v, 1, 1000, &n, st)) return st->code; a->reps = (int)n; continue; }
        if (!strcmp(f, "--warmup")) { VAL(); if (cli_parse_long(f, v, 0, 100, &n, st)) return st->code; a->warmup = (int)n; continue; }
        if (!strcmp(f, "-o")) { VAL(); if (report_format_parse(v, &a->fmt, st)) return st->code; continue; }
        if (!strcmp(f, "--seed")) { VAL(); if (cli_parse_long(f, v, 0, 0x7fffffffL, &n, st)) return st->code; a->seed = (uint64_t)n; continue; }
        if (!strcmp(f, "--num-requests")) { VAL(); if (cli_parse_long(f, v, 1, 1000000, &n, st)) return st->code; a->num_requests = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--input-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->input_len = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--output-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->output_len = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--range-ratio")) { VAL(); if (cli_parse_float(f, v, 0, 0.999, &d, st)) return st->code; a->range_ratio = d; a->throughput = true; continue; }
        if (!strcmp(f, "--prefix-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->prefix_len = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--num-prefixes")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->num_prefixes = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--dataset")) { VAL(); a->dataset = v; a->throughput = true; continue; }
        if (!strcmp(f, "--request-rate")) {
            VAL();
            free(a->rates);
            if (cli_parse_float_list(f, v, 1e-6, 1e9, &a->rates, &a->n_rates, st)) return st->code;
            if (a->n_rates > BENCH_MAX_RATES) return llmi_fail(st, LLMI_E_USAGE, "--request-rate: at most %d rates", BENCH_MAX_RATES);
            a->throughput = true;
            continue;
        }
        if (!strcmp(f, "--max-concurrency")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->max_concurrency = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--samples")) { VAL(); if (cli_parse_long(f, v, 1, PROMPTS_MAX_SAMPLES, &n, st)) return st->code; a->samples = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--turns")) { VAL(); if (cli_parse_long(f, v, 1, BENCH_MAX_TURNS, &n, st)) return st->code; a->turns = (int)n; a->throughput = true; continue; }
        if (!strcmp(f, "--slo")) { VAL(); if (slo_parse(v, &a->slo, st)) return st->code; continue; }
        if (!strcmp(f, "--columns")) {
            VAL();
            if (strcmp(v, "all") && strcmp(v, "compact"))
                return llmi_fail(st, LLMI_E_USAGE, "--columns %s: expected all or compact", v);
            a->columns_all = !strcmp(v, "all");
            continue;
        }
        if (!strcmp(f, "--plot")) {
            VAL();
            size_t l = strlen(v);
            if (l < 5 || strcmp(v + l - 4, ".svg"))
                return llmi_fail(st, LLMI_E_USAGE, "--plot %s: the file name must end in .svg (llmi writes SVG)", v);
            a->plot = v;
            continue;
        }
        if (!strcmp(f, "--compare")) {
            if (i + 2 >= argc) return llmi_fail(st, LLMI_E_USAGE, "--compare: expected two files, BASE NEW");
            a->cmp_base = argv[++i];
            a->cmp_new = argv[++i];
            continue;
        }
        if (!strcmp(f, "--fail-below")) { VAL(); if (cli_parse_float(f, v, 1e-9, 1e9, &d, st)) return st->code; a->fail_below = d; continue; }
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
        rc = cli_parse_sampling_flag(&a->sampling, argc, argv, &i, st);
        if (rc < 0) return st->code;
        if (rc > 0) {
            if (!a->sampling_flag) a->sampling_flag = f;
            continue;
        }
        rc = cli_parse_model_flag(&a->mo, argc, argv, &i, st);
        if (rc < 0) return st->code;
        if (rc == 0) return llmi_fail(st, LLMI_E_USAGE, "bench: unknown flag '%s' (see llmi bench --help)", f);
    }
    if (a->fail_below > 0 && !a->cmp_base) return llmi_fail(st, LLMI_E_USAGE, "--fail-below: only with --compare");
    if (a->cmp_base) {
        if (a->throughput || lists_sweep || a->ppl || a->mo.model_path || a->mo.dummy || a->plot || a->n_out)
            return llmi_fail(st, LLMI_E_USAGE, "--compare: reads two result files; it takes no model, workload, --plot or --out");
        return 0;
    }
    if (a->sampling_flag && !a->throughput)
        return llmi_fail(st, LLMI_E_USAGE, "%s: sampling applies to throughput runs (--num-requests, --dataset or --turns)",
                         a->sampling_flag);
    if (a->ppl && (a->throughput || lists_sweep))
        return llmi_fail(st, LLMI_E_USAGE, "--ppl: cannot be combined with sweep (-p/-n/-b) or throughput flags");
    if (a->nspec > 0 && a->ppl) return llmi_fail(st, LLMI_E_USAGE, "--spec: not with --ppl (nothing is generated)");
    if (a->nspec > 1 && a->throughput)
        return llmi_fail(st, LLMI_E_USAGE, "--spec: a throughput run takes one value (run each mode separately)");
    /* Throughput and perplexity build one engine from the first value of these lists: the
     * others would be dropped without a row. */
    if (a->nkv > 1 && (a->throughput || a->ppl))
        return llmi_fail(st, LLMI_E_USAGE, "--kv-type: a %s run takes one value (run each separately)",
                         a->ppl ? "--ppl" : "throughput");
    if (a->nbs > 1 && (a->throughput || a->ppl))
        return llmi_fail(st, LLMI_E_USAGE, "--block-size: a %s run takes one value (run each separately)",
                         a->ppl ? "--ppl" : "throughput");
    bool any_draft = false;
    for (int k = 0; k < a->nspec; k++) {
        if (a->spec[k] != LLMI_SPEC_OFF) a->mo.engine.spec_max_k = a->spec_p.k;
        any_draft |= a->spec[k] == LLMI_SPEC_DRAFT;
    }
    if (cli_check_draft_flags(&a->mo, any_draft, st)) return st->code;
    if (a->throughput && lists_sweep)
        return llmi_fail(st, LLMI_E_USAGE, "bench: -p/-n/-b/-d (sweep) and --num-requests/--dataset/--turns (throughput) are different modes");
    if (a->ppl && a->mo.dummy) return llmi_fail(st, LLMI_E_USAGE, "--ppl: needs a tokenizer, which --dummy models lack");
    if (a->dataset && a->mo.dummy) return llmi_fail(st, LLMI_E_USAGE, "--dataset: needs a tokenizer, which --dummy models lack");
    if (a->dataset && a->prefix_len)
        return llmi_fail(st, LLMI_E_USAGE, "--prefix-len: only with random prompts, not with --dataset");
    if (a->num_prefixes && !a->prefix_len) return llmi_fail(st, LLMI_E_USAGE, "--num-prefixes: needs --prefix-len");
    if (slo_any(&a->slo) && !a->throughput)
        return llmi_fail(st, LLMI_E_USAGE, "--slo: for offline or Poisson runs (--num-requests, --dataset, --turns)");
    if (a->plot && a->ppl) return llmi_fail(st, LLMI_E_USAGE, "--plot: draws sweeps and throughput runs, not --ppl");
    if (a->turns > 1 && a->mo.dummy)
        return llmi_fail(st, LLMI_E_USAGE, "--turns: needs a tokenizer with a chat template, which --dummy models lack");
    if (a->turns > 1 && a->prefix_len)
        return llmi_fail(st, LLMI_E_USAGE, "--turns: not with --prefix-len (the conversation's history is its shared prefix)");
    if (a->nd && !a->mo.engine.prefix_cache)
        return llmi_fail(st, LLMI_E_USAGE, "-d: the context is kept in the prefix cache; drop --no-prefix-cache");
    if (a->samples > 1 && a->turns > 1)
        return llmi_fail(st, LLMI_E_USAGE, "--samples: not with --turns (each turn is answered once)");
    if (!a->turns) a->turns = 1;
    if (!a->samples) a->samples = 1;
    if (!a->num_prefixes) a->num_prefixes = 1;
    if (!a->p) { a->p = malloc(sizeof(long)); if (!a->p) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->p[0] = 512; a->np = 1; }
    if (!a->n) { a->n = malloc(sizeof(long)); if (!a->n) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->n[0] = 128; a->nn = 1; }
    if (!a->b) { a->b = malloc(sizeof(long)); if (!a->b) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->b[0] = 1; a->nb = 1; }
    if (!a->d) { a->d = calloc(1, sizeof(long)); if (!a->d) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->nd = 1; a->depth_default = true; }
    if (!a->bs) { a->bs = malloc(sizeof(long)); if (!a->bs) return llmi_fail(st, LLMI_E_RUNTIME, "out of memory"); a->bs[0] = a->mo.engine.block_size; a->nbs = 1; }
    if (a->nkv == 0) { a->kv[0] = a->mo.backend.kv_dtype; a->nkv = 1; }
    if (a->throughput && !a->dataset && a->num_requests == 0) a->num_requests = 1000;
    return 0;
}

static long blocks_for(long tokens, long bs) { return (tokens + bs - 1) / bs; }

static int ctx_of(const bench_args *a, const llmi_model *m) {
    return a->mo.engine.max_ctx > 0 ? a->mo.engine.max_ctx : m->cfg.max_ctx;
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

/* One repetition's accounting (workload.h's hooks). */
typedef struct sweep_run {
    double prefill_tokens, prefill_s, decode_tokens, decode_s;
    int preempted;
    long spec_steps, spec_proposed, spec_accepted;
    dvec *ttft, *tpot;            /* per-request TTFT and TPOT (s), appended */
} sweep_run;

static void sweep_after_step(void *ctx, const llmi_step_info *info, double t0, double dt) {
    sweep_run *r = ctx;
    r->preempted += info->n_preempted;
    r->spec_steps += info->n_spec_steps;
    r->spec_proposed += info->n_spec_proposed;
    r->spec_accepted += info->n_spec_accepted;
    if (info->n_prefill_tokens > 0) {
        r->prefill_tokens += info->n_prefill_tokens;
        r->prefill_s += dt;
    } else {
        /* Tokens delivered, not positions run: a verification step runs its proposals too. */
        r->decode_tokens += info->n_generated;
        r->decode_s += dt;
    }
}

/* The speculation columns (only when --spec was given): the mode, the share of proposals
 * accepted, and the mean accepted length (tokens per verification step, the model's own
 * token included). */
static void add_spec_columns(report *rep, const bench_args *a, llmi_spec_mode mode, long steps, long proposed,
                             long accepted) {
    if (a->nspec == 0) return;
    report_str(rep, "spec", spec_mode_name(mode));
    report_num(rep, "spec_accept_pct", proposed > 0 ? 100.0 * accepted / proposed : NAN, 1);
    report_num(rep, "spec_len", steps > 0 ? 1.0 + (double)accepted / steps : NAN, 2);
}

static int sweep_on_request(void *ctx, const llmi_request_info *ri, llmi_status *st) {
    sweep_run *r = ctx;
    double first = ri->n_generated > 0 ? ri->t_first_token : ri->t_prefill_done;
    if (dvec_push(r->ttft, first - ri->t_arrival) ||
        (ri->n_generated > 1 && dvec_push(r->tpot, (ri->t_finish - ri->t_first_token) / (ri->n_generated - 1))))
        return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    return 0;
}

static void add_mean_sd(report *r, const char *key, const double *x, int n, double scale, int dec) {
    char k1[REPORT_KEY_LEN], k2[REPORT_KEY_LEN];
    snprintf(k1, sizeof k1, "%s_mean", key);
    snprintf(k2, sizeof k2, "%s_sd", key);
    report_num(r, k1, n > 0 ? stats_mean(x, n) * scale : NAN, dec);
    report_num(r, k2, n > 0 ? stats_sd(x, n) * scale : NAN, dec);
}

/* What every row of a sweep shares. */
typedef struct sweep_ctx {
    const bench_args *a;
    const llmi_model *m;
    const char *label;
    report *rep;
    stats_rng rng;                /* prompts of every run, in sweep order */
    bench_progress prog;
    int done_runs;
} sweep_ctx;

/* One row: the warm-up and -r runs of one (p, n, b) on an open engine. */
static int sweep_point(sweep_ctx *s, llmi_backend *b, llmi_engine *e, workload_shape w, llmi_status *st) {
    const bench_args *a = s->a;
    const int n_vocab = s->m->cfg.n_vocab;
    int rc = 0;
    bench_peak_reset();
    for (int i = 0; i < a->warmup && !rc; i++) {
        rc = workload_warmup(e, n_vocab, w, &s->rng, "bench", st);
        bench_progress_update(&s->prog, ++s->done_runs);
    }
    double *pre = calloc((size_t)a->reps, sizeof *pre), *dec = calloc((size_t)a->reps, sizeof *dec);   /* (reps) */
    dvec ttft = {0}, tpot = {0};
    int preempted = 0, n_pre = 0, n_dec = 0;
    long spec_steps = 0, spec_proposed = 0, spec_accepted = 0;
    if (!rc && (!pre || !dec)) rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    for (int r = 0; r < a->reps && !rc; r++) {
        sweep_run run = {.ttft = &ttft, .tpot = &tpot};
        const workload_hooks h = {.ctx = &run, .after_step = sweep_after_step, .on_request = sweep_on_request};
        if ((rc = workload_run(e, n_vocab, w, &s->rng, &h, "bench", st))) break;
        if (run.prefill_s > 0) pre[n_pre++] = run.prefill_tokens / run.prefill_s;
        if (run.decode_s > 0 && run.decode_tokens > 0) dec[n_dec++] = run.decode_tokens / run.decode_s;
        preempted += run.preempted;
        spec_steps += run.spec_steps;
        spec_proposed += run.spec_proposed;
        spec_accepted += run.spec_accepted;
        bench_progress_update(&s->prog, ++s->done_runs);
    }
    if (!rc) {
        report *rep = s->rep;
        report_row(rep);
        bench_meta(rep, s->m, b, s->label, a->mo.backend.n_threads);
        report_str(rep, "kv_type", kv_dtype_name(b->opts.kv_dtype));
        report_str(rep, "prefix_cache", a->mo.engine.prefix_cache ? "on" : "off");
        report_str(rep, "sched", sched_policy_name(engine_options(e)->policy));
        report_int(rep, "block_size", b->opts.block_size);
        report_int(rep, "n_prompt", w.n_prompt);
        report_int(rep, "n_gen", w.n_gen);
        report_int(rep, "n_batch", w.n_requests);
        if (!a->depth_default) report_int(rep, "depth", w.n_depth);
        add_spec_columns(rep, a, w.spec.mode, spec_steps, spec_proposed, spec_accepted);
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
    return rc;
}

/* "-d N " for error messages, or "" at depth 0; buf holds 32 bytes. */
static const char *depth_flag(long d, char *buf) {
    if (d > 0) snprintf(buf, 32, "-d %ld ", d);
    return buf;
}

/* The rows of one (kv dtype, block size): one engine, sized for the largest -d + -p + -n
 * times -b, serves every (p, n, b, d). */
static int sweep_engine(sweep_ctx *s, int ik, int bs, int max_b, llmi_status *st) {
    const bench_args *a = s->a;
    long need = 0;
    for (int id = 0; id < a->nd; id++)
        if (a->d[id] % bs)
            return llmi_fail(st, LLMI_E_USAGE,
                             "-d %ld: must be a multiple of the KV block size %d (the context is kept as whole cached "
                             "blocks)",
                             a->d[id], bs);
    for (int i = 0; i < a->np; i++)
        for (int j = 0; j < a->nn; j++)
            for (int k = 0; k < a->nb; k++)
                for (int id = 0; id < a->nd; id++) {
                    long nb = a->b[k] * blocks_for(a->d[id] + a->p[i] + a->n[j], bs);
                    need = nb > need ? nb : need;
                }
    const cli_engine_fit fit = {.kv_dtype_set = a->kv_given, .kv_dtype = a->kv[ik], .block_size = bs,
                                .need_blocks = need, .min_seqs = max_b, .decode_together = true};
    llmi_backend *b;
    llmi_engine *e;
    int rc = cli_open_engine(&a->mo, s->m, &fit, &b, &e, st);
    if (rc) return rc;
    const int total = engine_kv_blocks_total(e);
    for (int i = 0; i < a->np && !rc; i++)
        for (int j = 0; j < a->nn && !rc; j++)
            for (int id = 0; id < a->nd && !rc; id++)
                if (blocks_for(a->d[id] + a->p[i] + a->n[j], bs) > total)
                    rc = llmi_fail(st, LLMI_E_USAGE,
                                   "%s-p %ld -n %ld: one request needs %ld KV blocks of %d tokens, the cache has %d "
                                   "(--num-blocks/--kv-mem)",
                                   depth_flag(a->d[id], (char[32]){0}), a->p[i], a->n[j],
                                   blocks_for(a->d[id] + a->p[i] + a->n[j], bs), bs, total);
    for (int ip = 0; ip < a->np && !rc; ip++)
        for (int in = 0; in < a->nn && !rc; in++)
            for (int ibt = 0; ibt < a->nb && !rc; ibt++)
                for (int id = 0; id < a->nd && !rc; id++)
                    for (int is = 0; is < (a->nspec ? a->nspec : 1) && !rc; is++) {
                        workload_shape w = {.n_prompt = (int)a->p[ip], .n_gen = (int)a->n[in],
                                            .n_requests = (int)a->b[ibt], .n_depth = (int)a->d[id]};
                        if (a->nspec) {
                            w.spec = a->spec_p;
                            w.spec.mode = a->spec[is];
                        }
                        rc = sweep_point(s, b, e, w, st);
                    }
    cli_close_engine(b, e);
    return rc;
}

static int bench_sweep(const bench_args *a, const llmi_model *m, const char *label, report *rep, llmi_status *st) {
    const int ctx = ctx_of(a, m);
    int max_b = 1;
    for (int i = 0; i < a->nb; i++) max_b = a->b[i] > max_b ? (int)a->b[i] : max_b;
    /* Every row checked before any work: a request that cannot fit alone is an error. */
    for (int i = 0; i < a->np; i++)
        for (int j = 0; j < a->nn; j++)
            for (int id = 0; id < a->nd; id++)
                if (a->d[id] + a->p[i] + a->n[j] > ctx)
                    return llmi_fail(st, LLMI_E_USAGE, "%s-p %ld -n %ld: %ld tokens exceed the context length %d (-c)",
                                     depth_flag(a->d[id], (char[32]){0}), a->p[i], a->n[j],
                                     a->d[id] + a->p[i] + a->n[j], ctx);
    sweep_ctx s = {.a = a, .m = m, .label = label, .rep = rep};
    stats_rng_seed(&s.rng, a->seed);
    const int total_rows = a->nkv * a->nbs * a->np * a->nn * a->nb * a->nd * (a->nspec ? a->nspec : 1);
    bench_progress_init(&s.prog, "bench", total_rows * (a->reps + a->warmup));
    int rc = 0;
    for (int ik = 0; ik < a->nkv && !rc; ik++)
        for (int ib = 0; ib < a->nbs && !rc; ib++) rc = sweep_engine(&s, ik, (int)a->bs[ib], max_b, st);
    bench_progress_end(&s.prog);
    return rc;
}

/* ------------------------------------------------------------------ throughput */

typedef struct tp_req {
    int32_t *prompt;      /* (n_prompt); with --turns, a later turn's is built when the one before ends */
    int n_prompt;
    int n_bound;          /* most prompt tokens it can have (a later turn grows with the answers before it) */
    int max_tokens;
    int32_t *user;        /* (n_user) with --turns: this turn's user message */
    int n_user;
    int id;               /* engine id once submitted; -1 before, -2 once harvested */
    double arrival;       /* due: the scheduled arrival, or (a later turn) when the previous turn ended;
                             seconds after the start */
    double submitted;     /* when the loop handed it to the engine (>= arrival) */
    double last_token;    /* engine clock of the latest token */
    /* copied from the engine when the request finishes */
    int n_generated, n_preempted, n_cached;
    llmi_finish finish;
    double ttft, latency, t_first, t_finish;
} tp_req;

/* One throughput run: its requests and what serving them measured. */
typedef struct tp_run {
    llmi_engine *e;
    tp_req *reqs;         /* (n) conversation c's turn k is reqs[c * turns + k] */
    int n, turns, n_conv; /* n = n_conv * turns */
    double rate;          /* requests (conversations) per second; 0 = all at t = 0 */
    double *arrivals;     /* (n_conv) scheduled arrivals of first turns, seconds after the start */
    tok_chat_pieces chat;
    double t_start;       /* engine clock when the first request could arrive */
    double elapsed;       /* seconds from t_start to the end of the last step */
    int preemptions;
    int decode_batch_max; /* the most sequences decoding together in one step */
    double warmup_s;      /* the untimed warm-up before t_start (tp_warm) */
    long spec_steps, spec_proposed, spec_accepted;
    dvec itl;             /* every gap between consecutive tokens of a request (s) */
    dvec kv_t, kv_u;      /* after every step: seconds since t_start, KV blocks used / total */
    bool oom;             /* a token callback could not record its sample */
    /* --max-concurrency: a request (a prompt with its --samples, a conversation with its
     * turns) holds one of max_conc slots from its submission until its last sequence ends */
    int max_conc, group;  /* slots (0: no limit); conversations per request (--samples) */
    int *group_left;      /* (n_conv / group) sequences of each request not yet harvested */
    int in_flight;        /* requests holding a slot */
    double slot_freed;    /* seconds since t_start when a slot was last given back */
} tp_run;

static void tp_on_token(void *ctx, const llmi_token_event *ev) {
    tp_run *c = ctx;
    tp_req *r = &c->reqs[(intptr_t)ev->user];
    if (ev->token < 0) return;
    double now = engine_now(c->e);
    if (r->last_token > 0 && dvec_push(&c->itl, now - r->last_token)) c->oom = true;
    r->last_token = now;
}

#define BENCH_MAX_TEXT ((size_t)2 << 30)   /* --dataset and --ppl text */

/* --dataset's prompts (as_message: user messages, tokenized without BOS), cycled to at
 * least `want` and to a multiple of `multiple`. */
static int read_dataset(const bench_args *a, const llmi_model *m, int want, int multiple, bool as_message,
                        tp_req **out, int *n_out, llmi_status *st) {
    char *all;
    size_t all_len;
    fileio_opts fo = {.flag = "--dataset", .max_bytes = BENCH_MAX_TEXT, .allow_stream = true};
    if (fileio_read(a->dataset, &fo, &all, &all_len, st)) return st->code;
    tp_req *reqs = NULL;
    int n = 0, cap = 0, rc = 0;
    long lineno = 0;
    for (char *line = all, *next; line < all + all_len; line = next) {
        char *nl = memchr(line, '\n', (size_t)(all + all_len - line));
        next = nl ? nl + 1 : all + all_len;
        size_t len = (size_t)((nl ? nl : all + all_len) - line);
        lineno++;
        while (len > 0 && line[len - 1] == '\r') len--;
        line[len] = '\0';
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
        rc = tok_encode(m->tok, text, tlen, !as_message, false, &r->prompt, &r->n_prompt, st);
        cJSON_Delete(j);
        if (rc) break;
        if (r->n_prompt == 0) { free(r->prompt); continue; }
        r->max_tokens = max_tokens;
        n++;
        if (want > 0 && n >= want) break;
    }
    free(all);
    if (!rc && n == 0) rc = llmi_fail(st, LLMI_E_USAGE, "--dataset %s: no prompts in it", a->dataset);
    /* Fewer lines than wanted: cycle through them. */
    int total = want > n ? want : n;
    total = (total + multiple - 1) / multiple * multiple;
    if (!rc && total > n) {
        tp_req *nr = realloc(reqs, (size_t)total * sizeof *nr);
        if (!nr) rc = llmi_fail(st, LLMI_E_RUNTIME, "--dataset: out of memory");
        else {
            reqs = nr;
            const int n_lines = n;
            for (int i = n_lines; i < total; i++) {
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

/* vLLM's random dataset: each length uniform in [L*(1-R), L*(1+R)], at least 1; n requests
 * (or, with --turns, n user messages). */
static int random_requests(const bench_args *a, const llmi_model *m, stats_rng *rng, int n, tp_req **out, int *n_out,
                           llmi_status *st) {
    int P = a->prefix_len;
    tp_req *reqs = calloc((size_t)n, sizeof *reqs);
    int32_t *prefixes = P ? malloc((size_t)a->num_prefixes * P * sizeof(int32_t)) : NULL;   /* (num_prefixes, P) */
    *out = reqs;
    *n_out = 0;
    if (!reqs || (P && !prefixes)) {
        free(prefixes);
        return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory for %d requests", n);
    }
    if (P) workload_random_tokens(rng, prefixes, a->num_prefixes * P, m->cfg.n_vocab);
    long in_lo = (long)floor(a->input_len * (1 - a->range_ratio)), in_hi = (long)floor(a->input_len * (1 + a->range_ratio));
    long out_lo = (long)floor(a->output_len * (1 - a->range_ratio)), out_hi = (long)floor(a->output_len * (1 + a->range_ratio));
    if (in_lo < 1) in_lo = 1;
    if (out_lo < 1) out_lo = 1;
    for (int i = 0; i < n; i++) {
        int own = (int)stats_rng_range(rng, in_lo, in_hi);
        reqs[i].n_prompt = P + own;
        reqs[i].max_tokens = (int)stats_rng_range(rng, out_lo, out_hi);
        reqs[i].prompt = malloc((size_t)reqs[i].n_prompt * sizeof(int32_t));
        if (!reqs[i].prompt) {
            free(prefixes);
            *n_out = i;
            return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
        }
        if (P) memcpy(reqs[i].prompt, prefixes + (size_t)(i % a->num_prefixes) * P, (size_t)P * sizeof(int32_t));
        workload_random_tokens(rng, reqs[i].prompt + P, own, m->cfg.n_vocab);
    }
    free(prefixes);
    *n_out = n;
    return 0;
}

static void add_percentiles(report *r, const char *key, const dvec *d, double scale) {
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

/* Concatenates up to five token pieces into a new array *out (n). */
static int concat(int32_t **out, int *n, const int32_t *p[5], const int len[5]) {
    int total = 0;
    for (int i = 0; i < 5; i++) total += len[i];
    int32_t *v = malloc((size_t)(total > 0 ? total : 1) * sizeof *v);
    if (!v) return -1;
    int o = 0;
    for (int i = 0; i < 5; i++) {
        if (len[i]) memcpy(v + o, p[i], (size_t)len[i] * sizeof *v);
        o += len[i];
    }
    *out = v;
    *n = total;
    return 0;
}

/* With --turns: every request's message becomes its user turn; first turns get their
 * prompt now, later ones a bound on theirs. */
static int tp_make_turns(tp_run *run, llmi_status *st) {
    const tok_chat_pieces *c = &run->chat;
    for (int i = 0; i < run->n; i++) {
        tp_req *r = &run->reqs[i];
        r->user = r->prompt;
        r->n_user = r->n_prompt;
        r->prompt = NULL;
        if (i % run->turns == 0) {
            const int32_t *p[5] = {c->first, r->user, c->after, NULL, NULL};
            const int len[5] = {c->n_first, r->n_user, c->n_after, 0, 0};
            if (concat(&r->prompt, &r->n_prompt, p, len)) return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
            r->n_bound = r->n_prompt;
        } else {
            const tp_req *prev = r - 1;
            r->n_prompt = 0;
            r->n_bound = prev->n_bound + prev->max_tokens + c->n_next + r->n_user + c->n_after_next;
        }
    }
    return 0;
}

/* Repeats each of the n requests S times in place (prompt copies), for --samples. */
static int expand_samples(tp_req **reqs, int *n, int S, llmi_status *st) {
    tp_req *out = calloc((size_t)*n * S, sizeof *out);
    if (!out) return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory for %d x %d sequences", *n, S);
    int k = 0, rc = 0;
    for (int i = 0; i < *n; i++)
        for (int j = 0; j < S; j++, k++) {
            out[k] = (*reqs)[i];
            if (j == 0) continue;
            out[k].prompt = malloc((size_t)out[k].n_prompt * sizeof(int32_t));
            if (!out[k].prompt) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory for %d x %d sequences", *n, S);
                break;
            }
            memcpy(out[k].prompt, (*reqs)[i].prompt, (size_t)out[k].n_prompt * sizeof(int32_t));
        }
    if (rc) {   /* out holds copies up to k; the originals stay with *reqs */
        for (int i = 0; i < k; i++)
            if (i % S) free(out[i].prompt);
        free(out);
        return rc;
    }
    free(*reqs);
    *reqs = out;
    *n = k;
    return 0;
}

/* The requests (--dataset lines or random ones), each checked against the context, and
 * their arrival times; *need: KV blocks of all conversations at once. */
static int tp_prepare(const bench_args *a, const llmi_model *m, stats_rng *rng, tp_run *run, long *need,
                      llmi_status *st) {
    int rc = 0;
    const int T = a->turns;
    run->turns = T;
    if (T > 1 && !m->tok) rc = llmi_fail(st, LLMI_E_USAGE, "--turns: the model has no tokenizer");
    else if (T > 1) rc = tok_chat_pieces_make(m->tok, NULL, &run->chat, st);
    if (rc) return rc;
    if (a->dataset) {
        if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "--dataset: the model has no tokenizer");
        rc = read_dataset(a, m, a->num_requests * T, T, T > 1, &run->reqs, &run->n, st);
    } else {
        rc = random_requests(a, m, rng, a->num_requests * T, &run->reqs, &run->n, st);
    }
    if (!rc && a->samples > 1) rc = expand_samples(&run->reqs, &run->n, a->samples, st);
    run->n_conv = run->n / T;
    for (int i = 0; i < run->n; i++) {
        run->reqs[i].id = -1;
        run->reqs[i].n_bound = run->reqs[i].n_prompt;
    }
    if (!rc && T > 1) rc = tp_make_turns(run, st);
    const int ctx = ctx_of(a, m), bs = (int)a->bs[0];
    *need = 0;
    for (int i = 0; i < run->n && !rc; i++) {
        tp_req *r = &run->reqs[i];
        if (r->n_bound + r->max_tokens > ctx) {
            if (T > 1)
                rc = llmi_fail(st, LLMI_E_USAGE,
                               "bench: conversation %d's turn %d can reach %d prompt + %d generated tokens, more than the "
                               "context %d (-c; or fewer --turns, shorter lengths)",
                               i / T, i % T + 1, r->n_bound, r->max_tokens, ctx);
            else
                rc = llmi_fail(st, LLMI_E_USAGE,
                               "bench: request %d needs %d prompt + %d generated tokens, more than the context %d (-c)",
                               i, r->n_prompt, r->max_tokens, ctx);
        }
        /* A conversation holds one turn at a time, its last one the largest. */
        if (i % T == T - 1) *need += blocks_for(r->n_bound + r->max_tokens, bs);
    }
    if (rc) return rc;
    if (!(run->arrivals = malloc((size_t)(run->n_conv > 0 ? run->n_conv : 1) * sizeof *run->arrivals)))
        return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    /* A prompt's samples arrive together. */
    const int S = a->samples;
    stats_poisson_arrivals(rng, run->rate, run->n_conv / S, run->arrivals);
    for (int c = run->n_conv - 1; c >= 0; c--) run->arrivals[c] = run->arrivals[c / S];
    for (int c = 0; c < run->n_conv; c++) run->reqs[(size_t)c * T].arrival = run->arrivals[c];
    return 0;
}

/* Every request must fit the cache alone, or it would wait forever. */
static int tp_check_fit(const tp_run *run, int bs, llmi_status *st) {
    const int total = engine_kv_blocks_total(run->e);
    for (int i = 0; i < run->n; i++) {
        const tp_req *r = &run->reqs[i];
        long blocks = blocks_for(r->n_bound + r->max_tokens, bs);
        if (blocks > total)
            return llmi_fail(st, LLMI_E_USAGE,
                             "bench: request %d (%d + %d tokens) needs %ld KV blocks alone, the cache has %d "
                             "(--num-blocks/--kv-mem)",
                             i, r->n_bound, r->max_tokens, blocks, total);
    }
    return 0;
}

static int tp_submit(tp_run *run, int i, llmi_request_params rp, double now, llmi_status *st) {
    tp_req *r = &run->reqs[i];
    rp.max_tokens = r->max_tokens;
    rp.sampling.seed += (uint64_t)i;   /* each request its own stream */
    r->submitted = now;
    return engine_add_request(run->e, r->prompt, r->n_prompt, &rp, (void *)(intptr_t)i, &r->id, st);
}

/* Turn i + 1 of a conversation, due now that turn i (ri) has ended: turn i's prompt, its
 * answer (less a final end-of-generation token, which the template writes itself), the
 * template's text between, the next user message, the assistant turn opened. */
static int tp_next_turn(tp_run *run, int i, const llmi_request_info *ri, const llmi_request_params *rp, double now,
                        llmi_status *st) {
    const tp_req *r = &run->reqs[i];
    tp_req *nx = &run->reqs[i + 1];
    const tok_chat_pieces *c = &run->chat;
    int n_answer = ri->n_generated - (ri->finish == LLMI_FINISH_EOS ? 1 : 0);
    const int32_t *p[5] = {r->prompt, ri->tokens + ri->n_prompt, c->next, nx->user, c->after_next};
    const int len[5] = {r->n_prompt, n_answer > 0 ? n_answer : 0, c->n_next, nx->n_user, c->n_after_next};
    if (concat(&nx->prompt, &nx->n_prompt, p, len)) return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    nx->arrival = now;
    return tp_submit(run, i + 1, *rp, now, st);
}

/* Copies out and releases the finished requests among the first `upto`, so the engine's
 * memory does not grow with N, and submits the turns that follow them; *got: how many
 * it harvested. */
static int tp_harvest(tp_run *run, const llmi_request_params *rp, int upto, int *got, llmi_status *st) {
    *got = 0;
    for (int i = 0; i < upto; i++) {
        tp_req *r = &run->reqs[i];
        if (r->id < 0) continue;
        const llmi_request_info *ri = engine_request(run->e, r->id);
        if (!ri || ri->finish == LLMI_FINISH_NONE) continue;
        r->n_generated = ri->n_generated;
        r->n_preempted = ri->n_preempted;
        r->n_cached = ri->n_cached_tokens;
        r->finish = ri->finish;
        r->t_first = ri->n_generated > 0 ? ri->t_first_token : ri->t_prefill_done;
        r->t_finish = ri->t_finish;
        /* Latencies count from when the request was due: one due while a step runs waits
         * for it, and that wait is part of what a client would see. */
        double due = run->t_start + r->arrival;
        r->ttft = r->t_first - due;
        r->latency = ri->t_finish - due;
        int rc = 0;
        if (run->group_left && --run->group_left[i / (run->turns * run->group)] == 0) {
            run->in_flight--;
            run->slot_freed = engine_now(run->e) - run->t_start;
        }
        if ((i + 1) % run->turns != 0) rc = tp_next_turn(run, i, ri, rp, engine_now(run->e) - run->t_start, st);
        engine_release(run->e, r->id);
        r->id = -2;
        ++*got;
        if (rc) return rc;
    }
    return 0;
}

/* Serves every request, each submitted when due, by continuous batching. */
static int tp_serve(const bench_args *a, tp_run *run, llmi_status *st) {
    llmi_engine *e = run->e;
    const int T = run->turns;
    llmi_request_params rp = request_params_defaults();
    rp.sampling = a->sampling;
    rp.sampling.seed = a->seed;
    /* Random prompts have no meaningful EOS; dataset prompts stop as the model says. */
    rp.ignore_eos = a->dataset == NULL;
    if (a->nspec) {
        rp.spec = a->spec_p;
        rp.spec.mode = a->spec[0];
    }
    const int S = run->group;
    run->in_flight = 0;
    if (run->max_conc > 0) {
        if (!(run->group_left = malloc((size_t)(run->n_conv / S) * sizeof *run->group_left)))
            return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
        for (int g = 0; g < run->n_conv / S; g++) run->group_left[g] = S * T;
    }
    bench_progress prog;
    bench_progress_init(&prog, "bench", run->n);
    int rc = 0, next = 0, n_done = 0;
    bench_peak_reset();
    run->t_start = engine_now(e);
    while (!rc && (next < run->n_conv || engine_has_work(e))) {
        if (cli_was_interrupted()) { rc = llmi_fail(st, LLMI_E_INTERRUPT, "bench: interrupted"); break; }
        double now = engine_now(e) - run->t_start;
        while (!rc && next < run->n_conv && run->arrivals[next] <= now) {
            if (next % S == 0 && run->max_conc > 0) {
                if (run->in_flight >= run->max_conc) break;
                run->in_flight++;
                /* vLLM's client-side limit: a request that waited for a slot was not sent
                 * before the slot freed, so its latencies count from then */
                for (int k = 0; k < S; k++) {
                    tp_req *r = &run->reqs[(size_t)(next + k) * T];
                    if (run->slot_freed > r->arrival) r->arrival = run->slot_freed;
                }
            }
            rc = tp_submit(run, next++ * T, rp, now, st);
        }
        if (rc) break;
        if (!engine_has_work(e)) {
            sleep_s(run->arrivals[next] - (engine_now(e) - run->t_start));
            continue;
        }
        llmi_step_info info;
        if ((rc = engine_step(e, tp_on_token, run, &info, st))) break;
        if (run->oom) { rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory"); break; }
        run->preemptions += info.n_preempted;
        if (info.n_decode_seqs > run->decode_batch_max) run->decode_batch_max = info.n_decode_seqs;
        run->spec_steps += info.n_spec_steps;
        run->spec_proposed += info.n_spec_proposed;
        run->spec_accepted += info.n_spec_accepted;
        double t = engine_now(e) - run->t_start;
        if (info.kv_blocks_total > 0 &&
            (dvec_push(&run->kv_t, t) || dvec_push(&run->kv_u, (double)info.kv_blocks_used / info.kv_blocks_total))) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
            break;
        }
        int got = 0;
        rc = tp_harvest(run, &rp, next * T, &got, st);
        if (got) bench_progress_update(&prog, n_done += got);
    }
    bench_progress_end(&prog);
    run->elapsed = engine_now(e) - run->t_start;
    return rc;
}

/* What the report says of the finished requests (all of them, or those done before Ctrl-C). */
typedef struct tp_summary {
    int n_done;
    long prompt_tokens, requested, cached, generated;
    int by_len, by_eos, other;    /* finish reasons */
    dvec ttft, tpot, e2e;         /* per request (s); tpot of those with 2+ tokens */
    dvec tpot_all;                /* per request (s), NaN for one with < 2 tokens: aligned with ttft, e2e */
    dvec turn_ttft[BENCH_MAX_TURNS];            /* per turn (s) */
    long turn_prompt[BENCH_MAX_TURNS], turn_cached[BENCH_MAX_TURNS];
} tp_summary;

static int tp_summarise(const tp_run *run, tp_summary *sum, llmi_status *st) {
    for (int i = 0; i < run->n; i++) {
        const tp_req *r = &run->reqs[i];
        if (r->id != -2) continue;
        const int k = i % run->turns;
        double tpot = r->n_generated > 1 ? (r->t_finish - r->t_first) / (r->n_generated - 1) : NAN;
        sum->n_done++;
        sum->prompt_tokens += r->n_prompt;
        sum->requested += r->max_tokens;
        sum->cached += r->n_cached;
        sum->generated += r->n_generated;
        sum->turn_prompt[k] += r->n_prompt;
        sum->turn_cached[k] += r->n_cached;
        if (r->finish == LLMI_FINISH_LENGTH) sum->by_len++;
        else if (r->finish == LLMI_FINISH_EOS) sum->by_eos++;
        else sum->other++;
        if (dvec_push(&sum->ttft, r->ttft) || dvec_push(&sum->e2e, r->latency) || dvec_push(&sum->tpot_all, tpot) ||
            dvec_push(&sum->turn_ttft[k], r->ttft) || (!isnan(tpot) && dvec_push(&sum->tpot, tpot)))
            return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    }
    return 0;
}

static void tp_summary_free(tp_summary *s) {
    free(s->ttft.v);
    free(s->tpot.v);
    free(s->e2e.v);
    free(s->tpot_all.v);
    for (int k = 0; k < BENCH_MAX_TURNS; k++) free(s->turn_ttft[k].v);
}

/* KV utilisation over time as at most 200 [t, util] points (json/jsonl only). */
static void tp_kv_series(report *rep, const tp_run *run) {
    const dvec *kv_t = &run->kv_t, *kv_u = &run->kv_u;
    size_t cap = 64 + (size_t)(kv_u->n < 200 ? kv_u->n : 200) * 40;
    char *js = malloc(cap);
    if (!js) return;
    size_t o = (size_t)snprintf(js, cap, "[");
    int stride = kv_u->n > 200 ? (kv_u->n + 199) / 200 : 1;
    for (int i = 0; i < kv_u->n && o < cap - 48; i += stride)
        o += (size_t)snprintf(js + o, cap - o, "%s[%.4f,%.4f]", o > 1 ? "," : "", kv_t->v[i], kv_u->v[i]);
    snprintf(js + o, cap - o, "]");
    report_raw_json(rep, "kv_util_series", js);
    free(js);
}

/* --slo: the limits, the share within each and goodput (ms, as the other latencies). */
static void tp_report_slo(const bench_args *a, const tp_run *run, const tp_summary *sum, report *rep) {
    const int n = sum->n_done;
    double *ms = malloc((size_t)(n > 0 ? 3 * n : 1) * sizeof *ms);   /* (3, n): ttft, tpot, e2e */
    if (!ms) return;
    for (int i = 0; i < n; i++) {
        ms[i] = sum->ttft.v[i] * 1e3;
        ms[n + i] = sum->tpot_all.v[i] * 1e3;
        ms[2 * n + i] = sum->e2e.v[i] * 1e3;
    }
    slo_result res;
    slo_account(&a->slo, ms, ms + n, ms + 2 * n, n, run->elapsed, &res);
    free(ms);
    report_num(rep, "slo_ttft_ms", a->slo.ttft_ms > 0 ? a->slo.ttft_ms : NAN, 2);
    report_num(rep, "slo_tpot_ms", a->slo.tpot_ms > 0 ? a->slo.tpot_ms : NAN, 2);
    report_num(rep, "slo_e2e_ms", a->slo.e2e_ms > 0 ? a->slo.e2e_ms : NAN, 2);
    report_num(rep, "slo_ttft_met", res.ttft_met, 4);
    report_num(rep, "slo_tpot_met", res.tpot_met, 4);
    report_num(rep, "slo_e2e_met", res.e2e_met, 4);
    report_num(rep, "slo_met", res.all_met, 4);
    report_num(rep, "goodput_rps", res.goodput_rps, 3);
}

static void tp_report(const bench_args *a, const llmi_model *m, const char *label, const llmi_backend *b,
                      const tp_run *run, const tp_summary *sum, report *rep) {
    const double t_end = run->elapsed;
    const int n = sum->n_done;
    const long prompt = sum->prompt_tokens, generated = sum->generated;
    report_row(rep);
    bench_meta(rep, m, b, label, a->mo.backend.n_threads);
    report_str(rep, "kv_type", kv_dtype_name(b->opts.kv_dtype));
    report_str(rep, "prefix_cache", a->mo.engine.prefix_cache ? "on" : "off");
    report_str(rep, "sched", sched_policy_name(engine_options(run->e)->policy));
    report_int(rep, "block_size", b->opts.block_size);
    report_str(rep, "dataset", a->dataset ? a->dataset : "random");
    const int S = a->samples;
    report_int(rep, "num_requests", run->turns > 1 ? run->n_conv : n / S);
    if (run->turns > 1) report_int(rep, "turns", run->turns);
    if (S > 1) report_int(rep, "samples", S);
    if (a->max_concurrency > 0) report_int(rep, "max_concurrency", a->max_concurrency);
    report_int(rep, "input_len", a->dataset ? 0 : a->input_len);
    report_int(rep, "output_len", a->output_len);
    report_num(rep, "range_ratio", a->range_ratio, 2);
    report_int(rep, "prefix_len", a->prefix_len);
    report_int(rep, "num_prefixes", a->prefix_len ? a->num_prefixes : 0);
    report_num(rep, "request_rate", run->rate > 0 ? run->rate : INFINITY, 2);
    report_int(rep, "seed", (long long)a->seed);
    report_num(rep, "temperature", a->sampling.temperature, 2);
    report_num(rep, "warmup_s", run->warmup_s, 3);
    report_num(rep, "elapsed_s", t_end, 3);
    report_num(rep, "requests_per_s", (double)n / S / t_end, 3);
    report_num(rep, "output_tps", generated / t_end, 2);
    report_num(rep, "total_tps", (generated + prompt) / t_end, 2);
    report_int(rep, "prompt_tokens", prompt);
    report_int(rep, "output_tokens", generated);
    report_int(rep, "requested_output_tokens", sum->requested);
    report_int(rep, "cached_prompt_tokens", sum->cached);
    report_num(rep, "prefix_hit_rate", prompt > 0 ? (double)sum->cached / (double)prompt : 0.0, 4);
    report_int(rep, "finished_length", sum->by_len);
    report_int(rep, "finished_eos", sum->by_eos);
    report_int(rep, "finished_other", sum->other);
    add_percentiles(rep, "ttft_ms", &sum->ttft, 1e3);
    add_percentiles(rep, "tpot_ms", &sum->tpot, 1e3);
    add_percentiles(rep, "itl_ms", &run->itl, 1e3);
    add_percentiles(rep, "e2e_ms", &sum->e2e, 1e3);
    if (slo_any(&a->slo)) tp_report_slo(a, run, sum, rep);
    for (int k = 0; run->turns > 1 && k < run->turns; k++) {
        char key[REPORT_KEY_LEN];
        const dvec *t = &sum->turn_ttft[k];
        snprintf(key, sizeof key, "turn%d_prompt_tokens", k + 1);
        report_num(rep, key, t->n ? (double)sum->turn_prompt[k] / t->n : NAN, 1);
        snprintf(key, sizeof key, "turn%d_cached_tokens", k + 1);
        report_num(rep, key, t->n ? (double)sum->turn_cached[k] / t->n : NAN, 1);
        snprintf(key, sizeof key, "turn%d_ttft_ms_mean", k + 1);
        report_num(rep, key, t->n ? stats_mean(t->v, t->n) * 1e3 : NAN, 2);
        snprintf(key, sizeof key, "turn%d_ttft_ms_p90", k + 1);
        report_num(rep, key, t->n ? stats_percentile(t->v, t->n, 90) * 1e3 : NAN, 2);
    }
    report_int(rep, "preemptions", run->preemptions);
    report_int(rep, "decode_batch_max", run->decode_batch_max);
    add_spec_columns(rep, a, a->nspec ? a->spec[0] : LLMI_SPEC_OFF, run->spec_steps, run->spec_proposed,
                     run->spec_accepted);
    double umax = 0;
    for (int i = 0; i < run->kv_u.n; i++) umax = run->kv_u.v[i] > umax ? run->kv_u.v[i] : umax;
    report_num(rep, "kv_util_mean", stats_mean(run->kv_u.v, run->kv_u.n), 3);
    report_num(rep, "kv_util_max", umax, 3);
    add_memory(rep, b, run->e, bench_peak_rss());
    tp_kv_series(rep, run);
}

/* --per-request: one JSON line per request, in input order (conversation by conversation);
 * a --request-rate list appends each rate's lines, tagged with it. */
static int tp_write_requests(const char *path, const tp_run *run, bool append, bool tag_rate, llmi_status *st) {
    FILE *f = fopen(path, append ? "a" : "w");
    if (!f) return llmi_fail(st, LLMI_E_RUNTIME, "--per-request %s: cannot write it", path);
    for (int i = 0; i < run->n; i++) {
        const tp_req *r = &run->reqs[i];
        fprintf(f, "{\"index\":%d,", i);
        if (tag_rate) fprintf(f, "\"request_rate\":%.10g,", run->rate);
        if (run->turns > 1) fprintf(f, "\"conversation\":%d,\"turn\":%d,", i / run->turns, i % run->turns + 1);
        fprintf(f,
                "\"n_prompt\":%d,\"max_tokens\":%d,\"n_generated\":%d,\"n_cached\":%d,\"finish\":\"%s\","
                "\"arrival_s\":%.6f,\"submitted_s\":%.6f,\"ttft_ms\":%.6f,\"latency_ms\":%.6f,\"tpot_ms\":%.6f,"
                "\"preempted\":%d}\n",
                r->n_prompt, r->max_tokens, r->n_generated, r->n_cached, finish_name(r->finish), r->arrival,
                r->submitted, r->ttft * 1e3, r->latency * 1e3,
                r->n_generated > 1 ? (r->t_finish - r->t_first) / (r->n_generated - 1) * 1e3 : 0.0, r->n_preempted);
    }
    if (fclose(f)) return llmi_fail(st, LLMI_E_RUNTIME, "--per-request %s: write failed", path);
    return 0;
}

/* What --plot draws of the throughput runs: one line per rate (or per turn). */
typedef struct tp_plot {
    bench_plot_samples ttft[BENCH_PLOT_MAX_LINES], itl[BENCH_PLOT_MAX_LINES], kv[BENCH_PLOT_MAX_LINES];
    int n_ttft, n_itl, n_kv;
} tp_plot;

static int samples_add(bench_plot_samples *s, int *n, const char *label, const double *x, const double *y, int len,
                       double scale) {
    if (*n == BENCH_PLOT_MAX_LINES) return 0;
    bench_plot_samples *p = &s[(*n)++];
    snprintf(p->label, sizeof p->label, "%s", label);
    p->n = len;
    p->x = x ? malloc((size_t)(len > 0 ? len : 1) * sizeof *p->x) : NULL;
    p->y = malloc((size_t)(len > 0 ? len : 1) * sizeof *p->y);
    if ((x && !p->x) || !p->y) return -1;
    for (int i = 0; i < len; i++) {
        if (x) p->x[i] = x[i];
        p->y[i] = y[i] * scale;
    }
    return 0;
}

static int tp_plot_add(tp_plot *pl, const tp_run *run, const tp_summary *sum, bool per_turn, llmi_status *st) {
    char label[48];
    if (run->rate > 0) snprintf(label, sizeof label, "%g req/s", run->rate);
    else snprintf(label, sizeof label, "all at t = 0");
    int rc = 0;
    if (per_turn)
        for (int k = 0; k < run->turns && !rc; k++) {
            char tl[48];
            snprintf(tl, sizeof tl, "turn %d", k + 1);
            rc = samples_add(pl->ttft, &pl->n_ttft, tl, NULL, sum->turn_ttft[k].v, sum->turn_ttft[k].n, 1e3);
        }
    else rc = samples_add(pl->ttft, &pl->n_ttft, label, NULL, sum->ttft.v, sum->ttft.n, 1e3);
    if (!rc) rc = samples_add(pl->itl, &pl->n_itl, label, NULL, run->itl.v, run->itl.n, 1e3);
    if (!rc) rc = samples_add(pl->kv, &pl->n_kv, label, run->kv_t.v, run->kv_u.v, run->kv_u.n, 1);
    return rc ? llmi_fail(st, LLMI_E_RUNTIME, "--plot: out of memory") : 0;
}

static void tp_plot_free(tp_plot *pl) {
    bench_plot_samples *all[3] = {pl->ttft, pl->itl, pl->kv};
    int n[3] = {pl->n_ttft, pl->n_itl, pl->n_kv};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n[k]; i++) {
            free(all[k][i].x);
            free(all[k][i].y);
        }
}

/* The untimed warm-up of an offline run (--warmup 0 skips it): workload_warm_serving at the
 * most conversations that can run at once, its prompts from a stream of their own, so that
 * the timed requests are those the same --seed gives without it. */
static int tp_warm(const bench_args *a, const llmi_model *m, tp_run *run, llmi_status *st) {
    stats_rng rng;
    stats_rng_seed(&rng, a->seed + 0x9e3779b97f4a7c15ull);
    const double t0 = engine_now(run->e);
    int rc = workload_warm_serving(run->e, m->cfg.n_vocab, ctx_of(a, m), run->n_conv, &rng, NULL, "bench", st);
    run->warmup_s = engine_now(run->e) - t0;
    return rc;
}

/* One run at one rate (prepare, open, warm up, serve), summarised and reported.  Ctrl-C
 * reports the requests finished so far, then returns LLMI_E_INTERRUPT. */
static int tp_run_one(const bench_args *a, const llmi_model *m, const char *label, int k, report *rep, tp_plot *plot,
                      llmi_status *st) {
    const double rate = a->n_rates ? a->rates[k] : 0;
    stats_rng rng;
    stats_rng_seed(&rng, a->seed);   /* every rate serves the same requests */
    tp_run run = {.rate = rate, .max_conc = a->max_concurrency, .group = a->samples};
    tp_summary sum = {0};
    llmi_backend *b = NULL;
    long need = 0;
    const int bs = (int)a->bs[0];
    int rc = tp_prepare(a, m, &rng, &run, &need, st);
    if (!rc) {
        const cli_engine_fit fit = {.kv_dtype_set = a->kv_given, .kv_dtype = a->kv[0], .block_size = bs,
                                    .need_blocks = need, .min_seqs = 1};
        rc = cli_open_engine(&a->mo, m, &fit, &b, &run.e, st);
    }
    if (!rc) rc = tp_check_fit(&run, bs, st);
    if (!rc && a->warmup > 0) rc = tp_warm(a, m, &run, st);
    if (!rc) rc = tp_serve(a, &run, st);
    int summarised = rc == 0 || rc == LLMI_E_INTERRUPT ? tp_summarise(&run, &sum, st) : rc;
    if (!summarised && sum.n_done > 0) {
        tp_report(a, m, label, b, &run, &sum, rep);
        if (plot) summarised = tp_plot_add(plot, &run, &sum, a->n_rates <= 1 && run.turns > 1, st);
    }
    if (!rc) rc = summarised;
    if (!rc && a->per_request)
        rc = tp_write_requests(a->per_request, &run, k > 0, a->n_rates > 1, st);
    if (run.e && rc) engine_abort_all(run.e, NULL, NULL);
    cli_close_engine(b, run.e);
    for (int i = 0; i < run.n; i++) {
        free(run.reqs[i].prompt);
        free(run.reqs[i].user);
    }
    free(run.reqs);
    free(run.arrivals);
    free(run.group_left);
    free(run.itl.v);
    free(run.kv_t.v);
    free(run.kv_u.v);
    tok_chat_pieces_free(&run.chat);
    tp_summary_free(&sum);
    return rc;
}

/* One row per --request-rate; with --slo and a rate list, every row also gets the
 * highest rate whose requests met every SLO for SLO_TARGET of them. */
static int bench_throughput(const bench_args *a, const llmi_model *m, const char *label, report *rep,
                            llmi_status *st) {
    tp_plot *plot = a->plot ? calloc(1, sizeof *plot) : NULL;
    if (a->plot && !plot) return llmi_fail(st, LLMI_E_RUNTIME, "bench: out of memory");
    const int first = rep->n_rows, n_runs = a->n_rates ? a->n_rates : 1;
    int rc = 0;
    for (int k = 0; k < n_runs && !rc; k++) rc = tp_run_one(a, m, label, k, rep, plot, st);
    if (slo_any(&a->slo) && a->n_rates > 0 && rep->n_rows > first) {
        double rates[BENCH_MAX_RATES], met[BENCH_MAX_RATES];
        int n = 0;
        for (int i = first; i < rep->n_rows && n < BENCH_MAX_RATES; i++, n++) {
            rates[n] = report_get(rep, i, "request_rate");
            met[n] = report_get(rep, i, "slo_met");
        }
        double best = slo_max_rate(rates, met, n, SLO_TARGET);
        for (int i = first; i < rep->n_rows; i++) report_num_at(rep, i, "slo_max_rate", best, 2);
    }
    if (plot && (rc == 0 || rc == LLMI_E_INTERRUPT) && rep->n_rows > first) {
        int prc = bench_plot_throughput(rep, plot->ttft, plot->n_ttft, plot->itl, plot->n_itl, plot->kv, plot->n_kv,
                                        a->plot, st);
        if (!rc) rc = prc;
    }
    if (plot) tp_plot_free(plot);
    free(plot);
    return rc;
}

/* ------------------------------------------------------------------ perplexity */

/* --ppl's window callback: the progress bar (a terminal) and Ctrl-C. */
static int ppl_on_chunk(void *ctx, int done, int total, double ppl) {
    bench_progress *p = ctx;
    char note[48];
    snprintf(note, sizeof note, "PPL %.4f", ppl);
    p->total = total;
    bench_progress_note(p, done, note);
    return cli_was_interrupted();
}

static int bench_ppl(const bench_args *a, const llmi_model *m, const char *label, report *rep, llmi_status *st) {
    if (!m->tok) return llmi_fail(st, LLMI_E_USAGE, "--ppl: the model has no tokenizer");
    char *text;
    size_t len;
    fileio_opts fo = {.flag = "--ppl", .max_bytes = BENCH_MAX_TEXT, .allow_stream = true};
    if (fileio_read(a->ppl, &fo, &text, &len, st)) return st->code;
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
    o.kv_type_set = a->kv_given;
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
    const int n_chunks = a->chunks > 0 && a->chunks < n_ids / n_ctx ? a->chunks : n_ids / n_ctx;
    bench_progress prog;
    bench_progress_init(&prog, "perplexity", n_chunks);
    /* On a terminal the bar carries the running estimate; in a log, llama.cpp's "[i]x," list. */
    ppl_opts po = {.n_ctx = n_ctx, .n_chunks = a->chunks, .n_batch = b->opts.max_batch_tokens,
                   .progress = prog.on ? NULL : stderr, .on_chunk = ppl_on_chunk, .ctx = &prog};
    ppl_result res;
    int bos = tok_add_bos(m->tok) ? tok_bos(m->tok) : -1;
    fprintf(stderr, "perplexity: %d tokens, %d chunks of %d, scoring: %s\n", n_ids, n_chunks, n_ctx, PPL_SCORING);
    rc = ppl_run(b, ids, n_ids, bos, &po, &res, st);
    bench_progress_end(&prog);
    if (!rc || (rc == LLMI_E_INTERRUPT && res.chunks > 0)) {
        fprintf(stderr, "%s: PPL = %.4f +/- %.5f\n", rc ? "Estimate so far" : "Final estimate", res.ppl, res.ppl_stderr);
        report_row(rep);
        bench_meta(rep, m, b, label, a->mo.backend.n_threads);
        report_str(rep, "kv_type", kv_dtype_name(b->opts.kv_dtype));
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

/* The rows as asked: md through bench_view (compact) unless --columns all. */
static int write_rows(const bench_args *a, const report *rep, report_format f, FILE *out) {
    if (f == REPORT_MD && !a->columns_all) return bench_view_write(rep, out);
    /* Perplexity is one result: -o json gives the object itself, not a list of one. */
    return report_write(rep, a->ppl && f == REPORT_JSON ? REPORT_JSONL : f, out);
}

int cmd_bench(int argc, char **argv, llmi_status *st) {
    bench_args a;
    memset(&a, 0, sizeof a);
    bool help = false;
    int rc = parse_args(argc, argv, &a, &help, st);
    if (!rc && help) {
        fputs(bench_usage(), stdout);
        fputs(cli_model_flags_help(), stdout);
    }
    if (!rc && !help && a.cmp_base) {
        rc = bench_compare(a.cmp_base, a.cmp_new, a.fmt, a.fail_below, stdout, st);
        help = true;   /* nothing else to run */
    }
    llmi_model m;
    memset(&m, 0, sizeof m);
    bool loaded = false;
    report rep;
    report_init(&rep);
    if (!rc && !help) {
        /* --ppl's windows are -c, 512 when not given: longrope's factors for that */
        cli_model_opts mo = a.mo;
        if (a.ppl && mo.engine.max_ctx <= 0) mo.engine.max_ctx = 512;
        rc = cli_open_model(&mo, &m, st);
        loaded = rc == 0;
    }
    char label[1024];
    if (loaded) {
        snprintf(label, sizeof label, "%s", a.mo.dummy ? a.mo.dummy : m.source_path);
        if (a.ppl) rc = bench_ppl(&a, &m, label, &rep, st);
        else if (a.throughput) rc = bench_throughput(&a, &m, label, &rep, st);
        else rc = bench_sweep(&a, &m, label, &rep, st);
        /* Ctrl-C: what was measured so far is still the report. */
        const bool partial = rc == LLMI_E_INTERRUPT;
        if (partial)
            fprintf(stderr, "bench: interrupted; the report has the %d row(s) measured so far\n", rep.n_rows);
        if (!rc && a.plot && !a.throughput) rc = bench_plot_sweep(&rep, a.plot, st);
        if (!rc || partial) {
            int wrc = write_rows(&a, &rep, a.fmt, stdout);
            if (wrc && !rc) rc = llmi_fail(st, wrc, "bench: cannot write the report to stdout");
        }
        for (int i = 0; i < a.n_out && (!rc || partial); i++) {
            FILE *f = fopen(a.out_path[i], "w");
            if (!f) { rc = llmi_fail(st, LLMI_E_RUNTIME, "--out %s: cannot write it", a.out_path[i]); break; }
            int wrc = write_rows(&a, &rep, a.out_fmt[i], f);
            if ((fclose(f) || wrc) && !partial) rc = llmi_fail(st, LLMI_E_RUNTIME, "--out %s: write failed", a.out_path[i]);
        }
    }
    report_free(&rep);
    if (loaded) model_free(&m);
    free(a.p);
    free(a.n);
    free(a.b);
    free(a.bs);
    free(a.d);
    free(a.rates);
    return rc ? (st->code ? st->code : LLMI_E_RUNTIME) : 0;
}
