/* strmap.c — string -> int map (strmap.h). */
#include "core/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static size_t hash(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return (size_t)h;
}

static bool same(const strmap *m, size_t i, const char *k, size_t n) {
    return m->lens[i] == n && (n == 0 || memcmp(m->keys[i], k, n) == 0);
}

int strmap_get(const strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    for (size_t i = hash(key, len) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (same(m, i, key, len)) return m->vals[i];
    }
}

static bool grow(strmap *m) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    const char **keys = calloc(cap, sizeof *keys);
    size_t *lens = malloc(cap * sizeof *lens);
    int *vals = malloc(cap * sizeof *vals);
    if (!keys || !lens || !vals) {
        free(keys); free(lens); free(vals);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = hash(m->keys[i], m->lens[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        lens[j] = m->lens[i];
        vals[j] = m->vals[i];
    }
    free(m->keys); free(m->lens); free(m->vals);
    m->keys = keys;
    m->lens = lens;
    m->vals = vals;
    m->cap = cap;
    return true;
}

bool strmap_put(strmap *m, const char *key, size_t len, int v) {
    if (2 * (m->n + 1) > m->cap && !grow(m)) return false;
    size_t i = hash(key, len) & (m->cap - 1);
    while (m->keys[i] && !same(m, i, key, len)) i = (i + 1) & (m->cap - 1);
    if (!m->keys[i]) {
        m->n++;
        /* an empty key must still mark its slot taken */
        m->keys[i] = len ? key : "";
        m->lens[i] = len;
    }
    m->vals[i] = v;
    return true;
}

void strmap_free(strmap *m) {
    free(m->keys); free(m->lens); free(m->vals);
    *m = (strmap){0};
}
