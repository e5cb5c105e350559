/*
 * kernels/cuda/gpt.cu — the GPT's forward and backward on one device (kernels.h's
 * ddp__cuda_gpt_*), composed from this folder's kernels in the same order and with the same
 * buffers' meanings as src/nn/gpt.c, which is the reference (test_cuda_gpt compares the two).
 *
 * Memory, all cudaMalloc'd at create for max_batch × block_size tokens: the parameters as a flat
 * fp32 buffer in the CPU model's order (each tensor padded to 256 bytes on the device; freed
 * while bind_params has them elsewhere, made again at unbind), and their gradients as a second
 * one made at the first host backward only (device-resident training adds them into the
 * caller's buffers, so it never has one); per block what the backward reads (ln_1/ln_2 outputs and
 * statistics, qkv, the attention probabilities (B, nh, T, T), the heads' output, the residual
 * stream after attention, the MLP's pre/post-GELU activations, the block's output); shared gradient
 * buffers; the logits (N, V), which a training forward turns into their own gradient.
 *
 * Precision bf16 or fp16 (PyTorch autocast's choices for bfloat16 / float16, one code path with
 * the 16-bit format as a parameter; docs/gpu.md has the table of every rounding): the fp32
 * masters stay in the flat buffer and each forward rounds them once into a 16-bit twin of it
 * (params_h); matrix products take 16-bit operands and accumulate in fp32; the residual stream,
 * layernorm statistics, softmaxes, the logits and the loss are fp32; what only products read is
 * stored in 16 bits (layernorm outputs, qkv, the probabilities, the heads' output, the MLP's
 * activations, the gradients of those); weight gradients accumulate in the fp32 gradient buffer.
 * The per-block buffers are then the *h twins below (the fp32 ones stay NULL), at half the bytes.
 * fp16 is GradScaler's half: the loss's gradient is multiplied by the grad_scale the host passes
 * (the loss scale), a value beyond fp16's 65504 becomes ±inf where it is stored (never clamped),
 * and the inf or NaN it spreads into the fp32 gradients is what the host's unscale finds.
 *
 * Dropout (embedding, attention probabilities, both residual branches) draws the CPU's masks
 * (dropout.cuh: util/rng.h's hash with gpt.c's seeds, step and sample offset), regenerated in
 * the backward, never stored. What it does not do yet: with the host in charge (the library's
 * default: one upload per forward, one download per backward; device-resident training, below,
 * keeps parameters and optimizer state here) no overlap of the gradient download with backward.
 * UNVERIFIED: written without a GPU; see docs/gpu.md.
 */
#include <initializer_list>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "resident.cuh"

extern "C" {
#include "kernels/cuda/devmath.h"
}

#define LN_EPS 1e-5f

namespace
{

struct blk {
    /* parameter offsets into the flat buffers, −1 when absent (bias false) */
    long long ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w,
        mproj_b;
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *xmid, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fchg, *xout;
    /* 16-bit only, in place of ln1, qkv, att, atty, ln2, fch, fchg (NULL in fp32/tf32):
     * (N, C), (N, 3C), (B, nh, T, T), (N, C), (N, C), (N, 4C), (N, 4C) */
    uint16_t *ln1h, *qkvh, *atth, *attyh, *ln2h, *fchh, *fchgh;
    float *lse; /* flash attention only: (B, nh, T) the rows' logsumexp, in place of att/atth */
};

} // namespace

struct ddp__cuda_gpt {
    ddp__cuda_gpt_cfg cfg;
    ddp__cuda_ctx *ctx;
    size_t n_params, total;   /* tensors; floats in the flat buffers */
    size_t *counts, *offsets; /* (n_params,) */
    float *params, *grads;    /* (total,) on the device; grads from the first host backward on,
                                 params NULL while bound (bind_params) */
    float *grads_host;        /* (total,) staging for the download, with grads */
    long long wte, wpe, lnf_w, lnf_b;
    blk *b; /* (L,) */
    int32_t *tokens, *targets, *correct;
    float *x0, *lnf, *lnf_mean, *lnf_rstd, *logits, *row_loss, *tmp, *dres, *dln, *dbig, *scratch;
    /* 16-bit only (NULL otherwise): params_h (total,) the weights rounded each forward; lnfh
     * (N, C) in place of lnf; tmph (N, C) the projections' outputs, then the heads' output
     * gradient; dresh (N, C) dres rounded for the products; dbigh (N, 4C) the MLP's activation
     * gradient, also dqkv (N, 3C); scratch_h the attention's (ddp__cuda_attention_scratch_h
     * bytes). In 16 bits tmp, lnf, dbig and scratch are not allocated, and dln doubles as the
     * buffer of the last positions' gather. */
    bool half;    /* precision bf16 or fp16 */
    bool flash;   /* the fused attention (flash.cu) in place of the batched one: attention_choice */
    ddp_dtype ht; /* then DDP_BFLOAT16 or DDP_FLOAT16 */
    uint16_t *params_h, *lnfh, *tmph, *dresh, *dbigh;
    void *scratch_h;
    int32_t *correct_host;
    float *row_loss_host;
    /* generation's key/value cache (ddp__gpu_gpt_forward_cached): the per-block qkv/qkvh rows of
     * positions 0 … kv_valid − 1 are the last forward's (one sequence, no dropout) with the
     * parameters as they are (0 after anything that changes them here); kv_scratch the cached
     * attention's (for KV_ROWS new positions), made at its first use */
    int kv_valid;
    void *kv_scratch;
    /* the last forward */
    int n, T;
    bool can_backward;
    bool drop_on;        /* it trained with cfg.dropout > 0: the backward draws its masks */
    uint64_t step, soff; /* its batch's step and first sample (the masks' keys) */
    /* device-resident training (ddp__gpu_gpt_backward_dev, _optim_*) */
    float *const *grads_dev; /* during backward_dev: where the gradients go (added) */
    ddp_status (*ready)(void *ctx, size_t i); /* during backward_dev: parameter i is final */
    void *ready_ctx;
    ddp_status ready_st; /* what ready returned, when not DDP_OK */
    /* the optimizer's state, and res.bound: ddp__gpu_gpt_bind_params's (n_params,) arrays where
     * each parameter's values are instead of the flat buffer (the reducer's views, for the
     * sharded step), or NULL */
    ddp__cuda_resident res;
};

/* The parameter whose flat-buffer offset is off (offsets ascend with the index). */
static size_t index_of(const ddp__cuda_gpt *g, long long off);

/* Parameter i's values: the flat buffer's, or where bind_params put them. */
static float *param_of(const ddp__cuda_gpt *g, size_t i)
{
    return ddp__cuda_resident_param(&g->res, i);
}

/* The values of the tensor at flat offset off (−1: absent). */
static float *P(ddp__cuda_gpt *g, long long off)
{
    if (off < 0)
        return NULL;
    if (!g->res.bound)
        return g->params + off;
    size_t i = index_of(g, off);
    return g->res.bound[i] + (off - (long long)g->offsets[i]);
}

