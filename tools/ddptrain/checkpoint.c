/*
 * checkpoint.c — ddptrain's checkpoints: which file, which rank writes or reads it, and how the
 * others learn the result. What goes into the file is the library's (ddp_ckpt_save_train over
 * the model's parameter list and the optimizer's state); that the file does not depend on the
 * world size follows from every rank holding the same model and optimizer state.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddptrain.h"

/* The state views over t's model and optimizer (deferred: the optimizer's state left out, for
 * ddp_ckpt_open_train: its shards come later). */
static ddp_ckpt_train_state state_of(const trainer *t, bool deferred)
{
    ddp_ckpt_train_state s = {0};
    s.params = ddp_model_params(t->m, &s.n_params);
    s.buffers = ddp_model_buffers(t->m, &s.n_buffers);
    s.n_optim = ddp_optim_num_states(t->opt);
    for (int k = 0; k < s.n_optim && k < DDP_CKPT_MAX_OPTIM_STATES; k++) {
        s.optim_names[k] = ddp_optim_state_name(t->opt, k);
        s.optim[k] = deferred ? NULL : ddp_optim_state(t->opt, k);
    }
    return s;
}

/* ZeRO-1's memory split (the optimizer keeps this rank's shard only): rank 0 writes the file
 * with the optimizer's state left open, and every rank's shard goes into it piece by piece
 * (ddp_reducer_gather_state_sink), so no rank ever holds the whole state — torch's
 * consolidate_state_dict(to=0) puts all of it on rank 0. */
typedef struct shard_sink {
    ddp_ckpt_writer *w;
    const ddp_ckpt_train_state *s;
    int k;
    ddp_error *err;
    ddp_status failed; /* the first write that failed (rank 0 alone knows it) */
} shard_sink;

/* A write that fails (a full disk) is kept in ss->failed and the pieces after it are dropped,
 * but the sink itself never refuses one: the other ranks do not learn of a refusal, so rank 0
 * must go on with every gather they make (each state's), and it says why after the last. */
static ddp_status put_piece(void *ctx, size_t i, size_t first, const void *data, size_t count)
{
    shard_sink *ss = ctx;
    if (!ss->failed)
        ss->failed = ddp_ckpt_writer_put(ss->w, ddp_ckpt_train_tensor(ss->s, i, ss->k),
                                         (uint64_t)first * sizeof(float), data,
                                         count * sizeof(float), ss->err);
    return DDP_OK;
}

/* Every rank, after rank 0 tried to open the file (st: how that went; w: its writer): every
 * rank learns whether it opened, then the shards go in, then rank 0 commits or removes it. */
static ddp_status save_shards(trainer *t, ddp_ckpt_writer *w, const ddp_ckpt_train_state *s,
                              ddp_status st, ddp_error *err)
{
    int32_t opened = t->R != 0 || st == DDP_OK;
    if (ddp_broadcast(t->g, &opened, 1, DDP_INT32, 0) != DDP_OK) {
        ddp_ckpt_writer_abort(w);
        return ddp_error_set(err, DDP_ERR_NETWORK, "%s", ddp_group_last_error(t->g));
    }
    if (!opened) /* rank 0 says why; the others learn it from the verdict after */
        return st;
    /* Every rank makes the same gathers whatever rank 0's writes do: a gather's own failure
     * (out of memory on some rank, the network) every rank learns, and all stop together. */
    shard_sink ss = {w, s, 0, err, DDP_OK};
    /* On the GPU the shards are the device optimizer's (the sink gets them in host memory). A
     * rank that cannot name its arrays gives the gather none, which every rank then refuses
     * together, and says why. */
    size_t np;
    ddp_model_params(t->m, &np);
    float **dev = t->resident ? malloc(sizeof(float *) * (np ? np : 1)) : NULL;
    for (int k = 0; k < ddp_optim_num_states(t->opt) && !st; k++) {
        ss.k = k;
        const void *const *src = (const void *const *)ddp_optim_state(t->opt, k);
        const char *why = NULL;
        if (t->resident && !dev)
            src = NULL, why = "out of memory saving a checkpoint";
        else if (t->resident && ddp_model_device_state(t->m, k, dev) != DDP_OK)
            src = NULL, why = ddp_model_last_error(t->m);
        else if (t->resident)
            src = (const void *const *)dev;
        if ((st = ddp_reducer_gather_state_sink(t->red, 0, src, t->R == 0 ? put_piece : NULL, &ss)))
            ddp_error_set(err, st, "%s", why ? why : ddp_reducer_last_error(t->red));
    }
    free(dev);
    if (!st && ss.failed) /* its message is in err already */
        st = ss.failed;
    if (t->R == 0 && st)
        ddp_ckpt_writer_abort(w);
    else if (t->R == 0)
        st = ddp_ckpt_writer_commit(w, err);
    return st;
}

