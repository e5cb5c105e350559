/*
 * choice.c — which variant of the shm allreduce runs at which message size on this machine
 * (the variants: shm_int.h). shm.c asks once, at group creation; this file holds the decision
 * itself as pure functions (rules from cache sizes, the verdict over a probe's timings, the text
 * form of a choice) so that tests/unit/test_shm_choice.c can drive it with made-up machines and
 * timings, and the little I/O around it (sysfs, the cache file). It runs no collective.
 *
 * Why a choice at all (issue 16): the same algorithm was 3.6–3.9× ahead of Open MPI at 16–64 MB
 * on an AMD EPYC (1 MiB L2 per core in front of a 32 MiB shared L3) and 0.7× behind it at
 * 1–16 MB on an Intel Xeon (4 MiB L2 per core, non-inclusive shared L3). What differs between
 * the two is where a line lives after a core writes it, and whether memcpy streams: see
 * docs/group.md, "How the shm allreduce chooses its variant".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "group/shm/shm_int.h"
#include "util/util.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define CACHE_MAGIC "ddpc shm allreduce choice v1"

static const char *const variant_names[DDP__SHM_NVARIANTS] = {"libc", "cached", "stream",
                                                              "pipelined"};

const char *ddp__shm_variant_name(ddp__shm_variant v)
{
    return (unsigned)v < DDP__SHM_NVARIANTS ? variant_names[v] : "?";
}

bool ddp__shm_variant_parse(const char *name, ddp__shm_variant *out)
{
    for (int v = 0; name && v < DDP__SHM_NVARIANTS; v++)
        if (!strcmp(name, variant_names[v])) {
            *out = (ddp__shm_variant)v;
            return true;
        }
    return false;
}

/* Representatives 64 KiB · 4^b; a band reaches halfway (in log scale, ×2) to the next one. */
size_t ddp__shm_band_size(int band)
{
    return (64 * KiB) << (2 * band);
}

int ddp__shm_band_of(size_t bytes)
{
    int b = 0;
    while (b < DDP__SHM_NBANDS - 1 && bytes > 2 * ddp__shm_band_size(b))
        b++;
    return b;
}

uint32_t ddp__shm_block(const ddp__shm_machine *m)
{
    size_t q = m->l2 ? m->l2 / 4 : 256 * KiB;
    q = q < 128 * KiB ? 128 * KiB : q > MiB ? MiB : q;
    return (uint32_t)(q / 64 * 64);
}

/*
 * The rules, when there is no probe (DDP_SHM_ALGO=rules, more ranks than cores, an arena too
 * small to probe in). Written from the two machines we have figures for:
 *  - A small private L2 (≤ 1 MiB) in front of a large shared L3 (AMD Zen): "libc" everywhere.
 *    That is the algorithm measured at 0.49× the DRAM limit at 16 MB and 0.96× at 64 MB on the
 *    EPYC (bench/RESULTS.md), where glibc never streams (its threshold there is 240 MiB); the
 *    rules keep it exactly, so those figures cannot move through this file.
 *  - A large private L2 (≥ 2 MiB: Intel server cores since Skylake-SP, whose L3 is a
 *    non-inclusive victim cache): a line stays modified in the writer's L2 until evicted, so a
 *    peer that reads a whole 8 MB half only after the whole half was written finds it partly
 *    evicted, and glibc's memcpy streams any copy over a few MiB (its threshold follows the
 *    L3 share per thread), pushing the result out of the caches the next step reads it from.
 *    While the exchange fits in the caches (W·S ≤ L2·W + L3) "pipelined" (blocks of L2/4,
 *    copied while still cached, ordinary stores); beyond, "stream" (the result cannot stay
 *    cached anyway, and streaming saves the read-for-ownership) — which is what glibc's memcpy
 *    already did there, where the Xeon was ahead of Open MPI (1.6× at 64 MB).
 */
