/*
 * test_cuda_kernels.c — every kernel of kernels/cuda_kernels.h against its CPU reference (the
 * layer functions of ddp/nn.h, ddp__sgemm, util/half.h) on random inputs, with the tolerance
 * each comparison states: rel = max |gpu − cpu| / max |cpu| over the output.
 *
 * Skips (exit 77) without a GPU; fails under DDP_REQUIRE_GPU=1 (gpu_skip.h). Built only with
 * DDP_CUDA. UNVERIFIED until run on a GPU: written and compiled in a session without one.
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

#include "ddp/nn.h"
#include "gpu_skip.h"
#include "kernels/cuda_kernels.h"
#include "kernels/kernels.h"

static ddp__cuda_ctx *ctx;

/* ---- helpers ----------------------------------------------------------------------------------
 */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float urand(void) /* in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float *host_rand(size_t n, float scale)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = urand() * scale;
    return p;
}

static void *dev_from(const void *host, size_t bytes)
{
    void *d = NULL;
    ddp_error err = {0};
    if (ddp__cuda_malloc(&d, bytes, &err) != DDP_OK ||
        (host && ddp__cuda_to_device(ctx, d, host, bytes, &err) != DDP_OK))
        fail_msg("%s", err.msg);
    if (!host && ddp__cuda_memset0(ctx, d, bytes, &err) != DDP_OK)
        fail_msg("%s", err.msg);
    return d;
}

static float *fetch(const void *dev, size_t n)
{
    float *h = malloc(n * sizeof *h);
    ddp_error err = {0};
    assert_non_null(h);
    if (ddp__cuda_to_host(ctx, h, dev, n * sizeof *h, &err) != DDP_OK)
        fail_msg("%s", err.msg);
    return h;
}

static void ok(ddp_status st, const ddp_error *err)
{
    if (st != DDP_OK)
        fail_msg("%s", err->msg);
}

/* Fails when max |got − want| / max |want| > tol; prints the figure either way. */
static void expect_close(const char *what, const float *got_dev, const float *want, size_t n,
                         double tol)
{
    float *got = fetch(got_dev, n);
    double md = 0, mw = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= md)) /* NaN counts */
            md = d;
        if (fabs(want[i]) > mw)
            mw = fabs(want[i]);
    }
    double rel = md / (mw > 0 ? mw : 1e-30);
    printf("  %-34s rel %.2e (tolerance %.0e, %zu values)\n", what, rel, tol, n);
    free(got);
    if (!(rel <= tol))
        fail_msg("%s: relative difference %.3e > %.1e", what, rel, tol);
}

/* ---- 16-bit helpers: bf16 and fp16 device buffers are uint16_t bit patterns (util/half.h's
 * rounding); ht names the format (DDP_BFLOAT16 or DDP_FLOAT16) ----------------------------------
 */

static ddp_dtype bf16_dt = DDP_BFLOAT16, fp16_dt = DDP_FLOAT16; /* the 16-bit tests' prestates */

static const char *hname(ddp_dtype ht)
{
    return ht == DDP_FLOAT16 ? "fp16" : "bf16";
}

/* x rounded to ht and widened back, in place: the values a 16-bit buffer holds. */
static void round_h(ddp_dtype ht, float *x, size_t n)
{
    uint16_t *t = malloc(sizeof(uint16_t) * (n ? n : 1));
    assert_non_null(t);
    ddp__from_f32(t, x, n, ht);
    ddp__to_f32(x, t, n, ht);
    free(t);
}

static float round1(ddp_dtype ht, float v)
{
    round_h(ht, &v, 1);
    return v;
}

/* A device 16-bit buffer holding host (rounded to ht); host NULL: zeros. */
static uint16_t *dev_h(ddp_dtype ht, const float *host, size_t n)
{
    uint16_t *t = malloc(sizeof(uint16_t) * (n ? n : 1));
    assert_non_null(t);
    if (host)
        ddp__from_f32(t, host, n, ht);
    else
        memset(t, 0, sizeof(uint16_t) * n);
    uint16_t *d = dev_from(t, sizeof(uint16_t) * n);
    free(t);
    return d;
}

/* rows × cols 16-bit values of format ht from the device (leading dimension ld), widened. */
static float *fetch_h_ld(ddp_dtype ht, const void *dev, size_t rows, size_t cols, size_t ld)
{
    uint16_t *t = malloc(sizeof(uint16_t) * rows * ld);
    float *h = malloc(sizeof(float) * rows * cols);
    ddp_error err = {0};
    assert_non_null(t);
    assert_non_null(h);
    if (ddp__cuda_to_host(ctx, t, dev, sizeof(uint16_t) * rows * ld, &err) != DDP_OK)
        fail_msg("%s", err.msg);
    for (size_t r = 0; r < rows; r++)
        ddp__to_f32(h + r * cols, t + r * ld, cols, ht);
    free(t);
    return h;
}

/* expect_close on host values (freed by the caller). */
static void expect_close_host(const char *what, const float *got, const float *want, size_t n,
                              double tol)
{
    double md = 0, mw = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= md))
            md = d;
        if (fabs(want[i]) > mw)
            mw = fabs(want[i]);
    }
    double rel = md / (mw > 0 ? mw : 1e-30);
    printf("  %-34s rel %.2e (tolerance %.0e, %zu values)\n", what, rel, tol, n);
    if (!(rel <= tol))
        fail_msg("%s: relative difference %.3e > %.1e", what, rel, tol);
}

/* A 16-bit device result against an fp32 reference computed from the same (rounded) inputs. The
 * device rounds its fp32 result once; the reference is rounded the same way, so the two differ
 * only where a different fp32 summation order crosses a rounding boundary: one unit in the last
 * place of that element. H_ULP2 (about two units of the largest element: 2⁻⁷ for bf16's 8
 * significant bits, 2⁻¹⁰ for fp16's 11) is the tolerance of every such comparison below. */
static double H_ULP2(ddp_dtype ht)
{
    return ht == DDP_FLOAT16 ? 9.9e-4 : 7.9e-3;
}

static void expect_close_h(ddp_dtype ht, const char *what, const uint16_t *got_dev, float *want,
                           size_t n)
{
    float *got = fetch_h_ld(ht, got_dev, 1, n, n);
    char label[96];
    snprintf(label, sizeof label, "%s (%s)", what, hname(ht));
    round_h(ht, want, n);
    expect_close_host(label, got, want, n, H_ULP2(ht));
    free(got);
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

/* shift > 0: every operand (A, B, C, bias) starts `shift` elements into its allocation, so the
 * pointers are only element-aligned, as views into the GPT's flat buffers can be. */
static void gemm_case_at(bool ta, bool tb, int M, int N, int K, bool bias, float beta,
                         ddp_precision prec, double tol, int shift)
{
    ddp_error err = {0};
    /* precision bf16 or fp16: the inputs in that format (fp32 otherwise) */
    const ddp_dtype hin = prec == DDP_PRECISION_BF16   ? DDP_BFLOAT16
                          : prec == DDP_PRECISION_FP16 ? DDP_FLOAT16
                                                       : DDP_FLOAT32;
    const bool bf16_in = hin != DDP_FLOAT32; /* either 16-bit format */
    float *A = host_rand((size_t)M * K, 1), *B = host_rand((size_t)K * N, 1);
    float *C = host_rand((size_t)M * N, 1), *b = host_rand((size_t)N, 1);
    if (bf16_in) { /* the reference multiplies the same rounded inputs */
        round_h(hin, A, (size_t)M * K);
        round_h(hin, B, (size_t)K * N);
    }
    int lda = ta ? M : K, ldb = tb ? K : N;
    size_t ein = bf16_in ? sizeof(uint16_t) : sizeof(float), pad = (size_t)shift * ein;
    size_t fpad = (size_t)shift * sizeof(float);
    char *dA = dev_from(NULL, pad + ein * (size_t)M * K),
         *dB = dev_from(NULL, pad + ein * (size_t)K * N);
    char *dC = dev_from(NULL, fpad + sizeof(float) * (size_t)M * N);
    char *db = dev_from(NULL, fpad + sizeof(float) * (size_t)N);
    if (bf16_in) {
        uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)M * K);
        uint16_t *b16 = malloc(sizeof(uint16_t) * (size_t)K * N);
        ddp__from_f32(a16, A, (size_t)M * K, hin);
        ddp__from_f32(b16, B, (size_t)K * N, hin);
        ok(ddp__cuda_to_device(ctx, dA + pad, a16, ein * (size_t)M * K, &err), &err);
        ok(ddp__cuda_to_device(ctx, dB + pad, b16, ein * (size_t)K * N, &err), &err);
        free(a16);
        free(b16);
    } else {
        ok(ddp__cuda_to_device(ctx, dA + pad, A, ein * (size_t)M * K, &err), &err);
        ok(ddp__cuda_to_device(ctx, dB + pad, B, ein * (size_t)K * N, &err), &err);
    }
    ok(ddp__cuda_to_device(ctx, dC + fpad, C, sizeof(float) * (size_t)M * N, &err), &err);
    ok(ddp__cuda_to_device(ctx, db + fpad, b, sizeof(float) * (size_t)N, &err), &err);
    ok(ddp__cuda_gemm(ctx, ta, tb, M, N, K, 0.5f, dA + pad, lda, dB + pad, ldb, beta, dC + fpad, N,
                      hin, DDP_FLOAT32, bias ? (const float *)(db + fpad) : NULL, prec, &err),
       &err);
    ddp__sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, C, N);
    if (bias)
        for (int r = 0; r < M; r++)
            for (int c = 0; c < N; c++)
                C[(size_t)r * N + c] += b[c];
    char what[96];
    snprintf(what, sizeof what, "gemm %c%c %dx%dx%d %s%s%s%s", ta ? 'T' : 'N', tb ? 'T' : 'N', M, N,
             K, ddp_precision_name(prec), bias ? " +bias" : "", beta != 0 ? " beta" : "",
             shift ? " unaligned" : "");
    expect_close(what, (const float *)(dC + fpad), C, (size_t)M * N, tol);
    ddp__cuda_free(dA);
    ddp__cuda_free(dB);
    ddp__cuda_free(dC);
    ddp__cuda_free(db);
    free(A);
    free(B);
    free(C);
    free(b);
}

