/*
 * layers.c — the dense layer kernels of ddp/nn.h: linear (two sgemms through OpenBLAS), relu,
 * exact-erf GELU, counter-based dropout, batchnorm and softmax cross-entropy, plus the
 * counter-based generator and the seeded initialisers built on it. conv2d and maxpool2d live in
 * conv.c, the optimizers in optim.c.
 *
 * Plain loops over plain arrays: no threads of our own (OpenBLAS has its own inside sgemm), no
 * SIMD intrinsics. Reductions that feed a mean or a variance are done in double so that large
 * batches do not lose digits; elementwise work stays in float like torch's.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "ddp/nn.h"
#include "kernels/kernels.h"
#include "nn/bf16h.h"
#include "util/rng.h"
#include "util/util.h"

#define SQRT1_2 0.70710678118654752440 /* 1/√2; M_SQRT1_2 is not in strict C11 */

/* ---- counter-based random numbers ----------------------------------------------------------- */

uint64_t ddp_nn_rand_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return ddp__rand_u64(seed, stream, index); /* util/rng.h, shared with augment and CUDA */
}

void ddp_nn_init_uniform(float *w, size_t n, float bound, uint64_t seed, uint64_t tensor_id)
{
    for (size_t i = 0; i < n; i++) {
        float u = ddp__unit_f32(ddp__rand_u64(seed, tensor_id, i)); /* exact in float */
        w[i] = (2.0f * u - 1.0f) * bound;
    }
}

void ddp_nn_init_kaiming_uniform(float *w, size_t n, size_t fan_in, uint64_t seed,
                                 uint64_t tensor_id)
{
    float bound = fan_in ? (float)(1.0 / sqrt((double)fan_in)) : 0.0f;
    ddp_nn_init_uniform(w, n, bound, seed, tensor_id);
}

/* ---- linear ---------------------------------------------------------------------------------- */

void ddp_nn_linear_forward(const float *x, const float *W, const float *b, int B, int in, int out,
                           float *y)
{
    if (B <= 0 || out <= 0)
        return;
    /* y starts as the bias broadcast over rows, then y += x · Wᵀ. */
    for (int r = 0; r < B; r++) {
        float *yr = y + (size_t)r * out;
        if (b)
            memcpy(yr, b, sizeof(float) * (size_t)out);
        else
            memset(yr, 0, sizeof(float) * (size_t)out);
    }
    if (in <= 0)
        return;
    ddp__sgemm(false, true, B, out, in, 1.0f, x, in, W, in, 1.0f, y, out);
}

/* Both products of the backward with bf16 operands rounded once each (dy serves both): what
 * ddp__sgemm would compute in bf16, with one rounding of dy fewer. False (nothing written) when
 * bf16 products are off or a buffer cannot be had. */
static bool linear_backward_bf16(const float *dy, const float *x, const float *W, int B, int in,
                                 int out, float *dx, float *dW)
{
    if (!dx || !dW || B <= 0 || in <= 0 || out <= 0 || !ddp__gemm_bf16_active())
        return false;
    const uint16_t *dyh = ddp__bf16_rounded(0, dy, B, out, out),
                   *Wh = ddp__bf16_rounded(1, W, out, in, in),
                   *xh = ddp__bf16_rounded(2, x, B, in, in);
    if (!dyh || !Wh || !xh)
        return false;
    ddp__gemm_bf16_pre(false, false, B, in, out, 1.0f, dyh, out, Wh, in, 0.0f, dx, in);
    ddp__gemm_bf16_pre(true, false, out, in, B, 1.0f, dyh, out, xh, in, 1.0f, dW, in);
    return true;
}

