/*
 * test_nn.c — the layer kernels and optimizers of ddp/nn.h against references.
 *
 * Forward passes are checked against naive loops (direct convolution, not im2col; plain triple
 * loops, not sgemm). Every backward is checked against central finite differences of the float
 * forward: each input and parameter element is moved by ±H in float, the scalar
 * L = Σ y·r (r a fixed random weighting, so dL/dy = r) is summed in double, and
 * (L+ − L−) / (x+ − x−) must match the analytic gradient within
 *     |analytic − numeric| ≤ FD_RTOL · max(1, |analytic|)       (FD_RTOL = 1e-2).
 * Why that bound holds: float rounding of y moves L by about 6e-8 · Σ|y·r| ≈ 1e-6 for these
 * shapes, which the 2·H = 2e-3 step turns into ≈ 1e-3 at worst; the O(H²) truncation error is
 * far smaller for smooth layers, and ReLU/maxpool inputs are kept ≥ 20·H away from their kinks.
 * Parameter gradients are seeded with nonzero values first, to check that they accumulate.
 * Optimizers are checked over several steps against a naive double-precision transcription of
 * the update rules, within 1e-5 relative (float rounding over a few steps).
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
#include "nn_check.h"

/* ---- linear ---------------------------------------------------------------------------------- */

typedef struct {
    int B, in, out;
    float *x, *W, *b, *y, *r;
} lin_ctx;

static double lin_loss(void *p)
{
    lin_ctx *c = p;
    ddp_nn_linear_forward(c->x, c->W, c->b, c->B, c->in, c->out, c->y);
    return weighted_sum(c->y, c->r, (size_t)c->B * c->out);
}

static void linear_layer(void **state)
{
    (void)state;
    lin_ctx c = {3, 4, 5, NULL, NULL, NULL, NULL, NULL};
    size_t nx = 12, nw = 20, ny = 15;
    c.x = falloc(nx), c.W = falloc(nw), c.b = falloc(5), c.y = falloc(ny), c.r = falloc(ny);
    fill(c.x, nx, -1, 1, 1), fill(c.W, nw, -1, 1, 2), fill(c.b, 5, -1, 1, 3);
    fill(c.r, ny, -1, 1, 4);
    /* forward against a naive loop */
    double want[15];
    for (int i = 0; i < 3; i++)
        for (int o = 0; o < 5; o++) {
            double s = c.b[o];
            for (int k = 0; k < 4; k++)
                s += (double)c.x[i * 4 + k] * c.W[o * 4 + k];
            want[i * 5 + o] = s;
        }
    lin_loss(&c);
    assert_int_equal(compare("linear y", c.y, want, ny, 1e-6, 1e-6), 0);
    /* backward: seeded parameter gradients, then finite differences */
    float *dx = falloc(nx), *dW = falloc(nw), *db = falloc(5), *dW0 = falloc(nw), *db0 = falloc(5);
    fill(dW0, nw, -1, 1, 5), fill(db0, 5, -1, 1, 6);
    memcpy(dW, dW0, nw * 4), memcpy(db, db0, 5 * 4);
    fill(dx, nx, 7, 8, 7); /* garbage: dx must be overwritten */
    ddp_nn_linear_backward(c.r, c.x, c.W, 3, 4, 5, dx, dW, db);
    float *gW = minus(dW, dW0, nw), *gb = minus(db, db0, 5);
    int bad = check_fd("linear dx", lin_loss, &c, c.x, nx, dx);
    bad += check_fd("linear dW", lin_loss, &c, c.W, nw, gW);
    bad += check_fd("linear db", lin_loss, &c, c.b, 5, gb);
    assert_int_equal(bad, 0);
    /* NULL gradients are skipped; without a bias y is x·Wᵀ alone */
    ddp_nn_linear_backward(c.r, c.x, c.W, 3, 4, 5, NULL, NULL, NULL);
    float *b = c.b;
    c.b = NULL;
    lin_loss(&c);
    for (int i = 0; i < 3; i++)
        for (int o = 0; o < 5; o++)
            want[i * 5 + o] -= b[o];
    assert_int_equal(compare("linear y, no bias", c.y, want, ny, 1e-6, 1e-6), 0);
    free(c.x), free(c.W), free(b), free(c.y), free(c.r), free(dx), free(dW), free(db);
    free(dW0), free(db0), free(gW), free(gb);
}

/* ---- activations ----------------------------------------------------------------------------- */

typedef struct {
    size_t n;
    int kind; /* 0 relu, 1 gelu */
    float *x, *y, *r;
} act_ctx;

static double act_loss(void *p)
{
    act_ctx *c = p;
    (c->kind ? ddp_nn_gelu_forward : ddp_nn_relu_forward)(c->x, c->n, c->y);
    return weighted_sum(c->y, c->r, c->n);
}

