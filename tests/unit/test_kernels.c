/*
 * test_kernels.c — the bottom of the tree against references: the CPU reduction and conversion
 * kernels (src/kernels), the 16-bit float conversions (util/half.h), the counter-based generator
 * (util/rng.h) and the names and sizes of include/ddp/tensor.h.
 *
 * Reductions are checked bit for bit against a naive loop that reduces one element at a time in
 * the same order (inputs 0, 1, …, k−1; bf16/fp16 widened to float, rounded once), for every
 * dtype × op × k ∈ {1, 2, 3, 5} × count (across the 1024-element block boundary) × where dst is:
 * its own buffer, or the same pointer as input j for every j — the zero-copy case, where the
 * shm backend passes srcs[me]. Inputs are small integers (products of at most 5 values ≤ 3), so
 * every result is exact and the order of operations cannot hide a bug.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "kernels/kernels.h"
#include "util/half.h"
#include "util/rng.h"

/* ---- the naive reference --------------------------------------------------------------------- */

static double get(const void *p, size_t i, ddp_dtype t)
{
    switch (t) {
    case DDP_FLOAT32: return ((const float *)p)[i];
    case DDP_FLOAT64: return ((const double *)p)[i];
    case DDP_BFLOAT16: return ddp__bf16_to_f32(((const uint16_t *)p)[i]);
    case DDP_FLOAT16: return ddp__f16_to_f32(((const uint16_t *)p)[i]);
    case DDP_INT32: return ((const int32_t *)p)[i];
    case DDP_INT64: return (double)((const int64_t *)p)[i];
    case DDP_UINT8: return ((const uint8_t *)p)[i];
    default: fail();
    }
    return 0;
}

static void put(void *p, size_t i, ddp_dtype t, double v)
{
    switch (t) {
    case DDP_FLOAT32: ((float *)p)[i] = (float)v; break;
    case DDP_FLOAT64: ((double *)p)[i] = v; break;
    case DDP_BFLOAT16: ((uint16_t *)p)[i] = ddp__f32_to_bf16((float)v); break;
    case DDP_FLOAT16: ((uint16_t *)p)[i] = ddp__f32_to_f16((float)v); break;
    case DDP_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DDP_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DDP_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: fail();
    }
}

static double apply(ddp_op op, double a, double b)
{
    switch (op) {
    case DDP_SUM:
    case DDP_AVG: return a + b;
    case DDP_MIN: return b < a ? b : a;
    case DDP_MAX: return b > a ? b : a;
    case DDP_PROD: return a * b;
    default: fail();
    }
    return 0;
}

/* Input j at element i: 1, 2 or 3, so sums ≤ 15 and products ≤ 243 fit every dtype exactly. */
static double input(int j, size_t i)
{
    return (double)((i * 7 + (size_t)j * 3) % 3 + 1);
}

/* ---- reductions ------------------------------------------------------------------------------ */

static void reduce_case(ddp_dtype t, ddp_op op, int k, size_t n, int alias)
{
    size_t esz = ddp_dtype_size(t);
    void *in[5], *ref = malloc(n * esz + 1), *own = malloc(n * esz + 1);
    assert_non_null(ref);
    assert_non_null(own);
    const void *srcs[5];
    for (int j = 0; j < k; j++) {
        in[j] = malloc(n * esz + 1);
        assert_non_null(in[j]);
        for (size_t i = 0; i < n; i++)
            put(in[j], i, t, input(j, i));
        srcs[j] = in[j];
    }
    for (size_t i = 0; i < n; i++) {
        double acc = input(0, i);
        for (int j = 1; j < k; j++)
            acc = apply(op, acc, input(j, i));
        put(ref, i, t, acc);
    }
    void *dst = alias < 0 ? own : in[alias];
    ddp__reduce_many(dst, srcs, k, n, t, op);
    if (n && memcmp(dst, ref, n * esz) != 0)
        fail_msg("reduce_many %s %s k=%d n=%zu, dst %s %d: differs from the reference",
                 ddp_dtype_name(t), ddp_op_name(op), k, n, alias < 0 ? "its own buffer" : "= input",
                 alias);
    for (int j = 0; j < k; j++)
        if (j != alias)
            for (size_t i = 0; i < n; i++)
                assert_true(get(in[j], i, t) == input(j, i)); /* inputs untouched */
    for (int j = 0; j < k; j++)
        free(in[j]);
    free(ref), free(own);
}

