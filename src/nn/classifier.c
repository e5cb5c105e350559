/*
 * classifier.c — the "mlp" and "cnn" model types of ddp/model.h: image classifiers built as a
 * list of layers from ddp/nn.h, with softmax cross-entropy fused into forward.
 *
 * Each layer keeps its output for backward; gradients flow down through two ping-pong buffers
 * of the widest activation. Parameters are registered in forward order, so a reducer buckets
 * them from the last layer down, the order backward finishes them in. The two types differ only
 * in what build puts in front of the fully connected layers; forward, backward and the rest are
 * shared. No state outside the model, no threads of its own.
 *
 * Device cuda (spec.device): the same layer list runs on the GPU (kernels/cuda/classifier.cu,
 * through kernels.h), in every precision (fp32, tf32; bf16 and fp16 with 16-bit operands in the
 * linear layers and convolutions, fp32 masters and gradients: the CPU's bf16 is the reference,
 * fp16's loss scale comes in as the batch's grad_scale), dropout included; this file keeps the
 * parameter list, the running statistics (buffers), the checks and the host's logits. Each forward
 * uploads the parameters and buffers (the optimizer, the reducer and a checkpoint's load change
 * them on the host), a training forward brings the updated running statistics back, and backward
 * adds the gradients into the host's. Device-resident training (ddp_model_resident, the end of
 * this file) keeps the parameters, running statistics, gradients and optimizer state on the
 * device instead: nothing goes up or down per step, and the host's arrays serve checkpoints
 * (ddp_model_sync_host/_device). Not yet run on a GPU (docs/gpu.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/nn.h"
#include "ddp/optim.h"
#include "nn/model_int.h"

#define BN_MOMENTUM 0.1f /* torch's BatchNorm2d defaults */
#define BN_EPS 1e-5f

typedef enum { L_LINEAR, L_RELU, L_GELU, L_DROPOUT, L_CONV, L_BN, L_POOL } lkind;

typedef struct layer {
    lkind kind;
    size_t in_n, out_n; /* floats per sample in and out */
    int p0, np;         /* its parameters: indices p0 … p0+np−1 of the model's list */
    int fan_in, out;    /* linear: in, out */
    ddp_nn_conv2d conv;
    ddp_nn_pool2d pool;
    int C, hw;       /* batchnorm: channels and pixels per channel */
    int buf0;        /* batchnorm: its running mean is buffer buf0, its running var buf0 + 1 */
    float p;         /* dropout */
    float *y;        /* (B, out_n) output */
    float *aux;      /* batchnorm: save_mean (C), save_invstd (C) */
    int32_t *argmax; /* maxpool (B, out_n) */
    uint8_t *mask;   /* dropout (B, out_n) */
} layer;

typedef struct classifier {
    layer *L; /* (nl,) in forward order */
    int nl, cap;
    int B;       /* largest batch the buffers hold */
    size_t in_n; /* floats per input sample */
    int classes;
    uint64_t seed;  /* dropout masks */
    float *scratch; /* conv im2col, the largest any conv layer needs */
    float *g0, *g1; /* (B, widest) gradient ping-pong */
    float *dlogits; /* (B, classes) d loss / d logits of the last training forward */
    const float *x; /* the last forward's input (n, in_n), borrowed */
    int n;          /* the last forward's batch */
    bool train;     /* the last forward's mode */
    /* device cuda: the device's model and the host arrays handed to it (resident.c), the host's
     * logits (B, classes) of the last forward */
    ddp__resident res;
    float *logits_host;
} classifier;

static layer *add(classifier *c, lkind k, size_t in_n, size_t out_n, ddp_error *err)
{
    if (c->nl == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        layer *L = realloc(c->L, sizeof *L * (size_t)cap);
        if (!L) {
            ddp__err(err, DDP_ERR_NOMEM, "out of memory for the model's layers");
            return NULL;
        }
        c->L = L;
        c->cap = cap;
    }
    layer *l = &c->L[c->nl++];
    memset(l, 0, sizeof *l);
    l->kind = k;
    l->in_n = in_n;
    l->out_n = out_n;
    l->p0 = -1;
    return l;
}

