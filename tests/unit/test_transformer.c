/*
 * test_transformer.c — the GPT-2 layers of ddp/nn.h (embedding, layernorm, tanh GELU, residual
 * add, causal attention, tied LM head, vocabulary cross-entropy, normal init) against references.
 *
 * Forward passes are checked against naive double-precision loops (attention: the whole T×T
 * softmax per head, written out). Every backward is checked against central finite differences
 * of the float forward, as in test_nn.c: each element is moved by ±H, L = Σ y·r (r fixed random
 * weights, so dL/dy = r) is summed in double, and (L+ − L−) / (x+ − x−) must match the analytic
 * gradient within FD_RTOL · max(1, |analytic|) (FD_RTOL = 1e-2: float rounding of y moves L by
 * ≈ 1e-6 here, which the 2·H = 2e-3 step turns into ≈ 1e-3 at worst; the layers are smooth, so
 * the O(H²) truncation is far smaller). Parameter gradients are seeded with nonzero values first,
 * to check that they accumulate. The vectorised exp behind the softmaxes and GELU is checked on
 * its own, in ulps, over its whole range.
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
#include "nn/bf16h.h"
#include "nn/vecmath.h"
#include "util/half.h"
#include "nn_check.h"

/* ---- the vectorised exp ---------------------------------------------------------------------- */

static void fast_exp(void **state)
{
    (void)state;
    /* Every 1009th float in [−87.3, 88.3] (2 million), walked through their bit patterns, in
     * ulps of the float nearest the true value. */
    double worst = 0.0;
    const float ends[2] = {88.3f, -87.3f};
    for (int sign = 0; sign < 2; sign++) {
        uint32_t top;
        memcpy(&top, &ends[sign], sizeof top);
        for (uint32_t bits = sign ? 0x80000000u : 0u; bits <= top; bits += 1009) {
            float x;
            memcpy(&x, &bits, sizeof x);
            double want = exp((double)x);
            float w = (float)want;
            double ulp = (double)nextafterf(w, INFINITY) - w;
            double e = fabs(ddp__fast_expf(x) - want) / ulp;
            worst = e > worst ? e : worst;
        }
    }
    print_message("fast exp: worst error %.3f ulp\n", worst);
    assert_true(worst <= 2.0);
    /* The edges: 0 below the range, −inf → 0, NaN → NaN, +inf → inf, exact 1 at 0. */
    assert_true(ddp__fast_expf(-88.0f) == 0.0f && ddp__fast_expf(-INFINITY) == 0.0f);
    assert_true(isnan(ddp__fast_expf(NAN)));
    assert_true(isinf(ddp__fast_expf(INFINITY)));
    assert_true(ddp__fast_expf(0.0f) == 1.0f);
}

/* ---- embedding ------------------------------------------------------------------------------- */

typedef struct {
    int B, T, C, V, P;
    const int32_t *idx;
    float *wte, *wpe, *x, *r;
} emb_ctx;

static double emb_loss(void *p)
{
    emb_ctx *c = p;
    assert_int_equal(
        ddp_nn_embedding_forward(c->idx, c->wte, c->wpe, c->B, c->T, c->C, c->V, c->P, c->x, NULL),
        DDP_OK);
    return weighted_sum(c->x, c->r, (size_t)c->B * c->T * c->C);
}

static void embedding(void **state)
{
    (void)state;
    enum { B = 2, T = 4, C = 3, V = 6, P = 5 };
    int32_t idx[B * T] = {1, 5, 1, 0, 2, 2, 3, 1}; /* repeats: their gradients add */
    float wte[V * C], wpe[P * C], x[B * T * C], r[B * T * C];
    fill(wte, V * C, -1, 1, 1), fill(wpe, P * C, -1, 1, 2), fill(r, B * T * C, -1, 1, 3);
    emb_ctx c = {B, T, C, V, P, idx, wte, wpe, x, r};
    emb_loss(&c);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++)
                assert_true(x[(b * T + t) * C + k] == wte[idx[b * T + t] * C + k] + wpe[t * C + k]);
    float dwte0[V * C], dwpe0[P * C], dwte[V * C], dwpe[P * C];
    fill(dwte0, V * C, -1, 1, 4), fill(dwpe0, P * C, -1, 1, 5);
    memcpy(dwte, dwte0, sizeof dwte), memcpy(dwpe, dwpe0, sizeof dwpe);
    ddp_nn_embedding_backward(r, idx, B, T, C, dwte, dwpe);
    float *gte = minus(dwte, dwte0, V * C), *gpe = minus(dwpe, dwpe0, P * C);
    int bad = check_fd("embedding dwte", emb_loss, &c, wte, V * C, gte);
    bad += check_fd("embedding dwpe", emb_loss, &c, wpe, P * C, gpe);
    assert_int_equal(bad, 0);
    /* token 4 never occurs, position 4 is beyond T: their rows are untouched */
    for (int k = 0; k < C; k++)
        assert_true(gte[4 * C + k] == 0.0f && gpe[4 * C + k] == 0.0f);
    ddp_nn_embedding_backward(r, idx, B, T, C, NULL, NULL); /* NULL skips */
    free(gte), free(gpe);

    /* a bad id, negative or ≥ V: an error naming it, its place and V; nothing written */
    ddp_error err = {0};
    float before[B * T * C];
    memcpy(before, x, sizeof x);
    idx[6] = V;
    assert_int_equal(ddp_nn_embedding_forward(idx, wte, wpe, B, T, C, V, P, x, &err),
                     DDP_ERR_INVALID);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "token id 6 at (row 1, position 2)"));
    assert_non_null(strstr(err.msg, "vocab_size 6"));
    idx[6] = -3;
    assert_int_equal(ddp_nn_embedding_forward(idx, wte, wpe, B, T, C, V, P, x, &err),
                     DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "token id -3"));
    assert_memory_equal(x, before, sizeof x);
    idx[6] = 0;
    /* T longer than the position table */
    assert_int_equal(ddp_nn_embedding_forward(idx, wte, wpe, 1, 8, C, V, P, x, &err),
                     DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "sequence length 8"));
    assert_int_equal(ddp_nn_embedding_forward(idx, wte, wpe, B, T, C, V, P, x, NULL), DDP_OK);
}

