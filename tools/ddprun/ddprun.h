/*
 * ddprun.h — the launcher's pieces, private to tools/ddprun. Like every tool it uses only
 * libddp's public API (include/ddp/).
 *
 *   args.c    command line → ddprun_opts (torchrun's flags, both spellings)
 *   agent.c   one node's agent: attempts and restarts, monitoring, the failure summary; with
 *             rendezvous.c (the store on node 0, node rendezvous), elastic.c (--nnodes MIN:MAX
 *             rounds) and presence.c (the other nodes' liveness) behind agent_int.h
 *   workers.c fork/exec of workers with the environment contract, signals, reaping
 *   output.c  rank-prefixed console lines and per-rank log files
 *   reaper.c  a watchdog process that kills the workers' process groups if ddprun dies
 */
#ifndef DDPRUN_H
#define DDPRUN_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DDPRUN_MAX_NPROC 1024
#define DDPRUN_MAX_GPUS 64 /* GPUs per node --isolate_gpus hands out */
#define DDPRUN_GPU_ID 64   /* bytes of one CUDA_VISIBLE_DEVICES entry (an index or a UUID) */

/* --pass_local_rank: none, --local_rank=N (torch.distributed.launch before PyTorch 2.0), or
 * --local-rank=N (2.0 and later) */
enum { PASS_LOCAL_RANK_NONE, PASS_LOCAL_RANK_UNDERSCORE, PASS_LOCAL_RANK_DASH };

/* --bind_to */
enum { BIND_AUTO, BIND_CORE, BIND_NONE };

/* Stream bits, as torchrun's --redirects / --tee values: 1 stdout, 2 stderr, 3 both. */
enum { STD_OUT = 1, STD_ERR = 2 };

typedef struct ddprun_opts {
    int nproc;  /* workers on this node */
    int nnodes; /* with an elastic range (--nnodes MIN:MAX): MAX */
    int node_rank;
    /* --nnodes MIN:MAX with MIN < MAX: torchrun's elastic rendezvous (elastic.c). The
     * nodes that come are numbered as under c10d numbering (node_rank: that order, kept for the
     * node's life; the dense rank of a round is ddprun_world.group_rank). */
    bool elastic;
    int min_nodes;            /* MIN (nnodes when fixed) */
    double last_call_timeout; /* s: --rdzv_conf last_call_timeout, torch's default 30 */
    char rdzv_ignored[600];   /* --rdzv_conf keys accepted without effect, said after parsing */
    /* --rdzv_backend c10d without --node_rank on several nodes: as torchrun's c10d rendezvous,
     * ddprun numbers the nodes. The node that can listen on the endpoint (or is_host=1 in
     * --rdzv_conf) hosts the store and is node 0; the others take 1, 2, … as they join. */
    bool number_nodes;
    bool node_rank_given; /* --node_rank */
    bool rdzv_c10d;       /* --rdzv_backend c10d (or ddp) */
    int is_host;          /* --rdzv_conf is_host: -1 unset, 0 or 1 */
    char master_addr[256];
    int master_port;
    bool standalone;
    int max_restarts;
    double monitor_interval; /* s between multi-node health checks */
    double grace_period;     /* s from SIGTERM to SIGKILL when stopping workers */
    double rdzv_timeout;     /* s for nodes to meet, and for the store's calls */
    double agent_timeout;    /* s without a heartbeat before a node's agent counts as dead */
    int redirects[DDPRUN_MAX_NPROC]; /* per local rank: streams sent to files only */
    int tee[DDPRUN_MAX_NPROC];       /* per local rank: streams sent to files and console */
    bool want_files;                 /* --log_dir, --redirects or --tee given */
    char log_dir[1024];              /* "" until known */
    char log_run_dir[1200];          /* this node's run folder in log_dir (ddprun_output_run_dir) */
    char run_id[128];
    bool run_id_set;
    char role[64];
    bool prefix; /* prefix console lines with the rank (default when world > 1) */
    /* One worker and a terminal on stdin: ddprun passes what is typed to the worker through a
     * pipe while it is the terminal's foreground job (input(), pdb, breakpoint() work as under
     * torchrun), and forwards a partial line (a prompt) without waiting for its newline. */
    bool interactive;
    bool no_prefix; /* --no_prefix */
    /* --log_line_prefix_template (torchrun's): ${role_name}, ${rank}, ${local_rank}; "" none */
    char prefix_template[160];
    bool ranks_filter; /* --local_ranks_filter given: the console shows only shown[] */
    bool shown[DDPRUN_MAX_NPROC];
    char local_addr[256]; /* --local_addr: the workers' DDP_LOCAL_ADDR; "" when not given */
    int bind;             /* BIND_*: pin workers to cores */
    int pass_local_rank;  /* PASS_LOCAL_RANK_*: give each worker its local rank as an argument */
    bool use_env;         /* --use_env: accepted, changes nothing (the environment is always set) */
    bool isolate_gpus;    /* --isolate_gpus: CUDA_VISIBLE_DEVICES = the worker's GPU only */
    bool virtual_local_rank; /* torchrun's --virtual_local_rank: refused */
    int ngpus;               /* with it: the GPUs visible to ddprun, by CUDA's name */
    char gpu_ids[DDPRUN_MAX_GPUS][DDPRUN_GPU_ID];
    char **argv; /* the program and its arguments, untouched */
    /* What runs argv, as torchrun runs Python scripts: {"python3", "-u"} for a PROGRAM ending in
     * .py, {"python3", "-u", "-m"} with --module; none with --no_python or another PROGRAM. */
    const char *python[3];
    int npython;
} ddprun_opts;

