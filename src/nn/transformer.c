/*
 * transformer.c — the GPT-2 layers of ddp/nn.h apart from attention (attention.c): token and
 * position embedding, layernorm, the tanh-approximated GELU, the residual add, the tied LM head
 * and the softmax cross-entropy over a vocabulary, plus the normal initialiser GPT-2 uses.
 *
 * The hot loops are plain C that GCC vectorises at -O3 (exp() from vecmath.h instead of libm,
 * reductions in independent lanes), compiled twice where the CPU may have AVX2 (DDP__VEC, the same
 * bits either way); every matrix product goes through ddp__sgemm. Row statistics
 * (layernorm's mean and variance, the softmax's sum) are accumulated in double and rounded once,
 * elementwise work stays in float like torch's. No threads of our own, no state between calls.
 * What it does not do: fuse layers together (the model composes them), or run on a GPU.
 */
#include <math.h>
#include <string.h>

#include "ddp/nn.h"
#include "kernels/kernels.h"
#include "nn/bf16h.h"
#include "nn/vecmath.h"
#include "util/util.h"

/* ---- token and position embedding ------------------------------------------------------------ */

ddp_status ddp_nn_embedding_forward(const int32_t *idx, const float *wte, const float *wpe, int B,
                                    int T, int C, int V, int n_pos, float *x, ddp_error *err)
{
    if (T > n_pos)
        return ddp__err(err, DDP_ERR_INVALID,
                        "embedding: sequence length %d is longer than the model's %d positions; "
                        "use block_size ≥ %d or shorter sequences",
                        T, n_pos, T);
    /* Every id first, so that nothing is written on failure. */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int32_t id = idx[(size_t)b * T + t];
            if (id < 0 || id >= V)
                return ddp__err(err, DDP_ERR_INVALID,
                                "embedding: token id %ld at (row %d, position %d) is outside "
                                "[0, vocab_size %d); check the data's tokenizer against the "
                                "model's vocab_size",
                                (long)id, b, t, V);
        }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *e = wte + (size_t)idx[(size_t)b * T + t] * C, *p = wpe + (size_t)t * C;
            float *o = x + ((size_t)b * T + t) * C;
            for (int c = 0; c < C; c++)
                o[c] = e[c] + p[c];
        }
    return DDP_OK;
}

void ddp_nn_embedding_backward(const float *dx, const int32_t *idx, int B, int T, int C,
                               float *dwte, float *dwpe)
{
    /* In (b, t) order: a token that occurs twice gets its two rows added in the same order on
     * every run, so the result is deterministic. */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *g = dx + ((size_t)b * T + t) * C;
            if (dwte) {
                float *e = dwte + (size_t)idx[(size_t)b * T + t] * C;
                for (int c = 0; c < C; c++)
                    e[c] += g[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)t * C;
                for (int c = 0; c < C; c++)
                    p[c] += g[c];
            }
        }
}

/* ---- layernorm ------------------------------------------------------------------------------- */

/* One row of the forward: y = (x − mean)·rstd·weight (+ bias); returns mean and rstd. */
DDP__VEC static void ln_fwd_row(const float *xr, const float *weight, const float *bias, int C,
                                float eps, float *yr, float *mean, float *rstd)
{
    /* Two passes in double: the mean, then the biased variance around it. */
    double mu = ddp__sum_f64(xr, C) / C;
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
        for (int k = 0; k < 8; k++) {
            double d = xr[c + k] - mu;
            a[k] += d * d;
        }
    for (int k = 0; c < C; c++, k++) {
        double d = xr[c] - mu;
        a[k] += d * d;
    }
    double var = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) / C;
    float m = (float)mu, rs = (float)(1.0 / sqrt(var + eps));
    if (bias)
        for (c = 0; c < C; c++)
            yr[c] = (xr[c] - m) * rs * weight[c] + bias[c];
    else
        for (c = 0; c < C; c++)
            yr[c] = (xr[c] - m) * rs * weight[c];
    *mean = m, *rstd = rs;
}

void ddp_nn_layernorm_forward(const float *x, const float *weight, const float *bias, int N, int C,
                              float eps, float *y, float *mean, float *rstd)
{
    if (C <= 0)
        return;
    for (int r = 0; r < N; r++) {
        float m, rs;
        ln_fwd_row(x + (size_t)r * C, weight, bias, C, eps, y + (size_t)r * C, &m, &rs);
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = rs;
    }
}

void ddp__nn_layernorm_forward_h(const float *x, const float *weight, const float *bias, int N,
                                 int C, float eps, float *row, uint16_t *yh, float *mean,
                                 float *rstd)
{
    if (C <= 0)
        return;
    for (int r = 0; r < N; r++) {
        float m, rs;
        ln_fwd_row(x + (size_t)r * C, weight, bias, C, eps, row, &m, &rs);
        ddp__bf16_round(yh + (size_t)r * C, row, C);
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = rs;
    }
}

