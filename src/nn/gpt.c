/*
 * gpt.c — the "gpt" model type of ddp/model.h: GPT-2 as nanoGPT writes it (pre-LN blocks,
 * causal self-attention, 4× MLP with tanh GELU, final layernorm, LM head tied to the token
 * embedding), composed from the transformer layers of ddp/nn.h, with the cross-entropy over the
 * vocabulary fused into forward.
 *
 * Activations are allocated once at build for max_batch × block_size tokens, and only what the
 * backward reads is kept: per block the residual stream in and after attention, both layernorm
 * outputs and their row statistics, qkv, the heads' output, the attention's log-sum-exp (no T×T
 * per head), the MLP's pre- and post-GELU activations, dropout masks when dropout is on. The
 * projections' outputs and every gradient go through a few shared (N, C) / (N, 4C) buffers. The
 * biggest buffer, the logits (N, V), is turned into its own gradient by the training forward.
 *
 * Backward runs the blocks from the top and reports each parameter ready as soon as its gradient
 * is final, the tied token embedding last (the LM head's and the embedding's gradients both land
 * in it). Dropout draws from (spec.seed + layer id, step, global element index): layer id 1 is the
 * embedding's dropout, then 2 + 3·l, 3 + 3·l, 4 + 3·l the attention probabilities', the attention
 * residual's and the MLP residual's of block l; every offset starts from batch.sample_offset, so
 * masks follow the global sample, not the rank. (Layer ids start at 1 so that no dropout stream
 * shares the initialiser's (spec.seed, tensor id) keys.)
 *
 * Device cuda (spec.device): the same forward and backward run on the GPU (kernels/cuda/gpt.cu,
 * through kernels.h), fp32, TF32, bf16 or fp16 (autocast-style: 16-bit products and activations,
 * fp32 residual stream, statistics, loss and master weights; fp16 with the caller's loss scale in
 * the batch's grad_scale; docs/gpu.md), dropout with the same masks as here (drawn again in the
 * backward rather than stored); this file keeps the parameter list, the checks and the host's
 * logits. Not yet run on a GPU (docs/gpu.md).
 *
 * Generation (batch.kv_cache): each block's c_attn output is kept for the context's
 * positions, and a forward whose tokens extend the previous one's computes only the new rows —
 * their attention over the cached keys and values (ddp_nn_attention_forward_cached) — and the
 * last row's logits (last_logits). On the GPU the cache is the device's own per-block c_attn
 * buffers (ddp__cuda_gpt_forward_cached); this file finds the common prefix either way.
 *
 * What it does not do: fp16 on the CPU, its own threads (OpenBLAS's run inside each product).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/nn.h"
#include "ddp/optim.h"
#include "kernels/kernels.h"
#include "nn/bf16h.h"
#include "nn/model_int.h"

#define LN_EPS 1e-5f

/* Indices into the model's parameter list; −1 where bias is false. */
typedef struct block_params {
    int ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, mproj_w, mproj_b;
} block_params;

/* What one block keeps for the backward; N = max_batch·block_size rows. */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N, C), (N,), (N,) ln_1's output and statistics */
    float *qkv;                       /* (N, 3C) c_attn's output */
    float *atty;                      /* (N, C) the heads' output, c_proj's input */
    float *lse;                       /* (B, nh, T) the attention's log-sum-exp per query row */
    float *xmid;                      /* (N, C) residual stream after attention, ln_2's input */
    float *ln2, *ln2_mean, *ln2_rstd; /* (N, C), (N,), (N,) */
    float *fch;                       /* (N, 4C) c_fc's output, the GELU's input */
    float *fchg;                      /* (N, 4C) the GELU's output, mlp.c_proj's input */
    float *xout;                      /* (N, C) residual stream out: the next block's input */
    uint8_t *mask_a, *mask_m;         /* (N, C) residual dropout masks (NULL without dropout) */
    /* precision bf16 (gpt.bf16h): the four linear layers' inputs kept in bfloat16 only — ln1,
     * atty, ln2 and fchg above are then NULL (nn/bf16h.h) */
    uint16_t *ln1h, *attyh, *ln2h, *fchgh; /* (N, C), (N, C), (N, C), (N, 4C) */
    uint16_t *qkvh; /* (N, 3C) c_attn's output, rounded (the attention's operands); qkv NULL */
} block_acts;

typedef struct gpt {
    int L, nh, C, Tmax, V, B; /* n_layer, n_head, n_embd, block_size, vocab_size, max_batch */
    bool bias;
    float p; /* dropout */
    uint64_t seed;
    ddp_nn_attention att;
    int p_wte, p_wpe, p_lnf_w, p_lnf_b;
    block_params *bp;                 /* (L,) */
    block_acts *ba;                   /* (L,) */
    float *x0;                        /* (N, C) embedding (after its dropout): block 0's input */
    uint8_t *mask_e;                  /* (N, C) the embedding's dropout mask, or NULL */
    float *lnf, *lnf_mean, *lnf_rstd; /* (N, C), (N,), (N,) ln_f */
    float *logits;       /* (N, V): logits, or d loss / d logits after a training forward */
    float *attn_scratch; /* att.scratch_floats */
    float *tmp;          /* (N, C) projections' outputs; gradients */
    float *dres, *dln;   /* (N, C) gradient of the residual stream; of a branch */
    float *dbig;         /* (N, 4C) gradient of fch, also of qkv (N, 3C) */
    /* precision bf16: layer inputs kept in bfloat16 (block_acts), with this scratch: */
    bool bf16h;
    float *ftmp;   /* (N, C) a layernorm's or the attention's float32 output, before rounding */
    float *hrow;   /* (C,) one layernorm row */
    uint16_t *wh;  /* (4C·C) a rounded weight */
    uint16_t *dyh; /* (N, 4C) a rounded output gradient */
    /* the last forward */
    const int32_t *tokens; /* (n, T) borrowed until backward */
    int n, T;
    bool train;
    uint64_t step, sample_offset;
    size_t logit_rows; /* rows of logits valid; 0: none (none yet, or they hold the gradient) */
    /* generation's key/value cache (batch.kv_cache, CPU): each block's c_attn output (Tmax, 3C)
     * for the positions of kv_tokens[0 … kv_len), allocated by the first kv_cache forward; any
     * other forward empties it (kv_len 0) */
    float *kv;          /* (L, Tmax, 3C) */
    int32_t *kv_tokens; /* (Tmax,) */
    int kv_len;
    /* precision bf16: the weights of the products rounded once for the kv_cache forwards (per
     * block c_attn, c_proj, c_fc, mlp.c_proj; then wte), not at every token; valid while kvw_ok,
     * which any other forward clears */
    uint16_t *kvw;
    bool kvw_ok;
    size_t logits_cap; /* device cuda: floats in logits, allocated when a forward first hands
                          logits to the host (prediction, generation): (B·T, V) is 13 GB at
                          GPT-2's size and B 64, and training never needs it */
    /* device cuda (kernels/cuda/gpt.cu): the forward and backward run there; the host keeps
     * the parameters, gradients (the list's, as for the CPU) and logits; no host activations */
    ddp__resident res; /* the device's model; the parameters' host arrays handed to it (pdata
                          for the upload, pgrad for the download); resident training's state */
} gpt;

