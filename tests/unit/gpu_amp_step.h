/*
 * gpu_amp_step.h — the fp16 step the GPU tests' training loops share (test_cuda_gpt,
 * test_cuda_classifier): GradScaler's unscale and update over a model's host gradients, as
 * ddptrain does. Include after <cmocka.h>.
 */
#ifndef DDP_TEST_GPU_AMP_STEP_H
#define DDP_TEST_GPU_AMP_STEP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ddp/ddp.h"

/* Unscales m's gradients by s and updates s; false (the step is to be skipped, counted in
 * *skipped when given) when they held an inf or NaN. */
static inline bool ddp_test_amp_step(ddp_model *m, ddp_grad_scaler *s, uint64_t step,
                                     int *skipped)
{
    size_t np;
    const ddp_model_param *p = ddp_model_params(m, &np);
    float *g[64];
    size_t cnt[64];
    assert_true(np <= 64);
    for (size_t i = 0; i < np; i++)
        g[i] = p[i].grad, cnt[i] = p[i].count;
    float was = s->scale;
    bool take = ddp_grad_scaler_update(s, ddp_grad_scaler_unscale(s, g, cnt, (int)np));
    if (!take) {
        printf("    step %2llu: inf/NaN gradients at loss scale %g: skipped\n",
               (unsigned long long)step, (double)was);
        if (skipped)
            ++*skipped;
    }
    return take;
}

#endif /* DDP_TEST_GPU_AMP_STEP_H */
