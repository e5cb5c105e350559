/*
 * join.c — uneven inputs (torch's DistributedDataParallel.join and its Join context manager;
 * include/ddp/reducer.h). With join on, every synced step opens with an allreduce of one integer:
 * 1 from a rank that trains, 0 from a rank that ran out of inputs. A joined rank spends its
 * time in ddp_reducer_join, which runs the same synced step as the others — the count, then every
 * bucket, with zero gradients — so the collectives match and nobody waits for a rank that has
 * nothing more to give. The mean lands in the joined rank's gradients too: it steps its optimizer
 * with them and stays identical to the others (torch instead broadcasts the last joiner's model
 * at the end). A count of 0 means every rank has joined: nothing is reduced and the epoch is over.
 * Not here: the step itself (reducer.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"
#include "kernels/kernels.h"

ddp_status ddp_reducer_set_join(ddp_reducer *r, const ddp_join_opts *opts, bool enable)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    ddp_join_opts def = DDP_JOIN_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (enable && r->o.shard_gradients) /* the same on every rank (compared at creation) */
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "set_join: not available with shard_gradients (ZeRO-2) yet: its no_sync "
                           "micro-steps communicate, which a joined rank cannot match; use "
                           "shard_optimizer alone");
    if (r->step_open)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "set_join: a step is open (mark_ready was called since the last "
                           "finish); call it between steps, on every rank");
    /* Compared across ranks: a rank that does not count would leave the others' count waiting
     * for a collective it never issues. */
    int W = r->W;
    int32_t mine[3] = {enable, enable && opts->divide_by_initial_world_size,
                       enable && opts->throw_on_early_termination};
    int32_t *all = malloc(sizeof(int32_t) * 3 * (size_t)W);
    if (!all)
        return ddp__errmsg(r->err, DDP_ERR_NOMEM, "set_join: out of memory");
    ddp_status st = ddp__reducer_ctl(r, true, mine, all, 3, DDP_INT32, DDP_SUM);
    if (st) {
        free(all);
        return ddp__reducer_errctx(r, st, "set_join (comparing the ranks' join options)");
    }
    static const char *const names[3] = {"enable", "divide_by_initial_world_size",
                                         "throw_on_early_termination"};
    for (int k = 0; k < W && !st; k++)
        for (int i = 0; i < 3 && !st; i++)
            if (all[3 * k + i] != mine[i])
                st = ddp__errmsg(r->err, DDP_ERR_INVALID,
                                 "set_join: %s is %s on rank %d but %s on rank %d: every rank "
                                 "must call ddp_reducer_set_join at the same point with the "
                                 "same options",
                                 names[i], mine[i] ? "true" : "false", r->me,
                                 all[3 * k + i] ? "true" : "false", k);
    free(all);
    if (st)
        return st;
    r->join_on = enable;
    r->jo = *opts;
    r->joined = r->join_all = false;
    r->join_div = 0;
    r->join_steps = 0;
    r->join_err = DDP_OK;
    return DDP_OK;
}

/* The ranks that sent 0 (joined), for the message of throw_on_early_termination. */
static void name_joined(ddp_reducer *r, char *out, size_t cap)
{
    int32_t v = !r->joined;
    int32_t *all = malloc(sizeof(int32_t) * (size_t)r->W);
    out[0] = '\0';
    if (!all || ddp__reducer_ctl(r, true, &v, all, 1, DDP_INT32, DDP_SUM)) {
        ddp__fmt(out, cap, "some rank");
        free(all);
        return;
    }
    int n = 0;
    for (int k = 0; k < r->W; k++)
        n += !all[k];
    size_t len = (size_t)snprintf(out, cap, "%s", n > 1 ? "ranks " : "rank ");
    for (int k = 0, i = 0; k < r->W && len + 16 < cap; k++)
        if (!all[k])
            len += (size_t)snprintf(out + len, cap - len, "%s%d", i++ ? ", " : "", k);
    free(all);
}

