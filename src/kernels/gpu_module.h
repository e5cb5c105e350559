/*
 * kernels/gpu_module.h — the contract between libddp and its GPU module, libddp_gpu.so.
 *
 * Everything that needs the CUDA runtime, cuBLAS, cuBLASLt or NCCL is built (DDP_CUDA on) into
 * a separate shared library, libddp_gpu.so (src/kernels/cuda and the GPU backends' device side,
 * src/group/nccl/nccl.c and cudaops.c: the runtime linked statically, cuBLAS, cuBLASLt and
 * libnccl dynamically). libddp itself links no CUDA library: kernels/gpu.c loads
 * the module with dlopen the first time the GPU is asked for (device cuda or auto, a GPU count)
 * and reaches it through one table of function pointers, got from the module's one entry
 * symbol. A program that never asks for a GPU never maps a CUDA library.
 *
 * The table is versioned: the loader refuses a module whose abi or size differs from its own
 * (a stale libddp_gpu.so from another build), naming the file. Change DDP_GPU_MODULE_ABI
 * whenever either table, a signature in them, or a type they pass (ddp_error, ddp__cuda_gpt_cfg,
 * ddp__setup, ddp__coll, ddp__devops, ddp__backend_ops, ddp__watchdog, …) changes.
 */
#ifndef DDP_KERNELS_GPU_MODULE_H
#define DDP_KERNELS_GPU_MODULE_H