static float *P(const ddp_model *m, int i)
{
    return i >= 0 ? m->params[i].data : NULL;
}

static float *G(const ddp_model *m, int i)
{
    return i >= 0 ? m->params[i].grad : NULL;
}

/* Registers a parameter; its index goes to *idx. */
static ddp_status add_param(ddp_model *m, int *idx, const char *name, int64_t d0, int64_t d1,
                            ddp_error *err)
{
    int ndim = d1 > 0 ? 2 : 1;
    *idx = (int)m->n_params;
    /* nanoGPT's configure_optimizers: weight decay for 2-D tensors (matmul weights and
     * embeddings), none for biases and layernorm weights. */
    return ddp__model_add_param(m, name, ndim, (const int64_t[]){d0, d1}, ndim == 2, err);
}

static ddp_status check_spec(const ddp_model_spec *s, ddp_error *err)
{
    if (s->n_layer < 1 || s->n_head < 1 || s->n_embd < 1 || s->block_size < 1 || s->vocab_size < 1)
        return ddp__err(err, DDP_ERR_INVALID,
                        "gpt: n_layer %d, n_head %d, n_embd %d, block_size %d and vocab_size %d "
                        "must all be ≥ 1",
                        s->n_layer, s->n_head, s->n_embd, s->block_size, s->vocab_size);
    if (s->n_embd % s->n_head != 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "gpt: n_embd %d is not divisible by n_head %d; choose n_head dividing "
                        "n_embd (e.g. %d)",
                        s->n_embd, s->n_head, s->n_embd % 64 == 0 ? s->n_embd / 64 : 1);
    if (!(s->dropout >= 0.0f && s->dropout < 1.0f))
        return ddp__err(err, DDP_ERR_INVALID, "gpt: dropout %g must be in [0, 1); 0 turns it off",
                        (double)s->dropout);
    /* device cuda: the GPU module says which precisions its model implements (gpt.cu's create
     * refuses the others by name). */
    if (s->n_embd > INT_MAX / 4 || (int64_t)s->max_batch * s->block_size > INT_MAX / 4 ||
        (int64_t)s->n_layer * 3 > INT_MAX / 2)
        return ddp__err(err, DDP_ERR_INVALID,
                        "gpt: n_embd %d, max_batch %d × block_size %d or n_layer %d is too large "
                        "(4·n_embd and 4·max_batch·block_size must fit in an int)",
                        s->n_embd, s->max_batch, s->block_size, s->n_layer);
    return DDP_OK;
}

