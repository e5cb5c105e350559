/*
 * safetensors.c — the checkpoint file format: an atomic writer and a validating, memory-mapped
 * reader for safetensors files (see include/ddp/ckpt.h for the layout).
 *
 * The JSON header is built and parsed with jansson. The reader trusts nothing in the file: every
 * length, offset and shape is checked against the file size before a pointer into the mapping
 * is handed out, so a truncated or corrupt file is an error message, never a crash — unless it
 * shrinks after it was opened (truncated or rewritten in place while read): a read past the new
 * end then raises SIGBUS, and the mapping is recorded (src/data/mappings.c) so that a handler
 * can name the file. It does not convert dtypes or byte order: callers get views of the stored
 * bytes.
 */
#define _GNU_SOURCE
#include "ddp/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data.h"
#include "util/util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ddp checkpoints store tensors little-endian; big-endian hosts are not supported"
#endif

#define HEADER_MAX ((uint64_t)100 << 20) /* a larger header is taken for corruption */
#define META_KEY "__metadata__"
/* The data section's CRC-32 (zlib's), 8 hex digits, in the metadata: a byte changed after the
 * save (a flipped bit on disk, a partial copy) is found by ddp_ckpt_verify instead of loading as
 * wrong weights. Files without it (older ones, other writers) are not checked. */
#define CRC_KEY "ddp.data_crc32"

/* zlib's CRC-32 over n bytes, in pieces its uInt length can take. */
static uint32_t data_crc(uint32_t crc, const unsigned char *p, uint64_t n)
{
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, k);
        p += k;
        n -= k;
    }
    return crc;
}

/* The format's names for our dtypes (safetensors spells them its own way); sizes are
 * ddp_dtype_size()'s. Every ddp_dtype has an entry. */
static const char *const st_names[DDP_DTYPE_COUNT] = {
    [DDP_FLOAT32] = "F32", [DDP_FLOAT64] = "F64", [DDP_BFLOAT16] = "BF16", [DDP_FLOAT16] = "F16",
    [DDP_INT32] = "I32",   [DDP_INT64] = "I64",   [DDP_UINT8] = "U8",
};

/* The file's name for t, or NULL when t is not a dtype. */
static const char *st_name(ddp_dtype t)
{
    return (unsigned)t < DDP_DTYPE_COUNT ? st_names[t] : NULL;
}

/* Bytes of a tensor of this dtype and shape; false on a negative dimension or overflow. */
static bool tensor_bytes(ddp_dtype dt, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t b = ddp_dtype_size(dt);
    bool zero = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return false;
        if (shape[i] == 0)
            zero = true;
    }
    if (zero) { /* an empty tensor: the other dimensions may be anything non-negative */
        *out = 0;
        return true;
    }
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (b > (uint64_t)INT64_MAX / d)
            return false;
        b *= d;
    }
    *out = b;
    return true;
}

/* ---- writing ----------------------------------------------------------------------------------
 */

