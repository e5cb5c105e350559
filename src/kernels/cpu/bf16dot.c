/*
 * kernels/cpu/bf16dot.c — the attention's products on bfloat16 operands, in AVX512_BF16
 * dot-product instructions of our own (kernels.h, "bf16 dot products"), for nn/attention.c's
 * fused path under precision bf16.
 *
 * Why not oneDNN: each head of each block of queries is seven small products (64 × 256 × 64 at
 * the GPT's large bench shape), 8,064 calls per step, on strided operands for which oneDNN picks
 * its gemm:jit at ≈ 165 GFLOP/s; and a product cannot skip the masked half of the causal
 * diagonal. Here the operands are packed once per head, the products run in register tiles of
 * 4 rows × 64 columns, and every tile stops at the causal limit of its rows.
 *
 * The instruction: vdpbf16ps (_mm512_dpbf16_ps) adds to each of 16 float32 lanes the products of
 * one pair of bfloat16 values from each operand, so both operands need their reduction dimension
 * in pairs. One operand is broadcast (a pair of one row, as stored: row-major bfloat16 rows have
 * their pairs in place), the other is packed, 16 output columns per 512-bit load:
 *   tiles (ddp__bf16_pack_tiles): rows of X in groups of 16, [tile][d/2][16][2] — for products
 *     reducing over X's columns (S = Q·Kᵀ, dP = dO·Vᵀ);
 *   pairs (ddp__bf16_pack_pairs): X's rows two at a time, interleaved, [i/2][col][2] — for
 *     products reducing over X's rows (O = P·V, dQ = dS·K, dV = Pᵀ·dO, dK = dSᵀ·Q).
 * The float32 sums are the instruction's (pairs added in order, round to nearest even, denormals
 * as zero): a different order of additions than oneDNN's, so not its bits, but a fixed one —
 * the same inputs give the same bits on every run and every CPU with AVX512_BF16.
 *
 * Only on x86-64 (elsewhere ddp__bf16_dot_available is false and the rest is never called); only
 * called when ddp__gemm_bf16_active, which has checked the CPU for AVX512_BF16.
 */
#include <stdbool.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define INL static inline __attribute__((always_inline))

bool ddp__bf16_dot_available(void)
{
    return true;
}

static inline uint32_t ld32(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int imin(int a, int b)
{
    return a < b ? a : b;
}

/* ---- packing ---------------------------------------------------------------------------------- */

/* r[0..15] (16 rows of 16 32-bit words) transposed in place: r[c] ← column c. Unpacks make
 * 4 × 4 blocks within each 128-bit lane, then lanes are exchanged in two rounds. */
TGT INL void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + j], lane L: column 4L + j of rows 4i..4i + 3 */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        __m512i u = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);
        __m512i v = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
        __m512i w = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
        __m512i x = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
        t[j] = _mm512_shuffle_i32x4(u, w, 0x88);
        t[4 + j] = _mm512_shuffle_i32x4(v, x, 0x88);
        t[8 + j] = _mm512_shuffle_i32x4(u, w, 0xdd);
        t[12 + j] = _mm512_shuffle_i32x4(v, x, 0xdd);
    }
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

TGT void ddp__bf16_pack_tiles(uint16_t *dst, const uint16_t *X, int n, int cols, int ld)
{
    /* 16 rows × 16 pairs at a time, read a row at a time and transposed in registers: a gather
     * per pair of 16 rows 3C·2 bytes apart was 3× slower than this, word-by-word copies 2×. */
    const int np = cols / 2, ntile = (n + 15) / 16;
    for (int t = 0; t < ntile; t++) {
        int rows = imin(16, n - t * 16);
        uint16_t *d = dst + (size_t)t * np * 32;
        const uint16_t *x = X + (size_t)t * 16 * ld;
        for (int p0 = 0; p0 < np; p0 += 16) {
            __mmask16 m = (__mmask16)(np - p0 >= 16 ? 0xffff : (1u << (np - p0)) - 1);
            __m512i r[16];
            for (int k = 0; k < 16; k++)
                r[k] = k < rows ? _mm512_maskz_loadu_epi32(m, x + (size_t)k * ld + 2 * p0)
                                : _mm512_setzero_si512();
            transpose16(r);
            for (int p = 0; p < 16 && p0 + p < np; p++)
                _mm512_storeu_si512((void *)(d + (size_t)(p0 + p) * 32), r[p]);
        }
    }
}

