/* cmd_profile.c — `llmi profile`: where the time and memory of one workload go.
 *
 * Runs workload.h's synthetic workload (b requests of p random prompt tokens generating
 * n each, after a short warm-up) with backend->profiling on, and reads the per-op-class
 * counters around every engine_step.  The backend times its own op classes inside
 * forward (backend->stats); the engine times sampling (after forward) and host/scheduler
 * time (before forward) in its own counters (engine_host_stats).  What the step wall
 * time holds beyond those is reported as "untimed", so nothing is hidden.
 * Steps that carry prompt tokens are the prefill phase, the others decode (as bench), or
 * verify when they verified speculated tokens (--spec: its time per step against a plain
 * decode step's; a draft model's proposing is host time, before the forward).
 *
 * Achieved rates compare with the device's peak: measured once here on the CPU (a
 * STREAM-like triad for bandwidth, an fp32 FMA loop for FLOP/s), a table of known GPUs,
 * or --peak-bw / --peak-flops.  --trace writes Chrome trace JSON (Perfetto, about:tracing):
 * real step spans, and inside each step one slice per op class with the class's summed
 * time laid end to end in pipeline order (the counters are totals, not timestamps). */
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "cli/report.h"
#include "cli/workload.h"
#include "metrics/stats.h"
#include "core/version.h"

typedef struct profile_args {
    cli_model_opts mo;
    int p, n, b, warmup;
    int prefix_len;               /* --prefix-len: prompt tokens every request shares, cached beforehand */
    llmi_spec_params spec;        /* --spec, --spec-k, --spec-ngram of every profiled request */
    double peak_bw, peak_flops;   /* bytes/s and FLOP/s; 0 = measure or look up */
    const char *trace;
    report_format fmt;
    uint64_t seed;
} profile_args;

enum { PH_PREFILL = 0, PH_DECODE, PH_VERIFY, PH_COUNT };
static const char *k_phase[PH_COUNT] = {"prefill", "decode", "verify"};

/* A step's phase, and the tokens it counts: prompt tokens computed, tokens decoded, or (verify)
 * tokens delivered, accepted proposals and bonus tokens together. */
static int step_phase(const llmi_step_info *info, long *tokens) {
    if (info->n_prefill_tokens > 0) {
        *tokens = info->n_prefill_tokens;
        return PH_PREFILL;
    }
    if (info->n_spec_steps > 0) {
        *tokens = info->n_generated;
        return PH_VERIFY;
    }
    *tokens = info->n_decode_tokens;
    return PH_DECODE;
}

/* Pipeline order for the trace and the tables. */
static const llmi_op_class k_order[LLMI_OP_COUNT] = {
    LLMI_OP_HOST, LLMI_OP_EMBED, LLMI_OP_NORM, LLMI_OP_QKV, LLMI_OP_ROPE_KV, LLMI_OP_ATTN, LLMI_OP_O_PROJ,
    LLMI_OP_MLP_UP, LLMI_OP_ACT, LLMI_OP_MLP_DOWN, LLMI_OP_LM_HEAD, LLMI_OP_SAMPLE};

typedef struct phase_acc {
    int steps;
    long tokens;
    double wall;                  /* sum of step wall times (s) */
    llmi_op_stats ops;            /* summed per class */
} phase_acc;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ------------------------------------------------------------------ peaks */

/* STREAM triad a = b + s*c over arrays far larger than the caches; best of 5. */
static double measure_cpu_bw(void) {
    const size_t n = (size_t)16 << 20;   /* 16 Mi floats = 64 MiB per array */
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    double best = 0;
    if (a && b && c) {
        #pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            #pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i];
            double dt = now_s() - t0;
            if (dt > 0 && 3.0 * n * sizeof(float) / dt > best) best = 3.0 * n * sizeof(float) / dt;
        }
    }
    volatile float sink = a ? a[n / 2] : 0;
    (void)sink;
    free(a); free(b); free(c);
    return best;
}

