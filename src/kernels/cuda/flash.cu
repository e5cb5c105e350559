/*
 * kernels/cuda/flash.cu — fused causal self-attention, FlashAttention-2 style: no (T, T) matrix
 * in memory. q, k, v are read straight from qkv (B, T, 3C) and the gradients written straight
 * into dqkv (B, T, 3C); the forward keeps the per-row logsumexp (B, nh, T) fp32 for the backward.
 *
 * Forward: one thread block per (batch·head, block of BR queries); it streams key/value tiles of
 * BC rows up to the causal limit with the online softmax (running max and sum in fp32), and
 * writes out (B, T, C) and the logsumexp. Backward, deterministic (every output element is
 * summed by one thread block in a fixed order, no atomics): a pass for D = rowsum(dO ∘ O); one
 * kernel per key block for dK and dV (looping over the query blocks at or after it), one per
 * query block for dQ (looping over the key blocks up to the causal limit); both recompute
 * P = exp(S·scale − lse) and dS = P ∘ (dP − D)·scale from the tiles.
 *
 * Dropout on the probabilities (drop->p > 0), standard FA2 dropout with the CPU's and the batched
 * path's masks (dropout.cuh: row r of the B·nh·T rows keys a hash, column j decides; the keys of a
 * tile's rows in shared memory, the decisions made inline, no mask stored): out = (M ∘ P)·V with
 * P normalized before dropout (the forward's running sum over the undropped exps, so lse is the
 * same as without dropout) and M 1/(1 − p) or 0 per element; the backward draws M again: dV from
 * M ∘ P, dP' = M ∘ dP in dS = P ∘ (dP' − D)·scale, and D = rowsum(dO ∘ O) is still Σ_j P·dP'.
 *
 * Element type E: float (the reference-precision path: plain FMA products over shared-memory
 * tiles), or a 16-bit format (ddp__bf16 / ddp__fp16) whose products go through tensor cores
 * (nvcuda::wmma 16×16×16, fp32 accumulation). 16-bit roundings as attention.cu's batched path:
 * scores, softmax statistics and dP in fp32; P rounded to 16 bits for the P·V product and for
 * dS (which uses the rounded P, as the batched path's kept P); dS rounded to 16 bits for the dQ
 * and dK products; out, dq, dk, dv rounded once where stored. With dropout the backward's dropped
 * P (dV's operand) is the rounded P times M, rounded again, as the batched path's causal_dropout
 * of its kept P; dP' = dP·M in fp32 as its softmax backward. Differences: the forward's P is the
 * unnormalized exp(s − running max), times M with dropout, rounded once, then divided by the
 * fp32 row sum at the end, where the batched path rounds the normalized probability (and with
 * dropout rounds it again after the scaling by M).
 *
 * Head sizes 32, 64 and 128 (ddp__cuda_flash_supported); every tile fits the default 48 KiB of
 * shared memory (static_asserts), so no opt-in attribute. 128 threads (4 warps) per block.
 * UNVERIFIED on a GPU: compiled, never run on one (docs/gpu.md). The kernels' logic (indexing,
 * causal masks, partial tiles, online softmax, dropout masks, barrier order) runs on the CPU in
 * unit.flash_emu (tests/emu: this file's kernels unchanged under a small CUDA emulation, wmma as
 * documented), with dropout against the product's CPU attention (src/nn/attention.c).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <type_traits>

#include "common.cuh"
#include "dropout.cuh"

namespace
{

constexpr int NT = 128; /* threads per block */
constexpr int NW = NT / 32;
constexpr size_t SMEM_MAX = 48 * 1024;

/* The wmma element type of a 16-bit format. */
template <typename E> struct wmma_t;
template <> struct wmma_t<ddp__bf16> {
    typedef __nv_bfloat16 type;
};
template <> struct wmma_t<ddp__fp16> {
    typedef __half type;
};

constexpr size_t up128(size_t b)
{
    return (b + 127) / 128 * 128;
}

/* Tile shapes and shared-memory layout. BR query rows, BC key rows per tile; LD the leading
 * dimension of the (rows, HS) tiles of E (16-bit: HS + 8, a multiple of 8 elements whose 16-row
 * steps are 32-byte aligned, as wmma wants; fp32: HS + 4), LS of the fp32 (BR, BC) score tiles,
 * LP of the 16-bit (BR, BC) P / dS tiles, LO of the fp32 (rows, HS) accumulators. Every region
 * starts on a 128-byte boundary. */
