/*
 * test_cuda_gpt.c — the GPT with device cuda against the same GPT on the CPU (the reference):
 * the same spec and seed give the same initial weights; then
 *   - evaluation logits (all positions, and last_logits), rel ≤ 1e-3; an evaluation with
 *     loss_only the same loss, its logits left on the device;
 *   - the first backward's gradients, rel ≤ 1e-3 per tensor;
 *   - 10 AdamW steps (the host optimizer on both), every loss within 1e-4 (fp32), within 5e-3
 *     with precision tf32 on the GPU;
 *   - bias false, and a batch with ignored targets and a shorter sequence;
 *   - precision bf16 on the GPU (bf16_*): logits and gradients against the CPU in fp32 with
 *     bounds that catch a wrong index, not bf16's error; 10 AdamW steps against the CPU model in
 *     bf16 (fp32 where this CPU has no bf16 units), and not fp32's losses bit for bit;
 *   - precision fp16 on the GPU (fp16_*), as torch.autocast(float16) + GradScaler: the same
 *     against the CPU in fp32, the GPU's loss scaled by 65536 (GradScaler's initial scale) and
 *     its gradients unscaled on the host (ddp/amp.h), tighter bounds (11 significant bits);
 *   - generation's key/value cache (kv_cache_*): a kv_cache forward (only the new positions
 *     computed, over the device's cached keys and values) against a twin's whole forward, fp32
 *     (batched and flash attention), bf16 and fp16: a token at a time, several new positions at
 *     once, a changed token, the same, a shorter and a slid context, weights changed on the host
 *     after a forward without the cache, and after a device-resident optimizer step;
 *   - the fused (flash) attention against the batched one (DDP_CUDA_ATTENTION), fp32, bf16 and
 *     fp16: logits and 10 steps' losses (flash_vs_batched), and with dropout 0.2 (the same
 *     masks on both paths: flash_vs_batched_dropout);
 *   - device-resident: a sync with an optimizer of another kind is refused and copies nothing
 *     (resident_sync_other_kind); the optimizer's state narrowed to a slice of each parameter
 *     (ZeRO-1's memory split, resident_keep) steps as the whole state does, bit for bit; bound
 *     to other arrays, the model's own parameter buffer is freed, and made again at unbind
 *     (resident_bind_frees_params); a rank with an empty shard keeps nothing and still steps
 *     and syncs (resident_keep_nothing); out of device memory (the emulated GPU's limit), keep, the
 *     state made at the first step, unbind and the first host backward each fail saying so,
 *     change nothing, and work once memory is there (resident_out_of_memory).
 * Skips (77) without a GPU; fails under DDP_REQUIRE_GPU=1. UNVERIFIED until run on a GPU.
 */
#define _GNU_SOURCE /* setenv, RTLD_NOLOAD */
#include <dlfcn.h>
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
#include "gpu_amp_step.h"
#include "gpu_skip.h"

enum { L = 2, NH = 4, C = 64, TMAX = 32, V = 97, B = 4 };

/* flash_vs_batched*: 10 steps, 3 under ASan (gpu_emu.cuda_gpt in the sanitizer pass, where every
 * emulated thread is checked: each step runs the same kernels and host code as the first, and the
 * 10-step bounds are the plain pass's to check; the 10 steps took 60 of its 115 s there). */
#if defined(__SANITIZE_ADDRESS__)
#define FLASH_STEPS 3
#else
#define FLASH_STEPS 10
#endif

static float drop_p; /* the dropout of the models build() makes (dropout_matches sets it) */

static ddp_model *build(ddp_device dev, ddp_precision prec, bool bias)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.n_layer = L;
    s.n_head = NH;
    s.n_embd = C;
    s.block_size = TMAX;
    s.vocab_size = V;
    s.max_batch = B;
    s.seed = 1234;
    s.bias = bias;
    s.device = dev;
    s.precision = prec;
    s.dropout = drop_p;
    ddp_model *m = NULL;
    ddp_error err = {0};
    if (ddp_model_build(&s, &m, &err) != DDP_OK)
        fail_msg("build (%s): %s", ddp_device_name(dev), err.msg);
    return m;
}

static void make_batch(uint64_t step, int T, int32_t *tok, int32_t *tgt)
{
    for (int i = 0; i < B * T; i++) {
        uint64_t r = ddp_nn_rand_u64(99, step, (uint64_t)i);
        tok[i] = (int32_t)(r % V);
        tgt[i] = (int32_t)((r >> 20) % V);
    }
}

static double rel(const float *a, const float *b, size_t n)
{
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= md))
            md = d;
        if (fabs(b[i]) > mb)
            mb = fabs(b[i]);
    }
    return md / (mb > 0 ? mb : 1e-30);
}

static void logits_match(void **state)
{
    (void)state;
    ddp_model *cpu = build(DDP_DEVICE_CPU, DDP_PRECISION_FP32, true);
    ddp_model *gpu = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(0, TMAX, tok, tgt);
    for (int last = 0; last < 2; last++) {
        ddp_model_batch b = {.n = B, .tokens = tok, .seq_len = TMAX, .last_logits = last};
        assert_int_equal(ddp_model_forward(cpu, &b, false, NULL), DDP_OK);
        assert_int_equal(ddp_model_forward(gpu, &b, false, NULL), DDP_OK);
        size_t r1, c1, r2, c2;
        const float *l1 = ddp_model_logits(cpu, &r1, &c1), *l2 = ddp_model_logits(gpu, &r2, &c2);
        assert_int_equal(r1, r2);
        assert_int_equal(c1, c2);
        double d = rel(l2, l1, r1 * c1);
        printf("  logits%s: rel %.2e (tolerance 1e-3)\n", last ? " (last positions)" : "", d);
        assert_true(d <= 1e-3);
    }
    ddp_model_free(cpu);
    ddp_model_free(gpu);
}

/* An evaluation forward with loss_only: the same loss, count and accuracy as without, and the
 * logits left on the device (ddp_model_logits NULL), never the (n·T, V) copy; a training forward
 * after an evaluation leaves no logits either (they hold the loss's gradient). The CPU model
 * keeps its logits. */
static void loss_only_keeps_logits_on_device(void **state)
{
    (void)state;
    ddp_model *cpu = build(DDP_DEVICE_CPU, DDP_PRECISION_FP32, true);
    ddp_model *gpu = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(3, TMAX, tok, tgt);
    ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = TMAX};
    ddp_model_out full, lo;
    assert_int_equal(ddp_model_forward(gpu, &b, false, &full), DDP_OK);
    assert_non_null(ddp_model_logits(gpu, NULL, NULL));
    b.loss_only = true;
    assert_int_equal(ddp_model_forward(gpu, &b, false, &lo), DDP_OK);
    assert_null(ddp_model_logits(gpu, NULL, NULL));
    printf("  loss %.6f, loss_only %.6f\n", full.loss, lo.loss);
    assert_true(full.loss == lo.loss);
    assert_int_equal(full.count, lo.count);
    assert_int_equal(full.correct, lo.correct);
    assert_int_equal(ddp_model_forward(cpu, &b, false, &lo), DDP_OK);
    assert_non_null(ddp_model_logits(cpu, NULL, NULL));
    b.loss_only = false;
    assert_int_equal(ddp_model_forward(gpu, &b, false, &full), DDP_OK);
    assert_non_null(ddp_model_logits(gpu, NULL, NULL));
    assert_int_equal(ddp_model_forward(gpu, &b, true, &full), DDP_OK);
    assert_null(ddp_model_logits(gpu, NULL, NULL));
    ddp_model_free(cpu);
    ddp_model_free(gpu);
}

