/*
 * sampler_dump — prints the indices of many sampler configurations, one line each, for
 * test_sampler.py to compare with torch. Reads lines "N W R SHUFFLE SEED EPOCH DROP_LAST EXACT"
 * on stdin and prints "i0 i1 …" (an empty line for none).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ddp/sampler.h"

int main(void)
{
    unsigned long long n, seed, epoch;
    int w, r, shuffle, drop, exact;
    while (scanf("%llu %d %d %d %llu %llu %d %d", &n, &w, &r, &shuffle, &seed, &epoch, &drop,
                 &exact) == 8) {
        ddp_sampler_opts o = DDP_SAMPLER_OPTS_INIT;
        o.dataset_size = n;
        o.num_replicas = w;
        o.rank = r;
        o.shuffle = shuffle;
        o.seed = seed;
        o.drop_last = drop;
        o.mode = exact ? DDP_SAMPLER_EXACT : DDP_SAMPLER_PAD;
        ddp_sampler *s;
        ddp_error err = {0};
        if (ddp_sampler_create(&o, &s, &err) != DDP_OK) {
            fprintf(stderr, "sampler_dump: %s\n", err.msg);
            return 1;
        }
        ddp_sampler_set_epoch(s, epoch);
        const uint64_t *ix = ddp_sampler_indices(s);
        for (size_t i = 0; i < ddp_sampler_len(s); i++)
            printf(i ? " %llu" : "%llu", (unsigned long long)ix[i]);
        printf("\n");
        ddp_sampler_destroy(s);
    }
    return 0;
}