template <typename E, int HS> struct cfg {
    static constexpr bool H = sizeof(E) == 2;
    static constexpr int LD = HS + (H ? 8 : 4);
    static constexpr int LO = HS + 4;
    /* forward */
    static constexpr int FBR = H ? (HS <= 64 ? 64 : 32) : 32;
    static constexpr int FBC = H ? 32 : (HS <= 64 ? 32 : 16);
    static constexpr int FLS = FBC + 4, FLP = FBC + 8;
    static constexpr size_t F_Q = 0;
    static constexpr size_t F_KV = F_Q + up128(sizeof(E) * FBR * LD);
    static constexpr size_t F_S = F_KV + up128(sizeof(E) * FBC * LD);
    static constexpr size_t F_P = F_S + up128(sizeof(float) * FBR * FLS);
    static constexpr size_t F_O = F_P + (H ? up128(sizeof(E) * FBR * FLP) : 0);
    static constexpr size_t F_M = F_O + up128(sizeof(float) * FBR * LO);
    static constexpr size_t F_L = F_M + up128(sizeof(float) * FBR);
    static constexpr size_t F_KEY = F_L + up128(sizeof(float) * FBR);
    static constexpr size_t F_END = F_KEY + up128(sizeof(uint64_t) * FBR);
    /* backward (both kernels; the accumulator region holds dK and dV, or dQ) */
    static constexpr int BBR = H ? (HS <= 32 ? 32 : 16) : (HS <= 32 ? 32 : HS <= 64 ? 16 : 8);
    static constexpr int BBC = H ? (HS <= 64 ? 32 : 16) : (HS <= 32 ? 32 : 16);
    static constexpr int BLS = BBC + 4, BLP = BBC + 8;
    static constexpr int ACC_ROWS = 2 * BBC > BBR ? 2 * BBC : BBR;
    static constexpr size_t B_K = 0;
    static constexpr size_t B_V = B_K + up128(sizeof(E) * BBC * LD);
    static constexpr size_t B_Q = B_V + up128(sizeof(E) * BBC * LD);
    static constexpr size_t B_DO = B_Q + up128(sizeof(E) * BBR * LD);
    static constexpr size_t B_S = B_DO + up128(sizeof(E) * BBR * LD);
    static constexpr size_t B_DP = B_S + up128(sizeof(float) * BBR * BLS);
    static constexpr size_t B_P = B_DP + up128(sizeof(float) * BBR * BLS);
    static constexpr size_t B_DS = B_P + (H ? up128(sizeof(E) * BBR * BLP) : 0);
    static constexpr size_t B_ACC = B_DS + (H ? up128(sizeof(E) * BBR * BLP) : 0);
    static constexpr size_t B_LSE = B_ACC + up128(sizeof(float) * ACC_ROWS * LO);
    static constexpr size_t B_D = B_LSE + up128(sizeof(float) * BBR);
    static constexpr size_t B_KEY = B_D + up128(sizeof(float) * BBR);
    static constexpr size_t B_END = B_KEY + up128(sizeof(uint64_t) * BBR);

    static_assert(HS % 16 == 0, "head size a multiple of 16");
    static_assert(!H || (FBR % 16 == 0 && FBC % 16 == 0 && BBR % 16 == 0 && BBC % 16 == 0),
                  "wmma tiles are 16 × 16");
    static_assert(F_END <= SMEM_MAX && B_END <= SMEM_MAX, "tiles within 48 KiB of shared memory");
};

/* C (M, N) fp32 (leading dimension ldc) = (acc ? C : 0) + op(A) · op(B), every operand in shared
 * memory: op(A)[m][k] = TA ? A[k·lda + m] : A[m·lda + k], op(B)[k][n] = TB ? B[n·ldb + k] :
 * B[k·ldb + n]. The whole block calls it; the caller synchronizes before (inputs written) and
 * after (C read or inputs overwritten). fp32: one thread per output element, the k sum in order
 * then added to C. 16-bit: wmma 16×16×16 tiles, round-robin over the warps (each output tile
 * owned by one warp), fp32 accumulation. */
