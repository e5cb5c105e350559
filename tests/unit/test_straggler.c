/*
 * test_straggler.c — ddptrain's straggler rule (tools/ddptrain/straggler.c) on synthetic
 * timings: who is slow (against the median of the others, by ratio and by min_ms), the count
 * of slow intervals before the warning (up for a slow one, down for a normal one, anew for
 * another rank) and the seconds it must last, the rate limit per rank, and what a warning
 * reports. The same rule runs live in
 * ddptrain and is checked against a really slowed rank by tests/integration/test_straggler.sh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "straggler.h"

/* Feeds interval i (times t = 10·i s, steps 100·i … 100·(i+1)); returns whether it warned. */
static bool feed(straggler *s, const double *busy, int W, int i, straggler_report *r)
{
    return straggler_update(s, busy, W, (uint64_t)(100 * i), 10.0 * i, 10.0 * (i + 1), r);
}

static void test_one_rank_and_equal_ranks_never_warn(void **state)
{
    (void)state;
    straggler_opts o = STRAGGLER_OPTS_INIT;
    straggler s;
    straggler_report r;
    straggler_init(&s, &o);
    double one[1] = {100};
    double four[4] = {20, 20, 20, 20};
    for (int i = 0; i < 20; i++) {
        assert_false(feed(&s, one, 1, i, &r));
        assert_false(feed(&s, four, 4, i, &r));
    }
}

static void test_warns_after_three_intervals_with_what_it_saw(void **state)
{
    (void)state;
    straggler_opts o = STRAGGLER_OPTS_INIT; /* 1.3×, 0.5 ms, 3 intervals, 60 s */
    straggler s;
    straggler_report r = {0};
    straggler_init(&s, &o);
    double fine[2] = {20, 21}, slow[2] = {20, 45};
    assert_false(feed(&s, fine, 2, 0, &r));
    assert_false(feed(&s, slow, 2, 1, &r));
    assert_false(feed(&s, slow, 2, 2, &r));
    assert_true(feed(&s, slow, 2, 3, &r));
    assert_int_equal(r.rank, 1);
    assert_true(r.busy_ms == 45);
    assert_true(r.median_ms == 20);      /* the other rank's, not the mean of both */
    assert_int_equal(r.since_step, 100); /* the first slow interval began at step 100 */
    assert_true(r.for_s == 40.0 - 10.0); /* t = 10 s to 40 s */
    assert_int_equal(r.intervals, 3);
    /* Still slow: silent until 60 s after the warning (at 40 s), then again, same episode. */
    for (int i = 4; i < 9; i++)
        assert_false(feed(&s, slow, 2, i, &r));
    assert_true(feed(&s, slow, 2, 9, &r)); /* now = 100 s */
    assert_int_equal(r.since_step, 100);
    assert_true(r.for_s == 90.0);
    assert_int_equal(r.intervals, 9);
}

static void test_normal_intervals_count_down_another_rank_starts_anew(void **state)
{
    (void)state;
    straggler_opts o = STRAGGLER_OPTS_INIT;
    o.every_s = 100;
    straggler s;
    straggler_report r = {0};
    straggler_init(&s, &o);
    double fine[3] = {20, 21, 20}, slow1[3] = {20, 40, 20}, slow2[3] = {20, 20, 40};
    /* Slowed in bursts: slow, slow, normal, slow, slow: the count goes 1 2 1 2 3 → a warning,
     * and the episode (since step 0) survived the normal interval. */
    assert_false(feed(&s, slow1, 3, 0, &r));
    assert_false(feed(&s, slow1, 3, 1, &r));
    assert_false(feed(&s, fine, 3, 2, &r));
    assert_false(feed(&s, slow1, 3, 3, &r));
    assert_true(feed(&s, slow1, 3, 4, &r));
    assert_int_equal(r.rank, 1);
    assert_int_equal(r.since_step, 0);
    assert_int_equal(r.intervals, 4);
    /* Three normal intervals end it; the same rank slow again within every_s of its warning
     * (at 110 s) stays silent. */
    for (int i = 5; i < 8; i++)
        assert_false(feed(&s, fine, 3, i, &r));
    for (int i = 8; i < 11; i++)
        assert_false(feed(&s, slow1, 3, i, &r));
    /* Another rank: a new count, and its own warning at once. */
    assert_false(feed(&s, slow2, 3, 11, &r));
    assert_false(feed(&s, slow2, 3, 12, &r));
    assert_true(feed(&s, slow2, 3, 13, &r));
    assert_int_equal(r.rank, 2);
    assert_int_equal(r.since_step, 1100);
    /* Back to rank 1: last warned about at 50 s; at 170 s, every_s (100 s) has passed. */
    assert_false(feed(&s, slow1, 3, 14, &r));
    assert_false(feed(&s, slow1, 3, 15, &r));
    assert_true(feed(&s, slow1, 3, 16, &r));
    assert_int_equal(r.rank, 1);
}

