/*
 * test_model.c — the models of ddp/model.h and the optimizer and schedule of ddp/optim.h.
 *
 * Models: the parameter list (names, torch shapes, counts, decay; a model of 200 parameter
 * tensors); forward against the same layers of ddp/nn.h composed by hand (bit for bit: the
 * same kernels in the same order); the whole backward of a CNN against central finite
 * differences of the loss (each parameter element moved by ±H; |analytic − numeric| ≤
 * FD_TOL · max(1, |analytic|), FD_TOL = 1e-2: float logits move the loss by about 1e-7 relative,
 * which the 2·H = 2e-3 step turns into ≈ 1e-4; GELU keeps the function smooth); gradients in the
 * caller's memory; the ready callback's order and errors; every refused call.
 * Optimizer: against the kernels of ddp/nn.h called by hand over several steps (bit for bit),
 * shards stepped separately = one whole step (bit for bit), decay only where the flag says.
 * Schedule: every decay × scaling × warmup against the formulas, written out here again.
 * Synthetic data encode their origin: element k of input i is a function of (i, k).
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
#include "kernels/kernels.h"

#define H 1e-3f
#define FD_TOL 1e-2

/* Input element k of sample i: a value in [-1, 1) from (i, k) alone. */

/* a and b (n floats) equal within rtol·max(1, |b|): the same computation through products of
 * other shapes (OpenBLAS picks its kernel by shape and CPU: a batch of 1 and a row of a batch of
 * 2 may round differently in the last bits on one machine and not on another). */
