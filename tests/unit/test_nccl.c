/*
 * test_nccl.c — the GPU backends' logic that needs no GPU (src/group/nccl/watchdog.c,
 * src/group/staged/staged.c): NCCL's unique id through a real store (fake id bytes); the
 * watchdog's state machine over a fake communicator whose error and progress the test controls
 * (stuck → abort and a message by the deadline, error → abort and the NCCL message, healthy →
 * nothing), by hand and on its thread; the messages; and the cuda-staged backend's staging of
 * each collective through a small host buffer, with memcpy as the "device" copies and a fake
 * host backend that acts as n ranks holding known data; a cuda-staged group on the fake GPU
 * whose pinning is refused; cuda-ipc's devops on the fake GPU (a region opened by another
 * process, the fixed-order reduction's arithmetic) and a one-rank cuda-ipc group in many chunks.
 * Nothing here touches CUDA.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "group/group_int.h"
#include "group/nccl/nccl_int.h"
#include "group/staged/staged_int.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/util.h"

/* ---- the unique id through the store -------------------------------------------------------- */

static ddp_status make_fake(void *ctx, void *id, size_t n, ddp_error *err)
{
    (void)err;
    int *calls = ctx;
    (*calls)++;
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)id)[i] = (unsigned char)(i * 7 + 3);
    return DDP_OK;
}

static ddp_status make_broken(void *ctx, void *id, size_t n, ddp_error *err)
{
    (void)ctx;
    (void)id;
    (void)n;
    return ddp__err(err, DDP_ERR_SYSTEM, "nccl: ncclGetUniqueId failed: no network");
}

typedef struct uid_fixture {
    ddp_store_server *srv;
    ddp_store *a, *b; /* rank 0's and rank 1's connections */
} uid_fixture;

static void uid_setup(uid_fixture *f)
{
    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = "127.0.0.1";
    so.token = "tok";
    assert_int_equal(ddp_store_server_start(&so, &f->srv, NULL), DDP_OK);
    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.port = ddp_store_server_port(f->srv);
    o.token = "tok";
    o.timeout_ms = 5000;
    assert_int_equal(ddp_store_connect(&o, &f->a, NULL), DDP_OK);
    assert_int_equal(ddp_store_connect(&o, &f->b, NULL), DDP_OK);
}

static void uid_teardown(uid_fixture *f)
{
    ddp_store_close(f->a);
    ddp_store_close(f->b);
    ddp_store_server_stop(f->srv);
}

static void uid_exchange(void **state)
{
    (void)state;
    uid_fixture f;
    uid_setup(&f);
    ddp_error err = {0};
    unsigned char id0[128], id1[128];
    memset(id1, 0, sizeof id1);
    int calls = 0;
    /* Rank 0 makes and publishes; rank 1 reads the same bytes; only rank 0 calls make. */
    assert_int_equal(
        ddp__nccl_uid_exchange(f.a, "ddp/g1", 0, 2000, make_fake, &calls, id0, sizeof id0, &err),
        DDP_OK);
    assert_int_equal(
        ddp__nccl_uid_exchange(f.b, "ddp/g1", 1, 2000, make_fake, &calls, id1, sizeof id1, &err),
        DDP_OK);
    assert_int_equal(calls, 1);
    assert_memory_equal(id0, id1, sizeof id0);
    assert_int_equal(id1[5], 5 * 7 + 3);
    char key[64];
    ddp__nccl_uid_key(key, sizeof key, "ddp/g1");
    assert_string_equal(key, "ddp/g1/nccl/uid");

    /* Another group's prefix has no id yet: rank 1 waits the deadline and says for what. */
    int64_t t0 = ddp__now_ms();
    assert_int_equal(
        ddp__nccl_uid_exchange(f.b, "ddp/g2", 1, 300, make_fake, &calls, id1, sizeof id1, &err),
        DDP_ERR_TIMEOUT);
    int64_t took = ddp__now_ms() - t0;
    assert_true(took >= 250 && took < 10000);
    assert_non_null(strstr(err.msg, "nccl: waiting for rank 0's unique id 'ddp/g2/nccl/uid'"));
    assert_non_null(strstr(err.msg, "HINT"));

    /* An id of another size (another NCCL build): refused, naming both sizes. */
    assert_int_equal(
        ddp__nccl_uid_exchange(f.a, "ddp/g3", 0, 2000, make_fake, &calls, id0, 16, &err), DDP_OK);
    memset(id1, 0xee, sizeof id1);
    assert_int_equal(
        ddp__nccl_uid_exchange(f.b, "ddp/g3", 1, 2000, make_fake, &calls, id1, sizeof id1, &err),
        DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "is 16 bytes, this rank's NCCL expects 128"));
    assert_int_equal(id1[0], 0xee); /* not written on failure */

    /* Rank 0's make fails: its error, nothing published. */
    assert_int_equal(
        ddp__nccl_uid_exchange(f.a, "ddp/g4", 0, 2000, make_broken, NULL, id0, sizeof id0, &err),
        DDP_ERR_SYSTEM);
    assert_string_equal(err.msg, "nccl: ncclGetUniqueId failed: no network");
    bool have = true;
    const char *k4 = "ddp/g4/nccl/uid";
    assert_int_equal(ddp_store_check(f.a, &k4, 1, &have), DDP_OK);
    assert_false(have);
    uid_teardown(&f);
}

/* ---- the watchdog over a fake communicator -------------------------------------------------- */

typedef struct fake_comm {
    atomic_int error;  /* DDP_OK: healthy */
    atomic_int aborts; /* how many times abort was called */
    atomic_int queries;
    _Atomic int64_t abort_ms; /* ddp__now_ms() at the first abort (0: none) */
} fake_comm;

/* An "event" is an atomic flag: done when set. */
typedef struct fake_ev {
    atomic_bool done;
} fake_ev;

/* DDP_ERR_NETWORK stands for ncclRemoteError: another rank's failure (peer). */
static ddp_status fake_async_error(void *ctx, char *msg, size_t cap, bool *peer)
{
    fake_comm *c = ctx;
    atomic_fetch_add(&c->queries, 1);
    ddp_status st = (ddp_status)atomic_load(&c->error);
    if (st != DDP_OK)
        ddp__fmt(msg, cap, "NCCL reports remote process exited or there was a network error");
    *peer = st == DDP_ERR_NETWORK;
    return st;
}

static bool fake_done(void *ctx, void *ev)
{
    (void)ctx;
    return atomic_load(&((fake_ev *)ev)->done);
}

static void fake_abort(void *ctx)
{
    fake_comm *c = ctx;
    int64_t none = 0;
    atomic_compare_exchange_strong(&c->abort_ms, &none, ddp__now_ms());
    atomic_fetch_add(&c->aborts, 1);
}

static ddp__wd_comm fake_wd(fake_comm *c)
{
    atomic_init(&c->error, DDP_OK);
    atomic_init(&c->aborts, 0);
    atomic_init(&c->queries, 0);
    atomic_init(&c->abort_ms, 0);
    return (ddp__wd_comm){
        .ctx = c, .async_error = fake_async_error, .done = fake_done, .abort = fake_abort};
}

static ddp__coll coll(ddp__kind k, uint64_t seq, size_t count, int64_t deadline)
{
    return (ddp__coll){.kind = k,
                       .seq = seq,
                       .count = count,
                       .dtype = DDP_FLOAT32,
                       .device = DDP_DEVICE_CUDA,
                       .deadline_ms = deadline};
}

