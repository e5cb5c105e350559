/*
 * model.c — the type-independent half of ddp/model.h: the table of model types, the parameter
 * list every type fills, where values and gradients live (the model's memory or the caller's),
 * argument checks and messages. The layers themselves are the types' business (classifier.c for
 * mlp and cnn, gpt.c for gpt); nothing here knows about reducers, optimizers or files.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/optim.h"
#include "kernels/kernels.h"
#include "nn/model_int.h"

static const ddp_model_ops *const types[] = {&ddp__mlp_ops, &ddp__cnn_ops, &ddp__gpt_ops};
#define NTYPES (sizeof types / sizeof types[0])

/* arr (cap elements of size sz) grown to hold more than n (2× when full): the array, perhaps
 * moved, or NULL when out of memory (arr is then unchanged). */
static void *grow(void *arr, size_t cap, size_t n, size_t sz)
{
    return n < cap ? arr : realloc(arr, (cap ? 2 * cap : 16) * sz);
}

static size_t grown(size_t cap, size_t n)
{
    return n < cap ? cap : cap ? 2 * cap : 16;
}

ddp_status ddp__model_add_param(ddp_model *m, const char *name, int ndim, const int64_t *shape,
                                bool decay, ddp_error *err)
{
    if (ndim < 1 || ndim > DDP_MODEL_MAX_DIMS)
        return ddp__err(err, DDP_ERR_INVALID, "parameter '%s' has %d dimensions (1 … %d)", name,
                        ndim, DDP_MODEL_MAX_DIMS);
    size_t count = 1;
    for (int d = 0; d < ndim; d++)
        count *= (size_t)shape[d];
    /* Three arrays indexed alike, grown together. */
    size_t n = m->n_params, cap = m->cap_params;
    ddp_model_param *params = grow(m->params, cap, n, sizeof *params);
    if (params)
        m->params = params;
    float **own_data = params ? grow(m->own_data, cap, n, sizeof *own_data) : NULL;
    if (own_data)
        m->own_data = own_data;
    float **own_grad = own_data ? grow(m->own_grad, cap, n, sizeof *own_grad) : NULL;
    if (!own_grad)
        goto out_nomem; /* a failed build frees the model: what did grow is released then */
    m->own_grad = own_grad;
    m->cap_params = grown(cap, n);
    ddp_model_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    m->own_data[m->n_params] = m->own_grad[m->n_params] = NULL;
    char *nm = strdup(name);
    float *data = calloc(count ? count : 1, sizeof(float));
    if (!nm || !data) {
        free(nm);
        free(data);
        goto out_nomem;
    }
    p->name = nm;
    p->ndim = ndim;
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)ndim);
    p->count = count;
    p->decay = decay;
    p->data = m->own_data[m->n_params] = data;
    m->n_params++;
    return DDP_OK;
out_nomem:
    return ddp__err(err, DDP_ERR_NOMEM, "out of memory for parameter '%s'", name);
}

ddp_status ddp__model_add_buffer(ddp_model *m, const char *name, size_t count, float fill,
                                 ddp_error *err)
{
    ddp_model_param *bufs = grow(m->buffers, m->cap_buffers, m->n_buffers, sizeof *bufs);
    if (!bufs)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for buffer '%s'", name);
    m->buffers = bufs;
    m->cap_buffers = grown(m->cap_buffers, m->n_buffers);
    char *nm = strdup(name);
    float *data = malloc(sizeof(float) * (count ? count : 1));
    if (!nm || !data) {
        free(nm);
        free(data);
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for buffer '%s'", name);
    }
    for (size_t k = 0; k < count; k++)
        data[k] = fill;
    m->buffers[m->n_buffers++] = (ddp_model_param){
        .name = nm, .ndim = 1, .shape = {(int64_t)count}, .count = count, .data = data};
    return DDP_OK;
}