static void activations(void **state)
{
    (void)state;
    enum { N = 64 };
    float x[N], y[N], r[N], dx[N];
    fill(x, N, -3, 3, 11), fill(r, N, -1, 1, 12);
    for (int i = 0; i < N; i++) /* keep ReLU inputs 20·H away from its kink */
        if (fabsf(x[i]) < 20 * H)
            x[i] = 0.5f;
    act_ctx c = {N, 0, x, y, r};
    for (c.kind = 0; c.kind < 2; c.kind++) {
        double want[N];
        act_loss(&c);
        for (int i = 0; i < N; i++)
            want[i] = c.kind ? 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0))) : fmax(x[i], 0.0);
        assert_int_equal(compare(c.kind ? "gelu y" : "relu y", y, want, N, 1e-7, 1e-6), 0);
        (c.kind ? ddp_nn_gelu_backward : ddp_nn_relu_backward)(r, x, N, dx);
        assert_int_equal(check_fd(c.kind ? "gelu dx" : "relu dx", act_loss, &c, x, N, dx), 0);
    }
    /* in place */
    float z[3] = {-1, 0, 2};
    ddp_nn_relu_forward(z, 3, z);
    assert_true(z[0] == 0 && z[1] == 0 && z[2] == 2);
    float g[3] = {5, 5, 5}, xi[3] = {-1, 0, 2};
    ddp_nn_relu_backward(g, xi, 3, g);
    assert_true(g[0] == 0 && g[1] == 0 && g[2] == 5); /* zero gradient at 0, like torch */
}

/* ---- dropout --------------------------------------------------------------------------------- */

