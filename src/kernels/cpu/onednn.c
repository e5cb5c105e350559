/*
 * kernels/cpu/onednn.c — bf16 matrix products on the CPU through oneDNN (Debian's libdnnl2),
 * for precision bf16 (docs/nn.md, "bf16 on the CPU"): both operands rounded to bfloat16 (nearest
 * even), products accumulated in float32, the result written in float32. On a CPU with bf16
 * dot-product units (AVX512_BF16, AMX) that is about twice OpenBLAS's float32 rate. OpenBLAS as
 * Debian builds it has no bf16 GEMM (no cblas_sbgemm), so this is the one place that uses oneDNN.
 *
 * The library is loaded with dlopen on first use and only then, like the GPU module: a float32
 * program never maps its 40 MB (nor the libstdc++/libgomp it pulls in). Builds without oneDNN's
 * header compile the same entry points, which say what is missing.
 *
 * Per thread: a oneDNN stream, the bf16 copies of the operands, and a few matmul primitives whose
 * sizes are given at run time (below). Threads are OpenMP's (OMP_NUM_THREADS, which ddprun sets
 * per worker).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "util/half.h"
#include "util/util.h"

static _Thread_local ddp__gemm_kind tl_kind = DDP__GEMM_FP32;

ddp__gemm_kind ddp__gemm_set_kind(ddp__gemm_kind k)
{
    ddp__gemm_kind old = tl_kind;
    tl_kind = k;
    return old;
}

ddp__gemm_kind ddp__gemm_get_kind(void)
{
    return tl_kind;
}

/* Every product that asked for bf16 (ddp__gemm_bf16, ddp__gemm_bf16_pre), and those of them
 * that fell back (to float32, or a plain loop): ddptrain reports the share. */
static atomic_ulong products, fallbacks;

unsigned long ddp__gemm_bf16_fallbacks(void)
{
    return atomic_load(&fallbacks);
}

unsigned long ddp__gemm_bf16_products(void)
{
    return atomic_load(&products);
}

#ifndef DDP_HAVE_ONEDNN

ddp_status ddp__gemm_bf16_check(ddp_error *err)
{
    return ddp__err(err, DDP_ERR_NOT_FOUND,
                    "precision bf16 on the CPU needs oneDNN, and this build of ddpc was made "
                    "without its header; HINT: install libdnnl-dev (scripts/install-deps.sh) and "
                    "rebuild, or set precision fp32");
}

bool ddp__gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    atomic_fetch_add(&products, 1);
    atomic_fetch_add(&fallbacks, 1);
    return false;
}

static bool gemm_bf16_pre(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                          float *C, int ldc)
{
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    return false;
}

void ddp__bf16_round(uint16_t *dst, const float *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = ddp__f32_to_bf16(src[i]);
}

bool ddp__gemm_bf16_active(void)
{
    return false;
}

const uint16_t *ddp__bf16_rounded(int slot, const float *src, int rows, int cols, int ld)
{
    (void)slot, (void)src, (void)rows, (void)cols, (void)ld;
    return NULL;
}

#else /* DDP_HAVE_ONEDNN */

#include <immintrin.h>
#include <oneapi/dnnl/dnnl.h>

/* ---- the library, loaded once ---------------------------------------------------------------- */

#define DN_FUNCS(X)                                                                                \
    X(dnnl_engine_create)                                                                          \
    X(dnnl_stream_create)                                                                          \
    X(dnnl_stream_destroy)                                                                         \
    X(dnnl_memory_desc_init_by_strides)                                                            \
    X(dnnl_matmul_desc_init)                                                                       \
    X(dnnl_primitive_attr_create)                                                                  \
    X(dnnl_primitive_attr_destroy)                                                                 \
    X(dnnl_primitive_attr_set_output_scales)                                                       \
    X(dnnl_primitive_attr_set_post_ops)                                                            \
    X(dnnl_post_ops_create)                                                                        \
    X(dnnl_post_ops_append_sum)                                                                    \
    X(dnnl_post_ops_destroy)                                                                       \
    X(dnnl_primitive_desc_create)                                                                  \
    X(dnnl_primitive_desc_query)                                                                   \
    X(dnnl_primitive_desc_destroy)                                                                 \
    X(dnnl_primitive_create)                                                                       \
    X(dnnl_primitive_destroy)                                                                      \
    X(dnnl_primitive_execute)                                                                      \
    X(dnnl_stream_wait)                                                                            \
    X(dnnl_memory_create)                                                                          \
    X(dnnl_memory_destroy)                                                                         \
    X(dnnl_memory_set_data_handle)                                                                 \
    X(dnnl_version)