template <typename E, int M, int N, int K, bool TA, bool TB>
__device__ __forceinline__ void block_mm(const E *A, int lda, const E *B, int ldb, float *C,
                                         int ldc, bool acc)
{
    if constexpr (std::is_same<E, float>::value) {
        for (int idx = threadIdx.x; idx < M * N; idx += NT) {
            const int m = idx / N, n = idx % N;
            float s = 0.0f;
#pragma unroll 8
            for (int k = 0; k < K; k++) {
                const float a = TA ? A[k * lda + m] : A[m * lda + k];
                const float b = TB ? B[n * ldb + k] : B[k * ldb + n];
                s = fmaf(a, b, s);
            }
            C[m * ldc + n] = acc ? C[m * ldc + n] + s : s;
        }
    } else {
        using namespace nvcuda;
        typedef typename wmma_t<E>::type W;
        typedef typename std::conditional<TA, wmma::col_major, wmma::row_major>::type LA;
        typedef typename std::conditional<TB, wmma::col_major, wmma::row_major>::type LB;
        const W *a = reinterpret_cast<const W *>(A);
        const W *b = reinterpret_cast<const W *>(B);
        const int warp = threadIdx.x / 32;
        constexpr int TM = M / 16, TN = N / 16;
        for (int t = warp; t < TM * TN; t += NW) {
            const int m0 = (t / TN) * 16, n0 = (t % TN) * 16;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
            if (acc)
                wmma::load_matrix_sync(c, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
            else
                wmma::fill_fragment(c, 0.0f);
#pragma unroll
            for (int k0 = 0; k0 < K; k0 += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, W, LA> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, W, LB> fb;
                wmma::load_matrix_sync(fa, TA ? a + k0 * lda + m0 : a + m0 * lda + k0, lda);
                wmma::load_matrix_sync(fb, TB ? b + n0 * ldb + k0 : b + k0 * ldb + n0, ldb);
                wmma::mma_sync(c, fa, fb, c);
            }
            wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
        }
    }
}

/* dst (rows, HS) (leading dimension ld) = rows r0 … r0 + rows − 1 of the head's columns at src
 * (a row every `stride` elements), zeros for rows ≥ T. A plain copy: E's bits as they are. */
template <typename E, int HS>
__device__ __forceinline__ void load_rows(E *dst, int ld, const E *src, size_t stride, int r0,
                                          int rows, int T)
{
    for (int idx = threadIdx.x; idx < rows * HS; idx += NT) {
        const int r = idx / HS, d = idx % HS;
        dst[r * ld + d] = r0 + r < T ? src[(size_t)(r0 + r) * stride + d] : E{};
    }
}

template <typename E, int HS>
__global__ void __launch_bounds__(NT)
    flash_fwd(const E *__restrict__ qkv, E *__restrict__ out, float *__restrict__ lse, int T,
              int nh, float scale, ddp__drop_dev dr)
{
    typedef cfg<E, HS> K;
    constexpr int BR = K::FBR, BC = K::FBC, LD = K::LD, LS = K::FLS, LO = K::LO;
    constexpr int LP = K::H ? K::FLP : K::FLS;
    extern __shared__ __align__(128) unsigned char smem[];
    E *sq = reinterpret_cast<E *>(smem + K::F_Q);
    E *skv = reinterpret_cast<E *>(smem + K::F_KV);
    float *ss = reinterpret_cast<float *>(smem + K::F_S);
    /* P: its own 16-bit tile, or over the fp32 scores in place */
    E *sp = reinterpret_cast<E *>(smem + (K::H ? K::F_P : K::F_S));
    float *so = reinterpret_cast<float *>(smem + K::F_O);
    float *sm = reinterpret_cast<float *>(smem + K::F_M);
    float *sl = reinterpret_cast<float *>(smem + K::F_L);
    uint64_t *skey = reinterpret_cast<uint64_t *>(smem + K::F_KEY); /* dropout: the rows' keys */

    const int bh = blockIdx.x, b = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y; /* the longest causal rows first */
    const int q0 = qt * BR, C = nh * HS;
    const size_t row3 = 3 * (size_t)C;
    const E *base = qkv + (size_t)b * T * row3 + (size_t)h * HS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    load_rows<E, HS>(sq, LD, base, row3, q0, BR, T);
    for (int idx = threadIdx.x; idx < BR * LO; idx += NT)
        so[idx] = 0.0f;
    for (int r = threadIdx.x; r < BR; r += NT) {
        sm[r] = -INFINITY;
        sl[r] = 0.0f;
        skey[r] = dr.on && q0 + r < T ? ddp__drop_row_key(dr, (size_t)bh * T + q0 + r) : 0;
    }
    const int qend = min(q0 + BR, T);    /* q0 < T: the grid has ceil(T / BR) query tiles */
    const int nkt = (qend - 1) / BC + 1; /* key tiles covering keys 0 … qend − 1 */
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        __syncthreads(); /* the previous tile's P·V has read skv and sp */
        load_rows<E, HS>(skv, LD, base + C, row3, k0, BC, T);
        __syncthreads();
        block_mm<E, BR, BC, HS, false, true>(sq, LD, skv, LD, ss, LS, false); /* S = Q Kᵀ */
        __syncthreads();
        load_rows<E, HS>(skv, LD, base + 2 * (size_t)C, row3, k0, BC, T); /* V over K */
        /* the online softmax, a warp per row: the new max, P = exp(s − max) (0 where masked),
         * the running sum (of P before dropout), and the row of O rescaled by exp(old max − new
         * max); with dropout P·V takes P masked and scaled (dropout.cuh: 1/(1 − p) or 0) */
        for (int r = warp; r < BR; r += NW) {
            const int i = q0 + r;
            const bool rv = i < T;
            const float mo = sm[r], lo = sl[r];
            float mx = -INFINITY;
            for (int c = lane; c < BC; c += 32)
                if (rv && k0 + c <= i)
                    mx = fmaxf(mx, ss[r * LS + c] * scale);
            mx = ddp__warp_max(mx);
            const float mn = fmaxf(mo, mx);
            /* mn −inf: nothing unmasked yet (a row past T); keep O (zeros) as it is */
            const float alpha = mn == -INFINITY ? 1.0f : expf(mo - mn);
            float sum = 0.0f;
            for (int c = lane; c < BC; c += 32) {
                float p = 0.0f;
                if (rv && k0 + c <= i)
                    p = expf(ss[r * LS + c] * scale - mn);
                sum += p;
                if (dr.on)
                    p *= ddp__drop_att(dr, skey[r], k0 + c);
                ddp__st(sp + r * LP + c, p); /* fp32: in place of the score it was read from */
            }
            sum = ddp__warp_sum(sum);
            for (int d = lane; d < HS; d += 32)
                so[r * LO + d] *= alpha;
            __syncwarp();
            if (lane == 0) {
                sm[r] = mn;
                sl[r] = lo * alpha + sum;
            }
        }
        __syncthreads();
        block_mm<E, BR, HS, BC, false, false>(sp, LP, skv, LD, so, LO, true); /* O += P V */
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < BR * HS; idx += NT) {
        const int r = idx / HS, d = idx % HS, i = q0 + r;
        if (i < T)
            ddp__st(out + ((size_t)b * T + i) * C + (size_t)h * HS + d, so[r * LO + d] / sl[r]);
    }
    for (int r = threadIdx.x; r < BR; r += NT)
        if (q0 + r < T)
            lse[(size_t)bh * T + q0 + r] = sm[r] + logf(sl[r]);
}

