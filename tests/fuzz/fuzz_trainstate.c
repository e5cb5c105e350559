/*
 * fuzz_trainstate.c — trainer-state checkpoints as ddptrain resumes them (ddp_ckpt_load_train):
 * beyond the safetensors container (the ckpt target), the "format" mark, parameters, optimizer
 * state and buffers looked up by name and element count and copied into the caller's arrays,
 * and the position metadata (step, epoch, next_batch, world_size, optim_step, loss_scale,
 * loss_scale_growth) parsed from text.
 *
 * Input: the file. The state asked for: parameters "w" (2×3) and "b" (3), optimizer states
 * "exp_avg" and "exp_avg_sq", a buffer "bn.mean" (2). On DDP_OK the position must be one a
 * trainer can use: world_size ≥ 1, next_batch × world_size without overflow (ddptrain converts
 * next_batch to its own world size with it), a finite loss scale ≥ 0, optim_step ≤ step.
 */
#include "fuzz.h"

#include <math.h>
#include <string.h>

#include "ddp/ckpt.h"
#include "ddp/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_mem_file(data, size, path, sizeof path);
    float w[6], b[3], mw[6], mb[3], vw[6], vb[3], bn[2];
    ddp_model_param params[2] = {
        {.name = "w", .ndim = 2, .shape = {2, 3}, .count = 6, .data = w},
        {.name = "b", .ndim = 1, .shape = {3}, .count = 3, .data = b},
    };
    ddp_model_param buffers[1] = {
        {.name = "bn.mean", .ndim = 1, .shape = {2}, .count = 2, .data = bn}};
    float *m_arr[2] = {mw, mb}, *v_arr[2] = {vw, vb};
    ddp_ckpt_train_state s = {.params = params,
                              .n_params = 2,
                              .buffers = buffers,
                              .n_buffers = 1,
                              .n_optim = 2,
                              .optim_names = {"exp_avg", "exp_avg_sq"},
                              .optim = {m_arr, v_arr}};
    ddp_ckpt_train_pos pos;
    memset(&pos, 0xa5, sizeof pos);
    ddp_error err = {0};
    ddp_status st = ddp_ckpt_load_train(path, &s, &pos, &err);
    if (st != DDP_OK && !*err.msg)
        abort();
    if (st == DDP_OK) {
        if (pos.world_size < 1 || pos.next_batch > UINT64_MAX / pos.world_size ||
            !isfinite(pos.loss_scale) || pos.loss_scale < 0 || pos.optim_step > pos.step ||
            pos.loss_scale_growth < 0) {
            fprintf(stderr,
                    "fuzz_trainstate: accepted a position no trainer can use: "
                    "world_size %llu next_batch %llu loss_scale %g optim_step %llu "
                    "step %llu growth %d\n",
                    (unsigned long long)pos.world_size, (unsigned long long)pos.next_batch,
                    (double)pos.loss_scale, (unsigned long long)pos.optim_step,
                    (unsigned long long)pos.step, (int)pos.loss_scale_growth);
            abort();
        }
        volatile float keep = w[0] + b[0] + mw[0] + mb[0] + vw[5] + vb[2] + bn[1];
        (void)keep;
    }
    close(fd);
    return 0;
}
