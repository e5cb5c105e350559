/*
 * reducer.c — gradient buckets reduced while backward runs (include/ddp/reducer.h).
 *
 * Layout: parameters are taken in reverse registration order and packed into buckets (a new
 * bucket when the cap is reached or the dtype changes). Each bucket is one allocation from the
 * group's arena (shared memory under shm, so the allreduce reads and writes it in place), or
 * ordinary memory when the arena is full. A parameter's gradient is a view at its offset.
 * Launch order: bucket k starts only after buckets 0..k−1 have started, whatever order the
 * model marks gradients in, so every rank issues the same sequence of collectives.
 * Rebuild (rebuild()): once, at the start of the second synced step, the buckets are cut again
 * along the first synced step's ready order (rank 0's); the old buckets' memory stays the
 * gradients' home (r->home) and new buckets either view a range of it or stage a copy.
 * Compression: a float32 bucket can travel as bfloat16 (one rounding, sums in float32 inside
 * the backend); the conversion is done on the caller's thread at launch and after the wait.
 * Sharding (ZeRO-1): a bucket is padded to W equal blocks of whole cache lines and reduced with
 * an in-place reduce_scatter, so rank r receives the mean of block r only. The parameters then
 * live in a twin of the bucket (same layout, also in the arena), so that after the optimizer has
 * stepped block r, one in-place allgather completes them with no copy in or out. Optimizer state
 * stays in the caller's arrays: gather_state copies block r of them into the gradient bucket,
 * allgathers it and copies the rest out, which spends the gradients until zero_grad.
 * Device memory (a GPU group: nccl or cuda-staged): the parameters are device memory, and so are
 * the buckets (ddp_group_alloc on every rank, no host fallback). The host never touches them: the
 * zeroing, the bf16 conversions and the sums of squares go through the group's device operations
 * (group/devops.h) on the group's stream, so they keep their order with the model's kernels and
 * the collectives; copies through ddp_group_memcpy after the stream's work is done. The reducer's
 * own small collectives on host data (the checks across ranks, allocation flags, the norm's sum)
 * are staged through a scratch buffer in device memory, as a GPU group takes nothing else.
 * Not here: what the gradients are (the model) and the optimizer.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/reducer.h"
#include "group/devops.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/util.h"

typedef struct bucket {
    ddp_dtype dtype;
    size_t count;  /* elements */
    size_t padded; /* elements allocated: count, or W blocks of `block` when sharding */
    size_t block;  /* sharding: elements per rank */
    void *mem;     /* (padded,) gradients */
    bool arena;    /* mem came from ddp_group_alloc */
    void *pmem;    /* sharding: (padded,) the parameters' values, else NULL */
    bool pmem_arena;
    uint16_t *wire; /* (padded,) bf16 copy when compressing, else NULL */
    bool wire_arena;
    bool owns_mem;      /* mem is this bucket's allocation (else a view into a home region) */
    bool staged;        /* rebuilt: mem is a staging copy; gradients are gathered into it at
                           launch and scattered back to their home after the reduction */
    size_t first, last; /* params covered, as indices into order[] */
    int pending;        /* params not yet marked ready this step */
    bool launched;
    bool inline_done; /* reduced on the caller's thread this step */
    ddp_work *work;
} bucket;

/* Where gradients live after a rebuild: the creation-time buckets' memory, kept so that every
 * pointer ddp_reducer_grad() returned stays valid (the reducer's contract). */
typedef struct home_mem {
    void *mem;
    bool arena;
    size_t bytes;
} home_mem;

/* Bucket rebuilding (torch's _rebuild_buckets): record the first synced step's ready order,
 * rebuild at the start of the next synced step, then never again. */
enum { REBUILD_RECORD, REBUILD_PENDING, REBUILD_DONE };

struct ddp_reducer {
    ddp_group *g;
    const ddp_param *params;
    size_t nparams;
    const ddp_param *buffers;
    size_t nbuffers;
    ddp_reducer_opts o;
    size_t *order;     /* params in bucket order (reverse registration; after a rebuild the
                          ready order of the first synced step, rank 0's) */
    size_t *bucket_of; /* param i → bucket */
    size_t *off;       /* param i → its first element in its bucket */
    void **grad;       /* param i → its gradient view */
    void **pdata;      /* param i → its values */
    bool *ready;       /* param i marked this step */
    bucket *b;
    size_t nb;
    int rebuild;  /* REBUILD_*: where this reducer is in its one rebuild */
    size_t *seen; /* (nparams,) the first synced step's mark_ready order */
    size_t nseen;
    home_mem *home; /* after a rebuild: the gradients' memory (the old buckets'), else NULL */
    size_t nhome;
    size_t next_launch; /* first bucket not launched */
    bool async;         /* buckets go to the progress thread (else inline, blocking) */
    bool step_open;     /* some gradient was marked ready since the last finish */
    bool sync;
    bool shard;    /* sharded optimizer step, and more than one rank */
    bool consumed; /* sharded: finish() left the mean in my shard only; zero_grad before the
                      next backward */
    bool awaiting; /* sharded: finish() reduced, gather_params() has not run yet */
    int W, me;
    double step_start;
    const ddp__devops *dev; /* a GPU group's device operations (buckets in device memory); else
                               NULL */
    ddp_status dev_st;      /* a device operation failed where nothing could return it
                               (zero_grad): later calls return it */
    ddp_reducer_stats stats;
    char err[DDP_ERRMSG_MAX];
};

static bool float_dtype(ddp_dtype t)
{
    return t == DDP_FLOAT32 || t == DDP_FLOAT64 || t == DDP_BFLOAT16 || t == DDP_FLOAT16;
}

