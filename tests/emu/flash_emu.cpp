/*
 * tests/emu/flash_emu.cpp — flash.cu's kernels (fp32, bf16, fp16; head sizes 32, 64, 128) run on
 * the CPU through cuda_emu.h against a double-precision causal attention: out, the logsumexp
 * and dqkv, with every output and shared-memory byte poisoned first. Bounds: fp32 1e-5 (out,
 * lse) and 1e-4 (dqkv); 16-bit inputs rounded first, then 3e-2 / 1e-3 / 5e-2 (the format's own
 * error). T 70 and 1 (quick), also 5, 64, 129 with --full. Built and run by test_kernels_emu.sh.
 *
 * With attention dropout (p 0.1 and 0.5; T 70 and 37, partial tiles; several heads and batches):
 * the double reference applies the masks of util/rng.h's hashes (row (b·nh + h)·T + i keys
 * ddp__rand_u64(seed, step, offset + row), column j kept iff ddp__rand_u32(key, j) ≥ p·2³², as
 * src/nn/attention.c), and, where the test links libddp (all but the TSan build, where this test
 * runs unsanitized), the kernels are also checked against the product's CPU attention
 * (ddp_nn_attention_forward/backward with the same seed, step, offset) on the same (rounded)
 * inputs: out, lse, and dq, dk, dv each (max |diff| / max |ref| of its own), at the bounds above.
 */
#include "cuda_emu.h"
extern "C" {
#ifndef EMU_NO_LIBDDP
#include "ddp/nn.h"
#endif
#include "kernels/cuda_kernels.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "dropout_cuh.inc"
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

/* max |g − w| / max |w| over the columns [c0, c0 + n) of rows of `row` elements */
template <typename W>
static double rel_cols(const std::vector<float> &g, const std::vector<W> &w, size_t row, size_t c0,
                       size_t n)
{
    std::vector<float> gs;
    std::vector<W> ws;
    for (size_t r = 0; r < g.size() / row; r++)
        for (size_t c = c0; c < c0 + n; c++)
            gs.push_back(g[r * row + c]), ws.push_back(w[r * row + c]);
    return rel(gs, ws);
}

/* B batches of nh heads of size HS, T rows, attention dropout p (0: off). */
template <typename E, int HS> static int run(int B, int nh, int T, float p = 0.0f)
{
    typedef cfg<E, HS> K;
    const int C = nh * HS;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
    const uint64_t seed = 4321, step = 9, offset = 5 * (uint64_t)nh * T;
    const ddp__cuda_drop drop = {p, seed, step, offset};
    const ddp__drop_dev dr = ddp__drop_args(&drop);
    std::mt19937 rng(HS * 1000 + T + nh * 7 + (int)(p * 100));
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
    // reference in double; with dropout the masks from util/rng.h as src/nn/attention.c draws them
    const uint32_t thresh = (uint32_t)((double)p * 4294967296.0);
    const double keep = p > 0 ? (double)(1.0f / (1.0f - p)) : 1.0;
    size_t kept = 0, seen = 0;
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
            std::vector<double> P((size_t)T * T, 0.0), dS((size_t)T * T, 0.0),
                M((size_t)T * T, 1.0);
            for (int i = 0; i < T; i++) {
                if (p > 0) {
                    const uint64_t key =
                        ddp__rand_u64(seed, step, offset + ((size_t)b * nh + h) * T + i);
                    for (int j = 0; j <= i; j++) {
                        M[i * T + j] = ddp__rand_u32(key, (uint32_t)j) >= thresh ? keep : 0.0;
                        kept += M[i * T + j] != 0, seen++;
                    }
                }
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
                        y += M[i * T + j] * P[i * T + j] * Vv(b, j, h, d);
                    ro[((size_t)b * T + i) * C + h * HS + d] = y;
                }
                double dsum = 0;
                std::vector<double> dp(i + 1);
                for (int j = 0; j <= i; j++) {
                    double v = 0;
                    for (int d = 0; d < HS; d++)
                        v += DO(b, i, h, d) * Vv(b, j, h, d);
                    dp[j] = M[i * T + j] * v;
                    dsum += P[i * T + j] * dp[j];
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
                        dv += M[j * T + t] * P[j * T + t] * DO(b, j, h, d);
                    }
                    size_t o = ((size_t)b * T + t) * 3 * C + h * HS + d;
                    rdq[o] = dq, rdq[o + C] = dk, rdq[o + 2 * C] = dv;
                }
        }
    // the kernels
    dim3 g;
    g.x = B * nh, g.y = (T + K::FBR - 1) / K::FBR;
    emu_launch(g, K::F_END,
               [&] { flash_fwd<E, HS>(qkv_e.data(), out_e.data(), lse.data(), T, nh, scale, dr); });
    dim3 gd;
    gd.x = (unsigned)((nl + 3) / 4);
    emu_launch(gd, 0,
               [&] { flash_bwd_dot<E>(dout_e.data(), out_e.data(), D.data(), B, T, nh, HS); });
    dim3 gk;
    gk.x = B * nh, gk.y = (T + K::BBC - 1) / K::BBC;
    emu_launch(gk, K::B_END, [&] {
        flash_bwd_dkv<E, HS>(dout_e.data(), qkv_e.data(), lse.data(), D.data(), dqkv_e.data(), T,
                             nh, scale, dr);
    });
    dim3 gq;
    gq.x = B * nh, gq.y = (T + K::BBR - 1) / K::BBR;
    emu_launch(gq, K::B_END, [&] {
        flash_bwd_dq<E, HS>(dout_e.data(), qkv_e.data(), lse.data(), D.data(), dqkv_e.data(), T, nh,
                            scale, dr);
    });
    std::vector<float> o(no), dq(nq);
    from_e(o.data(), out_e.data(), no);
    from_e(dq.data(), dqkv_e.data(), nq);
    std::vector<double> rld(rl.begin(), rl.end());
    double eo = rel(o, ro), el = rel(lse, rld), ed = rel(dq, rdq);
    bool h16 = sizeof(E) == 2;
    double to = h16 ? 3e-2 : 1e-5, td = h16 ? 5e-2 : 1e-4, tl = h16 ? 1e-3 : 1e-5;
    bool ok = eo <= to && el <= tl && ed <= td;
    char what[64];
    snprintf(what, sizeof what, "%-5s hs %3d B %d nh %d T %3d p %.1f", nm<E>(), HS, B, nh, T,
             (double)p);
    printf("%s: out %.2e lse %.2e dqkv %.2e %s\n", what, eo, el, ed, ok ? "ok" : "FAIL");
    if (p > 0) {
        /* the masks really dropped about p of the probabilities */
        const double frac = seen ? (double)kept / (double)seen : 1.0;
        const bool fok = fabs(frac - (1.0 - p)) <= 0.05;
        printf("%s: kept %.3f of %zu probabilities (expected %.2f ± 0.05) %s\n", what, frac, seen,
               1.0 - p, fok ? "ok" : "FAIL");
        ok = ok && fok;
    }
