/*
 * group.c — the process group's core: set-up, ordering, deadlines, poisoning, the debug check,
 * AVG, and the progress thread for asynchronous work. Bytes move only in the backends (shm/,
 * tcp/, hier/), created and chosen through the registry (backends.c, group_int.h).
 *
 * Ordering: every collective gets the next sequence number. Blocking calls run on the caller's
 * thread when nothing is queued (no hand-off, so small collectives stay fast) and otherwise
 * queue behind the asynchronous work, so operations complete in the order issued.
 * Poisoning: the first failure is kept; every later call returns it. The backend is left
 * failed too, so the peers of a failed rank fail fast rather than wait out their deadline.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "group/devops.h"
#include "group/group_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

#define DEFAULT_TIMEOUT_MS (30 * 60 * 1000) /* gloo's 30 minutes */
#define DEFAULT_STALL_REPORT_MS 30000       /* the first "still waiting" line */
#define DEFAULT_ARENA ((size_t)64 << 20)

struct ddp_work {
    ddp_group *g;
    ddp__coll c;
    ddp_op user_op;   /* AVG is run as SUM, then scaled */
    ddp__stall stall; /* c.stall points here while it runs */
    bool done;
    ddp_status status;
    double t_start, t_end; /* seconds, CLOCK_MONOTONIC */
    ddp_work *next;
};

struct ddp_group {
    ddp_world world;
    ddp_store *store;
    bool own_store;
    ddp__mpi_boot *mpi; /* set-up went through MPI (mpirun): no store */
    void *be;
    const ddp__backend_ops *ops;
    const char *backend; /* the registry entry's name (static) */
    char reason[320];    /* why that one, for rank 0's DDP line */
    ddp_device device;   /* where collectives' buffers live */
    int cuda_device;     /* this rank's GPU; -1 for a CPU group */
    void *stream;        /* cudaStream_t to order collectives after; NULL: the default */
    void *scratch;       /* GPU groups: device memory for small collectives on host data */
    size_t scratch_bytes;
    char prefix[64];
    int *ranks;
    int timeout_ms;
    bool debug;
    int stall_ms; /* first report of a waiting collective after this; ≤ 0: never */
    void (*report)(void *ctx, const char *line);
    void *report_ctx;
    int host_cores; /* the cores this host's ranks share */
    uint64_t seq;
    ddp__group_dep *deps; /* reducers built on g: released first in destroy */
    ddp__notice *notice;  /* failure notices through the store (a backend with .notice) */
    /* poison */
    atomic_int error; /* ddp_status */
    char errmsg[DDP_ERRMSG_MAX];
    bool peer_failed;             /* the error came from another rank (ddp__fail.peer); under mu */
    char callmsg[DDP_ERRMSG_MAX]; /* for argument errors, which do not poison */
    /* progress thread */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    ddp_work *head, *tail;
    int queued; /* queued or running */
    bool stop;
    bool thread_started;
    pthread_t thread;
};

const char *ddp__kind_name(ddp__kind k)
{
    static const char *const names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "barrier"};
    return (unsigned)k < DDP__KIND_COUNT ? names[k] : "collective";
}

void ddp__coll_what(const ddp__coll *c, char *buf, size_t cap)
{
    if (c->kind == DDP__BARRIER) /* carries no data: "(uint8 × 0)" says nothing */
        ddp__fmt(buf, cap, "barrier #%llu", (unsigned long long)c->seq);
    else
        ddp__fmt(buf, cap, "%s #%llu (%s × %zu)", ddp__kind_name(c->kind),
                 (unsigned long long)c->seq, ddp_dtype_name(c->dtype), c->count);
}

void ddp__stall_report(const ddp__coll *c, int64_t now, const char *backend,
                       const char *waiting_for)
{
    ddp__stall *s = c->stall;
    if (!s)
        return;
    char what[160], waited[32], left[32], line[DDP_ERRMSG_MAX + 256];
    ddp__coll_what(c, what, sizeof what);
    /* whole seconds: the wake-ups come a few ms late, "30 s" reads better than "30.02 s" */
    int64_t w = now - s->start_ms, l = c->deadline_ms > now ? c->deadline_ms - now : 0;
    ddp__fmt_duration(waited, sizeof waited, w >= 1000 ? (w + 500) / 1000 * 1000 : w);
    ddp__fmt_duration(left, sizeof left, l >= 1000 ? (l + 500) / 1000 * 1000 : l);
    ddp__fmt(line, sizeof line,
             "rank %d: %s has waited %s in %s: %s; still waiting (times out in %s)", s->rank, what,
             waited, backend, waiting_for, left);
    if (s->report)
        s->report(s->ctx, line);
    else
        fprintf(stderr, "ddp: %s\n", line);
    s->interval_ms *= 2;
    s->next_ms = now + s->interval_ms;
}

/* ---- errors ------------------------------------------------------------------------------- */

static void poison(ddp_group *g, ddp_status st, const char *msg, bool peer)
{
    pthread_mutex_lock(&g->mu);
    bool first = atomic_load(&g->error) == DDP_OK;
    if (first) {
        ddp__fmt(g->errmsg, sizeof g->errmsg, "%s", msg);
        g->peer_failed = peer;
        atomic_store(&g->error, st);
    }
    pthread_mutex_unlock(&g->mu);
    if (first && !peer) /* the peers are told now, not at the next poll (notice.c) */
        ddp__notice_tell(g->notice);
}

bool ddp_group_peer_failed(const ddp_group *g)
{
    if (!g || atomic_load(&((ddp_group *)g)->error) == DDP_OK)
        return false;
    pthread_mutex_lock(&((ddp_group *)g)->mu);
    bool peer = g->peer_failed;
    pthread_mutex_unlock(&((ddp_group *)g)->mu);
    return peer;
}

const char *ddp__group_prefix(const ddp_group *g)
{
    return g ? g->prefix : "";
}

ddp_store *ddp_group_store(const ddp_group *g)
{
    return g ? g->store : NULL;
}

ddp_status ddp_group_error(const ddp_group *g)
{
    return g ? (ddp_status)atomic_load(&((ddp_group *)g)->error) : DDP_ERR_INVALID;
}

