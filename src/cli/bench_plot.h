/* bench_plot.h — owns which pictures `llmi bench --plot FILE.svg` draws (plot.h draws them):
 *   sweep       tok/s against the swept dimension (the list with most values: -b, -p, -n,
 *               -d, --block-size), one line per combination of the other lists, one panel
 *               for prefill and one for decode, mean ± sd as error bars;
 *   throughput  the distributions (CDF) of TTFT and of inter-token latency, and KV cache
 *               use over time; one line per --request-rate (or per turn with --turns). */
#ifndef LLMI_BENCH_PLOT_H
#define LLMI_BENCH_PLOT_H

#include "cli/report.h"
#include "core/status.h"

int bench_plot_sweep(const report *rep, const char *path, llmi_status *st);

#define BENCH_PLOT_MAX_LINES 16

/* The samples one line of the throughput figure is drawn from. */
typedef struct bench_plot_samples {
    char label[48];
    double *x, *y;                 /* (n): CDFs use y only (the samples); KV use: x seconds, y share */
    int n;
} bench_plot_samples;

int bench_plot_throughput(const report *rep, const bench_plot_samples *ttft, int n_ttft, const bench_plot_samples *itl,
                          int n_itl, const bench_plot_samples *kv, int n_kv, const char *path, llmi_status *st);

#endif