static void watchdog_healthy(void **state)
{
    (void)state;
    fake_comm fc;
    ddp__wd_comm wc = fake_wd(&fc);
    ddp__watchdog *wd = calloc(1, sizeof *wd);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 3, 0, NULL), DDP_OK);
    fake_ev ev;
    atomic_init(&ev.done, false);
    ddp__coll c = coll(DDP__ALLREDUCE, 1, 1024, 1000);
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 0), DDP_OK);
    /* In flight, before its deadline, communicator healthy: nothing. */
    assert_int_equal(ddp__watchdog_step(wd, 500), DDP_OK);
    assert_int_equal(atomic_load(&fc.aborts), 0);
    /* Finished: forgotten, so even far past its deadline nothing happens. */
    atomic_store(&ev.done, true);
    assert_int_equal(ddp__watchdog_step(wd, 600), DDP_OK);
    assert_int_equal(ddp__watchdog_step(wd, 100000), DDP_OK);
    assert_int_equal(atomic_load(&fc.aborts), 0);
    char msg[DDP_ERRMSG_MAX] = "";
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, NULL), DDP_OK);
    assert_string_equal(msg, "");
    /* Untracked by the owner: likewise. */
    atomic_store(&ev.done, false);
    c = coll(DDP__BROADCAST, 2, 8, 2000);
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 1000), DDP_OK);
    ddp__watchdog_untrack(wd, 2);
    assert_int_equal(ddp__watchdog_step(wd, 5000), DDP_OK);
    /* The table has room for DDP__WD_MAX in flight, then says no. */
    for (int i = 0; i < DDP__WD_MAX; i++) {
        c = coll(DDP__ALLREDUCE, 10 + (uint64_t)i, 8, 100000);
        assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 5000), DDP_OK);
    }
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 5000), DDP_ERR_INVALID);
    assert_int_equal(ddp__watchdog_error(wd, NULL, 0, NULL),
                     DDP_OK); /* not a failure of the group */
    ddp__watchdog_stop(wd);
    ddp__watchdog_stop(wd); /* twice is harmless */
    free(wd);
}

static void watchdog_stuck(void **state)
{
    (void)state;
    fake_comm fc;
    ddp__wd_comm wc = fake_wd(&fc);
    ddp__watchdog *wd = calloc(1, sizeof *wd);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 3, 0, NULL), DDP_OK);
    fake_ev done, stuck;
    atomic_init(&done.done, true);
    atomic_init(&stuck.done, false);
    ddp__coll a = coll(DDP__ALLREDUCE, 6, 4, 31000), b = coll(DDP__ALLREDUCE, 7, 1024, 31000);
    assert_int_equal(ddp__watchdog_track(wd, &a, &done, 1000), DDP_OK);
    assert_int_equal(ddp__watchdog_track(wd, &b, &stuck, 1000), DDP_OK);
    assert_int_equal(ddp__watchdog_step(wd, 30999), DDP_OK);
    /* At its deadline: aborted once, and the message names the operation, #, rank, time. */
    assert_int_equal(ddp__watchdog_step(wd, 31000), DDP_ERR_TIMEOUT);
    assert_int_equal(atomic_load(&fc.aborts), 1);
    char msg[DDP_ERRMSG_MAX];
    bool tpeer = true;
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, &tpeer), DDP_ERR_TIMEOUT);
    assert_false(tpeer); /* this rank's own time-out */
    assert_string_equal(msg, "rank 3: nccl: allreduce #7 (float32 × 1024) timed out after 30 s "
                             "on the GPU: the communicator was aborted; HINT: a rank may be dead, "
                             "stopped or calling a different collective (set DDP_DEBUG=1 to "
                             "check); the others' logs say which");
    /* Sticky: later steps keep the first failure and never abort twice; new work is refused. */
    atomic_store(&fc.error, DDP_ERR_NETWORK);
    assert_int_equal(ddp__watchdog_step(wd, 40000), DDP_ERR_TIMEOUT);
    assert_int_equal(atomic_load(&fc.aborts), 1);
    ddp__coll c = coll(DDP__BARRIER, 8, 0, 99999);
    assert_int_equal(ddp__watchdog_track(wd, &c, &done, 40000), DDP_ERR_TIMEOUT);
    /* An abort from outside after that changes nothing either. */
    ddp__watchdog_fail(wd, DDP_ERR_CLOSED, "rank 3: nccl: the group was aborted: bye", false);
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, NULL), DDP_ERR_TIMEOUT);
    assert_int_equal(atomic_load(&fc.aborts), 1);
    ddp__watchdog_stop(wd);
    free(wd);
}

static void watchdog_error(void **state)
{
    (void)state;
    fake_comm fc;
    ddp__wd_comm wc = fake_wd(&fc);
    ddp__watchdog *wd = calloc(1, sizeof *wd);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 1, 0, NULL), DDP_OK);
    fake_ev ev;
    atomic_init(&ev.done, false);
    ddp__coll c = coll(DDP__REDUCE_SCATTER, 12, 256, 1000000);
    c.dtype = DDP_BFLOAT16;
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 0), DDP_OK);
    atomic_store(&fc.error, DDP_ERR_NETWORK);
    /* Long before the deadline: the communicator's error is enough. */
    assert_int_equal(ddp__watchdog_step(wd, 10), DDP_ERR_NETWORK);
    assert_int_equal(atomic_load(&fc.aborts), 1);
    char msg[DDP_ERRMSG_MAX];
    bool peer = false;
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, &peer), DDP_ERR_NETWORK);
    assert_true(peer); /* ncclRemoteError: another rank's failure (ddp_group_peer_failed) */
    assert_string_equal(msg, "rank 1: nccl: reduce_scatter #12 (bfloat16 × 256) failed: NCCL "
                             "reports remote process exited or there was a network error; the "
                             "communicator was aborted; HINT: the other ranks' logs say which "
                             "rank failed first; the group cannot be used again");
    ddp__watchdog_stop(wd);

    /* While idle: named by the last collective. */
    fake_comm fc2;
    wc = fake_wd(&fc2);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 0, 0, NULL), DDP_OK);
    atomic_init(&ev.done, true);
    c = coll(DDP__ALLGATHER, 4, 16, 1000);
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, 0), DDP_OK);
    assert_int_equal(ddp__watchdog_step(wd, 1), DDP_OK);
    atomic_store(&fc2.error, DDP_ERR_SYSTEM);
    assert_int_equal(ddp__watchdog_step(wd, 2), DDP_ERR_SYSTEM);
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, &peer), DDP_ERR_SYSTEM);
    assert_false(peer);
    assert_non_null(strstr(msg, "rank 0: nccl: the communicator failed while idle (after "
                                "collective #4): NCCL reports"));
    assert_int_equal(atomic_load(&fc2.aborts), 1);
    ddp__watchdog_stop(wd);

    /* An abort from outside (ddp_group_abort): the reason, and the communicator aborted. */
    fake_comm fc3;
    wc = fake_wd(&fc3);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 0, 0, NULL), DDP_OK);
    ddp__watchdog_fail(wd, DDP_ERR_CLOSED, "rank 0: nccl: the group was aborted: user", false);
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, &peer), DDP_ERR_CLOSED);
    assert_false(peer); /* this rank's own abort */
    assert_string_equal(msg, "rank 0: nccl: the group was aborted: user");
    assert_int_equal(atomic_load(&fc3.aborts), 1);
    ddp__watchdog_stop(wd);
    free(wd);
}