static ddp_status add_params(ddp_model *m, ddp_error *err)
{
    gpt *g = m->impl;
    const int64_t C = g->C;
    char nm[96];
    ddp_status st;
    if ((st = add_param(m, &g->p_wte, "transformer.wte.weight", g->V, C, err)) ||
        (st = add_param(m, &g->p_wpe, "transformer.wpe.weight", g->Tmax, C, err)))
        return st;
    for (int l = 0; l < g->L; l++) {
        block_params *b = &g->bp[l];
        *b = (block_params){-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
        struct {
            int *idx;
            const char *name;
            int64_t d0, d1;
            bool is_bias;
        } list[] = {
            {&b->ln1_w, "ln_1.weight", C, 0, false},
            {&b->ln1_b, "ln_1.bias", C, 0, true},
            {&b->attn_w, "attn.c_attn.weight", 3 * C, C, false},
            {&b->attn_b, "attn.c_attn.bias", 3 * C, 0, true},
            {&b->proj_w, "attn.c_proj.weight", C, C, false},
            {&b->proj_b, "attn.c_proj.bias", C, 0, true},
            {&b->ln2_w, "ln_2.weight", C, 0, false},
            {&b->ln2_b, "ln_2.bias", C, 0, true},
            {&b->fc_w, "mlp.c_fc.weight", 4 * C, C, false},
            {&b->fc_b, "mlp.c_fc.bias", 4 * C, 0, true},
            {&b->mproj_w, "mlp.c_proj.weight", C, 4 * C, false},
            {&b->mproj_b, "mlp.c_proj.bias", C, 0, true},
        };
        for (size_t k = 0; k < sizeof list / sizeof list[0]; k++) {
            if (list[k].is_bias && !g->bias)
                continue;
            snprintf(nm, sizeof nm, "transformer.h.%d.%s", l, list[k].name);
            if ((st = add_param(m, list[k].idx, nm, list[k].d0, list[k].d1, err)))
                return st;
        }
    }
    g->p_lnf_b = -1;
    if ((st = add_param(m, &g->p_lnf_w, "transformer.ln_f.weight", C, 0, err)) ||
        (g->bias && (st = add_param(m, &g->p_lnf_b, "transformer.ln_f.bias", C, 0, err))))
        return st;
    return DDP_OK;
}

/* GPT-2's initialisation (nanoGPT's _init_weights and the c_proj rescaling): normal std 0.02
 * for embeddings and linear weights, 0.02/√(2·n_layer) for the residual projections (both
 * c_proj weights), biases 0 (as allocated), layernorm weights 1. Each tensor draws from
 * (spec.seed, its index), so every rank gets the same numbers in any order. */
static void init_params(ddp_model *m)
{
    gpt *g = m->impl;
    const float std = 0.02f, proj_std = (float)(0.02 / sqrt(2.0 * g->L));
    for (size_t i = 0; i < m->n_params; i++) {
        ddp_model_param *p = &m->params[i];
        const char *name = p->name;
        size_t len = strlen(name);
        if (p->ndim == 2) {
            bool proj = len >= 13 && !strcmp(name + len - 13, "c_proj.weight");
            ddp_nn_init_normal(p->data, p->count, proj ? proj_std : std, g->seed, (uint64_t)i);
        } else if (len >= 7 && !strcmp(name + len - 7, ".weight")) { /* a layernorm's */
            for (size_t k = 0; k < p->count; k++)
                p->data[k] = 1.0f;
        }
    }
}

/* A buffer of n elements of size sz, or false (the caller reports). */
static bool alloc(void *out, size_t n, size_t sz)
{
    void *p = malloc(n * sz);
    memcpy(out, &p, sizeof p);
    return p != NULL;
}

static ddp_status alloc_acts(gpt *g, ddp_error *err)
{
    const size_t N = (size_t)g->B * g->Tmax, C = (size_t)g->C, F = sizeof(float), H = 2;
    const bool drop = g->p > 0.0f, h = g->bf16h;
    bool ok = alloc(&g->x0, N * C, F) && (!drop || alloc(&g->mask_e, N * C, 1)) &&
              alloc(&g->lnf, N * C, F) && alloc(&g->lnf_mean, N, F) && alloc(&g->lnf_rstd, N, F) &&
              alloc(&g->logits, N * (size_t)g->V, F) &&
              alloc(&g->attn_scratch, g->att.scratch_floats, F) && alloc(&g->tmp, N * C, F) &&
              alloc(&g->dres, N * C, F) && alloc(&g->dln, N * C, F) &&
              alloc(&g->dbig, N * 4 * C, F) &&
              (!h || (alloc(&g->ftmp, N * C, F) && alloc(&g->hrow, C, F) &&
                      alloc(&g->wh, 4 * C * C, H) && alloc(&g->dyh, N * 4 * C, H)));
    for (int l = 0; ok && l < g->L; l++) {
        block_acts *a = &g->ba[l];
        ok = alloc(&a->ln1_mean, N, F) && alloc(&a->ln1_rstd, N, F) &&
             alloc(&a->lse, N * (size_t)g->nh, F) && alloc(&a->xmid, N * C, F) &&
             alloc(&a->ln2_mean, N, F) && alloc(&a->ln2_rstd, N, F) &&
             alloc(&a->fch, N * 4 * C, F) && alloc(&a->xout, N * C, F) &&
             (!drop || (alloc(&a->mask_a, N * C, 1) && alloc(&a->mask_m, N * C, 1))) &&
             (h ? alloc(&a->qkvh, N * 3 * C, H) && alloc(&a->ln1h, N * C, H) &&
                      alloc(&a->attyh, N * C, H) && alloc(&a->ln2h, N * C, H) &&
                      alloc(&a->fchgh, N * 4 * C, H)
                : alloc(&a->qkv, N * 3 * C, F) && alloc(&a->ln1, N * C, F) &&
                      alloc(&a->atty, N * C, F) && alloc(&a->ln2, N * C, F) &&
                      alloc(&a->fchg, N * 4 * C, F));
    }
    if (!ok)
        return ddp__err(err, DDP_ERR_NOMEM,
                        "gpt: out of memory for the activations of %d × %d tokens (n_layer %d, "
                        "n_embd %d, vocab_size %d); use a smaller batch or block_size",
                        g->B, g->Tmax, g->L, g->C, g->V);
    return DDP_OK;
}

/* Device cuda: the device's model (parameters, activations); the host's logits come later
 * (forward_cuda). */
static ddp_status build_cuda(ddp_model *m, const ddp_model_spec *spec, ddp_error *err)
{
    gpt *g = m->impl;
    size_t n = m->n_params;
    size_t *counts = malloc(sizeof(size_t) * n);
    g->res.pdata = malloc(sizeof(*g->res.pdata) * n);
    g->res.pgrad = malloc(sizeof(*g->res.pgrad) * n);
    if (!counts || !g->res.pdata || !g->res.pgrad) {
        free(counts);
        return ddp__err(err, DDP_ERR_NOMEM, "gpt: out of memory for the parameter lists");
    }
    for (size_t i = 0; i < n; i++)
        counts[i] = m->params[i].count;
    ddp__cuda_gpt_cfg cfg = {
        g->L, g->nh,  g->C, g->Tmax, g->V, g->B, g->bias, spec->device_index, spec->precision,
        g->p, g->seed};
    ddp_status st = ddp__cuda_gpt_create(&cfg, counts, n, &g->res.gpt, err);
    free(counts);
    if (st)
        return st;
    return ddp__resident_init(m, err);
}

static ddp_status build(ddp_model *m, const ddp_model_spec *spec, ddp_error *err)
{
    ddp_status st = check_spec(spec, err);
    if (st != DDP_OK)
        return st;
    gpt *g = calloc(1, sizeof *g);
    if (!g)
        return ddp__err(err, DDP_ERR_NOMEM, "gpt: out of memory building the model");
    m->impl = g;
    m->res = &g->res;
    g->L = spec->n_layer;
    g->nh = spec->n_head;
    g->C = spec->n_embd;
    g->Tmax = spec->block_size;
    g->V = spec->vocab_size;
    g->B = spec->max_batch;
    g->bias = spec->bias;
    g->p = spec->dropout;
    g->seed = spec->seed;
    g->att = (ddp_nn_attention){.C = g->C, .n_head = g->nh, .max_T = g->Tmax, .dropout = g->p};
    if ((st = ddp_nn_attention_setup(&g->att, err)))
        return st;
    g->bp = calloc((size_t)g->L, sizeof *g->bp);
    g->ba = calloc((size_t)g->L, sizeof *g->ba);
    if (!g->bp || !g->ba)
        return ddp__err(err, DDP_ERR_NOMEM, "gpt: out of memory for %d blocks", g->L);
    if ((st = add_params(m, err)))
        return st;
    init_params(m);
    /* model.c chose the products' arithmetic: bf16 on the CPU keeps layer inputs in bf16. */
    g->bf16h = m->gemm == DDP__GEMM_BF16;
    if (spec->device != DDP_DEVICE_CUDA)
        return alloc_acts(g, err);
    return build_cuda(m, spec, err);
}

static void free_gpt(ddp_model *m)
{
    gpt *g = m->impl;
    if (!g)
        return;
    for (int l = 0; g->ba && l < g->L; l++) {
        block_acts *a = &g->ba[l];
        void *bufs[] = {a->ln1,    a->ln1_mean, a->ln1_rstd, a->qkv,  a->atty,  a->lse,  a->xmid,
                        a->ln2,    a->ln2_mean, a->ln2_rstd, a->fch,  a->fchg,  a->xout, a->mask_a,
                        a->mask_m, a->ln1h,     a->attyh,    a->ln2h, a->fchgh, a->qkvh};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            free(bufs[k]);
    }
    void *bufs[] = {g->bp,       g->ba,       g->x0,     g->mask_e,       g->lnf,
                    g->lnf_mean, g->lnf_rstd, g->logits, g->attn_scratch, g->tmp,
                    g->dres,     g->dln,      g->dbig,   g->ftmp,         g->hrow,
                    g->wh,       g->dyh,      g->kv,     g->kv_tokens,    g->kvw};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        free(bufs[k]);
    ddp__cuda_gpt_free(g->res.gpt);
    ddp__resident_free(&g->res);
    free(g);
    m->impl = NULL;
    m->res = NULL;
}

/* Every token and target before any work, so a bad batch changes nothing. */
static ddp_status check_batch(ddp_model *m, const ddp_model_batch *b)
{
    gpt *g = m->impl;
    if (!b->tokens)
        return ddp__errmsg(m->err, DDP_ERR_INVALID, "gpt forward: the batch has no tokens");
    if (b->sample_stride > 1)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "gpt forward: sample_stride %llu: a gpt keys its samples' dropout "
                           "contiguously from sample_offset; give 0 or 1",
                           (unsigned long long)b->sample_stride);
    if (b->seq_len < 1 || b->seq_len > g->Tmax)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "gpt forward: seq_len %d is outside 1 … block_size %d; cut the "
                           "sequences or build the model with a larger block_size",
                           b->seq_len, g->Tmax);
    const int T = b->seq_len;
    for (int s = 0; s < b->n; s++)
        for (int t = 0; t < T; t++) {
            int32_t id = b->tokens[(size_t)s * T + t];
            if (id < 0 || id >= g->V)
                return ddp__errmsg(m->err, DDP_ERR_INVALID,
                                   "gpt forward: token id %ld at sample %d, position %d is "
                                   "outside [0, vocab_size %d); check the data's tokenizer "
                                   "against model.vocab_size",
                                   (long)id, s, t, g->V);
            if (!b->targets)
                continue;
            id = b->targets[(size_t)s * T + t];
            if (id != DDP_NN_IGNORE_INDEX && (id < 0 || id >= g->V))
                return ddp__errmsg(m->err, DDP_ERR_INVALID,
                                   "gpt forward: target id %ld at sample %d, position %d is "
                                   "outside [0, vocab_size %d) and is not the ignore index %d; "
                                   "check the data's tokenizer against model.vocab_size",
                                   (long)id, s, t, g->V, DDP_NN_IGNORE_INDEX);
        }
    return DDP_OK;
}