void ddp_nn_linear_backward(const float *dy, const float *x, const float *W, int B, int in, int out,
                            float *dx, float *dW, float *db)
{
    if (linear_backward_bf16(dy, x, W, B, in, out, dx, dW)) {
        dx = NULL; /* done; the bias below */
        dW = NULL;
    }
    if (dx && B > 0 && in > 0) {
        if (out > 0) /* dx (B, in) = dy (B, out) · W (out, in) */
            ddp__sgemm(false, false, B, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
        else
            memset(dx, 0, sizeof(float) * (size_t)B * (size_t)in);
    }
    if (B <= 0 || out <= 0)
        return;
    if (dW && in > 0) /* dW (out, in) += dyᵀ (out, B) · x (B, in) */
        ddp__sgemm(true, false, out, in, B, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (db)
        for (int r = 0; r < B; r++)
            for (int o = 0; o < out; o++)
                db[o] += dy[(size_t)r * out + o];
}

/* ---- linear on a bfloat16 input (nn/bf16h.h) ------------------------------------------------ */

void ddp__nn_round_h(const float *x, size_t n, uint16_t *yh)
{
    /* ddp__bf16_round takes an int count: rows of at most 2^20. */
    for (size_t i = 0; i < n; i += (size_t)1 << 20) {
        size_t k = n - i < ((size_t)1 << 20) ? n - i : (size_t)1 << 20;
        ddp__bf16_round(yh + i, x + i, (int)k);
    }
}

void ddp__nn_linear_forward_h(const uint16_t *xh, const float *W, const float *b, int B, int in,
                              int out, bool add, uint16_t *wh, float *y)
{
    if (B > 0 && out > 0 && in > 0)
        ddp__nn_round_h(W, (size_t)out * (size_t)in, wh);
    ddp__nn_linear_forward_hh(xh, wh, b, B, in, out, add, y);
}

void ddp__nn_linear_forward_hh(const uint16_t *xh, const uint16_t *wh, const float *b, int B,
                               int in, int out, bool add, float *y)
{
    if (B <= 0 || out <= 0)
        return;
    for (int r = 0; r < B; r++) {
        float *yr = y + (size_t)r * out;
        if (add && b)
            for (int o = 0; o < out; o++)
                yr[o] += b[o];
        else if (!add && b)
            memcpy(yr, b, sizeof(float) * (size_t)out);
        else if (!add)
            memset(yr, 0, sizeof(float) * (size_t)out);
    }
    if (in <= 0)
        return;
    ddp__gemm_bf16_pre(false, true, B, out, in, 1.0f, xh, in, wh, in, 1.0f, y, out);
}

void ddp__nn_linear_backward_h(const float *dy, const uint16_t *xh, const float *W, int B, int in,
                               int out, uint16_t *dyh, uint16_t *wh, float *dx, float *dW,
                               float *db)
{
    if (B <= 0 || out <= 0) {
        if (dx && B > 0 && in > 0)
            memset(dx, 0, sizeof(float) * (size_t)B * (size_t)in);
        return;
    }
    /* dy rounded row by row, the bias gradient summed from the row while it is in cache (rows in
     * order, as ddp_nn_linear_backward sums them); dy NULL: dyh holds it rounded already. */
    for (int r = 0; dy && r < B; r++) {
        const float *dr = dy + (size_t)r * out;
        ddp__bf16_round(dyh + (size_t)r * out, dr, out);
        if (db)
            for (int o = 0; o < out; o++)
                db[o] += dr[o];
    }
    if (in <= 0)
        return;
    ddp__nn_round_h(W, (size_t)out * (size_t)in, wh);
    if (dx) /* dx (B, in) = dy (B, out) · W (out, in) */
        ddp__gemm_bf16_pre(false, false, B, in, out, 1.0f, dyh, out, wh, in, 0.0f, dx, in);
    if (dW) /* dW (out, in) += dyᵀ (out, B) · x (B, in) */
        ddp__gemm_bf16_pre(true, false, out, in, B, 1.0f, dyh, out, xh, in, 1.0f, dW, in);
}

/* ---- activations ----------------------------------------------------------------------------- */

void ddp_nn_relu_forward(const float *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void ddp_nn_relu_backward(const float *dy, const float *x, size_t n, float *dx)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void ddp_nn_gelu_forward(const float *x, size_t n, float *y)
{
    /* In double, then rounded once: within half an ulp of the true value, as torch's is. */
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        y[i] = (float)(0.5 * v * (1.0 + erf(v * SQRT1_2)));
    }
}

void ddp_nn_gelu_backward(const float *dy, const float *x, size_t n, float *dx)
{
    /* d/dx x·Φ(x) = Φ(x) + x·φ(x), φ(x) = exp(−x²/2) / sqrt(2π). */
    const double inv_sqrt_2pi = 0.39894228040143267794;
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        double cdf = 0.5 * (1.0 + erf(v * SQRT1_2));
        double pdf = inv_sqrt_2pi * exp(-0.5 * v * v);
        dx[i] = (float)((double)dy[i] * (cdf + v * pdf));
    }
}

/* ---- dropout --------------------------------------------------------------------------------- */

void ddp_nn_dropout_forward(const float *x, size_t n, float p, uint64_t seed, uint64_t step,
                            uint64_t offset, bool train, uint8_t *mask, float *y)
{
    if (!train || p <= 0.0f) {
        if (y != x && n)
            memmove(y, x, sizeof(float) * n);
        if (train && n)
            memset(mask, 1, n);
        return;
    }
    if (p >= 1.0f) {
        if (!n)
            return;
        memset(mask, 0, n);
        memset(y, 0, sizeof(float) * n);
        return;
    }
    /* Keep element i iff the top 32 bits of its hash are ≥ p·2³²: P(keep) = 1 − p to 2⁻³². */
    uint64_t thresh = (uint64_t)((double)p * 4294967296.0);
    float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) {
        uint8_t keep = (ddp__rand_u64(seed, step, offset + i) >> 32) >= thresh;
        mask[i] = keep;
        y[i] = keep ? x[i] * scale : 0.0f;
    }
}

