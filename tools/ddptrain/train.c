/*
 * train.c — ddptrain's training loop, read top to bottom as one step:
 *   zero the gradients; for each of grad_accum micro-batches: next batch (augmented), forward
 *   with the loss, backward marking gradients ready for the reducer (no_sync but for the last);
 *   finish (gradients are now the mean over ranks); clip; the optimizer steps this rank's shard
 *   of every parameter; gather the parameters; log, evaluate, checkpoint.
 * The model, optimizer, schedule and checkpoint format are library code (ddp/model.h,
 * ddp/optim.h, ddp/ckpt.h); this file only decides when each runs.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ddptrain.h"

/* The index of value in names (n of them), the order of a config key's choices; 0 if absent (the
 * config has checked the value already). */
static int choice(const char *value, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(value, names[i]))
            return i;
    return 0;
}

static ddp_lr_schedule schedule_of(const trainer *t, uint64_t total)
{
    static const char *const decays[] = {"cosine", "linear", "constant"};
    static const char *const scalings[] = {"none", "linear", "sqrt"};
    ddp_lr_schedule s = DDP_LR_SCHEDULE_INIT;
    s.lr = ddp_config_float(t->cfg, "lr");
    s.scaling = (ddp_lr_scaling)choice(ddp_config_str(t->cfg, "lr_scaling"), scalings, 3);
    s.world_size = t->W;
    s.warmup_steps = (uint64_t)ddp_config_int(t->cfg, "warmup_steps");
    s.decay = (ddp_lr_decay)choice(ddp_config_str(t->cfg, "schedule"), decays, 3);
    s.total_steps = total;
    return s;
}

/* Backward's gradient-ready callback: the reducer may start a bucket's allreduce. */
typedef struct ready_ctx {
    ddp_reducer *red;
    bool failed; /* the reducer refused: its message is the one to show */
} ready_ctx;

static ddp_status mark_ready(void *ctx, size_t i)
{
    ready_ctx *rc = ctx;
    ddp_status st = ddp_reducer_mark_ready(rc->red, i);
    rc->failed = st != DDP_OK;
    return st;
}

/* The progress line: the mean loss since the last one (all-reduced: a resumed run prints what an
 * uninterrupted one does), lr, samples/s, ETA. Not every step: a collective per step would be one
 * more point where every rank waits for the slowest. */
typedef struct progress {
    double t0, last_t, win_sum;
    int win_n;
    uint64_t first_step, last_step;
} progress;

static int log_progress(trainer *t, progress *p, uint64_t total, double lr, double *mean)
{
    double local[2] = {p->win_sum, (double)p->win_n}, all[2];
    if (ddp_allreduce(t->g, local, all, 2, DDP_FLOAT64, DDP_SUM) != DDP_OK)
        return trainer_die(t, "allreduce", ddp_group_last_error(t->g));
    *mean = all[0] / all[1];
    double now = ddp_now_seconds();
    int A = (int)ddp_config_int(t->cfg, "grad_accum");
    double sps = (double)(t->step - p->last_step) * t->B * A * t->W / (now - p->last_t);
    double eta = (double)(total - t->step) * (now - p->t0) / (double)(t->step - p->first_step);
    if (t->R == 0 && t->jsonl)
        fprintf(t->jsonl,
                "{\"step\": %llu, \"epoch\": %llu, \"loss\": %.6f, \"lr\": %.6g, "
                "\"samples_per_s\": %.1f}\n",
                (unsigned long long)t->step, (unsigned long long)t->epoch, *mean, lr, sps);
    trainer_say(t, "step %llu/%llu | epoch %llu | loss %.4f | lr %.4g | %.0f samples/s | ETA %.1fs",
                (unsigned long long)t->step, (unsigned long long)total,
                (unsigned long long)t->epoch, *mean, lr, sps, eta);
    p->last_t = now;
    p->last_step = t->step;
    p->win_sum = 0;
    p->win_n = 0;
    return 0;
}

