/*
 * ddp/nn.h — CPU neural-network layers and optimizers for the trainer: forward and backward
 * kernels (linear, relu, gelu, dropout, conv2d, maxpool2d, batchnorm, softmax cross-entropy),
 * SGD with momentum, AdamW, global gradient-norm clipping and seeded weight initialisation.
 * Models built from them are in ddp/model.h; the optimizer over a model's parameters and the
 * learning-rate schedule in ddp/optim.h.
 *
 * Conventions, for every function below:
 * - float32, row-major, batch first; images are NCHW. Shapes are written `x (B, in)`.
 * - Backward functions ACCUMULATE (+=) into parameter gradients (dW, db, dgamma, dbeta): the DDP
 *   reducer owns that memory and zeroes it (ddp_reducer_zero_grad). They OVERWRITE the input
 *   gradient dx, which may be NULL to skip computing it (the first layer needs none).
 * - Numbers match PyTorch's CPU modules to float rounding (tests/python/test_nn_torch.py).
 * - Nothing here keeps state between calls or touches global state: buffers are borrowed for the
 *   call only, and every function may be called from any thread on disjoint buffers.
 * - Dimensions are non-negative ints (OpenBLAS takes int); a dimension of 0 makes a kernel a
 *   no-op. Kernels that cannot fail return void; what can go wrong with caller input (a conv
 *   geometry, a label out of range) is checked by a function that returns a ddp_status and writes
 *   a one-line message into an optional ddp_error.
 * - Input and output buffers must not overlap unless a function says so.
 *
 * DDP and batchnorm: batch statistics are per rank, like torch's BatchNorm without
 * SyncBatchNorm; running statistics therefore drift apart between ranks, and the trainer
 * broadcasts them from rank 0 before evaluation (and before saving a checkpoint).
 */
#ifndef DDP_NN_H
#define DDP_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- counter-based random numbers ----------------------------------------------------------- */

/* A 64-bit hash of (seed, stream, index): a counter-based generator, so the value for one index
 * depends on nothing else (not on call order, thread count or rank). Dropout uses
 * stream = training step; weight initialisation uses stream = tensor id. */
uint64_t ddp_nn_rand_u64(uint64_t seed, uint64_t stream, uint64_t index);

/* ---- linear ---------------------------------------------------------------------------------- */

/* y (B, out) = x (B, in) · Wᵀ + b, with W (out, in) and b (out,) or NULL for no bias. */
void ddp_nn_linear_forward(const float *x, const float *W, const float *b, int B, int in, int out,
                           float *y);

/* Given dy (B, out) and the forward's x (B, in) and W (out, in):
 * dx (B, in) = dy · W (overwritten; NULL skips), dW (out, in) += dyᵀ · x (NULL skips),
 * db (out,) += Σ_batch dy (NULL skips). */
void ddp_nn_linear_backward(const float *dy, const float *x, const float *W, int B, int in, int out,
                            float *dx, float *dW, float *db);

/* ---- activations (elementwise over n values) ------------------------------------------------- */

/* y = max(x, 0). y may equal x (in place). */
void ddp_nn_relu_forward(const float *x, size_t n, float *y);
/* dx = dy where x > 0, else 0 (torch's choice at 0). x is the forward's input (its output works
 * too). dx may equal dy. */
void ddp_nn_relu_backward(const float *dy, const float *x, size_t n, float *dx);

/* y = x · Φ(x) = ½ x (1 + erf(x / √2)): the exact GELU, torch.nn.GELU() default. y may equal x. */
void ddp_nn_gelu_forward(const float *x, size_t n, float *y);
/* dx = dy · (Φ(x) + x · φ(x)), x the forward's input (not its output). dx may equal dy. */
void ddp_nn_gelu_backward(const float *dy, const float *x, size_t n, float *dx);

/* ---- dropout --------------------------------------------------------------------------------- */

/* Training mode: element i is kept with probability 1 − p, decided by
 * ddp_nn_rand_u64(seed, step, offset + i) alone, and scaled by 1 / (1 − p); mask (n,) receives 1
 * for kept and 0 for dropped elements, for the backward. The same (seed, step, offset + i) always
 * gives the same decision, so a run is reproducible; pass offset = the global index of the first
 * element (e.g. global sample index × features) to make masks independent of how samples are
 * split over ranks, and a different seed per dropout layer (e.g. base seed + layer number) so
 * layers do not share masks. p ≤ 0 keeps everything; p ≥ 1 drops everything (y = 0).
 * Eval mode (train false): y = x, mask is not written and may be NULL.
 * x (n,), y (n,) — y may equal x. */
