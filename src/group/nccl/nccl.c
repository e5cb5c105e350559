/*
 * nccl/nccl.c — the NCCL backend: collectives on GPU buffers when every rank has a GPU of its own.
 * Built only with DDP_NCCL (nccl.h and libnccl found, CUDA on), into the GPU module libddp_gpu.so
 * (kernels/gpu_module.h), never into libddp: libddp's nccl/proxy.c registers the backend, decides
 * whether it is usable, and loads the module for create (ddp__gpu_nccl_create here).
 *
 * Set-up: rank 0 makes the ncclUniqueId and publishes it in the job's authenticated store; the
 * others read it within the group's set-up deadline (nccl/watchdog.c). Under mpirun without a
 * store, an MPI broadcast carries it instead. The communicator is created
 * non-blocking (config.blocking = 0) and polled with ncclCommGetAsyncError until it is ready or the
 * deadline passes, so a rank that never arrives is an error, not a hang.
 *
 * A collective runs on the backend's own stream, ordered after the caller's compute stream (the
 * collective's c->stream; NULL: the default stream) by an event; the caller's stream then waits
 * for the result the same way, and c->event, when given, is recorded on completion. run() returns
 * once the GPU has finished (the core's contract; asynchronous collectives run on its progress
 * thread), waiting by polling an event from the host.
 *
 * The watchdog (nccl/watchdog.c: one thread per group, started here at create and joined at
 * destroy) polls the communicator's asynchronous error and each collective's age: a failure or an
 * operation past the group's timeout becomes ncclCommAbort, which makes the GPU work and the
 * waiting host return, and one message naming the operation, its sequence number and the rank,
 * which this and every later call report — ddprun's teardown then takes over.
 *
 * Not here: the logic that needs no GPU (watchdog.c, tested on CPU), ranks sharing a GPU (NCCL
 * refuses them: staged/), device memory for callers (cudaops.c, through ddp__devops).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "group/nccl/nccl_int.h"
#include "group/staged/staged_int.h"
#include "kernels/cuda/gpunap.h"
#include "util/util.h"
#ifdef DDP_IN_GPU_MODULE
#include "group/nccl/module_host.h" /* libddp's functions through the table it lends */
#endif

#define WATCHDOG_POLL_MS 100

typedef struct nccl_be {
    ncclComm_t comm;
    bool comm_gone; /* aborted (ncclCommAbort frees it) */
    int device;
    int me, n, rank; /* member index, members, global rank */
    cudaStream_t stream;
    cudaEvent_t ready, done;
    void *barrier_buf; /* (1,) float32 on the device, for barrier's allreduce */
    ddp__devops dev;   /* alloc and copy for ddp_group_alloc/ddp_group_memcpy */
    bool dev_made;
    ddp__watchdog wd;
    bool wd_started;
    pthread_mutex_t abort_mu; /* one ncclCommAbort, from whichever thread gets there first; held
                                 by every use of comm that may race it (issue, settle, errors) */
} nccl_be;

/* ---- what the watchdog sees ------------------------------------------------------------------ */

static ddp_status wd_async_error(void *ctx, char *msg, size_t cap, bool *peer)
{
    nccl_be *b = ctx;
    ncclResult_t r = ncclSuccess;
    char last[256] = "";
    pthread_mutex_lock(&b->abort_mu);
    if (!b->comm_gone) { /* aborted: the failure that did it is recorded already */
        ncclResult_t q = ncclCommGetAsyncError(b->comm, &r);
        if (q != ncclSuccess)
            r = q;
        if (r != ncclSuccess && r != ncclInProgress)
            ddp__fmt(last, sizeof last, "%s", ncclGetLastError(b->comm));
    }
    pthread_mutex_unlock(&b->abort_mu);
    if (r == ncclSuccess || r == ncclInProgress)
        return DDP_OK;
    ddp__fmt(msg, cap, "NCCL reports %s%s%s", ncclGetErrorString(r), last[0] ? ": " : "", last);
    *peer = r == ncclRemoteError; /* "remote process exited or there was a network error" */
    return r == ncclRemoteError || r == ncclSystemError ? DDP_ERR_NETWORK : DDP_ERR_SYSTEM;
}

static bool wd_done(void *ctx, void *ev)
{
    nccl_be *b = ctx;
    /* The watchdog's thread has no current device of its own: without this, its first CUDA call
     * could make GPU 0's primary context current there, and every rank of a multi-GPU host
     * could hold a context (and its memory) on GPU 0. */
    (void)cudaSetDevice(b->device);
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e != cudaSuccess && e != cudaErrorNotReady)
        (void)cudaGetLastError();
    return e != cudaErrorNotReady; /* an error is "finished": async_error tells the rest */
}

