/*
 * tests/emu/flash_emu.cpp — flash.cu's kernels (fp32, bf16, fp16; head sizes 32, 64, 128) run on
 * the CPU through cuda_emu.h against a double-precision causal attention: out, the logsumexp
 * and dqkv, with every output and shared-memory byte poisoned first. Bounds: fp32 1e-5 (out,
 * lse) and 1e-4 (dqkv); 16-bit inputs rounded first, then 3e-2 / 1e-3 / 5e-2 (the format's own
 * error). T 70 and 1 (quick), also 5, 64, 129 with --full. Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"
#include "common_cuh.inc"
#include "flash_kernels.inc"
#include <random>
#include "emu_check.h"

template <typename E> static void to_e(E *d, const float *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ddp__st(d + i, s[i]);
}
template <typename E> static void from_e(float *d, const E *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = ddp__ld(s + i);
}

template <typename E, int HS> static int run(int B, int nh, int T)
{
    typedef cfg<E, HS> K;
    const int C = nh * HS;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
    std::mt19937 rng(HS * 1000 + T);
    std::uniform_real_distribution<float> U(-1, 1);
    std::vector<float> qkv(nq), dout(no);
    for (auto &x : qkv)
        x = U(rng) * 2; // larger scores
    for (auto &x : dout)
        x = U(rng);
    std::vector<E> qkv_e(nq), dout_e(no), out_e(no), dqkv_e(nq);
    to_e(qkv_e.data(), qkv.data(), nq);
    to_e(dout_e.data(), dout.data(), no);
    from_e(qkv.data(), qkv_e.data(), nq); // the rounded values
    from_e(dout.data(), dout_e.data(), no);
    // poison outputs
    for (auto &x : out_e)
        memset(&x, 0xff, sizeof x);
    for (auto &x : dqkv_e)
        memset(&x, 0xff, sizeof x);
    std::vector<float> lse(nl, NAN), D(nl, NAN);
    const float scale = 1.0f / sqrtf((float)HS);
    // reference in double
    std::vector<double> ro(no), rdq(nq, 0.0), rl(nl);
    auto Q = [&](int b, int t, int h, int d) {
        return (double)qkv[((size_t)b * T + t) * 3 * C + h * HS + d];
    };
    auto Kk = [&](int b, int t, int h, int d) {
        return (double)qkv[((size_t)b * T + t) * 3 * C + C + h * HS + d];
    };
    auto Vv = [&](int b, int t, int h, int d) {
        return (double)qkv[((size_t)b * T + t) * 3 * C + 2 * C + h * HS + d];
    };
    auto DO = [&](int b, int t, int h, int d) {
        return (double)dout[((size_t)b * T + t) * C + h * HS + d];
    };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            std::vector<double> P((size_t)T * T, 0.0), dS((size_t)T * T, 0.0);
            for (int i = 0; i < T; i++) {
                double mx = -1e300;
                for (int j = 0; j <= i; j++) {
                    double s = 0;
                    for (int d = 0; d < HS; d++)
                        s += Q(b, i, h, d) * Kk(b, j, h, d);
                    P[i * T + j] = s * scale;
                    mx = std::max(mx, P[i * T + j]);
                }
                double sum = 0;
                for (int j = 0; j <= i; j++)
                    sum += exp(P[i * T + j] - mx);
                rl[((size_t)b * nh + h) * T + i] = mx + log(sum);
                for (int j = 0; j <= i; j++)
                    P[i * T + j] = exp(P[i * T + j] - mx) / sum;
                for (int d = 0; d < HS; d++) {
                    double y = 0;
                    for (int j = 0; j <= i; j++)
                        y += P[i * T + j] * Vv(b, j, h, d);
                    ro[((size_t)b * T + i) * C + h * HS + d] = y;
                }
                double dsum = 0;
                std::vector<double> dp(i + 1);
                for (int j = 0; j <= i; j++) {
                    double v = 0;
                    for (int d = 0; d < HS; d++)
                        v += DO(b, i, h, d) * Vv(b, j, h, d);
                    dp[j] = v;
                    dsum += P[i * T + j] * v;
                }
                for (int j = 0; j <= i; j++)
                    dS[i * T + j] = P[i * T + j] * (dp[j] - dsum) * scale;
            }
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HS; d++) {
                    double dq = 0, dk = 0, dv = 0;
                    for (int j = 0; j < T; j++) {
                        dq += dS[t * T + j] * Kk(b, j, h, d);
                        dk += dS[j * T + t] * Q(b, j, h, d);
                        dv += P[j * T + t] * DO(b, j, h, d);
                    }
                    size_t o = ((size_t)b * T + t) * 3 * C + h * HS + d;
                    rdq[o] = dq, rdq[o + C] = dk, rdq[o + 2 * C] = dv;
                }
        }
    // the kernels
    dim3 g;
    g.x = B * nh, g.y = (T + K::FBR - 1) / K::FBR;
    emu_launch(g, K::F_END,
               [&] { flash_fwd<E, HS>(qkv_e.data(), out_e.data(), lse.data(), T, nh, scale); });
    dim3 gd;
    gd.x = (unsigned)((nl + 3) / 4);
    emu_launch(gd, 0,
               [&] { flash_bwd_dot<E>(dout_e.data(), out_e.data(), D.data(), B, T, nh, HS); });
    dim3 gk;
    gk.x = B * nh, gk.y = (T + K::BBC - 1) / K::BBC;
    emu_launch(gk, K::B_END, [&] {
        flash_bwd_dkv<E, HS>(dout_e.data(), qkv_e.data(), lse.data(), D.data(), dqkv_e.data(), T,
                             nh, scale);
    });
    dim3 gq;
    gq.x = B * nh, gq.y = (T + K::BBR - 1) / K::BBR;
    emu_launch(gq, K::B_END, [&] {
        flash_bwd_dq<E, HS>(dout_e.data(), qkv_e.data(), lse.data(), D.data(), dqkv_e.data(), T, nh,
                            scale);
    });
    std::vector<float> o(no), dq(nq);
    from_e(o.data(), out_e.data(), no);
    from_e(dq.data(), dqkv_e.data(), nq);
    std::vector<double> rld(rl.begin(), rl.end());
    double eo = rel(o, ro), el = rel(lse, rld), ed = rel(dq, rdq);
    bool h16 = sizeof(E) == 2;
    double to = h16 ? 3e-2 : 1e-5, td = h16 ? 5e-2 : 1e-4, tl = h16 ? 1e-3 : 1e-5;
    bool ok = eo <= to && el <= tl && ed <= td;
    printf("%-5s hs %3d T %3d: out %.2e lse %.2e dqkv %.2e %s\n",
           h16 ? (std::is_same<E, ddp__bf16>::value ? "bf16" : "fp16") : "fp32", HS, T, eo, el, ed,
           ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int bad = 0;
    std::vector<int> Ts = {70, 1};
    if (argc > 1 && !strcmp(argv[1], "--full"))
        Ts = {70, 5, 1, 64, 129};
    for (int T : Ts) {
        bad += run<float, 32>(2, 2, T);
        bad += run<float, 64>(2, 2, T);
        bad += run<float, 128>(2, 2, T);
        bad += run<ddp__bf16, 32>(2, 2, T);
        bad += run<ddp__bf16, 64>(2, 2, T);
        bad += run<ddp__bf16, 128>(2, 2, T);
        bad += run<ddp__fp16, 32>(2, 2, T);
        bad += run<ddp__fp16, 64>(2, 2, T);
        bad += run<ddp__fp16, 128>(2, 2, T);
    }
    printf("%d failed\n", bad);
    return bad != 0;
}
