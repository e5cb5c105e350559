/*
 * shard.c — the sharded optimizer step (ZeRO-1; reducer_int.h): which elements of each parameter,
 * and of each bucket, hold this rank's mean after finish's reduce_scatter, and the allgathers
 * that complete the parameters (in place, in the buckets' twin) and the caller's optimizer state
 * (through a scratch bucket) after the rank has stepped its shard.
 * Not here: the reduce_scatter itself, which is a bucket's launch (reducer.c), and the padding of
 * a bucket to W blocks (buckets.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"

void ddp_reducer_shard(const ddp_reducer *r, size_t i, size_t *lo, size_t *hi)
{
    size_t n = r && i < r->nparams ? r->params[i].count : 0, a = 0, z = n;
    if (n && r->shard) {
        const ddp__bucket *b = &r->b[r->bucket_of[i]];
        size_t s = b->block * (size_t)r->me, e = s + b->block, p = r->off[i];
        a = s > p ? s - p : 0;
        z = e < p ? 0 : e - p < n ? e - p : n;
        if (z < a)
            a = z = 0;
    }
    if (lo)
        *lo = a;
    if (hi)
        *hi = z;
}

bool ddp_reducer_sharded(const ddp_reducer *r)
{
    return r && r->shard;
}

bool ddp__reducer_my_range(const ddp_reducer *r, const ddp__bucket *b, size_t *lo, size_t *hi)
{
    *lo = r->shard ? b->block * (size_t)r->me : 0;
    *hi = b->count;
    if (r->shard && *lo + b->block < *hi)
        *hi = *lo + b->block;
    return *hi > *lo;
}

/* bytes from src to dst: memcpy on the CPU; on a GPU group, between any two of host and device
 * memory (ddp_group_memcpy). A failure leaves its message in r->err. */
static ddp_status copy_any(ddp_reducer *r, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return DDP_OK;
    if (!r->dev) {
        memcpy(dst, src, bytes);
        return DDP_OK;
    }
    ddp_status st = ddp_group_memcpy(r->g, dst, src, bytes);
    return st ? ddp__errmsg(r->err, st, "%s", ddp_group_last_error(r->g)) : DDP_OK;
}

/* Every rank's shard of arrays (shaped like the parameters) to every rank, through a private
 * scratch copy of each bucket in turn (malloc on every rank, or device memory on a GPU group:
 * rare, e.g. for a checkpoint; the gradients are left alone). */
static ddp_status gather(ddp_reducer *r, void *const *arrays, const char *what)
{
    if (!r || !arrays)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "%s: no arrays", what) : DDP_ERR_INVALID;
    if (r->step_open)
        return ddp__errmsg(r->err, DDP_ERR_INVALID, "%s: a step is under way; call finish first",
                           what);
    if (!r->shard)
        return DDP_OK;
    size_t most = 0;
    for (size_t k = 0; k < r->nb; k++)
        if (r->b[k].padded * ddp_dtype_size(r->b[k].dtype) > most)
            most = r->b[k].padded * ddp_dtype_size(r->b[k].dtype);
    char *mem = r->dev ? ddp_group_alloc(r->g, most) : calloc(1, most);
    int32_t mine = mem != NULL, all = 0;
    ddp_status st = ddp__reducer_ctl(r, false, &mine, &all, 1, DDP_INT32, DDP_MIN);
    if (!st && !all)
        st = ddp__errmsg(r->err, DDP_ERR_NOMEM, "out of %s memory on %s", r->dev ? "GPU" : "host",
                         mine ? "another rank" : "this rank");
    if (!st)
        st = ddp__reducer_dev_quiesce(r, "waiting for the arrays");
    for (size_t k = 0; k < r->nb && !st; k++) {
        ddp__bucket *b = &r->b[k];
        size_t esz = ddp_dtype_size(b->dtype);
        for (size_t q = b->first; q < b->last && !st; q++) {
            size_t p = r->order[q], lo, hi;
            ddp_reducer_shard(r, p, &lo, &hi);
            if (hi > lo)
                st = copy_any(r, mem + (r->off[p] + lo) * esz, (const char *)arrays[p] + lo * esz,
                              (hi - lo) * esz);
        }
        if (!st && (st = ddp_allgather(r->g, mem + b->block * (size_t)r->me * esz, mem, b->block,
                                       b->dtype)))
            ddp__errmsg(r->err, st, "%s", ddp_group_last_error(r->g));
        for (size_t q = b->first; q < b->last && !st; q++) {
            size_t p = r->order[q], lo, hi, n = r->params[p].count;
            ddp_reducer_shard(r, p, &lo, &hi);
            char *dst = arrays[p];
            const char *src = mem + r->off[p] * esz;
            if (lo > 0)
                st = copy_any(r, dst, src, lo * esz);
            if (!st && hi < n)
                st = copy_any(r, dst + hi * esz, src + hi * esz, (n - hi) * esz);
        }
        if (st)
            ddp__reducer_errctx(r, st, "%s, bucket %zu", what, k);
    }
    if (st && !strstr(r->err, what))
        ddp__reducer_errctx(r, st, "%s", what);
    if (r->dev)
        ddp_group_free(r->g, mem);
    else
        free(mem);
    return st;
}

ddp_status ddp_reducer_gather_params(ddp_reducer *r)
{
    if (!r || !r->shard)
        return r ? DDP_OK : DDP_ERR_INVALID;
    r->awaiting = false; /* after a failure the group's error is what later calls report */
    for (size_t k = 0; k < r->nb; k++) { /* in place: block me is already where it belongs */
        ddp__bucket *b = &r->b[k];
        char *mem = b->pmem;
        ddp_status st =
            ddp_allgather(r->g, mem + b->block * (size_t)r->me * ddp_dtype_size(b->dtype), mem,
                          b->block, b->dtype);
        if (st)
            return ddp__errmsg(r->err, st, "gathering the parameters, bucket %zu: %s", k,
                               ddp_group_last_error(r->g));
    }
    return DDP_OK;
}

ddp_status ddp_reducer_gather_state(ddp_reducer *r, void *const *arrays)
{
    return gather(r, arrays, "gathering optimizer state");
}