static void wd_abort(void *ctx)
{
    nccl_be *b = ctx;
    pthread_mutex_lock(&b->abort_mu);
    if (!b->comm_gone) {
        (void)ncclCommAbort(b->comm);
        b->comm_gone = true;
    }
    pthread_mutex_unlock(&b->abort_mu);
}

/* ---- helpers --------------------------------------------------------------------------------- */

static bool nccl_type(ddp_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case DDP_FLOAT32: *out = ncclFloat32; return true;
    case DDP_FLOAT64: *out = ncclFloat64; return true;
    case DDP_BFLOAT16: *out = ncclBfloat16; return true;
    case DDP_FLOAT16: *out = ncclFloat16; return true;
    case DDP_INT32: *out = ncclInt32; return true;
    case DDP_INT64: *out = ncclInt64; return true;
    case DDP_UINT8: *out = ncclUint8; return true;
    default: return false;
    }
}

static ncclRedOp_t nccl_op(const ddp__coll *c)
{
    if (c->avg_div > 1)
        return ncclAvg; /* the core asks for AVG as SUM with the divisor (fuses_avg) */
    switch (c->op) {
    case DDP_MIN: return ncclMin;
    case DDP_MAX: return ncclMax;
    case DDP_PROD: return ncclProd;
    default: return ncclSum;
    }
}

/* With a non-blocking communicator a call may return ncclInProgress: waits until the
 * communicator settles (ncclSuccess), fails, or deadline_ms passes. */
static ncclResult_t settle(nccl_be *b, ncclResult_t r, int64_t deadline_ms)
{
    long ns = DDP__GPU_NAP_FIRST_NS;
    while (r == ncclInProgress) {
        if (ddp__now_ms() >= deadline_ms)
            return ncclInProgress;
        ddp__gpu_nap(&ns);
        /* The watchdog's thread may abort (and so free) the communicator meanwhile. */
        pthread_mutex_lock(&b->abort_mu);
        ncclResult_t q = b->comm_gone ? ncclInvalidUsage : ncclCommGetAsyncError(b->comm, &r);
        pthread_mutex_unlock(&b->abort_mu);
        if (q != ncclSuccess)
            return q == ncclInvalidUsage ? ncclInvalidUsage : ncclInternalError;
    }
    return r;
}

/* NCCL's last message about the communicator, or why there is none, into out. */
static void last_error(nccl_be *b, char *out, size_t cap)
{
    pthread_mutex_lock(&b->abort_mu);
    ddp__fmt(out, cap, "%s",
             b->comm_gone ? "the communicator was aborted" : ncclGetLastError(b->comm));
    pthread_mutex_unlock(&b->abort_mu);
}

static ddp_status fail(nccl_be *b, const ddp__coll *c, ddp__fail *f, ddp_status st,
                       const char *call, const char *why)
{
    f->status = st;
    ddp__gpu_fail_msg(f->msg, sizeof f->msg, "nccl", b->rank, c, call, why);
    return st;
}

