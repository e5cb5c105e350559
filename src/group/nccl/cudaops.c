/*
 * nccl/cudaops.c — the CUDA runtime behind ddp__devops (group/devops.h): one device, one
 * non-blocking stream of this backend's own, an event to order it after the caller's stream and
 * one to wait on it from the host. Built only with DDP_CUDA, into the GPU module libddp_gpu.so
 * (kernels/gpu_module.h; libddp's nccl/proxy.c loads it on first use); with the NCCL backend, the
 * one place outside src/kernels/cuda that includes a CUDA header.
 *
 * The host waits by polling cudaEventQuery, sleeping between polls (kernels/cuda/gpunap.h), with a
 * deadline: never cudaStreamSynchronize, which can neither time out nor be interrupted, and never
 * a GPU-side spin (several processes time-slice one GPU; FACTS.md).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group/staged/staged_int.h"
#include "kernels/cuda/devmath.h"
#include "kernels/cuda/gpunap.h"
#include "util/util.h"
#ifdef DDP_IN_GPU_MODULE
#include "group/nccl/module_host.h" /* libddp's functions through the table it lends */
#endif

typedef struct cudaops {
    int device;
    cudaStream_t stream;
    cudaEvent_t ready;  /* recorded on the caller's stream: ours waits for it */
    cudaEvent_t done;   /* recorded on ours: the host polls it */
    cudaEvent_t mark;   /* recorded on a caller's stream by wait(): the host polls it */
    cudaEvent_t copied; /* recorded on ours by copy(): the host polls it */
    void *d_word;       /* a reduction's result, 8 bytes (word_begin), then sumsq's scratch */
    void *h_word;       /* its copy, pinned host memory */
    /* after()'s record and wait as one: the progress thread's collectives and a caller's
     * ddp_group_memcpy (group.c orders it after the group's stream) share `ready` */
    pthread_mutex_t after_mu;
    /* mark()'s events, given back by unmark(): as many as collectives were ever queued at once */
    pthread_mutex_t pool_mu;
    cudaEvent_t *pool;
    size_t npool, cap;
} cudaops;

static ddp_status cuda_fail(char *msg, const char *call, cudaError_t e)
{
    (void)cudaGetLastError();
    ddp__fmt(msg, DDP_ERRMSG_MAX, "%s failed: %s (%s)", call, cudaGetErrorString(e),
             cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? DDP_ERR_NOMEM : DDP_ERR_SYSTEM;
}

/* DDP_OK, or the failure of call with its message in msg. */
static ddp_status cu(cudaError_t e, const char *call, char *msg)
{
    return e == cudaSuccess ? DDP_OK : cuda_fail(msg, call, e);
}

static ddp_status ops_after(void *ctx, void *stream, void *ready, char *msg)
{
    cudaops *o = ctx;
    ddp_status st;
    if (ready) /* mark()'s: recorded when the collective was submitted */
        return (st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg))
                   ? st
                   : cu(cudaStreamWaitEvent(o->stream, (cudaEvent_t)ready, 0),
                        "cudaStreamWaitEvent", msg);
    pthread_mutex_lock(&o->after_mu);
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)) == DDP_OK &&
        (st = cu(cudaEventRecord(o->ready, (cudaStream_t)stream), "cudaEventRecord", msg)) ==
            DDP_OK)
        st = cu(cudaStreamWaitEvent(o->stream, o->ready, 0), "cudaStreamWaitEvent", msg);
    pthread_mutex_unlock(&o->after_mu);
    return st;
}

static void ops_unmark(void *ctx, void *ready)
{
    cudaops *o = ctx;
    cudaEvent_t e = (cudaEvent_t)ready;
    if (!e)
        return;
    pthread_mutex_lock(&o->pool_mu);
    if (o->npool == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 8;
        cudaEvent_t *p = realloc(o->pool, cap * sizeof *p);
        if (p) {
            o->pool = p;
            o->cap = cap;
        }
    }
    bool kept = o->npool < o->cap;
    if (kept)
        o->pool[o->npool++] = e;
    pthread_mutex_unlock(&o->pool_mu);
    if (!kept) /* no room to keep it (out of memory): a wait already queued is unaffected */
        (void)cudaEventDestroy(e);
}