static void assert_floats_near(const float *a, const float *b, size_t n, double rtol)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]), s = fabs((double)b[i]);
        if (d > rtol * (s > 1 ? s : 1))
            fail_msg("element %zu: %.9g vs %.9g (off by %.3g)", i, (double)a[i], (double)b[i], d);
    }
}
static float xval(size_t i, size_t k)
{
    uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)k + 0x632be59bd9b4e019ull);
    z ^= z >> 31;
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 29;
    return (float)((double)(z >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *inputs(int n, size_t per)
{
    float *x = malloc(sizeof(float) * (size_t)n * per);
    assert_non_null(x);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < per; k++)
            x[(size_t)i * per + k] = xval((size_t)i, k);
    return x;
}

static ddp_model *build(const ddp_model_spec *s)
{
    ddp_model *m = NULL;
    ddp_error err = {0};
    ddp_status st = ddp_model_build(s, &m, &err);
    if (st != DDP_OK)
        fail_msg("build: %s", err.msg);
    return m;
}

static void expect_build_error(const ddp_model_spec *s, const char *needle)
{
    ddp_model *m = (ddp_model *)0x1;
    ddp_error err = {0};
    assert_int_equal(ddp_model_build(s, &m, &err), DDP_ERR_INVALID);
    assert_ptr_equal(m, (ddp_model *)0x1); /* untouched on failure */
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
}

/* s (device cuda) passes every check before the device's: without a GPU the build fails for
 * that reason alone (DDP_ERR_NOT_FOUND from the CUDA runtime, never a refusal of the precision),
 * with one it builds. */
static void expect_cuda_build(const ddp_model_spec *s, const char *what)
{
    ddp_model *m = NULL;
    ddp_error err = {0};
    int ngpu = 0;
    ddp_error ge = {0};
    bool gpu = ddp__cuda_device_count(&ngpu, &ge) == DDP_OK && ngpu > 0;
    ddp_status st = ddp_model_build(s, &m, &err);
    if (gpu) {
        if (st != DDP_OK)
            fail_msg("%s on cuda with a GPU: '%s'", what, err.msg);
        ddp_model_free(m);
    } else {
        assert_int_equal(st, DDP_ERR_NOT_FOUND);
        assert_null(m);
        assert_non_null(strstr(err.msg, "cuda: "));
        if (strstr(err.msg, "precision") || strstr(err.msg, "not implemented"))
            fail_msg("%s on cuda without a GPU: refused for its precision: '%s'", what, err.msg);
    }
}

/* ---- building -------------------------------------------------------------------------------- */

static void build_errors(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "transformer";
    expect_build_error(&s, "model type 'transformer' is not known; use one of: mlp, cnn");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.activation = "tanh";
    expect_build_error(&s, "activation 'tanh'");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.hidden = (const int64_t[]){16, 0};
    s.n_hidden = 2;
    expect_build_error(&s, "hidden[1] is 0");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.type = "cnn";
    s.channels = (const int64_t[]){2, 2, 2, 2, 2};
    s.n_channels = 5; /* 28 → 14 → 7 → 3 → 1: the fifth stage has nothing to shrink */
    expect_build_error(&s, "stage 5 cannot shrink a 1 × 1 image");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.max_batch = 0;
    expect_build_error(&s, "max_batch 0");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.classes = 0;
    expect_build_error(&s, "classes 0");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.dropout = 1.5f;
    expect_build_error(&s, "dropout 1.5");
    /* device and precision (ddp/device.h): reduced precision needs a GPU (bf16 on the CPU is
     * ddp_precision_check's: this CPU's bf16 units); the MLP and CNN on cuda take every
     * precision */
    for (int p = DDP_PRECISION_TF32; p < DDP_PRECISION_COUNT; p += 2) { /* tf32, fp16 */
        s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
        s.precision = (ddp_precision)p;
        expect_build_error(&s, "needs a GPU: the CPU path computes in fp32 or bf16");
    }
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.device = DDP_DEVICE_CUDA;
    s.precision = DDP_PRECISION_BF16;
    s.dropout = 0.25f;
    expect_cuda_build(&s, "mlp bf16");
    s.precision = DDP_PRECISION_FP16;
    expect_cuda_build(&s, "mlp fp16");
    s.type = "cnn";
    s.dropout = 0.0f;
    expect_cuda_build(&s, "cnn fp16");
    s.precision = DDP_PRECISION_BF16;
    expect_cuda_build(&s, "cnn bf16");
    s.channels = (const int64_t[]){2, 2, 2, 2, 2};
    s.n_channels = 5; /* the spec's own errors come first, on cuda too */
    s.precision = DDP_PRECISION_FP32;
    expect_build_error(&s, "stage 5 cannot shrink a 1 × 1 image");
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.device = DDP_DEVICE_COUNT;
    expect_build_error(&s, "model device 2: must be cpu or cuda");
    /* the GPT on cuda: fp16 with dropout is accepted by every check before the device's (the
     * GPT implements both on the GPU): without a GPU the build fails for that reason alone, with
     * one it builds */
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.device = DDP_DEVICE_CUDA;
    s.dropout = 0.1f;
    s.precision = DDP_PRECISION_FP16;
    expect_cuda_build(&s, "gpt fp16 with dropout");
    /* and out of range: refused by the precision check, before the device */
    s.precision = DDP_PRECISION_COUNT;
    expect_build_error(&s, "out of range");
    ddp_model *m;
    assert_int_equal(ddp_model_build(NULL, &m, NULL), DDP_ERR_INVALID);
    ddp_model_free(NULL);
}

/* device cuda on a machine without a GPU (or a build without CUDA): a clear error, no model */
static void gpt_cuda_without_gpu(void **state)
{
    (void)state;
    int n = 0;
    ddp_error e = {0};
    if (ddp__cuda_device_count(&n, &e) == DDP_OK)
        skip(); /* a GPU machine: test_cuda_gpt covers it */
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.device = DDP_DEVICE_CUDA;
    s.n_layer = 1;
    s.n_embd = 16;
    s.n_head = 2;
    s.block_size = 8;
    ddp_model *m = (ddp_model *)0x1;
    ddp_error err = {0};
    assert_int_equal(ddp_model_build(&s, &m, &err), DDP_ERR_NOT_FOUND);
    assert_ptr_equal(m, (ddp_model *)0x1);
    assert_non_null(strstr(err.msg, "cuda: "));
    /* bf16 is a precision the CUDA GPT has: the same no-GPU error, not a precision one */
    s.precision = DDP_PRECISION_BF16;
    err = (ddp_error){0};
    assert_int_equal(ddp_model_build(&s, &m, &err), DDP_ERR_NOT_FOUND);
    assert_ptr_equal(m, (ddp_model *)0x1);
    assert_non_null(strstr(err.msg, "cuda: "));
    assert_null(strstr(err.msg, "not implemented"));
}

/* The MLP and CNN on cuda without a GPU: the device's error (not a precision's or a type's),
 * no model, nothing leaked (the sanitizer builds check that). */
static void classifier_cuda_without_gpu(void **state)
{
    (void)state;
    int n = 0;
    ddp_error e = {0};
    if (ddp__cuda_device_count(&n, &e) == DDP_OK)
        skip(); /* a GPU machine: test_cuda_classifier covers it */
    const char *types[] = {"mlp", "cnn"};
    for (int t = 0; t < 2; t++)
        for (int p = DDP_PRECISION_FP32; p <= DDP_PRECISION_TF32; p++) {
            ddp_model_spec s = DDP_MODEL_SPEC_INIT;
            s.type = types[t];
            s.device = DDP_DEVICE_CUDA;
            s.precision = (ddp_precision)p;
            s.dropout = 0.25f; /* dropout is implemented on the GPU: not refused */
            ddp_model *m = (ddp_model *)0x1;
            ddp_error err = {0};
            assert_int_equal(ddp_model_build(&s, &m, &err), DDP_ERR_NOT_FOUND);
            assert_ptr_equal(m, (ddp_model *)0x1);
            if (!strstr(err.msg, "cuda: ") || strstr(err.msg, "not implemented"))
                fail_msg("%s %s on cuda without a GPU: '%s'", types[t],
                         ddp_precision_name((ddp_precision)p), err.msg);
        }
}

static void expect_param(const ddp_model_param *p, const char *name, int ndim, int64_t d0,
                         int64_t d1, int64_t d2, int64_t d3)
{
    assert_string_equal(p->name, name);
    assert_int_equal(p->ndim, ndim);
    int64_t d[4] = {d0, d1, d2, d3};
    size_t count = 1;
    for (int k = 0; k < ndim; k++) {
        assert_int_equal(p->shape[k], d[k]);
        count *= (size_t)d[k];
    }
    assert_int_equal(p->count, count);
    assert_true(p->decay);
    assert_non_null(p->data);
    assert_null(p->grad); /* no backward yet, nothing bound */
}

static void params_mlp(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.hidden = (const int64_t[]){256, 128};
    s.n_hidden = 2;
    ddp_model *m = build(&s);
    assert_string_equal(ddp_model_type(m), "mlp");
    size_t n, nb;
    const ddp_model_param *p = ddp_model_params(m, &n);
    ddp_model_buffers(m, &nb);
    assert_int_equal(n, 6);
    assert_int_equal(nb, 0);
    expect_param(&p[0], "fc1.weight", 2, 256, 784, 0, 0);
    expect_param(&p[1], "fc1.bias", 1, 256, 0, 0, 0);
    expect_param(&p[2], "fc2.weight", 2, 128, 256, 0, 0);
    expect_param(&p[3], "fc2.bias", 1, 128, 0, 0, 0);
    expect_param(&p[4], "fc3.weight", 2, 10, 128, 0, 0);
    expect_param(&p[5], "fc3.bias", 1, 10, 0, 0, 0);
    /* torch's default init: U(±1/sqrt(fan_in)), not all zero. */
    float bound = 1.0f / sqrtf(784.0f), mx = 0;
    for (size_t k = 0; k < p[0].count; k++)
        mx = fmaxf(mx, fabsf(p[0].data[k]));
    assert_true(mx > 0.9f * bound && mx <= bound);
    ddp_model_free(m);
}

static void params_cnn(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "cnn";
    s.channels = (const int64_t[]){8, 16};
    s.n_channels = 2;
    s.hidden = (const int64_t[]){32};
    s.n_hidden = 1;
    ddp_model *m = build(&s);
    size_t n, nb;
    const ddp_model_param *p = ddp_model_params(m, &n);
    const ddp_model_param *b = ddp_model_buffers(m, &nb);
    assert_int_equal(n, 12);
    expect_param(&p[0], "conv1.weight", 4, 8, 1, 3, 3);
    expect_param(&p[1], "conv1.bias", 1, 8, 0, 0, 0);
    expect_param(&p[2], "bn1.weight", 1, 8, 0, 0, 0);
    expect_param(&p[3], "bn1.bias", 1, 8, 0, 0, 0);
    expect_param(&p[4], "conv2.weight", 4, 16, 8, 3, 3);
    expect_param(&p[7], "bn2.bias", 1, 16, 0, 0, 0);
    expect_param(&p[8], "fc1.weight", 2, 32, 16 * 7 * 7, 0, 0);
    expect_param(&p[11], "fc2.bias", 1, 10, 0, 0, 0);
    for (int k = 0; k < 8; k++)
        assert_true(p[2].data[k] == 1.0f && p[3].data[k] == 0.0f); /* γ = 1, β = 0 */
    assert_int_equal(nb, 4);
    const char *bn[] = {"bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                        "bn2.running_var"};
    for (size_t i = 0; i < nb; i++) {
        assert_string_equal(b[i].name, bn[i]);
        assert_int_equal(b[i].ndim, 1);
        assert_int_equal(b[i].count, i < 2 ? 8 : 16);
        assert_null(b[i].grad);
        assert_false(b[i].decay);
        assert_true(b[i].data[0] == (i % 2 ? 1.0f : 0.0f));
    }
    ddp_model_free(m);
}

/* The ready callback's record: the order in which indices came, and an optional failure. */
typedef struct ready_log {
    size_t *order;
    size_t n, fail_at;
    ddp_status fail_with;
} ready_log;

static ddp_status record_ready(void *ctx, size_t i)
{
    ready_log *r = ctx;
    r->order[r->n++] = i;
    return i == r->fail_at ? r->fail_with : DDP_OK;
}

/* 99 hidden layers: 200 parameter tensors, more than any fixed table held. */
static void many_params(void **state)
{
    (void)state;
    int64_t hidden[99];
    for (int k = 0; k < 99; k++)
        hidden[k] = 3 + k % 4;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 2, s.in_w = 3, s.classes = 4, s.max_batch = 5;
    s.hidden = hidden;
    s.n_hidden = 99;
    ddp_model *m = build(&s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    assert_int_equal(n, 200);
    assert_string_equal(p[198].name, "fc100.weight");
    assert_string_equal(p[199].name, "fc100.bias");
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            assert_string_not_equal(p[i].name, p[j].name);
    float *x = inputs(5, 6);
    int32_t y[5] = {0, 1, 2, 3, 0};
    ddp_model_batch b = {.n = 5, .x = x, .labels = y};
    ddp_model_out out;
    assert_int_equal(ddp_model_forward(m, &b, true, &out), DDP_OK);
    assert_true(isfinite(out.loss) && out.count == 5);
    size_t order[200];
    ready_log r = {order, 0, SIZE_MAX, DDP_OK};
    assert_int_equal(ddp_model_backward(m, record_ready, &r), DDP_OK);
    assert_int_equal(r.n, 200);
    /* Layer by layer from the top, each layer's weight then bias. */
    for (size_t k = 0; k < 200; k += 2) {
        assert_int_equal(order[k], 198 - k);
        assert_int_equal(order[k + 1], 199 - k);
    }
    free(x);
    ddp_model_free(m);
}

/* ---- forward and backward -------------------------------------------------------------------- */

/* A 2-layer MLP (6 → 5 → 4, relu) by hand from ddp/nn.h gives the model's numbers bit for bit:
 * logits, loss, correct, and every gradient (scaled by grad_scale). */
static void mlp_matches_layers(void **state)
{
    (void)state;
    enum { B = 3, IN = 6, HID = 5, C = 4 };
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 2, s.in_w = 3, s.classes = C, s.max_batch = B, s.seed = 7;
    s.hidden = (const int64_t[]){HID};
    s.n_hidden = 1;
    ddp_model *m = build(&s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    float *x = inputs(B, IN);
    int32_t y[B] = {3, 0, 2};
    ddp_model_batch b = {.n = B, .x = x, .labels = y, .grad_scale = 0.25f};
    ddp_model_out out;
    assert_int_equal(ddp_model_forward(m, &b, true, &out), DDP_OK);
    float h[B * HID], a[B * HID], lg[B * C], dl[B * C], da[B * HID], dh[B * HID];
    ddp_nn_linear_forward(x, p[0].data, p[1].data, B, IN, HID, h);
    ddp_nn_relu_forward(h, B * HID, a);
    ddp_nn_linear_forward(a, p[2].data, p[3].data, B, HID, C, lg);
    double loss;
    int correct;
    assert_int_equal(ddp_nn_softmax_xent(lg, y, B, C, 0.25f, &loss, dl, &correct, NULL), DDP_OK);
    size_t rows, cols;
    const float *ml = ddp_model_logits(m, &rows, &cols);
    assert_int_equal(rows, B);
    assert_int_equal(cols, C);
    assert_memory_equal(ml, lg, sizeof lg);
    assert_true(out.loss == loss);
    assert_int_equal(out.correct, correct);
    assert_int_equal(out.count, B);
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_OK);
    float gW2[C * HID] = {0}, gb2[C] = {0}, gW1[HID * IN] = {0}, gb1[HID] = {0};
    ddp_nn_linear_backward(dl, a, p[2].data, B, HID, C, da, gW2, gb2);
    ddp_nn_relu_backward(da, h, B * HID, dh);
    ddp_nn_linear_backward(dh, x, p[0].data, B, IN, HID, NULL, gW1, gb1);
    assert_memory_equal(p[0].grad, gW1, sizeof gW1);
    assert_memory_equal(p[1].grad, gb1, sizeof gb1);
    assert_memory_equal(p[2].grad, gW2, sizeof gW2);
    assert_memory_equal(p[3].grad, gb2, sizeof gb2);
    /* From zero, grad_scale 0.125 gives exactly half of 0.25's (a power of two); a second
     * backward accumulates (+=) onto it. */
    ddp_model_zero_grad(m);
    for (int k = 0; k < C; k++)
        assert_true(p[3].grad[k] == 0.0f);
    b.grad_scale = 0.125f;
    assert_int_equal(ddp_model_forward(m, &b, true, &out), DDP_OK);
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_OK);
    for (int k = 0; k < HID * IN; k++)
        assert_true(p[0].grad[k] == 0.5f * gW1[k]);
    for (int k = 0; k < C; k++)
        assert_true(p[3].grad[k] == 0.5f * gb2[k]);
    assert_int_equal(ddp_model_forward(m, &b, true, &out), DDP_OK);
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_OK);
    for (int k = 0; k < C; k++)
        assert_float_equal(p[3].grad[k], gb2[k], 1e-6);
    free(x);
    ddp_model_free(m);
}

static double loss_of(ddp_model *m, const ddp_model_batch *b)
{
    ddp_model_out out;
    assert_int_equal(ddp_model_forward(m, b, true, &out), DDP_OK);
    return out.loss;
}

/* The CNN's whole backward (conv, batchnorm in training mode, GELU, max-pool, linear) against
 * finite differences of its loss, for every parameter element. */
static void cnn_finite_differences(void **state)
{
    (void)state;
    enum { B = 4, SIDE = 6 };
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "cnn";
    s.in_ch = 1, s.in_h = s.in_w = SIDE, s.classes = 3, s.max_batch = B, s.seed = 3;
    s.channels = (const int64_t[]){2};
    s.n_channels = 1;
    s.hidden = (const int64_t[]){5};
    s.n_hidden = 1;
    s.activation = "gelu";
    ddp_model *m = build(&s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    float *x = inputs(B, SIDE * SIDE);
    int32_t y[B] = {2, 0, 1, 1};
    ddp_model_batch b = {.n = B, .x = x, .labels = y};
    loss_of(m, &b);
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_OK);
    int checked = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < p[i].count; k++) {
            float v = p[i].data[k];
            p[i].data[k] = v + H;
            double lp = loss_of(m, &b);
            float up = p[i].data[k];
            p[i].data[k] = v - H;
            double lm = loss_of(m, &b);
            float dn = p[i].data[k];
            p[i].data[k] = v;
            double numeric = (lp - lm) / ((double)up - dn), analytic = p[i].grad[k];
            if (fabs(analytic - numeric) > FD_TOL * fmax(1.0, fabs(analytic)))
                fail_msg("%s[%zu]: backward %g, finite differences %g", p[i].name, k, analytic,
                         numeric);
            checked++;
        }
    assert_int_equal(checked, 2 * 9 + 2 + 2 + 2 + 5 * 2 * 3 * 3 + 5 + 3 * 5 + 3);
    free(x);
    ddp_model_free(m);
}