/* A training forward and backward of b on both models: the losses within 1e-5 (and the same
 * count), every gradient tensor within 1e-3 relative; what names the case in the output. */
static void step_matches(ddp_model *cpu, ddp_model *gpu, const ddp_model_batch *b, const char *what)
{
    ddp_model_out o1, o2;
    assert_int_equal(ddp_model_forward(cpu, b, true, &o1), DDP_OK);
    assert_int_equal(ddp_model_forward(gpu, b, true, &o2), DDP_OK);
    printf("  %s loss: cpu %.6f gpu %.6f; count %lld %lld; correct %lld %lld\n", what, o1.loss,
           o2.loss, (long long)o1.count, (long long)o2.count, (long long)o1.correct,
           (long long)o2.correct);
    assert_true(fabs(o1.loss - o2.loss) <= 1e-5);
    assert_int_equal(o1.count, o2.count);
    assert_int_equal(ddp_model_backward(cpu, NULL, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward(gpu, NULL, NULL), DDP_OK);
    size_t np;
    const ddp_model_param *p1 = ddp_model_params(cpu, &np), *p2 = ddp_model_params(gpu, &np);
    double worst = 0;
    for (size_t i = 0; i < np; i++) {
        double d = rel(p2[i].grad, p1[i].grad, p1[i].count);
        worst = d > worst ? d : worst;
        if (!(d <= 1e-3))
            fail_msg("%s: gradient of %s: rel %.3e > 1e-3", what, p1[i].name, d);
    }
    printf("  %s gradients: worst tensor rel %.2e (tolerance 1e-3)\n", what, worst);
}

static void grads_match(void **state)
{
    (void)state;
    for (int bias = 0; bias < 2; bias++) {
        ddp_model *cpu = build(DDP_DEVICE_CPU, DDP_PRECISION_FP32, bias);
        ddp_model *gpu = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, bias);
        const int T = 19; /* shorter than block_size */
        int32_t tok[B * TMAX], tgt[B * TMAX];
        make_batch(1, T, tok, tgt);
        for (int i = 0; i < B * T; i += 5)
            tgt[i] = DDP_NN_IGNORE_INDEX;
        ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = T};
        step_matches(cpu, gpu, &b, bias ? "bias 1" : "bias 0");
        ddp_model_free(cpu);
        ddp_model_free(gpu);
    }
}

/* 10 AdamW steps on both; returns the largest loss difference; gpu_loss (10,) the GPU's losses
 * when not NULL. With amp (precision fp16) the GPU side is GradScaler's loop (ddp/amp.h): the loss
 * scaled, the gradients unscaled and checked, the step skipped (on both sides, so that they stay
 * comparable) and the scale backed off on inf/NaN; *skipped counts those steps. */
static double train10_amp(ddp_precision cpu_prec, ddp_precision gpu_prec, bool amp,
                          double *gpu_loss, int *skipped)
{
    ddp_grad_scaler scaler = DDP_GRAD_SCALER_INIT;
    if (skipped)
        *skipped = 0;
    ddp_model *m[2] = {build(DDP_DEVICE_CPU, cpu_prec, true),
                       build(DDP_DEVICE_CUDA, gpu_prec, true)};
    ddp_optim *o[2];
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    oo.beta2 = 0.95f;
    oo.weight_decay = 0.1f;
    ddp_error err = {0};
    for (int k = 0; k < 2; k++) {
        size_t np;
        const ddp_model_param *p = ddp_model_params(m[k], &np);
        if (ddp_optim_create(&oo, p, np, &o[k], &err) != DDP_OK)
            fail_msg("%s", err.msg);
    }
    double worst = 0;
    for (uint64_t step = 1; step <= 10; step++) {
        int32_t tok[B * TMAX], tgt[B * TMAX];
        make_batch(100 + step, TMAX, tok, tgt);
        ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = TMAX, .step = step};
        double loss[2];
        bool take = true;
        for (int k = 0; k < 2; k++) {
            ddp_model_out out;
            ddp_model_zero_grad(m[k]);
            b.grad_scale = k == 1 && amp ? scaler.scale : 1.0f;
            assert_int_equal(ddp_model_forward(m[k], &b, true, &out), DDP_OK);
            assert_int_equal(ddp_model_backward(m[k], NULL, NULL), DDP_OK);
            loss[k] = out.loss;
        }
        if (amp)
            take = ddp_test_amp_step(m[1], &scaler, step, skipped);
        for (int k = 0; k < 2 && take; k++)
            ddp_optim_step(o[k], step, 1e-3f, 1.0f);
        printf("    step %2llu: cpu %.6f (%s) gpu %.6f (%s)\n", (unsigned long long)step, loss[0],
               ddp_precision_name(cpu_prec), loss[1], ddp_precision_name(gpu_prec));
        if (gpu_loss)
            gpu_loss[step - 1] = loss[1];
        if (!(fabs(loss[0] - loss[1]) <= worst)) /* a NaN loss counts */
            worst = fabs(loss[0] - loss[1]);
    }
    for (int k = 0; k < 2; k++) {
        ddp_optim_destroy(o[k]);
        ddp_model_free(m[k]);
    }
    return worst;
}

static double train10_on(ddp_precision cpu_prec, ddp_precision gpu_prec, double *gpu_loss)
{
    return train10_amp(cpu_prec, gpu_prec, false, gpu_loss, NULL);
}

static double train10(ddp_precision gpu_prec)
{
    return train10_on(DDP_PRECISION_FP32, gpu_prec, NULL);
}

static void ten_steps_fp32(void **state)
{
    (void)state;
    double d = train10(DDP_PRECISION_FP32);
    printf("  10 steps fp32: largest loss difference %.2e (tolerance 1e-4)\n", d);
    assert_true(d <= 1e-4);
}

/* Dropout 0.2 (the embedding's, the probabilities', the residual branches'): the GPU draws the
 * CPU's masks (util/rng.h's hashes from the same seeds, step and sample offset), so a training
 * forward and backward match as without dropout, and 10 steps too; a batch not at sample 0 and
 * a step > 0, so that offsets and steps count. */
static void dropout_matches(void **state)
{
    (void)state;
    drop_p = 0.2f;
    ddp_model *cpu = build(DDP_DEVICE_CPU, DDP_PRECISION_FP32, true);
    ddp_model *gpu = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    drop_p = 0.0f; /* a failed assertion below must not leave later tests with dropout */
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(2, TMAX, tok, tgt);
    ddp_model_batch b = {
        .n = B, .tokens = tok, .targets = tgt, .seq_len = TMAX, .step = 7, .sample_offset = 12};
    step_matches(cpu, gpu, &b, "dropout 0.2");
    ddp_model_free(cpu);
    ddp_model_free(gpu);
    drop_p = 0.2f;
    double d = train10(DDP_PRECISION_FP32);
    drop_p = 0.0f;
    printf("  dropout 0.2, 10 steps fp32: largest loss difference %.2e (tolerance 1e-4)\n", d);
    assert_true(d <= 1e-4);
    /* bf16 with dropout against the CPU in fp32 with the same masks: a bound that catches a
     * wrong mask (a dropped unit moves the loss by far more), not bf16's own error */
    drop_p = 0.2f;
    d = train10_on(DDP_PRECISION_FP32, DDP_PRECISION_BF16, NULL);
    drop_p = 0.0f;
    printf("  dropout 0.2, 10 steps bf16 vs cpu fp32: largest loss difference %.2e (tolerance "
           "5e-2)\n",
           d);
    assert_true(d <= 5e-2);
}