/* Registers parameter `name` of shape for layer index li (its first one sets p0). */
static ddp_status add_param(ddp_model *m, int li, const char *name, int ndim, const int64_t *shape,
                            ddp_error *err)
{
    classifier *c = m->impl;
    int idx = (int)m->n_params;
    ddp_status st = ddp__model_add_param(m, name, ndim, shape, true, err);
    if (st != DDP_OK)
        return st;
    layer *l = &c->L[li];
    if (l->p0 < 0)
        l->p0 = idx;
    l->np++;
    return DDP_OK;
}

static ddp_status add_linear(ddp_model *m, size_t in, size_t out, int idx, ddp_error *err)
{
    classifier *c = m->impl;
    layer *l = add(c, L_LINEAR, in, out, err);
    if (!l)
        return DDP_ERR_NOMEM;
    l->fan_in = (int)in;
    l->out = (int)out;
    int li = c->nl - 1;
    char name[64];
    ddp_status st;
    snprintf(name, sizeof name, "fc%d.weight", idx);
    if ((st = add_param(m, li, name, 2, (const int64_t[]){(int64_t)out, (int64_t)in}, err)))
        return st;
    snprintf(name, sizeof name, "fc%d.bias", idx);
    if ((st = add_param(m, li, name, 1, (const int64_t[]){(int64_t)out}, err)))
        return st;
    int p0 = c->L[li].p0;
    ddp_nn_init_kaiming_uniform(m->params[p0].data, in * out, in, c->seed, (uint64_t)p0);
    ddp_nn_init_kaiming_uniform(m->params[p0 + 1].data, out, in, c->seed, (uint64_t)p0 + 1);
    return DDP_OK;
}

/* One cnn stage: conv 3×3 pad 1 → batchnorm → activation → maxpool 2. (*ch, *h, *w) and *n
 * (floats per sample) move from the stage's input to its output. */
static ddp_status add_conv_stage(ddp_model *m, size_t s, int out_ch, lkind act, int *ch, int *h,
                                 int *w, size_t *n, ddp_error *err)
{
    classifier *c = m->impl;
    ddp_status st;
    if (out_ch < 1 || *h < 2 || *w < 2)
        return ddp__err(err, DDP_ERR_INVALID,
                        "model channels: stage %zu cannot shrink a %d × %d image further (or has "
                        "no channels); use fewer stages",
                        s + 1, *h, *w);
    layer *cv = add(c, L_CONV, *n, 0, err);
    if (!cv)
        return DDP_ERR_NOMEM;
    int li = c->nl - 1;
    cv->conv = (ddp_nn_conv2d){
        .in_ch = *ch, .h = *h, .w = *w, .out_ch = out_ch, .kh = 3, .kw = 3, .stride = 1, .pad = 1};
    if ((st = ddp_nn_conv2d_setup(&cv->conv, err)))
        return st;
    cv->out_n = (size_t)cv->conv.out_ch * (size_t)cv->conv.out_h * (size_t)cv->conv.out_w;
    char name[64];
    snprintf(name, sizeof name, "conv%zu.weight", s + 1);
    if ((st = add_param(m, li, name, 4, (const int64_t[]){out_ch, *ch, 3, 3}, err)))
        return st;
    snprintf(name, sizeof name, "conv%zu.bias", s + 1);
    if ((st = add_param(m, li, name, 1, (const int64_t[]){out_ch}, err)))
        return st;
    int p0 = c->L[li].p0;
    ddp_nn_init_kaiming_uniform(m->params[p0].data, m->params[p0].count, (size_t)*ch * 9, c->seed,
                                (uint64_t)p0);
    ddp_nn_init_kaiming_uniform(m->params[p0 + 1].data, m->params[p0 + 1].count, (size_t)*ch * 9,
                                c->seed, (uint64_t)p0 + 1);
    *n = c->L[li].out_n;
    *ch = out_ch;
    layer *bn = add(c, L_BN, *n, *n, err);
    if (!bn)
        return DDP_ERR_NOMEM;
    li = c->nl - 1;
    bn->C = *ch;
    bn->hw = *h * *w;
    bn->buf0 = (int)m->n_buffers;
    snprintf(name, sizeof name, "bn%zu.weight", s + 1);
    if ((st = add_param(m, li, name, 1, (const int64_t[]){*ch}, err)))
        return st;
    float *gamma = m->params[c->L[li].p0].data;
    for (int k = 0; k < *ch; k++)
        gamma[k] = 1.0f;
    snprintf(name, sizeof name, "bn%zu.bias", s + 1);
    if ((st = add_param(m, li, name, 1, (const int64_t[]){*ch}, err)))
        return st;
    snprintf(name, sizeof name, "bn%zu.running_mean", s + 1);
    if ((st = ddp__model_add_buffer(m, name, (size_t)*ch, 0.0f, err)))
        return st;
    snprintf(name, sizeof name, "bn%zu.running_var", s + 1);
    if ((st = ddp__model_add_buffer(m, name, (size_t)*ch, 1.0f, err)))
        return st;
    if (!add(c, act, *n, *n, err))
        return DDP_ERR_NOMEM;
    layer *p = add(c, L_POOL, *n, 0, err);
    if (!p)
        return DDP_ERR_NOMEM;
    p->pool = (ddp_nn_pool2d){.ch = *ch, .h = *h, .w = *w, .kernel = 2, .stride = 2};
    if ((st = ddp_nn_maxpool2d_setup(&p->pool, err)))
        return st;
    *h = p->pool.out_h;
    *w = p->pool.out_w;
    *n = p->out_n = (size_t)*ch * (size_t)*h * (size_t)*w;
    return DDP_OK;
}

