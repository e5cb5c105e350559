/*
 * gpu_emu.nccl_emu — the emulated NCCL itself (nccl_emu.cpp), ranks as forked processes, with the
 * build's sanitizer (the ASan build runs it; nccl.c's own tests, gpu_emu.nccl_*, need a libddp
 * with CUDA): non-blocking init; every reduction on every type nccl.c maps, against the exact
 * result, bit-identical on every rank; broadcast, allgather, reduce-scatter across the 1 MiB
 * chunks; a collective missing a peer is not ready until ncclCommAbort from another thread
 * ends it; a dead peer is ncclRemoteError; two ranks on one device are refused; arguments NCCL
 * refuses; no /dev/shm segment left.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int R = -1;
#define CHECK(c, ...)                                                                              \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "rank %d: FAILED (line %d): ", R, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static ncclComm_t init(ncclUniqueId id, int n, int dev, ncclResult_t want = ncclSuccess)
{
    CHECK(cudaSetDevice(dev) == cudaSuccess, "cudaSetDevice(%d)", dev);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, n, id, R, &cfg);
    CHECK(r == ncclInProgress && c, "non-blocking init returned %d", (int)r);
    double end = now_s() + 10;
    while (ncclCommGetAsyncError(c, &r) == ncclSuccess && r == ncclInProgress && now_s() < end)
        usleep(200);
    CHECK(r == want, "init: %s (%s), want %d", ncclGetErrorString(r), ncclGetLastError(c),
          (int)want);
    return c;
}

/* Polls e until it completes or `secs` pass: whether it completed. */
static bool done_within(cudaEvent_t e, double secs)
{
    double end = now_s() + secs;
    for (;;) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess)
            return true;
        CHECK(q == cudaErrorNotReady, "cudaEventQuery: %d", (int)q);
        if (now_s() > end)
            return false;
        usleep(500);
    }
}

/* Runs body(rank) in n forked processes: whether every one exited 0 within 60 s. */
template <typename F> static bool ranks(int n, F body)
{
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            R = r;
            alarm(60); /* nothing may hang the test */
            body(r);
            _exit(0);
        }
    }
    bool ok = true;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    return ok;
}

static float val(int r, size_t i)
{
    return (float)((r + i) % 3 + 1); /* 1..3: products of 3 ranks exact in every type */
}

static void put(void *h, ncclDataType_t t, size_t i, double v)
{
    switch (t) {
    case ncclFloat32: ((float *)h)[i] = (float)v; break;
    case ncclFloat64: ((double *)h)[i] = v; break;
    case ncclFloat16: ((_Float16 *)h)[i] = (_Float16)v; break;
    case ncclBfloat16: { /* small integers: exact in bf16, truncation is exact */
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)h)[i] = (uint16_t)(u >> 16);
        break;
    }
    case ncclInt32: ((int32_t *)h)[i] = (int32_t)v; break;
    case ncclInt64: ((int64_t *)h)[i] = (int64_t)v; break;
    case ncclUint8: ((uint8_t *)h)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(const void *h, ncclDataType_t t, size_t i)
{
    switch (t) {
    case ncclFloat32: return ((const float *)h)[i];
    case ncclFloat64: return ((const double *)h)[i];
    case ncclFloat16: return (double)((const _Float16 *)h)[i];
    case ncclBfloat16: {
        uint32_t u = (uint32_t)((const uint16_t *)h)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case ncclInt32: return ((const int32_t *)h)[i];
    case ncclInt64: return (double)((const int64_t *)h)[i];
    case ncclUint8: return ((const uint8_t *)h)[i];
    default: return NAN;
    }
}

static size_t tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclFloat64:
    case ncclInt64: return 8;
    default: return 4;
    }
}

/* A device buffer of `bytes`, filled from h (when given). */
static void *dev(const void *h, size_t bytes)
{
    void *d = nullptr;
    CHECK(cudaMalloc(&d, bytes) == cudaSuccess, "cudaMalloc");
    if (h)
        CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "copy in");
    return d;
}

static void back(void *h, const void *d, cudaStream_t s, size_t bytes)
{
    cudaEvent_t e;
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    cudaEventRecord(e, s);
    CHECK(done_within(e, 20), "a collective did not finish");
    cudaEventDestroy(e);
    CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "copy out");
}

/* An allreduce of 1024 floats issued on a stream of its own, and an event recorded after it. */
struct Issued {
    cudaStream_t s;
    void *d;
    cudaEvent_t e;
};
static Issued issue_allreduce(ncclComm_t c)
{
    Issued x;
    cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking);
    x.d = dev(nullptr, 4096);
    CHECK(ncclAllReduce(x.d, x.d, 1024, ncclFloat32, ncclSum, c, x.s) == ncclSuccess, "issue");
    cudaEventCreateWithFlags(&x.e, cudaEventDisableTiming);
    cudaEventRecord(x.e, x.s);
    return x;
}
static void release(Issued &x)
{
    cudaEventDestroy(x.e);
    cudaStreamDestroy(x.s);
    cudaFree(x.d);
}