void ddp_nn_dropout_backward(const float *dy, const uint8_t *mask, size_t n, float p, bool train,
                             float *dx)
{
    if (!train || p <= 0.0f) {
        if (dx != dy && n)
            memmove(dx, dy, sizeof(float) * n);
        return;
    }
    float scale = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++)
        dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

/* ---- batchnorm ------------------------------------------------------------------------------- */

/* Σ x[i] (sq false) or Σ (x[i] − mean)² (sq true) in double, over four independent partial sums:
 * one long chain of dependent additions made the statistics a tenth of a CNN step. */
static double sum4(const float *x, int n, double mean, bool sq)
{
    double a[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) {
            double d = x[i + k] - mean;
            a[k] += sq ? d * d : x[i + k];
        }
    for (; i < n; i++) {
        double d = x[i] - mean;
        a[0] += sq ? d * d : x[i];
    }
    return (a[0] + a[1]) + (a[2] + a[3]);
}

ddp_status ddp_nn_batchnorm_forward(const float *x, int B, int C, int hw, const float *gamma,
                                    const float *beta, float momentum, float eps, bool train,
                                    float *running_mean, float *running_var, float *y,
                                    float *save_mean, float *save_invstd, ddp_error *err)
{
    size_t N = (size_t)(B > 0 ? B : 0) * (size_t)(hw > 0 ? hw : 0);
    if (train && N < 2)
        return ddp__err(err, DDP_ERR_INVALID,
                        "batchnorm in training mode needs at least 2 values per channel, got %zu "
                        "(batch %d × %d positions); use a larger batch or eval mode",
                        N, B, hw);
    for (int c = 0; c < C; c++) {
        double mean, var;
        if (train) {
            /* Two passes in double: the mean, then the biased variance around it. */
            double s = 0.0, ss = 0.0;
            for (int b = 0; b < B; b++)
                s += sum4(x + ((size_t)b * C + c) * hw, hw, 0.0, false);
            mean = s / (double)N;
            for (int b = 0; b < B; b++)
                ss += sum4(x + ((size_t)b * C + c) * hw, hw, mean, true);
            var = ss / (double)N;
            running_mean[c] = (float)((1.0 - momentum) * running_mean[c] + momentum * mean);
            running_var[c] = (float)((1.0 - momentum) * running_var[c] +
                                     momentum * var * (double)N / (double)(N - 1));
        } else {
            mean = running_mean[c];
            var = running_var[c];
        }
        double invstd = 1.0 / sqrt(var + eps);
        /* y = x·a + k with a = gamma·invstd, k = beta − mean·a. */
        double a = gamma[c] * invstd, k = beta[c] - mean * a;
        for (int b = 0; b < B; b++) {
            const float *xc = x + ((size_t)b * C + c) * hw;
            float *yc = y + ((size_t)b * C + c) * hw;
            for (int i = 0; i < hw; i++)
                yc[i] = (float)(xc[i] * a + k);
        }
        save_mean[c] = (float)mean;
        save_invstd[c] = (float)invstd;
    }
    return DDP_OK;
}

