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

#include "group/devops.h"
#include "group/group_int.h"


/* The CUDA runtime's devops on device `device`, with a non-blocking stream of its own (cudaops.c;
 * without DDP_CUDA, DDP_ERR_NOT_FOUND saying so). *out written on DDP_OK only. */
ddp_status ddp__cuda_devops(int device, ddp__devops *out, ddp_error *err);

/* Tests only (DDP_TEST_FAKE_GPUS): devops whose "device memory" is host memory and whose copies
 * are memcpy (staged/fakedev.c), so cuda-staged runs end to end on a machine without a GPU. */
ddp_status ddp__fake_devops(ddp__devops *out, ddp_error *err);

/* What both shared-GPU backends (cuda-staged, cuda-ipc) begin with: the GPU's device operations
 * and the CPU backend among the same members (what auto picks for host buffers there), which
 * runs their barriers and host collectives. The backend operations that only forward to these
 * (alloc, free, copy, abort, devops) take a `be` whose first member is this. */
typedef struct ddp__gpu_share {
    ddp__devops dev;
    bool dev_made;
    void *inner_be;
    const ddp__backend_ops *inner;
} ddp__gpu_share;
/* Makes both for setup s (the fake GPU's devops where s->fake_gpu). On failure, what was made
 * is for ddp__share_end to end. */
ddp_status ddp__share_start(ddp__gpu_share *sh, const ddp__setup *s, ddp_error *err);
/* Ends the CPU backend, then the device operations (either may be absent). */
void ddp__share_end(ddp__gpu_share *sh);
void *ddp__share_alloc(void *be, size_t bytes);
void ddp__share_free(void *be, void *p);
ddp_status ddp__share_copy(void *be, void *dst, const void *src, size_t bytes, char *msg);
void ddp__share_abort(void *be, const char *why);
const ddp__devops *ddp__share_devops(void *be);

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
