/* report.c — see report.h. */
#include "cli/report.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int report_format_parse(const char *s, report_format *f, llmi_status *st) {
    if (!s) return llmi_fail(st, LLMI_E_USAGE, "-o: missing value (md, csv, json, jsonl)");
    if (!strcmp(s, "md")) *f = REPORT_MD;
    else if (!strcmp(s, "csv")) *f = REPORT_CSV;
    else if (!strcmp(s, "json")) *f = REPORT_JSON;
    else if (!strcmp(s, "jsonl")) *f = REPORT_JSONL;
    else return llmi_fail(st, LLMI_E_USAGE, "-o %s: unknown format (md, csv, json, jsonl)", s);
    return 0;
}

void report_init(report *r) { memset(r, 0, sizeof *r); }

void report_free(report *r) {
    for (int i = 0; i < r->n_rows; i++)
        for (int c = 0; c < REPORT_MAX_COLS; c++) free(r->cells[(size_t)i * REPORT_MAX_COLS + c].s);
    free(r->cells);
    memset(r, 0, sizeof *r);
}

int report_row(report *r) {
    if (r->n_rows == r->cap_rows) {
        int cap = r->cap_rows ? r->cap_rows * 2 : 16;
        report_cell *c = realloc(r->cells, (size_t)cap * REPORT_MAX_COLS * sizeof *c);
        if (!c) return -1;
        r->cells = c;
        r->cap_rows = cap;
    }
    report_cell *row = r->cells + (size_t)r->n_rows * REPORT_MAX_COLS;
    for (int c = 0; c < REPORT_MAX_COLS; c++) row[c] = (report_cell){NULL, NAN};
    return r->n_rows++;
}

static int report_col_index(report *r, const char *key, report_type t, int decimals) {
    for (int c = 0; c < r->n_cols; c++)
        if (!strcmp(r->cols[c].key, key)) return c;
    if (r->n_cols == REPORT_MAX_COLS) return -1;
    report_col *col = &r->cols[r->n_cols];
    snprintf(col->key, sizeof col->key, "%s", key);
    col->type = t;
    col->decimals = decimals;
    return r->n_cols++;
}

static report_cell *report_cell_at(report *r, const char *key, report_type t, int decimals) {
    if (r->n_rows == 0) return NULL;
    int c = report_col_index(r, key, t, decimals);
    if (c < 0) return NULL;
    return &r->cells[(size_t)(r->n_rows - 1) * REPORT_MAX_COLS + c];
}

void report_str(report *r, const char *key, const char *val) {
    report_cell *c = report_cell_at(r, key, REPORT_STR, 0);
    if (!c) return;
    free(c->s);
    c->s = strdup(val ? val : "");
}

void report_raw_json(report *r, const char *key, const char *json) {
    report_cell *c = report_cell_at(r, key, REPORT_RAW_JSON, 0);
    if (!c) return;
    free(c->s);
    c->s = strdup(json ? json : "null");
}

void report_int(report *r, const char *key, long long v) {
    report_cell *c = report_cell_at(r, key, REPORT_INT, 0);
    if (c) c->v = (double)v;
}

void report_num(report *r, const char *key, double v, int md_decimals) {
    report_cell *c = report_cell_at(r, key, REPORT_NUM, md_decimals);
    if (c) c->v = v;
}

double report_get(const report *r, int row, const char *key) {
    if (row < 0 || row >= r->n_rows) return NAN;
    for (int c = 0; c < r->n_cols; c++)
        if (!strcmp(r->cols[c].key, key)) return r->cells[(size_t)row * REPORT_MAX_COLS + c].v;
    return NAN;
}

/* A value as csv writes it: full precision (%.10g), integers exact, unset empty. */
static void fmt_num(char *buf, size_t cap, const report_col *col, const report_cell *cell, bool md) {
    if (col->type == REPORT_STR) { snprintf(buf, cap, "%s", cell->s ? cell->s : ""); return; }
    if (isnan(cell->v)) { buf[0] = '\0'; return; }
    if (col->type == REPORT_INT) snprintf(buf, cap, "%.0f", cell->v);
    else if (md) snprintf(buf, cap, "%.*f", col->decimals, cell->v);
    else snprintf(buf, cap, "%.10g", cell->v);
}

static size_t key_len(const char *k) { return strlen(k); }

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* Column c is X_mean and c + 1 is X_sd: md shows them as one "X" column. */
static bool md_pair(const report *r, int c) {
    if (c + 1 >= r->n_cols || !ends_with(r->cols[c].key, "_mean") || !ends_with(r->cols[c + 1].key, "_sd"))
        return false;
    size_t n = key_len(r->cols[c].key) - 5;
    return key_len(r->cols[c + 1].key) == n + 3 && !strncmp(r->cols[c].key, r->cols[c + 1].key, n);
}

