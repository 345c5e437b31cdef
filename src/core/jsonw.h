/* jsonw.h — owns writing JSON text: a growable buffer with commas and nesting handled,
 * strings escaped so the output is always valid UTF-8 JSON (bytes that are not valid
 * UTF-8, such as half of a multi-byte character in a token piece, become U+FFFD).
 * Used for every machine-readable output (generate --json, bench -o json). */
#ifndef LLMI_JSONW_H
#define LLMI_JSONW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define JSONW_MAX_DEPTH 32

typedef struct jsonw {
    char *buf;                       /* (cap) the text so far, NUL-terminated */
    size_t len, cap;
    int depth;
    bool first[JSONW_MAX_DEPTH];     /* no comma before the next item at this depth */
    bool after_key;
    bool failed;                     /* out of memory or nesting too deep */
} jsonw;

void jw_init(jsonw *w);
void jw_free(jsonw *w);
void jw_reset(jsonw *w);
void jw_obj_begin(jsonw *w);
void jw_obj_end(jsonw *w);
void jw_arr_begin(jsonw *w);
void jw_arr_end(jsonw *w);
void jw_key(jsonw *w, const char *k);
void jw_str(jsonw *w, const char *s, size_t n);
void jw_cstr(jsonw *w, const char *s);   /* NULL writes null */
void jw_int(jsonw *w, long long v);
void jw_num(jsonw *w, double v);          /* non-finite writes null */
void jw_null(jsonw *w);
/* Writes the buffer and a newline to f, then resets; returns 0 or -1 on error. */
int jw_flush_line(jsonw *w, FILE *f);

#endif
