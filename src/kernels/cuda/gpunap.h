/*
 * kernels/cuda/gpunap.h — how the host sleeps between two polls of a CUDA event while it waits
 * for the GPU (context.cu's sync, the GPU backends' waits in nccl.c and cudaops.c): never
 * cudaStreamSynchronize, which can neither time out nor be interrupted, and never a GPU-side
 * spin (ranks time-slice one GPU). The nap starts at 10 µs and doubles up to 200 µs: a wait
 * ends at most ~200 µs after the work (it ended up to 1 ms late with a 1 ms cap: a few
 * milliseconds a step at four syncs and a wait per gradient bucket), at ≤ 5,000 wake-ups a
 * second, a fraction of a percent of a core.
 */
#ifndef DDP_KERNELS_CUDA_GPUNAP_H
#define DDP_KERNELS_CUDA_GPUNAP_H

#include <time.h>

#define DDP__GPU_NAP_FIRST_NS 10000L
#define DDP__GPU_NAP_MAX_NS 200000L

/* Sleeps *ns nanoseconds (start from DDP__GPU_NAP_FIRST_NS), then doubles it up to the cap. */
static inline void ddp__gpu_nap(long *ns)
{
    struct timespec ts = {0, *ns};
    nanosleep(&ts, NULL);
    *ns = *ns * 2 < DDP__GPU_NAP_MAX_NS ? *ns * 2 : DDP__GPU_NAP_MAX_NS;
}

#endif /* DDP_KERNELS_CUDA_GPUNAP_H */
