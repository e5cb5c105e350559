/*
 * fake_gpu_gpt.c — a test-only GPU module (kernels/gpu_module.h) whose "GPU GPT" is the CPU GPT
 * (src/nn/gpt.c, compiled into this module with the layers it needs) and whose "device memory"
 * is host memory. With DDP_GPU_MODULE pointing here, DDP_TEST_FAKE_GPUS=1 (GPU groups over
 * cuda-staged on the fake GPU) and DDP_TEST_FAKE_GPU_OPEN=1 (that fake GPU's memory readable by
 * the host, so this module can add gradients into the reducer's buckets), `ddptrain --device cuda`
 * runs its whole device-resident path on a machine without a GPU: the GPU group, the reducer on
 * "device" buckets, the optimizer stepped through the module, checkpoints copied off the
 * "device" and back (tests/integration/test_resident_fake.sh). It shows the orchestration, not the
 * CUDA kernels (those are scripts/gpu-check.sh's). Like the real module it calls nothing in the
 * program's libddp: the CPU model here is this module's own copy. Any precision is taken (the
 * arithmetic is float32's), so fp16's loss scaling can be driven too: with
 * DDP_TEST_FAKE_GPU_INF_AT=k the k-th backward of the process (on the rank RANK equal to
 * DDP_TEST_FAKE_GPU_INF_RANK, default 0) adds an inf to one gradient, as an fp16 overflow would.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/model.h"
#include "ddp/nn.h"
#include "kernels/gpu_module.h"
#include "kernels/kernels.h"

#include "fake_gpu_cls.h" /* its MLP and CNN: the CPU classifier (fake_gpu_cls.c) */

#define EXPORT __attribute__((visibility("default")))

struct ddp__cuda_gpt {
    ddp_model *m;
    size_t n, total;
    size_t *counts, *offsets;
    float *params, *grads; /* (total,) the "device" flat buffers, as gpt.cu has them */
    float *state[2];       /* the optimizer's */
    int nstates;
    float *tmp; /* (largest count,) a scaled gradient */
    int V;
    float **bound; /* bind_params's arrays, or NULL: the flat buffer's */
};

/* Parameter i's values: in the flat buffer, or where bind_params put them. */
static float *param_of(const ddp__cuda_gpt *g, size_t i)
{
    return g->bound ? g->bound[i] : g->params + g->offsets[i];
}

static ddp_status fail(ddp_error *err, ddp_status st, const char *msg)
{
    if (err) {
        snprintf(err->msg, sizeof err->msg, "fake gpu gpt: %s", msg);
        err->status = st;
    }
    return st;
}

static void gpt_free(ddp__cuda_gpt *g)
{
    if (!g)
        return;
    ddp_model_free(g->m);
    free(g->counts);
    free(g->offsets);
    free(g->params);
    free(g->grads);
    free(g->state[0]);
    free(g->state[1]);
    free(g->tmp);
    free(g->bound);
    free(g);
}

static ddp_status gpt_create(const ddp__cuda_gpt_cfg *cfg, const size_t *counts, size_t n,
                             ddp__cuda_gpt **out, ddp_error *err)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.n_layer = cfg->L, s.n_head = cfg->nh, s.n_embd = cfg->C, s.block_size = cfg->Tmax;
    s.vocab_size = cfg->V, s.max_batch = cfg->B, s.bias = cfg->bias;
    s.dropout = cfg->dropout, s.seed = cfg->seed;
    ddp__cuda_gpt *g = calloc(1, sizeof *g);
    if (!g)
        return fail(err, DDP_ERR_NOMEM, "out of memory");
    g->V = cfg->V;
    ddp_status st = ddp_model_build(&s, &g->m, err);
    size_t np = 0;
    const ddp_model_param *p = st ? NULL : ddp_model_params(g->m, &np);
    if (!st && np != n)
        st = fail(err, DDP_ERR_INVALID, "the model's parameter count differs");
    g->n = n;
    g->counts = calloc(n ? n : 1, sizeof(size_t));
    g->offsets = calloc(n ? n : 1, sizeof(size_t));
    size_t most = 1;
    for (size_t i = 0; !st && i < n; i++) {
        if (p[i].count != counts[i]) {
            st = fail(err, DDP_ERR_INVALID, "a parameter's size differs");
            break;
        }
        g->counts[i] = counts[i];
        g->offsets[i] = g->total;
        g->total += counts[i];
        most = counts[i] > most ? counts[i] : most;
    }
    if (!st && (!(g->params = calloc(g->total, sizeof(float))) ||
                !(g->grads = calloc(g->total, sizeof(float))) ||
                !(g->tmp = malloc(most * sizeof(float)))))
        st = fail(err, DDP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++)
        st = ddp_model_bind(g->m, i, g->params + g->offsets[i], g->grads + g->offsets[i]);
    if (st) {
        gpt_free(g);
        return st;
    }
    *out = g;
    return DDP_OK;
}