static void ten_steps_tf32(void **state)
{
    (void)state;
    double d = train10(DDP_PRECISION_TF32);
    printf("  10 steps tf32: largest loss difference %.2e (tolerance 5e-3)\n", d);
    assert_true(d <= 5e-3);
}

/* ---- precision bf16 on the GPU ------------------------------------------------------------------
 * The GPU rounds to bf16 every matrix product's operands (weights, layernorm outputs, q/k/v, the
 * probabilities, the MLP's activations, the gradients that feed products) and the products'
 * outputs that only products or the residual add read (docs/gpu.md's table). */

/* Evaluation logits and the first backward's gradients, GPU bf16 or fp16 against CPU fp32, the
 * GPU's loss scaled by loss_scale and its gradients divided by it after backward (fp16's loss
 * scaling; 1: none). The bounds (logits, loss relative, each gradient tensor) are the caller's. */
static void h_logits_grads(ddp_precision prec, float loss_scale, double tol_logits, double tol_loss,
                           double tol_grad)
{
    const char *pn = ddp_precision_name(prec);
    ddp_model *cpu = build(DDP_DEVICE_CPU, DDP_PRECISION_FP32, true);
    ddp_model *gpu = build(DDP_DEVICE_CUDA, prec, true);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(0, TMAX, tok, tgt);
    for (int last = 0; last < 2; last++) {
        ddp_model_batch b = {.n = B, .tokens = tok, .seq_len = TMAX, .last_logits = last};
        assert_int_equal(ddp_model_forward(cpu, &b, false, NULL), DDP_OK);
        assert_int_equal(ddp_model_forward(gpu, &b, false, NULL), DDP_OK);
        size_t r1, c1, r2, c2;
        const float *l1 = ddp_model_logits(cpu, &r1, &c1), *l2 = ddp_model_logits(gpu, &r2, &c2);
        assert_int_equal(r1, r2);
        assert_int_equal(c1, c2);
        double d = rel(l2, l1, r1 * c1);
        printf("  %s logits%s: rel %.2e against fp32 (bound %.0e)\n", pn,
               last ? " (last positions)" : "", d, tol_logits);
        assert_true(d <= tol_logits);
    }
    const int T = 19;
    make_batch(1, T, tok, tgt);
    for (int i = 0; i < B * T; i += 5)
        tgt[i] = DDP_NN_IGNORE_INDEX;
    ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = T};
    ddp_model_out o1, o2;
    assert_int_equal(ddp_model_forward(cpu, &b, true, &o1), DDP_OK);
    b.grad_scale = loss_scale;
    assert_int_equal(ddp_model_forward(gpu, &b, true, &o2), DDP_OK);
    printf("  %s loss: cpu fp32 %.6f gpu %s %.6f (bound %.0e relative)\n", pn, o1.loss, pn, o2.loss,
           tol_loss);
    assert_true(fabs(o1.loss - o2.loss) <= tol_loss * fabs(o1.loss));
    assert_int_equal(o1.count, o2.count);
    assert_int_equal(ddp_model_backward(cpu, NULL, NULL), DDP_OK);
    assert_int_equal(ddp_model_backward(gpu, NULL, NULL), DDP_OK);
    size_t np;
    const ddp_model_param *p1 = ddp_model_params(cpu, &np), *p2 = ddp_model_params(gpu, &np);
    double worst = 0;
    const char *bad = NULL;
    for (size_t i = 0; i < np; i++) {
        for (size_t k = 0; k < p2[i].count && loss_scale != 1.0f; k++)
            p2[i].grad[k] /= loss_scale; /* a power of two: exact */
        double d = rel(p2[i].grad, p1[i].grad, p1[i].count);
        printf("    gradient of %-28s rel %.2e\n", p1[i].name, d);
        if (!(d <= worst)) {
            worst = d;
            if (!(d <= tol_grad))
                bad = p1[i].name;
        }
    }
    printf("  %s gradients: worst tensor rel %.2e against fp32 (bound %.0e)\n", pn, worst,
           tol_grad);
    if (bad)
        fail_msg("%s gradient of %s: rel %.3e > %.0e", pn, bad, worst, tol_grad);
    ddp_model_free(cpu);
    ddp_model_free(gpu);
}

/* bf16 keeps 8 significant bits (a rounding is ≤ 2⁻⁹ ≈ 2e-3 relative); the CPU's own bf16 path
 * is within 1% (loss) and 3% (gradients) of fp32 (unit.test_gpt). The bounds here (logits 5e-2,
 * loss 2e-2 relative, each gradient tensor 1e-1) are a few times that: they catch a wrong stride,
 * operand or dtype (errors of order 1), not bf16's own error, which the printout shows. */
static void bf16_logits_grads(void **state)
{
    (void)state;
    h_logits_grads(DDP_PRECISION_BF16, 1.0f, 5e-2, 2e-2, 1e-1);
}

/* fp16 keeps 11 significant bits (2⁻¹² ≈ 2.4e-4 per rounding, 8× finer than bf16): bounds 8×
 * tighter than bf16's where its error dominates (logits 1e-2, loss 5e-3, gradients 3e-2), the
 * loss scaled by 65536 as GradScaler starts (the gradients, unscaled exactly, must match too: a
 * missing or doubled scale is an error of order 1). Estimates, to be checked on a GPU. */
static void fp16_logits_grads(void **state)
{
    (void)state;
    h_logits_grads(DDP_PRECISION_FP16, 65536.0f, 1e-2, 5e-3, 3e-2);
}

/* 10 AdamW steps: GPU bf16 against the CPU model in bf16 (docs/nn.md: the same products'
 * operands rounded, everything else fp32), the closest reference, within 2e-2 per loss; where
 * this CPU cannot compute bf16, against fp32 within 5e-2 (unit.test_gpt's 1% bound between the
 * CPU's bf16 and fp32, on a loss of ln 97 ≈ 4.6). Why 2e-2 (≈ 0.4% of the loss): both sides
 * round the same operands; the GPU also rounds the projections' outputs before the residual add,
 * the pre-GELU activation, dS and the gradients feeding products (docs/gpu.md lists each), each
 * a relative 2⁻⁹ per element, averaged over the 128 × 97 terms of the loss; the updates (lr
 * 1e-3) move the losses by ~1e-2 over the 10 steps, so a bf16 error in the gradients changes
 * the trajectory by a fraction of that. An estimate, to be confirmed on the first GPU run.
 * Also: the losses are not fp32's bit for bit (the bf16 path really ran). */
