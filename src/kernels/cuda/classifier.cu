/*
 * kernels/cuda/classifier.cu — the MLP and the CNN on one device (kernels.h's ddp__cuda_cls_*):
 * src/nn/classifier.c's layer list run in its order, with the same meaning of every buffer; that
 * file is the reference (test_cuda_classifier compares the two).
 *
 * Memory, all cudaMalloc'd at create for max_batch samples: the parameters and their gradients as
 * two flat fp32 buffers in the CPU model's order (each tensor padded to 128 elements: 256 bytes in
 * the 16-bit twin too, see span), the running statistics as a third, each layer's output (B,
 * out_n), max-pool's argmax, dropout's mask, batchnorm's saved mean and 1/std, the input, the
 * labels, the logits' gradient, two ping-pong gradient buffers of the widest activation, and
 * cuDNN's workspace; in bf16/fp16 also the weights' 16-bit twin, each linear and conv layer's input
 * rounded (B, in_n), two 16-bit buffers of the widest activation (a conv's output; dy and dx
 * rounded) and one of the largest conv filter (its gradient).
 *
 * Who computes what: linear layers through ddp__cuda_gemm (cuBLASLt; TF32 tensor cores with
 * precision tf32, plain fp32 otherwise); conv2d (forward, data and filter gradients) and
 * batchnorm (training with batch statistics and the running-statistics update, evaluation with
 * the running statistics, backward) through cuDNN's legacy API, whose semantics are the CPU's
 * (cross-correlation; batchnorm's exponential average with factor momentum and the unbiased
 * variance in the running estimate, the biased one in the normalisation, saved 1/sqrt(var + eps));
 * cuDNN's convolutions are told CUDNN_FMA_MATH in fp32, so that they never use TF32 there. Kernels
 * of this file do what cuDNN would do differently from the CPU or what is simpler by hand: the
 * conv bias and its gradient, max-pool (the CPU's window order and NaN rule, the argmax kept for
 * backward, as ddp_nn_maxpool2d), ReLU, exact GELU (in double, as the CPU), dropout (the shared
 * counter-based generator, util/rng.h: the CPU's masks bit for bit); the loss is the GPT's fused
 * softmax cross-entropy (ddp__cuda_vocab_xent) over the classes.
 *
 * Precision bf16 or fp16 (autocast's bfloat16 / float16; the CPU's bf16 is the reference: every
 * product's operands rounded to bf16, fp32 accumulation, fp32 results): only the linear layers'
 * and the convolutions' operands are 16-bit; everything between them (activations, dropout,
 * batchnorm — autocast keeps it fp32 too — pooling, the loss) stays fp32, as do the masters, the
 * gradients the host receives and the running statistics. The choice for the convolutions is
 * "cast in and out", not 16-bit tensors through the conv stage: cuDNN's legacy API wants x, w and
 * y of one type for 16 bits (PSEUDO_BFLOAT16 / PSEUDO_HALF: 16-bit tensors, fp32 compute), so
 * each conv rounds its fp32 input into a 16-bit copy (kept per layer for the filter gradient),
 * writes a 16-bit output that one kernel widens while adding the fp32 bias (bias_add_h), and in
 * backward rounds dy, takes dW in 16 bits (beta 0) and adds it into the fp32 gradient
 * (ddp__cuda_add_h), dx in 16 bits widened into the fp32 ping-pong buffer; the bias gradient
 * sums the fp32 dy. Simplest because every other layer is untouched, and the CPU reference's
 * buffers keep their meaning; the cost is three roundings the CPU's products do not make (the
 * conv's output, dW and dx pass through 16 bits, as in PyTorch's autocast, whose conv outputs and
 * weight gradients are 16-bit too). Linear layers need none of that: cuBLASLt takes 16-bit
 * operands and writes fp32 (y with the fp32 bias epilogue, dx, dW accumulated with beta 1); the
 * bias gradient sums the fp32 dy, as the CPU does. The weights' 16-bit twin (params_h) is rounded
 * from the masters at each upload and, in resident mode, at every forward. fp16 is GradScaler's
 * half: the loss's gradient carries the host's loss scale (grad_scale), a value beyond 65504
 * becomes ±inf where it is stored in 16 bits (the rounded dy, cuDNN's dW and dx), and the inf or
 * NaN reaching the fp32 gradients is what the host's unscale finds (it then skips the step and
 * halves the scale).
 *
 * Device-resident training (ddp_model_resident; the end of this file): the parameters and
 * running statistics stay here between steps (uploaded once), backward's gradient kernels add
 * straight into the caller's device gradients (the reducer's bucket views) and report each
 * parameter ready as soon as its kernels are queued, and the optimizer steps here with the GPT's
 * AdamW/SGD kernels (optim.cu, devmath.cu) on state buffers laid out like the parameters (the
 * GPT's code too: resident.cu). The host-driven mode (upload each forward, gradients downloaded)
 * is the default.
 * Not here: cached or benchmarked algorithm choices (cuDNN's heuristic at create, for
 * max_batch).
 * UNVERIFIED: written without a GPU; see docs/gpu.md.
 */
#include <cudnn.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "resident.cuh"

extern "C" {
#include "kernels/cuda/devmath.h"
#include "util/rng.h"
}

#define WS_CAP ((size_t)256 << 20) /* the most cuDNN workspace an algorithm may ask for */

namespace
{

/* One direction's algorithms (forward, backward-data, backward-filter) in the order they are
 * tried: cuDNN's heuristic list (entries that succeeded, fit WS_CAP and, in fp32, use no tensor
 * cores), then algorithm 0 with the precision's own math type. Each entry carries its math
 * type: the heuristic may pair an algorithm with a math type other than the descriptor's, and
 * cuDNN expects the descriptor set to it before the workspace query and the call (PyTorch's
 * Conv_v7.cpp does the same). cur is the one in use; a refusal moves on, for good. */
struct algo_list {
    int algo[12];
    cudnnMathType_t math[12];
    int n, cur;
};

struct dlayer {
    ddp__cuda_cls_layer L;
    float *y;           /* (B, out_n) */
    int32_t *argmax;    /* pool: (B, out_n) index within the input plane */
    uint8_t *mask;      /* dropout: (B, out_n) */
    float *aux;         /* batchnorm: save_mean (C), save_invstd (C) */
    uint16_t *xh;       /* bf16/fp16, linear and conv: (B, in_n) the input rounded, for dW */
    cudnnDataType_t xt; /* conv: the type of its x, w and y (fp32, or the 16-bit format) */
    /* cuDNN (conv, bn): input and output tensors of the current batch, the filter, the
     * convolution, batchnorm's (1, C, 1, 1) parameter tensor; the algorithms chosen at create */
    cudnnTensorDescriptor_t xd, yd, pd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    algo_list fwd, bwd_data, bwd_filter;
    int desc_n; /* the batch xd and yd are set for, 0: none yet */
};

} // namespace

struct ddp__cuda_cls {
    ddp__cuda_cls_cfg cfg;
    dlayer *L; /* (nl,) */
    ddp__cuda_ctx *ctx;
    cudnnHandle_t dnn;
    size_t np, nb, total, btotal;
    size_t *counts, *offsets, *bcounts, *boffsets;
    float *params, *grads, *buffers; /* flat, on the device */
    float *x, *dlogits, *row_loss, *g0, *g1;
    int32_t *labels, *correct;
    void *ws; /* cuDNN's workspace, ws_bytes */
    size_t ws_bytes;
    float *grads_host, *row_loss_host; /* host staging */
    int32_t *correct_host;
    /* precision bf16 or fp16 (NULL otherwise): params_h (total,) the weights rounded at each
     * upload and, resident, at every forward; h0, h1 (B · widest) 16-bit scratch (a conv's
     * output; dy, then dx in backward); dwh (dw_max,) a conv filter's gradient */
    bool half;
    ddp_dtype ht; /* then DDP_BFLOAT16 or DDP_FLOAT16 */
    uint16_t *params_h, *h0, *h1, *dwh;
    int n; /* the last forward */
    bool can_backward;
    /* device-resident training (ddp__gpu_cls_backward_dev, _optim_*, _bind_params) */
    float *const *grads_dev; /* during backward_dev: where the gradients go (added) */
    ddp_status (*ready)(void *ctx, size_t i); /* during backward_dev: parameter i is final */
    void *ready_ctx;
    ddp__cuda_resident res; /* the optimizer's state; res.bound: bind_params's (np,) arrays */
    bool resident;          /* optim_init was called: forwards round params_h from the masters */
};

/* DDP_OK for CUDNN_STATUS_SUCCESS, else DDP_ERR_SYSTEM naming what and cuDNN's message. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

/* cuDNN is loaded with dlopen the first time a model with a convolution or batchnorm is made, not
 * linked: the module (the GPT, the MLP, the NCCL backend) then loads on a machine without
 * cuDNN, and only such a model says what is missing. DDP_CUDNN_LIB names another file. */
