/*
 * rng.h — the counter-based generator: a random value is a pure function of (seed, stream,
 * index), so there is no state to carry across ranks, threads, devices or a resume, and element
 * i of a dropout mask, an augmentation draw or a training window (src/nn/layers.c,
 * src/nn/attention.c, src/data/augment.c, src/data/windows.c) is the same wherever it is
 * computed. Usable from C
 * and CUDA (device code included). The values are part of the project's reproducibility
 * contract (checkpoints resume the same masks; tests pin them): do not change the arithmetic.
 *
 * The sampler's MT19937 (torch parity for shuffling) is a different, stateful generator and
 * lives in src/data.
 */
#ifndef DDP_RNG_H
#define DDP_RNG_H

#include <stdint.h>

#include "util/hostdev.h"

/* The splitmix64 finaliser: a bijective 64-bit mixer with good avalanche. */
static inline DDP_HOSTDEV uint64_t ddp__mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, index). Chained mixing, so the three arguments and their
 * permutations give unrelated values. ddp_nn_rand_u64() (public) is this function. */
static inline DDP_HOSTDEV uint64_t ddp__rand_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    return ddp__mix64(ddp__mix64(ddp__mix64(seed) ^ stream) ^ index);
}

/* 32 random bits for element j under a 64-bit key (from ddp__rand_u64): MurmurHash3's 32-bit
 * finaliser (a bijection with full avalanche) of hi(key) ^ (lo(key) + j·0x9e3779b9). Cheaper
 * than a ddp__rand_u64 per element, and 32-bit products vectorise: attention dropout draws one
 * key per row and this per probability. */
static inline DDP_HOSTDEV uint32_t ddp__rand_u32(uint64_t key, uint32_t j)
{
    uint32_t x = (uint32_t)(key >> 32) ^ ((uint32_t)key + j * 0x9e3779b9u);
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    return x ^ (x >> 16);
}

/* A float uniform in [0, 1) from the top 24 bits of r: every value is exact in float32. */
static inline DDP_HOSTDEV float ddp__unit_f32(uint64_t r)
{
    return (float)(r >> 40) * (1.0f / 16777216.0f);
}

#endif /* DDP_RNG_H */
