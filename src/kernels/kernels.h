/*
 * kernels/kernels.h — the compute kernels the layers (src/nn) and the reductions (src/group) are
 * built from, behind one set of signatures. The CPU implementations live in kernels/cpu (OpenBLAS
 * and vectorised loops); CUDA implementations will live in kernels/cuda with the same contracts
 * on device buffers. Names are ddp__ (internal, not part of the public API).
 *
 * Conventions: float32, row-major; dimensions are non-negative ints (OpenBLAS takes int); a
 * dimension of 0 makes a kernel a no-op apart from the beta scaling it documents.
 */
#ifndef DDP_KERNELS_H
#define DDP_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

/* C (M, N) = alpha · op(A) · op(B) + beta · C, row-major, where op(A) is (M, K) — A itself (M, K)
 * with leading dimension lda, or Aᵀ when trans_a, A then stored (K, M) — and op(B) is (K, N)
 * likewise. beta = 0 overwrites C (its old contents, even NaN, are ignored). Borrows every
 * buffer for the call; C must not overlap A or B. Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS).
 */
void ddp__sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif /* DDP_KERNELS_H */