/* How many rows of logits (N, V) have their target (not ignored) as argmax (first on ties). */
static int64_t count_correct(const float *logits, const int32_t *targets, size_t N, int V)
{
    int64_t c = 0;
    for (size_t r = 0; r < N; r++) {
        int y = targets[r];
        if (y == DDP_NN_IGNORE_INDEX)
            continue;
        const float *l = logits + r * (size_t)V;
        int best = 0;
        for (int j = 1; j < V; j++)
            if (l[j] > l[best])
                best = j;
        c += best == y;
    }
    return c;
}

/* A residual branch's projection added to the stream: out (N, C) = x + drop(in (N, K) · Wᵀ + b).
 * Without dropout the add is fused into the product (out starts as x + b, the sgemm accumulates
 * into it): one pass over (N, C) instead of three. With dropout the branch goes through tmp. */
/* A bf16 linear layer (xh rounded already): with W's rounded copy Wr when the caller keeps one
 * (kvw), else W rounded into g->wh now. */
static void lin_h(const gpt *g, const uint16_t *xh, const float *W, const uint16_t *Wr,
                  const float *b, int N, int in, int out, bool add, float *y)
{
    if (Wr)
        ddp__nn_linear_forward_hh(xh, Wr, b, N, in, out, add, y);
    else
        ddp__nn_linear_forward_h(xh, W, b, N, in, out, add, g->wh, y);
}

static void residual_proj(const gpt *g, const float *x, const float *in, const uint16_t *inh,
                          const float *W, const uint16_t *Wr, const float *b, int N, int K,
                          bool drop, uint64_t seed, const ddp_model_batch *bt, uint64_t off,
                          uint8_t *mask, float *tmp, float *out)
{
    const int C = g->C;
    const size_t NC = (size_t)N * C;
    if (drop) {
        if (inh)
            lin_h(g, inh, W, Wr, b, N, K, C, false, tmp);
        else
            ddp_nn_linear_forward(in, W, b, N, K, C, tmp);
        ddp_nn_dropout_forward(tmp, NC, g->p, seed, bt->step, off, true, mask, tmp);
        ddp_nn_add(x, tmp, NC, out);
        return;
    }
    if (b)
        for (int r = 0; r < N; r++) {
            const float *xr = x + (size_t)r * C;
            float *o = out + (size_t)r * C;
            for (int c = 0; c < C; c++)
                o[c] = xr[c] + b[c];
        }
    else
        memcpy(out, x, sizeof(float) * NC);
    if (inh)
        lin_h(g, inh, W, Wr, NULL, N, K, C, true, out);
    else
        ddp__sgemm(false, true, N, C, K, 1.0f, in, K, W, K, 1.0f, out, C);
}

/* Dropout seeds: see the file comment. */
static uint64_t drop_seed(const gpt *g, int layer_id)
{
    return g->seed + (uint64_t)layer_id;
}

/* The forward on the device (the batch is checked): the parameters go up first, since the
 * optimizer and reducer change them on the host — but for a kv_cache forward that reuses the
 * previous one's first past positions (kv_prepare), whose parameters are unchanged (ddp/model.h's
 * contract): the device computes only the new positions (ddp__cuda_gpt_forward_cached). */
