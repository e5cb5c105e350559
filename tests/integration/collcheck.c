/*
 * collcheck — checks every collective against a reference, run under ddprun at any world size:
 *
 *   ddprun --nproc_per_node=W collcheck [--big] [--quick]
 *
 * Every rank's input is a known function of (rank, index), so each rank computes the exact
 * expected result itself. Values are small integers, so sums, averages and products are exact
 * in every dtype (products stay ≤ 2^8, which bfloat16 and float16 hold exactly) and results are
 * compared bit for bit — a sharding or ordering bug shows at once as a wrong value.
 * Covers allreduce (sum avg min max prod), broadcast (first and last root), allgather,
 * reduce_scatter and barrier × 7 dtypes × counts (0, 1, 7, odd, not divisible by W, across the
 * small/large and chunk boundaries; --big adds 64 MB) × in place / out of place / async /
 * arena (zero-copy) buffers.
 * --edges: allreduce only (sum and avg, float32 and bfloat16, every buffer mode) at sizes one
 * element either side of each boundary the shm allreduce's variants cut at — the staging chunk,
 * the pipelined variant's possible blocks, the size bands of the choice (src/group/shm/shm_int.h)
 * — run under each DDP_SHM_ALGO by CTest (collectives.shm.algo.*).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"
#include "util/half.h" /* the half-precision conversions, for the reference */

enum kind { ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER, BARRIER };

static const char *kind_name(enum kind k)
{
    static const char *const names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                        "barrier"};
    return names[k];
}

static int W, R;
static long checks;

/* Input of rank r at index i for op: small positive integers. */
static double input(int r, size_t i, ddp_op op)
{
    if (op == DDP_PROD)
        return (double)((r + i) % 2 + 1);
    return (double)((r * 3 + i * 7) % 11 + 1);
}

static void store_val(void *buf, size_t i, ddp_dtype t, double v)
{
    switch (t) {
    case DDP_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case DDP_FLOAT64: ((double *)buf)[i] = v; break;
    case DDP_BFLOAT16: ((uint16_t *)buf)[i] = ddp__f32_to_bf16((float)v); break;
    case DDP_FLOAT16: ((uint16_t *)buf)[i] = ddp__f32_to_f16((float)v); break;
    case DDP_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DDP_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DDP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(unsigned)v; break;
    default: break;
    }
}

/* The expected value of a reduction over all ranks at index i, stored in t's format. */
static void expect_reduce(void *buf, size_t i, size_t idx, ddp_dtype t, ddp_op op)
{
    double acc = input(0, idx, op);
    for (int r = 1; r < W; r++) {
        double x = input(r, idx, op);
        switch (op) {
        case DDP_SUM:
        case DDP_AVG: acc += x; break;
        case DDP_MIN: acc = x < acc ? x : acc; break;
        case DDP_MAX: acc = x > acc ? x : acc; break;
        case DDP_PROD: acc *= x; break;
        default: break;
        }
    }
    if (op == DDP_PROD && t == DDP_UINT8)
        acc = (double)((unsigned long long)acc % 256);
    if (op != DDP_AVG) {
        store_val(buf, i, t, acc);
        return;
    }
    switch (t) { /* the same arithmetic the library promises: divide the exact sum once */
    case DDP_FLOAT32: ((float *)buf)[i] = (float)acc / (float)W; break;
    case DDP_FLOAT64: ((double *)buf)[i] = acc / W; break;
    case DDP_BFLOAT16: ((uint16_t *)buf)[i] = ddp__f32_to_bf16((float)acc / (float)W); break;
    case DDP_FLOAT16: ((uint16_t *)buf)[i] = ddp__f32_to_f16((float)acc / (float)W); break;
    case DDP_INT32: ((int32_t *)buf)[i] = (int32_t)acc / W; break;
    case DDP_INT64: ((int64_t *)buf)[i] = (int64_t)acc / W; break;
    case DDP_UINT8: ((uint8_t *)buf)[i] = (uint8_t)((unsigned)acc / (unsigned)W); break;
    default: break;
    }
}

