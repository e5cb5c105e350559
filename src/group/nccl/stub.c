/*
 * nccl/stub.c — the nccl registry entry in a libddp built without NCCL (DDP_NCCL off: no nccl.h or
 * libnccl, or no CUDA). It is never usable, and says how to get it; GPU groups then take
 * cuda-staged (when CUDA is built).
 */
#include "group/group_int.h"
#include "util/util.h"

static bool stub_usable(const ddp__setup *s, char *why, size_t cap)
{
    (void)s;
    ddp__fmt(why, cap,
             "is not in this libddp (built with DDP_NCCL=OFF: no nccl.h/libnccl, or no "
             "CUDA); use backend 'auto' or 'cuda-staged', or rebuild with NCCL");
    return false;
}

static ddp_status stub_create(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                              ddp_error *err)
{
    (void)s;
    (void)be;
    (void)ops;
    return ddp__err(err, DDP_ERR_NOT_FOUND, "backend 'nccl' is not in this libddp (DDP_NCCL=OFF)");
}

const bool ddp__nccl_built = false;

const ddp__backend ddp__nccl_backend = {
    .name = "nccl",
    .usable = stub_usable,
    .create = stub_create,
    .gpu = true,
};
