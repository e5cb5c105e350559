/*
 * tests/emu/selftest_emu.cpp — unit.selftest_emu: cuda_emu.h's own semantics, which every other
 * emulated test relies on, in the mode the build runs them (fibers; OS threads under TSan):
 * __syncthreads between writes and reads of shared memory, a block's threads that return early
 * leaving its barriers, the warp shuffles (xor, down, up, indexed, width < 32, a partial last
 * warp, hundreds in a row: the two alternating exchange sets), shared memory poisoned afresh for
 * each block, atomics across blocks; and, with fibers, that what CUDA leaves undefined aborts
 * at once (each in a child): a divergent __syncthreads, a full-mask shuffle with an exited lane,
 * a read of a lane outside the mask. Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"

static int bad = 0;

static void expect(bool ok, const char *what)
{
    printf("%-64s %s\n", what, ok ? "ok" : "FAILED");
    bad += !ok;
}

int main()
{
    { /* shared memory through a barrier, 3 blocks of 256 (8 warps), a neighbour's value */
        std::vector<int> out(3 * 256, -1);
        emu_launch(dim3(3), dim3(256), 256 * sizeof(int), [&] {
            int *sh = (int *)emu.smem;
            unsigned t = threadIdx.x;
            sh[t] = (int)(blockIdx.x * 1000 + t);
            __syncthreads();
            out[blockIdx.x * 256 + t] = sh[(t + 1) % 256];
        });
        bool ok = true;
        for (unsigned b = 0; b < 3; b++)
            for (unsigned t = 0; t < 256; t++)
                ok &= out[b * 256 + t] == (int)(b * 1000 + (t + 1) % 256);
        expect(ok, "__syncthreads: each thread reads its neighbour's shared value");
    }
    { /* every block's shared memory starts poisoned, its threads 2-D */
        std::vector<unsigned> first(4);
        emu_launch(dim3(2, 2), dim3(16, 4), 64 * sizeof(unsigned), [&] {
            unsigned *sh = (unsigned *)emu.smem;
            unsigned t = threadIdx.y * blockDim.x + threadIdx.x;
            unsigned before = sh[t];
            __syncthreads();
            sh[t] = 7;
            __syncthreads();
            if (t == 0)
                first[blockIdx.y * 2 + blockIdx.x] = before;
        });
        bool ok = true;
        for (unsigned v : first)
            ok &= v == 0xffffffffu;
        expect(ok, "shared memory poisoned (0xff) again for every block");
    }
    { /* threads that return early leave the barriers; the rest still meet */
        std::vector<int> out(100, -1);
        emu_launch(dim3(1), dim3(100), 100 * sizeof(int), [&] {
            int *sh = (int *)emu.smem;
            unsigned t = threadIdx.x;
            if (t >= 40 && t < 70)
                return;
            sh[t] = (int)t;
            __syncthreads();
            __syncthreads();
            out[t] = sh[t < 40 ? 39 - t : 169 - t];
        });
        bool ok = true;
        for (unsigned t = 0; t < 100; t++)
            ok &= (t >= 40 && t < 70) ? out[t] == -1 : out[t] == (int)(t < 40 ? 39 - t : 169 - t);
        expect(ok, "exited threads leave __syncthreads");
    }
    { /* warp reductions in a partial last warp (80 threads: 32, 32, 16) */
        std::vector<float> sum(80), down(80), up(80), idx(80), w8(80);
        emu_launch(dim3(1), dim3(80), 0, [&] {
            unsigned t = threadIdx.x, l = t % 32;
            unsigned mask = t < 64 ? 0xffffffffu : 0xffffu;
            float v = (float)t, s = v;
            for (int o = 16; o > 0; o /= 2)
                if (t < 64 || o < 16)
                    s += __shfl_xor_sync(mask, s, o);
            sum[t] = s;
            down[t] = __shfl_down_sync(mask, v, 3, t < 64 ? 32 : 16);
            up[t] = __shfl_up_sync(mask, v, 5);
            idx[t] = __shfl_sync(mask, v, (int)(l * 7 % (t < 64 ? 32 : 16)));
            w8[t] = __shfl_xor_sync(mask, v, 1, 8);
        });
        bool ok = true;
        for (unsigned t = 0; t < 80; t++) {
            unsigned w = t / 32, l = t % 32, ws = t < 64 ? 32 : 16;
            float ws_sum = 0;
            for (unsigned i = 0; i < ws; i++)
                ws_sum += (float)(w * 32 + i);
            /* the partial warp reduces its 16 lanes from offset 8 */
            ok &= sum[t] == ws_sum;
            ok &= down[t] == (float)(l + 3 < 32 && l + 3 < ws ? t + 3 : t);
            ok &= up[t] == (float)(l >= 5 ? t - 5 : t);
            ok &= idx[t] == (float)(w * 32 + l * 7 % ws);
            ok &= w8[t] == (float)(t ^ 1);
        }
        expect(ok, "shuffles: xor, down, up, indexed, width 8, a 16-lane last warp");
    }
    { /* 300 shuffles in a row, each lane rotating a value: the exchange sets alternate */
        std::vector<int> out(64);
        emu_launch(dim3(2), dim3(64), 0, [&] {
            int v = (int)(threadIdx.x + 100 * blockIdx.x);
            for (int i = 0; i < 300; i++)
                v = __shfl_sync(0xffffffffu, v, (int)((threadIdx.x + 1) % 32)) + (i % 3 == 0);
            out[threadIdx.x] = v - (int)(100 * blockIdx.x);
        });
        bool ok = true;
        for (unsigned t = 0; t < 64; t++)
            ok &= out[t] == (int)((t / 32) * 32 + (t % 32 + 300) % 32) + 100;
        expect(ok, "300 shuffles in a row: every lane's rotation exact");
    }
    { /* atomics across blocks and threads */
        int count = 0;
        double dsum = 0;
        emu_launch(dim3(7), dim3(96), 0, [&] {
            atomicAdd(&count, 1);
            atomicAdd(&dsum, 0.5);
        });
        expect(count == 7 * 96 && dsum == 7 * 96 * 0.5, "atomicAdd over 7 blocks of 96");
    }
#if !EMU_OS_THREADS
    bad += !emu_aborts("a block stuck in a divergent barrier aborts", [] {
        emu_launch(dim3(1), dim3(64), 0, [] {
            if (threadIdx.x == 0)
                __syncwarp(); /* waits for lanes 1–31, which wait for it: */
            else
                __syncthreads();
        });
    });
    bad += !emu_aborts("a full-mask shuffle with an exited lane aborts", [] {
        emu_launch(dim3(1), dim3(32), 0, [] {
            if (threadIdx.x == 5)
                return;
            (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
        });
    });
    bad += !emu_aborts("a shuffle reading a lane outside its mask aborts", [] {
        emu_launch(dim3(1), dim3(32), 0, [] { (void)__shfl_sync(0x0000ffffu, 1.0f, 20); });
    });
#else
    printf("%-64s %s\n", "the abort cases", "skipped (OS threads: the watchdog waits 60 s)");
#endif
    printf("%d failed\n", bad);
    return bad != 0;
}
