/*
 * fake_gpu_gpt.c — a test-only GPU module (kernels/gpu_module.h) whose "GPU GPT" is the CPU GPT
 * (src/nn/gpt.c, compiled into this module with the layers it needs) and whose "device memory"
 * is host memory. With DDP_GPU_MODULE pointing here, DDP_TEST_FAKE_GPUS=1 (GPU groups over
 * cuda-staged on the fake GPU) and DDP_TEST_FAKE_GPU_OPEN=1 (that fake GPU's memory readable by
 * the host, so this module can add gradients into the reducer's buckets), `ddptrain --device cuda`
 * runs its whole device-resident path on a machine without a GPU: the GPU group, the reducer on
 * "device" buckets, the optimizer stepped through the module, checkpoints copied off the
 * "device" and back (tests/integration/test_resident_fake.sh). It shows the orchestration, not the
 * CUDA kernels (those are scripts/gpu-check.sh's). Like the real module it calls nothing in the
 * program's libddp: the CPU model here is this module's own copy. Any precision is taken (the
 * arithmetic is float32's), so fp16's loss scaling can be driven too: with
 * DDP_TEST_FAKE_GPU_INF_AT=k the k-th backward of the process (on the rank RANK equal to
 * DDP_TEST_FAKE_GPU_INF_RANK, default 0) adds an inf to one gradient, as an fp16 overflow would.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/model.h"
#include "ddp/nn.h"
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"

#include "fake_gpu_cls.h" /* its MLP and CNN: the CPU classifier (fake_gpu_cls.c) */
#include "fake_gpu_resident.h"

#define EXPORT __attribute__((visibility("default")))

struct ddp__cuda_gpt {
    fake_res r; /* the CPU model on the "device" flat buffers, as gpt.cu has them */
    int V;
};

static ddp_status fail(ddp_error *err, ddp_status st, const char *msg)
{
    return fake_res_fail(err, st, "fake gpu gpt", msg);
}

static void gpt_free(ddp__cuda_gpt *g)
{
    if (!g)
        return;
    ddp_model_free(g->r.m);
    fake_res_free(&g->r);
    free(g);
}

static ddp_status gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                             ddp__cuda_gpt **out, ddp_error *err)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.n_layer = cfg->L, s.n_head = cfg->nh, s.n_embd = cfg->C, s.block_size = cfg->Tmax;
    s.vocab_size = cfg->V, s.max_batch = cfg->B, s.bias = cfg->bias;
    s.dropout = cfg->dropout, s.seed = cfg->seed;
    ddp__cuda_gpt *g = calloc(1, sizeof *g);
    if (!g)
        return fail(err, DDP_ERR_NOMEM, "out of memory");
    g->V = cfg->V;
    g->r.name = "fake gpu gpt";
    ddp_status st = ddp_model_build(&s, &g->r.m, err);
    if (!st)
        st = fake_res_init(&g->r, g->r.m, counts, n, err);
    if (st) {
        gpt_free(g);
        return st;
    }
    *out = g;
    return DDP_OK;
}

static ddp_status set_params(ddp__cuda_gpt *g, const float *const *d, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->r.np; i++)
        memcpy(fake_res_param(&g->r, i), d[i], g->r.counts[i] * sizeof(float));
    return DDP_OK;
}

static ddp_status get_params(ddp__cuda_gpt *g, float *const *d, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->r.np; i++)
        memcpy(d[i], fake_res_param(&g->r, i), g->r.counts[i] * sizeof(float));
    return DDP_OK;
}

static ddp_status forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets, int n,
                          int T, bool train, bool last, float scale, uint64_t step, uint64_t off,
                          double *loss, int *cnt, int64_t *correct, float *logits, ddp_error *err)
{
    ddp_model_batch b = {.n = n,
                         .tokens = tokens,
                         .targets = targets,
                         .seq_len = T,
                         .grad_scale = scale,
                         .last_logits = last,
                         .step = step,
                         .sample_offset = off};
    ddp_model_out o = {0};
    if (ddp_model_forward(g->r.m, &b, train, &o) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->r.m));
    if (targets) {
        *loss = o.loss * o.count;
        *cnt = (int)o.count;
        *correct = o.correct;
    }
    size_t rows = 0, cols = 0;
    const float *lg = ddp_model_logits(g->r.m, &rows, &cols);
    if (logits && !train && lg)
        memcpy(logits, lg, rows * cols * sizeof(float));
    return DDP_OK;
}