static void gemm_case(bool ta, bool tb, int M, int N, int K, bool bias, float beta,
                      ddp_precision prec, double tol)
{
    gemm_case_at(ta, tb, M, N, K, bias, beta, prec, tol, 0);
}

static void gemm(void **state)
{
    (void)state;
    for (int t = 0; t < 4; t++) {
        gemm_case(t & 1, t & 2, 67, 45, 129, false, 0.0f, DDP_PRECISION_FP32, 1e-5);
        gemm_case(t & 1, t & 2, 64, 96, 32, false, 1.0f, DDP_PRECISION_FP32, 1e-5);
    }
    gemm_case(false, true, 128, 192, 64, true, 0.0f, DDP_PRECISION_FP32, 1e-5);
    /* TF32: 10-bit mantissas in, fp32 accumulation: ~1e-3 relative per product */
    gemm_case(false, true, 128, 192, 256, true, 0.0f, DDP_PRECISION_TF32, 1e-2);
    /* bf16 and fp16 inputs (their products exact in fp32), fp32 accumulation: only the summation
     * order differs */
    for (int p = DDP_PRECISION_BF16; p <= DDP_PRECISION_FP16; p++) {
        gemm_case(false, true, 128, 192, 256, false, 0.0f, (ddp_precision)p, 1e-5);
        gemm_case(true, false, 64, 128, 96, true, 0.0f, (ddp_precision)p, 1e-5);
        /* 2 bytes past an allocation (4 for the fp32 C and bias) */
        gemm_case_at(false, true, 64, 96, 32, true, 0.0f, (ddp_precision)p, 1e-5, 1);
    }
    /* pointers 4 bytes past an allocation: the alignment preferences and the bias pass that does
     * not need the epilogue's alignment */
    gemm_case_at(false, true, 96, 80, 64, true, 0.0f, DDP_PRECISION_FP32, 1e-5, 1);
    gemm_case_at(true, false, 67, 45, 129, true, 1.0f, DDP_PRECISION_TF32, 1e-2, 1);
    /* 16 bytes past: aligned enough for the bias epilogue, not for 256-byte kernels */
    gemm_case_at(false, false, 128, 192, 64, true, 0.0f, DDP_PRECISION_TF32, 1e-2, 4);
}

/* ---- layers ---------------------------------------------------------------------------------- */

static void linear(void **state)
{
    (void)state;
    ddp_error err = {0};
    const int B = 37, in = 48, out = 80;
    float *x = host_rand((size_t)B * in, 1), *W = host_rand((size_t)out * in, 0.2f);
    float *b = host_rand(out, 0.1f), *dy = host_rand((size_t)B * out, 1);
    float *y = malloc(sizeof(float) * B * out), *dx = malloc(sizeof(float) * B * in);
    float *dW = host_rand((size_t)out * in, 1), *db = host_rand(out, 1);
    float *dx_ = dev_from(NULL, sizeof(float) * B * in),
          *y_ = dev_from(NULL, sizeof(float) * B * out);
    float *x_ = dev_from(x, sizeof(float) * B * in), *W_ = dev_from(W, sizeof(float) * out * in);
    float *b_ = dev_from(b, sizeof(float) * out), *dy_ = dev_from(dy, sizeof(float) * B * out);
    float *dW_ = dev_from(dW, sizeof(float) * out * in), *db_ = dev_from(db, sizeof(float) * out);
    ok(ddp__cuda_linear_forward(ctx, x_, W_, b_, B, in, out, y_, DDP_PRECISION_FP32, &err), &err);
    ddp_nn_linear_forward(x, W, b, B, in, out, y);
    expect_close("linear forward", y_, y, (size_t)B * out, 1e-5);
    ok(ddp__cuda_linear_backward(ctx, dy_, x_, W_, B, in, out, dx_, dW_, db_, DDP_PRECISION_FP32,
                                 &err),
       &err);
    ddp_nn_linear_backward(dy, x, W, B, in, out, dx, dW, db);
    expect_close("linear backward dx", dx_, dx, (size_t)B * in, 1e-5);
    expect_close("linear backward dW (+=)", dW_, dW, (size_t)out * in, 1e-5);
    expect_close("linear backward db (+=)", db_, db, out, 1e-5);
    /* the MLP's GELU fused into the products (cuBLASLt's GELU epilogues where offered, else the
     * product and the GELU kernel: DDP_CUDA_GELU_EPILOGUE=0 runs this test that way too):
     * pre = x·Wᵀ + b and y = GELU(pre); then back through a product into pre's GELU:
     * dpre = (dz·W2) ⊙ GELU'(pre), with W2 (out2, out) and dz (B, out2) */
    {
        const int out2 = 24;
        float *pre = malloc(sizeof(float) * B * out), *g = malloc(sizeof(float) * B * out);
        float *W2 = host_rand((size_t)out2 * out, 0.2f), *dz = host_rand((size_t)B * out2, 1);
        float *dg = malloc(sizeof(float) * B * out);
        float *pre_ = dev_from(NULL, sizeof(float) * B * out),
              *g_ = dev_from(NULL, sizeof(float) * B * out);
        float *W2_ = dev_from(W2, sizeof(float) * out2 * out),
              *dz_ = dev_from(dz, sizeof(float) * B * out2);
        ok(ddp__cuda_linear_gelu_forward(ctx, DDP_FLOAT32, x_, W_, b_, B, in, out, pre_, g_,
                                         DDP_PRECISION_FP32, &err),
           &err);
        ddp_nn_linear_forward(x, W, b, B, in, out, pre);
        ddp_nn_gelu_tanh_forward(pre, (size_t)B * out, g);
        expect_close("linear+gelu: the GELU's input", pre_, pre, (size_t)B * out, 1e-5);
        expect_close("linear+gelu: GELU(x·Wᵀ + b)", g_, g, (size_t)B * out, 1e-5);
        ok(ddp__cuda_linear_dgelu_backward(ctx, DDP_FLOAT32, dz_, W2_, pre_, B, out, out2, g_,
                                           DDP_PRECISION_FP32, &err),
           &err);
        /* dg = dz · W2 (B, out), then GELU's backward at pre */
        ddp_nn_linear_backward(dz, pre, W2, B, out, out2, dg, NULL, NULL);
        ddp_nn_gelu_tanh_backward(dg, pre, (size_t)B * out, dg);
        expect_close("linear+dgelu: (dz·W2) ⊙ GELU'(pre)", g_, dg, (size_t)B * out, 1e-5);
        free(pre), free(g), free(W2), free(dz), free(dg);
        ddp__cuda_free(pre_), ddp__cuda_free(g_), ddp__cuda_free(W2_), ddp__cuda_free(dz_);
    }
    void *bufs[] = {x, W, b, dy, y, dx, dW, db};
    for (size_t i = 0; i < 8; i++)
        free(bufs[i]);
    void *dbufs[] = {dx_, y_, x_, W_, b_, dy_, dW_, db_};
    for (size_t i = 0; i < 8; i++)
        ddp__cuda_free(dbufs[i]);
}

static void embedding(void **state)
{
    (void)state;
    ddp_error err = {0};
    const int B = 3, T = 17, C = 40, V = 29, NP = 20;
    int32_t idx[3 * 17];
    for (int i = 0; i < B * T; i++)
        idx[i] = (i * 7 + 3) % V; /* repeats, so the atomic adds collide */
    float *wte = host_rand((size_t)V * C, 1), *wpe = host_rand((size_t)NP * C, 1);
    float *dx = host_rand((size_t)B * T * C, 1), *x = malloc(sizeof(float) * B * T * C);
    float *dwte = host_rand((size_t)V * C, 1), *dwpe = host_rand((size_t)NP * C, 1);
    int32_t *idx_ = dev_from(idx, sizeof idx);
    float *wte_ = dev_from(wte, sizeof(float) * V * C),
          *wpe_ = dev_from(wpe, sizeof(float) * NP * C);
    float *x_ = dev_from(NULL, sizeof(float) * B * T * C),
          *dx_ = dev_from(dx, sizeof(float) * B * T * C);
    float *dwte_ = dev_from(dwte, sizeof(float) * V * C);
    float *dwpe_ = dev_from(dwpe, sizeof(float) * NP * C);
    ok(ddp__cuda_embedding_forward(ctx, idx_, wte_, wpe_, B, T, C, x_, &err), &err);
    ok(ddp_nn_embedding_forward(idx, wte, wpe, B, T, C, V, NP, x, &err), &err);
    expect_close("embedding forward", x_, x, (size_t)B * T * C, 0);
    ok(ddp__cuda_embedding_backward(ctx, dx_, idx_, B, T, C, dwte_, dwpe_, &err), &err);
    ddp_nn_embedding_backward(dx, idx, B, T, C, dwte, dwpe);
    expect_close("embedding backward dwte (+=)", dwte_, dwte, (size_t)V * C, 1e-6);
    expect_close("embedding backward dwpe (+=)", dwpe_, dwpe, (size_t)NP * C, 1e-6);
    free(wte), free(wpe), free(dx), free(x), free(dwte), free(dwpe);
    ddp__cuda_free(idx_), ddp__cuda_free(wte_), ddp__cuda_free(wpe_), ddp__cuda_free(x_);
    ddp__cuda_free(dx_), ddp__cuda_free(dwte_), ddp__cuda_free(dwpe_);
}