static struct {
#define DN_FIELD(name) __typeof__(name) *name;
    DN_FUNCS(DN_FIELD)
#undef DN_FIELD
} dn;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static char load_error[DDP_ERRMSG_MAX]; /* "" when the library is usable for bf16 */

/* libgomp's (oneDNN's threads), found through the library's own dependencies, or NULL. */
static void (*omp_set_num_threads_fn)(int);
/* How many forks this process descends from since the load: a thread's primitives made before
 * (tstate.forks behind it) are dropped before its next product. */
static unsigned forks;

/* GNU OpenMP's thread pool does not survive fork: in a child of a process whose products ran
 * on two or more OpenMP threads, the first parallel region waits forever for threads that were
 * not copied (ddp_spawn's workers are such children). So the child computes on its one thread:
 * OpenMP's default becomes 1, and the primitives made before the fork, which keep the thread
 * count they were made for, are made again. */
static void after_fork_in_child(void)
{
    if (omp_set_num_threads_fn)
        omp_set_num_threads_fn(1);
    forks++;
}

/* One fixed-size bf16 product through a fresh primitive, to learn which implementation oneDNN
 * would pick for it on this CPU: "brg:avx512_core_bf16" or an AMX one run on bf16 units; anything
 * else (plain avx512_core, which widens bf16 to float32 in software, or the reference loops)
 * means oneDNN sees no bf16 units (or was limited by ONEDNN_MAX_CPU_ISA) and is refused. The
 * products themselves run in the run-time-sized primitives below ("gemm:jit"), which use the same
 * units; this probe stands for the CPU's capability as oneDNN sees it. */
static void probe_impl(char *impl, size_t cap)
{
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t d = {64, 64}, s = {64, 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    const char *info = NULL;
    impl[0] = '\0';
    if (dn.dnnl_memory_desc_init_by_strides(&a, 2, d, dnnl_bf16, s) ||
        dn.dnnl_memory_desc_init_by_strides(&b, 2, d, dnnl_bf16, s) ||
        dn.dnnl_memory_desc_init_by_strides(&c, 2, d, dnnl_f32, s) ||
        dn.dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) ||
        dn.dnnl_primitive_desc_create(&pd, &md, NULL, engine, NULL))
        return;
    if (!dn.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info) && info)
        ddp__fmt(impl, cap, "%s", info);
    dn.dnnl_primitive_desc_destroy(pd);
}

static void load(void)
{
    /* cvt_row_bf16 below runs AVX512_BF16 instructions itself: ask the CPU (and the OS, which
     * must save the zmm registers: libgcc checks XCR0) directly, rather than inferring it from
     * the name of the implementation oneDNN picks — a different libdnnl (DDP_ONEDNN_LIB) may name
     * its kernels differently, and a SIGILL is not an error message. */
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bf16")) {
        ddp__fmt(load_error, sizeof load_error,
                 "precision bf16 on the CPU needs bf16 matrix instructions (AVX512_BF16: AMD Zen "
                 "4 or later, Intel Cooper Lake, Sapphire Rapids or later), which this CPU lacks; "
                 "HINT: set precision fp32");
        return;
    }
    const char *path = getenv("DDP_ONEDNN_LIB");
    if (!path || !*path)
        path = "libdnnl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        ddp__fmt(load_error, sizeof load_error,
                 "precision bf16 on the CPU needs oneDNN, which did not load (%s); HINT: install "
                 "libdnnl2 (scripts/install-deps.sh), or set precision fp32",
                 why ? why : path);
        return;
    }
