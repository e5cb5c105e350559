/*
 * fake_gpu_module.c — stand-ins for libddp_gpu.so (kernels/gpu_module.h) that test_gpu_module
 * points DDP_GPU_MODULE at, so the loader's every outcome is tested without CUDA or a GPU:
 * built as is, a module of FAKE_GPUS fake devices; with -DFAKE_ABI=999, a stale module; with
 * -DFAKE_NO_ENTRY, a shared library that is not a module; with -DFAKE_NEEDS_DEP, a module that
 * needs a library the dynamic linker cannot find (as libddp_gpu.so without libcublas.so.13). Like
 * the real module it calls nothing in libddp.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/gpu_module.h"

#ifndef FAKE_ABI
#define FAKE_ABI DDP_GPU_MODULE_ABI
#endif
#define FAKE_GPUS 3

static ddp_status no(ddp_error *err)
{
    if (err) {
        snprintf(err->msg, sizeof err->msg, "fake gpu module: no GPT here");
        err->status = DDP_ERR_NOT_FOUND;
    }
    return DDP_ERR_NOT_FOUND;
}

#ifdef FAKE_NEEDS_DEP
int fake_gpu_dep_value(void); /* in libfake_gpu_dep.so, which is not on the library path */
#else
static int fake_gpu_dep_value(void)
{
    return 0;
}
#endif

static ddp_status count(int *n, ddp_error *err)
{
    (void)err;
    *n = FAKE_GPUS + fake_gpu_dep_value();
    return DDP_OK;
}

static ddp_status name(int idx, char *out, size_t cap, ddp_error *err)
{
    (void)err;
    snprintf(out, cap, "Fake GPU %d", idx);
    return DDP_OK;
}

static ddp_status gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                             ddp__cuda_gpt **out, ddp_error *err)
{
    (void)cfg, (void)counts, (void)n, (void)out;
    return no(err);
}

static void gpt_free(ddp__cuda_gpt *g)
{
    (void)g;
}

static ddp_status gpt_set_params(ddp__cuda_gpt *g, const float *const *d, ddp_error *err)
{
    (void)g, (void)d;
    return no(err);
}

static ddp_status gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                              int n, int T, bool train, bool last, float scale, uint64_t step,
                              uint64_t off, double *loss, int *cnt, int64_t *correct,
                              float *logits, ddp_error *err)
{
    (void)g, (void)tokens, (void)targets, (void)n, (void)T, (void)train, (void)last;
    (void)step, (void)off;
    (void)scale, (void)loss, (void)cnt, (void)correct, (void)logits;
    return no(err);
}

static ddp_status gpt_backward(ddp__cuda_gpt *g, float *const *grads, ddp_error *err)
{
    (void)g, (void)grads;
    return no(err);
}

static void set_host(const ddp__gpu_host *host)
{
    (void)host;
}

static ddp_status devops(int device, struct ddp__devops *out, ddp_error *err)
{
    (void)device, (void)out;
    return no(err);
}

static const ddp__gpu_api table = {
    .abi = FAKE_ABI,
    .size = sizeof(ddp__gpu_api),
    .set_host = set_host,
    .device_count = count,
    .device_name = name,
    .gpt_create = gpt_create,
    .gpt_free = gpt_free,
    .gpt_set_params = gpt_set_params,
    .gpt_forward = gpt_forward,
    .gpt_backward = gpt_backward,
    .cuda_devops = devops,
    .nccl_create = NULL, /* a module without NCCL */
};

#ifndef FAKE_NO_ENTRY
__attribute__((visibility("default"))) const ddp__gpu_api *ddp_gpu_module_entry(void)
{
    return &table;
}
#else
const ddp__gpu_api *fake_gpu_table(void);
const ddp__gpu_api *fake_gpu_table(void)
{
    return &table;
}
#endif