static void reduce_many_all(void **state)
{
    (void)state;
    static const size_t counts[] = {0, 1, 7, 1023, 1024, 1025, 3001};
    static const int ks[] = {1, 2, 3, 5};
    for (int t = 0; t < DDP_DTYPE_COUNT; t++)
        for (int op = 0; op < DDP_OP_COUNT; op++)
            for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
                for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                    for (int alias = -1; alias < ks[ki]; alias++)
                        reduce_case((ddp_dtype)t, (ddp_op)op, ks[ki], counts[ci], alias);
}

/* MIN and MAX keep a NaN wherever it is among k inputs (float32, float64, bfloat16, float16),
 * in place and not: it was kept on input 0 and dropped on the last one. */
static void reduce_min_max_nan(void **state)
{
    (void)state;
    static const ddp_dtype ts[] = {DDP_FLOAT32, DDP_FLOAT64, DDP_BFLOAT16, DDP_FLOAT16};
    enum { K = 4, N = 9 };
    for (size_t ti = 0; ti < 4; ti++)
        for (int op = DDP_MIN; op <= DDP_MAX; op++)
            for (int k = 1; k <= K; k++)
                for (int at = 0; at < k; at++)
                    for (int alias = -1; alias <= 0; alias++) {
                        ddp_dtype t = ts[ti];
                        double in[K][N], out[N]; /* storage for any of the four types */
                        const void *srcs[K];
                        for (int j = 0; j < k; j++) {
                            for (size_t i = 0; i < N; i++)
                                put(in[j], i, t, j == at && i % 2 == 0 ? NAN : input(j, i));
                            srcs[j] = in[j];
                        }
                        void *dst = alias < 0 ? (void *)out : (void *)in[0];
                        ddp__reduce_many(dst, srcs, k, N, t, (ddp_op)op);
                        for (size_t i = 0; i < N; i++) {
                            double v = get(dst, i, t);
                            if ((i % 2 == 0) != (bool)isnan(v))
                                fail_msg("%s %s k=%d, NaN in input %d: element %zu is %g",
                                         ddp_dtype_name(t), ddp_op_name((ddp_op)op), k, at, i, v);
                        }
                    }
}

static void reduce_two_and_avg(void **state)
{
    (void)state;
    enum { N = 1500 };
    float a[N], b[N], d[N], want[N];
    for (int i = 0; i < N; i++)
        a[i] = (float)(i % 13) - 6.0f, b[i] = (float)(i % 5) * 0.25f;
    for (int i = 0; i < N; i++)
        want[i] = (a[i] + b[i]) / 3.0f;
    ddp__reduce2(d, a, b, N, DDP_FLOAT32, DDP_SUM);
    ddp__scale_avg(d, N, DDP_FLOAT32, 3);
    assert_memory_equal(d, want, sizeof d);
    /* the fused two-input avg rounds exactly like the two passes, also in place */
    const void *srcs[2] = {a, b};
    ddp__reduce_many_avg(d, srcs, 2, N, DDP_FLOAT32, DDP_SUM, 3);
    assert_memory_equal(d, want, sizeof d);
    float a2[N];
    memcpy(a2, a, sizeof a);
    srcs[0] = a2;
    ddp__reduce_many_avg(a2, srcs, 2, N, DDP_FLOAT32, DDP_SUM, 3);
    assert_memory_equal(a2, want, sizeof a2);
    /* bfloat16/float16 AVG over 3 inputs: the float32 sum divided, then rounded once (until
     * 2026-11-26 the sum was rounded, then the quotient: 1 unit off in a third of the elements),
     * also in place */
    for (int bf = 0; bf < 2; bf++) {
        uint16_t h[3][N], out[N], in0[N];
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < N; i++) {
                float x = 1.0f + (float)((i * 37 + j * 101) % 997) / 997.0f;
                h[j][i] = bf ? ddp__f32_to_bf16(x) : ddp__f32_to_f16(x);
            }
        const void *hs[3] = {h[0], h[1], h[2]};
        ddp_dtype t = bf ? DDP_BFLOAT16 : DDP_FLOAT16;
        memcpy(in0, h[0], sizeof in0);
        ddp__reduce_many_avg(out, hs, 3, N, t, DDP_SUM, 3);
        ddp__reduce_many_avg(h[0], hs, 3, N, t, DDP_SUM, 3); /* in place */
        for (int i = 0; i < N; i++) {
            float sum = 0;
            for (int j = 0; j < 3; j++)
                sum += bf ? ddp__bf16_to_f32(j ? h[j][i] : in0[i])
                          : ddp__f16_to_f32(j ? h[j][i] : in0[i]);
            uint16_t w = bf ? ddp__f32_to_bf16(sum / 3.0f) : ddp__f32_to_f16(sum / 3.0f);
            if (out[i] != w || h[0][i] != w)
                fail_msg("%s avg of 3, element %d: %04x / %04x in place, want %04x",
                         bf ? "bf16" : "fp16", i, out[i], h[0][i], w);
        }
    }
    /* reduce_into: dst op= src */
    memcpy(d, a, sizeof a);
    ddp__reduce_into(d, b, N, DDP_FLOAT32, DDP_MAX);
    for (int i = 0; i < N; i++)
        assert_true(d[i] == fmaxf(a[i], b[i]));
    /* integer averages truncate toward zero */
    int32_t v[4] = {7, -7, 8, -8};
    ddp__scale_avg(v, 4, DDP_INT32, 2);
    assert_int_equal(v[0], 3);
    assert_int_equal(v[1], -3);
    assert_int_equal(v[2], 4);
    assert_int_equal(v[3], -4);
    /* integer sums wrap instead of overflowing */
    int32_t big[2] = {INT32_MAX, 1}, w;
    const void *bs[2] = {&big[0], &big[1]};
    ddp__reduce_many(&w, bs, 2, 1, DDP_INT32, DDP_SUM);
    assert_int_equal(w, INT32_MIN);
}