/* Independent FMA chains, enough of them to cover the FMA latency on any x86 width. */
static double measure_cpu_flops(void) {
    const long iters = 1 << 18;   /* ~0.1 s per try on one core */
    enum { W = 128 };
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        float total = 0;
        #pragma omp parallel reduction(+ : total)
        {
            float acc[W];
            for (int j = 0; j < W; j++) acc[j] = (float)j * 1e-3f;
            const float x = 0.999999f, y = 1e-6f;
            for (long it = 0; it < iters; it++)
                for (int j = 0; j < W; j++) acc[j] = acc[j] * x + y;
            for (int j = 0; j < W; j++) total += acc[j];
        }
        double dt = now_s() - t0;
        volatile float sink = total;
        (void)sink;
        double f = 2.0 * W * (double)iters * omp_get_max_threads() / dt;
        if (f > best) best = f;
    }
    return best;
}

/* Published dense peaks of common GPUs (HBM bandwidth, BF16 tensor FLOP/s). */
static bool gpu_peak(const char *name, double *bw, double *flops) {
    static const struct { const char *key; double bw, flops; } t[] = {
        {"H200", 4.8e12, 989e12}, {"H100 PCIe", 2.0e12, 756e12}, {"H100", 3.35e12, 989e12},
        {"A100-SXM4-80GB", 2.039e12, 312e12}, {"A100", 1.555e12, 312e12}, {"L40S", 0.864e12, 362e12},
        {"L4", 0.3e12, 121e12}, {"A10", 0.6e12, 125e12}, {"RTX 4090", 1.008e12, 165e12},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strstr(name, t[i].key)) { *bw = t[i].bw; *flops = t[i].flops; return true; }
    return false;
}

/* ------------------------------------------------------------------ trace */

typedef struct trace_w {
    FILE *f;
    bool first;
} trace_w;

static void trace_event(trace_w *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace_event(trace_w *t, const char *fmt, ...) {
    if (!t->f) return;
    fputs(t->first ? "\n" : ",\n", t->f);
    t->first = false;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->f, fmt, ap);
    va_end(ap);
}

static void trace_step(trace_w *t, int step, double start_s, const llmi_step_info *info, const llmi_op_stats *d) {
    if (!t->f) return;
    const double us = 1e6;
    long tokens;
    int ph = step_phase(info, &tokens);
    trace_event(t,
                "{\"name\":\"step %d (%s)\",\"cat\":\"step\",\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"prefill_tokens\":%d,\"decode_tokens\":%d,\"seqs\":%d,\"kv_blocks_used\":%d,"
                "\"forward_ms\":%.4f}}",
                step, k_phase[ph], start_s * us, info->seconds * us, info->n_prefill_tokens, info->n_decode_tokens,
                info->n_seqs, info->kv_blocks_used, info->forward_seconds * 1e3);
    double at = start_s;
    for (int k = 0; k < LLMI_OP_COUNT; k++) {
        llmi_op_class c = k_order[k];
        if (d->seconds[c] <= 0) continue;
        trace_event(t,
                    "{\"name\":\"%s\",\"cat\":\"op\",\"ph\":\"X\",\"pid\":1,\"tid\":2,\"ts\":%.3f,\"dur\":%.3f,"
                    "\"args\":{\"calls\":%ld,\"bytes\":%.0f,\"flops\":%.0f}}",
                    op_class_name(c), at * us, d->seconds[c] * us, d->calls[c], d->bytes[c], d->flops[c]);
        at += d->seconds[c];
    }
    trace_event(t, "{\"name\":\"kv_blocks_used\",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"blocks\":%d}}",
                start_s * us, info->kv_blocks_used);
}

/* ------------------------------------------------------------------ workload */

/* The per-step accounting of the profiled run (workload.h's hooks). */
typedef struct profile_run {
    const llmi_backend *b;
    const llmi_engine *e;
    phase_acc acc[PH_COUNT];
    trace_w *tr;
    int step_no;
    llmi_op_stats before, before_host;   /* the counters when the step began */
    long cached_tokens;           /* prompt tokens the prefix cache served */
} profile_run;

static void profile_before_step(void *ctx) {
    profile_run *r = ctx;
    r->before = r->b->stats;
    r->before_host = *engine_host_stats(r->e);
}

