/*
 * gpu_bench — the GPU kernels' speed against the device's own limits, one line per figure:
 *   GEMMs (cuBLASLt through ddp__cuda_gemm; fp32, TF32, bf16 in with fp32 accumulation) in
 *   TFLOP/s and as a fraction of the datasheet dense peak (ddp_device_peak_flops) and of the
 *   best GEMM measured here (the "measured cuBLAS peak" of issue 12);
 *   elementwise kernels (residual add, GELU, AdamW) in GB/s, as a fraction of a device-to-device
 *   copy measured in the same run;
 *   causal attention at GPT-2 124M's shape (B 8, T 1024, 12 heads of 64), fp32 and bf16: the
 *   batched path (cuBLAS + softmax, (T, T) probabilities) against the fused flash kernel
 *   (flash.cu), forward and forward + backward in ms, flash's speed-up;
 *   a GPT training step (forward + backward on the GPU; the host optimizer) at GPT-2 124M's
 *   shape in tokens/s and MFU, bf16 with either attention (DDP_CUDA_ATTENTION).
 * Wall-clock timing around ddp__cuda_sync, best of several rounds after a warm-up.
 * Built only with DDP_CUDA; run by scripts/gpu-check.sh on a GPU machine. Prints `skipped` and
 * exits 77 without a GPU. NOT YET RUN: no figure from it exists yet.
 * usage: gpu_bench [--quick | --peaks | --gpt-bf16 [--quick]] [--once]   (--peaks: the table's
 * fp32, tf32, bf16 TFLOP/s; --gpt-bf16: the bf16 GPT step alone, for an A/B of an environment
 * switch such as DDP_CUDA_GELU_EPILOGUE=0; --once: everything once after its warm-up, one GPT
 * step after the first, figures not worth reading: that everything runs, as the emulated GPU's
 * dry run checks it, gpu_emu.gpu_bench_dry)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"
#include "kernels/cuda_kernels.h"
#include "kernels/kernels.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ddp__cuda_ctx *ctx;
static ddp_error err;
static bool once; /* --once */

static void check(ddp_status st)
{
    if (st != DDP_OK) {
        fprintf(stderr, "gpu_bench: %s\n", err.msg);
        exit(1);
    }
}

static void *dalloc(size_t bytes)
{
    void *p;
    check(ddp__cuda_malloc(&p, bytes, &err));
    check(ddp__cuda_memset0(ctx, p, bytes, &err));
    return p;
}

/* n floats of device memory with values in [-1, 1): the GEMMs' inputs. Zeros would flatter the
 * figures (tensor cores draw less power on zeros: ~13% faster bf16 products on an H200). */
