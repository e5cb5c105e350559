/*
 * ddp/group.h — the process group: collectives across the ranks of a job.
 *
 * A group is created once per process from the launcher's environment (or explicit options); it
 * meets the other ranks through the rendezvous store, then moves data only through its backend:
 *   shm      ranks on one host, through a POSIX shared-memory segment;
 *   tcp      ranks on any hosts, persistent connections set up through the store;
 *   shm+tcp  shm inside each host and tcp between hosts (hierarchical);
 *   mpi      through the job's MPI, for jobs started by mpirun (set up through MPI, no store);
 *   shm+mpi  shm inside each host and MPI between hosts, under mpirun;
 *   auto     the first of shm, shm+tcp, tcp that can run where the ranks are; under mpirun
 *            shm, shm+mpi, mpi (docs/group.md).
 *
 * Every collective has a deadline (default 30 min, like gloo; DDP_TIMEOUT in seconds, or per
 * group). When it passes, or a peer dies, the call fails with a message naming the operation,
 * its sequence number and the ranks that did not arrive — never a hang. After an error the
 * group is poisoned: every later call returns the first error; destroy it (or abort it first).
 *
 * Collectives are called by every rank in the same order with the same count, dtype and root.
 * With DDP_DEBUG=1 (or opts.debug) the group checks that before each one and reports a mismatch
 * instead of hanging or returning garbage.
 *
 * Buffers: any host memory aligned to the dtype's size works (DDP_DEVICE_CPU; malloc's is; a
 * misaligned one is DDP_ERR_INVALID). Memory from ddp_group_alloc() lives inside the
 * shared segment, so the shm backend reduces it in place with no copy in or out; for one
 * collective, pass such memory on every rank of a host or on none (shm fails the call on all of
 * them otherwise). A GPU group (opts.device = DDP_DEVICE_CUDA) takes device memory on its GPU
 * instead, from cudaMalloc or ddp_group_alloc().
 *
 * Threads: a group is used from one thread at a time, except ddp_group_abort(), which any thread
 * may call. Asynchronous operations run on the group's progress thread, in the order issued.
 */
#ifndef DDP_GROUP_H
#define DDP_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"
#include "ddp/store.h"
#include "ddp/tensor.h"
#include "ddp/world.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_group ddp_group;
typedef struct ddp_work ddp_work;

/* Where a field is not set, the group takes the world's setting (world->settings: DDP_BACKEND,
 * DDP_TIMEOUT, DDP_DEBUG, DDP_HOST_ID for a world read from the environment), else the default.
 * The world's settings also give DDP_HOST_CORES and DDP_SHM_FLUSH, and the reducer's
 * DDP_OVERLAP; to run with none of them, pass a world filled by hand (ddp/world.h). Start from
 * DDP_GROUP_OPTS_INIT (or pass NULL): zeroed by hand, debug is 0 (off) rather than the setting. */
typedef struct ddp_group_opts {
    const char *backend;    /* "auto", "shm", "shm+tcp", "tcp", "mpi" or "shm+mpi"; NULL: the
                               setting, else auto */
    int timeout_ms;         /* per collective; ≤ 0: the setting, else 30 min */
    int debug;              /* 1 check that collectives match across ranks, 0 not, -1 the setting */
    const ddp_world *world; /* NULL: ddp_world_from_env(); else copied, settings included */
    ddp_store *store;       /* NULL: open the job's store; else borrowed for the group's life */
    size_t arena_bytes;     /* per rank, for ddp_group_alloc() in shared memory; 0: 64 MiB */
    const char *host_id;    /* which ranks share a host; NULL: the setting, else the hostname */
    /* A collective that has waited this long is reported (one line: the operation, its sequence
     * number, the ranks it waits for, how long), then again after 2×, 4×, … this, until it
     * completes or times out. 0: the setting, else 30 s; < 0: never. */
    int stall_report_ms;
    /* Where those lines go: called on whichever thread runs the collective (the caller's or
     * the progress thread; for the mpi backend's blocking calls, its watchdog thread, while the
     * collective's own thread is inside MPI); NULL: standard error, prefixed "ddp: ". */
    void (*report)(void *ctx, const char *line);
    void *report_ctx;
    /* Where the collectives' buffers live. DDP_DEVICE_CPU (0, the default): host memory, moved by
     * shm, shm+tcp or tcp. DDP_DEVICE_CUDA: GPU memory on this rank's GPU (LOCAL_RANK modulo the
     * GPUs visible), moved by nccl when every rank on a host has a GPU of its own, else by
     * cuda-ipc when every rank shares the one GPU of one host (peers' device memory mapped
     * through CUDA IPC), else by cuda-staged (through pinned host memory into the host
     * backends); see docs/group.md. */
    ddp_device device;
} ddp_group_opts;

#define DDP_GROUP_OPTS_INIT                                                                        \
    {                                                                                              \
        NULL, 0, -1, NULL, NULL, 0, NULL, 0, NULL, NULL, DDP_DEVICE_CPU                            \
    }

