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
    double *d_sum; /* (1,) ddp__cuda_sumsq's accumulator */
    int *d_flag;   /* (1,) ddp__cuda_unscale's found-inf flag */
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
    return ddp__cuda_fail(err, DDP_ERR_SYSTEM, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                          cudaGetErrorName(e));
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

/* db (C,) += Σ_r dy (N, C)[r] with dy bf16, summed in fp32 (gemm.cu): the bias gradient of a
 * bf16 linear layer. */
ddp_status ddp__cuda_colsum_bf16(ddp__cuda_ctx *c, const uint16_t *dy, int N, int C, float *db,
                                 ddp_error *err);

/* Loads and stores of one activation element as fp32 arithmetic sees it: fp32 as is, bf16
 * (uint16_t bits) widened exactly and narrowed to nearest even (util/half.h, the CPU's rounding),
 * so one templated kernel serves both precisions and the fp32 instance is the plain code. */
__device__ inline float ddp__ld(const float *p)
{
    return *p;
}
__device__ inline float ddp__ld(const uint16_t *p)
{
    return ddp__bf16_to_f32(*p);
}
__device__ inline void ddp__st(float *p, float v)
{
    *p = v;
}
__device__ inline void ddp__st(uint16_t *p, float v)
{
    *p = ddp__f32_to_bf16(v);
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