static void test_thresholds(void **state)
{
    (void)state;
    straggler_opts o = STRAGGLER_OPTS_INIT;
    straggler s;
    straggler_report r = {0};
    /* 25% slower: under the 1.3 ratio. */
    straggler_init(&s, &o);
    double mild[2] = {40, 50};
    for (int i = 0; i < 10; i++)
        assert_false(feed(&s, mild, 2, i, &r));
    /* 3× but 0.2 ms: noise on a tiny step, under min_ms. */
    straggler_init(&s, &o);
    double tiny[2] = {0.1, 0.3};
    for (int i = 0; i < 10; i++)
        assert_false(feed(&s, tiny, 2, i, &r));
    /* ratio ≤ 1 turns the rule off. */
    o.ratio = 0;
    straggler_init(&s, &o);
    double slow[2] = {10, 100};
    for (int i = 0; i < 10; i++)
        assert_false(feed(&s, slow, 2, i, &r));
    /* after = 1: the first slow interval warns; the median of 4 others is the middle pair's. */
    o = (straggler_opts)STRAGGLER_OPTS_INIT;
    o.after = 1;
    straggler_init(&s, &o);
    double five[5] = {10, 30, 11, 12, 10};
    assert_true(feed(&s, five, 5, 0, &r));
    assert_int_equal(r.rank, 1);
    assert_true(r.median_ms == 10.5);
}

/* Many short intervals (0.1 s): the count is reached at once, but the warning waits for after_s
 * (5 s) of slowness, so that a context switch or two is not a straggler. */
static void test_short_intervals_wait_for_after_s(void **state)
{
    (void)state;
    straggler_opts o = STRAGGLER_OPTS_INIT;
    straggler s;
    straggler_report r = {0};
    straggler_init(&s, &o);
    double slow[2] = {1, 3}, fine[2] = {1, 1};
    int i = 0;
    for (; i < 3; i++) /* 0.3 s of noise, then back to normal: nothing */
        assert_false(straggler_update(&s, slow, 2, (uint64_t)i, 0.1 * i, 0.1 * (i + 1), &r));
    for (; i < 6; i++)
        assert_false(straggler_update(&s, fine, 2, (uint64_t)i, 0.1 * i, 0.1 * (i + 1), &r));
    for (; i < 55; i++) /* slow from 0.6 s: silent until 5.6 s */
        assert_false(straggler_update(&s, slow, 2, (uint64_t)i, 0.1 * i, 0.1 * (i + 1), &r));
    assert_true(straggler_update(&s, slow, 2, 56, 5.6, 5.7, &r));
    assert_int_equal(r.rank, 1);
    assert_int_equal(r.since_step, 6);
    assert_true(r.for_s > 5.0 && r.for_s < 5.2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank_and_equal_ranks_never_warn),
        cmocka_unit_test(test_warns_after_three_intervals_with_what_it_saw),
        cmocka_unit_test(test_normal_intervals_count_down_another_rank_starts_anew),
        cmocka_unit_test(test_thresholds),
        cmocka_unit_test(test_short_intervals_wait_for_after_s),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