/* Joins the group: every rank of the world must call it. *out written only on DDP_OK. A world
 * whose rank is not in [0, world_size) (one filled by hand) is DDP_ERR_INVALID at once. */
ddp_status ddp_group_init(const ddp_group_opts *opts, ddp_group **out, ddp_error *err);

/* Leaves the group and frees it: waits for queued asynchronous work, stops the progress thread,
 * unmaps and removes shared memory. NULL is a no-op. Set up through MPI (mpirun): the last group
 * finalises MPI if the library initialised it; after a failure that can leave a collective
 * unfinished (a timeout, an abort) it ends the job with MPI_Abort instead (docs/group.md). */
void ddp_group_destroy(ddp_group *g);

/* Makes every pending and future call on g fail with DDP_ERR_CLOSED, here and (through the
 * shared state) on the other ranks, which report "rank R aborted the group: <its first error>".
 * Thread-safe; returns at once (an nccl group first tells its peers through the store: a store
 * call or two, normally well under a millisecond). Use it from a watchdog, a thread that
 * handles the shutdown signals (sigwait, signalfd: it takes locks and may talk to the store, so
 * it is not async-signal-safe — not from inside a signal handler), or after an error before
 * destroy, so that peers fail at once instead of at their deadline. */
void ddp_group_abort(ddp_group *g);
/* ddp_group_abort with why (one line: what made this rank give up, e.g. "forward: out of GPU
 * memory") as the first error here and what the peers report: "rank R aborted the group: why".
 * When g had failed before, that first error stays, as with ddp_group_abort. Thread-safe. */
void ddp_group_abort_reason(ddp_group *g, const char *why);

int ddp_group_rank(const ddp_group *g);
int ddp_group_size(const ddp_group *g);
/* Ranks of this group on this host (from LOCAL_WORLD_SIZE; 1 for a world of one). */
int ddp_group_local_size(const ddp_group *g);
/* The cores this host's ranks share: the world's host_cores setting (DDP_HOST_CORES, which ddprun
 * sets from its own CPU affinity, a container's or scheduler's CPU set, before pinning any
 * worker); else ddp_own_cores(). */
int ddp_group_host_cores(const ddp_group *g);
/* Whether this host has a core beyond one per local rank, and this rank may run on more than
 * one: the one rule for helper threads (the reducer's overlap auto mode, ddptrain's data loader
 * prefetch). Without one, a helper thread
 * only competes with the ranks' own work; both measured slower that way (bench/RESULTS.md). */
bool ddp_group_core_to_spare(const ddp_group *g);
/* The world the group was made from, its settings included; owned by g, valid for its life.
 * NULL for a NULL g. */
const ddp_world *ddp_group_world(const ddp_group *g);
/* The backend's name in the registry: "shm", "tcp", "shm+tcp", "mpi", "shm+mpi", "nccl",
 * "cuda-ipc" or "cuda-staged". */
const char *ddp_group_backend(const ddp_group *g);

/* Why that backend, in a few words ("every rank on one host", "ranks share a GPU (2 ranks on 1
 * GPU of host 'a'; …)"), for a log line; owned by g, "" for NULL. */
const char *ddp_group_backend_reason(const ddp_group *g);

/* GPU groups (opts.device = DDP_DEVICE_CUDA): the GPU this rank uses (-1 for a CPU group), and
 * the CUDA stream (a cudaStream_t; NULL: the default stream) whose work later collectives are
 * ordered after. A collective returns (an _async one's work completes) only once the GPU has
 * finished it, so work queued afterwards sees its result. Not thread-safe with collectives in
 * flight. */
int ddp_group_cuda_device(const ddp_group *g);
void ddp_group_set_stream(ddp_group *g, void *cuda_stream);

/* Copies bytes between any two of host and (for a GPU group) device memory, synchronously: how a
 * program without CUDA headers fills and reads ddp_group_alloc()'s device buffers. On a GPU group
 * the copy starts after the work queued so far on the group's stream (ddp_group_set_stream; the
 * default stream when none was set). A CPU group does a memcpy. Errors: the CUDA call's, in
 * ddp_group_last_error(). */
ddp_status ddp_group_memcpy(ddp_group *g, void *dst, const void *src, size_t bytes);
/* The algorithm an allreduce of bytes per rank runs with on this rank's host, as a static
 * string: on shm the variant the group chose for that size at creation ("libc", "cached",
 * "stream", "pipelined"; docs/group.md), on other backends the backend's name. For benchmarks
 * and logs; the choice never changes a result. "" for a NULL g. */
const char *ddp_group_algorithm(const ddp_group *g, size_t bytes);
/* Sets the deadline of later collectives (≤ 0: the default). */
void ddp_group_set_timeout(ddp_group *g, int timeout_ms);

/* The first error that poisoned g (DDP_OK while healthy), and its message. While g is healthy
 * the message is that of the last call refused for its arguments (an invalid dtype, a NULL
 * buffer, …: such a refusal does not poison g), "" if none. Owned by g, valid until the next
 * call on g. */
