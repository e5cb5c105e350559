/*
 * probe.c — how the shm backend picks its allreduce variant per size band when a group is created
 * (shm_int.h, "choosing"): member 0 starts from a forced variant (DDP_SHM_ALGO), this machine's
 * cache file, or the rules (choice.c), and when it asks for it every member takes part in a
 * short timed probe of every variant in its arena, after which member 0 decides and publishes
 * the choice through the segment's header. It runs collectives only through shm.c's barrier and
 * allreduce (segment_int.h); creating the segment, and saving the choice to the cache file, stay
 * in shm.c.
 */
#include <stdatomic.h>
#include <string.h>

#include "group/group_int.h"
#include "group/shm/segment_int.h"
#include "group/shm/shm_int.h"
#include "util/util.h"

#define ALGO_PROBE_ROUNDS 3      /* paired rounds it aims for … */
#define ALGO_PROBE_BUDGET_MS 300 /* … unless this much time has gone */
#define ALGO_PROBE_CALLS 3 /* timed calls per trial, the fastest kept (a preempted one is slow) */

/* The largest band the probe times: its representative must fit in one arena (and ≤ 16 MiB);
 * -1 if none does. The same on every member (arena_bytes is). */
int ddp__shm_probe_top_band(size_t arena_bytes)
{
    int top = -1;
    for (int band = 0; band < DDP__SHM_NBANDS; band++)
        if (ddp__shm_band_size(band) <= ALGO_PROBE_MAX && ddp__shm_band_size(band) <= arena_bytes)
            top = band;
    return top;
}

/* Times every variant at each band's representative size up to top, in place on buf (this
 * member's arena), every member taking part: rounds of (band: every variant in turn, the order
 * rotating by round), each trial one untimed call then one timed one on member 0's clock (the
 * call returns after its closing barrier, so it includes the slowest member). Member 0 decides
 * after each round whether another fits the budget and publishes that through the header. Then
 * member 0 decides the choice and publishes it; on return b->choice holds it everywhere. */
ddp_status ddp__shm_probe_variants(shm_be *b, const ddp__shm_machine *mach, float *buf, int top,
                                   int timeout_ms, ddp__shm_probe *p)
{
    memset(p, 0, sizeof *p);
    memset(buf, 0, ddp__shm_band_size(top)); /* zeros stay zeros: no overflow, no subnormals */
    ddp__coll c = {.kind = DDP__ALLREDUCE,
                   .send = buf,
                   .recv = buf,
                   .dtype = DDP_FLOAT32,
                   .op = DDP_SUM,
                   .deadline_ms = ddp__now_ms() + timeout_ms};
    int64_t t_start = ddp__now_ms();
    ddp_status st = DDP_OK;
    bool go = true;
    for (int k = 0; k < ALGO_PROBE_ROUNDS && go; k++) {
        for (int band = 0; band <= top && go; band++) {
            c.count = ddp__shm_band_size(band) / sizeof(float);
            for (int i = 0; i < DDP__SHM_NVARIANTS; i++) {
                b->forced = (i + k) % DDP__SHM_NVARIANTS;
                if ((st = ddp__shm_run_allreduce(b, &c)))
                    goto out;
                int64_t best = INT64_MAX;
                for (int r = 0; r < ALGO_PROBE_CALLS; r++) {
                    int64_t t0 = ddp__now_ns();
                    if ((st = ddp__shm_run_allreduce(b, &c)))
                        goto out;
                    int64_t dt = ddp__now_ns() - t0;
                    best = dt < best ? dt : best;
                }
                p->t[band][b->forced][k] = (double)best * 1e-9;
            }
            p->reps[band] = k + 1;
            /* Member 0 says whether the budget allows the next band; all hear it after the
             * barrier (it stores before it arrives). */
            if (b->me == 0)
                atomic_store(&b->hdr->probe_go, ddp__now_ms() - t_start < ALGO_PROBE_BUDGET_MS);
            if ((st = ddp__shm_barrier(b, &c)))
                goto out;
            go = atomic_load(&b->hdr->probe_go);
        }
    }
out:
    b->forced = -1;
    if (st)
        return st;
    if (b->me == 0) {
        ddp__shm_decide(mach, p, &b->choice);
        memcpy(b->hdr->algo_band, b->choice.band, sizeof b->choice.band);
        b->hdr->algo_block = b->choice.block;
    }
    if ((st = ddp__shm_barrier(b, &c))) /* the choice is in the header */
        return st;
    memcpy(b->choice.band, b->hdr->algo_band, sizeof b->choice.band);
    b->choice.block = b->hdr->algo_block;
    return DDP_OK;
}

/* DDP_SHM_ALGO: "auto" (or unset), "probe", "rules", or a variant's name. */
bool ddp__shm_algo_mode_valid(const char *mode)
{
    ddp__shm_variant v;
    return !mode || !*mode || !strcmp(mode, "auto") || !strcmp(mode, "probe") ||
           !strcmp(mode, "rules") || ddp__shm_variant_parse(mode, &v);
}

/* Member 0, before it publishes the segment: the choice every member starts from (forced, the
 * cache file's, or the rules), and whether all are to probe for a better one. */
void ddp__shm_algo_prepare(shm_be *b, const ddp__setup *s, const ddp__shm_machine *mach)
{
    const char *mode = s->shm_algo && *s->shm_algo ? s->shm_algo : "auto";
    ddp__shm_variant v;
    bool probe = false;
    ddp__shm_rules(mach, &b->choice);
    if (ddp__shm_variant_parse(mode, &v)) {
        memset(b->choice.band, v, sizeof b->choice.band);
    } else if (!strcmp(mode, "probe")) {
        probe = true;
    } else if (!strcmp(mode, "auto")) {
        char key[512];
        ddp__shm_cache_key(mach, key, sizeof key);
        probe = !ddp__shm_cache_load(s->cache_dir, key, &b->choice);
    }
    /* Timings mean something only with a core per member and something to time. */
    if (b->n < 2 || b->n > b->ncores || ddp__shm_probe_top_band(b->hdr->arena_bytes) < 0)
        probe = false;
    memcpy(b->hdr->algo_band, b->choice.band, sizeof b->choice.band);
    b->hdr->algo_block = b->choice.block;
    b->hdr->algo_probe = probe;
}
