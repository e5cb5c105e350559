/*
 * kernels/cuda/stub.c — the CUDA entry points of kernels/kernels.h in a build without CUDA
 * (DDP_CUDA off: no nvcc, or a sanitizer build). Each says so, so callers need no #ifdef.
 */
#include "kernels/kernels.h"
#include "util/util.h"

ddp_status ddp__cuda_device_count(int *n, ddp_error *err)
{
    if (!n)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device count: the output n is NULL");
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); HINT: reconfigure "
                    "with nvcc on the PATH (or -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc) "
                    "and -DDDP_CUDA=ON");
}

ddp_status ddp__cuda_device_name(int idx, char *name, size_t cap, ddp_error *err)
{
    (void)idx;
    if (!name || cap == 0)
        return ddp__err(err, DDP_ERR_INVALID, "cuda device name: no output buffer");
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); no device names");
}