/* Waits up to limit_ms for wd to record a failure; returns how long it took, or -1. */
static int64_t wait_failure(ddp__watchdog *wd, int64_t limit_ms)
{
    int64_t t0 = ddp__now_ms();
    while (ddp__now_ms() - t0 < limit_ms) {
        if (ddp__watchdog_error(wd, NULL, 0, NULL) != DDP_OK)
            return ddp__now_ms() - t0;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* The thread: a stuck collective is aborted soon after its deadline without anyone stepping; a
 * healthy group polled for a while is left alone; stop joins promptly. */
static void watchdog_thread(void **state)
{
    (void)state;
    fake_comm fc;
    ddp__wd_comm wc = fake_wd(&fc);
    ddp__watchdog *wd = calloc(1, sizeof *wd);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 2, 20, NULL), DDP_OK);
    fake_ev ev;
    atomic_init(&ev.done, false);
    int64_t now = ddp__now_ms();
    ddp__coll c = coll(DDP__ALLREDUCE, 1, 64, now + 150);
    assert_int_equal(ddp__watchdog_track(wd, &c, &ev, now), DDP_OK);
    /* Healthy in flight: polled, and not aborted before its deadline. The thread's first poll is
     * waited for, and the abort's own time checked, rather than both looked at after a 100 ms
     * sleep: on a loaded machine (CI: ASan, four tests on two cores) the sleep overran the 150 ms
     * deadline or came before the first poll, and the test failed (line 358, "0x1 != 0"). */
    for (int64_t end = ddp__now_ms() + 10000;
         atomic_load(&fc.queries) < 1 && atomic_load(&fc.aborts) == 0 && ddp__now_ms() < end;) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    assert_true(atomic_load(&fc.queries) >= 1);
    /* Then stuck past 150 ms: aborted by the thread (generous bound for a loaded machine). */
    int64_t took = wait_failure(wd, 10000);
    assert_true(took >= 0);
    assert_true(ddp__now_ms() >= now + 150);
    assert_int_equal(atomic_load(&fc.aborts), 1);
    if (atomic_load(&fc.abort_ms) < now + 150)
        fail_msg("aborted %lld ms after the start, before its 150 ms deadline",
                 (long long)(atomic_load(&fc.abort_ms) - now));
    char msg[DDP_ERRMSG_MAX];
    assert_int_equal(ddp__watchdog_error(wd, msg, sizeof msg, NULL), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(msg, "rank 2: nccl: allreduce #1 (float32 × 64) timed out after"));
    int64_t t0 = ddp__now_ms();
    ddp__watchdog_stop(wd);
    assert_true(ddp__now_ms() - t0 < 5000);

    /* An asynchronous error with nothing in flight is noticed by the thread too. */
    fake_comm fc2;
    wc = fake_wd(&fc2);
    assert_int_equal(ddp__watchdog_start(wd, &wc, "nccl", 0, 10, NULL), DDP_OK);
    atomic_store(&fc2.error, DDP_ERR_NETWORK);
    assert_true(wait_failure(wd, 10000) >= 0);
    assert_int_equal(atomic_load(&fc2.aborts), 1);
    ddp__watchdog_stop(wd);
    free(wd);
}

static void messages(void **state)
{
    (void)state;
    char buf[DDP_ERRMSG_MAX];
    ddp__coll c = coll(DDP__ALLGATHER, 3, 10, 0);
    c.dtype = DDP_INT64;
    ddp__coll_label(buf, sizeof buf, &c);
    assert_string_equal(buf, "allgather #3 (int64 × 10)");
    c = coll(DDP__BARRIER, 9, 0, 0);
    ddp__coll_label(buf, sizeof buf, &c);
    assert_string_equal(buf, "barrier #9");
    c = coll(DDP__ALLREDUCE, 12, 1048576, 0);
    ddp__gpu_fail_msg(buf, sizeof buf, "nccl", 5, &c, "ncclAllReduce",
                      "unhandled cuda error (run with NCCL_DEBUG=INFO for details)");
    assert_string_equal(buf, "rank 5: nccl: allreduce #12 (float32 × 1048576) failed in "
                             "ncclAllReduce: unhandled cuda error (run with NCCL_DEBUG=INFO for "
                             "details); HINT: the other ranks' logs say which rank failed first; "
                             "the group cannot be used again");
}

/* ---- staging through host memory ------------------------------------------------------------ */

/* "Device" operations with memcpy; they count calls and bytes, and can fail on demand. */
typedef struct fake_dev {
    int d2h, h2d, syncs, afters;
    size_t bytes;
    int fail_at; /* the n-th copy (1-based) fails; 0: never */
    bool sync_times_out;
    void *last_stream;
} fake_dev;

static ddp_status fd_after(void *ctx, void *stream, void *ready, char *msg)
{
    (void)msg;
    (void)ready;
    fake_dev *d = ctx;
    d->afters++;
    d->last_stream = stream;
    return DDP_OK;
}

static ddp_status fd_copy_common(fake_dev *d, void *dst, const void *src, size_t n, char *msg)
{
    if (d->fail_at && d->d2h + d->h2d == d->fail_at) {
        ddp__fmt(msg, DDP_ERRMSG_MAX, "cudaMemcpyAsync failed: an illegal memory access");
        return DDP_ERR_SYSTEM;
    }
    memcpy(dst, src, n);
    d->bytes += n;
    return DDP_OK;
}

static ddp_status fd_d2h(void *ctx, void *host, const void *dev, size_t n, char *msg)
{
    fake_dev *d = ctx;
    d->d2h++;
    return fd_copy_common(d, host, dev, n, msg);
}

static ddp_status fd_h2d(void *ctx, void *dev, const void *host, size_t n, char *msg)
{
    fake_dev *d = ctx;
    d->h2d++;
    return fd_copy_common(d, dev, host, n, msg);
}

static ddp_status fd_sync(void *ctx, int64_t deadline_ms, char *msg)
{
    (void)deadline_ms;
    fake_dev *d = ctx;
    d->syncs++;
    if (d->sync_times_out) {
        ddp__fmt(msg, DDP_ERRMSG_MAX, "the GPU copies did not finish by the deadline");
        return DDP_ERR_TIMEOUT;
    }
    return DDP_OK;
}

/* A host backend acting as n members; every other member m holds the value it would have
 * staged: for allreduce and reduce_scatter the same elements as this one plus m (member m's
 * input is mine + m), for allgather its block is mine + 100·m, for broadcast the root's is 7 + i
 * (i: the element's index within the chunk). It checks it is given host memory within buf. */
typedef struct fake_host {
    int me, n;
    float *buf;
    size_t bytes;
    int calls;
    int avg_seen;
    int aborts;    /* abort() calls: a device failure must abort the host backend */
    char why[256]; /* the last abort's line */
} fake_host;

static bool inside(const fake_host *h, const void *p, size_t bytes)
{
    const char *b = (const char *)h->buf;
    return (const char *)p >= b && (const char *)p + bytes <= b + h->bytes;
}

static ddp_status fh_run(void *be, const ddp__coll *c, ddp__fail *f)
{
    (void)f;
    fake_host *h = be;
    h->calls++;
    assert_int_equal(c->device, DDP_DEVICE_CPU);
    assert_null(c->stream);
    size_t k = c->count;
    float sum_off = 0; /* Σ over members of m */
    for (int m = 0; m < h->n; m++)
        sum_off += (float)m;
    if (c->avg_div)
        h->avg_seen = c->avg_div;
    float div = c->avg_div > 1 ? (float)c->avg_div : 1.0f;
    switch (c->kind) {
    case DDP__ALLREDUCE: {
        assert_ptr_equal(c->send, c->recv);
        assert_true(inside(h, c->recv, k * 4));
        float *x = c->recv;
        for (size_t i = 0; i < k; i++)
            x[i] = (x[i] * (float)h->n + sum_off) / div;
        break;
    }
    case DDP__BROADCAST: {
        float *x = c->recv;
        assert_true(inside(h, x, k * 4));
        if (h->me != c->root)
            for (size_t i = 0; i < k; i++)
                x[i] = 7.0f + (float)i;
        break;
    }
    case DDP__ALLGATHER: {
        float *x = c->recv;
        assert_true(inside(h, x, k * 4 * (size_t)h->n));
        assert_ptr_equal(c->send, x + (size_t)h->me * k); /* in place */
        for (int m = 0; m < h->n; m++)
            if (m != h->me)
                for (size_t i = 0; i < k; i++)
                    x[(size_t)m * k + i] = x[(size_t)h->me * k + i] + 100.0f * (float)m;
        break;
    }
    case DDP__REDUCE_SCATTER: {
        const float *x = c->send;
        float *y = c->recv;
        assert_true(inside(h, x, k * 4 * (size_t)h->n));
        assert_ptr_equal(y, x + (size_t)h->me * k); /* in place */
        for (size_t i = 0; i < k; i++)
            y[i] = (x[(size_t)h->me * k + i] * (float)h->n + sum_off) / div;
        break;
    }
    default: break;
    }
    return DDP_OK;
}

static void fh_destroy(void *be)
{
    (void)be;
}

static void fh_abort(void *be, const char *why)
{
    fake_host *h = be;
    h->aborts++;
    snprintf(h->why, sizeof h->why, "%s", why);
}

static const ddp__backend_ops fake_host_ops = {
    .name = "fake", .run = fh_run, .destroy = fh_destroy, .abort = fh_abort, .fuses_avg = true};
static const ddp__backend_ops fake_host_ops_nofuse = {
    .name = "fake", .run = fh_run, .destroy = fh_destroy, .abort = fh_abort, .fuses_avg = false};

typedef struct stage_fixture {
    fake_dev dev;
    ddp__devops ops;
    fake_host host;
    ddp__stage st;
} stage_fixture;