/* Gradients and values bound to the caller's memory: backward writes there, forward reads
 * there, the numbers are those of an unbound twin. */
static void bind_to_caller_memory(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 4, s.in_w = 4, s.classes = 3, s.max_batch = 2;
    s.hidden = (const int64_t[]){4};
    s.n_hidden = 1;
    ddp_model *m = build(&s), *twin = build(&s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n), *q = ddp_model_params(twin, &n);
    float *vals[4], *grads[4];
    for (size_t i = 0; i < n; i++) {
        vals[i] = malloc(sizeof(float) * p[i].count);
        grads[i] = calloc(p[i].count, sizeof(float));
        memcpy(vals[i], p[i].data, sizeof(float) * p[i].count);
        assert_int_equal(ddp_model_bind(m, i, vals[i], grads[i]), DDP_OK);
        assert_ptr_equal(p[i].data, vals[i]);
        assert_ptr_equal(p[i].grad, grads[i]);
    }
    assert_int_equal(ddp_model_bind(m, n, vals[0], NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "parameter 4 of a model with 4"));
    float *x = inputs(2, 16);
    int32_t y[2] = {1, 2};
    ddp_model_batch b = {.n = 2, .x = x, .labels = y};
    for (ddp_model *mm = m; mm; mm = mm == m ? twin : NULL) {
        assert_int_equal(ddp_model_forward(mm, &b, true, NULL), DDP_OK);
        assert_int_equal(ddp_model_backward(mm, NULL, NULL), DDP_OK);
    }
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(grads[i], q[i].grad, sizeof(float) * p[i].count);
    vals[3][0] += 1.0f; /* fc2.bias: the model reads the caller's values */
    assert_int_equal(ddp_model_forward(m, &b, false, NULL), DDP_OK);
    assert_int_equal(ddp_model_forward(twin, &b, false, NULL), DDP_OK);
    assert_memory_not_equal(ddp_model_logits(m, NULL, NULL), ddp_model_logits(twin, NULL, NULL),
                            sizeof(float) * 6);
    ddp_model_free(m);
    for (size_t i = 0; i < n; i++) { /* still the caller's after free */
        vals[i][0] = 0;
        free(vals[i]);
        free(grads[i]);
    }
    free(x);
    ddp_model_free(twin);
}