static ddp_status forward_cuda(ddp_model *m, const ddp_model_batch *b, bool train, bool kv,
                               int past, ddp_model_out *out)
{
    gpt *g = m->impl;
    ddp_error e = {0};
    for (size_t i = 0; i < m->n_params; i++)
        g->res.pdata[i] = m->params[i].data;
    bool last = !train && !b->targets && b->last_logits;
    double loss_sum = 0;
    int count = 0;
    int64_t correct = 0;
    float scale = b->grad_scale != 0.0f ? b->grad_scale : 1.0f;
    /* loss_only (an evaluation's loss): the logits stay on the device, never (n·T, V) copied */
    const bool keep = !train && !(b->loss_only && b->targets);
    const size_t rows = last ? (size_t)b->n : (size_t)b->n * b->seq_len;
    g->logit_rows = 0;
    if (keep && rows * g->V > g->logits_cap) {
        free(g->logits);
        g->logits_cap = 0;
        if (!alloc(&g->logits, rows * g->V, sizeof(float)))
            return ddp__errmsg(m->err, DDP_ERR_NOMEM,
                               "gpt on cuda: out of host memory for %zu × %d logits; predict with "
                               "a smaller batch or block_size",
                               rows, g->V);
        g->logits_cap = rows * g->V;
    }
    ddp_status st = DDP_ERR_NOT_FOUND;
    if (past > 0)
        st = ddp__cuda_gpt_forward_cached(g->res.gpt, b->tokens, b->seq_len, past, g->logits, &e);
    if (st == DDP_ERR_NOT_FOUND) { /* the whole batch (also: a module without the cache) */
        st = m->resident ? DDP_OK : ddp__cuda_gpt_set_params(g->res.gpt, g->res.pdata, &e);
        if (st == DDP_OK)
            st = ddp__cuda_gpt_forward(g->res.gpt, b->tokens, b->targets, b->n, b->seq_len, train,
                                       last, scale, b->step, b->sample_offset, &loss_sum, &count,
                                       &correct, keep ? g->logits : NULL, &e);
    }
    if (st != DDP_OK)
        return ddp__errmsg(m->err, st, "gpt forward on cuda: %s", e.msg);
    if (kv) {
        memcpy(g->kv_tokens, b->tokens, sizeof(int32_t) * (size_t)b->seq_len);
        g->kv_len = b->seq_len;
    }
    if (keep)
        g->logit_rows = rows;
    if (!b->targets)
        return DDP_OK;
    if (train)
        m->loss_kept = true;
    out->loss = count > 0 ? loss_sum / count : 0.0;
    out->count = count;
    out->correct = correct;
    return DDP_OK;
}

/* batch.kv_cache: checks the batch is a generation step, makes the cache at the first one, and
 * returns in *past how many leading positions of the batch's tokens the cache already holds (the
 * common prefix with the previous kv_cache forward's tokens, at most seq_len − 1: the last
 * position is computed for its logits). The cache is emptied until the forward has filled it. */
static ddp_status kv_prepare(ddp_model *m, const ddp_model_batch *b, bool train, int *past)
{
    gpt *g = m->impl;
    int k = 0;
    while (k < g->kv_len && k < b->seq_len - 1 && g->kv_tokens[k] == b->tokens[k])
        k++;
    g->kv_len = 0;
    if (b->n != 1 || train || b->targets || !b->last_logits)
        return ddp__errmsg(m->err, DDP_ERR_INVALID,
                           "gpt forward: kv_cache is for generation: one sample (n 1, not %d), "
                           "evaluation without targets, last_logits on; clear kv_cache for "
                           "other forwards",
                           b->n);
    /* on the GPU the cache is the device's own c_attn outputs (kernels/cuda/gpt.cu) */
    const size_t cache = (size_t)g->L * g->Tmax * 3 * (size_t)g->C;
    if (!g->kv_tokens && !alloc(&g->kv_tokens, (size_t)g->Tmax, sizeof(int32_t)))
        return ddp__errmsg(m->err, DDP_ERR_NOMEM,
                           "gpt forward: out of memory for the key/value cache's %d tokens; "
                           "generate with kv_cache off",
                           g->Tmax);
    if (!g->kv && !g->res.gpt && !alloc(&g->kv, cache, sizeof(float))) {
        return ddp__errmsg(m->err, DDP_ERR_NOMEM,
                           "gpt forward: out of memory for the key/value cache (%zu MiB: n_layer "
                           "%d × block_size %d × 3·n_embd %d floats); generate with kv_cache off",
                           cache * sizeof(float) >> 20, g->L, g->Tmax, 3 * g->C);
    }
    *past = k;
    return DDP_OK;
}

/* kv_cache under bf16: the products' weights rounded once (kvw), or NULL where that memory
 * (12·n_embd² halves a block, and wte) is not to be had — then each product rounds its weight as
 * in training. */
static const uint16_t *kv_weights(ddp_model *m)
{
    gpt *g = m->impl;
    const size_t C = (size_t)g->C, per = 12 * C * C;
    if (!g->kvw && !alloc(&g->kvw, per * (size_t)g->L + (size_t)g->V * C, sizeof(uint16_t)))
        return NULL;
    if (!g->kvw_ok) {
        for (int l = 0; l < g->L; l++) {
            uint16_t *w = g->kvw + per * (size_t)l;
            ddp__nn_round_h(P(m, g->bp[l].attn_w), 3 * C * C, w);
            ddp__nn_round_h(P(m, g->bp[l].proj_w), C * C, w + 3 * C * C);
            ddp__nn_round_h(P(m, g->bp[l].fc_w), 4 * C * C, w + 4 * C * C);
            ddp__nn_round_h(P(m, g->bp[l].mproj_w), 4 * C * C, w + 8 * C * C);
        }
        ddp__nn_round_h(P(m, g->p_wte), (size_t)g->V * C, g->kvw + per * (size_t)g->L);
        g->kvw_ok = true;
    }
    return g->kvw;
}

