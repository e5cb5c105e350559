/*
 * plot.c — plot.h's SVG line charts. The axis ranges cover every finite point (no clipping is
 * needed); ticks fall on round numbers: 1, 2 or 5 × 10^k apart on a linear axis, and on a log axis
 * at the decades, with 2 and 5 (or every integer multiple) between them when the range is short.
 * Text uses the reader's own sans-serif font: nothing is fetched.
 */
#include "plot.h"

#include <math.h>
#include <string.h>

#define ML 66 /* margins: left (tick labels, y title), right, top (title), bottom */
#define MR 16
#define MT 32
#define MB 46
#define MAXTICKS 64

void plot_escape(FILE *f, const char *text)
{
    for (const char *p = text; *p; p++)
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*p, f);
        }
}

void plot_area(const plot_opts *o, int *x, int *y, int *w, int *h)
{
    *x = ML, *y = MT, *w = o->width - ML - MR, *h = o->height - MT - MB;
}

static bool usable(double y, bool log_y)
{
    return isfinite(y) && (!log_y || y > 0);
}

bool plot_wants_log(const plot_series *s, int ns, double decades)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < ns; i++)
        for (size_t k = 0; k < s[i].n; k++) {
            if (!isfinite(s[i].y[k]))
                continue;
            if (s[i].y[k] <= 0)
                return false;
            lo = fmin(lo, s[i].y[k]);
            hi = fmax(hi, s[i].y[k]);
        }
    return hi > lo && log10(hi / lo) >= decades;
}

