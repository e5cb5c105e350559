/*
 * ddp/model.h — models as library objects: build one by type name, run forward (with the loss
 * inside) and backward, and hand its parameter list to a reducer, an optimizer and a checkpoint.
 *
 *   ddp_model_spec spec = DDP_MODEL_SPEC_INIT;
 *   spec.type = "mlp"; spec.in_ch = 1; spec.in_h = spec.in_w = 28; spec.classes = 10;
 *   spec.hidden = (const int64_t[]){256, 128}; spec.n_hidden = 2; spec.max_batch = 64;
 *   ddp_model *m;
 *   ddp_model_build(&spec, &m, &err);
 *   size_t np;
 *   const ddp_model_param *p = ddp_model_params(m, &np);       // names, shapes, data, grad
 *   for each i: ddp_model_bind(m, i, ddp_reducer_param(red, i), ddp_reducer_grad(red, i));
 *   each step:
 *       ddp_model_batch b = {.n = n, .x = x, .labels = y, .step = step, .sample_offset = off};
 *       ddp_model_out out;
 *       ddp_model_forward(m, &b, true, &out);                  // out.loss, out.correct
 *       ddp_model_backward(m, mark_ready, red);                // grads += d loss / d param
 *
 * Types ("mlp", "cnn", "gpt") sit behind one table of operations; each fills the same
 * parameter list and reads the same batch descriptor, so a trainer, a reducer, an optimizer
 * (ddp/optim.h) and the checkpoint's trainer state (ddp/ckpt.h) work with any of them unchanged.
 *
 * mlp: inputs (B, in_ch·in_h·in_w) flattened; Linear → activation (→ dropout) per hidden size,
 *      then Linear to `classes`. Parameters fcK.weight (out, in), fcK.bias (out,), K from 1.
 * cnn: per channels[s]: Conv2d 3×3 pad 1 → BatchNorm2d → activation → MaxPool2d 2, then the
 *      mlp's layers on the flattened result. Parameters convS.weight (out, in, 3, 3), convS.bias,
 *      bnS.weight, bnS.bias (C,), then fcK.*; buffers bnS.running_mean, bnS.running_var (C,).
 * gpt: GPT-2 as nanoGPT writes it. Inputs are token ids (n, seq_len), seq_len ≤ block_size:
 *      x = drop(wte[idx] + wpe[pos]); per block x = x + drop(c_proj(attn(ln_1(x)))),
 *      x = x + drop(mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))); logits = ln_f(x) · wteᵀ (the LM
 *      head is tied to the token embedding); loss = mean cross-entropy over the targets that are
 *      not −1 (DDP_NN_IGNORE_INDEX). Attention is causal, with dropout on its probabilities.
 *      Parameters, nanoGPT's names and torch's shapes, in this order: transformer.wte.weight
 *      (V, C), transformer.wpe.weight (block_size, C), then per block i transformer.h.i.
 *      ln_1.weight, ln_1.bias (C), attn.c_attn.weight (3C, C), attn.c_attn.bias (3C),
 *      attn.c_proj.weight (C, C), attn.c_proj.bias (C), ln_2.weight, ln_2.bias (C),
 *      mlp.c_fc.weight (4C, C), mlp.c_fc.bias (4C), mlp.c_proj.weight (C, 4C), mlp.c_proj.bias
 *      (C); then transformer.ln_f.weight, transformer.ln_f.bias (C). Every bias is absent when
 *      spec.bias is false. No lm_head.weight: torch's nanoGPT lists it as the same tensor as
 *      wte, so it loads our weights with strict=False, missing exactly that key. Weight decay
 *      (decay) on the 2-D tensors only, as nanoGPT's configure_optimizers. GPT-2's init: normal
 *      std 0.02 for embeddings and linear weights, 0.02/√(2·n_layer) for both c_proj weights,
 *      biases 0, layernorm weights 1 (ddp_nn_init_normal, from spec.seed and the tensor's index).
 *      Activations for max_batch × block_size tokens are allocated at build; what the backward
 *      needs is kept (no T×T per head; docs/nn.md counts the bytes). A training forward with
 *      targets turns the logits into their gradient in place: ddp_model_logits returns NULL
 *      after it. batch.last_logits (evaluation without targets) computes the logits of each
 *      sample's last position only, (n, V): what generation needs.
 * All: parameters in forward order (backward finishes them last to first, so a reducer buckets
 * them from the end); weights and biases initialised as torch's defaults (kaiming-uniform,
 * batchnorm γ = 1, β = 0), from spec.seed and the parameter's index, the same on every rank;
 * weight decay applies to every parameter (decay is true throughout, as torch's default param
 * group; gpt: see above). The names are torch's, so a checkpoint loads by name into the twin
 * torch model (tests/python/test_model_torch.py, test_gpt_torch.py).
 *
 * Ownership: the model owns its parameter list, names, activations and (until bound elsewhere)
 * parameter values and gradients; ddp_model_free() releases them. Memory bound with
 * ddp_model_bind() stays the caller's. Pointers into the model (the parameter list, logits) stay
 * valid until ddp_model_free(); the logits' contents until the next forward.
 *
 * Errors: build reports into the caller's ddp_error; every later call records a one-line
 * message on the model (ddp_model_last_error) and returns a status. Caller input is checked
 * (an out-of-range label, a batch larger than max_batch, backward without a training forward);
 * nothing aborts.
 *
 * Threads: a model is used by one thread at a time. Its kernels may use OpenBLAS threads inside.
 */