/* A step's wall time is the engine's own measure of it (info->seconds); dt goes unused. */
static void profile_after_step(void *ctx, const llmi_step_info *info, double t0, double dt) {
    profile_run *r = ctx;
    /* This step's counters: the backend's op classes plus the engine's own. */
    const llmi_op_stats *now = &r->b->stats, *host = engine_host_stats(r->e);
    const llmi_op_stats *before = &r->before, *before_host = &r->before_host;
    llmi_op_stats d;
    for (int c = 0; c < LLMI_OP_COUNT; c++) {
        d.seconds[c] = now->seconds[c] - before->seconds[c] + host->seconds[c] - before_host->seconds[c];
        d.bytes[c] = now->bytes[c] - before->bytes[c] + host->bytes[c] - before_host->bytes[c];
        d.flops[c] = now->flops[c] - before->flops[c] + host->flops[c] - before_host->flops[c];
        d.calls[c] = now->calls[c] - before->calls[c] + host->calls[c] - before_host->calls[c];
    }
    if (info->n_seqs == 0) return;
    long tokens;
    int ph = step_phase(info, &tokens);
    phase_acc *a = &r->acc[ph];
    a->steps++;
    a->tokens += tokens;
    a->wall += info->seconds;
    for (int c = 0; c < LLMI_OP_COUNT; c++) {
        a->ops.seconds[c] += d.seconds[c];
        a->ops.bytes[c] += d.bytes[c];
        a->ops.flops[c] += d.flops[c];
        a->ops.calls[c] += d.calls[c];
    }
    trace_step(r->tr, r->step_no++, t0, info, &d);
}

static const char *profile_usage(void) {
    return "usage: llmi profile [-m MODEL | --dummy PRESET] [options]\n"
           "  -p N                    prompt tokens per request (default 128)\n"
           "  -n N                    generated tokens per request (default 32)\n"
           "  -b N                    concurrent requests (default 1)\n"
           "  --warmup N              warm-up runs, not profiled (default 1)\n"
           "  --peak-bw GB/s          device memory bandwidth (default: measured on cpu, known GPUs)\n"
           "  --peak-flops GFLOP/s    device compute peak (default: measured fp32 FMA on cpu, known GPUs)\n"
           "  --trace FILE            Chrome trace JSON (open in Perfetto / about:tracing)\n"
           "  --prefix-len N          every prompt starts with the same N tokens, cached by one request\n"
           "                          before the profiled run (a system prompt in steady state): the\n"
           "                          run table shows the prompt tokens served from the cache and\n"
           "                          the prefill time they saved\n"
           "  --spec ngram|draft|off  speculate in every request (default off): steps that verify\n"
           "                          proposals are the verify phase, beside plain decode steps\n"
           "  --spec-k K              tokens proposed per step (default 5)\n"
           "  --spec-ngram MIN,MAX    n-gram lengths prompt lookup tries (default 2,4)\n"
           "  --draft-model PATH      the draft model of --spec draft (same vocabulary)\n"
           "  -o md|csv|json|jsonl    output format (default md)   --seed N\n";
}