static ddp_status forward(ddp_model *m, const ddp_model_batch *b, bool train, ddp_model_out *out)
{
    gpt *g = m->impl;
    ddp_status st = check_batch(m, b);
    if (st != DDP_OK)
        return st;
    const int n = b->n, T = b->seq_len, C = g->C, nh = g->nh;
    int past = 0; /* kv_cache: positions whose c_attn output is in the cache */
    const bool kv = b->kv_cache;
    if (!kv) { /* any forward but a kv_cache one empties the cache */
        g->kv_len = 0;
        g->kvw_ok = false;
    } else if ((st = kv_prepare(m, b, train, &past)) != DDP_OK) {
        g->kvw_ok = false;
        return st;
    }
    const int Tn = T - past; /* positions computed per sample */
    const int N = n * Tn;
    const size_t NC = (size_t)N * C;
    const bool drop = train && g->p > 0.0f;
    /* This batch's first sample in the dropout streams: elements of (N, C) activations, and
     * query rows (b, h, t) for the attention, whose keys are per row (ddp/nn.h). */
    const uint64_t off = b->sample_offset * (uint64_t)T * (uint64_t)C;
    const uint64_t off_att = b->sample_offset * (uint64_t)nh * (uint64_t)T;
    g->tokens = b->tokens;
    g->n = n;
    g->T = T;
    g->train = train;
    g->step = b->step;
    g->sample_offset = b->sample_offset;
    g->logit_rows = 0;
    if (g->res.gpt)
        return forward_cuda(m, b, train, kv, past, out);
    const uint16_t *kw = kv && g->bf16h ? kv_weights(m) : NULL; /* rounded weights, or NULL */
    ddp_error e = {0};

    if (ddp_nn_embedding_forward(b->tokens + past, P(m, g->p_wte),
                                 P(m, g->p_wpe) + (size_t)past * C, n, Tn, C, g->V, g->Tmax - past,
                                 g->x0, &e) != DDP_OK)
        return ddp__errmsg(m->err, e.status, "gpt forward: %s", e.msg);
    if (drop)
        ddp_nn_dropout_forward(g->x0, NC, g->p, drop_seed(g, 1), b->step, off, true, g->mask_e,
                               g->x0);
    const float *x = g->x0;
    for (int l = 0; l < g->L; l++) {
        const block_params *bp = &g->bp[l];
        block_acts *a = &g->ba[l];
        /* kv_cache: c_attn's output of every position 0 … T − 1, the new ones appended */
        float *kvl = kv ? g->kv + (size_t)l * g->Tmax * 3 * C : NULL;
        const uint16_t *w = kw ? kw + (size_t)l * 12 * C * C : NULL; /* c_attn, c_proj, c_fc, … */
        if (g->bf16h) { /* the same layers, their inputs kept in bf16 (nn/bf16h.h) */
            ddp__nn_layernorm_forward_h(x, P(m, bp->ln1_w), P(m, bp->ln1_b), N, C, LN_EPS, g->hrow,
                                        a->ln1h, a->ln1_mean, a->ln1_rstd);
            /* c_attn's float32 output goes through dbig (free until the backward) */
            lin_h(g, a->ln1h, P(m, bp->attn_w), w, P(m, bp->attn_b), N, C, 3 * C, false, g->dbig);
            ddp__nn_round_h(g->dbig, NC * 3, a->qkvh);
            if (kv)
                ddp__to_f32(kvl + (size_t)past * 3 * C, a->qkvh, NC * 3, DDP_BFLOAT16);
            if (past > 0)
                ddp__nn_attention_forward_cached_h(&g->att, kvl, past, T, g->attn_scratch, g->ftmp);
            else
                ddp__nn_attention_forward_h(&g->att, a->qkvh, n, T, drop_seed(g, 2 + 3 * l),
                                            b->step, off_att, train, g->attn_scratch, g->ftmp,
                                            a->lse);
            ddp__nn_round_h(g->ftmp, NC, a->attyh);
            residual_proj(g, x, NULL, a->attyh, P(m, bp->proj_w), w ? w + 3 * C * C : NULL,
                          P(m, bp->proj_b), N, C, drop, drop_seed(g, 3 + 3 * l), b, off, a->mask_a,
                          g->tmp, a->xmid);
            ddp__nn_layernorm_forward_h(a->xmid, P(m, bp->ln2_w), P(m, bp->ln2_b), N, C, LN_EPS,
                                        g->hrow, a->ln2h, a->ln2_mean, a->ln2_rstd);
            lin_h(g, a->ln2h, P(m, bp->fc_w), w ? w + 4 * C * C : NULL, P(m, bp->fc_b), N, C, 4 * C,
                  false, a->fch);
            ddp__nn_gelu_tanh_forward_h(a->fch, (size_t)N * 4 * C, a->fchgh);
            residual_proj(g, a->xmid, NULL, a->fchgh, P(m, bp->mproj_w), w ? w + 8 * C * C : NULL,
                          P(m, bp->mproj_b), N, 4 * C, drop, drop_seed(g, 4 + 3 * l), b, off,
                          a->mask_m, g->tmp, a->xout);
            x = a->xout;
            continue;
        }
        ddp_nn_layernorm_forward(x, P(m, bp->ln1_w), P(m, bp->ln1_b), N, C, LN_EPS, a->ln1,
                                 a->ln1_mean, a->ln1_rstd);
        float *qkv = kv ? kvl + (size_t)past * 3 * C : a->qkv;
        ddp_nn_linear_forward(a->ln1, P(m, bp->attn_w), P(m, bp->attn_b), N, C, 3 * C, qkv);
        if (past > 0)
            ddp_nn_attention_forward_cached(&g->att, kvl, past, T, g->attn_scratch, a->atty);
        else
            ddp_nn_attention_forward(&g->att, qkv, n, T, drop_seed(g, 2 + 3 * l), b->step, off_att,
                                     train, g->attn_scratch, a->atty, a->lse);
        residual_proj(g, x, a->atty, NULL, P(m, bp->proj_w), NULL, P(m, bp->proj_b), N, C, drop,
                      drop_seed(g, 3 + 3 * l), b, off, a->mask_a, g->tmp, a->xmid);
        ddp_nn_layernorm_forward(a->xmid, P(m, bp->ln2_w), P(m, bp->ln2_b), N, C, LN_EPS, a->ln2,
                                 a->ln2_mean, a->ln2_rstd);
        ddp_nn_linear_forward(a->ln2, P(m, bp->fc_w), P(m, bp->fc_b), N, C, 4 * C, a->fch);
        ddp_nn_gelu_tanh_forward(a->fch, (size_t)N * 4 * C, a->fchg);
        residual_proj(g, a->xmid, a->fchg, NULL, P(m, bp->mproj_w), NULL, P(m, bp->mproj_b), N,
                      4 * C, drop, drop_seed(g, 4 + 3 * l), b, off, a->mask_m, g->tmp, a->xout);
        x = a->xout;
    }
    if (kv) {
        memcpy(g->kv_tokens, b->tokens, sizeof(int32_t) * (size_t)T);
        g->kv_len = T;
    }

    /* ln_f and the tied head: every position, or (generation) each sample's last one. */
    int rows = N;
    if (!train && !b->targets && b->last_logits) {
        for (int s = 0; s < n; s++)
            memcpy(g->tmp + (size_t)s * C, x + ((size_t)s * Tn + (size_t)(Tn - 1)) * C,
                   sizeof(float) * (size_t)C);
        x = g->tmp;
        rows = n;
    }
    ddp_nn_layernorm_forward(x, P(m, g->p_lnf_w), P(m, g->p_lnf_b), rows, C, LN_EPS, g->lnf,
                             g->lnf_mean, g->lnf_rstd);
    if (kw) { /* the head's product on the rounded wte: what ddp__sgemm would give under bf16 */
        ddp__nn_round_h(g->lnf, (size_t)rows * C, g->dyh);
        ddp__gemm_bf16_pre(false, true, rows, g->V, C, 1.0f, g->dyh, C,
                           kw + (size_t)g->L * 12 * C * C, C, 0.0f, g->logits, g->V);
    } else
        ddp_nn_lm_head_forward(g->lnf, P(m, g->p_wte), rows, C, g->V, g->logits);
    g->logit_rows = (size_t)rows;
    if (!b->targets)
        return DDP_OK;

    /* The loss; in training, d loss / d logits replaces the logits in place (after counting
     * the correct rows), which saves a second (N, V) buffer. */
    out->correct = count_correct(g->logits, b->targets, (size_t)N, g->V);
    double loss_sum = 0.0;
    int count = 0;
    if (train) {
        float scale = b->grad_scale != 0.0f ? b->grad_scale : 1.0f;
        st = ddp_nn_vocab_xent(g->logits, b->targets, N, g->V, scale, &out->loss, g->logits, &e);
        g->logit_rows = 0;
        for (int r = 0; r < N; r++)
            count += b->targets[r] != DDP_NN_IGNORE_INDEX;
        m->loss_kept = true; /* backward may run even if count is 0: its gradient is 0 */
    } else {
        st = ddp_nn_vocab_xent_sum(g->logits, b->targets, N, g->V, &loss_sum, &count, NULL, &e);
        out->loss = count > 0 ? loss_sum / count : 0.0;
    }
    if (st != DDP_OK)
        return ddp__errmsg(m->err, e.status, "gpt forward: %s", e.msg);
    /* No target counted: loss 0 (torch's mean would be 0/0), so that loss · count sums. */
    if (count == 0)
        out->loss = 0.0;
    out->count = count;
    return DDP_OK;
}

