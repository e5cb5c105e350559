/*
 * tests/emu/emu_check.h — what the emulated kernels' tests share: random inputs, poisoned outputs
 * (0xff bytes: NaN in every float format, so a value never written shows), float views of 16-bit
 * data, and the checks, each printing one line and counting a failure in `bad` (the program's
 * exit status). Include after cuda_emu.h (ddp__ld / ddp__st). EMU_SEED picks the inputs.
 */
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#ifndef EMU_SEED
#define EMU_SEED 1
#endif

[[maybe_unused]] static int bad = 0;
[[maybe_unused]] static std::mt19937 rng(EMU_SEED);

[[maybe_unused]] static std::vector<float> randv(size_t n, float lo = -1, float hi = 1)
{
    std::uniform_real_distribution<float> U(lo, hi);
    std::vector<float> v(n);
    for (auto &x : v)
        x = U(rng);
    return v;
}
template <typename E = float> static std::vector<E> poisoned(size_t n)
{
    std::vector<E> v(n);
    memset(v.data(), 0xff, n * sizeof(E));
    return v;
}
template <typename E> static std::vector<float> widen(const E *p, size_t n)
{
    std::vector<float> r(n);
    for (size_t i = 0; i < n; i++)
        r[i] = ddp__ld(p + i);
    return r;
}
template <typename E> static std::vector<float> widen(const std::vector<E> &v)
{
    return widen(v.data(), v.size());
}
template <typename E> static std::vector<E> narrow(const std::vector<float> &v)
{
    std::vector<E> r(v.size());
    for (size_t i = 0; i < v.size(); i++)
        ddp__st(&r[i], v[i]);
    return r;
}
template <typename E> static const char *nm()
{
    return std::is_same<E, float>::value       ? "fp32"
           : std::is_same<E, ddp__bf16>::value ? "bf16"
                                               : "fp16";
}
/* max |g − w| / max |w| (a NaN, from poison, wins and stays: it fails any bound) */
template <typename W> static double rel(const float *g, const W *w, size_t n)
{
    double md = 0, mw = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - (double)w[i]);
        if (!(d <= md) && !std::isnan(md))
            md = d;
        mw = std::max(mw, fabs((double)w[i]));
    }
    return mw > 0 ? md / mw : md;
}
template <typename W> static double rel(const std::vector<float> &g, const std::vector<W> &w)
{
    return rel(g.data(), w.data(), g.size());
}
[[maybe_unused]] static void check(const char *what, double e, double tol)
{
    bool ok = e <= tol;
    printf("%-48s %.2e (bound %.0e) %s\n", what, e, tol, ok ? "ok" : "FAIL");
    bad += !ok;
}
[[maybe_unused]] static void check(const char *what, const float *g, const float *w, size_t n,
                                   double tol)
{
    check(what, rel(g, w, n), tol);
}
[[maybe_unused]] static void check_exact(const char *what, const void *a, const void *b,
                                         size_t bytes)
{
    bool ok = !memcmp(a, b, bytes);
    printf("%-48s %s\n", what, ok ? "bit-exact ok" : "FAIL (bits differ)");
    bad += !ok;
}
