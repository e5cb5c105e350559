/*
 * onednn_shapes.c — the bf16 products of the GPT (L6/C384/T256/B8, one thread) through oneDNN's
 * matmul in the two kinds of primitive kernels/cpu/onednn.c uses: one made for every size at run
 * time (DNNL_RUNTIME_DIM_VAL: oneDNN's gemm:jit), and one made for the exact shape (brgemm).
 * Prints GFLOP/s of each, the implementation oneDNN picked, and the ratio, for the linear
 * layers' products (forward, dx, dW; a transposed operand passed by its strides) and the
 * attention's per-head blocks (64 queries × keys × head size 64). The library uses run-time
 * primitives for the large products and fixed-shape ones for small products on the grid of 16.
 * Build and run: gcc -O2 bench/onednn_shapes.c -o /tmp/onednn_shapes -ldnnl &&
 *   OMP_NUM_THREADS=1 /tmp/onednn_shapes [reps]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        if ((x) != dnnl_success) {                                                                 \
            fprintf(stderr, "onednn_shapes: %s failed (line %d)\n", #x, __LINE__);                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static dnnl_engine_t eng;
static dnnl_stream_t st;

/* GFLOP/s of C (M, N) f32 = op(A) (M, K) · op(B) (K, N), bf16 operands packed as stored, through
 * a primitive for this shape (fixed) or for any (run time); *impl receives oneDNN's name. */
static double rate(int M, int N, int K, int ta, int tb, int fixed, int reps, const char **impl)
{
    const dnnl_dim_t R = DNNL_RUNTIME_DIM_VAL;
    dnnl_dim_t lda = ta ? M : K, ldb = tb ? K : N;
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    dnnl_dims_t sa = {ta ? 1 : lda, ta ? lda : 1}, sb = {tb ? 1 : ldb, tb ? ldb : 1}, sc = {N, 1};
    dnnl_dims_t rd = {R, R}, rsa = {ta ? 1 : R, ta ? R : 1}, rsb = {tb ? 1 : R, tb ? R : 1};
    dnnl_dims_t rsc = {R, 1};
    dnnl_memory_desc_t ad, bd, cd, pa, pb, pc;
    CK(dnnl_memory_desc_init_by_strides(&ad, 2, da, dnnl_bf16, sa));
    CK(dnnl_memory_desc_init_by_strides(&bd, 2, db, dnnl_bf16, sb));
    CK(dnnl_memory_desc_init_by_strides(&cd, 2, dc, dnnl_f32, sc));
    if (fixed) {
        pa = ad, pb = bd, pc = cd;
    } else {
        CK(dnnl_memory_desc_init_by_strides(&pa, 2, rd, dnnl_bf16, rsa));
        CK(dnnl_memory_desc_init_by_strides(&pb, 2, rd, dnnl_bf16, rsb));
        CK(dnnl_memory_desc_init_by_strides(&pc, 2, rd, dnnl_f32, rsc));
    }
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    CK(dnnl_matmul_desc_init(&md, &pa, &pb, NULL, &pc));
    CK(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    CK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, impl));
    CK(dnnl_primitive_create(&p, pd));
    uint16_t *A = malloc(2 * (size_t)M * K), *B = malloc(2 * (size_t)K * N);
    float *C = malloc(4 * (size_t)M * N);
    if (!A || !B || !C) {
        fprintf(stderr, "onednn_shapes: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)M * K; i++)
        A[i] = (uint16_t)(0x3f80 + rand() % 64); /* 1 … 1.5 */
    for (size_t i = 0; i < (size_t)K * N; i++)
        B[i] = (uint16_t)(0xbf80 + rand() % 64); /* −1 … −1.5 */
    dnnl_memory_t ma, mb, mc;
    CK(dnnl_memory_create(&ma, &ad, eng, A));
    CK(dnnl_memory_create(&mb, &bd, eng, B));
    CK(dnnl_memory_create(&mc, &cd, eng, C));
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    double best = 1e30;
    for (int r = 0; r < 3 + reps; r++) { /* the best of reps timed batches, after 3 warm-ups */
        int n = M * N * K > (1 << 24) ? 1 : 50;
        double t0 = now();
        for (int i = 0; i < n; i++) {
            CK(dnnl_primitive_execute(p, st, 3, args));
            CK(dnnl_stream_wait(st));
        }
        double t = (now() - t0) / n;
        if (r >= 3 && t < best)
            best = t;
    }
    dnnl_memory_destroy(ma), dnnl_memory_destroy(mb), dnnl_memory_destroy(mc);
    dnnl_primitive_destroy(p), dnnl_primitive_desc_destroy(pd);
    free(A), free(B), free(C);
    return 2.0 * M * N * K / best * 1e-9;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    CK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    static const struct {
        const char *what;
        int M, N, K, ta, tb;
    } s[] = {
        {"c_attn forward (x·Wᵀ)", 2048, 1152, 384, 0, 1},
        {"c_attn dx (dy·W)", 2048, 384, 1152, 0, 0},
        {"c_attn dW (dyᵀ·x)", 1152, 384, 2048, 1, 0},
        {"c_fc forward", 2048, 1536, 384, 0, 1},
        {"mlp c_proj forward", 2048, 384, 1536, 0, 1},
        {"c_fc dW", 1536, 384, 2048, 1, 0},
        {"scores (q·kᵀ), 256 keys", 64, 256, 64, 0, 1},
        {"scores, 128 keys", 64, 128, 64, 0, 1},
        {"out (p·v), 256 keys", 64, 64, 256, 0, 0},
        {"dv (pᵀ·dout), 256 keys", 256, 64, 64, 1, 0},
    };
    printf("oneDNN bf16 matmul, one thread, GFLOP/s (best of %d): run-time sizes vs this shape\n",
           reps);
    printf("%-26s %16s %10s %-22s %10s %-24s %6s\n", "product", "M×N×K", "run time", "impl",
           "fixed", "impl", "ratio");
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        const char *i0, *i1;
        double r0 = rate(s[i].M, s[i].N, s[i].K, s[i].ta, s[i].tb, 0, reps, &i0);
        double r1 = rate(s[i].M, s[i].N, s[i].K, s[i].ta, s[i].tb, 1, reps, &i1);
        char shape[40];
        snprintf(shape, sizeof shape, "%d×%d×%d%s%s", s[i].M, s[i].N, s[i].K, s[i].ta ? " Aᵀ" : "",
                 s[i].tb ? " Bᵀ" : "");
        printf("%-26s %16s %10.1f %-22s %10.1f %-24s %5.2fx\n", s[i].what, shape, r0, i0, r1, i1,
               r1 / r0);
    }
    return 0;
}