/* ddp_model_backward_pooled (ZeRO-2's backward): each gradient's memory comes from acquire, before
 * its first write and before its ready; the gradients are ddp_model_backward's bit for bit. */
typedef struct pool_log {
    const ddp_model_param *p;
    float *mem[64];
    int acquired[64], readied[64]; /* the event number of the first acquire, of ready (from 1) */
    int events, fail_at;           /* fail_at: refuse that parameter's acquire (−1: none) */
} pool_log;

static ddp_status log_acquire(void *ctx, size_t i, float **grad)
{
    pool_log *l = ctx;
    if ((int)i == l->fail_at)
        return DDP_ERR_NOMEM;
    if (!l->mem[i])
        l->mem[i] = calloc(l->p[i].count ? l->p[i].count : 1, sizeof(float));
    if (!l->acquired[i])
        l->acquired[i] = ++l->events;
    assert_int_equal(l->readied[i], 0); /* never after its ready */
    *grad = l->mem[i];
    return DDP_OK;
}

static ddp_status log_ready(void *ctx, size_t i)
{
    pool_log *l = ctx;
    assert_int_equal(l->readied[i], 0);
    l->readied[i] = ++l->events;
    return DDP_OK;
}

static void pooled_one(const ddp_model_spec *s)
{
    ddp_model *m = build(s), *q = build(s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n), *pq = ddp_model_params(q, &n);
    assert_true(n <= 64);
    bool gpt = !strcmp(s->type, "gpt");
    int B = s->max_batch, T = 8;
    float *x = inputs(B, (size_t)(s->in_ch * s->in_h * s->in_w));
    int32_t y[4] = {2, 0, 1, 1}, tok[4 * 8], tgt[4 * 8];
    for (int k = 0; k < B * T; k++) {
        tok[k] = (k * 7 + 3) % s->vocab_size;
        tgt[k] = (k * 5 + 1) % s->vocab_size;
    }
    ddp_model_batch b = gpt ? (ddp_model_batch){.n = B, .tokens = tok, .targets = tgt, .seq_len = T}
                            : (ddp_model_batch){.n = B, .x = x, .labels = y};
    pool_log l = {.p = p, .fail_at = -1};
    assert_int_equal(ddp_model_backward_pooled(m, log_acquire, log_ready, &l), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "forward in training mode"));
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_OK);
    assert_int_equal(ddp_model_forward(q, &b, true, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward_pooled(m, NULL, log_ready, &l), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_backward_pooled(m, log_acquire, log_ready, &l), DDP_OK);
    assert_int_equal(ddp_model_backward(q, NULL, NULL), DDP_OK);
    for (size_t i = 0; i < n; i++) {
        assert_true(l.acquired[i] > 0 && l.readied[i] > l.acquired[i]);
        assert_memory_equal(l.mem[i], pq[i].grad, p[i].count * sizeof(float));
        assert_null(p[i].grad); /* lent for the backward only */
    }
    if (gpt) { /* the tied token embedding: acquired first (the head), ready last */
        assert_int_equal(l.acquired[0], 1);
        assert_int_equal(l.readied[0], l.events);
    }
    /* an acquire that fails stops the backward with its status, naming the parameter */
    pool_log f = {.p = p, .fail_at = (int)n - 1};
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward_pooled(m, log_acquire, log_ready, &f), DDP_ERR_NOMEM);
    assert_non_null(strstr(ddp_model_last_error(m), p[n - 1].name));
    for (size_t i = 0; i < n; i++) {
        free(l.mem[i]);
        free(f.mem[i]);
    }
    free(x);
    ddp_model_free(m);
    ddp_model_free(q);
}

