/*
 * hier.c — the hierarchical backends: shm among the ranks of each host, and a network backend
 * among one leader per host (its local rank 0): tcp ("shm+tcp", under ddprun) or MPI ("shm+mpi",
 * under mpirun). Used by "auto" when the job spans hosts. Below, "tcp" stands for either.
 *
 *   allreduce       shm allreduce → leaders' tcp allreduce → shm broadcast from the leader
 *   broadcast       shm broadcast on the root's host → leaders' tcp broadcast → shm broadcast
 *   allgather       shm allgather into the host's block → leaders' tcp allgather of blocks →
 *                   shm broadcast of the whole result
 *   reduce_scatter  allreduce of the whole input into scratch, then each keeps its part
 *   barrier         shm, leaders' tcp, shm
 * Network traffic is one host's worth per host, not one rank's worth per rank. It needs ranks
 * contiguous per host and the same number on every host (what ddprun gives): usable() says so,
 * and auto then takes plain tcp among all ranks instead (backends.c). Deliberately simple: a
 * leader-only network phase leaves the other ranks idle; splitting the vector across all local
 * ranks' connections is the next step.
 * Not here: moving bytes (the shm and tcp backends it is made of).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "group/group_int.h"
#include "util/util.h"

typedef struct hier_be {
    void *shm, *tcp; /* tcp: the network backend among leaders, tcp or mpi */
    const ddp__backend_ops *shm_ops, *tcp_ops;
    int L, node, nnodes, lr;
    int *local_ranks, *leader_ranks;
    char local_prefix[96], cross_prefix[96];
    void *scratch;
    size_t scratch_bytes;
} hier_be;

static ddp_status sub(void *be, const ddp__backend_ops *ops, ddp__coll c, ddp__fail *f)
{
    return ops->run(be, &c, f);
}

/* The leaders' step among hosts. When it fails, this host's other ranks, which wait for the
 * leader in the next shm step, are told at once (shm's abort, with the leader's message: they
 * report "rank L aborted the group: …", a peer's failure) rather than when it exits or at their
 * deadline. */
static ddp_status cross(hier_be *b, ddp__coll c, ddp__fail *f)
{
    ddp_status st = b->tcp_ops->run(b->tcp, &c, f);
    if (st != DDP_OK && b->L > 1)
        b->shm_ops->abort(b->shm, f->msg);
    return st;
}

