/*
 * gpucheck — the GPU backends end to end, on a machine with a GPU; run alone (world 1) or under
 * ddprun:
 *
 *   gpucheck --probe                      exit 0 if a GPU is usable, else 77 (skip)
 *   ddprun --nproc_per_node=W gpucheck [--backend NAME] [--expect NAME] [--kill RANK]
 *                                      [--abort RANK] [--arena BYTES] [--fail-within SECONDS]
 *                                      [--quick]
 *
 * Without a GPU it exits 77 (CTest: skipped), or 1 when DDP_REQUIRE_GPU=1 (a GPU machine's check
 * script sets it, so a broken driver cannot pass as a skip). With DDP_TEST_FAKE_GPUS=N it runs
 * on the library's test-only fake GPUs (host memory; cuda-ipc or cuda-staged), which CI does.
 *
 * On GPU buffers (ddp_group_alloc, filled with ddp_group_memcpy): allreduce (sum, avg, max),
 * broadcast, allgather, reduce_scatter and barrier, float32 and bfloat16, counts across the
 * staging chunk, compared with the exact result (inputs are small integers, sums exact in both).
 * Then data parallelism's identity: W ranks × B samples give the same mean gradient as 1 rank ×
 * W·B (a linear model, squared loss; per-rank gradients on the host, averaged on the GPU through
 * the backend), within 1e-5 relative in float32 and 1e-2 in bfloat16. --kill R: after one round
 * of collectives rank R kills itself (SIGKILL) and the others' next allreduce must fail with a
 * message, not hang (the script checks ddprun's summary and the time). --abort R: the same, but
 * rank R calls ddp_group_abort and destroys its group at once (exit 4): the others' allreduce
 * must fail as the peer's fault, naming "rank R aborted the group". --arena: the group's
 * arena_bytes (cuda-staged's and cuda-ipc's staging is half of it: small values make every
 * collective run in many chunks). --fail-within S: rank 1 dies inside a collective (the fake GPU
 * kills it in cuda-ipc's reduction or cuda-staged's copy into host memory:
 * DDP_TEST_FAKE_KILL_IN_REDUCE / _IN_COPY), or that call fails there (GPUCHECK_FAULT=fail:
 * DDP_TEST_FAKE_FAIL_IN_REDUCE / _IN_COPY), and every live rank's collective must fail within S
 * seconds (the group's timeout is 60 s) with a one-line message (exit 3), never succeed.
 * --quick: the largest count 1 Mi + 3 instead of 8 Mi + 3 (sanitizer builds: test_gpu.sh).
 * The group's timeout is 60 s, or DDP_TIMEOUT's when that is set (a stuck collective's test).
 */
#define _GNU_SOURCE
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"
#include "kernels/kernels.h" /* ddp__cuda_device_count: whether to skip */
#include "util/half.h"

static int W, R;
static long checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: FAILED: ", R);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int skip_or_fail(const char *why)
{
    const char *req = getenv("DDP_REQUIRE_GPU");
    if (req && !strcmp(req, "1")) {
        fprintf(stderr, "gpucheck: DDP_REQUIRE_GPU=1 but %s\n", why);
        return 1;
    }
    printf("gpucheck: skipped: %s\n", why);
    return 77;
}

static float input(int r, size_t i)
{
    return (float)((r * 3 + i * 7) % 11 + 1);
}

static void put(void *h, size_t i, ddp_dtype t, float v)
{
    if (t == DDP_BFLOAT16)
        ((uint16_t *)h)[i] = ddp__f32_to_bf16(v);
    else
        ((float *)h)[i] = v;
}

static float get(const void *h, size_t i, ddp_dtype t)
{
    return t == DDP_BFLOAT16 ? ddp__bf16_to_f32(((const uint16_t *)h)[i]) : ((const float *)h)[i];
}

/* Device buffer of n elements of t, filled from host h (when given). */
static void *dev_from(ddp_group *g, const void *h, size_t bytes)
{
    void *d = ddp_group_alloc(g, bytes ? bytes : 1);
    CHECK(d, "ddp_group_alloc(%zu) returned NULL", bytes);
    if (h)
        CHECK(ddp_group_memcpy(g, d, h, bytes) == DDP_OK, "memcpy to device: %s",
              ddp_group_last_error(g));
    return d;
}

