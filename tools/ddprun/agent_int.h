/*
 * agent_int.h — one node's agent, private to the agent's files (ddprun.h says what the rest of
 * ddprun sees: ddprun_agent_run).
 *
 *   agent.c       the lifecycle: attempts and restarts, signals, the monitor loop, failures and
 *                 the summary
 *   rendezvous.c  the store's set-up (node 0 hosts it, c10d numbering) and a fixed job's node
 *                 rendezvous (claims, records, the workers' MASTER_PORT)
 *   elastic.c     an elastic job's rendezvous rounds (--nnodes MIN:MAX) and its newcomers
 *   presence.c    the other nodes' liveness: the presence connection, heartbeats, node 0's
 *                 node-lost decision, the failed key, the final handshake
 *
 * Nodes coordinate only through the store, under "ddprun/…" keys:
 *   attempt                              the attempt node 0 is at (its rendezvous sets it): a
 *                                        node's ddprun started anew joins the job there
 *   a<k>/claim/<node>, a<k>/node/<node>  the rendezvous of attempt k ("nproc max_restarts")
 *   a<k>/failed                          first failure of attempt k, one line (compare_set);
 *                                        a secondary one (DDP_EXIT_PEER_FAILED) is marked, and
 *                                        a first-hand failure replaces it (compare_set again)
 *   a<k>/done/<node>                     that node's workers all exited 0
 *   hb/<node>                            heartbeat counters; node 0 watches them
 *   gone/<node>                          set by the store itself when that node's presence
 *                                        connection closes (ddp_store_on_close): its ddprun
 *                                        was killed or its machine went down with the network up
 *   final_acks                           nodes that finished; node 0 waits for them before the
 *                                        store goes away
 * An elastic job (--nnodes MIN:MAX) meets in rounds instead of claims (elastic.c); a failed-key
 * line "re-form: …" restarts its group for a newcomer, counting no restart.
 */
#ifndef DDPRUN_AGENT_INT_H
#define DDPRUN_AGENT_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"
#include "ddprun.h"

/* "host:port" in messages, an IPv6 address in brackets ("[::1]:29500") */
#define HOSTF "%s%s%s:%d"
#define HOSTA(h, p) strchr(h, ':') ? "[" : "", h, strchr(h, ':') ? "]" : "", p

/* FAILED may restart; the others end the job. */
typedef enum outcome {
    OK_ALL,
    FAILED,
    RESHAPED, /* elastic: a node joined; the group restarts larger, no restart counted */
    SIGNALED,
    REMOTE_STOP,
    STORE_LOST,
    AGENT_ERROR
} outcome;

#define STOP_MARK "stopped: " /* a failed-key line for a signal: the group must not restart */
#define SECONDARY_MARK "secondary: " /* a failed-key line for a DDP_EXIT_PEER_FAILED exit */
#define RESHAPE_MARK "re-form: " /* a failed-key line for an elastic job's newcomer: no failure */

/* The failure lines of a node whose ddprun stopped beating, and of a lost store: no summary
 * comes from that node. */
#define LINE_HEARTBEAT_LOST "stopped responding"
#define LINE_STORE_LOST "lost contact with the store"
#define LINE_NODE_GONE "lost: its ddprun's connection to the store closed"

typedef struct failure {
    bool set;
    bool local; /* a worker of this node, with the details below */
    int rank, local_rank;
    pid_t pid;
    int status;
    char when[64];
    char log[1500];
    char tail[5][200];
    int tail_n;
    char line[700]; /* one-line description, shared with other nodes */
    /* The worker exited DDP_EXIT_PEER_FAILED (or another node reported such a one): it stopped
     * because another rank failed. A first-hand failure seen before the teardown replaces it. */
    bool secondary;
    char replaced[700]; /* the secondary failure this one replaced, or "" */
    char also[400];     /* other local ranks that ended badly before ddprun stopped them */
    /* Local workers stopped (SIGSTOP, a debugger) when this failure came: the usual cause of the
     * others' time-outs, though they did not fail themselves ("rank 1 (pid 42, by SIGSTOP, for
     * 5.1 s)"). */
    char stopped[400];
    int n_stopped;
    /* The failed worker's error file (local failures; agent_read_error_file): ef_status DDP_OK
     * with ef, DDP_ERR_NOT_FOUND when it wrote none, another status with ef_why when it is
     * unreadable; 1 while not read. */
    int ef_status;
    ddp_errfile ef;
    char ef_why[DDP_ERRMSG_MAX];
    char ef_path[1500];
    char first_exit[200]; /* the rank that ended first, when an earlier error file won */
    /* A failure on another node: the first line of its root cause's error message, shared
     * through the store (agent_share_error), cleaned; "" when there is none. */
    char remote_error[256];
} failure;