static void fill_random(float *d, size_t n)
{
    enum { chunk = 1 << 20 };
    float *h = malloc(sizeof(float) * chunk);
    if (!h) {
        fprintf(stderr, "gpu_bench: out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < chunk; i++)
        h[i] = (float)(ddp_nn_rand_u64(11, 0, i) >> 40) * (2.0f / (1 << 24)) - 1.0f;
    for (size_t off = 0; off < n; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        check(ddp__cuda_to_device(ctx, d + off, h, sizeof(float) * k, &err));
    }
    free(h);
}

/* Seconds per call of what(arg): the best of 5 rounds of reps calls, after one warm-up call
 * (--once: one round of one call). */
typedef void (*op_fn)(void *arg);
static double time_op(op_fn what, void *arg, int reps)
{
    what(arg);
    check(ddp__cuda_sync(ctx, &err));
    double best = 1e30;
    if (once)
        reps = 1;
    for (int r = 0; r < (once ? 1 : 5); r++) {
        double t0 = now();
        for (int i = 0; i < reps; i++)
            what(arg);
        check(ddp__cuda_sync(ctx, &err));
        double t = (now() - t0) / reps;
        if (t < best)
            best = t;
    }
    return best;
}

struct gemm_arg {
    int M, N, K;
    void *A, *B, *C;
    ddp_dtype in;
    ddp_precision prec;
};

static void gemm_op(void *p)
{
    struct gemm_arg *a = p;
    check(ddp__cuda_gemm(ctx, false, true, a->M, a->N, a->K, 1.0f, a->A, a->K, a->B, a->K, 0.0f,
                         a->C, a->N, a->in, DDP_FLOAT32, NULL, a->prec, &err));
}

struct ew_arg {
    float *a, *b, *y, *m, *v;
    size_t n;
    int kind; /* 0 copy, 1 add, 2 gelu, 3 adamw */
};

struct att_arg {
    int B, T, C, nh;
    ddp_dtype dt; /* DDP_FLOAT32 or DDP_BFLOAT16 */
    bool flash, bwd;
    void *qkv, *out, *dout, *dqkv, *att, *scr, *fscr;
    float *lse;
};

/* One attention forward (and backward with bwd) on either path. */
static void att_op(void *p)
{
    struct att_arg *a = p;
    bool h = a->dt != DDP_FLOAT32;
    if (a->flash) {
        check(ddp__cuda_flash_forward(ctx, a->dt, a->qkv, a->B, a->T, a->C, a->nh, a->out, a->lse,
                                      NULL, &err));
        if (a->bwd)
            check(ddp__cuda_flash_backward(ctx, a->dt, a->dout, a->qkv, a->out, a->lse, a->B, a->T,
                                           a->C, a->nh, a->fscr, a->dqkv, NULL, &err));
    } else if (h) {
        check(ddp__cuda_attention_forward_h(ctx, a->dt, a->qkv, a->B, a->T, a->C, a->nh, a->att,
                                            a->scr, a->out, NULL, &err));
        if (a->bwd)
            check(ddp__cuda_attention_backward_h(ctx, a->dt, a->dout, a->qkv, a->att, a->B, a->T,
                                                 a->C, a->nh, a->scr, a->dqkv, NULL, &err));
    } else {
        check(ddp__cuda_attention_forward(ctx, a->qkv, a->B, a->T, a->C, a->nh, a->att, a->scr,
                                          a->out, DDP_PRECISION_FP32, NULL, &err));
        if (a->bwd)
            check(ddp__cuda_attention_backward(ctx, a->dout, a->qkv, a->att, a->B, a->T, a->C,
                                               a->nh, a->scr, a->dqkv, DDP_PRECISION_FP32, NULL,
                                               &err));
    }
}

/* Batched against flash at B, T 1024, 12 heads of 64, in fp32 and bf16. */
static void attention_bench(int B)
{
    const int T = 1024, C = 768, nh = 12;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    const size_t tt = (size_t)B * nh * T * T;
    size_t scr = ddp__cuda_attention_scratch(B, T, C, nh) * sizeof(float);
    if (ddp__cuda_attention_scratch_h(B, T, C, nh) > scr)
        scr = ddp__cuda_attention_scratch_h(B, T, C, nh);
    struct att_arg a = {.B = B, .T = T, .C = C, .nh = nh, .dt = DDP_FLOAT32};
    a.qkv = dalloc(nq * 4), a.out = dalloc(no * 4), a.dout = dalloc(no * 4);
    a.dqkv = dalloc(nq * 4), a.att = dalloc(tt * 4), a.scr = dalloc(scr);
    a.fscr = dalloc(ddp__cuda_flash_scratch(B, T, C, nh)), a.lse = dalloc((size_t)B * nh * T * 4);
    float *x = dalloc(nq * 4);
    fill_random(x, nq);
    for (int k = 0; k < 2; k++) {
        a.dt = k ? DDP_BFLOAT16 : DDP_FLOAT32;
        if (k) { /* the same values in bf16 */
            check(ddp__cuda_f32_to_h(ctx, DDP_BFLOAT16, x, nq, a.qkv, &err));
            check(ddp__cuda_f32_to_h(ctx, DDP_BFLOAT16, x, no, a.dout, &err));
        } else {
            check(ddp__cuda_copy(ctx, a.qkv, x, nq * 4, &err));
            check(ddp__cuda_copy(ctx, a.dout, x, no * 4, &err));
        }
        for (int bwd = 0; bwd < 2; bwd++) {
            double t[2];
            a.bwd = bwd;
            for (int f = 0; f < 2; f++) {
                a.flash = f;
                t[f] = time_op(att_op, &a, 5);
            }
            for (int f = 0; f < 2; f++) {
                char what[80];
                snprintf(what, sizeof what, "attention %s B%d T%d hs64 %s %s ms",
                         k ? "bf16" : "fp32", B, T, f ? "flash" : "batched",
                         bwd ? "fwd+bwd" : "fwd");
                printf("%-44s %12.3f %9.2fx batched's speed\n", what, t[f] * 1e3, t[0] / t[f]);
            }
        }
    }
    void *bufs[] = {a.qkv, a.out, a.dout, a.dqkv, a.att, a.scr, a.fscr, a.lse, x};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        ddp__cuda_free(bufs[i]);
}

static void ew_op(void *p)
{
    struct ew_arg *a = p;
    if (a->kind == 0)
        check(ddp__cuda_copy(ctx, a->y, a->a, a->n * 4, &err));
    else if (a->kind == 1)
        check(ddp__cuda_add(ctx, a->a, a->b, a->n, a->y, &err));
    else if (a->kind == 2)
        check(ddp__cuda_gelu_forward(ctx, a->a, a->n, a->y, &err));
    else
        check(ddp__cuda_adamw(ctx, a->y, a->a, a->m, a->v, a->n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
                              10, 1.0f, NULL, &err));
}

static void kernels(const ddp_device_choice *dcp, bool quick);
static void gpt_steps(const ddp_device_choice *dcp, bool quick, bool bf16_only);

int main(int argc, char **argv)
{
    bool quick = false, gpt_only = false;
    for (int i = 1; i < argc; i++) {
        quick = quick || !strcmp(argv[i], "--quick");
        gpt_only = gpt_only || !strcmp(argv[i], "--gpt-bf16");
        once = once || !strcmp(argv[i], "--once");
    }
    ddp_device_choice dc;
    if (ddp_device_select("cuda", 0, &dc, &err) != DDP_OK) {
        printf("gpu_bench skipped: %s\n", err.msg);
        return 77;
    }
    if (argc > 1 && !strcmp(argv[1], "--peaks")) { /* for the torch side: fp32 tf32 bf16 */
        printf("%g %g %g\n", ddp_device_peak_flops(dc.name, DDP_PRECISION_FP32) / 1e12,
               ddp_device_peak_flops(dc.name, DDP_PRECISION_TF32) / 1e12,
               ddp_device_peak_flops(dc.name, DDP_PRECISION_BF16) / 1e12);
        return 0;
    }
    printf("device: %s\n", dc.name);
    printf("%-44s %12s %10s\n", "what", "figure", "fraction");
    if (!gpt_only)
        kernels(&dc, quick);
    gpt_steps(&dc, quick, gpt_only);
    return 0;
}

/* GEMMs against the datasheet and the best measured; elementwise kernels against a copy. */
static void kernels(const ddp_device_choice *dcp, bool quick)
{
    const ddp_device_choice dc = *dcp;
    check(ddp__cuda_ctx_create(0, &ctx, &err));

    /* GEMMs: square 8192 (4096 quick) and GPT-2 124M's shapes at B·T = 8192 tokens */
    int sq = quick ? 4096 : 8192;
    int shapes[][3] = {
        {sq, sq, sq}, {8192, 2304, 768}, {8192, 3072, 768}, {8192, 768, 3072}, {8192, 50304, 768}};
    size_t maxe = (size_t)sq * sq;
    if ((size_t)8192 * 50304 > maxe)
        maxe = (size_t)8192 * 50304;
    float *A = dalloc(maxe * 4), *B = dalloc(maxe * 4), *Cm = dalloc(maxe * 4);
    fill_random(A, maxe);
    fill_random(B, maxe);
    uint16_t *A16 = dalloc(maxe * 2), *B16 = dalloc(maxe * 2); /* the same values in bf16 */
    check(ddp__cuda_f32_to_h(ctx, DDP_BFLOAT16, A, maxe, A16, &err));
    check(ddp__cuda_f32_to_h(ctx, DDP_BFLOAT16, B, maxe, B16, &err));
    struct {
        ddp_dtype in;
        ddp_precision prec;
        const char *name;
    } kinds[] = {{DDP_FLOAT32, DDP_PRECISION_FP32, "fp32"},
                 {DDP_FLOAT32, DDP_PRECISION_TF32, "tf32"},
                 {DDP_BFLOAT16, DDP_PRECISION_BF16, "bf16"}};
    for (int k = 0; k < 3; k++) {
        double peak = ddp_device_peak_flops(dc.name, kinds[k].prec), best = 0;
        double tf[5];
        for (int s = 0; s < 5; s++) {
            bool bf = kinds[k].in == DDP_BFLOAT16;
            struct gemm_arg a = {shapes[s][0],         shapes[s][1],         shapes[s][2],
                                 bf ? (void *)A16 : A, bf ? (void *)B16 : B, Cm,
                                 kinds[k].in,          kinds[k].prec};
            double t = time_op(gemm_op, &a, 10);
            tf[s] = 2.0 * a.M * a.N * a.K / t / 1e12;
            if (tf[s] > best)
                best = tf[s];
        }
        for (int s = 0; s < 5; s++) {
            char what[64];
            snprintf(what, sizeof what, "gemm %s %dx%dx%d TFLOP/s", kinds[k].name, shapes[s][0],
                     shapes[s][1], shapes[s][2]);
            printf("%-44s %12.1f %9.0f%% of datasheet, %3.0f%% of best\n", what, tf[s],
                   peak > 0 ? 100.0 * tf[s] * 1e12 / peak : 0.0, 100.0 * tf[s] / best);
        }
    }
    ddp__cuda_free(A);
    ddp__cuda_free(B);
    ddp__cuda_free(Cm);
    ddp__cuda_free(A16);
    ddp__cuda_free(B16);

    /* elementwise, 64 Mi floats (16 Mi quick) */
    size_t n = quick ? (16u << 20) : (64u << 20);
    struct ew_arg e = {
        dalloc(n * 4), dalloc(n * 4), dalloc(n * 4), dalloc(n * 4), dalloc(n * 4), n, 0};
    const char *names[] = {"device copy", "residual add", "gelu forward", "adamw (fp32 master)"};
    const double bytes[] = {8, 12, 8, 28}; /* read + written per element */
    double copy_bw = 0;
    for (int k = 0; k < 4; k++) {
        e.kind = k;
        double t = time_op(ew_op, &e, 20);
        double bw = bytes[k] * (double)n / t / 1e9;
        if (k == 0)
            copy_bw = bw;
        char what[64];
        snprintf(what, sizeof what, "%s GB/s", names[k]);
        printf("%-44s %12.0f %9.0f%% of the copy\n", what, bw, 100.0 * bw / copy_bw);
    }
    ddp__cuda_free(e.a), ddp__cuda_free(e.b), ddp__cuda_free(e.y), ddp__cuda_free(e.m);
    ddp__cuda_free(e.v);
    attention_bench(quick ? 2 : 8);
    ddp__cuda_ctx_destroy(ctx);
}

/* A GPT step through the model (forward + backward on the GPU, host AdamW), in fp32, tf32 and
 * bf16 (issue 12's speed figure is bf16's), bf16 again with the flash attention
 * (DDP_CUDA_ATTENTION=flash); or bf16 alone (batched attention). */
static void gpt_steps(const ddp_device_choice *dcp, bool quick, bool bf16_only)
{
    const ddp_device_choice dc = *dcp;
    const ddp_precision step_prec[] = {DDP_PRECISION_FP32, DDP_PRECISION_TF32, DDP_PRECISION_BF16,
                                       DDP_PRECISION_BF16};
    for (int p = bf16_only ? 2 : 0; p < (bf16_only ? 3 : 4); p++) {
        const bool flash = p == 3;
        ddp_model_spec s = DDP_MODEL_SPEC_INIT;
        s.type = "gpt";
        s.n_layer = quick ? 4 : 12;
        s.n_head = 12;
        s.n_embd = 768;
        s.block_size = 1024;
        s.vocab_size = 50304;
        s.max_batch = quick ? 2 : 8;
        s.device = DDP_DEVICE_CUDA;
        s.precision = step_prec[p];
        ddp_model *m;
        setenv("DDP_CUDA_ATTENTION", flash ? "flash" : "batched", 1);
        check(ddp_model_build(&s, &m, &err));
        unsetenv("DDP_CUDA_ATTENTION");
        size_t np;
        const ddp_model_param *pl = ddp_model_params(m, &np);
        ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
        oo.kind = DDP_OPTIM_ADAMW;
        ddp_optim *o;
        check(ddp_optim_create(&oo, pl, np, &o, &err));
        size_t N = (size_t)s.max_batch * s.block_size;
        int32_t *tok = malloc(N * 4), *tgt = malloc(N * 4);
        for (size_t i = 0; i < N; i++) {
            tok[i] = (int32_t)(ddp_nn_rand_u64(5, 0, i) % 50257);
            tgt[i] = (int32_t)(ddp_nn_rand_u64(5, 1, i) % 50257);
        }
        ddp_model_batch b = {
            .n = s.max_batch, .tokens = tok, .targets = tgt, .seq_len = s.block_size};
        double fwdbwd = 1e30, whole = 1e30;
        for (int it = 0; it < (once ? 2 : 4); it++) { /* the first is not timed */
            ddp_model_out out;
            double t0 = now();
            ddp_model_zero_grad(m);
            if (ddp_model_forward(m, &b, true, &out) != DDP_OK ||
                ddp_model_backward(m, NULL, NULL) != DDP_OK) {
                fprintf(stderr, "gpu_bench: %s\n", ddp_model_last_error(m));
                exit(1);
            }
            double t1 = now();
            ddp_optim_step(o, (uint64_t)it + 1, 1e-4f, 1.0f);
            double t2 = now();
            if (it > 0 && t1 - t0 < fwdbwd)
                fwdbwd = t1 - t0;
            if (it > 0 && t2 - t0 < whole)
                whole = t2 - t0;
        }
        double fl = ddp_model_flops_per_sample(m, s.block_size) * s.max_batch;
        double peak = ddp_device_peak_flops(dc.name, s.precision);
        char what[80];
        snprintf(what, sizeof what, "gpt L%d B%d T1024 %s%s step tokens/s", s.n_layer, s.max_batch,
                 ddp_precision_name(s.precision), flash ? " flash" : "");
        printf("%-44s %12.0f %9.1f%% mfu (fwd+bwd alone %.0f tokens/s, %.1f%%)\n", what,
               (double)N / whole, peak > 0 ? 100.0 * fl / whole / peak : 0.0, (double)N / fwdbwd,
               peak > 0 ? 100.0 * fl / fwdbwd / peak : 0.0);
        free(tok);
        free(tgt);
        ddp_optim_destroy(o);
        ddp_model_free(m);
    }
}
