/*
 * tests/emu/scale_gpt.c — the CUDA GPT at the size of the first GPU run, GPT-2 124M (12 layers,
 * 12 heads, n_embd 768, vocabulary 50304, T 1024) at up to 64 sequences per rank, on the emulated
 * GPU module in its dry run (gpu_rt_emu.cpp, DDP_EMU_DRYRUN=1): every launch's geometry and
 * shared memory checked as the hardware would, every copy, memset and cuBLAS operand checked
 * against the cudaMalloc'd block it must lie in (the logits alone are 3.3 G elements at B 64, past
 * 32-bit indexing), of each kernel the first and the last block run (its largest indices), and
 * nothing computed. What the small emulated tests cannot reach: a 32-bit product in a launcher or
 * an index, a grid dimension past 65535, an operand past its buffer only at full size. Memory is
 * reserved, not committed: a few pages are touched.
 *
 * Each case: create (the whole device footprint), a training forward, the device-resident
 * backward (every parameter reported ready exactly once), AdamW on every parameter, an
 * evaluation forward of the last positions, and generation's forwards with the key/value cache.
 * Precisions bf16, fp16, fp32 and tf32; the batched and the flash attention; with and without
 * dropout.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"

enum { L = 12, NH = 12, C = 768, T = 1024, V = 50304 };

static int vocab = V; /* the case's vocabulary: V, or GPT-2's own 50257 (odd) */

/* gpt.c's parameter list (bias true): wte, wpe, per block ln_1, attn, proj, ln_2, fc, mproj
 * (weight, bias), ln_f. */
static size_t gpt2_counts(size_t *c)
{
    const size_t Cz = C;
    size_t k = 0;
    c[k++] = (size_t)vocab * Cz;
    c[k++] = (size_t)T * Cz;
    for (int l = 0; l < L; l++) {
        c[k++] = Cz, c[k++] = Cz;              /* ln_1 */
        c[k++] = 3 * Cz * Cz, c[k++] = 3 * Cz; /* attn */
        c[k++] = Cz * Cz, c[k++] = Cz;         /* proj */
        c[k++] = Cz, c[k++] = Cz;              /* ln_2 */
        c[k++] = 4 * Cz * Cz, c[k++] = 4 * Cz; /* fc */
        c[k++] = 4 * Cz * Cz, c[k++] = Cz;     /* mproj */
    }
    c[k++] = Cz, c[k++] = Cz; /* ln_f */
    return k;
}

/* gpu_rt_emu.cpp: the bytes cudaMalloc'd now. */
size_t emu_rt_device_bytes(void);

typedef struct ready_log {
    size_t n;
    int *seen; /* (n,) times each parameter was reported ready */
} ready_log;

static ddp_status on_ready(void *ctx, size_t i)
{
    ready_log *r = ctx;
    if (i >= r->n)
        return DDP_ERR_INVALID;
    r->seen[i]++;
    return DDP_OK;
}

static void ok(ddp_status st, const ddp_error *err, const char *what)
{
    if (st != DDP_OK)
        fail_msg("%s: %s", what, err->msg);
}

/* Model for B sequences of T; the steps on n sequences of t tokens (n ≤ B, t ≤ T: partial tiles
 * and a batch smaller than the buffers when below). */