/* Node 0's watch on one node's presence mark (gone/<node>), for agent_presence_lost. */
typedef struct presence_watch {
    int64_t seen_ms; /* when the mark was first seen; 0: not seen */
    int64_t hb;      /* the node's heartbeat then */
} presence_watch;

typedef struct agent {
    ddprun_opts *o;
    int sigfd, reaper_fd;
    bool suspended; /* stopped by Ctrl-Z (SIGTSTP) until SIGCONT */
    char host[256];
    ddp_store_server *server;
    /* Elastic, node 0: this round's store for the workers. libddp numbers a rank's groups in
     * its store ("the k-th group each rank makes"), so a rank new to the job beside ranks that
     * made a group in an earlier round would meet that group's keys: each round's workers get
     * an empty store instead (torch's rendezvous rounds keep their keys apart likewise). */
    ddp_store_server *round_server;
    ddp_store *store;
    ddprun_world wd;
    ddprun_worker *w;
    bool pipe_out;
    int stop_signal;  /* the signal that asked us to stop, or 0 */
    bool remote_stop; /* another node's ddprun was stopped by a signal: no restart */
    bool joined;      /* this ddprun has met the other nodes once */
    failure fail;
    /* heartbeats of other nodes, watched by node 0 */
    int64_t *hb_value;
    int64_t *hb_changed_ms;
    bool *node_dead; /* node 0: nodes whose ddprun stopped beating; they will never ack the end */
    /* node 0, per member: its gone/<node> mark; a node that beats on after it is only one whose
     * connection broke */
    presence_watch *gone;
    /* nodes other than 0: a second store connection whose close sets gone/<node_rank> */
    ddp_store *presence;
    /* The nodes of this round, by group rank (--nnodes's MAX of them at most): their ids (the
     * node_rank of a fixed job), hosts, and, elastic, their slots in the round's rendezvous. */
    int *member_id;
    int *member_slot;
    char (*member_host)[64];
    /* An elastic re-form: a node joined the running job (torch's num_nodes_waiting > 0). The
     * group restarts with it and no restart is counted. */
    bool reshape;
    /* Elastic, node 0: per slot of round wait_hb_round, the heartbeat last seen of a node that
     * is not a member (a newcomer, or one left out of the round for its silence); INT64_MIN
     * unseen. The group re-forms for such a node only once its heartbeat moves: a node that
     * waits beats, one that died or left does not. */
    int64_t *wait_hb;
    int64_t wait_hb_cap;
    int wait_hb_round;
    /* Without --log_dir: the private folder of the workers' error files (TMPDIR/ddprun_err_…),
     * removed at the end; "" when files are wanted (they go beside the logs) or not made yet. */
    char err_dir[1100];
    bool err_dir_failed; /* it could not be made: said once, not tried again */
    int port_hold; /* the workers' MASTER_PORT, bound (SO_REUSEADDR, not listening) for the attempt;
                      -1 when none */
    /* After a secondary failure: until when the workers are left to end on their own, so that the
     * rank that failed first-hand exits with its own code (not of ddprun's SIGTERM) and is the one
     * reported; 0 when no such wait runs. */
    int64_t cause_until;
} agent;

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* "ddprun/a<attempt>/<what>": a key of the current attempt. */
static inline void key(char *buf, size_t cap, const agent *a, const char *what)
{
    snprintf(buf, cap, "ddprun/a%d/%s", a->wd.attempt, what);
}

/* ---- agent.c ------------------------------------------------------------------------------- */

/* Whether SIGINT/SIGTERM/SIGHUP arrived while no worker runs (connecting, rendezvous). Records
 * the signal; SIGCHLD is left for the monitor loop, which reaps with waitpid() anyway. */
bool agent_interrupted(agent *a);

/* ---- errors.c: the workers' error files (TORCHELASTIC_ERROR_FILE) ------------------------- */

/* Sets w->error_file for this attempt (making the private folder the first time) and removes a
 * stale file there. A folder that cannot be made is said once; the workers then get none. */
