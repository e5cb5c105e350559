/*
 * test_reducer.c — the reducer's handle as a newcomer misuses it, in a world of one (no launcher):
 * the order of destruction. The numbers are checked by the multi-rank programs under
 * tests/integration (reducercheck, rebuildcheck, joincheck); here, only that a mistake gives a
 * status and a message instead of a crash.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"

static ddp_group *world_of_one(const char *backend)
{
    static ddp_world w;
    memset(&w, 0, sizeof w);
    w.world_size = 1;
    w.local_world_size = 1;
    snprintf(w.run_id, sizeof w.run_id, "test-reducer-%d", (int)getpid());
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = &w;
    o.backend = backend;
    ddp_group *g = NULL;
    ddp_error err = {0};
    if (ddp_group_init(&o, &g, &err) != DDP_OK)
        fail_msg("a world of one over %s: %s", backend, err.msg);
    return g;
}

/* The group destroyed before its reducer (cleanup in the order of creation): before 2026-11-25
 * the reducer's destroy freed its buckets through the freed group (SIGSEGV). Now the group
 * releases what the reducer holds of it; the reducer's calls then fail with DDP_ERR_CLOSED,
 * saying what to do, and its destroy is safe. Over shm (arena buckets) and tcp (malloc'ed),
 * plain and sharded, after a step and with a step open. */
static void group_destroyed_first(void **state)
{
    (void)state;
    const char *backends[] = {"shm", "tcp"};
    for (int k = 0; k < 4; k++) {
        ddp_group *g = world_of_one(backends[k % 2]);
        float w[300], b[3];
        for (int i = 0; i < 300; i++)
            w[i] = (float)i;
        ddp_param ps[] = {{.name = "w", .count = 300, .dtype = DDP_FLOAT32, .data = w},
                          {.name = "b", .count = 3, .dtype = DDP_FLOAT32, .data = b}};
        ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
        ro.bucket_cap = ro.first_bucket = 256; /* one bucket per parameter */
        ro.shard_optimizer = k >= 2;
        ddp_reducer *r = NULL;
        ddp_error err = {0};
        if (ddp_reducer_create(g, ps, 2, NULL, 0, &ro, &r, &err) != DDP_OK)
            fail_msg("create: %s", err.msg);
        ddp_reducer_zero_grad(r);
        assert_int_equal(ddp_reducer_mark_ready(r, 1), DDP_OK);
        assert_int_equal(ddp_reducer_mark_ready(r, 0), DDP_OK);
        assert_int_equal(ddp_reducer_finish(r), DDP_OK);
        ddp_reducer_zero_grad(r);
        assert_int_equal(ddp_reducer_mark_ready(r, 1), DDP_OK); /* a step left open */
        ddp_group_destroy(g);

        assert_int_equal(ddp_reducer_mark_ready(r, 0), DDP_ERR_CLOSED);
        const char *msg = ddp_reducer_last_error(r);
        if (!strstr(msg, "ddp_group_destroy") || !strstr(msg, "destroy the reducer first"))
            fail_msg("message '%s'", msg);
        assert_int_equal(ddp_reducer_finish(r), DDP_ERR_CLOSED);
        double norm;
        assert_int_equal(ddp_reducer_grad_norm(r, &norm), DDP_ERR_CLOSED);
        bool inf;
        assert_int_equal(ddp_reducer_unscale(r, 1.0f, &inf), DDP_ERR_CLOSED);
        assert_int_equal(ddp_reducer_sync_buffers(r), DDP_ERR_CLOSED);
        assert_int_equal(ddp_reducer_gather_params(r), DDP_ERR_CLOSED);
        void *arrays[2] = {w, b};
        assert_int_equal(ddp_reducer_gather_state(r, arrays), DDP_ERR_CLOSED);
        assert_int_equal(ddp_reducer_set_join(r, NULL, true), DDP_ERR_CLOSED);
        bool others;
        assert_int_equal(ddp_reducer_join(r, &others), DDP_ERR_CLOSED);
        assert_null(ddp_reducer_grad(r, 0)); /* its memory went with the group */
        assert_null(ddp_reducer_param(r, 0));
        ddp_reducer_zero_grad(r); /* no-ops, not crashes */
        ddp_reducer_set_sync(r, false);
        size_t lo, hi;
        ddp_reducer_shard(r, 0, &lo, &hi);
        ddp_reducer_stats st;
        ddp_reducer_stats_get(r, &st);
        ddp_reducer_destroy(r);
    }
}

/* grad_norm and unscale on a failed group: unsharded they communicate nothing, and before
 * 2026-11-25 they returned DDP_OK for gradients that were not every rank's mean. */