static int parse_args(int argc, char **argv, profile_args *a, bool *help, llmi_status *st) {
    *a = (profile_args){.p = 128, .n = 32, .b = 1, .warmup = 1, .fmt = REPORT_MD, .seed = 42,
                        .spec = spec_params_defaults()};
    cli_model_opts_init(&a->mo);
    for (int i = 0; i < argc; i++) {  /* main.c passes the arguments after "profile" */
        const char *f = argv[i], *v;
        long n;
        double d;
#define VAL() do { if (!(v = cli_flag_value(argc, argv, &i, st))) return st->code; } while (0)
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) { *help = true; return 0; }
        if (!strcmp(f, "-p")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->p = (int)n; continue; }
        if (!strcmp(f, "-n")) { VAL(); if (cli_parse_long(f, v, 0, 1 << 20, &n, st)) return st->code; a->n = (int)n; continue; }
        if (!strcmp(f, "-b")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 16, &n, st)) return st->code; a->b = (int)n; continue; }
        if (!strcmp(f, "--warmup")) { VAL(); if (cli_parse_long(f, v, 0, 100, &n, st)) return st->code; a->warmup = (int)n; continue; }
        if (!strcmp(f, "--peak-bw")) { VAL(); if (cli_parse_float(f, v, 1e-3, 1e9, &d, st)) return st->code; a->peak_bw = d * 1e9; continue; }
        if (!strcmp(f, "--peak-flops")) { VAL(); if (cli_parse_float(f, v, 1e-3, 1e12, &d, st)) return st->code; a->peak_flops = d * 1e9; continue; }
        if (!strcmp(f, "--trace")) { VAL(); a->trace = v; continue; }
        if (!strcmp(f, "-o")) { VAL(); if (report_format_parse(v, &a->fmt, st)) return st->code; continue; }
        if (!strcmp(f, "--prefix-len")) { VAL(); if (cli_parse_long(f, v, 1, 1 << 20, &n, st)) return st->code; a->prefix_len = (int)n; continue; }
        if (!strcmp(f, "--seed")) { VAL(); if (cli_parse_long(f, v, 0, 0x7fffffffL, &n, st)) return st->code; a->seed = (uint64_t)n; continue; }
        if (!strcmp(f, "--spec")) { VAL(); if (cli_parse_spec_mode(f, v, &a->spec.mode, st)) return st->code; continue; }
        if (!strcmp(f, "--spec-k")) { VAL(); if (cli_parse_long(f, v, 1, LLMI_SPEC_MAX_K, &n, st)) return st->code; a->spec.k = (int)n; continue; }
        if (!strcmp(f, "--spec-ngram")) { VAL(); if (cli_parse_spec_ngram(f, v, &a->spec, st)) return st->code; continue; }
        if (!strcmp(f, "--draft-model")) { VAL(); a->mo.draft_model = v; continue; }
#undef VAL
        int rc = cli_parse_model_flag(&a->mo, argc, argv, &i, st);
        if (rc < 0) return st->code;
        if (rc == 0) return llmi_fail(st, LLMI_E_USAGE, "profile: unknown flag '%s' (see llmi profile --help)", f);
    }
    if (a->prefix_len && a->prefix_len >= a->p)
        return llmi_fail(st, LLMI_E_USAGE, "--prefix-len %d: must be shorter than the prompt (-p %d)", a->prefix_len, a->p);
    if (a->spec.mode != LLMI_SPEC_OFF) a->mo.engine.spec_max_k = a->spec.k;
    return cli_check_draft_flags(&a->mo, a->spec.mode == LLMI_SPEC_DRAFT, st);
}

/* The provenance columns live in the "run" table, once. */
static void op_rows(report *r, int ph, const phase_acc *a, double peak_bw, double peak_flops) {
    if (a->steps == 0) return;
    double accounted = 0;
    for (int c = 0; c < LLMI_OP_COUNT; c++) accounted += a->ops.seconds[c];
    for (int k = 0; k <= LLMI_OP_COUNT; k++) {
        bool untimed = k == LLMI_OP_COUNT;
        llmi_op_class c = untimed ? LLMI_OP_HOST : k_order[k];
        double s = untimed ? a->wall - accounted : a->ops.seconds[c];
        double bytes = untimed ? NAN : a->ops.bytes[c], flops = untimed ? NAN : a->ops.flops[c];
        report_row(r);
        report_str(r, "phase", k_phase[ph]);
        report_str(r, "op", untimed ? "untimed" : op_class_name(c));
        report_num(r, "ms_per_step", s / a->steps * 1e3, 3);
        report_num(r, "share_pct", a->wall > 0 ? 100.0 * s / a->wall : NAN, 1);
        report_num(r, "gb_per_s", s > 0 && bytes > 0 ? bytes / s / 1e9 : NAN, 2);
        report_num(r, "gflop_per_s", s > 0 && flops > 0 ? flops / s / 1e9 : NAN, 2);
        report_num(r, "pct_peak_bw", s > 0 && bytes > 0 && peak_bw > 0 ? 100.0 * bytes / s / peak_bw : NAN, 1);
        report_num(r, "pct_peak_flops", s > 0 && flops > 0 && peak_flops > 0 ? 100.0 * flops / s / peak_flops : NAN, 1);
        report_int(r, "calls", untimed ? 0 : a->ops.calls[c]);
        report_int(r, "steps", a->steps);
        report_num(r, "step_ms", a->wall / a->steps * 1e3, 3);
        report_num(r, "tokens_per_s", a->wall > 0 ? a->tokens / a->wall : NAN, 2);
    }
}