static size_t index_of(const ddp__cuda_gpt *g, long long off)
{
    size_t lo = 0, hi = g->n_params;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((long long)g->offsets[mid] <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Where the gradient of the tensor at off accumulates: the flat buffer, or during
 * backward_dev the caller's device gradient itself (every gradient kernel adds into it). */
static float *G(ddp__cuda_gpt *g, long long off)
{
    if (off < 0)
        return NULL;
    return g->grads_dev ? g->grads_dev[index_of(g, off)] : g->grads + off;
}

/* During backward_dev: the tensors at these offsets (−1: absent) have their whole gradient
 * queued on the stream; the caller's ready may start their allreduce, which the group orders
 * after the stream's work so far. An error of ready stops the backward. */
static ddp_status mark_ready(ddp__cuda_gpt *g, std::initializer_list<long long> offs,
                             ddp_error *err)
{
    for (long long off : offs) {
        if (off < 0 || !g->ready)
            continue;
        ddp_status st = g->ready(g->ready_ctx, index_of(g, off));
        if (st) {
            g->ready_st = st;
            return ddp__cuda_fail(err, st, "cuda gpt: the gradient-ready callback failed");
        }
    }
    return DDP_OK;
}

/* The dropout of layer id (src/nn/gpt.c's ids: 1 the embedding's, 2 + 3·l the attention
 * probabilities', 3 + 3·l and 4 + 3·l the residual branches' of block l) for the last training
 * forward: the seed, step and offset gpt.c gives it (att: query rows, else elements of (N, C)).
 * p 0 (off) outside training or without dropout. */
static ddp__cuda_drop drop_of(const ddp__cuda_gpt *g, int id, bool att)
{
    ddp__cuda_drop d = {0.0f, 0, 0, 0};
    if (!g->drop_on)
        return d;
    d.p = g->cfg.dropout;
    d.seed = g->cfg.seed + (uint64_t)id;
    d.step = g->step;
    d.offset = g->soff * (uint64_t)g->T * (uint64_t)(att ? g->cfg.nh : g->cfg.C);
    return d;
}

/* A residual branch's dropout in place on its (N, C) output of dtype t (a no-op when off). */
static ddp_status drop_branch(ddp__cuda_gpt *g, int id, ddp_dtype t, void *x, size_t n,
                              ddp_error *err)
{
    if (!g->drop_on)
        return DDP_OK;
    ddp__cuda_drop d = drop_of(g, id, false);
    return ddp__cuda_dropout(g->ctx, t, x, t, x, n, &d, err);
}

/* A weight's 16-bit copy (precision bf16 or fp16). */
static const uint16_t *PH(ddp__cuda_gpt *g, long long off)
{
    return off >= 0 ? g->params_h + off : NULL;
}

extern "C" void ddp__gpu_gpt_free(ddp__cuda_gpt *g)
{
    if (!g)
        return;
    if (g->ctx) {
        (void)cudaSetDevice(g->ctx->device);
        ddp__cuda_sync(g->ctx, NULL);
    }
    ddp__cuda_resident_free(&g->res);
    for (int l = 0; g->b && l < g->cfg.L; l++) {
        blk *a = &g->b[l];
        void *bufs[] = {a->ln1,  a->ln1_mean, a->ln1_rstd, a->qkv,  a->att,  a->atty,  a->xmid,
                        a->ln2,  a->ln2_mean, a->ln2_rstd, a->fch,  a->fchg, a->xout,  a->ln1h,
                        a->qkvh, a->atth,     a->attyh,    a->ln2h, a->fchh, a->fchgh, a->lse};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            ddp__cuda_free(bufs[k]);
    }
    void *bufs[] = {g->params, g->grads,    g->tokens,   g->targets,   g->correct,   g->x0,
                    g->lnf,    g->lnf_mean, g->lnf_rstd, g->logits,    g->row_loss,  g->tmp,
                    g->dres,   g->dln,      g->dbig,     g->scratch,   g->params_h,  g->lnfh,
                    g->tmph,   g->dresh,    g->dbigh,    g->scratch_h, g->kv_scratch};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        ddp__cuda_free(bufs[k]);
    ddp__cuda_ctx_destroy(g->ctx);
    free(g->b);
    free(g->counts);
    free(g->offsets);
    free(g->grads_host);
    free(g->correct_host);
    free(g->row_loss_host);
    free(g);
}

/* The parameter list's layout (src/nn/gpt.c's add_params): its offsets, checked against the
 * sizes the model gave. The order is the CPU's; each tensor starts on a 64-float (256-byte)
 * boundary (ddp__cuda_param_span), so cuBLASLt sees aligned weights and biases whatever
 * vocab_size × n_embd is. */
static ddp_status layout(ddp__cuda_gpt *g, const size_t *counts, size_t n, ddp_error *err)
{
    const ddp__cuda_gpt_cfg *c = &g->cfg;
    const size_t C = (size_t)c->C;
    size_t cap = 4 + 12 * (size_t)c->L, k = 0;
    size_t *want = (size_t *)malloc(cap * sizeof *want);
    long long **slot = (long long **)malloc(cap * sizeof *slot);
    ddp_status st = DDP_OK;
    if (!want || !slot) {
        st = ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda gpt: out of memory");
        goto out_free;
    }
    want[k] = (size_t)c->V * C, slot[k++] = &g->wte;
    want[k] = (size_t)c->Tmax * C, slot[k++] = &g->wpe;
    for (int l = 0; l < c->L; l++) {
        blk *b = &g->b[l];
        b->ln1_b = b->attn_b = b->proj_b = b->ln2_b = b->fc_b = b->mproj_b = -1;
        want[k] = C, slot[k++] = &b->ln1_w;
        if (c->bias)
            want[k] = C, slot[k++] = &b->ln1_b;
        want[k] = 3 * C * C, slot[k++] = &b->attn_w;
        if (c->bias)
            want[k] = 3 * C, slot[k++] = &b->attn_b;
        want[k] = C * C, slot[k++] = &b->proj_w;
        if (c->bias)
            want[k] = C, slot[k++] = &b->proj_b;
        want[k] = C, slot[k++] = &b->ln2_w;
        if (c->bias)
            want[k] = C, slot[k++] = &b->ln2_b;
        want[k] = 4 * C * C, slot[k++] = &b->fc_w;
        if (c->bias)
            want[k] = 4 * C, slot[k++] = &b->fc_b;
        want[k] = 4 * C * C, slot[k++] = &b->mproj_w;
        if (c->bias)
            want[k] = C, slot[k++] = &b->mproj_b;
    }
    g->lnf_b = -1;
    want[k] = C, slot[k++] = &g->lnf_w;
    if (c->bias)
        want[k] = C, slot[k++] = &g->lnf_b;
    if (k != n) {
        st = ddp__cuda_fail(err, DDP_ERR_INVALID,
                            "cuda gpt: the model has %zu parameter tensors, the layout %zu", n, k);
        goto out_free;
    }
    {
        size_t off = 0;
        for (size_t i = 0; i < n && !st; i++) {
            if (counts[i] != want[i]) {
                st = ddp__cuda_fail(err, DDP_ERR_INVALID,
                                    "cuda gpt: parameter %zu has %zu values, the layout %zu", i,
                                    counts[i], want[i]);
                break;
            }
            g->counts[i] = counts[i];
            g->offsets[i] = off;
            *slot[i] = (long long)off;
            /* each tensor 256-byte aligned on the device (the host keeps the CPU's layout) */
            off += ddp__cuda_param_span(counts[i]);
        }
        g->total = off;
    }
out_free:
    free(want);
    free(slot);
    return st;
}

/* Which attention the model runs, from DDP_CUDA_ATTENTION (read once, at create): "batched"
 * (or unset: the default) the cuBLAS strided-batched path keeping the (B, nh, T, T)
 * probabilities; "flash" the fused kernel (flash.cu: no T² memory, dropout included) where the
 * head size is 32, 64 or 128, the batched path otherwise. The default stays batched until a GPU
 * session has checked flash (docs/gpu.md). */
static ddp_status attention_choice(const ddp__cuda_gpt_cfg *cfg, bool *flash, ddp_error *err)
{
    const char *v = getenv("DDP_CUDA_ATTENTION");
    *flash = false;
    if (!v || !*v || !strcmp(v, "batched"))
        return DDP_OK;
    if (strcmp(v, "flash"))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda gpt: DDP_CUDA_ATTENTION=%s: expected batched or flash", v);
    *flash = cfg->nh > 0 && cfg->C % cfg->nh == 0 && ddp__cuda_flash_supported(cfg->C / cfg->nh);
    return DDP_OK;
}

/* cudaMalloc of n elements of es bytes into *p (a pointer of any type); st stays DDP_OK on
 * success. */
static ddp_status dalloc_es(void *p, size_t n, size_t es, ddp_error *err)
{
    void *d = NULL;
    ddp_status st = ddp__cuda_malloc(&d, n * es, err);
    memcpy(p, &d, sizeof d);
    return st;
}

/* n floats (or int32). */
static ddp_status dalloc(void *p, size_t n, ddp_error *err)
{
    return dalloc_es(p, n, 4, err);
}

/* n 16-bit values. */
static ddp_status dalloc_h(void *p, size_t n, ddp_error *err)
{
    return dalloc_es(p, n, 2, err);
}

extern "C" ddp_status ddp__gpu_gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts,
                                          size_t n, ddp__cuda_gpt **out, ddp_error *err)
{
    if ((unsigned)cfg->precision >= DDP_PRECISION_COUNT)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "gpt on cuda: precision %d is not one this model implements (fp32, "
                              "tf32, bf16 or fp16); HINT: a libddp_gpu.so from another build?",
                              (int)cfg->precision);
    ddp__cuda_gpt *g = (ddp__cuda_gpt *)calloc(1, sizeof *g);
    if (!g)
        return ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda gpt: out of memory");
    g->cfg = *cfg;
    g->n_params = n;
    g->half = cfg->precision == DDP_PRECISION_BF16 || cfg->precision == DDP_PRECISION_FP16;
    g->ht = cfg->precision == DDP_PRECISION_FP16   ? DDP_FLOAT16
            : cfg->precision == DDP_PRECISION_BF16 ? DDP_BFLOAT16
                                                   : DDP_FLOAT32;
    g->b = (blk *)calloc((size_t)cfg->L, sizeof *g->b);
    g->counts = (size_t *)calloc(n ? n : 1, sizeof(size_t));
    g->offsets = (size_t *)calloc(n ? n : 1, sizeof(size_t));
    ddp_status st = DDP_OK;
    if (!g->b || !g->counts || !g->offsets) {
        st = ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda gpt: out of memory");
        goto out_free;
    }
    if ((st = attention_choice(cfg, &g->flash, err)) || (st = layout(g, counts, n, err)) ||
        (st = ddp__cuda_ctx_create(cfg->device, &g->ctx, err)))
        goto out_free;
    {
        const size_t N = (size_t)cfg->B * cfg->Tmax, C = (size_t)cfg->C, V = (size_t)cfg->V;
        /* flash keeps no probabilities (att/atth of 1 byte), lse instead, and a smaller scratch */
        const size_t TT = g->flash ? 0 : (size_t)cfg->B * cfg->nh * cfg->Tmax * cfg->Tmax;
        const size_t fscr = ddp__cuda_flash_scratch(cfg->B, cfg->Tmax, cfg->C, cfg->nh);
        g->correct_host = (int32_t *)malloc(sizeof(int32_t) * N);
        g->row_loss_host = (float *)malloc(sizeof(float) * N);
        if (!g->correct_host || !g->row_loss_host) {
            st = ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda gpt: out of host memory");
            goto out_free;
        }
        /* what both precisions have */
        if ((st = dalloc(&g->params, g->total, err)) || (st = dalloc(&g->tokens, N, err)) ||
            (st = dalloc(&g->targets, N, err)) || (st = dalloc(&g->correct, N, err)) ||
            (st = dalloc(&g->x0, N * C, err)) || (st = dalloc(&g->lnf_mean, N, err)) ||
            (st = dalloc(&g->lnf_rstd, N, err)) || (st = dalloc(&g->logits, N * V, err)) ||
            (st = dalloc(&g->row_loss, N, err)) || (st = dalloc(&g->dres, N * C, err)) ||
            (st = dalloc(&g->dln, N * C, err)))
            goto out_free;
        /* the padding between tensors is never written by an upload: zeros, so that the 16-bit
         * rounding of the whole flat buffer reads defined values */
        if ((st = ddp__cuda_memset0(g->ctx, g->params, sizeof(float) * g->total, err)))
            goto out_free;
        if (g->half) {
            if ((st = dalloc_h(&g->params_h, g->total, err)) ||
                (st = dalloc_h(&g->lnfh, N * C, err)) || (st = dalloc_h(&g->tmph, N * C, err)) ||
                (st = dalloc_h(&g->dresh, N * C, err)) ||
                (st = dalloc_h(&g->dbigh, N * 4 * C, err)) ||
                (st = dalloc_es(
                     &g->scratch_h, 1,
                     g->flash ? fscr
                              : ddp__cuda_attention_scratch_h(cfg->B, cfg->Tmax, cfg->C, cfg->nh),
                     err)))
                goto out_free;
        } else if ((st = dalloc(&g->lnf, N * C, err)) || (st = dalloc(&g->tmp, N * C, err)) ||
                   (st = dalloc(&g->dbig, N * 4 * C, err)) ||
                   (st = dalloc(
                        &g->scratch,
                        g->flash ? fscr / sizeof(float)
                                 : ddp__cuda_attention_scratch(cfg->B, cfg->Tmax, cfg->C, cfg->nh),
                        err))) {
            goto out_free;
        }
        for (int l = 0; l < cfg->L; l++) {
            blk *a = &g->b[l];
            if ((st = dalloc(&a->ln1_mean, N, err)) || (st = dalloc(&a->ln1_rstd, N, err)) ||
                (st = dalloc(&a->xmid, N * C, err)) || (st = dalloc(&a->ln2_mean, N, err)) ||
                (st = dalloc(&a->ln2_rstd, N, err)) || (st = dalloc(&a->xout, N * C, err)) ||
                (g->flash && (st = dalloc(&a->lse, (size_t)cfg->B * cfg->nh * cfg->Tmax, err))))
                goto out_free;
            if (g->half) {
                if ((st = dalloc_h(&a->ln1h, N * C, err)) ||
                    (st = dalloc_h(&a->qkvh, N * 3 * C, err)) ||
                    (st = dalloc_h(&a->atth, TT, err)) || (st = dalloc_h(&a->attyh, N * C, err)) ||
                    (st = dalloc_h(&a->ln2h, N * C, err)) ||
                    (st = dalloc_h(&a->fchh, N * 4 * C, err)) ||
                    (st = dalloc_h(&a->fchgh, N * 4 * C, err)))
                    goto out_free;
            } else if ((st = dalloc(&a->ln1, N * C, err)) ||
                       (st = dalloc(&a->qkv, N * 3 * C, err)) || (st = dalloc(&a->att, TT, err)) ||
                       (st = dalloc(&a->atty, N * C, err)) || (st = dalloc(&a->ln2, N * C, err)) ||
                       (st = dalloc(&a->fch, N * 4 * C, err)) ||
                       (st = dalloc(&a->fchg, N * 4 * C, err))) {
                goto out_free;
            }
        }
    }
    ddp__cuda_resident_init(&g->res, "cuda gpt", g->ctx, g->n_params, g->total, g->counts,
                            g->offsets, g->params);
    *out = g;
    return DDP_OK;
out_free:
    ddp__gpu_gpt_free(g);
    return st;
}

