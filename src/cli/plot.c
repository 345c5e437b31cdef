/* plot.c — see plot.h.  Geometry in SVG user units (px); y grows downwards. */
#include "cli/plot.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FONT "DejaVu Sans, Arial, Helvetica, sans-serif"
#define EM 0.62                     /* estimated advance of one character, in font sizes */
#define FIG_MARGIN 16.0
#define PANEL_W 480.0
#define PLOT_H 270.0
#define PANEL_TOP 30.0              /* panel title above the plot area */
#define PANEL_BOTTOM 54.0           /* x tick labels and x label under it */
#define LEGEND_LINE 18.0
#define TICK_FONT 11.0
#define LABEL_FONT 12.0

static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
#define N_PALETTE (int)(sizeof palette / sizeof palette[0])
/* past ten series, the colours repeat with a dash */
static const char *dash_of(int i) { return i < N_PALETTE ? "" : " stroke-dasharray=\"6 3\""; }

static double text_w(const char *s, double size) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n * size * EM;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\t') fputc(*s, f);   /* XML 1.0 has no other controls */
        }
    }
}

static void text(FILE *f, double x, double y, double size, const char *anchor, const char *extra, const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" text-anchor=\"%s\"%s>", x, y, size, anchor, extra);
    xml_text(f, s);
    fputs("</text>\n", f);
}

/* A round step (1, 2, 2.5 or 5 times a power of ten) giving about `want` intervals. */
static double nice_step(double range, int want) {
    if (!(range > 0)) return 1;
    double raw = range / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10);
}

static int step_decimals(double step) {
    int d = 0;
    while (d < 6 && fabs(step * pow(10, d) - round(step * pow(10, d))) > 1e-6 * step * pow(10, d)) d++;
    return d;
}

static void fmt_tick(char *buf, size_t cap, double v, int dec) {
    if (fabs(v) < 1e-12) v = 0;
    snprintf(buf, cap, "%.*f", dec, v);
}

typedef struct axis {
    double lo, hi, step;           /* linear: ticks at multiples of step */
    bool log2;
    double ticks[64];              /* log2: the data's x values */
    int n_ticks;
} axis;

/* Linear axis from lo (0 when the data is not negative) to a round value above hi. */
static void axis_linear(axis *a, double lo, double hi, int want) {
    if (!(hi > lo)) hi = lo + 1;
    a->log2 = false;
    a->step = nice_step(hi - lo, want);
    a->lo = floor(lo / a->step) * a->step;
    a->hi = ceil(hi / a->step - 1e-9) * a->step;
    if (a->hi <= a->lo) a->hi = a->lo + a->step;
}

static double axis_pos(const axis *a, double v, double p0, double p1) {
    double t = a->log2 ? (log2(v) - a->lo) / (a->hi - a->lo) : (v - a->lo) / (a->hi - a->lo);
    return p0 + t * (p1 - p0);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The x axis of a panel: log2 over the data's distinct values, or linear. */
static void axis_x(const plot_panel *p, axis *a) {
    double lo = INFINITY, hi = -INFINITY;
    a->n_ticks = 0;
    for (int s = 0; s < p->n_series; s++)
        for (int i = 0; i < p->series[s].n; i++) {
            double v = p->series[s].x[i];
            if (!isfinite(v) || (p->x_log2 && v <= 0)) continue;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            if (p->x_log2) {
                bool seen = false;
                for (int k = 0; k < a->n_ticks; k++) seen |= a->ticks[k] == v;
                if (!seen && a->n_ticks < 64) a->ticks[a->n_ticks++] = v;
            }
        }
    if (!isfinite(lo)) { lo = 0; hi = 1; }
    if (p->x_log2) {
        qsort(a->ticks, (size_t)a->n_ticks, sizeof a->ticks[0], cmp_double);
        a->log2 = true;
        double pad = hi > lo ? 0.08 * (log2(hi) - log2(lo)) + 0.15 : 1;
        a->lo = log2(lo) - pad;
        a->hi = log2(hi) + pad;
    } else {
        axis_linear(a, lo >= 0 ? 0 : lo, hi, 6);
    }
}

static void axis_y(const plot_panel *p, axis *a) {
    if (p->y_max > p->y_min) {
        axis_linear(a, p->y_min, p->y_max, 4);
        return;
    }
    double hi = 0;
    for (int s = 0; s < p->n_series; s++)
        for (int i = 0; i < p->series[s].n; i++) {
            double v = p->series[s].y[i] + (p->series[s].y_err && isfinite(p->series[s].y_err[i]) ? p->series[s].y_err[i] : 0);
            if (isfinite(v) && v > hi) hi = v;
        }
    axis_linear(a, 0, hi > 0 ? hi * 1.04 : 1, 5);
}

static bool same_legends(const plot_panel *panels, int n) {
    for (int k = 1; k < n; k++) {
        if (panels[k].n_series != panels[0].n_series) return false;
        for (int s = 0; s < panels[0].n_series; s++)
            if (strcmp(panels[k].series[s].label, panels[0].series[s].label)) return false;
    }
    return true;
}

/* Rows a legend of these series takes in width w. */
static int legend_rows(const plot_series *s, int n, double w) {
    int rows = n > 0 ? 1 : 0;
    double x = 0;
    for (int i = 0; i < n; i++) {
        double ew = 30 + text_w(s[i].label, LABEL_FONT) + 18;
        if (x > 0 && x + ew > w) { rows++; x = 0; }
        x += ew;
    }
    return rows;
}

static void legend_draw(FILE *f, const plot_series *s, int n, double x0, double y0, double w) {
    double x = 0, y = y0;
    for (int i = 0; i < n; i++) {
        double ew = 30 + text_w(s[i].label, LABEL_FONT) + 18;
        if (x > 0 && x + ew > w) { x = 0; y += LEGEND_LINE; }
        const char *c = palette[i % N_PALETTE];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s/>\n",
                x0 + x, y - 4, x0 + x + 22, y - 4, c, dash_of(i));
        if (s[i].markers) fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x0 + x + 11, y - 4, c);
        text(f, x0 + x + 28, y, LABEL_FONT, "start", "", s[i].label);
        x += ew;
    }
}

