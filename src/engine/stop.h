/* stop.h — owns stop strings over generated text: whether the newest bytes completed
 * one (the engine ends the request), where the first one starts (the output is cut
 * there: a stop string is not part of the output), and how many trailing bytes a stream
 * must hold back because they could still grow into one (so a user never sees the start
 * of a stop string that later completes). */
#ifndef LLMI_STOP_H
#define LLMI_STOP_H

#include <stdbool.h>
#include <stddef.h>

/* True when some stop string occurs in text (len) overlapping its last n_new bytes. */
bool stop_completed(const char *text, size_t len, size_t n_new, const char *const *stops, int n_stops);
/* Offset of the earliest occurrence of any stop string in text that ends past its first
 * `after` bytes (one completed within them did not count: vLLM's min_tokens), or len when
 * none; *end (when end is not NULL) gets where that occurrence ends (of the shortest one
 * starting there), or len (vLLM's include_stop_str_in_output cuts there). */
size_t stop_first(const char *text, size_t len, size_t after, const char *const *stops, int n_stops, size_t *end);
/* Length of the longest proper prefix of a stop string that text ends with. */
size_t stop_holdback(const char *text, size_t len, const char *const *stops, int n_stops);

#endif