#define DNN_FUNCS(X)                                                                               \
    X(cudnnBatchNormalizationBackward)                                                             \
    X(cudnnBatchNormalizationForwardInference)                                                     \
    X(cudnnBatchNormalizationForwardTraining)                                                      \
    X(cudnnConvolutionBackwardData)                                                                \
    X(cudnnConvolutionBackwardFilter)                                                              \
    X(cudnnConvolutionForward)                                                                     \
    X(cudnnCreate)                                                                                 \
    X(cudnnCreateConvolutionDescriptor)                                                            \
    X(cudnnCreateFilterDescriptor)                                                                 \
    X(cudnnCreateTensorDescriptor)                                                                 \
    X(cudnnDeriveBNTensorDescriptor)                                                               \
    X(cudnnDestroy)                                                                                \
    X(cudnnDestroyConvolutionDescriptor)                                                           \
    X(cudnnDestroyFilterDescriptor)                                                                \
    X(cudnnDestroyTensorDescriptor)                                                                \
    X(cudnnGetConvolution2dForwardOutputDim)                                                       \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                                 \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                                \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                               \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                              \
    X(cudnnGetConvolutionForwardAlgorithm_v7)                                                      \
    X(cudnnGetConvolutionForwardWorkspaceSize)                                                     \
    X(cudnnGetErrorString)                                                                         \
    X(cudnnSetConvolution2dDescriptor)                                                             \
    X(cudnnSetConvolutionMathType)                                                                 \
    X(cudnnSetFilter4dDescriptor)                                                                  \
    X(cudnnSetStream)                                                                              \
    X(cudnnSetTensor4dDescriptor)

static struct {
#define DNN_FIELD(name) decltype(&::name) name;
    DNN_FUNCS(DNN_FIELD)
#undef DNN_FIELD
} dnn;
static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;
static char dnn_error[512]; /* "" once loaded */

static void dnn_load(void)
{
    const char *path = getenv("DDP_CUDNN_LIB");
    if (!path || !*path)
        path = "libcudnn.so.9";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(dnn_error, sizeof dnn_error,
                 "cuDNN 9 did not load (%s); HINT: install cuDNN 9 for CUDA 13 (or PyTorch's "
                 "nvidia-cudnn wheel) and put its directory on LD_LIBRARY_PATH, or use device "
                 "cpu for models with convolutions or batchnorm",
                 why ? why : path);
        return;
    }
#define DNN_SYM(name)                                                                              \
    {                                                                                              \
        void *sym = dlsym(h, #name);                                                               \
        if (!sym) {                                                                                \
            snprintf(dnn_error, sizeof dnn_error,                                                  \
                     "cuDNN at %s has no %s (version 9 is needed); HINT: install cuDNN 9", path,   \
                     #name);                                                                       \
            return;                                                                                \
        }                                                                                          \
        memcpy(&dnn.name, &sym, sizeof sym);                                                       \
    }
    DNN_FUNCS(DNN_SYM)
#undef DNN_SYM
}

static ddp_status dnn_ready(ddp_error *err)
{
    pthread_once(&dnn_once, dnn_load);
    if (dnn_error[0])
        return ddp__cuda_fail(err, DDP_ERR_NOT_FOUND, "%s", dnn_error);
    return DDP_OK;
}

static ddp_status dnn_check(cudnnStatus_t s, const char *what, ddp_error *err)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return DDP_OK;
    /* 3005–3009: a cuDNN sub-library or engine missing, or cuDNN built for another CUDA or
     * architecture — the installation, not the model */
    bool setup = (int)s >= 3005 && (int)s <= 3009;
    return ddp__cuda_fail(err, DDP_ERR_SYSTEM, "cudnn: %s: %s (%d)%s", what,
                          dnn.cudnnGetErrorString(s), (int)s,
                          setup ? "; HINT: cuDNN's installation does not match this machine: "
                                  "install cuDNN 9 built for CUDA 13 (all its sub-libraries "
                                  "beside libcudnn.so.9), or use device cpu for this model"
                                : "");
}

static ddp_status dalloc_es(void *p, size_t n, size_t es, ddp_error *err)
{
    void *d = NULL;
    ddp_status st = ddp__cuda_malloc(&d, n * es, err);
    memcpy(p, &d, sizeof d);
    return st;
}

static ddp_status use_device(ddp__cuda_cls *g, ddp_error *err)
{
    return ddp__cuda_check(cudaSetDevice(g->ctx->device), "cudaSetDevice", err);
}

/* Parameter i's values: the flat buffer's, or where bind_params put them. */
static float *P(ddp__cuda_cls *g, int i)
{
    return i < 0 ? NULL : ddp__cuda_resident_param(&g->res, (size_t)i);
}

/* cuDNN is handed 256-byte-aligned pointers only (what cudaMalloc returns; the module's own
 * buffers are laid out so). The caller's arrays need not be: the reducer packs its bucket views
 * and, with the sharded optimizer, its copy of the parameters back to back, 4-byte aligned. */
static bool aligned(const void *p)
{
    return ((uintptr_t)p & 255u) == 0;
}

/* Elements of one tensor's slot in the flat buffers: 128 (512 bytes in fp32, 256 in the 16-bit
 * twin), so that every slot of either starts 256-byte aligned. */
static size_t span(size_t count)
{
    return (count + 127) / 128 * 128;
}

/* Parameter i's values as cuDNN reads them: P's, or when P's is a misaligned bound array, the
 * flat buffer's slot, which refresh_bound copies it into at every forward (the rule of the
 * 16-bit twin: the parameters change only between a backward and the next forward). */
static const float *PD(ddp__cuda_cls *g, int i)
{
    float *p = P(g, i);
    return aligned(p) ? p : g->params + g->offsets[i];
}

/* Where parameter i's gradient accumulates: the flat buffer, or during backward_dev the
 * caller's device gradient itself. */
static float *G(ddp__cuda_cls *g, int i)
{
    return i < 0 ? NULL : g->grads_dev ? g->grads_dev[i] : g->grads + g->offsets[i];
}

/* Parameter i's 16-bit twin (precision bf16 or fp16). */
static const uint16_t *PH(ddp__cuda_cls *g, int i)
{
    return g->params_h + g->offsets[i];
}

/* Where cuDNN writes parameter i's gradient, and with which beta: G's, added into (beta 1),
 * when aligned; else the flat gradient buffer's slot (unused during backward_dev, the only time
 * G is the caller's), overwritten (beta 0), for add_scratch to add into G afterwards. */
static float *GD(ddp__cuda_cls *g, int i, float *beta)
{
    float *d = G(g, i);
    *beta = aligned(d) ? 1.0f : 0.0f;
    return aligned(d) ? d : g->grads + g->offsets[i];
}

/* After cuDNN wrote parameter i's gradient where GD said: the slot added into G when it was
 * not G itself. */
static ddp_status add_scratch(ddp__cuda_cls *g, int i, ddp_error *err)
{
    float *d = G(g, i);
    if (aligned(d))
        return DDP_OK;
    return ddp__cuda_add(g->ctx, d, g->grads + g->offsets[i], g->counts[i], d, err);
}

/* Batchnorm's saved 1/std: its own aligned slot after the saved mean's. */
static float *INVSTD(const dlayer *l)
{
    return l->aux + span((size_t)l->L.C);
}

static float *BUF(ddp__cuda_cls *g, int j)
{
    return g->buffers + g->boffsets[j];
}

/* ---- kernels --------------------------------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void relu_fwd(const float *x, size_t n, float *y)
{
    GRID_STRIDE(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_bwd(const float *dy, const float *x, size_t n, float *dx)
{
    GRID_STRIDE(i, n) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

/* ddp_nn_gelu_forward / _backward: in double, rounded once. */
__global__ void gelu_erf_fwd(const float *x, size_t n, float *y)
{
    GRID_STRIDE(i, n)
    {
        double v = x[i];
        y[i] = (float)(0.5 * v * (1.0 + erf(v * 0.70710678118654752440)));
    }
}

__global__ void gelu_erf_bwd(const float *dy, const float *x, size_t n, float *dx)
{
    GRID_STRIDE(i, n)
    {
        double v = x[i];
        double cdf = 0.5 * (1.0 + erf(v * 0.70710678118654752440));
        double pdf = 0.39894228040143267794 * exp(-0.5 * v * v);
        dx[i] = (float)((double)dy[i] * (cdf + v * pdf));
    }
}

/* ddp_nn_dropout_forward for 0 < p < 1 in training: the same draw per element. Element i of
 * sample i / per is keyed offset + i + (i / per) · extra: extra = (sample_stride − 1) · per
 * spaces the samples' keys as the classifier's host code does (0: one contiguous stream). */
__global__ void dropout_fwd(const float *x, size_t n, uint64_t thresh, float scale, uint64_t seed,
                            uint64_t step, uint64_t offset, size_t per, uint64_t extra,
                            uint8_t *mask, float *y)
{
    GRID_STRIDE(i, n)
    {
        uint64_t key = offset + i + (extra ? (uint64_t)(i / per) * extra : 0);
        uint8_t keep = (ddp__rand_u64(seed, step, key) >> 32) >= thresh;
        mask[i] = keep;
        y[i] = keep ? x[i] * scale : 0.0f;
    }
}

