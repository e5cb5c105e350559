/*
 * kernels/cuda/resident.cu — the device-resident optimizer's state and the bound parameters
 * (resident.cuh), one implementation for the GPT and the MLP/CNN. The kernels are optim.cu's
 * AdamW and devmath.cu's SGD; this file only lays the state out like the parameters and hands
 * each a parameter's slice. It does not know the models: their layout comes in at init.
 * UNVERIFIED: written without a GPU (the code moved from gpt.cu and classifier.cu, run on the
 * emulated module only); see docs/gpu.md.
 */
#include <stdlib.h>
#include <string.h>

#include "resident.cuh"

extern "C" {
#include "kernels/cuda/devmath.h"
}

void ddp__cuda_resident_init(ddp__cuda_resident *r, const char *name, ddp__cuda_ctx *ctx, size_t np,
                             size_t total, const size_t *counts, const size_t *offsets,
                             float *params)
{
    r->name = name;
    r->ctx = ctx;
    r->np = np;
    r->total = total;
    r->counts = counts;
    r->offsets = offsets;
    r->params = params;
}

void ddp__cuda_resident_free(ddp__cuda_resident *r)
{
    ddp__cuda_free(r->ost[0]);
    ddp__cuda_free(r->ost[1]);
    free(r->bound);
    free(r->klo);
    free(r->khi);
    free(r->koff);
    r->ost[0] = r->ost[1] = NULL;
    r->bound = NULL;
    r->klo = r->khi = r->koff = NULL;
    r->kept_total = 0;
    r->nstates = 0;
}

/* Floats in each state buffer: every parameter's, or after keep the kept elements'. */
static size_t state_floats(const ddp__cuda_resident *r)
{
    return r->klo ? r->kept_total : r->total;
}

/* The runtime's current device is per thread: make the model's current (see gpt.cu). */
static ddp_status use_device(const ddp__cuda_resident *r, ddp_error *err)
{
    return ddp__cuda_check(cudaSetDevice(r->ctx->device), "cudaSetDevice", err);
}

ddp_status ddp__cuda_resident_optim_init(ddp__cuda_resident *r, int nstates, ddp_error *err)
{
    if (nstates < 1 || nstates > 2)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "%s: %d optimizer states (1 or 2)", r->name,
                              nstates);
    /* Made zeroed at their first use (a step, a copy, a view; keep first narrows them for
     * nothing), as torch's AdamW makes its moments at the first step: a sharded job then never
     * holds the whole state on a GPU, not even at start. Made already: zeroed again now. */
    ddp_status st = use_device(r, err);
    for (int s = 0; s < 2 && !st; s++)
        if (r->ost[s] && s >= nstates) {
            ddp__cuda_free(r->ost[s]);
            r->ost[s] = NULL;
        } else if (r->ost[s])
            st = ddp__cuda_memset0(r->ctx, r->ost[s], sizeof(float) * state_floats(r), err);
    if (!st)
        r->nstates = nstates;
    return st ? st : ddp__cuda_sync(r->ctx, err);
}

/* The state buffers, made (zeroed) at their first use. */
static ddp_status made(ddp__cuda_resident *r, ddp_error *err)
{
    size_t n = state_floats(r);
    ddp_status st = DDP_OK;
    for (int s = 0; s < r->nstates && !st; s++) {
        if (r->ost[s])
            continue;
        void *d = NULL;
        if ((st = ddp__cuda_malloc(&d, sizeof(float) * (n ? n : 1), err))) {
            /* made at the first step, not at start: say what it is and what makes it fit —
             * narrowed by keep, the state is a shard already (shard_optimizer is on), and
             * what is left is fewer ranks on this GPU, more GPUs, or a smaller job */
            char why[sizeof err->msg] = "";
            if (err)
                snprintf(why, sizeof why, "%s", err->msg);
            const double mib = 1024.0 * 1024.0;
            if (r->klo)
                return ddp__cuda_fail(
                    err, st,
                    "%s: the optimizer's state %d of %d (%.1f MiB of device memory, this rank's "
                    "shard of %.1f MiB, made at its first use) does not fit: %s; HINT: the "
                    "optimizer is sharded already: put fewer ranks on each GPU, spread the job "
                    "over more GPUs (each rank keeps 1/world), or use a smaller model, "
                    "batch_size or block_size",
                    r->name, s + 1, r->nstates, (double)(sizeof(float) * n) / mib,
                    (double)(sizeof(float) * r->total) / mib, why);
            return ddp__cuda_fail(
                err, st,
                "%s: the optimizer's state %d of %d (%.1f MiB of device memory, made at its first "
                "use) does not fit: %s; HINT: shard_optimizer true (2 or more ranks) keeps 1/world "
                "of it per rank, or use a smaller model, batch_size or block_size",
                r->name, s + 1, r->nstates, (double)(sizeof(float) * n) / mib, why);
        }
        r->ost[s] = (float *)d;
        st = ddp__cuda_memset0(r->ctx, r->ost[s], sizeof(float) * n, err);
    }
    return st;
}

