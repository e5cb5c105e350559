/*
 * windows.c — nanoGPT's random training windows, made reproducible: where sample j of step s
 * starts depends only on (seed, s, j), so a resumed run draws the same windows as one that never
 * stopped, and N ranks drawing samples rank·B … rank·B+B−1 see exactly the windows one rank
 * drawing all N·B would. No generator state to save.
 */
#include "ddp/data.h"

/* splitmix64's finaliser over a combined key: a counter-based generator. */
static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ddp_lm_window_starts(uint64_t seed, uint64_t step, uint64_t first, size_t n, size_t ntokens,
                          size_t seq_len, uint64_t *starts)
{
    /* starts in [0, ntokens − T − 1], as torch.randint(len − T) does; the modulo bias is below
     * 2^-40 for any file that fits in memory */
    uint64_t range = ntokens > seq_len ? ntokens - seq_len : 1;
    uint64_t key = mix(mix(seed ^ 0x6c6d77696e646f77ull) + step); /* "lmwindow" */
    for (size_t k = 0; k < n; k++)
        starts[k] = mix(key + first + k) % range;
}
