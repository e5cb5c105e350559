/*
 * nn/amp.c — the GradScaler state machine (include/ddp/amp.h). The host-side half of fp16
 * training: the CUDA path checks and unscales on the device (kernels/cuda) and hands the flag
 * here; the CPU version below is the reference and serves CPU-resident gradients. It does not
 * cast anything to fp16 itself.
 */
#include <math.h>

#include "ddp/amp.h"
#include "group/devops.h"
#include "util/util.h"

ddp_status ddp_grad_scaler_check(const ddp_grad_scaler *s, ddp_error *err)
{
    if (!s)
        return ddp__err(err, DDP_ERR_INVALID, "grad scaler: NULL");
    if (!(s->scale > 0) || !isfinite(s->scale))
        return ddp__err(err, DDP_ERR_INVALID, "grad scaler: scale %g must be finite and > 0",
                        (double)s->scale);
    if (!(s->growth_factor > 1) || !isfinite(s->growth_factor))
        return ddp__err(err, DDP_ERR_INVALID, "grad scaler: growth_factor %g must be > 1",
                        (double)s->growth_factor);
    if (!(s->backoff_factor > 0 && s->backoff_factor < 1))
        return ddp__err(err, DDP_ERR_INVALID, "grad scaler: backoff_factor %g must be in (0, 1)",
                        (double)s->backoff_factor);
    if (s->growth_interval < 1 || s->growth_tracker < 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "grad scaler: growth_interval %d must be ≥ 1 and growth_tracker %d ≥ 0",
                        s->growth_interval, s->growth_tracker);
    return DDP_OK;
}

bool ddp_grad_scaler_unscale(const ddp_grad_scaler *s, float *const *grads, const size_t *counts,
                             int n)
{
    float inv = (float)(1.0 / (double)s->scale);
    bool found = false;
    for (int a = 0; a < n; a++) {
        float *g = grads[a];
        if (!g)
            continue;
        for (size_t i = 0; i < counts[a]; i++) {
            found |= !isfinite(g[i]);
            g[i] *= inv;
        }
    }
    return found;
}

ddp_status ddp_grad_scaler_sync(ddp_group *g, bool *found_inf)
{
    if (!g)
        return DDP_OK;
    float flag = *found_inf ? 1.0f : 0.0f;
    /* a GPU group (the one reducing device gradients) through its device scratch */
    ddp_status st = ddp__group_host_collective(g, false, &flag, &flag, 1, DDP_FLOAT32, DDP_MAX);
    if (st == DDP_OK)
        *found_inf = flag != 0.0f;
    return st;
}

bool ddp_grad_scaler_update(ddp_grad_scaler *s, bool found_inf)
{
    if (found_inf) {
        s->scale *= s->backoff_factor;
        s->growth_tracker = 0;
        return false;
    }
    int successful = s->growth_tracker + 1;
    if (successful >= s->growth_interval) {
        float grown = s->scale * s->growth_factor;
        if (isfinite(grown))
            s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = successful;
    }
    return true;
}
