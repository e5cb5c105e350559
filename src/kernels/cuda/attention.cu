/*
 * kernels/cuda/attention.cu — causal self-attention the first way: q, k, v permuted to
 * (B, nh, T, hs), the scores of every head by one strided-batched GEMM, a causal softmax that
 * keeps the probabilities (B, nh, T, T) for the backward, and one more batched GEMM for the
 * output. The backward is four batched GEMMs and the softmax's backward. O(T²) memory per layer:
 * a fused flash-style kernel is the speed step after this (docs/gpu.md). Dropout on the
 * probabilities (drop->p > 0) with the CPU's masks (dropout.cuh): the forward multiplies P·V
 * with the dropped probabilities, made in scratch; the backward makes them again for dV, then
 * masks dP inside the softmax's backward; att keeps P before dropout, which that needs.
 * The 16-bit variant (precision bf16 or fp16, one template): q, k, v, the heads' output and every
 * gradient feeding a product in 16 bits; the scores and dP in fp32 (16-bit-in, fp32-out
 * products) for the softmax and its backward, which run in fp32 (so fp16's range never limits
 * the scores); the probabilities kept in 16 bits (the P·V operand, and the backward's P). Its
 * scratch is in bytes, each region 256-byte aligned.
 */
#include "common.cuh"
#include "dropout.cuh"

/* Element i of a (B, nh, T, hs) tensor, i.e. (b, h, t, d), as an offset into rows of `row`
 * floats laid out (B, T, row) with head h's channels at h·hs + d. */
__device__ static size_t head_major_to_rows(size_t i, int T, int hs, int nh, size_t row)
{
    int d = (int)(i % hs);
    size_t r = i / hs;
    int t = (int)(r % T);
    r /= T;
    int h = (int)(r % nh);
    size_t b = r / nh;
    return (b * T + t) * row + (size_t)h * hs + d;
}

/* qkv (B, T, 3C) → q, k, v (B, nh, T, hs) each, or back (dir −1: q, k, v → qkv); E float or
 * a 16-bit format (a plain copy either way). */
template <typename E>
__global__ void permute_qkv(E *qkv, E *q, E *k, E *v, int B, int T, int C, int nh, int dir)
{
    int hs = C / nh;
    size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t src = head_major_to_rows(i, T, hs, nh, 3 * (size_t)C);
        if (dir > 0) {
            q[i] = qkv[src];
            k[i] = qkv[src + C];
            v[i] = qkv[src + 2 * (size_t)C];
        } else {
            qkv[src] = q[i];
            qkv[src + C] = k[i];
            qkv[src + 2 * (size_t)C] = v[i];
        }
    }
}

/* y (B, nh, T, hs) ↔ out (B, T, C): dir 1 gathers heads into out, −1 scatters out into heads. */
template <typename E>
__global__ void permute_heads(E *y, E *out, int B, int T, int C, int nh, int dir)
{
    int hs = C / nh;
    size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t o = head_major_to_rows(i, T, hs, nh, (size_t)C);
        if (dir > 0)
            out[o] = y[i];
        else
            y[i] = out[o];
    }
}

/* Row t of each (T, T) score matrix: softmax over j ≤ t, 0 beyond. One warp per row, rows
 * strided over the grid (ddp__cuda_blocks caps it: B·nh·T can pass 8 Mi rows); the row is the
 * same across a warp, so the full-mask shuffles see all 32 lanes. */
__global__ void causal_softmax(float *att, size_t rows, int T)
{
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        int t = (int)(row % T);
        float *a = att + row * T;
        float mx = -INFINITY;
        for (int j = lane; j <= t; j += 32)
            mx = fmaxf(mx, a[j]);
        mx = ddp__warp_max(mx);
        float s = 0.0f;
        for (int j = lane; j <= t; j += 32)
            s += expf(a[j] - mx);
        s = ddp__warp_sum(s);
        for (int j = lane; j < T; j += 32)
            a[j] = j <= t ? expf(a[j] - mx) / s : 0.0f;
    }
}

/* With dropout: pd = the probabilities att with row r's mask applied (dropout.cuh), 0 above the
 * diagonal; E float or a 16-bit format (rounded once after the scaling). Rows as above. */
