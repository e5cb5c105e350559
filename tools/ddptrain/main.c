/*
 * ddptrain — the trainer: `ddprun --nproc_per_node=2 ddptrain [--config X.yaml] [--key value …]`.
 *
 * Tasks: train (with evaluation and checkpoints), test (evaluate a checkpoint), report (the
 * metrics as an HTML page), predict (write a
 * checkpoint's predictions to CSV, or generate text from a language model). Data: Fashion-MNIST
 * / MNIST IDX files, or token files (and text made into them) for a language model. Models: the
 * library's (ddp/model.h: an MLP, a small CNN, a GPT), optimizer and schedule (ddp/optim.h).
 * Everything distributed goes through the public API: the group, the reducer (gradient buckets
 * during backward), the sampler and loader, the checkpoint module. Rank 0 alone logs and writes
 * checkpoints; the others wait at a barrier.
 *
 * This file holds the wiring: it has the config checked before any work (config.c, data.c),
 * joins the group, builds the model and optimizer, resumes, wraps the model in the reducer and
 * runs the task (train.c, eval.c, generate.c; checkpoints in checkpoint.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddptrain.h"

/* ---- messages ------------------------------------------------------------------------------ */

void trainer_say(trainer *t, const char *fmt, ...)
{
    if (t->R != 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    FILE *out = t->say_to_stderr ? stderr : stdout;
    fprintf(out, "%s\n", line);
    fflush(out);
    if (t->log) {
        fprintf(t->log, "%s\n", line);
        trainer_flush_logs(t);
    }
}

/* f's buffered lines out; the first failure warned about (*failed). */
static void flush_checked(trainer *t, FILE *f, const char *name, bool *failed)
{
    if (!f || *failed)
        return;
    errno = 0;
    int rc = fflush(f), e = errno;
    if (rc == 0 && !ferror(f))
        return;
    *failed = true;
    fprintf(stderr,
            "ddptrain: warning: writing '%s/%s' failed at step %llu: %s; training goes on, but "
            "what it writes there from now on may be lost: free space where '%s' lives (a "
            "checkpoint that cannot be written stops the run)\n",
            t->dir, name, (unsigned long long)t->step,
            rc != 0 && e ? strerror(e) : "an earlier write failed", t->dir);
}

void trainer_flush_logs(trainer *t)
{
    if (t->R != 0)
        return;
    flush_checked(t, t->log, "train.log", &t->log_failed);
    flush_checked(t, t->jsonl, "metrics.jsonl", &t->jsonl_failed);
}

void trainer_log(trainer *t, const char *fmt, ...)
{
    if (t->R != 0 || !t->log)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(t->log, fmt, ap);
    va_end(ap);
    fputc('\n', t->log);
    trainer_flush_logs(t);
}

/* After a group error, before this rank exits: abort the groups, so that the other ranks learn
 * the first error at once ("rank 2 aborted the group: … rank 3 (pid 42) died …") as group.h
 * advises, rather than only that this rank's connections closed ("rank 2 closed its connection:
 * it probably died"), which on shm+tcp blamed a host's leader for another rank of its host
 * (found by bench/chaos.py). A group without an error is left alone. */
static void abort_failed_groups(trainer *t)
{
    if (t->g && ddp_group_error(t->g) != DDP_OK)
        ddp_group_abort(t->g);
    if (t->gg && ddp_group_error(t->gg) != DDP_OK)
        ddp_group_abort(t->gg);
}

int trainer_die(trainer *t, const char *what, const char *msg)
{
    /* A failure that came from another rank (it died, aborted the group, or failed first: the
     * host group or the GPU group says so — NCCL's ncclRemoteError) is that rank's: this one stops
     * as its consequence, so that ddprun reports the rank that failed first-hand. */
    if ((t->g && ddp_group_peer_failed(t->g)) || (t->gg && ddp_group_peer_failed(t->gg)))
        return trainer_die_peer(t, what, msg);
    abort_failed_groups(t);
    /* A failure of this rank's own (out of GPU memory in forward, a data file it alone reads)
     * with the groups healthy: the peers may be waiting in a collective. The abort tells them
     * why — "rank 1 aborted the group: forward: …" — rather than only that this rank left
     * (shm, tcp) or, on a GPU group, nothing at all until their deadline (an NCCL collective
     * learns nothing from a clean exit; the abort goes through the store's failure notices). */
    char why[DDP_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s: %s", what, msg);
    if (t->gg && ddp_group_error(t->gg) == DDP_OK)
        ddp_group_abort_reason(t->gg, why);
    if (t->g && ddp_group_error(t->g) == DDP_OK)
        ddp_group_abort_reason(t->g, why);
    fprintf(stderr, "ddptrain: rank %d: %s: %s\n", t->R, what, msg);
    return 1;
}

int trainer_die_peer(trainer *t, const char *what, const char *msg)
{
    abort_failed_groups(t);
    fprintf(stderr, "ddptrain: rank %d: %s: %s (this rank stops with it: exit code %d)\n", t->R,
            what, msg, DDP_EXIT_PEER_FAILED);
    return DDP_EXIT_PEER_FAILED;
}

/* ---- setting up ------------------------------------------------------------------------------ */

/* Rank 0: out_dir (with its parents), train.log and metrics.jsonl, appended to. Training also
 * makes out_dir/checkpoints now: an out_dir that cannot be written is an error before any work,
 * not after hours of training when the first checkpoint fails. Returns 0, or 2 after printing
 * what failed. */
static int open_logs(trainer *t, bool train)
{
    char dir[1200], failed[1200] = "";
    int mk = 0; /* the first directory that could not be made, and why */
    snprintf(dir, sizeof dir, "%s", t->dir);
    for (char *p = dir + 1;; p++)
        if (*p == '/' || !*p) {
            char c = *p;
            *p = '\0';
            if (mkdir(dir, 0755) != 0 && errno != EEXIST && !mk) {
                mk = errno;
                snprintf(failed, sizeof failed, "%s", dir);
            }
            *p = c;
            if (!c)
                break;
        }
    /* out_dir made just now: its lock before the first file (a run started at the same
     * moment, which also found no out_dir, is refused here). */
    if (train && !mk && trainer_lock_out_dir(t))
        return 2;
    char path[1300];
    snprintf(path, sizeof path, "%s/train.log", t->dir);
    FILE *early = t->log; /* the lines said so far (main), copied to the head of the file */
    t->log = fopen(path, "a");
    int why = errno;
    if (early) {
        fflush(early);
        if (t->log && t->early_len) {
            fwrite(t->early_buf, 1, t->early_len, t->log);
            fflush(t->log);
        }
        fclose(early);
        free(t->early_buf);
        t->early_buf = NULL;
        t->early_len = 0;
    }
    if (train && !t->log && mk) { /* the reason is the directory's, not the file's ENOENT */
        fprintf(stderr,
                "ddptrain: out_dir '%s' is not writable: cannot create '%s': %s; choose "
                "another --out_dir\n",
                t->dir, failed, strerror(mk));
        return 2;
    }
    if (train && !t->log && (why == EMFILE || why == ENFILE)) { /* not the folder's fault */
        fprintf(stderr,
                "ddptrain: cannot open '%s': %s: this process is out of file descriptors; "
                "raise the limit (ulimit -n) and start again\n",
                path, strerror(why));
        return 2;
    }
    if (train && !t->log) {
        fprintf(stderr,
                "ddptrain: out_dir '%s' is not writable: cannot open '%s': %s; choose another "
                "--out_dir\n",
                t->dir, path, strerror(why));
        return 2;
    }
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->dir);
    t->jsonl = fopen(path, t->overwrote ? "w" : "a+");
    if (train && !t->jsonl) { /* the report's and the user's only record of the figures */
        fprintf(stderr,
                "ddptrain: out_dir '%s': cannot open '%s': %s; move it away or choose another "
                "--out_dir\n",
                t->dir, path, strerror(errno));
        return 2;
    }
    /* A last line cut short (a full disk, a kill in the middle of a write) is ended first, so
     * this run's first line is not glued to it (the report then read a dead run's lines as
     * this one's, until 2026-11-26). */
    off_t end = t->jsonl ? lseek(fileno(t->jsonl), 0, SEEK_END) : 0;
    char last = '\n';
    if (end > 0 && pread(fileno(t->jsonl), &last, 1, end - 1) == 1 && last != '\n')
        fputc('\n', t->jsonl);
    if (train) {
        snprintf(path, sizeof path, "%s/checkpoints", t->dir);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr,
                    "ddptrain: out_dir '%s': cannot create '%s': %s; choose another "
                    "--out_dir\n",
                    t->dir, path, strerror(errno));
            return 2;
        }
        struct stat sb; /* a file of that name: access() below said "Permission denied" */
        if (stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            fprintf(stderr,
                    "ddptrain: out_dir '%s': '%s' is a file, not a directory (ddptrain keeps its "
                    "checkpoints in that directory); move the file away or choose another "
                    "--out_dir\n",
                    t->dir, path);
            return 2;
        }
        if (access(path, W_OK | X_OK) != 0) {
            fprintf(stderr,
                    "ddptrain: out_dir '%s': checkpoints cannot be written to '%s': %s; choose "
                    "another --out_dir\n",
                    t->dir, path, strerror(errno));
            return 2;
        }
    }
    return 0;
}

