/*
 * gpt_dump — trains the library's GPT (model.type gpt) for a few steps on token files, for
 * test_gpt_torch.py to compare with the torch twin (gpt_twin.py), and times whole training steps
 * for bench/gpt_model_step.py.
 * Usage:
 * Environment: DDP_GPT_DUMP_DEVICE=cuda runs the model on the GPU, DDP_GPT_DUMP_PRECISION
 * (fp32, tf32, bf16, fp16) sets its precision; fp16 trains with GradScaler's loop (ddp/amp.h)
 * and writes DIR/out_scale.bin (float64 (STEPS,): the loss scale each step used).
 *   gpt_dump DIR train L NH C T V BIAS B STEPS LR DROPOUT
 *       in:  DIR/weights.safetensors (optional: every parameter, by name; else the model's init)
 *            DIR/tokens.bin, DIR/targets.bin (int32, STEPS × B × T)
 *       out: DIR/out_init.safetensors   the model's own initial weights (before loading)
 *            DIR/out_eval.bin           float64: the evaluation loss of batch 0 before training
 *            DIR/out_logits.bin         float32 (B·T, V): the evaluation logits of batch 0
 *            DIR/out_loss.bin           float64 (STEPS,): each training step's loss
 *            DIR/out_norm.bin           float64 (STEPS,): each step's gradient norm, before
 * clipping DIR/out_grads.safetensors  step 1's gradients, before clipping
 *            DIR/out_step1.safetensors, DIR/out_final.safetensors: weights after step 1, after all
 *       Each step: forward (training mode), backward, clip the global norm to 1.0, AdamW (betas
 *       0.9, 0.95, eps 1e-8, weight decay 0.1 on the 2-D tensors, constant LR), step = 1, 2, ….
 *   gpt_dump - bench L NH C T V B STEPS
 *       The same training step on random tokens, STEPS times after 3 warm-up steps; prints the
 *       median, min and mean ms per step (wall clock), the median CPU time per step (the
 *       process's: what a loaded machine does not inflate), the FLOPs count, and the memory: peak
 * RSS of the process (VmHWM), its RSS before the model was built, and the bytes of parameters,
 *       gradients, AdamW state and activations computed from the shapes (docs/nn.md); and the
 *       step's matrix-product FLOPs at the rate of one sgemm of the model's shapes (the floor of
 *       a BLAS-bound step).
 * A test tool: any error prints a line and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"

static const char *dir;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "gpt_dump: %s %s\n", what, detail);
    exit(1);
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p)
        die("out of memory", "");
    return p;
}

static void *rd(const char *name, size_t n, size_t sz)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open", path);
    void *p = xcalloc(n, sz);
    size_t got = fread(p, sz, n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF)
        die("wrong size of", path);
    return p;
}

static void wr(const char *name, const void *p, size_t n, size_t sz)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sz, n, f) != n || fclose(f) != 0)
        die("cannot write", path);
}

/* Writes the parameters' values (grads false) or gradients as DIR/name. */
static void save(ddp_model *m, const char *name, bool grads)
{
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    ddp_ckpt_tensor *t = xcalloc(n, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        t[i].name = p[i].name;
        t[i].dtype = DDP_FLOAT32;
        t[i].ndim = p[i].ndim;
        for (int d = 0; d < p[i].ndim; d++)
            t[i].shape[d] = p[i].shape[d];
        t[i].data = grads ? p[i].grad : p[i].data;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ddp_error err = {0};
    if (ddp_ckpt_save(path, t, n, NULL, NULL, 0, &err) != DDP_OK)
        die(err.msg, "");
    free(t);
}

/* Loads every parameter by name from DIR/weights.safetensors, if the file exists. */
static void load(ddp_model *m)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/weights.safetensors", dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    fclose(f);
    ddp_ckpt *c;
    ddp_error err = {0};
    if (ddp_ckpt_open(path, &c, &err) != DDP_OK)
        die(err.msg, "");
    size_t n;
    const ddp_model_param *p = ddp_model_params(m, &n);
    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor *t = ddp_ckpt_find(c, p[i].name);
        if (!t || t->dtype != DDP_FLOAT32 || t->ndim != p[i].ndim)
            die("missing or mismatched tensor", p[i].name);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] != p[i].shape[d])
                die("wrong shape of", p[i].name);
        memcpy(p[i].data, t->data, sizeof(float) * p[i].count);
    }
    ddp_ckpt_close(c);
}