template <typename E>
__global__ void causal_dropout(const E *att, E *pd, size_t rows, int T, ddp__drop_dev dr)
{
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        int t = (int)(row % T);
        const uint64_t key = ddp__drop_row_key(dr, row);
        const E *p = att + row * T;
        E *o = pd + row * T;
        for (int j = lane; j < T; j += 32)
            ddp__st(o + j, j <= t ? ddp__ld(p + j) * ddp__drop_att(dr, key, j) : 0.0f);
    }
}

/* dS = P ⊙ (dP' − Σ_j P·dP') · scale from the kept P (16 bits, or fp32 with H float) and fp32
 * dP, where dP' = dP and, with dropout (dr.on), dP masked and scaled as the forward's
 * probabilities were (the gradient of the dropped probabilities; written back into dp), in
 * fp32, rounded once into ds (0 above the diagonal); with H float ds may be dp (in place: each
 * lane reads and writes only its own elements). Rows as causal_softmax. */
template <typename H>
__global__ void causal_softmax_bwd_h(const H *att, float *dp, H *ds, size_t rows, int T,
                                     float scale, ddp__drop_dev dr)
{
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        int t = (int)(row % T);
        const uint64_t key = dr.on ? ddp__drop_row_key(dr, row) : 0;
        const H *p = att + row * T;
        float *d = dp + row * T;
        H *o = ds + row * T;
        float s = 0.0f;
        for (int j = lane; j <= t; j += 32) {
            if (dr.on)
                d[j] *= ddp__drop_att(dr, key, j);
            s += ddp__ld(p + j) * d[j];
        }
        s = ddp__warp_sum(s);
        for (int j = lane; j < T; j += 32)
            ddp__st(o + j, j <= t ? ddp__ld(p + j) * (d[j] - s) * scale : 0.0f);
    }
}

/* Row-major strided-batched C = alpha · op(A) · op(B) + beta · C (operands swapped for
 * column-major cuBLAS, as gemm.cu); A and B of type ab, C of type ct, fp32 accumulation. */
static ddp_status bgemm_typed(ddp__cuda_ctx *c, bool ta, bool tb, int M, int N, int K, float alpha,
                              const void *A, int lda, long long sa, const void *B, int ldb,
                              long long sb, float beta, void *C, int ldc, long long sc, int batch,
                              cudaDataType_t ab, cudaDataType_t ct, cublasComputeType_t compute,
                              ddp_error *err)
{
    return ddp__cublas_check(cublasGemmStridedBatchedEx(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                        ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                                        &alpha, B, ab, ldb, sb, A, ab, lda, sa,
                                                        &beta, C, ct, ldc, sc, batch, compute,
                                                        CUBLAS_GEMM_DEFAULT),
                             ab == CUDA_R_16BF  ? "strided-batched gemm (bf16)"
                             : ab == CUDA_R_16F ? "strided-batched gemm (fp16)"
                                                : "strided-batched gemm",
                             err);
}

/* 16-bit operands of dtype ht; C of ht (out_h) or fp32. */
static ddp_status bgemm_h(ddp__cuda_ctx *c, ddp_dtype ht, bool ta, bool tb, int M, int N, int K,
                          float alpha, const void *A, int lda, long long sa, const void *B, int ldb,
                          long long sb, void *C, int ldc, long long sc, int batch, bool out_h,
                          ddp_error *err)
{
    cudaDataType_t t = ddp__cuda_type(ht);
    return bgemm_typed(c, ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, 0.0f, C, ldc, sc, batch,
                       t, out_h ? t : CUDA_R_32F, CUBLAS_COMPUTE_32F, err);
}

static ddp_status bgemm(ddp__cuda_ctx *c, bool ta, bool tb, int M, int N, int K, float alpha,
                        const float *A, int lda, long long sa, const float *B, int ldb,
                        long long sb, float beta, float *C, int ldc, long long sc, int batch,
                        ddp_precision precision, ddp_error *err)
{
    cublasComputeType_t compute =
        precision == DDP_PRECISION_FP32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    return ddp__cublas_check(
        cublasGemmStridedBatchedEx(c->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F,
                                   ldb, sb, A, CUDA_R_32F, lda, sa, &beta, C, CUDA_R_32F, ldc, sc,
                                   batch, compute, CUBLAS_GEMM_DEFAULT),
        "strided-batched gemm", err);
}

extern "C" size_t ddp__cuda_attention_scratch(int B, int T, int C, int nh)
{
    return 7 * (size_t)B * T * C + (size_t)B * nh * T * T;
}

