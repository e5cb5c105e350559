/*
 * backends.c — the registry of backends and how a group chooses one (group_int.h).
 *
 * Each backend lives in its own folder (shm/, tcp/, hier/) and exports one ddp__backend entry:
 * its name, a usable() predicate over where the members run, and create(). The table below lists
 * them in auto's order of preference: auto takes the first usable one, so shm when every rank is
 * on one host, shm+tcp across hosts that hold the same number of contiguous ranks, else tcp,
 * which runs anywhere. Under mpirun (set-up through MPI, no store), the MPI family stands in for
 * tcp: shm on one host, shm+mpi across regular hosts, else mpi; the store's backends then say
 * they need a store, and under ddprun the MPI ones say they need mpirun. A name picks its entry
 * directly and fails, saying why, when that backend cannot run the group; an unknown name lists the
 * known ones.
 * GPU groups (ddp_group_opts.device = cuda) consider only the entries that move GPU buffers (nccl,
 * cuda-ipc, cuda-staged), CPU groups only the others; which one auto takes for GPUs is the pure
 * function ddp__gpu_choice over the host layout (the entry whose .pick it returns), which the
 * entries' usable() also call.
 * Not here: the backends themselves, and learning where the ranks run (the core,
 * group.c, gathers every rank's host id through the store before it asks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "group/group_int.h"
#include "util/util.h"

/* Auto's order of preference. */
static const ddp__backend *const registry[] = {
    &ddp__nccl_backend,     &ddp__ipc_backend, &ddp__staged_backend, &ddp__shm_backend,
#ifdef DDP_HAVE_MPI
    &ddp__hier_mpi_backend,
#endif
    &ddp__hier_backend,
#ifdef DDP_HAVE_MPI
    &ddp__mpi_backend,
#endif
    &ddp__tcp_backend,
};
#define NREGISTRY (sizeof registry / sizeof registry[0])

void ddp__setup_place(ddp__setup *s)
{
    int W = s->m.n;
    const char *const *h = s->hosts;
    int nhosts = 0;
    for (int r = 0; r < W; r++) {
        bool seen = false;
        for (int q = 0; q < r && !seen; q++)
            seen = strcmp(h[q], h[r]) == 0;
        nhosts += !seen;
    }
    /* Regular: W/L blocks of L contiguous members, one host per block, no host in two blocks. */
    int L = 1;
    while (L < W && strcmp(h[L], h[0]) == 0)
        L++;
    bool regular = W > 0 && W % L == 0 && nhosts == W / L;
    for (int r = 0; regular && r < W; r++)
        if (strcmp(h[r], h[(r / L) * L]) != 0)
            regular = false;
    s->nhosts = nhosts;
    s->per_host = regular ? L : 0;
}

ddp_status ddp__backend_lookup(const char *want, const ddp__backend **out, ddp_error *err)
{
    if (!want || !*want || !strcmp(want, "auto")) {
        *out = NULL;
        return DDP_OK;
    }
    for (size_t i = 0; i < NREGISTRY; i++)
        if (!strcmp(want, registry[i]->name)) {
            *out = registry[i];
            return DDP_OK;
        }
    char names[256] = "auto";
    for (size_t i = 0; i < NREGISTRY; i++) {
        size_t l = strlen(names);
        ddp__fmt(names + l, sizeof names - l, "%s%s", i + 1 < NREGISTRY ? ", " : " or ",
                 registry[i]->name);
    }
    return ddp__err(err, DDP_ERR_INVALID, "unknown backend '%s': use %s", want, names);
}

/* Whether entry b can move the buffers of a group on device d. */
static bool moves(const ddp__backend *b, ddp_device d)
{
    return b->gpu == (d == DDP_DEVICE_CUDA);
}