/* The runtime's current device is per thread: the model's calls make its own current, in case
 * this thread has used another device since (a GPU group on another GPU, another model). */
static ddp_status use_device(ddp__cuda_gpt *g, ddp_error *err)
{
    return ddp__cuda_check(cudaSetDevice(g->ctx->device), "cudaSetDevice", err);
}

extern "C" ddp_status ddp__gpu_gpt_set_params(ddp__cuda_gpt *g, const float *const *data_host,
                                              ddp_error *err)
{
    ddp_status st0 = use_device(g, err);
    if (st0)
        return st0;
    g->kv_valid = 0; /* new parameters: no cached keys and values */
    for (size_t i = 0; i < g->n_params; i++) {
        ddp_status st = ddp__cuda_to_device(g->ctx, param_of(g, i), data_host[i],
                                            sizeof(float) * g->counts[i], err);
        if (st)
            return st;
    }
    return DDP_OK;
}

/* dst (rows of C) = the last position of each of the n sequences of T rows in src. */
static ddp_status gather_last(ddp__cuda_gpt *g, const float *src, int n, int T, float *dst,
                              ddp_error *err)
{
    size_t row = sizeof(float) * (size_t)g->cfg.C;
    return ddp__cuda_check(cudaMemcpy2DAsync(dst, row, src + (size_t)(T - 1) * g->cfg.C,
                                             row * (size_t)T, row, (size_t)n,
                                             cudaMemcpyDeviceToDevice, g->ctx->stream),
                           "gather of the last positions", err);
}

