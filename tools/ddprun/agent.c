/*
 * agent.c — one node's ddprun: the job's lifecycle.
 *
 *   node 0 hosts the store  →  attempt k: nodes meet (ranks contiguous per node, in node order)
 *   → spawn local workers  →  monitor: output, exits, signals, other nodes  →  success, or stop
 *   everyone and restart (k+1) while --max_restarts allows, else print the summary and exit 1.
 *
 * The store's set-up and the rendezvous are in rendezvous.c (elastic rounds: elastic.c), the
 * other nodes' liveness in presence.c; agent_int.h lists the store keys they share. Here: the
 * signals ddprun receives, the monitor loop of one attempt, the failure record and summary. A
 * single-node job uses the same code with no store traffic while it runs.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"

static void wall_time(char *buf, size_t cap)
{
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S %Z", &tm);
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

bool agent_interrupted(agent *a)
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

/* ---- failures and stopping ------------------------------------------------------------------ */

#define CAUSE_WAIT_MAX_S 5.0 /* the longest ddprun waits for the cause after a secondary exit */

static bool peer_failed_exit(int status)
{
    return WIFEXITED(status) && WEXITSTATUS(status) == DDP_EXIT_PEER_FAILED;
}

/* The failure's one-line description, shared with the other nodes. */
static void failure_line(agent *a, const ddprun_worker *w, bool secondary)
{
    char how[64];
    ddprun_describe_status(w->status, how, sizeof how);
    snprintf(a->fail.line, sizeof a->fail.line,
             "rank %d (local rank %d) on node %d ('%s') failed with %s%s", w->rank, w->local_rank,
             a->o->node_rank, a->host, how,
             secondary ? " (it stopped because another rank failed)" : "");
}

/* This node's workers stopped (SIGSTOP, a debugger) when the failure came, but `except`: into
 * the failure, for the summary's "stopped" line (a time-out elsewhere is most likely theirs). */
static void note_stopped(agent *a, const ddprun_worker *except, bool store_ok)
{
    failure *f = &a->fail;
    for (int i = 0; i < a->o->nproc; i++) {
        const ddprun_worker *x = &a->w[i];
        if (x == except || !x->running || !x->seen_stopped)
            continue;
        size_t len = strlen(f->stopped);
        snprintf(f->stopped + len, sizeof f->stopped - len,
                 "%srank %d (pid %d, by SIG%s, for %.1f s)", len ? ", " : "", x->rank, (int)x->pid,
                 sigabbrev_np(x->stop_sig), (double)(now_ms() - x->stopped_ms) / 1000.0);
        f->n_stopped++;
    }
    /* and the other nodes' (share_stopped): a time-out here may be a rank stopped there */
    if (a->o->nnodes < 2 || !a->store || !store_ok)
        return;
    ddp_store_set_timeout(a->store, 2000);
    for (int n = 0; n < a->wd.nnodes; n++) {
        if (n == a->wd.group_rank)
            continue;
        char k[128], v[sizeof f->stopped];
        snprintf(k, sizeof k, "ddprun/a%d/stopped/%d", a->wd.attempt, n);
        int st = agent_peek_str(a->store, k, v, sizeof v);
        if (st < 0)
            break; /* the store is gone: nothing more to learn */
        if (st > 0 || !v[0])
            continue;
        size_t len = strlen(f->stopped);
        snprintf(f->stopped + len, sizeof f->stopped - len, "%s%s", len ? ", " : "", v);
        for (const char *p = v; (p = strstr(p, "rank ")) != NULL; p++)
            f->n_stopped++;
    }
}

/* This node's stopped workers, for the other nodes' summaries (note_stopped): the key
 * ddprun/a<attempt>/stopped/<node> lists them, and goes when none is stopped. */
