/*
 * tests/emu/cudnn_emu.cpp — cuDNN 9's legacy API as src/kernels/cuda/classifier.cu uses it, on the
 * CPU: built as build/gpu_emu/libcudnn_emu.so (tests/emu/CMakeLists.txt), the file classifier.cu
 * dlopens (its DDP_CUDNN_LIB; libddp_gpu_emu.so points that variable here when it is unset, so
 * the emulated module never loads a real cuDNN). Linked against libddp_gpu_emu.so: device memory
 * is its cudaMalloc'd blocks, and every buffer argument is checked against them (abort naming
 * the call and the argument, as gpu_rt_emu.cpp does for cuBLAS). Everything runs at the call on
 * the calling thread, after the work queued before it on the handle's stream (cudnnSetStream's;
 * emu_rt_stream_flush: gpu_rt_emu.cpp runs a stream's work late, when waited for).
 *
 *  - descriptors: 4-d NCHW tensors and filters of FLOAT, HALF or BFLOAT16; 2-d convolutions with
 *    padding, stride, dilation (run-time: only 1), CROSS_CORRELATION or CONVOLUTION, a compute
 *    type and a math type (DEFAULT until set).
 *  - type configurations as the legacy API's table: x, w, y of one type (else BAD_PARAM); FLOAT
 *    with FLOAT compute, HALF with HALF or FLOAT compute (TRUE_HALF, PSEUDO_HALF), BFLOAT16 with
 *    FLOAT compute (PSEUDO_BFLOAT16); anything else NOT_SUPPORTED_DATA_TYPE.
 *  - algorithms: an emulated table (algos below) gives each its math types and workspace; the
 *    _v7 heuristics answer, for every direction, algorithm 1 with the descriptor's math type, an
 *    FMA-only algorithm, a tensor-op-only one, one wanting 1 GiB of workspace and one whose
 *    status is NOT_SUPPORTED. At run time (and in the workspace queries) an algorithm under a
 *    math type its table lacks is NOT_SUPPORTED — fatal (abort) when DDP_EMU_CUDNN_STRICT=1, as
 *    the gpu_emu tests run: the caller set the descriptor to a math type the heuristic did not
 *    pair with that algorithm. DDP_EMU_CUDNN_REFUSE ("fwd:1,data:1,filter:1" by default; "none")
 *    lists algorithms refused at run time with NOT_SUPPORTED_SHAPE (3002), so that the caller's
 *    pass to the next algorithm runs; DDP_EMU_CUDNN_REFUSE_QUERY (same form, none by default)
 *    those refused already by the workspace-size queries, as cuDNN may. A workspace smaller
 *    than the algorithm's is BAD_PARAM.
 *  - arithmetic: naive loops accumulated in double, alpha and beta applied in fp32 (beta 0: the
 *    output is not read), each result rounded once to the output's type (fp16 past 65504: inf);
 *    FLOAT data under a tensor-op algorithm with a math type other than FMA has its inputs
 *    rounded to TF32 first (what Ampere and later do).
 *  - pointers: every device buffer argument (tensors, filters, batchnorm's parameter and
 *    statistics tensors, the workspace) must lie inside one cudaMalloc'd block and, when
 *    DDP_EMU_CUDNN_STRICT=1, start 16-byte aligned (else abort); a pointer not aligned to its
 *    element size is BAD_PARAM_MISALIGNED_POINTER. The rule and its source: the only written
 *    pointer requirement found is cuDNN 7.6's release notes (known issues: "the Tensor pointers
 *    and the filter pointers require at a minimum 4-byte alignment, including for FP16 or INT8
 *    data"); cuDNN 9's legacy-API pages found state none. The graph API's tensors carry their
 *    pointers' alignment (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), which the engines are chosen by, so
 *    a legacy call's engine can be specialised for the pointers it got, and tensor-core kernels
 *    load 16 bytes at a time. 16 is therefore this emulation's choice, stricter than the
 *    documented 4, not a cited cuDNN limit: it catches a view packed into a larger buffer (a
 *    reducer's bucket) reaching cuDNN, which classifier.cu avoids (it hands cuDNN 256-byte
 *    aligned buffers only), while cudaMalloc's blocks (256-byte aligned) always pass.
 *  - batchnorm (SPATIAL only; PER_ACTIVATION and PERSISTENT: NOT_SUPPORTED): training with the
 *    batch's mean and biased variance, the running mean and the UNBIASED running variance
 *    updated by the exponential average factor, saved mean and 1/sqrt(var + eps); inference with
 *    the running statistics; backward from the saved statistics (recomputed when NULL), alpha
 *    and beta for the data and the parameter gradients.
 */
#include <cudnn.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

extern "C" {
#include "util/half.h"
}

#define EMU_API extern "C" __attribute__((visibility("default")))

[[noreturn]] static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudnn emulation: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

struct cudnnContext {
    cudaStream_t stream;
};
struct cudnnTensorStruct {
    bool set;
    cudnnDataType_t t;
    int n, c, h, w;
};
struct cudnnFilterStruct {
    bool set;
    cudnnDataType_t t;
    int k, c, h, w;
};
struct cudnnConvolutionStruct {
    bool set;
    int pad_h, pad_w, u, v, dil_h, dil_w;
    cudnnConvolutionMode_t mode;
    cudnnDataType_t compute;
    cudnnMathType_t math;
};

