/*
 * reducercheck — the reducer's contract beyond training, under ddprun at any world size:
 * parameters and buffers that start different on each rank equal rank 0's after creation;
 * ranks that mark gradients ready in different orders still get correct means (buckets start
 * in bucket order everywhere); no_sync steps accumulate and the next synced step reduces the
 * sum; marking a gradient twice is an error; every bucket size from one parameter per bucket
 * to one bucket for all. All of it three times: plain, with the sharded optimizer step (ZeRO-1:
 * the shards partition every parameter, each holds the exact mean, a step there and
 * gather_params give every rank the whole update, gather_state completes state arrays,
 * gather_state_to collects shards kept alone (ZeRO-1's memory split) on one rank,
 * grad_norm is the whole norm, and a spent or ungathered step is refused), and sharded with
 * bfloat16 gradients.
 *
 * With --device cuda the same checks run with everything in GPU memory: a GPU group (nccl, or
 * cuda-staged where ranks share a GPU), the parameters, buffers and optimizer state allocated
 * with ddp_group_alloc, so the buckets are device memory too; the test reads and writes them only
 * through ddp_group_memcpy. Under DDP_TEST_FAKE_GPUS the fake GPU's memory faults when the host
 * touches it (staged/fakedev.c), so this also shows that the reducer never does.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp/ddp.h"

#define NP 7

static int fails;
static ddp_group *G;
static bool on_gpu;

#define CHECK_PROG "reducercheck"
#include "check_mem.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "reducercheck rank %d: ", R);                                          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

/* gather_state_sink's pieces on the root: each element of each array once, into got[]. */
typedef struct sink_ctx {
    float *got[NP];
    unsigned char *seen[NP];
    const size_t *counts;
    int calls, fail_at; /* fail_at > 0: refuse that call */
    bool twice;
} sink_ctx;

static ddp_status sink_piece(void *ctx, size_t i, size_t first, const void *data, size_t count)
{
    sink_ctx *c = ctx;
    if (++c->calls == c->fail_at)
        return DDP_ERR_SYSTEM;
    if (i >= NP || first + count > c->counts[i])
        return DDP_ERR_INVALID;
    memcpy(c->got[i] + first, data, sizeof(float) * count);
    for (size_t k = first; k < first + count; k++)
        c->twice |= c->seen[i][k]++ != 0;
    return DDP_OK;
}