/* Writes all of buf at file offset off, retrying on EINTR and short writes. 0 or an errno. */
static int pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off)
{
    const unsigned char *p = buf;
    while (len > 0) {
        size_t chunk = len > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)len;
        ssize_t w = pwrite(fd, p, chunk, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (w == 0)
            return EIO;
        p += w;
        len -= (uint64_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Sort key of the data layout: larger elements first, so every tensor is naturally aligned;
 * ties keep the caller's order. */
typedef struct {
    size_t idx;
    size_t esize;
} slot;

static int cmp_slot(const void *a, const void *b)
{
    const slot *x = a, *y = b;
    if (x->esize != y->esize)
        return x->esize > y->esize ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Checks the tensors and metadata and builds the JSON header. On DDP_OK *root_out holds it,
 * order[k] names the tensor stored k-th in the data and bytes[i] is tensor i's size. */
static ddp_status build_header(const char *path, const ddp_ckpt_tensor *t, size_t n,
                               const char *const *mk, const char *const *mv, size_t nmeta,
                               bool deferred_ok, slot *order, uint64_t *bytes, json_t **root_out,
                               bool *deferred, ddp_error *err)
{
    *deferred = false;
    ddp_status st = DDP_OK;
    json_t *root = json_object();
    if (!root)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);

    json_t *meta = json_object();
    if (!meta || json_object_set_new(root, META_KEY, meta) != 0) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
        goto out_free;
    }
    for (size_t i = 0; i < nmeta; i++) {
        if (mk[i] && !strcmp(mk[i], CRC_KEY)) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': metadata key '" CRC_KEY "' is ddpc's own "
                          "(the data's checksum); choose another name",
                          path);
            goto out_free;
        }
        if (!mk[i] || !mv[i]) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': metadata entry %zu has a NULL key or value",
                          path, i);
            goto out_free;
        }
        if (json_object_get(meta, mk[i])) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': metadata key '%s' is given twice", path, mk[i]);
            goto out_free;
        }
        json_t *v = json_string(mv[i]);
        if (!v || json_object_set_new(meta, mk[i], v) != 0) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': metadata '%s' is not valid UTF-8 (key and "
                          "value must be UTF-8 text)",
                          path, mk[i]);
            goto out_free;
        }
    }

    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor *x = &t[i];
        if (!x->name || !x->name[0] || strcmp(x->name, META_KEY) == 0) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': tensor %zu has no name or the reserved name "
                          "'" META_KEY "'",
                          path, i);
            goto out_free;
        }
        if (!st_name(x->dtype)) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': tensor '%s' has unknown "
                          "dtype %d",
                          path, x->name, (int)x->dtype);
            goto out_free;
        }
        if (x->ndim < 0 || x->ndim > DDP_CKPT_MAX_DIMS ||
            !tensor_bytes(x->dtype, x->ndim, x->shape, &bytes[i])) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': tensor '%s' has an invalid shape (ndim %d, "
                          "dimensions must be ≥ 0, at most %d of them, size below 2^63 bytes)",
                          path, x->name, x->ndim, DDP_CKPT_MAX_DIMS);
            goto out_free;
        }
        if (bytes[i] > 0 && !x->data && !deferred_ok) {
            st = ddp__err(err, DDP_ERR_INVALID, "saving checkpoint '%s': tensor '%s' has no data",
                          path, x->name);
            goto out_free;
        }
        if (bytes[i] > 0 && !x->data)
            *deferred = true;
        order[i] = (slot){i, ddp_dtype_size(x->dtype)};
    }
    qsort(order, n, sizeof *order, cmp_slot);

    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k].idx;
        if (bytes[i] > (uint64_t)INT64_MAX - pos) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "saving checkpoint '%s': the tensors add up to "
                          "more than 2^63 bytes",
                          path);
            goto out_free;
        }
        if (json_object_get(root, t[i].name)) {
            st =
                ddp__err(err, DDP_ERR_INVALID,
                         "saving checkpoint '%s': tensor name '%s' is used twice", path, t[i].name);
            goto out_free;
        }
        json_t *shape = json_array(), *offs = json_array(), *e = json_object();
        bool ok = shape && offs && e;
        for (int d = 0; ok && d < t[i].ndim; d++)
            ok = json_array_append_new(shape, json_integer((json_int_t)t[i].shape[d])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)pos)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(pos + bytes[i]))) == 0;
        ok = ok && json_object_set_new(e, "dtype", json_string(st_name(t[i].dtype))) == 0 &&
             json_object_set(e, "shape", shape) == 0 &&
             json_object_set(e, "data_offsets", offs) == 0;
        json_decref(shape);
        json_decref(offs);
        if (!ok)
            json_decref(e);
        if (!ok || json_object_set_new(root, t[i].name, e) != 0) {
            if (ok) /* only the last set failed: the name itself was refused */
                st = ddp__err(err, DDP_ERR_INVALID,
                              "saving checkpoint '%s': tensor name '%s' is not valid UTF-8", path,
                              t[i].name);
            else
                st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
            goto out_free;
        }
        pos += bytes[i];
    }
    /* With data still to come (ddp_ckpt_writer_put) the CRC is a placeholder of the same
     * length, computed and written over it at the commit. */
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (size_t k = 0; k < n && !*deferred; k++)
        crc = data_crc(crc, t[order[k].idx].data, bytes[order[k].idx]);
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", *deferred ? 0u : (unsigned)crc);
    if (json_object_set_new(meta, CRC_KEY, json_string(hex)) != 0) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
        goto out_free;
    }
    *root_out = root;
    return DDP_OK;