/* ---- layernorm ------------------------------------------------------------------------------- */

typedef struct {
    int N, C;
    float *x, *w, *b, *y, *r;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    ddp_nn_layernorm_forward(c->x, c->w, c->b, c->N, c->C, 1e-5f, c->y, NULL, NULL);
    return weighted_sum(c->y, c->r, (size_t)c->N * c->C);
}

static void ln_case(int N, int C, bool bias, float shift)
{
    size_t n = (size_t)N * C;
    ln_ctx c = {N, C, falloc(n), falloc(C), bias ? falloc(C) : NULL, falloc(n), falloc(n)};
    fill(c.x, n, shift - 2, shift + 2, 11), fill(c.w, C, 0.5f, 1.5f, 12), fill(c.r, n, -1, 1, 13);
    if (bias)
        fill(c.b, C, -1, 1, 14);
    float *mean = falloc(N), *rstd = falloc(N);
    ddp_nn_layernorm_forward(c.x, c.w, c.b, N, C, 1e-5f, c.y, mean, rstd);
    double *want = calloc(n, sizeof(double));
    assert_non_null(want);
    for (int i = 0; i < N; i++) {
        double mu = 0, var = 0;
        for (int k = 0; k < C; k++)
            mu += c.x[i * C + k];
        mu /= C;
        for (int k = 0; k < C; k++)
            var += (c.x[i * C + k] - mu) * (c.x[i * C + k] - mu);
        var /= C;
        double rs = 1 / sqrt(var + 1e-5);
        assert_float_equal(mean[i], mu, 1e-6 * fmax(1, fabs(mu)));
        assert_float_equal(rstd[i], rs, 1e-6 * rs);
        for (int k = 0; k < C; k++)
            want[i * C + k] = (c.x[i * C + k] - mu) * rs * c.w[k] + (bias ? c.b[k] : 0);
    }
    assert_int_equal(compare("layernorm y", c.y, want, n, 1e-5, 1e-5), 0);
    float *dx = falloc(n), *dw = falloc(C), *db = falloc(C), *dw0 = falloc(C), *db0 = falloc(C);
    fill(dw0, C, -1, 1, 15), fill(db0, C, -1, 1, 16), fill(dx, n, 7, 8, 17); /* dx: garbage */
    memcpy(dw, dw0, sizeof(float) * C), memcpy(db, db0, sizeof(float) * C);
    ddp_nn_layernorm_backward(c.r, c.x, c.w, mean, rstd, N, C, dx, dw, bias ? db : NULL);
    float *gw = minus(dw, dw0, C), *gb = minus(db, db0, C);
    int bad = check_fd("layernorm dx", ln_loss, &c, c.x, n, dx);
    bad += check_fd("layernorm dweight", ln_loss, &c, c.w, C, gw);
    if (bias)
        bad += check_fd("layernorm dbias", ln_loss, &c, c.b, C, gb);
    assert_int_equal(bad, 0);
    /* in place (dx = dy) gives the same bits; NULL dx still accumulates the parameters */
    float *dy = falloc(n), *dw2 = falloc(C);
    memcpy(dy, c.r, sizeof(float) * n), memcpy(dw2, dw0, sizeof(float) * C);
    ddp_nn_layernorm_backward(dy, c.x, c.w, mean, rstd, N, C, dy, NULL, NULL);
    assert_memory_equal(dy, dx, sizeof(float) * n);
    ddp_nn_layernorm_backward(c.r, c.x, c.w, mean, rstd, N, C, NULL, dw2, NULL);
    assert_memory_equal(dw2, dw, sizeof(float) * C);
    free(c.x), free(c.w), free(c.b), free(c.y), free(c.r), free(mean), free(rstd), free(want);
    free(dx), free(dw), free(db), free(dw0), free(db0), free(gw), free(gb), free(dy), free(dw2);
}

static void layernorm(void **state)
{
    (void)state;
    ln_case(3, 16, true, 0.0f);
    ln_case(4, 13, false, 0.0f); /* no bias; C not a multiple of the 8 lanes */
    ln_case(2, 40, true, 30.0f); /* a mean far from 0 */
}

/* ---- GELU (tanh) and the residual add -------------------------------------------------------- */

typedef struct {
    size_t n;
    float *x, *y, *r;
} act_ctx;

static double gelu_loss(void *p)
{
    act_ctx *c = p;
    ddp_nn_gelu_tanh_forward(c->x, c->n, c->y);
    return weighted_sum(c->y, c->r, c->n);
}

static void gelu_tanh(void **state)
{
    (void)state;
    enum { N = 203 };
    float x[N], y[N], r[N], dx[N];
    fill(x, N, -6, 6, 21), fill(r, N, -1, 1, 22);
    x[0] = 0, x[1] = -30, x[2] = 30, x[3] = -1e-4f, x[4] = 12;
    act_ctx c = {N, x, y, r};
    gelu_loss(&c);
    double want[N];
    for (int i = 0; i < N; i++) {
        double v = x[i];
        want[i] = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    }
    assert_int_equal(compare("gelu_tanh y", y, want, N, 1e-7, 1e-6), 0);
    ddp_nn_gelu_tanh_backward(r, x, N, dx);
    assert_int_equal(check_fd("gelu_tanh dx", gelu_loss, &c, x, N, dx), 0);
    /* in place (y recomputed: the finite differences left it from a moved x) */
    gelu_loss(&c);
    float z[N], dz[N];
    memcpy(z, x, sizeof z), memcpy(dz, r, sizeof dz);
    ddp_nn_gelu_tanh_forward(z, N, z);
    ddp_nn_gelu_tanh_backward(dz, x, N, dz);
    assert_memory_equal(z, y, sizeof z);
    assert_memory_equal(dz, dx, sizeof dz);
}