/* The model of model.*, for side × side images, and its optimizer. */
static int build_model(trainer *t)
{
    ddp_config *c = t->cfg;
    ddp_error err = {0};
    ddp_model_spec ms = DDP_MODEL_SPEC_INIT;
    ms.type = ddp_config_str(c, "model.type");
    /* An LM's predict generates one sequence at a time: a model made for batch_size would hold
     * batch_size × block_size positions of activations for nothing (on a GPU committed device
     * memory: GPT-2 124M at batch 64, tens of GiB, enough to fail a smaller GPU) */
    ms.max_batch = t->lm && !strcmp(ddp_config_str(c, "task"), "predict") ? 1 : t->B;
    ms.seed = (uint64_t)ddp_config_int(c, "seed");
    ms.in_ch = 1;
    ms.in_h = ms.in_w = t->side;
    ms.classes = t->classes;
    ms.hidden = ddp_config_ints(c, "model.hidden", &ms.n_hidden);
    ms.channels = ddp_config_ints(c, "model.channels", &ms.n_channels);
    ms.dropout = (float)ddp_config_float(c, "model.dropout");
    ms.activation = ddp_config_str(c, "model.activation");
    ms.n_layer = (int)ddp_config_int(c, "model.n_layer");
    ms.n_head = (int)ddp_config_int(c, "model.n_head");
    ms.n_embd = (int)ddp_config_int(c, "model.n_embd");
    ms.block_size = (int)ddp_config_int(c, "model.block_size");
    ms.vocab_size = (int)ddp_config_int(c, "model.vocab_size");
    ms.bias = ddp_config_bool(c, "model.bias");
    ms.device = t->dev.device;
    ms.device_index = t->dev.cuda_index < 0 ? 0 : t->dev.cuda_index;
    ms.precision = t->prec;
    if (ddp_model_build(&ms, &t->m, &err) != DDP_OK)
        return trainer_die(t, "model", err.msg);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = !strcmp(ddp_config_str(c, "optimizer"), "adamw") ? DDP_OPTIM_ADAMW : DDP_OPTIM_SGD;
    oo.momentum = (float)ddp_config_float(c, "momentum");
    oo.weight_decay = (float)ddp_config_float(c, "weight_decay");
    trainer_parse_betas(ddp_config_str(c, "betas"), &oo.beta1, &oo.beta2); /* checked already */
    oo.eps = (float)ddp_config_float(c, "eps");
    size_t np;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    if (ddp_optim_create(&oo, p, np, &t->opt, &err) != DDP_OK)
        return trainer_die(t, "optimizer", err.msg);
    t->oo = oo;
    return 0;
}