static void pooled_backward(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = s.in_w = 6, s.classes = 3, s.max_batch = 4, s.seed = 5;
    s.hidden = (const int64_t[]){5, 4};
    s.n_hidden = 2;
    pooled_one(&s); /* mlp */
    s.type = "cnn";
    s.channels = (const int64_t[]){2};
    s.n_channels = 1;
    pooled_one(&s);
    s = (ddp_model_spec)DDP_MODEL_SPEC_INIT;
    s.type = "gpt", s.n_layer = 2, s.n_head = 2, s.n_embd = 16, s.block_size = 8;
    s.vocab_size = 32, s.max_batch = 4, s.seed = 9;
    pooled_one(&s);
}

/* An MLP of 2 × 2 inputs, 4 hidden units and 3 classes, batches of at most 2. */
static ddp_model *tiny_mlp(void)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 2, s.in_w = 2, s.classes = 3, s.max_batch = 2;
    s.hidden = (const int64_t[]){4};
    s.n_hidden = 1;
    return build(&s);
}

static void refused_calls(void **state)
{
    (void)state;
    ddp_model *m = tiny_mlp();
    assert_null(ddp_model_logits(m, NULL, NULL));
    float *x = inputs(3, 4);
    int32_t y[3] = {0, 1, 2}, bad[2] = {0, 3};
    ddp_model_batch b = {.n = 3, .x = x, .labels = y};
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "batch of 3 samples: the model takes 1 … 2"));
    b.n = 0;
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_ERR_INVALID);
    b = (ddp_model_batch){.n = 2, .labels = y};
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "no inputs"));
    b = (ddp_model_batch){.n = 2, .x = x, .labels = bad};
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "label 3 of row 1 is outside [0, 3)"));
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "backward needs a forward in training mode"));
    /* Evaluation, and a forward without labels, leave nothing to backward. */
    b.labels = y;
    ddp_model_out out;
    assert_int_equal(ddp_model_forward(m, &b, false, &out), DDP_OK);
    assert_int_equal(out.count, 2);
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_ERR_INVALID);
    b.labels = NULL;
    assert_int_equal(ddp_model_forward(m, &b, true, &out), DDP_OK);
    assert_int_equal(out.count, 0);
    assert_non_null(ddp_model_logits(m, NULL, NULL));
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_ERR_INVALID);
    /* One backward per forward; a failing callback stops it, named. */
    b.labels = y;
    assert_int_equal(ddp_model_forward(m, &b, true, NULL), DDP_OK);
    size_t order[4];
    ready_log r = {order, 0, 2, DDP_ERR_NETWORK};
    assert_int_equal(ddp_model_backward(m, record_ready, &r), DDP_ERR_NETWORK);
    assert_int_equal(r.n, 1); /* fc2.weight came first, and nothing after it */
    assert_non_null(strstr(ddp_model_last_error(m), "'fc2.weight'"));
    assert_int_equal(ddp_model_backward(m, NULL, NULL), DDP_ERR_INVALID);
    free(x);
    ddp_model_free(m);
}

/* Device-resident training is for GPU models: a CPU model of any type is refused, clearly, and
 * leaves the model as it was; the resident calls refuse a model that is not resident. (On a GPU:
 * scripts/gpu-check.sh's ddptrain runs.) */
static void resident_refusals(void **state)
{
    (void)state;
    ddp_model *m = tiny_mlp();
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    ddp_error err = {0};
    assert_int_equal(ddp_model_resident(m, &oo, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "mlp: device-resident training needs a model built with "
                                    "device cuda"));
    assert_false(ddp_model_is_resident(m));
    assert_null(ddp_model_device_param(m, 0));
    assert_null(ddp_model_device_buffer(m, 0));
    assert_null(ddp_model_cuda_stream(m));
    ddp_model_free(m);

    ddp_model_spec cs = DDP_MODEL_SPEC_INIT; /* a cnn: buffers too */
    cs.type = "cnn", cs.in_h = cs.in_w = 4, cs.channels = (const int64_t[]){2}, cs.n_channels = 1;
    cs.max_batch = 2;
    m = build(&cs);
    err = (ddp_error){0};
    assert_int_equal(ddp_model_resident(m, &oo, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "cnn: device-resident training needs a model built with "
                                    "device cuda"));
    assert_false(ddp_model_is_resident(m));
    assert_null(ddp_model_device_buffer(m, 0));
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_ERR_INVALID);
    ddp_model_free(m);

    ddp_model_spec g = DDP_MODEL_SPEC_INIT;
    g.type = "gpt", g.n_layer = 1, g.n_head = 2, g.n_embd = 8, g.block_size = 4;
    g.vocab_size = 16, g.max_batch = 2;
    m = build(&g);
    err = (ddp_error){0};
    assert_int_equal(ddp_model_resident(m, &oo, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "needs a model built with device cuda"));
    assert_false(ddp_model_is_resident(m));
    assert_null(ddp_model_cuda_stream(m));
    float x[4];
    assert_int_equal(ddp_model_bind_device_grad(m, 0, x), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "not device-resident"));
    assert_int_equal(ddp_model_device_step(m, 0, 1, 0.1f, 1.0f), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_device_step_range(m, 0, 0, 1, 1, 0.1f, 1.0f), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "device_step_range: the model is not"));
    float *xs[16] = {x};
    assert_int_equal(ddp_model_bind_device_params(m, xs), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "bind_device_params: the model is not"));
    float *dev[16];
    assert_int_equal(ddp_model_device_state(m, 0, dev), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "device_state: the model is not"));
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_sync_device(m, NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_resident(m, NULL, &err), DDP_ERR_INVALID);
    ddp_model_free(m);
}

/* Dropout masks follow (seed, step, sample key): the same sample gives the same mask in any
 * batch position, and another step another mask; keys may be strided (sample_stride). */
