/*
 * tests/emu/attention_emu.cpp — attention.cu's own kernels (permute_qkv, permute_heads,
 * causal_softmax, causal_softmax_h, causal_dropout, causal_softmax_bwd_h, its fp32 instance in
 * place as the product calls it) run on the CPU through cuda_emu.h, composed as
 * ddp__cuda_attention_forward/backward(_h) compose them, with a plain batched matmul (double
 * accumulation) in cuBLAS's place, and compared with the product's CPU attention
 * (ddp_nn_attention_forward/backward, libddp), without and with dropout (p 0.2: the same masks
 * from the same (seed, step, offset)). Every scratch buffer and output is poisoned (0xff) first.
 * Launch geometry as attention.cu's (ddp__cuda_blocks(…), 256 threads), and again with 2 blocks
 * (the grid-stride loops). B 2, nh 2, T 70, C 48 (hs 24: rows and lengths not multiples of 32).
 * Bounds (max |diff| / max |ref|): fp32 2e-5; 16-bit q, k, v (and dout) rounded first, then
 * bf16 3e-2, fp16 5e-3. Built and run by test_attention_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "ddp/nn.h"
#include "kernels/cuda_kernels.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "dropout_cuh.inc"
#include "attention_kernels.inc"
#include <cstring>
#include <random>
#include "emu_check.h"
#include <string>

static unsigned g_small = 0; /* 0: the product's grid; else this many blocks */
static unsigned grid_of(size_t n, unsigned per)
{
    return g_small ? g_small : ddp__cuda_blocks(n, per);
}
/* Row-major strided-batched C = alpha · op(A) · op(B) (as attention.cu's bgemm with beta 0),
 * double accumulation, rounded to E. */
template <typename E>
static void bgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                  long long sa, const float *B, int ldb, long long sb, E *C, int ldc, long long sc,
                  int batch)
{
    for (int z = 0; z < batch; z++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    double a =
                        ta ? A[z * sa + (size_t)k * lda + m] : A[z * sa + (size_t)m * lda + k];
                    double b =
                        tb ? B[z * sb + (size_t)n * ldb + k] : B[z * sb + (size_t)k * ldb + n];
                    s += a * b;
                }
                ddp__st(C + z * sc + (size_t)m * ldc + n, (float)(alpha * s));
            }
}

