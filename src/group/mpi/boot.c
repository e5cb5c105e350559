/*
 * boot.c — joining the job's MPI, and set-up without a store: a group started by mpirun (or any
 * MPI launcher) meets its peers through MPI itself, so it needs no MASTER_ADDR, no port and no
 * rendezvous server. The core (group.c) gathers host ids through ddp__mpi_boot_allgather(); a
 * backend's set-up shares bytes and waits for its members through ddp__setup_bcast() and
 * ddp__setup_barrier() (backends.c), which land here. Every step is non-blocking MPI polled
 * against the set-up deadline, so a rank that never arrives is an error, not a hang.
 *
 * MPI is one per process, and can be initialised and finalised only once: that is the one piece
 * of process-wide state here (a count of the groups using it, under a mutex). The library
 * initialises MPI when the program has not, and finalises it when the last such group is
 * destroyed; a program that initialised MPI itself keeps it, and finalises it itself.
 * Not here: the collectives (mpi.c).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp/world.h" /* ddp_own_cores */
#include "group/mpi/mpi_int.h"
#include "util/util.h"

/* Tags on the boot communicator: the set-up steps between one pair of ranks happen in the same
 * order on both, and MPI keeps messages of one (source, tag) in order. */
enum { TAG_BCAST = 101, TAG_ARRIVE = 102, TAG_RELEASE = 103, TAG_COMM = 104 };

struct ddp__mpi_boot {
    MPI_Comm
        comm; /* duplicate of MPI_COMM_WORLD: the library's messages never meet the program's */
    int rank, size;
    int timeout_ms;
    int index; /* the how-manieth group of this process */
};

/* Process-wide, because MPI is (see the top of the file). */
static pthread_mutex_t boot_mu = PTHREAD_MUTEX_INITIALIZER;
static int boot_users;    /* groups alive on MPI */
static int boot_groups;   /* groups ever made: each one's index */
static bool boot_we_init; /* the library called MPI_Init_thread, so it finalises */

bool ddp__mpi_built(void)
{
    return true;
}

MPI_Comm ddp__mpi_boot_comm(const ddp__mpi_boot *b)
{
    return b->comm;
}

int ddp__mpi_boot_index(const ddp__mpi_boot *b)
{
    return b->index;
}

void ddp__mpi_errstr(int code, char *buf, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, s, &len) != MPI_SUCCESS)
        ddp__fmt(buf, cap, "MPI error %d", code);
    else
        ddp__fmt(buf, cap, "%.*s", len, s);
}

ddp_status ddp__mpi_poll(MPI_Request *req, int64_t deadline_ms)
{
    int64_t start = ddp__now_ns();
    for (unsigned i = 0;; i++) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return DDP_ERR_NETWORK;
        if (done)
            return DDP_OK;
        if ((i & 63) == 0 && ddp__now_ms() >= deadline_ms)
            return DDP_ERR_TIMEOUT;
        if (ddp__now_ns() - start > 200000) { /* set-up is not urgent: let others run */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
}

/* Polls every request of reqs (n) until all are done or the deadline passes. */
static ddp_status poll_all(MPI_Request *reqs, int n, int64_t deadline_ms)
{
    for (int i = 0; i < n; i++) {
        ddp_status st = ddp__mpi_poll(&reqs[i], deadline_ms);
        if (st)
            return st;
    }
    return DDP_OK;
}

static ddp_status mpi_fail(ddp_error *err, int code, const char *call)
{
    char s[256];
    ddp__mpi_errstr(code, s, sizeof s);
    return ddp__err(err, DDP_ERR_NETWORK, "MPI set-up: %s failed: %s", call, s);
}

static ddp_status late(ddp_error *err, const ddp__mpi_boot *b, const char *what)
{
    char d[32];
    ddp__fmt_duration(d, sizeof d, b->timeout_ms);
    return ddp__err(err, DDP_ERR_TIMEOUT,
                    "MPI set-up: %s timed out after %s on rank %d: a rank has not started the "
                    "group (or failed before it); every rank must call ddp_group_init",
                    what, d, b->rank);
}

/* Before the library initialises MPI: tells Open MPI to yield the CPU while its blocking calls
 * wait (MCA mpi_yield_when_idle, read once, at MPI_Init) when this host's ranks may share CPUs.
 * Open MPI does that by itself only where mpirun sees more ranks than slots; a job confined to
 * fewer CPUs than ranks some other way (taskset or a cpuset cgroup around mpirun --bind-to none)
 * spins ranks that share a CPU against each other, milliseconds a call (bench/RESULTS.md, "How
 * the mpi backend waits"). Crowded: not bound by mpirun at launch (it binds a rank to CPUs of
 * its own only where it has them), and fewer CPUs in this process's mask than ranks on the host
 * (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE). A setting of the user's, in the environment or by
 * mpirun --mca (which reaches the ranks the same way), is left as it is. The environment is
 * the only way in before MPI_Init; this runs under boot_mu, once, before MPI starts. */
static void yield_if_crowded(void)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char *bound = getenv("OMPI_MCA_orte_bound_at_launch");
    if (!local || getenv("OMPI_MCA_mpi_yield_when_idle") || (bound && strcmp(bound, "0") != 0))
        return;
    long n = strtol(local, NULL, 10);
    if (n > ddp_own_cores())
        (void)setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
}