/* The attention of block a for the rows being computed: the whole sequences (past 0, the
 * batched or fused kernel, with block id's dropout), or a generation step's positions past … T − 1
 * over the cached keys and values (one sequence). qkv and out are the block's buffers of type t. */
static ddp_status attend(ddp__cuda_gpt *g, ddp_dtype t, int id, const void *qkv, int n, int T,
                         int past, void *att, void *out, float *lse, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int C = g->cfg.C, nh = g->cfg.nh;
    if (past > 0)
        return ddp__cuda_attention_forward_cached(c, t, qkv, past, T, C, nh, g->kv_scratch, out,
                                                  g->cfg.precision, err);
    const ddp__cuda_drop da = drop_of(g, id, true);
    if (g->flash)
        return ddp__cuda_flash_forward(c, t, qkv, n, T, C, nh, out, lse, &da, err);
    if (t == DDP_FLOAT32)
        return ddp__cuda_attention_forward(c, (const float *)qkv, n, T, C, nh, (float *)att,
                                           g->scratch, (float *)out, g->cfg.precision, &da, err);
    return ddp__cuda_attention_forward_h(c, t, (const uint16_t *)qkv, n, T, C, nh, (uint16_t *)att,
                                         g->scratch_h, (uint16_t *)out, &da, err);
}

/* Precision fp32 or tf32, from the embedding's x0 to the logits (rows, V) in g->logits (rows as
 * forward_h). past > 0 (generation, n 1): only positions past … T − 1 are computed, into the
 * same rows of each buffer as a whole forward's, their attention over the cached qkv rows. */
static ddp_status forward_fp32(ddp__cuda_gpt *g, int n, int T, int past, int rows, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int C = g->cfg.C, V = g->cfg.V, Tn = T - past, N = n * Tn;
    const size_t NC = (size_t)N * C, o = (size_t)past * C; /* o: the first row's offset */
    const ddp_precision pr = g->cfg.precision;
    ddp_status st;
    const float *x = g->x0 + o;
    for (int l = 0; l < g->cfg.L; l++) {
        blk *a = &g->b[l];
        if ((st = ddp__cuda_layernorm_forward(c, x, P(g, a->ln1_w), P(g, a->ln1_b), N, C, LN_EPS,
                                              a->ln1 + o, a->ln1_mean + past, a->ln1_rstd + past,
                                              err)) ||
            (st = ddp__cuda_linear_forward(c, a->ln1 + o, P(g, a->attn_w), P(g, a->attn_b), N, C,
                                           3 * C, a->qkv + 3 * o, pr, err)) ||
            (st = attend(g, DDP_FLOAT32, 2 + 3 * l, a->qkv, n, T, past, a->att, a->atty, a->lse,
                         err)) ||
            (st = ddp__cuda_linear_forward(c, a->atty + o, P(g, a->proj_w), P(g, a->proj_b), N, C,
                                           C, g->tmp, pr, err)) ||
            (st = drop_branch(g, 3 + 3 * l, DDP_FLOAT32, g->tmp, NC, err)) ||
            (st = ddp__cuda_add(c, x, g->tmp, NC, a->xmid + o, err)) ||
            (st = ddp__cuda_layernorm_forward(c, a->xmid + o, P(g, a->ln2_w), P(g, a->ln2_b), N, C,
                                              LN_EPS, a->ln2 + o, a->ln2_mean + past,
                                              a->ln2_rstd + past, err)) ||
            (st = ddp__cuda_linear_gelu_forward(c, DDP_FLOAT32, a->ln2 + o, P(g, a->fc_w),
                                                P(g, a->fc_b), N, C, 4 * C, a->fch + 4 * o,
                                                a->fchg + 4 * o, pr, err)) ||
            (st = ddp__cuda_linear_forward(c, a->fchg + 4 * o, P(g, a->mproj_w), P(g, a->mproj_b),
                                           N, 4 * C, C, g->tmp, pr, err)) ||
            (st = drop_branch(g, 4 + 3 * l, DDP_FLOAT32, g->tmp, NC, err)) ||
            (st = ddp__cuda_add(c, a->xmid + o, g->tmp, NC, a->xout + o, err)))
            return st;
        x = a->xout + o;
    }
    if (rows != N) {
        if ((st = gather_last(g, x, n, Tn, g->tmp, err)))
            return st;
        x = g->tmp;
    }
    if ((st = ddp__cuda_layernorm_forward(c, x, P(g, g->lnf_w), P(g, g->lnf_b), rows, C, LN_EPS,
                                          g->lnf, g->lnf_mean, g->lnf_rstd, err)) ||
        (st = ddp__cuda_gemm(c, false, true, rows, V, C, 1.0f, g->lnf, C, P(g, g->wte), C, 0.0f,
                             g->logits, V, DDP_FLOAT32, DDP_FLOAT32, NULL, pr, err)))
        return st;
    return DDP_OK;
}

