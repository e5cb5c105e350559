/*
 * kernels/cuda/gemm.cu — matrix products through cuBLASLt (fp32, TF32, bf16 or fp16 inputs, fp32
 * accumulation, fp32 or 16-bit output, the bias epilogue) and the linear layer built on them, in
 * fp32/TF32 and in 16 bits (bf16 or fp16 operands, fp32 weight gradients). Row-major callers, as
 * ddp__sgemm: a row-major product C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so
 * the operands are handed to cuBLAS swapped and nothing is transposed in memory.
 * Pointers need only element alignment: the heuristic is told each buffer's (see ddp__cuda_gemm).
 * The 16-bit linear layer passes its bias in the output's format (the weights' 16-bit copy), as
 * cublasLt.h asks of the bias epilogue and torch's autocast does.
 * The MLP's GELU rides on its products where cuBLASLt offers the epilogues (GELU_AUX(_BIAS)
 * forward, DGELU backward), else runs as its own kernel (ddp__cuda_linear_gelu_forward, …).
 * Not yet: cached algorithm choices (each call asks the heuristic).
 */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

extern "C" {
#include "util/half.h"
}

/* Names for messages: the GPU module calls nothing in libddp. */
static const char *dtype_name(ddp_dtype t)
{
    return t == DDP_FLOAT32    ? "float32"
           : t == DDP_BFLOAT16 ? "bfloat16"
           : t == DDP_FLOAT16  ? "float16"
                               : "another dtype";
}

static const char *precision_name(ddp_precision p)
{
    static const char *const names[] = {"fp32", "tf32", "bf16", "fp16"};
    return (unsigned)p < 4 ? names[p] : "?";
}

static cudaDataType_t cuda_type(ddp_dtype t)
{
    return ddp__cuda_type(t);
}

/* C[r, j] += bias[j] over rows × cols of C (row-major, leading dimension ldc; E float32 or a
 * 16-bit format, the bias float32 or C's format): the bias epilogue's work when cuBLASLt cannot
 * take the bias pointer. */
template <typename Bt, typename E>
__global__ void add_bias_kernel(const Bt *bias, int rows, int cols, E *C, int ldc)
{
    size_t total = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols, j = i % cols, at = r * (size_t)ldc + j;
        ddp__st(C + at, ddp__ld(C + at) + ddp__ld(bias + j));
    }
}

/* bias_t: DDP_FLOAT32, or out's 16-bit format. */
static ddp_status add_bias(ddp__cuda_ctx *c, const void *bias, ddp_dtype bias_t, int rows,
                           int cols, void *C, int ldc, ddp_dtype out, ddp_error *err)
{
    size_t total = (size_t)rows * cols;
    unsigned blocks = ddp__cuda_blocks(total, 256);
    if (!ddp__cuda_is_half(out))
        add_bias_kernel<<<blocks, 256, 0, c->stream>>>((const float *)bias, rows, cols, (float *)C,
                                                       ldc);
    else
        ddp__half_dispatch(out, [&](auto e) {
            using E = decltype(e);
            if (bias_t == out)
                add_bias_kernel<<<blocks, 256, 0, c->stream>>>((const E *)bias, rows, cols,
                                                               (E *)C, ldc);
            else
                add_bias_kernel<<<blocks, 256, 0, c->stream>>>((const float *)bias, rows, cols,
                                                               (E *)C, ldc);
        });
    return ddp__cuda_launched("gemm bias", err);
}

/* The product through classic cuBLAS (cublasGemmEx, operands swapped as for cuBLASLt), then the
 * bias pass: for what cuBLASLt has no algorithm for (pointers only element-aligned, an epilogue it
 * does not offer for these types, K = 0). Slower, never wrong. */
