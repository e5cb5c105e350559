/*
 * tests/emu/classifier_emu.cpp — classifier.cu's own kernels (ReLU, exact GELU, dropout forward
 * and backward, the conv bias add and its gradient (a block per channel, block sum in double),
 * max-pool forward and backward (atomics; overlapping windows, ties, NaN)) run on the CPU through
 * cuda_emu.h with their host code's geometry, against src/nn/layers.c and src/nn/conv.c
 * (ddp_nn_*, libddp). Bit for bit where the arithmetic is the same (the GELU here uses the host
 * libm's erf/exp, which a GPU's differ from in the last bits); the bias gradient (one rounding
 * instead of one per sample) and the pool's atomic sums within 1e-6. Built and run by
 * test_kernels_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "ddp/nn.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "classifier_kernels.inc"
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
                    640, mask.data(), y.data());
    });
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
        dropout_bwd(dy.data(), mask.data(), n, 1.0f / (1.0f - p), dx.data());
    });
    check_exact("dropout forward y", y.data(), ry.data(), n * 4);
    check_exact("dropout forward mask", mask.data(), rmask.data(), n);
    check_exact("dropout backward", dx.data(), rdx.data(), n * 4);
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

int main()
{
    t_elementwise(3001);
    t_conv_bias(3, 5, 9, 11);
    t_pool(2, 3, 13, 11, 3, 2); /* overlapping windows */
    t_pool(2, 3, 12, 12, 2, 2);
    printf("%d failed\n", bad);
    return bad != 0;
}
