/* test_core_text.c — core/utf8 (strict UTF-8 over utf8proc) against the Unicode
 * standard's table of well-formed byte sequences (Unicode 15, Table 3-7), and core/strmap
 * against a linear list, both on fresh random inputs. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/strmap.h"
#include "core/utf8.h"
#include "test.h"

/* Table 3-7: the byte ranges of each well-formed sequence, lead byte first. */
static int table37_len(const unsigned char *s, size_t n) {
    static const struct { unsigned char lo[4], hi[4]; int len; } rows[] = {
        {{0x00}, {0x7F}, 1},
        {{0xC2, 0x80}, {0xDF, 0xBF}, 2},
        {{0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}, 3},
        {{0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}, 3},
        {{0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}, 3},
        {{0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}, 3},
        {{0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}, 4},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        if ((size_t)rows[r].len > n) continue;
        bool ok = true;
        for (int k = 0; k < rows[r].len && ok; k++) ok = s[k] >= rows[r].lo[k] && s[k] <= rows[r].hi[k];
        if (ok) return rows[r].len;
    }
    return 0;
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

TEST(utf8_matches_unicode_table_3_7) {
    uint64_t x = test_seed() | 1;
    unsigned char buf[16];
    int checked = 0, wellformed = 0;
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = 1 + rng_next(&x) % 6;
        for (size_t i = 0; i < n; i++) {
            /* bias toward lead and continuation bytes so that long sequences occur */
            uint64_t r = rng_next(&x);
            buf[i] = (unsigned char)(r % 4 == 0 ? 0x80 | (r >> 8) % 0x40 : r % 4 == 1 ? 0xC0 | (r >> 8) % 0x40 : r >> 8);
        }
        int32_t cp = -7;
        int got = utf8_next((const char *)buf, n, &cp), want = table37_len(buf, n);
        checked++;
        wellformed += want > 0;
        if (got != want) {
            CHECK_MSG(0, "bytes %02x %02x %02x %02x (n %zu): utf8_next %d, Table 3-7 %d", buf[0], buf[1], buf[2], buf[3], n, got, want);
            break;
        }
        if (got) {
            /* the code point round-trips through utf8_encode to the same bytes */
            char enc[4];
            int e = utf8_encode(cp, enc);
            CHECK(e == got && memcmp(enc, buf, (size_t)e) == 0);
        } else {
            CHECK(cp == -7);
        }
        /* utf8_valid_prefix: the well-formed sequences from the start */
        size_t want_prefix = 0;
        while (want_prefix < n) {
            int l = table37_len(buf + want_prefix, n - want_prefix);
            if (!l) break;
            want_prefix += (size_t)l;
        }
        CHECK(utf8_valid_prefix((const char *)buf, n) == want_prefix);
    }
    int32_t cp;
    CHECK(utf8_next("", 0, &cp) == 0);
    char enc[4];
    CHECK(utf8_encode(0xD800, enc) == 0 && utf8_encode(0x110000, enc) == 0 && utf8_encode(-1, enc) == 0);
    CHECK(utf8_encode(0x10FFFF, enc) == 4);
    printf("  %d byte strings, %d starting well-formed: utf8_next agrees with Table 3-7\n", checked, wellformed);
}

TEST(strmap_matches_a_linear_list) {
    enum { N = 3000 };
    uint64_t x = test_seed() * 2 + 1;
    static char keys[N][8];
    static size_t lens[N];
    static int vals[N];
    int n = 0;
    strmap m = {0};
    for (int op = 0; op < 20000; op++) {
        char k[8];
        size_t len = rng_next(&x) % 7;   /* keys from a small alphabet, with NUL bytes: repeats and growth */
        for (size_t i = 0; i < len; i++) k[i] = "ab\0c"[rng_next(&x) % 4];
        int want = -1, at = -1;
        for (int i = 0; i < n; i++)
            if (lens[i] == len && memcmp(keys[i], k, len) == 0) want = vals[i], at = i;
        CHECK(strmap_get(&m, k, len) == want);
        if (rng_next(&x) % 2 && (at >= 0 || n < N)) {
            int v = (int)(rng_next(&x) % 1000);
            if (at < 0) {
                at = n++;
                memcpy(keys[at], k, len);
                lens[at] = len;
            }
            vals[at] = v;
            CHECK(strmap_put(&m, keys[at], len, v));
        }
    }
    CHECK(m.n == (size_t)n);
    for (int i = 0; i < n; i++) CHECK(strmap_get(&m, keys[i], lens[i]) == vals[i]);
    strmap_free(&m);
    CHECK(strmap_get(&m, "a", 1) == -1);
}