out_free:
    json_decref(root);
    return st;
}

struct ddp_ckpt_writer {
    char *path, *tmp;
    int fd;
    size_t n;
    uint64_t data_off; /* where the data section starts in the file */
    uint64_t total;    /* its length */
    uint64_t *off;     /* (n,): tensor i's offset in the data section */
    uint64_t *bytes;   /* (n,): its length */
    uint64_t *todo;    /* (n,): bytes still to put (0 for tensors written at the open) */
    char **names;      /* (n,): for messages */
    bool deferred;     /* some data comes through ddp_ckpt_writer_put */
    uint64_t crc_at;   /* deferred: the file offset of the CRC's 8 hex digits */
};

static void writer_free(ddp_ckpt_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; w->names && i < w->n; i++)
        free(w->names[i]);
    free(w->names);
    free(w->off);
    free(w->bytes);
    free(w->todo);
    free(w->tmp);
    free(w->path);
    free(w);
}

void ddp_ckpt_writer_abort(ddp_ckpt_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp); /* best effort: the error that brought us here is the one to report */
    }
    writer_free(w);
}

static ddp_status writer_open(const char *path, const ddp_ckpt_tensor *t, size_t n,
                              const char *const *meta_keys, const char *const *meta_vals,
                              size_t nmeta, bool deferred_ok, ddp_ckpt_writer **out, ddp_error *err)
{
    if (!path || !path[0] || (n > 0 && !t) || (nmeta > 0 && (!meta_keys || !meta_vals)) || !out)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_ckpt_save: path, and the tensor and metadata arrays when their counts "
                        "are non-zero, are required");

    ddp_status st = DDP_OK;
    slot *order = calloc(n ? n : 1, sizeof *order);
    ddp_ckpt_writer *w = calloc(1, sizeof *w);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || strchr(host, '/'))
        snprintf(host, sizeof host, "unknown");
    size_t tmp_cap = strlen(path) + strlen(host) + 40;
    json_t *root = NULL;
    char *hdr = NULL;
    if (w) {
        w->fd = -1;
        w->n = n;
        w->path = strdup(path);
        w->tmp = malloc(tmp_cap);
        w->off = calloc(n ? n : 1, sizeof *w->off);
        w->bytes = calloc(n ? n : 1, sizeof *w->bytes);
        w->todo = calloc(n ? n : 1, sizeof *w->todo);
        w->names = calloc(n ? n : 1, sizeof *w->names);
    }
    if (!order || !w || !w->path || !w->tmp || !w->off || !w->bytes || !w->todo || !w->names) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
        goto out_free;
    }
    st = build_header(path, t, n, meta_keys, meta_vals, nmeta, deferred_ok, order, w->bytes, &root,
                      &w->deferred, err);
    if (st != DDP_OK)
        goto out_free;
    hdr = json_dumps(root, JSON_COMPACT);
    if (!hdr) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
        goto out_free;
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = order[k].idx;
        w->off[i] = w->total;
        w->total += w->bytes[i];
        w->todo[i] = t[i].data ? 0 : w->bytes[i];
        if (!(w->names[i] = strdup(t[i].name))) {
            st = ddp__err(err, DDP_ERR_NOMEM, "out of memory saving checkpoint '%s'", path);
            goto out_free;
        }
    }

    /* The header is padded with spaces (valid JSON whitespace) so the data starts 8-aligned. */
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++)
        lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    w->data_off = 8 + padded;
    if (w->deferred) { /* the placeholder build_header wrote: its own key, once in the header */
        const char *at = strstr(hdr, "\"" CRC_KEY "\":\"00000000\"");
        if (!at) {
            st =
                ddp__err(err, DDP_ERR_SYSTEM, "saving checkpoint '%s': no CRC in the header", path);
            goto out_free;
        }
        w->crc_at = 8 + (uint64_t)(at - hdr) + strlen("\"" CRC_KEY "\":\"");
    }

    /* host and pid name the writer, so a later run can tell its own dead saves (ckpt.c) */
    ddp__fmt(w->tmp, tmp_cap, "%s.tmp.%s.%ld", path, host, (long)getpid());
    w->fd = open(w->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); /* read back for the CRC */
    if (w->fd < 0) {
        st = ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                      "cannot create checkpoint file '%s': %s; check that the directory exists "
                      "and is writable",
                      w->tmp, strerror(errno));
        goto out_free;
    }
    int e = pwrite_all(w->fd, lenbuf, 8, 0);
    if (!e)
        e = pwrite_all(w->fd, hdr, hlen, 8);
    if (!e)
        e = pwrite_all(w->fd, spaces, padded - hlen, 8 + hlen);
    for (size_t k = 0; !e && k < n; k++) {
        size_t i = order[k].idx;
        if (t[i].data)
            e = pwrite_all(w->fd, t[i].data, w->bytes[i], w->data_off + w->off[i]);
    }
    /* deferred data: the file has its whole length now; ddp_ckpt_writer_put fills the holes */
    if (!e && w->deferred && ftruncate(w->fd, (off_t)(w->data_off + w->total)) != 0)
        e = errno;
    if (e) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "writing checkpoint '%s' failed: %s; check free disk space and file-size "
                      "limits (the previous checkpoint, if any, is unchanged)",
                      w->tmp, strerror(e));
        goto out_free;
    }
    *out = w;
    w = NULL;
