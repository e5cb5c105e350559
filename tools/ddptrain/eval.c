/*
 * eval.c — ddptrain's evaluation (after training epochs and for --task test) and predictions
 * (--task predict) for the classifiers. Evaluation splits the test set — or, for a language
 * model, a fixed set of windows of the validation file — over the ranks with the sampler's exact
 * mode (no padding, no sample twice) and all-reduces the sums, so the figures are the same for
 * any world size (up to the order of a double sum); predictions are written by rank 0 alone, in
 * dataset order.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddptrain.h"

ddp_status trainer_share_views(trainer *t, bool params, ddp_error *err)
{
    ddp_group *g = t->resident ? t->gg : t->g;
    size_t np, nb;
    ddp_model_params(t->m, &np);
    ddp_model_buffers(t->m, &nb);
    for (size_t k = 0; k < (params ? np : 0) + nb; k++) {
        const ddp_param *v =
            k < (params ? np : 0) ? &t->rparams[k] : &t->rbuffers[k - (params ? np : 0)];
        ddp_status st = ddp_broadcast(g, v->data, v->count, v->dtype, 0);
        if (st)
            return ddp_error_set(err, st, "broadcasting '%s' from rank 0: %s", v->name,
                                 ddp_group_last_error(g));
    }
    return DDP_OK;
}

ddp_status trainer_evaluate(trainer *t, ddp_dataset *ds, double *loss, double *acc, ddp_error *err)
{
    ddp_status st;
    /* Batchnorm's running statistics drift apart between ranks: rank 0's are the model's. */
    if (!t->red && (st = trainer_share_views(t, false, err)))
        return st;
    if (t->red && (st = ddp_reducer_sync_buffers(t->red)))
        return ddp_error_set(err, st, "%s", ddp_reducer_last_error(t->red));
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(ds);
    so.num_replicas = t->W;
    so.rank = t->R;
    so.shuffle = false;
    so.mode = DDP_SAMPLER_EXACT;
    ddp_sampler *s;
    if ((st = ddp_sampler_create(&so, &s, err)))
        return st;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = (size_t)t->B;
    lo.drop_last = false;
    ddp_loader *l;
    if ((st = ddp_loader_create(ds, s, &lo, &l, err))) {
        ddp_sampler_destroy(s);
        return st;
    }
    trainer_note_loader(t, l, lo.threads);
    double sums[3] = {0, 0, 0}; /* loss sum, correct, count */
    ddp_batch b;
    for (;;) {
        if ((st = ddp_loader_next(l, &b))) {
            ddp_error_set(err, st, "%s", ddp_loader_last_error(l));
            break;
        }
        if (b.n == 0)
            break;
        ddp_model_batch mb = {.n = (int)b.n, .x = b.x, .labels = b.y};
        ddp_model_out out;
        if ((st = ddp_model_forward(t->m, &mb, false, &out))) {
            ddp_error_set(err, st, "%s", ddp_model_last_error(t->m));
            break;
        }
        sums[0] += out.loss * (double)out.count;
        sums[1] += (double)out.correct;
        sums[2] += (double)out.count;
    }
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    if (st)
        return st;
    double all[3];
    if ((st = ddp_allreduce(t->g, sums, all, 3, DDP_FLOAT64, DDP_SUM)))
        return ddp_error_set(err, st, "%s", ddp_group_last_error(t->g));
    *loss = all[0] / all[2];
    *acc = all[1] / all[2];
    return DDP_OK;
}

ddp_status trainer_evaluate_lm(trainer *t, ddp_dataset *val, double *loss, size_t *windows,
                               ddp_error *err)
{
    /* The windows: the file's non-overlapping windows of T tokens (the dataset's samples), or
     * eval_windows of them spread evenly, window j of K being floor(j·N / K): deterministic, and
     * drawn from the whole file rather than its first part. */
    uint64_t N = ddp_dataset_len(val), K = N,
             cap = (uint64_t)ddp_config_int(t->cfg, "eval_windows");
    if (cap > 0 && cap < N)
        K = cap;
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = K;
    so.num_replicas = t->W;
    so.rank = t->R;
    so.shuffle = false;
    so.mode = DDP_SAMPLER_EXACT;
    ddp_sampler *s;
    ddp_status st;
    if ((st = ddp_sampler_create(&so, &s, err)))
        return st;
    size_t n = ddp_sampler_len(s), B = (size_t)t->B, T = (size_t)t->T;
    const uint64_t *idx = ddp_sampler_indices(s);
    uint64_t *starts = malloc(sizeof *starts * B);
    int32_t *x = malloc(sizeof *x * B * T), *y = malloc(sizeof *y * B * T);
    double sums[2] = {0, 0}; /* loss sum over tokens, tokens */
    if (!starts || !x || !y) {
        st = ddp_error_set(err, DDP_ERR_NOMEM, "out of memory for %zu evaluation windows", B);
        goto out_free;
    }
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t nb = n - i0 < B ? n - i0 : B;
        for (size_t k = 0; k < nb; k++)
            starts[k] = (uint64_t)((unsigned __int128)idx[i0 + k] * N / K) * T;
        if ((st = ddp_dataset_get_windows(val, starts, nb, x, y, err)))
            goto out_free;
        ddp_model_batch mb = {
            .n = (int)nb, .tokens = x, .targets = y, .seq_len = (int)T, .loss_only = true};
        ddp_model_out out;
        if ((st = ddp_model_forward(t->m, &mb, false, &out))) {
            ddp_error_set(err, st, "%s", ddp_model_last_error(t->m));
            goto out_free;
        }
        sums[0] += out.loss * (double)out.count;
        sums[1] += (double)out.count;
    }
    double all[2];
    if ((st = ddp_allreduce(t->g, sums, all, 2, DDP_FLOAT64, DDP_SUM))) {
        ddp_error_set(err, st, "%s", ddp_group_last_error(t->g));
        goto out_free;
    }
    *loss = all[1] > 0 ? all[0] / all[1] : 0;
    *windows = (size_t)K;