/* D (B, nh, T) = Σ_d dO · O per row, in fp32; a warp per row, rows strided over the grid. */
template <typename E>
__global__ void flash_bwd_dot(const E *__restrict__ dout, const E *__restrict__ out,
                              float *__restrict__ D, int B, int T, int nh, int hs)
{
    const size_t rows = (size_t)B * nh * T, warps = (size_t)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32, C = nh * hs;
    for (size_t row = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; row < rows;
         row += warps) {
        const int i = (int)(row % T);
        const size_t bh = row / T;
        const int h = (int)(bh % nh);
        const size_t b = bh / nh;
        const size_t o = (b * T + i) * C + (size_t)h * hs;
        float s = 0.0f;
        for (int d = lane; d < hs; d += 32)
            s += ddp__ld(dout + o + d) * ddp__ld(out + o + d);
        s = ddp__warp_sum(s);
        if (lane == 0)
            D[row] = s;
    }
}

/* The backward's shared step on a (query tile q0, key tile k0) pair whose Q, dO, K, V, lse, D
 * and row keys are in shared memory: S = Q Kᵀ and dP = dO Vᵀ (fp32), then P = exp(S·scale − lse)
 * and dS = P ∘ (dP' − D)·scale, 0 where masked (j > i or i ≥ T), P rounded to E first (dS from
 * the rounded P) and dS rounded to E. Without dropout dP' = dP and P lands in sp; with dropout
 * (dr.on) m the element's mask value (1/(1 − p) or 0, dropout.cuh), dP' = dP·m (the gradient of
 * the dropped probabilities, as attention.cu's causal_softmax_bwd_h) and sp gets P·m (the dropped
 * P, dV's operand; from the rounded P, rounded again: attention.cu's causal_dropout). D =
 * rowsum(dO ∘ O) = Σ_j P·dP' still, O being the dropped P times V. sp and sds are over S and dP
 * in fp32. Ends synchronized. */
