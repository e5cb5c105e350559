/*
 * train.c — ddptrain's training loop, read top to bottom as one step:
 *   zero the gradients; for each of grad_accum micro-batches: next batch (augmented by the
 *   loader's transform, on its workers when it has them), forward
 *   with the loss, backward marking gradients ready for the reducer (no_sync but for the last);
 *   finish (gradients are now the mean over ranks); clip; the optimizer steps this rank's shard
 *   of every parameter; gather the parameters; log, evaluate, checkpoint.
 * A language model's batches are windows of block_size tokens: nanoGPT's random windows
 * (data.sampling random), drawn from (seed, step, global sample index) so that N ranks × B
 * draw what 1 rank × N·B would and a resumed run what an unbroken one would, with no state; or
 * the DistributedSampler's epochs over the file's fixed windows (epoch), through the loader.
 * The model, optimizer, schedule and checkpoint format are library code (ddp/model.h,
 * ddp/optim.h, ddp/ckpt.h); this file only decides when each runs.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
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

static ddp_lr_schedule schedule_of(const trainer *t, uint64_t total, uint64_t per_epoch)
{
    static const char *const decays[] = {"cosine", "linear", "constant", "step"};
    static const char *const scalings[] = {"none", "linear", "sqrt"};
    ddp_lr_schedule s = DDP_LR_SCHEDULE_INIT;
    s.lr = ddp_config_float(t->cfg, "lr");
    s.scaling = (ddp_lr_scaling)choice(ddp_config_str(t->cfg, "lr_scaling"), scalings, 3);
    s.world_size = t->W;
    s.warmup_steps = (uint64_t)ddp_config_int(t->cfg, "warmup_steps");
    s.decay = (ddp_lr_decay)choice(ddp_config_str(t->cfg, "schedule"), decays, 4);
    s.total_steps = total;
    s.step_size = per_epoch * (uint64_t)ddp_config_int(t->cfg, "lr_step_epochs");
    s.gamma = ddp_config_float(t->cfg, "lr_gamma");
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

/* Sharded gradients (ZeRO-2): backward asks the reducer where each gradient goes. */
static ddp_status acquire_grad(void *ctx, size_t i, float **grad)
{
    ready_ctx *rc = ctx;
    void *g = NULL;
    ddp_status st = ddp_reducer_grad_acquire(rc->red, i, &g);
    rc->failed = st != DDP_OK;
    *grad = g;
    return st;
}

/* A language model's validation loss and perplexity. */
static int evaluate_lm_and_log(trainer *t, ddp_dataset *val, uint64_t total)
{
    ddp_error err = {0};
    double el;
    size_t nw;
    if (trainer_evaluate_lm(t, val, &el, &nw, &err) != DDP_OK)
        return trainer_die(t, "evaluation", err.msg);
    trainer_say(t, "eval at step %llu: val loss %.4f, perplexity %.3f (%zu windows of %d tokens)",
                (unsigned long long)t->step, el, exp(el), nw, t->T);
    char b[2][40];
    if (t->R == 0 && t->jsonl)
        fprintf(t->jsonl, "{\"step\": %llu, \"val_loss\": %s, \"val_perplexity\": %s}\n",
                (unsigned long long)t->step, trainer_json_num(b[0], 40, el, 17),
                trainer_json_num(b[1], 40, exp(el), 6));
    trainer_tb(t, "val/loss", el);
    trainer_tb_flush(t);
    if (t->step == total)
        trainer_say(t, "val loss %.4f, perplexity %.3f", el, exp(el));
    return 0;
}