/* On the caller's thread: its current device is left as it was (an event belongs to the device
 * current at its creation and is recorded on that device's streams only). */
static ddp_status ops_mark(void *ctx, void *stream, void **ready, char *msg)
{
    cudaops *o = ctx;
    cudaEvent_t e = NULL;
    pthread_mutex_lock(&o->pool_mu);
    if (o->npool)
        e = o->pool[--o->npool];
    pthread_mutex_unlock(&o->pool_mu);
    int prev = o->device;
    ddp_status st = cu(cudaGetDevice(&prev), "cudaGetDevice", msg);
    if (!st && prev != o->device)
        st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg);
    if (!st && !e)
        st = cu(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags",
                msg);
    if (!st)
        st = cu(cudaEventRecord(e, (cudaStream_t)stream), "cudaEventRecord", msg);
    if (prev != o->device)
        (void)cudaSetDevice(prev);
    if (st) {
        ops_unmark(o, e);
        return st;
    }
    *ready = e;
    return DDP_OK;
}

static ddp_status ops_d2h(void *ctx, void *host, const void *dev, size_t bytes, char *msg)
{
    cudaops *o = ctx;
    return cu(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, o->stream),
              "cudaMemcpyAsync", msg);
}

static ddp_status ops_h2d(void *ctx, void *dev, const void *host, size_t bytes, char *msg)
{
    cudaops *o = ctx;
    return cu(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, o->stream),
              "cudaMemcpyAsync", msg);
}

/* Records ev on stream and polls it from the host until it completes or deadline_ms passes;
 * what names the work in the time-out's message. */
static ddp_status wait_event(cudaEvent_t ev, cudaStream_t stream, int64_t deadline_ms,
                             const char *what, char *msg)
{
    ddp_status st = cu(cudaEventRecord(ev, stream), "cudaEventRecord", msg);
    long sleep_ns = DDP__GPU_NAP_FIRST_NS;
    while (st == DDP_OK) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady)
            return cuda_fail(msg, "cudaEventQuery", e);
        if (ddp__now_ms() >= deadline_ms) {
            ddp__fmt(msg, DDP_ERRMSG_MAX,
                     "%s did not finish by the deadline; HINT: another process may hold the "
                     "GPU (nvidia-smi)",
                     what);
            return DDP_ERR_TIMEOUT;
        }
        ddp__gpu_nap(&sleep_ns);
    }
    return st;
}

static ddp_status ops_sync(void *ctx, int64_t deadline_ms, char *msg)
{
    cudaops *o = ctx;
    return wait_event(o->done, o->stream, deadline_ms,
                      "the GPU copies to and from the staging buffer", msg);
}

/* ---- the reducer's arithmetic, on the caller's stream (group/devops.h) ---------------------- */

static ddp_status ops_memset0(void *ctx, void *stream, void *dev, size_t bytes, char *msg)
{
    cudaops *o = ctx;
    ddp_status st;
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)) ||
        (st = cu(cudaMemsetAsync(dev, 0, bytes, (cudaStream_t)stream), "cudaMemsetAsync", msg)))
        return st;
    return DDP_OK;
}

static ddp_status ops_convert(void *ctx, void *stream, void *dst, ddp_dtype dt, const void *src,
                              ddp_dtype st, size_t n, char *msg)
{
    cudaops *o = ctx;
    ddp_status s = cu(cudaSetDevice(o->device), "cudaSetDevice", msg);
    return s ? s : ddp__devmath_convert(stream, dst, dt, src, st, n, msg);
}

static ddp_status ops_wait(void *ctx, void *stream, int64_t deadline_ms, char *msg)
{
    cudaops *o = ctx;
    ddp_status st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg);
    return st ? st
              : wait_event(o->mark, (cudaStream_t)stream, deadline_ms,
                           "the GPU's work before the reducer's", msg);
}

/* One 8-byte word of device memory a reduction writes (zeroed first, on stream), and its pinned
 * copy on the host: begin zeroes it; end copies it back and waits (until deadline_ms) — the
 * sum of squares' double, unscale's found-inf flag. Made on first use. */
