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

#ifdef __cplusplus
}
#endif
#endif /* DDP_NN_H */
