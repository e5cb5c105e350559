/*
 * fake_gpu_resident.c — the fake GPU module's "device" flat buffers and resident optimizer, for
 * both its models (fake_gpu_resident.h). Host memory throughout; the arithmetic is the CPU
 * optimizer's (ddp_nn_adamw_step, ddp_nn_sgd_step), so a resident run equals a CPU run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/nn.h"

#include "fake_gpu_resident.h"

ddp_status fake_res_fail(ddp_error *err, ddp_status st, const char *name, const char *msg)
{
    if (err) {
        snprintf(err->msg, sizeof err->msg, "%s: %s", name, msg);
        err->status = st;
    }
    return st;
}

static ddp_status fail(const fake_res *r, ddp_error *err, ddp_status st, const char *msg)
{
    return fake_res_fail(err, st, r->name, msg);
}

ddp_status fake_res_init(fake_res *r, ddp_model *m, const size_t *counts, size_t np, ddp_error *err)
{
    size_t n = 0;
    const ddp_model_param *p = ddp_model_params(m, &n);
    r->m = m;
    if (n != np)
        return fail(r, err, DDP_ERR_INVALID, "the model's parameter count differs");
    r->np = np;
    r->counts = calloc(np ? np : 1, sizeof(size_t));
    r->offsets = calloc(np ? np : 1, sizeof(size_t));
    if (!r->counts || !r->offsets)
        return fail(r, err, DDP_ERR_NOMEM, "out of memory");
    size_t most = 1;
    for (size_t i = 0; i < np; i++) {
        if (p[i].count != counts[i])
            return fail(r, err, DDP_ERR_INVALID, "a parameter's size differs");
        r->counts[i] = counts[i];
        r->offsets[i] = r->total;
        r->total += counts[i];
        most = counts[i] > most ? counts[i] : most;
    }
    if (!(r->params = calloc(r->total + 1, sizeof(float))) ||
        !(r->grads = calloc(r->total + 1, sizeof(float))) ||
        !(r->tmp = malloc(most * sizeof(float))))
        return fail(r, err, DDP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < np; i++) { /* the values move into the flat buffer */
        memcpy(r->params + r->offsets[i], p[i].data, counts[i] * sizeof(float));
        ddp_model_bind(m, i, r->params + r->offsets[i], r->grads + r->offsets[i]);
    }
    return DDP_OK;
}

void fake_res_free(fake_res *r)
{
    free(r->counts);
    free(r->offsets);
    free(r->params);
    free(r->grads);
    free(r->state[0]);
    free(r->state[1]);
    free(r->tmp);
    free(r->bound);
    free(r->klo);
    free(r->khi);
    free(r->koff);
}

/* Parameter i's kept elements [*lo, *hi) and where they start in the state buffers. */
static size_t kept(const fake_res *r, size_t i, size_t *lo, size_t *hi)
{
    *lo = r->klo ? r->klo[i] : 0;
    *hi = r->khi ? r->khi[i] : r->counts[i];
    return r->koff ? r->koff[i] : r->offsets[i];
}

float *fake_res_param(const fake_res *r, size_t i)
{
    return r->bound ? r->bound[i] : r->params + r->offsets[i];
}

/* Floats in each state buffer: every parameter's, or after keep the kept elements'. */
static size_t state_floats(const fake_res *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->np; i++)
        n += r->klo ? r->khi[i] - r->klo[i] : r->counts[i];
    return n;
}

ddp_status fake_res_optim_init(fake_res *r, int nstates, ddp_error *err)
{
    if (nstates < 1 || nstates > 2)
        return fail(r, err, DDP_ERR_INVALID, "optimizer states: 1 or 2");
    for (int s = 0; s < nstates; s++) {
        free(r->state[s]);
        if (!(r->state[s] = calloc(state_floats(r) + 1, sizeof(float))))
            return fail(r, err, DDP_ERR_NOMEM, "out of memory");
    }
    r->nstates = nstates;
    return DDP_OK;
}

/* ddp_optim_step_range's arithmetic: the gradient scaled first (here into a copy). */
ddp_status fake_res_optim_step(fake_res *r, const ddp__cuda_optim_args *a, ddp_error *err)
{
    if (a->i >= r->np || a->lo > a->hi || a->hi > r->counts[a->i] ||
        r->nstates < (a->adamw ? 2 : 1))
        return fail(r, err, DDP_ERR_INVALID, "bad optimizer step");
    size_t klo, khi, off = kept(r, a->i, &klo, &khi), n = a->hi - a->lo;
    off += a->lo - klo;
    if (n && (a->lo < klo || a->hi > khi))
        return fail(r, err, DDP_ERR_INVALID, "optimizer step outside the kept state");
    const float *gr = a->grad_dev + a->lo;
    if (a->grad_scale != 1.0f) {
        for (size_t k = 0; k < n; k++)
            r->tmp[k] = gr[k] * a->grad_scale;
        gr = r->tmp;
    }
    float *p = fake_res_param(r, a->i) + a->lo;
    if (a->adamw)
        ddp_nn_adamw_step(p, gr, r->state[0] + off, r->state[1] + off, n, a->lr, a->beta1, a->beta2,
                          a->eps, a->weight_decay, a->step);
    else
        ddp_nn_sgd_step(p, gr, r->state[0] + off, n, a->lr, a->momentum, a->weight_decay, a->step);
    return DDP_OK;
}

