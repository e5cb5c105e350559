/*
 * ddp/optim.h — an optimizer over a model's parameter list, and the learning-rate schedule.
 *
 *   ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;                 // SGD, momentum 0.9
 *   ddp_optim *opt;
 *   ddp_optim_create(&oo, params, n, &opt, &err);            // params: ddp_model_params()
 *   ddp_lr_schedule ls = DDP_LR_SCHEDULE_INIT;  ls.total_steps = T;
 *   each step s = 0, 1, …, after the gradients are final (ddp_reducer_finish):
 *       ddp_optim_step(opt, s + 1, (float)ddp_lr_at(&ls, s), 1.0f);
 *   or, with the reducer's sharded step, each rank steps its shard of each parameter:
 *       ddp_reducer_shard(red, i, &lo, &hi);
 *       ddp_optim_step_range(opt, i, lo, hi, s + 1, lr, coef);
 *       then ddp_reducer_gather_params(red);
 *
 * The updates are the kernels of ddp/nn.h (ddp_nn_sgd_step, ddp_nn_adamw_step: torch's
 * single-tensor code paths, float rounding included). Weight decay applies to the parameters
 * whose `decay` flag is set, with 0 for the others (torch's parameter groups, as nanoGPT makes
 * them: decay for matrices, none for biases and norms, is the model's choice).
 *
 * The optimizer reads each parameter's data and grad pointers at every step, so the model may
 * bind them elsewhere (ddp_model_bind) after creation. The state (torch's names: SGD
 * "momentum_buffer"; AdamW "exp_avg", "exp_avg_sq") is full-size per parameter, owned by the
 * optimizer, zeroed at creation, and reachable for checkpoints and for the reducer's
 * ddp_reducer_gather_state (ddp_optim_state). The step number is the caller's (1-based, the
 * count of steps taken, this one included), so a resumed run passes on from its checkpoint.
 *
 * ZeRO-1's memory split (torch's ZeroRedundancyOptimizer): with the reducer's sharded step, a
 * rank steps only its shard, so it needs the state of that shard only. After the state is
 * complete (created, or loaded from a checkpoint and shared), narrow it to the shard:
 *       ddp_reducer_shard(red, i, &lo[i], &hi[i]) for each i;  ddp_optim_keep(opt, lo, hi);
 * and each rank holds 1/world of the state. Before a checkpoint, rank `root` collects the whole
 * state with ddp_reducer_gather_state_to (ddp/reducer.h) into arrays of its own.
 *
 * Threads: one thread at a time, except that ddp_optim_step_range() calls on different
 * parameters, or on disjoint ranges of one, may run on several threads at once.
 */
#ifndef DDP_OPTIM_H
#define DDP_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/model.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_optim_kind {
    DDP_OPTIM_SGD,   /* torch.optim.SGD, dampening 0, no nesterov */
    DDP_OPTIM_ADAMW, /* torch.optim.AdamW, no amsgrad */
} ddp_optim_kind;

typedef struct ddp_optim_opts {
    ddp_optim_kind kind;
    float momentum;     /* sgd (0: plain SGD; the state is still kept, and saved) */
    float beta1, beta2; /* adamw */
    float eps;          /* adamw */
    float weight_decay; /* sgd: L2 added to the gradient; adamw: decoupled; only where decay */
} ddp_optim_opts;

#define DDP_OPTIM_OPTS_INIT                                                                        \
    {                                                                                              \
        DDP_OPTIM_SGD, 0.9f, 0.9f, 0.999f, 1e-8f, 0.0f                                             \
    }

/* State arrays per parameter, at most. */
#define DDP_OPTIM_MAX_STATES 2

typedef struct ddp_optim ddp_optim;

/* An optimizer over params[0 … n−1] (borrowed for its whole life: the model's list). Allocates
 * the state, zeroed. *out is set only on DDP_OK. Errors (message in err, may be NULL):
 * DDP_ERR_INVALID (an unknown kind, a negative hyperparameter, betas outside [0, 1)),
 * DDP_ERR_NOMEM. */
ddp_status ddp_optim_create(const ddp_optim_opts *opts, const ddp_model_param *params, size_t n,
                            ddp_optim **out, ddp_error *err);
void ddp_optim_destroy(ddp_optim *o); /* NULL is a no-op */

/* How many state arrays each parameter has (sgd 1, adamw 2), their names ("momentum_buffer";
 * "exp_avg", "exp_avg_sq"; NULL for s out of range) and the arrays: state[i] is parameter i's,
 * (params[i].count,) fp32 — or the kept elements only after ddp_optim_keep — owned by o (NULL
 * for s out of range). */
int ddp_optim_num_states(const ddp_optim *o);
const char *ddp_optim_state_name(const ddp_optim *o, int s);
float *const *ddp_optim_state(const ddp_optim *o, int s);

