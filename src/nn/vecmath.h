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

/* max x[i] over n ≥ 1 values. A NaN may or may not win (callers go on to sum exp(x − max), which
 * carries any NaN into their result). Eight independent chains: the select does not vectorise
 * under -ftrapping-math, but the chains pipeline. */
static inline float ddp__max_f32(const float *x, int n)
{
    float a[8];
    for (int k = 0; k < 8; k++)
        a[k] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] = x[i + k] > a[k] ? x[i + k] : a[k];
    for (; i < n; i++)
        a[0] = x[i] > a[0] ? x[i] : a[0];
    float m = a[0];
    for (int k = 1; k < 8; k++)
        m = a[k] > m ? a[k] : m;
    return m;
}

#endif /* DDP_NN_VECMATH_H */