static void layernorm(void **state)
{
    (void)state;
    ddp_error err = {0};
    const int N = 300, C = 96;
    float *x = host_rand((size_t)N * C, 2), *w = host_rand(C, 1), *b = host_rand(C, 1);
    for (size_t i = 0; i < (size_t)N * C; i++)
        x[i] += 3.0f; /* an offset, as residual streams have */
    float *dy = host_rand((size_t)N * C, 1), *y = malloc(sizeof(float) * N * C);
    float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
    float *dx = malloc(sizeof(float) * N * C), *dw = host_rand(C, 1), *db = host_rand(C, 1);
    float *x_ = dev_from(x, sizeof(float) * N * C), *w_ = dev_from(w, sizeof(float) * C);
    float *b_ = dev_from(b, sizeof(float) * C), *dy_ = dev_from(dy, sizeof(float) * N * C);
    float *y_ = dev_from(NULL, sizeof(float) * N * C), *m_ = dev_from(NULL, sizeof(float) * N);
    float *r_ = dev_from(NULL, sizeof(float) * N), *dx_ = dev_from(NULL, sizeof(float) * N * C);
    float *dw_ = dev_from(dw, sizeof(float) * C), *db_ = dev_from(db, sizeof(float) * C);
    ok(ddp__cuda_layernorm_forward(ctx, x_, w_, b_, N, C, 1e-5f, y_, m_, r_, &err), &err);
    ddp_nn_layernorm_forward(x, w, b, N, C, 1e-5f, y, mean, rstd);
    expect_close("layernorm forward", y_, y, (size_t)N * C, 1e-5);
    expect_close("layernorm mean", m_, mean, N, 1e-6);
    expect_close("layernorm rstd", r_, rstd, N, 1e-5);
    ok(ddp__cuda_layernorm_backward(ctx, dy_, x_, w_, m_, r_, N, C, dx_, dw_, db_, &err), &err);
    ddp_nn_layernorm_backward(dy, x, w, mean, rstd, N, C, dx, dw, db);
    expect_close("layernorm backward dx", dx_, dx, (size_t)N * C, 1e-4);
    expect_close("layernorm backward dweight (+=)", dw_, dw, C, 1e-4);
    expect_close("layernorm backward dbias (+=)", db_, db, C, 1e-5);
    /* in place: dx = dy's memory */
    ok(ddp__cuda_layernorm_backward(ctx, dy_, x_, w_, m_, r_, N, C, dy_, NULL, NULL, &err), &err);
    expect_close("layernorm backward dx in place", dy_, dx, (size_t)N * C, 1e-4);
    free(x), free(w), free(b), free(dy), free(y), free(mean), free(rstd), free(dx), free(dw),
        free(db);
    void *d[] = {x_, w_, b_, dy_, y_, m_, r_, dx_, dw_, db_};
    for (size_t i = 0; i < 10; i++)
        ddp__cuda_free(d[i]);
}

static void elementwise(void **state)
{
    (void)state;
    ddp_error err = {0};
    const size_t n = 100003;
    float *x = host_rand(n, 5), *dy = host_rand(n, 1), *y = malloc(sizeof(float) * n);
    float *x_ = dev_from(x, sizeof(float) * n), *dy_ = dev_from(dy, sizeof(float) * n);
    float *y_ = dev_from(NULL, sizeof(float) * n);
    ok(ddp__cuda_gelu_forward(ctx, x_, n, y_, &err), &err);
    ddp_nn_gelu_tanh_forward(x, n, y);
    expect_close("gelu (tanh) forward", y_, y, n, 1e-6);
    ok(ddp__cuda_gelu_backward(ctx, dy_, x_, n, y_, &err), &err);
    ddp_nn_gelu_tanh_backward(dy, x, n, y);
    expect_close("gelu (tanh) backward", y_, y, n, 1e-5);
    ok(ddp__cuda_add(ctx, x_, dy_, n, y_, &err), &err);
    ddp_nn_add(x, dy, n, y);
    expect_close("residual add", y_, y, n, 0);
    free(x), free(dy), free(y);
    ddp__cuda_free(x_), ddp__cuda_free(dy_), ddp__cuda_free(y_);
}

static void attention(void **state)
{
    (void)state;
    ddp_error err = {0};
    const int B = 2, T = 70, C = 48, nh = 3; /* T spans two of the CPU's query blocks */
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    ddp_nn_attention a = {.C = C, .n_head = nh, .max_T = T, .dropout = 0};
    ok(ddp_nn_attention_setup(&a, &err), &err);
    float *qkv = host_rand(nq, 1), *dout = host_rand(no, 1);
    float *out = malloc(sizeof(float) * no), *dqkv = malloc(sizeof(float) * nq);
    float *lse = malloc(sizeof(float) * B * nh * T),
          *scr = malloc(sizeof(float) * a.scratch_floats);
    ddp_nn_attention_forward(&a, qkv, B, T, 0, 0, 0, false, scr, out, lse);
    ddp_nn_attention_backward(&a, dout, qkv, lse, B, T, 0, 0, 0, false, scr, dqkv);
    float *qkv_ = dev_from(qkv, sizeof(float) * nq), *dout_ = dev_from(dout, sizeof(float) * no);
    float *out_ = dev_from(NULL, sizeof(float) * no), *dqkv_ = dev_from(NULL, sizeof(float) * nq);
    float *att_ = dev_from(NULL, sizeof(float) * B * nh * T * T);
    float *s_ = dev_from(NULL, sizeof(float) * ddp__cuda_attention_scratch(B, T, C, nh));
    ok(ddp__cuda_attention_forward(ctx, qkv_, B, T, C, nh, att_, s_, out_, DDP_PRECISION_FP32,
                                   NULL, &err),
       &err);
    expect_close("attention forward", out_, out, no, 1e-5);
    ok(ddp__cuda_attention_backward(ctx, dout_, qkv_, att_, B, T, C, nh, s_, dqkv_,
                                    DDP_PRECISION_FP32, NULL, &err),
       &err);
    expect_close("attention backward dqkv", dqkv_, dqkv, nq, 1e-4);
    /* with dropout on the probabilities: the CPU's masks (the same hashes), drawn again by the
     * backward on both sides */
    ddp_nn_attention ad = {.C = C, .n_head = nh, .max_T = T, .dropout = 0.2f};
    ok(ddp_nn_attention_setup(&ad, &err), &err);
    float *scr2 = malloc(sizeof(float) * ad.scratch_floats);
    const uint64_t seed = 11, step = 5, off = 3 * (uint64_t)nh * T; /* a batch from sample 3 */
    ddp_nn_attention_forward(&ad, qkv, B, T, seed, step, off, true, scr2, out, lse);
    ddp_nn_attention_backward(&ad, dout, qkv, lse, B, T, seed, step, off, true, scr2, dqkv);
    const ddp__cuda_drop drop = {0.2f, seed, step, off};
    ok(ddp__cuda_attention_forward(ctx, qkv_, B, T, C, nh, att_, s_, out_, DDP_PRECISION_FP32,
                                   &drop, &err),
       &err);
    expect_close("attention forward, dropout 0.2", out_, out, no, 1e-5);
    ok(ddp__cuda_attention_backward(ctx, dout_, qkv_, att_, B, T, C, nh, s_, dqkv_,
                                    DDP_PRECISION_FP32, &drop, &err),
       &err);
    expect_close("attention backward dqkv, dropout 0.2", dqkv_, dqkv, nq, 1e-4);
    free(scr2);
    free(qkv), free(dout), free(out), free(dqkv), free(lse), free(scr);
    ddp__cuda_free(qkv_), ddp__cuda_free(dout_), ddp__cuda_free(out_), ddp__cuda_free(dqkv_);
    ddp__cuda_free(att_), ddp__cuda_free(s_);
}

/* Elementwise dropout: the CPU's values exactly (the same hashes; x·(1/(1 − p)) in float32 on
 * both), forward and, being the same map, backward; into 16 bits the CPU's value rounded once;
 * p 0 a copy. */
