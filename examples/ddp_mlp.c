/*
 * ddp_mlp — a complete small training program, made data-parallel with libddp.
 *
 * A 3-layer MLP (inputs → hidden → hidden → classes, ReLU, softmax cross-entropy) with forward
 * and backward written by hand, trained with SGD on a synthetic classification task. The lines
 * marked DDP are all it takes to go from one process to many:
 *
 *   ./build/bin/ddp_mlp                                   # one process
 *   ./build/bin/ddprun --nproc_per_node=2 ./build/bin/ddp_mlp   # two, same global batch per rank
 *
 * Options: --steps N --batch B (per rank) --accum A (micro-steps per step, no_sync between)
 *          --hidden H --lr X --seed S --bucket_kb K --bf16 (compress gradients on the wire)
 *          --data DIR (train on DIR/train-{images-idx3,labels-idx1}-ubyte[.gz], e.g.
 *          /usr/share/datasets/fashion-mnist, through the prefetching loader)
 *          --dump FILE (final parameters, rank 0) --quiet
 *
 * Without --data the data are synthetic and encode where they came from: sample i is generated
 * from i alone, so every rank can make any sample, and a sharding bug changes the result.
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddp/ddp.h"

enum { N_CLASSES = 10, N_SAMPLES = 16384 };
static int D_IN = 64; /* 784 with --data */

typedef struct model {
    int H;
    float *w1, *b1, *w2, *b2, *w3, *b3; /* (H,D_IN) (H) (H,H) (H) (C,H) (C) */
} model;

/* A reproducible number in [-1, 1) from (a, b). */
static float hashf(uint64_t a, uint64_t b)
{
    uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* Sample i: its inputs and its label (the argmax of a fixed random linear map). */
static int make_sample(uint64_t i, float *x)
{
    for (int d = 0; d < D_IN; d++)
        x[d] = hashf(i, (uint64_t)d);
    int best = 0;
    float bestv = -1e30f;
    for (int c = 0; c < N_CLASSES; c++) {
        float v = 0;
        for (int d = 0; d < D_IN; d++)
            v += hashf(1000003u + (uint64_t)c, (uint64_t)d) * x[d];
        if (v > bestv) {
            bestv = v;
            best = c;
        }
    }
    return best;
}

static void init(model *m, int H, uint64_t seed)
{
    m->H = H;
    m->w1 = malloc(sizeof(float) * (size_t)H * D_IN);
    m->b1 = calloc((size_t)H, sizeof(float));
    m->w2 = malloc(sizeof(float) * (size_t)H * H);
    m->b2 = calloc((size_t)H, sizeof(float));
    m->w3 = malloc(sizeof(float) * N_CLASSES * (size_t)H);
    m->b3 = calloc(N_CLASSES, sizeof(float));
    float s1 = sqrtf(6.0f / D_IN), s2 = sqrtf(6.0f / (float)H);
    for (size_t i = 0; i < (size_t)H * D_IN; i++)
        m->w1[i] = s1 * hashf(seed, i);
    for (size_t i = 0; i < (size_t)H * H; i++)
        m->w2[i] = s2 * hashf(seed + 1, i);
    for (size_t i = 0; i < (size_t)N_CLASSES * H; i++)
        m->w3[i] = s2 * hashf(seed + 2, i);
}

/* The value of option a as a whole number in [lo, hi] into *out; false (and a line) if it is
 * not one: atoi took "abc" as 0 and "-1" as -1, and a huge --hidden overflowed H × H. */
static bool int_opt(const char *a, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || end == v || *end || n < lo || n > hi) {
        fprintf(stderr, "ddp_mlp: %s '%s' is not a whole number from %ld to %ld\n", a, v, lo, hi);
        return false;
    }
    *out = (int)n;
    return true;
}

