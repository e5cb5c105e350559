/*
 * tests/emu/cuda_emu.h — just enough of CUDA, on the CPU, to run the kernels of
 * src/kernels/cuda unchanged (cu_extract.py keeps their device code, common.cuh's included): a
 * thread block is blockDim.x·y·z threads (≤ 1024, warps of 32 consecutive threads, the last
 * one partial: fibers on the calling thread, or OS threads from a pool when EMU_OS_THREADS, as
 * under TSan, which then sees two of a block's threads racing as a data race), __syncthreads a barrier over the block's live threads, __syncwarp and the warp
 * shuffles a barrier per warp. A thread that returns leaves its block's and its warp's barriers
 * (as on sm_70+); a block whose barriers make no progress for 60 s (a divergent __syncthreads
 * or a shuffle some lanes never reach) aborts instead of hanging. A full-mask shuffle
 * with exited lanes in the warp, or reading an exited or missing lane, aborts (undefined in
 * CUDA). Shared memory (dynamic: emu.smem; static: emu_static_shared) is filled with 0xff bytes
 * (NaN in every float format: a read of something never written shows in the results). Atomics
 * are std::atomic_ref. Blocks run one after another (the same threads). nvcuda::wmma as
 * documented: a fragment holds its whole 16×16 tile (every lane computes all of it, lane 0
 * stores; with fibers a lane whose operands equal the previous lane's takes its result), loads and stores
 * abort unless the pointer is 256-bit aligned and ldm a multiple of 8 (16-bit) or 4 (fp32),
 * row_major / col_major as the CUDA guide defines them. What this cannot check: the hardware's
 * fragment layouts and timing, races the barriers here happen to hide, nvcc's code.
 */
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <ucontext.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>
#define DDP_HOSTDEV
extern "C" {
#include "util/half.h"
}
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) alignas(n)
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_thread {
    dim3 tI, bI, gD, bD;
    unsigned char *smem = nullptr;
    unsigned lin = 0; /* linear thread index in the block */
};
inline thread_local emu_thread emu;
#define threadIdx (emu.tI)
#define blockIdx (emu.bI)
#define gridDim (emu.gD)
#define blockDim (emu.bD)

/* emu_launch_fibers (below): a barrier's waiter yields to the block's next thread, and marks
 * that it moved (arrived or passed). Null under emu_launch. */