out_free:
    ddp_ckpt_writer_abort(w);
    free(hdr);
    json_decref(root);
    free(order);
    return st;
}

ddp_status ddp_ckpt_writer_open(const char *path, const ddp_ckpt_tensor *t, size_t n,
                                const char *const *meta_keys, const char *const *meta_vals,
                                size_t nmeta, ddp_ckpt_writer **out, ddp_error *err)
{
    return writer_open(path, t, n, meta_keys, meta_vals, nmeta, true, out, err);
}

ddp_status ddp_ckpt_writer_put(ddp_ckpt_writer *w, size_t i, uint64_t offset, const void *data,
                               size_t bytes, ddp_error *err)
{
    if (!w)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_writer_put: no writer");
    if (i >= w->n)
        return ddp__err(err, DDP_ERR_INVALID, "checkpoint '%s': no tensor %zu (it has %zu)",
                        w->path, i, w->n);
    if (bytes && !data)
        return ddp__err(err, DDP_ERR_INVALID, "checkpoint '%s': %zu bytes for '%s' without data",
                        w->path, bytes, w->names[i]);
    if (offset > w->bytes[i] || bytes > w->bytes[i] - offset || bytes > w->todo[i])
        return ddp__err(
            err, DDP_ERR_INVALID,
            "checkpoint '%s': bytes [%llu, %llu) of tensor %zu ('%s') are not %s", w->path,
            (unsigned long long)offset, (unsigned long long)(offset + bytes), i, w->names[i],
            !w->todo[i] ? "still to come (its data was given, or put whole already)" : "in it");
    int e = pwrite_all(w->fd, data, bytes, w->data_off + w->off[i] + offset);
    if (e)
        return ddp__err(err, DDP_ERR_SYSTEM,
                        "writing checkpoint '%s' failed: %s; check free disk space and file-size "
                        "limits (the previous checkpoint, if any, is unchanged)",
                        w->tmp, strerror(e));
    w->todo[i] -= bytes;
    return DDP_OK;
}

/* The deferred file's CRC: its data section read back (from the page cache, as it was just
 * written), then written over the header's placeholder. */