static int evaluate_and_log(trainer *t, ddp_dataset *te, uint64_t total)
{
    ddp_error err = {0};
    double el, ea;
    if (trainer_evaluate(t, te, &el, &ea, &err) != DDP_OK)
        return trainer_die(t, "evaluation", err.msg);
    trainer_say(t, "eval at step %llu: test loss %.4f, test accuracy %.4f (%zu images)",
                (unsigned long long)t->step, el, ea, ddp_dataset_len(te));
    if (t->R == 0 && t->jsonl)
        fprintf(t->jsonl, "{\"step\": %llu, \"test_loss\": %.6f, \"test_accuracy\": %.6f}\n",
                (unsigned long long)t->step, el, ea);
    if (t->step == total)
        trainer_say(t, "test accuracy %.4f", ea);
    return 0;
}

/* The optimizer step on the mean gradients: clipped, then each parameter's elements this rank
 * holds the mean of (all, or its shard with shard_optimizer), then the shards gathered. */
static int optimizer_step(trainer *t, double clip, double lr)
{
    float coef = 1.0f;
    if (clip > 0) {
        double norm;
        if (ddp_reducer_grad_norm(t->red, &norm) != DDP_OK)
            return trainer_die(t, "gradient norm", ddp_reducer_last_error(t->red));
        coef = ddp_nn_clip_coef(norm, clip);
    }
    size_t np;
    ddp_model_params(t->m, &np);
    for (size_t i = 0; i < np; i++) {
        size_t lo, hi;
        ddp_reducer_shard(t->red, i, &lo, &hi);
        if (ddp_optim_step_range(t->opt, i, lo, hi, t->step + 1, (float)lr, coef) != DDP_OK)
            return trainer_die(t, "optimizer", ddp_optim_last_error(t->opt));
    }
    if (ddp_reducer_gather_params(t->red) != DDP_OK)
        return trainer_die(t, "gathering parameters", ddp_reducer_last_error(t->red));
    return 0;
}

/* One micro-batch: the next batch (a new epoch when this one is used up), augmented, forward
 * and backward. Adds its share of the step's loss to *loss. */
static int micro_step(trainer *t, ddp_loader *l, ddp_sampler *s, const ddp_augment *aug, int micro,
                      double *loss)
{
    ddp_error err = {0};
    int A = (int)ddp_config_int(t->cfg, "grad_accum");
    ddp_batch b;
    if (ddp_loader_next(l, &b) != DDP_OK)
        return trainer_die(t, "data", ddp_loader_last_error(l));
    if (b.n == 0) { /* next epoch */
        t->epoch++;
        ddp_loader_set_epoch(l, t->epoch);
        if (ddp_loader_next(l, &b) != DDP_OK || b.n == 0)
            return trainer_die(t, "data", "an epoch has no batch: batch_size too large?");
    }
    if ((aug->hflip || aug->shift) &&
        ddp_augment_images(aug, b.x, b.n, 1, t->side, t->side,
                           ddp_sampler_indices(s) + b.index * (uint64_t)t->B, b.epoch,
                           &err) != DDP_OK)
        return trainer_die(t, "augment", err.msg);
    ddp_reducer_set_sync(t->red, micro == A - 1);
    /* Dropout follows the global sample, so masks do not depend on the world size. */
    uint64_t offset =
        ((t->step * (uint64_t)A + (uint64_t)micro) * (uint64_t)t->W + (uint64_t)t->R) *
        (uint64_t)t->B;
    ddp_model_batch mb = {.n = (int)b.n,
                          .x = b.x,
                          .labels = b.y,
                          .grad_scale = 1.0f / (float)A,
                          .step = t->step,
                          .sample_offset = offset};
    ddp_model_out out;
    if (ddp_model_forward(t->m, &mb, true, &out) != DDP_OK)
        return trainer_die(t, "forward", ddp_model_last_error(t->m));
    *loss += out.loss / A;
    ready_ctx rc = {t->red, false};
    if (ddp_model_backward(t->m, mark_ready, &rc) != DDP_OK)
        return trainer_die(t, "backward",
                           rc.failed ? ddp_reducer_last_error(t->red) : ddp_model_last_error(t->m));
    return 0;
}