static void grad_norm_failed_group(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        ddp_group *g = world_of_one("shm");
        float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        ddp_param ps[] = {{.name = "w", .count = 8, .dtype = DDP_FLOAT32, .data = w}};
        ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
        ro.shard_optimizer = k == 1;
        ddp_reducer *r = NULL;
        ddp_error err = {0};
        if (ddp_reducer_create(g, ps, 1, NULL, 0, &ro, &r, &err) != DDP_OK)
            fail_msg("create: %s", err.msg);
        ddp_reducer_zero_grad(r);
        float *gw = ddp_reducer_grad(r, 0);
        assert_non_null(gw);
        for (int i = 0; i < 8; i++)
            gw[i] = 1.0f;
        assert_int_equal(ddp_reducer_mark_ready(r, 0), DDP_OK);
        assert_int_equal(ddp_reducer_finish(r), DDP_OK);
        double norm = 0;
        assert_int_equal(ddp_reducer_grad_norm(r, &norm), DDP_OK);
        assert_true(fabs(norm - sqrt(8.0)) < 1e-9);
        ddp_group_abort(g);
        norm = -1;
        ddp_status st = ddp_reducer_grad_norm(r, &norm);
        assert_int_not_equal(st, DDP_OK);
        assert_true(norm == -1); /* not written */
        const char *msg = ddp_reducer_last_error(r);
        if (!strstr(msg, "grad_norm: the process group failed earlier"))
            fail_msg("message '%s'", msg);
        bool inf = true;
        assert_int_not_equal(ddp_reducer_unscale(r, 0.5f, &inf), DDP_OK);
        if (!strstr(ddp_reducer_last_error(r), "unscale: the process group failed earlier"))
            fail_msg("message '%s'", ddp_reducer_last_error(r));
        assert_true(gw[0] == 1.0f || k == 1); /* unsharded: left as they were */
        ddp_reducer_destroy(r);
        ddp_group_destroy(g);
    }
}

/* The right order still works, and a reducer destroyed first is no longer the group's concern
 * (the group's destroy must not touch it). */
static void reducer_destroyed_first(void **state)
{
    (void)state;
    ddp_group *g = world_of_one("shm");
    float w[4] = {1, 2, 3, 4};
    ddp_param ps[] = {{.name = "w", .count = 4, .dtype = DDP_FLOAT32, .data = w}};
    ddp_reducer *r1 = NULL, *r2 = NULL;
    ddp_error err = {0};
    if (ddp_reducer_create(g, ps, 1, NULL, 0, NULL, &r1, &err) ||
        ddp_reducer_create(g, ps, 1, NULL, 0, NULL, &r2, &err))
        fail_msg("create: %s", err.msg);
    ddp_reducer_destroy(r1); /* the first of two: unlinked from the group's list */
    ddp_reducer_zero_grad(r2);
    assert_int_equal(ddp_reducer_finish(r2), DDP_OK);
    ddp_group_destroy(g); /* releases r2 only */
    assert_int_equal(ddp_reducer_finish(r2), DDP_ERR_CLOSED);
    ddp_reducer_destroy(r2);
}

/* Calls after the group failed (here: aborted) return its error, no_sync micro-steps included:
 * mark_ready on a bucket not yet complete returned DDP_OK, so a loop that checks mark_ready
 * went on computing a step that could never be reduced. */
static void calls_after_a_failure(void **state)
{
    (void)state;
    ddp_group *g = world_of_one("shm");
    float w[4] = {1, 2, 3, 4}, b[1] = {0};
    ddp_param ps[] = {{.name = "w", .count = 4, .dtype = DDP_FLOAT32, .data = w},
                      {.name = "b", .count = 1, .dtype = DDP_FLOAT32, .data = b}};
    ddp_reducer *r = NULL;
    ddp_error err = {0};
    if (ddp_reducer_create(g, ps, 2, NULL, 0, NULL, &r, &err) != DDP_OK) /* one bucket */
        fail_msg("create: %s", err.msg);
    ddp_group_abort(g);
    for (int sync = 0; sync < 2; sync++) {
        ddp_reducer_zero_grad(r);
        ddp_reducer_set_sync(r, sync);
        assert_int_equal(ddp_reducer_mark_ready(r, 1), DDP_ERR_CLOSED);
        const char *msg = ddp_reducer_last_error(r);
        if (!strstr(msg, "the group failed before") || !strstr(msg, "ddp_group_abort"))
            fail_msg("message '%s'", msg);
        assert_int_equal(ddp_reducer_finish(r), DDP_ERR_CLOSED);
    }
    ddp_reducer_destroy(r);
    ddp_group_destroy(g);
}

/* The list of ddp_param given to create, built in a helper or a block whose scope ends (a local
 * array): the reducer keeps its own copy of the descriptors and names, so the caller's array may
 * go. It read the caller's array for its whole life (names in messages, counts in finish, the
 * buffers' descriptors in sync_buffers): here the array is scribbled over after create. The
 * values (data) stay the caller's, as documented. */
