/*
 * plot.h — line charts as inline SVG, for ddptrain's report: axes with ticks at round numbers
 * and their labels, axis titles, a legend, linear or logarithmic y. Plain text out, no fonts or
 * scripts to fetch, so the page it goes into stays self-contained. Knows nothing of training.
 */
#ifndef DDPTRAIN_PLOT_H
#define DDPTRAIN_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct plot_series {
    const char *label;   /* in the legend (escaped on output) */
    const char *color;   /* an SVG colour, "#1f77b4" */
    const double *x, *y; /* (n,) points, x ascending; non-finite y (and y ≤ 0 on a log axis)
                          * break the line there */
    size_t n;
    bool dashed;  /* a dashed line */
    bool markers; /* a dot on every point (also drawn when n is small) */
} plot_series;

typedef struct plot_opts {
    const char *title, *xlabel, *ylabel;
    int width, height; /* pixels */
    bool log_y;        /* log10 y axis (falls back to linear when no y > 0) */
    bool percent_y;    /* tick labels as percentages of 1 */
    bool zero_y;       /* a linear y axis that includes 0 */
} plot_opts;

/* A rectangle in pixels from a chart's top left. */
typedef struct plot_box {
    double x, y, w, h;
} plot_box;

/* Writes one <svg> element of o->width × o->height to f: the title, the frame, grid lines and
 * tick labels, the series, the legend (in the corner of the plot area that hides the least of
 * the curves; *legend receives its box, when legend is not NULL). With no finite point at all, the
 * frame and "no data". */
void plot_svg(FILE *f, const plot_opts *o, const plot_series *s, int ns, plot_box *legend);

/* The plot area (inside the axes) of a chart drawn with o, in pixels from its top left. */
void plot_area(const plot_opts *o, int *x, int *y, int *w, int *h);

/* Whether a logarithmic axis suits these series: every finite y > 0 and the largest at least
 * `decades` decades above the smallest. */
bool plot_wants_log(const plot_series *s, int ns, double decades);

/* text with &, <, > and " escaped, to f. */
void plot_escape(FILE *f, const char *text);

#endif /* DDPTRAIN_PLOT_H */