static ddp_status set_params(ddp__cuda_gpt *g, const float *const *d, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->n; i++)
        memcpy(param_of(g, i), d[i], g->counts[i] * sizeof(float));
    return DDP_OK;
}

static ddp_status get_params(ddp__cuda_gpt *g, float *const *d, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->n; i++)
        memcpy(d[i], param_of(g, i), g->counts[i] * sizeof(float));
    return DDP_OK;
}

static ddp_status forward(ddp__cuda_gpt *g, const int32_t *tokens, const int32_t *targets, int n,
                          int T, bool train, bool last, float scale, uint64_t step, uint64_t off,
                          double *loss, int *cnt, int64_t *correct, float *logits, ddp_error *err)
{
    ddp_model_batch b = {.n = n,
                         .tokens = tokens,
                         .targets = targets,
                         .seq_len = T,
                         .grad_scale = scale,
                         .last_logits = last,
                         .step = step,
                         .sample_offset = off};
    ddp_model_out o = {0};
    if (ddp_model_forward(g->m, &b, train, &o) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->m));
    if (targets) {
        *loss = o.loss * o.count;
        *cnt = (int)o.count;
        *correct = o.correct;
    }
    size_t rows = 0, cols = 0;
    const float *lg = ddp_model_logits(g->m, &rows, &cols);
    if (logits && !train && lg)
        memcpy(logits, lg, rows * cols * sizeof(float));
    return DDP_OK;
}

/* Whether this backward (the process's calls-th) is the one to overflow. */
static bool inject_inf(int calls)
{
    const char *at = getenv("DDP_TEST_FAKE_GPU_INF_AT"), *who = getenv("DDP_TEST_FAKE_GPU_INF_RANK");
    const char *rank = getenv("RANK");
    return at && atoi(at) == calls && atoi(who ? who : "0") == atoi(rank ? rank : "0");
}

static int calls; /* backwards so far */

/* The host-driven backward: into the model's own gradients, then added into dst[i]. */
static ddp_status backward_host(ddp__cuda_gpt *g, float *const *dst, ddp_error *err)
{
    memset(g->grads, 0, g->total * sizeof(float));
    if (ddp_model_backward(g->m, NULL, NULL) != DDP_OK)
        return fail(err, DDP_ERR_INVALID, ddp_model_last_error(g->m));
    if (inject_inf(++calls))
        g->grads[0] = INFINITY;
    for (size_t i = 0; i < g->n; i++)
        for (size_t k = 0; k < g->counts[i]; k++)
            dst[i][k] += g->grads[g->offsets[i] + k];
    return DDP_OK;
}

typedef struct marks {
    ddp_status (*ready)(void *ctx, size_t i);
    void *ctx;
    float *first; /* parameter 0's gradient, where an injected inf goes */
    bool inf;
} marks;

/* The CPU model's ready, passed on (parameter 0, the token embedding, comes last). */
static ddp_status pass_ready(void *ctx, size_t i)
{
    marks *k = ctx;
    if (i == 0 && k->inf)
        k->first[0] += INFINITY;
    return k->ready ? k->ready(k->ctx, i) : DDP_OK;
}

/* The resident backward as gpt.cu does it: straight into the caller's gradients (the model's
 * bound there for the call), each reported ready as the CPU model finishes it. */
static ddp_status backward_dev(ddp__cuda_gpt *g, float *const *dst,
                               ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                               ddp_error *err)
{
    for (size_t i = 0; i < g->n; i++)
        ddp_model_bind(g->m, i, param_of(g, i), dst[i]);
    marks k = {ready, ctx, dst[0], inject_inf(++calls)};
    ddp_status st = ddp_model_backward(g->m, pass_ready, &k);
    for (size_t i = 0; i < g->n; i++)
        ddp_model_bind(g->m, i, NULL, g->grads + g->offsets[i]);
    return st ? fail(err, st, ddp_model_last_error(g->m)) : DDP_OK;
}