void ddp_nn_dropout_forward(const float *x, size_t n, float p, uint64_t seed, uint64_t step,
                            uint64_t offset, bool train, uint8_t *mask, float *y);
/* dx = dy · mask / (1 − p) in training mode (mask from the forward), dx = dy in eval mode.
 * dx may equal dy. */
void ddp_nn_dropout_backward(const float *dy, const uint8_t *mask, size_t n, float p, bool train,
                             float *dx);

/* ---- conv2d ---------------------------------------------------------------------------------- */

/* The geometry of one 2-D convolution (torch.nn.Conv2d with square stride and zero padding, no
 * dilation or groups). Plain data: fill the first part, then ddp_nn_conv2d_setup() checks it
 * and fills the rest. The batch size is passed per call, so the last, smaller batch needs no
 * second geometry. */
typedef struct ddp_nn_conv2d {
    int in_ch, h, w;    /* input (B, in_ch, h, w) */
    int out_ch, kh, kw; /* weight (out_ch, in_ch, kh, kw), bias (out_ch,) */
    int stride, pad;    /* stride ≥ 1, zero padding ≥ 0 on every side */
    /* filled by ddp_nn_conv2d_setup: */
    int out_h, out_w;      /* output (B, out_ch, out_h, out_w) */
    size_t scratch_floats; /* floats of scratch forward and backward need (one im2col matrix) */
} ddp_nn_conv2d;

/* Checks c's first part (every size positive, padding not negative, the kernel fits in the
 * padded input, sizes fit in int) and fills out_h, out_w, scratch_floats. DDP_ERR_INVALID with a
 * message in err (may be NULL) otherwise; c is then left unchanged. */
ddp_status ddp_nn_conv2d_setup(ddp_nn_conv2d *c, ddp_error *err);

/* y (B, out_ch, out_h, out_w) = conv(x (B, in_ch, h, w), W) + b (b may be NULL).
 * scratch: c->scratch_floats floats, the caller's (one buffer may serve every layer: take the
 * largest), contents undefined after the call. It works one sample at a time: im2col into
 * scratch, then one sgemm. c must have passed ddp_nn_conv2d_setup. */
void ddp_nn_conv2d_forward(const ddp_nn_conv2d *c, const float *x, const float *W, const float *b,
                           int B, float *scratch, float *y);

/* Given dy (B, out_ch, out_h, out_w), the forward's x and W: dW (out_ch, in_ch, kh, kw) +=,
 * db (out_ch,) += (NULL skips either), dx (B, in_ch, h, w) overwritten (NULL skips; col2im).
 * scratch as for the forward. */
void ddp_nn_conv2d_backward(const ddp_nn_conv2d *c, const float *dy, const float *x, const float *W,
                            int B, float *scratch, float *dx, float *dW, float *db);

/* ---- maxpool2d ------------------------------------------------------------------------------- */

/* torch.nn.MaxPool2d(kernel, stride) with no padding, no dilation, floor mode:
 * out = (in − kernel) / stride + 1. Plain data like ddp_nn_conv2d. */
typedef struct ddp_nn_pool2d {
    int ch, h, w;       /* input (B, ch, h, w) */
    int kernel, stride; /* square window and step */
    int out_h, out_w;   /* filled by ddp_nn_maxpool2d_setup */
} ddp_nn_pool2d;

/* Checks the geometry (positive sizes, kernel ≤ h and w) and fills out_h, out_w; otherwise
 * DDP_ERR_INVALID with a message in err (may be NULL), p unchanged. */
ddp_status ddp_nn_maxpool2d_setup(ddp_nn_pool2d *p, ddp_error *err);

/* y (B, ch, out_h, out_w) = the window maxima of x (B, ch, h, w); argmax (B, ch, out_h, out_w)
 * receives, for each output, the index of its maximum within its (h, w) plane (row × w + col),
 * the first one on ties and a NaN if there is one, as torch. */
void ddp_nn_maxpool2d_forward(const ddp_nn_pool2d *p, const float *x, int B, float *y,
                              int32_t *argmax);
/* dx (B, ch, h, w) = 0, then dx[argmax] += dy for every output (overlapping windows add). */
void ddp_nn_maxpool2d_backward(const ddp_nn_pool2d *p, const float *dy, const int32_t *argmax,
                               int B, float *dx);

