/*
 * rebuild.c — the reducer's one bucket rebuild (torch's _rebuild_buckets with
 * sync_bucket_indices; reducer_int.h): the first synced step's ready order is recorded (by
 * mark_ready, completed here at the step's end), and at the start of the second synced step the
 * buckets are cut again along rank 0's record. The gradients never move: a new bucket views a
 * range of the old buckets' memory (the gradients' home) or has a staging copy, which stage()
 * fills at launch and empties after the reduction.
 * Not here: when a step opens and closes (reducer.c) and the first cut (buckets.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"

void ddp__reducer_stage(ddp_reducer *r, ddp__bucket *b, bool to_stage)
{
    size_t esz = ddp_dtype_size(b->dtype);
    for (size_t k = b->first; k < b->last; k++) {
        size_t p = r->order[k], bytes = r->params[p].count * esz;
        char *s = (char *)b->mem + r->off[p] * esz;
        if (bytes)
            memcpy(to_stage ? s : r->grad[p], to_stage ? r->grad[p] : s, bytes);
    }
}

/* The parameters never marked (reduced by finish) follow the marked ones, in bucket order, so
 * the record is a whole permutation. */
void ddp__reducer_record_end(ddp_reducer *r, bool ok)
{
    if (r->rebuild != DDP__REBUILD_RECORD)
        return;
    if (!ok) { /* a failed step: the group is gone, or its ranks disagree; keep the layout */
        r->rebuild = DDP__REBUILD_DONE;
        return;
    }
    r->record_marked = r->nseen > 0; /* a rank that had joined (join.c) marked nothing */
    for (size_t k = 0; k < r->nparams; k++)
        if (!r->ready[r->order[k]])
            r->seen[r->nseen++] = r->order[k];
    r->rebuild = DDP__REBUILD_PENDING;
}

/* torch's _rebuild_buckets with sync_bucket_indices: the buckets are cut again along the order in
 * which the first synced step marked the gradients ready — rank 0's, broadcast, so that every
 * rank issues the same collectives whatever its own order was. Runs at the start of the second
 * synced step, when no bucket is in flight, and only where every rank reduces its buckets on the
 * progress thread (async): reduced inline, the order changes nothing but the copies' cost
 * (measured: bench/RESULTS.md). The gradients do not move (every pointer from
 * ddp_reducer_grad stays valid): a new bucket whose parameters already lie side by side in one
 * old bucket, in any order, reduces them there in place; any other gets a staging copy, filled
 * at launch and copied back after the reduction (torch's gradient_as_bucket_view=False). Where a
 * rank cannot get memory for a staging copy, every rank keeps the old layout (not an error). */
