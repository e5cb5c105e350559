/*
 * model.c — ddptrain's layer-list models (model.h). Each layer keeps its output for backward;
 * gradients flow through two ping-pong buffers. Parameters are registered in forward order,
 * so the reducer buckets them from the last layer down, the order backward finishes them.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

ddp_status train_err(ddp_error *err, ddp_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->status = st;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

static layer *add(model *m, lkind k, size_t in_n, size_t out_n)
{
    layer *l = &m->L[m->nl++];
    memset(l, 0, sizeof *l);
    l->kind = k;
    l->in_n = in_n;
    l->out_n = out_n;
    l->p0 = -1;
    return l;
}

static ddp_status add_param(model *m, layer *l, const char *name, size_t count, ddp_error *err)
{
    if (m->nparams >= 64)
        return train_err(err, DDP_ERR_INVALID, "the model has more than 64 parameter tensors");
    int i = m->nparams;
    if (l->p0 < 0)
        l->p0 = i;
    l->np++;
    snprintf(m->names[i], sizeof m->names[0], "%s", name);
    float *data = calloc(count ? count : 1, sizeof(float));
    if (!data)
        return train_err(err, DDP_ERR_NOMEM, "out of memory for parameter '%s'", name);
    m->params[i] = (ddp_param){m->names[i], count, DDP_FLOAT32, data};
    m->own[i] = data;
    m->nparams = i + 1;
    return DDP_OK;
}

static ddp_status add_buffer(model *m, const char *name, size_t count, float fill, ddp_error *err)
{
    int i = m->nbuffers;
    if (i >= 32)
        return train_err(err, DDP_ERR_INVALID, "the model has more than 32 buffers");
    snprintf(m->bnames[i], sizeof m->bnames[0], "%s", name);
    float *data = malloc(sizeof(float) * count);
    if (!data)
        return train_err(err, DDP_ERR_NOMEM, "out of memory for buffer '%s'", name);
    for (size_t k = 0; k < count; k++)
        data[k] = fill;
    m->buffers[i] = (ddp_param){m->bnames[i], count, DDP_FLOAT32, data};
    m->nbuffers = i + 1;
    return DDP_OK;
}

static ddp_status add_linear(model *m, size_t in, size_t out, int idx, uint64_t seed,
                             ddp_error *err)
{
    layer *l = add(m, L_LINEAR, in, out);
    l->fan_in = (int)in;
    l->out = (int)out;
    char name[48];
    ddp_status st;
    snprintf(name, sizeof name, "fc%d.weight", idx);
    if ((st = add_param(m, l, name, in * out, err)))
        return st;
    snprintf(name, sizeof name, "fc%d.bias", idx);
    if ((st = add_param(m, l, name, out, err)))
        return st;
    ddp_nn_init_kaiming_uniform(m->params[l->p0].data, in * out, in, seed, (uint64_t)l->p0);
    ddp_nn_init_kaiming_uniform(m->params[l->p0 + 1].data, out, in, seed, (uint64_t)l->p0 + 1);
    return DDP_OK;
}

ddp_status model_build(model *m, const model_spec *spec, int ch, int h, int w, int classes, int B,
                       uint64_t seed, ddp_error *err)
{
    const char *type = spec->type;
    const int64_t *hidden = spec->hidden, *channels = spec->channels;
    size_t nh = spec->nh, nc = spec->nc;
    float dropout = spec->dropout;
    lkind act = L_RELU;
    if (spec->activation && !strcmp(spec->activation, "gelu"))
        act = L_GELU;
    else if (spec->activation && strcmp(spec->activation, "relu") != 0)
        return train_err(err, DDP_ERR_INVALID, "model.activation '%s': use relu or gelu",
                         spec->activation);
    memset(m, 0, sizeof *m);
    m->L = calloc(128, sizeof *m->L);
    m->params = calloc(64, sizeof *m->params);
    m->buffers = calloc(32, sizeof *m->buffers);
    if (!m->L || !m->params || !m->buffers)
        return train_err(err, DDP_ERR_NOMEM, "out of memory building the model");
    m->B = B;
    m->in_n = (size_t)ch * h * w;
    m->classes = classes;
    ddp_status st;
    size_t n = m->in_n, scratch = 0;
    int fc = 1;
    if (!strcmp(type, "cnn")) {
        for (size_t s = 0; s < nc; s++) {
            if (channels[s] < 1 || h < 2 || w < 2)
                return train_err(err, DDP_ERR_INVALID,
                                 "model.channels: stage %zu cannot shrink a %d × %d image further "
                                 "(or has no channels); use fewer stages",
                                 s + 1, h, w);
            layer *c = add(m, L_CONV, n, 0);
            c->conv = (ddp_nn_conv2d){.in_ch = ch,
                                      .h = h,
                                      .w = w,
                                      .out_ch = (int)channels[s],
                                      .kh = 3,
                                      .kw = 3,
                                      .stride = 1,
                                      .pad = 1};
            if ((st = ddp_nn_conv2d_setup(&c->conv, err)))
                return st;
            c->out_n = (size_t)c->conv.out_ch * c->conv.out_h * c->conv.out_w;
            if (c->conv.scratch_floats > scratch)
                scratch = c->conv.scratch_floats;
            char name[48];
            snprintf(name, sizeof name, "conv%zu.weight", s + 1);
            if ((st = add_param(m, c, name, (size_t)c->conv.out_ch * ch * 9, err)))
                return st;
            snprintf(name, sizeof name, "conv%zu.bias", s + 1);
            if ((st = add_param(m, c, name, (size_t)c->conv.out_ch, err)))
                return st;
            ddp_nn_init_kaiming_uniform(m->params[c->p0].data, m->params[c->p0].count,
                                        (size_t)ch * 9, seed, (uint64_t)c->p0);
            ddp_nn_init_kaiming_uniform(m->params[c->p0 + 1].data, m->params[c->p0 + 1].count,
                                        (size_t)ch * 9, seed, (uint64_t)c->p0 + 1);
            n = c->out_n;
            ch = c->conv.out_ch;
            layer *bn = add(m, L_BN, n, n);
            bn->C = ch;
            bn->hw = h * w;
            snprintf(name, sizeof name, "bn%zu.weight", s + 1);
            if ((st = add_param(m, bn, name, (size_t)ch, err)))
                return st;
            for (int k = 0; k < ch; k++)
                ((float *)m->params[bn->p0].data)[k] = 1.0f;
            snprintf(name, sizeof name, "bn%zu.bias", s + 1);
            if ((st = add_param(m, bn, name, (size_t)ch, err)))
                return st;
            snprintf(name, sizeof name, "bn%zu.running_mean", s + 1);
            if ((st = add_buffer(m, name, (size_t)ch, 0.0f, err)))
                return st;
            snprintf(name, sizeof name, "bn%zu.running_var", s + 1);
            if ((st = add_buffer(m, name, (size_t)ch, 1.0f, err)))
                return st;
            add(m, act, n, n);
            layer *p = add(m, L_POOL, n, 0);
            p->pool = (ddp_nn_pool2d){.ch = ch, .h = h, .w = w, .kernel = 2, .stride = 2};
            if ((st = ddp_nn_maxpool2d_setup(&p->pool, err)))
                return st;
            h = p->pool.out_h;
            w = p->pool.out_w;
            n = p->out_n = (size_t)ch * h * w;
        }
    } else if (strcmp(type, "mlp") != 0) {
        return train_err(err, DDP_ERR_INVALID, "model.type '%s': use mlp or cnn", type);
    }
    for (size_t k = 0; k < nh; k++) {
        if (hidden[k] < 1)
            return train_err(err, DDP_ERR_INVALID, "model.hidden: sizes must be ≥ 1");
        if ((st = add_linear(m, n, (size_t)hidden[k], fc++, seed, err)))
            return st;
        n = (size_t)hidden[k];
        add(m, act, n, n);
        if (dropout > 0) {
            layer *d = add(m, L_DROPOUT, n, n);
            d->p = dropout;
        }
    }
    if ((st = add_linear(m, n, (size_t)classes, fc, seed, err)))
        return st;
    /* Buffers, sized for B samples. */
    size_t widest = m->in_n;
    for (int i = 0; i < m->nl; i++) {
        layer *l = &m->L[i];
        if (l->out_n > widest)
            widest = l->out_n;
        l->y = malloc(sizeof(float) * (size_t)B * l->out_n);
        if (!l->y)
            return train_err(err, DDP_ERR_NOMEM, "out of memory for activations");
        if (l->kind == L_POOL && !(l->argmax = malloc(sizeof(int32_t) * (size_t)B * l->out_n)))
            return train_err(err, DDP_ERR_NOMEM, "out of memory for activations");
        if (l->kind == L_DROPOUT && !(l->mask = malloc((size_t)B * l->out_n)))
            return train_err(err, DDP_ERR_NOMEM, "out of memory for activations");
        if (l->kind == L_BN && !(l->aux = malloc(sizeof(float) * 2 * (size_t)l->C)))
            return train_err(err, DDP_ERR_NOMEM, "out of memory for activations");
    }
    m->g0 = malloc(sizeof(float) * (size_t)B * widest);
    m->g1 = malloc(sizeof(float) * (size_t)B * widest);
    m->scratch = scratch ? malloc(sizeof(float) * scratch) : NULL;
    if (!m->g0 || !m->g1 || (scratch && !m->scratch))
        return train_err(err, DDP_ERR_NOMEM, "out of memory for gradients");
    return DDP_OK;
}

