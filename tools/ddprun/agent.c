/*
 * agent.c — one node's ddprun: the job's lifecycle.
 *
 *   node 0 hosts the store  →  attempt k: nodes meet (ranks contiguous per node, in node order)
 *   → spawn local workers  →  monitor: output, exits, signals, other nodes  →  success, or stop
 *   everyone and restart (k+1) while --max_restarts allows, else print the summary and exit 1.
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
 * An elastic job (--nnodes MIN:MAX) meets in rounds instead of claims: see "elastic rendezvous"
 * below; a failed-key line "re-form: …" restarts its group for a newcomer, counting no restart.
 * A single-node job uses the same code with no store traffic while it runs.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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
} failure;

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
    /* node 0, per member: when its gone/<node> key was first seen (0: not seen), and its
     * heartbeat then; a node that beats on after it is only one whose connection broke */
    int64_t *gone_seen_ms;
    int64_t *gone_hb;
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
    int port_hold; /* the workers' MASTER_PORT, bound (SO_REUSEADDR, not listening) for the attempt;
                      -1 when none */
    /* After a secondary failure: until when the workers are left to end on their own, so that the
     * rank that failed first-hand exits with its own code (not of ddprun's SIGTERM) and is the one
     * reported; 0 when no such wait runs. */
    int64_t cause_until;
} agent;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wall_time(char *buf, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S %Z", &tm);
}

static void key(char *buf, size_t cap, const agent *a, const char *what)
{
    snprintf(buf, cap, "ddprun/a%d/%s", a->wd.attempt, what);
}

/* Ctrl-Z (SIGTSTP) and fg (SIGCONT), which ddprun receives through its signalfd: the workers
 * are in process groups of their own, which the terminal does not reach, so ddprun passes
 * SIGTSTP on to every running worker's group and then stops itself; SIGCONT (fg, bg, kill -CONT)
 * is passed on the same way. Returns whether sig was one of the two. While ddprun is stopped
 * the other nodes' agents hear nothing from it and stop the job after --agent_timeout. */
/* Whether ddprun's job is the terminal's foreground job (or the terminal is not ours to
 * control: reading it then stops nobody). */
static bool foreground(void)
{
    pid_t fg = tcgetpgrp(STDIN_FILENO);
    return fg < 0 ? errno == ENOTTY : fg == getpgrp();
}

/* Passes what was typed on to the interactive worker (o->interactive). End of input (Ctrl-D),
 * a terminal that is gone, or a worker that stopped reading closes its stdin (an end of file
 * it sees); EIO: no longer the foreground job, look again later. */
static void relay_input(ddprun_worker *w)
{
    char buf[4096];
    ssize_t k = read(STDIN_FILENO, buf, sizeof buf);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EIO))
        return;
    size_t off = 0;
    while (k > 0 && off < (size_t)k) {
        ssize_t m = write(w->in_fd, buf + off, (size_t)k - off);
        if (m < 0 && errno == EINTR)
            continue;
        if (m < 0) {
            if (errno == EAGAIN)
                ddprun_say("rank %d is not reading its input: %zu typed bytes dropped", w->rank,
                           (size_t)k - off);
            break;
        }
        off += (size_t)m;
    }
    if (k <= 0 || (off < (size_t)k && errno != EAGAIN)) {
        close(w->in_fd);
        w->in_fd = -1;
    }
}

static bool job_control(agent *a, int sig)
{
    if (sig != SIGTSTP && sig != SIGCONT)
        return false;
    int n = 0;
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].running) {
            ddprun_signal_worker(&a->w[i], sig);
            n++;
        }
    if (sig == SIGTSTP) {
        ddprun_say("received SIGTSTP: stopped %d worker%s and ddprun; 'fg' (SIGCONT) resumes "
                   "them all",
                   n, n == 1 ? "" : "s");
        a->suspended = true;
        raise(SIGSTOP); /* SIGTSTP itself is blocked here; this returns at SIGCONT */
    } else if (a->suspended || n) {
        if (a->suspended)
            ddprun_say("continued: resuming %d worker%s", n, n == 1 ? "" : "s");
        a->suspended = false;
    }
    return true;
}

/* SIGUSR1 and SIGUSR2 are passed on to every running worker, and the job goes on: the program
 * decides (checkpoint, then exit or carry on), as with Slurm's --signal=USR1@T warning before a
 * time limit. To the worker's own process only, as torchrun sends its signals, not its group:
 * children that do not expect it (data loader processes) would die of it. Returns whether sig
 * was one of the two. */
static bool passed_on(agent *a, int sig)
{
    if (sig != SIGUSR1 && sig != SIGUSR2)
        return false;
    int n = 0;
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].running && a->w[i].pid > 0 && kill(a->w[i].pid, sig) == 0)
            n++;
    /* None running (the rendezvous, between attempts): not held for the next workers, which
     * could get it before their program has a handler for it, and die of it. */
    if (n == 0)
        ddprun_say("received SIG%s while no worker runs: not passed on; the job goes on",
                   sigabbrev_np(sig));
    else
        ddprun_say("received SIG%s: passed on to %d worker%s; the job goes on", sigabbrev_np(sig),
                   n, n == 1 ? "" : "s");
    return true;
}

/* Whether SIGINT/SIGTERM/SIGHUP arrived while no worker runs (connecting, rendezvous). Records
 * the signal; SIGCHLD is left for the monitor loop, which reaps with waitpid() anyway. */
