/*
 * zero2check — sharded gradients (ZeRO-2: ddp_reducer_opts.shard_gradients), under ddprun at any
 * world size, against ZeRO-1 (shard_optimizer alone) on the same group:
 *  - accumulation 1: the parameters after several SGD steps on the shard, the shard's mean
 *    gradient and grad_norm are ZeRO-1's bit for bit (the same sums in the same order); with 2
 *    micro-steps (no_sync, which with shard_gradients reduces each micro-step into the shard)
 *    within 1e-5 (parameters, grad_norm) and 2e-6 of the gradient terms' size (the mean);
 *  - the tied parameter (the GPT's token embedding: acquired first, written at the start and at
 *    the end of backward, marked last) in the largest bucket;
 *  - a layer's weight and bias acquired together on either side of a bucket boundary, with the
 *    tied bucket held and a small first bucket come and gone (the default pool's fixed slots;
 *    first fit failed there, the GPT at 25 MiB buckets);
 *  - a pool smaller than what backward writes (the largest bucket + the next: every other
 *    bucket waits for the one before it) completes with the same bits; a pool that cannot hold
 *    the held bucket beside the next fails at acquire with DDP_ERR_INVALID saying so;
 *  - unscale (loss scaling) scales the shard and finds an inf planted there, as ZeRO-1's;
 *  - refusals: without shard_optimizer, with compress_bf16, a grad_pool under the largest
 *    bucket, grad_pool differing across ranks, set_join, acquire after mark_ready, a bad index;
 *  - last: the last rank leaves the group mid-step; the others' acquire returns the group's
 *    error well within the deadline.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

#define MAXP 8
#define LR 1e-3f

/* The model of the case at hand: parameter counts (0: the tied one, the largest), the bucket
 * caps, and whether backward acquires a layer's weight and bias together (the GPT's pairs). */
typedef struct layout {
    int np;
    size_t counts[MAXP];
    size_t cap, first; /* bytes */
    bool pairs;
} layout;
/* Every parameter in a bucket of its own (64 bytes a bucket). */
static const layout SINGLES = {6, {1000, 300, 700, 50, 1, 800}, 64, 64, false};
/* A tied T, then layers of a weight (500) and a bias (20): in reverse order a first bucket of
 * b3 alone, then {w3, b2}, {w2, b1}, {w1}, {T}. Backward acquires each layer's weight and bias
 * together, so two buckets fill at once while T's is held and the small first one has come and
 * gone: fitting buffers first-fit into the pool failed there (the GPT at 25 MiB buckets). */
static const layout PAIRS = {7, {2000, 500, 20, 500, 20, 500, 20}, 2080, 100, true};
static const layout *L = &SINGLES;
#define NP (L->np)
#define COUNTS (L->counts)
static int fails, R, W;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "zero2check rank %d: ", R);                                            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

/* A gradient value with a full mantissa (another summation order would show). */
static float gval(int r, int s, int m, int i, size_t k)
{
    uint32_t h =
        (uint32_t)(r * 7919 + s * 104729 + m * 1299709 + i * 15485863) ^ (uint32_t)k * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 2000001) / 1000.0f - 1000.0f + 1.0f / 3.0f;
}

/* Bytes of a parameter's bucket in the pool: W blocks of whole cache lines. */
static size_t need(size_t count)
{
    size_t per = (count + (size_t)W - 1) / (size_t)W;
    return (per + 15) / 16 * 16 * (size_t)W * sizeof(float);
}

typedef struct twin {
    ddp_reducer *red;
    float *vals[MAXP];
    double norms[8];
} twin;

static ddp_status make(ddp_group *g, twin *t, bool sg, size_t pool, ddp_reducer_opts *over,
                       ddp_error *err)
{
    memset(t, 0, sizeof *t);
    ddp_param ps[MAXP];
    char names[MAXP][16];
    for (int i = 0; i < NP; i++) {
        t->vals[i] = malloc(COUNTS[i] * sizeof(float));
        for (size_t k = 0; k < COUNTS[i]; k++)
            t->vals[i][k] = (float)((int)(k % 17) - 8) / 8.0f + (float)i;
        snprintf(names[i], sizeof names[i], "p%d", i);
        ps[i] = (ddp_param){names[i], COUNTS[i], DDP_FLOAT32, t->vals[i], DDP_DEVICE_CPU};
    }
    ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
    if (over)
        o = *over;
    else {
        o.bucket_cap = L->cap;
        o.first_bucket = L->first;
        o.shard_optimizer = true;
        o.shard_gradients = sg;
        o.grad_pool = pool;
    }
    return ddp_reducer_create(g, ps, NP, NULL, 0, &o, &t->red, err);
}