/* ---- batchnorm ------------------------------------------------------------------------------- */

/* torch.nn.BatchNorm1d (x (B, C), hw = 1) and BatchNorm2d (x (B, C, H, W), hw = H·W), affine,
 * with running statistics. Per channel c over the N = B·hw values:
 * train: mean and biased variance of the batch normalise x; then
 *        running_mean = (1 − momentum)·running_mean + momentum·mean,
 *        running_var  = (1 − momentum)·running_var  + momentum·var·N/(N − 1)  (unbiased),
 *        which needs N ≥ 2 (torch refuses N = 1 too);
 * eval:  running_mean and running_var normalise x and are not changed.
 * y = (x − mean) / sqrt(var + eps) · gamma + beta.  torch's defaults: eps 1e-5, momentum 0.1.
 * gamma, beta, running_mean, running_var, save_mean, save_invstd: (C,).
 * save_mean and save_invstd receive the mean and 1/sqrt(var + eps) used (the batch's in train
 * mode, the running ones in eval mode) for the backward.
 * DDP_ERR_INVALID (err may be NULL; nothing written) for train mode with N < 2. */
ddp_status ddp_nn_batchnorm_forward(const float *x, int B, int C, int hw, const float *gamma,
                                    const float *beta, float momentum, float eps, bool train,
                                    float *running_mean, float *running_var, float *y,
                                    float *save_mean, float *save_invstd, ddp_error *err);

/* Given dy (B, C, hw) and the forward's x, gamma, save_mean, save_invstd and mode:
 * dgamma (C,) += Σ dy·x̂, dbeta (C,) += Σ dy (NULL skips either), and dx overwritten (NULL
 * skips): in train mode the full formula through the batch statistics,
 *   dx = gamma·invstd/N · (N·dy − Σdy − x̂·Σ(dy·x̂)),
 * in eval mode dx = dy·gamma·invstd. */
void ddp_nn_batchnorm_backward(const float *dy, const float *x, int B, int C, int hw,
                               const float *gamma, const float *save_mean, const float *save_invstd,
                               bool train, float *dx, float *dgamma, float *dbeta);

/* ---- softmax cross-entropy ------------------------------------------------------------------- */

/* loss = mean over the batch of −log softmax(logits)[label] (torch's F.cross_entropy with
 * reduction 'mean'), computed in double; dlogits (B, C) = (softmax − onehot(label)) · scale / B,
 * where scale is 1 normally and 1/k when k micro-batches accumulate into one step; correct =
 * how many rows have their label as argmax (first index on ties).
 * logits (B, C), labels (B,) int32 in [0, C). dlogits, loss and correct may each be NULL.
 * DDP_ERR_INVALID (err may be NULL; nothing written) if a label is out of range. */
ddp_status ddp_nn_softmax_xent(const float *logits, const int32_t *labels, int B, int C,
                               float scale, double *loss, float *dlogits, int *correct,
                               ddp_error *err);

/* ---- optimizers (torch semantics, flat arrays p, g, state of n floats) ----------------------- */

/* torch.optim.SGD(lr, momentum, weight_decay), dampening 0, no nesterov; step is 1-based:
 *   d = g + weight_decay·p
 *   buf = d on step 1, else momentum·buf + d     (no buf if momentum is 0: buf may be NULL)
 *   p -= lr·buf                                   (lr·d without momentum)
 * g is not modified. The optimizer state is buf (n,), zeroed or not at the start. */
void ddp_nn_sgd_step(float *p, const float *g, float *buf, size_t n, float lr, float momentum,
                     float weight_decay, uint64_t step);

/* torch.optim.AdamW(lr, betas, eps, weight_decay), no amsgrad; step is 1-based (the count of
 * steps taken, this one included):
 *   p *= 1 − lr·wd;  m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²;
 *   p −= lr/(1 − β1^step) · m / (sqrt(v)/sqrt(1 − β2^step) + eps)
 * State m, v (n,) start at zero (the caller zeroes them before step 1). */
void ddp_nn_adamw_step(float *p, const float *g, float *m, float *v, size_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, uint64_t step);

/* torch.nn.utils.clip_grad_norm_(max_norm, norm_type 2): the L2 norm of all n_arrays gradient
 * arrays grads[i] (counts[i] floats) taken together, computed in double; if
 * max_norm / (norm + 1e-6) < 1 every gradient is multiplied by that factor. Returns the norm
 * before clipping (NaN or inf are returned as they are, and then scale the gradients like torch
 * does; check the result with isfinite() to skip such a step). */
