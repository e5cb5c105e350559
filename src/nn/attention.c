/*
 * attention.c — causal multi-head self-attention for the GPT layers of ddp/nn.h, forward and
 * backward, from the c_attn output qkv (B, T, 3C) to the heads' output (B, T, C) before c_proj.
 *
 * Memory: nothing T×T outlives a call. The forward keeps one number per query row, the
 * log-sum-exp of its scores (B, nh, T); the backward recomputes the scores and probabilities
 * block by block from q, k and that log-sum-exp, as flash attention does. A block is
 * DDP_NN_ATTN_BLOCK query rows against every key up to the causal limit of its last row, so each
 * row's softmax is done exactly in two passes (max, then exp and sum) without online rescaling;
 * the forward leaves the probabilities unnormalised and scales the output rows instead (hs
 * multiplies per row, not t). The scratch is one (block × T) matrix forward and two backward.
 * Blocks of 64 measured best: 32 is as fast, 128 and 256 lose to the masked work they add.
 * Every product is a ddp__sgemm on
 * strided views: q, k, v of head h are columns h·hs.. of qkv with leading dimension 3C (nanoGPT's
 * view(B, T, nh, hs).transpose(1, 2) without a copy), and the output of head h is columns h·hs..
 * of out (B, T, C).
 *
 * Attention dropout (nanoGPT's attn_dropout on the probabilities) is supported: each query row
 * takes one key from ddp_nn_rand_u64 and a vectorised 32-bit hash of (key, column) decides each
 * probability, so the backward regenerates the mask instead of storing it. The row loops (exp,
 * softmax backward, mask) are DDP__VEC: an AVX2 clone where the CPU has it.
 *
 * Under bf16 products with a head size that is a multiple of 16 the same blocks run fused (below,
 * "the fused bf16 path"): products in our AVX512_BF16 kernels (kernels/cpu/bf16dot.c) that stop
 * at the causal limit of each group of 4 rows, the softmax rows in AVX-512.
 *
 * What it does not do: skip the masked half of the diagonal block outside the fused path (it is
 * computed, then zeroed), run its own threads (OpenBLAS's run inside each product), or support a
 * non-causal mask.
 */
#include <limits.h>
#include <math.h>

#include "ddp/nn.h"
#include "kernels/kernels.h"
#include "nn/bf16h.h"
#include "nn/vecmath.h"
#include "util/rng.h"
#include "util/util.h"

#define BLK DDP_NN_ATTN_BLOCK

ddp_status ddp_nn_attention_setup(ddp_nn_attention *a, ddp_error *err)
{
    if (a->C <= 0 || a->n_head <= 0 || a->max_T <= 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "attention: n_embd %d, n_head %d and block_size %d must all be positive",
                        a->C, a->n_head, a->max_T);
    if (a->C % a->n_head != 0)
        return ddp__err(err, DDP_ERR_INVALID,
                        "attention: n_embd %d is not a multiple of n_head %d; choose n_head that "
                        "divides n_embd",
                        a->C, a->n_head);
    if (a->C > INT_MAX / 3)
        return ddp__err(err, DDP_ERR_INVALID, "attention: n_embd %d is too large (3·n_embd > %d)",
                        a->C, INT_MAX);
    if (!(a->dropout >= 0.0f && a->dropout < 1.0f))
        return ddp__err(err, DDP_ERR_INVALID,
                        "attention: dropout %g is outside [0, 1); use 0 to turn it off",
                        (double)a->dropout);
    a->head_size = a->C / a->n_head;
    /* float32 blocks and dropout row; in bf16 also the rounded blocks and four heads' operands
     * (bf_part below): (3·BLK + 1)·T + 2·T·hs floats; or the fused path's (fused_part below):
     * (3.5·BLK + 1)·Tp + 5·Tp·hs with Tp = T rounded up to 16 */
    size_t T = (size_t)a->max_T, Tp = (T + 15) & ~(size_t)15, hs = (size_t)a->head_size;
    size_t unfused = (3 * (size_t)BLK + 1) * T + 2 * T * hs;
    size_t fused = (7 * (size_t)BLK / 2 + 1) * Tp + 5 * Tp * hs;
    a->scratch_floats = unfused > fused ? unfused : fused;
    return DDP_OK;
}

