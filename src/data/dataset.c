/*
 * dataset.c — memory-mapped datasets: IDX image/label pairs and token files (ddp/data.h).
 *
 * Every header field is checked against the file's size before any sample is read, so a
 * truncated or mismatched file is an error at open, never a crash later. gzip files are
 * decompressed (zlib) once per host into a cache (prepare.c: one process writes, the others
 * wait). The cache name includes the source's size and modification time, so a changed source
 * is decompressed again. A file that shrinks after the checks is past them: each mapping is
 * recorded (mappings.c) so that the SIGBUS a read past the new end raises can name the file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/data.h"
#include "data/data_int.h"
#include "ddp/data.h"
#include "util/util.h"

typedef enum { DS_IDX, DS_TOKENS } ds_kind;

typedef struct mapped {
    const unsigned char *p;
    size_t len;
} mapped;

struct ddp_dataset {
    ds_kind kind;
    mapped a, b; /* IDX: images, labels; tokens: the file */
    size_t n;    /* samples */
    size_t x_elems;
    const unsigned char *pixels; /* IDX: (n, x_elems) */
    const unsigned char *labels; /* IDX: (n,) */
    const uint16_t *tokens;      /* tokens: (ntok,) */
    size_t ntok, T;
    int classes;
    ddp__data_dep *deps; /* loaders over d: released first in close */
};

void ddp__dataset_add_dep(ddp_dataset *d, ddp__data_dep *n)
{
    ddp__data_dep_add(&d->deps, n);
}

void ddp__dataset_remove_dep(ddp_dataset *d, ddp__data_dep *n)
{
    ddp__data_dep_remove(&d->deps, n);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static ddp_status map_file(const char *path, mapped *m, ddp_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                        "cannot open data file '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot stat '%s': %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return ddp__err(err, DDP_ERR_INVALID,
                        "'%s' is a directory, not a data file; give the file in it (for token "
                        "files e.g. '%s/train.bin')",
                        path, path);
    }
    m->len = (size_t)st.st_size;
    m->p = NULL;
    if (m->len > 0) {
        void *p = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ddp__err(err, DDP_ERR_SYSTEM, "cannot map '%s': %s", path, strerror(e));
        }
        m->p = p;
        /* named if it faults: a file shrunk under the job (ddp_data_mapping_at) */
        ddp__mapping_add(p, m->len, path, DDP_MAPPING_DATA);
    }
    close(fd);
    return DDP_OK;
}

static void unmap(mapped *m)
{
    if (m->p) {
        ddp__mapping_remove(m->p);
        munmap((void *)m->p, m->len);
    }
    m->p = NULL;
}

typedef struct gunzip_job {
    const char *src;
} gunzip_job;

/* Decompresses the gzip file job->src into f. */
static ddp_status gunzip_to(void *ctx, FILE *out, const char *tmp, ddp_error *err)
{
    const char *src = ((const gunzip_job *)ctx)->src;
    gzFile in = gzopen(src, "rb");
    if (!in)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot open '%s': %s", src, strerror(errno));
    char buf[1 << 16];
    ddp_status st = DDP_OK;
    for (;;) {
        int k = gzread(in, buf, sizeof buf);
        if (k < 0) {
            int zerr;
            st = ddp__err(err, DDP_ERR_INVALID, "'%s' is not a valid gzip file: %s", src,
                          gzerror(in, &zerr));
            break;
        }
        if (k == 0) {
            int zerr;
            gzerror(in, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END)
                st = ddp__err(err, DDP_ERR_INVALID, "'%s' is truncated or corrupt (gzip)", src);
            break;
        }
        if (fwrite(buf, 1, (size_t)k, out) != (size_t)k) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "writing '%s' failed: %s", tmp, strerror(errno));
            break;
        }
    }
    gzclose(in);
    return st;
}

/* Returns in out the path of a plain copy of path: path itself, or a cached decompression. */
static ddp_status plain_path(const char *path, const char *cache_dir, char *out, size_t cap,
                             ddp_error *err)
{
    if (!ends_with(path, ".gz")) {
        ddp__fmt(out, cap, "%s", path);
        return DDP_OK;
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return ddp__err(err, errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_SYSTEM,
                        "cannot open data file '%s': %s", path, strerror(errno));
    const char *dir = cache_dir && *cache_dir ? cache_dir : "/tmp/ddp-data-cache";
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot create the data cache '%s': %s", dir,
                        strerror(errno));
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    ddp__fmt(out, cap, "%s/%.*s.%lld.%lld", dir, (int)(strlen(base) - 3), base,
             (long long)st.st_size, (long long)st.st_mtime);
    if (access(out, R_OK) == 0)
        return DDP_OK;
    char what[4200];
    ddp__fmt(what, sizeof what, "decompress '%s'", path);
    gunzip_job job = {path};
    return ddp__prepare_once(out, what, gunzip_to, &job, err);
}