static void dropout_elementwise(void **state)
{
    (void)state;
    ddp_error err = {0};
    const size_t n = 100003;
    float *x = host_rand(n, 7), *y = malloc(sizeof(float) * n);
    uint8_t *mask = malloc(n);
    const float p = 0.3f;
    const uint64_t seed = 21, step = 9, off = 123456;
    ddp_nn_dropout_forward(x, n, p, seed, step, off, true, mask, y);
    float *x_ = dev_from(x, sizeof(float) * n), *y_ = dev_from(NULL, sizeof(float) * n);
    const ddp__cuda_drop d = {p, seed, step, off};
    ok(ddp__cuda_dropout(ctx, DDP_FLOAT32, x_, DDP_FLOAT32, y_, n, &d, &err), &err);
    expect_close("dropout (float32)", y_, y, n, 0);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        kept += mask[i];
    printf("  dropout p %.1f: kept %.4f of %zu\n", (double)p, (double)kept / (double)n, n);
    ok(ddp__cuda_dropout(ctx, DDP_FLOAT32, x_, DDP_FLOAT32, x_, n, &d, &err), &err); /* in place */
    expect_close("dropout (float32, in place)", x_, y, n, 0);
    const ddp_dtype hts[] = {DDP_BFLOAT16, DDP_FLOAT16};
    for (int k = 0; k < 2; k++) {
        uint16_t *h_ = dev_h(hts[k], NULL, n);
        ok(ddp__cuda_dropout(ctx, DDP_FLOAT32, x_, hts[k], h_, n, NULL, &err), &err); /* p 0 */
        float *got = fetch_h_ld(hts[k], h_, 1, n, n), *want = malloc(sizeof(float) * n);
        memcpy(want, y, sizeof(float) * n);
        round_h(hts[k], want, n);
        expect_close_host("dropout's p 0: a rounding copy", got, want, n, 0);
        free(got);
        /* p > 0 into 16 bits: the CPU's values (on y as x) rounded once; then 16 → 16 in
         * place: the same mask again on those, rounded again */
        float *y2 = malloc(sizeof(float) * n);
        ddp_nn_dropout_forward(y, n, p, seed, step, off, true, mask, y2);
        ok(ddp__cuda_dropout(ctx, DDP_FLOAT32, x_, hts[k], h_, n, &d, &err), &err);
        memcpy(want, y2, sizeof(float) * n);
        round_h(hts[k], want, n);
        got = fetch_h_ld(hts[k], h_, 1, n, n);
        expect_close_host("dropout float32 → 16 bits", got, want, n, 0);
        free(got);
        ok(ddp__cuda_dropout(ctx, hts[k], h_, hts[k], h_, n, &d, &err), &err);
        ddp_nn_dropout_forward(want, n, p, seed, step, off, true, mask, want);
        round_h(hts[k], want, n);
        got = fetch_h_ld(hts[k], h_, 1, n, n);
        expect_close_host("dropout 16 bits in place", got, want, n, 0);
        free(got), free(want), free(y2);
        ddp__cuda_free(h_);
    }
    free(x), free(y), free(mask);
    ddp__cuda_free(x_), ddp__cuda_free(y_);
}

static void vocab_xent(void **state)
{
    (void)state;
    ddp_error err = {0};
    const int N = 50, V = 1000;
    float *logits = host_rand((size_t)N * V, 4), *dl = malloc(sizeof(float) * N * V);
    int32_t tg[50];
    int count = 0;
    for (int r = 0; r < N; r++) {
        tg[r] = r % 7 == 3 ? DDP_NN_IGNORE_INDEX : (r * 37) % V;
        count += tg[r] != DDP_NN_IGNORE_INDEX;
    }
    tg[5] = 0; /* a target that is the argmax: */
    logits[5 * V] = 100.0f;
    double loss = 0;
    ok(ddp_nn_vocab_xent(logits, tg, N, V, 0.5f, &loss, dl, &err), &err);
    float *l_ = dev_from(logits, sizeof(float) * N * V), *rl_ = dev_from(NULL, sizeof(float) * N);
    int32_t *tg_ = dev_from(tg, sizeof tg), *cor_ = dev_from(NULL, sizeof(int32_t) * N);
    ok(ddp__cuda_vocab_xent(ctx, l_, tg_, N, V, 0.5f, count, rl_, cor_, l_, &err), &err);
    float *rl = fetch(rl_, N);
    int32_t cor[50];
    ok(ddp__cuda_to_host(ctx, cor, cor_, sizeof cor, &err), &err);
    double s = 0;
    int64_t correct = 0, want_correct = 0;
    for (int r = 0; r < N; r++) {
        s += rl[r];
        correct += cor[r];
        if (tg[r] == DDP_NN_IGNORE_INDEX)
            continue;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (logits[(size_t)r * V + j] > logits[(size_t)r * V + best])
                best = j;
        want_correct += best == tg[r];
    }
    printf("  softmax xent loss: gpu %.7f cpu %.7f; correct %lld (cpu %lld)\n", s / count, loss,
           (long long)correct, (long long)want_correct);
    assert_true(fabs(s / count - loss) <= 1e-5 * fabs(loss));
    assert_int_equal(correct, want_correct);
    assert_true(want_correct >= 1);
    expect_close("softmax xent dlogits (in place)", l_, dl, (size_t)N * V, 1e-5);
    free(logits), free(dl), free(rl);
    ddp__cuda_free(l_), ddp__cuda_free(rl_), ddp__cuda_free(tg_), ddp__cuda_free(cor_);
}

/* ---- the 16-bit layers (precision 16-bit and fp16: each test runs once per format) -------------
 * References: the CPU's fp32 layer on the inputs rounded to the format (what the device's 16-bit
 * buffers hold), its result rounded as the device rounds it. */

