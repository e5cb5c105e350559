/*
 * group_int.h — inside the process group: one collective described as data, the table of
 * operations every backend implements, and the registry entry through which the core creates
 * and chooses backends. Private to src/group.
 *
 * The core (group.c) owns ordering, deadlines, poisoning, the debug check and the progress
 * thread; a backend only moves and reduces bytes among its members, and reports which members
 * failed to arrive. A backend works on a *member list* rather than the whole world, so the
 * hierarchical backend can run shm among the ranks of a host and tcp among hosts.
 *
 * Where the code lives: the core in group.c, the registry and auto's choice in backends.c, each
 * backend in its own folder (shm/, tcp/, hier/, mpi/; later nccl/), which exports one
 * ddp__backend entry and keeps everything else to itself.
 *
 * Set-up meets the peers in one of two ways: through the rendezvous store (ddprun, torchrun), or,
 * for a job started by mpirun, through MPI itself (mpi/boot.c), with no store at all. A backend
 * that only needs to share a few bytes while it is created (shm) goes through ddp__setup_bcast()
 * and ddp__setup_barrier(), which work either way.
 */
#ifndef DDP_GROUP_INT_H
#define DDP_GROUP_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/group.h"

typedef enum ddp__kind {
    DDP__ALLREDUCE,
    DDP__BROADCAST,
    DDP__ALLGATHER,
    DDP__REDUCE_SCATTER,
    DDP__BARRIER,
    DDP__KIND_COUNT
} ddp__kind;

const char *ddp__kind_name(ddp__kind k);

/* Reports of a collective that waits long (ddp_group_opts.stall_report_ms): the core sets one up
 * per collective; a backend's wait loop asks ddp__stall_due() whenever it wakes and, when a report
 * is due, says whom it waits for through ddp__stall_report(). Mutable while the collective runs,
 * by the one thread running it. */
typedef struct ddp__stall {
    int64_t start_ms;    /* when the collective started (ddp__now_ms() clock) */
    int64_t next_ms;     /* when the next report is due; INT64_MAX: never */
    int64_t interval_ms; /* until the next one after that: doubles each time */
    int rank;            /* this process's global rank, for the line */
    void (*report)(void *ctx, const char *line); /* NULL: standard error */
    void *ctx;
} ddp__stall;

/* One collective. Buffers follow the public API's meaning (send == recv for in place). */
typedef struct ddp__coll {
    ddp__kind kind;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank for allgather/reduce_scatter, total otherwise */
    ddp_dtype dtype;
    ddp_device device; /* where send and recv live; the public calls pass host memory (CPU),
                          which is all shm and tcp move; a GPU backend will take CUDA */
    ddp_op op;
    int root;            /* member index, broadcast only */
    uint64_t seq;        /* 1, 2, … per group, the same on every member */
    bool background;     /* run by the progress thread: nobody waits on it right now, so a
                            backend should not spin (it would steal the caller's core) */
    int64_t deadline_ms; /* absolute, ddp__now_ms() clock */
    int avg_div;         /* > 1: divide results by this while reducing (AVG, fused); set by the
                            core only for backends whose fuses_avg is true */
    /* Device ordering, for a GPU backend: the stream the collective is issued on and an event
     * the backend records on it once the result is ready (cudaStream_t / cudaEvent_t under CUDA),
     * both opaque here. NULL on CPU: CPU backends ignore them and the core passes them through
     * unchanged, so a GPU backend can order collectives after the compute that produced their
     * buffers without a change in the core's ordering or in the reducer. */
    void *stream;
    void *event;
    /* An event recorded on stream when the caller submitted the collective (devops' mark), for a
     * collective the progress thread runs: the backend orders its stream after it rather than
     * after all the caller's stream holds by then. NULL: ordered after stream as it is at run(). */
    void *ready;
    ddp__stall *stall; /* NULL: no reports (the debug check's own allgather, tests) */
} ddp__coll;

/* What a message calls collective c: "barrier #7", "allreduce #7 (float32 × 1024)". */
void ddp__coll_what(const ddp__coll *c, char *buf, size_t cap);

/* Whether a stall report for c is due at now (ddp__now_ms()). Cheap: call it on every wake-up. */
static inline bool ddp__stall_due(const ddp__coll *c, int64_t now)
{
    return c->stall && now >= c->stall->next_ms;
}