static int calls; /* backwards so far, for DDP_TEST_FAKE_GPU_INF_AT */

/* The host-driven backward: into the model's own gradients, then added into dst[i]. */
static ddp_status backward_host(ddp__cuda_gpt *g, float *const *dst, ddp_error *err)
{
    memset(g->r.grads, 0, g->r.total * sizeof(float));
    if (ddp_model_backward(g->r.m, NULL, NULL) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->r.m));
    if (fake_res_inject_inf(&calls))
        g->r.grads[0] = INFINITY;
    for (size_t i = 0; i < g->r.np; i++)
        for (size_t k = 0; k < g->r.counts[i]; k++)
            dst[i][k] += g->r.grads[g->r.offsets[i] + k];
    return DDP_OK;
}

/* The resident backward as gpt.cu does it: straight into the caller's gradients (the model's
 * bound there for the call), each reported ready as the CPU model finishes it. */
static ddp_status backward_dev(ddp__cuda_gpt *g, float *const *dst,
                               ddp_status (*ready)(void *ctx, size_t i), void *ctx, ddp_error *err)
{
    for (size_t i = 0; i < g->r.np; i++)
        ddp_model_bind(g->r.m, i, fake_res_param(&g->r, i), dst[i]);
    fake_marks k = {ready, ctx, dst[0], fake_res_inject_inf(&calls)};
    ddp_status st = ddp_model_backward(g->r.m, fake_res_pass_ready, &k);
    for (size_t i = 0; i < g->r.np; i++)
        ddp_model_bind(g->r.m, i, NULL, g->r.grads + g->r.offsets[i]);
    return st ? fail(err, st, ddp_model_last_error(g->r.m)) : DDP_OK;
}

static ddp_status dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->r.np; i++)
        params_dev[i] = fake_res_param(&g->r, i);
    *stream = NULL;
    return DDP_OK;
}

static ddp_status optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err)
{
    return fake_res_optim_init(&g->r, nstates, err);
}

static ddp_status optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    return fake_res_optim_step(&g->r, a, err);
}

static ddp_status optim_state(ddp__cuda_gpt *g, int s, float *const *host, bool to_host,
                              ddp_error *err)
{
    return fake_res_optim_state(&g->r, s, host, to_host, err);
}

static ddp_status bind_params(ddp__cuda_gpt *g, float *const *pd, ddp_error *err)
{
    return fake_res_bind_params(&g->r, pd, err);
}

static ddp_status state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err)
{
    return fake_res_state_dev(&g->r, s, dev, err);
}

static ddp_status optim_keep(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi, ddp_error *err)
{
    return fake_res_optim_keep(&g->r, lo, hi, err);
}

static ddp_status count(int *n, ddp_error *err)
{
    (void)err;
    *n = 1;
    return DDP_OK;
}

static ddp_status name(int idx, char *out, size_t cap, ddp_error *err)
{
    (void)err;
    snprintf(out, cap, "Fake GPU %d (the CPU GPT)", idx);
    return DDP_OK;
}

static void set_host(const ddp__gpu_host *host)
{
    (void)host;
}

static ddp_status no_devops(int device, struct ddp__devops *out, ddp_error *err)
{
    (void)device, (void)out;
    return fail(err, DDP_ERR_NOT_FOUND, "no CUDA devops (use DDP_TEST_FAKE_GPUS)");
}