static void layers_h(void **state)
{
    const ddp_dtype ht = *(const ddp_dtype *)*state;
    printf("  format %s\n", hname(ht));
    ddp_error err = {0};
    /* layernorm: fp32 in, fp32 statistics, 16-bit out */
    {
        const int N = 300, C = 96;
        float *x = host_rand((size_t)N * C, 2), *w = host_rand(C, 1), *b = host_rand(C, 1);
        for (size_t i = 0; i < (size_t)N * C; i++)
            x[i] += 3.0f;
        float *y = malloc(sizeof(float) * N * C), *mean = malloc(sizeof(float) * N),
              *rstd = malloc(sizeof(float) * N);
        float *x_ = dev_from(x, sizeof(float) * N * C), *w_ = dev_from(w, sizeof(float) * C);
        float *b_ = dev_from(b, sizeof(float) * C), *m_ = dev_from(NULL, sizeof(float) * N);
        float *r_ = dev_from(NULL, sizeof(float) * N);
        uint16_t *y_ = dev_h(ht, NULL, (size_t)N * C);
        ok(ddp__cuda_layernorm_forward_h(ctx, ht, x_, w_, b_, N, C, 1e-5f, y_, m_, r_, &err), &err);
        ddp_nn_layernorm_forward(x, w, b, N, C, 1e-5f, y, mean, rstd);
        expect_close_h(ht, "layernorm forward (16-bit out)", y_, y, (size_t)N * C);
        expect_close("layernorm mean (16-bit out)", m_, mean, N, 1e-6);
        expect_close("layernorm rstd (16-bit out)", r_, rstd, N, 1e-5);
        free(x), free(w), free(b), free(y), free(mean), free(rstd);
        ddp__cuda_free(x_), ddp__cuda_free(w_), ddp__cuda_free(b_), ddp__cuda_free(m_);
        ddp__cuda_free(r_), ddp__cuda_free(y_);
    }
    /* linear: 16-bit x, W, dy and bias (the bias's 16-bit copy, as autocast); y 16-bit; dx fp32
     * or 16-bit; dW, db fp32 (+=) */
    {
        const int B = 37, in = 48, out = 80;
        float *x = host_rand((size_t)B * in, 1), *W = host_rand((size_t)out * in, 0.2f);
        float *b = host_rand(out + 1, 0.1f), *dy = host_rand((size_t)B * out, 1);
        round_h(ht, x, (size_t)B * in);
        round_h(ht, W, (size_t)out * in);
        round_h(ht, dy, (size_t)B * out);
        round_h(ht, b, out + 1);
        float *y = malloc(sizeof(float) * B * out), *dx = malloc(sizeof(float) * B * in);
        float *dW = host_rand((size_t)out * in, 1), *db = host_rand(out, 1);
        uint16_t *x_ = dev_h(ht, x, (size_t)B * in), *W_ = dev_h(ht, W, (size_t)out * in);
        uint16_t *dy_ = dev_h(ht, dy, (size_t)B * out), *y_ = dev_h(ht, NULL, (size_t)B * out);
        uint16_t *dxh_ = dev_h(ht, NULL, (size_t)B * in);
        uint16_t *b_ = dev_h(ht, b, out + 1);
        float *dx_ = dev_from(NULL, sizeof(float) * B * in);
        float *dW_ = dev_from(dW, sizeof(float) * out * in),
              *db_ = dev_from(db, sizeof(float) * out);
        ok(ddp__cuda_linear_forward_h(ctx, ht, x_, W_, b_, B, in, out, y_, &err), &err);
        ddp_nn_linear_forward(x, W, b, B, in, out, y);
        expect_close_h(ht, "linear forward (16-bit)", y_, y, (size_t)B * out);
        /* a bias 2 bytes past its allocation: the bias pass, on a 16-bit output */
        ok(ddp__cuda_linear_forward_h(ctx, ht, x_, W_, b_ + 1, B, in, out, y_, &err), &err);
        ddp_nn_linear_forward(x, W, b + 1, B, in, out, y);
        expect_close_h(ht, "linear forward (16-bit, unaligned bias)", y_, y, (size_t)B * out);
        ok(ddp__cuda_linear_backward_h(ctx, ht, dy_, x_, W_, B, in, out, dx_, DDP_FLOAT32, dW_, db_,
                                       &err),
           &err);
        ddp_nn_linear_backward(dy, x, W, B, in, out, dx, dW, db);
        /* exact 16-bit products into fp32: only the summation order differs */
        expect_close("linear backward dx (16-bit in, fp32)", dx_, dx, (size_t)B * in, 1e-5);
        expect_close("linear backward dW (16-bit, +=)", dW_, dW, (size_t)out * in, 1e-5);
        expect_close("linear backward db (16-bit, +=)", db_, db, out, 1e-5);
        ok(ddp__cuda_linear_backward_h(ctx, ht, dy_, x_, W_, B, in, out, dxh_, ht, NULL, NULL,
                                       &err),
           &err);
        expect_close_h(ht, "linear backward dx (16-bit out)", dxh_, dx, (size_t)B * in);
        /* the GELU epilogues in 16 bits: pre = round(x·Wᵀ + b), y = round(GELU(x·Wᵀ + b)) (the
         * epilogue's GELU reads the fp32 sum; the fallback the rounded pre: within the bound);
         * then dpre = round((dy·W) ⊙ GELU'(pre)) with dy (B, out) and W (out, in) as dx's */
        {
            uint16_t *pre_ = dev_h(ht, NULL, (size_t)B * out), *g_ = dev_h(ht, NULL, (size_t)B * out);
            uint16_t *dpre_ = dev_h(ht, NULL, (size_t)B * out);
            ok(ddp__cuda_linear_gelu_forward(ctx, ht, x_, W_, b_, B, in, out, pre_, g_,
                                             DDP_PRECISION_BF16, &err),
               &err);
            ddp_nn_linear_forward(x, W, b, B, in, out, y);
            expect_close_h(ht, "linear+gelu: the GELU's input (16-bit)", pre_, y, (size_t)B * out);
            float *pre = fetch_h_ld(ht, pre_, 1, (size_t)B * out, (size_t)B * out);
            float *g = malloc(sizeof(float) * B * out);
            ddp_nn_gelu_tanh_forward(y, (size_t)B * out, g);
            expect_close_h(ht, "linear+gelu: GELU (16-bit)", g_, g, (size_t)B * out);
            /* back through W itself (out, in) from a (B, in) gradient: dpre (B, out) */
            float *Wt = malloc(sizeof(float) * out * in); /* W2 (in, out) = Wᵀ, 16-bit values */
            for (int r = 0; r < out; r++)
                for (int k = 0; k < in; k++)
                    Wt[(size_t)k * out + r] = W[(size_t)r * in + k];
            float *dpre = malloc(sizeof(float) * B * out);
            ddp_nn_linear_backward(x, pre, Wt, B, out, in, dpre, NULL, NULL); /* x as dz (B, in) */
            ddp_nn_gelu_tanh_backward(dpre, pre, (size_t)B * out, dpre);
            uint16_t *Wt_ = dev_h(ht, Wt, (size_t)in * out);
            ok(ddp__cuda_linear_dgelu_backward(ctx, ht, x_, Wt_, pre_, B, out, in, dpre_,
                                               DDP_PRECISION_BF16, &err),
               &err);
            expect_close_h(ht, "linear+dgelu (16-bit)", dpre_, dpre, (size_t)B * out);
            free(pre), free(g), free(dpre), free(Wt);
            ddp__cuda_free(pre_), ddp__cuda_free(g_), ddp__cuda_free(dpre_), ddp__cuda_free(Wt_);
        }
        free(x), free(W), free(b), free(dy), free(y), free(dx), free(dW), free(db);
        void *d[] = {x_, W_, dy_, y_, dxh_, b_, dx_, dW_, db_};
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
            ddp__cuda_free(d[i]);
    }
    /* GELU on 16-bit (fp32 arithmetic), and the fp32 + 16-bit residual add */
    {
        const size_t n = 100003;
        float *x = host_rand(n, 5), *dy = host_rand(n, 1), *a = host_rand(n, 3);
        round_h(ht, x, n);
        round_h(ht, dy, n);
        float *y = malloc(sizeof(float) * n);
        uint16_t *x_ = dev_h(ht, x, n), *dy_ = dev_h(ht, dy, n), *y_ = dev_h(ht, NULL, n);
        float *a_ = dev_from(a, sizeof(float) * n), *s_ = dev_from(NULL, sizeof(float) * n);
        ok(ddp__cuda_gelu_forward_h(ctx, ht, x_, n, y_, &err), &err);
        ddp_nn_gelu_tanh_forward(x, n, y);
        expect_close_h(ht, "gelu forward (16-bit)", y_, y, n);
        ok(ddp__cuda_gelu_backward_h(ctx, ht, dy_, x_, n, dy_, &err), &err); /* in place */
        ddp_nn_gelu_tanh_backward(dy, x, n, y);
        expect_close_h(ht, "gelu backward (16-bit, in place)", dy_, y, n);
        ok(ddp__cuda_add_h(ctx, ht, a_, x_, n, s_, &err), &err);
        ddp_nn_add(a, x, n, y);
        expect_close("add fp32 + 16-bit", s_, y, n, 0);
        free(x), free(dy), free(a), free(y);
        ddp__cuda_free(x_), ddp__cuda_free(dy_), ddp__cuda_free(y_), ddp__cuda_free(a_);
        ddp__cuda_free(s_);
    }
}

/* The 16-bit attention's arithmetic on the CPU, rounding where the device rounds (P, Y, dV, dS,
 * dQ, dK), every product accumulated in double: the reference the device must match to a
 * 16-bit unit or two. qkv, dout (B, T, 3C), (B, T, C) hold 16-bit values; dout NULL: forward only.
 */
static void attention_h_ref(ddp_dtype ht, const float *qkv, const float *dout, int B, int T, int C,
                            int nh, float *out, float *dqkv)
{
    const int hs = C / nh;
    const float scale = 1.0f / sqrtf((float)hs);
    float *P = malloc(sizeof(float) * T * T), *dP = malloc(sizeof(float) * T * T);
    assert_non_null(P);
    assert_non_null(dP);
#define Q(b, t, h, d) qkv[((size_t)(b)*T + (t)) * 3 * C + (size_t)(h)*hs + (d)]
#define K(b, t, h, d) qkv[((size_t)(b)*T + (t)) * 3 * C + C + (size_t)(h)*hs + (d)]
#define VV(b, t, h, d) qkv[((size_t)(b)*T + (t)) * 3 * C + 2 * C + (size_t)(h)*hs + (d)]
#define DO(b, t, h, d) dout[((size_t)(b)*T + (t)) * C + (size_t)(h)*hs + (d)]
#define DQKV(b, t, part, h, d) dqkv[((size_t)(b)*T + (t)) * 3 * C + (part)*C + (size_t)(h)*hs + (d)]
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            for (int t = 0; t < T; t++) {
                float mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    double s = 0;
                    for (int d = 0; d < hs; d++)
                        s += (double)Q(b, t, h, d) * K(b, j, h, d);
                    P[t * T + j] = (float)s * scale;
                    mx = fmaxf(mx, P[t * T + j]);
                }
                float sum = 0;
                for (int j = 0; j <= t; j++)
                    sum += expf(P[t * T + j] - mx);
                for (int j = 0; j < T; j++)
                    P[t * T + j] = j <= t ? round1(ht, expf(P[t * T + j] - mx) / sum) : 0.0f;
                for (int d = 0; d < hs; d++) {
                    double y = 0;
                    for (int j = 0; j <= t; j++)
                        y += (double)P[t * T + j] * VV(b, j, h, d);
                    out[((size_t)b * T + t) * C + (size_t)h * hs + d] = round1(ht, (float)y);
                }
            }
            if (!dout)
                continue;
            for (int t = 0; t < T; t++) { /* dP, then dS in dP's place */
                float s = 0;
                for (int j = 0; j <= t; j++) {
                    double v = 0;
                    for (int d = 0; d < hs; d++)
                        v += (double)DO(b, t, h, d) * VV(b, j, h, d);
                    dP[t * T + j] = (float)v;
                    s += P[t * T + j] * dP[t * T + j];
                }
                for (int j = 0; j < T; j++)
                    dP[t * T + j] =
                        j <= t ? round1(ht, P[t * T + j] * (dP[t * T + j] - s) * scale) : 0;
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < hs; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int j = 0; j < T; j++) {
                        dq += (double)dP[t * T + j] * K(b, j, h, d);
                        dk += (double)dP[j * T + t] * Q(b, j, h, d);
                        dv += (double)P[j * T + t] * DO(b, j, h, d);
                    }
                    DQKV(b, t, 0, h, d) = round1(ht, (float)dq);
                    DQKV(b, t, 1, h, d) = round1(ht, (float)dk);
                    DQKV(b, t, 2, h, d) = round1(ht, (float)dv);
                }
        }
#undef Q
#undef K
#undef VV
#undef DO
#undef DQKV
    free(P);
    free(dP);
}

