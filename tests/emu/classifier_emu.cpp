/*
 * tests/emu/classifier_emu.cpp — classifier.cu's own kernels (ReLU, exact GELU, dropout forward
 * and backward, the conv bias add and its gradient (a block per channel, block sum in double),
 * max-pool forward and backward (atomics; overlapping windows, ties, NaN)) run on the CPU through
 * cuda_emu.h with their host code's geometry, against src/nn/layers.c and src/nn/conv.c
 * (ddp_nn_*, libddp). Bit for bit where the arithmetic is the same (the GELU here uses the host
 * libm's erf/exp, which a GPU's differ from in the last bits); the bias gradient (one rounding
 * instead of one per sample) and the pool's atomic sums within 1e-6. Precision bf16/fp16's
 * casts into and out of 16 bits, composed as the host code composes them around a convolution
 * (the conv itself is cuDNN's): the input rounded (devmath.cu's convert, the kernel
 * ddp__cuda_f32_to_h runs) bit for bit against util/half.h and, for bf16, against the CPU
 * reference's own operand rounding (ddp__bf16_round, libddp; normal numbers — it flushes inputs
 * below 2^-126 to zero, util/half.h keeps them: shown, not failed); the 16-bit output widened
 * with the fp32 bias (bias_add_h) bit for bit against util/half.h's widening and one fp32 add;
 * the 16-bit filter gradient added into the fp32 one (layers.cu's add_h_kernel) and dx widened,
 * bit for bit. Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "ddp/nn.h"
#include "kernels/kernels.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "classifier_kernels.inc"
#include "devmath_kernels.inc"
#include "layers_kernels.inc"
#include <random>
#define EMU_SEED 11
#include "emu_check.h"


static void t_elementwise(size_t n)
{
    auto x = randv(n, -4, 4), dy = randv(n);
    x[0] = 0.0f, x[1] = -0.0f;
    std::vector<float> ry(n), rdx(n);
    auto y = poisoned(n), dx = poisoned(n);
    ddp_nn_relu_forward(x.data(), n, ry.data());
    ddp_nn_relu_backward(dy.data(), x.data(), n, rdx.data());
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] { relu_fwd(x.data(), n, y.data()); });
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { relu_bwd(dy.data(), x.data(), n, dx.data()); });
    check_exact("relu forward", y.data(), ry.data(), n * 4);
    check_exact("relu backward", dx.data(), rdx.data(), n * 4);
    ddp_nn_gelu_forward(x.data(), n, ry.data());
    ddp_nn_gelu_backward(dy.data(), x.data(), n, rdx.data());
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] { gelu_erf_fwd(x.data(), n, y.data()); });
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { gelu_erf_bwd(dy.data(), x.data(), n, dx.data()); });
    check("gelu (erf) forward", y.data(), ry.data(), n, 1e-7);
    check("gelu (erf) backward", dx.data(), rdx.data(), n, 1e-7);
    /* dropout, as the host code passes it */
    const float p = 0.3f;
    std::vector<uint8_t> rmask(n), mask(n, 0xee);
    ddp_nn_dropout_forward(x.data(), n, p, 5, 2, 640, true, rmask.data(), ry.data());
    ddp_nn_dropout_backward(dy.data(), rmask.data(), n, p, true, rdx.data());
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
        dropout_fwd(x.data(), n, (uint64_t)((double)p * 4294967296.0), 1.0f / (1.0f - p), 5, 2,
                    640, 16, 0, mask.data(), y.data());
    });
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
        dropout_bwd(dy.data(), mask.data(), n, 1.0f / (1.0f - p), dx.data());
    });
    check_exact("dropout forward y", y.data(), ry.data(), n * 4);
    check_exact("dropout forward mask", mask.data(), rmask.data(), n);
    check_exact("dropout backward", dx.data(), rdx.data(), n * 4);
    /* samples of 16 values keyed 3 samples apart (sample_stride 3): the host's rows */
    const size_t per = 16, rows = n / per, m = rows * per;
    for (size_t s = 0; s < rows; s++)
        ddp_nn_dropout_forward(x.data() + s * per, per, p, 5, 2, (40 + s * 3) * per, true,
                               rmask.data() + s * per, ry.data() + s * per);
    emu_launch(ddp__cuda_blocks(m, 256), 256, 0, [&] {
        dropout_fwd(x.data(), m, (uint64_t)((double)p * 4294967296.0), 1.0f / (1.0f - p), 5, 2,
                    40 * per, per, 2 * per, mask.data(), y.data());
    });
    check_exact("dropout forward, strided samples: y", y.data(), ry.data(), m * 4);
    check_exact("dropout forward, strided samples: mask", mask.data(), rmask.data(), m);
}