#define DN_SYM(name)                                                                               \
    {                                                                                              \
        void *sym = dlsym(h, #name);                                                               \
        if (!sym) {                                                                                \
            ddp__fmt(load_error, sizeof load_error,                                                \
                     "oneDNN at %s has no %s (version 2.x is needed); HINT: install Debian's "     \
                     "libdnnl2, or set precision fp32",                                            \
                     path, #name);                                                                 \
            return;                                                                                \
        }                                                                                          \
        memcpy(&dn.name, &sym, sizeof sym); /* dlsym's object pointer to a function pointer */     \
    }
    DN_FUNCS(DN_SYM)
#undef DN_SYM
    void *omp = dlsym(h, "omp_set_num_threads"); /* absent when oneDNN uses other threads */
    memcpy(&omp_set_num_threads_fn, &omp, sizeof omp);
    if (omp && pthread_atfork(NULL, NULL, after_fork_in_child) != 0) {
        ddp__fmt(load_error, sizeof load_error,
                 "precision bf16 on the CPU: cannot register oneDNN's fork handler (out of "
                 "memory); HINT: set precision fp32");
        return;
    }
    if (dn.dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        ddp__fmt(load_error, sizeof load_error,
                 "oneDNN could not create a CPU engine; HINT: set precision fp32");
        return;
    }
    char impl[128];
    probe_impl(impl, sizeof impl);
    if (!strstr(impl, "bf16") && !strstr(impl, "amx")) {
        const dnnl_version_t *v = dn.dnnl_version();
        /* The CPU has the units (checked above), so oneDNN was told not to use them, or is
         * a build without those kernels. */
        ddp__fmt(load_error, sizeof load_error,
                 "precision bf16 on the CPU needs oneDNN's bf16-unit kernels, and oneDNN %d.%d "
                 "picks '%s' for a bf16 product on this CPU (slower than fp32); HINT: unset "
                 "ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA if set, or set precision fp32",
                 v ? v->major : 0, v ? v->minor : 0, impl[0] ? impl : "no implementation");
        return;
    }
}

ddp_status ddp__gemm_bf16_check(ddp_error *err)
{
    pthread_once(&load_once, load);
    if (load_error[0])
        return ddp__err(err, DDP_ERR_NOT_FOUND, "%s", load_error);
    return DDP_OK;
}

/* ---- float32 → bfloat16 ------------------------------------------------------------------- */

/* Nearest even, as ddp__f32_to_bf16 (util/half.h) rounds, bit for bit on every float32 (checked
 * over all 2^32) but one kind: the instruction treats denormal inputs (|x| < 2^-126 ≈ 1.2e-38)
 * as zero of the same sign, where the scalar keeps the bf16 denormal nearest. Inf stays Inf;
 * NaN stays NaN, quieted as the scalar does. A denormal term is below 1.2e-38 · |b| in a product
 * with b: nothing next to any normal term, but a product made only of denormals is 0. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void
cvt_row_bf16_unit(uint16_t *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)v);
    }
    if (i < n) {
        int left = n - i;
        __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        __mmask16 hi = (__mmask16)(left > 16 ? (1u << (left - 16)) - 1 : 0);
        __m512 a = _mm512_maskz_loadu_ps(lo, src + i), b = _mm512_maskz_loadu_ps(hi, src + i + 16);
        __m512bh v = _mm512_cvtne2ps_pbh(b, a);
        _mm512_mask_storeu_epi16(dst + i, (__mmask32)(((uint64_t)hi << 16) | lo), (__m512i)v);
    }
}

/* The same rounding on a CPU without the instruction, bit for bit (denormal inputs to zero of
 * the same sign first): ddp__bf16_round is the library's, called by layers and tests that do
 * not all check for bf16 products first, and must not be a SIGILL there. */
static void cvt_row_bf16(uint16_t *dst, const float *src, int n)
{
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16")) {
        cvt_row_bf16_unit(dst, src, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, src + i, sizeof u);
        if (!(u & 0x7f800000u)) /* zero or denormal */
            u &= 0x80000000u;
        float f;
        memcpy(&f, &u, sizeof f);
        dst[i] = ddp__f32_to_bf16(f);
    }
}