static void panel_draw(FILE *f, const plot_panel *p, double px, double py) {
    axis ax, ay;
    axis_x(p, &ax);
    axis_y(p, &ay);
    char buf[64];
    const int ydec = step_decimals(ay.step);
    double ylab_w = 0;
    for (double v = ay.lo; v <= ay.hi + ay.step * 1e-6; v += ay.step) {
        fmt_tick(buf, sizeof buf, v, ydec);
        ylab_w = fmax(ylab_w, text_w(buf, TICK_FONT));
    }
    const double x0 = px + 26 + ylab_w + 8, x1 = px + PANEL_W - 14, y0 = py + PANEL_TOP, y1 = y0 + PLOT_H;
    text(f, x0, py + 18, 13, "start", " font-weight=\"bold\"", p->title);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0,
            x1 - x0, y1 - y0);
    /* y grid and ticks */
    for (double v = ay.lo; v <= ay.hi + ay.step * 1e-6; v += ay.step) {
        double y = axis_pos(&ay, v, y1, y0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", x0, y, x1, y);
        fmt_tick(buf, sizeof buf, v, ydec);
        text(f, x0 - 6, y + 4, TICK_FONT, "end", "", buf);
    }
    /* x grid and ticks, thinned until neighbouring labels keep a gap */
    if (ax.log2) {
        int stride = 1;
        for (;; stride++) {
            bool ok = true;
            for (int k = stride; k < ax.n_ticks && ok; k += stride) {
                char a[32], b[32];
                snprintf(a, sizeof a, "%g", ax.ticks[k - stride]);
                snprintf(b, sizeof b, "%g", ax.ticks[k]);
                double gap = axis_pos(&ax, ax.ticks[k], x0, x1) - axis_pos(&ax, ax.ticks[k - stride], x0, x1);
                ok = gap > (text_w(a, TICK_FONT) + text_w(b, TICK_FONT)) / 2 + 8;
            }
            if (ok || stride >= ax.n_ticks) break;
        }
        for (int k = 0; k < ax.n_ticks; k += stride) {
            double x = axis_pos(&ax, ax.ticks[k], x0, x1);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", x, y0, x, y1);
            snprintf(buf, sizeof buf, "%g", ax.ticks[k]);
            text(f, x, y1 + 16, TICK_FONT, "middle", "", buf);
        }
    } else {
        for (;;) {
            int dec = step_decimals(ax.step);
            char a[64];
            fmt_tick(a, sizeof a, ax.hi, dec);
            double per = (x1 - x0) * ax.step / (ax.hi - ax.lo);
            if (per > text_w(a, TICK_FONT) + 10 || ax.step >= ax.hi - ax.lo) break;
            int want = (int)((ax.hi - ax.lo) / ax.step) / 2;
            axis_linear(&ax, ax.lo, ax.hi, want > 1 ? want : 1);
        }
        const int dec = step_decimals(ax.step);
        for (double v = ax.lo; v <= ax.hi + ax.step * 1e-6; v += ax.step) {
            double x = axis_pos(&ax, v, x0, x1);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", x, y0, x, y1);
            fmt_tick(buf, sizeof buf, v, dec);
            text(f, x, y1 + 16, TICK_FONT, "middle", "", buf);
        }
    }
    text(f, (x0 + x1) / 2, y1 + 38, LABEL_FONT, "middle", "", p->x_label);
    fprintf(f, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" font-size=\"%.0f\" text-anchor=\"middle\">",
            px + 14, (y0 + y1) / 2, LABEL_FONT);
    xml_text(f, p->y_label);
    fputs("</text>\n", f);
    /* series */
    for (int s = 0; s < p->n_series; s++) {
        const plot_series *ps = &p->series[s];
        const char *c = palette[s % N_PALETTE];
        bool pen = false;
        fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-linejoin=\"round\"%s d=\"", c, dash_of(s));
        double prev_y = ay.lo;
        for (int i = 0; i < ps->n; i++) {
            if (!isfinite(ps->x[i]) || !isfinite(ps->y[i]) || (ax.log2 && ps->x[i] <= 0)) continue;
            double x = axis_pos(&ax, ps->x[i], x0, x1), y = axis_pos(&ay, ps->y[i], y1, y0);
            if (ps->steps) {
                double yp = axis_pos(&ay, prev_y, y1, y0);
                fprintf(f, "%s%.1f %.1f L%.1f %.1f ", pen ? "L" : "M", x, yp, x, y);
                prev_y = ps->y[i];
            } else {
                fprintf(f, "%s%.1f %.1f ", pen ? "L" : "M", x, y);
            }
            pen = true;
        }
        fputs("\"/>\n", f);
        for (int i = 0; i < ps->n; i++) {
            if (!isfinite(ps->x[i]) || !isfinite(ps->y[i]) || (ax.log2 && ps->x[i] <= 0)) continue;
            double x = axis_pos(&ax, ps->x[i], x0, x1), y = axis_pos(&ay, ps->y[i], y1, y0);
            if (ps->y_err && isfinite(ps->y_err[i]) && ps->y_err[i] > 0) {
                /* clipped to the plot area: a bar below zero means "noise as large as the value" */
                double ya = fmin(y1, axis_pos(&ay, ps->y[i] - ps->y_err[i], y1, y0));
                double yb = fmax(y0, axis_pos(&ay, ps->y[i] + ps->y_err[i], y1, y0));
                fprintf(f,
                        "<path stroke=\"%s\" stroke-width=\"1.3\" fill=\"none\" d=\"M%.1f %.1f L%.1f %.1f M%.1f %.1f L%.1f "
                        "%.1f M%.1f %.1f L%.1f %.1f\"/>\n",
                        c, x, ya, x, yb, x - 4, ya, x + 4, ya, x - 4, yb, x + 4, yb);
            }
            if (ps->markers)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"white\" stroke-width=\"1\"/>\n",
                        x, y, c);
        }
    }
}

