/*
 * kernels/cpu/threads.c — ddp_world_default_threads (ddp/world.h): the BLAS's and OpenMP's
 * threads for a rank that shares its host. Beside the GEMM, not in util.c: a program that uses
 * the world and the store but never multiplies (ddprun) then links no OpenBLAS — which, loaded,
 * starts a thread that under an address-space limit (ulimit -v) retried a failed mmap forever,
 * and ddprun's fork waited for it (2026-11-26).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ddp/world.h"
#include "kernels/kernels.h"

int ddp_world_default_threads(const ddp_world *w)
{
    const char *omp = getenv("OMP_NUM_THREADS"), *blas = getenv("OPENBLAS_NUM_THREADS");
    if (!w || w->local_world_size < 2 || (omp && *omp) || (blas && *blas))
        return 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int own = ddp_own_cores();
    int share = online > 0 ? (int)(online / w->local_world_size) : 1;
    int n = own < share ? own : share;
    if (n < 1)
        n = 1;
    char v[16];
    snprintf(v, sizeof v, "%d", n);
    setenv("OMP_NUM_THREADS", v, 1);
    ddp__blas_set_threads(n);
    return n;
}
