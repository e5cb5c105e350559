/*
 * kernels/kernels.h — the compute kernels the layers (src/nn) and the reductions (src/group) are
 * built from, behind one set of signatures. The CPU implementations live in kernels/cpu (OpenBLAS
 * and vectorised loops); CUDA implementations will live in kernels/cuda with the same contracts
 * on device buffers. Names are ddp__ (internal, not part of the public API).
 *
 * Conventions: buffers are host memory (DDP_DEVICE_CPU) and borrowed for the call; element
 * types are ddp_dtype (ddp/tensor.h); counts are elements. Matrix kernels: float32, row-major,
 * dimensions non-negative ints (OpenBLAS takes int); a dimension of 0 makes a kernel a no-op
 * apart from the beta scaling it documents. No kernel starts threads of its own.
 * Element-at-a-time helpers that CUDA code shares live in util/half.h and util/rng.h.
 */
#ifndef DDP_KERNELS_H
#define DDP_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/device.h"
#include "ddp/status.h"
#include "ddp/tensor.h"

/* C (M, N) = alpha · op(A) · op(B) + beta · C, row-major, where op(A) is (M, K) — A itself (M, K)
 * with leading dimension lda, or Aᵀ when trans_a, A then stored (K, M) — and op(B) is (K, N)
 * likewise. beta = 0 overwrites C (its old contents, even NaN, are ignored). Borrows every
 * buffer for the call; C must not overlap A or B. Threads: OpenBLAS's own (OPENBLAS_NUM_THREADS).
 */
/* OpenBLAS's thread count from now on (ddp_world_default_threads). */
void ddp__blas_set_threads(int n);

void ddp__sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                int lda, const float *B, int ldb, float beta, float *C, int ldc);

/* ---- the arithmetic of ddp__sgemm (cpu/onednn.c) ----------------------------------------------
 * Per thread: DDP__GEMM_FP32 (the default: OpenBLAS, float32 throughout) or DDP__GEMM_BF16 (both
 * operands rounded to bfloat16, nearest even, float32 accumulation and result: oneDNN's bf16
 * matmul, on CPUs with AVX512_BF16 or AMX). A model sets it around its forward and backward
 * (precision bf16); the same contract as ddp__sgemm otherwise. */
typedef enum ddp__gemm_kind { DDP__GEMM_FP32 = 0, DDP__GEMM_BF16 } ddp__gemm_kind;
/* Sets the calling thread's kind; returns the previous one (to restore). */
ddp__gemm_kind ddp__gemm_set_kind(ddp__gemm_kind k);
ddp__gemm_kind ddp__gemm_get_kind(void);
/* DDP_OK when bf16 products can run here: oneDNN loads (libdnnl.so.2, or the file
 * DDP_ONEDNN_LIB names) and picks a bf16-unit implementation on this CPU. DDP_ERR_NOT_FOUND with
 * the reason and what to do otherwise. Loads the library on the first call; thread-safe. */
ddp_status ddp__gemm_bf16_check(ddp_error *err);
/* One product in bf16 as above; false (nothing written) when it cannot run — not loadable, out of
 * memory, a oneDNN error — and the caller computes it in float32 instead. */
bool ddp__gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* How many bf16 products did not run in oneDNN in this process (0 in a healthy run): fell back
 * to float32 (ddp__gemm_bf16) or to a plain loop on the bf16 operands (ddp__gemm_bf16_pre). */
unsigned long ddp__gemm_bf16_fallbacks(void);
/* How many bf16 products were asked for in this process (ddp__sgemm handing one to
 * ddp__gemm_bf16, cpu/gemm.c, and ddp__gemm_bf16_pre): the
 * whole of which ddp__gemm_bf16_fallbacks counts a part. Any thread. */
unsigned long ddp__gemm_bf16_products(void);
/* True when the calling thread is set to bf16 products and they can run here (the check above
 * passes): a layer may then keep its own operands in bfloat16 and call ddp__gemm_bf16_pre. */
bool ddp__gemm_bf16_active(void);
/* dst[i] = src[i] rounded to bfloat16 (nearest even; inputs below 2^-126 in magnitude become
 * zero of their sign, as the bf16 units' conversion does), for i < n: the operands
 * ddp__gemm_bf16 would make; on any CPU (without the units, the same bits by a loop). */