__global__ void dropout_bwd(const float *dy, const uint8_t *mask, size_t n, float scale, float *dx)
{
    GRID_STRIDE(i, n) dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

/* y (n, C, P) += bias[c]. */
__global__ void bias_add(float *y, const float *bias, size_t total, int C, int P)
{
    GRID_STRIDE(i, total) y[i] += bias[(i / (size_t)P) % (size_t)C];
}

/* y (n, C, P) fp32 = yh widened (exactly) + bias[c]: a 16-bit conv output into the fp32 layers
 * after it, one fp32 rounding as bias_add's. E: ddp__bf16 or ddp__fp16. */
template <typename E>
__global__ void bias_add_h(const E *yh, const float *bias, size_t total, int C, int P, float *y)
{
    GRID_STRIDE(i, total) y[i] = ddp__ld(yh + i) + bias[(i / (size_t)P) % (size_t)C];
}

/* db[c] += Σ over samples and positions of dy (n, C, P): a block per channel, in double. */
__global__ void channel_sum(const float *dy, int n, int C, int P, float *db)
{
    __shared__ double sh[32];
    int c = blockIdx.x;
    size_t cnt = (size_t)n * P;
    double s = 0.0;
    for (size_t k = threadIdx.x; k < cnt; k += blockDim.x) {
        size_t b = k / (size_t)P, q = k % (size_t)P;
        s += dy[(b * C + c) * (size_t)P + q];
    }
    s = ddp__block_sum(s, sh);
    if (threadIdx.x == 0)
        db[c] += (float)s;
}

/* ddp_nn_maxpool2d_forward: one thread per output; the first maximum in row-major window order
 * wins, a NaN takes over from a number; argmax is the index within the input plane. */
__global__ void pool_fwd(const float *x, size_t planes, int H, int W, int OH, int OW, int k,
                         int stride, float *y, int32_t *argmax)
{
    size_t total = planes * (size_t)OH * OW;
    GRID_STRIDE(o, total)
    {
        size_t pl = o / ((size_t)OH * OW);
        int r = (int)(o % ((size_t)OH * OW)), oh = r / OW, ow = r % OW;
        const float *xp = x + pl * (size_t)H * W;
        int h0 = oh * stride, w0 = ow * stride, best = h0 * W + w0;
        float mx = xp[best];
        for (int i = 0; i < k; i++)
            for (int j = 0; j < k; j++) {
                int at = (h0 + i) * W + w0 + j;
                float v = xp[at];
                if (v > mx || (isnan(v) && !isnan(mx)))
                    mx = v, best = at;
            }
        y[o] = mx;
        argmax[o] = best;
    }
}

/* dx (zeroed before) [plane, argmax] += dy: atomics, since overlapping windows (stride < k) may
 * pick one input twice. */
__global__ void pool_bwd(const float *dy, const int32_t *argmax, size_t planes, int in_plane,
                         int out_plane, float *dx)
{
    size_t total = planes * (size_t)out_plane;
    GRID_STRIDE(o, total)
    {
        size_t pl = o / (size_t)out_plane;
        atomicAdd(dx + pl * (size_t)in_plane + argmax[o], dy[o]);
    }
}

static unsigned blocks(size_t n)
{
    return ddp__cuda_blocks(n, 256);
}

/* ---- create and free ------------------------------------------------------------------------- */

static void free_layer(dlayer *l)
{
    ddp__cuda_free(l->y);
    ddp__cuda_free(l->argmax);
    ddp__cuda_free(l->mask);
    ddp__cuda_free(l->aux);
    ddp__cuda_free(l->xh);
    if (l->xd)
        dnn.cudnnDestroyTensorDescriptor(l->xd);
    if (l->yd)
        dnn.cudnnDestroyTensorDescriptor(l->yd);
    if (l->pd)
        dnn.cudnnDestroyTensorDescriptor(l->pd);
    if (l->wd)
        dnn.cudnnDestroyFilterDescriptor(l->wd);
    if (l->cd)
        dnn.cudnnDestroyConvolutionDescriptor(l->cd);
}

extern "C" void ddp__gpu_cls_free(ddp__cuda_cls *g)
{
    if (!g)
        return;
    if (g->ctx) {
        (void)cudaSetDevice(g->ctx->device);
        ddp__cuda_sync(g->ctx, NULL);
    }
    for (int i = 0; g->L && i < g->cfg.nl; i++)
        free_layer(&g->L[i]);
    void *bufs[] = {g->params,   g->grads,    g->buffers, g->x,      g->dlogits,
                    g->row_loss, g->g0,       g->g1,      g->labels, g->correct,
                    g->ws,       g->params_h, g->h0,      g->h1,     g->dwh};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        ddp__cuda_free(bufs[k]);
    ddp__cuda_resident_free(&g->res);
    if (g->dnn)
        dnn.cudnnDestroy(g->dnn);
    ddp__cuda_ctx_destroy(g->ctx);
    free(g->L);
    free(g->counts);
    free(g->offsets);
    free(g->bcounts);
    free(g->boffsets);
    free(g->grads_host);
    free(g->row_loss_host);
    free(g->correct_host);
    free(g);
}

/* The layers' parameter and buffer sizes against the model's lists; the flat layouts. */
static ddp_status layout(ddp__cuda_cls *g, const size_t *counts, size_t np, const size_t *bcounts,
                         size_t nb, ddp_error *err)
{
    size_t want_p = 0, want_b = 0;
    for (int i = 0; i < g->cfg.nl; i++) {
        const ddp__cuda_cls_layer *l = &g->L[i].L;
        size_t w = 0, b = 0;
        if (l->kind == DDP__CLS_LINEAR)
            w = (size_t)l->out * l->in, b = (size_t)l->out;
        else if (l->kind == DDP__CLS_CONV)
            w = (size_t)l->out_ch * l->in_ch * l->kh * l->kw, b = (size_t)l->out_ch;
        else if (l->kind == DDP__CLS_BN)
            w = b = (size_t)l->C;
        if (l->kind == DDP__CLS_LINEAR || l->kind == DDP__CLS_CONV || l->kind == DDP__CLS_BN) {
            if (l->p0 < 0 || (size_t)l->p0 + 1 >= np || counts[l->p0] != w ||
                counts[l->p0 + 1] != b)
                return ddp__cuda_fail(err, DDP_ERR_INVALID,
                                      "cuda classifier: layer %d's parameters (index %d) do not "
                                      "match the model's list",
                                      i, l->p0);
            want_p += 2;
        }
        if (l->kind == DDP__CLS_BN) {
            if (l->buf0 < 0 || (size_t)l->buf0 + 1 >= nb || bcounts[l->buf0] != (size_t)l->C ||
                bcounts[l->buf0 + 1] != (size_t)l->C)
                return ddp__cuda_fail(err, DDP_ERR_INVALID,
                                      "cuda classifier: layer %d's running statistics (buffer "
                                      "%d) do not match the model's buffers",
                                      i, l->buf0);
            want_b += 2;
        }
    }
    if (want_p != np || want_b != nb)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda classifier: the model has %zu parameters and %zu buffers, "
                              "the layers %zu and %zu",
                              np, nb, want_p, want_b);
    size_t off = 0;
    for (size_t i = 0; i < np; i++) {
        g->counts[i] = counts[i];
        g->offsets[i] = off;
        off += span(counts[i]);
    }
    g->total = off;
    off = 0;
    for (size_t j = 0; j < nb; j++) {
        g->bcounts[j] = bcounts[j];
        g->boffsets[j] = off; /* aligned as the parameters, for cuDNN */
        off += span(bcounts[j]);
    }
    g->btotal = off;
    return DDP_OK;
}

/* xd and yd of a conv or batchnorm layer for a batch of n (a no-op when already so). */
static ddp_status set_batch(dlayer *l, int n, ddp_error *err)
{
    if (l->desc_n == n)
        return DDP_OK;
    l->desc_n = 0; /* until both are set: a failure half way leaves no stale size behind */
    const ddp__cuda_cls_layer *L = &l->L;
    ddp_status st;
    if (L->kind == DDP__CLS_CONV) {
        if ((st = dnn_check(dnn.cudnnSetTensor4dDescriptor(l->xd, CUDNN_TENSOR_NCHW, l->xt, n,
                                                           L->in_ch, L->h, L->w),
                            "conv input descriptor", err)) ||
            (st = dnn_check(dnn.cudnnSetTensor4dDescriptor(l->yd, CUDNN_TENSOR_NCHW, l->xt, n,
                                                           L->out_ch, L->out_h, L->out_w),
                            "conv output descriptor", err)))
            return st;
    } else if ((st = dnn_check(dnn.cudnnSetTensor4dDescriptor(l->xd, CUDNN_TENSOR_NCHW,
                                                              CUDNN_DATA_FLOAT, n, L->C, L->hw, 1),
                               "batchnorm descriptor", err))) {
        return st;
    }
    l->desc_n = n;
    return DDP_OK;
}