static void dropout(void **state)
{
    (void)state;
    enum { N = 200000 };
    float *x = falloc(N), *y = falloc(N), *y2 = falloc(N), *dx = falloc(N);
    uint8_t *m = malloc(N), *m2 = malloc(N), *m3 = malloc(N);
    assert_true(m && m2 && m3);
    fill(x, N, -1, 1, 21);
    float p = 0.3f;
    ddp_nn_dropout_forward(x, N, p, 42, 7, 0, true, m, y);
    ddp_nn_dropout_forward(x, N, p, 42, 7, 0, true, m2, y2);
    assert_memory_equal(m, m2, N); /* same (seed, step) → same mask */
    assert_memory_equal(y, y2, N * sizeof(float));
    size_t kept = 0;
    for (size_t i = 0; i < N; i++) {
        kept += m[i];
        assert_true(m[i] <= 1);
        assert_true(y[i] == (m[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f));
    }
    /* rate: the kept fraction's standard deviation is sqrt(p(1−p)/N) ≈ 0.001; allow 0.006 */
    double rate = 1.0 - (double)kept / N;
    assert_true(fabs(rate - p) < 0.006);
    /* another step or seed → another mask (identical ones would be a 2^-200000 event) */
    ddp_nn_dropout_forward(x, N, p, 42, 8, 0, true, m2, y2);
    assert_true(memcmp(m, m2, N) != 0);
    ddp_nn_dropout_forward(x, N, p, 43, 7, 0, true, m2, y2);
    assert_true(memcmp(m, m2, N) != 0);
    /* the decision for an element depends only on offset + i: a shard at offset 1000 matches */
    ddp_nn_dropout_forward(x + 1000, 5000, p, 42, 7, 1000, true, m3, y2);
    assert_memory_equal(m3, m + 1000, 5000);
    /* backward: dy · mask / (1 − p), in place too */
    ddp_nn_dropout_backward(x, m, N, p, true, dx);
    for (size_t i = 0; i < N; i++)
        assert_true(dx[i] == (m[i] ? x[i] * (1.0f / (1.0f - p)) : 0.0f));
    memcpy(dx, x, N * sizeof(float));
    ddp_nn_dropout_backward(dx, m, N, p, true, dx);
    assert_memory_equal(dx, y, N * sizeof(float));
    /* eval mode is the identity, mask untouched (NULL allowed) */
    ddp_nn_dropout_forward(x, N, p, 42, 7, 0, false, NULL, y);
    assert_memory_equal(x, y, N * sizeof(float));
    ddp_nn_dropout_backward(x, NULL, N, p, false, dx);
    assert_memory_equal(x, dx, N * sizeof(float));
    /* p = 0 keeps all, p = 1 drops all */
    ddp_nn_dropout_forward(x, 100, 0.0f, 1, 1, 0, true, m, y);
    for (int i = 0; i < 100; i++)
        assert_true(m[i] == 1 && y[i] == x[i]);
    ddp_nn_dropout_forward(x, 100, 1.0f, 1, 1, 0, true, m, y);
    for (int i = 0; i < 100; i++)
        assert_true(m[i] == 0 && y[i] == 0.0f);
    free(x), free(y), free(y2), free(dx), free(m), free(m2), free(m3);
}

/* ---- conv2d ---------------------------------------------------------------------------------- */

typedef struct {
    ddp_nn_conv2d g;
    int B;
    float *x, *W, *b, *y, *r, *scratch;
} conv_ctx;

static double conv_loss(void *p)
{
    conv_ctx *c = p;
    ddp_nn_conv2d_forward(&c->g, c->x, c->W, c->b, c->B, c->scratch, c->y);
    return weighted_sum(c->y, c->r, (size_t)c->B * c->g.out_ch * c->g.out_h * c->g.out_w);
}

static void conv_case(int B, int cin, int h, int w, int cout, int kh, int kw, int stride, int pad)
{
    conv_ctx c = {{cin, h, w, cout, kh, kw, stride, pad, 0, 0, 0}, B, 0, 0, 0, 0, 0, 0};
    assert_int_equal(ddp_nn_conv2d_setup(&c.g, NULL), DDP_OK);
    int oh = c.g.out_h, ow = c.g.out_w;
    assert_int_equal(oh, (h + 2 * pad - kh) / stride + 1);
    assert_int_equal(ow, (w + 2 * pad - kw) / stride + 1);
    size_t nx = (size_t)B * cin * h * w, nw = (size_t)cout * cin * kh * kw;
    size_t ny = (size_t)B * cout * oh * ow;
    c.x = falloc(nx), c.W = falloc(nw), c.b = falloc(cout), c.y = falloc(ny), c.r = falloc(ny);
    c.scratch = falloc(c.g.scratch_floats);
    fill(c.x, nx, -1, 1, 31), fill(c.W, nw, -1, 1, 32), fill(c.b, cout, -1, 1, 33);
    fill(c.r, ny, -1, 1, 34);
    /* forward against direct convolution */
    double *want = calloc(ny, sizeof(double));
    assert_non_null(want);
    for (int n = 0; n < B; n++)
        for (int o = 0; o < cout; o++)
            for (int i = 0; i < oh; i++)
                for (int j = 0; j < ow; j++) {
                    double s = c.b[o];
                    for (int ci = 0; ci < cin; ci++)
                        for (int a = 0; a < kh; a++)
                            for (int e = 0; e < kw; e++) {
                                int ih = i * stride - pad + a, iw = j * stride - pad + e;
                                if (ih >= 0 && ih < h && iw >= 0 && iw < w)
                                    s += (double)c.x[((size_t)(n * cin + ci) * h + ih) * w + iw] *
                                         c.W[((size_t)(o * cin + ci) * kh + a) * kw + e];
                            }
                    want[((size_t)(n * cout + o) * oh + i) * ow + j] = s;
                }
    conv_loss(&c);
    assert_int_equal(compare("conv y", c.y, want, ny, 1e-5, 1e-5), 0);
    float *dx = falloc(nx), *dW = falloc(nw), *db = falloc(cout), *dW0 = falloc(nw);
    float *db0 = falloc(cout);
    fill(dW0, nw, -1, 1, 35), fill(db0, cout, -1, 1, 36), fill(dx, nx, 5, 6, 37);
    memcpy(dW, dW0, nw * 4), memcpy(db, db0, (size_t)cout * 4);
    ddp_nn_conv2d_backward(&c.g, c.r, c.x, c.W, B, c.scratch, dx, dW, db);
    float *gW = minus(dW, dW0, nw), *gb = minus(db, db0, (size_t)cout);
    int bad = check_fd("conv dx", conv_loss, &c, c.x, nx, dx);
    bad += check_fd("conv dW", conv_loss, &c, c.W, nw, gW);
    bad += check_fd("conv db", conv_loss, &c, c.b, (size_t)cout, gb);
    assert_int_equal(bad, 0);
    /* dx alone (dW, db NULL) gives the same dx */
    float *dx2 = falloc(nx);
    ddp_nn_conv2d_backward(&c.g, c.r, c.x, c.W, B, c.scratch, dx2, NULL, NULL);
    assert_memory_equal(dx, dx2, nx * 4);
    free(c.x), free(c.W), free(c.b), free(c.y), free(c.r), free(c.scratch), free(want);
    free(dx), free(dW), free(db), free(dW0), free(db0), free(gW), free(gb), free(dx2);
}

static void conv2d(void **state)
{
    (void)state;
    conv_case(2, 2, 5, 6, 3, 3, 3, 2, 1); /* stride 2, padding 1, odd sizes */
    conv_case(2, 3, 4, 4, 2, 3, 2, 1, 0); /* no padding, non-square kernel */
    conv_case(1, 1, 3, 3, 2, 1, 1, 1, 0); /* 1x1 */
    conv_case(1, 2, 3, 3, 1, 3, 3, 1, 2); /* padding larger than needed */
}

static void conv2d_bad_geometry(void **state)
{
    (void)state;
    ddp_error err = {0};
    ddp_nn_conv2d g = {3, 4, 4, 8, 5, 5, 1, 0, -7, -7, 7};
    assert_int_equal(ddp_nn_conv2d_setup(&g, &err), DDP_ERR_INVALID); /* 5x5 kernel on 4x4 */
    assert_non_null(strstr(err.msg, "larger than the padded input"));
    assert_int_equal(g.out_h, -7); /* unchanged on failure */
    g.pad = 1;
    assert_int_equal(ddp_nn_conv2d_setup(&g, &err), DDP_OK); /* fits once padded */
    assert_int_equal(g.out_h, 2);
    g.stride = 0;
    assert_int_equal(ddp_nn_conv2d_setup(&g, &err), DDP_ERR_INVALID);
    g.stride = 1, g.in_ch = -1;
    assert_int_equal(ddp_nn_conv2d_setup(&g, NULL), DDP_ERR_INVALID);
    g.in_ch = 1 << 20, g.h = 1 << 10, g.w = 1 << 10, g.pad = 0, g.kh = g.kw = 1;
    assert_int_equal(ddp_nn_conv2d_setup(&g, &err), DDP_ERR_INVALID); /* too large for int */
}

/* ---- maxpool2d ------------------------------------------------------------------------------- */

typedef struct {
    ddp_nn_pool2d g;
    int B;
    float *x, *y, *r;
    int32_t *arg;
} pool_ctx;

static double pool_loss(void *p)
{
    pool_ctx *c = p;
    ddp_nn_maxpool2d_forward(&c->g, c->x, c->B, c->y, c->arg);
    return weighted_sum(c->y, c->r, (size_t)c->B * c->g.ch * c->g.out_h * c->g.out_w);
}

static void maxpool2d(void **state)
{
    (void)state;
    int geo[3][2] = {{2, 2}, {3, 2}, {2, 1}}; /* kernel, stride: plain, overlapping, sliding */
    for (int t = 0; t < 3; t++) {
        pool_ctx c = {{2, 5, 6, geo[t][0], geo[t][1], 0, 0}, 2, 0, 0, 0, 0};
        assert_int_equal(ddp_nn_maxpool2d_setup(&c.g, NULL), DDP_OK);
        size_t nx = 2 * 2 * 5 * 6, ny = (size_t)2 * 2 * c.g.out_h * c.g.out_w;
        c.x = falloc(nx), c.y = falloc(ny), c.r = falloc(ny);
        c.arg = calloc(ny, sizeof(int32_t));
        /* distinct values 0.05 apart (≫ 2·H), shuffled: no ties, FD never crosses a switch */
        for (size_t i = 0; i < nx; i++)
            c.x[i] = 0.05f * (float)((i * 37) % nx);
        fill(c.r, ny, -1, 1, 41);
        pool_loss(&c);
        double *want = calloc(ny, sizeof(double));
        for (size_t pl = 0; pl < 4; pl++)
            for (int i = 0; i < c.g.out_h; i++)
                for (int j = 0; j < c.g.out_w; j++) {
                    double m = -INFINITY;
                    for (int a = 0; a < c.g.kernel; a++)
                        for (int e = 0; e < c.g.kernel; e++)
                            m = fmax(m, c.x[pl * 30 + (size_t)(i * c.g.stride + a) * 6 +
                                            (size_t)(j * c.g.stride + e)]);
                    want[(pl * c.g.out_h + i) * c.g.out_w + j] = m;
                }
        assert_int_equal(compare("maxpool y", c.y, want, ny, 0, 0), 0);
        float *dx = falloc(nx);
        ddp_nn_maxpool2d_backward(&c.g, c.r, c.arg, 2, dx);
        assert_int_equal(check_fd("maxpool dx", pool_loss, &c, c.x, nx, dx), 0);
        free(c.x), free(c.y), free(c.r), free(c.arg), free(want), free(dx);
    }
    /* ties: the first maximum, like torch */
    ddp_nn_pool2d g = {1, 2, 2, 2, 2, 0, 0};
    assert_int_equal(ddp_nn_maxpool2d_setup(&g, NULL), DDP_OK);
    float x[4] = {1, 3, 3, 0}, y;
    int32_t a;
    ddp_nn_maxpool2d_forward(&g, x, 1, &y, &a);
    assert_true(y == 3 && a == 1);
    ddp_error err = {0};
    g.kernel = 3;
    assert_int_equal(ddp_nn_maxpool2d_setup(&g, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "kernel"));
}

/* The 2×2 / stride-2 path (vectorised four outputs at a time, then a scalar tail) against the
 * rule written out: the first maximum in row-major window order wins, a NaN wins over numbers,
 * the first NaN over later ones. Small integers make ties common; NaNs and infinities appear. */
static void maxpool2d_fast_path(void **state)
{
    (void)state;
    enum { PB = 2, PC = 3, PH = 6, PW = 22 };
    ddp_nn_pool2d g = {PC, PH, PW, 2, 2, 0, 0};
    assert_int_equal(ddp_nn_maxpool2d_setup(&g, NULL), DDP_OK);
    assert_int_equal(g.out_w, 11); /* two blocks of four and a tail of three */
    size_t nx = (size_t)PB * PC * PH * PW, ny = (size_t)PB * PC * g.out_h * g.out_w;
    float *x = falloc(nx), *y = falloc(ny);
    int32_t *arg = calloc(ny, sizeof(int32_t));
    uint64_t r = 12345;
    for (size_t i = 0; i < nx; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        unsigned k = (unsigned)(r >> 33) % 16;
        x[i] = k == 0 ? NAN : k == 1 ? -INFINITY : k == 2 ? INFINITY : (float)(k % 4) - 1.5f;
    }
    ddp_nn_maxpool2d_forward(&g, x, PB, y, arg);
    for (size_t pl = 0; pl < (size_t)PB * PC; pl++)
        for (int i = 0; i < g.out_h; i++)
            for (int j = 0; j < g.out_w; j++) {
                const float *xp = x + pl * PH * PW;
                int best = 2 * i * PW + 2 * j;
                int cand[4] = {best, best + 1, best + PW, best + PW + 1};
                for (int k = 1; k < 4; k++) {
                    float v = xp[cand[k]], m = xp[best];
                    if (v > m || (isnan(v) && !isnan(m)))
                        best = cand[k];
                }
                size_t o = (pl * g.out_h + i) * g.out_w + j;
                assert_int_equal(arg[o], best);
                assert_memory_equal(&y[o], &xp[best], sizeof(float));
            }
    free(x), free(y), free(arg);
}

/* ---- batchnorm ------------------------------------------------------------------------------- */

typedef struct {
    int B, C, hw;
    bool train;
    float *x, *gamma, *beta, *rm, *rv, *y, *r, *sm, *si;
} bn_ctx;

static double bn_loss(void *p)
{
    bn_ctx *c = p;
    /* fresh copies of the running statistics: the FD evaluations must not drift them */
    float rm[8], rv[8];
    memcpy(rm, c->rm, (size_t)c->C * 4), memcpy(rv, c->rv, (size_t)c->C * 4);
    assert_int_equal(ddp_nn_batchnorm_forward(c->x, c->B, c->C, c->hw, c->gamma, c->beta, 0.1f,
                                              1e-5f, c->train, rm, rv, c->y, c->sm, c->si, NULL),
                     DDP_OK);
    return weighted_sum(c->y, c->r, (size_t)c->B * c->C * c->hw);
}

static void bn_case(int B, int C, int hw, bool train)
{
    bn_ctx c = {B, C, hw, train, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t n = (size_t)B * C * hw;
    c.x = falloc(n), c.y = falloc(n), c.r = falloc(n), c.gamma = falloc(C), c.beta = falloc(C);
    c.rm = falloc(C), c.rv = falloc(C), c.sm = falloc(C), c.si = falloc(C);
    fill(c.x, n, -2, 3, 51), fill(c.r, n, -1, 1, 52), fill(c.gamma, C, 0.5f, 1.5f, 53);
    fill(c.beta, C, -1, 1, 54), fill(c.rm, C, -0.5f, 0.5f, 55), fill(c.rv, C, 0.5f, 2, 56);
    /* forward and running statistics against a naive computation */
    float rm[8], rv[8];
    memcpy(rm, c.rm, (size_t)C * 4), memcpy(rv, c.rv, (size_t)C * 4);
    assert_int_equal(ddp_nn_batchnorm_forward(c.x, B, C, hw, c.gamma, c.beta, 0.1f, 1e-5f, train,
                                              rm, rv, c.y, c.sm, c.si, NULL),
                     DDP_OK);
    double *want = calloc(n, sizeof(double));
    for (int ch = 0; ch < C; ch++) {
        double s = 0, ss = 0, N = (double)B * hw;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < hw; i++)
                s += c.x[((size_t)b * C + ch) * hw + i];
        double mean = s / N;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < hw; i++)
                ss += pow(c.x[((size_t)b * C + ch) * hw + i] - mean, 2);
        double var = ss / N, m = mean, v = var;
        if (train) {
            assert_float_equal(rm[ch], 0.9 * c.rm[ch] + 0.1 * mean, 1e-6);
            assert_float_equal(rv[ch], 0.9 * c.rv[ch] + 0.1 * ss / (N - 1), 1e-6); /* unbiased */
        } else {
            m = c.rm[ch], v = c.rv[ch];
            assert_true(rm[ch] == c.rm[ch] && rv[ch] == c.rv[ch]); /* eval leaves them */
        }
        for (int b = 0; b < B; b++)
            for (int i = 0; i < hw; i++) {
                size_t k = ((size_t)b * C + ch) * hw + i;
                want[k] = (c.x[k] - m) / sqrt(v + 1e-5) * c.gamma[ch] + c.beta[ch];
            }
    }
    assert_int_equal(compare("batchnorm y", c.y, want, n, 1e-5, 1e-5), 0);
    /* backward against finite differences (through the batch statistics in train mode) */
    float *dx = falloc(n), *dg = falloc(C), *dbt = falloc(C), *dg0 = falloc(C), *db0 = falloc(C);
    fill(dg0, C, -1, 1, 57), fill(db0, C, -1, 1, 58);
    memcpy(dg, dg0, (size_t)C * 4), memcpy(dbt, db0, (size_t)C * 4);
    ddp_nn_batchnorm_backward(c.r, c.x, B, C, hw, c.gamma, c.sm, c.si, train, dx, dg, dbt);
    float *gg = minus(dg, dg0, C), *gb = minus(dbt, db0, C);
    int bad = check_fd("batchnorm dx", bn_loss, &c, c.x, n, dx);
    bad += check_fd("batchnorm dgamma", bn_loss, &c, c.gamma, C, gg);
    bad += check_fd("batchnorm dbeta", bn_loss, &c, c.beta, C, gb);
    assert_int_equal(bad, 0);
    free(c.x), free(c.y), free(c.r), free(c.gamma), free(c.beta), free(c.rm), free(c.rv);
    free(c.sm), free(c.si), free(want), free(dx), free(dg), free(dbt), free(dg0), free(db0);
    free(gg), free(gb);
}

