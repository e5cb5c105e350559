/*
 * joincheck — uneven inputs (ddp_reducer_set_join / ddp_reducer_join; torch's model.join()),
 * under ddprun at any world size. Rank q has a different number of batches in each epoch; the
 * ranks that run out keep matching the others' synced steps until every rank has joined:
 *  - no rank waits, every rank ends each epoch, and ddp_reducer_join says "others" exactly as
 *    many times as the longest rank had steps more;
 *  - the joined ranks step their optimizer with the mean they receive, so the parameters are
 *    identical on every rank (bit for bit) and equal a serial reference: the mean over the
 *    ranks still training, divided by the world size (torch's default) or by the ranks still
 *    training (divide_by_initial_world_size = false);
 *  - with no_sync micro-steps, bf16 compression, the sharded optimizer step, and two epochs on
 *    one reducer (the second with another rank shortest; on the progress thread the buckets are
 *    rebuilt while rank 0 has joined; and along the order of the ranks that trained when rank
 *    0 joined before the first step);
 *  - stats.joined counts the ranks out of inputs at each step;
 *  - epochs on one reducer: one rank joins early, then all at once, then join is turned off;
 *  - throw_on_early_termination fails every rank at the same step naming who ran out (the
 *    others' later marks in that step return the same failure without communicating), and
 *    every rank trains again in the next epoch;
 *  - set_join's options differing across ranks are refused on every rank, naming them; join
 *    without set_join, and mark_ready or finish on a joined rank, are refused;
 *  - a rank out of inputs that does not join: the others' failure names ddp_reducer_join (last:
 *    the group is failed after it; not over NCCL, which cannot tell one collective from another).
 * With --device cuda the same runs on a GPU group (the test-only fake GPU under
 * DDP_TEST_FAKE_GPUS, whose memory the host cannot touch: everything goes through
 * ddp_group_memcpy), dividing by the ranks training included (on the GPU, as devops' reduce).
 * With --dump FILE [--by-ranks] it runs the plain fp32 case alone (two epochs, dividing by the
 * world size or by the ranks training) and rank 0 writes the final parameters to FILE (NP ×
 * COUNT float32) for tests/python/test_join_torch.py, which trains the same under torch's
 * model.join().
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

#define NP 4
#define COUNT 600
#define LR 1e-3f

static int fails, R, W;
static const char *dump_path; /* --dump: rank 0 writes the final parameters here */
static ddp_group *G;
static bool on_gpu;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "joincheck rank %d: ", R);                                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_PROG "joincheck"
#include "check_mem.h"

/* The order backward marks the parameters in (not the registration's: the rebuild applies). */
static const int ORDER[NP] = {2, 0, 3, 1};

/* A gradient value with a full mantissa. */
static float gval(int q, int e, int s, int m, int i, size_t k)
{
    uint32_t h = (uint32_t)(q * 7919 + e * 3571 + s * 104729 + m * 1299709 + i * 15485863) ^
                 (uint32_t)k * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h % 2000001) / 1000.0f - 1000.0f + 1.0f / 3.0f;
}

/* Batches of rank q in epoch e: rank 0 shortest first (it joins before the rebuild), then the
 * last rank. */
static int batches(int e, int q)
{
    return e == 0 ? 1 + 2 * q : 2 + (W - 1 - q);
}

static int most(int e)
{
    int n = 0;
    for (int q = 0; q < W; q++)
        n = batches(e, q) > n ? batches(e, q) : n;
    return n;
}

typedef struct run {
    float *vals[NP];
    float *ref[NP]; /* the serial reference */
    ddp_param ps[NP];
    char names[NP][8];
    ddp_reducer *red;
    bool bf16, shard;
} run;