/* cuDNN's answer to an algorithm it will not run here (at this batch, with this math type), or
 * one wanting more workspace than was allocated (ws_check's case, mapped to it by the callers):
 * the convolution then moves on, for good, to the next algorithm of its list (algo_list), the
 * last being algorithm 0, which needs little or no workspace. */
static bool refused(cudnnStatus_t s)
{
    /* cuDNN 9 answers with detailed codes inside each category (3002 NOT_SUPPORTED_SHAPE, …);
     * the library and driver codes of the not-supported category (a sub-library missing, the
     * wrong architecture or runtime) are not an algorithm's fault and stay errors. */
#ifdef CUDNN_STATUS_CATEGORY
    int c = (int)CUDNN_STATUS_CATEGORY((int)s);
    if (c == (int)CUDNN_STATUS_NOT_SUPPORTED)
        return !(s >= 3005 && s <= 3009);
    return c == (int)CUDNN_STATUS_BAD_PARAM;
#else
    return s == CUDNN_STATUS_NOT_SUPPORTED || s == CUDNN_STATUS_BAD_PARAM;
#endif
}

/* The list of algorithms to try (algo_list) from cuDNN's heuristic answer; `math` is the
 * precision's own math type, algorithm 0's. */
template <typename Perf>
static void pick(algo_list *a, const Perf *perf, int found, bool fp32, cudnnMathType_t math)
{
    a->n = a->cur = 0;
    bool zero = false;
    for (int k = 0; k < found && a->n < 11; k++) {
        if (perf[k].status != CUDNN_STATUS_SUCCESS || perf[k].memory > WS_CAP)
            continue;
        if (fp32 && perf[k].mathType != CUDNN_FMA_MATH && perf[k].mathType != CUDNN_DEFAULT_MATH)
            continue;
        /* fp32 runs every algorithm under FMA: DEFAULT_MATH would allow TF32 on Ampere+ */
        a->algo[a->n] = (int)perf[k].algo;
        a->math[a->n] = fp32 ? CUDNN_FMA_MATH : perf[k].mathType;
        zero = zero || ((int)perf[k].algo == 0 && a->math[a->n] == math);
        a->n++;
    }
    if (!zero) {
        a->algo[a->n] = 0;
        a->math[a->n++] = math;
    }
}

/* Sets the convolution descriptor to the math type of a's current algorithm. */
static cudnnStatus_t use_math(dlayer *l, const algo_list *a)
{
    return dnn.cudnnSetConvolutionMathType(l->cd, a->math[a->cur]);
}

/* The workspace a's current algorithm wants (query(algo, &bytes) under its math type). One whose
 * query cuDNN refuses here (refused) is passed over for good, as a step passes over one refused
 * at run time; an error, or a refusal of the list's last, stays the caller's error. */
template <typename Query>
static ddp_status first_size(dlayer *l, algo_list *a, Query query, const char *what, size_t *bytes,
                             ddp_error *err)
{
    for (;;) {
        cudnnStatus_t s = use_math(l, a);
        if (s == CUDNN_STATUS_SUCCESS)
            s = query(a->algo[a->cur], bytes);
        if (s == CUDNN_STATUS_SUCCESS)
            return DDP_OK;
        if (!refused(s) || a->cur + 1 >= a->n)
            return dnn_check(s, what, err);
        a->cur++;
    }
}

/* A conv layer's descriptors (for max_batch) and its three algorithms; *ws grows to the largest
 * workspace they need. */
static ddp_status setup_conv(ddp__cuda_cls *g, dlayer *l, size_t *ws, ddp_error *err)
{
    const ddp__cuda_cls_layer *L = &l->L;
    const bool fp32 = g->cfg.precision == DDP_PRECISION_FP32;
    /* 16 bits: x, w, y in the format, fp32 compute (cuDNN's PSEUDO_BFLOAT16 / PSEUDO_HALF
     * configurations), tensor cores allowed; tf32: cuDNN's default (TF32 allowed); fp32: FMA
     * kernels only (cuDNN's default allows TF32 on Ampere and later) */
    l->xt = !g->half               ? CUDNN_DATA_FLOAT
            : g->ht == DDP_FLOAT16 ? CUDNN_DATA_HALF
                                   : CUDNN_DATA_BFLOAT16;
    const cudnnMathType_t math = g->half ? CUDNN_TENSOR_OP_MATH
                                 : fp32  ? CUDNN_FMA_MATH
                                         : CUDNN_DEFAULT_MATH;
    ddp_status st;
    if ((st = dnn_check(dnn.cudnnCreateTensorDescriptor(&l->xd), "tensor descriptor", err)) ||
        (st = dnn_check(dnn.cudnnCreateTensorDescriptor(&l->yd), "tensor descriptor", err)) ||
        (st = dnn_check(dnn.cudnnCreateFilterDescriptor(&l->wd), "filter descriptor", err)) ||
        (st = dnn_check(dnn.cudnnCreateConvolutionDescriptor(&l->cd), "convolution descriptor",
                        err)) ||
        (st = dnn_check(dnn.cudnnSetFilter4dDescriptor(l->wd, l->xt, CUDNN_TENSOR_NCHW, L->out_ch,
                                                       L->in_ch, L->kh, L->kw),
                        "filter shape", err)) ||
        (st = dnn_check(
             dnn.cudnnSetConvolution2dDescriptor(l->cd, L->pad, L->pad, L->stride, L->stride, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             "convolution geometry", err)) ||
        (st = dnn_check(dnn.cudnnSetConvolutionMathType(l->cd, math), "convolution math type",
                        err)) ||
        (st = set_batch(l, g->cfg.B, err)))
        return st;
    int n_out = 0, c = 0, h = 0, w = 0;
    if ((st = dnn_check(
             dnn.cudnnGetConvolution2dForwardOutputDim(l->cd, l->xd, l->wd, &n_out, &c, &h, &w),
             "convolution output shape", err)))
        return st;
    if (c != L->out_ch || h != L->out_h || w != L->out_w)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda classifier: cuDNN makes the conv's output %d × %d × %d, the "
                              "model %d × %d × %d",
                              c, h, w, L->out_ch, L->out_h, L->out_w);
    cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int nf = 0, nd = 0, nw = 0;
    size_t b1, b2, b3;
    if ((st = dnn_check(
             dnn.cudnnGetConvolutionForwardAlgorithm_v7(g->dnn, l->xd, l->wd, l->cd, l->yd,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &nf, fp),
             "forward algorithm heuristic", err)) ||
        (st = dnn_check(dnn.cudnnGetConvolutionBackwardDataAlgorithm_v7(
                            g->dnn, l->wd, l->yd, l->cd, l->xd,
                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, dp),
                        "backward-data algorithm heuristic", err)) ||
        (st = dnn_check(dnn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                            g->dnn, l->xd, l->yd, l->cd, l->wd,
                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nw, wp),
                        "backward-filter algorithm heuristic", err)))
        return st;
    pick(&l->fwd, fp, nf, fp32, math);
    pick(&l->bwd_data, dp, nd, fp32, math);
    pick(&l->bwd_filter, wp, nw, fp32, math);
    /* the sizes of the first choices cuDNN sizes here, each under its math type (the
     * heuristic's figure may be an estimate); a later choice that wants more is refused by
     * ws_check's test and passed */
    auto fq = [&](int a, size_t *b) {
        return dnn.cudnnGetConvolutionForwardWorkspaceSize(g->dnn, l->xd, l->wd, l->cd, l->yd,
                                                           (cudnnConvolutionFwdAlgo_t)a, b);
    };
    auto dq = [&](int a, size_t *b) {
        return dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(
            g->dnn, l->wd, l->yd, l->cd, l->xd, (cudnnConvolutionBwdDataAlgo_t)a, b);
    };
    auto wq = [&](int a, size_t *b) {
        return dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(
            g->dnn, l->xd, l->yd, l->cd, l->wd, (cudnnConvolutionBwdFilterAlgo_t)a, b);
    };
    if ((st = first_size(l, &l->fwd, fq, "forward workspace size", &b1, err)) ||
        (st = first_size(l, &l->bwd_data, dq, "backward-data workspace size", &b2, err)) ||
        (st = first_size(l, &l->bwd_filter, wq, "backward-filter workspace size", &b3, err)))
        return st;
    size_t most = b1 > b2 ? b1 : b2;
    most = most > b3 ? most : b3;
    if (most > *ws)
        *ws = most;
    return DDP_OK;
}

static ddp_status setup_bn(dlayer *l, ddp_error *err)
{
    ddp_status st;
    if ((st = dnn_check(dnn.cudnnCreateTensorDescriptor(&l->xd), "tensor descriptor", err)) ||
        (st = dnn_check(dnn.cudnnCreateTensorDescriptor(&l->pd), "tensor descriptor", err)) ||
        (st = set_batch(l, 2, err)) ||
        (st = dnn_check(dnn.cudnnDeriveBNTensorDescriptor(l->pd, l->xd, CUDNN_BATCHNORM_SPATIAL),
                        "batchnorm parameter descriptor", err)))
        return st;
    return DDP_OK;
}