static int write_crc(ddp_ckpt_writer *w)
{
    size_t cap = (size_t)1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return ENOMEM;
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    for (uint64_t at = 0; at < w->total;) {
        size_t want = w->total - at < cap ? (size_t)(w->total - at) : cap;
        ssize_t r = pread(w->fd, buf, want, (off_t)(w->data_off + at));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            return e;
        }
        crc = data_crc(crc, buf, (uint64_t)r);
        at += (uint64_t)r;
    }
    free(buf);
    char hex[16];
    snprintf(hex, sizeof hex, "%08x", (unsigned)crc);
    return pwrite_all(w->fd, hex, 8, w->crc_at);
}

ddp_status ddp_ckpt_writer_commit(ddp_ckpt_writer *w, ddp_error *err)
{
    if (!w)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_writer_commit: no writer");
    ddp_status st = DDP_OK;
    for (size_t i = 0; i < w->n; i++)
        if (w->todo[i]) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "checkpoint '%s': tensor '%s' still lacks %llu of its %llu bytes: put "
                          "all of it before the commit (nothing was saved)",
                          w->path, w->names[i], (unsigned long long)w->todo[i],
                          (unsigned long long)w->bytes[i]);
            goto out_abort;
        }
    int e = w->deferred ? write_crc(w) : 0;
    if (e) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "writing checkpoint '%s' failed: %s; check free disk space and file-size "
                      "limits (the previous checkpoint, if any, is unchanged)",
                      w->tmp, strerror(e));
        goto out_abort;
    }
    if (fsync(w->fd) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "fsync of checkpoint '%s' failed: %s (the previous checkpoint, if any, is "
                      "unchanged)",
                      w->tmp, strerror(errno));
        goto out_abort;
    }
    /* close() can report a deferred write error (NFS); EINTR leaves the fd closed on Linux. */
    int rc = close(w->fd);
    w->fd = -1;
    if (rc != 0 && errno != EINTR) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "closing checkpoint '%s' failed: %s", w->tmp,
                      strerror(errno));
        unlink(w->tmp);
        goto out_free;
    }
    if (rename(w->tmp, w->path) != 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM,
                      "cannot rename '%s' to '%s': %s (the previous checkpoint, if any, is "
                      "unchanged)",
                      w->tmp, w->path, strerror(errno));
        unlink(w->tmp);
        goto out_free;
    }
    st = ddp__fsync_parent(w->path, "checkpoint", err);
out_free:
    writer_free(w);
    return st;
out_abort:
    ddp_ckpt_writer_abort(w);
    return st;
}

ddp_status ddp_ckpt_save(const char *path, const ddp_ckpt_tensor *t, size_t n,
                         const char *const *meta_keys, const char *const *meta_vals, size_t nmeta,
                         ddp_error *err)
{
    ddp_ckpt_writer *w = NULL;
    ddp_status st = writer_open(path, t, n, meta_keys, meta_vals, nmeta, false, &w, err);
    return st ? st : ddp_ckpt_writer_commit(w, err);
}

/* ---- reading ----------------------------------------------------------------------------------
 */

struct ddp_ckpt {
    char *path;
    unsigned char *map; /* the whole file, read-only */
    size_t map_len;
    size_t data_off;     /* where the data section begins in map */
    const char *crc_hex; /* metadata CRC_KEY (not listed with the caller's metadata), or NULL */
    json_t *root;        /* the header; tensor names and metadata strings point into it */
    ddp_ckpt_tensor *t;  /* (n,) in header order */
    size_t n;
    const char **mkey; /* (nmeta,) */
    const char **mval; /* (nmeta,) */
    size_t nmeta;
};

/* One tensor's byte range in the data buffer, for the coverage check. */
typedef struct {
    uint64_t begin, end;
    const char *name;
    size_t idx; /* the tensor's index in header order */
} range;

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static ddp_status corrupt(ddp_error *err, const char *path, const char *fmt, ...) DDP_PRINTF(3, 4);