static bool interrupted(agent *a)
{
    struct signalfd_siginfo si;
    while (read(a->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (job_control(a, (int)si.ssi_signo) || passed_on(a, (int)si.ssi_signo))
            continue;
        if (si.ssi_signo != SIGCHLD && !a->stop_signal) {
            a->stop_signal = (int)si.ssi_signo;
            ddprun_say("received SIG%s while no worker runs: stopping",
                       sigabbrev_np(a->stop_signal));
        }
    }
    return a->stop_signal != 0;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- store set-up ------------------------------------------------------------------------------
 */

/* Starts node 0's store on --master_addr:--master_port; on several nodes a master_addr this host
 * cannot listen on (a name other nodes resolve differently: NAT, /etc/hosts) falls back to every
 * interface when any_fallback. */
static ddp_status start_server(agent *a, const char *host, bool any_fallback, ddp_error *err)
{
    ddprun_opts *o = a->o;
    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = host;
    so.port = o->master_port;
    so.token = a->wd.token;
    ddp_status st = ddp_store_server_start(&so, &a->server, err);
    if (st == DDP_ERR_SYSTEM && any_fallback) {
        so.host = NULL;
        st = ddp_store_server_start(&so, &a->server, err);
    }
    if (st == DDP_OK)
        a->wd.master_port = ddp_store_server_port(a->server);
    return st;
}

/* The first address host resolves to, as a number. Under c10d numbering the hosting node listens
 * on that one only, so that a second ddprun on the same machine finds it taken: 'localhost' is
 * often ::1 and 127.0.0.1, and binding whichever is still free would make two node 0s. Clients
 * try the addresses in the same order and so reach it. */
static bool first_address(const char *host, char *buf, size_t cap)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return false;
    bool ok = getnameinfo(res->ai_addr, res->ai_addrlen, buf, (socklen_t)cap, NULL, 0,
                          NI_NUMERICHOST) == 0;
    freeaddrinfo(res);
    return ok;
}

static int setup_store(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_error err = {0};
    const char *env_token = getenv("DDP_STORE_TOKEN");
    if (env_token && *env_token) {
        if (strlen(env_token) >= sizeof a->wd.token) {
            ddprun_say("DDP_STORE_TOKEN is longer than %zu characters", sizeof a->wd.token - 1);
            return -1;
        }
        snprintf(a->wd.token, sizeof a->wd.token, "%s", env_token);
    } else if (o->nnodes == 1) {
        if (ddp_random_token(a->wd.token, 32, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
    }

    a->wd.master_port = o->master_port;
    bool in_use = false; /* c10d numbering: this host found the endpoint's port taken */
    if (o->number_nodes) {
        /* torchrun's c10d rendezvous without --node_rank: the node that can listen on the
         * endpoint (the host it names) hosts the store and is node 0 (is_host=1 insists, with the
         * every-interface fall-back; is_host=0 never hosts); any other, or one that finds the
         * port taken by the host's store on the same machine, joins as a client and is numbered
         * once connected. */
        ddp_status st = DDP_ERR_SYSTEM;
        char first[NI_MAXHOST];
        if (o->is_host != 0)
            st = start_server(
                a, first_address(o->master_addr, first, sizeof first) ? first : o->master_addr,
                o->is_host == 1, &err);
        if (st != DDP_OK &&
            (o->is_host == 1 || (st != DDP_ERR_SYSTEM && st != DDP_ERR_ADDR_IN_USE))) {
            ddprun_say("%s", err.msg);
            return -1;
        }
        o->node_rank = st == DDP_OK ? 0 : -1;
        in_use = st == DDP_ERR_ADDR_IN_USE;
    } else if (o->node_rank == 0) {
        if (start_server(a, o->master_addr, o->nnodes > 1, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
    }
    if (o->nnodes > 1 && o->node_rank == 0 && !a->wd.token[0])
        ddprun_say("warning: DDP_STORE_TOKEN is not set, so the store on '" HOSTF "' accepts any "
                   "connection (as torchrun's does); export the same secret DDP_STORE_TOKEN on "
                   "every node to refuse strangers",
                   HOSTA(o->master_addr, o->master_port));
    ddp_store_opts co = DDP_STORE_OPTS_INIT;
    co.host = o->master_addr;
    co.port = a->wd.master_port;
    co.token = a->wd.token;
    co.timeout_ms = (int)(o->rdzv_timeout * 1000);
    /* Node 0 may not be up yet: retry in short steps, so that Ctrl-C is heard meanwhile. */
    co.connect_timeout_ms = 250;
    int64_t give_up = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
    for (;;) {
        ddp_status st = ddp_store_connect(&co, &a->store, &err);
        if (st == DDP_OK)
            break;
        if (interrupted(a))
            return -1;
        if (st != DDP_ERR_TIMEOUT || now_ms() >= give_up) {
            if (st == DDP_ERR_TIMEOUT)
                ddprun_say("cannot reach the store of node 0 at '" HOSTF "' after %g s (last "
                           "error: %s); start ddprun on node 0, and check --master_addr and "
                           "--master_port (or raise --rdzv_timeout)%s%s",
                           HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout, err.msg,
                           o->number_nodes ? "; under c10d numbering the node that can listen on "
                                             "the endpoint hosts it: if none can (a NAT'd name), "
                                             "give that node --rdzv_conf is_host=1"
                                           : "",
                           in_use ? "; this host could not listen there either (address already "
                                    "in use): a program other than ddprun holds that port, so "
                                    "stop it or give every node another --rdzv_endpoint port"
                                  : "");
            else
                ddprun_say("%s%s", err.msg,
                           in_use ? " (this host could not listen on the endpoint: address "
                                    "already in use; if no ddprun of this job runs there, a "
                                    "program other than ddprun holds that port: stop it or give "
                                    "every node another --rdzv_endpoint port)"
                                  : "");
            return -1;
        }
    }
    if (o->node_rank < 0) { /* numbered by the rendezvous: 1, 2, … in the order of joining */
        int64_t n = 0;
        if (ddp_store_add(a->store, "ddprun/numbered", 1, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(a->store));
            return -1;
        }
        if (n >= o->nnodes && !o->elastic) { /* elastic: a node's place comes per round */
            ddprun_say("more nodes joined the rendezvous at '" HOSTF "' than --nnodes %d; start "
                       "ddprun on exactly that many nodes (or give each its --node_rank)",
                       HOSTA(o->master_addr, a->wd.master_port), o->nnodes);
            return -1;
        }
        o->node_rank = (int)n;
        if (o->elastic)
            ddprun_say("this is node %d (numbered by the c10d rendezvous at '" HOSTF "'; elastic "
                       "--nnodes %d:%d)",
                       o->node_rank, HOSTA(o->master_addr, a->wd.master_port), o->min_nodes,
                       o->nnodes);
        else
            ddprun_say("this is node %d of %d (numbered by the c10d rendezvous at '" HOSTF "')",
                       o->node_rank, o->nnodes, HOSTA(o->master_addr, a->wd.master_port));
    }
    if (o->nnodes == 1) {
        if (o->run_id_set)
            return 0;
        char id[13];
        if (ddp_random_token(id, 12, &err) != DDP_OK) {
            ddprun_say("%s", err.msg);
            return -1;
        }
        snprintf(o->run_id, sizeof o->run_id, "%s", id);
        return 0;
    }
    /* Several nodes: node 0's id (its --run_id, else one it makes up) is the job's, published
     * for the others; a node without --run_id takes it. One with its own keeps it until the
     * rendezvous, which refuses nodes whose ids differ (torchrun's nodes with different
     * --rdzv_id never meet; here they would run one job under two ids). */
    if (o->node_rank == 0) {
        if (!o->run_id_set) {
            char id[13];
            if (ddp_random_token(id, 12, &err) != DDP_OK) {
                ddprun_say("%s", err.msg);
                return -1;
            }
            snprintf(o->run_id, sizeof o->run_id, "%s", id);
        }
        if (ddp_store_set(a->store, "ddprun/run_id", o->run_id, strlen(o->run_id)) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(a->store));
            return -1;
        }
        return 0;
    }
    if (o->run_id_set)
        return 0;
    void *v = NULL;
    size_t n = 0;
    if (ddp_store_get(a->store, "ddprun/run_id", &v, &n) != DDP_OK) {
        ddprun_say("%s", ddp_store_last_error(a->store));
        return -1;
    }
    snprintf(o->run_id, sizeof o->run_id, "%.*s", (int)n, (char *)v);
    free(v);
    return 0;
}

/* ---- node rendezvous ----------------------------------------------------------------------- */

/* A port on host (else on every interface, as the store's own fall-back) that nobody holds: the
 * workers get it as MASTER_PORT, which a program hosting its own store binds (PyTorch's rank 0
 * does, as under torchrun's c10d rendezvous); ddpc's ranks use DDP_STORE_PORT. The port stays
 * bound in a->port_hold for the whole attempt, with SO_REUSEADDR and never listening: a program
 * that binds it with SO_REUSEADDR too (torch's TCPStore, both its backends) can still bind and
 * listen, while any other bind and the kernel's choice of ports for outgoing connections and for
 * bind(port 0) keep off it, so nothing takes it between the pick and rank 0's bind (torchrun's own
 * pick lets it go at once). */
static int pick_free_port(agent *a, const char *host)
{
    int why = EADDRNOTAVAIL;
    for (int pass = 0; pass < 2; pass++) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
        if (getaddrinfo(pass == 0 ? host : NULL, "0", &hints, &res) != 0)
            continue;
        int port = -1;
        for (struct addrinfo *ai = res; ai && port < 0; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
            if (fd < 0) {
                why = errno;
                continue;
            }
            int one = 1;
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
                bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
                port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                      : ((struct sockaddr_in *)&ss)->sin_port);
                a->port_hold = fd;
            } else {
                why = errno;
                close(fd);
            }
        }
        freeaddrinfo(res);
        if (port > 0)
            return port;
    }
    ddprun_say("cannot find a free port on '%s' for the workers' MASTER_PORT: %s", host,
               strerror(why));
    return -1;
}

static void release_port(agent *a)
{
    if (a->port_hold >= 0)
        close(a->port_hold);
    a->port_hold = -1;
}

/* Node i's rendezvous record (v: "nproc max_restarts nnodes run_id_set run_id") against this
 * node's flags: 0 and *nproc when they agree, else -1 after saying which flag differs. */
static int check_node_record(agent *a, int i, const char *v, int *nproc)
{
    ddprun_opts *o = a->o;
    int np = 0, mr = 0, nn = 0, id_set = 0;
    char id[sizeof o->run_id];
    if (sscanf(v, "%d %d %d %d %127s", &np, &mr, &nn, &id_set, id) != 5 || np < 1) {
        ddprun_say("node %d sent a malformed rendezvous record; run the same ddprun on every node",
                   i);
        return -1;
    }
    /* Each node's ddprun caps its own --nproc_per_node; a record from something else (a peer
     * that holds the token but is not ddprun) must not make the world size overflow. */
    if (np > DDPRUN_MAX_NPROC) {
        ddprun_say("node %d asks for %d workers, more than ddprun's %d per node; run the same "
                   "ddprun on every node",
                   i, np, DDPRUN_MAX_NPROC);
        return -1;
    }
    if (mr != o->max_restarts || nn != o->nnodes) {
        ddprun_say("node %d runs with --max_restarts %d --nnodes %d but this node with %d "
                   "and %d; give every node the same flags",
                   i, mr, nn, o->max_restarts, o->nnodes);
        return -1;
    }
    if (strcmp(id, o->run_id) != 0) {
        ddprun_say("node %d runs with run id '%s'%s but this node with '%s'%s; give every "
                   "node the same --run_id (--rdzv_id), or leave it out on every node but "
                   "node 0",
                   i, id, id_set ? "" : " (made up: no --run_id)", o->run_id,
                   o->run_id_set       ? ""
                   : o->node_rank == 0 ? " (made up: no --run_id)"
                                       : " (no --run_id: node 0's)");
        return -1;
    }
    *nproc = np;
    return 0;
}

/* While nodes gather: the records that have arrived are checked at once, not only when all
 * --nnodes have joined, because a node started with another --nnodes waits for nodes that never
 * come (or is not waited for): before 2026-11-24 node 0 with --nnodes 3 beside a node with 2
 * waited out --rdzv_timeout and blamed a missing node_rank 2, and a node with --nnodes 3 beside a
 * node 0 with 2 lost the store without a reason. Node 0 checks every node's record; the others
 * check node 0's (one key, not every node's from every node). *checked marks the records done.
 * 0: none disagrees so far; -1: one does, said. */
static int check_arrived_records(agent *a, char **keys, bool *checked)
{
    ddprun_opts *o = a->o;
    int n = o->node_rank == 0 ? o->nnodes : 1;
    for (int i = 0; i < n; i++) {
        bool have = false;
        if (checked[i] || i == o->node_rank || !keys[i])
            continue;
        if (ddp_store_check(a->store, (const char *const *)&keys[i], 1, &have) != DDP_OK || !have)
            continue; /* a lost store is reported by the caller's next check */
        void *v = NULL;
        size_t len = 0;
        if (ddp_store_get(a->store, keys[i], &v, &len) != DDP_OK)
            continue;
        int np = 0, rc = check_node_record(a, i, v, &np);
        free(v);
        if (rc) {
            if (o->node_rank == 0)
                /* Keep the store up a moment, so that the other node reads this node's record
                 * and says the same on its side rather than that the store went away. */
                nap_ms(1000);
            return -1;
        }
        checked[i] = true;
    }
    return 0;
}

/* Reads an integer key without waiting: 0 and *v, or 1 when absent, -1 when the store failed. */
static int peek_int(ddp_store *s, const char *k, int64_t *v)
{
    bool have = false;
    const char *keys[1] = {k};
    if (ddp_store_check(s, keys, 1, &have) != DDP_OK)
        return -1;
    if (!have)
        return 1;
    void *p = NULL;
    size_t n = 0;
    if (ddp_store_get(s, k, &p, &n) != DDP_OK)
        return -1;
    char buf[32];
    snprintf(buf, sizeof buf, "%.*s", (int)(n < 31 ? n : 31), (char *)p);
    free(p);
    *v = strtoll(buf, NULL, 10);
    return 0;
}

/* Claims this node's place in attempt k's rendezvous. A node's ddprun started anew while the job
 * runs (its machine rebooted, a scheduler restarted it: torchrun's agents rejoin the same way)
 * finds its place taken by its earlier self, whose workers are gone: it waits until node 0 has
 * found that node dead and restarted the group, and joins the next attempt. A place taken by a
 * live ddprun (its heartbeat moves: two nodes given one --node_rank) or in a rendezvous still
 * gathering is refused at once, as before. 0, or -1 said. */
static int claim_slot(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    bool said = false;
    int64_t hb0 = -1, give_up = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
    if (!a->joined && o->node_rank != 0) { /* a node started late joins where node 0 is */
        int64_t cur = 0;
        int st = peek_int(s, "ddprun/attempt", &cur);
        if (st < 0)
            goto lost;
        if (st == 0 && cur > a->wd.attempt && cur <= o->max_restarts)
            a->wd.attempt = (int)cur;
    }
    for (;;) {
        snprintf(k, sizeof k, "ddprun/a%d/claim/%d", a->wd.attempt, o->node_rank);
        int64_t claims;
        if (ddp_store_add(s, k, 1, &claims) != DDP_OK)
            break;
        if (claims == 1)
            return 0;
        /* Taken. A rendezvous of attempt k that finished (node 0 published the workers' port)
         * with this place in it, while this ddprun never joined: an earlier self's. */
        int64_t port = 0, hb = 0;
        snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
        int done = peek_int(s, k, &port);
        snprintf(k, sizeof k, "ddprun/hb/%d", o->node_rank);
        int beat = done == 0 ? peek_int(s, k, &hb) : 1;
        if (done < 0 || beat < 0)
            break;
        if (a->joined || done != 0 || (hb0 >= 0 && hb != hb0)) {
            ddprun_say("two nodes claim --node_rank %d; give each node its own --node_rank from 0 "
                       "to %d, or none of them one with --rdzv_backend c10d (ddprun numbers them)",
                       o->node_rank, o->nnodes - 1);
            return -1;
        }
        if (!said) {
            ddprun_say("node %d's place in attempt %d is held by an earlier ddprun of this node; "
                       "waiting for node 0 to find it gone (--agent_timeout %g s) and restart "
                       "the group, to join the next attempt",
                       o->node_rank, a->wd.attempt, o->agent_timeout);
            said = true;
        }
        if (hb0 < 0)
            hb0 = hb;
        /* Wait for node 0's next attempt, watching the holder's heartbeat meanwhile. */
        for (;;) {
            int64_t cur = 0;
            int st = peek_int(s, "ddprun/attempt", &cur);
            if (st < 0)
                goto lost;
            if (st == 0 && cur > a->wd.attempt) {
                a->wd.attempt = (int)cur;
                break;
            }
            if (peek_int(s, k, &hb) < 0)
                goto lost;
            if (hb != hb0)
                break; /* said above, on the next round */
            if (interrupted(a))
                return -1;
            if (now_ms() >= give_up) {
                ddprun_say("node 0 did not restart the group within --rdzv_timeout %g s; the "
                           "earlier ddprun of node %d may still run: stop it, or raise "
                           "--rdzv_timeout",
                           o->rdzv_timeout, o->node_rank);
                return -1;
            }
            nap_ms(200);
        }
    }
lost:
    ddprun_say("%s%s", ddp_store_last_error(s),
               " (the job may have ended: node 0's store is gone)");
    return -1;
}

/* ---- elastic rendezvous (--nnodes MIN:MAX) -------------------------------------------------
 *
 * torchrun's c10d rendezvous, on ddprun's store. Node 0 (the store's host) runs each round:
 *   ddprun/attempt                  the round node 0 is at; a node that comes joins there
 *   a<k>/count, a<k>/slot/<j>       a node adds 1 to count and writes its record in slot j:
 *                                   "id nproc max_restarts min max run_id_set run_id host"
 *   a<k>/members                    node 0's close: "ok RESTARTS N SLOT…" (the members, by id:
 *                                   group ranks 0…N-1), or "fail MESSAGE" (below MIN)
 * Node 0 closes the round at once when MAX nodes are in, or when at least MIN are and none came
 * for last_call_timeout (each arrival starts that wait again, as in torch); below MIN at
 * --rdzv_timeout (join_timeout) it fails the round naming who came and who is missing. A node
 * whose slot is not among the members (it came after the close, or beyond MAX) waits for the
 * next round; node 0 sees its slot while the job runs and, below MAX, re-forms the group. */

typedef struct erec {
    int id, nproc, mr, lo, hi, id_set;
    char run_id[128];
    char host[64];
} erec;

static int parse_erec(const char *v, erec *r)
{
    return sscanf(v, "%d %d %d %d %d %d %127s %63s", &r->id, &r->nproc, &r->mr, &r->lo, &r->hi,
                  &r->id_set, r->run_id, r->host) == 8 &&
                   r->nproc >= 1
               ? 0
               : -1;
}

/* Reads a key without waiting: 0 and buf, 1 when absent, -1 when the store failed. */
static int peek_str(ddp_store *s, const char *k, char *buf, size_t cap)
{
    bool have = false;
    const char *keys[1] = {k};
    if (ddp_store_check(s, keys, 1, &have) != DDP_OK)
        return -1;
    if (!have)
        return 1;
    void *p = NULL;
    size_t n = 0;
    if (ddp_store_get(s, k, &p, &n) != DDP_OK)
        return -1;
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), (char *)p);
    free(p);
    return 0;
}