static void stage_make(stage_fixture *s, int me, int n, size_t buf_floats, bool fuses)
{
    memset(s, 0, sizeof *s);
    s->ops = (ddp__devops){
        .ctx = &s->dev, .after = fd_after, .d2h = fd_d2h, .h2d = fd_h2d, .sync = fd_sync};
    s->host.me = me;
    s->host.n = n;
    s->host.bytes = buf_floats * sizeof(float);
    s->host.buf = calloc(buf_floats, sizeof(float));
    s->st = (ddp__stage){.dev = &s->ops,
                         .inner_be = &s->host,
                         .inner = fuses ? &fake_host_ops : &fake_host_ops_nofuse,
                         .buf = s->host.buf,
                         .bytes = s->host.bytes,
                         .me = me,
                         .n = n};
}

static ddp__coll dcoll(ddp__kind k, const void *send, void *recv, size_t count)
{
    return (ddp__coll){.kind = k,
                       .send = send,
                       .recv = recv,
                       .count = count,
                       .dtype = DDP_FLOAT32,
                       .device = DDP_DEVICE_CUDA,
                       .op = DDP_SUM,
                       .seq = 1,
                       .deadline_ms = INT64_MAX,
                       .stream = (void *)0x1234};
}

/* Every collective, for counts around the chunk size, with the member in each position. */
static void staging(void **state)
{
    (void)state;
    const size_t buf_floats = 24; /* small: many chunks */
    const size_t counts[] = {0, 1, 5, 11, 12, 13, 24, 25, 47, 100};
    for (int n = 1; n <= 4; n++)
        for (int me = 0; me < n; me++)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                size_t N = counts[ci];
                stage_fixture s;
                ddp__fail f = {0};
                float *send = malloc((N * (size_t)n + 1) * sizeof(float));
                float *recv = malloc((N * (size_t)n + 1) * sizeof(float));
                for (size_t i = 0; i < N * (size_t)n; i++)
                    send[i] = (float)i * 0.5f + (float)me;

                /* allreduce: Σ_m (send[i] + m) = send[i]·n + Σm */
                stage_make(&s, me, n, buf_floats, true);
                ddp__coll c = dcoll(DDP__ALLREDUCE, send, recv, N);
                assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
                for (size_t i = 0; i < N; i++)
                    assert_float_equal(recv[i], send[i] * (float)n + (float)(n * (n - 1) / 2),
                                       1e-4);
                size_t chunks = N ? (N + buf_floats - 1) / buf_floats : 1;
                assert_int_equal(s.host.calls, (int)chunks);
                assert_int_equal(s.dev.afters, 1);
                assert_ptr_equal(s.dev.last_stream, (void *)0x1234);
                assert_int_equal(s.dev.bytes, 2 * N * sizeof(float)); /* once each way */
                free(s.host.buf);

                /* broadcast from member n-1 */
                stage_make(&s, me, n, buf_floats, true);
                memcpy(recv, send, N * sizeof(float));
                c = dcoll(DDP__BROADCAST, recv, recv, N);
                c.root = n - 1;
                assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
                for (size_t i = 0; i < N; i++) {
                    float want = me == n - 1 ? send[i] : 7.0f + (float)(i % buf_floats);
                    assert_float_equal(recv[i], want, 0);
                }
                assert_int_equal(s.dev.bytes, N * sizeof(float)); /* one way, on every rank */
                free(s.host.buf);

                /* allgather: block m of the result = my input + 100·m (mine: my input) */
                stage_make(&s, me, n, buf_floats, true);
                c = dcoll(DDP__ALLGATHER, send, recv, N);
                assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
                for (int m = 0; m < n; m++)
                    for (size_t i = 0; i < N; i++)
                        assert_float_equal(recv[(size_t)m * N + i],
                                           send[i] + (m == me ? 0.0f : 100.0f * (float)m), 0);
                size_t per = buf_floats / (size_t)n;
                chunks = N ? (N + per - 1) / per : 1;
                assert_int_equal(s.host.calls, (int)chunks);
                assert_int_equal(s.dev.bytes, (N + N * (size_t)n) * sizeof(float));
                free(s.host.buf);

                /* reduce_scatter: my block, reduced: send[me·N + i]·n + Σm */
                stage_make(&s, me, n, buf_floats, true);
                c = dcoll(DDP__REDUCE_SCATTER, send, recv, N);
                assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
                for (size_t i = 0; i < N; i++)
                    assert_float_equal(
                        recv[i], send[(size_t)me * N + i] * (float)n + (float)(n * (n - 1) / 2),
                        1e-3);
                assert_int_equal(s.dev.bytes, (N * (size_t)n + N) * sizeof(float));
                free(s.host.buf);
                free(send);
                free(recv);
            }
}

/* AVG: handed to a host backend that fuses it, else divided over the staging buffer. */
static void staging_avg(void **state)
{
    (void)state;
    for (int fuses = 0; fuses < 2; fuses++) {
        stage_fixture s;
        ddp__fail f = {0};
        float send[40], recv[40];
        for (int i = 0; i < 40; i++)
            send[i] = (float)i;
        stage_make(&s, 1, 4, 16, fuses);
        ddp__coll c = dcoll(DDP__ALLREDUCE, send, recv, 40);
        c.avg_div = 4;
        assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
        for (int i = 0; i < 40; i++) /* (4·x + 0+1+2+3) / 4 */
            assert_float_equal(recv[i], ((float)i * 4.0f + 6.0f) / 4.0f, 1e-5);
        assert_int_equal(s.host.avg_seen, fuses ? 4 : 0);
        free(s.host.buf);
    }
}

/* Barrier, host buffers, failures of the device side. */
static void staging_edges(void **state)
{
    (void)state;
    stage_fixture s;
    ddp__fail f = {0};
    stage_make(&s, 0, 2, 16, true);
    ddp__coll c = dcoll(DDP__BARRIER, NULL, NULL, 0);
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
    assert_int_equal(s.host.calls, 1);
    assert_int_equal(s.dev.d2h + s.dev.h2d, 0);
    /* Host buffers (the core's debug check) go straight to the host backend, no copies. */
    float hb[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    c = dcoll(DDP__ALLREDUCE, hb, hb, 8);
    c.device = DDP_DEVICE_CPU;
    c.stream = NULL;
    s.host.buf = hb; /* the fake checks pointers against its buffer */
    s.host.bytes = sizeof hb;
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_OK);
    assert_float_equal(hb[0], 1 * 2 + 1, 0);
    assert_int_equal(s.dev.d2h + s.dev.h2d, 0);
    free(s.st.buf);

    /* A copy that fails: the status and a message naming the collective and the CUDA error. */
    float send[64], recv[64];
    memset(send, 0, sizeof send);
    stage_make(&s, 1, 2, 16, true);
    s.dev.fail_at = 3; /* the second chunk's copy in */
    c = dcoll(DDP__ALLREDUCE, send, recv, 64);
    c.seq = 42;
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_ERR_SYSTEM);
    assert_int_equal(f.status, DDP_ERR_SYSTEM);
    assert_string_equal(f.msg, "cuda-staged: allreduce #42 (float32 × 64) failed on member 1: "
                               "cudaMemcpyAsync failed: an illegal memory access");
    /* …and the host backend is aborted with that line, so the peers waiting in it fail at once
     * rather than at the deadline (the first chunk went through: one call). */
    assert_int_equal(s.host.calls, 1);
    assert_int_equal(s.host.aborts, 1);
    assert_string_equal(s.host.why, f.msg);
    free(s.host.buf);
    /* One member alone: nobody to tell, no abort. */
    stage_make(&s, 0, 1, 16, true);
    s.dev.fail_at = 1;
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_ERR_SYSTEM);
    assert_int_equal(s.host.aborts, 0);
    free(s.host.buf);
    /* A wait on the copies that reaches the deadline. */
    stage_make(&s, 0, 2, 16, true);
    s.dev.sync_times_out = true;
    c = dcoll(DDP__REDUCE_SCATTER, send, recv, 8);
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(f.msg, "reduce_scatter #1 (float32 × 8) failed on member 0: the GPU "
                                  "copies did not finish by the deadline"));
    assert_int_equal(s.host.calls, 0); /* the host backend was not entered */
    assert_int_equal(s.host.aborts, 1);
    free(s.host.buf);
    /* A staging buffer too small for one element per member. */
    stage_make(&s, 0, 4, 2, true);
    c = dcoll(DDP__ALLGATHER, send, recv, 8);
    assert_int_equal(ddp__staged_run(&s.st, &c, &f), DDP_ERR_INVALID);
    assert_non_null(strstr(f.msg, "the staging buffer holds no element"));
    free(s.host.buf);
}