/* Whether the model has a layer cuDNN computes (a convolution or batchnorm). */
static bool needs_dnn(const ddp__cuda_cls_cfg *cfg)
{
    for (int i = 0; i < cfg->nl; i++)
        if (cfg->layers[i].kind == DDP__CLS_CONV || cfg->layers[i].kind == DDP__CLS_BN)
            return true;
    return false;
}

extern "C" ddp_status ddp__gpu_cls_create(const ddp__cuda_cls_cfg *cfg, const size_t *counts,
                                          size_t np, const size_t *bcounts, size_t nb,
                                          ddp__cuda_cls **out, ddp_error *err)
{
    if ((unsigned)cfg->precision >= DDP_PRECISION_COUNT)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "mlp/cnn on cuda: precision %d is not one this model implements "
                              "(fp32, tf32, bf16, fp16); HINT: rebuild libddp and libddp_gpu.so "
                              "together",
                              (int)cfg->precision);
    if (cfg->nl < 1 || cfg->B < 1 || cfg->classes < 1)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda classifier: %d layers, batch %d, %d "
                              "classes",
                              cfg->nl, cfg->B, cfg->classes);
    ddp__cuda_cls *g = (ddp__cuda_cls *)calloc(1, sizeof *g);
    if (!g)
        return ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda classifier: out of memory");
    g->cfg = *cfg;
    g->np = np;
    g->nb = nb;
    g->half = cfg->precision == DDP_PRECISION_BF16 || cfg->precision == DDP_PRECISION_FP16;
    g->ht = cfg->precision == DDP_PRECISION_FP16 ? DDP_FLOAT16 : DDP_BFLOAT16;
    g->L = (dlayer *)calloc((size_t)cfg->nl, sizeof *g->L);
    g->counts = (size_t *)calloc(np ? np : 1, sizeof(size_t));
    g->offsets = (size_t *)calloc(np ? np : 1, sizeof(size_t));
    g->bcounts = (size_t *)calloc(nb ? nb : 1, sizeof(size_t));
    g->boffsets = (size_t *)calloc(nb ? nb : 1, sizeof(size_t));
    ddp_status st = DDP_OK;
    const size_t B = (size_t)cfg->B;
    size_t widest = cfg->in_n, ws = 0, dw_max = 0;
    if (!g->L || !g->counts || !g->offsets || !g->bcounts || !g->boffsets) {
        st = ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda classifier: out of memory");
        goto out_free;
    }
    for (int i = 0; i < cfg->nl; i++)
        g->L[i].L = cfg->layers[i];
    g->cfg.layers = NULL; /* the caller's; the copies are in g->L */
    if ((st = layout(g, counts, np, bcounts, nb, err)) ||
        (st = ddp__cuda_ctx_create(cfg->device, &g->ctx, err)) ||
        (needs_dnn(cfg) &&
         ((st = dnn_ready(err)) || (st = dnn_check(dnn.cudnnCreate(&g->dnn), "cudnnCreate", err)) ||
          (st = dnn_check(dnn.cudnnSetStream(g->dnn, g->ctx->stream), "cudnnSetStream", err)))))
        goto out_free;
    g->grads_host = (float *)malloc(sizeof(float) * (g->total ? g->total : 1));
    g->row_loss_host = (float *)malloc(sizeof(float) * B);
    g->correct_host = (int32_t *)malloc(sizeof(int32_t) * B);
    if (!g->grads_host || !g->row_loss_host || !g->correct_host) {
        st = ddp__cuda_fail(err, DDP_ERR_NOMEM, "cuda classifier: out of host memory");
        goto out_free;
    }
    for (int i = 0; i < cfg->nl; i++) {
        dlayer *l = &g->L[i];
        const ddp__cuda_cls_layer *L = &l->L;
        if (L->out_n > widest)
            widest = L->out_n;
        /* cuDNN's legacy tensors hold fewer than 2^31 elements */
        size_t in_n = L->kind == DDP__CLS_CONV ? (size_t)L->in_ch * L->h * L->w : L->out_n;
        if ((L->kind == DDP__CLS_CONV || L->kind == DDP__CLS_BN) &&
            (double)B * (double)(in_n > L->out_n ? in_n : L->out_n) >= 2147483648.0) {
            st = ddp__cuda_fail(err, DDP_ERR_INVALID,
                                "cuda classifier: layer %d holds %zu × %zu values at max_batch "
                                "%zu, beyond cuDNN's 2^31 per tensor; HINT: use a smaller batch",
                                i, B, in_n > L->out_n ? in_n : L->out_n, B);
            goto out_free;
        }
        const bool product = L->kind == DDP__CLS_LINEAR || L->kind == DDP__CLS_CONV;
        if (L->kind == DDP__CLS_CONV && (size_t)L->out_ch * L->in_ch * L->kh * L->kw > dw_max)
            dw_max = (size_t)L->out_ch * L->in_ch * L->kh * L->kw;
        if ((st = dalloc_es(&l->y, B * L->out_n, 4, err)) ||
            (g->half && product &&
             (st = dalloc_es(&l->xh, B * (L->kind == DDP__CLS_CONV ? in_n : (size_t)L->in), 2,
                             err))) ||
            (L->kind == DDP__CLS_POOL && (st = dalloc_es(&l->argmax, B * L->out_n, 4, err))) ||
            (L->kind == DDP__CLS_DROPOUT && (st = dalloc_es(&l->mask, B * L->out_n, 1, err))) ||
            (L->kind == DDP__CLS_BN && (st = dalloc_es(&l->aux, 2 * span((size_t)L->C), 4, err))) ||
            (L->kind == DDP__CLS_CONV && (st = setup_conv(g, l, &ws, err))) ||
            (L->kind == DDP__CLS_BN && (st = setup_bn(l, err))))
            goto out_free;
    }
    g->ws_bytes = ws;
    if ((st = dalloc_es(&g->params, g->total, 4, err)) ||
        (st = dalloc_es(&g->grads, g->total, 4, err)) ||
        (st = dalloc_es(&g->buffers, g->btotal, 4, err)) ||
        (st = dalloc_es(&g->x, B * cfg->in_n, 4, err)) ||
        (st = dalloc_es(&g->dlogits, B * (size_t)cfg->classes, 4, err)) ||
        (st = dalloc_es(&g->row_loss, B, 4, err)) || (st = dalloc_es(&g->labels, B, 4, err)) ||
        (st = dalloc_es(&g->correct, B, 4, err)) || (st = dalloc_es(&g->g0, B * widest, 4, err)) ||
        (st = dalloc_es(&g->g1, B * widest, 4, err)) || (st = dalloc_es(&g->ws, ws, 1, err)) ||
        (g->half && ((st = dalloc_es(&g->params_h, g->total, 2, err)) ||
                     (st = dalloc_es(&g->h0, B * widest, 2, err)) ||
                     (st = dalloc_es(&g->h1, B * widest, 2, err)) ||
                     (st = dalloc_es(&g->dwh, dw_max, 2, err)))) ||
        (st = ddp__cuda_memset0(g->ctx, g->params, sizeof(float) * g->total, err)) ||
        (st = ddp__cuda_sync(g->ctx, err)))
        goto out_free;
    ddp__cuda_resident_init(&g->res, "cuda classifier", g->ctx, g->np, g->total, g->counts,
                            g->offsets, g->params);
    *out = g;
    return DDP_OK;
out_free:
    ddp__gpu_cls_free(g);
    return st;
}

/* The weights' 16-bit twin from the masters: in one pass over the flat buffer (its padding
 * between tensors is zeroed at create and stays zero), or tensor by tensor when bound. */
static ddp_status round_h(ddp__cuda_cls *g, ddp_error *err)
{
    if (!g->res.bound)
        return ddp__cuda_f32_to_h(g->ctx, g->ht, g->params, g->total, g->params_h, err);
    ddp_status st = DDP_OK;
    for (size_t i = 0; i < g->np && !st; i++)
        st = ddp__cuda_f32_to_h(g->ctx, g->ht, P(g, (int)i), g->counts[i],
                                g->params_h + g->offsets[i], err);
    return st;
}

/* While the parameters are bound (bind_params): each one cuDNN reads (a conv's fp32 weight,
 * batchnorm's γ and β) whose bound array is not 256-byte aligned copied into its slot of the flat
 * buffer, which PD then hands cuDNN. Run at every forward, as round_h in resident mode: the
 * optimizer changes the bound arrays only between a backward and the next forward. */