static void batchnorm(void **state)
{
    (void)state;
    bn_case(6, 3, 1, true);  /* (B, C): BatchNorm1d */
    bn_case(3, 2, 6, true);  /* (B, C, H, W): BatchNorm2d */
    bn_case(6, 3, 1, false); /* eval mode */
    bn_case(2, 4, 3, false);
    /* running statistics over several steps: running = 0.9·running + 0.1·batch from (0, 1) */
    float x[4] = {1, 2, 3, 6}, g = 1, b = 0, rm = 0, rv = 1, y[4], sm, si;
    for (int s = 0; s < 3; s++)
        assert_int_equal(ddp_nn_batchnorm_forward(x, 4, 1, 1, &g, &b, 0.1f, 1e-5f, true, &rm, &rv,
                                                  y, &sm, &si, NULL),
                         DDP_OK);
    double f = pow(0.9, 3); /* batch mean 3, unbiased variance 14/3 */
    assert_float_equal(rm, 3 * (1 - f), 1e-6);
    assert_float_equal(rv, f * 1 + (14.0 / 3) * (1 - f), 1e-6);
    /* one value per channel cannot be normalised in training mode */
    ddp_error err = {0};
    float rm1 = 5;
    assert_int_equal(ddp_nn_batchnorm_forward(x, 1, 1, 1, &g, &b, 0.1f, 1e-5f, true, &rm1, &rv, y,
                                              &sm, &si, &err),
                     DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "at least 2 values"));
    assert_true(rm1 == 5);
}

