/*
 * staged/fakedev.c — for tests only (DDP_TEST_FAKE_GPUS, ddp_settings.fake_gpus): ddp__devops
 * whose "device memory" is host memory and whose copies are memcpy, so the cuda-staged backend
 * and the reducer's buckets in device memory run end to end — through the core, the choice of
 * backend, shm and ddprun — on a machine with no GPU (integration.gpu_fake, ddp.reducer.gpu_fake).
 *
 * Like real device memory, the fake's cannot be touched by the host: an allocation is one memfd
 * mapped twice, and the pointer handed out is the mapping with no access (PROT_NONE), so code that
 * reads or writes "device" memory directly instead of through these operations faults, as it would
 * on a GPU. The operations reach the memory through the second, read-write mapping (shadow()).
 *
 * cuda-ipc's mapping of a peer's memory is the same memfd opened through /proc (below).
 *
 * What it cannot show: anything about real GPUs (streams, pinning, copy speed, kernels);
 * tests/integration/test_gpu.sh and scripts/gpu-check.sh on a GPU do.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "group/staged/staged_int.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/util.h"

/* Every live fake allocation: where the host may not touch it, and where the operations do. */
typedef struct fake_block {
    char *dev, *rw;
    size_t bytes;
    int fd; /* the memfd behind an allocation of this process (ipc_export's); -1 for a peer's
               block mapped by ipc_open */
} fake_block;

static pthread_mutex_t blocks_mu = PTHREAD_MUTEX_INITIALIZER;
static fake_block *blocks;
static size_t nblocks, cap_blocks;

/* The read-write address of p: inside a fake allocation, its twin in the shadow mapping; else p
 * itself (host memory). */
static void *shadow(const void *p)
{
    const char *c = p;
    void *out = (void *)p;
    pthread_mutex_lock(&blocks_mu);
    for (size_t i = 0; i < nblocks; i++) {
        if (c >= blocks[i].dev && c < blocks[i].dev + blocks[i].bytes) {
            out = blocks[i].rw + (c - blocks[i].dev);
            break;
        }
    }
    pthread_mutex_unlock(&blocks_mu);
    return out;
}

static ddp_status fake_after(void *ctx, void *stream, void *ready, char *msg)
{
    (void)ctx;
    (void)stream;
    (void)ready;
    (void)msg;
    return DDP_OK;
}

static ddp_status fake_copy(void *ctx, void *dst, const void *src, size_t bytes, char *msg)
{
    (void)ctx;
    (void)msg;
    if (bytes)
        memmove(shadow(dst), shadow(src), bytes);
    return DDP_OK;
}

/* Whether the RANK variable names global rank `var`'s value (the fault hooks below). */
static bool fault_here(const char *var)
{
    const char *r = getenv(var), *rank = getenv("RANK");
    return r && rank && !strcmp(r, rank);
}

/* A copy device → host (cuda-staged's way into its staging buffer). For the tests of the peers'
 * failure (tests/integration/test_gpu.sh): DDP_TEST_FAKE_KILL_IN_COPY=R makes global rank R die
 * here, in the middle of a collective; DDP_TEST_FAKE_FAIL_IN_COPY=R makes the copy fail, as a
 * device copy can. */
static ddp_status fake_d2h(void *ctx, void *dst, const void *src, size_t bytes, char *msg)
{
    if (fault_here("DDP_TEST_FAKE_KILL_IN_COPY"))
        raise(SIGKILL);
    if (fault_here("DDP_TEST_FAKE_FAIL_IN_COPY")) {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "cuda: copy device → host: an illegal memory access (the test's failure)");
        return DDP_ERR_SYSTEM;
    }
    return fake_copy(ctx, dst, src, bytes, msg);
}

static ddp_status fake_sync(void *ctx, int64_t deadline_ms, char *msg)
{
    (void)ctx;
    (void)deadline_ms;
    (void)msg;
    return DDP_OK;
}

/* Pins nothing; refuses, as cudaHostRegister can, when DDP_TEST_FAKE_PIN_REFUSED=1 (tests of
 * cuda-staged's unpinned fallback, test_nccl). */
