/* bench_view.h — owns how bench's rows read to a person, in llama-bench's spirit: the
 * compact md table (model, backend, the columns that vary between the rows, the test and
 * its rates as mean ± sd) under a two-line header of what every row shares (model size and
 * dtype, device, threads; KV, commit, date), and the short name of a row's test
 * ("pp512+tg128 @ d4096", "200 req in128/out64 @ 4/s", "ppl c512 x40").  The full rows stay
 * in report.h's md/csv/json/jsonl. */
#ifndef LLMI_BENCH_VIEW_H
#define LLMI_BENCH_VIEW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include "cli/report.h"

typedef enum { BENCH_ROW_SWEEP = 0, BENCH_ROW_THROUGHPUT, BENCH_ROW_PPL, BENCH_ROW_OTHER } bench_row_kind;
/* What row `row` measured, from the fields it holds (files read back may mix kinds). */
bench_row_kind bench_view_kind(const report *r, int row);

/* The short name of row i's test. */
void bench_view_test(const report *r, int row, char *buf, size_t cap);
/* The last path component of s (model and dataset paths). */
const char *bench_view_basename(const char *s);

/* Fields that name what a row measured besides its test name (the sweep's kv_type,
 * n_batch, ...), NULL-terminated; a view shows the ones that vary as columns. */
extern const char *const bench_view_config_keys[];

/* Writes the header of what every row of r shares (fields that do not vary), two lines:
 * model, device and threads after lead; KV, workload settings, commit and date under it. */
void bench_view_header(const report *r, const char *lead, FILE *out);
/* The compact md table of r with its header line; returns 0 or LLMI_E_RUNTIME on a write
 * error. */
int bench_view_write(const report *r, FILE *out);

#endif