static void dropout_keys(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 4, s.in_w = 4, s.classes = 3, s.max_batch = 2, s.dropout = 0.5f;
    s.hidden = (const int64_t[]){64};
    s.n_hidden = 1;
    ddp_model *m = build(&s);
    float *x = inputs(2, 16);
    ddp_model_batch both = {.n = 2, .x = x, .step = 5, .sample_offset = 10};
    ddp_model_batch second = {.n = 1, .x = x + 16, .step = 5, .sample_offset = 11};
    float a[3], bb[3], c[3];
    assert_int_equal(ddp_model_forward(m, &both, true, NULL), DDP_OK);
    memcpy(a, ddp_model_logits(m, NULL, NULL) + 3, sizeof a);
    assert_int_equal(ddp_model_forward(m, &second, true, NULL), DDP_OK);
    memcpy(bb, ddp_model_logits(m, NULL, NULL), sizeof bb);
    assert_floats_near(a, bb, 3, 1e-5);
    second.step = 6;
    assert_int_equal(ddp_model_forward(m, &second, true, NULL), DDP_OK);
    memcpy(c, ddp_model_logits(m, NULL, NULL), sizeof c);
    assert_memory_not_equal(a, c, sizeof a);
    /* sample_stride: the DistributedSampler's rank holds every W-th sample of the global batch.
     * Offset 10, stride 3: the second sample is keyed 13, as in a batch that starts there (with
     * stride 1 it was keyed 11, so N ranks drew other masks for a sample than 1 rank × N·B). */
    ddp_model_batch strided = {.n = 2, .x = x, .step = 5, .sample_offset = 10, .sample_stride = 3};
    ddp_model_batch at13 = {.n = 1, .x = x + 16, .step = 5, .sample_offset = 13};
    assert_int_equal(ddp_model_forward(m, &strided, true, NULL), DDP_OK);
    memcpy(a, ddp_model_logits(m, NULL, NULL) + 3, sizeof a);
    assert_int_equal(ddp_model_forward(m, &at13, true, NULL), DDP_OK);
    memcpy(bb, ddp_model_logits(m, NULL, NULL), sizeof bb);
    assert_floats_near(a, bb, 3, 1e-5);
    /* its first sample keeps offset 10's mask */
    assert_int_equal(ddp_model_forward(m, &strided, true, NULL), DDP_OK);
    memcpy(a, ddp_model_logits(m, NULL, NULL), sizeof a);
    assert_int_equal(ddp_model_forward(m, &both, true, NULL), DDP_OK);
    memcpy(bb, ddp_model_logits(m, NULL, NULL), sizeof bb);
    assert_floats_near(a, bb, 3, 1e-5);
    free(x);
    ddp_model_free(m);
    /* A gpt keys its samples contiguously: a stride is refused, naming it. */
    ddp_model_spec g = DDP_MODEL_SPEC_INIT;
    g.type = "gpt", g.n_layer = 1, g.n_head = 2, g.n_embd = 8, g.block_size = 4;
    g.vocab_size = 16, g.max_batch = 2, g.dropout = 0.1f;
    m = build(&g);
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ddp_model_batch gb = {.n = 2, .tokens = tok, .seq_len = 4, .sample_stride = 2};
    assert_int_equal(ddp_model_forward(m, &gb, true, NULL), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_model_last_error(m), "sample_stride 2"));
    gb.sample_stride = 1;
    assert_int_equal(ddp_model_forward(m, &gb, true, NULL), DDP_OK);
    ddp_model_free(m);
}

/* ---- optimizer ------------------------------------------------------------------------------- */

enum { NP = 3 };
static const size_t counts[NP] = {7, 1, 12};

/* Parameters with values, gradients and decay flags (the second without decay). */
static void make_params(ddp_model_param *p, float *store)
{
    const char *names[NP] = {"a.weight", "a.bias", "b.weight"};
    for (int i = 0; i < NP; i++) {
        p[i] = (ddp_model_param){.name = names[i],
                                 .ndim = 1,
                                 .shape = {(int64_t)counts[i]},
                                 .count = counts[i],
                                 .decay = i != 1,
                                 .data = store,
                                 .grad = store + counts[i]};
        for (size_t k = 0; k < counts[i]; k++) {
            p[i].data[k] = xval((size_t)i, k);
            p[i].grad[k] = xval((size_t)i + 100, k);
        }
        store += 2 * counts[i];
    }
}

static void optimizer_matches_kernels(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        float s1[40], s2[40];
        ddp_model_param p[NP], q[NP];
        make_params(p, s1);
        make_params(q, s2);
        ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
        oo.kind = kind ? DDP_OPTIM_ADAMW : DDP_OPTIM_SGD;
        oo.weight_decay = 0.1f;
        oo.momentum = 0.8f;
        oo.beta1 = 0.85f;
        ddp_optim *o;
        assert_int_equal(ddp_optim_create(&oo, p, NP, &o, NULL), DDP_OK);
        assert_int_equal(ddp_optim_num_states(o), kind ? 2 : 1);
        assert_string_equal(ddp_optim_state_name(o, 0), kind ? "exp_avg" : "momentum_buffer");
        if (kind)
            assert_string_equal(ddp_optim_state_name(o, 1), "exp_avg_sq");
        assert_null(ddp_optim_state_name(o, 2));
        assert_null(ddp_optim_state(o, -1));
        float ma[NP][12] = {{0}}, va[NP][12] = {{0}};
        for (uint64_t step = 1; step <= 4; step++) {
            float lr = 0.01f * (float)step, scale = step == 2 ? 0.5f : 1.0f;
            ddp_optim_step(o, step, lr, scale);
            for (int i = 0; i < NP; i++) {
                for (size_t k = 0; k < counts[i]; k++)
                    q[i].grad[k] *= scale;
                float wd = i == 1 ? 0.0f : 0.1f;
                if (kind)
                    ddp_nn_adamw_step(q[i].data, q[i].grad, ma[i], va[i], counts[i], lr, 0.85f,
                                      0.999f, 1e-8f, wd, step);
                else
                    ddp_nn_sgd_step(q[i].data, q[i].grad, ma[i], counts[i], lr, 0.8f, wd, step);
            }
        }
        for (int i = 0; i < NP; i++) {
            assert_memory_equal(p[i].data, q[i].data, sizeof(float) * counts[i]);
            assert_memory_equal(p[i].grad, q[i].grad, sizeof(float) * counts[i]);
            assert_memory_equal(ddp_optim_state(o, 0)[i], ma[i], sizeof(float) * counts[i]);
            if (kind)
                assert_memory_equal(ddp_optim_state(o, 1)[i], va[i], sizeof(float) * counts[i]);
        }
        ddp_optim_destroy(o);
    }
    ddp_optim_destroy(NULL);
}

