/*
 * metrics.c — what ddptrain reports while it trains, at each progress line (every log_every
 * steps): the loss over the interval and the ranks, lr, throughput, MFU, the gradient norm;
 * every rank's step time and reducer wait, and its memory (the process's peak RSS; on a GPU the
 * memory in use on it), gathered to rank 0 in the same collective as the loss (one allgather of
 * 7 doubles per rank replaces the allreduce of 2 the loss needed, so they cost nothing extra); the
 * straggler warning (straggler.c decides); metrics.jsonl and TensorBoard (out_dir/tb/, ddp/tb.h)
 * get the same numbers, TensorBoard as float32. Not every step: a collective per step would be one
 * more point where every rank waits for the slowest.
 *
 * MFU = FLOPs per sample (ddp_model_flops_per_sample, from the model's shapes) × samples/s ÷
 * (world size × the per-rank peak), the peak being a 50 ms float32 matmul probe on every rank at
 * start (ddp_model_measure_peak), not a datasheet: on CPUs the honest denominator is what this
 * core reaches with this BLAS, under the load it has. Not cached: 50 ms is less than one
 * progress line, and a cached figure would outlive the load it was measured under; an MFU above
 * 100% shows the probe ran on a busy core, and rank 0 measures once more. On a GPU
 * (device cuda) the peak is the datasheet's dense figure for the precision
 * (ddp_device_peak_flops; docs/gpu.md), and mfu_peak_tflops overrides either.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ddptrain.h"

const char *trainer_json_num(char *buf, size_t cap, double v, int digits)
{
    if (isfinite(v))
        snprintf(buf, cap, "%.*g", digits, v);
    else
        snprintf(buf, cap, "null");
    return buf;
}

/* The TensorBoard event files already in dir: counted, or (remove) deleted; -1 when one cannot
 * be deleted (after saying so). */
static int old_tb_files(trainer *t, const char *dir, bool remove)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0)
            continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (remove && unlink(path) != 0) {
            trainer_say(t, "warning: overwrite: cannot delete '%s': %s", path, strerror(errno));
            n = -1;
            break;
        }
        n++;
    }
    closedir(d);
    return n;
}

typedef struct cut_job {
    FILE *in;         /* metrics.jsonl, read from its start */
    const char *path; /* its name, for messages */
    uint64_t step;    /* the last step kept */
    size_t kept, dropped;
} cut_job;

/* ddp_file_fill_fn: job->in's lines up to job->step into f. A line is kept when it is a JSON
 * object whose step is ≤ job->step; one that does not end in '\n' was cut short (a kill, a full
 * disk: open_logs ends it otherwise) and goes, whatever it holds. The lines kept stay in their
 * order, those of an earlier run's dead tail (up to step) included: the start line after them
 * still purges them for the report, as before. */
static ddp_status cut_fill(void *ctx, FILE *f, const char *tmp_path, ddp_error *err)
{
    cut_job *job = ctx;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    ddp_status st = DDP_OK;
    while ((n = getline(&line, &cap, job->in)) > 0) {
        json_t *o = line[n - 1] == '\n' ? json_loadb(line, (size_t)n, 0, NULL) : NULL;
        json_t *s = json_object_get(o, "step"); /* NULL when o is not an object */
        bool keep = json_is_number(s) && json_number_value(s) <= (double)job->step;
        json_decref(o);
        if (!keep) {
            job->dropped++;
            continue;
        }
        if (fwrite(line, 1, (size_t)n, f) != (size_t)n) {
            st = ddp_error_set(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s", tmp_path,
                               strerror(errno));
            break;
        }
        job->kept++;
    }
    if (st == DDP_OK && !feof(job->in)) /* a read error, or getline out of memory */
        st = ddp_error_set(err, DDP_ERR_SYSTEM, "reading '%s' failed: %s", job->path,
                           strerror(errno));
    free(line);
    return st;
}

int trainer_metrics_cut(trainer *t, uint64_t step)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->dir);
    cut_job job = {.path = path, .step = step};
    if (!(job.in = fopen(path, "r"))) {
        if (errno == ENOENT)
            return 0; /* nothing logged yet */
        fprintf(stderr,
                "ddptrain: overwrite: cannot read '%s' to keep its lines up to step %llu: %s; "
                "move it away, or leave out --overwrite\n",
                path, (unsigned long long)step, strerror(errno));
        return 2;
    }
    ddp_error err = {0};
    ddp_status st = ddp_file_write_atomic(path, cut_fill, &job, &err);
    fclose(job.in); /* read only: nothing to lose */
    if (st != DDP_OK) {
        fprintf(stderr,
                "ddptrain: overwrite: cutting '%s' after step %llu failed: %s; it is as it was "
                "(free space in '%s', or move the file away)\n",
                path, (unsigned long long)step, err.msg, t->dir);
        return 2;
    }
    trainer_say(t,
                "overwrite: kept %zu line%s of '%s' up to step %llu, dropped %zu (later steps, "
                "or cut short)",
                job.kept, job.kept == 1 ? "" : "s", path, (unsigned long long)step, job.dropped);
    return 0;
}

