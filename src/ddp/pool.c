/*
 * pool.c — sharded gradients (ZeRO-2, opts.shard_gradients; include/ddp/reducer.h): no rank holds
 * the whole gradient. Each bucket keeps this rank's block of the mean in a persistent shard
 * (sgrad, private memory, 1/W of the bucket); backward writes whole gradients into pool buffers,
 * one per bucket while it is being filled or reduced, each a fixed slot of one pool (arena memory
 * under shm, so the reduce_scatter runs in place; ddp__reducer_pool_size lays the slots out). A
 * bucket takes a slot, zeroed, at its first ddp_reducer_grad_acquire (or at its launch if nothing
 * acquired it) and gives it back once its reduce_scatter is done and its block was added into
 * the shard. When no slot is free, taking waits for the oldest bucket in flight (the group's
 * deadline); when nothing is in flight the pool is too small for what is being filled at once,
 * and taking fails saying so.
 * Not here: the launch and finish (reducer.c), the layout of the buckets (buckets.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"
#include "kernels/kernels.h"

size_t ddp__reducer_pool_need(const ddp__bucket *b)
{
    size_t bytes = b->padded * ddp_dtype_size(b->dtype);
    return bytes ? (bytes + 63) / 64 * 64 : 64;
}

ddp_status ddp__reducer_pool_size(ddp_reducer *r, ddp_error *err)
{
    size_t l1 = 0, l2 = 0, big = 0;
    for (size_t k = 0; k < r->nb; k++) {
        size_t n = ddp__reducer_pool_need(&r->b[k]);
        if (n > l1) {
            l2 = l1;
            l1 = n;
            big = k;
        } else if (n > l2) {
            l2 = n;
        }
    }
    if (!l2)
        l2 = l1;
    /* The largest bucket may stay held across the whole backward (the GPT's tied embedding gets
     * its gradient at the head first and at the embedding last) while two fill at once (a
     * layer's weight and bias on either side of a bucket boundary): by default slot 0 of the
     * largest bucket's size and two of the second largest's. Fixed slots, not first fit: a
     * small bucket's buffer (the 1 MiB first one) left between two large ones cannot keep a
     * third from fitting. */
    size_t want = r->o.grad_pool ? (r->o.grad_pool + 63) / 64 * 64 : l1 + 2 * l2;
    if (want < l1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "grad_pool of %zu bytes cannot hold bucket %zu (%zu bytes): give at "
                        "least that, or 0 for the default (the largest bucket + 2 x the second "
                        "largest, %zu bytes)",
                        r->o.grad_pool, big, l1, l1 + 2 * l2);
    size_t n1 = r->nb ? r->nb : 1;
    r->slot_off = malloc(sizeof(size_t) * n1);
    r->slot_size = malloc(sizeof(size_t) * n1);
    r->slot_busy = calloc(n1, sizeof(bool));
    if (!r->slot_off || !r->slot_size || !r->slot_busy)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
    r->nslots = 1 + (want - l1) / l2; /* no more than the buckets could use */
    if (r->nslots > n1)
        r->nslots = n1;
    for (size_t s = 0; s < r->nslots; s++) {
        r->slot_size[s] = s ? l2 : l1;
        r->slot_off[s] = s ? l1 + (s - 1) * l2 : 0;
    }
    r->pool_bytes = l1 + (r->nslots - 1) * l2;
    return DDP_OK;
}

/* The free slot that fits need bytes best (the small ones first: slot 0, the largest bucket's,
 * stays free for it), or SIZE_MAX. */
static size_t find_slot(const ddp_reducer *r, size_t need)
{
    size_t best = SIZE_MAX;
    for (size_t s = r->nslots; s-- > 0;)
        if (!r->slot_busy[s] && r->slot_size[s] >= need &&
            (best == SIZE_MAX || r->slot_size[s] < r->slot_size[best]))
            best = s;
    return best;
}

void ddp__reducer_pool_land(ddp_reducer *r, ddp__bucket *b, bool ok)
{
    size_t lo, hi;
    if (ok && ddp__reducer_my_range(r, b, &lo, &hi)) {
        size_t esz = ddp_dtype_size(b->dtype);
        const char *mine = (const char *)b->mem + lo * esz;
        if (b->sfresh) /* the first reduction of the step: the mean itself, bit for bit */
            memcpy(b->sgrad, mine, (hi - lo) * esz);
        else
            ddp__reduce_into(b->sgrad, mine, hi - lo, b->dtype, DDP_SUM);
    }
    if (ok)
        b->sfresh = false;
    if (b->has_buf)
        r->slot_busy[b->slot] = false;
    b->has_buf = false;
    b->mem = NULL;
}

