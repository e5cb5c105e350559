/*
 * tests/emu/selftest_check.h — the emulation's own tests' check (gpu_rt_selftest, cudnn_selftest,
 * overlap_emu): CHECK(c) prints the condition and its line when it is false and counts it in
 * `failures`, the program's exit status; the test goes on to its other checks.
 */
#pragma once
#include <cstdio>

[[maybe_unused]] static int failures = 0;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "FAILED: %s (line %d)\n", #c, __LINE__);                               \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)
