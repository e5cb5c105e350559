/*
 * optim.c — the optimizer kernels of ddp/nn.h (SGD with momentum, AdamW) and global
 * gradient-norm clipping, and the optimizer of ddp/optim.h that runs them over a model's
 * parameter list. The kernels are transcriptions of torch's single-tensor CPU code paths so that
 * the operations, and hence the float rounding, happen in the same order: scalars (bias
 * corrections, step sizes) in double like Python's floats, tensor arithmetic in float.
 *
 * The kernels keep no state: it lives in flat arrays, which the ddp_optim object owns per
 * parameter. Under DDP every rank holds the same parameters, averaged gradients and state, and
 * runs the same step (or its shard of it). The object does not know about the reducer: the
 * caller says which range of each parameter to step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/nn.h"
#include "ddp/optim.h"
#include "nn/vecmath.h"
#include "util/util.h"

void ddp_nn_sgd_step(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                     float weight_decay, uint64_t step)
{
    for (size_t i = 0; i < n; i++) {
        float d = weight_decay != 0.0f ? g[i] + weight_decay * p[i] : g[i];
        if (momentum != 0.0f) {
            buf[i] = step <= 1 ? d : buf[i] * momentum + d;
            d = buf[i];
        }
        p[i] = p[i] + -lr * d;
    }
}

/* The elementwise part of the AdamW step. Its own function for the AVX2 clone (DDP__VEC: the
 * same bits, as sqrt and division are exact in both); it vectorises at all because this file is
 * compiled without errno for sqrtf (CMakeLists.txt). */
DDP__VEC static void adamw_loop(float *p, const float *g, float *m, float *v, size_t n, float decay,
                                float beta1, float a1, float beta2, float a2, float bc2_sqrt,
                                float eps, float step_size)
{
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * decay;
        m[i] = m[i] * beta1 + a1 * g[i];
        v[i] = v[i] * beta2 + a2 * (g[i] * g[i]);
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = pi + -step_size * (m[i] / denom);
    }
}

void ddp_nn_adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, uint64_t step)
{
    double t = step ? (double)step : 1.0;
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float a1 = (float)(1.0 - beta1), a2 = (float)(1.0 - beta2);
    adamw_loop(p, g, m, v, n, decay, beta1, a1, beta2, a2, bc2_sqrt, eps, step_size);
}

float ddp_nn_clip_coef(double norm, double max_norm)
{
    double coef = max_norm / (norm + 1e-6);
    /* torch multiplies by min(coef, 1); a factor of 1 changes nothing, so the caller skips the
     * pass. A NaN norm gives a NaN coef, which torch applies too ("coef < 1" is false for NaN). */
    return coef < 1.0 || isnan(coef) ? (float)coef : 1.0f;
}

/* lane[k] += the squares of g[i] for i ≡ k (mod 8), i < n, in double: eight independent lanes
 * (one chain of dependent additions would not vectorise and costs a cycle per element), whose
 * sums do not depend on the vector width (DDP__VEC). */
DDP__VEC static void sum_squares(const float *g, size_t n, double lane[8])
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            lane[k] += (double)g[i + k] * g[i + k];
    for (int k = 0; i < n; i++, k++)
        lane[k] += (double)g[i] * g[i];
}

double ddp_nn_clip_grad_norm(float *const *grads, const size_t *counts, int n_arrays,
                             double max_norm)
{
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int a = 0; a < n_arrays; a++)
        sum_squares(grads[a], counts[a], lane);
    double ss =
        ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    double norm = sqrt(ss);
    float f = ddp_nn_clip_coef(norm, max_norm);
    if (f != 1.0f) {
        for (int a = 0; a < n_arrays; a++)
            for (size_t i = 0; i < counts[a]; i++)
                grads[a][i] *= f;
    }
    return norm;
}

/* ---- the optimizer over a parameter list (ddp/optim.h) --------------------------------------- */

struct ddp_optim {
    ddp_optim_opts opts;
    const ddp_model_param *params; /* (n,), borrowed */
    size_t n;
    int nstate;
    float **state[DDP_OPTIM_MAX_STATES]; /* state[s][i]: (hi[i] − lo[i],), element lo[i] first */
    size_t *lo, *hi;                     /* (n,): the elements kept, [0, count) until narrowed */
    char err[DDP_ERRMSG_MAX];
};