/* Parses argv. Returns 0 to run, 1 when --help/--version was printed (exit 0), -1 after printing
 * a usage error to stderr (exit 2). */
int ddprun_parse_args(int argc, char **argv, ddprun_opts *o);

/* ---- workers ------------------------------------------------------------------------------- */

/* Output capture of one stream of one worker. */
typedef struct ddprun_stream {
    int fd;        /* read end of the worker's pipe; -1 when closed or not piped */
    int which;     /* STD_OUT or STD_ERR */
    bool console;  /* forward to our own stdout/stderr */
    int file_fd;   /* the rank's log file, or -1 */
    char *line;    /* the partial line not yet forwarded */
    bool mid_line; /* interactive: part of the current line is on the console already */
    size_t line_len, line_cap;
    char tail[5][200]; /* the last lines seen (stderr), for the failure summary */
    int tail_n, tail_next;
} ddprun_stream;

typedef struct ddprun_worker {
    int rank, local_rank;
    pid_t pid;    /* also its process group id; 0 before spawn */
    bool running; /* spawned and not yet reaped */
    int status;   /* waitpid() status once reaped */
    int64_t exited_ms;
    bool seen_stopped;   /* reported as stopped by someone else; its resumption is reported too */
    int stop_sig;        /* while seen_stopped: the signal that stopped it */
    int64_t stopped_ms;  /* while seen_stopped: when ddprun saw it stop */
    char stopped_at[16]; /* the same, as the wall clock's HH:MM:SS, for other nodes' summaries */
    /* its stops and continues said (one line each at most every 5 s: a throttler's SIGSTOP and
     * SIGCONT 25 times a second made 500 lines in 10 s), and those not said since */
    int64_t stop_said_ms;
    bool stop_said;
    int stops_unsaid;
    bool signaled; /* ddprun sent it a signal to stop it: its end is no failure's cause */
    ddprun_stream out, err;
    int in_fd;           /* interactive: the write end of its stdin pipe; -1 when none or closed */
    char log_path[1500]; /* its stderr.log, or "" */
    /* Its TORCHELASTIC_ERROR_FILE, where it may write why it failed (torchelastic's JSON, as
     * PyTorch's @record and ddptrain do): LOG_DIR/…/attempt_K/LOCAL_RANK/error.json under
     * --log_dir, as torchrun's, else in ddprun's private folder (removed at the end); "" none */
    char error_file[1500];
    int64_t exited_wall; /* time(NULL) when reaped: the failure's time without an error file */
    bool failed_own;  /* ended badly on its own before ddprun stopped it: a root cause candidate */
    char prefix[256]; /* its console lines' prefix (ddprun_output_open) */
} ddprun_worker;

/* What one attempt knows about the world. */
typedef struct ddprun_world {
    int world_size;
    int rank_offset; /* global rank of local rank 0 */
    int attempt;     /* the rendezvous round: attempt_K of the logs, the store's keys */
    int restarts;    /* restarts after failures (TORCHELASTIC_RESTART_COUNT): attempt, except
                        that an elastic re-form for a node that joined counts no restart */
    int group_rank;  /* this node's rank among the nodes of this round (GROUP_RANK) */
    int nnodes;      /* nodes in this round (GROUP_WORLD_SIZE) */
    char token[128];
    int master_port; /* the store's port actually used (--standalone picks one) */
    int store_port;  /* the workers' store, DDP_STORE_PORT: master_port's, except that each round
                        of an elastic job gives its workers a store of their own on node 0 */
    int free_port;   /* a port on node 0 nobody holds, picked each attempt: the workers'
                        MASTER_PORT, for programs that host a store of their own (PyTorch's
                        init_process_group on rank 0) */
} ddprun_world;

