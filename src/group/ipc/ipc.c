/*
 * ipc/ipc.c — the shared-GPU backend over CUDA IPC, "cuda-ipc": collectives on GPU buffers for
 * ranks of ONE host that share a GPU (NCCL refuses two ranks on one device), without the round
 * trip through host memory that cuda-staged makes.
 *
 * At creation each rank allocates one staging region of device memory (two halves, IN and OUT,
 * of H bytes each), exports it (cudaIpcGetMemHandle, behind ddp__devops), and the handles go to
 * every rank through the host channel: the CPU backend among the same ranks (shm), whose allgather
 * of bytes carries them. Each rank maps every peer's region (cudaIpcOpenMemHandle). A collective
 * then runs in chunks that fit a half, for example an allreduce chunk:
 *
 *   1. my input chunk → my IN (device to device, on the backend's stream, after the caller's);
 *   2. barrier: the host waits for its copies (polling, never a GPU spin: the ranks time-slice one
 *      GPU), then the CPU backend's barrier;
 *   3. I reduce MY slice (1/W of the chunk) reading the W peers' IN halves in the fixed order
 *      0, 1, …, W-1, into my OUT: every element is reduced once, by one rank, in one order, so
 *      the result is the same bits on every rank and on every run (and the host backends' bits:
 *      the arithmetic is cpu/reduce.c's); AVG divides once, at the end (fused);
 *   4. barrier; I copy every slice from its owner's OUT into my output.
 *
 * A half is written only once no peer can still be reading it: the ranks track which halves the
 * peers may still read (the same on every rank, since every rank runs the same steps) and put a
 * barrier before a write where needed; an allreduce needs two barriers per chunk, the next
 * chunk's first one covering the last read. Every collective ends with the ranks meeting once
 * more, so no peer reads a rank's region after that rank's collective has returned: it may free
 * the region (destroy needs no barrier) or fail without a peer reading freed memory.
 *
 * Every wait has the collective's deadline; a failure of the device or of the CPU backend (a dead
 * peer: shm notices it) fails the collective with a message, and abort() goes to the CPU backend,
 * which fails the peers at once. What it deliberately does not do: overlap one chunk's copies with
 * the next chunk's reduction, or run across hosts (cuda-staged and nccl do); a group whose GPUs
 * refuse IPC fails at creation, naming cuda-staged. UNVERIFIED on a GPU: compiled, and tested
 * only on the fake GPU (staged/fakedev.c), whose IPC is a memfd opened through /proc.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "group/staged/staged_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

enum { HALF_IN = 1, HALF_OUT = 2 };

typedef struct ipc {
    ddp__gpu_share sh; /* first: the device and the CPU backend among the same members (barriers,
                          the handles); the shared forwarders take the backend as it */
    char *region;      /* mine: IN at 0, OUT at half (device memory) */
    char **peer;       /* (n,) every member's region as mapped here; peer[me] = region */
    size_t half;       /* bytes in each half */
    int me, n;
    int reading; /* HALF_* bits: halves the peers may still be reading */
    char detail[96];
} ipc;

/* A failure of a device call: "cuda-ipc: allreduce #3 (float32 × N) failed on member 1: <msg>".
 * The CPU backend is aborted with that line, so the peers, which would otherwise wait for this
 * rank at the next barrier until the deadline, fail at once and say why. */
static ddp_status dev_fail(ipc *g, const ddp__coll *c, ddp_status s, const char *msg, ddp__fail *f)
{
    f->status = s;
    char what[160];
    ddp__coll_what(c, what, sizeof what);
    ddp__fmt(f->msg, sizeof f->msg, "cuda-ipc: %s failed on member %d: %s", what, g->me, msg);
    if (g->n > 1)
        g->sh.inner->abort(g->sh.inner_be, f->msg);
    return s;
}

