/*
 * backends.c — the registry of backends and how a group chooses one (group_int.h).
 *
 * Each backend lives in its own folder (shm/, tcp/, hier/) and exports one ddp__backend entry:
 * its name, a usable() predicate over where the members run, and create(). The table below lists
 * them in auto's order of preference: auto takes the first usable one, so shm when every rank is
 * on one host, shm+tcp across hosts that hold the same number of contiguous ranks, else tcp,
 * which runs anywhere. A name picks its entry directly and fails, saying why, when that backend
 * cannot run the group; an unknown name lists the known ones.
 * Not here: the backends themselves, and learning where the ranks run (the core, group.c, gathers
 * every rank's host id through the store before it asks).
 */
#include <stdio.h>
#include <string.h>

#include "group/group_int.h"
#include "util/util.h"

/* Auto's order of preference. */
static const ddp__backend *const registry[] = {
    &ddp__shm_backend,
    &ddp__hier_backend,
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