/* ---- softmax cross-entropy ------------------------------------------------------------------- */

typedef struct {
    int B, C;
    float *logits;
    int32_t *labels;
} ce_ctx;

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    double loss = -1;
    assert_int_equal(
        ddp_nn_softmax_xent(c->logits, c->labels, c->B, c->C, 1.0f, &loss, NULL, NULL, NULL),
        DDP_OK);
    return loss;
}

static void softmax_xent(void **state)
{
    (void)state;
    enum { B = 5, C = 7 };
    float logits[B * C], d[B * C], d2[B * C];
    int32_t labels[B] = {0, 6, 3, 3, 1};
    fill(logits, B * C, -4, 4, 61);
    logits[0 * C + 0] = 9;   /* row 0: label is the argmax */
    logits[1 * C + 2] = 9;   /* row 1: it is not */
    logits[2 * C + 3] = 100; /* row 2: large logit, no overflow */
    ce_ctx c = {B, C, logits, labels};
    double loss, want = 0;
    int correct = -1, want_correct = 0;
    assert_int_equal(ddp_nn_softmax_xent(logits, labels, B, C, 1.0f, &loss, d, &correct, NULL),
                     DDP_OK);
    for (int r = 0; r < B; r++) {
        double mx = -INFINITY, s = 0;
        int arg = 0;
        for (int j = 0; j < C; j++)
            if (logits[r * C + j] > mx)
                mx = logits[r * C + j], arg = j;
        for (int j = 0; j < C; j++)
            s += exp(logits[r * C + j] - mx);
        want += (mx + log(s) - logits[r * C + labels[r]]) / B;
        want_correct += arg == labels[r];
    }
    assert_float_equal(loss, want, 1e-12 + 1e-12 * fabs(want));
    /* dlogits in closed form, (softmax − onehot) / B, to float rounding */
    double dwant[B * C];
    for (int r = 0; r < B; r++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < C; j++)
            mx = fmax(mx, logits[r * C + j]);
        for (int j = 0; j < C; j++)
            s += exp(logits[r * C + j] - mx);
        for (int j = 0; j < C; j++)
            dwant[r * C + j] = (exp(logits[r * C + j] - mx) / s - (j == labels[r])) / B;
    }
    assert_int_equal(compare("xent dlogits", d, dwant, B * C, 1e-8, 1e-6), 0);
    assert_int_equal(correct, want_correct);
    assert_true(isfinite(loss));
    /* dlogits against finite differences of the mean loss itself */
    assert_int_equal(check_fd("xent dlogits", ce_loss, &c, logits, B * C, d), 0);
    /* the accumulation scale multiplies the gradient and nothing else */
    double loss2;
    assert_int_equal(ddp_nn_softmax_xent(logits, labels, B, C, 0.25f, &loss2, d2, NULL, NULL),
                     DDP_OK);
    assert_true(loss2 == loss);
    for (int i = 0; i < B * C; i++)
        assert_float_equal(d2[i], 0.25 * d[i], 1e-9);
    /* a bad label: an error, and nothing written */
    labels[4] = C;
    ddp_error err = {0};
    loss2 = 123, correct = -5;
    memcpy(d2, d, sizeof d);
    assert_int_equal(ddp_nn_softmax_xent(logits, labels, B, C, 1.0f, &loss2, d2, &correct, &err),
                     DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "label 7 of row 4"));
    assert_true(loss2 == 123 && correct == -5);
    assert_memory_equal(d, d2, sizeof d);
}

