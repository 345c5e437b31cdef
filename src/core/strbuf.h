/* strbuf.h — owns the growable NUL-terminated text buffer that modules building text
 * (chat prompts, grammars) append to.  A failed allocation is remembered (oom) and later
 * appends do nothing, so a builder appends in straight lines and checks once at the end. */
#ifndef LLMI_STRBUF_H
#define LLMI_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct strbuf {
    char *p;        /* (cap) the text, NUL-terminated once anything was appended; or NULL */
    size_t n, cap;
    bool oom;
} strbuf;

void strbuf_put(strbuf *b, const char *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
void strbuf_putc(strbuf *b, char c);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void strbuf_printf(strbuf *b, const char *fmt, ...);
/* The text, now the caller's ("" when nothing was appended), or NULL after a failed
 * allocation; b is left empty. */
char *strbuf_take(strbuf *b);

#endif