inline thread_local void (*emu_yield)() = nullptr;
inline thread_local bool emu_fiber_moved = false;
/* Barrier generations completed, all blocks: emu_launch's watchdog sees progress in it. */
inline std::atomic<unsigned long> emu_progress{0};
/* A barrier over n threads that a thread may leave (drop); waiters sleep on a futex. */
struct emu_barrier {
    std::mutex m;
    unsigned n = 0, arrived = 0;
    std::atomic<unsigned long> gen{0};
    const char *what = "";
    void release() /* under m */
    {
        arrived = 0;
        gen.fetch_add(1);
        if (!emu_yield) /* fibers: nobody sleeps on it */
            gen.notify_all();
        emu_progress.fetch_add(1, std::memory_order_relaxed);
    }
    void wait()
    {
        unsigned long g;
        if (emu_yield) { /* fibers: the block's threads share one OS thread, no lock */
            g = gen.load(std::memory_order_relaxed);
            if (++arrived == n) {
                release();
                return;
            }
            emu_fiber_moved = true;
            while (gen.load(std::memory_order_relaxed) == g)
                emu_yield();
            emu_fiber_moved = true;
            return;
        }
        {
            std::lock_guard<std::mutex> l(m);
            g = gen.load();
            if (++arrived == n) {
                release();
                return;
            }
        }
        while (gen.load() == g)
            gen.wait(g);
    }
    void drop()
    {
        std::unique_lock<std::mutex> l(m, std::defer_lock);
        if (!emu_yield)
            l.lock();
        n--;
        if (n > 0 && arrived == n)
            release();
    }
};
/* A warp's last tensor-core product (nvcuda::wmma::mma_sync, fibers only): operands, result. */
struct emu_mma_memo {
    float a[16][16], b[16][16], c[16][16], d[16][16];
    bool valid = false;
};
struct emu_block {
    emu_barrier all;
    emu_barrier warp[32];
    uint64_t xch[2][32][32]; /* a shuffle's values, by warp and lane; two sets, used in turn */
    unsigned shfl_n[1024];    /* shuffles each thread has done in this block */
    bool exited[32][32];
    unsigned nexited[32]; /* exited lanes, by warp */
    emu_mma_memo mma[32];
    unsigned nthreads;
    std::mutex sm_m; /* the static shared areas, by declaration */
    std::map<int, std::unique_ptr<unsigned char[]>> sm_static;
};
inline thread_local emu_block *emu_b;
inline unsigned emu_warp_size(unsigned w)
{
    return std::min(32u, emu_b->nthreads - w * 32);
}
inline void __syncthreads()
{
    emu_b->all.wait();
}
inline void __syncwarp(unsigned = 0xffffffffu)
{
    emu_b->warp[emu.lin / 32].wait();
}
/* `__shared__ T a[N];` inside a kernel, per block (cu_extract.py rewrites it to this). */
inline void *emu_static_shared(size_t bytes, int id)
{
    std::unique_lock<std::mutex> l(emu_b->sm_m, std::defer_lock);
    if (!emu_yield)
        l.lock();
    auto &p = emu_b->sm_static[id];
    if (!p) {
        p.reset(new unsigned char[bytes + 256]);
        memset(p.get(), 0xff, bytes + 256);
    }
    unsigned char *q = p.get();
    while ((uintptr_t)q % 256)
        q++;
    return q;
}
/* The shuffle core: every lane of the warp publishes v, then reads lane src (own if src < 0).
 * One barrier: a lane's k-th shuffle writes set k % 2, so a lane already at its next shuffle
 * writes the other set while the rest still read this one, and cannot pass that shuffle's
 * barrier (and come back to this set) before every lane has arrived, that is, has read. */
template <typename T> inline T emu_shfl(unsigned mask, T v, int src)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    emu_block *blk = emu_b;
    const unsigned lin = emu.lin, w = lin / 32, l = lin % 32;
    const unsigned ws = std::min(32u, blk->nthreads - w * 32);
    bool any_gone, src_gone = false; /* as they stand before the exchange */
    {
        std::unique_lock<std::mutex> g(blk->warp[w].m, std::defer_lock);
        if (!emu_yield)
            g.lock();
        any_gone = blk->nexited[w] != 0;
        if (src >= 0 && (unsigned)src < ws)
            src_gone = blk->exited[w][src];
    }
    if (mask == 0xffffffffu && any_gone)
        for (unsigned i = 0; i < ws; i++)
            if (blk->exited[w][i]) {
                fprintf(stderr, "cuda_emu: full-mask shuffle in warp %u with lane %u exited\n",
                        w, i);
                abort();
            }
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    uint64_t(*x)[32] = blk->xch[blk->shfl_n[lin]++ % 2];
    x[w][l] = b;
    blk->warp[w].wait();
    T r = v;
    if (src >= 0) {
        if ((unsigned)src >= ws || src_gone || !(mask >> src & 1)) {
            fprintf(stderr, "cuda_emu: shuffle reads lane %d of warp %u (size %u), not taking part\n",
                    src, w, ws);
            abort();
        }
        b = x[w][src];
        memcpy(&r, &b, sizeof r);
    }
    return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int o, int width = 32)
{
    int l = emu.lin % 32;
    return emu_shfl(mask, v, (l & ~(width - 1)) | ((l % width) ^ o));
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int l = emu.lin % 32, s = l % width + (int)d;
    return emu_shfl(mask, v, s < width ? l + (int)d : -1);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
    int l = emu.lin % 32, s = l % width - (int)d;
    return emu_shfl(mask, v, s >= 0 ? l - (int)d : -1);
}
template <typename T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    int l = emu.lin % 32;
    return emu_shfl(mask, v, (l & ~(width - 1)) + src % width);
}
template <typename T> inline T __ldg(const T *p)
{
    return *p;
}
template <typename T> inline T atomicAdd(T *p, T v)
{
    return std::atomic_ref<T>(*p).fetch_add(v);
}
template <typename T> inline T atomicSub(T *p, T v)
{
    return std::atomic_ref<T>(*p).fetch_sub(v);
}
template <typename T> inline T atomicOr(T *p, T v)
{
    return std::atomic_ref<T>(*p).fetch_or(v);
}
template <typename T> inline T atomicExch(T *p, T v)
{
    return std::atomic_ref<T>(*p).exchange(v);
}
template <typename T> inline T atomicMax(T *p, T v)
{
    std::atomic_ref<T> a(*p);
    T o = a.load();
    while (o < v && !a.compare_exchange_weak(o, v)) {
    }
    return o;
}
template <typename T> inline T atomicMin(T *p, T v)
{
    std::atomic_ref<T> a(*p);
    T o = a.load();
    while (v < o && !a.compare_exchange_weak(o, v)) {
    }
    return o;
}
template <typename T> inline T atomicCAS(T *p, T cmp, T v)
{
    std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
    return cmp;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
/* the _rn intrinsics: single IEEE operations, never contracted (neither is anything here: no
 * -mfma; nvcc contracts a·b + c into an FMA by default, which this cannot show) */
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }

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
/* The product of two fragments touches only the emulation's own tiles (a lane's registers), never
 * memory a kernel addresses (load_/store_matrix_sync do, and stay checked): left out of ASan's and
 * UBSan's instrumentation and, with GCC, optimized in the -O0 sanitizer builds of the *_emu
 * tests. Instrumented at -O0 it was two thirds of unit.flash_emu's time under ASan (39 s). */
