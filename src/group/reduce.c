/*
 * reduce.c — elementwise reductions for every dtype × op, the inner loop of every collective.
 *
 * Allreduce on one host is memory-bound, so the kernels are written for one pass over memory:
 * ddp__reduce_many() reads k inputs and writes the output once, instead of k−1 passes of a
 * two-input reduce. Loops use restrict pointers over plain arrays so the compiler vectorises
 * them (this file is built with -O3). bfloat16 and float16 are widened to float32, reduced, and
 * rounded once per element (round to nearest even), so a sum over ranks rounds once, not per
 * rank. Integer sums wrap like the hardware's (unsigned arithmetic, no undefined behaviour).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "group/group_int.h"

/* ---- half-precision conversions ---------------------------------------------------------- */

float ddp__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ddp__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ddp__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ddp__f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to ≥ 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (a < 0x33000000u)
            return (uint16_t)sign; /* under half of the smallest subnormal */
        uint32_t exp = a >> 23;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* 14 + (112 − exp) */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127 → 15 and round */
    return (uint16_t)(sign | (r >> 13));
}

/* ---- the kernels ----------------------------------------------------------------------------- */

/* Operations on a working type W. Integer sums and products go through unsigned types so
 * overflow wraps instead of being undefined. */
#define OP_SUM(a, b) ((a) + (b))
#define OP_MIN(a, b) ((b) < (a) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) ? (b) : (a))
#define OP_PROD(a, b) ((a) * (b))

/* For T stored as S (storage) and reduced as W (working): load, op, store. */
#define DEFINE_KERNELS(NAME, S, W, LOAD, STORE)                                                    \
    static void NAME##_many(S *restrict dst, const void *const *srcs, int k, size_t n, ddp_op op)  \
    {                                                                                              \
        const S *s0 = srcs[0];                                                                     \
        switch (op) {                                                                              \
        case DDP_SUM:                                                                              \
        case DDP_AVG: NAME##_LOOP(OP_SUM); break;                                                  \
        case DDP_MIN: NAME##_LOOP(OP_MIN); break;                                                  \
        case DDP_MAX: NAME##_LOOP(OP_MAX); break;                                                  \
        case DDP_PROD: NAME##_LOOP(OP_PROD); break;                                                \
        default: break;                                                                            \
        }                                                                                          \
        (void)s0;                                                                                  \
    }

/* The loop body: k = 2 gets its own vectorisable loop (the common two-rank case); otherwise
 * blocks of 1024 elements are reduced input by input, which keeps the partial result in cache
 * and reads each input once. */
