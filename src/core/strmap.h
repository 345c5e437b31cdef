/* strmap.h — owns the map from byte strings to ints that parsers use for names (grammar
 * rules, JSON-schema definitions and properties).  Open addressing, FNV-1a; keys are
 * borrowed (the caller keeps them alive and unchanged while the map lives). */
#ifndef LLMI_STRMAP_H
#define LLMI_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct strmap {
    const char **keys;   /* (cap) borrowed; NULL = free slot */
    size_t *lens;        /* (cap) */
    int *vals;           /* (cap) */
    size_t cap, n;       /* cap: 0 or a power of two, at least twice n */
} strmap;

/* The value of key[0, len), or -1 when absent. */
int strmap_get(const strmap *m, const char *key, size_t len);
/* Sets key[0, len) to v (replacing an earlier value); false when out of memory. */
bool strmap_put(strmap *m, const char *key, size_t len, int v);
void strmap_free(strmap *m);

#endif