int trainer_metrics_open(trainer *t)
{
    ddp_error err = {0};
    double peak = 0, sum = 0;
    /* A peak given (mfu_peak_tflops) or known (a GPU in ddp_device_peak_flops's table: choose_
     * in main.c) is used as it is; a GPU not in the table has none; a CPU is measured. */
    const char *source = t->prec == DDP_PRECISION_BF16 ? "bf16 matmul (oneDNN), measured now"
                                                       : "float32 matmul, measured now";
    bool given = ddp_config_float(t->cfg, "mfu_peak_tflops") > 0;
    if (t->peak_flops > 0 || t->dev.device == DDP_DEVICE_CUDA) {
        t->peak = t->peak_flops;
        source = given         ? "mfu_peak_tflops"
                 : t->peak > 0 ? "the GPU's dense datasheet peak, docs/gpu.md"
                               : "unknown GPU: MFU shows 0; give mfu_peak_tflops";
    } else {
        if (ddp_model_measure_peak(0.05, t->prec, &peak, &err) != DDP_OK)
            return trainer_die(t, "measuring the matmul peak", err.msg);
        if (ddp_allreduce(t->g, &peak, &sum, 1, DDP_FLOAT64, DDP_SUM) != DDP_OK)
            return trainer_die(t, "allreduce", ddp_group_last_error(t->g));
        t->peak = sum / t->W;
        t->peak_measured = true;
    }
    t->flops_per_sample = ddp_model_flops_per_sample(t->m, t->lm ? t->T : 0);
    straggler_opts so = STRAGGLER_OPTS_INIT;
    so.ratio = ddp_config_float(t->cfg, "straggler.ratio");
    so.after_s = ddp_config_float(t->cfg, "straggler.after");
    so.every_s = ddp_config_float(t->cfg, "straggler.every");
    straggler_init(&t->strag, &so);
    if (t->R != 0)
        return 0;
    trainer_say(t, "MFU: %.3g MFLOP per %s (training), peak %.1f GFLOP/s per rank (%s)",
                t->flops_per_sample / (t->lm ? t->T : 1) / 1e6, t->lm ? "token" : "sample",
                t->peak / 1e9, source);
    if (t->jsonl)
        fprintf(t->jsonl,
                "{\"step\": %llu, \"start\": true, \"world_size\": %d, \"peak_flops_per_rank\": "
                "%.6g, \"flops_per_sample\": %.6g, \"model\": \"%s\"}\n",
                (unsigned long long)t->step, t->W, t->peak, t->flops_per_sample,
                ddp_config_str(t->cfg, "model.type"));
    if (!ddp_config_bool(t->cfg, "tensorboard"))
        return 0;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/tb", t->dir);
    ddp_tb_opts to = DDP_TB_OPTS_INIT;
    /* Resumed from a checkpoint at step s: this run logs s+1 on; TensorBoard drops what the
     * earlier files hold from there (the dead run's tail, or with --overwrite the steps past an
     * older checkpoint of out_dir's: overwrite_keep, metrics.jsonl cut likewise), and keeps
     * their steps up to s. */
    to.purge_step = t->step > 0 ? (int64_t)t->step + 1 : -1;
    /* --overwrite (not from out_dir's own checkpoint): the other run's events go with its
     * checkpoints and metrics.jsonl (TensorBoard would draw its curves beside this run's). A
     * start at step 0 beside earlier files (a run that died before its first checkpoint,
     * restarted): they are purged from step 0 on, as the report drops what came before this
     * run's start line. */
    int old = old_tb_files(t, dir, t->overwrote);
    if (t->overwrote && old > 0)
        trainer_say(t, "overwrite: deleted %d TensorBoard event file%s from '%s'", old,
                    old == 1 ? "" : "s", dir);
    else if (t->step == 0 && old > 0)
        to.purge_step = 0;
    if (ddp_tb_open(dir, &to, &t->tb, &err) != DDP_OK) /* a warning: the run goes on */
        trainer_say(t, "warning: no TensorBoard events: %s", err.msg);
    return 0;
}