static ddp_status gemm_classic(ddp__cuda_ctx *c, cublasOperation_t opa, cublasOperation_t opb,
                               int M, int N, int K, float alpha, const void *A, int lda,
                               const void *B, int ldb, float beta, void *C, int ldc, ddp_dtype in,
                               ddp_dtype out, const void *bias, ddp_dtype bias_t,
                               cublasComputeType_t compute, ddp_precision precision,
                               ddp_error *err)
{
    ddp_error e = {};
    ddp_status st = ddp__cublas_check(cublasGemmEx(c->blas, opa, opb, N, M, K, &alpha, B,
                                                   cuda_type(in), ldb, A, cuda_type(in), lda,
                                                   &beta, C, cuda_type(out), ldc, compute,
                                                   CUBLAS_GEMM_DEFAULT),
                                      "cublasGemmEx", &e);
    if (!st && bias)
        st = add_bias(c, bias, bias_t, M, N, C, ldc, out, &e);
    if (st)
        return ddp__cuda_fail(err, st, "cuda gemm: a %d × %d × %d product (%s, %s%s) without "
                              "cuBLASLt: %s", M, N, K, dtype_name(in),
                              precision_name(precision), bias ? ", bias" : "", e.msg);
    return DDP_OK;
}

/* The GELU epilogues (gemm_lt's gelu): none; forward, D = GELU(A·B + bias) with the GELU's
 * input stored in aux (CUBLASLT_EPILOGUE_GELU_AUX(_BIAS)); backward, D = (A·B) ⊙ GELU'(aux)
 * (CUBLASLT_EPILOGUE_DGELU). aux is laid out as D (leading dimension ldc, D's dtype). */
enum { GELU_NONE = 0, GELU_FWD = 1, GELU_BWD = 2 };

/* ddp__cuda_gemm with the bias of dtype bias_t: float32, or (a 16-bit output) the output's
 * format, which is what cublasLt.h says the bias epilogue takes (bias elements of D's type), as
 * torch's autocast linear passes it; and with gelu, a GELU epilogue (above; beta 0). A GELU
 * epilogue cuBLASLt does not offer here (no algorithm, an unaligned bias or aux, ldc not a
 * multiple of 8, refused at the call) returns DDP_ERR_NOT_FOUND with nothing done and err
 * untouched: the caller then runs the product and the GELU kernel apart. */