static ddp_status dev_info(ddp__cuda_gpt *g, float **params_dev, void **stream, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; i < g->n; i++)
        params_dev[i] = param_of(g, i);
    *stream = NULL;
    return DDP_OK;
}

static ddp_status optim_init(ddp__cuda_gpt *g, int nstates, ddp_error *err)
{
    for (int s = 0; s < nstates; s++) {
        free(g->state[s]);
        if (!(g->state[s] = calloc(g->total, sizeof(float))))
            return fail(err, DDP_ERR_NOMEM, "out of memory");
    }
    g->nstates = nstates;
    return DDP_OK;
}

/* ddp_optim_step_range's arithmetic: the gradient scaled first (here into a copy). */
static ddp_status optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a, ddp_error *err)
{
    if (a->i >= g->n || a->lo > a->hi || a->hi > g->counts[a->i] || g->nstates < 1)
        return fail(err, DDP_ERR_INVALID, "bad optimizer step");
    size_t off = g->offsets[a->i] + a->lo, n = a->hi - a->lo;
    const float *gr = a->grad_dev + a->lo;
    if (a->grad_scale != 1.0f) {
        for (size_t k = 0; k < n; k++)
            g->tmp[k] = gr[k] * a->grad_scale;
        gr = g->tmp;
    }
    float *p = param_of(g, a->i) + a->lo;
    if (a->adamw)
        ddp_nn_adamw_step(p, gr, g->state[0] + off, g->state[1] + off, n, a->lr,
                          a->beta1, a->beta2, a->eps, a->weight_decay, a->step);
    else
        ddp_nn_sgd_step(p, gr, g->state[0] + off, n, a->lr, a->momentum,
                        a->weight_decay, a->step);
    return DDP_OK;
}

static ddp_status optim_state(ddp__cuda_gpt *g, int s, float *const *host, bool to_host,
                              ddp_error *err)
{
    if (s < 0 || s >= g->nstates)
        return fail(err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < g->n; i++) {
        float *dev = g->state[s] + g->offsets[i];
        size_t bytes = g->counts[i] * sizeof(float);
        memcpy(to_host ? host[i] : dev, to_host ? dev : host[i], bytes);
    }
    return DDP_OK;
}

/* gpt.cu's: the CPU model's values move to the given arrays (or back into the flat buffer). */
static ddp_status bind_params(ddp__cuda_gpt *g, float *const *pd, ddp_error *err)
{
    if (!pd) {
        for (size_t i = 0; g->bound && i < g->n; i++)
            memcpy(g->params + g->offsets[i], g->bound[i], g->counts[i] * sizeof(float));
        free(g->bound);
        g->bound = NULL;
    } else {
        if (!g->bound && !(g->bound = calloc(g->n ? g->n : 1, sizeof(float *))))
            return fail(err, DDP_ERR_NOMEM, "out of memory");
        memcpy(g->bound, pd, g->n * sizeof(float *));
    }
    for (size_t i = 0; i < g->n; i++)
        ddp_model_bind(g->m, i, param_of(g, i), NULL);
    return DDP_OK;
}

static ddp_status state_dev(ddp__cuda_gpt *g, int s, float **dev, ddp_error *err)
{
    if (s < 0 || s >= g->nstates)
        return fail(err, DDP_ERR_INVALID, "no such optimizer state");
    for (size_t i = 0; i < g->n; i++)
        dev[i] = g->state[s] + g->offsets[i];
    return DDP_OK;
}

static ddp_status count(int *n, ddp_error *err)
{
    (void)err;
    *n = 1;
    return DDP_OK;
}

static ddp_status name(int idx, char *out, size_t cap, ddp_error *err)
{
    (void)err;
    snprintf(out, cap, "Fake GPU %d (the CPU GPT)", idx);
    return DDP_OK;
}

static void set_host(const ddp__gpu_host *host)
{
    (void)host;
}

static ddp_status no_devops(int device, struct ddp__devops *out, ddp_error *err)
{
    (void)device, (void)out;
    return fail(err, DDP_ERR_NOT_FOUND, "no CUDA devops (use DDP_TEST_FAKE_GPUS)");
}