const char *ddp_group_last_error(const ddp_group *g)
{
    if (!g)
        return "no group";
    if (atomic_load(&((ddp_group *)g)->error) != DDP_OK)
        return g->errmsg;
    return g->callmsg;
}

/* ---- running one collective ----------------------------------------------------------------- */

/* With DDP_DEBUG: every rank shares what it is about to call; any difference fails everywhere
 * with the list, instead of a hang or garbage. Costs one small allgather per collective. */
static ddp_status debug_check(ddp_group *g, const ddp__coll *c)
{
    int W = g->world.world_size;
    int64_t mine[5] = {c->kind, (int64_t)c->count, c->dtype, c->op, c->root};
    int64_t *all = calloc((size_t)W * 5, sizeof *all);
    if (!all)
        return DDP_ERR_NOMEM;
    ddp__coll d = {.kind = DDP__ALLGATHER,
                   .send = mine,
                   .recv = all,
                   .count = 5,
                   .dtype = DDP_INT64,
                   .seq = c->seq,
                   .deadline_ms = c->deadline_ms,
                   .stall = c->stall};
    ddp__fail f = {0};
    ddp_status st = g->ops->run(g->be, &d, &f);
    if (st != DDP_OK) {
        poison(g, st, f.msg, f.peer);
        free(all);
        return st;
    }
    int bad = -1;
    for (int r = 0; r < W && bad < 0; r++)
        if (memcmp(all + 5 * r, all, sizeof mine) != 0)
            bad = r;
    if (bad >= 0) {
        char list[DDP_ERRMSG_MAX] = "";
        for (int r = 0, shown = 0; r < W && shown < 4; r++) {
            const int64_t *x = all + 5 * r;
            if (r > 0 && r != bad && memcmp(x, all, sizeof mine) == 0)
                continue;
            size_t l = strlen(list);
            const char *kind = ddp__kind_name((ddp__kind)x[0]);
            if (x[0] == DDP__BROADCAST)
                ddp__fmt(list + l, sizeof list - l, "%srank %d: %s %s × %lld root %lld",
                         l ? "; " : "", r, kind, ddp_dtype_name((ddp_dtype)x[2]), (long long)x[1],
                         (long long)x[4]);
            else if (x[0] == DDP__BARRIER)
                ddp__fmt(list + l, sizeof list - l, "%srank %d: barrier", l ? "; " : "", r);
            else if (x[0] == DDP__ALLGATHER) /* (no op: "sum" was printed) */
                ddp__fmt(list + l, sizeof list - l, "%srank %d: %s %s × %lld", l ? "; " : "", r,
                         kind, ddp_dtype_name((ddp_dtype)x[2]), (long long)x[1]);
            else
                ddp__fmt(list + l, sizeof list - l, "%srank %d: %s %s × %lld %s", l ? "; " : "", r,
                         kind, ddp_dtype_name((ddp_dtype)x[2]), (long long)x[1],
                         ddp_op_name((ddp_op)x[3]));
            shown++;
        }
        char msg[DDP_ERRMSG_MAX];
        ddp__fmt(msg, sizeof msg,
                 "collective #%llu does not match across ranks (%s); every "
                 "rank must call the same collectives in the same order",
                 (unsigned long long)c->seq, list);
        poison(g, DDP_ERR_INVALID, msg, false);
        free(all);
        return DDP_ERR_INVALID;
    }
    free(all);
    return DDP_OK;
}

static ddp_status execute(ddp_group *g, ddp_work *w)
{
    ddp_status st = (ddp_status)atomic_load(&g->error);
    if (st != DDP_OK)
        return st;
    int64_t now = ddp__now_ms();
    w->c.deadline_ms = now + g->timeout_ms;
    if (g->stall_ms > 0) {
        w->stall = (ddp__stall){.start_ms = now,
                                .next_ms = now + g->stall_ms,
                                .interval_ms = g->stall_ms,
                                .rank = g->world.rank,
                                .report = g->report,
                                .ctx = g->report_ctx};
        w->c.stall = &w->stall;
    }
    if (g->debug && (st = debug_check(g, &w->c)) != DDP_OK)
        return st;
    ddp__fail f = {0};
    bool fused = w->user_op == DDP_AVG && g->ops->fuses_avg;
    w->c.avg_div = fused ? g->world.world_size : 0;
    st = g->ops->run(g->be, &w->c, &f);
    if (st != DDP_OK) {
        poison(g, st, f.msg[0] ? f.msg : ddp_status_str(st), f.peer);
        return st;
    }
    if (w->user_op == DDP_AVG && !fused) {
        size_t n = w->c.kind == DDP__REDUCE_SCATTER || w->c.kind == DDP__ALLREDUCE ? w->c.count : 0;
        ddp__scale_avg(w->c.recv, n, w->c.dtype, g->world.world_size);
    }
    return DDP_OK;
}