static void share_stopped(agent *a)
{
    if (a->o->nnodes < 2 || !a->store)
        return;
    char k[128], v[sizeof a->fail.stopped] = "";
    snprintf(k, sizeof k, "ddprun/a%d/stopped/%d", a->wd.attempt, a->wd.group_rank);
    for (int i = 0; i < a->o->nproc; i++) {
        const ddprun_worker *x = &a->w[i];
        if (!x->running || !x->seen_stopped)
            continue;
        size_t len = strlen(v);
        snprintf(v + len, sizeof v - len, "%srank %d (pid %d on node %d, by SIG%s at %s)",
                 len ? ", " : "", x->rank, (int)x->pid, a->o->node_rank, sigabbrev_np(x->stop_sig),
                 x->stopped_at);
    }
    ddp_store_set_timeout(a->store, 2000);
    if (v[0])
        (void)ddp_store_set(a->store, k, v, strlen(v));
    else
        (void)ddp_store_delete(a->store, k, NULL);
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
    f->ef_status = 1; /* read once the workers are gone (pick_root_cause) */
    w->failed_own = !secondary;
    f->rank = w->rank;
    f->local_rank = w->local_rank;
    f->pid = w->pid;
    f->status = w->status;
    wall_time(f->when, sizeof f->when);
    snprintf(f->log, sizeof f->log, "%s", w->log_path);
    note_stopped(a, w, true);
    failure_line(a, w, secondary);
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
    /* another node's time-out because of a rank stopped here: named here too (it was named
     * nowhere when the failure came from another node) */
    note_stopped(a, NULL, strncmp(line, LINE_STORE_LOST, strlen(LINE_STORE_LOST)) != 0);
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
            /* a stopped worker (SIGSTOP, a debugger, Ctrl-Z) acts on the signal only once it
             * runs: without SIGCONT it cost the whole --grace_period, then SIGKILL */
            if (sig != SIGKILL && (a->w[i].seen_stopped || a->suspended))
                ddprun_signal_worker(&a->w[i], SIGCONT);
        } else if (a->w[i].pid > 0) {
            /* What an ended worker left in its process group (a child holding its output) is
             * stopped with the rest now, not SIGKILLed after the 2 s output drain. */
            ddprun_signal_worker(&a->w[i], sig);
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
        if (f->remote_error[0]) /* that node's root cause's message (agent_share_error) */
            ddprun_say("  error   : %s", f->remote_error);
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
        agent_print_error_file(a);
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
    if (f->first_exit[0])
        ddprun_say("  first   : %s, but this rank's error is older: the earliest error is the "
                   "root cause, as under torchrun",
                   f->first_exit);
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

/* ---- the root cause ------------------------------------------------------------------------ */

/* Once the workers are gone: the failure is the earliest error among the local ranks that failed
 * on their own before ddprun stopped them (the first to exit, and the "also" ranks), as torchrun
 * takes the smallest timestamp: an error file's, else when ddprun saw the rank end; a tie keeps
 * the first to exit. A rank that wrote its error and took a while to exit (Python unwinding, a
 * checkpoint flushed on the way out) is the cause, not the one that exited first. Then the
 * failure's error file is read for the summary. */
static void pick_root_cause(agent *a)
{
    failure *f = &a->fail;
    if (!f->set || !f->local)
        return;
    ddprun_worker *cur = NULL;
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].pid > 0 && a->w[i].rank == f->rank)
            cur = &a->w[i];
    if (!cur)
        return;
    ddprun_worker *best = cur;
    if (!f->secondary) {
        bool from_file;
        int64_t best_t = agent_error_time(cur, &from_file);
        for (int i = 0; i < a->o->nproc; i++) {
            ddprun_worker *w = &a->w[i];
            if (w == cur || !w->failed_own)
                continue;
            int64_t t = agent_error_time(w, &from_file);
            if (from_file && t < best_t) {
                best = w;
                best_t = t;
            }
        }
    }
    if (best != cur) {
        char how[64];
        ddprun_describe_status(cur->status, how, sizeof how);
        snprintf(f->first_exit, sizeof f->first_exit, "rank %d (%s) was seen to end first",
                 cur->rank, how);
        f->rank = best->rank;
        f->local_rank = best->local_rank;
        f->pid = best->pid;
        f->status = best->status;
        time_t t = (time_t)best->exited_wall;
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(f->when, sizeof f->when, "%Y-%m-%d %H:%M:%S %Z", &tm);
        snprintf(f->log, sizeof f->log, "%s", best->log_path);
        f->also[0] = '\0';
        for (int i = 0; i < a->o->nproc; i++) {
            const ddprun_worker *w = &a->w[i];
            if (w == best || !w->failed_own)
                continue;
            ddprun_describe_status(w->status, how, sizeof how);
            size_t len = strlen(f->also);
            snprintf(f->also + len, sizeof f->also - len, "%srank %d (%s)", len ? ", " : "",
                     w->rank, how);
        }
        failure_line(a, best, false);
    }
    agent_read_error_file(a, best);
}

/* ---- the monitor loop ---------------------------------------------------------------------- */