static void bf16_ten_steps(void **state)
{
    (void)state;
    ddp_error e = {0};
    const bool cpu_bf16 = ddp_precision_check(DDP_DEVICE_CPU, DDP_PRECISION_BF16, &e) == DDP_OK;
    const double tol = cpu_bf16 ? 2e-2 : 5e-2;
    if (!cpu_bf16)
        printf("  this CPU has no bf16 products (%s): the reference is fp32\n", e.msg);
    double lb[10], lf[10];
    double d =
        train10_on(cpu_bf16 ? DDP_PRECISION_BF16 : DDP_PRECISION_FP32, DDP_PRECISION_BF16, lb);
    printf("  10 steps bf16: largest loss difference %.2e (tolerance %.0e)\n", d, tol);
    assert_true(d <= tol);
    (void)train10_on(DDP_PRECISION_FP32, DDP_PRECISION_FP32, lf);
    int same = 0;
    for (int i = 0; i < 10; i++)
        same += lb[i] == lf[i];
    printf("  bf16 losses equal to fp32's in %d of 10 steps (must be < 10)\n", same);
    assert_true(same < 10);
}

/* 10 AdamW steps, GPU fp16 with GradScaler's loop against the CPU in fp32 (the CPU has no fp16):
 * within 1e-2 per loss, a fifth of bf16's 5e-2 against fp32 (fp16 rounds 8× finer; the rest is
 * the trajectory's sensitivity, as for bf16). An estimate, to be checked on the first GPU run.
 * With GradScaler's initial 65536 this model's gradients stay finite: a skipped step is printed
 * and counted, and at least 8 of the 10 must be taken. Also: not fp32's losses bit for bit. */
static void fp16_ten_steps(void **state)
{
    (void)state;
    double lh[10], lf[10];
    int skipped = 0;
    double d = train10_amp(DDP_PRECISION_FP32, DDP_PRECISION_FP16, true, lh, &skipped);
    printf("  10 steps fp16 (loss scaling): largest loss difference %.2e (tolerance 1e-2), %d "
           "skipped\n",
           d, skipped);
    assert_true(d <= 1e-2);
    assert_true(skipped <= 2);
    (void)train10_on(DDP_PRECISION_FP32, DDP_PRECISION_FP32, lf);
    int same = 0;
    for (int i = 0; i < 10; i++)
        same += lh[i] == lf[i];
    printf("  fp16 losses equal to fp32's in %d of 10 steps (must be < 10)\n", same);
    assert_true(same < 10);
}

/* ---- the fused (flash) attention against the batched one --------------------------------------
 * DDP_CUDA_ATTENTION (read when the model is built) picks the GPU GPT's attention. Two GPU models
 * of head size 32 (n_head 2: flash takes 32, 64, 128), the same seed, one per path: evaluation
 * logits, then 10 AdamW steps (the host optimizer) on the same batches, each loss compared.
 * With dropout p (every dropout of the model, the attention's included) the training steps draw
 * the same masks on both paths. */
static ddp_model *build_att(ddp_precision prec, const char *attention, float p)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.n_layer = L;
    s.n_head = 2;
    s.n_embd = C;
    s.block_size = TMAX;
    s.vocab_size = V;
    s.max_batch = B;
    s.seed = 1234;
    s.bias = true;
    s.dropout = p;
    s.device = DDP_DEVICE_CUDA;
    s.precision = prec;
    ddp_model *m = NULL;
    ddp_error err = {0};
    setenv("DDP_CUDA_ATTENTION", attention, 1);
    ddp_status st = ddp_model_build(&s, &m, &err);
    unsetenv("DDP_CUDA_ATTENTION");
    if (st != DDP_OK)
        fail_msg("build (cuda, attention %s): %s", attention, err.msg);
    return m;
}

static void flash_vs_batched_on(ddp_precision prec, float drop, double tol_logits, double tol_loss)
{
    const char *pn = ddp_precision_name(prec);
    printf("  %s, dropout %.1f\n", pn, (double)drop);
    ddp_model *m[2] = {build_att(prec, "batched", drop), build_att(prec, "flash", drop)};
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(0, TMAX - 3, tok, tgt); /* T not a multiple of the kernels' tiles */
    ddp_model_batch eb = {.n = B, .tokens = tok, .seq_len = TMAX - 3};
    assert_int_equal(ddp_model_forward(m[0], &eb, false, NULL), DDP_OK);
    assert_int_equal(ddp_model_forward(m[1], &eb, false, NULL), DDP_OK);
    size_t r1, c1, r2, c2;
    const float *l1 = ddp_model_logits(m[0], &r1, &c1), *l2 = ddp_model_logits(m[1], &r2, &c2);
    assert_int_equal(r1, r2);
    assert_int_equal(c1, c2);
    double d = rel(l2, l1, r1 * c1);
    printf("  %s logits flash vs batched: rel %.2e (tolerance %.0e; 0 would mean flash did not "
           "run)\n",
           pn, d, tol_logits);
    assert_true(d <= tol_logits);
    assert_true(d > 0);
    ddp_optim *o[2];
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    ddp_error err = {0};
    for (int k = 0; k < 2; k++) {
        size_t np;
        const ddp_model_param *p = ddp_model_params(m[k], &np);
        if (ddp_optim_create(&oo, p, np, &o[k], &err) != DDP_OK)
            fail_msg("%s", err.msg);
    }
    double worst = 0;
    for (uint64_t step = 1; step <= FLASH_STEPS; step++) {
        make_batch(200 + step, TMAX, tok, tgt);
        ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = TMAX};
        double loss[2];
        for (int k = 0; k < 2; k++) {
            ddp_model_out out;
            ddp_model_zero_grad(m[k]);
            assert_int_equal(ddp_model_forward(m[k], &b, true, &out), DDP_OK);
            assert_int_equal(ddp_model_backward(m[k], NULL, NULL), DDP_OK);
            ddp_optim_step(o[k], step, 1e-3f, 1.0f);
            loss[k] = out.loss;
        }
        printf("    step %2llu: batched %.6f flash %.6f\n", (unsigned long long)step, loss[0],
               loss[1]);
        if (!(fabs(loss[0] - loss[1]) <= worst))
            worst = fabs(loss[0] - loss[1]);
    }
    printf("  %s %d steps flash vs batched: largest loss difference %.2e (tolerance %.0e)\n", pn,
           FLASH_STEPS, worst, tol_loss);
    assert_true(worst <= tol_loss);
    for (int k = 0; k < 2; k++) {
        ddp_optim_destroy(o[k]);
        ddp_model_free(m[k]);
    }
}

/* fp32: both paths are fp32 (flash in FMA products): the GPU-vs-reference bounds,
 * logits 1e-3 (here 1e-4: the same weights, only the attention's summation order differs) and
 * losses 1e-4. bf16/fp16: the two paths round P differently (normalized or not) and D; within
 * the bf16 GPT's bounds against fp32 (logits 5e-2, losses 2e-2), fp16 a quarter of those. */
static void flash_vs_batched(void **state)
{
    (void)state;
    flash_vs_batched_on(DDP_PRECISION_FP32, 0.0f, 1e-4, 1e-4);
    flash_vs_batched_on(DDP_PRECISION_BF16, 0.0f, 5e-2, 2e-2);
    flash_vs_batched_on(DDP_PRECISION_FP16, 0.0f, 1.25e-2, 5e-3);
}