/* live objects: a destroyed or foreign handle or descriptor aborts */
static std::mutex obj_m;
static std::set<const void *> live;
template <typename T> static T *make()
{
    T *p = new T();
    std::lock_guard<std::mutex> l(obj_m);
    live.insert(p);
    return p;
}
template <typename T> static cudnnStatus_t destroy(T *p, const char *what)
{
    if (!p)
        return CUDNN_STATUS_SUCCESS;
    {
        std::lock_guard<std::mutex> l(obj_m);
        if (!live.erase(p))
            die("%s(%p): not created, or destroyed twice", what, (void *)p);
    }
    delete p;
    return CUDNN_STATUS_SUCCESS;
}
static void need_live(const void *p, const char *call, const char *what)
{
    std::lock_guard<std::mutex> l(obj_m);
    if (!p || !live.count(p))
        die("%s: %s %p was never created or is destroyed", call, what, p);
}

static size_t type_size(cudnnDataType_t t)
{
    return t == CUDNN_DATA_FLOAT ? 4 : t == CUDNN_DATA_DOUBLE ? 8 : 2;
}
static bool known_type(cudnnDataType_t t)
{
    return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16;
}
static float ld(cudnnDataType_t t, const void *p, size_t i)
{
    switch (t) {
    case CUDNN_DATA_HALF: return ddp__f16_to_f32(((const uint16_t *)p)[i]);
    case CUDNN_DATA_BFLOAT16: return ddp__bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}
static void st(cudnnDataType_t t, void *p, size_t i, float v)
{
    switch (t) {
    case CUDNN_DATA_HALF: ((uint16_t *)p)[i] = ddp__f32_to_f16(v); break;
    case CUDNN_DATA_BFLOAT16: ((uint16_t *)p)[i] = ddp__f32_to_bf16(v); break;
    default: ((float *)p)[i] = v;
    }
}
static float tf32(float x) /* round to nearest (even) at 10 mantissa bits */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0xfffu + ((u >> 13) & 1)) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

static bool env_flag(const char *name);

/* Aborts unless [p, p + bytes) lies in one cudaMalloc'd block (gpu_rt_emu.cpp's), and, when
 * strict, unless p is 16-byte aligned (the header says why 16). */
static void need_dev(const char *call, const char *what, const void *p, size_t bytes)
{
    if (!p)
        die("%s: %s is NULL", call, what);
    if (!emu_rt_is_device(p, bytes))
        die("%s: %s (%zu bytes at %p) is not inside one cudaMalloc'd block (host memory, freed, "
            "or running past its end)",
            call, what, bytes, p);
    if ((uintptr_t)p % 16 && env_flag("DDP_EMU_CUDNN_STRICT"))
        die("%s: %s at %p is not 16-byte aligned (DDP_EMU_CUDNN_STRICT: a real cuDNN may pick a "
            "vectorised kernel for it, or refuse it); hand cuDNN an aligned buffer",
            call, what, p);
}
static size_t elems(const cudnnTensorStruct *t)
{
    return (size_t)t->n * t->c * t->h * t->w;
}
static size_t elems(const cudnnFilterStruct *f)
{
    return (size_t)f->k * f->c * f->h * f->w;
}

/* ---- errors, handle */
EMU_API const char *cudnnGetErrorString(cudnnStatus_t s)
{
    switch (s) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
        return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}
