/*
 * kernels/cuda/devmath.h — the GPU reducer's arithmetic on an arbitrary stream (devmath.cu), for
 * nccl/cudaops.c, which puts it behind ddp__devops (group/devops.h). Plain C, no CUDA header;
 * built into the GPU module only. Each call queues its work on `stream` (a cudaStream_t; NULL:
 * the default stream) and returns DDP_OK or DDP_ERR_SYSTEM with CUDA's message in msg
 * (DDP_ERRMSG_MAX bytes). UNVERIFIED: written without a GPU (docs/gpu.md).
 */
#ifndef DDP_KERNELS_CUDA_DEVMATH_H
#define DDP_KERNELS_CUDA_DEVMATH_H

#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"
#include "ddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst (n, dtype dt) = src (n, dtype st): float32 -> bfloat16 or float16 (nearest even; float16
 * overflows to ±inf) or back (exact). */
ddp_status ddp__devmath_convert(void *stream, void *dst, ddp_dtype dt, const void *src,
                                ddp_dtype st, size_t n, char *msg);
/* *acc_dev += the sum of squares of x (n, dtype t: float32, float64, bfloat16 or float16), each
 * term in double. acc_dev: DDP__SUMSQ_DOUBLES doubles of device memory, the accumulator first,
 * then the blocks' partial sums, which one block adds up in a fixed order: the same bits on every
 * run and every rank (atomic adds across blocks would land in the order the blocks finish, and
 * ranks whose gradient norms differ in the last bit clip by different factors and drift apart). */
#define DDP__SUMSQ_DOUBLES 1025
ddp_status ddp__devmath_sumsq(void *stream, const void *x, size_t n, ddp_dtype t, double *acc_dev,
                              char *msg);

/* g (n,) *= inv; *flag_dev (an int in device memory) = 1 where a value was inf or NaN before
 * (never cleared here). */
ddp_status ddp__devmath_unscale(void *stream, float *g, size_t n, float inv, int *flag_dev,
                                char *msg);
/* ddp_nn_sgd_step on the device (torch.optim.SGD, dampening 0): g multiplied by grad_scale first
 * (not in place), weight decay as L2, the momentum buffer taking d itself at step 1. Rounded as
 * the CPU's loop is (no fused multiply-adds). */
ddp_status ddp__devmath_sgd(void *stream, float *p, const float *g, float *buf, size_t n, float lr,
                            float momentum, float weight_decay, uint64_t step, float grad_scale,
                            char *msg);

/* cuda-ipc's reduction (ipcreduce.cu; group/devops.h's reduce): dst (n,) = srcs[0] op srcs[1]
 * op … op srcs[k-1], folded in that order (1 ≤ k ≤ 64) in cpu/reduce.c's arithmetic (16-bit
 * floats in float32 rounded once, integers wrapping; AVG as SUM), then divided by avg_div when it
 * is > 1 as ddp__scale_avg divides: the same bits as the host backends. Any dtype, any op. srcs
 * may point into peers' memory mapped by CUDA IPC. */
ddp_status ddp__devmath_reduce(void *stream, void *dst, const void *const *srcs, int k, size_t n,
                               ddp_dtype t, ddp_op op, int avg_div, char *msg);

#ifdef __cplusplus
}
#endif
#endif /* DDP_KERNELS_CUDA_DEVMATH_H */