void ddp_nn_batchnorm_backward(const float *dy, const float *x, int B, int C, int hw,
                               const float *gamma, const float *save_mean, const float *save_invstd,
                               bool train, float *dx, float *dgamma, float *dbeta)
{
    size_t N = (size_t)(B > 0 ? B : 0) * (size_t)(hw > 0 ? hw : 0);
    if (N == 0)
        return;
    for (int c = 0; c < C; c++) {
        double mean = save_mean[c], invstd = save_invstd[c];
        double sdy = 0.0, sdyx = 0.0; /* Σ dy and Σ dy·x̂ over the channel */
        for (int b = 0; b < B; b++) {
            const float *xc = x + ((size_t)b * C + c) * hw;
            const float *dc = dy + ((size_t)b * C + c) * hw;
            for (int i = 0; i < hw; i++) {
                sdy += dc[i];
                sdyx += dc[i] * ((xc[i] - mean) * invstd);
            }
        }
        if (dgamma)
            dgamma[c] += (float)sdyx;
        if (dbeta)
            dbeta[c] += (float)sdy;
        if (!dx)
            continue;
        double g = gamma[c] * invstd;
        /* train: dx = g/N · (N·dy − Σdy − x̂·Σdy·x̂); eval: the statistics are constants. */
        double mdy = train ? sdy / (double)N : 0.0, mdyx = train ? sdyx / (double)N : 0.0;
        for (int b = 0; b < B; b++) {
            const float *xc = x + ((size_t)b * C + c) * hw;
            const float *dc = dy + ((size_t)b * C + c) * hw;
            float *dxc = dx + ((size_t)b * C + c) * hw;
            for (int i = 0; i < hw; i++) {
                double xhat = (xc[i] - mean) * invstd;
                dxc[i] = (float)(g * (dc[i] - mdy - xhat * mdyx));
            }
        }
    }
}

/* ---- softmax cross-entropy ------------------------------------------------------------------- */

ddp_status ddp_nn_softmax_xent(const float *logits, const int32_t *labels, int B, int C,
                               float scale, double *loss, float *dlogits, int *correct,
                               ddp_error *err)
{
    /* Labels first, so that nothing is written on failure. */
    for (int r = 0; r < B; r++)
        if (labels[r] < 0 || labels[r] >= C)
            return ddp__err(err, DDP_ERR_INVALID,
                            "cross-entropy: label %ld of row %d is outside [0, %d); check the "
                            "dataset's labels against the model's number of classes",
                            (long)labels[r], r, C);
    double total = 0.0;
    int hits = 0;
    double gscale = B > 0 ? (double)scale / (double)B : 0.0;
    for (int r = 0; r < B; r++) {
        const float *l = logits + (size_t)r * C;
        int y = labels[r], arg = 0;
        float mx = l[0];
        for (int j = 1; j < C; j++)
            if (l[j] > mx)
                mx = l[j], arg = j;
        hits += arg == y;
        double se = 0.0; /* Σ exp(l − max), in double: the log-sum-exp is then exact to float */
        for (int j = 0; j < C; j++)
            se += exp((double)l[j] - mx);
        double lse = mx + log(se);
        total += lse - l[y];
        if (dlogits) {
            float *d = dlogits + (size_t)r * C;
            for (int j = 0; j < C; j++) {
                double sm = exp((double)l[j] - lse);
                d[j] = (float)((sm - (j == y)) * gscale);
            }
        }
    }
    if (loss)
        *loss = B > 0 ? total / (double)B : 0.0;
    if (correct)
        *correct = hits;
    return DDP_OK;
}
