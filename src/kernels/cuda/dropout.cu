/*
 * kernels/cuda/dropout.cu — elementwise dropout with the CPU's masks (dropout.cuh): forward on
 * an activation and backward on its gradient are the same map, y = x/(1 − p) where kept, else
 * 0, drawn again from (seed, step, offset + i) each time.
 */
#include "dropout.cuh"

template <typename X, typename Y>
__global__ void dropout_kernel(const X *x, Y *y, size_t n, ddp__drop_dev d)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        bool keep = (ddp__rand_u64(d.seed, d.step, d.offset + i) >> 32) >= d.thresh;
        ddp__st(y + i, keep ? ddp__ld(x + i) * d.scale : 0.0f);
    }
}

extern "C" ddp_status ddp__cuda_dropout(ddp__cuda_ctx *c, ddp_dtype xt, const void *x,
                                        ddp_dtype yt, void *y, size_t n, const ddp__cuda_drop *d,
                                        ddp_error *err)
{
    const ddp__drop_dev a = ddp__drop_args(d); /* NULL or p 0: off */
    if (d && !(d->p >= 0.0f && d->p < 1.0f))
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda dropout: p %g is outside [0, 1)",
                              (double)d->p);
    const bool h_in = ddp__cuda_is_half(xt), h_out = ddp__cuda_is_half(yt);
    if (!(xt == DDP_FLOAT32 || h_in) || !(yt == DDP_FLOAT32 || h_out) || (h_in && xt != yt))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda dropout: float32 to float32 or 16 bits, or 16 bits to the "
                              "same, not dtype %d to %d",
                              (int)xt, (int)yt);
    if (n == 0)
        return DDP_OK;
    if (!a.on) { /* p 0: a copy (or nothing, in place) */
        if (x == y)
            return DDP_OK;
        if (xt == yt)
            return ddp__cuda_check(cudaMemcpyAsync(y, x, n * (h_in ? 2 : 4),
                                                   cudaMemcpyDeviceToDevice, c->stream),
                                   "dropout copy", err);
        return ddp__cuda_f32_to_h(c, yt, (const float *)x, n, (uint16_t *)y, err);
    }
    const unsigned blocks = ddp__cuda_blocks(n, 256);
    if (!h_out)
        dropout_kernel<<<blocks, 256, 0, c->stream>>>((const float *)x, (float *)y, n, a);
    else if (!h_in)
        ddp__half_dispatch(yt, [&](auto e) {
            using E = decltype(e);
            dropout_kernel<<<blocks, 256, 0, c->stream>>>((const float *)x, (E *)y, n, a);
        });
    else
        ddp__half_dispatch(yt, [&](auto e) {
            using E = decltype(e);
            dropout_kernel<<<blocks, 256, 0, c->stream>>>((const E *)x, (E *)y, n, a);
        });
    return ddp__cuda_launched("dropout", err);
}
