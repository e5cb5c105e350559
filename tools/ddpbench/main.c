/*
 * ddpbench — collectives benchmark, in the manner of nccl-tests, run under ddprun:
 *
 *   ddprun --nproc_per_node=2 ddpbench [--op allreduce|broadcast|allgather|reduce_scatter|all]
 *          [--min 4] [--max 256M] [--sizes 4K,1M,16M] [--backend auto|shm|tcp|…]
 *          [--buffers arena|private] [--device cpu|cuda] [--iters N] [--csv]
 *          [--dtype float32|bfloat16|float16] [--reduce sum|avg|min|max]
 *
 * Every size is bytes per rank of --dtype's elements (float32 by default); --reduce is the
 * operation of allreduce and reduce_scatter (sum by default). A flag with a bad value (an unknown
 * --op, a size that is not a number of bytes, --min above --max) stops it before any work, exit 2.
 *
 * For each size (bytes per rank) it prints the median time per call, the algorithm bandwidth
 * (size / time), the bus bandwidth (nccl-tests' correction for how much data each rank moves),
 * the number of wrong elements found by checking the result, and the memory-bandwidth limit:
 * the least time any implementation needs to move the bytes this collective must read and
 * write on one host (2·W·S for allreduce), at the copy bandwidth measured by all local ranks at
 * once in this same run. Uses only the public API.
 *
 * --device cuda puts the buffers in GPU memory (ddp_group_alloc of a GPU group: nccl, or
 * cuda-ipc or cuda-staged where ranks share a GPU; --backend picks one) and measures the same way;
 * the limit is then the device's copy bandwidth (a device-to-device ddp_group_memcpy, read +
 * write), and the results are checked by copying them back to the host.
 *
 * Uses only the public API, and util/half.h's element conversions for the bfloat16/float16 checks.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"
#include "util/half.h"

typedef enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_COUNT } kind;
static const char *const kind_names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The largest size accepted (bytes per rank): the group's count limit is 2^40 elements. */
#define MAX_SIZE ((size_t)1 << 40)
/* The most sizes one run measures (--min to --max by factors of 4 gives at most 21). */
#define MAX_SIZES 64

/* Parses a size in bytes: a number (fractions allowed) with an optional K, M, G or T suffix
 * (×1024, ×1024², ×1024³, ×1024⁴) and nothing else. Writes *out and returns true when the value is
 * a whole number of bytes from 1 to MAX_SIZE; false for anything else ("abc", "-1", "4X", "0"). */
static bool parse_size(const char *s, size_t *out)
{
    char *end;
    if (!s || !*s || *s == '-' || *s == '+')
        return false;
    double v = strtod(s, &end);
    if (end == s)
        return false;
    switch (*end) {
    case 'K':
    case 'k': v *= 1024, end++; break;
    case 'M':
    case 'm': v *= 1024 * 1024, end++; break;
    case 'G':
    case 'g': v *= 1024.0 * 1024 * 1024, end++; break;
    case 'T':
    case 't': v *= 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (*end || !(v >= 1) || v > (double)MAX_SIZE || v != (double)(size_t)v)
        return false;
    *out = (size_t)v;
    return true;
}

static int bad_size(const char *flag, const char *v)
{
    fprintf(stderr,
            "ddpbench: %s '%s': give a whole number of bytes from 1 to 1T, with an optional K, M, "
            "G or T suffix (4K, 1.5M, 256M)\n",
            flag, v);
    return 2;
}

static void die(ddp_group *g, const char *what)
{
    if (g)
        fprintf(stderr, "ddpbench: %s: %s\n", what, ddp_group_last_error(g));
    else
        fprintf(stderr, "ddpbench: %s\n", what);
    exit(1);
}

/* A GPU group's scratch of 8 bytes in device memory; NULL for a CPU group. */
static void *value_scratch;

/* An allreduce of one host value (a time, a count of wrong elements). A GPU group takes device
 * memory only (NCCL, the CUDA IPC mapping and the staged copies all read the buffers as the
 * GPU's), so the value goes through value_scratch there. */
static ddp_status allreduce_value(ddp_group *g, const void *in, void *out, ddp_dtype t, ddp_op op)
{
    if (!value_scratch)
        return ddp_allreduce(g, in, out, 1, t, op);
    ddp_status st = ddp_group_memcpy(g, value_scratch, in, 8);
    if (!st)
        st = ddp_allreduce(g, value_scratch, value_scratch, 1, t, op);
    if (!st)
        st = ddp_group_memcpy(g, out, value_scratch, 8);
    return st;
}

/* Copy bandwidth with every local rank copying at once: bytes read + written per second, summed
 * over the ranks (the machine's figure, not one core's). */
static double measure_copy_bw(ddp_group *g)
{
    size_t bytes = (size_t)64 << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b)
        die(NULL, "out of memory");
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        if (ddp_barrier(g))
            die(g, "barrier");
        double t0 = now_s();
        memcpy(b, a, bytes);
        double t = now_s() - t0;
        double tmax;
        if (allreduce_value(g, &t, &tmax, DDP_FLOAT64, DDP_MAX))
            die(g, "allreduce");
        if (tmax < best)
            best = tmax;
    }
    free(a);
    free(b);
    return 2.0 * (double)bytes * ddp_group_size(g) / best;
}