#ifndef DDP_MODEL_H
#define DDP_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/device.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_model ddp_model;

/* What to build. Plain data, borrowed for ddp_model_build() only; start from
 * DDP_MODEL_SPEC_INIT and set what the type reads. Each type ignores the others' fields. */
typedef struct ddp_model_spec {
    const char *type; /* "mlp" | "cnn" | "gpt" */
    int max_batch;    /* the largest batch forward accepts (activations are sized for it), ≥ 1;
                         gpt: sequences of up to block_size tokens */
    uint64_t seed;    /* weights and dropout masks */
    /* mlp, cnn: */
    int in_ch, in_h, in_w;   /* one input sample (in_ch, in_h, in_w), each ≥ 1 */
    int classes;             /* outputs, ≥ 1 */
    const int64_t *hidden;   /* fully connected hidden sizes (n_hidden), each ≥ 1 */
    size_t n_hidden;         /* 0: a single linear layer */
    const int64_t *channels; /* cnn: channels of each conv stage (n_channels) */
    size_t n_channels;
    float dropout;          /* mlp/cnn: after each hidden activation; gpt: on the embedding,
                               the attention probabilities and each residual branch, as
                               nanoGPT's; 0 … 1 (0: none) */
    const char *activation; /* "relu" (NULL too) | "gelu" (exact erf, torch.nn.GELU()) */
    /* gpt (GPT-2 as nanoGPT writes it; inputs are token ids, batch.tokens/targets): */
    int n_layer;    /* transformer blocks, ≥ 1 */
    int n_head;     /* attention heads; must divide n_embd */
    int n_embd;     /* channels C */
    int block_size; /* the longest sequence (position embeddings), ≥ 1 */
    int vocab_size; /* token ids in [0, vocab_size); 256 for bytes, 50304 for padded GPT-2 BPE */
    bool bias;      /* biases in the linear layers and layernorms (nanoGPT's `bias`) */
    /* where and how it computes (ddp/device.h): */
    ddp_device device;       /* DDP_DEVICE_CPU; DDP_DEVICE_CUDA: every type (docs/gpu.md) */
    int device_index;        /* the CUDA device, e.g. ddp_device_choice.cuda_index */
    ddp_precision precision; /* DDP_PRECISION_FP32; BF16 on the CPU: bf16 matrix products
                                (ddp_precision_check); tf32/fp16 need device CUDA */
} ddp_model_spec;

