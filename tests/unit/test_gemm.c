/*
 * test_gemm.c — ddp__sgemm (src/kernels/cpu/gemm.c) in both arithmetics against a naive loop in
 * double precision: float32 (OpenBLAS) against the float32 inputs, and bf16 (oneDNN,
 * src/kernels/cpu/onednn.c) against the same inputs rounded to bfloat16 (nearest even, the
 * scalar rounding of util/half.h) — every transpose, alpha and beta, leading dimensions wider
 * than the rows, sizes that are not multiples of any vector width, one-row products (float32's
 * sgemv path), a C full of NaN that beta 0 must ignore. The bf16 result must also differ from the
 * float32 one by more than float32 rounding: a silent float32 fallback would pass the first check
 * alone. Under an address-space limit that leaves OpenBLAS no room for its buffers, float32
 * products still come out right, and at once (OpenBLAS alone waited forever).
 *
 * bf16 cases are skipped where this CPU has no bf16 units or oneDNN is not installed (the check
 * says which); the refusal itself is checked in a child process with DDP_ONEDNN_LIB pointing at
 * no file.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "kernels/kernels.h"
#include "util/half.h"

static float frand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float round_bf16(float x, bool bf16)
{
    return bf16 ? ddp__bf16_to_f32(ddp__f32_to_bf16(x)) : x;
}

/* One case: C (M × N, ldc) = alpha·op(A)·op(B) + beta·C, against the naive double loop on the
 * inputs as the arithmetic sees them; returns the largest difference from the loop on the float32
 * inputs relative to Σ|a·b| (how far bf16 is from float32). */
static double check_case(bool bf16, bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                         int pad)
{
    uint32_t seed = (uint32_t)(M * 131 + N * 17 + K * 7 + ta * 3 + tb * 5 + pad);
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = malloc(sizeof(float) * (size_t)ar * lda);
    float *B = malloc(sizeof(float) * (size_t)br * ldb);
    float *C = malloc(sizeof(float) * (size_t)M * ldc);
    float *C0 = malloc(sizeof(float) * (size_t)M * ldc);
    assert_true(A && B && C && C0);
    for (size_t i = 0; i < (size_t)ar * lda; i++)
        A[i] = frand(&seed);
    for (size_t i = 0; i < (size_t)br * ldb; i++)
        B[i] = frand(&seed);
    for (size_t i = 0; i < (size_t)M * ldc; i++)
        C0[i] = C[i] = beta == 0.0f ? NAN : frand(&seed);
    ddp__gemm_kind was = ddp__gemm_set_kind(bf16 ? DDP__GEMM_BF16 : DDP__GEMM_FP32);
    ddp__sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    assert_int_equal(ddp__gemm_set_kind(was), bf16 ? DDP__GEMM_BF16 : DDP__GEMM_FP32);
    double far = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, s32 = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += (double)round_bf16(a, bf16) * round_bf16(b, bf16);
                s32 += (double)a * b;
                mag += fabs((double)a * b);
            }
            double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[(size_t)i * ldc + j];
            double want = alpha * s + c0, got = C[(size_t)i * ldc + j];
            /* float32 accumulation of K terms, and the scaling: a few ulps of Σ|a·b| per term */
            double tol = 1e-6 * (fabs(alpha) * mag + fabs(c0) + 1e-30) * (1.0 + K / 64.0);
            if (!(fabs(got - want) <= tol))
                fail_msg("%s %c%c M%d N%d K%d alpha %g beta %g pad %d: C[%d][%d] = %.9g, the loop "
                         "says %.9g (tolerance %.3g)",
                         bf16 ? "bf16" : "fp32", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K,
                         (double)alpha, (double)beta, pad, i, j, got, want, tol);
            double d = fabs(got - (alpha * s32 + c0)) / (fabs(alpha) * mag + 1e-30);
            if (d > far)
                far = d;
        }
    for (int i = 0; i < M; i++) /* the padding of C is never written, nor scaled by beta */
        for (int j = N; j < ldc; j++)
            assert_memory_equal(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float));
    free(A), free(B), free(C), free(C0);
    return far;
}

/* M 1: one row, which float32 takes through sgemv (generation's products), with A's row strided
 * (lda) when transposed, padding 0, 5 and 10 */
static const int sizes[][3] = {{1, 1, 1},     {7, 33, 45},    {64, 64, 64},
                               {31, 17, 96},  {96, 200, 130}, {256, 64, 64},
                               {1, 200, 130}, {1, 33, 45},    {1, 64, 96}};

