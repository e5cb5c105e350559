/*
 * resident.c — the host side of device-resident training (ddp_model_resident), once for every
 * type with a device model: the MLP and CNN (classifier.c, device side kernels/cuda/classifier.cu)
 * and the GPT (gpt.c, kernels/cuda/gpt.cu). The types differ only in which kernels.h entry points
 * they call (ddp__cuda_cls_* or ddp__cuda_gpt_*) and in the classifier's buffers (running
 * statistics; the GPT has none); the small wrappers below pick the entry points by which device
 * model m->res holds. Argument checks are model.c's; the layers are the types'.
 */
#include <stdlib.h>
#include <string.h>

#include "ddp/optim.h"
#include "kernels/kernels.h"
#include "nn/model_int.h"

/* ---- the device entry points, by type ---------------------------------------------------------
 */

/* The device arrays of the parameters (and the classifier's buffers) and the stream, as the
 * module has them now. */
static ddp_status dev_info(ddp__resident *r, ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_dev_info(r->cls, r->dparam, r->dbuf, &r->stream, err)
                  : ddp__cuda_gpt_dev_info(r->gpt, r->dparam, &r->stream, err);
}

/* Parameters (and the classifier's buffers) host → device. */
static ddp_status upload(ddp__resident *r, const float *const *params, const float *const *bufs,
                         ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_upload(r->cls, params, bufs, err)
                  : ddp__cuda_gpt_set_params(r->gpt, params, err);
}

static ddp_status get_params(ddp__resident *r, float *const *params, ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_get_params(r->cls, params, err)
                  : ddp__cuda_gpt_get_params(r->gpt, params, err);
}

static ddp_status optim_init(ddp__resident *r, int nstates, ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_optim_init(r->cls, nstates, err)
                  : ddp__cuda_gpt_optim_init(r->gpt, nstates, err);
}

static ddp_status optim_step(ddp__resident *r, const ddp__cuda_optim_args *a, ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_optim_step(r->cls, a, err)
                  : ddp__cuda_gpt_optim_step(r->gpt, a, err);
}

static ddp_status optim_state(ddp__resident *r, int s, float *const *host, bool to_host,
                              ddp_error *err)
{
    return r->cls ? ddp__cuda_cls_optim_state(r->cls, s, host, to_host, err)
                  : ddp__cuda_gpt_optim_state(r->gpt, s, host, to_host, err);
}

/* ---- shared state -----------------------------------------------------------------------------
 */

ddp_status ddp__resident_init(ddp_model *m, ddp_error *err)
{
    ddp__resident *r = m->res;
    size_t np = m->n_params, nb = m->n_buffers;
    if (!(r->dparam = calloc(np ? np : 1, sizeof *r->dparam)) ||
        !(r->dbuf = calloc(nb ? nb : 1, sizeof *r->dbuf)) ||
        !(r->dgrad = calloc(np ? np : 1, sizeof *r->dgrad)))
        return ddp__err(err, DDP_ERR_NOMEM, "%s: out of memory", m->ops->name);
    /* the stream (and the device arrays) from the start: ddp_model_cuda_stream answers for a
     * host-driven model too */
    return dev_info(r, err);
}

void ddp__resident_free(ddp__resident *r)
{
    if (!r)
        return;
    free(r->pdata);
    free(r->pgrad);
    free(r->bdata);
    free(r->bout);
    free(r->dparam);
    free(r->dbuf);
    free(r->dgrad);
    free(r->klo);
    free(r->khi);
}

/* ---- backward ---------------------------------------------------------------------------------
 */

/* Resident backward's ready calls from the device model: each parameter once (a second call
 * would be the module's bug: refused), passed on to the caller's ready. */
typedef struct resident_marks {
    ddp_model *m;
    ddp_grad_ready_fn ready;
    void *ctx;
    bool *done; /* (n_params,) */
    ddp_status st;
} resident_marks;

static ddp_status resident_mark(void *ctx, size_t i)
{
    resident_marks *rm = ctx;
    if (i >= rm->m->n_params || rm->done[i])
        return rm->st = DDP_ERR_INVALID;
    rm->done[i] = true;
    ddp_status st = rm->ready ? rm->ready(rm->ctx, i) : DDP_OK;
    if (st)
        rm->st = st;
    return st;
}