template <typename E, int HS>
__device__ __forceinline__ void bwd_tile(unsigned char *smem, int q0, int k0, int T, float scale,
                                         const ddp__drop_dev &dr)
{
    typedef cfg<E, HS> K;
    constexpr int BR = K::BBR, BC = K::BBC, LD = K::LD, LS = K::BLS;
    constexpr int LP = K::H ? K::BLP : K::BLS;
    const E *sk = reinterpret_cast<const E *>(smem + K::B_K);
    const E *sv = reinterpret_cast<const E *>(smem + K::B_V);
    const E *sq = reinterpret_cast<const E *>(smem + K::B_Q);
    const E *sdo = reinterpret_cast<const E *>(smem + K::B_DO);
    float *ss = reinterpret_cast<float *>(smem + K::B_S);
    float *sdp = reinterpret_cast<float *>(smem + K::B_DP);
    E *sp = reinterpret_cast<E *>(smem + (K::H ? K::B_P : K::B_S));
    E *sds = reinterpret_cast<E *>(smem + (K::H ? K::B_DS : K::B_DP));
    const float *slse = reinterpret_cast<const float *>(smem + K::B_LSE);
    const float *sD = reinterpret_cast<const float *>(smem + K::B_D);
    const uint64_t *skey = reinterpret_cast<const uint64_t *>(smem + K::B_KEY);
    block_mm<E, BR, BC, HS, false, true>(sq, LD, sk, LD, ss, LS, false);   /* S = Q Kᵀ */
    block_mm<E, BR, BC, HS, false, true>(sdo, LD, sv, LD, sdp, LS, false); /* dP = dO Vᵀ */
    __syncthreads();
    for (int idx = threadIdx.x; idx < BR * BC; idx += NT) {
        const int r = idx / BC, c = idx % BC, i = q0 + r, j = k0 + c;
        const bool valid = i < T && j <= i;
        float p = 0.0f, pd = 0.0f, ds = 0.0f;
        if (valid) {
            E pe;
            ddp__st(&pe, expf(ss[r * LS + c] * scale - slse[r]));
            p = ddp__ld(&pe);
            float dp = sdp[r * LS + c];
            pd = p;
            if (dr.on) {
                const float m = ddp__drop_att(dr, skey[r], j);
                dp *= m;
                pd = p * m;
            }
            ds = p * (dp - sD[r]) * scale;
        }
        /* fp32: each element read above and overwritten here by the same thread */
        ddp__st(sp + r * LP + c, pd);
        ddp__st(sds + r * LP + c, ds);
    }
    __syncthreads();
}

/* Q, dO (rows q0 …), their lse and D, and with dropout their keys (row bh·T + q0 + r of the
 * B·nh·T rows) into shared memory (the caller synchronizes after). */
