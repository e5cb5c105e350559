/*
 * output.c — where workers' output goes.
 *
 * With several workers on one console every line gets its rank ("[rank3]: …") and is written
 * with one write(), so lines from different ranks never mix mid-line. With --log_dir (or
 * --redirects/--tee) each worker also gets DIR/RUN_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log,
 * torchrun's layout, holding its raw output (DIR/RUN_ID/node_N/attempt_K/… on several nodes,
 * which may share DIR). The last few stderr lines of each worker are kept
 * for the failure summary. A line longer than 64 KiB is forwarded in pieces.
 *
 * The console never holds ddprun up. A pipe or terminal on stdout/stderr is written through a
 * description of ddprun's own, opened non-blocking (/proc/self/fd/N: the shell's stays as it
 * was; a socket is written with send(MSG_DONTWAIT)); what it cannot take now waits in a queue
 * (one for both when they are one pipe or terminal, so lines keep their order) that the agent
 * flushes as the console reads; past 4 MiB of it the workers' pipes wait (backpressure, nothing
 * dropped). Until 2026-11-26 a reader that stopped reading (a pager left scrolled, a stuck tee)
 * blocked ddprun in write(): no signal, no worker's death was handled while it did not read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddprun.h"

#define LINE_MAX_BYTES 65536

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return; /* a closed console must not stop the job */
        p += k;
        n -= (size_t)k;
    }
}

/* ---- the console ---------------------------------------------------------------------------- */

/* Past this much output waiting, workers' pipes are not read until the console takes some (they
 * then wait in their write(), as they would writing to the console themselves): backpressure,
 * nothing dropped, and ddprun itself stays free to handle signals and deaths. */
#define CONSOLE_BACKLOG ((size_t)4 << 20)

typedef struct console {
    bool ready;
    bool nb;   /* fd is ddprun's own non-blocking description (a pipe or terminal) */
    bool sock; /* a socket: written with send(MSG_DONTWAIT), the description untouched */
    int fd;    /* where to write */
    char *q;   /* output waiting for room: q[off, len) */
    size_t off, len, cap;
} console;

static console consoles[3]; /* [STDOUT_FILENO], [STDERR_FILENO] */
static console *stderr_is;  /* &consoles[STDOUT_FILENO] when both are one pipe or terminal */

static void drain_at_exit(void)
{
    ddprun_output_drain(5000, 60000);
}

static bool same_object(int a, int b)
{
    struct stat x, y;
    if (fstat(a, &x) != 0 || fstat(b, &y) != 0 || (x.st_mode & S_IFMT) != (y.st_mode & S_IFMT))
        return false;
    if (S_ISCHR(x.st_mode))
        return x.st_rdev == y.st_rdev;
    return x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static console *console_of(int fd)
{
    if (fd == STDERR_FILENO && stderr_is)
        return stderr_is;
    console *c = &consoles[fd];
    if (c->ready)
        return c;
    /* stderr on the same pipe or terminal as stdout (2>&1): one queue, so that lines keep their
     * order (with two, one's partial write let the other's line in between) */
    if (fd == STDERR_FILENO && same_object(STDOUT_FILENO, STDERR_FILENO)) {
        console *o = console_of(STDOUT_FILENO);
        if (o->nb || o->sock) {
            stderr_is = o;
            return o;
        }
    }
    c->ready = true;
    c->fd = fd;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return c;
    if (S_ISSOCK(st.st_mode)) {
        c->sock = true;
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int nfd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
        if (nfd < 0)
            return c; /* written as before */
        c->fd = nfd, c->nb = true;
    } else {
        return c; /* a file: written as before; it does not stall for long */
    }
    static bool registered; /* every way out of ddprun writes what waits (children _exit) */
    if (!registered)
        registered = atexit(drain_at_exit) == 0;
    return c;
}

/* One write that never blocks: > 0 bytes taken, 0 no room now, −1 the console is gone. */
static ssize_t try_write(console *c, const char *p, size_t n)
{
    for (;;) {
        ssize_t k = c->sock ? send(c->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : write(c->fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return k > 0 ? k : -1;
    }
}

static void console_flush(console *c)
{
    while (c->off < c->len) {
        ssize_t k = try_write(c, c->q + c->off, c->len - c->off);
        if (k == 0)
            return;
        if (k < 0)
            break; /* gone (EPIPE, EIO): what waits is dropped, as writes to it are */
        c->off += (size_t)k;
    }
    c->off = c->len = 0;
}

/* Writes p to the console fd (STDOUT_FILENO or STDERR_FILENO) now, or queues what it cannot
 * take, after what already waits (in order). */
static void console_write(int fd, const char *p, size_t n)
{
    console *c = console_of(fd);
    if (!c->nb && !c->sock) {
        write_all(c->fd, p, n);
        return;
    }
    if (c->off < c->len)
        console_flush(c);
    if (c->off == c->len) {
        c->off = c->len = 0;
        while (n > 0) {
            ssize_t k = try_write(c, p, n);
            if (k == 0)
                break;
            if (k < 0)
                return; /* a closed console must not stop the job */
            p += k;
            n -= (size_t)k;
        }
        if (n == 0)
            return;
    }
    if (c->off > 0 && c->len + n > c->cap) { /* room at the front first */
        memmove(c->q, c->q + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? c->cap : 65536;
        while (cap < c->len + n)
            cap *= 2;
        char *q = realloc(c->q, cap);
        if (!q)
            return; /* out of memory: this piece is lost, the job goes on */
        c->q = q, c->cap = cap;
    }
    memcpy(c->q + c->len, p, n);
    c->len += n;
}

int ddprun_output_pollfds(struct pollfd *p)
{
    int n = 0;
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
        console *c = &consoles[fd];
        if (c->ready && (c->nb || c->sock) && c->off < c->len)
            p[n++] = (struct pollfd){.fd = c->fd, .events = POLLOUT};
    }
    return n;
}

void ddprun_output_flush(void)
{
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++)
        if (consoles[fd].ready && (consoles[fd].nb || consoles[fd].sock))
            console_flush(&consoles[fd]);
}

bool ddprun_output_backlogged(void)
{
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++)
        if (consoles[fd].len - consoles[fd].off > CONSOLE_BACKLOG)
            return true;
    return false;
}

void ddprun_output_forget(void)
{
    for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
        console *c = &consoles[fd];
        if (c->ready && c->nb)
            close(c->fd);
        free(c->q);
        *c = (console){0};
    }
    stderr_is = NULL;
}

