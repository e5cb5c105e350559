/*
 * test_amp.c — the GradScaler state machine (include/ddp/amp.h) against PyTorch's rule
 * (torch.cuda.amp.GradScaler.update → _amp_update_scale_: on inf scale ×= backoff and the
 * tracker resets; else the tracker counts clean steps and at growth_interval the scale grows if
 * the grown value is finite, and the tracker resets). Debian's torch 1.13 has no CPU kernel of
 * _amp_update_scale_, so the expected sequences are derived by hand from that rule, step by step
 * below.
 *
 * `test_amp --sync` is the multi-rank half, run under ddprun with 2 ranks (unit.test_amp_sync):
 * rank 1 alone finds an inf, and both ranks must skip the step and back off alike.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ddp/ddp.h"

static void defaults(void **state)
{
    (void)state;
    ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
    assert_true(s.scale == 65536.0f);
    assert_true(s.growth_factor == 2.0f);
    assert_true(s.backoff_factor == 0.5f);
    assert_int_equal(s.growth_interval, 2000);
    assert_int_equal(s.growth_tracker, 0);
    ddp_error err = {0};
    assert_int_equal(ddp_grad_scaler_check(&s, &err), DDP_OK);
    /* 1999 clean steps: no growth yet; the 2000th doubles the scale and resets the tracker. */
    for (int i = 0; i < 1999; i++)
        assert_true(ddp_grad_scaler_update(&s, false));
    assert_true(s.scale == 65536.0f);
    assert_int_equal(s.growth_tracker, 1999);
    assert_true(ddp_grad_scaler_update(&s, false));
    assert_true(s.scale == 131072.0f);
    assert_int_equal(s.growth_tracker, 0);
    /* An inf at step 1999 of the next run of clean steps resets the count. */
    for (int i = 0; i < 1999; i++)
        ddp_grad_scaler_update(&s, false);
    assert_false(ddp_grad_scaler_update(&s, true));
    assert_true(s.scale == 65536.0f);
    assert_int_equal(s.growth_tracker, 0);
    for (int i = 0; i < 1999; i++)
        ddp_grad_scaler_update(&s, false);
    assert_true(s.scale == 65536.0f);
}

/* growth_interval 3, from 2^16: the scale, tracker and verdict after each step. */
static void sequence(void **state)
{
    (void)state;
    static const struct {
        bool inf;
        float scale;
        int tracker;
    } seq[] = {
        {false, 65536, 1},  {false, 65536, 2}, {false, 131072, 0}, /* grows at the 3rd */
        {false, 131072, 1}, {true, 65536, 0},                      /* backoff, reset */
        {false, 65536, 1},  {false, 65536, 2}, {true, 32768, 0},   /* an inf just before */
        {false, 32768, 1},  {false, 32768, 2}, {false, 65536, 0},  /* growth: reset the count */
        {true, 32768, 0},   {true, 16384, 0},                      /* infs in a row halve */
        {false, 16384, 1},
    };
    ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
    s.growth_interval = 3;
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        bool take = ddp_grad_scaler_update(&s, seq[i].inf);
        assert_int_equal(take, !seq[i].inf);
        assert_true(s.scale == seq[i].scale);
        assert_int_equal(s.growth_tracker, seq[i].tracker);
    }
}

