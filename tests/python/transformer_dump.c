/*
 * transformer_dump — runs one transformer layer of ddp/nn.h on inputs from files, for
 * test_transformer_torch.py to compare with torch, and times attention for bench/attention.py.
 * Usage: transformer_dump DIR OP N1 N2 … where OP and the numbers are
 *   embedding B T C V NPOS                 in: idx (int32) wte wpe dx dwte dwpe
 *                                          out: x dwte dwpe
 *   layernorm N C BIAS                     in: x w b dy dw db     out: y mean rstd dx dw db
 *   gelu_tanh N                            in: x dy               out: y dx
 *   attention B T C NH P SEED STEP OFFSET TRAIN
 *                                          in: qkv dout           out: out lse dqkv
 *                                                                      mask (B·NH·T·T, P > 0)
 *   lm_head N C V                          in: x wte dlogits dwte out: logits dx dwte
 *   xent N V SCALE INPLACE                 in: logits targets (int32)
 *                                          out: loss (float64) dlogits loss_sum (float64)
 *                                               count (int32) row_loss
 *   gpt L C NH P V BIAS B T                a whole GPT (tiny_gpt.h), loss and gradients:
 *                                          in: params idx targets (int32, B·T each)
 *                                          out: loss (float64) grads
 *   bench_attention B T C NH P REPS        no files: prints the median milliseconds of
 *                                          forward, backward and both over REPS runs
 *   bench_gpt L C NH P V BIAS B DROPOUT REPS
 *                                          no files: the median milliseconds of a training
 *                                          step (zero grads, forward, backward, AdamW) on
 *                                          random tokens, T = P, attention dropout DROPOUT
 * Input NAME is read from DIR/NAME.bin, output NAME written to DIR/out_NAME.bin, raw
 * little-endian float32 unless noted. Parameter gradients start from the input files' values
 * and accumulate, so the accumulation is checked too. attention's mask is the documented keep
 * rule evaluated here independently (1/(1 − p) kept, 0 dropped), for torch to apply.
 * A test tool: any error prints a line and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/nn.h"
#include "dump_io.h"
#include "tiny_gpt.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Times attention forward and backward at one shape (random inputs) and prints the medians. */
static void bench_attention(int B, int T, int C, int nh, float p, int reps)
{
    ddp_error err = {0};
    ddp_nn_attention a = {C, nh, T, p, 0, 0};
    if (ddp_nn_attention_setup(&a, &err) != DDP_OK)
        die(err.msg, "bench_attention");
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C;
    float *qkv = zalloc(nq), *dqkv = zalloc(nq), *out = zalloc(no), *dout = zalloc(no);
    float *lse = zalloc((size_t)B * nh * T), *scratch = zalloc(a.scratch_floats);
    for (size_t i = 0; i < nq; i++)
        qkv[i] = (float)((ddp_nn_rand_u64(1, 0, i) >> 40) * (2.0 / 16777216.0) - 1.0);
    for (size_t i = 0; i < no; i++)
        dout[i] = (float)((ddp_nn_rand_u64(1, 1, i) >> 40) * (2.0 / 16777216.0) - 1.0);
    double *tf = track(calloc((size_t)reps, sizeof(double)));
    double *tb = track(calloc((size_t)reps, sizeof(double)));
    double *tt = track(calloc((size_t)reps, sizeof(double)));
    for (int r = -2; r < reps; r++) { /* two warm-up runs */
        double t0 = now_ms();
        ddp_nn_attention_forward(&a, qkv, B, T, 7, (uint64_t)r, 0, true, scratch, out, lse);
        double t1 = now_ms();
        ddp_nn_attention_backward(&a, dout, qkv, lse, B, T, 7, (uint64_t)r, 0, true, scratch, dqkv);
        double t2 = now_ms();
        if (r >= 0)
            tf[r] = t1 - t0, tb[r] = t2 - t1, tt[r] = t2 - t0;
    }
    printf("ddpc attention B=%d T=%d C=%d nh=%d p=%g: forward %.3f ms, backward %.3f ms, "
           "both %.3f ms (median of %d)\n",
           B, T, C, nh, (double)p, median(tf, reps), median(tb, reps), median(tt, reps), reps);
}

/* Random tokens in [0, V). */
static void tokens(int32_t *t, size_t n, int V, uint64_t stream)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(ddp_nn_rand_u64(3, stream, i) % (uint64_t)V);
}