void model_free(model *m)
{
    for (int i = 0; m->L && i < m->nl; i++) {
        free(m->L[i].y);
        free(m->L[i].aux);
        free(m->L[i].argmax);
        free(m->L[i].mask);
    }
    for (int i = 0; m->params && i < m->nparams; i++)
        free(m->own[i]);
    for (int i = 0; m->buffers && i < m->nbuffers; i++)
        free(m->buffers[i].data);
    free(m->L);
    free(m->params);
    free(m->buffers);
    free(m->scratch);
    free(m->g0);
    free(m->g1);
    memset(m, 0, sizeof *m);
}

/* The batchnorm layer's running statistics: buffers 2k and 2k+1 for the k-th batchnorm. */
static int bn_index(const model *m, const layer *l)
{
    int k = 0;
    for (const layer *p = m->L; p < l; p++)
        k += p->kind == L_BN;
    return 2 * k;
}

const float *model_forward(model *m, const float *x, int n, bool train, uint64_t seed,
                           uint64_t step, uint64_t sample_offset, ddp_error *err)
{
    const float *a = x;
    for (int i = 0; i < m->nl; i++) {
        layer *l = &m->L[i];
        float *P0 = l->p0 >= 0 ? m->params[l->p0].data : NULL;
        float *P1 = l->p0 >= 0 ? m->params[l->p0 + 1].data : NULL;
        switch (l->kind) {
        case L_LINEAR: ddp_nn_linear_forward(a, P0, P1, n, l->fan_in, l->out, l->y); break;
        case L_RELU: ddp_nn_relu_forward(a, (size_t)n * l->out_n, l->y); break;
        case L_GELU: ddp_nn_gelu_forward(a, (size_t)n * l->out_n, l->y); break;
        case L_DROPOUT:
            ddp_nn_dropout_forward(a, (size_t)n * l->out_n, l->p, seed + (uint64_t)i, step,
                                   sample_offset * l->out_n, train, l->mask, l->y);
            break;
        case L_CONV: ddp_nn_conv2d_forward(&l->conv, a, P0, P1, n, m->scratch, l->y); break;
        case L_BN: {
            int b = bn_index(m, l);
            if (ddp_nn_batchnorm_forward(a, n, l->C, l->hw, P0, P1, 0.1f, 1e-5f, train,
                                         m->buffers[b].data, m->buffers[b + 1].data, l->y, l->aux,
                                         l->aux + l->C, err) != DDP_OK)
                return NULL;
            break;
        }
        case L_POOL: ddp_nn_maxpool2d_forward(&l->pool, a, n, l->y, l->argmax); break;
        }
        a = l->y;
    }
    return a;
}

