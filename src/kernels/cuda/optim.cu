/*
 * kernels/cuda/optim.cu — what runs between backward and the next forward on the device: fused
 * AdamW over fp32 master weights (with an optional bf16 copy for bf16 matmuls), the sum of
 * squares for the global gradient norm, scaling (clipping), GradScaler's unscale-and-check, and
 * fp32 ↔ bf16/fp16 conversions with util/half.h's rounding (the CPU's, bit for bit).
 */
#include <math.h>

#include "common.cuh"

extern "C" {
#include "kernels/cuda/devmath.h"
}

extern "C" {
#include "util/half.h"
}

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float decay,
                             float beta1, float a1, float beta2, float a2, float bc2_sqrt,
                             float eps, float step_size, float gs, uint16_t *p_bf16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * gs;
        float pi = p[i] * decay;
        float mi = m[i] * beta1 + a1 * gi;
        float vi = v[i] * beta2 + a2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        pi = pi + -step_size * (mi / denom);
        p[i] = pi;
        if (p_bf16)
            p_bf16[i] = ddp__f32_to_bf16(pi);
    }
}

extern "C" ddp_status ddp__cuda_adamw(ddp__cuda_ctx *c, float *p, const float *g, float *m,
                                      float *v, size_t n, float lr, float beta1, float beta2,
                                      float eps, float weight_decay, uint64_t step,
                                      float grad_scale, uint16_t *p_bf16, ddp_error *err)
{
    /* the constants exactly as ddp_nn_adamw_step forms them */
    double t = step ? (double)step : 1.0;
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float step_size = (float)((double)lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float a1 = (float)(1.0 - beta1), a2 = (float)(1.0 - beta2);
    if (n == 0)
        return DDP_OK;
    adamw_kernel<<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(
        p, g, m, v, n, decay, beta1, a1, beta2, a2, bc2_sqrt, eps, step_size, grad_scale, p_bf16);
    return ddp__cuda_launched("adamw", err);
}

/* The sum of squares and the unscale run devmath.cu's kernels (the GPU reducer's) on the
 * context's stream. */
extern "C" ddp_status ddp__cuda_sumsq(ddp__cuda_ctx *c, const float *g, size_t n,
                                      double *sumsq_host, ddp_error *err)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status st = ddp__cuda_memset0(c, c->d_sum, sizeof(double), err);
    if (st)
        return st;
    if ((st = ddp__devmath_sumsq((void *)c->stream, g, n, DDP_FLOAT32, c->d_sum, msg)))
        return ddp__cuda_fail(err, st, "%s", msg);
    return ddp__cuda_to_host(c, sumsq_host, c->d_sum, sizeof(double), err);
}

__global__ void scale_kernel(float *x, size_t n, float s)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

extern "C" ddp_status ddp__cuda_scale(ddp__cuda_ctx *c, float *x, size_t n, float s,
                                      ddp_error *err)
{
    if (n == 0)
        return DDP_OK;
    scale_kernel<<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(x, n, s);
    return ddp__cuda_launched("scale", err);
}

extern "C" ddp_status ddp__cuda_unscale(ddp__cuda_ctx *c, float *g, size_t n, float inv_scale,
                                        bool *found_inf_host, ddp_error *err)
{
    ddp_status st = ddp__cuda_memset0(c, c->d_flag, sizeof(int), err);
    if (st)
        return st;
    char msg[DDP_ERRMSG_MAX];
    if ((st = ddp__devmath_unscale((void *)c->stream, g, n, inv_scale, c->d_flag, msg)))
        return ddp__cuda_fail(err, st, "%s", msg);
    int flag = 0;
    if ((st = ddp__cuda_to_host(c, &flag, c->d_flag, sizeof flag, err)))
        return st;
    *found_inf_host = flag != 0;
    return DDP_OK;
}

extern "C" ddp_status ddp__cuda_f32_to_h(ddp__cuda_ctx *c, ddp_dtype ht, const float *src, size_t n,
                                         uint16_t *dst, ddp_error *err)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status st = ddp__cuda_half_check(ht, "conversion to 16 bits", err);
    if (!st && (st = ddp__devmath_convert((void *)c->stream, dst, ht, src, DDP_FLOAT32, n, msg)))
        return ddp__cuda_fail(err, st, "%s", msg);
    return st;
}

extern "C" ddp_status ddp__cuda_h_to_f32(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *src,
                                         size_t n, float *dst, ddp_error *err)
{
    char msg[DDP_ERRMSG_MAX];
    ddp_status st = ddp__cuda_half_check(ht, "conversion from 16 bits", err);
    if (!st && (st = ddp__devmath_convert((void *)c->stream, dst, DDP_FLOAT32, src, ht, n, msg)))
        return ddp__cuda_fail(err, st, "%s", msg);
    return st;
}
