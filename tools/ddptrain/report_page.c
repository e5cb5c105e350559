/*
 * report_page.c — the report's HTML: a summary, then the charts (plot.c) at fixed places, two
 * per row, and every rank's work per step across the whole width at the bottom, then the
 * straggler warnings and how to read the figures. Fixed places because the page is read by
 * people and checked by a screenshot test alike: each figure carries its box on the page
 * (data-box), its plot area and its legend's box inside it (data-plot, data-legend: x y w h
 * from the figure's top left) and its curves' colours (data-colors).
 * Inline CSS and SVG only: the file can be mailed, archived or opened offline.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"
#include "report.h"

#define PAGE_W 1220
#define HDR 118 /* the summary's height */
#define CW 592  /* a chart: width, height, gap */
#define CH 320
#define GAP 12
#define WIDE_H 380 /* the per-rank chart */

static const char *const rank_colors[MAXR] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                              "#9467bd", "#8c564b", "#e377c2", "#17becf"};

/* A series over a pts. */
static plot_series ser(const char *label, const char *color, const pts *p)
{
    return (plot_series){label, color, p->x, p->y, p->n, false, false};
}

/* The last value of p, or NAN. */
static double last(const pts *p)
{
    return p->n ? p->y[p->n - 1] : NAN;
}

/* One figure at (x, y) on the page: the chart is drawn first (into memory), because the
 * figure's attributes say where its legend went. */
static void figure(FILE *f, int x, int y, const plot_opts *o, const plot_series *s, int ns)
{
    char *svg = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&svg, &len);
    plot_box lb = {0, 0, 0, 0};
    if (m) {
        plot_svg(m, o, s, ns, &lb);
        if (fclose(m) != 0) {
            free(svg);
            svg = NULL;
        }
    }
    int px, py, pw, ph;
    plot_area(o, &px, &py, &pw, &ph);
    fprintf(f,
            "<figure style=\"left:%dpx;top:%dpx;width:%dpx;height:%dpx\" data-box=\"%d %d %d "
            "%d\" data-plot=\"%d %d %d %d\" data-legend=\"%.0f %.0f %.0f %.0f\" "
            "data-colors=\"",
            x, y, o->width, o->height, x, y, o->width, o->height, px, py, pw, ph, lb.x, lb.y, lb.w,
            lb.h);
    for (int i = 0; i < ns; i++)
        fprintf(f, "%s%s", i ? " " : "", s[i].color);
    fprintf(f, "\">\n%s</figure>\n", svg ? svg : "(out of memory for this chart)");
    free(svg);
}

static void summary(FILE *f, const char *dir, const run_data *d)
{
    fputs("<div class=\"hdr\"><h1>ddptrain report: ", f);
    plot_escape(f, dir);
    fprintf(f, "</h1>\n<p>model <b>");
    plot_escape(f, d->model[0] ? d->model : "?");
    char fin[40] = "NaN";
    if (!d->last_nan)
        snprintf(fin, sizeof fin, "%.4g", last(&d->s[S_LOSS]));
    char ranks[32];
    report_ranks(d, ranks, sizeof ranks);
    fprintf(f, "</b> · %s · %.0f steps · final train loss <b>%s</b>", ranks, d->last_step, fin);
    if (d->nan_from >= 0)
        fprintf(f, " · <span class=\"warn\">loss NaN/inf from step %.0f (diverged)</span>",
                d->nan_from);
    if (d->s[S_VLOSS].n || d->vlast_nan) {
        if (d->vlast_nan)
            snprintf(fin, sizeof fin, "NaN");
        else
            snprintf(fin, sizeof fin, "%.4g", last(&d->s[S_VLOSS]));
        fprintf(f, " · %s loss <b>%s</b>", d->lm ? "validation" : "test", fin);
    }
    if (d->s[S_VACC].n)
        fprintf(f, " · accuracy <b>%.2f%%</b>", 100 * last(&d->s[S_VACC]));
    fprintf(f, "</p>\n<p>%.0f %s/s · MFU <b>%.2g%%</b> of a measured %.1f GFLOP/s per rank · ",
            last(&d->s[S_RATE]), d->lm ? "tokens" : "samples", 100 * last(&d->s[S_MFU]),
            d->peak / 1e9);
    if (d->warn_rank.n)
        fprintf(f, "<span class=\"warn\">%zu straggler warning%s (below)</span>", d->warn_rank.n,
                d->warn_rank.n == 1 ? "" : "s");
    else
        fputs("no straggler warning", f);
    fputs("</p></div>\n", f);
}