ddp_status ddp_group_error(const ddp_group *g);
const char *ddp_group_last_error(const ddp_group *g);
/* Whether that error was another rank's rather than this one's: a peer died or closed its
 * connections, aborted the group (ddp_group_abort), or failed first and passed its error on (tcp's
 * notices: a timeout it saw, collectives that differ). false while healthy, and for this rank's
 * own failures (its own timeout, its own abort, a system call that failed here). A program that
 * stops on a group error exits DDP_EXIT_PEER_FAILED (ddp/world.h) when this is true, so that
 * ddprun reports the rank that failed first-hand (docs/ddprun.md, "Failures"). The shm and tcp
 * backends and those built on them (shm+tcp, cuda-ipc, cuda-staged) tell; nccl tells when NCCL
 * reports ncclRemoteError (a peer exited or its connection broke) and through the store's
 * failure notices (a peer that failed on its own, aborted, or left without destroying the group:
 * set up through the store, not MPI; docs/group.md); mpi says false (MPI ends the job itself). */
bool ddp_group_peer_failed(const ddp_group *g);

/* The store g met its peers through (its own or borrowed), for another group of the same job to
 * borrow (ddp_group_opts.store) while g lives: in a job started without a launcher's store (by
 * hand, srun or mpirun with MASTER_ADDR and MASTER_PORT), rank 0 hosts the store in its first
 * group, and a second group opening the job's store again would find MASTER_PORT taken. NULL
 * for NULL, and for a group set up through MPI (it has no store). The store is used during set-up
 * only; lend it to one group's set-up at a time. */
ddp_store *ddp_group_store(const ddp_group *g);

/* Memory the backend reduces in place (the shared segment for shm; 64-byte aligned). NULL when
 * the arena is full or the backend has none (tcp, mpi: nothing to gain from it there; see
 * ddp_group_backend()): ordinary memory works too, with one copy in and out, as long as the other
 * ranks of the host pass ordinary memory to that collective too. A GPU group: device memory on
 * its GPU (cudaMalloc); NULL when that fails. */
void *ddp_group_alloc(ddp_group *g, size_t bytes);
void ddp_group_free(ddp_group *g, void *p);

/* ---- collectives ---------------------------------------------------------------------------- */
/* send == recv means in place. Counts are elements. All ranks pass the same count, dtype, op and
 * root. The buffers are borrowed until the call (or, for _async, the work) completes. */

/* recv[i] = op over ranks of send[i], i < count. */
ddp_status ddp_allreduce(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t,
                         ddp_op op);
/* buf on every rank = buf on root. */
ddp_status ddp_broadcast(ddp_group *g, void *buf, size_t count, ddp_dtype t, int root);
/* recv (world × count) = the concatenation of every rank's send (count), in rank order. In place
 * when send == recv + rank × count. */
ddp_status ddp_allgather(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t);
/* recv (count) = op over ranks of send[rank × count …] (send holds world × count). In place when
 * recv == send + rank × count. */
ddp_status ddp_reduce_scatter(ddp_group *g, const void *send, void *recv, size_t count, ddp_dtype t,
                              ddp_op op);
ddp_status ddp_barrier(ddp_group *g);

/* Asynchronous forms: start the operation and return a work handle at once (*work written only
 * on DDP_OK). Operations complete in the order issued. */
ddp_status ddp_allreduce_async(ddp_group *g, const void *send, void *recv, size_t count,
                               ddp_dtype t, ddp_op op, ddp_work **work);
ddp_status ddp_broadcast_async(ddp_group *g, void *buf, size_t count, ddp_dtype t, int root,
                               ddp_work **work);
ddp_status ddp_allgather_async(ddp_group *g, const void *send, void *recv, size_t count,
                               ddp_dtype t, ddp_work **work);
ddp_status ddp_reduce_scatter_async(ddp_group *g, const void *send, void *recv, size_t count,
                                    ddp_dtype t, ddp_op op, ddp_work **work);
ddp_status ddp_barrier_async(ddp_group *g, ddp_work **work);

/* Waits for the work (bounded by the group's deadline) and returns its status. */
ddp_status ddp_work_wait(ddp_work *w);
/* Whether the work has finished; if so *status (may be NULL) is its result. Never blocks. */
bool ddp_work_test(ddp_work *w, ddp_status *status);
/* When the work ran, on the ddp__now clock in seconds (CLOCK_MONOTONIC): *start when the
 * backend began it, *end when it finished; both 0 while it has not. Either may be NULL. */
void ddp_work_timing(const ddp_work *w, double *start, double *end);
/* Seconds on the same clock, for comparing with ddp_work_timing(). */
double ddp_now_seconds(void);

/* Frees a work handle; an unfinished one is waited for first. NULL is a no-op. A work handle
 * refers to its group: wait for and free it before ddp_group_destroy(), never after. */
void ddp_work_free(ddp_work *w);

#ifdef __cplusplus
}
#endif
#endif /* DDP_GROUP_H */
