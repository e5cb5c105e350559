/*
 * nccl/cudaops_stub.c — ddp__cuda_devops in a libddp built without CUDA (DDP_CUDA off): it says
 * so, and the GPU backends' create fails with that message.
 */
#include "group/staged/staged_int.h"
#include "util/util.h"

ddp_status ddp__cuda_devops(int device, ddp__devops *out, ddp_error *err)
{
    (void)device;
    (void)out;
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); GPU buffers need "
                    "a build with nvcc on the PATH and -DDDP_CUDA=ON");
}

const bool ddp__cuda_built = false;