/* Another node's record against this node's flags: 0, or *msg says which flag differs. */
static int check_erec(const agent *a, const char *v, erec *r, char *msg, size_t cap)
{
    const ddprun_opts *o = a->o;
    if (parse_erec(v, r) != 0) {
        snprintf(msg, cap,
                 "a node sent a malformed rendezvous record; run the same ddprun on "
                 "every node");
        return -1;
    }
    if (r->nproc > DDPRUN_MAX_NPROC) {
        snprintf(msg, cap,
                 "node %d ('%s') asks for %d workers, more than ddprun's %d per node; run the "
                 "same ddprun on every node",
                 r->id, r->host, r->nproc, DDPRUN_MAX_NPROC);
        return -1;
    }
    if (r->mr != o->max_restarts || r->lo != o->min_nodes || r->hi != o->nnodes) {
        snprintf(msg, cap,
                 "node %d ('%s') runs with --max_restarts %d --nnodes %d:%d but node %d with %d "
                 "and %d:%d; give every node the same flags",
                 r->id, r->host, r->mr, r->lo, r->hi, o->node_rank, o->max_restarts, o->min_nodes,
                 o->nnodes);
        return -1;
    }
    if (strcmp(r->run_id, o->run_id) != 0) {
        snprintf(msg, cap,
                 "node %d ('%s') runs with run id '%s' but node %d with '%s'; give every node "
                 "the same --run_id (--rdzv_id), or leave it out on every node but node 0",
                 r->id, r->host, r->run_id, o->node_rank, o->run_id);
        return -1;
    }
    return 0;
}

/* Bytes of a members line: "ok R N" and up to MAX slot numbers. */
static size_t members_cap(const ddprun_opts *o)
{
    return 64 + 24 * (size_t)o->nnodes;
}

/* Node 0 ends round k's rendezvous with line (said here, and by every node that reads it). */
static void fail_round(agent *a, const char *line)
{
    char k[128], v[800];
    ddprun_say("%s", line);
    key(k, sizeof k, a, "members");
    snprintf(v, sizeof v, "fail %s", line);
    ddp_store_set_timeout(a->store, 2000);
    (void)ddp_store_set(a->store, k, v, strlen(v));
    nap_ms(1000); /* keep the store up while the other nodes read it */
}

/* Elastic, node 0: the wait_hb entry of slot j of the current round, or NULL (out of memory). */
static int64_t *wait_hb_slot(agent *a, int64_t j)
{
    if (a->wait_hb_round != a->wd.attempt) {
        for (int64_t i = 0; i < a->wait_hb_cap; i++)
            a->wait_hb[i] = INT64_MIN;
        a->wait_hb_round = a->wd.attempt;
    }
    if (j >= a->wait_hb_cap) {
        int64_t ncap = j + 16;
        int64_t *n = realloc(a->wait_hb, sizeof *n * (size_t)ncap);
        if (!n)
            return NULL;
        for (int64_t i = a->wait_hb_cap; i < ncap; i++)
            n[i] = INT64_MIN;
        a->wait_hb = n;
        a->wait_hb_cap = ncap;
    }
    return &a->wait_hb[j];
}

/* Elastic, a node waiting in the rendezvous (for the close, or for a place): its heartbeat
 * every 100 ms, by which node 0 tells a waiting node from one that died or was stopped (torch's
 * keep-alive). A failed call shows in the caller's next store call. */
static void beat(agent *a, int64_t *last)
{
    int64_t now = now_ms();
    if (now - *last < 100)
        return;
    *last = now;
    char k[64];
    snprintf(k, sizeof k, "ddprun/hb/%d", a->o->node_rank);
    (void)ddp_store_add(a->store, k, 1, NULL);
}

/* Node 0: gathers round k's nodes and closes it (see above). own: node 0's slot. 0, or -1
 * said (and told to the others). */
static int close_round(agent *a, int64_t own)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128], v[800], msg[1024];
    int64_t start = now_ms(), give_up = start + (int64_t)(o->rdzv_timeout * 1000);
    int64_t last_call = (int64_t)(o->last_call_timeout * 1000), last_arrival = start;
    int cap = 0, n_ok = 0, rc = -1;
    erec *recs = NULL;
    /* per slot: 0 not read yet, 1 a member-to-be, -1 refused, -2 left out: its heartbeat
     * stopped for --agent_timeout (killed, stopped, its machine gone), as torch's keep-alive
     * drops a silent participant; it is back in if the heartbeat moves before the close; -3
     * left: its ddprun, new to the job, received a signal (under left/<slot>) */
    signed char *have = NULL;
    int64_t *hb_val = NULL, *hb_at = NULL, last_scan = 0;
    /* The last round's members (node 0 aside) still beating but not back yet (stopping slow
     * workers): a full round waits for them, and they come before newcomers, as torch reopens a
     * round only once its every participant has left it; before 2026-11-25 two newcomers could
     * fill a 2:3 job's re-formed round while a running node stopped its workers, leaving it out.
     * One silent for --agent_timeout no longer counts. */
    int pending = 0;
    for (int i = 1; i < a->wd.nnodes; i++)
        a->hb_changed_ms[i] = start;
    for (;;) {
        int64_t count = 0;
        key(k, sizeof k, a, "count");
        if (ddp_store_add(s, k, 0, &count) != DDP_OK)
            goto out_store;
        if (count > cap) {
            int ncap = (int)count + 16;
            erec *nr = realloc(recs, sizeof *nr * (size_t)ncap);
            if (nr)
                recs = nr;
            signed char *nh = realloc(have, sizeof *nh * (size_t)ncap);
            if (nh)
                have = nh;
            int64_t *nv = realloc(hb_val, sizeof *nv * (size_t)ncap);
            if (nv)
                hb_val = nv;
            int64_t *nt = realloc(hb_at, sizeof *nt * (size_t)ncap);
            if (nt)
                hb_at = nt;
            if (!nr || !nh || !nv || !nt) {
                ddprun_say("out of memory in the rendezvous");
                goto out;
            }
            memset(have + cap, 0, sizeof *have * (size_t)(ncap - cap));
            cap = ncap;
        }
        for (int64_t j = 0; j < count; j++) {
            if (have[j])
                continue;
            snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)j);
            int st = peek_str(s, k, v, sizeof v);
            if (st < 0)
                goto out_store;
            if (st > 0)
                continue; /* counted, not written yet */
            if (check_erec(a, v, &recs[j], msg, sizeof msg) != 0) {
                /* That node alone is turned away (told under refused/<slot>): a node started
                 * with other flags must not end a job that runs without it. */
                ddprun_say("refused a node: %s", msg);
                snprintf(k, sizeof k, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)j);
                if (ddp_store_set(s, k, msg, strlen(msg)) != DDP_OK)
                    goto out_store;
                have[j] = -1;
                continue;
            }
            have[j] = 1;
            n_ok++;
            last_arrival = hb_at[j] = now_ms();
            hb_val[j] = INT64_MIN;
        }
        /* The gathering nodes' heartbeats, and whether they left (a signal), every 200 ms. */
        for (int64_t j = 0; j < count && now_ms() - last_scan >= 200; j++) {
            if ((have[j] != 1 && have[j] != -2) || j == own)
                continue;
            snprintf(k, sizeof k, "ddprun/a%d/left/%lld", a->wd.attempt, (long long)j);
            int lst = peek_str(s, k, v, sizeof v);
            if (lst < 0)
                goto out_store;
            if (lst == 0) {
                ddprun_say("node %d ('%s') left the rendezvous: %.400s; the round goes on "
                           "without it",
                           recs[j].id, recs[j].host, v);
                n_ok -= have[j] == 1;
                have[j] = -3;
                continue;
            }
            int64_t hb = 0, t = now_ms();
            snprintf(k, sizeof k, "ddprun/hb/%d", recs[j].id);
            if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
                goto out_store;
            if (hb != hb_val[j]) {
                if (have[j] == -2) {
                    ddprun_say("node %d ('%s') is back in the rendezvous", recs[j].id,
                               recs[j].host);
                    have[j] = 1;
                    n_ok++;
                }
                hb_val[j] = hb;
                hb_at[j] = t;
            } else if (have[j] == 1 && t - hb_at[j] > (int64_t)(o->agent_timeout * 1000)) {
                int64_t *w = wait_hb_slot(a, j);
                if (w)
                    *w = hb; /* a re-form for it once it beats again */
                ddprun_say("node %d ('%s') left the rendezvous: no heartbeat for %g s "
                           "(--agent_timeout); the round goes on without it",
                           recs[j].id, recs[j].host, o->agent_timeout);
                have[j] = -2;
                n_ok--;
            }
        }
        for (int i = 1, scan = now_ms() - last_scan >= 200; scan && i < a->wd.nnodes; i++) {
            if (i == 1)
                pending = 0;
            bool back = false;
            for (int64_t j = 0; j < count && !back; j++)
                back = have[j] == 1 && recs[j].id == a->member_id[i];
            if (back || a->node_dead[i])
                continue;
            int64_t hb = 0, t = now_ms();
            snprintf(k, sizeof k, "ddprun/hb/%d", a->member_id[i]);
            if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
                goto out_store;
            if (hb != a->hb_value[i]) {
                a->hb_value[i] = hb;
                a->hb_changed_ms[i] = t;
            } else if (t - a->hb_changed_ms[i] > (int64_t)(o->agent_timeout * 1000)) {
                a->node_dead[i] = true;
                continue;
            }
            pending++;
        }
        if (now_ms() - last_scan >= 200)
            last_scan = now_ms();
        /* A node of the round that received a signal while it waited for the close (its ddprun
         * gone): the job stops, as for a signal while the workers run. */
        key(k, sizeof k, a, "failed");
        int fst = peek_str(s, k, v, sizeof v);
        if (fst < 0)
            goto out_store;
        if (fst == 0 && strncmp(v, STOP_MARK, strlen(STOP_MARK)) == 0) {
            snprintf(msg, sizeof msg, "%.400s: the job stops", v + strlen(STOP_MARK));
            fail_round(a, msg);
            goto out;
        }
        int64_t now = now_ms();
        /* Full, it waits for the last round's nodes still beating (which would otherwise be left
         * out); below MAX they would come in after the close as newcomers, so the last call does
         * not wait for them (nor for a dead one's silence: a node that died, its survivors'
         * workers failing first, is not yet known dead). */
        if (n_ok >= o->nnodes ? !pending : n_ok >= o->min_nodes && now - last_arrival >= last_call)
            break;
        if (n_ok >= o->min_nodes && now >= give_up) {
            /* MIN came but the last call (or a last-round node) outlasts --rdzv_timeout: the
             * round closes with them (before 2026-11-25 it timed out, '1 node joined …, at least
             * 1 needed') */
            if (pending && n_ok >= o->nnodes)
                ddprun_say("closing the round at --rdzv_timeout %g s with %d node%s (--nnodes "
                           "%d:%d): %d node%s of the last round, still running, did not come "
                           "back; raise --rdzv_timeout above --grace_period",
                           o->rdzv_timeout, n_ok, n_ok == 1 ? "" : "s", o->min_nodes, o->nnodes,
                           pending, pending == 1 ? "" : "s");
            else
                ddprun_say("closing the round at --rdzv_timeout %g s with %d node%s (--nnodes "
                           "%d:%d): last_call_timeout %g s is longer; lower it, or raise "
                           "--rdzv_timeout",
                           o->rdzv_timeout, n_ok, n_ok == 1 ? "" : "s", o->min_nodes, o->nnodes,
                           o->last_call_timeout);
            break;
        }
        if (interrupted(a)) {
            snprintf(msg, sizeof msg,
                     "ddprun on node 0 ('%s') received SIG%s while the nodes "
                     "gathered: the job stops",
                     a->host, sigabbrev_np(a->stop_signal));
            key(k, sizeof k, a, "members");
            snprintf(v, sizeof v, "fail %.790s", msg);
            (void)ddp_store_set(s, k, v, strlen(v));
            goto out;
        }
        if (now >= give_up) {
            char joined[300] = "", missing[300] = "";
            for (int64_t j = 0; j < count; j++) {
                size_t l = strlen(joined);
                if (have[j] == 1 && l < sizeof joined - 80)
                    snprintf(joined + l, sizeof joined - l, "%snode %d ('%s')", l ? ", " : "",
                             recs[j].id, recs[j].host);
            }
            for (int i = 0; i < a->wd.nnodes; i++) { /* the last round's nodes not back */
                bool back = false;
                for (int64_t j = 0; j < count && !back; j++)
                    back = have[j] == 1 && recs[j].id == a->member_id[i];
                size_t l = strlen(missing);
                if (!back && l < sizeof missing - 80)
                    snprintf(missing + l, sizeof missing - l, "%snode %d ('%s')", l ? ", " : "",
                             a->member_id[i], a->member_host[i]);
            }
            snprintf(
                msg, sizeof msg,
                "elastic rendezvous at '" HOSTF "' timed out after %g s: %d node%s joined "
                "(%.150s), at least %d needed (--nnodes %d:%d)%s%.150s%s; start ddprun on more "
                "nodes with the same --nnodes and --rdzv_endpoint, or raise --rdzv_timeout "
                "(join_timeout)",
                HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout, n_ok,
                n_ok == 1 ? "" : "s", joined, o->min_nodes, o->min_nodes, o->nnodes,
                missing[0] ? "; missing from the last round: " : "", missing, missing[0] ? "" : "");
            fail_round(a, msg);
            goto out;
        }
        nap_ms(20);
    }
    /* Node 0 first, then the others in the order they came, MAX in all; group ranks by id. */
    size_t mcap = members_cap(o);
    int64_t *pick = malloc(sizeof *pick * (size_t)o->nnodes);
    char *mv = malloc(mcap);
    if (!pick || !mv) {
        free(pick);
        free(mv);
        ddprun_say("out of memory in the rendezvous");
        goto out;
    }
    int n = 0;
    pick[n++] = own;
    for (int pass = 0; pass < 2; pass++) /* the last round's members first, then newcomers */
        for (int64_t j = 0; j < cap && n < o->nnodes; j++) {
            if (have[j] != 1 || j == own)
                continue;
            bool was = false;
            for (int i = 1; i < a->wd.nnodes && !was; i++)
                was = recs[j].id == a->member_id[i];
            if (was == (pass == 0))
                pick[n++] = j;
        }
    for (int i = 1; i < n; i++) /* insertion sort by id; node 0 stays first (id 0) */
        for (int j = i; j > 1 && recs[pick[j]].id < recs[pick[j - 1]].id; j--) {
            int64_t t = pick[j];
            pick[j] = pick[j - 1];
            pick[j - 1] = t;
        }
    size_t l = (size_t)snprintf(mv, mcap, "ok %d %d", a->wd.restarts, n);
    for (int i = 0; i < n && l < mcap - 24; i++)
        l += (size_t)snprintf(mv + l, mcap - l, " %lld", (long long)pick[i]);
    key(k, sizeof k, a, "members");
    rc = ddp_store_set(s, k, mv, strlen(mv)) == DDP_OK ? 0 : -1;
    free(pick);
    free(mv);
    if (rc == 0)
        goto out;
