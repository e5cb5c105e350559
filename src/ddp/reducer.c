/*
 * reducer.c — gradient buckets reduced while backward runs (include/ddp/reducer.h): the handle's
 * life and the step. Creation checks, lays out and broadcasts; mark_ready launches every bucket
 * that is complete and whose predecessors have started (so every rank issues the same sequence of
 * collectives); finish launches the rest, waits, and leaves the mean in every gradient. How the
 * parts fit, and where each lives: reducer_int.h.
 * Not here: what the gradients are (the model) and the optimizer.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer_int.h"
#include "kernels/kernels.h"

ddp_status ddp__reducer_ctl(ddp_reducer *r, bool gather, const void *send, void *recv, size_t count,
                            ddp_dtype t, ddp_op op)
{
    ddp_status st = ddp__group_host_collective(r->g, gather, send, recv, count, t, op);
    return st ? ddp__errmsg(r->err, st, "%s", ddp_group_last_error(r->g)) : DDP_OK;
}

ddp_status ddp__reducer_errctx(ddp_reducer *r, ddp_status st, const char *fmt, ...)
{
    char ctx[DDP_ERRMSG_MAX], m[DDP_ERRMSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    ddp__vfmt(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    ddp__fmt(m, sizeof m, "%s", r->err);
    return ddp__errmsg(r->err, st, "%s: %s", ctx, m);
}

ddp_status ddp__reducer_gone(const ddp_reducer *r)
{
    return r->g ? DDP_OK : DDP_ERR_CLOSED;
}

/* What r holds of its group (bucket memory, staging, unfinished work), given back. */
static void free_group_memory(ddp_reducer *r)
{
    for (size_t i = 0; i < r->nb; i++)
        ddp__reducer_free_bucket(r, &r->b[i]);
    for (size_t i = 0; i < r->nhome; i++)
        ddp__reducer_release(r, r->home[i].mem, r->home[i].arena);
    free(r->home);
    r->home = NULL;
    r->nhome = 0;
    r->nb = 0;
    if (r->pool)
        ddp__reducer_release(r, r->pool, r->pool_arena);
    r->pool = NULL;
}

/* The group is being destroyed before r (ddp__group_dep): r gives its memory back, and from now
 * on its calls fail with this message. */
static void group_gone(void *ctx)
{
    ddp_reducer *r = ctx;
    free_group_memory(r);
    r->g = NULL;
    ddp__errmsg(r->err, DDP_ERR_CLOSED,
                "the reducer's group was destroyed (ddp_group_destroy) before the reducer, and "
                "its gradients with it: destroy the reducer first, then its group");
}

/* A copy of the list ps (n entries) and of its names, so that the caller's array may go once
 * create returns (a local array in a helper); data still points at the caller's values. NULL
 * when n is 0 or out of memory (*nomem says which). */
static ddp_param *copy_list(const ddp_param *ps, size_t n, bool *nomem)
{
    *nomem = false;
    if (n == 0)
        return NULL;
    ddp_param *c = calloc(n, sizeof *c);
    if (!c) {
        *nomem = true;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        c[i] = ps[i];
        if (!(c[i].name = strdup(ps[i].name))) {
            while (i-- > 0)
                free((void *)c[i].name);
            free(c);
            *nomem = true;
            return NULL;
        }
    }
    return c;
}

static void free_list(const ddp_param *ps, size_t n)
{
    for (size_t i = 0; ps && i < n; i++)
        free((void *)ps[i].name);
    free((void *)ps);
}

static ddp_status broadcast_list(ddp_reducer *r, const ddp_param *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ps[i].count == 0) /* the same on every rank (checks.c): nothing to send */
            continue;
        ddp_status st = ddp_broadcast(r->g, ps[i].data, ps[i].count, ps[i].dtype, 0);
        if (st)
            return ddp__errmsg(r->err, st, "broadcasting '%s' from rank 0: %s", ps[i].name,
                               ddp_group_last_error(r->g));
    }
    return DDP_OK;
}