static int fail_at(const char *what, ddp_dtype t, size_t count, const char *mode, size_t i,
                   const void *got, const void *want)
{
    size_t esz = ddp_dtype_size(t);
    unsigned long long g = 0, w = 0;
    memcpy(&g, (const char *)got + i * esz, esz);
    memcpy(&w, (const char *)want + i * esz, esz);
    fprintf(stderr,
            "collcheck rank %d/%d: %s %s × %zu (%s): element %zu is 0x%llx, expected 0x%llx\n", R,
            W, what, ddp_dtype_name(t), count, mode, i, g, w);
    return 1;
}

static int compare(const char *what, ddp_dtype t, size_t count, const char *mode, const void *got,
                   const void *want, size_t n)
{
    size_t esz = ddp_dtype_size(t);
    if (n && memcmp(got, want, n * esz) != 0) {
        for (size_t i = 0; i < n; i++)
            if (memcmp((const char *)got + i * esz, (const char *)want + i * esz, esz))
                return fail_at(what, t, count, mode, i, got, want);
    }
    checks++;
    return 0;
}

enum mode { IN_PLACE, OUT_OF_PLACE, ASYNC, ARENA, ARENA_IN_PLACE, MODE_COUNT };
static const char *const mode_names[] = {"in place", "out of place", "async", "arena",
                                         "arena in place"};

typedef struct bufs {
    char *a, *b, *ref; /* a: send (or in/out), b: recv; from the arena in ARENA mode */
    bool arena;
} bufs;

static int get_bufs(ddp_group *g, enum mode m, size_t bytes, bufs *x)
{
    x->arena = false;
    if (m == ARENA || m == ARENA_IN_PLACE) {
        x->a = ddp_group_alloc(g, bytes);
        x->b = ddp_group_alloc(g, bytes);
        if (x->a && x->b) {
            x->arena = true;
        } else {
            ddp_group_free(g, x->a);
            ddp_group_free(g, x->b);
            x->a = x->b = NULL;
        }
    }
    if (!x->arena) {
        x->a = malloc(bytes + 64);
        x->b = malloc(bytes + 64);
    }
    x->ref = malloc(bytes + 64);
    return x->a && x->b && x->ref ? 0 : -1;
}

static void put_bufs(ddp_group *g, bufs *x)
{
    if (x->arena) {
        ddp_group_free(g, x->a);
        ddp_group_free(g, x->b);
    } else {
        free(x->a);
        free(x->b);
    }
    free(x->ref);
}

/* Runs one collective in the given mode; async issues it together with a barrier behind it. */
static ddp_status run(ddp_group *g, enum mode m, enum kind k, const void *s, void *r, size_t n,
                      ddp_dtype t, ddp_op op, int root)
{
    if (m != ASYNC) {
        switch (k) {
        case ALLREDUCE: return ddp_allreduce(g, s, r, n, t, op);
        case BROADCAST: return ddp_broadcast(g, r, n, t, root);
        case ALLGATHER: return ddp_allgather(g, s, r, n, t);
        case REDUCE_SCATTER: return ddp_reduce_scatter(g, s, r, n, t, op);
        default: return ddp_barrier(g);
        }
    }
    ddp_work *w1 = NULL, *w2 = NULL;
    ddp_status st;
    switch (k) {
    case ALLREDUCE: st = ddp_allreduce_async(g, s, r, n, t, op, &w1); break;
    case BROADCAST: st = ddp_broadcast_async(g, r, n, t, root, &w1); break;
    case ALLGATHER: st = ddp_allgather_async(g, s, r, n, t, &w1); break;
    case REDUCE_SCATTER: st = ddp_reduce_scatter_async(g, s, r, n, t, op, &w1); break;
    default: st = ddp_barrier_async(g, &w1); break;
    }
    if (st)
        return st;
    if ((st = ddp_barrier_async(g, &w2))) {
        ddp_work_free(w1);
        return st;
    }
    /* Wait for the later one first: completion in issue order means the first is done too. */
    ddp_status s2 = ddp_work_wait(w2);
    ddp_status s1;
    if (!ddp_work_test(w1, &s1)) {
        fprintf(stderr, "collcheck: async work finished out of order\n");
        s1 = DDP_ERR_INVALID;
    }
    ddp_work_free(w1);
    ddp_work_free(w2);
    return s1 ? s1 : s2;
}

