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
 * What it cannot show: anything about real GPUs (streams, pinning, copy speed, kernels);
 * tests/integration/test_gpu.sh and scripts/gpu-check.sh on a GPU do.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "group/staged/staged_int.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/util.h"

/* Every live fake allocation: where the host may not touch it, and where the operations do. */
typedef struct fake_block {
    char *dev, *rw;
    size_t bytes;
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

static ddp_status fake_after(void *ctx, void *stream, char *msg)
{
    (void)ctx;
    (void)stream;
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
    /* DDP_TEST_FAKE_GPU_OPEN=1: host-readable, for a fake GPU module that computes on the host
     * (tests/integration/fake_gpu_gpt.c) */
    const char *open_env = getenv("DDP_TEST_FAKE_GPU_OPEN");
    int prot = open_env && !strcmp(open_env, "1") ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (ftruncate(fd, (off_t)len) == 0) {
        dev = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
        rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    close(fd);
    bool ok = dev != MAP_FAILED && rw != MAP_FAILED;
    pthread_mutex_lock(&blocks_mu);
    if (ok && nblocks == cap_blocks) {
        size_t cap = cap_blocks ? 2 * cap_blocks : 16;
        fake_block *nb = realloc(blocks, cap * sizeof *nb);
        if (nb) {
            blocks = nb;
            cap_blocks = cap;
        }
        ok = nb != NULL;
    }
    if (ok)
        blocks[nblocks++] = (fake_block){dev, rw, len};
    pthread_mutex_unlock(&blocks_mu);
    if (!ok) {
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
    }
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
                         .d2h = fake_copy,
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
                         .destroy = fake_destroy};
    return DDP_OK;
}
