/*
 * buckets.c — the reducer's layout (reducer_int.h): parameters cut into buckets, the buckets'
 * memory, and each gradient's view into it. A buffer is arena memory (the group's: shared memory
 * under shm) only where every rank got arena memory for it, else malloc on every rank; creation
 * succeeds on every rank or on none.
 * Not here: the second layout cut along the ready order (rebuild.c), device memory's end of the
 * agreement (device.c), and what happens to the buckets in a step (reducer.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"

size_t ddp__reducer_partition(const ddp_reducer *r, const size_t *order, ddp__bucket *b,
                              size_t *bucket_of)
{
    const ddp_param *params = r->params;
    size_t nb = 0, cap = r->o.first_bucket;
    for (size_t k = 0; k < r->nparams;) {
        ddp__bucket *c = &b[nb];
        c->dtype = params[order[k]].dtype;
        c->first = k;
        size_t esz = ddp_dtype_size(c->dtype), bytes = 0;
        while (k < r->nparams && params[order[k]].dtype == c->dtype &&
               (bytes == 0 || bytes + params[order[k]].count * esz <= cap)) {
            bytes += params[order[k]].count * esz;
            bucket_of[order[k]] = nb;
            k++;
        }
        c->last = k;
        c->count = bytes / esz;
        c->padded = c->count;
        if (r->shard) { /* W blocks of whole cache lines */
            size_t line = 64 / esz, per = (c->count + (size_t)r->W - 1) / (size_t)r->W;
            c->block = (per + line - 1) / line * line;
            c->padded = c->block * (size_t)r->W;
        }
        nb++;
        cap = r->o.bucket_cap;
    }
    return nb;
}

void *ddp__reducer_buffer(ddp_reducer *r, size_t bytes, bool *arena)
{
    void *p = ddp_group_alloc(r->g, bytes);
    *arena = p != NULL;
    return p;
}

void *ddp__reducer_private_buffer(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p)
        memset(p, 0, bytes);
    return p;
}

bool ddp__reducer_settle(ddp_reducer *r, void **p, bool *arena, bool everywhere, size_t bytes)
{
    if (*arena && !everywhere) { /* a peer has none: nobody uses it */
        ddp_group_free(r->g, *p);
        *p = NULL;
        *arena = false;
    }
    if (!*p)
        *p = ddp__reducer_private_buffer(bytes);
    return *p != NULL;
}

void ddp__reducer_release(ddp_reducer *r, void *p, bool arena)
{
    if (arena)
        ddp_group_free(r->g, p);
    else
        free(p);
}

void ddp__reducer_free_bucket(ddp_reducer *r, ddp__bucket *b)
{
    ddp_work_free(b->work);
    if (b->owns_mem)
        ddp__reducer_release(r, b->mem, b->arena);
    ddp__reducer_release(r, b->wire, b->wire_arena);
    ddp__reducer_release(r, b->pmem, b->pmem_arena);
    free(b->sgrad);
    b->sgrad = NULL;
}

/* Allocates every bucket's gradients (and bf16 wire copy, and sharded parameter copy), then
 * agrees with the other ranks: a buffer stays in the arena only where it is on every rank, and
 * creation fails on every rank if it failed on one. */