/* ---- optimizers ------------------------------------------------------------------------------ */

static void sgd(void **state)
{
    (void)state;
    enum { N = 50, STEPS = 6 };
    float cfg[3][3] = {{0.1f, 0.9f, 1e-2f}, {0.05f, 0.0f, 0.0f}, {0.2f, 0.5f, 0.0f}};
    for (int k = 0; k < 3; k++) {
        float lr = cfg[k][0], mom = cfg[k][1], wd = cfg[k][2];
        float p[N], g[N], buf[N];
        double rp[N], rbuf[N];
        fill(p, N, -1, 1, 71);
        fill(buf, N, 9, 10, 72); /* garbage: step 1 must not read it */
        for (int i = 0; i < N; i++)
            rp[i] = p[i];
        for (int s = 1; s <= STEPS; s++) {
            fill(g, N, -1, 1, 100 + s);
            ddp_nn_sgd_step(p, g, mom != 0 ? buf : NULL, N, lr, mom, wd, (uint64_t)s);
            for (int i = 0; i < N; i++) { /* the rule as torch documents it */
                double d = g[i] + (double)wd * rp[i];
                if (mom != 0) {
                    rbuf[i] = s == 1 ? d : (double)mom * rbuf[i] + d;
                    d = rbuf[i];
                }
                rp[i] -= (double)lr * d;
            }
        }
        assert_int_equal(compare("sgd p", p, rp, N, 1e-6, 1e-5), 0);
        if (mom != 0)
            assert_int_equal(compare("sgd buf", buf, rbuf, N, 1e-6, 1e-5), 0);
    }
}