/* Records "checkpoint 'path' is malformed: <what>; …" and returns DDP_ERR_INVALID. */
static ddp_status corrupt(ddp_error *err, const char *path, const char *fmt, ...)
{
    char what[DDP_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(what, sizeof what, fmt, ap);
    va_end(ap);
    return ddp__err(err, DDP_ERR_INVALID,
                    "checkpoint '%s' is malformed: %s; the file is damaged, incomplete or not "
                    "a safetensors file — use another checkpoint",
                    path, what);
}

static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Parses and checks one tensor entry of the header. */
static ddp_status parse_tensor(const char *path, const char *name, const json_t *v,
                               ddp_ckpt_tensor *t, range *r, ddp_error *err)
{
    if (!json_is_object(v))
        return corrupt(err, path, "the entry of tensor '%s' is not a JSON object", name);
    const char *key;
    const json_t *f;
    json_object_foreach((json_t *)v, key, f)
    {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 &&
            strcmp(key, "data_offsets") != 0)
            return corrupt(err, path, "tensor '%s' has an unknown field '%s'", name, key);
    }
    const json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offs = json_object_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return corrupt(err, path, "tensor '%s' lacks one of 'dtype', 'shape', 'data_offsets'",
                       name);
    if (!json_is_string(dt))
        return corrupt(err, path, "the dtype of tensor '%s' is not a string", name);
    int d;
    for (d = 0; d < DDP_DTYPE_COUNT; d++)
        if (strcmp(json_string_value(dt), st_names[d]) == 0)
            break;
    if (d == DDP_DTYPE_COUNT)
        return corrupt(err, path,
                       "tensor '%s' has unsupported dtype '%.32s' (supported: F32 F64 BF16 F16 "
                       "I32 I64 U8)",
                       name, json_string_value(dt));
    t->name = name;
    t->dtype = (ddp_dtype)d;
    if (!json_is_array(shape) || json_array_size(shape) > DDP_CKPT_MAX_DIMS)
        return corrupt(err, path,
                       "the shape of tensor '%s' is not an array of at most %d dimensions", name,
                       DDP_CKPT_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    for (int i = 0; i < t->ndim; i++) {
        const json_t *x = json_array_get(shape, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return corrupt(err, path, "dimension %d of tensor '%s' is not a non-negative integer",
                           i, name);
        t->shape[i] = (int64_t)json_integer_value(x);
    }
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !get_u64(json_array_get(offs, 0), &r->begin) ||
        !get_u64(json_array_get(offs, 1), &r->end) || r->begin > r->end)
        return corrupt(err, path,
                       "the data_offsets of tensor '%s' are not [begin, end] with 0 ≤ begin ≤ "
                       "end",
                       name);
    uint64_t bytes;
    if (!tensor_bytes(t->dtype, t->ndim, t->shape, &bytes))
        return corrupt(err, path, "the shape of tensor '%s' is too large", name);
    if (bytes != r->end - r->begin)
        return corrupt(err, path,
                       "tensor '%s' (%s, %llu bytes by its shape) has data_offsets [%llu, %llu] "
                       "spanning %llu bytes",
                       name, st_names[d], (unsigned long long)bytes, (unsigned long long)r->begin,
                       (unsigned long long)r->end, (unsigned long long)(r->end - r->begin));
    r->name = name;
    return DDP_OK;
}

/* Checks that the ranges tile [0, data_len) exactly: in bounds, no overlap, no gap, no tail. */
static ddp_status check_layout(const char *path, range *r, size_t n, uint64_t data_len,
                               ddp_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (r[i].end > data_len)
            return corrupt(err, path,
                           "tensor '%s' ends at byte %llu of the data but the file holds only "
                           "%llu bytes of data (truncated?)",
                           r[i].name, (unsigned long long)r[i].end, (unsigned long long)data_len);
    qsort(r, n, sizeof *r, cmp_range);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].begin < pos)
            return corrupt(err, path, "tensor '%s' overlaps tensor '%s' in the data", r[i].name,
                           r[i - 1].name);
        if (r[i].begin > pos)
            return corrupt(err, path,
                           "data bytes [%llu, %llu) before tensor '%s' belong to no tensor (gap)",
                           (unsigned long long)pos, (unsigned long long)r[i].begin, r[i].name);
        pos = r[i].end;
    }
    if (pos != data_len)
        return corrupt(err, path,
                       "%llu bytes of trailing garbage after the last tensor (data ends at %llu, "
                       "file data holds %llu)",
                       (unsigned long long)(data_len - pos), (unsigned long long)pos,
                       (unsigned long long)data_len);
    return DDP_OK;
}