static void *progress_main(void *arg)
{
    ddp_group *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->head && !g->stop)
            pthread_cond_wait(&g->cv_work, &g->mu);
        if (!g->head && g->stop)
            break;
        ddp_work *w = g->head;
        pthread_mutex_unlock(&g->mu);
        double t0 = ddp_now_seconds();
        ddp_status st = execute(g, w);
        double t1 = ddp_now_seconds();
        if (w->c.ready) { /* the backend's wait on it is queued (or it failed before) */
            const ddp__devops *d = ddp__group_devops(g, NULL, NULL);
            d->unmark(d->ctx, w->c.ready);
            w->c.ready = NULL;
        }
        pthread_mutex_lock(&g->mu);
        w->t_start = t0;
        w->t_end = t1;
        g->head = w->next;
        if (!g->head)
            g->tail = NULL;
        w->status = st;
        w->done = true;
        g->queued--;
        pthread_cond_broadcast(&g->cv_done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Validates, numbers and either runs (blocking, nothing queued) or queues the collective. */
static ddp_status submit(ddp_group *g, ddp__coll c, ddp_op user_op, bool async, ddp_work **out)
{
    if (!g)
        return DDP_ERR_INVALID;
    ddp_status st = (ddp_status)atomic_load(&g->error);
    if (st != DDP_OK)
        return st;
    const char *what = ddp__kind_name(c.kind);
    if (c.kind != DDP__BARRIER) {
        if ((unsigned)c.dtype >= DDP_DTYPE_COUNT)
            return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "%s: invalid dtype %d", what,
                               (int)c.dtype);
        if (c.count && (!c.recv || (c.kind != DDP__BROADCAST && !c.send)))
            return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "%s: a buffer is NULL", what);
        if (c.count > ((size_t)1 << 40))
            return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "%s: count %zu is too large", what,
                               c.count);
        /* The kernels read and write the elements as their type: a misaligned buffer is
         * undefined behaviour in C (UBSan: "store to misaligned address"), not a slow path. */
        size_t esz = ddp_dtype_size(c.dtype);
        if (c.count && ((uintptr_t)c.recv % esz || (c.send && (uintptr_t)c.send % esz)))
            return ddp__errmsg(g->callmsg, DDP_ERR_INVALID,
                               "%s: a buffer is not aligned to its %s elements (%zu bytes; "
                               "malloc's and ddp_group_alloc's are): send %p, recv %p",
                               what, ddp_dtype_name(c.dtype), esz, c.send, c.recv);
    }
    if ((c.kind == DDP__ALLREDUCE || c.kind == DDP__REDUCE_SCATTER) &&
        (unsigned)user_op >= DDP_OP_COUNT)
        return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "%s: invalid op %d", what, (int)user_op);
    if (c.kind == DDP__BROADCAST && (c.root < 0 || c.root >= g->world.world_size))
        return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "broadcast: root %d is not a rank (0..%d)",
                           c.root, g->world.world_size - 1);
    if (async && !out)
        return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "%s_async: work is NULL", what);
    c.op = user_op == DDP_AVG ? DDP_SUM : user_op;
    c.seq = ++g->seq;

    ddp_work *w = calloc(1, sizeof *w);
    if (!w)
        return ddp__errmsg(g->callmsg, DDP_ERR_NOMEM, "%s: out of memory", what);
    w->g = g;
    w->c = c;
    w->user_op = user_op;

    pthread_mutex_lock(&g->mu);
    bool inline_run = !async && g->queued == 0;
    w->c.background = !inline_run; /* before the progress thread can see w */
    if (!inline_run) {
        if (!g->thread_started) {
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_BLOCK, &all, &old);
            int rc = pthread_create(&g->thread, NULL, progress_main, g);
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            if (rc != 0) {
                pthread_mutex_unlock(&g->mu);
                free(w);
                return ddp__errmsg(g->callmsg, DDP_ERR_SYSTEM,
                                   "cannot start the progress thread: %s", strerror(rc));
            }
            g->thread_started = true;
        }
        /* A GPU group: mark the caller's stream now, on the caller's thread, so the collective
         * waits for the kernels that made its buffers, not for those queued until the progress
         * thread reaches it (backward's later layers: no overlap). Without a mark (it failed:
         * the run's own ordering reports a persistent error), ordered as the stream is then. */
        const ddp__devops *d = ddp__group_devops(g, NULL, NULL);
        if (d && d->mark && w->c.device == DDP_DEVICE_CUDA) {
            char msg[DDP_ERRMSG_MAX];
            if (d->mark(d->ctx, w->c.stream, &w->c.ready, msg) != DDP_OK)
                w->c.ready = NULL;
        }
        if (g->tail)
            g->tail->next = w;
        else
            g->head = w;
        g->tail = w;
        g->queued++;
        pthread_cond_signal(&g->cv_work);
    }
    pthread_mutex_unlock(&g->mu);

    if (inline_run) {
        st = execute(g, w);
        free(w);
        return st;
    }
    if (async) {
        *out = w;
        return DDP_OK;
    }
    st = ddp_work_wait(w);
    ddp_work_free(w);
    return st;
}

ddp_status ddp_work_wait(ddp_work *w)
{
    if (!w)
        return DDP_ERR_INVALID;
    ddp_group *g = w->g;
    /* The deadline is enforced by the backend while the work runs; waiting here is bounded by
     * the work ahead of it, each with its own deadline. */
    pthread_mutex_lock(&g->mu);
    while (!w->done)
        pthread_cond_wait(&g->cv_done, &g->mu);
    ddp_status st = w->status;
    pthread_mutex_unlock(&g->mu);
    return st;
}

bool ddp_work_test(ddp_work *w, ddp_status *status)
{
    if (!w)
        return false;
    pthread_mutex_lock(&w->g->mu);
    bool done = w->done;
    if (done && status)
        *status = w->status;
    pthread_mutex_unlock(&w->g->mu);
    return done;
}

double ddp_now_seconds(void)
{
    return (double)ddp__now_ns() * 1e-9;
}

void ddp_work_timing(const ddp_work *w, double *start, double *end)
{
    double s0 = 0, s1 = 0;
    if (w) {
        pthread_mutex_lock(&w->g->mu);
        s0 = w->t_start;
        s1 = w->t_end;
        pthread_mutex_unlock(&w->g->mu);
    }
    if (start)
        *start = s0;
    if (end)
        *end = s1;
}

void ddp_work_free(ddp_work *w)
{
    if (!w)
        return;
    (void)ddp_work_wait(w);
    free(w);
}

/* ---- the public collectives ----------------------------------------------------------------- */

#define COLL(K, S, R, N, T, OP, ROOT)                                                              \
    (ddp__coll)                                                                                    \
    {                                                                                              \
        .kind = (K), .send = (S), .recv = (R), .count = (N), .dtype = (T),                         \
        .device = g ? g->device : DDP_DEVICE_CPU, .op = (OP), .root = (ROOT),                      \
        .stream = g ? g->stream : NULL /* a NULL g: submit() refuses it */                         \
    }

ddp_status ddp_allreduce(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t,
                         ddp_op op)
{
    return submit(g, COLL(DDP__ALLREDUCE, send, recv, count, t, op, 0), op, false, NULL);
}

ddp_status ddp_broadcast(ddp_group *g, void *buf, size_t count, ddp_dtype t, int root)
{
    return submit(g, COLL(DDP__BROADCAST, buf, buf, count, t, DDP_SUM, root), DDP_SUM, false, NULL);
}