/* rows × cols of src (leading dimension ld) into dst, packed (leading dimension cols). */
static void cvt_matrix(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    for (int r = 0; r < rows; r++)
        cvt_row_bf16(dst + (size_t)r * cols, src + (size_t)r * ld, cols);
}

void ddp__bf16_round(uint16_t *dst, const float *src, int n)
{
    cvt_row_bf16(dst, src, n);
}

/* ---- per-thread state: a stream, operand buffers, a few primitives --------------------------- *
 * The primitives take their sizes, leading dimensions and alpha at run time (oneDNN's
 * DNNL_RUNTIME_DIM_VAL / _F32_VAL; its gemm-based bf16 kernel): one primitive serves every shape,
 * so a model whose shapes change from call to call (generation, a last short batch) never waits
 * for a primitive to be compiled, and which kernel computes a product never depends on what ran
 * before — a resumed run's products are bit for bit the uninterrupted run's. Operands are given
 * as stored, transposed or not (strides (1, ld)): that kernel runs a transposed B at the speed of
 * an untransposed one (within 3% on GPT's shapes, bench/onednn_shapes.c), so nothing is
 * transposed here. A primitive per (transposed A, transposed B, beta): which of an operand's two
 * strides is 1 and beta (a post-op's scale) are fixed when the primitive is made. */

typedef struct prim {
    bool used, ta, tb;
    float beta;
    dnnl_primitive_t p;
    dnnl_dim_t M, N, K, lda, ldb, ldc; /* a fixed-shape primitive's shape; 0 for run-time */
    dnnl_memory_t mem[4]; /* fixed shape: its A, B, C and alpha, handles set per product */
} prim;

enum { NPRIM = 12 }; /* distinct (ta, tb, beta) kept; layers use beta 0 and 1: 8 */
/* Small products — every dimension at most 512 and a multiple of 16: the attention's per-head
 * blocks — run in primitives made for their exact shape, for which oneDNN picks its brgemm
 * kernels where the operands are packed (strided ones still get gemm:jit): up to 1.2× faster
 * there than the run-time-sized gemm:jit (bench/onednn_shapes.c); the large products (linear
 * layers) run as fast in either. Which kernel computes a product is still a function of
 * its shape alone (a shape leaving the cache is made again the same way), so a resumed run's
 * bits stay the uninterrupted run's; shapes off the grid of 16 (generation's growing contexts, a
 * short last block) take the run-time primitive and never wait for one to be made. */
enum { NFIXED = 64 };

static bool fixed_shape(int M, int N, int K)
{
    return M <= 512 && N <= 512 && K <= 512 && M % 16 == 0 && N % 16 == 0 && K % 16 == 0;
}

typedef struct tstate {
    struct tstate *next; /* every thread's state, reachable from `states` */
    dnnl_stream_t stream;
    uint16_t *abuf, *bbuf, *keep[DDP__BF16_SLOTS];
    size_t acap, bcap, keepcap[DDP__BF16_SLOTS]; /* elements */
    unsigned forks;                              /* `forks` when tab was last emptied */
    prim tab[NPRIM];
    int next_evict;
    prim fixed[NFIXED]; /* fixed-shape primitives, replaced in turn */
    int next_fixed;
} tstate;

static pthread_key_t tkey;
static pthread_once_t tkey_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t states_mu = PTHREAD_MUTEX_INITIALIZER;
static tstate *states;

static void prim_drop(prim *e)
{
    if (e->p)
        dn.dnnl_primitive_destroy(e->p);
    for (int i = 0; i < 4; i++)
        if (e->mem[i])
            dn.dnnl_memory_destroy(e->mem[i]);
    memset(e, 0, sizeof *e);
}

static void tstate_free(void *arg)
{
    tstate *s = arg;
    pthread_mutex_lock(&states_mu);
    for (tstate **pp = &states; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&states_mu);
    for (int i = 0; i < NPRIM; i++)
        prim_drop(&s->tab[i]);
    for (int i = 0; i < NFIXED; i++)
        prim_drop(&s->fixed[i]);
    if (s->stream)
        dn.dnnl_stream_destroy(s->stream);
    free(s->abuf);
    free(s->bbuf);
    for (int i = 0; i < DDP__BF16_SLOTS; i++)
        free(s->keep[i]);
    free(s);
}