static void write_md(const report *r, FILE *out) {
    fputc('|', out);
    for (int c = 0; c < r->n_cols; c++) {
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        if (md_pair(r, c)) {
            fprintf(out, " %.*s |", (int)(key_len(r->cols[c].key) - 5), r->cols[c].key);
            c++;
        } else {
            fprintf(out, " %s |", r->cols[c].key);
        }
    }
    fputs("\n|", out);
    for (int c = 0; c < r->n_cols; c++) {
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        fputs(r->cols[c].type == REPORT_STR ? " --- |" : " ---: |", out);
        if (md_pair(r, c)) c++;
    }
    fputc('\n', out);
    char a[512], b[512];
    for (int i = 0; i < r->n_rows; i++) {
        const report_cell *row = r->cells + (size_t)i * REPORT_MAX_COLS;
        fputc('|', out);
        for (int c = 0; c < r->n_cols; c++) {
            if (r->cols[c].type == REPORT_RAW_JSON) continue;
            fmt_num(a, sizeof a, &r->cols[c], &row[c], true);
            if (md_pair(r, c)) {
                report_col sdcol = r->cols[c + 1];
                sdcol.decimals = r->cols[c].decimals;
                fmt_num(b, sizeof b, &sdcol, &row[c + 1], true);
                fprintf(out, " %s ± %s |", a, b);
                c++;
            } else {
                /* a '|' inside a cell would split the table */
                for (char *p = a; *p; p++) if (*p == '|' || *p == '\n') *p = '/';
                fprintf(out, " %s |", a);
            }
        }
        fputc('\n', out);
    }
}

static void csv_field(FILE *out, const char *s) {
    if (!strpbrk(s, ",\"\n\r")) { fputs(s, out); return; }
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

static void write_csv(const report *r, FILE *out) {
    bool first = true;
    for (int c = 0; c < r->n_cols; c++) {
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        if (!first) fputc(',', out);
        csv_field(out, r->cols[c].key);
        first = false;
    }
    fputc('\n', out);
    char buf[512];
    for (int i = 0; i < r->n_rows; i++) {
        const report_cell *row = r->cells + (size_t)i * REPORT_MAX_COLS;
        first = true;
        for (int c = 0; c < r->n_cols; c++) {
            if (r->cols[c].type == REPORT_RAW_JSON) continue;
            if (!first) fputc(',', out);
            fmt_num(buf, sizeof buf, &r->cols[c], &row[c], false);
            csv_field(out, buf);
            first = false;
        }
        fputc('\n', out);
    }
}

cJSON *report_json_row(const report *r, int i) {
    cJSON *o = cJSON_CreateObject();
    const report_cell *row = r->cells + (size_t)i * REPORT_MAX_COLS;
    for (int c = 0; c < r->n_cols && o; c++) {
        const report_col *col = &r->cols[c];
        cJSON *v;
        if (col->type == REPORT_STR) v = row[c].s ? cJSON_CreateString(row[c].s) : cJSON_CreateNull();
        else if (col->type == REPORT_RAW_JSON) {
            v = row[c].s ? cJSON_Parse(row[c].s) : NULL;
            if (!v) v = cJSON_CreateNull();
        } else v = isfinite(row[c].v) ? cJSON_CreateNumber(row[c].v) : cJSON_CreateNull();
        cJSON_AddItemToObject(o, col->key, v);
    }
    return o;
}

struct cJSON *report_json_array(const report *r) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < r->n_rows; i++) cJSON_AddItemToArray(arr, report_json_row(r, i));
    return arr;
}

void report_json_print(struct cJSON *j, bool one_line, FILE *out) {
    char *s = one_line ? cJSON_PrintUnformatted(j) : cJSON_Print(j);
    if (s) fprintf(out, "%s\n", s);
    free(s);
    cJSON_Delete(j);
}

int report_write(const report *r, report_format f, FILE *out) {
    if (f == REPORT_MD) write_md(r, out);
    else if (f == REPORT_CSV) write_csv(r, out);
    else if (f == REPORT_JSONL)
        for (int i = 0; i < r->n_rows; i++) report_json_print(report_json_row(r, i), true, out);
    else report_json_print(report_json_array(r), false, out);
    fflush(out);
    return ferror(out) ? LLMI_E_RUNTIME : 0;
}
