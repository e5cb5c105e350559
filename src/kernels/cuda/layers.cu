/*
 * kernels/cuda/layers.cu — the GPT's elementwise and row-wise layers on the device: embedding,
 * layernorm, GELU (tanh), residual add, and the fused softmax cross-entropy over the vocabulary.
 * Each mirrors its CPU twin in ddp/nn.h (the reference in tests/unit/test_cuda_kernels.c); the
 * differences are stated where they are (fp32 statistics where the CPU uses double, atomic adds
 * whose order varies). No dropout here: the CUDA GPT refuses dropout > 0 for now.
 * The 16-bit variants (precision bf16 and fp16: docs/gpu.md's table of roundings) are the same
 * kernels templated on the element type through ddp__ld/ddp__st: fp32 arithmetic, bf16 or fp16
 * storage (fp16 overflowing to ±inf, for the loss scaler to find).
 */
#include "common.cuh"

/* ---- embedding ------------------------------------------------------------------------------ */

__global__ void embedding_fwd(const int32_t *idx, const float *wte, const float *wpe, int T, int C,
                              size_t total, float *x)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C), t = (int)(n % T);
        x[i] = wte[(size_t)idx[n] * C + c] + wpe[(size_t)t * C + c];
    }
}

extern "C" ddp_status ddp__cuda_embedding_forward(ddp__cuda_ctx *c, const int32_t *idx,
                                                  const float *wte, const float *wpe, int B, int T,
                                                  int C, float *x, ddp_error *err)
{
    size_t total = (size_t)B * T * C;
    embedding_fwd<<<ddp__cuda_blocks(total, 256), 256, 0, c->stream>>>(idx, wte, wpe, T, C, total,
                                                                       x);
    return ddp__cuda_launched("embedding forward", err);
}

__global__ void embedding_bwd_wte(const float *dx, const int32_t *idx, int C, size_t total,
                                  float *dwte)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        atomicAdd(&dwte[(size_t)idx[i / C] * C + i % C], dx[i]);
}

/* dwpe[t, c] += Σ_b dx[b, t, c], in b order (deterministic); grid-stride (the grid is capped). */
__global__ void embedding_bwd_wpe(const float *dx, int B, int T, int C, float *dwpe)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * C;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++)
            s += dx[(size_t)b * T * C + i];
        dwpe[i] += s;
    }
}

extern "C" ddp_status ddp__cuda_embedding_backward(ddp__cuda_ctx *c, const float *dx,
                                                   const int32_t *idx, int B, int T, int C,
                                                   float *dwte, float *dwpe, ddp_error *err)
{
    size_t total = (size_t)B * T * C;
    if (dwte)
        embedding_bwd_wte<<<ddp__cuda_blocks(total, 256), 256, 0, c->stream>>>(dx, idx, C, total,
                                                                               dwte);
    if (dwpe)
        embedding_bwd_wpe<<<ddp__cuda_blocks((size_t)T * C, 256), 256, 0, c->stream>>>(dx, B, T, C,
                                                                                       dwpe);
    return ddp__cuda_launched("embedding backward", err);
}

/* ---- layernorm: one warp per row ------------------------------------------------------------ */

template <typename E>
__global__ void layernorm_fwd(const float *x, const float *w, const float *b, int N, int C,
                              float eps, E *y, float *mean, float *rstd)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *xr = x + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += 32)
        s += xr[i];
    float mu = ddp__warp_sum(s) / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float d = xr[i] - mu;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(ddp__warp_sum(v) / C + eps);
    E *yr = y + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        ddp__st(yr + i, (xr[i] - mu) * rs * w[i] + (b ? b[i] : 0.0f));
    if (lane == 0 && mean) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

extern "C" ddp_status ddp__cuda_layernorm_forward(ddp__cuda_ctx *c, const float *x,
                                                  const float *weight, const float *bias, int N,
                                                  int C, float eps, float *y, float *mean,
                                                  float *rstd, ddp_error *err)
{
    if (N <= 0)
        return DDP_OK;
    layernorm_fwd<float>
        <<<(unsigned)((N + 7) / 8), 256, 0, c->stream>>>(x, weight, bias, N, C, eps, y, mean, rstd);
    return ddp__cuda_launched("layernorm forward", err);
}

extern "C" ddp_status ddp__cuda_layernorm_forward_h(ddp__cuda_ctx *c, ddp_dtype ht, const float *x,
                                                    const float *weight, const float *bias, int N,
                                                    int C, float eps, uint16_t *y, float *mean,
                                                    float *rstd, ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "layernorm forward", err);
    if (st || N <= 0)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        layernorm_fwd<E><<<(unsigned)((N + 7) / 8), 256, 0, c->stream>>>(x, weight, bias, N, C, eps,
                                                                         (E *)y, mean, rstd);
    });
    return ddp__cuda_launched("layernorm forward (16-bit output)", err);
}

/* dx = rstd · (w·dy − mean(w·dy) − x̂ · mean(w·dy·x̂)), one warp per row; in place is safe (each
 * lane reads its elements of dy before writing them, after the row's sums). */