/* The earliest of deadline and the next stall report: what a backend's wait should sleep until. */
static inline int64_t ddp__stall_wake(const ddp__coll *c, int64_t deadline)
{
    return c->stall && c->stall->next_ms < deadline ? c->stall->next_ms : deadline;
}

/* Emits one line: "rank R: allreduce #S (float32 × N) has waited 30 s in BACKEND: WAITING_FOR;
 * still waiting (times out in 29 min 30 s)", and schedules the next report at twice the
 * interval. waiting_for names the ranks (e.g. "ranks 2, 3 have not arrived"). */
void ddp__stall_report(const ddp__coll *c, int64_t now, const char *backend,
                       const char *waiting_for);

/* What a backend needs to know about its members. */
typedef struct ddp__members {
    int me;                  /* my index in ranks[] */
    int n;                   /* number of members */
    const int *ranks;        /* global ranks, by member index */
    const char *prefix;      /* unique store-key prefix for this backend instance */
    const char *run_id;      /* the job's id, for naming shared memory */
    const char *token;       /* the job's store token: data connections must show it too */
    const char *master_addr; /* the store's host: tcp picks the local interface toward it */
    const char *local_addr;  /* DDP_LOCAL_ADDR: tcp's address instead, when not empty */
} ddp__members;

/* Failure report of a backend: status, message, and which members did not arrive. */
typedef struct ddp__fail {
    ddp_status status;
    char msg[DDP_ERRMSG_MAX];
    /* The cause is another rank's, not this one's: it died or closed its connections, aborted
     * the group, or failed first and its notice says so (ddp_group_peer_failed). false for this
     * rank's own timeout, a mismatch it found, a failed system call here. */
    bool peer;
} ddp__fail;

typedef struct ddp__backend_ops {
    const char *name;
    /* Runs one collective among the members; blocks until done, failed, or c->deadline_ms. On
     * failure fills *f (message names what failed and, if known, the missing global ranks). */
    ddp_status (*run)(void *be, const ddp__coll *c, ddp__fail *f);
    /* Memory the backend handles without copies; NULL when it has none (may be NULL). */
    void *(*alloc)(void *be, size_t bytes);
    void (*free)(void *be, void *p);
    /* GPU backends: a synchronous copy between any two of host and device memory (NULL for the
     * host backends); a failure writes one line into msg (DDP_ERRMSG_MAX bytes). */
    ddp_status (*copy)(void *be, void *dst, const void *src, size_t bytes, char *msg);
    /* Thread-safe: make current and later run() calls fail fast here and on the peers; why
     * (one line, e.g. the error that made this rank give up) is shown to the peers. */
    void (*abort)(void *be, const char *why);
    void (*destroy)(void *be);
    /* The name of the algorithm an allreduce of bytes per member runs with (a static string);
     * NULL: the backend has one, and ddp_group_algorithm() gives the backend's name. */
    const char *(*algorithm)(void *be, size_t bytes);
    /* How this backend came out when created, where that varies, in a few words that end the
     * group's reason line (ddp_group_backend_reason): cuda-staged's "staging buffer pinned" or
     * not. A string owned by be; NULL (or a NULL op): nothing to add. */
    const char *(*detail)(void *be);
    /* GPU backends: their device operations (group/devops.h), which the reducer uses on
     * gradient buckets in device memory; NULL (or a NULL op) for the host backends. */
    const struct ddp__devops *(*devops)(void *be);
    bool fuses_avg; /* run() honours c->avg_div: no second pass over the result for AVG */
} ddp__backend_ops;

/* ---- backends: how they are created and chosen (backends.c) ---------------------------------- */

/* Everything a backend is created from. The core fills one for the whole group; hier narrows
 * copies of it for the shm and tcp backends it is made of. */