template <typename E, int HS>
__device__ __forceinline__ void bwd_load_q(unsigned char *smem, const E *qbase, const E *dobase,
                                           size_t row3, int C, const float *lse, const float *D,
                                           int q0, int T, size_t bh, const ddp__drop_dev &dr)
{
    typedef cfg<E, HS> K;
    constexpr int BR = K::BBR;
    load_rows<E, HS>(reinterpret_cast<E *>(smem + K::B_Q), K::LD, qbase, row3, q0, BR, T);
    load_rows<E, HS>(reinterpret_cast<E *>(smem + K::B_DO), K::LD, dobase, (size_t)C, q0, BR, T);
    float *slse = reinterpret_cast<float *>(smem + K::B_LSE);
    float *sD = reinterpret_cast<float *>(smem + K::B_D);
    uint64_t *skey = reinterpret_cast<uint64_t *>(smem + K::B_KEY);
    for (int r = threadIdx.x; r < BR; r += NT) {
        const bool v = q0 + r < T;
        slse[r] = v ? lse[q0 + r] : 0.0f;
        sD[r] = v ? D[q0 + r] : 0.0f;
        skey[r] = dr.on && v ? ddp__drop_row_key(dr, bh * T + q0 + r) : 0;
    }
}

/* dK and dV of the key tile blockIdx.y of head blockIdx.x: over the query tiles from the one
 * holding the tile's first key to the last. */
template <typename E, int HS>
__global__ void __launch_bounds__(NT)
    flash_bwd_dkv(const E *__restrict__ dout, const E *__restrict__ qkv,
                  const float *__restrict__ lse, const float *__restrict__ D, E *__restrict__ dqkv,
                  int T, int nh, float scale, ddp__drop_dev dr)
{
    typedef cfg<E, HS> K;
    constexpr int BR = K::BBR, BC = K::BBC, LD = K::LD, LO = K::LO;
    constexpr int LP = K::H ? K::BLP : K::BLS;
    extern __shared__ __align__(128) unsigned char smem[];
    const E *sq = reinterpret_cast<const E *>(smem + K::B_Q);
    const E *sdo = reinterpret_cast<const E *>(smem + K::B_DO);
    const E *sp = reinterpret_cast<const E *>(smem + (K::H ? K::B_P : K::B_S));
    const E *sds = reinterpret_cast<const E *>(smem + (K::H ? K::B_DS : K::B_DP));
    float *sdk = reinterpret_cast<float *>(smem + K::B_ACC);
    float *sdv = sdk + BC * LO;

    const int bh = blockIdx.x, b = bh / nh, h = bh % nh;
    const int kt = gridDim.y - 1 - blockIdx.y; /* the first keys have the most queries */
    const int k0 = kt * BC, C = nh * HS;
    const size_t row3 = 3 * (size_t)C;
    const E *base = qkv + (size_t)b * T * row3 + (size_t)h * HS;
    const E *dobase = dout + (size_t)b * T * C + (size_t)h * HS;
    const float *lse_bh = lse + (size_t)bh * T, *D_bh = D + (size_t)bh * T;

    load_rows<E, HS>(reinterpret_cast<E *>(smem + K::B_K), LD, base + C, row3, k0, BC, T);
    load_rows<E, HS>(reinterpret_cast<E *>(smem + K::B_V), LD, base + 2 * (size_t)C, row3, k0, BC,
                     T);
    for (int idx = threadIdx.x; idx < 2 * BC * LO; idx += NT)
        sdk[idx] = 0.0f;
    const int nqt = (T + BR - 1) / BR;
    for (int qt = k0 / BR; qt < nqt; qt++) {
        const int q0 = qt * BR;
        __syncthreads(); /* the previous tile's products have read sq, sdo, sp, sds */
        bwd_load_q<E, HS>(smem, base, dobase, row3, C, lse_bh, D_bh, q0, T, (size_t)bh, dr);
        __syncthreads();
        bwd_tile<E, HS>(smem, q0, k0, T, scale, dr);
        block_mm<E, BC, HS, BR, true, false>(sp, LP, sdo, LD, sdv, LO, true); /* dV += P'ᵀ dO */
        block_mm<E, BC, HS, BR, true, false>(sds, LP, sq, LD, sdk, LO, true); /* dK += dSᵀ Q */
    }
    __syncthreads();
    E *dbase = dqkv + (size_t)b * T * row3 + (size_t)h * HS;
    for (int idx = threadIdx.x; idx < BC * HS; idx += NT) {
        const int c = idx / HS, d = idx % HS, j = k0 + c;
        if (j < T) {
            ddp__st(dbase + (size_t)j * row3 + C + d, sdk[c * LO + d]);
            ddp__st(dbase + (size_t)j * row3 + 2 * (size_t)C + d, sdv[c * LO + d]);
        }
    }
}