/* The three tables: md and csv one after another, json one object of three arrays, jsonl
 * every row tagged with its table. */
static int write_all(report *ops, report *mem, report *run, report_format f, FILE *out) {
    report *t[3] = {ops, mem, run};
    const char *names[3] = {"ops", "memory", "run"};
    if (f == REPORT_JSON) {
        cJSON *o = cJSON_CreateObject();
        for (int i = 0; i < 3; i++) cJSON_AddItemToObject(o, names[i], report_json_array(t[i]));
        report_json_print(o, false, out);
    } else {
        for (int i = 0; i < 3; i++) {
            if (f == REPORT_MD) fprintf(out, "%s## %s\n\n", i ? "\n" : "", names[i]);
            else if (f == REPORT_CSV && i) fputc('\n', out);
            if (f != REPORT_JSONL) {
                report_write(t[i], f, out);
                continue;
            }
            for (int r = 0; r < t[i]->n_rows; r++) {
                cJSON *row = report_json_row(t[i], r);
                cJSON_AddStringToObject(row, "table", names[i]);
                report_json_print(row, true, out);
            }
        }
    }
    fflush(out);
    return ferror(out) ? LLMI_E_RUNTIME : 0;
}

/* The device peaks the achieved rates compare with, and where each came from. */
typedef struct profile_peaks {
    double bw, flops;              /* bytes/s, FLOP/s */
    const char *bw_src, *flops_src;
} profile_peaks;

/* The flags' peaks, else a GPU's datasheet or a measurement on the CPU.  Call it while
 * nothing else of ours runs. */
static profile_peaks find_peaks(const profile_args *a, const llmi_backend *b) {
    profile_peaks pk = {a->peak_bw, a->peak_flops, "--peak-bw", "--peak-flops"};
    const bool is_cpu = !strcmp(b->name, "cpu");
    if (!is_cpu && (pk.bw == 0 || pk.flops == 0)) {
        double gbw = 0, gfl = 0;
        if (gpu_peak(b->device_name, &gbw, &gfl)) {
            if (pk.bw == 0) { pk.bw = gbw; pk.bw_src = "datasheet"; }
            if (pk.flops == 0) { pk.flops = gfl; pk.flops_src = "datasheet (bf16 dense)"; }
        }
    }
    if (is_cpu && pk.bw == 0) { pk.bw = measure_cpu_bw(); pk.bw_src = "measured (triad)"; }
    if (is_cpu && pk.flops == 0) { pk.flops = measure_cpu_flops(); pk.flops_src = "measured (fp32 fma)"; }
    return pk;
}

static void trace_begin(trace_w *tr, const llmi_backend *b) {
    if (tr->f) fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", tr->f);
    trace_event(tr, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"llmi %s (%s)\"}}", b->name,
                llmi_commit());
    trace_event(tr, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"engine steps\"}}");
    trace_event(tr,
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"op classes (summed per step)\"}}");
}

/* Closes the trace file; a write that failed fails the run unless it failed already. */
static int trace_end(trace_w *tr, const char *path, int rc, llmi_status *st) {
    if (!tr->f) return rc;
    fputs("\n]}\n", tr->f);
    int bad = ferror(tr->f);
    bad |= fclose(tr->f);
    tr->f = NULL;
    if (bad && !rc) rc = llmi_fail(st, LLMI_E_RUNTIME, "--trace %s: write failed", path);
    return rc;
}

/* Warm-up, then the profiled run with the backend's counters on and the trace written. */
static int profile_on_request(void *ctx, const llmi_request_info *ri, llmi_status *st) {
    (void)st;
    ((profile_run *)ctx)->cached_tokens += ri->n_cached_tokens;
    return 0;
}

