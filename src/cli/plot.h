/* plot.h — owns llmi's pictures: line charts written as SVG by hand (no library, so the
 * binary needs nothing new).  A figure is a title line, a subtitle, and one or more
 * panels side by side; each panel has its title, both axes labelled (units in the label
 * text), ticks at round values (or at the data's own x values on a log2 axis, for batch
 * sizes and lengths), light grid lines, and its series as lines with optional dots and
 * ± error bars; CDFs are drawn as steps.  Legends go under the plot areas, one for the
 * whole figure when every panel has the same series.  Text width is estimated (0.6 em
 * per character), so tick labels are thinned until they do not touch. */
#ifndef LLMI_PLOT_H
#define LLMI_PLOT_H

#include <stdbool.h>
#include "core/status.h"

typedef struct plot_series {
    const char *label;
    const double *x, *y;           /* (n) */
    const double *y_err;           /* (n) half-height of an error bar, or NULL */
    int n;
    bool markers;                  /* a dot at each point */
    bool steps;                    /* y holds until the next x (empirical CDFs) */
} plot_series;

typedef struct plot_panel {
    const char *title;
    const char *x_label, *y_label;
    bool x_log2;                   /* x on a log2 scale, ticks at the data's x values */
    double y_min, y_max;           /* a fixed y range when y_max > y_min; else 0 .. the data's max */
    const plot_series *series;
    int n_series;
} plot_panel;

#define PLOT_MAX_PANELS 4

/* Writes the figure to path (replaced whole). */
int plot_svg_write(const char *path, const char *title, const char *subtitle, const plot_panel *panels,
                   int n_panels, llmi_status *st);

#endif