EMU_API cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    if (!h)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
        return CUDNN_STATUS_NOT_INITIALIZED;
    *h = make<cudnnContext>();
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnDestroy(cudnnHandle_t h)
{
    return destroy(h, "cudnnDestroy");
}
EMU_API cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s)
{
    need_live(h, "cudnnSetStream", "handle");
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- descriptors */
EMU_API cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = make<cudnnTensorStruct>();
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    return destroy(d, "cudnnDestroyTensorDescriptor");
}
EMU_API cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                                 cudnnDataType_t t, int n, int c, int h, int w)
{
    need_live(d, "cudnnSetTensor4dDescriptor", "descriptor");
    if (n < 1 || c < 1 || h < 1 || w < 1 || (double)n * c * h * w >= 2147483648.0)
        return CUDNN_STATUS_BAD_PARAM;
    if (f != CUDNN_TENSOR_NCHW)
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT; /* the emulation's limit */
    if (!known_type(t))
        return CUDNN_STATUS_BAD_PARAM;
    *d = {true, t, n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = make<cudnnFilterStruct>();
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d)
{
    return destroy(d, "cudnnDestroyFilterDescriptor");
}
EMU_API cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                                 cudnnTensorFormat_t f, int k, int c, int h, int w)
{
    need_live(d, "cudnnSetFilter4dDescriptor", "descriptor");
    if (k < 1 || c < 1 || h < 1 || w < 1)
        return CUDNN_STATUS_BAD_PARAM;
    if (f != CUDNN_TENSOR_NCHW)
        return CUDNN_STATUS_NOT_SUPPORTED_LAYOUT;
    if (!known_type(t))
        return CUDNN_STATUS_BAD_PARAM;
    *d = {true, t, k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    if (!d)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    *d = make<cudnnConvolutionStruct>();
    (*d)->math = CUDNN_DEFAULT_MATH;
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    return destroy(d, "cudnnDestroyConvolutionDescriptor");
}
EMU_API cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h,
                                                      int pad_w, int u, int v, int dil_h,
                                                      int dil_w, cudnnConvolutionMode_t mode,
                                                      cudnnDataType_t compute)
{
    need_live(d, "cudnnSetConvolution2dDescriptor", "descriptor");
    if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dil_h < 1 || dil_w < 1 ||
        (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) ||
        (compute != CUDNN_DATA_FLOAT && compute != CUDNN_DATA_HALF &&
         compute != CUDNN_DATA_BFLOAT16 && compute != CUDNN_DATA_DOUBLE))
        return CUDNN_STATUS_BAD_PARAM;
    cudnnMathType_t m = d->math;
    *d = {true, pad_h, pad_w, u, v, dil_h, dil_w, mode, compute, m};
    return CUDNN_STATUS_SUCCESS;
}
EMU_API cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    need_live(d, "cudnnSetConvolutionMathType", "descriptor");
    if (m != CUDNN_DEFAULT_MATH && m != CUDNN_TENSOR_OP_MATH &&
        m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && m != CUDNN_FMA_MATH)
        return CUDNN_STATUS_BAD_PARAM;
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}

