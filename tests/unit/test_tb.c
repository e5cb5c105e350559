/*
 * test_tb.c — TensorBoard event files: CRC-32C against published vectors and a bit-by-bit
 * reference, varints, the Event encoding byte for byte, TFRecord framing, and files written by
 * the writer read back by a small independent reader below (both CRCs checked, every protobuf
 * field decoded): names, the version record, tags, steps, values (float32, NaN and infinities
 * kept), wall times, a resumed run's purge record, buffering by flush_ms, refused tags,
 * directories that cannot be created,
 * and a write that fails (a child under a small RLIMIT_FSIZE) leaving a file of whole records.
 * tests/python/test_tb.py reads the same files with the tensorboard package itself.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <math.h>
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "util/crc32c.h"
#include "util/tb_int.h"

static char dir[256];

/* ---- CRC-32C ------------------------------------------------------------------------------- */

/* The definition, one bit at a time: the reference the table in crc32c.c must agree with. */
static uint32_t crc_bitwise(const unsigned char *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++)
            c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0);
    }
    return ~c;
}

static void crc32c_vectors(void **state)
{
    (void)state;
    assert_int_equal(ddp__crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(ddp__crc32c(0, "", 0), 0);
    /* RFC 3720 appendix B.4 (iSCSI). */
    unsigned char b[32];
    memset(b, 0, sizeof b);
    assert_int_equal(ddp__crc32c(0, b, 32), 0x8a9136aau);
    memset(b, 0xff, sizeof b);
    assert_int_equal(ddp__crc32c(0, b, 32), 0x62a8ab43u);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)i;
    assert_int_equal(ddp__crc32c(0, b, 32), 0x46dd794eu);
    for (int i = 0; i < 32; i++)
        b[i] = (unsigned char)(31 - i);
    assert_int_equal(ddp__crc32c(0, b, 32), 0x113fdb5cu);

    /* Every table entry, and random buffers, against the bitwise definition; split anywhere. */
    for (int v = 0; v < 256; v++) {
        unsigned char x = (unsigned char)v;
        assert_int_equal(ddp__crc32c(0, &x, 1), crc_bitwise(&x, 1));
    }
    unsigned char r[1000];
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < sizeof r; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        r[i] = (unsigned char)s;
    }
    for (size_t n = 0; n <= sizeof r; n += 37) {
        uint32_t whole = ddp__crc32c(0, r, n);
        assert_int_equal(whole, crc_bitwise(r, n));
        size_t cut = n / 3;
        assert_int_equal(ddp__crc32c(ddp__crc32c(0, r, cut), r + cut, n - cut), whole);
    }
    /* TFRecord's mask: a rotation by 15 plus a constant. */
    assert_int_equal(ddp__crc32c_mask(0), 0xa282ead8u);
    assert_int_equal(ddp__crc32c_mask(0xe3069283u),
                     (uint32_t)(((0xe3069283u >> 15) | (0xe3069283u << 17)) + 0xa282ead8u));
    assert_int_equal(ddp__crc32c_mask(0x00008000u), 1u + 0xa282ead8u);
}

/* ---- varints and Events -------------------------------------------------------------------- */