#if defined(__clang__)
#define EMU_TILE_MATH __attribute__((no_sanitize("address", "undefined")))
#elif defined(__GNUC__)
#define EMU_TILE_MATH __attribute__((no_sanitize("address", "undefined"), optimize("O2")))
#else
#define EMU_TILE_MATH
#endif
/* Whether two 16 × 16 tiles hold the same bits (memcmp's meaning, without its interceptor). */
EMU_TILE_MATH inline bool emu_same_tile(const float (&x)[16][16], const float (&y)[16][16])
{
    uint32_t diff = 0;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++)
            diff |= __builtin_bit_cast(uint32_t, x[m][n]) ^ __builtin_bit_cast(uint32_t, y[m][n]);
    return diff == 0;
}
EMU_TILE_MATH inline void emu_copy_tile(float (&to)[16][16], const float (&from)[16][16])
{
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++)
            to[m][n] = from[m][n];
}
template <typename T, typename LA, typename LB>
EMU_TILE_MATH inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                                   const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                                   const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                                   const fragment<accumulator, 16, 16, 16, float> &c)
{
    /* Every lane of a warp holds the whole tile, so with fibers (one OS thread) the warp's
     * lanes compute the same product one after another: the first computes it, the others whose
     * operands are the same bits take its result (the same floats, at a twentieth of the cost). */
    emu_mma_memo *memo = emu_yield ? &emu_b->mma[emu.lin / 32] : nullptr;
    if (memo && memo->valid && emu_same_tile(memo->a, a.v) && emu_same_tile(memo->b, b.v) &&
        emu_same_tile(memo->c, c.v)) {
        emu_copy_tile(d.v, memo->d);
        return;
    }
    float t[16][16];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float s = c.v[m][n];
            for (int k = 0; k < 16; k++)
                s += a.v[m][k] * b.v[k][n];
            t[m][n] = s;
        }
    if (memo) {
        emu_copy_tile(memo->a, a.v);
        emu_copy_tile(memo->b, b.v);
        emu_copy_tile(memo->c, c.v);
        emu_copy_tile(memo->d, t);
        memo->valid = true;
    }
    emu_copy_tile(d.v, t);
}
} // namespace wmma
} // namespace nvcuda

