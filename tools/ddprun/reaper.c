/*
 * reaper.c — the watchdog that makes "no orphans, ever" hold when ddprun itself is SIGKILLed.
 *
 * PR_SET_PDEATHSIG kills each worker when ddprun dies, but not what the worker started. So at
 * start ddprun forks this small process, which ignores the terminal's signals and holds the read
 * end of a pipe. ddprun reports each worker's process group ("+pgid") and its end ("-pgid"). If
 * the pipe closes without the final "x" (ddprun died), the watchdog SIGKILLs every group still
 * listed, then exits. It is forked before any thread or socket exists, so it holds nothing else.
 * It also removes the shared-memory segments those workers left (/dev/shm/ddp-<run_id>-<pid>-…):
 * a shm group's segment has a name only while the group is being set up, but a ddprun SIGKILLed
 * then killed the workers before they could unlink it, and nobody else would (ddprun itself does
 * this after a worker's crash, in agent.c), and ddprun's private folder of the workers' error
 * files (errors.c), which ddprun removes itself when it ends.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "ddprun.h"

#define MAX_GROUPS 4096

void ddprun_segment_prefix(const char *run_id, pid_t pid, char *buf, size_t cap)
{
    snprintf(buf, cap, "ddp-%.40s-%d-", run_id, (int)pid);
    for (char *c = buf; *c; c++) /* as the shm backend names it: a '/' in the run id is '_' */
        if (*c == '/')
            *c = '_';
}

/* Whether process pid still runs: neither gone nor a zombie. (A killed worker stays a zombie
 * until its new parent reaps it, which an init that reaps nothing never does, so kill(pid, 0)
 * cannot tell.) */
static bool still_runs(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t k = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (k <= 0)
        return false;
    buf[k] = '\0';
    const char *paren = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

/* Removes /dev/shm/ddp-<run_id>-<pgid>-… of the groups that were killed (a worker's pid is its
 * process group id, and the worker names the segments). Waits up to 1 s for the workers to be
 * gone first, so that one inside shm_open when it was killed has finished creating its segment. */
static void remove_segments(const char *run_id, const pid_t *groups, int n)
{
    if (!run_id[0] || n == 0)
        return;
    for (int tries = 0; tries < 100; tries++) {
        bool alive = false;
        for (int j = 0; j < n && !alive; j++)
            alive = still_runs(groups[j]);
        if (!alive)
            break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        for (int j = 0; j < n; j++) {
            char prefix[160];
            ddprun_segment_prefix(run_id, groups[j], prefix, sizeof prefix);
            if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            (void)unlink(path);
            break;
        }
    }
    closedir(d);
}

/* Removes ddprun's private folder of error files and the files in it (ddprun made it with
 * mkdtemp and puts only files there). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[1400];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0 && errno == EISDIR)
                (void)rmdir(path);
        }
    closedir(d);
    (void)rmdir(dir);
}

static void watch(int fd)
{
    pid_t groups[MAX_GROUPS];
    int n = 0;
    char buf[4096], line[1300], run_id[160] = "", dir[1200] = "";
    size_t ll = 0;
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break; /* ddprun is gone */
        for (ssize_t i = 0; i < k; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1)
                    line[ll++] = buf[i];
                continue;
            }
            line[ll] = '\0';
            ll = 0;
            if (line[0] == 'x')
                _exit(0);         /* normal end: ddprun has stopped its workers itself */
            if (line[0] == 'r') { /* the run id, for the segments' names */
                snprintf(run_id, sizeof run_id, "%.150s", line + 1);
                continue;
            }
            if (line[0] == 'd') { /* the error files' folder, "" once ddprun removed it */
                snprintf(dir, sizeof dir, "%.1190s", line + 1);
                continue;
            }
            pid_t pg = (pid_t)atol(line + 1);
            if (pg <= 0)
                continue;
            if (line[0] == '+' && n < MAX_GROUPS) {
                groups[n++] = pg;
            } else if (line[0] == '-') {
                for (int j = 0; j < n; j++)
                    if (groups[j] == pg) {
                        groups[j] = groups[--n];
                        break;
                    }
            }
        }
    }
    for (int j = 0; j < n; j++)
        kill(-groups[j], SIGKILL);
    remove_segments(run_id, groups, n); /* waits for the workers to be gone */
    if (dir[0])
        remove_dir(dir);
    _exit(0);
}