ddp_status trainer_save(trainer *t, double loss, ddp_error *err)
{
    ddp_status st = DDP_OK;
    /* Sharded, each rank's optimizer state is current only in its shard: complete it first —
     * unless each rank keeps its shard only (opt_shard), whose pieces go straight into the file
     * (save_shards); on the GPU the state always goes that way, from the device in pieces (all
     * of it from rank 0's device when unsharded), never whole into rank 0's host memory. */
    size_t np;
    ddp_model_params(t->m, &np);
    bool shards = t->opt_shard || t->resident; /* the same on every rank */
    float **dev = t->resident ? malloc(sizeof(float *) * (np ? np : 1)) : NULL;
    if (t->resident && !dev)
        return ddp_error_set(err, DDP_ERR_NOMEM, "out of memory saving a checkpoint");
    for (int k = 0; k < ddp_optim_num_states(t->opt) && !st && !shards; k++) {
        if (t->resident && (st = ddp_model_device_state(t->m, k, dev)))
            ddp_error_set(err, st, "%s", ddp_model_last_error(t->m));
        else if ((st = ddp_reducer_gather_state(
                      t->red, t->resident ? (void *const *)dev
                                          : (void *const *)ddp_optim_state(t->opt, k))))
            ddp_error_set(err, st, "%s", ddp_reducer_last_error(t->red));
    }
    free(dev);
    if (st)
        return st;
    /* Device-resident: the host's arrays are brought up to date first (rank 0 writes them; the
     * optimizer's state too unless its shards go straight into the file). */
    if (t->resident && t->R == 0 && (st = ddp_model_sync_host(t->m, shards ? NULL : t->opt)))
        return ddp_error_set(err, st, "%s", ddp_model_last_error(t->m));
    /* The progress line's loss window, every rank's (its losses since its last line): saved, so
     * that a run resumed here reports at its next line what an unbroken run would (until
     * 2026-11-26 the window restarted at the resume: a checkpoint between two lines, and with
     * log_every 0 any, changed the next line's loss, metrics.jsonl's and TensorBoard's). */
    double win[2] = {t->prog ? t->prog->win_sum : 0, t->prog ? (double)t->prog->win_n : 0};
    double *wins = malloc(sizeof *wins * 2 * (size_t)t->W);
    if (!wins)
        return ddp_error_set(err, DDP_ERR_NOMEM, "out of memory saving a checkpoint");
    if (ddp_allgather(t->g, win, wins, 2, DDP_FLOAT64) != DDP_OK) {
        free(wins);
        return ddp_error_set(err, DDP_ERR_NETWORK, "%s", ddp_group_last_error(t->g));
    }
    char *wtext = t->R == 0 ? malloc(48 * (size_t)t->W + 1) : NULL;
    if (t->R == 0 && wtext) {
        size_t at = 0;
        wtext[0] = '\0';
        for (int r = 0; r < t->W; r++)
            at += (size_t)snprintf(wtext + at, 48, "%s%.17g %d", r ? " " : "", wins[2 * r],
                                   (int)wins[2 * r + 1]);
    }
    free(wins);
    static const char *const wkey[] = {"ddptrain.loss_window"};
    const char *wval[] = {wtext};
    char dir[1100], path[1300];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    snprintf(path, sizeof path, "%s/step%llu.safetensors", dir, (unsigned long long)t->step);
    ddp_ckpt_train_state s = state_of(t, shards);
    if (wtext) /* out of memory: saved without it (a resumed run's first line then averages less) */
        s.extra_keys = wkey, s.extra_vals = wval, s.n_extra = 1;
    ddp_ckpt_writer *w = NULL;
    char *yaml = NULL;
    if (t->R == 0) {
        s.pos = (ddp_ckpt_train_pos){t->step,
                                     t->pos.epoch,
                                     t->pos.next_batch,
                                     (uint64_t)t->W,
                                     t->optim_step,
                                     t->amp ? t->scaler.scale : 0.0f,
                                     t->amp ? t->scaler.growth_tracker : 0};
        s.loss = loss;
        s.config = yaml = ddp_config_to_yaml(t->cfg);
        mkdir(dir, 0755);
        st = shards ? ddp_ckpt_open_train(path, &s, &w, err) : ddp_ckpt_save_train(path, &s, err);
    }
    if (shards)
        st = save_shards(t, w, &s, st, err);
    if (t->R == 0 && st == DDP_OK) {
        trainer_say(t, "checkpoint %s", path);
        /* Only checkpoints up to this step count and go: the one just written always stays,
         * even beside a newer one of another run (which trainer_resolve_resume refuses at the
         * start, but which another process may still put there). */
        ddp_ckpt_prune_upto(dir, "step", (size_t)ddp_config_int(t->cfg, "checkpoint.keep"), t->step,
                            NULL);
    }
    free(yaml);
    free(wtext);
    /* The others wait for rank 0 (and learn whether the save worked). */
    int64_t ok = t->R != 0 || st == DDP_OK;
    if (ddp_broadcast(t->g, &ok, 1, DDP_INT64, 0) != DDP_OK)
        return ddp_error_set(err, DDP_ERR_NETWORK, "%s", ddp_group_last_error(t->g));
    if (!ok && t->R != 0) /* rank 0 printed why */
        return ddp_error_set(err, DDP_ERR_CLOSED, "rank 0 could not save the checkpoint");
    /* Tests only (docs/environment.md): DDP_TEST_KILL_AFTER_CHECKPOINT=N kills every rank
     * right after the checkpoint of step N is in place — a crash at a known point, where a
     * test's kill from outside races a fast run to its end. */
    const char *kill_at = getenv("DDP_TEST_KILL_AFTER_CHECKPOINT");
    if (st == DDP_OK && kill_at && *kill_at && strtoull(kill_at, NULL, 10) == t->step) {
        fflush(NULL);
        raise(SIGKILL);
    }
    return st;
}

