/* report.h — owns the result tables of bench and profile and their four renderings:
 * md (llama-bench-like: columns padded to their widest cell, numbers right-aligned, a
 * "mean ± sd" column for each X_mean/X_sd pair), csv, json (one array) and jsonl (one
 * object per line).  Columns are declared as rows set them; every
 * rendering carries the same columns in the same order, and csv/json the full precision. */
#ifndef LLMI_REPORT_H
#define LLMI_REPORT_H

#include <stdbool.h>
#include <stdio.h>
#include "core/status.h"

typedef enum { REPORT_MD = 0, REPORT_CSV, REPORT_JSON, REPORT_JSONL } report_format;
int report_format_parse(const char *s, report_format *f, llmi_status *st);   /* -o value */

typedef enum { REPORT_STR = 0, REPORT_INT, REPORT_NUM, REPORT_RAW_JSON } report_type;

#define REPORT_MAX_COLS 192
#define REPORT_KEY_LEN 48
#define REPORT_MAX_READ_ROWS 100000    /* rows report_read_json accepts from one file */

typedef struct report_col {
    char key[REPORT_KEY_LEN];
    report_type type;
    int decimals;                  /* digits after the point in md */
} report_col;

typedef struct report_cell {
    char *s;                       /* REPORT_STR / REPORT_RAW_JSON (malloc'ed); NULL = unset */
    double v;                      /* REPORT_INT / REPORT_NUM; NaN = unset */
} report_cell;

typedef struct report {
    int n_cols;
    report_col cols[REPORT_MAX_COLS];
    int n_rows, cap_rows;
    report_cell *cells;            /* (cap_rows, REPORT_MAX_COLS) */
} report;

void report_init(report *r);
void report_free(report *r);
/* Starts a new row; the setters below write into the latest row. */
int report_row(report *r);
/* Raw JSON (an array or object text) appears in json/jsonl only. */
void report_str(report *r, const char *key, const char *val);
void report_int(report *r, const char *key, long long v);
void report_num(report *r, const char *key, double v, int md_decimals);
void report_raw_json(report *r, const char *key, const char *json);
/* Sets a numeric cell of an earlier row (a summary of all rows, e.g. bench's slo_max_rate). */
void report_num_at(report *r, int row, const char *key, double v, int md_decimals);
/* Appends the rows of a json (array of objects, or one object) or jsonl text, as this module
 * writes them; name (the file) starts the error messages.  A row is bounded by
 * REPORT_MAX_COLS fields of keys shorter than REPORT_KEY_LEN. */
int report_read_json(report *r, const char *text, const char *name, llmi_status *st);
/* Value of a numeric cell of row i, NaN when unset or unknown. */
double report_get(const report *r, int row, const char *key);
/* Text of a string cell of row i, NULL when unset or not a string column. */
const char *report_get_str(const report *r, int row, const char *key);
bool report_has(const report *r, const char *key);
/* The column exists and its rows do not all hold the same value. */
bool report_varies(const report *r, const char *key);

int report_write(const report *r, report_format f, FILE *out);
/* Row i, or all rows as an array, as cJSON (caller deletes), to nest tables in one JSON
 * document or tag rows (profile). */
struct cJSON;
struct cJSON *report_json_row(const report *r, int i);
struct cJSON *report_json_array(const report *r);
/* Writes j and a newline to out, on one line (jsonl) or indented (json), then deletes j. */
void report_json_print(struct cJSON *j, bool one_line, FILE *out);

#endif