/* Activations, argmax, masks and gradient buffers for B samples. */
static ddp_status alloc_buffers(classifier *c, ddp_error *err)
{
    size_t B = (size_t)c->B, widest = c->in_n, scratch = 0;
    for (int i = 0; i < c->nl; i++) {
        layer *l = &c->L[i];
        if (l->out_n > widest)
            widest = l->out_n;
        if (l->kind == L_CONV && l->conv.scratch_floats > scratch)
            scratch = l->conv.scratch_floats;
        if (!(l->y = malloc(sizeof(float) * B * l->out_n)) ||
            (l->kind == L_POOL && !(l->argmax = malloc(sizeof(int32_t) * B * l->out_n))) ||
            (l->kind == L_DROPOUT && !(l->mask = malloc(B * l->out_n))) ||
            (l->kind == L_BN && !(l->aux = malloc(sizeof(float) * 2 * (size_t)l->C))))
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory for activations (batch %zu)", B);
    }
    c->g0 = malloc(sizeof(float) * B * widest);
    c->g1 = malloc(sizeof(float) * B * widest);
    c->dlogits = malloc(sizeof(float) * B * (size_t)c->classes);
    c->scratch = scratch ? malloc(sizeof(float) * scratch) : NULL;
    if (!c->g0 || !c->g1 || !c->dlogits || (scratch && !c->scratch))
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for gradients (batch %zu)", B);
    return DDP_OK;
}

/* Device cuda: the layer list handed to the device's model (kernels.h's ddp__cuda_cls_layer). */
static void cuda_layer(const layer *l, ddp__cuda_cls_layer *d)
{
    static const int kinds[] = {
        [L_LINEAR] = DDP__CLS_LINEAR,   [L_RELU] = DDP__CLS_RELU, [L_GELU] = DDP__CLS_GELU,
        [L_DROPOUT] = DDP__CLS_DROPOUT, [L_CONV] = DDP__CLS_CONV, [L_BN] = DDP__CLS_BN,
        [L_POOL] = DDP__CLS_POOL};
    memset(d, 0, sizeof *d);
    d->kind = kinds[l->kind];
    d->in_n = l->in_n;
    d->out_n = l->out_n;
    d->p0 = l->p0;
    d->buf0 = l->kind == L_BN ? l->buf0 : -1;
    d->in = l->fan_in;
    d->out = l->out;
    if (l->kind == L_CONV) {
        const ddp_nn_conv2d *cv = &l->conv;
        d->in_ch = cv->in_ch, d->h = cv->h, d->w = cv->w, d->out_ch = cv->out_ch;
        d->kh = cv->kh, d->kw = cv->kw, d->stride = cv->stride, d->pad = cv->pad;
        d->out_h = cv->out_h, d->out_w = cv->out_w;
    } else if (l->kind == L_POOL) {
        const ddp_nn_pool2d *pl = &l->pool;
        d->in_ch = pl->ch, d->h = pl->h, d->w = pl->w, d->kh = d->kw = pl->kernel;
        d->stride = pl->stride, d->out_h = pl->out_h, d->out_w = pl->out_w;
    }
    d->C = l->C;
    d->hw = l->hw;
    d->p = l->p;
}

/* Device cuda: the device's model (parameters, buffers, activations) and the host's logits, in
 * spec's precision (any: ddp_model_build has checked it against the device). */