/* The group's stream and the deadline of a device wait starting now. */
static void *dev_stream(const ddp_reducer *r, int64_t *deadline_ms)
{
    void *stream = NULL;
    int timeout_ms = 0;
    ddp__group_devops(r->g, &stream, &timeout_ms);
    if (deadline_ms)
        *deadline_ms = ddp__now_ms() + timeout_ms;
    return stream;
}

/* A device operation's failure: recorded in r->err as "what: msg", and kept (r->dev_st). */
static ddp_status dev_fail(ddp_reducer *r, ddp_status st, const char *what, const char *msg)
{
    r->dev_st = st; /* a GPU that failed (or timed out) is not trusted again: later calls say so */
    return ddp__errmsg(r->err, st, "%s on the GPU: %s", what, msg);
}

/* The host waits until the work queued on the group's stream is done (before copies that the
 * stream's kernels may still be writing, e.g. the optimizer's). A no-op on the CPU. */
static ddp_status dev_quiesce(ddp_reducer *r, const char *what)
{
    if (!r->dev)
        return DDP_OK;
    char msg[DDP_ERRMSG_MAX];
    int64_t deadline;
    void *stream = dev_stream(r, &deadline);
    ddp_status st = r->dev->wait(r->dev->ctx, stream, deadline, msg);
    return st ? dev_fail(r, st, what, msg) : DDP_OK;
}

/* A collective on small host arrays (the reducer's own checks and flags): allgather when gather,
 * else allreduce with op; on a GPU group through its device scratch (group/devops.h). A failure
 * leaves its message in r->err. */
static ddp_status ctl(ddp_reducer *r, bool gather, const void *send, void *recv, size_t count,
                      ddp_dtype t, ddp_op op)
{
    ddp_status st = ddp__group_host_collective(r->g, gather, send, recv, count, t, op);
    return st ? ddp__errmsg(r->err, st, "%s", ddp_group_last_error(r->g)) : DDP_OK;
}

/* FNV-1a over a parameter's name, count and dtype: what ranks must agree on. */
static uint64_t param_hash(const ddp_param *p)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *c = p->name; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = (h ^ p->count) * 1099511628211ull;
    return (h ^ (uint64_t)p->dtype) * 1099511628211ull;
}

/* Checks that all ranks registered the same list; names the first difference. */
static ddp_status check_same(ddp_reducer *r, const ddp_param *ps, size_t n, const char *what,
                             ddp_error *err)
{
    int W = ddp_group_size(r->g);
    /* Per entry: its hash; plus the count of entries up front. */
    size_t m = n + 1;
    uint64_t *mine = malloc(sizeof(uint64_t) * m);
    uint64_t *all = malloc(sizeof(uint64_t) * m * (size_t)W);
    uint64_t cnt[1] = {n}, *cnts = malloc(sizeof(uint64_t) * (size_t)W);
    ddp_status st = DDP_ERR_NOMEM;
    if (!mine || !all || !cnts) {
        ddp__err(err, st, "out of memory checking %s", what);
        goto out;
    }
    if ((st = ctl(r, true, cnt, cnts, 1, DDP_INT64, DDP_SUM))) {
        ddp__err(err, st, "checking %s across ranks: %s", what, r->err);
        goto out;
    }
    for (int k = 0; k < W; k++) {
        if (cnts[k] != n) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "rank %d registered %llu %s but rank %d registered %zu: every rank must "
                          "build the same model",
                          k, (unsigned long long)cnts[k], what, ddp_group_rank(r->g), n);
            goto out;
        }
    }
    mine[0] = n;
    for (size_t i = 0; i < n; i++)
        mine[i + 1] = param_hash(&ps[i]);
    if ((st = ctl(r, true, mine, all, m, DDP_INT64, DDP_SUM))) {
        ddp__err(err, st, "checking %s across ranks: %s", what, r->err);
        goto out;
    }
    for (int k = 0; k < W; k++) {
        for (size_t i = 0; i < n; i++) {
            if (all[(size_t)k * m + i + 1] != mine[i + 1]) {
                st = ddp__err(err, DDP_ERR_INVALID,
                              "%.*s %zu ('%s', %s × %zu on rank %d) differs on rank %d (another "
                              "name, size or dtype): every rank must register the same %s in "
                              "the same order",
                              (int)strlen(what) - 1, what, i, ps[i].name,
                              ddp_dtype_name(ps[i].dtype), ps[i].count, ddp_group_rank(r->g), k,
                              what);
                goto out;
            }
        }
    }
    st = DDP_OK;
out:
    free(mine);
    free(all);
    free(cnts);
    return st;
}

/* Checks that all ranks chose the options that shape the buckets and their collectives (the
 * defaults resolved); names the first difference. Without it, a rank-dependent bucket_cap or
 * compress_bf16 surfaced later as "collectives differ" with counts that did not say why. */
static ddp_status check_opts(ddp_reducer *r, ddp_error *err)
{
    enum { N_OPTS = 6 };
    static const char *const names[N_OPTS] = {"bucket_cap",       "first_bucket",
                                              "compress_bf16",    "shard_optimizer",
                                              "broadcast_params", "rebuild_buckets"};
    uint64_t mine[N_OPTS] = {r->o.bucket_cap,      r->o.first_bucket,     r->o.compress_bf16,
                             r->o.shard_optimizer, r->o.broadcast_params, r->o.rebuild_buckets};
    int W = ddp_group_size(r->g);
    uint64_t *all = malloc(sizeof(uint64_t) * N_OPTS * (size_t)W);
    if (!all)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory checking the reducer's options");
    ddp_status st = ctl(r, true, mine, all, N_OPTS, DDP_INT64, DDP_SUM);
    if (st) {
        ddp__err(err, st, "checking the reducer's options across ranks: %s", r->err);
        goto out;
    }
    for (int k = 0; k < W && !st; k++)
        for (int i = 0; i < N_OPTS && !st; i++)
            if (all[(size_t)k * N_OPTS + (size_t)i] != mine[i])
                st = ddp__err(err, DDP_ERR_INVALID,
                              "the reducer's option %s is %llu on rank %d but %llu on rank %d: "
                              "every rank must pass the same ddp_reducer_opts (bucket_cap, "
                              "first_bucket, compress_bf16, shard_optimizer, broadcast_params, "
                              "rebuild_buckets)",
                              names[i], (unsigned long long)mine[i], ddp_group_rank(r->g),
                              (unsigned long long)all[(size_t)k * N_OPTS + (size_t)i], k);
out:
    free(all);
    return st;
}