int main(int argc, char **argv)
{
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    on_gpu = argc > 2 && !strcmp(argv[1], "--device") && !strcmp(argv[2], "cuda");
    go.device = on_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "reducercheck: %s\n", err.msg);
        return 1;
    }
    G = g;
    const char *want_be = getenv("DDP_EXPECT_BACKEND"); /* the tests that name a backend */
    if (want_be && strcmp(ddp_group_backend(g), want_be) != 0) {
        fprintf(stderr, "reducercheck: backend %s, expected %s\n", ddp_group_backend(g), want_be);
        return 1;
    }
    ddp_device dv = on_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    int W = ddp_group_size(g), R = ddp_group_rank(g);
    /* The one "core to spare" rule: the host's cores against its ranks (not this rank's mask). */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(ddp_group_host_cores(g) >= online, "host_cores %d < %ld online", ddp_group_host_cores(g),
          online);
    CHECK(ddp_group_core_to_spare(g) == (ddp_group_local_size(g) < ddp_group_host_cores(g)),
          "core_to_spare disagrees with %d local ranks on %d cores", ddp_group_local_size(g),
          ddp_group_host_cores(g));
    { /* memory on the wrong side of the group: a clear error, before any collective */
        float x[4] = {0};
        ddp_param wrong = {"w", 4, DDP_FLOAT32, x, on_gpu ? DDP_DEVICE_CPU : DDP_DEVICE_CUDA};
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, &wrong, 1, NULL, 0, NULL, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red &&
                  strstr(err.msg, on_gpu ? "take GPU memory" : "take host memory"),
              "a parameter on the wrong device: %d %s", (int)st, err.msg);
    }
    if (on_gpu) { /* sharded gradients (ZeRO-2) are CPU-only for now: refused, saying so */
        float *x = dalloc(4 * sizeof(float));
        ddp_param one = {"w", 4, DDP_FLOAT32, x, dv};
        ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
        ro.shard_optimizer = ro.shard_gradients = true;
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, &one, 1, NULL, 0, &ro, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "CPU-only for now"),
              "shard_gradients on a GPU group: %d %s", (int)st, err.msg);
        dfree(x);
    }
    { /* two parameters (or a parameter and a buffer) of one name: refused, naming it */
        float x[4] = {0}, y[2] = {0};
        ddp_param twice[2] = {{"w", 4, DDP_FLOAT32, x, dv}, {"w", 2, DDP_FLOAT32, y, dv}};
        ddp_param buf = {"b", 2, DDP_FLOAT32, y, dv};
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, twice, 2, NULL, 0, NULL, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "the name 'w' is given to two"),
              "two parameters named 'w' not refused: %d %s", (int)st, err.msg);
        twice[1].name = "b";
        st = ddp_reducer_create(g, twice, 2, &buf, 1, NULL, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "the name 'b' is given to two"),
              "a parameter and a buffer named 'b' not refused: %d %s", (int)st, err.msg);
    }
    { /* an overlap outside the enum: refused, not taken for INLINE */
        float x[4] = {0};
        ddp_param one = {"w", 4, DDP_FLOAT32, x, dv};
        ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
        ro.overlap = (ddp_reducer_overlap)7;
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, &one, 1, NULL, 0, &ro, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "overlap 7 is not"),
              "overlap 7 not refused: %d %s", (int)st, err.msg);
    }
    if (W > 1) { /* options that differ across ranks: refused at creation on every rank, naming
                    the option (they surfaced later as "collectives differ", with counts) */
        float x[300] = {0};
        ddp_param ps[3] = {{"a", 100, DDP_FLOAT32, NULL, dv},
                           {"b", 100, DDP_FLOAT32, NULL, dv},
                           {"c", 100, DDP_FLOAT32, NULL, dv}};
        float *xd = dalloc(sizeof x);
        xfer(xd, x, sizeof x);
        for (int i = 0; i < 3; i++)
            ps[i].data = xd + 100 * i;
        for (int which = 0; which < 3; which++) {
            ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
            const char *want = which == 0   ? "option bucket_cap is"
                               : which == 1 ? "option compress_bf16 is"
                                            : "option shard_optimizer is";
            if (R == W - 1 && which == 0)
                ro.bucket_cap = 400, ro.first_bucket = 400;
            if (R == W - 1 && which == 1)
                ro.compress_bf16 = true;
            if (R == W - 1 && which == 2)
                ro.shard_optimizer = true;
            ddp_reducer *red = NULL;
            ddp_status st = ddp_reducer_create(g, ps, 3, NULL, 0, &ro, &red, &err);
            CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, want),
                  "options differing across ranks (%s) not refused at creation: %d %s", want,
                  (int)st, err.msg);
            ddp_reducer_destroy(red);
        }
        dfree(xd);
    }
    if (W > 1) { /* a mistake on one rank only (a parameter without data on the last): that rank
                    names it, and the others name that rank, rather than "collectives differ"
                    (it returned before the checks they waited in); the group stays usable */
        float *x = dalloc(sizeof(float) * 4);
        ddp_param one = {"a", 4, DDP_FLOAT32, R == W - 1 ? NULL : x, dv};
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, &one, 1, NULL, 0, NULL, &red, &err);
        char want[64];
        snprintf(want, sizeof want, "rank %d refused its own arguments", W - 1);
        CHECK(st == DDP_ERR_INVALID && !red &&
                  strstr(err.msg, R == W - 1 ? "parameter 0 ('a')" : want),
              "a parameter without data on rank %d only: %d %s", W - 1, (int)st, err.msg);
        one.data = x;
        st = ddp_reducer_create(g, &one, 1, NULL, 0, NULL, &red, &err);
        CHECK(st == DDP_OK, "the same reducer made right after: %s", err.msg);
        ddp_reducer_destroy(red);
        dfree(x);
    }
    { /* an empty parameter and buffer (count 0) may have no data, like malloc(0)'s NULL: taken,
         and the others are reduced as usual (it was refused: "needs ... data") */
        float *x = dalloc(sizeof(float) * 6);
        float xs[6] = {0};
        xfer(x, xs, sizeof xs);
        ddp_param ps[3] = {{"a", 3, DDP_FLOAT32, x, dv},
                           {"empty", 0, DDP_FLOAT32, NULL, dv},
                           {"b", 3, DDP_FLOAT32, x + 3, dv}};
        ddp_param eb = {"empty_buf", 0, DDP_INT64, NULL, dv};
        for (int sh = 0; sh < 2; sh++) {
            ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
            ro.shard_optimizer = sh;
            ddp_reducer *red = NULL;
            ddp_status st = ddp_reducer_create(g, ps, 3, &eb, 1, &ro, &red, &err);
            CHECK(st == DDP_OK, "an empty parameter with no data refused: %s", err.msg);
            if (st)
                continue;
            for (int i = 0; i < 3; i++)
                CHECK(ddp_reducer_mark_ready(red, (size_t)(2 - i)) == DDP_OK, "empty: mark: %s",
                      ddp_reducer_last_error(red));
            CHECK(ddp_reducer_finish(red) == DDP_OK, "empty: finish: %s",
                  ddp_reducer_last_error(red));
            CHECK(ddp_reducer_gather_params(red) == DDP_OK, "empty: gather: %s",
                  ddp_reducer_last_error(red));
            CHECK(ddp_reducer_sync_buffers(red) == DDP_OK, "empty: sync_buffers: %s",
                  ddp_reducer_last_error(red));
            ddp_reducer_destroy(red);
        }
        ps[1].count = 1; /* a non-empty one without data is still refused, naming it */
        ddp_reducer *red = NULL;
        ddp_status st = ddp_reducer_create(g, ps, 3, NULL, 0, NULL, &red, &err);
        CHECK(st == DDP_ERR_INVALID && !red && strstr(err.msg, "parameter 1 ('empty')"),
              "a parameter of 1 element with no data: %d %s", (int)st, err.msg);
        dfree(x);
    }
    size_t counts[NP] = {5, 1000, 3, 70000, 17, 1, 4096};
    size_t caps[] = {64, 4096, 65536, 1 << 20, 64 << 20};
    int ncaps = (int)(sizeof caps / sizeof caps[0]);
    for (int run = 0; run < 3 * ncaps; run++) {
        size_t ci = (size_t)(run % ncaps);
        bool shard = run >= ncaps, bf16 = run >= 2 * ncaps;
        const char *mode = bf16 ? "sharded bf16" : shard ? "sharded" : "plain";
        float *vals[NP], *h[NP]; /* the reducer's memory; a host copy of it */
        ddp_param ps[NP];
        char names[NP][16];
        for (int i = 0; i < NP; i++) {
            h[i] = malloc(sizeof(float) * counts[i]);
            vals[i] = dalloc(sizeof(float) * counts[i]);
            for (size_t k = 0; k < counts[i]; k++)
                h[i][k] = (float)(R * 1000 + i); /* differs per rank */
            xfer(vals[i], h[i], sizeof(float) * counts[i]);
            snprintf(names[i], sizeof names[i], "p%d", i);
            ps[i] = (ddp_param){names[i], counts[i], DDP_FLOAT32, vals[i], dv};
        }
        double stats[4] = {R + 0.5, R + 1.5, R, R}; /* a buffer, e.g. running mean/var */
        double *dstats = dalloc(sizeof stats);
        xfer(dstats, stats, sizeof stats);
        ddp_param bufs[1] = {{"bn.stats", 4, DDP_FLOAT64, dstats, dv}};
        ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
        o.bucket_cap = o.first_bucket = caps[ci];
        o.shard_optimizer = shard;
        o.compress_bf16 = bf16;
        ddp_reducer *red;
        if (ddp_reducer_create(g, ps, NP, bufs, 1, &o, &red, &err) != DDP_OK) {
            fprintf(stderr, "reducercheck: %s\n", err.msg);
            return 1;
        }
        CHECK(ddp_reducer_sharded(red) == (shard && W > 1), "%s: sharded() wrong", mode);
        float *pv[NP]; /* where the parameters live now */
        for (int i = 0; i < NP; i++) {
            pv[i] = ddp_reducer_param(red, (size_t)i);
            xfer(h[i], pv[i], sizeof(float) * counts[i]);
            CHECK(h[i][0] == (float)i && h[i][counts[i] - 1] == (float)i,
                  "param %d not broadcast from rank 0 (%g)", i, h[i][0]);
        }
        xfer(stats, dstats, sizeof stats);
        CHECK(stats[0] == 0.5 && stats[1] == 1.5, "buffer not broadcast from rank 0");

        /* Step 1: rank-specific mark order (rank 0 forward, others reversed or rotated). */
        for (int step = 0; step < 3; step++) {
            ddp_reducer_zero_grad(red);
            int accum = step == 2 ? 3 : 1; /* step 2: three micro-steps, two without sync */
            for (int micro = 0; micro < accum; micro++) {
                ddp_reducer_set_sync(red, micro == accum - 1);
                for (int i = 0; i < NP; i++) {
                    float *gr = h[i];
                    xfer(gr, ddp_reducer_grad(red, (size_t)i), sizeof(float) * counts[i]);
                    for (size_t k = 0; k < counts[i]; k++)
                        gr[k] += (float)(R + 1) * (float)(i + 1) + (float)(k % 3);
                    xfer(ddp_reducer_grad(red, (size_t)i), gr, sizeof(float) * counts[i]);
                }
                for (int j = 0; j < NP; j++) {
                    int i = (j * (R + 1) + step) % NP; /* a different order on every rank */
                    if (R % 2 == 1)
                        i = NP - 1 - i;
                    if (ddp_reducer_mark_ready(red, (size_t)i) != DDP_OK)
                        CHECK(0, "mark_ready(%d): %s", i, ddp_reducer_last_error(red));
                }
            }
            if (ddp_reducer_finish(red) != DDP_OK) {
                fprintf(stderr, "reducercheck: %s\n", ddp_reducer_last_error(red));
                return 1;
            }
            /* Optimizer state completed by gather_state before the step: the gradients must
             * survive it. */
            float *state[NP];
            for (int i = 0; i < NP; i++) {
                size_t lo, hi;
                ddp_reducer_shard(red, (size_t)i, &lo, &hi);
                state[i] = dalloc(sizeof(float) * counts[i]);
                for (size_t k = 0; k < counts[i]; k++)
                    h[i][k] = k >= lo && k < hi ? (float)(k % 1000) + 0.25f * (float)i : -1;
                xfer(state[i], h[i], sizeof(float) * counts[i]);
            }
            CHECK(ddp_reducer_gather_state(red, (void *const *)state) == DDP_OK,
                  "%s: gather_state: %s", mode, ddp_reducer_last_error(red));
            /* ZeRO-1's memory split: each rank holds its shard alone (ddp_optim_keep), and
             * gather_state_to gives rank `root` (another one each step) the whole arrays. */
            {
                int root = step % W;
                float *part[NP], *whole[NP];
                for (int i = 0; i < NP; i++) {
                    size_t lo, hi;
                    ddp_reducer_shard(red, (size_t)i, &lo, &hi);
                    part[i] = dalloc(sizeof(float) * (hi > lo ? hi - lo : 1));
                    for (size_t k = lo; k < hi; k++)
                        h[i][k - lo] = 3.0f * (float)k - (float)i;
                    xfer(part[i], h[i], sizeof(float) * (hi - lo));
                    whole[i] = R == root ? dalloc(sizeof(float) * counts[i]) : NULL;
                }
                CHECK(ddp_reducer_gather_state_to(red, root, (const void *const *)part,
                                                  R == root ? (void *const *)whole : NULL) ==
                          DDP_OK,
                      "%s: gather_state_to %d: %s", mode, root, ddp_reducer_last_error(red));
                /* root without arrays: refused on every rank that communicates (unsharded,
                 * the others have nothing to send), no rank left waiting */
                ddp_status sw =
                    ddp_reducer_gather_state_to(red, root, (const void *const *)part, NULL);
                bool refused = R == root || ddp_reducer_sharded(red);
                CHECK(refused ? sw == DDP_ERR_INVALID &&
                                    strstr(ddp_reducer_last_error(red), "no arrays")
                              : sw == DDP_OK,
                      "%s: gather_state_to without arrays on the root: %d %s", mode, (int)sw,
                      ddp_reducer_last_error(red));
                /* The same pieces into a sink on the root (a checkpoint file, in ddptrain):
                 * every element once; a sink that refuses its second piece fails the root's
                 * call alone, and nobody is left waiting. On a GPU group unsharded, the root's
                 * device arrays reach the sink through a host bounce buffer. */
                sink_ctx sc = {.counts = counts};
                for (int i = 0; i < NP && R == root; i++) {
                    sc.got[i] = calloc(counts[i], sizeof(float));
                    sc.seen[i] = calloc(counts[i], 1);
                }
                ddp_status ss = ddp_reducer_gather_state_sink(red, root, (const void *const *)part,
                                                              R == root ? sink_piece : NULL, &sc);
                CHECK(ss == DDP_OK, "%s: gather_state_sink %d: %s", mode, root,
                      ddp_reducer_last_error(red));
                for (int i = 0; i < NP && R == root; i++)
                    for (size_t k = 0; k < counts[i]; k++)
                        if (sc.seen[i][k] != 1 || sc.got[i][k] != 3.0f * (float)k - (float)i) {
                            CHECK(0, "%s cap %zu: gather_state_sink %d: %d[%zu] = %g seen %d", mode,
                                  caps[ci], root, i, k, sc.got[i][k], sc.seen[i][k]);
                            break;
                        }
                CHECK(!sc.twice, "%s: gather_state_sink gave an element twice", mode);
                /* the root without a sink: refused on every rank that communicates, as
                 * gather_state_to without arrays (it used to return on the root alone, and
                 * the others waited for it in the gather) */
                ss =
                    ddp_reducer_gather_state_sink(red, root, (const void *const *)part, NULL, NULL);
                CHECK(refused ? ss == DDP_ERR_INVALID &&
                                    strstr(ddp_reducer_last_error(red),
                                           R == root ? "no sink on the root" : "another rank")
                              : ss == DDP_OK,
                      "%s: gather_state_sink without a sink on the root: %d %s", mode, (int)ss,
                      ddp_reducer_last_error(red));
                sc.calls = 0;
                sc.fail_at = 2;
                ss = ddp_reducer_gather_state_sink(red, root, (const void *const *)part,
                                                   R == root ? sink_piece : NULL, &sc);
                CHECK(R != root ? ss == DDP_OK
                                : ss == DDP_ERR_SYSTEM &&
                                      strstr(ddp_reducer_last_error(red), "the sink refused") &&
                                      sc.calls == 2,
                      "%s: a refusing sink on %d: %d %s (%d calls)", mode, root, (int)ss,
                      ddp_reducer_last_error(red), sc.calls);
                for (int i = 0; i < NP && R == root; i++) {
                    free(sc.got[i]);
                    free(sc.seen[i]);
                }
                for (int i = 0; i < NP; i++) {
                    if (R == root) {
                        xfer(h[i], whole[i], sizeof(float) * counts[i]);
                        for (size_t k = 0; k < counts[i]; k++)
                            CHECK(h[i][k] == 3.0f * (float)k - (float)i,
                                  "%s cap %zu: gather_state_to %d: %d[%zu] = %g, want %g", mode,
                                  caps[ci], root, i, k, h[i][k], 3.0f * (float)k - (float)i);
                        dfree(whole[i]);
                    }
                    dfree(part[i]);
                }
            }
            /* mean over ranks of accum × ((r+1)(i+1) + k%3), on this rank's shard */
            double ss = 0;
            for (int i = 0; i < NP; i++) {
                const float *gr = h[i];
                xfer(h[i], ddp_reducer_grad(red, (size_t)i), sizeof(float) * counts[i]);
                size_t lo, hi;
                ddp_reducer_shard(red, (size_t)i, &lo, &hi);
                for (size_t k = 0; k < counts[i]; k++) {
                    double want = 0;
                    for (int r = 0; r < W; r++)
                        want += (double)accum * ((r + 1) * (i + 1) + (double)(k % 3));
                    want /= W;
                    ss += (double)(float)want * (float)want;
                    if (k < lo || k >= hi || (k % (1 + counts[i] / 50) && k != lo && k != hi - 1))
                        continue;
                    double tol = bf16 ? fabs(want) / 256 : 0;
                    CHECK(fabs(gr[k] - (float)want) <= tol,
                          "%s cap %zu step %d: grad %d[%zu] = %g, want %g", mode, caps[ci], step, i,
                          k, gr[k], want);
                }
            }
            double norm;
            CHECK(ddp_reducer_grad_norm(red, &norm) == DDP_OK &&
                      fabs(norm - sqrt(ss)) <= sqrt(ss) * (bf16 ? 1e-2 : 1e-12),
                  "%s: grad_norm %g, want %g", mode, norm, sqrt(ss));
            /* A step on the shard (p -= 1), then every rank has every update. */
            for (int i = 0; i < NP; i++) {
                size_t lo, hi;
                ddp_reducer_shard(red, (size_t)i, &lo, &hi);
                xfer(h[i], pv[i], sizeof(float) * counts[i]);
                for (size_t k = lo; k < hi; k++)
                    h[i][k] -= 1.0f;
                xfer(pv[i], h[i], sizeof(float) * counts[i]);
            }
            CHECK(ddp_reducer_gather_params(red) == DDP_OK, "%s: gather_params: %s", mode,
                  ddp_reducer_last_error(red));
            for (int i = 0; i < NP; i++) {
                float *hs = malloc(sizeof(float) * counts[i]);
                xfer(h[i], pv[i], sizeof(float) * counts[i]);
                xfer(hs, state[i], sizeof(float) * counts[i]);
                for (size_t k = 0; k < counts[i]; k++) {
                    float wp = (float)i - (float)(step + 1);
                    float ws = (float)(k % 1000) + 0.25f * (float)i;
                    if (h[i][k] != wp || hs[k] != ws) {
                        CHECK(0,
                              "%s cap %zu step %d: after the gathers %d[%zu] = %g / %g, want "
                              "%g / %g",
                              mode, caps[ci], step, i, k, h[i][k], hs[k], wp, ws);
                        break;
                    }
                }
                free(hs);
                dfree(state[i]);
            }
        }
        if (shard && W > 1) { /* spent gradients, an ungathered step: errors, not garbage */
            ddp_status s1 = ddp_reducer_mark_ready(red, 0);
            CHECK(s1 == DDP_ERR_INVALID && strstr(ddp_reducer_last_error(red), "zero_grad"),
                  "%s: marking spent gradients not refused: %s", mode, ddp_reducer_last_error(red));
            ddp_reducer_zero_grad(red);
            CHECK(ddp_reducer_finish(red) == DDP_OK, "%s: finish", mode);
            ddp_reducer_zero_grad(red);
            s1 = ddp_reducer_mark_ready(red, 0);
            CHECK(s1 == DDP_ERR_INVALID && strstr(ddp_reducer_last_error(red), "gather_params"),
                  "%s: a step without gather_params not refused: %s", mode,
                  ddp_reducer_last_error(red));
            CHECK(ddp_reducer_gather_params(red) == DDP_OK, "%s: gather_params", mode);
        }
        /* Marking a gradient twice in one step is an error, not silent garbage. */
        ddp_reducer_zero_grad(red);
        ddp_status st1 = ddp_reducer_mark_ready(red, 0);
        ddp_status st2 = ddp_reducer_mark_ready(red, 0);
        CHECK(st1 == DDP_OK && st2 == DDP_ERR_INVALID &&
                  strstr(ddp_reducer_last_error(red), "already marked"),
              "double mark not refused: %s", ddp_reducer_last_error(red));
        ddp_reducer_finish(red);
        ddp_reducer_gather_params(red);
        if (R == 0 && ci == 0)
            printf("reducercheck: %zu buckets at %zu B\n", ddp_reducer_num_buckets(red), caps[ci]);
        ddp_reducer_destroy(red);
        for (int i = 0; i < NP; i++) {
            dfree(vals[i]);
            free(h[i]);
        }
        dfree(dstats);
    }
    /* A dead group under an inline step (a world of one: its abort reaches no other rank, which
     * would fail wherever it stood): the mark_ready that reduces fails with the group's error;
     * the step is then poisoned, so the caller's next mark_ready (a retry, or the next step's
     * backward without finish) gives that failure again, not "already marked", as does finish,
     * which ends the step; the step after it fails on the group afresh. Last: the group is
     * gone. */
    if (W == 1 && !on_gpu) {
        float a[4] = {1, 2, 3, 4};
        ddp_param one = {"a", 4, DDP_FLOAT32, a, DDP_DEVICE_CPU};
        ddp_reducer_opts ro = DDP_REDUCER_OPTS_INIT;
        ro.overlap = DDP_OVERLAP_INLINE;
        ddp_reducer *red = NULL;
        CHECK(ddp_reducer_create(g, &one, 1, NULL, 0, &ro, &red, &err) == DDP_OK,
              "dead group: create: %s", err.msg);
        if (red) {
            ddp_group_abort(g);
            ddp_status s1 = ddp_reducer_mark_ready(red, 0);
            char first[DDP_ERRMSG_MAX];
            snprintf(first, sizeof first, "%s", ddp_reducer_last_error(red));
            CHECK(s1 != DDP_OK && strstr(first, "bucket 0"),
                  "dead group: mark_ready returned %d '%s'", (int)s1, first);
            ddp_status s2 = ddp_reducer_mark_ready(red, 0);
            CHECK(s2 == s1 && !strcmp(ddp_reducer_last_error(red), first),
                  "dead group: the next mark_ready returned %d '%s', want %d '%s'", (int)s2,
                  ddp_reducer_last_error(red), (int)s1, first);
            ddp_status s3 = ddp_reducer_finish(red);
            CHECK(s3 == s1 && !strcmp(ddp_reducer_last_error(red), first),
                  "dead group: finish returned %d '%s', want %d '%s'", (int)s3,
                  ddp_reducer_last_error(red), (int)s1, first);
            ddp_reducer_zero_grad(red);
            ddp_status s4 = ddp_reducer_mark_ready(red, 0);
            CHECK(s4 != DDP_OK && strstr(ddp_reducer_last_error(red), "bucket 0") &&
                      !strstr(ddp_reducer_last_error(red), "already marked"),
                  "dead group: the step after finish: %d '%s'", (int)s4,
                  ddp_reducer_last_error(red));
            ddp_reducer_finish(red);
            ddp_reducer_destroy(red);
        }
    }
    if (R == 0 && !fails)
        printf("reducercheck: all checks passed on %d rank%s (%s, backend %s)\n", W,
               W == 1 ? "" : "s", on_gpu ? "GPU memory" : "host memory", ddp_group_backend(g));
    ddp_group_destroy(g);
    return fails ? 1 : 0;
}
