/*
 * kernels/cuda_kernels.h — the GPT's kernels on a CUDA device, beside kernels.h: the same
 * contracts as the CPU layer functions of ddp/nn.h (the reference each is tested against,
 * tests/unit/test_cuda_kernels.c), on device memory. Implemented in the .cu files of kernels/cuda,
 * built only with DDP_CUDA; plain C signatures (no CUDA header here), so C tests can call them.
 *
 * UNVERIFIED: as of this writing no kernel here has run on a GPU (the sessions that wrote them
 * had none). They compile with -Werror for sm_80 and sm_90; test_cuda_kernels states what each
 * must match, and scripts/gpu-check.sh runs it on a lent GPU. docs/gpu.md keeps the record.
 *
 * Conventions: every pointer argument is device memory unless its name ends in _host; sizes as
 * in ddp/nn.h (B batch, T tokens, C channels, nh heads, hs = C/nh, V vocabulary, N = B·T rows).
 * Everything runs in order on the context's one stream; a call returns when the work is queued
 * (ddp__cuda_sync waits), except where it says it copies to the host. Launch errors are reported
 * by the call (DDP_ERR_SYSTEM with CUDA's message in err); errors of the work itself surface at
 * the next sync. A context is used by one thread at a time.
 */
#ifndef DDP_KERNELS_CUDA_KERNELS_H
#define DDP_KERNELS_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/device.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A device, its stream, a cuBLAS and a cuBLASLt handle and the GEMM workspace. */
typedef struct ddp__cuda_ctx ddp__cuda_ctx;

/* Makes device `device` current for the calling thread and creates a context on it. *out
 * written only on DDP_OK; DDP_ERR_NOT_FOUND without a GPU, DDP_ERR_SYSTEM for CUDA errors. */
ddp_status ddp__cuda_ctx_create(int device, ddp__cuda_ctx **out, ddp_error *err);
void ddp__cuda_ctx_destroy(ddp__cuda_ctx *ctx); /* NULL is a no-op; waits for queued work */
/* Waits for the context's work; the first error of that work, if any. */
ddp_status ddp__cuda_sync(ddp__cuda_ctx *ctx, ddp_error *err);

/* Plain cudaMalloc / cudaFree (no managed memory); bytes 0 allocates 1. */
ddp_status ddp__cuda_malloc(void **out, size_t bytes, ddp_error *err);
void ddp__cuda_free(void *p); /* NULL is a no-op */
/* Copies on the context's stream; the host side waits for the copy to finish (host memory may
 * be pageable). */
ddp_status ddp__cuda_to_device(ddp__cuda_ctx *ctx, void *dst, const void *src_host, size_t bytes,
                               ddp_error *err);
ddp_status ddp__cuda_to_host(ddp__cuda_ctx *ctx, void *dst_host, const void *src, size_t bytes,
                             ddp_error *err);
ddp_status ddp__cuda_copy(ddp__cuda_ctx *ctx, void *dst, const void *src, size_t bytes,
                          ddp_error *err); /* device to device, queued */
ddp_status ddp__cuda_memset0(ddp__cuda_ctx *ctx, void *dst, size_t bytes, ddp_error *err);

/* ---- GEMM (cuBLASLt) -------------------------------------------------------------------------
 * C (M, N) = alpha · op(A) · op(B) + beta · C, row-major, exactly ddp__sgemm's contract
 * (kernels.h), with A and B of dtype `in` (DDP_FLOAT32, DDP_BFLOAT16 or DDP_FLOAT16, both the
 * same) and C of dtype `out` (DDP_FLOAT32 or `in`); accumulation in fp32 always, split-K parts
 * included. precision TF32 lets fp32 inputs go through TF32 tensor cores; FP32 forbids it. bias
 * (N,) fp32 or NULL: added to every row (cuBLASLt's bias epilogue when bias is 16-byte aligned,
 * else a separate pass). Any element-aligned pointers: cuBLASLt is told each one's alignment
 * (ddp__cuda_align_of), since its heuristic otherwise assumes 256 bytes and may choose a kernel
 * that fails or faults on a view into a larger buffer. */