/* The precision of the 16-bit products (what ddp__cuda_gemm's messages name). */
static ddp_precision hprec(const ddp__cuda_gpt *g)
{
    return g->ht == DDP_FLOAT16 ? DDP_PRECISION_FP16 : DDP_PRECISION_BF16;
}

/* The weights' 16-bit copy, once per forward and at each bind (the padding between tensors is
 * zeros): in one pass over the flat buffer, or tensor by tensor from where they are bound. */
static ddp_status round_h(ddp__cuda_gpt *g, ddp_error *err)
{
    if (!g->res.bound)
        return ddp__cuda_f32_to_h(g->ctx, g->ht, g->params, g->total, g->params_h, err);
    ddp_status st = DDP_OK;
    for (size_t i = 0; i < g->n_params && !st; i++)
        st = ddp__cuda_f32_to_h(g->ctx, g->ht, g->res.bound[i], g->counts[i],
                                g->params_h + g->offsets[i], err);
    return st;
}

/* Precision bf16 or fp16 (g->ht), from the embedding's x0 to the logits (rows, V) fp32 in
 * g->logits: the blocks and the head with every rounding of docs/gpu.md's table. rows: N, or n
 * for the last positions. past: as forward_fp32 (the weights' 16-bit copy is then the previous
 * forward's: the parameters have not changed since, ddp__gpu_gpt_forward_cached's contract). */
static ddp_status forward_h(ddp__cuda_gpt *g, int n, int T, int past, int rows, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int C = g->cfg.C, V = g->cfg.V, Tn = T - past, N = n * Tn;
    const size_t NC = (size_t)N * C, o = (size_t)past * C;
    const ddp_dtype ht = g->ht;
    ddp_status st;
    if (past == 0 && (st = round_h(g, err)))
        return st;
    const float *x = g->x0 + o;
    for (int l = 0; l < g->cfg.L; l++) {
        blk *a = &g->b[l];
        if ((st = ddp__cuda_layernorm_forward_h(c, ht, x, P(g, a->ln1_w), P(g, a->ln1_b), N, C,
                                                LN_EPS, a->ln1h + o, a->ln1_mean + past,
                                                a->ln1_rstd + past, err)) ||
            (st = ddp__cuda_linear_forward_h(c, ht, a->ln1h + o, PH(g, a->attn_w), PH(g, a->attn_b),
                                             N, C, 3 * C, a->qkvh + 3 * o, err)) ||
            (st = attend(g, ht, 2 + 3 * l, a->qkvh, n, T, past, a->atth, a->attyh, a->lse, err)) ||
            (st = ddp__cuda_linear_forward_h(c, ht, a->attyh + o, PH(g, a->proj_w),
                                             PH(g, a->proj_b), N, C, C, g->tmph, err)) ||
            (st = drop_branch(g, 3 + 3 * l, ht, g->tmph, NC, err)) ||
            (st = ddp__cuda_add_h(c, ht, x, g->tmph, NC, a->xmid + o, err)) ||
            (st = ddp__cuda_layernorm_forward_h(c, ht, a->xmid + o, P(g, a->ln2_w), P(g, a->ln2_b),
                                                N, C, LN_EPS, a->ln2h + o, a->ln2_mean + past,
                                                a->ln2_rstd + past, err)) ||
            (st = ddp__cuda_linear_gelu_forward(c, ht, a->ln2h + o, PH(g, a->fc_w), PH(g, a->fc_b),
                                                N, C, 4 * C, a->fchh + 4 * o, a->fchgh + 4 * o,
                                                hprec(g), err)) ||
            (st = ddp__cuda_linear_forward_h(c, ht, a->fchgh + 4 * o, PH(g, a->mproj_w),
                                             PH(g, a->mproj_b), N, 4 * C, C, g->tmph, err)) ||
            (st = drop_branch(g, 4 + 3 * l, ht, g->tmph, NC, err)) ||
            (st = ddp__cuda_add_h(c, ht, a->xmid + o, g->tmph, NC, a->xout + o, err)))
            return st;
        x = a->xout + o;
    }
    if (rows != N) { /* the last positions only: gathered into dln (fp32, free in forward) */
        if ((st = gather_last(g, x, n, Tn, g->dln, err)))
            return st;
        x = g->dln;
    }
    /* ln_f in fp32 statistics, 16-bit out; the head 16 × 16 bits with fp32 logits */
    if ((st = ddp__cuda_layernorm_forward_h(c, ht, x, P(g, g->lnf_w), P(g, g->lnf_b), rows, C,
                                            LN_EPS, g->lnfh, g->lnf_mean, g->lnf_rstd, err)))
        return st;
    return ddp__cuda_gemm(c, false, true, rows, V, C, 1.0f, g->lnfh, C, PH(g, g->wte), C, 0.0f,
                          g->logits, V, ht, DDP_FLOAT32, NULL, hprec(g), err);
}

extern "C" ddp_status ddp__gpu_gpt_forward(ddp__cuda_gpt *g, const int32_t *tokens,
                                           const int32_t *targets, int n, int T, bool train,
                                           bool last_logits, float grad_scale, uint64_t step,
                                           uint64_t sample_offset, double *loss_sum, int *count,
                                           int64_t *correct, float *logits_host, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int C = g->cfg.C, V = g->cfg.V, N = n * T;
    ddp_status st;
    g->can_backward = false;
    g->n = n;
    g->T = T;
    g->drop_on = train && g->cfg.dropout > 0.0f;
    g->step = step;
    g->soff = sample_offset;
    if ((st = use_device(g, err)) ||
        (st = ddp__cuda_to_device(c, g->tokens, tokens, sizeof(int32_t) * (size_t)N, err)) ||
        (targets &&
         (st = ddp__cuda_to_device(c, g->targets, targets, sizeof(int32_t) * (size_t)N, err))) ||
        (st = ddp__cuda_embedding_forward(c, g->tokens, P(g, g->wte), P(g, g->wpe), n, T, C, g->x0,
                                          err)) ||
        (st = drop_branch(g, 1, DDP_FLOAT32, g->x0, (size_t)N * C, err)))
        return st;
    int rows = !train && !targets && last_logits ? n : N;
    g->kv_valid = 0;
    if ((st = g->half ? forward_h(g, n, T, 0, rows, err) : forward_fp32(g, n, T, 0, rows, err)))
        return st;
    if (n == 1 && !g->drop_on) /* one sequence without dropout: what a generation step reuses */
        g->kv_valid = T;
    if (!targets) {
        if (logits_host)
            return ddp__cuda_to_host(c, logits_host, g->logits, sizeof(float) * (size_t)rows * V,
                                     err);
        return ddp__cuda_sync(c, err);
    }
    int cnt = 0;
    for (int r = 0; r < N; r++)
        cnt += targets[r] != -1; /* DDP_NN_IGNORE_INDEX */
    /* the loss in fp32 in every precision; in 16 bits the gradient (× grad_scale: fp16's loss
     * scale) replaces the logits as 16-bit values (leading dimension 2V) for the head's products */
    if ((st = g->half
                  ? ddp__cuda_vocab_xent_hgrad(c, g->ht, g->logits, g->targets, N, V, grad_scale,
                                               cnt, g->row_loss, g->correct, train, err)
                  : ddp__cuda_vocab_xent(c, g->logits, g->targets, N, V, grad_scale, cnt,
                                         g->row_loss, g->correct, train ? g->logits : NULL, err)) ||
        (st =
             ddp__cuda_to_host(c, g->row_loss_host, g->row_loss, sizeof(float) * (size_t)N, err)) ||
        (st = ddp__cuda_to_host(c, g->correct_host, g->correct, sizeof(int32_t) * (size_t)N, err)))
        return st;
    double s = 0;
    int64_t k = 0;
    for (int r = 0; r < N; r++) {
        s += g->row_loss_host[r];
        k += g->correct_host[r];
    }
    *loss_sum = s;
    *count = cnt;
    *correct = k;
    g->can_backward = train;
    if (!train && logits_host) /* evaluation keeps the logits, as the CPU model does */
        return ddp__cuda_to_host(c, logits_host, g->logits, sizeof(float) * (size_t)N * V, err);
    return DDP_OK;
}