static void collectives(ddp_group *g, ddp_dtype t, size_t n)
{
    size_t e = ddp_dtype_size(t), total = n * (size_t)W;
    char *h = malloc(total * e + 1), *o = malloc(total * e + 1);
    /* allreduce sum / avg / max */
    const ddp_op ops[] = {DDP_SUM, DDP_AVG, DDP_MAX};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++)
            put(h, i, t, input(R, i));
        void *d = dev_from(g, h, n * e);
        CHECK(ddp_allreduce(g, d, d, n, t, ops[k]) == DDP_OK, "allreduce: %s",
              ddp_group_last_error(g));
        CHECK(ddp_group_memcpy(g, o, d, n * e) == DDP_OK, "memcpy back");
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < W; r++)
                want = ops[k] == DDP_MAX ? fmaxf(want, input(r, i)) : want + input(r, i);
            if (ops[k] == DDP_AVG)
                want /= (float)W;
            float tol = t == DDP_BFLOAT16 ? fabsf(want) / 128 : 0;
            /* AVG over NCCL (ncclAvg) multiplies each input by fl(1/W), then sums: exact when W
             * is a power of two, else within W rounding errors of the sum / W */
            if (ops[k] == DDP_AVG && t != DDP_BFLOAT16 && (W & (W - 1)))
                tol = fabsf(want) * (float)W * FLT_EPSILON;
            CHECK(fabsf(get(o, i, t) - want) <= tol, "allreduce %s %s × %zu [%zu]: %.9g, want %.9g",
                  ddp_op_name(ops[k]), ddp_dtype_name(t), n, i, get(o, i, t), want);
        }
        ddp_group_free(g, d);
    }
    /* broadcast from the last rank */
    for (size_t i = 0; i < n; i++)
        put(h, i, t, input(R, i));
    void *d = dev_from(g, h, n * e);
    CHECK(ddp_broadcast(g, d, n, t, W - 1) == DDP_OK, "broadcast: %s", ddp_group_last_error(g));
    CHECK(ddp_group_memcpy(g, o, d, n * e) == DDP_OK, "memcpy back");
    for (size_t i = 0; i < n; i++)
        CHECK(get(o, i, t) == input(W - 1, i), "broadcast [%zu]", i);
    ddp_group_free(g, d);
    /* allgather */
    void *s = dev_from(g, h, n * e), *a = dev_from(g, NULL, total * e);
    CHECK(ddp_allgather(g, s, a, n, t) == DDP_OK, "allgather: %s", ddp_group_last_error(g));
    CHECK(ddp_group_memcpy(g, o, a, total * e) == DDP_OK, "memcpy back");
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < n; i++)
            CHECK(get(o, (size_t)r * n + i, t) == input(r, i), "allgather [%d][%zu]", r, i);
    ddp_group_free(g, s);
    ddp_group_free(g, a);
    /* reduce_scatter: block r of rank q's input is input(q, r·n + i) */
    for (size_t i = 0; i < total; i++)
        put(h, i, t, input(R, i));
    a = dev_from(g, h, total * e);
    s = dev_from(g, NULL, n * e);
    CHECK(ddp_reduce_scatter(g, a, s, n, t, DDP_SUM) == DDP_OK, "reduce_scatter: %s",
          ddp_group_last_error(g));
    CHECK(ddp_group_memcpy(g, o, s, n * e) == DDP_OK, "memcpy back");
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < W; r++)
            want += input(r, (size_t)R * n + i);
        float tol = t == DDP_BFLOAT16 ? fabsf(want) / 128 : 0;
        CHECK(fabsf(get(o, i, t) - want) <= tol, "reduce_scatter [%zu]: %g, want %g", i,
              get(o, i, t), want);
    }
    ddp_group_free(g, s);
    ddp_group_free(g, a);
    CHECK(ddp_barrier(g) == DDP_OK, "barrier: %s", ddp_group_last_error(g));
    free(h);
    free(o);
}

/* The mean gradient of 0.5·(w·x_s − y_s)² over samples s in [s0, s0+m), into grad (P,). */
static void gradient(const float *w, int P, long s0, long m, double *grad)
{
    for (int p = 0; p < P; p++)
        grad[p] = 0;
    for (long s = s0; s < s0 + m; s++) {
        double pred = 0, y = (double)(s % 5) - 2.0;
        for (int p = 0; p < P; p++)
            pred += w[p] * (double)(((s * 31 + p * 17) % 13) - 6) / 6.0;
        for (int p = 0; p < P; p++)
            grad[p] += (pred - y) * (double)(((s * 31 + p * 17) % 13) - 6) / 6.0 / (double)m;
    }
}