/* The options of a one-rank group on GPU buffers on host "hostA" (w filled in: a one-process
 * world, fake_gpus fake GPUs), backend auto, a 10 s timeout. */
static ddp_group_opts one_rank_gpu_group(ddp_world *w, int fake_gpus)
{
    memset(w, 0, sizeof *w);
    w->world_size = 1;
    w->local_world_size = 1;
    w->settings.fake_gpus = fake_gpus;
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = w;
    o.device = DDP_DEVICE_CUDA;
    o.host_id = "hostA";
    o.timeout_ms = 10000;
    return o;
}

/* A GPU group where CUDA finds no GPU (this machine, CI): a clear error naming the host, no hang.
 * On a GPU machine the group comes up instead, over a GPU backend. */
static void group_without_gpu(void **state)
{
    (void)state;
    ddp_world w;
    ddp_group_opts o = one_rank_gpu_group(&w, 0);
    ddp_group *g = NULL;
    ddp_error err = {0};
    int ngpu = 0;
    ddp_error cerr = {0};
    bool have_gpu = ddp__cuda_device_count(&ngpu, &cerr) == DDP_OK;
    ddp_status st = ddp_group_init(&o, &g, &err);
    if (have_gpu) {
        assert_int_equal(st, DDP_OK);
        assert_true(!strcmp(ddp_group_backend(g), "nccl") ||
                    !strcmp(ddp_group_backend(g), "cuda-staged"));
        assert_int_equal(ddp_group_cuda_device(g), 0);
        ddp_group_destroy(g);
        return;
    }
    assert_int_equal(st, DDP_ERR_INVALID);
    assert_null(g);
    assert_string_equal(err.msg, ddp__cuda_built
                                     ? "backend 'auto': no backend can run this group: host "
                                       "'hostA' has no visible GPU for its 1 rank"
                                     : "backend 'auto': no backend can run this group: GPU "
                                       "buffers need a libddp built with CUDA (DDP_CUDA=ON)");
    /* Named: the same reason. A CPU group still works, and has no GPU. */
    o.backend = "nccl";
    assert_int_equal(ddp_group_init(&o, &g, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "backend 'nccl' "));
    o.backend = NULL;
    o.device = DDP_DEVICE_CPU;
    assert_int_equal(ddp_group_init(&o, &g, &err), DDP_OK);
    assert_int_equal(ddp_group_cuda_device(g), -1);
    assert_string_equal(ddp_group_backend_reason(g), "every rank on one host");
    char a[8] = "abcdefg", b[8] = "";
    assert_int_equal(ddp_group_memcpy(g, b, a, sizeof a), DDP_OK); /* a CPU group: memcpy */
    assert_string_equal(b, "abcdefg");
    ddp_group_destroy(g);
}

/* cuda-staged with pinning of the staging buffer refused (cudaHostRegister can refuse shared
 * memory in some kernels and VMs) or not: the group comes up either way and its collectives are
 * right; the reason line says which it got, and when refused, member 0 says why on stderr
 * (captured here). On the fake GPU (host memory), its pin told to refuse. */
static void staged_pinning(bool refuse)
{
    if (refuse)
        setenv("DDP_TEST_FAKE_PIN_REFUSED", "1", 1);
    ddp_world w;
    ddp_group_opts o = one_rank_gpu_group(&w, 1); /* DDP_TEST_FAKE_GPUS=1 */
    o.backend = "cuda-staged";                    /* auto: cuda-ipc on the one fake GPU */
    ddp_group *g = NULL;
    ddp_error err = {0};
    FILE *cap = tmpfile();
    assert_non_null(cap);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(cap), 2) == 2);
    ddp_status st = ddp_group_init(&o, &g, &err);
    fflush(stderr);
    assert_true(dup2(saved, 2) == 2);
    close(saved);
    unsetenv("DDP_TEST_FAKE_PIN_REFUSED");
    char said[1024] = "";
    rewind(cap);
    size_t got = fread(said, 1, sizeof said - 1, cap);
    said[got] = '\0';
    fclose(cap);
    if (st != DDP_OK)
        fail_msg("group with %s staging buffer: %s", refuse ? "an unpinned" : "a pinned", err.msg);
    assert_string_equal(ddp_group_backend(g), "cuda-staged");
    const char *why = ddp_group_backend_reason(g);
    if (refuse) {
        assert_non_null(strstr(why, "; staging buffer not pinned (cudaHostRegister refused it)"));
        assert_non_null(strstr(said, "ddp: cuda-staged: the staging buffer is not pinned "
                                     "(cudaHostRegister failed: operation not supported"));
        assert_true(got > 0 && strchr(said, '\n') == said + got - 1); /* one line */
    } else {
        assert_non_null(strstr(why, "; staging buffer pinned"));
        assert_null(strstr(said, "pinned"));
    }
    assert_null(strstr(why, "pinned host memory")); /* the old line, right only when pinned */
    enum { n = 1000 };
    float host[n], back[n];
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    float *dev = ddp_group_alloc(g, sizeof host);
    assert_non_null(dev);
    assert_int_equal(ddp_group_memcpy(g, dev, host, sizeof host), DDP_OK);
    assert_int_equal(ddp_allreduce(g, dev, dev, n, DDP_FLOAT32, DDP_SUM), DDP_OK);
    assert_int_equal(ddp_group_memcpy(g, back, dev, sizeof back), DDP_OK);
    assert_memory_equal(back, host, sizeof host); /* world 1: the sum is the input */
    ddp_group_free(g, dev);
    ddp_group_destroy(g);
}

static void staged_unpinned(void **state)
{
    (void)state;
    staged_pinning(true);
}

static void staged_pinned(void **state)
{
    (void)state;
    staged_pinning(false);
}

/* ---- cuda-ipc on the fake GPU -----------------------------------------------------------------
 */

/* The fake GPU's IPC across processes: a region exported here is opened by a forked child (as
 * another rank would), which reads what this process wrote and writes back; a handle whose
 * exporter has exited cannot be opened, and says why. The exported memory is a memfd (no name in
 * /dev/shm or anywhere: nothing to leave behind). */
