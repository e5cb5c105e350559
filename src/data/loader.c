/*
 * loader.c — batches from a dataset in a sampler's order, prefetched by worker threads.
 *
 * A ring of `depth` slots; batch b lives in slot b % depth. Workers take the next batch number
 * whose slot is free (the consumer has moved past the batch that used it), fill it from the
 * sampler's indices, and mark it ready; next() hands out batches strictly in order. A batch's
 * contents depend only on its indices, so the stream is the same for any number of threads.
 * Changing epoch or position first waits for batches being filled (they read the sampler's
 * index array, which set_epoch rewrites), then restarts the ring. With no workers (threads = 0)
 * next() fills the slot itself: no hand-off between threads, for hosts with no core to spare.
 * The caller's transform runs where the batch is filled, so it overlaps training with workers.
 * A failed batch keeps its status and message in its slot; next() reports it when it gets
 * there, so the batches before it are not lost to a worker that ran ahead.
 * A PyTorch loop sets the sampler's epoch itself (train_sampler.set_epoch(epoch)) rather than
 * the loader's: next() notices the sampler's new epoch and restarts there. So that the caller
 * may rewrite the sampler's indices whenever it likes, the workers read a copy of them, taken
 * on the caller's thread when the ring (re)starts.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/data.h"
#include "data_int.h"
#include "util/util.h"

enum { EMPTY, FILLING, READY };

typedef struct slot {
    void *x;
    int32_t *y;
    size_t n;
    uint64_t batch;
    int state;
    ddp_status st;            /* of filling it */
    char err[DDP_ERRMSG_MAX]; /* why filling it failed */
} slot;

struct ddp_loader {
    ddp_dataset *ds;
    ddp_sampler *sampler;
    ddp_loader_opts o;
    size_t x_bytes, y_elems; /* per sample */
    size_t per_epoch;        /* batches */
    slot *slots;
    uint64_t *idx; /* (len,) the epoch's indices: the sampler's, copied at each (re)start */
    size_t len;
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    uint64_t epoch;
    uint64_t next_consume; /* the batch next() returns next */
    uint64_t released;     /* batches whose slots may be reused */
    uint64_t next_produce; /* the batch a worker takes next */
    int filling;
    bool stop;
    ddp__data_dep ds_dep, s_dep; /* registered with ds and sampler (data_int.h) */
    const char *gone;            /* "dataset" or "sampler": closed before the loader */
    char err[DDP_ERRMSG_MAX];
};

static size_t batches_per_epoch(const ddp_loader *l)
{
    size_t n = ddp_sampler_len(l->sampler), B = l->o.batch_size;
    return n / B + (!l->o.drop_last && n % B != 0); /* not (n + B − 1) / B: B may be huge */
}

/* Fills slot s with batch b of epoch ep from the sampler's indices (idx, len: read under mu),
 * then runs the transform on it; a failure's message goes to s->err. Called without mu by
 * workers, with it in synchronous mode. */
static ddp_status fill(ddp_loader *l, slot *s, uint64_t ep, uint64_t b, const uint64_t *idx,
                       size_t len)
{
    size_t first = (size_t)b * l->o.batch_size;
    size_t n = len - first < l->o.batch_size ? len - first : l->o.batch_size;
    size_t bad = 0;
    ddp_status st = ddp_dataset_get_many(l->ds, idx + first, n, s->x, s->y, &bad);
    s->n = n;
    if (st != DDP_OK) {
        ddp__fmt(s->err, sizeof s->err,
                 "loading batch %llu: sample index %llu is outside the dataset (%zu samples)",
                 (unsigned long long)b, (unsigned long long)idx[first + bad],
                 ddp_dataset_len(l->ds));
        return st;
    }
    if (!l->o.transform)
        return DDP_OK;
    ddp_batch bt = {.n = n, .x = s->x, .y = s->y, .epoch = ep, .index = b};
    char msg[DDP_ERRMSG_MAX] = "";
    st = l->o.transform(l->o.transform_ctx, &bt, idx + first, msg);
    if (st != DDP_OK) {
        msg[sizeof msg - 1] = '\0';
        ddp__fmt(s->err, sizeof s->err, "transforming batch %llu of epoch %llu: %s",
                 (unsigned long long)b, (unsigned long long)ep,
                 msg[0] ? msg : "the transform failed and gave no reason");
    }
    return st;
}