ddp_status ddp__reducer_pool_settle(ddp_reducer *r, ddp__bucket *b)
{
    ddp_status st = ddp__reducer_wait_bucket(r, b);
    if (st)
        ddp__errmsg(r->err, st, "bucket %zu: %s", (size_t)(b - r->b), ddp_group_last_error(r->g));
    ddp__reducer_pool_land(r, b, st == DDP_OK);
    return st;
}

ddp_status ddp__reducer_pool_take(ddp_reducer *r, ddp__bucket *b)
{
    ddp_status st;
    if (b->work && (st = ddp__reducer_pool_settle(r, b))) /* an earlier micro-step's */
        return st;
    if (b->has_buf)
        return DDP_OK;
    size_t need = ddp__reducer_pool_need(b);
    for (;;) {
        size_t at = find_slot(r, need);
        if (at != SIZE_MAX) {
            b->slot = at;
            r->slot_busy[at] = true;
            b->mem = r->pool + r->slot_off[at];
            b->has_buf = true;
            memset(b->mem, 0, need);
            return DDP_OK;
        }
        ddp__bucket *old = NULL;
        for (size_t k = 0; k < r->nb; k++)
            if (r->b[k].work && (!old || r->b[k].seq < old->seq))
                old = &r->b[k];
        if (!old) {
            size_t held = 0, n = 0;
            for (size_t k = 0; k < r->nb; k++)
                if (r->b[k].has_buf) {
                    held += ddp__reducer_pool_need(&r->b[k]);
                    n++;
                }
            return ddp__errmsg(r->err, DDP_ERR_INVALID,
                               "the gradient pool (%zu bytes in %zu slots) cannot hold bucket %zu "
                               "(%zu bytes) beside the %zu bucket(s) still being filled (%zu "
                               "bytes) and none is in flight to wait for: raise grad_pool (0: the "
                               "largest bucket + 2 x the second largest)",
                               r->pool_bytes, r->nslots, (size_t)(b - r->b), need, n, held);
        }
        if ((st = ddp__reducer_pool_settle(r, old)))
            return st;
    }
}

void ddp__reducer_pool_zero(ddp_reducer *r)
{
    for (size_t k = 0; k < r->nb; k++) {
        ddp__bucket *b = &r->b[k];
        if (b->work) { /* a step that was not finished: its reductions are dropped */
            (void)ddp_work_wait(b->work);
            ddp_work_free(b->work);
            b->work = NULL;
        }
        if (b->has_buf)
            r->slot_busy[b->slot] = false;
        b->has_buf = false;
        b->mem = NULL;
        if (b->sgrad)
            memset(b->sgrad, 0, b->block * ddp_dtype_size(b->dtype));
        b->sfresh = true;
    }
    r->micro_closed = false;
}

ddp_status ddp_reducer_grad_acquire(ddp_reducer *r, size_t i, void **grad)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    if (!grad || i >= r->nparams)
        return ddp__errmsg(r->err, DDP_ERR_INVALID, "grad_acquire: %s",
                           grad ? "no such parameter" : "grad is required");
    if (!r->sgrads) {
        *grad = r->grad[i];
        return DDP_OK;
    }
    *grad = NULL;
    if (r->step_err)
        return ddp__errmsg(r->err, r->step_err, "%s", r->step_msg);
    if (r->awaiting)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "grad_acquire: the last sharded step was not gathered; call "
                           "ddp_reducer_gather_params after the optimizer step");
    ddp_status gst = ddp_group_error(r->g);
    if (gst)
        return ddp__errmsg(r->err, gst, "grad_acquire: the group failed before: %s",
                           ddp_group_last_error(r->g));
    if (r->step_open && r->ready[i])
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "grad_acquire: '%s' was already marked ready this step",
                           r->params[i].name);
    ddp__bucket *b = &r->b[r->bucket_of[i]];
    ddp_status st = ddp__reducer_pool_take(r, b);
    if (st)
        return ddp__reducer_errctx(r, st, "grad_acquire '%s'", r->params[i].name);
    *grad = (char *)b->mem + r->off[i] * ddp_dtype_size(b->dtype);
    return DDP_OK;
}

void *ddp_reducer_shard_grad(ddp_reducer *r, size_t i)
{
    if (!r || !r->g || i >= r->nparams)
        return NULL;
    size_t lo, hi, esz = ddp_dtype_size(r->params[i].dtype);
    ddp_reducer_shard(r, i, &lo, &hi);
    if (!r->sgrads)
        return (char *)r->grad[i] + lo * esz;
    const ddp__bucket *b = &r->b[r->bucket_of[i]];
    if (hi == lo)
        return b->sgrad;
    return (char *)b->sgrad + (r->off[i] + lo - b->block * (size_t)r->me) * esz;
}

bool ddp_reducer_grads_sharded(const ddp_reducer *r)
{
    return r && r->sgrads;
}

size_t ddp_reducer_grad_pool_bytes(const ddp_reducer *r)
{
    return r && r->sgrads ? r->pool_bytes : 0;
}
