/*
 * tests/emu/optim_emu.cpp — optim.cu's fused AdamW (grad_scale, the optional bf16 copy) and
 * scale, devmath.cu's SGD, unscale-and-check and sum of squares (fp32, fp64, bf16, fp16; block
 * sums, one atomic add per block, the grid-stride loop) run on the CPU through cuda_emu.h with their host code's launch
 * geometry, against ddp_nn_adamw_step / ddp_nn_sgd_step / ddp_nn_clip_grad_norm (libddp) and
 * plain loops. AdamW and SGD must match bit for bit here (the emulation, like the CPU, fuses no
 * multiply-adds; nvcc contracts adamw_kernel's a·b + c into FMAs by default, so a GPU may differ
 * in the last bits: test_cuda_kernels.c allows 1e-6 there). Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "ddp/nn.h"
#include "kernels/cuda_kernels.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "optim_kernels.inc"
#include "devmath_kernels.inc"
#include <random>
#define EMU_SEED 7
#include "emu_check.h"


static void t_adamw(size_t n, float gs, bool copy)
{
    auto p = randv(n), m = randv(n, 0, 0.1f), v = randv(n, 0, 0.01f);
    auto rp = p, rm = m, rv = v;
    std::vector<uint16_t> pb(n, 0xffff);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (uint64_t step = 1; step <= 3; step++) {
        auto g = randv(n, -3, 3);
        std::vector<float> gsc(n);
        for (size_t i = 0; i < n; i++)
            gsc[i] = g[i] * gs;
        ddp_nn_adamw_step(rp.data(), gsc.data(), rm.data(), rv.data(), n, lr, b1, b2, eps, wd, step);
        /* the constants as ddp__cuda_adamw forms them */
        double t = (double)step;
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        float decay = (float)(1.0 - (double)lr * wd), step_size = (float)((double)lr / bc1);
        float bc2_sqrt = (float)sqrt(bc2), a1 = (float)(1.0 - b1), a2 = (float)(1.0 - b2);
        emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
            adamw_kernel(p.data(), g.data(), m.data(), v.data(), n, decay, b1, a1, b2, a2, bc2_sqrt,
                         eps, step_size, gs, copy ? pb.data() : nullptr);
        });
    }
    char s[96];
    snprintf(s, sizeof s, "adamw p (3 steps, n %zu, grad_scale %g)", n, gs);
    check_exact(s, p.data(), rp.data(), n * 4);
    check_exact("adamw m", m.data(), rm.data(), n * 4);
    check_exact("adamw v", v.data(), rv.data(), n * 4);
    if (copy) {
        std::vector<uint16_t> want(n);
        for (size_t i = 0; i < n; i++)
            want[i] = ddp__f32_to_bf16(p[i]);
        check_exact("adamw bf16 copy", pb.data(), want.data(), n * 2);
    }
}

static void t_sgd(size_t n, float momentum, float wd, float gs)
{
    auto p = randv(n), buf = randv(n);
    auto rp = p, rbuf = buf;
    for (uint64_t step = 1; step <= 3; step++) {
        auto g = randv(n);
        std::vector<float> gsc(n);
        for (size_t i = 0; i < n; i++)
            gsc[i] = gs != 1.0f ? g[i] * gs : g[i];
        ddp_nn_sgd_step(rp.data(), gsc.data(), rbuf.data(), n, 0.05f, momentum, wd, step);
        emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
            sgd_kernel(p.data(), g.data(), buf.data(), n, 0.05f, momentum, wd, step <= 1, gs);
        });
    }
    char s[96];
    snprintf(s, sizeof s, "sgd (3 steps, momentum %g, wd %g, gs %g)", momentum, wd, gs);
    check_exact(s, p.data(), rp.data(), n * 4);
    if (momentum != 0.0f)
        check_exact("sgd momentum buffer", buf.data(), rbuf.data(), n * 4);
}

static void t_unscale(size_t n, bool poison)
{
    auto g = randv(n, -100, 100);
    if (poison)
        g[n - 1] = INFINITY, g[n / 2] = NAN;
    std::vector<float> want(n);
    for (size_t i = 0; i < n; i++)
        want[i] = g[i] * 0.125f;
    int flag = 0;
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { unscale_kernel(g.data(), n, 0.125f, &flag); });
    char s[96];
    snprintf(s, sizeof s, "unscale n %zu (%s)", n, poison ? "inf and NaN" : "finite");
    bool ok = flag == (poison ? 1 : 0) && !memcmp(g.data(), want.data(), n * 4);
    printf("%-48s flag %d %s\n", s, flag, ok ? "ok" : "FAIL");
    bad += !ok;
    auto x = randv(n), wx = x;
    for (auto &e : wx)
        e *= 0.37f;
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] { scale_kernel(x.data(), n, 0.37f); });
    check_exact("scale", x.data(), wx.data(), n * 4);
}

template <typename T> static void t_sumsq(size_t n, const char *name, unsigned grid = 0)
{
    auto f = randv(n, -2, 2);
    std::vector<T> x(n);
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        if constexpr (std::is_same<T, half_bits<true>>::value)
            x[i].v = ddp__f32_to_bf16(f[i]), f[i] = ddp__bf16_to_f32(x[i].v);
        else if constexpr (std::is_same<T, half_bits<false>>::value)
            x[i].v = ddp__f32_to_f16(f[i]), f[i] = ddp__f16_to_f32(x[i].v);
        else
            x[i] = (T)f[i];
        want += (double)f[i] * f[i];
    }
    if constexpr (std::is_same<T, float>::value) { /* the CPU's norm, the same sum */
        float *gp = f.data();
        double norm = ddp_nn_clip_grad_norm(&gp, &n, 1, 1e30);
        want = norm * norm;
    }
    std::vector<double> partial(grid ? grid : reduce_blocks(n), NAN);
    double acc = 0;
    if (!grid)
        grid = reduce_blocks(n);
    emu_launch(grid, 256, 0, [&] { sumsq_kernel<T>(x.data(), n, partial.data()); });
    emu_launch(1, 1024, 0, [&] { sumsq_finish(partial.data(), grid, &acc); });
    char s[96];
    snprintf(s, sizeof s, "sum of squares %s n %zu (%u blocks)", name, n, grid);
    check(s, fabs(acc - want) / want, 1e-12);
}

int main()
{
    t_adamw(3001, 1.0f, false);
    t_adamw(3001, 0.25f, true);
    t_sgd(3001, 0.9f, 0.01f, 1.0f);
    t_sgd(3001, 0.0f, 0.0f, 0.5f);
    t_sgd(777, 0.9f, 0.0f, 2.0f);
    t_unscale(3001, false);
    t_unscale(3001, true);
    t_sumsq<float>(5000, "fp32");
    t_sumsq<double>(300, "fp64");
    t_sumsq<half_bits<true>>(5000, "bf16");
    t_sumsq<half_bits<false>>(5000, "fp16");
    t_sumsq<float>(5077, "fp32", 3); /* fewer blocks than elements / 256 (as reduce_blocks' cap
                                        of 1024 makes for n > 2^18): the grid-stride loop */
    if (reduce_blocks((size_t)1 << 20) != 1024)
        printf("reduce_blocks: no 1024-block cap FAIL\n"), bad++;
    printf("%d failed\n", bad);
    return bad != 0;
}