static void residual_add(void **state)
{
    (void)state;
    float a[9], b[9], y[9];
    fill(a, 9, -1, 1, 31), fill(b, 9, -1, 1, 32);
    ddp_nn_add(a, b, 9, y);
    for (int i = 0; i < 9; i++)
        assert_true(y[i] == a[i] + b[i]);
    ddp_nn_add(a, b, 9, a); /* in place, either operand */
    assert_memory_equal(a, y, sizeof a);
    ddp_nn_add(b, a, 9, a);
    for (int i = 0; i < 9; i++)
        assert_true(a[i] == y[i] + b[i]);
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    ddp_nn_attention a;
    int B, T;
    bool train;
    float *qkv, *out, *lse, *r, *scratch;
} attn_ctx;

#define ATT_SEED 77
#define ATT_STEP 5
#define ATT_OFFSET 1000

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    ddp_nn_attention_forward(&c->a, c->qkv, c->B, c->T, ATT_SEED, ATT_STEP, ATT_OFFSET, c->train,
                             c->scratch, c->out, c->lse);
    return weighted_sum(c->out, c->r, (size_t)c->B * c->T * c->a.C);
}

/* The documented attention-dropout hash of key j within a row whose key is `key`. */
static uint32_t attn_hash(uint64_t key, int j)
{
    uint32_t x = (uint32_t)(key >> 32) ^ ((uint32_t)key + (uint32_t)j * 0x9e3779b9u);
    x = (x ^ (x >> 16)) * 0x85ebca6bu;
    x = (x ^ (x >> 13)) * 0xc2b2ae35u;
    return x ^ (x >> 16);
}

/* The naive reference: per (b, h, t) the whole causal softmax in double, the documented dropout
 * rule, then the weighted sum of v. */
static void attn_reference(const attn_ctx *c, double *out, double *lse)
{
    int C = c->a.C, nh = c->a.n_head, hs = c->a.head_size, T = c->T;
    double p = c->train ? c->a.dropout : 0.0;
    uint64_t thresh = (uint64_t)(p * 4294967296.0);
    double *s = calloc((size_t)T, sizeof(double));
    assert_non_null(s);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const float *k = c->qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int e = 0; e < hs; e++)
                        d += (double)q[e] * k[e];
                    s[j] = d / sqrt((double)hs);
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(s[j] - mx);
                lse[((size_t)b * nh + h) * T + t] = mx + log(sum);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int e = 0; e < hs; e++)
                    o[e] = 0;
                for (int j = 0; j <= t; j++) {
                    double w = exp(s[j] - mx) / sum;
                    if (p > 0) {
                        uint64_t row = ATT_OFFSET + ((uint64_t)b * nh + h) * T + t;
                        bool keep =
                            attn_hash(ddp_nn_rand_u64(ATT_SEED, ATT_STEP, row), j) >= thresh;
                        w = keep ? w / (1 - p) : 0;
                    }
                    const float *v = c->qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                    for (int e = 0; e < hs; e++)
                        o[e] += w * v[e];
                }
            }
    free(s);
}

static void attn_case(int B, int T, int C, int nh, float p, bool train, bool fd)
{
    attn_ctx c = {{C, nh, T, p, 0, 0}, B, T, train, NULL, NULL, NULL, NULL, NULL};
    assert_int_equal(ddp_nn_attention_setup(&c.a, NULL), DDP_OK);
    assert_int_equal(c.a.head_size, C / nh);
    size_t Tp = ((size_t)T + 15) & ~(size_t)15, hs = (size_t)c.a.head_size;
    size_t unfused = (size_t)(3 * DDP_NN_ATTN_BLOCK + 1) * T + 2 * (size_t)T * hs;
    size_t fused = (size_t)(7 * DDP_NN_ATTN_BLOCK / 2 + 1) * Tp + 5 * Tp * hs;
    assert_true(c.a.scratch_floats == (unfused > fused ? unfused : fused));
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
    c.qkv = falloc(nq), c.out = falloc(no), c.lse = falloc(nl), c.r = falloc(no);
    c.scratch = falloc(c.a.scratch_floats);
    fill(c.qkv, nq, -2, 2, 41), fill(c.r, no, -1, 1, 42);
    attn_loss(&c);
    double *want = calloc(no, sizeof(double)), *wlse = calloc(nl, sizeof(double));
    assert_non_null(want), assert_non_null(wlse);
    attn_reference(&c, want, wlse);
    assert_int_equal(compare("attention out", c.out, want, no, 1e-5, 1e-5), 0);
    assert_int_equal(compare("attention lse", c.lse, wlse, nl, 1e-5, 1e-5), 0);
    /* backward: dqkv overwritten (garbage first), against finite differences */
    float *dqkv = falloc(nq);
    fill(dqkv, nq, 7, 8, 43);
    ddp_nn_attention_backward(&c.a, c.r, c.qkv, c.lse, B, T, ATT_SEED, ATT_STEP, ATT_OFFSET, train,
                              c.scratch, dqkv);
    if (fd)
        assert_int_equal(check_fd("attention dqkv", attn_loss, &c, c.qkv, nq, dqkv), 0);
    /* the forward without lse (inference) gives the same output */
    attn_loss(&c); /* the finite differences left out from a moved qkv */
    float *out2 = falloc(no);
    ddp_nn_attention_forward(&c.a, c.qkv, B, T, ATT_SEED, ATT_STEP, ATT_OFFSET, train, c.scratch,
                             out2, NULL);
    assert_memory_equal(out2, c.out, sizeof(float) * no);
    free(c.qkv), free(c.out), free(c.lse), free(c.r), free(c.scratch), free(want), free(wlse);
    free(dqkv), free(out2);
}