out_store:
    ddprun_say("%s", ddp_store_last_error(s));
out:
    free(recs);
    free(have);
    free(hb_val);
    free(hb_at);
    return rc;
}

/* Node 0: the workers' store of this round, on the store's host (else every interface, as
 * start_server), on a free port; the last round's goes (its workers are gone). 0, or -1 said. */
static int start_round_store(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_error err = {0};
    char first[NI_MAXHOST];
    ddp_store_server_stop(a->round_server);
    a->round_server = NULL;
    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = first_address(o->master_addr, first, sizeof first) ? first : o->master_addr;
    so.port = 0;
    so.token = a->wd.token;
    ddp_status st = ddp_store_server_start(&so, &a->round_server, &err);
    if (st == DDP_ERR_SYSTEM) {
        so.host = NULL;
        st = ddp_store_server_start(&so, &a->round_server, &err);
    }
    if (st != DDP_OK) {
        ddprun_say("%s", err.msg);
        return -1;
    }
    a->wd.store_port = ddp_store_server_port(a->round_server);
    return 0;
}

/* One node's side of an elastic round: join, wait for node 0's close, take the place it gives
 * (or wait for the next round). Sets the world; 0, or -1 said. */
static int rendezvous_elastic(agent *a)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128], v[800];
    size_t mcap = members_cap(o);
    char *mv = malloc(mcap);
    int64_t *slots = malloc(sizeof *slots * (size_t)o->nnodes);
    int rc = -1;
    if (!mv || !slots) {
        ddprun_say("out of memory in the rendezvous");
        goto out;
    }
    ddp_store_set_timeout(s, 2000);
    if (o->node_rank == 0) {
        snprintf(v, sizeof v, "%d", a->wd.attempt);
        if (ddp_store_set(s, "ddprun/attempt", v, strlen(v)) != DDP_OK)
            goto out_store;
    } else {
        int64_t cur = 0;
        int st = peek_int(s, "ddprun/attempt", &cur);
        if (st < 0)
            goto out_store;
        if (st == 0 && cur > a->wd.attempt)
            a->wd.attempt = (int)cur;
    }
    /* A node waits for node 0's close as long as node 0 may gather (it may start its round a
     * --grace_period later, stopping its workers), plus a margin. */
    int64_t wait_ms = (int64_t)((o->rdzv_timeout + o->grace_period) * 1000) + 5000;
    bool said = false;
    for (;;) {
        int64_t slot = 0;
        key(k, sizeof k, a, "count");
        if (ddp_store_add(s, k, 1, &slot) != DDP_OK)
            goto out_store;
        slot--;
        snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)slot);
        snprintf(v, sizeof v, "%d %d %d %d %d %d %s %s", o->node_rank, o->nproc, o->max_restarts,
                 o->min_nodes, o->nnodes, o->run_id_set ? 1 : 0, o->run_id, a->host);
        if (ddp_store_set(s, k, v, strlen(v)) != DDP_OK)
            goto out_store;
        if (o->node_rank == 0 && close_round(a, slot) != 0)
            goto out;
        int64_t give_up = now_ms() + wait_ms, beat_at = 0;
        key(k, sizeof k, a, "members");
        int st;
        char rk[128];
        snprintf(rk, sizeof rk, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)slot);
        while ((st = peek_str(s, k, mv, mcap)) == 1) {
            beat(a, &beat_at);
            if (peek_str(s, rk, v, sizeof v) == 0) {
                ddprun_say("node 0 refused this node: %s", v);
                goto out;
            }
            if (interrupted(a)) {
                /* Tell node 0, which would otherwise close the round with this node in it and
                 * later take it for dead (a restart counted, the wrong cause named). A node of
                 * the job (it ran in an earlier round) stops the job, as a signal while the
                 * workers run does; one that never ran in it leaves the round alone (torch's
                 * agent stopped by a signal leaves the rendezvous open). */
                char line[400];
                snprintf(line, sizeof line,
                         "%sddprun on node %d ('%s') received SIG%s while the nodes gathered",
                         a->joined ? STOP_MARK : "", o->node_rank, a->host,
                         sigabbrev_np(a->stop_signal));
                if (a->joined) {
                    key(k, sizeof k, a, "failed");
                    (void)ddp_store_compare_set(s, k, "", 0, line, strlen(line), NULL, NULL);
                    (void)ddp_store_add(s, "ddprun/final_acks", 1, NULL); /* no wait for it */
                } else {
                    snprintf(k, sizeof k, "ddprun/a%d/left/%lld", a->wd.attempt, (long long)slot);
                    (void)ddp_store_set(s, k, line, strlen(line));
                }
                goto out;
            }
            if (now_ms() >= give_up) {
                ddprun_say("node 0 did not close round %d of the elastic rendezvous at '" HOSTF
                           "' within %.0f s; look at node 0's ddprun",
                           a->wd.attempt, HOSTA(o->master_addr, a->wd.master_port),
                           (double)wait_ms / 1000);
                goto out;
            }
            nap_ms(20);
        }
        if (st < 0)
            goto out_store;
        if (strncmp(mv, "fail ", 5) == 0) {
            if (o->node_rank != 0)
                ddprun_say("%s", mv + 5);
            goto out;
        }
        int restarts = 0, n = 0, used = 0, mine = -1;
        const char *p = mv;
        bool bad = sscanf(p, "ok %d %d%n", &restarts, &n, &used) != 2 || n < 1 || n > o->nnodes;
        p += bad ? 0 : used;
        for (int i = 0; !bad && i < n; i++) {
            long long j = 0;
            bad = sscanf(p, " %lld%n", &j, &used) != 1;
            p += bad ? 0 : used;
            slots[i] = j;
            if (j == slot)
                mine = i;
        }
        if (bad) {
            ddprun_say("node 0 sent a malformed rendezvous close; run the same ddprun on every "
                       "node");
            goto out;
        }
        if (mine >= 0) { /* a member: the world from the members' records */
            a->wd.world_size = 0;
            for (int i = 0; i < n; i++) {
                erec r;
                char msg[700];
                snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)slots[i]);
                if (peek_str(s, k, v, sizeof v) != 0)
                    goto out_store;
                if (check_erec(a, v, &r, msg, sizeof msg) != 0) {
                    ddprun_say("%s", msg);
                    goto out;
                }
                if (i == mine)
                    a->wd.rank_offset = a->wd.world_size;
                a->wd.world_size += r.nproc;
                a->member_id[i] = r.id;
                a->member_slot[i] = (int)slots[i];
                snprintf(a->member_host[i], sizeof a->member_host[i], "%s", r.host);
            }
            a->wd.nnodes = n;
            a->wd.group_rank = mine;
            a->wd.restarts = restarts;
            break;
        }
        /* Came after the close, or beyond MAX: node 0 sees this slot and re-forms the group
         * while it runs below MAX; at MAX this node waits for a place (a failure's restart). */
        if (!said)
            ddprun_say("node %d waits for the next round: the job runs with %d of at most %d "
                       "nodes (round %d closed before this node came, or it is full)",
                       o->node_rank, n, o->nnodes, a->wd.attempt);
        said = true;
        int64_t until = now_ms() + (int64_t)(o->rdzv_timeout * 1000);
        for (;;) {
            int64_t cur = 0;
            beat(a, &beat_at);
            int pst = peek_int(s, "ddprun/attempt", &cur);
            if (pst < 0)
                goto out_store;
            if (pst == 0 && cur > a->wd.attempt) {
                a->wd.attempt = (int)cur;
                break;
            }
            if (peek_str(s, rk, v, sizeof v) == 0) {
                ddprun_say("node 0 refused this node: %s", v);
                goto out;
            }
            if (peek_str(s, "ddprun/ended", v, sizeof v) == 0) {
                ddprun_say("the job ended (node 0's ddprun exits with status %s) before a place "
                           "opened for node %d; nothing ran on this node",
                           v, o->node_rank);
                goto out;
            }
            if (interrupted(a))
                goto out;
            if (now_ms() >= until) {
                ddprun_say("no place opened for node %d within --rdzv_timeout %g s: the job runs "
                           "with its %d nodes (--nnodes %d:%d); raise --rdzv_timeout "
                           "(join_timeout) to wait longer",
                           o->node_rank, o->rdzv_timeout, n, o->min_nodes, o->nnodes);
                goto out;
            }
            nap_ms(100);
        }
    }
    /* node 0 picks the workers' MASTER_PORT now and the others read it, as in a fixed job */
    snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    if (o->node_rank == 0) {
        if ((a->wd.free_port = pick_free_port(a, o->master_addr)) < 0 || start_round_store(a) != 0)
            goto out;
        snprintf(v, sizeof v, "%d %d", a->wd.free_port, a->wd.store_port);
        if (ddp_store_set(s, k, v, strlen(v)) != DDP_OK)
            goto out_store;
    } else {
        void *p = NULL;
        size_t n = 0;
        if (ddp_store_get(s, k, &p, &n) != DDP_OK)
            goto out_store;
        snprintf(v, sizeof v, "%.*s", (int)(n < sizeof v ? n : sizeof v - 1), (char *)p);
        free(p);
        int fp = 0, sp = 0;
        if (sscanf(v, "%d %d", &fp, &sp) != 2 || fp < 1 || fp > 65535 || sp < 1 || sp > 65535) {
            ddprun_say("node 0 sent a malformed MASTER_PORT; run the same ddprun on every node");
            goto out;
        }
        a->wd.free_port = fp;
        a->wd.store_port = sp;
    }
    a->joined = true;
    for (int i = 0; i < a->wd.nnodes; i++)
        a->node_dead[i] = false, a->gone_seen_ms[i] = 0;
    rc = 0;
    goto out;
out_store:
    ddprun_say("%s%s", ddp_store_last_error(s),
               o->node_rank ? " (the job may have ended: node 0's store is gone)" : "");
out:
    free(mv);
    free(slots);
    return rc;
}

