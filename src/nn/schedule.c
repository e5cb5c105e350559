/*
 * schedule.c — the learning-rate schedule of ddp/optim.h: scaling by the world size, linear
 * warmup, then cosine, linear or constant decay. A pure function of the step, so a resumed run
 * needs nothing saved but the step; computed in double as Python would, so the value for a step
 * does not depend on how the run got there.
 */
#include <math.h>

#include "ddp/optim.h"

#define PI 3.14159265358979323846 /* glibc's M_PI, which strict C11 does not declare */

double ddp_lr_at(const ddp_lr_schedule *s, uint64_t step)
{
    double lr = s->lr;
    if (s->scaling == DDP_LR_SCALE_LINEAR)
        lr *= s->world_size;
    else if (s->scaling == DDP_LR_SCALE_SQRT)
        lr *= sqrt((double)s->world_size);
    uint64_t warm = s->warmup_steps;
    if (step < warm)
        return lr * (double)(step + 1) / (double)warm;
    uint64_t total = s->total_steps;
    double frac = total > warm ? (double)(step - warm) / (double)(total - warm) : 0;
    switch (s->decay) {
    case DDP_LR_COSINE: return lr * 0.5 * (1 + cos(PI * frac));
    case DDP_LR_LINEAR: return lr * (1 - frac);
    case DDP_LR_CONSTANT: break;
    case DDP_LR_STEP:
        if (s->step_size == 0)
            break;
        return lr * pow(s->gamma, (double)((step - warm) / s->step_size));
    }
    return lr;
}
