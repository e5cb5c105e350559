/*
 * busfault.c — a data file or checkpoint that shrinks while the rank reads it: one line naming
 * the file, then the rank dies of SIGBUS as before.
 *
 * The library reads training data and checkpoints through mmap. A user who re-runs a
 * preparation script into the same path truncates the file under the running job, and the first
 * read past its new end raises SIGBUS: the rank died with no word, and ddprun's summary said
 * only "signal 7 (SIGBUS)". The handler here asks the library which of its mappings the faulting
 * address lies in (ddp_data_mapping_at, async-signal-safe) and writes one line saying which file
 * shrank and what to do; then it re-raises the signal under the default action, so that the
 * rank still dies of SIGBUS (exit status 135 in a shell, ddprun's summary and exit code as
 * before). A fault elsewhere (not in a mapped file) is left as it was: no line, the same death.
 *
 * Only async-signal-safe calls in the handler: stat(2), write(2), raise(3) and
 * ddp_errfile_write_from_signal (open, write, close, rename); the line is put together by hand in
 * a buffer on the stack (no printf). The line goes to descriptor 2 directly, so errfile.c's copy
 * of stderr does not see it (nor would main() live to write it): the handler writes the
 * launcher's error file itself (TORCHELASTIC_ERROR_FILE, read when the handler is set), the line
 * as its message and its HINT as the traceback's second line, so that ddprun's summary names the
 * file (until 2026-11-27 it said "signal 7 (SIGBUS)" and showed no error).
 * SA_RESETHAND: the handler runs once; a second thread faulting at the same moment (two loader
 * workers reading the same shrunk file) meets the default action and may end the rank before
 * the line is out — the death is the same, only the line is lost.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddptrain.h"

static atomic_int bus_rank = -1; /* the rank, once the world is read; -1: not yet */
/* TORCHELASTIC_ERROR_FILE, read when the handler is set (getenv is not async-signal-safe); "":
 * none, or too long for the signal-safe writer */
static char bus_errfile[4001];

/* Appends s (up to its NUL) to buf at *n, never past cap - 1. */
static void put_str(char *buf, size_t cap, size_t *n, const char *s)
{
    while (*s && *n + 1 < cap)
        buf[(*n)++] = *s++;
}

/* Appends v in decimal. */
static void put_num(char *buf, size_t cap, size_t *n, unsigned long long v)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k > 0 && *n + 1 < cap)
        buf[(*n)++] = d[--k];
}

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    int saved = errno;
    ddp_mapping_info m;
    /* si_code > 0: raised by the kernel for a fault (si_addr is the address); a kill -BUS has
     * none (si_addr overlaps the sender's pid there) */
    if (si && si->si_code > 0 && ddp_data_mapping_at(si->si_addr, &m)) {
        /* A read past a shrunk file's end, or a page the kernel could not read (a failing disk,
         * a network file system gone away): the file's size now tells which (stat(2) is
         * async-signal-safe). */
        struct stat st;
        bool shrank = stat(m.path, &st) != 0 || (uint64_t)st.st_size <= (uint64_t)m.offset;
        bool ck = m.kind == DDP_MAPPING_CHECKPOINT;
        /* The line on stderr is "<what>; HINT: <hint>"; the error file gets <what> as its message
         * and "<what>\nddptrain: HINT: <hint>" as its traceback (errfile.c's form). */
        char line[4096 + 512]; /* the path (the library keeps at most 4095 bytes), the words */
        size_t n = 0, cap = sizeof line - 1; /* room kept for the line's end */
        int rank = atomic_load(&bus_rank);
        put_str(line, cap, &n, "ddptrain: ");
        if (rank >= 0) {
            put_str(line, cap, &n, "rank ");
            put_num(line, cap, &n, (unsigned long long)rank);
            put_str(line, cap, &n, ": ");
        }
        put_str(line, cap, &n, ck ? "the checkpoint file '" : "the data file '");
        put_str(line, cap, &n, m.path);
        size_t what_end, hint_at;
        if (shrank) {
            put_str(line, cap, &n, "' shrank while this job read it (a bus error at byte ");
            put_num(line, cap, &n, (unsigned long long)m.offset);
            put_str(line, cap, &n, " of its mapping)");
            what_end = n;
            put_str(line, cap, &n, "; HINT: ");
            hint_at = n;
            put_str(line, cap, &n, "write a new ");
            put_str(line, cap, &n, ck ? "checkpoint" : "data file");
            put_str(line, cap, &n, " under another name and rename it over the old one (");
            put_str(line, cap, &n, ck ? "ddptrain's saves do" : "ddpprep does");
            put_str(line, cap, &n, "), or stop the job before rewriting it");
        } else {
            put_str(line, cap, &n, "' could not be read at byte ");
            put_num(line, cap, &n, (unsigned long long)m.offset);
            put_str(line, cap, &n,
                    " (a bus error, the file as long as before: an I/O error, a "
                    "failing disk or a network file system gone away?)");
            what_end = n;
            put_str(line, cap, &n, "; HINT: ");
            hint_at = n;
            put_str(line, cap, &n, "check the kernel's log (dmesg) and the file system");
        }
        line[n] = '\n';
        for (size_t off = 0; off < n + 1;) { /* a short write or EINTR: the rest */
            ssize_t w = write(STDERR_FILENO, line + off, n + 1 - off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        /* Then the launcher's error file, so that ddprun's summary names the file too, not only
         * "signal 7 (SIGBUS)": by hand, from the stack, as the line was. */
        if (bus_errfile[0]) {
            char what[sizeof line], block[sizeof line + 32];
            size_t b = 0;
            memcpy(what, line, what_end);
            what[what_end] = '\0';
            put_str(block, sizeof block, &b, what);
            if (hint_at < n) {
                put_str(block, sizeof block, &b, "\nddptrain: HINT: ");
                memcpy(block + b, line + hint_at, n - hint_at); /* fits: 32 bytes kept for it */
                b += n - hint_at;
            }
            block[b] = '\0';
            (void)ddp_errfile_write_from_signal(bus_errfile, what, block);
        }
    }
    /* The action is the default again (SA_RESETHAND): the signal, pending while this handler
     * runs, ends the rank as soon as it returns — before the faulting read runs again. */
    raise(sig);
    errno = saved;
}

void trainer_catch_bus_errors(void)
{
    struct sigaction sa, old;
    if (sigaction(SIGBUS, NULL, &old) != 0 || old.sa_handler == SIG_IGN)
        return; /* left as started (an ignored SIGBUS from a fault is fatal anyway) */
    const char *ef = getenv("TORCHELASTIC_ERROR_FILE");
    size_t len = ef ? strlen(ef) : 0;
    if (len < sizeof bus_errfile)
        memcpy(bus_errfile, ef ? ef : "", len + 1);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    (void)sigaction(SIGBUS, &sa, NULL); /* failing, the rank dies as before: no line */
}

void trainer_bus_errors_rank(int rank)
{
    atomic_store(&bus_rank, rank);
}
