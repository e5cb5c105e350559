/*
 * kernels/cpu/reduce.c — elementwise reductions for every dtype × op, the inner loop of every
 * collective (src/group calls them; it keeps only the group logic), and the array conversions
 * between float32 and the 16-bit floats.
 *
 * Allreduce on one host is memory-bound, so the kernels are written for one pass over memory:
 * ddp__reduce_many() reads k inputs and writes the output once, instead of k−1 passes of a
 * two-input reduce. Loops run over plain arrays with restrict pointers only where the memory
 * really is disjoint, so the compiler vectorises them (this file is built with -O3). bfloat16
 * and float16 are widened to float32, reduced, and rounded once per element (round to nearest
 * even, util/half.h), so a sum over ranks rounds once, not per rank; float16 goes through blocks
 * widened and narrowed with the CPU's F16C conversions where it has them (x86-64 since 2012: the
 * bit-by-bit conversion does not vectorise and made a float16 sum 20× slower than bfloat16's, below
 * gloo's). Integer sums wrap like the
 * hardware's (unsigned arithmetic, no undefined behaviour); min and max return a NaN operand
 * whatever its position. No threads: callers split the work.
 */
#include <stdbool.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#define HAVE_F16C_PATH 1
#endif

#include "kernels/kernels.h"
#include "util/half.h"

/* ---- one pass over k inputs ------------------------------------------------------------------ */

/* Operations on a working type W. Integer sums and products go through unsigned types so
 * overflow wraps instead of being undefined. */
#define OP_SUM(a, b) ((a) + (b))
/* A NaN wins min and max wherever it is (b != b: b is NaN; a NaN a stays, as b < a is false),
 * as torch.max does: "is any rank's value NaN?" asked with MAX is answered on every rank alike
 * (a NaN on the last rank was dropped, on rank 0 kept). For integers b != b is never true. */
#define OP_MIN(a, b) ((b) < (a) || (b) != (b) ? (b) : (a))
#define OP_MAX(a, b) ((b) > (a) || (b) != (b) ? (b) : (a))
#define OP_PROD(a, b) ((a) * (b))
#define WRAP32_SUM(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define WRAP32_PROD(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define WRAP64_SUM(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define WRAP64_PROD(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))

#define ID(x) (x)
#define U8_STORE(x) ((uint8_t)(x))

/*
 * Aliasing. dst may be one of the inputs: in place, and in the shm backend's zero-copy path it is
 * srcs[me], any index. So ddp__reduce_many's dst is not restrict; instead every loop is a small
 * function whose restrict parameters cover only that loop, where the memory really is disjoint.
 * That is what lets GCC vectorise without run-time overlap checks (restrict on block-scope
 * pointers is not enough for it), and it is what the standard allows: a restrict pointer
 * promises no other access to its object during its own block, not the caller's.
 *   k = 2: every op is commutative, so the input dst aliases, if any, is the left operand
 *          and the loop reads and writes it through one pointer (acc2), else out2.
 *   k > 2: blocks of 1024 elements are reduced input by input into a local accumulator (load,
 *          fold…, store), which keeps the partial result in cache and reads each input once;
 *          dst's block is written only after every input's block was read.
 */

/* Per storage type S reduced as W: the accumulator's load and store. */
#define DEFINE_TYPE(T, S, W, LOAD, STORE)                                                          \
    static void T##_load(W *restrict acc, const S *restrict p, size_t m)                           \
    {                                                                                              \
        for (size_t i = 0; i < m; i++)                                                             \
            acc[i] = LOAD(p[i]);                                                                   \
    }                                                                                              \
    static void T##_store(S *restrict d, const W *restrict acc, size_t m)                          \
    {                                                                                              \
        for (size_t i = 0; i < m; i++)                                                             \
            d[i] = STORE(acc[i]);                                                                  \
    }