/* A round step for about `want` intervals over span: 1, 2 or 5 × 10^k. */
static double nice_step(double span, int want)
{
    double raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

/* Linear ticks over [*lo, *hi], which are widened to whole steps (*step). Returns their
 * number. */
static int linear_ticks(double *lo, double *hi, int want, double *t, double *step_out)
{
    if (*hi - *lo < 1e-12 * fmax(fabs(*lo), fabs(*hi)) || *hi == *lo) {
        double d = *lo != 0 ? fabs(*lo) * 0.1 : 1;
        *lo -= d;
        *hi += d;
    }
    double step = nice_step(*hi - *lo, want);
    *lo = floor(*lo / step + 1e-9) * step;
    *hi = ceil(*hi / step - 1e-9) * step;
    *step_out = step;
    int n = 0;
    for (double v = *lo; v <= *hi + step * 1e-6 && n < MAXTICKS; v += step)
        t[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    return n;
}

/* Log ticks within [lo, hi] (log10 units); *labelled[i]: whether tick i gets a label. */
static int log_ticks(double lo, double hi, double *t, bool *labelled)
{
    static const double m1[] = {1}, m3[] = {1, 2, 5}, m9[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    double span = hi - lo;
    const double *m = span > 3 ? m1 : span > 1.2 ? m3 : m9;
    int nm = span > 3 ? 1 : span > 1.2 ? 3 : 9, n = 0;
    for (int k = (int)floor(lo); k <= (int)ceil(hi) && n < MAXTICKS; k++)
        for (int j = 0; j < nm && n < MAXTICKS; j++) {
            double v = log10(m[j]) + k;
            if (v < lo - 1e-9 || v > hi + 1e-9)
                continue;
            labelled[n] = nm < 9 || m[j] == 1 || m[j] == 2 || m[j] == 5 || span < 0.5;
            t[n++] = v;
        }
    return n;
}

/* A tick label: 12k, 1.5M, 0.001, 3e-05; percentages as 41%. */
static void fmt_num(char *buf, size_t cap, double v, bool percent)
{
    if (percent) {
        snprintf(buf, cap, "%.4g%%", v * 100);
        return;
    }
    double a = fabs(v);
    if (a >= 1e9)
        snprintf(buf, cap, "%.4gG", v / 1e9);
    else if (a >= 1e6)
        snprintf(buf, cap, "%.4gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, cap, "%.4gk", v / 1e3);
    else
        snprintf(buf, cap, "%.4g", v);
}

typedef struct frame {
    double x0, x1, y0, y1; /* data ranges (y in log10 units on a log axis) */
    double px, py, pw, ph; /* the plot area, pixels */
    bool log_y;
    double ystep; /* linear y: the tick step, y0 and y1 being whole multiples of it */
} frame;

static double sx(const frame *fr, double x)
{
    return fr->px + (x - fr->x0) / (fr->x1 - fr->x0) * fr->pw;
}

static double sy(const frame *fr, double y)
{
    double v = fr->log_y ? log10(y) : y;
    return fr->py + fr->ph - (v - fr->y0) / (fr->y1 - fr->y0) * fr->ph;
}

static void axes(FILE *f, const frame *fr, const plot_opts *o)
{
    double t[MAXTICKS];
    bool lab[MAXTICKS];
    char buf[32];
    int n;
    fprintf(f, "<g font-size=\"11\" fill=\"#444\">\n");
    if (fr->log_y)
        n = log_ticks(fr->y0, fr->y1, t, lab);
    else {
        n = 0;
        for (double v = fr->y0; v <= fr->y1 + fr->ystep * 1e-6 && n < MAXTICKS; v += fr->ystep) {
            t[n] = fabs(v) < fr->ystep * 1e-9 ? 0 : v;
            lab[n++] = true;
        }
    }
    for (int i = 0; i < n; i++) {
        double v = fr->log_y ? pow(10, t[i]) : t[i], y = sy(fr, v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"1\"/>\n",
                fr->px, y, fr->px + fr->pw, y, lab[i] ? "#e3e3e3" : "#f1f1f1");
        if (!lab[i])
            continue;
        fmt_num(buf, sizeof buf, v, o->percent_y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", fr->px - 6, y + 4,
                buf);
    }
    double lo = fr->x0, hi = fr->x1, xstep;
    n = linear_ticks(&lo, &hi, 6, t, &xstep);
    for (int i = 0; i < n; i++) {
        if (t[i] < fr->x0 - 1e-9 || t[i] > fr->x1 + 1e-9)
            continue;
        double x = sx(fr, t[i]);
        fmt_num(buf, sizeof buf, t[i], false);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n"
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                x, fr->py, x, fr->py + fr->ph, x, fr->py + fr->ph + 16, buf);
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#999\"/>\n",
            fr->px, fr->py, fr->pw, fr->ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"12\">",
            fr->px + fr->pw / 2, fr->py + fr->ph + 36);
    plot_escape(f, o->xlabel ? o->xlabel : "");
    fprintf(f,
            "</text>\n<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\" "
            "font-size=\"12\">",
            fr->py + fr->ph / 2);
    plot_escape(f, o->ylabel ? o->ylabel : "");
    fprintf(f, "%s</text>\n</g>\n", fr->log_y ? " (log scale)" : "");
}

static void series(FILE *f, const frame *fr, const plot_series *s)
{
    fprintf(f,
            "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-linejoin=\"round\"%s d=\"",
            s->color, s->dashed ? " stroke-dasharray=\"6 4\"" : "");
    bool pen = false;
    for (size_t k = 0; k < s->n; k++) {
        if (!usable(s->y[k], fr->log_y)) {
            pen = false;
            continue;
        }
        fprintf(f, "%c%.1f %.1f ", pen ? 'L' : 'M', sx(fr, s->x[k]), sy(fr, s->y[k]));
        pen = true;
    }
    fputs("\"/>\n", f);
    if (!s->markers && s->n > 25)
        return;
    for (size_t k = 0; k < s->n; k++)
        if (usable(s->y[k], fr->log_y))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", sx(fr, s->x[k]),
                    sy(fr, s->y[k]), s->color);
}

static bool inside(plot_box b, double x, double y)
{
    return x >= b.x - 4 && x <= b.x + b.w + 4 && y >= b.y - 4 && y <= b.y + b.h + 4;
}

/* How much of the series box b would hide: points, and the lines between them sampled every
 * 3 pixels. */
static size_t hidden(const frame *fr, const plot_series *s, int ns, plot_box b)
{
    size_t n = 0;
    for (int i = 0; i < ns; i++) {
        bool have = false;
        double px = 0, py = 0;
        for (size_t k = 0; k < s[i].n; k++) {
            if (!usable(s[i].y[k], fr->log_y)) {
                have = false;
                continue;
            }
            double x = sx(fr, s[i].x[k]), y = sy(fr, s[i].y[k]);
            n += 4 * inside(b, x, y);
            if (have) {
                double len = hypot(x - px, y - py);
                for (double u = 3; u < len; u += 3)
                    n += inside(b, px + (x - px) * u / len, py + (y - py) * u / len);
            }
            have = true, px = x, py = y;
        }
    }
    return n;
}

/* The legend's box: top right, top left, bottom right or bottom left of the plot area, the first
 * that hides the least of the curves. */
static plot_box legend_box(const frame *fr, const plot_series *s, int ns)
{
    size_t longest = 0;
    for (int i = 0; i < ns; i++)
        longest = strlen(s[i].label) > longest ? strlen(s[i].label) : longest;
    double w = 40 + 6.6 * (double)longest, h = 8 + 17.0 * ns;
    double left = fr->px + 8, right = fr->px + fr->pw - w - 8, top = fr->py + 8,
           bottom = fr->py + fr->ph - h - 8;
    plot_box c[4] = {{right, top, w, h},
                     {left, top, w, h},
                     {right, bottom, w, h},
                     {left, bottom, w, h}},
             best = c[0];
    size_t fewest = (size_t)-1;
    for (int i = 0; i < 4; i++) {
        size_t n = hidden(fr, s, ns, c[i]);
        if (n < fewest)
            fewest = n, best = c[i];
    }
    return best;
}

static void legend(FILE *f, const plot_series *s, int ns, plot_box b)
{
    fprintf(f,
            "<g font-size=\"12\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
            "fill=\"#fff\" fill-opacity=\"0.88\" stroke=\"#ccc\" rx=\"3\"/>\n",
            b.x, b.y, b.w, b.h);
    for (int i = 0; i < ns; i++) {
        double ly = b.y + 14 + 17.0 * i;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"3\"%s/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">",
                b.x + 8, ly - 4, b.x + 30, ly - 4, s[i].color,
                s[i].dashed ? " stroke-dasharray=\"5 3\"" : "", b.x + 36, ly);
        plot_escape(f, s[i].label);
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
}

void plot_svg(FILE *f, const plot_opts *o, const plot_series *s, int ns, plot_box *legend_out)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    bool log_y = o->log_y && plot_wants_log(s, ns, 0);
    for (int i = 0; i < ns; i++)
        for (size_t k = 0; k < s[i].n; k++)
            if (usable(s[i].y[k], log_y)) {
                double y = log_y ? log10(s[i].y[k]) : s[i].y[k];
                x0 = fmin(x0, s[i].x[k]), x1 = fmax(x1, s[i].x[k]);
                y0 = fmin(y0, y), y1 = fmax(y1, y);
            }
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 "
            "%d %d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
            "fill=\"#fff\"/>\n<text x=\"%d\" y=\"20\" font-size=\"14\" font-weight=\"bold\" "
            "fill=\"#222\">",
            o->width, o->height, o->width, o->height, ML);
    plot_escape(f, o->title ? o->title : "");
    fputs("</text>\n", f);
    frame fr = {0, 1, 0, 1, ML, MT, o->width - ML - MR, o->height - MT - MB, log_y, 1};
    if (!(x0 <= x1)) {
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
                "stroke=\"#999\"/>\n<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" "
                "fill=\"#888\">no data</text>\n</svg>\n",
                ML, MT, fr.pw, fr.ph, ML + fr.pw / 2, MT + fr.ph / 2);
        return;
    }
    if (x1 == x0)
        x0 -= 1, x1 += 1;
    if (log_y) { /* a little room above and below the curves */
        double pad = fmax(0.04 * (y1 - y0), 0.02);
        y0 -= pad, y1 += pad;
    } else {
        if (o->zero_y)
            y0 = fmin(y0, 0), y1 = fmax(y1, 0);
        double t[MAXTICKS];
        linear_ticks(&y0, &y1, 5, t, &fr.ystep); /* widened to whole steps */
    }
    fr.x0 = x0, fr.x1 = x1, fr.y0 = y0, fr.y1 = y1;
    axes(f, &fr, o);
    for (int i = 0; i < ns; i++)
        series(f, &fr, &s[i]);
    plot_box lb = legend_box(&fr, s, ns);
    legend(f, s, ns, lb);
    if (legend_out)
        *legend_out = lb;
    fputs("</svg>\n", f);
}