static int out_dim(int in, int pad, int k, int dil, int stride)
{
    return 1 + (in + 2 * pad - ((k - 1) * dil + 1)) / stride;
}
EMU_API cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t cd,
                                                            const cudnnTensorDescriptor_t xd,
                                                            const cudnnFilterDescriptor_t wd,
                                                            int *n, int *c, int *h, int *w)
{
    const char *call = "cudnnGetConvolution2dForwardOutputDim";
    need_live(cd, call, "convolution descriptor");
    need_live(xd, call, "tensor descriptor");
    need_live(wd, call, "filter descriptor");
    if (!cd->set || !xd->set || !wd->set || !n || !c || !h || !w || xd->c != wd->c)
        return CUDNN_STATUS_BAD_PARAM;
    int oh = out_dim(xd->h, cd->pad_h, wd->h, cd->dil_h, cd->u),
        ow = out_dim(xd->w, cd->pad_w, wd->w, cd->dil_w, cd->v);
    if (oh < 1 || ow < 1)
        return CUDNN_STATUS_BAD_PARAM;
    *n = xd->n, *c = wd->k, *h = oh, *w = ow;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the emulated algorithm table */
enum dir { FWD, DATA, FILTER };
static const char *dir_name[] = {"cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                                 "cudnnConvolutionBackwardFilter"};
static const char *dir_key[] = {"fwd", "data", "filter"};
enum kind { K_ANY, K_FMA, K_TC, K_HUGE, K_NS, K_NONE };
/* per direction: the algorithm of each kind (K_ANY: 0 and 1) */
static const int kind_algo[3][5] = {
    /* fwd: 1 PRECOMP_GEMM, DIRECT, WINOGRAD, GEMM (1 GiB), FFT (NOT_SUPPORTED) */
    {1, 3, 6, 2, 4},
    /* data: ALGO_1, FFT_TILING, WINOGRAD_NONFUSED, FFT (1 GiB), WINOGRAD (NOT_SUPPORTED) */
    {1, 3, 5, 2, 4},
    /* filter: ALGO_1, ALGO_3, WINOGRAD_NONFUSED, FFT (1 GiB), WINOGRAD (not implemented) */
    {1, 3, 5, 2, 4},
};
static const int algo_count[3] = {8, 6, 7};
static kind kind_of(dir d, int algo)
{
    if (algo == 0)
        return K_ANY;
    for (int k = 0; k < 5; k++)
        if (kind_algo[d][k] == algo)
            return (kind)k;
    return K_NONE; /* not in the table: NOT_SUPPORTED */
}
static bool math_ok(kind k, cudnnMathType_t m)
{
    switch (k) {
    case K_ANY:
    case K_HUGE: return true;
    case K_FMA: return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
    case K_TC: return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    default: return false;
    }
}
static const char *math_name(cudnnMathType_t m)
{
    return m == CUDNN_DEFAULT_MATH           ? "DEFAULT_MATH"
           : m == CUDNN_TENSOR_OP_MATH       ? "TENSOR_OP_MATH"
           : m == CUDNN_FMA_MATH             ? "FMA_MATH"
           : m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION ? "TENSOR_OP_MATH_ALLOW_CONVERSION"
                                             : "?";
}
static bool env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}
/* Whether the list in the environment variable `name` (DDP_EMU_CUDNN_REFUSE, whose default is
 * `dflt`, or DDP_EMU_CUDNN_REFUSE_QUERY, none by default) names (d, algo). */
static bool refused_by_env(const char *name, const char *dflt, dir d, int algo)
{
    const char *v = getenv(name);
    if (!v)
        v = dflt;
    char want[32];
    snprintf(want, sizeof want, "%s:%d", dir_key[d], algo);
    size_t n = strlen(want);
    for (const char *p = v; (p = strstr(p, want)); p += n)
        if ((p == v || p[-1] == ',') && (p[n] == ',' || p[n] == 0))
            return true;
    return false;
}

struct geom {
    const cudnnTensorStruct *x, *y;
    const cudnnFilterStruct *w;
    const cudnnConvolutionStruct *c;
};
/* The checks every convolution call and query makes: live and set descriptors, shapes that
 * agree, a type configuration of the legacy table. */
static cudnnStatus_t check_geom(const char *call, cudnnHandle_t h, const geom &g)
{
    if (h)
        need_live(h, call, "handle");
    need_live(g.x, call, "x/dx descriptor");
    need_live(g.y, call, "y/dy descriptor");
    need_live(g.w, call, "filter descriptor");
    need_live(g.c, call, "convolution descriptor");
    if (!g.x->set || !g.y->set || !g.w->set || !g.c->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (g.x->c != g.w->c || g.y->n != g.x->n || g.y->c != g.w->k ||
        g.y->h != out_dim(g.x->h, g.c->pad_h, g.w->h, g.c->dil_h, g.c->u) ||
        g.y->w != out_dim(g.x->w, g.c->pad_w, g.w->w, g.c->dil_w, g.c->v))
        return CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH;
    if (g.x->t != g.w->t || g.x->t != g.y->t)
        return CUDNN_STATUS_BAD_PARAM; /* the legacy API: x, w, y of one type */
    const cudnnDataType_t t = g.x->t, ct = g.c->compute;
    bool cfg = (t == CUDNN_DATA_FLOAT && ct == CUDNN_DATA_FLOAT) ||
               (t == CUDNN_DATA_HALF && (ct == CUDNN_DATA_HALF || ct == CUDNN_DATA_FLOAT)) ||
               (t == CUDNN_DATA_BFLOAT16 && ct == CUDNN_DATA_FLOAT);
    if (!cfg)
        return CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE;
    if (g.c->dil_h != 1 || g.c->dil_w != 1)
        return CUDNN_STATUS_NOT_SUPPORTED_SHAPE; /* the emulation's limit */
    return CUDNN_STATUS_SUCCESS;
}
static size_t workspace(dir, kind k, const geom &g)
{
    size_t out = elems(g.y), per = (size_t)g.w->c * g.w->h * g.w->w;
    switch (k) {
    case K_ANY: return 0;
    case K_FMA: return 4096 + 16 * (size_t)g.x->n;
    case K_TC: return (out / g.y->c) * per * type_size(g.x->t) / (size_t)g.x->n + 256;
    case K_HUGE: return (size_t)1 << 30;
    default: return 0;
    }
}
/* algo 1 needs workspace too (its precomputed indices), algo 0 none */
static size_t workspace_of(dir d, int algo, const geom &g)
{
    return algo == 1 ? (size_t)g.y->h * g.y->w * 8 : workspace(d, kind_of(d, algo), g);
}

/* The math type the descriptor has for this algorithm: NOT_SUPPORTED (fatal when strict) if its
 * table lacks it. */
static cudnnStatus_t check_algo(const char *call, dir d, int algo, const geom &g)
{
    if (algo < 0 || algo >= algo_count[d])
        return CUDNN_STATUS_BAD_PARAM;
    kind k = kind_of(d, algo);
    if (k == K_NONE || k == K_NS)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (!math_ok(k, g.c->math)) {
        if (env_flag("DDP_EMU_CUDNN_STRICT"))
            die("%s: algorithm %d under %s, a math type it does not support (the heuristic "
                "paired it with another: set the descriptor's math type to the perf entry's "
                "mathType before the workspace query and the call)",
                call, algo, math_name(g.c->math));
        return CUDNN_STATUS_NOT_SUPPORTED;
    }
    return CUDNN_STATUS_SUCCESS;
}

template <typename Perf>
static cudnnStatus_t heuristic(const char *call, dir d, cudnnHandle_t h, const geom &g, int req,
                               int *ret, Perf *perf)
{
    cudnnStatus_t s = check_geom(call, h, g);
    if (s)
        return s;
    if (!ret || !perf || req < 1)
        return CUDNN_STATUS_BAD_PARAM;
    const bool half = g.x->t != CUDNN_DATA_FLOAT;
    struct e {
        kind k;
        int algo;
        cudnnMathType_t m;
        cudnnStatus_t s;
    } list[] = {
        {K_ANY, 1, half ? CUDNN_TENSOR_OP_MATH : g.c->math, CUDNN_STATUS_SUCCESS},
        {K_FMA, kind_algo[d][K_FMA], CUDNN_FMA_MATH, CUDNN_STATUS_SUCCESS},
        {K_TC, kind_algo[d][K_TC], CUDNN_TENSOR_OP_MATH, CUDNN_STATUS_SUCCESS},
        {K_HUGE, kind_algo[d][K_HUGE], CUDNN_DEFAULT_MATH, CUDNN_STATUS_SUCCESS},
        {K_NS, kind_algo[d][K_NS], CUDNN_DEFAULT_MATH, CUDNN_STATUS_NOT_SUPPORTED},
        {K_ANY, 0, g.c->math, CUDNN_STATUS_SUCCESS},
    };
    int n = 0;
    for (const e &x : list) {
        if (n == req)
            break;
        Perf p;
        memset(&p, 0, sizeof p);
        p.algo = (decltype(p.algo))x.algo;
        p.status = x.s;
        p.time = x.s ? -1.0f : 0.01f * (float)(n + 1);
        p.memory = x.s ? 0 : x.algo == 1 ? workspace_of(d, 1, g) : workspace(d, x.k, g);
        p.determinism = CUDNN_DETERMINISTIC;
        p.mathType = x.m;
        perf[n++] = p;
    }
    *ret = n;
    return CUDNN_STATUS_SUCCESS;
}
static cudnnStatus_t ws_query(const char *call, dir d, cudnnHandle_t h, const geom &g, int algo,
                              size_t *bytes)
{
    cudnnStatus_t s = check_geom(call, h, g);
    if (s)
        return s;
    if (!bytes)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if ((s = check_algo(call, d, algo, g)))
        return s;
    if (refused_by_env("DDP_EMU_CUDNN_REFUSE_QUERY", "", d, algo))
        return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
    *bytes = workspace_of(d, algo, g);
    return CUDNN_STATUS_SUCCESS;
}

EMU_API cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnFilterDescriptor_t wd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t yd, const int req,
    int *ret, cudnnConvolutionFwdAlgoPerf_t *perf)
{
    return heuristic("cudnnGetConvolutionForwardAlgorithm_v7", FWD, h, {xd, yd, wd, cd}, req, ret,
                     perf);
}
EMU_API cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t dxd, const int req,
    int *ret, cudnnConvolutionBwdDataAlgoPerf_t *perf)
{
    return heuristic("cudnnGetConvolutionBackwardDataAlgorithm_v7", DATA, h, {dxd, dyd, wd, cd},
                     req, ret, perf);
}
EMU_API cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnFilterDescriptor_t dwd, const int req,
    int *ret, cudnnConvolutionBwdFilterAlgoPerf_t *perf)
{
    return heuristic("cudnnGetConvolutionBackwardFilterAlgorithm_v7", FILTER, h, {xd, dyd, dwd, cd},
                     req, ret, perf);
}
EMU_API cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnFilterDescriptor_t wd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t yd,
    cudnnConvolutionFwdAlgo_t algo, size_t *bytes)
{
    return ws_query("cudnnGetConvolutionForwardWorkspaceSize", FWD, h, {xd, yd, wd, cd},
                    (int)algo, bytes);
}
EMU_API cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnTensorDescriptor_t dxd,
    cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes)
{
    return ws_query("cudnnGetConvolutionBackwardDataWorkspaceSize", DATA, h, {dxd, dyd, wd, cd},
                    (int)algo, bytes);
}
EMU_API cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const cudnnTensorDescriptor_t dyd,
    const cudnnConvolutionDescriptor_t cd, const cudnnFilterDescriptor_t dwd,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes)
{
    return ws_query("cudnnGetConvolutionBackwardFilterWorkspaceSize", FILTER, h, {xd, dyd, dwd, cd},
                    (int)algo, bytes);
}