ddp_status ddp_reducer_create(ddp_group *g, const ddp_param *params, size_t nparams,
                              const ddp_param *buffers, size_t nbuffers,
                              const ddp_reducer_opts *opts, ddp_reducer **out, ddp_error *err)
{
    ddp_reducer_opts def = DDP_REDUCER_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!g)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_reducer_create: g is required");
    const ddp__devops *dev = ddp__group_devops(g, NULL, NULL);
    ddp_status st;
    if (!out || (nparams && !params) || (nbuffers && !buffers))
        st = ddp__err(err, DDP_ERR_INVALID,
                      "ddp_reducer_create: out, and the lists when their counts are not 0, are "
                      "required");
    else
        st = ddp__reducer_check_args(g, dev, params, nparams, buffers, nbuffers, opts, err);
    if (st) { /* the other ranks wait in the first check: tell them, rather than leave them
                 to find "collectives differ" in their next one */
        ddp__reducer_refuse_on_peers(g);
        return st;
    }
    ddp_reducer *r = calloc(1, sizeof *r);
    if (!r)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
    r->g = g;
    r->dep = (ddp__group_dep){group_gone, r, NULL};
    ddp__group_add_dep(g, &r->dep);
    r->dev = dev;
    bool nomem_p, nomem_b;
    r->params = copy_list(params, nparams, &nomem_p);
    r->nparams = r->params ? nparams : 0;
    r->buffers = copy_list(buffers, nbuffers, &nomem_b);
    r->nbuffers = r->buffers ? nbuffers : 0;
    if (nomem_p || nomem_b) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
        ddp__reducer_refuse_on_peers(g); /* they wait in the first check */
        goto out_fail;
    }
    r->o = *opts;
    if (r->o.bucket_cap == 0)
        r->o.bucket_cap = (size_t)25 << 20;
    if (r->o.first_bucket == 0)
        r->o.first_bucket = r->o.bucket_cap;
    r->sync = true;
    ddp_reducer_overlap ov = r->o.overlap;
    const char *set = ddp_group_world(g)->settings.overlap; /* DDP_OVERLAP */
    if (ov == DDP_OVERLAP_AUTO && !strcmp(set, "async"))
        ov = DDP_OVERLAP_ASYNC;
    else if (ov == DDP_OVERLAP_AUTO && !strcmp(set, "inline"))
        ov = DDP_OVERLAP_INLINE;
    if (ov == DDP_OVERLAP_AUTO) {
        /* One rank has nothing to overlap: handing its no-op allreduce to the progress thread
         * (another core, which then pulls the gradients into its cache) cost about 80 µs per
         * MB-step. A GPU group always overlaps: its progress thread only issues and waits
         * (napping), while inline would make the thread that queues backward's kernels wait for
         * the GPU at every bucket, leaving the GPU idle until it queues the next ones. */
        ov = ddp_group_size(g) > 1 && (r->dev || ddp_group_core_to_spare(g))
                 ? DDP_OVERLAP_ASYNC
                 : DDP_OVERLAP_INLINE;
    }
    r->async = ov == DDP_OVERLAP_ASYNC;
    r->W = ddp_group_size(g);
    r->me = ddp_group_rank(g);
    r->shard = r->o.shard_optimizer && r->W > 1;
    r->sgrads = r->shard && r->o.shard_gradients;
    /* Not rebuilt: sharded (the shard a rank steps, and the optimizer state it keeps, are keyed
     * by the layout) and on a GPU group (the staging copies would have to be ordered on the
     * group's stream; not done yet). */
    r->rebuild = r->o.rebuild_buckets && !r->shard && !dev && nparams > 1 ? DDP__REBUILD_RECORD
                                                                          : DDP__REBUILD_DONE;
    st = DDP_ERR_NOMEM;
    size_t n1 = nparams ? nparams : 1;
    r->order = malloc(sizeof(size_t) * n1);
    r->bucket_of = malloc(sizeof(size_t) * n1);
    r->off = malloc(sizeof(size_t) * n1);
    r->grad = calloc(n1, sizeof(void *));
    r->pdata = calloc(n1, sizeof(void *));
    r->ready = calloc(n1, sizeof(bool));
    r->b = calloc(n1, sizeof(ddp__bucket));
    r->seen = malloc(sizeof(size_t) * n1);
    if (!r->order || !r->bucket_of || !r->off || !r->grad || !r->pdata || !r->ready || !r->b ||
        !r->seen) {
        ddp__err(err, st, "out of memory creating the reducer");
        ddp__reducer_refuse_on_peers(g);
        goto out_fail;
    }
    if ((st = ddp__reducer_check_ranks(r, err)) || (st = ddp__reducer_lay_out(r, err)))
        goto out_fail;
    if (r->o.broadcast_params && ((st = broadcast_list(r, params, nparams)) ||
                                  (st = broadcast_list(r, buffers, nbuffers)))) {
        ddp__err(err, st, "%s", r->err);
        goto out_fail;
    }
    if (r->shard && (st = ddp__reducer_dev_quiesce(r, "the parameters' copy"))) {
        ddp__err(err, st, "%s", r->err);
        goto out_fail;
    }
    for (size_t i = 0; i < nparams; i++) {
        size_t bytes = params[i].count * ddp_dtype_size(params[i].dtype);
        if (r->pdata[i] == params[i].data || bytes == 0)
            continue;
        if (!r->dev)
            memcpy(r->pdata[i], params[i].data, bytes);
        else if ((st = ddp_group_memcpy(g, r->pdata[i], params[i].data, bytes))) {
            ddp__err(err, st, "copying '%s' into the reducer: %s", params[i].name,
                     ddp_group_last_error(g));
            goto out_fail;
        }
    }
    ddp_reducer_zero_grad(r);
    if (r->dev_st) {
        st = ddp__err(err, r->dev_st, "%s", r->err);
        goto out_fail;
    }
    *out = r;
    return DDP_OK;

