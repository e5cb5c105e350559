/*
 * tb.c — TensorBoard event files (ddp/tb.h): TFRecord framing with masked CRC-32C around
 * tensorflow.Event messages encoded by hand.
 *
 * Event, Summary, Summary.Value and SessionLog need seven fields between them, so they are
 * written directly as protobuf wire format (tags, varints, little-endian fixed64/fixed32) rather
 * than through generated code: no Debian package carries TensorBoard's .proto files, and the
 * encoding is checked byte for byte against the tensorboard package's own serialiser in
 * tests/python/test_tb.py. Fields equal to their proto3 default (step 0) are left out, as every
 * protobuf library does. Not here: histograms, images, text, or reading event files back.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ddp/tb.h"
#include "util/crc32c.h"
#include "util/tb_int.h"
#include "util/util.h"

#define FILE_VERSION "brain.Event:2"
#define FLUSH_BYTES (64u << 10) /* write when this much is buffered, whatever flush_ms says */

/* ---- encoding ------------------------------------------------------------------------------ */

/* Protobuf wire types and the field tags used below: (field number << 3) | wire type. */
enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };
#define TAG(field, wt) ((unsigned char)((field) << 3 | (wt)))

/* An encoder that counts every byte but stores only those that fit in cap. */
typedef struct enc {
    unsigned char *out;
    size_t cap, len;
} enc;

static void put(enc *e, const void *p, size_t n)
{
    if (e->len < e->cap) {
        size_t k = e->cap - e->len < n ? e->cap - e->len : n;
        memcpy(e->out + e->len, p, k);
    }
    e->len += n;
}

static void put_byte(enc *e, unsigned char b)
{
    put(e, &b, 1);
}

static void put_varint(enc *e, uint64_t v)
{
    unsigned char b[10];
    put(e, b, ddp__tb_varint(b, v));
}

