/*
 * test_data.c — datasets and the loader: IDX (plain and gzip, with a concurrent one-time
 * decompression), token files in both layouts, every malformed-file error, loader batches equal
 * to the sampler's samples, the same for 0 (on the caller's thread), 1 and 4 threads, a bad
 * index reported in either mode, get_many against get, save/restore mid-epoch, and augmentation
 * (each image its original flipped or shifted within the limits, the draw a function of
 * (seed, epoch, key)), and the table of mapped files a SIGBUS handler reads (every file found
 * by its addresses while open, a full table, threads churning, a truncated file's fault).
 * Synthetic data encode their origin: pixel k of image i is (i + k) % 251, label i % 10, token
 * j is j % 50000 — so a wrong index shows as a wrong value.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "data/data.h" /* ddp__mapping_add / _remove: the table's own edges */
#include "ddp/ddp.h"

static char dir[256];

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

/* Writes an IDX pair of n images rows × cols; gz: gzip-compressed. Returns paths in a, b. */
static void write_idx(const char *name, size_t n, int rows, int cols, bool gz, char *a, char *b)
{
    sprintf(a, "%s/%s-images%s", dir, name, gz ? ".gz" : "");
    sprintf(b, "%s/%s-labels%s", dir, name, gz ? ".gz" : "");
    size_t isz = 16 + n * (size_t)rows * (size_t)cols, lsz = 8 + n;
    unsigned char *img = malloc(isz), *lab = malloc(lsz);
    put_be32(img, 0x803), put_be32(img + 4, (uint32_t)n), put_be32(img + 8, (uint32_t)rows);
    put_be32(img + 12, (uint32_t)cols);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < (size_t)rows * cols; k++)
            img[16 + i * rows * cols + k] = (unsigned char)((i + k) % 251);
    put_be32(lab, 0x801), put_be32(lab + 4, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        lab[8 + i] = (unsigned char)(i % 10);
    if (gz) {
        gzFile f = gzopen(a, "wb");
        gzwrite(f, img, (unsigned)isz);
        gzclose(f);
        f = gzopen(b, "wb");
        gzwrite(f, lab, (unsigned)lsz);
        gzclose(f);
    } else {
        FILE *f = fopen(a, "wb");
        fwrite(img, 1, isz, f);
        fclose(f);
        f = fopen(b, "wb");
        fwrite(lab, 1, lsz, f);
        fclose(f);
    }
    free(img);
    free(lab);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void check_idx(ddp_dataset *ds, size_t n, size_t pix)
{
    assert_int_equal(ddp_dataset_len(ds), n);
    assert_int_equal(ddp_dataset_x_elems(ds), pix);
    assert_int_equal(ddp_dataset_y_elems(ds), 1);
    assert_true(ddp_dataset_x_is_float(ds));
    assert_int_equal(ddp_dataset_classes(ds), n >= 10 ? 10 : (int)n);
    float *x = malloc(sizeof(float) * pix);
    int32_t y;
    for (size_t i = 0; i < n; i += 7) {
        assert_int_equal(ddp_dataset_get(ds, i, x, &y), DDP_OK);
        assert_int_equal(y, (int)(i % 10));
        for (size_t k = 0; k < pix; k++)
            assert_true(x[k] == (float)((i + k) % 251) * (1.0f / 255.0f));
    }
    assert_int_equal(ddp_dataset_get(ds, n, x, &y), DDP_ERR_INVALID);
    free(x);
}

static void idx_plain_and_gzip(void **state)
{
    (void)state;
    char a[512], b[512];
    ddp_dataset *ds;
    ddp_error err = {0};
    write_idx("plain", 100, 5, 3, false, a, b);
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, &err), DDP_OK);
    check_idx(ds, 100, 15);
    ddp_dataset_close(ds);

    write_idx("zipped", 300, 4, 4, true, a, b);
    char cache[300];
    sprintf(cache, "%s/cache", dir);
    /* Four processes open it at once: one decompresses, the others wait and reuse it. */
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            ddp_dataset *d;
            ddp_error e = {0};
            if (ddp_dataset_open_idx(a, b, cache, &d, &e) != DDP_OK || ddp_dataset_len(d) != 300)
                _exit(1);
            ddp_dataset_close(d);
            _exit(0);
        }
    }
    for (int k = 0; k < 4; k++) {
        int st;
        waitpid(kids[k], &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    assert_int_equal(ddp_dataset_open_idx(a, b, cache, &ds, &err), DDP_OK);
    check_idx(ds, 300, 16);
    ddp_dataset_close(ds);
}

static void expect_error(ddp_status st, const ddp_error *err, ddp_status want, const char *a,
                         const char *b)
{
    assert_int_equal(st, want);
    if (!strstr(err->msg, a) || (b && !strstr(err->msg, b)))
        fail_msg("message '%s' lacks '%s' / '%s'", err->msg, a, b ? b : "");
}

static void idx_malformed(void **state)
{
    (void)state;
    char a[512], b[512], c[512], d2[512];
    ddp_dataset *ds = (ddp_dataset *)0x1;
    ddp_error err = {0};
    write_idx("good", 20, 2, 2, false, a, b);
    write_idx("other", 21, 2, 2, false, c, d2);
    expect_error(ddp_dataset_open_idx(a, d2, NULL, &ds, &err), &err, DDP_ERR_INVALID,
                 "has 20 images", "has 21 labels");
    assert_ptr_equal(ds, (ddp_dataset *)0x1); /* *out untouched on failure */
    expect_error(ddp_dataset_open_idx(b, b, NULL, &ds, &err), &err, DDP_ERR_INVALID,
                 "is not an IDX image file", b);
    /* truncated images */
    char t[512];
    sprintf(t, "%s/trunc-images", dir);
    FILE *f = fopen(a, "rb");
    unsigned char buf[200];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(t, buf, n - 5);
    expect_error(ddp_dataset_open_idx(t, b, NULL, &ds, &err), &err, DDP_ERR_INVALID, "is truncated",
                 t);
    sprintf(t, "%s/missing-images", dir);
    expect_error(ddp_dataset_open_idx(t, b, NULL, &ds, &err), &err, DDP_ERR_NOT_FOUND,
                 "cannot open data file", t);
    /* a corrupt gzip */
    sprintf(t, "%s/corrupt-images.gz", dir);
    write_bytes(t, "\x1f\x8b\x08\x00garbage-garbage-garbage", 28);
    expect_error(ddp_dataset_open_idx(t, b, NULL, &ds, &err), &err, DDP_ERR_INVALID,
                 "corrupt-images.gz", NULL);
}

static void tokens_both_layouts(void **state)
{
    (void)state;
    size_t nt = 10001;
    uint16_t *tok = malloc(2 * nt);
    for (size_t j = 0; j < nt; j++)
        tok[j] = (uint16_t)(j % 50000);
    char raw[512], llmc[512];
    sprintf(raw, "%s/train.bin", dir);
    write_bytes(raw, tok, 2 * nt);
    sprintf(llmc, "%s/shard.bin", dir);
    unsigned char *sh = calloc(1, 1024 + 2 * nt);
    int32_t hdr[3] = {20240520, 1, (int32_t)nt};
    memcpy(sh, hdr, sizeof hdr);
    memcpy(sh + 1024, tok, 2 * nt);
    write_bytes(llmc, sh, 1024 + 2 * nt);
    const char *paths[2] = {raw, llmc};
    for (int p = 0; p < 2; p++) {
        ddp_dataset *ds;
        ddp_error err = {0};
        assert_int_equal(ddp_dataset_open_tokens(paths[p], 64, &ds, &err), DDP_OK);
        assert_int_equal(ddp_dataset_len(ds), (nt - 1) / 64);
        assert_false(ddp_dataset_x_is_float(ds));
        int32_t x[64], y[64];
        assert_int_equal(ddp_dataset_get(ds, 5, x, y), DDP_OK);
        for (int k = 0; k < 64; k++) {
            assert_int_equal(x[k], 5 * 64 + k);
            assert_int_equal(y[k], 5 * 64 + k + 1);
        }
        ddp_dataset_close(ds);
    }
    /* malformed: odd size, a header that lies, a wrong version, too short */
    ddp_dataset *ds;
    ddp_error err = {0};
    char bad[512];
    sprintf(bad, "%s/odd.bin", dir);
    write_bytes(bad, tok, 2 * nt - 1);
    expect_error(ddp_dataset_open_tokens(bad, 64, &ds, &err), &err, DDP_ERR_INVALID,
                 "odd number of bytes", bad);
    hdr[2] = (int32_t)nt + 5;
    memcpy(sh, hdr, sizeof hdr);
    sprintf(bad, "%s/lies.bin", dir);
    write_bytes(bad, sh, 1024 + 2 * nt);
    expect_error(ddp_dataset_open_tokens(bad, 64, &ds, &err), &err, DDP_ERR_INVALID,
                 "header says 10006 tokens", bad);
    hdr[1] = 7;
    hdr[2] = (int32_t)nt;
    memcpy(sh, hdr, sizeof hdr);
    write_bytes(bad, sh, 1024 + 2 * nt);
    expect_error(ddp_dataset_open_tokens(bad, 64, &ds, &err), &err, DDP_ERR_INVALID, "version 7",
                 bad);
    hdr[0] = 20240801; /* llm.c's Llama 3 shard (uint32 ids): named, not read as uint16 ids */
    memcpy(sh, hdr, sizeof hdr);
    write_bytes(bad, sh, 1024 + 2 * nt);
    expect_error(ddp_dataset_open_tokens(bad, 64, &ds, &err), &err, DDP_ERR_INVALID,
                 "uint32 ids (magic 20240801", bad);
    hdr[0] = 20240520;
    sprintf(bad, "%s/short.bin", dir);
    write_bytes(bad, tok, 20);
    expect_error(ddp_dataset_open_tokens(bad, 64, &ds, &err), &err, DDP_ERR_INVALID,
                 "fewer than one sequence", bad);
    /* a folder (data.val DIR instead of DIR/val.bin): said so, not "cannot map: No such
     * device" */
    expect_error(ddp_dataset_open_tokens(dir, 64, &ds, &err), &err, DDP_ERR_INVALID,
                 "is a directory, not a data file", dir);
    free(tok);
    free(sh);
}

/* Reads a whole epoch into flat arrays of labels and first pixels. */
static size_t read_epoch(ddp_loader *l, int32_t *labels, float *first)
{
    ddp_batch bt;
    size_t got = 0;
    while (ddp_loader_next(l, &bt) == DDP_OK && bt.n > 0) {
        for (size_t k = 0; k < bt.n; k++) {
            labels[got] = bt.y[k];
            first[got] = ((float *)bt.x)[k * 9];
            got++;
        }
    }
    return got;
}

static void loader_matches_sampler_any_threads(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("loader", 1000, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    int32_t lab[3][1000];
    float px[3][1000];
    size_t got[3];
    int threads[3] = {0, 1, 4}; /* 0: filled on the caller's thread */
    for (int t = 0; t < 3; t++) {
        ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
        so.dataset_size = 1000, so.num_replicas = 3, so.rank = 1, so.seed = 9;
        ddp_sampler *s;
        assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = 16, lo.threads = threads[t], lo.depth = 3, lo.drop_last = false;
        ddp_loader *l;
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
        assert_int_equal(ddp_loader_set_epoch(l, 2), DDP_OK);
        got[t] = read_epoch(l, lab[t], px[t]);
        assert_int_equal(got[t], ddp_sampler_len(s)); /* 334: the last batch is partial */
        const uint64_t *idx = ddp_sampler_indices(s);
        for (size_t i = 0; i < got[t]; i++) {
            assert_int_equal(lab[t][i], (int)(idx[i] % 10));
            assert_true(px[t][i] == (float)(idx[i] % 251) * (1.0f / 255.0f));
        }
        ddp_loader_destroy(l);
        ddp_sampler_destroy(s);
    }
    for (int t = 1; t < 3; t++) {
        assert_int_equal(got[0], got[t]);
        assert_memory_equal(lab[0], lab[t], sizeof(int32_t) * got[0]);
        assert_memory_equal(px[0], px[t], sizeof(float) * got[0]);
    }
    ddp_dataset_close(ds);
}

/* Threads the system refuses (RLIMIT_NPROC; EAGAIN from pthread_create) are not an error: the
 * loader fills batches on the caller's thread and says so through ddp_loader_threads, the same
 * batches (it was an error until 2026-11-26: ddptrain's evaluation then ended a run before its
 * last checkpoint). Root ignores RLIMIT_NPROC, so a child becomes nobody first: root only. */
static void loader_without_threads(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    char a[512], b[512];
    write_idx("nothreads", 200, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit one = {1, 1};
        if (setgid(65534) != 0 || setuid(65534) != 0 || setrlimit(RLIMIT_NPROC, &one) != 0)
            _exit(10);
        ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
        so.dataset_size = 200, so.num_replicas = 1, so.rank = 0, so.seed = 3;
        ddp_sampler *s;
        ddp_loader *l;
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = 16, lo.threads = 2, lo.drop_last = false;
        if (ddp_sampler_create(&so, &s, NULL) != DDP_OK || ddp_loader_create(ds, s, &lo, &l, NULL))
            _exit(11);
        if (ddp_loader_threads(l) != 0)
            _exit(12); /* the limit did not bite: the test tests nothing */
        int32_t lab[200];
        float px[200];
        size_t got = read_epoch(l, lab, px);
        const uint64_t *idx = ddp_sampler_indices(s);
        if (got != 200)
            _exit(13);
        for (size_t i = 0; i < got; i++)
            if (lab[i] != (int)(idx[i] % 10) || px[i] != (float)(idx[i] % 251) * (1.0f / 255.0f))
                _exit(14);
        ddp_loader_destroy(l);
        ddp_sampler_destroy(s);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child without threads: status %#x (10 set-up, 11 create failed, 12 threads "
                 "started, 13/14 wrong batches)",
                 status);
    assert_int_equal(ddp_loader_threads(NULL), 0);
    ddp_dataset_close(ds);
}

/* get_many gives what get gives sample by sample, and names the position of a bad index. */
static void dataset_get_many(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("many", 300, 5, 7, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    uint64_t idx[40];
    for (int i = 0; i < 40; i++)
        idx[i] = (uint64_t)(i * 37 + 11) % 300;
    float x[40 * 35], one[35];
    int32_t y[40], y1;
    assert_int_equal(ddp_dataset_get_many(ds, idx, 40, x, y, NULL), DDP_OK);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(ddp_dataset_get(ds, (size_t)idx[i], one, &y1), DDP_OK);
        assert_memory_equal(x + i * 35, one, sizeof one);
        assert_int_equal(y[i], y1);
    }
    idx[17] = 300;
    size_t bad = 0;
    assert_int_equal(ddp_dataset_get_many(ds, idx, 40, x, y, &bad), DDP_ERR_INVALID);
    assert_int_equal(bad, 17);
    assert_int_equal(ddp_dataset_get_many(ds, idx, 0, NULL, NULL, NULL), DDP_OK);
    /* get with a NULL x or y is refused like get_many (it crashed) */
    assert_int_equal(ddp_dataset_get(ds, 0, NULL, &y1), DDP_ERR_INVALID);
    assert_int_equal(ddp_dataset_get(ds, 0, one, NULL), DDP_ERR_INVALID);
    ddp_dataset_close(ds);
}

/* A sampler over more samples than the dataset has is refused by create, before any batch; so
 * are a negative threads, a depth of 1 or below 0, and a sampler with drop_last in exact mode. */
static void loader_refuses_bad_options(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("badidx", 50, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    ddp_error err;
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 80, so.shuffle = false;
    ddp_sampler *s;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = 20;
    ddp_loader *l = NULL;
    expect_error(ddp_loader_create(ds, s, &lo, &l, &err), &err, DDP_ERR_INVALID,
                 "sampler was made for 80 samples but the dataset has 50", NULL);
    assert_null(l);
    ddp_sampler_destroy(s);
    so.dataset_size = 50;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    int bad[][2] = {{-1, 2}, {0, 1}, {1, -3}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lo.threads = bad[i][0], lo.depth = bad[i][1];
        expect_error(ddp_loader_create(ds, s, &lo, &l, &err), &err, DDP_ERR_INVALID,
                     "threads is 0 or more, depth 0 (double buffering) or 2 or more", NULL);
    }
    lo.threads = 1, lo.depth = 0; /* 0: double buffering */
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
    ddp_batch bt;
    size_t seen = 0;
    while (ddp_loader_next(l, &bt) == DDP_OK && bt.n)
        seen += bt.n;
    assert_int_equal(seen, 40); /* drop_last: two full batches of 20 */
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    so.mode = DDP_SAMPLER_EXACT, so.drop_last = true;
    expect_error(ddp_sampler_create(&so, &s, &err), &err, DDP_ERR_INVALID,
                 "drop_last with DDP_SAMPLER_EXACT", NULL);
    so.mode = (ddp_sampler_mode)5, so.drop_last = false;
    expect_error(ddp_sampler_create(&so, &s, &err), &err, DDP_ERR_INVALID, "mode 5 is not", NULL);
    ddp_dataset_close(ds);
}

/* A batch_size whose batch does not fit in size_t bytes is refused: 2^62 samples of 36 bytes
 * wrapped to malloc(0), and the first batch then wrote the whole epoch past it. A failed restore
 * leaves the position where it was (it had moved to the epoch's start). */
static void loader_huge_batch_and_bad_restore(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("hugebatch", 50, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 50, so.shuffle = false;
    ddp_sampler *s;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    ddp_error err;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.drop_last = false, lo.threads = 0;
    size_t huge[] = {(size_t)1 << 62, SIZE_MAX, SIZE_MAX / 36 + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        lo.batch_size = huge[i];
        ddp_loader *l = NULL;
        expect_error(ddp_loader_create(ds, s, &lo, &l, &err), &err, DDP_ERR_INVALID, "batch_size",
                     "too large");
        assert_null(l);
    }
    lo.batch_size = 1000; /* larger than the epoch but fine: one partial batch */
    ddp_loader *l;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
    assert_int_equal(ddp_loader_batches_per_epoch(l), 1);
    ddp_batch bt;
    assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
    assert_int_equal(bt.n, 50);
    ddp_loader_destroy(l);

    lo.batch_size = 5, lo.threads = 1;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
    assert_int_equal(ddp_loader_set_epoch(l, 2), DDP_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
    ddp_loader_state bad = {7, 11}, at;
    assert_int_equal(ddp_loader_restore(l, &bad), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_loader_last_error(l), "batch 11 is past the epoch's 10"));
    ddp_loader_save(l, &at);
    assert_int_equal(at.epoch, 2);
    assert_int_equal(at.next_batch, 4);
    assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
    assert_int_equal(bt.epoch, 2);
    assert_int_equal(bt.index, 4);
    assert_int_equal(bt.y[0], 20 % 10); /* unshuffled: batch 4 starts at sample 20 */
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
}

/* The transform test's context: which (epoch, batch) to fail, and a count of calls. */
typedef struct xform_ctx {
    uint64_t fail_epoch, fail_batch;
    int calls; /* atomically */
} xform_ctx;

/* Marks each sample: y += 1000 + its dataset index, and the first pixel = the batch number. */
static ddp_status mark_batch(void *ctx, const ddp_batch *b, const uint64_t *idx, char *msg)
{
    xform_ctx *c = ctx;
    __atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
    if (b->epoch == c->fail_epoch && b->index == c->fail_batch) {
        snprintf(msg, DDP_ERRMSG_MAX, "sample %llu is unreadable", (unsigned long long)idx[0]);
        return DDP_ERR_SYSTEM;
    }
    for (size_t k = 0; k < b->n; k++) {
        b->y[k] += 1000 + (int32_t)idx[k];
        ((float *)b->x)[k * 9] = (float)b->index;
    }
    return DDP_OK;
}

/* The transform runs on every batch, with its dataset indices, whatever the thread count; a
 * batch it fails is reported when next() reaches it — the batches before come out first (a
 * worker that ran ahead failed the whole loader at once before) — and again until set_epoch. */
static void loader_transform(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("xform", 200, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 200, so.num_replicas = 2, so.rank = 1, so.seed = 5;
    ddp_sampler *s;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    int threads[] = {0, 1, 3};
    for (int t = 0; t < 3; t++) {
        xform_ctx c = {.fail_epoch = 1, .fail_batch = 4};
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = 8, lo.threads = threads[t], lo.depth = 6, lo.drop_last = false;
        lo.transform = mark_batch, lo.transform_ctx = &c;
        ddp_loader *l;
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
        const uint64_t *idx = ddp_sampler_indices(s);
        ddp_batch bt;
        size_t got = 0;
        while (ddp_loader_next(l, &bt) == DDP_OK && bt.n) {
            for (size_t k = 0; k < bt.n; k++, got++) {
                assert_int_equal(bt.y[k], (int)(idx[got] % 10) + 1000 + (int)idx[got]);
                assert_true(((float *)bt.x)[k * 9] == (float)bt.index);
            }
        }
        assert_int_equal(got, 100);
        assert_int_equal(c.calls, 13);
        assert_int_equal(ddp_loader_set_epoch(l, 1), DDP_OK);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
            assert_int_equal(bt.index, i);
            assert_int_equal(bt.y[0], (int)(ddp_sampler_indices(s)[i * 8] % 10) + 1000 +
                                          (int)ddp_sampler_indices(s)[i * 8]);
        }
        char want[128];
        snprintf(want, sizeof want, "transforming batch 4 of epoch 1: sample %llu is unreadable",
                 (unsigned long long)ddp_sampler_indices(s)[32]);
        for (int again = 0; again < 2; again++) {
            assert_int_equal(ddp_loader_next(l, &bt), DDP_ERR_SYSTEM);
            if (!strstr(ddp_loader_last_error(l), want))
                fail_msg("'%s' lacks '%s'", ddp_loader_last_error(l), want);
        }
        assert_int_equal(ddp_loader_set_epoch(l, 2), DDP_OK); /* afresh */
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
        assert_int_equal(bt.n, 8);
        ddp_loader_destroy(l); /* mid-epoch, workers still transforming */
    }
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
}

/* A transform that holds batch 2 until released (atomically). */
static ddp_status hold_batch2(void *ctx, const ddp_batch *b, const uint64_t *idx, char *msg)
{
    (void)idx, (void)msg;
    int *release = ctx;
    while (b->index == 2 && !__atomic_load_n(release, __ATOMIC_ACQUIRE))
        nanosleep(&(struct timespec){0, 1000000L}, NULL);
    return DDP_OK;
}

/* torch DataLoader's timeout: next() gives up on a batch a worker is stuck on after timeout_s,
 * naming it, and the loader still hands it out once it comes. Before, next() had no deadline:
 * a transform that never returned hung the trainer. Bad timeouts are refused at creation. */
static void loader_timeout(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("tmo", 40, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 40, so.shuffle = false;
    ddp_sampler *s;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    ddp_loader *l = NULL;
    ddp_error err;
    double bad[] = {-1, NAN};
    for (int i = 0; i < 2; i++) {
        lo.timeout_s = bad[i];
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l, &err), DDP_ERR_INVALID);
        assert_non_null(strstr(err.msg, "timeout_s"));
    }
    lo.timeout_s = 1, lo.threads = 0;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "threads ≥ 1"));

    int release = 0;
    lo.batch_size = 4, lo.threads = 2, lo.depth = 4, lo.timeout_s = 0.2;
    lo.transform = hold_batch2, lo.transform_ctx = &release;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, &err), DDP_OK);
    ddp_batch bt;
    for (int i = 0; i < 2; i++) {
        /* Batches 0 and 1 are not held, but a worker descheduled for 0.2 s on a loaded host
         * (TSan, four tests on two cores) makes next() time out on them too: ask again (a batch
         * that timed out is still handed out once it comes), up to 20 s. */
        ddp_status st;
        for (int k = 0; (st = ddp_loader_next(l, &bt)) == DDP_ERR_TIMEOUT && k < 100; k++)
            ;
        assert_int_equal(st, DDP_OK);
        assert_int_equal(bt.index, i);
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ddp_loader_next(l, &bt), DDP_ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long waited = (t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L;
    if (!(waited >= 200 && waited < 5000))
        fail_msg("next() gave up after %ld ms, not 0.2 s", waited);
    const char *want = "batch 2 of epoch 0 was not ready after the loader's timeout of 0.2 s (a "
                       "worker is still reading it or in the transform)";
    if (!strstr(ddp_loader_last_error(l), want))
        fail_msg("'%s' lacks '%s'", ddp_loader_last_error(l), want);
    __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
    assert_int_equal(ddp_loader_next(l, &bt), DDP_OK); /* it came after all */
    assert_int_equal(bt.index, 2);
    assert_int_equal(bt.y[0], 8 % 10);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
}

/* A PyTorch loop sets the sampler's epoch (train_sampler.set_epoch(epoch)) and iterates the
 * loader: the loader follows the sampler to that epoch. It kept reporting the end of epoch 0, so
 * every later epoch had no batch at all and training silently stopped after the first. */
static void loader_follows_sampler_epoch(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("follow", 120, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    int threads[] = {0, 2};
    for (int t = 0; t < 2; t++) {
        ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
        so.dataset_size = 120, so.num_replicas = 2, so.rank = 0, so.seed = 3;
        ddp_sampler *s;
        assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = 10, lo.threads = threads[t];
        ddp_loader *l;
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
        for (uint64_t e = 0; e < 3; e++) {
            assert_int_equal(ddp_sampler_set_epoch(s, e), DDP_OK);
            int32_t lab[60];
            float px[60];
            assert_int_equal(read_epoch(l, lab, px), 60);
            const uint64_t *idx = ddp_sampler_indices(s);
            for (size_t i = 0; i < 60; i++)
                assert_int_equal(lab[i], (int)(idx[i] % 10));
            ddp_loader_state st;
            ddp_loader_save(l, &st);
            assert_int_equal(st.epoch, e);
            assert_int_equal(st.next_batch, 6);
        }
        /* Setting the loader's epoch keeps working, and so does the sampler's at the same epoch
         * (no restart: the loader is already there). */
        assert_int_equal(ddp_loader_set_epoch(l, 7), DDP_OK);
        ddp_batch bt;
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
        assert_int_equal(ddp_sampler_set_epoch(s, 7), DDP_OK);
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
        assert_int_equal(bt.epoch, 7);
        assert_int_equal(bt.index, 1);
        ddp_loader_destroy(l);
        ddp_sampler_destroy(s);
    }
    ddp_dataset_close(ds);
}

static void save_restore(int threads)
{
    char a[512], b[512];
    write_idx("resume", 500, 3, 3, false, a, b);
    ddp_dataset *ds;
    assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 500, so.num_replicas = 2, so.seed = 4;
    ddp_sampler *s;
    assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = 10, lo.threads = threads;
    ddp_loader *l;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
    assert_int_equal(ddp_loader_batches_per_epoch(l), 25);
    ddp_loader_set_epoch(l, 3);
    int32_t full[250], rest[250];
    float fp[250], rp[250];
    assert_int_equal(read_epoch(l, full, fp), 250);
    /* Stop after 7 batches, save, go elsewhere, restore: the rest is the same. */
    ddp_loader_set_epoch(l, 3);
    ddp_batch bt;
    for (int i = 0; i < 7; i++)
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
    ddp_loader_state st;
    ddp_loader_save(l, &st);
    assert_int_equal(st.epoch, 3);
    assert_int_equal(st.next_batch, 7);
    ddp_loader_set_epoch(l, 5);
    assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
    assert_int_equal(ddp_loader_restore(l, &st), DDP_OK);
    assert_int_equal(read_epoch(l, rest, rp), 180);
    assert_memory_equal(rest, full + 70, sizeof(int32_t) * 180);
    assert_memory_equal(rp, fp + 70, sizeof(float) * 180);
    /* A new loader restored from the state gives the same too (a resumed run). */
    ddp_loader *l2;
    assert_int_equal(ddp_loader_create(ds, s, &lo, &l2, NULL), DDP_OK);
    assert_int_equal(ddp_loader_restore(l2, &st), DDP_OK);
    assert_int_equal(read_epoch(l2, rest, rp), 180);
    assert_memory_equal(rest, full + 70, sizeof(int32_t) * 180);
    st.next_batch = 99;
    assert_int_equal(ddp_loader_restore(l2, &st), DDP_ERR_INVALID);
    ddp_loader_destroy(l2);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
}

static void loader_save_restore(void **state)
{
    (void)state;
    save_restore(2);
    save_restore(0);
}

/* Which (flip, dy, dx) turns img into out, by trying every candidate; -1 if none does. */
static int find_transform(const float *img, const float *out, int h, int w, int shift, int *fl,
                          int *dy, int *dx)
{
    int found = 0;
    for (int f = 0; f < 2; f++)
        for (int y0 = -shift; y0 <= shift; y0++)
            for (int x0 = -shift; x0 <= shift; x0++) {
                bool same = true;
                for (int y = 0; y < h && same; y++)
                    for (int x = 0; x < w && same; x++) {
                        int sy = y + y0, sx = (f ? w - 1 - x : x) + x0;
                        float want = sy >= 0 && sy < h && sx >= 0 && sx < w ? img[sy * w + sx] : 0;
                        same = out[y * w + x] == want;
                    }
                if (same) {
                    *fl = f, *dy = y0, *dx = x0;
                    found++;
                }
            }
    return found == 1 ? 0 : -1;
}

/* Every augmented image is its original flipped and/or shifted (zeros filling in) within the
 * limits; flips come half the time and every shift appears; the draw depends on (seed, epoch,
 * key) only; bad options are errors. */
static void augment_images(void **state)
{
    (void)state;
    enum { N = 600, H = 6, W = 5, C = 2 };
    static float orig[N * C * H * W], x[N * C * H * W], again[N * C * H * W];
    uint64_t keys[N];
    for (int i = 0; i < N * C * H * W; i++)
        orig[i] = 1.0f + (float)(i % 997); /* distinct within an image, never 0 */
    for (int k = 0; k < N; k++)
        keys[k] = (uint64_t)k * 7919u;
    ddp_augment a = {.hflip = true, .shift = 2, .seed = 5};
    memcpy(x, orig, sizeof x);
    assert_int_equal(ddp_augment_images(&a, x, N, C, H, W, keys, 3, NULL), DDP_OK);
    int flips = 0, seen[5][5] = {{0}};
    for (int k = 0; k < N; k++) {
        int f, dy, dx;
        const float *o = orig + (size_t)k * C * H * W, *g = x + (size_t)k * C * H * W;
        assert_int_equal(find_transform(o, g, H, W, 2, &f, &dy, &dx), 0);
        int f2, dy2, dx2; /* the second channel moved the same way */
        assert_int_equal(find_transform(o + H * W, g + H * W, H, W, 2, &f2, &dy2, &dx2), 0);
        assert_true(f == f2 && dy == dy2 && dx == dx2);
        flips += f;
        seen[dy + 2][dx + 2]++;
    }
    assert_in_range(flips, N / 2 - 75, N / 2 + 75);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++)
            assert_true(seen[i][j] > 0);
    /* The same (seed, epoch, key) gives the same image, in any batch order; another epoch does
     * not. */
    memcpy(again, orig, sizeof again);
    for (int k = N - 1; k >= 0; k--)
        assert_int_equal(
            ddp_augment_images(&a, again + (size_t)k * C * H * W, 1, C, H, W, &keys[k], 3, NULL),
            DDP_OK);
    assert_memory_equal(x, again, sizeof x);
    memcpy(again, orig, sizeof again);
    assert_int_equal(ddp_augment_images(&a, again, N, C, H, W, keys, 4, NULL), DDP_OK);
    assert_memory_not_equal(x, again, sizeof x);
    /* Off: untouched. Flip only: no shift. */
    ddp_augment off = {.seed = 5};
    memcpy(x, orig, sizeof x);
    assert_int_equal(ddp_augment_images(&off, x, N, C, H, W, keys, 3, NULL), DDP_OK);
    assert_memory_equal(x, orig, sizeof x);
    ddp_augment fl = {.hflip = true, .seed = 5};
    assert_int_equal(ddp_augment_images(&fl, x, N, C, H, W, keys, 3, NULL), DDP_OK);
    for (int k = 0; k < N; k++) {
        int f, dy, dx;
        assert_int_equal(find_transform(orig + (size_t)k * C * H * W, x + (size_t)k * C * H * W, H,
                                        W, 0, &f, &dy, &dx),
                         0);
    }
    ddp_error err;
    ddp_augment bad = {.shift = 5};
    assert_int_equal(ddp_augment_images(&bad, x, N, C, H, W, keys, 0, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "shift 5 must be from 0 to 4"));
    assert_int_equal(ddp_augment_images(&a, NULL, 1, C, H, W, keys, 0, &err), DDP_ERR_INVALID);
}

/* The dataset closed, or the sampler destroyed, before the loader over them (cleanup in the
 * order of creation): the loader's workers went on reading the unmapped dataset or the freed
 * sampler (SIGSEGV). Now the loader stops its workers first; its calls then fail with
 * DDP_ERR_CLOSED saying what to do, and its destroy is safe. Both orders, with worker threads
 * and without. */
static void loader_outlives_its_inputs(void **state)
{
    (void)state;
    char a[512], b[512];
    write_idx("outlive", 600, 8, 8, false, a, b);
    for (int k = 0; k < 4; k++) {
        bool ds_first = k % 2 == 0;
        ddp_dataset *ds;
        assert_int_equal(ddp_dataset_open_idx(a, b, NULL, &ds, NULL), DDP_OK);
        ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
        so.dataset_size = 600;
        ddp_sampler *s;
        assert_int_equal(ddp_sampler_create(&so, &s, NULL), DDP_OK);
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = 4, lo.threads = k < 2 ? 2 : 0, lo.depth = 8;
        ddp_loader *l, *l2;
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l, NULL), DDP_OK);
        assert_int_equal(ddp_loader_create(ds, s, &lo, &l2, NULL), DDP_OK); /* two over one */
        ddp_batch bt;
        assert_int_equal(ddp_loader_next(l, &bt), DDP_OK);
        if (ds_first)
            ddp_dataset_close(ds);
        else
            ddp_sampler_destroy(s);
        assert_int_equal(ddp_loader_next(l, &bt), DDP_ERR_CLOSED);
        const char *want = ds_first ? "its dataset was closed (ddp_dataset_close) before it"
                                    : "its sampler was destroyed (ddp_sampler_destroy) before it";
        if (!strstr(ddp_loader_last_error(l), want) ||
            !strstr(ddp_loader_last_error(l), "destroy the loader first"))
            fail_msg("message '%s'", ddp_loader_last_error(l));
        assert_int_equal(ddp_loader_next(l2, &bt), DDP_ERR_CLOSED);
        assert_int_equal(ddp_loader_set_epoch(l, 1), DDP_ERR_CLOSED);
        ddp_loader_state st = {0, 0};
        assert_int_equal(ddp_loader_restore(l, &st), DDP_ERR_CLOSED);
        ddp_loader_save(l, &st);
        if (!ds_first) /* it counted with the freed sampler */
            assert_int_equal(ddp_loader_batches_per_epoch(l), 0);
        ddp_loader_destroy(l);
        if (ds_first)
            ddp_sampler_destroy(s);
        else
            ddp_dataset_close(ds);
        ddp_loader_destroy(l2); /* after both */
    }
}

