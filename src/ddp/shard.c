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

/* The scratch of a state gather: at most this many bytes on each rank, whatever the model. */
#define GATHER_SCRATCH_BYTES ((size_t)4 << 20)

/* Copies between the bucket window [a, a + n) (bucket coordinates, one rank's chunk) and the
 * per-parameter arrays it covers. in: from arrays (each parameter's shard on this rank when
 * shard, its whole array otherwise) into win; else from win into the whole arrays. */
static ddp_status window_copy(ddp_reducer *r, const ddp__bucket *b, size_t a, size_t n, char *win,
                              void *const *arrays, bool in, bool shard)
{
    size_t esz = ddp_dtype_size(b->dtype);
    ddp_status st = DDP_OK;
    for (size_t q = b->first; q < b->last && !st; q++) {
        size_t p = r->order[q], s = r->off[p], e = s + r->params[p].count;
        size_t x0 = s > a ? s : a, x1 = e < a + n ? e : a + n, lo = 0;
        if (x1 <= x0)
            continue;
        if (in && shard)
            ddp_reducer_shard(r, p, &lo, NULL);
        char *elem = (char *)arrays[p] + (x0 - s - lo) * esz;
        st = in ? copy_any(r, win + (x0 - a) * esz, elem, (x1 - x0) * esz)
                : copy_any(r, elem, win + (x0 - a) * esz, (x1 - x0) * esz);
    }
    return st;
}

/* Where gathered state goes on the root when it is not whole arrays: the caller's sink, given
 * host memory (a bounce buffer of the window's size on a GPU group). The first refusal is kept
 * and later pieces are dropped, while the collectives go on to the end with the other ranks. */
typedef struct sink_to {
    ddp_state_sink fn;
    void *ctx;
    char *bounce; /* GPU group: host memory for one window */
    ddp_status st;
    size_t param; /* the refused piece's */
} sink_to;

static ddp_status window_sink(ddp_reducer *r, const ddp__bucket *b, size_t a, size_t n,
                              const char *win, sink_to *to)
{
    size_t esz = ddp_dtype_size(b->dtype);
    if (to->bounce) {
        ddp_status st = copy_any(r, to->bounce, win, n * esz);
        if (st)
            return st;
        win = to->bounce;
    }
    for (size_t q = b->first; q < b->last && !to->st; q++) {
        size_t p = r->order[q], s = r->off[p], e = s + r->params[p].count;
        size_t x0 = s > a ? s : a, x1 = e < a + n ? e : a + n;
        if (x1 > x0 && (to->st = to->fn(to->ctx, p, x0 - s, win + (x0 - a) * esz, x1 - x0)))
            to->param = p;
    }
    return DDP_OK;
}

/* A gather called while this rank's step is under way (mark_ready called, finish not yet).
 * Sharded, the others are entering the gather's collectives, which this rank will not: the group
 * is aborted with the message, so that they fail now naming this rank, not at their deadline
 * (until 2026-11-25 they waited for it; gather_params even ran its allgather mid-step). Not
 * sharded, a gather communicates on no rank: this rank's error alone. */
static ddp_status mid_step(ddp_reducer *r, const char *what)
{
    ddp__errmsg(r->err, DDP_ERR_INVALID,
                "%s: a step is under way on rank %d (mark_ready called, finish not yet); gather "
                "on every rank between finish and the next step's mark_ready%s",
                what, r->me,
                r->shard ? ": the group was aborted, so that the other ranks, in the gather, "
                           "fail now rather than at their deadline"
                         : "");
    if (r->shard)
        ddp__group_abort_why(r->g, r->err);
    return DDP_ERR_INVALID;
}