ddp_status ddp__cuda_gemm(ddp__cuda_ctx *ctx, bool trans_a, bool trans_b, int M, int N, int K,
                          float alpha, const void *A, int lda, const void *B, int ldb, float beta,
                          void *C, int ldc, ddp_dtype in, ddp_dtype out, const float *bias,
                          ddp_precision precision, ddp_error *err);

/* The alignment cuBLASLt is told a buffer has: the largest power of two that divides its
 * address, at most 256 (the heuristic's default assumption). Plain arithmetic (test_device). */
static inline uint32_t ddp__cuda_align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al != 0)
        al >>= 1;
    return al;
}

/* Whether a bias pointer may go to cuBLASLt's bias epilogue (16-byte aligned, as its kernels
 * load it); otherwise ddp__cuda_gemm adds the bias in a pass of its own. */
static inline bool ddp__cuda_bias_epilogue_ok(const void *bias)
{
    return ddp__cuda_align_of(bias) >= 16;
}

/* Floats one parameter tensor of count floats takes in the CUDA GPT's flat device buffers: the
 * count rounded up to 64 floats (256 bytes), so that every tensor starts where cuBLASLt's fastest
 * kernels want it (a CPU-layout offset such as vocab_size × n_embd is often only 16- or 4-byte
 * aligned). The host's layout is unchanged: the padding exists on the device only. */
static inline size_t ddp__cuda_param_span(size_t count)
{
    return (count + 63) / 64 * 64;
}

/* ---- the layers (fp32 activations; ddp/nn.h's contracts) ----------------------------------- */

/* x (B, T, C) = wte[idx] + wpe[t]; idx (B, T) int32 on the device, already checked. */
ddp_status ddp__cuda_embedding_forward(ddp__cuda_ctx *ctx, const int32_t *idx, const float *wte,
                                       const float *wpe, int B, int T, int C, float *x,
                                       ddp_error *err);
/* dwte[idx] += dx (atomic adds: not the CPU's order, so equal to rounding), dwpe[t] += Σ_b dx. */
ddp_status ddp__cuda_embedding_backward(ddp__cuda_ctx *ctx, const float *dx, const int32_t *idx,
                                        int B, int T, int C, float *dwte, float *dwpe,
                                        ddp_error *err);
/* ddp_nn_layernorm_forward: statistics in fp32 (two passes over the row, not double). */
ddp_status ddp__cuda_layernorm_forward(ddp__cuda_ctx *ctx, const float *x, const float *weight,
                                       const float *bias, int N, int C, float eps, float *y,
                                       float *mean, float *rstd, ddp_error *err);
/* ddp_nn_layernorm_backward; dx may equal dy; dweight, dbias accumulate (+=). */
ddp_status ddp__cuda_layernorm_backward(ddp__cuda_ctx *ctx, const float *dy, const float *x,
                                        const float *weight, const float *mean, const float *rstd,
                                        int N, int C, float *dx, float *dweight, float *dbias,
                                        ddp_error *err);
/* ddp_nn_linear_forward / _backward through ddp__cuda_gemm (fp32, or TF32 with precision TF32). */
ddp_status ddp__cuda_linear_forward(ddp__cuda_ctx *ctx, const float *x, const float *W,
                                    const float *b, int B, int in, int out, float *y,
                                    ddp_precision precision, ddp_error *err);
ddp_status ddp__cuda_linear_backward(ddp__cuda_ctx *ctx, const float *dy, const float *x,
                                     const float *W, int B, int in, int out, float *dx, float *dW,
                                     float *db, ddp_precision precision, ddp_error *err);