__global__ void layernorm_bwd_dx(const float *dy, const float *x, const float *w, const float *mean,
                                 const float *rstd, int N, int C, float *dx)
{
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const float *dyr = dy + (size_t)row * C, *xr = x + (size_t)row * C;
    float mu = mean[row], rs = rstd[row], s1 = 0.0f, s2 = 0.0f;
    for (int i = lane; i < C; i += 32) {
        float dn = dyr[i] * w[i];
        s1 += dn;
        s2 += dn * (xr[i] - mu) * rs;
    }
    s1 = ddp__warp_sum(s1) / C;
    s2 = ddp__warp_sum(s2) / C;
    float *dxr = dx + (size_t)row * C;
    for (int i = lane; i < C; i += 32) {
        float xh = (xr[i] - mu) * rs;
        dxr[i] = rs * (dyr[i] * w[i] - s1 - xh * s2);
    }
}

/* dw[c] += Σ dy·x̂, db[c] += Σ dy over a chunk of 256 rows per block row. */
__global__ void layernorm_bwd_dw(const float *dy, const float *x, const float *mean,
                                 const float *rstd, int N, int C, float *dw, float *db)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    int r0 = blockIdx.y * 256, r1 = min(N, r0 + 256);
    float sw = 0.0f, sb = 0.0f;
    for (int r = r0; r < r1; r++) {
        float d = dy[(size_t)r * C + c];
        sw += d * (x[(size_t)r * C + c] - mean[r]) * rstd[r];
        sb += d;
    }
    if (dw)
        atomicAdd(&dw[c], sw);
    if (db)
        atomicAdd(&db[c], sb);
}

extern "C" ddp_status ddp__cuda_layernorm_backward(ddp__cuda_ctx *c, const float *dy,
                                                   const float *x, const float *weight,
                                                   const float *mean, const float *rstd, int N,
                                                   int C, float *dx, float *dweight, float *dbias,
                                                   ddp_error *err)
{
    if (N <= 0)
        return DDP_OK;
    /* the parameter gradients first: dx may overwrite dy */
    if (dweight || dbias) {
        dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
        layernorm_bwd_dw<<<grid, 256, 0, c->stream>>>(dy, x, mean, rstd, N, C, dweight, dbias);
    }
    if (dx)
        layernorm_bwd_dx<<<(unsigned)((N + 7) / 8), 256, 0, c->stream>>>(dy, x, weight, mean, rstd,
                                                                         N, C, dx);
    return ddp__cuda_launched("layernorm backward", err);
}

/* ---- GELU (tanh approximation) and the residual add ------------------------------------------ */

#define GELU_K 0.7978845608028654f /* √(2/π) */

template <typename E> __global__ void gelu_fwd(const E *x, size_t n, E *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = ddp__ld(x + i);
        ddp__st(y + i, 0.5f * v * (1.0f + tanhf(GELU_K * (v + 0.044715f * v * v * v))));
    }
}

template <typename E> __global__ void gelu_bwd(const E *dy, const E *x, size_t n, E *dx)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = ddp__ld(x + i);
        float u = GELU_K * (v + 0.044715f * v * v * v);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float g =
            0.5f * (1.0f + th) + 0.5f * v * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        ddp__st(dx + i, ddp__ld(dy + i) * g);
    }
}

extern "C" ddp_status ddp__cuda_gelu_forward(ddp__cuda_ctx *c, const float *x, size_t n, float *y,
                                             ddp_error *err)
{
    gelu_fwd<float><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(x, n, y);
    return ddp__cuda_launched("gelu forward", err);
}

extern "C" ddp_status ddp__cuda_gelu_backward(ddp__cuda_ctx *c, const float *dy, const float *x,
                                              size_t n, float *dx, ddp_error *err)
{
    gelu_bwd<float><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(dy, x, n, dx);
    return ddp__cuda_launched("gelu backward", err);
}

extern "C" ddp_status ddp__cuda_gelu_forward_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *x,
                                               size_t n, uint16_t *y, ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "gelu forward", err);
    if (st || n == 0)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        gelu_fwd<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((const E *)x, n, (E *)y);
    });
    return ddp__cuda_launched("gelu forward (16-bit)", err);
}

extern "C" ddp_status ddp__cuda_gelu_backward_h(ddp__cuda_ctx *c, ddp_dtype ht, const uint16_t *dy,
                                                const uint16_t *x, size_t n, uint16_t *dx,
                                                ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "gelu backward", err);
    if (st || n == 0)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        gelu_bwd<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>((const E *)dy, (const E *)x, n,
                                                                     (E *)dx);
    });
    return ddp__cuda_launched("gelu backward (16-bit)", err);
}

__global__ void add_kernel(const float *a, const float *b, size_t n, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

extern "C" ddp_status ddp__cuda_add(ddp__cuda_ctx *c, const float *a, const float *b, size_t n,
                                    float *y, ddp_error *err)
{
    add_kernel<<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(a, b, n, y);
    return ddp__cuda_launched("add", err);
}

/* y = a + widen(b): the fp32 residual stream plus a 16-bit branch output (autocast's
 * promotion). */
template <typename H> __global__ void add_h_kernel(const float *a, const H *b, size_t n, float *y)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + ddp__ld(b + i);
}

