/* utf8.c — strict UTF-8 through utf8proc (utf8.h). */
#include "core/utf8.h"

#include <utf8proc.h>

int utf8_next(const char *s, size_t n, int32_t *cp) {
    if (n == 0) return 0;
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)(n > 4 ? 4 : n), &c);
    if (k <= 0) return 0;
    *cp = c;
    return (int)k;
}

int utf8_encode(int32_t cp, char out[4]) {
    if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return (int)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    int32_t cp;
    while (i < n) {
        int k = utf8_next(s + i, n - i, &cp);
        if (!k) break;
        i += (size_t)k;
    }
    return i;
}