static ddp_status gemm_lt(ddp__cuda_ctx *c, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                          void *C, int ldc, ddp_dtype in, ddp_dtype out, const void *bias,
                          ddp_dtype bias_t, int gelu, const void *aux, ddp_precision precision,
                          ddp_error *err)
{
    if ((in != DDP_FLOAT32 && !ddp__cuda_is_half(in)) || (out != DDP_FLOAT32 && out != in))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda gemm: dtypes %s → %s: float32, bfloat16 or float16 in, "
                              "float32 or the input's dtype out",
                              dtype_name(in), dtype_name(out));
    if (bias && bias_t != DDP_FLOAT32 && bias_t != out)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda gemm: a %s bias: float32, or the output's dtype (%s)",
                              dtype_name(bias_t), dtype_name(out));
    if (M == 0 || N == 0)
        return DDP_OK;
    /* what the GELU epilogues need: an epilogue-aligned bias (the bias must come before the
     * GELU), aux 16-byte aligned with a leading dimension divisible by 8, K > 0 */
    if (gelu != GELU_NONE &&
        (K == 0 || beta != 0.0f || (bias && !ddp__cuda_bias_epilogue_ok(bias)) ||
         (gelu == GELU_BWD && bias) || ldc % 8 != 0 || ddp__cuda_align_of(aux) < 16))
        return DDP_ERR_NOT_FOUND;
    cublasComputeType_t compute = in == DDP_FLOAT32 && precision == DDP_PRECISION_TF32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F;
    cublasOperation_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is our B */
    cublasOperation_t opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B is our A */
    if (K == 0) /* C = beta · C (+ bias): no cuBLASLt layout has zero columns */
        return gemm_classic(c, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, in, out,
                            bias, bias_t, compute, precision, err);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ddp_status st;
    /* A bias that is not 16-byte aligned (a view into a flat buffer) is added by a pass of its
     * own after the product: cuBLASLt's epilogue loads it in vectors. */
    bool bias_epi = bias && ddp__cuda_bias_epilogue_ok(bias);
    cublasLtEpilogue_t epi = bias_epi ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (gelu == GELU_FWD)
        epi = bias_epi ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (gelu == GELU_BWD)
        epi = CUBLASLT_EPILOGUE_DGELU;
    const int64_t aux_ld = ldc;
    bool refused = false; /* a GELU epilogue cuBLASLt does not offer: DDP_ERR_NOT_FOUND */
    cudaDataType_t bias_type = cuda_type(bias_t);
    size_t ws = c->workspace_bytes;
    /* The heuristic assumes 256-byte aligned buffers unless told otherwise, and may then pick a
     * kernel that refuses or faults on these pointers (views into the GPT's flat parameters, a
     * row offset): it is told each one's real alignment. cuBLAS's A is our B, and B our A. */
    uint32_t align_a = ddp__cuda_align_of(B), align_b = ddp__cuda_align_of(A),
             align_c = ddp__cuda_align_of(C);
    /* Split-K parts added in fp32 (in the workspace), never in a 16-bit output's type (the
     * in-place and output-type schemes): the products accumulate in fp32 throughout. */
    uint32_t reduction = out == DDP_FLOAT32 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK
                                            : (uint32_t)(CUBLASLT_REDUCTION_SCHEME_NONE |
                                                         CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    /* Stored shapes, column-major: cuBLAS's A (our B) is (N, K) untransposed, (K, N) stored
     * when transposed; cuBLAS's B (our A) is (K, M), or (M, K) stored. */
    if ((st = ddp__cublas_check(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F),
                                "matmul descriptor", err)) ||
        (st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &opa, sizeof opa),
                                "transa", err)) ||
        (st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &opb, sizeof opb),
                                "transb", err)) ||
        (st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(
                                    desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                                "epilogue", err)))
        goto out_free;
    if (bias_epi &&
        ((st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(desc,
                                                                CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                                &bias, sizeof bias),
                                 "bias pointer", err)) ||
         (st = ddp__cublas_check(
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof bias_type),
              "bias type", err))))
        goto out_free;
    if (gelu != GELU_NONE &&
        ((st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(
                                     desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                     sizeof aux),
                                 "GELU aux pointer", err)) ||
         (st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(
                                     desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                     sizeof aux_ld),
                                 "GELU aux leading dimension", err))))
        goto out_free;
    if ((st = ddp__cublas_check(cublasLtMatrixLayoutCreate(&la, cuda_type(in), trans_b ? K : N,
                                                           trans_b ? N : K, ldb),
                                "layout of B", err)) ||
        (st = ddp__cublas_check(cublasLtMatrixLayoutCreate(&lb, cuda_type(in), trans_a ? M : K,
                                                           trans_a ? K : M, lda),
                                "layout of A", err)) ||
        (st = ddp__cublas_check(cublasLtMatrixLayoutCreate(&lc, cuda_type(out), N, M, ldc),
                                "layout of C", err)) ||
        (st = ddp__cublas_check(cublasLtMatmulPreferenceCreate(&pref), "preference", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws),
             "workspace preference", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &align_a, sizeof align_a),
             "alignment preference of B", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &align_b, sizeof align_b),
             "alignment preference of A", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &align_c, sizeof align_c),
             "alignment preference of C", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &align_c, sizeof align_c),
             "alignment preference of D", err)) ||
        (st = ddp__cublas_check(
             cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                  &reduction, sizeof reduction),
             "reduction-scheme preference", err)))
        goto out_free;
    /* NOT_SUPPORTED is the heuristic's "nothing found" (found 0). Nothing for the bias epilogue
     * (an fp32 bias with a bf16 output may be such a case): the product without it, then the
     * bias pass; nothing at all: the fallback below. */
    for (int attempt = 0; attempt < 2 && found < 1; attempt++) {
        if (attempt == 1) {
            const void *no_bias = NULL;
            if (!bias_epi || gelu != GELU_NONE) /* a GELU epilogue is all or nothing */
                break;
            bias_epi = false;
            epi = CUBLASLT_EPILOGUE_DEFAULT;
            if ((st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(
                                            desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                                        "epilogue", err)) ||
                (st = ddp__cublas_check(
                     cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &no_bias, sizeof no_bias),
                     "bias pointer", err)))
                goto out_free;
        }
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, lc, lc, pref, 1,
                                                           &heur, &found);
        /* cublasLt.h gives the bias D's type except for IMMA and fp8 kernels: an fp32 bias on a
         * 16-bit output may be refused as INVALID_VALUE rather than NOT_SUPPORTED. Any refusal
         * of the bias epilogue means the next attempt, without it. */
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED ||
            (hs != CUBLAS_STATUS_SUCCESS && (bias_epi || gelu != GELU_NONE)))
            found = 0;
        else if ((st = ddp__cublas_check(hs, "algorithm heuristic", err)))
            goto out_free;
    }
    if (found < 1 && gelu != GELU_NONE) {
        refused = true;
        goto out_free;
    }
    if (found >= 1) {
        cublasStatus_t ms = cublasLtMatmul(c->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                                           &heur.algo, c->workspace, ws, c->stream);
        if (gelu != GELU_NONE &&
            (ms == CUBLAS_STATUS_NOT_SUPPORTED || ms == CUBLAS_STATUS_INVALID_VALUE)) {
            refused = true; /* refused before any work */
            goto out_free;
        }
        /* refused before any work (the bias epilogue's type, as above): the fallback below */
        if (ms == CUBLAS_STATUS_NOT_SUPPORTED || (ms == CUBLAS_STATUS_INVALID_VALUE && bias_epi))
            st = gemm_classic(c, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, in, out,
                              bias, bias_t, compute, precision, err);
        else if (!(st = ddp__cublas_check(ms, "matmul", err)) && bias && !bias_epi)
            st = add_bias(c, bias, bias_t, M, N, C, ldc, out, err);
    } else {
        st = gemm_classic(c, opa, opb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, in, out, bias,
                          bias_t, compute, precision, err);
    }