static void attention(void **state)
{
    (void)state;
    attn_case(2, 5, 8, 2, 0.0f, true, true);     /* one block, hs 4 */
    attn_case(1, 70, 6, 3, 0.0f, true, true);    /* two blocks, the second of 6 rows */
    attn_case(2, 9, 8, 1, 0.3f, true, true);     /* dropout: the mask is regenerated */
    attn_case(1, 67, 4, 2, 0.25f, true, true);   /* dropout over two blocks */
    attn_case(1, 9, 8, 2, 0.5f, false, true);    /* eval: no dropout whatever p is */
    attn_case(2, 200, 64, 2, 0.1f, true, false); /* four blocks; forward only */
}

/* ---- attention with bf16 products ------------------------------------------------------------ */

/* Skips the calling test where bf16 products cannot run (no bf16 units, no oneDNN). */
static void need_bf16(void)
{
    ddp_error err = {0};
    if (ddp__gemm_bf16_check(&err) != DDP_OK) {
        print_message("skipping bf16: %s\n", err.msg);
        skip();
    }
}

static double r16(double x) /* to bfloat16 and back: an operand of a bf16 product */
{
    return ddp__bf16_to_f32(ddp__f32_to_bf16((float)x));
}

static double norm_diff(const float *got, const double *want, size_t n, double *norm)
{
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++)
        d += (got[i] - want[i]) * (got[i] - want[i]), w += want[i] * want[i];
    *norm = sqrt(w);
    return sqrt(d);
}

/* The arithmetic precision bf16 documents, written out in double: every product's operands
 * rounded to bfloat16 — q, k, v, dout; the unnormalised probabilities e_j (after dropout) that
 * multiply v; the backward's dropped probabilities and dS — everything else exact. out (B, T, C),
 * dqkv (B, T, 3C), zeroed by the caller. */
static void attn_bf16_reference(const attn_ctx *c, const float *dout, double *out, double *dqkv)
{
    int C = c->a.C, C3 = 3 * C, nh = c->a.n_head, hs = c->a.head_size, T = c->T;
    double p = c->train ? c->a.dropout : 0.0, sc = 1 / sqrt((double)hs);
    uint64_t thresh = (uint64_t)(p * 4294967296.0);
    double *s = calloc((size_t)T, sizeof(double)), *m = calloc((size_t)T, sizeof(double));
    assert_non_null(s), assert_non_null(m);
#define Q16(t, e) r16(c->qkv[((size_t)b * T + (t)) * C3 + h * hs + (e)])
#define K16(t, e) r16(c->qkv[((size_t)b * T + (t)) * C3 + C + h * hs + (e)])
#define V16(t, e) r16(c->qkv[((size_t)b * T + (t)) * C3 + 2 * C + h * hs + (e)])
#define DO16(t, e) r16(dout[((size_t)b * T + (t)) * C + h * hs + (e)])
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0, D = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int e = 0; e < hs; e++)
                        d += Q16(t, e) * K16(j, e);
                    s[j] = d * sc, mx = fmax(mx, s[j]);
                    uint64_t row = ATT_OFFSET + ((uint64_t)b * nh + h) * T + t;
                    bool keep =
                        p == 0 || attn_hash(ddp_nn_rand_u64(ATT_SEED, ATT_STEP, row), j) >= thresh;
                    m[j] = keep ? 1 / (1 - p) : 0;
                }
                for (int j = 0; j <= t; j++)
                    sum += exp(s[j] - mx);
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int j = 0; j <= t; j++)
                    for (int e = 0; e < hs; e++)
                        o[e] += r16(exp(s[j] - mx) * m[j]) * V16(j, e) / sum;
                /* backward of row t: g_j = m_j · dout·v_j, dS_j = P_j (g_j − Σ P·g) */
                double lse = mx + log(sum), *g = calloc((size_t)t + 1, sizeof(double));
                assert_non_null(g);
                for (int j = 0; j <= t; j++) {
                    for (int e = 0; e < hs; e++)
                        g[j] += DO16(t, e) * V16(j, e);
                    g[j] *= m[j];
                    D += exp(s[j] - lse) * g[j];
                }
                double *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                for (int j = 0; j <= t; j++) {
                    double P = exp(s[j] - lse), dS = r16(P * (g[j] - D)), Pd = r16(P * m[j]);
                    double *dk = dqkv + ((size_t)b * T + j) * C3 + C + h * hs, *dv = dk + C;
                    for (int e = 0; e < hs; e++) {
                        dq[e] += sc * dS * K16(j, e);
                        dk[e] += sc * dS * Q16(t, e);
                        dv[e] += Pd * DO16(t, e);
                    }
                }
                free(g);
            }
#undef Q16
#undef K16
#undef V16
#undef DO16
    free(s), free(m);
}

/* With bf16 products (precision bf16) the attention rounds exactly the operands documented
 * (attn_bf16_reference): it is far closer to that than to the float32 attention — so it did run
 * in bf16, and rounded where it should. Skipped where the CPU cannot do bf16 products. */