static void drop(twin *t)
{
    ddp_reducer_destroy(t->red);
    for (int i = 0; i < NP; i++)
        free(t->vals[i]);
    t->red = NULL;
}

/* Writes parameter i's gradient of (step s, micro m), scaled by f, at acquire's place. */
static ddp_status write_grad(twin *t, int s, int m, int i, float f)
{
    void *p = NULL;
    ddp_status st = ddp_reducer_grad_acquire(t->red, (size_t)i, &p);
    if (st)
        return st;
    float *g = p;
    for (size_t k = 0; k < COUNTS[i]; k++)
        g[k] += gval(R, s, m, i, k) * f;
    return DDP_OK;
}

/* One backward: parameters from the last to the first, the tied one (0) acquired and half
 * written first, the other half at the end. */
static ddp_status backward(twin *t, int s, int m)
{
    ddp_status st = write_grad(t, s, m, 0, 0.5f);
    for (int i = NP - 1; i > 0 && !st && !L->pairs; i--)
        if (!(st = write_grad(t, s, m, i, 1.0f)))
            st = ddp_reducer_mark_ready(t->red, (size_t)i);
    for (int i = NP - 1; i > 0 && !st && L->pairs; i -= 2) { /* bias i, weight i − 1 */
        void *w, *b;
        if ((st = ddp_reducer_grad_acquire(t->red, (size_t)i, &b)) ||
            (st = ddp_reducer_grad_acquire(t->red, (size_t)i - 1, &w)))
            break;
        if (!(st = write_grad(t, s, m, i, 1.0f)) && !(st = write_grad(t, s, m, i - 1, 1.0f)) &&
            !(st = ddp_reducer_mark_ready(t->red, (size_t)i)))
            st = ddp_reducer_mark_ready(t->red, (size_t)i - 1);
    }
    if (!st)
        st = write_grad(t, s, m, 0, 0.5f);
    return st ? st : ddp_reducer_mark_ready(t->red, 0);
}

/* steps SGD steps of accum micro-steps each, on the shard; norms recorded. */
static int train(twin *t, int steps, int accum, const char *what)
{
    for (int s = 0; s < steps; s++) {
        ddp_reducer_zero_grad(t->red);
        for (int m = 0; m < accum; m++) {
            ddp_reducer_set_sync(t->red, m == accum - 1);
            if (backward(t, s, m)) {
                fprintf(stderr, "zero2check rank %d: %s: backward: %s\n", R, what,
                        ddp_reducer_last_error(t->red));
                return 1;
            }
        }
        if (ddp_reducer_finish(t->red) || ddp_reducer_grad_norm(t->red, &t->norms[s])) {
            fprintf(stderr, "zero2check rank %d: %s: finish: %s\n", R, what,
                    ddp_reducer_last_error(t->red));
            return 1;
        }
        for (int i = 0; i < NP; i++) {
            size_t lo, hi;
            ddp_reducer_shard(t->red, (size_t)i, &lo, &hi);
            float *p = ddp_reducer_param(t->red, (size_t)i);
            const float *g = ddp_reducer_shard_grad(t->red, (size_t)i);
            for (size_t k = lo; k < hi; k++)
                p[k] -= LR * g[k - lo];
        }
        if (ddp_reducer_gather_params(t->red)) {
            fprintf(stderr, "zero2check rank %d: %s: gather: %s\n", R, what,
                    ddp_reducer_last_error(t->red));
            return 1;
        }
    }
    return 0;
}