#define DDP_MODEL_SPEC_INIT                                                                        \
    {                                                                                              \
        "mlp", 64, 0, 1, 28, 28, 10, NULL, 0, NULL, 0, 0.0f, "relu", 4, 4, 128, 128, 256, true,    \
            DDP_DEVICE_CPU, 0, DDP_PRECISION_FP32                                                  \
    }

#define DDP_MODEL_MAX_DIMS 4

/* One parameter (or buffer) tensor: plain data, owned by the model (the pointers: see data and
 * grad). The list is fixed from build on; entries change only through ddp_model_bind(). */
typedef struct ddp_model_param {
    const char *name;                  /* unique, torch's name: "fc1.weight" */
    int ndim;                          /* 1 … DDP_MODEL_MAX_DIMS */
    int64_t shape[DDP_MODEL_MAX_DIMS]; /* torch's shape: linear (out, in), conv (out, in, kh, kw) */
    size_t count;                      /* elements: the product of shape */
    bool decay;                        /* the optimizer's weight decay applies to it */
    float *data;                       /* (count,) fp32 values, row-major: the model's own
                                          memory, or the caller's after ddp_model_bind() */
    float *grad;                       /* (count,) fp32, backward accumulates (+=) into it: the
                                          caller's after ddp_model_bind() (e.g. a view into the
                                          reducer's bucket memory), else the model's own,
                                          allocated zeroed at the first backward; NULL before.
                                          Always NULL for buffers. */
} ddp_model_param;

/* One batch. Plain data; the arrays are borrowed from forward until the next forward (backward
 * reads the inputs again), so keep them unchanged until backward returns. Fields a type does not
 * read are ignored. */
typedef struct ddp_model_batch {
    int n;                  /* samples, 1 … spec.max_batch */
    const float *x;         /* mlp, cnn: inputs (n, in_ch·in_h·in_w) fp32 */
    const int32_t *labels;  /* mlp, cnn: classes (n,) in [0, classes); NULL: no loss */
    const int32_t *tokens;  /* gpt: token ids (n, seq_len) */
    const int32_t *targets; /* gpt: next tokens (n, seq_len), −1 ignored; NULL: no loss */
    int seq_len;            /* gpt: tokens per sample, 1 … block_size */
    float grad_scale;       /* backward accumulates d(loss · grad_scale)/d param: 1/k when k
                               micro-batches accumulate into one step; 0 is taken as 1 */
    uint64_t step;          /* training step: keys dropout (its stream) */
    uint64_t sample_offset; /* key of sample 0 of this batch: sample i's dropout mask is keyed
                               by sample_offset + i · sample_stride, so that masks follow the
                               sample, not the rank or world size (docs/nn.md) */
    uint64_t sample_stride; /* mlp, cnn: between two samples' keys; 0 is taken as 1 (contiguous:
                               ranks holding blocks of the global batch). W for the
                               DistributedSampler's ranks, which take every W-th sample: rank r
                               of W with per-rank batch B, micro-batch k of the run, passes
                               offset k·W·B + r and stride W, and each sample gets the key it
                               has with 1 rank × W·B. gpt: 0 or 1 only */
    bool last_logits;       /* gpt, evaluation without targets: logits only for each sample's
                               last position, (n, V) instead of (n·seq_len, V) (generation) */
    bool kv_cache;          /* gpt generation (n 1, evaluation, no targets, last_logits):
                               keep each block's keys and values, and reuse them for the longest
                               prefix this batch's tokens share with the previous kv_cache
                               forward's: appending a token to the context costs one position's
                               work, not the whole context's (the logits are the same up to
                               rounding). The parameters must not change between two kv_cache
                               forwards except through the model itself: any other forward
                               (training, evaluation, kv_cache false) empties the cache. Memory:
                               n_layer·block_size·3·n_embd floats, at the first such forward;
                               under precision bf16 also the products' weights rounded once
                               (12·n_embd² halves a block, and wte's). On the GPU the cache
                               is the model's own device buffers (nothing more but the
                               attention's scores for up to 64 new positions), and the
                               parameters are not uploaded again for such a forward. */
    bool loss_only;         /* evaluation with targets or labels: only the loss and accuracy are
                               wanted. A model on the GPU then leaves the logits there
                               (ddp_model_logits returns NULL after it) instead of copying them
                               to the host: for GPT-2 (n·seq_len × 50304 floats, 13 GB at n 64)
                               a copy of that size per batch and as much host memory per rank.
                               On the CPU nothing changes. */
} ddp_model_batch;

