/* stats.c — see stats.h. */
#include "metrics/stats.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

double stats_mean(const double *x, int n) {
    if (n <= 0) return 0;
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s / n;
}

double stats_sd(const double *x, int n) {
    if (n < 2) return 0;
    double m = stats_mean(x, n), s = 0;
    for (int i = 0; i < n; i++) s += (x[i] - m) * (x[i] - m);
    return sqrt(s / (n - 1));
}

double stats_percentile_sorted(const double *v, int n, double q) {
    if (n <= 0) return 0;
    if (q <= 0) return v[0];
    if (q >= 100) return v[n - 1];
    double rank = q / 100.0 * (n - 1);
    int lo = (int)floor(rank);
    if (lo >= n - 1) return v[n - 1];
    double frac = rank - lo;
    return v[lo] + (v[lo + 1] - v[lo]) * frac;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double stats_percentile(const double *x, int n, double q) {
    if (n <= 0) return 0;
    double *v = malloc((size_t)n * sizeof *v);
    if (!v) return NAN;
    memcpy(v, x, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double r = stats_percentile_sorted(v, n, q);
    free(v);
    return r;
}

void stats_rng_seed(stats_rng *r, uint64_t seed) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545F4914F6CDD1Dull;  /* xorshift must not start at 0 */
}

uint64_t stats_rng_next(stats_rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

double stats_rng_uniform(stats_rng *r) { return (double)(stats_rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

int64_t stats_rng_range(stats_rng *r, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(stats_rng_next(r) % span);
}

void stats_poisson_arrivals(stats_rng *r, double rate, int n, double *t) {
    double now = 0;
    for (int i = 0; i < n; i++) {
        if (rate > 0 && isfinite(rate)) now += -log1p(-stats_rng_uniform(r)) / rate;
        t[i] = now;
    }
}