static ddp_status build_cuda(ddp_model *m, const ddp_model_spec *spec, ddp_error *err)
{
    classifier *c = m->impl;
    size_t np = m->n_params, nb = m->n_buffers;
    size_t *counts = malloc(sizeof(size_t) * (np ? np : 1));
    size_t *bcounts = malloc(sizeof(size_t) * (nb ? nb : 1));
    ddp__cuda_cls_layer *dl = malloc(sizeof *dl * (size_t)c->nl);
    c->res.pdata = malloc(sizeof *c->res.pdata * (np ? np : 1));
    c->res.pgrad = malloc(sizeof *c->res.pgrad * (np ? np : 1));
    c->res.bdata = malloc(sizeof *c->res.bdata * (nb ? nb : 1));
    c->res.bout = malloc(sizeof *c->res.bout * (nb ? nb : 1));
    c->logits_host = malloc(sizeof(float) * (size_t)c->B * (size_t)c->classes);
    ddp_status st = DDP_OK;
    if (!counts || !bcounts || !dl || !c->res.pdata || !c->res.pgrad || !c->res.bdata ||
        !c->res.bout || !c->logits_host) {
        st = ddp__err(err, DDP_ERR_NOMEM, "%s: out of memory for the device model's lists",
                      m->ops->name);
        goto out_free;
    }
    for (size_t i = 0; i < np; i++)
        counts[i] = m->params[i].count;
    for (size_t j = 0; j < nb; j++)
        bcounts[j] = m->buffers[j].count;
    for (int i = 0; i < c->nl; i++)
        cuda_layer(&c->L[i], &dl[i]);
    ddp__cuda_cls_cfg cfg = {
        .layers = dl,
        .nl = c->nl,
        .B = c->B,
        .in_n = c->in_n,
        .classes = c->classes,
        .seed = c->seed,
        .bn_momentum = BN_MOMENTUM,
        .bn_eps = BN_EPS,
        .device = spec->device_index,
        .precision = spec->precision,
    };
    st = ddp__cuda_cls_create(&cfg, counts, np, bcounts, nb, &c->res.cls, err);
    if (!st)
        st = ddp__resident_init(m, err);
out_free:
    free(counts);
    free(bcounts);
    free(dl);
    return st;
}

static ddp_status build(ddp_model *m, const ddp_model_spec *spec, bool conv, ddp_error *err)
{
    lkind act = L_RELU;
    if (spec->activation && !strcmp(spec->activation, "gelu"))
        act = L_GELU;
    else if (spec->activation && strcmp(spec->activation, "relu") != 0)
        return ddp__err(err, DDP_ERR_INVALID, "model activation '%s': use relu or gelu",
                        spec->activation);
    if (spec->in_ch < 1 || spec->in_h < 1 || spec->in_w < 1 || spec->classes < 1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "model input (%d, %d, %d) and classes %d: each must be ≥ 1", spec->in_ch,
                        spec->in_h, spec->in_w, spec->classes);
    if (!(spec->dropout >= 0 && spec->dropout <= 1))
        return ddp__err(err, DDP_ERR_INVALID, "model dropout %g: must be from 0 to 1",
                        (double)spec->dropout);
    classifier *c = calloc(1, sizeof *c);
    if (!c)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory building the model");
    m->impl = c;
    m->res = &c->res;
    c->B = spec->max_batch;
    c->in_n = (size_t)spec->in_ch * (size_t)spec->in_h * (size_t)spec->in_w;
    c->classes = spec->classes;
    c->seed = spec->seed;
    int ch = spec->in_ch, h = spec->in_h, w = spec->in_w;
    size_t n = c->in_n;
    ddp_status st;
    for (size_t s = 0; conv && s < spec->n_channels; s++) {
        int64_t oc = spec->channels[s];
        if ((st = add_conv_stage(m, s, oc > 0 && oc <= 1 << 20 ? (int)oc : 0, act, &ch, &h, &w, &n,
                                 err)))
            return st;
    }
    int fc = 1;
    for (size_t k = 0; k < spec->n_hidden; k++) {
        if (spec->hidden[k] < 1 || spec->hidden[k] > 1 << 24)
            return ddp__err(err, DDP_ERR_INVALID,
                            "model hidden[%zu] is %lld: sizes must be from 1 to 2^24", k,
                            (long long)spec->hidden[k]);
        if ((st = add_linear(m, n, (size_t)spec->hidden[k], fc++, err)))
            return st;
        n = (size_t)spec->hidden[k];
        if (!add(c, act, n, n, err))
            return DDP_ERR_NOMEM;
        if (spec->dropout > 0) {
            layer *d = add(c, L_DROPOUT, n, n, err);
            if (!d)
                return DDP_ERR_NOMEM;
            d->p = spec->dropout;
        }
    }
    if ((st = add_linear(m, n, (size_t)c->classes, fc, err)))
        return st;
    if (spec->device == DDP_DEVICE_CUDA)
        return build_cuda(m, spec, err);
    return alloc_buffers(c, err);
}