/* What forward computed, for logs and evaluation. */
typedef struct ddp_model_out {
    double loss;     /* mean cross-entropy over the items below (double); 0 without labels,
                        and 0 when no item counts (gpt: every target −1; torch's mean would be
                        0/0), so that loss · count always sums */
    int64_t correct; /* items whose argmax is their label (first index on ties) */
    int64_t count;   /* items the loss averages: n for mlp/cnn, the targets that are not −1
                        for gpt (n·seq_len without ignored ones); 0 without labels */
} ddp_model_out;

/* Parameter `index` of the model's list has its final gradient for this backward. Returning an
 * error stops the backward, which returns that status. The DDP reducer's ddp_reducer_mark_ready
 * fits behind a one-line adapter. */
typedef ddp_status (*ddp_grad_ready_fn)(void *ctx, size_t index);

/* Builds a model of spec->type: checks the spec, allocates parameters, buffers and activations
 * for spec->max_batch samples, initialises the weights. *out is set only on DDP_OK; then free
 * it with ddp_model_free(). Errors (message in err, which may be NULL): DDP_ERR_INVALID (an
 * unknown type, a bad size or activation, a geometry the layers cannot take; the message names
 * the field), DDP_ERR_NOMEM. */
ddp_status ddp_model_build(const ddp_model_spec *spec, ddp_model **out, ddp_error *err);

void ddp_model_free(ddp_model *m); /* NULL is a no-op; does not touch bound memory */

/* The type's name ("mlp"), owned by the library. */
const char *ddp_model_type(const ddp_model *m);

/* The parameter list ((*n,) entries, in registration order; n may be NULL) and the buffers
 * (e.g. batchnorm running statistics: saved and broadcast, not trained; grad NULL, decay false).
 * Owned by m; the arrays do not move, so a reducer or optimizer may borrow them for m's life. */
const ddp_model_param *ddp_model_params(const ddp_model *m, size_t *n);
const ddp_model_param *ddp_model_buffers(const ddp_model *m, size_t *n);

/* Moves parameter i's values to data and its gradient to grad (either NULL: leave it where it
 * is). Nothing is copied: data must already hold the values (as the reducer's copy of the
 * parameters does after ddp_reducer_create). Memory the model allocated for what moved is
 * freed. Both stay the caller's and must outlive m's use of them. DDP_ERR_INVALID if i is out of
 * range. */
ddp_status ddp_model_bind(ddp_model *m, size_t i, float *data, float *grad);

/* Zeroes every gradient that exists (bound or the model's). A reducer's
 * ddp_reducer_zero_grad() does the same for memory it owns. */
void ddp_model_zero_grad(ddp_model *m);

/* Forward of batch b. train: batch statistics and dropout (and the loss's gradient is kept for
 * backward); else evaluation mode. With labels (targets for gpt), out receives the loss and the
 * correct count; without, only the logits are computed. out may be NULL. Errors:
 * DDP_ERR_INVALID (b->n outside 1 … max_batch, a missing input, a label out of range, batchnorm
 * in training with fewer than 2 values per channel); the message is on m. */