static ddp_status fake_pin(void *ctx, void *p, size_t bytes, char *msg)
{
    (void)ctx;
    (void)p;
    (void)bytes;
    const char *refuse = getenv("DDP_TEST_FAKE_PIN_REFUSED");
    if (refuse && !strcmp(refuse, "1")) {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "cudaHostRegister failed: operation not supported (the test's refusal)");
        return DDP_ERR_SYSTEM;
    }
    return DDP_OK;
}

static void fake_unpin(void *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

/* Adds a block to the list; false when out of memory. */
static bool register_block(char *dev, char *rw, size_t len, int fd)
{
    bool ok = true;
    pthread_mutex_lock(&blocks_mu);
    if (nblocks == cap_blocks) {
        size_t cap = cap_blocks ? 2 * cap_blocks : 16;
        fake_block *nb = realloc(blocks, cap * sizeof *nb);
        if (nb) {
            blocks = nb;
            cap_blocks = cap;
        }
        ok = nb != NULL;
    }
    if (ok)
        blocks[nblocks++] = (fake_block){dev, rw, len, fd};
    pthread_mutex_unlock(&blocks_mu);
    return ok;
}

/* Maps a fake allocation of len bytes from memfd fd twice: the "device" view (no access unless
 * DDP_TEST_FAKE_GPU_OPEN=1) into *dev, the operations' read-write view into *rw. */
static bool map_twice(int fd, size_t len, char **dev, char **rw)
{
    /* DDP_TEST_FAKE_GPU_OPEN=1: host-readable, for a fake GPU module that computes on the host
     * (tests/integration/fake_gpu_gpt.c) */
    const char *open_env = getenv("DDP_TEST_FAKE_GPU_OPEN");
    int prot = open_env && !strcmp(open_env, "1") ? PROT_READ | PROT_WRITE : PROT_NONE;
    *dev = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    *rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return *dev != MAP_FAILED && *rw != MAP_FAILED;
}

static void *fake_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page;
    if (len == 0)
        len = page;
    int fd = memfd_create("ddp-fake-gpu", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *dev = MAP_FAILED, *rw = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        (void)map_twice(fd, len, &dev, &rw);
    bool ok = dev != MAP_FAILED && rw != MAP_FAILED;
    ok = ok && register_block(dev, rw, len, fd);
    if (!ok) {
        close(fd);
        if (dev != MAP_FAILED)
            munmap(dev, len);
        if (rw != MAP_FAILED)
            munmap(rw, len);
        return NULL;
    }
    return dev;
}

static void fake_free(void *ctx, void *p)
{
    (void)ctx;
    /* (fake_ipc_close too: a peer's block is freed the same way, its fd -1) */
    if (!p)
        return;
    fake_block b = {0};
    pthread_mutex_lock(&blocks_mu);
    for (size_t i = 0; i < nblocks; i++) {
        if (blocks[i].dev == p) {
            b = blocks[i];
            blocks[i] = blocks[--nblocks];
            break;
        }
    }
    if (nblocks == 0) {
        free(blocks);
        blocks = NULL;
        cap_blocks = 0;
    }
    pthread_mutex_unlock(&blocks_mu);
    if (b.dev) {
        munmap(b.dev, b.bytes);
        munmap(b.rw, b.bytes);
        if (b.fd >= 0)
            close(b.fd);
    }
}

/* ---- cuda-ipc on the fake GPU (group/devops.h) ----------------------------------------------
 * A fake allocation is a memfd; its handle names the exporting process and the descriptor, and a
 * peer opens it as /proc/<pid>/fd/<fd> and maps it (as cudaIpcOpenMemHandle maps a peer's device
 * memory). Why a memfd through /proc rather than a named shm segment: the memory has no name in
 * any file system, so nothing can be left in /dev/shm whatever happens — a rank killed between
 * export and open included; the kernel frees it when the last mapping and descriptor go. The cost:
 * opening needs the exporter alive and the same PID namespace and user (ranks of one host under
 * ddprun are), which is also what CUDA IPC needs. */

typedef struct fake_handle {
    char magic[8]; /* "ddpfake" */
    int32_t pid, fd;
    uint64_t bytes;
} fake_handle;

static ddp_status fake_ipc_export(void *ctx, void *dev, void *handle, char *msg)
{
    (void)ctx;
    fake_handle h = {.magic = "ddpfake", .pid = (int32_t)getpid(), .fd = -1};
    pthread_mutex_lock(&blocks_mu);
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].dev == dev) {
            h.fd = blocks[i].fd;
            h.bytes = blocks[i].bytes;
        }
    pthread_mutex_unlock(&blocks_mu);
    if (h.fd < 0) {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "cudaIpcGetMemHandle failed: %p is not the start of an allocation of this "
                 "process (the fake GPU's)",
                 dev);
        return DDP_ERR_INVALID;
    }
    memset(handle, 0, DDP__IPC_HANDLE_BYTES);
    memcpy(handle, &h, sizeof h);
    return DDP_OK;
}