double ddp_nn_clip_grad_norm(float *const *grads, const size_t *counts, int n_arrays,
                             double max_norm);
/* The factor clip_grad_norm_ multiplies the gradients by, given their norm: max_norm / (norm +
 * 1e-6) when that is below 1 or NaN, else exactly 1 (no pass needed). For gradients held in
 * pieces, e.g. sharded (ddp_reducer_grad_norm gives the norm). */
float ddp_nn_clip_coef(double norm, double max_norm);

/* ---- initialisation -------------------------------------------------------------------------- */

/* w (n,) ~ U(−bound, bound) from ddp_nn_rand_u64(seed, tensor_id, i): the same on every rank and
 * independent of the order tensors are initialised in. Give every tensor its own tensor_id. */
void ddp_nn_init_uniform(float *w, size_t n, float bound, uint64_t seed, uint64_t tensor_id);

/* torch's default init of nn.Linear and nn.Conv2d weights and biases (kaiming_uniform with
 * a = √5, which is this bound): U(−1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in for linear and
 * in_ch·kh·kw for conv2d. Same numbers distribution as torch, not the same numbers. fan_in 0
 * leaves bound 0 (w = 0). */
void ddp_nn_init_kaiming_uniform(float *w, size_t n, size_t fan_in, uint64_t seed,
                                 uint64_t tensor_id);

/* ==== transformer layers (GPT-2) ============================================================== */
/*
 * The layers nanoGPT's GPT is built from, forward and backward, matching torch 1.13's CPU modules
 * to float rounding (tests/python/test_transformer_torch.py states the tolerances). The model
 * composes them; this section keeps no model state.
 * Names of sizes: B batch, T sequence length (≤ block_size), C channels (n_embd), nh heads,
 * hs = C / nh, V vocabulary; N = B·T when a layer sees the (B, T, C) activations as N rows of C.
 * Token ids and targets are int32. The section-wide conventions at the top of this file hold
 * (dx overwritten, parameter gradients accumulated, no overlap unless stated).
 */

/* ---- token and position embedding ------------------------------------------------------------ */

/* x (B, T, C) = wte[idx] + wpe[t]: idx (B, T) token ids in [0, V), wte (V, C), wpe (n_pos, C).
 * DDP_ERR_INVALID, nothing written and a one-line message in err (may be NULL) naming the id, its
 * (row, position) and vocab_size, if an id is out of range; likewise if T > n_pos. */
ddp_status ddp_nn_embedding_forward(const int32_t *idx, const float *wte, const float *wpe, int B,
                                    int T, int C, int V, int n_pos, float *x, ddp_error *err);
/* dwte[idx[b, t]] += dx[b, t] and dwpe[t] += dx[b, t] for every (b, t), in that order (so the
 * sums are the same bits on every run). dx (B, T, C); idx as accepted by the forward (not checked
 * again); dwte (V, C), dwpe (n_pos, C), either may be NULL to skip it. With a tied LM head dwte
 * also receives ddp_nn_lm_head_backward's gradient: the two simply add. */
void ddp_nn_embedding_backward(const float *dx, const int32_t *idx, int B, int T, int C,
                               float *dwte, float *dwpe);

/* ---- layernorm ------------------------------------------------------------------------------- */

/* torch.nn.LayerNorm(C, eps, bias) over the last dimension of x (N, C):
 * y = (x − mean) · rstd · weight + bias, rstd = 1/sqrt(biased var + eps) (nanoGPT and torch use
 * eps 1e-5). weight (C,); bias (C,) or NULL (nanoGPT's bias=False). The row statistics are
 * computed in double; mean (N,) and rstd (N,) receive them for the backward, or are NULL (eval).
 * y must not overlap x. */
void ddp_nn_layernorm_forward(const float *x, const float *weight, const float *bias, int N, int C,
                              float eps, float *y, float *mean, float *rstd);
/* Given dy (N, C) and the forward's x, weight, mean, rstd: dx (N, C) overwritten (NULL skips; dx
 * may equal dy), dweight (C,) += Σ_rows dy·x̂, dbias (C,) += Σ_rows dy (NULL skips either). */
void ddp_nn_layernorm_backward(const float *dy, const float *x, const float *weight,
                               const float *mean, const float *rstd, int N, int C, float *dx,
                               float *dweight, float *dbias);