static ddp_status refresh_bound(ddp__cuda_cls *g, ddp_error *err)
{
    ddp_status st = DDP_OK;
    for (int k = 0; k < g->cfg.nl && !st; k++) {
        const ddp__cuda_cls_layer *L = &g->L[k].L;
        int first = L->p0, last = L->p0 - 1; /* the parameters cuDNN reads: [first, last] */
        if (L->kind == DDP__CLS_BN)
            last = L->p0 + 1;
        else if (L->kind == DDP__CLS_CONV && !g->half) /* 16 bits: cuDNN reads the twin */
            last = L->p0;
        for (int i = first; i <= last && !st; i++)
            if (!aligned(g->res.bound[i]))
                st = ddp__cuda_copy(g->ctx, g->params + g->offsets[i], g->res.bound[i],
                                    sizeof(float) * g->counts[i], err);
    }
    return st;
}

extern "C" ddp_status ddp__gpu_cls_upload(ddp__cuda_cls *g, const float *const *params_host,
                                          const float *const *buffers_host, ddp_error *err)
{
    ddp_status st = use_device(g, err);
    for (size_t i = 0; i < g->np && !st; i++)
        st = ddp__cuda_to_device(g->ctx, P(g, (int)i), params_host[i], sizeof(float) * g->counts[i],
                                 err);
    for (size_t j = 0; buffers_host && j < g->nb && !st; j++)
        st = ddp__cuda_to_device(g->ctx, BUF(g, (int)j), buffers_host[j],
                                 sizeof(float) * g->bcounts[j], err);
    if (!st && g->half) /* from the masters just uploaded */
        st = round_h(g, err);
    return st;
}

extern "C" ddp_status ddp__gpu_cls_get_buffers(ddp__cuda_cls *g, float *const *buffers_host,
                                               ddp_error *err)
{
    ddp_status st = use_device(g, err);
    for (size_t j = 0; j < g->nb && !st; j++)
        st = ddp__cuda_to_host(g->ctx, buffers_host[j], BUF(g, (int)j),
                               sizeof(float) * g->bcounts[j], err);
    return st;
}

/* ---- forward --------------------------------------------------------------------------------- */

/* An algorithm's workspace for this batch, checked against what create allocated. */
static ddp_status ws_check(ddp__cuda_cls *g, size_t need, const char *what, ddp_error *err)
{
    if (need <= g->ws_bytes)
        return DDP_OK;
    return ddp__cuda_fail(err, DDP_ERR_SYSTEM,
                          "cuda classifier: the %s algorithm wants %zu bytes of workspace at this "
                          "batch, more than the %zu allocated for max_batch",
                          what, need, g->ws_bytes);
}

/* A conv's forward: y (n, out_n) fp32 from x (n, in_n) fp32. In 16 bits x is rounded into the
 * layer's xh, cuDNN writes its 16-bit output into h0, and bias_add_h widens it into y with the
 * bias (the file's header says why). */
static ddp_status conv_forward(ddp__cuda_cls *g, dlayer *l, const float *x, int n, ddp_error *err)
{
    const ddp__cuda_cls_layer *L = &l->L;
    const float one = 1.0f, zero = 0.0f;
    const size_t in_n = (size_t)L->in_ch * L->h * L->w, total = (size_t)n * L->out_n;
    const void *xin = x, *w = PD(g, L->p0);
    void *yout = l->y;
    ddp_status st = set_batch(l, n, err);
    if (!st && g->half) {
        st = ddp__cuda_f32_to_h(g->ctx, g->ht, x, (size_t)n * in_n, l->xh, err);
        xin = l->xh, w = PH(g, L->p0), yout = g->h0;
    }
    while (!st) {
        size_t need = 0;
        const cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)l->fwd.algo[l->fwd.cur];
        cudnnStatus_t s = use_math(l, &l->fwd);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnGetConvolutionForwardWorkspaceSize(g->dnn, l->xd, l->wd, l->cd, l->yd,
                                                            algo, &need);
        if (s == CUDNN_STATUS_SUCCESS && need > g->ws_bytes)
            s = CUDNN_STATUS_NOT_SUPPORTED;
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnConvolutionForward(g->dnn, &one, l->xd, xin, l->wd, w, l->cd, algo,
                                            g->ws, g->ws_bytes, &zero, l->yd, yout);
        if (s == CUDNN_STATUS_SUCCESS)
            break;
        if (refused(s) && l->fwd.cur + 1 < l->fwd.n) {
            l->fwd.cur++; /* for good */
            continue;
        }
        st = need > g->ws_bytes ? ws_check(g, need, "conv forward", err)
                                : dnn_check(s, "cudnnConvolutionForward", err);
    }
    if (st)
        return st;
    const int C = L->out_ch, Pn = L->out_h * L->out_w;
    if (g->half)
        ddp__half_dispatch(g->ht, [&](auto e) {
            using E = decltype(e);
            bias_add_h<E><<<blocks(total), 256, 0, g->ctx->stream>>>(
                (const E *)g->h0, P(g, L->p0 + 1), total, C, Pn, l->y);
        });
    else
        bias_add<<<blocks(total), 256, 0, g->ctx->stream>>>(l->y, P(g, L->p0 + 1), total, C, Pn);
    return ddp__cuda_launched("conv bias", err);
}

static ddp_status bn_forward(ddp__cuda_cls *g, dlayer *l, const float *x, int n, bool train,
                             ddp_error *err)
{
    const ddp__cuda_cls_layer *L = &l->L;
    const float one = 1.0f, zero = 0.0f;
    ddp_status st = set_batch(l, n, err);
    if (st)
        return st;
    if (train)
        return dnn_check(dnn.cudnnBatchNormalizationForwardTraining(
                             g->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, l->xd, x, l->xd, l->y,
                             l->pd, PD(g, L->p0), PD(g, L->p0 + 1), (double)g->cfg.bn_momentum,
                             BUF(g, L->buf0), BUF(g, L->buf0 + 1), (double)g->cfg.bn_eps, l->aux,
                             INVSTD(l)),
                         "cudnnBatchNormalizationForwardTraining", err);
    return dnn_check(dnn.cudnnBatchNormalizationForwardInference(
                         g->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, l->xd, x, l->xd, l->y, l->pd,
                         PD(g, L->p0), PD(g, L->p0 + 1), BUF(g, L->buf0), BUF(g, L->buf0 + 1),
                         (double)g->cfg.bn_eps),
                     "cudnnBatchNormalizationForwardInference", err);
}

static ddp_status layer_forward(ddp__cuda_cls *g, int i, const float *a,
                                const ddp__cuda_cls_batch *b, ddp_error *err)
{
    dlayer *l = &g->L[i];
    const ddp__cuda_cls_layer *L = &l->L;
    cudaStream_t s = g->ctx->stream;
    const int n = b->n;
    const size_t cnt = (size_t)n * L->out_n;
    switch (L->kind) {
    case DDP__CLS_LINEAR: {
        if (!g->half)
            return ddp__cuda_linear_forward(g->ctx, a, P(g, L->p0), P(g, L->p0 + 1), n, L->in,
                                            L->out, l->y, g->cfg.precision, err);
        /* y (n, out) fp32 = xh · Whᵀ + b: 16-bit operands, fp32 accumulation, the fp32 bias */
        ddp_status st = ddp__cuda_f32_to_h(g->ctx, g->ht, a, (size_t)n * L->in, l->xh, err);
        return st ? st
                  : ddp__cuda_gemm(g->ctx, false, true, n, L->out, L->in, 1.0f, l->xh, L->in,
                                   PH(g, L->p0), L->in, 0.0f, l->y, L->out, g->ht, DDP_FLOAT32,
                                   P(g, L->p0 + 1), g->cfg.precision, err);
    }
    case DDP__CLS_RELU:
        relu_fwd<<<blocks(cnt), 256, 0, s>>>(a, cnt, l->y);
        return ddp__cuda_launched("relu", err);
    case DDP__CLS_GELU:
        gelu_erf_fwd<<<blocks(cnt), 256, 0, s>>>(a, cnt, l->y);
        return ddp__cuda_launched("gelu", err);
    case DDP__CLS_DROPOUT:
        if (!b->train || L->p <= 0.0f) {
            ddp_status st = ddp__cuda_copy(g->ctx, l->y, a, sizeof(float) * cnt, err);
            if (!st && b->train) /* the CPU's mask of ones: backward passes everything */
                st = ddp__cuda_check(cudaMemsetAsync(l->mask, 1, cnt, s), "memset", err);
            return st;
        }
        if (L->p >= 1.0f) {
            ddp_status st = ddp__cuda_memset0(g->ctx, l->y, sizeof(float) * cnt, err);
            return st ? st : ddp__cuda_memset0(g->ctx, l->mask, cnt, err);
        }
        dropout_fwd<<<blocks(cnt), 256, 0, s>>>(
            a, cnt, (uint64_t)((double)L->p * 4294967296.0), 1.0f / (1.0f - L->p),
            g->cfg.seed + (uint64_t)i, b->step, b->sample_offset * L->out_n, (size_t)L->out_n,
            b->sample_stride > 1 ? (b->sample_stride - 1) * (uint64_t)L->out_n : 0, l->mask,
            l->y);
        return ddp__cuda_launched("dropout", err);
    case DDP__CLS_CONV: return conv_forward(g, l, a, n, err);
    case DDP__CLS_BN: return bn_forward(g, l, a, n, b->train, err);
    case DDP__CLS_POOL:
        pool_fwd<<<blocks(cnt), 256, 0, s>>>(a, (size_t)n * L->in_ch, L->h, L->w, L->out_h,
                                             L->out_w, L->kh, L->stride, l->y, l->argmax);
        return ddp__cuda_launched("max-pool", err);
    }
    return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda classifier: layer %d has kind %d", i,
                          L->kind);
}