static void attention_h(void **state)
{
    const ddp_dtype ht = *(const ddp_dtype *)*state;
    printf("  format %s\n", hname(ht));
    ddp_error err = {0};
    const int B = 2, T = 70, C = 48, nh = 3;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *qkv = host_rand(nq, 1), *dout = host_rand(no, 1);
    round_h(ht, qkv, nq);
    round_h(ht, dout, no);
    float *out = malloc(sizeof(float) * no), *dqkv = malloc(sizeof(float) * nq);
    attention_h_ref(ht, qkv, dout, B, T, C, nh, out, dqkv);
    uint16_t *qkv_ = dev_h(ht, qkv, nq), *dout_ = dev_h(ht, dout, no);
    uint16_t *out_ = dev_h(ht, NULL, no), *dqkv_ = dev_h(ht, NULL, nq);
    uint16_t *att_ = dev_h(ht, NULL, (size_t)B * nh * T * T);
    void *s_ = dev_from(NULL, ddp__cuda_attention_scratch_h(B, T, C, nh));
    ok(ddp__cuda_attention_forward_h(ctx, ht, qkv_, B, T, C, nh, att_, s_, out_, NULL, &err),
       &err);
    float *got = fetch_h_ld(ht, out_, 1, no, no);
    /* the rounded probabilities: a score near a rounding boundary may round the other way, one
     * unit of P (2⁻⁸ relative), which moves Y by less than that: two units of the largest |Y| */
    expect_close_host("attention forward (16-bit)", got, out, no, H_ULP2(ht));
    free(got);
    ok(ddp__cuda_attention_backward_h(ctx, ht, dout_, qkv_, att_, B, T, C, nh, s_, dqkv_, NULL,
                                      &err),
       &err);
    got = fetch_h_ld(ht, dqkv_, 1, nq, nq);
    /* dS = P ⊙ (dP − Σ P·dP) can cancel: a unit of dS is then larger than of the result's
     * largest element; 4 units */
    expect_close_host("attention backward dqkv (16-bit)", got, dqkv, nq, 2 * H_ULP2(ht));
    free(got);
    /* and against the fp32 CPU layer on the same inputs: the format's own error, a sanity bound */
    ddp_nn_attention a = {.C = C, .n_head = nh, .max_T = T, .dropout = 0};
    ok(ddp_nn_attention_setup(&a, &err), &err);
    float *lse = malloc(sizeof(float) * B * nh * T),
          *scr = malloc(sizeof(float) * a.scratch_floats);
    ddp_nn_attention_forward(&a, qkv, B, T, 0, 0, 0, false, scr, out, lse);
    ddp_nn_attention_backward(&a, dout, qkv, lse, B, T, 0, 0, 0, false, scr, dqkv);
    got = fetch_h_ld(ht, out_, 1, no, no);
    expect_close_host("attention forward (16-bit vs fp32)", got, out, no, 3e-2);
    free(got);
    got = fetch_h_ld(ht, dqkv_, 1, nq, nq);
    expect_close_host("attention backward (16-bit vs fp32)", got, dqkv, nq, 5e-2);
    free(got);
    /* with dropout 0.2: the same masks as the fp32 CPU layer's, the same sanity bounds (a wrong
     * mask moves a dropped probability's whole weight) */
    ddp_nn_attention ad = {.C = C, .n_head = nh, .max_T = T, .dropout = 0.2f};
    ok(ddp_nn_attention_setup(&ad, &err), &err);
    float *scr2 = malloc(sizeof(float) * ad.scratch_floats);
    const uint64_t seed = 11, step = 5, off = 3 * (uint64_t)nh * T;
    ddp_nn_attention_forward(&ad, qkv, B, T, seed, step, off, true, scr2, out, lse);
    ddp_nn_attention_backward(&ad, dout, qkv, lse, B, T, seed, step, off, true, scr2, dqkv);
    const ddp__cuda_drop drop = {0.2f, seed, step, off};
    ok(ddp__cuda_attention_forward_h(ctx, ht, qkv_, B, T, C, nh, att_, s_, out_, &drop, &err),
       &err);
    got = fetch_h_ld(ht, out_, 1, no, no);
    expect_close_host("attention forward, dropout 0.2 (16-bit vs fp32)", got, out, no, 3e-2);
    free(got);
    ok(ddp__cuda_attention_backward_h(ctx, ht, dout_, qkv_, att_, B, T, C, nh, s_, dqkv_, &drop,
                                      &err),
       &err);
    got = fetch_h_ld(ht, dqkv_, 1, nq, nq);
    expect_close_host("attention backward, dropout 0.2 (16-bit vs fp32)", got, dqkv, nq, 5e-2);
    free(got);
    free(scr2);
    free(qkv), free(dout), free(out), free(dqkv), free(lse), free(scr);
    ddp__cuda_free(qkv_), ddp__cuda_free(dout_), ddp__cuda_free(out_), ddp__cuda_free(dqkv_);
    ddp__cuda_free(att_), ddp__cuda_free(s_);
}

/* ---- the fused (flash) attention ------------------------------------------------------------
 * For each head size it takes (32, 64, 128): B·nh = 4 heads, T = 70 (not a multiple of any
 * tile: the last query and key tiles are partial, and causal limits fall inside tiles). */

static const int flash_hs[] = {32, 64, 128};

/* fp32: out, lse and dqkv against the CPU layer (the batched path's bounds: 1e-5 forward, 1e-4
 * backward), the backward run twice bit for bit (no atomics: a fixed order), a short T, and
 * attention dropout (p 0.1 at T 70, p 0.5 at T 37: the CPU layer's masks from the same seed,
 * step and offset, drawn again by the backward on both sides). */
static void flash(void **state)
{
    (void)state;
    ddp_error err = {0};
    static const struct {
        int T;
        float p;
    } cases[] = {{70, 0.0f}, {5, 0.0f}, {70, 0.1f}, {37, 0.5f}};
    for (size_t k = 0; k < sizeof flash_hs / sizeof flash_hs[0]; k++)
        for (size_t tc = 0; tc < sizeof cases / sizeof cases[0]; tc++) {
            const int hs = flash_hs[k], nh = 2, C = nh * hs, B = 2, T = cases[tc].T;
            const float p = cases[tc].p;
            const uint64_t seed = 11, step = 5, off = 3 * (uint64_t)nh * T;
            const ddp__cuda_drop drop = {p, seed, step, off};
            printf("  head size %d, T %d, dropout %.1f\n", hs, T, (double)p);
            const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C,
                         nl = (size_t)B * nh * T;
            ddp_nn_attention a = {.C = C, .n_head = nh, .max_T = T, .dropout = p};
            ok(ddp_nn_attention_setup(&a, &err), &err);
            float *qkv = host_rand(nq, 1), *dout = host_rand(no, 1);
            float *out = malloc(sizeof(float) * no), *dqkv = malloc(sizeof(float) * nq);
            float *lse = malloc(sizeof(float) * nl),
                  *scr = malloc(sizeof(float) * a.scratch_floats);
            ddp_nn_attention_forward(&a, qkv, B, T, seed, step, off, p > 0, scr, out, lse);
            ddp_nn_attention_backward(&a, dout, qkv, lse, B, T, seed, step, off, p > 0, scr, dqkv);
            float *qkv_ = dev_from(qkv, sizeof(float) * nq);
            float *dout_ = dev_from(dout, sizeof(float) * no);
            float *out_ = dev_from(NULL, sizeof(float) * no);
            float *dqkv_ = dev_from(NULL, sizeof(float) * nq);
            float *lse_ = dev_from(NULL, sizeof(float) * nl);
            void *s_ = dev_from(NULL, ddp__cuda_flash_scratch(B, T, C, nh));
            ok(ddp__cuda_flash_forward(ctx, DDP_FLOAT32, qkv_, B, T, C, nh, out_, lse_, &drop,
                                       &err),
               &err);
            expect_close("flash forward", out_, out, no, 1e-5);
            expect_close("flash forward logsumexp", lse_, lse, nl, 1e-5);
            ok(ddp__cuda_flash_backward(ctx, DDP_FLOAT32, dout_, qkv_, out_, lse_, B, T, C, nh, s_,
                                        dqkv_, &drop, &err),
               &err);
            expect_close("flash backward dqkv", dqkv_, dqkv, nq, 1e-4);
            float *first = fetch(dqkv_, nq);
            ok(ddp__cuda_flash_backward(ctx, DDP_FLOAT32, dout_, qkv_, out_, lse_, B, T, C, nh, s_,
                                        dqkv_, &drop, &err),
               &err);
            float *again = fetch(dqkv_, nq);
            if (memcmp(first, again, sizeof(float) * nq))
                fail_msg("flash backward: two runs differ (hs %d): not deterministic", hs);
            free(first), free(again);
            free(qkv), free(dout), free(out), free(dqkv), free(lse), free(scr);
            ddp__cuda_free(qkv_), ddp__cuda_free(dout_), ddp__cuda_free(out_);
            ddp__cuda_free(dqkv_), ddp__cuda_free(lse_), ddp__cuda_free(s_);
        }
    /* a head size it does not take: a clear error, nothing queued */
    float *x_ = dev_from(NULL, sizeof(float) * 3 * 48);
    assert_int_equal(ddp__cuda_flash_forward(ctx, DDP_FLOAT32, x_, 1, 1, 48, 1, x_, x_, NULL, &err),
                     DDP_ERR_INVALID);
    printf("  head size 48: %s\n", err.msg);
    assert_false(ddp__cuda_flash_supported(48));
    ddp__cuda_free(x_);
}