/* Runs kernel body f (a lambda calling the kernel) for every block of grid, block.x·y·z threads
 * each, smem_bytes of dynamic shared memory per block (poisoned). The block's threads are made
 * once per launch and run the blocks one after another, the block's state (barriers, exited
 * lanes, shared memory poisoned again) reset between blocks. */
/* EMU_OS_THREADS (1 under TSan, else 0 unless defined): emu_launch runs a block's threads as OS
 * threads, so that TSan sees a race between two of them (a missing __syncthreads) as a race;
 * 0 runs them as fibers (emu_launch_fibers, below: the same semantics, a tenth of the time). */
#ifndef EMU_OS_THREADS
#if defined(__SANITIZE_THREAD__)
#define EMU_OS_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_OS_THREADS 1
#endif
#endif
#endif
#ifndef EMU_OS_THREADS
#define EMU_OS_THREADS 0
#endif
/* ends_only: only the grid's first and last blocks run (the emulated runtime's dry run at full
 * size, DDP_EMU_DRYRUN: the blocks with the smallest and largest indices). */
template <typename F>
void emu_launch_fibers(dim3 grid, dim3 block, size_t smem_bytes, F f, bool ends_only = false);
/* OS-thread mode's threads: made once per launching thread, as many as its largest block, and
 * reused by its launches (creating 256 threads a launch was most of a launch's time under TSan).
 * A launch hands thread t of its block job(t), for t < nt; the launch waits for all of them. */
struct emu_pool {
    std::mutex m;
    std::condition_variable go;
    unsigned long gen = 0;
    unsigned nt = 0;
    bool quit = false;
    std::function<void(unsigned)> job;
    std::vector<std::thread> ts;
    void run(unsigned n, std::function<void(unsigned)> j)
    {
        std::lock_guard<std::mutex> l(m);
        while (ts.size() < n) {
            unsigned i = (unsigned)ts.size();
            ts.emplace_back([this, i] { work(i); });
        }
        job = std::move(j);
        nt = n;
        gen++;
        go.notify_all();
    }
    void work(unsigned i)
    {
        unsigned long seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> l(m);
                go.wait(l, [&] { return quit || gen != seen; });
                if (quit)
                    return;
                seen = gen;
                if (i >= nt)
                    continue;
            }
            job(i); /* unchanged until the launch has seen all nt finish */
        }
    }
    ~emu_pool()
    {
        {
            std::lock_guard<std::mutex> l(m);
            quit = true;
        }
        go.notify_all();
        for (auto &t : ts)
            t.join();
    }
};
inline emu_pool &emu_pool_get()
{
    static thread_local emu_pool pool;
    return pool;
}
template <typename F> void emu_launch(dim3 grid, dim3 block, size_t smem_bytes, F f)
{
    if (!EMU_OS_THREADS)
        return emu_launch_fibers(grid, block, smem_bytes, f);
    const unsigned nt = block.x * block.y * block.z;
    if (nt == 0 || nt > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "cuda_emu: bad launch %ux%ux%u blocks of %u threads\n", grid.x, grid.y,
                grid.z, nt);
        abort();
    }
    std::vector<unsigned char> sm(smem_bytes + 256, 0xff);
    unsigned char *base = sm.data();
    while ((uintptr_t)base % 256)
        base++;
    auto blk = std::make_unique<emu_block>();
    blk->nthreads = nt;
    auto reset = [&] {
        std::fill(sm.begin(), sm.end(), 0xff);
        blk->all.n = nt, blk->all.arrived = 0, blk->all.what = "__syncthreads";
        for (unsigned w = 0; w * 32 < nt; w++)
            blk->warp[w].n = std::min(32u, nt - w * 32), blk->warp[w].arrived = 0;
        memset(blk->exited, 0, sizeof blk->exited);
        memset(blk->nexited, 0, sizeof blk->nexited);
        memset(blk->shfl_n, 0, sizeof blk->shfl_n);
        blk->sm_static.clear();
    };
    reset();
    emu_barrier between; /* all threads between two blocks */
    between.n = nt;
    std::mutex done_m;
    std::condition_variable done_cv;
    unsigned done = 0;
    emu_pool_get().run(nt, [&](unsigned t) {
            emu_block *b = blk.get();
            emu_b = b;
            emu.lin = t;
            emu.tI = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
            emu.gD = grid;
            emu.bD = block;
            emu.smem = base;
            for (unsigned bz = 0; bz < grid.z; bz++)
                for (unsigned by = 0; by < grid.y; by++)
                    for (unsigned bx = 0; bx < grid.x; bx++) {
                        emu.bI = dim3(bx, by, bz);
                        f();
                        {
                            std::lock_guard<std::mutex> l(b->warp[t / 32].m);
                            b->exited[t / 32][t % 32] = true;
                            b->nexited[t / 32]++;
                        }
                        b->warp[t / 32].drop();
                        b->all.drop();
                        between.wait();
                        if (t == 0)
                            reset();
                        between.wait();
                    }
            std::lock_guard<std::mutex> l(done_m);
            if (++done == nt)
                done_cv.notify_one();
        });
    /* the watchdog: a launch whose barriers make no progress for 60 s is stuck */
    for (;;) {
        unsigned long p0 = emu_progress.load();
        std::unique_lock<std::mutex> l(done_m);
        if (done_cv.wait_for(l, std::chrono::seconds(60), [&] { return done == nt; }))
            break;
        if (emu_progress.load() == p0) {
            fprintf(stderr,
                    "cuda_emu: a block is stuck: __syncthreads waits for %u of %u threads (a "
                    "divergent barrier or shuffle)\n",
                    blk->all.arrived, blk->all.n);
            abort();
        }
    }
}
/* For the emulation's own tests: whether f aborts in a forked child (its stderr shown), printed as
 * "  WHAT: aborted, as it should" or "  WHAT: NOT aborted". */
