/* jsonw.c — JSON text writer (see jsonw.h). */
#include "core/jsonw.h"
#include "core/utf8.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void jw_init(jsonw *w) {
    memset(w, 0, sizeof *w);
    w->first[0] = true;
}

void jw_free(jsonw *w) {
    free(w->buf);
    jw_init(w);
}

void jw_reset(jsonw *w) {
    w->len = 0;
    if (w->buf) w->buf[0] = '\0';
    w->depth = 0;
    w->first[0] = true;
    w->after_key = false;
    w->failed = false;
}

static void put(jsonw *w, const char *s, size_t n) {
    if (w->failed) return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1) cap *= 2;
        char *nb = realloc(w->buf, cap);
        if (!nb) {
            w->failed = true;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void puts_(jsonw *w, const char *s) { put(w, s, strlen(s)); }

/* Separator before a value or key at the current depth. */
static void item(jsonw *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (!w->first[w->depth]) put(w, ",", 1);
    w->first[w->depth] = false;
}

static void open_(jsonw *w, const char *c) {
    item(w);
    put(w, c, 1);
    if (w->depth + 1 >= JSONW_MAX_DEPTH) {
        w->failed = true;
        return;
    }
    w->first[++w->depth] = true;
}

static void close_(jsonw *w, const char *c) {
    if (w->depth > 0) w->depth--;
    put(w, c, 1);
}

void jw_obj_begin(jsonw *w) { open_(w, "{"); }
void jw_obj_end(jsonw *w) { close_(w, "}"); }
void jw_arr_begin(jsonw *w) { open_(w, "["); }
void jw_arr_end(jsonw *w) { close_(w, "]"); }

void jw_str(jsonw *w, const char *s, size_t n) {
    item(w);
    put(w, "\"", 1);
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c == '"') puts_(w, "\\\""), i++;
        else if (c == '\\') puts_(w, "\\\\"), i++;
        else if (c == '\n') puts_(w, "\\n"), i++;
        else if (c == '\r') puts_(w, "\\r"), i++;
        else if (c == '\t') puts_(w, "\\t"), i++;
        else if (c < 0x20 || c == 0x7F) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(w, esc);
            i++;
        } else {
            int32_t cp;
            int len = utf8_next((const char *)p + i, n - i, &cp);
            if (len == 0) {
                puts_(w, "\\ufffd");
                i++;
            } else {
                put(w, (const char *)p + i, (size_t)len);
                i += (size_t)len;
            }
        }
    }
    put(w, "\"", 1);
}

void jw_key(jsonw *w, const char *k) {
    jw_str(w, k, strlen(k));
    put(w, ":", 1);
    w->after_key = true;
}

void jw_cstr(jsonw *w, const char *s) {
    if (!s) jw_null(w);
    else jw_str(w, s, strlen(s));
}

void jw_int(jsonw *w, long long v) {
    char b[32];
    snprintf(b, sizeof b, "%lld", v);
    item(w);
    puts_(w, b);
}

void jw_num(jsonw *w, double v) {
    if (!isfinite(v)) {
        jw_null(w);
        return;
    }
    char b[40];
    snprintf(b, sizeof b, "%.9g", v);
    item(w);
    puts_(w, b);
}

void jw_null(jsonw *w) {
    item(w);
    puts_(w, "null");
}

int jw_flush_line(jsonw *w, FILE *f) {
    int rc = 0;
    if (w->failed) rc = -1;
    else if (fwrite(w->buf ? w->buf : "", 1, w->len, f) != w->len || fputc('\n', f) == EOF) rc = -1;
    jw_reset(w);
    return rc;
}