ddp_status ddp_allgather(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t)
{
    return submit(g, COLL(DDP__ALLGATHER, send, recv, count, t, DDP_SUM, 0), DDP_SUM, false, NULL);
}

ddp_status ddp_reduce_scatter(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t,
                              ddp_op op)
{
    return submit(g, COLL(DDP__REDUCE_SCATTER, send, recv, count, t, op, 0), op, false, NULL);
}

ddp_status ddp_barrier(ddp_group *g)
{
    return submit(g, COLL(DDP__BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_SUM, 0), DDP_SUM, false,
                  NULL);
}

ddp_status ddp_allreduce_async(ddp_group *g, const void *send, void *recv, size_t count,
                               ddp_dtype t, ddp_op op, ddp_work **work)
{
    return submit(g, COLL(DDP__ALLREDUCE, send, recv, count, t, op, 0), op, true, work);
}

ddp_status ddp_broadcast_async(ddp_group *g, void *buf, size_t count, ddp_dtype t, int root,
                               ddp_work **work)
{
    return submit(g, COLL(DDP__BROADCAST, buf, buf, count, t, DDP_SUM, root), DDP_SUM, true, work);
}

ddp_status ddp_allgather_async(ddp_group *g, const void *send, void *recv, size_t count,
                               ddp_dtype t, ddp_work **work)
{
    return submit(g, COLL(DDP__ALLGATHER, send, recv, count, t, DDP_SUM, 0), DDP_SUM, true, work);
}

ddp_status ddp_reduce_scatter_async(ddp_group *g, const void *send, void *recv, size_t count,
                                    ddp_dtype t, ddp_op op, ddp_work **work)
{
    return submit(g, COLL(DDP__REDUCE_SCATTER, send, recv, count, t, op, 0), op, true, work);
}

ddp_status ddp_barrier_async(ddp_group *g, ddp_work **work)
{
    return submit(g, COLL(DDP__BARRIER, NULL, NULL, 0, DDP_UINT8, DDP_SUM, 0), DDP_SUM, true, work);
}

/* ---- set-up -------------------------------------------------------------------------------- */

int ddp_group_rank(const ddp_group *g)
{
    return g ? g->world.rank : -1;
}

int ddp_group_size(const ddp_group *g)
{
    return g ? g->world.world_size : 0;
}

int ddp_group_local_size(const ddp_group *g)
{
    return g ? g->world.local_world_size : 0;
}

int ddp_group_host_cores(const ddp_group *g)
{
    return g ? g->host_cores : ddp_own_cores();
}

bool ddp_group_core_to_spare(const ddp_group *g)
{
    /* A helper thread inherits this rank's mask: it needs a second core in it, too. */
    return g && ddp_group_local_size(g) < g->host_cores && ddp_own_cores() > 1;
}

const ddp_world *ddp_group_world(const ddp_group *g)
{
    return g ? &g->world : NULL;
}

const char *ddp_group_backend(const ddp_group *g)
{
    return g && g->backend ? g->backend : "";
}

const char *ddp_group_algorithm(const ddp_group *g, size_t bytes)
{
    if (!g || !g->ops)
        return "";
    if (g->ops->algorithm)
        return g->ops->algorithm(g->be, bytes);
    return ddp_group_backend(g);
}

void ddp_group_set_timeout(ddp_group *g, int timeout_ms)
{
    if (g)
        g->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
}

const char *ddp_group_backend_reason(const ddp_group *g)
{
    return g ? g->reason : "";
}

int ddp_group_cuda_device(const ddp_group *g)
{
    return g && g->device == DDP_DEVICE_CUDA ? g->cuda_device : -1;
}

void ddp_group_set_stream(ddp_group *g, void *cuda_stream)
{
    if (g)
        g->stream = cuda_stream;
}

const ddp__devops *ddp__group_devops(const ddp_group *g, void **stream, int *timeout_ms)
{
    const ddp__devops *d =
        g && g->device == DDP_DEVICE_CUDA && g->ops->devops ? g->ops->devops(g->be) : NULL;
    if (stream)
        *stream = d ? g->stream : NULL;
    if (timeout_ms)
        *timeout_ms = g ? g->timeout_ms : DEFAULT_TIMEOUT_MS;
    return d;
}

ddp_status ddp__group_host_collective(ddp_group *g, bool gather, const void *send, void *recv,
                                      size_t count, ddp_dtype t, ddp_op op)
{
    if (!g || g->device != DDP_DEVICE_CUDA)
        return gather ? ddp_allgather(g, send, recv, count, t)
                      : ddp_allreduce(g, send, recv, count, t, op);
    size_t in = count * ddp_dtype_size(t), out = gather ? in * (size_t)g->world.world_size : in;
    if (in + out > g->scratch_bytes) { /* grown (rarely: the reducer's checks come first) */
        ddp_group_free(g, g->scratch);
        g->scratch_bytes = in + out > 4096 ? in + out : 4096;
        if (!(g->scratch = ddp_group_alloc(g, g->scratch_bytes))) {
            g->scratch_bytes = 0;
            /* the peers are entering this collective: let them fail now, not at the deadline */
            ddp_group_abort(g);
            return ddp__errmsg(
                g->callmsg, DDP_ERR_NOMEM,
                "no GPU memory for %zu bytes of the group's scratch (a collective on "
                "host data through a GPU group); the group was aborted",
                in + out);
        }
    }
    char *d = g->scratch;
    ddp_status st = ddp_group_memcpy(g, d, send, in);
    if (!st)
        st = gather ? ddp_allgather(g, d, d + in, count, t)
                    : ddp_allreduce(g, d, d + in, count, t, op);
    if (!st)
        st = ddp_group_memcpy(g, recv, d + in, out);
    return st;
}