typedef struct ddp__setup {
    ddp__members m;            /* who takes part */
    const char *const *hosts;  /* (m.n,) each member's host id (hostname or DDP_HOST_ID) */
    int nhosts;                /* distinct hosts among the members */
    int per_host;              /* members per host when every host holds the same number and each
                                  host's members are contiguous (what ddprun gives); else 0 */
    ddp_store *store;          /* borrowed by create() for set-up only */
    int timeout_ms;            /* bounds set-up */
    size_t arena_bytes;        /* per member, for ops->alloc (shm) */
    int host_cores;            /* the cores this host's ranks share (shm spins only if it fits) */
    const char *shm_flush;     /* shm's eviction of far peers' lines: "auto", "always" or "never";
                                  NULL or "": auto */
    struct ddp__mpi_boot *mpi; /* the job's MPI (mpi/boot.c) when set-up goes through MPI rather
                                  than the store; then store is NULL. NULL otherwise */
    /* GPU groups (ddp_group_opts.device): where the buffers live, and what each host has. */
    ddp_device device;     /* DDP_DEVICE_CPU: host buffers, the CPU backends */
    const int *gpus;       /* (m.n,) GPUs visible on each member's host; NULL on CPU */
    int cuda_device;       /* the GPU this member uses: LOCAL_RANK modulo its host's GPUs */
    bool cuda_built;       /* this libddp has CUDA (DDP_CUDA) */
    bool nccl_built;       /* … and NCCL (DDP_NCCL) */
    bool fake_gpu;         /* tests (DDP_TEST_FAKE_GPUS): host memory stands for device memory */
    const char *shm_algo;  /* shm's allreduce variant: "auto", "probe", "rules" or a variant's
                              name (shm/shm_int.h); NULL or "": auto */
    const char *cache_dir; /* where shm caches its choice per machine; NULL or "": nowhere */
    const char *mpi_mode;  /* the mpi backend's calls: "blocking", "nonblocking"; NULL or "":
                              blocking (mpi/mpi.c) */
} ddp__setup;

/* During create(): member 0's len bytes in buf reach every member's buf (name: unique among this
 * backend's set-up steps). Through the store (key "<prefix>/<name>") or MPI, bounded by
 * s->timeout_ms. */
ddp_status ddp__setup_bcast(const ddp__setup *s, const char *name, void *buf, size_t len,
                            ddp_error *err);
/* During create(): returns once every member has called it with the same name. */
ddp_status ddp__setup_barrier(const ddp__setup *s, const char *name, ddp_error *err);
/* A set-up wait on the store that failed with st: DDP_ERR_CLOSED with the message of the rank
 * whose failure ended it (the group's set-up failure key, ddp_store_abort_on), else
 * DDP_ERR_TIMEOUT with the store's message. */
ddp_status ddp__setup_store_failed(ddp_store *store, ddp_status st, ddp_error *err);

/* How a backend's members meet during create(). */
typedef enum ddp__boot_kind {
    DDP__BOOT_ANY,   /* through ddp__setup_bcast/barrier only: either way (shm) */
    DDP__BOOT_STORE, /* needs the rendezvous store (tcp, shm+tcp) */
    DDP__BOOT_MPI,   /* needs MPI (mpi, shm+mpi) */
} ddp__boot_kind;

/* A backend as the registry lists it. Adding one (nccl, mpi, …) is a folder under src/group with
 * one of these, and a line in backends.c's table, whose order is auto's preference. */
typedef struct ddp__backend {
    const char *name; /* what opts.backend / DDP_BACKEND call it; ddp_group_backend() returns it */
    /* Whether it can run a group placed as s says (hosts, counts, what the host has); it must not
     * talk to the store or the peers, and every member must reach the same answer. When false,
     * writes why into why (cap bytes): the end of "backend 'NAME' <why>", saying what to do. */
    bool (*usable)(const ddp__setup *s, char *why, size_t cap);
    /* Creates it; every member calls this, meeting the others through s->store. *be and *ops are
     * written only on DDP_OK. */
    ddp_status (*create)(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                         ddp_error *err);
    ddp__boot_kind boot; /* what set-up it needs: the core boots through MPI only when it may */
    bool gpu; /* moves GPU buffers (nccl, cuda-ipc, cuda-staged); the others host memory only */
    /* Its transport cannot tell the peers that a rank failed or died (nccl): the core adds the
     * store's failure notices (notice.c) when the group was set up through the store. */
    bool notice;
    int pick; /* GPU entries: the ddp__gpu_pick for which auto takes this entry first */
} ddp__backend;