static void n_by_b(ddp_group *g, ddp_dtype t)
{
    const int P = 4099, B = 8;
    float *w = malloc(sizeof(float) * P);
    double *mine = malloc(sizeof(double) * P), *full = malloc(sizeof(double) * P);
    char *h = malloc((size_t)P * 4);
    for (int p = 0; p < P; p++)
        w[p] = (float)((p % 7) - 3) / 10.0f;
    gradient(w, P, (long)R * B, B, mine); /* this rank's B samples */
    gradient(w, P, 0, (long)W * B, full); /* 1 rank × W·B */
    for (int p = 0; p < P; p++)
        put(h, (size_t)p, t, (float)mine[p]);
    size_t bytes = (size_t)P * ddp_dtype_size(t);
    void *d = dev_from(g, h, bytes);
    CHECK(ddp_allreduce(g, d, d, (size_t)P, t, DDP_AVG) == DDP_OK, "gradient allreduce: %s",
          ddp_group_last_error(g));
    CHECK(ddp_group_memcpy(g, h, d, bytes) == DDP_OK, "memcpy back");
    double worst = 0, scale = 0;
    for (int p = 0; p < P; p++) {
        worst = fmax(worst, fabs(get(h, (size_t)p, t) - full[p]));
        scale = fmax(scale, fabs(full[p]));
    }
    double tol = t == DDP_BFLOAT16 ? 1e-2 : 1e-5;
    CHECK(worst <= tol * scale, "%d ranks × %d samples vs 1 × %d (%s): max error %g of %g", W, B,
          W * B, ddp_dtype_name(t), worst, scale);
    if (R == 0)
        printf("gpucheck: %d ranks × %d ≡ 1 × %d in %s: max error %.3g (of %.3g)\n", W, B, W * B,
               ddp_dtype_name(t), worst, scale);
    ddp_group_free(g, d);
    free(w);
    free(mine);
    free(full);
    free(h);
}