out_free:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return refused ? DDP_ERR_NOT_FOUND : st;
}

static ddp_status gemm_bias(ddp__cuda_ctx *c, bool trans_a, bool trans_b, int M, int N, int K,
                            float alpha, const void *A, int lda, const void *B, int ldb,
                            float beta, void *C, int ldc, ddp_dtype in, ddp_dtype out,
                            const void *bias, ddp_dtype bias_t, ddp_precision precision,
                            ddp_error *err)
{
    return gemm_lt(c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, in, out,
                   bias, bias_t, GELU_NONE, NULL, precision, err);
}

extern "C" ddp_status ddp__cuda_gemm(ddp__cuda_ctx *c, bool trans_a, bool trans_b, int M, int N,
                                     int K, float alpha, const void *A, int lda, const void *B,
                                     int ldb, float beta, void *C, int ldc, ddp_dtype in,
                                     ddp_dtype out, const float *bias, ddp_precision precision,
                                     ddp_error *err)
{
    return gemm_bias(c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, in, out,
                     bias, DDP_FLOAT32, precision, err);
}

/* db[c] += Σ_r dy[r, c]: a block of 256 columns × a chunk of 256 rows per thread block, one
 * atomic add per column and chunk; dy fp32 or 16-bit, the sum in fp32. */
template <typename E> __global__ void colsum_kernel(const E *dy, int N, int C, float *db)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * 256, r1 = min(N, r0 + 256);
    float s = 0.0f;
    for (int r = r0; r < r1; r++)
        s += ddp__ld(dy + (size_t)r * C + c);
    atomicAdd(&db[c], s);
}

