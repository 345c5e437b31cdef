/* bench_plot.c — see bench_plot.h. */
#include "cli/bench_plot.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/bench_view.h"
#include "cli/plot.h"

#define CURVE_POINTS 600            /* a CDF or time series is drawn from at most this many points */

/* The figure's subtitle: bench_view's header of what every row shares (two lines). */
static char *subtitle_of(const report *rep) {
    char *s = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&s, &n);
    if (!m) return NULL;
    bench_view_header(rep, "", m);
    fclose(m);
    if (s && n > 0 && s[n - 1] == '\n') s[n - 1] = '\0';
    return s;
}

/* ------------------------------------------------------------------ sweep */

typedef struct sweep_dim { const char *key, *flag, *axis_label; } sweep_dim;

/* In the order that breaks ties for the x axis: throughput against batch size first. */
static const sweep_dim dims[] = {
    {"n_batch", "-b", "concurrent sequences (-b)"},
    {"n_prompt", "-p", "prompt length (-p, tokens)"},
    {"depth", "-d", "context depth (-d, tokens)"},
    {"n_gen", "-n", "generated length (-n, tokens)"},
    {"block_size", "--block-size", "KV block size (tokens)"},
    {"kv_type", "--kv-type", NULL},
    {"spec", "--spec", NULL},   /* a --spec list's rows are lines of their own, never one line */
};
#define N_DIMS (int)(sizeof dims / sizeof dims[0])

static int distinct(const report *r, const char *key) {
    int n = 0;
    for (int i = 0; i < r->n_rows; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) {
            const char *a = report_get_str(r, i, key), *b = report_get_str(r, j, key);
            seen = a ? (b && !strcmp(a, b)) : report_get(r, i, key) == report_get(r, j, key);
        }
        n += !seen;
    }
    return n;
}

/* Label of row i's line: the values of every varying dimension but x. */
static void line_label(const report *r, int i, int x_dim, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int d = 0; d < N_DIMS && o < cap; d++) {
        if (d == x_dim || !report_varies(r, dims[d].key)) continue;
        const char *s = report_get_str(r, i, dims[d].key);
        int k = s ? snprintf(buf + o, cap - o, "%s%s %s", o ? ", " : "", dims[d].flag, s)
                  : snprintf(buf + o, cap - o, "%s%s %g", o ? ", " : "", dims[d].flag, report_get(r, i, dims[d].key));
        if (k > 0) o += (size_t)k;
    }
    if (!buf[0]) snprintf(buf, cap, "%s", "all rows");
}

typedef struct sweep_line {
    char label[96];
    double x[64], pre[64], pre_sd[64], dec[64], dec_sd[64];   /* (n) sorted by x */
    int n;
} sweep_line;

int bench_plot_sweep(const report *rep, const char *path, llmi_status *st) {
    int x_dim = 0, best = 0;
    for (int d = 0; d < N_DIMS; d++) {
        if (!dims[d].axis_label || !report_has(rep, dims[d].key)) continue;
        int k = distinct(rep, dims[d].key);
        if (k > best) { best = k; x_dim = d; }
    }
    sweep_line *lines = calloc(BENCH_PLOT_MAX_LINES, sizeof *lines);
    if (!lines) return llmi_fail(st, LLMI_E_RUNTIME, "--plot: out of memory");
    int n_lines = 0;
    bool any_dec = false, log2x = true;
    double xmin = INFINITY, xmax = 0;
    for (int i = 0; i < rep->n_rows; i++) {
        char label[96];
        line_label(rep, i, x_dim, label, sizeof label);
        int l = 0;
        while (l < n_lines && strcmp(lines[l].label, label)) l++;
        if (l == n_lines) {
            if (n_lines == BENCH_PLOT_MAX_LINES) {
                free(lines);
                return llmi_fail(st, LLMI_E_USAGE, "--plot: more than %d lines; plot fewer combinations",
                                 BENCH_PLOT_MAX_LINES);
            }
            snprintf(lines[n_lines++].label, sizeof lines[0].label, "%s", label);
        }
        sweep_line *ln = &lines[l];
        if (ln->n == 64) {
            free(lines);
            return llmi_fail(st, LLMI_E_USAGE, "--plot: more than 64 points on one line; plot fewer values");
        }
        double x = report_get(rep, i, dims[x_dim].key);
        int k = ln->n++;
        while (k > 0 && ln->x[k - 1] > x) {   /* insertion keeps x sorted */
            ln->x[k] = ln->x[k - 1];
            ln->pre[k] = ln->pre[k - 1];
            ln->pre_sd[k] = ln->pre_sd[k - 1];
            ln->dec[k] = ln->dec[k - 1];
            ln->dec_sd[k] = ln->dec_sd[k - 1];
            k--;
        }
        ln->x[k] = x;
        ln->pre[k] = report_get(rep, i, "prefill_tps_mean");
        ln->pre_sd[k] = report_get(rep, i, "prefill_tps_sd");
        ln->dec[k] = report_get(rep, i, "decode_tps_mean");
        ln->dec_sd[k] = report_get(rep, i, "decode_tps_sd");
        any_dec |= isfinite(ln->dec[k]);
        log2x &= x > 0;
        xmin = fmin(xmin, x);
        xmax = fmax(xmax, x);
    }
    /* Powers-of-two lists (-b 1,4,16,64) read best on a log2 axis; a narrow range does not need it. */
    log2x &= xmax >= 4 * xmin;
    plot_series pre[BENCH_PLOT_MAX_LINES], dec[BENCH_PLOT_MAX_LINES];
    for (int l = 0; l < n_lines; l++) {
        pre[l] = (plot_series){lines[l].label, lines[l].x, lines[l].pre, lines[l].pre_sd, lines[l].n, true, false};
        dec[l] = (plot_series){lines[l].label, lines[l].x, lines[l].dec, lines[l].dec_sd, lines[l].n, true, false};
    }
    plot_panel panels[2] = {
        {"Prefill", dims[x_dim].axis_label, "prompt tokens per second (tok/s)", log2x, 0, 0, pre, n_lines},
        {"Decode", dims[x_dim].axis_label, "generated tokens per second, all sequences (tok/s)", log2x, 0, 0, dec,
         n_lines},
    };
    char title[256];
    snprintf(title, sizeof title, "llmi bench sweep: throughput vs %s (mean ± sd)", dims[x_dim].axis_label);
    char *sub = subtitle_of(rep);
    int rc = plot_svg_write(path, title, sub ? sub : "", panels, any_dec ? 2 : 1, st);
    free(sub);
    free(lines);
    return rc;
}