static const ddp__gpu_api table = {
    .abi = DDP_GPU_MODULE_ABI,
    .size = sizeof(ddp__gpu_api),
    .set_host = set_host,
    .device_count = count,
    .device_name = name,
    .gpt_create = gpt_create,
    .gpt_free = gpt_free,
    .gpt_set_params = set_params,
    .gpt_forward = forward,
    .gpt_backward = backward_host,
    .cuda_devops = no_devops,
    .nccl_create = NULL,
    .gpt_dev_info = dev_info,
    .gpt_get_params = get_params,
    .gpt_backward_dev = backward_dev,
    .gpt_optim_init = optim_init,
    .gpt_optim_step = optim_step,
    .gpt_optim_state = optim_state,
    .gpt_bind_params = bind_params,
    .gpt_state_dev = state_dev,
    .cls_create = fake_cls_create,
    .cls_free = fake_cls_free,
    .cls_upload = fake_cls_upload,
    .cls_forward = fake_cls_forward,
    .cls_get_buffers = fake_cls_get_buffers,
    .cls_backward = fake_cls_backward,
    .cls_dev_info = fake_cls_dev_info,
    .cls_get_params = fake_cls_get_params,
    .cls_backward_dev = fake_cls_backward_dev,
    .cls_optim_init = fake_cls_optim_init,
    .cls_optim_step = fake_cls_optim_step,
    .cls_optim_state = fake_cls_optim_state,
    .cls_bind_params = fake_cls_bind_params,
    .cls_state_dev = fake_cls_state_dev,
    .gpt_optim_keep = optim_keep,
    .cls_optim_keep = fake_cls_optim_keep,
};

EXPORT const ddp__gpu_api *ddp_gpu_module_entry(void)
{
    return &table;
}

/* The CPU model compiled in here refers to the device layer of libddp (kernels/gpu.c), which this
 * module does not have: its GPT is built for the CPU, so none of these is ever reached. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define NOT_HERE(...)                                                                              \
    {                                                                                              \
        return DDP_ERR_NOT_FOUND;                                                                  \
    }
/* One stub a line: clang-format takes NOT_HERE() for part of the next declaration. */
// clang-format off
ddp_status ddp__cuda_device_count(int *n, ddp_error *err) NOT_HERE()
ddp_status ddp__cuda_mem_info(int idx, size_t *u, size_t *t, ddp_error *err) NOT_HERE()
ddp_status ddp__cuda_device_name(int idx, char *n, size_t cap, ddp_error *err) NOT_HERE()
ddp_status ddp__cuda_gpt_create(const ddp__cuda_gpt_cfg *c, const size_t *k, size_t n, ddp__cuda_gpt **o, ddp_error *e) NOT_HERE()
void ddp__cuda_gpt_free(ddp__cuda_gpt *g) {}
ddp_status ddp__cuda_gpt_set_params(ddp__cuda_gpt *g, const float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_forward(ddp__cuda_gpt *g, const int32_t *t, const int32_t *y, int n, int T, bool tr, bool l, float s, uint64_t st, uint64_t so, double *ls, int *c, int64_t *k, float *lg, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_backward(ddp__cuda_gpt *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_forward_cached(ddp__cuda_gpt *g, const int32_t *t, int T, int p, float *lg, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_dev_info(ddp__cuda_gpt *g, float **p, void **s, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_get_params(ddp__cuda_gpt *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_backward_dev(ddp__cuda_gpt *g, float *const *d, ddp_status (*r)(void *, size_t), void *c, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_init(ddp__cuda_gpt *g, int n, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *h, bool t, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_bind_params(ddp__cuda_gpt *g, float *const *p, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_state_dev(ddp__cuda_gpt *g, int s, float **d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_create(const ddp__cuda_cls_cfg *c, const size_t *k, size_t n, const size_t *bk, size_t nb, ddp__cuda_cls **o, ddp_error *e) NOT_HERE()
void ddp__cuda_cls_free(ddp__cuda_cls *g) {}
ddp_status ddp__cuda_cls_upload(ddp__cuda_cls *g, const float *const *p, const float *const *b, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *l, int64_t *c, float *lg, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_get_buffers(ddp__cuda_cls *g, float *const *b, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_backward(ddp__cuda_cls *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_dev_info(ddp__cuda_cls *g, float **p, float **b, void **s, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_get_params(ddp__cuda_cls *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_backward_dev(ddp__cuda_cls *g, float *const *d, ddp_status (*r)(void *, size_t), void *c, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_init(ddp__cuda_cls *g, int n, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_state(ddp__cuda_cls *g, int s, float *const *h, bool t, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_bind_params(ddp__cuda_cls *g, float *const *p, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_state_dev(ddp__cuda_cls *g, int s, float **d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_keep(ddp__cuda_gpt *g, const size_t *l, const size_t *h, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_keep(ddp__cuda_cls *g, const size_t *l, const size_t *h, ddp_error *e) NOT_HERE()
    // clang-format on