/* ---- the file mappings' table (ddp_data_mapping_at) ------------------------------------------ */

/* The first address /proc/self/maps shows path mapped at, or NULL. */
static const unsigned char *mapped_at(const char *path)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    const unsigned char *at = NULL;
    while (f && !at && fgets(line, sizeof line, f)) {
        unsigned long long lo;
        int name = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%llx-%*x %*s %*s %*s %*s %n", &lo, &name) == 1 && name > 0 &&
            strcmp(line + name, path) == 0)
            at = (const unsigned char *)(uintptr_t)lo;
    }
    if (f)
        fclose(f);
    return at;
}

/* Writes nt raw uint16 tokens (token j is j % 50000) to path. */
static void write_tokens(const char *path, size_t nt)
{
    uint16_t *tok = malloc(2 * nt);
    for (size_t j = 0; j < nt; j++)
        tok[j] = (uint16_t)(j % 50000);
    write_bytes(path, tok, 2 * nt);
    free(tok);
}

/* Every file the library maps is found by any address in it, with its path, offset, length and
 * kind; nothing outside it, and nothing once closed. */
static void mappings_name_open_files(void **state)
{
    (void)state;
    char tok[512], im[512], lb[512], ck[512];
    sprintf(tok, "%s/map-tokens.bin", dir);
    write_tokens(tok, 5000);
    write_idx("map", 20, 4, 4, false, im, lb);
    ddp_dataset *t, *idx;
    ddp_error err = {0};
    assert_int_equal(ddp_dataset_open_tokens(tok, 8, &t, &err), DDP_OK);
    assert_int_equal(ddp_dataset_open_idx(im, lb, NULL, &idx, &err), DDP_OK);
    const unsigned char *bt = mapped_at(tok), *bi = mapped_at(im), *bl = mapped_at(lb);
    assert_non_null(bt);
    assert_non_null(bi);
    assert_non_null(bl);
    ddp_mapping_info m;
    assert_true(ddp_data_mapping_at(bt + 100, &m));
    assert_string_equal(m.path, tok);
    assert_int_equal(m.offset, 100);
    assert_int_equal(m.length, 10000);
    assert_int_equal(m.kind, DDP_MAPPING_DATA);
    assert_true(ddp_data_mapping_at(bt, &m));
    assert_int_equal(m.offset, 0);
    assert_true(ddp_data_mapping_at(bt + 9999, &m));
    assert_int_equal(m.offset, 9999);
    assert_false(ddp_data_mapping_at(bt + 10000, &m)); /* the page's rest, past the file */
    assert_false(ddp_data_mapping_at(NULL, &m));
    assert_false(ddp_data_mapping_at(bt, NULL));
    assert_true(ddp_data_mapping_at(bi + 16 + 5 * 16, &m)); /* image 5 */
    assert_string_equal(m.path, im);
    assert_int_equal(m.offset, 96);
    assert_int_equal(m.length, 16 + 20 * 16);
    assert_true(ddp_data_mapping_at(bl + 8, &m));
    assert_string_equal(m.path, lb);
    assert_int_equal(m.length, 8 + 20);
    /* a checkpoint: the same, as a checkpoint */
    sprintf(ck, "%s/map.safetensors", dir);
    float w[256];
    for (int i = 0; i < 256; i++)
        w[i] = (float)i;
    ddp_ckpt_tensor ten = {"w", DDP_FLOAT32, 1, {256}, w};
    assert_int_equal(ddp_ckpt_save(ck, &ten, 1, NULL, NULL, 0, &err), DDP_OK);
    ddp_ckpt *c;
    assert_int_equal(ddp_ckpt_open(ck, &c, &err), DDP_OK);
    const unsigned char *data = ddp_ckpt_find(c, "w")->data;
    assert_true(ddp_data_mapping_at(data + 4, &m));
    assert_string_equal(m.path, ck);
    assert_int_equal(m.kind, DDP_MAPPING_CHECKPOINT);
    assert_int_equal(m.offset, (size_t)(data + 4 - mapped_at(ck)));
    ddp_ckpt_close(c);
    assert_false(ddp_data_mapping_at(data + 4, &m));
    ddp_dataset_close(t);
    ddp_dataset_close(idx);
    assert_false(ddp_data_mapping_at(bt + 100, &m));
    assert_false(ddp_data_mapping_at(bi + 16, &m));
    assert_false(ddp_data_mapping_at(bl + 8, &m));
}

