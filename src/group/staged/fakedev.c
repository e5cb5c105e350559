/*
 * staged/fakedev.c — for tests only (DDP_TEST_FAKE_GPUS, ddp_settings.fake_gpus): ddp__devops
 * whose "device memory" is host memory and whose copies are memcpy, so the cuda-staged backend
 * runs end to end — through the core, the choice of backend, shm and ddprun — on a machine with no
 * GPU (integration.gpu_fake). What it cannot show: anything about real GPUs (streams, pinning,
 * copy speed); tests/integration/test_gpu.sh on a GPU does.
 */
#include <stdlib.h>
#include <string.h>

#include "group/staged/staged_int.h"
#include "util/util.h"

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
    memmove(dst, src, bytes);
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
    return aligned_alloc(256, (bytes + 255) / 256 * 256);
}

static void fake_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
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
                         .destroy = fake_destroy};
    return DDP_OK;
}