#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's versions: 3: ddp__backend_ops.detail; 4: .devops, devops arithmetic, device-resident
 * GPT; 5: the classifier (cls_*); 6: the GPT's bound parameters and state views (sharded step),
 * its dropout (cfg.dropout/seed, forward's step and sample offset); 7: devops' IPC, reduce and
 * d2d (cuda-ipc); 8: the classifier's device-resident training (cls_dev_info …); 9: the
 * watchdog's peer flag (async_error, watchdog_fail, watchdog_error), the classifier batch's
 * sample_stride (ddp__cuda_cls_batch); 10: the device optimizer's narrowing (gpt_optim_keep,
 * cls_optim_keep: ZeRO-1's memory split on the GPU), the device's memory in use (mem_info); 11:
 * generation's key/value cache (gpt_forward_cached). */
#define DDP_GPU_MODULE_ABI 11
#define DDP_GPU_MODULE_FILE "libddp_gpu.so"
#define DDP_GPU_MODULE_ENTRY "ddp_gpu_module_entry" /* the one symbol the loader looks up */

/* The group's types the GPU backends pass (src/group: group_int.h, staged_int.h, nccl_int.h). */
struct ddp__setup;
struct ddp__backend_ops;
struct ddp__devops;
struct ddp__coll;
struct ddp__watchdog;
struct ddp__wd_comm;
struct ddp__mpi_boot;
struct ddp_store;

/* What libddp lends the module's GPU backends (src/group/nccl/nccl.c, cudaops.c, compiled into
 * the module with group/nccl/module_host.h routing these names here): the module calls nothing
 * in libddp by symbol, so it loads into any program, static libddp or shared. */
typedef struct ddp__gpu_host {
    ddp_status (*error_set)(ddp_error *err, ddp_status st, const char *fmt, ...);
    void (*fmt)(char *buf, size_t cap, const char *fmt, ...);
    void (*fmt_duration)(char *buf, size_t cap, int64_t ms);
    int64_t (*now_ms)(void);
    size_t (*dtype_size)(ddp_dtype t);
    void (*gpu_fail_msg)(char *buf, size_t cap, const char *be, int rank, const struct ddp__coll *c,
                         const char *call, const char *why);
    ddp_status (*nccl_uid_exchange)(struct ddp_store *store, const char *prefix, int me,
                                    int timeout_ms,
                                    ddp_status (*make)(void *ctx, void *id, size_t n,
                                                       ddp_error *err),
                                    void *ctx, void *id, size_t n, ddp_error *err);
    ddp_status (*mpi_boot_bcast)(struct ddp__mpi_boot *b, const int *ranks, int n, int me,
                                 void *buf, size_t bytes, ddp_error *err);
    ddp_status (*watchdog_start)(struct ddp__watchdog *wd, const struct ddp__wd_comm *comm,
                                 const char *backend, int rank, int poll_ms, ddp_error *err);
    void (*watchdog_stop)(struct ddp__watchdog *wd);
    ddp_status (*watchdog_track)(struct ddp__watchdog *wd, const struct ddp__coll *c, void *ev,
                                 int64_t now);
    void (*watchdog_untrack)(struct ddp__watchdog *wd, uint64_t seq);
    ddp_status (*watchdog_step)(struct ddp__watchdog *wd, int64_t now);
    void (*watchdog_fail)(struct ddp__watchdog *wd, ddp_status st, const char *msg, bool peer);
    ddp_status (*watchdog_error)(struct ddp__watchdog *wd, char *msg, size_t cap, bool *peer);
} ddp__gpu_host;

/* The module's functions: the contracts of kernels.h's functions of the same names (the
 * ddp__cuda_* entry points there forward to these), and of the GPU backends' device side. */
typedef struct ddp__gpu_api {
    uint32_t abi;  /* DDP_GPU_MODULE_ABI of the module's build */
    uint32_t size; /* sizeof(ddp__gpu_api) there */
    /* Called once, right after the checks, before anything else: libddp's services. */
    void (*set_host)(const ddp__gpu_host *host);
    ddp_status (*device_count)(int *n, ddp_error *err);
    ddp_status (*device_name)(int idx, char *name, size_t cap, ddp_error *err);
    ddp_status (*gpt_create)(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                             ddp__cuda_gpt **out, ddp_error *err);
    void (*gpt_free)(ddp__cuda_gpt *g);
    ddp_status (*gpt_set_params)(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err);
    ddp_status (*gpt_forward)(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                              int n, int T, bool train, bool last_logits, float grad_scale,
                              uint64_t step, uint64_t sample_offset, double *loss_sum, int *count,
                              int64_t *correct, float *logits_host, ddp_error *err);
    ddp_status (*gpt_backward)(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err);
    /* staged_int.h's ddp__cuda_devops (group/nccl/cudaops.c). */
    ddp_status (*cuda_devops)(int device, struct ddp__devops *out, ddp_error *err);
    /* The nccl backend's create (group/nccl/nccl.c); NULL in a module built without NCCL. */
    ddp_status (*nccl_create)(const struct ddp__setup *s, void **be,
                              const struct ddp__backend_ops **ops, ddp_error *err);
    /* Device-resident training (kernels.h's ddp__cuda_gpt_dev_info …); NULL: not in this module. */
    ddp_status (*gpt_dev_info)(ddp__cuda_gpt *g, float **params_dev, void **stream, ddp_error *err);
    ddp_status (*gpt_get_params)(ddp__cuda_gpt *g, float *const *data_host, ddp_error *err);
    ddp_status (*gpt_backward_dev)(ddp__cuda_gpt *g, float *const *grads_dev,
                                   ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                   ddp_error *err);
    ddp_status (*gpt_optim_init)(ddp__cuda_gpt *g, int nstates, ddp_error *err);
    ddp_status (*gpt_optim_step)(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *err);
    ddp_status (*gpt_optim_state)(ddp__cuda_gpt *g, int s, float *const *host, bool to_host,
                                  ddp_error *err);
    ddp_status (*gpt_bind_params)(ddp__cuda_gpt *g, float *const *params_dev, ddp_error *err);
    ddp_status (*gpt_state_dev)(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err);
    /* The MLP and CNN (kernels.h's ddp__cuda_cls_*); NULL: not in this module (built without
     * cuDNN, or a test's fake). */
    ddp_status (*cls_create)(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                             const size_t *bcounts, size_t nb, ddp__cuda_cls **out, ddp_error *err);
    void (*cls_free)(ddp__cuda_cls *g);
    ddp_status (*cls_upload)(ddp__cuda_cls *g, const float *const *params_host,
                             const float *const *buffers_host, ddp_error *err);
    ddp_status (*cls_forward)(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                              int64_t *correct, float *logits_host, ddp_error *err);
    ddp_status (*cls_get_buffers)(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err);
    ddp_status (*cls_backward)(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err);
    /* The MLP and CNN's device-resident training (kernels.h's ddp__cuda_cls_dev_info …); NULL:
     * not in this module. */
    ddp_status (*cls_dev_info)(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                               void **stream, ddp_error *err);
    ddp_status (*cls_get_params)(ddp__cuda_cls *g, float *const *params_host, ddp_error *err);
    ddp_status (*cls_backward_dev)(ddp__cuda_cls *g, float *const *grads_dev,
                                   ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                   ddp_error *err);
    ddp_status (*cls_optim_init)(ddp__cuda_cls *g, int nstates, ddp_error *err);
    ddp_status (*cls_optim_step)(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err);
    ddp_status (*cls_optim_state)(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                  ddp_error *err);
    ddp_status (*cls_bind_params)(ddp__cuda_cls *g, float *const *params_dev, ddp_error *err);
    ddp_status (*cls_state_dev)(ddp__cuda_cls *g, int s, float **dev, ddp_error *err);
    /* The device optimizer's state narrowed to each parameter's shard (kernels.h's
     * ddp__cuda_gpt_optim_keep); NULL: not in this module. */
    ddp_status (*gpt_optim_keep)(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi,
                                 ddp_error *err);
    ddp_status (*cls_optim_keep)(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                                 ddp_error *err);
    /* kernels.h's ddp__cuda_mem_info; NULL: not in this module. */
    ddp_status (*mem_info)(int idx, size_t *used, size_t *total, ddp_error *err);
    /* kernels.h's ddp__cuda_gpt_forward_cached; NULL: not in this module. */
    ddp_status (*gpt_forward_cached)(ddp__cuda_gpt *g, const int32_t *tokens, int T, int past,
                                     float *logits_host, ddp_error *err);
} ddp__gpu_api;

/* The module's entry symbol (DDP_GPU_MODULE_ENTRY): its table, static, never NULL. */
typedef const ddp__gpu_api *(*ddp__gpu_entry_fn)(void);
const ddp__gpu_api *ddp_gpu_module_entry(void);

/* Inside the module (kernels/cuda): the implementations the table points at. */
ddp_status ddp__gpu_device_count(int *n, ddp_error *err);
ddp_status ddp__gpu_device_name(int idx, char *name, size_t cap, ddp_error *err);
ddp_status ddp__gpu_mem_info(int idx, size_t *used, size_t *total, ddp_error *err);
ddp_status ddp__gpu_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                               ddp__cuda_gpt **out, ddp_error *err);
void ddp__gpu_gpt_free(ddp__cuda_gpt *g);
ddp_status ddp__gpu_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host, ddp_error *err);
ddp_status ddp__gpu_gpt_forward_cached(ddp__cuda_gpt *g, const int32_t *tokens, int T, int past,
                                       float *logits_host, ddp_error *err);