static int check_one(ddp_group *g, enum kind k, ddp_dtype t, ddp_op op, size_t n, enum mode m,
                     int root)
{
    size_t esz = ddp_dtype_size(t);
    bool gathered = k == ALLGATHER || k == REDUCE_SCATTER;
    size_t big = gathered ? n * (size_t)W : n; /* elements of the larger buffer */
    bufs x;
    if (get_bufs(g, m, big * esz, &x) != 0) {
        fprintf(stderr, "collcheck: out of memory\n");
        return 1;
    }
    const char *mode = mode_names[m];
    int rc = 0;
    const void *send = x.a;
    bool in_place = m == IN_PLACE || m == ARENA_IN_PLACE;
    void *recv = in_place ? x.a : x.b;
    size_t outn = n;
    switch (k) {
    case ALLREDUCE:
        for (size_t i = 0; i < n; i++) {
            store_val(x.a, i, t, input(R, i, op));
            expect_reduce(x.ref, i, i, t, op);
        }
        break;
    case BROADCAST:
        recv = x.a;
        for (size_t i = 0; i < n; i++) {
            store_val(x.a, i, t, R == root ? input(root, i, DDP_SUM) : 0);
            store_val(x.ref, i, t, input(root, i, DDP_SUM));
        }
        break;
    case ALLGATHER:
        outn = big;
        if (in_place) {
            recv = x.a;
            send = x.a + (size_t)R * n * esz;
            memset(x.a, 0, big * esz);
        }
        for (size_t i = 0; i < n; i++)
            store_val((char *)send, i, t, input(R, i, DDP_SUM));
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++)
                store_val(x.ref, (size_t)r * n + i, t, input(r, i, DDP_SUM));
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < big; i++)
            store_val(x.a, i, t, input(R, i, op));
        if (in_place)
            recv = x.a + (size_t)R * n * esz;
        for (size_t i = 0; i < n; i++)
            expect_reduce(x.ref, i, (size_t)R * n + i, t, op);
        break;
    default: break;
    }
    ddp_status st = run(g, m, k, send, recv, n, t, op, root);
    if (st != DDP_OK) {
        fprintf(stderr, "collcheck rank %d: %s %s × %zu (%s) failed: %s\n", R, kind_name(k),
                ddp_dtype_name(t), n, mode, ddp_group_last_error(g));
        rc = 1;
    } else if (k != BARRIER) {
        char what[64];
        snprintf(what, sizeof what, "%s/%s", kind_name(k), ddp_op_name(op));
        rc = compare(what, t, n, mode, recv, x.ref, outn);
    } else {
        checks++;
    }
    put_bufs(g, &x);
    return rc;
}