ddp_status ddp_group_memcpy(ddp_group *g, void *dst, const void *src, size_t bytes)
{
    if (!g)
        return DDP_ERR_INVALID;
    if (bytes == 0)
        return DDP_OK;
    if (!dst || !src)
        return ddp__errmsg(g->callmsg, DDP_ERR_INVALID, "ddp_group_memcpy: a pointer is NULL");
    if (!g->ops->copy) {
        memcpy(dst, src, bytes);
        return DDP_OK;
    }
    char msg[DDP_ERRMSG_MAX];
    /* After the work queued on the group's stream (the default stream when none was set): the
     * backend copies on a non-blocking stream of its own, which would not wait for, say, the
     * reducer's zeroing of the gradients there (found by reading: the emulated runtime runs
     * default-stream work at once, so no test here could see it). */
    const ddp__devops *d = ddp__group_devops(g, NULL, NULL);
    ddp_status st = d && d->after ? d->after(d->ctx, g->stream, NULL, msg) : DDP_OK;
    if (st == DDP_OK)
        st = g->ops->copy(g->be, dst, src, bytes, msg);
    if (st != DDP_OK)
        return ddp__errmsg(g->callmsg, st, "ddp_group_memcpy of %zu bytes: %s", bytes, msg);
    return DDP_OK;
}

void *ddp_group_alloc(ddp_group *g, size_t bytes)
{
    if (!g || !g->ops->alloc)
        return NULL;
    return g->ops->alloc(g->be, bytes);
}

void ddp_group_free(ddp_group *g, void *p)
{
    if (g && p && g->ops->free)
        g->ops->free(g->be, p);
}

void ddp_group_abort(ddp_group *g)
{
    ddp__group_abort_why(g, "the group was aborted on this rank (ddp_group_abort)");
}

void ddp_group_abort_reason(ddp_group *g, const char *why)
{
    ddp__group_abort_why(g, why && *why ? why
                                        : "the group was aborted on this rank (ddp_group_abort)");
}

void ddp__group_abort_why(ddp_group *g, const char *why)
{
    if (!g)
        return;
    poison(g, DDP_ERR_CLOSED, why, false);
    /* Peers learn why: the first error if there was one, else why. The message was fixed by
     * poison() above and is not written again. */
    if (g->ops && g->ops->abort)
        g->ops->abort(g->be, g->errmsg);
}

/* ---- failure notices through the store (notice.c) ------------------------------------------ */

static ddp_status notice_error(void *ctx, char *msg, size_t cap, bool *peer)
{
    ddp_group *g = ctx;
    ddp_status st = (ddp_status)atomic_load(&g->error);
    if (st == DDP_OK)
        return DDP_OK;
    pthread_mutex_lock(&g->mu);
    ddp__fmt(msg, cap, "%s", g->errmsg);
    *peer = g->peer_failed;
    pthread_mutex_unlock(&g->mu);
    return st;
}

static void notice_fail(void *ctx, ddp_status st, const char *msg)
{
    ddp_group *g = ctx;
    poison(g, st, msg, true);
    if (g->ops && g->ops->abort)
        g->ops->abort(g->be, g->errmsg);
}

/* Every rank looks a few times a second; a large group less often, so that the store serves
 * about 500 looks a second at most. */
static int notice_poll_ms(int n)
{
    return 250 + 2 * n;
}

void ddp__group_add_dep(ddp_group *g, ddp__group_dep *d)
{
    d->next = g->deps;
    g->deps = d;
}

void ddp__group_remove_dep(ddp_group *g, ddp__group_dep *d)
{
    for (ddp__group_dep **p = &g->deps; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            d->next = NULL;
            return;
        }
}

void ddp_group_destroy(ddp_group *g)
{
    if (!g)
        return;
    /* Reducers still alive (destroyed after their group: the order of creation) give back the
     * group's memory and work now, while the group still works (devops.h). */
    while (g->deps) {
        ddp__group_dep *d = g->deps;
        g->deps = d->next;
        d->next = NULL;
        d->release(d->ctx);
    }
    if (g->thread_started) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_signal(&g->cv_work);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    /* Before the backend: its destroy may wait (bounded) on peers; and a failure of this rank's
     * own is published now if it was not yet (an abort right before destroy). */
    ddp__notice_stop(g->notice);
    g->notice = NULL;
    if (g->scratch)
        ddp_group_free(g, g->scratch);
    if (g->ops)
        g->ops->destroy(g->be);
    /* MPI: finalised by the last group when the library initialised it. After a failure that may
     * leave a collective unfinished or a peer waiting (a timeout, an abort, a lost peer) the job
     * is ended instead (boot.c says why); DDP_ERR_INVALID (mismatched collectives or buffers)
     * fails every rank alike, and they can still finalise together. */
    ddp_status gst = (ddp_status)atomic_load(&g->error);
    if (g->mpi)
        ddp__mpi_boot_close(g->mpi, gst != DDP_OK && gst != DDP_ERR_INVALID ? g->errmsg : NULL);
    if (g->own_store)
        ddp_store_close(g->store);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv_work);
    pthread_cond_destroy(&g->cv_done);
    free(g->ranks);
    free(g);
}

/* Publishes this rank's host id and reads every rank's into hosts (W strings, caller frees).
 * Each record carries its rank's world size ("W host"), so that ranks started with different
 * WORLD_SIZEs (by hand, a stale export on one node) are told at once, on every rank that reads
 * a differing one: before 2026-11-24 the larger world waited for a rank that never comes and the
 * smaller one for a barrier, each until the set-up timeout, neither naming the cause. */
static ddp_status gather_hosts(ddp_group *g, const char *host, char **hosts, ddp_error *err)
{
    char key[128];
    char *mine = NULL;
    int W = g->world.world_size;
    if (asprintf(&mine, "%d %s", W, host) < 0)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
    ddp__fmt(key, sizeof key, "%s/host/%d", g->prefix, g->world.rank);
    ddp_status set = ddp_store_set(g->store, key, mine, strlen(mine));
    free(mine);
    if (set != DDP_OK)
        return ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(g->store));
    for (int r = 0; r < W; r++) {
        ddp__fmt(key, sizeof key, "%s/host/%d", g->prefix, r);
        void *v;
        ddp_status gs = ddp_store_get(g->store, key, &v, NULL);
        if (gs != DDP_OK)
            return ddp__setup_store_failed(g->store, gs, err);
        char *rec = v, *end = NULL;
        long theirs = strtol(rec, &end, 10);
        if (end == rec || *end != ' ') {
            free(v);
            return ddp__err(err, DDP_ERR_INVALID,
                            "group set-up: rank %d published a malformed record under '%s'; run "
                            "the same ddpc on every rank",
                            r, key);
        }
        if (theirs != W) {
            free(v);
            return ddp__err(err, DDP_ERR_INVALID,
                            "group set-up: rank %d was started with WORLD_SIZE=%ld, this rank (%d) "
                            "with %d; give every rank the same WORLD_SIZE (or start them through "
                            "ddprun)",
                            r, theirs, g->world.rank, W);
        }
        memmove(rec, end + 1, strlen(end + 1) + 1);
        hosts[r] = rec;
    }
    return DDP_OK;
}

