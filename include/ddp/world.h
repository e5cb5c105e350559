/*
 * ddp/world.h — who am I in the job, and how to run: everything the library takes from the
 * environment, read in one place.
 *
 * ddprun (and torchrun) give each worker RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * GROUP_RANK, MASTER_ADDR and MASTER_PORT; ddprun adds DDP_RUN_ID, DDP_STORE_TOKEN,
 * DDP_RESTART_COUNT, DDP_MAX_RESTARTS, DDP_AGENT_STORE, DDP_STORE_PORT (its store's port: the
 * workers' MASTER_PORT is a free one left to a program's own store, as PyTorch's rank 0 makes)
 * and DDP_HOST_CORES (DDP_ENV_CONTRACT lists every name it sets). ddp_world_from_env() reads them
 * and checks that they agree with each other, and reads the DDP_* settings (ddp_settings) too.
 * Other launchers are recognised by their own variables: Open MPI's mpirun (OMPI_COMM_WORLD_*),
 * PMIx (PMIX_RANK), PMI (PMI_RANK, PMI_SIZE: MPICH's mpiexec, srun --mpi=pmi2) and Slurm's srun
 * (SLURM_PROCID, SLURM_NTASKS, …); ddp_world.launcher says which one set the world. With none of
 * them, a program is a world of one and behaves exactly like a plain single-process run.
 * docs/launchers.md gives the order of precedence and what each launcher sets.
 *
 * Nothing else in the library reads the environment: the group, its backends, the reducer and the
 * datasets take their settings from their options (a ddp_world among them), so a program that
 * fills a ddp_world itself runs with no environment variable at all. docs/environment.md lists
 * every variable with its meaning and default.
 */
#ifndef DDP_WORLD_H
#define DDP_WORLD_H

#include <stdbool.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_DEFAULT_MASTER_ADDR "127.0.0.1"
#define DDP_DEFAULT_MASTER_PORT 29500
/* Under srun without MASTER_PORT the store's port is this + 10 × (SLURM_JOB_ID mod 900) +
 * (SLURM_STEP_ID mod 10): 20000–28999, below Linux's ephemeral ports, the same on every rank. */
#define DDP_SLURM_PORT_BASE 20000

/* Every variable ddprun sets for each of its workers (replacing inherited copies), as a list of
 * string literals: `const char *names[] = {DDP_ENV_CONTRACT, NULL};`. */
#define DDP_ENV_CONTRACT                                                                           \
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",      \
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "DDP_RUN_ID",   \
        "DDP_STORE_TOKEN", "DDP_RESTART_COUNT", "DDP_MAX_RESTARTS", "DDP_AGENT_STORE",             \
        "DDP_STORE_PORT", "DDP_HOST_CORES", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",   \
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE"

/* The exit code of a worker that ends only because another rank reported a failure: ddptrain's
 * ranks when rank 0 says it could not save or load a checkpoint or write out_dir, or a program's
 * ranks when a collective failed because of another rank (ddp_group_peer_failed: it died,
 * aborted the group, or failed first). ddprun takes such an exit for a
 * consequence, not the cause: the failure it reports is the rank that failed first-hand, even
 * when that one exits later (docs/ddprun.md, "Failures"). Chosen outside the ranges of shells
 * (126, 127, 128 + signal), sysexits.h (64-78) and ctest's skip (77). */
#define DDP_EXIT_PEER_FAILED 86

