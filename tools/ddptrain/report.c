/*
 * report.c — `ddptrain --task report --out_dir runs/x`: metrics.jsonl into runs/x/report.html,
 * one self-contained page (inline CSS and SVG, no script, font or file to fetch) with the
 * training and validation loss, accuracy, learning rate, throughput, MFU, gradient norm and every
 * rank's work per step, so that a straggler shows as the one line above the others. It reads the
 * file alone: no group, model or data. A resumed run appends to the file; its "start" line
 * (step s) drops what the earlier run logged after step s, as TensorBoard's purge_step does.
 * This file reads the metrics; report_page.c lays out the page.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddptrain.h"
#include "report.h"

static bool push(pts *p, double x, double y)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 64;
        double *nx = realloc(p->x, cap * sizeof *nx);
        if (!nx)
            return false;
        p->x = nx;
        double *ny = realloc(p->y, cap * sizeof *ny);
        if (!ny)
            return false;
        p->y = ny;
        p->cap = cap;
    }
    p->x[p->n] = x;
    p->y[p->n++] = y;
    return true;
}

static void cut(pts *p, double step)
{
    while (p->n && p->x[p->n - 1] > step)
        p->n--;
}

static void purge(run_data *d, double step)
{
    for (int i = 0; i < S_N; i++)
        cut(&d->s[i], step);
    for (int r = 0; r < MAXR; r++)
        cut(&d->rank[r], step);
    cut(&d->warn_rank, step), cut(&d->warn_ratio, step), cut(&d->warn_for, step);
    if (d->nan_from > step)
        d->nan_from = -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One interval's per-rank times: work = step − wait (ms). */
static bool add_ranks(run_data *d, double step, json_t *st, json_t *wt)
{
    size_t W = json_array_size(st);
    if (W == 0 || W != json_array_size(wt))
        return true;
    double *busy = malloc(W * sizeof *busy), wall = 0;
    if (!busy)
        return false;
    size_t slow = 0;
    for (size_t r = 0; r < W; r++) {
        double s = json_number_value(json_array_get(st, r));
        busy[r] = s - json_number_value(json_array_get(wt, r));
        wall = fmax(wall, s);
        slow = busy[r] > busy[slow] ? r : slow;
    }
    bool ok = push(&d->s[S_WALL], step, wall);
    /* Every rank that trained is charted: a run resumed with fewer ranks (4 → 2, or elastic)
     * keeps the curves of the ranks it lost (before 2026-11-25 the last interval's world was
     * taken, and a 2-rank run resumed on 1 showed rank 0 alone, "slowest in 100%"). */
    d->W = (int)W > d->W ? (int)W : d->W;
    d->Wmin = d->Wmin == 0 || (int)W < d->Wmin ? (int)W : d->Wmin;
    if (W <= MAXR) {
        for (size_t r = 0; r < W; r++)
            ok = ok && push(&d->rank[r], step, busy[r]);
        d->slowest[slow]++;
    } else {
        double mx = busy[slow];
        qsort(busy, W, sizeof *busy, cmp_double);
        ok = ok && push(&d->rank[0], step, mx) && push(&d->rank[1], step, busy[W / 2]) &&
             push(&d->rank[2], step, busy[0]);
    }
    free(busy);
    return ok;
}

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static bool add_line(run_data *d, json_t *o)
{
    double step = num(o, "step");
    if (isnan(step))
        return true;
    if (json_is_true(json_object_get(o, "start"))) {
        purge(d, step);
        d->peak = num(o, "peak_flops_per_rank");
        const char *m = json_string_value(json_object_get(o, "model"));
        snprintf(d->model, sizeof d->model, "%s", m ? m : "");
        return true;
    }
    static const char *const keys[S_WALL] = {"loss",      "lr",        "samples_per_s", "mfu",
                                             "grad_norm", "test_loss", "test_accuracy"};
    /* A loss that is not a number (a diverged run) is written as null: no point, but the
     * page says from which step. */
    json_t *loss = json_object_get(o, "loss");
    if (json_is_null(loss) && (d->nan_from < 0 || step < d->nan_from))
        d->nan_from = step;
    if (json_is_number(loss) || json_is_null(loss)) {
        d->progress++;
        d->last_step = step;
        d->last_nan = json_is_null(loss);
    }
    json_t *vl = json_object_get(o, "val_loss") ? json_object_get(o, "val_loss")
                                                : json_object_get(o, "test_loss");
    if (json_is_number(vl) || json_is_null(vl))
        d->vlast_nan = json_is_null(vl);
    bool ok = true;
    for (int i = 0; i < S_WALL; i++) {
        double v = num(o, keys[i]);
        if (i == S_RATE && isnan(v) && !isnan(v = num(o, "tokens_per_s")))
            d->lm = true;
        if (i == S_VLOSS && isnan(v) && !isnan(v = num(o, "val_loss")))
            d->lm = true;
        if (!isnan(v))
            ok = ok && push(&d->s[i], step, v);
    }
    if (!isnan(num(o, "straggler_rank")))
        ok = ok && push(&d->warn_rank, step, num(o, "straggler_rank")) &&
             push(&d->warn_ratio, step, num(o, "straggler_ms") / num(o, "median_ms")) &&
             push(&d->warn_for, step, num(o, "straggler_for_s"));
    /* memory: the largest rank's (each rank's is in the line; null, or −1 in files from before
     * 2026-11-25, for a rank whose device did not answer: left out) */
    static const char *const mem_keys[2] = {"rank_peak_rss_mib", "rank_gpu_mem_mib"};
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(o, mem_keys[k]);
        double most = NAN;
        for (size_t i = 0; i < json_array_size(a); i++) {
            json_t *v = json_array_get(a, i);
            if (json_is_number(v) && json_number_value(v) >= 0 && !(json_number_value(v) <= most))
                most = json_number_value(v);
        }
        if (!isnan(most))
            ok = ok && push(&d->s[S_RSS + k], step, most);
    }
    json_t *st = json_object_get(o, "rank_step_ms"), *wt = json_object_get(o, "rank_wait_ms");
    if (json_is_array(st) && json_is_array(wt))
        ok = ok && add_ranks(d, step, st, wt);
    return ok;
}