static ddp_status broadcast_list(ddp_reducer *r, const ddp_param *ps, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (ps[i].count == 0) /* the same on every rank (check_same): nothing to send */
            continue;
        ddp_status st = ddp_broadcast(r->g, ps[i].data, ps[i].count, ps[i].dtype, 0);
        if (st)
            return ddp__errmsg(r->err, st, "broadcasting '%s' from rank 0: %s", ps[i].name,
                               ddp_group_last_error(r->g));
    }
    return DDP_OK;
}

/* One buffer of a bucket: from the arena when every rank got arena memory for it, else from
 * malloc on every rank (shm runs a different protocol for each, so the ranks must agree). */
static void *buffer(ddp_reducer *r, size_t bytes, bool *arena)
{
    void *p = ddp_group_alloc(r->g, bytes);
    *arena = p != NULL;
    return p;
}

static void *private_buffer(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p)
        memset(p, 0, bytes);
    return p;
}

/* The end of alloc_buckets for a GPU group, given every rank's allocation flags (MIN over
 * ranks; freed here): every buffer wanted must be device memory on every rank, else creation
 * fails on all of them; the gradients and the sharded parameters' copy start at zero. */
static ddp_status dev_buckets(ddp_reducer *r, int32_t *flags, ddp_error *err)
{
    bool mine = true, all = true;
    for (size_t i = 0; i < r->nb; i++) {
        const bucket *b = &r->b[i];
        bool want[3] = {true, r->o.compress_bf16 && b->dtype == DDP_FLOAT32, r->shard};
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
    void *stream = dev_stream(r, NULL);
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        ddp_status st = r->dev->memset0(r->dev->ctx, stream, b->mem, bytes, msg);
        if (!st && b->pmem)
            st = r->dev->memset0(r->dev->ctx, stream, b->pmem, bytes, msg);
        if (st)
            return ddp__err(err, st, "zeroing the gradient buckets on the GPU: %s", msg);
    }
    return DDP_OK;
}

/* Allocates every bucket's gradients (and bf16 wire copy, and sharded parameter copy), then
 * agrees with the other ranks: a buffer stays in the arena only where it is on every rank, and
 * creation fails on every rank if it failed on one. */
static ddp_status alloc_buckets(ddp_reducer *r, ddp_error *err)
{
    size_t nflags = 3 * r->nb + 1;
    int32_t *flags = malloc(sizeof(int32_t) * nflags);
    if (!flags)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        b->mem = buffer(r, bytes, &b->arena);
        if (r->o.compress_bf16 && b->dtype == DDP_FLOAT32)
            b->wire = buffer(r, b->padded * 2, &b->wire_arena);
        if (r->shard)
            b->pmem = buffer(r, bytes, &b->pmem_arena);
        flags[3 * i] = b->arena;
        flags[3 * i + 1] = b->wire_arena;
        flags[3 * i + 2] = b->pmem_arena;
    }
    flags[3 * r->nb] = 1;
    ddp_status st = ctl(r, false, flags, flags, nflags - 1, DDP_INT32, DDP_MIN);
    if (st) {
        free(flags);
        return ddp__err(err, st, "allocating gradient buckets: %s", r->err);
    }
    if (r->dev) /* device memory: no host fallback, and zeroed on the device */
        return dev_buckets(r, flags, err);
    bool ok = true;
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        size_t bytes = b->padded * ddp_dtype_size(b->dtype);
        struct {
            void **p;
            bool *arena;
            size_t bytes;
            bool want;
        } bufs[3] = {{&b->mem, &b->arena, bytes, true},
                     {(void **)&b->wire, &b->wire_arena, b->padded * 2,
                      r->o.compress_bf16 && b->dtype == DDP_FLOAT32},
                     {&b->pmem, &b->pmem_arena, bytes, r->shard}};
        for (int k = 0; k < 3; k++) {
            if (!bufs[k].want)
                continue;
            if (*bufs[k].arena && !flags[3 * i + k]) { /* a peer has none: nobody uses it */
                ddp_group_free(r->g, *bufs[k].p);
                *bufs[k].p = NULL;
                *bufs[k].arena = false;
            }
            if (!*bufs[k].p)
                *bufs[k].p = private_buffer(bufs[k].bytes);
            ok = ok && *bufs[k].p;
        }
        if (b->arena)
            memset(b->mem, 0, bytes);
        if (b->pmem_arena)
            memset(b->pmem, 0, bytes);
    }
    /* Creation succeeds on every rank or on none. */
    int32_t mine = ok, all = 0;
    st = ctl(r, false, &mine, &all, 1, DDP_INT32, DDP_MIN);
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

/* Cuts order[] (parameter indices) into buckets b[] (zeroed, nparams of them): a new bucket when
 * the cap is reached (first_bucket for the first) or the dtype changes; bucket_of[] filled.
 * Returns the number of buckets. */