ddp_status ddp_model_forward(ddp_model *m, const ddp_model_batch *b, bool train,
                             ddp_model_out *out);

/* The last forward's logits: (*rows, *cols) fp32, rows = n (n·seq_len for gpt, n with
 * last_logits), cols = classes (vocabulary). Owned by m, overwritten by the next forward; NULL
 * before the first, and for gpt after a training forward with targets (the buffer then holds
 * the loss's gradient). rows and cols may be NULL. */
const float *ddp_model_logits(const ddp_model *m, size_t *rows, size_t *cols);

/* Backward of the last forward, which must have been in training mode with labels: accumulates
 * (+=) every parameter's gradient, from the last layer to the first, and calls ready(ctx, i) for
 * each parameter i as soon as its gradient is final (ready may be NULL). Errors:
 * DDP_ERR_INVALID (no training forward with labels since the last backward), DDP_ERR_NOMEM (the
 * model's own gradients), or what ready returned; the message is on m. */
ddp_status ddp_model_backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx);

/* Parameter `index`'s gradient is about to be written: *grad receives where (count floats, which
 * backward adds into). A sharded-gradient reducer's ddp_reducer_grad_acquire fits behind a
 * one-line adapter. Returning an error stops the backward, which returns that status. */
typedef ddp_status (*ddp_grad_acquire_fn)(void *ctx, size_t index, float **grad);

/* ddp_model_backward with the gradients' memory handed out as backward reaches each parameter
 * (ZeRO-2: a reducer with shard_gradients keeps only a bounded pool of whole gradients):
 * acquire(ctx, i, &g) before parameter i's gradient is first written (the gpt's tied token
 * embedding: at the head, and kept until its ready at the very end), ready(ctx, i) when it is
 * final, after which backward writes no more into it. The list's grad pointers are NULL after
 * it (the gradients went where acquire said), and the model's own gradients are not allocated.
 * The CPU only (a model on the GPU: DDP_ERR_INVALID); otherwise as ddp_model_backward, plus
 * what acquire returned. */
ddp_status ddp_model_backward_pooled(ddp_model *m, ddp_grad_acquire_fn acquire,
                                     ddp_grad_ready_fn ready, void *ctx);

/* ---- device-resident training (a model built with device cuda; docs/gpu.md) ------------------
 * By default a GPU model is host-driven: each forward uploads the parameters from the host's
 * arrays (the list's data) and each backward adds its gradients into the host's (grad), so the
 * host's reducer and optimizer work as on the CPU. ddp_model_resident() moves training onto the
 * GPU for good, as PyTorch users have it: the parameters stay in device memory (uploaded once,
 * now, from the host's arrays), backward adds the gradients into device buffers the caller binds
 * (a reducer over a GPU group: ddp_reducer_grad of device parameters), and the optimizer's state
 * lives there too, stepped by ddp_model_device_step. The host's arrays (the list's data, the
 * optimizer's state) then serve checkpoints only, brought up to date by ddp_model_sync_host and
 * back by ddp_model_sync_device. gpt, mlp and cnn have it. A model with buffers (the cnn's
 * batchnorm running statistics) keeps them on the device too: training forwards update them
 * there, ddp_model_device_buffer gives their device arrays (register those with the reducer, whose
 * broadcast from rank 0 — at creation, ddp_reducer_sync_buffers — then runs over the GPU group),
 * and the syncs copy them with the parameters. UNVERIFIED: written without a GPU.
 *
 *   ddp_model_resident(m, &optim_opts, &err);            // after loading a checkpoint, if any
 *   ddp_group_opts go = DDP_GROUP_OPTS_INIT; go.device = DDP_DEVICE_CUDA; … ddp_group_init(&go,
 * &gg, …); ddp_group_set_stream(gg, ddp_model_cuda_stream(m)); ddp_param ps[i] = {name, count,
 * DDP_FLOAT32, ddp_model_device_param(m, i), DDP_DEVICE_CUDA}; ddp_reducer_create(gg, ps, n, …,
 * &red, …);  then ddp_model_bind_device_grad(m, i, ddp_reducer_grad(red, i)) each step: zero_grad,
 * forward, backward (marks ready), finish, grad_norm, then for each i: ddp_model_device_step(m, i,
 * step, lr, clip_coef); With a sharded reducer (shard_optimizer): ddp_model_bind_device_params(m,
 * ps') with ps'[i] = ddp_reducer_param(red, i) after creating it; each step, for each i,
 * ddp_reducer_shard(red, i, &lo, &hi) and ddp_model_device_step_range(m, i, lo, hi, …), then
 * ddp_reducer_gather_params(red); before a checkpoint, ddp_reducer_gather_state on each
 * ddp_model_device_state array, then ddp_model_sync_host. ZeRO-1's memory split: then
 * ddp_model_device_keep (and ddp_optim_keep on the host's optimizer) with the shard's ranges,
 * and checkpoints through ddp_reducer_gather_state_sink from the ddp_model_device_state
 * arrays, which hold the shard only (tools/ddptrain does it).
 */