void ddp__shm_rules(const ddp__shm_machine *m, ddp__shm_choice *out)
{
    int W = m->members > 1 ? m->members : 2;
    size_t cache = m->l2 * (size_t)W + m->l3; /* everything the exchange can stay in */
    memset(out, 0, sizeof *out);
    out->block = ddp__shm_block(m);
    for (int b = 0; b < DDP__SHM_NBANDS; b++) {
        size_t ws = ddp__shm_band_size(b) * (size_t)W; /* every member's input */
        ddp__shm_variant v = DDP__SHM_LIBC;
        if (m->l2 >= 2 * MiB)
            v = ws <= cache ? DDP__SHM_PIPELINED : DDP__SHM_STREAM;
        out->band[b] = (uint8_t)v;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void ddp__shm_decide(const ddp__shm_machine *m, const ddp__shm_probe *p, ddp__shm_choice *out)
{
    int W = m->members > 1 ? m->members : 2;
    size_t cache = m->l2 * (size_t)W + m->l3;
    ddp__shm_rules(m, out);
    for (int b = 0; b < DDP__SHM_NBANDS; b++) {
        int reps = p->reps[b] < DDP__SHM_MAX_REPS ? p->reps[b] : DDP__SHM_MAX_REPS;
        if (reps < 2) /* one round is no pairing: keep the rule */
            continue;
        /* Non-temporal stores only pay when the result cannot stay in the caches anyway: while
         * every member's input fits (W·S ≤ L2·W + L3) the next step reads the result back from
         * DRAM. The probe's short trials can still favour them there — on the EPYC the probe
         * chose "stream" at 1 MiB, which then ran 1.35× slower than "libc" in steady state
         * (bench/RESULTS.md, 2026-11-23) — so they are not a candidate in such a band. */
        bool fits = ddp__shm_band_size(b) * (size_t)W <= cache;
        /* A probed band starts from "libc", the algorithm before the choice existed, not from
         * the rule: a variant replaces it only by winning clearly, so wherever the probe runs,
         * no machine can end up slower than before by more than the noise margin — including
         * the Xeon, whose rule (pipelined, stream) is reasoned, not measured. */
        int base = DDP__SHM_LIBC, best = base;
        double best_med = DDP__SHM_WIN;
        for (int v = 0; v < DDP__SHM_NVARIANTS; v++) {
            if (v == base || (fits && v == DDP__SHM_STREAM))
                continue;
            /* Paired rounds: the challenger and the rule's variant ran back to back in each, so
             * the ratio cancels what the machine was doing at the time. It must win every
             * round, and by a clear margin in the median: noise must not move the choice. */
            double r[DDP__SHM_MAX_REPS];
            bool all = true;
            for (int k = 0; k < reps; k++) {
                double tb = p->t[b][base][k], tv = p->t[b][v][k];
                r[k] = tv / tb;
                all = all && tb > 0 && tv > 0 && r[k] < 1.0;
            }
            if (!all)
                continue;
            qsort(r, (size_t)reps, sizeof *r, cmp_double);
            double med = reps % 2 ? r[reps / 2] : (r[reps / 2 - 1] + r[reps / 2]) / 2;
            if (med < best_med) {
                best_med = med;
                best = v;
            }
        }
        out->band[b] = (uint8_t)best;
    }
}

/* ---- text form and the cache file --------------------------------------------------------- */

void ddp__shm_cache_key(const ddp__shm_machine *m, char *key, size_t cap)
{
    ddp__fmt(key, cap, "%s|%zu|%zu|%zu|%d", m->model, m->l1d, m->l2, m->l3, m->members);
}

void ddp__shm_cache_path(const char *dir, const char *key, char *path, size_t cap)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    ddp__fmt(path, cap, "%s/shm-%016llx.txt", dir, (unsigned long long)h);
}

void ddp__shm_choice_format(const ddp__shm_choice *c, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int b = 0; b < DDP__SHM_NBANDS; b++) {
        ddp__fmt(out + len, cap - len, "%s%s", b ? "," : "",
                 ddp__shm_variant_name((ddp__shm_variant)c->band[b]));
        len = strlen(out);
    }
    ddp__fmt(out + len, cap - len, ";block=%u", (unsigned)c->block);
}