/* ZeRO-2 (pool bytes; 0: the default) against ZeRO-1 over `steps` steps of `accum`. */
static int compare(ddp_group *g, size_t pool, int accum, const char *what)
{
    ddp_error err = {0};
    twin a, b;
    enum { STEPS = 4 };
    if (make(g, &a, false, 0, NULL, &err) || make(g, &b, true, pool, NULL, &err)) {
        fprintf(stderr, "zero2check rank %d: %s: create: %s\n", R, what, err.msg);
        return 1;
    }
    CHECK(ddp_reducer_grads_sharded(b.red) == (W > 1), "%s: grads_sharded %d", what,
          (int)ddp_reducer_grads_sharded(b.red));
    CHECK(W == 1 || L != &SINGLES ||
              ddp_reducer_grad_pool_bytes(b.red) ==
                  (pool ? pool : need(COUNTS[0]) + 2 * need(COUNTS[5])),
          "%s: pool of %zu bytes", what, ddp_reducer_grad_pool_bytes(b.red));
    if (train(&a, STEPS, accum, what) || train(&b, STEPS, accum, what))
        return 1;
    /* loss scaling's unscale reads and scales the shard (an inf planted in one element) */
    size_t lo0, hi0;
    ddp_reducer_shard(a.red, 5, &lo0, &hi0);
    if (hi0 > lo0) {
        ((float *)ddp_reducer_shard_grad(a.red, 5))[0] = INFINITY;
        ((float *)ddp_reducer_shard_grad(b.red, 5))[0] = INFINITY;
    }
    bool ia = false, ib = false;
    CHECK(!ddp_reducer_unscale(a.red, 0.5f, &ia) && !ddp_reducer_unscale(b.red, 0.5f, &ib) &&
              ia == (hi0 > lo0) && ib == ia,
          "%s: unscale: found_inf %d, ZeRO-1's %d (shard of p5 [%zu, %zu))", what, (int)ib, (int)ia,
          lo0, hi0);
    for (int s = 0; s < STEPS; s++)
        CHECK(accum == 1 ? a.norms[s] == b.norms[s]
                         : fabs(a.norms[s] - b.norms[s]) <= 1e-5 * fabs(a.norms[s]),
              "%s: step %d: grad_norm %.17g, ZeRO-1's %.17g", what, s, b.norms[s], a.norms[s]);
    for (int i = 0; i < NP; i++) {
        const float *x = ddp_reducer_param(a.red, (size_t)i),
                    *y = ddp_reducer_param(b.red, (size_t)i);
        size_t lo, hi;
        ddp_reducer_shard(a.red, (size_t)i, &lo, &hi);
        const float *ga = ddp_reducer_shard_grad(a.red, (size_t)i),
                    *gb = ddp_reducer_shard_grad(b.red, (size_t)i);
        if (accum == 1) {
            CHECK(!memcmp(x, y, COUNTS[i] * sizeof(float)), "%s: p%d differs from ZeRO-1's", what,
                  i);
            CHECK(hi == lo || !memcmp(ga, gb, (hi - lo) * sizeof(float)),
                  "%s: p%d's shard of the mean gradient differs from ZeRO-1's", what, i);
        } else {
            for (size_t k = 0; k < COUNTS[i]; k++)
                if (fabsf(x[k] - y[k]) > 1e-5f * (fabsf(x[k]) + 1.0f)) {
                    CHECK(0, "%s: p%d[%zu] = %.9g, ZeRO-1's %.9g", what, i, k, y[k], x[k]);
                    break;
                }
            for (size_t k = lo; k < hi; k++)
                /* terms up to 1000 that cancel: 2e-6 of their size */
                if (fabsf(ga[k - lo] - gb[k - lo]) > 2e-3f) {
                    CHECK(0, "%s: p%d's mean gradient [%zu] = %.9g, ZeRO-1's %.9g", what, i, k,
                          gb[k - lo], ga[k - lo]);
                    break;
                }
        }
    }
    drop(&a);
    drop(&b);
    return 0;
}