/* A GPU's copy bandwidth: a device-to-device copy of 256 MiB, bytes read + written per second,
 * the best of 5 (one GPU's figure: ranks sharing it time-slice it). */
static double measure_device_bw(ddp_group *g)
{
    size_t bytes = (size_t)256 << 20;
    void *a = ddp_group_alloc(g, bytes), *b = ddp_group_alloc(g, bytes);
    if (!a || !b)
        die(g, "device memory for the copy bandwidth");
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now_s();
        if (ddp_group_memcpy(g, b, a, bytes))
            die(g, "device copy");
        double t = now_s() - t0;
        if (t < best)
            best = t;
    }
    ddp_group_free(g, a);
    ddp_group_free(g, b);
    return 2.0 * (double)bytes / best;
}

/* The element type and the reduction of this run (--dtype, --reduce). */
static ddp_dtype dtype = DDP_FLOAT32;
static ddp_op redop = DDP_SUM;

static ddp_status run_op(ddp_group *g, kind k, void *send, void *recv, size_t count)
{
    switch (k) {
    case K_ALLREDUCE: return ddp_allreduce(g, send, send, count, dtype, redop);
    case K_BROADCAST: return ddp_broadcast(g, send, count, dtype, 0);
    case K_ALLGATHER: return ddp_allgather(g, send, recv, count, dtype);
    default: return ddp_reduce_scatter(g, send, recv, count, dtype, redop);
    }
}

/* Element i of buffer p as a float, and v stored there (v is a small integer or an average of
 * them; bfloat16 and float16 round to nearest even, as the collectives do). */