/* ---- the convolutions */
/* One call of direction d: checked, then run. x, w, y are the forward's roles (dx, dw, dy in
 * the backward ones); out is the one written. */
/* The work of one call, from here to the end of the scope: a dry run's device memory (gpu_rt_emu.cpp)
 * is accessible inside, as a GPU's is to its own work. */
struct device_work {
    device_work() { emu_rt_device_work(1); }
    ~device_work() { emu_rt_device_work(0); }
    device_work(const device_work &) = delete;
    device_work &operator=(const device_work &) = delete;
};

static cudnnStatus_t conv(dir d, cudnnHandle_t h, const void *alpha, const geom &g, const void *x,
                          const void *w, const void *y, void *out, int algo, void *ws,
                          size_t ws_bytes, const void *beta)
{
    const char *call = dir_name[d];
    device_work dw;
    cudnnStatus_t s = check_geom(call, h, g);
    if (s)
        return s;
    emu_rt_stream_flush(h->stream); /* computed now: the stream's earlier work first */
    if (!alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if ((s = check_algo(call, d, algo, g)))
        return s;
    const size_t need = workspace_of(d, algo, g);
    if (ws_bytes < need)
        return CUDNN_STATUS_BAD_PARAM;
    if (need)
        need_dev(call, "the workspace", ws, need);
    const cudnnDataType_t t = g.x->t;
    const size_t es = type_size(t);
    need_dev(call, d == DATA ? "dx" : "x", d == DATA ? (const void *)out : x, elems(g.x) * es);
    need_dev(call, d == FILTER ? "dw" : "w", d == FILTER ? (const void *)out : w, elems(g.w) * es);
    need_dev(call, d == FWD ? "y" : "dy", d == FWD ? (const void *)out : y, elems(g.y) * es);
    if ((uintptr_t)x % es || (uintptr_t)w % es || (uintptr_t)y % es || (uintptr_t)out % es)
        return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER;
    if (refused_by_env("DDP_EMU_CUDNN_REFUSE", "fwd:1,data:1,filter:1", d, algo))
        return CUDNN_STATUS_NOT_SUPPORTED_SHAPE;
    /* alpha, beta: float for FLOAT/HALF compute, as cuDNN's scaling parameters */
    const float a = *(const float *)alpha, b = *(const float *)beta;
    const bool round32 =
        t == CUDNN_DATA_FLOAT && g.c->math != CUDNN_FMA_MATH && kind_of(d, algo) == K_TC;
    auto LD = [&](const void *p, size_t i) {
        float v = ld(t, p, i);
        return round32 ? tf32(v) : v;
    };
    const int N = g.x->n, C = g.x->c, H = g.x->h, W = g.x->w, K = g.w->k, R = g.w->h,
              S = g.w->w, P = g.y->h, Q = g.y->w;
    const bool flip = g.c->mode == CUDNN_CONVOLUTION;
    auto xi = [&](int n, int c, int hh, int ww) { return (((size_t)n * C + c) * H + hh) * W + ww; };
    auto wi = [&](int k, int c, int r, int s2) {
        if (flip)
            r = R - 1 - r, s2 = S - 1 - s2;
        return (((size_t)k * C + c) * R + r) * S + s2;
    };
    auto yi = [&](int n, int k, int p, int q) { return (((size_t)n * K + k) * P + p) * Q + q; };
    size_t total = d == FWD ? elems(g.y) : d == DATA ? elems(g.x) : elems(g.w);
    std::vector<double> acc(total, 0.0);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    const size_t yk = yi(n, k, p, q);
                    const double dy = d == FWD ? 0.0 : LD(y, yk);
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++) {
                            const int hh = p * g.c->u - g.c->pad_h + r;
                            if (hh < 0 || hh >= H)
                                continue;
                            for (int s2 = 0; s2 < S; s2++) {
                                const int ww = q * g.c->v - g.c->pad_w + s2;
                                if (ww < 0 || ww >= W)
                                    continue;
                                const size_t xk = xi(n, c, hh, ww), wk = wi(k, c, r, s2);
                                if (d == FWD)
                                    acc[yk] += (double)LD(x, xk) * LD(w, wk);
                                else if (d == DATA)
                                    acc[xk] += dy * LD(w, wk);
                                else
                                    acc[wk] += dy * LD(x, xk);
                            }
                        }
                }
    for (size_t i = 0; i < total; i++) {
        float v = a * (float)acc[i];
        if (b != 0.0f)
            v += b * ld(t, out, i);
        st(t, out, i, v);
    }
    return CUDNN_STATUS_SUCCESS;
}