static ddp_reducer *make_from_a_local_list(ddp_group *g, float *w, float *b, float *stat)
{
    char n1[8] = "w", n2[8] = "b", n3[8] = "stat";
    ddp_param ps[] = {{.name = n1, .count = 4, .dtype = DDP_FLOAT32, .data = w},
                      {.name = n2, .count = 1, .dtype = DDP_FLOAT32, .data = b}};
    ddp_param bs[] = {{.name = n3, .count = 2, .dtype = DDP_FLOAT32, .data = stat}};
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    ro.bucket_cap = ro.first_bucket = 16; /* one bucket per parameter */
    ddp_reducer *r = NULL;
    ddp_error err = {0};
    if (ddp_reducer_create(g, ps, 2, bs, 1, &ro, &r, &err) != DDP_OK)
        fail_msg("create: %s", err.msg);
    memset(ps, 0xff, sizeof ps); /* what a later call's stack frame may leave there */
    memset(bs, 0xff, sizeof bs);
    memset(n1, 'x', sizeof n1);
    return r;
}

static void param_list_copied(void **state)
{
    (void)state;
    ddp_group *g = world_of_one("shm");
    float w[4] = {1, 2, 3, 4}, b[1] = {5}, stat[2] = {6, 7};
    ddp_reducer *r = make_from_a_local_list(g, w, b, stat);
    for (int step = 0; step < 3; step++) { /* the second step rebuilds the buckets */
        ddp_reducer_zero_grad(r);
        float *gw = ddp_reducer_grad(r, 0), *gb = ddp_reducer_grad(r, 1);
        assert_non_null(gw);
        assert_non_null(gb);
        for (int i = 0; i < 4; i++)
            gw[i] = (float)(i + step);
        gb[0] = 9;
        assert_int_equal(ddp_reducer_mark_ready(r, 0), DDP_OK);
        assert_int_equal(ddp_reducer_mark_ready(r, 0), DDP_ERR_INVALID);
        if (!strstr(ddp_reducer_last_error(r), "mark_ready: 'w' was already marked"))
            fail_msg("message '%s'", ddp_reducer_last_error(r));
        assert_int_equal(ddp_reducer_mark_ready(r, 1), DDP_OK);
        assert_int_equal(ddp_reducer_finish(r), DDP_OK);
        assert_true(gw[3] == (float)(3 + step) && gb[0] == 9); /* a world of one: the mean */
        size_t lo, hi;
        ddp_reducer_shard(r, 0, &lo, &hi);
        assert_true(lo == 0 && hi == 4);
    }
    assert_int_equal(ddp_reducer_sync_buffers(r), DDP_OK);
    assert_true(stat[0] == 6 && stat[1] == 7);
    double norm;
    assert_int_equal(ddp_reducer_grad_norm(r, &norm), DDP_OK);
    ddp_reducer_destroy(r);
    ddp_group_destroy(g);
}

/* A parameter or buffer refused on this rank says which of its fields is wrong (it read "needs a
 * name, data (unless its count is 0), and a floating-point dtype" for each of them). */
static void bad_param_named_precisely(void **state)
{
    (void)state;
    ddp_group *g = world_of_one("shm");
    float w[4] = {0};
    struct {
        ddp_param p;
        bool buffer;
        const char *want;
    } cases[] = {
        {{.name = "w", .count = 4, .dtype = DDP_INT32, .data = w},
         false,
         "parameter 0 ('w'): dtype int32 is not a floating-point type (float32, float64, "
         "bfloat16 or float16)"},
        {{.name = "w", .count = 4, .dtype = DDP_FLOAT32, .data = NULL},
         false,
         "parameter 0 ('w'): data is NULL for 4 elements"},
        {{.name = NULL, .count = 4, .dtype = DDP_FLOAT32, .data = w},
         false,
         "parameter 0 has no name"},
        {{.name = "s", .count = 4, .dtype = (ddp_dtype)42, .data = w},
         true,
         "buffer 0 ('s'): dtype 42 is not a dtype"},
        {{.name = "s", .count = 2, .dtype = DDP_INT64, .data = NULL},
         true,
         "buffer 0 ('s'): data is NULL for 2 elements"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ddp_reducer *r = NULL;
        ddp_error err = {0};
        ddp_status st = cases[k].buffer
                            ? ddp_reducer_create(g, NULL, 0, &cases[k].p, 1, NULL, &r, &err)
                            : ddp_reducer_create(g, &cases[k].p, 1, NULL, 0, NULL, &r, &err);
        assert_int_equal(st, DDP_ERR_INVALID);
        assert_null(r);
        if (!strstr(err.msg, cases[k].want))
            fail_msg("case %zu: '%s' lacks '%s'", k, err.msg, cases[k].want);
    }
    ddp_group_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(group_destroyed_first),   cmocka_unit_test(grad_norm_failed_group),
        cmocka_unit_test(reducer_destroyed_first), cmocka_unit_test(calls_after_a_failure),
        cmocka_unit_test(param_list_copied),       cmocka_unit_test(bad_param_named_precisely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