static double clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A "VmRSS:"/"VmHWM:" line of /proc/self/status, in bytes (0 if unreadable). */
static double proc_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key)))
            v = strtod(line + strlen(key), NULL) * 1024.0;
    if (f)
        fclose(f);
    return v;
}

typedef struct trainer {
    ddp_model *m;
    ddp_optim *opt;
    float **grads;
    size_t *counts;
    size_t np;
} trainer;

static trainer make_trainer(const ddp_model_spec *s)
{
    trainer t = {0};
    ddp_error err = {0};
    if (ddp_model_build(s, &t.m, &err) != DDP_OK)
        die(err.msg, "");
    return t;
}

static void make_optimizer(trainer *t)
{
    ddp_error err = {0};
    const ddp_model_param *p = ddp_model_params(t->m, &t->np);
    ddp_optim_opts oo = DDP_OPTIM_OPTS_INIT;
    oo.kind = DDP_OPTIM_ADAMW;
    oo.beta1 = 0.9f;
    oo.beta2 = 0.95f;
    oo.eps = 1e-8f;
    oo.weight_decay = 0.1f;
    if (ddp_optim_create(&oo, p, t->np, &t->opt, &err) != DDP_OK)
        die(err.msg, "");
    t->grads = xcalloc(t->np, sizeof *t->grads);
    t->counts = xcalloc(t->np, sizeof *t->counts);
}

/* forward + backward: the loss; the gradients are left in the parameters' grad. */
static double forward_backward(trainer *t, const ddp_model_batch *b)
{
    ddp_model_out out;
    ddp_model_zero_grad(t->m);
    if (ddp_model_forward(t->m, b, true, &out) != DDP_OK ||
        ddp_model_backward(t->m, NULL, NULL) != DDP_OK)
        die(ddp_model_last_error(t->m), "");
    return out.loss;
}

/* clip to norm 1.0, then AdamW: the norm before clipping. */
static double update(trainer *t, uint64_t step, float lr)
{
    const ddp_model_param *p = ddp_model_params(t->m, &t->np);
    for (size_t i = 0; i < t->np; i++) {
        t->grads[i] = p[i].grad;
        t->counts[i] = p[i].count;
    }
    double norm = ddp_nn_clip_grad_norm(t->grads, t->counts, (int)t->np, 1.0);
    ddp_optim_step(t->opt, step, lr, 1.0f);
    return norm;
}

static void free_trainer(trainer *t)
{
    ddp_optim_destroy(t->opt);
    ddp_model_free(t->m);
    free(t->grads);
    free(t->counts);
}

static ddp_model_spec spec_of(int L, int nh, int C, int T, int V, bool bias, int B, float p)
{
    ddp_model_spec s = DDP_MODEL_SPEC_INIT;
    s.type = "gpt";
    s.n_layer = L;
    s.n_head = nh;
    s.n_embd = C;
    s.block_size = T;
    s.vocab_size = V;
    s.bias = bias;
    s.max_batch = B;
    s.dropout = p;
    s.seed = 1234;
    /* DDP_GPT_DUMP_DEVICE=cuda: the model on the GPU (scripts/gpu-check.sh; docs/gpu.md) */
    const char *dev = getenv("DDP_GPT_DUMP_DEVICE");
    if (dev && !strcmp(dev, "cuda"))
        s.device = DDP_DEVICE_CUDA;
    /* DDP_GPT_DUMP_PRECISION=bf16 (or fp16, tf32, fp32): the model's precision */
    const char *prec = getenv("DDP_GPT_DUMP_PRECISION");
    ddp_error err = {0};
    if (prec && *prec && ddp_precision_parse(prec, &s.precision, &err) != DDP_OK)
        die(err.msg, "");
    return s;
}