static ddprun_worker *find_worker(agent *a, pid_t pid)
{
    for (int i = 0; i < a->o->nproc; i++)
        if (a->w[i].pid == pid)
            return &a->w[i];
    return NULL;
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
            a->gone[i].seen_ms = 0;
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
        agent_error_file_path(a, w);
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

    /* + signals, terminal, the two consoles' queues */
    struct pollfd *pfd = calloc((size_t)(2 * n + 4), sizeof *pfd);
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
        /* The console far behind: workers' output waits in their pipes (and they in write())
         * until it reads; once they are gone, what is left in the pipes is read. */
        short out_events = ddprun_output_backlogged() && running > 0 ? 0 : POLLIN;
        for (int i = 0; i < n; i++) {
            ddprun_stream *ss[2] = {&a->w[i].out, &a->w[i].err};
            for (int j = 0; j < 2; j++) {
                if (ss[j]->fd < 0)
                    continue;
                streams[open_streams] = ss[j];
                owners[open_streams] = &a->w[i];
                pfd[np++] = (struct pollfd){.fd = ss[j]->fd, .events = out_events};
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
        for (int i = 0; i < n; i++) /* a stop not said (rate limit): said when its 5 s are up */
            if (a->w[i].running && a->w[i].seen_stopped && !a->w[i].stop_said &&
                a->w[i].stop_said_ms + 5000 < wake)
                wake = a->w[i].stop_said_ms + 5000;
        int timeout = wake == INT64_MAX ? -1 : (int)(wake > now ? wake - now : 0);
        np += ddprun_output_pollfds(pfd + np); /* after every slot the loop below reads */
        int rc = poll(pfd, (nfds_t)np, timeout);
        ddprun_output_flush();
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
            if (!w && pid == ddprun_reaper_pid() && (WIFEXITED(status) || WIFSIGNALED(status))) {
                /* killed by hand (pkill ddp-reaper, an OOM killer): said, the job goes on */
                char how[64];
                if (WIFSIGNALED(status))
                    snprintf(how, sizeof how, "by SIG%s", sigabbrev_np(WTERMSIG(status)));
                else
                    snprintf(how, sizeof how, "with exit code %d", WEXITSTATUS(status));
                ddprun_say("warning: the reaper (pid %d, 'ddp-reaper') ended %s: the job goes on, "
                           "but if ddprun is now killed with SIGKILL what its workers started "
                           "and their /dev/shm segments are left behind",
                           (int)pid, how);
                continue;
            }
            if (!w || !w->running)
                continue; /* a stranger, or a stop or continue of the reaper */
            if (WIFSTOPPED(status)) {
                /* not our Ctrl-Z: a debugger, or someone's SIGSTOP; said once per 5 s */
                w->stop_said = false;
                if (!a->suspended && now_ms() - w->stop_said_ms >= 5000) {
                    char more[96] = "";
                    if (w->stops_unsaid)
                        snprintf(more, sizeof more,
                                 " (stopped and continued %d more time%s since "
                                 "the last such line)",
                                 w->stops_unsaid, w->stops_unsaid == 1 ? "" : "s");
                    ddprun_say("rank %d (pid %d) was stopped by SIG%s; the job will not "
                               "progress until it gets SIGCONT (kill -CONT %d)%s",
                               w->rank, (int)pid, sigabbrev_np(WSTOPSIG(status)), (int)pid, more);
                    w->stop_said_ms = now_ms();
                    w->stop_said = true;
                    w->stops_unsaid = 0;
                } else if (!a->suspended) {
                    w->stops_unsaid++;
                }
                bool fresh = !a->suspended && !w->seen_stopped;
                if (fresh) {
                    w->stopped_ms = now_ms();
                    time_t t = time(NULL);
                    struct tm tmv;
                    strftime(w->stopped_at, sizeof w->stopped_at, "%H:%M:%S",
                             localtime_r(&t, &tmv));
                }
                w->seen_stopped = !a->suspended;
                w->stop_sig = WSTOPSIG(status);
                if (fresh && !store_lost && !unreachable_since) /* (no store waits then) */
                    share_stopped(a);
                continue;
            }
            if (WIFCONTINUED(status)) {
                bool was = w->seen_stopped;
                if (was && w->stop_said)
                    ddprun_say("rank %d (pid %d) continues", w->rank, (int)pid);
                w->seen_stopped = false;
                if (was && !store_lost && !unreachable_since)
                    share_stopped(a);
                continue;
            }
            w->running = false;
            w->status = status;
            w->exited_ms = now_ms();
            w->exited_wall = (int64_t)time(NULL);
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
                w->failed_own = true;
            }
            if (running == 0 && !drain_until)
                drain_until = now_ms() + 2000; /* output still in pipes, or held by stragglers */
        }
        int wait_errno = errno;
        for (int i = 0; i < n; i++) {
            /* stopped again within 5 s of its last line and still stopped: the log's last word
             * on it must not stay "continues" */
            ddprun_worker *w = &a->w[i];
            if (w->running && w->seen_stopped && !w->stop_said &&
                now_ms() - w->stop_said_ms >= 5000) {
                ddprun_say("rank %d (pid %d) is stopped (by SIG%s; stopped and continued %d "
                           "time%s since the last such line); the job will not progress until "
                           "it gets SIGCONT (kill -CONT %d)",
                           w->rank, (int)w->pid, sigabbrev_np(w->stop_sig), w->stops_unsaid,
                           w->stops_unsaid == 1 ? "" : "s", (int)w->pid);
                w->stop_said = true;
                w->stop_said_ms = now_ms();
                w->stops_unsaid = 0;
            }
        }
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
            bool reachable = agent_check_nodes(
                a, !done_reported && running == n && !a->fail.set && !a->stop_signal, &remote, line,
                sizeof line);
            if (reachable)
                unreachable_since = 0;
            else if (!unreachable_since)
                unreachable_since = now;
            /* Refused: nothing listens where node 0's store was (its ddprun ended: the kernel
             * answers for a dead process), known at once; a time-out may be a passing network
             * fault, tolerated for --agent_timeout. Either is the cause of a secondary failure
             * (this node's ranks stopped because node 0's did), not only of a first one. */
            bool refused = !reachable && ddp_store_refused(a->store);
            if (!reachable &&
                (refused || now_ms() - unreachable_since > (int64_t)(o->agent_timeout * 1000))) {
                store_lost = true;
                if ((!a->fail.set || a->fail.secondary) && !a->stop_signal) {
                    char msg[700];
                    snprintf(msg, sizeof msg, LINE_STORE_LOST " on node 0 ('" HOSTF "')%s: %s",
                             HOSTA(o->master_addr, a->wd.master_port),
                             refused ? " (its ddprun is gone: the connection was refused)" : "",
                             ddp_store_last_error(a->store));
                    bool secondary = a->fail.set;
                    record_remote_failure(a, msg);
                    if (secondary)
                        ddprun_say("the cause: %s", a->fail.line);
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
                if (agent_all_done(a, &ok))
                    break;
                if (!ok)
                    store_lost = true;
            }
        }
    }
    free(pfd);
    free(streams);
    free(owners);
    pick_root_cause(a);
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
    agent_share_error(a, store_lost);
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
    a.gone = calloc((size_t)o->nnodes, sizeof *a.gone);
    a.member_id = calloc((size_t)o->nnodes, sizeof *a.member_id);
    a.member_slot = calloc((size_t)o->nnodes, sizeof *a.member_slot);
    a.member_host = calloc((size_t)o->nnodes, sizeof *a.member_host);
    int code = 1;
    if (!a.w || !a.hb_value || !a.hb_changed_ms || !a.node_dead || !a.gone || !a.member_id ||
        !a.member_slot || !a.member_host) {
        ddprun_say("out of memory");
        goto out;
    }
    if (agent_setup_store(&a) != 0) {
        if (a.stop_signal)
            code = 128 + a.stop_signal;
        goto out;
    }
    agent_open_presence(&a);

    for (a.wd.attempt = 0;; a.wd.attempt++) {
        if (agent_rendezvous(&a) != 0) {
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
            agent_final_handshake(&a);
            goto out;
        }
        if (r == SIGNALED) {
            code = 128 + a.stop_signal;
            if (o->nnodes > 1)
                print_signal_summary(&a);
            agent_final_handshake(&a);
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
            agent_final_handshake(&a);
            goto out;
        }
        if (r == REMOTE_STOP || r == STORE_LOST) {
            print_summary(&a, false);
            if (r == REMOTE_STOP)
                agent_final_handshake(&a);
            goto out;
        }
        if (r == RESHAPED)
            continue; /* a node joined: said; no restart counted (torch's agent neither) */
        bool restart = a.wd.restarts < o->max_restarts;
        print_summary(&a, restart);
        if (!restart) {
            agent_pass_error_file(&a);
            agent_final_handshake(&a);
            goto out;
        }
        a.wd.restarts++; /* elastic: node 0's count is the job's (it closes each round) */
    }
out:
    agent_remove_error_dir(&a);
    agent_tell_waiters(&a, code);
    agent_release_port(&a);
    agent_close_presence(&a);
    ddp_store_close(a.store);
    ddp_store_server_stop(a.round_server);
    ddp_store_server_stop(a.server);
    free(a.w);
    free(a.hb_value);
    free(a.hb_changed_ms);
    free(a.node_dead);
    free(a.gone);
    free(a.member_id);
    free(a.member_slot);
    free(a.member_host);
    free(a.wait_hb);
    return code;
}