/* With dropout 0.2 the same bounds: both paths draw the CPU's masks (dropout.cuh), so only the
 * roundings differ as without dropout; a mask that differs (a wrong row or column) moves a whole
 * probability and the losses far more than 1e-4. */
static void flash_vs_batched_dropout(void **state)
{
    (void)state;
    flash_vs_batched_on(DDP_PRECISION_FP32, 0.2f, 1e-4, 1e-4);
    flash_vs_batched_on(DDP_PRECISION_BF16, 0.2f, 5e-2, 2e-2);
    flash_vs_batched_on(DDP_PRECISION_FP16, 0.2f, 1.25e-2, 5e-3);
}

/* ---- generation's key/value cache -------------------------------------------------------- */

/* A float32 GPT on the GPU switched to device-resident training with optimizer opts oo. */
static ddp_model *build_resident(const ddp_optim_opts *oo)
{
    ddp_model *m = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    ddp_error err = {0};
    if (ddp_model_resident(m, oo, &err) != DDP_OK)
        fail_msg("resident: %s", err.msg);
    return m;
}

/* The last position's logits (V) of one generation forward of tokens[0 … T) on m. */
static void gen_logits(ddp_model *m, const int32_t *tokens, int T, bool kv, float *out)
{
    ddp_model_batch b = {
        .n = 1, .tokens = tokens, .seq_len = T, .last_logits = true, .kv_cache = kv};
    if (ddp_model_forward(m, &b, false, NULL) != DDP_OK)
        fail_msg("forward of %d tokens (kv_cache %d): %s", T, kv, ddp_model_last_error(m));
    size_t rows, cols;
    const float *l = ddp_model_logits(m, &rows, &cols);
    assert_true(l && rows == 1 && cols == V);
    memcpy(out, l, sizeof(float) * V);
}

static size_t emu_count(const char *sym);

/* The emulated GPU's floating-point operations in products so far, or 0 on a GPU. */
static uint64_t gemm_flops(void)
{
    return emu_count("emu_rt_gemm_flops");
}

/* m with kv_cache against ref (a twin: same spec, same weights) without, the largest relative
 * difference so far in *worst; what names the case. */
static void gen_check(ddp_model *m, ddp_model *ref, const int32_t *tokens, int T, double tol,
                      double *worst, const char *what)
{
    float got[V], want[V];
    gen_logits(m, tokens, T, true, got);
    gen_logits(ref, tokens, T, false, want);
    double d = rel(got, want, V);
    if (d > *worst)
        *worst = d;
    if (!(d <= tol))
        fail_msg("%s (%d positions): logits rel %.2e > %.0e", what, T, d, tol);
}

/* One precision (and attention): the context grown a token at a time (each forward computes one
 * position on the device), then cases that reuse part of the cache (several new positions, a
 * changed token, the same context, a shorter one) and one that reuses none (slid by one); weights
 * changed on the host after a forward without kv_cache are seen (uploaded: the cache emptied);
 * and on a device-resident model, an optimizer step on the device between two kv_cache forwards
 * of the same context makes the device compute the whole context again (its own guard). */
static void kv_cache_on(ddp_precision prec, const char *attention, double tol)
{
    printf("  %s, %s attention\n", ddp_precision_name(prec), attention);
    ddp_model *m = build_att(prec, attention, 0.0f), *ref = build_att(prec, attention, 0.0f);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(7, TMAX, tok, tgt);
    double worst = 0;
    for (int t = 1; t < TMAX; t++)
        gen_check(m, ref, tok, t, tol, &worst, "a token at a time");
    /* the last token: its products did a fraction of the whole forward's work (the emulated
     * GPU counts it; 1 of 32 positions in the blocks, the head's one row either way) */
    float got[V], want[V];
    uint64_t f0 = gemm_flops();
    gen_logits(m, tok, TMAX, true, got);
    uint64_t f1 = gemm_flops();
    gen_logits(ref, tok, TMAX, false, want);
    uint64_t f2 = gemm_flops();
    assert_true(rel(got, want, V) <= tol);
    if (f2 > f1) {
        printf("    one new position: %.3g of the whole forward's product flops\n",
               (double)(f1 - f0) / (double)(f2 - f1));
        assert_true((f1 - f0) * 8 < f2 - f1);
    }
    tok[9] = (tok[9] + 1) % V;
    const struct {
        int first, len;
        const char *what;
    } ctx[] = {{0, 4, "a short context"},           {0, TMAX, "28 new positions"},
               {0, TMAX, "the same context"},       {0, 20, "a shorter context"},
               {1, TMAX - 1, "slid by a position"}, {1, TMAX - 1, "the same again"}};
    for (size_t k = 0; k < sizeof ctx / sizeof ctx[0]; k++)
        gen_check(m, ref, tok + ctx[k].first, ctx[k].len, tol, &worst, ctx[k].what);
    /* weights changed on the host after a forward without kv_cache: uploaded, nothing reused */
    size_t np;
    const ddp_model_param *pm = ddp_model_params(m, &np), *pr = ddp_model_params(ref, NULL);
    float probe[V];
    gen_logits(m, tok, TMAX - 1, false, probe);
    for (size_t i = 0; i < np; i++)
        if (!strncmp(pm[i].name, "transformer.h.0.attn.c_attn.", 28))
            for (size_t k = 0; k < pm[i].count; k++) {
                pm[i].data[k] += 0.25f;
                pr[i].data[k] += 0.25f;
            }
    gen_check(m, ref, tok, TMAX, tol, &worst, "weights changed on the host");
    printf("    logits: rel %.2e at most (tolerance %.0e)\n", worst, tol);
    ddp_model_free(m);
    ddp_model_free(ref);
}

static void kv_cache_fp32(void **state)
{
    (void)state;
    kv_cache_on(DDP_PRECISION_FP32, "batched", 1e-5);
    kv_cache_on(DDP_PRECISION_FP32, "flash", 1e-5);
}

/* 16 bits: the cached path's products have other shapes than the whole forward's (a real GPU's
 * cuBLAS may round their fp32 sums to 16 bits after another order), so a bound of a few roundings
 */
static void kv_cache_h(void **state)
{
    (void)state;
    kv_cache_on(DDP_PRECISION_BF16, "batched", 2e-2);
    kv_cache_on(DDP_PRECISION_FP16, "flash", 5e-3);
}

/* Device-resident: an optimizer step on the device between two kv_cache forwards of the same
 * context (the host's tokens match and nothing is uploaded) — the device knows its parameters
 * changed and computes the whole context: the logits are the stepped parameters', as the twin
 * (host-driven, given the stepped values) computes them without the cache. */