static void varints(void **state)
{
    (void)state;
    static const struct {
        uint64_t v;
        size_t n;
        unsigned char b[10];
    } cases[] = {
        {0, 1, {0x00}},
        {1, 1, {0x01}},
        {127, 1, {0x7f}},
        {128, 2, {0x80, 0x01}},
        {300, 2, {0xac, 0x02}},
        {16383, 2, {0xff, 0x7f}},
        {16384, 3, {0x80, 0x80, 0x01}},
        {(uint64_t)1 << 32, 5, {0x80, 0x80, 0x80, 0x80, 0x10}},
        {UINT64_MAX, 10, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
        /* an int64 step of -1 is its two's complement: ten bytes */
        {(uint64_t)(int64_t)-1, 10, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char out[10];
        size_t n = ddp__tb_varint(out, cases[i].v);
        assert_int_equal(n, cases[i].n);
        assert_memory_equal(out, cases[i].b, n);
    }
}

static void event_bytes(void **state)
{
    (void)state;
    /* wall_time 1.5, step 300, tag "a/b", value 0.25: worked out by hand from event.proto and
     * summary.proto. */
    static const unsigned char want[] = {
        0x09, 0,    0,    0,    0,    0, 0, 0xf8, 0x3f, /* 1: wall_time, fixed64 1.5 */
        0x10, 0xac, 0x02,                               /* 2: step, varint 300 */
        0x2a, 0x0c,                                     /* 5: summary, 12 bytes */
        0x0a, 0x0a,                                     /*   Summary 1: value, 10 bytes */
        0x0a, 0x03, 'a',  '/',  'b',                    /*     Value 1: tag */
        0x15, 0,    0,    0x80, 0x3e, /*     Value 2: simple_value, fixed32 0.25f */
    };
    unsigned char out[64];
    size_t n = ddp__tb_event_scalar(out, sizeof out, 1.5, 300, "a/b", 3, 0.25f);
    assert_int_equal(n, sizeof want);
    assert_memory_equal(out, want, n);

    /* Step 0 is proto3's default and is left out; the rest is unchanged. */
    n = ddp__tb_event_scalar(out, sizeof out, 1.5, 0, "a/b", 3, 0.25f);
    assert_int_equal(n, sizeof want - 3);
    assert_memory_equal(out, want, 9);
    assert_memory_equal(out + 9, want + 12, n - 9);

    /* A size query writes nothing; a short buffer gets only what fits. */
    memset(out, 0xee, sizeof out);
    assert_int_equal(ddp__tb_event_scalar(NULL, 0, 1.5, 300, "a/b", 3, 0.25f), sizeof want);
    assert_int_equal(ddp__tb_event_scalar(out, 5, 1.5, 300, "a/b", 3, 0.25f), sizeof want);
    assert_memory_equal(out, want, 5);
    assert_int_equal(out[5], 0xee);

    /* A 200-byte tag takes two-byte lengths at all three levels. */
    char tag[200];
    memset(tag, 'x', sizeof tag);
    n = ddp__tb_event_scalar(out, 0, 1.5, 1, tag, sizeof tag, 1.0f);
    unsigned char *big = malloc(n);
    assert_non_null(big);
    assert_int_equal(ddp__tb_event_scalar(big, n, 1.5, 1, tag, sizeof tag, 1.0f), n);
    /* value = 1 + 2 + 200 + 5 = 208; summary = 1 + 2 + 208 = 211; event = 9 + 2 + 1 + 2 + 211 */
    assert_int_equal(n, 225);
    static const unsigned char head[] = {0x10, 0x01, 0x2a, 0xd3, 0x01, 0x0a,
                                         0xd0, 0x01, 0x0a, 0xc8, 0x01};
    assert_memory_equal(big + 9, head, sizeof head);
    free(big);

    static const unsigned char start[] = {0x09, 0,    0,    0,    0,    0,    0,   0xf8,
                                          0x3f, 0x10, 0x07, 0x3a, 0x02, 0x08, 0x01};
    n = ddp__tb_event_session_start(out, sizeof out, 1.5, 7);
    assert_int_equal(n, sizeof start);
    assert_memory_equal(out, start, n);

    static const unsigned char ver[] = {0x09, 0,    0,   0,   0,   0,   0,   0xf8,
                                        0x3f, 0x1a, 13,  'b', 'r', 'a', 'i', 'n',
                                        '.',  'E',  'v', 'e', 'n', 't', ':', '2'};
    n = ddp__tb_event_version(out, sizeof out, 1.5, "brain.Event:2");
    assert_int_equal(n, sizeof ver);
    assert_memory_equal(out, ver, n);
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void framing(void **state)
{
    (void)state;
    unsigned char out[64];
    ddp__tb_frame(out, "hello", 5);
    assert_int_equal(le(out, 8), 5);
    assert_int_equal(le(out + 8, 4), ddp__crc32c_mask(crc_bitwise(out, 8)));
    assert_memory_equal(out + 12, "hello", 5);
    assert_int_equal(le(out + 17, 4),
                     ddp__crc32c_mask(crc_bitwise((const unsigned char *)"hello", 5)));
    /* An empty record still has both CRCs: the data CRC is the CRC of nothing, masked. */
    ddp__tb_frame(out, "", 0);
    assert_int_equal(le(out, 8), 0);
    assert_int_equal(le(out + 12, 4), 0xa282ead8u);
}

/* ---- a reader, independent of tb.c --------------------------------------------------------- */

typedef struct event {
    double wall;
    int64_t step;
    char version[32]; /* "" unless this is the version record */
    char tag[DDP_TB_MAX_TAG + 1];
    float value;
    int nvalues;
    int session; /* SessionLog.status, 0 when absent */
} event;

typedef struct rd {
    const unsigned char *p;
    size_t left;
} rd;

static bool rd_varint(rd *r, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->left == 0)
            return false;
        unsigned char b = *r->p++;
        r->left--;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* Reads one field: its number, wire type, and either a varint/fixed value or a sub-range. */
static bool rd_field(rd *r, unsigned *field, unsigned *wt, uint64_t *v, rd *sub)
{
    uint64_t key;
    if (!rd_varint(r, &key))
        return false;
    *field = (unsigned)(key >> 3);
    *wt = (unsigned)(key & 7);
    switch (*wt) {
    case 0: return rd_varint(r, v);
    case 1:
    case 5: {
        size_t n = *wt == 1 ? 8 : 4;
        if (r->left < n)
            return false;
        *v = le(r->p, (int)n);
        r->p += n;
        r->left -= n;
        return true;
    }
    case 2:
        if (!rd_varint(r, v) || *v > r->left)
            return false;
        sub->p = r->p;
        sub->left = (size_t)*v;
        r->p += *v;
        r->left -= (size_t)*v;
        return true;
    default: return false;
    }
}

static void decode_value(rd r, event *e)
{
    unsigned f, wt;
    uint64_t v;
    rd sub;
    while (r.left) {
        assert_true(rd_field(&r, &f, &wt, &v, &sub));
        if (f == 1 && wt == 2) {
            assert_true(sub.left <= DDP_TB_MAX_TAG);
            memcpy(e->tag, sub.p, sub.left);
            e->tag[sub.left] = '\0';
        } else if (f == 2 && wt == 5) {
            uint32_t u = (uint32_t)v;
            memcpy(&e->value, &u, 4);
        } else {
            fail_msg("unexpected field %u (wire type %u) in a Summary.Value", f, wt);
        }
    }
}

static void decode_event(rd r, event *e)
{
    memset(e, 0, sizeof *e);
    unsigned f, wt;
    uint64_t v;
    rd sub, val;
    while (r.left) {
        assert_true(rd_field(&r, &f, &wt, &v, &sub));
        if (f == 1 && wt == 1) {
            memcpy(&e->wall, &v, 8);
        } else if (f == 2 && wt == 0) {
            e->step = (int64_t)v;
        } else if (f == 3 && wt == 2) {
            assert_true(sub.left < sizeof e->version);
            memcpy(e->version, sub.p, sub.left);
        } else if (f == 7 && wt == 2) {
            while (sub.left) {
                assert_true(rd_field(&sub, &f, &wt, &v, &val));
                assert_true(f == 1 && wt == 0);
                e->session = (int)v;
            }
        } else if (f == 5 && wt == 2) {
            while (sub.left) {
                assert_true(rd_field(&sub, &f, &wt, &v, &val));
                assert_true(f == 1 && wt == 2);
                decode_value(val, e);
                e->nvalues++;
            }
        } else {
            fail_msg("unexpected field %u (wire type %u) in an Event", f, wt);
        }
    }
}

/* Reads every record of an event file, checking both CRCs. Returns the count; events in *out
 * (caller frees). The file must end exactly after its last record. */
static size_t read_events(const char *path, event **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open '%s': %s", path, strerror(errno));
    unsigned char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
        size_t k = fread(buf + len, 1, cap - len, f);
        if (k == 0)
            break;
        len += k;
    }
    fclose(f);
    size_t n = 0, ncap = 16, off = 0;
    event *ev = malloc(ncap * sizeof *ev);
    assert_non_null(ev);
    while (off < len) {
        if (len - off < 12)
            fail_msg("'%s': %zu stray bytes at offset %zu", path, len - off, off);
        uint64_t dn = le(buf + off, 8);
        assert_int_equal(le(buf + off + 8, 4), ddp__crc32c_mask(crc_bitwise(buf + off, 8)));
        if (dn + 16 > len - off)
            fail_msg("'%s': a record of %llu bytes runs past the end", path,
                     (unsigned long long)dn);
        const unsigned char *data = buf + off + 12;
        assert_int_equal(le(data + dn, 4), ddp__crc32c_mask(crc_bitwise(data, (size_t)dn)));
        if (n == ncap) {
            ev = realloc(ev, (ncap *= 2) * sizeof *ev);
            assert_non_null(ev);
        }
        decode_event((rd){data, (size_t)dn}, &ev[n++]);
        off += 16 + (size_t)dn;
    }
    free(buf);
    *out = ev;
    return n;
}

static off_t file_size(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return sb.st_size;
}

static void rm_rf(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            rm_rf(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static size_t count_files(const char *path)
{
    DIR *d = opendir(path);
    assert_non_null(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* ---- the writer ---------------------------------------------------------------------------- */

static void round_trip(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/run/a/b/", dir); /* missing parents, a trailing slash */
    ddp_tb *tb = NULL;
    ddp_error err = {0};
    double t0 = (double)time(NULL);
    assert_int_equal(ddp_tb_open(sub, NULL, &tb, &err), DDP_OK);
    const char *path = ddp_tb_path(tb);

    /* The name: <dir>/events.out.tfevents.<10-digit time>.<host>.<pid>.0 */
    char host[256] = "";
    gethostname(host, sizeof host);
    char want[1024];
    snprintf(want, sizeof want, "%s/run/a/b/events.out.tfevents.", dir);
    assert_int_equal(strncmp(path, want, strlen(want)), 0);
    const char *p = path + strlen(want);
    for (int i = 0; i < 10; i++)
        assert_true(p[i] >= '0' && p[i] <= '9');
    long long secs = atoll(p);
    assert_true(secs >= (long long)t0 && secs <= (long long)t0 + 5);
    snprintf(want, sizeof want, ".%s.%ld.0", host, (long)getpid());
    assert_string_equal(p + 10, want);

    /* Synthetic values encode where they came from: step s of tag k holds k + s / 1000. */
    static const char *const tags[] = {"train/loss", "train/lr", "val/accuracy", "ünïcode/✓"};
    for (int64_t s = 0; s < 50; s++)
        for (int k = 0; k < 4; k++)
            assert_int_equal(ddp_tb_scalar(tb, tags[k], s * 10, k + (double)s / 1000, 1e9 + s),
                             DDP_OK);
    /* Special values; a negative and a huge step; the current time for wall_time 0. */
    assert_int_equal(ddp_tb_scalar(tb, "x/nan", -1, NAN, 0), DDP_OK);
    assert_int_equal(ddp_tb_scalar(tb, "x/inf", INT64_MAX, INFINITY, 0), DDP_OK);
    assert_int_equal(ddp_tb_scalar(tb, "x/ninf", INT64_MIN, -INFINITY, 0), DDP_OK);
    assert_int_equal(ddp_tb_scalar(tb, "x/tiny", 1, 1e-45, 1.25), DDP_OK);
    assert_int_equal(ddp_tb_scalar(tb, "x/rounded", 2, 0.1, 1.25), DDP_OK);
    char longtag[DDP_TB_MAX_TAG + 1];
    memset(longtag, 't', DDP_TB_MAX_TAG);
    longtag[DDP_TB_MAX_TAG] = '\0';
    assert_int_equal(ddp_tb_scalar(tb, longtag, 3, 3.0, 1.25), DDP_OK);
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", path);
    ddp_tb_close(tb);

    event *ev;
    size_t n = read_events(keep, &ev);
    assert_int_equal(n, 1 + 200 + 6);
    assert_string_equal(ev[0].version, "brain.Event:2");
    assert_int_equal(ev[0].nvalues, 0);
    assert_true(ev[0].wall >= t0 && ev[0].wall < t0 + 5);
    for (int64_t s = 0; s < 50; s++)
        for (int k = 0; k < 4; k++) {
            const event *e = &ev[1 + s * 4 + k];
            assert_string_equal(e->tag, tags[k]);
            assert_int_equal(e->step, s * 10);
            assert_true(e->value == (float)(k + (double)s / 1000));
            assert_true(e->wall == 1e9 + s);
            assert_int_equal(e->nvalues, 1);
            assert_string_equal(e->version, "");
        }
    const event *x = &ev[201];
    assert_string_equal(x[0].tag, "x/nan");
    assert_true(isnan(x[0].value));
    assert_int_equal(x[0].step, -1);
    assert_true(x[0].wall >= t0 && x[0].wall < t0 + 5);
    assert_true(isinf(x[1].value) && x[1].value > 0);
    assert_int_equal(x[1].step, INT64_MAX);
    assert_true(isinf(x[2].value) && x[2].value < 0);
    assert_int_equal(x[2].step, INT64_MIN);
    assert_true(x[3].value == 1e-45f && x[3].value > 0); /* a float32 subnormal */
    assert_true(x[4].value == 0.1f);
    assert_string_equal(x[5].tag, longtag);
    assert_true(x[5].wall == 1.25);
    free(ev);
}

static void names_are_new(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/names", dir);
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.suffix = ".rank0";
    ddp_tb *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(ddp_tb_open(sub, NULL, &a, NULL), DDP_OK);
    assert_int_equal(ddp_tb_open(sub, NULL, &b, NULL), DDP_OK);
    assert_int_equal(ddp_tb_open(sub, &o, &c, NULL), DDP_OK);
    assert_string_not_equal(ddp_tb_path(a), ddp_tb_path(b));
    const char *pc = ddp_tb_path(c);
    assert_string_equal(pc + strlen(pc) - 6, ".rank0");
    assert_int_equal(ddp_tb_scalar(a, "w/a", 1, 1, 0), DDP_OK);
    assert_int_equal(ddp_tb_scalar(b, "w/b", 2, 2, 0), DDP_OK);
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s", ddp_tb_path(a));
    snprintf(pb, sizeof pb, "%s", ddp_tb_path(b));
    ddp_tb_close(a);
    ddp_tb_close(b);
    ddp_tb_close(c);
    event *ev;
    assert_int_equal(read_events(pa, &ev), 2);
    assert_string_equal(ev[1].tag, "w/a");
    free(ev);
    assert_int_equal(read_events(pb, &ev), 2);
    assert_string_equal(ev[1].tag, "w/b");
    free(ev);
    assert_int_equal(count_files(sub), 3);
    /* A restart in the same second with a smaller pid as text, or another host's file from a
     * clock ahead: the new file still sorts after every file there (TensorBoard's order). */
    char later[1200];
    snprintf(later, sizeof later, "%s/events.out.tfevents.%010lld.other.99999.0", sub,
             (long long)time(NULL) + 5);
    FILE *f = fopen(later, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(ddp_tb_open(sub, NULL, &a, NULL), DDP_OK);
    assert_true(strcmp(ddp_tb_path(a), later) > 0);
    assert_true(strcmp(ddp_tb_path(a), pb) > 0);
    ddp_tb_close(a);
}

static void purge_step(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/purge", dir);
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.purge_step = 600;
    ddp_tb *tb = NULL;
    assert_int_equal(ddp_tb_open(sub, &o, &tb, NULL), DDP_OK);
    assert_int_equal(ddp_tb_scalar(tb, "train/loss", 601, 1.0, 0), DDP_OK);
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", ddp_tb_path(tb));
    ddp_tb_close(tb);
    event *ev;
    assert_int_equal(read_events(keep, &ev), 3);
    assert_string_equal(ev[0].version, "brain.Event:2");
    assert_int_equal(ev[1].session, 1); /* START */
    assert_int_equal(ev[1].step, 600);
    assert_int_equal(ev[1].nvalues, 0);
    assert_true(ev[1].wall == ev[0].wall);
    assert_int_equal(ev[2].step, 601);
    assert_int_equal(ev[2].session, 0);
    free(ev);
}

static void buffering(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/buf", dir);
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.flush_ms = 3600 * 1000;
    ddp_tb *tb = NULL;
    assert_int_equal(ddp_tb_open(sub, &o, &tb, NULL), DDP_OK);
    const char *path = ddp_tb_path(tb);
    off_t first = file_size(path); /* the version record is written at open */
    assert_int_equal(first, 16 + 24);
    assert_int_equal(ddp_tb_scalar(tb, "a", 1, 1, 0), DDP_OK);
    assert_int_equal(file_size(path), first); /* buffered */
    assert_int_equal(ddp_tb_flush(tb), DDP_OK);
    off_t one = file_size(path);
    assert_true(one > first);
    assert_int_equal(ddp_tb_flush(tb), DDP_OK); /* nothing to write */
    assert_int_equal(file_size(path), one);
    /* 64 KiB of records is written whatever flush_ms says. */
    int k = 0;
    while (file_size(path) == one) {
        assert_int_equal(ddp_tb_scalar(tb, "b", k, k, 0), DDP_OK);
        assert_true(++k < 10000);
    }
    assert_true(file_size(path) >= one + 60000);
    ddp_tb_close(tb);

    o.flush_ms = 0; /* every record at once */
    assert_int_equal(ddp_tb_open(sub, &o, &tb, NULL), DDP_OK);
    path = ddp_tb_path(tb);
    assert_int_equal(ddp_tb_scalar(tb, "a", 1, 1, 0), DDP_OK);
    assert_true(file_size(path) > first);
    ddp_tb_close(tb);

    o.flush_ms = 100;
    assert_int_equal(ddp_tb_open(sub, &o, &tb, NULL), DDP_OK);
    path = ddp_tb_path(tb);
    assert_int_equal(ddp_tb_scalar(tb, "a", 1, 1, 0), DDP_OK);
    assert_int_equal(file_size(path), first);
    usleep(150 * 1000);
    assert_int_equal(ddp_tb_scalar(tb, "a", 2, 2, 0), DDP_OK); /* the first is now 150 ms old */
    event *ev;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", path);
    assert_int_equal(read_events(keep, &ev), 3);
    free(ev);
    ddp_tb_close(tb);
}

static void bad_tags_and_options(void **state)
{
    (void)state;
    char sub[512];
    snprintf(sub, sizeof sub, "%s/bad", dir);
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.flush_ms = 0;
    ddp_tb *tb = NULL;
    assert_int_equal(ddp_tb_open(sub, &o, &tb, NULL), DDP_OK);
    off_t size = file_size(ddp_tb_path(tb));
    char longtag[DDP_TB_MAX_TAG + 2];
    memset(longtag, 't', DDP_TB_MAX_TAG + 1);
    longtag[DDP_TB_MAX_TAG + 1] = '\0';
    static const char *const bad[] = {
        "",
        "\xc3",             /* a lead byte with nothing after it */
        "a\xc3(b",          /* a lead byte, then no continuation */
        "\xc0\xaf",         /* an overlong '/' */
        "\xed\xa0\x80",     /* a UTF-16 surrogate */
        "\xf4\x90\x80\x80", /* past U+10FFFF */
        "\xff",
        "\x80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ddp_tb_scalar(tb, bad[i], 1, 1, 0), DDP_ERR_INVALID);
        assert_non_null(strstr(ddp_tb_last_error(tb), "UTF-8"));
    }
    assert_int_equal(ddp_tb_scalar(tb, longtag, 1, 1, 0), DDP_ERR_INVALID);
    assert_int_equal(ddp_tb_scalar(tb, NULL, 1, 1, 0), DDP_ERR_INVALID);
    assert_int_equal(file_size(ddp_tb_path(tb)), size); /* nothing recorded */
    /* Good UTF-8 of every length. */
    assert_int_equal(ddp_tb_scalar(tb, "\xc3\xa9\xe2\x9c\x93\xf0\x9f\x98\x80", 1, 1, 0), DDP_OK);
    ddp_tb_close(tb);

    ddp_error err = {0};
    o.suffix = "a/b";
    assert_int_equal(ddp_tb_open(sub, &o, &tb, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "suffix"));
    o.suffix = NULL;
    o.flush_ms = -1;
    assert_int_equal(ddp_tb_open(sub, &o, &tb, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_tb_open(NULL, NULL, &tb, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_tb_open("", NULL, &tb, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_tb_open(sub, NULL, NULL, &err), DDP_ERR_INVALID);

    ddp_tb_close(NULL);
    assert_string_equal(ddp_tb_path(NULL), "");
    assert_string_equal(ddp_tb_last_error(NULL), "");
    assert_int_equal(ddp_tb_flush(NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_tb_scalar(NULL, "a", 1, 1, 0), DDP_ERR_INVALID);
}

static void directory_errors(void **state)
{
    (void)state;
    char file[512], sub[600];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    ddp_tb *tb = NULL;
    ddp_error err = {0};

    /* A file where a directory should be, as the directory and as a parent. */
    assert_int_equal(ddp_tb_open(file, NULL, &tb, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "plainfile"));
    assert_null(strchr(err.msg, '\n'));
    print_message("    %s\n", err.msg);
    snprintf(sub, sizeof sub, "%s/deeper/still", file);
    assert_int_equal(ddp_tb_open(sub, NULL, &tb, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "plainfile'"));
    assert_non_null(strstr(err.msg, "in the way"));
    print_message("    %s\n", err.msg);
    assert_null(tb);

    /* A directory that cannot be created: under /proc nothing can. */
    assert_int_equal(ddp_tb_open("/proc/ddp-tb-test/x", NULL, &tb, &err), DDP_ERR_SYSTEM);
    assert_non_null(strstr(err.msg, "/proc/ddp-tb-test"));
    print_message("    %s\n", err.msg);
    assert_null(tb);
}

/* Runs fn in a child whose files may grow to at most limit bytes; returns the child's message. */
static int in_small_fsize(rlim_t limit, int (*fn)(const char *sub, char *msg, size_t cap),
                          const char *sub, char *msg, size_t cap)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* no cmocka in the child: the exit code and the pipe report */
        close(pfd[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            _exit(90);
        char m[DDP_ERRMSG_MAX] = "";
        int rc = fn(sub, m, sizeof m);
        ssize_t w = write(pfd[1], m, strlen(m) + 1);
        (void)w;
        _exit(rc);
    }
    close(pfd[1]);
    memset(msg, 0, cap);
    size_t got = 0;
    ssize_t r;
    while (got < cap - 1 && (r = read(pfd[0], msg + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    close(pfd[0]);
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    return WEXITSTATUS(ws);
}

/* Writes scalars until a write fails; 0 when it failed as it should (path in msg first). */
static int fill_disk(const char *sub, char *msg, size_t cap)
{
    ddp_tb_opts o = DDP_TB_OPTS_INIT;
    o.flush_ms = 3600 * 1000;
    ddp_tb *tb = NULL;
    ddp_error err = {0};
    if (ddp_tb_open(sub, &o, &tb, &err) != DDP_OK) {
        snprintf(msg, cap, "open: %.400s", err.msg); /* 400: fits any cap ≥ 407 (Release's check) */
        return 1;
    }
    /* Batches of 7 records (as a trainer's log interval), flushed together. */
    ddp_status st = DDP_OK;
    int64_t step = 0;
    for (int i = 0; i < 1000 && st == DDP_OK; i++) {
        for (int k = 0; k < 7; k++, step++)
            if (ddp_tb_scalar(tb, "train/loss", step, (double)step, 0) != DDP_OK)
                return 2;
        st = ddp_tb_flush(tb);
    }
    if (st != DDP_ERR_SYSTEM) {
        snprintf(msg, cap, "flush returned %d", (int)st);
        return 3;
    }
    snprintf(msg, cap, "%s\n%s", ddp_tb_path(tb), ddp_tb_last_error(tb));
    /* Later calls keep going: a record too big for the space left fails again, cleanly. */
    static char big[1001];
    memset(big, 'b', 1000);
    if (ddp_tb_scalar(tb, big, step, 0, 0) != DDP_OK || ddp_tb_flush(tb) != DDP_ERR_SYSTEM)
        return 4;
    ddp_tb_close(tb);
    return 0;
}

static int open_on_full_disk(const char *sub, char *msg, size_t cap)
{
    ddp_tb *tb = NULL;
    ddp_error err = {0};
    ddp_status st = ddp_tb_open(sub, NULL, &tb, &err);
    snprintf(msg, cap, "%s", err.msg);
    return st == DDP_ERR_SYSTEM && tb == NULL ? 0 : 1;
}

static void full_disk(void **state)
{
    (void)state;
    char sub[512], msg[2 * DDP_ERRMSG_MAX];
    snprintf(sub, sizeof sub, "%s/full", dir);
    int rc = in_small_fsize(3000, fill_disk, sub, msg, sizeof msg);
    if (rc != 0)
        fail_msg("child: exit %d, %s", rc, msg);
    char *nl = strchr(msg, '\n');
    assert_non_null(nl);
    *nl = '\0';
    const char *why = nl + 1;
    print_message("    %s\n", why);
    assert_non_null(strstr(why, strerror(EFBIG)));
    assert_non_null(strstr(why, "7 records"));
    assert_non_null(strstr(why, msg)); /* names the file */
    assert_null(strchr(why, '\n'));
    /* The file holds whole records only, every one readable, all before the failure. */
    event *ev;
    size_t n = read_events(msg, &ev);
    assert_true(file_size(msg) <= 3000);
    assert_true(n > 1 && (n - 1) % 7 == 0);
    for (size_t i = 1; i < n; i++)
        assert_int_equal(ev[i].step, (int64_t)i - 1);
    free(ev);

    /* Too full for even the version record: an error, and no empty file left behind. */
    snprintf(sub, sizeof sub, "%s/full0", dir);
    rc = in_small_fsize(10, open_on_full_disk, sub, msg, sizeof msg);
    if (rc != 0)
        fail_msg("child: exit %d, %s", rc, msg);
    print_message("    %s\n", msg);
    assert_non_null(strstr(msg, strerror(EFBIG)));
    assert_int_equal(count_files(sub), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-tb-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(crc32c_vectors),
        cmocka_unit_test(varints),
        cmocka_unit_test(event_bytes),
        cmocka_unit_test(framing),
        cmocka_unit_test(round_trip),
        cmocka_unit_test(names_are_new),
        cmocka_unit_test(purge_step),
        cmocka_unit_test(buffering),
        cmocka_unit_test(bad_tags_and_options),
        cmocka_unit_test(directory_errors),
        cmocka_unit_test(full_disk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