ddp_status ddp__backend_choose(const ddp__backend *named, const ddp__setup *s,
                               const ddp__backend **out, ddp_error *err)
{
    char why[DDP_ERRMSG_MAX] = "";
    if (named) {
        if (!moves(named, s->device))
            return ddp__err(err, DDP_ERR_INVALID,
                            "backend '%s' moves %s buffers, but this group's are in %s memory; "
                            "use backend 'auto'%s",
                            named->name, named->gpu ? "GPU" : "host",
                            s->device == DDP_DEVICE_CUDA ? "GPU" : "host",
                            s->device == DDP_DEVICE_CUDA ? ", 'nccl', 'cuda-ipc' or 'cuda-staged'"
                                                         : ", 'shm', 'shm+tcp' or 'tcp'");
        if (!named->usable(s, why, sizeof why))
            return ddp__err(err, DDP_ERR_INVALID, "backend '%s' %s", named->name,
                            why[0] ? why : "cannot run this group");
        *out = named;
        return DDP_OK;
    }
    /* GPU groups: first the entry of ddp__gpu_choice's pick, then any that can run it. */
    if (s->device == DDP_DEVICE_CUDA) {
        char reason[DDP_ERRMSG_MAX];
        ddp__gpu_pick p = ddp__setup_gpu_choice(s, reason, sizeof reason);
        for (size_t i = 0; i < NREGISTRY; i++)
            if (registry[i]->gpu && registry[i]->pick == (int)p &&
                registry[i]->usable(s, why, sizeof why)) {
                *out = registry[i];
                return DDP_OK;
            }
    }
    for (size_t i = 0; i < NREGISTRY; i++)
        if (moves(registry[i], s->device) && registry[i]->usable(s, why, sizeof why)) {
            *out = registry[i];
            return DDP_OK;
        }
    /* The backends' reasons begin "cannot run this group: " for their named form above. */
    static const char same[] = "cannot run this group: ";
    const char *r = strncmp(why, same, sizeof same - 1) == 0 ? why + sizeof same - 1 : why;
    return ddp__err(err, DDP_ERR_INVALID, "backend 'auto': no backend can run this group%s%s",
                    r[0] ? ": " : "", r);
}

void ddp__backend_reason(const ddp__backend *chosen, bool named, const ddp__setup *s, char *why,
                         size_t cap)
{
    if (named) {
        ddp__fmt(why, cap, "named by the caller or DDP_BACKEND");
    } else if (chosen->gpu) {
        (void)ddp__setup_gpu_choice(s, why, cap);
    } else if (s->nhosts <= 1) {
        ddp__fmt(why, cap, "every rank on one host");
    } else if (s->per_host > 0 && !strncmp(chosen->name, "shm+", 4)) {
        ddp__fmt(why, cap, "%d hosts × %d rank%s: shm within each, %s among them", s->nhosts,
                 s->per_host, s->per_host == 1 ? "" : "s", chosen->name + 4);
    } else {
        ddp__fmt(why, cap, "%d hosts holding different numbers of ranks, or not contiguously",
                 s->nhosts);
    }
}

/* ---- GPU groups ------------------------------------------------------------------------------ */

int ddp__gpu_for_local_rank(int local_rank, int ngpus)
{
    if (ngpus <= 0 || local_rank < 0)
        return -1;
    return local_rank % ngpus;
}

ddp__gpu_pick ddp__gpu_choice(const ddp__gpu_layout *l, char *why, size_t cap)
{
    if (l->device != DDP_DEVICE_CUDA) {
        ddp__fmt(why, cap, "buffers in host memory");
        return DDP__PICK_HOST;
    }
    if (!l->cuda_built) {
        ddp__fmt(why, cap, "GPU buffers need a libddp built with CUDA (DDP_CUDA=ON)");
        return DDP__PICK_NONE;
    }
    int ranks = 0, gpus = 0, shared = -1;
    for (int h = 0; h < l->nhosts; h++) {
        if (l->gpus_per_host[h] <= 0) {
            ddp__fmt(why, cap, "host '%s' has no visible GPU for its %d rank%s",
                     l->host ? l->host[h] : "?", l->ranks_per_host[h],
                     l->ranks_per_host[h] == 1 ? "" : "s");
            return DDP__PICK_NONE;
        }
        ranks += l->ranks_per_host[h];
        gpus += l->gpus_per_host[h];
        if (shared < 0 && l->ranks_per_host[h] > l->gpus_per_host[h])
            shared = h;
    }
    if (shared < 0 && l->nccl_built) {
        ddp__fmt(why, cap, "every rank has a GPU of its own (%d rank%s on %d GPU%s, %d host%s)",
                 ranks, ranks == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s", l->nhosts,
                 l->nhosts == 1 ? "" : "s");
        return DDP__PICK_NCCL;
    }
    /* cuda-ipc when every rank uses the one GPU of the one host (peers' memory on the same
     * device: no peer-to-peer access needed); else staged through host memory. */
    bool ipc = l->nhosts == 1 && (l->gpus_per_host[0] == 1 || l->ranks_per_host[0] == 1);
    const char *how =
        ipc ? "peers' device memory mapped through CUDA IPC" : "staged through host memory";
    if (shared >= 0)
        ddp__fmt(why, cap,
                 "ranks share a GPU (%d ranks on %d GPU%s of host '%s'; NCCL refuses two ranks "
                 "on one GPU): %s",
                 l->ranks_per_host[shared], l->gpus_per_host[shared],
                 l->gpus_per_host[shared] == 1 ? "" : "s", l->host ? l->host[shared] : "?", how);
    else
        ddp__fmt(why, cap, "this libddp has no NCCL (DDP_NCCL=OFF): %s", how);
    return ipc ? DDP__PICK_IPC : DDP__PICK_STAGED;
}