/* Refusals, on every rank alike. */
static void refusals(ddp_group *g)
{
    ddp_error err = {0};
    twin t;
    ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
    o.shard_gradients = true;
    ddp_status st = make(g, &t, true, 0, &o, &err);
    CHECK(st == DDP_ERR_INVALID && strstr(err.msg, "needs shard_optimizer"),
          "shard_gradients without shard_optimizer: %d '%s'", (int)st, err.msg);
    drop(&t);
    o.shard_optimizer = true;
    o.compress_bf16 = true;
    st = make(g, &t, true, 0, &o, &err);
    CHECK(st == DDP_ERR_INVALID && strstr(err.msg, "compress_bf16"),
          "shard_gradients with compress_bf16: %d '%s'", (int)st, err.msg);
    drop(&t);
    /* a pool under the largest bucket: refused where there is a pool (2 or more ranks) */
    st = make(g, &t, true, need(COUNTS[0]) - 64, NULL, &err);
    CHECK(W == 1 ? st == DDP_OK : st == DDP_ERR_INVALID && strstr(err.msg, "cannot hold bucket"),
          "grad_pool under the largest bucket: %d '%s'", (int)st, err.msg);
    drop(&t);
    if (W > 1) {
        st = make(g, &t, true, R == W - 1 ? 1 << 20 : 0, NULL, &err);
        CHECK(st == DDP_ERR_INVALID && strstr(err.msg, "option grad_pool is"),
              "grad_pool differing across ranks: %d '%s'", (int)st, err.msg);
        drop(&t);
    }
    if (make(g, &t, true, 0, NULL, &err)) {
        CHECK(0, "create: %s", err.msg);
        return;
    }
    st = ddp_reducer_set_join(t.red, NULL, true);
    CHECK(st == DDP_ERR_INVALID && strstr(ddp_reducer_last_error(t.red), "shard_gradients"),
          "set_join with shard_gradients: %d '%s'", (int)st, ddp_reducer_last_error(t.red));
    void *p = NULL;
    st = ddp_reducer_grad_acquire(t.red, NP, &p);
    CHECK(st == DDP_ERR_INVALID && !p, "acquire of parameter %d: %d", NP, (int)st);
    if (W > 1) { /* acquire after mark_ready in the same step */
        ddp_reducer_zero_grad(t.red);
        CHECK(!write_grad(&t, 0, 0, 5, 1.0f) && !ddp_reducer_mark_ready(t.red, 5), "mark p5: %s",
              ddp_reducer_last_error(t.red));
        st = ddp_reducer_grad_acquire(t.red, 5, &p);
        CHECK(st == DDP_ERR_INVALID && strstr(ddp_reducer_last_error(t.red), "already marked"),
              "acquire after mark_ready: %d '%s'", (int)st, ddp_reducer_last_error(t.red));
        CHECK(ddp_reducer_finish(t.red) == DDP_OK, "finish: %s", ddp_reducer_last_error(t.red));
    }
    drop(&t);
    /* The tied parameter held, and a pool of the largest bucket alone: the next bucket can never
     * fit, and nothing is in flight to wait for. */
    if (W > 1) {
        if (make(g, &t, true, need(COUNTS[0]), NULL, &err)) {
            CHECK(0, "create: %s", err.msg);
            return;
        }
        ddp_reducer_zero_grad(t.red);
        st = backward(&t, 0, 0);
        CHECK(st == DDP_ERR_INVALID && strstr(ddp_reducer_last_error(t.red), "raise grad_pool"),
              "a pool too small for the held bucket and the next: %d '%s'", (int)st,
              ddp_reducer_last_error(t.red));
        drop(&t);
    }
}

/* Last: the last rank leaves the group mid-step; the others' acquire returns the group's error
 * well within the deadline (60 s). */
static void dead_peer(ddp_group *g)
{
    ddp_error err = {0};
    twin t;
    if (make(g, &t, true, need(COUNTS[0]) + need(COUNTS[5]), NULL, &err)) {
        CHECK(0, "dead peer: create: %s", err.msg);
        return;
    }
    if (R == W - 1) {
        drop(&t);
        return;
    }
    double t0 = ddp_now_seconds();
    ddp_reducer_zero_grad(t.red);
    ddp_status st = DDP_OK;
    st = backward(&t, 0, 0); /* acquire or mark_ready meets it, or finish */
    if (!st)
        st = ddp_reducer_finish(t.red);
    void *p = (void *)1;
    ddp_status st2 = ddp_reducer_grad_acquire(t.red, 3, &p);
    double took = ddp_now_seconds() - t0;
    CHECK(st != DDP_OK && st2 != DDP_OK && st2 != DDP_ERR_INVALID && !p &&
              *ddp_reducer_last_error(t.red),
          "dead peer: status %d, then acquire %d '%s'", (int)st, (int)st2,
          ddp_reducer_last_error(t.red));
    CHECK(took < 30, "dead peer: %.1f s to fail", took);
    drop(&t);
}

int main(void)
{
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    go.timeout_ms = 60000;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "zero2check: %s\n", err.msg);
        return 1;
    }
    W = ddp_group_size(g);
    R = ddp_group_rank(g);
    int rc = compare(g, 0, 1, "default pool") || compare(g, 0, 2, "2 micro-steps") ||
             compare(g, need(COUNTS[0]) + need(COUNTS[5]), 1, "tight pool") ||
             compare(g, need(COUNTS[0]) + need(COUNTS[5]), 2, "tight pool, 2 micro-steps");
    L = &PAIRS; /* inline, nothing is in flight to wait for: the default pool must fit */
    rc = rc || compare(g, 0, 1, "weight and bias together") ||
         compare(g, 0, 2, "weight and bias together, 2 micro-steps");
    L = &SINGLES;
    if (!rc)
        refusals(g);
    if (!rc && W > 1)
        dead_peer(g);
    if (R == 0 && !fails && !rc)
        printf("zero2check: all checks passed on %d rank%s\n", W, W == 1 ? "" : "s");
    ddp_group_destroy(g);
    return fails || rc ? 1 : 0;
}
