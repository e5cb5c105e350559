/*
 * nccl/module_host.h — included last by nccl.c and cudaops.c when they are compiled into the GPU
 * module (DDP_IN_GPU_MODULE; kernels/gpu_module.h): the libddp functions they call become calls
 * through the table libddp lends the module at load (ddp__host), so the module has no undefined
 * symbol of libddp's. The sources read the same either way.
 */
#ifndef DDP_NCCL_MODULE_HOST_H
#define DDP_NCCL_MODULE_HOST_H

#include "kernels/gpu_module.h"

#undef ddp__err
#define ddp__err ddp__host->error_set
#define ddp__fmt ddp__host->fmt
#define ddp__fmt_duration ddp__host->fmt_duration
#define ddp__now_ms ddp__host->now_ms
#define ddp_dtype_size ddp__host->dtype_size
#define ddp__gpu_fail_msg ddp__host->gpu_fail_msg
#define ddp__nccl_uid_exchange ddp__host->nccl_uid_exchange
#define ddp__mpi_boot_bcast ddp__host->mpi_boot_bcast
#define ddp__watchdog_start ddp__host->watchdog_start
#define ddp__watchdog_stop ddp__host->watchdog_stop
#define ddp__watchdog_track ddp__host->watchdog_track
#define ddp__watchdog_untrack ddp__host->watchdog_untrack
#define ddp__watchdog_step ddp__host->watchdog_step
#define ddp__watchdog_fail ddp__host->watchdog_fail
#define ddp__watchdog_error ddp__host->watchdog_error
/* In the module these are the table's entries (the names libddp's proxy.c keeps). */
#define ddp__cuda_devops ddp__gpu_cuda_devops

#endif /* DDP_NCCL_MODULE_HOST_H */
