/*
 * staged/staged.c — the shared-GPU backend, "cuda-staged": collectives on GPU buffers for ranks
 * that share a GPU (NCCL refuses two ranks on one device) or run where there is no NCCL.
 *
 * Each collective goes through host memory, in chunks that fit one staging buffer: the GPU copies
 * the rank's input into it, the CPU backend among the same ranks (shm on one host, shm+tcp or tcp
 * across hosts, chosen as for host buffers) runs the collective there in place, and the GPU copies
 * the result back. The staging buffer is the inner backend's zero-copy arena when it has one — for
 * shm, memory in the shared segment that the peers reduce in place — pinned with cudaHostRegister,
 * so the bytes cross PCIe/NVLink-C2C once each way and are never copied on the host. Every wait is
 * on the host (polling the copies' completion; shm's futexes): ranks that time-slice one GPU must
 * not spin on it (FACTS.md).
 *
 * What it deliberately does not do: CUDA IPC (peers reading each other's device memory), which
 * would avoid the host round trip; overlap of one chunk's copies with the next chunk's reduction.
 * Both are faster, later. The GPU calls are behind ddp__devops (nccl/cudaops.c), so this file is
 * plain C and its staging logic is unit-tested with memcpy (tests/unit/test_nccl.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "group/staged/staged_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

/* ---- staging one collective ----------------------------------------------------------------- */

/* Runs the inner collective k (kind, buffers in the staging buffer, count) with c's other fields.
 */
static ddp_status inner_run(const ddp__stage *st, const ddp__coll *c, ddp__kind kind,
                            const void *send, void *recv, size_t count, ddp__fail *f)
{
    ddp__coll k = *c;
    k.kind = kind;
    k.send = send;
    k.recv = recv;
    k.count = count;
    k.device = DDP_DEVICE_CPU;
    k.stream = NULL;
    k.event = NULL;
    k.avg_div = st->inner->fuses_avg ? c->avg_div : 0;
    ddp_status s = st->inner->run(st->inner_be, &k, f);
    if (s == DDP_OK && c->avg_div > 1 && !st->inner->fuses_avg &&
        (kind == DDP__ALLREDUCE || kind == DDP__REDUCE_SCATTER))
        ddp__scale_avg(recv, count, c->dtype, c->avg_div);
    return s;
}

/* A device call's failure: f gets "cuda-staged: allreduce #3 (…) failed on member 1: <msg>".
 * The CPU backend is aborted with that line (as cuda-ipc does), so the peers, which would
 * otherwise wait for this rank in the inner collective until the deadline, fail at once and say
 * why. */
static ddp_status dev_fail(const ddp__stage *st, const ddp__coll *c, ddp_status s, const char *msg,
                           ddp__fail *f)
{
    char what[128];
    ddp__coll_what(c, what, sizeof what);
    f->status = s;
    ddp__fmt(f->msg, sizeof f->msg, "cuda-staged: %s failed on member %d: %s", what, st->me, msg);
    if (st->n > 1 && st->inner->abort)
        st->inner->abort(st->inner_be, f->msg);
    return s;
}