static const ddp__gpu_api table = {
    .abi = DDP_GPU_MODULE_ABI,
    .size = sizeof(ddp__gpu_api),
    .set_host = set_host,
    .device_count = count,
    .device_name = name,
    .gpt_create = gpt_create,
    .gpt_free = gpt_free,
    .gpt_set_params = set_params,
    .gpt_forward = forward,
    .gpt_backward = backward_host,
    .cuda_devops = no_devops,
    .nccl_create = NULL,
    .gpt_dev_info = dev_info,
    .gpt_get_params = get_params,
    .gpt_backward_dev = backward_dev,
    .gpt_optim_init = optim_init,
    .gpt_optim_step = optim_step,
    .gpt_optim_state = optim_state,
    .gpt_bind_params = bind_params,
    .gpt_state_dev = state_dev,
    .cls_create = fake_cls_create,
    .cls_free = fake_cls_free,
    .cls_upload = fake_cls_upload,
    .cls_forward = fake_cls_forward,
    .cls_get_buffers = fake_cls_get_buffers,
    .cls_backward = fake_cls_backward,
    .cls_dev_info = fake_cls_dev_info,
    .cls_get_params = fake_cls_get_params,
    .cls_backward_dev = fake_cls_backward_dev,
    .cls_optim_init = fake_cls_optim_init,
    .cls_optim_step = fake_cls_optim_step,
    .cls_optim_state = fake_cls_optim_state,
    .cls_bind_params = fake_cls_bind_params,
    .cls_state_dev = fake_cls_state_dev,
};

EXPORT const ddp__gpu_api *ddp_gpu_module_entry(void)
{
    return &table;
}

/* The CPU model compiled in here refers to the device layer of libddp (kernels/gpu.c), which this
 * module does not have: its GPT is built for the CPU, so none of these is ever reached. */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define NOT_HERE(...)                                                                              \
    {                                                                                              \
        return DDP_ERR_NOT_FOUND;                                                                  \
    }
ddp_status ddp__cuda_device_count(int *n, ddp_error *err) NOT_HERE()
ddp_status ddp__cuda_device_name(int idx, char *n, size_t cap, ddp_error *err) NOT_HERE()
ddp_status ddp__cuda_gpt_create(const ddp__cuda_gpt_cfg *c, const size_t *k, size_t n,
                                ddp__cuda_gpt **o, ddp_error *e) NOT_HERE()
void ddp__cuda_gpt_free(ddp__cuda_gpt *g) {}
ddp_status ddp__cuda_gpt_set_params(ddp__cuda_gpt *g, const float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_forward(ddp__cuda_gpt *g, const int32_t *t, const int32_t *y, int n, int T,
                                 bool tr, bool l, float s, uint64_t st, uint64_t so, double *ls,
                                 int *c, int64_t *k, float *lg, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_backward(ddp__cuda_gpt *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_dev_info(ddp__cuda_gpt *g, float **p, void **s, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_get_params(ddp__cuda_gpt *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_backward_dev(ddp__cuda_gpt *g, float *const *d,
                                      ddp_status (*r)(void *, size_t), void *c,
                                      ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_init(ddp__cuda_gpt *g, int n, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_step(ddp__cuda_gpt *g, const ddp__cuda_optim_args *a,
                                    ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_optim_state(ddp__cuda_gpt *g, int s, float *const *h, bool t,
                                     ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_bind_params(ddp__cuda_gpt *g, float *const *p, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_gpt_state_dev(ddp__cuda_gpt *g, int s, float **d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_create(const ddp__cuda_cls_cfg *c, const size_t *k, size_t n,
                                const size_t *bk, size_t nb, ddp__cuda_cls **o,
                                ddp_error *e) NOT_HERE()
void ddp__cuda_cls_free(ddp__cuda_cls *g) {}
ddp_status ddp__cuda_cls_upload(ddp__cuda_cls *g, const float *const *p, const float *const *b,
                                ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b, double *l,
                                 int64_t *c, float *lg, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_get_buffers(ddp__cuda_cls *g, float *const *b, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_backward(ddp__cuda_cls *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_dev_info(ddp__cuda_cls *g, float **p, float **b, void **s,
                                  ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_get_params(ddp__cuda_cls *g, float *const *d, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_backward_dev(ddp__cuda_cls *g, float *const *d,
                                      ddp_status (*r)(void *, size_t), void *c,
                                      ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_init(ddp__cuda_cls *g, int n, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a,
                                    ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_optim_state(ddp__cuda_cls *g, int s, float *const *h, bool t,
                                     ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_bind_params(ddp__cuda_cls *g, float *const *p, ddp_error *e) NOT_HERE()
ddp_status ddp__cuda_cls_state_dev(ddp__cuda_cls *g, int s, float **d, ddp_error *e) NOT_HERE()
