/*
 * kernels/cuda/stub.c — the CUDA entry points of kernels/kernels.h in a build without CUDA
 * (DDP_CUDA off: no nvcc, or a sanitizer build). Each says so, so callers need no #ifdef.
 */
#include "kernels/kernels.h"
#include "util/util.h"

ddp_status ddp__cuda_device_count(int *n, ddp_error *err)
{
    if (!n)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device count: the output n is NULL");
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); HINT: reconfigure "
                    "with nvcc on the PATH (or -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc) "
                    "and -DDDP_CUDA=ON");
}

ddp_status ddp__cuda_device_name(int idx, char *name, size_t cap, ddp_error *err)
{
    (void)idx;
    if (!name || cap == 0)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device name: no output buffer");
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); no device names");
}

/* The CUDA GPT: never built without CUDA (gpt.c asks for it only with device cuda, which
 * ddp_device_select refuses first; these answer a caller that skipped that). */
#define NO_CUDA                                                                                    \
    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); HINT: use device cpu, or a build "   \
    "with nvcc"

ddp_status ddp__cuda_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                                ddp__cuda_gpt **out, ddp_error *err)
{
    (void)cfg, (void)counts, (void)n, (void)out;
    return ddp__err(err, DDP_ERR_NOT_FOUND, NO_CUDA);
}

void ddp__cuda_gpt_free(ddp__cuda_gpt *g)
{
    (void)g;
}

ddp_status ddp__cuda_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err)
{
    (void)g, (void)data_host;
    return ddp__err(err, DDP_ERR_NOT_FOUND, NO_CUDA);
}

ddp_status ddp__cuda_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                                 int n, int T, bool train, bool last_logits, float grad_scale,
                                 double *loss_sum, int *count, int64_t *correct, float *logits_host,
                                 ddp_error *err)
{
    (void)g, (void)tokens, (void)targets, (void)n, (void)T, (void)train, (void)last_logits;
    (void)grad_scale, (void)loss_sum, (void)count, (void)correct, (void)logits_host;
    return ddp__err(err, DDP_ERR_NOT_FOUND, NO_CUDA);
}

ddp_status ddp__cuda_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err)
{
    (void)g, (void)grads_host;
    return ddp__err(err, DDP_ERR_NOT_FOUND, NO_CUDA);
}