void report_ranks(const run_data *d, char *buf, size_t size)
{
    if (d->Wmin && d->Wmin != d->W)
        snprintf(buf, size, "%d–%d ranks", d->Wmin, d->W);
    else
        snprintf(buf, size, "%d rank%s", d->W, d->W == 1 ? "" : "s");
}

/* The per-rank chart's series: each rank's work per step, or the slowest/median/fastest of
 * many; and the step time every rank sees (dashed). */
static int rank_series(const run_data *d, plot_series *s, char (*labels)[64])
{
    int n = 0;
    if (d->W > MAXR) {
        static const char *const names[3] = {"slowest rank", "median rank", "fastest rank"};
        for (int i = 0; i < 3; i++)
            s[n++] = ser(names[i], rank_colors[i == 0 ? 3 : i == 1 ? 0 : 2], &d->rank[i]);
    } else {
        int total = 0;
        for (int r = 0; r < d->W; r++)
            total += d->slowest[r];
        for (int r = 0; r < d->W; r++) {
            snprintf(labels[r], 64, "rank %d: slowest in %.0f%% of intervals", r,
                     total ? 100.0 * d->slowest[r] / total : 0);
            s[n++] = ser(labels[r], rank_colors[r], &d->rank[r]);
        }
    }
    s[n] = ser("step time (every rank waits for the slowest)", "#555555", &d->s[S_WALL]);
    s[n++].dashed = true;
    return n;
}

static void warnings(FILE *f, const run_data *d)
{
    fputs("<h2>Straggler warnings</h2>\n", f);
    if (!d->warn_rank.n) {
        fputs("<p>None: no rank was persistently slower than the others.</p>\n", f);
        return;
    }
    fputs("<table><tr><th>step</th><th>rank</th><th>work per step against the others' "
          "median</th><th>slow for</th></tr>\n",
          f);
    for (size_t i = 0; i < d->warn_rank.n; i++)
        fprintf(f, "<tr><td>%.0f</td><td>%.0f</td><td>%.2f×</td><td>%.1f s</td></tr>\n",
                d->warn_rank.x[i], d->warn_rank.y[i], d->warn_ratio.y[i], d->warn_for.y[i]);
    fputs("</table>\n", f);
}

void report_page(FILE *f, const char *dir, const run_data *d)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>ddptrain "
          "report: ",
          f);
    plot_escape(f, dir);
    fprintf(f,
            "</title>\n<style>\nbody{margin:0;background:#eef0f3;color:#222;font:14px/1.4 "
            "sans-serif;position:relative;width:%dpx}\n.hdr{position:absolute;left:0;top:0;"
            "width:%dpx;height:%dpx;padding:0 %dpx;overflow:hidden}\nh1{font-size:20px;margin:"
            "14px 0 6px}\n.hdr p{margin:4px 0}\n.warn{color:#b00;font-weight:bold}\nfigure{"
            "position:absolute;margin:0;background:#fff;border-radius:4px;box-shadow:0 1px 3px "
            "rgba(0,0,0,.18);overflow:hidden}\nfigure svg{display:block}\n.notes{position:"
            "absolute;left:%dpx;width:%dpx}\ntable{border-collapse:collapse}\ntd,th{border:1px "
            "solid #ccc;padding:3px 10px;text-align:right}\n</style></head><body>\n",
            PAGE_W, PAGE_W - 2 * GAP, HDR, GAP, GAP, PAGE_W - 2 * GAP);
    summary(f, dir, d);
    const char *unit = d->lm ? "tokens/s" : "samples/s";
    char mfu_title[96];
    snprintf(mfu_title, sizeof mfu_title, "MFU (of %.1f GFLOP/s per rank, measured)",
             d->peak / 1e9);
    plot_series s[MAXR + 2];
    char labels[MAXR][64];
    int k = 0; /* the charts placed so far */
