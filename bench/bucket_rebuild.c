/*
 * bucket_rebuild — what rebuilding the reducer's buckets along the ready order gains (run by
 * bench/bucket_rebuild.sh under ddprun). A synthetic model of LAYERS layers of COUNT float32
 * gradients each; "backward" visits the layers from the last to the first, spends WORK
 * multiply-adds per element computing each layer's gradient, then marks it ready. The parameters
 * are registered in one of three orders:
 *   forward   layer 0 first: the reverse-registration layout already matches backward
 *   backward  the last layer first (a library that registers the head first): the initial
 *             layout is the worst one, the first bucket holds the gradients ready last
 *   shuffled  a fixed shuffle
 * and the reducer rebuilds (rebuild_buckets, the default) or not. Prints, on rank 0, the median
 * ms per step over STEPS steps after WARMUP (the rebuild happens in the warm-up), and the
 * reducer's hidden fraction of the last step.
 * With JOIN = join (bench/join_overhead.sh), uneven-input support is on (ddp_reducer_set_join:
 * one more small allreduce per step) and every rank joins once after its last step.
 *   bucket_rebuild ORDER on|off [LAYERS] [COUNT] [WORK] [STEPS] [CAP_BYTES] [join]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

#define WARMUP 5

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bucket_rebuild forward|backward|shuffled on|off [LAYERS] [COUNT] "
                        "[WORK] [STEPS] [CAP_BYTES] [join]\n");
        return 2;
    }
    const char *order = argv[1];
    bool rebuild = !strcmp(argv[2], "on");
    int L = argc > 3 ? atoi(argv[3]) : 16;
    size_t count = argc > 4 ? (size_t)atol(argv[4]) : 131072;
    int work = argc > 5 ? atoi(argv[5]) : 16;
    int steps = argc > 6 ? atoi(argv[6]) : 40;
    size_t cap = argc > 7 ? (size_t)atol(argv[7]) : (size_t)1 << 20;
    bool join = argc > 8 && !strcmp(argv[8], "join");
    if (L < 2 || L > 4096 || count == 0 || work < 1 || steps < 1 ||
        (strcmp(order, "forward") && strcmp(order, "backward") && strcmp(order, "shuffled"))) {
        fprintf(stderr, "bucket_rebuild: bad arguments\n");
        return 2;
    }
    ddp_error err = {0};
    ddp_group *g;
    ddp_group_opts go = DDP_GROUP_OPTS_INIT;
    if (ddp_group_init(&go, &g, &err) != DDP_OK) {
        fprintf(stderr, "bucket_rebuild: %s\n", err.msg);
        return 1;
    }
    /* reg[j]: the layer registered j-th; slot[l]: layer l's parameter index */
    int *reg = malloc(sizeof(int) * (size_t)L), *slot = malloc(sizeof(int) * (size_t)L);
    for (int j = 0; j < L; j++)
        reg[j] = order[0] == 'b' ? L - 1 - j : j;
    if (order[0] == 's') {
        unsigned s = 12345;
        for (int j = L - 1; j > 0; j--) {
            s = s * 1103515245u + 12345u;
            int k = (int)((s >> 8) % (unsigned)(j + 1)), t = reg[j];
            reg[j] = reg[k];
            reg[k] = t;
        }
    }
    ddp_param *ps = calloc((size_t)L, sizeof *ps);
    char(*names)[24] = calloc((size_t)L, sizeof *names);
    float *x = malloc(sizeof(float) * count);
    for (size_t k = 0; k < count; k++)
        x[k] = (float)(k % 17) * 0.01f;
    for (int j = 0; j < L; j++) {
        slot[reg[j]] = j;
        snprintf(names[j], sizeof names[j], "layer%d.weight", reg[j]);
        ps[j] =
            (ddp_param){names[j], count, DDP_FLOAT32, calloc(count, sizeof(float)), DDP_DEVICE_CPU};
    }
    ddp_reducer_opts o = DDP_REDUCER_OPTS_INIT;
    o.bucket_cap = o.first_bucket = cap;
    o.rebuild_buckets = rebuild;
    ddp_reducer *red;
    if (ddp_reducer_create(g, ps, (size_t)L, NULL, 0, &o, &red, &err) != DDP_OK) {
        fprintf(stderr, "bucket_rebuild: %s\n", err.msg);
        return 1;
    }
    if (join && ddp_reducer_set_join(red, NULL, true) != DDP_OK) {
        fprintf(stderr, "bucket_rebuild: %s\n", ddp_reducer_last_error(red));
        return 1;
    }
    double *ms = malloc(sizeof(double) * (size_t)steps);
    ddp_reducer_stats st = {0};
    for (int s = 0; s < WARMUP + steps; s++) {
        ddp_barrier(g);
        double t0 = ddp_now_seconds();
        ddp_reducer_zero_grad(red);
        for (int l = L - 1; l >= 0; l--) { /* backward: the last layer first */
            float *gr = ddp_reducer_grad(red, (size_t)slot[l]);
            for (size_t k = 0; k < count; k++) {
                float v = x[k];
                for (int w = 0; w < work; w++)
                    v = v * 0.999f + 0.001f;
                gr[k] += v;
            }
            if (ddp_reducer_mark_ready(red, (size_t)slot[l]) != DDP_OK) {
                fprintf(stderr, "bucket_rebuild: %s\n", ddp_reducer_last_error(red));
                return 1;
            }
        }
        if (ddp_reducer_finish(red) != DDP_OK) {
            fprintf(stderr, "bucket_rebuild: %s\n", ddp_reducer_last_error(red));
            return 1;
        }
        if (s >= WARMUP)
            ms[s - WARMUP] = (ddp_now_seconds() - t0) * 1e3;
        ddp_reducer_stats_get(red, &st);
    }
    bool others = false;
    if (join && (ddp_reducer_join(red, &others) != DDP_OK || others)) {
        fprintf(stderr, "bucket_rebuild: join: %s\n", ddp_reducer_last_error(red));
        return 1;
    }
    /* every rank's median, so that rank 0 reports the slower one */
    qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
    double med = ms[steps / 2], all = med;
    ddp_allreduce(g, &med, &all, 1, DDP_FLOAT64, DDP_MAX);
    if (ddp_group_rank(g) == 0)
        printf("%.3f %.2f %zu %d\n", all, st.hidden_fraction, ddp_reducer_num_buckets(red),
               (int)ddp_reducer_rebuilt(red));
    ddp_reducer_destroy(red);
    for (int j = 0; j < L; j++)
        free(ps[j].data);
    free(ps);
    free(names);
    free(x);
    free(reg);
    free(slot);
    free(ms);
    ddp_group_destroy(g);
    return 0;
}