static size_t partition(const ddp_reducer *r, const size_t *order, bucket *b, size_t *bucket_of)
{
    const ddp_param *params = r->params;
    size_t nb = 0, cap = r->o.first_bucket;
    for (size_t k = 0; k < r->nparams;) {
        bucket *c = &b[nb];
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

static int cmp_param_name(const void *a, const void *b)
{
    const ddp_param *x = *(const ddp_param *const *)a, *y = *(const ddp_param *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

/* The first name that two of the parameters and buffers share, or NULL; *nomem set when the
 * sort's array could not be allocated. Names key the cross-rank check and checkpoints
 * (safetensors keys), so they must be unique. */
static const char *duplicate_name(const ddp_param *params, size_t np, const ddp_param *buffers,
                                  size_t nb, bool *nomem)
{
    *nomem = false;
    if (np + nb < 2)
        return NULL;
    const ddp_param **all = malloc((np + nb) * sizeof *all);
    if (!all) {
        *nomem = true;
        return NULL;
    }
    for (size_t i = 0; i < np + nb; i++)
        all[i] = i < np ? &params[i] : &buffers[i - np];
    qsort(all, np + nb, sizeof *all, cmp_param_name);
    const char *dup = NULL;
    for (size_t i = 1; i < np + nb && !dup; i++)
        if (strcmp(all[i - 1]->name, all[i]->name) == 0)
            dup = all[i]->name;
    free(all);
    return dup;
}

ddp_status ddp_reducer_create(ddp_group *g, const ddp_param *params, size_t nparams,
                              const ddp_param *buffers, size_t nbuffers,
                              const ddp_reducer_opts *opts, ddp_reducer **out, ddp_error *err)
{
    ddp_reducer_opts def = DDP_REDUCER_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!g || !out || (nparams && !params) || (nbuffers && !buffers))
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: g, out and the lists are "
                        "required");
    /* data may be NULL for an empty parameter or buffer (count 0: what malloc(0) may give) */
    for (size_t i = 0; i < nparams; i++)
        if (!params[i].name || (!params[i].data && params[i].count) ||
            !float_dtype(params[i].dtype))
            return ddp__err(err, DDP_ERR_INVALID,
                            "parameter %zu ('%s'): needs a name, data (unless its count is 0), and "
                            "a floating-point dtype (float32, float64, bfloat16 or float16)",
                            i, params[i].name ? params[i].name : "(no name)");
    for (size_t i = 0; i < nbuffers; i++)
        if (!buffers[i].name || (!buffers[i].data && buffers[i].count) ||
            ddp_dtype_size(buffers[i].dtype) == 0)
            return ddp__err(err, DDP_ERR_INVALID,
                            "buffer %zu ('%s'): needs a name, data (unless its count is 0) and a "
                            "dtype",
                            i, buffers[i].name ? buffers[i].name : "(no name)");
    if (opts->overlap != DDP_OVERLAP_AUTO && opts->overlap != DDP_OVERLAP_ASYNC &&
        opts->overlap != DDP_OVERLAP_INLINE)
        return ddp__err(err, DDP_ERR_INVALID,
                        "ddp_reducer_create: overlap %d is not DDP_OVERLAP_AUTO, _ASYNC or _INLINE",
                        (int)opts->overlap);
    bool nomem;
    const char *dup = duplicate_name(params, nparams, buffers, nbuffers, &nomem);
    if (nomem)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory checking the parameters' names");
    if (dup)
        return ddp__err(err, DDP_ERR_INVALID,
                        "the name '%s' is given to two parameters or buffers: each needs a name of "
                        "its own (it identifies them across ranks and in checkpoints)",
                        dup);
    const ddp__devops *dev = ddp__group_devops(g, NULL, NULL);
    for (size_t i = 0; i < nparams + nbuffers; i++) {
        const ddp_param *p = i < nparams ? &params[i] : &buffers[i - nparams];
        if (p->device != (dev ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU))
            return ddp__err(err, DDP_ERR_INVALID,
                            "%s '%s': its data is on device '%s', but the group's collectives "
                            "take %s memory (backend '%s'); %s",
                            i < nparams ? "parameter" : "buffer", p->name,
                            ddp_device_name(p->device), dev ? "GPU" : "host", ddp_group_backend(g),
                            dev ? "put it on the group's GPU (ddp_group_cuda_device) or use a CPU "
                                  "group"
                                : "create the group with device DDP_DEVICE_CUDA "
                                  "(ddp_group_opts.device) or copy it to the host");
        if (dev && p->device == DDP_DEVICE_CUDA && !dev->memset0)
            return ddp__err(err, DDP_ERR_INVALID,
                            "the GPU backend '%s' has no device arithmetic for the reducer; "
                            "HINT: use the libddp_gpu.so built with this libddp",
                            ddp_group_backend(g));
    }
    ddp_reducer *r = calloc(1, sizeof *r);
    if (!r)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the reducer");
    r->g = g;
    r->dev = dev;
    r->params = params;
    r->nparams = nparams;
    r->buffers = buffers;
    r->nbuffers = nbuffers;
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
         * MB-step. */
        ov = ddp_group_size(g) > 1 && ddp_group_core_to_spare(g) ? DDP_OVERLAP_ASYNC
                                                                 : DDP_OVERLAP_INLINE;
    }
    r->async = ov == DDP_OVERLAP_ASYNC;
    r->W = ddp_group_size(g);
    r->me = ddp_group_rank(g);
    r->shard = r->o.shard_optimizer && r->W > 1;
    /* Not rebuilt: sharded (the shard a rank steps, and the optimizer state it keeps, are keyed
     * by the layout) and on a GPU group (the staging copies would have to be ordered on the
     * group's stream; not done yet). */
    r->rebuild =
        r->o.rebuild_buckets && !r->shard && !dev && nparams > 1 ? REBUILD_RECORD : REBUILD_DONE;
    ddp_status st = DDP_ERR_NOMEM;
    size_t n1 = nparams ? nparams : 1;
    r->order = malloc(sizeof(size_t) * n1);
    r->bucket_of = malloc(sizeof(size_t) * n1);
    r->off = malloc(sizeof(size_t) * n1);
    r->grad = calloc(n1, sizeof(void *));
    r->pdata = calloc(n1, sizeof(void *));
    r->ready = calloc(n1, sizeof(bool));
    r->b = calloc(n1, sizeof(bucket));
    r->seen = malloc(sizeof(size_t) * n1);
    if (!r->order || !r->bucket_of || !r->off || !r->grad || !r->pdata || !r->ready || !r->b ||
        !r->seen) {
        ddp__err(err, st, "out of memory creating the reducer");
        goto out_fail;
    }
    if ((st = check_same(r, params, nparams, "parameters", err)) ||
        (st = check_same(r, buffers, nbuffers, "buffers", err)) || (st = check_opts(r, err)))
        goto out_fail;

    for (size_t i = 0; i < nparams; i++)
        r->pdata[i] = params[i].data;
    /* Buckets in reverse registration order. */
    for (size_t k = 0; k < nparams; k++)
        r->order[k] = nparams - 1 - k;
    r->nb = partition(r, r->order, r->b, r->bucket_of);
    for (size_t i = 0; i < r->nb; i++)
        r->b[i].owns_mem = true;
    if ((st = alloc_buckets(r, err)))
        goto out_fail;
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        size_t off = 0, esz = ddp_dtype_size(b->dtype);
        for (size_t k = b->first; k < b->last; k++) {
            size_t p = r->order[k];
            r->grad[p] = (char *)b->mem + off * esz;
            r->off[p] = off;
            if (b->pmem) /* sharded: the parameters live in the reducer, laid out like this */
                r->pdata[p] = (char *)b->pmem + off * esz;
            off += params[p].count;
        }
    }
    if (r->o.broadcast_params && ((st = broadcast_list(r, params, nparams)) ||
                                  (st = broadcast_list(r, buffers, nbuffers)))) {
        ddp__err(err, st, "%s", r->err);
        goto out_fail;
    }
    if (r->shard && (st = dev_quiesce(r, "the parameters' copy"))) {
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
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        ddp_work_free(b->work);
        if (b->owns_mem && b->arena)
            ddp_group_free(r->g, b->mem);
        else if (b->owns_mem)
            free(b->mem);
        if (b->wire_arena)
            ddp_group_free(r->g, b->wire);
        else
            free(b->wire);
        if (b->pmem_arena)
            ddp_group_free(r->g, b->pmem);
        else
            free(b->pmem);
    }
    for (size_t i = 0; i < r->nhome; i++) {
        if (r->home[i].arena)
            ddp_group_free(r->g, r->home[i].mem);
        else
            free(r->home[i].mem);
    }
    free(r->home);
    free(r->seen);
    free(r->order);
    free(r->bucket_of);
    free(r->off);
    free(r->grad);
    free(r->pdata);
    free(r->ready);
    free(r->b);
    free(r);
}

