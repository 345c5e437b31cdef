/* bench_util.c — see bench_util.h. */
#include "cli/bench_util.h"
#include "core/version.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *bench_weight_dtype(const llmi_model *m) {
    if (m->cfg.n_layers > 0 && m->layers) return dtype_name(m->layers[0].wq.dtype);
    return dtype_name(m->tok_embd.dtype);
}


void bench_meta(report *r, const llmi_model *m, const llmi_backend *b, const char *model_label, int n_threads) {
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tm);
    report_str(r, "commit", llmi_commit());
    report_str(r, "date", date);
    report_str(r, "backend", b ? b->name : "");
    report_str(r, "device", b ? b->device_name : "");
    report_str(r, "model", model_label);
    report_str(r, "model_format", m->format);
    /* Parameters in millions: weights of the shapes, counted once when tied; a MoE model's
     * every expert and router (active_params_m: those one token reads, k experts a layer). */
    const llmi_config *c = &m->cfg;
    double attn = (double)c->dim * c->n_heads * c->head_dim * 2 + (double)c->dim * c->n_kv_heads * c->head_dim * 2;
    double expert = 3.0 * c->dim * c->ffn_dim, router = (double)c->n_experts * c->dim;
    double outer = (double)c->n_vocab * c->dim * (c->tie_embeddings ? 1 : 2);
    double params = (attn + expert * config_experts(c) + router) * c->n_layers + outer;
    report_num(r, "params_m", params / 1e6, 1);
    if (c->n_experts > 0) report_num(r, "active_params_m", ((attn + expert * c->n_experts_used + router) * c->n_layers + outer) / 1e6, 1);
    report_num(r, "weights_gib", (double)m->weight_bytes / (1 << 30), 3);
    report_str(r, "weight_dtype", bench_weight_dtype(m));
    /* 0 means "the default" to the backend: report what it resolved to. */
    if (n_threads <= 0 && b && !strcmp(b->name, "cpu")) n_threads = b->opts.n_threads;
    report_int(r, "threads", n_threads);
}

size_t bench_peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}

bool bench_peak_reset(void) {
    /* "5" resets the peak RSS counter (Linux >= 4.0). */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    ok &= fclose(f) == 0;
    return ok;
}

void bench_progress_init(bench_progress *p, const char *label, int total) {
    p->on = isatty(STDERR_FILENO) && total > 0;
    p->total = total;
    p->shown = 0;
    snprintf(p->label, sizeof p->label, "%s", label);
    bench_progress_update(p, 0);
}

void bench_progress_update(bench_progress *p, int done) { bench_progress_note(p, done, NULL); }

void bench_progress_note(bench_progress *p, int done, const char *note) {
    if (!p->on) return;
    const int width = 30;
    int fill = p->total > 0 ? (int)((long)done * width / p->total) : 0;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    int n = fprintf(stderr, "\r%s [%s] %d/%d%s%s", p->label, bar, done, p->total, note ? "  " : "", note ? note : "");
    /* a shorter line than the last one leaves its tail: blank it */
    if (n > 0 && n < p->shown) fprintf(stderr, "%*s", p->shown - n, "");
    if (n > p->shown) p->shown = n;
    fflush(stderr);
}

void bench_progress_end(bench_progress *p) {
    if (!p->on) return;
    fprintf(stderr, "\r%*s\r", p->shown, "");
    fflush(stderr);
}