static void fake_ipc_processes(void **state)
{
    (void)state;
    ddp__devops d;
    ddp_error err = {0};
    char msg[DDP_ERRMSG_MAX];
    assert_int_equal(ddp__fake_devops(&d, &err), DDP_OK);
    enum { n = 2048 };
    float host[n], back[n];
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    float *region = d.alloc(d.ctx, sizeof host);
    assert_non_null(region);
    assert_int_equal(d.h2d(d.ctx, region, host, sizeof host / 2, msg), DDP_OK);
    unsigned char handle[DDP__IPC_HANDLE_BYTES];
    assert_int_equal(d.ipc_export(d.ctx, region, handle, msg), DDP_OK);
    /* Not the start of an allocation: refused, with a message. */
    unsigned char h2[DDP__IPC_HANDLE_BYTES];
    assert_int_equal(d.ipc_export(d.ctx, region + 1, h2, msg), DDP_ERR_INVALID);
    assert_non_null(strstr(msg, "not the start of an allocation"));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the peer: read my first half, write the second */
        void *peer = NULL;
        float got[n / 2], mine[n / 2];
        if (d.ipc_open(d.ctx, handle, &peer, msg) != DDP_OK)
            _exit(2);
        if (d.d2h(d.ctx, got, peer, sizeof got, msg) != DDP_OK)
            _exit(3);
        for (int i = 0; i < n / 2; i++) {
            if (got[i] != (float)i)
                _exit(4);
            mine[i] = -(float)i;
        }
        if (d.h2d(d.ctx, (float *)peer + n / 2, mine, sizeof mine, msg) != DDP_OK)
            _exit(5);
        d.ipc_close(d.ctx, peer);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(d.d2h(d.ctx, back, region, sizeof back, msg), DDP_OK);
    for (int i = 0; i < n; i++)
        assert_true(back[i] == (i < n / 2 ? (float)i : -(float)(i - n / 2)));
    /* An exporter that has gone: its memory cannot be opened any more; a clear message. */
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        void *r = d.alloc(d.ctx, 4096);
        unsigned char h[DDP__IPC_HANDLE_BYTES];
        if (!r || d.ipc_export(d.ctx, r, h, msg) != DDP_OK)
            _exit(2);
        _exit(write(pfd[1], h, sizeof h) == (ssize_t)sizeof h ? 0 : 3);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    unsigned char dead[DDP__IPC_HANDLE_BYTES];
    assert_int_equal(read(pfd[0], dead, sizeof dead), (ssize_t)sizeof dead);
    close(pfd[0]);
    close(pfd[1]);
    void *p = NULL;
    assert_int_equal(d.ipc_open(d.ctx, dead, &p, msg), DDP_ERR_SYSTEM);
    assert_non_null(strstr(msg, "cudaIpcOpenMemHandle failed: open '/proc/"));
    assert_null(p);
    memset(dead, 0, sizeof dead);
    assert_int_equal(d.ipc_open(d.ctx, dead, &p, msg), DDP_ERR_INVALID);
    /* What the handle names is an anonymous memfd, not a file in /dev/shm. */
    int32_t fdn;
    memcpy(&fdn, handle + 12, sizeof fdn); /* fake_handle: magic[8], pid, fd */
    char link[64], target[256] = "";
    ddp__fmt(link, sizeof link, "/proc/self/fd/%d", (int)fdn);
    assert_true(readlink(link, target, sizeof target - 1) > 0);
    assert_non_null(strstr(target, "/memfd:ddp-fake-gpu"));
    d.free(d.ctx, region);
    d.destroy(d.ctx);
}

/* The fixed-order reduction: float32 folds left to right, 16-bit floats accumulate in float32
 * and round once, AVG divides once at the end, integers wrap and truncate, min/max. */
static void fake_ipc_reduce(void **state)
{
    (void)state;
    ddp__devops d;
    ddp_error err = {0};
    char msg[DDP_ERRMSG_MAX];
    assert_int_equal(ddp__fake_devops(&d, &err), DDP_OK);
    char *dev = d.alloc(d.ctx, 4096); /* 4 sources of 512 bytes, and a result */
    assert_non_null(dev);
    const void *srcs[4] = {dev, dev + 512, dev + 1024, dev + 1536};
    char *out = dev + 2048;
    /* float32: (1e8 + 1) + (-1e8) + 1 = 1 in this order (the 1 is lost in the first sum): 1. */
    float f[4][2] = {{1e8f, 3}, {1, 5}, {-1e8f, 7}, {1, 9}};
    for (int j = 0; j < 4; j++)
        assert_int_equal(d.h2d(d.ctx, (void *)srcs[j], f[j], sizeof f[j], msg), DDP_OK);
    float r[2];
    assert_int_equal(d.reduce(d.ctx, out, srcs, 4, 2, DDP_FLOAT32, DDP_SUM, 0, msg), DDP_OK);
    assert_int_equal(d.d2h(d.ctx, r, out, sizeof r, msg), DDP_OK);
    assert_true(r[0] == 1.0f && r[1] == 24.0f);
    assert_int_equal(d.reduce(d.ctx, out, srcs, 4, 2, DDP_FLOAT32, DDP_AVG, 4, msg), DDP_OK);
    assert_int_equal(d.d2h(d.ctx, r, out, sizeof r, msg), DDP_OK);
    assert_true(r[0] == 0.25f && r[1] == 6.0f);
    assert_int_equal(d.reduce(d.ctx, out, srcs, 4, 2, DDP_FLOAT32, DDP_MAX, 0, msg), DDP_OK);
    assert_int_equal(d.d2h(d.ctx, r, out, sizeof r, msg), DDP_OK);
    assert_true(r[0] == 1e8f && r[1] == 9.0f);
    /* bfloat16: 1 + 2^-8 + 2^-8 is 1 + 2^-7 summed in float32 and rounded once (a bf16 sum at
     * each step would round 1 + 2^-8 to 1 twice); in place (dst = srcs[0]). */
    uint16_t b[3] = {ddp__f32_to_bf16(1.0f), ddp__f32_to_bf16(0x1p-8f), ddp__f32_to_bf16(0x1p-8f)};
    for (int j = 0; j < 3; j++)
        assert_int_equal(d.h2d(d.ctx, (void *)srcs[j], &b[j], 2, msg), DDP_OK);
    uint16_t rb;
    assert_int_equal(d.reduce(d.ctx, (void *)srcs[0], srcs, 3, 1, DDP_BFLOAT16, DDP_SUM, 0, msg),
                     DDP_OK);
    assert_int_equal(d.d2h(d.ctx, &rb, srcs[0], 2, msg), DDP_OK);
    assert_true(ddp__bf16_to_f32(rb) == 1.0f + 0x1p-7f);
    /* int32: wraps; AVG truncates toward zero. */
    int32_t i32[2][2] = {{INT32_MAX, -7}, {1, 0}}, ri[2];
    for (int j = 0; j < 2; j++)
        assert_int_equal(d.h2d(d.ctx, (void *)srcs[j], i32[j], sizeof i32[j], msg), DDP_OK);
    assert_int_equal(d.reduce(d.ctx, out, srcs, 2, 2, DDP_INT32, DDP_AVG, 2, msg), DDP_OK);
    assert_int_equal(d.d2h(d.ctx, ri, out, sizeof ri, msg), DDP_OK);
    assert_int_equal(ri[0], INT32_MIN / 2);
    assert_int_equal(ri[1], -3);
    /* Too many sources: refused. */
    assert_int_equal(d.reduce(d.ctx, out, srcs, 0, 2, DDP_FLOAT32, DDP_SUM, 0, msg),
                     DDP_ERR_INVALID);
    d.free(d.ctx, dev);
    d.destroy(d.ctx);
}

/* A one-rank cuda-ipc group on the fake GPU, named, with a 1 KiB half so that every collective
 * runs in several chunks: the results exact; the reason line names the region. */
static void ipc_group_chunks(void **state)
{
    (void)state;
    ddp_world w;
    ddp_group_opts o = one_rank_gpu_group(&w, 1);
    o.backend = "cuda-ipc";
    o.arena_bytes = 4096; /* half of it staged, in two halves of 1 KiB */
    ddp_group *g = NULL;
    ddp_error err = {0};
    if (ddp_group_init(&o, &g, &err) != DDP_OK)
        fail_msg("cuda-ipc group: %s", err.msg);
    assert_string_equal(ddp_group_backend(g), "cuda-ipc");
    assert_non_null(strstr(ddp_group_backend_reason(g), "1 KiB × 2 device staging region"));
    enum { n = 1000 }; /* 4000 bytes: 4 chunks */
    float host[n], back[n];
    for (int i = 0; i < n; i++)
        host[i] = (float)(3 * i + 1);
    float *a = ddp_group_alloc(g, sizeof host), *b = ddp_group_alloc(g, sizeof host);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(ddp_group_memcpy(g, a, host, sizeof host), DDP_OK);
    assert_int_equal(ddp_allreduce(g, a, b, n, DDP_FLOAT32, DDP_AVG), DDP_OK);
    assert_int_equal(ddp_group_memcpy(g, back, b, sizeof back), DDP_OK);
    assert_memory_equal(back, host, sizeof host);
    assert_int_equal(ddp_allgather(g, a, b, n, DDP_FLOAT32), DDP_OK);
    assert_int_equal(ddp_group_memcpy(g, back, b, sizeof back), DDP_OK);
    assert_memory_equal(back, host, sizeof host);
    assert_int_equal(ddp_reduce_scatter(g, a, b, n, DDP_FLOAT32, DDP_SUM), DDP_OK);
    assert_int_equal(ddp_group_memcpy(g, back, b, sizeof back), DDP_OK);
    assert_memory_equal(back, host, sizeof host);
    assert_int_equal(ddp_broadcast(g, a, n, DDP_FLOAT32, 0), DDP_OK);
    assert_int_equal(ddp_group_memcpy(g, back, a, sizeof back), DDP_OK);
    assert_memory_equal(back, host, sizeof host);
    assert_int_equal(ddp_barrier(g), DDP_OK);
    ddp_group_free(g, a);
    ddp_group_free(g, b);
    ddp_group_destroy(g);
}

