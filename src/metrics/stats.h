/* stats.h — owns the summary statistics bench and profile report: mean, sample standard
 * deviation, percentiles (numpy's default linear interpolation), seeded Poisson
 * arrival times, and a small seeded generator for synthetic prompts and lengths. */
#ifndef LLMI_STATS_H
#define LLMI_STATS_H

#include <stdint.h>

double stats_mean(const double *x, int n);                 /* 0 for n == 0 */
/* Sample standard deviation (n - 1 in the denominator, as llama-bench); 0 for n < 2. */
double stats_sd(const double *x, int n);
/* q in [0, 100]; x need not be sorted (a sorted copy is made); 0 for n == 0.
 * Linear interpolation between closest ranks: rank = q/100 * (n - 1). */
double stats_percentile(const double *x, int n, double q);
/* Same on already-sorted data, no allocation. */
double stats_percentile_sorted(const double *sorted, int n, double q);

/* splitmix64-seeded xorshift64*: reproducible streams for prompts, lengths, arrivals. */
typedef struct stats_rng { uint64_t s; } stats_rng;
void stats_rng_seed(stats_rng *r, uint64_t seed);
uint64_t stats_rng_next(stats_rng *r);
double stats_rng_uniform(stats_rng *r);                     /* [0, 1) */
int64_t stats_rng_range(stats_rng *r, int64_t lo, int64_t hi); /* uniform integer in [lo, hi] */

/* Arrival times (seconds from t = 0) of n requests from a Poisson process of rate per
 * second: exponential gaps with mean 1/rate.  rate <= 0 or infinite: all at t = 0. */
void stats_poisson_arrivals(stats_rng *r, double rate, int n, double *t);

#endif