/* One row of the backward; dr may be gr or NULL. */
DDP__VEC static void ln_bwd_row(const float *gr, const float *xr, const float *weight, float m,
                                float rs, int C, float *dr, float *dweight, float *dbias)
{
    /* Parameter gradients before dx is written: dx may be dy. */
    if (dweight)
        for (int c = 0; c < C; c++)
            dweight[c] += gr[c] * ((xr[c] - m) * rs);
    if (dbias)
        for (int c = 0; c < C; c++)
            dbias[c] += gr[c];
    if (!dr)
        return;
    /* With x̂ = (x − mean)·rstd and g = dy·weight: dx = rstd · (g − mean(g) − x̂ · mean(g·x̂)). */
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
        for (int k = 0; k < 8; k++) {
            float g = gr[c + k] * weight[c + k], xh = (xr[c + k] - m) * rs;
            a[k] += g;
            b[k] += (double)g * xh;
        }
    for (int k = 0; c < C; c++, k++) {
        float g = gr[c] * weight[c], xh = (xr[c] - m) * rs;
        a[k] += g;
        b[k] += (double)g * xh;
    }
    float mg = (float)((((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) / C);
    float mgx = (float)((((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]))) / C);
    for (c = 0; c < C; c++) {
        float xh = (xr[c] - m) * rs;
        dr[c] = rs * (gr[c] * weight[c] - mg - xh * mgx);
    }
}

void ddp_nn_layernorm_backward(const float *dy, const float *x, const float *weight,
                               const float *mean, const float *rstd, int N, int C, float *dx,
                               float *dweight, float *dbias)
{
    if (C <= 0)
        return;
    for (int r = 0; r < N; r++)
        ln_bwd_row(dy + (size_t)r * C, x + (size_t)r * C, weight, mean[r], rstd[r], C,
                   dx ? dx + (size_t)r * C : NULL, dweight, dbias);
}

/* ---- GELU, tanh approximation ---------------------------------------------------------------- */

/* gelu(x) = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³). Since ½(1 + tanh u) = σ(2u) =
 * 1/(1 + e^(−2u)), y = x·σ(2u): one exp, no cancellation where tanh u ≈ −1. */
#define GELU_K 0.7978845608028654f /* √(2/π) */
#define GELU_A 0.044715f

DDP__VEC512 static void gelu_tanh_fwd(const float *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u2 = -2.0f * GELU_K * (v + GELU_A * v * v * v);
        y[i] = v / (1.0f + ddp__fast_expf(u2));
    }
}

DDP__VEC512 static void gelu_tanh_bwd(const float *dy, const float *x, size_t n, float *dx)
{
    /* d/dx x·s = s + x·s(1 − s)·2u', with s = σ(2u) and u' = √(2/π)(1 + 3·0.044715x²)
     * (since 1 − tanh²u = 4s(1 − s)). */
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float s = 1.0f / (1.0f + ddp__fast_expf(-2.0f * GELU_K * (v + GELU_A * v * v * v)));
        float du = 2.0f * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
        dx[i] = dy[i] * (s + v * s * (1.0f - s) * du);
    }
}

void ddp_nn_gelu_tanh_forward(const float *x, size_t n, float *y)
{
    gelu_tanh_fwd(x, n, y);
}

void ddp__nn_gelu_tanh_forward_h(const float *x, size_t n, uint16_t *yh)
{
    /* In chunks that stay in L1 between the GELU and the rounding. */
    enum { CHUNK = 1024 };
    float buf[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        gelu_tanh_fwd(x + i, k, buf);
        ddp__bf16_round(yh + i, buf, (int)k);
    }
}

void ddp__nn_gelu_tanh_backward_h(const float *dy, const float *x, int rows, int cols,
                                  uint16_t *gh, float *db)
{
    enum { CHUNK = 1024 };
    float buf[CHUNK];
    for (int r = 0; r < rows; r++)
        for (int c0 = 0; c0 < cols; c0 += CHUNK) {
            int k = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            size_t off = (size_t)r * cols + c0;
            gelu_tanh_bwd(dy + off, x + off, (size_t)k, buf);
            if (db)
                for (int c = 0; c < k; c++)
                    db[c0 + c] += buf[c];
            ddp__bf16_round(gh + off, buf, k);
        }
}

void ddp_nn_gelu_tanh_backward(const float *dy, const float *x, size_t n, float *dx)
{
    gelu_tanh_bwd(dy, x, n, dx);
}

/* ---- residual add ---------------------------------------------------------------------------- */

