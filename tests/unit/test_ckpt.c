/*
 * test_ckpt.c — checkpoints: round trip of every dtype (with a scalar and an empty tensor) and of
 * metadata, natural alignment of the data; every malformed-file error, from files written by
 * hand; the atomic guarantee when a write fails (a child with a small RLIMIT_FSIZE) and when the
 * rename fails; latest/prune over a directory; and 2000 random mutations of a valid file, which
 * must all be either opened or refused with a message, never crash; a trainer's state (a
 * parameter list, optimizer state, position) saved and resumed, and every mismatch refused.
 * Synthetic data encode their origin: element k of tensor i is a function of (i, k).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"

static char dir[256];

static void path_of(char *out, const char *name)
{
    snprintf(out, 512, "%s/%s", dir, name);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Reads a whole file; *n its size. Caller frees. */
static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long sz = ftell(f);
    assert_true(sz >= 0);
    rewind(f);
    unsigned char *p = malloc((size_t)sz + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return p;
}

/* Number of entries in dir whose name contains s. */
static int count_named(const char *s)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strstr(de->d_name, s) != NULL;
    closedir(d);
    return n;
}

static size_t nbytes(const ddp_ckpt_tensor *t)
{
    size_t b = ddp_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim; k++)
        b *= (size_t)t->shape[k];
    return b;
}

/* ---- round trip ------------------------------------------------------------------------------ */

typedef struct {
    float f32[12];
    double f64;
    uint16_t bf16[5];
    uint16_t f16[6];
    int32_t i32[7];
    int64_t i64[4];
    uint8_t u8[3];
} sample_data;

static void fill(sample_data *d)
{
    for (int k = 0; k < 12; k++)
        d->f32[k] = (float)k * 0.5f - 3.0f;
    d->f64 = 3.25;
    for (int k = 0; k < 5; k++)
        d->bf16[k] = (uint16_t)(0x3f80 + k); /* 1.0, then the next bf16 values */
    for (int k = 0; k < 6; k++)
        d->f16[k] = (uint16_t)(0x3c00 + 0x100 * k);
    for (int k = 0; k < 7; k++)
        d->i32[k] = -1000 * k;
    for (int k = 0; k < 4; k++)
        d->i64[k] = ((int64_t)1 << 40) + k;
    for (int k = 0; k < 3; k++)
        d->u8[k] = (uint8_t)(200 + k);
}

/* The sample tensors, deliberately with a 1-byte tensor of odd size first in header order so the
 * writer has to reorder them to keep the others aligned. */
static size_t sample_tensors(const sample_data *d, ddp_ckpt_tensor *t)
{
    size_t n = 0;
    t[n++] = (ddp_ckpt_tensor){"mask", DDP_UINT8, 1, {3}, d->u8};
    t[n++] = (ddp_ckpt_tensor){"fc.weight", DDP_FLOAT32, 2, {3, 4}, d->f32};
    t[n++] = (ddp_ckpt_tensor){"lr", DDP_FLOAT64, 0, {0}, &d->f64};
    t[n++] = (ddp_ckpt_tensor){"emb.bf16", DDP_BFLOAT16, 1, {5}, d->bf16};
    t[n++] = (ddp_ckpt_tensor){"half", DDP_FLOAT16, 3, {1, 2, 3}, d->f16};
    t[n++] = (ddp_ckpt_tensor){"counts", DDP_INT32, 1, {7}, d->i32};
    t[n++] = (ddp_ckpt_tensor){"rng", DDP_INT64, 2, {2, 2}, d->i64};
    t[n++] = (ddp_ckpt_tensor){"empty", DDP_FLOAT32, 2, {0, 5}, NULL};
    return n;
}

static const char *mkeys[] = {"step", "config", "unicode"};
static const char *mvals[] = {"42", "{\"lr\": 0.1,\n \"name\": \"a \\\"quoted\\\" run\"}",
                              "Grüße, 東京"};

static void save_sample(const char *path)
{
    sample_data d;
    fill(&d);
    ddp_ckpt_tensor t[8];
    size_t n = sample_tensors(&d, t);
    ddp_error err = {0};
    ddp_status st = ddp_ckpt_save(path, t, n, mkeys, mvals, 3, &err);
    if (st != DDP_OK)
        fail_msg("save: %s", err.msg);
}

static void test_roundtrip(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "rt.safetensors");
    save_sample(path);
    assert_int_equal(count_named(".tmp."), 0);

    sample_data d;
    fill(&d);
    ddp_ckpt_tensor want[8];
    size_t n = sample_tensors(&d, want);

    ddp_ckpt *c;
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_open(path, &c, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_count(c), n);
    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor *g = ddp_ckpt_find(c, want[i].name);
        assert_non_null(g);
        assert_string_equal(g->name, want[i].name);
        assert_int_equal(g->dtype, want[i].dtype);
        assert_int_equal(g->ndim, want[i].ndim);
        for (int k = 0; k < g->ndim; k++)
            assert_int_equal(g->shape[k], want[i].shape[k]);
        /* natural alignment in the mapping */
        assert_int_equal((uintptr_t)g->data % ddp_dtype_size(g->dtype), 0);
        if (nbytes(g))
            assert_memory_equal(g->data, want[i].data, nbytes(g));
    }
    assert_non_null(ddp_ckpt_tensor_at(c, n - 1));
    assert_null(ddp_ckpt_tensor_at(c, n));
    assert_null(ddp_ckpt_find(c, "nope"));

    assert_int_equal(ddp_ckpt_meta_count(c), 3);
    for (int i = 0; i < 3; i++)
        assert_string_equal(ddp_ckpt_meta(c, mkeys[i]), mvals[i]);
    assert_null(ddp_ckpt_meta(c, "missing"));
    const char *k, *v;
    assert_true(ddp_ckpt_meta_at(c, 0, &k, &v));
    assert_false(ddp_ckpt_meta_at(c, 3, &k, &v));
    ddp_ckpt_close(c);
    ddp_ckpt_close(NULL);

    /* The raw layout: the data starts 8-aligned, the header is JSON padded with spaces. */
    size_t sz;
    unsigned char *raw = read_bytes(path, &sz);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)raw[i] << (8 * i);
    assert_int_equal((8 + hlen) % 8, 0);
    assert_int_equal(raw[8], '{');
    size_t data = 0;
    for (size_t i = 0; i < n; i++)
        data += nbytes(&want[i]);
    assert_int_equal(sz, 8 + hlen + data);
    free(raw);
}