void trainer_metrics_close(trainer *t)
{
    trainer_tb_flush(t);
    ddp_tb_close(t->tb);
    t->tb = NULL;
}

static void tb_warn(trainer *t)
{
    if (!t->tb_failed)
        trainer_say(t,
                    "warning: %s (the run goes on; metrics.jsonl has every figure; further "
                    "TensorBoard errors are not shown)",
                    ddp_tb_last_error(t->tb));
    t->tb_failed = true;
}

void trainer_tb(trainer *t, const char *tag, double value)
{
    if (t->tb && ddp_tb_scalar(t->tb, tag, (int64_t)t->step, value, 0) != DDP_OK)
        tb_warn(t);
}

void trainer_tb_flush(trainer *t)
{
    if (t->tb && ddp_tb_flush(t->tb) != DDP_OK)
        tb_warn(t);
}

/* Rank 0: the straggler rule on the interval's busy times (step time − reducer wait). */
static void check_straggler(trainer *t, const progress *p, const double *busy_ms, double now)
{
    straggler_report sr;
    if (!straggler_update(&t->strag, busy_ms, t->W, p->last_step, p->last_t, now, &sr))
        return;
    trainer_say(t,
                "warning: rank %d is a straggler: %.1f ms of work per step against %.1f ms "
                "(the median of the other ranks), %.1fx, for %.1f s (since step %llu); the "
                "others wait for it in every gradient allreduce",
                sr.rank, sr.busy_ms, sr.median_ms, sr.busy_ms / sr.median_ms, sr.for_s,
                (unsigned long long)sr.since_step);
    if (t->jsonl)
        fprintf(t->jsonl,
                "{\"step\": %llu, \"straggler_rank\": %d, \"straggler_ms\": %.6g, "
                "\"median_ms\": %.6g, \"straggler_for_s\": %.6g, \"straggler_since_step\": "
                "%llu}\n",
                (unsigned long long)t->step, sr.rank, sr.busy_ms, sr.median_ms, sr.for_s,
                (unsigned long long)sr.since_step);
}

/* Rank 0: the interval's line in metrics.jsonl. */
/* Values each rank contributes to a progress line (trainer_log_progress): loss sum, steps
 * counted, step seconds, reducer wait seconds, a checkpoint signal, peak RSS MiB, GPU MiB. */
#define NV 7

/* This process's peak resident memory (getrusage: the high-water mark since it started), MiB. */
static double peak_rss_mib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : -1;
}

/* The memory in use on this rank's GPU (every process's: the driver's count), MiB; −1 on the
 * CPU, or when it cannot be asked (said once). */
static double gpu_mib(trainer *t)
{
    static bool said;
    if (t->dev.device != DDP_DEVICE_CUDA)
        return -1;
    size_t used = 0, total = 0;
    ddp_error err = {0};
    if (ddp_device_memory(t->dev.cuda_index, &used, &total, &err) != DDP_OK) {
        if (!said && t->R == 0)
            trainer_say(t, "note: the GPU's memory in use is not reported: %s", err.msg);
        said = true;
        return -1;
    }
    return (double)used / (1024.0 * 1024.0);
}

/* Memory figures as metrics.jsonl has them (to 0.1 MiB, or 1 KiB for the GPU's): TensorBoard's
 * are the same numbers. */
#define RSS_DIGITS 1
#define GPU_DIGITS 3
static double as_printed(double v, int digits)
{
    char b[64];
    snprintf(b, sizeof b, "%.*f", digits, v);
    return strtod(b, NULL);
}

/* "[a, b, …]" of value k of every rank, null for a rank whose is negative (unknown: its
 * device did not answer; −1.000 until 2026-11-25), or nothing when every rank's is. */
static void json_ranks(FILE *f, const char *key, const double *all, int W, int k, int digits)
{
    bool any = false;
    for (int r = 0; r < W; r++)
        any |= all[NV * r + k] >= 0;
    if (!any)
        return;
    fprintf(f, ", \"%s\": [", key);
    for (int r = 0; r < W; r++) {
        fputs(r ? ", " : "", f);
        if (all[NV * r + k] >= 0)
            fprintf(f, "%.*f", digits, all[NV * r + k]);
        else
            fputs("null", f);
    }
    fputc(']', f);
}

