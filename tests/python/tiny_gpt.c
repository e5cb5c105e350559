/*
 * tiny_gpt.c — nanoGPT's GPT from the ddp/nn.h layers (see tiny_gpt.h). Written to be read next
 * to nanoGPT's model.py: Block = x + attn(ln_1(x)), x + mlp(ln_2(x)); the tied lm_head; the loss
 * over every position. Each activation the backward needs is kept, per layer:
 *   x (N, C)      the residual stream entering the layer (the last layer's output is x of L)
 *   ln1, ln2 (N, C) and their mean/rstd (N,), qkv (N, 3C), att (N, C) and lse (B, nh, T) from
 *   the attention, x2 (N, C) = x + attention branch, h (N, 4C) = c_fc output, g (N, 4C) = gelu(h).
 */
#include "tiny_gpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *ln1w, *ln1b, *attw, *attb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fc2w, *fc2b;
} layer_w;

typedef struct {
    float *x, *ln1, *m1, *r1, *qkv, *att, *lse, *x2, *ln2, *m2, *r2, *h, *g;
} layer_a;

struct tiny_gpt {
    tiny_gpt_cfg c;
    ddp_nn_attention at;
    int B, T; /* of the last forward */
    size_t n_params;
    float *params, *grads, *acts, *scratch;
    float *wte, *wpe, *lnfw, *lnfb;     /* views into params */
    float *gwte, *gwpe, *glnfw, *glnfb; /* the same views into grads */
    layer_w *w, *gw;
    layer_a *a;
    float *xf, *lnf, *mf, *rf, *logits;      /* final layernorm and logits (N, V) */
    float *dres, *dtmp, *dbig, *dqkv, *datt; /* backward buffers */
    int32_t *idx;                            /* (B, T) of the last forward */
};

/* The next n floats of an array being carved up (NULL if not present, or when only counting). */
static float *take(float *base, size_t *off, size_t n, bool present)
{
    if (!present)
        return NULL;
    float *p = base ? base + *off : NULL;
    *off += n;
    return p;
}

/* Points the views of one flat array (params or grads; NULL only counts) and returns its
 * length. */
static size_t layout(const tiny_gpt_cfg *c, float *base, float **wte, float **wpe, layer_w *w,
                     float **lnfw, float **lnfb)
{
    size_t C = (size_t)c->C, o = 0;
    bool b = c->bias;
    *wte = take(base, &o, (size_t)c->V * C, true);
    *wpe = take(base, &o, (size_t)c->P * C, true);
    for (int l = 0; l < c->L; l++) {
        layer_w *p = &w[l];
        p->ln1w = take(base, &o, C, true), p->ln1b = take(base, &o, C, b);
        p->attw = take(base, &o, 3 * C * C, true), p->attb = take(base, &o, 3 * C, b);
        p->projw = take(base, &o, C * C, true), p->projb = take(base, &o, C, b);
        p->ln2w = take(base, &o, C, true), p->ln2b = take(base, &o, C, b);
        p->fcw = take(base, &o, 4 * C * C, true), p->fcb = take(base, &o, 4 * C, b);
        p->fc2w = take(base, &o, 4 * C * C, true), p->fc2b = take(base, &o, C, b);
    }
    *lnfw = take(base, &o, C, true), *lnfb = take(base, &o, C, b);
    return o;
}

