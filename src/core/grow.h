/* grow.h — owns growing a malloc'ed array to hold at least `need` elements, doubling, for
 * the builders with int32 counts (grammar rules and parse states, DRY tables).  Caps stay
 * below 2^30 elements, so a doubling never overflows. */
#ifndef LLMI_GROW_H
#define LLMI_GROW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* *p (cap elements of elem bytes) grown to hold need; false when out of memory or past
 * the bound (then *p and *cap are as they were). */
static inline bool grow_array(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    if (need > (INT32_C(1) << 30)) return false;
    int32_t c = *cap > 0 ? *cap : 16;
    while (c < need) c *= 2;
    void *np = realloc(*p, (size_t)c * elem);
    if (!np) return false;
    *p = np;
    *cap = c;
    return true;
}

#endif