extern "C" ddp_status ddp__gpu_cls_forward(ddp__cuda_cls *g, const ddp__cuda_cls_batch *b,
                                           double *loss_sum, int64_t *correct, float *logits_host,
                                           ddp_error *err)
{
    ddp__cuda_ctx *c = g->ctx;
    const int n = b->n, K = g->cfg.classes;
    g->can_backward = false;
    if (n < 1 || n > g->cfg.B)
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda classifier: batch %d (1 … %d)", n,
                              g->cfg.B);
    ddp_status st;
    if ((st = use_device(g, err)) ||
        (st = ddp__cuda_to_device(c, g->x, b->x, sizeof(float) * (size_t)n * g->cfg.in_n, err)) ||
        (b->labels &&
         (st = ddp__cuda_to_device(c, g->labels, b->labels, sizeof(int32_t) * (size_t)n, err))) ||
        (g->resident && g->half && (st = round_h(g, err))) ||
        (g->res.bound && (st = refresh_bound(g, err))))
        return st;
    const float *a = g->x;
    for (int i = 0; i < g->cfg.nl; i++) {
        if ((st = layer_forward(g, i, a, b, err)))
            return st;
        a = g->L[i].y;
    }
    g->n = n;
    if (b->labels) {
        float scale = b->grad_scale != 0.0f ? b->grad_scale : 1.0f;
        if ((st = ddp__cuda_vocab_xent(c, a, g->labels, n, K, scale, n, g->row_loss, g->correct,
                                       b->train ? g->dlogits : NULL, err)) ||
            (st = ddp__cuda_to_host(c, g->row_loss_host, g->row_loss, sizeof(float) * (size_t)n,
                                    err)) ||
            (st = ddp__cuda_to_host(c, g->correct_host, g->correct, sizeof(int32_t) * (size_t)n,
                                    err)))
            return st;
        double s = 0;
        int64_t k = 0;
        for (int r = 0; r < n; r++) {
            s += g->row_loss_host[r];
            k += g->correct_host[r];
        }
        *loss_sum = s;
        *correct = k;
        g->can_backward = b->train;
    }
    return ddp__cuda_to_host(c, logits_host, a, sizeof(float) * (size_t)n * K, err);
}

/* ---- backward -------------------------------------------------------------------------------- */

/* A conv's backward from dy (n, out_n) fp32: dW and db added into the gradients, dx (n, in_n)
 * fp32 written when not NULL. In 16 bits dy is rounded into h0, cuDNN's dW goes to dwh (beta 0)
 * and is added into the fp32 gradient, its dx goes to h1 and is widened into dx; the forward's
 * xh is the filter gradient's input. */
static ddp_status conv_backward(ddp__cuda_cls *g, dlayer *l, const float *dy, const float *in,
                                int n, float *dx, ddp_error *err)
{
    const ddp__cuda_cls_layer *L = &l->L;
    const float one = 1.0f, zero = 0.0f;
    const size_t wn = (size_t)L->out_ch * L->in_ch * L->kh * L->kw;
    const size_t in_n = (size_t)L->in_ch * L->h * L->w;
    const void *xin = in, *dyin = dy, *w = PD(g, L->p0);
    void *dxout = dx;
    /* fp32: dW += (gradients accumulate, as the CPU's), or into the aligned scratch (GD) */
    float beta_w;
    void *dw = GD(g, L->p0, &beta_w);
    ddp_status st = set_batch(l, n, err);
    if (!st && g->half) {
        st = ddp__cuda_f32_to_h(g->ctx, g->ht, dy, (size_t)n * L->out_n, g->h0, err);
        xin = l->xh, dyin = g->h0, w = PH(g, L->p0), dw = g->dwh, dxout = g->h1;
        beta_w = 0.0f;
    }
    while (!st) {
        size_t need = 0;
        const cudnnConvolutionBwdFilterAlgo_t algo =
            (cudnnConvolutionBwdFilterAlgo_t)l->bwd_filter.algo[l->bwd_filter.cur];
        cudnnStatus_t s = use_math(l, &l->bwd_filter);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(g->dnn, l->xd, l->yd, l->cd,
                                                                   l->wd, algo, &need);
        if (s == CUDNN_STATUS_SUCCESS && need > g->ws_bytes)
            s = CUDNN_STATUS_NOT_SUPPORTED;
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnConvolutionBackwardFilter(g->dnn, &one, l->xd, xin, l->yd, dyin, l->cd,
                                                   algo, g->ws, g->ws_bytes, &beta_w, l->wd, dw);
        if (s == CUDNN_STATUS_SUCCESS)
            break;
        if (refused(s) && l->bwd_filter.cur + 1 < l->bwd_filter.n) {
            l->bwd_filter.cur++; /* for good */
            continue;
        }
        st = need > g->ws_bytes ? ws_check(g, need, "conv backward-filter", err)
                                : dnn_check(s, "cudnnConvolutionBackwardFilter", err);
    }
    if (!st && g->half) /* the 16-bit dW into the fp32 gradient */
        st = ddp__cuda_add_h(g->ctx, g->ht, G(g, L->p0), g->dwh, wn, G(g, L->p0), err);
    else if (!st) /* fp32: the scratch's dW into a misaligned gradient */
        st = add_scratch(g, L->p0, err);
    if (st)
        return st;
    channel_sum<<<(unsigned)L->out_ch, 256, 0, g->ctx->stream>>>(
        dy, n, L->out_ch, L->out_h * L->out_w, G(g, L->p0 + 1));
    if ((st = ddp__cuda_launched("conv bias gradient", err)) || !dx)
        return st;
    for (;;) {
        size_t need = 0;
        const cudnnConvolutionBwdDataAlgo_t algo =
            (cudnnConvolutionBwdDataAlgo_t)l->bwd_data.algo[l->bwd_data.cur];
        cudnnStatus_t s = use_math(l, &l->bwd_data);
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(g->dnn, l->wd, l->yd, l->cd,
                                                                 l->xd, algo, &need);
        if (s == CUDNN_STATUS_SUCCESS && need > g->ws_bytes)
            s = CUDNN_STATUS_NOT_SUPPORTED;
        if (s == CUDNN_STATUS_SUCCESS)
            s = dnn.cudnnConvolutionBackwardData(g->dnn, &one, l->wd, w, l->yd, dyin, l->cd, algo,
                                                 g->ws, g->ws_bytes, &zero, l->xd, dxout);
        if (s == CUDNN_STATUS_SUCCESS)
            return g->half ? ddp__cuda_h_to_f32(g->ctx, g->ht, g->h1, (size_t)n * in_n, dx, err)
                           : DDP_OK;
        if (refused(s) && l->bwd_data.cur + 1 < l->bwd_data.n) {
            l->bwd_data.cur++; /* for good */
            continue;
        }
        return need > g->ws_bytes ? ws_check(g, need, "conv backward-data", err)
                                  : dnn_check(s, "cudnnConvolutionBackwardData", err);
    }
}