/* Per type and op: the loops, and the pass over k inputs that picks among them. */
#define DEFINE_OP(T, O, S, W, LOAD, STORE, OPF)                                                    \
    static void T##_##O##_acc2(S *restrict d, const S *restrict b, size_t n)                       \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = STORE(OPF(LOAD(d[i]), LOAD(b[i])));                                             \
    }                                                                                              \
    static void T##_##O##_out2(S *restrict d, const S *restrict a, const S *restrict b, size_t n)  \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = STORE(OPF(LOAD(a[i]), LOAD(b[i])));                                             \
    }                                                                                              \
    static void T##_##O##_fold(W *restrict acc, const S *restrict p, size_t m)                     \
    {                                                                                              \
        for (size_t i = 0; i < m; i++)                                                             \
            acc[i] = OPF(acc[i], LOAD(p[i]));                                                      \
    }                                                                                              \
    static void T##_##O##_many(S *dst, const void *const *srcs, int k, size_t n)                   \
    {                                                                                              \
        const S *s0 = srcs[0], *s1 = k > 1 ? srcs[1] : NULL;                                       \
        if (k == 1) {                                                                              \
            if (dst != s0)                                                                         \
                memmove(dst, s0, n * sizeof(S));                                                   \
        } else if (k == 2) {                                                                       \
            if (dst == s0)                                                                         \
                T##_##O##_acc2(dst, s1, n);                                                        \
            else if (dst == s1)                                                                    \
                T##_##O##_acc2(dst, s0, n);                                                        \
            else                                                                                   \
                T##_##O##_out2(dst, s0, s1, n);                                                    \
        } else {                                                                                   \
            W acc[1024];                                                                           \
            for (size_t base = 0; base < n; base += 1024) {                                        \
                size_t m = n - base < 1024 ? n - base : 1024;                                      \
                T##_load(acc, s0 + base, m);                                                       \
                for (int j = 1; j < k; j++)                                                        \
                    T##_##O##_fold(acc, (const S *)srcs[j] + base, m);                             \
                T##_store(dst + base, acc, m);                                                     \
            }                                                                                      \
        }                                                                                          \
    }

/* The four ops of a type, and its dispatcher (AVG is reduced as SUM). */
#define DEFINE_ALL(T, S, W, LOAD, STORE, SUMF, PRODF)                                              \
    DEFINE_TYPE(T, S, W, LOAD, STORE)                                                              \
    DEFINE_OP(T, sum, S, W, LOAD, STORE, SUMF)                                                     \
    DEFINE_OP(T, min, S, W, LOAD, STORE, OP_MIN)                                                   \
    DEFINE_OP(T, max, S, W, LOAD, STORE, OP_MAX)                                                   \
    DEFINE_OP(T, prod, S, W, LOAD, STORE, PRODF)                                                   \
    static void T##_many(S *dst, const void *const *srcs, int k, size_t n, ddp_op op)              \
    {                                                                                              \
        switch (op) {                                                                              \
        case DDP_SUM:                                                                              \
        case DDP_AVG: T##_sum_many(dst, srcs, k, n); break;                                        \
        case DDP_MIN: T##_min_many(dst, srcs, k, n); break;                                        \
        case DDP_MAX: T##_max_many(dst, srcs, k, n); break;                                        \
        case DDP_PROD: T##_prod_many(dst, srcs, k, n); break;                                      \
        default: break;                                                                            \
        }                                                                                          \
    }

DEFINE_ALL(f32, float, float, ID, ID, OP_SUM, OP_PROD)
DEFINE_ALL(f64, double, double, ID, ID, OP_SUM, OP_PROD)
DEFINE_ALL(i32, int32_t, int32_t, ID, ID, WRAP32_SUM, WRAP32_PROD)
DEFINE_ALL(i64, int64_t, int64_t, ID, ID, WRAP64_SUM, WRAP64_PROD)
DEFINE_ALL(u8, uint8_t, uint32_t, ID, U8_STORE, OP_SUM, OP_PROD)

/* ---- float16, in blocks of float32 -------------------------------------------------------- */

#ifdef HAVE_F16C_PATH
/* vcvtph2ps / vcvtps2ph, eight at a time; the tail element by element (util/half.h gives the
 * same values: exact widening, round to nearest even — imm8 0 — overflow to infinity,
 * subnormals kept; only a NaN's payload bits may differ, a NaN stays a NaN). */
__attribute__((target("avx,f16c"))) static void widen_f16c(float *restrict d,
                                                           const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = ddp__f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) static void narrow_f16c(uint16_t *restrict d,
                                                            const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = ddp__f32_to_f16(s[i]);
}

/* bfloat16 in AVX2, sixteen at a time: widening shifts each into a float32's high half;
 * narrowing is util/half.h's rounding (add 0x7fff and the kept half's last bit: to nearest
 * even) with its NaN rule (the high half with the quiet bit set) — the same bits for every
 * float (checked over all 2^32 once, 2026-11-26). The bit-by-bit loops of DEFINE_ALL did not
 * vectorise well: a bfloat16 sum took 2.9× float32's time for the same elements. */
