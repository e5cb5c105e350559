/*
 * errfile.c — error files in torchelastic's JSON format (ddp/errfile.h), built and parsed with
 * jansson, and a writer for a signal handler by hand (no jansson, which allocates). The writers
 * are used on a process's way out, so they never exit and leave no temporary file behind; the
 * reader is used by a launcher on files its workers wrote, so it trusts nothing: not the file's
 * type (a FIFO would block an open for reading), size, encoding or shape. None reads the
 * environment: the caller passes TORCHELASTIC_ERROR_FILE's value.
 */
#define _GNU_SOURCE
#include "ddp/errfile.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A JSON string of s: jansson takes UTF-8 only, and a message may hold any bytes (a file name):
 * those that are not UTF-8 become '?'. NULL when out of memory. */
static json_t *text(const char *s)
{
    json_t *j = json_string(s);
    if (j)
        return j;
    char *copy = strdup(s);
    if (!copy)
        return NULL;
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    j = json_string(copy);
    free(copy);
    return j;
}

static int write_all(int fd, const char *p, size_t n)
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

ddp_status ddp_errfile_write(const char *path, const ddp_errfile *e, ddp_error *err)
{
    if (!path || !*path || !e)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_errfile_write: no path or no error given");
    long long ts = e->timestamp ? e->timestamp : (long long)time(NULL);
    char stamp[32];
    snprintf(stamp, sizeof stamp, "%lld", ts); /* torch writes it as a string */
    json_t *extra = json_object(), *msg = json_object(), *root = json_object();
    bool ok = extra && msg && root;
    ok = ok && json_object_set_new(extra, "timestamp", json_string(stamp)) == 0;
    if (ok && e->traceback[0])
        ok = json_object_set_new(extra, "py_callstack", text(e->traceback)) == 0;
    ok = ok && json_object_set_new(msg, "message", text(e->message)) == 0;
    ok = ok && json_object_set(msg, "extraInfo", extra) == 0;
    if (ok && e->error_code)
        ok = json_object_set_new(msg, "errorCode", json_integer(e->error_code)) == 0;
    ok = ok && json_object_set(root, "message", msg) == 0;
    char *doc = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(extra);
    json_decref(msg);
    json_decref(root);
    if (!doc)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory writing the error file '%s'", path);

    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
        free(doc);
        return ddp__err(err, DDP_ERR_INVALID, "error file path '%.200s…' is too long", path);
    }
    ddp_status st = DDP_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot create the error file '%s': %s (errno %d)", tmp,
                      strerror(errno), errno);
        goto out_free;
    }
    if (write_all(fd, doc, strlen(doc)) != 0 || write_all(fd, "\n", 1) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot write the error file '%s': %s (errno %d)", tmp,
                      strerror(errno), errno);
        close(fd);
        goto out_unlink;
    }
    if (close(fd) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot write the error file '%s': %s (errno %d)", tmp,
                      strerror(errno), errno);
        goto out_unlink;
    }
    if (rename(tmp, path) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "cannot rename '%s' to the error file '%s': %s (errno %d)", tmp, path,
                      strerror(errno), errno);
        goto out_unlink;
    }
    goto out_free;

out_unlink:
    unlink(tmp);
out_free:
    free(doc);
    return st;
}

/* ---- the writer for a signal handler: a buffer on the stack, write(2), nothing else ---- */

typedef struct sig_out {
    int fd;
    int err; /* the first write's errno; 0 while all is well (then nothing more is written) */
    size_t n;
    char buf[512];
} sig_out;

static void sig_flush(sig_out *o)
{
    if (!o->err && o->n && write_all(o->fd, o->buf, o->n) != 0)
        o->err = errno ? errno : EIO;
    o->n = 0;
}

static void sig_put(sig_out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (o->n == sizeof o->buf)
            sig_flush(o);
        o->buf[o->n++] = s[i];
    }
}

static void sig_puts(sig_out *o, const char *s)
{
    sig_put(o, s, strlen(s));
}

/* The length of the valid UTF-8 character at p (1 to 4 bytes), 0 when none starts there (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short by the end). */
static size_t utf8_len(const unsigned char *p)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    size_t n;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (p[1] < lo || p[1] > hi) /* the NUL at the end fails here too: nothing read past it */
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* s as a JSON string: quoted, escaped, what is not UTF-8 as '?'. */
static void sig_put_json(sig_out *o, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    sig_put(o, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t len = utf8_len(p);
        unsigned char c = *p;
        if (len == 0) {
            sig_put(o, "?", 1);
            len = 1;
        } else if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sig_put(o, e, 2);
        } else if (c == '\n') {
            sig_put(o, "\\n", 2);
        } else if (c == '\t') {
            sig_put(o, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            sig_put(o, e, 6);
        } else {
            sig_put(o, (const char *)p, len);
        }
        p += len;
    }
    sig_put(o, "\"", 1);
}

/* v in decimal, into buf (24 bytes at least); returns buf. */
static char *sig_num(char *buf, unsigned long long v)
{
    char d[24];
    int k = 0, n = 0;
    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k > 0)
        buf[n++] = d[--k];
    buf[n] = '\0';
    return buf;
}