/* The attention dropout of one query row: mrow[j] (j < n) = 1/(1 − p) if probability j is kept,
 * else 0. key = ddp_nn_rand_u64(seed, step, the row's index) (one 64-bit hash per row); within the
 * row, j is kept iff fmix32(hi(key) ^ (lo(key) + j·0x9e3779b9)) ≥ p·2³², where fmix32 is
 * MurmurHash3's 32-bit finaliser (a bijection with full avalanche): ddp__rand_u32 in util/rng.h,
 * which CUDA code shares. A call of the 64-bit hash per probability cost more than the softmax;
 * 32-bit integer products vectorise. */
DDP__VEC static void dropout_row(float *mrow, int n, uint64_t key, float p)
{
    uint32_t thresh = (uint32_t)((double)p * 4294967296.0); /* p < 1: fits */
    float keep = 1.0f / (1.0f - p);
    for (int j = 0; j < n; j++)
        mrow[j] = ddp__keep_f32(keep, ddp__rand_u32(key, (uint32_t)j) >= thresh);
}

/* The row helpers below work on a whole row of the block, [0, kend): the n = t + 1 visible keys
 * and the masked ones after them, which get 0. Lanes of 8 run up to the first multiple of 8 at or
 * past n (while that fits in the row) with the causal mask as a select, so short rows need no
 * scalar epilogue; what is left is zeroed, or, only when kend is not a multiple of 8, done one by
 * one. Selects, not branches: the masked lanes compute a throw-away exp of a finite score (or
 * of garbage: the bit mask turns even a NaN into 0). */

/* The first multiple of 8 at or past n, but not past kend rounded down to a multiple of 8. */
static int lanes_end(int n, int kend)
{
    int e = (n + 7) & ~7, k8 = kend & ~7;
    return e < k8 ? e : k8;
}

/* The forward's softmax numerators of one row, in place: row[j] ← e_j = exp(row[j] − mx) for
 * j < n, times mrow[j] when there is a dropout mask (mrow (n,) or NULL), and 0 for n ≤ j < kend.
 * Returns Σ e_j (before dropout) in double. */
DDP__VEC static double exp_row(float *row, int n, int kend, float mx, const float *mrow)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0, e8 = lanes_end(n, kend);
    for (; j < e8; j += 8)
        for (int k = 0; k < 8; k++) {
            float e = ddp__keep_f32(ddp__fast_expf(row[j + k] - mx), j + k < n);
            acc[k] += e;
            row[j + k] = e;
        }
    for (; j < n; j++) { /* only when kend is not a multiple of 8 */
        float e = ddp__fast_expf(row[j] - mx);
        acc[j & 7] += e;
        row[j] = e;
    }
    for (; j < kend; j++)
        row[j] = 0.0f;
    if (mrow)
        for (j = 0; j < n; j++)
            row[j] *= mrow[j];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The backward of one query row, in place. On entry prow holds the scaled scores s_j and drow the
 * gradient of the (dropped) probabilities, for j < kend; lse is the row's log-sum-exp and mrow
 * (n,) its dropout mask or NULL. With p_j = exp(s_j − lse) and g_j = drow_j·mrow_j (the gradient
 * of p_j), for j < n:
 *   drow ← dS_j = p_j·(g_j − Σ_k p_k·g_k),   prow ← p_j·mrow_j (what multiplied v),
 * and 0 in both for n ≤ j < kend. */