/* The same through MPI (the job was started by mpirun: there is no store). */
static ddp_status gather_hosts_mpi(ddp_group *g, const char *host, char **hosts, ddp_error *err)
{
    enum { LEN = 256 };
    int W = g->world.world_size;
    char mine[LEN] = {0};
    ddp__fmt(mine, sizeof mine, "%s", host);
    char *all = malloc((size_t)W * LEN);
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
    ddp_status st = ddp__mpi_boot_allgather(g->mpi, mine, all, LEN, err);
    for (int r = 0; st == DDP_OK && r < W; r++) {
        all[(size_t)r * LEN + LEN - 1] = '\0';
        if (!(hosts[r] = strdup(all + (size_t)r * LEN)))
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
    }
    free(all);
    return st;
}

/* Whether Open MPI's mpirun set the world: then set-up can go through MPI. Under srun the world
 * meets through the store (docs/launchers.md): Open MPI under srun needs Slurm's PMIx plugin,
 * which is not exercised here. */
static bool started_by_mpi(const ddp_world *w)
{
    return w->launcher == DDP_LAUNCHER_OMPI;
}

/* GPU groups: every rank's count of visible GPUs (0 when CUDA finds none), so that every rank
 * chooses the backend from the same layout. */
static ddp_status gather_gpus(ddp_group *g, int mine, int *gpus, ddp_error *err)
{
    if (g->mpi) /* set-up through MPI (mpirun): no store */
        return ddp__mpi_boot_allgather(g->mpi, &mine, gpus, sizeof mine, err);
    char key[128], val[16];
    ddp__fmt(key, sizeof key, "%s/gpus/%d", g->prefix, g->world.rank);
    ddp__fmt(val, sizeof val, "%d", mine);
    if (ddp_store_set(g->store, key, val, strlen(val)) != DDP_OK)
        return ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(g->store));
    for (int r = 0; r < g->world.world_size; r++) {
        ddp__fmt(key, sizeof key, "%s/gpus/%d", g->prefix, r);
        void *v;
        size_t len;
        ddp_status gs = ddp_store_get(g->store, key, &v, &len);
        if (gs != DDP_OK)
            return ddp__setup_store_failed(g->store, gs, err);
        char buf[16];
        ddp__fmt(buf, sizeof buf, "%.*s", (int)(len < 15 ? len : 15), (const char *)v);
        free(v);
        long long n;
        if (!ddp__parse_int(buf, 0, 1 << 20, &n))
            return ddp__err(err, DDP_ERR_PROTOCOL,
                            "group set-up: rank %d's GPU count '%s' is "
                            "not a number",
                            r, buf);
        gpus[r] = (int)n;
    }
    return DDP_OK;
}

/* After auto's first choice failed: creates backend b for s under a prefix of its own
 * (PREFIX/suffix; the first attempt's store keys stay behind). refused gets the first choice's
 * failure (`why` when err has none), for the group's reason. */
static ddp_status fall_back(ddp_group *g, const ddp__setup *s, const ddp__backend *b,
                            const char *suffix, const char *why, char *refused, size_t cap,
                            ddp_error *err)
{
    ddp__fmt(refused, cap, "%s", err ? err->msg : why);
    char prefix[256];
    ddp__fmt(prefix, sizeof prefix, "%s/%s", s->m.prefix, suffix);
    ddp__setup s2 = *s;
    s2.m.prefix = prefix;
    return b->create(&s2, &g->be, &g->ops, err);
}