static ddp_status hier_run(void *bep, const ddp__coll *c, ddp__fail *f)
{
    hier_be *b = bep;
    bool leader = b->lr == 0;
    size_t esz = ddp_dtype_size(c->dtype);
    ddp__coll x = *c;
    ddp_status st = DDP_OK;
    switch (c->kind) {
    case DDP__ALLREDUCE: {
        /* AVG (fused): the host's sum, then the leaders' sum divided by the world (tcp and mpi
         * divide before rounding a bfloat16/float16 sum: two roundings in all, not three) */
        ddp__coll in = x;
        in.avg_div = 0;
        if ((st = sub(b->shm, b->shm_ops, in, f)))
            return st;
        x.send = x.recv;
        if (leader && (st = cross(b, x, f)))
            return st;
        x.kind = DDP__BROADCAST;
        x.root = 0;
        x.avg_div = 0;
        return sub(b->shm, b->shm_ops, x, f);
    }
    case DDP__BROADCAST: {
        int rnode = c->root / b->L, rl = c->root % b->L;
        if (b->node == rnode) {
            x.root = rl;
            if ((st = sub(b->shm, b->shm_ops, x, f)))
                return st;
        }
        x.root = rnode;
        if (leader && (st = cross(b, x, f)))
            return st;
        if (b->node != rnode) {
            x.root = 0;
            st = sub(b->shm, b->shm_ops, x, f);
        }
        return st;
    }
    case DDP__ALLGATHER: {
        char *block = (char *)c->recv + (size_t)b->node * (size_t)b->L * c->count * esz;
        x.recv = block;
        if ((st = sub(b->shm, b->shm_ops, x, f)))
            return st;
        x.send = block;
        x.recv = c->recv;
        x.count = c->count * (size_t)b->L;
        if (leader && (st = cross(b, x, f)))
            return st;
        x.kind = DDP__BROADCAST;
        x.root = 0;
        x.send = x.recv = c->recv;
        x.count = c->count * (size_t)b->L * (size_t)b->nnodes;
        return sub(b->shm, b->shm_ops, x, f);
    }
    case DDP__REDUCE_SCATTER: {
        if (c->count == 0) { /* nothing to move, but keep every member's steps in step */
            x.kind = DDP__BARRIER;
            return hier_run(b, &x, f);
        }
        size_t W = (size_t)b->L * (size_t)b->nnodes;
        size_t bytes = W * c->count * esz;
        if (bytes > b->scratch_bytes) {
            void *p = realloc(b->scratch, bytes);
            if (!p) {
                f->status = DDP_ERR_NOMEM;
                ddp__fmt(f->msg, sizeof f->msg, "reduce_scatter #%llu: no memory for %zu bytes",
                         (unsigned long long)c->seq, bytes);
                return DDP_ERR_NOMEM;
            }
            b->scratch = p;
            b->scratch_bytes = bytes;
        }
        x.kind = DDP__ALLREDUCE;
        x.recv = b->scratch;
        x.count = W * c->count;
        if ((st = hier_run(b, &x, f)))
            return st;
        int me = b->node * b->L + b->lr;
        memmove(c->recv, (char *)b->scratch + (size_t)me * c->count * esz, c->count * esz);
        return DDP_OK;
    }
    case DDP__BARRIER:
        if ((st = sub(b->shm, b->shm_ops, x, f)))
            return st;
        if (leader && (st = cross(b, x, f)))
            return st;
        return sub(b->shm, b->shm_ops, x, f);
    default:
        f->status = DDP_ERR_INVALID;
        ddp__fmt(f->msg, sizeof f->msg, "unknown collective");
        return DDP_ERR_INVALID;
    }
}

static void *hier_alloc(void *be, size_t bytes)
{
    hier_be *b = be;
    return b->shm_ops->alloc ? b->shm_ops->alloc(b->shm, bytes) : NULL;
}

static void hier_free(void *be, void *p)
{
    hier_be *b = be;
    if (b->shm_ops->free)
        b->shm_ops->free(b->shm, p);
}

static void hier_abort(void *be, const char *why)
{
    hier_be *b = be;
    b->shm_ops->abort(b->shm, why);
    if (b->tcp)
        b->tcp_ops->abort(b->tcp, why);
}

static void hier_destroy(void *be)
{
    hier_be *b = be;
    if (!b)
        return;
    if (b->tcp)
        b->tcp_ops->destroy(b->tcp);
    if (b->shm)
        b->shm_ops->destroy(b->shm);
    free(b->local_ranks);
    free(b->leader_ranks);
    free(b->scratch);
    free(b);
}

static const ddp__backend_ops hier_ops = {
    .name = "shm+tcp",
    .run = hier_run,
    .fuses_avg = true,
    .alloc = hier_alloc,
    .free = hier_free,
    .abort = hier_abort,
    .destroy = hier_destroy,
};

#ifdef DDP_HAVE_MPI
static const ddp__backend_ops hier_mpi_ops = {
    .name = "shm+mpi",
    .run = hier_run,
    .fuses_avg = true,
    .alloc = hier_alloc,
    .free = hier_free,
    .abort = hier_abort,
    .destroy = hier_destroy,
};
#endif

static bool hier_placed(const ddp__setup *s, char *why, size_t cap);

static bool hier_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (!s->store) {
        ddp__fmt(why, cap,
                 "needs the rendezvous store, and this job was set up through MPI (mpirun); use "
                 "backend 'auto' or 'shm+mpi', or start the job with ddprun");
        return false;
    }
    return hier_placed(s, why, cap);
}

/* Whether the placement suits a hierarchy (both kinds). */
static bool hier_placed(const ddp__setup *s, char *why, size_t cap)
{
    if (s->nhosts < 2) {
        ddp__fmt(why, cap, "needs ranks on more than one host; use backend 'auto' or 'shm'");
        return false;
    }
    if (s->per_host == 0) {
        ddp__fmt(why, cap,
                 "needs the same number of ranks on every host, contiguous by rank (as ddprun "
                 "starts them); use backend 'auto' (it then takes tcp, or mpi under mpirun)");
        return false;
    }
    return true;
}