/* 16 bits: against the CPU emulation of the batched path's roundings (attention_h_ref), the
 * batched device path itself, and the fp32 CPU layer. Bounds twice the batched path's against
 * the emulation: flash rounds the unnormalized exp(s − running max) where the batched path
 * rounds the normalized probability (each P element may round differently, up to a unit of
 * 2⁻⁸ relative, moving Y by less than that of max |V|), and D = Σ dO·O from the rounded O where
 * the batched path sums P·dP. Estimates, to be checked on the first GPU run. With dropout (p 0.5,
 * then the batched path is run with the same drop; attention_h_ref has none): against the batched
 * path at the same bounds (its dropped P is its rounded P times 1/(1 − p), rounded again; flash
 * rounds the unnormalized P times that once) and the fp32 CPU layer with the same masks. */
static void flash_h_on(ddp_dtype ht, float p)
{
    printf("  format %s, dropout %.1f\n", hname(ht), (double)p);
    ddp_error err = {0};
    for (size_t k = 0; k < sizeof flash_hs / sizeof flash_hs[0]; k++) {
        const int hs = flash_hs[k], nh = 2, C = nh * hs, B = 2, T = 70;
        const uint64_t seed = 11, step = 5, off = 3 * (uint64_t)nh * T;
        const ddp__cuda_drop drop = {p, seed, step, off};
        printf("  head size %d, T %d\n", hs, T);
        const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
        float *qkv = host_rand(nq, 1), *dout = host_rand(no, 1);
        round_h(ht, qkv, nq);
        round_h(ht, dout, no);
        float *out = malloc(sizeof(float) * no), *dqkv = malloc(sizeof(float) * nq);
        if (p == 0)
            attention_h_ref(ht, qkv, dout, B, T, C, nh, out, dqkv);
        uint16_t *qkv_ = dev_h(ht, qkv, nq), *dout_ = dev_h(ht, dout, no);
        uint16_t *out_ = dev_h(ht, NULL, no), *dqkv_ = dev_h(ht, NULL, nq);
        float *lse_ = dev_from(NULL, sizeof(float) * nl);
        void *s_ = dev_from(NULL, ddp__cuda_flash_scratch(B, T, C, nh));
        ok(ddp__cuda_flash_forward(ctx, ht, qkv_, B, T, C, nh, out_, lse_, &drop, &err), &err);
        float *fo = fetch_h_ld(ht, out_, 1, no, no);
        if (p == 0)
            expect_close_host("flash forward (16-bit)", fo, out, no, 2 * H_ULP2(ht));
        ok(ddp__cuda_flash_backward(ctx, ht, dout_, qkv_, out_, lse_, B, T, C, nh, s_, dqkv_, &drop,
                                    &err),
           &err);
        float *fd = fetch_h_ld(ht, dqkv_, 1, nq, nq);
        if (p == 0)
            expect_close_host("flash backward dqkv (16-bit)", fd, dqkv, nq, 4 * H_ULP2(ht));
        /* the batched 16-bit path on the same inputs */
        uint16_t *bo_ = dev_h(ht, NULL, no), *bd_ = dev_h(ht, NULL, nq);
        uint16_t *att_ = dev_h(ht, NULL, (size_t)B * nh * T * T);
        void *bs_ = dev_from(NULL, ddp__cuda_attention_scratch_h(B, T, C, nh));
        ok(ddp__cuda_attention_forward_h(ctx, ht, qkv_, B, T, C, nh, att_, bs_, bo_, &drop, &err),
           &err);
        ok(ddp__cuda_attention_backward_h(ctx, ht, dout_, qkv_, att_, B, T, C, nh, bs_, bd_, &drop,
                                          &err),
           &err);
        float *bo = fetch_h_ld(ht, bo_, 1, no, no), *bd = fetch_h_ld(ht, bd_, 1, nq, nq);
        expect_close_host("flash vs batched forward (16-bit)", fo, bo, no, 2 * H_ULP2(ht));
        expect_close_host("flash vs batched backward (16-bit)", fd, bd, nq, 4 * H_ULP2(ht));
        /* the fp32 CPU layer: the format's own error, a sanity bound (as attention_h) */
        ddp_nn_attention a = {.C = C, .n_head = nh, .max_T = T, .dropout = p};
        ok(ddp_nn_attention_setup(&a, &err), &err);
        float *lse = malloc(sizeof(float) * nl), *scr = malloc(sizeof(float) * a.scratch_floats);
        ddp_nn_attention_forward(&a, qkv, B, T, seed, step, off, p > 0, scr, out, lse);
        ddp_nn_attention_backward(&a, dout, qkv, lse, B, T, seed, step, off, p > 0, scr, dqkv);
        expect_close_host("flash forward (16-bit vs fp32)", fo, out, no, 3e-2);
        expect_close_host("flash backward (16-bit vs fp32)", fd, dqkv, nq, 5e-2);
        /* the logsumexp in fp32 from 16-bit inputs: the fp32 layer's on the same values */
        expect_close("flash logsumexp (16-bit inputs)", lse_, lse, nl, 1e-4);
        free(fo), free(fd), free(bo), free(bd), free(lse), free(scr);
        free(qkv), free(dout), free(out), free(dqkv);
        ddp__cuda_free(qkv_), ddp__cuda_free(dout_), ddp__cuda_free(out_), ddp__cuda_free(dqkv_);
        ddp__cuda_free(lse_), ddp__cuda_free(s_), ddp__cuda_free(bo_), ddp__cuda_free(bd_);
        ddp__cuda_free(att_), ddp__cuda_free(bs_);
    }
}

static void flash_h(void **state)
{
    const ddp_dtype ht = *(const ddp_dtype *)*state;
    flash_h_on(ht, 0.0f);
    flash_h_on(ht, 0.5f);
}

/* The loss in fp32 as ddp__cuda_vocab_xent's, the gradient in 16-bit over the logits (leading
 * dimension 2V); without grad the logits stay as they were. */
static void vocab_xent_h(void **state)
{
    const ddp_dtype ht = *(const ddp_dtype *)*state;
    printf("  format %s\n", hname(ht));
    ddp_error err = {0};
    const int N = 50, V = 1001; /* V odd and not a multiple of 512: the last chunk is partial */
    float *logits = host_rand((size_t)N * V, 4), *dl = malloc(sizeof(float) * N * V);
    int32_t tg[50];
    int count = 0;
    for (int r = 0; r < N; r++) {
        tg[r] = r % 7 == 3 ? DDP_NN_IGNORE_INDEX : (r * 37) % V;
        count += tg[r] != DDP_NN_IGNORE_INDEX;
    }
    double loss = 0;
    ok(ddp_nn_vocab_xent(logits, tg, N, V, 0.5f, &loss, dl, &err), &err);
    float *l_ = dev_from(logits, sizeof(float) * N * V), *rl_ = dev_from(NULL, sizeof(float) * N);
    int32_t *tg_ = dev_from(tg, sizeof tg), *cor_ = dev_from(NULL, sizeof(int32_t) * N);
    for (int grad = 0; grad < 2; grad++) {
        ok(ddp__cuda_vocab_xent_hgrad(ctx, ht, l_, tg_, N, V, 0.5f, count, rl_, cor_, grad, &err),
           &err);
        float *rl = fetch(rl_, N);
        double s = 0;
        for (int r = 0; r < N; r++)
            s += rl[r];
        printf("  softmax xent (16-bit gradient %d) loss: gpu %.7f cpu %.7f\n", grad, s / count,
               loss);
        assert_true(fabs(s / count - loss) <= 1e-5 * fabs(loss));
        free(rl);
        if (!grad)
            expect_close("softmax xent without grad: logits kept", l_, logits, (size_t)N * V, 0);
    }
    float *got = fetch_h_ld(ht, l_, N, V, 2 * (size_t)V);
    round_h(ht, dl, (size_t)N * V);
    expect_close_host("softmax xent dlogits (16-bit, in place)", got, dl, (size_t)N * V,
                      H_ULP2(ht));
    free(logits), free(dl), free(got);
    ddp__cuda_free(l_), ddp__cuda_free(rl_), ddp__cuda_free(tg_), ddp__cuda_free(cor_);
}

/* ---- optimizer and gradients ------------------------------------------------------------------
 */