/* The reducer's view of a parameter list: the same names, counts and values. */
static ddp_param *reducer_view(const ddp_model_param *p, size_t n)
{
    ddp_param *v = calloc(n ? n : 1, sizeof *v);
    for (size_t i = 0; v && i < n; i++)
        v[i] = (ddp_param){p[i].name, p[i].count, DDP_FLOAT32, p[i].data, DDP_DEVICE_CPU};
    return v;
}

/* device cuda: the model's training state moves to the GPU for good (after a checkpoint was
 * loaded into its host arrays), and a GPU group joins the ranks for the gradients, ordered after
 * the model's stream; the reducer then works on device memory (rparams are the device arrays,
 * rbuffers the running statistics', which it broadcasts from rank 0 over the GPU group at
 * creation and before each evaluation, as the CPU path does on the host).
 * shard_optimizer true shards the step on the GPU too; auto leaves it off there until a GPU
 * session has measured whether it pays (docs/gpu.md). */
static int go_resident(trainer *t, ddp_reducer_opts *ro)
{
    ddp_error err = {0};
    ro->shard_optimizer = !strcmp(ddp_config_str(t->cfg, "shard_optimizer"), "true");
    if (ddp_model_resident(t->m, &t->oo, &err) != DDP_OK)
        return trainer_die(t, "model on the GPU", err.msg);
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.world = &t->world;
    go.device = DDP_DEVICE_CUDA;
    go.backend = ddp_config_str(t->cfg, "gpu_backend"); /* not DDP_BACKEND: the host group's */
    /* the host group's store (rank 0 may host it: started without ddprun, a second store on
     * MASTER_PORT would find the port taken); t->g outlives t->gg */
    go.store = ddp_group_store(t->g);
    if (ddp_group_init(&go, &t->gg, &err) != DDP_OK)
        return trainer_die(t, "GPU group", err.msg);
    ddp_group_set_stream(t->gg, ddp_model_cuda_stream(t->m));
    size_t np;
    ddp_model_params(t->m, &np);
    for (size_t i = 0; i < np; i++) {
        t->rparams[i].data = ddp_model_device_param(t->m, i);
        t->rparams[i].device = DDP_DEVICE_CUDA;
    }
    size_t nb;
    ddp_model_buffers(t->m, &nb);
    for (size_t j = 0; j < nb; j++) {
        t->rbuffers[j].data = ddp_model_device_buffer(t->m, j);
        t->rbuffers[j].device = DDP_DEVICE_CUDA;
    }
    t->resident = true;
    return 0;
}

/* ZeRO-1's memory split: with the sharded step, the optimizer keeps the state of this rank's
 * shard only (ddp_optim_keep; on the GPU the device optimizer, ddp_model_device_keep, and the
 * host's none), once the whole state is there (fresh, or loaded and shared); checkpoints gather
 * it on rank 0 (trainer_save). */
static int keep_shard(trainer *t)
{
    if (!ddp_reducer_sharded(t->red))
        return 0;
    size_t np;
    ddp_model_params(t->m, &np);
    size_t *lo = calloc(np ? np : 1, sizeof *lo), *hi = calloc(np ? np : 1, sizeof *hi);
    ddp_status st = lo && hi ? DDP_OK : DDP_ERR_NOMEM;
    for (size_t i = 0; !st && i < np; i++)
        ddp_reducer_shard(t->red, i, &lo[i], &hi[i]);
    /* On the GPU the device's state is the one (checkpoints stream from it): the host's
     * optimizer keeps nothing, after a loaded state's shard went up from it. */
    bool host_keeps = !t->resident || t->state_pending;
    if (!st && host_keeps)
        st = ddp_optim_keep(t->opt, lo, hi);
    ddp_status dst = st || !t->resident ? DDP_OK : ddp_model_device_keep(t->m, lo, hi);
    if (!st && !dst && t->state_pending)
        dst = ddp_model_sync_device(t->m, t->opt);
    if (!st && !dst && t->resident)
        st = ddp_optim_keep(t->opt, lo, lo);
    free(lo);
    free(hi);
    if (st)
        return trainer_die(t, "optimizer",
                           st == DDP_ERR_NOMEM ? "out of memory narrowing the state"
                                               : ddp_optim_last_error(t->opt));
    if (dst)
        return trainer_die(t, "optimizer on the GPU", ddp_model_last_error(t->m));
    t->state_pending = false;
    t->opt_shard = true;
    return 0;
}

/* Wraps the model in the reducer (which broadcasts rank 0's values), then moves the model's
 * gradients into the reducer's buckets, and its parameters too when the optimizer is sharded. */