void ddprun_output_drain(int quiet_ms, int total_ms)
{
    /* The job is over: a signal that ends ddprun ends this wait too (they were blocked for the
     * agent's signalfd). */
    sigset_t end;
    sigemptyset(&end);
    sigaddset(&end, SIGINT);
    sigaddset(&end, SIGTERM);
    sigaddset(&end, SIGHUP);
    sigaddset(&end, SIGQUIT);
    bool unblocked = false;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        ddprun_output_flush();
        struct pollfd p[2];
        int n = ddprun_output_pollfds(p);
        if (n == 0)
            return;
        if (!unblocked) {
            sigprocmask(SIG_UNBLOCK, &end, NULL);
            unblocked = true;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long spent = (long)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
        int ms = quiet_ms;
        if (total_ms - spent < ms)
            ms = total_ms - spent > 0 ? (int)(total_ms - spent) : 0;
        int rc;
        do
            rc = poll(p, (nfds_t)n, ms);
        while (rc < 0 && errno == EINTR);
        if (rc > 0 && ms > 0)
            continue;
        /* no room for quiet_ms, or total_ms spent: the rest is lost, and said (on stderr, when
         * that is not the console that stopped) */
        size_t lost[3] = {0, 0, 0};
        for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
            lost[fd] = consoles[fd].len - consoles[fd].off;
            consoles[fd].off = consoles[fd].len = 0;
        }
        for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) {
            if (!lost[fd])
                continue;
            char line[256];
            int m = snprintf(
                line, sizeof line, "ddprun: the console (%s) %s: %zu bytes of output were lost\n",
                fd == STDOUT_FILENO ? (stderr_is ? "stdout and stderr" : "stdout") : "stderr",
                ms > 0 ? "did not read for a while" : "was too slow to drain in time", lost[fd]);
            if (m > 0)
                console_write(STDERR_FILENO, line, (size_t)m);
        }
        for (int fd = STDOUT_FILENO; fd <= STDERR_FILENO; fd++) /* once, no waiting */
            consoles[fd].off = consoles[fd].len = 0;
        return;
    }
}