ddp_status trainer_find_checkpoint(trainer *t, const char *spec, char *path, size_t cap,
                                   ddp_error *err)
{
    if (strcmp(spec, "latest") != 0) {
        snprintf(path, cap, "%s", spec);
        return DDP_OK;
    }
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    return ddp_ckpt_latest(dir, "step", path, cap, err);
}

/* The step of a file named ".../step<N>.safetensors", or -1. */
static int64_t step_of(const char *path)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    unsigned long long n;
    int used = 0;
    if (sscanf(base, "step%llu.safetensors%n", &n, &used) != 1 || base[used] != '\0')
        return -1;
    return (int64_t)n;
}

/* When 'latest' cannot be loaded: the checkpoint in out_dir/checkpoints just before it, so the
 * message can say which one to resume from instead. False when there is none. */
static bool checkpoint_before(const trainer *t, const char *failed, char *out, size_t cap)
{
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    int64_t limit = step_of(failed), best = -1;
    DIR *d = opendir(dir);
    if (!d || limit < 0) {
        if (d)
            closedir(d);
        return false;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t n = step_of(e->d_name);
        if (n >= 0 && n < limit && n > best)
            best = n;
    }
    closedir(d);
    if (best < 0)
        return false;
    return snprintf(out, cap, "%s/step%" PRId64 ".safetensors", dir, best) < (int)cap;
}

