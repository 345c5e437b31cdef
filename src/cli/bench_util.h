/* bench_util.h — owns what bench and profile rows share: the provenance columns every
 * row carries (commit, date, backend, device, model, dtypes, threads), process peak
 * memory, and the progress bar (stderr, only when it is a terminal). */
#ifndef LLMI_BENCH_UTIL_H
#define LLMI_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include "backend/backend.h"
#include "model/model.h"
#include "cli/report.h"

/* Adds commit, date (UTC, ISO 8601), backend, device, model, model_format, params_m,
 * weights_gib, weight_dtype, threads to the current row of r.  model_label: the --dummy
 * spec or the model path. */
void bench_meta(report *r, const llmi_model *m, const llmi_backend *b, const char *model_label, int n_threads);
/* Name of the dtype most weights are stored in (the first layer's wq). */
const char *bench_weight_dtype(const llmi_model *m);
/* "f32"|"f16"|"bf16" -> kv dtype; -1 when unknown. */

/* Process peak resident memory (VmHWM) in bytes; bench_peak_reset starts a new window
 * where the kernel allows it (returns false when it does not). */
size_t bench_peak_rss(void);
bool bench_peak_reset(void);

/* Progress on stderr as "label [=====>    ] done/total [note]", redrawn in place; a no-op
 * unless stderr is a tty (logs and pipes get nothing). */
typedef struct bench_progress {
    bool on;
    int total;
    int shown;                 /* widest line drawn, to blank it at the end */
    char label[64];
} bench_progress;
void bench_progress_init(bench_progress *p, const char *label, int total);
void bench_progress_update(bench_progress *p, int done);
void bench_progress_note(bench_progress *p, int done, const char *note);
void bench_progress_end(bench_progress *p);

#endif