static int evaluate_and_log(trainer *t, ddp_dataset *te, uint64_t total)
{
    if (t->lm)
        return evaluate_lm_and_log(t, te, total);
    ddp_error err = {0};
    double el, ea;
    if (trainer_evaluate(t, te, &el, &ea, &err) != DDP_OK)
        return trainer_die(t, "evaluation", err.msg);
    trainer_say(t, "eval at step %llu: test loss %.4f, test accuracy %.4f (%zu images)",
                (unsigned long long)t->step, el, ea, ddp_dataset_len(te));
    char b[2][40];
    if (t->R == 0 && t->jsonl)
        fprintf(t->jsonl, "{\"step\": %llu, \"test_loss\": %s, \"test_accuracy\": %s}\n",
                (unsigned long long)t->step, trainer_json_num(b[0], 40, el, 17),
                trainer_json_num(b[1], 40, ea, 17));
    trainer_tb(t, "val/loss", el);
    trainer_tb(t, "val/accuracy", ea);
    trainer_tb_flush(t);
    if (t->step == total)
        trainer_say(t, "test accuracy %.4f", ea);
    return 0;
}

/* The optimizer step on the mean gradients: clipped, then each parameter's elements this rank
 * holds the mean of (all, or its shard with shard_optimizer), then the shards gathered. With
 * clipping, or when want_norm (a progress line reports it; every rank agrees), *norm receives the
 * gradient norm before clipping; else -1. *comm_s receives the seconds spent in the collectives
 * (the norm's, the gather's), where a fast rank waits for a slow one as in finish(). */
static int optimizer_step(trainer *t, double clip, double lr, bool want_norm, double *norm,
                          double *comm_s)
{
    float coef = 1.0f;
    *norm = -1;
    double t0 = ddp_now_seconds();
    if (clip > 0 || want_norm) {
        if (ddp_reducer_grad_norm(t->red, norm) != DDP_OK)
            return trainer_die(t, "gradient norm", ddp_reducer_last_error(t->red));
        if (clip > 0)
            coef = ddp_nn_clip_coef(*norm, clip);
    }
    *comm_s = ddp_now_seconds() - t0;
    size_t np;
    ddp_model_params(t->m, &np);
    for (size_t i = 0; i < np; i++) {
        size_t lo, hi;
        ddp_reducer_shard(t->red, i, &lo, &hi);
        if (t->resident) { /* on the GPU, queued on the model's stream */
            if (ddp_model_device_step_range(t->m, i, lo, hi, t->optim_step + 1, (float)lr, coef) !=
                DDP_OK)
                return trainer_die(t, "optimizer", ddp_model_last_error(t->m));
        } else if (ddp_optim_step_range_grad(t->opt, i, lo, hi, ddp_reducer_shard_grad(t->red, i),
                                             t->optim_step + 1, (float)lr, coef) != DDP_OK)
            return trainer_die(t, "optimizer", ddp_optim_last_error(t->opt));
    }
    t->optim_step++;
    t0 = ddp_now_seconds();
    if (ddp_reducer_gather_params(t->red) != DDP_OK)
        return trainer_die(t, "gathering parameters", ddp_reducer_last_error(t->red));
    *comm_s += ddp_now_seconds() - t0;
    return 0;
}

/* fp16 loss scaling after finish (torch's GradScaler: unscale_, then step or skip, then update):
 * the mean gradient divided by the loss scale; an inf or NaN on any rank (the verdict made the
 * same everywhere through the group that reduced the gradients) skips the optimizer step and
 * halves the scale, and 2000 clean steps double it. *take: whether to step. */
static int unscale_step(trainer *t, bool *take)
{
    bool inf = false;
    float scale = t->scaler.scale;
    if (ddp_reducer_unscale(t->red, (float)(1.0 / (double)scale), &inf) != DDP_OK)
        return trainer_die(t, "loss scaling", ddp_reducer_last_error(t->red));
    ddp_group *g = t->resident ? t->gg : t->g;
    if (ddp_grad_scaler_sync(g, &inf) != DDP_OK)
        return trainer_die(t, "loss scaling", ddp_group_last_error(g));
    *take = ddp_grad_scaler_update(&t->scaler, inf);
    if (!*take) {
        t->skipped++;
        trainer_say(t,
                    "step %llu: inf or NaN gradients at loss scale %g: optimizer step skipped, "
                    "loss scale now %g",
                    (unsigned long long)(t->step + 1), (double)scale, (double)t->scaler.scale);
    }
    return 0;
}

/* Where a run's training batches come from: the loader (images; a language model's fixed
 * windows), or random windows of the token file. */