/* Every rank's shard of state arrays to every rank (root < 0) or to rank root alone, through a
 * small private scratch buffer (GATHER_SCRATCH_BYTES: malloc on every rank, or device memory on a
 * GPU group; rare, e.g. for a checkpoint; the gradients are left alone): each bucket's blocks
 * move in chunks, one allgather a chunk. src[p] holds parameter p's whole array (src_shard
 * false: this rank's shard is read from its place in it) or this rank's shard alone (true:
 * ddp_reducer_shard's elements, the first at src[p][0]); dst[p] receives the whole array (every
 * element on root; with root < 0 dst is src and only the others' shards are written). */
static ddp_status gather(ddp_reducer *r, const void *const *src, bool src_shard, void *const *dst,
                         sink_to *to, int root, const char *what)
{
    if (!r)
        return DDP_ERR_INVALID;
    if (!r->g)
        return ddp__reducer_gone(r);
    int32_t bad = 0; /* 1 out of memory, 2 wrong arguments: every rank learns the worst */
    bool no_sink = to && !to->fn; /* gather_state_sink on the root without one */
    if (!src || (root == r->me && !dst && (!to || no_sink)) || root >= r->W)
        bad = 2;
    if (r->step_open)
        return mid_step(r, what);
    if (!r->shard) { /* every rank holds everything already */
        if (bad)
            return ddp__errmsg(r->err, DDP_ERR_INVALID, "%s: %s", what,
                               no_sink ? "no sink on the root" : "no arrays");
        ddp_status st = DDP_OK;
        /* on a GPU group the root's sink gets host memory: each array through a bounce buffer
         * of at most GATHER_SCRATCH_BYTES, in pieces */
        char *bounce = NULL;
        if (to && r->dev && root == r->me && !(bounce = malloc(GATHER_SCRATCH_BYTES)))
            return ddp__errmsg(r->err, DDP_ERR_NOMEM, "%s: out of host memory", what);
        for (size_t p = 0; root == r->me && p < r->nparams && !st; p++) {
            size_t esz = ddp_dtype_size(r->params[p].dtype), count = r->params[p].count,
                   per = GATHER_SCRATCH_BYTES / esz;
            if (!to && dst[p] != src[p])
                st = copy_any(r, dst[p], src[p], count * esz);
            for (size_t k = 0; to && k < count && !st; k += per) {
                size_t n = count - k < per ? count - k : per;
                const void *piece = (const char *)src[p] + k * esz;
                if (bounce && !(st = copy_any(r, bounce, piece, n * esz)))
                    piece = bounce;
                if (!st && (to->st = to->fn(to->ctx, p, k, piece, n))) {
                    free(bounce);
                    return ddp__errmsg(r->err, to->st, "%s: the sink refused parameter %zu's", what,
                                       p);
                }
            }
        }
        free(bounce);
        return st ? ddp__reducer_errctx(r, st, "%s", what) : DDP_OK;
    }
    size_t most = 0; /* the largest block, in bytes */
    for (size_t k = 0; k < r->nb; k++)
        if (r->b[k].block * ddp_dtype_size(r->b[k].dtype) > most)
            most = r->b[k].block * ddp_dtype_size(r->b[k].dtype);
    size_t limit = GATHER_SCRATCH_BYTES;
    const char *t = getenv("DDP_TEST_GATHER_SCRATCH"); /* tests: many small chunks */
    if (t && atol(t) > 0)
        limit = (size_t)atol(t);
    size_t chunk_bytes = limit / (size_t)r->W;
    if (chunk_bytes > most)
        chunk_bytes = most;
    chunk_bytes = (chunk_bytes + 63) / 64 * 64;
    if (!chunk_bytes && most) /* a limit under W bytes: 0 elements a chunk never got anywhere */
        chunk_bytes = 64;
    size_t scratch = chunk_bytes * (size_t)r->W;
    char *mem = bad      ? NULL
                : r->dev ? ddp_group_alloc(r->g, scratch ? scratch : 64)
                         : calloc(1, scratch ? scratch : 64);
    if (!bad && !mem)
        bad = 1;
    if (!bad && to && root == r->me && r->dev &&
        !(to->bounce = malloc(chunk_bytes ? chunk_bytes : 64)))
        bad = 1;
    int32_t worst = 0;
    ddp_status st = ddp__reducer_ctl(r, false, &bad, &worst, 1, DDP_INT32, DDP_MAX);
    if (!st && worst == 2)
        st = ddp__errmsg(r->err, DDP_ERR_INVALID, "%s: %s", what,
                         !bad      ? "no arrays (or no sink) on another rank"
                         : no_sink ? "no sink on the root"
                                   : "no arrays");
    else if (!st && worst)
        st = ddp__errmsg(r->err, DDP_ERR_NOMEM, "out of %s memory on %s", r->dev ? "GPU" : "host",
                         bad ? "this rank" : "another rank");
    if (!st)
        st = ddp__reducer_dev_quiesce(r, "waiting for the arrays");
    bool mine = root < 0 || root == r->me;
    for (size_t k = 0; k < r->nb && !st; k++) {
        ddp__bucket *b = &r->b[k];
        size_t esz = ddp_dtype_size(b->dtype), per = chunk_bytes / esz;
        for (size_t c = 0; c < b->block && !st; c += per) {
            size_t n = b->block - c < per ? b->block - c : per;
            char *slot = mem + (size_t)r->me * n * esz;
            st = window_copy(r, b, b->block * (size_t)r->me + c, n, slot, (void *const *)src, true,
                             src_shard);
            if (!st && (st = ddp_allgather(r->g, slot, mem, n, b->dtype)))
                ddp__errmsg(r->err, st, "%s", ddp_group_last_error(r->g));
            /* rank q's chunk is at q·n in mem; in place (root < 0) this rank's is there */
            for (int q = 0; q < r->W && !st && mine; q++)
                if (to)
                    st = window_sink(r, b, b->block * (size_t)q + c, n, mem + (size_t)q * n * esz,
                                     to);
                else if (root >= 0 || q != r->me)
                    st = window_copy(r, b, b->block * (size_t)q + c, n, mem + (size_t)q * n * esz,
                                     dst, false, false);
        }
        if (st)
            ddp__reducer_errctx(r, st, "%s, bucket %zu", what, k);
    }
    if (st && !strstr(r->err, what))
        ddp__reducer_errctx(r, st, "%s", what);
    if (!st && to && to->st)
        st = ddp__errmsg(r->err, to->st, "%s: the sink refused parameter %zu's", what, to->param);
    if (to) {
        free(to->bounce);
        to->bounce = NULL;
    }
    if (r->dev)
        ddp_group_free(r->g, mem);
    else
        free(mem);
    return st;
}