/* At most this many positions a cached forward (past > 0): more, and the whole forward is run
 * (as fast on a GPU; it bounds the cached attention's scratch: scores nh × KV_ROWS × block_size).
 */
#define KV_ROWS 64

extern "C" ddp_status ddp__gpu_gpt_forward_cached(ddp__cuda_gpt *g, const int32_t *tokens, int T,
                                                  int past, float *logits_host, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int C = g->cfg.C, nh = g->cfg.nh, m = T - past;
    if (T < 1 || T > g->cfg.Tmax || past < 0 || past >= T)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda gpt: cached forward of %d positions, %d of them cached "
                              "(block_size %d; at least one new position)",
                              T, past, g->cfg.Tmax);
    /* nothing here to reuse (the last forward was a batch or had dropout, or this module changed
     * the parameters since), or too many new positions: the caller's whole forward */
    if (past == 0 || past > g->kv_valid || m > KV_ROWS)
        return ddp__cuda_fail(err, DDP_ERR_NOT_FOUND,
                              "cuda gpt: %d cached positions to reuse, %d valid here, %d new (at "
                              "most %d): run the whole forward",
                              past, g->kv_valid, m, KV_ROWS);
    ddp_status st;
    if ((st = use_device(g, err)) ||
        (!g->kv_scratch &&
         (st = dalloc_es(&g->kv_scratch, 1,
                         ddp__cuda_attention_cached_scratch(KV_ROWS, g->cfg.Tmax, C, nh), err))))
        return st;
    g->can_backward = false;
    g->kv_valid = 0;
    g->n = 1;
    g->T = T;
    g->drop_on = false;
    if ((st = ddp__cuda_to_device(c, g->tokens, tokens + past, sizeof(int32_t) * (size_t)m, err)) ||
        (st = ddp__cuda_embedding_forward(c, g->tokens, P(g, g->wte),
                                          P(g, g->wpe) + (size_t)past * C, 1, m, C,
                                          g->x0 + (size_t)past * C, err)) ||
        (st = g->half ? forward_h(g, 1, T, past, 1, err) : forward_fp32(g, 1, T, past, 1, err)))
        return st;
    g->kv_valid = T;
    if (logits_host)
        return ddp__cuda_to_host(c, logits_host, g->logits, sizeof(float) * (size_t)g->cfg.V, err);
    return ddp__cuda_sync(c, err);
}

/* Precision fp32 or tf32: from the loss's gradient in g->logits to the residual stream's
 * gradient at block 0's input in g->dres, the weights' gradients into g->grads (zeroed). */
static ddp_status backward_fp32(ddp__cuda_gpt *g, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int n = g->n, T = g->T, C = g->cfg.C, nh = g->cfg.nh, V = g->cfg.V, N = n * T;
    const size_t NC = (size_t)N * C;
    const ddp_precision pr = g->cfg.precision;
    ddp_status st;
    /* the LM head (tied to wte): dln = dlogits · wte, dwte += dlogitsᵀ · lnf */
    if ((st = ddp__cuda_gemm(c, false, false, N, C, V, 1.0f, g->logits, V, P(g, g->wte), C, 0.0f,
                             g->dln, C, DDP_FLOAT32, DDP_FLOAT32, NULL, pr, err)) ||
        (st = ddp__cuda_gemm(c, true, false, V, C, N, 1.0f, g->logits, V, g->lnf, C, 1.0f,
                             G(g, g->wte), C, DDP_FLOAT32, DDP_FLOAT32, NULL, pr, err)) ||
        (st = ddp__cuda_layernorm_backward(c, g->dln, g->b[g->cfg.L - 1].xout, P(g, g->lnf_w),
                                           g->lnf_mean, g->lnf_rstd, N, C, g->dres, G(g, g->lnf_w),
                                           G(g, g->lnf_b), err)) ||
        (st = mark_ready(g, {g->lnf_b, g->lnf_w}, err)))
        return st;
    for (int l = g->cfg.L - 1; l >= 0; l--) {
        blk *a = &g->b[l];
        const float *x = l > 0 ? g->b[l - 1].xout : g->x0;
        const ddp__cuda_drop dm = drop_of(g, 4 + 3 * l, false), dp = drop_of(g, 3 + 3 * l, false),
                             da = drop_of(g, 2 + 3 * l, true);
        /* each residual branch's gradient: dres, or with dropout dres masked into tmp */
        const float *dy = g->drop_on ? g->tmp : g->dres;
        if ((g->drop_on && (st = ddp__cuda_dropout(c, DDP_FLOAT32, g->dres, DDP_FLOAT32, g->tmp, NC,
                                                   &dm, err))) ||
            (st = ddp__cuda_linear_backward(c, dy, a->fchg, P(g, a->mproj_w), N, 4 * C, C, NULL,
                                            G(g, a->mproj_w), G(g, a->mproj_b), pr, err)) ||
            (st = ddp__cuda_linear_dgelu_backward(c, DDP_FLOAT32, dy, P(g, a->mproj_w), a->fch, N,
                                                  4 * C, C, g->dbig, pr, err)) ||
            (st = ddp__cuda_linear_backward(c, g->dbig, a->ln2, P(g, a->fc_w), N, C, 4 * C, g->dln,
                                            G(g, a->fc_w), G(g, a->fc_b), pr, err)) ||
            (st = ddp__cuda_layernorm_backward(c, g->dln, a->xmid, P(g, a->ln2_w), a->ln2_mean,
                                               a->ln2_rstd, N, C, g->dln, G(g, a->ln2_w),
                                               G(g, a->ln2_b), err)) ||
            (st = mark_ready(g, {a->mproj_b, a->mproj_w, a->fc_b, a->fc_w, a->ln2_b, a->ln2_w},
                             err)) ||
            (st = ddp__cuda_add(c, g->dres, g->dln, NC, g->dres, err)) ||
            (g->drop_on && (st = ddp__cuda_dropout(c, DDP_FLOAT32, g->dres, DDP_FLOAT32, g->tmp, NC,
                                                   &dp, err))) ||
            (st = ddp__cuda_linear_backward(c, dy, a->atty, P(g, a->proj_w), N, C, C, g->dln,
                                            G(g, a->proj_w), G(g, a->proj_b), pr, err)) ||
            (st = g->flash
                      ? ddp__cuda_flash_backward(c, DDP_FLOAT32, g->dln, a->qkv, a->atty, a->lse, n,
                                                 T, C, nh, g->scratch, g->dbig, &da, err)
                      : ddp__cuda_attention_backward(c, g->dln, a->qkv, a->att, n, T, C, nh,
                                                     g->scratch, g->dbig, pr, &da, err)) ||
            (st = ddp__cuda_linear_backward(c, g->dbig, a->ln1, P(g, a->attn_w), N, C, 3 * C,
                                            g->dln, G(g, a->attn_w), G(g, a->attn_b), pr, err)) ||
            (st = ddp__cuda_layernorm_backward(c, g->dln, x, P(g, a->ln1_w), a->ln1_mean,
                                               a->ln1_rstd, N, C, g->dln, G(g, a->ln1_w),
                                               G(g, a->ln1_b), err)) ||
            (st = mark_ready(g, {a->proj_b, a->proj_w, a->attn_b, a->attn_w, a->ln1_b, a->ln1_w},
                             err)) ||
            (st = ddp__cuda_add(c, g->dres, g->dln, NC, g->dres, err)))
            return st;
    }
    return DDP_OK;
}