/* shm within hosts, the cross entry among leaders; *ops becomes hops. */
static ddp_status hier_make(const ddp__setup *s, const ddp__backend *cross,
                            const ddp__backend_ops *hops, void **out, const ddp__backend_ops **ops,
                            ddp_error *err)
{
    const ddp__members *m = &s->m;
    int W = m->n, L = s->per_host;
    if (L < 1 || W % L != 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "hierarchical backend: ranks are not spread evenly over hosts");
    hier_be *b = calloc(1, sizeof *b);
    if (!b)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the hierarchical backend");
    b->L = L;
    b->nnodes = W / L;
    b->node = m->me / L;
    b->lr = m->me % L;
    b->local_ranks = malloc(sizeof(int) * (size_t)L);
    b->leader_ranks = malloc(sizeof(int) * (size_t)b->nnodes);
    ddp_status st = DDP_ERR_NOMEM;
    if (!b->local_ranks || !b->leader_ranks) {
        ddp__err(err, st, "out of memory creating the hierarchical backend");
        goto out_fail;
    }
    for (int i = 0; i < L; i++)
        b->local_ranks[i] = m->ranks[b->node * L + i];
    for (int i = 0; i < b->nnodes; i++)
        b->leader_ranks[i] = m->ranks[i * L];
    ddp__fmt(b->local_prefix, sizeof b->local_prefix, "%s/host%d", m->prefix, b->node);
    ddp__fmt(b->cross_prefix, sizeof b->cross_prefix, "%s/leaders", m->prefix);
    /* shm among this host's members: one host, L members. */
    ddp__setup ls = *s;
    ls.m.me = b->lr;
    ls.m.n = L;
    ls.m.ranks = b->local_ranks;
    ls.m.prefix = b->local_prefix;
    ls.hosts = s->hosts + (size_t)b->node * (size_t)L;
    ls.nhosts = 1;
    ls.per_host = L;
    if ((st = ddp__shm_backend.create(&ls, &b->shm, &b->shm_ops, err)))
        goto out_fail;
    if (b->lr == 0) { /* tcp among the leaders: one member per host */
        ddp__setup xs = *s;
        xs.m.me = b->node;
        xs.m.n = b->nnodes;
        xs.m.ranks = b->leader_ranks;
        xs.m.prefix = b->cross_prefix;
        xs.hosts = NULL; /* tcp does not look */
        xs.nhosts = b->nnodes;
        xs.per_host = 1;
        if ((st = cross->create(&xs, &b->tcp, &b->tcp_ops, err)))
            goto out_fail;
    }
    *out = b;
    *ops = hops;
    return DDP_OK;
out_fail:
    hier_destroy(b);
    return st;
}

static ddp_status hier_create(const ddp__setup *s, void **out, const ddp__backend_ops **ops,
                              ddp_error *err)
{
    return hier_make(s, &ddp__tcp_backend, &hier_ops, out, ops, err);
}

const ddp__backend ddp__hier_backend = {
    .name = "shm+tcp",
    .usable = hier_usable,
    .create = hier_create,
    .boot = DDP__BOOT_STORE,
};

#ifdef DDP_HAVE_MPI
static bool hier_mpi_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (!s->mpi) {
        ddp__fmt(why, cap,
                 "needs processes started by an MPI launcher (mpirun); under ddprun use backend "
                 "'auto' or 'shm+tcp'");
        return false;
    }
    return hier_placed(s, why, cap);
}

static ddp_status hier_mpi_create(const ddp__setup *s, void **out, const ddp__backend_ops **ops,
                                  ddp_error *err)
{
    return hier_make(s, &ddp__mpi_backend, &hier_mpi_ops, out, ops, err);
}

const ddp__backend ddp__hier_mpi_backend = {
    .name = "shm+mpi",
    .usable = hier_mpi_usable,
    .create = hier_mpi_create,
    .boot = DDP__BOOT_MPI,
};
#endif
