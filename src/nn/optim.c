/*
 * optim.c — the optimizers of ddp/nn.h (SGD with momentum, AdamW) and global gradient-norm
 * clipping, written as transcriptions of torch's single-tensor CPU code paths so that the
 * operations, and hence the float rounding, happen in the same order: scalars (bias
 * corrections, step sizes) in double like Python's floats, tensor arithmetic in float.
 *
 * The optimizer state lives in caller-owned flat arrays; there is no optimizer object. Under
 * DDP every rank holds the same parameters, averaged gradients and state, and runs the same step.
 */
#include <math.h>

#include "ddp/nn.h"

void ddp_nn_sgd_step(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                     float weight_decay, uint64_t step)
{
    for (size_t i = 0; i < n; i++) {
        float d = weight_decay != 0.0f ? g[i] + weight_decay * p[i] : g[i];
        if (momentum != 0.0f) {
            buf[i] = step <= 1 ? d : buf[i] * momentum + d;
            d = buf[i];
        }
        p[i] = p[i] + -lr * d;
    }
}

void ddp_nn_adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, uint64_t step)
{
    double t = step ? (double)step : 1.0;
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float a1 = (float)(1.0 - beta1), a2 = (float)(1.0 - beta2);
    for (size_t i = 0; i < n; i++) {
        float pi = p[i] * decay;
        m[i] = m[i] * beta1 + a1 * g[i];
        v[i] = v[i] * beta2 + a2 * (g[i] * g[i]);
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = pi + -step_size * (m[i] / denom);
    }
}

float ddp_nn_clip_coef(double norm, double max_norm)
{
    double coef = max_norm / (norm + 1e-6);
    /* torch multiplies by min(coef, 1); a factor of 1 changes nothing, so the caller skips the
     * pass. A NaN norm gives a NaN coef, which torch applies too ("coef < 1" is false for NaN). */
    return coef < 1.0 || isnan(coef) ? (float)coef : 1.0f;
}

double ddp_nn_clip_grad_norm(float *const *grads, const size_t *counts, int n_arrays,
                             double max_norm)
{
    double ss = 0.0;
    for (int a = 0; a < n_arrays; a++)
        for (size_t i = 0; i < counts[a]; i++)
            ss += (double)grads[a][i] * grads[a][i];
    double norm = sqrt(ss);
    float f = ddp_nn_clip_coef(norm, max_norm);
    if (f != 1.0f) {
        for (int a = 0; a < n_arrays; a++)
            for (size_t i = 0; i < counts[a]; i++)
                grads[a][i] *= f;
    }
    return norm;
}
