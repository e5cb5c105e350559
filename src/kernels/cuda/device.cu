/*
 * kernels/cuda/device.cu — what the CUDA runtime says about this machine's GPUs. Built only with
 * DDP_CUDA (CMake finds nvcc), into the GPU module libddp_gpu.so with the CUDA runtime linked
 * statically; libddp reaches these through the module's table (kernels/gpu_module.h, loaded by
 * kernels/gpu.c on first GPU use). This folder is the only place that includes a CUDA header.
 * It does not pick a device or create a context beyond what the runtime does for the query. The
 * module is a leaf: it calls nothing in libddp (it formats its own messages rather than use
 * util's ddp__err), so it loads into any program that has libddp.
 */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <stdio.h>

extern "C" {
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"
}

/* Records st and a one-line message in err (may be NULL); returns st. */
static ddp_status fail(ddp_error *err, ddp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ddp_status fail(ddp_error *err, ddp_status st, const char *fmt, ...)
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

extern "C" ddp_status ddp__gpu_device_count(int *n, ddp_error *err)
{
    if (!n)
        return fail(err, DDP_ERR_INVALID, "cuda device count: the output n is NULL");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    (void)cudaGetLastError(); /* the query's error is not sticky; leave none behind */
    if (e == cudaSuccess && count > 0) {
        *n = count;
        return DDP_OK;
    }
    if (e == cudaSuccess || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return fail(err, DDP_ERR_NOT_FOUND,
                    "cuda: no usable GPU on this machine: cudaGetDeviceCount says %s (%s, "
                    "%d); HINT: run on a machine with an NVIDIA GPU and driver "
                    "(nvidia-smi lists them), or check CUDA_VISIBLE_DEVICES",
                    e == cudaSuccess ? "0 devices" : cudaGetErrorString(e), cudaGetErrorName(e),
                    (int)e);
    return fail(err, DDP_ERR_SYSTEM,
                "cuda: cudaGetDeviceCount failed: %s (%s, %d); HINT: nvidia-smi shows "
                "whether the driver and GPUs are healthy",
                cudaGetErrorString(e), cudaGetErrorName(e), (int)e);
}

extern "C" ddp_status ddp__gpu_mem_info(int idx, size_t *used, size_t *total, ddp_error *err)
{
    int n = 0, was = -1;
    ddp_status st = ddp__gpu_device_count(&n, err);
    if (st != DDP_OK)
        return st;
    if (idx < 0 || idx >= n)
        return fail(err, DDP_ERR_INVALID, "cuda device %d: out of range (%d visible)", idx, n);
    /* cudaMemGetInfo answers for the calling thread's device: idx's for the call, then back */
    size_t fr = 0, tot = 0;
    cudaError_t e = cudaGetDevice(&was);
    if (e == cudaSuccess && was != idx)
        e = cudaSetDevice(idx);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&fr, &tot);
    /* back to the thread's device; a failure there must not stay pending for the next launch's
     * check (cudaGetLastError) to report as its own */
    if (was >= 0 && was != idx && cudaSetDevice(was) != cudaSuccess)
        (void)cudaGetLastError();
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(err, DDP_ERR_SYSTEM, "cuda device %d: cudaMemGetInfo: %s", idx,
                    cudaGetErrorString(e));
    }
    *used = tot - fr;
    *total = tot;
    return DDP_OK;
}

extern "C" ddp_status ddp__gpu_device_name(int idx, char *name, size_t cap, ddp_error *err)
{
    if (!name || cap == 0)
        return fail(err, DDP_ERR_INVALID, "cuda device name: no output buffer");
    int n = 0;
    ddp_status st = ddp__gpu_device_count(&n, err);
    if (st != DDP_OK)
        return st;
    if (idx < 0 || idx >= n)
        return fail(err, DDP_ERR_INVALID, "cuda device %d: out of range (%d visible)", idx, n);
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fail(err, DDP_ERR_SYSTEM, "cuda device %d: cudaGetDeviceProperties: %s", idx,
                    cudaGetErrorString(e));
    }
    snprintf(name, cap, "%s", prop.name);
    return DDP_OK;
}