ddp_status ddp__resident_backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    ddp__resident *r = m->res;
    ddp_error e = {0};
    for (size_t i = 0; i < m->n_params; i++)
        if (!r->dgrad[i])
            return ddp__errmsg(m->err, DDP_ERR_INVALID,
                               "%s backward on cuda: no device gradient bound for '%s' "
                               "(ddp_model_bind_device_grad)",
                               m->ops->name, m->params[i].name);
    bool *done = calloc(m->n_params ? m->n_params : 1, sizeof *done);
    if (!done)
        return ddp__errmsg(m->err, DDP_ERR_NOMEM, "%s backward on cuda: out of memory",
                           m->ops->name);
    resident_marks rm = {m, ready, ctx, done, DDP_OK};
    ddp_status st = r->cls ? ddp__cuda_cls_backward_dev(r->cls, r->dgrad, resident_mark, &rm, &e)
                           : ddp__cuda_gpt_backward_dev(r->gpt, r->dgrad, resident_mark, &rm, &e);
    size_t late = m->n_params; /* the parameter whose late report failed, if one did */
    for (size_t i = m->n_params; !st && i-- > 0;)
        if (!done[i] && ready && (st = ready(ctx, i)) != DDP_OK)
            late = i;
    free(done);
    if (late < m->n_params)
        return ddp__errmsg(m->err, st, "backward: the gradient-ready callback failed for '%s' (%s)",
                           m->params[late].name, ddp_status_str(st));
    if (st && rm.st)
        return ddp__errmsg(m->err, rm.st, "backward: the gradient-ready callback failed (%s)",
                           ddp_status_str(rm.st));
    if (st)
        return ddp__errmsg(m->err, e.status ? e.status : st, "%s backward on cuda: %s",
                           m->ops->name, e.msg);
    return DDP_OK;
}

/* ---- the resident operations (model_int.h's ddp_model_resident_ops) -------------------------- */

/* The parameters (and buffers) go up once, from the host's arrays (a checkpoint loaded into
 * them, or the initial values); the optimizer's state is made on the device, zeroed. */
static ddp_status resident_start(ddp_model *m, const struct ddp_optim_opts *opts, ddp_error *err)
{
    ddp__resident *r = m->res;
    if (!r->cls && !r->gpt)
        return ddp__err(err, DDP_ERR_INVALID,
                        "%s: device-resident training needs a model built with device cuda",
                        m->ops->name);
    if (opts->kind != DDP_OPTIM_SGD && opts->kind != DDP_OPTIM_ADAMW)
        return ddp__err(err, DDP_ERR_INVALID, "%s: optimizer kind %d is not known", m->ops->name,
                        (int)opts->kind);
    for (size_t i = 0; i < m->n_params; i++)
        r->pdata[i] = m->params[i].data;
    for (size_t j = 0; j < m->n_buffers; j++)
        r->bdata[j] = m->buffers[j].data;
    ddp_status st;
    /* The classifier's arrays are asked for again after the upload (as they always were); the
     * GPT's stand as build found them. */
    if ((st = upload(r, r->pdata, r->bdata, err)) ||
        (st = optim_init(r, opts->kind == DDP_OPTIM_ADAMW ? 2 : 1, err)) ||
        (r->cls && (st = dev_info(r, err))))
        return st;
    r->oo = *opts;
    return DDP_OK;
}

static float *resident_param(const ddp_model *m, size_t i)
{
    return m->res->dparam[i];
}

static float *resident_buffer(const ddp_model *m, size_t j)
{
    return m->res->dbuf[j];
}

static void *resident_stream(const ddp_model *m)
{
    const ddp__resident *r = m->res;
    return r && (r->cls || r->gpt) ? r->stream : NULL;
}

static void resident_bind_grad(ddp_model *m, size_t i, float *grad_dev)
{
    m->res->dgrad[i] = grad_dev;
}

/* The device's AdamW/SGD kernels' arguments for parameter i, elements [lo, hi) (kernels.h). */
static ddp_status optim_args(ddp_model *m, size_t i, size_t lo, size_t hi, uint64_t step, float lr,
                             float grad_scale, ddp__cuda_optim_args *a)
{
    const ddp__resident *r = m->res;
    if (!r->dgrad[i])
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "device_step: no device gradient bound for '%s'", m->params[i].name);
    *a = (ddp__cuda_optim_args){
        .adamw = r->oo.kind == DDP_OPTIM_ADAMW,
        .i = i,
        .lo = lo,
        .hi = hi,
        .grad_dev = r->dgrad[i],
        .step = step,
        .lr = lr,
        .grad_scale = grad_scale,
        .momentum = r->oo.momentum,
        .beta1 = r->oo.beta1,
        .beta2 = r->oo.beta2,
        .eps = r->oo.eps,
        .weight_decay = m->params[i].decay ? r->oo.weight_decay : 0.0f,
    };
    return DDP_OK;
}

static ddp_status resident_step(ddp_model *m, size_t i, size_t lo, size_t hi, uint64_t step,
                                float lr, float grad_scale)
{
    ddp__cuda_optim_args a;
    ddp_status st = optim_args(m, i, lo, hi, step, lr, grad_scale, &a);
    if (st != DDP_OK)
        return st;
    ddp_error e = {0};
    if (optim_step(m->res, &a, &e) != DDP_OK)
        return ddp__errmsg(m->err, e.status, "optimizer step on cuda: %s", e.msg);
    return DDP_OK;
}

/* Parameters, running statistics and (with opt) the optimizer's state, between the device and
 * the host's arrays (the list's data, the buffers' data, opt's state). A refused call (another
 * kind of optimizer) copies nothing. */