/* Resolves prog as execvp would (PATH unless it has a '/'); writes the path into buf. On failure
 * returns false with the errno in *why. */
bool ddprun_find_program(const char *prog, char *buf, size_t cap, int *why);

/* The cores worker local_rank of nproc is pinned to under o->bind, taken in order from the cores
 * ddprun itself may use. Returns false when it is not pinned. */
bool ddprun_worker_cpus(const ddprun_opts *o, int local_rank, cpu_set_t *out);

/* Spawns worker w with the environment contract. Returns 0, or -1 after printing why. */
int ddprun_spawn(const ddprun_opts *o, const ddprun_world *wd, ddprun_worker *w, bool pipe_out,
                 int reaper_fd);

/* Sends sig to the worker's whole process group (no-op if never spawned). */
void ddprun_signal_worker(const ddprun_worker *w, int sig);

/* "exit code 3", "signal 9 (SIGKILL)". */
void ddprun_describe_status(int status, char *buf, size_t cap);

/* ---- output -------------------------------------------------------------------------------- */

/* Opens per-rank log files for the attempt when files are wanted. Returns 0 or -1 (printed). */
/* Makes this node's run folder under --log_dir once, when the run id is known: DIR/RUN_ID (or
 * DIR/RUN_ID/node_N), else the first of DIR/RUN_ID-2, -3, … that does not exist yet, so that a
 * rerun never overwrites an earlier run's logs. 0, or -1 said. */
int ddprun_output_run_dir(ddprun_opts *o);
int ddprun_output_open(const ddprun_opts *o, int attempt, ddprun_worker *w);

/* p at a '$' of a --log_line_prefix_template: which of its names follows, as Python's
 * string.Template reads "${name}" or "$name": 1 role_name, 2 rank, 3 local_rank, with *len the
 * characters from the '$' through the name; 0 for anything else. */
int ddprun_template_name(const char *p, size_t *len);
/* Reads what is available from s and forwards complete lines; returns false at EOF. */
bool ddprun_output_pump(const ddprun_opts *o, ddprun_worker *w, ddprun_stream *s);
/* Flushes a partial line and closes the stream and its file. */
void ddprun_output_close(const ddprun_opts *o, ddprun_worker *w, ddprun_stream *s);
/* Prints a launcher message ("ddprun: …") to stderr as one write. */
void ddprun_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The console's queue (output.c): POLLOUT entries for the consoles with output waiting (at most
 * 2, into p); what they take now; whether so much waits that workers' pipes should wait too;
 * at the end what they take until quiet_ms pass with no room or total_ms in all (a terminating
 * signal ends it); and, in a forked child that keeps running (the reaper), ddprun's own console
 * descriptions closed. */
struct pollfd;
int ddprun_output_pollfds(struct pollfd *p);
void ddprun_output_flush(void);
bool ddprun_output_backlogged(void);
void ddprun_output_drain(int quiet_ms, int total_ms);
void ddprun_output_forget(void);

/* ---- reaper -------------------------------------------------------------------------------- */

/* Forks the watchdog; returns the fd to report process groups to, or -1 (printed). argv is
 * main's: the watchdog writes its own name over its copy of the strings (its command line). */
int ddprun_reaper_start(int argc, char **argv);
/* The watchdog's pid (0 before ddprun_reaper_start): the agent says if it ends early. */
pid_t ddprun_reaper_pid(void);
/* Reports a worker's process group, and the run id its shared-memory segments are named by. */
void ddprun_reaper_track(int fd, pid_t pgid, const char *run_id);
void ddprun_reaper_untrack(int fd, pid_t pgid);
/* Reports ddprun's private folder of error files, removed with what is in it if ddprun dies;
 * "" when ddprun removed it itself. */
void ddprun_reaper_dir(int fd, const char *dir);
/* The name prefix of the /dev/shm segments a worker (pid) of run run_id makes: "ddp-<run_id cut
 * to 40, '/' as '_'>-<pid>-". */
void ddprun_segment_prefix(const char *run_id, pid_t pid, char *buf, size_t cap);
/* Tells the watchdog that ddprun ends normally, then closes fd. */
void ddprun_reaper_finish(int fd);

/* ---- agent --------------------------------------------------------------------------------- */

/* Runs the job on this node. Returns ddprun's exit code. sigfd delivers SIGCHLD, SIGINT, SIGTERM
 * and SIGHUP (all blocked in every thread). */
int ddprun_agent_run(ddprun_opts *o, int sigfd, int reaper_fd);

#endif /* DDPRUN_H */
