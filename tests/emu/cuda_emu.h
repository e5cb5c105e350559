/*
 * tests/emu/cuda_emu.h — just enough of CUDA, on the CPU, to run src/kernels/cuda/flash.cu's
 * kernels unchanged (test_flash_emu.sh strips its includes and host launchers): a thread block
 * is 128 std::threads, __syncthreads a std::barrier over them, __syncwarp and the warp shuffles
 * a barrier per warp; shared memory a heap buffer filled with 0xff bytes (NaN in every float
 * format: a read of something never written shows in the results). nvcuda::wmma as documented:
 * a fragment holds its whole 16×16 tile (every lane computes all of it, lane 0 stores), loads
 * and stores abort unless the pointer is 256-bit aligned and ldm a multiple of 8 (16-bit) or 4
 * (fp32), row_major / col_major as the CUDA guide defines them. What this cannot check: the
 * hardware's fragment layouts and timing, races the barriers here happen to hide, nvcc's code.
 */
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>
#include <cstdio>
#include <cstdlib>
#define DDP_HOSTDEV
extern "C" {
#include "util/half.h"
}
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__
using std::max;
using std::min;
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct emu_thread {
    dim3 tI, bI, gD, bD;
    unsigned char *smem;
};
inline thread_local emu_thread emu;
#define threadIdx (emu.tI)
#define blockIdx (emu.bI)
#define gridDim (emu.gD)
#define blockDim (emu.bD)
struct emu_block {
    std::barrier<> *all;
    std::barrier<> *warp[4];
    float xch[4][32];
};
inline thread_local emu_block *emu_b;
inline void __syncthreads()
{
    emu_b->all->arrive_and_wait();
}
inline void __syncwarp()
{
    emu_b->warp[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int o)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    emu_b->xch[w][l] = v;
    __syncwarp();
    float r = emu_b->xch[w][l ^ o];
    __syncwarp();
    return r;
}
struct ddp__bf16 {
    uint16_t bits;
};
struct ddp__fp16 {
    uint16_t bits;
};
inline float ddp__ld(const float *p)
{
    return *p;
}
inline float ddp__ld(const ddp__bf16 *p)
{
    return ddp__bf16_to_f32(p->bits);
}
inline float ddp__ld(const ddp__fp16 *p)
{
    return ddp__f16_to_f32(p->bits);
}
inline void ddp__st(float *p, float v)
{
    *p = v;
}
inline void ddp__st(ddp__bf16 *p, float v)
{
    p->bits = ddp__f32_to_bf16(v);
}
inline void ddp__st(ddp__fp16 *p, float v)
{
    p->bits = ddp__f32_to_f16(v);
}
template <typename T> inline T ddp__warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
inline float ddp__warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
struct __nv_bfloat16 {
    uint16_t bits;
};
struct __half {
    uint16_t bits;
};
inline float emu_f(const __nv_bfloat16 &x)
{
    return ddp__bf16_to_f32(x.bits);
}
inline float emu_f(const __half &x)
{
    return ddp__f16_to_f32(x.bits);
}
namespace nvcuda
{
namespace wmma
{
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename L = void> struct fragment {
    float v[16][16];
};
template <typename U, typename T, typename L>
inline void load_matrix_sync(fragment<U, 16, 16, 16, T, L> &f, const T *p, unsigned ld)
{
    // check the documented requirements: 256-bit aligned pointer, ld a multiple of 8 (16-bit)
    if ((uintptr_t)p % 32 || ld % 8) {
        fprintf(stderr, "wmma load: misaligned %p ld %u\n", (void *)p, ld);
        abort();
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.v[r][c] =
                std::is_same<L, row_major>::value ? emu_f(p[r * ld + c]) : emu_f(p[c * ld + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ld, layout_t)
{
    if ((uintptr_t)p % 32 || ld % 4) {
        fprintf(stderr, "wmma acc load: misaligned\n");
        abort();
    }
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.v[r][c] = p[r * ld + c];
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ld, layout_t)
{
    if ((uintptr_t)p % 32 || ld % 4) {
        fprintf(stderr, "wmma store: misaligned\n");
        abort();
    }
    __syncwarp();
    if (threadIdx.x % 32 == 0)
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++)
                p[r * ld + c] = f.v[r][c];
    __syncwarp();
}
inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float x)
{
    for (auto &row : f.v)
        for (auto &e : row)
            e = x;
}
template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                     const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                     const fragment<accumulator, 16, 16, 16, float> &c)
{
    float t[16][16];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[m][n];
            for (int k = 0; k < 16; k++)
                s += a.v[m][k] * b.v[k][n];
            t[m][n] = s;
        }
    memcpy(d.v, t, sizeof t);
}
} // namespace wmma
} // namespace nvcuda
// run kernel body f for each block of grid with 128 threads
template <typename F> void emu_launch(dim3 grid, size_t smem_bytes, F f)
{
    for (unsigned by = 0; by < grid.y; by++)
        for (unsigned bx = 0; bx < grid.x; bx++) {
            std::vector<unsigned char> sm(smem_bytes + 128);
            // poison shared memory: uninitialized reads show up as NaN
            for (size_t i = 0; i < smem_bytes; i++)
                sm[i] = 0xff;
            unsigned char *base = sm.data();
            while ((uintptr_t)base % 128)
                base++;
            std::barrier<> all(128);
            std::barrier<> w0(32), w1(32), w2(32), w3(32);
            emu_block blk{&all, {&w0, &w1, &w2, &w3}, {}};
            std::vector<std::thread> ts;
            for (unsigned t = 0; t < 128; t++)
                ts.emplace_back([&, t] {
                    emu_b = &blk;
                    emu.tI.x = t;
                    emu.bI.x = bx;
                    emu.bI.y = by;
                    emu.gD = grid;
                    emu.bD.x = 128;
                    emu.smem = base;
                    f();
                });
            for (auto &t : ts)
                t.join();
        }
}
