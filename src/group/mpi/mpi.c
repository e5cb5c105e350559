/*
 * mpi.c — the MPI backend: collectives through the job's MPI (Open MPI from Debian), for jobs
 * started by mpirun or srun. Set-up needs no store (boot.c). Each collective is one MPI call, in
 * one of two modes (DDP_MPI_MODE, member 0's setting for every member):
 *
 *   blocking (default)  MPI_Allreduce, MPI_Bcast, MPI_Allgather, MPI_Reduce_scatter_block,
 *                       MPI_Barrier: Open MPI's tuned algorithms, as fast as MPI itself. The
 *                       call runs on the thread that runs the collective (the caller's, or the
 *                       group's progress thread for asynchronous work, so the reducer's buckets
 *                       still overlap backward). A blocking call cannot be interrupted, so the
 *                       deadline is kept from outside it: a watchdog thread of the backend sees
 *                       the call in progress, writes the stall reports, and at the deadline
 *                       prints the one-line error naming the collective and ends the job with
 *                       MPI_Abort (a timed-out MPI collective cannot be cancelled, and the
 *                       caller's thread is inside it: as torch's NCCL watchdog does).
 *   nonblocking         MPI_Iallreduce, … (Open MPI's libnbc) tested in a loop against the
 *                       deadline: the error returns to the caller, and destroying the group
 *                       ends the job (boot.c). Slower (libnbc's schedules, progressed only
 *                       inside MPI_Test): for programs that must see the error themselves.
 *
 *   float32, float64, int32, int64, uint8   MPI's own types and MPI_SUM/MIN/MAX/PROD
 *   bfloat16, float16 (reductions)          widened to float32, reduced by MPI, rounded once
 *   bfloat16, float16 (moves)               as 16-bit integers
 *   AVG                                     the sum, divided here (fused: before the rounding)
 *
 * Nonblocking waiting: MPI makes progress only inside its calls, so the loop tests the request
 * without a pause for a bounded time (longer while the caller waits and this host's ranks have
 * a CPU each, counted from their affinity masks), then yields the CPU between tests, then naps
 * (wait_req). Blocking mode waits inside Open MPI, which yields only when told to (boot.c tells
 * it when the host's ranks may share CPUs).
 * A timed-out collective cannot be cancelled (MPI has no such call) and MPI cannot finalise
 * without every rank: the group is poisoned, and destroying it ends the job (boot.c).
 * Not here: joining MPI and set-up (boot.c), the hierarchical shm+mpi (hier/hier.c).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "group/mpi/mpi_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

#define MAX_PART ((size_t)1 << 30) /* elements per MPI call: MPI counts are int */
#define WATCH_TICK_MS 100          /* the watchdog looks at least this often */
#define ABORT_GRACE_S 1            /* peers timing out at the same moment print theirs too */

typedef struct mpi_be {
    MPI_Comm comm; /* the members, in member order */
    int me, n;
    int *ranks;    /* (n,) global ranks */
    bool may_spin; /* this host's members have a core each */
    atomic_bool aborted;
    char abort_why[DDP_ERRMSG_MAX];
    bool stuck;  /* a request never completed: nothing more can run */
    float *wide; /* (wide_n,) float32 for 16-bit reductions */
    size_t wide_n;
    void *tmp; /* reduce_scatter's result when it overlaps its input */
    size_t tmp_bytes;
    bool blocking; /* MPI's blocking calls, kept to the deadline by the watchdog */
    int rank;      /* this process's global rank, for the watchdog's line */
    /* The watchdog (blocking mode): cur is the collective whose blocking call is in progress
     * (NULL between calls), set and cleared by the thread making the call; the watchdog reads it
     * (and writes its stall reports) under mu, so cur stays valid while it looks. */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC: stop, and the watchdog's timed sleeps */
    const ddp__coll *cur;
    bool watch_stop, watching;
    int64_t cur_start_ms; /* when cur started, when c->stall does not say */
    bool fired;           /* the deadline of cur passed: the job is being ended */
    char fired_msg[DDP_ERRMSG_MAX];
    pthread_t watcher;
} mpi_be;