tiny_gpt *tiny_gpt_new(const tiny_gpt_cfg *cfg, int B)
{
    ddp_error err = {0};
    tiny_gpt *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->c = *cfg;
    m->at = (ddp_nn_attention){cfg->C, cfg->nh, cfg->P, cfg->attn_dropout, 0, 0};
    if (ddp_nn_attention_setup(&m->at, &err) != DDP_OK) {
        fprintf(stderr, "tiny_gpt: %s\n", err.msg);
        free(m);
        return NULL;
    }
    m->w = calloc((size_t)cfg->L, sizeof(layer_w));
    m->gw = calloc((size_t)cfg->L, sizeof(layer_w));
    m->a = calloc((size_t)cfg->L + 1, sizeof(layer_a));
    if (!m->w || !m->gw || !m->a) {
        tiny_gpt_free(m);
        return NULL;
    }
    m->n_params = layout(cfg, NULL, &m->wte, &m->wpe, m->w, &m->lnfw, &m->lnfb);
    size_t N = (size_t)B * cfg->P, C = (size_t)cfg->C, nl = (size_t)B * cfg->nh * cfg->P;
    size_t per_layer = N * (C + C + 2 + 3 * C + C + C + C + 2 + 4 * C + 4 * C) + nl;
    size_t n_acts = (size_t)cfg->L * per_layer + N * (C + C + 2 + (size_t)cfg->V) +
                    N * (C + C + 4 * C + 3 * C + C);
    m->params = calloc(m->n_params, sizeof(float));
    m->grads = calloc(m->n_params, sizeof(float));
    m->acts = calloc(n_acts, sizeof(float));
    m->scratch = calloc(m->at.scratch_floats, sizeof(float));
    m->idx = calloc(N, sizeof(int32_t));
    if (!m->params || !m->grads || !m->acts || !m->scratch || !m->idx) {
        tiny_gpt_free(m);
        return NULL;
    }
    layout(cfg, m->params, &m->wte, &m->wpe, m->w, &m->lnfw, &m->lnfb);
    layout(cfg, m->grads, &m->gwte, &m->gwpe, m->gw, &m->glnfw, &m->glnfb);
    float *A = m->acts;
    size_t o = 0;
    for (int l = 0; l <= cfg->L; l++) {
        layer_a *a = &m->a[l];
        a->x = take(A, &o, N * C, true);
        if (l == cfg->L)
            break;
        a->ln1 = take(A, &o, N * C, true), a->m1 = take(A, &o, N, true);
        a->r1 = take(A, &o, N, true), a->qkv = take(A, &o, N * 3 * C, true);
        a->att = take(A, &o, N * C, true), a->lse = take(A, &o, nl, true);
        a->x2 = take(A, &o, N * C, true), a->ln2 = take(A, &o, N * C, true);
        a->m2 = take(A, &o, N, true), a->r2 = take(A, &o, N, true);
        a->h = take(A, &o, N * 4 * C, true), a->g = take(A, &o, N * 4 * C, true);
    }
    m->lnf = take(A, &o, N * C, true), m->mf = take(A, &o, N, true);
    m->rf = take(A, &o, N, true), m->logits = take(A, &o, N * (size_t)cfg->V, true);
    m->dres = take(A, &o, N * C, true), m->dtmp = take(A, &o, N * C, true);
    m->dbig = take(A, &o, N * 4 * C, true), m->dqkv = take(A, &o, N * 3 * C, true);
    m->datt = take(A, &o, N * C, true);
    if (o != n_acts) {
        fprintf(stderr, "tiny_gpt: activation layout %zu != %zu floats\n", o, n_acts);
        tiny_gpt_free(m);
        return NULL;
    }
    m->xf = m->a[cfg->L].x;
    return m;
}

void tiny_gpt_free(tiny_gpt *m)
{
    if (!m)
        return;
    free(m->w), free(m->gw), free(m->a), free(m->params), free(m->grads), free(m->acts);
    free(m->scratch), free(m->idx), free(m);
}

size_t tiny_gpt_n_params(const tiny_gpt *m)
{
    return m->n_params;
}

float *tiny_gpt_params(tiny_gpt *m)
{
    return m->params;
}

float *tiny_gpt_grads(tiny_gpt *m)
{
    return m->grads;
}