static ddp_status fake_ipc_open(void *ctx, const void *handle, void **dev, char *msg)
{
    (void)ctx;
    /* DDP_TEST_FAKE_IPC_REFUSED=r: rank r's opens fail, as in a container without a shared IPC
     * namespace (auto then falls back to cuda-staged on every rank) */
    const char *refuse = getenv("DDP_TEST_FAKE_IPC_REFUSED"), *rank = getenv("RANK");
    if (refuse && atoi(refuse) == atoi(rank ? rank : "0")) {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "cudaIpcOpenMemHandle failed: operation not supported "
                 "(DDP_TEST_FAKE_IPC_REFUSED)");
        return DDP_ERR_SYSTEM;
    }
    fake_handle h;
    memcpy(&h, handle, sizeof h);
    if (memcmp(h.magic, "ddpfake", 8) != 0) {
        ddp__fmt(msg, DDP_ERRMSG_MAX, "cudaIpcOpenMemHandle failed: not a fake GPU's handle");
        return DDP_ERR_INVALID;
    }
    char path[64];
    ddp__fmt(path, sizeof path, "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        ddp__fmt(msg, DDP_ERRMSG_MAX, "cudaIpcOpenMemHandle failed: open '%s': %s", path,
                 strerror(errno));
        return DDP_ERR_SYSTEM;
    }
    struct stat sb;
    char *d = MAP_FAILED, *rw = MAP_FAILED;
    bool ok = fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == h.bytes &&
              map_twice(fd, (size_t)h.bytes, &d, &rw) && register_block(d, rw, (size_t)h.bytes, -1);
    int saved = errno;
    close(fd); /* the mappings keep the memory */
    if (!ok) {
        if (d != MAP_FAILED)
            munmap(d, (size_t)h.bytes);
        if (rw != MAP_FAILED)
            munmap(rw, (size_t)h.bytes);
        ddp__fmt(msg, DDP_ERRMSG_MAX, "cudaIpcOpenMemHandle failed: mapping '%s': %s", path,
                 strerror(saved));
        return DDP_ERR_SYSTEM;
    }
    *dev = d;
    return DDP_OK;
}

static void fake_ipc_close(void *ctx, void *dev)
{
    fake_free(ctx, dev); /* a peer's block: unmapped, no descriptor */
}

/* The fixed-order reduction of cpu/reduce.c, then the division once. For the tests of the peers'
 * failure (tests/integration/test_gpu.sh): DDP_TEST_FAKE_KILL_IN_REDUCE=R makes global rank R (the
 * RANK variable) die here, in the middle of a collective; DDP_TEST_FAKE_FAIL_IN_REDUCE=R makes
 * its reduction fail, as a kernel launch can. */
static ddp_status fake_reduce(void *ctx, void *dst, const void *const *srcs, int k, size_t n,
                              ddp_dtype t, ddp_op op, int avg_div, char *msg)
{
    (void)ctx;
    if (fault_here("DDP_TEST_FAKE_KILL_IN_REDUCE"))
        raise(SIGKILL);
    if (fault_here("DDP_TEST_FAKE_FAIL_IN_REDUCE")) {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "cuda: reduce: an illegal memory access (the test's failure)");
        return DDP_ERR_SYSTEM;
    }
    if (k < 1 || k > DDP__IPC_MAX_SRCS) {
        ddp__fmt(msg, DDP_ERRMSG_MAX, "reduce over %d sources (1 to %d)", k, DDP__IPC_MAX_SRCS);
        return DDP_ERR_INVALID;
    }
    const void *rw[DDP__IPC_MAX_SRCS];
    for (int j = 0; j < k; j++)
        rw[j] = shadow(srcs[j]);
    void *d = shadow(dst);
    ddp__reduce_many_avg(d, rw, k, n, t, op, avg_div);
    return DDP_OK;
}

