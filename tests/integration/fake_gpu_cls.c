/*
 * fake_gpu_cls.c — the fake GPU module's MLP and CNN (kernels.h's ddp__cuda_cls_*, the table in
 * fake_gpu_gpt.c): the "device model" is the CPU classifier (src/nn/classifier.c, compiled into
 * this module), rebuilt from the layer list the host sends, and "device memory" is host memory.
 * With DDP_GPU_MODULE pointing at the module, `ddptrain --device cuda` trains an MLP or CNN
 * through classifier.c's cuda path — parameters and buffers uploaded each forward, running
 * statistics brought back, gradients added into the host's — on a machine without a GPU
 * (tests/integration/test_cls_fake.sh). It shows the host side, not cuDNN or the kernels (those
 * are test_cuda_classifier's, on a GPU). Precision bf16 is computed as the CPU computes it (the
 * model built in bf16: what the CUDA classifier's bf16 is held against), and refused as the CPU
 * refuses it where it has no bf16 units; fp16 and tf32 in fp32 (fp16's loss scale arrives as the
 * batch's grad_scale, as on a GPU, and the host's GradScaler unscales what backward returns).
 * DDP_TEST_FAKE_GPU_INF_AT=k (and _RANK, as fake_gpu_gpt.c's) makes the process's k-th backward
 * here add an inf to the first gradient, as an fp16 overflow on the GPU would.
 * Device-resident training (cls_dev_info …, with DDP_TEST_FAKE_GPU_OPEN=1 as fake_gpu_gpt.c's):
 * the CPU model's parameters and gradients live in two flat "device" buffers, as classifier.cu
 * has them; backward_dev binds its gradients to the caller's for the call and passes each ready
 * on as the CPU model reports it; the optimizer is ddp_optim_step_range's arithmetic on state
 * buffers laid out like the parameters (fake_gpu_resident.c, the GPT's too); the buffers (running
 * statistics) are the CPU model's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/model.h"
#include "ddp/nn.h"
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"

#include "fake_gpu_cls.h"
#include "fake_gpu_resident.h"

struct ddp__cuda_cls {
    fake_res r; /* the CPU model on the "device" flat buffers, as classifier.cu has them */
    size_t nb;
    int classes;
    int64_t channels[64], hidden[64];
};

static ddp_status fail(ddp_error *err, ddp_status st, const char *msg)
{
    return fake_res_fail(err, st, "fake gpu classifier", msg);
}

void fake_cls_free(ddp__cuda_cls *g)
{
    if (!g)
        return;
    ddp_model_free(g->r.m);
    fake_res_free(&g->r);
    free(g);
}

/* The spec that gives this layer list: conv stages' channels, the hidden linear layers (all but
 * the last), the activation and dropout seen, the input's shape from the first conv. */
ddp_status fake_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                           const size_t *bcounts, size_t nb, ddp__cuda_cls **out, ddp_error *err)
{
    ddp__cuda_cls *g = calloc(1, sizeof *g);
    if (!g)
        return fail(err, DDP_ERR_NOMEM, "out of memory");
    g->r.name = "fake gpu classifier";
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "mlp";
    s.in_ch = 1, s.in_h = 1, s.in_w = (int)cfg->in_n;
    size_t nc = 0, nh = 0;
    int last_out = 0;
    for (int i = 0; i < cfg->nl && nc < 64 && nh < 64; i++) {
        const ddp__cuda_cls_layer *l = &cfg->layers[i];
        if (l->kind == DDP__CLS_CONV) {
            if (nc == 0)
                s.in_ch = l->in_ch, s.in_h = l->h, s.in_w = l->w;
            s.type = "cnn";
            g->channels[nc++] = l->out_ch;
        } else if (l->kind == DDP__CLS_LINEAR) {
            if (last_out)
                g->hidden[nh++] = last_out;
            last_out = l->out;
        } else if (l->kind == DDP__CLS_GELU) {
            s.activation = "gelu";
        } else if (l->kind == DDP__CLS_DROPOUT) {
            s.dropout = l->p;
        }
    }
    s.channels = g->channels;
    s.n_channels = nc;
    s.hidden = g->hidden;
    s.n_hidden = nh;
    s.classes = cfg->classes;
    s.max_batch = cfg->B;
    s.seed = cfg->seed;
    s.precision = cfg->precision == DDP_PRECISION_BF16 ? DDP_PRECISION_BF16 : DDP_PRECISION_FP32;
    g->classes = cfg->classes;
    ddp_status st = ddp_model_build(&s, &g->r.m, err);
    if (st) {
        fake_cls_free(g);
        return st;
    }
    size_t n1, n2;
    const ddp_model_param *p = ddp_model_params(g->r.m, &n1), *b = ddp_model_buffers(g->r.m, &n2);
    bool same = n1 == np && n2 == nb;
    for (size_t i = 0; same && i < np; i++)
        same = p[i].count == counts[i];
    for (size_t j = 0; same && j < nb; j++)
        same = b[j].count == bcounts[j];
    if (!same) {
        fake_cls_free(g);
        return fail(err, DDP_ERR_INVALID, "the layer list does not rebuild the model's lists");
    }
    g->nb = nb;
    if ((st = fake_res_init(&g->r, g->r.m, counts, np, err))) {
        fake_cls_free(g);
        return st;
    }
    *out = g;
    return DDP_OK;
}