TGT void ddp__bf16_pack_pairs(uint16_t *dst, const uint16_t *X, int n, int cols, int ld)
{
    for (int i = 0; i < n; i += 2) {
        const uint16_t *a = X + (size_t)i * ld, *b = i + 1 < n ? a + ld : NULL;
        uint16_t *d = dst + (size_t)i * cols;
        for (int c = 0; c < cols; c += 16) {
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + c)));
            __m512i hi = b ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(b + c)))
                           : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(d + 2 * c), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

TGT void ddp__bf16_pair_rows(uint16_t *dst, const float *a, const float *b, int n)
{
    for (int j = 0; j < n; j += 16) {
        int left = imin(16, n - j);
        __mmask16 m = (__mmask16)(left == 16 ? 0xffff : (1u << left) - 1);
        __m512i lo = _mm512_cvtepu16_epi32(
            (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, a + j)));
        __m512i hi = b ? _mm512_cvtepu16_epi32(
                             (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, b + j)))
                       : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + 2 * (size_t)j, m,
                                 _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

/* ---- the softmax rows ------------------------------------------------------------------------- */

/* e^x in 16 lanes: nn/vecmath.h's ddp__fast_expf (the same reduction and polynomial, in fused
 * multiply-adds, so not always its bits: within 2 ulp of exp like it). 0 below −87.3, −inf
 * included; NaN stays NaN. */
TGT INL __m512 exp512(__m512 x)
{
    const __m512 shift = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift);
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(shift));
    n = _mm512_max_epi32(_mm512_min_epi32(n, _mm512_set1_epi32(127)), _mm512_set1_epi32(-126));
    __m512 nf = _mm512_cvtepi32_ps(n);
    __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(nf, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 y = _mm512_mul_ps(
        p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23)));
    __mmask16 low = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    return _mm512_maskz_mov_ps((__mmask16)~low, y);
}

static __mmask16 first(int k)
{
    return (__mmask16)(k >= 16 ? 0xffff : k <= 0 ? 0 : (1u << k) - 1);
}

/* exp(x[j] − sub) for the lanes of m, 0 in the others. */
TGT INL __m512 exp_minus(const float *x, __m512 sub, __mmask16 m)
{
    return _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x), sub)));
}

/* dst[j] for n ≤ j < end: 0 (end − n small: the causal tail of a block row). */
TGT INL void zero_halves(uint16_t *dst, int n, int end)
{
    for (int j = n; j < end; j += 32) {
        int k = imin(32, end - j);
        _mm512_mask_storeu_epi16(dst + j, (__mmask32)(k >= 32 ? 0xffffffffu : (1u << k) - 1),
                                 _mm512_setzero_si512());
    }
}

TGT float ddp__bf16_softmax_row(uint16_t *dst, const float *s, int n, int kend, const float *mrow,
                                float *mx_out)
{
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < n; j += 16)
        vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), first(n - j), s + j));
    float mx = _mm512_reduce_max_ps(vm);
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    int j = 0;
    for (; j < n; j += 16) {
        __mmask16 m = first(n - j);
        __m512 e = exp_minus(s + j, vmx, m);
        sum = _mm512_add_ps(sum, e);
        if (mrow)
            e = _mm512_mul_ps(e, _mm512_maskz_loadu_ps(m, mrow + j));
        _mm256_storeu_si256((__m256i *)(void *)(dst + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    zero_halves(dst, j, (kend + 1) & ~1);
    *mx_out = mx;
    return _mm512_reduce_add_ps(sum);
}

TGT void ddp__bf16_softmax_backward_row(float *prow, float *drow, int n, int kend, float lse,
                                        const float *mrow, uint16_t *dsh)
{
    const __m512 vl = _mm512_set1_ps(lse);
    __m512 acc = _mm512_setzero_ps();
    int j = 0;
    for (; j < n; j += 16) {
        __mmask16 m = first(n - j);
        __m512 p = exp_minus(prow + j, vl, m);
        __m512 g = _mm512_maskz_loadu_ps(m, drow + j);
        if (mrow)
            g = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, mrow + j));
        acc = _mm512_fmadd_ps(p, g, acc);
        _mm512_storeu_ps(prow + j, p);
        _mm512_storeu_ps(drow + j, g);
    }
    const __m512 D = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
    for (j = 0; j < n; j += 16) {
        __mmask16 m = first(n - j);
        __m512 p = _mm512_loadu_ps(prow + j);
        __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(drow + j), D));
        _mm512_storeu_ps(drow + j, ds);
        _mm256_storeu_si256((__m256i *)(void *)(dsh + j), (__m256i)_mm512_cvtneps_pbh(ds));
        if (mrow)
            /* masked: mrow past n is not this row's (0 × a stale NaN would be NaN) */
            _mm512_storeu_ps(prow + j, _mm512_mul_ps(p, _mm512_maskz_loadu_ps(m, mrow + j)));
    }
    for (; j < kend; j += 16) { /* the block's columns past the last 16 written */
        __mmask16 m = first(kend - j);
        _mm512_mask_storeu_ps(prow + j, m, _mm512_setzero_ps());
        _mm512_mask_storeu_ps(drow + j, m, _mm512_setzero_ps());
    }
    zero_halves(dsh, j, (kend + 1) & ~1);
}