/* Whether the file at path is there but does not open, or opens and fails its checksum. */
static bool damaged(const char *path)
{
    ddp_ckpt *ck = NULL;
    ddp_status st = ddp_ckpt_open(path, &ck, NULL);
    if (st == DDP_OK && ddp_ckpt_verify(ck, NULL) != DDP_OK)
        st = DDP_ERR_INVALID; /* opens, but its data changed after the save: damaged too */
    ddp_ckpt_close(ck);
    return st != DDP_OK && st != DDP_ERR_NOT_FOUND;
}

void trainer_hint_damaged(const trainer *t, const char *path, bool train)
{
    char before[1300];
    /* It opens and is whole: what failed is the model or optimizer it is loaded into, and the
     * checkpoint before it was saved by the same run, with the same mismatch. */
    if (!damaged(path) || !checkpoint_before(t, path, before, sizeof before))
        return;
    if (train)
        fprintf(stderr,
                "ddptrain: HINT: the checkpoint before it is '%s': move the damaged one out of "
                "the way (mv '%s' '%s.damaged'), then --resume_from %s resumes from it\n",
                before, path, path, ddp_config_str(t->cfg, "resume_from"));
    else
        fprintf(stderr, "ddptrain: HINT: the checkpoint before it is '%s': --checkpoint %s\n",
                before, before);
}

/* The step in a ddptrain checkpoint's metadata; false (with the message printed) when the file
 * does not open or is not a ddptrain checkpoint. */
static bool stored_step(const char *path, uint64_t *step)
{
    ddp_error err = {0};
    ddp_ckpt *ck;
    if (ddp_ckpt_open(path, &ck, &err) != DDP_OK) {
        fprintf(stderr, "ddptrain: %s\n", err.msg);
        return false;
    }
    const char *fmt = ddp_ckpt_meta(ck, "format"), *txt = ddp_ckpt_meta(ck, "step");
    char *end = NULL;
    unsigned long long v = txt ? strtoull(txt, &end, 10) : 0;
    bool ok = fmt && !strcmp(fmt, DDP_CKPT_TRAIN_FORMAT) && txt && *txt && !*end;
    if (!ok)
        fprintf(stderr,
                "ddptrain: '%s' is not a ddptrain checkpoint (no metadata 'format' '%s' with a "
                "'step'); give a checkpoint that ddptrain saved\n",
                path, DDP_CKPT_TRAIN_FORMAT);
    ddp_ckpt_close(ck);
    *step = v;
    return ok;
}

int trainer_lock_out_dir(trainer *t)
{
    if (t->dir_locked)
        return 0;
    int fd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0; /* not there yet (open_logs makes it, then locks it), or not a folder */
    /* A run killed just before this one started (SIGKILL to ddprun, a restart) may hold the
     * lock for a moment while it dies: wait up to 2 s for it before refusing. */
    int e = 0;
    for (double end = ddp_now_seconds() + 2.0;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            e = 0;
            break;
        }
        e = errno;
        if (e != EWOULDBLOCK || ddp_now_seconds() > end)
            break;
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    if (e) {
        close(fd);
        if (e != EWOULDBLOCK)
            return 0; /* a file system without locks (some NFS): as before, unguarded */
        fprintf(stderr,
                "ddptrain: out_dir '%s' is in use by another training run (it holds the folder's "
                "lock): two runs there would overwrite each other's checkpoints and mix their "
                "metrics; wait for it to end, or choose another --out_dir\n",
                t->dir);
        return 2;
    }
    t->dir_lock_fd = fd; /* held until the process ends: a killed run leaves no stale lock */
    t->dir_locked = true;
    return 0;
}

/* Whether the file at path lies in the folder dir (the same folder, by device and inode, not by
 * how the two are spelled). False when either cannot be looked at. */
