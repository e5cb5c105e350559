/*
 * gathermisuse — a sharded reducer's gather called on one rank while its step is under way
 * (mark_ready called, finish not yet), under ddprun with 2 or more ranks: the last rank marks one
 * gradient (which completes no bucket), then calls gather (argv[1]: "params" for
 * ddp_reducer_gather_params, "state" for ddp_reducer_gather_state), while the others, between
 * steps, call the same gather. Until 2026-11-25 gather_state returned an error at once on the
 * misusing rank while the others waited in its collective for their whole deadline (30 min by
 * default; 5 s here, which the test counts as a failure), and gather_params said DDP_OK on every
 * rank, its allgather run with a step half-done. The misusing rank here stays 6 s before it
 * ends, so that its group's destroy is not what tells the others. Now every rank fails at once
 * (within 3 s): the misusing one with a message that says what to do, the others naming it (it
 * aborted the group). Exit 0 when every rank saw what it should, 1 otherwise.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp/ddp.h"

int main(int argc, char **argv)
{
    bool params = argc > 1 && !strcmp(argv[1], "params");
    ddp_error err = {0};
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.timeout_ms = 5000;
    ddp_group *g;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "gathermisuse: %s\n", err.msg);
        return 1;
    }
    int W = ddp_group_size(g), R = ddp_group_rank(g);
    float a[64], b[64], sa[64], sb[64];
    for (int k = 0; k < 64; k++)
        a[k] = b[k] = sa[k] = sb[k] = (float)k;
    ddp_param ps[2] = {{"a", 64, DDP_FLOAT32, a, DDP_DEVICE_CPU},
                       {"b", 64, DDP_FLOAT32, b, DDP_DEVICE_CPU}};
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    ro.shard_optimizer = true;
    ro.overlap = DDP_OVERLAP_INLINE;
    ddp_reducer *red;
    if (ddp_reducer_create(g, ps, 2, NULL, 0, &ro, &red, &err) != DDP_OK) {
        fprintf(stderr, "gathermisuse rank %d: %s\n", R, err.msg);
        ddp_group_destroy(g);
        return 1;
    }
    bool misuser = R == W - 1;
    ddp_reducer_zero_grad(red);
    if (misuser && ddp_reducer_mark_ready(red, 0) != DDP_OK) { /* "b" still pending: no bucket */
        fprintf(stderr, "gathermisuse rank %d: mark_ready: %s\n", R, ddp_reducer_last_error(red));
        return 1;
    }
    void *const state[2] = {sa, sb};
    double t0 = ddp_now_seconds();
    ddp_status st = params ? ddp_reducer_gather_params(red) : ddp_reducer_gather_state(red, state);
    double took = ddp_now_seconds() - t0;
    const char *msg = ddp_reducer_last_error(red);
    printf("gathermisuse rank %d: %s after %.1f s: %s\n", R, ddp_status_str(st), took, msg);
    int rc = 0;
    if (st == DDP_OK || took > 3) {
        fprintf(stderr, "gathermisuse rank %d: want a failure within 3 s\n", R);
        rc = 1;
    } else if (misuser && !strstr(msg, "a step is under way")) {
        fprintf(stderr, "gathermisuse rank %d: the message does not say a step is under way\n", R);
        rc = 1;
    } else if (!misuser && !strstr(msg, "a step is under way on rank")) {
        fprintf(stderr, "gathermisuse rank %d: the message does not name the misusing rank\n", R);
        rc = 1;
    }
    /* The misusing rank goes on a while before it ends (a program that logs the failure, or
     * saves what it can): its group's destroy must not be what tells the others. */
    if (misuser)
        sleep(6);
    ddp_reducer_destroy(red);
    ddp_group_destroy(g);
    return rc;
}
