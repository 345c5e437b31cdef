/* utf8.h — owns reading and writing UTF-8 one code point at a time, strictly: no overlong
 * forms, surrogates or values past U+10FFFF (what Rust's str, Python's codecs and JSON
 * parsers accept).  A thin layer over utf8proc, so every module judges text the same way;
 * the tokenizer's streaming decoder, which must resume mid-character, keeps its own. */
#ifndef LLMI_UTF8_H
#define LLMI_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed sequence that starts s[0, n), its code point in *cp;
 * 0 when there is none (n == 0, a stray or truncated sequence), *cp then untouched. */
int utf8_next(const char *s, size_t n, int32_t *cp);
/* Writes cp's UTF-8 to out; returns its length, 0 for a value that is no code point. */
int utf8_encode(int32_t cp, char out[4]);
/* Bytes of s[0, n) that are well-formed UTF-8 from the start: n when all of it is. */
size_t utf8_valid_prefix(const char *s, size_t n);
static inline bool utf8_valid(const char *s, size_t n) { return utf8_valid_prefix(s, n) == n; }

#endif