void ddp_nn_add(const float *a, const float *b, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

/* ---- tied LM head ---------------------------------------------------------------------------- */

void ddp_nn_lm_head_forward(const float *x, const float *wte, int N, int C, int V, float *logits)
{
    /* logits (N, V) = x (N, C) · wteᵀ; beta 0: the biggest buffer is written once, not zeroed
     * first. */
    ddp__sgemm(false, true, N, V, C, 1.0f, x, C, wte, C, 0.0f, logits, V);
}

void ddp_nn_lm_head_backward(const float *dlogits, const float *x, const float *wte, int N, int C,
                             int V, float *dx, float *dwte)
{
    if (dx) /* dx (N, C) = dlogits (N, V) · wte (V, C) */
        ddp__sgemm(false, false, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dx, C);
    if (dwte && N > 0) /* dwte (V, C) += dlogitsᵀ (V, N) · x (N, C) */
        ddp__sgemm(true, false, V, C, N, 1.0f, dlogits, V, x, C, 1.0f, dwte, C);
}

/* ---- softmax cross-entropy over a vocabulary ------------------------------------------------- */

/* Checks targets (N,) and counts those not ignored; nothing is written on failure. */
static ddp_status check_targets(const int32_t *targets, int N, int V, const char *fn, int *count,
                                ddp_error *err)
{
    int n = 0;
    for (int r = 0; r < N; r++) {
        if (targets[r] == DDP_NN_IGNORE_INDEX)
            continue;
        if (targets[r] < 0 || targets[r] >= V)
            return ddp__err(err, DDP_ERR_INVALID,
                            "%s: target %ld of row %d is outside [0, vocab_size %d) and is not "
                            "the ignore index %d; check the data's tokenizer against the model's "
                            "vocab_size",
                            fn, (long)targets[r], r, V, DDP_NN_IGNORE_INDEX);
        n++;
    }
    *count = n;
    return DDP_OK;
}

/* log Σ_j exp(l[j]) over a row of V ≥ 1 logits: max, then the sum of exp(l − max) in double. */
DDP__VEC static double row_lse(const float *l, int V)
{
    float mx = ddp__max_f32(l, V);
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= V; j += 8)
        for (int k = 0; k < 8; k++)
            a[k] += ddp__fast_expf(l[j + k] - mx);
    for (int k = 0; j < V; j++, k++)
        a[k] += ddp__fast_expf(l[j] - mx);
    return mx + log(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
}

/* d[j] = softmax(l)[j] · g = exp(l[j] − lse) · g over a row of V. d may be l: each element is
 * read before it is written. */
DDP__VEC static void softmax_row(const float *l, int V, float lse, float g, float *d)
{
    for (int j = 0; j < V; j++)
        d[j] = ddp__fast_expf(l[j] - lse) * g;
}

ddp_status ddp_nn_vocab_xent(const float *logits, const int32_t *targets, int N, int V, float scale,
                             double *loss, float *dlogits, ddp_error *err)
{
    int count = 0;
    ddp_status st = check_targets(targets, N, V, "cross-entropy", &count, err);
    if (st != DDP_OK)
        return st;
    double total = 0.0;
    /* torch's mean over no targets is 0/0 = NaN, and so is ours; the gradient is then 0. */
    float g = count > 0 ? (float)((double)scale / count) : 0.0f;
    for (int r = 0; r < N; r++) {
        const float *l = logits + (size_t)r * V;
        float *d = dlogits ? dlogits + (size_t)r * V : NULL;
        int y = targets[r];
        if (y == DDP_NN_IGNORE_INDEX) {
            if (d)
                memset(d, 0, sizeof(float) * (size_t)V);
            continue;
        }
        double lse = row_lse(l, V);
        total += lse - l[y];
        if (d) {
            softmax_row(l, V, (float)lse, g, d);
            d[y] -= g;
        }
    }
    if (loss)
        *loss = count > 0 ? total / count : NAN;
    return DDP_OK;
}

ddp_status ddp_nn_vocab_xent_sum(const float *logits, const int32_t *targets, int N, int V,
                                 double *loss_sum, int *count, float *row_loss, ddp_error *err)
{
    int n = 0;
    ddp_status st = check_targets(targets, N, V, "cross-entropy", &n, err);
    if (st != DDP_OK)
        return st;
    double total = 0.0;
    for (int r = 0; r < N; r++) {
        int y = targets[r];
        double lr = 0.0;
        if (y != DDP_NN_IGNORE_INDEX) {
            const float *l = logits + (size_t)r * V;
            lr = row_lse(l, V) - l[y];
            total += lr;
        }
        if (row_loss)
            row_loss[r] = (float)lr;
    }
    if (loss_sum)
        *loss_sum = total;
    if (count)
        *count = n;
    return DDP_OK;
}

/* ---- initialisation -------------------------------------------------------------------------- */

void ddp_nn_init_normal(float *w, size_t n, float std, uint64_t seed, uint64_t tensor_id)
{
    /* Box–Muller on the two 32-bit halves of one hash per element: u1 in (0, 1) (never 0, so
     * the log is finite), u2 in [0, 1). Only the cosine branch, so element i depends on i alone. */
    const double two_pi = 6.28318530717958647692;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = ddp_nn_rand_u64(seed, tensor_id, i);
        double u1 = ((double)(h >> 32) + 0.5) * (1.0 / 4294967296.0);
        double u2 = (double)(h & 0xffffffffu) * (1.0 / 4294967296.0);
        w[i] = (float)(std * sqrt(-2.0 * log(u1)) * cos(two_pi * u2));
    }
}