ddp_status ddp_reducer_gather_params(ddp_reducer *r)
{
    if (!r || !r->g)
        return r ? ddp__reducer_gone(r) : DDP_ERR_INVALID;
    if (!r->shard)
        return DDP_OK;
    if (r->step_open)
        return mid_step(r, "gathering the parameters");
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
    return gather(r, (const void *const *)arrays, false, arrays, NULL, -1,
                  "gathering optimizer state");
}

ddp_status ddp_reducer_gather_state_to(ddp_reducer *r, int root, const void *const *shards,
                                       void *const *whole)
{
    if (r && root < 0)
        return ddp__errmsg(r->err, DDP_ERR_INVALID, "gathering optimizer state: root %d", root);
    return gather(r, shards, true, whole, NULL, root, "gathering optimizer state");
}

ddp_status ddp_reducer_gather_state_sink(ddp_reducer *r, int root, const void *const *shards,
                                         ddp_state_sink sink, void *ctx)
{
    if (r && root < 0)
        return ddp__errmsg(r->err, DDP_ERR_INVALID, "gathering optimizer state: root %d", root);
    /* no sink on the root: refused by gather on every rank that communicates, so that none is
     * left waiting for the root */
    sink_to to = {sink, ctx, NULL, DDP_OK, 0};
    return gather(r, shards, true, NULL, r && root == r->me ? &to : NULL, root,
                  "gathering optimizer state");
}
