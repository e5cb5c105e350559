/*
 * nn/vecmath.h — an exp() and row reductions for the hot loops of the transformer layers (softmax
 * over attention scores and over the vocabulary, the tanh of GELU, layernorm statistics), private
 * to src/nn. Header-only (static inline) so that they inline into the loops that use them.
 *
 * Why not expf(): a libm call per element cannot be vectorised without -ffast-math, and the
 * attention softmax takes one exp per score, twice per step. This one is branch-free plain C that
 * GCC vectorises at -O3: round x·log2(e) to an integer n with the 1.5·2²³ trick, reduce
 * r = x − n·ln2 in two parts (Cody–Waite), a degree-6 polynomial for e^r on |r| ≤ ln2/2, and 2^n
 * put straight into the exponent bits. Measured error against double exp(): ≤ 2 ulp over
 * [−87, 88] (tests/unit/test_transformer.c checks it).
 * Below −87.3 it gives 0 (expf would go subnormal there), −inf included; NaN gives NaN and +inf
 * inf. Above 88.3 the result is finite but wrong: callers pass x − max (≤ 0) or bounded values.
 */
#ifndef DDP_NN_VECMATH_H
#define DDP_NN_VECMATH_H

#include <stdint.h>
#include <string.h>

/* DDP__VEC on a hot loop's function: GCC (or clang) compiles it twice, for AVX2 and for the
 * x86-64 baseline (SSE2), and the loader picks one for the CPU it runs on (target_clones, an
 * ifunc). The loops are otherwise plain C, and the two clones give the same bits: ISO C mode
 * (-std=c11) turns off FMA contraction, the AVX2 target has no FMA anyway, and every reduction
 * runs in explicit lanes whose order does not depend on the vector width. Elsewhere it is
 * nothing, and the baseline build serves. */
/* DDP__VEC512 adds an AVX-512 clone, for the loops it pays on (the GELU: 1.4× on Zen 4; the
 * others ran no faster, AdamW slower); the same bits again. */
/* Not under ThreadSanitizer: the loader runs the clones' resolver before TSan's runtime is up, and
 * the instrumented resolver crashes the program at start (GCC 12). */
#if defined(__SANITIZE_THREAD__)
#define DDP__NO_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DDP__NO_CLONES
#endif
#endif
#if !defined(DDP__VEC) && !defined(DDP__NO_CLONES) && defined(__x86_64__) && defined(__linux__) && \
    defined(__has_attribute)
#if __has_attribute(target_clones)
#define DDP__VEC __attribute__((target_clones("avx2", "default")))
#define DDP__VEC512 __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DDP__VEC /* or -DDDP__VEC= for the baseline build alone */
#define DDP__VEC
#endif
#ifndef DDP__VEC512
#define DDP__VEC512 DDP__VEC
#endif

static inline float ddp__fast_expf(float x)
{
    /* Integer selects only: a float ?: is control flow that GCC will not vectorise under the
     * default -ftrapping-math. */
    const float shift = 12582912.0f; /* 1.5·2²³: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shift;
    /* n = round(x·log2 e) read from t's low bits: no float-to-int conversion, which would be
     * undefined behaviour for inf and NaN. */
    uint32_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    memcpy(&sb, &shift, sizeof sb);
    int32_t n = (int32_t)(tb - sb);
    n = n > 127 ? 127 : n;
    n = n < -126 ? -126 : n;
    float nf = (float)n;
    float r = x - nf * 0.693359375f; /* ln2's high part: n·it is exact for |n| < 2⁹ */
    r = r + nf * 2.12194440e-4f;     /* minus ln2's low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t sbits = (n + 127) << 23; /* 2^n */
    float scale, y;
    memcpy(&scale, &sbits, sizeof scale);
    y = p * scale;
    int32_t ybits;
    memcpy(&ybits, &y, sizeof ybits);
    ybits &= -(int32_t) !(x < -87.3f); /* 0 below, −inf included; NaN stays NaN */
    memcpy(&y, &ybits, sizeof y);
    return y;
}

/* v if keep, else +0: a select GCC vectorises (a float ?: is control flow to it under
 * -ftrapping-math). */
static inline float ddp__keep_f32(float v, int keep)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= (uint32_t)0 - (uint32_t)(keep != 0);
    memcpy(&v, &b, sizeof v);
    return v;
}

/* GCC keeps a sum over a float loop in order (no -ffast-math), which is one long chain of
 * dependent additions; eight independent lanes let it vectorise, and in double they lose no digits
 * over a row. The result depends on n only, not on alignment: the same row gives the same bits. */
static inline double ddp__sum_f64(const float *x, int n)
{
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += x[i + k];
    for (int k = 0; i < n; i++, k++)
        a[k] += x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Σ x·y in double, eight lanes as above. */
static inline double ddp__dot_f64(const float *x, const float *y, int n)
{
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += (double)x[i + k] * y[i + k];
    for (int k = 0; i < n; i++, k++)
        a[k] += (double)x[i] * y[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* max x[i] over n ≥ 1 values, exactly. A float ?: does not vectorise under the default
 * -ftrapping-math, so the comparison is done on integers: flipping the magnitude bits of negative
 * floats makes their bit patterns order like the values (−0 just below +0). A NaN with its sign
 * bit clear orders above +inf and wins (callers then carry it into their result); one with the
 * sign bit set loses. Signed >> is arithmetic on every compiler we build with (GCC, clang). */
static inline float ddp__max_f32(const float *x, int n)
{
    int32_t m = INT32_MIN;
    for (int i = 0; i < n; i++) {
        int32_t b;
        memcpy(&b, &x[i], sizeof b);
        b ^= (b >> 31) & 0x7fffffff;
        m = b > m ? b : m;
    }
    m ^= (m >> 31) & 0x7fffffff;
    float r;
    memcpy(&r, &m, sizeof r);
    return r;
}

#endif /* DDP_NN_VECMATH_H */