static int wrap_model(trainer *t)
{
    ddp_config *c = t->cfg;
    ddp_error err = {0};
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    const char *ov = ddp_config_str(c, "overlap");
    ro.overlap = !strcmp(ov, "async")    ? DDP_OVERLAP_ASYNC
                 : !strcmp(ov, "inline") ? DDP_OVERLAP_INLINE
                                         : DDP_OVERLAP_AUTO;
    ro.compress_bf16 = ddp_config_bool(c, "compress_bf16");
    ro.rebuild_buckets = ddp_config_bool(c, "rebuild_buckets");
    const char *shard = ddp_config_str(c, "shard_optimizer");
    ro.shard_optimizer =
        !strcmp(shard, "true") ||
        (!strcmp(shard, "auto") && strcmp(ddp_group_backend(t->g), "shm+tcp") != 0 &&
         strcmp(ddp_group_backend(t->g), "shm+mpi") != 0);
    if (ddp_config_int(c, "bucket_kb") > 0)
        ro.bucket_cap = ro.first_bucket = (size_t)ddp_config_int(c, "bucket_kb") << 10;
    /* ZeRO-2 (auto: off until it has been measured to pay): the config checked shard_optimizer
     * false, device cuda and compress_bf16 already; what auto resolved to is checked here */
    ro.shard_gradients = !strcmp(ddp_config_str(c, "shard_gradients"), "true");
    /* ZeRO-2's pool holds the largest bucket and two of the next: with 25 MiB buckets that is
     * 75 MiB, more than sharding saves on a model under ~40 M parameters at 2 ranks (measured,
     * bench/RESULTS.md). Smaller buckets by default there; bucket_kb still decides. */
    if (ro.shard_gradients && ddp_config_int(c, "bucket_kb") <= 0) {
        ro.bucket_cap = (size_t)4 << 20;
        ro.first_bucket = (size_t)1 << 20;
    }
    if (ro.shard_gradients && (!ro.shard_optimizer || t->dev.device == DDP_DEVICE_CUDA)) {
        fprintf(stderr,
                "ddptrain: rank %d: key 'shard_gradients' is true, but %s; it needs both on "
                "(set shard_optimizer true, device cpu)\n",
                t->R,
                !ro.shard_optimizer ? "shard_optimizer auto is off over this backend"
                                    : "device auto chose cuda");
        return 2;
    }
    size_t np, nb;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    const ddp_model_param *b = ddp_model_buffers(t->m, &nb);
    if (!(t->rparams = reducer_view(p, np)) || !(t->rbuffers = reducer_view(b, nb)))
        return trainer_die(t, "reducer", "out of memory");
    int rc;
    /* Device-resident on cuda (every model type has it: ddp_model_resident) unless resident
     * false asks for host-driven training, as on the CPU: parameters and buffers up before each
     * forward, gradients down after backward (into the reducer's host buckets), the optimizer on
     * the host. */
    if (t->dev.device == DDP_DEVICE_CUDA && strcmp(ddp_config_str(c, "resident"), "false") != 0 &&
        (rc = go_resident(t, &ro)))
        return rc;
    /* test, predict: no gradients, so no reducer — its buckets were 4 bytes a parameter of
     * device memory that evaluation never touched (until 2026-11-25). Rank 0's values (the
     * loaded checkpoint's) go to the others as the reducer's creation sent them. */
    if (strcmp(ddp_config_str(c, "task"), "train") != 0) {
        if (trainer_share_views(t, true, &err) != DDP_OK)
            return trainer_die(t, "sharing the model", err.msg);
        return 0;
    }
    if (ddp_reducer_create(t->resident ? t->gg : t->g, t->rparams, np, t->rbuffers, nb, &ro,
                           &t->red, &err) != DDP_OK)
        return trainer_die(t, "reducer", err.msg);
    for (size_t i = 0; i < np; i++) {
        if (!t->resident)
            ddp_model_bind(t->m, i, ddp_reducer_param(t->red, i), ddp_reducer_grad(t->red, i));
        else if (ddp_model_bind_device_grad(t->m, i, ddp_reducer_grad(t->red, i)) != DDP_OK)
            return trainer_die(t, "model on the GPU", ddp_model_last_error(t->m));
    }
    /* Sharded on the GPU: the parameters live in the reducer there too (its allgather fills
     * them), as on the CPU; the model's own device copy is left unused. */
    if (t->resident && ddp_reducer_sharded(t->red)) {
        float **pd = malloc(sizeof(float *) * (np ? np : 1));
        if (!pd)
            return trainer_die(t, "model on the GPU", "out of memory");
        for (size_t i = 0; i < np; i++)
            pd[i] = ddp_reducer_param(t->red, i);
        ddp_status st = ddp_model_bind_device_params(t->m, pd);
        free(pd);
        if (st != DDP_OK)
            return trainer_die(t, "model on the GPU", ddp_model_last_error(t->m));
    }
    return 0;
}

/* ---- the program ------------------------------------------------------------------------------
 */

/* The device (device: cpu | cuda | auto, GPU LOCAL_RANK mod visible) and the precision, and
 * the peak FLOP/s for MFU: exit code 2 for a precision the device cannot do, 1 when cuda finds
 * no GPU. */
static int choose_device(trainer *t)
{
    ddp_error err = {0};
    if (ddp_device_select(ddp_config_str(t->cfg, "device"), t->world.local_rank, &t->dev, &err) !=
        DDP_OK) {
        fprintf(stderr, "ddptrain: rank %d: %s\n", t->R, err.msg);
        return 1;
    }
    if (t->dev.note[0])
        trainer_say(t, "%s", t->dev.note);
    if (ddp_precision_parse(ddp_config_str(t->cfg, "precision"), &t->prec, &err) != DDP_OK ||
        ddp_precision_check(t->dev.device, t->prec, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 2;
    }
    t->amp = t->prec == DDP_PRECISION_FP16; /* dynamic loss scaling */
    if (t->amp)
        t->scaler = (ddp_grad_scaler)DDP_GRAD_SCALER_INIT;
    double over = ddp_config_float(t->cfg, "mfu_peak_tflops");
    t->peak_flops = over > 0 ? over * 1e12 : ddp_device_peak_flops(t->dev.name, t->prec);
    return 0;
}

/* Who started this process, for a message: "ddprun", "mpirun", …, or "hand" ("env" is the
 * library's name for RANK and WORLD_SIZE alone). */
static const char *started_by(ddp_launcher l)
{
    return l == DDP_LAUNCHER_ENV ? "hand" : ddp_launcher_name(l);
}

/* Joins the group: exit code 1 on failure, 2 when the backend key names one that cannot be
 * (unknown, or nccl for host memory: a usage error, as every other key's). */
static int join(trainer *t)
{
    ddp_error err = {0};
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.world = &t->world;
    const char *backend = ddp_config_str(t->cfg, "backend");
    if (*backend)
        go.backend = backend;
    ddp_status st = ddp_group_init(&go, &t->g, &err);
    if (st == DDP_ERR_NETWORK || st == DDP_ERR_CLOSED) {
        /* A peer died or aborted while the group formed (the set-up's own collectives): that
         * rank's failure, this one stops with it — exit 1 made ddprun blame this rank (node 0's
         * summary named its own healthy rank 0 when node 1's rank was killed, until
         * 2026-11-26). */
        fprintf(stderr,
                "ddptrain: rank %d: joining the group: %s (this rank stops with it: exit "
                "code %d)\n",
                t->world.rank, err.msg, DDP_EXIT_PEER_FAILED);
        return DDP_EXIT_PEER_FAILED;
    }
    if (st != DDP_OK) {
        fprintf(stderr, "ddptrain: rank %d: %s\n", t->world.rank, err.msg);
        return *backend && st == DDP_ERR_INVALID ? 2 : 1;
    }
    t->W = ddp_group_size(t->g);
    t->R = ddp_group_rank(t->g);
    return 0;
}

/* Under an address-space limit (ulimit -v; some clusters set one) OpenBLAS maps a 128 MiB
 * buffer for each of its threads, and a thread whose mapping fails retries it forever; its
 * helper thread, started as the library loads, was seen doing so before main, and exit then
 * waits for it (the library's destructor joins its threads): ddptrain hung even on a usage error
 * (found 2026-11-26). Asked once, first: whether the buffers, the shm segment (64 MiB) and a
 * margin for the data and the model still fit (320 MiB). If not, a run is refused with a line,
 * and main ends with _exit. What the data, the model and the segment take later is the
 * library's check (kernels/cpu/gemm.c: products in a plain loop where OpenBLAS's buffers would
 * not fit). */
#define CRAMPED_NEED_MIB 320
static bool cramped;
static unsigned long long cramped_limit_mib;
static void probe_address_space(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
        return; /* no limit (or none that can be read: nothing to go by) */
    size_t n = (size_t)CRAMPED_NEED_MIB << 20;
    void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        cramped = true;
        cramped_limit_mib = (unsigned long long)(r.rlim_cur >> 20);
    } else {
        munmap(p, n);
    }
}