static ddp_status layer_backward(ddp__cuda_cls *g, int i, const float *dy, const float *in,
                                 float *dx, float *spare, ddp_error *err)
{
    dlayer *l = &g->L[i];
    const ddp__cuda_cls_layer *L = &l->L;
    cudaStream_t s = g->ctx->stream;
    const int n = g->n;
    const size_t cnt = (size_t)n * L->out_n;
    switch (L->kind) {
    case DDP__CLS_LINEAR: {
        if (!g->half)
            return ddp__cuda_linear_backward(g->ctx, dy, in, P(g, L->p0), n, L->in, L->out, dx,
                                             G(g, L->p0), G(g, L->p0 + 1), g->cfg.precision, err);
        /* dyh = dy rounded; dx (n, in) fp32 = dyh · Wh; dW (out, in) fp32 += dyhᵀ · xh (the
         * forward's); db += the column sums of the fp32 dy (as the CPU's bf16 path) */
        ddp_status st = ddp__cuda_f32_to_h(g->ctx, g->ht, dy, (size_t)n * L->out, g->h0, err);
        if (!st && dx)
            st = ddp__cuda_gemm(g->ctx, false, false, n, L->in, L->out, 1.0f, g->h0, L->out,
                                PH(g, L->p0), L->in, 0.0f, dx, L->in, g->ht, DDP_FLOAT32, NULL,
                                g->cfg.precision, err);
        if (!st)
            st = ddp__cuda_gemm(g->ctx, true, false, L->out, L->in, n, 1.0f, g->h0, L->out, l->xh,
                                L->in, 1.0f, G(g, L->p0), L->in, g->ht, DDP_FLOAT32, NULL,
                                g->cfg.precision, err);
        return st ? st : ddp__cuda_colsum(g->ctx, dy, n, L->out, G(g, L->p0 + 1), err);
    }
    case DDP__CLS_RELU:
        if (!dx)
            return DDP_OK;
        relu_bwd<<<blocks(cnt), 256, 0, s>>>(dy, in, cnt, dx);
        return ddp__cuda_launched("relu backward", err);
    case DDP__CLS_GELU:
        if (!dx)
            return DDP_OK;
        gelu_erf_bwd<<<blocks(cnt), 256, 0, s>>>(dy, in, cnt, dx);
        return ddp__cuda_launched("gelu backward", err);
    case DDP__CLS_DROPOUT:
        if (!dx)
            return DDP_OK;
        if (L->p <= 0.0f)
            return ddp__cuda_copy(g->ctx, dx, dy, sizeof(float) * cnt, err);
        dropout_bwd<<<blocks(cnt), 256, 0, s>>>(dy, l->mask, cnt,
                                                L->p >= 1.0f ? 0.0f : 1.0f / (1.0f - L->p), dx);
        return ddp__cuda_launched("dropout backward", err);
    case DDP__CLS_CONV: return conv_backward(g, l, dy, in, n, dx, err);
    case DDP__CLS_BN: {
        /* cuDNN always writes dx: the spare buffer when the input needs none. dγ and dβ share
         * one beta: both added into G (beta 1) when both are aligned, else both written into
         * the scratch (beta 0) and added after. */
        const float one = 1.0f, zero = 0.0f;
        float b0, b1;
        float *dg = GD(g, L->p0, &b0), *db = GD(g, L->p0 + 1, &b1);
        if (b0 != b1) {
            b0 = b1 = 0.0f;
            dg = g->grads + g->offsets[L->p0];
            db = g->grads + g->offsets[L->p0 + 1];
        }
        ddp_status st = set_batch(l, n, err);
        if (!st)
            st = dnn_check(dnn.cudnnBatchNormalizationBackward(
                               g->dnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &b0, l->xd,
                               in, l->xd, dy, l->xd, dx ? dx : spare, l->pd, PD(g, L->p0), dg, db,
                               (double)g->cfg.bn_eps, l->aux, INVSTD(l)),
                           "cudnnBatchNormalizationBackward", err);
        if (!st && b0 == 0.0f) {
            for (int k = 0; k < 2 && !st; k++) {
                float *d = G(g, L->p0 + k);
                st = ddp__cuda_add(g->ctx, d, g->grads + g->offsets[L->p0 + k],
                                   g->counts[L->p0 + k], d, err);
            }
        }
        return st;
    }
    case DDP__CLS_POOL: {
        if (!dx)
            return DDP_OK;
        ddp_status st = ddp__cuda_memset0(g->ctx, dx, sizeof(float) * (size_t)n * L->in_n, err);
        if (st)
            return st;
        pool_bwd<<<blocks(cnt), 256, 0, s>>>(dy, l->argmax, (size_t)n * L->in_ch, L->h * L->w,
                                             L->out_h * L->out_w, dx);
        return ddp__cuda_launched("max-pool backward", err);
    }
    }
    return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda classifier: layer %d has kind %d", i,
                          L->kind);
}

extern "C" ddp_status ddp__gpu_cls_backward(ddp__cuda_cls *g, float *const *grads_host,
                                            ddp_error *err)
{
    if (!g->can_backward)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda classifier: backward without a training forward with labels");
    g->can_backward = false;
    ddp__cuda_ctx *c = g->ctx;
    ddp_status st;
    /* backward_dev: straight into the caller's gradients, which accumulate (no zeroing) */
    if ((st = use_device(g, err)) ||
        (!g->grads_dev && (st = ddp__cuda_memset0(c, g->grads, sizeof(float) * g->total, err))))
        return st;
    const float *dy = g->dlogits;
    for (int i = g->cfg.nl - 1; i >= 0; i--) {
        const float *in = i > 0 ? g->L[i - 1].y : g->x;
        float *other = dy == g->g0 ? g->g1 : g->g0;
        float *dx = i > 0 ? other : NULL; /* the input needs none */
        if ((st = layer_backward(g, i, dy, in, dx, other, err)))
            return st;
        /* backward_dev: this layer's weight, then its bias, are queued in full: their bucket's
         * allreduce (ordered after the stream) may start */
        const ddp__cuda_cls_layer *L = &g->L[i].L;
        for (int k = 0; g->ready && L->p0 >= 0 && k < 2; k++)
            if ((st = g->ready(g->ready_ctx, (size_t)(L->p0 + k))))
                return ddp__cuda_fail(err, st,
                                      "cuda classifier: the gradient-ready callback failed");
        dy = dx;
    }
    if (g->grads_dev)
        return DDP_OK;
    if ((st = ddp__cuda_to_host(c, g->grads_host, g->grads, sizeof(float) * g->total, err)))
        return st;
    for (size_t i = 0; i < g->np; i++) {
        const float *src = g->grads_host + g->offsets[i];
        float *dst = grads_host[i];
        for (size_t k = 0; k < g->counts[i]; k++)
            dst[k] += src[k];
    }
    return DDP_OK;
}

/* ---- device-resident training (kernels.h: ddp__cuda_cls_dev_info …) ------------------------
 * The GPT's scheme (gpt.cu): the parameters and running statistics stay on the device between
 * steps, backward adds into the caller's device gradients and reports each parameter as soon as
 * its kernels are queued, the optimizer's state is one or two more flat buffers laid out like
 * the parameters, stepped by the GPT's AdamW (ddp__cuda_adamw) and SGD (ddp__devmath_sgd)
 * kernels. Everything on the model's one stream. */

extern "C" ddp_status ddp__gpu_cls_dev_info(ddp__cuda_cls *g, float **params_dev,
                                            float **buffers_dev, void **stream, ddp_error *err)
{
    (void)err;
    for (size_t i = 0; params_dev && i < g->np; i++)
        params_dev[i] = P(g, (int)i);
    for (size_t j = 0; buffers_dev && j < g->nb; j++)
        buffers_dev[j] = BUF(g, (int)j);
    if (stream)
        *stream = (void *)g->ctx->stream;
    return DDP_OK;
}

extern "C" ddp_status ddp__gpu_cls_get_params(ddp__cuda_cls *g, float *const *params_host,
                                              ddp_error *err)
{
    ddp_status st = use_device(g, err);
    for (size_t i = 0; i < g->np && !st; i++)
        st = ddp__cuda_to_host(g->ctx, params_host[i], P(g, (int)i), sizeof(float) * g->counts[i],
                               err);
    return st;
}

extern "C" ddp_status ddp__gpu_cls_backward_dev(ddp__cuda_cls *g, float *const *grads_dev,
                                                ddp_status (*ready)(void *ctx, size_t i), void *ctx,
                                                ddp_error *err)
{
    g->grads_dev = grads_dev;
    g->ready = ready;
    g->ready_ctx = ctx;
    ddp_status st = ddp__gpu_cls_backward(g, NULL, err);
    g->grads_dev = NULL;
    g->ready = NULL;
    return st;
}

extern "C" ddp_status ddp__gpu_cls_optim_init(ddp__cuda_cls *g, int nstates, ddp_error *err)
{
    ddp_status st = ddp__cuda_resident_optim_init(&g->res, nstates, err);
    if (!st)
        g->resident = true;
    return st;
}

extern "C" ddp_status ddp__gpu_cls_optim_step(ddp__cuda_cls *g, const ddp__cuda_optim_args *a,
                                              ddp_error *err)
{
    return ddp__cuda_resident_optim_step(&g->res, a, err);
}

extern "C" ddp_status ddp__gpu_cls_optim_state(ddp__cuda_cls *g, int s, float *const *host,
                                               bool to_host, ddp_error *err)
{
    return ddp__cuda_resident_optim_state(&g->res, s, host, to_host, err);
}

extern "C" ddp_status ddp__gpu_cls_bind_params(ddp__cuda_cls *g, float *const *params_dev,
                                               ddp_error *err)
{
    ddp_status st = ddp__cuda_resident_bind_params(&g->res, params_dev, err);
    /* bound, round_h rounds tensor by tensor: the twin's padding zeroed here, as the GPT's, and
     * the twin rounded again from the arrays bound (a backward may follow a forward) */
    if (!st && params_dev && g->half &&
        !(st = ddp__cuda_memset0(g->ctx, g->params_h, sizeof(uint16_t) * g->total, err)))
        st = round_h(g, err);
    return st;
}

extern "C" ddp_status ddp__gpu_cls_state_dev(ddp__cuda_cls *g, int s, float **dev, ddp_error *err)
{
    return ddp__cuda_resident_state_dev(&g->res, s, dev, err);
}

extern "C" ddp_status ddp__gpu_cls_optim_keep(ddp__cuda_cls *g, const size_t *lo, const size_t *hi,
                                              ddp_error *err)
{
    return ddp__cuda_resident_optim_keep(&g->res, lo, hi, err);
}
