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
 * known ones. Not here: the backends themselves, and learning where the ranks run (the core,
 * group.c, gathers every rank's host id through the store before it asks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "group/group_int.h"
#include "util/util.h"

/* Auto's order of preference. */
static const ddp__backend *const registry[] = {
    &ddp__shm_backend,
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

ddp_status ddp__backend_choose(const ddp__backend *named, const ddp__setup *s,
                               const ddp__backend **out, ddp_error *err)
{
    char why[DDP_ERRMSG_MAX] = "";
    if (named) {
        if (!named->usable(s, why, sizeof why))
            return ddp__err(err, DDP_ERR_INVALID, "backend '%s' %s", named->name,
                            why[0] ? why : "cannot run this group");
        *out = named;
        return DDP_OK;
    }
    for (size_t i = 0; i < NREGISTRY; i++)
        if (registry[i]->usable(s, why, sizeof why)) {
            *out = registry[i];
            return DDP_OK;
        }
    return ddp__err(err, DDP_ERR_INVALID, "backend 'auto': no backend can run this group");
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
    if (ddp_store_get(s->store, key, &v, &got) != DDP_OK)
        return ddp__err(err, DDP_ERR_NETWORK, "%s", ddp_store_last_error(s->store));
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
    if (ddp_store_barrier(s->store, key, s->m.n) != DDP_OK)
        return ddp__err(err, DDP_ERR_TIMEOUT, "%s", ddp_store_last_error(s->store));
    return DDP_OK;
}