static void train(int L, int nh, int C, int T, int V, bool bias, int B, int steps, float lr,
                  float p)
{
    ddp_model_spec s = spec_of(L, nh, C, T, V, bias, B, p);
    trainer t = make_trainer(&s);
    save(t.m, "out_init.safetensors", false);
    load(t.m);
    make_optimizer(&t);
    size_t per = (size_t)B * T;
    int32_t *tokens = rd("tokens.bin", per * (size_t)steps, sizeof(int32_t));
    int32_t *targets = rd("targets.bin", per * (size_t)steps, sizeof(int32_t));
    ddp_model_batch b = {.n = B, .tokens = tokens, .targets = targets, .seq_len = T};
    ddp_model_out out;
    if (ddp_model_forward(t.m, &b, false, &out) != DDP_OK)
        die(ddp_model_last_error(t.m), "");
    wr("out_eval.bin", &out.loss, 1, sizeof(double));
    size_t rows, cols;
    const float *lg = ddp_model_logits(t.m, &rows, &cols);
    wr("out_logits.bin", lg, rows * cols, sizeof(float));
    double *loss = xcalloc((size_t)steps, sizeof(double));
    double *norm = xcalloc((size_t)steps, sizeof(double));
    double *scale = xcalloc((size_t)steps, sizeof(double));
    /* precision fp16: torch's GradScaler loop (ddp/amp.h): the loss scaled, the gradients
     * unscaled and checked, an inf/NaN step skipped (AdamW's count with it) and the scale
     * updated; out_scale.bin has the scale each step used */
    const bool amp = s.precision == DDP_PRECISION_FP16;
    ddp_grad_scaler scaler = DDP_GRAD_SCALER_INIT;
    uint64_t optim_step = 0;
    for (int k = 0; k < steps; k++) {
        b.tokens = tokens + per * (size_t)k;
        b.targets = targets + per * (size_t)k;
        b.step = (uint64_t)k;
        b.sample_offset = (uint64_t)k * (uint64_t)B;
        b.grad_scale = amp ? scaler.scale : 1.0f;
        scale[k] = b.grad_scale;
        loss[k] = forward_backward(&t, &b);
        bool take = true;
        if (amp) {
            const ddp_model_param *pm = ddp_model_params(t.m, &t.np);
            for (size_t i = 0; i < t.np; i++) {
                t.grads[i] = pm[i].grad;
                t.counts[i] = pm[i].count;
            }
            take = ddp_grad_scaler_update(
                &scaler, ddp_grad_scaler_unscale(&scaler, t.grads, t.counts, (int)t.np));
        }
        if (k == 0)
            save(t.m, "out_grads.safetensors", true);
        norm[k] = take ? update(&t, ++optim_step, lr) : NAN;
        if (k == 0)
            save(t.m, "out_step1.safetensors", false);
    }
    if (amp)
        wr("out_scale.bin", scale, (size_t)steps, sizeof(double));
    save(t.m, "out_final.safetensors", false);
    wr("out_loss.bin", loss, (size_t)steps, sizeof(double));
    wr("out_norm.bin", norm, (size_t)steps, sizeof(double));
    free(loss);
    free(norm);
    free(scale);
    free(tokens);
    free(targets);
    free_trainer(&t);
}