/* Times whole training steps of tiny_gpt and prints the medians of their parts. */
static void bench_gpt(const tiny_gpt_cfg *c, int B, int reps)
{
    tiny_gpt *m = tiny_gpt_new(c, B);
    if (!m)
        die("cannot build the model", "bench_gpt");
    size_t n = tiny_gpt_n_params(m), N = (size_t)B * c->P;
    float *p = tiny_gpt_params(m), *g = tiny_gpt_grads(m), *m1 = zalloc(n), *m2 = zalloc(n);
    ddp_nn_init_normal(p, n, 0.02f, 1, 0);
    int32_t *idx = track(calloc(N, sizeof(int32_t))), *tg = track(calloc(N, sizeof(int32_t)));
    double *tf = track(calloc((size_t)reps, sizeof(double)));
    double *tb = track(calloc((size_t)reps, sizeof(double)));
    double *to = track(calloc((size_t)reps, sizeof(double)));
    double *tt = track(calloc((size_t)reps, sizeof(double)));
    double loss = 0;
    for (int r = -2; r < reps; r++) { /* two warm-up steps */
        tokens(idx, N, c->V, 2 * (uint64_t)(r + 2)), tokens(tg, N, c->V, 2 * (uint64_t)(r + 2) + 1);
        double t0 = now_ms();
        memset(g, 0, sizeof(float) * n);
        if (tiny_gpt_forward(m, idx, tg, B, c->P, (uint64_t)(r + 2), &loss))
            die("forward failed", "bench_gpt");
        double t1 = now_ms();
        tiny_gpt_backward(m, (uint64_t)(r + 2));
        double t2 = now_ms();
        ddp_nn_adamw_step(p, g, m1, m2, n, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, (uint64_t)(r + 3));
        double t3 = now_ms();
        if (r >= 0)
            tf[r] = t1 - t0, tb[r] = t2 - t1, to[r] = t3 - t2, tt[r] = t3 - t0;
    }
    printf("ddpc gpt L=%d C=%d nh=%d T=%d B=%d V=%d bias=%d dropout=%g (%zu params): step %.3f ms "
           "(forward %.3f, backward %.3f, adamw %.3f; median of %d), loss %.4f\n",
           c->L, c->C, c->nh, c->P, B, c->V, c->bias, (double)c->attn_dropout, n, median(tt, reps),
           median(tf, reps), median(tb, reps), median(to, reps), reps, loss);
    tiny_gpt_free(m);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: transformer_dump DIR OP ARGS…\n");
        return 1;
    }
    dump_init("transformer_dump", argv[1]);
    const char *op = argv[2];
    double a[10] = {0};
    for (int i = 3; i < argc && i < 13; i++)
        a[i - 3] = strtod(argv[i], NULL);
    ddp_error err = {0};

    if (!strcmp(op, "embedding")) {
        int B = (int)a[0], T = (int)a[1], C = (int)a[2], V = (int)a[3], np = (int)a[4];
        size_t n = (size_t)B * T * C;
        int32_t *idx = rd("idx", (size_t)B * T, sizeof(int32_t));
        float *wte = rdf("wte", (size_t)V * C), *wpe = rdf("wpe", (size_t)np * C);
        float *dx = rdf("dx", n), *dwte = rdf("dwte", (size_t)V * C);
        float *dwpe = rdf("dwpe", (size_t)np * C), *x = zalloc(n);
        if (ddp_nn_embedding_forward(idx, wte, wpe, B, T, C, V, np, x, &err) != DDP_OK)
            die(err.msg, op);
        ddp_nn_embedding_backward(dx, idx, B, T, C, dwte, dwpe);
        wrf("x", x, n), wrf("dwte", dwte, (size_t)V * C), wrf("dwpe", dwpe, (size_t)np * C);
    } else if (!strcmp(op, "layernorm")) {
        int N = (int)a[0], C = (int)a[1];
        bool has_bias = a[2] != 0;
        size_t n = (size_t)N * C;
        float *x = rdf("x", n), *w = rdf("w", C), *b = has_bias ? rdf("b", C) : NULL;
        float *dy = rdf("dy", n), *dw = rdf("dw", C), *db = has_bias ? rdf("db", C) : NULL;
        float *y = zalloc(n), *mean = zalloc(N), *rstd = zalloc(N), *dx = zalloc(n);
        ddp_nn_layernorm_forward(x, w, b, N, C, 1e-5f, y, mean, rstd);
        ddp_nn_layernorm_backward(dy, x, w, mean, rstd, N, C, dx, dw, db);
        wrf("y", y, n), wrf("mean", mean, N), wrf("rstd", rstd, N), wrf("dx", dx, n);
        wrf("dw", dw, C);
        if (has_bias)
            wrf("db", db, C);
    } else if (!strcmp(op, "gelu_tanh")) {
        size_t n = (size_t)a[0];
        float *x = rdf("x", n), *dy = rdf("dy", n), *y = zalloc(n), *dx = zalloc(n);
        ddp_nn_gelu_tanh_forward(x, n, y);
        ddp_nn_gelu_tanh_backward(dy, x, n, dx);
        wrf("y", y, n), wrf("dx", dx, n);
    } else if (!strcmp(op, "attention")) {
        int B = (int)a[0], T = (int)a[1], C = (int)a[2], nh = (int)a[3];
        float p = (float)a[4];
        uint64_t seed = (uint64_t)a[5], step = (uint64_t)a[6], offset = (uint64_t)a[7];
        bool train = a[8] != 0;
        ddp_nn_attention at = {C, nh, T, p, 0, 0};
        if (ddp_nn_attention_setup(&at, &err) != DDP_OK)
            die(err.msg, op);
        size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * nh * T;
        float *qkv = rdf("qkv", nq), *dout = rdf("dout", no), *out = zalloc(no);
        float *lse = zalloc(nl), *dqkv = zalloc(nq), *scratch = zalloc(at.scratch_floats);
        /* NaN in the scratch: the kernels must not read what they did not write. */
        memset(scratch, 0xff, sizeof(float) * at.scratch_floats);
        ddp_nn_attention_forward(&at, qkv, B, T, seed, step, offset, train, scratch, out, lse);
        memset(scratch, 0xff, sizeof(float) * at.scratch_floats);
        ddp_nn_attention_backward(&at, dout, qkv, lse, B, T, seed, step, offset, train, scratch,
                                  dqkv);
        wrf("out", out, no), wrf("lse", lse, nl), wrf("dqkv", dqkv, nq);
        if (train && p > 0.0f) {
            size_t nm = nl * (size_t)T;
            float *mask = zalloc(nm);
            uint64_t thresh = (uint64_t)((double)p * 4294967296.0);
            for (size_t row = 0; row < nl; row++) {
                uint64_t key = ddp_nn_rand_u64(seed, step, offset + row);
                uint32_t hi = (uint32_t)(key >> 32), lo = (uint32_t)key;
                for (int j = 0; j < T; j++) {
                    uint32_t x = hi ^ (lo + (uint32_t)j * 0x9e3779b9u);
                    x = (x ^ (x >> 16)) * 0x85ebca6bu;
                    x = (x ^ (x >> 13)) * 0xc2b2ae35u;
                    x ^= x >> 16;
                    mask[row * T + j] = x >= thresh ? 1.0f / (1.0f - p) : 0.0f;
                }
            }
            wrf("mask", mask, nm);
        }
    } else if (!strcmp(op, "lm_head")) {
        int N = (int)a[0], C = (int)a[1], V = (int)a[2];
        float *x = rdf("x", (size_t)N * C), *wte = rdf("wte", (size_t)V * C);
        float *dl = rdf("dlogits", (size_t)N * V), *dwte = rdf("dwte", (size_t)V * C);
        float *logits = zalloc((size_t)N * V), *dx = zalloc((size_t)N * C);
        ddp_nn_lm_head_forward(x, wte, N, C, V, logits);
        ddp_nn_lm_head_backward(dl, x, wte, N, C, V, dx, dwte);
        wrf("logits", logits, (size_t)N * V), wrf("dx", dx, (size_t)N * C);
        wrf("dwte", dwte, (size_t)V * C);
    } else if (!strcmp(op, "xent")) {
        int N = (int)a[0], V = (int)a[1], count = 0;
        bool inplace = a[3] != 0;
        size_t n = (size_t)N * V;
        float *l = rdf("logits", n), *rl = zalloc(N);
        int32_t *tg = rd("targets", N, sizeof(int32_t));
        double loss, sum;
        /* The sum first: the in-place mean then overwrites the logits. */
        if (ddp_nn_vocab_xent_sum(l, tg, N, V, &sum, &count, rl, &err) != DDP_OK)
            die(err.msg, op);
        float *d = inplace ? l : zalloc(n);
        if (ddp_nn_vocab_xent(l, tg, N, V, (float)a[2], &loss, d, &err) != DDP_OK)
            die(err.msg, op);
        wr("loss", &loss, 1, sizeof loss), wrf("dlogits", d, n);
        wr("loss_sum", &sum, 1, sizeof sum), wr("count", &count, 1, sizeof count);
        wrf("row_loss", rl, N);
    } else if (!strcmp(op, "gpt")) {
        tiny_gpt_cfg c = {(int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], a[5] != 0, 0.0f};
        int B = (int)a[6], T = (int)a[7];
        tiny_gpt *m = tiny_gpt_new(&c, B);
        if (!m)
            die("cannot build the model", op);
        size_t n = tiny_gpt_n_params(m), N = (size_t)B * T;
        memcpy(tiny_gpt_params(m), rdf("params", n), sizeof(float) * n);
        int32_t *idx = rd("idx", N, sizeof(int32_t)), *tg = rd("targets", N, sizeof(int32_t));
        double loss = 0;
        if (tiny_gpt_forward(m, idx, tg, B, T, 0, &loss)) {
            tiny_gpt_free(m);
            die("forward failed", op);
        }
        tiny_gpt_backward(m, 0);
        wr("loss", &loss, 1, sizeof loss), wrf("grads", tiny_gpt_grads(m), n);
        tiny_gpt_free(m);
    } else if (!strcmp(op, "bench_gpt")) {
        tiny_gpt_cfg c = {(int)a[0], (int)a[1], (int)a[2],  (int)a[3],
                          (int)a[4], a[5] != 0, (float)a[7]};
        bench_gpt(&c, (int)a[6], (int)a[8]);
    } else if (!strcmp(op, "bench_attention")) {
        bench_attention((int)a[0], (int)a[1], (int)a[2], (int)a[3], (float)a[4], (int)a[5]);
    } else {
        die("unknown op", op);
    }
    dump_free_all();
    return 0;
}