static void write_jsonl(trainer *t, double mean, double lr, double rate, double mfu,
                        double grad_norm, const double *all, double steps)
{
    FILE *f = t->jsonl;
    if (!f)
        return;
    char b[5][40];
    fprintf(f,
            "{\"step\": %llu, \"epoch\": %llu, \"loss\": %s, \"lr\": %s, \"%s_per_s\": %s, "
            "\"mfu\": %s",
            (unsigned long long)t->step, (unsigned long long)t->epoch,
            trainer_json_num(b[0], 40, mean, 17), trainer_json_num(b[1], 40, lr, 17),
            t->lm ? "tokens" : "samples", trainer_json_num(b[2], 40, rate, 17),
            trainer_json_num(b[3], 40, mfu, 17));
    if (grad_norm >= 0 || isnan(grad_norm))
        fprintf(f, ", \"grad_norm\": %s", trainer_json_num(b[4], 40, grad_norm, 17));
    if (t->amp)
        fprintf(f, ", \"loss_scale\": %.9g, \"skipped_steps\": %llu", (double)t->scaler.scale,
                (unsigned long long)t->skipped);
    const char *keys[2] = {"rank_step_ms", "rank_wait_ms"};
    for (int k = 0; k < 2; k++) {
        fprintf(f, ", \"%s\": [", keys[k]);
        for (int r = 0; r < t->W; r++)
            fprintf(f, "%s%.4f", r ? ", " : "", all[NV * r + 2 + k] / steps * 1e3);
        fputc(']', f);
    }
    json_ranks(f, "rank_peak_rss_mib", all, t->W, 5, RSS_DIGITS);
    json_ranks(f, "rank_gpu_mem_mib", all, t->W, 6, GPU_DIGITS);
    fputs("}\n", f);
}

/* Some rank (the first, r) got signal sig: a checkpoint at this step, on every rank alike. */
static void save_asked(trainer *t, int sig, int r, uint64_t total)
{
    if (t->save_now)
        return;
    t->save_now = true;
    char who[32] = "a rank";
    if (r >= 0)
        snprintf(who, sizeof who, "rank %d", r);
    trainer_say(t, "SIG%s on %s: a checkpoint at this step, as asked%s", sigabbrev_np(sig), who,
                t->step >= total ? " (the last)" : "; training goes on");
}

int trainer_poll_save(trainer *t, uint64_t total)
{
    int64_t mine = atomic_exchange(&trainer_save_signal, 0), any = 0;
    if (ddp_allreduce(t->g, &mine, &any, 1, DDP_INT64, DDP_MAX) != DDP_OK)
        return trainer_die(t, "allreduce", ddp_group_last_error(t->g));
    if (any > 0) /* the rank is not known here: the signal's number is */
        save_asked(t, (int)any, -1, total);
    return 0;
}