static void kv_cache_resident_step(void **state)
{
    (void)state;
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    ddp_model *m = build_resident(&oo), *ref = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    size_t np;
    const ddp_model_param *pm = ddp_model_params(m, &np), *pr = ddp_model_params(ref, NULL);
    /* the gradient of parameter i: its own values (device memory of the right size) */
    for (size_t i = 0; i < np; i++)
        assert_int_equal(ddp_model_bind_device_grad(m, i, ddp_model_device_param(m, i)), DDP_OK);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(8, TMAX, tok, tgt);
    double worst = 0;
    gen_check(m, ref, tok, TMAX - 1, 1e-5, &worst, "resident, before the step");
    uint64_t f0 = gemm_flops();
    gen_check(m, ref, tok, TMAX, 1e-5, &worst, "resident, one more token");
    uint64_t f1 = gemm_flops();
    for (size_t i = 0; i < np; i++)
        assert_int_equal(ddp_model_device_step(m, i, 1, 1e-2f, 1.0f), DDP_OK);
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_OK);
    for (size_t i = 0; i < np; i++)
        memcpy(pr[i].data, pm[i].data, sizeof(float) * pm[i].count);
    uint64_t f2 = gemm_flops();
    gen_check(m, ref, tok, TMAX, 1e-5, &worst, "resident, after a step on the device");
    /* each pair: m's kv_cache forward and the twin's whole one (W); the first reused the cache
     * (W/32 + W), the one after the step did not (W + W) */
    uint64_t f3 = gemm_flops();
    if (f3 > f2) {
        printf("  product flops: %.3g with the cache's reuse, %.3g after the step\n",
               (double)(f1 - f0), (double)(f3 - f2));
        assert_true((f1 - f0) * 3 < (f3 - f2) * 2);
    }
    printf("  logits: rel %.2e at most\n", worst);
    ddp_model_free(m);
    ddp_model_free(ref);
}

/* Device-resident with AdamW: sync_host and sync_device with an optimizer of another kind (SGD,
 * one state array) are refused and copy nothing (the host's changed value stays, the device's
 * too); then sync_host without an optimizer brings the device's values back. */
static void resident_sync_other_kind(void **state)
{
    (void)state;
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    ddp_model *m = build_resident(&oo);
    ddp_error err = {0};
    size_t np;
    const ddp_model_param *p = ddp_model_params(m, &np);
    ddp_optim_opts so = DDP_OPTIM_OPTS_INIT; /* SGD */
    ddp_optim *sgd = NULL;
    if (ddp_optim_create(&so, p, np, &sgd, &err) != DDP_OK)
        fail_msg("%s", err.msg);
    const float was = p[0].data[0];
    p[0].data[0] = was + 1.0f;
    assert_int_equal(ddp_model_sync_host(m, sgd), DDP_ERR_INVALID);
    printf("  sync_host, another kind: %s\n", ddp_model_last_error(m));
    assert_non_null(strstr(ddp_model_last_error(m), "another kind of optimizer"));
    assert_true(p[0].data[0] == was + 1.0f);
    assert_int_equal(ddp_model_sync_device(m, sgd), DDP_ERR_INVALID);
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_OK);
    assert_true(p[0].data[0] == was);
    ddp_optim_destroy(sgd);
    ddp_model_free(m);
}

/* A resident AdamW model whose device state is set from a host optimizer filled with a
 * pattern (parameter i, element k: state s = s + i + k / 1024), and that optimizer. */
static ddp_model *patterned(ddp_optim **opt, const ddp_model_param **p, size_t *np)
{
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    oo.weight_decay = 0.1f;
    ddp_model *m = build_resident(&oo);
    ddp_error err = {0};
    *p = ddp_model_params(m, np);
    if (ddp_optim_create(&oo, *p, *np, opt, &err) != DDP_OK)
        fail_msg("%s", err.msg);
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < *np; i++)
            for (size_t k = 0; k < (*p)[i].count; k++)
                ddp_optim_state(*opt, s)[i][k] = (float)s + (float)i + (float)k / 1024.0f;
    assert_int_equal(ddp_model_sync_device(m, *opt), DDP_OK);
    /* the gradient of parameter i: its own values (device memory of the right size) */
    for (size_t i = 0; i < *np; i++)
        assert_int_equal(ddp_model_bind_device_grad(m, i, ddp_model_device_param(m, i)), DDP_OK);
    return m;
}

/* ZeRO-1's memory split on the device (ddp_model_device_keep): two models with the same state,
 * one narrowed to a slice of each parameter (a third of it, some parameters none); the slices'
 * steps on both give the same parameters and kept state bit for bit; the narrowed model's syncs
 * move the kept elements only, and refuse a host optimizer narrowed otherwise; a step outside
 * the slice and a wider range are refused and change nothing. */
static void resident_keep(void **state)
{
    (void)state;
    ddp_optim *o1, *o2;
    const ddp_model_param *p1, *p2;
    size_t np;
    ddp_model *whole = patterned(&o1, &p1, &np), *m = patterned(&o2, &p2, &np);
    size_t *lo = calloc(np, sizeof *lo), *hi = calloc(np, sizeof *hi);
    assert_non_null(lo);
    assert_non_null(hi);
    for (size_t i = 0; i < np; i++) {
        lo[i] = i % 5 == 4 ? 0 : p2[i].count / 3;
        hi[i] = i % 5 == 4 ? 0 : lo[i] + p2[i].count / 3 + 1;
    }
    assert_int_equal(ddp_model_device_keep(m, lo, hi), DDP_OK);
    size_t a, z;
    ddp_model_device_kept(m, 1, &a, &z);
    assert_true(a == lo[1] && z == hi[1]);
    ddp_model_device_kept(whole, 1, &a, &z);
    assert_true(a == 0 && z == p1[1].count);
    /* a wider range: refused, nothing changed */
    hi[0]++;
    assert_int_equal(ddp_model_device_keep(m, lo, hi), DDP_ERR_INVALID);
    printf("  wider: %s\n", ddp_model_last_error(m));
    assert_non_null(strstr(ddp_model_last_error(m), "can only narrow"));
    hi[0]--;
    /* the syncs: the host optimizer must keep the same elements */
    assert_int_equal(ddp_model_sync_host(m, o2), DDP_ERR_INVALID);
    printf("  whole host optimizer: %s\n", ddp_model_last_error(m));
    assert_non_null(strstr(ddp_model_last_error(m), "narrow both alike"));
    assert_int_equal(ddp_optim_keep(o2, lo, hi), DDP_OK);
    /* a step outside the slice: refused */
    assert_int_equal(ddp_model_device_step_range(m, 0, 0, p2[0].count, 1, 1e-3f, 1.0f),
                     DDP_ERR_INVALID);
    printf("  outside: %s\n", ddp_model_last_error(m));
    for (uint64_t step = 1; step <= 2; step++)
        for (size_t i = 0; i < np; i++) {
            assert_int_equal(ddp_model_device_step_range(whole, i, lo[i], hi[i], step, 1e-3f, 0.5f),
                             DDP_OK);
            assert_int_equal(ddp_model_device_step_range(m, i, lo[i], hi[i], step, 1e-3f, 0.5f),
                             DDP_OK);
        }
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < np; i++)
            memset(ddp_optim_state(o2, s)[i], 0, sizeof(float) * (hi[i] - lo[i]));
    assert_int_equal(ddp_model_sync_host(whole, o1), DDP_OK);
    assert_int_equal(ddp_model_sync_host(m, o2), DDP_OK);
    for (size_t i = 0; i < np; i++) {
        assert_memory_equal(p1[i].data, p2[i].data, sizeof(float) * p1[i].count);
        for (int s = 0; s < 2; s++)
            if (hi[i] > lo[i])
                assert_memory_equal(ddp_optim_state(o1, s)[i] + lo[i], ddp_optim_state(o2, s)[i],
                                    sizeof(float) * (hi[i] - lo[i]));
    }
    /* the device state views: each parameter's kept elements, one after the other */
    float **dev = calloc(np, sizeof *dev);
    assert_non_null(dev);
    assert_int_equal(ddp_model_device_state(m, 1, dev), DDP_OK);
    for (size_t i = 0; i + 1 < np; i++)
        assert_true((size_t)(dev[i + 1] - dev[i]) == hi[i] - lo[i]);
    /* and back up: the kept elements only */
    ddp_optim_state(o2, 0)[1][0] = 42.0f;
    assert_int_equal(ddp_model_sync_device(m, o2), DDP_OK);
    ddp_optim_state(o2, 0)[1][0] = 0.0f;
    assert_int_equal(ddp_model_sync_host(m, o2), DDP_OK);
    assert_true(ddp_optim_state(o2, 0)[1][0] == 42.0f);
    printf("  %zu parameters narrowed to a third; 2 steps = the whole state's, bit for bit\n", np);
    free(dev);
    free(lo);
    free(hi);
    ddp_optim_destroy(o1);
    ddp_optim_destroy(o2);
    ddp_model_free(whole);
    ddp_model_free(m);
}