ddp_status ddp__staged_run(const ddp__stage *st, const ddp__coll *c, ddp__fail *f)
{
    const ddp__devops *d = st->dev;
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    if (c->kind == DDP__BARRIER)
        return inner_run(st, c, DDP__BARRIER, NULL, NULL, 0, f);
    if (c->device != DDP_DEVICE_CUDA) /* host buffers (the debug check's): the inner backend's */
        return inner_run(st, c, c->kind, c->send, c->recv, c->count, f);
    size_t e = ddp_dtype_size(c->dtype), n = (size_t)st->n, me = (size_t)st->me;
    /* Elements per chunk (per member for allgather and reduce_scatter, whose chunk holds n). */
    size_t per = c->kind == DDP__ALLGATHER || c->kind == DDP__REDUCE_SCATTER ? n : 1;
    size_t k = st->bytes / (e * per);
    if (k == 0)
        return dev_fail(st, c, DDP_ERR_INVALID, "the staging buffer holds no element", f);
    if ((s = d->after(d->ctx, c->stream, c->ready, msg)))
        return dev_fail(st, c, s, msg, f);
    char *buf = st->buf;
    const char *send = c->send;
    char *recv = c->recv;
    for (size_t off = 0; off < c->count || (c->count == 0 && off == 0); off += k) {
        size_t m = c->count - off < k ? c->count - off : k; /* elements this chunk (per member) */
        size_t b = m * e;
        switch (c->kind) {
        case DDP__ALLREDUCE:
            if ((b && (s = d->d2h(d->ctx, buf, send + off * e, b, msg))) ||
                (s = d->sync(d->ctx, c->deadline_ms, msg)))
                return dev_fail(st, c, s, msg, f);
            if ((s = inner_run(st, c, DDP__ALLREDUCE, buf, buf, m, f)))
                return s;
            if (b && (s = d->h2d(d->ctx, recv + off * e, buf, b, msg)))
                return dev_fail(st, c, s, msg, f);
            break;
        case DDP__BROADCAST:
            if (st->me == c->root && ((b && (s = d->d2h(d->ctx, buf, send + off * e, b, msg))) ||
                                      (s = d->sync(d->ctx, c->deadline_ms, msg))))
                return dev_fail(st, c, s, msg, f);
            if (st->me != c->root && (s = d->sync(d->ctx, c->deadline_ms, msg)))
                return dev_fail(st, c, s, msg, f); /* the last chunk's copy out of buf */
            if ((s = inner_run(st, c, DDP__BROADCAST, buf, buf, m, f)))
                return s;
            if (st->me != c->root && b && (s = d->h2d(d->ctx, recv + off * e, buf, b, msg)))
                return dev_fail(st, c, s, msg, f);
            break;
        case DDP__ALLGATHER: /* buf: n blocks of m elements; mine at me */
            if ((b && (s = d->d2h(d->ctx, buf + me * b, send + off * e, b, msg))) ||
                (s = d->sync(d->ctx, c->deadline_ms, msg)))
                return dev_fail(st, c, s, msg, f);
            if ((s = inner_run(st, c, DDP__ALLGATHER, buf + me * b, buf, m, f)))
                return s;
            for (size_t r = 0; b && r < n; r++)
                if ((s = d->h2d(d->ctx, recv + (r * c->count + off) * e, buf + r * b, b, msg)))
                    return dev_fail(st, c, s, msg, f);
            break;
        case DDP__REDUCE_SCATTER: /* buf: n blocks of m elements, block r for member r */
            for (size_t r = 0; b && r < n; r++)
                if ((s = d->d2h(d->ctx, buf + r * b, send + (r * c->count + off) * e, b, msg)))
                    return dev_fail(st, c, s, msg, f);
            if ((s = d->sync(d->ctx, c->deadline_ms, msg)))
                return dev_fail(st, c, s, msg, f);
            if ((s = inner_run(st, c, DDP__REDUCE_SCATTER, buf, buf + me * b, m, f)))
                return s;
            if (b && (s = d->h2d(d->ctx, recv + off * e, buf + me * b, b, msg)))
                return dev_fail(st, c, s, msg, f);
            break;
        default: return dev_fail(st, c, DDP_ERR_INVALID, "unknown collective", f);
        }
        if (c->count == 0)
            break;
    }
    /* The result is in device memory when this returns: the caller's next kernel may read it. */
    if ((s = d->sync(d->ctx, c->deadline_ms, msg)))
        return dev_fail(st, c, s, msg, f);
    return DDP_OK;
}

/* ---- the backend ---------------------------------------------------------------------------- */

typedef struct staged {
    ddp__gpu_share sh; /* first: the shared forwarders take the backend as it */
    ddp__stage st;
    bool pinned;
    bool own_buf; /* malloc'd: the inner backend has no arena */
} staged;

static ddp_status staged_run(void *be, const ddp__coll *c, ddp__fail *f)
{
    staged *s = be;
    return ddp__staged_run(&s->st, c, f);
}

/* ---- what cuda-staged and cuda-ipc share (staged_int.h) ------------------------------------ */

ddp_status ddp__share_start(ddp__gpu_share *sh, const ddp__setup *s, ddp_error *err)
{
    ddp_status st = s->fake_gpu ? ddp__fake_devops(&sh->dev, err)
                                : ddp__cuda_devops(s->cuda_device, &sh->dev, err);
    if (st)
        return st;
    sh->dev_made = true;
    ddp__setup host = *s;
    host.device = DDP_DEVICE_CPU;
    host.gpus = NULL;
    const ddp__backend *inner;
    if ((st = ddp__backend_choose(NULL, &host, &inner, err)) ||
        (st = inner->create(&host, &sh->inner_be, &sh->inner, err)))
        sh->inner = NULL;
    return st;
}

void ddp__share_end(ddp__gpu_share *sh)
{
    if (sh->inner)
        sh->inner->destroy(sh->inner_be);
    sh->inner = NULL;
    if (sh->dev_made)
        sh->dev.destroy(sh->dev.ctx);
    sh->dev_made = false;
}

void *ddp__share_alloc(void *be, size_t bytes)
{
    ddp__gpu_share *sh = be;
    return sh->dev.alloc(sh->dev.ctx, bytes);
}

