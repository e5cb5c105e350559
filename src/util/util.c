/*
 * util.c — status names, message formatting, time, integer parsing, random tokens, the cores
 * this process may use, and the fsync of a renamed file's folder. Nothing here keeps state
 * between calls or reads the environment.
 */
#define _GNU_SOURCE
#include "util/util.h"
#include "ddp/world.h" /* ddp_own_cores */

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

const char *ddp_status_str(ddp_status s)
{
    switch (s) {
    case DDP_OK: return "ok";
    case DDP_ERR_INVALID: return "invalid argument";
    case DDP_ERR_NOMEM: return "out of memory";
    case DDP_ERR_SYSTEM: return "system call failed";
    case DDP_ERR_TIMEOUT: return "timeout";
    case DDP_ERR_NETWORK: return "network error";
    case DDP_ERR_AUTH: return "authentication refused";
    case DDP_ERR_PROTOCOL: return "protocol error";
    case DDP_ERR_ADDR_IN_USE: return "address in use";
    case DDP_ERR_NOT_FOUND: return "not found";
    case DDP_ERR_TOO_LARGE: return "too large";
    case DDP_ERR_CLOSED: return "closed";
    }
    return "unknown status";
}

void ddp__vfmt(char *buf, size_t cap, const char *fmt, va_list ap)
{
    if (cap == 0)
        return;
    int n = vsnprintf(buf, cap, fmt, ap);
    if (n < 0)
        buf[0] = '\0';
}

void ddp__fmt(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(buf, cap, fmt, ap);
    va_end(ap);
}

ddp_status ddp_error_set(ddp_error *err, ddp_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        ddp__vfmt(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

ddp_status ddp__errmsg(char msg[static DDP_ERRMSG_MAX], ddp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(msg, DDP_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    return st;
}

int64_t ddp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ddp__now_ms(void)
{
    return ddp__now_ns() / 1000000;
}

int ddp__ms_left(int64_t deadline_ms)
{
    int64_t left = deadline_ms - ddp__now_ms();
    if (left < 0)
        return 0;
    if (left > INT32_MAX)
        return INT32_MAX;
    return (int)left;
}

bool ddp__parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

ddp_status ddp__random_bytes(void *buf, size_t n, ddp_error *err)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return ddp__err(err, DDP_ERR_SYSTEM, "getrandom failed: %s", strerror(errno));
        }
        p += got;
        n -= (size_t)got;
    }
    return DDP_OK;
}

ddp_status ddp__random_hex(char *out, size_t n, ddp_error *err)
{
    unsigned char raw[64];
    if (n > sizeof raw)
        return ddp__err(err, DDP_ERR_INVALID, "random token of %zu bytes is too long", n);
    ddp_status st = ddp__random_bytes(raw, n, err);
    if (st != DDP_OK)
        return st;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[2 * n] = '\0';
    return DDP_OK;
}

void ddp__fmt_duration(char *buf, size_t cap, int64_t ms)
{
    if (ms < 1000)
        ddp__fmt(buf, cap, "%lld ms", (long long)ms);
    else if (ms < 120000)
        ddp__fmt(buf, cap, "%.3g s", (double)ms / 1000.0);
    else if (ms / 1000 % 60 == 0)
        ddp__fmt(buf, cap, "%lld min", (long long)(ms / 60000));
    else
        ddp__fmt(buf, cap, "%lld min %lld s", (long long)(ms / 60000), (long long)(ms / 1000 % 60));
}

ddp_status ddp__fsync_parent(const char *path, const char *what, ddp_error *err)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash)
        dir = strdup(".");
    else if (slash == path)
        dir = strdup("/");
    else
        dir = strndup(path, (size_t)(slash - path));
    if (!dir)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory saving %s '%s'", what, path);
    ddp_status st = DDP_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "%s '%s' was renamed into place but its directory '%s' cannot be opened to "
                      "fsync it: %s; it may not survive a crash",
                      what, path, dir, strerror(errno));
        goto out_free;
    }
    if (fsync(fd) != 0 && errno != EINVAL)
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "%s '%s' was renamed into place but fsync of directory '%s' failed: %s; it "
                      "may not survive a crash",
                      what, path, dir, strerror(errno));
    close(fd);
out_free:
    free(dir);
    return st;
}

int ddp_own_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