/* The MLP's first linear layer and its GELU (tanh, GPT-2's) in one product where cuBLASLt
 * offers the GELU epilogue: pre (B, out) = x (B, in) · Wᵀ + b (the GELU's input, kept for the
 * backward) and y (B, out) = GELU(pre). t: the dtype of x, W, pre and y, DDP_FLOAT32 (bias
 * float32; precision fp32 or tf32) or a 16-bit format (bias in t, as linear_forward_h's). Where
 * the epilogue is not offered (or DDP_CUDA_GELU_EPILOGUE=0): the product into pre, then
 * ddp__cuda_gelu_forward(_h) — in 16 bits then GELU reads pre rounded, one rounding more. */
ddp_status ddp__cuda_linear_gelu_forward(ddp__cuda_ctx *ctx, ddp_dtype t, const void *x,
                                         const void *W, const void *b, int B, int in, int out,
                                         void *pre, void *y, ddp_precision precision,
                                         ddp_error *err);
/* Back through the next layer's product into that GELU's input: dpre (B, in) = (dy (B, out) ·
 * W (out, in)) ⊙ GELU'(pre (B, in)) (cuBLASLt's DGELU epilogue; else the product, then
 * ddp__cuda_gelu_backward(_h)); all of dtype t. dpre is overwritten. */
ddp_status ddp__cuda_linear_dgelu_backward(ddp__cuda_ctx *ctx, ddp_dtype t, const void *dy,
                                           const void *W, const void *pre, int B, int in, int out,
                                           void *dpre, ddp_precision precision, ddp_error *err);
/* ddp_nn_gelu_tanh_forward / _backward (y may equal x; dx may equal dy). */
ddp_status ddp__cuda_gelu_forward(ddp__cuda_ctx *ctx, const float *x, size_t n, float *y,
                                  ddp_error *err);
ddp_status ddp__cuda_gelu_backward(ddp__cuda_ctx *ctx, const float *dy, const float *x, size_t n,
                                   float *dx, ddp_error *err);
/* y = a + b (y may equal a or b). */
ddp_status ddp__cuda_add(ddp__cuda_ctx *ctx, const float *a, const float *b, size_t n, float *y,
                         ddp_error *err);

/* Dropout on the GPU with the CPU's masks (util/rng.h's counter-based hashes, so a mask is the
 * same on either device): p in (0, 1) (0: none); seed (the layer's: the model's seed + layer
 * id), step and offset as ddp_nn_dropout_forward (elementwise: element i is decided by
 * ddp__rand_u64(seed, step, offset + i)) and ddp_nn_attention_forward (attention: query row r of
 * the (B·nh·T) rows has key ddp__rand_u64(seed, step, offset + r), probability j kept iff
 * ddp__rand_u32(key, j) ≥ p·2³²). Masks are never stored: the backward draws them again. */
typedef struct ddp__cuda_drop {
    float p;
    uint64_t seed, step, offset;
} ddp__cuda_drop;
/* y = x · 1/(1 − p) where element i is kept, else 0: ddp_nn_dropout_forward's values (its
 * backward is the same map on the gradient). x of dtype xt, y of yt: float32 → float32,
 * float32 → 16 bits (rounded once after the scaling), or 16 → the same 16 bits; y may equal x
 * (same dtype). */
ddp_status ddp__cuda_dropout(ddp__cuda_ctx *ctx, ddp_dtype xt, const void *x, ddp_dtype yt, void *y,
                             size_t n, const ddp__cuda_drop *d, ddp_error *err);

/* Causal self-attention through cuBLAS strided-batched GEMMs and a causal softmax: out (B, T, C)
 * from qkv (B, T, 3C) as ddp_nn_attention_forward, with its dropout on the probabilities when
 * drop is not NULL and drop->p > 0 (the same masks; the forward's and the backward's drop must
 * be the same). Unlike the CPU's flash-style kernel it keeps the probabilities (before
 * dropout): att (B, nh, T, T) for the backward, and needs scratch of
 * ddp__cuda_attention_scratch(B, T, C, nh) floats (7·B·T·C + B·nh·T·T). */
size_t ddp__cuda_attention_scratch(int B, int T, int C, int nh);
ddp_status ddp__cuda_attention_forward(ddp__cuda_ctx *ctx, const float *qkv, int B, int T, int C,
                                       int nh, float *att, float *scratch, float *out,
                                       ddp_precision precision, const ddp__cuda_drop *drop,
                                       ddp_error *err);
