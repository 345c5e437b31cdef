/* bench_view.c — see bench_view.h. */
#include "cli/bench_view.h"
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "metrics/slo.h"

const char *const bench_view_config_keys[] = {"kv_type", "block_size", "n_batch", "prefix_cache", "sched", "spec", "threads",
                                              "weight_dtype", "device", NULL};

bench_row_kind bench_view_kind(const report *r, int row) {
    if (!isnan(report_get(r, row, "n_prompt"))) return BENCH_ROW_SWEEP;
    if (!isnan(report_get(r, row, "num_requests"))) return BENCH_ROW_THROUGHPUT;
    if (!isnan(report_get(r, row, "ppl"))) return BENCH_ROW_PPL;
    return BENCH_ROW_OTHER;
}

const char *bench_view_basename(const char *s) {
    if (!s) return "";
    const char *b = strrchr(s, '/');
    /* a model directory given as "dir/" names the directory */
    if (b && !b[1]) {
        const char *e = b;
        while (e > s && e[-1] != '/') e--;
        return e;
    }
    return b ? b + 1 : s;
}

/* Appends printf text at *o of buf (cap); never overflows. */
static void put(char *buf, size_t cap, size_t *o, const char *fmt, ...) {
    if (*o >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, cap - *o, fmt, ap);
    va_end(ap);
    if (n > 0) *o = *o + (size_t)n < cap ? *o + (size_t)n : cap - 1;
}

static double num0(const report *r, int row, const char *key) {
    double v = report_get(r, row, key);
    return isnan(v) ? 0 : v;
}

void bench_view_test(const report *r, int row, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    switch (bench_view_kind(r, row)) {
    case BENCH_ROW_SWEEP: {
        long p = (long)num0(r, row, "n_prompt"), n = (long)num0(r, row, "n_gen"), d = (long)num0(r, row, "depth");
        put(buf, cap, &o, n > 0 ? "pp%ld+tg%ld" : "pp%ld", p, n);
        if (d > 0) put(buf, cap, &o, " @ d%ld", d);
        break;
    }
    case BENCH_ROW_THROUGHPUT: {
        const char *ds = report_get_str(r, row, "dataset");
        long n = (long)num0(r, row, "num_requests"), turns = (long)num0(r, row, "turns");
        if (turns > 1) put(buf, cap, &o, "%ld conv x%ld turns", n, turns);
        else put(buf, cap, &o, "%ld req", n);
        long samples = (long)num0(r, row, "samples");
        if (samples > 1) put(buf, cap, &o, " x%ld samples", samples);
        long conc = (long)num0(r, row, "max_concurrency");
        if (conc > 0) put(buf, cap, &o, " conc%ld", conc);
        if (ds && strcmp(ds, "random")) put(buf, cap, &o, " %s", bench_view_basename(ds));
        else put(buf, cap, &o, " in%ld/out%ld", (long)num0(r, row, "input_len"), (long)num0(r, row, "output_len"));
        double rr = num0(r, row, "range_ratio");
        if (rr > 0) put(buf, cap, &o, " ±%g%%", rr * 100);
        long pl = (long)num0(r, row, "prefix_len");
        if (pl > 0) put(buf, cap, &o, " prefix%ldx%ld", pl, (long)num0(r, row, "num_prefixes"));
        double rate = report_get(r, row, "request_rate");
        if (isfinite(rate) && rate > 0) put(buf, cap, &o, " @ %g/s", rate);
        break;
    }
    case BENCH_ROW_PPL:
        put(buf, cap, &o, "ppl c%ld x%ld", (long)num0(r, row, "ctx"), (long)num0(r, row, "chunks"));
        break;
    default: break;
    }
}

