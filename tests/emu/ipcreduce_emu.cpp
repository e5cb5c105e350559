/*
 * tests/emu/ipcreduce_emu.cpp — ipcreduce.cu's reduce_kernel (cuda-ipc's fixed-order k-source
 * reduction) run on the CPU through cuda_emu.h with its host code's geometry, for every dtype
 * (fp32, fp64, bf16, fp16, int32, int64, uint8) and op (sum, avg as sum then the division, min,
 * max, prod), k 1, 2, 5, against the host backends' reduction (cpu/reduce.c's
 * ddp__reduce_many_avg in libddp) and a plain scalar loop for fp32: bit for bit, NaN and
 * negative zero included. Built and run by test_kernels_emu.sh.
 */
#include "cuda_emu.h"
extern "C" {
#include "group/devops.h"
#include "kernels/kernels.h"
}
#include "common_cuh.inc"
#include "ipcreduce_kernels.inc"
#include <random>
#define EMU_SEED 3
#include "emu_check.h"


template <typename S> static S gen(int j, size_t i)
{
    std::uniform_real_distribution<float> U(-3, 3);
    float f = U(rng);
    if (i == 5)
        f = j == 1 ? NAN : 1.0f; /* NaN in one source */
    if (i == 6)
        f = j == 0 ? -0.0f : 0.0f; /* signed zeros: min/max keep the first as cpu/reduce.c */
    if constexpr (std::is_same<S, ddp__bf16>::value) {
        S s;
        s.bits = ddp__f32_to_bf16(f);
        return s;
    } else if constexpr (std::is_same<S, ddp__fp16>::value) {
        S s;
        s.bits = ddp__f32_to_f16(f);
        return s;
    } else if constexpr (std::is_floating_point<S>::value)
        return (S)f;
    else
        return (S)(int64_t)(rng() % 2000001) - (std::is_signed<S>::value ? (S)1000000 : 0);
}

template <typename S> static void one(ddp_dtype t, const char *name, int k, size_t n)
{
    std::vector<std::vector<S>> src(k, std::vector<S>(n));
    for (int j = 0; j < k; j++)
        for (size_t i = 0; i < n; i++)
            src[j][i] = gen<S>(j, i);
    srcs_t p = {};
    const void *ps[DDP__IPC_MAX_SRCS];
    for (int j = 0; j < k; j++)
        p.p[j] = ps[j] = src[j].data();
    const ddp_op ops[] = {DDP_SUM, DDP_AVG, DDP_MIN, DDP_MAX, DDP_PROD};
    const char *on[] = {"sum", "avg", "min", "max", "prod"};
    for (int o = 0; o < 5; o++) {
        const ddp_op op = ops[o];
        const int div = op == DDP_AVG ? 3 : 0;
        std::vector<S> got(n), want(n);
        memset(got.data(), 0xff, n * sizeof(S));
        ddp__reduce_many_avg(want.data(), ps, k, n, t, op == DDP_AVG ? DDP_SUM : op, div);
        emu_launch(ddp__cuda_blocks(n, 256), 256, 0, [&] {
            reduce_kernel<S>(got.data(), p, k, n, op == DDP_AVG ? DDP_SUM : op, div);
        });
        bool ok = !memcmp(got.data(), want.data(), n * sizeof(S));
        if constexpr (std::is_same<S, float>::value) { /* and a plain loop */
            for (size_t i = 0; i < n && ok; i++) {
                float a = src[0][i];
                for (int j = 1; j < k; j++) {
                    float v = src[j][i];
                    a = op == DDP_MIN ? (v < a || v != v ? v : a) /* a NaN wins */
                        : op == DDP_MAX ? (a < v || v != v ? v : a)
                        : op == DDP_PROD ? a * v
                                         : a + v;
                }
                if (div > 1)
                    a /= (float)div;
                ok = !memcmp(&a, &got[i], 4);
            }
        }
        if (!ok) {
            printf("reduce %-5s %-4s k %d n %zu: FAIL (bits differ)\n", name, on[o], k, n);
            bad++;
        }
    }
    printf("reduce %-5s k %d n %zu: sum avg min max prod bit-exact %s\n", name, k, n,
           bad ? "(see above)" : "ok");
}

int main()
{
    for (int k : {1, 2, 5}) {
        one<float>(DDP_FLOAT32, "fp32", k, 1000);
        one<double>(DDP_FLOAT64, "fp64", k, 1000);
        one<ddp__bf16>(DDP_BFLOAT16, "bf16", k, 1000);
        one<ddp__fp16>(DDP_FLOAT16, "fp16", k, 1000);
        one<int32_t>(DDP_INT32, "int32", k, 1000);
        one<int64_t>(DDP_INT64, "int64", k, 1000);
        one<uint8_t>(DDP_UINT8, "uint8", k, 1000);
    }
    one<float>(DDP_FLOAT32, "fp32", 64, 300); /* the most sources */
    printf("%d failed\n", bad);
    return bad != 0;
}