/* Writes all of p to a log file: 0, or -1 with errno (a full disk: ENOSPC). */
static int write_file(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (k == 0)
                errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

void ddprun_say(const char *fmt, ...)
{
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "ddprun: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof buf - 2)
        len = sizeof buf - 2;
    buf[len++] = '\n';
    console_write(STDERR_FILENO, buf, len);
}

/* mkdir -p */
static int make_dirs(const char *path)
{
    char buf[1400];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

int ddprun_output_run_dir(ddprun_opts *o)
{
    if (!o->want_files)
        return 0;
    /* Several nodes often share --log_dir (a network file system) and run the same local ranks:
     * each node gets a folder of its own, or they would truncate and mix each other's files. */
    char base[1100];
    int n = o->nnodes > 1
                ? snprintf(base, sizeof base, "%s/%s/node_%d", o->log_dir, o->run_id, o->node_rank)
                : snprintf(base, sizeof base, "%s/%s", o->log_dir, o->run_id);
    if (n < 0 || n >= (int)sizeof base - 64) {
        ddprun_say("--log_dir '%s' is too long", o->log_dir);
        return -1;
    }
    char *slash = strrchr(base, '/');
    *slash = '\0';
    if (make_dirs(base) != 0) {
        ddprun_say("cannot create log directory '%s': %s; check --log_dir", base, strerror(errno));
        return -1;
    }
    *slash = '/';
    /* mkdir of the last part is atomic: two ddprun started at once with the same --run_id and
     * --log_dir get folders of their own too. */
    for (int k = 1; k < 10000; k++) {
        if (k == 1)
            snprintf(o->log_run_dir, sizeof o->log_run_dir, "%s", base);
        else
            snprintf(o->log_run_dir, sizeof o->log_run_dir, "%s-%d", base, k);
        if (mkdir(o->log_run_dir, 0755) == 0) {
            if (k > 1)
                ddprun_say("'%s' holds an earlier run's logs; this run's go to '%s'", base,
                           o->log_run_dir);
            return 0;
        }
        if (errno != EEXIST) {
            ddprun_say("cannot create log directory '%s': %s; check --log_dir", o->log_run_dir,
                       strerror(errno));
            return -1;
        }
    }
    ddprun_say("'%s' and 9998 folders beside it exist already; give --log_dir another folder",
               base);
    return -1;
}

int ddprun_template_name(const char *p, size_t *len)
{
    static const char *const names[] = {"role_name", "rank", "local_rank"};
    bool braced = p[1] == '{';
    const char *id = p + 1 + braced, *e = id;
    while (*e == '_' || (*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z') ||
           (e > id && *e >= '0' && *e <= '9'))
        e++;
    if (e == id || (braced && *e != '}'))
        return 0;
    for (int i = 0; i < 3; i++)
        if ((size_t)(e - id) == strlen(names[i]) && !strncmp(id, names[i], strlen(names[i]))) {
            *len = (size_t)(e - p) + braced;
            return i + 1;
        }
    return 0;
}

/* The console prefix of w: "[rankN]: ", or --log_line_prefix_template expanded. */
static void make_prefix(const ddprun_opts *o, ddprun_worker *w)
{
    if (!o->prefix_template[0]) {
        snprintf(w->prefix, sizeof w->prefix, "[rank%d]: ", w->rank);
        return;
    }
    size_t n = 0, cap = sizeof w->prefix;
    for (const char *p = o->prefix_template; *p && n + 1 < cap;) {
        char num[16];
        const char *put = NULL;
        size_t skip = 1;
        int which = 0;
        if (p[0] == '$' && p[1] == '$') {
            put = "$";
            skip = 2;
        } else if (p[0] == '$' && (which = ddprun_template_name(p, &skip)) != 0) {
            snprintf(num, sizeof num, "%d", which == 2 ? w->rank : w->local_rank);
            put = which == 1 ? o->role : num;
        }
        if (put) {
            size_t k = strlen(put);
            if (k > cap - 1 - n)
                k = cap - 1 - n;
            memcpy(w->prefix + n, put, k);
            n += k;
        } else {
            w->prefix[n++] = *p;
        }
        p += skip;
    }
    w->prefix[n] = '\0';
}

int ddprun_output_open(const ddprun_opts *o, int attempt, ddprun_worker *w)
{
    int lr = w->local_rank;
    make_prefix(o, w);
    w->out.which = STD_OUT;
    w->err.which = STD_ERR;
    w->out.file_fd = w->err.file_fd = -1;
    w->out.console = !(o->redirects[lr] & STD_OUT) || (o->tee[lr] & STD_OUT);
    w->err.console = !(o->redirects[lr] & STD_ERR) || (o->tee[lr] & STD_ERR);
    if (o->ranks_filter && !o->shown[lr]) /* the files and the failure summary keep its lines */
        w->out.console = w->err.console = false;
    w->log_path[0] = '\0';
    if (!o->want_files)
        return 0;
    char dir[1400];
    if (snprintf(dir, sizeof dir, "%s/attempt_%d/%d", o->log_run_dir, attempt, lr) >=
        (int)sizeof dir - 16) {
        ddprun_say("--log_dir '%s' is too long", o->log_dir);
        return -1;
    }
    if (make_dirs(dir) != 0) {
        ddprun_say("cannot create log directory '%s': %s; check --log_dir", dir, strerror(errno));
        return -1;
    }
    char path[1500];
    ddprun_stream *s[2] = {&w->out, &w->err};
    const char *names[2] = {"stdout.log", "stderr.log"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        s[i]->file_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
        if (s[i]->file_fd < 0) {
            ddprun_say("cannot create log file '%s': %s", path, strerror(errno));
            return -1;
        }
    }
    if (snprintf(w->log_path, sizeof w->log_path, "%s/stderr.log", dir) >= (int)sizeof w->log_path)
        w->log_path[0] = '\0';
    return 0;
}

static void remember_line(ddprun_stream *s, const char *p, size_t n)
{
    if (s->which != STD_ERR)
        return;
    size_t m = n < sizeof s->tail[0] - 1 ? n : sizeof s->tail[0] - 1;
    memcpy(s->tail[s->tail_next], p, m);
    s->tail[s->tail_next][m] = '\0';
    s->tail_next = (s->tail_next + 1) % 5;
    if (s->tail_n < 5)
        s->tail_n++;
}

/* Forwards one line (without its newline) to the console, with the rank prefix unless its
 * beginning went out already (s->mid_line); newline false: a partial line (an interactive
 * worker's prompt), whose rest follows without a prefix. */
static void emit_piece(const ddprun_opts *o, const ddprun_worker *w, ddprun_stream *s,
                       const char *p, size_t n, bool newline)
{
    if (newline)
        remember_line(s, p, n);
    if (!s->console)
        return;
    int fd = s->which == STD_OUT ? STDOUT_FILENO : STDERR_FILENO;
    int pn = o->prefix && !s->mid_line ? (int)strlen(w->prefix) : 0;
    s->mid_line = !newline;
    char *buf = malloc((size_t)pn + n + 1);
    if (!buf)
        return;
    memcpy(buf, w->prefix, (size_t)pn);
    memcpy(buf + pn, p, n);
    buf[(size_t)pn + n] = '\n';
    console_write(fd, buf, (size_t)pn + n + (newline ? 1 : 0));
    free(buf);
}

static void emit_line(const ddprun_opts *o, const ddprun_worker *w, ddprun_stream *s, const char *p,
                      size_t n)
{
    emit_piece(o, w, s, p, n, true);
}

bool ddprun_output_pump(const ddprun_opts *o, ddprun_worker *w, ddprun_stream *s)
{
    char chunk[16384];
    ssize_t k;
    do
        k = read(s->fd, chunk, sizeof chunk);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return true;
    if (k <= 0)
        return false;
    if (s->file_fd >= 0 && write_file(s->file_fd, chunk, (size_t)k) != 0) {
        /* A full disk must not lose the output silently (under --redirects the log is its only
         * copy): say so once and send the rest to the console, unless --local_ranks_filter hides
         * this rank there. */
        int e = errno;
        const char *name = s->which == STD_OUT ? "stdout.log" : "stderr.log";
        int dir_len = (int)(strrchr(w->log_path, '/') ? strrchr(w->log_path, '/') - w->log_path
                                                      : (ptrdiff_t)strlen(w->log_path));
        bool hidden = o->ranks_filter && !o->shown[w->local_rank];
        ddprun_say("cannot write rank %d's log '%.*s/%s': %s; %s", w->rank, dir_len, w->log_path,
                   name, strerror(e),
                   hidden       ? "the rest of it is lost (--local_ranks_filter hides this rank)"
                   : s->console ? "the rest of it goes to the console only"
                                : "the rest of it goes to the console instead");
        close(s->file_fd);
        s->file_fd = -1;
        if (!hidden)
            s->console = true;
    }
    const char *p = chunk;
    size_t left = (size_t)k;
    while (left > 0) {
        const char *nl = memchr(p, '\n', left);
        size_t take = nl ? (size_t)(nl - p) : left;
        if (s->line_len + take > s->line_cap) {
            size_t cap = s->line_cap ? s->line_cap : 256;
            while (cap < s->line_len + take)
                cap *= 2;
            char *q = realloc(s->line, cap);
            if (!q)
                return true; /* drop this piece of console output, keep the job */
            s->line = q;
            s->line_cap = cap;
        }
        memcpy(s->line + s->line_len, p, take);
        s->line_len += take;
        if (nl || s->line_len >= LINE_MAX_BYTES) {
            emit_line(o, w, s, s->line, s->line_len);
            s->line_len = 0;
        }
        p += take + (nl ? 1 : 0);
        left -= take + (nl ? 1 : 0);
    }
    /* A prompt ("(Pdb) ", input("name? ")) waits for its answer, not for a newline. */
    if (o->interactive && s->line_len) {
        emit_piece(o, w, s, s->line, s->line_len, false);
        s->line_len = 0;
    }
    return true;
}

void ddprun_output_close(const ddprun_opts *o, ddprun_worker *w, ddprun_stream *s)
{
    if (s->line_len) {
        emit_line(o, w, s, s->line, s->line_len);
        s->line_len = 0;
    }
    if (s->fd >= 0)
        close(s->fd);
    if (s->file_fd >= 0)
        close(s->file_fd);
    s->fd = s->file_fd = -1;
    free(s->line);
    s->line = NULL;
    s->line_cap = 0;
}