/* A count the emulated GPU keeps (tests/emu: the module DDP_GPU_MODULE names, loaded by libddp
 * already; sym: emu_rt_device_bytes, emu_rt_gemm_flops), or 0 on a GPU. */
static size_t emu_count(const char *sym)
{
    const char *mod = getenv("DDP_GPU_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    size_t (*f)(void) = h ? (size_t(*)(void))dlsym(h, sym) : NULL;
    size_t n = f ? f() : 0;
    if (h)
        dlclose(h);
    return n;
}

/* The emulated GPU's count of cudaMalloc'd bytes, or 0 on a GPU. */
static size_t device_bytes(void)
{
    return emu_count("emu_rt_device_bytes");
}

/* Bound to another's device arrays (the sharded step's reducer views), the GPT frees its own
 * flat parameter buffer (on the emulated GPU: its bytes are seen to go), reads the bound arrays,
 * and unbound makes the buffer again with their values. */
static void resident_bind_frees_params(void **state)
{
    (void)state;
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    ddp_error err = {0};
    size_t at0 = device_bytes();
    ddp_model *m = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    size_t built = device_bytes();
    ddp_model *src = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    if (ddp_model_resident(m, &oo, &err) != DDP_OK || ddp_model_resident(src, &oo, &err) != DDP_OK)
        fail_msg("resident: %s", err.msg);
    size_t np;
    const ddp_model_param *p = ddp_model_params(m, &np), *q = ddp_model_params(src, &np);
    size_t floats = 0;
    for (size_t i = 0; i < np; i++)
        floats += p[i].count;
    float **pd = calloc(np, sizeof *pd);
    assert_non_null(pd);
    for (size_t i = 0; i < np; i++)
        pd[i] = ddp_model_device_param(src, i);
    size_t before = device_bytes();
    assert_int_equal(ddp_model_bind_device_params(m, pd), DDP_OK);
    size_t bound = device_bytes();
    assert_true(ddp_model_device_param(m, 3) == pd[3]);
    /* the bound arrays change: the model reads them */
    const float want = q[0].data[5] += 1.0f;
    assert_int_equal(ddp_model_sync_device(src, NULL), DDP_OK);
    assert_int_equal(ddp_model_bind_device_params(m, NULL), DDP_OK);
    size_t unbound = device_bytes();
    assert_true(ddp_model_device_param(m, 3) != pd[3]);
    ddp_model_free(src); /* m holds its own values again */
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_OK);
    assert_true(p[0].data[5] == want);
    if (at0 || built) { /* the emulated GPU counts */
        printf(
            "  model %zu bytes on the device (%zu parameter bytes); bound: -%zu, unbound: +%zu\n",
            built - at0, floats * sizeof(float), before - bound, unbound - bound);
        assert_true(before - bound >= floats * sizeof(float));
        assert_true(unbound - bound == before - bound);
    }
    free(pd);
    ddp_model_free(m);
}

/* A rank whose shard is empty (more ranks than elements): every parameter's state narrowed to
 * nothing; its steps of nothing, its state views and its syncs (a host optimizer narrowed alike)
 * work, and a step of any element is refused. */
static void resident_keep_nothing(void **state)
{
    (void)state;
    ddp_optim *o;
    const ddp_model_param *p;
    size_t np;
    ddp_model *m = patterned(&o, &p, &np);
    size_t *none = calloc(np, sizeof *none);
    float **dev = calloc(np, sizeof *dev);
    assert_non_null(none);
    assert_non_null(dev);
    for (size_t i = 0; i < np; i++)
        none[i] = p[i].count; /* [count, count): the last rank's empty shard */
    assert_int_equal(ddp_model_device_keep(m, none, none), DDP_OK);
    assert_int_equal(ddp_optim_keep(o, none, none), DDP_OK);
    for (size_t i = 0; i < np; i++)
        assert_int_equal(ddp_model_device_step_range(m, i, none[i], none[i], 1, 1e-3f, 1.0f),
                         DDP_OK);
    assert_int_equal(ddp_model_device_step_range(m, 0, 0, 1, 1, 1e-3f, 1.0f), DDP_ERR_INVALID);
    for (int s = 0; s < 2; s++)
        assert_int_equal(ddp_model_device_state(m, s, dev), DDP_OK);
    assert_int_equal(ddp_model_sync_host(m, o), DDP_OK);
    assert_int_equal(ddp_model_sync_device(m, o), DDP_OK);
    size_t a, z;
    ddp_model_device_kept(m, 2, &a, &z);
    assert_true(a == p[2].count && z == p[2].count);
    free(dev);
    free(none);
    ddp_optim_destroy(o);
    ddp_model_free(m);
}

/* The emulated GPU's memory limit (tests/emu: emu_rt_set_mem_limit; 0: its 80 GiB again), or
 * NULL on a GPU, where the out-of-memory paths cannot be made to happen. */