static int rendezvous(agent *a)
{
    ddprun_opts *o = a->o;
    /* Node 0 picks the workers' MASTER_PORT afresh each attempt (a restarted rank 0 binds again),
     * once every node has joined, so that the port is free for as short a time as can be, and
     * hands it to the other nodes through the store. */
    a->wd.free_port = 0;
    release_port(a);
    if (o->elastic)
        return rendezvous_elastic(a);
    a->wd.store_port = a->wd.master_port;
    a->wd.restarts = a->wd.attempt;
    a->wd.group_rank = o->node_rank;
    a->wd.nnodes = o->nnodes;
    for (int i = 0; i < o->nnodes; i++)
        a->member_id[i] = i;
    if (o->nnodes == 1) {
        a->wd.world_size = o->nproc;
        a->wd.rank_offset = 0;
        return (a->wd.free_port = pick_free_port(a, o->master_addr)) < 0 ? -1 : 0;
    }
    ddp_store *s = a->store;
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    char k[128], val[64 + sizeof o->run_id];
    if (o->node_rank == 0) {
        snprintf(val, sizeof val, "%d", a->wd.attempt);
        if (ddp_store_set(s, "ddprun/attempt", val, strlen(val)) != DDP_OK)
            goto out_store;
    }
    if (claim_slot(a) != 0)
        return -1;
    snprintf(k, sizeof k, "ddprun/a%d/node/%d", a->wd.attempt, o->node_rank);
    snprintf(val, sizeof val, "%d %d %d %d %s", o->nproc, o->max_restarts, o->nnodes,
             o->run_id_set ? 1 : 0, o->run_id);
    if (ddp_store_set(s, k, val, strlen(val)) != DDP_OK)
        goto out_store;

    char **keys = calloc((size_t)o->nnodes, sizeof *keys);
    bool *checked = calloc((size_t)o->nnodes, sizeof *checked);
    if (!keys || !checked) {
        free(keys), free(checked);
        ddprun_say("out of memory in the rendezvous");
        return -1;
    }
    for (int i = 0; i < o->nnodes; i++) {
        keys[i] = malloc(64);
        if (keys[i])
            snprintf(keys[i], 64, "ddprun/a%d/node/%d", a->wd.attempt, i);
    }
    int rc = -1;
    int64_t start = now_ms();
    int64_t give_up = start + (int64_t)(o->rdzv_timeout * 1000), last_scan = 0;
    /* Poll rather than block in a store wait, so that Ctrl-C is heard while nodes gather; each
     * check is short, for the same reason. */
    ddp_store_set_timeout(s, 2000);
    for (;;) {
        bool all = false;
        if (ddp_store_check(s, (const char *const *)keys, (size_t)o->nnodes, &all) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        if (all)
            break;
        /* Node 0 reads up to --nnodes - 1 keys: every 200 ms, not at every poll. */
        if (o->node_rank != 0 || now_ms() - last_scan >= 200) {
            last_scan = now_ms();
            if (check_arrived_records(a, keys, checked))
                goto out_free;
        }
        if (interrupted(a))
            goto out_free;
        if (now_ms() >= give_up)
            break;
        nap_ms(20);
    }
    if (now_ms() >= give_up) {
        int joined = 0;
        char missing[200] = "";
        for (int i = 0; i < o->nnodes; i++) {
            bool have = false;
            (void)ddp_store_check(s, (const char *const *)&keys[i], 1, &have);
            if (have) {
                joined++;
            } else {
                size_t l = strlen(missing);
                if (l < sizeof missing - 16)
                    snprintf(missing + l, sizeof missing - l, "%s%d", l ? ", " : "", i);
            }
        }
        if (joined < o->nnodes) {
            ddprun_say("rendezvous at '" HOSTF "' timed out after %g s (%d of %d nodes joined; "
                       "missing node_rank %s); start ddprun on every node with the same --nnodes, "
                       "--master_addr and --master_port, or raise --rdzv_timeout",
                       HOSTA(o->master_addr, a->wd.master_port), o->rdzv_timeout, joined, o->nnodes,
                       missing);
            goto out_free;
        }
    }
    a->wd.world_size = 0;
    for (int i = 0; i < o->nnodes; i++) {
        void *v;
        size_t n;
        if (ddp_store_get(s, keys[i], &v, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        int np = 0, bad = check_node_record(a, i, v, &np);
        free(v);
        if (bad) {
            if (o->node_rank == 0)
                nap_ms(1000); /* as in check_arrived_records: let the other node read ours */
            goto out_free;
        }
        if (i == o->node_rank)
            a->wd.rank_offset = a->wd.world_size;
        a->wd.world_size += np;
    }
    /* Everyone is here: node 0 picks the workers' MASTER_PORT now and the others read it. */
    snprintf(k, sizeof k, "ddprun/a%d/master_port", a->wd.attempt);
    ddp_store_set_timeout(s, (int)(o->rdzv_timeout * 1000));
    if (o->node_rank == 0) {
        if ((a->wd.free_port = pick_free_port(a, o->master_addr)) < 0)
            goto out_free;
        snprintf(val, sizeof val, "%d", a->wd.free_port);
        if (ddp_store_set(s, k, val, strlen(val)) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
    } else {
        void *v = NULL;
        size_t n = 0;
        long fp = 0;
        if (ddp_store_get(s, k, &v, &n) != DDP_OK) {
            ddprun_say("%s", ddp_store_last_error(s));
            goto out_free;
        }
        fp = strtol(v, NULL, 10);
        free(v);
        if (fp < 1 || fp > 65535) {
            ddprun_say("node 0 sent a malformed MASTER_PORT; run the same ddprun on every node");
            goto out_free;
        }
        a->wd.free_port = (int)fp;
    }
    if (!a->joined && a->wd.attempt > 0)
        ddprun_say("node %d joined the job at attempt %d of %d", o->node_rank, a->wd.attempt + 1,
                   o->max_restarts + 1);
    a->joined = true;
    for (int i = 0; i < o->nnodes; i++) /* a node found dead before is back (it rejoined) */
        a->node_dead[i] = false, a->gone_seen_ms[i] = 0;
    a->wd.restarts = a->wd.attempt; /* claim_slot may have moved it */
    rc = 0;
out_free:
    for (int i = 0; i < o->nnodes; i++)
        free(keys[i]);
    free(keys);
    free(checked);
    return rc;
out_store:
    ddprun_say("%s", ddp_store_last_error(s));
    return -1;
}

/* ---- failures and stopping ------------------------------------------------------------------ */

/* The failure lines of a node whose ddprun stopped beating, and of a lost store: no summary
 * comes from that node. */
#define LINE_HEARTBEAT_LOST "stopped responding"
#define LINE_STORE_LOST "lost contact with the store"
#define LINE_NODE_GONE "lost: its ddprun's connection to the store closed"
#define CAUSE_WAIT_MAX_S 5.0 /* the longest ddprun waits for the cause after a secondary exit */

static bool peer_failed_exit(int status)
{
    return WIFEXITED(status) && WEXITSTATUS(status) == DDP_EXIT_PEER_FAILED;
}

/* Worker w ended badly: it becomes the job's failure, or replaces a secondary one. */
static void record_local_failure(agent *a, ddprun_worker *w)
{
    failure *f = &a->fail;
    bool secondary = peer_failed_exit(w->status);
    char replaced[sizeof f->replaced];
    snprintf(replaced, sizeof replaced, "%s", f->set ? f->line : "");
    memset(f, 0, sizeof *f);
    snprintf(f->replaced, sizeof f->replaced, "%s", replaced);
    f->set = true;
    f->secondary = secondary;
    f->local = true;
    f->rank = w->rank;
    f->local_rank = w->local_rank;
    f->pid = w->pid;
    f->status = w->status;
    wall_time(f->when, sizeof f->when);
    snprintf(f->log, sizeof f->log, "%s", w->log_path);
    for (int i = 0; i < a->o->nproc; i++) {
        const ddprun_worker *x = &a->w[i];
        if (x == w || !x->running || !x->seen_stopped)
            continue;
        size_t len = strlen(f->stopped);
        snprintf(f->stopped + len, sizeof f->stopped - len,
                 "%srank %d (pid %d, by SIG%s, for %.1f s)", len ? ", " : "", x->rank, (int)x->pid,
                 sigabbrev_np(x->stop_sig), (double)(now_ms() - x->stopped_ms) / 1000.0);
        f->n_stopped++;
    }
    char how[64];
    ddprun_describe_status(w->status, how, sizeof how);
    snprintf(f->line, sizeof f->line, "rank %d (local rank %d) on node %d ('%s') failed with %s%s",
             w->rank, w->local_rank, a->o->node_rank, a->host, how,
             secondary ? " (it stopped because another rank failed)" : "");
    if (a->o->nnodes > 1) {
        char k[128], val[sizeof SECONDARY_MARK + sizeof f->line];
        key(k, sizeof k, a, "failed");
        snprintf(val, sizeof val, "%s%s", secondary ? SECONDARY_MARK : "", f->line);
        ddp_store_set_timeout(a->store, 5000);
        void *cur = NULL;
        size_t cur_len = 0;
        if (ddp_store_compare_set(a->store, k, "", 0, val, strlen(val), &cur, &cur_len) == DDP_OK &&
            !secondary && cur && strncmp(cur, SECONDARY_MARK, strlen(SECONDARY_MARK)) == 0)
            /* Another node's secondary failure came first: this one is the cause. Should a third
             * node replace the same line at once, its failure is first-hand too; either serves. */
            (void)ddp_store_compare_set(a->store, k, cur, cur_len, val, strlen(val), NULL, NULL);
        free(cur);
    }
}

/* Another node's failure (or the store's loss): the job's failure, or it replaces a secondary one
 * when it is first-hand. */
static void record_remote_failure(agent *a, const char *line)
{
    bool secondary = strncmp(line, SECONDARY_MARK, strlen(SECONDARY_MARK)) == 0;
    if (a->fail.set && (!a->fail.secondary || secondary))
        return;
    if (strncmp(line, STOP_MARK, strlen(STOP_MARK)) == 0) {
        a->remote_stop = true;
        line += strlen(STOP_MARK);
    }
    bool reshape = strncmp(line, RESHAPE_MARK, strlen(RESHAPE_MARK)) == 0;
    if (reshape) {
        a->reshape = true;
        line += strlen(RESHAPE_MARK);
    }
    if (secondary)
        line += strlen(SECONDARY_MARK);
    char replaced[sizeof a->fail.replaced];
    snprintf(replaced, sizeof replaced, "%s", a->fail.set ? a->fail.line : "");
    memset(&a->fail, 0, sizeof a->fail);
    snprintf(a->fail.replaced, sizeof a->fail.replaced, "%s", replaced);
    a->fail.set = true;
    a->fail.secondary = secondary;
    a->fail.local = false;
    wall_time(a->fail.when, sizeof a->fail.when);
    snprintf(a->fail.line, sizeof a->fail.line, "%s", line);
    if (reshape)
        ddprun_say("re-forming the group: %s; the workers restart with the larger world (not "
                   "counted against --max_restarts)",
                   line);
    else if (!secondary)
        ddprun_say("stopping: %s", line);
}

/* After a secondary failure: the workers get a while to end on their own before the SIGTERM, so
 * that the rank which failed first-hand (and told the others, which is how they came to stop)
 * exits with its own code and message instead of ddprun's signal: --grace_period, at most
 * CAUSE_WAIT_MAX_S. */
static double cause_wait_s(const agent *a)
{
    return a->o->grace_period < CAUSE_WAIT_MAX_S ? a->o->grace_period : CAUSE_WAIT_MAX_S;
}

static void wait_for_cause(agent *a)
{
    if (a->cause_until)
        return;
    a->cause_until = now_ms() + (int64_t)(cause_wait_s(a) * 1000);
    ddprun_say("%s; waiting up to %.3g s for the rank that failed first-hand", a->fail.line,
               cause_wait_s(a));
}

/* Starts stopping every worker: sig to each process group; SIGKILL comes after the grace. */
static void stop_workers(agent *a, int sig, int64_t *kill_at)
{
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].running) {
            ddprun_signal_worker(&a->w[i], sig);
            a->w[i].signaled = true;
        }
    if (*kill_at == 0)
        *kill_at = now_ms() + (int64_t)(a->o->grace_period * 1000);
}

static void print_summary(agent *a, bool restarting)
{
    failure *f = &a->fail;
    const char *bar = "======================================================================";
    ddprun_say("%s", bar);
    if (!f->local) {
        ddprun_say("job %s on another node: %s", a->remote_stop ? "stopped" : "failed", f->line);
        /* A dead ddprun (or an unreachable node 0) prints no summary to look for. */
        if (strstr(f->line, LINE_HEARTBEAT_LOST) || strstr(f->line, LINE_NODE_GONE))
            ddprun_say("  that node's ddprun is gone: no summary comes from it (its workers die "
                       "with it)");
        else if (strncmp(f->line, LINE_STORE_LOST, strlen(LINE_STORE_LOST)) == 0)
            ddprun_say("  node 0's ddprun, or the way to it, is gone: no summary may come from it");
        else
            ddprun_say("  see the summary printed by that node's ddprun");
    } else {
        char how[64];
        ddprun_describe_status(f->status, how, sizeof how);
        if (f->secondary)
            ddprun_say("worker failed: rank %d (local rank %d, role '%s') ended with %s: it "
                       "stopped because another rank failed, and no rank reported a failure of "
                       "its own before the others were stopped; the first error is in the other "
                       "ranks' output",
                       f->rank, f->local_rank, a->o->role, how);
        else
            ddprun_say("worker failed: rank %d (local rank %d, role '%s') ended with %s", f->rank,
                       f->local_rank, a->o->role, how);
        ddprun_say("  time    : %s", f->when);
        ddprun_say("  node    : %d (host '%s')", a->o->node_rank, a->host);
        ddprun_say("  pid     : %d", (int)f->pid);
        if (f->log[0])
            ddprun_say("  log     : %s", f->log);
        else
            ddprun_say("  log     : console only (--log_dir DIR keeps a log per rank)");
        if (f->tail_n) {
            ddprun_say("  its last lines on stderr:");
            for (int i = 0; i < f->tail_n; i++)
                ddprun_say("    | %s", f->tail[i]);
        }
    }
    if (f->stopped[0])
        ddprun_say("  stopped : %s %s stopped when this failure came and had not continued: a "
                   "time-out of the other ranks is most likely %s doing",
                   f->stopped, f->n_stopped > 1 ? "were" : "was",
                   f->n_stopped > 1 ? "their" : "its");
    if (f->replaced[0])
        ddprun_say("  before  : %s", f->replaced);
    ddprun_say("  attempt : %d of %d (--max_restarts %d)", a->wd.restarts + 1,
               a->o->max_restarts + 1, a->o->max_restarts);
    if (f->also[0])
        ddprun_say("  also    : %s ended badly before ddprun stopped %s", f->also,
                   strchr(f->also, ',') ? "them" : "it");
    ddprun_say("  %s",
               restarting ? "restarting the whole group" : "every other worker was stopped");
    ddprun_say("%s", bar);
}

/* A multi-node job stopped by a signal to this node's ddprun: the other nodes point here
 * ("see the summary printed by that node's ddprun"), so a short one says what happened. A
 * single-node job prints none, as torchrun's agent does on SIGINT. */
static void print_signal_summary(agent *a)
{
    const char *bar = "======================================================================";
    ddprun_say("%s", bar);
    ddprun_say("job stopped: ddprun on node %d ('%s') received SIG%s", a->o->node_rank, a->host,
               sigabbrev_np(a->stop_signal));
    if (a->fail.set)
        ddprun_say("  before  : %s", a->fail.line);
    ddprun_say("  attempt : %d of %d (--max_restarts %d); a signal stop does not restart",
               a->wd.restarts + 1, a->o->max_restarts + 1, a->o->max_restarts);
    ddprun_say("  every worker on every node was told to stop; this ddprun exits %d",
               128 + a->stop_signal);
    ddprun_say("%s", bar);
}

/* Copies the failed worker's last stderr lines, oldest first, into the failure record. */
static void keep_tail(agent *a, const ddprun_worker *w)
{
    failure *f = &a->fail;
    if (!f->local || f->rank != w->rank)
        return;
    const ddprun_stream *s = &w->err;
    f->tail_n = s->tail_n;
    for (int i = 0; i < s->tail_n; i++)
        snprintf(f->tail[i], sizeof f->tail[i], "%s",
                 s->tail[(s->tail_next - s->tail_n + i + 5) % 5]);
}

/* Removes shared-memory segments of this run left by workers that crashed while setting up a
 * group (after set-up the library unlinks them itself). Names: /dev/shm/ddp-<run_id>-…. */
static void remove_leftover_segments(const agent *a)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        /* Only names our own workers made (ddp-<run_id, cut to 40>-<pid>-…), so another run
         * whose id starts with ours is left alone. */
        bool ours = false;
        for (int i = 0; i < a->o->nproc && !ours; i++) {
            char prefix[160];
            ddprun_segment_prefix(a->o->run_id, a->w[i].pid, prefix, sizeof prefix);
            ours = a->w[i].pid > 0 && strncmp(e->d_name, prefix, strlen(prefix)) == 0;
        }
        if (!ours)
            continue;
        char path[512];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (unlink(path) == 0)
            ddprun_say("removed shared memory '%s' left by a crashed worker", path);
    }
    closedir(d);
}