/* The inner collective k on host memory with c's deadline, sequence and stall reports. */
static ddp_status inner_run(ipc *g, const ddp__coll *c, ddp__kind kind, const void *send,
                            void *recv, size_t count, ddp_dtype t, ddp__fail *f)
{
    ddp__coll k = *c;
    k.kind = kind;
    k.send = send;
    k.recv = recv;
    k.count = count;
    k.dtype = t;
    k.op = DDP_SUM;
    k.device = DDP_DEVICE_CPU;
    k.stream = NULL;
    k.event = NULL;
    k.avg_div = 0;
    ddp_status s = g->sh.inner->run(g->sh.inner_be, &k, f);
    if (s && c->kind != kind) { /* say which collective of this backend it was part of */
        char inner_msg[DDP_ERRMSG_MAX];
        ddp__fmt(inner_msg, sizeof inner_msg, "%s", f->msg);
        char what[160];
        ddp__coll_what(c, what, sizeof what);
        ddp__fmt(f->msg, sizeof f->msg,
                 "cuda-ipc: %s failed on member %d waiting for its peers (host %s): %s", what,
                 g->me, ddp__kind_name(kind), inner_msg);
    }
    return s;
}

/* The ranks meet: this rank's copies and reductions have landed (the host polls them), then the
 * CPU backend's barrier. Afterwards no peer reads any half from before it. */
static ddp_status meet(ipc *g, const ddp__coll *c, ddp__fail *f)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status s = g->sh.dev.sync(g->sh.dev.ctx, c->deadline_ms, msg);
    if (s)
        return dev_fail(g, c, s, msg, f);
    if (g->n > 1 && (s = inner_run(g, c, DDP__BARRIER, NULL, NULL, 0, c->dtype, f)))
        return s;
    g->reading = 0;
    return DDP_OK;
}

/* Before this rank writes half h of its region: a barrier if a peer may still read it. */
static ddp_status before_write(ipc *g, const ddp__coll *c, int h, ddp__fail *f)
{
    return g->reading & h ? meet(g, c, f) : DDP_OK;
}

/* Queues bytes from src to dst on the device (nothing for 0 bytes). */
static ddp_status d2d(ipc *g, void *dst, const void *src, size_t bytes, char *msg)
{
    return bytes ? g->sh.dev.d2d(g->sh.dev.ctx, dst, src, bytes, msg) : DDP_OK;
}

/* One allreduce chunk of m elements at element offset off. */
static ddp_status allreduce_chunk(ipc *g, const ddp__coll *c, size_t off, size_t m, ddp__fail *f)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    size_t e = ddp_dtype_size(c->dtype), W = (size_t)g->n;
    const void *srcs[DDP__IPC_MAX_SRCS];
    if ((s = before_write(g, c, HALF_IN, f)))
        return s;
    if ((s = d2d(g, g->region, (const char *)c->send + off * e, m * e, msg)))
        return dev_fail(g, c, s, msg, f);
    if ((s = meet(g, c, f)))
        return s;
    size_t lo = m * (size_t)g->me / W, hi = m * ((size_t)g->me + 1) / W;
    if (hi > lo) {
        for (size_t q = 0; q < W; q++) /* the fixed order: member 0 first */
            srcs[q] = g->peer[q] + lo * e;
        if ((s = g->sh.dev.reduce(g->sh.dev.ctx, g->region + g->half + lo * e, srcs, g->n, hi - lo,
                                  c->dtype, c->op, c->avg_div, msg)))
            return dev_fail(g, c, s, msg, f);
    }
    g->reading |= HALF_IN;
    if ((s = meet(g, c, f)))
        return s;
    for (size_t r = 0; r < W; r++) {
        size_t a = m * r / W, b = m * (r + 1) / W;
        if ((s = d2d(g, (char *)c->recv + (off + a) * e, g->peer[r] + g->half + a * e, (b - a) * e,
                     msg)))
            return dev_fail(g, c, s, msg, f);
    }
    g->reading |= HALF_OUT;
    return DDP_OK;
}