ddp_status ddp_group_init(const ddp_group_opts *opts, ddp_group **out, ddp_error *err)
{
    ddp_group_opts def = DDP_GROUP_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_group_init: out is NULL");
    ddp_group *g = calloc(1, sizeof *g);
    if (!g)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_work, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    ddp_status st;
    char **hosts = NULL;
    int *gpus = NULL;
    int W = 0;

    if (opts->world)
        g->world = *opts->world;
    else if ((st = ddp_world_from_env(&g->world, err)))
        goto out_fail;
    W = g->world.world_size;
    if (W < 1 || g->world.rank < 0 || g->world.rank >= W) { /* a world filled by hand */
        st = ddp__err(err, DDP_ERR_INVALID,
                      "ddp_group_init: rank %d of world_size %d: need 0 ≤ rank < world_size",
                      g->world.rank, W);
        goto out_fail;
    }
    /* Each option: the field when set, else the world's setting (DDP_*), else the default. */
    const ddp_settings *set = &g->world.settings;
    g->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : set->timeout_ms;
    if (g->timeout_ms <= 0)
        g->timeout_ms = DEFAULT_TIMEOUT_MS;
    g->debug = opts->debug >= 0 ? opts->debug != 0 : set->debug != 0;
    g->stall_ms = opts->stall_report_ms ? opts->stall_report_ms : set->stall_report_ms;
    if (g->stall_ms == 0)
        g->stall_ms = DEFAULT_STALL_REPORT_MS;
    g->report = opts->report;
    g->report_ctx = opts->report_ctx;
    g->host_cores = set->host_cores > 0 ? set->host_cores : ddp_own_cores();
    const char *ompi_bound = getenv("OMPI_MCA_orte_bound_at_launch");
    const bool unbound_ompi =
        getenv("OMPI_COMM_WORLD_LOCAL_SIZE") && (!ompi_bound || strcmp(ompi_bound, "0") == 0);
    if (set->host_cores <= 0 && started_by_mpi(&g->world) && g->host_cores == 1 && !unbound_ompi) {
        /* mpirun binds each rank to a core of its own (by default up to one rank per core; it
         * does not bind an oversubscribed job): the host's cores are not just this one. Open MPI
         * says whether it bound the ranks; where it did not, one core in the mask is what the
         * job was confined to (taskset or a cpuset around mpirun --bind-to none), and the ranks
         * share it: counted as the host's cores, shm spun against its peers, 2 ms an allreduce. */
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        if (online > 1)
            g->host_cores = online < (1 << 20) ? (int)online : 1 << 20;
    }
    /* An unknown name fails here, before any rank waits on another. */
    const ddp__backend *named, *chosen;
    if ((st = ddp__backend_lookup(opts->backend ? opts->backend : set->backend, &named, err)))
        goto out_fail;

    /* Set-up meets the peers through MPI when mpirun started the job (and a backend that needs
     * the store was not asked for), else through the store: borrowed, or the job's. Set-up waits
     * are bounded by the group's timeout but at most 5 minutes (a missing rank at start-up should
     * not take 30 minutes to report). */
    int setup_ms = g->timeout_ms < 300000 ? g->timeout_ms : 300000;
    bool via_mpi = !opts->store && started_by_mpi(&g->world) && ddp__mpi_built() &&
                   (!named || named->boot != DDP__BOOT_STORE);
    if (via_mpi) {
        if ((st = ddp__mpi_boot_open(g->world.rank, W, setup_ms, &g->mpi, err)))
            goto out_fail;
        ddp__fmt(g->prefix, sizeof g->prefix, "ddp/mpi%d", ddp__mpi_boot_index(g->mpi));
    } else {
        if (opts->store) {
            g->store = opts->store;
        } else {
            if ((st = ddp_store_open_world(&g->world, setup_ms, &g->store, err)))
                goto out_fail;
            g->own_store = true;
        }
        ddp_store_set_timeout(g->store, setup_ms);

        /* A fresh key prefix per group: the k-th group made by each rank is the same group.
         * Counted per restart of the launcher's group (DDP_RESTART_COUNT), whose store outlives
         * the workers: before 2026-11-25 a rank that failed before making its group left the
         * others' counts one ahead of its successor's, and the restarted ranks set up in two
         * different groups' keys, hanging until the set-up timeout. The first attempt's names
         * are as before. */
        char key[128], at[32] = "";
        if (g->world.restart_count > 0)
            ddp__fmt(at, sizeof at, "a%d/", g->world.restart_count);
        ddp__fmt(key, sizeof key, "ddp/%sgroups/%d", at, g->world.rank);
        int64_t k;
        if (ddp_store_add(g->store, key, 1, &k) != DDP_OK) {
            st = ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(g->store));
            goto out_fail;
        }
        ddp__fmt(g->prefix, sizeof g->prefix, "ddp/%sg%lld", at, (long long)k);
        /* A rank whose own set-up fails says so under this key (out_fail), and every other
         * rank's set-up wait ends at once with its words: they waited the whole set-up timeout
         * (5 min) with "the missing ranks may have failed" until 2026-11-26, where no launcher
         * ended them (by hand, srun). Best effort: a store without it only waits as before. */
        char failkey[sizeof g->prefix + 16];
        ddp__fmt(failkey, sizeof failkey, "%s/setup_failed", g->prefix);
        (void)ddp_store_abort_on(g->store, failkey);
    }

    /* Where the ranks run: every rank's host id. */
    char host[256];
    const char *hid = opts->host_id ? opts->host_id : set->host_id;
    if (hid && *hid) {
        ddp__fmt(host, sizeof host, "%s", hid);
    } else if (gethostname(host, sizeof host) != 0) {
        ddp__fmt(host, sizeof host, "localhost");
    }
    host[sizeof host - 1] = '\0';
    hosts = calloc((size_t)W, sizeof *hosts);
    g->ranks = malloc(sizeof(int) * (size_t)W);
    if (!hosts || !g->ranks) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
        goto out_fail;
    }
    for (int r = 0; r < W; r++)
        g->ranks[r] = r;
    if ((st = g->mpi ? gather_hosts_mpi(g, host, hosts, err) : gather_hosts(g, host, hosts, err)))
        goto out_fail;
    g->device = opts->device;
    g->cuda_device = -1;
    int my_gpus = 0;
    if (g->device == DDP_DEVICE_CUDA) {
        gpus = calloc((size_t)W, sizeof *gpus);
        if (!gpus) {
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory creating a group");
            goto out_fail;
        }
        ddp_error ignored = {0};
        if (set->fake_gpus > 0) /* tests only: see ddp_settings.fake_gpus */
            my_gpus = set->fake_gpus;
        else if (ddp__cuda_device_count(&my_gpus, &ignored) != DDP_OK)
            my_gpus = 0; /* the choice then says which host has none */
        if ((st = gather_gpus(g, my_gpus, gpus, err)))
            goto out_fail;
        g->cuda_device = ddp__gpu_for_local_rank(g->world.local_rank, my_gpus);
    } else if (g->device != DDP_DEVICE_CPU) {
        st = ddp__err(err, DDP_ERR_INVALID, "ddp_group_init: unknown device %d", (int)g->device);
        goto out_fail;
    }

    /* The backend: the one named, or auto's choice for this placement (backends.c). */
    ddp__setup s = {.m = {.me = g->world.rank,
                          .n = W,
                          .ranks = g->ranks,
                          .prefix = g->prefix,
                          .run_id = g->world.run_id,
                          .token = g->world.store_token,
                          .master_addr = g->world.master_addr,
                          .local_addr = set->local_addr},
                    .hosts = (const char *const *)hosts,
                    .store = g->store,
                    .timeout_ms = setup_ms,
                    .arena_bytes = opts->arena_bytes ? opts->arena_bytes : DEFAULT_ARENA,
                    .host_cores = g->host_cores,
                    .shm_flush = set->shm_flush,
                    .mpi = g->mpi,
                    .device = g->device,
                    .gpus = gpus,
                    .cuda_device = g->cuda_device,
                    .cuda_built = ddp__cuda_built || set->fake_gpus > 0,
                    .nccl_built = ddp__nccl_built && set->fake_gpus == 0,
                    .fake_gpu = g->device == DDP_DEVICE_CUDA && set->fake_gpus > 0,
                    .shm_algo = set->shm_algo,
                    .cache_dir = set->cache_dir,
                    .mpi_mode = set->mpi_mode};
    ddp__setup_place(&s);
    char refused[DDP_ERRMSG_MAX] = "";
    if ((st = ddp__backend_choose(named, &s, &chosen, err)))
        goto out_fail;
    st = chosen->create(&s, &g->be, &g->ops, err);
    /* auto's nccl for a group of ONE rank that NCCL could not create (a module built without it,
     * or a machine where NCCL cannot initialise — a sandbox refusing its memory calls): one rank
     * communicates with nobody, so the group runs on cuda-ipc (nothing is mapped at one rank)
     * and its reason says what NCCL said. With more ranks no such guess is safe (the others may
     * have succeeded and wait in NCCL). */
    bool one_rank_fallback = false;
    if (st && st != DDP_ERR_NOMEM && !named && chosen == &ddp__nccl_backend && s.m.n == 1 &&
        ddp__ipc_backend.usable(&s, refused, sizeof refused)) {
        chosen = &ddp__ipc_backend;
        one_rank_fallback = true;
        st = fall_back(g, &s, chosen, "ipc", "nccl refused", refused, sizeof refused, err);
        if (st)
            refused[0] = '\0';
    }
    /* auto's cuda-ipc refused by CUDA on some member (every member knows: its set-up shares
     * each one's result): the group goes through host memory instead, under a prefix of its own
     * (the first attempt's store keys stay behind), and its reason says why */
    if (st == DDP_ERR_NOT_FOUND && !named && chosen == &ddp__ipc_backend &&
        ddp__staged_backend.usable(&s, refused, sizeof refused)) {
        chosen = &ddp__staged_backend;
        st = fall_back(g, &s, chosen, "staged", "cuda-ipc refused", refused, sizeof refused, err);
    } else if (!one_rank_fallback) {
        refused[0] = '\0';
    }
    if (st)
        goto out_fail;
    g->backend = chosen->name;
    /* (DDP_TEST_NOTICE=1: any backend, so that the sanitizer builds, which have no nccl, test
     * the notices inside a group: unit.test_nccl) */
    const char *tn = getenv("DDP_TEST_NOTICE");
    bool notice = chosen->notice || (tn && !strcmp(tn, "1"));
    if (notice && g->store && !getenv("DDP_TEST_NO_NOTICE")) {
        /* An early warning, never a new way to fail: without it a peer's failure is seen at the
         * watchdog's deadline, as before. */
        ddp__notice_hooks h = {.ctx = g, .error = notice_error, .fail = notice_fail};
        ddp_error nerr = {0};
        if (ddp__notice_start(g->store, g->prefix, g->world.rank, notice_poll_ms(W), &h, &g->notice,
                              &nerr) != DDP_OK)
            fprintf(stderr,
                    "ddp: rank %d: no failure notices for this %s group (%s): a peer's failure "
                    "will be seen at the group's timeout\n",
                    g->world.rank, chosen->name, nerr.msg);
    }
    if (one_rank_fallback) {
        ddp__fmt(g->reason, sizeof g->reason,
                 "one rank, and NCCL could not make its communicator (%s): no communication "
                 "needed, so cuda-ipc",
                 refused);
    } else if (refused[0]) { /* what refused, without the hint to use cuda-staged, which auto did */
        char *hint = strstr(refused, "; use backend");
        if (hint)
            *hint = '\0';
        ddp__fmt(g->reason, sizeof g->reason,
                 "ranks share a GPU, and %s: staged through host memory", refused);
    } else {
        ddp__backend_reason(chosen, named != NULL, &s, g->reason, sizeof g->reason);
    }
    const char *detail = g->ops->detail ? g->ops->detail(g->be) : NULL;
    if (detail) {
        size_t used = strlen(g->reason);
        ddp__fmt(g->reason + used, sizeof g->reason - used, "; %s", detail);
    }
    free(gpus);
    gpus = NULL;
    for (int r = 0; r < W; r++)
        free(hosts[r]);
    free(hosts);
    if (g->store) /* set up: the store's waits are the group's users' again */
        (void)ddp_store_abort_on(g->store, NULL);
    *out = g;
    return DDP_OK;

