/*
 * test_cuda_classifier.c — the MLP and the CNN with device cuda against the same models on the
 * CPU (the reference, src/nn/classifier.c): the same spec and seed give the same initial weights;
 * on random inputs then
 *   - evaluation logits (the running statistics at their initial values), rel ≤ 1e-4;
 *   - a training forward's loss (≤ 1e-5) and correct count, the running statistics it leaves
 *     (rel ≤ 1e-4), and the first backward's gradients, rel ≤ 1e-3 per tensor — with a full and a
 *     partial batch (cuDNN's descriptors reset), relu and gelu, with and without dropout (the
 *     masks are the CPU's bit for bit: the same counter-based generator);
 *   - evaluation logits after training steps (the updated running statistics), rel ≤ 1e-3;
 *   - 10 SGD-with-momentum steps (the host optimizer on both), every loss within 1e-4 (fp32),
 *     within 1e-2 with precision tf32 on the GPU (cuDNN's and cuBLASLt's TF32 products).
 * Each layer kind (linear, relu, gelu, dropout, conv, batchnorm, max-pool, the loss) is in at
 * least one model here; a fault shows as the first tensor whose gradient differs (printed).
 * Skips (77) without a GPU; fails under DDP_REQUIRE_GPU=1. UNVERIFIED until run on a GPU.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "gpu_skip.h"

enum { B = 8, CH = 2, H = 12, W = 12, K = 5, IN = CH * H * W };

typedef struct variant {
    const char *type, *activation;
    float dropout;
} variant;

static ddp_model *build(const variant *v, ddp_device dev, ddp_precision prec)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = v->type;
    s.activation = v->activation;
    s.dropout = v->dropout;
    s.in_ch = CH;
    s.in_h = H;
    s.in_w = W;
    s.classes = K;
    s.channels = (const int64_t[]){4, 6};
    s.n_channels = 2;
    s.hidden = (const int64_t[]){24, 16};
    s.n_hidden = 2;
    s.max_batch = B;
    s.seed = 4321;
    s.device = dev;
    s.precision = prec;
    ddp_model *m = NULL;
    ddp_error err = {0};
    if (ddp_model_build(&s, &m, &err) != DDP_OK)
        fail_msg("build %s (%s): %s", v->type, ddp_device_name(dev), err.msg);
    return m;
}

/* Inputs in [-2, 2) and labels, a pure function of (step, element). */
static void make_batch(uint64_t step, float *x, int32_t *y)
{
    for (int i = 0; i < B * IN; i++)
        x[i] = 4.0f * (float)(ddp_nn_rand_u64(77, step, (uint64_t)i) >> 40) / 16777216.0f - 2.0f;
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)(ddp_nn_rand_u64(78, step, (uint64_t)i) % K);
}

/* The largest |a − b| over the largest |b| (at least floor). */
static double rel_floor(const float *a, const float *b, size_t n, double floor)
{
    double md = 0, mb = floor;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md)) /* a NaN counts */
            md = d;
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return md / (mb > 0 ? mb : 1e-30);
}

static double rel(const float *a, const float *b, size_t n)
{
    return rel_floor(a, b, n, 0.0);
}

static void logits_close(ddp_model *cpu, ddp_model *gpu, double tol, const char *what)
{
    size_t r1, c1, r2, c2;
    const float *l1 = ddp_model_logits(cpu, &r1, &c1), *l2 = ddp_model_logits(gpu, &r2, &c2);
    assert_non_null(l1);
    assert_non_null(l2);
    assert_int_equal(r1, r2);
    assert_int_equal(c1, c2);
    double d = rel(l2, l1, r1 * c1);
    printf("    %s logits: rel %.2e (tolerance %.0e)\n", what, d, tol);
    if (!(d <= tol))
        fail_msg("%s logits: rel %.3e > %.0e", what, d, tol);
}

static void buffers_close(ddp_model *cpu, ddp_model *gpu, double tol)
{
    size_t nb, nb2;
    const ddp_model_param *b1 = ddp_model_buffers(cpu, &nb), *b2 = ddp_model_buffers(gpu, &nb2);
    assert_int_equal(nb, nb2);
    for (size_t j = 0; j < nb; j++) {
        double d = rel(b2[j].data, b1[j].data, b1[j].count);
        if (!(d <= tol))
            fail_msg("buffer %s: rel %.3e > %.0e", b1[j].name, d, tol);
    }
}

