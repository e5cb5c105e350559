/*
 * nn/bf16h.h — private to src/nn: layer entry points for a model that keeps its layers' inputs
 * in bfloat16 (the GPT under precision bf16 on the CPU, gpt.c).
 *
 * Under bf16 products every matrix product rounds its operands to bfloat16 and accumulates in
 * float32 (kernels/cpu/onednn.c). A linear layer's input x is an operand twice: of y = x·Wᵀ in
 * the forward and of dW = dyᵀ·x in the backward, and ddp_nn_linear_forward/_backward round it
 * each time, from a float32 copy the model keeps for the backward. Here the producer of x (a
 * layernorm, the GELU, the attention) rounds it once, the model keeps only that bfloat16 copy
 * (half the memory), and both products take it. The roundings are the same ones, so the results
 * are those of the float32 entry points under bf16 products, bit for bit (test_transformer).
 *
 * Scratch for the rounded weight and output gradient is the caller's (wh: out·in halves, dyh:
 * B·out halves), so nothing here allocates. Products go through ddp__gemm_bf16_pre, whose
 * fallback (oneDNN failing) is a plain loop on the same bfloat16 operands: always computed.
 */
#ifndef DDP_NN_BF16H_H
#define DDP_NN_BF16H_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/nn.h"

/* yh[i] = x[i] rounded to bfloat16 (ddp__bf16_round's rounding), i < n. */
void ddp__nn_round_h(const float *x, size_t n, uint16_t *yh);

/* y (B, out) = xh · Wᵀ + b, or, with add, y += xh · Wᵀ + b (b may be NULL). W (out, in) is
 * rounded into wh. */
void ddp__nn_linear_forward_h(const uint16_t *xh, const float *W, const float *b, int B, int in,
                              int out, bool add, uint16_t *wh, float *y);

/* The same with W already rounded: wh (out, in) bfloat16 (a caller that keeps the rounded weights
 * across calls: generation). */
void ddp__nn_linear_forward_hh(const uint16_t *xh, const uint16_t *wh, const float *b, int B,
                               int in, int out, bool add, float *y);

/* ddp_nn_linear_backward with the forward's input as xh (B, in) bfloat16: dx (B, in) = dy · W
 * (NULL skips), dW += dyᵀ · xh, db += Σ_batch dy (NULL skips; summed in the same order as
 * ddp_nn_linear_backward, while dy is rounded into dyh). dy NULL: dyh already holds dy rounded,
 * and db is not touched (ddp__nn_gelu_tanh_backward_h made both). */
void ddp__nn_linear_backward_h(const float *dy, const uint16_t *xh, const float *W, int B, int in,
                               int out, uint16_t *dyh, uint16_t *wh, float *dx, float *dW,
                               float *db);

/* yh = GELU_tanh(x) rounded to bfloat16: ddp_nn_gelu_tanh_forward, then the rounding, without
 * the float32 output. */
void ddp__nn_gelu_tanh_forward_h(const float *x, size_t n, uint16_t *yh);

/* The GELU's backward feeding a linear layer's (c_fc's): g = dy · gelu'(x) for rows × cols, not
 * stored but rounded into gh, and the layer's bias gradient db (cols,) += Σ_rows g (rows in order,
 * as ddp_nn_linear_backward sums them) — what ddp_nn_gelu_tanh_backward then
 * ddp__nn_linear_backward_h would compute, without the float32 g. */
void ddp__nn_gelu_tanh_backward_h(const float *dy, const float *x, int rows, int cols, uint16_t *gh,
                                  float *db);

/* ddp_nn_layernorm_forward with the output rounded to bfloat16 into yh (N, C) instead of y;
 * row is C floats of scratch. */
void ddp__nn_layernorm_forward_h(const float *x, const float *weight, const float *bias, int N,
                                 int C, float eps, float *row, uint16_t *yh, float *mean,
                                 float *rstd);

/* ddp_nn_attention_forward/_backward with c_attn's output given as qkvh (B·T, 3C), already
 * rounded to bfloat16: the heads' q, k and v are read from it in place (the float32 entry points
 * round them per head, in the forward and again in the backward). */
void ddp__nn_attention_forward_h(const ddp_nn_attention *a, const uint16_t *qkvh, int B, int T,
                                 uint64_t seed, uint64_t step, uint64_t offset, bool train,
                                 float *scratch, float *out, float *lse);
void ddp__nn_attention_backward_h(const ddp_nn_attention *a, const float *dout,
                                  const uint16_t *qkvh, const float *lse, int B, int T,
                                  uint64_t seed, uint64_t step, uint64_t offset, bool train,
                                  float *scratch, float *dqkv);

/* ddp_nn_attention_forward_cached for a model whose qkv holds bfloat16 values (widened): the
 * probabilities are rounded to bfloat16 before they meet v, as ddp__nn_attention_forward_h's
 * product does. */
void ddp__nn_attention_forward_cached_h(const ddp_nn_attention *a, const float *qkv, int t0, int T,
                                        float *scratch, float *out);

#endif /* DDP_NN_BF16H_H */
