/*
 * errfile.c — error files in torchelastic's JSON format (ddp/errfile.h), built and parsed with
 * jansson. The writer is used on a process's way out, so it never exits and leaves no temporary
 * file behind; the reader is used by a launcher on files its workers wrote, so it trusts nothing:
 * not the file's type (a FIFO would block an open for reading), size, encoding or shape. Neither
 * reads the environment: the caller passes TORCHELASTIC_ERROR_FILE's value.
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