static void adamw(void **state)
{
    (void)state;
    enum { N = 50, STEPS = 8 };
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    fill(p, N, -1, 1, 81);
    for (int i = 0; i < N; i++)
        rp[i] = p[i];
    for (int s = 1; s <= STEPS; s++) {
        fill(g, N, -1, 1, 200 + s);
        if (s == 3)
            g[0] = 0; /* a zero gradient: eps keeps the denominator positive */
        ddp_nn_adamw_step(p, g, m, v, N, lr, b1, b2, eps, wd, (uint64_t)s);
        for (int i = 0; i < N; i++) {
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            double mhat = rm[i] / (1.0 - pow(b1, s)), vhat = rv[i] / (1.0 - pow(b2, s));
            rp[i] -= lr * mhat / (sqrt(vhat) + eps);
        }
    }
    assert_int_equal(compare("adamw p", p, rp, N, 1e-6, 1e-5), 0);
    assert_int_equal(compare("adamw m", m, rm, N, 1e-7, 1e-5), 0);
    assert_int_equal(compare("adamw v", v, rv, N, 1e-9, 1e-5), 0);
}

static void clip_grad_norm(void **state)
{
    (void)state;
    float a[10], b[3], c[1];
    fill(a, 10, -1, 1, 91), fill(b, 3, -2, 2, 92), c[0] = 3;
    float *gs[3] = {a, b, c};
    size_t counts[3] = {10, 3, 1};
    double ss = 0;
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < counts[k]; i++)
            ss += (double)gs[k][i] * gs[k][i];
    float a0[10], b0[3], c0 = c[0];
    memcpy(a0, a, sizeof a), memcpy(b0, b, sizeof b);
    /* below the limit: the norm, and nothing changes */
    double norm = ddp_nn_clip_grad_norm(gs, counts, 3, sqrt(ss) + 1);
    assert_float_equal(norm, sqrt(ss), 1e-12);
    assert_memory_equal(a, a0, sizeof a);
    assert_true(c[0] == c0);
    /* above: every array scaled by max / (norm + 1e-6), the norm returned is the one before */
    norm = ddp_nn_clip_grad_norm(gs, counts, 3, 1.0);
    assert_float_equal(norm, sqrt(ss), 1e-12);
    double f = 1.0 / (sqrt(ss) + 1e-6), after = 0;
    for (int i = 0; i < 10; i++)
        assert_float_equal(a[i], a0[i] * f, 1e-7);
    for (int i = 0; i < 3; i++)
        assert_float_equal(b[i], b0[i] * f, 1e-7);
    assert_float_equal(c[0], c0 * f, 1e-7);
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < counts[k]; i++)
            after += (double)gs[k][i] * gs[k][i];
    assert_float_equal(sqrt(after), 1.0, 1e-5);
    /* no arrays: norm 0 */
    assert_true(ddp_nn_clip_grad_norm(NULL, NULL, 0, 1.0) == 0.0);
}