static float get_elem(const void *p, size_t i)
{
    switch (dtype) {
    case DDP_BFLOAT16: return ddp__bf16_to_f32(((const uint16_t *)p)[i]);
    case DDP_FLOAT16: return ddp__f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static void set_elem(void *p, size_t i, float v)
{
    switch (dtype) {
    case DDP_BFLOAT16: ((uint16_t *)p)[i] = ddp__f32_to_bf16(v); break;
    case DDP_FLOAT16: ((uint16_t *)p)[i] = ddp__f32_to_f16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* The reduction over the ranks of rank r's input (r + idx) % 13, as exact as a double holds. */
static double reduced(int W, size_t idx)
{
    double acc = redop == DDP_MIN ? 1e30 : redop == DDP_MAX ? -1e30 : 0;
    for (int r = 0; r < W; r++) {
        double v = (double)(((size_t)r + idx) % 13);
        acc = redop == DDP_MIN   ? (v < acc ? v : acc)
              : redop == DDP_MAX ? (v > acc ? v : acc)
                                 : acc + v;
    }
    return redop == DDP_AVG ? acc / W : acc;
}

/* Whether got is a right result for want: exact in float32 for sum, min and max (small
 * integers), within the element type's rounding otherwise (a sum past bfloat16's 256, an
 * average; a backend in two levels rounds once per level: docs/group.md). */
static bool right(float got, double want)
{
    double eps = dtype == DDP_BFLOAT16 ? 0x1p-7 : dtype == DDP_FLOAT16 ? 0x1p-10 : 0x1p-22;
    if (dtype == DDP_FLOAT32 && redop != DDP_AVG)
        return (double)got == want;
    double d = (double)got - want;
    return (d < 0 ? -d : d) <= eps * (want < 0 ? -want : want);
}

/* Fills inputs, runs once, counts wrong elements. With device buffers (dsend, drecv non-NULL)
 * the inputs are copied there from send and the results back. */
static long check(ddp_group *g, kind k, void *send, void *recv, void *dsend, void *drecv,
                  size_t count)
{
    int W = ddp_group_size(g), R = ddp_group_rank(g);
    size_t es = ddp_dtype_size(dtype);
    size_t in_n = k == K_REDUCE_SCATTER ? count * (size_t)W : count;
    size_t out_n = k == K_ALLGATHER ? count * (size_t)W : count;
    for (size_t i = 0; i < in_n; i++)
        set_elem(send, i, (float)(((size_t)R + i) % 13));
    if (dsend && ddp_group_memcpy(g, dsend, send, in_n * es))
        die(g, "copy to the device");
    if (run_op(g, k, dsend ? dsend : send, drecv ? drecv : recv, count))
        die(g, kind_names[k]);
    if (dsend && (ddp_group_memcpy(g, send, dsend, in_n * es) ||
                  ddp_group_memcpy(g, recv, drecv, out_n * es)))
        die(g, "copy from the device");
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        switch (k) {
        case K_ALLREDUCE: wrong += !right(get_elem(send, i), reduced(W, i)); break;
        case K_BROADCAST: wrong += get_elem(send, i) != (float)(i % 13); break;
        case K_ALLGATHER:
            for (int r = 0; r < W; r++)
                wrong += get_elem(recv, (size_t)r * count + i) != (float)(((size_t)r + i) % 13);
            break;
        default: wrong += !right(get_elem(recv, i), reduced(W, (size_t)R * count + i)); break;
        }
    }
    long total;
    int64_t w64 = wrong, t64;
    if (allreduce_value(g, &w64, &t64, DDP_INT64, DDP_SUM))
        die(g, "allreduce");
    total = (long)t64;
    return total;
}

int main(int argc, char **argv)
{
    size_t min = 4, max = (size_t)256 << 20;
    const char *sizes = NULL, *op = "allreduce", *backend = NULL, *buffers = "arena";
    const char *device = "cpu";
    int iters_opt = 0;
    bool csv = false;
    const char *dtype_name = "float32", *reduce_name = "sum";
    static const char *const valued[] = {"--min",     "--max",    "--sizes", "--op",    "--backend",
                                         "--buffers", "--device", "--iters", "--dtype", "--reduce"};
    for (int i = 1; i < argc; i++) {
        /* '--flag value' or '--flag=value', as ddprun and ddptrain take them. */
        char name[32];
        const char *a = argv[i], *eq = strchr(a, '='), *v = NULL;
        bool inline_value = eq && !strncmp(a, "--", 2) && (size_t)(eq - a) < sizeof name;
        if (inline_value) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            a = name;
            v = eq + 1;
        }
        if (!strcmp(a, "--csv") && !inline_value) {
            csv = true;
            continue;
        }
        if (!strcmp(a, "--version")) { /* as ddprun's */
            printf("ddpbench (ddpc) %s\n", DDP_VERSION_STRING);
            return 0;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: ddprun [--nproc_per_node N] ddpbench [--op allreduce|broadcast|"
                   "allgather|reduce_scatter|all]\n       [--min BYTES] [--max BYTES] [--sizes "
                   "4K,1M,...] [--backend auto|shm|tcp|shm+tcp|mpi|shm+mpi|nccl|cuda-ipc|"
                   "cuda-staged]\n       [--buffers arena|private] [--device cpu|cuda] "
                   "[--iters N] [--csv]\n       [--dtype float32|bfloat16|float16] [--reduce "
                   "sum|avg|min|max]\n"
                   "Sizes are bytes per rank (K, M, G, T suffixes: ×1024), from --min "
                   "(default 4)\nto --max (default 256M) by factors of 4, or the --sizes list "
                   "(at most %d). A size is\nrounded down to whole elements (for allgather and "
                   "reduce_scatter, to whole elements per\nrank, as nccl-tests); the bytes "
                   "column says what was moved. --iters: timed calls per\nsize (default: about "
                   "512 MiB of traffic, 5 to 2000 calls). Defaults: --op allreduce,\n--buffers "
                   "arena, --device cpu, --backend as DDP_BACKEND (else auto), --dtype float32,\n"
                   "--reduce sum (allreduce and reduce_scatter; bfloat16 and float16 reduce in "
                   "float32 and\nround once). Flags take '--flag value' or '--flag=value'.\n",
                   MAX_SIZES);
            return 0;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++)
            known = known || !strcmp(a, valued[k]);
        if (!known) {
            fprintf(stderr, "ddpbench: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
        if (!inline_value)
            v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "ddpbench: '%s' needs a value (see --help)\n", a);
            return 2;
        }
        if (!strcmp(a, "--min")) {
            if (!parse_size(v, &min))
                return bad_size(a, v);
        } else if (!strcmp(a, "--max")) {
            if (!parse_size(v, &max))
                return bad_size(a, v);
        } else if (!strcmp(a, "--sizes"))
            sizes = v;
        else if (!strcmp(a, "--op"))
            op = v;
        else if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--buffers"))
            buffers = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--dtype"))
            dtype_name = v;
        else if (!strcmp(a, "--reduce"))
            reduce_name = v;
        else if (!strcmp(a, "--iters")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (end == v || *end || n < 1 || n > 1000000) {
                fprintf(stderr,
                        "ddpbench: --iters '%s': give a number of calls from 1 to 1000000\n", v);
                return 2;
            }
            iters_opt = (int)n;
        }
    }
    bool known_op = !strcmp(op, "all");
    for (int k = 0; k < K_COUNT; k++)
        known_op = known_op || !strcmp(op, kind_names[k]);
    if (!known_op) {
        fprintf(stderr,
                "ddpbench: --op '%s': use allreduce, broadcast, allgather, reduce_scatter or all\n",
                op);
        return 2;
    }
    if (!strcmp(dtype_name, "bfloat16"))
        dtype = DDP_BFLOAT16;
    else if (!strcmp(dtype_name, "float16"))
        dtype = DDP_FLOAT16;
    else if (strcmp(dtype_name, "float32")) {
        fprintf(stderr, "ddpbench: --dtype '%s': use float32, bfloat16 or float16\n", dtype_name);
        return 2;
    }
    static const char *const reduce_names[] = {"sum", "avg", "min", "max"};
    static const ddp_op reduce_ops[] = {DDP_SUM, DDP_AVG, DDP_MIN, DDP_MAX};
    size_t ri = 0;
    while (ri < 4 && strcmp(reduce_name, reduce_names[ri]))
        ri++;
    if (ri == 4) {
        fprintf(stderr, "ddpbench: --reduce '%s': use sum, avg, min or max\n", reduce_name);
        return 2;
    }
    redop = reduce_ops[ri];
    if (strcmp(buffers, "arena") && strcmp(buffers, "private")) {
        fprintf(stderr, "ddpbench: --buffers '%s': use arena or private\n", buffers);
        return 2;
    }
    size_t list[MAX_SIZES];
    int nsizes = 0;
    if (sizes) {
        const char *s = sizes;
        for (;;) {
            const char *comma = strchr(s, ',');
            size_t len = comma ? (size_t)(comma - s) : strlen(s);
            char one[64];
            if (len >= sizeof one || nsizes == MAX_SIZES) {
                fprintf(stderr, "ddpbench: --sizes '%s': at most %d sizes, each a size like 4K\n",
                        sizes, MAX_SIZES);
                return 2;
            }
            memcpy(one, s, len);
            one[len] = '\0';
            if (!parse_size(one, &list[nsizes]))
                return bad_size("--sizes", one);
            nsizes++;
            if (!comma)
                break;
            s = comma + 1;
        }
    } else {
        if (min > max) {
            fprintf(stderr, "ddpbench: --min %zu is above --max %zu: no size to run\n", min, max);
            return 2;
        }
        for (size_t s = min; s <= max && nsizes < MAX_SIZES; s *= 4)
            list[nsizes++] = s;
    }
    bool cuda = !strcmp(device, "cuda");
    if (!cuda && strcmp(device, "cpu")) {
        fprintf(stderr, "ddpbench: --device '%s': use cpu or cuda\n", device);
        return 2;
    }
    /* A backend for the other kind of memory: said in ddpbench's flags (the group's own message
     * speaks of "this group's" buffers, which the user chose with --device, not --backend). */
    static const char *const gpu_backends[] = {"nccl", "cuda-ipc", "cuda-staged"};
    bool gpu_backend = false;
    for (size_t k = 0; backend && k < sizeof gpu_backends / sizeof *gpu_backends; k++)
        gpu_backend = gpu_backend || !strcmp(backend, gpu_backends[k]);
    if (gpu_backend && !cuda) {
        fprintf(stderr,
                "ddpbench: --backend '%s' moves GPU buffers: add --device cuda (host buffers: "
                "--backend auto, shm, tcp, shm+tcp, mpi or shm+mpi)\n",
                backend);
        return 2;
    }
    if (cuda && backend && *backend && strcmp(backend, "auto") && !gpu_backend) {
        fprintf(stderr,
                "ddpbench: --backend '%s' moves host buffers, not --device cuda's: use --backend "
                "auto, nccl, cuda-ipc or cuda-staged, or --device cpu\n",
                backend);
        return 2;
    }
    bool arena = !strcmp(buffers, "arena") && !cuda;
    size_t maxbytes = 0;
    for (int i = 0; i < nsizes; i++)
        if (list[i] > maxbytes)
            maxbytes = list[i];

    ddp_error err = {0};
    ddp_world world; /* the environment, read once: the world and the DDP_* settings */
    if (ddp_world_from_env(&world, &err) != DDP_OK) {
        fprintf(stderr, "ddpbench: %s\n", err.msg);
        return 1;
    }
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = &world;
    o.backend = backend;
    /* DDP_TIMEOUT when set (the setting: 0), else 10 min (it was 10 min whatever DDP_TIMEOUT
     * said, until 2026-11-26) */
    o.timeout_ms = getenv("DDP_TIMEOUT") && *getenv("DDP_TIMEOUT") ? 0 : 600000;
    o.arena_bytes = arena ? 2 * maxbytes * (size_t)world.world_size + ((size_t)4 << 20) : 0;
    o.device = cuda ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    ddp_group *g;
    if (ddp_group_init(&o, &g, &err) != DDP_OK) {
        fprintf(stderr, "ddpbench: %s\n", err.msg);
        return 1;
    }
    int W = ddp_group_size(g), R = ddp_group_rank(g);
    size_t big = maxbytes * (size_t)W + 64;
    void *send = arena ? ddp_group_alloc(g, big) : NULL;
    void *recv = arena ? ddp_group_alloc(g, big) : NULL;
    if (arena && (!send || !recv)) {
        /* Either the arena is too small for these sizes, or the backend has none at all (tcp,
         * mpi): a small allocation tells which, so that the note says the right reason. */
        ddp_group_free(g, send);
        ddp_group_free(g, recv);
        void *probe = ddp_group_alloc(g, 64);
        if (probe)
            fprintf(stderr, "ddpbench: the arena could not hold %zu bytes; using private buffers\n",
                    big);
        else if (R == 0)
            fprintf(stderr,
                    "ddpbench: backend '%s' has no shared-memory arena: private buffers instead\n",
                    ddp_group_backend(g));
        ddp_group_free(g, probe);
        arena = false;
    }
    if (!arena) {
        send = aligned_alloc(64, (big + 63) / 64 * 64);
        recv = aligned_alloc(64, (big + 63) / 64 * 64);
        if (!send || !recv) {
            fprintf(stderr,
                    "ddpbench: out of memory for two buffers of %zu bytes (the largest size × %d "
                    "rank%s); lower --max or --sizes\n",
                    big, W, W == 1 ? "" : "s");
            exit(1);
        }
    }
    memset(send, 0, big);
    memset(recv, 0, big);
    void *dsend = NULL, *drecv = NULL; /* --device cuda: the buffers the collectives run on */
    if (cuda) {
        dsend = ddp_group_alloc(g, big);
        drecv = ddp_group_alloc(g, big);
        value_scratch = ddp_group_alloc(g, 8);
        if (!dsend || !drecv || !value_scratch)
            die(g, "device memory for the buffers");
    }
    double copy_bw = cuda ? measure_device_bw(g) : measure_copy_bw(g);
    if (R == 0 && cuda) {
        printf("# ddpbench: %d rank%s, backend %s (%s), GPU %d, device buffers, %s %s, in "
               "place; device copy bandwidth %.2f GB/s (one GPU)\n",
               W, W == 1 ? "" : "s", ddp_group_backend(g), ddp_group_backend_reason(g),
               ddp_group_cuda_device(g), dtype_name, reduce_name, copy_bw / 1e9);
    } else if (R == 0) {
        printf("# ddpbench: %d rank%s, backend %s, %s buffers, %s %s, in place; copy "
               "bandwidth %.2f GB/s (%s)\n",
               W, W == 1 ? "" : "s", ddp_group_backend(g), arena ? "arena (zero-copy)" : "private",
               dtype_name, reduce_name, copy_bw / 1e9,
               W == 1 ? "one rank copying" : "all ranks copying at once");
    }
    if (R == 0) {
        if (csv)
            printf("op,bytes,count,time_us,algbw_GBps,busbw_GBps,wrong,limit_us,algo\n");
        else
            printf("%-15s %12s %12s %12s %10s %10s %7s %12s %9s  %s\n", "op", "bytes", "count",
                   "time(us)", "algbw", "busbw", "#wrong", "mem-limit", "x-limit", "algo");
    }
    for (int k = 0; k < K_COUNT; k++) {
        if (strcmp(op, "all") && strcmp(op, kind_names[k]))
            continue;
        for (int si = 0; si < nsizes; si++) {
            /* Sizes are rounded down to whole elements (per rank for allgather and
             * reduce_scatter, whose bytes are the whole buffer, as nccl-tests reports); the row
             * says what was moved, and a size that holds no element is not run. */
            size_t es = ddp_dtype_size(dtype), count = list[si] / es, bytes = count * es;
            if (k == K_ALLGATHER || k == K_REDUCE_SCATTER) {
                count = count / (size_t)W;
                bytes = count * es * (size_t)W;
            }
            if (count == 0) {
                if (R == 0)
                    fprintf(stderr, "ddpbench: %s of %zu bytes skipped: less than one %s %s\n",
                            kind_names[k], list[si], dtype_name,
                            k == K_ALLREDUCE || k == K_BROADCAST ? "" : "per rank");
                continue;
            }
            long wrong = check(g, (kind)k, send, recv, dsend, drecv, count);
            void *bs = cuda ? dsend : send, *br = cuda ? drecv : recv;
            int iters = iters_opt;
            if (iters <= 0) {
                size_t auto_iters = ((size_t)512 << 20) / (bytes + 4096);
                iters = auto_iters < 5 ? 5 : auto_iters > 2000 ? 2000 : (int)auto_iters;
            }
            for (int w = 0; w < 3; w++)
                if (run_op(g, (kind)k, bs, br, count))
                    die(g, kind_names[k]);
            double *t = malloc(sizeof(double) * (size_t)iters);
            if (!t)
                die(NULL, "out of memory");
            for (int it = 0; it < iters; it++) {
                double t0 = now_s();
                if (run_op(g, (kind)k, bs, br, count))
                    die(g, kind_names[k]);
                t[it] = now_s() - t0;
            }
            qsort(t, (size_t)iters, sizeof *t, cmp_double);
            double med = t[iters / 2], worst;
            free(t);
            if (allreduce_value(g, &med, &worst, DDP_FLOAT64, DDP_MAX))
                die(g, "allreduce");
            /* Bytes that must cross memory, and the bus-bandwidth factor, per collective. */
            double S = (double)bytes, traffic, factor;
            switch (k) {
            case K_ALLREDUCE:
                traffic = 2.0 * W * S;
                factor = 2.0 * (W - 1) / W;
                break;
            case K_BROADCAST:
                traffic = S * W;
                factor = 1;
                break;
            default:
                traffic = S * (W + 1);
                factor = (double)(W - 1) / W;
                break;
            }
            double limit = traffic / copy_bw;
            double algbw = S / worst / 1e9;
            /* The allreduce variant this rank's host chose for the size (docs/group.md). */
            const char *algo = k == K_ALLREDUCE ? ddp_group_algorithm(g, bytes) : "-";
            if (R == 0) {
                if (csv)
                    printf("%s,%zu,%zu,%.2f,%.3f,%.3f,%ld,%.2f,%s\n", kind_names[k], bytes, count,
                           worst * 1e6, algbw, algbw * factor, wrong, limit * 1e6, algo);
                else
                    printf("%-15s %12zu %12zu %12.2f %10.3f %10.3f %7ld %12.2f %8.2fx  %s\n",
                           kind_names[k], bytes, count, worst * 1e6, algbw, algbw * factor, wrong,
                           limit * 1e6, worst / limit, algo);
                fflush(stdout);
            }
            if (wrong)
                die(g, "wrong results");
        }
    }
    if (cuda) {
        ddp_group_free(g, dsend);
        ddp_group_free(g, drecv);
        ddp_group_free(g, value_scratch);
    }
    if (arena) {
        ddp_group_free(g, send);
        ddp_group_free(g, recv);
    } else {
        free(send);
        free(recv);
    }
    ddp_group_destroy(g);
    return 0;
}
