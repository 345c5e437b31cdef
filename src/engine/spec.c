/* spec.c — prompt lookup (see spec.h). */
#include "engine/spec.h"

#include <string.h>

int spec_ngram_propose(const int32_t *tokens, int n_tokens, int ngram_min, int ngram_max, int k, int32_t *out) {
    if (ngram_min < 1) ngram_min = 1;
    for (int n = ngram_max; n >= ngram_min; n--) {
        if (n >= n_tokens) continue;
        const int32_t *suffix = tokens + n_tokens - n;
        /* i + n < n_tokens: an occurrence before the suffix itself, with a token after it. */
        for (int i = 0; i + n < n_tokens; i++) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, (size_t)n * sizeof *tokens)) continue;
            int m = n_tokens - (i + n);
            if (m > k) m = k;
            memmove(out, tokens + i + n, (size_t)m * sizeof *tokens);
            return m;
        }
    }
    return 0;
}
