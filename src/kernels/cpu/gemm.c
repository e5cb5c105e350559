/*
 * kernels/cpu/gemm.c — matrix products on the CPU through OpenBLAS. The only file in the tree
 * that calls cblas: layers ask for a product in their own terms (kernels.h) and this file maps
 * it onto BLAS. It does not choose threads; OpenBLAS reads OPENBLAS_NUM_THREADS. In a thread set
 * to bf16 products (ddp__gemm_set_kind) the product goes to oneDNN instead (cpu/onednn.c), and
 * back to OpenBLAS in float32 should that fail. Where OpenBLAS could not map its buffers it is
 * not called at all (blas_has_room: it would wait forever), and a plain loop computes the product.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "kernels/kernels.h"

void ddp__blas_set_threads(int n)
{
    openblas_set_num_threads(n);
}

/* OpenBLAS (0.3.21) takes a buffer of 128 MiB for each thread of a product from a pool that it
 * fills on first use, and retries an allocation that fails without end (blas_memory_alloc): under
 * an address-space limit (ulimit -v, which some clusters set) that the program's own data, model
 * and shm segment had filled, the first product waited forever, and the program with it (ddptrain
 * under ulimit -v 340000 with the shm backend, found 2026-11-26: its start-up check had seen the
 * room, before the data took it). So until a product has gone through OpenBLAS, each first asks
 * whether every BLAS thread's buffer would fit, by mapping that much (address space only: the
 * pages are never touched) and unmapping it; where they would not, the product is computed by
 * plain_sgemm instead — right, and much slower — said once on stderr, and the next product asks
 * again. Once an sgemm has gone through, the pool holds every thread's buffer (OpenBLAS maps them
 * all at the first, even 2 × 2; an sgemv may map only its caller's) and no product asks again
 * (the question costs ~6 µs, a small product's time). Left open: another thread that takes the
 * room between the question and OpenBLAS's own mapping. */
#define BLAS_BUFFER_BYTES ((size_t)129 << 20) /* 128 MiB, its guard page, and malloc's header */
static atomic_bool blas_ready;
static atomic_flag blas_said = ATOMIC_FLAG_INIT;

static bool blas_has_room(void)
{
    if (atomic_load_explicit(&blas_ready, memory_order_acquire))
        return true;
    int threads = openblas_get_num_threads();
    if (threads < 1)
        threads = 1;
    size_t n = (size_t)threads * BLAS_BUFFER_BYTES;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        munmap(p, n);
        return true;
    }
    if (!atomic_flag_test_and_set(&blas_said)) {
        struct rlimit r;
        char lim[64] = "";
        if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
            snprintf(lim, sizeof lim, " under the address-space limit (ulimit -v: %llu MiB)",
                     (unsigned long long)(r.rlim_cur >> 20));
        fprintf(stderr,
                "ddp: no room to map the BLAS's buffers (%zu MiB: 128 MiB for each of its %d "
                "thread%s)%s, where OpenBLAS would wait forever: matrix products run in a plain "
                "loop instead, right but much slower, until there is room; HINT: raise the limit "
                "(ulimit -v unlimited, or a few GiB) or free memory\n",
                n >> 20, threads, threads == 1 ? "" : "s", lim);
    }
    return false;
}

/* C = alpha·op(A)·op(B) + beta·C by loops (ddp__sgemm's contract): only where OpenBLAS cannot
 * run. Rows of C are scaled first, then op(B)'s rows added into them (B untransposed: both rows
 * read in order) or each element a dot product (B transposed: op(A)'s row and B's row in order
 * when A is not transposed). */
static void plain_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float *A, int lda, const float *B, int ldb, float beta, float *C,
                        int ldc)
{
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        if (trans_b) {
            for (int j = 0; j < N; j++) {
                const float *b = B + (size_t)j * ldb;
                float s = 0.0f;
                for (int k = 0; k < K; k++)
                    s += (trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) * b[k];
                c[j] = alpha * s + (beta == 0.0f ? 0.0f : beta * c[j]);
            }
            continue;
        }
        for (int j = 0; j < N; j++) /* beta 0 ignores what C held, NaN included (as BLAS) */
            c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int k = 0; k < K; k++) {
            float a = alpha * (trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
            const float *b = B + (size_t)k * ldb;
            for (int j = 0; j < N; j++)
                c[j] += a * b[j];
        }
    }
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
    if (!blas_has_room()) {
        plain_sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
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
    atomic_store_explicit(&blas_ready, true, memory_order_release);
}