int tiny_gpt_forward(tiny_gpt *m, const int32_t *idx, const int32_t *targets, int B, int T,
                     uint64_t step, double *loss)
{
    const tiny_gpt_cfg *c = &m->c;
    int N = B * T, C = c->C;
    size_t NC = (size_t)N * C;
    ddp_error err = {0};
    m->B = B, m->T = T;
    memcpy(m->idx, idx, sizeof(int32_t) * (size_t)N);
    if (ddp_nn_embedding_forward(idx, m->wte, m->wpe, B, T, C, c->V, c->P, m->a[0].x, &err)) {
        fprintf(stderr, "tiny_gpt: %s\n", err.msg);
        return -1;
    }
    for (int l = 0; l < c->L; l++) {
        layer_w *w = &m->w[l];
        layer_a *a = &m->a[l];
        /* x2 = x + c_proj(attn(ln_1(x))) */
        ddp_nn_layernorm_forward(a->x, w->ln1w, w->ln1b, N, C, 1e-5f, a->ln1, a->m1, a->r1);
        ddp_nn_linear_forward(a->ln1, w->attw, w->attb, N, C, 3 * C, a->qkv);
        ddp_nn_attention_forward(&m->at, a->qkv, B, T, 1000 + (uint64_t)l, step, 0, true,
                                 m->scratch, a->att, a->lse);
        ddp_nn_linear_forward(a->att, w->projw, w->projb, N, C, C, a->x2);
        ddp_nn_add(a->x2, a->x, NC, a->x2);
        /* x of the next layer = x2 + c_proj(gelu(c_fc(ln_2(x2)))) */
        ddp_nn_layernorm_forward(a->x2, w->ln2w, w->ln2b, N, C, 1e-5f, a->ln2, a->m2, a->r2);
        ddp_nn_linear_forward(a->ln2, w->fcw, w->fcb, N, C, 4 * C, a->h);
        ddp_nn_gelu_tanh_forward(a->h, NC * 4, a->g);
        ddp_nn_linear_forward(a->g, w->fc2w, w->fc2b, N, 4 * C, C, m->a[l + 1].x);
        ddp_nn_add(m->a[l + 1].x, a->x2, NC, m->a[l + 1].x);
    }
    ddp_nn_layernorm_forward(m->xf, m->lnfw, m->lnfb, N, C, 1e-5f, m->lnf, m->mf, m->rf);
    ddp_nn_lm_head_forward(m->lnf, m->wte, N, C, c->V, m->logits);
    if (!targets)
        return 0;
    /* The gradient replaces the logits: the backward starts from it. */
    if (ddp_nn_vocab_xent(m->logits, targets, N, c->V, 1.0f, loss, m->logits, &err)) {
        fprintf(stderr, "tiny_gpt: %s\n", err.msg);
        return -1;
    }
    return 0;
}

void tiny_gpt_backward(tiny_gpt *m, uint64_t step)
{
    const tiny_gpt_cfg *c = &m->c;
    int B = m->B, T = m->T, N = B * T, C = c->C;
    size_t NC = (size_t)N * C;
    /* logits now hold dloss/dlogits */
    ddp_nn_lm_head_backward(m->logits, m->lnf, m->wte, N, C, c->V, m->dtmp, m->gwte);
    ddp_nn_layernorm_backward(m->dtmp, m->xf, m->lnfw, m->mf, m->rf, N, C, m->dres, m->glnfw,
                              m->glnfb);
    for (int l = c->L - 1; l >= 0; l--) {
        layer_w *w = &m->w[l], *g = &m->gw[l];
        layer_a *a = &m->a[l];
        /* dres: the gradient of this layer's output; through the MLP branch to x2 */
        ddp_nn_linear_backward(m->dres, a->g, w->fc2w, N, 4 * C, C, m->dbig, g->fc2w, g->fc2b);
        ddp_nn_gelu_tanh_backward(m->dbig, a->h, NC * 4, m->dbig);
        ddp_nn_linear_backward(m->dbig, a->ln2, w->fcw, N, C, 4 * C, m->dtmp, g->fcw, g->fcb);
        ddp_nn_layernorm_backward(m->dtmp, a->x2, w->ln2w, a->m2, a->r2, N, C, m->dtmp, g->ln2w,
                                  g->ln2b);
        ddp_nn_add(m->dres, m->dtmp, NC, m->dres);
        /* through the attention branch to x */
        ddp_nn_linear_backward(m->dres, a->att, w->projw, N, C, C, m->datt, g->projw, g->projb);
        ddp_nn_attention_backward(&m->at, m->datt, a->qkv, a->lse, B, T, 1000 + (uint64_t)l, step,
                                  0, true, m->scratch, m->dqkv);
        ddp_nn_linear_backward(m->dqkv, a->ln1, w->attw, N, C, 3 * C, m->dtmp, g->attw, g->attb);
        ddp_nn_layernorm_backward(m->dtmp, a->x, w->ln1w, a->m1, a->r1, N, C, m->dtmp, g->ln1w,
                                  g->ln1b);
        ddp_nn_add(m->dres, m->dtmp, NC, m->dres);
    }
    ddp_nn_embedding_backward(m->dres, m->idx, B, T, C, m->gwte, m->gwpe);
}