void ddp__bf16_round(uint16_t *dst, const float *src, int n);
/* The rows × cols matrix src (leading dimension ld) rounded as ddp__bf16_round does, packed
 * (leading dimension cols) into the calling thread's buffer number slot (< DDP__BF16_SLOTS),
 * which stays valid until that slot is used again on this thread; NULL when bf16 products cannot
 * run here or memory is short (the caller then uses ddp__sgemm). For an operand that serves two
 * products (a linear layer's dy in its backward). */
enum { DDP__BF16_SLOTS = 3 };
const uint16_t *ddp__bf16_rounded(int slot, const float *src, int rows, int cols, int ld);
/* The bf16 product on operands already in bfloat16, each as stored: A (M, K) with leading
 * dimension lda, or (K, M) when trans_a; B (K, N) with ldb, or (N, K) when trans_b. For a layer
 * that rounds an operand once and uses it in several products (attention). Always computes:
 * should oneDNN fail, a plain loop does (counted in ddp__gemm_bf16_fallbacks). */
void ddp__gemm_bf16_pre(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                        float *C, int ldc);

/* ---- bf16 dot products (cpu/bf16dot.c): the fused attention's products ------------------------
 * AVX512_BF16 kernels: call only when ddp__gemm_bf16_active() (which has checked the CPU) and
 * ddp__bf16_dot_available() (x86-64). bfloat16 operands, float32 accumulation in a fixed order.
 * cols (the head size) is a multiple of 16 and every leading dimension of bfloat16 rows is even. */
bool ddp__bf16_dot_available(void);
/* Rows 0..n−1 of X (n × cols bfloat16, leading dimension ld) as tiles of 16 rows for
 * ddp__bf16_scores: dst[((t·cols/2 + p)·16 + k)·2 + e] = X[t·16 + k][2p + e], rows ≥ n as 0;
 * dst holds ⌈n/16⌉·16·cols halves. */
void ddp__bf16_pack_tiles(uint16_t *dst, const uint16_t *X, int n, int cols, int ld);
/* Rows of X in interleaved pairs for ddp__bf16_pairs' Bp: dst[((i/2)·cols + c)·2 + i%2] =
 * X[i][c], a missing odd last row as 0; dst holds ⌈n/2⌉·2·cols halves. */
void ddp__bf16_pack_pairs(uint16_t *dst, const uint16_t *X, int n, int cols, int ld);
/* Two float32 rows rounded (as ddp__bf16_round) and interleaved: dst[2j] = a[j], dst[2j + 1] =
 * b[j] (0 when b is NULL), j < n. */
void ddp__bf16_pair_rows(uint16_t *dst, const float *a, const float *b, int n);
/* The fused attention's softmax of one row of scores s (n visible, the block kend wide): with
 * mx = max_{j<n} s_j, e_j = exp(s_j − mx); dst[j] = e_j·mrow[j] (mrow NULL: 1) rounded for
 * j < n, 0 up to kend rounded up to even; *mx_out = mx; returns Σ_{j<n} e_j. */
float ddp__bf16_softmax_row(uint16_t *dst, const float *s, int n, int kend, const float *mrow,
                            float *mx_out);
/* Its backward: on entry prow holds the scores s_j, drow the gradient of the dropped
 * probabilities; with p_j = exp(s_j − lse), g_j = drow_j·mrow_j, D = Σ_{j<n} p_j·g_j:
 * drow ← dS_j = p_j·(g_j − D), prow ← p_j·mrow_j, dsh ← dS rounded, all 0 for n ≤ j < kend
 * (dsh up to kend rounded up to even). */
void ddp__bf16_softmax_backward_row(float *prow, float *drow, int n, int kend, float lse,
                                    const float *mrow, uint16_t *dsh);
/* Causal scores: for local row i < m (global row t0 + i) S[i][j] = alpha · Σ_d X[i][d]·Y[j][d]
 * with Yt = ddp__bf16_pack_tiles(Y), for the tiles of 16 columns j up to the tile holding the
 * last row of i's group of 4 (at least every j ≤ t0 + i); S's columns beyond are not written. */
void ddp__bf16_scores(int m, int t0, int cols, float alpha, const uint16_t *X, int ldx,
                      const uint16_t *Yt, float *S, int lds);