typedef struct feed {
    ddp_dataset *ds;
    ddp_loader *l;  /* NULL for random windows */
    ddp_sampler *s; /* the loader's */
    ddp_augment aug;
    int side; /* images: (side, side), one channel */
    uint64_t seed;
    uint64_t *starts; /* random windows: (B,) start tokens */
    int32_t *x, *y;   /* random windows: (B, T) tokens and next tokens */
} feed;

void trainer_note_loader(const trainer *t, const ddp_loader *l, int asked)
{
    static bool said; /* once a process: evaluation makes a loader each time */
    int got = ddp_loader_threads(l);
    if (got >= asked || said)
        return;
    said = true;
    fprintf(stderr,
            "ddptrain: rank %d: note: the data loader got %d of its %d thread%s (the system "
            "refused more: ulimit -u or a container's pids limit); %s\n",
            t->R, got, asked, asked == 1 ? "" : "s",
            got ? "it works with those" : "batches are filled on the training thread");
}

/* The loader's next batch: a new epoch when this one is used up. */
static int next_loaded(trainer *t, feed *f, ddp_batch *b)
{
    if (ddp_loader_next(f->l, b) != DDP_OK)
        return trainer_die(t, "data", ddp_loader_last_error(f->l));
    if (b->n == 0) { /* next epoch */
        t->epoch++;
        ddp_loader_set_epoch(f->l, t->epoch);
        if (ddp_loader_next(f->l, b) != DDP_OK || b->n == 0) {
            char msg[300];
            size_t n = ddp_dataset_len(f->ds), per = (n + (size_t)t->W - 1) / (size_t)t->W;
            snprintf(msg, sizeof msg,
                     "an epoch has no batch: batch_size %d is more than the %zu samples each of "
                     "the %d rank%s gets per epoch (%zu in the training set); lower batch_size",
                     t->B, per, t->W, t->W == 1 ? "" : "s", n);
            return trainer_die(t, "data", msg);
        }
    }
    return 0;
}

/* The loader's transform: the batch's augmentation, on the loader's workers (overlapping the
 * step) or, with data.threads 0, inside ddp_loader_next. Draws keyed by (seed, epoch, dataset
 * index), so the thread that runs it changes nothing. */
static ddp_status augment_batch(void *ctx, const ddp_batch *b, const uint64_t *idx, char *msg)
{
    const feed *f = ctx;
    ddp_error err = {0};
    if (ddp_augment_images(&f->aug, b->x, b->n, 1, f->side, f->side, idx, b->epoch, &err)) {
        snprintf(msg, DDP_ERRMSG_MAX, "%s", err.msg); /* "augment: …" */
        return err.status;
    }
    return DDP_OK;
}

/* The micro-batch whose first sample has global index `first`, as the model reads it. */
static int next_batch(trainer *t, feed *f, uint64_t first, ddp_model_batch *mb)
{
    if (!f->l) {
        ddp_error err = {0};
        size_t B = (size_t)t->B;
        ddp_lm_window_starts(f->seed, t->step, first, B, ddp_dataset_num_tokens(f->ds),
                             (size_t)t->T, f->starts);
        if (ddp_dataset_get_windows(f->ds, f->starts, B, f->x, f->y, &err) != DDP_OK)
            return trainer_die(t, "data", err.msg);
        *mb = (ddp_model_batch){.n = t->B, .tokens = f->x, .targets = f->y, .seq_len = t->T};
        return 0;
    }
    ddp_batch b;
    int rc = next_loaded(t, f, &b);
    if (rc)
        return rc;
    if (t->lm)
        *mb = (ddp_model_batch){.n = (int)b.n, .tokens = b.x, .targets = b.y, .seq_len = t->T};
    else
        *mb = (ddp_model_batch){.n = (int)b.n, .x = b.x, .labels = b.y};
    return 0;
}

/* One micro-batch: the next batch, forward and backward. Adds its share of the step's loss to
 * *loss. */