/* Copies row `row`'s value of key from r into the latest row of v, as its own type. */
static void copy_cell(report *v, const report *r, int row, const char *key) {
    const char *s = report_get_str(r, row, key);
    if (s) { report_str(v, key, s); return; }
    for (int c = 0; c < r->n_cols; c++) {
        if (strcmp(r->cols[c].key, key)) continue;
        double x = report_get(r, row, key);
        if (r->cols[c].type == REPORT_INT) report_int(v, key, isnan(x) ? 0 : (long long)x);
        else report_num(v, key, x, r->cols[c].decimals);
        return;
    }
}

static void pair(report *v, const report *r, int row, const char *label, const char *mean_key, const char *sd_key,
                 int dec) {
    char k1[REPORT_KEY_LEN], k2[REPORT_KEY_LEN];
    snprintf(k1, sizeof k1, "%s_mean", label);
    snprintf(k2, sizeof k2, "%s_sd", label);
    report_num(v, k1, report_get(r, row, mean_key), dec);
    report_num(v, k2, sd_key ? report_get(r, row, sd_key) : NAN, dec);
}

/* " · " between the parts of the header line. */
static void hdr_part(FILE *out, bool *first, const char *fmt, ...) {
    fputs(*first ? "" : " · ", out);
    *first = false;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
}

static bool constant(const report *r, const char *key) { return report_has(r, key) && !report_varies(r, key); }

void bench_view_header(const report *r, const char *lead, FILE *out) {
    bool first = true;
    if (r->n_rows == 0) return;
    /* line 1: what ran where; line 2: how */
    fprintf(out, "%s", lead);
    if (constant(r, "model")) {
        hdr_part(out, &first, "%s", bench_view_basename(report_get_str(r, 0, "model")));
        if (constant(r, "params_m") && constant(r, "weight_dtype") && constant(r, "weights_gib"))
            fprintf(out, " (%.1f M params, %s, %.3f GiB)", report_get(r, 0, "params_m"),
                    report_get_str(r, 0, "weight_dtype"), report_get(r, 0, "weights_gib"));
    }
    if (constant(r, "device") && constant(r, "backend"))
        hdr_part(out, &first, "%s: %s", report_get_str(r, 0, "backend"), report_get_str(r, 0, "device"));
    if (constant(r, "threads") && report_get(r, 0, "threads") > 0)   /* 0: a GPU backend's */
        hdr_part(out, &first, "%.0f threads", report_get(r, 0, "threads"));
    fprintf(out, "\n%*s", (int)strlen(lead), "");
    first = true;
    if (constant(r, "kv_type")) hdr_part(out, &first, "KV %s", report_get_str(r, 0, "kv_type"));
    if (constant(r, "block_size")) hdr_part(out, &first, "block %.0f", report_get(r, 0, "block_size"));
    if (constant(r, "prefix_cache")) hdr_part(out, &first, "prefix cache %s", report_get_str(r, 0, "prefix_cache"));
    if (constant(r, "sched")) hdr_part(out, &first, "sched %s", report_get_str(r, 0, "sched"));
    if (constant(r, "n_batch")) hdr_part(out, &first, "batch %.0f", report_get(r, 0, "n_batch"));
    if (constant(r, "spec")) hdr_part(out, &first, "spec %s", report_get_str(r, 0, "spec"));
    if (constant(r, "reps")) hdr_part(out, &first, "mean ± sd of %.0f runs", report_get(r, 0, "reps"));
    if (constant(r, "seed")) hdr_part(out, &first, "seed %.0f", report_get(r, 0, "seed"));
    if (report_has(r, "slo_met")) {
        double t = report_get(r, 0, "slo_ttft_ms"), p = report_get(r, 0, "slo_tpot_ms"), e = report_get(r, 0, "slo_e2e_ms");
        hdr_part(out, &first, "SLO");
        if (t > 0) fprintf(out, " ttft<=%g ms", t);
        if (p > 0) fprintf(out, " tpot<=%g ms", p);
        if (e > 0) fprintf(out, " e2e<=%g ms", e);
    }
    if (constant(r, "commit")) hdr_part(out, &first, "commit %s", report_get_str(r, 0, "commit"));
    const char *date = report_get_str(r, 0, "date");
    if (date) hdr_part(out, &first, "%.10s %.5s UTC", date, strlen(date) > 11 ? date + 11 : "");
    fputc('\n', out);
}

