/* fake_gpu_cls.h — fake_gpu_cls.c's functions, for fake_gpu_gpt.c's table (test-only). */
#ifndef DDP_TEST_FAKE_GPU_CLS_H
#define DDP_TEST_FAKE_GPU_CLS_H

#include "kernels/kernels.h"

ddp_status fake_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                           const size_t *bcounts, size_t nb, ddp__cuda_cls **out, ddp_error *err);
void fake_cls_free(ddp__cuda_cls *g);
ddp_status fake_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                           const float *const *buffers_host, ddp_error *err);
ddp_status fake_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                            int64_t *correct, float *logits_host, ddp_error *err);
ddp_status fake_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err);
ddp_status fake_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err);
ddp_status fake_cls_dev_info(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                             void **stream, ddp_error *err);
ddp_status fake_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err);
ddp_status fake_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                 ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                 ddp_error *err);
ddp_status fake_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err);
ddp_status fake_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a, ddp_error *err);
ddp_status fake_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                ddp_error *err);
ddp_status fake_cls_bind_params(ddp__cuda_cls *g, float *const *params_dev, ddp_error *err);
ddp_status fake_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err);
ddp_status fake_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                               ddp_error *err);

#endif /* DDP_TEST_FAKE_GPU_CLS_H */