template <typename F> bool emu_aborts(const char *what, F f)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    bool a = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
    printf("  %s: %s\n", what, a ? "aborted, as it should" : "NOT aborted");
    return a;
}
/* flash.cu's launches: 128 threads. */
template <typename F> void emu_launch(dim3 grid, size_t smem_bytes, F f)
{
    emu_launch(grid, dim3(128), smem_bytes, f);
}


/* emu_launch with the block's threads as fibers on the calling thread instead of OS threads:
 * the same semantics (barriers, shuffles, exited lanes, poisoned shared memory, blocks one after
 * another), a thread switched out only where it waits at a barrier, so a launch costs no OS
 * thread, no futex and no system call; a block whose every thread waits at a barrier that
 * cannot complete aborts at once (the watchdog's case). Used by the emulated GPU module
 * (tests/emu/include/cuda_runtime_api.h). The fibers (up to 1024 per calling thread, 256 KiB of
 * stack each, mapped lazily) are made once and reused; on x86-64 they switch with six pushes
 * and pops (emu_ctx_switch; swapcontext, used elsewhere, costs a sigprocmask call per switch),
 * with ASan's fiber annotations in ASan builds. */
#if !defined(__SANITIZE_ADDRESS__) && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void **, const void *, size_t);
extern "C" void __sanitizer_finish_switch_fiber(void *, const void **, size_t *);
#define EMU_ASAN_FIBERS 1
#endif
#if defined(__x86_64__)
/* void emu_ctx_switch(void **save_sp, void *new_sp): the callee-saved registers pushed, the
 * stack pointer saved and replaced, the other's registers popped (weak: one copy per program) */
__asm__(".text\n.weak emu_ctx_switch\n.type emu_ctx_switch,@function\nemu_ctx_switch:\n"
        "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
        "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
        "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
        ".size emu_ctx_switch, .-emu_ctx_switch\n");