/* The run refused (cramped): exit status 1. */
static int refuse_cramped(void)
{
    fprintf(stderr,
            "ddptrain: the address-space limit (ulimit -v: %llu MiB) leaves less than %d MiB "
            "free beside what is mapped already, the least a run needs (the BLAS maps 128 MiB "
            "for each of its threads and waits forever where it cannot); HINT: raise the limit "
            "by a few hundred MiB or more, or lift it (ulimit -v unlimited)\n",
            cramped_limit_mib, CRAMPED_NEED_MIB);
    return 1;
}

/* Everything about the configuration and the data is checked before any work starts: exit code
 * 2 (1 when the environment is wrong). Training checks before joining the group; test and
 * predict join first, because rank 0 hands everyone the configuration stored in the checkpoint. */
static int configure(trainer *t, const char *cfg_path, int nrest, char **rest, ddp_dataset **tr,
                     ddp_dataset **te)
{
    ddp_error err = {0};
    int rc = trainer_config_load(t, cfg_path, nrest, rest);
    if (rc || !strcmp(ddp_config_str(t->cfg, "task"), "report")) /* a report needs no ranks */
        return rc;
    if (cramped) /* before the group, the data and the model, which would go on into a hang */
        return refuse_cramped();
    /* The environment, read once: who runs, and the DDP_* settings of the group, the reducer and
     * the data cache. */
    if (ddp_world_from_env(&t->world, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return 1;
    }
    t->R = t->world.rank;
    trainer_bus_errors_rank(t->R);
    /* mpirun, srun, ranks by hand: nothing set the thread counts (ddprun and torchrun do) */
    int threads = ddp_world_default_threads(&t->world);
    if (threads && t->world.local_rank == 0)
        fprintf(stderr,
                "ddptrain: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS unset (started by %s): %d "
                "thread%s per rank (%d rank%s on this host's cores; set them to choose)\n",
                started_by(t->world.launcher), threads, threads == 1 ? "" : "s",
                t->world.local_world_size, t->world.local_world_size == 1 ? "" : "s");
    if (t->local_rank_arg >= 0) {
        /* --local_rank: checked against the launcher's LOCAL_RANK, or taken where the launcher
         * gave none (torch.distributed.launch without --use_env sets RANK but not LOCAL_RANK). */
        ddp_world *w = &t->world;
        if (w->local_rank_known && w->local_rank != t->local_rank_arg) {
            fprintf(stderr,
                    "ddptrain: --local_rank %d but the launcher (%s) says local rank %d; drop "
                    "the flag or start with the launcher's own value\n",
                    t->local_rank_arg, ddp_launcher_name(w->launcher), w->local_rank);
            return 1;
        }
        if (t->local_rank_arg >= w->local_world_size) {
            fprintf(stderr, "ddptrain: --local_rank %d is not below the %d rank%s on this node%s\n",
                    t->local_rank_arg, w->local_world_size, w->local_world_size == 1 ? "" : "s",
                    w->launched ? "" : " (no launcher started this process: a world of one)");
            return 1;
        }
        w->local_rank = t->local_rank_arg;
        w->local_rank_known = true;
    }
    if (strcmp(ddp_config_str(t->cfg, "task"), "train") != 0 &&
        ((rc = join(t)) || (rc = trainer_config_from_checkpoint(t))))
        return rc;
    if ((rc = trainer_open_data(t, tr, te)))
        return rc;
    return t->g ? 0 : join(t);
}

/* Rank 0, at the start of training: what interrupted saves of this host left behind. */
static void clean_checkpoints(trainer *t)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    size_t removed = 0;
    ddp_error err = {0};
    if (ddp_ckpt_clean_stale(dir, "step", &removed, &err) != DDP_OK)
        trainer_say(t, "warning: cleaning '%s': %s", dir, err.msg);
    else if (removed)
        trainer_say(t, "removed %zu temporary file%s that interrupted saves left in %s", removed,
                    removed == 1 ? "" : "s", dir);
    else
        trainer_log(t, "no temporary files of interrupted saves in %s", dir);
}

