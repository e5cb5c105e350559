/*
 * nccl_int.h — the parts of the GPU backends that need no GPU, so that they are built and tested
 * everywhere: the exchange of NCCL's unique id through the store, the watchdog's state machine
 * over any "communicator" (the real one in nccl.c, a fake in tests/unit/test_nccl.c), and the
 * messages naming a failed collective. Private to src/group (nccl.c, staged/, backends.c) and
 * its unit test.
 *
 * Nothing here includes a CUDA or NCCL header: ids, events and communicators are opaque bytes
 * and pointers.
 */
#ifndef DDP_NCCL_INT_H
#define DDP_NCCL_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/store.h"
#include "group/group_int.h"

/* ---- the unique id ------------------------------------------------------------------------- */

/* The store key under which rank 0 publishes the id of the group whose prefix is prefix. */
void ddp__nccl_uid_key(char *key, size_t cap, const char *prefix);

/* Makes a fresh id of n bytes into id (ncclGetUniqueId in nccl.c; fixed bytes in tests). */
typedef ddp_status (*ddp__nccl_uid_make)(void *ctx, void *id, size_t n, ddp_error *err);

/* Gives every member the same id of n bytes: member 0 makes it with make(ctx, …) and sets it
 * under ddp__nccl_uid_key(prefix); the others get it, waiting at most timeout_ms (the group's
 * set-up deadline). Changes the store's timeout to timeout_ms. id written on DDP_OK only.
 * Errors: make's; DDP_ERR_TIMEOUT (rank 0 never published: the store's message), DDP_ERR_INVALID
 * (the value has another size: ranks built against different NCCLs). */
ddp_status ddp__nccl_uid_exchange(ddp_store *store, const char *prefix, int me, int timeout_ms,
                                  ddp__nccl_uid_make make, void *ctx, void *id, size_t n,
                                  ddp_error *err);

/* ---- messages ------------------------------------------------------------------------------ */

/* "allreduce #12 (float32 × 1048576)": what a message calls collective c. */
void ddp__coll_label(char *buf, size_t cap, const ddp__coll *c);

/* One line for a collective that failed in backend be on rank: "rank R: nccl: allreduce #12
 * (float32 × 1048576) failed in ncclAllReduce: <why>; HINT: …". call may be NULL. */
void ddp__gpu_fail_msg(char *buf, size_t cap, const char *be, int rank, const ddp__coll *c,
                       const char *call, const char *why);

/* ---- the watchdog -------------------------------------------------------------------------- */

/* What the watchdog needs from a communicator. All three are called from the watchdog's thread
 * while the owner's thread issues and waits on operations, so they must be thread-safe (NCCL's
 * ncclCommGetAsyncError, cudaEventQuery and ncclCommAbort are). */
typedef struct ddp__wd_comm {
    void *ctx;
    /* DDP_OK while healthy (idle or making progress); else the failure, its cause in msg, and
     * *peer set when the cause is another rank's (NCCL's ncclRemoteError: a peer exited or its
     * connection broke). */
    ddp_status (*async_error)(void *ctx, char *msg, size_t cap, bool *peer);
    /* Whether the operation whose completion marker is ev (a cudaEvent_t) has finished. */
    bool (*done)(void *ctx, void *ev);
    /* Aborts the communicator: pending and later operations fail rather than wait. */
    void (*abort)(void *ctx);
} ddp__wd_comm;

#define DDP__WD_MAX 64 /* operations in flight at once; a group runs one at a time */

typedef struct ddp__wd_op {
    ddp__coll c; /* kind, seq, count, dtype, deadline: what the message names */
    int64_t start_ms;
    void *ev; /* completion marker, for comm.done */
    bool live;
} ddp__wd_op;

/* One per group: started by the backend's create, stopped by its destroy. The state lives under
 * mu; error and msg are written once (the first failure) and then only read. */
typedef struct ddp__watchdog {
    ddp__wd_comm comm;
    const char *backend; /* "nccl", for messages (static) */
    int rank;
    int poll_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ddp__wd_op ops[DDP__WD_MAX];
    uint64_t last_seq; /* the last operation tracked, for a failure while idle */
    atomic_int error;  /* ddp_status; DDP_OK until the first failure */
    char msg[DDP_ERRMSG_MAX];
    bool peer; /* the first failure was another rank's (ddp__fail.peer) */
    bool stop;
    bool thread_started;
    pthread_t thread;
} ddp__watchdog;

/* Sets wd up over comm; with a thread (poll_ms > 0), one that runs ddp__watchdog_step every
 * poll_ms until ddp__watchdog_stop. poll_ms ≤ 0: no thread (a test steps it by hand). */
ddp_status ddp__watchdog_start(ddp__watchdog *wd, const ddp__wd_comm *comm, const char *backend,
                               int rank, int poll_ms, ddp_error *err);

/* Stops and joins the thread; wd may then be freed. Safe on a zeroed or never-started wd. */
void ddp__watchdog_stop(ddp__watchdog *wd);

/* Watches collective c, issued at now, complete once comm.done(ev); it times out at
 * c->deadline_ms. Fails (the first failure's status; DDP_ERR_INVALID when DDP__WD_MAX are in
 * flight) without tracking it. */
ddp_status ddp__watchdog_track(ddp__watchdog *wd, const ddp__coll *c, void *ev, int64_t now);

/* Forgets the operation numbered seq (the owner saw it complete). */
void ddp__watchdog_untrack(ddp__watchdog *wd, uint64_t seq);

/* One pass of the state machine at time now: a communicator in error, or a live operation past
 * its deadline, aborts the communicator (once) and records the failure, naming the operation, its
 * sequence number and the rank; finished operations are forgotten; healthy: nothing. Returns the
 * failure's status (DDP_OK while healthy). */
ddp_status ddp__watchdog_step(ddp__watchdog *wd, int64_t now);

/* Records a failure from outside (ddp_group_abort, a failed call; peer: the cause is another
 * rank's): aborts the communicator, unless a failure was recorded before. */
void ddp__watchdog_fail(ddp__watchdog *wd, ddp_status st, const char *msg, bool peer);

/* The first failure (DDP_OK: none) and, when there is one, its message into msg (cap bytes) and
 * whether it was another rank's into *peer (msg and peer may be NULL). */
ddp_status ddp__watchdog_error(ddp__watchdog *wd, char *msg, size_t cap, bool *peer);

#endif /* DDP_NCCL_INT_H */