ddp_status ddp__gpu_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                                int n, int T, bool train, bool last_logits, float grad_scale,
                                uint64_t step, uint64_t sample_offset, double *loss_sum, int *count,
                                int64_t *correct, float *logits_host, ddp_error *err);
ddp_status ddp__gpu_gpt_dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream,
                                 ddp_error *err);
ddp_status ddp__gpu_gpt_get_params(ddp__cuda_gpt *g, float *const *data_host, ddp_error *err);
ddp_status ddp__gpu_gpt_backward_dev(ddp__cuda_gpt *g, float *const *grads_dev,
                                     ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                     ddp_error *err);
ddp_status ddp__gpu_gpt_optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err);
ddp_status ddp__gpu_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *err);
ddp_status ddp__gpu_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *host, bool to_host,
                                    ddp_error *err);
ddp_status ddp__gpu_gpt_bind_params(ddp__cuda_gpt *g, float *const *params_dev, ddp_error *err);
ddp_status ddp__gpu_gpt_state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err);
ddp_status ddp__gpu_gpt_optim_keep(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi,
                                   ddp_error *err);
ddp_status ddp__gpu_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err);
ddp_status ddp__gpu_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                               const size_t *bcounts, size_t nb, ddp__cuda_cls **out,
                               ddp_error *err);
void ddp__gpu_cls_free(ddp__cuda_cls *g);
ddp_status ddp__gpu_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                               const float *const *buffers_host, ddp_error *err);
ddp_status ddp__gpu_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                                int64_t *correct, float *logits_host, ddp_error *err);
ddp_status ddp__gpu_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err);
ddp_status ddp__gpu_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err);
ddp_status ddp__gpu_cls_dev_info(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                                 void **stream, ddp_error *err);
ddp_status ddp__gpu_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err);
ddp_status ddp__gpu_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                     ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                     ddp_error *err);
ddp_status ddp__gpu_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err);
ddp_status ddp__gpu_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err);
ddp_status ddp__gpu_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                    ddp_error *err);
ddp_status ddp__gpu_cls_bind_params(ddp__cuda_cls *g, float *const *params_dev, ddp_error *err);
ddp_status ddp__gpu_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err);
ddp_status ddp__gpu_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                                   ddp_error *err);
ddp_status ddp__gpu_cuda_devops(int device, struct ddp__devops *out, ddp_error *err);
ddp_status ddp__gpu_nccl_create(const struct ddp__setup *s, void **be,
                                const struct ddp__backend_ops **ops, ddp_error *err);
extern const ddp__gpu_host *ddp__host; /* set_host's, for module_host.h */

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