/* bf16 on the CPU: the products of this run that oneDNN could not compute and that OpenBLAS
 * computed in float32 instead. Once, when the task ends, rather than on each progress line: a
 * fallback is rare (oneDNN out of memory, a oneDNN error), its numbers are right either way, and
 * what the user needs to know is whether the run was really the bf16 run it claims to be. Rank
 * 0's own count (each rank counts its own; they compute the same shapes). */
static void report_bf16_fallbacks(trainer *t, uint64_t products0, uint64_t fallbacks0)
{
    uint64_t products, fallbacks;
    ddp_bf16_cpu_counts(&products, &fallbacks);
    products -= products0;
    fallbacks -= fallbacks0;
    if (fallbacks == 0)
        return;
    trainer_say(t,
                "warning: %llu of %llu bf16 matrix products on rank 0 fell back from oneDNN to "
                "slower code (float32 products, or a plain loop on the bf16 operands: oneDNN "
                "could not run them, out of memory or a oneDNN error), which is right but "
                "slower; HINT: check free memory, or set precision fp32",
                (unsigned long long)fallbacks, (unsigned long long)products);
}

static int run_task(trainer *t, ddp_dataset *tr, ddp_dataset *te)
{
    const char *task = ddp_config_str(t->cfg, "task");
    if (!strcmp(task, "train"))
        return trainer_train(t, tr, te);
    if (!strcmp(task, "predict") && t->lm) {
        /* The text to stdout, or to predict_out when given (rank 0 writes it). */
        const char *to = ddp_config_str(t->cfg, "predict_out");
        FILE *out = stdout;
        int rc = 0;
        if (t->R == 0 && *to && !(out = fopen(to, "w"))) {
            char why[4400];
            snprintf(why, sizeof why, "cannot write '%s': %s (set predict_out to a writable path)",
                     to, strerror(errno));
            rc = trainer_die(t, "predict", why);
        }
        /* rank 0 failed: trainer_die aborted the group with the reason, which the others'
         * generation learns (rank 0 generating with out NULL said it a second time) */
        if (!rc)
            rc = trainer_generate(t, out, false);
        if (out && out != stdout && fclose(out) != 0 && !rc)
            rc = trainer_die(t, "predict", strerror(errno));
        else if (out && out != stdout && !rc)
            trainer_say(t, "wrote the generated text to %s", to);
        if (ddp_barrier(t->g) != DDP_OK && !rc)
            rc = trainer_die(t, "predict", ddp_group_last_error(t->g));
        return rc;
    }
    if (!strcmp(task, "predict"))
        return trainer_predict(t, te);
    ddp_error err = {0};
    double el, ea;
    if (t->lm) {
        size_t nw;
        if (trainer_evaluate_lm(t, te, &el, &nw, &err) != DDP_OK)
            return trainer_die(t, "test", err.msg);
        trainer_say(t, "val loss %.4f, perplexity %.3f (%zu windows of %d tokens of %s)", el,
                    exp(el), nw, t->T, t->val_path);
        return 0;
    }
    if (trainer_evaluate(t, te, &el, &ea, &err) != DDP_OK)
        return trainer_die(t, "test", err.msg);
    trainer_say(t, "test loss %.4f, test accuracy %.4f (%zu images)", el, ea, ddp_dataset_len(te));
    return 0;
}

/* Every rank learns rank 0's ok (ignored elsewhere) on a step of the start-up (what: the keys
 * that step checks), and stops with it if not: 0 to go on, else the exit code (rank 0 has
 * printed why; 2, a usage error). */
static int agree(trainer *t, const char *what, bool ok)
{
    int64_t v = ok;
    if (ddp_broadcast(t->g, &v, 1, DDP_INT64, 0) != DDP_OK)
        return trainer_die(t, "setup", ddp_group_last_error(t->g));
    if (v)
        return 0;
    if (t->R == 0)
        return 2;
    char msg[160];
    snprintf(msg, sizeof msg, "rank 0 stopped before any work (%s; it says why)", what);
    return trainer_die_peer(t, "setup", msg);
}

atomic_int trainer_save_signal;

static void on_save_signal(int sig)
{
    atomic_store(&trainer_save_signal, sig);
}

/* SIGUSR1/SIGUSR2 (ddprun passes them on; Slurm's --signal=USR1@T before a time limit, or 'kill
 * -USR1' by hand): a checkpoint soon, agreed by every rank, and training goes on. Caught from the
 * start (one that came while the data loaded or the group formed ended the job, with ddprun
 * saying "the job goes on", until 2026-11-26: it is now remembered, and the checkpoint comes
 * at the first progress line); test and predict then get the default back (the signal ends
 * them: trainer_release_save_signals). SA_RESTART: the library's waits go on as well. Left
 * ignored when started ignored. */
static const int save_sigs[] = {SIGUSR1, SIGUSR2};
static struct sigaction save_sigs_old[2];
static bool save_sigs_caught[2];