/* ---- GELU, tanh approximation (GPT-2's) ------------------------------------------------------ */

/* y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))), torch.nn.GELU(approximate='tanh'), computed as
 * x·σ(2u) with a vectorised exp (within a few float ulps). y may equal x. */
void ddp_nn_gelu_tanh_forward(const float *x, size_t n, float *y);
/* dx = dy · gelu'(x), x the forward's input. dx may equal dy. */
void ddp_nn_gelu_tanh_backward(const float *dy, const float *x, size_t n, float *dx);

/* ---- residual add ---------------------------------------------------------------------------- */

/* y (n,) = a + b. y may equal a or b (in place). The residual's forward, and its backward too:
 * the gradient of x + f(x) is dy + (f's backward of dy), one more add. */
void ddp_nn_add(const float *a, const float *b, size_t n, float *y);

/* ---- causal self-attention ------------------------------------------------------------------- */

/* Query rows per block of the attention kernels (see scratch_floats). */
#define DDP_NN_ATTN_BLOCK 64

/* The geometry of one causal multi-head self-attention (nanoGPT's CausalSelfAttention between
 * c_attn and c_proj). Plain data: fill the first part, then ddp_nn_attention_setup() checks it and
 * fills the rest. One geometry serves every layer of a model. */
typedef struct ddp_nn_attention {
    int C;         /* n_embd: qkv (B, T, 3C), out (B, T, C) */
    int n_head;    /* nh, which must divide C */
    int max_T;     /* block_size: the longest T the calls will pass (sizes the scratch) */
    float dropout; /* p of the dropout on the attention probabilities, [0, 1); 0 for none */
    /* filled by ddp_nn_attention_setup: */
    int head_size;         /* hs = C / nh */
    size_t scratch_floats; /* what forward and backward need: the larger of
                            * (3·DDP_NN_ATTN_BLOCK + 1)·max_T + 2·max_T·head_size and, for
                            * the fused bf16 kernels, (3.5·DDP_NN_ATTN_BLOCK + 1)·Tp +
                            * 5·Tp·head_size with Tp = max_T rounded up to 16 */
} ddp_nn_attention;

/* Checks a's first part (positive sizes, n_head divides C, 3C fits in int, dropout in [0, 1)) and
 * fills head_size and scratch_floats; DDP_ERR_INVALID with a message in err (may be NULL)
 * otherwise, a unchanged. */
ddp_status ddp_nn_attention_setup(ddp_nn_attention *a, ddp_error *err);

/* out (B, T, C) = causal softmax(q·kᵀ/√hs) · v for every head, heads side by side (head h in
 * columns h·hs ..) as nanoGPT's y.transpose(1, 2).view(B, T, C), before c_proj.
 * qkv (B, T, 3C): c_attn's output, q, k, v in that order along the last dimension and each split
 * into heads of hs as view(B, T, nh, hs).transpose(1, 2) does. 0 < T ≤ a->max_T.
 * lse (B, nh, T) receives the log-sum-exp of each query row's scaled scores, all the backward
 * needs besides qkv (no T×T probabilities are kept); NULL when no backward follows.
 * Dropout (train and a->dropout > 0): query row (b, h, t) has the key
 * k = ddp_nn_rand_u64(seed, step, offset + (b·nh + h)·T + t), and its probability j is kept,
 * and scaled by 1/(1 − p), iff fmix32(hi(k) ^ (lo(k) + j·0x9e3779b9)) ≥ p·2³² (32-bit
 * arithmetic; fmix32 is MurmurHash3's finaliser: x ^= x >> 16; x *= 0x85ebca6b; x ^= x >> 13;
 * x *= 0xc2b2ae35; x ^= x >> 16). No mask is stored: the backward regenerates it from the same
 * (seed, step, offset), which must be passed unchanged. Use a seed per layer, and
 * offset = (global index of the first sequence)·nh·T to make the masks independent of how the
 * batch is split over ranks. train false, or p 0, is plain attention.
 * scratch: a->scratch_floats floats, the caller's (one buffer may serve every layer), contents
 * undefined after the call. */
void ddp_nn_attention_forward(const ddp_nn_attention *a, const float *qkv, int B, int T,
                              uint64_t seed, uint64_t step, uint64_t offset, bool train,
                              float *scratch, float *out, float *lse);

