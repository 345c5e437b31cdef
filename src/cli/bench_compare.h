/* bench_compare.h — owns `llmi bench --compare BASE NEW` (llama.cpp's compare-llama-bench.py
 * for llmi's rows): reads two files of rows that bench wrote (jsonl, or json), pairs the
 * rows that measured the same configuration (model file name, test and its settings; a
 * field only one file has is ignored, so files of older commits still pair), and prints
 * for each pair and headline metric both figures, their ratio (> 1: NEW is better, for
 * rates new/base, for latencies and perplexity base/new) and whether the difference is
 * bigger than the measured noise sqrt(sd_base² + sd_new²). */
#ifndef LLMI_BENCH_COMPARE_H
#define LLMI_BENCH_COMPARE_H

#include <stdio.h>
#include "cli/report.h"
#include "core/status.h"

/* The table of every matched (configuration, metric) in out (its rows: test, the varying
 * configuration fields, metric, base_mean, base_sd, new_mean, new_sd, ratio, flag). */
int bench_compare_rows(const report *base, const report *cur, report *out, llmi_status *st);

/* Reads both files, prints the comparison as fmt (md: compact, with a header line per
 * file) to out and a note of unmatched rows to stderr.  fail_below > 0: fails (runtime
 * error naming the worst ratio) when any ratio is below it, after printing. */
int bench_compare(const char *base_path, const char *new_path, report_format fmt, double fail_below, FILE *out,
                  llmi_status *st);

#endif
