/*
 * group/devops.h — what libddp needs from a GPU, as one table of operations: the copies, ordering
 * and host-side waits of the shared-GPU backend (staged/), device memory for ddp_group_alloc and
 * ddp_group_memcpy, and the little arithmetic the reducer does on gradient buckets in device
 * memory (src/ddp: reducer.c, device.c, grads.c), and cuda-ipc's mapping of peers' device memory
 * and reduction (ipc/ipc.c). nccl/cudaops.c implements it with the CUDA runtime (in the GPU
 * module); staged/fakedev.c with host memory, for tests on machines without a GPU.
 */
#ifndef DDP_GROUP_DEVOPS_H
#define DDP_GROUP_DEVOPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/group.h"
#include "ddp/status.h"
#include "ddp/tensor.h"

/* What staging needs from a GPU: cudaops.c implements it with the CUDA runtime on one device
 * and one stream of its own; tests with memcpy. Each call returns DDP_OK or a status with a
 * one-line message in msg (DDP_ERRMSG_MAX bytes). Copies are asynchronous on the backend's stream,
 * in issue order; nothing waits on the GPU except sync(), which polls from the host. */
typedef struct ddp__devops {
    void *ctx;
    /* The backend's stream waits for the work queued so far on the caller's stream (a
     * cudaStream_t; NULL: the default stream), or, when ready is not NULL, for the work queued on
     * it before mark() recorded ready (then stream is not looked at). */
    ddp_status (*after)(void *ctx, void *stream, void *ready, char *msg);
    /* A mark of the work queued so far on stream, taken on the caller's thread when it submits
     * a collective that the progress thread runs later (group.c): an event (cudaEvent_t) from a
     * pool, recorded on stream, which after() then waits for — so the collective waits for the
     * kernels queued before its submission only, not for those the caller queued since (the
     * rest of backward). unmark gives it back once after() has queued its wait. Thread-safe.
     * Both NULL where marks mean nothing (the fake GPU: no streams). */
    ddp_status (*mark)(void *ctx, void *stream, void **ready, char *msg);
    void (*unmark)(void *ctx, void *ready);
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
    /* The reducer's arithmetic on device memory, queued on `stream` (a cudaStream_t, the group's:
     * ddp_group_set_stream; NULL: the default stream), so it is ordered with the model's kernels
     * and the group's collectives as they are. memset0: bytes zeroed. convert: n elements of
     * src (dtype st) to dst (dtype dt), float32 <-> bfloat16 only (nearest even, as
     * util/half.h). sumsq: *out_host = the sum of squares of k ranges, devs[j] of ns[j]
     * elements of dtype ts[j] (float32, float64, bfloat16 or float16), accumulated in double;
     * it waits once for the result, polling until deadline_ms (DDP_ERR_TIMEOUT). wait: the host
     * waits for the work queued on stream so far, the same way. */
    ddp_status (*memset0)(void *ctx, void *stream, void *dev, size_t bytes, char *msg);
    ddp_status (*convert)(void *ctx, void *stream, void *dst, ddp_dtype dt, const void *src,
                          ddp_dtype st, size_t n, char *msg);
    ddp_status (*sumsq)(void *ctx, void *stream, const void *const *devs, const size_t *ns,
                        const ddp_dtype *ts, int k, double *out_host, int64_t deadline_ms,
                        char *msg);
    ddp_status (*wait)(void *ctx, void *stream, int64_t deadline_ms, char *msg);
    /* GradScaler's unscale of n float32 values: each multiplied by inv, and *found_host = whether
     * any was inf or NaN before; waits for the flag, until deadline_ms. */
    ddp_status (*unscale)(void *ctx, void *stream, float *dev, size_t n, float inv,
                          bool *found_host, int64_t deadline_ms, char *msg);
    /* CUDA IPC, for cuda-ipc (ipc/ipc.c): ranks of one host map each other's device memory.
     * ipc_export writes a handle of DDP__IPC_HANDLE_BYTES bytes for dev (the start of an
     * allocation from alloc(), kept by the caller until every peer has closed it) that another
     * process of this host may pass to ipc_open (cudaIpcGetMemHandle), which maps that memory
     * into this process at *dev (cudaIpcOpenMemHandle; written on DDP_OK only); ipc_close unmaps
     * it. Device memory of the same GPU across processes is fine. */
    ddp_status (*ipc_export)(void *ctx, void *dev, void *handle, char *msg);
    ddp_status (*ipc_open)(void *ctx, const void *handle, void **dev, char *msg);
    void (*ipc_close)(void *ctx, void *dev);
    /* cuda-ipc's reduction, queued on the backend's stream (ordered with d2h/h2d/d2d; waited for
     * with sync): dst[i] = srcs[0][i] op srcs[1][i] op … op srcs[k-1][i] for i < n, folded in
     * that fixed order (1 ≤ k ≤ DDP__IPC_MAX_SRCS) in the arithmetic of cpu/reduce.c
     * (kernels.h: bfloat16/float16 in float32, rounded once; integers wrap; AVG as SUM), then,
     * when avg_div > 1, divided by it as ddp__scale_avg does — so every rank, and the host
     * backends, get the same bits. dst may be one of srcs; none may otherwise overlap. */
    ddp_status (*reduce)(void *ctx, void *dst, const void *const *srcs, int k, size_t n,
                         ddp_dtype t, ddp_op op, int avg_div, char *msg);
    /* A device-to-device copy on the backend's stream (cudaMemcpyAsync), waited for with sync. */
    ddp_status (*d2d)(void *ctx, void *dst, const void *src, size_t bytes, char *msg);
    void (*destroy)(void *ctx);
} ddp__devops;