void ddp__share_free(void *be, void *p)
{
    ddp__gpu_share *sh = be;
    sh->dev.free(sh->dev.ctx, p);
}

ddp_status ddp__share_copy(void *be, void *dst, const void *src, size_t bytes, char *msg)
{
    ddp__gpu_share *sh = be;
    return sh->dev.copy(sh->dev.ctx, dst, src, bytes, msg);
}

void ddp__share_abort(void *be, const char *why)
{
    ddp__gpu_share *sh = be;
    sh->inner->abort(sh->inner_be, why);
}

const ddp__devops *ddp__share_devops(void *be)
{
    ddp__gpu_share *sh = be;
    return &sh->dev;
}

/* ---- cuda-staged ------------------------------------------------------------------------------
 */

/* The end of the group's reason line: whether pinning worked (member 0's warning says why not). */
static const char *staged_detail(void *be)
{
    staged *s = be;
    return s->pinned ? "staging buffer pinned"
                     : "staging buffer not pinned (cudaHostRegister refused it): slower copies";
}

static void staged_destroy(void *be)
{
    staged *s = be;
    if (!s)
        return;
    if (s->pinned)
        s->sh.dev.unpin(s->sh.dev.ctx, s->st.buf);
    if (s->st.buf) {
        if (s->own_buf)
            free(s->st.buf);
        else if (s->sh.inner->free)
            s->sh.inner->free(s->sh.inner_be, s->st.buf);
    }
    ddp__share_end(&s->sh);
    free(s);
}

static const ddp__backend_ops staged_ops = {
    .name = "cuda-staged",
    .run = staged_run,
    .alloc = ddp__share_alloc,
    .free = ddp__share_free,
    .copy = ddp__share_copy,
    .abort = ddp__share_abort,
    .destroy = staged_destroy,
    .detail = staged_detail,
    .devops = ddp__share_devops,
    .fuses_avg = true,
};

static bool staged_usable(const ddp__setup *s, char *why, size_t cap)
{
    char reason[DDP_ERRMSG_MAX];
    if (ddp__setup_gpu_choice(s, reason, sizeof reason) == DDP__PICK_NONE) {
        ddp__fmt(why, cap, "cannot run this group: %s", reason);
        return false;
    }
    return true;
}

/* The staging buffer: 64 MiB by default (ddp_group_opts.arena_bytes), less when the arena is. */
static ddp_status staged_create(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                                ddp_error *err)
{
    staged *g = calloc(1, sizeof *g);
    if (!g)
        return ddp__err(err, DDP_ERR_NOMEM, "cuda-staged: out of memory");
    ddp_status st;
    char msg[DDP_ERRMSG_MAX];
    /* the device, and the host-side backend: what auto would pick for host buffers among the
     * same members */
    if ((st = ddp__share_start(&g->sh, s, err)))
        goto out_free;
    size_t bytes = s->arena_bytes ? s->arena_bytes : (size_t)64 << 20;
    /* Half the arena: the inner backend may keep staging of its own in the rest. */
    bytes /= 2;
    g->st.buf = g->sh.inner->alloc ? g->sh.inner->alloc(g->sh.inner_be, bytes) : NULL;
    if (!g->st.buf) {
        g->st.buf = malloc(bytes);
        g->own_buf = true;
        if (!g->st.buf) {
            st = ddp__err(err, DDP_ERR_NOMEM, "cuda-staged: out of memory for %zu bytes", bytes);
            goto out_free;
        }
    }
    /* Pinning is for speed only: copies to and from pageable memory are correct, just slower
     * (the runtime bounces them through its own pinned buffer). cudaHostRegister can refuse the
     * shared segment's pages (some kernels, VMs and containers), so a refusal is one line on
     * member 0 and the group goes on unpinned. */
    if (g->sh.dev.pin(g->sh.dev.ctx, g->st.buf, bytes, msg) == DDP_OK)
        g->pinned = true;
    else if (s->m.me == 0)
        fprintf(stderr,
                "ddp: cuda-staged: the staging buffer is not pinned (%s); copies go "
                "through pageable memory, slower\n",
                msg);
    g->st = (ddp__stage){.dev = &g->sh.dev,
                         .inner_be = g->sh.inner_be,
                         .inner = g->sh.inner,
                         .buf = g->st.buf,
                         .bytes = bytes,
                         .me = s->m.me,
                         .n = s->m.n};
    *be = g;
    *ops = &staged_ops;
    return DDP_OK;
out_free:
    staged_destroy(g);
    return st;
}

const ddp__backend ddp__staged_backend = {
    .name = "cuda-staged",
    .usable = staged_usable,
    .create = staged_create,
    .gpu = true,
    .pick = DDP__PICK_STAGED,
};