int main(int argc, char **argv)
{
    const char *backend = NULL, *expect = NULL;
    int kill_rank = -1, fail_within = -1;
    bool abort_it = false;
    size_t arena = 0;
    bool probe = false, quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--probe"))
            probe = true;
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend = argv[++i];
        else if (!strcmp(argv[i], "--expect") && i + 1 < argc)
            expect = argv[++i];
        else if (!strcmp(argv[i], "--kill") && i + 1 < argc)
            kill_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--abort") && i + 1 < argc)
            kill_rank = atoi(argv[++i]), abort_it = true;
        else if (!strcmp(argv[i], "--arena") && i + 1 < argc)
            arena = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--fail-within") && i + 1 < argc)
            fail_within = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            quick = true;
        else {
            fprintf(stderr, "usage: gpucheck [--probe] [--backend NAME] [--expect NAME] "
                            "[--kill RANK] [--abort RANK] [--arena BYTES] [--fail-within SECONDS] "
                            "[--quick]\n");
            return 2;
        }
    }
    int ngpu = 0;
    ddp_error err = {0};
    const char *fake = getenv("DDP_TEST_FAKE_GPUS"); /* host memory plays the GPU (ddp_settings) */
    if (fake && atoi(fake) > 0)
        ngpu = atoi(fake);
    else if (ddp__cuda_device_count(&ngpu, &err) != DDP_OK)
        return skip_or_fail(err.msg);
    if (probe)
        return 0;
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.device = DDP_DEVICE_CUDA;
    o.backend = backend;
    o.timeout_ms = getenv("DDP_TIMEOUT") ? 0 : 60000; /* 0: DDP_TIMEOUT's */
    o.arena_bytes = arena;
    ddp_group *g;
    if (ddp_group_init(&o, &g, &err) != DDP_OK) {
        fprintf(stderr, "gpucheck: %s\n", err.msg);
        return 1;
    }
    W = ddp_group_size(g);
    R = ddp_group_rank(g);
    if (R == 0)
        printf("gpucheck: %d rank%s, backend %s (%s), GPU %d of %d\n", W, W == 1 ? "" : "s",
               ddp_group_backend(g), ddp_group_backend_reason(g), ddp_group_cuda_device(g), ngpu);
    if (expect)
        CHECK(!strcmp(ddp_group_backend(g), expect), "backend %s, expected %s",
              ddp_group_backend(g), expect);
    if (fail_within > 0) { /* a rank dies inside this allreduce (the fake GPU's reduce) */
        collectives(g, DDP_FLOAT32, 1000); /* after a working round: the hook is armed below */
        /* "fail": rank 1's reduction (cuda-ipc) or its copy into the staging buffer
         * (cuda-staged) fails; else rank 1 dies there. Global rank 1. */
        const char *how = getenv("GPUCHECK_FAULT");
        const bool fail = how && !strcmp(how, "fail");
        setenv(fail ? "DDP_TEST_FAKE_FAIL_IN_REDUCE" : "DDP_TEST_FAKE_KILL_IN_REDUCE", "1", 1);
        setenv(fail ? "DDP_TEST_FAKE_FAIL_IN_COPY" : "DDP_TEST_FAKE_KILL_IN_COPY", "1", 1);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        size_t n = 4096;
        void *d = dev_from(g, NULL, n * 4);
        ddp_status st = ddp_allreduce(g, d, d, n, DDP_FLOAT32, DDP_SUM);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK(st != DDP_OK, "an allreduce with a rank dead inside it succeeded");
        CHECK(took <= fail_within, "the allreduce failed after %.1f s (limit %d s)", took,
              fail_within);
        CHECK(strlen(ddp_group_last_error(g)) > 0 && !strchr(ddp_group_last_error(g), '\n'),
              "no one-line message");
        fprintf(stderr, "rank %d: as expected, after %.1f s: %s\n", R, took,
                ddp_group_last_error(g));
        ddp_group_free(g, d);
        ddp_group_destroy(g);
        return 3;
    }
    if (kill_rank < 0) {
        /* the last spans the default staging chunks; --quick's only a small --arena's */
        const size_t counts[] = {1, 1000, ((size_t)(quick ? 1 : 8) << 20) + 3};
        for (int ti = 0; ti < 2; ti++)
            for (size_t ci = 0; ci < 3; ci++)
                collectives(g, ti ? DDP_BFLOAT16 : DDP_FLOAT32, counts[ci]);
        n_by_b(g, DDP_FLOAT32);
        n_by_b(g, DDP_BFLOAT16);
    } else {
        collectives(g, DDP_FLOAT32, 1000); /* a working group first, then the death */
        /* (the wall clock of the death and of the others' failure, for
         * bench/notice_latency.sh: one host, one clock) */
        struct timespec tw;
        if (R == kill_rank) {
            clock_gettime(CLOCK_REALTIME, &tw);
            fprintf(stderr, "rank %d: %s at %.6f\n", R, abort_it ? "aborting" : "dying",
                    (double)tw.tv_sec + 1e-9 * (double)tw.tv_nsec);
        }
        if (R == kill_rank && abort_it) {
            ddp_group_abort(g);
            ddp_group_destroy(g);
            return 4;
        }
        if (R == kill_rank)
            raise(SIGKILL);
        float one = 1;
        void *d = dev_from(g, &one, sizeof one);
        ddp_status st = ddp_allreduce(g, d, d, 1, DDP_FLOAT32, DDP_SUM);
        clock_gettime(CLOCK_REALTIME, &tw);
        fprintf(stderr, "rank %d: failed at %.6f\n", R,
                (double)tw.tv_sec + 1e-9 * (double)tw.tv_nsec);
        CHECK(st != DDP_OK, "allreduce with rank %d dead succeeded", kill_rank);
        CHECK(ddp_group_peer_failed(g), "ddp_group_peer_failed is false after rank %d %s: %s",
              kill_rank, abort_it ? "aborted" : "died", ddp_group_last_error(g));
        fprintf(stderr, "rank %d: as expected: %s\n", R, ddp_group_last_error(g));
        ddp_group_free(g, d);
        ddp_group_destroy(g);
        return 3;
    }
    if (R == 0)
        printf("gpucheck: ok, %ld checks\n", checks);
    ddp_group_destroy(g);
    return 0;
}