static ddp_dataset *new_ds(ds_kind k)
{
    ddp_dataset *d = calloc(1, sizeof *d);
    if (d)
        d->kind = k;
    return d;
}

ddp_status ddp_dataset_open_idx(const char *images, const char *labels, const char *cache_dir,
                                ddp_dataset **out, ddp_error *err)
{
    if (!images || !labels || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_dataset_open_idx: paths and out are required");
    char pi[4400], pl[4400];
    ddp_status st;
    if ((st = plain_path(images, cache_dir, pi, sizeof pi, err)) ||
        (st = plain_path(labels, cache_dir, pl, sizeof pl, err)))
        return st;
    ddp_dataset *d = new_ds(DS_IDX);
    if (!d)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory opening a dataset");
    if ((st = map_file(pi, &d->a, err)) || (st = map_file(pl, &d->b, err)))
        goto out_fail;
    /* images: magic 0x00000803 (uint8, 3 dims), count, rows, cols */
    if (d->a.len < 16 || be32(d->a.p) != 0x00000803u) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is not an IDX image file (magic 0x%08x, want 0x00000803 for uint8 "
                      "images)",
                      images, d->a.len >= 4 ? be32(d->a.p) : 0);
        goto out_fail;
    }
    if (d->b.len < 8 || be32(d->b.p) != 0x00000801u) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is not an IDX label file (magic 0x%08x, want 0x00000801)", labels,
                      d->b.len >= 4 ? be32(d->b.p) : 0);
        goto out_fail;
    }
    size_t n = be32(d->a.p + 4), rows = be32(d->a.p + 8), cols = be32(d->a.p + 12);
    size_t nl = be32(d->b.p + 4);
    if (rows == 0 || cols == 0 || rows > 65536 || cols > 65536) {
        st = ddp__err(err, DDP_ERR_INVALID, "'%s': implausible image size %zu × %zu", images, rows,
                      cols);
        goto out_fail;
    }
    if (d->a.len != 16 + n * rows * cols) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is truncated or has trailing bytes: header says %zu images of %zu × "
                      "%zu (%zu bytes), the file has %zu",
                      images, n, rows, cols, 16 + n * rows * cols, d->a.len);
        goto out_fail;
    }
    if (d->b.len != 8 + nl) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is truncated or has trailing bytes: header says %zu labels, the file "
                      "has %zu bytes",
                      labels, nl, d->b.len);
        goto out_fail;
    }
    if (nl != n) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' has %zu images but '%s' has %zu labels: "
                      "mismatched files",
                      images, n, labels, nl);
        goto out_fail;
    }
    d->n = n;
    d->x_elems = rows * cols;
    d->pixels = d->a.p + 16;
    d->labels = d->b.p + 8;
    for (size_t i = 0; i < n; i++)
        if (d->labels[i] + 1 > d->classes)
            d->classes = d->labels[i] + 1;
    *out = d;
    return DDP_OK;
out_fail:
    ddp_dataset_close(d);
    return st;
}

ddp_status ddp_dataset_open_tokens(const char *path, size_t seq_len, ddp_dataset **out,
                                   ddp_error *err)
{
    if (!path || !out || seq_len == 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_dataset_open_tokens: path, out and a "
                        "sequence length ≥ 1 are required");
    ddp_dataset *d = new_ds(DS_TOKENS);
    if (!d)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory opening a dataset");
    ddp_status st = map_file(path, &d->a, err);
    if (st)
        goto out_fail;
    const unsigned char *p = d->a.p;
    size_t len = d->a.len;
    uint32_t h0 = 0, h1 = 0, h2 = 0;
    if (len >= 12) {
        memcpy(&h0, p, 4);
        memcpy(&h1, p + 4, 4);
        memcpy(&h2, p + 8, 4);
    }
    if (len >= 1024 && h0 == 20240801u) { /* llm.c's Llama 3 shard: uint32 ids */
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' is an llm.c token shard of uint32 ids (magic 20240801, Llama 3's "
                      "vocabulary): not supported; ddpc reads uint16 ids (nanoGPT's files, llm.c's "
                      "GPT-2 shards, magic 20240520)",
                      path);
        goto out_fail;
    }
    if (len >= 1024 && h0 == 20240520u) { /* llm.c shard */
        if (h1 != 1) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "'%s': llm.c token shard version %u, only version 1 is supported", path,
                          h1);
            goto out_fail;
        }
        if (len != 1024 + (size_t)h2 * 2) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "'%s' is truncated or has trailing bytes: its header says %u tokens "
                          "(%zu bytes), the file has %zu",
                          path, h2, 1024 + (size_t)h2 * 2, len);
            goto out_fail;
        }
        d->tokens = (const uint16_t *)(p + 1024);
        d->ntok = h2;
    } else { /* nanoGPT: raw uint16 */
        if (len % 2 != 0) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "'%s' has an odd number of bytes (%zu): not uint16 tokens (and no "
                          "llm.c header)",
                          path, len);
            goto out_fail;
        }
        d->tokens = (const uint16_t *)p;
        d->ntok = len / 2;
    }
    if (d->ntok < seq_len + 1) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "'%s' has %zu tokens, fewer than one sequence of %zu + 1", path, d->ntok,
                      seq_len);
        goto out_fail;
    }
    d->T = seq_len;
    d->n = (d->ntok - 1) / seq_len;
    d->x_elems = seq_len;
    for (size_t i = 0; i < d->ntok; i++)
        if (d->tokens[i] + 1 > d->classes)
            d->classes = d->tokens[i] + 1;
    *out = d;
    return DDP_OK;