DDP__VEC static void softmax_backward_row(float *prow, float *drow, int n, int kend, float lse,
                                          const float *mrow)
{
    if (mrow)
        for (int j = 0; j < n; j++)
            drow[j] *= mrow[j];
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0, e8 = lanes_end(n, kend);
    for (; j < e8; j += 8)
        for (int k = 0; k < 8; k++) {
            float p = ddp__keep_f32(ddp__fast_expf(prow[j + k] - lse), j + k < n);
            float g = ddp__keep_f32(drow[j + k], j + k < n);
            prow[j + k] = p, drow[j + k] = g;
            acc[k] += (double)p * g;
        }
    for (; j < n; j++) { /* only when kend is not a multiple of 8 */
        float p = ddp__fast_expf(prow[j] - lse);
        prow[j] = p;
        acc[j & 7] += (double)p * drow[j];
    }
    for (int z = j; z < kend; z++)
        prow[z] = 0.0f, drow[z] = 0.0f;
    float D =
        (float)(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
    for (int z = 0; z < j; z++) /* masked lanes: 0·(0 − D) = 0 */
        drow[z] = prow[z] * (drow[z] - D);
    if (mrow)
        for (j = 0; j < n; j++)
            prow[j] *= mrow[j];
}

/* ---- operands in float32 or bfloat16 -------------------------------------------------------- *
 * With bf16 products active (precision bf16: ddp__gemm_bf16_active), each head's q, k, v (and the
 * backward's dout) are rounded to bfloat16 once per head, and the probability and dS rows once as
 * they are made, while they are in cache: ddp__sgemm would round its operands again on every
 * product (k and v once per block of queries). Same roundings, same products: the results are
 * those of ddp__sgemm in bf16. In float32 the operands are strided views of qkv, as always. */

typedef struct opnd {
    const float *f;    /* float32, or NULL */
    const uint16_t *h; /* bfloat16, when f is NULL */
    int ld;
} opnd;

static opnd at(opnd o, size_t off)
{
    return o.f ? (opnd){o.f + off, NULL, o.ld} : (opnd){NULL, o.h + off, o.ld};
}

/* ddp__sgemm on two operands of the same kind. */
static void mm(bool ta, bool tb, int M, int N, int K, float alpha, opnd A, opnd B, float beta,
               float *C, int ldc)
{
    if (A.f)
        ddp__sgemm(ta, tb, M, N, K, alpha, A.f, A.ld, B.f, B.ld, beta, C, ldc);
    else
        ddp__gemm_bf16_pre(ta, tb, M, N, K, alpha, A.h, A.ld, B.h, B.ld, beta, C, ldc);
}

/* The rows × hs matrix at src (leading dimension ld) as an operand: src itself in float32, or
 * rounded and packed into *buf (advanced past it) in bf16. */
static opnd head(const float *src, int rows, int hs, int ld, bool bf, uint16_t **buf)
{
    if (!bf)
        return (opnd){src, NULL, ld};
    uint16_t *d = *buf;
    for (int r = 0; r < rows; r++)
        ddp__bf16_round(d + (size_t)r * hs, src + (size_t)r * ld, hs);
    *buf += (size_t)rows * hs;
    return (opnd){NULL, d, hs};
}

/* A block's row i of probabilities (or dS) as the operand of the next product: the float32 block
 * itself, or its row rounded into the bf16 block hb (same leading dimension) as soon as it is
 * final. */
static void row_done(uint16_t *hb, const float *row, int i, int ld, int n)
{
    if (hb)
        ddp__bf16_round(hb + (size_t)i * ld, row, n);
}

/* The scratch: fp32 blocks (nblk of BLK × T), the dropout row (T), then in bf16 the rounded
 * blocks (nblk of BLK × T halves) and the heads' operands (4 of T × hs halves). */
static uint16_t *bf_part(const ddp_nn_attention *a, float *scratch)
{
    return (uint16_t *)(scratch + (2 * (size_t)BLK + 1) * (size_t)a->max_T);
}

#define HBLK(a) ((size_t)BLK * (size_t)(a)->max_T) /* halves in one rounded block */

/* Head h's q (then k at +C, v at +2C) of sample b: from qkv rounded per head into *buf, or
 * straight from qkvh, already bfloat16 (a strided operand, nothing copied). */
static opnd qkv_head(const float *qkv, const uint16_t *qkvh, size_t off, int T, int hs, int C3,
                     bool bf, uint16_t **buf)
{
    if (qkvh)
        return (opnd){NULL, qkvh + off, C3};
    return head(qkv + off, T, hs, C3, bf, buf);
}

/* ---- the fused bf16 path -------------------------------------------------------------------- *
 * Under bf16 products, with a head size that is a multiple of 16 (kernels/cpu/bf16dot.c): the
 * same blocks, row passes and roundings as above, but the products run in our own AVX512_BF16
 * kernels on operands packed once per head, and stop at each group of 4 rows' causal limit
 * (oneDNN computes the masked half of the diagonal block; 15% of the work at T = 256). The
 * backward adds dK and dV straight into dqkv, last block first (it overwrites), dK scaled per
 * block as before. Every value a product reads past a row's causal limit is a written 0 (the
 * kernels' UPPER and LOWER ranges include such pairs). Results: the same roundings to bfloat16,
 * float32 sums in another (fixed) order than oneDNN's and exp in fused multiply-adds, so not
 * the oneDNN path's bits (test_transformer holds both to one reference). */

static bool fused_ok(const ddp_nn_attention *a, bool bf)
{
    return bf && a->head_size % 16 == 0 && ddp__bf16_dot_available();
}

/* The fused path's scratch, for T ≤ max_T keys: ldS = T rounded up to 16. */
typedef struct fused_part {
    int ldS;
    float *S, *dP, *mrow; /* BLK × ldS, BLK × ldS, ldS */
    uint16_t *rows;       /* BLK × ldS: P (forward) or dS (backward) rounded, row-major */
    uint16_t *PdT, *dST;  /* BLK/2 pairs of rows interleaved (ddp__bf16_pair_rows), 2·ldS each */
    uint16_t *Kt, *Vt, *Vp, *Kp, *Qp, *dOp; /* packed operands, ldS·hs halves each */
    uint16_t *heads; /* q, k, v, dout rounded per head (the float32 entry points): 4·ldS·hs */
} fused_part;

static fused_part fused_part_of(const ddp_nn_attention *a, float *scratch, int T)
{
    fused_part f;
    size_t Tp = ((size_t)T + 15) & ~(size_t)15, hs = (size_t)a->head_size, blk = BLK * Tp;
    f.ldS = (int)Tp;
    f.S = scratch;
    f.dP = f.S + blk;
    f.mrow = f.dP + blk;
    f.rows = (uint16_t *)(f.mrow + Tp);
    f.PdT = f.rows + blk;
    f.dST = f.PdT + blk;
    f.Kt = f.dST + blk;
    f.Vt = f.Kt + Tp * hs;
    f.Vp = f.Vt + Tp * hs;
    f.Kp = f.Vp + Tp * hs;
    f.Qp = f.Kp + Tp * hs;
    f.dOp = f.Qp + Tp * hs;
    f.heads = f.dOp + Tp * hs;
    return f;
}

/* Head h of sample b's q, k, v (rounded into *heads when qkvh is NULL): qkv_head on each. */
static void head_qkv(const ddp_nn_attention *a, const float *qkv, const uint16_t *qkvh, int b,
                     int h, int T, uint16_t **heads, opnd qkv3[3])
{
    const int C = a->C, hs = a->head_size, C3 = 3 * a->C;
    const size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
    for (int w = 0; w < 3; w++)
        qkv3[w] = qkv_head(qkv, qkvh, qo + (size_t)w * C, T, hs, C3, true, heads);
}

static void fused_forward(const ddp_nn_attention *a, const float *qkv, const uint16_t *qkvh, int B,
                          int T, uint64_t seed, uint64_t step, uint64_t offset, bool train,
                          float *scratch, float *out, float *lse)
{
    const int C = a->C, nh = a->n_head, hs = a->head_size;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const bool drop = train && a->dropout > 0.0f;
    fused_part f = fused_part_of(a, scratch, T);
    const int ldS = f.ldS;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            uint16_t *hb = f.heads;
            opnd x[3];
            head_qkv(a, qkv, qkvh, b, h, T, &hb, x);
            const opnd Q = x[0], K = x[1], V = x[2];
            ddp__bf16_pack_tiles(f.Kt, K.h, T, hs, K.ld);
            ddp__bf16_pack_pairs(f.Vp, V.h, T, hs, V.ld);
            float *O = out + (size_t)b * T * C + (size_t)h * hs;
            size_t bh = (size_t)b * nh + h;
            for (int r0 = 0; r0 < T; r0 += BLK) {
                int nr = T - r0 < BLK ? T - r0 : BLK, kend = r0 + nr;
                ddp__bf16_scores(nr, r0, hs, scale, Q.h + (size_t)r0 * Q.ld, Q.ld, f.Kt, f.S, ldS);
                float inv[BLK];
                for (int i = 0; i < nr; i++) {
                    int t = r0 + i, nv = t + 1;
                    float *row = f.S + (size_t)i * ldS, mx;
                    if (drop)
                        dropout_row(f.mrow, nv, ddp_nn_rand_u64(seed, step, offset + bh * T + t),
                                    a->dropout);
                    double sum = ddp__bf16_softmax_row(f.rows + (size_t)i * ldS, row, nv, kend,
                                                       drop ? f.mrow : NULL, &mx);
                    inv[i] = (float)(1.0 / sum);
                    if (lse)
                        lse[bh * T + t] = (float)(mx + log(sum));
                }
                /* O[r0 : kend] = (P · V) / Σ, row by row */
                ddp__bf16_pairs(nr, hs, (kend + 1) / 2, DDP__BF16_LOWER, r0, f.rows,
                                (size_t)ldS / 2, 1, f.Vp, 1.0f, inv, false, O + (size_t)r0 * C, C);
            }
        }
}