static void run_case(ddp_precision prec, const char *attention, int B, int n, int t, float dropout)
{
    printf("  precision %d, attention %s, B %d (n %d, T %d), vocabulary %d, dropout %g\n",
           (int)prec, attention, B, n, t, vocab, (double)dropout);
    setenv("DDP_CUDA_ATTENTION", attention, 1);
    size_t counts[4 + 12 * L];
    size_t np = gpt2_counts(counts);
    ddp__cuda_gpt_cfg cfg = {.L = L,
                             .nh = NH,
                             .C = C,
                             .Tmax = T,
                             .V = vocab,
                             .B = B,
                             .bias = true,
                             .device = 0,
                             .precision = prec,
                             .dropout = dropout,
                             .seed = 7};
    ddp_error err = {0};
    ddp__cuda_gpt *g = NULL;
    ok(ddp__cuda_gpt_create(&cfg, counts, np, &g, &err), &err, "create");
    const double gib = (double)emu_rt_device_bytes() / (double)(1ull << 30);
    printf("    device memory after create: %.1f GiB\n", gib);
    float **params = calloc(np, sizeof *params);
    const size_t N = (size_t)n * t;
    int32_t *tok = malloc(sizeof(int32_t) * N);
    int32_t *tgt = malloc(sizeof(int32_t) * N);
    float *last = malloc(sizeof(float) * (size_t)n * vocab);
    ready_log rl = {np, calloc(np, sizeof(int))};
    assert_non_null(params);
    assert_non_null(tok);
    assert_non_null(tgt);
    assert_non_null(last);
    assert_non_null(rl.seen);
    for (size_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(i % (size_t)vocab);
        tgt[i] = (int32_t)((i * 7 + 1) % (size_t)vocab);
    }
    tgt[N - 1] = -1; /* an ignored row */
    void *stream = NULL;
    ok(ddp__cuda_gpt_dev_info(g, params, &stream, &err), &err, "dev_info");
    ok(ddp__cuda_gpt_optim_init(g, 2, &err), &err, "optim_init");
    double loss = 0;
    int count = 0;
    int64_t correct = 0;
    ok(ddp__cuda_gpt_forward(g, tok, tgt, n, t, true, false, 1.0f, 1, 0, &loss, &count, &correct,
                             NULL, &err),
       &err, "training forward");
    assert_int_equal(count, (int)N - 1);
    /* the gradients into the parameters' own arrays: device memory of the right sizes */
    ok(ddp__cuda_gpt_backward_dev(g, params, on_ready, &rl, &err), &err, "backward_dev");
    for (size_t i = 0; i < np; i++)
        if (rl.seen[i] != 1)
            fail_msg("parameter %zu reported ready %d times", i, rl.seen[i]);
    for (size_t i = 0; i < np; i++) {
        ddp__cuda_optim_args a = {.adamw = true,
                                  .i = i,
                                  .lo = 0,
                                  .hi = counts[i],
                                  .grad_dev = params[i],
                                  .step = 1,
                                  .lr = 1e-4f,
                                  .grad_scale = 1.0f,
                                  .beta1 = 0.9f,
                                  .beta2 = 0.95f,
                                  .eps = 1e-8f,
                                  .weight_decay = 0.1f};
        ok(ddp__cuda_gpt_optim_step(g, &a, &err), &err, "optim_step");
    }
    ok(ddp__cuda_gpt_forward(g, tok, NULL, n, t, false, true, 1.0f, 0, 0, &loss, &count, &correct,
                             last, &err),
       &err, "evaluation forward (last positions)");
    /* generation: one sequence of t tokens, then its key/value cache's largest steps (the last
     * position alone, then the last 64: the cached attention's whole score buffer) */
    ok(ddp__cuda_gpt_forward(g, tok, NULL, 1, t, false, true, 1.0f, 0, 0, &loss, &count, &correct,
                             last, &err),
       &err, "generation forward");
    ok(ddp__cuda_gpt_forward_cached(g, tok, t, t - 1, last, &err), &err, "cached forward (1 new)");
    ok(ddp__cuda_gpt_forward_cached(g, tok, t, t - 64, last, &err), &err,
       "cached forward (64 new)");
    ddp__cuda_gpt_free(g);
    free(rl.seen);
    free(last);
    free(tgt);
    free(tok);
    free(params);
}

static void bf16_batched_b64(void **state)
{
    (void)state;
    run_case(DDP_PRECISION_BF16, "batched", 64, 64, T, 0.0f);
}

static void bf16_flash_b64_dropout(void **state)
{
    (void)state;
    run_case(DDP_PRECISION_BF16, "flash", 64, 64, T, 0.1f);
}

static void fp16_batched_b32_dropout(void **state)
{
    (void)state;
    run_case(DDP_PRECISION_FP16, "batched", 32, 32, T, 0.1f);
}

static void fp32_batched_b16(void **state)
{
    (void)state;
    run_case(DDP_PRECISION_FP32, "batched", 16, 16, T, 0.0f);
}

static void tf32_flash_b64_dropout(void **state)
{
    (void)state;
    run_case(DDP_PRECISION_TF32, "flash", 64, 64, T, 0.1f);
}

/* GPT-2's own vocabulary (odd: the bf16 gradient's leading dimension 2V is no multiple of 8),
 * a batch and a length below the buffers' (partial attention tiles) */
static void bf16_odd_vocab_partial(void **state)
{
    (void)state;
    vocab = 50257;
    run_case(DDP_PRECISION_BF16, "flash", 16, 13, 1000, 0.0f);
    run_case(DDP_PRECISION_BF16, "batched", 16, 13, 1000, 0.1f);
    run_case(DDP_PRECISION_FP32, "batched", 8, 7, 999, 0.0f);
    vocab = V;
}

int main(void)
{
    const char *dry = getenv("DDP_EMU_DRYRUN");
    if (!dry || strcmp(dry, "1") != 0) {
        fprintf(stderr, "scale_gpt: runs only on the emulated module's dry run (DDP_EMU_DRYRUN=1, "
                        "DDP_GPU_MODULE the emulated module): it would allocate tens of GB\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_batched_b64),         cmocka_unit_test(bf16_flash_b64_dropout),
        cmocka_unit_test(fp16_batched_b32_dropout), cmocka_unit_test(fp32_batched_b16),
        cmocka_unit_test(tf32_flash_b64_dropout),   cmocka_unit_test(bf16_odd_vocab_partial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