static void run_all(bool bf16)
{
    const float alphas[] = {1.0f, 0.125f}, betas[] = {0.0f, 1.0f, 0.5f};
    double far = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int t = 0; t < 4; t++)
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++) {
                    double d = check_case(bf16, t & 1, t >> 1, sizes[s][0], sizes[s][1],
                                          sizes[s][2], alphas[a], betas[b], (int)(s % 3) * 5);
                    if (d > far)
                        far = d;
                }
    if (bf16) /* bf16 operands carry 8 bits: the results must show it */
        assert_true(far > 1e-4);
    else
        assert_true(far < 1e-5);
}

static void fp32_products(void **state)
{
    (void)state;
    assert_int_equal(ddp__gemm_get_kind(), DDP__GEMM_FP32); /* the default */
    run_all(false);
}

static void bf16_products(void **state)
{
    (void)state;
    ddp_error err = {0};
    if (ddp__gemm_bf16_check(&err) != DDP_OK) {
        print_message("skipping the bf16 products: %s\n", err.msg);
        skip();
    }
    unsigned long before = ddp__gemm_bf16_fallbacks();
    unsigned long products = ddp__gemm_bf16_products();
    run_all(true);
    run_all(true); /* again: the primitives come from the cache */
    assert_int_equal(ddp__gemm_bf16_fallbacks(), before);
    assert_true(ddp__gemm_bf16_products() > products); /* counted, none fell back */
    /* K = 0 keeps BLAS's meaning (C·beta) in bf16 too */
    float c[2] = {2.0f, 4.0f};
    ddp__gemm_set_kind(DDP__GEMM_BF16);
    ddp__sgemm(false, false, 1, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.5f, c, 2);
    ddp__gemm_set_kind(DDP__GEMM_FP32);
    assert_true(c[0] == 1.0f && c[1] == 2.0f);
}

/* How many entries of one bf16 product C (M × N, ldc N + 3, its padding included) differ from
 * the naive loop on the bf16-rounded inputs (A, B packed; beta over a C of known values).
 * No cmocka calls: threads use it too. */
static long bf16_misses(bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                        uint32_t seed)
{
    int ldc = N + 3;
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * ldc;
    float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
    float *C = malloc(sizeof(float) * nc), *C0 = malloc(sizeof(float) * nc);
    long miss = 0;
    if (!A || !B || !C || !C0) {
        miss = -1;
        goto out;
    }
    for (size_t i = 0; i < na; i++)
        A[i] = frand(&seed);
    for (size_t i = 0; i < nb; i++)
        B[i] = frand(&seed);
    for (size_t i = 0; i < nc; i++)
        C0[i] = C[i] = frand(&seed);
    ddp__gemm_kind was = ddp__gemm_set_kind(DDP__GEMM_BF16);
    ddp__sgemm(ta, tb, M, N, K, alpha, A, ta ? M : K, B, tb ? K : N, beta, C, ldc);
    ddp__gemm_set_kind(was);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++) {
            double want = (double)beta * C0[(size_t)i * ldc + j], mag = fabs(want);
            if (j < N) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    float a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                    float b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                    s += (double)round_bf16(a, true) * round_bf16(b, true);
                    mag += fabs((double)alpha * a * b);
                }
                want += alpha * s;
            } else {
                want = C0[(size_t)i * ldc + j]; /* padding: untouched */
            }
            double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= 1e-6 * (mag + 1e-30) * (1.0 + K / 64.0)))
                miss++;
        }
out:
    free(A), free(B), free(C), free(C0);
    return miss;
}

/* Many shapes (every size is given at run time), and more (transposed A, beta) pairs than a
 * thread keeps primitives for (8: the others replaced in turn), interleaved so that a pair comes
 * back after being replaced: every product right, none computed in float32. */
static void bf16_many_shapes(void **state)
{
    (void)state;
    if (ddp__gemm_bf16_check(NULL) != DDP_OK)
        skip();
    const float betas[] = {0.0f, 1.0f, 0.5f, -0.25f, 2.0f, 0.125f, -1.0f, 3.0f};
    unsigned long before = ddp__gemm_bf16_fallbacks();
    for (int round = 0; round < 2; round++)
        for (int m = 1; m <= 150; m++) {
            float beta = betas[(m * 5 + round) % 8];
            long miss = bf16_misses(m & 1, m & 2, m, 5 + m % 7, 3 + m % 11, 1.0f + (float)(m % 3),
                                    beta, (uint32_t)m);
            if (miss != 0)
                fail_msg("round %d, shape %d, beta %g: %ld entries wrong", round, m, (double)beta,
                         miss);
        }
    assert_int_equal(ddp__gemm_bf16_fallbacks(), before);
}

