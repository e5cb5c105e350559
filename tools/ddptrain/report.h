/*
 * report.h — what report.c reads from metrics.jsonl, and report_page.c draws. Private to
 * --task report.
 */
#ifndef DDPTRAIN_REPORT_H
#define DDPTRAIN_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct pts {
    double *x, *y;
    size_t n, cap;
} pts;

/* the charts' series; S_RSS, S_GPU: the largest rank's peak RSS and GPU memory in use, MiB */
enum { S_LOSS, S_LR, S_RATE, S_MFU, S_GNORM, S_VLOSS, S_VACC, S_WALL, S_RSS, S_GPU, S_N };
#define MAXR 8 /* ranks drawn one by one; more: the slowest, median and fastest */

typedef struct run_data {
    pts s[S_N];
    pts rank[MAXR];    /* rank r's work per step (ms), or slowest/median/fastest */
    int W;             /* the most ranks of any interval (a resume may change the world) */
    int Wmin;          /* the fewest (0: no interval had per-rank times) */
    int slowest[MAXR]; /* intervals in which rank r was the slowest */
    bool lm;
    char model[32];
    double peak;
    pts warn_rank, warn_ratio, warn_for; /* straggler warnings, x = step */
    size_t bad;                          /* lines that were not JSON objects */
    size_t progress;                     /* progress lines (with a loss, a number or null) */
    double nan_from;          /* the first step whose training loss was null (NaN or inf), or -1 */
    double last_step;         /* the last progress line's step */
    bool last_nan, vlast_nan; /* the last training / evaluation loss was null */
} run_data;

/* "2 ranks", "1 rank", or "1–2 ranks" when the world changed between intervals. */
void report_ranks(const run_data *d, char *buf, size_t size);

/* Writes the whole HTML page for the run in dir to f. */
void report_page(FILE *f, const char *dir, const run_data *d);

#endif /* DDPTRAIN_REPORT_H */