ddp_status fake_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                           const float *const *buffers_host, ddp_error *err)
{
    (void)err;
    size_t n;
    const ddp_model_param *p = ddp_model_params(g->r.m, &n), *b = ddp_model_buffers(g->r.m, &n);
    for (size_t i = 0; i < g->r.np; i++)
        memcpy(p[i].data, params_host[i], p[i].count * sizeof(float));
    for (size_t j = 0; j < g->nb; j++)
        memcpy(b[j].data, buffers_host[j], b[j].count * sizeof(float));
    return DDP_OK;
}

ddp_status fake_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                            int64_t *correct, float *logits_host, ddp_error *err)
{
    ddp_model_batch mb = {.n = b->n,
                          .x = b->x,
                          .labels = b->labels,
                          .grad_scale = b->grad_scale,
                          .step = b->step,
                          .sample_offset = b->sample_offset,
                          .sample_stride = b->sample_stride};
    ddp_model_out o = {0};
    if (ddp_model_forward(g->r.m, &mb, b->train, &o) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->r.m));
    size_t rows, cols;
    const float *l = ddp_model_logits(g->r.m, &rows, &cols);
    memcpy(logits_host, l, rows * cols * sizeof(float));
    if (b->labels) {
        *loss_sum = o.loss * (double)o.count;
        *correct = o.correct;
    }
    return DDP_OK;
}

ddp_status fake_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err)
{
    (void)err;
    size_t n;
    const ddp_model_param *b = ddp_model_buffers(g->r.m, &n);
    for (size_t j = 0; j < g->nb; j++)
        memcpy(buffers_host[j], b[j].data, b[j].count * sizeof(float));
    return DDP_OK;
}

static int backwards; /* this process's, for DDP_TEST_FAKE_GPU_INF_AT */

ddp_status fake_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err)
{
    ddp_model_zero_grad(g->r.m);
    if (ddp_model_backward(g->r.m, NULL, NULL) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->r.m));
    size_t n;
    const ddp_model_param *p = ddp_model_params(g->r.m, &n);
    if (fake_res_inject_inf(&backwards) && g->r.np > 0 && p[0].count > 0)
        p[0].grad[0] = INFINITY;
    for (size_t i = 0; i < g->r.np; i++)
        for (size_t k = 0; k < p[i].count; k++)
            grads_host[i][k] += p[i].grad[k];
    return DDP_OK;
}

/* ---- device-resident training (classifier.cu's contract, on the host) ------------------------ */

ddp_status fake_cls_dev_info(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                             void **stream, ddp_error *err)
{
    (void)err;
    size_t n;
    const ddp_model_param *b = ddp_model_buffers(g->r.m, &n);
    for (size_t i = 0; params_dev && i < g->r.np; i++)
        params_dev[i] = fake_res_param(&g->r, i);
    for (size_t j = 0; buffers_dev && j < g->nb; j++)
        buffers_dev[j] = b[j].data;
    if (stream)
        *stream = NULL;
    return DDP_OK;
}

ddp_status fake_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->r.np; i++)
        memcpy(params_host[i], fake_res_param(&g->r, i), g->r.counts[i] * sizeof(float));
    return DDP_OK;
}

/* Straight into the caller's gradients (the CPU model's bound there for the call). */
ddp_status fake_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                 ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                 ddp_error *err)
{
    for (size_t i = 0; i < g->r.np; i++)
        ddp_model_bind(g->r.m, i, NULL, grads_dev[i]);
    fake_marks k = {ready, ctx, g->r.np ? grads_dev[0] : NULL,
                    fake_res_inject_inf(&backwards) && g->r.np > 0};
    ddp_status st = ddp_model_backward(g->r.m, fake_res_pass_ready, &k);
    for (size_t i = 0; i < g->r.np; i++)
        ddp_model_bind(g->r.m, i, NULL, g->r.grads + g->r.offsets[i]);
    return st ? fail(err, st, ddp_model_last_error(g->r.m)) : DDP_OK;
}

ddp_status fake_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err)
{
    return fake_res_optim_init(&g->r, nstates, err);
}

ddp_status fake_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    return fake_res_optim_step(&g->r, a, err);
}

ddp_status fake_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                ddp_error *err)
{
    return fake_res_optim_state(&g->r, s, host, to_host, err);
}

ddp_status fake_cls_bind_params(ddp__cuda_cls *g, float *const *pd, ddp_error *err)
{
    return fake_res_bind_params(&g->r, pd, err);
}

ddp_status fake_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err)
{
    return fake_res_state_dev(&g->r, s, dev, err);
}

ddp_status fake_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi, ddp_error *err)
{
    return fake_res_optim_keep(&g->r, lo, hi, err);
}