int trainer_log_progress(trainer *t, progress *p, uint64_t total, double lr, double grad_norm,
                         double *mean)
{
    /* Per rank: loss sum, steps counted, step seconds, reducer wait seconds, and whether it got
     * SIGUSR1/SIGUSR2 (a checkpoint asked for: every rank learns it here, at the same step). */
    int got = atomic_exchange(&trainer_save_signal, 0);
    double local[NV] = {p->win_sum,  (double)p->win_n, p->step_s, p->wait_s,
                        (double)got, peak_rss_mib(),   gpu_mib(t)};
    double *all = malloc(sizeof *all * NV * (size_t)t->W);
    double *busy = malloc(sizeof *busy * (size_t)t->W);
    if (!all || !busy) {
        free(all), free(busy);
        return trainer_die(t, "progress", "out of memory for the ranks' step times");
    }
    if (ddp_allgather(t->g, local, all, NV, DDP_FLOAT64) != DDP_OK) {
        free(all), free(busy);
        return trainer_die(t, "allgather", ddp_group_last_error(t->g));
    }
    double sum = 0, n = 0;
    p->rss_mib = p->gpu_mib = -1;
    p->rss_rank = p->gpu_rank = -1;
    for (int r = 0; r < t->W; r++) {
        sum += all[NV * r];
        n += all[NV * r + 1];
        if (all[NV * r + 5] > p->rss_mib) /* an unknown figure (−1) is never the largest */
            p->rss_mib = all[NV * r + 5], p->rss_rank = r;
        if (all[NV * r + 6] > p->gpu_mib)
            p->gpu_mib = all[NV * r + 6], p->gpu_rank = r;
        /* another rank's failed query (its own note is rank 0's alone): said once */
        if (t->R == 0 && r != 0 && t->dev.device == DDP_DEVICE_CUDA && all[NV * r + 6] < 0 &&
            !p->gpu_unknown_said) {
            p->gpu_unknown_said = true;
            trainer_say(t,
                        "note: rank %d's GPU memory in use is not reported (its device did not "
                        "answer the query): null in metrics.jsonl, left out of the largest",
                        r);
        }
        if (all[NV * r + 4] > 0)
            save_asked(t, (int)all[NV * r + 4], r, total);
    }
    *mean = sum / n;
    double now = ddp_now_seconds(), steps = (double)(t->step - p->last_step);
    int A = (int)ddp_config_int(t->cfg, "grad_accum");
    /* Samples (windows) per second of training: the interval's evaluations and checkpoints
     * (p->paused_s) are left out, or an interval holding one showed a fraction of the rate
     * (a GPT's tokens/s and MFU halved after each evaluation, until 2026-11-24). */
    double train_s = now - p->last_t - p->paused_s;
    if (!(train_s > 0))
        train_s = now - p->last_t;
    double sps = steps * t->B * A * t->W / train_s;
    double rate = t->lm ? sps * t->T : sps;
    double mfu = t->peak > 0 ? t->flops_per_sample * sps / (t->W * t->peak) : 0;
    double eta = (double)(total - t->step) * (now - p->t0) / (double)(t->step - p->first_step);
    if (t->R == 0 && mfu > 1.0 && t->peak_measured && !t->peak_rechecked) {
        /* More than the peak: the probe at start ran on a busy core (a short load while the
         * ranks started: 118 against 200-223 GFLOP/s once on the 2-core machine). Rank 0,
         * which alone reports MFU, measures again, once, and keeps the larger. */
        ddp_error err = {0};
        double again = 0, was = t->peak;
        t->peak_rechecked = true;
        if (ddp_model_measure_peak(0.05, t->prec, &again, &err) == DDP_OK && again > t->peak) {
            t->peak = again;
            mfu = t->flops_per_sample * sps / (t->W * t->peak);
        }
        trainer_say(t,
                    "MFU above 100%% against the matmul peak measured at start (%.1f GFLOP/s per "
                    "rank, on a busy core?): measured again on rank 0, %.1f GFLOP/s%s",
                    was / 1e9, again / 1e9, again > was ? ", used from here on" : "");
    }
    if (t->R == 0) {
        write_jsonl(t, *mean, lr, rate, mfu, grad_norm, all, steps);
        char gpu[48] = ""; /* the fullest GPU's memory in use, on a GPU */
        if (p->gpu_mib >= 0)
            snprintf(gpu, sizeof gpu, " | gpu mem %.2f GiB", p->gpu_mib / 1024);
        trainer_say(t,
                    "step %llu/%llu | epoch %llu | loss %.4f | lr %.4g | %.0f %s/s | mfu %.*f%% | "
                    "ETA %.1fs%s",
                    (unsigned long long)t->step, (unsigned long long)total,
                    (unsigned long long)t->epoch, *mean, lr, rate, t->lm ? "tokens" : "samples",
                    mfu < 0.1 ? 1 : 0, mfu * 100, eta, gpu);
        trainer_tb(t, "train/loss", *mean);
        trainer_tb(t, "train/lr", lr);
        trainer_tb(t, t->lm ? "train/tokens_per_s" : "train/samples_per_s", rate);
        trainer_tb(t, "train/mfu", mfu);
        if (p->rss_mib >= 0) /* the largest rank's; none when no rank's is known */
            trainer_tb(t, "memory/peak_rss_mib", as_printed(p->rss_mib, RSS_DIGITS));
        if (p->gpu_mib >= 0)
            trainer_tb(t, "memory/gpu_mem_mib", as_printed(p->gpu_mib, GPU_DIGITS));
        if (grad_norm >= 0 || isnan(grad_norm)) /* NaN: a diverged run, kept as TensorBoard does */
            trainer_tb(t, "train/grad_norm", grad_norm);
        if (t->amp) { /* fp16's GradScaler, as in metrics.jsonl (absent before 2026-11-24) */
            trainer_tb(t, "train/loss_scale", (double)t->scaler.scale);
            trainer_tb(t, "train/skipped_steps", (double)t->skipped);
        }
        for (int r = 0; r < t->W; r++) /* work per step: what the rank did not spend waiting */
            busy[r] = (all[NV * r + 2] - all[NV * r + 3]) / steps * 1e3;
        check_straggler(t, p, busy, now);
    }
    free(all), free(busy);
    p->last_t = now;
    p->last_step = t->step;
    p->win_sum = p->step_s = p->wait_s = p->paused_s = 0;
    p->win_n = 0;
    return 0;
}