/* ---- conversions ----------------------------------------------------------------------------- */

static void half_conversions(void **state)
{
    (void)state;
    /* every bfloat16 and float16 value survives widening and narrowing (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float b = ddp__bf16_to_f32((uint16_t)h), f = ddp__f16_to_f32((uint16_t)h);
        if (isnan(b))
            assert_true(isnan(ddp__bf16_to_f32(ddp__f32_to_bf16(b))));
        else
            assert_int_equal(ddp__f32_to_bf16(b), h);
        if (isnan(f))
            assert_true(isnan(ddp__f16_to_f32(ddp__f32_to_f16(f))));
        else
            assert_int_equal(ddp__f32_to_f16(f), h);
    }
    /* round to nearest even, overflow and underflow */
    assert_int_equal(ddp__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie, to even */
    assert_int_equal(ddp__f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie, to even */
    assert_int_equal(ddp__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie, to even */
    assert_int_equal(ddp__f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie, to even */
    assert_int_equal(ddp__f32_to_f16(65520.0f), 0x7c00);            /* to infinity */
    assert_int_equal(ddp__f32_to_f16(65519.0f), 0x7bff);            /* the largest half */
    assert_int_equal(ddp__f32_to_f16(0x1p-24f), 0x0001);            /* smallest subnormal */
    assert_int_equal(ddp__f32_to_f16(0x1p-25f), 0x0000);            /* tie, to even: 0 */
    assert_int_equal(ddp__f32_to_f16(-0x1p-26f), 0x8000);           /* signed zero */
    assert_true(ddp__f16_to_f32(0x0001) == 0x1p-24f);
}

static void array_conversions(void **state)
{
    (void)state;
    enum { N = 999 };
    float x[N], back[N];
    uint16_t h[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(i - 500) * 0.3183f;
    for (int t = DDP_BFLOAT16; t <= DDP_FLOAT16; t++) {
        ddp__from_f32(h, x, N, (ddp_dtype)t);
        ddp__to_f32(back, h, N, (ddp_dtype)t);
        for (int i = 0; i < N; i++) {
            uint16_t one = t == DDP_BFLOAT16 ? ddp__f32_to_bf16(x[i]) : ddp__f32_to_f16(x[i]);
            assert_int_equal(h[i], one);
            assert_true(back[i] ==
                        (t == DDP_BFLOAT16 ? ddp__bf16_to_f32(one) : ddp__f16_to_f32(one)));
        }
    }
    ddp__from_f32(back, x, N, DDP_FLOAT32); /* float32: a copy */
    assert_memory_equal(back, x, sizeof x);
}

/* The array conversions of float16 (the CPU's F16C instructions where it has them, eight at a
 * time, the tails element by element) give util/half.h's values for every half (at every start
 * offset modulo 8) and for a million floats spread over every exponent (at offsets 0, 3 and 6:
 * tails of 0, 5 and 2 elements); a NaN stays a NaN
 * (its payload bits may differ). Checked over all 2^32 floats once, 2026-11-26: identical. */
static void f16_arrays_match_scalar(void **state)
{
    (void)state;
    enum { NH = 65536, NF = 1 << 20 };
    uint16_t *h = malloc(NH * sizeof *h + 16), *h2 = malloc((NF + 8) * sizeof *h2);
    float *f = malloc((NF + 8) * sizeof *f);
    assert_non_null(h), assert_non_null(h2), assert_non_null(f);
    for (uint32_t i = 0; i < NH; i++)
        h[i] = (uint16_t)i;
    for (int off = 0; off < 8; off++) {
        size_t n = NH - (size_t)off;
        ddp__to_f32(f, h + off, n, DDP_FLOAT16);
        for (size_t i = 0; i < n; i++) {
            float want = ddp__f16_to_f32(h[off + i]);
            if (isnan(want) ? !isnan(f[i]) : memcmp(&want, &f[i], 4) != 0)
                fail_msg("half %04x widened to %a, want %a", h[off + i], f[i], want);
        }
    }
    for (uint32_t i = 0; i < NF + 8; i++) { /* bit patterns 4096 apart, every sign and exponent */
        uint32_t u = i * 4096u + (i & 4095u);
        memcpy(&f[i], &u, 4);
    }
    for (int off = 0; off < 8; off += 3) {
        ddp__from_f32(h2, f + off, NF, DDP_FLOAT16);
        for (size_t i = 0; i < NF; i++) {
            float x = f[off + i];
            uint16_t want = ddp__f32_to_f16(x);
            if (isnan(x) ? !isnan(ddp__f16_to_f32(h2[i])) : h2[i] != want)
                fail_msg("float %a narrowed to %04x, want %04x", x, h2[i], want);
        }
    }
    free(h), free(h2), free(f);
}

/* The same for bfloat16's array conversions (AVX2, sixteen at a time: widening by a shift,
 * narrowing with util/half.h's rounding and NaN rule, bit for bit; checked over all 2^32 once,
 * 2026-11-26), tails at every length modulo 16. */
static void bf16_arrays_match_scalar(void **state)
{
    (void)state;
    enum { NH = 65536, NF = 1 << 20 };
    uint16_t *h = malloc(NH * sizeof *h), *h2 = malloc((NF + 16) * sizeof *h2);
    float *f = malloc((NF + 16) * sizeof *f);
    assert_non_null(h), assert_non_null(h2), assert_non_null(f);
    for (uint32_t i = 0; i < NH; i++)
        h[i] = (uint16_t)i;
    for (int off = 0; off < 16; off += 5) {
        size_t n = NH - (size_t)off;
        ddp__to_f32(f, h + off, n, DDP_BFLOAT16);
        for (size_t i = 0; i < n; i++) {
            float want = ddp__bf16_to_f32(h[off + i]);
            if (memcmp(&want, &f[i], 4) != 0)
                fail_msg("bfloat16 %04x widened to %a, want %a", h[off + i], f[i], want);
        }
    }
    for (uint32_t i = 0; i < NF + 16; i++) { /* every sign and exponent, NaNs included */
        uint32_t u = i * 4096u + (i & 4095u);
        memcpy(&f[i], &u, 4);
    }
    for (int off = 0; off < 16; off += 7) {
        ddp__from_f32(h2, f + off, NF - (size_t)off, DDP_BFLOAT16);
        for (size_t i = 0; i < NF - (size_t)off; i++)
            if (h2[i] != ddp__f32_to_bf16(f[off + i]))
                fail_msg("float %a narrowed to %04x, want %04x", f[off + i], h2[i],
                         ddp__f32_to_bf16(f[off + i]));
    }
    free(h), free(h2), free(f);
}

/* ---- the generator --------------------------------------------------------------------------- */

static void counter_rng(void **state)
{
    (void)state;
    /* Pinned: dropout masks, initial weights and augmentations depend on these exact bits
     * (values from an independent transcription of the splitmix64 chain). */
    assert_true(ddp__rand_u64(0, 0, 0) == 0x238275bc38fcbe91ull);
    assert_true(ddp__rand_u64(1, 2, 3) == 0xd0734750fde362b3ull);
    assert_true(ddp__rand_u64(42, 7, 123456789) == 0x258d21a72d150ebfull);
    assert_true(ddp__rand_u64(UINT64_MAX, 1, 2) == 0x6f3abded3a3bc478ull);
    assert_true(ddp_nn_rand_u64(42, 7, 123456789) == ddp__rand_u64(42, 7, 123456789));
    assert_true(ddp__rand_u32(0xd0734750fde362b3ull, 0) == 0x4066a941u); /* attention dropout */
    assert_true(ddp__rand_u32(0xd0734750fde362b3ull, 1) == 0x9706457du);
    assert_true(ddp__rand_u32(0xd0734750fde362b3ull, 1000) == 0x57c4f785u);
    assert_true(ddp__unit_f32(0) == 0.0f);
    assert_true(ddp__unit_f32(UINT64_MAX) == 1.0f - 0x1p-24f);
}

/* ---- the vocabulary -------------------------------------------------------------------------- */

static void tensor_vocabulary(void **state)
{
    (void)state;
    static const size_t sizes[] = {4, 8, 2, 2, 4, 8, 1};
    static const char *const names[] = {"float32", "float64", "bfloat16", "float16",
                                        "int32",   "int64",   "uint8"};
    for (int t = 0; t < DDP_DTYPE_COUNT; t++) {
        assert_int_equal(ddp_dtype_size((ddp_dtype)t), sizes[t]);
        assert_string_equal(ddp_dtype_name((ddp_dtype)t), names[t]);
    }
    assert_int_equal(ddp_dtype_size(DDP_DTYPE_COUNT), 0);
    assert_int_equal(ddp_dtype_size((ddp_dtype)-1), 0);
    assert_string_equal(ddp_dtype_name((ddp_dtype)99), "invalid dtype");
    assert_int_equal(DDP_DEVICE_CPU, 0);
    assert_string_equal(ddp_device_name(DDP_DEVICE_CPU), "cpu");
    assert_string_equal(ddp_device_name(DDP_DEVICE_CUDA), "cuda");
    assert_string_equal(ddp_device_name(DDP_DEVICE_COUNT), "invalid device");
    assert_string_equal(ddp_op_name(DDP_AVG), "avg");
    assert_string_equal(ddp_op_name(DDP_OP_COUNT), "invalid op");
    ddp_buf b = {0};
    assert_null(b.ptr);
    assert_int_equal(b.dtype, DDP_FLOAT32);
    assert_int_equal(b.device, DDP_DEVICE_CPU);
}

/* The two copies the shm allreduce chooses between (cpu/copy.c): byte for byte memcpy's result at
 * every length around the 64-byte step and every misalignment of either side, and the bytes
 * around the destination untouched. */
static void copies(void **state)
{
    (void)state;
    enum { MAXLEN = 300, PAD = 64 };
    unsigned char src[MAXLEN + 2 * PAD], dst[MAXLEN + 2 * PAD], want[MAXLEN + 2 * PAD];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    void (*const fn[2])(void *, const void *, size_t) = {ddp__copy_cached, ddp__copy_stream};
    for (int f = 0; f < 2; f++)
        for (size_t len = 0; len <= MAXLEN; len += len < 130 ? 1 : 17)
            for (size_t da = 0; da < PAD; da += 5)
                for (size_t sa = 0; sa < PAD; sa += 13) {
                    memset(dst, 0xa5, sizeof dst);
                    memcpy(want, dst, sizeof want);
                    memcpy(want + da, src + sa, len);
                    fn[f](dst + da, src + sa, len);
                    assert_memory_equal(dst, want, sizeof dst);
                }
    /* A large one: many whole lines between ragged ends. */
    size_t big = ((size_t)1 << 20) + 37;
    unsigned char *a = malloc(big + 64), *b = malloc(big + 64);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < big; i++)
        a[i + 3] = (unsigned char)(i * 131 + 7);
    for (int f = 0; f < 2; f++) {
        memset(b, 0, big + 64);
        fn[f](b + 9, a + 3, big);
        assert_memory_equal(b + 9, a + 3, big);
    }
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reduce_many_all),         cmocka_unit_test(reduce_min_max_nan),
        cmocka_unit_test(reduce_two_and_avg),      cmocka_unit_test(half_conversions),
        cmocka_unit_test(array_conversions),       cmocka_unit_test(counter_rng),
        cmocka_unit_test(tensor_vocabulary),       cmocka_unit_test(copies),
        cmocka_unit_test(f16_arrays_match_scalar), cmocka_unit_test(bf16_arrays_match_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