extern const ddp__backend ddp__shm_backend;    /* shm/shm.c: ranks on one host */
extern const ddp__backend ddp__hier_backend;   /* hier/hier.c: shm within hosts, tcp among them */
extern const ddp__backend ddp__tcp_backend;    /* tcp/setup.c: any placement */
extern const ddp__backend ddp__nccl_backend;   /* nccl/proxy.c → the GPU module: a GPU per rank */
extern const ddp__backend ddp__staged_backend; /* staged/staged.c: ranks sharing GPUs */
extern const ddp__backend ddp__ipc_backend;    /* ipc/ipc.c: ranks sharing a GPU of one host */
#ifdef DDP_HAVE_MPI
extern const ddp__backend ddp__mpi_backend;      /* mpi/mpi.c: any placement, under mpirun */
extern const ddp__backend ddp__hier_mpi_backend; /* hier/hier.c: shm within hosts, mpi among them */
#endif

/* ---- failure notices through the store (notice.c) ------------------------------------------ */

typedef struct ddp__notice ddp__notice;
typedef struct ddp__notice_hooks {
    void *ctx;
    /* This rank's first failure (DDP_OK while healthy), its message into msg (cap bytes), and
     * whether it came from another rank (*peer). Called from the notice thread: thread-safe. */
    ddp_status (*error)(void *ctx, char *msg, size_t cap, bool *peer);
    /* A peer's notice: fail this rank's group with status st and msg as the peer's fault, so
     * that what waits returns at once. Called from the notice thread: thread-safe. */
    void (*fail)(void *ctx, ddp_status st, const char *msg);
} ddp__notice_hooks;

/* Starts this rank's notices for the group whose store-key prefix is prefix: a connection of its
 * own to store's server (ddp_store_clone) that marks this rank dead if it closes before stop or
 * exit(0) (ddp_store_on_close_first), and a thread that every poll_ms publishes this rank's own
 * first failure (hooks.error, not a peer's) or, when a peer published one, hands it to
 * hooks.fail — whichever comes first, once. *out written only on DDP_OK. */
ddp_status ddp__notice_start(const ddp_store *store, const char *prefix, int rank, int poll_ms,
                             const ddp__notice_hooks *h, ddp__notice **out, ddp_error *err);
/* Publishes this rank's own failure now (hooks.error; not a peer's), if not yet: called where
 * the group is first poisoned, so that the peers read the cause even when the program exits at
 * once, without destroying the group (which would leave only the death mark). Waits for a
 * store call or two. Thread-safe; NULL is a no-op. */
void ddp__notice_tell(ddp__notice *n);
/* The group's store-key prefix (its notices' key is "<prefix>/down"), for tests. */
const char *ddp__group_prefix(const ddp_group *g);
/* Stops the thread; publishes this rank's own failure if the thread had not yet, cancels the
 * death mark and closes the connection. NULL is a no-op. */
void ddp__notice_stop(ddp__notice *n);

/* ---- MPI set-up (mpi/boot.c; without DDP_HAVE_MPI, stubs that say it is not built) ----------- */

typedef struct ddp__mpi_boot ddp__mpi_boot;

/* Whether this library was built with the MPI backend. */
bool ddp__mpi_built(void);
/* Joins the job's MPI: initialises MPI unless the program already did (then it is the program's
 * to finalise), checks that MPI's rank and size are the world's, and bounds every later set-up
 * step by timeout_ms. *out written only on DDP_OK. */
ddp_status ddp__mpi_boot_open(int rank, int world_size, int timeout_ms, ddp__mpi_boot **out,
                              ddp_error *err);
/* Every rank's len bytes (mine) into all (world_size × len), in rank order. */
ddp_status ddp__mpi_boot_allgather(ddp__mpi_boot *b, const void *mine, void *all, size_t len,
                                   ddp_error *err);
/* Among the global ranks ranks[0..n) (me is my index): member 0's len bytes in buf to every
 * member's buf; a barrier. Both bounded by the boot's timeout. */
ddp_status ddp__mpi_boot_bcast(ddp__mpi_boot *b, const int *ranks, int n, int me, void *buf,
                               size_t len, ddp_error *err);
ddp_status ddp__mpi_boot_barrier(ddp__mpi_boot *b, const int *ranks, int n, int me, ddp_error *err);
/* Which group of this process this is (0, 1, …): the same on every rank. */
int ddp__mpi_boot_index(const ddp__mpi_boot *b);
/* Leaves: when this was the last group on MPI that the library initialised, waits (bounded) for
 * every rank and finalises MPI. failed (non-NULL: why, one line) when the group failed (a
 * collective that never completed, an abort): prints why and ends the whole job with MPI_Abort
 * instead, since MPI cannot cancel a collective nor finalise without every rank; on MPI the
 * program initialised, leaves that to the program. NULL b is a no-op. */