static void attn_bf16_case(int B, int T, int C, int nh, float p)
{
    attn_ctx c = {{C, nh, T, p, 0, 0}, B, T, true, NULL, NULL, NULL, NULL, NULL};
    assert_int_equal(ddp_nn_attention_setup(&c.a, NULL), DDP_OK);
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
    c.qkv = falloc(nq), c.out = falloc(no), c.lse = falloc(nl), c.r = falloc(no);
    c.scratch = falloc(c.a.scratch_floats);
    fill(c.qkv, nq, -1, 1, 61), fill(c.r, no, -1, 1, 62);
    float *dqkv = falloc(nq), *out32 = falloc(no), *dqkv32 = falloc(nq);
    /* float32 first, then bf16 */
    attn_loss(&c);
    ddp_nn_attention_backward(&c.a, c.r, c.qkv, c.lse, B, T, ATT_SEED, ATT_STEP, ATT_OFFSET, true,
                              c.scratch, dqkv32);
    memcpy(out32, c.out, sizeof(float) * no);
    unsigned long fb = ddp__gemm_bf16_fallbacks();
    ddp__gemm_kind old = ddp__gemm_set_kind(DDP__GEMM_BF16);
    attn_loss(&c);
    fill(dqkv, nq, 7, 8, 63); /* overwritten */
    /* scratch holds nothing the backward may use (one buffer serves every layer): NaN here must
     * not reach dqkv (a stale dropout row once did, through a 0 × NaN in a masked lane) */
    memset(c.scratch, 0xff, sizeof(float) * c.a.scratch_floats);
    ddp_nn_attention_backward(&c.a, c.r, c.qkv, c.lse, B, T, ATT_SEED, ATT_STEP, ATT_OFFSET, true,
                              c.scratch, dqkv);
    ddp__gemm_set_kind(old);
    assert_int_equal(ddp__gemm_bf16_fallbacks(), fb);
    double *wo = calloc(no, sizeof(double)), *wd = calloc(nq, sizeof(double)), n1, n2;
    assert_non_null(wo), assert_non_null(wd);
    attn_bf16_reference(&c, c.r, wo, wd);
    double eo = norm_diff(c.out, wo, no, &n1), e32o = norm_diff(out32, wo, no, &n1);
    double ed = norm_diff(dqkv, wd, nq, &n2), e32d = norm_diff(dqkv32, wd, nq, &n2);
    print_message("bf16 attention B%d T%d C%d nh%d p%.2f: |out − ref| %.2e (float32's %.2e) of "
                  "%.2e; |dqkv − ref| %.2e (float32's %.2e) of %.2e\n",
                  B, T, C, nh, (double)p, eo, e32o, n1, ed, e32d, n2);
    assert_true(eo <= 2e-4 * n1 && eo <= 0.05 * e32o);
    assert_true(ed <= 2e-4 * n2 && ed <= 0.05 * e32d);
    free(c.qkv), free(c.out), free(c.lse), free(c.r), free(c.scratch), free(dqkv), free(out32);
    free(dqkv32), free(wo), free(wd);
}

static void attention_bf16(void **state)
{
    (void)state;
    need_bf16();
    attn_bf16_case(2, 5, 8, 2, 0.0f);    /* one block */
    attn_bf16_case(1, 150, 32, 2, 0.0f); /* three blocks, the last of 22 rows */
    attn_bf16_case(2, 70, 16, 4, 0.2f);  /* dropout over two blocks */
    /* head sizes that are multiples of 16 take the fused kernels (kernels/cpu/bf16dot.c) */
    attn_bf16_case(2, 70, 64, 2, 0.2f);   /* head size 32, dropout, a short last block */
    attn_bf16_case(1, 131, 128, 2, 0.0f); /* head size 64, T odd: a lone last row */
    attn_bf16_case(1, 40, 96, 1, 0.1f);   /* head size 96: a last column chunk of 32 */
}

/* A linear layer's backward with bf16 products rounds dy once for both its products (dx and
 * dW): bit for bit what ddp__sgemm computes in bf16 with the same operands, dW accumulated. */
static void linear_bf16(void **state)
{
    (void)state;
    need_bf16();
    enum { B = 37, IN = 45, OUT = 70 };
    float *dy = falloc(B * OUT), *x = falloc(B * IN), *W = falloc(OUT * IN), *db = falloc(OUT);
    float *dx = falloc(B * IN), *dW = falloc(OUT * IN), *rdx = falloc(B * IN);
    float *rdW = falloc(OUT * IN), *dx32 = falloc(B * IN);
    fill(dy, B * OUT, -1, 1, 71), fill(x, B * IN, -1, 1, 72), fill(W, OUT * IN, -1, 1, 73);
    fill(dW, OUT * IN, -1, 1, 74), memcpy(rdW, dW, sizeof(float) * OUT * IN);
    fill(dx, B * IN, NAN, NAN, 0); /* overwritten */
    ddp_nn_linear_backward(dy, x, W, B, IN, OUT, dx32, NULL, NULL);
    unsigned long fb = ddp__gemm_bf16_fallbacks(), np = ddp__gemm_bf16_products();
    ddp__gemm_kind old = ddp__gemm_set_kind(DDP__GEMM_BF16);
    ddp_nn_linear_backward(dy, x, W, B, IN, OUT, dx, dW, db);
    ddp__sgemm(false, false, B, IN, OUT, 1.0f, dy, OUT, W, IN, 0.0f, rdx, IN);
    ddp__sgemm(true, false, OUT, IN, B, 1.0f, dy, OUT, x, IN, 1.0f, rdW, IN);
    ddp__gemm_set_kind(old);
    assert_int_equal(ddp__gemm_bf16_fallbacks(), fb);
    assert_int_equal(ddp__gemm_bf16_products(), np + 4);
    assert_memory_equal(dx, rdx, sizeof(float) * B * IN);
    assert_memory_equal(dW, rdW, sizeof(float) * OUT * IN);
    assert_true(memcmp(dx, dx32, sizeof(float) * B * IN) != 0); /* bf16 did run */
    for (int o = 0; o < OUT; o++) {
        double want = 0;
        for (int r = 0; r < B; r++)
            want += dy[r * OUT + o];
        assert_float_equal(db[o], want, 1e-5);
    }
    free(dy), free(x), free(W), free(db), free(dx), free(dW), free(rdx), free(rdW), free(dx32);
}