/* dQ of the query tile blockIdx.y of head blockIdx.x: over the key tiles up to its causal
 * limit. */
template <typename E, int HS>
__global__ void __launch_bounds__(NT)
    flash_bwd_dq(const E *__restrict__ dout, const E *__restrict__ qkv,
                 const float *__restrict__ lse, const float *__restrict__ D, E *__restrict__ dqkv,
                 int T, int nh, float scale, ddp__drop_dev dr)
{
    typedef cfg<E, HS> K;
    constexpr int BR = K::BBR, BC = K::BBC, LD = K::LD, LO = K::LO;
    constexpr int LP = K::H ? K::BLP : K::BLS;
    extern __shared__ __align__(128) unsigned char smem[];
    E *sk = reinterpret_cast<E *>(smem + K::B_K);
    E *sv = reinterpret_cast<E *>(smem + K::B_V);
    const E *sds = reinterpret_cast<const E *>(smem + (K::H ? K::B_DS : K::B_DP));
    float *sdq = reinterpret_cast<float *>(smem + K::B_ACC);

    const int bh = blockIdx.x, b = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y; /* the longest causal rows first */
    const int q0 = qt * BR, C = nh * HS;
    const size_t row3 = 3 * (size_t)C;
    const E *base = qkv + (size_t)b * T * row3 + (size_t)h * HS;
    const E *dobase = dout + (size_t)b * T * C + (size_t)h * HS;

    bwd_load_q<E, HS>(smem, base, dobase, row3, C, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T,
                      (size_t)bh, dr);
    for (int idx = threadIdx.x; idx < BR * LO; idx += NT)
        sdq[idx] = 0.0f;
    const int qend = min(q0 + BR, T);
    const int nkt = (qend - 1) / BC + 1;
    for (int kt = 0; kt < nkt; kt++) {
        const int k0 = kt * BC;
        __syncthreads(); /* the previous tile's dQ product has read sk and sds */
        load_rows<E, HS>(sk, LD, base + C, row3, k0, BC, T);
        load_rows<E, HS>(sv, LD, base + 2 * (size_t)C, row3, k0, BC, T);
        __syncthreads();
        bwd_tile<E, HS>(smem, q0, k0, T, scale, dr);
        block_mm<E, BR, HS, BC, false, false>(sds, LP, sk, LD, sdq, LO, true); /* dQ += dS K */
    }
    __syncthreads();
    E *dbase = dqkv + (size_t)b * T * row3 + (size_t)h * HS;
    for (int idx = threadIdx.x; idx < BR * HS; idx += NT) {
        const int r = idx / HS, d = idx % HS, i = q0 + r;
        if (i < T)
            ddp__st(dbase + (size_t)i * row3 + d, sdq[r * LO + d]);
    }
}

/* The launches of one (E, HS). */
template <typename E, int HS>
ddp_status fwd_launch(ddp__cuda_ctx *c, const void *qkv, int B, int T, int nh, void *out,
                      float *lse, const ddp__drop_dev &dr, ddp_error *err)
{
    typedef cfg<E, HS> K;
    const dim3 grid((unsigned)(B * nh), (unsigned)((T + K::FBR - 1) / K::FBR));
    flash_fwd<E, HS><<<grid, NT, K::F_END, c->stream>>>((const E *)qkv, (E *)out, lse, T, nh,
                                                        1.0f / sqrtf((float)HS), dr);
    return ddp__cuda_launched("flash attention forward", err);
}

template <typename E, int HS>
ddp_status bwd_launch(ddp__cuda_ctx *c, const void *dout, const void *qkv, const void *out,
                      const float *lse, int B, int T, int nh, float *D, void *dqkv,
                      const ddp__drop_dev &dr, ddp_error *err)
{
    typedef cfg<E, HS> K;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t rows = (size_t)B * nh * T;
    ddp_status st;
    flash_bwd_dot<E><<<ddp__cuda_blocks(rows, 8), 256, 0, c->stream>>>(
        (const E *)dout, (const E *)out, D, B, T, nh, HS);
    if ((st = ddp__cuda_launched("flash attention backward (D)", err)))
        return st;
    const dim3 gk((unsigned)(B * nh), (unsigned)((T + K::BBC - 1) / K::BBC));
    flash_bwd_dkv<E, HS><<<gk, NT, K::B_END, c->stream>>>((const E *)dout, (const E *)qkv, lse, D,
                                                          (E *)dqkv, T, nh, scale, dr);
    if ((st = ddp__cuda_launched("flash attention backward (dK, dV)", err)))
        return st;
    const dim3 gq((unsigned)(B * nh), (unsigned)((T + K::BBR - 1) / K::BBR));
    flash_bwd_dq<E, HS><<<gq, NT, K::B_END, c->stream>>>((const E *)dout, (const E *)qkv, lse, D,
                                                         (E *)dqkv, T, nh, scale, dr);
    return ddp__cuda_launched("flash attention backward (dQ)", err);
}