extern "C" ddp_status ddp__cuda_attention_forward(ddp__cuda_ctx *c, const float *qkv, int B, int T,
                                                  int C, int nh, float *att, float *scratch,
                                                  float *out, ddp_precision precision,
                                                  const ddp__cuda_drop *drop, ddp_error *err)
{
    const int hs = C / nh, BH = B * nh;
    const size_t n = (size_t)B * T * C;
    float *q = scratch, *k = q + n, *v = k + n, *y = v + n;
    float *pd = scratch + 7 * n; /* with dropout: the dropped probabilities (the backward's dP) */
    const ddp__drop_dev dr = ddp__drop_args(drop);
    const float scale = 1.0f / sqrtf((float)hs);
    ddp_status st;
    permute_qkv<float>
        <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((float *)qkv, q, k, v, B, T, C, nh, 1);
    if ((st = ddp__cuda_launched("attention permute", err)) ||
        (st = bgemm(c, false, true, T, T, hs, scale, q, hs, (long long)T * hs, k, hs,
                    (long long)T * hs, 0.0f, att, T, (long long)T * T, BH, precision, err)))
        return st;
    size_t rows = (size_t)BH * T;
    causal_softmax<<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(att, rows, T);
    if ((st = ddp__cuda_launched("causal softmax", err)))
        return st;
    if (dr.on) {
        causal_dropout<float>
            <<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(att, pd, rows, T, dr);
        if ((st = ddp__cuda_launched("attention dropout", err)))
            return st;
    }
    if ((st = bgemm(c, false, false, T, hs, T, 1.0f, dr.on ? pd : att, T, (long long)T * T, v, hs,
                    (long long)T * hs, 0.0f, y, hs, (long long)T * hs, BH, precision, err)))
        return st;
    permute_heads<float><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(y, out, B, T, C, nh, 1);
    return ddp__cuda_launched("attention unpermute", err);
}

extern "C" ddp_status ddp__cuda_attention_backward(ddp__cuda_ctx *c, const float *dout,
                                                   const float *qkv, const float *att, int B, int T,
                                                   int C, int nh, float *scratch, float *dqkv,
                                                   ddp_precision precision,
                                                   const ddp__cuda_drop *drop, ddp_error *err)
{
    const ddp__drop_dev dr = ddp__drop_args(drop);
    const int hs = C / nh, BH = B * nh;
    const size_t n = (size_t)B * T * C;
    const long long sT = (long long)T * hs, sTT = (long long)T * T;
    float *q = scratch, *k = q + n, *v = k + n, *dy = v + n, *dq = dy + n, *dk = dq + n,
          *dv = dk + n, *dp = dv + n;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t rows = (size_t)BH * T;
    ddp_status st;
    permute_qkv<float>
        <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((float *)qkv, q, k, v, B, T, C, nh, 1);
    permute_heads<float>
        <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(dy, (float *)dout, B, T, C, nh, -1);
    if ((st = ddp__cuda_launched("attention backward permute", err)))
        return st;
    if (dr.on) { /* the dropped probabilities again, in dP's place until dV is made */
        causal_dropout<float>
            <<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(att, dp, rows, T, dr);
        if ((st = ddp__cuda_launched("attention dropout (backward)", err)))
            return st;
    }
    /* dV = P'ᵀ · dY (P' the probabilities as the forward's product used them), then dP = dY · Vᵀ */
    if ((st = bgemm(c, true, false, T, hs, T, 1.0f, dr.on ? dp : att, T, sTT, dy, hs, sT, 0.0f, dv,
                    hs, sT, BH, precision, err)) ||
        (st = bgemm(c, false, true, T, T, hs, 1.0f, dy, hs, sT, v, hs, sT, 0.0f, dp, T, sTT, BH,
                    precision, err)))
        return st;
    /* in place: dS over dP (causal_softmax_bwd_h's fp32 instance) */
    causal_softmax_bwd_h<float>
        <<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(att, dp, dp, rows, T, scale, dr);
    if ((st = ddp__cuda_launched("causal softmax backward", err)) ||
        /* dQ = dS · K, dK = dSᵀ · Q */
        (st = bgemm(c, false, false, T, hs, T, 1.0f, dp, T, sTT, k, hs, sT, 0.0f, dq, hs, sT, BH,
                    precision, err)) ||
        (st = bgemm(c, true, false, T, hs, T, 1.0f, dp, T, sTT, q, hs, sT, 0.0f, dk, hs, sT, BH,
                    precision, err)))
        return st;
    permute_qkv<float>
        <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(dqkv, dq, dk, dv, B, T, C, nh, -1);
    return ddp__cuda_launched("attention backward unpermute", err);
}