static void bench(int L, int nh, int C, int T, int V, int B, int steps)
{
    /* OpenBLAS's buffers and the libraries are in the baseline: one small product first. */
    {
        float a[64] = {0}, c[64];
        ddp_nn_linear_forward(a, a, NULL, 8, 8, 8, c);
    }
    double rss0 = proc_kb("VmRSS:");
    ddp_model_spec s = spec_of(L, nh, C, T, V, true, B, 0.0f);
    trainer t = make_trainer(&s);
    make_optimizer(&t);
    size_t per = (size_t)B * T;
    int32_t *tokens = xcalloc(per, sizeof(int32_t)), *targets = xcalloc(per, sizeof(int32_t));
    double *ms = xcalloc((size_t)steps, sizeof(double)),
           *cpu = xcalloc((size_t)steps, sizeof(double));
    ddp_model_batch b = {.n = B, .tokens = tokens, .targets = targets, .seq_len = T};
    double loss = 0;
    for (int k = -3; k < steps; k++) {
        for (size_t i = 0; i < per; i++) {
            uint64_t r = ddp_nn_rand_u64(99, (uint64_t)(k + 3), i);
            tokens[i] = (int32_t)(r % (uint64_t)V);
            targets[i] = (int32_t)((r >> 32) % (uint64_t)V);
        }
        b.step = (uint64_t)(k + 3);
        double t0 = clock_ms(CLOCK_MONOTONIC), c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
        loss = forward_backward(&t, &b);
        update(&t, (uint64_t)(k + 4), 3e-4f);
        if (k >= 0) {
            ms[k] = clock_ms(CLOCK_MONOTONIC) - t0;
            cpu[k] = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    }
    double hwm = proc_kb("VmHWM:"), mean = 0;
    for (int k = 0; k < steps; k++)
        mean += ms[k] / steps;
    double med = median(ms, steps), cmed = median(cpu, steps);
    /* Bytes from the shapes (docs/nn.md): parameters P, gradients P, AdamW 2P; activations per
     * token: (16·L + 5)·C + (4 + nh)·L + 2 + V floats, plus the attention scratch and the
     * backward's (N, 4C) buffer. */
    size_t np;
    const ddp_model_param *p = ddp_model_params(t.m, &np);
    double P = 0;
    for (size_t i = 0; i < np; i++)
        P += (double)p[i].count;
    double N = (double)B * T;
    double act =
        N * ((16.0 * L + 5.0) * C + (4.0 + nh) * L + 2.0 + V + 4.0 * C) + (2.0 * 64 + 1) * T;
    double model_bytes = 4.0 * (4.0 * P + act);
    double flops = ddp_model_flops_per_sample(t.m, T) * B;
    printf("ddpc gpt L%d C%d NH%d T%d B%d V%d: %.3f ms/step median (min %.3f, mean %.3f, %d "
           "steps), CPU %.3f ms/step median, loss %.4f, %.2f GFLOP/step, %.1f GFLOP/s (CPU "
           "time)\n",
           L, C, nh, T, B, V, med, ms[0], mean, steps, cmed, loss, flops / 1e9, flops / cmed / 1e6);
    printf("memory: params %.0f (%.2f MB), params+grads+adamw %.2f MB, activations %.2f MB, "
           "model total %.2f MB; RSS before build %.2f MB, peak RSS %.2f MB, peak − before "
           "%.2f MB = %.3f × model total\n",
           P, 4 * P / 1e6, 16 * P / 1e6, 4 * act / 1e6, model_bytes / 1e6, rss0 / 1e6, hwm / 1e6,
           (hwm - rss0) / 1e6, (hwm - rss0) / model_bytes);
    /* The floor a BLAS-bound step cannot go below: the step's matrix products (linears 2+4
     * FLOPs per weight and token; the tied head likewise; attention: 2 products forward and 5
     * backward of 2·hs FLOPs per score over the causal blocks the kernel computes) at the rate
     * of one (B·T, C) × (C, 4C) product, c_fc's, timed here in CPU time. */
    double lin = 6.0 * (12.0 * C * C * L + (double)V * C) * N, scores = 0;
    for (int r0 = 0; r0 < T; r0 += DDP_NN_ATTN_BLOCK) {
        int nr = T - r0 < DDP_NN_ATTN_BLOCK ? T - r0 : DDP_NN_ATTN_BLOCK;
        scores += (double)nr * (r0 + nr);
    }
    double att = 7.0 * 2.0 * C * scores * B * L;
    size_t nx = per * (size_t)C;
    float *x = xcalloc(nx, sizeof(float)), *w = xcalloc((size_t)C * 4 * C, sizeof(float));
    float *y = xcalloc(per * 4 * (size_t)C, sizeof(float));
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)C * 4 * C; i++)
        w[i] = (float)(i % 7) * 0.01f;
    int reps = 0;
    double c0 = clock_ms(CLOCK_PROCESS_CPUTIME_ID), el;
    do {
        ddp_nn_linear_forward(x, w, NULL, (int)per, C, 4 * C, y);
        reps++;
    } while ((el = clock_ms(CLOCK_PROCESS_CPUTIME_ID) - c0) < 300.0);
    double rate = 2.0 * (double)per * C * 4 * C * reps / el / 1e6; /* GFLOP/s */
    printf("matrix products: %.2f GFLOP/step (linears and head %.2f, attention %.2f); sgemm "
           "(%zu, %d) x (%d, %d): %.1f GFLOP/s, so %.1f ms/step at that rate = %.0f%% of the "
           "step's CPU time\n",
           (lin + att) / 1e9, lin / 1e9, att / 1e9, per, C, C, 4 * C, rate,
           (lin + att) / rate / 1e6, 100.0 * (lin + att) / rate / 1e6 / cmed);
    free(x);
    free(w);
    free(y);
    free(ms);
    free(cpu);
    free(tokens);
    free(targets);
    free_trainer(&t);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        die("usage: gpt_dump DIR train|bench ARGS…", "");
    dir = argv[1];
    const char *op = argv[2];
    double a[12] = {0};
    for (int i = 3; i < argc && i < 15; i++)
        a[i - 3] = strtod(argv[i], NULL);
    if (!strcmp(op, "train") && argc == 13)
        train((int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], a[5] != 0, (int)a[6],
              (int)a[7], (float)a[8], (float)a[9]);
    else if (!strcmp(op, "bench") && argc == 10)
        bench((int)a[0], (int)a[1], (int)a[2], (int)a[3], (int)a[4], (int)a[5], (int)a[6]);
    else
        die("unknown operation or wrong argument count:", op);
    return 0;
}
