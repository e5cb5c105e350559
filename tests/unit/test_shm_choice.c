/*
 * test_shm_choice.c — how the shm allreduce chooses its variant per size and per machine
 * (src/group/shm/choice.c), as pure functions over made-up machines and probe timings: the size
 * bands, the rule table from cache sizes (an EPYC-like host keeps the algorithm its figures were
 * measured with; a Xeon-like one with a 4 MiB L2 gets cached, pipelined copies while the exchange
 * fits in cache), the verdict over paired probe rounds (a clear, consistent winner replaces the
 * rule; noise does not), the cache file's text and its round trip through a directory. The
 * variants' results are checked against the reference by collcheck --edges
 * (collectives.shm.algo.*), which runs each one forced.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "group/shm/shm_int.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* This project's machine: AMD EPYC (Zen 4) VM, 2 vCPUs, 1 MiB L2 each, 32 MiB shared L3. */
static ddp__shm_machine epyc(void)
{
    ddp__shm_machine m = {
        .model = "AMD EPYC", .l1d = 32 * KiB, .l2 = MiB, .l3 = 32 * MiB, .members = 2};
    return m;
}

/* Issue 16's machine: Intel Xeon VM, 2 vCPUs, 4 MiB L2 each, one shared L3. */
static ddp__shm_machine xeon(void)
{
    ddp__shm_machine m = {.model = "Intel(R) Xeon(R) Processor",
                          .l1d = 48 * KiB,
                          .l2 = 4 * MiB,
                          .l3 = 48 * MiB,
                          .members = 2};
    return m;
}

static void bands(void **state)
{
    (void)state;
    assert_int_equal(ddp__shm_band_size(0), 64 * KiB);
    assert_int_equal(ddp__shm_band_size(2), MiB);
    assert_int_equal(ddp__shm_band_size(4), 16 * MiB);
    assert_int_equal(ddp__shm_band_size(6), 256 * MiB);
    assert_int_equal(ddp__shm_band_of(0), 0);
    assert_int_equal(ddp__shm_band_of(4 * KiB), 0);
    assert_int_equal(ddp__shm_band_of(128 * KiB), 0);
    assert_int_equal(ddp__shm_band_of(128 * KiB + 1), 1);
    assert_int_equal(ddp__shm_band_of(512 * KiB), 1);
    assert_int_equal(ddp__shm_band_of(MiB), 2);
    assert_int_equal(ddp__shm_band_of(2 * MiB), 2);
    assert_int_equal(ddp__shm_band_of(2 * MiB + 1), 3);
    assert_int_equal(ddp__shm_band_of(16 * MiB), 4);
    assert_int_equal(ddp__shm_band_of(64 * MiB), 5);
    assert_int_equal(ddp__shm_band_of(256 * MiB), 6);
    assert_int_equal(ddp__shm_band_of((size_t)1 << 34), 6);
    /* Each band's representative size falls in the band. */
    for (int b = 0; b < DDP__SHM_NBANDS; b++)
        assert_int_equal(ddp__shm_band_of(ddp__shm_band_size(b)), b);
}

static void names(void **state)
{
    (void)state;
    ddp__shm_variant v;
    for (int i = 0; i < DDP__SHM_NVARIANTS; i++) {
        assert_true(ddp__shm_variant_parse(ddp__shm_variant_name((ddp__shm_variant)i), &v));
        assert_int_equal(v, i);
    }
    assert_true(ddp__shm_variant_parse("pipelined", &v));
    assert_int_equal(v, DDP__SHM_PIPELINED);
    assert_false(ddp__shm_variant_parse("auto", &v));
    assert_false(ddp__shm_variant_parse("Cached", &v));
    assert_false(ddp__shm_variant_parse("", &v));
    assert_false(ddp__shm_variant_parse(NULL, &v));
}