/* Who started this process, as ddp_world_from_env() recognised it (docs/launchers.md). */
typedef enum ddp_launcher {
    DDP_LAUNCHER_NONE = 0, /* nothing: a world of one */
    DDP_LAUNCHER_ENV,      /* RANK and WORLD_SIZE alone: by hand, or a launcher that sets only
                              those (torch.distributed.launch before torchrun) */
    DDP_LAUNCHER_DDPRUN,   /* ddprun or ddp_spawn(): RANK with DDP_RUN_ID */
    DDP_LAUNCHER_TORCHRUN, /* torchrun, or torch.distributed.launch ≥ 1.9: RANK with
                              TORCHELASTIC_RUN_ID */
    DDP_LAUNCHER_OMPI,     /* Open MPI's mpirun / mpiexec: OMPI_COMM_WORLD_RANK */
    DDP_LAUNCHER_PMIX,     /* a PMIx launcher other than the above (prterun): PMIX_RANK */
    DDP_LAUNCHER_PMI,      /* a PMI launcher (MPICH's mpiexec): PMI_RANK, PMI_SIZE */
    DDP_LAUNCHER_SLURM,    /* Slurm's srun: SLURM_PROCID with SLURM_STEP_ID */
} ddp_launcher;

/* "none", "env", "ddprun", "torchrun", "mpirun", "pmix", "pmi", "srun"; static, never NULL. */
const char *ddp_launcher_name(ddp_launcher l);

/* How the library runs, as opposed to who runs: the DDP_* settings. Plain data; zero or ""
 * means "not set", and the part of the library that uses a setting then takes its default
 * (named here). Option fields that say the same thing (ddp_group_opts.backend, …) win over these.
 */
typedef struct ddp_settings {
    char backend[64];   /* DDP_BACKEND: the group's backend, "auto" (default), "shm", "tcp", … */
    int timeout_ms;     /* DDP_TIMEOUT, in seconds there: a collective's deadline; 30 min */
    int debug;          /* DDP_DEBUG: nonzero checks that collectives match across ranks */
    char host_id[256];  /* DDP_HOST_ID: which ranks share a host; the hostname */
    int host_cores;     /* DDP_HOST_CORES: the cores this host's ranks share; ddp_own_cores() */
    char shm_flush[32]; /* DDP_SHM_FLUSH: "auto" (default), "always" or "never" */
    char shm_algo[32];  /* DDP_SHM_ALGO: the shm allreduce's variant: "auto" (default: the cached
                           choice, else a probe), "probe", "rules", "libc", "cached", "stream",
                           "pipelined" (docs/group.md) */
    char cache_dir[4096];  /* DDP_CACHE_DIR: where choices per machine are cached;
                              $XDG_CACHE_HOME/ddpc, else $HOME/.cache/ddpc; "off": nowhere */
    char overlap[32];      /* DDP_OVERLAP: the reducer's DDP_OVERLAP_AUTO becomes "async" or
                              "inline"; else it decides by cores */
    char data_cache[4096]; /* DDP_DATA_CACHE: where gzip datasets are decompressed to;
                              /tmp/ddp-data-cache */
    int stall_report_ms;   /* DDP_STALL_REPORT, in seconds there: a collective still waiting after
                              this long is reported, then at doubling intervals; 30 s; "0" or
                              "off": never (-1 here) */
    int fake_gpus; /* DDP_TEST_FAKE_GPUS, for tests only: GPU groups act as if this host had N
                      GPUs, with host memory standing for device memory and memcpy for the
                      copies, over cuda-staged (never nccl); 0: real GPUs */
    char gpu_module[4096]; /* DDP_GPU_MODULE: the GPU module's file (libddp_gpu.so) to load on
                              first GPU use; the search in docs/gpu.md */
    char mpi_mode[32];     /* DDP_MPI_MODE: how the mpi backend calls MPI: "blocking" (default:
                              MPI's blocking collectives, the deadline kept by a watchdog that
                              ends the job) or "nonblocking" (MPI_I… tested against the
                              deadline, which returns the error); docs/group.md */
    char local_addr[256];  /* DDP_LOCAL_ADDR (ddprun --local_addr): the address of this host
                              that the tcp backend's data connections listen on and publish;
                              empty: the interface that routes toward MASTER_ADDR */
} ddp_settings;