ddp_status ddp_errfile_write_from_signal(const char *path, const char *message,
                                         const char *traceback)
{
    char tmp[4100], num[24];
    size_t pl = path ? strlen(path) : 0;
    if (pl == 0 || pl > 4000 || !message)
        return DDP_ERR_INVALID;
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp.", 5);
    sig_num(num, (unsigned long long)getpid());
    memcpy(tmp + pl + 5, num, strlen(num) + 1);
    struct timespec now = {0, 0};
    (void)clock_gettime(CLOCK_REALTIME, &now); /* failing: timestamp 0, "unknown" to a reader */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return DDP_ERR_SYSTEM;
    sig_out o = {.fd = fd};
    /* the form ddp_errfile_write writes (keys in another order: JSON does not mind) */
    sig_puts(&o, "{\"message\":{\"message\":");
    sig_put_json(&o, message);
    sig_puts(&o, ",\"extraInfo\":{");
    if (traceback && *traceback) {
        sig_puts(&o, "\"py_callstack\":");
        sig_put_json(&o, traceback);
        sig_puts(&o, ",");
    }
    sig_puts(&o, "\"timestamp\":\"");
    sig_puts(&o, sig_num(num, now.tv_sec > 0 ? (unsigned long long)now.tv_sec : 0));
    sig_puts(&o, "\"}}}\n");
    sig_flush(&o);
    int e = o.err;
    if (close(fd) != 0 && !e && errno != EINTR)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        errno = e;
        return DDP_ERR_SYSTEM;
    }
    return DDP_OK;
}

/* torch writes the timestamp as a string of seconds; an integer is taken too. 0 when neither. */
static long long stamp_of(const json_t *j)
{
    if (json_is_integer(j))
        return (long long)json_integer_value(j);
    if (json_is_real(j))
        return (long long)json_real_value(j);
    if (json_is_string(j)) {
        char *end;
        errno = 0;
        long long v = strtoll(json_string_value(j), &end, 10);
        return errno == 0 && end != json_string_value(j) ? v : 0;
    }
    return 0;
}

static void copy_str(char *dst, size_t cap, const json_t *j)
{
    snprintf(dst, cap, "%s", json_is_string(j) ? json_string_value(j) : "");
}

ddp_status ddp_errfile_read(const char *path, ddp_errfile *out, ddp_error *err)
{
    if (!path || !*path || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_errfile_read: no path given");
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return ddp__err(err, DDP_ERR_NOT_FOUND, "no error file '%s'", path);
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot open '%s': %s (errno %d)", path, strerror(e),
                        e);
    }
    ddp_status st = DDP_OK;
    char *buf = NULL;
    json_t *root = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "cannot stat '%s': %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ddp__err(err, DDP_ERR_PROTOCOL, "'%s' is not a regular file", path);
        goto out_close;
    }
    if (sb.st_size > DDP_ERRFILE_MAX_BYTES) {
        st = ddp__err(err, DDP_ERR_TOO_LARGE,
                      "'%s' holds %lld bytes, more than the %d read of an "
                      "error file",
                      path, (long long)sb.st_size, DDP_ERRFILE_MAX_BYTES);
        goto out_close;
    }
    /* Read to the limit whatever the size said: the file may still grow (a writer that does not
     * rename), and the limit holds all the same. */
    buf = malloc(DDP_ERRFILE_MAX_BYTES + 1);
    if (!buf) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory reading '%s'", path);
        goto out_close;
    }
    size_t n = 0;
    while (n <= DDP_ERRFILE_MAX_BYTES) {
        ssize_t k = read(fd, buf + n, DDP_ERRFILE_MAX_BYTES + 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot read '%s': %s (errno %d)", path,
                          strerror(errno), errno);
            goto out_close;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    if (n > DDP_ERRFILE_MAX_BYTES) {
        st = ddp__err(err, DDP_ERR_TOO_LARGE, "'%s' grew past the %d bytes read of an error file",
                      path, DDP_ERRFILE_MAX_BYTES);
        goto out_close;
    }
    if (n == 0) {
        st = ddp__err(err, DDP_ERR_PROTOCOL, "'%s' is empty", path);
        goto out_close;
    }
    json_error_t je;
    root = json_loadb(buf, n, 0, &je);
    if (!root) {
        st = ddp__err(err, DDP_ERR_PROTOCOL, "'%s' is not JSON: %s (line %d, column %d)", path,
                      je.text, je.line, je.column);
        goto out_close;
    }
    ddp_errfile e;
    memset(&e, 0, sizeof e);
    json_t *m = json_is_object(root) ? json_object_get(root, "message") : NULL;
    if (json_is_string(m)) { /* PyTorch's newer form: {"message": "…", "timestamp": N} */
        copy_str(e.message, sizeof e.message, m);
        e.timestamp = stamp_of(json_object_get(root, "timestamp"));
    } else if (json_is_object(m) && json_is_string(json_object_get(m, "message"))) {
        copy_str(e.message, sizeof e.message, json_object_get(m, "message"));
        json_t *extra = json_object_get(m, "extraInfo");
        if (json_is_object(extra)) {
            copy_str(e.traceback, sizeof e.traceback, json_object_get(extra, "py_callstack"));
            e.timestamp = stamp_of(json_object_get(extra, "timestamp"));
        }
        json_t *code = json_object_get(m, "errorCode");
        if (json_is_integer(code))
            e.error_code = (int)json_integer_value(code);
    } else {
        st = ddp__err(err, DDP_ERR_PROTOCOL,
                      "'%s' is JSON but not an error file: it has no \"message\" string or "
                      "{\"message\": …} object",
                      path);
        goto out_close;
    }
    *out = e;

out_close:
    json_decref(root);
    free(buf);
    close(fd);
    return st;
}