static size_t (*mem_limit_fn(void))(size_t)
{
    const char *mod = getenv("DDP_GPU_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    size_t (*f)(size_t) = h ? (size_t(*)(size_t))dlsym(h, "emu_rt_set_mem_limit") : NULL;
    if (h)
        dlclose(h); /* libddp holds it open */
    return f;
}

/* Out of device memory where this session's lazy allocations and frees can meet it: each call
 * fails with DDP_ERR_NOMEM and a message that says what and what to do, changes nothing, and
 * works once memory is there again — optim_keep (the narrowed copy), the optimizer's state made
 * at its first step, the flat parameter buffer made again at unbind, the flat gradient buffer
 * made at the first host backward. Emulated GPU only (skipped on a GPU). */
static void resident_out_of_memory(void **state)
{
    (void)state;
    size_t (*limit)(size_t) = mem_limit_fn();
    if (!limit) {
        printf("  no emulated GPU: skipped\n");
        skip();
    }
    ddp_error err = {0};
    ddp_optim *o;
    const ddp_model_param *p;
    size_t np;
    /* 1. keep: its new buffers do not fit; the state and its ranges stay whole */
    ddp_model *m = patterned(&o, &p, &np);
    size_t *lo = calloc(np, sizeof *lo), *hi = calloc(np, sizeof *hi);
    assert_non_null(lo);
    assert_non_null(hi);
    for (size_t i = 0; i < np; i++) {
        lo[i] = p[i].count / 2;
        hi[i] = p[i].count;
    }
    limit(limit(0)); /* nothing more fits */
    assert_int_equal(ddp_model_device_keep(m, lo, hi), DDP_ERR_NOMEM);
    printf("  keep: %s\n", ddp_model_last_error(m));
    limit(0);
    size_t a, z;
    ddp_model_device_kept(m, 1, &a, &z);
    assert_true(a == 0 && z == p[1].count);
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < np; i++)
            memset(ddp_optim_state(o, s)[i], 0, sizeof(float) * p[i].count);
    assert_int_equal(ddp_model_sync_host(m, o), DDP_OK); /* the whole state, as it was */
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < np; i++)
            for (size_t k = 0; k < p[i].count; k += 7)
                assert_true(ddp_optim_state(o, s)[i][k] ==
                            (float)s + (float)i + (float)k / 1024.0f);
    assert_int_equal(ddp_model_device_step_range(m, 0, 0, p[0].count, 1, 1e-3f, 1.0f), DDP_OK);
    assert_int_equal(ddp_model_device_keep(m, lo, hi), DDP_OK); /* memory there: it narrows */
    ddp_model_device_kept(m, 1, &a, &z);
    assert_true(a == lo[1] && z == hi[1]);
    ddp_optim_destroy(o);

    /* 2. the optimizer's state, made at the first step: the step fails and says so; then works */
    ddp_model *f = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    if (ddp_model_resident(f, &oo, &err) != DDP_OK)
        fail_msg("resident: %s", err.msg);
    for (size_t i = 0; i < np; i++)
        assert_int_equal(ddp_model_bind_device_grad(f, i, ddp_model_device_param(m, i)), DDP_OK);
    limit(limit(0));
    assert_int_equal(ddp_model_device_step(f, 0, 1, 1e-3f, 1.0f), DDP_ERR_NOMEM);
    printf("  first step: %s\n", ddp_model_last_error(f));
    assert_non_null(strstr(ddp_model_last_error(f), "optimizer's state"));
    assert_non_null(strstr(ddp_model_last_error(f), "HINT"));
    limit(0);
    assert_int_equal(ddp_model_device_step(f, 0, 1, 1e-3f, 1.0f), DDP_OK);
    /* … and sharded already (keep before the first step): the HINT does not name
     * shard_optimizer true, which is on, but what is left to do (named it until 2026-11-25) */
    ddp_model *g = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    if (ddp_model_resident(g, &oo, &err) != DDP_OK)
        fail_msg("resident: %s", err.msg);
    for (size_t i = 0; i < np; i++)
        assert_int_equal(ddp_model_bind_device_grad(g, i, ddp_model_device_param(m, i)), DDP_OK);
    assert_int_equal(ddp_model_device_keep(g, lo, hi), DDP_OK);
    limit(limit(0));
    assert_int_equal(ddp_model_device_step_range(g, 0, lo[0], hi[0], 1, 1e-3f, 1.0f),
                     DDP_ERR_NOMEM);
    printf("  first step, sharded: %s\n", ddp_model_last_error(g));
    assert_non_null(strstr(ddp_model_last_error(g), "sharded already"));
    assert_null(strstr(ddp_model_last_error(g), "shard_optimizer true"));
    limit(0);
    assert_int_equal(ddp_model_device_step_range(g, 0, lo[0], hi[0], 1, 1e-3f, 1.0f), DDP_OK);
    ddp_model_free(g);

    /* 3. unbind: the model's own parameter buffer does not fit again; it stays bound (its
     * values where they were), and unbinds once memory is there */
    float **pd = calloc(np, sizeof *pd);
    assert_non_null(pd);
    for (size_t i = 0; i < np; i++)
        pd[i] = ddp_model_device_param(m, i);
    assert_int_equal(ddp_model_bind_device_params(f, pd), DDP_OK);
    limit(limit(0));
    assert_true(ddp_model_bind_device_params(f, NULL) != DDP_OK);
    printf("  unbind: %s\n", ddp_model_last_error(f));
    assert_non_null(strstr(ddp_model_last_error(f), "still bound"));
    limit(0);
    assert_true(ddp_model_device_param(f, 3) == pd[3]);
    const ddp_model_param *q = ddp_model_params(f, &np);
    assert_int_equal(ddp_model_sync_host(f, NULL), DDP_OK);
    assert_int_equal(ddp_model_sync_host(m, NULL), DDP_OK);
    assert_memory_equal(q[3].data, p[3].data, sizeof(float) * p[3].count);
    assert_int_equal(ddp_model_bind_device_params(f, NULL), DDP_OK);
    assert_true(ddp_model_device_param(f, 3) != pd[3]);
    ddp_model_free(m); /* f holds its own values again */
    assert_int_equal(ddp_model_sync_host(f, NULL), DDP_OK);
    ddp_model_free(f);

    /* 4. host-driven: the flat gradient buffer, made at the first backward */
    ddp_model *h = build(DDP_DEVICE_CUDA, DDP_PRECISION_FP32, true);
    int32_t tok[B * TMAX], tgt[B * TMAX];
    make_batch(0, TMAX, tok, tgt);
    ddp_model_batch b = {.n = B, .tokens = tok, .targets = tgt, .seq_len = TMAX};
    ddp_model_out out;
    assert_int_equal(ddp_model_forward(h, &b, true, &out), DDP_OK);
    limit(limit(0));
    assert_true(ddp_model_backward(h, NULL, NULL) != DDP_OK);
    printf("  first host backward: %s\n", ddp_model_last_error(h));
    limit(0);
    assert_int_equal(ddp_model_forward(h, &b, true, &out), DDP_OK);
    assert_int_equal(ddp_model_backward(h, NULL, NULL), DDP_OK);
    ddp_model_free(h);
    free(pd);
    free(lo);
    free(hi);
}

int main(void)
{
    ddp_test_gpus_or_skip("test_cuda_gpt");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(logits_match),
        cmocka_unit_test(loss_only_keeps_logits_on_device),
        cmocka_unit_test(grads_match),
        cmocka_unit_test(ten_steps_fp32),
        cmocka_unit_test(ten_steps_tf32),
        cmocka_unit_test(dropout_matches),
        cmocka_unit_test(bf16_logits_grads),
        cmocka_unit_test(bf16_ten_steps),
        cmocka_unit_test(fp16_logits_grads),
        cmocka_unit_test(fp16_ten_steps),
        cmocka_unit_test(flash_vs_batched),
        cmocka_unit_test(flash_vs_batched_dropout),
        cmocka_unit_test(kv_cache_fp32),
        cmocka_unit_test(kv_cache_h),
        cmocka_unit_test(kv_cache_resident_step),
        cmocka_unit_test(resident_sync_other_kind),
        cmocka_unit_test(resident_keep),
        cmocka_unit_test(resident_bind_frees_params),
        cmocka_unit_test(resident_keep_nothing),
        cmocka_unit_test(resident_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