#define PLACE(opts, ...)                                                                           \
    do {                                                                                           \
        plot_series v_[] = {__VA_ARGS__};                                                          \
        figure(f, GAP + (k % 2) * (CW + GAP), HDR + (k / 2) * (CH + GAP), &(opts), v_,             \
               (int)(sizeof v_ / sizeof v_[0]));                                                   \
        k++;                                                                                       \
    } while (0)
    plot_series loss[2] = {ser("train (mean over the log interval)", "#1f77b4", &d->s[S_LOSS]),
                           ser(d->lm ? "validation" : "test", "#d62728", &d->s[S_VLOSS])};
    loss[1].markers = true;
    plot_opts o = {"Loss", "step", "cross-entropy", CW, CH, plot_wants_log(loss, 2, 0.7),
                   false,  false};
    PLACE(o, loss[0], loss[1]);
    if (d->s[S_VACC].n) {
        plot_opts oa = {"Test accuracy", "step", "accuracy", CW, CH, false, true, false};
        plot_series a = ser("test accuracy", "#2ca02c", &d->s[S_VACC]);
        a.markers = true;
        PLACE(oa, a);
    }
    plot_opts ol = {"Learning rate", "step", "lr", CW, CH, false, false, true};
    PLACE(ol, ser("learning rate", "#9467bd", &d->s[S_LR]));
    plot_opts ot = {"Throughput", "step", unit, CW, CH, false, false, true};
    PLACE(ot, ser(unit, "#ff7f0e", &d->s[S_RATE]));
    plot_opts om = {mfu_title, "step", "model FLOPs utilisation", CW, CH, false, true, true};
    PLACE(om, ser("MFU", "#17becf", &d->s[S_MFU]));
    plot_series gn = ser("gradient norm (before clipping)", "#8c564b", &d->s[S_GNORM]);
    plot_opts og = {"Gradient norm",           "step", "L2 norm", CW, CH,
                    plot_wants_log(&gn, 1, 1), false,  false};
    PLACE(og, gn);
    if (d->s[S_RSS].n || d->s[S_GPU].n) { /* runs from before 2026-11-25 have none */
        plot_opts ox = {
            "Memory (the most on any rank)", "step", "MiB", CW, CH, false, false, false};
        plot_series host = ser("peak RSS, the largest rank's", "#e377c2", &d->s[S_RSS]),
                    gpu = ser("in use on the fullest GPU", "#bcbd22", &d->s[S_GPU]);
        if (d->s[S_GPU].n && d->s[S_RSS].n)
            PLACE(ox, host, gpu);
        else if (d->s[S_GPU].n)
            PLACE(ox, gpu);
        else
            PLACE(ox, host);
    }
#undef PLACE
    int y = HDR + ((k + 1) / 2) * (CH + GAP);
    int nr = rank_series(d, s, labels);
    plot_opts orank = {"Work per step by rank (step time minus the wait in the gradient "
                       "allreduce)",
                       "step",
                       "ms per step",
                       PAGE_W - 2 * GAP,
                       WIDE_H,
                       false,
                       false,
                       true};
    figure(f, GAP, y, &orank, s, nr);
    y += WIDE_H + GAP;
    fprintf(f, "<div class=\"notes\" style=\"top:%dpx\">\n", y);
    warnings(f, d);
    fputs("<h2>How these are measured</h2>\n<p>Every figure comes from <code>metrics.jsonl"
          "</code>, written by rank 0 at each progress line (<code>log_every</code> steps): the "
          "loss is the mean over the interval and the ranks; throughput counts every rank's "
          "samples. <b>MFU</b> is the model's training FLOPs per sample (from its shapes) times "
          "samples/s, over the world size times a per-rank peak measured at start (50 ms of "
          "float32 matrix multiplies with the kernel the model uses). <b>Work per step</b> is "
          "each rank's own step time minus the time it waited in the gradient allreduce, "
          "gathered from every rank at each progress line: ranks meet in every allreduce, so "
          "all see the same step time (dashed), and the rank whose line stands above the others "
          "is the one they wait for.</p>\n</div>\n</body></html>\n",
          f);
}