EMU_API cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                              const cudnnTensorDescriptor_t xd, const void *x,
                                              const cudnnFilterDescriptor_t wd, const void *w,
                                              const cudnnConvolutionDescriptor_t cd,
                                              cudnnConvolutionFwdAlgo_t algo, void *ws,
                                              size_t ws_bytes, const void *beta,
                                              const cudnnTensorDescriptor_t yd, void *y)
{
    return conv(FWD, h, alpha, {xd, yd, wd, cd}, x, w, nullptr, y, (int)algo, ws, ws_bytes, beta);
}
EMU_API cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                                   const cudnnFilterDescriptor_t wd, const void *w,
                                                   const cudnnTensorDescriptor_t dyd,
                                                   const void *dy,
                                                   const cudnnConvolutionDescriptor_t cd,
                                                   cudnnConvolutionBwdDataAlgo_t algo, void *ws,
                                                   size_t ws_bytes, const void *beta,
                                                   const cudnnTensorDescriptor_t dxd, void *dx)
{
    return conv(DATA, h, alpha, {dxd, dyd, wd, cd}, nullptr, w, dy, dx, (int)algo, ws, ws_bytes,
                beta);
}
EMU_API cudnnStatus_t cudnnConvolutionBackwardFilter(
    cudnnHandle_t h, const void *alpha, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnConvolutionDescriptor_t cd,
    cudnnConvolutionBwdFilterAlgo_t algo, void *ws, size_t ws_bytes, const void *beta,
    const cudnnFilterDescriptor_t dwd, void *dw)
{
    return conv(FILTER, h, alpha, {xd, dyd, dwd, cd}, x, nullptr, dy, dw, (int)algo, ws, ws_bytes,
                beta);
}