static void fused_backward(const ddp_nn_attention *a, const float *dout, const float *qkv,
                           const uint16_t *qkvh, const float *lse, int B, int T, uint64_t seed,
                           uint64_t step, uint64_t offset, bool train, float *scratch, float *dqkv)
{
    const int C = a->C, nh = a->n_head, hs = a->head_size, C3 = 3 * a->C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const bool drop = train && a->dropout > 0.0f;
    fused_part f = fused_part_of(a, scratch, T);
    const int ldS = f.ldS;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            uint16_t *hb = f.heads;
            opnd x[3];
            head_qkv(a, qkv, qkvh, b, h, T, &hb, x);
            const opnd Q = x[0], K = x[1], V = x[2],
                       dO = head(dout + (size_t)b * T * C + (size_t)h * hs, T, hs, C, true, &hb);
            ddp__bf16_pack_tiles(f.Kt, K.h, T, hs, K.ld);
            ddp__bf16_pack_tiles(f.Vt, V.h, T, hs, V.ld);
            ddp__bf16_pack_pairs(f.Kp, K.h, T, hs, K.ld);
            ddp__bf16_pack_pairs(f.Qp, Q.h, T, hs, Q.ld);
            ddp__bf16_pack_pairs(f.dOp, dO.h, T, hs, dO.ld);
            float *dQ = dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dK = dQ + C, *dV = dQ + 2 * C;
            size_t bh = (size_t)b * nh + h;
            /* Last block first: it sees every key, so its products overwrite dK and dV and the
             * earlier blocks add to them; no zeroing pass. */
            for (int r0 = (T - 1) / BLK * BLK; r0 >= 0; r0 -= BLK) {
                int nr = T - r0 < BLK ? T - r0 : BLK, kend = r0 + nr, npq = (nr + 1) / 2;
                bool add = kend < T;
                /* P ← S = scale · Q_b · Kᵀ, and dP ← dO_b · Vᵀ */
                ddp__bf16_scores(nr, r0, hs, scale, Q.h + (size_t)r0 * Q.ld, Q.ld, f.Kt, f.S, ldS);
                ddp__bf16_scores(nr, r0, hs, 1.0f, dO.h + (size_t)r0 * dO.ld, dO.ld, f.Vt, f.dP,
                                 ldS);
                for (int i = 0; i < nr; i++) {
                    int t = r0 + i, nv = t + 1;
                    float *prow = f.S + (size_t)i * ldS, *drow = f.dP + (size_t)i * ldS;
                    if (drop)
                        dropout_row(f.mrow, nv, ddp_nn_rand_u64(seed, step, offset + bh * T + t),
                                    a->dropout);
                    ddp__bf16_softmax_backward_row(prow, drow, nv, kend, lse[bh * T + t],
                                                   drop ? f.mrow : NULL, f.rows + (size_t)i * ldS);
                }
                for (int i = 0; i < nr; i += 2) {
                    const float *p1 = f.S + (size_t)i * ldS, *d1 = f.dP + (size_t)i * ldS;
                    bool two = i + 1 < nr;
                    ddp__bf16_pair_rows(f.PdT + (size_t)i * ldS, p1, two ? p1 + ldS : NULL, kend);
                    ddp__bf16_pair_rows(f.dST + (size_t)i * ldS, d1, two ? d1 + ldS : NULL, kend);
                }
                /* dV[0 : kend] += P_droppedᵀ · dO_b;  dK[0 : kend] += scale · dSᵀ · Q_b;
                 * dQ_b = scale · dS · K */
                ddp__bf16_pairs(kend, hs, npq, DDP__BF16_UPPER, -r0, f.PdT, 1, (size_t)ldS,
                                f.dOp + (size_t)r0 * hs, 1.0f, NULL, add, dV, C3);
                ddp__bf16_pairs(kend, hs, npq, DDP__BF16_UPPER, -r0, f.dST, 1, (size_t)ldS,
                                f.Qp + (size_t)r0 * hs, scale, NULL, add, dK, C3);
                ddp__bf16_pairs(nr, hs, (kend + 1) / 2, DDP__BF16_LOWER, r0, f.rows,
                                (size_t)ldS / 2, 1, f.Kp, scale, NULL, false, dQ + (size_t)r0 * C3,
                                C3);
            }
        }
}