out_fail:
    free(gpus);
    if (hosts)
        for (int r = 0; r < W; r++)
            free(hosts[r]);
    free(hosts);
    g->ops = NULL;
    if (g->store && g->prefix[0]) {
        /* A failure that followed from another rank's (its segment gone, its listener closed:
         * that rank said so first) is reported in that rank's words; else this rank's own is
         * told to the others (the first one's words stay). */
        char failkey[sizeof g->prefix + 16], why[DDP_ERRMSG_MAX];
        ddp__fmt(failkey, sizeof failkey, "%s/setup_failed", g->prefix);
        ddp_store_set_timeout(g->store, 2000);
        if (st != DDP_ERR_CLOSED && st != DDP_ERR_INVALID && /* (a setting: this rank's own) */
            ddp_store_check_abort(g->store) == DDP_ERR_CLOSED) {
            char mine[DDP_ERRMSG_MAX];
            ddp__fmt(mine, sizeof mine, "%s", err ? err->msg : ddp_status_str(st));
            st = ddp__err(err, DDP_ERR_CLOSED, "%s (after: %s)", ddp_store_last_error(g->store),
                          mine);
        } else {
            ddp__fmt(why, sizeof why, "rank %d failed while the group formed: %s", g->world.rank,
                     err && err->msg[0] ? err->msg : ddp_status_str(st));
            (void)ddp_store_compare_set(g->store, failkey, "", 0, why, strlen(why), NULL, NULL);
        }
        (void)ddp_store_abort_on(g->store, NULL);
    }
    /* Under MPI, a set-up step that timed out or broke leaves MPI requests that cannot be
     * cancelled: destroying the group then ends the job, after saying why (boot.c). Errors every
     * rank reaches alike (a backend that cannot run here) let MPI finalise normally. */
    if (g->mpi && (st == DDP_ERR_TIMEOUT || st == DDP_ERR_NETWORK)) {
        ddp__fmt(g->errmsg, sizeof g->errmsg, "%s", err ? err->msg : ddp_status_str(st));
        atomic_store(&g->error, st);
    }
    ddp_group_destroy(g);
    return st;
}