/* Precision bf16 or fp16: as backward_fp32, with the roundings of docs/gpu.md's table. The
 * loss's gradient is the 16-bit matrix (N, V), leading dimension 2V, that the forward wrote over
 * the logits; dres stays fp32 and is rounded into dresh for each product that reads it (in fp16
 * a scaled gradient beyond 65504 becomes inf there, and from there the fp32 gradients). */
static ddp_status backward_h(ddp__cuda_gpt *g, ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int n = g->n, T = g->T, C = g->cfg.C, nh = g->cfg.nh, V = g->cfg.V, N = n * T;
    const size_t NC = (size_t)N * C;
    const ddp_dtype ht = g->ht;
    const uint16_t *dlog = (const uint16_t *)g->logits;
    const int ldd = 2 * V;
    ddp_status st;
    /* the LM head (tied to wte): dln (fp32) = dlogits · wte, dwte += dlogitsᵀ · lnf */
    if ((st = ddp__cuda_gemm(c, false, false, N, C, V, 1.0f, dlog, ldd, PH(g, g->wte), C, 0.0f,
                             g->dln, C, ht, DDP_FLOAT32, NULL, hprec(g), err)) ||
        (st = ddp__cuda_gemm(c, true, false, V, C, N, 1.0f, dlog, ldd, g->lnfh, C, 1.0f,
                             G(g, g->wte), C, ht, DDP_FLOAT32, NULL, hprec(g), err)) ||
        (st = ddp__cuda_layernorm_backward(c, g->dln, g->b[g->cfg.L - 1].xout, P(g, g->lnf_w),
                                           g->lnf_mean, g->lnf_rstd, N, C, g->dres, G(g, g->lnf_w),
                                           G(g, g->lnf_b), err)) ||
        (st = mark_ready(g, {g->lnf_b, g->lnf_w}, err)))
        return st;
    for (int l = g->cfg.L - 1; l >= 0; l--) {
        blk *a = &g->b[l];
        const float *x = l > 0 ? g->b[l - 1].xout : g->x0;
        const ddp__cuda_drop dm = drop_of(g, 4 + 3 * l, false), dp = drop_of(g, 3 + 3 * l, false),
                             da = drop_of(g, 2 + 3 * l, true);
        /* MLP: dfch (16-bit, dbigh) = (dres·Wmproj) ⊙ GELU'(fch) (dres rounded, with dropout
         * masked first; the GELU's backward in the product's epilogue where cuBLASLt has it);
         * dln2 (fp32) = dfch·Wfc; ln_2's backward in fp32; dres += dln2 */
        if ((st = ddp__cuda_dropout(c, DDP_FLOAT32, g->dres, ht, g->dresh, NC, &dm, err)) ||
            (st = ddp__cuda_linear_backward_h(c, ht, g->dresh, a->fchgh, PH(g, a->mproj_w), N,
                                              4 * C, C, NULL, ht, G(g, a->mproj_w),
                                              G(g, a->mproj_b), err)) ||
            (st = ddp__cuda_linear_dgelu_backward(c, ht, g->dresh, PH(g, a->mproj_w), a->fchh, N,
                                                  4 * C, C, g->dbigh, hprec(g), err)) ||
            (st = ddp__cuda_linear_backward_h(c, ht, g->dbigh, a->ln2h, PH(g, a->fc_w), N, C, 4 * C,
                                              g->dln, DDP_FLOAT32, G(g, a->fc_w), G(g, a->fc_b),
                                              err)) ||
            (st = ddp__cuda_layernorm_backward(c, g->dln, a->xmid, P(g, a->ln2_w), a->ln2_mean,
                                               a->ln2_rstd, N, C, g->dln, G(g, a->ln2_w),
                                               G(g, a->ln2_b), err)) ||
            (st = mark_ready(g, {a->mproj_b, a->mproj_w, a->fc_b, a->fc_w, a->ln2_b, a->ln2_w},
                             err)) ||
            (st = ddp__cuda_add(c, g->dres, g->dln, NC, g->dres, err)))
            return st;
        /* attention: datty (16-bit, tmph) = dres·Wproj; dqkv (16-bit, dbigh); dln1 (fp32) =
         * dqkv·Wattn; ln_1's backward in fp32; dres += dln1 */
        if ((st = ddp__cuda_dropout(c, DDP_FLOAT32, g->dres, ht, g->dresh, NC, &dp, err)) ||
            (st =
                 ddp__cuda_linear_backward_h(c, ht, g->dresh, a->attyh, PH(g, a->proj_w), N, C, C,
                                             g->tmph, ht, G(g, a->proj_w), G(g, a->proj_b), err)) ||
            (st = g->flash
                      ? ddp__cuda_flash_backward(c, ht, g->tmph, a->qkvh, a->attyh, a->lse, n, T, C,
                                                 nh, g->scratch_h, g->dbigh, &da, err)
                      : ddp__cuda_attention_backward_h(c, ht, g->tmph, a->qkvh, a->atth, n, T, C,
                                                       nh, g->scratch_h, g->dbigh, &da, err)) ||
            (st = ddp__cuda_linear_backward_h(c, ht, g->dbigh, a->ln1h, PH(g, a->attn_w), N, C,
                                              3 * C, g->dln, DDP_FLOAT32, G(g, a->attn_w),
                                              G(g, a->attn_b), err)) ||
            (st = ddp__cuda_layernorm_backward(c, g->dln, x, P(g, a->ln1_w), a->ln1_mean,
                                               a->ln1_rstd, N, C, g->dln, G(g, a->ln1_w),
                                               G(g, a->ln1_b), err)) ||
            (st = mark_ready(g, {a->proj_b, a->proj_w, a->attn_b, a->attn_w, a->ln1_b, a->ln1_w},
                             err)) ||
            (st = ddp__cuda_add(c, g->dres, g->dln, NC, g->dres, err)))
            return st;
    }
    return DDP_OK;
}

