/* slo.h — owns service-level objectives and goodput (vLLM bench's --goodput, DistServe's
 * "SLO attainment"): a request meets the SLOs when its TTFT, its TPOT and its end-to-end
 * latency are each within the limit set for it (an unset limit always holds; a request
 * of fewer than 2 tokens has no TPOT and meets that one).  Goodput is the requests per
 * second that met every SLO; a load sweep's best rate is the highest offered rate whose
 * attainment reaches a target (90% by default). */
#ifndef LLMI_SLO_H
#define LLMI_SLO_H

#include <stdbool.h>
#include "core/status.h"

#define SLO_TARGET 0.9   /* share of requests that must meet every SLO at a "passing" rate */

typedef struct slo_spec {
    double ttft_ms, tpot_ms, e2e_ms;   /* limits; 0 = not set */
} slo_spec;

/* "ttft=MS,tpot=MS[,e2e=MS]" (any non-empty subset, each once, values > 0). */
int slo_parse(const char *s, slo_spec *out, llmi_status *st);
bool slo_any(const slo_spec *s);

typedef struct slo_result {
    int n;                     /* requests counted */
    double ttft_met, tpot_met, e2e_met;   /* share of requests within each limit; NaN when unset */
    double all_met;            /* share within every limit */
    double goodput_rps;        /* requests within every limit / elapsed_s */
} slo_result;

/* ttft_ms, e2e_ms (n) per request; tpot_ms (n) per request, NaN for one with < 2 tokens. */
void slo_account(const slo_spec *s, const double *ttft_ms, const double *tpot_ms, const double *e2e_ms, int n,
                 double elapsed_s, slo_result *out);
/* The highest of rates (n) whose attainment all_met[i] >= target; NaN when none. */
double slo_max_rate(const double *rates, const double *all_met, int n, double target);

#endif