static void limits(void **state)
{
    (void)state;
    ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
    s.growth_interval = 1;
    s.scale = ldexpf(1.0f, 127);
    /* growth to infinity is refused (torch keeps the scale), the tracker still resets */
    assert_true(ddp_grad_scaler_update(&s, false));
    assert_true(s.scale == ldexpf(1.0f, 127));
    assert_int_equal(s.growth_tracker, 0);
    /* backoff stays exact through powers of two */
    s.scale = 65536.0f;
    for (int i = 0; i < 40; i++)
        ddp_grad_scaler_update(&s, true);
    assert_true(s.scale == ldexpf(1.0f, 16 - 40));
    ddp_error err = {0};
    ddp_grad_scaler bad = DDP_GRAD_SCALER_INIT;
    bad.scale = 0;
    assert_int_equal(ddp_grad_scaler_check(&bad, &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "grad scaler: scale 0 must be finite and > 0");
    bad = (ddp_grad_scaler)DDP_GRAD_SCALER_INIT;
    bad.backoff_factor = 1;
    assert_int_equal(ddp_grad_scaler_check(&bad, &err), DDP_ERR_INVALID);
    bad = (ddp_grad_scaler)DDP_GRAD_SCALER_INIT;
    bad.growth_factor = 1;
    assert_int_equal(ddp_grad_scaler_check(&bad, &err), DDP_ERR_INVALID);
    bad = (ddp_grad_scaler)DDP_GRAD_SCALER_INIT;
    bad.growth_interval = 0;
    assert_int_equal(ddp_grad_scaler_check(&bad, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_grad_scaler_check(NULL, &err), DDP_ERR_INVALID);
}

static void unscale(void **state)
{
    (void)state;
    ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
    s.scale = 3.0f;
    float inv = (float)(1.0 / 3.0);
    float a[3] = {3, -6, 1e-3f}, b[2] = {0.5f, 7};
    float *g[3] = {a, NULL, b};
    size_t n[3] = {3, 5, 2};
    assert_false(ddp_grad_scaler_unscale(&s, g, n, 3));
    assert_true(a[0] == 3 * inv && a[1] == -6 * inv && a[2] == 1e-3f * inv);
    assert_true(b[0] == 0.5f * inv && b[1] == 7 * inv);
    b[1] = INFINITY;
    assert_true(ddp_grad_scaler_unscale(&s, g, n, 3));
    a[1] = NAN;
    b[1] = 1;
    assert_true(ddp_grad_scaler_unscale(&s, g, n, 3));
    /* a world of one: sync changes nothing */
    bool inf = true;
    assert_int_equal(ddp_grad_scaler_sync(NULL, &inf), DDP_OK);
    assert_true(inf);
}

/* Under ddprun, 2 ranks: rank 1 alone sees an inf; both skip and back off alike. With gpu, the
 * flag goes through a GPU group (the one that reduces device gradients; the fake GPU in CI,
 * DDP_TEST_FAKE_GPUS), the rest through a host group. */
static int sync_ranks(bool gpu)
{
    ddp_error err = {0};
    ddp_group *g, *gg = NULL;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "test_amp --sync: %s\n", err.msg);
        return 1;
    }
    go.device = DDP_DEVICE_CUDA;
    if (gpu && ddp_group_init(&go, &gg, &err) != DDP_OK) {
        fprintf(stderr, "test_amp --sync-gpu: %s\n", err.msg);
        ddp_group_destroy(g);
        return 1;
    }
    int r = ddp_group_rank(g), rc = 0;
    ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
    for (int step = 0; step < 4 && !rc; step++) {
        float grad[4] = {1, 2, 3, 4};
        if (r == 1 && step == 2)
            grad[3] = INFINITY;
        float *gs[1] = {grad};
        size_t n[1] = {4};
        bool inf = ddp_grad_scaler_unscale(&s, gs, n, 1);
        if (ddp_grad_scaler_sync(gpu ? gg : g, &inf) != DDP_OK) {
            fprintf(stderr, "rank %d: sync: %s\n", r, ddp_group_last_error(gpu ? gg : g));
            rc = 1;
            break;
        }
        bool take = ddp_grad_scaler_update(&s, inf);
        if (take != (step != 2)) {
            fprintf(stderr, "rank %d: step %d: take %d, expected %d\n", r, step, take, step != 2);
            rc = 1;
        }
    }
    if (!rc && s.scale != 32768.0f) {
        fprintf(stderr, "rank %d: scale %g, expected 32768\n", r, (double)s.scale);
        rc = 1;
    }
    /* every rank agrees on the final state */
    float mine = s.scale, lo = mine, hi = mine;
    if (ddp_allreduce(g, &mine, &lo, 1, DDP_FLOAT32, DDP_MIN) != DDP_OK ||
        ddp_allreduce(g, &mine, &hi, 1, DDP_FLOAT32, DDP_MAX) != DDP_OK || lo != hi)
        rc = 1;
    if (r == 0 && !rc)
        printf("2 ranks: the inf on rank 1 skipped the step on both; scale 32768 on both%s\n",
               gpu ? " (the flag through a GPU group)" : "");
    ddp_group_destroy(gg);
    ddp_group_destroy(g);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--sync"))
        return sync_ranks(false);
    if (argc > 1 && !strcmp(argv[1], "--sync-gpu"))
        return sync_ranks(true);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults),
        cmocka_unit_test(sequence),
        cmocka_unit_test(limits),
        cmocka_unit_test(unscale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