/* ---- S = alpha · X · Ytᵀ, causal ------------------------------------------------------------ */

/* NR rows × NT tiles of 16 columns, reduced over np pairs. x: the rows' bfloat16 (leading
 * dimension ldx halves); yt: the first tile, tiles np·32 halves apart. */
TGT INL void scores_tile(const int NR, const int NT, int np, float alpha, const uint16_t *x,
                         size_t ldx, const uint16_t *yt, float *s, size_t lds)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            acc[r][t] = _mm512_setzero_ps();
    for (int p = 0; p < np; p++) {
        __m512i y[4];
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            y[t] = _mm512_loadu_si512((const void *)(yt + (size_t)t * np * 32 + (size_t)p * 32));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512i b = _mm512_set1_epi32((int)ld32(x + r * ldx + 2 * p));
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++)
                acc[r][t] = _mm512_dpbf16_ps(acc[r][t], (__m512bh)b, (__m512bh)y[t]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++)
            _mm512_storeu_ps(s + r * lds + t * 16, _mm512_mul_ps(acc[r][t], al));
}

#define SCORES_CASE(R, T)                                                                          \
    case (R) * 8 + (T):                                                                            \
        scores_tile(R, T, np, alpha, x, (size_t)ldx, yt, s, (size_t)lds);                          \
        break;

TGT void ddp__bf16_scores(int m, int t0, int cols, float alpha, const uint16_t *X, int ldx,
                          const uint16_t *Yt, float *S, int lds)
{
    const int np = cols / 2;
    for (int i = 0; i < m; i += 4) {
        int nr = imin(4, m - i), ntile = (t0 + i + nr - 1) / 16 + 1;
        for (int t = 0; t < ntile; t += 4) {
            int nt = imin(4, ntile - t);
            const uint16_t *x = X + (size_t)i * ldx, *yt = Yt + (size_t)t * np * 32;
            float *s = S + (size_t)i * lds + (size_t)t * 16;
            switch (nr * 8 + nt) {
                SCORES_CASE(4, 4)
                SCORES_CASE(4, 3)
                SCORES_CASE(4, 2)
                SCORES_CASE(4, 1)
                SCORES_CASE(3, 4)
                SCORES_CASE(3, 3)
                SCORES_CASE(3, 2)
                SCORES_CASE(3, 1)
                SCORES_CASE(2, 4)
                SCORES_CASE(2, 3)
                SCORES_CASE(2, 2)
                SCORES_CASE(2, 1)
                SCORES_CASE(1, 4)
                SCORES_CASE(1, 3)
                SCORES_CASE(1, 2)
                SCORES_CASE(1, 1)
            default:
                break;
            }
        }
    }
}

/* ---- out = alpha · rowscale · A · Bp (+ out), A's pairs broadcast ----------------------------- */

/* NR rows × NC·16 columns over pairs [lo, hi). a: the first row's pair 0 (pairs aps halves·2
 * apart... in halves: row r, pair p at a + 2·(r·ars + p·aps)); bp: the column chunk of pair 0,
 * pairs bps halves apart. */