static void t_conv_bias(int B, int C, int H, int W)
{
    ddp_nn_conv2d c = {};
    c.in_ch = 2, c.h = H, c.w = W, c.out_ch = C, c.kh = 3, c.kw = 3, c.stride = 1, c.pad = 1;
    ddp_error err = {};
    if (ddp_nn_conv2d_setup(&c, &err)) {
        printf("conv setup: %s\n", err.msg);
        bad++;
        return;
    }
    const int P = c.out_h * c.out_w;
    auto x = randv((size_t)B * 2 * H * W), Wt = randv((size_t)C * 2 * 9), b = randv(C);
    std::vector<float> scratch(c.scratch_floats), y((size_t)B * C * P), ry(y.size());
    ddp_nn_conv2d_forward(&c, x.data(), Wt.data(), nullptr, B, scratch.data(), y.data());
    ddp_nn_conv2d_forward(&c, x.data(), Wt.data(), b.data(), B, scratch.data(), ry.data());
    size_t total = y.size();
    emu_launch(ddp__cuda_blocks(total, 256), 256, 0,
               [&] { bias_add(y.data(), b.data(), total, C, P); });
    check("conv bias add", y.data(), ry.data(), total, 1e-6);
    auto dy = randv(total), rdb = randv(C);
    auto db = rdb;
    ddp_nn_conv2d_backward(&c, dy.data(), x.data(), Wt.data(), B, scratch.data(), nullptr, nullptr,
                           rdb.data());
    emu_launch((unsigned)C, 256, 0, [&] { channel_sum(dy.data(), B, C, P, db.data()); });
    check("conv bias gradient (channel sum)", db.data(), rdb.data(), C, 1e-6);
}

static void t_pool(int B, int ch, int H, int W, int k, int stride)
{
    ddp_nn_pool2d p = {};
    p.ch = ch, p.h = H, p.w = W, p.kernel = k, p.stride = stride;
    ddp_error err = {};
    if (ddp_nn_maxpool2d_setup(&p, &err)) {
        printf("pool setup: %s\n", err.msg);
        bad++;
        return;
    }
    const size_t nin = (size_t)B * ch * H * W, nout = (size_t)B * ch * p.out_h * p.out_w;
    auto x = randv(nin);
    for (size_t i = 0; i < nin; i += 7) /* ties */
        x[i] = x[i / 2] = 0.5f;
    x[3] = NAN, x[H * W + 10] = NAN, x[H * W + 11] = NAN;
    std::vector<float> ry(nout), rdx(nin);
    std::vector<int32_t> ra(nout), a(nout, -7);
    auto y = poisoned(nout), dx = poisoned(nin);
    ddp_nn_maxpool2d_forward(&p, x.data(), B, ry.data(), ra.data());
    emu_launch(ddp__cuda_blocks(nout, 256), 256, 0, [&] {
        pool_fwd(x.data(), (size_t)B * ch, H, W, p.out_h, p.out_w, k, stride, y.data(), a.data());
    });
    char s[80];
    snprintf(s, sizeof s, "max-pool forward k %d stride %d (ties, NaN)", k, stride);
    check_exact(s, y.data(), ry.data(), nout * 4);
    check_exact("max-pool argmax", a.data(), ra.data(), nout * 4);
    auto dy = randv(nout);
    ddp_nn_maxpool2d_backward(&p, dy.data(), ra.data(), B, rdx.data());
    std::fill(dx.begin(), dx.end(), 0.0f); /* the host code zeroes dx first */
    emu_launch(ddp__cuda_blocks(nout, 256), 256, 0, [&] {
        pool_bwd(dy.data(), a.data(), (size_t)B * ch, H * W, p.out_h * p.out_w, dx.data());
    });
    snprintf(s, sizeof s, "max-pool backward (atomics) k %d stride %d", k, stride);
    check(s, dx.data(), rdx.data(), nin, 1e-6);
}

/* util/half.h's conversions for format H, the reference of the casts below */
template <typename H> static uint16_t ref_narrow(float f)
{
    return std::is_same<H, ddp__fp16>::value ? ddp__f32_to_f16(f) : ddp__f32_to_bf16(f);
}
template <typename H> static float ref_widen(uint16_t h)
{
    return std::is_same<H, ddp__fp16>::value ? ddp__f16_to_f32(h) : ddp__bf16_to_f32(h);
}

/* A conv layer's 16-bit stage (B, C, P) as conv_forward / conv_backward queue it: x rounded;
 * cuDNN's output (here: random 16-bit values) widened with the bias; dy rounded; the 16-bit dW
 * added into the fp32 gradient; the 16-bit dx widened. */