/* Each parameter stepped in three shards, as three ranks would, equals one whole step. */
static void optimizer_shards(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        float s1[40], s2[40];
        ddp_model_param p[NP], q[NP];
        make_params(p, s1);
        make_params(q, s2);
        ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
        oo.kind = kind ? DDP_OPTIM_ADAMW : DDP_OPTIM_SGD;
        oo.weight_decay = 0.01f;
        ddp_optim *whole, *sharded;
        assert_int_equal(ddp_optim_create(&oo, p, NP, &whole, NULL), DDP_OK);
        assert_int_equal(ddp_optim_create(&oo, q, NP, &sharded, NULL), DDP_OK);
        for (uint64_t step = 1; step <= 3; step++) {
            ddp_optim_step(whole, step, 0.1f, 0.75f);
            for (size_t i = 0; i < NP; i++)
                for (size_t r = 0; r < 3; r++)
                    assert_int_equal(ddp_optim_step_range(sharded, i, counts[i] * r / 3,
                                                          counts[i] * (r + 1) / 3, step, 0.1f,
                                                          0.75f),
                                     DDP_OK);
        }
        for (int i = 0; i < NP; i++) {
            assert_memory_equal(p[i].data, q[i].data, sizeof(float) * counts[i]);
            for (int st = 0; st < ddp_optim_num_states(whole); st++)
                assert_memory_equal(ddp_optim_state(whole, st)[i], ddp_optim_state(sharded, st)[i],
                                    sizeof(float) * counts[i]);
        }
        ddp_optim_destroy(whole);
        ddp_optim_destroy(sharded);
    }
}

/* ZeRO-1's memory split: three optimizers over the same parameters, each narrowed to one third
 * of every parameter's state (ddp_optim_keep) after a step of its own, stepping their thirds,
 * give the parameters and state of one whole optimizer, bit for bit; ddp_optim_step steps the
 * kept elements only; a step outside them, or a keep that widens, is refused and changes
 * nothing. */
static void optimizer_keep(void **state)
{
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        float s1[40], s2[40];
        ddp_model_param p[NP], q[NP];
        make_params(p, s1);
        make_params(q, s2);
        ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
        oo.kind = kind ? DDP_OPTIM_ADAMW : DDP_OPTIM_SGD;
        oo.weight_decay = 0.01f;
        ddp_optim *whole, *part[3];
        assert_int_equal(ddp_optim_create(&oo, p, NP, &whole, NULL), DDP_OK);
        for (int r = 0; r < 3; r++)
            assert_int_equal(ddp_optim_create(&oo, q, NP, &part[r], NULL), DDP_OK);
        assert_false(ddp_optim_narrowed(part[0]));
        size_t lo[3][NP], hi[3][NP];
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < NP; i++) {
                lo[r][i] = counts[i] * (size_t)r / 3;
                hi[r][i] = counts[i] * (size_t)(r + 1) / 3;
            }
        /* step 1 whole on part[r]'s own third (the state it will keep is current), then keep */
        ddp_optim_step(whole, 1, 0.1f, 1.0f);
        for (int r = 0; r < 3; r++) {
            for (int i = 0; i < NP; i++)
                assert_int_equal(
                    ddp_optim_step_range(part[r], (size_t)i, lo[r][i], hi[r][i], 1, 0.1f, 1.0f),
                    DDP_OK);
            assert_int_equal(ddp_optim_keep(part[r], lo[r], hi[r]), DDP_OK);
            assert_true(ddp_optim_narrowed(part[r]));
            for (int i = 0; i < NP; i++) {
                size_t a, b;
                ddp_optim_kept(part[r], (size_t)i, &a, &b);
                assert_true(a == lo[r][i] && b == hi[r][i]);
            }
        }
        for (uint64_t step = 2; step <= 4; step++) {
            ddp_optim_step(whole, step, 0.1f, 0.75f);
            for (int r = 0; r < 3; r++)
                ddp_optim_step(part[r], step, 0.1f, 0.75f); /* its third */
        }
        for (int i = 0; i < NP; i++) {
            assert_memory_equal(p[i].data, q[i].data, sizeof(float) * counts[i]);
            for (int st = 0; st < ddp_optim_num_states(whole); st++)
                for (int r = 0; r < 3; r++)
                    assert_memory_equal(ddp_optim_state(whole, st)[i] + lo[r][i],
                                        ddp_optim_state(part[r], st)[i],
                                        sizeof(float) * (hi[r][i] - lo[r][i]));
        }
        /* refusals: outside the kept third, or widening it; nothing changes */
        float before[12];
        memcpy(before, q[2].data, sizeof before);
        assert_int_equal(ddp_optim_step_range(part[1], 2, 0, 12, 5, 0.1f, 1.0f), DDP_ERR_INVALID);
        assert_non_null(strstr(ddp_optim_last_error(part[1]), "keeps the state of [4, 8) only"));
        assert_int_equal(ddp_optim_keep(part[1], lo[0], hi[0]), DDP_ERR_INVALID);
        assert_non_null(strstr(ddp_optim_last_error(part[1]), "can only narrow"));
        assert_memory_equal(before, q[2].data, sizeof before);
        size_t a, b;
        ddp_optim_kept(part[1], 2, &a, &b);
        assert_true(a == 4 && b == 8);
        ddp_optim_kept(part[1], NP, &a, &b);
        assert_true(a == 0 && b == 0);
        ddp_optim_destroy(whole);
        for (int r = 0; r < 3; r++)
            ddp_optim_destroy(part[r]);
    }
}

static void optimizer_refusals(void **state)
{
    (void)state;
    float s1[40];
    ddp_model_param p[NP];
    make_params(p, s1);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    ddp_optim *o = (ddp_optim *)0x1;
    ddp_error err = {0};
    oo.beta2 = 1.0f;
    assert_int_equal(ddp_optim_create(&oo, p, NP, &o, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "betas"));
    oo = (ddp_optim_opts)DDP_OPTIM_OPTS_INIT;
    oo.kind = (ddp_optim_kind)7;
    assert_int_equal(ddp_optim_create(&oo, p, NP, &o, &err), DDP_ERR_INVALID);
    assert_ptr_equal(o, (ddp_optim *)0x1);
    assert_int_equal(ddp_optim_create(NULL, p, NP, &o, NULL), DDP_OK); /* the defaults */
    float before[7];
    memcpy(before, p[0].data, sizeof before);
    assert_int_equal(ddp_optim_step_range(o, 0, 3, 8, 1, 0.1f, 1.0f), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_optim_last_error(o), "elements [3, 8) of parameter 0"));
    assert_int_equal(ddp_optim_step_range(o, 3, 0, 0, 1, 0.1f, 1.0f), DDP_ERR_INVALID);
    assert_int_equal(ddp_optim_step_range(o, 0, 5, 4, 1, 0.1f, 1.0f), DDP_ERR_INVALID);
    assert_memory_equal(before, p[0].data, sizeof before);
    assert_int_equal(ddp_optim_step_range(o, 0, 4, 4, 1, 0.1f, 1.0f), DDP_OK); /* empty shard */
    assert_memory_equal(before, p[0].data, sizeof before);
    ddp_optim_destroy(o);
}