TGT INL void pairs_tile(const int NR, const int NC, int lo, int hi, const uint16_t *a, size_t ars,
                        size_t aps, const uint16_t *bp, size_t bps, float alpha,
                        const float *rowscale, bool add, float *out, size_t ldo)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            acc[r][c] = _mm512_setzero_ps();
    for (int p = lo; p < hi; p++) {
        __m512i y[4];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
            y[c] = _mm512_loadu_si512((const void *)(bp + (size_t)p * bps + (size_t)c * 32));
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m512i b = _mm512_set1_epi32((int)ld32(a + 2 * (r * ars + (size_t)p * aps)));
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)b, (__m512bh)y[c]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        const __m512 sc = _mm512_set1_ps(rowscale ? alpha * rowscale[r] : alpha);
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            float *o = out + r * ldo + c * 16;
            __m512 v = _mm512_mul_ps(acc[r][c], sc);
            _mm512_storeu_ps(o, add ? _mm512_add_ps(_mm512_loadu_ps(o), v) : v);
        }
    }
}

#define PAIRS_CASE(R, N)                                                                           \
    case (R) * 8 + (N):                                                                            \
        pairs_tile(R, N, lo, hi, a, ars, aps, bp, bps, alpha, rs, add, o, (size_t)ldo);            \
        break;

TGT void ddp__bf16_pairs(int m, int cols, int np, ddp__bf16_causal mode, int off,
                         const uint16_t *A, size_t ars, size_t aps, const uint16_t *Bp, float alpha,
                         const float *rowscale, bool add, float *out, int ldo)
{
    const size_t bps = 2 * (size_t)cols;
    for (int i = 0; i < m; i += 4) {
        int nr = imin(4, m - i), lo = 0, hi = np;
        if (mode == DDP__BF16_LOWER)
            hi = imin(np, (i + nr - 1 + off) / 2 + 1);
        else if (mode == DDP__BF16_UPPER && i + off > 0)
            lo = imin(np, (i + off) / 2);
        const uint16_t *a = A + 2 * (size_t)i * ars;
        const float *rs = rowscale ? rowscale + i : NULL;
        for (int c0 = 0; c0 < cols; c0 += 64) {
            int nc = imin(4, (cols - c0) / 16);
            const uint16_t *bp = Bp + 2 * (size_t)c0;
            float *o = out + (size_t)i * ldo + c0;
            if (hi <= lo) { /* nothing to add: the rows' products are 0 */
                if (!add)
                    for (int r = 0; r < nr; r++)
                        memset(o + (size_t)r * ldo, 0, sizeof(float) * 16 * (size_t)nc);
                continue;
            }
            switch (nr * 8 + nc) {
                PAIRS_CASE(4, 4)
                PAIRS_CASE(4, 3)
                PAIRS_CASE(4, 2)
                PAIRS_CASE(4, 1)
                PAIRS_CASE(3, 4)
                PAIRS_CASE(3, 3)
                PAIRS_CASE(3, 2)
                PAIRS_CASE(3, 1)
                PAIRS_CASE(2, 4)
                PAIRS_CASE(2, 3)
                PAIRS_CASE(2, 2)
                PAIRS_CASE(2, 1)
                PAIRS_CASE(1, 4)
                PAIRS_CASE(1, 3)
                PAIRS_CASE(1, 2)
                PAIRS_CASE(1, 1)
            default:
                break;
            }
        }
    }
}

#else /* not x86-64: never called (ddp__bf16_gemm_active is never true there) */

bool ddp__bf16_dot_available(void)
{
    return false;
}

void ddp__bf16_pack_tiles(uint16_t *dst, const uint16_t *X, int n, int cols, int ld)
{
    (void)dst, (void)X, (void)n, (void)cols, (void)ld;
}

void ddp__bf16_pack_pairs(uint16_t *dst, const uint16_t *X, int n, int cols, int ld)
{
    (void)dst, (void)X, (void)n, (void)cols, (void)ld;
}

void ddp__bf16_pair_rows(uint16_t *dst, const float *a, const float *b, int n)
{
    (void)dst, (void)a, (void)b, (void)n;
}

void ddp__bf16_scores(int m, int t0, int cols, float alpha, const uint16_t *X, int ldx,
                      const uint16_t *Yt, float *S, int lds)
{
    (void)m, (void)t0, (void)cols, (void)alpha, (void)X, (void)ldx, (void)Yt, (void)S, (void)lds;
}

void ddp__bf16_pairs(int m, int cols, int np, ddp__bf16_causal mode, int off, const uint16_t *A,
                     size_t ars, size_t aps, const uint16_t *Bp, float alpha,
                     const float *rowscale, bool add, float *out, int ldo)
{
    (void)m, (void)cols, (void)np, (void)mode, (void)off, (void)A, (void)ars, (void)aps, (void)Bp;
    (void)alpha, (void)rowscale, (void)add, (void)out, (void)ldo;
}

#endif