template <typename H> static void t_conv_casts(int B, int C, int P)
{
    const size_t n = (size_t)B * C * P;
    char s[96];
    /* x rounded (ddp__cuda_f32_to_h: devmath's convert_kernel, the launch geometry of
     * ddp__devmath_convert) */
    auto x = randv(n, -3, 3);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 65519.0f, x[3] = -70000.0f; /* fp16: 65504, -inf */
    std::vector<uint16_t> want(n);
    for (size_t i = 0; i < n; i++)
        want[i] = ref_narrow<H>(x[i]);
    auto xh = poisoned<H>(n);
    emu_launch(reduce_blocks(n), 256, 0, [&] { convert_kernel<H, float>(x.data(), n, xh.data()); });
    snprintf(s, sizeof s, "%s: x rounded, against util/half.h", nm<H>());
    check_exact(s, xh.data(), want.data(), n * 2);
    if (std::is_same<H, ddp__bf16>::value) { /* the CPU reference's operand rounding */
        std::vector<uint16_t> cpu(n);
        ddp__bf16_round(cpu.data(), x.data(), (int)n);
        snprintf(s, sizeof s, "bf16: x rounded, against the CPU's ddp__bf16_round");
        check_exact(s, xh.data(), cpu.data(), n * 2);
        const float sub[2] = {1e-40f, -3e-39f}; /* below 2^-126 */
        uint16_t g[2], c[2];
        for (int i = 0; i < 2; i++)
            g[i] = ref_narrow<H>(sub[i]);
        ddp__bf16_round(c, sub, 2);
        printf("  (bf16 of a subnormal: GPU cast 0x%04x 0x%04x, CPU's flush 0x%04x 0x%04x)\n", g[0],
               g[1], c[0], c[1]);
    }
    /* cuDNN's 16-bit output widened with the bias (bias_add_h) */
    std::vector<H> yh(n);
    auto yv = randv(n, -8, 8), bias = randv(C);
    for (size_t i = 0; i < n; i++)
        yh[i].bits = ref_narrow<H>(yv[i]);
    std::vector<float> ry(n);
    for (size_t i = 0; i < n; i++)
        ry[i] = ref_widen<H>(yh[i].bits) + bias[(i / (size_t)P) % (size_t)C];
    auto y = poisoned(n);
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { bias_add_h<H>(yh.data(), bias.data(), n, C, P, y.data()); });
    snprintf(s, sizeof s, "%s: conv output widened + bias", nm<H>());
    check_exact(s, y.data(), ry.data(), n * 4);
    /* dW: the 16-bit filter gradient added into the fp32 one (ddp__cuda_add_h, y = a) */
    const size_t wn = (size_t)C * 3 * 9;
    auto gw = randv(wn), dwv = randv(wn, -100, 100);
    std::vector<H> dwh(wn);
    for (size_t i = 0; i < wn; i++)
        dwh[i].bits = ref_narrow<H>(dwv[i]);
    std::vector<float> rg(wn);
    for (size_t i = 0; i < wn; i++)
        rg[i] = gw[i] + ref_widen<H>(dwh[i].bits);
    emu_launch(ddp__cuda_blocks(wn, 256), 256, 0,
               [&] { add_h_kernel<H>(gw.data(), dwh.data(), wn, gw.data()); });
    snprintf(s, sizeof s, "%s: 16-bit dW added into the fp32 gradient", nm<H>());
    check_exact(s, gw.data(), rg.data(), wn * 4);
    /* dx widened (ddp__cuda_h_to_f32) */
    std::vector<float> rdx(n);
    for (size_t i = 0; i < n; i++)
        rdx[i] = ref_widen<H>(xh[i].bits);
    auto dx = poisoned(n);
    emu_launch(reduce_blocks(n), 256, 0,
               [&] { convert_kernel<float, H>(xh.data(), n, dx.data()); });
    snprintf(s, sizeof s, "%s: dx widened", nm<H>());
    check_exact(s, dx.data(), rdx.data(), n * 4);
}

int main()
{
    t_elementwise(3001);
    t_conv_bias(3, 5, 9, 11);
    t_pool(2, 3, 13, 11, 3, 2); /* overlapping windows */
    t_pool(2, 3, 12, 12, 2, 2);
    t_conv_casts<ddp__bf16>(3, 5, 7 * 9);
    t_conv_casts<ddp__fp16>(3, 5, 7 * 9);
    printf("%d failed\n", bad);
    return bad != 0;
}