ddp_status ddp_model_build(const ddp_model_spec *spec, ddp_model **out, ddp_error *err)
{
    if (!spec || !out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_model_build: spec and out must not be NULL");
    const ddp_model_ops *ops = NULL;
    for (size_t i = 0; i < NTYPES && spec->type; i++)
        if (!strcmp(types[i]->name, spec->type))
            ops = types[i];
    if (!ops) {
        char known[256] = "";
        for (size_t i = 0; i < NTYPES; i++)
            ddp__fmt(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                     types[i]->name);
        return ddp__err(err, DDP_ERR_INVALID, "model type '%s' is not known; use one of: %s",
                        spec->type ? spec->type : "(null)", known);
    }
    if (spec->max_batch < 1)
        return ddp__err(err, DDP_ERR_INVALID, "model max_batch %d: must be ≥ 1", spec->max_batch);
    if (spec->device != DDP_DEVICE_CPU && spec->device != DDP_DEVICE_CUDA)
        return ddp__err(err, DDP_ERR_INVALID, "model device %d: must be cpu or cuda",
                        (int)spec->device);
    ddp_status pst = ddp_precision_check(spec->device, spec->precision, err);
    if (pst != DDP_OK)
        return pst;
    ddp_model *m = calloc(1, sizeof *m);
    if (!m)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory building a '%s' model", ops->name);
    m->ops = ops;
    m->max_batch = spec->max_batch;
    m->gemm = spec->device == DDP_DEVICE_CPU && spec->precision == DDP_PRECISION_BF16
                  ? DDP__GEMM_BF16
                  : DDP__GEMM_FP32;
    ddp_status st = ops->build(m, spec, err);
    if (st != DDP_OK) {
        ddp_model_free(m);
        return st;
    }
    *out = m;
    return DDP_OK;
}

void ddp_model_free(ddp_model *m)
{
    if (!m)
        return;
    m->ops->free(m);
    for (size_t i = 0; i < m->n_params; i++) {
        free((char *)m->params[i].name);
        free(m->own_data[i]);
        free(m->own_grad[i]);
    }
    for (size_t i = 0; i < m->n_buffers; i++) {
        free((char *)m->buffers[i].name);
        free(m->buffers[i].data);
    }
    free(m->params);
    free(m->own_data);
    free(m->own_grad);
    free(m->buffers);
    free(m);
}

const char *ddp_model_type(const ddp_model *m)
{
    return m->ops->name;
}

const ddp_model_param *ddp_model_params(const ddp_model *m, size_t *n)
{
    if (n)
        *n = m->n_params;
    return m->params;
}

const ddp_model_param *ddp_model_buffers(const ddp_model *m, size_t *n)
{
    if (n)
        *n = m->n_buffers;
    return m->buffers;
}

ddp_status ddp_model_bind(ddp_model *m, size_t i, float *data, float *grad)
{
    m->err[0] = '\0';
    if (i >= m->n_params)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "ddp_model_bind: parameter %zu of a model with %zu", i, m->n_params);
    if (data && data != m->params[i].data) {
        m->params[i].data = data;
        free(m->own_data[i]);
        m->own_data[i] = NULL;
    }
    if (grad && grad != m->params[i].grad) {
        m->params[i].grad = grad;
        free(m->own_grad[i]);
        m->own_grad[i] = NULL;
    }
    return DDP_OK;
}

void ddp_model_zero_grad(ddp_model *m)
{
    for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].grad)
            memset(m->params[i].grad, 0, m->params[i].count * sizeof(float));
}

ddp_status ddp_model_forward(ddp_model *m, const ddp_model_batch *b, bool train, ddp_model_out *out)
{
    m->err[0] = '\0';
    m->can_backward = false;
    m->loss_kept = false;
    if (!b || b->n < 1 || b->n > m->max_batch)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "forward of a batch of %d samples: the model takes 1 … %d "
                           "(its max_batch)",
                           b ? b->n : 0, m->max_batch);
    ddp_model_out o = {0};
    ddp__gemm_kind was = ddp__gemm_set_kind(m->gemm);
    ddp_status st = m->ops->forward(m, b, train, &o);
    ddp__gemm_set_kind(was);
    if (st != DDP_OK)
        return st;
    m->can_backward = train && (o.count > 0 || m->loss_kept);
    if (out)
        *out = o;
    return DDP_OK;
}

const float *ddp_model_logits(const ddp_model *m, size_t *rows, size_t *cols)
{
    size_t r = 0, c = 0;
    const float *l = m->ops->logits(m, &r, &c);
    if (rows)
        *rows = r;
    if (cols)
        *cols = c;
    return l;
}