/* Publishes a filled slot with its status. Called with mu held. */
static void publish_locked(slot *s, uint64_t b, ddp_status st)
{
    s->batch = b;
    s->st = st;
    s->state = READY;
}

static void *worker_main(void *arg)
{
    ddp_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !(l->next_produce < l->per_epoch &&
                             l->next_produce < l->released + (uint64_t)l->o.depth))
            pthread_cond_wait(&l->cv_work, &l->mu);
        if (l->stop)
            break;
        uint64_t b = l->next_produce++;
        slot *s = &l->slots[b % (uint64_t)l->o.depth];
        s->state = FILLING;
        l->filling++;
        uint64_t ep = l->epoch;
        pthread_mutex_unlock(&l->mu);
        ddp_status st = fill(l, s, ep, b, l->idx, l->len);
        pthread_mutex_lock(&l->mu);
        publish_locked(s, b, st);
        l->filling--;
        pthread_cond_broadcast(&l->cv_ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Waits for in-flight fills, then restarts the ring at (epoch, batch). Called with mu held. */
static void restart_locked(ddp_loader *l, uint64_t epoch, uint64_t batch)
{
    uint64_t saved = l->per_epoch;
    l->per_epoch = 0; /* workers take nothing new */
    while (l->filling > 0)
        pthread_cond_wait(&l->cv_ready, &l->mu);
    (void)saved;
    ddp_sampler_set_epoch(l->sampler, epoch); /* recompute: the sampler may have moved */
    memcpy(l->idx, ddp_sampler_indices(l->sampler), l->len * sizeof *l->idx);
    l->per_epoch = batches_per_epoch(l);
    l->epoch = epoch;
    for (int i = 0; i < l->o.depth; i++)
        l->slots[i].state = EMPTY;
    l->next_consume = l->released = l->next_produce = batch;
    pthread_cond_broadcast(&l->cv_work);
}

/* Waits until slot s holds the batch next() hands out, for at most timeout_s when set; false
 * (with l->err set) when it ran out. Called with mu held. */
static bool wait_ready_locked(ddp_loader *l, slot *s)
{
    int64_t deadline = 0; /* ns on ddp__now_ns()'s clock; 0: none */
    if (l->o.timeout_s > 0)
        deadline = ddp__now_ns() + (int64_t)(l->o.timeout_s < 1e9 ? l->o.timeout_s * 1e9 : 1e18);
    while (!(s->state == READY && s->batch == l->next_consume)) {
        if (!deadline) {
            pthread_cond_wait(&l->cv_ready, &l->mu);
            continue;
        }
        if (ddp__now_ns() >= deadline) {
            ddp__fmt(l->err, sizeof l->err,
                     "batch %llu of epoch %llu was not ready after the loader's timeout of %g s "
                     "(%s); raise timeout_s if that is expected, else see why it is stuck",
                     (unsigned long long)l->next_consume, (unsigned long long)l->epoch,
                     l->o.timeout_s,
                     l->o.transform ? "a worker is still reading it or in the transform"
                                    : "a worker is still reading it");
            return false;
        }
        struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
        pthread_cond_timedwait(&l->cv_ready, &l->mu, &ts);
    }
    return true;
}

/* Stops the workers and waits for them (a transform under way finishes first). */
static void stop_workers(ddp_loader *l)
{
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++)
        pthread_join(l->threads[i], NULL);
    l->nthreads = 0;
}

/* The dataset or the sampler is going before the loader (data_int.h): no worker may read it
 * any more, and the loader's calls fail from now on. */
static void inputs_gone(void *ctx, const char *what)
{
    ddp_loader *l = ctx;
    stop_workers(l);
    bool ds = !strcmp(what, "dataset");
    if (ds)
        l->ds = NULL;
    else
        l->sampler = NULL;
    if (!l->gone)
        l->gone = ds ? "its dataset was closed (ddp_dataset_close) before it"
                     : "its sampler was destroyed (ddp_sampler_destroy) before it";
}

/* DDP_ERR_CLOSED, with a message in l->err, once an input went before the loader. */
static ddp_status refuse_gone(ddp_loader *l)
{
    ddp__fmt(l->err, sizeof l->err,
             "the loader cannot go on: %s; destroy the loader first, then its dataset and sampler",
             l->gone);
    return DDP_ERR_CLOSED;
}