ddp_status ddp__cuda_resident_optim_step(ddp__cuda_resident *r, const ddp__cuda_optim_args *a,
                                         ddp_error *err)
{
    if (a->i >= r->np || a->lo > a->hi || a->hi > r->counts[a->i] ||
        r->nstates < (a->adamw ? 2 : 1))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "%s: optimizer step of elements [%zu, %zu) of parameter %zu "
                              "(%zu states made)",
                              r->name, a->lo, a->hi, a->i, (size_t)r->nstates);
    size_t klo, khi, koff = ddp__cuda_resident_kept(r, a->i, &klo, &khi);
    if (a->lo < a->hi && (a->lo < klo || a->hi > khi))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "%s: optimizer step of elements [%zu, %zu) of parameter %zu, but the "
                              "state of [%zu, %zu) only is kept (optim_keep): step the reducer's "
                              "shard",
                              r->name, a->lo, a->hi, a->i, klo, khi);
    if (a->lo == a->hi)
        return DDP_OK;
    ddp_status st = use_device(r, err);
    if (st || (st = made(r, err)))
        return st;
    size_t off = koff + (a->lo - klo), n = a->hi - a->lo;
    float *p = ddp__cuda_resident_param(r, a->i) + a->lo;
    const float *grad = a->grad_dev + a->lo;
    if (a->adamw)
        return ddp__cuda_adamw(r->ctx, p, grad, r->ost[0] + off, r->ost[1] + off, n, a->lr,
                               a->beta1, a->beta2, a->eps, a->weight_decay, a->step, a->grad_scale,
                               NULL, err);
    char msg[DDP_ERRMSG_MAX];
    if ((st = ddp__devmath_sgd((void *)r->ctx->stream, p, grad, r->ost[0] + off, n, a->lr,
                               a->momentum, a->weight_decay, a->step, a->grad_scale, msg)))
        return ddp__cuda_fail(err, st, "%s: %s", r->name, msg);
    return DDP_OK;
}

ddp_status ddp__cuda_resident_optim_state(ddp__cuda_resident *r, int s, float *const *host,
                                          bool to_host, ddp_error *err)
{
    if (s < 0 || s >= r->nstates)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "%s: no optimizer state %d (%d made)", r->name,
                              s, r->nstates);
    ddp_status st = use_device(r, err);
    if (!st)
        st = made(r, err);
    for (size_t i = 0; i < r->np && !st; i++) {
        size_t lo, hi;
        float *dev = r->ost[s] + ddp__cuda_resident_kept(r, i, &lo, &hi);
        size_t bytes = sizeof(float) * (hi - lo);
        if (bytes)
            st = to_host ? ddp__cuda_to_host(r->ctx, host[i], dev, bytes, err)
                         : ddp__cuda_to_device(r->ctx, dev, host[i], bytes, err);
    }
    return st;
}

ddp_status ddp__cuda_resident_bind_params(ddp__cuda_resident *r, float *const *params_dev,
                                          ddp_error *err)
{
    ddp_status st = use_device(r, err);
    if (st)
        return st;
    if (!params_dev) { /* the values back into the flat buffer, which serves again */
        for (size_t i = 0; r->bound && i < r->np && !st; i++)
            st = ddp__cuda_check(cudaMemcpyAsync(r->params + r->offsets[i], r->bound[i],
                                                 sizeof(float) * r->counts[i],
                                                 cudaMemcpyDeviceToDevice, r->ctx->stream),
                                 "cudaMemcpyAsync", err);
        if (!st && (st = ddp__cuda_sync(r->ctx, err)) == DDP_OK) {
            free(r->bound);
            r->bound = NULL;
        }
        return st;
    }
    for (size_t i = 0; i < r->np; i++)
        if (!params_dev[i])
            return ddp__cuda_fail(err, DDP_ERR_INVALID,
                                  "%s: bind_params: parameter %zu has no array", r->name, i);
    if (!r->bound && !(r->bound = (float **)calloc(r->np ? r->np : 1, sizeof(float *))))
        return ddp__cuda_fail(err, DDP_ERR_NOMEM, "%s: out of host memory", r->name);
    memcpy(r->bound, params_dev, sizeof(float *) * r->np);
    return DDP_OK;
}

