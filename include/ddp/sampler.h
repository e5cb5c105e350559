/*
 * ddp/sampler.h — which samples each rank reads: PyTorch's DistributedSampler, bit for bit.
 *
 * For the same (dataset size, replicas, rank, shuffle, seed, epoch, drop_last) it yields the
 * same indices as torch.utils.data.DistributedSampler: a torch.randperm permutation from an
 * MT19937 generator seeded with seed + epoch, padded by repetition to a multiple of the replicas
 * (or cut, with drop_last), then strided: rank r takes positions r, r + W, r + 2W, ….
 * The evaluation mode (DDP_SAMPLER_EXACT) does better than torch for evaluation: no padding,
 * every sample exactly once across ranks, so metrics summed over ranks are exact; ranks may
 * then get one sample more or less than each other.
 */
#ifndef DDP_SAMPLER_H
#define DDP_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_sampler_mode {
    DDP_SAMPLER_PAD,   /* torch's behaviour: pad by repetition (or drop the tail) */
    DDP_SAMPLER_EXACT, /* every sample once across ranks, no padding (for evaluation) */
} ddp_sampler_mode;

/* Start from DDP_SAMPLER_OPTS_INIT: a struct zeroed by hand has shuffle false. */
typedef struct ddp_sampler_opts {
    uint64_t dataset_size;
    int num_replicas; /* world size */
    int rank;
    bool shuffle;
    uint64_t seed;
    bool drop_last; /* PAD mode only: with EXACT it is DDP_ERR_INVALID (nothing is dropped) */
    ddp_sampler_mode mode;
} ddp_sampler_opts;

#define DDP_SAMPLER_OPTS_INIT                                                                      \
    {                                                                                              \
        0, 1, 0, true, 0, false, DDP_SAMPLER_PAD                                                   \
    }

typedef struct ddp_sampler ddp_sampler;

/* *out written only on DDP_OK; err may be NULL. */
ddp_status ddp_sampler_create(const ddp_sampler_opts *opts, ddp_sampler **out, ddp_error *err);
void ddp_sampler_destroy(ddp_sampler *s); /* NULL is a no-op */

/* Recomputes the order for epoch e (torch's set_epoch). Forgetting it repeats epoch 0's order.
 * A loader over s follows it: its next ddp_loader_next starts epoch e (data.h). */
ddp_status ddp_sampler_set_epoch(ddp_sampler *s, uint64_t epoch);

/* Number of indices this rank gets per epoch (torch: len(sampler)). */
size_t ddp_sampler_len(const ddp_sampler *s);

/* This rank's indices for the current epoch: (ddp_sampler_len,) owned by s, valid until the next
 * set_epoch or destroy. */
const uint64_t *ddp_sampler_indices(const ddp_sampler *s);

/* ---- the generator, exposed for checking against torch ------------------------------------- */

/* MT19937 (the standard 32-bit Mersenne Twister). Plain data. */
typedef struct ddp_mt19937 {
    uint32_t state[624];
    int index;
} ddp_mt19937;

void ddp_mt19937_seed(ddp_mt19937 *g, uint32_t seed);
uint32_t ddp_mt19937_next(ddp_mt19937 *g);

/* torch.randperm(n, generator=g) for a generator seeded with seed: writes 0..n−1 permuted into
 * perm (n elements). Matches torch for n < 2^32 / 20 (its CPU algorithm for such n). */
void ddp_randperm(uint64_t n, uint64_t seed, uint64_t *perm);

#ifdef __cplusplus
}
#endif
#endif /* DDP_SAMPLER_H */