int trainer_train(trainer *t, ddp_dataset *tr, ddp_dataset *te)
{
    ddp_error err = {0};
    ddp_config *c = t->cfg;
    int A = (int)ddp_config_int(c, "grad_accum");
    uint64_t seed = (uint64_t)ddp_config_int(c, "seed");
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(tr);
    so.num_replicas = t->W;
    so.rank = t->R;
    so.seed = seed;
    ddp_sampler *s;
    ddp_loader *l;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = (size_t)t->B;
    lo.threads = (int)ddp_config_int(c, "data.threads");
    if (lo.threads < 0) /* a prefetch thread only pays when it has a core of its own */
        lo.threads = ddp_group_core_to_spare(t->g) ? 1 : 0;
    if (ddp_sampler_create(&so, &s, &err) != DDP_OK)
        return trainer_die(t, "data", err.msg);
    if (ddp_loader_create(tr, s, &lo, &l, &err) != DDP_OK) {
        ddp_sampler_destroy(s);
        return trainer_die(t, "data", err.msg);
    }
    uint64_t per_epoch = ddp_loader_batches_per_epoch(l) / (uint64_t)A;
    uint64_t total = (uint64_t)ddp_config_int(c, "total_steps");
    if (total == 0)
        total = per_epoch * (uint64_t)ddp_config_int(c, "epochs");
    int rc = 0;
    if (ddp_loader_restore(l, &t->pos) != DDP_OK) {
        rc = trainer_die(t, "resume", ddp_loader_last_error(l));
        goto out;
    }
    t->epoch = t->pos.epoch;
    /* Augmentation draws are keyed by each sample's dataset index, not by seed + rank: every
     * rank still draws differently (its samples differ), and the draws do not depend on the
     * world size or on a resume. */
    ddp_augment aug = {.hflip = ddp_config_bool(c, "augment.hflip"),
                       .shift = (int)ddp_config_int(c, "augment.shift"),
                       .seed = seed ^ 0x61756731u};
    ddp_lr_schedule sched = schedule_of(t, total);
    int64_t eval_every = ddp_config_int(c, "eval_every");
    int64_t log_every = ddp_config_int(c, "log_every");
    int64_t ck_every = ddp_config_int(c, "checkpoint.every");
    double clip = ddp_config_float(c, "grad_clip");
    double t0 = ddp_now_seconds();
    progress prog = {t0, t0, 0, 0, t->step, t->step};
    while (t->step < total && !rc) {
        ddp_reducer_zero_grad(t->red);
        double loss = 0;
        for (int micro = 0; micro < A && !rc; micro++)
            rc = micro_step(t, l, s, &aug, micro, &loss);
        if (rc)
            goto out;
        if (ddp_reducer_finish(t->red) != DDP_OK) {
            rc = trainer_die(t, "gradient allreduce", ddp_reducer_last_error(t->red));
            goto out;
        }
        double lr = ddp_lr_at(&sched, t->step);
        if ((rc = optimizer_step(t, clip, lr)))
            goto out;
        t->step++;
        ddp_loader_save(l, &t->pos);
        t->epoch = t->pos.epoch;
        /* The epoch ends when the next step would need a batch it does not have. */
        bool epoch_end = t->pos.next_batch + (uint64_t)A > ddp_loader_batches_per_epoch(l);
        prog.win_sum += loss;
        prog.win_n++;
        bool log_now = (log_every > 0 && (t->step % (uint64_t)log_every == 0)) || t->step == total;
        double mean = loss;
        if (log_now && (rc = log_progress(t, &prog, total, lr, &mean)))
            goto out;
        bool do_eval = eval_every > 0 ? t->step % (uint64_t)eval_every == 0 : epoch_end;
        if ((do_eval || t->step == total) && (rc = evaluate_and_log(t, te, total)))
            goto out;
        if (((ck_every > 0 && t->step % (uint64_t)ck_every == 0) || t->step == total) &&
            trainer_save(t, mean, &err) != DDP_OK) {
            rc = trainer_die(t, "checkpoint", err.msg);
            goto out;
        }
        if (t->R == 0 && t->jsonl)
            fflush(t->jsonl);
    }
    trainer_say(t, "trained %llu steps in %.1f s", (unsigned long long)(t->step - prog.first_step),
                ddp_now_seconds() - t0);
out:
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    return rc;
}
