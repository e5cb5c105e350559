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
 * buffers laid out like the parameters; the buffers (running statistics) are the CPU model's.
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

struct ddp__cuda_cls {
    ddp_model *m;
    size_t np, nb;
    int classes;
    int64_t channels[64], hidden[64];
    size_t total;             /* floats in the flat buffers */
    size_t *counts, *offsets; /* (np,) */
    float *params, *grads;    /* (total,) the "device" flat buffers the CPU model is bound to */
    float *state[2];          /* the optimizer's, laid out like params */
    int nstates;
    float *tmp;    /* (largest count,) a scaled gradient */
    float **bound; /* bind_params's arrays, or NULL: the flat buffer's */
};

/* Parameter i's values: in the flat buffer, or where bind_params put them. */
static float *param_of(const ddp__cuda_cls *g, size_t i)
{
    return g->bound ? g->bound[i] : g->params + g->offsets[i];
}

static ddp_status fail(ddp_error *err, ddp_status st, const char *msg)
{
    if (err) {
        snprintf(err->msg, sizeof err->msg, "fake gpu classifier: %s", msg);
        err->status = st;
    }
    return st;
}

void fake_cls_free(ddp__cuda_cls *g)
{
    if (!g)
        return;
    ddp_model_free(g->m);
    free(g->counts);
    free(g->offsets);
    free(g->params);
    free(g->grads);
    free(g->state[0]);
    free(g->state[1]);
    free(g->tmp);
    free(g->bound);
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
    ddp_status st = ddp_model_build(&s, &g->m, err);
    if (st) {
        fake_cls_free(g);
        return st;
    }
    size_t n1, n2;
    const ddp_model_param *p = ddp_model_params(g->m, &n1), *b = ddp_model_buffers(g->m, &n2);
    bool same = n1 == np && n2 == nb;
    for (size_t i = 0; same && i < np; i++)
        same = p[i].count == counts[i];
    for (size_t j = 0; same && j < nb; j++)
        same = b[j].count == bcounts[j];
    if (!same) {
        fake_cls_free(g);
        return fail(err, DDP_ERR_INVALID, "the layer list does not rebuild the model's lists");
    }
    g->np = np;
    g->nb = nb;
    g->counts = calloc(np ? np : 1, sizeof(size_t));
    g->offsets = calloc(np ? np : 1, sizeof(size_t));
    size_t most = 1;
    for (size_t i = 0; g->counts && g->offsets && i < np; i++) {
        g->counts[i] = counts[i];
        g->offsets[i] = g->total;
        g->total += counts[i];
        most = counts[i] > most ? counts[i] : most;
    }
    if (!g->counts || !g->offsets || !(g->params = calloc(g->total + 1, sizeof(float))) ||
        !(g->grads = calloc(g->total + 1, sizeof(float))) ||
        !(g->tmp = malloc(most * sizeof(float)))) {
        fake_cls_free(g);
        return fail(err, DDP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < np; i++) { /* the values move into the flat buffer */
        memcpy(g->params + g->offsets[i], p[i].data, counts[i] * sizeof(float));
        ddp_model_bind(g->m, i, g->params + g->offsets[i], g->grads + g->offsets[i]);
    }
    *out = g;
    return DDP_OK;
}

ddp_status fake_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                           const float *const *buffers_host, ddp_error *err)
{
    (void)err;
    size_t n;
    const ddp_model_param *p = ddp_model_params(g->m, &n), *b = ddp_model_buffers(g->m, &n);
    for (size_t i = 0; i < g->np; i++)
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
                          .sample_offset = b->sample_offset};
    ddp_model_out o = {0};
    if (ddp_model_forward(g->m, &mb, b->train, &o) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->m));
    size_t rows, cols;
    const float *l = ddp_model_logits(g->m, &rows, &cols);
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
    const ddp_model_param *b = ddp_model_buffers(g->m, &n);
    for (size_t j = 0; j < g->nb; j++)
        memcpy(buffers_host[j], b[j].data, b[j].count * sizeof(float));
    return DDP_OK;
}

static int backwards; /* this process's, for DDP_TEST_FAKE_GPU_INF_AT */

/* Whether this backward (the process's backwards-th) is the one to overflow. */
static bool inject_inf(void)
{
    const char *at = getenv("DDP_TEST_FAKE_GPU_INF_AT"),
               *who = getenv("DDP_TEST_FAKE_GPU_INF_RANK");
    const char *rank = getenv("RANK");
    return at && atoi(at) == ++backwards && atoi(who ? who : "0") == atoi(rank ? rank : "0");
}