/* nn/bf16h.h: layers whose inputs are kept in bfloat16 (the GPT under precision bf16) give the
 * float32 entry points' results under bf16 products, bit for bit: the linear forward (plain and
 * accumulating), its backward (with the bias gradient summed while dy is rounded), the GELU and
 * layernorm writing rounded outputs, and the attention reading a rounded qkv. */
static void kept_bf16_inputs(void **state)
{
    (void)state;
    need_bf16();
    enum { B = 37, IN = 45, OUT = 70 };
    float *x = falloc(B * IN), *W = falloc(OUT * IN), *b = falloc(OUT), *dy = falloc(B * OUT);
    float *y = falloc(B * OUT), *ry = falloc(B * OUT), *dx = falloc(B * IN), *rdx = falloc(B * IN);
    float *dW = falloc(OUT * IN), *rdW = falloc(OUT * IN), *db = falloc(OUT), *rdb = falloc(OUT);
    float *row = falloc(IN), *ln = falloc(B * IN), *mean = falloc(B), *rstd = falloc(B);
    uint16_t *xh = malloc(2 * B * IN), *wh = malloc(2 * OUT * IN), *dyh = malloc(2 * B * OUT);
    uint16_t *rh = malloc(2 * B * IN);
    assert_non_null(xh), assert_non_null(wh), assert_non_null(dyh), assert_non_null(rh);
    fill(x, B * IN, -1, 1, 81), fill(W, OUT * IN, -1, 1, 82), fill(b, OUT, -1, 1, 83);
    fill(dy, B * OUT, -1, 1, 84), fill(dW, OUT * IN, -1, 1, 85), fill(db, OUT, -1, 1, 86);
    memcpy(rdW, dW, sizeof(float) * OUT * IN), memcpy(rdb, db, sizeof(float) * OUT);
    unsigned long fb = ddp__gemm_bf16_fallbacks();
    ddp__gemm_kind old = ddp__gemm_set_kind(DDP__GEMM_BF16);
    ddp__nn_round_h(x, B * IN, xh);
    ddp_nn_linear_forward(x, W, b, B, IN, OUT, ry);
    ddp__nn_linear_forward_h(xh, W, b, B, IN, OUT, false, wh, y);
    assert_memory_equal(y, ry, sizeof(float) * B * OUT);
    /* accumulating (the residual projection): y += x·Wᵀ, as ddp__sgemm with beta 1 */
    memcpy(y, dy, sizeof(float) * B * OUT), memcpy(ry, dy, sizeof(float) * B * OUT);
    ddp__sgemm(false, true, B, OUT, IN, 1.0f, x, IN, W, IN, 1.0f, ry, OUT);
    ddp__nn_linear_forward_h(xh, W, NULL, B, IN, OUT, true, wh, y);
    assert_memory_equal(y, ry, sizeof(float) * B * OUT);
    ddp_nn_linear_backward(dy, x, W, B, IN, OUT, rdx, rdW, rdb);
    ddp__nn_linear_backward_h(dy, xh, W, B, IN, OUT, dyh, wh, dx, dW, db);
    assert_memory_equal(dx, rdx, sizeof(float) * B * IN);
    assert_memory_equal(dW, rdW, sizeof(float) * OUT * IN);
    assert_memory_equal(db, rdb, sizeof(float) * OUT);
    /* the GELU's backward straight into the next backward's rounded dy and bias gradient */
    float *g32 = falloc(B * OUT), *gx = falloc(B * OUT);
    fill(gx, B * OUT, -3, 3, 89);
    ddp_nn_gelu_tanh_backward(dy, gx, B * OUT, g32);
    ddp_nn_linear_backward(g32, x, W, B, IN, OUT, rdx, rdW, rdb);
    ddp__nn_gelu_tanh_backward_h(dy, gx, B, OUT, dyh, db);
    ddp__nn_linear_backward_h(NULL, xh, W, B, IN, OUT, dyh, wh, dx, dW, NULL);
    assert_memory_equal(dx, rdx, sizeof(float) * B * IN);
    assert_memory_equal(dW, rdW, sizeof(float) * OUT * IN);
    assert_memory_equal(db, rdb, sizeof(float) * OUT);
    free(g32), free(gx);
    /* GELU and layernorm with rounded outputs */
    ddp_nn_gelu_tanh_forward(x, B * IN, ln);
    ddp__bf16_round(rh, ln, B * IN);
    ddp__nn_gelu_tanh_forward_h(x, B * IN, xh);
    assert_memory_equal(xh, rh, 2 * B * IN);
    ddp_nn_layernorm_forward(x, W, b, B, IN, 1e-5f, ln, NULL, NULL);
    ddp__bf16_round(rh, ln, B * IN);
    ddp__nn_layernorm_forward_h(x, W, b, B, IN, 1e-5f, row, xh, mean, rstd);
    assert_memory_equal(xh, rh, 2 * B * IN);
    /* attention from a rounded qkv: three blocks, the last short, with dropout */
    enum { AB = 2, T = 150, C = 32, NH = 2 };
    ddp_nn_attention a = {C, NH, T, 0.1f, 0, 0};
    assert_int_equal(ddp_nn_attention_setup(&a, NULL), DDP_OK);
    size_t nq = (size_t)AB * T * 3 * C, no = (size_t)AB * T * C;
    float *qkv = falloc(nq), *d = falloc(no), *o = falloc(no), *ro = falloc(no);
    float *lse = falloc(AB * NH * T), *rlse = falloc(AB * NH * T), *g = falloc(nq);
    float *rg = falloc(nq), *scr = falloc(a.scratch_floats);
    uint16_t *qh = malloc(2 * nq);
    assert_non_null(qh);
    fill(qkv, nq, -1, 1, 87), fill(d, no, -1, 1, 88);
    for (size_t i = 0; i < nq; i++) /* qkv as rounded: the float32 path rounds it the same way */
        qkv[i] = ddp__bf16_to_f32(ddp__f32_to_bf16(qkv[i]));
    ddp__nn_round_h(qkv, nq, qh);
    ddp_nn_attention_forward(&a, qkv, AB, T, 5, 6, 7, true, scr, ro, rlse);
    ddp_nn_attention_backward(&a, d, qkv, rlse, AB, T, 5, 6, 7, true, scr, rg);
    ddp__nn_attention_forward_h(&a, qh, AB, T, 5, 6, 7, true, scr, o, lse);
    ddp__nn_attention_backward_h(&a, d, qh, lse, AB, T, 5, 6, 7, true, scr, g);
    ddp__gemm_set_kind(old);
    assert_int_equal(ddp__gemm_bf16_fallbacks(), fb);
    assert_memory_equal(o, ro, sizeof(float) * no);
    assert_memory_equal(lse, rlse, sizeof(float) * AB * NH * T);
    assert_memory_equal(g, rg, sizeof(float) * nq);
    free(x), free(W), free(b), free(dy), free(y), free(ry), free(dx), free(rdx), free(dW);
    free(rdW), free(db), free(rdb), free(row), free(ln), free(mean), free(rstd), free(xh);
    free(wh), free(dyh), free(rh), free(qkv), free(d), free(o), free(ro), free(lse), free(rlse);
    free(g), free(rg), free(scr), free(qh);
}