/* Which pairs ddp__bf16_pairs reduces over for local row i. Rows go in groups of 4 sharing the
 * group's widest range, so A must hold 0 (not garbage: 0 × NaN is NaN) wherever a row's own
 * range ends before the group's:
 * ALL: [0, np); LOWER: pairs p with 2p ≤ l + off, l the group's last row (A's row i is a query
 * at i + off whose pairs are keys: 0 for keys past the query, up to key 2·⌊(l + off)/2⌋ + 1);
 * UPPER: pairs p with 2p + 1 ≥ f + off, f the group's first row (row i a key, pairs queries:
 * 0 for queries before the key). */
typedef enum ddp__bf16_causal { DDP__BF16_ALL, DDP__BF16_LOWER, DDP__BF16_UPPER } ddp__bf16_causal;
/* out (m × cols, leading dimension ldo) = alpha · rowscale[i] · Σ_p A_p[i]·Bp[p] (+ out when
 * add): A's pair p of row i is the two halves at A + 2·(i·ars + p·aps) (row-major bfloat16 rows:
 * ars = ld/2, aps = 1; ddp__bf16_pair_rows' interleaved rows: ars = 1, aps = their stride/2);
 * Bp = ddp__bf16_pack_pairs(B) with np pairs. rowscale NULL: 1. */
void ddp__bf16_pairs(int m, int cols, int np, ddp__bf16_causal mode, int off, const uint16_t *A,
                     size_t ars, size_t aps, const uint16_t *Bp, float alpha, const float *rowscale,
                     bool add, float *out, int ldo);

/* ---- elementwise reductions (cpu/reduce.c) --------------------------------------------------
 * In the dtype's arithmetic: bfloat16 and float16 widened to float32 and rounded once per element
 * (nearest even); integer sums and products wrap; min and max as a < b. DDP_AVG reduces as
 * DDP_SUM: the division is ddp__scale_avg's (or ddp__reduce_many_avg's divisor). An invalid dtype
 * or op leaves dst as it was. Inputs are distinct buffers; dst may be the same pointer as one of
 * them (in place) but must not otherwise overlap any. */

/* dst[i] = op over j < k of srcs[j][i], for i < n (k ≥ 1; k = 1 copies). One pass over memory. */
void ddp__reduce_many(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t, ddp_op op);
/* ddp__reduce_many, then each result divided by divisor when divisor > 1 (AVG, run as SUM): in
 * the same pass for two float32/float64 inputs, with the same roundings as the two passes;
 * bfloat16/float16 summed and divided in float32 and rounded once (not the sum, then the
 * quotient). */
void ddp__reduce_many_avg(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t,
                          ddp_op op, int divisor);
/* dst[i] = a[i] op b[i]. */
void ddp__reduce2(void *dst, const void *a, const void *b, size_t n, ddp_dtype t, ddp_op op);
/* dst[i] = dst[i] op src[i]. */
void ddp__reduce_into(void *dst, const void *src, size_t n, ddp_dtype t, ddp_op op);
/* buf[i] /= divisor (after a SUM, for AVG): floats divide (as torch does, not by a reciprocal),
 * bfloat16/float16 through float32, integers truncate toward zero. A no-op for divisor ≤ 1. */
void ddp__scale_avg(void *buf, size_t n, ddp_dtype t, int divisor);

/* ---- conversions (cpu/reduce.c) ------------------------------------------------------------
 * n elements between float32 and t (DDP_BFLOAT16 or DDP_FLOAT16, or DDP_FLOAT32: a copy; other
 * dtypes leave dst as it was). Widening is exact; narrowing rounds to nearest even. dst and src
 * must not overlap. */
void ddp__to_f32(float *dst, const void *src, size_t n, ddp_dtype t);
void ddp__from_f32(void *dst, const float *src, size_t n, ddp_dtype t);
/* The sum of the squares of n elements of dtype t (float32, float64, bfloat16, float16; other
 * dtypes count as float16), each term and the sum in double — float32 in eight interleaved
 * lanes (element i into lane i mod 8, lanes added pairwise at the end), the others in order; the
 * same bits for the same array on every machine: the reducer's gradient norm, and the fake GPU's
 * (staged/fakedev.c). */
double ddp__sum_squares(const void *v, size_t n, ddp_dtype t);

/* ---- copies with a chosen kind of store (cpu/copy.c) ----------------------------------------
 * bytes from src to dst, which must not overlap; any alignment. ddp__copy_cached uses ordinary
 * stores only (the result stays in cache), ddp__copy_stream non-temporal ones for the whole
 * 64-byte lines of dst, fenced before it returns (the result goes to memory, bypassing the
 * caches). memcpy's own choice between the two depends on the C library's view of the caches. */
