/*
 * nccl/proxy.c — libddp's side of the GPU backends' device code, which lives in the GPU module
 * libddp_gpu.so (kernels/gpu_module.h: nccl.c and cudaops.c are compiled there, never here, so
 * libddp links neither libcudart nor libnccl). Here: the nccl registry entry (whether it can run
 * a group needs no GPU library: group.c's choice; its create loads the module), and
 * ddp__cuda_devops for cuda-staged, both loading the module on first use. Without CUDA or NCCL
 * in the build they say what is missing, as the stubs did.
 */
#include "group/group_int.h"
#include "group/staged/staged_int.h"
#include "kernels/gpu_module.h"
#include "util/util.h"

#ifdef DDP_HAVE_NCCL
const bool ddp__nccl_built = true;
#else
const bool ddp__nccl_built = false;
#endif
#ifdef DDP_HAVE_CUDA
const bool ddp__cuda_built = true;
#else
const bool ddp__cuda_built = false;
#endif

ddp_status ddp__cuda_devops(int device, ddp__devops *out, ddp_error *err)
{
    if (!ddp__cuda_built)
        return ddp__err(err, DDP_ERR_NOT_FOUND,
                        "cuda: this libddp was built without CUDA (DDP_CUDA=OFF); GPU buffers need "
                        "a build with nvcc on the PATH and -DDDP_CUDA=ON");
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    return st ? st : t->cuda_devops(device, out, err);
}

static bool nccl_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (!ddp__nccl_built) {
        ddp__fmt(why, cap,
                 "is not in this libddp (built with DDP_NCCL=OFF: no nccl.h/libnccl, or no "
                 "CUDA); use backend 'auto', 'cuda-ipc' or 'cuda-staged', or rebuild with NCCL");
        return false;
    }
    char reason[DDP_ERRMSG_MAX];
    ddp__gpu_pick p = ddp__setup_gpu_choice(s, reason, sizeof reason);
    if (p == DDP__PICK_NCCL)
        return true;
    ddp__fmt(why, cap, "cannot run this group: %s%s", reason,
             p == DDP__PICK_STAGED ? "; use backend 'auto' or 'cuda-staged'"
             : p == DDP__PICK_IPC  ? "; use backend 'auto', 'cuda-ipc' or 'cuda-staged'"
                                   : "");
    return false;
}

static ddp_status nccl_create(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                              ddp_error *err)
{
    if (!ddp__nccl_built)
        return ddp__err(err, DDP_ERR_NOT_FOUND,
                        "backend 'nccl' is not in this libddp (DDP_NCCL=OFF)");
    const ddp__gpu_api *t;
    ddp_status st = ddp__gpu_module(&t, err);
    if (st)
        return st;
    if (!t->nccl_create)
        return ddp__err(err, DDP_ERR_NOT_FOUND,
                        "backend 'nccl': the GPU module %s was built without NCCL; HINT: use "
                        "the libddp_gpu.so built with this libddp (DDP_GPU_MODULE)",
                        ddp__gpu_module_path());
    return t->nccl_create(s, be, ops, err);
}

const ddp__backend ddp__nccl_backend = {
    .name = "nccl",
    .usable = nccl_usable,
    .create = nccl_create,
    .gpu = true,
    .notice = true,
    .pick = DDP__PICK_NCCL,
};
