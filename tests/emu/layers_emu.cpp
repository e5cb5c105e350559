/*
 * tests/emu/layers_emu.cpp — dropout.cu's dropout_kernel, layers.cu's kernels (embedding forward
 * and backward with its atomics, layernorm forward (fp32 and 16-bit out) and backward (warp per
 * row, and the weight/bias gradients by column chunks with atomics), GELU (tanh) forward and
 * backward, the residual adds, the fused vocabulary cross-entropy with its fp32 gradient and its
 * 16-bit gradient written in place over the logits in chunks), gemm.cu's column sum and bias add,
 * devmath.cu's f32 ↔ 16-bit conversions run on the CPU through cuda_emu.h with the launch
 * geometry of their host code, against the product's CPU layers (ddp_nn_*, libddp) or util/half.h.
 * Outputs poisoned (0xff) first. Dropout and the conversions must match bit for bit; the rest
 * within the stated relative bounds (fp32 statistics and atomic order differ from the CPU's
 * double sums). Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "ddp/nn.h"
#include "kernels/cuda_kernels.h"
#include "util/rng.h"
}
#include "common_cuh.inc"
#include "dropout_cuh.inc"
#include "dropout_kernels.inc"
#include "layers_kernels.inc"
#include "gemm_kernels.inc"
#include "devmath_kernels.inc"
#include <random>
#define EMU_SEED 42
#include "emu_check.h"

/* the bound of a 16-bit result against the fp32 reference: its rounding (½ ulp) and a little */
template <typename E> static double hbound(double fp32)
{
    return std::is_same<E, float>::value ? fp32 : std::is_same<E, ddp__bf16>::value ? 8e-3 : 1e-3;
}

/* ---- dropout ---- */
template <typename X, typename Y> static void t_dropout(size_t n, float p)
{
    auto xf = randv(n);
    std::vector<X> x = narrow<X>(xf);
    xf = widen(x.data(), n);
    std::vector<float> ref(n);
    std::vector<uint8_t> mask(n);
    ddp_nn_dropout_forward(xf.data(), n, p, 9, 4, 1000, true, mask.data(), ref.data());
    ddp__cuda_drop d = {p, 9, 4, 1000};
    ddp__drop_dev a = ddp__drop_args(&d);
    auto y = poisoned<Y>(n);
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { dropout_kernel<X, Y>(x.data(), y.data(), n, a); });
    std::vector<Y> want = narrow<Y>(ref);
    char w[80];
    snprintf(w, sizeof w, "dropout %s -> %s n %zu p %.1f", nm<X>(), nm<Y>(), n, p);
    check_exact(w, y.data(), want.data(), n * sizeof(Y));
}

/* ---- embedding ---- */
static void t_embedding(int B, int T, int C, int V)
{
    const size_t total = (size_t)B * T * C;
    std::vector<int32_t> idx(B * T);
    std::uniform_int_distribution<int> I(0, 4); /* few tokens: many atomic adds per row */
    for (auto &i : idx)
        i = I(rng);
    auto wte = randv((size_t)V * C), wpe = randv((size_t)T * C), dx = randv(total);
    std::vector<float> rx(total);
    ddp_error err = {};
    if (ddp_nn_embedding_forward(idx.data(), wte.data(), wpe.data(), B, T, C, V, T, rx.data(),
                                 &err)) {
        printf("embedding forward: %s\n", err.msg);
        bad++;
        return;
    }
    auto x = poisoned<float>(total);
    emu_launch(ddp__cuda_blocks(total, 256), 256, 0, [&] {
        embedding_fwd(idx.data(), wte.data(), wpe.data(), T, C, total, x.data());
    });
    check_exact("embedding forward", x.data(), rx.data(), total * 4);
    auto rdwte = randv((size_t)V * C), rdwpe = randv((size_t)T * C);
    auto dwte = rdwte, dwpe = rdwpe;
    ddp_nn_embedding_backward(dx.data(), idx.data(), B, T, C, rdwte.data(), rdwpe.data());
    emu_launch(ddp__cuda_blocks(total, 256), 256, 0,
               [&] { embedding_bwd_wte(dx.data(), idx.data(), C, total, dwte.data()); });
    emu_launch(ddp__cuda_blocks((size_t)T * C, 256), 256, 0,
               [&] { embedding_bwd_wpe(dx.data(), B, T, C, dwpe.data()); });
    check("embedding backward dwte (atomics)", rel(dwte.data(), rdwte.data(), dwte.size()), 1e-6);
    check("embedding backward dwpe", rel(dwpe.data(), rdwpe.data(), dwpe.size()), 1e-6);
}

