/*
 * shm_int.h — private to src/group/shm (and its unit test, tests/unit/test_shm_choice.c): the
 * variants of the shm allreduce and the logic that chooses among them per message size and per
 * machine (choice.c). shm.c runs the variants, probes them at group creation, and publishes the
 * choice to every member through the segment.
 *
 * Every variant reduces each element exactly once, on one member, from the inputs in member
 * order (ddp__reduce_many), and only copies otherwise: the variants differ in which stores write
 * the copies and in how the message is cut, never in a bit of the result.
 */
#ifndef DDP_SHM_INT_H
#define DDP_SHM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The large allreduce's variants (messages over 32 KiB through staging, every size in the
 * arena): reduce-scatter then allgather through memory, member r reducing slice r. */
typedef enum ddp__shm_variant {
    DDP__SHM_LIBC,      /* "libc": the whole message cut in W slices; copies by memcpy, whose
                           stores (cached or streaming) the C library picks from its own view of
                           the caches. The only algorithm before issue 16. */
    DDP__SHM_CACHED,    /* "cached": whole slices; copies with ordinary stores only */
    DDP__SHM_STREAM,    /* "stream": whole slices; the peers' slices copied with non-temporal
                           stores (the result goes to memory, not the caches) */
    DDP__SHM_PIPELINED, /* "pipelined": blocks of ddp__shm_block() bytes, each reduced and then
                           copied (ordinary stores) while the peer's slice is still in cache */
    DDP__SHM_NVARIANTS
} ddp__shm_variant;

/* Message sizes (bytes per rank) are grouped in bands; one variant per band. Band b holds
 * (edge(b−1), edge(b)]; its representative size, which the probe measures, is
 * ddp__shm_band_size(b): 64 KiB, 256 KiB, 1, 4, 16, 64, 256 MiB. */
#define DDP__SHM_NBANDS 7
#define DDP__SHM_MAX_REPS 5

/* What the choice depends on: one host as this process sees it. */
typedef struct ddp__shm_machine {
    char model[128];    /* /proc/cpuinfo's model name ("" if unknown) */
    size_t l1d, l2, l3; /* bytes per instance (0 if unknown), from /sys/devices/system/cpu/cpu0 */
    int members;        /* ranks on this host */
} ddp__shm_machine;

/* The probe's timings, member 0's clock, seconds per call: t[b][v][k] for band b, variant v,
 * paired round k < reps[b] (reps[b] = 0: band not probed). */
typedef struct ddp__shm_probe {
    int reps[DDP__SHM_NBANDS];
    double t[DDP__SHM_NBANDS][DDP__SHM_NVARIANTS][DDP__SHM_MAX_REPS];
} ddp__shm_probe;

/* The choice: a variant per band, and the pipelined variant's block. */
typedef struct ddp__shm_choice {
    uint8_t band[DDP__SHM_NBANDS]; /* ddp__shm_variant */
    uint32_t block;                /* bytes, a multiple of 64 */
} ddp__shm_choice;

const char *ddp__shm_variant_name(ddp__shm_variant v);
/* The variant called name ("libc", "cached", "stream", "pipelined") into *out; false if none. */
bool ddp__shm_variant_parse(const char *name, ddp__shm_variant *out);

int ddp__shm_band_of(size_t bytes);
size_t ddp__shm_band_size(int band);

/* The pipelined variant's block: a quarter of the L2, within [128 KiB, 1 MiB] (256 KiB if the L2
 * is unknown). */
uint32_t ddp__shm_block(const ddp__shm_machine *m);

/* The fallback rule table, from cache sizes alone (no probe): see choice.c for the reasoning. */
void ddp__shm_rules(const ddp__shm_machine *m, ddp__shm_choice *out);

/* The choice from a probe: per band, the rule table's variant unless another one beat it in every
 * paired round (at least 2) and by at least DDP__SHM_WIN in the median ratio; bands not probed
 * keep the rule.
 * A pure function of its arguments, so every member given the same ones reaches the same table. */
#define DDP__SHM_WIN 0.92
void ddp__shm_decide(const ddp__shm_machine *m, const ddp__shm_probe *p, ddp__shm_choice *out);

/* The cache file's key: "model|l1d|l2|l3|members" (what makes two hosts alike for this choice),
 * and the file name in dir: "shm-<16 hex digits of its hash>.txt". */
void ddp__shm_cache_key(const ddp__shm_machine *m, char *key, size_t cap);
void ddp__shm_cache_path(const char *dir, const char *key, char *path, size_t cap);

/* The choice as one line ("libc,libc,pipelined,…;block=262144") and back; parse fails (false)
 * on anything but exactly what format writes. */
void ddp__shm_choice_format(const ddp__shm_choice *c, char *out, size_t cap);
bool ddp__shm_choice_parse(const char *s, ddp__shm_choice *out);

/* The cached choice for key in dir into *out: true if the file exists, is this version's and holds
 * key. Saving writes a temporary file and renames it over the old (creating dir, one level);
 * false if it cannot: the cache is a hint, and a failure costs only a probe next time. */
bool ddp__shm_cache_load(const char *dir, const char *key, ddp__shm_choice *out);
bool ddp__shm_cache_save(const char *dir, const char *key, const ddp__shm_choice *c);

/* This host as seen from here: model name and cache sizes (sysfs, not CPUID: under a hypervisor
 * CPUID's cache leaves can be far off — this project's EPYC VM reports a 320 MiB L3 through
 * them and 32 MiB through sysfs). */
void ddp__shm_machine_read(int members, ddp__shm_machine *out);

#endif /* DDP_SHM_INT_H */