/* ---- the monitor loop ---------------------------------------------------------------------- */

static ddprun_worker *find_worker(agent *a, pid_t pid)
{
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].pid == pid)
            return &a->w[i];
    return NULL;
}

/* Multi-node health: another node's failure, our own heartbeat, node 0 watching the others.
 * Returns false when the store itself is lost. */
static bool waiting_nodes(agent *a, char *line, size_t cap, bool *found);

/* Writes a first-hand failure line to the failed key: it is the first, or replaces a secondary
 * one (as record_local_failure does). */
static void publish_first_hand(agent *a, const char *line)
{
    char k[128];
    key(k, sizeof k, a, "failed");
    void *cur = NULL;
    size_t cur_len = 0;
    if (ddp_store_compare_set(a->store, k, "", 0, line, strlen(line), &cur, &cur_len) == DDP_OK &&
        cur && strncmp(cur, SECONDARY_MARK, strlen(SECONDARY_MARK)) == 0)
        (void)ddp_store_compare_set(a->store, k, cur, cur_len, line, strlen(line), NULL, NULL);
    free(cur);
}

/* Node 0: the other members' heartbeats and presence. lost gets a line for a node found dead
 * (else ""): its presence connection closed (gone/<node>: the store saw it at once) and its
 * heartbeat has not moved since, for GONE_CONFIRM_MS or 5 ticks, whichever is longer (a live
 * node whose connection merely broke beats on, and counts as alive); or no heartbeat for
 * --agent_timeout (a machine that vanished, no FIN). false when the store failed. */
#define GONE_CONFIRM_MS 1000
static bool watch_members(agent *a, char *lost, size_t cap)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    int64_t now = now_ms();
    int64_t confirm = (int64_t)(o->monitor_interval * 5000);
    if (confirm < GONE_CONFIRM_MS)
        confirm = GONE_CONFIRM_MS;
    if (confirm > (int64_t)(o->agent_timeout * 1000))
        confirm = (int64_t)(o->agent_timeout * 1000);
    lost[0] = '\0';
    for (int i = 1; i < a->wd.nnodes; i++) {
        int64_t v;
        snprintf(k, sizeof k, "ddprun/hb/%d", a->member_id[i]);
        if (ddp_store_add(s, k, 0, &v) != DDP_OK)
            return false;
        bool moved = v != a->hb_value[i];
        if (moved) {
            a->hb_value[i] = v;
            a->hb_changed_ms[i] = now;
        }
        snprintf(k, sizeof k, "ddprun/gone/%d", a->member_id[i]);
        const char *keys[1] = {k};
        bool gone = false;
        if (ddp_store_check(s, keys, 1, &gone) != DDP_OK)
            return false;
        if (gone && !a->gone_seen_ms[i]) {
            a->gone_seen_ms[i] = now;
            a->gone_hb[i] = v;
        } else if (gone && v != a->gone_hb[i]) {
            /* It beats on: alive, its presence connection broke (the heartbeat path stays). */
            ddprun_say("node %d's presence connection to the store closed, but its ddprun still "
                       "beats: taken for alive",
                       a->member_id[i]);
            (void)ddp_store_delete(s, k, NULL);
            a->gone_seen_ms[i] = 0;
        } else if (gone &&
                   (now - a->gone_seen_ms[i] >= confirm ||
                    (!moved && now - a->hb_changed_ms[i] > (int64_t)(o->agent_timeout * 1000)))) {
            /* (also when the heartbeat's time ran out first: the closed connection is the
             * better account of what happened) */
            void *host = NULL;
            size_t n = 0;
            if (ddp_store_get(s, k, &host, &n) != DDP_OK)
                return false;
            char when[64];
            time_t at = time(NULL) - (time_t)((now - a->gone_seen_ms[i]) / 1000);
            struct tm tm;
            localtime_r(&at, &tm);
            strftime(when, sizeof when, "%H:%M:%S", &tm);
            snprintf(lost, cap,
                     "node %d ('%.*s') " LINE_NODE_GONE " at %s and it has not beaten since (its "
                     "machine or ddprun died)",
                     a->member_id[i], (int)(n < 64 ? n : 64), host ? (char *)host : "?", when);
            free(host);
            a->node_dead[i] = true;
            return true;
        }
        if (!moved && now - a->hb_changed_ms[i] > (int64_t)(o->agent_timeout * 1000)) {
            snprintf(lost, cap,
                     "the ddprun of node %d " LINE_HEARTBEAT_LOST " (no heartbeat for %.0f s); its "
                     "machine or launcher died",
                     a->member_id[i], o->agent_timeout);
            a->node_dead[i] = true;
            return true;
        }
    }
    return true;
}

static bool check_nodes(agent *a, bool may_reshape, bool *remote_failed, char *line, size_t cap)
{
    ddprun_opts *o = a->o;
    ddp_store *s = a->store;
    char k[128];
    /* Short calls: while one blocks, output, exits and signals wait. The caller tolerates
     * failures for up to --agent_timeout before it calls the store lost. */
    ddp_store_set_timeout(s, 2000);
    /* The heartbeat first: a node still stopping its workers after a failure or a re-form beats
     * too, so that an elastic node 0 gathering the next round keeps its place (close_round). */
    snprintf(k, sizeof k, "ddprun/hb/%d", o->node_rank);
    if (ddp_store_add(s, k, 1, NULL) != DDP_OK)
        return false;
    key(k, sizeof k, a, "failed");
    const char *keys[1] = {k};
    bool failed = false;
    if (ddp_store_check(s, keys, 1, &failed) != DDP_OK)
        return false;
    if (failed) {
        void *v = NULL;
        size_t n = 0;
        if (ddp_store_get(s, k, &v, &n) != DDP_OK)
            return false;
        snprintf(line, cap, "%s", (char *)v);
        free(v);
        *remote_failed = true;
        /* Node 0 still watches the others after a secondary failure: a node that died is its
         * cause (its workers' peers stop first, then it is found gone). */
        if (o->node_rank != 0 || strncmp(line, SECONDARY_MARK, strlen(SECONDARY_MARK)) != 0)
            return true;
    }
    if (o->node_rank != 0)
        return true;
    char lost[700];
    if (!watch_members(a, lost, sizeof lost))
        return false;
    if (lost[0]) {
        publish_first_hand(a, lost);
        snprintf(line, cap, "%s", lost);
        *remote_failed = true;
        return true;
    }
    if (failed)
        return true;
    /* Elastic, below MAX, every worker of this node still running: a node that has come since
     * the round closed re-forms the group (torch's agent: num_nodes_waiting > 0 → restart). */
    bool found = false;
    if (o->elastic && may_reshape && a->wd.nnodes < o->nnodes) {
        if (!waiting_nodes(a, line, cap, &found))
            return false;
        key(k, sizeof k, a, "failed");
        if (found && ddp_store_compare_set(s, k, "", 0, line, strlen(line), NULL, NULL) == DDP_OK)
            *remote_failed = true; /* the line read back next tick if another node's came first */
    }
    return true;
}

/* Node 0 of an elastic job: whether a node has joined this round's rendezvous since it closed
 * (its slot is not among the members; torch's num_nodes_waiting). *found, and line says which.
 * false when the store failed. */
