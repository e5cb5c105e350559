/*
 * device.c — the reducer's buckets in device memory (a GPU group: nccl or cuda-staged;
 * reducer_int.h): the group's stream and the deadline of a wait on it, a device operation's
 * failure kept on the handle, and the end of allocating the buckets, where every buffer must be
 * device memory on every rank (there is no host fallback) and starts at zero on the device.
 * Not here: the device operations themselves (group/devops.h) and the arithmetic the reducer asks
 * of them, which stays beside its host twin (reducer.c, grads.c).
 */
#include <stdint.h>
#include <stdlib.h>

#include "ddp/reducer_int.h"

void *ddp__reducer_dev_stream(const ddp_reducer *r, int64_t *deadline_ms)
{
    void *stream = NULL;
    int timeout_ms = 0;
    ddp__group_devops(r->g, &stream, &timeout_ms);
    if (deadline_ms)
        *deadline_ms = ddp__now_ms() + timeout_ms;
    return stream;
}

ddp_status ddp__reducer_dev_fail(ddp_reducer *r, ddp_status st, const char *what, const char *msg)
{
    r->dev_st = st; /* a GPU that failed (or timed out) is not trusted again: later calls say so */
    return ddp__errmsg(r->err, st, "%s on the GPU: %s", what, msg);
}

ddp_status ddp__reducer_dev_quiesce(ddp_reducer *r, const char *what)
{
    if (!r->dev)
        return DDP_OK;
    char msg[DDP_ERRMSG_MAX];
    int64_t deadline;
    void *stream = ddp__reducer_dev_stream(r, &deadline);
    ddp_status st = r->dev->wait(r->dev->ctx, stream, deadline, msg);
    return st ? ddp__reducer_dev_fail(r, st, what, msg) : DDP_OK;
}

ddp_status ddp__reducer_dev_buckets(ddp_reducer *r, int32_t *flags, ddp_error *err)
{
    bool mine = true, all = true;
    for (size_t i = 0; i < r->nb; i++) {
        const ddp__bucket *b = &r->b[i];
        bool want[3] = {true, ddp__reducer_wants_wire(r, b->dtype), r->shard};
        bool have[3] = {b->arena, b->wire_arena, b->pmem_arena};
        for (int k = 0; k < 3; k++) {
            mine = mine && (!want[k] || have[k]);
            all = all && (!want[k] || flags[3 * i + k]);
        }
    }
    free(flags);
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM,
                        "out of GPU memory for the gradient buckets on %s; HINT: a smaller "
                        "batch, model or bucket_cap leaves room",
                        mine ? "another rank" : "this rank");
    char msg[DDP_ERRMSG_MAX];
    void *stream = ddp__reducer_dev_stream(r, NULL);
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        ddp_status st = r->dev->memset0(r->dev->ctx, stream, b->mem, bytes, msg);
        if (!st && b->pmem)
            st = r->dev->memset0(r->dev->ctx, stream, b->pmem, bytes, msg);
        if (st)
            return ddp__err(err, st, "zeroing the gradient buckets on the GPU: %s", msg);
    }
    return DDP_OK;
}