struct ddp_optim_opts;
struct ddp_optim;
/* Switches m to device-resident training with an optimizer of opts' kind and hyperparameters
 * (its state zeroed). DDP_ERR_INVALID for a CPU model or a type without it; CUDA's errors. */
ddp_status ddp_model_resident(ddp_model *m, const struct ddp_optim_opts *opts, ddp_error *err);
bool ddp_model_is_resident(const ddp_model *m);
/* Parameter i's values in device memory (resident only; NULL otherwise or out of range). */
float *ddp_model_device_param(const ddp_model *m, size_t i);
/* Buffer j's values in device memory (resident only; NULL otherwise, out of range, or for a type
 * without buffers). Training forwards update them in place. */
float *ddp_model_device_buffer(const ddp_model *m, size_t j);
/* The cudaStream_t all of m's GPU work runs on (NULL for a CPU model): give it to the GPU group
 * (ddp_group_set_stream) so the collectives keep their order with the model's kernels. */
void *ddp_model_cuda_stream(const ddp_model *m);
/* Where backward adds parameter i's gradient (device memory, count floats; resident only). */
ddp_status ddp_model_bind_device_grad(ddp_model *m, size_t i, float *grad_dev);
/* The optimizer's update of parameter i from its bound device gradient, every element, step
 * `step` (1-based) at learning rate lr, the gradient multiplied by grad_scale first (clipping):
 * ddp_optim_step_range's arithmetic, on the GPU. Queued on the model's stream. */
ddp_status ddp_model_device_step(ddp_model *m, size_t i, uint64_t step, float lr, float grad_scale);
/* The same for elements [lo, hi) of parameter i only (the reducer's shard of it with a sharded
 * optimizer step: ddp_reducer_shard). */
ddp_status ddp_model_device_step_range(ddp_model *m, size_t i, size_t lo, size_t hi, uint64_t step,
                                       float lr, float grad_scale);
/* The sharded optimizer step on the GPU (a reducer created with shard_optimizer over a GPU
 * group keeps the parameters, as on the CPU): from now on parameter i's values are
 * params_dev[i] (device memory of its count floats holding its current values, e.g.
 * ddp_reducer_param(red, i), which ddp_reducer_gather_params fills; the caller keeps every array
 * alive while bound). The forward, backward, device steps, syncs and ddp_model_device_param use
 * them. params_dev NULL copies their values back into the model's own device memory, which
 * serves again (do it before the arrays go away, if the model lives on). */
ddp_status ddp_model_bind_device_params(ddp_model *m, float *const *params_dev);
/* dev[i] = state s of the device optimizer for parameter i (device memory shaped like the
 * parameter; s < 2 for AdamW, 1 for SGD), every i: what ddp_reducer_gather_state completes after
 * sharded steps, before ddp_model_sync_host saves it. */