static int micro_step(trainer *t, feed *f, int micro, double *loss)
{
    int A = (int)ddp_config_int(t->cfg, "grad_accum");
    /* The global index of this micro-batch's first sample: dropout and random windows follow
     * it, so neither depends on the world size. */
    uint64_t first = ((t->step * (uint64_t)A + (uint64_t)micro) * (uint64_t)t->W + (uint64_t)t->R) *
                     (uint64_t)t->B;
    ddp_model_batch mb;
    int rc = next_batch(t, f, first, &mb);
    if (rc)
        return rc;
    ddp_reducer_set_sync(t->red, micro == A - 1);
    mb.grad_scale = (t->amp ? t->scaler.scale : 1.0f) / (float)A; /* fp16: the loss scaled */
    mb.step = t->step;
    mb.sample_offset = first;
    if (f->l && !t->lm) {
        /* The DistributedSampler's rank r holds every W-th sample of the global micro-batch:
         * keyed by their places in it, the samples get the masks they get with 1 rank × W·B
         * (and with any grad_accum of the same global batch). A gpt keeps contiguous keys: its
         * random windows are drawn by them. */
        mb.sample_offset =
            ((t->step * (uint64_t)A + (uint64_t)micro) * (uint64_t)t->W) * (uint64_t)t->B +
            (uint64_t)t->R;
        mb.sample_stride = (uint64_t)t->W;
    }
    /* Tests only (docs/environment.md): DDP_TEST_FAIL_FORWARD_AT_STEP=N makes this rank's
     * forward of step N fail, as running out of GPU memory there would: a local failure. */
    const char *fail_at = getenv("DDP_TEST_FAIL_FORWARD_AT_STEP");
    if (fail_at && *fail_at && strtoull(fail_at, NULL, 10) == t->step)
        return trainer_die(t, "forward", "the test's failure (DDP_TEST_FAIL_FORWARD_AT_STEP)");
    ddp_model_out out;
    if (ddp_model_forward(t->m, &mb, true, &out) != DDP_OK)
        return trainer_die(t, "forward", ddp_model_last_error(t->m));
    *loss += out.loss / A;
    ready_ctx ready = {t->red, false};
    ddp_status st = ddp_reducer_grads_sharded(t->red)
                        ? ddp_model_backward_pooled(t->m, acquire_grad, mark_ready, &ready)
                        : ddp_model_backward(t->m, mark_ready, &ready);
    if (st != DDP_OK)
        return trainer_die(t, "backward",
                           ready.failed ? ddp_reducer_last_error(t->red)
                                        : ddp_model_last_error(t->m));
    return 0;
}

/* Sets up f for tr: the sampler and loader, or random windows' buffers. *per_epoch receives the
 * optimizer steps of an epoch (for random windows: as many tokens as the file holds). */