/* The size of a devops IPC handle (cudaIpcMemHandle_t's), and the most sources of one reduce. */
#define DDP__IPC_HANDLE_BYTES 64
#define DDP__IPC_MAX_SRCS 64

/* A GPU group's device operations, the stream its collectives are ordered after
 * (ddp_group_set_stream) in *stream and its collectives' timeout in *timeout_ms (either may be
 * NULL); NULL for a CPU group. Valid for the group's life. For libddp's own use (the reducer);
 * not thread-safe with collectives in flight. */
const ddp__devops *ddp__group_devops(const ddp_group *g, void **stream, int *timeout_ms);

/* A collective on host memory, for any group (allgather when gather, else allreduce with op):
 * a CPU group runs it as it is; a GPU group, whose collectives take device memory only, through a
 * scratch buffer of device memory it keeps for its life (made, or grown, on first need; where
 * that fails, the group is aborted so that the peers fail at once rather than at the deadline,
 * and this rank returns DDP_ERR_NOMEM). The copies are waited for. Errors: the group's
 * (ddp_group_last_error). Not thread-safe (the group's rule). */
ddp_status ddp__group_host_collective(ddp_group *g, bool gather, const void *send, void *recv,
                                      size_t count, ddp_dtype t, ddp_op op);

/* ddp_group_abort with the reason the peers are told ("rank R aborted the group: why") and
 * later calls here return, unless g failed before (then that first error, as ddp_group_abort).
 * For libddp's own use: a misuse found on one rank while the others are entering a collective
 * (the reducer's gather mid-step). Thread-safe, as ddp_group_abort. */
void ddp__group_abort_why(ddp_group *g, const char *why);

/* Something of libddp's built on a group that holds the group's memory or work (a reducer's
 * buckets). ddp_group_destroy calls release(ctx) for each one still registered, first of all,
 * while the group still works, then forgets it: so a program that destroys the group before the
 * reducer gets a reducer whose calls fail (DDP_ERR_CLOSED) and whose destroy is safe, rather than
 * one that frees its buckets through a freed group. The node belongs to the dependent (no
 * allocation); remove it in the dependent's own destroy. Not thread-safe (the group's rule). */
typedef struct ddp__group_dep {
    void (*release)(void *ctx);
    void *ctx;
    struct ddp__group_dep *next;
} ddp__group_dep;
void ddp__group_add_dep(ddp_group *g, ddp__group_dep *d);
void ddp__group_remove_dep(ddp_group *g, ddp__group_dep *d);

#endif /* DDP_GROUP_DEVOPS_H */