/* Products on the grid of 16 up to 512 (the attention's blocks) run in primitives made for their
 * shape (kernels/cpu/onednn.c): more such shapes than a thread keeps (64), each computed twice,
 * the second time after it was replaced — right both times, and the same bits: which kernel runs
 * depends on the shape alone. */
static void bf16_fixed_shapes(void **state)
{
    (void)state;
    if (ddp__gemm_bf16_check(NULL) != DDP_OK)
        skip();
    enum { NS = 80, MAXD = 512 };
    float *A = malloc(sizeof(float) * MAXD * MAXD), *B = malloc(sizeof(float) * MAXD * MAXD);
    float *C[NS];
    assert_true(A && B);
    uint32_t seed = 99;
    for (int i = 0; i < MAXD * MAXD; i++)
        A[i] = frand(&seed), B[i] = frand(&seed);
    unsigned long before = ddp__gemm_bf16_fallbacks();
    ddp__gemm_kind was = ddp__gemm_set_kind(DDP__GEMM_BF16);
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < NS; k++) {
            int M = 16 * (1 + k % 8), N = 16 * (1 + (k / 8) % 10), K = 64 + 16 * (k % 3);
            bool ta = k & 1, tb = k & 2;
            float *c = malloc(sizeof(float) * (size_t)M * N);
            assert_non_null(c);
            ddp__sgemm(ta, tb, M, N, K, 0.5f, A, ta ? M : K, B, tb ? K : N, 0.0f, c, N);
            if (round == 0) {
                C[k] = c;
                continue;
            }
            if (memcmp(c, C[k], sizeof(float) * (size_t)M * N) != 0)
                fail_msg("shape %d (M%d N%d K%d): not the same bits the second time", k, M, N, K);
            free(c);
            free(C[k]);
            long miss = bf16_misses(ta, tb, M, N, K, 0.5f, 1.0f, (uint32_t)k);
            if (miss != 0)
                fail_msg("shape %d (M%d N%d K%d): %ld entries wrong", k, M, N, K, miss);
        }
    ddp__gemm_set_kind(was);
    assert_int_equal(ddp__gemm_bf16_fallbacks(), before);
    free(A), free(B);
}

/* Several threads at once, each with its own stream and cache, on shapes of their own and on
 * shapes they share; the threads exit (their state freed by the key's destructor) and new ones
 * start, twice. Under the sanitizers this is the check of the state list and the destructor. */
enum { NTHREADS = 3 };

static void *products_thread(void *arg)
{
    int id = (int)(intptr_t)arg;
    long miss = 0;
    for (int r = 0; r < 4 && miss == 0; r++) {
        miss = bf16_misses(r & 1, id & 1, 40 + id, 33, 70, 0.25f, 0.5f, (uint32_t)(id * 100 + r));
        if (miss == 0)
            miss = bf16_misses(false, true, 64, 48, 96, 1.0f, 0.0f, (uint32_t)(id + 7 * r));
    }
    return (void *)(intptr_t)miss;
}

static void bf16_threads(void **state)
{
    (void)state;
    if (ddp__gemm_bf16_check(NULL) != DDP_OK)
        skip();
    unsigned long before = ddp__gemm_bf16_fallbacks();
    for (int wave = 0; wave < 2; wave++) {
        pthread_t th[NTHREADS];
        for (int i = 0; i < NTHREADS; i++)
            assert_int_equal(pthread_create(&th[i], NULL, products_thread, (void *)(intptr_t)i), 0);
        for (int i = 0; i < NTHREADS; i++) {
            void *ret = NULL;
            assert_int_equal(pthread_join(th[i], &ret), 0);
            if ((intptr_t)ret != 0)
                fail_msg("wave %d, thread %d: %ld entries wrong", wave, i, (long)(intptr_t)ret);
        }
    }
    assert_int_equal(ddp__gemm_bf16_fallbacks(), before);
    assert_int_equal(ddp__gemm_get_kind(), DDP__GEMM_FP32); /* other threads' kinds stay theirs */
}

/* In a child whose bf16 products cannot run: a bf16 product still comes out right (3 · 5), and
 * it is the process's first bf16 product and first fallback to float32, in the public counts
 * too (ddptrain reports them). */
