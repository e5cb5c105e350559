/*
 * segment_int.h — private to src/group/shm: the shared segment's layout and a member's handle on
 * it (shm.c, the top of which describes the protocol), shared with the variant probe (probe.c),
 * which runs collectives through the two entry points below.
 */
#ifndef DDP_SHM_SEGMENT_INT_H
#define DDP_SHM_SEGMENT_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "group/group_int.h"
#include "group/shm/shm_int.h"

#define CACHELINE 64
#define MAX_MEMBERS 1024
#define ALGO_PROBE_MAX ((size_t)16 << 20) /* the largest message the variant probe times */

typedef struct shm_header {
    uint32_t magic;
    uint32_t n;
    uint64_t staging_off, arena_off, arena_bytes, total;
    atomic_int abort_claim; /* the first aborting member wins the right to write abort_msg */
    atomic_int abort_by;    /* 0, or 1 + the member that aborted (set after abort_msg) */
    /* the first barrier epoch the aborting member had not passed (set before abort_by): a
     * barrier before it was complete everywhere, and a member still leaving it goes on */
    atomic_uint abort_epoch;
    char abort_msg[320];
    /* The allreduce's choice (shm_int.h): written by member 0 before it publishes the segment's
     * name, or after the probe, which runs only if algo_probe is set. */
    uint8_t algo_band[DDP__SHM_NBANDS];
    uint32_t algo_block;
    uint32_t algo_probe;
    _Atomic uint32_t probe_go; /* member 0, between probe rounds: 1 = another round */
    int32_t pids[MAX_MEMBERS];
} shm_header;

/* One member's control slot: four cache lines. */
typedef struct shm_slot {
    _Alignas(CACHELINE) atomic_uint arrive; /* barrier epoch this member has reached */
    /* What this member runs, posted before the opening barrier of each collective: (that
     * barrier's epoch << 32) | a 32-bit hash of the collective, in arrive's line, which the
     * peers read anyway, so that the check after that barrier costs no extra cache miss; the
     * details for the message (desc_count, desc_misc) in the posted line below. */
    _Atomic uint64_t desc_key;
    /* The CPU this member ran on when it last arrived (sched_getcpu), in arrive's line too: a
     * waiter whose late peer keeps sharing its CPU moves off it (shm.c, Waiting). */
    atomic_int cpu;
    _Alignas(CACHELINE) atomic_uint sleepers; /* peers sleeping on `arrive` */
    _Alignas(CACHELINE) uint64_t src_off;     /* posted: where my input for this step is */
    uint64_t dst_off;                         /* posted: where my result will be (or UINT64_MAX) */
    _Atomic uint64_t posted; /* (opening barrier epoch << 1) | my buffers are in the arena */
    /* the collective of desc_key: its count, and kind | dtype << 8 | op << 16 | (root + 1) << 24 */
    _Atomic uint64_t desc_count, desc_misc;
    _Alignas(CACHELINE) atomic_uint ping; /* distance probe: the last token I wrote */
    atomic_uint left;    /* 1 once this member destroyed its group: it arrives nowhere any more */
    uint32_t will_probe; /* set before the attach barrier: this member can take part in probes */
    uint32_t algo_ready; /* set before the attach barrier: I hold an arena buffer to probe with */
} shm_slot;

typedef struct shm_be {
    int me, n;
    int ncores;
    const int *ranks_view; /* copy below */
    int *ranks;
    char name[128];
    char *base; /* the mapping */
    size_t size;
    int fd; /* kept to reserve arena pages with fallocate */
    shm_header *hdr;
    shm_slot *slots;
    int *pidfds;
    uint32_t epoch;      /* barriers passed, the same count on every member */
    atomic_uint passed;  /* the last barrier epoch this member has passed (abort reads it) */
    uint32_t desc_epoch; /* the opening barrier of the collective being run (post_desc) */
    uint64_t chunks;     /* staging chunks used so far, for alternating halves */
    int spin;            /* spin iterations before sleeping */
    int shared_waits;    /* long spins in a row that found the peer on this CPU (shm.c) */
    bool *far;           /* per member: evict what I read from it (see Distance above) */
    uint32_t probes;     /* distance probes run, the same count on every member */
    bool can_flush; /* every member has CLFLUSHOPT, a core to spin on, and DDP_SHM_FLUSH auto */
    ddp__shm_choice choice; /* the allreduce's variant per size band, the same on every member */
    int forced;             /* ≥ 0: the variant every allreduce runs (the probe's trials) */
    bool failed;
    ddp__fail fail;
    /* The arena: a bump allocator with a free list of exact-size blocks would be enough for the
     * reducer's few big buffers; we keep it to first-fit over a small block table. */
    struct blk {
        size_t off, len;
        bool used;
    } * blks;
    size_t nblks, cap_blks;
} shm_be;

/* A barrier among all members (shm.c). Stores before it are visible to every member after it. */
ddp_status ddp__shm_barrier(shm_be *b, const ddp__coll *c);
/* Runs the allreduce c among all members (shm.c), in b->forced's variant when that is ≥ 0. */
ddp_status ddp__shm_run_allreduce(shm_be *b, const ddp__coll *c);

/* ---- choosing the allreduce's variant at creation (probe.c) ---- */

/* DDP_SHM_ALGO: "auto" (or unset), "probe", "rules", or a variant's name. */
bool ddp__shm_algo_mode_valid(const char *mode);
/* Member 0, before it publishes the segment: the choice every member starts from (forced, the
 * cache file's, or the rules), and whether all are to probe for a better one. */
void ddp__shm_algo_prepare(shm_be *b, const ddp__setup *s, const ddp__shm_machine *mach);
/* The largest band the probe times: its representative must fit in one arena (and ≤ 16 MiB);
 * -1 if none does. The same on every member (arena_bytes is). */
int ddp__shm_probe_top_band(size_t arena_bytes);
/* Times every variant up to band top in place on buf (this member's arena), every member taking
 * part; on return b->choice holds member 0's decision everywhere, and *p the timings. */
ddp_status ddp__shm_probe_variants(shm_be *b, const ddp__shm_machine *mach, float *buf, int top,
                                   int timeout_ms, ddp__shm_probe *p);

#endif /* DDP_SHM_SEGMENT_INT_H */