extern "C" ddp_status ddp__cuda_add_h(ddp__cuda_ctx *c, ddp_dtype ht, const float *a,
                                      const uint16_t *b, size_t n, float *y, ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "add", err);
    if (st || n == 0)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        add_h_kernel<E><<<ddp__cuda_blocks(n, 256), 256, 0, c->stream>>>(a, (const E *)b, n, y);
    });
    return ddp__cuda_launched("add (16-bit branch)", err);
}

/* ---- fused softmax cross-entropy: one block per row ------------------------------------------ */

/* dlogits_h (instead of dlogits): each row's gradient as V 16-bit values (H: bf16 or fp16)
 * written over the first half of that row's own fp32 storage (a 16-bit matrix (N, V) with leading
 * dimension 2V at the logits' address). The row is read and written in chunks of blockDim.x
 * columns with a barrier between each chunk's reads and its writes: 16-bit column j lands inside
 * fp32 column j/2 ≤ j, which this chunk or an earlier one has already read, and no later chunk
 * reads a column below its own start, so no value is overwritten before it is read. */
template <typename H>
__global__ void vocab_xent(const float *logits, const int32_t *targets, int V, float scale,
                           int count, float *row_loss, int32_t *correct, float *dlogits,
                           H *dlogits_h)
{
    __shared__ float sh[32];
    __shared__ int shi[32];
    size_t row = blockIdx.x;
    const float *l = logits + row * (size_t)V;
    int y = targets[row];
    /* the max, and the first index holding it */
    float mx = -INFINITY;
    int arg = V; /* V while no value above −inf was seen: index 0 then (below), as the CPU's */
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (l[j] > mx) {
            mx = l[j];
            arg = j;
        }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, mx, o);
        int a2 = __shfl_xor_sync(0xffffffffu, arg, o);
        if (m2 > mx || (m2 == mx && a2 < arg)) {
            mx = m2;
            arg = a2;
        }
    }
    if (lane == 0) {
        sh[warp] = mx;
        shi[warp] = arg;
    }
    __syncthreads();
    mx = sh[0];
    arg = shi[0];
    for (int w = 1; w < nw; w++)
        if (sh[w] > mx || (sh[w] == mx && shi[w] < arg)) {
            mx = sh[w];
            arg = shi[w];
        }
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += expf(l[j] - mx);
    s = ddp__block_sum(s, sh);
    bool ignored = y == -1; /* DDP_NN_IGNORE_INDEX */
    if (threadIdx.x == 0) {
        row_loss[row] = ignored ? 0.0f : logf(s) + mx - l[y];
        correct[row] = !ignored && (arg < V ? arg : 0) == y;
    }
    if (!dlogits && !dlogits_h)
        return;
    __syncthreads(); /* every read of the row is done before dlogits (maybe the row) is written */
    float f = ignored || count == 0 ? 0.0f : scale / count;
    if (dlogits_h) {
        H *h = dlogits_h + row * 2 * (size_t)V;
        for (int c0 = 0; c0 < V; c0 += blockDim.x) { /* the same trip count in every thread */
            int j = c0 + (int)threadIdx.x;
            float gj = 0.0f;
            if (j < V)
                gj = (expf(l[j] - mx) / s - (j == y ? 1.0f : 0.0f)) * f;
            __syncthreads(); /* this chunk's reads before its writes */
            if (j < V)
                ddp__st(h + j, gj);
        }
        return;
    }
    float *d = dlogits + row * (size_t)V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(l[j] - mx) / s;
        d[j] = (p - (j == y ? 1.0f : 0.0f)) * f;
    }
}

extern "C" ddp_status ddp__cuda_vocab_xent(ddp__cuda_ctx *c, const float *logits,
                                           const int32_t *targets, int N, int V, float scale,
                                           int count, float *row_loss, int32_t *correct,
                                           float *dlogits, ddp_error *err)
{
    if (N <= 0)
        return DDP_OK;
    vocab_xent<ddp__bf16><<<(unsigned)N, 512, 0, c->stream>>>(logits, targets, V, scale, count,
                                                              row_loss, correct, dlogits, NULL);
    return ddp__cuda_launched("softmax cross-entropy", err);
}

extern "C" ddp_status ddp__cuda_vocab_xent_hgrad(ddp__cuda_ctx *c, ddp_dtype ht, float *logits,
                                                 const int32_t *targets, int N, int V, float scale,
                                                 int count, float *row_loss, int32_t *correct,
                                                 bool grad, ddp_error *err)
{
    ddp_status st = ddp__cuda_half_check(ht, "softmax cross-entropy", err);
    if (st || N <= 0)
        return st;
    ddp__half_dispatch(ht, [&](auto e) {
        using E = decltype(e);
        vocab_xent<E><<<(unsigned)N, 512, 0, c->stream>>>(
            logits, targets, V, scale, count, row_loss, correct, NULL, grad ? (E *)logits : NULL);
    });
    return ddp__cuda_launched("softmax cross-entropy (16-bit gradient)", err);
}