out_fail:
    ddp_reducer_destroy(r);
    return st;
}

void ddp_reducer_destroy(ddp_reducer *r)
{
    if (!r)
        return;
    if (r->g) { /* else the group's destroy gave it all back already */
        free_group_memory(r);
        ddp__group_remove_dep(r->g, &r->dep);
    }
    free_list(r->params, r->nparams);
    free_list(r->buffers, r->nbuffers);
    free(r->seen);
    free(r->order);
    free(r->bucket_of);
    free(r->off);
    free(r->grad);
    free(r->pdata);
    free(r->ready);
    free(r->b);
    free(r->slot_off);
    free(r->slot_size);
    free(r->slot_busy);
    free(r);
}

void *ddp_reducer_grad(ddp_reducer *r, size_t i)
{
    if (!r || !r->g || i >= r->nparams)
        return NULL;
    if (r->sgrads) { /* where it is while its bucket holds a pool buffer (pool.c) */
        const ddp__bucket *b = &r->b[r->bucket_of[i]];
        return b->has_buf ? (char *)b->mem + r->off[i] * ddp_dtype_size(b->dtype) : NULL;
    }
    return r->grad[i];
}

void *ddp_reducer_param(ddp_reducer *r, size_t i)
{
    return r && r->g && i < r->nparams ? r->pdata[i] : NULL;
}

void ddp_reducer_zero_grad(ddp_reducer *r)
{
    if (!r || !r->g)
        return;
    if (r->dev) {
        char msg[DDP_ERRMSG_MAX];
        void *stream = ddp__reducer_dev_stream(r, NULL);
        for (size_t i = 0; i < r->nb && !r->dev_st; i++) {
            ddp_status st = r->dev->memset0(r->dev->ctx, stream, r->b[i].mem,
                                            r->b[i].padded * ddp_dtype_size(r->b[i].dtype), msg);
            if (st)
                r->dev_st = ddp__reducer_dev_fail(r, st, "zeroing the gradients", msg);
        }
    } else if (r->sgrads) { /* the shards; pool buffers are zeroed when taken */
        ddp__reducer_pool_zero(r);
    } else if (r->home) { /* rebuilt: the gradients live in the old buckets' memory */
        for (size_t i = 0; i < r->nhome; i++)
            memset(r->home[i].mem, 0, r->home[i].bytes);
    } else {
        for (size_t i = 0; i < r->nb; i++)
            memset(r->b[i].mem, 0, r->b[i].padded * ddp_dtype_size(r->b[i].dtype));
    }
    r->consumed = false;
    r->join_err = DDP_OK; /* a step the count failed ends here */
    r->step_start = ddp_now_seconds();
    memset(&r->stats, 0, sizeof r->stats);
    r->stats.first_launch = -1;
}

void ddp_reducer_set_sync(ddp_reducer *r, bool sync)
{
    if (r)
        r->sync = sync;
}

static void reset_step(ddp_reducer *r)
{
    for (size_t i = 0; i < r->nb; i++) {
        r->b[i].pending = (int)(r->b[i].last - r->b[i].first);
        r->b[i].launched = false;
    }
    memset(r->ready, 0, sizeof(bool) * r->nparams);
    r->next_launch = 0;
}