static ddp_status cuda_call(nccl_be *b, const ddp__coll *c, ddp__fail *f, cudaError_t e,
                            const char *call)
{
    if (e == cudaSuccess)
        return DDP_OK;
    (void)cudaGetLastError();
    char why[160];
    ddp__fmt(why, sizeof why, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    return fail(b, c, f, DDP_ERR_SYSTEM, call, why);
}

/* ---- the operations ---------------------------------------------------------------------------
 */

static ncclResult_t issue(nccl_be *b, const ddp__coll *c, ncclDataType_t dt, const char **call)
{
    ncclResult_t r;
    switch (c->kind) {
    case DDP__ALLREDUCE:
        *call = "ncclAllReduce";
        r = ncclAllReduce(c->send, c->recv, c->count, dt, nccl_op(c), b->comm, b->stream);
        break;
    case DDP__BROADCAST:
        *call = "ncclBroadcast";
        r = ncclBroadcast(c->send, c->recv, c->count, dt, c->root, b->comm, b->stream);
        break;
    case DDP__ALLGATHER:
        *call = "ncclAllGather";
        r = ncclAllGather(c->send, c->recv, c->count, dt, b->comm, b->stream);
        break;
    case DDP__REDUCE_SCATTER:
        *call = "ncclReduceScatter";
        r = ncclReduceScatter(c->send, c->recv, c->count, dt, nccl_op(c), b->comm, b->stream);
        break;
    default: /* barrier: a one-element allreduce */
        *call = "ncclAllReduce (barrier)";
        r = ncclAllReduce(b->barrier_buf, b->barrier_buf, 1, ncclFloat32, ncclSum, b->comm,
                          b->stream);
        break;
    }
    return r;
}

static ddp_status nccl_run(void *be, const ddp__coll *c, ddp__fail *f);

/* Host buffers (the core's debug check, small and rare): through a temporary device copy. */
static ddp_status run_host(nccl_be *b, const ddp__coll *c, ddp__fail *f)
{
    size_t e = ddp_dtype_size(c->dtype), n = (size_t)b->n;
    size_t in = c->count * e * (c->kind == DDP__REDUCE_SCATTER ? n : 1);
    size_t out = c->count * e * (c->kind == DDP__ALLGATHER ? n : 1);
    char *d = NULL;
    ddp_status st;
    if ((st = cuda_call(b, c, f, cudaSetDevice(b->device), "cudaSetDevice")) ||
        (st = cuda_call(b, c, f, cudaMalloc((void **)&d, in + out + 1), "cudaMalloc")))
        return st;
    if (c->send || c->kind != DDP__BROADCAST || b->me == c->root)
        st = cuda_call(b, c, f,
                       cudaMemcpy(d, c->send ? c->send : c->recv, in, cudaMemcpyHostToDevice),
                       "cudaMemcpy");
    ddp__coll k = *c;
    k.device = DDP_DEVICE_CUDA;
    k.send = d;
    k.recv = d + in;
    k.stream = NULL;
    k.event = NULL;
    if (c->kind == DDP__BROADCAST)
        k.recv = d;
    if (st == DDP_OK && (st = nccl_run(b, &k, f)) == DDP_OK)
        st = cuda_call(b, c, f, cudaMemcpy(c->recv, k.recv, out, cudaMemcpyDeviceToHost),
                       "cudaMemcpy");
    (void)cudaFree(d);
    return st;
}

static ddp_status nccl_run(void *be, const ddp__coll *c, ddp__fail *f)
{
    nccl_be *b = be;
    char why[DDP_ERRMSG_MAX];
    ddp_status st = ddp__watchdog_error(&b->wd, why, sizeof why, &f->peer);
    if (st != DDP_OK) {
        f->status = st;
        ddp__fmt(f->msg, sizeof f->msg, "%s", why);
        return st;
    }
    if (c->kind != DDP__BARRIER && c->device != DDP_DEVICE_CUDA)
        return run_host(b, c, f);
    ncclDataType_t dt = ncclFloat32;
    if (c->kind != DDP__BARRIER && !nccl_type(c->dtype, &dt))
        return fail(b, c, f, DDP_ERR_INVALID, NULL, "NCCL has no such dtype");
    /* Ordered after the caller's kernels queued before the collective was submitted (c->ready,
     * group.c's mark: a bucket waits for its gradients only), else before now. */
    cudaEvent_t ready = c->ready ? (cudaEvent_t)c->ready : b->ready;
    if ((st = cuda_call(b, c, f, cudaSetDevice(b->device), "cudaSetDevice")) ||
        (!c->ready && (st = cuda_call(b, c, f, cudaEventRecord(b->ready, (cudaStream_t)c->stream),
                                      "cudaEventRecord"))) ||
        (st = cuda_call(b, c, f, cudaStreamWaitEvent(b->stream, ready, 0), "cudaStreamWaitEvent")))
        return st;
    const char *call = "";
    /* Issued under abort_mu: a watchdog abort (another thread) frees the communicator. */
    pthread_mutex_lock(&b->abort_mu);
    ncclResult_t r = b->comm_gone ? ncclInvalidUsage : issue(b, c, dt, &call);
    pthread_mutex_unlock(&b->abort_mu);
    r = settle(b, r, c->deadline_ms);
    if (r != ncclSuccess) {
        char last[256];
        last_error(b, last, sizeof last);
        ddp__fmt(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last[0] ? ": " : "", last);
        st = fail(b, c, f, r == ncclInProgress ? DDP_ERR_TIMEOUT : DDP_ERR_SYSTEM, call, why);
        f->peer = r == ncclRemoteError;
        /* Through the watchdog, so that it aborts the communicator once and never looks at it
         * again, and every later call reports this failure. */
        ddp__watchdog_fail(&b->wd, st, f->msg, f->peer);
        return st;
    }
    /* No wait is put into the caller's stream: this call returns only once the host has seen
     * the collective finish (below), so whatever the caller queues after it comes after the
     * result. (A wait queued here would hold every kernel queued later — the rest of backward,
     * for a bucket reduced from the progress thread — behind this collective: no overlap.) */
    if ((st = cuda_call(b, c, f, cudaEventRecord(b->done, b->stream), "cudaEventRecord")) ||
        (c->event && (st = cuda_call(b, c, f, cudaEventRecord((cudaEvent_t)c->event, b->stream),
                                     "cudaEventRecord"))))
        return st;
    if ((st = ddp__watchdog_track(&b->wd, c, b->done, ddp__now_ms())) != DDP_OK) {
        (void)ddp__watchdog_error(&b->wd, why, sizeof why, &f->peer);
        return fail(b, c, f, st, NULL,
                    st == DDP_ERR_INVALID ? "too many collectives in flight" : why);
    }
    /* Wait from the host; the watchdog turns a stuck GPU into an abort and a message. */
    long ns = DDP__GPU_NAP_FIRST_NS;
    for (;;) {
        if ((st = ddp__watchdog_error(&b->wd, f->msg, sizeof f->msg, &f->peer)) != DDP_OK) {
            f->status = st;
            return st;
        }
        cudaError_t e = cudaEventQuery(b->done);
        if (e == cudaSuccess)
            break;
        if (e != cudaErrorNotReady) {
            ddp__watchdog_untrack(&b->wd, c->seq);
            return cuda_call(b, c, f, e, "cudaEventQuery");
        }
        /* The watchdog's thread does this every WATCHDOG_POLL_MS; past the deadline, do it
         * here too, so the wait ends even if that thread were starved. */
        if (ddp__now_ms() > c->deadline_ms + 2 * WATCHDOG_POLL_MS)
            (void)ddp__watchdog_step(&b->wd, ddp__now_ms());
        ddp__gpu_nap(&ns);
    }
    ddp__watchdog_untrack(&b->wd, c->seq);
    /* An abort between the check above and the query completes the event too (the aborted
     * kernel exits): the watchdog records its failure before it aborts, so a look now tells an
     * aborted collective, whose buffer holds no result, from a finished one. */
    if ((st = ddp__watchdog_error(&b->wd, f->msg, sizeof f->msg, &f->peer)) != DDP_OK) {
        f->status = st;
        return st;
    }
    return DDP_OK;
}

static void *nccl_alloc(void *be, size_t bytes)
{
    nccl_be *b = be;
    return b->dev.alloc(b->dev.ctx, bytes);
}

static void nccl_free(void *be, void *p)
{
    nccl_be *b = be;
    b->dev.free(b->dev.ctx, p);
}

static ddp_status nccl_copy(void *be, void *dst, const void *src, size_t bytes, char *msg)
{
    nccl_be *b = be;
    return b->dev.copy(b->dev.ctx, dst, src, bytes, msg);
}

static void nccl_abort(void *be, const char *why)
{
    nccl_be *b = be;
    char msg[DDP_ERRMSG_MAX];
    ddp__fmt(msg, sizeof msg, "rank %d: nccl: the group was aborted: %s", b->rank, why);
    ddp__watchdog_fail(&b->wd, DDP_ERR_CLOSED, msg, false);
}

static void nccl_destroy(void *be)
{
    nccl_be *b = be;
    if (!b)
        return;
    if (b->wd_started)
        ddp__watchdog_stop(&b->wd);
    (void)cudaSetDevice(b->device);
    if (b->comm && !b->comm_gone) {
        /* Finalize flushes what is queued; non-blocking, so bounded like everything else. */
        ncclResult_t r = ncclCommFinalize(b->comm);
        r = settle(b, r, ddp__now_ms() + 10000);
        if (r == ncclSuccess)
            (void)ncclCommDestroy(b->comm);
        else
            (void)ncclCommAbort(b->comm);
    }
    if (b->barrier_buf)
        (void)cudaFree(b->barrier_buf);
    if (b->done)
        (void)cudaEventDestroy(b->done);
    if (b->ready)
        (void)cudaEventDestroy(b->ready);
    if (b->stream)
        (void)cudaStreamDestroy(b->stream);
    (void)cudaGetLastError();
    if (b->dev_made)
        b->dev.destroy(b->dev.ctx);
    pthread_mutex_destroy(&b->abort_mu);
    free(b);
}

static const ddp__devops *nccl_devops(void *be)
{
    nccl_be *b = be;
    return &b->dev;
}

static const ddp__backend_ops nccl_ops = {
    .name = "nccl",
    .run = nccl_run,
    .alloc = nccl_alloc,
    .free = nccl_free,
    .copy = nccl_copy,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
    .devops = nccl_devops,
    .fuses_avg = true,
};

/* ---- set-up ------------------------------------------------------------------------------------
 */

static ddp_status make_uid(void *ctx, void *id, size_t n, ddp_error *err)
{
    (void)ctx;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return ddp__err(err, DDP_ERR_SYSTEM, "nccl: ncclGetUniqueId failed: %s: %s",
                        ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id, &u, n < sizeof u ? n : sizeof u);
    return DDP_OK;
}

ddp_status ddp__gpu_nccl_create(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                                ddp_error *err)
{
    nccl_be *b = calloc(1, sizeof *b);
    if (!b)
        return ddp__err(err, DDP_ERR_NOMEM, "nccl: out of memory");
    pthread_mutex_init(&b->abort_mu, NULL);
    b->device = s->cuda_device;
    b->me = s->m.me;
    b->n = s->m.n;
    b->rank = s->m.ranks[s->m.me];
    ddp_status st;
    cudaError_t e;
    const char *call = "cudaSetDevice";
    if ((st = ddp__cuda_devops(b->device, &b->dev, err)))
        goto out_destroy;
    b->dev_made = true;
    if ((e = cudaSetDevice(b->device)) != cudaSuccess ||
        (call = "cudaStreamCreateWithFlags",
         e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (call = "cudaEventCreateWithFlags",
         e = cudaEventCreateWithFlags(&b->ready, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming)) != cudaSuccess ||
        (call = "cudaMalloc", e = cudaMalloc(&b->barrier_buf, sizeof(float))) != cudaSuccess) {
        (void)cudaGetLastError();
        st = ddp__err(err, DDP_ERR_SYSTEM, "nccl: rank %d, GPU %d: %s failed: %s (%s)", b->rank,
                      b->device, call, cudaGetErrorString(e), cudaGetErrorName(e));
        goto out_destroy;
    }
    if (b->rank == 0) {
        int v = 0;
        if (ncclGetVersion(&v) == ncclSuccess)
            fprintf(stderr, "ddp: NCCL %d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
    }
    ncclUniqueId id;
    if (s->store) {
        if ((st = ddp__nccl_uid_exchange(s->store, s->m.prefix, s->m.me, s->timeout_ms, make_uid,
                                         NULL, &id, sizeof id, err)))
            goto out_destroy;
    } else { /* set-up through MPI (mpirun, no store): member 0's id by broadcast */
        if ((s->m.me == 0 && (st = make_uid(NULL, &id, sizeof id, err))) ||
            (st = ddp__mpi_boot_bcast(s->mpi, s->m.ranks, s->m.n, s->m.me, &id, sizeof id, err)))
            goto out_destroy;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int64_t deadline = ddp__now_ms() + s->timeout_ms;
    ncclResult_t r = ncclCommInitRankConfig(&b->comm, b->n, id, b->me, &config);
    if (b->comm)
        r = settle(b, r, deadline);
    if (r != ncclSuccess) {
        char dl[32];
        ddp__fmt_duration(dl, sizeof dl, s->timeout_ms);
        st = ddp__err(
            err, r == ncclInProgress ? DDP_ERR_TIMEOUT : DDP_ERR_SYSTEM,
            "nccl: rank %d (GPU %d): creating the communicator of %d rank%s %s%s%s%s; HINT: %s; "
            "NCCL_DEBUG=INFO says more",
            b->rank, b->device, b->n, b->n == 1 ? "" : "s",
            r == ncclInProgress ? "did not finish within " : "failed: ",
            r == ncclInProgress ? dl : ncclGetErrorString(r), r == ncclInProgress ? "" : ": ",
            r == ncclInProgress ? "" : ncclGetLastError(b->comm),
            /* invalid usage at init: NCCL's "Duplicate GPU detected", two ranks on one GPU */
            r == ncclInvalidUsage ? "each rank needs a GPU of its own (two ranks on one GPU: "
                                    "check CUDA_VISIBLE_DEVICES on every rank, or let ranks "
                                    "that share a GPU use backend auto or cuda-ipc)"
                                  : "every rank must call ddp_group_init");
        if (b->comm) {
            (void)ncclCommAbort(b->comm);
            b->comm_gone = true;
        }
        goto out_destroy;
    }
    ddp__wd_comm wc = {.ctx = b, .async_error = wd_async_error, .done = wd_done, .abort = wd_abort};
    if ((st = ddp__watchdog_start(&b->wd, &wc, "nccl", b->rank, WATCHDOG_POLL_MS, err)))
        goto out_destroy;
    b->wd_started = true;
    *be = b;
    *ops = &nccl_ops;
    return DDP_OK;
out_destroy:
    nccl_destroy(b);
    return st;
}