/* One reduce_scatter chunk: m elements of each member's block, at offset off in the blocks. */
static ddp_status reduce_scatter_chunk(ipc *g, const ddp__coll *c, size_t off, size_t m,
                                       ddp__fail *f)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    size_t e = ddp_dtype_size(c->dtype), W = (size_t)g->n, b = m * e;
    const void *srcs[DDP__IPC_MAX_SRCS];
    if ((s = before_write(g, c, HALF_IN, f)))
        return s;
    for (size_t r = 0; r < W; r++) /* my IN: W blocks of m elements, block r for member r */
        if ((s = d2d(g, g->region + r * b, (const char *)c->send + (r * c->count + off) * e, b,
                     msg)))
            return dev_fail(g, c, s, msg, f);
    if ((s = meet(g, c, f)))
        return s;
    if (m) {
        for (size_t q = 0; q < W; q++)
            srcs[q] = g->peer[q] + (size_t)g->me * b;
        if ((s = g->sh.dev.reduce(g->sh.dev.ctx, (char *)c->recv + off * e, srcs, g->n, m, c->dtype,
                                  c->op, c->avg_div, msg)))
            return dev_fail(g, c, s, msg, f);
    }
    g->reading |= HALF_IN;
    return DDP_OK;
}

/* One allgather chunk: m elements of every member's input at offset off. */
static ddp_status allgather_chunk(ipc *g, const ddp__coll *c, size_t off, size_t m, ddp__fail *f)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    size_t e = ddp_dtype_size(c->dtype), b = m * e;
    if ((s = before_write(g, c, HALF_IN, f)))
        return s;
    if ((s = d2d(g, g->region, (const char *)c->send + off * e, b, msg)))
        return dev_fail(g, c, s, msg, f);
    if ((s = meet(g, c, f)))
        return s;
    for (size_t r = 0; r < (size_t)g->n; r++)
        if ((s = d2d(g, (char *)c->recv + (r * c->count + off) * e, g->peer[r], b, msg)))
            return dev_fail(g, c, s, msg, f);
    g->reading |= HALF_IN;
    return DDP_OK;
}

/* One broadcast chunk: m elements of the root's buffer at offset off. */
static ddp_status broadcast_chunk(ipc *g, const ddp__coll *c, size_t off, size_t m, ddp__fail *f)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    size_t e = ddp_dtype_size(c->dtype), b = m * e;
    if ((s = before_write(g, c, HALF_IN, f)))
        return s;
    if (g->me == c->root && (s = d2d(g, g->region, (const char *)c->send + off * e, b, msg)))
        return dev_fail(g, c, s, msg, f);
    if ((s = meet(g, c, f)))
        return s;
    if (g->me != c->root && (s = d2d(g, (char *)c->recv + off * e, g->peer[c->root], b, msg)))
        return dev_fail(g, c, s, msg, f);
    g->reading |= HALF_IN;
    return DDP_OK;
}

static ddp_status ipc_run(void *be, const ddp__coll *c, ddp__fail *f)
{
    ipc *g = be;
    char msg[DDP_ERRMSG_MAX];
    ddp_status s;
    if (c->kind == DDP__BARRIER)
        return g->n > 1 ? inner_run(g, c, DDP__BARRIER, NULL, NULL, 0, c->dtype, f) : DDP_OK;
    if (c->device != DDP_DEVICE_CUDA) { /* host buffers (the debug check's): the CPU backend's */
        ddp__coll k = *c;
        k.avg_div = g->sh.inner->fuses_avg ? c->avg_div : 0;
        if ((s = g->sh.inner->run(g->sh.inner_be, &k, f)) == DDP_OK && c->avg_div > 1 &&
            !g->sh.inner->fuses_avg &&
            (c->kind == DDP__ALLREDUCE || c->kind == DDP__REDUCE_SCATTER))
            ddp__scale_avg(c->recv, c->count, c->dtype, c->avg_div);
        return s;
    }
    size_t e = ddp_dtype_size(c->dtype), per = 1;
    if (c->kind == DDP__REDUCE_SCATTER)
        per = (size_t)g->n; /* a chunk holds every member's block */
    size_t k = g->half / (e * per);
    if (k == 0)
        return dev_fail(g, c, DDP_ERR_INVALID, "the staging region holds no element", f);
    if (c->count == 0)
        return DDP_OK;
    if ((s = g->sh.dev.after(g->sh.dev.ctx, c->stream, c->ready, msg)))
        return dev_fail(g, c, s, msg, f);
    for (size_t off = 0; off < c->count; off += k) {
        size_t m = c->count - off < k ? c->count - off : k;
        switch (c->kind) {
        case DDP__ALLREDUCE: s = allreduce_chunk(g, c, off, m, f); break;
        case DDP__REDUCE_SCATTER: s = reduce_scatter_chunk(g, c, off, m, f); break;
        case DDP__ALLGATHER: s = allgather_chunk(g, c, off, m, f); break;
        case DDP__BROADCAST: s = broadcast_chunk(g, c, off, m, f); break;
        default: return dev_fail(g, c, DDP_ERR_INVALID, "unknown collective", f);
        }
        if (s)
            return s;
    }
    /* The result is in device memory when this returns (the caller's next kernel may read it),
     * and no peer reads this rank's region any more: the ranks meet once more, so a rank that
     * returns may free its region, or fail, without a peer still reading it. */
    return meet(g, c, f);
}

