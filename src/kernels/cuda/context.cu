/*
 * kernels/cuda/context.cu — a context on one device (its stream, cuBLAS and cuBLASLt handles,
 * GEMM workspace) and plain device memory: cudaMalloc, copies, memset. No managed memory, no
 * caching allocator: the model allocates once at build.
 */
#include <time.h>

#include "common.cuh"
#include "kernels/cuda/devmath.h"
#include "kernels/cuda/gpunap.h"

#define WORKSPACE_BYTES (32u << 20) /* cuBLASLt's: 32 MiB, what Hopper's kernels like */
#define FP32_REDUCTIONS                                                                            \
    ((cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION))

extern "C" ddp_status ddp__cuda_ctx_create(int device, ddp__cuda_ctx **out, ddp_error *err)
{
    int n = 0;
    ddp_status st = ddp__gpu_device_count(&n, err);
    if (st != DDP_OK)
        return st;
    if (device < 0 || device >= n)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda device %d: out of range (%d visible)",
                              device, n);
    if ((st = ddp__cuda_check(cudaSetDevice(device), "cudaSetDevice", err)))
        return st;
    ddp__cuda_ctx *c = (ddp__cuda_ctx *)calloc(1, sizeof *c);
    if (!c)
        return ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda: out of memory for a context");
    c->device = device;
    c->workspace_bytes = WORKSPACE_BYTES;
    if ((st = ddp__cuda_check(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                              "cudaStreamCreate", err)) ||
        (st = ddp__cublas_check(cublasCreate(&c->blas), "cublasCreate", err)) ||
        (st = ddp__cublas_check(cublasSetStream(c->blas, c->stream), "cublasSetStream", err)) ||
        /* fp32 accumulation also across split-K parts when the output is bf16 or fp16 (cuBLAS
         * may otherwise add the parts in the output's type; docs/gpu.md's table says fp32) */
        (st = ddp__cublas_check(cublasSetMathMode(c->blas, FP32_REDUCTIONS), "cublasSetMathMode",
                                err)) ||
        (st = ddp__cublas_check(cublasLtCreate(&c->lt), "cublasLtCreate", err)) ||
        (st = ddp__cuda_check(cudaMalloc(&c->workspace, c->workspace_bytes),
                              "cudaMalloc of the GEMM workspace", err)) ||
        (st = ddp__cuda_check(cudaMalloc((void **)&c->d_sum, sizeof(double) * DDP__SUMSQ_DOUBLES),
                              "cudaMalloc", err)) ||
        (st = ddp__cuda_check(cudaMalloc((void **)&c->d_flag, sizeof(int)), "cudaMalloc", err)) ||
        (st = ddp__cuda_check(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming),
                              "cudaEventCreate", err)) ||
        /* cuBLAS's own GEMMs (the attention's batched ones) use the same workspace, on the same
         * stream; after cublasSetStream, which resets it to cuBLAS's default pool. */
        (st = ddp__cublas_check(cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes),
                                "cublasSetWorkspace", err))) {
        ddp__cuda_ctx_destroy(c);
        return st;
    }
    *out = c;
    return DDP_OK;
}

extern "C" void ddp__cuda_ctx_destroy(ddp__cuda_ctx *c)
{
    if (!c)
        return;
    if (c->stream)
        (void)ddp__cuda_sync(c, NULL); /* bounded, unlike cudaStreamSynchronize */
    if (c->done)
        cudaEventDestroy(c->done);
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->lt)
        cublasLtDestroy(c->lt);
    cudaFree(c->workspace);
    cudaFree(c->d_sum);
    cudaFree(c->d_flag);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

/* Polls an event recorded after the queued work (napping between polls: gpunap.h), never
 * cudaStreamSynchronize, which can neither time out nor be interrupted: a stuck GPU becomes an
 * error after DDP__CUDA_SYNC_LIMIT_MS, not a hang. */
extern "C" ddp_status ddp__cuda_sync(ddp__cuda_ctx *c, ddp_error *err)
{
    ddp_status st = ddp__cuda_check(cudaEventRecord(c->done, c->stream), "cudaEventRecord", err);
    struct timespec t0, now;
    long nap = DDP__GPU_NAP_FIRST_NS;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (st == DDP_OK) {
        cudaError_t e = cudaEventQuery(c->done);
        if (e == cudaSuccess)
            return DDP_OK;
        if (e != cudaErrorNotReady)
            return ddp__cuda_check(e, "the queued work", err);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long ms = (now.tv_sec - t0.tv_sec) * 1000LL + (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= DDP__CUDA_SYNC_LIMIT_MS)
            return ddp__cuda_fail(err, DDP_ERR_TIMEOUT,
                                  "cuda: the GPU's queued work did not finish in %d min; HINT: a "
                                  "kernel may hang or another process hold the GPU (nvidia-smi)",
                                  DDP__CUDA_SYNC_LIMIT_MS / 60000);
        ddp__gpu_nap(&nap);
    }
    return st;
}

extern "C" ddp_status ddp__cuda_malloc(void **out, size_t bytes, ddp_error *err)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return ddp__cuda_fail(err, e == cudaErrorMemoryAllocation ? DDP_ERR_NOMEM : DDP_ERR_SYSTEM,
                              "cuda: cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    *out = p;
    return DDP_OK;
}

extern "C" void ddp__cuda_free(void *p)
{
    /* A failure here (a context already broken) must not be reported later as the next
     * kernel launch's: cleared, as every other ignored call's. */
    if (p && cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
}

extern "C" ddp_status ddp__cuda_to_device(ddp__cuda_ctx *c, void *dst, const void *src_host,
                                          size_t bytes, ddp_error *err)
{
    ddp_status st = ddp__cuda_check(
        cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, c->stream), "copy to the "
                                                                                  "device",
        err);
    return st ? st : ddp__cuda_sync(c, err);
}

extern "C" ddp_status ddp__cuda_to_host(ddp__cuda_ctx *c, void *dst_host, const void *src,
                                        size_t bytes, ddp_error *err)
{
    ddp_status st = ddp__cuda_check(
        cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, c->stream), "copy to the "
                                                                                  "host",
        err);
    return st ? st : ddp__cuda_sync(c, err);
}

extern "C" ddp_status ddp__cuda_memset0(ddp__cuda_ctx *c, void *dst, size_t bytes, ddp_error *err)
{
    return ddp__cuda_check(cudaMemsetAsync(dst, 0, bytes, c->stream), "memset", err);
}

extern "C" ddp_status ddp__cuda_copy(ddp__cuda_ctx *c, void *dst, const void *src, size_t bytes,
                                     ddp_error *err)
{
    return ddp__cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream),
                           "device copy", err);
}