static ddp_status word_begin(cudaops *o, cudaStream_t s, char *msg)
{
    ddp_status st;
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)))
        return st;
    if (!o->d_word &&
        (st = cu(cudaMalloc(&o->d_word, sizeof(double) * DDP__SUMSQ_DOUBLES), "cudaMalloc", msg)))
        return st;
    if (!o->h_word && (st = cu(cudaMallocHost(&o->h_word, 8), "cudaMallocHost", msg)))
        return st;
    return cu(cudaMemsetAsync(o->d_word, 0, 8, s), "cudaMemsetAsync", msg);
}

static ddp_status word_end(cudaops *o, cudaStream_t s, int64_t deadline_ms, const char *what,
                           char *msg)
{
    ddp_status st = cu(cudaMemcpyAsync(o->h_word, o->d_word, 8, cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync", msg);
    return st ? st : wait_event(o->mark, s, deadline_ms, what, msg);
}

static ddp_status ops_sumsq(void *ctx, void *stream, const void *const *devs, const size_t *ns,
                            const ddp_dtype *ts, int k, double *out_host, int64_t deadline_ms,
                            char *msg)
{
    cudaops *o = ctx;
    cudaStream_t s = (cudaStream_t)stream;
    ddp_status st = word_begin(o, s, msg);
    for (int j = 0; j < k && !st; j++) /* every range into the one word, then one wait */
        st = ddp__devmath_sumsq(stream, devs[j], ns[j], ts[j], (double *)o->d_word, msg);
    if (st || (st = word_end(o, s, deadline_ms, "the sum of squares of the gradients", msg)))
        return st;
    *out_host = *(const double *)o->h_word;
    return DDP_OK;
}

static ddp_status ops_unscale(void *ctx, void *stream, float *dev, size_t n, float inv,
                              bool *found_host, int64_t deadline_ms, char *msg)
{
    cudaops *o = ctx;
    cudaStream_t s = (cudaStream_t)stream;
    ddp_status st;
    if ((st = word_begin(o, s, msg)) ||
        (st = ddp__devmath_unscale(stream, dev, n, inv, (int *)o->d_word, msg)) ||
        (st = word_end(o, s, deadline_ms, "the unscale of the gradients", msg)))
        return st;
    *found_host = *(const int *)o->h_word != 0;
    return DDP_OK;
}

static ddp_status ops_pin(void *ctx, void *p, size_t bytes, char *msg)
{
    (void)ctx;
    return cu(cudaHostRegister(p, bytes, cudaHostRegisterPortable), "cudaHostRegister", msg);
}

static void ops_unpin(void *ctx, void *p)
{
    (void)ctx;
    (void)cudaHostUnregister(p);
    (void)cudaGetLastError();
}

static void *ops_alloc(void *ctx, size_t bytes)
{
    cudaops *o = ctx;
    void *p = NULL;
    if (cudaSetDevice(o->device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void ops_free(void *ctx, void *p)
{
    (void)ctx;
    if (p && cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError(); /* not to be reported as a later call's failure */
}

/* On this backend's stream and waited for until the bytes have landed (cudaMemcpy alone does
 * not promise that for a copy from pageable host memory, nor for device to device, and runs on
 * the legacy stream, unordered with the model's non-blocking one): a collective issued after it
 * reads them. Bounded like every wait here. */
#define COPY_LIMIT_MS (5 * 60 * 1000)
static ddp_status ops_copy(void *ctx, void *dst, const void *src, size_t bytes, char *msg)
{
    cudaops *o = ctx;
    ddp_status st;
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)) ||
        (st = cu(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, o->stream), "cudaMemcpyAsync",
                 msg)) ||
        (st = wait_event(o->copied, o->stream, ddp__now_ms() + COPY_LIMIT_MS, "a copy", msg)))
        return st;
    return DDP_OK;
}

/* ---- cuda-ipc: peers' device memory and the fixed-order reduction (group/devops.h) -------- */

static ddp_status ops_d2d(void *ctx, void *dst, const void *src, size_t bytes, char *msg)
{
    cudaops *o = ctx;
    return cu(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, o->stream),
              "cudaMemcpyAsync", msg);
}

static ddp_status ops_ipc_export(void *ctx, void *dev, void *handle, char *msg)
{
    cudaops *o = ctx;
    cudaIpcMemHandle_t h;
    ddp_status st;
    _Static_assert(sizeof h <= DDP__IPC_HANDLE_BYTES, "cudaIpcMemHandle_t fits a devops handle");
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)) ||
        (st = cu(cudaIpcGetMemHandle(&h, dev), "cudaIpcGetMemHandle", msg)))
        return st;
    memset(handle, 0, DDP__IPC_HANDLE_BYTES);
    memcpy(handle, &h, sizeof h);
    return DDP_OK;
}

