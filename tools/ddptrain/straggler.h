/*
 * straggler.h — the rule that calls a rank a straggler, on the per-rank times rank 0 gathers at
 * each progress line. Pure: no I/O, no group, no clock of its own (the caller passes the times),
 * so that tests/unit/test_straggler.c can drive it with synthetic timings.
 *
 * The measure is a rank's busy time per step: its step time minus the time its reducer waited in
 * finish() for the gradient allreduce. Every rank's step takes as long as the slowest (they
 * meet in every allreduce), but the fast ranks spend the difference waiting there, so the busy
 * time is what tells a slow rank (a busier core, thermal throttling, a noisy neighbour, a slower
 * machine) from the others.
 *
 * The rule: in one log interval, the slowest rank is slow when its busy time exceeds the median
 * of the other ranks' by both `ratio` (1.3: 30%) and `min_ms` (noise on tiny steps is not a
 * straggler). Each slow interval of the same rank adds one to its count, each interval in which
 * no rank is slow takes one off (a rank slowed in bursts, e.g. by another process on its core,
 * misses some intervals but stays the straggler), and another rank being slow starts a new count.
 * When the count reaches `after` and the count started at least `after_s` seconds ago (a few
 * short intervals slowed by one context switch are noise, not a straggler), a warning is due; the
 * next one about the same rank only `every_s` seconds after the last.
 */
#ifndef DDPTRAIN_STRAGGLER_H
#define DDPTRAIN_STRAGGLER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct straggler_opts {
    double ratio;   /* busy time over the others' median that counts as slow; ≤ 1: off */
    double min_ms;  /* and by at least this much, ms per step */
    int after;      /* net slow intervals before the first warning (≥ 1) */
    double after_s; /* and seconds since the count started */
    double every_s; /* at most one warning per this many seconds while the same rank stays slow */
} straggler_opts;

#define STRAGGLER_OPTS_INIT                                                                        \
    {                                                                                              \
        1.3, 0.5, 3, 5.0, 60.0                                                                     \
    }

typedef struct straggler {
    straggler_opts o;
    int rank;            /* the rank slow in the last intervals, or -1 */
    int count;           /* its count: + 1 per slow interval, − 1 per normal one */
    int intervals;       /* its slow intervals since the count started */
    uint64_t since_step; /* the step the count started at */
    double since_t;      /* and when (seconds, the caller's clock) */
    int warned_rank;     /* the last warning's rank (-1: none yet) */
    double warned_t;     /* and when */
} straggler;

/* What a warning says. */
typedef struct straggler_report {
    int rank;
    double busy_ms;      /* its busy time per step in the last interval */
    double median_ms;    /* the other ranks' median */
    double for_s;        /* how long it has been slow */
    uint64_t since_step; /* since which step */
    int intervals;       /* slow log intervals since then */
} straggler_report;

void straggler_init(straggler *s, const straggler_opts *o);

/* One log interval, from step `from_step` (at time t_from, seconds) until `now`:
 * busy_ms[r] is rank r's busy time per step (ms), for W ranks. Returns true when a warning is
 * due, filling *out; false otherwise (W < 2, the rule off, nothing slow, or rate-limited). */
bool straggler_update(straggler *s, const double *busy_ms, int W, uint64_t from_step, double t_from,
                      double now, straggler_report *out);

#endif /* DDPTRAIN_STRAGGLER_H */