static ddp_status build_mlp(ddp_model *m, const ddp_model_spec *spec, ddp_error *err)
{
    return build(m, spec, false, err);
}

static ddp_status build_cnn(ddp_model *m, const ddp_model_spec *spec, ddp_error *err)
{
    return build(m, spec, true, err);
}

static void free_classifier(ddp_model *m)
{
    classifier *c = m->impl;
    if (!c)
        return;
    for (int i = 0; i < c->nl; i++) {
        free(c->L[i].y);
        free(c->L[i].aux);
        free(c->L[i].argmax);
        free(c->L[i].mask);
    }
    free(c->L);
    free(c->scratch);
    free(c->g0);
    free(c->g1);
    free(c->dlogits);
    ddp__cuda_cls_free(c->res.cls);
    free(c->logits_host);
    ddp__resident_free(&c->res);
    free(c);
    m->impl = NULL;
    m->res = NULL;
}

/* The forward on the device. What the CPU's layers would refuse is checked here first (labels
 * in range, batchnorm's two values per channel in training), so that a bad batch changes
 * nothing; then the parameters and buffers go up, and a training forward's running statistics
 * come back (device-resident: neither, they live there). */
static ddp_status forward_cuda(ddp_model *m, const ddp_model_batch *b, bool train,
                               ddp_model_out *out)
{
    classifier *c = m->impl;
    const int n = b->n;
    for (int r = 0; b->labels && r < n; r++)
        if (b->labels[r] < 0 || b->labels[r] >= c->classes)
            return ddp__errmsg(m->err, DDP_ERR_INVALID,
                               "cross-entropy: label %ld of row %d is outside [0, %d); check the "
                               "dataset's labels against the model's number of classes",
                               (long)b->labels[r], r, c->classes);
    for (int i = 0; train && i < c->nl; i++)
        if (c->L[i].kind == L_BN && (size_t)n * (size_t)c->L[i].hw < 2)
            return ddp__errmsg(m->err, DDP_ERR_INVALID,
                               "batchnorm in training mode needs at least 2 values per channel, "
                               "got %zu (batch %d × %d positions); use a larger batch or eval "
                               "mode",
                               (size_t)n * (size_t)c->L[i].hw, n, c->L[i].hw);
    for (size_t i = 0; i < m->n_params; i++)
        c->res.pdata[i] = m->params[i].data;
    for (size_t j = 0; j < m->n_buffers; j++) {
        c->res.bdata[j] = m->buffers[j].data;
        c->res.bout[j] = m->buffers[j].data;
    }
    ddp__cuda_cls_batch db = {
        .x = b->x,
        .labels = b->labels,
        .n = n,
        .train = train,
        .step = b->step,
        .sample_offset = b->sample_offset,
        .sample_stride = b->sample_stride,
        .grad_scale = b->grad_scale,
    };
    double loss_sum = 0;
    int64_t correct = 0;
    ddp_error e = {0};
    c->n = 0; /* no logits until this forward has them */
    if ((!m->resident &&
         ddp__cuda_cls_upload(c->res.cls, c->res.pdata, c->res.bdata, &e) != DDP_OK) ||
        ddp__cuda_cls_forward(c->res.cls, &db, &loss_sum, &correct, c->logits_host, &e) != DDP_OK ||
        (!m->resident && train && m->n_buffers > 0 &&
         ddp__cuda_cls_get_buffers(c->res.cls, c->res.bout, &e) != DDP_OK))
        return ddp__errmsg(m->err, e.status, "%s forward on cuda: %s", m->ops->name, e.msg);
    c->n = n;
    c->train = train;
    if (!b->labels)
        return DDP_OK;
    out->loss = loss_sum / n;
    out->correct = correct;
    out->count = n;
    return DDP_OK;
}

/* Dropout over n samples of l->out_n values: sample s's elements keyed from (sample_offset +
 * s · sample_stride) · out_n, one stream when the keys are contiguous. */