static bool waiting_nodes(agent *a, char *line, size_t cap, bool *found)
{
    ddp_store *s = a->store;
    char k[128];
    int64_t count = 0;
    *found = false;
    key(k, sizeof k, a, "count");
    if (ddp_store_add(s, k, 0, &count) != DDP_OK)
        return false;
    if (count <= a->wd.nnodes)
        return true; /* every slot a member's (the common case: nothing more to read) */
    /* A node whose workers all finished (done): the job is ending, and a re-form would run the
     * finished workers again (torch's agent leaves once its workers succeeded); the newcomer
     * waits, and leaves when the job ends. */
    for (int i = 1; i < a->wd.nnodes; i++) {
        bool done = false;
        snprintf(k, sizeof k, "ddprun/a%d/done/%d", a->wd.attempt, i);
        const char *keys[1] = {k};
        if (ddp_store_check(s, keys, 1, &done) != DDP_OK)
            return false;
        if (done)
            return true;
    }
    for (int64_t j = 0; j < count && !*found; j++) {
        bool member = false;
        for (int i = 0; i < a->wd.nnodes && !member; i++)
            member = a->member_slot[i] == j;
        if (member)
            continue;
        char v[700];
        snprintf(k, sizeof k, "ddprun/a%d/slot/%lld", a->wd.attempt, (long long)j);
        int st = peek_str(s, k, v, sizeof v);
        if (st < 0)
            return false;
        erec r;
        char why[700];
        if (st > 0)
            continue; /* not written yet: next tick */
        if (check_erec(a, v, &r, why, sizeof why) != 0) {
            /* other flags: no reason to re-form; that node is told at once */
            snprintf(k, sizeof k, "ddprun/a%d/refused/%lld", a->wd.attempt, (long long)j);
            st = peek_str(s, k, v, sizeof v);
            if (st < 0 || (st > 0 && ddp_store_set(s, k, why, strlen(why)) != DDP_OK))
                return false;
            if (st > 0)
                ddprun_say("refused a node: %s", why);
            continue;
        }
        /* Only for a node whose heartbeat moves: one that came and died (or was left out of the
         * round for its silence and is still gone) is no reason to restart the workers. */
        int64_t hb = 0, *seen = wait_hb_slot(a, j);
        snprintf(k, sizeof k, "ddprun/hb/%d", r.id);
        if (ddp_store_add(s, k, 0, &hb) != DDP_OK)
            return false;
        if (!seen || *seen == INT64_MIN || *seen == hb) {
            if (seen && *seen == INT64_MIN)
                *seen = hb;
            continue;
        }
        snprintf(line, cap,
                 RESHAPE_MARK "node %d ('%s') joined the running job (%d of at most %d nodes "
                              "running)",
                 r.id, r.host, a->wd.nnodes, a->o->nnodes);
        *found = true;
    }
    return true;
}

/* Whether every node has reported done for this attempt. */
static bool all_done(agent *a, bool *ok)
{
    char k[128];
    *ok = true;
    for (int i = 0; i < a->wd.nnodes; i++) {
        bool have;
        snprintf(k, sizeof k, "ddprun/a%d/done/%d", a->wd.attempt, i);
        const char *keys[1] = {k};
        if (ddp_store_check(a->store, keys, 1, &have) != DDP_OK) {
            *ok = false;
            return false;
        }
        if (!have)
            return false;
    }
    return true;
}

