/*
 * nccl/watchdog.c — what the NCCL backend does that needs no GPU: the unique id's trip through the
 * store, the messages that name a failed collective, and the watchdog (nccl_int.h).
 *
 * NCCL has no timeouts of its own: an operation whose peer died waits on the GPU forever, and the
 * caller learns of a failure only by polling ncclCommGetAsyncError. The watchdog is the thread that
 * polls: per group, started at init and joined at destroy, it looks at the communicator's error and
 * at each operation in flight every poll_ms; a failure or an operation past its deadline becomes
 * ncclCommAbort (so whatever waits on the GPU returns) and one message, which the owner's next call
 * and the work handle report. The communicator is reached through three function pointers, so the
 * same state machine runs over a fake one in the unit test. Not here: anything CUDA (nccl.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group/nccl/nccl_int.h"
#include "util/util.h"

/* ---- the unique id ------------------------------------------------------------------------- */

void ddp__nccl_uid_key(char *key, size_t cap, const char *prefix)
{
    ddp__fmt(key, cap, "%s/nccl/uid", prefix);
}

ddp_status ddp__nccl_uid_exchange(ddp_store *store, const char *prefix, int me, int timeout_ms,
                                  ddp__nccl_uid_make make, void *ctx, void *id, size_t n,
                                  ddp_error *err)
{
    char key[192];
    ddp__nccl_uid_key(key, sizeof key, prefix);
    ddp_store_set_timeout(store, timeout_ms);
    if (me == 0) {
        ddp_status st = make(ctx, id, n, err);
        if (st != DDP_OK)
            return st;
        if (ddp_store_set(store, key, id, n) != DDP_OK)
            return ddp__err(err, DDP_ERR_NETWORK, "nccl: publishing the unique id as '%s': %s", key,
                            ddp_store_last_error(store));
        return DDP_OK;
    }
    void *v = NULL;
    size_t len = 0;
    ddp_status st = ddp_store_get(store, key, &v, &len);
    if (st != DDP_OK)
        return ddp__err(err, st == DDP_ERR_TIMEOUT ? DDP_ERR_TIMEOUT : DDP_ERR_NETWORK,
                        "nccl: waiting for rank 0's unique id '%s': %s; HINT: rank 0 may have "
                        "failed to create its communicator (see its log)",
                        key, ddp_store_last_error(store));
    if (len != n) {
        free(v);
        return ddp__err(err, DDP_ERR_INVALID,
                        "nccl: rank 0's unique id '%s' is %zu bytes, this rank's NCCL expects "
                        "%zu; HINT: every rank must run the same libddp and NCCL",
                        key, len, n);
    }
    memcpy(id, v, n);
    free(v);
    return DDP_OK;
}

/* ---- messages ------------------------------------------------------------------------------ */

void ddp__coll_label(char *buf, size_t cap, const ddp__coll *c)
{
    if (c->kind == DDP__BARRIER)
        ddp__fmt(buf, cap, "barrier #%llu", (unsigned long long)c->seq);
    else
        ddp__fmt(buf, cap, "%s #%llu (%s × %zu)", ddp__kind_name(c->kind),
                 (unsigned long long)c->seq, ddp_dtype_name(c->dtype), c->count);
}

void ddp__gpu_fail_msg(char *buf, size_t cap, const char *be, int rank, const ddp__coll *c,
                       const char *call, const char *why)
{
    char what[128];
    ddp__coll_label(what, sizeof what, c);
    ddp__fmt(buf, cap,
             "rank %d: %s: %s failed%s%s: %s; HINT: the other ranks' logs say which rank failed "
             "first; the group cannot be used again",
             rank, be, what, call ? " in " : "", call ? call : "", why);
}

/* ---- the watchdog -------------------------------------------------------------------------- */

/* Records the first failure and aborts the communicator; later ones are dropped. Under wd->mu. */
static void fail_locked(ddp__watchdog *wd, ddp_status st, const char *msg, bool peer)
{
    if (atomic_load(&wd->error) != DDP_OK)
        return;
    ddp__fmt(wd->msg, sizeof wd->msg, "%s", msg);
    wd->peer = peer;
    atomic_store(&wd->error, st);
    wd->comm.abort(wd->comm.ctx);
}

