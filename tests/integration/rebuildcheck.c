/*
 * rebuildcheck — the reducer's bucket rebuild (opts.rebuild_buckets, torch's _rebuild_buckets),
 * under ddprun at any world size:
 *  - gradients marked ready in an order unlike the registration's: from the second synced step
 *    on the buckets follow the first step's order (ddp_reducer_bucket_of), and the gradient
 *    pointers have not moved;
 *  - ranks that mark in different orders: rank 0's order wins on every rank;
 *  - the means are those of a reducer that does not rebuild, bit for bit, over several steps
 *    (fp32, bf16-compressed), with no_sync micro-steps, including before the first synced step;
 *  - rebuild_buckets = false keeps the layout; a sharded reducer keeps it too and stays right;
 *  - rebuild_buckets differing across ranks is refused at creation, naming it;
 *  - unscale and grad_norm read the gradients where the caller sees them.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

#define NP 8
#define COUNT 1000 /* elements per parameter: 2 per bucket at the cap below */
#define CAP (2 * COUNT * sizeof(float))

static int fails, R, W;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rebuildcheck rank %d: ", R);                                          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

/* Rank 0's ready order, unlike the registration's (0..7) and its reverse. */
static const int ORDER0[NP] = {2, 5, 0, 7, 3, 6, 1, 4};

/* The order rank r marks in: rank 0's above; other ranks reversed or rotated. */
static int mark_order(int r, int j)
{
    if (r == 0)
        return ORDER0[j];
    return r % 2 ? ORDER0[NP - 1 - j] : ORDER0[(j + r) % NP];
}

/* A gradient value with full mantissas (so that a different summation order would show). */
static float gval(int r, int step, int micro, int i, size_t k)
{
    uint32_t h = (uint32_t)(r * 7919 + step * 104729 + micro * 1299709 + i * 15485863) ^
                 (uint32_t)k * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 2000001) / 1000.0f - 1000.0f + 1.0f / 3.0f;
}

typedef struct twin {
    float *vals[NP];
    ddp_param ps[NP];
    char names[NP][16];
    ddp_reducer *red;
} twin;