static void dropout_rows(layer *l, const float *a, int n, uint64_t seed, const ddp_model_batch *b,
                         bool train)
{
    const size_t per = l->out_n;
    if (b->sample_stride <= 1) {
        ddp_nn_dropout_forward(a, (size_t)n * per, l->p, seed, b->step, b->sample_offset * per,
                               train, l->mask, l->y);
        return;
    }
    for (int s = 0; s < n; s++)
        ddp_nn_dropout_forward(a + (size_t)s * per, per, l->p, seed, b->step,
                               (b->sample_offset + (uint64_t)s * b->sample_stride) * per, train,
                               l->mask + (size_t)s * per, l->y + (size_t)s * per);
}

static ddp_status forward(ddp_model *m, const ddp_model_batch *b, bool train, ddp_model_out *out)
{
    classifier *c = m->impl;
    ddp_error e = {0};
    int n = b->n;
    if (!b->x)
        return ddp__errmsg(m->err, DDP_ERR_INVALID, "forward: the batch has no inputs (x)");
    if (c->res.cls)
        return forward_cuda(m, b, train, out);
    c->x = b->x;
    c->n = n;
    c->train = train;
    const float *a = b->x;
    for (int i = 0; i < c->nl; i++) {
        layer *l = &c->L[i];
        float *P0 = l->p0 >= 0 ? m->params[l->p0].data : NULL;
        float *P1 = l->p0 >= 0 ? m->params[l->p0 + 1].data : NULL;
        switch (l->kind) {
        case L_LINEAR: ddp_nn_linear_forward(a, P0, P1, n, l->fan_in, l->out, l->y); break;
        case L_RELU: ddp_nn_relu_forward(a, (size_t)n * l->out_n, l->y); break;
        case L_GELU: ddp_nn_gelu_forward(a, (size_t)n * l->out_n, l->y); break;
        case L_DROPOUT: dropout_rows(l, a, n, c->seed + (uint64_t)i, b, train); break;
        case L_CONV: ddp_nn_conv2d_forward(&l->conv, a, P0, P1, n, c->scratch, l->y); break;
        case L_BN:
            if (ddp_nn_batchnorm_forward(a, n, l->C, l->hw, P0, P1, BN_MOMENTUM, BN_EPS, train,
                                         m->buffers[l->buf0].data, m->buffers[l->buf0 + 1].data,
                                         l->y, l->aux, l->aux + l->C, &e) != DDP_OK)
                return ddp__errmsg(m->err, e.status, "%s", e.msg);
            break;
        case L_POOL: ddp_nn_maxpool2d_forward(&l->pool, a, n, l->y, l->argmax); break;
        }
        a = l->y;
    }
    if (!b->labels)
        return DDP_OK;
    float scale = b->grad_scale != 0.0f ? b->grad_scale : 1.0f;
    double loss;
    int correct;
    if (ddp_nn_softmax_xent(a, b->labels, n, c->classes, scale, &loss, train ? c->dlogits : NULL,
                            &correct, &e) != DDP_OK)
        return ddp__errmsg(m->err, e.status, "%s", e.msg);
    out->loss = loss;
    out->correct = correct;
    out->count = n;
    return DDP_OK;
}

/* The backward on the device: the gradients are added into the host's, then reported ready in
 * the CPU's order (layers from the last, each layer's weight before its bias). */
static ddp_status backward_cuda(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    classifier *c = m->impl;
    ddp_error e = {0};
    if (m->resident)
        return ddp__resident_backward(m, ready, ctx);
    for (size_t i = 0; i < m->n_params; i++)
        c->res.pgrad[i] = m->params[i].grad;
    if (ddp__cuda_cls_backward(c->res.cls, c->res.pgrad, &e) != DDP_OK)
        return ddp__errmsg(m->err, e.status, "%s backward on cuda: %s", m->ops->name, e.msg);
    for (int i = c->nl - 1; i >= 0; i--)
        for (int k = 0; ready && k < c->L[i].np; k++) {
            size_t idx = (size_t)(c->L[i].p0 + k);
            ddp_status st = ready(ctx, idx);
            if (st != DDP_OK)
                return ddp__errmsg(m->err, st,
                                   "backward: the gradient-ready callback failed for '%s' (%s)",
                                   m->params[idx].name, ddp_status_str(st));
        }
    return DDP_OK;
}