int bench_view_write(const report *r, FILE *out) {
    const bench_row_kind kind = bench_view_kind(r, 0);   /* one run: one kind */
    if (kind == BENCH_ROW_OTHER) return report_write(r, REPORT_MD, out);
    report v;
    report_init(&v);
    bool any_gen = false;
    int turns = 0;
    for (int i = 0; i < r->n_rows; i++) {
        any_gen |= num0(r, i, "n_gen") > 0;
        int t = (int)num0(r, i, "turns");
        turns = t > turns ? t : turns;
    }
    char test[160];
    for (int i = 0; i < r->n_rows; i++) {
        if (report_row(&v) < 0) break;
        report_str(&v, "model", bench_view_basename(report_get_str(r, i, "model")));
        report_str(&v, "backend", report_get_str(r, i, "backend"));
        for (int k = 0; bench_view_config_keys[k]; k++)
            if (report_varies(r, bench_view_config_keys[k])) copy_cell(&v, r, i, bench_view_config_keys[k]);
        bench_view_test(r, i, test, sizeof test);
        report_str(&v, "test", test);
        if (kind == BENCH_ROW_SWEEP) {
            pair(&v, r, i, "pp t/s", "prefill_tps_mean", "prefill_tps_sd", 2);
            if (any_gen) pair(&v, r, i, "tg t/s", "decode_tps_mean", "decode_tps_sd", 2);
        } else if (kind == BENCH_ROW_THROUGHPUT) {
            report_num(&v, "req/s", report_get(r, i, "requests_per_s"), 2);
            report_num(&v, "out t/s", report_get(r, i, "output_tps"), 2);
            report_num(&v, "TTFT p50 ms", report_get(r, i, "ttft_ms_p50"), 2);
            report_num(&v, "TPOT p50 ms", report_get(r, i, "tpot_ms_p50"), 2);
            if (report_has(r, "goodput_rps")) {
                report_num(&v, "goodput req/s", report_get(r, i, "goodput_rps"), 2);
                report_num(&v, "SLO met %", 100 * report_get(r, i, "slo_met"), 1);
            }
            for (int t = 1; t <= turns && t <= 16; t++) {
                char k[REPORT_KEY_LEN], label[REPORT_KEY_LEN];
                snprintf(k, sizeof k, "turn%d_ttft_ms_mean", t);
                snprintf(label, sizeof label, "TTFT t%d ms", t);
                report_num(&v, label, report_get(r, i, k), 2);
            }
        }
        if (kind != BENCH_ROW_PPL && report_has(r, "spec_accept_pct")) {
            report_num(&v, "accept %", report_get(r, i, "spec_accept_pct"), 1);
            report_num(&v, "tok/step", report_get(r, i, "spec_len"), 2);
        }
        if (kind == BENCH_ROW_PPL) {
            pair(&v, r, i, "PPL", "ppl", "ppl_stderr", 4);
            report_num(&v, "t/s", report_get(r, i, "tps"), 2);
        }
    }
    bench_view_header(r, "llmi bench: ", out);
    fputc('\n', out);
    int rc = report_write(&v, REPORT_MD, out);
    report_free(&v);
    if (report_has(r, "slo_max_rate")) {
        double best = report_get(r, 0, "slo_max_rate");
        fputc('\n', out);
        if (isnan(best))
            fprintf(out, "No request rate met every SLO for %.0f%% of its requests.\n", SLO_TARGET * 100);
        else
            fprintf(out, "Highest request rate meeting every SLO for >= %.0f%% of its requests: %g req/s.\n",
                    SLO_TARGET * 100, best);
    }
    fflush(out);
    return rc || ferror(out) ? LLMI_E_RUNTIME : 0;
}