ddp_status ddp_loader_create(ddp_dataset *ds, ddp_sampler *sampler, const ddp_loader_opts *opts,
                             ddp_loader **out, ddp_error *err)
{
    ddp_loader_opts def = DDP_LOADER_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!ds || !sampler || !out || opts->batch_size == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_loader_create: a dataset, a sampler, out and batch_size ≥ 1 are "
                        "required");
    if (!(opts->timeout_s >= 0) || (opts->timeout_s > 0 && opts->threads == 0))
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_loader_create: timeout_s %g with threads %d: the timeout is 0 (no "
                        "limit) or a positive number of seconds with threads ≥ 1 (with threads 0 "
                        "batches are filled on the caller's own thread)",
                        opts->timeout_s, opts->threads);
    if (opts->threads < 0 || opts->depth < 0 || opts->depth == 1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_loader_create: threads %d and depth %d: threads is 0 or more, depth "
                        "0 (double buffering) or 2 or more",
                        opts->threads, opts->depth);
    /* A batch's bytes must fit in size_t: 2^62 samples of 36 bytes wrapped to malloc(0). */
    size_t x_row = ddp_dataset_x_elems(ds) * 4, y_row = ddp_dataset_y_elems(ds) * 4;
    if (opts->batch_size > SIZE_MAX / (x_row > y_row ? x_row : y_row ? y_row : 1))
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_loader_create: batch_size %zu is too large (a batch of %zu-byte "
                        "samples would not fit in memory); pass the number of samples per batch",
                        opts->batch_size, x_row + y_row);
    if (ddp__sampler_dataset_size(sampler) > ddp_dataset_len(ds))
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_loader_create: the sampler was made for %llu samples but the dataset "
                        "has %zu; create the sampler with dataset_size = ddp_dataset_len(ds) (or "
                        "fewer)",
                        (unsigned long long)ddp__sampler_dataset_size(sampler),
                        ddp_dataset_len(ds));
    ddp_loader *l = calloc(1, sizeof *l);
    if (!l)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a loader");
    l->ds = ds;
    l->sampler = sampler;
    l->ds_dep = (ddp__data_dep){inputs_gone, l, NULL};
    l->s_dep = (ddp__data_dep){inputs_gone, l, NULL};
    ddp__dataset_add_dep(ds, &l->ds_dep);
    ddp__sampler_add_dep(sampler, &l->s_dep);
    l->o = *opts;
    if (l->o.depth == 0)
        l->o.depth = 2;
    l->x_bytes = ddp_dataset_x_elems(ds) * 4; /* float32 or int32 */
    l->y_elems = ddp_dataset_y_elems(ds);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_condattr_t ca; /* next()'s timeout is on ddp__now_ns()'s clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv_ready, &ca);
    pthread_condattr_destroy(&ca);
    l->slots = calloc((size_t)l->o.depth, sizeof *l->slots);
    l->threads = calloc((size_t)l->o.threads + 1, sizeof *l->threads); /* + 1: never calloc(0) */
    l->len = ddp_sampler_len(sampler);
    l->idx = malloc((l->len ? l->len : 1) * sizeof *l->idx);
    ddp_status st = DDP_ERR_NOMEM;
    if (!l->slots || !l->threads || !l->idx)
        goto out_fail;
    for (int i = 0; i < l->o.depth; i++) {
        l->slots[i].x = malloc(l->x_bytes * l->o.batch_size);
        l->slots[i].y = malloc(sizeof(int32_t) * l->y_elems * l->o.batch_size);
        if (!l->slots[i].x || !l->slots[i].y)
            goto out_fail;
    }
    ddp_sampler_set_epoch(sampler, 0);
    memcpy(l->idx, ddp_sampler_indices(sampler), l->len * sizeof *l->idx);
    l->per_epoch = batches_per_epoch(l);
    /* The workers take none of the program's signals (they go to its own threads), except the
     * faults a worker's own read raises: a blocked SIGBUS or SIGSEGV from a fault kills the
     * process without running any handler, and a data file shrunk under the job must reach the
     * program's SIGBUS handler to be named (ddp_data_mapping_at; it died with no word until
     * 2026-11-26). */
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    /* A thread the system refuses (RLIMIT_NPROC, a container's pids limit: EAGAIN) is not an
     * error: the loader runs with those that started, or fills batches inside next() when none
     * did (ddp_loader_threads says which). It was one until 2026-11-26, and ddptrain's first
     * evaluation after training then ended the run before its last checkpoint. */
    for (int i = 0; i < l->o.threads; i++) {
        if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0)
            break;
        l->nthreads = i + 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    *out = l;
    return DDP_OK;