/* A linear layer's backward from its input as kept: x in float32, or xh in bfloat16 (bf16h). */
static void linear_backward(const gpt *g, const float *dy, const float *x, const uint16_t *xh,
                            const float *W, int N, int in, int out, float *dx, float *dW, float *db)
{
    if (xh)
        ddp__nn_linear_backward_h(dy, xh, W, N, in, out, g->dyh, g->wh, dx, dW, db);
    else
        ddp_nn_linear_backward(dy, x, W, N, in, out, dx, dW, db);
}

/* ready(ctx, i) for each of the n indices (−1 skipped), in the order given. */
static ddp_status mark(ddp_model *m, ddp_grad_ready_fn ready, void *ctx, int n, const int *idx)
{
    for (int k = 0; ready && k < n; k++) {
        if (idx[k] < 0)
            continue;
        ddp_status st = ready(ctx, (size_t)idx[k]);
        if (st != DDP_OK)
            return ddp__errmsg(m->err, st,
                               "backward: the gradient-ready callback failed for '%s' (%s)",
                               m->params[idx[k]].name, ddp_status_str(st));
    }
    return DDP_OK;
}

/* The backward on the device. Host-driven: the gradients are added into the host's, then
 * reported ready in the CPU's order (the reverse of the list's). Resident: the device model adds
 * them into the bound device gradients and reports each as soon as its kernels are queued (then
 * anything it did not report, so that every parameter is reported once whatever it does). */
static ddp_status backward_cuda(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    gpt *g = m->impl;
    ddp_error e = {0};
    if (m->resident)
        return ddp__resident_backward(m, ready, ctx);
    for (size_t i = 0; i < m->n_params; i++)
        g->res.pgrad[i] = m->params[i].grad;
    if (ddp__cuda_gpt_backward(g->res.gpt, g->res.pgrad, &e) != DDP_OK)
        return ddp__errmsg(m->err, e.status, "gpt backward on cuda: %s", e.msg);
    for (size_t i = m->n_params; i-- > 0;) {
        ddp_status st = mark(m, ready, ctx, 1, (const int[]){(int)i});
        if (st != DDP_OK)
            return st;
    }
    return DDP_OK;
}