static MPI_Datatype mpi_type(ddp_dtype t)
{
    switch (t) {
    case DDP_FLOAT32: return MPI_FLOAT;
    case DDP_FLOAT64: return MPI_DOUBLE;
    case DDP_BFLOAT16:
    case DDP_FLOAT16: return MPI_UINT16_T;
    case DDP_INT32: return MPI_INT32_T;
    case DDP_INT64: return MPI_INT64_T;
    case DDP_UINT8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(ddp_op op)
{
    switch (op) {
    case DDP_MIN: return MPI_MIN;
    case DDP_MAX: return MPI_MAX;
    case DDP_PROD: return MPI_PROD;
    default: return MPI_SUM; /* SUM, and AVG (summed, then divided) */
    }
}

static void describe(const ddp__coll *c, char *buf, size_t cap)
{
    if (c->kind == DDP__BARRIER)
        ddp__fmt(buf, cap, "barrier #%llu", (unsigned long long)c->seq);
    else
        ddp__fmt(buf, cap, "%s #%llu (%s × %zu)", ddp__kind_name(c->kind),
                 (unsigned long long)c->seq, ddp_dtype_name(c->dtype), c->count);
}

static ddp_status fail(ddp__fail *f, ddp_status st, const ddp__coll *c, const char *fmt, ...)
    DDP_PRINTF(4, 5);

/* Fills *f: the collective ("allreduce #12 (float32 × 1024)"), then the formatted rest. */
static ddp_status fail(ddp__fail *f, ddp_status st, const ddp__coll *c, const char *fmt, ...)
{
    char what[160], d[DDP_ERRMSG_MAX];
    describe(c, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(d, sizeof d, fmt, ap);
    va_end(ap);
    f->status = st;
    ddp__fmt(f->msg, sizeof f->msg, "%s %s", what, d);
    return st;
}

static ddp_status mpi_error(mpi_be *b, ddp__fail *f, const ddp__coll *c, const char *call, int rc)
{
    char s[256];
    b->stuck = true; /* after an MPI error, nothing more is safe to start */
    ddp__mpi_errstr(rc, s, sizeof s);
    return fail(f, DDP_ERR_NETWORK, c, "failed in mpi: %s: %s", call, s);
}

/* Nonblocking mode's wait, in three phases by the age of the wait (MPI makes progress only
 * inside its calls, so every phase keeps testing): first a spin, MPI_Test without a pause —
 * SPIN_NS where this host's members have a CPU each and the caller waits, BRIEF_NS otherwise;
 * then sched_yield() between tests until YIELD_NS (at once where the CPU has nothing else to
 * run; where a peer is queued on it, the peer runs: two ranks sharing a CPU no longer spin
 * against each other for a whole time slice); then naps between tests, NAP_MIN_NS doubling up
 * to NAP_MAX_NS, so that a long wait (a late peer) leaves the CPU to others. The progress
 * thread (background) spins BRIEF_NS, then naps NAP_MIN_NS each time, never yielding: the
 * caller's thread, beside it, may need its CPU. */
#define SPIN_NS 200000L
#define BRIEF_NS 20000L
#define YIELD_NS 5000000L
#define NAP_MIN_NS 50000L
#define NAP_MAX_NS 500000L

/* Tests *req until it completes, c's deadline passes, or the group is aborted. */
static ddp_status wait_req(mpi_be *b, MPI_Request *req, const ddp__coll *c, ddp__fail *f)
{
    int64_t spin_ns = b->may_spin && !c->background ? SPIN_NS : BRIEF_NS;
    int64_t t0 = ddp__now_ns(), age = 0;
    long nap = NAP_MIN_NS;
    for (unsigned i = 1;; i++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            b->stuck = true;
            return mpi_error(b, f, c, "MPI_Test", rc);
        }
        if (done)
            return DDP_OK;
        if ((i & 63) != 0 && age < spin_ns)
            continue; /* spinning: the clock and the checks every 64 tests */
        age = ddp__now_ns() - t0;
        if (atomic_load(&b->aborted)) {
            b->stuck = true;
            return fail(f, DDP_ERR_CLOSED, c, "was abandoned: %s", b->abort_why);
        }
        int64_t now = ddp__now_ms();
        if (now >= c->deadline_ms) {
            b->stuck = true;
            char d[32];
            ddp__fmt_duration(d, sizeof d, now - (c->stall ? c->stall->start_ms : now));
            return fail(f, DDP_ERR_TIMEOUT, c,
                        "timed out in mpi after %s: not every rank arrived (MPI does not say "
                        "which); a rank may be hung or stopped, or ranks called different "
                        "collectives (set DDP_DEBUG=1 to check); destroying the group ends the "
                        "job (MPI_Abort)",
                        c->stall ? d : "its deadline");
        }
        if (ddp__stall_due(c, now))
            ddp__stall_report(c, now, "mpi", "not every rank has arrived (MPI does not say which)");
        if (age < spin_ns)
            continue;
        if (!c->background && age < YIELD_NS) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, c->background ? NAP_MIN_NS : nap};
        nanosleep(&ts, NULL);
        nap = nap * 2 < NAP_MAX_NS ? nap * 2 : NAP_MAX_NS;
    }
}

/* ---- blocking mode: the watchdog ------------------------------------------------------------ */

/* The deadline of b->cur passed: says so and ends the job. Called by the watchdog with b->mu
 * held; never returns. The thread inside the blocking call cannot be reached (MPI cannot cancel
 * a collective), so the error cannot be returned to the caller: it is printed, once, as one line,
 * and MPI_Abort makes mpirun end every rank, the stalled one included. MPI_Abort comes from this
 * thread while another may be inside MPI, beyond what MPI_THREAD_SERIALIZED promises; Open MPI's
 * abort goes through its runtime (PMIx to the local daemon), not through the point-to-point
 * engine the other thread is polling, and it is the one call left when that thread never
 * returns. */
static void fire(mpi_be *b, int64_t now)
{
    const ddp__coll *c = b->cur;
    char what[160], d[32];
    describe(c, what, sizeof what);
    ddp__fmt_duration(d, sizeof d, now - (c->stall ? c->stall->start_ms : b->cur_start_ms));
    ddp__fmt(b->fired_msg, sizeof b->fired_msg,
             "%s timed out in mpi after %s: not every rank arrived (MPI does not say which); a "
             "rank may be hung or stopped, or ranks called different collectives (set "
             "DDP_DEBUG=1 to check); ending the MPI job (MPI_Abort): a blocking MPI call cannot "
             "be cancelled",
             what, d);
    b->fired = true;
    pthread_mutex_unlock(&b->mu);
    fprintf(stderr, "ddp: rank %d: %s\n", b->rank, b->fired_msg);
    fflush(stderr);
    struct timespec grace = {ABORT_GRACE_S, 0};
    while (nanosleep(&grace, &grace) != 0)
        ;
    MPI_Abort(MPI_COMM_WORLD, 1);
    /* MPI_Abort does not return; were it to, a process with a thread stuck inside MPI could
     * only hang, which the group never does. */
    _exit(1);
}

/* The watchdog: wakes at the call's deadline, at its next stall report, and at least every
 * WATCH_TICK_MS (a call that started while it slept is seen within that; starting one costs the
 * caller a lock, not a wake-up). */
static void *watch_main(void *arg)
{
    mpi_be *b = arg;
    pthread_mutex_lock(&b->mu);
    while (!b->watch_stop) {
        int64_t now = ddp__now_ms(), wake = now + WATCH_TICK_MS;
        const ddp__coll *c = b->cur;
        if (c && now >= c->deadline_ms)
            fire(b, now); /* does not return */
        if (c && ddp__stall_due(c, now))
            ddp__stall_report(c, now, "mpi", "not every rank has arrived (MPI does not say which)");
        if (c && ddp__stall_wake(c, c->deadline_ms) < wake)
            wake = ddp__stall_wake(c, c->deadline_ms);
        struct timespec ts = {(time_t)(wake / 1000), (long)(wake % 1000) * 1000000L};
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Around each blocking call: cur names it for the watchdog. */
static void watch_begin(mpi_be *b, const ddp__coll *c)
{
    pthread_mutex_lock(&b->mu);
    b->cur = c;
    b->cur_start_ms = c->stall ? 0 : ddp__now_ms(); /* the stall record has the start */
    pthread_mutex_unlock(&b->mu);
}

/* After the call returned: a timeout when the watchdog fired meanwhile (the call came back in
 * the grace second before the job ends). */
static ddp_status watch_end(mpi_be *b, ddp__fail *f)
{
    pthread_mutex_lock(&b->mu);
    b->cur = NULL;
    bool fired = b->fired;
    if (fired) {
        f->status = DDP_ERR_TIMEOUT;
        ddp__fmt(f->msg, sizeof f->msg, "%s", b->fired_msg);
    }
    pthread_mutex_unlock(&b->mu);
    if (!fired)
        return DDP_OK;
    b->stuck = true;
    return DDP_ERR_TIMEOUT;
}

/* ---- one MPI call, in either mode ------------------------------------------------------------ */

/* The arguments of one MPI collective: c->kind says which. */
typedef struct mpi_args {
    const void *send; /* MPI_IN_PLACE where MPI's in-place form applies */
    void *recv;
    int count;
    MPI_Datatype type;
    MPI_Op op;
    int root;
} mpi_args;

/* Runs c->kind's MPI collective with a's arguments: the blocking call under the watchdog, or the
 * non-blocking one tested against the deadline. */
static ddp_status call(mpi_be *b, const ddp__coll *c, const mpi_args *a, ddp__fail *f)
{
    static const char *const names[2][DDP__KIND_COUNT] = {
        {"MPI_Iallreduce", "MPI_Ibcast", "MPI_Iallgather", "MPI_Ireduce_scatter_block",
         "MPI_Ibarrier"},
        {"MPI_Allreduce", "MPI_Bcast", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Barrier"}};
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Request *r = b->blocking ? NULL : &req;
    int rc;
    if (b->blocking)
        watch_begin(b, c);
    switch (c->kind) {
    case DDP__ALLREDUCE:
        rc = r ? MPI_Iallreduce(a->send, a->recv, a->count, a->type, a->op, b->comm, r)
               : MPI_Allreduce(a->send, a->recv, a->count, a->type, a->op, b->comm);
        break;
    case DDP__BROADCAST:
        rc = r ? MPI_Ibcast(a->recv, a->count, a->type, a->root, b->comm, r)
               : MPI_Bcast(a->recv, a->count, a->type, a->root, b->comm);
        break;
    case DDP__ALLGATHER:
        rc = r ? MPI_Iallgather(a->send, a->count, a->type, a->recv, a->count, a->type, b->comm, r)
               : MPI_Allgather(a->send, a->count, a->type, a->recv, a->count, a->type, b->comm);
        break;
    case DDP__REDUCE_SCATTER:
        rc = r ? MPI_Ireduce_scatter_block(a->send, a->recv, a->count, a->type, a->op, b->comm, r)
               : MPI_Reduce_scatter_block(a->send, a->recv, a->count, a->type, a->op, b->comm);
        break;
    default: rc = r ? MPI_Ibarrier(b->comm, r) : MPI_Barrier(b->comm); break;
    }
    const char *name = names[b->blocking][(unsigned)c->kind < DDP__KIND_COUNT ? c->kind : 4];
    if (b->blocking) {
        ddp_status st = watch_end(b, f);
        if (st)
            return st;
    }
    if (rc != MPI_SUCCESS)
        return mpi_error(b, f, c, name, rc);
    return r ? wait_req(b, r, c, f) : DDP_OK;
}

/* Makes room for n float32 (16-bit reductions). */
static bool wide_room(mpi_be *b, size_t n)
{
    if (n <= b->wide_n)
        return true;
    float *p = realloc(b->wide, n * sizeof *p);
    if (!p)
        return false;
    b->wide = p;
    b->wide_n = n;
    return true;
}

static ddp_status nomem(ddp__fail *f, const ddp__coll *c, size_t bytes)
{
    return fail(f, DDP_ERR_NOMEM, c, "failed in mpi: no memory for %zu bytes of scratch", bytes);
}

/* allreduce of n elements of t at send → recv (send == recv: in place), in parts MPI can count. */
static ddp_status allreduce(mpi_be *b, const ddp__coll *c, const void *send, void *recv, size_t n,
                            ddp_dtype t, ddp__fail *f)
{
    size_t esz = ddp_dtype_size(t);
    for (size_t off = 0; off < n; off += MAX_PART) {
        size_t k = n - off < MAX_PART ? n - off : MAX_PART;
        mpi_args a = {.send = send == recv ? MPI_IN_PLACE : (const char *)send + off * esz,
                      .recv = (char *)recv + off * esz,
                      .count = (int)k,
                      .type = mpi_type(t),
                      .op = mpi_op(c->op)};
        ddp_status st = call(b, c, &a, f);
        if (st)
            return st;
    }
    return DDP_OK;
}

static bool is16(ddp_dtype t)
{
    return t == DDP_BFLOAT16 || t == DDP_FLOAT16;
}

static ddp_status run_allreduce(mpi_be *b, const ddp__coll *c, ddp__fail *f)
{
    ddp_status st;
    if (is16(c->dtype)) { /* in float32, rounded once at the end */
        if (!wide_room(b, c->count))
            return nomem(f, c, c->count * sizeof(float));
        ddp__to_f32(b->wide, c->send, c->count, c->dtype);
        if ((st = allreduce(b, c, b->wide, b->wide, c->count, DDP_FLOAT32, f)))
            return st;
        ddp__scale_avg(b->wide, c->count, DDP_FLOAT32, c->avg_div);
        ddp__from_f32(c->recv, b->wide, c->count, c->dtype);
        return DDP_OK;
    }
    if ((st = allreduce(b, c, c->send, c->recv, c->count, c->dtype, f)))
        return st;
    ddp__scale_avg(c->recv, c->count, c->dtype, c->avg_div);
    return DDP_OK;
}

static ddp_status run_broadcast(mpi_be *b, const ddp__coll *c, ddp__fail *f)
{
    size_t esz = ddp_dtype_size(c->dtype);
    for (size_t off = 0; off < c->count; off += MAX_PART) {
        size_t k = c->count - off < MAX_PART ? c->count - off : MAX_PART;
        mpi_args a = {.recv = (char *)c->recv + off * esz,
                      .count = (int)k,
                      .type = mpi_type(c->dtype),
                      .root = c->root};
        ddp_status st = call(b, c, &a, f);
        if (st)
            return st;
    }
    return DDP_OK;
}

static ddp_status run_allgather(mpi_be *b, const ddp__coll *c, ddp__fail *f)
{
    size_t esz = ddp_dtype_size(c->dtype);
    if (c->count > INT_MAX)
        return fail(f, DDP_ERR_INVALID, c, "%s",
                    "is too large for MPI (counts are int): split it into smaller calls");
    const void *s = (const char *)c->send == (const char *)c->recv + (size_t)b->me * c->count * esz
                        ? MPI_IN_PLACE
                        : c->send;
    mpi_args a = {.send = s, .recv = c->recv, .count = (int)c->count, .type = mpi_type(c->dtype)};
    return call(b, c, &a, f);
}

static ddp_status run_reduce_scatter(mpi_be *b, const ddp__coll *c, ddp__fail *f)
{
    size_t n = c->count, W = (size_t)b->n;
    if (n > INT_MAX)
        return fail(f, DDP_ERR_INVALID, c, "%s",
                    "is too large for MPI (counts are int): split it into smaller calls");
    ddp_dtype t = c->dtype;
    const void *send = c->send;
    if (is16(t)) { /* the whole input widened; the result lands in its first n floats' place */
        if (!wide_room(b, W * n + n))
            return nomem(f, c, (W * n + n) * sizeof(float));
        ddp__to_f32(b->wide, send, W * n, t);
        send = b->wide;
        t = DDP_FLOAT32;
    }
    size_t esz = ddp_dtype_size(t);
    /* MPI's in-place form keeps the result at the front of the input, not at this rank's part:
     * a result that overlaps the input goes through scratch. */
    void *out = is16(c->dtype) ? (void *)(b->wide + W * n) : c->recv;
    const char *sb = send, *rb = out;
    bool overlap = rb < sb + W * n * esz && sb < rb + n * esz;
    if (overlap) {
        if (n * esz > b->tmp_bytes) {
            void *p = realloc(b->tmp, n * esz);
            if (!p)
                return nomem(f, c, n * esz);
            b->tmp = p;
            b->tmp_bytes = n * esz;
        }
        out = b->tmp;
    }
    mpi_args a = {
        .send = send, .recv = out, .count = (int)n, .type = mpi_type(t), .op = mpi_op(c->op)};
    ddp_status st = call(b, c, &a, f);
    if (st)
        return st;
    ddp__scale_avg(out, n, t, c->avg_div);
    if (is16(c->dtype))
        ddp__from_f32(c->recv, out, n, c->dtype);
    else if (overlap)
        memcpy(c->recv, out, n * esz);
    return DDP_OK;
}

static ddp_status mpi_run(void *bep, const ddp__coll *c, ddp__fail *f)
{
    mpi_be *b = bep;
    if (atomic_load(&b->aborted))
        return fail(f, DDP_ERR_CLOSED, c, "was not started: %s", b->abort_why);
    if (b->stuck)
        return fail(f, DDP_ERR_CLOSED, c, "%s",
                    "was not started: an earlier collective never completed in mpi");
    if (c->device != DDP_DEVICE_CPU)
        return fail(f, DDP_ERR_INVALID, c, "%s", "failed: the mpi backend moves host memory only");
    if (c->kind != DDP__BARRIER && c->count == 0 && c->kind != DDP__ALLGATHER &&
        c->kind != DDP__REDUCE_SCATTER)
        return DDP_OK; /* nothing to move; every rank returns at once alike */
    switch (c->kind) {
    case DDP__ALLREDUCE: return run_allreduce(b, c, f);
    case DDP__BROADCAST: return run_broadcast(b, c, f);
    case DDP__ALLGATHER: return run_allgather(b, c, f);
    case DDP__REDUCE_SCATTER: return run_reduce_scatter(b, c, f);
    case DDP__BARRIER: {
        mpi_args a = {0};
        return call(b, c, &a, f);
    }
    default: return fail(f, DDP_ERR_INVALID, c, "%s", "is not a collective the mpi backend knows");
    }
}

static void mpi_abort_be(void *bep, const char *why)
{
    mpi_be *b = bep;
    if (!atomic_load(&b->aborted)) {
        ddp__fmt(b->abort_why, sizeof b->abort_why, "the group was aborted on this rank (%s)",
                 why && *why ? why : "ddp_group_abort");
        atomic_store(&b->aborted, true);
    }
}

static void mpi_destroy(void *bep)
{
    mpi_be *b = bep;
    if (!b)
        return;
    if (b->watching) { /* after a timeout the watchdog is ending the job: this waits for that */
        pthread_mutex_lock(&b->mu);
        b->watch_stop = true;
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->watcher, NULL);
    }
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    /* A stuck request still owns its buffers and the communicator: leave both to the job's end
     * (boot.c ends it when the group failed). */
    if (!b->stuck) {
        if (b->comm != MPI_COMM_NULL)
            MPI_Comm_free(&b->comm);
        free(b->wide);
        free(b->tmp);
    }
    free(b->ranks);
    free(b);
}

static const ddp__backend_ops mpi_ops = {
    .name = "mpi",
    .run = mpi_run,
    .abort = mpi_abort_be,
    .destroy = mpi_destroy,
    .fuses_avg = true,
};

static bool mpi_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (s->mpi)
        return true;
    ddp__fmt(why, cap,
             "needs processes started by an MPI launcher (mpirun, or srun with PMI): ddprun's "
             "workers cannot form an MPI world with Open MPI 4.1 (docs/group.md); start the job "
             "with 'mpirun -np N', or use backend 'auto' under ddprun");
    return false;
}

/* Sets b->may_spin: whether this host's members have a CPU each, counted from the CPUs they
 * may actually run on — the union of their affinity masks, gathered over b->comm — and at most
 * s->host_cores. The host's core count is not enough: mpirun binds each rank to a core of its
 * own (a mask of one CPU each, the union as many CPUs as ranks), but a job confined to one CPU
 * (taskset around mpirun --bind-to none, a cpuset cgroup) gives every rank that same CPU, and
 * spinning ranks that share a CPU starve each other (bench/RESULTS.md, "How the mpi backend
 * waits"). Bounded by the set-up deadline, like the rest of set-up. */
static ddp_status decide_spin(mpi_be *b, const ddp__setup *s, ddp_error *err)
{
    const ddp__members *m = &s->m;
    int cores = s->host_cores > 0 ? s->host_cores : 1;
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0)
        CPU_ZERO(&mine); /* unknown: counts nothing of its own below */
    cpu_set_t *all = calloc((size_t)m->n, sizeof *all);
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the mpi backend");
    MPI_Request req;
    int rc = MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                            b->comm, &req);
    ddp_status st =
        rc == MPI_SUCCESS ? ddp__mpi_poll(&req, ddp__now_ms() + s->timeout_ms) : DDP_ERR_NETWORK;
    if (st == DDP_OK) {
        cpu_set_t host;
        CPU_ZERO(&host);
        int local = 0; /* members on my host (hier gives one per host: then just me) */
        for (int i = 0; i < m->n; i++)
            if (s->hosts ? strcmp(s->hosts[i], s->hosts[m->me]) == 0 : i == m->me) {
                CPU_OR(&host, &host, &all[i]);
                local++;
            }
        int n = CPU_COUNT(&host);
        if (n > 0 && n < cores)
            cores = n;
        b->may_spin = local <= cores;
    }
    if (st == DDP_ERR_TIMEOUT) {
        /* The request is still active (MPI cannot cancel it): its buffer and the communicator
         * stay, for the job's end (boot.c). */
        b->stuck = true;
        char d[32];
        ddp__fmt_duration(d, sizeof d, s->timeout_ms);
        return ddp__err(err, st,
                        "mpi set-up: gathering the members' CPUs timed out after %s: a member "
                        "has not reached it (or failed before it)",
                        d);
    }
    free(all);
    if (st) {
        char e[256] = "";
        if (rc != MPI_SUCCESS)
            ddp__mpi_errstr(rc, e, sizeof e);
        return ddp__err(err, DDP_ERR_NETWORK, "mpi set-up: gathering the members' CPUs failed%s%s",
                        *e ? ": " : "", e);
    }
    return DDP_OK;
}

static ddp_status mpi_create(const ddp__setup *s, void **out, const ddp__backend_ops **ops,
                             ddp_error *err)
{
    const ddp__members *m = &s->m;
    if (!s->mpi)
        return ddp__err(err, DDP_ERR_INVALID, "backend 'mpi' needs an MPI launcher (mpirun)");
    /* Member 0's mode, for every member (below): blocking and non-blocking collectives do not
     * match each other in MPI. A bad value fails here, before any member waits. */
    const char *mode = s->mpi_mode && *s->mpi_mode ? s->mpi_mode : "blocking";
    char blocking = !strcmp(mode, "blocking");
    if (!blocking && strcmp(mode, "nonblocking") != 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "DDP_MPI_MODE must be blocking or nonblocking, not '%s'", mode);
    mpi_be *b = calloc(1, sizeof *b);
    if (!b || !(b->ranks = malloc(sizeof(int) * (size_t)m->n))) {
        free(b);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the mpi backend");
    }
    pthread_mutex_init(&b->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* ddp__now_ms()'s clock */
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    b->comm = MPI_COMM_NULL;
    b->me = m->me;
    b->n = m->n;
    b->rank = m->ranks[m->me];
    memcpy(b->ranks, m->ranks, sizeof(int) * (size_t)m->n);
    ddp_status st = ddp__mpi_boot_comm_of(s->mpi, m->ranks, m->n, m->me, &b->comm, err);
    if (st) {
        b->comm = MPI_COMM_NULL;
        mpi_destroy(b);
        return st;
    }
    if ((st = decide_spin(b, s, err))) {
        mpi_destroy(b);
        return st;
    }
    if ((st = ddp__mpi_boot_bcast(s->mpi, m->ranks, m->n, m->me, &blocking, 1, err))) {
        mpi_destroy(b);
        return st;
    }
    b->blocking = blocking != 0;
    if (b->blocking) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old); /* signals stay the program's threads' */
        int rc = pthread_create(&b->watcher, NULL, watch_main, b);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0) {
            mpi_destroy(b);
            return ddp__err(err, DDP_ERR_SYSTEM, "cannot start the mpi backend's watchdog: %s",
                            strerror(rc));
        }
        b->watching = true;
    }
    *out = b;
    *ops = &mpi_ops;
    return DDP_OK;
}

const ddp__backend ddp__mpi_backend = {
    .name = "mpi",
    .usable = mpi_usable,
    .create = mpi_create,
    .boot = DDP__BOOT_MPI,
};