void trainer_catch_save_signals(void)
{
    for (int i = 0; i < 2; i++) {
        struct sigaction sa, old;
        if (sigaction(save_sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_save_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;
        if (sigaction(save_sigs[i], &sa, NULL) == 0)
            save_sigs_old[i] = old, save_sigs_caught[i] = true;
    }
}

/* Not training: the dispositions as they were, and a signal that came meanwhile delivered
 * again under them (it ends test and predict, as it would have). */
static void trainer_release_save_signals(void)
{
    for (int i = 0; i < 2; i++)
        if (save_sigs_caught[i])
            sigaction(save_sigs[i], &save_sigs_old[i], NULL), save_sigs_caught[i] = false;
    int got = atomic_exchange(&trainer_save_signal, 0);
    if (got)
        raise(got);
}

static int run(int argc, char **argv)
{
    /* A file-size limit (ulimit -f) makes a write fail with EFBIG, which the checkpoint's message
     * names with its file and the temporary file is removed, instead of SIGXFSZ ending the rank
     * with no word and leaving the temporary file behind. */
    signal(SIGXFSZ, SIG_IGN);
    /* A data file or checkpoint that shrinks under the job: its SIGBUS named (busfault.c). */
    trainer_catch_bus_errors();
    trainer_catch_save_signals(); /* released below unless training */
    trainer t;
    memset(&t, 0, sizeof t);
    t.local_rank_arg = -1;
    const char *cfg_path = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int nrest = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            trainer_print_help(stdout);
            free(rest);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) { /* as ddprun's */
            printf("ddptrain (ddpc) %s\n", DDP_VERSION_STRING);
            free(rest);
            return 0;
        }
        /* torch.distributed.launch's --local_rank=N (before PyTorch 2.0) / --local-rank=N. */
        const char *lr = NULL;
        if ((!strcmp(argv[i], "--local_rank") || !strcmp(argv[i], "--local-rank")) && i + 1 < argc)
            lr = argv[++i];
        else if (!strncmp(argv[i], "--local_rank=", 13) || !strncmp(argv[i], "--local-rank=", 13))
            lr = argv[i] + 13;
        if (lr) {
            char *end;
            long v = strtol(lr, &end, 10);
            if (!*lr || *end || v < 0 || v > 1 << 20) {
                fprintf(stderr, "ddptrain: --local_rank '%s' is not a number ≥ 0\n", lr);
                free(rest);
                return 2;
            }
            t.local_rank_arg = (int)v;
            continue;
        }
        /* --config or --local_rank as the last argument: their value is missing (the config
         * would call either an unknown key) */
        if ((!strcmp(argv[i], "--config") || !strcmp(argv[i], "--local_rank") ||
             !strcmp(argv[i], "--local-rank")) &&
            i + 1 == argc) {
            fprintf(stderr, "ddptrain: option '%s' needs a value\n", argv[i]);
            free(rest);
            return 2;
        }
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            cfg_path = argv[++i];
        else if (!strncmp(argv[i], "--config=", 9))
            cfg_path = argv[i] + 9;
        else
            rest[nrest++] = argv[i];
    }
    ddp_dataset *tr = NULL, *te = NULL;
    int rc = configure(&t, cfg_path, nrest, rest, &tr, &te);
    if (rc)
        goto out;
    snprintf(t.dir, sizeof t.dir, "%s", ddp_config_str(t.cfg, "out_dir"));
    if (strcmp(ddp_config_str(t.cfg, "task"), "train") != 0)
        trainer_release_save_signals();
    if (!strcmp(ddp_config_str(t.cfg, "task"), "report")) {
        rc = trainer_report(&t);
        goto out;
    }
    const char *task = ddp_config_str(t.cfg, "task");
    bool train = !strcmp(task, "train");
    /* What resume_from names is settled first, and the model built and its checkpoint loaded,
     * before out_dir is touched: a refusal (no checkpoint to resume from, a damaged one, another
     * run's newer checkpoints in out_dir, one saved with another model or optimizer, a device
     * or a batch that does not fit) creates and deletes nothing — overwrite's deletions wait
     * for trainer_overwrite. Until then rank 0's train.log lines wait in memory. */
    if ((rc = agree(&t, "resume_from", t.R != 0 || !train || trainer_resolve_resume(&t) == 0)))
        goto out;
    if (t.R == 0 && !(t.log = open_memstream(&t.early_buf, &t.early_len))) {
        rc = trainer_die(&t, "setup", "out of memory");
        goto out;
    }
    /* Generated text alone on stdout, so that it can be piped or redirected. */
    t.say_to_stderr = t.lm && !strcmp(task, "predict");
    if (!train && t.ckpt_no_config)
        trainer_say(&t,
                    "configuration: %s stores none (not saved by ddptrain): the defaults and the "
                    "command line's keys, which must give the model it holds",
                    ddp_config_str(t.cfg, "checkpoint"));
    else if (!train)
        trainer_say(&t, "configuration: the one stored in %s, with the command line's keys",
                    ddp_config_str(t.cfg, "checkpoint"));
    if (t.lm && train)
        trainer_say(&t, "data: %zu training tokens in %s, %zu validation tokens in %s",
                    ddp_dataset_num_tokens(tr), t.train_path, ddp_dataset_num_tokens(te),
                    t.val_path);
    if ((rc = choose_device(&t)) || (rc = build_model(&t)))
        goto out;
    /* Resume (train) or load (test, predict): rank 0 reads, everyone gets it by broadcast. */
    bool loaded = false;
    ddp_ckpt_train_pos pos = {0, 0, 0, (uint64_t)t.W, 0, 0.0f, 0};
    if ((rc = trainer_load(&t, train, &loaded, &pos)))
        goto out;
    /* Every rank learns whether rank 0 could write out_dir, and stops with it if not: before
     * any training, not when the first checkpoint fails hours later. */
    if ((rc = agree(&t, "out_dir",
                    t.R != 0 || (trainer_overwrite(&t) == 0 && open_logs(&t, train) == 0))))
        goto out;
    if (train && t.R == 0)
        clean_checkpoints(&t);
    if ((rc = wrap_model(&t)) || (loaded && (rc = trainer_share_loaded(&t, train, &pos))) ||
        (train && (rc = keep_shard(&t))))
        goto out;
    int A = (int)ddp_config_int(t.cfg, "grad_accum");
    /* The backend, why it was chosen, and who started the job when it was not ddprun: "shm:
     * every rank on one host, started by mpirun". */
    char bk[800];
    ddp_launcher la = ddp_group_world(t.g)->launcher;
    bool other = la != DDP_LAUNCHER_NONE && la != DDP_LAUNCHER_DDPRUN;
    int bl =
        snprintf(bk, sizeof bk, "%s: %s%s%s", ddp_group_backend(t.g), ddp_group_backend_reason(t.g),
                 other ? ", started by " : "", other ? started_by(la) : "");
    if (t.resident && bl > 0 && (size_t)bl < sizeof bk) /* the gradients' own group */
        snprintf(bk + bl, sizeof bk - (size_t)bl, "; gradients on the GPU over %s: %s",
                 ddp_group_backend(t.gg), ddp_group_backend_reason(t.gg));
    char dev_desc[200];
    if (t.dev.device == DDP_DEVICE_CUDA)
        snprintf(dev_desc, sizeof dev_desc, "cuda:%d (%s, %s)", t.dev.cuda_index, t.dev.name,
                 ddp_precision_name(t.prec));
    else if (t.prec != DDP_PRECISION_FP32)
        snprintf(dev_desc, sizeof dev_desc, "cpu (precision %s)", ddp_precision_name(t.prec));
    else
        snprintf(dev_desc, sizeof dev_desc, "cpu");
    char zero[220] = "";
    if (train && ddp_reducer_grads_sharded(t.red))
        snprintf(zero, sizeof zero,
                 "; gradients and optimizer step sharded (ZeRO-2), each rank keeping 1/%d of "
                 "the gradient and of the optimizer state (gradient pool %.1f MiB)",
                 t.W, (double)ddp_reducer_grad_pool_bytes(t.red) / 1048576.0);
    else if (train && t.opt_shard)
        snprintf(zero, sizeof zero,
                 "; optimizer step sharded (ZeRO-1), each rank keeping 1/%d of its state", t.W);
    else if (train && ddp_reducer_sharded(t.red))
        snprintf(zero, sizeof zero, "; optimizer step sharded (ZeRO-1)");
    else if (train && !strcmp(ddp_config_str(t.cfg, "shard_optimizer"), "true"))
        /* asked for and not done: said, as the line says what it does (the reducer shards only
         * among 2 or more ranks: one has nothing to split) */
        snprintf(zero, sizeof zero,
                 "; optimizer step not sharded (shard_optimizer true needs 2 or more processes)");
    /* torch's bf16_compress_hook: the gradients travel in bf16 (changes the weights: said) */
    if (train && t.W > 1 && ddp_config_bool(t.cfg, "compress_bf16")) {
        size_t zl = strlen(zero);
        snprintf(zero + zl, sizeof zero - zl, "; gradients sent in bf16 (compress_bf16)");
    }
    if (t.lm)
        trainer_say(&t,
                    "DDP: %d process%s (%s), device %s, per-rank batch %d × %d tokens, grad "
                    "accumulation %d, effective batch %d (%d tokens)%s",
                    t.W, t.W == 1 ? "" : "es", bk, dev_desc, t.B, t.T, A, t.B * t.W * A,
                    t.B * t.W * A * t.T, zero);
    else
        trainer_say(&t,
                    "DDP: %d process%s (%s), device %s, per-rank batch %d, grad accumulation "
                    "%d, effective batch %d%s",
                    t.W, t.W == 1 ? "" : "es", bk, dev_desc, t.B, A, t.B * t.W * A, zero);
    if (train && ddp_reducer_grads_sharded(t.red)) {
        /* ZeRO-2 is a saving only when its pool is smaller than the 1 − 1/W of the gradient
         * each rank stops holding: say so when it is not (a small model, big buckets) */
        size_t np, bytes = 0;
        const ddp_model_param *p = ddp_model_params(t.m, &np);
        for (size_t i = 0; i < np; i++)
            bytes += p[i].count * sizeof(float);
        double saved = (double)bytes * (t.W - 1) / t.W,
               pool = (double)ddp_reducer_grad_pool_bytes(t.red);
        if (pool >= saved)
            trainer_say(&t,
                        "warning: shard_gradients: the gradient pool (%.1f MiB) is not smaller "
                        "than what sharding the gradient saves each rank (%.1f MiB): lower "
                        "bucket_kb, or leave shard_gradients off (ZeRO-1 alone)",
                        pool / 1048576.0, saved / 1048576.0);
    }
    uint64_t bf16_products0, bf16_fallbacks0;
    ddp_bf16_cpu_counts(&bf16_products0, &bf16_fallbacks0);
    rc = run_task(&t, tr, te);
    if (t.dev.device == DDP_DEVICE_CPU && t.prec == DDP_PRECISION_BF16)
        report_bf16_fallbacks(&t, bf16_products0, bf16_fallbacks0);
out:
    ddp_reducer_destroy(t.red);
    free(t.rparams);
    free(t.rbuffers);
    ddp_optim_destroy(t.opt);
    ddp_group_destroy(t.gg); /* before the model: it holds the model's stream */
    ddp_model_free(t.m);
    ddp_group_destroy(t.g);
    ddp_dataset_close(tr);
    ddp_dataset_close(te);
    ddp_config_free(t.cfg);
    free(rest);
    free(t.resume_windows); /* a run that ended before restoring them (a refused overwrite) */
    if (t.log)
        fclose(t.log);
    free(t.early_buf); /* a refusal before out_dir was opened: nothing written there */
    if (t.jsonl)
        fclose(t.jsonl);
    return rc;
}

/* A standard descriptor that is closed (`ddptrain >&-`) is opened on /dev/null first: else the
 * store's socket took descriptor 1, and the DDP line went into the store's stream (the rank then
 * died of SIGPIPE with no word, found 2026-11-26). */
static void std_fds_open(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF)
            continue;
        int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (n >= 0 && n != fd) {
            dup2(n, fd);
            close(n);
        }
    }
}

/* What went to standard output reached it: a full disk or a closed pipe there lost the test
 * results or the generated text with exit 0 until 2026-11-26. */
static bool stdout_failed(void)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return false;
    fprintf(stderr,
            "ddptrain: writing to standard output failed: %s; what it printed is incomplete "
            "(out_dir's train.log keeps the progress and result lines)\n",
            errno ? strerror(errno) : "an earlier write failed");
    return true;
}

int main(int argc, char **argv)
{
    std_fds_open();
    probe_address_space();
    trainer_errfile_start();
    int rc = run(argc, argv);
    if (rc == 0 && stdout_failed())
        rc = 1;
    trainer_errfile_finish(rc);
    if (cramped) { /* not past OpenBLAS's destructor, which would wait for its stuck thread */
        fflush(NULL);
        _exit(rc);
    }
    return rc;
}
