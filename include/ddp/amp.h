/*
 * ddp/amp.h — dynamic loss scaling for fp16 training, with PyTorch GradScaler's semantics
 * (torch.cuda.amp.GradScaler with its defaults): the loss is multiplied by `scale` before
 * backward (ddp_model_batch.grad_scale), the gradients are unscaled and checked for inf/NaN
 * before the optimizer step, the step is skipped when any is found, and the scale is updated:
 *
 *   found inf/NaN:  scale ×= backoff_factor (0.5), growth_tracker = 0, the step is skipped;
 *   else:           growth_tracker += 1; when it reaches growth_interval (2000): scale ×=
 *                   growth_factor (2.0) if that is finite, growth_tracker = 0.
 *   initial scale 2^16.
 *
 *   ddp_grad_scaler s = DDP_GRAD_SCALER_INIT;
 *   each step:
 *       batch.grad_scale = s.scale / accum;              // forward + backward of each micro-batch
 *       bool inf = ddp_grad_scaler_unscale(&s, grads, counts, n);   // grads ×= 1/scale
 *       ddp_grad_scaler_sync(group, &inf);               // the same decision on every rank
 *       if (ddp_grad_scaler_update(&s, inf)) optimizer step;   // else skipped
 *
 * With DDP the gradients are averaged before unscaling, so every rank sees the same values and
 * finds the same inf; ddp_grad_scaler_sync makes that a guarantee rather than a consequence (an
 * allreduce MAX of the flag: a rank whose local check differs, e.g. a sharded optimizer that
 * checks only its shard, still agrees). The state is plain data: checkpoints store scale and
 * growth_tracker. Not thread-safe per scaler; no state outside the struct.
 */
#ifndef DDP_AMP_H
#define DDP_AMP_H

#include <stdbool.h>
#include <stddef.h>

#include "ddp/group.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_grad_scaler {
    float scale;          /* the loss multiplier, > 0 */
    float growth_factor;  /* > 1 */
    float backoff_factor; /* in (0, 1) */
    int growth_interval;  /* clean steps before growing, ≥ 1 */
    int growth_tracker;   /* clean steps since the last growth or inf */
} ddp_grad_scaler;

/* torch.cuda.amp.GradScaler()'s defaults. */
#define DDP_GRAD_SCALER_INIT                                                                       \
    {                                                                                              \
        65536.0f, 2.0f, 0.5f, 2000, 0                                                              \
    }

/* DDP_OK when s's settings are usable (the ranges above); DDP_ERR_INVALID naming the field. */
ddp_status ddp_grad_scaler_check(const ddp_grad_scaler *s, ddp_error *err);

/* Multiplies every gradient by 1/scale (the reciprocal formed in double and rounded to float,
 * as torch does) and returns whether any value was inf or NaN before unscaling. n arrays of
 * counts[i] floats each (NULL arrays are skipped). */
bool ddp_grad_scaler_unscale(const ddp_grad_scaler *s, float *const *grads, const size_t *counts,
                             int n);

/* *found_inf = whether any rank of g found one (an allreduce MAX of the flag). g NULL: a world
 * of one, *found_inf unchanged. g may be a GPU group (the one reducing device gradients): the
 * flag then travels through a word of device memory. Every rank must call it. Errors: the
 * group's (its ddp_group_last_error), DDP_ERR_NOMEM when a GPU group has no memory left for the
 * word; *found_inf then unchanged. */
ddp_status ddp_grad_scaler_sync(ddp_group *g, bool *found_inf);

/* Updates the scale with this step's verdict (the rule above) and returns whether the optimizer
 * step should be taken (!found_inf). */
bool ddp_grad_scaler_update(ddp_grad_scaler *s, bool found_inf);

#ifdef __cplusplus
}
#endif
#endif /* DDP_AMP_H */