__attribute__((target("avx2"))) static void widen_bf16_avx2(float *restrict d,
                                                            const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
        __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
        _mm256_storeu_ps(d + i, _mm256_castsi256_ps(lo));
        _mm256_storeu_ps(d + i + 8, _mm256_castsi256_ps(hi));
    }
    for (; i < n; i++)
        d[i] = ddp__bf16_to_f32(s[i]);
}

__attribute__((target("avx2"))) static __m256i round_bf16_avx2(__m256 v)
{
    __m256i x = _mm256_castps_si256(v);
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f800000));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), q, nan); /* each ≤ 0xffff */
}

__attribute__((target("avx2"))) static void narrow_bf16_avx2(uint16_t *restrict d,
                                                             const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = round_bf16_avx2(_mm256_loadu_ps(s + i));
        __m256i b = round_bf16_avx2(_mm256_loadu_ps(s + i + 8));
        /* packus works per 128-bit lane: a.lo b.lo a.hi b.hi, put back in order */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
        _mm256_storeu_si256((__m256i *)(d + i), p);
    }
    for (; i < n; i++)
        d[i] = ddp__f32_to_bf16(s[i]);
}
#endif

#ifdef HAVE_F16C_PATH
/* Whether the CPU has F16C (and the OS saves the AVX state it needs): from CPUID, once (clang's
 * __builtin_cpu_supports does not know "f16c"; the fuzzers are built with clang). */