/* One model variant: logits, a training forward and backward with n samples. */
static void forward_backward(const variant *v, int n)
{
    ddp_model *cpu = build(v, DDP_DEVICE_CPU, DDP_PRECISION_FP32);
    ddp_model *gpu = build(v, DDP_DEVICE_CUDA, DDP_PRECISION_FP32);
    static float x[B * IN];
    int32_t y[B];
    make_batch(1, x, y);
    printf("  %s %s dropout %.2f, batch %d of %d\n", v->type, v->activation, (double)v->dropout, n,
           B);
    ddp_model_batch b = {.n = n, .x = x, .labels = y, .step = 3, .sample_offset = 40};
    ddp_model_out o1, o2;
    assert_int_equal(ddp_model_forward(cpu, &b, false, &o1), DDP_OK);
    assert_int_equal(ddp_model_forward(gpu, &b, false, &o2), DDP_OK);
    logits_close(cpu, gpu, 1e-4, "evaluation");
    assert_int_equal(ddp_model_forward(cpu, &b, true, &o1), DDP_OK);
    assert_int_equal(ddp_model_forward(gpu, &b, true, &o2), DDP_OK);
    printf("    loss: cpu %.7f gpu %.7f; correct %lld %lld\n", o1.loss, o2.loss,
           (long long)o1.correct, (long long)o2.correct);
    assert_true(fabs(o1.loss - o2.loss) <= 1e-5);
    assert_int_equal(o1.count, o2.count);
    assert_int_equal(o1.correct, o2.correct);
    logits_close(cpu, gpu, 1e-4, "training");
    buffers_close(cpu, gpu, 1e-4);
    assert_int_equal(ddp_model_backward(cpu, NULL, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward(gpu, NULL, NULL), DDP_OK);
    size_t np;
    const ddp_model_param *p1 = ddp_model_params(cpu, &np), *p2 = ddp_model_params(gpu, &np);
    /* Against each tensor's largest value, floored at 1e-3 of the model's largest gradient: a
     * conv bias in front of a training batchnorm has a true gradient of exactly 0 (the
     * batchnorm's dx sums to 0 per channel), so both sides hold rounding noise (1e-9 … 1e-7)
     * that differs, and its own maximum would be no scale. */
    double gmax = 0;
    for (size_t i = 0; i < np; i++)
        for (size_t k = 0; k < p1[i].count; k++)
            gmax = fmax(gmax, fabs((double)p1[i].grad[k]));
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        double d = rel_floor(p2[i].grad, p1[i].grad, p1[i].count, 1e-3 * gmax);
        printf("      gradient of %-14s rel %.2e\n", p1[i].name, d);
        if (!(d <= worst))
            worst = d;
        if (!(d <= 1e-3))
            fail_msg("gradient of %s: rel %.3e > 1e-3", p1[i].name, d);
    }
    printf("    gradients: worst tensor rel %.2e (tolerance 1e-3)\n", worst);
    ddp_model_free(cpu);
    ddp_model_free(gpu);
}

static const variant cnn_relu = {"cnn", "relu", 0.0f}, cnn_gelu_drop = {"cnn", "gelu", 0.25f},
                     mlp_relu_drop = {"mlp", "relu", 0.5f}, mlp_gelu = {"mlp", "gelu", 0.0f};

static void cnn_matches(void **state)
{
    (void)state;
    forward_backward(&cnn_relu, B);
    forward_backward(&cnn_relu, 3); /* a partial batch: cuDNN's descriptors set again */
    forward_backward(&cnn_gelu_drop, B);
}

static void mlp_matches(void **state)
{
    (void)state;
    forward_backward(&mlp_relu_drop, B);
    forward_backward(&mlp_gelu, 5);
}

/* Model reports readiness of every parameter once, in the CPU's order. */
typedef struct marks {
    size_t order[64];
    size_t n;
} marks;

static ddp_status mark(void *ctx, size_t i)
{
    marks *m = ctx;
    if (m->n < 64)
        m->order[m->n] = i;
    m->n++;
    return DDP_OK;
}