out_fail:
    ddp_loader_destroy(l);
    return ddp__err(err, st,
                    st == DDP_ERR_NOMEM ? "out of memory for the loader's batches"
                                        : "cannot start the loader's threads");
}

void ddp_loader_destroy(ddp_loader *l)
{
    if (!l)
        return;
    stop_workers(l);
    if (l->ds)
        ddp__dataset_remove_dep(l->ds, &l->ds_dep);
    if (l->sampler)
        ddp__sampler_remove_dep(l->sampler, &l->s_dep);
    for (int i = 0; l->slots && i < l->o.depth; i++) {
        free(l->slots[i].x);
        free(l->slots[i].y);
    }
    free(l->slots);
    free(l->idx);
    free(l->threads);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    free(l);
}

ddp_status ddp_loader_set_epoch(ddp_loader *l, uint64_t epoch)
{
    if (!l)
        return DDP_ERR_INVALID;
    if (l->gone)
        return refuse_gone(l);
    pthread_mutex_lock(&l->mu);
    restart_locked(l, epoch, 0);
    pthread_mutex_unlock(&l->mu);
    return DDP_OK;
}

ddp_status ddp_loader_next(ddp_loader *l, ddp_batch *out)
{
    if (!l || !out)
        return DDP_ERR_INVALID;
    if (l->gone)
        return refuse_gone(l);
    pthread_mutex_lock(&l->mu);
    uint64_t se = ddp__sampler_epoch(l->sampler);
    if (se != l->epoch) /* the caller moved the sampler to another epoch: follow it */
        restart_locked(l, se, 0);
    l->released = l->next_consume; /* the batch handed out last time is no longer in use */
    pthread_cond_broadcast(&l->cv_work);
    ddp_status st = DDP_OK;
    if (l->next_consume >= l->per_epoch) {
        *out = (ddp_batch){.n = 0, .epoch = l->epoch, .index = l->next_consume};
    } else {
        slot *s = &l->slots[l->next_consume % (uint64_t)l->o.depth];
        if (l->nthreads == 0 && !(s->state == READY && s->batch == l->next_consume))
            publish_locked(s, l->next_consume, /* synchronous: fill it here */
                           fill(l, s, l->epoch, l->next_consume, l->idx, l->len));
        if (!wait_ready_locked(l, s))
            st = DDP_ERR_TIMEOUT;
        else if (s->st != DDP_OK) { /* this batch failed: say so until set_epoch or restore */
            st = s->st;
            memcpy(l->err, s->err, sizeof l->err);
        } else {
            *out = (ddp_batch){
                .n = s->n, .x = s->x, .y = s->y, .epoch = l->epoch, .index = l->next_consume};
            l->next_consume++;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return st;
}

int ddp_loader_threads(const ddp_loader *l)
{
    return l ? l->nthreads : 0;
}

size_t ddp_loader_batches_per_epoch(const ddp_loader *l)
{
    return l && l->sampler ? batches_per_epoch(l) : 0;
}

void ddp_loader_save(const ddp_loader *l, ddp_loader_state *out)
{
    if (!l || !out || l->gone)
        return;
    pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    uint64_t se = ddp__sampler_epoch(l->sampler);
    out->epoch = se; /* where next() goes: the start of the sampler's epoch if it moved */
    out->next_batch = se == l->epoch ? l->next_consume : 0;
    pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
}

ddp_status ddp_loader_restore(ddp_loader *l, const ddp_loader_state *st)
{
    if (!l || !st)
        return DDP_ERR_INVALID;
    if (l->gone)
        return refuse_gone(l);
    /* Checked first, so that a refused position leaves the loader where it was; every epoch
     * has the same number of batches (the sampler's length does not depend on it). */
    size_t per_epoch = batches_per_epoch(l);
    if (st->next_batch > per_epoch) {
        pthread_mutex_lock(&l->mu);
        ddp__fmt(l->err, sizeof l->err, "restore: batch %llu is past the epoch's %zu batches",
                 (unsigned long long)st->next_batch, per_epoch);
        pthread_mutex_unlock(&l->mu);
        return DDP_ERR_INVALID;
    }
    pthread_mutex_lock(&l->mu);
    restart_locked(l, st->epoch, 0);
    l->next_consume = l->released = l->next_produce = st->next_batch;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    return DDP_OK;
}

const char *ddp_loader_last_error(const ddp_loader *l)
{
    return l ? l->err : "no loader";
}
