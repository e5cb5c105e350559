/*
 * kernels/cuda/dropout.cuh — dropout's decisions in device code: util/rng.h's counter-based
 * hashes, the same arithmetic as the CPU's (src/nn/layers.c's ddp_nn_dropout_forward, and
 * src/nn/attention.c's per-row keys), so a mask is the same on either device and the backward
 * draws it again instead of storing it.
 */
#ifndef DDP_KERNELS_CUDA_DROPOUT_CUH
#define DDP_KERNELS_CUDA_DROPOUT_CUH

#include "common.cuh"

extern "C" {
#include "util/rng.h"
}

/* A ddp__cuda_drop made ready for kernels (passed by value). on: p > 0. */
struct ddp__drop_dev {
    uint64_t seed, step, offset;
    uint64_t thresh;   /* keep element i iff (rand_u64 >> 32) ≥ thresh = p·2³² */
    uint32_t thresh32; /* the same threshold for the attention's 32-bit draws */
    float scale;       /* 1 / (1 − p) */
    bool on;
};

static inline ddp__drop_dev ddp__drop_args(const ddp__cuda_drop *d)
{
    ddp__drop_dev a = {0, 0, 0, 0, 0, 1.0f, false};
    if (!d || !(d->p > 0.0f))
        return a;
    a.seed = d->seed;
    a.step = d->step;
    a.offset = d->offset;
    a.thresh = (uint64_t)((double)d->p * 4294967296.0); /* p < 1: fits in 32 bits */
    a.thresh32 = (uint32_t)a.thresh;
    a.scale = 1.0f / (1.0f - d->p);
    a.on = true;
    return a;
}

/* The key of attention row r (of the B·nh·T query rows). */
__device__ inline uint64_t ddp__drop_row_key(const ddp__drop_dev &d, size_t r)
{
    return ddp__rand_u64(d.seed, d.step, d.offset + r);
}

/* Probability j of the row with that key: 1/(1 − p) if kept, else 0. */
__device__ inline float ddp__drop_att(const ddp__drop_dev &d, uint64_t key, int j)
{
    return ddp__rand_u32(key, (uint32_t)j) >= d.thresh32 ? d.scale : 0.0f;
}

#endif /* DDP_KERNELS_CUDA_DROPOUT_CUH */