/* ---- 16 bits (bf16 or fp16) ---------------------------------------------------------------- */

/* The causal softmax of fp32 scores s into probabilities p of type H (16 bits; or float, where p
 * may be s) (0 past the row's position): fp32 max, exponentials and sum, one rounding per
 * probability. Rows of T scores as causal_softmax, row r the query at position past + r % m: m T
 * and past 0 for whole sequences, the new positions' rows (nh, m, T) for the key/value cache. */
template <typename H>
__global__ void causal_softmax_h(const float *s, H *p, size_t rows, int T, int m, int past)
{
    const size_t warps = (size_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        int t = past + (int)(row % m);
        const float *a = s + row * T;
        H *o = p + row * T;
        float mx = -INFINITY;
        for (int j = lane; j <= t; j += 32)
            mx = fmaxf(mx, a[j]);
        mx = ddp__warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j <= t; j += 32)
            sum += expf(a[j] - mx);
        sum = ddp__warp_sum(sum);
        for (int j = lane; j < T; j += 32)
            ddp__st(o + j, j <= t ? expf(a[j] - mx) / sum : 0.0f);
    }
}

static size_t up256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

/* The 16-bit scratch, in bytes, each region 256-byte aligned from the (cudaMalloc'd) base:
 *   f32 (B·nh·T·T)    the scores S (forward), dP (backward)
 *   ds  (B·nh·T·T)    16-bit dS (backward); with dropout first the dropped probabilities
 *                     (forward, and the backward's dV)
 *   7 × (B·T·C)       16-bit q, k, v, then y (forward) or dy, dq, dk, dv (backward) */
struct h_scratch {
    float *f32;
    uint16_t *ds, *q, *k, *v, *y, *dq, *dk, *dv;
};

static h_scratch h_regions(void *base, int B, int T, int C, int nh)
{
    const size_t tt = (size_t)B * nh * T * T, n = (size_t)B * T * C;
    char *p = (char *)base;
    h_scratch r;
    r.f32 = (float *)p;
    p += up256(tt * sizeof(float));
    r.ds = (uint16_t *)p;
    p += up256(tt * sizeof(uint16_t));
    uint16_t **seq[] = {&r.q, &r.k, &r.v, &r.y, &r.dq, &r.dk, &r.dv};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        *seq[i] = (uint16_t *)p;
        p += up256(n * sizeof(uint16_t));
    }
    return r;
}

/* causal_dropout on 16-bit probabilities att into pd (what names the launch in errors). */
static ddp_status dropout_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *att, uint16_t *pd,
                            size_t rows, int T, const ddp__drop_dev &dr, const char *what,
                            ddp_error *err)
{
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        causal_dropout<E><<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>((const E *)att, (E *)pd,
                                                                            rows, T, dr);
    });
    return ddp__cuda_launched(what, err);
}

extern "C" size_t ddp__cuda_attention_scratch_h(int B, int T, int C, int nh)
{
    const size_t tt = (size_t)B * nh * T * T, n = (size_t)B * T * C;
    return up256(tt * sizeof(float)) + up256(tt * sizeof(uint16_t)) +
           7 * up256(n * sizeof(uint16_t));
}

