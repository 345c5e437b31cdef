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

void report_num_at(report *r, int row, const char *key, double v, int md_decimals) {
    if (row < 0 || row >= r->n_rows) return;
    int c = report_col_index(r, key, REPORT_NUM, md_decimals);
    if (c >= 0) r->cells[(size_t)row * REPORT_MAX_COLS + c].v = v;
}

static int report_find(const report *r, const char *key) {
    for (int c = 0; c < r->n_cols; c++)
        if (!strcmp(r->cols[c].key, key)) return c;
    return -1;
}

double report_get(const report *r, int row, const char *key) {
    int c = report_find(r, key);
    if (row < 0 || row >= r->n_rows || c < 0) return NAN;
    return r->cells[(size_t)row * REPORT_MAX_COLS + c].v;
}

const char *report_get_str(const report *r, int row, const char *key) {
    int c = report_find(r, key);
    if (row < 0 || row >= r->n_rows || c < 0 || r->cols[c].type != REPORT_STR) return NULL;
    return r->cells[(size_t)row * REPORT_MAX_COLS + c].s;
}

bool report_has(const report *r, const char *key) { return report_find(r, key) >= 0; }

bool report_varies(const report *r, const char *key) {
    int c = report_find(r, key);
    if (c < 0) return false;
    for (int i = 1; i < r->n_rows; i++) {
        const report_cell *a = &r->cells[c], *b = &r->cells[(size_t)i * REPORT_MAX_COLS + c];
        if (r->cols[c].type == REPORT_STR || r->cols[c].type == REPORT_RAW_JSON) {
            if ((a->s == NULL) != (b->s == NULL) || (a->s && strcmp(a->s, b->s))) return true;
        } else if (isnan(a->v) != isnan(b->v) || (!isnan(a->v) && a->v != b->v)) {
            return true;
        }
    }
    return false;
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

/* Columns a person sees in a terminal: display width of UTF-8 text (one column per code
 * point; "±" is two bytes). */
static int md_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* One md cell's text: X_mean/X_sd pairs as "mean ± sd", '|' and newlines made harmless. */
static void md_cell(const report *r, const report_cell *row, int c, char *buf, size_t cap) {
    fmt_num(buf, cap, &r->cols[c], &row[c], true);
    if (md_pair(r, c)) {
        char sd[256];
        report_col sdcol = r->cols[c + 1];
        sdcol.decimals = r->cols[c].decimals;
        fmt_num(sd, sizeof sd, &sdcol, &row[c + 1], true);
        size_t n = strlen(buf);
        if (sd[0]) snprintf(buf + n, cap - n, " ± %s", sd);   /* no sd measured: the mean alone */
        return;
    }
    /* a '|' inside a cell would split the table */
    for (char *p = buf; *p; p++) if (*p == '|' || *p == '\n') *p = '/';
}

/* Header, separator and rows, each column padded to its widest cell (numbers right-aligned,
 * as llama-bench prints them), so the raw text reads as a table too. */
static void write_md(const report *r, FILE *out) {
    int width[REPORT_MAX_COLS];
    char a[512], hdr[REPORT_KEY_LEN];
    for (int c = 0; c < r->n_cols; c++) {
        width[c] = 3;
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        snprintf(hdr, sizeof hdr, "%.*s", (int)(key_len(r->cols[c].key) - (md_pair(r, c) ? 5 : 0)), r->cols[c].key);
        width[c] = md_width(hdr) > width[c] ? md_width(hdr) : width[c];
        for (int i = 0; i < r->n_rows; i++) {
            md_cell(r, r->cells + (size_t)i * REPORT_MAX_COLS, c, a, sizeof a);
            width[c] = md_width(a) > width[c] ? md_width(a) : width[c];
        }
        if (md_pair(r, c)) c++;
    }
    fputc('|', out);
    for (int c = 0; c < r->n_cols; c++) {
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        snprintf(hdr, sizeof hdr, "%.*s", (int)(key_len(r->cols[c].key) - (md_pair(r, c) ? 5 : 0)), r->cols[c].key);
        int pad = width[c] - md_width(hdr);
        if (r->cols[c].type != REPORT_STR) fprintf(out, " %*s%s |", pad, "", hdr);
        else fprintf(out, " %s%*s |", hdr, pad, "");
        if (md_pair(r, c)) c++;
    }
    fputs("\n|", out);
    for (int c = 0; c < r->n_cols; c++) {
        if (r->cols[c].type == REPORT_RAW_JSON) continue;
        bool right = r->cols[c].type != REPORT_STR;
        fputc(' ', out);
        for (int k = 0; k < width[c] - (right ? 1 : 0); k++) fputc('-', out);
        fputs(right ? ": |" : " |", out);
        if (md_pair(r, c)) c++;
    }
    fputc('\n', out);
    for (int i = 0; i < r->n_rows; i++) {
        const report_cell *row = r->cells + (size_t)i * REPORT_MAX_COLS;
        fputc('|', out);
        for (int c = 0; c < r->n_cols; c++) {
            if (r->cols[c].type == REPORT_RAW_JSON) continue;
            md_cell(r, row, c, a, sizeof a);
            int pad = width[c] - md_width(a);
            if (r->cols[c].type != REPORT_STR) fprintf(out, " %*s%s |", pad, "", a);
            else fprintf(out, " %s%*s |", a, pad, "");
            if (md_pair(r, c)) c++;
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

/* One object's fields as a new row: strings, numbers (integral ones as integers), null as
 * unset, arrays and objects as raw JSON. */
static int read_object(report *r, const cJSON *o) {
    if (!cJSON_IsObject(o) || r->n_rows >= REPORT_MAX_READ_ROWS || report_row(r) < 0) return -1;
    for (const cJSON *f = o->child; f; f = f->next) {
        if (!f->string || strlen(f->string) >= REPORT_KEY_LEN) return -1;
        if (!report_has(r, f->string) && r->n_cols == REPORT_MAX_COLS) return -1;
        if (cJSON_IsString(f)) report_str(r, f->string, f->valuestring);
        else if (cJSON_IsNumber(f) && f->valuedouble == floor(f->valuedouble) && fabs(f->valuedouble) < 1e15)
            report_int(r, f->string, (long long)f->valuedouble);
        else if (cJSON_IsNumber(f)) report_num(r, f->string, f->valuedouble, 2);
        else if (cJSON_IsArray(f) || cJSON_IsObject(f)) {
            char *js = cJSON_PrintUnformatted(f);
            report_raw_json(r, f->string, js);
            free(js);
        } else if (cJSON_IsNull(f) && !report_has(r, f->string)) {
            report_num(r, f->string, NAN, 2);
        }
    }
    return 0;
}

int report_read_json(report *r, const char *text, const char *name, llmi_status *st) {
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
    if (*p == '[' || *p == '{') {
        /* json: an array of rows or one row; else try it as jsonl below */
        cJSON *j = cJSON_ParseWithOpts(p, NULL, true);   /* one document, nothing after it */
        if (j) {
            int rc = 0;
            if (cJSON_IsArray(j)) {
                for (const cJSON *o = j->child; o && !rc; o = o->next) rc = read_object(r, o);
            } else {
                rc = read_object(r, j);
            }
            cJSON_Delete(j);
            if (rc)
                return llmi_fail(st, LLMI_E_USAGE, "%s: not a list of at most %d llmi bench rows (objects of fields)",
                                 name, REPORT_MAX_READ_ROWS);
            return 0;
        }
    }
    long lineno = 0;
    for (const char *line = text; *line; ) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        lineno++;
        size_t k = 0;
        while (k < len && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k < len) {
            cJSON *o = cJSON_ParseWithLength(line, len);
            int rc = o ? read_object(r, o) : -1;
            cJSON_Delete(o);
            if (rc)
                return llmi_fail(st, LLMI_E_USAGE, "%s:%ld: not a JSON object of llmi bench fields (or past %d rows)",
                                 name, lineno, REPORT_MAX_READ_ROWS);
        }
        line = nl ? nl + 1 : line + len;
    }
    if (r->n_rows == 0) return llmi_fail(st, LLMI_E_USAGE, "%s: no rows in it", name);
    return 0;
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