ddp_status ddp__mpi_boot_open(int rank, int world_size, int timeout_ms, ddp__mpi_boot **out,
                              ddp_error *err)
{
    int inited = 0, finalized = 0, rc;
    pthread_mutex_lock(&boot_mu);
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    ddp_status st = DDP_OK;
    if (finalized) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "MPI has been finalised in this process (%s), and MPI cannot start twice: "
                      "keep one group alive for the whole program, or initialise MPI yourself",
                      boot_we_init ? "when its last group was destroyed" : "by the program");
        goto out_unlock;
    }
    if (!inited) {
        /* SERIALIZED: the group calls MPI from the caller's thread or its progress thread, one
         * at a time (the core runs one collective at a time); Open MPI 4.1 gives up to
         * MULTIPLE, which would add locking to every call for nothing. The one exception is the
         * mpi backend's watchdog, whose MPI_Abort ends a job while a blocking call that will
         * never return is still inside MPI (mpi.c says why that is safe in Open MPI). */
        int provided = 0;
        yield_if_crowded();
        if ((rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided)) != MPI_SUCCESS) {
            st = mpi_fail(err, rc, "MPI_Init_thread");
            goto out_unlock;
        }
        boot_we_init = true;
        if (provided < MPI_THREAD_SERIALIZED) {
            st =
                ddp__err(err, DDP_ERR_INVALID,
                         "this MPI offers thread level %d, below MPI_THREAD_SERIALIZED (%d), which "
                         "the group needs (it calls MPI from its progress thread); use another "
                         "MPI build or backend",
                         provided, MPI_THREAD_SERIALIZED);
            goto out_unlock;
        }
    } else {
        int provided = 0;
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_SERIALIZED) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "the program initialised MPI with thread level %d; the group calls MPI "
                          "from its progress thread too: initialise with MPI_Init_thread(…, "
                          "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, …)",
                          provided);
            goto out_unlock;
        }
    }
    int r = -1, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (r != rank || n != world_size) {
        st = ddp__err(err, DDP_ERR_INVALID,
                      "MPI says this is rank %d of %d, but the environment says rank %d of %d; "
                      "start the program with one launcher (mpirun or ddprun), not both",
                      r, n, rank, world_size);
        goto out_unlock;
    }
    ddp__mpi_boot *b = calloc(1, sizeof *b);
    if (!b) {
        st = ddp__err(err, DDP_ERR_NOMEM, "out of memory joining MPI");
        goto out_unlock;
    }
    b->rank = r;
    b->size = n;
    b->timeout_ms = timeout_ms;
    b->index = boot_groups;
    MPI_Request req;
    if ((rc = MPI_Comm_idup(MPI_COMM_WORLD, &b->comm, &req)) != MPI_SUCCESS) {
        free(b);
        st = mpi_fail(err, rc, "MPI_Comm_idup");
        goto out_unlock;
    }
    pthread_mutex_unlock(&boot_mu);
    if ((st = ddp__mpi_poll(&req, ddp__now_ms() + timeout_ms))) {
        /* The request stays active; the job cannot go on: the caller reports and the job ends. */
        free(b);
        return st == DDP_ERR_TIMEOUT
                   ? late(err, &(ddp__mpi_boot){.rank = r, .timeout_ms = timeout_ms},
                          "duplicating MPI_COMM_WORLD")
                   : ddp__err(err, st, "MPI set-up: MPI_Comm_idup failed");
    }
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    pthread_mutex_lock(&boot_mu);
    boot_users++;
    boot_groups++;
    pthread_mutex_unlock(&boot_mu);
    *out = b;
    return DDP_OK;
