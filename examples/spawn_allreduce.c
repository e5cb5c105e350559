/*
 * spawn_allreduce — a data-parallel world started from inside one program, with no launcher:
 * ddp_spawn() forks the workers (the mp.spawn style), each joins the group and they sum a
 * vector; rank 0 checks the result. If a rank fails, the others are stopped and ddp_spawn says
 * which rank and how.
 *
 *   ./build/bin/spawn_allreduce 4           # four ranks on this host
 *   ./build/bin/spawn_allreduce 4 2         # the same, but rank 2 fails with exit code 3
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/ddp.h"

typedef struct job {
    size_t count;  /* floats each rank contributes */
    int fail_rank; /* -1, or the rank that fails (to show the all-or-nothing stop) */
} job;

/* One worker: w says who it is; the environment says the same, so ddp_group_init(NULL, …)
 * finds the world and the store by itself. */
static int work(const ddp_world *w, void *arg)
{
    const job *j = arg;
    ddp_error err = {0};
    ddp_group *g;
    if (ddp_group_init(NULL, &g, &err) != DDP_OK) {
        fprintf(stderr, "rank %d: %s\n", w->rank, err.msg);
        return 1;
    }
    if (w->rank == j->fail_rank) {
        fprintf(stderr, "rank %d: failing on purpose\n", w->rank);
        ddp_group_destroy(g);
        return 3;
    }
    float *x = malloc(sizeof *x * j->count); /* (count,) fp32: rank + 1 everywhere */
    int rc = x ? 0 : 1;
    for (size_t i = 0; x && i < j->count; i++)
        x[i] = (float)(w->rank + 1);
    if (!rc && ddp_allreduce(g, x, x, j->count, DDP_FLOAT32, DDP_SUM) != DDP_OK) {
        fprintf(stderr, "rank %d: %s\n", w->rank, ddp_group_last_error(g));
        /* Another rank's failure is not this one's: DDP_EXIT_PEER_FAILED lets ddp_spawn name
         * the rank that failed first-hand, whichever of them ends first. */
        rc = ddp_group_peer_failed(g) ? DDP_EXIT_PEER_FAILED : 1;
    }
    float want = (float)(w->world_size * (w->world_size + 1) / 2);
    for (size_t i = 0; !rc && i < j->count; i++)
        if (x[i] != want)
            rc = 1;
    if (w->rank == 0 && !rc)
        printf("%d rank%s (%s): every element is %g, as expected\n", w->world_size,
               w->world_size == 1 ? "" : "s", ddp_group_backend(g), (double)want);
    free(x);
    ddp_group_destroy(g);
    return rc;
}

int main(int argc, char **argv)
{
    char *end1 = NULL, *end2 = NULL;
    long nl = argc > 1 ? strtol(argv[1], &end1, 10) : 2;
    long fl = argc > 2 ? strtol(argv[2], &end2, 10) : -1;
    bool bad_n = argc > 1 && (!*argv[1] || *end1 || nl < 1 || nl > 1024);
    bool bad_f = argc > 2 && (!*argv[2] || *end2 || fl < 0 || fl >= nl);
    if (bad_n || bad_f || argc > 3) { /* --help, or not a count */
        bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        fprintf(help ? stdout : stderr,
                "%susage: spawn_allreduce [RANKS [FAILING_RANK]]\n"
                "  RANKS         workers to fork on this host (default 2)\n"
                "  FAILING_RANK  a rank that exits with code 3, to show the others stopped\n",
                help    ? ""
                : bad_n ? "spawn_allreduce: RANKS is a number from 1 to 1024\n"
                : bad_f ? "spawn_allreduce: FAILING_RANK is a rank below RANKS\n"
                        : "spawn_allreduce: too many arguments\n");
        return help ? 0 : 2;
    }
    int n = (int)nl;
    job j = {1 << 20, (int)fl};
    ddp_spawn_opts o = DDP_SPAWN_OPTS_INIT;
    o.timeout_ms = 10 * 60 * 1000;
    ddp_spawn_result res;
    ddp_error err = {0};
    if (ddp_spawn(n, work, &j, &o, &res, &err) != DDP_OK) {
        fprintf(stderr, "spawn_allreduce: %s\n", err.msg);
        return 1;
    }
    return 0;
}