extern "C" ddp_status ddp__cuda_attention_forward_h(ddp__cuda_ctx *c, ddp_dtype ht,
                                                    const uint16_t *qkv, int B, int T, int C,
                                                    int nh, uint16_t *att, void *scratch,
                                                    uint16_t *out, const ddp__cuda_drop *drop,
                                                    ddp_error *err)
{
    const ddp__drop_dev dr = ddp__drop_args(drop);
    const int hs = C / nh, BH = B * nh;
    const size_t n = (size_t)B * T * C, rows = (size_t)BH * T;
    const long long sT = (long long)T * hs, sTT = (long long)T * T;
    const h_scratch r = h_regions(scratch, B, T, C, nh);
    const float scale = 1.0f / sqrtf((float)hs);
    ddp_status st = ddp__cuda_half_check(ht, "attention forward", err);
    if (st)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        permute_qkv<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(
            (E *)qkv, (E *)r.q, (E *)r.k, (E *)r.v, B, T, C, nh, 1);
    });
    if ((st = ddp__cuda_launched("attention permute (16-bit)", err)) ||
        /* S = scale · Q · Kᵀ, fp32 out */
        (st = bgemm_h(c, ht, false, true, T, T, hs, scale, r.q, hs, sT, r.k, hs, sT, r.f32, T, sTT,
                      BH, false, err)))
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        causal_softmax_h<E>
            <<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(r.f32, (E *)att, rows, T, T, 0);
    });
    if ((st = ddp__cuda_launched("causal softmax (16-bit)", err)))
        return st;
    if (dr.on && (st = dropout_h(c, ht, att, r.ds, rows, T, dr, "attention dropout (16-bit)", err)))
        return st;
    /* Y = P' · V (P' the probabilities, dropped with dropout), 16-bit out */
    if ((st = bgemm_h(c, ht, false, false, T, hs, T, 1.0f, dr.on ? (const void *)r.ds : att, T, sTT,
                      r.v, hs, sT, r.y, hs, sT, BH, true, err)))
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        permute_heads<E>
            <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((E *)r.y, (E *)out, B, T, C, nh, 1);
    });
    return ddp__cuda_launched("attention unpermute (16-bit)", err);
}

extern "C" ddp_status ddp__cuda_attention_backward_h(ddp__cuda_ctx *c, ddp_dtype ht,
                                                     const uint16_t *dout, const uint16_t *qkv,
                                                     const uint16_t *att, int B, int T, int C,
                                                     int nh, void *scratch, uint16_t *dqkv,
                                                     const ddp__cuda_drop *drop, ddp_error *err)
{
    const ddp__drop_dev dr = ddp__drop_args(drop);
    const int hs = C / nh, BH = B * nh;
    const size_t n = (size_t)B * T * C, rows = (size_t)BH * T;
    const long long sT = (long long)T * hs, sTT = (long long)T * T;
    const h_scratch r = h_regions(scratch, B, T, C, nh);
    uint16_t *dy = r.y; /* the forward's y region holds dY here */
    const float scale = 1.0f / sqrtf((float)hs);
    ddp_status st = ddp__cuda_half_check(ht, "attention backward", err);
    if (st)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        permute_qkv<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(
            (E *)qkv, (E *)r.q, (E *)r.k, (E *)r.v, B, T, C, nh, 1);
        permute_heads<E>
            <<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((E *)dy, (E *)dout, B, T, C, nh, -1);
    });
    if ((st = ddp__cuda_launched("attention backward permute (16-bit)", err)))
        return st;
    /* the dropped probabilities again, in dS's place until dV is made */
    if (dr.on &&
        (st = dropout_h(c, ht, att, r.ds, rows, T, dr, "attention dropout (16-bit backward)", err)))
        return st;
    /* dV = P'ᵀ · dY, then dP = dY · Vᵀ (fp32 out, for the softmax backward) */
    if ((st = bgemm_h(c, ht, true, false, T, hs, T, 1.0f, dr.on ? (const void *)r.ds : att, T, sTT,
                      dy, hs, sT, r.dv, hs, sT, BH, true, err)) ||
        (st = bgemm_h(c, ht, false, true, T, T, hs, 1.0f, dy, hs, sT, r.v, hs, sT, r.f32, T, sTT,
                      BH, false, err)))
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        causal_softmax_bwd_h<E><<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(
            (const E *)att, r.f32, (E *)r.ds, rows, T, scale, dr);
    });
    if ((st = ddp__cuda_launched("causal softmax backward (16-bit)", err)) ||
        /* dQ = dS · K, dK = dSᵀ · Q */
        (st = bgemm_h(c, ht, false, false, T, hs, T, 1.0f, r.ds, T, sTT, r.k, hs, sT, r.dq, hs, sT,
                      BH, true, err)) ||
        (st = bgemm_h(c, ht, true, false, T, hs, T, 1.0f, r.ds, T, sTT, r.q, hs, sT, r.dk, hs, sT,
                      BH, true, err)))
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        permute_qkv<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(
            (E *)dqkv, (E *)r.dq, (E *)r.dk, (E *)r.dv, B, T, C, nh, -1);
    });
    return ddp__cuda_launched("attention backward unpermute (16-bit)", err);
}

