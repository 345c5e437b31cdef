/* stop.c — stop-string matching (see stop.h). */
#include "engine/stop.h"

#include <string.h>

bool stop_completed(const char *text, size_t len, size_t n_new, const char *const *stops, int n_stops) {
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        if (sl == 0 || sl > len || n_new == 0) continue;
        /* Older text was searched when it was new: look only where an occurrence
         * reaches the new bytes, i.e. ends after byte len - n_new. */
        size_t from = len + 1 >= sl + n_new ? len + 1 - sl - n_new : 0;
        if (memmem(text + from, len - from, stops[i], sl)) return true;
    }
    return false;
}

size_t stop_first(const char *text, size_t len, size_t after, const char *const *stops, int n_stops, size_t *end) {
    size_t cut = len, cut_end = len;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]), from = after >= sl ? after - sl + 1 : 0;
        if (from >= len) continue;
        const char *p = memmem(text + from, len - from, stops[i], sl);
        if (!p) continue;
        size_t at = (size_t)(p - text);
        /* at one start, the shortest stop string is the one the text completed first */
        if (at < cut || (at == cut && at + sl < cut_end)) cut = at, cut_end = at + sl;
    }
    if (end) *end = cut_end;
    return cut;
}

size_t stop_holdback(const char *text, size_t len, const char *const *stops, int n_stops) {
    size_t hold = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t k = sl > 0 ? sl - 1 : 0; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}