typedef struct churn {
    int id;
    atomic_bool stop;
    atomic_size_t rounds;
} churn;

/* Adds and removes a range of its own over and over (another thread opening and closing
 * datasets) while the test's thread looks up a mapping that stays. */
static void *churn_run(void *arg)
{
    churn *c = arg;
    static char ranges[2][4096];
    char path[64];
    snprintf(path, sizeof path, "/churn/%d", c->id);
    while (!atomic_load(&c->stop)) {
        if (ddp__mapping_add(ranges[c->id], sizeof ranges[c->id], path, DDP_MAPPING_DATA))
            ddp__mapping_remove(ranges[c->id]);
        atomic_fetch_add(&c->rounds, 1);
    }
    return NULL;
}

/* The table itself: a full table refuses (and the mappings in it are still found), a long path
 * keeps its end, removal frees a slot, and lookups are right while other threads churn. */
static void mappings_table(void **state)
{
    (void)state;
    static char area[DDP_DATA_MAPPINGS_MAX + 1][64];
    ddp_mapping_info m;
    size_t added = 0;
    while (added < DDP_DATA_MAPPINGS_MAX + 1 &&
           ddp__mapping_add(area[added], sizeof area[added], "/area", DDP_MAPPING_DATA))
        added++;
    /* full (DDP_DATA_MAPPINGS_MAX, less what other tests left open: none, unless they leak) */
    assert_true(added > 8 && added <= DDP_DATA_MAPPINGS_MAX);
    assert_false(ddp_data_mapping_at(area[added], &m)); /* refused: not found */
    assert_true(ddp_data_mapping_at(area[7] + 63, &m));
    assert_int_equal(m.offset, 63);
    assert_string_equal(m.path, "/area");
    ddp__mapping_remove(area[7]);
    assert_false(ddp_data_mapping_at(area[7], &m));
    assert_true(ddp_data_mapping_at(area[8], &m));
    assert_true(ddp__mapping_add(area[DDP_DATA_MAPPINGS_MAX], 64, "/last", DDP_MAPPING_CHECKPOINT));
    assert_true(ddp_data_mapping_at(area[DDP_DATA_MAPPINGS_MAX] + 1, &m));
    assert_string_equal(m.path, "/last");
    assert_int_equal(m.kind, DDP_MAPPING_CHECKPOINT);
    ddp__mapping_remove(area[DDP_DATA_MAPPINGS_MAX]);
    for (size_t i = 0; i < DDP_DATA_MAPPINGS_MAX; i++)
        ddp__mapping_remove(area[i]); /* area[7] again: a no-op */
    for (size_t i = 0; i <= DDP_DATA_MAPPINGS_MAX; i++)
        assert_false(ddp_data_mapping_at(area[i], &m));
    assert_false(ddp__mapping_add(NULL, 64, "/x", DDP_MAPPING_DATA));
    assert_false(ddp__mapping_add(area[0], 0, "/x", DDP_MAPPING_DATA));

    /* a path longer than the table keeps: its end, the file's name */
    size_t long_len = DDP__MAPPING_PATH_MAX + 100;
    char *longp = malloc(long_len + 1);
    for (size_t i = 0; i < long_len; i++)
        longp[i] = (char)('a' + i % 26);
    memcpy(longp + long_len - 9, "/file.bin", 9);
    longp[long_len] = '\0';
    assert_true(ddp__mapping_add(area[0], 64, longp, DDP_MAPPING_DATA));
    assert_true(ddp_data_mapping_at(area[0], &m));
    assert_int_equal(strlen(m.path), DDP__MAPPING_PATH_MAX - 1);
    assert_string_equal(m.path, longp + long_len - (DDP__MAPPING_PATH_MAX - 1));
    ddp__mapping_remove(area[0]);
    free(longp);

    /* two threads churning while this one looks up a mapping that stays */
    assert_true(ddp__mapping_add(area[1], 64, "/stays", DDP_MAPPING_DATA));
    churn c[2] = {{.id = 0}, {.id = 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        atomic_init(&c[i].stop, false);
        atomic_init(&c[i].rounds, 0);
        assert_int_equal(pthread_create(&th[i], NULL, churn_run, &c[i]), 0);
    }
    for (int k = 0;
         k < 200000 && (k < 2000 || atomic_load(&c[0].rounds) + atomic_load(&c[1].rounds) < 2000);
         k++) {
        assert_true(ddp_data_mapping_at(area[1] + k % 64, &m));
        assert_string_equal(m.path, "/stays");
        assert_int_equal(m.offset, (size_t)(k % 64));
        assert_false(ddp_data_mapping_at(area[2], &m));
    }
    for (int i = 0; i < 2; i++) {
        atomic_store(&c[i].stop, true);
        pthread_join(th[i], NULL);
    }
    ddp__mapping_remove(area[1]);
}

static int sig_pipe = -1;

static void report_fault(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    ddp_mapping_info m;
    if (ddp_data_mapping_at(si->si_addr, &m)) {
        int kind = (int)m.kind;
        if (write(sig_pipe, &m.offset, sizeof m.offset) < 0 ||
            write(sig_pipe, &kind, sizeof kind) < 0 || write(sig_pipe, m.path, strlen(m.path)) < 0)
            _exit(5);
    }
    raise(sig); /* the default again (SA_RESETHAND): dies when this returns */
}

/* A token file truncated under an open dataset: reading a sample past its new end raises SIGBUS,
 * and the handler finds the file and the byte from the fault's address (ddptrain's use). */
static void mappings_sigbus_in_shrunk_file(void **state)
{
    (void)state;
    char tok[512];
    sprintf(tok, "%s/shrinks.bin", dir);
    write_tokens(tok, 32769); /* 512 windows of 64 */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        sig_pipe = fds[1];
        ddp_dataset *ds;
        if (ddp_dataset_open_tokens(tok, 64, &ds, NULL) != DDP_OK)
            _exit(2);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = report_fault;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
        if (sigaction(SIGBUS, &sa, NULL) != 0 || truncate(tok, 4096) != 0)
            _exit(3);
        int32_t x[64], y[64];
        ddp_dataset_get(ds, 300, x, y); /* bytes 38400 … 38529: past the new end */
        _exit(4);
    }
    close(fds[1]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    char buf[600] = "";
    size_t off = 0, got = 0;
    int kind = 0;
    ssize_t r;
    while ((r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    close(fds[0]);
    if (!WIFSIGNALED(status))
        fail_msg("the reader exited %d instead of dying of SIGBUS", WEXITSTATUS(status));
    assert_int_equal(WTERMSIG(status), SIGBUS);
    assert_true(got > sizeof off + sizeof kind);
    memcpy(&off, buf, sizeof off);
    memcpy(&kind, buf + sizeof off, sizeof kind);
    buf[got] = '\0';
    assert_string_equal(buf + sizeof off + sizeof kind, tok);
    assert_int_equal(kind, DDP_MAPPING_DATA);
    assert_in_range(off, 300 * 64 * 2, 300 * 64 * 2 + 65 * 2 - 1); /* in sample 300's window */
    unlink(tok);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-data-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A sampler of no replicas said "rank 0 is not in [0, num_replicas 0)", blaming the rank. */
static void sampler_refuses_bad_world(void **state)
{
    (void)state;
    ddp_sampler *s = NULL;
    ddp_error err = {0};
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = 10, so.num_replicas = 0, so.rank = 0;
    expect_error(ddp_sampler_create(&so, &s, &err), &err, DDP_ERR_INVALID,
                 "num_replicas is 0; it must be at least 1", NULL);
    assert_null(strstr(err.msg, "is not in [0,"));
    so.num_replicas = -2;
    expect_error(ddp_sampler_create(&so, &s, &err), &err, DDP_ERR_INVALID,
                 "num_replicas is -2; it must be at least 1", NULL);
    so.num_replicas = 2, so.rank = 2;
    expect_error(ddp_sampler_create(&so, &s, &err), &err, DDP_ERR_INVALID,
                 "rank 2 is not in [0, num_replicas 2)", NULL);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(idx_plain_and_gzip),
        cmocka_unit_test(idx_malformed),
        cmocka_unit_test(tokens_both_layouts),
        cmocka_unit_test(loader_matches_sampler_any_threads),
        cmocka_unit_test(loader_without_threads),
        cmocka_unit_test(loader_save_restore),
        cmocka_unit_test(dataset_get_many),
        cmocka_unit_test(loader_refuses_bad_options),
        cmocka_unit_test(loader_huge_batch_and_bad_restore),
        cmocka_unit_test(loader_transform),
        cmocka_unit_test(loader_timeout),
        cmocka_unit_test(loader_follows_sampler_epoch),
        cmocka_unit_test(loader_outlives_its_inputs),
        cmocka_unit_test(augment_images),
        cmocka_unit_test(sampler_refuses_bad_world),
        cmocka_unit_test(mappings_name_open_files),
        cmocka_unit_test(mappings_table),
        cmocka_unit_test(mappings_sigbus_in_shrunk_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