static const char *const state_names[][DDP_OPTIM_MAX_STATES] = {
    [DDP_OPTIM_SGD] = {"momentum_buffer", NULL},
    [DDP_OPTIM_ADAMW] = {"exp_avg", "exp_avg_sq"},
};

ddp_status ddp_optim_create(const ddp_optim_opts *opts, const ddp_model_param *params, size_t n,
                            ddp_optim **out, ddp_error *err)
{
    ddp_optim_opts o = DDP_OPTIM_OPTS_INIT;
    if (opts)
        o = *opts;
    if (o.kind != DDP_OPTIM_SGD && o.kind != DDP_OPTIM_ADAMW)
        return ddp__err(err, DDP_ERR_INVALID, "optimizer kind %d is not known: use sgd or adamw",
                        (int)o.kind);
    if (!(o.momentum >= 0) || !(o.weight_decay >= 0) || !(o.eps >= 0) ||
        !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
        return ddp__err(err, DDP_ERR_INVALID,
                        "optimizer: momentum %g, weight_decay %g, eps %g must be ≥ 0 and betas "
                        "%g, %g in [0, 1)",
                        (double)o.momentum, (double)o.weight_decay, (double)o.eps, (double)o.beta1,
                        (double)o.beta2);
    if (n > 0 && !params)
        return ddp__err(err, DDP_ERR_INVALID, "optimizer: %zu parameters but no list", n);
    ddp_optim *opt = calloc(1, sizeof *opt);
    if (!opt)
        goto out_nomem;
    opt->opts = o;
    opt->params = params;
    opt->n = n;
    opt->nstate = o.kind == DDP_OPTIM_ADAMW ? 2 : 1;
    if (!(opt->lo = calloc(n ? n : 1, sizeof *opt->lo)) ||
        !(opt->hi = calloc(n ? n : 1, sizeof *opt->hi)))
        goto out_free;
    for (size_t i = 0; i < n; i++)
        opt->hi[i] = params[i].count;
    for (int s = 0; s < opt->nstate; s++) {
        if (!(opt->state[s] = calloc(n ? n : 1, sizeof *opt->state[s])))
            goto out_free;
        for (size_t i = 0; i < n; i++)
            if (!(opt->state[s][i] = calloc(params[i].count ? params[i].count : 1, sizeof(float))))
                goto out_free;
    }
    *out = opt;
    return DDP_OK;
out_free:
    ddp_optim_destroy(opt);
out_nomem:
    return ddp__err(err, DDP_ERR_NOMEM, "out of memory for the optimizer's state");
}

void ddp_optim_destroy(ddp_optim *o)
{
    if (!o)
        return;
    for (int s = 0; s < DDP_OPTIM_MAX_STATES; s++) {
        for (size_t i = 0; o->state[s] && i < o->n; i++)
            free(o->state[s][i]);
        free(o->state[s]);
    }
    free(o->lo);
    free(o->hi);
    free(o);
}

ddp_status ddp_optim_keep(ddp_optim *o, const size_t *lo, const size_t *hi)
{
    if (o->n && (!lo || !hi))
        return ddp__errmsg(o->err, DDP_ERR_INVALID, "optimizer keep: no ranges");
    for (size_t i = 0; i < o->n; i++)
        if (lo[i] > hi[i] || lo[i] < o->lo[i] || hi[i] > o->hi[i])
            return ddp__errmsg(o->err, DDP_ERR_INVALID,
                               "optimizer keep: elements [%zu, %zu) of parameter %zu ('%s'), but "
                               "it keeps the state of [%zu, %zu) only: a range can only narrow",
                               lo[i], hi[i], i, o->params[i].name ? o->params[i].name : "",
                               o->lo[i], o->hi[i]);
    /* All new arrays first, so that a failure changes nothing. */
    float **fresh[DDP_OPTIM_MAX_STATES] = {NULL};
    bool ok = true;
    for (int s = 0; s < o->nstate && ok; s++) {
        ok = (fresh[s] = calloc(o->n ? o->n : 1, sizeof *fresh[s])) != NULL;
        for (size_t i = 0; i < o->n && ok; i++)
            ok =
                (fresh[s][i] = malloc(sizeof(float) * (hi[i] > lo[i] ? hi[i] - lo[i] : 1))) != NULL;
    }
    if (!ok) {
        for (int s = 0; s < o->nstate; s++) {
            for (size_t i = 0; fresh[s] && i < o->n; i++)
                free(fresh[s][i]);
            free(fresh[s]);
        }
        return ddp__errmsg(o->err, DDP_ERR_NOMEM, "out of memory narrowing the optimizer's state");
    }
    for (int s = 0; s < o->nstate; s++) {
        for (size_t i = 0; i < o->n; i++) {
            if (hi[i] > lo[i])
                memcpy(fresh[s][i], o->state[s][i] + (lo[i] - o->lo[i]),
                       sizeof(float) * (hi[i] - lo[i]));
            free(o->state[s][i]);
        }
        free(o->state[s]);
        o->state[s] = fresh[s];
    }
    for (size_t i = 0; i < o->n; i++) {
        o->lo[i] = lo[i];
        o->hi[i] = hi[i];
    }
    return DDP_OK;
}

void ddp_optim_kept(const ddp_optim *o, size_t i, size_t *lo, size_t *hi)
{
    *lo = i < o->n ? o->lo[i] : 0;
    *hi = i < o->n ? o->hi[i] : 0;
}

bool ddp_optim_narrowed(const ddp_optim *o)
{
    for (size_t i = 0; i < o->n; i++)
        if (o->lo[i] != 0 || o->hi[i] != o->params[i].count)
            return true;
    return false;
}

int ddp_optim_num_states(const ddp_optim *o)
{
    return o->nstate;
}

const char *ddp_optim_state_name(const ddp_optim *o, int s)
{
    return s >= 0 && s < o->nstate ? state_names[o->opts.kind][s] : NULL;
}

float *const *ddp_optim_state(const ddp_optim *o, int s)
{
    return s >= 0 && s < o->nstate ? o->state[s] : NULL;
}

ddp_status ddp_optim_step_range(ddp_optim *o, size_t i, size_t lo, size_t hi, uint64_t step,
                                float lr, float grad_scale)
{
    float *g = i < o->n && lo <= hi && hi <= o->params[i].count && o->params[i].grad
                   ? o->params[i].grad + lo
                   : NULL;
    return ddp_optim_step_range_grad(o, i, lo, hi, g, step, lr, grad_scale);
}

ddp_status ddp_optim_step_range_grad(ddp_optim *o, size_t i, size_t lo, size_t hi, float *grad,
                                     uint64_t step, float lr, float grad_scale)
{
    if (i >= o->n || lo > hi || hi > o->params[i].count) {
        return ddp__errmsg(o->err, DDP_ERR_INVALID,
                           "optimizer step: elements [%zu, %zu) of parameter %zu (of %zu, with "
                           "%zu elements)",
                           lo, hi, i, o->n, i < o->n ? o->params[i].count : 0);
    }
    if (lo < hi && (lo < o->lo[i] || hi > o->hi[i]))
        return ddp__errmsg(o->err, DDP_ERR_INVALID,
                           "optimizer step: elements [%zu, %zu) of parameter %zu, but the "
                           "optimizer keeps the state of [%zu, %zu) only (ddp_optim_keep): step "
                           "the reducer's shard (ddp_reducer_shard)",
                           lo, hi, i, o->lo[i], o->hi[i]);
    if (lo == hi)
        return DDP_OK;
    if (!grad)
        return ddp__errmsg(o->err, DDP_ERR_INVALID,
                           "optimizer step: parameter %zu ('%s') has no gradient", i,
                           o->params[i].name);
    const ddp_model_param *p = &o->params[i];
    float *w = p->data + lo, *g = grad;
    size_t n = hi - lo;
    if (grad_scale != 1.0f)
        for (size_t k = 0; k < n; k++)
            g[k] *= grad_scale;
    float wd = p->decay ? o->opts.weight_decay : 0.0f;
    if (o->opts.kind == DDP_OPTIM_ADAMW)
        ddp_nn_adamw_step(w, g, o->state[0][i] + (lo - o->lo[i]), o->state[1][i] + (lo - o->lo[i]),
                          n, lr, o->opts.beta1, o->opts.beta2, o->opts.eps, wd, step);
    else
        ddp_nn_sgd_step(w, g, o->state[0][i] + (lo - o->lo[i]), n, lr, o->opts.momentum, wd, step);
    return DDP_OK;
}

void ddp_optim_step(ddp_optim *o, uint64_t step, float lr, float grad_scale)
{
    for (size_t i = 0; i < o->n; i++)
        ddp_optim_step_range(o, i, o->lo[i], o->hi[i], step, lr, grad_scale);
}

const char *ddp_optim_last_error(const ddp_optim *o)
{
    return o->err;
}