extern "C" ddp_status ddp__gpu_gpt_backward(ddp__cuda_gpt *g, float *const *grads_host,
                                            ddp_error *err)
{
    if (!g->can_backward)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda gpt: backward without a training "
                              "forward");
    g->can_backward = false;
    ddp__cuda_ctx *c = g->ctx;
    const int n = g->n, T = g->T, C = g->cfg.C;
    ddp_status st;
    /* the host's backward: the flat gradient buffer and its staging, made at the first */
    if (!g->grads_dev && !g->grads && (st = use_device(g, err)))
        return st;
    if (!g->grads_dev && !g->grads && (st = dalloc(&g->grads, g->total, err))) {
        char why[sizeof err->msg] = ""; /* made now, not at create: say what and what to do */
        if (err)
            snprintf(why, sizeof why, "%s", err->msg);
        return ddp__cuda_fail(err, st,
                              "cuda gpt: the gradients' buffer (%.1f MiB of device memory, made at "
                              "the first backward of host-driven training) does not fit: %s; HINT: "
                              "device-resident training (resident true) needs none; or use a "
                              "smaller model, batch_size or block_size",
                              (double)(sizeof(float) * g->total) / (1024.0 * 1024.0), why);
    }
    if (!g->grads_dev && !g->grads_host &&
        !(g->grads_host = (float *)malloc(sizeof(float) * (g->total ? g->total : 1))))
        return ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda gpt: out of host memory");
    /* backward_dev: straight into the caller's gradients, which accumulate (no zeroing) */
    if ((st = use_device(g, err)) ||
        (!g->grads_dev && (st = ddp__cuda_memset0(c, g->grads, sizeof(float) * g->total, err))) ||
        (st = g->half ? backward_h(g, err) : backward_fp32(g, err)))
        return st;
    /* the embedding's dropout: its mask on dres, which nothing reads after this */
    if ((st = drop_branch(g, 1, DDP_FLOAT32, g->dres, (size_t)n * T * C, err)) ||
        (st = ddp__cuda_embedding_backward(c, g->dres, g->tokens, n, T, C, G(g, g->wte),
                                           G(g, g->wpe), err)) ||
        (st = mark_ready(g, {g->wpe, g->wte}, err)))
        return st;
    if (g->grads_dev)
        return DDP_OK;
    if ((st = ddp__cuda_to_host(c, g->grads_host, g->grads, sizeof(float) * g->total, err)))
        return st;
    for (size_t i = 0; i < g->n_params; i++) {
        const float *src = g->grads_host + g->offsets[i];
        float *dst = grads_host[i];
        for (size_t k = 0; k < g->counts[i]; k++)
            dst[k] += src[k];
    }
    return DDP_OK;
}

/* ---- device-resident training (kernels.h: ddp__cuda_gpt_dev_info …) ------------------------
 * The parameters stay in the flat buffer between steps (no upload before forward, ddp_model's
 * resident mode skips it); backward's gradient kernels add straight into the caller's device
 * buffers (the reducer's bucket views), and each parameter is reported ready as soon as its
 * kernels are queued, so its bucket's allreduce overlaps the rest of backward; the optimizer's
 * state is two more flat buffers like the parameters' (resident.cu, shared with classifier.cu).
 * Everything on the model's one stream. */

extern "C" ddp_status ddp__gpu_gpt_dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream,
                                            ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->n_params; i++)
        params_dev[i] = param_of(g, i);
    *stream = (void *)g->ctx->stream;
    return DDP_OK;
}

extern "C" ddp_status ddp__gpu_gpt_get_params(ddp__cuda_gpt *g, float *const *data_host,
                                              ddp_error *err)
{
    ddp_status st = use_device(g, err);
    for (size_t i = 0; i < g->n_params && !st; i++)
        st = ddp__cuda_to_host(g->ctx, data_host[i], param_of(g, i), sizeof(float) * g->counts[i],
                               err);
    return st;
}

extern "C" ddp_status ddp__gpu_gpt_backward_dev(ddp__cuda_gpt *g, float *const *grads_dev,
                                                ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                                ddp_error *err)
{
    g->grads_dev = grads_dev;
    g->ready = ready;
    g->ready_ctx = ctx;
    g->ready_st = DDP_OK;
    ddp_status st = ddp__gpu_gpt_backward(g, NULL, err);
    g->grads_dev = NULL;
    g->ready = NULL;
    return st;
}

extern "C" ddp_status ddp__gpu_gpt_optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err)
{
    return ddp__cuda_resident_optim_init(&g->res, nstates, err);
}

extern "C" ddp_status ddp__gpu_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a,
                                              ddp_error *err)
{
    g->kv_valid = 0;
    return ddp__cuda_resident_optim_step(&g->res, a, err);
}

extern "C" ddp_status ddp__gpu_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *host,
                                               bool to_host, ddp_error *err)
{
    return ddp__cuda_resident_optim_state(&g->res, s, host, to_host, err);
}

extern "C" ddp_status ddp__gpu_gpt_bind_params(ddp__cuda_gpt *g, float *const *params_dev,
                                               ddp_error *err)
{
    ddp_status st = DDP_OK;
    g->kv_valid = 0;
    /* unbound again: the flat buffer back first (zeroed padding, as at create), for the values */
    if (!params_dev && g->res.bound && !g->params &&
        ((st = use_device(g, err)) || (st = dalloc(&g->params, g->total, err)) ||
         (st = ddp__cuda_memset0(g->ctx, g->params, sizeof(float) * g->total, err))))
        return st;
    g->res.params = g->params;
    if ((st = ddp__cuda_resident_bind_params(&g->res, params_dev, err)))
        return st;
    /* bound, the flat buffer holds nothing anyone reads (the caller binds copies of the values):
     * freed, the model's parameters cost no memory beside the caller's (the reducer's buckets,
     * with the sharded step: a full copy of the weights saved per rank) */
    if (params_dev && g->params && !(st = ddp__cuda_sync(g->ctx, err))) {
        ddp__cuda_free(g->params);
        g->params = g->res.params = NULL;
    }
    /* bound, the 16-bit copy is rounded tensor by tensor: its padding zeroed; rounded again now
     * from the arrays bound, so that a backward after a forward of the old ones reads the values
     * the forward used (the caller binds copies of them) */
    if (!st && params_dev && g->half &&
        !(st = ddp__cuda_memset0(g->ctx, g->params_h, sizeof(uint16_t) * g->total, err)))
        st = round_h(g, err);
    return st;
}

extern "C" ddp_status ddp__gpu_gpt_state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err)
{
    return ddp__cuda_resident_state_dev(&g->res, s, dev, err);
}

extern "C" ddp_status ddp__gpu_gpt_optim_keep(ddp__cuda_gpt *g, const size_t *lo, const size_t *hi,
                                              ddp_error *err)
{
    return ddp__cuda_resident_optim_keep(&g->res, lo, hi, err);
}