static bool in_folder(const char *path, const char *dir)
{
    char parent[2048];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == parent)
        slash[1] = '\0'; /* "/x": the root */
    else
        *slash = '\0';
    struct stat a, b;
    return stat(parent, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

int trainer_resolve_resume(trainer *t)
{
    /* One training run per out_dir at a time, checked before anything is read or deleted
     * there (--overwrite would delete the running one's checkpoints). Before 2026-11-25 two
     * runs started together both trained into it, each overwriting the other's stepN files. */
    if (trainer_lock_out_dir(t))
        return 2;
    const char *spec = ddp_config_str(t->cfg, "resume_from");
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    bool is_auto = !strcmp(spec, "auto");
    t->resume[0] = '\0';
    t->resume_latest = is_auto || !strcmp(spec, "latest");
    ddp_error err = {0};
    if (t->resume_latest) { /* the newest: never refused for newer ones */
        ddp_status st = ddp_ckpt_latest(dir, "step", t->resume, sizeof t->resume, &err);
        if (st == DDP_ERR_NOT_FOUND && is_auto) {
            t->resume[0] = '\0'; /* a start at step 0: trainer_load says so */
            return 0;
        }
        if (st == DDP_ERR_NOT_FOUND) {
            fprintf(stderr,
                    "ddptrain: --resume_from latest: there is no checkpoint in '%s' to resume "
                    "from; leave out --resume_from to start at step 0, or give --resume_from "
                    "auto to resume when there is one\n",
                    dir);
            return 2;
        }
        if (st != DDP_OK) {
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            return 2;
        }
        ddp_ckpt *ck;
        if (ddp_ckpt_open(t->resume, &ck, &err) != DDP_OK) { /* damaged: say so now */
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            trainer_hint_damaged(t, t->resume, true);
            return 2;
        }
        ddp_ckpt_close(ck);
        return 0;
    }
    uint64_t start = 0; /* the step this run starts from */
    if (*spec) {
        snprintf(t->resume, sizeof t->resume, "%s", spec);
        if (!stored_step(spec, &start))
            return 2;
    }
    /* --overwrite with a resume from one of out_dir's own checkpoints (an older one, usually:
     * going back to it): what was logged up to it is this run's past, kept; only what came
     * after goes, as TensorBoard's purge_step drops it. Whether or not newer checkpoints are
     * there: a run that died after its last checkpoint left lines past it too. A checkpoint
     * from elsewhere (another run's, to fine-tune) has no past here: overwrite starts anew. */
    t->overwrite_from = start;
    t->overwrite_keep = start > 0 && ddp_config_bool(t->cfg, "overwrite") && in_folder(spec, dir);
    /* A checkpoint newer than the start belongs to another run (or to this one's future): the
     * pruning keeps the highest steps, so this run's own checkpoints would be the ones deleted,
     * and 'latest' would name the other run's. */
    char newest[2048];
    if (ddp_ckpt_latest(dir, "step", newest, sizeof newest, NULL) != DDP_OK)
        return 0; /* none (a folder that cannot be used: open_logs says so) */
    int64_t n = step_of(newest);
    if (n < 0 || (uint64_t)n <= start)
        return 0;
    if (ddp_config_bool(t->cfg, "overwrite")) { /* asked for: deleted once the run can start */
        t->overwrite_pending = true;
        return 0;
    }
    char from[2200] = "";
    if (*spec)
        snprintf(from, sizeof from, " (--resume_from '%s')", spec);
    fprintf(stderr,
            "ddptrain: out_dir '%s' holds checkpoints up to step %lld ('%s'), newer than step "
            "%llu where this %srun starts%s: pruning would delete this run's checkpoints in "
            "their favour; resume from the newest with --resume_from latest (or auto), choose "
            "another --out_dir, move '%s' away, or --overwrite true\n",
            t->dir, (long long)n, newest, (unsigned long long)start, *spec ? "" : "new ", from,
            dir);
    return 2;
}

int trainer_overwrite(trainer *t)
{
    if (!t->overwrite_pending)
        return t->overwrite_keep ? trainer_metrics_cut(t, t->overwrite_from) : 0;
    t->overwrite_pending = false;
    char dir[1100], newest[2048];
    snprintf(dir, sizeof dir, "%s/checkpoints", t->dir);
    int removed = 0;
    int64_t n;
    /* newest first: a deletion that fails part way leaves the oldest, which no resume skips */
    while (ddp_ckpt_latest(dir, "step", newest, sizeof newest, NULL) == DDP_OK &&
           (n = step_of(newest)) >= 0 && (uint64_t)n > t->overwrite_from) {
        if (unlink(newest) != 0) {
            fprintf(stderr, "ddptrain: overwrite: cannot delete '%s': %s; move '%s' away instead\n",
                    newest, strerror(errno), dir);
            return 2;
        }
        removed++;
    }
    trainer_say(t, "overwrite: deleted %d checkpoint%s newer than step %llu from '%s'", removed,
                removed == 1 ? "" : "s", (unsigned long long)t->overwrite_from, dir);
    /* The metrics are cut after the deletions: a cut that fails (a full disk) then leaves
     * metrics.jsonl whole, its lines past the checkpoint those of checkpoints now deleted,
     * which a later run's start line purges for the report. The other order lost the lines of
     * checkpoints that a failed deletion left. */
    if (t->overwrite_keep)
        return trainer_metrics_cut(t, t->overwrite_from);
    t->overwrote = true;
    return 0;
}

int trainer_check_optimizer(trainer *t, const char *path)
{
    size_t np;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    int ns = ddp_optim_num_states(t->opt);
    ddp_ckpt *ck = NULL;
    if (np == 0 || ns == 0 || ddp_ckpt_open(path, &ck, NULL) != DDP_OK)
        return 0; /* nothing to check, or the load says why the file does not open */
    /* "optim.<param>.<state>" (src/ckpt/trainstate.c): the run's states of the first
     * parameter, and the states of it the file holds instead, comma-separated */
    char name[512], want[256] = "", held[256] = "", prefix[400];
    bool fits = true;
    for (int k = 0; k < ns; k++) {
        const char *s = ddp_optim_state_name(t->opt, k);
        snprintf(name, sizeof name, "optim.%s.%s", p[0].name, s);
        fits = fits && ddp_ckpt_find(ck, name);
        size_t len = strlen(want);
        snprintf(want + len, sizeof want - len, "%s%s", k ? ", " : "", s);
    }
    int n = snprintf(prefix, sizeof prefix, "optim.%s.", p[0].name);
    for (size_t i = 0; !fits && i < ddp_ckpt_count(ck); i++) {
        const char *tn = ddp_ckpt_tensor_at(ck, i)->name;
        if (n > 0 && strncmp(tn, prefix, (size_t)n) == 0) {
            size_t len = strlen(held);
            snprintf(held + len, sizeof held - len, "%s%s", len ? ", " : "", tn + n);
        }
    }
    ddp_ckpt_close(ck);
    if (fits || !*held)
        return 0;
    const char *mine = ddp_config_str(t->cfg, "optimizer"), *theirs = t->resume_optimizer;
    char fix[64] = "the optimizer that saved it";
    if (*theirs && strcmp(theirs, mine) != 0)
        snprintf(fix, sizeof fix, "--optimizer %s", theirs);
    if (*theirs && strcmp(theirs, mine) != 0)
        fprintf(stderr, "ddptrain: optimizer is %s here (%s) but %s in the checkpoint '%s'", mine,
                ddp_config_origin(t->cfg, "optimizer"), theirs, path);
    else
        fprintf(stderr, "ddptrain: the checkpoint '%s' was saved with another optimizer", path);
    fprintf(stderr,
            ": it holds the optimizer state %s, %s needs %s; resume it with %s, or train with %s "
            "from step 0 into another --out_dir (without --resume_from)\n",
            held, mine, want, fix, mine);
    return 2;
}

/* Rank 0: the checkpoint's progress windows (metadata ddptrain.loss_window, "SUM N" per saving
 * rank) into t->resume_windows; none (an older checkpoint, another program's, text that does not
 * parse) leaves it NULL: the first progress line after the resume then averages its own steps. */
static void read_windows(trainer *t, const char *path)
{
    ddp_ckpt *ck;
    if (ddp_ckpt_open(path, &ck, NULL) != DDP_OK)
        return;
    const char *txt = ddp_ckpt_meta(ck, "ddptrain.loss_window");
    size_t cap = 0, n = 0;
    double *w = NULL;
    for (const char *p = txt; p && *p;) {
        char *end;
        double sum = strtod(p, &end);
        if (end == p)
            break;
        p = end;
        long steps = strtol(p, &end, 10);
        if (end == p || steps < 0 || steps > INT_MAX || !isfinite(sum))
            break;
        p = end;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            double *g = realloc(w, sizeof *w * 2 * nc);
            if (!g)
                break;
            w = g, cap = nc;
        }
        w[2 * n] = sum, w[2 * n + 1] = (double)steps, n++;
        while (*p == ' ')
            p++;
        if (!*p) { /* all of it read */
            t->resume_windows = w, t->resume_windows_n = n;
            w = NULL;
        }
    }
    free(w);
    ddp_ckpt_close(ck);
}