/* f(E{}, std::integral_constant<int, HS>{}) for dt and hs (both checked by the caller). */
template <int HS, typename F> void by_dtype(ddp_dtype dt, F &&f)
{
    std::integral_constant<int, HS> h;
    if (dt == DDP_FLOAT32)
        f(float{}, h);
    else if (dt == DDP_FLOAT16)
        f(ddp__fp16{}, h);
    else
        f(ddp__bf16{}, h);
}

template <typename F> void dispatch(ddp_dtype dt, int hs, F &&f)
{
    if (hs == 32)
        by_dtype<32>(dt, f);
    else if (hs == 64)
        by_dtype<64>(dt, f);
    else
        by_dtype<128>(dt, f);
}

/* DDP_OK when the shapes and dtype are ones the kernels take, else DDP_ERR_INVALID. */
ddp_status check(ddp_dtype dt, int B, int T, int C, int nh, const char *what, ddp_error *err)
{
    if (dt != DDP_FLOAT32 && !ddp__cuda_is_half(dt))
        return ddp__cuda_fail(err, DDP_ERR_INVALID, "cuda %s: dtype %d is not fp32, bf16 or fp16",
                              what, (int)dt);
    if (B < 1 || T < 1 || nh < 1 || C % nh != 0 || !ddp__cuda_flash_supported(C / nh))
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda %s: B %d, T %d, C %d, n_head %d: the fused kernel takes head "
                              "sizes 32, 64 and 128 only; HINT: use the batched attention path",
                              what, B, T, C, nh);
    if ((size_t)B * nh > 0x7fffffffu || T > 65535 * 8)
        return ddp__cuda_fail(err, DDP_ERR_INVALID,
                              "cuda %s: B·n_head %lld or T %d beyond the kernel's grid", what,
                              (long long)B * nh, T);
    return DDP_OK;
}

} // namespace

extern "C" bool ddp__cuda_flash_supported(int hs)
{
    return hs == 32 || hs == 64 || hs == 128;
}

extern "C" size_t ddp__cuda_flash_scratch(int B, int T, int C, int nh)
{
    (void)C;
    return up128(sizeof(float) * (size_t)B * nh * T);
}

extern "C" ddp_status ddp__cuda_flash_forward(ddp__cuda_ctx *c, ddp_dtype dt, const void *qkv,
                                              int B, int T, int C, int nh, void *out, float *lse,
                                              const ddp__cuda_drop *drop, ddp_error *err)
{
    ddp_status st = check(dt, B, T, C, nh, "flash attention forward", err);
    if (st)
        return st;
    const ddp__drop_dev dr = ddp__drop_args(drop);
    dispatch(dt, C / nh, [&](auto e, auto hs) {
        st = fwd_launch<decltype(e), decltype(hs)::value>(c, qkv, B, T, nh, out, lse, dr, err);
    });
    return st;
}

extern "C" ddp_status ddp__cuda_flash_backward(ddp__cuda_ctx *c, ddp_dtype dt, const void *dout,
                                               const void *qkv, const void *out, const float *lse,
                                               int B, int T, int C, int nh, void *scratch,
                                               void *dqkv, const ddp__cuda_drop *drop,
                                               ddp_error *err)
{
    ddp_status st = check(dt, B, T, C, nh, "flash attention backward", err);
    if (st)
        return st;
    const ddp__drop_dev dr = ddp__drop_args(drop);
    dispatch(dt, C / nh, [&](auto e, auto hs) {
        st = bwd_launch<decltype(e), decltype(hs)::value>(c, dout, qkv, out, lse, B, T, nh,
                                                          (float *)scratch, dqkv, dr, err);
    });
    return st;
}
