/*
 * kernels/gpu_module.h — the contract between libddp and its GPU module, libddp_gpu.so.
 *
 * Everything that needs the CUDA runtime, cuBLAS or cuBLASLt is built (DDP_CUDA on) into a
 * separate shared library, libddp_gpu.so (src/kernels/cuda: the runtime linked statically,
 * cuBLAS and cuBLASLt dynamically). libddp itself links no CUDA library: kernels/gpu.c loads
 * the module with dlopen the first time the GPU is asked for (device cuda or auto, a GPU count)
 * and reaches it through one table of function pointers, got from the module's one entry
 * symbol. A program that never asks for a GPU never maps a CUDA library.
 *
 * The table is versioned: the loader refuses a module whose abi or size differs from its own
 * (a stale libddp_gpu.so from another build), naming the file. Change DDP_GPU_MODULE_ABI
 * whenever the table, a signature in it, or a type it passes (ddp_error, ddp__cuda_gpt_cfg, …)
 * changes.
 */
#ifndef DDP_KERNELS_GPU_MODULE_H
#define DDP_KERNELS_GPU_MODULE_H

#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_GPU_MODULE_ABI 1
#define DDP_GPU_MODULE_FILE "libddp_gpu.so"
#define DDP_GPU_MODULE_ENTRY "ddp_gpu_module_entry" /* the one symbol the loader looks up */

/* The module's functions: the contracts of kernels.h's functions of the same names (the
 * ddp__cuda_* entry points there forward to these). */
typedef struct ddp__gpu_api {
    uint32_t abi;  /* DDP_GPU_MODULE_ABI of the module's build */
    uint32_t size; /* sizeof(ddp__gpu_api) there */
    ddp_status (*device_count)(int *n, ddp_error *err);
    ddp_status (*device_name)(int idx, char *name, size_t cap, ddp_error *err);
    ddp_status (*gpt_create)(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                             ddp__cuda_gpt **out, ddp_error *err);
    void (*gpt_free)(ddp__cuda_gpt *g);
    ddp_status (*gpt_set_params)(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err);
    ddp_status (*gpt_forward)(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                              int n, int T, bool train, bool last_logits, float grad_scale,
                              double *loss_sum, int *count, int64_t *correct, float *logits_host,
                              ddp_error *err);
    ddp_status (*gpt_backward)(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err);
} ddp__gpu_api;

/* The module's entry symbol (DDP_GPU_MODULE_ENTRY): its table, static, never NULL. */
typedef const ddp__gpu_api *(*ddp__gpu_entry_fn)(void);
const ddp__gpu_api *ddp_gpu_module_entry(void);

/* Inside the module (kernels/cuda): the implementations the table points at. */
ddp_status ddp__gpu_device_count(int *n, ddp_error *err);
ddp_status ddp__gpu_device_name(int idx, char *name, size_t cap, ddp_error *err);
ddp_status ddp__gpu_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                               ddp__cuda_gpt **out, ddp_error *err);
void ddp__gpu_gpt_free(ddp__cuda_gpt *g);
ddp_status ddp__gpu_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err);
ddp_status ddp__gpu_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                                int n, int T, bool train, bool last_logits, float grad_scale,
                                double *loss_sum, int *count, int64_t *correct, float *logits_host,
                                ddp_error *err);
ddp_status ddp__gpu_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err);

/* In libddp (kernels/gpu.c): loads the module once per process (thread-safe) and returns its
 * table, or DDP_ERR_NOT_FOUND with a one-line message naming the file and dlerror() (or where
 * it looked). A failure is remembered: later calls return the same message. */
ddp_status ddp__gpu_module(const ddp__gpu_api **out, ddp_error *err);
/* The path the module was loaded from ("" before a successful load). */
const char *ddp__gpu_module_path(void);

#ifdef __cplusplus
}
#endif
#endif /* DDP_KERNELS_GPU_MODULE_H */