/* dqkv (B, T, 3C) overwritten, from dout (B, T, C) and the forward's qkv and att. */
ddp_status ddp__cuda_attention_backward(ddp__cuda_ctx *ctx, const float *dout, const float *qkv,
                                        const float *att, int B, int T, int C, int nh,
                                        float *scratch, float *dqkv, ddp_precision precision,
                                        const ddp__cuda_drop *drop, ddp_error *err);

/* Fused softmax cross-entropy over a vocabulary (ddp_nn_vocab_xent): row_loss (N,) each row's
 * −log softmax[target] (0 for ignored rows), correct (N,) 1 where the target is the row's
 * argmax (first on ties), else 0; with dlogits non-NULL, dlogits (N, V) = (softmax −
 * onehot) · scale / count for counted rows, 0 for ignored ones (dlogits may equal logits).
 * count: the non-ignored targets (the caller knows them from the host's copy). Targets are
 * checked by the caller. */
ddp_status ddp__cuda_vocab_xent(ddp__cuda_ctx *ctx, const float *logits, const int32_t *targets,
                                int N, int V, float scale, int count, float *row_loss,
                                int32_t *correct, float *dlogits, ddp_error *err);

/* ---- the layers in 16 bits (precision bf16 or fp16; docs/gpu.md "Mixed precision", its table
 * of roundings) -----------------------------------------------------------------------------
 * ht is the 16-bit dtype, DDP_BFLOAT16 or DDP_FLOAT16 (autocast's bfloat16 or float16): 16-bit
 * buffers are uint16_t bit patterns in that format (util/half.h: round to nearest even, NaN kept;
 * fp16 overflows to ±inf, which is never clamped: precision fp16's loss scaler must see it).
 * Every sum, statistic and transcendental is computed in fp32 and rounded once where it is
 * stored. Weights are 16-bit copies of the fp32 masters; biases and layernorm parameters stay
 * fp32. Another ht is refused (DDP_ERR_INVALID). */

/* ddp__cuda_layernorm_forward with y (N, C) rounded to ht (statistics fp32, as there). */
ddp_status ddp__cuda_layernorm_forward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const float *x,
                                         const float *weight, const float *bias, int N, int C,
                                         float eps, uint16_t *y, float *mean, float *rstd,
                                         ddp_error *err);
/* y (B, out) ht = x (B, in) ht · Wᵀ (W (out, in) ht) + b (ht: the bias's 16-bit copy, as
 * autocast's linear uses it, or NULL), fp32 accumulation, rounded once (twice when the bias goes
 * through ddp__cuda_gemm's separate pass, an unaligned bias or an epilogue cuBLASLt refuses: the
 * product rounded, the bias added, rounded again). */
ddp_status ddp__cuda_linear_forward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *x,
                                      const uint16_t *W, const uint16_t *b, int B, int in, int out,
                                      uint16_t *y, ddp_error *err);
/* From dy (B, out) ht: dx (B, in) = dy · W of dtype dx_dtype (DDP_FLOAT32 where a layernorm
 * or other fp32 arithmetic reads it, ht where only 16-bit work does), overwritten;
 * dW (out, in) fp32 += dyᵀ · x; db (out,) fp32 += the column sums of dy (in fp32). Any of dx,
 * dW, db may be NULL. */
ddp_status ddp__cuda_linear_backward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *dy,
                                       const uint16_t *x, const uint16_t *W, int B, int in, int out,
                                       void *dx, ddp_dtype dx_dtype, float *dW, float *db,
                                       ddp_error *err);
/* GELU (tanh) on ht: computed in fp32 from the 16-bit input, rounded once (y may equal x; dx
 * may equal dy). */
ddp_status ddp__cuda_gelu_forward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *x, size_t n,
                                    uint16_t *y, ddp_error *err);