static void put_le(enc *e, uint64_t v, int nbytes)
{
    unsigned char b[8];
    for (int i = 0; i < nbytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put(e, b, (size_t)nbytes);
}

static void put_double(enc *e, unsigned char tag, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    put_byte(e, tag);
    put_le(e, u, 8);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

size_t ddp__tb_varint(unsigned char *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (unsigned char)v;
    return n;
}

size_t ddp__tb_event_version(unsigned char *out, size_t cap, double wall_time, const char *version)
{
    enc e = {out, cap, 0};
    size_t vn = strlen(version);
    put_double(&e, TAG(1, WT_FIXED64), wall_time); /* Event.wall_time */
    put_byte(&e, TAG(3, WT_LEN));                  /* Event.file_version */
    put_varint(&e, vn);
    put(&e, version, vn);
    return e.len;
}

size_t ddp__tb_event_session_start(unsigned char *out, size_t cap, double wall_time, int64_t step)
{
    enc e = {out, cap, 0};
    put_double(&e, TAG(1, WT_FIXED64), wall_time); /* Event.wall_time */
    if (step != 0) {
        put_byte(&e, TAG(2, WT_VARINT)); /* Event.step */
        put_varint(&e, (uint64_t)step);
    }
    put_byte(&e, TAG(7, WT_LEN)); /* Event.session_log (6 is the old log_message) */
    put_byte(&e, 2);
    put_byte(&e, TAG(1, WT_VARINT)); /* SessionLog.status */
    put_byte(&e, 1);                 /* START */
    return e.len;
}

size_t ddp__tb_event_scalar(unsigned char *out, size_t cap, double wall_time, int64_t step,
                            const char *tag, size_t tag_len, float value)
{
    /* Lengths inside out: Summary.Value, then the Summary holding it. */
    size_t value_len = 1 + varint_len(tag_len) + tag_len + 1 + 4;
    size_t summary_len = 1 + varint_len(value_len) + value_len;
    enc e = {out, cap, 0};
    put_double(&e, TAG(1, WT_FIXED64), wall_time); /* Event.wall_time */
    if (step != 0) {
        put_byte(&e, TAG(2, WT_VARINT)); /* Event.step, int64 */
        put_varint(&e, (uint64_t)step);
    }
    put_byte(&e, TAG(5, WT_LEN)); /* Event.summary */
    put_varint(&e, summary_len);
    put_byte(&e, TAG(1, WT_LEN)); /* Summary.value (repeated; one here) */
    put_varint(&e, value_len);
    put_byte(&e, TAG(1, WT_LEN)); /* Summary.Value.tag */
    put_varint(&e, tag_len);
    put(&e, tag, tag_len);
    uint32_t u;
    memcpy(&u, &value, sizeof u);
    put_byte(&e, TAG(2, WT_FIXED32)); /* Summary.Value.simple_value */
    put_le(&e, u, 4);
    return e.len;
}

void ddp__tb_frame(unsigned char *out, const void *data, size_t n)
{
    enc e = {out, n + DDP__TB_FRAME_BYTES, 0};
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    put(&e, len, 8);
    put_le(&e, ddp__crc32c_mask(ddp__crc32c(0, len, 8)), 4);
    put(&e, data, n);
    put_le(&e, ddp__crc32c_mask(ddp__crc32c(0, data, n)), 4);
}

/* ---- the writer ---------------------------------------------------------------------------- */

struct ddp_tb {
    int fd;
    char *path;
    unsigned char *buf; /* whole framed records not yet written */
    size_t len, cap;
    size_t nrec;       /* records in buf */
    int64_t oldest_ms; /* monotonic time the oldest record in buf was added */
    int flush_ms;
    off_t on_disk; /* bytes of whole records in the file */
    char err[DDP_ERRMSG_MAX];
};

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* mkdir -p: creates dir and its missing parents. */
static ddp_status make_dirs(const char *dir, ddp_error *err)
{
    size_t n = strlen(dir);
    char *p = strdup(dir);
    if (!p)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating '%s'", dir);
    ddp_status st = DDP_OK;
    for (size_t i = 1; i <= n && st == DDP_OK; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            st = ddp__err(err, DDP_ERR_SYSTEM,
                          "cannot create the TensorBoard directory '%s': %s; choose a writable "
                          "place for it",
                          p, strerror(errno));
        else if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            st = ddp__err(err, DDP_ERR_SYSTEM,
                          "cannot create the TensorBoard directory '%s': a file of that name is "
                          "in the way",
                          p);
        p[i] = c;
    }
    free(p);
    return st;
}

/* Writes all of buf to the file at on_disk. On failure cuts the file back to on_disk. */
static ddp_status write_records(ddp_tb *tb, const unsigned char *p, size_t n, char *why, size_t cap)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = pwrite(tb->fd, p + done, n - done, tb->on_disk + (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            ddp__fmt(why, cap, "%s", k < 0 ? strerror(errno) : "nothing was written");
            /* A partial record would end every reader's view of the file at its start. */
            if (ftruncate(tb->fd, tb->on_disk) != 0) {
                size_t l = strlen(why);
                ddp__fmt(why + l, cap - l, " (and cutting off the partial record failed: %s)",
                         strerror(errno));
            }
            return DDP_ERR_SYSTEM;
        }
        done += (size_t)k;
    }
    tb->on_disk += (off_t)n;
    return DDP_OK;
}

static ddp_status flush_buf(ddp_tb *tb)
{
    if (tb->len == 0)
        return DDP_OK;
    char why[300];
    ddp_status st = write_records(tb, tb->buf, tb->len, why, sizeof why);
    if (st != DDP_OK)
        ddp__errmsg(tb->err, st,
                    "writing TensorBoard events to '%s' failed: %s; %zu record%s (%zu bytes) "
                    "dropped, the file keeps the ones before; free disk space or choose another "
                    "directory",
                    tb->path, why, tb->nrec, tb->nrec == 1 ? "" : "s", tb->len);
    tb->len = 0;
    tb->nrec = 0;
    return st;
}

/* Frames an encoded Event into the buffer. */
static ddp_status append_record(ddp_tb *tb, const unsigned char *data, size_t n)
{
    size_t need = tb->len + n + DDP__TB_FRAME_BYTES;
    if (need > tb->cap) {
        size_t cap = tb->cap ? tb->cap : 4096;
        while (cap < need)
            cap *= 2;
        unsigned char *p = realloc(tb->buf, cap);
        if (!p) {
            return ddp__errmsg(tb->err, DDP_ERR_NOMEM,
                               "out of memory buffering a TensorBoard record");
        }
        tb->buf = p;
        tb->cap = cap;
    }
    ddp__tb_frame(tb->buf + tb->len, data, n);
    if (tb->nrec++ == 0)
        tb->oldest_ms = ddp__now_ms();
    tb->len = need;
    return DDP_OK;
}

static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07;
        } else {
            return false;
        }
        if (n - i - 1 < k)
            return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        /* Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8. */
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return false;
        i += k + 1;
    }
    return true;
}

/* The largest <time> of the event files already in dir (events.out.tfevents.<time>.…), or -1. */
static long long newest_event_second(const char *dir)
{
    long long newest = -1;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        static const char prefix[] = "events.out.tfevents.";
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0)
            continue;
        const char *p = e->d_name + sizeof prefix - 1;
        char *end;
        errno = 0;
        long long t = strtoll(p, &end, 10);
        if (end != p && *end == '.' && errno == 0 && t > newest && t < (1LL << 40))
            newest = t;
    }
    closedir(d);
    return newest;
}