static int feed_open(trainer *t, ddp_dataset *tr, feed *f, uint64_t *per_epoch)
{
    ddp_error err = {0};
    ddp_config *c = t->cfg;
    uint64_t A = (uint64_t)ddp_config_int(c, "grad_accum");
    f->ds = tr;
    f->seed = (uint64_t)ddp_config_int(c, "seed");
    if (t->lm && t->random) {
        size_t B = (size_t)t->B, T = (size_t)t->T;
        f->starts = malloc(B * sizeof *f->starts);
        f->x = malloc(B * T * sizeof *f->x);
        f->y = malloc(B * T * sizeof *f->y);
        if (!f->starts || !f->x || !f->y)
            return trainer_die(t, "data", "out of memory for a batch of windows");
        uint64_t per_step = (uint64_t)B * T * (uint64_t)t->W * A;
        *per_epoch = (ddp_dataset_num_tokens(tr) + per_step - 1) / per_step;
        return 0;
    }
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(tr);
    so.num_replicas = t->W;
    so.rank = t->R;
    so.seed = f->seed;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = (size_t)t->B;
    lo.threads = (int)ddp_config_int(c, "data.threads");
    if (lo.threads < 0) /* a prefetch thread only pays when it has a core of its own */
        lo.threads = ddp_group_core_to_spare(t->g) ? 1 : 0;
    /* Augmentation draws are keyed by each sample's dataset index, not by seed + rank: every
     * rank still draws differently (its samples differ), and the draws do not depend on the
     * world size or on a resume. */
    if (!t->lm)
        f->aug = (ddp_augment){.hflip = ddp_config_bool(c, "augment.hflip"),
                               .shift = (int)ddp_config_int(c, "augment.shift"),
                               .seed = f->seed ^ 0x61756731u};
    f->side = t->side;
    if (f->aug.hflip || f->aug.shift)
        lo.transform = augment_batch, lo.transform_ctx = f;
    if (ddp_sampler_create(&so, &f->s, &err) != DDP_OK ||
        ddp_loader_create(tr, f->s, &lo, &f->l, &err) != DDP_OK)
        return trainer_die(t, "data", err.msg);
    trainer_note_loader(t, f->l, lo.threads);
    *per_epoch = ddp_loader_batches_per_epoch(f->l) / A;
    /* A position converted from another world size may lie in the padding of the saving run's
     * epoch, which this one lacks: that epoch is over. */
    if (t->pos.next_batch > ddp_loader_batches_per_epoch(f->l)) {
        trainer_say(t,
                    "note: the checkpoint's position, batch %" PRIu64 " of epoch %" PRIu64
                    ", is past this run's %zu batches an epoch (another world size, batch or "
                    "dataset): epoch %" PRIu64 " ends here",
                    t->pos.next_batch, t->pos.epoch, ddp_loader_batches_per_epoch(f->l),
                    t->pos.epoch);
        t->pos.next_batch = ddp_loader_batches_per_epoch(f->l);
    }
    if (ddp_loader_restore(f->l, &t->pos) != DDP_OK)
        return trainer_die(t, "resume", ddp_loader_last_error(f->l));
    t->epoch = t->pos.epoch;
    return 0;
}

static void feed_close(feed *f)
{
    ddp_loader_destroy(f->l);
    ddp_sampler_destroy(f->s);
    free(f->starts);
    free(f->x);
    free(f->y);
}

/* The run's length in optimizer steps when `epochs` bounds it: epochs × steps an epoch, that is
 * epochs × per_epoch × A of this world's batches (a step whose A batches cross an epoch's end
 * takes the next epoch's first ones: with A not dividing the epoch's batches the data run ahead
 * of the epoch count). A resumed run counts the batches still to take from where its data
 * stand — which gives the same number when the world, batch and grad_accum are the
 * checkpoint's (until 2026-11-26 it counted each epoch's whole batches after the resume, so a
 * resumed run trained longer than an unbroken one, and a finished one trained a step more), and
 * the right one when they are not: a run resumed by more ranks (an elastic job that grew) ended
 * early, one resumed by fewer trained longer, since its steps were counted in the saving run's
 * size. Random windows count passes by steps alone. */
static uint64_t epochs_total(const trainer *t, const feed *f, uint64_t per_epoch, int A)
{
    uint64_t epochs = (uint64_t)ddp_config_int(t->cfg, "epochs");
    size_t batches = f->l ? ddp_loader_batches_per_epoch(f->l) : 0;
    if (t->step == 0 || !f->l || batches < (size_t)A)
        return per_epoch * epochs;
    uint64_t next = t->pos.next_batch < batches ? t->pos.next_batch : batches;
    uint64_t budget = epochs * per_epoch * (uint64_t)A, used = t->pos.epoch * batches + next;
    if (used >= budget) /* over: this world's count, where the saving one's ran past it */
        return per_epoch * epochs < t->step ? per_epoch * epochs : t->step;
    return t->step + (budget - used) / (uint64_t)A;
}

/* After a step: where the data stand (saved with checkpoints); true at an epoch's end. */
static bool feed_advance(trainer *t, feed *f, uint64_t per_epoch)
{
    if (!f->l) { /* random windows: the step says it all */
        t->epoch = t->step / per_epoch;
        t->pos = (ddp_loader_state){t->epoch, 0};
        return t->step % per_epoch == 0;
    }
    uint64_t A = (uint64_t)ddp_config_int(t->cfg, "grad_accum");
    ddp_loader_save(f->l, &t->pos);
    t->epoch = t->pos.epoch;
    /* The epoch ends when the next step would need a batch it does not have. */
    return t->pos.next_batch + A > ddp_loader_batches_per_epoch(f->l);
}