ddp_status ddp__cuda_colsum(ddp__cuda_ctx *c, const float *dy, int N, int C, float *db,
                            ddp_error *err)
{
    if (N <= 0 || C <= 0)
        return DDP_OK;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
    colsum_kernel<float><<<grid, 256, 0, c->stream>>>(dy, N, C, db);
    return ddp__cuda_launched("column sum", err);
}

ddp_status ddp__cuda_colsum_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *dy, int N, int C,
                              float *db, ddp_error *err)
{
    if (N <= 0 || C <= 0)
        return DDP_OK;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
    if (ht == DDP_FLOAT16)
        colsum_kernel<<<grid, 256, 0, c->stream>>>((const ddp__fp16 *)dy, N, C, db);
    else
        colsum_kernel<<<grid, 256, 0, c->stream>>>((const ddp__bf16 *)dy, N, C, db);
    return ddp__cuda_launched("column sum (16-bit)", err);
}

extern "C" ddp_status ddp__cuda_linear_forward(ddp__cuda_ctx *c, const float *x, const float *W,
                                               const float *b, int B, int in, int out, float *y,
                                               ddp_precision precision, ddp_error *err)
{
    return ddp__cuda_gemm(c, false, true, B, out, in, 1.0f, x, in, W, in, 0.0f, y, out,
                          DDP_FLOAT32, DDP_FLOAT32, b, precision, err);
}

extern "C" ddp_status ddp__cuda_linear_backward(ddp__cuda_ctx *c, const float *dy, const float *x,
                                                const float *W, int B, int in, int out, float *dx,
                                                float *dW, float *db, ddp_precision precision,
                                                ddp_error *err)
{
    ddp_status st = DDP_OK;
    if (dx)
        st = ddp__cuda_gemm(c, false, false, B, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in,
                            DDP_FLOAT32, DDP_FLOAT32, NULL, precision, err);
    if (!st && dW)
        st = ddp__cuda_gemm(c, true, false, out, in, B, 1.0f, dy, out, x, in, 1.0f, dW, in,
                            DDP_FLOAT32, DDP_FLOAT32, NULL, precision, err);
    if (!st && db)
        st = ddp__cuda_colsum(c, dy, B, out, db, err);
    return st;
}

extern "C" ddp_status ddp__cuda_linear_forward_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *x,
                                                 const uint16_t *W, const uint16_t *b, int B,
                                                 int in, int out, uint16_t *y, ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "linear forward", err);
    if (st)
        return st;
    return gemm_bias(c, false, true, B, out, in, 1.0f, x, in, W, in, 0.0f, y, out, ht, ht, b, ht,
                     ht == DDP_FLOAT16 ? DDP_PRECISION_FP16 : DDP_PRECISION_BF16, err);
}

extern "C" ddp_status ddp__cuda_linear_backward_h(ddp__cuda_ctx *c, ddp_dtype ht,
                                                  const uint16_t *dy, const uint16_t *x,
                                                  const uint16_t *W, int B, int in, int out,
                                                  void *dx, ddp_dtype dx_dtype, float *dW,
                                                  float *db, ddp_error *err)
{
    const ddp_precision pr = ht == DDP_FLOAT16 ? DDP_PRECISION_FP16 : DDP_PRECISION_BF16;
    ddp_status st = ddp__cuda_half_check(ht, "linear backward", err);
    if (!st && dx)
        st = ddp__cuda_gemm(c, false, false, B, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in, ht,
                            dx_dtype, NULL, pr, err);
    if (!st && dW)
        st = ddp__cuda_gemm(c, true, false, out, in, B, 1.0f, dy, out, x, in, 1.0f, dW, in, ht,
                            DDP_FLOAT32, NULL, pr, err);
    if (!st && db)
        st = ddp__cuda_colsum_h(c, ht, dy, B, out, db, err);
    return st;
}