static ddp_status alloc_buckets(ddp_reducer *r, ddp_error *err)
{
    size_t nflags = 3 * r->nb + 2;
    int32_t *flags = malloc(sizeof(int32_t) * nflags);
    if (!flags)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
    /* Sharded gradients: one pool instead of a buffer per bucket (pool.c), and each bucket's
     * shard of the mean in private memory. */
    if (r->sgrads)
        r->pool = ddp__reducer_buffer(r, r->pool_bytes, &r->pool_arena);
    flags[3 * r->nb] = r->pool_arena;
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        if (!r->sgrads)
            b->mem = ddp__reducer_buffer(r, bytes, &b->arena);
        else
            b->arena = true; /* no buffer of its own: nothing to agree on */
        if (ddp__reducer_wants_wire(r, b->dtype))
            b->wire = ddp__reducer_buffer(r, b->padded * 2, &b->wire_arena);
        if (r->shard)
            b->pmem = ddp__reducer_buffer(r, bytes, &b->pmem_arena);
        flags[3 * i] = b->arena;
        flags[3 * i + 1] = b->wire_arena;
        flags[3 * i + 2] = b->pmem_arena;
    }
    flags[3 * r->nb + 1] = 1;
    ddp_status st = ddp__reducer_ctl(r, false, flags, flags, nflags - 1, DDP_INT32, DDP_MIN);
    if (st) {
        free(flags);
        return ddp__err(err, st, "allocating gradient buckets: %s", r->err);
    }
    if (r->dev) /* device memory: no host fallback, and zeroed on the device */
        return ddp__reducer_dev_buckets(r, flags, err);
    bool ok = true;
    if (r->sgrads)
        ok = ddp__reducer_settle(r, (void **)&r->pool, &r->pool_arena, flags[3 * r->nb],
                                 r->pool_bytes);
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        if (r->sgrads) {
            b->arena = false;
            b->sgrad = ddp__reducer_private_buffer(b->block * ddp_dtype_size(b->dtype) + 64);
            ok = ok && b->sgrad;
        }
        struct {
            void **p;
            bool *arena;
            size_t bytes;
            bool want;
        } bufs[3] = {{&b->mem, &b->arena, bytes, true},
                     {(void **)&b->wire, &b->wire_arena, b->padded * 2,
                      ddp__reducer_wants_wire(r, b->dtype)},
                     {&b->pmem, &b->pmem_arena, bytes, r->shard}};
        bufs[0].want = !r->sgrads;
        for (int k = 0; k < 3; k++) {
            if (!bufs[k].want)
                continue;
            bool have =
                ddp__reducer_settle(r, bufs[k].p, bufs[k].arena, flags[3 * i + k], bufs[k].bytes);
            ok = ok && have;
        }
        if (b->arena && b->mem)
            memset(b->mem, 0, bytes);
        if (b->pmem_arena)
            memset(b->pmem, 0, bytes);
    }
    /* Creation succeeds on every rank or on none. */
    int32_t mine = ok, all = 0;
    st = ddp__reducer_ctl(r, false, &mine, &all, 1, DDP_INT32, DDP_MIN);
    free(flags);
    if (st)
        return ddp__err(err, st, "allocating gradient buckets: %s", r->err);
    if (!ok)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory for the gradient buckets");
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM,
                        "another rank ran out of memory for its gradient buckets");
    return DDP_OK;
}

ddp_status ddp__reducer_lay_out(ddp_reducer *r, ddp_error *err)
{
    const ddp_param *params = r->params;
    size_t nparams = r->nparams;
    for (size_t i = 0; i < nparams; i++)
        r->pdata[i] = params[i].data;
    /* Buckets in reverse registration order. */
    for (size_t k = 0; k < nparams; k++)
        r->order[k] = nparams - 1 - k;
    r->nb = ddp__reducer_partition(r, r->order, r->b, r->bucket_of);
    for (size_t i = 0; i < r->nb; i++)
        r->b[i].owns_mem = !r->sgrads; /* sharded gradients: pool buffers (pool.c) */
    ddp_status st = r->sgrads ? ddp__reducer_pool_size(r, err) : DDP_OK;
    if (st)
        return st;
    st = alloc_buckets(r, err);
    if (st)
        return st;
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        size_t off = 0, esz = ddp_dtype_size(b->dtype);
        for (size_t k = b->first; k < b->last; k++) {
            size_t p = r->order[k];
            r->grad[p] = b->mem ? (char *)b->mem + off * esz : NULL;
            r->off[p] = off;
            if (b->pmem) /* sharded: the parameters live in the reducer, laid out like this */
                r->pdata[p] = (char *)b->pmem + off * esz;
            off += params[p].count;
        }
    }
    return DDP_OK;
}