static void test_empty_file(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "none.safetensors");
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save(path, NULL, 0, NULL, NULL, 0, &err), DDP_OK);
    ddp_ckpt *c;
    assert_int_equal(ddp_ckpt_open(path, &c, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_count(c), 0);
    assert_int_equal(ddp_ckpt_meta_count(c), 0);
    ddp_ckpt_close(c);
}

static void expect_save_invalid(const ddp_ckpt_tensor *t, size_t n, const char *const *mk,
                                const char *const *mv, size_t nm, const char *needle)
{
    char path[512];
    path_of(path, "invalid.safetensors");
    ddp_error err = {0};
    ddp_status st = ddp_ckpt_save(path, t, n, mk, mv, nm, &err);
    if (st != DDP_ERR_INVALID || !strstr(err.msg, needle))
        fail_msg("expected invalid argument with '%s', got %s: %s", needle, ddp_status_str(st),
                 err.msg);
    assert_int_equal(count_named("invalid"), 0);
}

static void test_save_invalid(void **state)
{
    (void)state;
    float x[4] = {0};
    ddp_ckpt_tensor t[2] = {{"a", DDP_FLOAT32, 1, {4}, x}, {"a", DDP_FLOAT32, 1, {4}, x}};
    expect_save_invalid(t, 2, NULL, NULL, 0, "'a' is used twice");
    t[1].name = "__metadata__";
    expect_save_invalid(t, 2, NULL, NULL, 0, "reserved name");
    t[1].name = "";
    expect_save_invalid(t, 2, NULL, NULL, 0, "has no name");
    t[1] = (ddp_ckpt_tensor){"b", (ddp_dtype)99, 1, {4}, x};
    expect_save_invalid(t, 2, NULL, NULL, 0, "unknown dtype 99");
    t[1] = (ddp_ckpt_tensor){"b", DDP_FLOAT32, 9, {4}, x};
    expect_save_invalid(t, 2, NULL, NULL, 0, "invalid shape");
    t[1] = (ddp_ckpt_tensor){"b", DDP_FLOAT32, 1, {-4}, x};
    expect_save_invalid(t, 2, NULL, NULL, 0, "invalid shape");
    t[1] = (ddp_ckpt_tensor){"b", DDP_FLOAT32, 2, {INT64_MAX, 4}, x};
    expect_save_invalid(t, 2, NULL, NULL, 0, "invalid shape");
    t[1] = (ddp_ckpt_tensor){"b", DDP_FLOAT32, 1, {4}, NULL};
    expect_save_invalid(t, 2, NULL, NULL, 0, "has no data");
    t[1] = (ddp_ckpt_tensor){"b\xff", DDP_FLOAT32, 1, {4}, x};
    expect_save_invalid(t, 2, NULL, NULL, 0, "not valid UTF-8");
    const char *k2[] = {"s", "s"}, *v2[] = {"1", "2"};
    expect_save_invalid(t, 1, k2, v2, 2, "'s' is given twice");
    const char *k3[] = {"s"}, *v3[] = {"bad \xc3"};
    expect_save_invalid(t, 1, k3, v3, 1, "not valid UTF-8");
    const char *v4[] = {NULL};
    expect_save_invalid(t, 1, k3, v4, 1, "NULL key or value");
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save(NULL, t, 1, NULL, NULL, 0, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_save("x", NULL, 1, NULL, NULL, 0, &err), DDP_ERR_INVALID);
}

/* ---- malformed files ---------------------------------------------------------------------------
 */

/* Writes bytes as a file and expects open to fail with st, needle and the path in the message. */
static void expect_bad_file(const void *bytes, size_t n, ddp_status st, const char *needle)
{
    char path[512];
    path_of(path, "bad.safetensors");
    write_bytes(path, bytes, n);
    ddp_ckpt *c = (ddp_ckpt *)1;
    ddp_error err = {0};
    ddp_status got = ddp_ckpt_open(path, &c, &err);
    if (got != st || !strstr(err.msg, needle) || !strstr(err.msg, path))
        fail_msg("expected %s with '%s' naming the file, got %s: %s", ddp_status_str(st), needle,
                 ddp_status_str(got), err.msg);
    assert_ptr_equal(c, (ddp_ckpt *)1); /* out untouched on failure */
}

/* The same for a file of header hdr (its length as the length field) and data_len zero bytes. */
static void expect_bad(const char *hdr, size_t data_len, const char *needle)
{
    size_t hl = strlen(hdr), n = 8 + hl + data_len;
    unsigned char *b = calloc(1, n);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, hl);
    expect_bad_file(b, n, DDP_ERR_INVALID, needle);
    free(b);
}