ddp_status ddp_model_backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    m->err[0] = '\0';
    if (!m->can_backward)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "backward needs a forward in training mode with labels first (one "
                           "backward per forward)");
    for (size_t i = 0; i < m->n_params && !m->resident; i++) { /* resident: on the device */
        ddp_model_param *p = &m->params[i];
        if (p->grad)
            continue;
        if (!(m->own_grad[i] = calloc(p->count ? p->count : 1, sizeof(float))))
            return ddp__errmsg(m->err, DDP_ERR_NOMEM, "out of memory for the gradient of '%s'",
                               p->name);
        p->grad = m->own_grad[i];
    }
    m->can_backward = false;
    ddp__gemm_kind was = ddp__gemm_set_kind(m->gemm);
    ddp_status st = m->ops->backward(m, ready, ctx);
    ddp__gemm_set_kind(was);
    return st;
}

ddp_status ddp__model_acquire(ddp_model *m, int n, const int *idx)
{
    for (int k = 0; m->acquire && k < n; k++) {
        if (idx[k] < 0)
            continue;
        float *g = NULL;
        ddp_status st = m->acquire(m->acquire_ctx, (size_t)idx[k], &g);
        if (st == DDP_OK && !g && m->params[idx[k]].count)
            st = DDP_ERR_INVALID;
        if (st != DDP_OK)
            return ddp__errmsg(m->err, st,
                               "backward: the gradient-acquire callback failed for '%s' (%s)",
                               m->params[idx[k]].name, ddp_status_str(st));
        m->params[idx[k]].grad = g;
    }
    return DDP_OK;
}

ddp_status ddp_model_backward_pooled(ddp_model *m, ddp_grad_acquire_fn acquire,
                                     ddp_grad_ready_fn ready, void *ctx)
{
    m->err[0] = '\0';
    if (!acquire)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "ddp_model_backward_pooled: acquire is "
                           "required (else ddp_model_backward)");
    if (m->resident || (m->res && (m->res->gpt || m->res->cls)))
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "ddp_model_backward_pooled: the model computes on the GPU; pooled "
                           "gradients (shard_gradients) are CPU-only for now");
    if (!m->can_backward)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "backward needs a forward in training mode with labels first (one "
                           "backward per forward)");
    m->can_backward = false;
    m->acquire = acquire;
    m->acquire_ctx = ctx;
    ddp__gemm_kind was = ddp__gemm_set_kind(m->gemm);
    ddp_status st = m->ops->backward(m, ready, ctx);
    ddp__gemm_set_kind(was);
    m->acquire = NULL;
    m->acquire_ctx = NULL;
    for (size_t i = 0; i < m->n_params; i++) { /* the memory was the acquirer's, lent */
        m->params[i].grad = NULL;
        free(m->own_grad[i]);
        m->own_grad[i] = NULL;
    }
    return st;
}

double ddp_model_flops_per_sample(const ddp_model *m, int seq_len)
{
    return m->ops->flops(m, seq_len);
}

/* ---- device-resident training ---------------------------------------------------------------- */

ddp_status ddp_model_resident(ddp_model *m, const struct ddp_optim_opts *opts, ddp_error *err)
{
    if (!m || !opts)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_model_resident: m and opts are required");
    if (!m->ops->resident)
        return ddp__err(err, DDP_ERR_INVALID,
                        "model type '%s' has no device-resident training (gpt, mlp and cnn have "
                        "it)",
                        m->ops->name);
    if (m->resident)
        return DDP_OK;
    ddp_status st = m->ops->resident->start(m, opts, err);
    if (st == DDP_OK)
        m->resident = true;
    return st;
}

bool ddp_model_is_resident(const ddp_model *m)
{
    return m && m->resident;
}

float *ddp_model_device_param(const ddp_model *m, size_t i)
{
    return m && m->resident && i < m->n_params ? m->ops->resident->param(m, i) : NULL;
}

float *ddp_model_device_buffer(const ddp_model *m, size_t j)
{
    return m && m->resident && j < m->n_buffers && m->ops->resident->buffer
               ? m->ops->resident->buffer(m, j)
               : NULL;
}