/* ---- the backend ---------------------------------------------------------------------------- */

static const char *ipc_detail(void *be)
{
    ipc *g = be;
    return g->detail;
}

static void ipc_destroy(void *be)
{
    ipc *g = be;
    if (!g)
        return;
    /* No peer reads my region once my last collective has returned (each ends with the ranks
     * meeting), so it is freed without a barrier here, which could pair with a peer's collective
     * when this rank leaves early. */
    for (int r = 0; g->peer && r < g->n; r++)
        if (r != g->me && g->peer[r])
            g->sh.dev.ipc_close(g->sh.dev.ctx, g->peer[r]);
    free(g->peer);
    if (g->region)
        g->sh.dev.free(g->sh.dev.ctx, g->region);
    ddp__share_end(&g->sh);
    free(g);
}

static const ddp__backend_ops ipc_ops = {
    .name = "cuda-ipc",
    .run = ipc_run,
    .alloc = ddp__share_alloc,
    .free = ddp__share_free,
    .copy = ddp__share_copy,
    .abort = ddp__share_abort,
    .destroy = ipc_destroy,
    .detail = ipc_detail,
    .devops = ddp__share_devops,
    .fuses_avg = true,
};

static bool ipc_usable(const ddp__setup *s, char *why, size_t cap)
{
    char reason[DDP_ERRMSG_MAX];
    if (ddp__setup_gpu_choice(s, reason, sizeof reason) == DDP__PICK_NONE) {
        ddp__fmt(why, cap, "cannot run this group: %s", reason);
        return false;
    }
    if (s->nhosts > 1) {
        ddp__fmt(why, cap,
                 "cannot run this group: its %d ranks are on %d hosts, and CUDA IPC maps device "
                 "memory within one host only; use backend 'auto', 'cuda-staged' or 'nccl'",
                 s->m.n, s->nhosts);
        return false;
    }
    if (s->m.n > DDP__IPC_MAX_SRCS) {
        ddp__fmt(why, cap,
                 "cannot run this group: %d ranks, more than the %d one reduction reads; use "
                 "backend 'cuda-staged'",
                 s->m.n, DDP__IPC_MAX_SRCS);
        return false;
    }
    return true;
}

/* A set-up step's failure on one rank, told to the others through the allgather of status bytes
 * that follows, so that every rank fails together, each saying what went wrong where. */
typedef struct setup_word {
    unsigned char ok;
    unsigned char handle[DDP__IPC_HANDLE_BYTES];
} setup_word;

/* Every member's ok byte (and, in the first round, handle) through the CPU backend. */
static ddp_status exchange(ipc *g, const ddp__setup *s, const setup_word *mine, setup_word *all,
                           const char *what, ddp_error *err)
{
    ddp__coll c = {.kind = DDP__ALLGATHER,
                   .send = mine,
                   .recv = all,
                   .count = sizeof *mine,
                   .dtype = DDP_UINT8,
                   .device = DDP_DEVICE_CPU,
                   .deadline_ms = ddp__now_ms() + s->timeout_ms};
    ddp__fail f = {0};
    if (g->sh.inner->run(g->sh.inner_be, &c, &f) != DDP_OK)
        return ddp__err(err, f.status ? f.status : DDP_ERR_NETWORK,
                        "cuda-ipc: exchanging %s among the ranks: %s", what, f.msg);
    return DDP_OK;
}