static void attention_setup(void **state)
{
    (void)state;
    ddp_error err = {0};
    ddp_nn_attention a = {30, 4, 16, 0.0f, 0, 0};
    assert_int_equal(ddp_nn_attention_setup(&a, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "n_embd 30 is not a multiple of n_head 4"));
    assert_int_equal(a.head_size, 0);
    a = (ddp_nn_attention){32, 4, 0, 0.0f, 0, 0};
    assert_int_equal(ddp_nn_attention_setup(&a, &err), DDP_ERR_INVALID);
    a = (ddp_nn_attention){32, 4, 16, 1.0f, 0, 0};
    assert_int_equal(ddp_nn_attention_setup(&a, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "dropout 1"));
    a.dropout = NAN;
    assert_int_equal(ddp_nn_attention_setup(&a, NULL), DDP_ERR_INVALID);
    a.dropout = 0.1f;
    assert_int_equal(ddp_nn_attention_setup(&a, &err), DDP_OK);
    assert_int_equal(a.head_size, 8);
}

/* ---- tied LM head ---------------------------------------------------------------------------- */

typedef struct {
    int N, C, V;
    float *x, *wte, *logits, *r;
} head_ctx;

static double head_loss(void *p)
{
    head_ctx *c = p;
    ddp_nn_lm_head_forward(c->x, c->wte, c->N, c->C, c->V, c->logits);
    return weighted_sum(c->logits, c->r, (size_t)c->N * c->V);
}

static void lm_head(void **state)
{
    (void)state;
    enum { N = 3, C = 5, V = 7 };
    float x[N * C], wte[V * C], logits[N * V], r[N * V], dx[N * C], dw[V * C], dw0[V * C];
    fill(x, N * C, -1, 1, 51), fill(wte, V * C, -1, 1, 52), fill(r, N * V, -1, 1, 53);
    fill(logits, N * V, NAN, NAN, 0); /* NaN: beta 0 must ignore the old contents */
    head_ctx c = {N, C, V, x, wte, logits, r};
    head_loss(&c);
    double want[N * V];
    for (int i = 0; i < N; i++)
        for (int v = 0; v < V; v++) {
            double s = 0;
            for (int k = 0; k < C; k++)
                s += (double)x[i * C + k] * wte[v * C + k];
            want[i * V + v] = s;
        }
    assert_int_equal(compare("lm_head logits", logits, want, N * V, 1e-6, 1e-6), 0);
    fill(dw0, V * C, -1, 1, 54), memcpy(dw, dw0, sizeof dw), fill(dx, N * C, 7, 8, 55);
    ddp_nn_lm_head_backward(r, x, wte, N, C, V, dx, dw);
    float *gw = minus(dw, dw0, V * C);
    int bad = check_fd("lm_head dx", head_loss, &c, x, N * C, dx);
    bad += check_fd("lm_head dwte", head_loss, &c, wte, V * C, gw);
    assert_int_equal(bad, 0);
    free(gw);
}

/* ---- softmax cross-entropy over a vocabulary ------------------------------------------------- */

typedef struct {
    int N, V;
    float *logits;
    const int32_t *targets;
} xent_ctx;

static double xent_loss(void *p)
{
    xent_ctx *c = p;
    double loss;
    assert_int_equal(ddp_nn_vocab_xent(c->logits, c->targets, c->N, c->V, 1.0f, &loss, NULL, NULL),
                     DDP_OK);
    return loss;
}