/* ---- layernorm ---- */
template <typename E> static void t_layernorm(int N, int C)
{
    auto x = randv((size_t)N * C, -2, 3), w = randv(C), b = randv(C), dy = randv((size_t)N * C);
    std::vector<float> ry((size_t)N * C), rm(N), rr(N);
    ddp_nn_layernorm_forward(x.data(), w.data(), b.data(), N, C, 1e-5f, ry.data(), rm.data(),
                             rr.data());
    auto y = poisoned<E>((size_t)N * C);
    auto m = poisoned<float>(N), r = poisoned<float>(N);
    emu_launch((unsigned)((N + 7) / 8), 256, 0, [&] {
        layernorm_fwd<E>(x.data(), w.data(), b.data(), N, C, 1e-5f, y.data(), m.data(), r.data());
    });
    char s[80];
    snprintf(s, sizeof s, "layernorm forward %s N %d C %d", nm<E>(), N, C);
    check(s, rel(widen(y.data(), y.size()).data(), ry.data(), ry.size()), hbound<E>(1e-5));
    snprintf(s, sizeof s, "layernorm forward mean, rstd (%s)", nm<E>());
    check(s, std::max(rel(m.data(), rm.data(), N), rel(r.data(), rr.data(), N)), 1e-5);
    if (!std::is_same<E, float>::value)
        return;
    /* backward: dw/db first, then dx in place over dy (as the host code allows) */
    std::vector<float> rdx((size_t)N * C), rdw = randv(C), rdb = randv(C);
    auto dw = rdw, db = rdb;
    ddp_nn_layernorm_backward(dy.data(), x.data(), w.data(), rm.data(), rr.data(), N, C,
                              rdx.data(), rdw.data(), rdb.data());
    auto dx = dy; /* in place */
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
    emu_launch(grid, 256, 0, [&] {
        layernorm_bwd_dw(dx.data(), x.data(), m.data(), r.data(), N, C, dw.data(), db.data());
    });
    emu_launch((unsigned)((N + 7) / 8), 256, 0, [&] {
        layernorm_bwd_dx(dx.data(), x.data(), w.data(), m.data(), r.data(), N, C, dx.data());
    });
    snprintf(s, sizeof s, "layernorm backward dx (in place) N %d C %d", N, C);
    check(s, rel(dx.data(), rdx.data(), dx.size()), 1e-5);
    check("layernorm backward dw, db (chunks, atomics)",
          std::max(rel(dw.data(), rdw.data(), C), rel(db.data(), rdb.data(), C)), 1e-5);
}