void ddp__copy_cached(void *dst, const void *src, size_t bytes);
void ddp__copy_stream(void *dst, const void *src, size_t bytes);

/* ---- CUDA (cuda/device.cu in the GPU module, through kernels/gpu.c; gpu_module.h) -----------
 * Only src/kernels/cuda includes CUDA headers: these signatures are plain C. */

/* The number of CUDA devices this process can use (≥ 1) into *n. DDP_ERR_NOT_FOUND when there
 * is none: no GPU, no or too old a driver, or a build without CUDA (the message says which);
 * DDP_ERR_SYSTEM for any other CUDA error; DDP_ERR_INVALID when n is NULL. Thread-safe. */
ddp_status ddp__cuda_device_count(int *n, ddp_error *err);

/* The name of CUDA device idx as the driver gives it ("NVIDIA H100 80GB HBM3"), NUL-terminated
 * and truncated to cap bytes, into name (written only on DDP_OK). DDP_ERR_NOT_FOUND as above,
 * DDP_ERR_INVALID for a bad idx or buffer. Thread-safe. */
ddp_status ddp__cuda_device_name(int idx, char *name, size_t cap, ddp_error *err);

/* Device idx's memory: *used = bytes in use by every process on it (total − free, as
 * cudaMemGetInfo and nvidia-smi count them: the CUDA contexts, the libraries' workspaces and
 * NCCL's buffers included), *total its size. Errors as device_name's. */
ddp_status ddp__cuda_mem_info(int idx, size_t *used, size_t *total, ddp_error *err);

/* ---- the GPT on a CUDA device (cuda/gpt.cu in the GPU module, through kernels/gpu.c) ---------
 * The forward and backward of src/nn/gpt.c's model on the device, for gpt.c's "cuda" device.
 * Parameters live on the device in one flat fp32 buffer, in the CPU model's parameter order and
 * sizes (ddp/model.h's list; each tensor padded to 256 bytes there), and are uploaded from the
 * model's host values before each forward (the host optimizer and reducer own them); gradients
 * are computed on the device and added (+=) into the host gradients at the end of backward.
 * Dropout with src/nn/gpt.c's masks; precision fp32, tf32, bf16 or fp16 (bf16/fp16 products and
 * activations, fp32 residual stream, statistics, loss and masters: docs/gpu.md's table; fp16 with
 * the host's loss scale as forward's grad_scale). UNVERIFIED: not yet run on a GPU (docs/gpu.md).
 */
typedef struct ddp__cuda_gpt ddp__cuda_gpt;
typedef struct ddp__cuda_gpt_cfg {
    int L, nh, C, Tmax, V, B; /* n_layer, n_head, n_embd, block_size, vocab_size, max_batch */
    bool bias;
    int device;              /* the CUDA device index */
    ddp_precision precision; /* DDP_PRECISION_FP32, _TF32, _BF16 or _FP16 */
    float dropout;           /* p, [0, 1): src/nn/gpt.c's dropouts, with its masks */
    uint64_t seed;           /* the model's seed: the dropout layers' seeds follow gpt.c */
} ddp__cuda_gpt_cfg;

/* counts (n,): the model's parameter sizes, in its order (checked against cfg's shapes). */
ddp_status ddp__cuda_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                                ddp__cuda_gpt **out, ddp_error *err);
void ddp__cuda_gpt_free(ddp__cuda_gpt *g); /* NULL is a no-op */
/* Uploads parameter i from data_host[i] (counts as at create), every i. */
ddp_status ddp__cuda_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host,
                                    ddp_error *err);
/* Forward of n sequences of T tokens (host arrays, checked by the caller). With targets: the
 * per-row losses' sum (double) into *loss_sum, the counted rows into *count, the rows whose
 * argmax is the target into *correct, and with train the loss's gradient kept for backward
 * (scaled by grad_scale / count, as ddp_nn_vocab_xent). Without train, logits_host (rows, V),
 * when not NULL, receives the logits: rows n·T, or n with last_logits and no targets (each
 * sequence's last position). step and sample_offset are the batch's (ddp_model_batch): with
 * train and cfg.dropout > 0 they pick the dropout masks, as on the CPU. */
ddp_status ddp__cuda_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets,
                                 int n, int T, bool train, bool last_logits, float grad_scale,
                                 uint64_t step, uint64_t sample_offset, double *loss_sum,
                                 int *count, int64_t *correct, float *logits_host, ddp_error *err);