ddp_status fake_res_optim_state(fake_res *r, int s, float *const *host, bool to_host,
                                ddp_error *err)
{
    if (s < 0 || s >= r->nstates)
        return fail(r, err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < r->np; i++) {
        size_t lo, hi;
        float *dev = r->state[s] + kept(r, i, &lo, &hi);
        size_t bytes = (hi - lo) * sizeof(float);
        if (bytes)
            memcpy(to_host ? host[i] : dev, to_host ? dev : host[i], bytes);
    }
    return DDP_OK;
}

ddp_status fake_res_bind_params(fake_res *r, float *const *pd, ddp_error *err)
{
    if (!pd) {
        for (size_t i = 0; r->bound && i < r->np; i++)
            memcpy(r->params + r->offsets[i], r->bound[i], r->counts[i] * sizeof(float));
        free(r->bound);
        r->bound = NULL;
    } else {
        if (!r->bound && !(r->bound = calloc(r->np ? r->np : 1, sizeof(float *))))
            return fail(r, err, DDP_ERR_NOMEM, "out of memory");
        memcpy(r->bound, pd, r->np * sizeof(float *));
    }
    for (size_t i = 0; i < r->np; i++)
        ddp_model_bind(r->m, i, fake_res_param(r, i), NULL);
    return DDP_OK;
}

ddp_status fake_res_state_dev(const fake_res *r, int s, float **dev, ddp_error *err)
{
    if (s < 0 || s >= r->nstates)
        return fail(r, err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < r->np; i++) {
        size_t lo, hi;
        dev[i] = r->state[s] + kept(r, i, &lo, &hi);
    }
    return DDP_OK;
}

ddp_status fake_res_optim_keep(fake_res *r, const size_t *lo, const size_t *hi, ddp_error *err)
{
    if (!r->nstates)
        return fail(r, err, DDP_ERR_INVALID, "optim_keep before optim_init");
    size_t n = 0, cnt = r->np ? r->np : 1;
    for (size_t i = 0; i < r->np; i++) {
        size_t a, z;
        kept(r, i, &a, &z);
        if (lo[i] > hi[i] || lo[i] < a || hi[i] > z)
            return fail(r, err, DDP_ERR_INVALID, "optim_keep: a range can only narrow");
        n += hi[i] - lo[i];
    }
    size_t *nlo = malloc(cnt * sizeof *nlo), *nhi = malloc(cnt * sizeof *nhi),
           *noff = malloc(cnt * sizeof *noff);
    float *fresh[2] = {NULL, NULL};
    bool ok = nlo && nhi && noff;
    for (int s = 0; s < r->nstates && ok; s++)
        ok = (fresh[s] = calloc(n + 1, sizeof(float))) != NULL;
    if (!ok) {
        free(nlo), free(nhi), free(noff), free(fresh[0]), free(fresh[1]);
        return fail(r, err, DDP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0, off = 0; i < r->np; off += hi[i] - lo[i], i++) {
        size_t a, z, from = kept(r, i, &a, &z);
        from += lo[i] - a;
        for (int s = 0; s < r->nstates; s++)
            memcpy(fresh[s] + off, r->state[s] + from, (hi[i] - lo[i]) * sizeof(float));
        nlo[i] = lo[i], nhi[i] = hi[i], noff[i] = off;
    }
    for (int s = 0; s < r->nstates; s++) {
        free(r->state[s]);
        r->state[s] = fresh[s];
    }
    free(r->klo), free(r->khi), free(r->koff);
    r->klo = nlo, r->khi = nhi, r->koff = noff;
    return DDP_OK;
}

bool fake_res_inject_inf(int *calls)
{
    const char *at = getenv("DDP_TEST_FAKE_GPU_INF_AT"),
               *who = getenv("DDP_TEST_FAKE_GPU_INF_RANK");
    const char *rank = getenv("RANK");
    return at && atoi(at) == ++*calls && atoi(who ? who : "0") == atoi(rank ? rank : "0");
}

ddp_status fake_res_pass_ready(void *ctx, size_t i)
{
    fake_marks *k = ctx;
    if (i == 0 && k->inf)
        k->first[0] += INFINITY;
    return k->ready ? k->ready(k->ctx, i) : DDP_OK;
}