/* ---- GELU (tanh), adds, column sum ---- */
template <typename E> static void t_gelu_add(size_t n)
{
    auto xf = randv(n, -5, 5), dyf = randv(n);
    auto x = narrow<E>(xf), dy = narrow<E>(dyf);
    xf = widen(x.data(), n), dyf = widen(dy.data(), n);
    std::vector<float> ry(n), rdx(n);
    ddp_nn_gelu_tanh_forward(xf.data(), n, ry.data());
    ddp_nn_gelu_tanh_backward(dyf.data(), xf.data(), n, rdx.data());
    auto y = poisoned<E>(n), dx = poisoned<E>(n);
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] { gelu_fwd<E>(x.data(), n, y.data()); });
    emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
               [&] { gelu_bwd<E>(dy.data(), x.data(), n, dx.data()); });
    char s[80];
    snprintf(s, sizeof s, "gelu (tanh) forward %s n %zu", nm<E>(), n);
    check(s, rel(widen(y.data(), n).data(), ry.data(), n), hbound<E>(1e-6));
    snprintf(s, sizeof s, "gelu (tanh) backward %s", nm<E>());
    check(s, rel(widen(dx.data(), n).data(), rdx.data(), n), hbound<E>(1e-5));
    auto a = randv(n);
    std::vector<float> ra(n);
    ddp_nn_add(a.data(), dyf.data(), n, ra.data());
    auto o = poisoned<float>(n);
    if (std::is_same<E, float>::value)
        emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
                   [&] { add_kernel(a.data(), (const float *)dy.data(), n, o.data()); });
    else
        emu_launch(ddp__cuda_blocks(n, 256), 256, 0,
                   [&] { add_h_kernel<E>(a.data(), dy.data(), n, o.data()); });
    snprintf(s, sizeof s, "add (%s branch)", nm<E>());
    check_exact(s, o.data(), ra.data(), n * 4);
    /* the column sum of a (N, C): two column blocks, three row chunks */
    const int C = 300, N = 520;
    dyf = randv((size_t)N * C);
    dy = narrow<E>(dyf);
    dyf = widen(dy.data(), dyf.size());
    std::vector<float> rdb = randv(C);
    auto db = rdb;
    for (int c = 0; c < C; c++) {
        double t = rdb[c];
        for (int r = 0; r < N; r++)
            t += dyf[(size_t)r * C + c];
        rdb[c] = (float)t;
    }
    dim3 grid((unsigned)((C + 255) / 256), (unsigned)((N + 255) / 256));
    emu_launch(grid, 256, 0, [&] { colsum_kernel<E>(dy.data(), N, C, db.data()); });
    snprintf(s, sizeof s, "column sum %s N %d C %d", nm<E>(), N, C);
    check(s, rel(db.data(), rdb.data(), C), 1e-5);
}

/* ---- gemm.cu's bias epilogue: C (rows, cols; leading dimension ldc) += bias ---- */
template <typename Bt, typename E> static void t_add_bias(int rows, int cols, int ldc)
{
    auto cf = randv((size_t)rows * ldc), bf = randv(cols);
    auto C = narrow<E>(cf);
    auto bias = narrow<Bt>(bf);
    cf = widen(C.data(), C.size()), bf = widen(bias.data(), cols);
    std::vector<E> want = C;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            ddp__st(&want[(size_t)r * ldc + j], cf[(size_t)r * ldc + j] + bf[j]);
    const size_t total = (size_t)rows * cols;
    emu_launch(ddp__cuda_blocks(total, 256), 256, 0,
               [&] { add_bias_kernel<Bt, E>(bias.data(), rows, cols, C.data(), ldc); });
    char s[80];
    snprintf(s, sizeof s, "bias add (%s bias, %s C, ldc %d)", nm<Bt>(), nm<E>(), ldc);
    check_exact(s, C.data(), want.data(), C.size() * sizeof(E));
}