static bool product_fell_back(void)
{
    float a = 3.0f, b = 5.0f, c = 0.0f;
    ddp__gemm_set_kind(DDP__GEMM_BF16);
    ddp__sgemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    uint64_t products = 0, fallbacks = 0;
    ddp_bf16_cpu_counts(&products, &fallbacks);
    return c == 15.0f && ddp__gemm_bf16_fallbacks() == 1 && ddp__gemm_bf16_products() == 1 &&
           products == 1 && fallbacks == 1;
}

/* The parent's half of a test run in a forked child: waits for it, and fails when it died of a
 * signal (SIGALRM: its products hung) or exited non-zero; 77 from the child skips the test. */
static void expect_child(pid_t pid)
{
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    if (WIFSIGNALED(ws))
        fail_msg("the child died of signal %d (%s)", WTERMSIG(ws),
                 WTERMSIG(ws) == SIGALRM ? "its products hung" : "a crash");
    assert_true(WIFEXITED(ws));
    if (WEXITSTATUS(ws) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(ws), 0);
}

/* This process's mapped address space (VmSize), in bytes; 0 if unknown. */
static size_t vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib << 10;
}

/* In a child: products of every transpose, M rows, against the double loop, once the
 * address-space limit leaves 64 MiB free (the matrices fit, OpenBLAS's 128 MiB buffer does not).
 * Exit 0 when all are right, 1 when one is wrong, 77 when the limit cannot be set. */
static void products_under_a_limit(int M)
{
    alarm(60);
    ddp__blas_set_threads(1);
    size_t vm = vm_size();
    struct rlimit r = {vm + ((size_t)64 << 20), vm + ((size_t)64 << 20)};
    if (!vm || setrlimit(RLIMIT_AS, &r) != 0)
        _exit(77);
    const int N = 300, K = 200, ld = 300; /* ld: every operand fits in ld × ld */
    float *A = malloc(sizeof(float) * ld * ld), *B = malloc(sizeof(float) * ld * ld);
    float *C = malloc(sizeof(float) * ld * ld);
    if (!A || !B || !C)
        _exit(1);
    uint32_t seed = 7;
    for (int i = 0; i < ld * ld; i++)
        A[i] = frand(&seed), B[i] = frand(&seed);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        for (int i = 0; i < ld * ld; i++)
            C[i] = 1.0f;
        ddp__sgemm(ta, tb, M, N, K, 0.5f, A, ld, B, ld, 0.25f, C, ld);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double s = 0, mag = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)(ta ? A[k * ld + i] : A[i * ld + k]) *
                               (tb ? B[j * ld + k] : B[k * ld + j]);
                    s += p, mag += fabs(p);
                }
                double want = 0.5 * s + 0.25, got = C[i * ld + j];
                if (!(fabs(got - want) <= 1e-5 * (mag + 1))) {
                    fprintf(stderr, "child: %c%c M%d: C[%d][%d] = %.9g, the loop says %.9g\n",
                            ta ? 'T' : 'N', tb ? 'T' : 'N', M, i, j, got, want);
                    _exit(1);
                }
            }
    }
    _exit(0);
}

/* Under an address-space limit (ulimit -v) that leaves no room for OpenBLAS's 128 MiB buffer, a
 * product comes out right instead of waiting forever: OpenBLAS 0.3.21 retries a buffer it cannot
 * map without end (ddptrain hung in its first product under ulimit -v 340000 with the shm
 * backend: the data and the segment had taken the room its start-up check saw, 2026-11-26).
 * In children forked before any product of this process (OpenBLAS fills its pool of buffers
 * once): a product through sgemm, and a one-row one through sgemv, whose buffer comes from the
 * same pool. Each child has 60 s (SIGALRM). Not under the sanitizers, whose shadow memory needs
 * terabytes of address space. */
static void fp32_without_room_for_the_blas(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip();
#endif
    for (int M = 1; M <= 40; M += 39) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            products_under_a_limit(M);
        expect_child(pid);
    }
}

/* A child forked after this process's products ran on OpenMP's threads (the test runs with
 * OMP_NUM_THREADS=2): its own bf16 products come out right, in bf16, instead of waiting forever
 * for a thread pool fork did not copy. The child has 60 s (SIGALRM) to finish. */