static void attention_forward(const ddp_nn_attention *a, const float *qkv, const uint16_t *qkvh,
                              int B, int T, uint64_t seed, uint64_t step, uint64_t offset,
                              bool train, float *scratch, float *out, float *lse)
{
    const int C = a->C, nh = a->n_head, hs = a->head_size, C3 = 3 * a->C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const bool drop = train && a->dropout > 0.0f, bf = qkvh || ddp__gemm_bf16_active();
    float *S = scratch, *mrow = scratch + (size_t)BLK * T;
    uint16_t *Sh = bf ? bf_part(a, scratch) : NULL, *heads = bf_part(a, scratch) + 2 * HBLK(a);
    if (T <= 0)
        return;
    if (fused_ok(a, bf)) {
        fused_forward(a, qkv, qkvh, B, T, seed, step, offset, train, scratch, out, lse);
        return;
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
            uint16_t *hb = heads;
            opnd Q = qkv_head(qkv, qkvh, qo, T, hs, C3, bf, &hb),
                 K = qkv_head(qkv, qkvh, qo + C, T, hs, C3, bf, &hb),
                 V = qkv_head(qkv, qkvh, qo + 2 * C, T, hs, C3, bf, &hb);
            float *O = out + (size_t)b * T * C + (size_t)h * hs;
            size_t bh = (size_t)b * nh + h;
            for (int r0 = 0; r0 < T; r0 += BLK) {
                int nr = T - r0 < BLK ? T - r0 : BLK, kend = r0 + nr, ld = kend;
                /* S (nr, kend) = scale · Q[r0 : kend] · K[0 : kend]ᵀ */
                mm(false, true, nr, kend, hs, scale, at(Q, (size_t)r0 * Q.ld), K, 0.0f, S, ld);
                float inv[BLK]; /* 1 / Σ exp per row: applied to O, not to P */
                for (int i = 0; i < nr; i++) {
                    int t = r0 + i, nv = t + 1; /* keys 0..t are visible to query t */
                    float *row = S + (size_t)i * ld;
                    float mx = ddp__max_f32(row, nv);
                    if (drop)
                        dropout_row(mrow, nv, ddp_nn_rand_u64(seed, step, offset + bh * T + t),
                                    a->dropout);
                    double sum = exp_row(row, nv, kend, mx, drop ? mrow : NULL);
                    row_done(Sh, row, i, ld, kend);
                    inv[i] = (float)(1.0 / sum);
                    if (lse)
                        lse[bh * T + t] = (float)(mx + log(sum));
                }
                /* O[r0 : kend] (nr, hs) = P (nr, kend) · V[0 : kend] */
                opnd P = bf ? (opnd){NULL, Sh, ld} : (opnd){S, NULL, ld};
                mm(false, false, nr, hs, kend, 1.0f, P, V, 0.0f, O + (size_t)r0 * C, C);
                for (int i = 0; i < nr; i++) {
                    float *o = O + (size_t)(r0 + i) * C;
                    for (int e = 0; e < hs; e++)
                        o[e] *= inv[i];
                }
            }
        }
}