static ddp_status launch(ddp_reducer *r, ddp__bucket *b)
{
    ddp_status st;
    /* sharded gradients: a bucket nothing acquired reduces zeros from a fresh buffer */
    if (r->sgrads && !b->has_buf && (st = ddp__reducer_pool_take(r, b)))
        return ddp__reducer_errctx(r, st, "bucket %zu", (size_t)(b - r->b));
    void *buf = b->mem;
    ddp_dtype t = b->dtype;
    if (b->staged)
        ddp__reducer_stage(r, b, true);
    if (b->wire) {
        if (!r->dev) {
            ddp__from_f32(b->wire, b->mem, b->padded, DDP_BFLOAT16);
        } else { /* on the stream: the collective is ordered after it */
            char msg[DDP_ERRMSG_MAX];
            if ((st = r->dev->convert(r->dev->ctx, ddp__reducer_dev_stream(r, NULL), b->wire,
                                      DDP_BFLOAT16, b->mem, DDP_FLOAT32, b->padded, msg)))
                return ddp__reducer_dev_fail(r, st, "rounding a bucket to bfloat16", msg);
        }
        buf = b->wire;
        t = DDP_BFLOAT16;
    }
    /* Sharding: block me of the bucket receives the mean of everyone's block me. A step of
     * uneven inputs dividing by the ranks that trained sums, and divides after (join.c). */
    void *mine = (char *)buf + b->block * (size_t)r->me * ddp_dtype_size(t);
    ddp_op op = r->join_div ? DDP_SUM : DDP_AVG;
    if (r->async && r->shard) {
        st = ddp_reduce_scatter_async(r->g, buf, mine, b->block, t, op, &b->work);
    } else if (r->async) {
        st = ddp_allreduce_async(r->g, buf, buf, b->count, t, op, &b->work);
    } else {
        double t0 = ddp_now_seconds();
        st = r->shard ? ddp_reduce_scatter(r->g, buf, mine, b->block, t, op)
                      : ddp_allreduce(r->g, buf, buf, b->count, t, op);
        r->stats.comm_seconds += ddp_now_seconds() - t0;
        b->inline_done = st == DDP_OK && !r->sgrads;
        if (r->sgrads) /* into the shard now: the buffer goes back to the pool */
            ddp__reducer_pool_land(r, b, st == DDP_OK);
    }
    if (b->work)
        b->seq = r->launches++;
    if (st)
        return ddp__errmsg(r->err, st, "bucket %zu: %s", (size_t)(b - r->b),
                           ddp_group_last_error(r->g));
    b->launched = true;
    r->stats.buckets++;
    if (r->stats.first_launch < 0)
        r->stats.first_launch = ddp_now_seconds() - r->step_start;
    return DDP_OK;
}

/* Launches every bucket that is complete and whose predecessors have started. */
static ddp_status launch_ready(ddp_reducer *r, bool force)
{
    while (r->next_launch < r->nb && (force || r->b[r->next_launch].pending == 0)) {
        ddp_status st = launch(r, &r->b[r->next_launch]);
        if (st)
            return st;
        r->next_launch++;
    }
    return DDP_OK;
}

/* A synced step opens (its first mark_ready, or a finish with nothing marked): with uneven
 * inputs on, the ranks still training are counted first (join.c: a rank out of inputs that did
 * not join fails there, by name, and a step that fails every rank or that nobody trains does
 * nothing else), then the pending rebuild runs, then the per-step state is reset. */
static ddp_status open_step(ddp_reducer *r)
{
    ddp_status st = ddp__reducer_join_count(r);
    if (!st && !r->join_all && r->rebuild == DDP__REBUILD_PENDING)
        st = ddp__reducer_rebuild(r);
    reset_step(r);
    return st;
}

/* Whether a step may go on (what: "mark_ready" or "finish"): not while a sharded step waits to
 * be gathered or its gradients to be zeroed, nor after a device failure (its message is already
 * in r->err). DDP_OK when it may. */
static ddp_status step_refused(ddp_reducer *r, const char *what)
{
    if (r->awaiting)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "%s: the last sharded step was not gathered; call "
                           "ddp_reducer_gather_params after the optimizer step",
                           what);
    if (r->consumed)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "%s: after a sharded step the gradients hold the mean only in this "
                           "rank's shard; call ddp_reducer_zero_grad before the next backward",
                           what);
    return r->dev_st;
}

/* For a call that would return DDP_OK without communicating (a mark_ready that completes no
 * bucket, a no_sync micro-step): the group's error if it failed before (a peer died, a timeout,
 * an abort), since no step can be reduced any more; before 2026-11-25 such calls said DDP_OK and
 * a loop went on computing steps that could never be reduced. The message of the call that met
 * the failure (with its context: the bucket, what join's count means) stays if r->err holds it;
 * else the group's, with `what`. */
