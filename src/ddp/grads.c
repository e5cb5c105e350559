/*
 * grads.c — reading and scaling the reduced gradients, after finish (reducer_int.h): the L2 norm
 * of the whole mean gradient (for clipping; sharded, one small allreduce over the shards) and
 * fp16 loss scaling's unscale with its found-inf flag. Both read this rank's mean only: its shard
 * when sharded. On a GPU group the work is the group's device operations, on its stream.
 * Not here: the reduction that produced the mean (reducer.c) and acting on the found-inf verdict
 * (ddp/amp.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ddp/reducer_int.h"
#include "kernels/kernels.h"

/* The sum of squares of this rank's mean gradient on the GPU: a bucket's elements in this rank's
 * shard are one contiguous range of it, summed on the device in double. */
static ddp_status dev_sum_squares(ddp_reducer *r, double *ss)
{
    char msg[DDP_ERRMSG_MAX];
    const void **devs = malloc(sizeof *devs * (r->nb ? r->nb : 1));
    size_t *ns = malloc(sizeof *ns * (r->nb ? r->nb : 1));
    ddp_dtype *ts = malloc(sizeof *ts * (r->nb ? r->nb : 1));
    int k = 0;
    for (size_t j = 0; devs && ns && ts && j < r->nb; j++) {
        const ddp__bucket *b = &r->b[j];
        size_t lo, hi;
        if (!ddp__reducer_my_range(r, b, &lo, &hi))
            continue;
        devs[k] = (const char *)b->mem + lo * ddp_dtype_size(b->dtype);
        ns[k] = hi - lo;
        ts[k++] = b->dtype;
    }
    ddp_status st = DDP_OK;
    *ss = 0.0;
    if (!devs || !ns || !ts)
        st = ddp__errmsg(r->err, DDP_ERR_NOMEM, "grad_norm: out of memory");
    else if (k > 0) { /* every bucket's range summed on the device, one wait */
        int64_t deadline;
        void *stream = ddp__reducer_dev_stream(r, &deadline);
        st = r->dev->sumsq(r->dev->ctx, stream, devs, ns, ts, k, ss, deadline, msg);
        if (st)
            ddp__reducer_dev_fail(r, st, "grad_norm", msg);
    }
    free(devs);
    free(ns);
    free(ts);
    return st;
}

/* Both calls below read this rank's gradients without communicating (unsharded), so a group
 * that failed before (a finish that returned an error, a peer that died) would go unnoticed:
 * the gradients it left are not the mean of every rank's. */
static ddp_status group_failed(ddp_reducer *r, const char *what)
{
    ddp_status st = ddp_group_error(r->g);
    if (st)
        return ddp__errmsg(r->err, st,
                           "%s: the process group failed earlier, so the gradients are not the "
                           "mean of every rank's: %s",
                           what, ddp_group_last_error(r->g));
    return DDP_OK;
}

ddp_status ddp_reducer_grad_norm(ddp_reducer *r, double *norm)
{
    if (!r || !norm)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "grad_norm: norm is required")
                 : DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    ddp_status st = group_failed(r, "grad_norm");
    if (st)
        return st;
    double ss = 0.0;
    if (r->dev) {
        if ((st = dev_sum_squares(r, &ss)))
            return st;
    } else {
        for (size_t i = 0; i < r->nparams; i++) {
            size_t lo, hi;
            ddp_reducer_shard(r, i, &lo, &hi); /* element lo: in the bucket, or the shard */
            ss += ddp__sum_squares(ddp_reducer_shard_grad(r, i), hi - lo, r->params[i].dtype);
        }
    }
    if (r->shard) {
        double all;
        if ((st = ddp__reducer_ctl(r, false, &ss, &all, 1, DDP_FLOAT64, DDP_SUM)))
            return ddp__reducer_errctx(r, st, "grad_norm");
        ss = all;
    }
    *norm = sqrt(ss);
    return DDP_OK;
}

/* g[0..n) *= inv_scale on the host; whether any of them was inf or NaN before. */
static bool unscale_host(float *g, size_t n, float inv_scale)
{
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        found |= !isfinite(g[i]);
        g[i] *= inv_scale;
    }
    return found;
}

ddp_status ddp_reducer_unscale(ddp_reducer *r, float inv_scale, bool *found_inf)
{
    if (!r || !found_inf)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "unscale: found_inf is required")
                 : DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    if (r->dev_st)
        return r->dev_st;
    ddp_status gst = group_failed(r, "unscale");
    if (gst)
        return gst;
    bool found = false;
    if (r->home) { /* rebuilt (CPU, unsharded): the gradients are in their homes, not in the
                      staging copies */
        for (size_t i = 0; i < r->nparams; i++)
            if (r->params[i].dtype != DDP_FLOAT32)
                return ddp__errmsg(r->err, DDP_ERR_INVALID,
                                   "unscale: '%s' holds %s gradients; loss scaling takes float32 "
                                   "parameters",
                                   r->params[i].name, ddp_dtype_name(r->params[i].dtype));
        for (size_t i = 0; i < r->nparams; i++)
            found |= unscale_host(r->grad[i], r->params[i].count, inv_scale);
        *found_inf = found;
        return DDP_OK;
    }
    for (size_t k = 0; k < r->nb; k++) {
        const ddp__bucket *b = &r->b[k];
        if (b->dtype != DDP_FLOAT32)
            return ddp__errmsg(r->err, DDP_ERR_INVALID,
                               "unscale: bucket %zu holds %s gradients; loss scaling takes float32 "
                               "parameters",
                               k, ddp_dtype_name(b->dtype));
        size_t lo, hi;
        if (!ddp__reducer_my_range(r, b, &lo, &hi))
            continue;
        /* sharded gradients: element lo of the bucket is the shard's first */
        float *g = r->sgrads ? (float *)b->sgrad : (float *)b->mem + lo;
        if (!r->dev) {
            found |= unscale_host(g, hi - lo, inv_scale);
            continue;
        }
        char msg[DDP_ERRMSG_MAX];
        int64_t deadline;
        void *stream = ddp__reducer_dev_stream(r, &deadline);
        bool part = false;
        ddp_status st =
            r->dev->unscale(r->dev->ctx, stream, g, hi - lo, inv_scale, &part, deadline, msg);
        if (st)
            return ddp__reducer_dev_fail(r, st, "unscale", msg);
        found |= part;
    }
    *found_inf = found;
    return DDP_OK;
}