ddp_status ddp_model_device_state(ddp_model *m, int s, float **dev);
/* ZeRO-1's memory split on the GPU, ddp_optim_keep's twin: the device optimizer's state keeps
 * the elements [lo[i], hi[i]) of each parameter i only (the reducer's shard:
 * ddp_reducer_shard), with the values it had; the rest of its device memory is freed. Call it
 * once the state is complete (fresh, or synced up from a loaded checkpoint), with ddp_optim_keep
 * on the host's optimizer given the same ranges (the syncs copy the kept elements and refuse
 * optimizers narrowed otherwise). From then on ddp_model_device_step_range refuses elements
 * outside the range, and ddp_model_device_state gives each parameter's kept elements (the
 * first is element lo[i]): the shards ddp_reducer_gather_state_sink takes. A range can only
 * narrow; a failure (DDP_ERR_INVALID, or out of device memory) changes nothing. */
ddp_status ddp_model_device_keep(ddp_model *m, const size_t *lo, const size_t *hi);
/* The elements of parameter i whose device optimizer state m keeps: [0, count) until
 * ddp_model_device_keep; [0, 0) for an i out of range. */
void ddp_model_device_kept(const ddp_model *m, size_t i, size_t *lo, size_t *hi);
/* Device → host: the parameters into the list's data arrays (the buffers into theirs) and, with
 * opt (NULL: none), the device optimizer's state into opt's state arrays (ddp_optim_state; opt
 * of the same kind: another kind is DDP_ERR_INVALID, and nothing is copied).
 * Host → device: the same the other way. Both wait for the copies. */
ddp_status ddp_model_sync_host(ddp_model *m, struct ddp_optim *opt);
ddp_status ddp_model_sync_device(ddp_model *m, struct ddp_optim *opt);

/* Training FLOPs (forward + backward) of one sample, for MFU:
 *   mlp, cnn: 6 × the forward's multiply-adds (linear in·out, conv out_ch·in_ch·kh·kw·out_h·out_w;
 *             batchnorm, pooling, activations not counted);
 *   gpt:      seq_len × (6·N + 12·n_layer·n_embd·seq_len), N = every parameter except
 *             transformer.wpe.weight (nanoGPT's estimate_mfu, after PaLM: the token embedding
 *             counts, it is the LM head's matrix; the attention term counts the full T×T scores,
 *             not the causal half). seq_len ≤ 0 means block_size; mlp and cnn ignore it.
 * FLOPs per token for gpt: divide by seq_len. Pure; any thread. */
double ddp_model_flops_per_sample(const ddp_model *m, int seq_len);

/* The denominator of MFU on the CPU: the FLOPs per second this thread's matrix multiplies reach
 * in precision p (fp32: OpenBLAS SGEMM, with the threads OPENBLAS_NUM_THREADS gives it; bf16:
 * oneDNN's bf16 product, OMP_NUM_THREADS), measured for about `seconds` (0.001 … 60; 0.05 is
 * enough) on a 256 × 768 × 384 product with the kernel the models use: the best call, into
 * *flops_per_s. Call it on every rank at once, so that ranks sharing cores measure what training
 * gets. Errors: DDP_ERR_INVALID (seconds out of range, no output, tf32/fp16), what
 * ddp_precision_check says for bf16 on a CPU without bf16 units, DDP_ERR_NOMEM. Any thread. */
ddp_status ddp_model_measure_peak(double seconds, ddp_precision p, double *flops_per_s,
                                  ddp_error *err);

/* The message of the last failed call on m, or "" — owned by m, valid until the next call. */
const char *ddp_model_last_error(const ddp_model *m);

#ifdef __cplusplus
}
#endif
#endif /* DDP_MODEL_H */