void *ddp_reducer_grad(ddp_reducer *r, size_t i)
{
    return r && i < r->nparams ? r->grad[i] : NULL;
}

void *ddp_reducer_param(ddp_reducer *r, size_t i)
{
    return r && i < r->nparams ? r->pdata[i] : NULL;
}

void ddp_reducer_zero_grad(ddp_reducer *r)
{
    if (!r)
        return;
    if (r->dev) {
        char msg[DDP_ERRMSG_MAX];
        void *stream = dev_stream(r, NULL);
        for (size_t i = 0; i < r->nb && !r->dev_st; i++) {
            ddp_status st = r->dev->memset0(r->dev->ctx, stream, r->b[i].mem,
                                            r->b[i].padded * ddp_dtype_size(r->b[i].dtype), msg);
            if (st)
                r->dev_st = dev_fail(r, st, "zeroing the gradients", msg);
        }
    } else if (r->home) { /* rebuilt: the gradients live in the old buckets' memory */
        for (size_t i = 0; i < r->nhome; i++)
            memset(r->home[i].mem, 0, r->home[i].bytes);
    } else {
        for (size_t i = 0; i < r->nb; i++)
            memset(r->b[i].mem, 0, r->b[i].padded * ddp_dtype_size(r->b[i].dtype));
    }
    r->consumed = false;
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

/* A staged bucket's gradients from their homes into its staging copy (to_stage), or the
 * reduced mean back (CPU only: staging is not used on a GPU group). */
static void stage(ddp_reducer *r, bucket *b, bool to_stage)
{
    size_t esz = ddp_dtype_size(b->dtype);
    for (size_t k = b->first; k < b->last; k++) {
        size_t p = r->order[k], bytes = r->params[p].count * esz;
        char *s = (char *)b->mem + r->off[p] * esz;
        if (bytes)
            memcpy(to_stage ? s : r->grad[p], to_stage ? r->grad[p] : s, bytes);
    }
}

static ddp_status launch(ddp_reducer *r, bucket *b)
{
    ddp_status st;
    void *buf = b->mem;
    ddp_dtype t = b->dtype;
    if (b->staged)
        stage(r, b, true);
    if (b->wire) {
        if (!r->dev) {
            ddp__from_f32(b->wire, b->mem, b->padded, DDP_BFLOAT16);
        } else { /* on the stream: the collective is ordered after it */
            char msg[DDP_ERRMSG_MAX];
            if ((st = r->dev->convert(r->dev->ctx, dev_stream(r, NULL), b->wire, DDP_BFLOAT16,
                                      b->mem, DDP_FLOAT32, b->padded, msg)))
                return dev_fail(r, st, "rounding a bucket to bfloat16", msg);
        }
        buf = b->wire;
        t = DDP_BFLOAT16;
    }
    /* Sharding: block me of the bucket receives the mean of everyone's block me. */
    void *mine = (char *)buf + b->block * (size_t)r->me * ddp_dtype_size(t);
    if (r->async && r->shard) {
        st = ddp_reduce_scatter_async(r->g, buf, mine, b->block, t, DDP_AVG, &b->work);
    } else if (r->async) {
        st = ddp_allreduce_async(r->g, buf, buf, b->count, t, DDP_AVG, &b->work);
    } else {
        double t0 = ddp_now_seconds();
        st = r->shard ? ddp_reduce_scatter(r->g, buf, mine, b->block, t, DDP_AVG)
                      : ddp_allreduce(r->g, buf, buf, b->count, t, DDP_AVG);
        r->stats.comm_seconds += ddp_now_seconds() - t0;
        b->inline_done = st == DDP_OK;
    }
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

/* The end of the recorded step: the parameters never marked (reduced by finish) follow the
 * marked ones, in bucket order, so the record is a whole permutation. */
static void record_end(ddp_reducer *r, bool ok)
{
    if (r->rebuild != REBUILD_RECORD)
        return;
    if (!ok) { /* a failed step: the group is gone, or its ranks disagree; keep the layout */
        r->rebuild = REBUILD_DONE;
        return;
    }
    for (size_t k = 0; k < r->nparams; k++)
        if (!r->ready[r->order[k]])
            r->seen[r->nseen++] = r->order[k];
    r->rebuild = REBUILD_PENDING;
}

/* Frees what a rebuild allocated for buckets nb[0..n) (staging copies and wire buffers). */
static void free_new(ddp_reducer *r, bucket *nb, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (nb[i].owns_mem && nb[i].arena)
            ddp_group_free(r->g, nb[i].mem);
        else if (nb[i].owns_mem)
            free(nb[i].mem);
        if (nb[i].wire_arena)
            ddp_group_free(r->g, nb[i].wire);
        else
            free(nb[i].wire);
    }
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
static ddp_status rebuild(ddp_reducer *r)
{
    r->rebuild = REBUILD_DONE; /* once, whatever happens */
    size_t n = r->nparams, W = (size_t)r->W;
    ddp_status st = DDP_ERR_NOMEM;
    int64_t *mine = calloc(n + 1, sizeof(int64_t)), *all = malloc(sizeof(int64_t) * (n + 1) * W);
    size_t *no = malloc(sizeof(size_t) * n), *nbo = malloc(sizeof(size_t) * n);
    size_t *noff = malloc(sizeof(size_t) * n);
    bool *hit = calloc(n, sizeof(bool));
    bucket *nb = calloc(n, sizeof(bucket));
    home_mem *home = calloc(r->nb, sizeof(home_mem));
    int32_t *flags = malloc(sizeof(int32_t) * (2 * n + 1));
    size_t nn = 0;
    if (!mine || !all || !no || !nbo || !noff || !hit || !nb || !home || !flags) {
        ddp__errmsg(r->err, st, "rebuilding the gradient buckets: out of memory");
        goto out;
    }
    for (size_t k = 0; k < n; k++)
        mine[k] = k < r->nseen ? (int64_t)r->seen[k] : -1;
    mine[n] = r->async; /* overlap may differ across ranks: rebuild only if async on every one */
    /* An allgather rather than a broadcast: ctl stages it on any group. Rank 0's row wins. */
    if ((st = ctl(r, true, mine, all, n + 1, DDP_INT64, DDP_SUM))) {
        char m[DDP_ERRMSG_MAX];
        ddp__fmt(m, sizeof m, "%s", r->err);
        ddp__errmsg(r->err, st, "rebuilding the gradient buckets (rank 0's ready order): %s", m);
        goto out;
    }
    st = DDP_OK;
    for (size_t k = 0; k < W; k++)
        if (!all[k * (n + 1) + n])
            goto out; /* inline somewhere: a bucket is reduced on the caller's thread whatever
                         the order, so a new layout gains nothing there, and its copies cost */
    for (size_t k = 0; k < n; k++) {
        int64_t p = all[k];
        if (p < 0 || (size_t)p >= n || hit[p])
            goto out; /* not a permutation (cannot happen): keep the layout */
        hit[p] = true;
        no[k] = (size_t)p;
    }
    nn = partition(r, no, nb, nbo);
    /* In place where the new bucket's parameters fill one range of one old bucket. */
    for (size_t j = 0; j < nn; j++) {
        bucket *c = &nb[j];
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
            c->mem = buffer(r, c->padded * esz, &c->arena);
            c->owns_mem = true;
        }
        if (r->o.compress_bf16 && c->dtype == DDP_FLOAT32)
            c->wire = buffer(r, c->padded * 2, &c->wire_arena);
        flags[2 * j] = c->arena;
        flags[2 * j + 1] = c->wire_arena;
    }
    /* As alloc_buckets: arena memory only where every rank has it; all ranks or none rebuild. */
    if ((st = ctl(r, false, flags, flags, 2 * nn, DDP_INT32, DDP_MIN)))
        goto out_msg;
    bool ok = true;
    for (size_t j = 0; j < nn; j++) {
        bucket *c = &nb[j];
        size_t esz = ddp_dtype_size(c->dtype);
        if (c->owns_mem && c->arena && !flags[2 * j]) {
            ddp_group_free(r->g, c->mem);
            c->mem = NULL;
            c->arena = false;
        }
        if (c->owns_mem && !c->mem)
            c->mem = private_buffer(c->padded * esz);
        if (c->wire_arena && !flags[2 * j + 1]) {
            ddp_group_free(r->g, c->wire);
            c->wire = NULL;
            c->wire_arena = false;
        }
        if (!c->wire && r->o.compress_bf16 && c->dtype == DDP_FLOAT32)
            c->wire = private_buffer(c->padded * 2);
        ok = ok && c->mem && (c->wire || !(r->o.compress_bf16 && c->dtype == DDP_FLOAT32));
    }
    int32_t okm = ok, oka = 0;
    if ((st = ctl(r, false, &okm, &oka, 1, DDP_INT32, DDP_MIN)))
        goto out_msg;
    if (!oka)
        goto out; /* no memory for it somewhere: every rank keeps the old layout */
    /* Commit: the old buckets' memory becomes the gradients' home. */
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        home[i] = (home_mem){b->mem, b->arena, b->padded * ddp_dtype_size(b->dtype)};
        if (b->wire_arena)
            ddp_group_free(r->g, b->wire);
        else
            free(b->wire);
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
out_msg : {
    char m[DDP_ERRMSG_MAX];
    ddp__fmt(m, sizeof m, "%s", r->err);
    ddp__errmsg(r->err, st, "rebuilding the gradient buckets: %s", m);
}
out:
    if (nb)
        free_new(r, nb, nn);
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

/* A synced step opens (its first mark_ready, or a finish with nothing marked): the pending
 * rebuild runs first, then the per-step state is reset. */
static ddp_status open_step(ddp_reducer *r)
{
    ddp_status st = r->rebuild == REBUILD_PENDING ? rebuild(r) : DDP_OK;
    reset_step(r);
    return st;
}

ddp_status ddp_reducer_mark_ready(ddp_reducer *r, size_t i)
{
    if (!r || i >= r->nparams)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "mark_ready: no parameter %zu", i)
                 : DDP_ERR_INVALID;
    if (r->awaiting)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "mark_ready: the last sharded step was not gathered; call "
                           "ddp_reducer_gather_params after the optimizer step");
    if (r->consumed)
        return ddp__errmsg(
            r->err, DDP_ERR_INVALID,
            "mark_ready: after a sharded step the gradients hold the mean only in this "
            "rank's shard; call ddp_reducer_zero_grad before the next backward");
    if (r->dev_st)
        return r->dev_st; /* its message is in r->err */
    if (!r->sync)
        return DDP_OK;
    if (!r->step_open) {
        ddp_status st = open_step(r);
        if (st)
            return st;
        r->step_open = true;
    }
    if (r->ready[i])
        return ddp__errmsg(
            r->err, DDP_ERR_INVALID,
            "mark_ready: '%s' was already marked this step (call finish between steps)",
            r->params[i].name);
    r->ready[i] = true;
    if (r->rebuild == REBUILD_RECORD)
        r->seen[r->nseen++] = i;
    r->b[r->bucket_of[i]].pending--;
    return launch_ready(r, false);
}