static ddp_status resident_sync(ddp_model *m, struct ddp_optim *opt, bool to_host)
{
    ddp__resident *r = m->res;
    ddp_error e = {0};
    for (size_t i = 0; i < m->n_params; i++)
        r->pgrad[i] = m->params[i].data; /* the host's value arrays, writable */
    for (size_t j = 0; j < m->n_buffers; j++)
        r->bout[j] = m->buffers[j].data;
    int want = r->oo.kind == DDP_OPTIM_ADAMW ? 2 : 1;
    int ns = opt ? ddp_optim_num_states(opt) : 0;
    if (opt && ns != want)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "sync: the optimizer has %d state arrays, the device's %d: another "
                           "kind of optimizer",
                           ns, want);
    for (size_t i = 0; opt && i < m->n_params; i++) {
        size_t lo, hi, dlo = r->klo ? r->klo[i] : 0, dhi = r->khi ? r->khi[i] : m->params[i].count;
        ddp_optim_kept(opt, i, &lo, &hi);
        if (lo != dlo || hi != dhi)
            return ddp__errmsg(m->err, DDP_ERR_INVALID,
                               "sync: the optimizer keeps the state of elements [%zu, %zu) of "
                               "'%s', the device's of [%zu, %zu): narrow both alike "
                               "(ddp_optim_keep, ddp_model_device_keep)",
                               lo, hi, m->params[i].name, dlo, dhi);
    }
    ddp_status st =
        to_host ? get_params(r, r->pgrad, &e)
                : upload(r, (const float *const *)r->pgrad, (const float *const *)r->bout, &e);
    if (!st && to_host && r->cls && m->n_buffers > 0)
        st = ddp__cuda_cls_get_buffers(r->cls, r->bout, &e);
    for (int s = 0; s < ns && !st; s++)
        st = optim_state(r, s, ddp_optim_state(opt, s), to_host, &e);
    if (st)
        return ddp__errmsg(m->err, st, "copying the training state %s the GPU: %s",
                           to_host ? "from" : "to", e.msg);
    return DDP_OK;
}

/* The parameters' device arrays become params_dev's (or the module's own again: NULL). */
static ddp_status resident_bind_params(ddp_model *m, float *const *params_dev)
{
    ddp__resident *r = m->res;
    ddp_error e = {0};
    ddp_status st = r->cls ? ddp__cuda_cls_bind_params(r->cls, params_dev, &e)
                           : ddp__cuda_gpt_bind_params(r->gpt, params_dev, &e);
    if (st != DDP_OK && !params_dev) /* still bound: the values are in the bound arrays */
        return ddp__errmsg(m->err, e.status,
                           "unbinding the parameters on the GPU (still bound to the given arrays, "
                           "which hold the values: keep them until it succeeds): %s",
                           e.msg);
    if (st != DDP_OK || dev_info(r, &e))
        return ddp__errmsg(m->err, e.status, "binding the parameters on the GPU: %s", e.msg);
    return DDP_OK;
}

static ddp_status resident_state(ddp_model *m, int s, float **dev)
{
    ddp__resident *r = m->res;
    ddp_error e = {0};
    ddp_status st = r->cls ? ddp__cuda_cls_state_dev(r->cls, s, dev, &e)
                           : ddp__cuda_gpt_state_dev(r->gpt, s, dev, &e);
    if (st != DDP_OK)
        return ddp__errmsg(m->err, e.status, "the optimizer's state on the GPU: %s", e.msg);
    return DDP_OK;
}

/* ZeRO-1's memory split on the device: the module narrows its state buffers, and the ranges are
 * kept here too for sync's check and ddp_model_device_kept. */
static ddp_status resident_keep(ddp_model *m, const size_t *lo, const size_t *hi)
{
    ddp__resident *r = m->res;
    size_t np = m->n_params ? m->n_params : 1;
    if (!r->klo) { /* the first narrowing: every element kept until the module's says */
        if (!(r->klo = malloc(sizeof *r->klo * np)) || !(r->khi = malloc(sizeof *r->khi * np))) {
            free(r->klo);
            r->klo = NULL;
            return ddp__errmsg(m->err, DDP_ERR_NOMEM,
                               "narrowing the optimizer's state: out of memory");
        }
        for (size_t i = 0; i < m->n_params; i++) {
            r->klo[i] = 0;
            r->khi[i] = m->params[i].count;
        }
    }
    ddp_error e = {0};
    ddp_status st = r->cls ? ddp__cuda_cls_optim_keep(r->cls, lo, hi, &e)
                           : ddp__cuda_gpt_optim_keep(r->gpt, lo, hi, &e);
    if (st != DDP_OK)
        return ddp__errmsg(m->err, e.status ? e.status : st,
                           "narrowing the optimizer's state on the GPU: %s", e.msg);
    memcpy(r->klo, lo, sizeof *lo * m->n_params);
    memcpy(r->khi, hi, sizeof *hi * m->n_params);
    return DDP_OK;
}

const ddp_model_resident_ops ddp__resident_ops = {
    .start = resident_start,
    .param = resident_param,
    .buffer = resident_buffer,
    .stream = resident_stream,
    .bind_grad = resident_bind_grad,
    .step = resident_step,
    .bind_params = resident_bind_params,
    .state = resident_state,
    .keep = resident_keep,
    .sync = resident_sync,
};
