/* bench_compare.c — see bench_compare.h. */
#include "cli/bench_compare.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "cli/bench_view.h"
#include "core/fileio.h"

/* What makes two rows the same measurement.  Paths compare by their last component, so
 * runs on two machines pair up. */
static const char *const match_keys[] = {"model", "kv_type", "prefix_cache", "block_size", "n_prompt", "n_gen",
                                         "n_batch", "depth", "dataset", "num_requests", "input_len", "output_len",
                                         "range_ratio", "prefix_len", "num_prefixes", "request_rate", "turns",
                                         "seed", "file", "ctx", "chunks", "spec", NULL};

typedef struct metric {
    const char *name, *mean, *sd;  /* sd: the field holding the measured noise, or NULL */
    bool lower_better;
} metric;

static const metric metrics[] = {
    {"prefill t/s", "prefill_tps_mean", "prefill_tps_sd", false},
    {"decode t/s", "decode_tps_mean", "decode_tps_sd", false},
    {"output t/s", "output_tps", NULL, false},
    {"req/s", "requests_per_s", NULL, false},
    {"goodput req/s", "goodput_rps", NULL, false},
    {"TTFT p50 ms", "ttft_ms_p50", NULL, true},
    {"TPOT p50 ms", "tpot_ms_p50", NULL, true},
    {"PPL", "ppl", "ppl_stderr", true},
    {"ppl t/s", "tps", NULL, false},
};

static bool is_path_key(const char *k) { return !strcmp(k, "model") || !strcmp(k, "dataset") || !strcmp(k, "file"); }

/* The value of key in row i as text, for matching. */
static void key_value(const report *r, int i, const char *key, char *buf, size_t cap) {
    const char *s = report_get_str(r, i, key);
    if (s) snprintf(buf, cap, "%s", is_path_key(key) ? bench_view_basename(s) : s);
    else {
        double v = report_get(r, i, key);
        if (isnan(v)) snprintf(buf, cap, "null");
        else snprintf(buf, cap, "%.10g", v);
    }
}

static bool same_config(const report *a, int i, const report *b, int j) {
    char va[512], vb[512];
    for (int k = 0; match_keys[k]; k++) {
        if (!report_has(a, match_keys[k]) || !report_has(b, match_keys[k])) continue;
        key_value(a, i, match_keys[k], va, sizeof va);
        key_value(b, j, match_keys[k], vb, sizeof vb);
        if (strcmp(va, vb)) return false;
    }
    return bench_view_kind(a, i) == bench_view_kind(b, j);
}

int bench_compare_rows(const report *base, const report *cur, report *out, llmi_status *st) {
    int n_pairs = 0;
    char test[160];
    for (int i = 0; i < base->n_rows; i++) {
        int j = 0;
        while (j < cur->n_rows && !same_config(base, i, cur, j)) j++;
        if (j == cur->n_rows) continue;
        n_pairs++;
        for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
            const metric *mt = &metrics[m];
            double b = report_get(base, i, mt->mean), c = report_get(cur, j, mt->mean);
            if (!(b > 0) || !(c > 0)) continue;   /* absent, unset, or no rate to compare */
            double sb = mt->sd ? report_get(base, i, mt->sd) : NAN, sc = mt->sd ? report_get(cur, j, mt->sd) : NAN;
            double ratio = mt->lower_better ? b / c : c / b;
            const char *flag = "no sd";
            if (!isnan(sb) && !isnan(sc)) {
                double noise = sqrt(sb * sb + sc * sc);
                flag = fabs(c - b) <= noise ? "~" : ratio > 1 ? "better" : "worse";
            }
            if (report_row(out) < 0) return llmi_fail(st, LLMI_E_RUNTIME, "--compare: out of memory");
            bench_view_test(base, i, test, sizeof test);
            report_str(out, "test", test);
            for (int k = 0; bench_view_config_keys[k]; k++) {
                const char *key = bench_view_config_keys[k];
                if (!report_varies(base, key) && !report_varies(cur, key)) continue;
                char v[256];
                key_value(base, i, key, v, sizeof v);
                report_str(out, key, strcmp(v, "null") ? v : "");
            }
            report_str(out, "metric", mt->name);
            report_num(out, "base_mean", b, 2);
            report_num(out, "base_sd", sb, 2);
            report_num(out, "new_mean", c, 2);
            report_num(out, "new_sd", sc, 2);
            report_num(out, "ratio", ratio, 3);
            report_str(out, "flag", flag);
        }
    }
    if (n_pairs == 0) return llmi_fail(st, LLMI_E_RUNTIME, "--compare: no configuration is in both files");
    return 0;
}

static int read_rows(const char *path, report *r, llmi_status *st) {
    char *text;
    size_t len;
    fileio_opts fo = {.flag = "--compare", .max_bytes = (size_t)256 << 20, .allow_stream = true};
    if (fileio_read(path, &fo, &text, &len, st)) return st->code;
    int rc = strlen(text) != len ? llmi_fail(st, LLMI_E_USAGE, "--compare %s: not text (NUL bytes)", path)
                                 : report_read_json(r, text, path, st);
    free(text);
    return rc;
}

int bench_compare(const char *base_path, const char *new_path, report_format fmt, double fail_below, FILE *out,
                  llmi_status *st) {
    report base, cur, cmp;
    report_init(&base);
    report_init(&cur);
    report_init(&cmp);
    int rc = read_rows(base_path, &base, st);
    if (!rc) rc = read_rows(new_path, &cur, st);
    if (!rc) rc = bench_compare_rows(&base, &cur, &cmp, st);
    if (!rc) {
        int unmatched_base = 0, unmatched_new = 0;
        for (int i = 0; i < base.n_rows; i++) {
            int j = 0;
            while (j < cur.n_rows && !same_config(&base, i, &cur, j)) j++;
            unmatched_base += j == cur.n_rows;
        }
        for (int j = 0; j < cur.n_rows; j++) {
            int i = 0;
            while (i < base.n_rows && !same_config(&base, i, &cur, j)) i++;
            unmatched_new += i == base.n_rows;
        }
        if (unmatched_base || unmatched_new)
            fprintf(stderr, "compare: %d row(s) of %s and %d of %s have no match in the other file\n",
                    unmatched_base, base_path, unmatched_new, new_path);
        if (fmt == REPORT_MD) {
            bench_view_header(&base, "base: ", out);
            bench_view_header(&cur, "new:  ", out);
            fputs("ratio > 1: new is better; flag: the difference is past the noise sqrt(sd_base² + sd_new²)\n\n",
                  out);
        }
        rc = report_write(&cmp, fmt, out);
        if (rc) llmi_fail(st, rc, "--compare: cannot write the table to stdout");
    }
    if (!rc && fail_below > 0) {
        int below = 0, worst = -1;
        for (int i = 0; i < cmp.n_rows; i++) {
            double q = report_get(&cmp, i, "ratio");
            if (q < fail_below) below++;
            if (worst < 0 || q < report_get(&cmp, worst, "ratio")) worst = i;
        }
        if (below)
            rc = llmi_fail(st, LLMI_E_RUNTIME, "--fail-below %g: %d of %d ratios are below it (lowest %.3f: %s of %s)",
                           fail_below, below, cmp.n_rows, report_get(&cmp, worst, "ratio"),
                           report_get_str(&cmp, worst, "metric"), report_get_str(&cmp, worst, "test"));
    }
    report_free(&base);
    report_free(&cur);
    report_free(&cmp);
    return rc;
}