int main(int argc, char **argv)
{
    int steps = 50, B = 32, A = 1, H = 256, bucket_kb = 0;
    float lr = 0.05f;
    uint64_t seed = 1;
    bool bf16 = false, quiet = false;
    const char *dump = NULL, *data = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--bf16")) {
            bf16 = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: ddp_mlp [--steps N] [--batch B] [--accum A] [--hidden H] [--lr X] "
                   "[--seed S]\n"
                   "               [--bucket_kb K] [--bf16] [--data DIR] [--dump FILE] [--quiet]\n"
                   "  --batch is per rank; --accum micro-steps per step (no_sync between); --bf16 "
                   "compresses\n"
                   "  gradients on the wire; --data DIR trains on Fashion-MNIST there instead of "
                   "synthetic data\n"
                   "  data-parallel: ddprun --nproc_per_node=2 ddp_mlp [OPTIONS]\n");
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            quiet = true;
            continue;
        }
        bool ok = true;
        char *end;
        if (!strcmp(a, "--steps"))
            ok = int_opt(a, v, 1, 1000000000, &steps);
        else if (!strcmp(a, "--batch"))
            ok = int_opt(a, v, 1, 1 << 16, &B);
        else if (!strcmp(a, "--accum"))
            ok = int_opt(a, v, 1, 1024, &A);
        else if (!strcmp(a, "--hidden"))
            ok = int_opt(a, v, 1, 4096, &H);
        else if (!strcmp(a, "--bucket_kb"))
            ok = int_opt(a, v, 0, 1 << 20, &bucket_kb);
        else if (!strcmp(a, "--lr")) {
            lr = strtof(v, &end);
            if (end == v || *end || !(lr > 0) || isinf(lr)) {
                fprintf(stderr, "ddp_mlp: --lr '%s' is not a positive number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || *v == '-') {
                fprintf(stderr, "ddp_mlp: --seed '%s' is not a whole number ≥ 0\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--dump"))
            dump = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else {
            fprintf(stderr, "ddp_mlp: unknown option '%s' (ddp_mlp --help lists them)\n", a);
            return 2;
        }
        if (!ok)
            return 2;
        i++;
    }

    /* DDP: join the group (a world of one without ddprun). */
    ddp_error err = {0};
    ddp_group *g;
    if (ddp_group_init(NULL, &g, &err) != DDP_OK) {
        fprintf(stderr, "ddp_mlp: %s\n", err.msg);
        return 1;
    }
    int W = ddp_group_size(g), R = ddp_group_rank(g);

    /* Real data: a memory-mapped IDX dataset (decompressed once per host if gzipped). */
    ddp_dataset *ds = NULL;
    if (data) {
        char im[4096], lb[4096];
        snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", data);
        snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", data);
        if (access(im, R_OK) != 0) { /* plain files */
            snprintf(im, sizeof im, "%s/train-images-idx3-ubyte", data);
            snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte", data);
        }
        const char *cache = ddp_group_world(g)->settings.data_cache; /* DDP_DATA_CACHE */
        if (ddp_dataset_open_idx(im, lb, cache, &ds, &err) != DDP_OK) {
            fprintf(stderr, "ddp_mlp: %s\n", err.msg);
            ddp_group_destroy(g);
            return 1;
        }
        D_IN = (int)ddp_dataset_x_elems(ds);
    }
    model m;
    init(&m, H, seed);
    /* DDP: register the parameters; gradients become views into the reducer's buckets. */
    ddp_param params[] = {
        {"fc1.weight", (size_t)H * D_IN, DDP_FLOAT32, m.w1, DDP_DEVICE_CPU},
        {"fc1.bias", (size_t)H, DDP_FLOAT32, m.b1, DDP_DEVICE_CPU},
        {"fc2.weight", (size_t)H * H, DDP_FLOAT32, m.w2, DDP_DEVICE_CPU},
        {"fc2.bias", (size_t)H, DDP_FLOAT32, m.b2, DDP_DEVICE_CPU},
        {"fc3.weight", (size_t)N_CLASSES * H, DDP_FLOAT32, m.w3, DDP_DEVICE_CPU},
        {"fc3.bias", N_CLASSES, DDP_FLOAT32, m.b3, DDP_DEVICE_CPU},
    };
    enum { NP = sizeof params / sizeof params[0] };
    ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
    if (bucket_kb > 0)
        ro.bucket_cap = ro.first_bucket = (size_t)bucket_kb << 10;
    ro.compress_bf16 = bf16;
    ddp_reducer *red;
    if (ddp_reducer_create(g, params, NP, NULL, 0, &ro, &red, &err) != DDP_OK) {
        fprintf(stderr, "ddp_mlp: rank %d: %s\n", R, err.msg);
        ddp_group_destroy(g);
        return 1;
    }
    float *gw1 = ddp_reducer_grad(red, 0), *gb1 = ddp_reducer_grad(red, 1);
    float *gw2 = ddp_reducer_grad(red, 2), *gb2 = ddp_reducer_grad(red, 3);
    float *gw3 = ddp_reducer_grad(red, 4), *gb3 = ddp_reducer_grad(red, 5);

    /* DDP: each rank reads its own shard, in torch's DistributedSampler order. */
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ds ? ddp_dataset_len(ds) : N_SAMPLES;
    so.num_replicas = W;
    so.rank = R;
    so.seed = seed;
    so.drop_last = true;
    ddp_sampler *sampler;
    if (ddp_sampler_create(&so, &sampler, &err) != DDP_OK) {
        fprintf(stderr, "ddp_mlp: %s\n", err.msg);
        return 1;
    }
    size_t per_epoch = ddp_sampler_len(sampler) / (size_t)(A * B);
    if (per_epoch == 0) { /* a step larger than this rank's share of the data */
        fprintf(stderr,
                "ddp_mlp: --batch %d × --accum %d is more than this rank's %zu samples; lower "
                "them\n",
                B, A, ddp_sampler_len(sampler));
        ddp_dataset_close(ds);
        ddp_sampler_destroy(sampler);
        ddp_reducer_destroy(red);
        ddp_group_destroy(g);
        free(m.w1), free(m.b1), free(m.w2), free(m.b2), free(m.w3), free(m.b3);
        return 2;
    }
    /* Real data come through the loader: background threads prefetch the next batches. */
    ddp_loader *loader = NULL;
    if (ds) {
        ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
        lo.batch_size = (size_t)B;
        if (ddp_loader_create(ds, sampler, &lo, &loader, &err) != DDP_OK) {
            fprintf(stderr, "ddp_mlp: %s\n", err.msg);
            return 1;
        }
    }

    float *x = malloc(sizeof(float) * (size_t)B * D_IN);
    int *y = malloc(sizeof(int) * (size_t)B);
    float *h1 = malloc(sizeof(float) * (size_t)B * H), *h2 = malloc(sizeof(float) * (size_t)B * H);
    float *lg = malloc(sizeof(float) * (size_t)B * N_CLASSES);
    float *d2 = malloc(sizeof(float) * (size_t)B * H), *d1 = malloc(sizeof(float) * (size_t)B * H);
    double t_start = 0, comm = 0, hidden = 0;
    int rc = 0;
    for (int step = 0; step < steps && !rc; step++) {
        if (step == 1)
            t_start = ddp_now_seconds(); /* steady state: after the first step */
        size_t epoch = (size_t)step / per_epoch, in_epoch = (size_t)step % per_epoch;
        if (in_epoch == 0) {
            if (loader)
                ddp_loader_set_epoch(loader, epoch); /* also sets the sampler's epoch */
            else
                ddp_sampler_set_epoch(sampler, epoch);
        }
        const uint64_t *idx = ddp_sampler_indices(sampler) + in_epoch * (size_t)(A * B);
        ddp_reducer_zero_grad(red);
        double loss = 0;
        for (int micro = 0; micro < A; micro++) {
            ddp_reducer_set_sync(red, micro == A - 1); /* DDP: no_sync on all but the last */
            if (loader) {
                ddp_batch bt;
                if (ddp_loader_next(loader, &bt) != DDP_OK || bt.n != (size_t)B) {
                    fprintf(stderr, "ddp_mlp: the loader ran dry\n");
                    rc = 1;
                    break;
                }
                memcpy(x, bt.x, sizeof(float) * (size_t)B * D_IN);
                memcpy(y, bt.y, sizeof(int) * (size_t)B);
            } else {
                for (int b = 0; b < B; b++)
                    y[b] = make_sample(idx[micro * B + b], x + (size_t)b * D_IN);
            }
            /* forward */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, D_IN, 1, x, D_IN, m.w1, D_IN,
                        0, h1, H);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    h1[b * H + j] = fmaxf(h1[b * H + j] + m.b1[j], 0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, H, H, 1, h1, H, m.w2, H, 0, h2,
                        H);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    h2[b * H + j] = fmaxf(h2[b * H + j] + m.b2[j], 0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, N_CLASSES, H, 1, h2, H, m.w3, H,
                        0, lg, N_CLASSES);
            /* softmax cross-entropy; dlogits = (p − onehot) / (B·A): the mean over the step */
            for (int b = 0; b < B; b++) {
                float *l = lg + b * N_CLASSES, mx = -1e30f, s = 0;
                for (int c = 0; c < N_CLASSES; c++)
                    mx = fmaxf(mx, l[c] += m.b3[c]);
                for (int c = 0; c < N_CLASSES; c++)
                    s += (l[c] = expf(l[c] - mx));
                loss -= logf(l[y[b]] / s) / (B * A);
                for (int c = 0; c < N_CLASSES; c++)
                    l[c] = (l[c] / s - (c == y[b])) / (float)(B * A);
            }
            /* backward, top layer first; gradients accumulate (+=) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N_CLASSES, H, B, 1, lg, N_CLASSES,
                        h2, H, 1, gw3, H);
            for (int b = 0; b < B; b++)
                for (int c = 0; c < N_CLASSES; c++)
                    gb3[c] += lg[b * N_CLASSES + c];
            /* DDP: fc3's gradients are final: its bucket may start reducing now. */
            if (ddp_reducer_mark_ready(red, 4) || ddp_reducer_mark_ready(red, 5))
                break;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, N_CLASSES, 1, lg,
                        N_CLASSES, m.w3, H, 0, d2, H);
            for (size_t i = 0; i < (size_t)B * H; i++)
                d2[i] = h2[i] > 0 ? d2[i] : 0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, H, B, 1, d2, H, h1, H, 1, gw2,
                        H);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    gb2[j] += d2[b * H + j];
            if (ddp_reducer_mark_ready(red, 2) || ddp_reducer_mark_ready(red, 3)) /* DDP */
                break;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, H, H, 1, d2, H, m.w2, H, 0,
                        d1, H);
            for (size_t i = 0; i < (size_t)B * H; i++)
                d1[i] = h1[i] > 0 ? d1[i] : 0;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, D_IN, B, 1, d1, H, x, D_IN, 1,
                        gw1, D_IN);
            for (int b = 0; b < B; b++)
                for (int j = 0; j < H; j++)
                    gb1[j] += d1[b * H + j];
            if (ddp_reducer_mark_ready(red, 0) || ddp_reducer_mark_ready(red, 1)) /* DDP */
                break;
        }
        /* DDP: wait for the last buckets: gradients are now the mean over all ranks. */
        if (ddp_reducer_finish(red) != DDP_OK) {
            fprintf(stderr, "ddp_mlp: rank %d: %s\n", R, ddp_reducer_last_error(red));
            /* Another rank's failure (it died, aborted, timed out first): exit 86, so that
             * ddprun reports that rank, not this one, which may have exited first. */
            rc = ddp_group_peer_failed(g) ? DDP_EXIT_PEER_FAILED : 1;
            break;
        }
        ddp_reducer_stats st;
        ddp_reducer_stats_get(red, &st);
        if (step >= 1) {
            comm += st.comm_seconds;
            hidden += st.comm_seconds - st.wait_seconds > 0 ? st.comm_seconds - st.wait_seconds : 0;
        }
        /* SGD, identical on every rank */
        for (size_t k = 0; k < NP; k++) {
            float *p = params[k].data, *gr = ddp_reducer_grad(red, k);
            for (size_t i = 0; i < params[k].count; i++)
                p[i] -= lr * gr[i];
        }
        double mean_loss;
        ddp_allreduce(g, &loss, &mean_loss, 1, DDP_FLOAT64, DDP_AVG); /* for the log only */
        if (R == 0 && !quiet && (step % 10 == 0 || step == steps - 1))
            printf("step %4d  loss %.4f\n", step, mean_loss);
    }
    if (!rc && R == 0) {
        double secs = ddp_now_seconds() - t_start;
        printf("ddp_mlp: %d rank%s, batch %d × %d rank%s × %d accum, %d step%s: %.2f steps/s, "
               "communication %.1f ms/step, %.0f%% hidden behind backward\n",
               W, W == 1 ? "" : "s", B, W, W == 1 ? "" : "s", A, steps, steps == 1 ? "" : "s",
               steps > 1 ? (steps - 1) / secs : 0.0, steps > 1 ? comm / (steps - 1) * 1e3 : 0.0,
               comm > 0 ? 100.0 * hidden / comm : 0.0);
        if (dump) {
            FILE *f = fopen(dump, "wb");
            for (size_t k = 0; f && k < NP; k++)
                fwrite(params[k].data, sizeof(float), params[k].count, f);
            if (f)
                fclose(f);
        }
    }
    free(x), free(y), free(h1), free(h2), free(lg), free(d1), free(d2);
    ddp_loader_destroy(loader);
    ddp_dataset_close(ds);
    ddp_sampler_destroy(sampler);
    ddp_reducer_destroy(red);
    ddp_group_destroy(g);
    free(m.w1), free(m.b1), free(m.w2), free(m.b2), free(m.w3), free(m.b3);
    return rc;
}