static uint64_t hash(const void *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

int main()
{
    setenv("DDP_EMU_GPUS", "3", 1);
    char tag[32];
    snprintf(tag, sizeof tag, "st%d", (int)getpid());
    setenv("DDP_EMU_NCCL_TAG", tag, 1);
    uint64_t *sums =
        (uint64_t *)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int v = 0;
    CHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE, "version %d", v);

    /* 1. every reduction on every type, 3 ranks, exact; the large ones across chunks */
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    const int W = 3;
    bool ok = ranks(W, [&](int r) {
        ncclComm_t c = init(id, W, r);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                        ncclInt32,   ncclInt64,   ncclUint8};
        const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
        const size_t n = 7;
        unsigned char h[64], o[64];
        for (ncclDataType_t t : types)
            for (ncclRedOp_t op : ops) {
                for (size_t i = 0; i < n; i++)
                    put(h, t, i, val(r, i));
                void *d = dev(h, n * tsize(t));
                CHECK(ncclAllReduce(d, d, n, t, op, c, s) == ncclSuccess, "allreduce");
                back(o, d, s, n * tsize(t));
                for (size_t i = 0; i < n; i++) {
                    double want = val(0, i);
                    bool fl = t == ncclFloat32 || t == ncclFloat64 || t == ncclFloat16 ||
                              t == ncclBfloat16;
                    if (op == ncclAvg && t == ncclFloat32) { /* NCCL's: x·fl(1/3), summed */
                        float k = (float)(1.0 / W), a = val(0, i) * k;
                        for (int q = 1; q < W; q++)
                            a = a + val(q, i) * k;
                        want = a;
                    } else {
                        double sum = 0;
                        for (int q = 0; q < W; q++) {
                            double x = val(q, i);
                            sum += x;
                            if (q)
                                want = op == ncclProd  ? want * x
                                       : op == ncclMax ? fmax(want, x)
                                       : op == ncclMin ? fmin(want, x)
                                                       : want + x;
                        }
                        if (op == ncclAvg)
                            want = fl ? sum / W : floor(sum / W);
                    }
                    double tol = op == ncclAvg && fl && t != ncclFloat32
                                     ? (t == ncclFloat64 ? 1e-15 : 1e-2) * want
                                     : 0;
                    CHECK(fabs(get(o, t, i) - want) <= tol, "type %d op %d [%zu]: %.9g, want %.9g",
                          (int)t, (int)op, i, get(o, t, i), want);
                }
                cudaFree(d);
            }
        /* across chunks: 300001 floats (1.2 MB; reduce-scatter's input 3.6 MB) */
        const size_t big = 300001;
        float *hb = (float *)malloc(big * W * 4), *ob = (float *)malloc(big * W * 4);
        for (size_t i = 0; i < big * W; i++)
            hb[i] = (float)((i * 7 + (size_t)r * 13) % 1000) / 7.0f;
        void *a = dev(hb, big * 4), *g = dev(nullptr, big * W * 4);
        CHECK(ncclAllReduce(a, a, big, ncclFloat32, ncclSum, c, s) == ncclSuccess, "big");
        back(ob, a, s, big * 4);
        for (size_t i = 0; i < big; i += 997) {
            float want = 0;
            for (int q = 0; q < W; q++)
                want += (float)((i * 7 + (size_t)q * 13) % 1000) / 7.0f; /* rank order */
            CHECK(ob[i] == want, "big allreduce [%zu]: %.9g, want %.9g", i, ob[i], want);
        }
        sums[r] = hash(ob, big * 4);
        CHECK(ncclAllGather(a, g, big, ncclFloat32, c, s) == ncclSuccess, "allgather");
        back(ob, g, s, big * W * 4);
        for (int q = 0; q < W; q++)
            CHECK(!memcmp(ob + q * big, ob + r * big, big * 4), "allgather block %d", q);
        cudaMemcpy(a, hb, big * 4, cudaMemcpyHostToDevice);
        CHECK(ncclBroadcast(a, a, big, ncclFloat32, 2, c, s) == ncclSuccess, "broadcast");
        back(ob, a, s, big * 4);
        for (size_t i = 0; i < big; i += 991)
            CHECK(ob[i] == (float)((i * 7 + 26) % 1000) / 7.0f, "broadcast [%zu]", i);
        cudaMemcpy(g, hb, big * W * 4, cudaMemcpyHostToDevice);
        CHECK(ncclReduceScatter(g, a, big, ncclFloat32, ncclMax, c, s) == ncclSuccess, "rs");
        back(ob, a, s, big * 4);
        for (size_t i = 0; i < big; i += 983) {
            float want = 0;
            for (int q = 0; q < W; q++)
                want = fmaxf(want, (float)(((r * big + i) * 7 + (size_t)q * 13) % 1000) / 7.0f);
            CHECK(ob[i] == want, "reduce-scatter [%zu]: %.9g, want %.9g", i, ob[i], want);
        }
        /* refused: host memory, fp8, a bad root */
        CHECK(ncclAllReduce(hb, a, 4, ncclFloat32, ncclSum, c, s) == ncclInvalidArgument, "host");
        CHECK(strstr(ncclGetLastError(nullptr), "not device memory"), "%s",
              ncclGetLastError(nullptr));
        CHECK(ncclAllReduce(a, a, 4, ncclFloat8e4m3, ncclSum, c, s) == ncclInvalidArgument, "fp8");
        CHECK(ncclBroadcast(a, a, 4, ncclFloat32, W, c, s) == ncclInvalidArgument, "root");
        int cnt = 0, rk = -1, dv = -1;
        CHECK(ncclCommCount(c, &cnt) == ncclSuccess && cnt == W, "count");
        CHECK(ncclCommUserRank(c, &rk) == ncclSuccess && rk == r, "rank");
        CHECK(ncclCommCuDevice(c, &dv) == ncclSuccess && dv == r, "device");
        ncclResult_t fin = ncclCommFinalize(c);
        CHECK(fin == ncclSuccess || fin == ncclInProgress, "finalize");
        CHECK(ncclCommDestroy(c) == ncclSuccess, "destroy");
        cudaFree(a);
        cudaFree(g);
        cudaStreamDestroy(s);
        free(hb);
        free(ob);
    });
    CHECK(ok, "collectives");
    CHECK(sums[0] == sums[1] && sums[1] == sums[2], "ranks' results differ");
    printf("ok: every reduction and type exact; chunked collectives bit-identical on 3 ranks\n");

    /* 2. a peer that never comes: not ready until ncclCommAbort from another thread */
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    ok = ranks(2, [&](int r) {
        ncclComm_t c = init(id, 2, r);
        if (r == 1) { /* skips the collective; leaves after rank 0 aborted */
            usleep(1500000);
            ncclCommDestroy(c);
            return;
        }
        Issued x = issue_allreduce(c);
        cudaEvent_t e = x.e;
        CHECK(!done_within(e, 0.3), "a collective without its peer finished");
        ncclResult_t ae;
        CHECK(ncclCommGetAsyncError(c, &ae) == ncclSuccess && ae == ncclSuccess, "async %d", ae);
        pthread_t th;
        pthread_create(
            &th, nullptr,
            [](void *p) -> void * {
                ncclCommAbort((ncclComm_t)p);
                return nullptr;
            },
            c);
        CHECK(done_within(e, 2), "the abort did not end the collective");
        pthread_join(th, nullptr);
        release(x);
    });
    CHECK(ok, "abort");
    printf("ok: a collective missing its peer waits; ncclCommAbort from another thread ends it\n");

    /* 3. a dead peer: ncclRemoteError while the collective stays unfinished */
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    ok = ranks(2, [&](int r) {
        ncclComm_t c = init(id, 2, r);
        if (r == 1)
            _exit(0); /* dies, communicator and all */
        Issued x = issue_allreduce(c);
        cudaEvent_t e = x.e;
        ncclResult_t ae = ncclSuccess;
        double end = now_s() + 5;
        while (ae == ncclSuccess && now_s() < end) {
            (void)cudaEventQuery(e);
            ncclCommGetAsyncError(c, &ae);
            usleep(1000);
        }
        CHECK(ae == ncclRemoteError, "async error %d, want ncclRemoteError", (int)ae);
        CHECK(strstr(ncclGetLastError(c), "rank 1 (process"), "%s", ncclGetLastError(c));
        CHECK(cudaEventQuery(e) == cudaErrorNotReady, "the collective finished with its peer dead");
        ncclCommAbort(c);
        CHECK(done_within(e, 2), "the abort did not end the collective");
        release(x);
    });
    CHECK(ok, "dead peer");
    printf("ok: a dead peer is ncclRemoteError; the collective ends at the abort\n");

    /* 4. two ranks on one device; arguments init refuses */
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    ok = ranks(2, [&](int) {
        ncclComm_t c = init(id, 2, 0, ncclInvalidUsage);
        CHECK(strstr(ncclGetLastError(c), "Duplicate GPU detected : rank 0 and rank 1"), "%s",
              ncclGetLastError(c));
        ncclCommAbort(c);
    });
    CHECK(ok, "duplicate GPU");
    ncclComm_t c = nullptr;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    CHECK(ncclCommInitRankConfig(&c, 2, id, 0, &bad) == ncclInvalidArgument, "bad config");
    CHECK(ncclCommInitRankConfig(&c, 2, id, 2, nullptr) == ncclInvalidArgument, "rank 2 of 2");
    ncclUniqueId junk;
    memset(&junk, 7, sizeof junk);
    CHECK(ncclCommInitRankConfig(&c, 1, junk, 0, nullptr) == ncclInvalidArgument, "not an id");
    printf("ok: two ranks on one device refused (Duplicate GPU); bad arguments refused\n");

    /* 5. nothing left in /dev/shm */
    DIR *dir = opendir("/dev/shm");
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ddpc-nccl-emu-%s-", tag);
    for (struct dirent *de; dir && (de = readdir(dir));)
        CHECK(strncmp(de->d_name, prefix, strlen(prefix)), "left behind: /dev/shm/%s", de->d_name);
    if (dir)
        closedir(dir);
    printf("ok: no /dev/shm segment left\n");
    return 0;
}