bool ddp__shm_choice_parse(const char *s, ddp__shm_choice *out)
{
    ddp__shm_choice c;
    memset(&c, 0, sizeof c);
    const char *p = s;
    for (int b = 0; b < DDP__SHM_NBANDS; b++) {
        size_t len = strcspn(p, ",;");
        char name[32];
        if (len == 0 || len >= sizeof name || p[len] != (b == DDP__SHM_NBANDS - 1 ? ';' : ','))
            return false;
        memcpy(name, p, len);
        name[len] = '\0';
        ddp__shm_variant v;
        if (!ddp__shm_variant_parse(name, &v))
            return false;
        c.band[b] = (uint8_t)v;
        p += len + 1;
    }
    char *end;
    if (strncmp(p, "block=", 6) != 0)
        return false;
    errno = 0;
    unsigned long blk = strtoul(p + 6, &end, 10);
    if (errno || end == p + 6 || (*end && *end != '\n') || blk < 64 || blk > (64ul << 20) ||
        blk % 64)
        return false;
    c.block = (uint32_t)blk;
    *out = c;
    return true;
}

bool ddp__shm_cache_load(const char *dir, const char *key, ddp__shm_choice *out)
{
    if (!dir || !*dir)
        return false;
    char path[4200];
    ddp__shm_cache_path(dir, key, path, sizeof path);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char magic[64], k[512], line[256];
    bool ok = fgets(magic, sizeof magic, f) && fgets(k, sizeof k, f) && fgets(line, sizeof line, f);
    fclose(f);
    if (!ok)
        return false;
    magic[strcspn(magic, "\n")] = '\0';
    k[strcspn(k, "\n")] = '\0';
    return !strcmp(magic, CACHE_MAGIC) && !strcmp(k, key) && ddp__shm_choice_parse(line, out);
}

bool ddp__shm_cache_save(const char *dir, const char *key, const ddp__shm_choice *c)
{
    if (!dir || !*dir)
        return false;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return false;
    char path[4200], tmp[4300], line[256];
    ddp__shm_cache_path(dir, key, path, sizeof path);
    ddp__fmt(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    ddp__shm_choice_format(c, line, sizeof line);
    FILE *f = fopen(tmp, "we");
    if (!f)
        return false;
    bool ok = fprintf(f, "%s\n%s\n%s\n", CACHE_MAGIC, key, line) > 0;
    ok = fclose(f) == 0 && ok;
    if (ok && rename(tmp, path) == 0)
        return true;
    unlink(tmp);
    return false;
}

/* ---- this machine ------------------------------------------------------------------------- */

static bool read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return ok;
}

/* "1024K", "32M" → bytes; 0 if unreadable. */
static size_t parse_cache_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    if (*end == 'K')
        v <<= 10;
    else if (*end == 'M')
        v <<= 20;
    else if (*end == 'G')
        v <<= 30;
    return (size_t)v;
}

void ddp__shm_machine_read(int members, ddp__shm_machine *out)
{
    memset(out, 0, sizeof *out);
    out->members = members;
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            const char *v = strchr(line, ':');
            if (v) {
                v += 1 + strspn(v + 1, " \t");
                ddp__fmt(out->model, sizeof out->model, "%.*s", (int)strcspn(v, "\n"), v);
                /* '|' separates the cache key's fields */
                for (char *p = out->model; *p; p++)
                    if (*p == '|')
                        *p = '/';
            }
            break;
        }
        fclose(f);
    }
    for (int i = 0; i < 8; i++) {
        char path[128], level[16], type[32], size[32];
        ddp__fmt(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!read_line(path, level, sizeof level))
            break;
        ddp__fmt(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (!read_line(path, type, sizeof type) || !strcmp(type, "Instruction"))
            continue;
        ddp__fmt(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!read_line(path, size, sizeof size))
            continue;
        size_t bytes = parse_cache_size(size);
        switch (atoi(level)) {
        case 1: out->l1d = bytes; break;
        case 2: out->l2 = bytes; break;
        case 3: out->l3 = bytes; break;
        default: break;
        }
    }
}