/* E: float (fp32 path, att kept in fp32) or a 16-bit format (the _h path). */
template <typename E> static int run(int B, int nh, int T, int C, float p)
{
    const bool h16 = !std::is_same<E, float>::value;
    const int hs = C / nh, BH = B * nh;
    const size_t n = (size_t)B * T * C, rows = (size_t)BH * T, tt = rows * T;
    const long long sT = (long long)T * hs, sTT = (long long)T * T;
    const float scale = 1.0f / sqrtf((float)hs);
    const uint64_t seed = 1234, step = 7, offset = 3 * (uint64_t)nh * T;
    ddp__cuda_drop drop = {p, seed, step, offset};
    const ddp__drop_dev dr = ddp__drop_args(&drop);
    std::mt19937 rng(T * 31 + C + (int)(p * 10) + (h16 ? 100 : 0));
    std::uniform_real_distribution<float> U(-1, 1);
    std::vector<float> qkvf(3 * n), doutf(n);
    for (auto &x : qkvf)
        x = 2 * U(rng);
    for (auto &x : doutf)
        x = U(rng);
    std::vector<E> qkv = narrow<E>(qkvf), dout = narrow<E>(doutf);
    qkvf = widen(qkv), doutf = widen(dout); /* the reference sees the rounded inputs */

    /* the CPU reference (libddp) */
    ddp_nn_attention a = {};
    a.C = C, a.n_head = nh, a.max_T = T, a.dropout = p;
    ddp_error err = {};
    if (ddp_nn_attention_setup(&a, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return 1;
    }
    std::vector<float> scratch(a.scratch_floats), rout(n), lse(rows), rdqkv(3 * n);
    ddp_nn_attention_forward(&a, qkvf.data(), B, T, seed, step, offset, true, scratch.data(),
                             rout.data(), lse.data());
    ddp_nn_attention_backward(&a, doutf.data(), qkvf.data(), lse.data(), B, T, seed, step, offset,
                              true, scratch.data(), rdqkv.data());

    /* forward, as ddp__cuda_attention_forward(_h) */
    auto q = poisoned<E>(n), k = poisoned<E>(n), v = poisoned<E>(n), y = poisoned<E>(n),
         out = poisoned<E>(n), att = poisoned<E>(tt), pd = poisoned<E>(tt);
    auto S = poisoned<float>(tt);
    emu_launch(grid_of(n, 256), 256, 0,
               [&] { permute_qkv<E>(qkv.data(), q.data(), k.data(), v.data(), B, T, C, nh, 1); });
    auto qf = widen(q), kf = widen(k), vf = widen(v);
    if (!h16) {
        bgemm(false, true, T, T, hs, scale, qf.data(), hs, sT, kf.data(), hs, sT,
              (float *)att.data(), T, sTT, BH);
        emu_launch(grid_of(rows, 8), 256, 0, [&] { causal_softmax((float *)att.data(), rows, T); });
    } else {
        bgemm(false, true, T, T, hs, scale, qf.data(), hs, sT, kf.data(), hs, sT, S.data(), T, sTT,
              BH);
        emu_launch(grid_of(rows, 8), 256, 0,
                   [&] { causal_softmax_h<E>(S.data(), att.data(), rows, T, T, 0); });
    }
    if (dr.on)
        emu_launch(grid_of(rows, 8), 256, 0,
                   [&] { causal_dropout<E>(att.data(), pd.data(), rows, T, dr); });
    auto Pf = widen(dr.on ? pd : att);
    bgemm(false, false, T, hs, T, 1.0f, Pf.data(), T, sTT, vf.data(), hs, sT, y.data(), hs, sT, BH);
    emu_launch(grid_of(n, 256), 256, 0,
               [&] { permute_heads<E>(y.data(), out.data(), B, T, C, nh, 1); });

    /* backward, as ddp__cuda_attention_backward(_h) */
    auto q2 = poisoned<E>(n), k2 = poisoned<E>(n), v2 = poisoned<E>(n), dy = poisoned<E>(n),
         dq = poisoned<E>(n), dk = poisoned<E>(n), dv = poisoned<E>(n), dqkv = poisoned<E>(3 * n),
         ds = poisoned<E>(tt);
    auto dp = poisoned<float>(tt);
    emu_launch(grid_of(n, 256), 256, 0, [&] {
        permute_qkv<E>(qkv.data(), q2.data(), k2.data(), v2.data(), B, T, C, nh, 1);
    });
    emu_launch(grid_of(n, 256), 256, 0,
               [&] { permute_heads<E>(dy.data(), dout.data(), B, T, C, nh, -1); });
    /* fp32: the dropped probabilities in dp's place until dV is made; 16-bit: in ds's */
    E *pdrop = h16 ? ds.data() : (E *)dp.data();
    if (dr.on)
        emu_launch(grid_of(rows, 8), 256, 0,
                   [&] { causal_dropout<E>(att.data(), pdrop, rows, T, dr); });
    {
        std::vector<E> pv(pdrop, pdrop + tt);
        auto P2 = widen(dr.on ? pv : att), dyf = widen(dy), v2f = widen(v2);
        bgemm(true, false, T, hs, T, 1.0f, P2.data(), T, sTT, dyf.data(), hs, sT, dv.data(), hs, sT,
              BH);
        bgemm(false, true, T, T, hs, 1.0f, dyf.data(), hs, sT, v2f.data(), hs, sT, dp.data(), T,
              sTT, BH);
    }
    if (!h16)
        emu_launch(grid_of(rows, 8), 256, 0, [&] {
            causal_softmax_bwd_h<float>((const float *)att.data(), dp.data(), dp.data(), rows, T,
                                        scale, dr);
        });
    else
        emu_launch(grid_of(rows, 8), 256, 0, [&] {
            causal_softmax_bwd_h<E>(att.data(), dp.data(), ds.data(), rows, T, scale, dr);
        });
    {
        auto dSf = h16 ? widen(ds) : dp, q2f = widen(q2), k2f = widen(k2);
        bgemm(false, false, T, hs, T, 1.0f, dSf.data(), T, sTT, k2f.data(), hs, sT, dq.data(), hs,
              sT, BH);
        bgemm(true, false, T, hs, T, 1.0f, dSf.data(), T, sTT, q2f.data(), hs, sT, dk.data(), hs,
              sT, BH);
    }
    emu_launch(grid_of(n, 256), 256, 0, [&] {
        permute_qkv<E>(dqkv.data(), dq.data(), dk.data(), dv.data(), B, T, C, nh, -1);
    });

    double eo = rel(widen(out), rout), ed = rel(widen(dqkv), rdqkv);
    const char *name = !h16 ? "fp32" : std::is_same<E, ddp__bf16>::value ? "bf16" : "fp16";
    double tol = !h16 ? 2e-5 : std::is_same<E, ddp__bf16>::value ? 3e-2 : 5e-3;
    bool ok = eo <= tol && ed <= tol;
    printf("%-4s p %.1f T %3d C %3d grid %-7s: out %.2e dqkv %.2e (bound %.0e) %s\n", name, p, T, C,
           g_small ? std::to_string(g_small).c_str() : "product", eo, ed, tol, ok ? "ok" : "FAIL");
    return ok ? 0 : 1;
}

/* --quick (TSan's pass, where a block's threads are OS threads): one grid shape and dropout on,
 * each precision once — the barriers and shuffles race-checked on every kernel, not every shape. */
int main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int bad = 0;
    for (unsigned g : {0u, 2u}) {
        if (quick && g == 0)
            continue;
        g_small = g;
        for (float p : {0.0f, 0.2f}) {
            if (quick && p == 0.0f)
                continue;
            bad += run<float>(2, 2, 70, 48, p);
            bad += run<ddp__bf16>(2, 2, 70, 48, p);
            bad += run<ddp__fp16>(2, 2, 70, 48, p);
        }
    }
    g_small = 0;
    bad += run<float>(1, 3, 1, 48, 0.2f);  /* T 1 */
    bad += run<float>(1, 1, 33, 32, 0.2f); /* one head, a row one past a warp */
    printf("%d failed\n", bad);
    return bad != 0;
}