static ddp_status backward(ddp_model *m, ddp_grad_ready_fn ready, void *ctx)
{
    gpt *g = m->impl;
    if (g->res.gpt)
        return backward_cuda(m, ready, ctx);
    const int n = g->n, T = g->T, C = g->C, N = n * T, nh = g->nh;
    const size_t NC = (size_t)N * C;
    const bool drop = g->train && g->p > 0.0f;
    const uint64_t off_att = g->sample_offset * (uint64_t)nh * (uint64_t)T;
    ddp_status st;

    /* A pooled backward (ddp_model_backward_pooled) hands out each gradient's memory before it
     * is written: acquire(…) ahead of each write below. The tied token embedding's is taken at
     * the head and kept until its ready at the end. */
#define ACQUIRE(...)                                                                               \
    do {                                                                                           \
        const int ids_[] = {__VA_ARGS__};                                                          \
        if ((st = ddp__model_acquire(m, (int)(sizeof ids_ / sizeof ids_[0]), ids_)))               \
            return st;                                                                             \
    } while (0)
    /* Head: logits now hold d loss / d logits (forward). */
    ACQUIRE(g->p_wte, g->p_lnf_w, g->p_lnf_b);
    ddp_nn_lm_head_backward(g->logits, g->lnf, P(m, g->p_wte), N, C, g->V, g->dln, G(m, g->p_wte));
    const float *xL = g->ba[g->L - 1].xout;
    ddp_nn_layernorm_backward(g->dln, xL, P(m, g->p_lnf_w), g->lnf_mean, g->lnf_rstd, N, C, g->dres,
                              G(m, g->p_lnf_w), G(m, g->p_lnf_b));
    if ((st = mark(m, ready, ctx, 2, (const int[]){g->p_lnf_b, g->p_lnf_w})))
        return st;

    for (int l = g->L - 1; l >= 0; l--) {
        const block_params *bp = &g->bp[l];
        block_acts *a = &g->ba[l];
        const float *x = l > 0 ? g->ba[l - 1].xout : g->x0;
        /* MLP branch: dres is d loss / d xout, and so the gradient of the branch's output. */
        const float *dy = g->dres;
        if (drop) {
            ddp_nn_dropout_backward(g->dres, a->mask_m, NC, g->p, true, g->tmp);
            dy = g->tmp;
        }
        ACQUIRE(bp->mproj_w, bp->mproj_b);
        linear_backward(g, dy, a->fchg, a->fchgh, P(m, bp->mproj_w), N, 4 * C, C, g->dbig,
                        G(m, bp->mproj_w), G(m, bp->mproj_b));
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->mproj_b, bp->mproj_w})))
            return st;
        ACQUIRE(bp->fc_w, bp->fc_b);
        if (g->bf16h) { /* the GELU's gradient straight into c_fc's rounded dy and bias */
            ddp__nn_gelu_tanh_backward_h(g->dbig, a->fch, N, 4 * C, g->dyh, G(m, bp->fc_b));
            ddp__nn_linear_backward_h(NULL, a->ln2h, P(m, bp->fc_w), N, C, 4 * C, g->dyh, g->wh,
                                      g->dln, G(m, bp->fc_w), NULL);
        } else {
            ddp_nn_gelu_tanh_backward(g->dbig, a->fch, (size_t)N * 4 * C, g->dbig);
            linear_backward(g, g->dbig, a->ln2, a->ln2h, P(m, bp->fc_w), N, C, 4 * C, g->dln,
                            G(m, bp->fc_w), G(m, bp->fc_b));
        }
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->fc_b, bp->fc_w})))
            return st;
        ACQUIRE(bp->ln2_w, bp->ln2_b);
        ddp_nn_layernorm_backward(g->dln, a->xmid, P(m, bp->ln2_w), a->ln2_mean, a->ln2_rstd, N, C,
                                  g->dln, G(m, bp->ln2_w), G(m, bp->ln2_b));
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->ln2_b, bp->ln2_w})))
            return st;
        ddp_nn_add(g->dres, g->dln, NC, g->dres); /* now d loss / d xmid */

        /* Attention branch. */
        dy = g->dres;
        if (drop) {
            ddp_nn_dropout_backward(g->dres, a->mask_a, NC, g->p, true, g->tmp);
            dy = g->tmp;
        }
        ACQUIRE(bp->proj_w, bp->proj_b);
        linear_backward(g, dy, a->atty, a->attyh, P(m, bp->proj_w), N, C, C, g->dln,
                        G(m, bp->proj_w), G(m, bp->proj_b));
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->proj_b, bp->proj_w})))
            return st;
        if (a->qkvh)
            ddp__nn_attention_backward_h(&g->att, g->dln, a->qkvh, a->lse, n, T,
                                         drop_seed(g, 2 + 3 * l), g->step, off_att, g->train,
                                         g->attn_scratch, g->dbig);
        else
            ddp_nn_attention_backward(&g->att, g->dln, a->qkv, a->lse, n, T,
                                      drop_seed(g, 2 + 3 * l), g->step, off_att, g->train,
                                      g->attn_scratch, g->dbig);
        ACQUIRE(bp->attn_w, bp->attn_b);
        linear_backward(g, g->dbig, a->ln1, a->ln1h, P(m, bp->attn_w), N, C, 3 * C, g->dln,
                        G(m, bp->attn_w), G(m, bp->attn_b));
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->attn_b, bp->attn_w})))
            return st;
        ACQUIRE(bp->ln1_w, bp->ln1_b);
        ddp_nn_layernorm_backward(g->dln, x, P(m, bp->ln1_w), a->ln1_mean, a->ln1_rstd, N, C,
                                  g->dln, G(m, bp->ln1_w), G(m, bp->ln1_b));
        if ((st = mark(m, ready, ctx, 2, (const int[]){bp->ln1_b, bp->ln1_w})))
            return st;
        ddp_nn_add(g->dres, g->dln, NC, g->dres); /* d loss / d x, the block's input */
    }

    const float *dx0 = g->dres;
    if (drop) {
        ddp_nn_dropout_backward(g->dres, g->mask_e, NC, g->p, true, g->tmp);
        dx0 = g->tmp;
    }
    ACQUIRE(g->p_wpe);
#undef ACQUIRE
    ddp_nn_embedding_backward(dx0, g->tokens, n, T, C, G(m, g->p_wte), G(m, g->p_wpe));
    return mark(m, ready, ctx, 2, (const int[]){g->p_wpe, g->p_wte});
}

static const float *logits(const ddp_model *m, size_t *rows, size_t *cols)
{
    const gpt *g = m->impl;
    if (g->logit_rows == 0)
        return NULL;
    *rows = g->logit_rows;
    *cols = (size_t)g->V;
    return g->logits;
}

/* nanoGPT's estimate_mfu (after PaLM, appendix B): per token 6·N + 12·L·C·T, N every parameter
 * but the position embedding (a lookup; the token embedding counts, it is the LM head's
 * weight), T the sequence length; per sample T times that. */
static double flops(const ddp_model *m, int seq_len)
{
    const gpt *g = m->impl;
    double T = seq_len > 0 ? seq_len : g->Tmax, N = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if ((int)i != g->p_wpe)
            N += (double)m->params[i].count;
    return T * (6.0 * N + 12.0 * g->L * (double)g->C * T);
}

const ddp_model_ops ddp__gpt_ops = {"gpt",    build,  free_gpt, forward,
                                    backward, logits, flops,    &ddp__resident_ops};