/* ---- initialisation -------------------------------------------------------------------------- */

static void init(void **state)
{
    (void)state;
    enum { N = 100000 };
    float *w = falloc(N), *w2 = falloc(N);
    ddp_nn_init_kaiming_uniform(w, N, 25, 7, 3); /* bound 1/5 */
    double s = 0, ss = 0;
    for (int i = 0; i < N; i++) {
        assert_true(w[i] >= -0.2f && w[i] < 0.2f);
        s += w[i], ss += (double)w[i] * w[i];
    }
    /* U(−0.2, 0.2): mean 0 (sd 0.2/sqrt(3N) ≈ 4e-4), variance 0.04/3 */
    assert_true(fabs(s / N) < 3e-3);
    assert_float_equal(ss / N, 0.04 / 3, 3e-4);
    /* deterministic, and independent of call order: a tensor's values depend on (seed, id) */
    ddp_nn_init_kaiming_uniform(w2, N, 25, 7, 9);
    ddp_nn_init_kaiming_uniform(w2, N, 25, 7, 3);
    assert_memory_equal(w, w2, N * sizeof(float));
    ddp_nn_init_kaiming_uniform(w2, N, 25, 7, 4);
    assert_true(memcmp(w, w2, N * sizeof(float)) != 0);
    ddp_nn_init_kaiming_uniform(w2, N, 25, 8, 3);
    assert_true(memcmp(w, w2, N * sizeof(float)) != 0);
    /* a prefix is the same tensor's first values */
    ddp_nn_init_kaiming_uniform(w2, 10, 25, 7, 3);
    assert_memory_equal(w, w2, 10 * sizeof(float));
    assert_true(ddp_nn_rand_u64(1, 2, 3) != ddp_nn_rand_u64(1, 3, 2));
    assert_true(ddp_nn_rand_u64(1, 2, 3) != ddp_nn_rand_u64(2, 1, 3));
    free(w), free(w2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(linear_layer),
        cmocka_unit_test(activations),
        cmocka_unit_test(dropout),
        cmocka_unit_test(conv2d),
        cmocka_unit_test(conv2d_bad_geometry),
        cmocka_unit_test(maxpool2d),
        cmocka_unit_test(maxpool2d_fast_path),
        cmocka_unit_test(batchnorm),
        cmocka_unit_test(softmax_xent),
        cmocka_unit_test(sgd),
        cmocka_unit_test(adamw),
        cmocka_unit_test(clip_grad_norm),
        cmocka_unit_test(init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