ddp_status fake_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err)
{
    ddp_model_zero_grad(g->m);
    if (ddp_model_backward(g->m, NULL, NULL) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->m));
    size_t n;
    const ddp_model_param *p = ddp_model_params(g->m, &n);
    if (inject_inf() && g->np > 0 && p[0].count > 0)
        p[0].grad[0] = INFINITY;
    for (size_t i = 0; i < g->np; i++)
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
    const ddp_model_param *b = ddp_model_buffers(g->m, &n);
    for (size_t i = 0; params_dev && i < g->np; i++)
        params_dev[i] = param_of(g, i);
    for (size_t j = 0; buffers_dev && j < g->nb; j++)
        buffers_dev[j] = b[j].data;
    if (stream)
        *stream = NULL;
    return DDP_OK;
}

ddp_status fake_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->np; i++)
        memcpy(params_host[i], param_of(g, i), g->counts[i] * sizeof(float));
    return DDP_OK;
}

typedef struct marks {
    ddp_status (*ready)(void *ctx, size_t i);
    void *ctx;
    float *first; /* parameter 0's gradient, where an injected inf goes */
    bool inf;
} marks;

/* The CPU model's ready, passed on (parameter 0, the first layer's weight, comes second last). */
static ddp_status pass_ready(void *ctx, size_t i)
{
    marks *k = ctx;
    if (i == 0 && k->inf)
        k->first[0] += INFINITY;
    return k->ready ? k->ready(k->ctx, i) : DDP_OK;
}

/* Straight into the caller's gradients (the CPU model's bound there for the call). */
ddp_status fake_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                 ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                 ddp_error *err)
{
    for (size_t i = 0; i < g->np; i++)
        ddp_model_bind(g->m, i, NULL, grads_dev[i]);
    marks k = {ready, ctx, g->np ? grads_dev[0] : NULL, inject_inf() && g->np > 0};
    ddp_status st = ddp_model_backward(g->m, pass_ready, &k);
    for (size_t i = 0; i < g->np; i++)
        ddp_model_bind(g->m, i, NULL, g->grads + g->offsets[i]);
    return st ? fail(err, st, ddp_model_last_error(g->m)) : DDP_OK;
}

ddp_status fake_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err)
{
    if (nstates < 1 || nstates > 2)
        return fail(err, DDP_ERR_INVALID, "optimizer states: 1 or 2");
    for (int s = 0; s < nstates; s++) {
        free(g->state[s]);
        if (!(g->state[s] = calloc(g->total + 1, sizeof(float))))
            return fail(err, DDP_ERR_NOMEM, "out of memory");
    }
    g->nstates = nstates;
    return DDP_OK;
}

/* ddp_optim_step_range's arithmetic: the gradient scaled first (here into a copy). */
ddp_status fake_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    if (a->i >= g->np || a->lo > a->hi || a->hi > g->counts[a->i] ||
        g->nstates < (a->adamw ? 2 : 1))
        return fail(err, DDP_ERR_INVALID, "bad optimizer step");
    size_t off = g->offsets[a->i] + a->lo, n = a->hi - a->lo;
    const float *gr = a->grad_dev + a->lo;
    if (a->grad_scale != 1.0f) {
        for (size_t k = 0; k < n; k++)
            g->tmp[k] = gr[k] * a->grad_scale;
        gr = g->tmp;
    }
    float *p = param_of(g, a->i) + a->lo;
    if (a->adamw)
        ddp_nn_adamw_step(p, gr, g->state[0] + off, g->state[1] + off, n, a->lr, a->beta1, a->beta2,
                          a->eps, a->weight_decay, a->step);
    else
        ddp_nn_sgd_step(p, gr, g->state[0] + off, n, a->lr, a->momentum, a->weight_decay, a->step);
    return DDP_OK;
}

ddp_status fake_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                ddp_error *err)
{
    if (s < 0 || s >= g->nstates)
        return fail(err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < g->np; i++) {
        float *dev = g->state[s] + g->offsets[i];
        size_t bytes = g->counts[i] * sizeof(float);
        memcpy(to_host ? host[i] : dev, to_host ? dev : host[i], bytes);
    }
    return DDP_OK;
}

/* classifier.cu's: the CPU model's values move to the given arrays (or back into the flat
 * buffer). */
ddp_status fake_cls_bind_params(ddp__cuda_cls *g, float *const *pd, ddp_error *err)
{
    if (!pd) {
        for (size_t i = 0; g->bound && i < g->np; i++)
            memcpy(g->params + g->offsets[i], g->bound[i], g->counts[i] * sizeof(float));
        free(g->bound);
        g->bound = NULL;
    } else {
        if (!g->bound && !(g->bound = calloc(g->np ? g->np : 1, sizeof(float *))))
            return fail(err, DDP_ERR_NOMEM, "out of memory");
        memcpy(g->bound, pd, g->np * sizeof(float *));
    }
    for (size_t i = 0; i < g->np; i++)
        ddp_model_bind(g->m, i, param_of(g, i), NULL);
    return DDP_OK;
}

ddp_status fake_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err)
{
    if (s < 0 || s >= g->nstates)
        return fail(err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < g->np; i++)
        dev[i] = g->state[s] + g->offsets[i];
    return DDP_OK;
}
