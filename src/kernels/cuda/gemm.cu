/*
 * kernels/cuda/gemm.cu — matrix products through cuBLASLt (fp32, TF32 or bf16 inputs, fp32
 * accumulation, the bias epilogue) and the linear layer built on them. Row-major callers, as
 * ddp__sgemm: a row-major product C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so
 * the operands are handed to cuBLAS swapped and nothing is transposed in memory.
 * Not yet: the GELU epilogue, cached algorithm choices (each call asks the heuristic).
 */
#include "common.cuh"

/* Names for messages: the GPU module calls nothing in libddp. */
static const char *dtype_name(ddp_dtype t)
{
    return t == DDP_FLOAT32 ? "float32" : t == DDP_BFLOAT16 ? "bfloat16" : "another dtype";
}

static const char *precision_name(ddp_precision p)
{
    static const char *const names[] = {"fp32", "tf32", "bf16", "fp16"};
    return (unsigned)p < 4 ? names[p] : "?";
}

static cudaDataType_t cuda_type(ddp_dtype t)
{
    return t == DDP_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}

extern "C" ddp_status ddp__cuda_gemm(ddp__cuda_ctx *c, bool trans_a, bool trans_b, int M, int N,
                                     int K, float alpha, const void *A, int lda, const void *B,
                                     int ldb, float beta, void *C, int ldc, ddp_dtype in,
                                     ddp_dtype out, const float *bias, ddp_precision precision,
                                     ddp_error *err)
{
    if ((in != DDP_FLOAT32 && in != DDP_BFLOAT16) || (out != DDP_FLOAT32 && out != DDP_BFLOAT16))
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda gemm: dtypes %s → %s: float32 or "
                              "bfloat16 only", dtype_name(in), dtype_name(out));
    if (M == 0 || N == 0)
        return DDP_OK;
    cublasComputeType_t compute = in == DDP_FLOAT32 && precision == DDP_PRECISION_TF32
                                      ? CUBLAS_COMPUTE_32F_FAST_TF32
                                      : CUBLAS_COMPUTE_32F;
    cublasOperation_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is our B */
    cublasOperation_t opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's B is our A */
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ddp_status st;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t bias_type = CUDA_R_32F;
    size_t ws = c->workspace_bytes;
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
    if (bias &&
        ((st = ddp__cublas_check(cublasLtMatmulDescSetAttribute(desc,
                                                                CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                                &bias, sizeof bias),
                                 "bias pointer", err)) ||
         (st = ddp__cublas_check(
              cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof bias_type),
              "bias type", err))))
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
        (st = ddp__cublas_check(cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, lc, lc, pref,
                                                               1, &heur, &found),
                                "algorithm heuristic", err)))
        goto out_free;
    if (found < 1) {
        st = ddp__cuda_fail(err, DDP_ERR_SYSTEM,
                            "cublasLt: no algorithm for a %d × %d × %d product (%s, %s%s)", M, N,
                            K, dtype_name(in), precision_name(precision),
                            bias ? ", bias" : "");
        goto out_free;
    }
    st = ddp__cublas_check(cublasLtMatmul(c->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                                          &heur.algo, c->workspace, ws, c->stream),
                           "matmul", err);
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
    return st;
}

/* db[c] += Σ_r dy[r, c]: a block of 256 columns × a chunk of 256 rows per thread block, one
 * atomic add per column and chunk. */
__global__ void colsum_kernel(const float *dy, int N, int C, float *db)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * 256, r1 = min(N, r0 + 256);
    float s = 0.0f;
    for (int r = r0; r < r1; r++)
        s += dy[(size_t)r * C + c];
    atomicAdd(&db[c], s);
}

ddp_status ddp__cuda_colsum(ddp__cuda_ctx *c, const float *dy, int N, int C, float *db,
                            ddp_error *err)
{
    if (N <= 0 || C <= 0)
        return DDP_OK;
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
    colsum_kernel<<<grid, 256, 0, c->stream>>>(dy, N, C, db);
    return ddp__cuda_launched("column sum", err);
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
