/*
 * kernels/cuda/ipcreduce.cu — cuda-ipc's reduction (devmath.h's ddp__devmath_reduce): each output
 * element folded over k sources in the fixed order 0, 1, …, k-1, in the arithmetic of the CPU's
 * cpu/reduce.c (16-bit floats widened to float32 and rounded once, integers wrapping through
 * unsigned arithmetic, min/max as b < a / b > a, no fused multiply-add), then divided once for
 * AVG as ddp__scale_avg does (correctly rounded division, never a reciprocal; 16-bit floats in
 * float32 before their one rounding, as ddp__reduce_many_avg). So the ranks of a
 * cuda-ipc group, each reducing its slice, produce exactly the bits a host backend would.
 * UNVERIFIED: written without a GPU; the same contract runs on the fake GPU (staged/fakedev.c:
 * ddp__reduce_many + ddp__scale_avg) in the tests, and on a GPU through scripts/gpu-check.sh.
 */
#include "common.cuh"

extern "C" {
#include "group/devops.h"
#include "kernels/cuda/devmath.h"
#include "util/half.h"
}

namespace {

/* The sources, by value in the kernel's parameters (64 pointers: 512 bytes). */
struct srcs_t {
    const void *p[DDP__IPC_MAX_SRCS];
};

/* Storage S, accumulator A: loads widen, stores narrow (once). */
__device__ inline float ld(const float *p, size_t i)
{
    return p[i];
}
__device__ inline double ld(const double *p, size_t i)
{
    return p[i];
}
__device__ inline float ld(const ddp__bf16 *p, size_t i)
{
    return ddp__ld(p + i);
}
__device__ inline float ld(const ddp__fp16 *p, size_t i)
{
    return ddp__ld(p + i);
}
__device__ inline uint32_t ld(const int32_t *p, size_t i)
{
    return (uint32_t)p[i];
}
__device__ inline uint64_t ld(const int64_t *p, size_t i)
{
    return (uint64_t)p[i];
}
__device__ inline uint32_t ld(const uint8_t *p, size_t i)
{
    return p[i];
}

__device__ inline void st(float *p, float v)
{
    *p = v;
}
__device__ inline void st(double *p, double v)
{
    *p = v;
}
__device__ inline void st(ddp__bf16 *p, float v)
{
    ddp__st(p, v);
}
__device__ inline void st(ddp__fp16 *p, float v)
{
    ddp__st(p, v);
}
__device__ inline void st(int32_t *p, uint32_t v)
{
    *p = (int32_t)v;
}
__device__ inline void st(int64_t *p, uint64_t v)
{
    *p = (int64_t)v;
}
__device__ inline void st(uint8_t *p, uint32_t v)
{
    *p = (uint8_t)v;
}

/* Integers compare as their signed selves for min and max; sums and products wrap. */
template <typename A> __device__ inline bool less(A a, A b)
{
    return a < b;
}
template <> __device__ inline bool less<uint32_t>(uint32_t a, uint32_t b)
{
    return (int32_t)a < (int32_t)b; /* int32's accumulator; uint8 values are < 2^8: the same */
}
template <> __device__ inline bool less<uint64_t>(uint64_t a, uint64_t b)
{
    return (int64_t)a < (int64_t)b;
}

/* A NaN wins min and max wherever it is, as cpu/reduce.c's OP_MIN / OP_MAX. */
template <typename A> __device__ inline bool nan_(A)
{
    return false;
}
template <> __device__ inline bool nan_<float>(float a)
{
    return a != a;
}
template <> __device__ inline bool nan_<double>(double a)
{
    return a != a;
}

template <typename A> __device__ inline A add(A a, A b)
{
    return a + b;
}
template <> __device__ inline float add<float>(float a, float b)
{
    return __fadd_rn(a, b);
}
template <> __device__ inline double add<double>(double a, double b)
{
    return __dadd_rn(a, b);
}
template <typename A> __device__ inline A mul(A a, A b)
{
    return a * b;
}
template <> __device__ inline float mul<float>(float a, float b)
{
    return __fmul_rn(a, b);
}
template <> __device__ inline double mul<double>(double a, double b)
{
    return __dmul_rn(a, b);
}

/* The 16-bit floats: AVG's division comes before their one rounding (cpu/reduce.c's
 * ddp__reduce_many_avg), not after. */
template <typename S> struct half_t {
    static constexpr bool v = false;
};
template <> struct half_t<ddp__bf16> {
    static constexpr bool v = true;
};
template <> struct half_t<ddp__fp16> {
    static constexpr bool v = true;
};

/* The value stored, divided by d (> 1), as ddp__scale_avg divides it. */
__device__ inline void avg(float *p, int d)
{
    *p = __fdiv_rn(*p, (float)d);
}
__device__ inline void avg(double *p, int d)
{
    *p = __ddiv_rn(*p, (double)d);
}
__device__ inline void avg(int32_t *p, int d)
{
    *p /= d;
}
__device__ inline void avg(int64_t *p, int d)
{
    *p /= d;
}
__device__ inline void avg(uint8_t *p, int d)
{
    *p = (uint8_t)(*p / d);
}

template <typename S>
__global__ void reduce_kernel(S *dst, srcs_t srcs, int k, size_t n, ddp_op op, int avg_div)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        auto acc = ld((const S *)srcs.p[0], i);
        for (int j = 1; j < k; j++) {
            auto v = ld((const S *)srcs.p[j], i);
            switch (op) {
            case DDP_MIN: acc = less(v, acc) || nan_(v) ? v : acc; break;
            case DDP_MAX: acc = less(acc, v) || nan_(v) ? v : acc; break;
            case DDP_PROD: acc = mul(acc, v); break;
            default: acc = add(acc, v); break; /* SUM, and AVG as SUM */
            }
        }
        S out;
        if constexpr (half_t<S>::v) {
            st(&out, avg_div > 1 ? __fdiv_rn(acc, (float)avg_div) : acc);
        } else {
            st(&out, acc);
            if (avg_div > 1)
                avg(&out, avg_div);
        }
        dst[i] = out;
    }
}

