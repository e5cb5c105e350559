/*
 * spawn.c — ddp_spawn() (include/ddp/spawn.h): a one-host world forked from inside one program,
 * for C users who want no launcher. It is a small ddprun without exec: the same environment
 * contract, the same all-or-nothing stop, and a store the workers meet in.
 *
 * The store runs in a process of its own, forked first, rather than in a thread of the caller:
 * the workers are forked afterwards from a caller that is still single-threaded (as far as this
 * call is concerned), so nothing a thread held at fork time can be left locked in them, and the
 * thread sanitizer's rule against threads after a multi-threaded fork holds. The store process
 * stops when its control pipe reaches end of file: when this call closes it, or when the caller
 * dies. Deliberately not here: restarts, output prefixes, pinning (ddprun has them).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ddp/spawn.h"
#include "ddp/store.h"
#include "util/util.h"

#define DEFAULT_TIMEOUT_MS (24 * 3600 * 1000)
#define DEFAULT_GRACE_MS 5000
#define STORE_START_MS 30000

typedef struct store_proc {
    pid_t pid;
    int ctl; /* write end of the control pipe: closing it stops the store */
    int port;
} store_proc;

/* Waits for pid until deadline_ms, then SIGKILLs and reaps it. */
static void reap_by(pid_t pid, int64_t deadline_ms)
{
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return;
        if (ddp__now_ms() >= deadline_ms) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            return;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static ddp_status store_start(const char *token, store_proc *sp, ddp_error *err)
{
    int portp[2], ctl[2];
    if (pipe2(portp, O_CLOEXEC) != 0)
        return ddp__err(err, DDP_ERR_SYSTEM, "ddp_spawn: pipe: %s", strerror(errno));
    if (pipe2(ctl, O_CLOEXEC) != 0) {
        int e = errno;
        close(portp[0]);
        close(portp[1]);
        return ddp__err(err, DDP_ERR_SYSTEM, "ddp_spawn: pipe: %s", strerror(e));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(portp[0]);
        close(portp[1]);
        close(ctl[0]);
        close(ctl[1]);
        return ddp__err(err, DDP_ERR_SYSTEM, "ddp_spawn: cannot fork the store: %s", strerror(e));
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        close(portp[0]);
        close(ctl[1]);
        signal(SIGINT, SIG_IGN); /* Ctrl-C stops the workers; the store waits for the caller */
        ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
        so.host = "127.0.0.1";
        so.token = token;
        ddp_store_server *srv = NULL;
        ddp_error e = {0};
        int port = -1;
        if (ddp_store_server_start(&so, &srv, &e) == DDP_OK)
            port = ddp_store_server_port(srv);
        else
            fprintf(stderr, "ddp_spawn: the store did not start: %s\n", e.msg);
        ssize_t k;
        do
            k = write(portp[1], &port, sizeof port);
        while (k < 0 && errno == EINTR);
        close(portp[1]);
        if (port >= 0) {
            char c;
            while (read(ctl[0], &c, 1) < 0 && errno == EINTR)
                ;
            ddp_store_server_stop(srv);
        }
        _exit(port >= 0 ? 0 : 1);
    }
    close(portp[1]);
    close(ctl[0]);
    int port = -1;
    ssize_t k = -1;
    struct pollfd pfd = {.fd = portp[0], .events = POLLIN};
    int64_t deadline = ddp__now_ms() + STORE_START_MS;
    for (;;) {
        int pr = poll(&pfd, 1, ddp__ms_left(deadline));
        if (pr > 0) {
            do
                k = read(portp[0], &port, sizeof port);
            while (k < 0 && errno == EINTR);
            break;
        }
        if (pr == 0 || (pr < 0 && errno != EINTR))
            break;
    }
    close(portp[0]);
    if (k != (ssize_t)sizeof port || port <= 0) {
        close(ctl[1]);
        reap_by(pid, ddp__now_ms() + 1000);
        return ddp__err(err, DDP_ERR_SYSTEM,
                        "ddp_spawn: the private store did not start on a loopback port within "
                        "%d s (its message is on standard error)",
                        STORE_START_MS / 1000);
    }
    sp->pid = pid;
    sp->ctl = ctl[1];
    sp->port = port;
    return DDP_OK;
}

static void store_stop(store_proc *sp)
{
    close(sp->ctl);
    reap_by(sp->pid, ddp__now_ms() + 5000);
}

/* In the worker: the environment contract, as ddprun gives it. setenv after fork is safe here:
 * the caller was single-threaded at the fork (store_start's comment), so no lock is held. */
static int set_contract(int rank, int n, int port, const char *run_id, const char *token)
{
    static const char *const names[] = {DDP_ENV_CONTRACT, NULL};
    for (int i = 0; names[i]; i++)
        unsetenv(names[i]);
    char r[16], w[16], p[16], cores[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(w, sizeof w, "%d", n);
    snprintf(p, sizeof p, "%d", port);
    snprintf(cores, sizeof cores, "%d", ddp_own_cores());
    const char *kv[][2] = {
        {"RANK", r},
        {"LOCAL_RANK", r},
        {"WORLD_SIZE", w},
        {"LOCAL_WORLD_SIZE", w},
        {"GROUP_RANK", "0"},
        {"GROUP_WORLD_SIZE", "1"},
        {"ROLE_RANK", r},
        {"ROLE_WORLD_SIZE", w},
        {"ROLE_NAME", "default"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", p}, /* a C function, not a program with a store of its own */
        {"DDP_STORE_PORT", p},
        {"DDP_RUN_ID", run_id},
        {"TORCHELASTIC_RUN_ID", run_id},
        {"DDP_STORE_TOKEN", token},
        {"DDP_RESTART_COUNT", "0"},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"DDP_MAX_RESTARTS", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "0"},
        {"DDP_AGENT_STORE", "1"},
        {"DDP_HOST_CORES", cores},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        if (setenv(kv[i][0], kv[i][1], 1) != 0)
            return -1;
    return 0;
}

/* Removes shared memory of this run that a worker stopped while setting up a group left behind
 * (after set-up the shm backend unlinks its segment itself, src/group/shm/shm.c, which names it
 * /dev/shm/ddp-<run_id cut to 40>-<pid of its creator>-…). Only names our workers made. As
 * ddprun's agent does after a failed attempt. */
static void remove_leftover_segments(const char *run_id, const pid_t *pids, int n)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        bool ours = false;
        for (int i = 0; i < n && !ours; i++) {
            char prefix[160];
            snprintf(prefix, sizeof prefix, "ddp-%.40s-%d-", run_id, (int)pids[i]);
            ours = pids[i] > 0 && strncmp(e->d_name, prefix, strlen(prefix)) == 0;
        }
        if (!ours)
            continue;
        char path[512];
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        unlink(path);
    }
    closedir(d);
}

static void describe(int status, char *buf, size_t cap)
{
    if (WIFEXITED(status))
        ddp__fmt(buf, cap, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        ddp__fmt(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        ddp__fmt(buf, cap, "ended with status %#x", status);
}

/* Sends sig to every worker still running. */
static void signal_all(const pid_t *pids, const bool *done, int n, int sig)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0 && !done[i])
            kill(pids[i], sig);
}

ddp_status ddp_spawn(int nprocs, ddp_spawn_fn fn, void *arg, const ddp_spawn_opts *opts,
                     ddp_spawn_result *result, ddp_error *err)
{
    ddp_spawn_opts def = DDP_SPAWN_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!fn || nprocs < 1 || nprocs > DDP_SPAWN_MAX_PROCS)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_spawn: nprocs %d is not from 1 to %d, or fn is NULL", nprocs,
                        DDP_SPAWN_MAX_PROCS);
    char run_id[128], token[65];
    ddp_status st;
    if ((st = ddp_random_token(token, 32, err)))
        return st;
    if (opts->run_id) {
        /* ddprun's rule for --run_id: the id names shared-memory segments, where a '/' (or
         * "..") made every group's creation fail with "Invalid argument". */
        bool name_ok = *opts->run_id && strlen(opts->run_id) < sizeof run_id;
        for (const char *c = opts->run_id; name_ok && *c; c++)
            name_ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                      (*c >= '0' && *c <= '9') || *c == '_' || *c == '.' || *c == '-';
        if (!name_ok || !strcmp(opts->run_id, ".") || !strcmp(opts->run_id, ".."))
            return ddp__err(err, DDP_ERR_INVALID,
                            "ddp_spawn: run_id '%.200s' must be 1 to %zu letters, digits, '_', "
                            "'.' and '-' (it names the job's shared memory)",
                            opts->run_id, sizeof run_id - 1);
        ddp__fmt(run_id, sizeof run_id, "%s", opts->run_id);
    } else {
        char hex[17];
        if ((st = ddp_random_token(hex, 16, err)))
            return st;
        ddp__fmt(run_id, sizeof run_id, "spawn-%s", hex);
    }
    int timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    int grace_ms = opts->grace_ms > 0 ? opts->grace_ms : DEFAULT_GRACE_MS;

    pid_t *pids = calloc((size_t)nprocs, sizeof *pids);
    bool *done = calloc((size_t)nprocs, sizeof *done);
    /* When each worker's fn returned (CLOCK_MONOTONIC ns, 0: not yet), written by the worker:
     * after one rank fails, the others fail too as they notice, often before this call looks;
     * the earliest is the one to report. Anonymous shared memory: nothing in /dev/shm. */
    int64_t *ended_ns = mmap(NULL, sizeof(int64_t) * (size_t)nprocs, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (!pids || !done || ended_ns == MAP_FAILED) {
        free(pids);
        free(done);
        if (ended_ns != MAP_FAILED)
            munmap(ended_ns, sizeof(int64_t) * (size_t)nprocs);
        return ddp__err(err, DDP_ERR_NOMEM, "ddp_spawn: out of memory");
    }
    fflush(NULL); /* else each worker would print the caller's buffered output again */
    store_proc sp = {-1, -1, -1};
    if ((st = store_start(token, &sp, err)))
        goto out_free;

    ddp_spawn_result res = {-1, 0, 0};
    pid_t parent = getpid();
    int started = 0;
    for (; started < nprocs; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "ddp_spawn: cannot fork rank %d of %d: %s", started,
                          nprocs, strerror(errno));
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127); /* the caller died before we got here */
            close(sp.ctl);  /* only the caller may keep the store alive */
            /* The stop must work even if the caller blocks or ignores SIGTERM (a signalfd). */
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            signal(SIGTERM, SIG_DFL);
            int rc = 125;
            ddp_world w;
            ddp_error e = {0};
            if (set_contract(started, nprocs, sp.port, run_id, token) != 0)
                fprintf(stderr, "ddp_spawn: rank %d: cannot set its environment\n", started);
            else if (ddp_world_from_env(&w, &e) != DDP_OK)
                fprintf(stderr, "ddp_spawn: rank %d: %s\n", started, e.msg);
            else
                rc = fn(&w, arg);
            __atomic_store_n(&ended_ns[started], ddp__now_ns(), __ATOMIC_RELEASE);
            fflush(NULL);
            _exit(rc == 0 ? 0 : (rc & 0xff) ? rc & 0xff : 1);
        }
        pids[started] = pid;
    }

    /* Wait: the first failure stops the rest (SIGTERM, SIGKILL after the grace period), as
     * does the deadline. Polling with a short sleep keeps the caller's SIGCHLD untouched. */
    int64_t deadline = ddp__now_ms() + timeout_ms, kill_at = -1;
    bool timed_out = false;
    if (st != DDP_OK) { /* a fork failed: stop the ranks already started */
        signal_all(pids, done, started, SIGTERM);
        kill_at = ddp__now_ms() + grace_ms;
    }
    int running = started;
    long nap_ns = 1000000;
    int64_t alive_ns = ddp__now_ns(); /* every worker not yet reaped was alive then */
    /* A first failure that is secondary (DDP_EXIT_PEER_FAILED: the rank stopped because another
     * reported a failure) is reported only until the rank that failed first-hand ends, which the
     * others get until cause_until to do on their own, before the SIGTERM (as ddprun does). */
    bool secondary = false, stopping = st != DDP_OK;
    int64_t cause_until = -1;
    char before[128] = "";
    while (running > 0) {
        bool progress = false;
        int first = -1, first_status = 0, first_errno = 0;
        int64_t first_ns = INT64_MAX;
        int sfirst = -1; /* the earliest secondary failure of the round */
        int64_t sfirst_ns = INT64_MAX;
        int64_t round_ns = ddp__now_ns();
        for (int i = 0; i < started; i++) {
            if (done[i])
                continue;
            int status = 0;
            pid_t r = waitpid(pids[i], &status, WNOHANG);
            if (r == 0 || (r < 0 && errno == EINTR))
                continue;
            int e = r < 0 ? errno : 0;
            done[i] = true;
            running--;
            progress = true;
            bool failed = r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
            if (!failed)
                continue;
            /* A worker that did not return from fn (a signal, exit()) ended at an unknown time
             * after alive_ns: counting it then makes it win over the ranks that noticed it. */
            int64_t t = __atomic_load_n(&ended_ns[i], __ATOMIC_ACQUIRE);
            if (t == 0)
                t = alive_ns;
            if (r > 0 && WIFEXITED(status) && WEXITSTATUS(status) == DDP_EXIT_PEER_FAILED) {
                if (t < sfirst_ns) {
                    sfirst = i;
                    sfirst_ns = t;
                }
                continue;
            }
            if (stopping) /* ended by our SIGTERM or SIGKILL: no cause */
                continue;
            if (t < first_ns) {
                first = i;
                first_ns = t;
                first_status = r < 0 ? -1 : status;
                first_errno = e;
            }
        }
        alive_ns = round_ns;
        if (first < 0 && sfirst >= 0 && res.failed_rank < 0 && !timed_out && st == DDP_OK) {
            res.failed_rank = sfirst;
            res.exit_code = DDP_EXIT_PEER_FAILED;
            res.signal = 0;
            st = ddp__err(err, DDP_ERR_CLOSED,
                          "rank %d of %d exited with code %d: it stopped because another rank "
                          "failed, and no rank reported a failure of its own before the others "
                          "were stopped",
                          sfirst, nprocs, DDP_EXIT_PEER_FAILED);
            ddp__fmt(before, sizeof before,
                     " (rank %d exited first with code %d: it stopped "
                     "because of this failure)",
                     sfirst, DDP_EXIT_PEER_FAILED);
            secondary = true;
            cause_until = ddp__now_ms() + (grace_ms < 5000 ? grace_ms : 5000);
        }
        if (first >= 0 && (res.failed_rank < 0 || secondary) && !timed_out &&
            (st == DDP_OK || secondary)) {
            res.failed_rank = first;
            res.exit_code =
                first_status >= 0 && WIFEXITED(first_status) ? WEXITSTATUS(first_status) : -1;
            res.signal =
                first_status >= 0 && WIFSIGNALED(first_status) ? WTERMSIG(first_status) : 0;
            char how[96];
            if (first_status < 0)
                ddp__fmt(how, sizeof how, "could not be waited for (%s)", strerror(first_errno));
            else
                describe(first_status, how, sizeof how);
            st = ddp__err(err, DDP_ERR_CLOSED, "rank %d of %d %s; the other ranks were stopped%s",
                          first, nprocs, how, secondary ? before : "");
            secondary = false;
            stopping = true;
            signal_all(pids, done, started, SIGTERM);
            kill_at = ddp__now_ms() + grace_ms;
        }
        if (secondary && !stopping && ddp__now_ms() >= cause_until) {
            stopping = true;
            signal_all(pids, done, started, SIGTERM);
            kill_at = ddp__now_ms() + grace_ms;
        }
        int64_t now = ddp__now_ms();
        if (running > 0 && !timed_out && st == DDP_OK && now >= deadline) {
            timed_out = true;
            char still[256] = "";
            size_t len = 0;
            for (int i = 0; i < started && len + 12 < sizeof still; i++)
                if (!done[i])
                    len += (size_t)snprintf(still + len, sizeof still - len, "%s%d",
                                            len ? ", " : "", i);
            char waited[32];
            ddp__fmt_duration(waited, sizeof waited, timeout_ms);
            st = ddp__err(err, DDP_ERR_TIMEOUT,
                          "ddp_spawn: %d of %d rank%s still running after %s (rank%s %s); they "
                          "were stopped",
                          running, nprocs, nprocs == 1 ? "" : "s", waited, running == 1 ? "" : "s",
                          still);
            signal_all(pids, done, started, SIGTERM);
            kill_at = now + grace_ms;
        }
        if (kill_at >= 0 && now >= kill_at) {
            signal_all(pids, done, started, SIGKILL);
            kill_at = -1;
        }
        if (running > 0 && !progress) {
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
            nap_ns = nap_ns < 20000000 ? nap_ns * 2 : nap_ns;
        } else {
            nap_ns = 1000000;
        }
    }
    store_stop(&sp);
    if (st != DDP_OK)
        remove_leftover_segments(run_id, pids, started);
    if (result)
        *result = res;
out_free:
    free(pids);
    free(done);
    munmap(ended_ns, sizeof(int64_t) * (size_t)nprocs);
    return st;
}