static void blocks(void **state)
{
    (void)state;
    ddp__shm_machine m = epyc();
    assert_int_equal(ddp__shm_block(&m), 256 * KiB);
    m = xeon();
    assert_int_equal(ddp__shm_block(&m), MiB);
    m.l2 = 256 * KiB; /* clamped below */
    assert_int_equal(ddp__shm_block(&m), 128 * KiB);
    m.l2 = 0; /* unknown */
    assert_int_equal(ddp__shm_block(&m), 256 * KiB);
    m.l2 = 32 * MiB; /* clamped above */
    assert_int_equal(ddp__shm_block(&m), MiB);
}

/* The EPYC keeps, at every size, the algorithm bench/RESULTS.md measured there: its figures
 * cannot move through the rules. */
static void rules_epyc(void **state)
{
    (void)state;
    ddp__shm_machine m = epyc();
    ddp__shm_choice c;
    ddp__shm_rules(&m, &c);
    for (int b = 0; b < DDP__SHM_NBANDS; b++)
        assert_int_equal(c.band[b], DDP__SHM_LIBC);
    m.members = 8; /* more ranks: the same */
    ddp__shm_rules(&m, &c);
    for (int b = 0; b < DDP__SHM_NBANDS; b++)
        assert_int_equal(c.band[b], DDP__SHM_LIBC);
}

/* The Xeon: at 1–16 MB (where it was behind Open MPI) cached stores, cut in L2-sized blocks;
 * beyond the caches streaming stores, which is what its glibc's memcpy already did at 64 MB,
 * where it was ahead. */
static void rules_xeon(void **state)
{
    (void)state;
    ddp__shm_machine m = xeon();
    ddp__shm_choice c;
    ddp__shm_rules(&m, &c);
    assert_int_equal(c.block, MiB);
    assert_int_equal(c.band[ddp__shm_band_of(4 * KiB)], DDP__SHM_PIPELINED);
    assert_int_equal(c.band[ddp__shm_band_of(MiB)], DDP__SHM_PIPELINED);
    assert_int_equal(c.band[ddp__shm_band_of(4 * MiB)], DDP__SHM_PIPELINED);
    assert_int_equal(c.band[ddp__shm_band_of(16 * MiB)], DDP__SHM_PIPELINED);
    assert_int_equal(c.band[ddp__shm_band_of(64 * MiB)], DDP__SHM_STREAM);
    assert_int_equal(c.band[ddp__shm_band_of(256 * MiB)], DDP__SHM_STREAM);
    /* A smaller L3: 16 MB × 2 ranks no longer fits, so it streams. */
    m.l3 = 16 * MiB;
    ddp__shm_rules(&m, &c);
    assert_int_equal(c.band[ddp__shm_band_of(4 * MiB)], DDP__SHM_PIPELINED);
    assert_int_equal(c.band[ddp__shm_band_of(16 * MiB)], DDP__SHM_STREAM);
    /* No choice at all without machine facts beyond the L2: the 2 MiB L2 of newer Xeons counts. */
    m = xeon();
    m.l2 = 2 * MiB;
    ddp__shm_rules(&m, &c);
    assert_int_equal(c.band[ddp__shm_band_of(MiB)], DDP__SHM_PIPELINED);
    /* Nothing known: the algorithm as it was. */
    ddp__shm_machine none = {.members = 2};
    ddp__shm_rules(&none, &c);
    for (int b = 0; b < DDP__SHM_NBANDS; b++)
        assert_int_equal(c.band[b], DDP__SHM_LIBC);
}

/* Fills band b's rounds: times[v] µs for variant v, scaled by a per-round load factor that hits
 * every variant of that round alike (what pairing cancels). */
static void fill(ddp__shm_probe *p, int b, int reps, const double times_us[DDP__SHM_NVARIANTS])
{
    static const double load[DDP__SHM_MAX_REPS] = {1.0, 2.7, 1.3, 5.0, 1.1};
    p->reps[b] = reps;
    for (int k = 0; k < reps; k++)
        for (int v = 0; v < DDP__SHM_NVARIANTS; v++)
            p->t[b][v][k] = times_us[v] * load[k] * 1e-6;
}