static void adamw(void **state)
{
    (void)state;
    ddp_error err = {0};
    const size_t n = 10007;
    float *p = host_rand(n, 1), *g = host_rand(n, 1), *m = host_rand(n, 0.1f);
    float *v = host_rand(n, 0.1f);
    for (size_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *p_ = dev_from(p, 4 * n), *g_ = dev_from(g, 4 * n), *m_ = dev_from(m, 4 * n);
    float *v_ = dev_from(v, 4 * n);
    uint16_t *pb_ = dev_from(NULL, 2 * n);
    for (uint64_t step = 1; step <= 3; step++) {
        ok(ddp__cuda_adamw(ctx, p_, g_, m_, v_, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 1.0f, pb_,
                           &err),
           &err);
        ddp_nn_adamw_step(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
    expect_close("adamw p (3 steps)", p_, p, n, 1e-6);
    expect_close("adamw m", m_, m, n, 1e-6);
    expect_close("adamw v", v_, v, n, 1e-6);
    uint16_t *pb = malloc(2 * n), *want = malloc(2 * n);
    float *pg = fetch(p_, n);
    ok(ddp__cuda_to_host(ctx, pb, pb_, 2 * n, &err), &err);
    ddp__from_f32(want, pg, n, DDP_BFLOAT16);
    assert_memory_equal(pb, want, 2 * n); /* the bf16 copy rounds the device's own master */
    printf("  adamw bf16 copy: bit for bit\n");
    free(p), free(g), free(m), free(v), free(pb), free(want), free(pg);
    ddp__cuda_free(p_), ddp__cuda_free(g_), ddp__cuda_free(m_), ddp__cuda_free(v_);
    ddp__cuda_free(pb_);
}

static void grads(void **state)
{
    (void)state;
    ddp_error err = {0};
    const size_t n = 300001;
    float *g = host_rand(n, 1);
    float *g_ = dev_from(g, 4 * n);
    double ss = 0, want = 0;
    for (size_t i = 0; i < n; i++)
        want += (double)g[i] * g[i];
    ok(ddp__cuda_sumsq(ctx, g_, n, &ss, &err), &err);
    printf("  sum of squares: gpu %.12g cpu %.12g\n", ss, want);
    assert_true(fabs(ss - want) <= 1e-12 * want);
    ok(ddp__cuda_scale(ctx, g_, n, 0.25f, &err), &err);
    for (size_t i = 0; i < n; i++)
        g[i] *= 0.25f;
    expect_close("scale", g_, g, n, 0);
    bool inf = true;
    ok(ddp__cuda_unscale(ctx, g_, n, 2.0f, &inf, &err), &err);
    assert_false(inf);
    for (size_t i = 0; i < n; i++)
        g[i] *= 2.0f;
    expect_close("unscale", g_, g, n, 0);
    float bad = NAN;
    ok(ddp__cuda_to_device(ctx, g_ + 12345, &bad, sizeof bad, &err), &err);
    ok(ddp__cuda_unscale(ctx, g_, n, 1.0f, &inf, &err), &err);
    assert_true(inf);
    /* bf16 and fp16 conversions: util/half.h's rounding, bit for bit (fp16: values beyond its
     * range become ±inf, NaN stays NaN) */
    uint16_t *h = malloc(2 * n), *want16 = malloc(2 * n);
    uint16_t *h_ = dev_from(NULL, 2 * n);
    float *gg = fetch(g_, n), *back = NULL;
    gg[7] = 70000.0f, gg[8] = -1e6f, gg[9] = 65519.0f, gg[10] = 65520.0f, gg[11] = 1e-8f;
    ok(ddp__cuda_to_device(ctx, g_, gg, 4 * n, &err), &err);
    for (int f = 0; f < 2; f++) {
        const ddp_dtype ht = f ? DDP_FLOAT16 : DDP_BFLOAT16;
        ok(ddp__cuda_f32_to_h(ctx, ht, g_, n, h_, &err), &err);
        ok(ddp__cuda_to_host(ctx, h, h_, 2 * n, &err), &err);
        ddp__from_f32(want16, gg, n, ht);
        assert_memory_equal(h, want16, 2 * n);
        float *wide = malloc(4 * n);
        assert_non_null(wide);
        ok(ddp__cuda_h_to_f32(ctx, ht, h_, n, g_, &err), &err);
        ddp__to_f32(wide, want16, n, ht);
        back = fetch(g_, n);
        assert_memory_equal(back, wide, 4 * n);
        if (ht == DDP_FLOAT16) {
            assert_true(isinf(back[7]) && back[7] > 0 && isinf(back[8]) && back[8] < 0);
            assert_true(back[9] == 65504.0f && isinf(back[10]));
        }
        free(wide);
        free(back);
        ok(ddp__cuda_to_device(ctx, g_, gg, 4 * n, &err), &err);
        printf("  %s conversions: bit for bit\n", ht == DDP_FLOAT16 ? "fp16" : "bf16");
    }
    back = NULL;
    free(g), free(h), free(want16), free(gg);
    ddp__cuda_free(g_), ddp__cuda_free(h_);
}

/* fp16's range: what passes 65504 where the device stores fp16 becomes ±inf, never a clamped
 * 65504 (precision fp16's loss scaler must find it): the conversion and the kernels' own stores,
 * and cuBLAS's epilogue narrowing a product (the one rounding this file does not write). */
static void fp16_overflow(void **state)
{
    (void)state;
    ddp_error err = {0};
    const ddp_dtype ht = DDP_FLOAT16;
    /* a product: x's first row all 200, W's rows ±200, in 4: ±160000 per element; x's second
     * row all 1: ±800 */
    {
        const int B = 2, in = 4, out = 8;
        float x[8], W[32], y[16];
        for (int i = 0; i < 8; i++)
            x[i] = i < 4 ? 200.0f : 1.0f;
        for (int i = 0; i < 32; i++)
            W[i] = (i / in) % 2 ? 200.0f : -200.0f; /* row j of W: one sign */
        uint16_t *x_ = dev_h(ht, x, 8), *W_ = dev_h(ht, W, 32), *y_ = dev_h(ht, NULL, 16);
        ok(ddp__cuda_linear_forward_h(ctx, ht, x_, W_, NULL, B, in, out, y_, &err), &err);
        float *got = fetch_h_ld(ht, y_, 1, 16, 16);
        memcpy(y, got, sizeof y);
        for (int j = 0; j < out; j++) {
            if (!isinf(y[j]) || (y[j] > 0) != (j % 2 == 1))
                fail_msg("fp16 product element %d: %g, expected %sinf", j, y[j], j % 2 ? "+" : "-");
            if (y[out + j] != (j % 2 ? 800.0f : -800.0f))
                fail_msg("fp16 product element %d of row 2: %g", j, y[out + j]);
        }
        printf("  fp16 product beyond 65504: ±inf (cuBLAS's narrowing does not saturate)\n");
        free(got);
        ddp__cuda_free(x_), ddp__cuda_free(W_), ddp__cuda_free(y_);
    }
    /* a kernel's store (GELU of 70000 = 70000) and the loss's gradient scaled past the range */
    {
        float v[4] = {30000.0f, 65504.0f, 1.0f, -2.0f};
        uint16_t *x_ = dev_h(ht, v, 4), *y_ = dev_h(ht, NULL, 4);
        float *s_ = dev_from(NULL, 4 * sizeof(float)), a[4] = {40000.0f, 0, 0, 0};
        float *a_ = dev_from(a, sizeof a);
        ok(ddp__cuda_gelu_forward_h(ctx, ht, x_, 4, y_, &err), &err);
        ok(ddp__cuda_add_h(ctx, ht, a_, x_, 4, s_, &err), &err);
        float *got = fetch_h_ld(ht, y_, 1, 4, 4), *sum = fetch(s_, 4);
        assert_true(got[0] == 30000.0f && got[1] == 65504.0f);
        assert_true(sum[0] == 70000.0f); /* the residual stream is fp32: no overflow there */
        free(got), free(sum);
        ddp__cuda_free(x_), ddp__cuda_free(y_), ddp__cuda_free(s_), ddp__cuda_free(a_);
        const int N = 2, V = 5;
        float logits[10] = {0, 0, 0, 0, 0, 1, 2, 3, 4, 5};
        int32_t tg[2] = {1, 4};
        float *l_ = dev_from(logits, sizeof logits), *rl_ = dev_from(NULL, sizeof(float) * N);
        int32_t *tg_ = dev_from(tg, sizeof tg), *cor_ = dev_from(NULL, sizeof(int32_t) * N);
        /* scale 2^20 over count 2: row 0's target gradient (0.2 − 1) · 2^19 ≈ −419430 */
        ok(ddp__cuda_vocab_xent_hgrad(ctx, ht, l_, tg_, N, V, 1048576.0f, 2, rl_, cor_, true, &err),
           &err);
        float *d = fetch_h_ld(ht, l_, N, V, 2 * (size_t)V);
        assert_true(isinf(d[1]) && d[1] < 0); /* −419430: −inf */
        assert_true(isinf(d[0]) && d[0] > 0); /* 0.2 · 2^19 = 104858: +inf */
        printf("  fp16 loss gradient beyond 65504: ±inf\n");
        free(d);
        ddp__cuda_free(l_), ddp__cuda_free(rl_), ddp__cuda_free(tg_), ddp__cuda_free(cor_);
    }
}

static int setup(void **state)
{
    (void)state;
    ddp_error err = {0};
    if (ddp__cuda_ctx_create(0, &ctx, &err) != DDP_OK) {
        printf("context: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    ddp__cuda_ctx_destroy(ctx);
    return 0;
}

int main(void)
{
    ddp_test_gpus_or_skip("test_cuda_kernels");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm),
        cmocka_unit_test(linear),
        cmocka_unit_test(embedding),
        cmocka_unit_test(layernorm),
        cmocka_unit_test(elementwise),
        cmocka_unit_test(attention),
        cmocka_unit_test(flash),
        cmocka_unit_test(dropout_elementwise),
        cmocka_unit_test(vocab_xent),
        cmocka_unit_test(adamw),
        cmocka_unit_test(grads),
        cmocka_unit_test_prestate(layers_h, &bf16_dt),
        cmocka_unit_test_prestate(attention_h, &bf16_dt),
        cmocka_unit_test_prestate(flash_h, &bf16_dt),
        cmocka_unit_test_prestate(vocab_xent_h, &bf16_dt),
        cmocka_unit_test_prestate(layers_h, &fp16_dt),
        cmocka_unit_test_prestate(attention_h, &fp16_dt),
        cmocka_unit_test_prestate(flash_h, &fp16_dt),
        cmocka_unit_test_prestate(vocab_xent_h, &fp16_dt),
        cmocka_unit_test(fp16_overflow),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