static void vocab_xent(void **state)
{
    (void)state;
    enum { N = 6, V = 37 };
    float logits[N * V], d[N * V], d2[N * V], rl[N];
    int32_t targets[N] = {3, DDP_NN_IGNORE_INDEX, 36, 0, DDP_NN_IGNORE_INDEX, 17};
    fill(logits, N * V, -4, 4, 61);
    logits[2 * V + 36] = 100; /* a large logit: no overflow */
    logits[5 * V + 4] = -100; /* a very small one: exp underflows to 0, harmlessly */
    xent_ctx c = {N, V, logits, targets};
    double loss, want = 0, dwant[N * V];
    assert_int_equal(ddp_nn_vocab_xent(logits, targets, N, V, 1.0f, &loss, d, NULL), DDP_OK);
    for (int r = 0; r < N; r++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            mx = fmax(mx, logits[r * V + j]);
        for (int j = 0; j < V; j++)
            s += exp(logits[r * V + j] - mx);
        if (targets[r] >= 0)
            want += (mx + log(s) - logits[r * V + targets[r]]) / 4;
        for (int j = 0; j < V; j++)
            dwant[r * V + j] =
                targets[r] < 0 ? 0 : (exp(logits[r * V + j] - mx) / s - (j == targets[r])) / 4;
    }
    assert_float_equal(loss, want, 1e-6 * fabs(want));
    assert_int_equal(compare("xent dlogits", d, dwant, N * V, 1e-8, 1e-5), 0);
    for (int j = 0; j < V; j++) /* ignored rows: exactly 0 */
        assert_true(d[1 * V + j] == 0.0f && d[4 * V + j] == 0.0f);
    assert_int_equal(check_fd("xent dlogits", xent_loss, &c, logits, N * V, d), 0);
    /* the exact-evaluation sum: the same rows, summed, with their count */
    double sum = 0;
    int count = 0;
    assert_int_equal(ddp_nn_vocab_xent_sum(logits, targets, N, V, &sum, &count, rl, NULL), DDP_OK);
    assert_int_equal(count, 4);
    assert_float_equal(sum, loss * 4, 1e-9 * fabs(sum));
    assert_true(rl[1] == 0.0f && rl[4] == 0.0f && rl[0] > 0.0f);
    /* in place, with an accumulation scale: the same numbers scaled */
    memcpy(d2, logits, sizeof d2);
    double loss2;
    assert_int_equal(ddp_nn_vocab_xent(d2, targets, N, V, 0.5f, &loss2, d2, NULL), DDP_OK);
    assert_true(loss2 == loss);
    for (int i = 0; i < N * V; i++)
        assert_float_equal(d2[i], 0.5 * d[i], 1e-9);
    /* a bad target: an error, nothing written */
    ddp_error err = {0};
    targets[3] = V;
    loss2 = 123, memcpy(d2, d, sizeof d);
    assert_int_equal(ddp_nn_vocab_xent(logits, targets, N, V, 1.0f, &loss2, d2, &err),
                     DDP_ERR_INVALID);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "target 37 of row 3"));
    assert_true(loss2 == 123);
    assert_memory_equal(d2, d, sizeof d);
    targets[3] = -100; /* torch's default ignore index is not ours */
    assert_int_equal(ddp_nn_vocab_xent_sum(logits, targets, N, V, &sum, &count, NULL, &err),
                     DDP_ERR_INVALID);
    /* everything ignored: loss NaN as torch's, gradient 0 */
    int32_t none[N] = {-1, -1, -1, -1, -1, -1};
    assert_int_equal(ddp_nn_vocab_xent(logits, none, N, V, 1.0f, &loss2, d2, NULL), DDP_OK);
    assert_true(isnan(loss2));
    for (int i = 0; i < N * V; i++)
        assert_true(d2[i] == 0.0f);
    /* a NaN logit makes the loss NaN: divergence is not hidden */
    logits[7] = NAN;
    targets[3] = 0;
    assert_int_equal(ddp_nn_vocab_xent(logits, targets, N, V, 1.0f, &loss2, NULL, NULL), DDP_OK);
    assert_true(isnan(loss2));
}

/* ---- normal initialisation ------------------------------------------------------------------- */

static void init_normal(void **state)
{
    (void)state;
    enum { N = 200000 };
    float *w = falloc(N), *w2 = falloc(N);
    ddp_nn_init_normal(w, N, 0.02f, 42, 3);
    double s = 0, ss = 0, s4 = 0;
    for (int i = 0; i < N; i++) {
        double v = w[i] / 0.02;
        s += v, ss += v * v, s4 += v * v * v * v;
    }
    double mean = s / N, var = ss / N - mean * mean, kurt = s4 / N;
    print_message("init_normal: mean %.4f, var %.4f, E[z^4] %.3f (0, 1, 3)\n", mean, var, kurt);
    assert_true(fabs(mean) < 0.01 && fabs(var - 1) < 0.02 && fabs(kurt - 3) < 0.1);
    /* element i depends on (seed, tensor, i) only, not on n */
    ddp_nn_init_normal(w2, 100, 0.02f, 42, 3);
    assert_memory_equal(w, w2, sizeof(float) * 100);
    ddp_nn_init_normal(w2, N, 0.02f, 42, 3);
    assert_memory_equal(w, w2, sizeof(float) * N);
    ddp_nn_init_normal(w2, N, 0.02f, 42, 4);
    assert_true(memcmp(w, w2, sizeof(float) * N) != 0);
    free(w), free(w2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fast_exp),        cmocka_unit_test(embedding),
        cmocka_unit_test(layernorm),       cmocka_unit_test(gelu_tanh),
        cmocka_unit_test(residual_add),    cmocka_unit_test(attention),
        cmocka_unit_test(attention_setup), cmocka_unit_test(attention_bf16),
        cmocka_unit_test(linear_bf16),     cmocka_unit_test(kept_bf16_inputs),
        cmocka_unit_test(lm_head),         cmocka_unit_test(vocab_xent),
        cmocka_unit_test(init_normal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