/* One request of the shared prefix and one more token, so its full blocks are cached. */
static int prime_prefix(llmi_engine *e, const int32_t *prefix, int n_prefix, llmi_status *st) {
    int32_t *prompt = malloc((size_t)(n_prefix + 1) * sizeof *prompt);
    if (!prompt) return llmi_fail(st, LLMI_E_RUNTIME, "profile: out of memory");
    memcpy(prompt, prefix, (size_t)n_prefix * sizeof *prompt);
    prompt[n_prefix] = prefix[0];
    llmi_request_params rp = request_params_defaults();
    rp.max_tokens = 0;
    int id = -1, rc = engine_add_request(e, prompt, n_prefix + 1, &rp, NULL, &id, st);
    while (!rc && engine_has_work(e)) rc = engine_step(e, NULL, NULL, NULL, st);
    if (id >= 0) engine_release(e, id);
    free(prompt);
    return rc;
}

static int profile_measure(const profile_args *a, const llmi_model *m, llmi_backend *b, llmi_engine *e, FILE *tf,
                           profile_run *run, llmi_status *st) {
    workload_shape w = {.n_prompt = a->p, .n_gen = a->n, .n_requests = a->b,
                        .spec = a->spec.mode != LLMI_SPEC_OFF ? a->spec : (llmi_spec_params){0}};
    stats_rng rng;
    stats_rng_seed(&rng, a->seed);
    int rc = 0;
    int32_t *prefix = NULL;   /* (prefix_len) */
    if (a->prefix_len) {
        if (!(prefix = malloc((size_t)a->prefix_len * sizeof *prefix))) rc = llmi_fail(st, LLMI_E_RUNTIME, "profile: out of memory");
        else workload_random_tokens(&rng, prefix, a->prefix_len, m->cfg.n_vocab);
    }
    for (int i = 0; i < a->warmup && !rc; i++) rc = workload_warmup(e, m->cfg.n_vocab, w, &rng, "profile", st);
    if (!rc && prefix) {
        rc = prime_prefix(e, prefix, a->prefix_len, st);
        w.prefix = prefix;
        w.n_prefix = a->prefix_len;
    }
    if (rc) {
        free(prefix);
        if (tf) fclose(tf);
        return rc;
    }
    memset(&b->stats, 0, sizeof b->stats);
    b->profiling = true;
    trace_w tr = {tf, true};
    trace_begin(&tr, b);
    memset(run, 0, sizeof *run);
    run->b = b;
    run->e = e;
    run->tr = &tr;
    workload_hooks h = {.ctx = run, .before_step = profile_before_step, .after_step = profile_after_step,
                        .on_request = profile_on_request};
    bench_peak_reset();
    rc = workload_run(e, m->cfg.n_vocab, w, &rng, &h, "profile", st);
    b->profiling = false;
    run->tr = NULL;
    free(prefix);
    return trace_end(&tr, a->trace, rc, st);
}

static void memory_rows(report *mem, const llmi_model *m, const llmi_backend *b, const llmi_engine *e) {
    size_t w = 0, kv = 0, act = 0;
    if (b->memory) b->memory(b, &w, &kv, &act);
    const double MiB = 1024.0 * 1024.0;
    size_t kv_used = (size_t)engine_kv_blocks_peak(e) * b->kv_block_bytes(b);
    struct { const char *what; double bytes; } items[] = {
        {"weights (model)", (double)m->weight_bytes},
        {"weights (backend copies)", (double)w},
        {"kv cache allocated", (double)kv},
        {"kv cache used (peak)", (double)kv_used},
        {"activations + workspaces", (double)act},
        {"process peak rss", (double)bench_peak_rss()},
    };
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        report_row(mem);
        report_str(mem, "item", items[i].what);
        report_num(mem, "mib", items[i].bytes / MiB, 1);
    }
}