void agent_error_file_path(agent *a, ddprun_worker *w);
/* Reads w's error file into the failure record (ef_*). Never blocks or fails. */
void agent_read_error_file(agent *a, const ddprun_worker *w);
/* When an error file is the root-cause's time: its timestamp, else when w was reaped. */
int64_t agent_error_time(const ddprun_worker *w, bool *from_file);
/* The summary's lines for the failure's error file (nothing when it wrote none). */
void agent_print_error_file(const agent *a);
/* At the job's failure, as torchrun: ddprun's own TORCHELASTIC_ERROR_FILE (from its parent,
 * a scheduler) gets the root cause's error file, with errorCode set. Said when it fails. */
void agent_pass_error_file(const agent *a);
/* Removes the private folder (err_dir) and what is in it. */
void agent_remove_error_dir(agent *a);
/* Multi-node, once the workers are gone: shares this node's failure's error message (its first
 * line, cleaned; "" when there is none) with the other nodes under a key of its own, and for a
 * failure on another node fetches that node's (remote_error), waiting at most about as long as
 * that node's teardown takes. Never fails the job. */
void agent_share_error(agent *a, bool store_lost);

/* ---- rendezvous.c -------------------------------------------------------------------------- */

/* Node 0 hosts the store (c10d numbering: the node that can listen on the endpoint), every node
 * connects, is numbered when it must be, and learns the job's run id. 0, or -1 said. */
int agent_setup_store(agent *a);
/* Attempt k's rendezvous (elastic: a round): sets the world. 0, or -1 said. */
int agent_rendezvous(agent *a);
/* The first address host resolves to, as a number, into buf. */
bool agent_first_address(const char *host, char *buf, size_t cap);
/* A port on host nobody holds, for the workers' MASTER_PORT, held in a->port_hold until
 * agent_release_port. The port, or -1 said. */
int agent_pick_free_port(agent *a, const char *host);
void agent_release_port(agent *a);
/* Reads a key without waiting: 0 and buf, 1 when absent, -1 when the store failed. buf NULL:
 * only whether it is there. */
int agent_peek_str(ddp_store *s, const char *k, char *buf, size_t cap);
/* The same for an integer key: 0 and *v, 1 when absent, -1 when the store failed. */
int agent_peek_int(ddp_store *s, const char *k, int64_t *v);
/* Moves a->wd.attempt on to the attempt node 0 is at (ddprun/attempt) when that is later and at
 * most max: 1 moved, 0 not, -1 when the store failed. */
int agent_follow_attempt(agent *a, int max);

/* ---- elastic.c ----------------------------------------------------------------------------- */

/* One node's side of an elastic round: join, wait for node 0's close, take the place it gives
 * (or wait for the next round). Sets the world; 0, or -1 said. */
int agent_rendezvous_elastic(agent *a);
/* Node 0 of an elastic job: whether a node has joined this round's rendezvous since it closed;
 * *found, and line says which. false when the store failed. */
bool agent_waiting_nodes(agent *a, char *line, size_t cap, bool *found);
/* Elastic, node 0 at the end: tells the nodes still waiting for a place that the job ended. */
void agent_tell_waiters(agent *a, int code);

/* ---- presence.c ---------------------------------------------------------------------------- */

/* A node other than 0: opens its presence connection (a failure to is said and tolerated). */
void agent_open_presence(agent *a);
/* An orderly end: the presence connection closes without marking this node lost. */
void agent_close_presence(agent *a);
/* Node 0: the node-lost decision by node id's presence mark, given its heartbeat hb read at now.
 * Lost: the mark is set and hb has not moved since it was first seen, for 5 × --monitor_interval
 * (at least 1 s, at most --agent_timeout), or at once when expired (the heartbeat's own time ran
 * out: the closed connection is the better account). A node that beats on after its mark is
 * alive (its connection merely broke): the mark is deleted, and said when say_alive (not for the
 * stale mark of a node's earlier life). 1 with the host the mark names in host, 0 not lost (yet),
 * -1 when the store failed. */
int agent_presence_lost(agent *a, int id, int64_t hb, bool expired, int64_t now, presence_watch *w,
                        bool say_alive, char *host, size_t cap);
/* Multi-node health at each tick: this node's heartbeat, another node's failure (*remote_failed
 * and line), node 0 watching the others (and, elastic, newcomers when may_reshape). false when
 * the store could not be reached. */
bool agent_check_nodes(agent *a, bool may_reshape, bool *remote_failed, char *line, size_t cap);
/* Whether every node has reported done for this attempt; *ok false when the store failed. */
bool agent_all_done(agent *a, bool *ok);
/* Node 0 keeps the store up until every other node has finished with it. */
void agent_final_handshake(agent *a);

#endif /* DDPRUN_AGENT_INT_H */