extern "C" void emu_ctx_switch(void **save_sp, void *new_sp);
#define EMU_ASM_FIBERS 1
#endif
inline void emu_fiber_main();
struct emu_fiber_sched {
    static constexpr unsigned MAX = 1024;
    static constexpr size_t STACK = 256 << 10;
#ifdef EMU_ASM_FIBERS
    void *main_sp = nullptr;
    void *sp[MAX];
#else
    ucontext_t main_uc, uc[MAX];
#endif
    bool started[MAX] = {};
    char done[MAX] = {};
    emu_thread st[MAX];
    unsigned char *stacks = nullptr;
    unsigned cur = 0, nt = 0, left = 0; /* the running fiber; the block's threads, unfinished */
    bool finished = false;              /* a thread finished in this round */
    void (*work)(void *) = nullptr;     /* the launch's kernel body */
    void *arg = nullptr;
    const void *main_stack = nullptr; /* ASan: the calling thread's stack */
    size_t main_stack_size = 0;
};
inline thread_local emu_fiber_sched *emu_fs;
/* Switches from fiber `from` (MAX: the calling thread) to fiber `to` (MAX: the calling thread),
 * starting `to` on its stack the first time. */
inline void emu_fiber_switch(emu_fiber_sched *s, unsigned from, unsigned to)
{
    const bool to_main = to == s->MAX;
    unsigned char *stack = to_main ? nullptr : s->stacks + (size_t)to * s->STACK;
#ifdef EMU_ASAN_FIBERS
    void *fake = nullptr;
    if (to_main)
        __sanitizer_start_switch_fiber(&fake, s->main_stack, s->main_stack_size);
    else
        __sanitizer_start_switch_fiber(&fake, stack, s->STACK);
#endif
    if (!to_main) {
        s->cur = to;
        emu = s->st[to];
    }
#ifdef EMU_ASM_FIBERS
    if (!to_main && !s->started[to]) {
        s->started[to] = true;
        /* 16-byte aligned; staggered by 64 bytes a fiber, so that the fibers' saved registers
         * do not all fall in the same cache sets (the stacks are 256 KiB apart) */
        void **sp = (void **)(stack + s->STACK - (to % 61) * 64);
        *--sp = nullptr;                         /* emu_fiber_main's return address: none */
        *--sp = (void *)emu_fiber_main;          /* the switch's ret */
        for (int i = 0; i < 6; i++)
            *--sp = nullptr; /* rbp rbx r12–r15 */
        s->sp[to] = sp;
    }
    emu_ctx_switch(from == s->MAX ? &s->main_sp : &s->sp[from],
                   to_main ? s->main_sp : s->sp[to]);
#else
    if (!to_main && !s->started[to]) {
        s->started[to] = true;
        getcontext(&s->uc[to]);
        s->uc[to].uc_stack.ss_sp = stack;
        s->uc[to].uc_stack.ss_size = s->STACK;
        s->uc[to].uc_link = nullptr;
        makecontext(&s->uc[to], emu_fiber_main, 0);
    }
    swapcontext(from == s->MAX ? &s->main_uc : &s->uc[from], to_main ? &s->main_uc : &s->uc[to]);
#endif
#ifdef EMU_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
/* The running fiber gives way: to the block's next unfinished thread in index order, or, once
 * every thread has finished, to the calling thread. Passing the last index ends a round: a round
 * in which no thread arrived at or passed a barrier and none finished means the block is stuck
 * (every thread waits at a barrier that cannot complete), which aborts. */
inline void emu_fiber_yield()
{
    emu_fiber_sched *s = emu_fs;
    const unsigned from = s->cur;
    if (s->left == 0) {
        emu_fiber_switch(s, from, s->MAX);
        return;
    }
    unsigned to = from;
    do
        to = to + 1 == s->nt ? 0 : to + 1;
    while (s->done[to]);
    if (to <= from) { /* a round ended */
        if (!emu_fiber_moved && !s->finished) {
            fprintf(stderr,
                    "cuda_emu: a block is stuck: __syncthreads waits for %u of %u threads (a "
                    "divergent barrier or shuffle)\n",
                    emu_b->all.arrived, emu_b->all.n);
            abort();
        }
        emu_fiber_moved = false;
        s->finished = false;
    }
    if (to != from)
        emu_fiber_switch(s, from, to);
}
/* A fiber's life: run the current block's body as thread `me`, leave the barriers, say done,
 * give way; resumed for the next block or launch. */
inline void emu_fiber_main()
{
    emu_fiber_sched *s = emu_fs;
#ifdef EMU_ASAN_FIBERS
    /* the first fiber ever started is started by the calling thread: its stack */
    if (!s->main_stack)
        __sanitizer_finish_switch_fiber(nullptr, &s->main_stack, &s->main_stack_size);
    else
        __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    const unsigned me = s->cur;
    for (;;) {
        s->work(s->arg);
        emu_block *b = emu_b;
        b->exited[me / 32][me % 32] = true; /* one OS thread: no lock */
        b->nexited[me / 32]++;
        b->warp[me / 32].drop();
        b->all.drop();
        s->done[me] = 1;
        s->left--;
        s->finished = true;
        emu_fiber_yield();
    }
}
/* The calling thread's fibers (one set per thread, whatever the kernel). */
inline emu_fiber_sched *emu_fiber_sched_get()
{
    static thread_local std::unique_ptr<emu_fiber_sched> sched;
    if (!sched) {
        sched.reset(new emu_fiber_sched);
        sched->stacks = (unsigned char *)mmap(nullptr, emu_fiber_sched::MAX * emu_fiber_sched::STACK,
                                              PROT_READ | PROT_WRITE,
                                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (sched->stacks == MAP_FAILED) {
            fprintf(stderr, "cuda_emu: no memory for the fibers' stacks\n");
            abort();
        }
    }
    return sched.get();
}
template <typename F> void emu_launch_fibers(dim3 grid, dim3 block, size_t smem_bytes, F f, bool ends_only)
{
    const unsigned nt = block.x * block.y * block.z;
    if (nt == 0 || nt > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        fprintf(stderr, "cuda_emu: bad launch %ux%ux%u blocks of %u threads\n", grid.x, grid.y,
                grid.z, nt);
        abort();
    }
    emu_fiber_sched *sched = emu_fiber_sched_get();
    emu_fiber_sched &s = *sched;
    if (emu_fs == &s) {
        fprintf(stderr, "cuda_emu: a launch from inside a kernel\n");
        abort();
    }
    std::vector<unsigned char> sm(smem_bytes + 256, 0xff);
    unsigned char *base = sm.data();
    while ((uintptr_t)base % 256)
        base++;
    auto blk = std::make_unique<emu_block>();
    blk->nthreads = nt;
    emu_block *saved_b = emu_b;
    emu_thread saved_emu = emu;
    void (*saved_yield)() = emu_yield;
    emu_fs = &s;
    emu_b = blk.get();
    emu_yield = emu_fiber_yield;
    s.work = [](void *p) { (*(F *)p)(); };
    s.arg = &f;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                if (ends_only && !(bx == 0 && by == 0 && bz == 0) &&
                    !(bx == grid.x - 1 && by == grid.y - 1 && bz == grid.z - 1))
                    continue;
                std::fill(sm.begin(), sm.end(), 0xff);
                blk->all.n = nt, blk->all.arrived = 0, blk->all.what = "__syncthreads";
                for (unsigned w = 0; w * 32 < nt; w++)
                    blk->warp[w].n = std::min(32u, nt - w * 32), blk->warp[w].arrived = 0;
                memset(blk->exited, 0, sizeof blk->exited);
                memset(blk->nexited, 0, sizeof blk->nexited);
                memset(blk->shfl_n, 0, sizeof blk->shfl_n);
                blk->sm_static.clear();
                for (unsigned t = 0; t < nt; t++) {
                    emu_thread &e = s.st[t];
                    e.lin = t;
                    e.tI = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                    e.bI = dim3(bx, by, bz);
                    e.gD = grid;
                    e.bD = block;
                    e.smem = base;
                    s.done[t] = 0;
                }
                s.nt = nt, s.left = nt, s.finished = false;
                emu_fiber_moved = false;
                emu_fiber_switch(&s, s.MAX, 0); /* back when every thread has finished */
            }
    emu_fs = nullptr;
    emu_b = saved_b;
    emu = saved_emu;
    emu_yield = saved_yield;
}
