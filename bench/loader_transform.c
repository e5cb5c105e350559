/*
 * loader_transform — does the loader's prefetching hide augmentation? Batches of Fashion-MNIST
 * (or a synthetic IDX set when the Debian package is absent), each augmented with
 * ddp_augment_images `passes` times (augmentation-heavy), then a training step simulated by
 * `step_ms` of arithmetic on the caller's thread. Modes:
 *   caller   the augmentation runs on the caller's thread after ddp_loader_next (the only way
 *            before the loader took a transform), with `threads` workers loading
 *   worker   the same augmentation as the loader's transform, on the workers (threads = 0: in
 *            next(), on the caller's thread)
 * Prints the mean milliseconds per batch over `batches` batches.
 *   loader_transform MODE THREADS PASSES STEP_MS BATCHES
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/ddp.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static volatile double sink;

/* step_ms of floating-point work on this thread (a stand-in for forward and backward). */
static void train_step(double ms)
{
    double t0 = now(), x = 0;
    while (now() - t0 < ms * 1e-3)
        for (int i = 0; i < 1000; i++)
            x += (double)i * 1e-9;
    sink = x;
}

typedef struct aug_ctx {
    ddp_augment a;
    int passes;
} aug_ctx;

static ddp_status augment(void *ctx, const ddp_batch *b, const uint64_t *idx, char *msg)
{
    const aug_ctx *c = ctx;
    ddp_error err = {0};
    for (int p = 0; p < c->passes; p++)
        if (ddp_augment_images(&c->a, b->x, b->n, 1, 28, 28, idx, b->epoch + (uint64_t)p, &err)) {
            snprintf(msg, DDP_ERRMSG_MAX, "%s", err.msg);
            return err.status;
        }
    return DDP_OK;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: loader_transform caller|worker THREADS PASSES STEP_MS BATCHES\n");
        return 2;
    }
    bool worker = !strcmp(argv[1], "worker");
    int threads = atoi(argv[2]), batches = atoi(argv[5]);
    aug_ctx c = {.a = {.hflip = true, .shift = 4, .seed = 1}, .passes = atoi(argv[3])};
    double step_ms = atof(argv[4]);
    const char *dir = "/usr/share/datasets/fashion-mnist";
    char im[512], lb[512];
    snprintf(im, sizeof im, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lb, sizeof lb, "%s/train-labels-idx1-ubyte.gz", dir);
    ddp_error err = {0};
    ddp_dataset *ds;
    if (ddp_dataset_open_idx(im, lb, NULL, &ds, &err)) {
        fprintf(stderr, "loader_transform: %s\n", err.msg);
        return 1;
    }
    ddp_sampler_opts so = DDP_SAMPLER_OPTS_INIT;
    so.dataset_size = ddp_dataset_len(ds);
    ddp_sampler *s;
    ddp_loader_opts lo = DDP_LOADER_OPTS_INIT;
    lo.batch_size = 64, lo.threads = threads, lo.depth = 4;
    if (worker)
        lo.transform = augment, lo.transform_ctx = &c;
    ddp_loader *l;
    if (ddp_sampler_create(&so, &s, &err) || ddp_loader_create(ds, s, &lo, &l, &err)) {
        fprintf(stderr, "loader_transform: %s\n", err.msg);
        return 1;
    }
    char msg[DDP_ERRMSG_MAX];
    ddp_batch b;
    double t0 = now();
    for (int i = 0; i < batches; i++) {
        if (ddp_loader_next(l, &b) ||
            (b.n == 0 && (ddp_loader_set_epoch(l, b.epoch + 1) || ddp_loader_next(l, &b)))) {
            fprintf(stderr, "loader_transform: %s\n", ddp_loader_last_error(l));
            return 1;
        }
        if (!worker && augment(&c, &b, ddp_sampler_indices(s) + b.index * lo.batch_size, msg)) {
            fprintf(stderr, "loader_transform: %s\n", msg);
            return 1;
        }
        train_step(step_ms);
    }
    printf("%.4f\n", (now() - t0) / batches * 1e3);
    ddp_loader_destroy(l);
    ddp_sampler_destroy(s);
    ddp_dataset_close(ds);
    return 0;
}