out_unlock:
    pthread_mutex_unlock(&boot_mu);
    return st;
}

ddp_status ddp__mpi_boot_allgather(ddp__mpi_boot *b, const void *mine, void *all, size_t len,
                                   ddp_error *err)
{
    if (len > (size_t)1 << 20)
        return ddp__err(err, DDP_ERR_INVALID, "MPI set-up: %zu bytes per rank is too many", len);
    MPI_Request req;
    int rc = MPI_Iallgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, b->comm, &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Iallgather");
    ddp_status st = ddp__mpi_poll(&req, ddp__now_ms() + b->timeout_ms);
    if (st == DDP_ERR_TIMEOUT)
        return late(err, b, "gathering every rank's host");
    return st ? ddp__err(err, st, "MPI set-up: gathering every rank's host failed") : DDP_OK;
}

ddp_status ddp__mpi_boot_bcast(ddp__mpi_boot *b, const int *ranks, int n, int me, void *buf,
                               size_t len, ddp_error *err)
{
    if (n <= 1)
        return DDP_OK;
    if (len > (size_t)1 << 20)
        return ddp__err(err, DDP_ERR_INVALID, "MPI set-up: %zu bytes is too many to share", len);
    int64_t deadline = ddp__now_ms() + b->timeout_ms;
    ddp_status st = DDP_OK;
    if (me == 0) {
        MPI_Request *reqs = calloc((size_t)n, sizeof *reqs);
        if (!reqs)
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory in MPI set-up");
        int rc = MPI_SUCCESS;
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++)
            rc = MPI_Isend(buf, (int)len, MPI_BYTE, ranks[i], TAG_BCAST, b->comm, &reqs[i - 1]);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(err, rc, "MPI_Isend");
        else if ((st = poll_all(reqs, n - 1, deadline)) == DDP_ERR_TIMEOUT)
            st = late(err, b, "sharing set-up data");
        else if (st)
            st = ddp__err(err, st, "MPI set-up: sending set-up data failed");
        free(reqs);
        return st;
    }
    MPI_Request req;
    int rc = MPI_Irecv(buf, (int)len, MPI_BYTE, ranks[0], TAG_BCAST, b->comm, &req);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Irecv");
    if ((st = ddp__mpi_poll(&req, deadline)) == DDP_ERR_TIMEOUT)
        return late(err, b, "waiting for set-up data from the first member");
    return st ? ddp__err(err, st, "MPI set-up: receiving set-up data failed") : DDP_OK;
}