static void bf16_in_a_forked_child(void **state)
{
    (void)state;
    if (ddp__gemm_bf16_check(NULL) != DDP_OK)
        skip();
    assert_int_equal(bf16_misses(false, true, 256, 200, 130, 1.0f, 0.5f, 1), 0); /* the parent's */
    unsigned long before = ddp__gemm_bf16_fallbacks();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60);
        long a =
            bf16_misses(false, true, 256, 200, 130, 1.0f, 0.5f, 2);   /* a primitive made before */
        long b = bf16_misses(true, false, 99, 77, 55, 0.5f, 1.0f, 3); /* a new one */
        if (a || b || ddp__gemm_bf16_fallbacks() != before) {
            fprintf(stderr, "child: %ld and %ld entries wrong, %lu fallbacks\n", a, b,
                    ddp__gemm_bf16_fallbacks() - before);
            _exit(1);
        }
        _exit(0);
    }
    expect_child(pid);
}

/* Without the library: a one-line error naming it and what to do, and products that still come
 * out right (in float32) should a caller go on. In a child: the library loads once a process. */
static void bf16_without_onednn(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("DDP_ONEDNN_LIB", "/nonexistent/libdnnl.so.2", 1);
        ddp_error err = {0};
        int bad = 0;
        /* The CPU is asked first: one without bf16 units is told so, oneDNN or not. */
        if (ddp__gemm_bf16_check(&err) != DDP_ERR_NOT_FOUND ||
            (!strstr(err.msg, "precision bf16 on the CPU needs oneDNN") &&
             !strstr(err.msg, "precision bf16 on the CPU needs bf16 matrix instructions")) ||
            !strstr(err.msg, "HINT"))
            bad = 1;
        if (ddp_precision_check(DDP_DEVICE_CPU, DDP_PRECISION_BF16, &err) == DDP_OK)
            bad = 1;
        if (!product_fell_back())
            bad = 1;
        if (bad)
            fprintf(stderr, "child: %s\n", err.msg);
        _exit(bad);
    }
    expect_child(pid);
}

/* A CPU with bf16 units where oneDNN is told not to use them (ONEDNN_MAX_CPU_ISA): oneDNN would
 * widen bf16 in software, slower than float32, so the probe refuses it — with a message that
 * names the variable rather than blaming the CPU — and products fall back to float32. In a child,
 * before any load; skipped (77) where the CPU has no bf16 units or oneDNN is missing. */
static void bf16_refused_when_onednn_is_limited(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
        ddp_error err = {0};
        if (ddp__gemm_bf16_check(&err) == DDP_OK) {
            fprintf(stderr, "child: bf16 accepted under ONEDNN_MAX_CPU_ISA=AVX2\n");
            _exit(1);
        }
        __builtin_cpu_init();
        if (!__builtin_cpu_supports("avx512bf16") || strstr(err.msg, "needs oneDNN, "))
            _exit(77); /* no bf16 units, or no oneDNN: nothing to limit */
        int bad = !strstr(err.msg, "precision bf16 on the CPU needs oneDNN's bf16-unit kernels") ||
                  !strstr(err.msg, "ONEDNN_MAX_CPU_ISA") || !strstr(err.msg, "HINT") ||
                  strchr(err.msg, '\n') != NULL;
        if (!product_fell_back())
            bad = 1;
        if (bad)
            fprintf(stderr, "child: %s\n", err.msg);
        _exit(bad);
    }
    expect_child(pid);
}

/* A process that has used up its pthread keys before its first bf16 product: no per-thread
 * state, so the product falls back to float32 (counted) — not to key 0, someone else's. In a
 * child; oneDNN is loaded first (its libgomp needs a key of its own to start). */
static void bf16_without_a_thread_key(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (ddp__gemm_bf16_check(NULL) != DDP_OK)
            _exit(77);
        pthread_key_t k;
        int n = 0;
        while (n < 100000 && pthread_key_create(&k, NULL) == 0)
            n++;
        if (!product_fell_back()) {
            fprintf(stderr, "child: no float32 fallback after %d keys\n", n);
            _exit(1);
        }
        _exit(0);
    }
    expect_child(pid);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp32_without_room_for_the_blas), /* first: no product has run yet */
        cmocka_unit_test(fp32_products),
        cmocka_unit_test(bf16_without_onednn), /* first: a fork after the load would inherit it */
        cmocka_unit_test(bf16_refused_when_onednn_is_limited), /* likewise */
        cmocka_unit_test(bf16_without_a_thread_key),           /* likewise */
        cmocka_unit_test(bf16_products),
        cmocka_unit_test(bf16_many_shapes),
        cmocka_unit_test(bf16_fixed_shapes),
        cmocka_unit_test(bf16_threads),
        cmocka_unit_test(bf16_in_a_forked_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
