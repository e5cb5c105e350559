/*
 * notice.c — failure notices through the rendezvous store, for a backend whose transport cannot
 * tell the peers that a rank failed (group_int.h: ddp__backend.notice; NCCL, whose collectives
 * spin on the GPU when a peer on the same node dies or gives up over NVLink, P2P or shared
 * memory, and which has no way to carry an abort to the others at all).
 *
 * Each rank of such a group keeps one connection of its own to the store (ddp_store_clone):
 *  - this rank's own first failure (a timeout, ddp_group_abort, a failed call: not one that came
 *    from a peer) is published under "<prefix>/down" when the group is poisoned (tell(), on the
 *    failing thread, so that a program exiting at once still tells the cause) — the first rank
 *    to publish wins;
 *  - a thread looks for that key every poll_ms and, when a peer published, fails this rank's
 *    group with the peer's message as the peer's (so the collective waiting on the GPU returns at
 *    once, and ddp_group_peer_failed says so);
 *  - the connection asks the store to set the key, if still absent, when it closes before the
 *    group is destroyed (ddp_store_on_close_first): the process died, or exited after an error
 *    without destroying its group. A clean destroy cancels that first, and so does exit(0)
 *    (on_exit: a program that returns from main without destroying its group succeeded).
 * Calls have a long deadline (a slow store must not read as a death: the client closes a
 * connection whose call timed out, and the store would then set the mark). A store that cannot
 * be reached ends the looking, quietly: this is an early warning, never a new way to fail; the
 * watchdog's deadline stays the bound. Not here: the group's poison and abort (group.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "group/group_int.h"
#include "util/util.h"

#define NOTICE_CALL_MS 30000 /* each store call's deadline */

struct ddp__notice {
    pthread_mutex_t conn_mu; /* held for every use of s and of the flags below */
    ddp_store *s;
    char key[200];
    int rank;
    pid_t pid; /* the process whose connection it is: a forked child's exit must not touch it */
    int poll_ms;
    ddp__notice_hooks h;
    bool published; /* this rank's own failure went to the store (or was tried) */
    bool quieted;   /* the death mark is cancelled */
    bool lost;      /* the connection is gone (a call failed on the network): no more calls */
    bool stopped;   /* no more looking (a failure seen either way, or a call failed) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    pthread_t thread;
    ddp__notice *next; /* the live notices, for the exit handler */
};

/* ---- the live notices: exit(0) is not a death ------------------------------------------------ */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static ddp__notice *live;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

/* A failed call: the client library closes the connection on a network error or a time-out (so
 * the store fires the mark, if still set), and keeps it after an error reply. */
static void call_failed(ddp__notice *n, ddp_status st)
{
    n->stopped = true;
    if (st == DDP_ERR_NETWORK || st == DDP_ERR_TIMEOUT)
        n->lost = true;
}

/* Turns the death mark off: this rank leaves on purpose, or its failure's cause is known. */
static void quiet(ddp__notice *n)
{
    if (n->lost || n->quieted)
        return;
    ddp_status st = ddp_store_on_close(n->s, "", NULL, 0);
    if (st)
        call_failed(n, st);
    else
        n->quieted = true;
}