static void test_malformed(void **state)
{
    (void)state;
    expect_bad_file("", 0, DDP_ERR_INVALID, "too short");
    expect_bad_file("\x05\0\0\0\0", 5, DDP_ERR_INVALID, "too short");
    expect_bad_file("\0\0\0\0\0\x01\0\0{}", 10, DDP_ERR_INVALID, "absurd");
    expect_bad_file("\x00\x04\0\0\0\0\0\0{}      ", 16, DDP_ERR_INVALID, "truncated");
    expect_bad("{\"a\": ", 0, "invalid JSON header at line 1 column");
    expect_bad("[1, 2]", 0, "not an object");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
               8, "duplicate");
    expect_bad("{\"a\xff\": {}}", 0, "invalid JSON");
    expect_bad("{\"a\": 3}", 0, "not a JSON object");
    expect_bad("{\"a\": {\"dtype\": \"F8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1,
               "unsupported dtype 'F8'");
    expect_bad("{\"a\": {\"dtype\": 1, \"shape\": [1], \"data_offsets\": [0, 1]}}", 1,
               "dtype of tensor 'a' is not a string");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 0, "lacks one of");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"x\": 1}}",
               4, "unknown field 'x'");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
               "dimension 0 of tensor 'a'");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
               "dimension 0 of tensor 'a'");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
               "\"data_offsets\": [0, 4]}}",
               4, "at most 8 dimensions");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4,
               "0 ≤ begin ≤ end");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
               "data_offsets of tensor 'a'");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4], "
               "\"data_offsets\": [0, 4]}}",
               4, "too large");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4,
               "spanning 4 bytes");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
               "truncated");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
               "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
               12, "overlaps");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
               12, "gap");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "gap");
    expect_bad("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8,
               "4 bytes of trailing garbage");
    expect_bad("{\"__metadata__\": {\"k\": 1}}", 0, "metadata 'k' is not a string");
    expect_bad("{\"__metadata__\": [\"k\"]}", 0, "'__metadata__' is not a JSON object");

    /* A real file cut short by one byte. */
    char path[512], cut[512];
    path_of(path, "whole.safetensors");
    path_of(cut, "bad.safetensors");
    save_sample(path);
    size_t sz;
    unsigned char *raw = read_bytes(path, &sz);
    expect_bad_file(raw, sz - 1, DDP_ERR_INVALID, "truncated");
    free(raw);

    ddp_ckpt *c;
    ddp_error err = {0};
    path_of(path, "does-not-exist.safetensors");
    assert_int_equal(ddp_ckpt_open(path, &c, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(ddp_ckpt_open(dir, &c, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not a regular file"));
    assert_int_equal(ddp_ckpt_open(NULL, &c, &err), DDP_ERR_INVALID);
}

/* ---- the atomic guarantee -------------------------------------------------------------------- */

static void test_atomic_write_failure(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "atomic.safetensors");
    save_sample(path);
    size_t n0;
    unsigned char *before = read_bytes(path, &n0);

    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* no cmocka in the child: report through the exit code and the pipe */
        close(pfd[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(3);
        static float big[1 << 16];
        ddp_ckpt_tensor t = {"big", DDP_FLOAT32, 1, {1 << 16}, big};
        ddp_error err = {0};
        ddp_status st = ddp_ckpt_save(path, &t, 1, NULL, NULL, 0, &err);
        ssize_t w = write(pfd[1], err.msg, strlen(err.msg) + 1);
        (void)w;
        _exit(st == DDP_ERR_SYSTEM ? 0 : 1);
    }
    close(pfd[1]);
    char msg[DDP_ERRMSG_MAX] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof msg - 1 && (r = read(pfd[0], msg + got, sizeof msg - 1 - got)) > 0)
        got += (size_t)r;
    close(pfd[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    if (WEXITSTATUS(ws) != 0)
        fail_msg("child: exit %d, message: %s", WEXITSTATUS(ws), msg);
    if (!strstr(msg, strerror(EFBIG)) || !strstr(msg, "unchanged"))
        fail_msg("unclear message: %s", msg);
    print_message("    save under RLIMIT_FSIZE: %s\n", msg);

    size_t n1;
    unsigned char *after = read_bytes(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    assert_int_equal(count_named(".tmp."), 0);
    free(before);
    free(after);
}

static void test_atomic_rename_failure(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "is-a-dir.safetensors");
    assert_int_equal(mkdir(path, 0755), 0);
    float x[2] = {1, 2};
    ddp_ckpt_tensor t = {"x", DDP_FLOAT32, 1, {2}, x};
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save(path, &t, 1, NULL, NULL, 0, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "cannot rename"));
    assert_int_equal(count_named(".tmp."), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(rmdir(path), 0);

    path_of(path, "no-such-dir/x.safetensors");
    assert_int_equal(ddp_ckpt_save(path, &t, 1, NULL, NULL, 0, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "directory exists"));
}

/* ---- checkpoint directories ---------------------------------------------------------------- */

static void touch(const char *sub, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s/%s", dir, sub, name);
    write_bytes(p, "x", 1);
}

static bool exists(const char *sub, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s/%s", dir, sub, name);
    return access(p, F_OK) == 0;
}

static void test_latest_prune(void **state)
{
    (void)state;
    char d[512], out[600], want[600];
    path_of(d, "runs");
    assert_int_equal(mkdir(d, 0755), 0);
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_latest(d, "ckpt_", out, sizeof out, &err), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "ckpt_<step>.safetensors"));

    const char *names[] = {"ckpt_5.safetensors",
                           "ckpt_40.safetensors",
                           "ckpt_100.safetensors",
                           "ckpt_200.safetensors.tmp.123",
                           "other_999.safetensors",
                           "ckpt_abc.safetensors",
                           "ckpt_.safetensors",
                           "ckpt_300.safetensorsx",
                           "ckpt_12345678901234567890.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        touch("runs", names[i]);
    assert_int_equal(ddp_ckpt_latest(d, "ckpt_", out, sizeof out, &err), DDP_OK);
    snprintf(want, sizeof want, "%s/ckpt_100.safetensors", d);
    assert_string_equal(out, want);
    char tiny[8] = "keep";
    assert_int_equal(ddp_ckpt_latest(d, "ckpt_", tiny, sizeof tiny, &err), DDP_ERR_TOO_LARGE);
    assert_string_equal(tiny, "keep");

    assert_int_equal(ddp_ckpt_prune(d, "ckpt_", 0, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_prune(d, "ckpt_", 2, &err), DDP_OK);
    assert_false(exists("runs", "ckpt_5.safetensors"));
    assert_true(exists("runs", "ckpt_40.safetensors"));
    assert_true(exists("runs", "ckpt_100.safetensors"));
    for (size_t i = 3; i < sizeof names / sizeof names[0]; i++)
        assert_true(exists("runs", names[i]));
    assert_int_equal(ddp_ckpt_prune(d, "ckpt_", 1, &err), DDP_OK);
    assert_false(exists("runs", "ckpt_40.safetensors"));
    assert_int_equal(ddp_ckpt_latest(d, "ckpt_", out, sizeof out, &err), DDP_OK);
    assert_string_equal(out, want);

    /* Another run's newer checkpoints (ckpt_100) are neither counted nor deleted by
     * prune_upto: the caller's checkpoint at max_step stays, with keep_last_k of its own. */
    touch("runs", "ckpt_7.safetensors");
    touch("runs", "ckpt_8.safetensors");
    touch("runs", "ckpt_9.safetensors");
    assert_int_equal(ddp_ckpt_prune_upto(d, "ckpt_", 0, 9, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_prune_upto(d, "ckpt_", 2, 9, &err), DDP_OK);
    assert_true(exists("runs", "ckpt_100.safetensors"));
    assert_true(exists("runs", "ckpt_9.safetensors"));
    assert_true(exists("runs", "ckpt_8.safetensors"));
    assert_false(exists("runs", "ckpt_7.safetensors"));
    assert_int_equal(ddp_ckpt_prune_upto(d, "ckpt_", 1, 9, &err), DDP_OK);
    assert_true(exists("runs", "ckpt_100.safetensors"));
    assert_true(exists("runs", "ckpt_9.safetensors"));
    assert_false(exists("runs", "ckpt_8.safetensors"));
    assert_int_equal(ddp_ckpt_prune(d, "ckpt_", 1, &err), DDP_OK); /* plain prune: by step */
    assert_false(exists("runs", "ckpt_9.safetensors"));
    assert_true(exists("runs", "ckpt_100.safetensors"));

    path_of(d, "no-such-runs");
    assert_int_equal(ddp_ckpt_latest(d, "ckpt_", out, sizeof out, &err), DDP_ERR_NOT_FOUND);
    assert_int_equal(ddp_ckpt_prune(d, "ckpt_", 3, &err), DDP_ERR_NOT_FOUND);
    assert_int_equal(ddp_ckpt_latest(d, "a/b", out, sizeof out, &err), DDP_ERR_INVALID);
}

/* ---- fuzz
 * ---------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_fuzz(void **state)
{
    (void)state;
    char path[512], mpath[512];
    path_of(path, "fuzz-src.safetensors");
    path_of(mpath, "fuzz.safetensors");
    save_sample(path);
    size_t n;
    unsigned char *orig = read_bytes(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)orig[i] << (8 * i);
    unsigned char *buf = malloc(n + 64);
    assert_non_null(buf);
    int opened = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, orig, n);
        size_t len = n;
        switch (rnd() % 5) {
        case 0: /* flip bits anywhere */
        case 1: /* … or in the header, where they matter most */
            for (int k = (int)(rnd() % 4); k >= 0; k--) {
                size_t at = (rnd() % 2) ? 8 + rnd() % hlen : rnd() % n;
                buf[at] ^= (unsigned char)(1u << (rnd() % 8));
            }
            break;
        case 2: /* replace a header byte with a JSON-significant one */
            buf[8 + rnd() % hlen] = (unsigned char)"{}[]\",:0123456789-e. \\"[rnd() % 22];
            break;
        case 3: /* truncate */ len = rnd() % n; break;
        case 4: /* a random length field, or extra bytes at the end */
            if (rnd() % 2)
                buf[rnd() % 8] = (unsigned char)rnd();
            else
                for (size_t k = 0, m = 1 + rnd() % 64; k < m; k++)
                    buf[len++] = (unsigned char)rnd();
            break;
        }
        write_bytes(mpath, buf, len);
        ddp_ckpt *c;
        ddp_error err = {0};
        ddp_status st = ddp_ckpt_open(mpath, &c, &err);
        if (st != DDP_OK) {
            assert_int_equal(st, err.status);
            assert_true(strlen(err.msg) > 0);
            continue;
        }
        opened++;
        /* Every byte of every tensor must be readable (ASan and the mapping bounds check it). */
        unsigned sum = 0;
        for (size_t i = 0; i < ddp_ckpt_count(c); i++) {
            const ddp_ckpt_tensor *t = ddp_ckpt_tensor_at(c, i);
            size_t b = nbytes(t);
            for (size_t k = 0; k < b; k++)
                sum += ((const unsigned char *)t->data)[k];
        }
        for (size_t i = 0; i < ddp_ckpt_meta_count(c); i++) {
            const char *k, *v;
            assert_true(ddp_ckpt_meta_at(c, i, &k, &v));
            sum += (unsigned)strlen(k) + (unsigned)strlen(v);
        }
        (void)sum;
        ddp_ckpt_close(c);
    }
    print_message("    fuzz: %d of 2000 mutated files still valid, the rest refused cleanly\n",
                  opened);
    free(buf);
    free(orig);
}

/* ---- trainer state ----------------------------------------------------------------------------
 */

/* Two parameters (a matrix and a vector) with two optimizer states each and a buffer; value k of
 * array a is a + k / 8. */
typedef struct train_data {
    float w[6], b[3], buf[2], m[2][6], v[2][3];
    float *ma[2], *va[2];
    ddp_model_param params[2], buffers[1];
} train_data;

static void train_fill(train_data *d, float a)
{
    float *arrs[] = {d->w, d->b, d->buf, d->m[0], d->m[1], d->v[0], d->v[1]};
    size_t ns[] = {6, 3, 2, 6, 6, 3, 3};
    for (int i = 0; i < 7; i++)
        for (size_t k = 0; k < ns[i]; k++)
            arrs[i][k] = a + (float)i + (float)k / 8;
    d->params[0] = (ddp_model_param){
        .name = "fc.weight", .ndim = 2, .shape = {2, 3}, .count = 6, .decay = true, .data = d->w};
    d->params[1] =
        (ddp_model_param){.name = "fc.bias", .ndim = 1, .shape = {3}, .count = 3, .data = d->b};
    d->buffers[0] = (ddp_model_param){
        .name = "bn.running_var", .ndim = 1, .shape = {2}, .count = 2, .data = d->buf};
    /* optim[s][i]: state s of parameter i */
    d->ma[0] = d->m[0], d->ma[1] = d->v[0];
    d->va[0] = d->m[1], d->va[1] = d->v[1];
}

static ddp_ckpt_train_state train_state_of(train_data *d, int n_optim)
{
    ddp_ckpt_train_state s = {.params = d->params,
                              .n_params = 2,
                              .buffers = d->buffers,
                              .n_buffers = 1,
                              .n_optim = n_optim,
                              .optim_names = {"exp_avg", "exp_avg_sq"},
                              .optim = {d->ma, d->va},
                              .pos = {12, 3, 45, 4},
                              .loss = 0.123456789012,
                              .config = "model:\n  type: mlp\n"};
    return s;
}

static void test_train_state(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "train.safetensors");
    train_data d, e;
    train_fill(&d, 1.0f);
    ddp_ckpt_train_state s = train_state_of(&d, 2);
    ddp_error err = {0};
    if (ddp_ckpt_save_train(path, &s, &err) != DDP_OK)
        fail_msg("save: %s", err.msg);
    /* The file: weights under their names and torch shapes, each followed by its state, then
     * the buffers; the metadata. */
    ddp_ckpt *c;
    assert_int_equal(ddp_ckpt_open(path, &c, NULL), DDP_OK);
    const char *names[] = {"fc.weight",     "optim.fc.weight.exp_avg", "optim.fc.weight.exp_avg_sq",
                           "fc.bias",       "optim.fc.bias.exp_avg",   "optim.fc.bias.exp_avg_sq",
                           "bn.running_var"};
    assert_int_equal(ddp_ckpt_count(c), 7);
    for (size_t i = 0; i < 7; i++)
        assert_string_equal(ddp_ckpt_tensor_at(c, i)->name, names[i]);
    const ddp_ckpt_tensor *w = ddp_ckpt_find(c, "fc.weight");
    assert_int_equal(w->ndim, 2);
    assert_int_equal(w->shape[0], 2);
    assert_int_equal(w->shape[1], 3);
    assert_memory_equal(w->data, d.w, sizeof d.w);
    assert_memory_equal(ddp_ckpt_find(c, "optim.fc.bias.exp_avg_sq")->data, d.v[1], sizeof d.v[1]);
    const char *mk[] = {"format", "step", "epoch", "next_batch", "world_size", "loss", "config"};
    const char *mv[] = {"ddptrain-1", "12", "3", "45", "4", "0.123456789", "model:\n  type: mlp\n"};
    assert_int_equal(ddp_ckpt_meta_count(c), 7);
    for (size_t i = 0; i < 7; i++)
        assert_string_equal(ddp_ckpt_meta(c, mk[i]), mv[i]);
    ddp_ckpt_close(c);
    /* Read back into other memory: the same values and position. */
    train_fill(&e, -50.0f);
    ddp_ckpt_train_state t = train_state_of(&e, 2);
    ddp_ckpt_train_pos pos = {0};
    if (ddp_ckpt_load_train(path, &t, &pos, &err) != DDP_OK)
        fail_msg("load: %s", err.msg);
    assert_memory_equal(&d.w, &e.w,
                        sizeof d.w + sizeof d.b + sizeof d.buf + sizeof d.m + sizeof d.v);
    assert_true(pos.step == 12 && pos.epoch == 3 && pos.next_batch == 45 && pos.world_size == 4);
    /* Fewer optimizer states than the file holds (extra tensors are ignored) loads too. */
    t.n_optim = 1;
    assert_int_equal(ddp_ckpt_load_train(path, &t, &pos, NULL), DDP_OK);
    /* No position wanted (it crashed writing through pos = NULL); no state or path: an error. */
    assert_int_equal(ddp_ckpt_load_train(path, &t, NULL, NULL), DDP_OK);
    assert_int_equal(ddp_ckpt_load_train(path, NULL, &pos, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_load_train(NULL, &t, &pos, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_save_train(path, NULL, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_save_train(NULL, &s, NULL), DDP_ERR_INVALID);
    /* A program's own metadata (ddptrain's progress window), saved beside the format's and read
     * with ddp_ckpt_meta; a key of the format's, an empty one or missing arrays are refused
     * before anything is written (the file above stays). */
    char extra_path[512];
    path_of(extra_path, "train_extra.safetensors");
    const char *xk[] = {"prog.window", "prog.note"}, *xv[] = {"1.5 3 0.25 1", ""};
    ddp_ckpt_train_state x = train_state_of(&d, 2);
    x.extra_keys = xk, x.extra_vals = xv, x.n_extra = 2;
    if (ddp_ckpt_save_train(extra_path, &x, &err) != DDP_OK)
        fail_msg("save with extra metadata: %s", err.msg);
    assert_int_equal(ddp_ckpt_open(extra_path, &c, NULL), DDP_OK);
    assert_int_equal(ddp_ckpt_meta_count(c), 9);
    assert_string_equal(ddp_ckpt_meta(c, "prog.window"), "1.5 3 0.25 1");
    assert_string_equal(ddp_ckpt_meta(c, "prog.note"), "");
    assert_string_equal(ddp_ckpt_meta(c, "step"), "12");
    ddp_ckpt_close(c);
    assert_int_equal(ddp_ckpt_load_train(extra_path, &t, &pos, &err), DDP_OK);
    remove(extra_path);
    const char *bad_keys[] = {"step", "", NULL};
    for (int b = 0; b < 3; b++) {
        const char *bk[] = {bad_keys[b]};
        x.extra_keys = bk, x.n_extra = 1;
        ddp_error e3 = {0};
        assert_int_equal(ddp_ckpt_save_train(extra_path, &x, &e3), DDP_ERR_INVALID);
        if (!strstr(e3.msg, "extra metadata 0"))
            fail_msg("extra key %d: '%s'", b, e3.msg);
        assert_int_equal(access(extra_path, F_OK), -1); /* nothing written */
    }
    x.extra_keys = NULL, x.n_extra = 1;
    assert_int_equal(ddp_ckpt_save_train(extra_path, &x, NULL), DDP_ERR_INVALID);
    /* One bit flipped in the data after the save (a disk's, a partial copy's): refused by the
     * data's checksum, not loaded as other weights (it loaded silently before 2026-11-25). */
    c = NULL;
    assert_int_equal(ddp_ckpt_open(path, &c, NULL), DDP_OK);
    assert_int_equal(ddp_ckpt_verify(c, NULL), DDP_OK);
    assert_null(ddp_ckpt_meta(c, "ddp.data_crc32")); /* ddpc's own: not listed */
    ddp_ckpt_close(c);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    int byte = fgetc(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    fputc(byte ^ 0x10, f);
    fclose(f);
    ddp_error e2 = {0};
    assert_int_equal(ddp_ckpt_load_train(path, &t, &pos, &e2), DDP_ERR_INVALID);
    if (!strstr(e2.msg, "does not match the checksum saved with it") || !strstr(e2.msg, path))
        fail_msg("a flipped bit: '%s'", e2.msg);
    /* The checksum's key is ddpc's own. */
    const char *ck[] = {"ddp.data_crc32"}, *cv[] = {"00000000"};
    assert_int_equal(ddp_ckpt_save(path, NULL, 0, ck, cv, 1, &e2), DDP_ERR_INVALID);
    assert_non_null(strstr(e2.msg, "is ddpc's own"));
}

/* The save in steps (ddp_ckpt_writer): tensors left out at the open and put later in pieces,
 * out of order, give the very bytes ddp_ckpt_save writes (the CRC computed at the commit);
 * the same for a trainer state's optimizer arrays (ddp_ckpt_open_train); pieces outside a
 * tensor, twice, or of a tensor whose data was given are refused; a commit with bytes missing
 * saves nothing and leaves the file at the path as it was; abort leaves no temporary file. */
static void test_writer(void **state)
{
    (void)state;
    char whole[512], steps[512];
    path_of(whole, "whole.safetensors");
    path_of(steps, "steps.safetensors");
    sample_data d;
    fill(&d);
    ddp_ckpt_tensor t[8];
    size_t n = sample_tensors(&d, t);
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save(whole, t, n, mkeys, mvals, 3, &err), DDP_OK);
    t[1].data = NULL; /* fc.weight: 12 floats, put in three pieces, last first */
    t[5].data = NULL; /* counts: 7 int32, in one */
    ddp_ckpt_writer *w = NULL;
    if (ddp_ckpt_writer_open(steps, t, n, mkeys, mvals, 3, &w, &err) != DDP_OK)
        fail_msg("open: %s", err.msg);
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 32, d.f32 + 8, 16, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 0, d.f32, 20, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_writer_put(w, 5, 0, d.i32, sizeof d.i32, &err), DDP_OK);
    /* refused: past the end, more than is left, a tensor given at the open */
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 40, d.f32, 16, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "bytes [40, 56) of tensor 1 ('fc.weight')"));
    assert_int_equal(ddp_ckpt_writer_put(w, 5, 0, d.i32, 4, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_writer_put(w, 0, 0, d.u8, 1, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "still to come"));
    /* a tensor that is not there, no data, no writer: said so (each read "bytes [0, 16) of tensor
     * … are not in it") */
    assert_int_equal(ddp_ckpt_writer_put(w, 9, 0, d.f32, 16, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, "no tensor 9 (it has 8)"))
        fail_msg("message '%s'", err.msg);
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 20, NULL, 12, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, "12 bytes for 'fc.weight' without data"))
        fail_msg("message '%s'", err.msg);
    assert_int_equal(ddp_ckpt_writer_put(NULL, 1, 20, d.f32, 12, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, "ddp_ckpt_writer_put: no writer"))
        fail_msg("message '%s'", err.msg);
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 20, d.f32 + 5, 12, &err), DDP_OK);
    if (ddp_ckpt_writer_commit(w, &err) != DDP_OK)
        fail_msg("commit: %s", err.msg);
    size_t na, nb;
    unsigned char *a = read_bytes(whole, &na), *b = read_bytes(steps, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(b);
    /* a commit with 4 bytes missing: refused, nothing saved, the old file untouched */
    assert_int_equal(ddp_ckpt_writer_open(steps, t, n, mkeys, mvals, 3, &w, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_writer_put(w, 1, 0, d.f32, 44, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_writer_put(w, 5, 0, d.i32, sizeof d.i32, &err), DDP_OK);
    assert_int_equal(ddp_ckpt_writer_commit(w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "'fc.weight' still lacks 4 of its 48 bytes"));
    b = read_bytes(steps, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(b);
    free(a);
    /* abort: no temporary file left beside it */
    assert_int_equal(ddp_ckpt_writer_open(steps, t, n, mkeys, mvals, 3, &w, &err), DDP_OK);
    ddp_ckpt_writer_abort(w);
    ddp_ckpt_writer_abort(NULL);
    DIR *dd = opendir(dir);
    assert_non_null(dd);
    struct dirent *de;
    while ((de = readdir(dd)))
        if (strstr(de->d_name, ".tmp."))
            fail_msg("%s left behind", de->d_name);
    closedir(dd);
    /* a tensor without data is refused by ddp_ckpt_save, as before */
    assert_int_equal(ddp_ckpt_save(steps, t, n, mkeys, mvals, 3, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tensor 'fc.weight' has no data"));

    /* A trainer state with its optimizer arrays put piece by piece = ddp_ckpt_save_train's. */
    train_data td;
    train_fill(&td, 1.0f);
    ddp_ckpt_train_state s = train_state_of(&td, 2);
    assert_int_equal(ddp_ckpt_save_train(whole, &s, &err), DDP_OK);
    ddp_ckpt_train_state sd = s;
    sd.optim[0] = sd.optim[1] = NULL;
    if (ddp_ckpt_open_train(steps, &sd, &w, &err) != DDP_OK)
        fail_msg("open_train: %s", err.msg);
    for (int k = 1; k >= 0; k--)
        for (size_t i = 0; i < 2; i++) {
            size_t cnt = td.params[i].count;
            const float *src = s.optim[k][i];
            size_t ti = ddp_ckpt_train_tensor(&sd, i, k);
            assert_int_equal(ddp_ckpt_writer_put(w, ti, 4, src + 1, 4 * (cnt - 1), &err), DDP_OK);
            assert_int_equal(ddp_ckpt_writer_put(w, ti, 0, src, 4, &err), DDP_OK);
        }
    assert_int_equal(ddp_ckpt_writer_commit(w, &err), DDP_OK);
    a = read_bytes(whole, &na);
    b = read_bytes(steps, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    assert_int_equal(ddp_ckpt_open_train(steps, &sd, NULL, &err), DDP_ERR_INVALID);
}

static void expect_load_error(const char *path, const ddp_ckpt_train_state *s, const char *needle)
{
    ddp_ckpt_train_pos pos = {7, 7, 7, 7, 7, 0.0f, 0};
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_load_train(path, s, &pos, &err), DDP_ERR_INVALID);
    assert_true(pos.step == 7 && pos.world_size == 7); /* written only on success */
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    assert_non_null(strstr(err.msg, path));
}

/* save_train and load_train refuse s, naming the missing array, and leave the file alone. */
static void expect_array_error(const char *path, const ddp_ckpt_train_state *s, const char *needle)
{
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save_train(path, s, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, needle))
        fail_msg("save: message '%s' lacks '%s'", err.msg, needle);
    memset(&err, 0, sizeof err);
    assert_int_equal(ddp_ckpt_load_train(path, s, NULL, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, needle))
        fail_msg("load: message '%s' lacks '%s'", err.msg, needle);
}

static void test_train_state_mismatch(void **state)
{
    (void)state;
    char path[512], other[512];
    path_of(path, "train1.safetensors");
    train_data d;
    train_fill(&d, 1.0f);
    ddp_ckpt_train_state s = train_state_of(&d, 1); /* SGD-like: one state */
    assert_int_equal(ddp_ckpt_save_train(path, &s, NULL), DDP_OK);
    /* Another optimizer (two states), another model (a name, a size). */
    s.n_optim = 2;
    expect_load_error(path, &s, "lacks 'optim.fc.weight.exp_avg_sq'");
    s.n_optim = 1;
    d.params[1].name = "fc.bias2";
    expect_load_error(path, &s,
                      "has no float32 'fc.bias2' of 3 values: it was saved with another model");
    d.params[1].name = "fc.bias";
    d.buffers[0].count = 1;
    expect_load_error(path, &s, "'bn.running_var' of 1 values");
    d.buffers[0].count = 2;
    /* Not a trainer-state file; metadata that is not a number. */
    path_of(other, "plain.safetensors");
    save_sample(other);
    expect_load_error(other, &s, "is not a ddptrain checkpoint");
    ddp_ckpt_tensor t3[] = {{"fc.weight", DDP_FLOAT32, 2, {2, 3}, d.w},
                            {"optim.fc.weight.exp_avg", DDP_FLOAT32, 1, {6}, d.m[0]},
                            {"fc.bias", DDP_FLOAT32, 1, {3}, d.b},
                            {"optim.fc.bias.exp_avg", DDP_FLOAT32, 1, {3}, d.v[0]},
                            {"bn.running_var", DDP_FLOAT32, 1, {2}, d.buf}};
    const char *k[] = {"format", "step", "epoch", "next_batch", "world_size"};
    const char *v[] = {"ddptrain-1", "12", "x3", "0", "1"};
    assert_int_equal(ddp_ckpt_save(other, t3, 5, k, v, 5, NULL), DDP_OK);
    expect_load_error(other, &s, "metadata 'epoch' is missing or not a number");
    v[2] = "3";
    assert_int_equal(ddp_ckpt_save(other, t3, 5, k, v, 4, NULL), DDP_OK);
    expect_load_error(other, &s, "metadata 'world_size' is missing");
    v[4] = "2";
    assert_int_equal(ddp_ckpt_save(other, t3, 5, k, v, 5, NULL), DDP_OK);
    ddp_ckpt_train_pos pos;
    assert_int_equal(ddp_ckpt_load_train(other, &s, &pos, NULL), DDP_OK);
    assert_true(pos.step == 12 && pos.epoch == 3 && pos.next_batch == 0 && pos.world_size == 2);
    /* Out-of-range state counts are refused both ways. */
    s.n_optim = DDP_CKPT_MAX_OPTIM_STATES + 1;
    assert_int_equal(ddp_ckpt_save_train(path, &s, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_ckpt_load_train(path, &s, &pos, NULL), DDP_ERR_INVALID);
    s.n_optim = 1;
    /* An array missing where its count is not 0 is an error naming it, both ways (it crashed:
     * a NULL params, buffers, optimizer state or state name was dereferenced). */
    ddp_ckpt_train_state bad = s;
    bad.params = NULL;
    expect_array_error(path, &bad, "'params'");
    bad = s;
    bad.buffers = NULL;
    expect_array_error(path, &bad, "'buffers'");
    bad = s;
    bad.optim[0] = NULL;
    expect_array_error(path, &bad, "'optim[0]'");
    bad = s;
    bad.optim_names[0] = NULL;
    expect_array_error(path, &bad, "'optim_names[0]'");
    /* A parameter whose count is not its shape's product (a ddp_model_param filled by hand) is
     * refused on save, naming it: the file took the shape's 6 values, reading past a count of 5. */
    d.params[0].count = 5;
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save_train(path, &s, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, "parameter 'fc.weight' has count 5 but shape [2, 3] (6 elements)"))
        fail_msg("message '%s'", err.msg);
    d.params[0].count = 6;
    /* With nothing to describe, the arrays may be NULL. */
    bad = (ddp_ckpt_train_state){.n_optim = 1, .pos.world_size = 1};
    assert_int_equal(ddp_ckpt_save_train(path, &bad, NULL), DDP_OK);
    assert_int_equal(ddp_ckpt_load_train(path, &bad, &pos, NULL), DDP_OK);
}

/* Positions no trainer can use are refused, not handed on (the trainer multiplies next_batch by
 * world_size, and takes the loss scale as a float): found by fuzz_trainstate. */
static void test_train_state_bad_position(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "badpos.safetensors");
    train_data d;
    train_fill(&d, 1.0f);
    ddp_ckpt_train_state s = train_state_of(&d, 1);
    ddp_ckpt_tensor t[] = {{"fc.weight", DDP_FLOAT32, 2, {2, 3}, d.w},
                           {"optim.fc.weight.exp_avg", DDP_FLOAT32, 1, {6}, d.m[0]},
                           {"fc.bias", DDP_FLOAT32, 1, {3}, d.b},
                           {"optim.fc.bias.exp_avg", DDP_FLOAT32, 1, {3}, d.v[0]},
                           {"bn.running_var", DDP_FLOAT32, 1, {2}, d.buf}};
    const char *k[] = {"format",     "step",       "epoch",      "next_batch",
                       "world_size", "optim_step", "loss_scale", "loss_scale_growth"};
    static const struct {
        const char *step, *next_batch, *world_size, *scale, *needle;
    } bad[] = {
        {"12", "4", "-1", "8", "metadata 'world_size' is missing or not a number"},
        {"12", "4", " 2", "8", "metadata 'world_size' is missing or not a number"},
        {"-12", "4", "2", "8", "metadata 'step' is missing or not a number"},
        {"99999999999999999999", "4", "2", "8", "metadata 'step' is missing or not a number"},
        {"12", "4", "0", "8", "world_size '0' with next_batch '4' is not a position"},
        {"12", "9223372036854775808", "2", "8", "is not a position in an epoch"},
        {"12", "4", "2", "1e39", "a finite scale > 0"},
        {"12", "4", "2", "inf", "a finite scale > 0"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *v[] = {"ddptrain-1",      bad[i].step, "3",          bad[i].next_batch,
                           bad[i].world_size, "5",         bad[i].scale, "1"};
        assert_int_equal(ddp_ckpt_save(path, t, 5, k, v, 8, NULL), DDP_OK);
        expect_load_error(path, &s, bad[i].needle);
    }
    /* A world size of 0 is not saved either. */
    s.pos.world_size = 0;
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_save_train(path, &s, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "world_size 0"));
    /* The largest position that is one loads. */
    const char *v[] = {"ddptrain-1", "12", "3", "9223372036854775807", "2", "5", "3.4e38", "1"};
    assert_int_equal(ddp_ckpt_save(path, t, 5, k, v, 8, NULL), DDP_OK);
    ddp_ckpt_train_pos pos;
    if (ddp_ckpt_load_train(path, &s, &pos, &err) != DDP_OK)
        fail_msg("load: %s", err.msg);
    assert_true(pos.next_batch == 9223372036854775807ull && pos.world_size == 2 &&
                pos.optim_step == 5 && pos.loss_scale > 3e38f && pos.loss_scale_growth == 1);
}

/* A library model and optimizer save and resume through their lists: a model built with
 * another seed gets the saved weights, batchnorm statistics and optimizer state. */
static void test_train_state_model(void **state)
{
    (void)state;
    char path[512];
    path_of(path, "model.safetensors");
    ddp_model_spec ms = DDP_MODEL_SPEC_INIT;
    ms.type = "cnn";
    ms.in_h = ms.in_w = 8;
    ms.channels = (const int64_t[]){3};
    ms.n_channels = 1;
    ms.hidden = (const int64_t[]){5};
    ms.n_hidden = 1;
    ms.seed = 1;
    ddp_model *m[2];
    ddp_optim *o[2];
    ddp_ckpt_train_state s[2];
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    for (int r = 0; r < 2; r++, ms.seed++) {
        assert_int_equal(ddp_model_build(&ms, &m[r], NULL), DDP_OK);
        s[r] = (ddp_ckpt_train_state){0};
        s[r].params = ddp_model_params(m[r], &s[r].n_params);
        s[r].buffers = ddp_model_buffers(m[r], &s[r].n_buffers);
        assert_int_equal(ddp_optim_create(&oo, s[r].params, s[r].n_params, &o[r], NULL), DDP_OK);
        s[r].n_optim = ddp_optim_num_states(o[r]);
        for (int k = 0; k < s[r].n_optim; k++) {
            s[r].optim_names[k] = ddp_optim_state_name(o[r], k);
            s[r].optim[k] = ddp_optim_state(o[r], k);
        }
    }
    for (size_t i = 0; i < s[0].n_params; i++) /* some state, and buffers off their start */
        s[0].optim[1][i][0] = (float)i + 0.5f;
    s[0].buffers[1].data[2] = 7.0f;
    s[0].pos.world_size = 1;
    assert_int_equal(ddp_ckpt_save_train(path, &s[0], NULL), DDP_OK);
    ddp_ckpt_train_pos pos;
    assert_int_equal(ddp_ckpt_load_train(path, &s[1], &pos, NULL), DDP_OK);
    for (size_t i = 0; i < s[0].n_params; i++) {
        assert_memory_equal(s[0].params[i].data, s[1].params[i].data,
                            sizeof(float) * s[0].params[i].count);
        for (int k = 0; k < 2; k++)
            assert_memory_equal(s[0].optim[k][i], s[1].optim[k][i],
                                sizeof(float) * s[0].params[i].count);
    }
    for (size_t i = 0; i < s[0].n_buffers; i++)
        assert_memory_equal(s[0].buffers[i].data, s[1].buffers[i].data, sizeof(float) * 3);
    /* torch's shapes in the file: conv weight (3, 1, 3, 3). */
    ddp_ckpt *c;
    assert_int_equal(ddp_ckpt_open(path, &c, NULL), DDP_OK);
    const ddp_ckpt_tensor *w = ddp_ckpt_find(c, "conv1.weight");
    assert_true(w->ndim == 4 && w->shape[0] == 3 && w->shape[1] == 1 && w->shape[3] == 3);
    ddp_ckpt_close(c);
    for (int r = 0; r < 2; r++) {
        ddp_optim_destroy(o[r]);
        ddp_model_free(m[r]);
    }
}

/* ---- setup -------------------------------------------------------------------------------------
 */

static void rm_tree(const char *p)
{
    DIR *d = opendir(p);
    if (!d) {
        unlink(p);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", p, de->d_name);
        rm_tree(sub);
    }
    closedir(d);
    rmdir(p);
}

/* Temporary files of saves killed mid-way: this host's dead writers' go, a live writer's, another
 * host's, and anything not a checkpoint's stay. */
static void test_clean_stale(void **state)
{
    (void)state;
    char d[512], host[256] = "", dead[300], live[300], other[300];
    path_of(d, "stale");
    assert_int_equal(mkdir(d, 0755), 0);
    assert_int_equal(gethostname(host, sizeof host - 1), 0);
    pid_t kid = fork();
    if (kid == 0)
        _exit(0);
    assert_int_equal(waitpid(kid, NULL, 0), kid); /* a pid that no longer runs */
    snprintf(dead, sizeof dead, "ckpt_7.safetensors.tmp.%s.%d", host, (int)kid);
    snprintf(live, sizeof live, "ckpt_8.safetensors.tmp.%s.%d", host, (int)getpid());
    snprintf(other, sizeof other, "ckpt_9.safetensors.tmp.%s-elsewhere.%d", host, (int)kid);
    const char *keep[] = {live, other, "ckpt_10.safetensors", "notes.tmp.x.1",
                          "ckpt_11.safetensors.tmp.123"};
    touch("stale", dead);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        touch("stale", keep[i]);
    size_t removed = 99;
    ddp_error err = {0};
    assert_int_equal(ddp_ckpt_clean_stale(d, "ckpt_", &removed, &err), DDP_OK);
    assert_int_equal(removed, 1);
    assert_false(exists("stale", dead));
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        assert_true(exists("stale", keep[i]));
    path_of(d, "no-such-stale");
    assert_int_equal(ddp_ckpt_clean_stale(d, "ckpt_", &removed, &err), DDP_OK);
    assert_int_equal(removed, 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-ckpt-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rm_tree(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_save_invalid),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_atomic_write_failure),
        cmocka_unit_test(test_atomic_rename_failure),
        cmocka_unit_test(test_latest_prune),
        cmocka_unit_test(test_clean_stale),
        cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_train_state),
        cmocka_unit_test(test_writer),
        cmocka_unit_test(test_train_state_mismatch),
        cmocka_unit_test(test_train_state_bad_position),
        cmocka_unit_test(test_train_state_model),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