ddp_status ddp__reducer_join_count(ddp_reducer *r)
{
    r->join_all = false;
    r->join_div = 0;
    if (!r->join_on)
        return DDP_OK;
    int32_t v = !r->joined, n = 0;
    ddp_status st = ddp__reducer_ctl(r, false, &v, &n, 1, DDP_INT32, DDP_SUM);
    if (st)
        return ddp__reducer_errctx(r, st,
                                   "counting the ranks still training (join: a rank out of "
                                   "inputs must call ddp_reducer_join until every rank has)");
    r->join_steps++;
    r->stats.joined = r->W - n;
    if (n == 0) {
        r->join_all = true;
        r->join_steps = 0; /* the epoch is over: the next step is the next epoch's first */
        return DDP_OK;
    }
    if (n < r->W && r->jo.throw_on_early_termination) {
        char who[200];
        name_joined(r, who, sizeof who);
        /* The epoch ends on every rank: whoever had joined trains again from the next step (as
         * after every rank joined), and the rest of this step's marks do not count again. */
        r->joined = false;
        r->join_err = DDP_ERR_CLOSED;
        /* The step within the epoch, as a training loop counts it: join_steps went on across
         * epochs before 2026-11-25 (a second epoch's throw at its step 2 said "step 7"). */
        long long step = (long long)r->join_steps;
        r->join_steps = 0;
        return ddp__errmsg(r->err, DDP_ERR_CLOSED,
                           "%s ran out of inputs before the others' synced step %lld of this "
                           "epoch (join's throw_on_early_termination): the step is not taken on "
                           "any rank; give every rank the same number of batches "
                           "(ddp_sampler pads them) or turn throw_on_early_termination off",
                           who, step);
    }
    if (n < r->W && !r->jo.divide_by_initial_world_size)
        r->join_div = n;
    return DDP_OK;
}

/* Device buckets: the division is devops' reduce of one source (ddp__scale_avg's arithmetic, so
 * the bits are the host path's), on the backend's stream after the group's, waited for from the
 * host — the optimizer's kernels that follow on the group's stream need no event. A step with a
 * rank joined is rare enough for that wait. */
static ddp_status join_divide_dev(ddp_reducer *r)
{
    char msg[DDP_ERRMSG_MAX];
    int64_t deadline;
    void *stream = ddp__reducer_dev_stream(r, &deadline);
    const ddp__devops *d = r->dev;
    ddp_status st = d->after(d->ctx, stream, NULL, msg);
    for (size_t k = 0; k < r->nb && !st; k++) {
        const ddp__bucket *b = &r->b[k];
        size_t lo, hi;
        if (!ddp__reducer_my_range(r, b, &lo, &hi))
            continue;
        void *p = (char *)b->mem + lo * ddp_dtype_size(b->dtype);
        const void *src[1] = {p};
        st = d->reduce(d->ctx, p, src, 1, hi - lo, b->dtype, DDP_SUM, r->join_div, msg);
    }
    if (!st)
        st = d->sync(d->ctx, deadline, msg);
    return st ? ddp__reducer_dev_fail(r, st, "dividing by the ranks that trained (join)", msg)
              : DDP_OK;
}

ddp_status ddp__reducer_join_divide(ddp_reducer *r)
{
    if (r->join_div <= 1)
        return DDP_OK;
    if (r->dev)
        return join_divide_dev(r);
    if (r->home) { /* rebuilt: the gradients are in their homes */
        for (size_t i = 0; i < r->nparams; i++)
            ddp__scale_avg(r->grad[i], r->params[i].count, r->params[i].dtype, r->join_div);
        return DDP_OK;
    }
    for (size_t k = 0; k < r->nb; k++) {
        const ddp__bucket *b = &r->b[k];
        size_t lo, hi;
        if (ddp__reducer_my_range(r, b, &lo, &hi))
            ddp__scale_avg((char *)b->mem + lo * ddp_dtype_size(b->dtype), hi - lo, b->dtype,
                           r->join_div);
    }
    return DDP_OK;
}

ddp_status ddp_reducer_join(ddp_reducer *r, bool *others)
{
    if (!r || !others)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "join: others is required")
                 : DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    if (!r->join_on)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "join: uneven inputs are not on; call ddp_reducer_set_join(r, NULL, "
                           "true) on every rank before the training loop");
    if (r->step_open)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "join: a step is open (mark_ready was called since the last finish); "
                           "call ddp_reducer_finish first");
    if (r->awaiting)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "join: the last sharded step was not gathered; call "
                           "ddp_reducer_gather_params after the optimizer step");
    bool sync = r->sync;
    r->joined = true;
    r->sync = true; /* the others' synced steps are the ones to match */
    ddp_reducer_zero_grad(r);
    ddp_status st = ddp__reducer_finish_step(r);
    r->sync = sync;
    if (st)
        return st;
    *others = !r->join_all;
    if (r->join_all) /* the epoch is over everywhere: every rank trains again from the next step */
        r->joined = r->join_all = false;
    return DDP_OK;
}