static void at_exit(int status, void *arg)
{
    (void)arg;
    if (status != 0)
        return;
    /* Bounded waits: a look in progress holds conn_mu for one call; and a child forked while
     * another thread held a lock inherits it held for ever. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 2;
    if (pthread_mutex_timedlock(&live_mu, &ts) != 0)
        return;
    for (ddp__notice *n = live; n; n = n->next) {
        if (n->pid != getpid())
            continue;
        if (pthread_mutex_timedlock(&n->conn_mu, &ts) == 0) {
            quiet(n);
            pthread_mutex_unlock(&n->conn_mu);
        }
    }
    pthread_mutex_unlock(&live_mu);
}

static void live_register(void)
{
    (void)on_exit(at_exit, NULL);
}

/* ---- publishing and looking ------------------------------------------------------------------ */

/* The value: "<status> <message>", the status as a decimal (a negative ddp_status). */
static void publish(ddp__notice *n, ddp_status st, const char *msg)
{
    char v[DDP_ERRMSG_MAX + 64];
    int len = snprintf(v, sizeof v, "%d rank %d %s: %s", (int)st, n->rank,
                       st == DDP_ERR_CLOSED ? "aborted the group" : "failed", msg);
    n->published = true;
    if (len < 0)
        return;
    if ((size_t)len >= sizeof v)
        len = (int)sizeof v - 1;
    /* First wins: two ranks may fail on their own at once. */
    ddp_status cs = ddp_store_compare_set(n->s, n->key, NULL, 0, v, (size_t)len, NULL, NULL);
    if (cs)
        call_failed(n, cs);
}

/* Publishes this rank's own failure, if there is one and nothing was published yet; once there
 * is a failure, the death mark goes. Under conn_mu. */
static void tell(ddp__notice *n)
{
    if (n->lost || n->published)
        return;
    char msg[DDP_ERRMSG_MAX];
    bool peer = false;
    ddp_status e = n->h.error(n->h.ctx, msg, sizeof msg, &peer);
    if (e == DDP_OK)
        return;
    if (!peer)
        publish(n, e, msg);
    quiet(n);
}

/* One look. Returns true when there is nothing more to look for. Under conn_mu. */
static bool look(ddp__notice *n)
{
    char msg[DDP_ERRMSG_MAX];
    bool peer = false;
    if (n->h.error(n->h.ctx, msg, sizeof msg, &peer) != DDP_OK) {
        tell(n); /* (a peer's failure that reached this rank another way: the mark goes) */
        return true;
    }
    const char *keys[1] = {n->key};
    bool have = false;
    ddp_status st = ddp_store_check(n->s, keys, 1, &have);
    if (st) {
        call_failed(n, st);
        return true;
    }
    if (!have)
        return false;
    void *v = NULL;
    size_t len = 0;
    if ((st = ddp_store_get(n->s, n->key, &v, &len))) {
        call_failed(n, st);
        return true;
    }
    char *end = NULL;
    long code = strtol(v, &end, 10);
    const char *text = end && *end == ' ' ? end + 1 : (const char *)v;
    if (code >= 0 || code < -100)
        code = DDP_ERR_NETWORK;
    n->h.fail(n->h.ctx, (ddp_status)code, text);
    free(v);
    quiet(n);
    return true;
}

static void *notice_main(void *arg)
{
    ddp__notice *n = arg;
    pthread_mutex_lock(&n->mu);
    bool done = false;
    while (!n->stop && !done) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += n->poll_ms / 1000;
        ts.tv_nsec += (long)(n->poll_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!n->stop && pthread_cond_timedwait(&n->cv, &n->mu, &ts) != ETIMEDOUT)
            ;
        if (n->stop)
            break;
        pthread_mutex_unlock(&n->mu);
        pthread_mutex_lock(&n->conn_mu);
        done = n->stopped || look(n);
        pthread_mutex_unlock(&n->conn_mu);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

ddp_status ddp__notice_start(const ddp_store *store, const char *prefix, int rank, int poll_ms,
                             const ddp__notice_hooks *h, ddp__notice **out, ddp_error *err)
{
    ddp__notice *n = calloc(1, sizeof *n);
    if (!n)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for the group's failure notices");
    ddp_status st = ddp_store_clone(store, &n->s, err);
    if (st) {
        free(n);
        return st;
    }
    ddp_store_set_timeout(n->s, NOTICE_CALL_MS);
    ddp__fmt(n->key, sizeof n->key, "%s/down", prefix);
    n->rank = rank;
    n->pid = getpid();
    n->poll_ms = poll_ms > 0 ? poll_ms : 1;
    n->h = *h;
    char host[128] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        ddp__fmt(host, sizeof host, "?");
    char v[DDP_ERRMSG_MAX];
    ddp__fmt(v, sizeof v,
             "%d rank %d (process %ld on %s) left without destroying its group: it died, or "
             "exited after an error",
             (int)DDP_ERR_NETWORK, rank, (long)getpid(), host);
    if ((st = ddp_store_on_close_first(n->s, n->key, v, strlen(v))) != DDP_OK) {
        ddp__err(err, st, "the group's failure notices: %s", ddp_store_last_error(n->s));
        ddp_store_close(n->s);
        free(n);
        return st;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->conn_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cv, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&n->thread, NULL, notice_main, n);
    if (e != 0) {
        pthread_mutex_destroy(&n->conn_mu);
        pthread_mutex_destroy(&n->mu);
        pthread_cond_destroy(&n->cv);
        ddp_store_close(n->s); /* (a close, not a death: the mark is set, the group never was) */
        free(n);
        return ddp__err(err, DDP_ERR_SYSTEM, "starting the group's failure-notice thread: %s",
                        strerror(e));
    }
    pthread_once(&live_once, live_register);
    pthread_mutex_lock(&live_mu);
    n->next = live;
    live = n;
    pthread_mutex_unlock(&live_mu);
    *out = n;
    return DDP_OK;
}

void ddp__notice_tell(ddp__notice *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->conn_mu);
    tell(n);
    pthread_mutex_unlock(&n->conn_mu);
}

void ddp__notice_stop(ddp__notice *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->stop = true;
    pthread_cond_signal(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->thread, NULL);
    /* A failure of this rank's own not published yet (normally tell() did, when it happened) is
     * published now; then the death mark is cancelled: leaving on purpose is not dying. n stays
     * on the live list until then, so that an exit(0) from another thread meanwhile still
     * cancels the mark (at_exit); after it, lost keeps at_exit from the closed connection. */
    pthread_mutex_lock(&n->conn_mu);
    tell(n);
    quiet(n);
    ddp_store_close(n->s);
    n->s = NULL;
    n->lost = true;
    pthread_mutex_unlock(&n->conn_mu);
    pthread_mutex_lock(&live_mu);
    for (ddp__notice **p = &live; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
    pthread_mutex_destroy(&n->conn_mu);
    pthread_mutex_destroy(&n->mu);
    pthread_cond_destroy(&n->cv);
    free(n);
}