/* ------------------------------------------------------------------ throughput */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The empirical CDF of s's samples as at most CURVE_POINTS (x, % at or below x) points. */
static int cdf_of(const bench_plot_samples *s, double **x, double **y) {
    int n = s->n, m = n < CURVE_POINTS ? n : CURVE_POINTS;
    double *sorted = malloc((size_t)(n > 0 ? n : 1) * sizeof *sorted);
    *x = malloc((size_t)(m > 0 ? m : 1) * sizeof **x);
    *y = malloc((size_t)(m > 0 ? m : 1) * sizeof **y);
    if (!sorted || !*x || !*y) { free(sorted); return -1; }
    if (n > 0) memcpy(sorted, s->y, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    for (int k = 0; k < m; k++) {
        int i = m > 1 ? (int)((long)k * (n - 1) / (m - 1)) : n - 1;
        (*x)[k] = sorted[i];
        (*y)[k] = 100.0 * (i + 1) / n;
    }
    free(sorted);
    return m;
}

/* CDF lines of n sets of samples into out, their arrays appended to own[*n_own]. */
static int cdf_lines(const bench_plot_samples *s, int n, plot_series *out, double **own, int *n_own, llmi_status *st) {
    for (int i = 0; i < n; i++) {
        double *x, *y;
        int m = cdf_of(&s[i], &x, &y);
        own[(*n_own)++] = x;
        own[(*n_own)++] = y;
        if (m < 0) return llmi_fail(st, LLMI_E_RUNTIME, "--plot: out of memory");
        out[i] = (plot_series){s[i].label, x, y, NULL, m, false, true};
    }
    return 0;
}

int bench_plot_throughput(const report *rep, const bench_plot_samples *ttft, int n_ttft, const bench_plot_samples *itl,
                          int n_itl, const bench_plot_samples *kv, int n_kv, const char *path, llmi_status *st) {
    if (n_ttft > BENCH_PLOT_MAX_LINES || n_itl > BENCH_PLOT_MAX_LINES || n_kv > BENCH_PLOT_MAX_LINES)
        return llmi_fail(st, LLMI_E_USAGE, "--plot: more than %d lines", BENCH_PLOT_MAX_LINES);
    plot_series a[BENCH_PLOT_MAX_LINES], b[BENCH_PLOT_MAX_LINES], c[BENCH_PLOT_MAX_LINES];
    double *own[6 * BENCH_PLOT_MAX_LINES];   /* (x, y) of every line, made here, freed at the end */
    int n_own = 0;
    int rc = cdf_lines(ttft, n_ttft, a, own, &n_own, st);
    if (!rc) rc = cdf_lines(itl, n_itl, b, own, &n_own, st);
    for (int i = 0; i < n_kv && !rc; i++) {
        /* every k-th step, in percent */
        int n = kv[i].n, stride = n > CURVE_POINTS ? (n + CURVE_POINTS - 1) / CURVE_POINTS : 1, m = 0;
        double *x = malloc((size_t)(n / stride + 1) * sizeof *x), *y = malloc((size_t)(n / stride + 1) * sizeof *y);
        own[n_own++] = x;
        own[n_own++] = y;
        if (!x || !y) { rc = llmi_fail(st, LLMI_E_RUNTIME, "--plot: out of memory"); break; }
        for (int k = 0; k < n; k += stride, m++) {
            x[m] = kv[i].x[k];
            y[m] = 100 * kv[i].y[k];
        }
        c[i] = (plot_series){kv[i].label, x, y, NULL, m, false, false};
    }
    if (!rc) {
        plot_panel panels[3] = {
            {"Time to first token (CDF)", "TTFT (ms)", "requests with TTFT <= x (%)", false, 0, 100, a, n_ttft},
            {"Inter-token latency (CDF)", "gap between two tokens of a request (ms)", "gaps <= x (%)", false, 0, 100, b,
             n_itl},
            {"KV cache use", "time since the run started (s)", "KV blocks in use (%)", false, 0, 100, c, n_kv},
        };
        char title[256], test[160];
        bench_view_test(rep, rep->n_rows > 0 ? rep->n_rows - 1 : 0, test, sizeof test);
        snprintf(title, sizeof title, "llmi bench throughput: %s", rep->n_rows > 1 ? "request-rate sweep" : test);
        char *sub = subtitle_of(rep);
        rc = plot_svg_write(path, title, sub ? sub : "", panels, 3, st);
        free(sub);
    }
    for (int i = 0; i < n_own; i++) free(own[i]);
    return rc;
}