static void run_row(report *r, const profile_args *a, const profile_peaks *pk, const llmi_model *m,
                    const llmi_backend *b, const profile_run *run) {
    report_row(r);
    report_num(r, "peak_gb_per_s", pk->bw / 1e9, 1);
    report_str(r, "bw_source", pk->bw_src);
    report_num(r, "peak_gflop_per_s", pk->flops / 1e9, 1);
    report_str(r, "flops_source", pk->flops_src);
    report_int(r, "n_prompt", a->p);
    report_int(r, "n_gen", a->n);
    report_int(r, "n_batch", a->b);
    report_int(r, "prefix_len", a->prefix_len);
    report_str(r, "prefix_cache", a->mo.engine.prefix_cache ? "on" : "off");
    report_str(r, "sched", sched_policy_name(engine_options(run->e)->policy));
    /* What the cache saved, at the rate this run's prefill steps computed tokens. */
    const phase_acc *pre = &run->acc[PH_PREFILL];
    report_int(r, "cached_prompt_tokens", run->cached_tokens);
    report_num(r, "prefill_ms_saved_est",
               pre->tokens > 0 ? 1e3 * pre->wall / (double)pre->tokens * (double)run->cached_tokens : 0.0, 1);
    report_str(r, "kv_type", kv_dtype_name(b->opts.kv_dtype));
    report_int(r, "block_size", b->opts.block_size);
    bench_meta(r, m, b, a->mo.dummy ? a->mo.dummy : m->source_path, a->mo.backend.n_threads);
}

int cmd_profile(int argc, char **argv, llmi_status *st) {
    profile_args a;
    memset(&a, 0, sizeof a);
    bool help = false;
    int rc = parse_args(argc, argv, &a, &help, st);
    if (rc) return rc;
    if (help) {
        fputs(profile_usage(), stdout);
        fputs(cli_model_flags_help(), stdout);
        return 0;
    }
    llmi_model m;
    if ((rc = cli_open_model(&a.mo, &m, st))) return rc;
    const int ctx = a.mo.engine.max_ctx > 0 ? a.mo.engine.max_ctx : m.cfg.max_ctx;
    const int bs = a.mo.engine.block_size;
    const long need1 = (a.p + a.n + bs - 1) / bs;   /* KV blocks of one request */
    llmi_backend *b = NULL;
    llmi_engine *e = NULL;
    FILE *tf = NULL;
    report ops, mem, run;
    report_init(&ops);
    report_init(&mem);
    report_init(&run);
    if (a.p + a.n > ctx) {
        rc = llmi_fail(st, LLMI_E_USAGE, "-p %d -n %d: %d tokens exceed the context length %d (-c)", a.p, a.n,
                       a.p + a.n, ctx);
        goto done;
    }
    const cli_engine_fit fit = {.need_blocks = need1 * a.b, .min_seqs = a.b, .decode_together = true};
    if ((rc = cli_open_engine(&a.mo, &m, &fit, &b, &e, st))) goto done;
    if (need1 > engine_kv_blocks_total(e)) {
        rc = llmi_fail(st, LLMI_E_USAGE, "-p %d -n %d: one request needs %ld KV blocks, the cache has %d (--num-blocks/--kv-mem)",
                       a.p, a.n, need1, engine_kv_blocks_total(e));
        goto done;
    }
    if (a.trace && !(tf = fopen(a.trace, "w"))) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--trace %s: cannot write it", a.trace);
        goto done;
    }
    const profile_peaks pk = find_peaks(&a, b);
    profile_run pr;
    rc = profile_measure(&a, &m, b, e, tf, &pr, st);
    tf = NULL;   /* profile_measure closed it */
    if (rc) goto done;
    for (int ph = 0; ph < PH_COUNT; ph++) op_rows(&ops, ph, &pr.acc[ph], pk.bw, pk.flops);
    memory_rows(&mem, &m, b, e);
    run_row(&run, &a, &pk, &m, b, &pr);
    rc = write_all(&ops, &mem, &run, a.fmt, stdout);
    if (rc) llmi_fail(st, rc, "profile: cannot write the report to stdout");
done:
    if (tf) fclose(tf);
    report_free(&ops);
    report_free(&mem);
    report_free(&run);
    cli_close_engine(b, e);
    model_free(&m);
    return rc;
}