void ddp__mpi_boot_close(ddp__mpi_boot *b, const char *failed);

/* What this build has in its GPU module (nccl/proxy.c): nccl.c (DDP_NCCL), cudaops.c (DDP_CUDA). */
extern const bool ddp__nccl_built;
extern const bool ddp__cuda_built;

/* ---- GPU groups: which backend, from the host layout (backends.c) -----------------------------
 */

typedef enum ddp__gpu_pick {
    DDP__PICK_HOST,   /* host buffers: the CPU backends (shm, shm+tcp, tcp) as placed */
    DDP__PICK_NCCL,   /* every rank on a host has a GPU of its own, and NCCL is built */
    DDP__PICK_IPC,    /* ranks share a GPU (or no NCCL), the whole world on one host and one GPU:
                         cuda-ipc, the peers' device memory mapped through CUDA IPC */
    DDP__PICK_STAGED, /* ranks share a GPU, or no NCCL, on several hosts or GPUs: staged through
                         pinned host memory */
    DDP__PICK_NONE    /* GPU buffers but no CUDA, or a host without a GPU: why says so */
} ddp__gpu_pick;

/* Where the ranks of a group run and what each host has: the input of the choice. */
typedef struct ddp__gpu_layout {
    ddp_device device; /* where the buffers live */
    int nhosts;
    const int *ranks_per_host; /* (nhosts,) */
    const int *gpus_per_host;  /* (nhosts,) GPUs visible to the ranks of that host */
    const char *const *host;   /* (nhosts,) names, for the reason; may be NULL */
    bool cuda_built, nccl_built;
} ddp__gpu_layout;

/* The backend auto uses for layout l, and why in one line (cap bytes): "every rank has a GPU of
 * its own (4 ranks on 4 GPUs per host)". Pure: no CUDA, no store, the same on every rank. */
ddp__gpu_pick ddp__gpu_choice(const ddp__gpu_layout *l, char *why, size_t cap);

/* ddp__gpu_choice over a setup (hosts and gpus per member); why as there. */
ddp__gpu_pick ddp__setup_gpu_choice(const ddp__setup *s, char *why, size_t cap);

/* The GPU a rank uses: its local rank modulo the GPUs visible on its host (torchrun's
 * LOCAL_RANK binding; several ranks share a GPU when there are more ranks than GPUs). -1 when
 * ngpus ≤ 0. */
int ddp__gpu_for_local_rank(int local_rank, int ngpus);

/* Fills s->nhosts and s->per_host from s->hosts and s->m.n. */
void ddp__setup_place(ddp__setup *s);

/* The entry named want; NULL, "" or "auto" give *out = NULL (auto: chosen once the placement is
 * known). An unknown name fails with DDP_ERR_INVALID, listing the names there are. */
ddp_status ddp__backend_lookup(const char *want, const ddp__backend **out, ddp_error *err);

/* The backend for a group placed as s says: named (from ddp__backend_lookup) if its usable()
 * holds, else DDP_ERR_INVALID saying why; with named NULL (auto), the registry's first entry
 * whose usable() holds. *out written only on DDP_OK. */
ddp_status ddp__backend_choose(const ddp__backend *named, const ddp__setup *s,
                               const ddp__backend **out, ddp_error *err);

/* Why the backend chose was chosen for s, in a few words for rank 0's DDP line (cap bytes):
 * "named by the caller", "every rank on one host", "every rank has a GPU of its own (…)", …. */
void ddp__backend_reason(const ddp__backend *chosen, bool named, const ddp__setup *s, char *why,
                         size_t cap);

/* The tcp backend's own constructor (the registry entry calls it; so do the unit tests). store is
 * borrowed for the call (set-up only); timeout_ms bounds set-up. */
ddp_status ddp__tcp_create(const ddp__members *m, ddp_store *store, int timeout_ms, void **be,
                           const ddp__backend_ops **ops, ddp_error *err);

#endif /* DDP_GROUP_INT_H */