/* ---- batchnorm (spatial) */
EMU_API cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t bd,
                                                    const cudnnTensorDescriptor_t xd,
                                                    cudnnBatchNormMode_t mode)
{
    need_live(bd, "cudnnDeriveBNTensorDescriptor", "derived descriptor");
    need_live(xd, "cudnnDeriveBNTensorDescriptor", "x descriptor");
    if (!xd->set)
        return CUDNN_STATUS_BAD_PARAM;
    if (mode != CUDNN_BATCHNORM_SPATIAL)
        return CUDNN_STATUS_NOT_SUPPORTED; /* the emulation's limit */
    *bd = {true, CUDNN_DATA_FLOAT, 1, xd->c, 1, 1};
    return CUDNN_STATUS_SUCCESS;
}
/* x, y (same shape and type) and the (1, C, 1, 1) FLOAT parameter descriptor. */
static cudnnStatus_t bn_check(const char *call, cudnnHandle_t h, cudnnBatchNormMode_t mode,
                              const cudnnTensorStruct *xd, const cudnnTensorStruct *yd,
                              const cudnnTensorStruct *pd, double eps)
{
    need_live(h, call, "handle");
    need_live(xd, call, "x descriptor");
    need_live(yd, call, "y descriptor");
    need_live(pd, call, "parameter descriptor");
    emu_rt_stream_flush(h->stream); /* computed now: the stream's earlier work first */
    if (mode != CUDNN_BATCHNORM_SPATIAL)
        return CUDNN_STATUS_NOT_SUPPORTED;
    if (!xd->set || !yd->set || !pd->set || xd->n != yd->n || xd->c != yd->c || xd->h != yd->h ||
        xd->w != yd->w || pd->n != 1 || pd->c != xd->c || pd->h != 1 || pd->w != 1 ||
        pd->t != CUDNN_DATA_FLOAT || !(eps >= CUDNN_BN_MIN_EPSILON))
        return CUDNN_STATUS_BAD_PARAM;
    return CUDNN_STATUS_SUCCESS;
}
/* The per-channel mean and biased variance of x. */
static void bn_stats(const cudnnTensorStruct *xd, const void *x, int c, double *mean, double *var)
{
    const size_t hw = (size_t)xd->h * xd->w, M = (size_t)xd->n * hw;
    double s = 0, s2 = 0;
    for (int n = 0; n < xd->n; n++)
        for (size_t i = 0; i < hw; i++)
            s += ld(xd->t, x, ((size_t)n * xd->c + c) * hw + i);
    *mean = s / (double)M;
    for (int n = 0; n < xd->n; n++)
        for (size_t i = 0; i < hw; i++) {
            double v = ld(xd->t, x, ((size_t)n * xd->c + c) * hw + i) - *mean;
            s2 += v * v;
        }
    *var = s2 / (double)M;
}