int trainer_load(trainer *t, bool train, bool *loaded, ddp_ckpt_train_pos *pos)
{
    int64_t got = 0; /* 1 loaded, 0 nothing to load, −1 failed, −2 another model (exit 2) */
    if (t->R == 0) {
        ddp_error err = {0};
        char path[2048];
        ddp_ckpt_train_state s = state_of(t, false);
        if (!train) /* test and predict need the weights only: any optimizer's file loads */
            s.n_optim = 0;
        ddp_status st = DDP_OK;
        if (train)
            snprintf(path, sizeof path, "%s", t->resume);
        else
            st = trainer_find_checkpoint(t, ddp_config_str(t->cfg, "checkpoint"), path, sizeof path,
                                         &err);
        /* auto: the latest checkpoint when there is one, else a fresh start — one command line
         * for the first attempt and for every restart under ddprun --max_restarts. */
        if (train && !*path) {
            if (!strcmp(ddp_config_str(t->cfg, "resume_from"), "auto"))
                trainer_say(t,
                            "resume_from auto: no checkpoint in %s/checkpoints yet: starting at "
                            "step 0",
                            t->dir);
        } else if (st != DDP_OK) {
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            got = -1;
        } else if (trainer_config_check_model(t, path) != 0 ||
                   (train && trainer_check_optimizer(t, path) != 0)) {
            got = -2; /* the command line names another model or optimizer: a usage error */
        } else if (ddp_ckpt_load_train(path, &s, pos, &err) != DDP_OK) {
            fprintf(stderr, "ddptrain: %s\n", err.msg);
            /* a damaged file (its checksum, found here) as one that does not open (found
             * before): exit 2 and, for the newest, the one before it named */
            bool bad = damaged(path);
            bool newest = train ? t->resume_latest : t->ckpt_latest;
            if (bad && newest)
                trainer_hint_damaged(t, path, train);
            else if (!bad && !train && t->ckpt_no_config) /* its 'config' metadata is empty */
                fprintf(stderr,
                        "ddptrain: HINT: '%s' stores no configuration (a program other than "
                        "ddptrain saved it): give the keys of the model it was built with, "
                        "e.g. --model.hidden 128 for examples/train_mlp\n",
                        path);
            got = bad ? -2 : -1;
        } else {
            got = 1;
            if (train)
                read_windows(t, path);
            trainer_say(t, "%s %s at step %llu (saved by %llu rank%s)",
                        train ? "resumed from" : "loaded", path, (unsigned long long)pos->step,
                        (unsigned long long)pos->world_size, pos->world_size == 1 ? "" : "s");
        }
    }
    if (ddp_broadcast(t->g, &got, 1, DDP_INT64, 0) != DDP_OK)
        return trainer_die(t, "resume", ddp_group_last_error(t->g));
    *loaded = got > 0;
    if (got < 0 && t->R != 0) /* rank 0 printed why */
        return trainer_die_peer(t, "resume", "rank 0 could not load the checkpoint");
    return got == -2 ? 2 : got < 0 ? 1 : 0;
}