void *ddp_model_cuda_stream(const ddp_model *m)
{
    return m && m->ops->resident ? m->ops->resident->stream(m) : NULL;
}

/* The resident calls' common check: DDP_OK, or why not (message on m). */
static ddp_status resident_check(ddp_model *m, size_t i, const char *what)
{
    if (!m->resident)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "%s: the model is not device-resident (call ddp_model_resident first)",
                           what);
    if (i >= m->n_params)
        return ddp__errmsg(m->err, DDP_ERR_INVALID, "%s: no parameter %zu (the model has %zu)",
                           what, i, m->n_params);
    return DDP_OK;
}

ddp_status ddp_model_bind_device_grad(ddp_model *m, size_t i, float *grad_dev)
{
    ddp_status st = resident_check(m, i, "bind_device_grad");
    if (st)
        return st;
    if (!grad_dev)
        return ddp__errmsg(m->err, DDP_ERR_INVALID, "bind_device_grad: parameter %zu: no memory",
                           i);
    m->ops->resident->bind_grad(m, i, grad_dev);
    return DDP_OK;
}

ddp_status ddp_model_device_step(ddp_model *m, size_t i, uint64_t step, float lr, float grad_scale)
{
    ddp_status st = resident_check(m, i, "device_step");
    return st ? st : m->ops->resident->step(m, i, 0, m->params[i].count, step, lr, grad_scale);
}

ddp_status ddp_model_device_step_range(ddp_model *m, size_t i, size_t lo, size_t hi, uint64_t step,
                                       float lr, float grad_scale)
{
    ddp_status st = resident_check(m, i, "device_step_range");
    if (st)
        return st;
    if (lo > hi || hi > m->params[i].count)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "device_step_range: elements [%zu, %zu) of '%s', which has %zu", lo, hi,
                           m->params[i].name, m->params[i].count);
    return m->ops->resident->step(m, i, lo, hi, step, lr, grad_scale);
}

ddp_status ddp_model_bind_device_params(ddp_model *m, float *const *params_dev)
{
    ddp_status st = resident_check(m, 0, "bind_device_params");
    for (size_t i = 0; !st && params_dev && i < m->n_params; i++)
        if (!params_dev[i])
            st = ddp__errmsg(m->err, DDP_ERR_INVALID,
                             "bind_device_params: parameter %zu ('%s') has no array", i,
                             m->params[i].name);
    return st ? st : m->ops->resident->bind_params(m, params_dev);
}

ddp_status ddp_model_device_state(ddp_model *m, int s, float **dev)
{
    ddp_status st = resident_check(m, 0, "device_state");
    if (!st && !dev)
        st = ddp__errmsg(m->err, DDP_ERR_INVALID, "device_state: no array to fill");
    return st ? st : m->ops->resident->state(m, s, dev);
}

ddp_status ddp_model_device_keep(ddp_model *m, const size_t *lo, const size_t *hi)
{
    ddp_status st = resident_check(m, 0, "device_keep");
    if (!st && m->n_params && (!lo || !hi))
        st = ddp__errmsg(m->err, DDP_ERR_INVALID, "device_keep: no ranges");
    return st ? st : m->ops->resident->keep(m, lo, hi);
}

void ddp_model_device_kept(const ddp_model *m, size_t i, size_t *lo, size_t *hi)
{
    bool known = m && i < m->n_params;
    const ddp__resident *r = known ? m->res : NULL;
    *lo = r && r->klo ? r->klo[i] : 0;
    *hi = r && r->khi ? r->khi[i] : known ? m->params[i].count : 0;
}

ddp_status ddp_model_sync_host(ddp_model *m, struct ddp_optim *opt)
{
    ddp_status st = resident_check(m, 0, "sync_host");
    return st ? st : m->ops->resident->sync(m, opt, true);
}

ddp_status ddp_model_sync_device(ddp_model *m, struct ddp_optim *opt)
{
    ddp_status st = resident_check(m, 0, "sync_device");
    return st ? st : m->ops->resident->sync(m, opt, false);
}

const char *ddp_model_last_error(const ddp_model *m)
{
    return m->err;
}