int plot_svg_write(const char *path, const char *title, const char *subtitle, const plot_panel *panels,
                   int n_panels, llmi_status *st) {
    if (n_panels < 1 || n_panels > PLOT_MAX_PANELS)
        return llmi_fail(st, LLMI_E_RUNTIME, "--plot: %d panels (1..%d)", n_panels, PLOT_MAX_PANELS);
    const bool shared = n_panels > 1 && same_legends(panels, n_panels);
    const double width = 2 * FIG_MARGIN + n_panels * PANEL_W;
    int sub_lines = 1;
    for (const char *c = subtitle; *c; c++) sub_lines += *c == '\n';
    const double top = 46 + 16.0 * sub_lines;
    int rows = 0;
    if (shared) rows = legend_rows(panels[0].series, panels[0].n_series, width - 2 * FIG_MARGIN - 60);
    else
        for (int k = 0; k < n_panels; k++) {
            int r = legend_rows(panels[k].series, panels[k].n_series, PANEL_W - 90);
            rows = r > rows ? r : rows;
        }
    const double panel_h = PANEL_TOP + PLOT_H + PANEL_BOTTOM;
    const double height = top + panel_h + rows * LEGEND_LINE + 14 + FIG_MARGIN;
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return llmi_fail(st, LLMI_E_USAGE, "--plot: path too long");
    FILE *f = fopen(tmp, "w");
    if (!f) return llmi_fail(st, LLMI_E_RUNTIME, "--plot %s: cannot write it", path);
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"%s\" fill=\"#222\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height, FONT);
    text(f, FIG_MARGIN, 28, 16, "start", " font-weight=\"bold\"", title);
    char line[1024];
    for (int k = 0; k < sub_lines && *subtitle; k++) {
        size_t n = strcspn(subtitle, "\n");
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), subtitle);
        text(f, FIG_MARGIN, 48 + 16.0 * k, 12, "start", " fill=\"#555\"", line);
        subtitle += n + (subtitle[n] == '\n');
    }
    for (int k = 0; k < n_panels; k++) panel_draw(f, &panels[k], FIG_MARGIN + k * PANEL_W, top);
    const double ly = top + panel_h + 14;
    if (shared) legend_draw(f, panels[0].series, panels[0].n_series, FIG_MARGIN + 60, ly, width - 2 * FIG_MARGIN - 60);
    else
        for (int k = 0; k < n_panels; k++)
            legend_draw(f, panels[k].series, panels[k].n_series, FIG_MARGIN + k * PANEL_W + 70, ly, PANEL_W - 90);
    fputs("</svg>\n", f);
    bool bad = ferror(f) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        remove(tmp);
        return llmi_fail(st, LLMI_E_RUNTIME, "--plot %s: write failed", path);
    }
    return 0;
}
