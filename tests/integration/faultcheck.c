/*
 * faultcheck — how the process group fails, started by tests/integration/test_faults.sh with
 * ranks launched by hand (no ddprun, whose all-or-nothing stop would hide the library's own
 * behaviour):
 *
 *   faultcheck loop      allreduce 4 MB in a loop, writing progress to $FAULT_DIR/progress.RANK;
 *                        the test kills or stops a rank from outside
 *   faultcheck left      rank 1 destroys its group at once and lives on 10 s (exit 4); the
 *                        others allreduce once
 *   faultcheck gone      rank 1 destroys its group and exits at once (exit 4); the others wait
 *                        1 s, then allreduce once
 *   faultcheck quit      the same, but rank 1 exits without destroying its group
 *   faultcheck counts    rank 0 calls allreduce × 4, the others allreduce × 100000 (every
 *                        backend must notice, without DDP_DEBUG)
 *   faultcheck mismatch  rank 0 calls allreduce × 1000, the others broadcast × 1000 (DDP_DEBUG=1
 *                        makes the group report it)
 *   faultcheck absent    the last rank never calls the collective: it sleeps 60 s (exit 4),
 *                        the others allreduce 4 MB once (tests/integration/test_mpi.sh: under
 *                        mpirun the job must end)
 *   faultcheck late      the last rank sleeps $FAULT_LATE seconds (default 5), then calls the
 *                        allreduce the others timed out in and aborted the group over (each
 *                        aborts after its error): it must fail too, not return DDP_OK;
 *                        with $FAULT_BARRIER set, a barrier instead of the allreduce
 *   faultcheck idle      one allreduce, then $FAULT_IDLE seconds with no collective (progress
 *                        −1 marks the start), then the loop (a peer that vanished meanwhile)
 *   faultcheck abort     the loop, in which rank 1 calls ddp_group_abort() at its 5th step
 * With $FAULT_DIR set, every rank writes its pid to $FAULT_DIR/pid.RANK once the group is up.
 * $FAULT_COUNT sets the loop's float32 count (default 1 Mi elements: 4 MB, the ring over tcp;
 * 1000 takes tcp's small-message allreduce). $FAULT_TIMEOUT (seconds) sets the collectives'
 * deadline once the group is up (ddp_group_set_timeout): a short one there, with DDP_TIMEOUT
 * left long, keeps set-up (which waits DDP_TIMEOUT) from failing when a rank starts seconds
 * after the others on a loaded host.
 *
 * On failure each surviving rank prints, on one line each: the error, the milliseconds between
 * the failing call's start and its return, and what a later call returns (the group is
 * poisoned), and whether the group blames another rank ("peer failed: yes", ddp_group_peer_failed).
 * Exit 3 when a collective failed as expected, 0 if the loop ran out, 1 on set-up.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ddp/ddp.h"

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void progress(int rank, int i)
{
    const char *dir = getenv("FAULT_DIR");
    if (!dir)
        return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/progress.%d", dir, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d\n", i);
        fclose(f);
        rename(tmp, path);
    }
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "loop";
    ddp_error err = {0};
    ddp_group *g;
    if (ddp_group_init(NULL, &g, &err) != DDP_OK) {
        fprintf(stderr, "faultcheck: %s\n", err.msg);
        return 1;
    }
    const char *ft = getenv("FAULT_TIMEOUT");
    if (ft && atoi(ft) > 0)
        ddp_group_set_timeout(g, atoi(ft) * 1000);
    int R = ddp_group_rank(g);
    const char *dir = getenv("FAULT_DIR");
    if (dir) { /* every rank's pid, for the test to stop one and to check that all are gone */
        char path[4096];
        snprintf(path, sizeof path, "%s/pid.%d", dir, R);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%d\n", (int)getpid());
            fclose(f);
        }
    }
    size_t n = (size_t)1 << 20;
    const char *cnt = getenv("FAULT_COUNT");
    if (cnt && atol(cnt) > 0)
        n = (size_t)atol(cnt);
    float *buf = calloc(n, sizeof *buf);
    float x[1000] = {0};
    ddp_status st = DDP_OK;
    long long t0 = now_ms();
    if (!strcmp(mode, "absent") && R == ddp_group_size(g) - 1) {
        struct timespec ts = {60, 0};
        while (nanosleep(&ts, &ts) != 0)
            ;
        free(buf);
        ddp_group_destroy(g);
        return 4;
    } else if (!strcmp(mode, "absent")) {
        st = ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
    } else if (!strcmp(mode, "late")) {
        if (R == ddp_group_size(g) - 1) {
            const char *late = getenv("FAULT_LATE");
            struct timespec ts = {late ? atoi(late) : 5, 0};
            while (nanosleep(&ts, &ts) != 0)
                ;
        }
        t0 = now_ms();
        st = getenv("FAULT_BARRIER") ? ddp_barrier(g)
                                     : ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
        if (st != DDP_OK && !getenv("FAULT_NO_ABORT"))
            ddp_group_abort(g); /* as group.h advises after an error */
    } else if (!strcmp(mode, "left")) {
        if (R == 1) { /* leaves at once, and lives on */
            ddp_group_destroy(g);
            struct timespec ts = {10, 0};
            while (nanosleep(&ts, &ts) != 0)
                ;
            free(buf);
            return 4;
        }
        st = ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
    } else if (!strcmp(mode, "gone") || !strcmp(mode, "quit")) {
        if (R == 1) { /* leaves, as a program that returns early does */
            if (!strcmp(mode, "gone"))
                ddp_group_destroy(g);
            free(buf);
            return 4;
        }
        struct timespec ts = {1, 0};
        while (nanosleep(&ts, &ts) != 0)
            ;
        t0 = now_ms();
        st = ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
    } else if (!strcmp(mode, "counts")) {
        st = ddp_allreduce(g, buf, buf, R == 0 ? 4 : 100000, DDP_FLOAT32, DDP_SUM);
    } else if (!strcmp(mode, "mismatch")) {
        st = R == 0 ? ddp_allreduce(g, x, x, 1000, DDP_FLOAT32, DDP_SUM)
                    : ddp_broadcast(g, x, 1000, DDP_FLOAT32, 0);
    } else {
        if (!strcmp(mode, "idle")) {
            st = ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
            progress(R, -1);
            const char *idle = getenv("FAULT_IDLE");
            struct timespec ts = {idle ? atoi(idle) : 1, 0};
            while (nanosleep(&ts, &ts) != 0) {
            }
        }
        bool abort_mode = !strcmp(mode, "abort");
        for (int i = 0; i < 100000 && st == DDP_OK; i++) {
            progress(R, i);
            t0 = now_ms();
            if (abort_mode && R == 1 && i == 5)
                ddp_group_abort(g);
            st = ddp_allreduce(g, buf, buf, n, DDP_FLOAT32, DDP_SUM);
        }
    }
    int code = 0;
    if (st != DDP_OK) {
        long long took = now_ms() - t0;
        printf("rank %d error: %s\n", R, ddp_group_last_error(g));
        printf("rank %d failed after %lld ms with status %s\n", R, took, ddp_status_str(st));
        ddp_status again = ddp_barrier(g);
        printf("rank %d later call: %s: %s\n", R, ddp_status_str(again), ddp_group_last_error(g));
        printf("rank %d peer failed: %s\n", R, ddp_group_peer_failed(g) ? "yes" : "no");
        fflush(stdout);
        code = 3;
    }
    free(buf);
    ddp_group_abort(g);
    ddp_group_destroy(g);
    return code;
}