/* Plain data: a snapshot of the environment, filled by ddp_world_from_env(). */
typedef struct ddp_world {
    int rank;             /* RANK, 0 ≤ rank < world_size */
    int world_size;       /* WORLD_SIZE */
    int local_rank;       /* LOCAL_RANK: index among the ranks on this node; rank when the
                             launcher does not say (local_rank_known false) */
    int local_world_size; /* LOCAL_WORLD_SIZE */
    int node_rank;        /* GROUP_RANK (SLURM_NODEID under srun): index of this node; 0 when
                             the launcher does not say (mpirun) */
    int restart_count; /* DDP_RESTART_COUNT (or TORCHELASTIC_RESTART_COUNT), 0 on the first attempt
                        */
    int max_restarts;  /* DDP_MAX_RESTARTS (or TORCHELASTIC_MAX_RESTARTS) */
    char master_addr[256]; /* MASTER_ADDR: host of the rendezvous store; under srun without it,
                              the first host of the step's node list */
    int master_port;       /* the store's port: DDP_STORE_PORT under ddprun (which leaves
                              MASTER_PORT free for a program's own store, as PyTorch's), else
                              MASTER_PORT; under srun without it, derived from the job id */
    char run_id[128];      /* DDP_RUN_ID (or TORCHELASTIC_RUN_ID); "none" when unset */
    char store_token[128]; /* DDP_STORE_TOKEN; empty when unset */
    bool launched;         /* true when a launcher set the world (launcher != NONE) */
    ddp_launcher launcher; /* which one */
    bool local_rank_known; /* the launcher stated local_rank (LOCAL_RANK, SLURM_LOCALID, …) */
    bool master_known;     /* MASTER_ADDR/MASTER_PORT were given (or derived from Slurm's node
                              list): a store address every rank agrees on. False under mpirun
                              or PMI without them: only a backend that bootstraps itself (MPI)
                              can bring up such a world */
    bool agent_store;      /* true when a launcher (ddprun) hosts the store; else rank 0 hosts it */
    bool beside_torch_store; /* torchrun's agent serves PyTorch's own store on MASTER_PORT
                                (TORCHELASTIC_USE_AGENT_STORE=True): master_port is MASTER_PORT + 1
                              */
    ddp_settings settings;   /* the DDP_* settings; all "not set" in a world filled by hand */
} ddp_world;

/* Reads the environment into *out: the world, and its settings. A world of one when no launcher
 * is recognised. Fails with DDP_ERR_INVALID when a variable of the contract is malformed or the
 * set is inconsistent (RANK without WORLD_SIZE, WORLD_SIZE > 1 without RANK, RANK ≥ WORLD_SIZE,
 * …), when two launchers'
 * variables disagree about this process (RANK=0 but OMPI_COMM_WORLD_RANK=1, WORLD_SIZE=2 but
 * SLURM_NTASKS=4: never two silent worlds), when Slurm's node list is malformed, or a setting is
 * longer than its field, naming the variables; a malformed number in DDP_TIMEOUT, DDP_DEBUG or
 * DDP_HOST_CORES is an error naming it. *out written only on DDP_OK; err may be NULL. */
ddp_status ddp_world_from_env(ddp_world *out, ddp_error *err);

/* The cores this process may run on: its CPU affinity mask (a container's or scheduler's CPU
 * set, or a --bind_to block), else the number online. At least 1. */
int ddp_own_cores(void);

/* Each rank's share of the host's cores for its CPU threads, for launchers that set no thread
 * count (mpirun, srun, ranks started by hand; ddprun and torchrun set OMP_NUM_THREADS): when
 * OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are both unset and w has several ranks on this host
 * (local_world_size > 1), sets OpenBLAS's threads, and OMP_NUM_THREADS for the OpenMP kernels
 * loaded later (oneDNN's), to max(1, min(ddp_own_cores(), online cores / local ranks)) and
 * returns that count; else changes nothing and returns 0. Without it every rank starts a thread
 * per core: ranks × cores threads on the host's cores. Call it before any CPU work. */
int ddp_world_default_threads(const ddp_world *w);

#ifdef __cplusplus
}
#endif
#endif /* DDP_WORLD_H */