/* The staging region: half of ddp_group_opts.arena_bytes (64 MiB by default) in two halves. */
static ddp_status ipc_create(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                             ddp_error *err)
{
    ipc *g = calloc(1, sizeof *g);
    if (!g)
        return ddp__err(err, DDP_ERR_NOMEM, "cuda-ipc: out of memory");
    g->me = s->m.me;
    g->n = s->m.n;
    ddp_status st;
    char msg[DDP_ERRMSG_MAX] = "";
    setup_word *all = NULL;
    if ((st = ddp__share_start(&g->sh, s, err)))
        goto out_free;
    size_t bytes = (s->arena_bytes ? s->arena_bytes : (size_t)64 << 20) / 2;
    g->half = bytes / 2 / 256 * 256; /* each half aligned for any dtype and the copies */
    g->peer = calloc((size_t)g->n, sizeof *g->peer);
    all = calloc((size_t)g->n, sizeof *all);
    if (!g->peer || !all || g->half == 0) {
        st = ddp__err(err, DDP_ERR_NOMEM, "cuda-ipc: out of memory (or arena_bytes too small)");
        goto out_free;
    }
    /* Round 1: allocate and export, and every member's handle with whether that worked. */
    setup_word mine = {0};
    g->region = g->sh.dev.alloc(g->sh.dev.ctx, 2 * g->half);
    if (!g->region)
        ddp__fmt(msg, sizeof msg, "cannot allocate %zu bytes of device memory", 2 * g->half);
    else if (g->n == 1 ||
             g->sh.dev.ipc_export(g->sh.dev.ctx, g->region, mine.handle, msg) == DDP_OK)
        mine.ok = 1;
    if ((st = exchange(g, s, &mine, all, "the regions' IPC handles", err)))
        goto out_free;
    for (int r = 0; r < g->n && st == DDP_OK; r++)
        if (!all[r].ok)
            st = ddp__err(err, DDP_ERR_NOT_FOUND, /* every member alike: auto falls back */
                          "cuda-ipc: member %d (rank %d) could not export its staging region%s%s; "
                          "use backend 'cuda-staged' (DDP_BACKEND, ddptrain's gpu_backend)",
                          r, s->m.ranks[r], r == g->me ? ": " : "", r == g->me ? msg : "");
    if (st)
        goto out_free;
    /* Round 2: open every peer's region; whether every member could. */
    g->peer[g->me] = g->region;
    mine.ok = 1;
    for (int r = 0; r < g->n && mine.ok; r++) {
        void *p = NULL;
        if (r == g->me)
            continue;
        if (g->sh.dev.ipc_open(g->sh.dev.ctx, all[r].handle, &p, msg) == DDP_OK)
            g->peer[r] = p;
        else
            mine.ok = 0;
    }
    if ((st = exchange(g, s, &mine, all, "whether the regions opened", err)))
        goto out_free;
    for (int r = 0; r < g->n && st == DDP_OK; r++)
        if (!all[r].ok)
            st = ddp__err(err, DDP_ERR_NOT_FOUND, /* every member alike: auto falls back */
                          "cuda-ipc: member %d (rank %d) could not map its peers' staging "
                          "regions%s%s (CUDA IPC refused: a container without a shared IPC "
                          "namespace, or a GPU/driver without IPC); use backend 'cuda-staged' "
                          "(DDP_BACKEND, ddptrain's gpu_backend)",
                          r, s->m.ranks[r], r == g->me ? ": " : "", r == g->me ? msg : "");
    if (st)
        goto out_free;
    ddp__fmt(g->detail, sizeof g->detail, "%zu KiB × 2 device staging region per rank",
             g->half >> 10);
    free(all);
    *be = g;
    *ops = &ipc_ops;
    return DDP_OK;
out_free:
    free(all);
    ipc_destroy(g);
    return st;
}

const ddp__backend ddp__ipc_backend = {
    .name = "cuda-ipc",
    .usable = ipc_usable,
    .create = ipc_create,
    .gpu = true,
    .pick = DDP__PICK_IPC,
};