void ddp_nn_attention_forward(const ddp_nn_attention *a, const float *qkv, int B, int T,
                              uint64_t seed, uint64_t step, uint64_t offset, bool train,
                              float *scratch, float *out, float *lse)
{
    attention_forward(a, qkv, NULL, B, T, seed, step, offset, train, scratch, out, lse);
}

void ddp__nn_attention_forward_h(const ddp_nn_attention *a, const uint16_t *qkvh, int B, int T,
                                 uint64_t seed, uint64_t step, uint64_t offset, bool train,
                                 float *scratch, float *out, float *lse)
{
    attention_forward(a, NULL, qkvh, B, T, seed, step, offset, train, scratch, out, lse);
}

/* Generation's step (ddp_nn_attention_forward_cached): query rows t0 … T − 1 of one sequence
 * against its keys and values 0 … t, row by row. Per head a score row (a dot of hs per key), its
 * softmax numerators (exp_row, as the forward's), then the output as Σ p_j · v_j (an axpy per key,
 * contiguous in hs), scaled by 1 / Σ p_j as the forward scales its rows. bf: the numerators are
 * rounded to bfloat16 first, as the forward's P operand is under bf16 products (q, k and v are
 * the caller's, already rounded then). */
static void attention_cached(const ddp_nn_attention *a, const float *qkv, int t0, int T, bool bf,
                             float *scratch, float *out)
{
    const int C = a->C, nh = a->n_head, hs = a->head_size, C3 = 3 * a->C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    float *S = scratch;
    uint16_t *Sh = (uint16_t *)(scratch + T);
    for (int t = t0; t < T; t++) {
        const int nv = t + 1;
        for (int h = 0; h < nh; h++) {
            const float *q = qkv + (size_t)t * C3 + (size_t)h * hs;
            for (int j = 0; j < nv; j++) {
                const float *k = qkv + (size_t)j * C3 + C + (size_t)h * hs;
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                int e = 0;
                for (; e + 8 <= hs; e += 8)
                    for (int l = 0; l < 8; l++)
                        acc[l] += q[e + l] * k[e + l];
                for (; e < hs; e++)
                    acc[e & 7] += q[e] * k[e];
                S[j] = scale * (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                                ((acc[4] + acc[5]) + (acc[6] + acc[7])));
            }
            double sum = exp_row(S, nv, nv, ddp__max_f32(S, nv), NULL);
            if (bf) {
                ddp__bf16_round(Sh, S, nv);
                ddp__to_f32(S, Sh, (size_t)nv, DDP_BFLOAT16);
            }
            float *o = out + (size_t)(t - t0) * C + (size_t)h * hs;
            for (int e = 0; e < hs; e++)
                o[e] = 0.0f;
            for (int j = 0; j < nv; j++) {
                const float *v = qkv + (size_t)j * C3 + 2 * (size_t)C + (size_t)h * hs;
                const float p = S[j];
                for (int e = 0; e < hs; e++)
                    o[e] += p * v[e];
            }
            const float inv = (float)(1.0 / sum);
            for (int e = 0; e < hs; e++)
                o[e] *= inv;
        }
    }
}

