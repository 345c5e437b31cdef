/* slo.c — see slo.h. */
#include "metrics/slo.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool slo_any(const slo_spec *s) { return s->ttft_ms > 0 || s->tpot_ms > 0 || s->e2e_ms > 0; }

int slo_parse(const char *s, slo_spec *out, llmi_status *st) {
    *out = (slo_spec){0};
    char buf[128];
    if (!s || !*s || strlen(s) >= sizeof buf)
        return llmi_fail(st, LLMI_E_USAGE, "--slo: expected ttft=MS,tpot=MS[,e2e=MS]");
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '=');
        double *dst = NULL;
        if (eq) {
            *eq = '\0';
            if (!strcmp(t, "ttft")) dst = &out->ttft_ms;
            else if (!strcmp(t, "tpot")) dst = &out->tpot_ms;
            else if (!strcmp(t, "e2e")) dst = &out->e2e_ms;
        }
        if (!dst) return llmi_fail(st, LLMI_E_USAGE, "--slo %s: '%s' is not ttft=MS, tpot=MS or e2e=MS", s, t);
        if (*dst > 0) return llmi_fail(st, LLMI_E_USAGE, "--slo %s: %s given twice", s, t);
        char *end;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end || !(v > 0) || !isfinite(v))
            return llmi_fail(st, LLMI_E_USAGE, "--slo %s: %s needs a positive number of milliseconds", s, t);
        *dst = v;
    }
    if (!slo_any(out)) return llmi_fail(st, LLMI_E_USAGE, "--slo: expected ttft=MS,tpot=MS[,e2e=MS]");
    return 0;
}

void slo_account(const slo_spec *s, const double *ttft_ms, const double *tpot_ms, const double *e2e_ms, int n,
                 double elapsed_s, slo_result *out) {
    int ttft = 0, tpot = 0, e2e = 0, all = 0;
    for (int i = 0; i < n; i++) {
        bool a = !(s->ttft_ms > 0) || ttft_ms[i] <= s->ttft_ms;
        bool b = !(s->tpot_ms > 0) || isnan(tpot_ms[i]) || tpot_ms[i] <= s->tpot_ms;
        bool c = !(s->e2e_ms > 0) || e2e_ms[i] <= s->e2e_ms;
        ttft += a;
        tpot += b;
        e2e += c;
        all += a && b && c;
    }
    out->n = n;
    out->ttft_met = s->ttft_ms > 0 && n > 0 ? (double)ttft / n : NAN;
    out->tpot_met = s->tpot_ms > 0 && n > 0 ? (double)tpot / n : NAN;
    out->e2e_met = s->e2e_ms > 0 && n > 0 ? (double)e2e / n : NAN;
    out->all_met = n > 0 ? (double)all / n : NAN;
    out->goodput_rps = elapsed_s > 0 ? all / elapsed_s : NAN;
}

double slo_max_rate(const double *rates, const double *all_met, int n, double target) {
    double best = NAN;
    for (int i = 0; i < n; i++)
        if (all_met[i] >= target && (isnan(best) || rates[i] > best)) best = rates[i];
    return best;
}
