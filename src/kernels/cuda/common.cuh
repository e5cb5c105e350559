/*
 * kernels/cuda/common.cuh — what the .cu files of this folder share: the context's layout, error
 * messages from CUDA and cuBLAS codes, launch geometry and block reductions. Private to
 * src/kernels/cuda.
 */
#ifndef DDP_KERNELS_CUDA_COMMON_CUH
#define DDP_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>

extern "C" {
#include "kernels/cuda_kernels.h"
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"
#include "util/half.h"
}

struct ddp__cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace; /* cuBLASLt's, workspace_bytes */
    size_t workspace_bytes;
    double *d_sum;    /* (DDP__SUMSQ_DOUBLES,) ddp__cuda_sumsq's accumulator, then its scratch */
    int *d_flag;      /* (1,) ddp__cuda_unscale's found-inf flag */
    cudaEvent_t done; /* ddp__cuda_sync records it and polls it, with a deadline */
};

/* How long ddp__cuda_sync waits for the context's queued work before calling it stuck: no step
 * of a training run queues minutes of GPU work between two waits. */
#define DDP__CUDA_SYNC_LIMIT_MS (10 * 60 * 1000)

/* Records st and a one-line message in err (may be NULL); returns st. */
static inline ddp_status ddp__cuda_fail(ddp_error *err, ddp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline ddp_status ddp__cuda_fail(ddp_error *err, ddp_status st, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = st;
    }
    return st;
}

/* DDP_OK for cudaSuccess, else DDP_ERR_SYSTEM naming what and CUDA's message. */
static inline ddp_status ddp__cuda_check(cudaError_t e, const char *what, ddp_error *err)
{
    if (e == cudaSuccess)
        return DDP_OK;
    /* a GPU in an exclusive compute mode takes one process: a second rank on it is refused */
    const char *hint = e == cudaErrorDevicesUnavailable
                           ? "; HINT: the GPU is busy or in an exclusive compute mode (nvidia-smi "
                             "-q -d COMPUTE): ranks that share it need the Default mode "
                             "(nvidia-smi -c DEFAULT), or one rank per GPU"
                           : "";
    return ddp__cuda_fail(err, DDP_ERR_SYSTEM, "cuda: %s: %s (%s)%s", what, cudaGetErrorString(e),
                          cudaGetErrorName(e), hint);
}

/* The launch that was just queued: DDP_OK, or its error. */
static inline ddp_status ddp__cuda_launched(const char *what, ddp_error *err)
{
    return ddp__cuda_check(cudaGetLastError(), what, err);
}

static inline ddp_status ddp__cublas_check(cublasStatus_t s, const char *what, ddp_error *err)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return DDP_OK;
    return ddp__cuda_fail(err, DDP_ERR_SYSTEM, "cublas: %s: %s (%d)", what,
                          cublasGetStatusString(s), (int)s);
}

/* db (C,) += Σ_r dy (N, C)[r] (gemm.cu): a linear layer's bias gradient. */
ddp_status ddp__cuda_colsum(ddp__cuda_ctx *c, const float *dy, int N, int C, float *db,
                            ddp_error *err);

/* db (C,) += Σ_r dy (N, C)[r] with dy 16-bit of dtype ht (DDP_BFLOAT16 or DDP_FLOAT16), summed
 * in fp32 (gemm.cu): the bias gradient of a 16-bit linear layer. */
ddp_status ddp__cuda_colsum_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *dy, int N, int C,
                              float *db, ddp_error *err);

/* The two 16-bit storage formats, as the bits util/half.h converts (a distinct type each, so a
 * kernel templated on its element type is instantiated once per format): bfloat16 and IEEE half. */
struct ddp__bf16 {
    uint16_t bits;
};
struct ddp__fp16 {
    uint16_t bits;
};

/* Loads and stores of one activation element as fp32 arithmetic sees it: fp32 as is, 16-bit
 * widened exactly and narrowed to nearest even (util/half.h, the CPU's rounding; fp16 overflows
 * to ±inf, never clamped, so that the loss scaler sees it), so one templated kernel serves every
 * precision and the fp32 instance is the plain code. */
__device__ inline float ddp__ld(const float *p)
{
    return *p;
}
__device__ inline float ddp__ld(const ddp__bf16 *p)
{
    return ddp__bf16_to_f32(p->bits);
}
__device__ inline float ddp__ld(const ddp__fp16 *p)
{
    return ddp__f16_to_f32(p->bits);
}
__device__ inline void ddp__st(float *p, float v)
{
    *p = v;
}
__device__ inline void ddp__st(ddp__bf16 *p, float v)
{
    p->bits = ddp__f32_to_bf16(v);
}
__device__ inline void ddp__st(ddp__fp16 *p, float v)
{
    p->bits = ddp__f32_to_f16(v);
}

/* Whether t is one of the two 16-bit activation dtypes. */
static inline bool ddp__cuda_is_half(ddp_dtype t)
{
    return t == DDP_BFLOAT16 || t == DDP_FLOAT16;
}

/* cuBLAS's name for a dtype of the GPT's products: fp32, bf16 or fp16. */
static inline cudaDataType_t ddp__cuda_type(ddp_dtype t)
{
    return t == DDP_BFLOAT16 ? CUDA_R_16BF : t == DDP_FLOAT16 ? CUDA_R_16F : CUDA_R_32F;
}

/* "bf16" or "fp16", for messages. */
static inline const char *ddp__cuda_half_name(ddp_dtype t)
{
    return t == DDP_FLOAT16 ? "fp16" : "bf16";
}

/* f(E{}) with E the 16-bit format of ht (ddp__fp16 for DDP_FLOAT16, else ddp__bf16; the caller
 * has checked ht): one launch site per templated kernel, instantiated for both formats, as in
 *   ddp__half_dispatch(ht, [&](auto e) { using E = decltype(e); k<E><<<…>>>((E *)y, …); }); */
template <typename F> static inline void ddp__half_dispatch(ddp_dtype ht, F &&f)
{
    if (ht == DDP_FLOAT16)
        f(ddp__fp16{});
    else
        f(ddp__bf16{});
}

/* DDP_OK when ht is bf16 or fp16, else DDP_ERR_INVALID naming what refused it. */
static inline ddp_status ddp__cuda_half_check(ddp_dtype ht, const char *what, ddp_error *err)
{
    if (ddp__cuda_is_half(ht))
        return DDP_OK;
    return ddp__cuda_fail(err, DDP_ERR_INVALID,
                          "cuda %s: dtype %d is not a 16-bit float (bfloat16 or float16)", what,
                          (int)ht);
}

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned ddp__cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1)
        b = 1;
    return b > 65535u * 16u ? 65535u * 16u : (unsigned)b;
}

template <typename T> __device__ inline T ddp__warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float ddp__warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The sum over a block of at most 1024 threads (blockDim.x a multiple of 32); every thread gets
 * it. shared: 32 Ts. */
template <typename T> __device__ inline T ddp__block_sum(T v, T *shared)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = ddp__warp_sum(v);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    T r = lane < nw ? shared[lane] : T(0);
    return ddp__warp_sum(r);
}

#endif /* DDP_KERNELS_CUDA_COMMON_CUH */