static void ready_order(void **state)
{
    (void)state;
    ddp_model *cpu = build(&cnn_relu, DDP_DEVICE_CPU, DDP_PRECISION_FP32);
    ddp_model *gpu = build(&cnn_relu, DDP_DEVICE_CUDA, DDP_PRECISION_FP32);
    static float x[B * IN];
    int32_t y[B];
    make_batch(2, x, y);
    ddp_model_batch b = {.n = B, .x = x, .labels = y};
    marks m1 = {0}, m2 = {0};
    assert_int_equal(ddp_model_forward(cpu, &b, true, NULL), DDP_OK);
    assert_int_equal(ddp_model_forward(gpu, &b, true, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward(cpu, mark, &m1), DDP_OK);
    assert_int_equal(ddp_model_backward(gpu, mark, &m2), DDP_OK);
    size_t np;
    ddp_model_params(cpu, &np);
    assert_int_equal(m1.n, np);
    assert_int_equal(m2.n, np);
    assert_memory_equal(m1.order, m2.order, np * sizeof(size_t));
    ddp_model_free(cpu);
    ddp_model_free(gpu);
}

/* 10 SGD steps (momentum 0.9) on both; the largest loss difference. Then evaluation logits with
 * the running statistics the steps left. */
static double train10(const variant *v, ddp_precision gpu_prec, double eval_tol)
{
    ddp_model *m[2] = {build(v, DDP_DEVICE_CPU, DDP_PRECISION_FP32),
                       build(v, DDP_DEVICE_CUDA, gpu_prec)};
    ddp_optim *o[2];
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_SGD;
    oo.momentum = 0.9f;
    oo.weight_decay = 5e-4f;
    ddp_error err = {0};
    for (int k = 0; k < 2; k++) {
        size_t np;
        const ddp_model_param *p = ddp_model_params(m[k], &np);
        if (ddp_optim_create(&oo, p, np, &o[k], &err) != DDP_OK)
            fail_msg("%s", err.msg);
    }
    static float x[B * IN];
    int32_t y[B];
    double worst = 0;
    for (uint64_t step = 1; step <= 10; step++) {
        make_batch(100 + step, x, y);
        ddp_model_batch b = {.n = B, .x = x, .labels = y, .step = step, .sample_offset = step * B};
        double loss[2];
        for (int k = 0; k < 2; k++) {
            ddp_model_out out;
            ddp_model_zero_grad(m[k]);
            assert_int_equal(ddp_model_forward(m[k], &b, true, &out), DDP_OK);
            assert_int_equal(ddp_model_backward(m[k], NULL, NULL), DDP_OK);
            ddp_optim_step(o[k], step, 0.05f, 1.0f);
            loss[k] = out.loss;
        }
        printf("    step %2llu: cpu %.6f gpu %.6f (%s)\n", (unsigned long long)step, loss[0],
               loss[1], ddp_precision_name(gpu_prec));
        if (!(fabs(loss[0] - loss[1]) <= worst))
            worst = fabs(loss[0] - loss[1]);
    }
    make_batch(999, x, y);
    ddp_model_batch b = {.n = B, .x = x};
    for (int k = 0; k < 2; k++)
        assert_int_equal(ddp_model_forward(m[k], &b, false, NULL), DDP_OK);
    logits_close(m[0], m[1], eval_tol, "evaluation after 10 steps");
    for (int k = 0; k < 2; k++) {
        ddp_optim_destroy(o[k]);
        ddp_model_free(m[k]);
    }
    return worst;
}

static void ten_steps_fp32(void **state)
{
    (void)state;
    double d = train10(&cnn_relu, DDP_PRECISION_FP32, 1e-3);
    printf("  cnn 10 steps fp32: largest loss difference %.2e (tolerance 1e-4)\n", d);
    assert_true(d <= 1e-4);
    d = train10(&mlp_relu_drop, DDP_PRECISION_FP32, 1e-3);
    printf("  mlp (dropout) 10 steps fp32: largest loss difference %.2e (tolerance 1e-4)\n", d);
    assert_true(d <= 1e-4);
}

static void ten_steps_tf32(void **state)
{
    (void)state;
    double d = train10(&cnn_relu, DDP_PRECISION_TF32, 5e-2);
    printf("  cnn 10 steps tf32: largest loss difference %.2e (tolerance 1e-2)\n", d);
    assert_true(d <= 1e-2);
}

/* What the CPU's layers refuse, the cuda model refuses the same way, before any work. */
static void refusals(void **state)
{
    (void)state;
    ddp_model *gpu = build(&cnn_relu, DDP_DEVICE_CUDA, DDP_PRECISION_FP32);
    static float x[B * IN];
    int32_t y[B];
    make_batch(5, x, y);
    y[2] = K;
    ddp_model_batch b = {.n = B, .x = x, .labels = y};
    assert_int_equal(ddp_model_forward(gpu, &b, true, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(gpu), "label 5 of row 2 is outside [0, 5)"));
    ddp_model_free(gpu);
}

int main(void)
{
    int n = ddp_test_gpus_or_skip("test_cuda_classifier");
    printf("test_cuda_classifier: %d GPU(s); the MLP and CNN on cuda:0 against the CPU\n", n);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cnn_matches),    cmocka_unit_test(mlp_matches),
        cmocka_unit_test(ready_order),    cmocka_unit_test(ten_steps_fp32),
        cmocka_unit_test(ten_steps_tf32), cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
