/*
 * windows.c — nanoGPT's random training windows, made reproducible: where sample j of step s
 * starts depends only on (seed, s, j), so a resumed run draws the same windows as one that never
 * stopped, and N ranks drawing samples rank·B … rank·B+B−1 see exactly the windows one rank
 * drawing all N·B would. No generator state to save.
 */
#include "ddp/data.h"
#include "util/rng.h" /* ddp__mix64, splitmix64's finaliser */

void ddp_lm_window_starts(uint64_t seed, uint64_t step, uint64_t first, size_t n, size_t ntokens,
                          size_t seq_len, uint64_t *starts)
{
    /* starts in [0, ntokens − T − 1], as torch.randint(len − T) does; the modulo bias is below
     * 2^-40 for any file that fits in memory */
    uint64_t range = ntokens > seq_len ? ntokens - seq_len : 1;
    uint64_t key = ddp__mix64(ddp__mix64(seed ^ 0x6c6d77696e646f77ull) + step); /* "lmwindow" */
    for (size_t k = 0; k < n; k++)
        starts[k] = ddp__mix64(key + first + k) % range;
}
