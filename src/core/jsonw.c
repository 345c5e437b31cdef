/* jsonw.c — JSON text writer (see jsonw.h). */
#include "core/jsonw.h"

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

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if invalid. */
static int utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

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
            int len = utf8_valid_len(p + i, n - i);
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