static ddp_status group_failed(ddp_reducer *r, const char *what)
{
    ddp_status gst = ddp_group_error(r->g);
    if (gst == DDP_OK)
        return DDP_OK;
    char head[65];
    ddp__fmt(head, sizeof head, "%s", ddp_group_last_error(r->g));
    if (head[0] && strstr(r->err, head))
        return gst;
    return ddp__errmsg(r->err, gst, "%s: the group failed before: %s", what,
                       ddp_group_last_error(r->g));
}

ddp_status ddp_reducer_mark_ready(ddp_reducer *r, size_t i)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    if (i >= r->nparams)
        return ddp__errmsg(r->err, DDP_ERR_INVALID, "mark_ready: no parameter %zu", i);
    if (r->joined)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "mark_ready: this rank has joined (ddp_reducer_join: it ran out of "
                           "inputs) and trains again only after every rank has; call "
                           "ddp_reducer_join until it says no other rank trains");
    if (r->join_err) /* the count failed this step: the rest of its marks must not count again */
        return r->join_err;
    if (r->step_err) /* this step's reduction failed: the step ends at finish, with it */
        return ddp__errmsg(r->err, r->step_err, "%s", r->step_msg);
    ddp_status st = step_refused(r, "mark_ready");
    if (st)
        return st;
    /* Sharded gradients reduce every micro-step (no full gradient to accumulate into). */
    if (!r->sync && !r->sgrads)
        return group_failed(r, "mark_ready");
    if (!r->step_open) {
        if ((st = open_step(r)))
            return st;
        r->step_open = true;
        r->micro_closed = false;
    }
    if (r->ready[i])
        return ddp__errmsg(
            r->err, DDP_ERR_INVALID,
            "mark_ready: '%s' was already marked this step (call finish between steps)",
            r->params[i].name);
    r->ready[i] = true;
    if (r->rebuild == DDP__REBUILD_RECORD)
        r->seen[r->nseen++] = i;
    r->b[r->bucket_of[i]].pending--;
    /* A failed reduction (a dead group) poisons the step: the caller's next mark_ready said
     * "already marked", or reduced later buckets, instead of this failure. */
    if ((st = launch_ready(r, false))) {
        r->step_err = st;
        ddp__fmt(r->step_msg, sizeof r->step_msg, "%s", r->err);
        return st;
    }
    if (r->sgrads && !r->sync && r->next_launch == r->nb) {
        /* a no_sync micro-step whose every bucket is on its way: it ends here, its buckets land
         * as the pool needs their buffers or at finish; the next mark_ready opens the next */
        r->step_open = false;
        r->micro_closed = true;
    }
    return group_failed(r, "mark_ready"); /* nothing was started: say so if it never can be */
}

/* The reduced bfloat16 gradients back into the float32 bucket: all, or my block (sharded). */
static ddp_status unwire(ddp_reducer *r, ddp__bucket *b)
{
    float *dst = b->mem;
    size_t lo = r->shard ? b->block * (size_t)r->me : 0, hi = r->shard ? lo + b->block : b->count;
    if (!r->dev) {
        ddp__to_f32(dst + lo, b->wire + lo, hi - lo, DDP_BFLOAT16);
        return DDP_OK;
    }
    char msg[DDP_ERRMSG_MAX];
    ddp_status st = r->dev->convert(r->dev->ctx, ddp__reducer_dev_stream(r, NULL), dst + lo,
                                    DDP_FLOAT32, b->wire + lo, DDP_BFLOAT16, hi - lo, msg);
    return st ? ddp__reducer_dev_fail(r, st, "widening a reduced bfloat16 bucket", msg) : DDP_OK;
}

/* A reduced bucket lands in the gradients: bfloat16 widened back into the bucket, a staging copy
 * emptied into the gradients' homes (the latter even when the former failed). */
static ddp_status land(ddp_reducer *r, ddp__bucket *b)
{
    ddp_status st = b->wire ? unwire(r, b) : DDP_OK;
    if (b->staged)
        ddp__reducer_stage(r, b, false);
    return st;
}

/* Waits for bucket b's reduction, counts its time and frees its work. */
ddp_status ddp__reducer_wait_bucket(ddp_reducer *r, ddp__bucket *b)
{
    ddp_status st = ddp_work_wait(b->work);
    double s, e;
    ddp_work_timing(b->work, &s, &e);
    r->stats.comm_seconds += e - s;
    ddp_work_free(b->work);
    b->work = NULL;
    return st;
}

