/*
 * ddp/spawn.h — the workers of a one-host world, started from inside one program: what
 * torch.multiprocessing.spawn does for Python, for a C program that wants no launcher.
 *
 *   static int train(const ddp_world *w, void *arg) { ...ddp_group_init(NULL, &g, &err)...; }
 *   ddp_spawn_result res;
 *   ddp_status st = ddp_spawn(4, train, &cfg, NULL, &res, &err);
 *
 * Each worker is a fork of the caller. It gets ddprun's environment contract (RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and DDP_STORE_PORT (both the private
 * store's port here), DDP_RUN_ID, DDP_STORE_TOKEN,
 * DDP_AGENT_STORE=1, …: DDP_ENV_CONTRACT), so ddp_world_from_env() and ddp_group_init(NULL, …)
 * inside fn see the world of nprocs ranks, and a private store that ddp_spawn runs for the call
 * (on a free loopback port, with a fresh token) is where they meet. fn also receives that world.
 *
 * All-or-nothing, as ddprun: when one worker fails (a nonzero return, an exit, a signal), the
 * others get SIGTERM, then SIGKILL after the grace period. A worker that returns
 * DDP_EXIT_PEER_FAILED (ddp/world.h: it stops because another rank reported a failure) is a
 * consequence, as under ddprun: the others get the grace period (at most 5 s) to end on their
 * own first, and one that then fails otherwise is the failure reported; the call returns once every
 * worker and the store are gone. Nothing outlives the call: workers die with the caller
 * (PR_SET_PDEATHSIG), the group's shared memory is unlinked as soon as it is mapped, and a
 * segment that a worker stopped in the middle of a group's set-up left in /dev/shm is removed.
 *
 * Not thread-safe: call it from one thread; fork copies only the calling thread, so the caller
 * should not hold locks other threads need (as with any fork without exec). Linux only.
 *
 * GPUs: do everything CUDA inside fn — the device choice (ddp_device_select), GPU models and GPU
 * groups. A CUDA context does not survive fork: once the caller has made any CUDA call, a
 * worker's first one fails (cudaErrorInitializationError), as with torch.multiprocessing's fork
 * start method; ddprun, which execs each worker, has no such limit.
 */
#ifndef DDP_SPAWN_H
#define DDP_SPAWN_H

#include "ddp/status.h"
#include "ddp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_SPAWN_MAX_PROCS 1024

/* A worker's body. w is the worker's world (rank, sizes, store), valid for the call; arg is
 * ddp_spawn's, shared copy-on-write with the caller (writes are not seen by the caller). Returns
 * the worker's exit code: 0 for success; a value whose low 8 bits are 0 (256) counts as 1. The
 * worker ends with _exit() after flushing stdio, so the caller's atexit handlers do not run in
 * it; fn should return rather than call exit(). Signals start unblocked, SIGTERM at its default. */
typedef int (*ddp_spawn_fn)(const ddp_world *w, void *arg);

typedef struct ddp_spawn_opts {
    int timeout_ms;     /* deadline for the whole run; ≤ 0: 24 h. At the deadline every worker is
                           stopped and the call fails with DDP_ERR_TIMEOUT */
    int grace_ms;       /* from SIGTERM to SIGKILL when stopping workers; ≤ 0: 5 s */
    const char *run_id; /* DDP_RUN_ID of the workers: letters, digits, '_', '.' and '-' (it names
                           shared memory; anything else is DDP_ERR_INVALID); NULL: "spawn-" and
                           random hex */
} ddp_spawn_opts;

#define DDP_SPAWN_OPTS_INIT                                                                        \
    {                                                                                              \
        0, 0, NULL                                                                                 \
    }

/* How the run ended: the first worker to fail, or none. */
typedef struct ddp_spawn_result {
    int failed_rank; /* -1 when every worker returned 0 (and on a timeout) */
    int exit_code;   /* its exit code, or -1 when a signal ended it */
    int signal;      /* the signal that ended it, or 0 */
} ddp_spawn_result;

/* Runs fn in nprocs (1..DDP_SPAWN_MAX_PROCS) forked workers as ranks 0..nprocs-1 of a one-host
 * world and waits for all of them. DDP_OK when every worker returned 0. When one fails:
 * DDP_ERR_CLOSED (the job was stopped) with a message naming the first failed rank and its exit
 * code or signal, e.g. "rank 1 of 4 exited with code 3; the other ranks were stopped"; at the
 * deadline DDP_ERR_TIMEOUT naming the ranks still running; DDP_ERR_INVALID for bad arguments;
 * DDP_ERR_SYSTEM when a fork or the store fails. *result (may be NULL) is written whenever
 * workers ran; err may be NULL. opts may be NULL (DDP_SPAWN_OPTS_INIT). The caller's stdout and
 * stderr are flushed before forking and shared by the workers. */
ddp_status ddp_spawn(int nprocs, ddp_spawn_fn fn, void *arg, const ddp_spawn_opts *opts,
                     ddp_spawn_result *result, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_SPAWN_H */
