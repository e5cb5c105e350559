/*
 * peak.c — the denominator of MFU: how many FLOPs per second this thread's matrix multiplies
 * reach in the model's precision, measured with the very kernel the models run on (ddp__sgemm:
 * OpenBLAS in float32, oneDNN in bf16). A short probe at a trainer's start, on every rank
 * at once, so that ranks sharing cores measure what they will get while training. It does not
 * look at the CPU's datasheet: a measured peak is what a CPU user can compare against, and on a
 * loaded machine the honest one.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "kernels/kernels.h"
#include "nn/model_int.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

ddp_status ddp_model_measure_peak(double seconds, ddp_precision p, double *flops_per_s,
                                  ddp_error *err)
{
    if (!flops_per_s || !(seconds >= 0.001 && seconds <= 60))
        return ddp__err(err, DDP_ERR_INVALID,
                        "measuring the matmul peak: seconds %g is not within 0.001 … 60 (or no "
                        "output given)",
                        seconds);
    ddp_status pst = ddp_precision_check(DDP_DEVICE_CPU, p, err);
    if (pst != DDP_OK)
        return pst;
    /* A transformer-sized product (a 384-wide layer over 256 rows): large enough for OpenBLAS's
     * blocking to reach its rate, small enough (≈ 0.15 GFLOP) for several timed calls in 50 ms.
     * In bf16, 1024 rows and B untransposed: the float32 → bf16 conversion of the operands, which
     * this product pays on every call, then costs ≈ 3% of it — the peak is the product's, not
     * the conversion's (which the model's step pays, and MFU shows). */
    const bool bf16 = p == DDP_PRECISION_BF16;
    const int M = bf16 ? 1024 : 256, N = 768, K = 384;
    const bool tb = !bf16;
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N),
          *C = malloc(sizeof(float) * (size_t)M * N);
    if (!A || !B || !C) {
        free(A), free(B), free(C);
        return ddp__err(err, DDP_ERR_NOMEM, "measuring the matmul peak: out of memory (%zu KiB)",
                        sizeof(float) * (size_t)(M * K + K * N + M * N) / 1024);
    }
    for (size_t i = 0; i < (size_t)M * K; i++)
        A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++)
        B[i] = (float)(i % 5) * 0.1f;
    ddp__gemm_kind was = ddp__gemm_set_kind(bf16 ? DDP__GEMM_BF16 : DDP__GEMM_FP32);
    const int ldb = tb ? K : N;
    ddp__sgemm(false, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N); /* warm: pages, buffers */
    /* The best single call: the rate when the core is ours, as a training step's GEMMs get it
     * between the moments another process takes the core. */
    double best = 0, t_end = now_s() + seconds;
    int calls = 0;
    do {
        double t0 = now_s();
        ddp__sgemm(false, tb, M, N, K, 1.0f, A, K, B, ldb, 0.0f, C, N);
        double dt = now_s() - t0;
        if (dt > 0 && 2.0 * M * N * K / dt > best)
            best = 2.0 * M * N * K / dt;
        calls++;
    } while (now_s() < t_end || calls < 3);
    ddp__gemm_set_kind(was);
    free(A), free(B), free(C);
    *flops_per_s = best;
    return DDP_OK;
}