ddp_status ddp_reducer_finish(ddp_reducer *r)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    if (r->joined) /* its synced steps are join's: one more here would be one the others lack */
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "finish: this rank has joined (ddp_reducer_join: it ran out of "
                           "inputs); call ddp_reducer_join, which takes part in the others' "
                           "steps, until it says no other rank trains");
    return ddp__reducer_finish_step(r);
}

ddp_status ddp__reducer_finish_step(ddp_reducer *r)
{
    ddp_status st = r->join_err;
    if (st) { /* the count failed the step at its first mark_ready: it ends here, as it did */
        r->join_err = DDP_OK;
        return st;
    }
    st = step_refused(r, "finish");
    if (st)
        return st;
    if (!r->sync && !r->sgrads)
        return group_failed(r, "finish");
    if (r->micro_closed && !r->step_open) { /* sharded gradients: only what is in flight */
        r->next_launch = r->nb;
    } else if (!r->step_open && (st = open_step(r))) { /* nothing was marked: reduce all now */
        r->join_err = DDP_OK;
        return st;
    }
    r->micro_closed = false;
    r->step_open = false;
    if (r->join_all) /* every rank has joined (join.c): nothing to reduce */
        return DDP_OK;
    /* Poisoned at mark_ready: nothing more is started; what is in flight is waited for below. */
    st = r->step_err ? r->step_err : launch_ready(r, true);
    double t0 = ddp_now_seconds();
    for (size_t i = 0; i < r->nb; i++) {
        ddp__bucket *b = &r->b[i];
        if (b->inline_done) {
            ddp_status s1 = land(r, b);
            st = st ? st : s1;
        }
        b->inline_done = false;
        if (!b->work)
            continue;
        if (r->sgrads) { /* waited for, and into the shard */
            ddp_status s3 = ddp__reducer_pool_settle(r, b);
            if (s3 && !st)
                st = s3;
            continue;
        }
        ddp_status s2 = ddp__reducer_wait_bucket(r, b);
        if (s2 && !st)
            st = ddp__errmsg(r->err, s2, "%s", ddp_group_last_error(r->g));
        if (!s2) {
            ddp_status s1 = land(r, b);
            st = st ? st : s1;
        }
    }
    if (r->step_err) { /* the step ends with the failure that poisoned it */
        ddp__errmsg(r->err, r->step_err, "%s", r->step_msg);
        r->step_err = DDP_OK;
    }
    if (st == DDP_OK)
        st = ddp__reducer_join_divide(r);
    ddp__reducer_record_end(r, st == DDP_OK);
    r->stats.wait_seconds = ddp_now_seconds() - t0;
    /* sharded gradients: the shards accumulate; a no_sync micro-step awaits no optimizer step */
    r->awaiting = r->shard && st == DDP_OK && r->sync;
    r->consumed = r->awaiting && !r->sgrads;
    if (!r->async) /* inline: every moment of communication was spent by the caller */
        r->stats.wait_seconds += r->stats.comm_seconds;
    double c = r->stats.comm_seconds;
    r->stats.hidden_fraction = c > 0 ? 1.0 - r->stats.wait_seconds / c : 1.0;
    if (r->stats.hidden_fraction < 0)
        r->stats.hidden_fraction = 0;
    if (r->stats.hidden_fraction > 1)
        r->stats.hidden_fraction = 1;
    return st;
}

ddp_status ddp_reducer_sync_buffers(ddp_reducer *r)
{
    if (!r)
        return DDP_ERR_INVALID;
    return r->g ? broadcast_list(r, r->buffers, r->nbuffers) : ddp__reducer_gone(r);
}

void ddp_reducer_stats_get(const ddp_reducer *r, ddp_reducer_stats *out)
{
    if (r && out)
        *out = r->stats;
}

size_t ddp_reducer_num_buckets(const ddp_reducer *r)
{
    return r ? r->nb : 0;
}

size_t ddp_reducer_bucket_of(const ddp_reducer *r, size_t i)
{
    return r && i < r->nparams ? r->bucket_of[i] : SIZE_MAX;
}

bool ddp_reducer_rebuilt(const ddp_reducer *r)
{
    return r && r->home;
}

const char *ddp_reducer_last_error(const ddp_reducer *r)
{
    return r ? r->err : "no reducer";
}