/* ---- vocabulary cross-entropy ---- */
template <typename H> static void t_xent(int N, int V, bool hgrad)
{
    auto logits = randv((size_t)N * V, -4, 4);
    std::vector<int32_t> tg(N);
    for (int r = 0; r < N; r++)
        tg[r] = (r * 379 + 11) % V;
    tg[1] = DDP_NN_IGNORE_INDEX;
    /* row 2: a tie for the max at two places, the target the later one; row 3: target the max */
    logits[2 * (size_t)V + 700] = logits[2 * (size_t)V + 5] = 9.0f;
    tg[2] = 700;
    logits[3 * (size_t)V + 17] = 9.5f;
    tg[3] = 17;
    const float scale = 0.5f;
    std::vector<float> rrow(N), rd((size_t)N * V);
    double lsum, loss;
    int count;
    ddp_error err = {};
    if (ddp_nn_vocab_xent_sum(logits.data(), tg.data(), N, V, &lsum, &count, rrow.data(), &err) ||
        ddp_nn_vocab_xent(logits.data(), tg.data(), N, V, scale, &loss, rd.data(), &err)) {
        printf("xent: %s\n", err.msg);
        bad++;
        return;
    }
    std::vector<int32_t> rcorrect(N);
    for (int r = 0; r < N; r++) {
        int a = 0;
        for (int j = 1; j < V; j++)
            if (logits[(size_t)r * V + j] > logits[(size_t)r * V + a])
                a = j;
        rcorrect[r] = tg[r] != DDP_NN_IGNORE_INDEX && a == tg[r];
    }
    auto row = poisoned<float>(N);
    auto cor = poisoned<int32_t>(N);
    auto lg = logits;
    std::vector<float> d = poisoned<float>((size_t)N * V);
    emu_launch((unsigned)N, 512, 0, [&] {
        vocab_xent<H>(lg.data(), tg.data(), V, scale, count, row.data(), cor.data(),
                      hgrad ? nullptr : d.data(), hgrad ? (H *)lg.data() : nullptr);
    });
    char s[80];
    snprintf(s, sizeof s, "vocab xent row loss N %d V %d%s", N, V, hgrad ? " (16-bit grad)" : "");
    check(s, rel(row.data(), rrow.data(), N), 1e-5);
    snprintf(s, sizeof s, "vocab xent correct (first max on ties)");
    check_exact(s, cor.data(), rcorrect.data(), N * 4);
    std::vector<float> g((size_t)N * V);
    if (!hgrad)
        g = d;
    else
        for (int r = 0; r < N; r++)
            for (int j = 0; j < V; j++)
                g[(size_t)r * V + j] = ddp__ld((H *)lg.data() + (size_t)r * 2 * V + j);
    snprintf(s, sizeof s, "vocab xent dlogits %s", hgrad ? nm<H>() : "fp32");
    check(s, rel(g.data(), rd.data(), g.size()), hgrad ? hbound<H>(0) : 1e-5);
}

/* ---- conversions ---- */
template <typename H> static void t_convert(size_t n)
{
    auto f = randv(n, -70000, 70000); /* fp16 overflows to ±inf */
    f[0] = NAN, f[1] = INFINITY, f[2] = -0.0f, f[3] = 1e-40f;
    auto h = poisoned<H>(n);
    emu_launch(reduce_blocks(n), 256, 0, [&] { convert_kernel<H, float>(f.data(), n, h.data()); });
    auto want = narrow<H>(f);
    char s[80];
    snprintf(s, sizeof s, "convert fp32 -> %s n %zu", nm<H>(), n);
    check_exact(s, h.data(), want.data(), n * 2);
    auto back = poisoned<float>(n);
    emu_launch(reduce_blocks(n), 256, 0,
               [&] { convert_kernel<float, H>(h.data(), n, back.data()); });
    auto wb = widen(h.data(), n);
    snprintf(s, sizeof s, "convert %s -> fp32", nm<H>());
    check_exact(s, back.data(), wb.data(), n * 4);
}

int main()
{
    t_dropout<float, float>(3001, 0.2f);
    t_dropout<float, ddp__bf16>(3001, 0.2f);
    t_dropout<float, ddp__fp16>(3001, 0.5f);
    t_dropout<ddp__bf16, ddp__bf16>(3001, 0.2f);
    t_dropout<ddp__fp16, ddp__fp16>(777, 0.2f);
    t_embedding(2, 35, 48, 7);
    t_layernorm<float>(300, 40);
    t_layernorm<float>(70, 200);
    t_layernorm<ddp__bf16>(70, 48);
    t_layernorm<ddp__fp16>(70, 48);
    t_gelu_add<float>(300 * 9);
    t_gelu_add<ddp__bf16>(300 * 9);
    t_gelu_add<ddp__fp16>(300 * 9);
    t_add_bias<float, float>(37, 50, 64);
    t_add_bias<float, ddp__bf16>(37, 50, 50);
    t_add_bias<ddp__fp16, ddp__fp16>(37, 50, 56);
    t_xent<ddp__bf16>(6, 1100, false);
    t_xent<ddp__bf16>(6, 1100, true);
    t_xent<ddp__fp16>(6, 1100, true);
    t_convert<ddp__bf16>(3001);
    t_convert<ddp__fp16>(3001);
    printf("%d failed\n", bad);
    return bad != 0;
}