#ifndef EMU_NO_LIBDDP
    if (p > 0) {
        /* the product's CPU attention with the same masks, on the same (rounded) inputs */
        ddp_nn_attention a = {};
        a.C = C, a.n_head = nh, a.max_T = T, a.dropout = p;
        ddp_error err = {};
        if (ddp_nn_attention_setup(&a, &err)) {
            fprintf(stderr, "setup: %s\n", err.msg);
            return 1;
        }
        std::vector<float> scr(a.scratch_floats), co(no), cl(nl), cd(nq);
        ddp_nn_attention_forward(&a, qkv.data(), B, T, seed, step, offset, true, scr.data(),
                                 co.data(), cl.data());
        ddp_nn_attention_backward(&a, dout.data(), qkv.data(), cl.data(), B, T, seed, step, offset,
                                  true, scr.data(), cd.data());
        const size_t row = 3 * (size_t)C;
        const double co_e = rel(o, co), cl_e = rel(lse, cl), cq = rel_cols(dq, cd, row, 0, C),
                     ck = rel_cols(dq, cd, row, C, C), cv = rel_cols(dq, cd, row, 2 * C, C);
        const bool cok = co_e <= to && cl_e <= tl && cq <= td && ck <= td && cv <= td;
        printf("%s vs CPU attention: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e %s\n", what, co_e,
               cl_e, cq, ck, cv, cok ? "ok" : "FAIL");
        ok = ok && cok;
    }
#endif
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int bad = 0;
    std::vector<int> Ts = {70, 1};
    const bool full = argc > 1 && !strcmp(argv[1], "--full");
    if (full)
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
    /* dropout: every head size and format once, p 0.1 and 0.5, partial tiles (T 70 and 37 are
     * no multiple of any tile), 1 to 3 heads and batches */
    bad += run<float, 32>(1, 3, 70, 0.1f);
    bad += run<float, 64>(3, 1, 37, 0.5f);
    bad += run<float, 128>(1, 2, 37, 0.5f);
    bad += run<ddp__bf16, 32>(1, 2, 37, 0.5f);
    bad += run<ddp__bf16, 64>(2, 1, 70, 0.1f);
    bad += run<ddp__fp16, 64>(1, 3, 37, 0.5f);
    bad += run<ddp__fp16, 128>(2, 1, 37, 0.1f);
    if (full)
        for (int T : {1, 5, 129}) {
            bad += run<float, 64>(2, 2, T, 0.2f);
            bad += run<ddp__bf16, 128>(2, 2, T, 0.2f);
        }
    printf("%d failed\n", bad);
    return bad != 0;
}