/* Lazy peer access: a peer's memory on another GPU of the host is mapped when that pair allows
 * peer-to-peer access; on the same GPU (auto's case) nothing is needed. */
static ddp_status ops_ipc_open(void *ctx, const void *handle, void **dev, char *msg)
{
    cudaops *o = ctx;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    ddp_status st;
    if ((st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg)) ||
        (st = cu(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle", msg)))
        return st;
    *dev = p;
    return DDP_OK;
}

static void ops_ipc_close(void *ctx, void *dev)
{
    cudaops *o = ctx;
    (void)cudaSetDevice(o->device);
    (void)cudaIpcCloseMemHandle(dev);
    (void)cudaGetLastError();
}

static ddp_status ops_reduce(void *ctx, void *dst, const void *const *srcs, int k, size_t n,
                             ddp_dtype t, ddp_op op, int avg_div, char *msg)
{
    cudaops *o = ctx;
    ddp_status st = cu(cudaSetDevice(o->device), "cudaSetDevice", msg);
    return st ? st : ddp__devmath_reduce(o->stream, dst, srcs, k, n, t, op, avg_div, msg);
}

static void ops_destroy(void *ctx)
{
    cudaops *o = ctx;
    if (!o)
        return;
    (void)cudaSetDevice(o->device);
    if (o->d_word)
        (void)cudaFree(o->d_word);
    if (o->h_word)
        (void)cudaFreeHost(o->h_word);
    if (o->mark)
        (void)cudaEventDestroy(o->mark);
    if (o->copied)
        (void)cudaEventDestroy(o->copied);
    if (o->done)
        (void)cudaEventDestroy(o->done);
    if (o->ready)
        (void)cudaEventDestroy(o->ready);
    for (size_t i = 0; i < o->npool; i++)
        (void)cudaEventDestroy(o->pool[i]);
    free(o->pool);
    if (o->stream)
        (void)cudaStreamDestroy(o->stream);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&o->after_mu);
    pthread_mutex_destroy(&o->pool_mu);
    free(o);
}

ddp_status ddp__cuda_devops(int device, ddp__devops *out, ddp_error *err)
{
    char msg[DDP_ERRMSG_MAX];
    cudaops *o = calloc(1, sizeof *o);
    if (!o)
        return ddp__err(err, DDP_ERR_NOMEM, "cuda: out of memory");
    o->device = device;
    pthread_mutex_init(&o->after_mu, NULL);
    pthread_mutex_init(&o->pool_mu, NULL);
    cudaError_t e;
    const char *call = "cudaSetDevice";
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (call = "cudaStreamCreateWithFlags",
         e = cudaStreamCreateWithFlags(&o->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (call = "cudaEventCreateWithFlags",
         e = cudaEventCreateWithFlags(&o->ready, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&o->done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&o->mark, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&o->copied, cudaEventDisableTiming)) != cudaSuccess) {
        ddp_status st = cuda_fail(msg, call, e);
        ops_destroy(o);
        return ddp__err(err, st,
                        "cuda: device %d: %s; HINT: nvidia-smi shows whether the GPU "
                        "and driver are healthy",
                        device, msg);
    }
    *out = (ddp__devops){.ctx = o,
                         .after = ops_after,
                         .mark = ops_mark,
                         .unmark = ops_unmark,
                         .d2h = ops_d2h,
                         .h2d = ops_h2d,
                         .sync = ops_sync,
                         .pin = ops_pin,
                         .unpin = ops_unpin,
                         .alloc = ops_alloc,
                         .free = ops_free,
                         .copy = ops_copy,
                         .memset0 = ops_memset0,
                         .convert = ops_convert,
                         .sumsq = ops_sumsq,
                         .wait = ops_wait,
                         .unscale = ops_unscale,
                         .ipc_export = ops_ipc_export,
                         .ipc_open = ops_ipc_open,
                         .ipc_close = ops_ipc_close,
                         .reduce = ops_reduce,
                         .d2d = ops_d2d,
                         .destroy = ops_destroy};
    return DDP_OK;
}
