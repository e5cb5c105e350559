/*
 * kernels/cuda/devmath.cu — the GPU reducer's arithmetic (devmath.h): dtype conversion of a
 * gradient bucket for bfloat16 compression (and of the GPT's weights into their 16-bit copy) and
 * the sum of squares for the gradient norm, on the group's stream. UNVERIFIED: written without a
 * GPU; the reducer's tests run the same contract on the fake GPU (staged/fakedev.c), and on a GPU
 * through scripts/gpu-check.sh.
 */
#include "common.cuh"

extern "C" {
#include "kernels/cuda/devmath.h"
#include "util/half.h"
}
/* The module calls nothing in libddp by symbol (gpu_module.h): messages through snprintf. */

namespace
{

/* dst = src, element by element, through fp32 (ddp__ld/ddp__st: nearest even when narrowing,
 * fp16 overflowing to ±inf; widening exact). */
template <typename D, typename S> __global__ void convert_kernel(const S *src, size_t n, D *dst)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        ddp__st(dst + i, ddp__ld(src + i));
}

template <typename T> __device__ inline double as_double(T v);
template <> __device__ inline double as_double<float>(float v)
{
    return (double)v;
}
template <> __device__ inline double as_double<double>(double v)
{
    return v;
}

/* 16-bit floats arrive as their bits; BF selects bfloat16 over IEEE half. */
template <bool BF> struct half_bits {
    uint16_t v;
};
template <> __device__ inline double as_double<half_bits<true>>(half_bits<true> h)
{
    return (double)ddp__bf16_to_f32(h.v);
}
template <> __device__ inline double as_double<half_bits<false>>(half_bits<false> h)
{
    return (double)ddp__f16_to_f32(h.v);
}

/* partial[b] = block b's sum of squares (each thread's strided terms in order, then the block's
 * fixed tree). */
template <typename T> __global__ void sumsq_kernel(const T *x, size_t n, double *partial)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = as_double(x[i]);
        s += v * v;
    }
    s = ddp__block_sum(s, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = s;
}

/* *acc += partial[0 … nb) (nb ≤ 1024, one block of 1024 threads): the same order every time. */
__global__ void sumsq_finish(const double *partial, unsigned nb, double *acc)
{
    __shared__ double sh[32];
    double s = ddp__block_sum(threadIdx.x < nb ? partial[threadIdx.x] : 0.0, sh);
    if (threadIdx.x == 0)
        *acc += s;
}

__global__ void sgd_kernel(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                           float wd, bool first, float gs)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = gs != 1.0f ? __fmul_rn(g[i], gs) : g[i];
        float d = wd != 0.0f ? __fadd_rn(gi, __fmul_rn(wd, p[i])) : gi;
        if (momentum != 0.0f) {
            buf[i] = first ? d : __fadd_rn(__fmul_rn(buf[i], momentum), d);
            d = buf[i];
        }
        p[i] = __fadd_rn(p[i], __fmul_rn(-lr, d));
    }
}

__global__ void unscale_kernel(float *g, size_t n, float inv, int *flag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = g[i];
        if (!isfinite(v))
            *flag = 1; /* every writer writes 1 */
        g[i] = v * inv;
    }
}

ddp_status launched(const char *what, char *msg)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return DDP_OK;
    snprintf(msg, DDP_ERRMSG_MAX, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return DDP_ERR_SYSTEM;
}

/* At most 1024 blocks for a reduction: sumsq_finish adds their partial sums in one block. */
unsigned reduce_blocks(size_t n)
{
    unsigned b = ddp__cuda_blocks(n, 256);
    return b > 1024 ? 1024 : b;
}

} // namespace

extern "C" ddp_status ddp__devmath_convert(void *stream, void *dst, ddp_dtype dt, const void *src,
                                           ddp_dtype st, size_t n, char *msg)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (n == 0)
        return DDP_OK;
    const unsigned blocks = ddp__cuda_blocks(n, 256);
    if (st == DDP_FLOAT32 && dt == DDP_BFLOAT16)
        convert_kernel<<<blocks, 256, 0, s>>>((const float *)src, n, (ddp__bf16 *)dst);
    else if (st == DDP_BFLOAT16 && dt == DDP_FLOAT32)
        convert_kernel<<<blocks, 256, 0, s>>>((const ddp__bf16 *)src, n, (float *)dst);
    else if (st == DDP_FLOAT32 && dt == DDP_FLOAT16)
        convert_kernel<<<blocks, 256, 0, s>>>((const float *)src, n, (ddp__fp16 *)dst);
    else if (st == DDP_FLOAT16 && dt == DDP_FLOAT32)
        convert_kernel<<<blocks, 256, 0, s>>>((const ddp__fp16 *)src, n, (float *)dst);
    else {
        snprintf(msg, DDP_ERRMSG_MAX,
                 "device conversion from dtype %d to dtype %d is not implemented (float32 <-> "
                 "bfloat16 or float16 only)",
                 (int)st, (int)dt);
        return DDP_ERR_INVALID;
    }
    return launched("dtype conversion", msg);
}

extern "C" ddp_status ddp__devmath_sumsq(void *stream, const void *x, size_t n, ddp_dtype t,
                                         double *acc_dev, char *msg)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (n == 0)
        return DDP_OK;
    const unsigned nb = reduce_blocks(n);
    double *partial = acc_dev + 1;
    switch (t) {
    case DDP_FLOAT32: sumsq_kernel<<<nb, 256, 0, s>>>((const float *)x, n, partial); break;
    case DDP_FLOAT64: sumsq_kernel<<<nb, 256, 0, s>>>((const double *)x, n, partial); break;
    case DDP_BFLOAT16:
        sumsq_kernel<<<nb, 256, 0, s>>>((const half_bits<true> *)x, n, partial);
        break;
    case DDP_FLOAT16:
        sumsq_kernel<<<nb, 256, 0, s>>>((const half_bits<false> *)x, n, partial);
        break;
    default:
        snprintf(msg, DDP_ERRMSG_MAX, "sum of squares of dtype %d is not implemented", (int)t);
        return DDP_ERR_INVALID;
    }
    ddp_status st = launched("sum of squares", msg);
    if (st)
        return st;
    static_assert(DDP__SUMSQ_DOUBLES - 1 >= 1024, "room for every block's partial sum");
    sumsq_finish<<<1, 1024, 0, s>>>(partial, nb, acc_dev);
    return launched("sum of squares (the blocks' sums)", msg);
}

extern "C" ddp_status ddp__devmath_sgd(void *stream, float *p, const float *g, float *buf, size_t n,
                                       float lr, float momentum, float weight_decay, uint64_t step,
                                       float grad_scale, char *msg)
{
    if (n == 0)
        return DDP_OK;
    sgd_kernel<<<ddp__cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(
        p, g, buf, n, lr, momentum, weight_decay, step <= 1, grad_scale);
    return launched("sgd step", msg);
}

extern "C" ddp_status ddp__devmath_unscale(void *stream, float *g, size_t n, float inv,
                                           int *flag_dev, char *msg)
{
    if (n == 0)
        return DDP_OK;
    unscale_kernel<<<ddp__cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(g, n, inv, flag_dev);
    return launched("unscale", msg);
}