void ddp_nn_attention_forward_cached(const ddp_nn_attention *a, const float *qkv, int t0, int T,
                                     float *scratch, float *out)
{
    if (t0 >= 0 && t0 < T && T <= a->max_T)
        attention_cached(a, qkv, t0, T, ddp__gemm_bf16_active(), scratch, out);
}

void ddp__nn_attention_forward_cached_h(const ddp_nn_attention *a, const float *qkv, int t0, int T,
                                        float *scratch, float *out)
{
    if (t0 >= 0 && t0 < T && T <= a->max_T)
        attention_cached(a, qkv, t0, T, true, scratch, out);
}

static void attention_backward(const ddp_nn_attention *a, const float *dout, const float *qkv,
                               const uint16_t *qkvh, const float *lse, int B, int T, uint64_t seed,
                               uint64_t step, uint64_t offset, bool train, float *scratch,
                               float *dqkv)
{
    const int C = a->C, nh = a->n_head, hs = a->head_size, C3 = 3 * a->C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const bool drop = train && a->dropout > 0.0f, bf = qkvh || ddp__gemm_bf16_active();
    float *P = scratch, *dP = scratch + (size_t)BLK * T, *mrow = scratch + (size_t)2 * BLK * T;
    uint16_t *Ph = bf ? bf_part(a, scratch) : NULL, *dPh = Ph ? Ph + HBLK(a) : NULL;
    uint16_t *heads = bf_part(a, scratch) + 2 * HBLK(a);
    if (T <= 0)
        return;
    if (fused_ok(a, bf)) {
        fused_backward(a, dout, qkv, qkvh, lse, B, T, seed, step, offset, train, scratch, dqkv);
        return;
    }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
            uint16_t *hb = heads;
            opnd Q = qkv_head(qkv, qkvh, qo, T, hs, C3, bf, &hb),
                 K = qkv_head(qkv, qkvh, qo + C, T, hs, C3, bf, &hb),
                 V = qkv_head(qkv, qkvh, qo + 2 * C, T, hs, C3, bf, &hb),
                 dO = head(dout + (size_t)b * T * C + (size_t)h * hs, T, hs, C, bf, &hb);
            float *dQ = dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dK = dQ + C, *dV = dQ + 2 * C;
            size_t bh = (size_t)b * nh + h;
            /* Last block first: it sees every key, so its products overwrite dK and dV (beta 0)
             * and the earlier blocks add to them; no zeroing pass. */
            for (int r0 = (T - 1) / BLK * BLK; r0 >= 0; r0 -= BLK) {
                int nr = T - r0 < BLK ? T - r0 : BLK, kend = r0 + nr, ld = kend;
                float beta = kend == T ? 0.0f : 1.0f;
                opnd Qb = at(Q, (size_t)r0 * Q.ld), dOb = at(dO, (size_t)r0 * dO.ld);
                /* P ← S = scale · Q_b · Kᵀ, and dP ← dO_b · Vᵀ (the gradient of the dropped P) */
                mm(false, true, nr, kend, hs, scale, Qb, K, 0.0f, P, ld);
                mm(false, true, nr, kend, hs, 1.0f, dOb, V, 0.0f, dP, ld);
                for (int i = 0; i < nr; i++) {
                    int t = r0 + i, nv = t + 1;
                    float *prow = P + (size_t)i * ld, *drow = dP + (size_t)i * ld;
                    if (drop)
                        dropout_row(mrow, nv, ddp_nn_rand_u64(seed, step, offset + bh * T + t),
                                    a->dropout);
                    softmax_backward_row(prow, drow, nv, kend, lse[bh * T + t], drop ? mrow : NULL);
                    row_done(Ph, prow, i, ld, kend);
                    row_done(dPh, drow, i, ld, kend);
                }
                /* dV[0 : kend] += P_droppedᵀ · dO_b;  dQ_b = scale · dS · K;
                 * dK[0 : kend] += scale · dSᵀ · Q_b */
                opnd Pd = bf ? (opnd){NULL, Ph, ld} : (opnd){P, NULL, ld};
                opnd dS = bf ? (opnd){NULL, dPh, ld} : (opnd){dP, NULL, ld};
                mm(true, false, kend, hs, nr, 1.0f, Pd, dOb, beta, dV, C3);
                mm(false, false, nr, hs, kend, scale, dS, K, 0.0f, dQ + (size_t)r0 * C3, C3);
                mm(true, false, kend, hs, nr, scale, dS, Qb, beta, dK, C3);
            }
        }
}

void ddp_nn_attention_backward(const ddp_nn_attention *a, const float *dout, const float *qkv,
                               const float *lse, int B, int T, uint64_t seed, uint64_t step,
                               uint64_t offset, bool train, float *scratch, float *dqkv)
{
    attention_backward(a, dout, qkv, NULL, lse, B, T, seed, step, offset, train, scratch, dqkv);
}

void ddp__nn_attention_backward_h(const ddp_nn_attention *a, const float *dout,
                                  const uint16_t *qkvh, const float *lse, int B, int T,
                                  uint64_t seed, uint64_t step, uint64_t offset, bool train,
                                  float *scratch, float *dqkv)
{
    attention_backward(a, dout, NULL, qkvh, lse, B, T, seed, step, offset, train, scratch, dqkv);
}
