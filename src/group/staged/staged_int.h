/*
 * staged_int.h — the shared-GPU backend ("cuda-staged") from the inside: the device operations it
 * needs (copies, ordering, host-side waits, pinning), and the staging of one collective through a
 * host buffer into a CPU backend. Private to src/group (staged.c, nccl/cudaops.c) and its unit
 * test, which drives the staging with memcpy for "device" copies and a fake CPU backend.
 */
#ifndef DDP_STAGED_INT_H
#define DDP_STAGED_INT_H

#include <stddef.h>
#include <stdint.h>

#include "group/group_int.h"

/* What staging needs from a GPU: cudaops.c implements it with the CUDA runtime on one device
 * and one stream of its own; tests with memcpy. Each call returns DDP_OK or a status with a
 * one-line message in msg (DDP_ERRMSG_MAX bytes). Copies are asynchronous on the backend's stream,
 * in issue order; nothing waits on the GPU except sync(), which polls from the host. */
typedef struct ddp__devops {
    void *ctx;
    /* The backend's stream waits for the work queued so far on the caller's stream (a
     * cudaStream_t; NULL: the default stream). */
    ddp_status (*after)(void *ctx, void *stream, char *msg);
    ddp_status (*d2h)(void *ctx, void *host, const void *dev, size_t bytes, char *msg);
    ddp_status (*h2d)(void *ctx, void *dev, const void *host, size_t bytes, char *msg);
    /* Waits, polling from the host (no GPU spin: ranks time-slice one GPU), until every copy
     * issued has finished, or until deadline_ms (ddp__now_ms clock): DDP_ERR_TIMEOUT. */
    ddp_status (*sync)(void *ctx, int64_t deadline_ms, char *msg);
    /* Pins host memory [p, p+bytes) so copies to and from it run at full speed with no bounce
     * buffer (cudaHostRegister); unpin undoes it. */
    ddp_status (*pin)(void *ctx, void *p, size_t bytes, char *msg);
    void (*unpin)(void *ctx, void *p);
    /* Device memory on the backend's GPU, and a synchronous copy of any kind (ddp_group_alloc,
     * ddp_group_memcpy). */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    ddp_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes, char *msg);
    void (*destroy)(void *ctx);
} ddp__devops;

/* The CUDA runtime's devops on device `device`, with a non-blocking stream of its own (cudaops.c;
 * without DDP_CUDA, DDP_ERR_NOT_FOUND saying so). *out written on DDP_OK only. */
ddp_status ddp__cuda_devops(int device, ddp__devops *out, ddp_error *err);

/* Tests only (DDP_TEST_FAKE_GPUS): devops whose "device memory" is host memory and whose copies
 * are memcpy (staged/fakedev.c), so cuda-staged runs end to end on a machine without a GPU. */
ddp_status ddp__fake_devops(ddp__devops *out, ddp_error *err);

/* Where a staged collective runs: the host-side backend and its buffer. */
typedef struct ddp__stage {
    const ddp__devops *dev;
    void *inner_be; /* the CPU backend among the same members */
    const ddp__backend_ops *inner;
    void *buf;    /* host staging buffer: the inner backend's arena when it has
                     one (zero-copy there), pinned */
    size_t bytes; /* its size */
    int me, n;    /* member index and count */
} ddp__stage;

/* Runs collective c, whose buffers are device memory, through st: in chunks that fit the staging
 * buffer, copy device → buffer, run the inner backend's collective on the buffer in place, copy
 * buffer → device. c->avg_div is honoured (by the inner backend when it fuses AVG, else by a pass
 * over the buffer). Blocks until done, failed or c->deadline_ms; on failure fills *f. */
ddp_status ddp__staged_run(const ddp__stage *st, const ddp__coll *c, ddp__fail *f);

#endif /* DDP_STAGED_INT_H */
