/*
 * kernels/cuda/module.cu — the GPU module's one entry symbol (kernels/gpu_module.h): the table
 * of the functions libddp calls through, with the ABI version it was built for. libddp's loader
 * (kernels/gpu.c) looks up ddp_gpu_module_entry with dlsym and checks abi and size before using
 * anything else.
 */
#include "common.cuh"

static const ddp__gpu_api table = {
    DDP_GPU_MODULE_ABI,
    (uint32_t)sizeof(ddp__gpu_api),
    ddp__gpu_device_count,
    ddp__gpu_device_name,
    ddp__gpu_gpt_create,
    ddp__gpu_gpt_free,
    ddp__gpu_gpt_set_params,
    ddp__gpu_gpt_forward,
    ddp__gpu_gpt_backward,
};

extern "C" __attribute__((visibility("default"))) const ddp__gpu_api *ddp_gpu_module_entry(void)
{
    return &table;
}