static ddp_status backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    classifier *c = m->impl;
    if (c->res.cls)
        return backward_cuda(m, ready, ctx);
    int n = c->n;
    bool train = c->train;
    const float *dy = c->dlogits;
    for (int i = c->nl - 1; i >= 0; i--) {
        layer *l = &c->L[i];
        const float *in = i > 0 ? c->L[i - 1].y : c->x;
        float *dx = i > 0 ? (dy == c->g0 ? c->g1 : c->g0) : NULL; /* the input needs none */
        if (l->p0 >= 0) { /* a pooled backward: the gradients' memory first */
            ddp_status st = ddp__model_acquire(m, l->np, (const int[]){l->p0, l->p0 + 1});
            if (st != DDP_OK)
                return st;
        }
        float *P0 = l->p0 >= 0 ? m->params[l->p0].data : NULL;
        float *G0 = l->p0 >= 0 ? m->params[l->p0].grad : NULL;
        float *G1 = l->p0 >= 0 ? m->params[l->p0 + 1].grad : NULL;
        size_t cnt = (size_t)n * l->out_n;
        switch (l->kind) {
        case L_LINEAR: ddp_nn_linear_backward(dy, in, P0, n, l->fan_in, l->out, dx, G0, G1); break;
        case L_RELU:
            if (dx)
                ddp_nn_relu_backward(dy, in, cnt, dx);
            break;
        case L_GELU:
            if (dx)
                ddp_nn_gelu_backward(dy, in, cnt, dx);
            break;
        case L_DROPOUT:
            if (dx)
                ddp_nn_dropout_backward(dy, l->mask, cnt, l->p, train, dx);
            break;
        case L_CONV: ddp_nn_conv2d_backward(&l->conv, dy, in, P0, n, c->scratch, dx, G0, G1); break;
        case L_BN:
            ddp_nn_batchnorm_backward(dy, in, n, l->C, l->hw, P0, l->aux, l->aux + l->C, train, dx,
                                      G0, G1);
            break;
        case L_POOL:
            if (dx)
                ddp_nn_maxpool2d_backward(&l->pool, dy, l->argmax, n, dx);
            break;
        }
        for (int k = 0; ready && k < l->np; k++) {
            size_t idx = (size_t)(l->p0 + k);
            ddp_status st = ready(ctx, idx);
            if (st != DDP_OK)
                return ddp__errmsg(m->err, st,
                                   "backward: the gradient-ready callback failed for '%s' "
                                   "(%s)",
                                   m->params[idx].name, ddp_status_str(st));
        }
        dy = dx;
    }
    return DDP_OK;
}

static const float *logits(const ddp_model *m, size_t *rows, size_t *cols)
{
    const classifier *c = m->impl;
    if (c->n == 0)
        return NULL;
    *rows = (size_t)c->n;
    *cols = (size_t)c->classes;
    return c->res.cls ? c->logits_host : c->L[c->nl - 1].y;
}

/* 6 × the forward's multiply-adds per sample (a MAC is 2 FLOPs, the backward costs twice the
 * forward): linear in·out, conv out_ch·in_ch·kh·kw·out_h·out_w. Batchnorm, pooling and the
 * activations are not counted. */
static double flops(const ddp_model *m, int seq_len)
{
    const classifier *c = m->impl;
    double f = 0;
    (void)seq_len;
    for (int i = 0; i < c->nl; i++) {
        const layer *l = &c->L[i];
        double macs = 0;
        if (l->kind == L_LINEAR)
            macs = (double)l->fan_in * l->out;
        else if (l->kind == L_CONV)
            macs = (double)l->conv.out_ch * l->conv.in_ch * l->conv.kh * l->conv.kw *
                   l->conv.out_h * l->conv.out_w;
        /* forward 2, weight gradient 2, input gradient 2 — but the first layer's input is the
         * data, whose gradient backward does not compute (at the default MLP's 784-wide input
         * that product would be 40% of the count, and MFU came out above 100%) */
        f += (i == 0 ? 4.0 : 6.0) * macs;
    }
    return f;
}

const ddp_model_ops ddp__mlp_ops = {"mlp",    build_mlp, free_classifier, forward,
                                    backward, logits,    flops,           &ddp__resident_ops};
const ddp_model_ops ddp__cnn_ops = {"cnn",    build_cnn, free_classifier, forward,
                                    backward, logits,    flops,           &ddp__resident_ops};