static bool tkey_ok; /* written once, under tkey_once */

static void tkey_make(void)
{
    /* Without a key (the process has used up PTHREAD_KEYS_MAX) there is no per-thread state:
     * products fall back to float32 rather than use key 0, which belongs to someone else. */
    tkey_ok = pthread_key_create(&tkey, tstate_free) == 0;
}

static tstate *tstate_get(void)
{
    pthread_once(&tkey_once, tkey_make);
    if (!tkey_ok)
        return NULL;
    tstate *s = pthread_getspecific(tkey);
    if (s && s->forks != forks) { /* a fork's child: see after_fork_in_child */
        for (int i = 0; i < NPRIM; i++)
            prim_drop(&s->tab[i]);
        for (int i = 0; i < NFIXED; i++)
            prim_drop(&s->fixed[i]);
        s->forks = forks;
    }
    if (s)
        return s;
    if (!(s = calloc(1, sizeof *s)))
        return NULL;
    s->forks = forks;
    if (dn.dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(tkey, s) != 0) {
        if (s->stream)
            dn.dnnl_stream_destroy(s->stream);
        free(s);
        return NULL;
    }
    pthread_mutex_lock(&states_mu);
    s->next = states;
    states = s;
    pthread_mutex_unlock(&states_mu);
    return s;
}

static bool grow(uint16_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return true;
    uint16_t *p = realloc(*buf, n * sizeof *p);
    if (!p)
        return false;
    *buf = p;
    *cap = n;
    return true;
}

/* op(A) (M, K) bf16: A stored (M, K) with strides (lda, 1), or when ta stored (K, M), strides
 * (1, lda); op(B) (K, N) bf16 likewise with ldb and tb; C (M, N) float32 with strides (ldc, 1). */
static bool descs(bool ta, bool tb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, dnnl_dim_t lda,
                  dnnl_dim_t ldb, dnnl_dim_t ldc, dnnl_memory_desc_t *ad, dnnl_memory_desc_t *bd,
                  dnnl_memory_desc_t *cd)
{
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    dnnl_dims_t sa = {ta ? 1 : lda, ta ? lda : 1}, sb = {tb ? 1 : ldb, tb ? ldb : 1};
    dnnl_dims_t sc = {ldc, 1};
    return !dn.dnnl_memory_desc_init_by_strides(ad, 2, da, dnnl_bf16, sa) &&
           !dn.dnnl_memory_desc_init_by_strides(bd, 2, db, dnnl_bf16, sb) &&
           !dn.dnnl_memory_desc_init_by_strides(cd, 2, dc, dnnl_f32, sc);
}

/* A primitive for (ta, tb, beta) and, when M > 0, that exact shape; else every size at run time. */
static bool prim_make(prim *e, bool ta, bool tb, float beta, dnnl_dim_t M, dnnl_dim_t N,
                      dnnl_dim_t K, dnnl_dim_t lda, dnnl_dim_t ldb, dnnl_dim_t ldc)
{
    const dnnl_dim_t R = DNNL_RUNTIME_DIM_VAL;
    const float rs = DNNL_RUNTIME_F32_VAL;
    const bool fx = M > 0;
    dnnl_memory_desc_t ad, bd, cd;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = false;
    memset(e, 0, sizeof *e);
    if (!descs(ta, tb, fx ? M : R, fx ? N : R, fx ? K : R, fx ? lda : R, fx ? ldb : R, fx ? ldc : R,
               &ad, &bd, &cd) ||
        dn.dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd) ||
        dn.dnnl_primitive_attr_create(&attr) ||
        dn.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &rs))
        goto out;
    if (beta != 0.0f) {
        if (dn.dnnl_post_ops_create(&po) || dn.dnnl_post_ops_append_sum(po, beta) ||
            dn.dnnl_primitive_attr_set_post_ops(attr, po))
            goto out;
    }
    if (dn.dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL) ||
        dn.dnnl_primitive_create(&e->p, pd))
        goto out;
    e->used = true;
    e->ta = ta;
    e->tb = tb;
    e->beta = beta;
    if (fx) {
        dnnl_memory_desc_t scd;
        dnnl_dims_t one = {1};
        if (dn.dnnl_memory_desc_init_by_strides(&scd, 1, one, dnnl_f32, one) ||
            dn.dnnl_memory_create(&e->mem[0], &ad, engine, DNNL_MEMORY_NONE) ||
            dn.dnnl_memory_create(&e->mem[1], &bd, engine, DNNL_MEMORY_NONE) ||
            dn.dnnl_memory_create(&e->mem[2], &cd, engine, DNNL_MEMORY_NONE) ||
            dn.dnnl_memory_create(&e->mem[3], &scd, engine, DNNL_MEMORY_NONE))
            goto out;
        e->M = M, e->N = N, e->K = K, e->lda = lda, e->ldb = ldb, e->ldc = ldc;
    }
    ok = true;