/* ---- failure notices through the store (src/group/notice.c) --------------------------------- */

/* A rank as the notice sees it: its group's first failure, and what a peer's notice did. */
typedef struct fake_rank {
    pthread_mutex_t mu;
    ddp_status error;
    char msg[DDP_ERRMSG_MAX];
    bool peer;
    int fails; /* hooks.fail calls */
    ddp_status fail_st;
    char fail_msg[DDP_ERRMSG_MAX];
} fake_rank;

static ddp_status fr_error(void *ctx, char *msg, size_t cap, bool *peer)
{
    fake_rank *r = ctx;
    pthread_mutex_lock(&r->mu);
    ddp_status st = r->error;
    if (st) {
        snprintf(msg, cap, "%s", r->msg);
        *peer = r->peer;
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

static void fr_fail(void *ctx, ddp_status st, const char *msg)
{
    fake_rank *r = ctx;
    pthread_mutex_lock(&r->mu);
    r->fails++;
    r->fail_st = st;
    snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
    if (!r->error) { /* as the group's poison: the peer's failure becomes this rank's */
        r->error = st;
        r->peer = true;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    pthread_mutex_unlock(&r->mu);
}

static void fr_set(fake_rank *r, ddp_status st, const char *msg, bool peer)
{
    pthread_mutex_lock(&r->mu);
    r->error = st;
    r->peer = peer;
    snprintf(r->msg, sizeof r->msg, "%s", msg);
    pthread_mutex_unlock(&r->mu);
}

static int fr_fails(fake_rank *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->fails;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Waits up to ms for r's first hooks.fail; returns how many it had. */
static int fr_wait(fake_rank *r, int ms)
{
    int64_t end = ddp__now_ms() + ms;
    while (fr_fails(r) == 0 && ddp__now_ms() < end) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    return fr_fails(r);
}

typedef struct notice_fx {
    uid_fixture u; /* the server, and a client to read the key with (u.a) */
    fake_rank r[2];
    ddp__notice *n[2];
} notice_fx;

static void nfx_start(notice_fx *f, int poll0, int poll1)
{
    memset(f, 0, sizeof *f);
    uid_setup(&f->u);
    for (int i = 0; i < 2; i++) {
        pthread_mutex_init(&f->r[i].mu, NULL);
        ddp__notice_hooks h = {.ctx = &f->r[i], .error = fr_error, .fail = fr_fail};
        ddp_error err = {0};
        assert_int_equal(
            ddp__notice_start(f->u.a, "ddp/g7", i, i ? poll1 : poll0, &h, &f->n[i], &err), DDP_OK);
    }
}

static void nfx_stop(notice_fx *f)
{
    for (int i = 0; i < 2; i++) {
        ddp__notice_stop(f->n[i]);
        pthread_mutex_destroy(&f->r[i].mu);
    }
    uid_teardown(&f->u);
}

/* What the store holds under the group's key ("" when absent). */
static void down_key(notice_fx *f, char *out, size_t cap)
{
    const char *k[1] = {"ddp/g7/down"};
    bool have = false;
    out[0] = '\0';
    assert_int_equal(ddp_store_check(f->u.a, k, 1, &have), DDP_OK);
    if (!have)
        return;
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ddp_store_get(f->u.a, k[0], &v, &len), DDP_OK);
    snprintf(out, cap, "%s", (char *)v);
    free(v);
}

/* Waits up to ms for the key to hold something; returns it in out ("" if it never did). */
static void down_wait(notice_fx *f, char *out, size_t cap, int ms)
{
    int64_t end = ddp__now_ms() + ms;
    for (;;) {
        down_key(f, out, cap);
        if (out[0] || ddp__now_ms() >= end)
            return;
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
}

/* Sleeps ms, for the checks that something does NOT happen (many polls of 20 ms). */
static void idle_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Rank 1 fails on its own (its watchdog's time-out), told at once (ddp__notice_tell, where the
 * group is poisoned): in the store before the call returns, though its thread would not look
 * for a minute; rank 0 learns it within a few polls, with rank 1's status and message, as the
 * peer's fault, and publishes nothing of its own over it. */
static void notice_publish(void **state)
{
    (void)state;
    notice_fx f;
    nfx_start(&f, 20, 60000);
    fr_set(&f.r[1], DDP_ERR_TIMEOUT, "rank 1: nccl: allreduce #4 timed out", false);
    ddp__notice_tell(f.n[1]);
    char v[DDP_ERRMSG_MAX + 64];
    down_key(&f, v, sizeof v);
    char want[DDP_ERRMSG_MAX + 64];
    snprintf(want, sizeof want, "%d rank 1 failed: rank 1: nccl: allreduce #4 timed out",
             (int)DDP_ERR_TIMEOUT);
    assert_string_equal(v, want);
    assert_int_equal(fr_wait(&f.r[0], 5000), 1);
    assert_int_equal(f.r[0].fail_st, DDP_ERR_TIMEOUT);
    assert_string_equal(f.r[0].fail_msg, "rank 1 failed: rank 1: nccl: allreduce #4 timed out");
    idle_ms(300);
    assert_int_equal(fr_fails(&f.r[0]), 1); /* told once */
    down_key(&f, v, sizeof v);
    assert_string_equal(v, want); /* rank 0, failed by the peer, wrote nothing */
    nfx_stop(&f);
}

/* A failure that came from a peer (NCCL's ncclRemoteError) is not published again; a clean stop
 * publishes nothing and leaves no death mark: the other rank is never failed. */
static void notice_quiet(void **state)
{
    (void)state;
    notice_fx f;
    nfx_start(&f, 20, 20);
    fr_set(&f.r[1], DDP_ERR_NETWORK, "NCCL reports remote process exited", true);
    idle_ms(500);
    char v[DDP_ERRMSG_MAX + 64];
    down_key(&f, v, sizeof v);
    assert_string_equal(v, "");
    ddp__notice_stop(f.n[1]); /* leaving on purpose: not dying */
    f.n[1] = NULL;
    idle_ms(500);
    down_key(&f, v, sizeof v);
    assert_string_equal(v, "");
    assert_int_equal(fr_fails(&f.r[0]), 0);
    nfx_stop(&f);
}

/* ddp_group_abort right before destroy, never told (the thread had no time to look: poll 60 s):
 * stop publishes it; rank 0 reads "rank 1 aborted the group" with DDP_ERR_CLOSED. Two ranks
 * failing on their own at once, found by their threads: the first to publish wins, the other's
 * message is not written over, and neither is told the other's. */
static void notice_abort_at_stop(void **state)
{
    (void)state;
    notice_fx f;
    nfx_start(&f, 20, 60000);
    fr_set(&f.r[1], DDP_ERR_CLOSED, "the group was aborted on this rank (ddp_group_abort)", false);
    int64_t t0 = ddp__now_ms();
    ddp__notice_stop(f.n[1]);
    f.n[1] = NULL;
    assert_true(ddp__now_ms() - t0 < 2000); /* the stop does not wait for a poll */
    assert_int_equal(fr_wait(&f.r[0], 5000), 1);
    assert_int_equal(f.r[0].fail_st, DDP_ERR_CLOSED);
    assert_string_equal(f.r[0].fail_msg, "rank 1 aborted the group: the group was aborted on "
                                         "this rank (ddp_group_abort)");
    nfx_stop(&f);

    nfx_start(&f, 20, 20);
    fr_set(&f.r[0], DDP_ERR_TIMEOUT, "mine", false);
    fr_set(&f.r[1], DDP_ERR_TIMEOUT, "theirs", false);
    char v[DDP_ERRMSG_MAX + 64];
    down_wait(&f, v, sizeof v, 5000);
    assert_true(strstr(v, "rank 0 failed: mine") || strstr(v, "rank 1 failed: theirs"));
    idle_ms(300);
    char again[DDP_ERRMSG_MAX + 64];
    down_key(&f, again, sizeof again);
    assert_string_equal(again, v);
    assert_int_equal(fr_fails(&f.r[0]) + fr_fails(&f.r[1]), 0);
    nfx_stop(&f);
}

/* The child of notice_process_exit, a fresh process (this program run again: a fork of this
 * multi-threaded one could not start threads under TSan): rank 5's notices on the store at
 * 127.0.0.1:port, never stopped, then exit(code). */
static int notice_child(int port, int code)
{
    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.port = port;
    o.token = "tok";
    o.timeout_ms = 5000;
    ddp_store *s = NULL;
    static fake_rank r; /* (static: reachable at exit, as the notices are) */
    pthread_mutex_init(&r.mu, NULL);
    ddp__notice_hooks h = {.ctx = &r, .error = fr_error, .fail = fr_fail};
    static ddp__notice *n;
    ddp_error err = {0};
    if (ddp_store_connect(&o, &s, &err) != DDP_OK ||
        ddp__notice_start(s, "ddp/g7", 5, 20, &h, &n, &err) != DDP_OK) {
        fprintf(stderr, "notice child: %s\n", err.msg);
        return 9;
    }
    ddp_store_close(s); /* the notices' own connection stays */
    exit(code);         /* n is never stopped */
}

/* A process that ends with its notices live, without stopping them: exit(0) (a program that
 * returns from main without destroying its group succeeded) cancels the death mark; exit(3)
 * leaves it, and the store sets it: rank 5 "left without destroying its group". */
static void notice_process_exit(void **state)
{
    (void)state;
    for (int code = 0; code <= 3; code += 3) {
        notice_fx f;
        nfx_start(&f, 20, 20);
        char port[16], cs[16];
        snprintf(port, sizeof port, "%d", ddp_store_server_port(f.u.srv));
        snprintf(cs, sizeof cs, "%d", code);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            execl("/proc/self/exe", "test_nccl", "--notice-child", port, cs, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), code);
        char v[DDP_ERRMSG_MAX + 64];
        if (code == 0) {
            idle_ms(300);
            down_key(&f, v, sizeof v);
            assert_string_equal(v, "");
            assert_int_equal(fr_fails(&f.r[0]), 0);
        } else {
            assert_int_equal(fr_wait(&f.r[0], 5000), 1);
            assert_int_equal(f.r[0].fail_st, DDP_ERR_NETWORK);
            assert_non_null(strstr(f.r[0].fail_msg, "rank 5 (process "));
            assert_non_null(strstr(f.r[0].fail_msg, ") left without destroying its group: it "
                                                    "died, or exited after an error"));
        }
        nfx_stop(&f);
    }
}

/* The notices inside a group (group.c's hooks: poison, abort, the failing call's tell), on a
 * one-rank CPU group with DDP_TEST_NOTICE=1 — the sanitizer builds have no nccl: an abort with a
 * reason is in the store when ddp_group_abort_reason returns; a peer's notice set by hand poisons
 * the group as the peer's fault, and its next collective fails with the peer's message; a clean
 * destroy leaves no key. */
static ddp_group *notice_group(ddp_world *w)
{
    memset(w, 0, sizeof *w);
    w->world_size = 1;
    w->local_world_size = 1;
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = w;
    o.host_id = "hostA";
    o.timeout_ms = 10000;
    ddp_group *g = NULL;
    ddp_error err = {0};
    setenv("DDP_TEST_NOTICE", "1", 1);
    ddp_status st = ddp_group_init(&o, &g, &err);
    unsetenv("DDP_TEST_NOTICE");
    if (st != DDP_OK)
        fail_msg("group: %s", err.msg);
    return g;
}

static void notice_in_group(void **state)
{
    (void)state;
    ddp_world w;
    ddp_group *g = notice_group(&w);
    ddp_store *c = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_store_clone(ddp_group_store(g), &c, &err), DDP_OK);
    char key[128];
    snprintf(key, sizeof key, "%s/down", ddp__group_prefix(g));
    ddp_group_abort_reason(g, "forward: out of memory");
    const char *k[1] = {key};
    bool have = false;
    assert_int_equal(ddp_store_check(c, k, 1, &have), DDP_OK);
    assert_true(have); /* told before the call returned */
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(ddp_store_get(c, key, &v, &len), DDP_OK);
    assert_non_null(strstr(v, "rank 0 aborted the group: forward: out of memory"));
    free(v);
    assert_false(ddp_group_peer_failed(g));
    ddp_group_destroy(g);

    /* a peer's notice, as a rank 3 would publish it */
    g = notice_group(&w);
    snprintf(key, sizeof key, "%s/down", ddp__group_prefix(g));
    ddp_store_close(c);
    assert_int_equal(ddp_store_clone(ddp_group_store(g), &c, &err), DDP_OK);
    char val[64];
    snprintf(val, sizeof val, "%d rank 3 failed: boom", (int)DDP_ERR_TIMEOUT);
    assert_int_equal(ddp_store_set(c, key, val, strlen(val)), DDP_OK);
    int64_t end = ddp__now_ms() + 5000;
    while (ddp_group_error(g) == DDP_OK && ddp__now_ms() < end)
        idle_ms(5);
    assert_int_equal(ddp_group_error(g), DDP_ERR_TIMEOUT);
    assert_true(ddp_group_peer_failed(g));
    assert_string_equal(ddp_group_last_error(g), "rank 3 failed: boom");
    float x = 1;
    assert_int_not_equal(ddp_allreduce(g, &x, &x, 1, DDP_FLOAT32, DDP_SUM), DDP_OK);
    assert_string_equal(ddp_group_last_error(g), "rank 3 failed: boom");
    ddp_group_destroy(g);

    /* a healthy group destroyed: nothing in the store */
    g = notice_group(&w);
    snprintf(key, sizeof key, "%s/down", ddp__group_prefix(g));
    ddp_store_close(c);
    assert_int_equal(ddp_store_clone(ddp_group_store(g), &c, &err), DDP_OK);
    float y = 2;
    assert_int_equal(ddp_allreduce(g, &y, &y, 1, DDP_FLOAT32, DDP_SUM), DDP_OK);
    ddp_store *keep = c; /* (the group's own store goes with it: ask through this one first) */
    idle_ms(100);
    assert_int_equal(ddp_store_check(keep, k, 1, &have), DDP_OK);
    assert_false(have);
    ddp_store_close(keep);
    ddp_group_destroy(g);
}

/* The store goes away: the notices stop looking, quietly (no failure made up), and stop returns
 * promptly. */
static void notice_store_gone(void **state)
{
    (void)state;
    notice_fx f;
    nfx_start(&f, 20, 20);
    ddp_store_close(f.u.a);
    ddp_store_close(f.u.b);
    ddp_store_server_stop(f.u.srv);
    idle_ms(200);
    int64_t t0 = ddp__now_ms();
    for (int i = 0; i < 2; i++) {
        ddp__notice_stop(f.n[i]);
        assert_int_equal(fr_fails(&f.r[i]), 0);
        pthread_mutex_destroy(&f.r[i].mu);
    }
    assert_true(ddp__now_ms() - t0 < 6000);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--notice-child"))
        return notice_child(atoi(argv[2]), atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(uid_exchange),
        cmocka_unit_test(notice_publish),
        cmocka_unit_test(notice_quiet),
        cmocka_unit_test(notice_abort_at_stop),
        cmocka_unit_test(notice_process_exit),
        cmocka_unit_test(notice_in_group),
        cmocka_unit_test(notice_store_gone),
        cmocka_unit_test(watchdog_healthy),
        cmocka_unit_test(watchdog_stuck),
        cmocka_unit_test(watchdog_error),
        cmocka_unit_test(watchdog_thread),
        cmocka_unit_test(messages),
        cmocka_unit_test(staging),
        cmocka_unit_test(staging_avg),
        cmocka_unit_test(staging_edges),
        cmocka_unit_test(group_without_gpu),
        cmocka_unit_test(staged_unpinned),
        cmocka_unit_test(staged_pinned),
        cmocka_unit_test(fake_ipc_processes),
        cmocka_unit_test(fake_ipc_reduce),
        cmocka_unit_test(ipc_group_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