template <typename S>
void launch(cudaStream_t s, void *dst, const srcs_t &p, int k, size_t n, ddp_op op, int avg_div)
{
    reduce_kernel<S><<<ddp__cuda_blocks(n, 256), 256, 0, s>>>((S *)dst, p, k, n, op, avg_div);
}

} // namespace

extern "C" ddp_status ddp__devmath_reduce(void *stream, void *dst, const void *const *srcs, int k,
                                          size_t n, ddp_dtype t, ddp_op op, int avg_div, char *msg)
{
    if (k < 1 || k > DDP__IPC_MAX_SRCS) {
        snprintf(msg, DDP_ERRMSG_MAX, "reduce over %d sources (1 to %d)", k, DDP__IPC_MAX_SRCS);
        return DDP_ERR_INVALID;
    }
    if (n == 0)
        return DDP_OK;
    srcs_t p = {};
    for (int j = 0; j < k; j++)
        p.p[j] = srcs[j];
    cudaStream_t s = (cudaStream_t)stream;
    switch (t) {
    case DDP_FLOAT32: launch<float>(s, dst, p, k, n, op, avg_div); break;
    case DDP_FLOAT64: launch<double>(s, dst, p, k, n, op, avg_div); break;
    case DDP_BFLOAT16: launch<ddp__bf16>(s, dst, p, k, n, op, avg_div); break;
    case DDP_FLOAT16: launch<ddp__fp16>(s, dst, p, k, n, op, avg_div); break;
    case DDP_INT32: launch<int32_t>(s, dst, p, k, n, op, avg_div); break;
    case DDP_INT64: launch<int64_t>(s, dst, p, k, n, op, avg_div); break;
    case DDP_UINT8: launch<uint8_t>(s, dst, p, k, n, op, avg_div); break;
    default:
        snprintf(msg, DDP_ERRMSG_MAX, "reduce of dtype %d is not implemented", (int)t);
        return DDP_ERR_INVALID;
    }
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess)
        return DDP_OK;
    snprintf(msg, DDP_ERRMSG_MAX, "cuda: reduce: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return DDP_ERR_SYSTEM;
}