ddp_status ddp__cuda_resident_state_dev(ddp__cuda_resident *r, int s, float **dev, ddp_error *err)
{
    if (s < 0 || s >= r->nstates)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "%s: no optimizer state %d (%d made)", r->name,
                              s, r->nstates);
    ddp_status st = use_device(r, err);
    if (st || (st = made(r, err)) || (st = ddp__cuda_sync(r->ctx, err)))
        return st;
    for (size_t i = 0; i < r->np; i++) {
        size_t lo, hi;
        dev[i] = r->ost[s] + ddp__cuda_resident_kept(r, i, &lo, &hi);
    }
    return DDP_OK;
}

ddp_status ddp__cuda_resident_optim_keep(ddp__cuda_resident *r, const size_t *lo, const size_t *hi,
                                         ddp_error *err)
{
    if (!r->nstates)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "%s: optim_keep before optim_init (no state to narrow)", r->name);
    if (r->np && (!lo || !hi))
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "%s: optim_keep: no ranges", r->name);
    size_t n = 0;
    for (size_t i = 0; i < r->np; i++) {
        size_t a, z;
        ddp__cuda_resident_kept(r, i, &a, &z);
        if (lo[i] > hi[i] || lo[i] < a || hi[i] > z)
            return ddp__cuda_fail(err, DDP_ERR_INVALID,
                                  "%s: optim_keep: elements [%zu, %zu) of parameter %zu, but it "
                                  "keeps the state of [%zu, %zu) only: a range can only narrow",
                                  r->name, lo[i], hi[i], i, a, z);
        n += hi[i] - lo[i];
    }
    /* Everything new first (the lists, then the state buffers, the kept slices copied in), so
     * that a failure changes nothing; the old buffers go last. State not made yet (all zeros)
     * is only narrowed: made at its first use, at the kept size. */
    size_t cnt = r->np ? r->np : 1;
    size_t *nlo = (size_t *)malloc(sizeof(size_t) * cnt),
           *nhi = (size_t *)malloc(sizeof(size_t) * cnt),
           *noff = (size_t *)malloc(sizeof(size_t) * cnt);
    float *fresh[2] = {NULL, NULL};
    ddp_status st = nlo && nhi && noff
                        ? use_device(r, err)
                        : ddp__cuda_fail(err, DDP_ERR_NOMEM, "%s: out of host memory", r->name);
    for (int s = 0; s < r->nstates && !st && r->ost[s]; s++) {
        void *d = NULL;
        if ((st = ddp__cuda_malloc(&d, sizeof(float) * (n ? n : 1), err)))
            break;
        fresh[s] = (float *)d;
        for (size_t i = 0, off = 0; i < r->np && !st; off += hi[i] - lo[i], i++) {
            size_t a, z, from = ddp__cuda_resident_kept(r, i, &a, &z);
            from += lo[i] - a;
            if (hi[i] > lo[i])
                st = ddp__cuda_check(cudaMemcpyAsync(fresh[s] + off, r->ost[s] + from,
                                                     sizeof(float) * (hi[i] - lo[i]),
                                                     cudaMemcpyDeviceToDevice, r->ctx->stream),
                                     "cudaMemcpyAsync", err);
        }
    }
    if (!st && fresh[0])
        st = ddp__cuda_sync(r->ctx, err);
    if (st) {
        ddp__cuda_free(fresh[0]);
        ddp__cuda_free(fresh[1]);
        free(nlo);
        free(nhi);
        free(noff);
        return st;
    }
    for (size_t i = 0, off = 0; i < r->np; off += hi[i] - lo[i], i++) {
        nlo[i] = lo[i];
        nhi[i] = hi[i];
        noff[i] = off;
    }
    for (int s = 0; s < r->nstates; s++) { /* NULL where not made yet */
        ddp__cuda_free(r->ost[s]);
        r->ost[s] = fresh[s];
    }
    free(r->klo);
    free(r->khi);
    free(r->koff);
    r->klo = nlo;
    r->khi = nhi;
    r->koff = noff;
    r->kept_total = n;
    return DDP_OK;
}