out_fail:
    ddp_dataset_close(d);
    return st;
}

void ddp_dataset_close(ddp_dataset *d)
{
    if (!d)
        return;
    ddp__data_dep_release_all(&d->deps, "dataset"); /* loaders still over d stop first */
    unmap(&d->a);
    unmap(&d->b);
    free(d);
}

size_t ddp_dataset_len(const ddp_dataset *d)
{
    return d ? d->n : 0;
}

size_t ddp_dataset_x_elems(const ddp_dataset *d)
{
    return d ? d->x_elems : 0;
}

size_t ddp_dataset_y_elems(const ddp_dataset *d)
{
    return d ? (d->kind == DS_IDX ? 1 : d->T) : 0;
}

bool ddp_dataset_x_is_float(const ddp_dataset *d)
{
    return d && d->kind == DS_IDX;
}

int ddp_dataset_classes(const ddp_dataset *d)
{
    return d ? d->classes : 0;
}

ddp_status ddp_dataset_get(const ddp_dataset *d, size_t i, void *x, int32_t *y)
{
    if (!d || i >= d->n || !x || !y) /* as get_many: a NULL x or y is refused, not written */
        return DDP_ERR_INVALID;
    if (d->kind == DS_IDX) {
        /* restrict: a byte pointer may alias anything, and without it the conversion stays
         * scalar (about 1 µs per 28×28 image instead of 0.1) */
        const unsigned char *restrict px = d->pixels + i * d->x_elems;
        float *restrict xf = x;
        for (size_t k = 0; k < d->x_elems; k++)
            xf[k] = (float)px[k] * (1.0f / 255.0f);
        y[0] = d->labels[i];
        return DDP_OK;
    }
    const uint16_t *t = d->tokens + i * d->T;
    int32_t *xi = x;
    for (size_t k = 0; k < d->T; k++) {
        xi[k] = t[k];
        y[k] = t[k + 1];
    }
    return DDP_OK;
}

ddp_status ddp_dataset_get_many(const ddp_dataset *d, const uint64_t *idx, size_t n, void *x,
                                int32_t *y, size_t *bad)
{
    if (!d || (n && (!idx || !x || !y)))
        return DDP_ERR_INVALID;
    size_t xb = d->x_elems * 4, ye = ddp_dataset_y_elems(d);
    const size_t AHEAD = 4; /* samples: enough to cover a miss, few enough to stay in L1 */
    for (size_t k = 0; k < n; k++) {
        size_t j = k + AHEAD;
        if (d->kind == DS_IDX && j < n && idx[j] < d->n) { /* random samples miss every cache */
            const char *p = (const char *)d->pixels + idx[j] * d->x_elems;
            for (size_t o = 0; o < d->x_elems; o += 64)
                __builtin_prefetch(p + o);
        }
        if (idx[k] >= d->n) {
            if (bad)
                *bad = k;
            return DDP_ERR_INVALID;
        }
        ddp_dataset_get(d, (size_t)idx[k], (char *)x + k * xb, y + k * ye);
    }
    return DDP_OK;
}

size_t ddp_dataset_num_tokens(const ddp_dataset *d)
{
    return d && d->kind == DS_TOKENS ? d->ntok : 0;
}

ddp_status ddp_dataset_get_windows(const ddp_dataset *d, const uint64_t *starts, size_t n,
                                   int32_t *x, int32_t *y, ddp_error *err)
{
    if (!d || d->kind != DS_TOKENS || (n && (!starts || !x || !y)))
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_dataset_get_windows: a token dataset, starts, x and y are required");
    size_t T = d->T;
    for (size_t k = 0; k < n; k++) {
        if (starts[k] > d->ntok - T - 1)
            return ddp__err(err, DDP_ERR_INVALID,
                            "window %zu starts at token %llu, past the last full window (%zu) "
                            "of a file of %zu tokens with sequence length %zu",
                            k, (unsigned long long)starts[k], d->ntok - T - 1, d->ntok, T);
        const uint16_t *t = d->tokens + starts[k];
        int32_t *xk = x + k * T, *yk = y + k * T;
        for (size_t j = 0; j < T; j++) {
            xk[j] = t[j];
            yk[j] = t[j + 1];
        }
    }
    return DDP_OK;
}