EMU_API cudnnStatus_t cudnnBatchNormalizationForwardTraining(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xd, const void *x, const cudnnTensorDescriptor_t yd, void *y,
    const cudnnTensorDescriptor_t pd, const void *scale, const void *bias, double factor,
    void *run_mean, void *run_var, double eps, void *save_mean, void *save_invstd)
{
    const char *call = "cudnnBatchNormalizationForwardTraining";
    device_work dw;
    cudnnStatus_t s = bn_check(call, h, mode, xd, yd, pd, eps);
    if (s)
        return s;
    if (!alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if ((run_mean == nullptr) != (run_var == nullptr) ||
        (save_mean == nullptr) != (save_invstd == nullptr))
        return CUDNN_STATUS_BAD_PARAM;
    const int C = xd->c;
    const size_t hw = (size_t)xd->h * xd->w, M = (size_t)xd->n * hw, pb = sizeof(float) * C;
    need_dev(call, "x", x, elems(xd) * type_size(xd->t));
    need_dev(call, "y", y, elems(yd) * type_size(yd->t));
    need_dev(call, "bnScale", scale, pb);
    need_dev(call, "bnBias", bias, pb);
    if (run_mean) {
        need_dev(call, "resultRunningMean", run_mean, pb);
        need_dev(call, "resultRunningVariance", run_var, pb);
    }
    if (save_mean) {
        need_dev(call, "resultSaveMean", save_mean, pb);
        need_dev(call, "resultSaveInvVariance", save_invstd, pb);
    }
    const float a = *(const float *)alpha, b = *(const float *)beta;
    for (int c = 0; c < C; c++) {
        double mean, var;
        bn_stats(xd, x, c, &mean, &var);
        const double invstd = 1.0 / sqrt(var + eps);
        const float g = ((const float *)scale)[c], bb = ((const float *)bias)[c];
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = ((size_t)n * C + c) * hw + i;
                float v = a * (float)(g * (ld(xd->t, x, k) - mean) * invstd + bb);
                if (b != 0.0f)
                    v += b * ld(yd->t, y, k);
                st(yd->t, y, k, v);
            }
        if (run_mean) {
            float *rm = (float *)run_mean, *rv = (float *)run_var;
            const double unbiased = M > 1 ? var * (double)M / (double)(M - 1) : var;
            rm[c] = (float)((1.0 - factor) * rm[c] + factor * mean);
            rv[c] = (float)((1.0 - factor) * rv[c] + factor * unbiased);
        }
        if (save_mean) {
            ((float *)save_mean)[c] = (float)mean;
            ((float *)save_invstd)[c] = (float)invstd;
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

EMU_API cudnnStatus_t cudnnBatchNormalizationForwardInference(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    const cudnnTensorDescriptor_t xd, const void *x, const cudnnTensorDescriptor_t yd, void *y,
    const cudnnTensorDescriptor_t pd, const void *scale, const void *bias, const void *est_mean,
    const void *est_var, double eps)
{
    const char *call = "cudnnBatchNormalizationForwardInference";
    device_work dw;
    cudnnStatus_t s = bn_check(call, h, mode, xd, yd, pd, eps);
    if (s)
        return s;
    if (!alpha || !beta)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    const int C = xd->c;
    const size_t hw = (size_t)xd->h * xd->w, pb = sizeof(float) * C;
    need_dev(call, "x", x, elems(xd) * type_size(xd->t));
    need_dev(call, "y", y, elems(yd) * type_size(yd->t));
    need_dev(call, "bnScale", scale, pb);
    need_dev(call, "bnBias", bias, pb);
    need_dev(call, "estimatedMean", est_mean, pb);
    need_dev(call, "estimatedVariance", est_var, pb);
    const float a = *(const float *)alpha, b = *(const float *)beta;
    for (int c = 0; c < C; c++) {
        const double mean = ((const float *)est_mean)[c],
                     invstd = 1.0 / sqrt((double)((const float *)est_var)[c] + eps);
        const float g = ((const float *)scale)[c], bb = ((const float *)bias)[c];
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = ((size_t)n * C + c) * hw + i;
                float v = a * (float)(g * (ld(xd->t, x, k) - mean) * invstd + bb);
                if (b != 0.0f)
                    v += b * ld(yd->t, y, k);
                st(yd->t, y, k, v);
            }
    }
    return CUDNN_STATUS_SUCCESS;
}

EMU_API cudnnStatus_t cudnnBatchNormalizationBackward(
    cudnnHandle_t h, cudnnBatchNormMode_t mode, const void *alpha_d, const void *beta_d,
    const void *alpha_p, const void *beta_p, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnTensorDescriptor_t dxd, void *dx,
    const cudnnTensorDescriptor_t pd, const void *scale, void *dscale, void *dbias, double eps,
    const void *saved_mean, const void *saved_invstd)
{
    const char *call = "cudnnBatchNormalizationBackward";
    device_work dw;
    cudnnStatus_t s = bn_check(call, h, mode, xd, dyd, pd, eps);
    if (s)
        return s;
    if ((s = bn_check(call, h, mode, xd, dxd, pd, eps)))
        return s;
    if (!alpha_d || !beta_d || !alpha_p || !beta_p)
        return CUDNN_STATUS_BAD_PARAM_NULL_POINTER;
    if ((saved_mean == nullptr) != (saved_invstd == nullptr))
        return CUDNN_STATUS_BAD_PARAM;
    const int C = xd->c;
    const size_t hw = (size_t)xd->h * xd->w, M = (size_t)xd->n * hw, pb = sizeof(float) * C;
    need_dev(call, "x", x, elems(xd) * type_size(xd->t));
    need_dev(call, "dy", dy, elems(dyd) * type_size(dyd->t));
    need_dev(call, "dx", dx, elems(dxd) * type_size(dxd->t));
    need_dev(call, "bnScale", scale, pb);
    need_dev(call, "dBnScaleResult", dscale, pb);
    need_dev(call, "dBnBiasResult", dbias, pb);
    if (saved_mean) {
        need_dev(call, "savedMean", saved_mean, pb);
        need_dev(call, "savedInvVariance", saved_invstd, pb);
    }
    const float ad = *(const float *)alpha_d, bd = *(const float *)beta_d,
                ap = *(const float *)alpha_p, bp = *(const float *)beta_p;
    for (int c = 0; c < C; c++) {
        double mean, invstd;
        if (saved_mean) {
            mean = ((const float *)saved_mean)[c];
            invstd = ((const float *)saved_invstd)[c];
        } else {
            double var;
            bn_stats(xd, x, c, &mean, &var);
            invstd = 1.0 / sqrt(var + eps);
        }
        double sdy = 0, sdyx = 0;
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = ((size_t)n * C + c) * hw + i;
                double g = ld(dyd->t, dy, k);
                sdy += g;
                sdyx += g * (ld(xd->t, x, k) - mean) * invstd;
            }
        const double gm = ((const float *)scale)[c];
        for (int n = 0; n < xd->n; n++)
            for (size_t i = 0; i < hw; i++) {
                size_t k = ((size_t)n * C + c) * hw + i;
                double xhat = (ld(xd->t, x, k) - mean) * invstd;
                double v = gm * invstd / (double)M *
                           ((double)M * ld(dyd->t, dy, k) - sdy - xhat * sdyx);
                float o = ad * (float)v;
                if (bd != 0.0f)
                    o += bd * ld(dxd->t, dx, k);
                st(dxd->t, dx, k, o);
            }
        float *ds = (float *)dscale, *db = (float *)dbias;
        ds[c] = ap * (float)sdyx + (bp != 0.0f ? bp * ds[c] : 0.0f);
        db[c] = ap * (float)sdy + (bp != 0.0f ? bp * db[c] : 0.0f);
    }
    return CUDNN_STATUS_SUCCESS;
}