/* The reduced bfloat16 gradients back into the float32 bucket: all, or my block (sharded). */
static ddp_status unwire(ddp_reducer *r, bucket *b)
{
    float *dst = b->mem;
    size_t lo = r->shard ? b->block * (size_t)r->me : 0, hi = r->shard ? lo + b->block : b->count;
    if (!r->dev) {
        ddp__to_f32(dst + lo, b->wire + lo, hi - lo, DDP_BFLOAT16);
        return DDP_OK;
    }
    char msg[DDP_ERRMSG_MAX];
    ddp_status st = r->dev->convert(r->dev->ctx, dev_stream(r, NULL), dst + lo, DDP_FLOAT32,
                                    b->wire + lo, DDP_BFLOAT16, hi - lo, msg);
    return st ? dev_fail(r, st, "widening a reduced bfloat16 bucket", msg) : DDP_OK;
}

ddp_status ddp_reducer_finish(ddp_reducer *r)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (r->awaiting)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "finish: the last sharded step was not gathered; call "
                           "ddp_reducer_gather_params after the optimizer step");
    if (r->consumed)
        return ddp__errmsg(r->err, DDP_ERR_INVALID,
                           "finish: after a sharded step the gradients hold the mean only in this "
                           "rank's shard; call ddp_reducer_zero_grad before the next backward");
    if (r->dev_st)
        return r->dev_st;
    if (!r->sync)
        return DDP_OK;
    ddp_status st = DDP_OK;
    if (!r->step_open && (st = open_step(r))) /* nothing was marked: reduce everything now */
        return st;
    r->step_open = false;
    st = launch_ready(r, true);
    double t0 = ddp_now_seconds();
    for (size_t i = 0; i < r->nb; i++) {
        bucket *b = &r->b[i];
        if (b->inline_done && b->wire) {
            ddp_status s1 = unwire(r, b);
            st = st ? st : s1;
        }
        if (b->inline_done && b->staged)
            stage(r, b, false);
        b->inline_done = false;
        if (!b->work)
            continue;
        ddp_status s2 = ddp_work_wait(b->work);
        double s, e;
        ddp_work_timing(b->work, &s, &e);
        r->stats.comm_seconds += e - s;
        ddp_work_free(b->work);
        b->work = NULL;
        if (s2 && !st)
            st = ddp__errmsg(r->err, s2, "%s", ddp_group_last_error(r->g));
        if (!s2 && b->wire) {
            ddp_status s1 = unwire(r, b);
            st = st ? st : s1;
        }
        if (!s2 && b->staged)
            stage(r, b, false);
    }
    record_end(r, st == DDP_OK);
    r->stats.wait_seconds = ddp_now_seconds() - t0;
    r->awaiting = r->consumed = r->shard && st == DDP_OK;
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