/* A model's list: the optimizer reads pointers bound after its creation. */
static void optimizer_over_model(void **state)
{
    (void)state;
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.in_ch = 1, s.in_h = 1, s.in_w = 3, s.classes = 2, s.max_batch = 1;
    ddp_model *m = build(&s);
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.momentum = 0;
    ddp_optim *o;
    assert_int_equal(ddp_optim_create(&oo, p, n, &o, NULL), DDP_OK);
    float w[6], g[6];
    for (int k = 0; k < 6; k++)
        w[k] = 1.0f, g[k] = (float)k;
    assert_int_equal(ddp_model_bind(m, 0, w, g), DDP_OK);
    float g1[2] = {0, 0};
    assert_int_equal(ddp_model_bind(m, 1, NULL, g1), DDP_OK);
    ddp_optim_step(o, 1, 0.5f, 1.0f);
    for (int k = 0; k < 6; k++)
        assert_true(w[k] == 1.0f - 0.5f * (float)k);
    ddp_optim_destroy(o);
    ddp_model_free(m);
}

/* ---- learning-rate schedule ------------------------------------------------------------------ */

static void expect_lr(const ddp_lr_schedule *s, uint64_t step, double want)
{
    double got = ddp_lr_at(s, step);
    if (fabs(got - want) > 1e-12 * fmax(1.0, fabs(want)))
        fail_msg("step %llu: lr %.17g, want %.17g", (unsigned long long)step, got, want);
}

static void schedule_formulas(void **state)
{
    (void)state;
    const double pi = 3.14159265358979323846;
    ddp_lr_schedule s = DDP_LR_SCHEDULE_INIT;
    assert_true(s.lr == 0.1 && s.world_size == 1 && s.decay == DDP_LR_COSINE);
    for (int sc = 0; sc < 3; sc++)
        for (int dc = 0; dc < 3; dc++)
            for (uint64_t warm = 0; warm <= 10; warm += 10) {
                s = (ddp_lr_schedule){.lr = 0.3,
                                      .scaling = (ddp_lr_scaling)sc,
                                      .world_size = 4,
                                      .warmup_steps = warm,
                                      .decay = (ddp_lr_decay)dc,
                                      .total_steps = 110};
                double peak = 0.3 * (sc == 0 ? 1.0 : sc == 1 ? 4.0 : 2.0);
                for (uint64_t step = 0; step <= 110; step++) {
                    double want;
                    if (step < warm) {
                        want = peak * (double)(step + 1) / (double)warm;
                    } else {
                        double f = (double)(step - warm) / (double)(110 - warm);
                        want = dc == 0   ? peak * (1 + cos(pi * f)) / 2
                               : dc == 1 ? peak * (1 - f)
                                         : peak;
                    }
                    expect_lr(&s, step, want);
                }
            }
    /* Landmarks, by hand: warmup ends at the peak; cosine is half-way at the middle, zero at
     * the end; linear a quarter of the way down at 1/4. */
    s = (ddp_lr_schedule){.lr = 1.0,
                          .scaling = DDP_LR_SCALE_NONE,
                          .world_size = 8,
                          .warmup_steps = 4,
                          .decay = DDP_LR_COSINE,
                          .total_steps = 104};
    expect_lr(&s, 0, 0.25);
    expect_lr(&s, 3, 1.0);
    expect_lr(&s, 4, 1.0);
    expect_lr(&s, 54, 0.5);
    expect_lr(&s, 104, 0.0);
    s.decay = DDP_LR_LINEAR;
    expect_lr(&s, 29, 0.75);
    /* No steps after warmup: the peak, not a division by zero. */
    s.total_steps = 4;
    expect_lr(&s, 4, 1.0);
    expect_lr(&s, 9, 1.0);
    /* StepLR (torch.optim.lr_scheduler.StepLR(step_size=30, gamma=0.1) stepped each step):
     * constant within a period, × gamma at each boundary, counted after warmup. */
    s = (ddp_lr_schedule)DDP_LR_SCHEDULE_INIT;
    assert_true(s.gamma == 0.1 && s.step_size == 0);
    s.lr = 1.0;
    s.decay = DDP_LR_STEP;
    s.step_size = 30;
    s.total_steps = 1000;
    expect_lr(&s, 0, 1.0);
    expect_lr(&s, 29, 1.0);
    expect_lr(&s, 30, 0.1);
    expect_lr(&s, 59, 0.1);
    expect_lr(&s, 60, 0.01);
    expect_lr(&s, 95, 0.001);
    s.warmup_steps = 4;
    s.gamma = 0.5;
    s.scaling = DDP_LR_SCALE_LINEAR;
    s.world_size = 2;
    expect_lr(&s, 0, 0.5);
    expect_lr(&s, 4, 2.0);
    expect_lr(&s, 33, 2.0);
    expect_lr(&s, 34, 1.0);
    expect_lr(&s, 64, 0.5);
    s.step_size = 0; /* no period: never decayed */
    expect_lr(&s, 500, 2.0);
}

/* ddp_model_measure_peak: a plausible rate (OpenBLAS SGEMM on one core reaches tens of
 * GFLOP/s; a floor of 0.1 GFLOP/s holds even on a loaded, sanitized build) and clear refusals. */
static void measure_peak(void **state)
{
    (void)state;
    double peak = 0;
    ddp_error err = {0};
    assert_int_equal(ddp_model_measure_peak(0.01, DDP_PRECISION_FP32, &peak, &err), DDP_OK);
    assert_true(peak > 1e8 && peak < 1e15);
    assert_int_equal(ddp_model_measure_peak(0, DDP_PRECISION_FP32, &peak, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "seconds 0"));
    assert_int_equal(ddp_model_measure_peak(0.01, DDP_PRECISION_FP32, NULL, &err), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_measure_peak(0.01, DDP_PRECISION_FP16, &peak, &err),
                     DDP_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(build_errors),
        cmocka_unit_test(gpt_cuda_without_gpu),
        cmocka_unit_test(classifier_cuda_without_gpu),
        cmocka_unit_test(params_mlp),
        cmocka_unit_test(params_cnn),
        cmocka_unit_test(many_params),
        cmocka_unit_test(mlp_matches_layers),
        cmocka_unit_test(cnn_finite_differences),
        cmocka_unit_test(bind_to_caller_memory),
        cmocka_unit_test(pooled_backward),
        cmocka_unit_test(refused_calls),
        cmocka_unit_test(resident_refusals),
        cmocka_unit_test(dropout_keys),
        cmocka_unit_test(optimizer_matches_kernels),
        cmocka_unit_test(optimizer_shards),
        cmocka_unit_test(optimizer_keep),
        cmocka_unit_test(optimizer_refusals),
        cmocka_unit_test(optimizer_over_model),
        cmocka_unit_test(schedule_formulas),
        cmocka_unit_test(measure_peak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
