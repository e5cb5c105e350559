/*
 * hello_world — the smallest ddpc program: every rank joins the job's store, the ranks count
 * themselves with an atomic add, meet at a barrier, and rank 0 reports who came.
 *
 *   ddprun --nproc_per_node=2 ./build/bin/hello_world
 *
 * Run alone (no ddprun) it is a world of one and does the same thing by itself.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp/ddp.h"

int main(void)
{
    ddp_error err = {0};
    ddp_world w;
    if (ddp_world_from_env(&w, &err) != DDP_OK) {
        fprintf(stderr, "hello_world: %s\n", err.msg);
        return 1;
    }
    ddp_store *store;
    if (ddp_store_open_world(&w, 60000, &store, &err) != DDP_OK) {
        fprintf(stderr, "hello_world: rank %d: %s\n", w.rank, err.msg);
        return 1;
    }
    int code = 1;
    char host[256] = "?", key[64], val[320];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    snprintf(key, sizeof key, "hello/%d", w.rank);
    snprintf(val, sizeof val, "pid %d on %s, local rank %d of %d, node %d", (int)getpid(), host,
             w.local_rank, w.local_world_size, w.node_rank);
    int64_t arrived;
    if (ddp_store_set(store, key, val, strlen(val)) != DDP_OK ||
        ddp_store_add(store, "hello/rank_sum", w.rank, NULL) != DDP_OK ||
        ddp_store_add(store, "hello/arrived", 1, &arrived) != DDP_OK ||
        ddp_store_barrier(store, "hello", w.world_size) != DDP_OK)
        goto out;
    if (w.rank == 0) {
        int64_t sum;
        if (ddp_store_add(store, "hello/rank_sum", 0, &sum) != DDP_OK)
            goto out;
        printf("hello from %d rank%s (run %s, attempt %d)\n", w.world_size,
               w.world_size == 1 ? "" : "s", w.run_id, w.restart_count);
        for (int r = 0; r < w.world_size; r++) {
            void *v;
            snprintf(key, sizeof key, "hello/%d", r);
            if (ddp_store_get(store, key, &v, NULL) != DDP_OK)
                goto out;
            printf("  rank %d: %s\n", r, (char *)v);
            free(v);
        }
        int64_t want = (int64_t)w.world_size * (w.world_size - 1) / 2;
        printf("sum of ranks through the store: %lld (expected %lld)\n", (long long)sum,
               (long long)want);
        if (sum != want)
            goto out;
    }
    /* Everyone leaves together, so a rank-0-hosted store outlives its last user. */
    if (ddp_store_barrier(store, "bye", w.world_size) != DDP_OK)
        goto out;
    code = 0;
out:
    if (code)
        fprintf(stderr, "hello_world: rank %d: %s\n", w.rank, ddp_store_last_error(store));
    ddp_store_close(store);
    return code;
}