ddp_status model_backward(model *m, const float *x, const float *dlogits, int n, bool train,
                          ddp_reducer *red)
{
    const float *dy = dlogits;
    for (int i = m->nl - 1; i >= 0; i--) {
        layer *l = &m->L[i];
        const float *in = i > 0 ? m->L[i - 1].y : x;
        float *dx = i > 0 ? (dy == m->g0 ? m->g1 : m->g0) : NULL; /* the input needs none */
        float *P0 = l->p0 >= 0 ? m->params[l->p0].data : NULL;
        float *G0 = l->p0 >= 0 ? ddp_reducer_grad(red, (size_t)l->p0) : NULL;
        float *G1 = l->p0 >= 0 ? ddp_reducer_grad(red, (size_t)l->p0 + 1) : NULL;
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
        case L_CONV: ddp_nn_conv2d_backward(&l->conv, dy, in, P0, n, m->scratch, dx, G0, G1); break;
        case L_BN:
            ddp_nn_batchnorm_backward(dy, in, n, l->C, l->hw, P0, l->aux, l->aux + l->C, train, dx,
                                      G0, G1);
            break;
        case L_POOL:
            if (dx)
                ddp_nn_maxpool2d_backward(&l->pool, dy, l->argmax, n, dx);
            break;
        }
        for (int k = 0; red && k < l->np; k++) {
            ddp_status st = ddp_reducer_mark_ready(red, (size_t)(l->p0 + k));
            if (st)
                return st;
        }
        dy = dx;
    }
    return DDP_OK;
}