void ddp_reducer_shard(const ddp_reducer *r, size_t i, size_t *lo, size_t *hi)
{
    size_t n = r && i < r->nparams ? r->params[i].count : 0, a = 0, z = n;
    if (n && r->shard) {
        const bucket *b = &r->b[r->bucket_of[i]];
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
    ddp_status st = ctl(r, false, &mine, &all, 1, DDP_INT32, DDP_MIN);
    if (!st && !all)
        st = ddp__errmsg(r->err, DDP_ERR_NOMEM, "out of %s memory on %s", r->dev ? "GPU" : "host",
                         mine ? "another rank" : "this rank");
    if (!st)
        st = dev_quiesce(r, "waiting for the arrays");
    for (size_t k = 0; k < r->nb && !st; k++) {
        bucket *b = &r->b[k];
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
        if (st) {
            char m[DDP_ERRMSG_MAX];
            ddp__fmt(m, sizeof m, "%s", r->err);
            ddp__errmsg(r->err, st, "%s, bucket %zu: %s", what, k, m);
        }
    }
    if (st && !strstr(r->err, what)) {
        char m[DDP_ERRMSG_MAX];
        ddp__fmt(m, sizeof m, "%s", r->err);
        ddp__errmsg(r->err, st, "%s: %s", what, m);
    }
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
        bucket *b = &r->b[k];
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
        const bucket *b = &r->b[j];
        size_t lo = r->shard ? b->block * (size_t)r->me : 0, hi = b->count;
        if (r->shard && lo + b->block < hi)
            hi = lo + b->block;
        if (hi <= lo)
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
        void *stream = dev_stream(r, &deadline);
        st = r->dev->sumsq(r->dev->ctx, stream, devs, ns, ts, k, ss, deadline, msg);
        if (st)
            dev_fail(r, st, "grad_norm", msg);
    }
    free(devs);
    free(ns);
    free(ts);
    return st;
}