ddp_status ddp_tb_open(const char *dir, const ddp_tb_opts *opts, ddp_tb **out, ddp_error *err)
{
    ddp_tb_opts def = DDP_TB_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!dir || !*dir || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_tb_open: a directory and out are required");
    const char *suffix = opts->suffix ? opts->suffix : "";
    if (strchr(suffix, '/') || strlen(suffix) > 200 || opts->flush_ms < 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "TensorBoard writer options: the suffix '%.200s' must hold no '/' and "
                        "at most 200 bytes, flush_ms (%d) must be ≥ 0",
                        suffix, opts->flush_ms);
    ddp_status st = make_dirs(dir, err);
    if (st != DDP_OK)
        return st;
    ddp_tb *tb = calloc(1, sizeof *tb);
    if (!tb)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory opening a TensorBoard writer");
    tb->fd = -1;
    tb->flush_ms = opts->flush_ms;

    char host[256] = "localhost";
    if (gethostname(host, sizeof host) != 0)
        ddp__fmt(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *h = host; *h; h++)
        if (*h == '/')
            *h = '_';
    double wall = now_wall();
    int dl = (int)strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') /* "runs/x/" names "runs/x/events…", not "runs/x//…" */
        dl--;
    size_t cap = strlen(dir) + strlen(host) + strlen(suffix) + 96;
    tb->path = malloc(cap);
    if (!tb->path) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory opening a TensorBoard writer");
        goto out_free;
    }
    /* TensorBoard reads a run's event files in the order of their names. A file of the same
     * second or later (a restart within the second: pids compare as text, "9999" after "12345";
     * another host's clock ahead) would sort after ours, so our name takes the second after the
     * newest one there: the newest writer's file always sorts last. */
    long long second = (long long)wall, newest = newest_event_second(dir);
    if (newest >= second)
        second = newest + 1;
    /* <n> makes the name new: several writers of one process in one second get their own
     * files, without a process-wide counter. */
    for (unsigned n = 0; tb->fd < 0; n++) {
        ddp__fmt(tb->path, cap, "%.*s/events.out.tfevents.%010lld.%s.%ld.%u%s", dl, dir, second,
                 host, (long)getpid(), n, suffix);
        tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (tb->fd < 0 && (errno != EEXIST || n == 9999)) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot create the TensorBoard event file '%s': %s",
                          tb->path, strerror(errno));
            goto out_free;
        }
    }
    /* The version record (and the purge) go straight to the file, so a full disk shows here. */
    unsigned char ev[64], rec[2 * (64 + DDP__TB_FRAME_BYTES)];
    size_t n = ddp__tb_event_version(ev, sizeof ev, wall, FILE_VERSION);
    ddp__tb_frame(rec, ev, n);
    size_t len = n + DDP__TB_FRAME_BYTES;
    if (opts->purge_step >= 0) {
        n = ddp__tb_event_session_start(ev, sizeof ev, wall, opts->purge_step);
        ddp__tb_frame(rec + len, ev, n);
        len += n + DDP__TB_FRAME_BYTES;
    }
    char why[300];
    if ((st = write_records(tb, rec, len, why, sizeof why)) != DDP_OK) {
        ddp__err(err, st,
                 "cannot write the TensorBoard event file '%s': %s; free disk space or "
                 "choose another directory",
                 tb->path, why);
        goto out_unlink;
    }
    *out = tb;
    return DDP_OK;

out_unlink:
    unlink(tb->path);
out_free:
    if (tb->fd >= 0)
        close(tb->fd);
    free(tb->path);
    free(tb->buf);
    free(tb);
    return st;
}

ddp_status ddp_tb_scalar(ddp_tb *tb, const char *tag, int64_t step, double value, double wall_time)
{
    if (!tb)
        return DDP_ERR_INVALID;
    size_t tn = tag ? strnlen(tag, DDP_TB_MAX_TAG + 1) : 0;
    if (tn == 0 || tn > DDP_TB_MAX_TAG || !valid_utf8((const unsigned char *)tag, tn)) {
        return ddp__errmsg(tb->err, DDP_ERR_INVALID,
                           "a TensorBoard tag must be 1 to %d bytes of UTF-8 (tag '%.64s'%s)",
                           DDP_TB_MAX_TAG, tag ? tag : "(null)", tn > 64 ? "…" : "");
    }
    if (!(wall_time > 0))
        wall_time = now_wall();
    unsigned char small[256], *ev = small;
    size_t n = ddp__tb_event_scalar(small, sizeof small, wall_time, step, tag, tn, (float)value);
    if (n > sizeof small) {
        ev = malloc(n);
        if (!ev) {
            return ddp__errmsg(tb->err, DDP_ERR_NOMEM,
                               "out of memory encoding a TensorBoard record");
        }
        ddp__tb_event_scalar(ev, n, wall_time, step, tag, tn, (float)value);
    }
    ddp_status st = append_record(tb, ev, n);
    if (ev != small)
        free(ev);
    if (st != DDP_OK)
        return st;
    if (tb->len >= FLUSH_BYTES || ddp__now_ms() - tb->oldest_ms >= tb->flush_ms)
        return flush_buf(tb);
    return DDP_OK;
}

ddp_status ddp_tb_flush(ddp_tb *tb)
{
    return tb ? flush_buf(tb) : DDP_ERR_INVALID;
}

void ddp_tb_close(ddp_tb *tb)
{
    if (!tb)
        return;
    flush_buf(tb);
    close(tb->fd);
    free(tb->path);
    free(tb->buf);
    free(tb);
}

const char *ddp_tb_path(const ddp_tb *tb)
{
    return tb ? tb->path : "";
}

const char *ddp_tb_last_error(const ddp_tb *tb)
{
    return tb ? tb->err : "";
}