/* Keeps the state of elements [lo[i], hi[i]) of each parameter i only (n ranges, each within
 * what o keeps: a range can only narrow), with the values it had, and frees the rest. From then
 * on ddp_optim_state(o, s)[i] holds hi[i] − lo[i] floats, element lo[i]'s first;
 * ddp_optim_step_range refuses elements outside the range and ddp_optim_step steps the kept
 * elements only. A failure (DDP_ERR_INVALID: a range outside the kept one, message on o;
 * DDP_ERR_NOMEM) changes nothing. */
ddp_status ddp_optim_keep(ddp_optim *o, const size_t *lo, const size_t *hi);
/* The elements of parameter i whose state o keeps: [0, count) until ddp_optim_keep; [0, 0) for
 * i out of range. */
void ddp_optim_kept(const ddp_optim *o, size_t i, size_t *lo, size_t *hi);
/* Whether ddp_optim_keep narrowed any parameter's state. */
bool ddp_optim_narrowed(const ddp_optim *o);

/* One update of elements [lo, hi) of parameter i, step `step` (1-based) at learning rate lr.
 * When grad_scale is not 1 the gradient elements are first multiplied by it in place (the
 * clipping coefficient, ddp_nn_clip_coef). DDP_ERR_INVALID (message on o) for i ≥ n or a range
 * outside [0, count); nothing is changed then. */
ddp_status ddp_optim_step_range(ddp_optim *o, size_t i, size_t lo, size_t hi, uint64_t step,
                                float lr, float grad_scale);

/* The same with the gradient of those elements at grad (grad[0] is element lo's, hi − lo of
 * them) instead of the parameter's grad pointer: a sharded-gradient reducer's
 * ddp_reducer_shard_grad (ZeRO-2), where no whole gradient exists. */
ddp_status ddp_optim_step_range_grad(ddp_optim *o, size_t i, size_t lo, size_t hi, float *grad,
                                     uint64_t step, float lr, float grad_scale);

/* The same for every parameter, all of its elements. */
void ddp_optim_step(ddp_optim *o, uint64_t step, float lr, float grad_scale);

/* The message of the last failed call on o ("" if none failed) — owned by o. */
const char *ddp_optim_last_error(const ddp_optim *o);

/* ---- learning-rate schedule ------------------------------------------------------------------ */

typedef enum ddp_lr_decay {
    DDP_LR_COSINE,   /* lr · ½ (1 + cos(π f)) */
    DDP_LR_LINEAR,   /* lr · (1 − f) */
    DDP_LR_CONSTANT, /* lr */
    DDP_LR_STEP,     /* lr · gamma^⌊(step − warmup_steps) / step_size⌋ (torch's StepLR) */
} ddp_lr_decay;

typedef enum ddp_lr_scaling {
    DDP_LR_SCALE_NONE,   /* lr as given, for any world size */
    DDP_LR_SCALE_LINEAR, /* lr · world_size (Goyal et al.'s rule for SGD) */
    DDP_LR_SCALE_SQRT,   /* lr · √world_size (often better for Adam) */
} ddp_lr_scaling;

/* Plain data. With lr' = lr scaled by the world size:
 *   step < warmup_steps:  lr' · (step + 1) / warmup_steps         (linear warmup from 0)
 *   after:                decay(lr', f),  f = (step − warmup_steps) / (total_steps − warmup_steps)
 *                         (f = 0 when total_steps ≤ warmup_steps)
 *                         DDP_LR_STEP: lr' · gamma^⌊(step − warmup_steps) / step_size⌋, as
 *                         torch.optim.lr_scheduler.StepLR stepped once per step_size steps
 *                         (step_size 0: lr', never decayed)
 * Steps count from 0, the number of optimizer steps already taken. Computed in double. */
typedef struct ddp_lr_schedule {
    double lr; /* for one process */
    ddp_lr_scaling scaling;
    int world_size; /* ≥ 1 */
    uint64_t warmup_steps;
    ddp_lr_decay decay;
    uint64_t total_steps;
    uint64_t step_size; /* DDP_LR_STEP: steps between two decays */
    double gamma;       /* DDP_LR_STEP: the factor of each decay (torch's default 0.1) */
} ddp_lr_schedule;

#define DDP_LR_SCHEDULE_INIT                                                                       \
    {                                                                                              \
        0.1, DDP_LR_SCALE_NONE, 1, 0, DDP_LR_COSINE, 0, 0, 0.1                                     \
    }

/* The learning rate for step `step` (0-based). Pure: no state, any thread. */
double ddp_lr_at(const ddp_lr_schedule *s, uint64_t step);

#ifdef __cplusplus
}
#endif
#endif /* DDP_OPTIM_H */