ddp_status ddp_reducer_grad_norm(ddp_reducer *r, double *norm)
{
    if (!r || !norm)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "grad_norm: norm is required")
                 : DDP_ERR_INVALID;
    double ss = 0.0;
    if (r->dev) {
        ddp_status st = dev_sum_squares(r, &ss);
        if (st)
            return st;
    } else {
        for (size_t i = 0; i < r->nparams; i++) {
            size_t lo, hi, esz = ddp_dtype_size(r->params[i].dtype);
            ddp_reducer_shard(r, i, &lo, &hi);
            ss +=
                ddp__sum_squares((const char *)r->grad[i] + lo * esz, hi - lo, r->params[i].dtype);
        }
    }
    if (r->shard) {
        double all;
        ddp_status st = ctl(r, false, &ss, &all, 1, DDP_FLOAT64, DDP_SUM);
        if (st) {
            char m[DDP_ERRMSG_MAX];
            ddp__fmt(m, sizeof m, "%s", r->err);
            return ddp__errmsg(r->err, st, "grad_norm: %s", m);
        }
        ss = all;
    }
    *norm = sqrt(ss);
    return DDP_OK;
}

ddp_status ddp_reducer_unscale(ddp_reducer *r, float inv_scale, bool *found_inf)
{
    if (!r || !found_inf)
        return r ? ddp__errmsg(r->err, DDP_ERR_INVALID, "unscale: found_inf is required")
                 : DDP_ERR_INVALID;
    if (r->dev_st)
        return r->dev_st;
    bool found = false;
    if (r->home) { /* rebuilt (CPU, unsharded): the gradients are in their homes, not in the
                      staging copies */
        for (size_t i = 0; i < r->nparams; i++)
            if (r->params[i].dtype != DDP_FLOAT32)
                return ddp__errmsg(r->err, DDP_ERR_INVALID,
                                   "unscale: '%s' holds %s gradients; loss scaling takes float32 "
                                   "parameters",
                                   r->params[i].name, ddp_dtype_name(r->params[i].dtype));
        for (size_t i = 0; i < r->nparams; i++) {
            float *g = r->grad[i];
            for (size_t k = 0; k < r->params[i].count; k++) {
                found |= !isfinite(g[k]);
                g[k] *= inv_scale;
            }
        }
        *found_inf = found;
        return DDP_OK;
    }
    for (size_t k = 0; k < r->nb; k++) {
        const bucket *b = &r->b[k];
        if (b->dtype != DDP_FLOAT32)
            return ddp__errmsg(r->err, DDP_ERR_INVALID,
                               "unscale: bucket %zu holds %s gradients; loss scaling takes float32 "
                               "parameters",
                               k, ddp_dtype_name(b->dtype));
        size_t lo = r->shard ? b->block * (size_t)r->me : 0, hi = b->count;
        if (r->shard && lo + b->block < hi)
            hi = lo + b->block;
        if (hi <= lo)
            continue;
        float *g = (float *)b->mem + lo;
        if (!r->dev) {
            for (size_t i = 0; i < hi - lo; i++) {
                found |= !isfinite(g[i]);
                g[i] *= inv_scale;
            }
            continue;
        }
        char msg[DDP_ERRMSG_MAX];
        int64_t deadline;
        void *stream = dev_stream(r, &deadline);
        bool part = false;
        ddp_status st =
            r->dev->unscale(r->dev->ctx, stream, g, hi - lo, inv_scale, &part, deadline, msg);
        if (st)
            return dev_fail(r, st, "unscale", msg);
        found |= part;
    }
    *found_inf = found;
    return DDP_OK;
}

ddp_status ddp_reducer_sync_buffers(ddp_reducer *r)
{
    return r ? broadcast_list(r, r->buffers, r->nbuffers) : DDP_ERR_INVALID;
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
