/*
 * gpu_skip.h — how a GPU test decides whether to run: with no usable GPU (no driver, no device,
 * or a build without CUDA) it prints why and exits with CTest's skip code, 77, unless
 * DDP_REQUIRE_GPU=1 is set (scripts/gpu-check.sh on a GPU machine sets it), when the same
 * finding is a failure: a GPU run must not pass by skipping.
 */
#ifndef DDP_TEST_GPU_SKIP_H
#define DDP_TEST_GPU_SKIP_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#define DDP_TEST_SKIP_CODE 77

/* Returns the number of visible GPUs (≥ 1), or exits: 77 (skip), or 1 under DDP_REQUIRE_GPU=1 or
 * on an unexpected CUDA error. */
static inline int ddp_test_gpus_or_skip(const char *test)
{
    int n = -1;
    ddp_error err = {0};
    ddp_status st = ddp__cuda_device_count(&n, &err);
    if (st == DDP_OK)
        return n;
    const char *req = getenv("DDP_REQUIRE_GPU");
    if (st == DDP_ERR_NOT_FOUND && !(req && !strcmp(req, "1"))) {
        printf("%s skipped: %s\n", test, err.msg);
        exit(n == -1 ? DDP_TEST_SKIP_CODE : 1); /* *n is written only on success */
    }
    printf("%s FAILED: %s%s\n", test, err.msg,
           st == DDP_ERR_NOT_FOUND ? " (DDP_REQUIRE_GPU=1: a GPU is required)" : "");
    exit(1);
}

#endif /* DDP_TEST_GPU_SKIP_H */