static outcome run_attempt(agent *a)
{
    ddprun_opts *o = a->o;
    int n = o->nproc;
    memset(a->w, 0, sizeof *a->w * (size_t)n);
    memset(&a->fail, 0, sizeof a->fail);
    a->cause_until = 0;
    if (o->nnodes > 1 && o->node_rank == 0) {
        /* The members' presence marks left by earlier lives (a node's ddprun killed and
         * started anew): each member of this attempt has a connection of its own now. */
        ddp_store_set_timeout(a->store, 2000);
        for (int i = 1; i < a->wd.nnodes; i++) {
            char k[64];
            snprintf(k, sizeof k, "ddprun/gone/%d", a->member_id[i]);
            (void)ddp_store_delete(a->store, k, NULL);
            a->gone_seen_ms[i] = 0;
        }
    }
    int64_t kill_at = 0, drain_until = 0;
    int running = 0;
    bool spawn_failed = false;
    for (int i = 0; i < n; i++) {
        ddprun_worker *w = &a->w[i];
        w->local_rank = i;
        w->rank = a->wd.rank_offset + i;
        w->out.fd = w->err.fd = -1;
        w->out.file_fd = w->err.file_fd = -1;
        w->in_fd = -1;
        if (ddprun_output_open(o, a->wd.attempt, w) != 0)
            return AGENT_ERROR;
    }
    for (int i = 0; i < n && !spawn_failed; i++) {
        ddprun_worker *w = &a->w[i];
        if (ddprun_spawn(o, &a->wd, w, a->pipe_out, a->reaper_fd) != 0)
            spawn_failed = true;
        if (w->running)
            running++;
    }
    if (spawn_failed) /* fork or pipe failure, already printed: the machine is in trouble */
        stop_workers(a, SIGTERM, &kill_at);

    bool done_reported = false;
    int64_t next_check = now_ms();
    int64_t tick = (int64_t)(o->monitor_interval * 1000);
    if (tick < 1)
        tick = 1;
    for (int i = 1; i < a->wd.nnodes; i++)
        a->hb_changed_ms[i] = now_ms();
    a->reshape = false;

    struct pollfd *pfd = calloc((size_t)(2 * n + 2), sizeof *pfd); /* + signals, terminal */
    ddprun_stream **streams = calloc((size_t)(2 * n), sizeof *streams);
    ddprun_worker **owners = calloc((size_t)(2 * n), sizeof *owners);
    if (!pfd || !streams || !owners) {
        free(pfd);
        free(streams);
        free(owners);
        ddprun_say("out of memory monitoring workers");
        stop_workers(a, SIGKILL, &kill_at);
        return AGENT_ERROR;
    }
    outcome result = OK_ALL;
    bool store_lost = false;
    int64_t unreachable_since = 0;
    for (;;) {
        int open_streams = 0;
        int np = 0;
        pfd[np++] = (struct pollfd){.fd = a->sigfd, .events = POLLIN};
        for (int i = 0; i < n; i++) {
            ddprun_stream *ss[2] = {&a->w[i].out, &a->w[i].err};
            for (int j = 0; j < 2; j++) {
                if (ss[j]->fd < 0)
                    continue;
                streams[open_streams] = ss[j];
                owners[open_streams] = &a->w[i];
                pfd[np++] = (struct pollfd){.fd = ss[j]->fd, .events = POLLIN};
                open_streams++;
            }
        }
        /* The terminal, while this job is its foreground job (a background read would stop
         * ddprun with SIGTTIN; SIGCONT after fg or bg comes through sigfd, and we look again). */
        int in_slot = -1;
        if (a->w[0].in_fd >= 0 && a->w[0].running && !a->suspended && foreground()) {
            in_slot = np;
            pfd[np++] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
        }
        bool multi_waiting = o->nnodes > 1 && !store_lost;
        bool wait_nodes = multi_waiting && done_reported && !a->fail.set && !a->stop_signal;
        /* A secondary failure, and this node's workers are gone: another node's cause may still
         * come, for this node's summary to name. */
        bool cause_pending = a->fail.set && a->fail.secondary && !a->stop_signal;
        bool wait_cause = multi_waiting && cause_pending && now_ms() < a->cause_until;
        if (running == 0 && open_streams == 0 && !wait_nodes && !wait_cause)
            break;

        int64_t now = now_ms();
        int64_t wake = INT64_MAX;
        if (kill_at && running)
            wake = kill_at;
        if (cause_pending && (!kill_at || wait_cause) && a->cause_until < wake)
            wake = a->cause_until;
        if (drain_until && open_streams && drain_until < wake)
            wake = drain_until;
        if (multi_waiting && next_check < wake)
            wake = next_check;
        int timeout = wake == INT64_MAX ? -1 : (int)(wake > now ? wake - now : 0);
        int rc = poll(pfd, (nfds_t)np, timeout);
        if (rc < 0 && errno != EINTR) {
            ddprun_say("poll failed: %s", strerror(errno));
            stop_workers(a, SIGKILL, &kill_at);
            result = AGENT_ERROR;
        }
        if (rc > 0 && (pfd[0].revents & POLLIN)) {
            struct signalfd_siginfo si;
            while (read(a->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (sig == SIGCHLD || job_control(a, sig) || passed_on(a, sig))
                    continue; /* SIGCHLD: reaped below */
                if (a->stop_signal) {
                    ddprun_say("second SIG%s: killing every worker now", sigabbrev_np(sig));
                    stop_workers(a, SIGKILL, &kill_at);
                    continue;
                }
                a->stop_signal = sig;
                ddprun_say("received SIG%s: stopping every worker (SIGKILL after %.0f s; send it "
                           "again to kill now)",
                           sigabbrev_np(sig), o->grace_period);
                stop_workers(a, sig, &kill_at);
                if (o->nnodes > 1 && !store_lost) {
                    char k[128], line[300];
                    key(k, sizeof k, a, "failed");
                    snprintf(line, sizeof line, STOP_MARK "ddprun on node %d ('%s') received SIG%s",
                             o->node_rank, a->host, sigabbrev_np(sig));
                    ddp_store_set_timeout(a->store, 2000);
                    (void)ddp_store_compare_set(a->store, k, "", 0, line, strlen(line), NULL, NULL);
                }
            }
        }
        for (int i = 0; rc > 0 && i < open_streams; i++) {
            if (!pfd[i + 1].revents)
                continue;
            if (!ddprun_output_pump(o, owners[i], streams[i]))
                ddprun_output_close(o, owners[i], streams[i]);
        }
        if (rc > 0 && in_slot >= 0 && pfd[in_slot].revents)
            relay_input(&a->w[0]);
        /* Reap whatever exited (the signalfd only says that something did). */
        int status;
        pid_t pid;
        /* A failure stops the others after this loop, so that every worker already dead by then
         * is reaped unsignalled and, if it failed too, named in the summary ("also"). */
        bool stop_after = false;
        while ((pid = waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
            ddprun_worker *w = find_worker(a, pid);
            if (!w || !w->running)
                continue; /* the reaper, or a stranger */
            if (WIFSTOPPED(status)) {
                if (!a->suspended) /* not our Ctrl-Z: a debugger, or someone's SIGSTOP */
                    ddprun_say("rank %d (pid %d) was stopped by SIG%s; the job will not "
                               "progress until it gets SIGCONT (kill -CONT %d)",
                               w->rank, (int)pid, sigabbrev_np(WSTOPSIG(status)), (int)pid);
                if (!a->suspended && !w->seen_stopped)
                    w->stopped_ms = now_ms();
                w->seen_stopped = !a->suspended;
                w->stop_sig = WSTOPSIG(status);
                continue;
            }
            if (WIFCONTINUED(status)) {
                if (w->seen_stopped)
                    ddprun_say("rank %d (pid %d) continues", w->rank, (int)pid);
                w->seen_stopped = false;
                continue;
            }
            w->running = false;
            w->status = status;
            w->exited_ms = now_ms();
            if (w->in_fd >= 0) {
                close(w->in_fd);
                w->in_fd = -1;
            }
            running--;
            bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            /* The first failure; or a first-hand one while only a secondary failure is known,
             * from a worker ddprun had not signalled yet (ending of ddprun's SIGTERM is no
             * cause). */
            bool first_hand = !peer_failed_exit(status) && !w->signaled;
            if (!ok && !a->stop_signal && (!a->fail.set || (a->fail.secondary && first_hand))) {
                bool replaces = a->fail.set;
                record_local_failure(a, w);
                if (replaces)
                    ddprun_say("the cause: %s", a->fail.line);
                if (a->fail.secondary)
                    wait_for_cause(a);
                else
                    stop_after = true;
            } else if (!ok && !a->stop_signal && first_hand && a->fail.set &&
                       !(a->fail.local && a->fail.rank == w->rank)) {
                /* Failed at about the same time, on its own: named in the summary, so that
                 * "every other worker was stopped" does not hide it. */
                char how[64];
                ddprun_describe_status(status, how, sizeof how);
                size_t len = strlen(a->fail.also);
                snprintf(a->fail.also + len, sizeof a->fail.also - len, "%srank %d (%s)",
                         len ? ", " : "", w->rank, how);
            }
            if (running == 0 && !drain_until)
                drain_until = now_ms() + 2000; /* output still in pipes, or held by stragglers */
        }
        int wait_errno = errno;
        if (stop_after)
            stop_workers(a, SIGTERM, &kill_at);
        if (pid < 0 && wait_errno == ECHILD && running > 0) {
            /* Someone reaped our children (SIGCHLD ignored by a wrapper despite main()'s reset):
             * we can no longer tell how they ended. */
            ddprun_say("lost track of %d worker%s (already reaped by someone else); stopping",
                       running, running == 1 ? "" : "s");
            for (int i = 0; i < n; i++)
                a->w[i].running = false;
            running = 0;
            result = AGENT_ERROR;
            if (!drain_until)
                drain_until = now_ms() + 2000;
        }
        now = now_ms();
        if (a->fail.set && a->fail.secondary && !kill_at && !a->stop_signal &&
            now >= a->cause_until) {
            if (running)
                ddprun_say("no rank failed first-hand within %.3g s of: %s; stopping the workers",
                           cause_wait_s(a), a->fail.line);
            stop_workers(a, SIGTERM, &kill_at);
        }
        if (kill_at && running && now >= kill_at) {
            ddprun_say("workers still running %.0f s after SIG%s: sending SIGKILL", o->grace_period,
                       sigabbrev_np(a->stop_signal ? a->stop_signal : SIGTERM));
            stop_workers(a, SIGKILL, &kill_at);
            kill_at = now + 1000000000;
        }
        if (running == 0 && drain_until && now >= drain_until) {
            for (int i = 0; i < open_streams; i++)
                ddprun_output_close(o, owners[i], streams[i]);
        }
        if (running == 0 && !a->fail.set && !a->stop_signal && o->nnodes > 1 && !done_reported &&
            !store_lost) {
            char k[128];
            snprintf(k, sizeof k, "ddprun/a%d/done/%d", a->wd.attempt, a->wd.group_rank);
            ddp_store_set_timeout(a->store, 5000);
            if (ddp_store_set(a->store, k, "1", 1) != DDP_OK)
                store_lost = true;
            done_reported = true;
        }
        if (multi_waiting && now >= next_check && !store_lost) {
            next_check = now + tick;
            bool remote = false;
            char line[700];
            bool reachable =
                check_nodes(a, !done_reported && running == n && !a->fail.set && !a->stop_signal,
                            &remote, line, sizeof line);
            if (reachable)
                unreachable_since = 0;
            else if (!unreachable_since)
                unreachable_since = now;
            if (!reachable && now_ms() - unreachable_since > (int64_t)(o->agent_timeout * 1000)) {
                store_lost = true;
                if (!a->fail.set && !a->stop_signal) {
                    char msg[700];
                    snprintf(msg, sizeof msg, LINE_STORE_LOST " on node 0 ('" HOSTF "'): %s",
                             HOSTA(o->master_addr, a->wd.master_port),
                             ddp_store_last_error(a->store));
                    record_remote_failure(a, msg);
                    stop_workers(a, SIGTERM, &kill_at);
                }
            } else if (!reachable) {
                /* not yet lost: try again next tick */
            } else if (remote && !a->stop_signal && (!a->fail.set || a->fail.secondary)) {
                /* a new failure, or the cause of a secondary one (else nothing changes) */
                record_remote_failure(a, line);
                if (a->fail.secondary)
                    wait_for_cause(a);
                else
                    stop_workers(a, SIGTERM, &kill_at);
            } else if (done_reported && !a->fail.set) {
                bool ok;
                if (all_done(a, &ok))
                    break;
                if (!ok)
                    store_lost = true;
            }
        }
    }
    free(pfd);
    free(streams);
    free(owners);
    for (int i = 0; i < n; i++) {
        ddprun_worker *w = &a->w[i];
        if (w->pid > 0) {
            /* Whatever the worker left in its process group goes with it. */
            kill(-w->pid, SIGKILL);
            ddprun_reaper_untrack(a->reaper_fd, w->pid);
        }
        keep_tail(a, w);
        ddprun_output_close(o, w, &w->out);
        ddprun_output_close(o, w, &w->err);
    }
    remove_leftover_segments(a);
    if (result == AGENT_ERROR || spawn_failed)
        return AGENT_ERROR;
    if (a->stop_signal)
        return SIGNALED;
    if (store_lost) {
        /* Node 0 is gone with the store: there is nothing to restart against. */
        if (!a->fail.set)
            record_remote_failure(a, LINE_STORE_LOST " on node 0 before every node finished");
        return STORE_LOST;
    }
    if (a->remote_stop)
        return REMOTE_STOP;
    if (a->reshape)
        return RESHAPED;
    if (a->fail.set)
        return FAILED;
    return OK_ALL;
}

/* Elastic, node 0 at the end: nodes still waiting for a place (beyond MAX, or come as the job
 * ended) are told, rather than left to find the store gone (ddprun/ended: the exit status). */
static void tell_waiters(agent *a, int code)
{
    char k[128], v[16];
    int64_t count = 0;
    if (!a->o->elastic || a->o->node_rank != 0 || !a->store)
        return;
    ddp_store_set_timeout(a->store, 2000);
    key(k, sizeof k, a, "count");
    if (ddp_store_add(a->store, k, 0, &count) != DDP_OK || count <= a->wd.nnodes)
        return;
    snprintf(v, sizeof v, "%d", code);
    if (ddp_store_set(a->store, "ddprun/ended", v, strlen(v)) == DDP_OK)
        nap_ms(300); /* they look every 100 ms */
}

/* A node other than 0: a second connection to the store, idle, whose close makes the store set
 * ddprun/gone/<node> = host (ddp_store_on_close). A ddprun killed (-9, its machine rebooting
 * with the network up) closes it at once, so node 0 names the node lost within a second or so,
 * not after --agent_timeout. Without it the heartbeat path still finds the node. */
static void open_presence(agent *a)
{
    ddprun_opts *o = a->o;
    if (o->nnodes == 1 || o->node_rank <= 0)
        return;
    char k[128];
    snprintf(k, sizeof k, "ddprun/gone/%d", o->node_rank);
    ddp_store_set_timeout(a->store, 2000);
    ddp_store_opts co = DDP_STORE_OPTS_INIT;
    co.host = o->master_addr;
    co.port = a->wd.master_port;
    co.token = a->wd.token;
    /* Idle: its keepalive (a quarter of this, 4 to 60 s) must not end it before the heartbeat
     * would call a silent node dead; the store's own sets the mark only for a close the node
     * made (FIN, RST), never for a network that went quiet. */
    co.timeout_ms = o->agent_timeout < 900 ? (int)(o->agent_timeout * 4000) : 3600000;
    co.connect_timeout_ms = 2000;
    ddp_error err = {0};
    /* A mark left by this node's earlier life (a ddprun started anew) stays until node 0 has
     * seen it: node 0 clears the members' marks as each attempt starts. */
    if (ddp_store_connect(&co, &a->presence, &err) != DDP_OK ||
        ddp_store_on_close(a->presence, k, a->host, strlen(a->host)) != DDP_OK) {
        ddprun_say("note: no presence connection to the store (%s); should this ddprun die, "
                   "node 0 finds it only after --agent_timeout",
                   a->presence  ? ddp_store_last_error(a->presence)
                   : err.msg[0] ? err.msg
                                : ddp_store_last_error(a->store));
        ddp_store_close(a->presence);
        a->presence = NULL;
    }
}

/* Node 0 keeps the store up until every other node has finished with it. */
static void final_handshake(agent *a)
{
    ddprun_opts *o = a->o;
    if (o->nnodes == 1)
        return;
    ddp_store_set_timeout(a->store, 2000);
    if (o->node_rank != 0) {
        (void)ddp_store_add(a->store, "ddprun/final_acks", 1, NULL);
        return;
    }
    /* A node declared dead will never ack: waiting for it only delays the exit by the whole
     * bound below. */
    int64_t expected = a->wd.nnodes - 1;
    for (int i = 1; i < a->wd.nnodes; i++)
        if (a->node_dead[i])
            expected--;
    int64_t deadline = now_ms() + (int64_t)(o->grace_period * 1000) + 5000;
    while (now_ms() < deadline) {
        int64_t acks = 0;
        if (ddp_store_add(a->store, "ddprun/final_acks", 0, &acks) != DDP_OK || acks >= expected)
            return;
        nap_ms(20);
    }
}

int ddprun_agent_run(ddprun_opts *o, int sigfd, int reaper_fd)
{
    agent a;
    memset(&a, 0, sizeof a);
    a.o = o;
    a.sigfd = sigfd;
    a.reaper_fd = reaper_fd;
    a.port_hold = -1;
    if (gethostname(a.host, sizeof a.host) != 0)
        snprintf(a.host, sizeof a.host, "?");
    a.host[sizeof a.host - 1] = '\0';
    a.w = calloc((size_t)o->nproc, sizeof *a.w);
    a.hb_value = calloc((size_t)o->nnodes, sizeof *a.hb_value);
    a.hb_changed_ms = calloc((size_t)o->nnodes, sizeof *a.hb_changed_ms);
    a.node_dead = calloc((size_t)o->nnodes, sizeof *a.node_dead);
    a.gone_seen_ms = calloc((size_t)o->nnodes, sizeof *a.gone_seen_ms);
    a.gone_hb = calloc((size_t)o->nnodes, sizeof *a.gone_hb);
    a.member_id = calloc((size_t)o->nnodes, sizeof *a.member_id);
    a.member_slot = calloc((size_t)o->nnodes, sizeof *a.member_slot);
    a.member_host = calloc((size_t)o->nnodes, sizeof *a.member_host);
    int code = 1;
    if (!a.w || !a.hb_value || !a.hb_changed_ms || !a.node_dead || !a.gone_seen_ms || !a.gone_hb ||
        !a.member_id || !a.member_slot || !a.member_host) {
        ddprun_say("out of memory");
        goto out;
    }
    if (setup_store(&a) != 0) {
        if (a.stop_signal)
            code = 128 + a.stop_signal;
        goto out;
    }
    open_presence(&a);

    for (a.wd.attempt = 0;; a.wd.attempt++) {
        if (rendezvous(&a) != 0) {
            if (a.stop_signal)
                code = 128 + a.stop_signal;
            goto out;
        }
        o->prefix = o->prefix_template[0] || (!o->no_prefix && a.wd.world_size > 1);
        o->interactive = o->nproc == 1 && isatty(STDIN_FILENO);
        a.pipe_out = o->prefix || o->want_files || o->nproc > 1 || o->ranks_filter;
        /* A log folder that cannot be made fails like a worker that cannot start (below). */
        bool dir_ok = o->log_run_dir[0] || ddprun_output_run_dir(o) == 0;
        if (dir_ok && (a.wd.attempt == 0 || o->elastic) && o->node_rank == 0) {
            cpu_set_t c;
            char pin[48] = "";
            if (o->nproc > 1 && ddprun_worker_cpus(o, 0, &c))
                snprintf(pin, sizeof pin, " (pinned, %d core%s each)", CPU_COUNT(&c),
                         CPU_COUNT(&c) == 1 ? "" : "s");
            char range[64] = "";
            if (o->elastic)
                snprintf(range, sizeof range, " (of %d:%d; round %d, restart %d)", o->min_nodes,
                         o->nnodes, a.wd.attempt, a.wd.restarts);
            ddprun_say("%d worker%s on %d node%s%s%s, store at " HOSTF ", run id %s%s%s",
                       a.wd.world_size, a.wd.world_size == 1 ? "" : "s", a.wd.nnodes,
                       a.wd.nnodes == 1 ? "" : "s", range, pin,
                       HOSTA(o->master_addr, a.wd.master_port), o->run_id,
                       o->want_files ? ", logs in " : "", o->want_files ? o->log_run_dir : "");
        }
        outcome r = dir_ok ? run_attempt(&a) : AGENT_ERROR;
        if (r == OK_ALL) {
            code = 0;
            final_handshake(&a);
            goto out;
        }
        if (r == SIGNALED) {
            code = 128 + a.stop_signal;
            if (o->nnodes > 1)
                print_signal_summary(&a);
            final_handshake(&a);
            goto out;
        }
        if (r == AGENT_ERROR) {
            /* Tell the other nodes now (they would otherwise take this node for dead only after
             * --agent_timeout, naming the wrong cause); the reason is in this node's output. */
            if (o->nnodes > 1) {
                char k[128], line[400];
                key(k, sizeof k, &a, "failed");
                snprintf(line, sizeof line,
                         STOP_MARK "ddprun on node %d ('%s') could not start or watch its "
                                   "workers; the reason is in that ddprun's output",
                         o->node_rank, a.host);
                ddp_store_set_timeout(a.store, 2000);
                (void)ddp_store_compare_set(a.store, k, "", 0, line, strlen(line), NULL, NULL);
            }
            final_handshake(&a);
            goto out;
        }
        if (r == REMOTE_STOP || r == STORE_LOST) {
            print_summary(&a, false);
            if (r == REMOTE_STOP)
                final_handshake(&a);
            goto out;
        }
        if (r == RESHAPED)
            continue; /* a node joined: said; no restart counted (torch's agent neither) */
        bool restart = a.wd.restarts < o->max_restarts;
        print_summary(&a, restart);
        if (!restart) {
            final_handshake(&a);
            goto out;
        }
        a.wd.restarts++; /* elastic: node 0's count is the job's (it closes each round) */
    }
out:
    tell_waiters(&a, code);
    release_port(&a);
    if (a.presence) { /* an orderly end: this node is not lost */
        ddp_store_set_timeout(a.presence, 1000);
        (void)ddp_store_on_close(a.presence, "", NULL, 0);
    }
    ddp_store_close(a.presence);
    ddp_store_close(a.store);
    ddp_store_server_stop(a.round_server);
    ddp_store_server_stop(a.server);
    free(a.w);
    free(a.hb_value);
    free(a.hb_changed_ms);
    free(a.node_dead);
    free(a.gone_seen_ms);
    free(a.gone_hb);
    free(a.member_id);
    free(a.member_slot);
    free(a.member_host);
    free(a.wait_hb);
    return code;
}