/* Generation with a key/value cache: the output rows of query positions t0 … T − 1 of ONE
 * sequence, out (T − t0, C), from qkv (T, 3C), c_attn's output for positions 0 … T − 1 (the rows
 * before t0 kept from earlier calls: their keys and values). The same causal softmax as
 * ddp_nn_attention_forward, without dropout or lse, row by row: O(T·C) per new position instead
 * of the O(T²·C) of recomputing every row. 0 ≤ t0 < T ≤ a->max_T (else nothing is written).
 * scratch: a->scratch_floats floats, as for the forward. */
void ddp_nn_attention_forward_cached(const ddp_nn_attention *a, const float *qkv, int t0, int T,
                                     float *scratch, float *out);

/* Given dout (B, T, C), the forward's qkv and lse and the same (seed, step, offset, train):
 * dqkv (B, T, 3C) overwritten with the gradients of q, k and v. The scores and probabilities are
 * recomputed block by block from qkv and lse (flash-attention style): the backward costs about
 * twice the forward's products. scratch as for the forward. */
void ddp_nn_attention_backward(const ddp_nn_attention *a, const float *dout, const float *qkv,
                               const float *lse, int B, int T, uint64_t seed, uint64_t step,
                               uint64_t offset, bool train, float *scratch, float *dqkv);

/* ---- tied LM head ---------------------------------------------------------------------------- */

/* logits (N, V) = x (N, C) · wteᵀ, wte (V, C) the token embedding (GPT-2 ties them): a linear
 * without bias, written without zeroing logits first. */
void ddp_nn_lm_head_forward(const float *x, const float *wte, int N, int C, int V, float *logits);
/* dx (N, C) = dlogits · wte (overwritten; NULL skips), dwte (V, C) += dlogitsᵀ · x (NULL skips). */
void ddp_nn_lm_head_backward(const float *dlogits, const float *x, const float *wte, int N, int C,
                             int V, float *dx, float *dwte);

/* ---- softmax cross-entropy over a vocabulary ------------------------------------------------- */

/* The target that contributes nothing (nanoGPT passes ignore_index=-1 to F.cross_entropy; torch's
 * default is -100). */
#define DDP_NN_IGNORE_INDEX (-1)

/* loss = mean over the rows whose target is not DDP_NN_IGNORE_INDEX of
 * −log softmax(logits[r])[target[r]] (F.cross_entropy(..., ignore_index=-1)); NaN when every
 * target is ignored (torch's 0/0). dlogits (N, V) = (softmax − onehot(target)) · scale / count
 * for those rows and 0 for ignored ones (scale 1, or 1/k when k micro-batches accumulate).
 * dlogits MAY EQUAL logits (the biggest activation is then overwritten by its gradient).
 * logits (N, V), targets (N,) in [0, V) or DDP_NN_IGNORE_INDEX. loss and dlogits may each be
 * NULL. Numerically stable (max subtracted; sums in double). DDP_ERR_INVALID (err may be NULL;
 * nothing written) if a target is out of range. */
ddp_status ddp_nn_vocab_xent(const float *logits, const int32_t *targets, int N, int V, float scale,
                             double *loss, float *dlogits, ddp_error *err);
/* For exact evaluation: loss_sum = Σ over non-ignored rows of the row's loss (in double),
 * count = how many rows that is, row_loss (N,) = each row's loss (0 for ignored rows). Sum
 * loss_sum and count over batches and ranks, then divide. Each output may be NULL. Errors as
 * ddp_nn_vocab_xent. */
ddp_status ddp_nn_vocab_xent_sum(const float *logits, const int32_t *targets, int N, int V,
                                 double *loss_sum, int *count, float *row_loss, ddp_error *err);

/* ---- GPT-2 initialisation -------------------------------------------------------------------- */

/* w (n,) ~ N(0, std²) from ddp_nn_rand_u64(seed, tensor_id, i) (Box–Muller), the same on every
 * rank and independent of the order tensors are initialised in. nanoGPT: std 0.02 for linear
 * weights and embeddings, 0.02/√(2·n_layer) for the c_proj weights, biases 0, layernorm weight 1.
 * Same distribution as torch.nn.init.normal_, not the same numbers. */
void ddp_nn_init_normal(float *w, size_t n, float std, uint64_t seed, uint64_t tensor_id);
/* ==== end of transformer layers =============================================================== */

#ifdef __cplusplus
}
#endif
#endif /* DDP_NN_H */