static int make(ddp_group *g, run *t, bool bf16, bool shard)
{
    ddp_error err = {0};
    t->bf16 = bf16;
    t->shard = shard;
    for (int i = 0; i < NP; i++) {
        t->vals[i] = dalloc(COUNT * sizeof(float));
        t->ref[i] = malloc(COUNT * sizeof(float));
        for (size_t k = 0; k < COUNT; k++)
            t->ref[i][k] = (float)((i * 31 + (int)k) % 17) * 0.125f - 1.0f;
        xfer(t->vals[i], t->ref[i], COUNT * sizeof(float));
        snprintf(t->names[i], sizeof t->names[i], "p%d", i);
        t->ps[i] = (ddp_param){t->names[i], COUNT, DDP_FLOAT32, t->vals[i],
                               on_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU};
    }
    ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
    o.bucket_cap = o.first_bucket = COUNT * sizeof(float); /* a bucket per parameter */
    o.compress_bf16 = bf16;
    o.shard_optimizer = shard;
    if (ddp_reducer_create(g, t->ps, NP, NULL, 0, &o, &t->red, &err) != DDP_OK) {
        fprintf(stderr, "joincheck: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static void drop(run *t)
{
    ddp_reducer_destroy(t->red);
    for (int i = 0; i < NP; i++) {
        dfree(t->vals[i]);
        free(t->ref[i]);
    }
}

/* SGD on this rank's shard of the mean gradient, then the gather (a no-op unsharded). */
static int sgd(run *t)
{
    float p[COUNT], gr[COUNT];
    for (int i = 0; i < NP; i++) {
        size_t lo, hi;
        ddp_reducer_shard(t->red, (size_t)i, &lo, &hi);
        xfer(p, ddp_reducer_param(t->red, (size_t)i), sizeof p);
        xfer(gr, ddp_reducer_grad(t->red, (size_t)i), sizeof gr);
        for (size_t k = lo; k < hi; k++)
            p[k] -= LR * gr[k];
        xfer(ddp_reducer_param(t->red, (size_t)i), p, sizeof p);
    }
    if (ddp_reducer_gather_params(t->red) != DDP_OK) {
        fprintf(stderr, "joincheck: gather_params: %s\n", ddp_reducer_last_error(t->red));
        return 1;
    }
    return 0;
}

/* The serial reference of epoch e: each step's mean over the ranks still training. */
static void reference(run *t, int e, int micro, bool by_world)
{
    float *acc = malloc(COUNT * sizeof(float));
    for (int s = 0; s < most(e); s++) {
        int n = 0;
        for (int q = 0; q < W; q++)
            n += batches(e, q) > s;
        for (int i = 0; i < NP; i++) {
            for (size_t k = 0; k < COUNT; k++) {
                double sum = 0;
                for (int q = 0; q < W; q++) {
                    float a = 0; /* a rank's own micro-steps, summed in float as it does */
                    for (int m = 0; m < micro && batches(e, q) > s; m++)
                        a += gval(q, e, s, m, i, k);
                    sum += a;
                }
                acc[k] = (float)(sum / (by_world ? W : n));
            }
            for (size_t k = 0; k < COUNT; k++)
                t->ref[i][k] -= LR * acc[k];
        }
    }
    free(acc);
}

/* The parameters: the same bits on every rank, and the reference's values within tol. */
static void compare(ddp_group *g, run *t, const char *what, double tol)
{
    uint64_t h = 1469598103934665603ull, *all = malloc(sizeof(uint64_t) * (size_t)W);
    double worst = 0;
    float p[COUNT];
    for (int i = 0; i < NP; i++) {
        xfer(p, ddp_reducer_param(t->red, (size_t)i), sizeof p);
        for (size_t k = 0; k < COUNT; k++) {
            uint32_t b;
            memcpy(&b, &p[k], 4);
            h = (h ^ b) * 1099511628211ull;
            double d = fabs((double)p[k] - t->ref[i][k]) / (1.0 + fabs(t->ref[i][k]));
            worst = d > worst ? d : worst;
        }
    }
    CHECK(worst <= tol, "%s: the parameters are %.3g (relative) from the serial reference", what,
          worst);
    uint64_t *dh = dalloc(sizeof h), *dall = dalloc(sizeof(uint64_t) * (size_t)W);
    xfer(dh, &h, sizeof h);
    ddp_status st = ddp_allgather(g, dh, dall, 1, DDP_INT64);
    if (st == DDP_OK)
        xfer(all, dall, sizeof(uint64_t) * (size_t)W);
    dfree(dh);
    dfree(dall);
    if (st != DDP_OK)
        CHECK(0, "%s: allgather: %s", what, ddp_group_last_error(g));
    else
        for (int q = 0; q < W; q++)
            CHECK(all[q] == h, "%s: rank %d's parameters differ from rank %d's", what, q, R);
    free(all);
}

/* One epoch: this rank's batches, then join until every rank has joined. */
static int epoch(run *t, int e, int micro)
{
    ddp_reducer *red = t->red;
    int mine = batches(e, R), shadows = 0;
    for (int s = 0; s < mine; s++) {
        ddp_reducer_zero_grad(red);
        for (int m = 0; m < micro; m++) {
            ddp_reducer_set_sync(red, m == micro - 1);
            for (int j = 0; j < NP; j++) {
                int i = ORDER[j];
                float gr[COUNT];
                xfer(gr, ddp_reducer_grad(red, (size_t)i), sizeof gr);
                for (size_t k = 0; k < COUNT; k++)
                    gr[k] += gval(R, e, s, m, i, k);
                xfer(ddp_reducer_grad(red, (size_t)i), gr, sizeof gr);
                if (ddp_reducer_mark_ready(red, (size_t)i) != DDP_OK) {
                    fprintf(stderr, "joincheck: mark_ready: %s\n", ddp_reducer_last_error(red));
                    return 1;
                }
            }
            if (ddp_reducer_finish(red) != DDP_OK) {
                fprintf(stderr, "joincheck: finish: %s\n", ddp_reducer_last_error(red));
                return 1;
            }
        }
        int out = 0;
        for (int q = 0; q < W; q++)
            out += batches(e, q) <= s;
        ddp_reducer_stats st;
        ddp_reducer_stats_get(red, &st);
        CHECK(st.joined == out, "epoch %d step %d: stats.joined %d, want %d", e, s, st.joined, out);
        if (sgd(t))
            return 1;
    }
    ddp_reducer_set_sync(red, true);
    for (;;) {
        bool others = false;
        ddp_status st = ddp_reducer_join(red, &others);
        if (st != DDP_OK) {
            fprintf(stderr, "joincheck: join: %s\n", ddp_reducer_last_error(red));
            return 1;
        }
        if (!others)
            break;
        shadows++;
        ddp_reducer_stats stt;
        ddp_reducer_stats_get(red, &stt);
        int s = mine + shadows - 1, out = 0;
        for (int q = 0; q < W; q++)
            out += batches(e, q) <= s;
        CHECK(stt.joined == out, "epoch %d shadow step %d: stats.joined %d, want %d", e, s,
              stt.joined, out);
        if (shadows == 1) { /* a joined rank does not train */
            CHECK(ddp_reducer_mark_ready(red, 0) == DDP_ERR_INVALID &&
                      strstr(ddp_reducer_last_error(red), "has joined"),
                  "mark_ready on a joined rank: not refused (%s)", ddp_reducer_last_error(red));
            CHECK(ddp_reducer_finish(red) == DDP_ERR_INVALID &&
                      strstr(ddp_reducer_last_error(red), "has joined"),
                  "finish on a joined rank: not refused (%s)", ddp_reducer_last_error(red));
        }
        if (sgd(t))
            return 1;
    }
    CHECK(shadows == most(e) - mine, "epoch %d: join matched %d steps of the others, want %d", e,
          shadows, most(e) - mine);
    return 0;
}

static int case_run(ddp_group *g, const char *what, bool bf16, bool shard, int micro, bool by_world,
                    int epochs)
{
    run t;
    if (make(g, &t, bf16, shard))
        return 1;
    ddp_join_opts jo = DDP_JOIN_OPTS_INIT;
    jo.divide_by_initial_world_size = by_world;
    if (ddp_reducer_set_join(t.red, &jo, true) != DDP_OK) {
        fprintf(stderr, "joincheck: set_join: %s\n", ddp_reducer_last_error(t.red));
        return 1;
    }
    for (int e = 0; e < epochs; e++) {
        if (epoch(&t, e, micro))
            return 1;
        reference(&t, e, micro, by_world);
        char name[80];
        snprintf(name, sizeof name, "%s, epoch %d", what, e);
        compare(g, &t, name, bf16 ? 0.1 : 1e-5);
    }
    if (dump_path && R == 0) {
        FILE *f = fopen(dump_path, "wb");
        float p[COUNT];
        for (int i = 0; f && i < NP; i++) {
            xfer(p, ddp_reducer_param(t.red, (size_t)i), sizeof p);
            fwrite(p, sizeof p, 1, f);
        }
        CHECK(f && fclose(f) == 0, "cannot write %s", dump_path);
    }
    drop(&t);
    return 0;
}

/* One step of every rank marking every parameter (gradient R + 1) as docs/ddp.md's loop does,
 * reading the status from finish, whatever mark_ready said (its first failure must be finish's
 * too); *mark: mark_ready's first failure. */
static ddp_status step_all(run *t, ddp_status *mark)
{
    float gr[COUNT];
    for (size_t k = 0; k < COUNT; k++)
        gr[k] = (float)(R + 1);
    ddp_reducer_zero_grad(t->red);
    *mark = DDP_OK;
    for (int i = NP - 1; i >= 0; i--) {
        xfer(ddp_reducer_grad(t->red, (size_t)i), gr, sizeof gr);
        ddp_status st = ddp_reducer_mark_ready(t->red, (size_t)i);
        *mark = *mark ? *mark : st;
    }
    return ddp_reducer_finish(t->red);
}

/* throw_on_early_termination: the last rank has one batch, the others three; every rank fails at
 * the others' second step, the others' later marks in it do not count again (the collectives
 * would differ), and the epoch is over on every rank: the next one trains all of them again. */
static int case_throw(ddp_group *g)
{
    run t;
    if (make(g, &t, false, false))
        return 1;
    ddp_join_opts jo = DDP_JOIN_OPTS_INIT;
    jo.throw_on_early_termination = true;
    if (ddp_reducer_set_join(t.red, &jo, true) != DDP_OK)
        return 1;
    int mine = R == W - 1 ? 1 : 3;
    ddp_status st = DDP_OK, mark = DDP_OK;
    for (int s = 0; s < mine && st == DDP_OK; s++) {
        st = step_all(&t, &mark);
        CHECK(mark == DDP_OK || st == mark, "throw: mark_ready failed (%d) but finish said %d",
              (int)mark, (int)st);
    }
    if (st == DDP_OK) {
        bool others;
        st = ddp_reducer_join(t.red, &others);
    }
    char want[100];
    snprintf(want, sizeof want,
             "rank %d ran out of inputs before the others' synced step 2 of this epoch", W - 1);
    CHECK(st == DDP_ERR_CLOSED && strstr(ddp_reducer_last_error(t.red), want),
          "throw_on_early_termination: status %d, '%s' (want '%s')", (int)st,
          ddp_reducer_last_error(t.red), want);
    for (int s = 0; s < 2; s++) { /* the next epoch, every rank with two batches */
        st = step_all(&t, &mark);
        CHECK(st == DDP_OK && mark == DDP_OK, "throw, the next epoch's step %d: %d, '%s'", s,
              (int)(st ? st : mark), ddp_reducer_last_error(t.red));
        if (st || mark)
            break;
        float gr[COUNT];
        xfer(gr, ddp_reducer_grad(t.red, 0), sizeof gr);
        ddp_reducer_stats sts;
        ddp_reducer_stats_get(t.red, &sts);
        CHECK(gr[0] == (float)(W + 1) / 2 && sts.joined == 0,
              "throw, the next epoch's step %d: mean %g (want %g), stats.joined %d", s,
              (double)gr[0], (double)(W + 1) / 2, sts.joined);
    }
    /* Its end as the documented loop has it (every rank joins at once), then a third epoch as
     * the first: the step named is again the epoch's 2nd (it said 7, counting all epochs). */
    bool others = true;
    st = ddp_reducer_join(t.red, &others);
    CHECK(st == DDP_OK && !others, "throw, the second epoch's end: %d, others %d '%s'", (int)st,
          others, ddp_reducer_last_error(t.red));
    for (int s = 0; s < mine && st == DDP_OK; s++)
        st = step_all(&t, &mark);
    if (st == DDP_OK)
        st = ddp_reducer_join(t.red, &others);
    CHECK(st == DDP_ERR_CLOSED && strstr(ddp_reducer_last_error(t.red), want),
          "throw, the third epoch: status %d, '%s' (want '%s')", (int)st,
          ddp_reducer_last_error(t.red), want);
    drop(&t);
    return 0;
}

/* The mean every rank holds after a step where the first n ranks trained (gradient q + 1). */
static float mean_of(int n)
{
    return (float)(n * (n + 1) / 2) / (float)W;
}

/* Epochs on one reducer: the last rank joins early, then every rank joins at once, then join is
 * turned off (set_join(…, false)): the steps are plain ones again and join is refused. */
static int case_epochs_off(ddp_group *g)
{
    run t;
    if (make(g, &t, false, false))
        return 1;
    if (ddp_reducer_set_join(t.red, NULL, true) != DDP_OK)
        return 1;
    for (int e = 0; e < 3; e++) {
        if (e == 2 && ddp_reducer_set_join(t.red, NULL, false) != DDP_OK) {
            fprintf(stderr, "joincheck: set_join off: %s\n", ddp_reducer_last_error(t.red));
            return 1;
        }
        int mine = e == 0 ? (R == W - 1 ? 1 : 2) : e == 1 ? 1 : 2, s = 0;
        ddp_status st = DDP_OK, mark = DDP_OK;
        float gr[COUNT];
        for (; s < mine && st == DDP_OK; s++) {
            st = step_all(&t, &mark);
            xfer(gr, ddp_reducer_grad(t.red, 0), sizeof gr);
            int n = e == 0 && s == 1 ? W - 1 : W;
            CHECK(st == DDP_OK && gr[0] == mean_of(n), "epochs, %d/%d: %d '%s', mean %g want %g", e,
                  s, (int)st, ddp_reducer_last_error(t.red), (double)gr[0], (double)mean_of(n));
        }
        bool others = true;
        for (int k = 0; e < 2 && others && st == DDP_OK; k++) {
            st = ddp_reducer_join(t.red, &others);
            xfer(gr, ddp_reducer_grad(t.red, 0), sizeof gr);
            CHECK(st == DDP_OK && (!others || gr[0] == mean_of(W - 1)),
                  "epochs, %d/join %d: %d '%s', mean %g want %g", e, k, (int)st,
                  ddp_reducer_last_error(t.red), (double)gr[0], (double)mean_of(W - 1));
        }
        if (e == 2)
            CHECK(ddp_reducer_join(t.red, &others) == DDP_ERR_INVALID,
                  "join after set_join(false): not refused");
        if (st)
            return 1;
    }
    drop(&t);
    return 0;
}

/* Rank 0 out of inputs from the start, the others marking in ORDER for two steps: the buckets
 * are rebuilt (on the progress thread) along a rank that trained, not along rank 0's record,
 * which is only the buckets' order. */
static int case_rebuild_joined0(ddp_group *g)
{
    run t;
    if (make(g, &t, false, false))
        return 1;
    if (ddp_reducer_set_join(t.red, NULL, true) != DDP_OK)
        return 1;
    ddp_status st = DDP_OK;
    bool others = true;
    for (int s = 0; s < 2 && R > 0 && st == DDP_OK; s++) {
        ddp_reducer_zero_grad(t.red);
        for (int j = 0; j < NP && st == DDP_OK; j++)
            st = ddp_reducer_mark_ready(t.red, (size_t)ORDER[j]);
        st = st ? st : ddp_reducer_finish(t.red);
    }
    while (st == DDP_OK && others)
        st = ddp_reducer_join(t.red, &others);
    CHECK(st == DDP_OK, "rank 0 joined from the start: %s", ddp_reducer_last_error(t.red));
    if (ddp_reducer_rebuilt(t.red))
        for (int j = 0; j < NP; j++)
            CHECK(ddp_reducer_bucket_of(t.red, (size_t)ORDER[j]) == (size_t)j,
                  "rank 0 joined from the start: '%s' (marked at position %d) is in bucket %zu "
                  "after the "
                  "rebuild, want %d (the order of the ranks that trained)",
                  t.names[ORDER[j]], j + 1, ddp_reducer_bucket_of(t.red, (size_t)ORDER[j]), j);
    drop(&t);
    return 0;
}

/* A rank out of inputs that does not join (here it calls a collective of its own; idle, it would
 * leave the others waiting until the group's deadline) at the others' second step, where the
 * buckets are rebuilt: the count opens the step, so the others' failure says what to do
 * (ddp_reducer_join), not that the rebuild failed. Last: it leaves the group failed. */
static int case_forgot(ddp_group *g)
{
    run t;
    if (make(g, &t, false, false))
        return 1;
    if (ddp_reducer_set_join(t.red, NULL, true) != DDP_OK)
        return 1;
    ddp_status st = DDP_OK, mark = DDP_OK;
    int s = 0;
    for (; s < (R == W - 1 ? 1 : 2) && st == DDP_OK; s++)
        st = step_all(&t, &mark);
    if (R == W - 1) {
        CHECK(st == DDP_OK, "forgot join: the step failed: %s", ddp_reducer_last_error(t.red));
        CHECK(ddp_barrier(g) != DDP_OK, "forgot join: a barrier against the others' step passed");
    } else if (s == 2) { /* over tcp a rank may instead see the failure end its first step */
        CHECK(st != DDP_OK && strstr(ddp_reducer_last_error(t.red), "ddp_reducer_join") &&
                  !strstr(ddp_reducer_last_error(t.red), "rebuild"),
              "a rank that did not join: status %d, '%s' (want the count's failure naming "
              "ddp_reducer_join)",
              (int)st, ddp_reducer_last_error(t.red));
    }
    drop(&t);
    return 0;
}

/* Misuse: join without set_join; set_join's options differing across ranks. */
static int case_misuse(ddp_group *g)
{
    run t;
    if (make(g, &t, false, false))
        return 1;
    bool others;
    CHECK(ddp_reducer_join(t.red, &others) == DDP_ERR_INVALID &&
              strstr(ddp_reducer_last_error(t.red), "ddp_reducer_set_join"),
          "join without set_join: %s", ddp_reducer_last_error(t.red));
    ddp_join_opts jo = DDP_JOIN_OPTS_INIT;
    jo.throw_on_early_termination = R == W - 1;
    ddp_status st = ddp_reducer_set_join(t.red, &jo, true);
    CHECK(W == 1 ? st == DDP_OK
                 : st == DDP_ERR_INVALID &&
                       strstr(ddp_reducer_last_error(t.red), "throw_on_early_termination is"),
          "set_join differing across ranks: status %d, '%s'", (int)st,
          ddp_reducer_last_error(t.red));
    drop(&t);
    return 0;
}

int main(int argc, char **argv)
{
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    on_gpu = argc > 2 && !strcmp(argv[1], "--device") && !strcmp(argv[2], "cuda");
    go.device = on_gpu ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "joincheck: %s\n", err.msg);
        return 1;
    }
    G = g;
    W = ddp_group_size(g);
    R = ddp_group_rank(g);
    if (argc > 2 && !strcmp(argv[1], "--dump")) {
        dump_path = argv[2];
        bool by_ranks = argc > 3 && !strcmp(argv[3], "--by-ranks");
        int rc = case_run(g, "fp32 (dump)", false, false, 1, !by_ranks, 2);
        ddp_group_destroy(g);
        return fails || rc ? 1 : 0;
    }
    /* NCCL matches collectives by order alone: the forgetful rank's barrier (a one-element
     * allreduce there) completes against the others' count, as two mismatched collectives do
     * under torch's NCCL too; the backends of this project that check what they match fail it. */
    bool nccl = !strcmp(ddp_group_backend(g), "nccl");
    int rc =
        case_run(g, "fp32", false, false, 1, true, 2) ||
        case_run(g, "fp32, no_sync, divided by the ranks training", false, false, 2, false, 2) ||
        case_run(g, "bf16", true, false, 1, true, 1) ||
        case_run(g, "sharded", false, true, 1, true, 2) ||
        case_run(g, "sharded, divided by the ranks training", false, true, 2, false, 1) ||
        case_run(g, "sharded, bf16, divided by the ranks training", true, true, 2, false, 2) ||
        (W > 1 && case_throw(g)) || case_epochs_off(g) || (W > 1 && case_rebuild_joined0(g)) ||
        case_misuse(g) || (W > 1 && !nccl && case_forgot(g));
    if (R == 0 && !fails && !rc)
        printf("joincheck: all checks passed on %d rank%s\n", W, W == 1 ? "" : "s");
    ddp_group_destroy(g);
    return fails || rc ? 1 : 0;
}