static pid_t reaper_pid;

pid_t ddprun_reaper_pid(void)
{
    return reaper_pid;
}

int ddprun_reaper_start(int argc, char **argv)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        ddprun_say("cannot create the reaper pipe: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        ddprun_say("cannot fork the reaper: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        close(p[1]);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        signal(SIGQUIT, SIG_IGN);
        /* ddprun passes these on and goes on; sent to its process group (kill -USR1 %job, a
         * batch system signalling every process), they must not end the reaper either */
        signal(SIGUSR1, SIG_IGN);
        signal(SIGUSR2, SIG_IGN);
        /* A name without "ddprun", in its command line too (a fork keeps ddprun's): `pkill -9
         * ddprun` or `pkill -9 -f ddprun`, the usual way to end a stuck launcher, must not kill
         * the watchdog with it, or what the workers started would outlive them (until
         * 2026-11-25 it was "ddprun-reaper", which both matched). */
        prctl(PR_SET_NAME, "ddp-reaper");
        /* The strings lie end to end where the kernel put them; overwrite them only if they
         * still do (the span is the sum of their lengths), i.e. none was replaced. */
        char *lo = NULL, *hi = NULL;
        size_t sum = 0;
        for (int i = 0; i < argc && argv[i]; i++) {
            size_t len = strlen(argv[i]) + 1;
            if (!lo || argv[i] < lo)
                lo = argv[i];
            if (!hi || argv[i] + len > hi)
                hi = argv[i] + len;
            sum += len;
        }
        if (lo && (size_t)(hi - lo) == sum && sum > sizeof "ddp-reaper") {
            memset(lo, 0, sum);
            memcpy(lo, "ddp-reaper", sizeof "ddp-reaper");
        }
        /* Keep no terminal streams: a reaper holding the console pipe would keep a test's or a
         * user's `ddprun … | tee` waiting for EOF — ddprun's own descriptions of it included
         * (output.c opens them for its first line, which may come before this fork). */
        ddprun_output_forget();
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, STDIN_FILENO);
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDERR_FILENO);
            if (devnull > 2)
                close(devnull);
        }
        watch(p[0]);
    }
    reaper_pid = pid;
    close(p[0]);
    return p[1];
}

static void send_line(int fd, char c, pid_t pg)
{
    char line[32];
    int n = snprintf(line, sizeof line, "%c%ld\n", c, (long)pg);
    ssize_t k;
    do
        k = write(fd, line, (size_t)n);
    while (k < 0 && errno == EINTR);
}

void ddprun_reaper_track(int fd, pid_t pgid, const char *run_id)
{
    char line[200];
    int n = snprintf(line, sizeof line, "r%.150s\n", run_id);
    ssize_t k;
    do
        k = write(fd, line, (size_t)n);
    while (k < 0 && errno == EINTR);
    send_line(fd, '+', pgid);
}

void ddprun_reaper_dir(int fd, const char *dir)
{
    if (fd < 0)
        return;
    char line[1300];
    int n = snprintf(line, sizeof line, "d%.1200s\n", dir);
    ssize_t k;
    do
        k = write(fd, line, (size_t)n);
    while (k < 0 && errno == EINTR);
}

void ddprun_reaper_untrack(int fd, pid_t pgid)
{
    send_line(fd, '-', pgid);
}

void ddprun_reaper_finish(int fd)
{
    if (fd < 0)
        return;
    send_line(fd, 'x', 0);
    close(fd);
}