ddp_status ddp__reducer_rebuild(ddp_reducer *r)
{
    r->rebuild = DDP__REBUILD_DONE; /* once, whatever happens */
    size_t n = r->nparams, W = (size_t)r->W;
    ddp_status st = DDP_ERR_NOMEM;
    size_t row = n + 2; /* the order, async, whether it marked anything */
    int64_t *mine = calloc(row, sizeof(int64_t)), *all = malloc(sizeof(int64_t) * row * W);
    size_t *no = malloc(sizeof(size_t) * n), *nbo = malloc(sizeof(size_t) * n);
    size_t *noff = malloc(sizeof(size_t) * n);
    bool *hit = calloc(n, sizeof(bool));
    ddp__bucket *nb = calloc(n, sizeof(ddp__bucket));
    ddp__home_mem *home = calloc(r->nb, sizeof(ddp__home_mem));
    int32_t *flags = malloc(sizeof(int32_t) * (2 * n + 1));
    size_t nn = 0;
    if (!mine || !all || !no || !nbo || !noff || !hit || !nb || !home || !flags) {
        ddp__errmsg(r->err, st, "rebuilding the gradient buckets: out of memory");
        goto out;
    }
    for (size_t k = 0; k < n; k++)
        mine[k] = k < r->nseen ? (int64_t)r->seen[k] : -1;
    mine[n] = r->async; /* overlap may differ across ranks: rebuild only if async on every one */
    mine[n + 1] = r->record_marked;
    /* An allgather rather than a broadcast: ctl stages it on any group. Rank 0's row wins, or,
     * where rank 0 had already joined (uneven inputs) and marked nothing, the first row of a
     * rank that trained: a joined rank's record is only the buckets' order. */
    if ((st = ddp__reducer_ctl(r, true, mine, all, row, DDP_INT64, DDP_SUM))) {
        ddp__reducer_errctx(r, st, "rebuilding the gradient buckets (rank 0's ready order)");
        goto out;
    }
    st = DDP_OK;
    size_t src = 0;
    for (size_t k = W; k-- > 0;) {
        if (!all[k * row + n])
            goto out; /* inline somewhere: a bucket is reduced on the caller's thread whatever
                         the order, so a new layout gains nothing there, and its copies cost */
        if (all[k * row + n + 1])
            src = k;
    }
    for (size_t k = 0; k < n; k++) {
        int64_t p = all[src * row + k];
        if (p < 0 || (size_t)p >= n || hit[p])
            goto out; /* not a permutation (cannot happen): keep the layout */
        hit[p] = true;
        no[k] = (size_t)p;
    }
    nn = ddp__reducer_partition(r, no, nb, nbo);
    /* In place where the new bucket's parameters fill one range of one old bucket. */
    for (size_t j = 0; j < nn; j++) {
        ddp__bucket *c = &nb[j];
        size_t h = r->bucket_of[no[c->first]], lo = SIZE_MAX, hi = 0, sum = 0;
        bool one = true;
        for (size_t k = c->first; k < c->last; k++) {
            size_t p = no[k];
            one = one && r->bucket_of[p] == h;
            lo = r->off[p] < lo ? r->off[p] : lo;
            hi = r->off[p] + r->params[p].count > hi ? r->off[p] + r->params[p].count : hi;
            sum += r->params[p].count;
        }
        size_t esz = ddp_dtype_size(c->dtype), off = 0;
        c->staged = !(one && hi - lo == sum);
        for (size_t k = c->first; k < c->last; k++) {
            size_t p = no[k];
            noff[p] = c->staged ? off : r->off[p] - lo;
            off += r->params[p].count;
        }
        if (!c->staged) {
            c->mem = (char *)r->b[h].mem + lo * esz;
            c->arena = r->b[h].arena;
        } else {
            c->mem = ddp__reducer_buffer(r, c->padded * esz, &c->arena);
            c->owns_mem = true;
        }
        if (ddp__reducer_wants_wire(r, c->dtype))
            c->wire = ddp__reducer_buffer(r, c->padded * 2, &c->wire_arena);
        flags[2 * j] = c->arena;
        flags[2 * j + 1] = c->wire_arena;
    }
    /* As creation (buckets.c): arena memory only where every rank has it; all ranks or none
     * rebuild. */
    if ((st = ddp__reducer_ctl(r, false, flags, flags, 2 * nn, DDP_INT32, DDP_MIN)))
        goto out_msg;
    bool ok = true;
    for (size_t j = 0; j < nn; j++) {
        ddp__bucket *c = &nb[j];
        bool wire = ddp__reducer_wants_wire(r, c->dtype);
        if (c->owns_mem)
            ddp__reducer_settle(r, &c->mem, &c->arena, flags[2 * j],
                                c->padded * ddp_dtype_size(c->dtype));
        if (wire)
            ddp__reducer_settle(r, (void **)&c->wire, &c->wire_arena, flags[2 * j + 1],
                                c->padded * 2);
        ok = ok && c->mem && (c->wire || !wire);
    }
    int32_t okm = ok, oka = 0;
    if ((st = ddp__reducer_ctl(r, false, &okm, &oka, 1, DDP_INT32, DDP_MIN)))
        goto out_msg;
    if (!oka)
        goto out; /* no memory for it somewhere: every rank keeps the old layout */
    /* Commit: the old buckets' memory becomes the gradients' home. */
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        home[i] = (ddp__home_mem){b->mem, b->arena, b->padded * ddp_dtype_size(b->dtype)};
        ddp__reducer_release(r, b->wire, b->wire_arena);
        ddp_work_free(b->work);
    }
    r->home = home;
    r->nhome = r->nb;
    home = NULL;
    free(r->b);
    r->b = nb;
    r->nb = nn;
    nb = NULL;
    memcpy(r->order, no, sizeof(size_t) * n);
    memcpy(r->bucket_of, nbo, sizeof(size_t) * n);
    memcpy(r->off, noff, sizeof(size_t) * n);
    goto out;
out_msg:
    ddp__reducer_errctx(r, st, "rebuilding the gradient buckets");
out:
    for (size_t j = 0; nb && j < nn; j++) /* what was allocated for a layout not taken */
        ddp__reducer_free_bucket(r, &nb[j]);
    free(nb);
    free(home);
    free(mine);
    free(all);
    free(no);
    free(nbo);
    free(noff);
    free(hit);
    free(flags);
    return st;
}