/* Generation's key/value cache: the logits (V,) of position T − 1 of the one sequence tokens[0 …
 * T) into logits_host (when not NULL), as ddp__cuda_gpt_forward with n 1 and last_logits, where
 * the first past positions are those of the previous forward (its tokens, the caller's to know):
 * their keys and values (each block's c_attn output) are reused, only positions past … T − 1
 * computed. The parameters must not have changed since that forward (no upload is made; the
 * 16-bit weights are not rounded again). DDP_ERR_NOT_FOUND, nothing done, where the device
 * cannot reuse them — the last forward was a batch or had dropout, this module changed the
 * parameters since (an upload, an optimizer step, a bind; writes into its device parameters by
 * others, e.g. a broadcast into ddp_model_device_param, are not seen), more than 64 positions
 * are new — or the module lacks the cache: the caller then runs the whole forward (with its
 * upload). 0 ≤ past < T ≤ block_size. */
ddp_status ddp__cuda_gpt_forward_cached(ddp__cuda_gpt *g, const int32_t *tokens, int T, int past,
                                        float *logits_host, ddp_error *err);
/* Backward of the last training forward: grads_host[i] += the gradient of parameter i. */
ddp_status ddp__cuda_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host, ddp_error *err);

/* Device-resident training (ddp_model_resident; docs/gpu.md): the parameters stay on the device,
 * where the reducer's buckets and the optimizer's state are too. UNVERIFIED, as above.
 * dev_info: params_dev[i] = parameter i's values in the device's flat buffer (n as at create);
 * *stream = the model's cudaStream_t, on which all of its work runs. get_params: the reverse of
 * set_params (waits). backward_dev: as backward, but the gradient kernels add straight into
 * grads_dev[i] (device memory, e.g. a view into a reducer bucket; not zeroed: they accumulate),
 * on the model's stream, and ready(ctx, i) (may be NULL) is called on this thread as soon as
 * parameter i's kernels are queued — every parameter once, the reverse of the list's order but
 * for wte last — so its allreduce, ordered after the stream, overlaps the rest; an error from
 * ready ends the backward with it. */
ddp_status ddp__cuda_gpt_dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream,
                                  ddp_error *err);
ddp_status ddp__cuda_gpt_get_params(ddp__cuda_gpt *g, float *const *data_host, ddp_error *err);
ddp_status ddp__cuda_gpt_backward_dev(ddp__cuda_gpt *g, float *const *grads_dev,
                                      ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                      ddp_error *err);
/* The optimizer on the device: optim_init asks for nstates state buffers laid out like the
 * parameters, zeroed (made at their first use, as torch's AdamW makes its moments at the first
 * step, so that optim_keep can narrow them before any exists); optim_step updates elements [lo, hi)
 * of parameter i from its gradient grad_dev (element 0 of the parameter) as ddp_optim_step_range
 * does (ddp_nn_adamw_step or ddp_nn_sgd_step; the gradient multiplied by grad_scale first, but not
 * in place); optim_state copies state s of every parameter to (to_host) or from the host arrays
 * host[i]. */
typedef struct ddp__cuda_optim_args {
    bool adamw;            /* else sgd */
    size_t i, lo, hi;      /* parameter i, elements [lo, hi) */
    const float *grad_dev; /* (count,) its gradient on the device */
    uint64_t step;         /* 1-based */
    float lr, grad_scale, momentum, beta1, beta2, eps;
    float weight_decay; /* 0 where the parameter has no decay */
} ddp__cuda_optim_args;
ddp_status ddp__cuda_gpt_optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err);
ddp_status ddp__cuda_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a,
                                    ddp_error *err);
ddp_status ddp__cuda_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *host, bool to_host,
                                     ddp_error *err);
/* The sharded optimizer step (the reducer's shard_optimizer on a GPU group). bind_params: from
 * now on parameter i's values are params_dev[i] (device memory of counts[i] floats holding the
 * current values, e.g. the reducer's parameter views, which its allgather fills; the caller
 * keeps them alive while bound): the forward, backward, optimizer and get/set_params use them,
 * and dev_info reports them. params_dev NULL: their values are copied back into the model's own
 * buffer (waits), which is used again. state_dev: dev[i] = state s of parameter i in the
 * device's buffer (laid out like the parameters), for the reducer's gather of a sharded state. */