ddp_status ddp__cuda_gelu_backward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *dy,
                                     const uint16_t *x, size_t n, uint16_t *dx, ddp_error *err);
/* y (fp32) = a (fp32) + b (ht, widened exactly): a 16-bit branch added to the fp32 residual
 * stream (y may equal a). */
ddp_status ddp__cuda_add_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const float *a, const uint16_t *b,
                           size_t n, float *y, ddp_error *err);
/* Causal self-attention in 16 bits: out (B, T, C) ht from qkv (B, T, 3C) ht; the scores
 * S = QKᵀ/√hs come out of the product in fp32, the softmax runs in fp32 and the probabilities
 * att (B, nh, T, T) are kept in ht (the P·V operand and the backward's P). scratch: bytes of
 * ddp__cuda_attention_scratch_h(B, T, C, nh) (either format), 256-byte aligned (a cudaMalloc'd
 * base). */
size_t ddp__cuda_attention_scratch_h(int B, int T, int C, int nh);
ddp_status ddp__cuda_attention_forward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *qkv,
                                         int B, int T, int C, int nh, uint16_t *att, void *scratch,
                                         uint16_t *out, const ddp__cuda_drop *drop, ddp_error *err);
/* dqkv (B, T, 3C) ht overwritten, from dout (B, T, C) ht and the forward's qkv and att:
 * dP = dY·Vᵀ in fp32, the softmax backward in fp32 from the 16-bit P, dS rounded to ht for
 * dQ = dS·K and dK = dSᵀ·Q; dV = Pᵀ·dY. */
ddp_status ddp__cuda_attention_backward_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *dout,
                                          const uint16_t *qkv, const uint16_t *att, int B, int T,
                                          int C, int nh, void *scratch, uint16_t *dqkv,
                                          const ddp__cuda_drop *drop, ddp_error *err);
/* Generation's key/value cache (one sequence): the heads' output for positions past … T − 1 only,
 * over keys and values 0 … T − 1, all in qkv (T, 3C) of type t (DDP_FLOAT32, or the 16-bit
 * format of precision bf16/fp16), whose rows 0 … past − 1 a previous forward left; out (T, C) of
 * type t gets rows past … T − 1. scratch: ddp__cuda_attention_cached_scratch(m, T, C, nh) bytes
 * for m ≥ T − past new positions, 256-byte aligned. The same products, softmax and roundings as
 * the batched path (ddp__cuda_attention_forward / _h), without dropout. 1 ≤ past < T. */
size_t ddp__cuda_attention_cached_scratch(int m, int T, int C, int nh);
ddp_status ddp__cuda_attention_forward_cached(ddp__cuda_ctx *ctx, ddp_dtype t, const void *qkv,
                                              int past, int T, int C, int nh, void *scratch,
                                              void *out, ddp_precision precision, ddp_error *err);
/* ddp__cuda_vocab_xent on fp32 logits (N, V) whose gradient (scaled by scale / count: with
 * precision fp16, scale carries the loss scale), with grad, is written in ht over the logits
 * themselves: row r's V 16-bit values at the start of row r's own storage, i.e. a 16-bit matrix
 * (N, V) with leading dimension 2·V at (uint16_t *)logits, ready for the LM head's 16-bit
 * products. The logits are no longer readable afterwards. */
ddp_status ddp__cuda_vocab_xent_hgrad(ddp__cuda_ctx *ctx, ddp_dtype ht, float *logits,
                                      const int32_t *targets, int N, int V, float scale, int count,
                                      float *row_loss, int32_t *correct, bool grad, ddp_error *err);