ddp__gpu_pick ddp__setup_gpu_choice(const ddp__setup *s, char *why, size_t cap)
{
    int W = s->m.n;
    int *rph = calloc((size_t)W + 1, sizeof *rph), *gph = calloc((size_t)W + 1, sizeof *gph);
    const char **names = calloc((size_t)W + 1, sizeof *names);
    if (!rph || !gph || !names) {
        free(rph);
        free(gph);
        free(names);
        ddp__fmt(why, cap, "out of memory choosing a backend");
        return DDP__PICK_NONE;
    }
    int nh = 0;
    for (int r = 0; r < W; r++) {
        int h = 0;
        while (h < nh && strcmp(names[h], s->hosts[r]) != 0)
            h++;
        if (h == nh) {
            names[nh++] = s->hosts[r];
            gph[h] = s->gpus ? s->gpus[r] : 0;
        }
        rph[h]++;
        if (s->gpus && s->gpus[r] < gph[h]) /* ranks of a host that disagree: the fewest */
            gph[h] = s->gpus[r];
    }
    ddp__gpu_layout l = {.device = s->device,
                         .nhosts = nh,
                         .ranks_per_host = rph,
                         .gpus_per_host = gph,
                         .host = names,
                         .cuda_built = s->cuda_built,
                         .nccl_built = s->nccl_built};
    ddp__gpu_pick p = ddp__gpu_choice(&l, why, cap);
    free(rph);
    free(gph);
    free(names);
    return p;
}

ddp_status ddp__setup_bcast(const ddp__setup *s, const char *name, void *buf, size_t len,
                            ddp_error *err)
{
    if (s->mpi)
        return ddp__mpi_boot_bcast(s->mpi, s->m.ranks, s->m.n, s->m.me, buf, len, err);
    char key[256];
    ddp__fmt(key, sizeof key, "%s/%s", s->m.prefix, name);
    if (s->m.me == 0) {
        if (ddp_store_set(s->store, key, buf, len) != DDP_OK)
            return ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(s->store));
        return DDP_OK;
    }
    void *v = NULL;
    size_t got = 0;
    ddp_store_set_timeout(s->store, s->timeout_ms);
    ddp_status gs = ddp_store_get(s->store, key, &v, &got);
    if (gs != DDP_OK)
        return gs == DDP_ERR_CLOSED || gs == DDP_ERR_TIMEOUT
                   ? ddp__setup_store_failed(s->store, gs, err)
                   : ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(s->store));
    ddp_status st = DDP_OK;
    if (got != len)
        st = ddp__err(err, DDP_ERR_PROTOCOL, "set-up key '%s' holds %zu bytes, expected %zu", key,
                      got, len);
    else
        memcpy(buf, v, len);
    free(v);
    return st;
}

ddp_status ddp__setup_barrier(const ddp__setup *s, const char *name, ddp_error *err)
{
    if (s->mpi)
        return ddp__mpi_boot_barrier(s->mpi, s->m.ranks, s->m.n, s->m.me, err);
    char key[256];
    ddp__fmt(key, sizeof key, "%s/%s", s->m.prefix, name);
    ddp_store_set_timeout(s->store, s->timeout_ms);
    ddp_status bs = ddp_store_barrier(s->store, key, s->m.n);
    if (bs != DDP_OK)
        return bs == DDP_ERR_CLOSED
                   ? ddp__setup_store_failed(s->store, bs, err)
                   : ddp__err(err, DDP_ERR_TIMEOUT, "%s", ddp_store_last_error(s->store));
    return DDP_OK;
}

ddp_status ddp__setup_store_failed(ddp_store *store, ddp_status st, ddp_error *err)
{
    if (st == DDP_ERR_CLOSED) /* another rank's failure, in its own words (group.c) */
        return ddp__err(err, st, "%s", ddp_store_last_error(store));
    return ddp__err(err, DDP_ERR_TIMEOUT, "group set-up: %s", ddp_store_last_error(store));
}