/* ---- the MLP's GELU fused into its products (cuBLASLt's GELU epilogues, tanh GELU as GPT-2's)
 */

/* Whether the GELU epilogues are used: yes unless DDP_CUDA_GELU_EPILOGUE=0 (a benchmark's A/B,
 * or a way round a cuBLASLt that gets them wrong); read once. */
static bool gelu_epilogue_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DDP_CUDA_GELU_EPILOGUE");
        on = !(v && !strcmp(v, "0"));
    }
    return on != 0;
}

static ddp_precision t_precision(ddp_dtype t, ddp_precision fp32_precision)
{
    return t == DDP_BFLOAT16  ? DDP_PRECISION_BF16
           : t == DDP_FLOAT16 ? DDP_PRECISION_FP16
                              : fp32_precision;
}

extern "C" ddp_status ddp__cuda_linear_gelu_forward(ddp__cuda_ctx *c, ddp_dtype t, const void *x,
                                                    const void *W, const void *b, int B, int in,
                                                    int out, void *pre, void *y,
                                                    ddp_precision precision, ddp_error *err)
{
    const bool h = ddp__cuda_is_half(t);
    if (!h && t != DDP_FLOAT32)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda linear+gelu: dtype %s", dtype_name(t));
    const ddp_precision pr = t_precision(t, precision);
    const ddp_dtype bt = h ? t : DDP_FLOAT32;
    ddp_status st = DDP_ERR_NOT_FOUND;
    if (gelu_epilogue_on())
        st = gemm_lt(c, false, true, B, out, in, 1.0f, x, in, W, in, 0.0f, y, out, t, t, b, bt,
                     GELU_FWD, pre, pr, err);
    if (st != DDP_ERR_NOT_FOUND)
        return st;
    /* apart: the product (and bias) into pre, then the GELU */
    const size_t n = (size_t)B * out;
    if ((st = gemm_bias(c, false, true, B, out, in, 1.0f, x, in, W, in, 0.0f, pre, out, t, t, b,
                        bt, pr, err)))
        return st;
    return h ? ddp__cuda_gelu_forward_h(c, t, (const uint16_t *)pre, n, (uint16_t *)y, err)
             : ddp__cuda_gelu_forward(c, (const float *)pre, n, (float *)y, err);
}

extern "C" ddp_status ddp__cuda_linear_dgelu_backward(ddp__cuda_ctx *c, ddp_dtype t,
                                                      const void *dy, const void *W,
                                                      const void *pre, int B, int in, int out,
                                                      void *dpre, ddp_precision precision,
                                                      ddp_error *err)
{
    const bool h = ddp__cuda_is_half(t);
    if (!h && t != DDP_FLOAT32)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda linear+dgelu: dtype %s",
                              dtype_name(t));
    const ddp_precision pr = t_precision(t, precision);
    ddp_status st = DDP_ERR_NOT_FOUND;
    if (gelu_epilogue_on())
        st = gemm_lt(c, false, false, B, in, out, 1.0f, dy, out, W, in, 0.0f, dpre, in, t, t, NULL,
                     DDP_FLOAT32, GELU_BWD, pre, pr, err);
    if (st != DDP_ERR_NOT_FOUND)
        return st;
    const size_t n = (size_t)B * in;
    if ((st = gemm_bias(c, false, false, B, in, out, 1.0f, dy, out, W, in, 0.0f, dpre, in, t, t,
                        NULL, DDP_FLOAT32, pr, err)))
        return st;
    return h ? ddp__cuda_gelu_backward_h(c, t, (const uint16_t *)dpre, (const uint16_t *)pre, n,
                                         (uint16_t *)dpre, err)
             : ddp__cuda_gelu_backward(c, (const float *)dpre, (const float *)pre, n,
                                       (float *)dpre, err);
}