ddp_status ddp__cuda_gpt_bind_params(ddp__cuda_gpt *g, float *const *params_dev, ddp_error *err);
ddp_status ddp__cuda_gpt_state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err);
/* ZeRO-1's memory split on the device (ddp_optim_keep's contract): after optim_init, the state
 * of parameter i keeps its elements [lo[i], hi[i]) only (a range can only narrow; the values
 * kept, the rest freed): optim_step refuses other elements, optim_state copies the kept elements
 * (host[i] holds hi[i] - lo[i] floats) and state_dev gives where they start (element lo[i]).
 * A failure (a wider range, out of device memory) changes nothing. */
ddp_status ddp__cuda_gpt_optim_keep(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi,
                                    ddp_error *err);

/* ---- the MLP and the CNN on a CUDA device (cuda/classifier.cu, through kernels/gpu.c) ---------
 * src/nn/classifier.c's models (types "mlp" and "cnn") on the device, for its "cuda" device: the
 * same layer list, run in the same order, with the same flat parameter list (parameters and
 * gradients fp32 on the device in the model's order and sizes, each tensor padded to 256 bytes
 * there, as the GPT's) and the batchnorms' running statistics as buffers. The host keeps the
 * parameters, gradients and buffers: ddp__cuda_cls_upload puts them on the device before each
 * forward, a training forward's running statistics come back with ddp__cuda_cls_get_buffers, and
 * backward adds the gradients into the host's. Linear layers through cuBLASLt (TF32 with
 * precision tf32), conv2d and batchnorm through cuDNN's legacy API, max-pool, the activations,
 * dropout and the loss by kernels of this module. Precision fp32, tf32, bf16 or fp16 (bf16/fp16:
 * 16-bit operands into the linear layers and convolutions with fp32 accumulation, a 16-bit copy
 * of the weights made at each upload, everything else fp32; fp16's loss scale is the batch's
 * grad_scale; cuda/classifier.cu's header has the details). A module built without cuDNN has no
 * classifier (the calls say so). UNVERIFIED: not yet run on a GPU (docs/gpu.md). */
typedef struct ddp__cuda_cls ddp__cuda_cls;
typedef enum ddp__cuda_cls_kind {
    DDP__CLS_LINEAR = 0, /* y (B, out) = x (B, in) · Wᵀ + b; params W (out, in), b (out,) */
    DDP__CLS_RELU,
    DDP__CLS_GELU,    /* exact (erf) GELU, ddp_nn_gelu_forward */
    DDP__CLS_DROPOUT, /* ddp_nn_dropout_forward, keyed (seed + layer index, step, offset) */
    DDP__CLS_CONV,    /* ddp_nn_conv2d; params W (out_ch, in_ch, kh, kw), b (out_ch,) */
    DDP__CLS_BN,      /* ddp_nn_batchnorm over (B, C, hw); params gamma, beta; 2 buffers */
    DDP__CLS_POOL,    /* ddp_nn_maxpool2d: in_ch planes h × w, window kh (= kw), stride */
} ddp__cuda_cls_kind;
typedef struct ddp__cuda_cls_layer {
    int kind;           /* ddp__cuda_cls_kind */
    size_t in_n, out_n; /* floats per sample in and out */
    int p0;             /* its first parameter's index (a second one follows), −1: none */
    int buf0;           /* batchnorm: running mean is buffer buf0, running var buf0 + 1 */
    int in, out;        /* linear */
    int in_ch, h, w, out_ch, kh, kw, stride, pad, out_h, out_w; /* conv; pool (in_ch, h, w,
                                                                    kh, stride, out_h, out_w) */
    int C, hw; /* batchnorm: channels, positions per channel */
    float p;   /* dropout */
} ddp__cuda_cls_layer;
typedef struct ddp__cuda_cls_cfg {
    const ddp__cuda_cls_layer *layers; /* (nl,) in forward order; copied by create */
    int nl;
    int B;       /* max_batch */
    size_t in_n; /* floats per input sample */
    int classes;
    uint64_t seed; /* dropout keys (spec.seed) */
    float bn_momentum, bn_eps;
    int device;              /* the CUDA device index */
    ddp_precision precision; /* DDP_PRECISION_FP32, _TF32, _BF16 or _FP16 */
} ddp__cuda_cls_cfg;
/* One forward's batch: host arrays, checked by the caller (labels in range, n ≤ B, batchnorm's
 * 2 values per channel in training). */