int trainer_share_loaded(trainer *t, bool train, ddp_ckpt_train_pos *pos)
{
    size_t np;
    const ddp_model_param *p = ddp_model_params(t->m, &np);
    for (int k = 0; k < ddp_optim_num_states(t->opt); k++) {
        float *const *state = ddp_optim_state(t->opt, k);
        for (size_t i = 0; i < np; i++)
            if (ddp_broadcast(t->g, state[i], p[i].count, DDP_FLOAT32, 0) != DDP_OK)
                return trainer_die(t, "resume", ddp_group_last_error(t->g));
    }
    /* Device-resident: the parameters on the GPU came from rank 0 (the reducer's broadcast);
     * the optimizer's state goes up from the host's arrays just shared — at once, or with a
     * sharded step once each rank keeps its shard (keep_shard: the GPU never holds all of it),
     * or never when not training (test, predict: the device's state would be made for nothing,
     * 8 bytes a parameter with AdamW). */
    t->state_pending = t->resident && train && ddp_reducer_sharded(t->red);
    bool state_now = train && !t->state_pending;
    if (t->resident && (ddp_model_sync_host(t->m, NULL) != DDP_OK ||
                        ddp_model_sync_device(t->m, state_now ? t->opt : NULL) != DDP_OK))
        return trainer_die(t, "resume", ddp_model_last_error(t->m));
    uint64_t meta[8] = {pos->step,
                        pos->epoch,
                        pos->next_batch,
                        pos->world_size,
                        pos->optim_step,
                        0,
                        (uint64_t)(int64_t)pos->loss_scale_growth,
                        t->resume_batch > 0 ? (uint64_t)t->resume_batch : 0};
    memcpy(&meta[5], &pos->loss_scale, sizeof pos->loss_scale);
    if (ddp_broadcast(t->g, meta, 8, DDP_INT64, 0) != DDP_OK)
        return trainer_die(t, "resume", ddp_group_last_error(t->g));
    t->step = meta[0];
    t->optim_step = meta[4];
    float scale;
    memcpy(&scale, &meta[5], sizeof scale);
    if (t->amp && scale > 0) { /* the scaler goes on where it stood */
        t->scaler.scale = scale;
        t->scaler.growth_tracker = (int)(int64_t)meta[6];
    }
    t->pos.epoch = meta[1];
    /* Each rank's progress window as it stood (the same world only: another's windows do not
     * map onto this one's ranks), so that the next progress line averages what an unbroken
     * run's would. */
    if (train && meta[3] == (uint64_t)t->W) {
        double *wins = calloc(2 * (size_t)t->W, sizeof *wins);
        if (!wins)
            return trainer_die(t, "resume", "out of memory for the progress windows");
        if (t->R == 0 && t->resume_windows_n == (size_t)t->W)
            memcpy(wins, t->resume_windows, sizeof *wins * 2 * (size_t)t->W);
        if (ddp_broadcast(t->g, wins, 2 * (size_t)t->W, DDP_FLOAT64, 0) != DDP_OK) {
            free(wins);
            return trainer_die(t, "resume", ddp_group_last_error(t->g));
        }
        t->resume_win_sum = wins[2 * t->R];
        t->resume_win_n = (int)wins[2 * t->R + 1];
        free(wins);
    }
    free(t->resume_windows);
    t->resume_windows = NULL;
    /* Another world size or per-rank batch (4 ranks × 64 resumed as 2 × 128): continue after
     * the same number of samples of the epoch. The saving run's batch is in its stored
     * configuration (none stored: taken as this run's). The sampler's order is one global list
     * that rank r reads at r, r + W, …, so the first k·B·W samples of an epoch are the same
     * ones for every B and W: only a count that is not a whole number of this run's global
     * batches is rounded down, to the batch that holds it, whose earlier samples train again. */
    uint64_t old_b = meta[7] ? meta[7] : (uint64_t)t->B;
    uint64_t done = meta[2] * old_b * meta[3], global = (uint64_t)t->B * (uint64_t)t->W;
    t->pos.next_batch = done / global;
    if (done % global != 0)
        trainer_say(
            t,
            "note: the checkpoint stopped after %llu samples of epoch %llu (%llu rank%s "
            "× batch %llu); %d rank%s × batch %d resume at sample %llu, training %llu "
            "samples of the epoch again",
            (unsigned long long)done, (unsigned long long)meta[1], (unsigned long long)meta[3],
            meta[3] == 1 ? "" : "s", (unsigned long long)old_b, t->W, t->W == 1 ? "" : "s", t->B,
            (unsigned long long)(t->pos.next_batch * global), (unsigned long long)(done % global));
    return 0;
}