int main(int argc, char **argv)
{
    bool bigrun = false, quick = false, edges = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--big"))
            bigrun = true;
        else if (!strcmp(argv[i], "--edges"))
            edges = true;
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
    }
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.timeout_ms = 120000;
    o.arena_bytes = (size_t)160 << 20; /* room for two 64 MB arena buffers */
    if (ddp_group_init(&o, &g, &err) != DDP_OK) {
        fprintf(stderr, "collcheck: %s\n", err.msg);
        return 1;
    }
    W = ddp_group_size(g);
    R = ddp_group_rank(g);
    size_t counts[] = {0, 1, 7, 1003, 8191, 8192 * 3 + 5, 300007};
    int ncounts = quick ? 5 : (int)(sizeof counts / sizeof counts[0]);
    int rc = 0;
    if (edges) {
        /* Bytes at which the variants cut: 128 KiB … 1 MiB blocks (and the 1 MiB staging chunk),
         * band edges at 128 KiB, 512 KiB, 2 MiB, 8 MiB. */
        const size_t cuts[] = {(size_t)128 << 10, (size_t)256 << 10, (size_t)512 << 10,
                               (size_t)1 << 20,   (size_t)2 << 20,   (size_t)3 << 20,
                               (size_t)8 << 20};
        const ddp_dtype types[] = {DDP_FLOAT32, DDP_BFLOAT16};
        /* --quick (the sanitizer builds): float32 only, cuts up to 2 MiB. */
        size_t ncuts = quick ? 5 : sizeof cuts / sizeof cuts[0];
        int ntypes = quick ? 1 : 2;
        for (size_t ci = 0; ci < ncuts && !rc; ci++)
            for (int ti = 0; ti < ntypes && !rc; ti++) {
                size_t at = cuts[ci] / ddp_dtype_size(types[ti]);
                for (size_t n = at - 1; n <= at + 1 && !rc; n++)
                    for (int m = 0; m < MODE_COUNT && !rc; m++) {
                        rc |= check_one(g, ALLREDUCE, types[ti], DDP_SUM, n, m, 0);
                        if (!rc && m == 0)
                            rc |= check_one(g, ALLREDUCE, types[ti], DDP_AVG, n, m, 0);
                    }
            }
        if (!rc && R == 0)
            printf("collcheck: %ld checks passed on %d rank%s (backend %s, %s at 1 MiB)\n", checks,
                   W, W == 1 ? "" : "s", ddp_group_backend(g),
                   ddp_group_algorithm(g, (size_t)1 << 20));
        ddp_group_destroy(g);
        return rc;
    }
    for (int m = 0; m < MODE_COUNT && !rc; m++)
        for (int t = 0; t < DDP_DTYPE_COUNT && !rc; t++)
            for (int c = 0; c < ncounts && !rc; c++) {
                size_t n = counts[c];
                for (int op = 0; op < DDP_OP_COUNT && !rc; op++) {
                    rc |= check_one(g, ALLREDUCE, t, op, n, m, 0);
                    if (!rc && (op == DDP_SUM || op == DDP_MAX || op == DDP_AVG))
                        rc |= check_one(g, REDUCE_SCATTER, t, op, n, m, 0);
                }
                if (!rc)
                    rc |= check_one(g, BROADCAST, t, DDP_SUM, n, m, 0);
                if (!rc)
                    rc |= check_one(g, BROADCAST, t, DDP_SUM, n, m, W - 1);
                if (!rc)
                    rc |= check_one(g, ALLGATHER, t, DDP_SUM, n, m, 0);
                if (!rc)
                    rc |= check_one(g, BARRIER, t, DDP_SUM, 0, m, 0);
            }
    if (bigrun) { /* 64 MB of float32 and bfloat16, every kind, each mode */
        size_t n = (size_t)16 << 20;
        for (int m = 0; m < MODE_COUNT && !rc; m++) {
            rc |= check_one(g, ALLREDUCE, DDP_FLOAT32, DDP_SUM, n, m, 0);
            if (!rc && m == 0)
                rc |= check_one(g, ALLREDUCE, DDP_BFLOAT16, DDP_AVG, 2 * n, m, 0);
            if (!rc)
                rc |= check_one(g, BROADCAST, DDP_FLOAT32, DDP_SUM, n, m, W - 1);
            if (!rc)
                rc |= check_one(g, ALLGATHER, DDP_FLOAT32, DDP_SUM, n / (size_t)W, m, 0);
            if (!rc)
                rc |= check_one(g, REDUCE_SCATTER, DDP_FLOAT32, DDP_SUM, n / (size_t)W, m, 0);
        }
    }
    if (!rc && W > 1 && !strcmp(ddp_group_backend(g), "shm")) {
        /* Rank 0 passes arena memory, the others do not: a clear error everywhere, no hang.
         * Last, because it poisons the group. */
        size_t n = 300007, bytes = n * sizeof(float);
        float *buf = R == 0 ? ddp_group_alloc(g, bytes) : malloc(bytes);
        ddp_status st = buf ? ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM) : DDP_ERR_NOMEM;
        const char *msg = ddp_group_last_error(g);
        if (st != DDP_ERR_INVALID || !strstr(msg, "ddp_group_alloc() memory")) {
            fprintf(stderr, "collcheck rank %d: mixed arena/private buffers gave %s: %s\n", R,
                    ddp_status_str(st), msg);
            rc = 1;
        }
        if (R == 0)
            ddp_group_free(g, buf);
        else
            free(buf);
        checks++;
    }
    if (!rc && R == 0)
        printf("collcheck: %ld checks passed on %d rank%s (backend %s)\n", checks, W,
               W == 1 ? "" : "s", ddp_group_backend(g));
    ddp_group_destroy(g);
    return rc;
}