ddp_status ddp__mpi_boot_barrier(ddp__mpi_boot *b, const int *ranks, int n, int me, ddp_error *err)
{
    if (n <= 1)
        return DDP_OK;
    /* Everyone tells member 0 it arrived; member 0 then releases everyone. */
    int64_t deadline = ddp__now_ms() + b->timeout_ms;
    char none = 0;
    ddp_status st = DDP_OK;
    int rc;
    if (me == 0) {
        MPI_Request *reqs = calloc((size_t)n, sizeof *reqs);
        char *sink = calloc((size_t)n, 1);
        if (!reqs || !sink) {
            free(reqs);
            free(sink);
            return ddp__err(err, DDP_ERR_NOMEM, "out of memory in MPI set-up");
        }
        rc = MPI_SUCCESS;
        for (int i = 1; i < n && rc == MPI_SUCCESS; i++)
            rc = MPI_Irecv(&sink[i], 1, MPI_BYTE, ranks[i], TAG_ARRIVE, b->comm, &reqs[i - 1]);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(err, rc, "MPI_Irecv");
        else
            st = poll_all(reqs, n - 1, deadline);
        for (int i = 1; i < n && st == DDP_OK; i++)
            if ((rc = MPI_Isend(&none, 1, MPI_BYTE, ranks[i], TAG_RELEASE, b->comm,
                                &reqs[i - 1])) != MPI_SUCCESS)
                st = mpi_fail(err, rc, "MPI_Isend");
        if (st == DDP_OK)
            st = poll_all(reqs, n - 1, deadline);
        free(reqs);
        free(sink);
        if (st == DDP_ERR_TIMEOUT)
            return late(err, b, "a set-up barrier");
        if (st == DDP_ERR_NETWORK && rc == MPI_SUCCESS)
            return ddp__err(err, st, "MPI set-up: a barrier failed");
        return st;
    }
    MPI_Request reqs[2];
    char got = 0;
    if ((rc = MPI_Isend(&none, 1, MPI_BYTE, ranks[0], TAG_ARRIVE, b->comm, &reqs[0])) !=
            MPI_SUCCESS ||
        (rc = MPI_Irecv(&got, 1, MPI_BYTE, ranks[0], TAG_RELEASE, b->comm, &reqs[1])) !=
            MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Isend/MPI_Irecv");
    if ((st = poll_all(reqs, 2, deadline)) == DDP_ERR_TIMEOUT)
        return late(err, b, "a set-up barrier");
    return st ? ddp__err(err, st, "MPI set-up: barrier failed") : DDP_OK;
}

ddp_status ddp__mpi_boot_comm_of(ddp__mpi_boot *b, const int *ranks, int n, int me, MPI_Comm *out,
                                 ddp_error *err)
{
    ddp_status st = ddp__mpi_boot_barrier(b, ranks, n, me, err);
    if (st)
        return st;
    MPI_Group world, sub;
    MPI_Comm_group(b->comm, &world);
    int rc = MPI_Group_incl(world, n, ranks, &sub);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Group_incl");
    /* Blocking, but every member has passed the barrier above and is on its way here. */
    rc = MPI_Comm_create_group(b->comm, sub, TAG_COMM, out);
    MPI_Group_free(&sub);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, rc, "MPI_Comm_create_group");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return DDP_OK;
}

void ddp__mpi_boot_close(ddp__mpi_boot *b, const char *failed)
{
    if (!b)
        return;
    pthread_mutex_lock(&boot_mu);
    bool last = --boot_users == 0;
    bool ours = boot_we_init;
    pthread_mutex_unlock(&boot_mu);
    if (failed && ours) {
        /* A collective that never completed cannot be cancelled, and MPI_Finalize would wait for
         * peers that may never come: the last resort is to end the job. The error has been
         * returned (and normally printed) before the group is destroyed. */
        fprintf(stderr,
                "ddp: rank %d: %s; ending the MPI job (MPI_Abort): MPI can neither cancel a "
                "collective nor finalise without every rank\n",
                b->rank, failed);
        fflush(stderr);
        /* Peers whose deadline passes at about the same moment get a second to say so too,
         * before mpirun ends them. */
        struct timespec grace = {1, 0};
        while (nanosleep(&grace, &grace) != 0)
            ;
        MPI_Abort(b->comm, 1);
    }
    if (!failed && last && ours) {
        /* Finalising waits for every rank: do it only once they are all here (bounded). */
        MPI_Request req;
        ddp_status st = MPI_Ibarrier(b->comm, &req) == MPI_SUCCESS
                            ? ddp__mpi_poll(&req, ddp__now_ms() + b->timeout_ms)
                            : DDP_ERR_NETWORK;
        if (st != DDP_OK) {
            fprintf(stderr,
                    "ddp: rank %d: not every rank reached the end of the group within %d s; "
                    "ending the MPI job (MPI_Abort)\n",
                    b->rank, b->timeout_ms / 1000);
            fflush(stderr);
            MPI_Abort(b->comm, 1);
        }
        MPI_Comm_free(&b->comm);
        MPI_Finalize();
    } else if (!failed) {
        MPI_Comm_free(&b->comm);
    }
    free(b);
}