int trainer_train(trainer *t, ddp_dataset *tr, ddp_dataset *te)
{
    ddp_error err = {0};
    ddp_status st;
    ddp_config *c = t->cfg;
    int A = (int)ddp_config_int(c, "grad_accum");
    feed f = {0};
    uint64_t per_epoch = 1;
    int rc = feed_open(t, tr, &f, &per_epoch);
    if (rc)
        goto out;
    if (per_epoch == 0) {
        /* Fewer batches an epoch than micro-steps a step: each step spans epochs. */
        if (!(t->lm && t->random))
            trainer_say(t,
                        "note: an epoch gives each rank %zu batch%s of %d, fewer than grad_accum "
                        "%d: each optimizer step spans epochs, and 'epochs' counts steps; lower "
                        "grad_accum or batch_size for several steps an epoch",
                        ddp_loader_batches_per_epoch(f.l),
                        ddp_loader_batches_per_epoch(f.l) == 1 ? "" : "es", t->B, A);
        per_epoch = 1;
    }
    if (t->lm && t->random)
        t->epoch = t->step / per_epoch;
    uint64_t total = (uint64_t)ddp_config_int(c, "total_steps");
    if (total == 0)
        total = epochs_total(t, &f, per_epoch, A);
    if (t->step > 0 && t->step >= total)
        trainer_say(t,
                    "note: resumed at step %" PRIu64 ", %s the run's %" PRIu64 " steps (%s): "
                    "nothing to train; raise %s to train on",
                    t->step, t->step == total ? "the last of" : "past", total,
                    ddp_config_int(c, "total_steps") > 0 ? "total_steps" : "epochs",
                    ddp_config_int(c, "total_steps") > 0 ? "total_steps" : "epochs");
    else if (total == 0)
        trainer_say(t, "note: epochs 0 and total_steps 0: nothing to train; set either to train");
    ddp_lr_schedule sched = schedule_of(t, total, per_epoch);
    /* Warmup's step s runs at lr·(s+1)/warmup_steps: with warmup_steps = the run's steps the
     * last one reaches lr, so only a longer warmup never does. */
    if (sched.warmup_steps > total && total > 0)
        trainer_say(t,
                    "note: warmup_steps %" PRIu64 " > the run's %" PRIu64 " steps: the learning "
                    "rate stays in its warmup and never reaches lr; lower warmup_steps",
                    sched.warmup_steps, total);
    int64_t eval_every = ddp_config_int(c, "eval_every");
    int64_t log_every = ddp_config_int(c, "log_every");
    int64_t ck_every = ddp_config_int(c, "checkpoint.every");
    double clip = ddp_config_float(c, "grad_clip");
    /* A language model's loss before training: the curve starts at ln(vocab_size). */
    if ((rc = trainer_metrics_open(t)))
        goto out;
    if (t->lm && t->step == 0 && total > 0 && (rc = evaluate_and_log(t, te, total)))
        goto out;
    double t0 = ddp_now_seconds();
    progress prog = {.t0 = t0,
                     .last_t = t0,
                     .win_sum = t->resume_win_sum, /* resumed: the window as it stood */
                     .win_n = t->resume_win_n,
                     .first_step = t->step,
                     .last_step = t->step,
                     .rss_mib = -1,
                     .gpu_mib = -1};
    t->prog = &prog;
    while (t->step < total && !rc) {
        double step_t0 = ddp_now_seconds();
        ddp_reducer_zero_grad(t->red);
        double loss = 0;
        for (int micro = 0; micro < A && !rc; micro++)
            rc = micro_step(t, &f, micro, &loss);
        if (rc)
            goto out;
        if (ddp_reducer_finish(t->red) != DDP_OK) {
            rc = trainer_die(t, "gradient allreduce", ddp_reducer_last_error(t->red));
            goto out;
        }
        ddp_reducer_stats rs;
        ddp_reducer_stats_get(t->red, &rs);
        double lr = ddp_lr_at(&sched, t->step), norm = -1, comm_s = 0;
        uint64_t next = t->step + 1;
        bool log_now = (log_every > 0 && (next % (uint64_t)log_every == 0)) || next == total;
        bool take = true;
        if (t->amp && (rc = unscale_step(t, &take)))
            goto out;
        if (take && (rc = optimizer_step(t, clip, lr, log_now, &norm, &comm_s)))
            goto out;
        if (!take && ddp_reducer_gather_params(t->red) != DDP_OK) { /* sharded: nothing moved */
            rc = trainer_die(t, "gathering parameters", ddp_reducer_last_error(t->red));
            goto out;
        }
        t->step++;
        bool epoch_end = feed_advance(t, &f, per_epoch);
        prog.win_sum += loss;
        prog.win_n++;
        prog.step_s += ddp_now_seconds() - step_t0;
        prog.wait_s += rs.wait_seconds + comm_s;
        double mean = loss;
        if (log_now && (rc = trainer_log_progress(t, &prog, total, lr, norm, &mean)))
            goto out;
        if (log_every <= 0 && (rc = trainer_poll_save(t, total))) /* no progress lines */
            goto out;
        bool due = (ck_every > 0 && t->step % (uint64_t)ck_every == 0) || t->step == total;
        /* SIGUSR1/SIGUSR2 on some rank (metrics.c): saved before any evaluation, which would
         * eat into a batch system's warning */
        bool asked = t->save_now && !due;
        t->save_now = false;
        double pause_t0 = ddp_now_seconds();
        if (asked && (st = trainer_save(t, mean, &err)) != DDP_OK) {
            rc = st == DDP_ERR_CLOSED ? trainer_die_peer(t, "checkpoint", err.msg)
                                      : trainer_die(t, "checkpoint", err.msg);
            goto out;
        }
        bool do_eval = eval_every > 0 ? t->step % (uint64_t)eval_every == 0 : epoch_end;
        if ((do_eval || t->step == total) && (rc = evaluate_and_log(t, te, total)))
            goto out;
        if (due && (st = trainer_save(t, mean, &err)) != DDP_OK) {
            rc = st == DDP_ERR_CLOSED ? trainer_die_peer(t, "checkpoint", err.msg)
                                      : trainer_die(t, "checkpoint", err.msg);
            goto out;
        } else if (ck_every > 0 && t->step % (uint64_t)ck_every == 0)
            trainer_tb_flush(t);
        prog.paused_s += ddp_now_seconds() - pause_t0;
        trainer_flush_logs(t);
    }
    unsigned long long trained = (unsigned long long)(t->step - prog.first_step);
    /* The largest figures at the last progress line, each with its rank: the largest peak RSS
     * and the fullest GPU may be two ranks' (one line read "largest rank" over both until
     * 2026-11-25). */
    char mem[160] = "", gpu[80] = "";
    if (prog.gpu_mib >= 0)
        snprintf(gpu, sizeof gpu, ", %.2f GiB in use on rank %d's GPU", prog.gpu_mib / 1024,
                 prog.gpu_rank);
    if (prog.rss_mib >= 0)
        snprintf(mem, sizeof mem, " (largest: peak RSS %.0f MiB on rank %d%s)", prog.rss_mib,
                 prog.rss_rank, gpu);
    trainer_say(t, "trained %llu step%s in %.1f s%s", trained, trained == 1 ? "" : "s",
                ddp_now_seconds() - t0, mem);
    if (t->lm && ddp_config_int(c, "max_new_tokens") > 0) {
        trainer_say(t, "sample (temperature %g, top_k %lld, seed %lld):",
                    ddp_config_float(c, "temperature"), (long long)ddp_config_int(c, "top_k"),
                    (long long)ddp_config_int(c, "seed"));
        if ((rc = trainer_generate(t, stdout, true)))
            goto out;
        if (ddp_barrier(t->g) != DDP_OK)
            rc = trainer_die(t, "sample", ddp_group_last_error(t->g));
    }
out:
    t->prog = NULL;
    trainer_metrics_close(t);
    feed_close(&f);
    return rc;
}