/* On the Xeon, a probe in which cached whole-slice stores beat the pipelined rule at 1–16 MB
 * (the case: the rule is a guess, the probe measures), while pipelined stays best at
 * 256 KiB: the choice follows the measurements band by band; unprobed bands keep the rules. */
static void decide_xeon(void **state)
{
    (void)state;
    ddp__shm_machine m = xeon();
    ddp__shm_probe p;
    memset(&p, 0, sizeof p);
    /*                                   libc  cached stream pipelined */
    fill(&p, 1, 3, (const double[]){40, 30, 45, 28});
    fill(&p, 2, 3, (const double[]){185, 110, 150, 140});
    fill(&p, 3, 3, (const double[]){700, 420, 520, 470});
    fill(&p, 4, 3, (const double[]){2800, 1500, 1700, 1800});
    ddp__shm_choice c;
    ddp__shm_decide(&m, &p, &c);
    assert_int_equal(c.band[1], DDP__SHM_PIPELINED); /* the rule, and fastest */
    assert_int_equal(c.band[ddp__shm_band_of(MiB)], DDP__SHM_CACHED);
    assert_int_equal(c.band[ddp__shm_band_of(4 * MiB)], DDP__SHM_CACHED);
    assert_int_equal(c.band[ddp__shm_band_of(16 * MiB)], DDP__SHM_CACHED);
    assert_int_equal(c.band[0], DDP__SHM_PIPELINED);                       /* not probed: rule */
    assert_int_equal(c.band[ddp__shm_band_of(64 * MiB)], DDP__SHM_STREAM); /* not probed */
    assert_int_equal(c.block, MiB);
    /* Never the variant the issue measured there (libc), whatever else happens. */
    for (int b = 1; b <= 4; b++)
        assert_int_not_equal(c.band[b], DDP__SHM_LIBC);
}

/* The Xeon cannot regress where the probe runs: a probe that finds libc (the algorithm before
 * the choice) best, or the rule's variant ahead of it only within the noise margin, keeps libc
 * in every probed band, whatever the rules say; unprobed bands keep the rules. */
static void decide_xeon_no_regression(void **state)
{
    (void)state;
    ddp__shm_machine m = xeon();
    ddp__shm_probe p;
    memset(&p, 0, sizeof p);
    /*                                   libc  cached stream pipelined */
    fill(&p, 0, 3, (const double[]){10, 12, 14, 10.5});
    fill(&p, 1, 3, (const double[]){40, 41, 45, 38}); /* pipelined 5% ahead: noise */
    fill(&p, 2, 3, (const double[]){125, 130, 150, 140});
    fill(&p, 3, 3, (const double[]){470, 480, 520, 450}); /* 4% */
    fill(&p, 4, 3, (const double[]){1900, 2000, 1950, 2100});
    ddp__shm_choice c;
    ddp__shm_decide(&m, &p, &c);
    for (int b = 0; b <= 4; b++)
        assert_int_equal(c.band[b], DDP__SHM_LIBC);
    ddp__shm_choice rules;
    ddp__shm_rules(&m, &rules);
    for (int b = 5; b < DDP__SHM_NBANDS; b++)
        assert_int_equal(c.band[b], rules.band[b]);
}

/* On the EPYC, a probe that finds libc best or within noise keeps it everywhere (no
 * regression); a variant that is clearly and consistently faster takes its band. */