static int read_metrics(trainer *t, const char *path, run_data *d)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr,
                "ddptrain: report: cannot read '%s': %s; train first, or give the run's "
                "--out_dir\n",
                path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o))
            d->bad++;
        else if (!add_line(d, o))
            rc = trainer_die(t, "report", "out of memory reading the metrics");
        json_decref(o);
        if (rc)
            break;
    }
    free(line);
    fclose(f);
    if (!rc && d->s[S_LOSS].n == 0 && d->progress > 0) {
        fprintf(stderr,
                "ddptrain: report: every training loss in '%s' is null (not a number: the run "
                "diverged at step %.0f or before); nothing to chart: lower lr, warm up "
                "(warmup_steps) or clip (grad_clip), and train again\n",
                path, d->nan_from);
        rc = 1;
    } else if (!rc && d->s[S_LOSS].n == 0) {
        fprintf(stderr,
                "ddptrain: report: '%s' holds no training progress line; train with "
                "log_every > 0 first\n",
                path);
        rc = 1;
    }
    return rc;
}

static void free_data(run_data *d)
{
    pts *all[S_N + MAXR + 3];
    int n = 0;
    for (int i = 0; i < S_N; i++)
        all[n++] = &d->s[i];
    for (int r = 0; r < MAXR; r++)
        all[n++] = &d->rank[r];
    all[n++] = &d->warn_rank, all[n++] = &d->warn_ratio, all[n++] = &d->warn_for;
    for (int i = 0; i < n; i++)
        free(all[i]->x), free(all[i]->y);
}

/* ddp_file_write_atomic's fill for report.html. */
typedef struct page_job {
    const char *dir, *out;
    const run_data *d;
} page_job;

static ddp_status fill_page(void *ctx, FILE *f, const char *tmp_path, ddp_error *err)
{
    (void)tmp_path;
    const page_job *j = ctx;
    report_page(f, j->dir, j->d);
    errno = 0;
    if (fflush(f) != 0 || ferror(f))
        return ddp_error_set(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s", j->out,
                             errno ? strerror(errno) : "a write failed");
    return DDP_OK;
}

int trainer_report(trainer *t)
{
    char path[1100], out[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->dir);
    snprintf(out, sizeof out, "%s/report.html", t->dir);
    run_data d;
    memset(&d, 0, sizeof d);
    d.nan_from = -1;
    int rc = read_metrics(t, path, &d);
    if (rc)
        goto out;
    /* Written beside, fsynced and renamed over, the folder fsynced (ddp_file_write_atomic): a
     * reader (a browser reloading) never sees half a page, nor does a crash undo a new one. */
    page_job j = {.dir = t->dir, .out = out, .d = &d};
    ddp_error err = {0};
    if (ddp_file_write_atomic(out, fill_page, &j, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: report: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    char ranks[32];
    report_ranks(&d, ranks, sizeof ranks);
    printf("wrote %s: %zu progress line%s, %zu evaluation%s, %s, %zu straggler warning%s%s\n", out,
           d.s[S_LOSS].n, d.s[S_LOSS].n == 1 ? "" : "s", d.s[S_VLOSS].n,
           d.s[S_VLOSS].n == 1 ? "" : "s", ranks, d.warn_rank.n, d.warn_rank.n == 1 ? "" : "s",
           d.bad ? " (lines that are not JSON skipped)" : "");
out:
    free_data(&d);
    return rc;
}