/* Parses and checks the header of c (already mapped). */
static ddp_status parse(ddp_ckpt *c, ddp_error *err)
{
    const char *path = c->path;
    if (c->map_len < 8)
        return corrupt(err, path, "the file is %zu bytes, too short for the 8-byte header length",
                       c->map_len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)c->map[i] << (8 * i);
    if (hlen > HEADER_MAX)
        return corrupt(err, path, "header length %llu is absurd (limit %llu bytes)",
                       (unsigned long long)hlen, (unsigned long long)HEADER_MAX);
    if (hlen > c->map_len - 8)
        return corrupt(err, path,
                       "the header length is %llu bytes but only %zu bytes follow (truncated?)",
                       (unsigned long long)hlen, c->map_len - 8);

    json_error_t je;
    c->root = json_loadb((const char *)c->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!c->root)
        return corrupt(err, path, "invalid JSON header at line %d column %d: %s", je.line,
                       je.column, je.text);
    if (!json_is_object(c->root))
        return corrupt(err, path, "the JSON header is not an object");

    size_t total = json_object_size(c->root);
    json_t *meta = json_object_get(c->root, META_KEY);
    c->t = calloc(total ? total : 1, sizeof *c->t);
    range *r = calloc(total ? total : 1, sizeof *r);
    size_t nm = meta && json_is_object(meta) ? json_object_size(meta) : 0;
    c->mkey = calloc(nm ? nm : 1, sizeof *c->mkey);
    c->mval = calloc(nm ? nm : 1, sizeof *c->mval);
    ddp_status st = DDP_OK;
    if (!c->t || !r || !c->mkey || !c->mval) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory opening checkpoint '%s'", path);
        goto out_free;
    }

    if (meta) {
        if (!json_is_object(meta)) {
            st = corrupt(err, path, "'" META_KEY "' is not a JSON object");
            goto out_free;
        }
        const char *k;
        json_t *v;
        json_object_foreach(meta, k, v)
        {
            if (!json_is_string(v)) {
                st = corrupt(err, path,
                             "metadata '%s' is not a string (metadata must map "
                             "strings to strings)",
                             k);
                goto out_free;
            }
            if (!strcmp(k, CRC_KEY)) { /* ddpc's own: for ddp_ckpt_verify, not listed */
                c->crc_hex = json_string_value(v);
                continue;
            }
            c->mkey[c->nmeta] = k;
            c->mval[c->nmeta++] = json_string_value(v);
        }
    }

    const char *name;
    json_t *v;
    json_object_foreach(c->root, name, v)
    {
        if (v == meta)
            continue;
        st = parse_tensor(path, name, v, &c->t[c->n], &r[c->n], err);
        if (st != DDP_OK)
            goto out_free;
        r[c->n].idx = c->n;
        c->n++;
    }
    uint64_t data_off = 8 + hlen;
    c->data_off = (size_t)data_off;
    st = check_layout(path, r, c->n, (uint64_t)c->map_len - data_off, err);
    if (st != DDP_OK)
        goto out_free;
    for (size_t i = 0; i < c->n; i++) /* every range is now known to lie inside the file */
        c->t[r[i].idx].data = c->map + data_off + r[i].begin;

out_free:
    free(r);
    return st;
}

