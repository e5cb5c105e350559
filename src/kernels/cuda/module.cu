/*
 * kernels/cuda/module.cu — the GPU module's one entry symbol (kernels/gpu_module.h): the table
 * of the functions libddp calls through (the GPT's, the MLP/CNN's (with cuDNN), the device count,
 * the GPU backends' device side), with the ABI version it was built for. libddp's loader
 * (kernels/gpu.c) looks up ddp_gpu_module_entry with dlsym and checks abi and size before using
 * anything else.
 */
#include "common.cuh"

const ddp__gpu_host *ddp__host; /* libddp's services, for group/nccl (module_host.h) */

static void set_host(const ddp__gpu_host *host)
{
    ddp__host = host;
}

static const ddp__gpu_api table = {
    DDP_GPU_MODULE_ABI,
    (uint32_t)sizeof(ddp__gpu_api),
    set_host,
    ddp__gpu_device_count,
    ddp__gpu_device_name,
    ddp__gpu_gpt_create,
    ddp__gpu_gpt_free,
    ddp__gpu_gpt_set_params,
    ddp__gpu_gpt_forward,
    ddp__gpu_gpt_backward,
    ddp__gpu_cuda_devops, /* group/nccl/cudaops.c */
#ifdef DDP_HAVE_NCCL
    ddp__gpu_nccl_create, /* group/nccl/nccl.c */
#else
    nullptr,
#endif
    ddp__gpu_gpt_dev_info,
    ddp__gpu_gpt_get_params,
    ddp__gpu_gpt_backward_dev,
    ddp__gpu_gpt_optim_init,
    ddp__gpu_gpt_optim_step,
    ddp__gpu_gpt_optim_state,
    ddp__gpu_gpt_bind_params,
    ddp__gpu_gpt_state_dev,
#ifdef DDP_HAVE_CUDNN /* classifier.cu: the MLP and CNN */
    ddp__gpu_cls_create,
    ddp__gpu_cls_free,
    ddp__gpu_cls_upload,
    ddp__gpu_cls_forward,
    ddp__gpu_cls_get_buffers,
    ddp__gpu_cls_backward,
    ddp__gpu_cls_dev_info,
    ddp__gpu_cls_get_params,
    ddp__gpu_cls_backward_dev,
    ddp__gpu_cls_optim_init,
    ddp__gpu_cls_optim_step,
    ddp__gpu_cls_optim_state,
    ddp__gpu_cls_bind_params,
    ddp__gpu_cls_state_dev,
#else
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
#endif
    ddp__gpu_gpt_optim_keep,
#ifdef DDP_HAVE_CUDNN
    ddp__gpu_cls_optim_keep,
#else
    nullptr,
#endif
    ddp__gpu_mem_info,
    ddp__gpu_gpt_forward_cached,
};

extern "C" __attribute__((visibility("default"))) const ddp__gpu_api *ddp_gpu_module_entry(void)
{
    return &table;
}