/* ---- fused causal attention (flash.cu; FlashAttention-2 style) -------------------------------
 * The same results as ddp__cuda_attention_forward/_backward (fp32) and their _h twins (bf16,
 * fp16) without the (B, nh, T, T) probabilities: dtype dt is DDP_FLOAT32 (FMA products, fp32
 * throughout), DDP_BFLOAT16 or DDP_FLOAT16 (tensor-core products with fp32 accumulation, fp32
 * softmax statistics, P and dS rounded to dt for their products as the batched 16-bit path);
 * qkv, out, dout, dqkv are of dt (16-bit: uint16_t bit patterns). Head sizes C/nh of 32, 64 or
 * 128 only (ddp__cuda_flash_supported; another is refused with DDP_ERR_INVALID: use the batched
 * path). Dropout on the probabilities as the batched path's when drop is not NULL and drop->p > 0
 * (the same masks, drawn inline, never stored; the forward's and the backward's drop must be the
 * same). Deterministic: fixed reduction orders, no atomics. UNVERIFIED: compiled, never run on a
 * GPU (docs/gpu.md). */
bool ddp__cuda_flash_supported(int hs);
/* Bytes of the backward's scratch (D = rowsum(dO ∘ O), B·nh·T floats): O(B·nh·T), no T². */
size_t ddp__cuda_flash_scratch(int B, int T, int C, int nh);
/* out (B, T, C) from qkv (B, T, 3C); lse (B, nh, T) fp32 the rows' logsumexp of the scaled
 * scores (before dropout), which the backward reads. */
ddp_status ddp__cuda_flash_forward(ddp__cuda_ctx *ctx, ddp_dtype dt, const void *qkv, int B, int T,
                                   int C, int nh, void *out, float *lse, const ddp__cuda_drop *drop,
                                   ddp_error *err);
/* dqkv (B, T, 3C) overwritten, from dout (B, T, C) and the forward's qkv, out and lse; scratch:
 * ddp__cuda_flash_scratch bytes. */
ddp_status ddp__cuda_flash_backward(ddp__cuda_ctx *ctx, ddp_dtype dt, const void *dout,
                                    const void *qkv, const void *out, const float *lse, int B,
                                    int T, int C, int nh, void *scratch, void *dqkv,
                                    const ddp__cuda_drop *drop, ddp_error *err);

/* ---- optimizer and gradients ----------------------------------------------------------------- */

/* ddp_nn_adamw_step on the device: p, m, v fp32 (p the master weights); p_bf16 (n,) receives
 * p rounded to bfloat16 (nearest even, util/half.h) when not NULL. grad_scale multiplies g
 * first (1: none; 1/loss_scale after fp16 loss scaling). */
ddp_status ddp__cuda_adamw(ddp__cuda_ctx *ctx, float *p, const float *g, float *m, float *v,
                           size_t n, float lr, float beta1, float beta2, float eps,
                           float weight_decay, uint64_t step, float grad_scale, uint16_t *p_bf16,
                           ddp_error *err);
/* *sumsq_host = Σ g² over the n floats of g, in double on the device (atomic adds of per-block
 * sums: the order, and so the last bits, vary from run to run); waits for the result. The
 * global norm is sqrt of the sum over every array. */
ddp_status ddp__cuda_sumsq(ddp__cuda_ctx *ctx, const float *g, size_t n, double *sumsq_host,
                           ddp_error *err);
/* x (n,) *= s. */
ddp_status ddp__cuda_scale(ddp__cuda_ctx *ctx, float *x, size_t n, float s, ddp_error *err);
/* GradScaler's unscale on the device: g ×= inv_scale, and *found_inf_host = whether any value
 * was inf or NaN before (waits for the flag). */
ddp_status ddp__cuda_unscale(ddp__cuda_ctx *ctx, float *g, size_t n, float inv_scale,
                             bool *found_inf_host, ddp_error *err);
/* dst (n,) ht (DDP_BFLOAT16 or DDP_FLOAT16) = src fp32 rounded to nearest even (fp16: ±inf
 * beyond its range); and back (exact). */
ddp_status ddp__cuda_f32_to_h(ddp__cuda_ctx *ctx, ddp_dtype ht, const float *src, size_t n,
                              uint16_t *dst, ddp_error *err);
ddp_status ddp__cuda_h_to_f32(ddp__cuda_ctx *ctx, ddp_dtype ht, const uint16_t *src, size_t n,
                              float *dst, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_KERNELS_CUDA_KERNELS_H */