ddp_status ddp__watchdog_step(ddp__watchdog *wd, int64_t now)
{
    pthread_mutex_lock(&wd->mu);
    ddp_status st = (ddp_status)atomic_load(&wd->error);
    if (st != DDP_OK)
        goto out_unlock;
    /* The oldest operation in flight: the one an error or a time-out is charged to. */
    ddp__wd_op *oldest = NULL;
    for (int i = 0; i < DDP__WD_MAX; i++) {
        ddp__wd_op *o = &wd->ops[i];
        if (o->live && wd->comm.done(wd->comm.ctx, o->ev))
            o->live = false;
        if (o->live && (!oldest || o->c.seq < oldest->c.seq))
            oldest = o;
    }
    char why[DDP_ERRMSG_MAX], msg[DDP_ERRMSG_MAX];
    why[0] = '\0';
    bool peer = false;
    ddp_status ae = wd->comm.async_error(wd->comm.ctx, why, sizeof why, &peer);
    if (ae != DDP_OK) {
        char line[DDP_ERRMSG_MAX];
        ddp__fmt(line, sizeof line, "%s; the communicator was aborted",
                 why[0] ? why : "the communicator reported an error");
        if (oldest) {
            ddp__gpu_fail_msg(msg, sizeof msg, wd->backend, wd->rank, &oldest->c, NULL, line);
        } else {
            ddp__fmt(msg, sizeof msg,
                     "rank %d: %s: the communicator failed while idle (after collective #%llu): "
                     "%s; HINT: the other ranks' logs say which rank failed first",
                     wd->rank, wd->backend, (unsigned long long)wd->last_seq, line);
        }
        fail_locked(wd, ae, msg, peer);
        st = ae;
        goto out_unlock;
    }
    for (int i = 0; i < DDP__WD_MAX; i++) {
        ddp__wd_op *o = &wd->ops[i];
        if (!o->live || now < o->c.deadline_ms)
            continue;
        char took[32], what[128];
        ddp__fmt_duration(took, sizeof took, o->c.deadline_ms - o->start_ms);
        ddp__coll_label(what, sizeof what, &o->c);
        ddp__fmt(msg, sizeof msg,
                 "rank %d: %s: %s timed out after %s on the GPU: the communicator was aborted; "
                 "HINT: a rank may be dead, stopped or calling a different collective (set "
                 "DDP_DEBUG=1 to check); the others' logs say which",
                 wd->rank, wd->backend, what, took);
        fail_locked(wd, DDP_ERR_TIMEOUT, msg, false);
        st = DDP_ERR_TIMEOUT;
        break;
    }
out_unlock:
    pthread_mutex_unlock(&wd->mu);
    return st;
}

static void *watchdog_main(void *arg)
{
    ddp__watchdog *wd = arg;
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)wd->poll_ms * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
        if (wd->stop)
            break;
        pthread_mutex_unlock(&wd->mu);
        (void)ddp__watchdog_step(wd, ddp__now_ms());
        pthread_mutex_lock(&wd->mu);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

ddp_status ddp__watchdog_start(ddp__watchdog *wd, const ddp__wd_comm *comm, const char *backend,
                               int rank, int poll_ms, ddp_error *err)
{
    memset(wd, 0, sizeof *wd);
    wd->comm = *comm;
    wd->backend = backend;
    wd->rank = rank;
    wd->poll_ms = poll_ms;
    atomic_init(&wd->error, DDP_OK);
    pthread_mutex_init(&wd->mu, NULL);
    pthread_cond_init(&wd->cv, NULL);
    if (poll_ms <= 0)
        return DDP_OK;
    int rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
    if (rc != 0) {
        pthread_cond_destroy(&wd->cv);
        pthread_mutex_destroy(&wd->mu);
        return ddp__err(err, DDP_ERR_SYSTEM, "%s: starting the watchdog thread: %s", backend,
                        strerror(rc));
    }
    wd->thread_started = true;
    return DDP_OK;
}

void ddp__watchdog_stop(ddp__watchdog *wd)
{
    if (!wd || !wd->comm.async_error)
        return;
    if (wd->thread_started) {
        pthread_mutex_lock(&wd->mu);
        wd->stop = true;
        pthread_cond_broadcast(&wd->cv);
        pthread_mutex_unlock(&wd->mu);
        pthread_join(wd->thread, NULL);
        wd->thread_started = false;
    }
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    wd->comm.async_error = NULL;
}

ddp_status ddp__watchdog_track(ddp__watchdog *wd, const ddp__coll *c, void *ev, int64_t now)
{
    pthread_mutex_lock(&wd->mu);
    ddp_status st = (ddp_status)atomic_load(&wd->error);
    if (st == DDP_OK) {
        st = DDP_ERR_INVALID;
        for (int i = 0; i < DDP__WD_MAX; i++)
            if (!wd->ops[i].live) {
                wd->ops[i] = (ddp__wd_op){.c = *c, .start_ms = now, .ev = ev, .live = true};
                wd->ops[i].c.stall = NULL; /* the core's, valid only while the call runs */
                wd->last_seq = c->seq;
                st = DDP_OK;
                break;
            }
    }
    pthread_mutex_unlock(&wd->mu);
    return st;
}

void ddp__watchdog_untrack(ddp__watchdog *wd, uint64_t seq)
{
    pthread_mutex_lock(&wd->mu);
    for (int i = 0; i < DDP__WD_MAX; i++)
        if (wd->ops[i].live && wd->ops[i].c.seq == seq)
            wd->ops[i].live = false;
    pthread_mutex_unlock(&wd->mu);
}

ddp_status ddp__watchdog_error(ddp__watchdog *wd, char *msg, size_t cap, bool *peer)
{
    ddp_status st = (ddp_status)atomic_load(&wd->error);
    if (peer)
        *peer = false;
    if (st != DDP_OK && (msg || peer)) {
        pthread_mutex_lock(&wd->mu);
        if (msg)
            ddp__fmt(msg, cap, "%s", wd->msg);
        if (peer)
            *peer = wd->peer;
        pthread_mutex_unlock(&wd->mu);
    }
    return st;
}

void ddp__watchdog_fail(ddp__watchdog *wd, ddp_status st, const char *msg, bool peer)
{
    pthread_mutex_lock(&wd->mu);
    fail_locked(wd, st, msg, peer);
    pthread_mutex_unlock(&wd->mu);
}