static void decide_epyc(void **state)
{
    (void)state;
    ddp__shm_machine m = epyc();
    ddp__shm_probe p;
    memset(&p, 0, sizeof p);
    fill(&p, 0, 3, (const double[]){5.0, 5.1, 5.3, 5.0});     /* a tie */
    fill(&p, 2, 3, (const double[]){82, 80, 120, 95});        /* 2% better: noise */
    fill(&p, 4, 3, (const double[]){1054, 1100, 1500, 1200}); /* libc best */
    fill(&p, 5, 3, (const double[]){8331, 8400, 7000, 9000}); /* stream 16% better */
    ddp__shm_choice c;
    ddp__shm_decide(&m, &p, &c);
    assert_int_equal(c.band[0], DDP__SHM_LIBC);
    assert_int_equal(c.band[2], DDP__SHM_LIBC);
    assert_int_equal(c.band[4], DDP__SHM_LIBC);
    assert_int_equal(c.band[5], DDP__SHM_STREAM);
    assert_int_equal(c.band[6], DDP__SHM_LIBC); /* not probed */
    assert_int_equal(c.block, 256 * KiB);
}

/* Noise must not pick: a challenger faster in the median but slower in one paired round stays
 * out; one round is not enough; a zero (missing) time never wins. */
static void decide_noise(void **state)
{
    (void)state;
    ddp__shm_machine m = epyc();
    ddp__shm_probe p;
    memset(&p, 0, sizeof p);
    p.reps[2] = 3;
    double libc[3] = {100, 100, 100}, cached[3] = {60, 70, 101};
    for (int k = 0; k < 3; k++) {
        p.t[2][DDP__SHM_LIBC][k] = libc[k];
        p.t[2][DDP__SHM_CACHED][k] = cached[k];
        p.t[2][DDP__SHM_STREAM][k] = 200;
        p.t[2][DDP__SHM_PIPELINED][k] = 200;
    }
    fill(&p, 3, 1, (const double[]){100, 50, 50, 50}); /* one round only */
    p.reps[4] = 2;                                     /* zeros for cached */
    p.t[4][DDP__SHM_LIBC][0] = p.t[4][DDP__SHM_LIBC][1] = 1e-3;
    p.t[4][DDP__SHM_STREAM][0] = p.t[4][DDP__SHM_STREAM][1] = 2e-3;
    p.t[4][DDP__SHM_PIPELINED][0] = p.t[4][DDP__SHM_PIPELINED][1] = 2e-3;
    ddp__shm_choice c;
    ddp__shm_decide(&m, &p, &c);
    assert_int_equal(c.band[2], DDP__SHM_LIBC);
    assert_int_equal(c.band[3], DDP__SHM_LIBC);
    assert_int_equal(c.band[4], DDP__SHM_LIBC);
    /* Two clear winners: the larger margin takes it. */
    fill(&p, 2, 2, (const double[]){100, 80, 200, 60});
    ddp__shm_decide(&m, &p, &c);
    assert_int_equal(c.band[2], DDP__SHM_PIPELINED);
    /* Non-temporal stores are no candidate while the exchange fits in the caches (band 2: 2 ×
     * its size ≪ L2·2 + L3), however the probe's short trials came out; beyond (band 5), they
     * are. */
    fill(&p, 2, 2, (const double[]){100, 90, 50, 200});
    fill(&p, 5, 2, (const double[]){100, 90, 50, 200});
    ddp__shm_decide(&m, &p, &c);
    assert_int_equal(c.band[2], DDP__SHM_CACHED);
    assert_int_equal(c.band[5], DDP__SHM_STREAM);
}