out:
    if (pd)
        dn.dnnl_primitive_desc_destroy(pd);
    if (po)
        dn.dnnl_post_ops_destroy(po);
    if (attr)
        dn.dnnl_primitive_attr_destroy(attr);
    if (!ok)
        prim_drop(e);
    return ok;
}

static prim *prim_find(tstate *s, bool ta, bool tb, float beta)
{
    for (int i = 0; i < NPRIM; i++)
        if (s->tab[i].used && s->tab[i].ta == ta && s->tab[i].tb == tb && s->tab[i].beta == beta)
            return &s->tab[i];
    prim *e = NULL;
    for (int i = 0; i < NPRIM && !e; i++)
        if (!s->tab[i].used)
            e = &s->tab[i];
    if (!e) { /* more betas than slots: replace in turn */
        e = &s->tab[s->next_evict];
        s->next_evict = (s->next_evict + 1) % NPRIM;
        prim_drop(e);
    }
    return prim_make(e, ta, tb, beta, 0, 0, 0, 0, 0, 0) ? e : NULL;
}

/* The thread's primitive for exactly this product, made if missing. */
static prim *fixed_find(tstate *s, bool ta, bool tb, float beta, int M, int N, int K, int lda,
                        int ldb, int ldc)
{
    for (int i = 0; i < NFIXED; i++) {
        const prim *f = &s->fixed[i];
        if (f->used && f->ta == ta && f->tb == tb && f->beta == beta && f->M == M && f->N == N &&
            f->K == K && f->lda == lda && f->ldb == ldb && f->ldc == ldc)
            return &s->fixed[i];
    }
    prim *e = &s->fixed[s->next_fixed];
    s->next_fixed = (s->next_fixed + 1) % NFIXED;
    prim_drop(e);
    return prim_make(e, ta, tb, beta, M, N, K, lda, ldb, ldc) ? e : NULL;
}