static int make_ov(ddp_group *g, twin *t, bool rebuild, bool bf16, bool shard,
                   ddp_reducer_overlap ov)
{
    ddp_error err = {0};
    for (int i = 0; i < NP; i++) {
        t->vals[i] = calloc(COUNT, sizeof(float));
        snprintf(t->names[i], sizeof t->names[i], "p%d", i);
        t->ps[i] = (ddp_param){t->names[i], COUNT, DDP_FLOAT32, t->vals[i], DDP_DEVICE_CPU};
    }
    ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
    o.bucket_cap = o.first_bucket = CAP;
    o.compress_bf16 = bf16;
    o.shard_optimizer = shard;
    o.rebuild_buckets = rebuild;
    o.overlap = ov;
    if (ddp_reducer_create(g, t->ps, NP, NULL, 0, &o, &t->red, &err) != DDP_OK) {
        fprintf(stderr, "rebuildcheck: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* The buckets on the progress thread: where the rebuild applies (inline it is skipped). */
static int make(ddp_group *g, twin *t, bool rebuild, bool bf16, bool shard)
{
    return make_ov(g, t, rebuild, bf16, shard, DDP_OVERLAP_ASYNC);
}

static void drop(twin *t)
{
    ddp_reducer_destroy(t->red);
    for (int i = 0; i < NP; i++)
        free(t->vals[i]);
}

/* One step of `micro` micro-steps (all but the last without sync) on reducer t. */
static int step(twin *t, int s, int micro, bool first_unsynced)
{
    ddp_reducer *red = t->red;
    ddp_reducer_zero_grad(red);
    for (int m = 0; m < micro; m++) {
        ddp_reducer_set_sync(red, m == micro - 1 && !(first_unsynced && m == 0));
        for (int j = 0; j < NP; j++) {
            int i = mark_order(R, j);
            float *gr = ddp_reducer_grad(red, (size_t)i);
            for (size_t k = 0; k < COUNT; k++)
                gr[k] += gval(R, s, m, i, k);
            if (ddp_reducer_mark_ready(red, (size_t)i) != DDP_OK) {
                fprintf(stderr, "rebuildcheck: mark_ready: %s\n", ddp_reducer_last_error(red));
                return 1;
            }
        }
    }
    ddp_reducer_set_sync(red, true);
    if (ddp_reducer_finish(red) != DDP_OK) {
        fprintf(stderr, "rebuildcheck: finish: %s\n", ddp_reducer_last_error(red));
        return 1;
    }
    return 0;
}

/* Rebuilt vs not, side by side: layout, pointers, and the means bit for bit. */
static int compare(ddp_group *g, bool bf16)
{
    const char *mode = bf16 ? "bf16" : "fp32";
    twin a, b;
    if (make(g, &a, true, bf16, false) || make(g, &b, false, bf16, false))
        return 1;
    void *gp[NP];
    for (int i = 0; i < NP; i++)
        gp[i] = ddp_reducer_grad(a.red, (size_t)i);
    size_t nb0 = ddp_reducer_num_buckets(a.red);
    for (int s = 0; s < 5; s++) {
        int micro = s == 3 ? 3 : 1;
        /* step 0 opens with a no_sync micro-step: only synced marks are recorded */
        if (step(&a, s, s == 0 ? 2 : micro, s == 0) || step(&b, s, s == 0 ? 2 : micro, s == 0))
            return 1;
        CHECK(ddp_reducer_rebuilt(a.red) == (s > 0), "%s step %d: rebuilt() is %d", mode, s,
              (int)ddp_reducer_rebuilt(a.red));
        CHECK(!ddp_reducer_rebuilt(b.red), "%s: rebuilt with rebuild_buckets = false", mode);
        for (int i = 0; i < NP; i++) {
            CHECK(ddp_reducer_grad(a.red, (size_t)i) == gp[i],
                  "%s step %d: the gradient of p%d moved", mode, s, i);
            const float *x = ddp_reducer_grad(a.red, (size_t)i);
            const float *y = ddp_reducer_grad(b.red, (size_t)i);
            for (size_t k = 0; k < COUNT; k++) {
                if (memcmp(&x[k], &y[k], sizeof(float)) != 0) {
                    CHECK(0, "%s step %d: p%d[%zu] = %.9g rebuilt, %.9g not", mode, s, i, k, x[k],
                          y[k]);
                    break;
                }
            }
            if (!bf16) {                  /* and the exact mean, where the sum is exact in double */
                double want = 0, mag = 0; /* float sums: error relative to the terms */
                int mi = s == 3 ? 3 : s == 0 ? 2 : 1;
                for (int r = 0; r < W; r++) {
                    float acc = 0;
                    for (int m = 0; m < mi; m++) {
                        acc += gval(r, s, m, i, 7);
                        mag += fabs(gval(r, s, m, i, 7));
                    }
                    want += acc;
                }
                want /= W;
                CHECK(fabs(x[7] - want) <= mag * 1e-6, "%s step %d: p%d[7] = %.9g, want %.9g", mode,
                      s, i, x[7], want);
            }
        }
        if (s == 0) { /* the layout before the rebuild: reverse registration */
            for (int i = 0; i < NP; i++)
                CHECK(ddp_reducer_bucket_of(a.red, (size_t)i) == (size_t)(NP - 1 - i) / 2,
                      "%s: before the rebuild p%d is in bucket %zu", mode, i,
                      ddp_reducer_bucket_of(a.red, (size_t)i));
        } else { /* rank 0's order, on every rank: two parameters a bucket, in that order */
            for (int j = 0; j < NP; j++)
                CHECK(ddp_reducer_bucket_of(a.red, (size_t)ORDER0[j]) == (size_t)j / 2,
                      "%s step %d: p%d (rank 0's %d-th ready) is in bucket %zu, want %d", mode, s,
                      ORDER0[j], j, ddp_reducer_bucket_of(a.red, (size_t)ORDER0[j]), j / 2);
            for (int i = 0; i < NP; i++)
                CHECK(ddp_reducer_bucket_of(b.red, (size_t)i) == (size_t)(NP - 1 - i) / 2,
                      "%s: not rebuilt, yet p%d moved to bucket %zu", mode, i,
                      ddp_reducer_bucket_of(b.red, (size_t)i));
            CHECK(ddp_reducer_num_buckets(a.red) == nb0, "%s: %zu buckets after, %zu before", mode,
                  ddp_reducer_num_buckets(a.red), nb0);
        }
        double na, nb;
        CHECK(ddp_reducer_grad_norm(a.red, &na) == DDP_OK &&
                  ddp_reducer_grad_norm(b.red, &nb) == DDP_OK && na == nb,
              "%s step %d: grad_norm %.17g rebuilt, %.17g not", mode, s, na, nb);
    }
    /* unscale works on the gradients the caller sees (not on a staging copy) */
    bool inf_a = true, inf_b = true;
    CHECK(ddp_reducer_unscale(a.red, 0.5f, &inf_a) == DDP_OK &&
              ddp_reducer_unscale(b.red, 0.5f, &inf_b) == DDP_OK && !inf_a && !inf_b,
          "%s: unscale failed", mode);
    for (int i = 0; i < NP; i++)
        CHECK(!memcmp(ddp_reducer_grad(a.red, (size_t)i), ddp_reducer_grad(b.red, (size_t)i),
                      COUNT * sizeof(float)),
              "%s: p%d differs after unscale", mode, i);
    drop(&a);
    drop(&b);
    return 0;
}

/* Sharded: the layout is kept (the shards and the optimizer state are keyed by it), and the
 * means are right. */
static int sharded(ddp_group *g)
{
    twin t;
    if (make(g, &t, true, false, true))
        return 1;
    for (int s = 0; s < 3; s++) {
        if (step(&t, s, 1, false))
            return 1;
        for (int i = 0; i < NP; i++) {
            size_t lo, hi;
            ddp_reducer_shard(t.red, (size_t)i, &lo, &hi);
            const float *x = ddp_reducer_grad(t.red, (size_t)i);
            for (size_t k = lo; k < hi; k++) {
                double want = 0, mag = 0; /* float sums: error relative to the terms */
                for (int r = 0; r < W; r++) {
                    want += gval(r, s, 0, i, k);
                    mag += fabs(gval(r, s, 0, i, k));
                }
                want /= W;
                if (fabs(x[k] - want) > mag * 1e-6) {
                    CHECK(0, "sharded step %d: p%d[%zu] = %.9g, want %.9g", s, i, k, x[k], want);
                    break;
                }
            }
            CHECK(W == 1 || ddp_reducer_bucket_of(t.red, (size_t)i) == (size_t)(NP - 1 - i) / 2,
                  "sharded: p%d moved to bucket %zu", i, ddp_reducer_bucket_of(t.red, (size_t)i));
        }
        CHECK(!ddp_reducer_rebuilt(t.red) || W == 1, "sharded: rebuilt");
        if (ddp_reducer_gather_params(t.red) != DDP_OK) {
            fprintf(stderr, "rebuildcheck: gather_params: %s\n", ddp_reducer_last_error(t.red));
            return 1;
        }
    }
    drop(&t);
    return 0;
}

/* Inline on some rank (overlap may differ across ranks): no rank rebuilds, the means are right.
 */
static int inline_kept(ddp_group *g)
{
    for (int who = 0; who < (W > 1 ? 2 : 1); who++) { /* every rank inline; the last one only */
        twin t;
        bool inl = who == 0 || R == W - 1;
        if (make_ov(g, &t, true, false, false, inl ? DDP_OVERLAP_INLINE : DDP_OVERLAP_ASYNC))
            return 1;
        for (int s = 0; s < 3; s++) {
            if (step(&t, s, 1, false))
                return 1;
            CHECK(!ddp_reducer_rebuilt(t.red), "inline on %s: rebuilt",
                  who ? "the last rank" : "every rank");
            for (int i = 0; i < NP; i++) {
                const float *x = ddp_reducer_grad(t.red, (size_t)i);
                double want = 0, mag = 0;
                for (int r = 0; r < W; r++) {
                    want += gval(r, s, 0, i, 3);
                    mag += fabs(gval(r, s, 0, i, 3));
                }
                want /= W;
                CHECK(fabs(x[3] - want) <= mag * 1e-6, "inline step %d: p%d[3] = %.9g, want %.9g",
                      s, i, x[3], want);
            }
        }
        drop(&t);
    }
    return 0;
}

int main(void)
{
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "rebuildcheck: %s\n", err.msg);
        return 1;
    }
    W = ddp_group_size(g);
    R = ddp_group_rank(g);
    if (W > 1) { /* rebuild_buckets differing across ranks: refused at creation, naming it */
        float x[3] = {0};
        ddp_param p[3] = {{"a", 1, DDP_FLOAT32, x, DDP_DEVICE_CPU},
                          {"b", 1, DDP_FLOAT32, x + 1, DDP_DEVICE_CPU},
                          {"c", 1, DDP_FLOAT32, x + 2, DDP_DEVICE_CPU}};
        ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
        o.rebuild_buckets = R != W - 1;
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, p, 3, NULL, 0, &o, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "option rebuild_buckets is"),
              "rebuild_buckets differing across ranks not refused: %d %s", (int)st, err.msg);
        ddp_reducer_destroy(red);
    }
    int rc = compare(g, false) || compare(g, true) || sharded(g) || inline_kept(g);
    if (R == 0 && !fails && !rc)
        printf("rebuildcheck: all checks passed on %d rank%s\n", W, W == 1 ? "" : "s");
    ddp_group_destroy(g);
    return fails || rc ? 1 : 0;
}