/* ---- generation's key/value cache ------------------------------------------------------------ */

/* The cached attention's scratch, in bytes, each region 256-byte aligned from the (cudaMalloc'd)
 * base: the scores (nh·m·T fp32), the 16-bit probabilities (as many), the heads' output y
 * (nh, m, hs) before it goes into out's rows (m·C floats, or 16-bit values). */
extern "C" size_t ddp__cuda_attention_cached_scratch(int m, int T, int C, int nh)
{
    const size_t cells = (size_t)nh * m * T;
    return up256(cells * sizeof(float)) + up256(cells * sizeof(uint16_t)) +
           up256((size_t)m * C * sizeof(float));
}

/* q, k and v read in place in qkv's rows (leading dimension 3C, a head per batch entry at stride
 * hs: no permutes in); the heads' output made contiguous per head (cuBLAS's C batches must not
 * interleave), then scattered into out's rows. The products are the batched path's. */
extern "C" ddp_status ddp__cuda_attention_forward_cached(ddp__cuda_ctx *c, ddp_dtype t,
                                                         const void *qkv, int past, int T, int C,
                                                         int nh, void *scratch, void *out,
                                                         ddp_precision precision, ddp_error *err)
{
    const int hs = C / nh, m = T - past, ld = 3 * C;
    const size_t rows = (size_t)nh * m, es = t == DDP_FLOAT32 ? sizeof(float) : sizeof(uint16_t);
    const long long sS = (long long)m * T, sY = (long long)m * hs;
    const float scale = 1.0f / sqrtf((float)hs);
    const char *q = (const char *)qkv + (size_t)past * ld * es, *k = (const char *)qkv + C * es,
               *v = (const char *)qkv + 2 * (size_t)C * es;
    char *y0 = (char *)out + (size_t)past * C * es;
    float *scores = (float *)scratch;
    char *probs = (char *)scratch + up256(rows * T * sizeof(float));
    void *y = probs + up256(rows * T * sizeof(uint16_t));
    ddp_status st;
    if (past < 1 || m < 1)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda cached attention: %d cached of %d positions (at least 1 of "
                              "each)",
                              past, T);
    if (t == DDP_FLOAT32) {
        /* S = scale · Q_new · Kᵀ (m × T per head), the softmax in place, Y = P · V */
        if ((st = bgemm(c, false, true, m, T, hs, scale, (const float *)q, ld, hs, (const float *)k,
                        ld, hs, 0.0f, scores, T, sS, nh, precision, err)))
            return st;
        causal_softmax_h<float>
            <<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(scores, scores, rows, T, m, past);
        if ((st = ddp__cuda_launched("cached causal softmax", err)) ||
            (st = bgemm(c, false, false, m, hs, T, 1.0f, scores, T, sS, (const float *)v, ld, hs,
                        0.0f, (float *)y, hs, sY, nh, precision, err)))
            return st;
        permute_heads<float><<<ddp__cuda_blocks((size_t)m * C, 256), 256, 0, c->stream>>>(
            (float *)y, (float *)y0, 1, m, C, nh, 1);
        return ddp__cuda_launched("cached attention unpermute", err);
    }
    if ((st = ddp__cuda_half_check(t, "cached attention", err)) ||
        /* fp32 scores, the softmax in fp32 into 16-bit probabilities, 16-bit Y: as the batched
         * 16-bit path */
        (st = bgemm_h(c, t, false, true, m, T, hs, scale, q, ld, hs, k, ld, hs, scores, T, sS, nh,
                      false, err)))
        return st;
    ddp__half_dispatch(t, [&](auto e) {
        using E = decltype(e);
        causal_softmax_h<E><<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(scores, (E *)probs,
                                                                              rows, T, m, past);
    });
    if ((st = ddp__cuda_launched("cached causal softmax (16-bit)", err)) ||
        (st = bgemm_h(c, t, false, false, m, hs, T, 1.0f, probs, T, sS, v, ld, hs, y, hs, sY, nh,
                      true, err)))
        return st;
    ddp__half_dispatch(t, [&](auto e) {
        using E = decltype(e);
        permute_heads<E><<<ddp__cuda_blocks((size_t)m * C, 256), 256, 0, c->stream>>>(
            (E *)y, (E *)y0, 1, m, C, nh, 1);
    });
    return ddp__cuda_launched("cached attention unpermute (16-bit)", err);
}