out_free:
    free(starts);
    free(x);
    free(y);
    ddp_sampler_destroy(s);
    return st;
}

/* Rank 0 writes "index,label,prediction" for every test sample; the others wait. */
static int write_predictions(trainer *t, ddp_dataset *te, FILE *f)
{
    size_t in_n = ddp_dataset_x_elems(te), n = ddp_dataset_len(te), B = (size_t)t->B;
    float *x = malloc(sizeof(float) * in_n * B);
    int32_t *y = malloc(sizeof(int32_t) * B);
    int rc = 0;
    if (!x || !y) {
        rc = trainer_die(t, "predict", "out of memory");
        goto out_free;
    }
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t nb = n - i0 < B ? n - i0 : B;
        for (size_t k = 0; k < nb; k++)
            ddp_dataset_get(te, i0 + k, x + k * in_n, y + k);
        ddp_model_batch mb = {.n = (int)nb, .x = x};
        if (ddp_model_forward(t->m, &mb, false, NULL) != DDP_OK) {
            rc = trainer_die(t, "predict", ddp_model_last_error(t->m));
            goto out_free;
        }
        size_t C;
        const float *lg = ddp_model_logits(t->m, NULL, &C);
        for (size_t k = 0; k < nb; k++) {
            size_t best = 0;
            for (size_t j = 1; j < C; j++)
                if (lg[k * C + j] > lg[k * C + best])
                    best = j;
            fprintf(f, "%zu,%d,%zu\n", i0 + k, y[k], best);
        }
    }
out_free:
    free(x);
    free(y);
    return rc;
}

/* ddp_file_write_atomic's fill for predictions.csv: the header and a line per test sample. */
typedef struct predict_job {
    trainer *t;
    ddp_dataset *te;
    const char *path;
    int rc;        /* write_predictions' exit code (its error already said) */
    bool said_why; /* err holds the whole message, path's fate and the hint included */
} predict_job;

static ddp_status fill_predictions(void *ctx, FILE *f, const char *tmp_path, ddp_error *err)
{
    (void)tmp_path;
    predict_job *j = ctx;
    fprintf(f, "index,label,prediction\n");
    j->rc = write_predictions(j->t, j->te, f);
    if (j->rc)
        return ddp_error_set(err, DDP_ERR_INVALID, "predictions stopped (said above)");
    errno = 0;
    if (fflush(f) != 0 || ferror(f)) {
        j->said_why = true;
        return ddp_error_set(err, DDP_ERR_SYSTEM,
                             "writing '%s' failed: %s; '%s' is as it was (free space there, or "
                             "set predict_out to another path)",
                             j->path, errno ? strerror(errno) : "a write failed", j->path);
    }
    return DDP_OK;
}

int trainer_predict(trainer *t, ddp_dataset *te)
{
    if (t->R == 0) {
        char path[4200];
        const char *given = ddp_config_str(t->cfg, "predict_out");
        if (*given)
            snprintf(path, sizeof path, "%s", given);
        else
            snprintf(path, sizeof path, "%s/predictions.csv", ddp_config_str(t->cfg, "out_dir"));
        /* Written beside path, fsynced and renamed over it once complete, the folder fsynced
         * (ddp_file_write_atomic): a failure (a full disk, a forward error) leaves no partial
         * file and never a previous run's predictions lost, nor does a crash after it. */
        predict_job j = {.t = t, .te = te, .path = path};
        ddp_error err = {0};
        if (ddp_file_write_atomic(path, fill_predictions, &j, &err) != DDP_OK) {
            if (j.rc)
                return j.rc;
            if (j.said_why)
                return trainer_die(t, "predict", err.msg);
            char why[sizeof err.msg + 4400];
            snprintf(why, sizeof why, "%s; '%s' %s (or set predict_out to another path)", err.msg,
                     path,
                     strstr(err.msg, "renamed into place") ? "holds the new predictions"
                                                           : "is as it was");
            return trainer_die(t, "predict", why);
        }
        trainer_say(t, "wrote %zu predictions to %s", ddp_dataset_len(te), path);
    }
    return ddp_barrier(t->g) == DDP_OK ? 0 : trainer_die(t, "predict", ddp_group_last_error(t->g));
}