/* ---- the reducer's arithmetic, on the host (group/devops.h) ---------------------------------- */

static ddp_status fake_memset0(void *ctx, void *stream, void *dev, size_t bytes, char *msg)
{
    (void)ctx, (void)stream, (void)msg;
    if (bytes)
        memset(shadow(dev), 0, bytes);
    return DDP_OK;
}

static ddp_status fake_convert(void *ctx, void *stream, void *dst, ddp_dtype dt, const void *src,
                               ddp_dtype st, size_t n, char *msg)
{
    (void)ctx, (void)stream;
    if (st == DDP_FLOAT32 && dt == DDP_BFLOAT16) {
        const float *s = shadow(src);
        uint16_t *d = shadow(dst);
        for (size_t i = 0; i < n; i++)
            d[i] = ddp__f32_to_bf16(s[i]);
    } else if (st == DDP_BFLOAT16 && dt == DDP_FLOAT32) {
        const uint16_t *s = shadow(src);
        float *d = shadow(dst);
        for (size_t i = 0; i < n; i++)
            d[i] = ddp__bf16_to_f32(s[i]);
    } else {
        ddp__fmt(msg, DDP_ERRMSG_MAX,
                 "device conversion from %s to %s is not implemented (float32 <-> bfloat16 only)",
                 ddp_dtype_name(st), ddp_dtype_name(dt));
        return DDP_ERR_INVALID;
    }
    return DDP_OK;
}

static ddp_status fake_sumsq(void *ctx, void *stream, const void *const *devs, const size_t *ns,
                             const ddp_dtype *ts, int k, double *out_host, int64_t deadline_ms,
                             char *msg)
{
    (void)ctx, (void)stream, (void)deadline_ms;
    double s = 0.0;
    for (int j = 0; j < k; j++) {
        ddp_dtype t = ts[j];
        if (t != DDP_FLOAT32 && t != DDP_FLOAT64 && t != DDP_BFLOAT16 && t != DDP_FLOAT16) {
            ddp__fmt(msg, DDP_ERRMSG_MAX, "sum of squares of %s is not implemented",
                     ddp_dtype_name(t));
            return DDP_ERR_INVALID;
        }
        s += ddp__sum_squares(shadow(devs[j]), ns[j], t);
    }
    *out_host = s;
    return DDP_OK;
}

static ddp_status fake_unscale(void *ctx, void *stream, float *dev, size_t n, float inv,
                               bool *found_host, int64_t deadline_ms, char *msg)
{
    (void)ctx, (void)stream, (void)deadline_ms, (void)msg;
    float *g = shadow(dev);
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        found |= !isfinite(g[i]);
        g[i] *= inv;
    }
    *found_host = found;
    return DDP_OK;
}

static ddp_status fake_wait(void *ctx, void *stream, int64_t deadline_ms, char *msg)
{
    (void)ctx, (void)stream, (void)deadline_ms, (void)msg;
    return DDP_OK;
}

static void fake_destroy(void *ctx)
{
    (void)ctx;
}

ddp_status ddp__fake_devops(ddp__devops *out, ddp_error *err)
{
    (void)err;
    *out = (ddp__devops){.ctx = NULL,
                         .after = fake_after,
                         .d2h = fake_d2h,
                         .h2d = fake_copy,
                         .sync = fake_sync,
                         .pin = fake_pin,
                         .unpin = fake_unpin,
                         .alloc = fake_alloc,
                         .free = fake_free,
                         .copy = fake_copy,
                         .memset0 = fake_memset0,
                         .convert = fake_convert,
                         .sumsq = fake_sumsq,
                         .wait = fake_wait,
                         .unscale = fake_unscale,
                         .ipc_export = fake_ipc_export,
                         .ipc_open = fake_ipc_open,
                         .ipc_close = fake_ipc_close,
                         .reduce = fake_reduce,
                         .d2d = fake_copy,
                         .destroy = fake_destroy};
    return DDP_OK;
}