typedef struct ddp__cuda_cls_batch {
    const float *x;        /* (n, in_n) */
    const int32_t *labels; /* (n,) or NULL: no loss */
    int n;
    bool train;
    uint64_t step, sample_offset; /* dropout keys, as ddp_model_batch */
    uint64_t sample_stride;       /* as ddp_model_batch (0: 1) */
    float grad_scale;             /* the loss's gradient is scaled by grad_scale / n (fp16: the
                                     loss scale; 0 means 1) */
} ddp__cuda_cls_batch;

/* counts (np,) the parameters' sizes and bcounts (nb,) the buffers', in the model's order,
 * checked against the layers. */
ddp_status ddp__cuda_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts, size_t np,
                                const size_t *bcounts, size_t nb, ddp__cuda_cls **out,
                                ddp_error *err);
void ddp__cuda_cls_free(ddp__cuda_cls *g); /* NULL is a no-op */
/* Uploads every parameter i from params_host[i] and every buffer j from buffers_host[j]. */
ddp_status ddp__cuda_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                                const float *const *buffers_host, ddp_error *err);
/* Forward of b. logits_host (n, classes) receives the logits (always). With labels: the sum of
 * the per-sample losses (double) into *loss_sum and the samples whose argmax (first on ties) is
 * their label into *correct; with train, the loss's gradient kept for backward and the running
 * statistics updated on the device (ddp__cuda_cls_get_buffers brings them to the host). */
ddp_status ddp__cuda_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *loss_sum,
                                 int64_t *correct, float *logits_host, ddp_error *err);
/* buffers_host[j] = buffer j on the device (waits). */
ddp_status ddp__cuda_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host, ddp_error *err);
/* Backward of the last training forward with labels: grads_host[i] += parameter i's gradient. */
ddp_status ddp__cuda_cls_backward(ddp__cuda_cls *g, float *const *grads_host, ddp_error *err);

/* Device-resident training of the MLP and CNN (ddp_model_resident; docs/gpu.md), the GPT's
 * contract (ddp__cuda_gpt_dev_info …) for this model. UNVERIFIED, as above.
 * dev_info: params_dev[i] = parameter i's values on the device (its flat buffer, or where
 * bind_params put them), buffers_dev[j] = buffer j's (the running statistics, which training
 * forwards update in place there), *stream = the model's cudaStream_t. get_params: params_host[i]
 * = parameter i's values (waits); upload still puts values (and buffers) on the device, into the
 * bound arrays when bound. backward_dev: as backward, but every gradient kernel adds straight
 * into grads_dev[i] (device memory, not zeroed), and ready(ctx, i) (may be NULL) is called as
 * soon as parameter i's kernels are queued: layers from the last, each layer's weight before
 * its bias (the CPU's order). optim_init, optim_step, optim_state, bind_params, state_dev and
 * optim_keep: the GPT's contracts, with the same ddp__cuda_optim_args, on the device's AdamW/SGD
 * kernels (optim.cu, devmath.cu). After optim_init, every forward in bf16/fp16 rounds the weights'
 * 16-bit twin from the masters first (the optimizer and the reducer's gather change them). */
ddp_status ddp__cuda_cls_dev_info(ddp__cuda_cls *g, float **params_dev, float **buffers_dev,
                                  void **stream, ddp_error *err);
ddp_status ddp__cuda_cls_get_params(ddp__cuda_cls *g, float *const *params_host, ddp_error *err);
ddp_status ddp__cuda_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                      ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                      ddp_error *err);
ddp_status ddp__cuda_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err);
ddp_status ddp__cuda_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a,
                                    ddp_error *err);
ddp_status ddp__cuda_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host, bool to_host,
                                     ddp_error *err);
ddp_status ddp__cuda_cls_bind_params(ddp__cuda_cls *g, float *const *params_dev, ddp_error *err);
ddp_status ddp__cuda_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err);
ddp_status ddp__cuda_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                                    ddp_error *err);

/* ---- device choice (device.c) ---------------------------------------------------------------
 * ddp_device_select's decision (ddp/device.h) given what the runtime said: `visible` GPUs (0:
 * none, and `why` says why). Separate so that tests can give any count. want must be "cpu",
 * "cuda" or "auto". */
struct ddp_device_choice;
ddp_status ddp__device_decide(const char *want, int local_rank, int visible, const char *why,
                              struct ddp_device_choice *out, ddp_error *err);

#endif /* DDP_KERNELS_H */