static bool have_f16c(void)
{
    static atomic_int known; /* 0: not asked yet, 1: no, 2: yes */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (!k) {
        unsigned a, b, c, d;
        bool yes =
            __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        k = yes ? 2 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k == 2;
}
#endif

/* The vector conversion where the CPU has it (then return), else on to the scalar loop after. */
#ifdef HAVE_F16C_PATH
#define VECTOR_IF(has, call)                                                                       \
    if (has) {                                                                                     \
        call;                                                                                      \
        return;                                                                                    \
    }
#else
#define VECTOR_IF(has, call)
#endif

static void f16_widen(float *restrict d, const uint16_t *restrict s, size_t n)
{
    VECTOR_IF(have_f16c(), widen_f16c(d, s, n))
    for (size_t i = 0; i < n; i++)
        d[i] = ddp__f16_to_f32(s[i]);
}

static void f16_narrow(uint16_t *restrict d, const float *restrict s, size_t n)
{
    VECTOR_IF(have_f16c(), narrow_f16c(d, s, n))
    for (size_t i = 0; i < n; i++)
        d[i] = ddp__f32_to_f16(s[i]);
}

static void bf16_widen(float *restrict d, const uint16_t *restrict s, size_t n)
{
    VECTOR_IF(__builtin_cpu_supports("avx2"), widen_bf16_avx2(d, s, n))
    for (size_t i = 0; i < n; i++)
        d[i] = ddp__bf16_to_f32(s[i]);
}

static void bf16_narrow(uint16_t *restrict d, const float *restrict s, size_t n)
{
    VECTOR_IF(__builtin_cpu_supports("avx2"), narrow_bf16_avx2(d, s, n))
    for (size_t i = 0; i < n; i++)
        d[i] = ddp__f32_to_bf16(s[i]);
}

/* acc = op(acc, b), element by element, in float32 (MIN/MAX keep a NaN as OP_MIN/OP_MAX do). */
static void f32_combine(float *restrict acc, const float *restrict b, size_t m, ddp_op op)
{
    switch (op) {
    case DDP_MIN:
        for (size_t i = 0; i < m; i++)
            acc[i] = OP_MIN(acc[i], b[i]);
        break;
    case DDP_MAX:
        for (size_t i = 0; i < m; i++)
            acc[i] = OP_MAX(acc[i], b[i]);
        break;
    case DDP_PROD:
        for (size_t i = 0; i < m; i++)
            acc[i] *= b[i];
        break;
    default:
        for (size_t i = 0; i < m; i++)
            acc[i] += b[i];
        break;
    }
}

/* The k float16 inputs widened block by block, combined in float32, divided by divisor (> 1:
 * AVG, before the one rounding) and narrowed. dst may be any input: each block is written after
 * all of its inputs were read. */
static void half_many(uint16_t *dst, const void *const *srcs, int k, size_t n, ddp_op op,
                      int divisor, bool bf)
{
    void (*widen)(float *restrict, const uint16_t *restrict, size_t) = bf ? bf16_widen : f16_widen;
    void (*narrow)(uint16_t *restrict, const float *restrict, size_t) =
        bf ? bf16_narrow : f16_narrow;
    if (k == 1 && divisor <= 1) {
        if (dst != srcs[0])
            memmove(dst, srcs[0], n * sizeof *dst);
        return;
    }
    float acc[1024], b[1024];
    for (size_t base = 0; base < n; base += 1024) {
        size_t m = n - base < 1024 ? n - base : 1024;
        widen(acc, (const uint16_t *)srcs[0] + base, m);
        for (int j = 1; j < k; j++) {
            widen(b, (const uint16_t *)srcs[j] + base, m);
            f32_combine(acc, b, m, op);
        }
        if (divisor > 1)
            for (size_t i = 0; i < m; i++)
                acc[i] /= (float)divisor;
        narrow(dst + base, acc, m);
    }
}

void ddp__reduce_many(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t, ddp_op op)
{
    if (n == 0 || k < 1)
        return;
    switch (t) {
    case DDP_FLOAT32: f32_many(dst, srcs, k, n, op); break;
    case DDP_FLOAT64: f64_many(dst, srcs, k, n, op); break;
    case DDP_BFLOAT16: half_many(dst, srcs, k, n, op, 1, true); break;
    case DDP_FLOAT16: half_many(dst, srcs, k, n, op, 1, false); break;
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
    /* bfloat16/float16: the k inputs summed in float32, divided and rounded once per element
     * (the sum rounded first, then the quotient, was two roundings: off by one unit in a third of
     * the elements at 3 ranks). */
    if (divisor > 1 && op == DDP_SUM && (t == DDP_BFLOAT16 || t == DDP_FLOAT16)) {
        half_many(dst, srcs, k, n, op, divisor, t == DDP_BFLOAT16);
        return;
    }
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

/* (For bfloat16/float16 this rounds the quotient of an already rounded sum: a second rounding.
 * Backends that can divide before their sum's rounding fuse AVG instead: ddp__reduce_many_avg.) */
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
    case DDP_BFLOAT16:
    case DDP_FLOAT16: {
        const void *src[1] = {buf};
        half_many(buf, src, 1, n, DDP_SUM, divisor, t == DDP_BFLOAT16);
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

/* ---- conversions ----------------------------------------------------------------------------- */

void ddp__to_f32(float *restrict dst, const void *restrict src, size_t n, ddp_dtype t)
{
    const uint16_t *restrict s = src;
    switch (t) {
    case DDP_FLOAT32: memcpy(dst, src, n * sizeof(float)); break;
    case DDP_BFLOAT16: bf16_widen(dst, s, n); break;
    case DDP_FLOAT16: f16_widen(dst, s, n); break;
    default: break;
    }
}

void ddp__from_f32(void *restrict dst, const float *restrict src, size_t n, ddp_dtype t)
{
    uint16_t *restrict d = dst;
    switch (t) {
    case DDP_FLOAT32: memcpy(dst, src, n * sizeof(float)); break;
    case DDP_BFLOAT16: bf16_narrow(d, src, n); break;
    case DDP_FLOAT16: f16_narrow(d, src, n); break;
    default: break;
    }
}

/* float32, the common case: eight interleaved lanes (element i into lane i mod 8), so the
 * additions are eight independent chains the compiler vectorises instead of one long one. */
static double sum_squares_f32(const float *x, size_t n)
{
    double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            a[k] += (double)x[i + k] * x[i + k];
    for (int k = 0; i < n; i++, k++)
        a[k] += (double)x[i] * x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

double ddp__sum_squares(const void *v, size_t n, ddp_dtype t)
{
    if (t == DDP_FLOAT32)
        return sum_squares_f32(v, n);
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x;
        switch (t) {
        case DDP_FLOAT64: x = ((const double *)v)[i]; break;
        case DDP_BFLOAT16: x = ddp__bf16_to_f32(((const uint16_t *)v)[i]); break;
        default: x = ddp__f16_to_f32(((const uint16_t *)v)[i]); break;
        }
        ss += x * x;
    }
    return ss;
}