static void text_form(void **state)
{
    (void)state;
    ddp__shm_machine m = xeon();
    ddp__shm_choice c, back;
    ddp__shm_rules(&m, &c);
    char line[256];
    ddp__shm_choice_format(&c, line, sizeof line);
    assert_string_equal(line, "pipelined,pipelined,pipelined,pipelined,pipelined,stream,stream;"
                              "block=1048576");
    assert_true(ddp__shm_choice_parse(line, &back));
    assert_memory_equal(&c, &back, sizeof c);
    static const char *const bad[] = {
        "",
        "libc,libc,libc,libc,libc,libc;block=262144",           /* 6 bands */
        "libc,libc,libc,libc,libc,libc,libc,libc;block=262144", /* 8 bands */
        "libc,libc,libc,libc,libc,libc,fast;block=262144",
        "libc,libc,libc,libc,libc,libc,libc",
        "libc,libc,libc,libc,libc,libc,libc;block=",
        "libc,libc,libc,libc,libc,libc,libc;block=100", /* not whole lines */
        "libc,libc,libc,libc,libc,libc,libc;block=262144x",
        "libc,,libc,libc,libc,libc,libc;block=262144",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(ddp__shm_choice_parse(bad[i], &back));
}

static void cache_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp-test-shm-choice-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[128], key[512], other[512], path[4200], opath[4200];
    snprintf(sub, sizeof sub, "%s/ddpc", dir); /* created by the save */
    ddp__shm_machine m = xeon(), e = epyc();
    ddp__shm_cache_key(&m, key, sizeof key);
    ddp__shm_cache_key(&e, other, sizeof other);
    assert_string_equal(key, "Intel(R) Xeon(R) Processor|49152|4194304|50331648|2");
    ddp__shm_cache_path(sub, key, path, sizeof path);
    ddp__shm_cache_path(sub, other, opath, sizeof opath);
    assert_string_not_equal(path, opath);

    ddp__shm_choice c, got;
    ddp__shm_rules(&m, &c);
    c.band[2] = DDP__SHM_CACHED;
    assert_false(ddp__shm_cache_load(sub, key, &got)); /* nothing yet */
    assert_true(ddp__shm_cache_save(sub, key, &c));
    memset(&got, 0xff, sizeof got);
    assert_true(ddp__shm_cache_load(sub, key, &got));
    assert_memory_equal(&c, &got, sizeof c);
    assert_false(ddp__shm_cache_load(sub, other, &got)); /* another machine: a miss */
    /* A file holding another key under this name (a hash collision) is a miss too. */
    FILE *f = fopen(opath, "w");
    assert_non_null(f);
    fprintf(f,
            "ddpc shm allreduce choice v1\n%s\nlibc,libc,libc,libc,libc,libc,libc;block=262144\n",
            key);
    fclose(f);
    assert_false(ddp__shm_cache_load(sub, other, &got));
    /* A damaged file: a miss, never a crash. */
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "ddpc shm allreduce choice v1\n%s\nlibc,lib", key);
    fclose(f);
    assert_false(ddp__shm_cache_load(sub, key, &got));
    /* Nowhere to cache: false, nothing else. */
    assert_false(ddp__shm_cache_save("", key, &c));
    assert_false(ddp__shm_cache_load(NULL, key, &got));
    char deep[256];
    snprintf(deep, sizeof deep, "%s/no/such/dir", dir);
    assert_false(ddp__shm_cache_save(deep, key, &c));
    unlink(path);
    unlink(opath);
    rmdir(sub);
    rmdir(dir);
}

static void this_machine(void **state)
{
    (void)state;
    ddp__shm_machine m;
    ddp__shm_machine_read(3, &m);
    assert_int_equal(m.members, 3);
    assert_null(strchr(m.model, '|'));
    struct stat st;
    if (stat("/sys/devices/system/cpu/cpu0/cache/index0/size", &st) == 0)
        assert_true(m.l1d > 0 && m.l2 >= m.l1d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bands),
        cmocka_unit_test(names),
        cmocka_unit_test(blocks),
        cmocka_unit_test(rules_epyc),
        cmocka_unit_test(rules_xeon),
        cmocka_unit_test(decide_xeon),
        cmocka_unit_test(decide_xeon_no_regression),
        cmocka_unit_test(decide_epyc),
        cmocka_unit_test(decide_noise),
        cmocka_unit_test(text_form),
        cmocka_unit_test(cache_file),
        cmocka_unit_test(this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