ddp_status ddp_ckpt_open(const char *path, ddp_ckpt **out, ddp_error *err)
{
    if (!path || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_open: path and out are required");
    ddp_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory opening checkpoint '%s'", path);
    }
    ddp_status st = DDP_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                      "cannot open checkpoint '%s': %s", path, strerror(errno));
        goto out_close;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st =
            ddp__err(err, DDP_ERR_SYSTEM, "cannot stat checkpoint '%s': %s", path, strerror(errno));
        goto out_close;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ddp__err(err, DDP_ERR_INVALID, "checkpoint '%s' is not a regular file", path);
        goto out_close;
    }
    c->map_len = (size_t)sb.st_size;
    if (c->map_len > 0) {
        void *m = mmap(NULL, c->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot map checkpoint '%s' (%zu bytes): %s", path,
                          c->map_len, strerror(errno));
            c->map_len = 0;
            goto out_close;
        }
        c->map = m;
        /* named if it faults: a checkpoint shrunk while it is read (ddp_data_mapping_at) */
        ddp__mapping_add(m, c->map_len, path, DDP_MAPPING_CHECKPOINT);
    }
    close(fd); /* the mapping stays valid */
    fd = -1;
    st = parse(c, err);

out_close:
    if (fd >= 0)
        close(fd);
    if (st != DDP_OK) {
        ddp_ckpt_close(c);
        return st;
    }
    *out = c;
    return DDP_OK;
}

void ddp_ckpt_close(ddp_ckpt *c)
{
    if (!c)
        return;
    if (c->map) {
        ddp__mapping_remove(c->map);
        munmap(c->map, c->map_len);
    }
    json_decref(c->root);
    free(c->t);
    free(c->mkey);
    free(c->mval);
    free(c->path);
    free(c);
}

size_t ddp_ckpt_count(const ddp_ckpt *c)
{
    return c ? c->n : 0;
}

const ddp_ckpt_tensor *ddp_ckpt_tensor_at(const ddp_ckpt *c, size_t i)
{
    return c && i < c->n ? &c->t[i] : NULL;
}

const ddp_ckpt_tensor *ddp_ckpt_find(const ddp_ckpt *c, const char *name)
{
    if (!c || !name)
        return NULL;
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->t[i].name, name) == 0)
            return &c->t[i];
    return NULL;
}

const char *ddp_ckpt_meta(const ddp_ckpt *c, const char *key)
{
    if (!c || !key)
        return NULL;
    for (size_t i = 0; i < c->nmeta; i++)
        if (strcmp(c->mkey[i], key) == 0)
            return c->mval[i];
    return NULL;
}

size_t ddp_ckpt_meta_count(const ddp_ckpt *c)
{
    return c ? c->nmeta : 0;
}

bool ddp_ckpt_meta_at(const ddp_ckpt *c, size_t i, const char **key, const char **val)
{
    if (!c || i >= c->nmeta)
        return false;
    if (key)
        *key = c->mkey[i];
    if (val)
        *val = c->mval[i];
    return true;
}

ddp_status ddp_ckpt_verify(const ddp_ckpt *c, ddp_error *err)
{
    if (!c)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_ckpt_verify: the checkpoint is NULL");
    const char *want = c->crc_hex;
    if (!want)
        return DDP_OK; /* written before 2026-11-25, or by another program */
    char *end = NULL;
    unsigned long w = strtoul(want, &end, 16);
    if (strlen(want) != 8 || *end)
        return corrupt(err, c->path, "metadata '" CRC_KEY "' is '%.20s', not 8 hex digits", want);
    uint32_t crc = (uint32_t)crc32(0L, Z_NULL, 0);
    crc = data_crc(crc, c->map + c->data_off, (uint64_t)(c->map_len - c->data_off));
    if (crc != (uint32_t)w)
        return corrupt(err, c->path,
                       "its data does not match the checksum saved with it (CRC-32 %08x, saved "
                       "%s): the file changed after it was written (a flipped bit on disk, a "
                       "partial copy)",
                       (unsigned)crc, want);
    return DDP_OK;
}