#define MANY_LOOP(S, W, LOAD, STORE, OPF)                                                          \
    do {                                                                                           \
        if (k == 1) {                                                                              \
            if ((const void *)dst != (const void *)s0)                                             \
                memmove(dst, s0, n * sizeof(S));                                                   \
            break;                                                                                 \
        }                                                                                          \
        if (k == 2) {                                                                              \
            /* Every op is commutative: put an input dst aliases first. */                         \
            bool swap = (const void *)dst == srcs[1];                                              \
            const S *restrict a = swap ? (const S *)srcs[1] : s0;                                  \
            const S *restrict b = swap ? (const S *)s0 : (const S *)srcs[1];                       \
            if ((const void *)dst == (const void *)a) {                                            \
                for (size_t i = 0; i < n; i++)                                                     \
                    dst[i] = STORE(OPF(LOAD(dst[i]), LOAD(b[i])));                                 \
            } else {                                                                               \
                for (size_t i = 0; i < n; i++)                                                     \
                    dst[i] = STORE(OPF(LOAD(a[i]), LOAD(b[i])));                                   \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
        W acc[1024];                                                                               \
        for (size_t base = 0; base < n; base += 1024) {                                            \
            size_t m = n - base < 1024 ? n - base : 1024;                                          \
            const S *p0 = (const S *)s0 + base;                                                    \
            for (size_t i = 0; i < m; i++)                                                         \
                acc[i] = LOAD(p0[i]);                                                              \
            for (int j = 1; j < k; j++) {                                                          \
                const S *restrict pj = (const S *)srcs[j] + base;                                  \
                for (size_t i = 0; i < m; i++)                                                     \
                    acc[i] = OPF(acc[i], LOAD(pj[i]));                                             \
            }                                                                                      \
            for (size_t i = 0; i < m; i++)                                                         \
                dst[base + i] = STORE(acc[i]);                                                     \
        }                                                                                          \
    } while (0)

#define ID(x) (x)
#define BF_LOAD(x) ddp__bf16_to_f32(x)
#define BF_STORE(x) ddp__f32_to_bf16(x)
#define H_LOAD(x) ddp__f16_to_f32(x)
#define H_STORE(x) ddp__f32_to_f16(x)
/* Integers: reduce in the unsigned type of the same width so sums and products wrap. */
#define U32_OPS_SUM(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define U32_OPS_PROD(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define U64_OPS_SUM(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define U64_OPS_PROD(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

#define f32_LOOP(OPF) MANY_LOOP(float, float, ID, ID, OPF)
#define f64_LOOP(OPF) MANY_LOOP(double, double, ID, ID, OPF)
#define bf16_LOOP(OPF) MANY_LOOP(uint16_t, float, BF_LOAD, BF_STORE, OPF)
#define f16_LOOP(OPF) MANY_LOOP(uint16_t, float, H_LOAD, H_STORE, OPF)
#define u8_LOOP(OPF) MANY_LOOP(uint8_t, uint32_t, ID, (uint8_t), OPF)

DEFINE_KERNELS(f32, float, float, ID, ID)
DEFINE_KERNELS(f64, double, double, ID, ID)
DEFINE_KERNELS(bf16, uint16_t, float, BF_LOAD, BF_STORE)
DEFINE_KERNELS(f16, uint16_t, float, H_LOAD, H_STORE)
DEFINE_KERNELS(u8, uint8_t, uint32_t, ID, (uint8_t))

/* Signed integers need wrapping sum/prod, so they get their own op mapping. */
#define i32_LOOP_SUM() MANY_LOOP(int32_t, int32_t, ID, ID, U32_OPS_SUM)
#define i32_LOOP_PROD() MANY_LOOP(int32_t, int32_t, ID, ID, U32_OPS_PROD)
#define i64_LOOP_SUM() MANY_LOOP(int64_t, int64_t, ID, ID, U64_OPS_SUM)
#define i64_LOOP_PROD() MANY_LOOP(int64_t, int64_t, ID, ID, U64_OPS_PROD)

static void i32_many(int32_t *restrict dst, const void *const *srcs, int k, size_t n, ddp_op op)
{
    const int32_t *s0 = srcs[0];
    switch (op) {
    case DDP_SUM:
    case DDP_AVG: i32_LOOP_SUM(); break;
    case DDP_MIN: MANY_LOOP(int32_t, int32_t, ID, ID, OP_MIN); break;
    case DDP_MAX: MANY_LOOP(int32_t, int32_t, ID, ID, OP_MAX); break;
    case DDP_PROD: i32_LOOP_PROD(); break;
    default: break;
    }
}

static void i64_many(int64_t *restrict dst, const void *const *srcs, int k, size_t n, ddp_op op)
{
    const int64_t *s0 = srcs[0];
    switch (op) {
    case DDP_SUM:
    case DDP_AVG: i64_LOOP_SUM(); break;
    case DDP_MIN: MANY_LOOP(int64_t, int64_t, ID, ID, OP_MIN); break;
    case DDP_MAX: MANY_LOOP(int64_t, int64_t, ID, ID, OP_MAX); break;
    case DDP_PROD: i64_LOOP_PROD(); break;
    default: break;
    }
}

void ddp__reduce_many(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t, ddp_op op)
{
    if (n == 0 || k < 1)
        return;
    switch (t) {
    case DDP_FLOAT32: f32_many(dst, srcs, k, n, op); break;
    case DDP_FLOAT64: f64_many(dst, srcs, k, n, op); break;
    case DDP_BFLOAT16: bf16_many(dst, srcs, k, n, op); break;
    case DDP_FLOAT16: f16_many(dst, srcs, k, n, op); break;
    case DDP_INT32: i32_many(dst, srcs, k, n, op); break;
    case DDP_INT64: i64_many(dst, srcs, k, n, op); break;
    case DDP_UINT8: u8_many(dst, srcs, k, n, op); break;
    default: break;
    }
}

/* (a + b) / divisor, element by element, in one pass. dst may be a or b: GCC checks for the
 * overlap at run time and still vectorises. */
static void f32_avg2(float *dst, const float *a, const float *b, size_t n, int divisor)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (a[i] + b[i]) / (float)divisor;
}

static void f64_avg2(double *dst, const double *a, const double *b, size_t n, int divisor)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (a[i] + b[i]) / divisor;
}

void ddp__reduce_many_avg(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t,
                          ddp_op op, int divisor)
{
    if (divisor > 1 && op == DDP_SUM && k == 2 && t == DDP_FLOAT32) {
        f32_avg2(dst, srcs[0], srcs[1], n, divisor);
        return;
    }
    if (divisor > 1 && op == DDP_SUM && k == 2 && t == DDP_FLOAT64) {
        f64_avg2(dst, srcs[0], srcs[1], n, divisor);
        return;
    }
    ddp__reduce_many(dst, srcs, k, n, t, op);
    ddp__scale_avg(dst, n, t, divisor); /* a no-op for divisor ≤ 1 */
}

void ddp__reduce2(void *dst, const void *a, const void *b, size_t n, ddp_dtype t, ddp_op op)
{
    const void *srcs[2] = {a, b};
    ddp__reduce_many(dst, srcs, 2, n, t, op);
}

void ddp__reduce_into(void *dst, const void *src, size_t n, ddp_dtype t, ddp_op op)
{
    const void *srcs[2] = {dst, src};
    ddp__reduce_many(dst, srcs, 2, n, t, op);
}

void ddp__scale_avg(void *buf, size_t n, ddp_dtype t, int divisor)
{
    if (divisor <= 1)
        return;
    switch (t) {
    case DDP_FLOAT32: {
        float *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= (float)divisor; /* divide, as torch does; a reciprocal would round twice */
        break;
    }
    case DDP_FLOAT64: {
        double *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= divisor;
        break;
    }
    case DDP_BFLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = ddp__f32_to_bf16(ddp__bf16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case DDP_FLOAT16: {
        uint16_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = ddp__f32_to_f16(ddp__f16_to_f32(p[i]) / (float)divisor);
        break;
    }
    case DDP_INT32: {
        int32_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= divisor;
        break;
    }
    case DDP_INT64: {
        int64_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] /= divisor;
        break;
    }
    case DDP_UINT8: {
        uint8_t *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)(p[i] / divisor);
        break;
    }
    default: break;
    }
}
