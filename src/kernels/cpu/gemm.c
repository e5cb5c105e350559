/*
 * kernels/cpu/gemm.c — matrix products on the CPU through OpenBLAS. The only file in the tree
 * that calls cblas: layers ask for a product in their own terms (kernels.h) and this file maps
 * it onto BLAS. It does not choose threads; OpenBLAS reads OPENBLAS_NUM_THREADS. In a thread set
 * to bf16 products (ddp__gemm_set_kind) the product goes to oneDNN instead (cpu/onednn.c), and
 * back to OpenBLAS in float32 should that fail.
 */
#include <cblas.h>
#include <string.h>

#include "kernels/kernels.h"

void ddp__blas_set_threads(int n)
{
    openblas_set_num_threads(n);
}

void ddp__sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* BLAS leaves C·beta; do the same without reading A or B */
        for (int r = 0; r < M; r++) {
            float *c = C + (size_t)r * ldc;
            if (beta == 0.0f)
                memset(c, 0, sizeof(float) * (size_t)N);
            else
                for (int j = 0; j < N; j++)
                    c[j] *= beta;
        }
        return;
    }
    if (ddp__gemm_get_kind() == DDP__GEMM_BF16 &&
        ddp__gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    if (M == 1) { /* a row times a matrix (generation's one position): a matrix-vector product,
                     which streams B once where sgemm would copy it into its panels first
                     (3× the tokens/s of generation at GPT-2's size; bench/generate.sh) */
        if (beta == 0.0f) /* what beta 0 means here, whatever the BLAS's scal does with NaN */
            memset(C, 0, sizeof(float) * (size_t)N);
        cblas_sgemv(CblasRowMajor, trans_b ? CblasNoTrans : CblasTrans, trans_b ? N : K,
                    trans_b ? K : N, alpha, B, ldb, A, trans_a ? lda : 1, beta, C, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