/* The product on bf16 operands as stored (descs), through the thread's primitive. */
static bool run_bf16(tstate *s, bool ta, bool tb, int M, int N, int K, float alpha,
                     const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
                     int ldc)
{
    prim *e = fixed_shape(M, N, K) ? fixed_find(s, ta, tb, beta, M, N, K, lda, ldb, ldc)
                                   : prim_find(s, ta, tb, beta);
    if (e && e->M) { /* fixed shape: its memory objects, given this product's pointers */
        /* oneDNN's memory objects take a non-const handle; a matmul only reads its sources. */
        void *h[4] = {(void *)(uintptr_t)A, (void *)(uintptr_t)B, C, &alpha};
        for (int i = 0; i < 4; i++)
            if (dn.dnnl_memory_set_data_handle(e->mem[i], h[i]))
                return false;
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->mem[0]},
                                   {DNNL_ARG_WEIGHTS, e->mem[1]},
                                   {DNNL_ARG_DST, e->mem[2]},
                                   {DNNL_ARG_ATTR_OUTPUT_SCALES, e->mem[3]}};
        return dn.dnnl_primitive_execute(e->p, s->stream, 4, args) == dnnl_success &&
               dn.dnnl_stream_wait(s->stream) == dnnl_success;
    }
    dnnl_memory_desc_t ad, bd, cd, scd;
    dnnl_dims_t one = {1};
    if (!e || !descs(ta, tb, M, N, K, lda, ldb, ldc, &ad, &bd, &cd) ||
        dn.dnnl_memory_desc_init_by_strides(&scd, 1, one, dnnl_f32, one))
        return false;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, msc = NULL;
    /* oneDNN's memory objects take a non-const handle; a matmul only reads its sources. */
    bool ok = !dn.dnnl_memory_create(&ma, &ad, engine, (void *)(uintptr_t)A) &&
              !dn.dnnl_memory_create(&mb, &bd, engine, (void *)(uintptr_t)B) &&
              !dn.dnnl_memory_create(&mc, &cd, engine, C) &&
              !dn.dnnl_memory_create(&msc, &scd, engine, &alpha);
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma},
                                   {DNNL_ARG_WEIGHTS, mb},
                                   {DNNL_ARG_DST, mc},
                                   {DNNL_ARG_ATTR_OUTPUT_SCALES, msc}};
        ok = dn.dnnl_primitive_execute(e->p, s->stream, 4, args) == dnnl_success &&
             dn.dnnl_stream_wait(s->stream) == dnnl_success;
    }
    dnnl_memory_t mems[4] = {ma, mb, mc, msc};
    for (int i = 0; i < 4; i++)
        if (mems[i])
            dn.dnnl_memory_destroy(mems[i]);
    return ok;
}

static bool gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    if (ddp__gemm_bf16_check(NULL) != DDP_OK)
        return false;
    tstate *s = tstate_get();
    if (!s || !grow(&s->abuf, &s->acap, (size_t)M * K) || !grow(&s->bbuf, &s->bcap, (size_t)K * N))
        return false;
    /* Each operand packed as stored: A (M, K), or (K, M) when transposed; B (K, N) or (N, K). */
    int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    cvt_matrix(s->abuf, A, ar, ac, lda);
    cvt_matrix(s->bbuf, B, br, bc, ldb);
    return run_bf16(s, trans_a, trans_b, M, N, K, alpha, s->abuf, ac, s->bbuf, bc, beta, C, ldc);
}

bool ddp__gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    atomic_fetch_add(&products, 1);
    if (gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return true;
    atomic_fetch_add(&fallbacks, 1);
    return false;
}

static bool gemm_bf16_pre(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                          const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                          float *C, int ldc)
{
    tstate *s;
    return ddp__gemm_bf16_check(NULL) == DDP_OK && (s = tstate_get()) &&
           run_bf16(s, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool ddp__gemm_bf16_active(void)
{
    return tl_kind == DDP__GEMM_BF16 && ddp__gemm_bf16_check(NULL) == DDP_OK;
}

const uint16_t *ddp__bf16_rounded(int slot, const float *src, int rows, int cols, int ld)
{
    tstate *s;
    if (slot < 0 || slot >= DDP__BF16_SLOTS || ddp__gemm_bf16_check(NULL) != DDP_OK ||
        !(s = tstate_get()) || !grow(&s->keep[slot], &s->keepcap[slot], (size_t)rows * cols))
        return NULL;
    cvt_matrix(s->keep[slot], src, rows, cols, ld);
    return s->keep[slot];
}

#endif /* DDP_HAVE_ONEDNN */

/* The plain loop behind ddp__gemm_bf16_pre when oneDNN cannot run the product: the same operands,
 * widened exactly, accumulated in float32. Slow, and only for what should not happen (out of
 * memory, a oneDNN error): it keeps a layer that holds only bf16 operands correct. */
static void gemm_bf16_loop(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                           const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                           float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                uint16_t a = trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                uint16_t b = trans_b ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                acc += ddp__bf16_to_f32(a) * ddp__bf16_to_f32(b);
            }
            float *c = C + (size_t)i * ldc + j;
            *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
        }
}

void ddp__gemm_bf16_pre(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
                        float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K > 0)
        atomic_fetch_add(&products, 1);
    if (K > 0 && gemm_bf16_pre(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    if (K > 0)
        atomic_fetch_add(&fallbacks, 1);
    gemm_bf16_loop(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
