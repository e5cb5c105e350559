/*
 * test_backends.c — the backend registry (src/group/backends.c): where the ranks run as the core
 * sees it, what auto picks for each placement, and the errors for a name that is unknown or
 * cannot run the group. Nothing here creates a backend (usable() looks only at the placement)
 * except one-rank shm groups (a run id with '/', what a world of one costs).
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmocka.h>

#include "group/group_int.h"
#include "util/util.h"

/* Stand-ins for how set-up meets: usable() only asks whether there is a store or MPI. */
static int fake;
#define SOME_STORE ((ddp_store *)&fake)
#define SOME_MPI ((struct ddp__mpi_boot *)&fake)

/* A setup of n members on the hosts named in hosts (one string per member), through the store. */
static ddp__setup placed(const char *const *hosts, int n)
{
    ddp__setup s;
    memset(&s, 0, sizeof s);
    s.m.n = n;
    s.hosts = hosts;
    s.store = SOME_STORE;
    ddp__setup_place(&s);
    return s;
}

static bool via_mpi; /* pick() sets up through MPI (mpirun) instead of the store */

static const char *pick(const char *want, const char *const *hosts, int n, ddp_error *err)
{
    ddp__setup s = placed(hosts, n);
    if (via_mpi) {
        s.store = NULL;
        s.mpi = SOME_MPI;
    }
    const ddp__backend *named = NULL, *chosen = NULL;
    if (ddp__backend_lookup(want, &named, err) != DDP_OK)
        return NULL;
    if (ddp__backend_choose(named, &s, &chosen, err) != DDP_OK)
        return NULL;
    return chosen->name;
}

static void placement(void **state)
{
    (void)state;
    static const char *const one[] = {"a", "a", "a"};
    static const char *const two_by_two[] = {"a", "a", "b", "b"};
    static const char *const uneven[] = {"a", "a", "b"};
    static const char *const interleaved[] = {"a", "b", "a", "b"};
    static const char *const split[] = {"a", "a", "b", "b", "a", "a"}; /* a in two blocks */
    static const char *const singles[] = {"a", "b", "c"};
    ddp__setup s = placed(one, 3);
    assert_int_equal(s.nhosts, 1);
    assert_int_equal(s.per_host, 3);
    s = placed(two_by_two, 4);
    assert_int_equal(s.nhosts, 2);
    assert_int_equal(s.per_host, 2);
    s = placed(uneven, 3);
    assert_int_equal(s.nhosts, 2);
    assert_int_equal(s.per_host, 0);
    s = placed(interleaved, 4);
    assert_int_equal(s.nhosts, 2);
    assert_int_equal(s.per_host, 0);
    s = placed(split, 6);
    assert_int_equal(s.nhosts, 2);
    assert_int_equal(s.per_host, 0);
    s = placed(singles, 3);
    assert_int_equal(s.nhosts, 3);
    assert_int_equal(s.per_host, 1);
}

static void auto_choice(void **state)
{
    (void)state;
    static const char *const one[] = {"a", "a"};
    static const char *const two_by_two[] = {"a", "a", "b", "b"};
    static const char *const uneven[] = {"a", "a", "b"};
    static const char *const interleaved[] = {"a", "b", "a", "b"};
    ddp_error err = {0};
    assert_string_equal(pick(NULL, one, 2, &err), "shm");
    assert_string_equal(pick("", one, 2, &err), "shm");
    assert_string_equal(pick("auto", one, 1, &err), "shm");
    assert_string_equal(pick("auto", two_by_two, 4, &err), "shm+tcp");
    assert_string_equal(pick("auto", uneven, 3, &err), "tcp");
    assert_string_equal(pick("auto", interleaved, 4, &err), "tcp");
}

static void named_choice(void **state)
{
    (void)state;
    static const char *const one[] = {"a", "a"};
    static const char *const two_by_two[] = {"a", "a", "b", "b"};
    static const char *const uneven[] = {"a", "a", "b"};
    ddp_error err = {0};
    assert_string_equal(pick("tcp", one, 2, &err), "tcp");
    assert_string_equal(pick("tcp", two_by_two, 4, &err), "tcp");
    assert_string_equal(pick("shm", one, 2, &err), "shm");
    assert_string_equal(pick("shm+tcp", two_by_two, 4, &err), "shm+tcp");

    assert_null(pick("shm", two_by_two, 4, &err));
    assert_int_equal(err.status, DDP_ERR_INVALID);
    assert_string_equal(err.msg, "backend 'shm' needs every rank on one host, but ranks run on "
                                 "'a' and others; use backend 'auto' or 'tcp'");
    assert_null(pick("shm+tcp", one, 2, &err));
    assert_non_null(strstr(err.msg, "backend 'shm+tcp' needs ranks on more than one host"));
    assert_null(pick("shm+tcp", uneven, 3, &err));
    assert_non_null(strstr(err.msg, "the same number of ranks on every host"));

    assert_null(pick("gloo", one, 2, &err));
    assert_int_equal(err.status, DDP_ERR_INVALID);
#ifdef DDP_HAVE_MPI
    assert_string_equal(
        err.msg, "unknown backend 'gloo': use auto, nccl, cuda-ipc, cuda-staged, shm, shm+mpi, "
                 "shm+tcp, mpi or tcp");
    /* Under ddprun (the store) the MPI backends say what they need. */
    assert_null(pick("mpi", one, 2, &err));
    assert_non_null(strstr(err.msg, "backend 'mpi' needs processes started by an MPI launcher"));
    assert_null(pick("shm+mpi", two_by_two, 4, &err));
    assert_non_null(strstr(err.msg, "backend 'shm+mpi' needs processes started by an MPI"));
#else
    assert_string_equal(
        err.msg,
        "unknown backend 'gloo': use auto, nccl, cuda-ipc, cuda-staged, shm, shm+tcp or tcp");
#endif
    /* GPU backends for host buffers, and host backends for GPU buffers, say so. */
    assert_null(pick("nccl", one, 2, &err));
    assert_int_equal(err.status, DDP_ERR_INVALID);
    assert_string_equal(err.msg, "backend 'nccl' moves GPU buffers, but this group's are in host "
                                 "memory; use backend 'auto', 'shm', 'shm+tcp' or 'tcp'");
    ddp__setup s = placed(one, 2);
    static const int gpus2[] = {2, 2};
    s.device = DDP_DEVICE_CUDA;
    s.gpus = gpus2;
    s.cuda_built = s.nccl_built = true;
    const ddp__backend *named = NULL, *chosen = NULL;
    assert_int_equal(ddp__backend_lookup("shm", &named, &err), DDP_OK);
    assert_int_equal(ddp__backend_choose(named, &s, &chosen, &err), DDP_ERR_INVALID);
    assert_string_equal(err.msg, "backend 'shm' moves host buffers, but this group's are in GPU "
                                 "memory; use backend 'auto', 'nccl', 'cuda-ipc' or 'cuda-staged'");
    /* cuda-staged may be named where nccl would do; nccl not where ranks share a GPU. */
    assert_int_equal(ddp__backend_lookup("cuda-staged", &named, &err), DDP_OK);
    assert_int_equal(ddp__backend_choose(named, &s, &chosen, &err), DDP_OK);
    assert_string_equal(chosen->name, "cuda-staged");
    static const int gpus1[] = {1, 1};
    s.gpus = gpus1;
    assert_int_equal(ddp__backend_lookup("nccl", &named, &err), DDP_OK);
    assert_int_equal(ddp__backend_choose(named, &s, &chosen, &err), DDP_ERR_INVALID);
    if (ddp__nccl_built) {
        assert_non_null(strstr(err.msg, "backend 'nccl' cannot run this group: ranks share a GPU "
                                        "(2 ranks on 1 GPU of host 'a'"));
        assert_non_null(strstr(err.msg, "use backend 'auto', 'cuda-ipc' or 'cuda-staged'"));
    } else { /* the stub entry of a build without NCCL */
        assert_non_null(strstr(err.msg, "backend 'nccl' is not in this libddp (built with "
                                        "DDP_NCCL=OFF"));
    }
}

/* Set up through MPI (mpirun, no store): auto takes shm on one host, shm+mpi across regular
 * hosts, mpi otherwise; the store's backends say they need a store. */
static void mpi_choice(void **state)
{
    (void)state;
#ifdef DDP_HAVE_MPI
    static const char *const one[] = {"a", "a"};
    static const char *const two_by_two[] = {"a", "a", "b", "b"};
    static const char *const uneven[] = {"a", "a", "b"};
    static const char *const interleaved[] = {"a", "b", "a", "b"};
    ddp_error err = {0};
    via_mpi = true;
    assert_string_equal(pick("auto", one, 2, &err), "shm");
    assert_string_equal(pick("auto", two_by_two, 4, &err), "shm+mpi");
    assert_string_equal(pick("auto", uneven, 3, &err), "mpi");
    assert_string_equal(pick("auto", interleaved, 4, &err), "mpi");
    assert_string_equal(pick("mpi", one, 2, &err), "mpi");
    assert_string_equal(pick("mpi", two_by_two, 4, &err), "mpi");
    assert_string_equal(pick("shm", one, 2, &err), "shm");
    assert_null(pick("tcp", one, 2, &err));
    assert_non_null(strstr(err.msg, "backend 'tcp' needs the rendezvous store"));
    assert_null(pick("shm+tcp", two_by_two, 4, &err));
    assert_non_null(strstr(err.msg, "backend 'shm+tcp' needs the rendezvous store"));
    assert_null(pick("shm+mpi", uneven, 3, &err));
    assert_non_null(strstr(err.msg, "the same number of ranks on every host"));
    via_mpi = false;
#else
    skip();
#endif
}

/* ---- GPU groups: the choice over host layouts ------------------------------------------------ */

/* The pick for hosts × (ranks, gpus) given as pairs; why into why. */
static ddp__gpu_pick layout(int nhosts, const int *ranks, const int *gpus, bool nccl, char *why)
{
    static const char *const names[] = {"h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"};
    ddp__gpu_layout l = {.device = DDP_DEVICE_CUDA,
                         .nhosts = nhosts,
                         .ranks_per_host = ranks,
                         .gpus_per_host = gpus,
                         .host = names,
                         .cuda_built = true,
                         .nccl_built = nccl};
    return ddp__gpu_choice(&l, why, DDP_ERRMSG_MAX);
}

static void gpu_layouts(void **state)
{
    (void)state;
    char why[DDP_ERRMSG_MAX];
    /* 1 host × 1 GPU × 1 rank: nccl (world 1 over NCCL). */
    assert_int_equal(layout(1, (int[]){1}, (int[]){1}, true, why), DDP__PICK_NCCL);
    assert_string_equal(why, "every rank has a GPU of its own (1 rank on 1 GPU, 1 host)");
    /* 1 GPU × 2 ranks of one host: shared, over CUDA IPC. */
    assert_int_equal(layout(1, (int[]){2}, (int[]){1}, true, why), DDP__PICK_IPC);
    assert_string_equal(why, "ranks share a GPU (2 ranks on 1 GPU of host 'h0'; NCCL refuses two "
                             "ranks on one GPU): peers' device memory mapped through CUDA IPC");
    /* … and without NCCL, even one rank: the one GPU of the one host. */
    assert_int_equal(layout(1, (int[]){1}, (int[]){1}, false, why), DDP__PICK_IPC);
    assert_string_equal(why, "this libddp has no NCCL (DDP_NCCL=OFF): peers' device memory "
                             "mapped through CUDA IPC");
    /* Two hosts sharing their GPUs: staged (IPC maps memory within one host). */
    assert_int_equal(layout(2, (int[]){2, 2}, (int[]){1, 1}, true, why), DDP__PICK_STAGED);
    assert_non_null(strstr(why, "): staged through host memory"));
    /* 2 hosts × 4 GPUs × 4 ranks: nccl. */
    assert_int_equal(layout(2, (int[]){4, 4}, (int[]){4, 4}, true, why), DDP__PICK_NCCL);
    assert_string_equal(why, "every rank has a GPU of its own (8 ranks on 8 GPUs, 2 hosts)");
    /* 8 ranks on 4 GPUs of one host: shared, staged (IPC across GPUs needs peer access). */
    assert_int_equal(layout(1, (int[]){8}, (int[]){4}, true, why), DDP__PICK_STAGED);
    assert_non_null(strstr(why, "8 ranks on 4 GPUs of host 'h0'"));
    /* Fewer ranks than GPUs: each still has its own. */
    assert_int_equal(layout(1, (int[]){2}, (int[]){8}, true, why), DDP__PICK_NCCL);
    /* One host of several oversubscribed: shared for all (one backend per group). */
    assert_int_equal(layout(3, (int[]){2, 2, 2}, (int[]){2, 1, 2}, true, why), DDP__PICK_STAGED);
    assert_non_null(strstr(why, "2 ranks on 1 GPU of host 'h1'"));
    /* Uneven hosts, each rank with its own GPU: nccl does not need the same count per host. */
    assert_int_equal(layout(2, (int[]){1, 3}, (int[]){1, 4}, true, why), DDP__PICK_NCCL);
    /* No NCCL in this build: staged even with a GPU each. */
    assert_int_equal(layout(2, (int[]){4, 4}, (int[]){4, 4}, false, why), DDP__PICK_STAGED);
    assert_string_equal(why, "this libddp has no NCCL (DDP_NCCL=OFF): staged through host memory");
    /* A host with no GPU: nothing can run it, and why says which. */
    assert_int_equal(layout(2, (int[]){1, 1}, (int[]){1, 0}, true, why), DDP__PICK_NONE);
    assert_string_equal(why, "host 'h1' has no visible GPU for its 1 rank");
    /* No CUDA in this build. */
    ddp__gpu_layout l = {.device = DDP_DEVICE_CUDA,
                         .nhosts = 1,
                         .ranks_per_host = (int[]){1},
                         .gpus_per_host = (int[]){1}};
    assert_int_equal(ddp__gpu_choice(&l, why, sizeof why), DDP__PICK_NONE);
    assert_non_null(strstr(why, "built with CUDA"));
    /* Host buffers: the CPU backends, whatever the GPUs. */
    l.device = DDP_DEVICE_CPU;
    assert_int_equal(ddp__gpu_choice(&l, why, sizeof why), DDP__PICK_HOST);
}

/* The choice through the registry (auto), from per-member host ids and GPU counts. */
static const char *auto_gpu(const char *const *hosts, const int *gpus, int n, bool nccl, char *why)
{
    ddp__setup s = placed(hosts, n);
    s.device = DDP_DEVICE_CUDA;
    s.gpus = gpus;
    s.cuda_built = true;
    s.nccl_built = nccl;
    const ddp__backend *chosen = NULL;
    ddp_error err = {0};
    if (ddp__backend_choose(NULL, &s, &chosen, &err) != DDP_OK) {
        ddp__fmt(why, DDP_ERRMSG_MAX, "%s", err.msg);
        return NULL;
    }
    ddp__backend_reason(chosen, false, &s, why, DDP_ERRMSG_MAX);
    return chosen->name;
}

static void gpu_auto(void **state)
{
    (void)state;
    char why[DDP_ERRMSG_MAX];
    static const char *const one[] = {"a", "a", "a", "a", "a", "a", "a", "a"};
    static const char *const two[] = {"a", "a", "a", "a", "b", "b", "b", "b"};
    static const int g1[] = {1, 1, 1, 1, 1, 1, 1, 1}, g4[] = {4, 4, 4, 4, 4, 4, 4, 4};
    /* nccl is the real backend only in a DDP_NCCL build; the stub is never usable, and auto
     * then takes the next GPU backend that can run the group: cuda-ipc on one host, cuda-staged
     * across hosts. */
    const char *want_nccl = ddp__nccl_built ? "nccl" : "cuda-staged";
    assert_string_equal(auto_gpu(one, g1, 1, true, why), ddp__nccl_built ? "nccl" : "cuda-ipc");
    assert_string_equal(auto_gpu(one, g1, 2, true, why), "cuda-ipc");
    assert_non_null(strstr(why, "ranks share a GPU (2 ranks on 1 GPU of host 'a'"));
    assert_non_null(strstr(why, "mapped through CUDA IPC"));
    assert_string_equal(auto_gpu(two, g1, 8, true, why), "cuda-staged"); /* 2 hosts */
    assert_string_equal(auto_gpu(one, g1, 1, false, why), "cuda-ipc");   /* no NCCL, 1 GPU */
    assert_string_equal(auto_gpu(two, g4, 8, true, why), want_nccl);
    assert_string_equal(auto_gpu(one, g4, 8, true, why), "cuda-staged");
    assert_non_null(strstr(why, "8 ranks on 4 GPUs"));
    /* cuda-ipc named: refused across hosts, saying what to use; fine on one host. */
    ddp__setup gs = placed(two, 8);
    gs.device = DDP_DEVICE_CUDA;
    gs.gpus = g1;
    gs.cuda_built = true;
    const ddp__backend *named = NULL, *got = NULL;
    ddp_error gerr = {0};
    assert_int_equal(ddp__backend_lookup("cuda-ipc", &named, &gerr), DDP_OK);
    assert_int_equal(ddp__backend_choose(named, &gs, &got, &gerr), DDP_ERR_INVALID);
    assert_string_equal(gerr.msg, "backend 'cuda-ipc' cannot run this group: its 8 ranks are on "
                                  "2 hosts, and CUDA IPC maps device memory within one host "
                                  "only; use backend 'auto', 'cuda-staged' or 'nccl'");
    assert_null(strchr(gerr.msg, '\n'));
    gs = placed(one, 8);
    gs.device = DDP_DEVICE_CUDA;
    gs.gpus = g4;
    gs.cuda_built = true;
    assert_int_equal(ddp__backend_choose(named, &gs, &got, &gerr), DDP_OK); /* several GPUs */
    assert_string_equal(got->name, "cuda-ipc");
    static const int none[] = {1, 1, 1, 1, 0, 0, 0, 0};
    assert_null(auto_gpu(two, none, 8, true, why));
    assert_non_null(strstr(why, "host 'b' has no visible GPU for its 4 ranks"));
    /* Host buffers: as before, and the reason for the DDP line. */
    ddp__setup s = placed(two, 8);
    const ddp__backend *chosen = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp__backend_choose(NULL, &s, &chosen, &err), DDP_OK);
    assert_string_equal(chosen->name, "shm+tcp");
    ddp__backend_reason(chosen, false, &s, why, sizeof why);
    assert_string_equal(why, "2 hosts × 4 ranks: shm within each, tcp among them");
    s = placed(one, 3);
    assert_int_equal(ddp__backend_choose(NULL, &s, &chosen, &err), DDP_OK);
    ddp__backend_reason(chosen, false, &s, why, sizeof why);
    assert_string_equal(why, "every rank on one host");
}

/* torchrun's binding: LOCAL_RANK's GPU, wrapping when ranks outnumber GPUs. */
static void gpu_binding(void **state)
{
    (void)state;
    assert_int_equal(ddp__gpu_for_local_rank(0, 1), 0);
    assert_int_equal(ddp__gpu_for_local_rank(3, 4), 3);
    assert_int_equal(ddp__gpu_for_local_rank(5, 4), 1);
    assert_int_equal(ddp__gpu_for_local_rank(1, 1), 0);
    assert_int_equal(ddp__gpu_for_local_rank(0, 0), -1);
    assert_int_equal(ddp__gpu_for_local_rank(-1, 2), -1);
}

/* The public calls on a NULL group: errors or neutral answers, never a crash (every collective
 * dereferenced the group before checking it: SIGSEGV). */
static void null_group(void **state)
{
    (void)state;
    float x[4] = {1, 2, 3, 4};
    ddp_work *w = NULL;
    assert_int_equal(ddp_allreduce(NULL, x, x, 4, DDP_FLOAT32, DDP_SUM), DDP_ERR_INVALID);
    assert_int_equal(ddp_broadcast(NULL, x, 4, DDP_FLOAT32, 0), DDP_ERR_INVALID);
    assert_int_equal(ddp_allgather(NULL, x, x, 1, DDP_FLOAT32), DDP_ERR_INVALID);
    assert_int_equal(ddp_reduce_scatter(NULL, x, x, 1, DDP_FLOAT32, DDP_SUM), DDP_ERR_INVALID);
    assert_int_equal(ddp_barrier(NULL), DDP_ERR_INVALID);
    assert_int_equal(ddp_allreduce_async(NULL, x, x, 4, DDP_FLOAT32, DDP_SUM, &w), DDP_ERR_INVALID);
    assert_int_equal(ddp_broadcast_async(NULL, x, 4, DDP_FLOAT32, 0, &w), DDP_ERR_INVALID);
    assert_int_equal(ddp_allgather_async(NULL, x, x, 1, DDP_FLOAT32, &w), DDP_ERR_INVALID);
    assert_int_equal(ddp_reduce_scatter_async(NULL, x, x, 1, DDP_FLOAT32, DDP_SUM, &w),
                     DDP_ERR_INVALID);
    assert_int_equal(ddp_barrier_async(NULL, &w), DDP_ERR_INVALID);
    assert_null(w);
    assert_int_equal(ddp_work_wait(NULL), DDP_ERR_INVALID);
    ddp_work_free(NULL);
    ddp_group_abort(NULL);
    ddp_group_destroy(NULL);
    assert_int_equal(ddp_group_rank(NULL), -1);
    assert_null(ddp_group_alloc(NULL, 16));
}

/* A world filled by hand with a rank outside it: refused at once (rank 5 of 2 waited 5 minutes in
 * set-up for peers, then timed out blaming the store). */
static void inconsistent_world(void **state)
{
    (void)state;
    static const int bad[][2] = {{5, 2}, {-1, 2}, {0, 0}, {2, 2}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ddp_world w;
        memset(&w, 0, sizeof w);
        w.rank = bad[i][0];
        w.world_size = bad[i][1];
        w.local_world_size = 1;
        ddp_group_opts o = DDP_GROUP_OPTS_INIT;
        o.world = &w;
        o.timeout_ms = 60000;
        ddp_group *g = (ddp_group *)0x1;
        ddp_error err = {0};
        int64_t t0 = ddp__now_ms();
        assert_int_equal(ddp_group_init(&o, &g, &err), DDP_ERR_INVALID);
        assert_true(ddp__now_ms() - t0 < 5000);
        assert_ptr_equal(g, (ddp_group *)0x1);
        if (!strstr(err.msg, "need 0 ≤ rank < world_size"))
            fail_msg("rank %d of %d: '%s'", bad[i][0], bad[i][1], err.msg);
    }
}

/* A run id with '/' (torchrun's --rdzv_id is free text) names no shared memory as it is: the
 * group failed with "cannot create shared memory '/ddp-a/b-…': Invalid argument". Two ranks in
 * forked processes, as a group of one makes no segment (one_rank_cheap). */
static int slash_rank(int rank, int port)
{
    char p[16], r[16];
    snprintf(p, sizeof p, "%d", port);
    snprintf(r, sizeof r, "%d", rank);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", p, 1);
    setenv("TORCHELASTIC_RUN_ID", "job/a/../b", 1);
    setenv("DDP_STORE_TOKEN", "test-backends-slash", 1);
    ddp_world w;
    ddp_error err = {0};
    if (ddp_world_from_env(&w, &err) != DDP_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 2;
    }
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = &w;
    o.backend = "shm";
    o.timeout_ms = 20000;
    ddp_group *g = NULL;
    if (ddp_group_init(&o, &g, &err) != DDP_OK) {
        fprintf(stderr, "rank %d, run id 'job/a/../b': %s\n", rank, err.msg);
        return 3;
    }
    float x = (float)rank + 1;
    int rc = ddp_allreduce(g, &x, &x, 1, DDP_FLOAT32, DDP_SUM) == DDP_OK && x == 3.0f ? 0 : 4;
    ddp_group_destroy(g);
    return rc;
}

static void run_id_with_slash(void **state)
{
    (void)state;
    int s = socket(AF_INET, SOCK_STREAM, 0); /* a loopback port free a moment ago */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
                getsockname(s, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin_port);
    close(s);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0)
            _exit(slash_rank(r, port));
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        assert_int_equal(waitpid(pids[r], &st, 0), pids[r]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("rank %d of a group with run id 'job/a/../b' ended with status %d", r, st);
    }
}

/* Bytes of this process's address space mapped from files in /dev/shm named ddp-*: the shm
 * backend's segment (unlinked once mapped, so only /proc/self/maps still shows it). */
static size_t shm_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    size_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (strstr(line, "/dev/shm/ddp-") && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            total += hi - lo;
    }
    fclose(f);
    return total;
}

static ddp_group *one_rank_group(ddp_error *err)
{
    static ddp_world w;
    memset(&w, 0, sizeof w);
    w.world_size = 1;
    w.local_world_size = 1;
    snprintf(w.run_id, sizeof w.run_id, "%s", "one");
    ddp_group_opts o = DDP_GROUP_OPTS_INIT;
    o.world = &w;
    o.backend = "shm";
    ddp_group *g = NULL;
    return ddp_group_init(&o, &g, err) == DDP_OK ? g : NULL;
}

/* A world of one (a program run without ddprun) never communicates, yet its shm group made a
 * /dev/shm segment of 66 MiB (2 MiB of staging + the 64 MiB arena), which failed set-up under a
 * small file-size limit (ulimit -f: SIGXFSZ, or EFBIG) or a tiny /dev/shm. Now it maps nothing
 * from /dev/shm, and ddp_group_alloc still gives arena memory the reducer can lay buckets in. */
static void one_rank_cheap(void **state)
{
    (void)state;
    ddp_error err = {0};
    size_t before = shm_mapped();
    ddp_group *g = one_rank_group(&err);
    if (!g)
        fail_msg("one-rank shm group: %s", err.msg);
    size_t seg = shm_mapped() - before;
    print_message("one-rank shm group maps %zu bytes of /dev/shm\n", seg);
    if (seg != 0)
        fail_msg("a one-rank shm group maps %zu bytes (%zu MiB) of /dev/shm; expected none", seg,
                 seg >> 20);
    size_t n = (size_t)1 << 18; /* 1 MiB of floats, in the arena */
    float *a = ddp_group_alloc(g, n * sizeof *a), *b = ddp_group_alloc(g, 4096);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)i;
    assert_int_equal(ddp_allreduce(g, a, a, n, DDP_FLOAT32, DDP_AVG), DDP_OK);
    assert_true(a[12345] == 12345.0f);
    assert_int_equal(ddp_barrier(g), DDP_OK);
    assert_null(ddp_group_alloc(g, (size_t)65 << 20)); /* beyond the 64 MiB arena: NULL */
    ddp_group_free(g, a);
    ddp_group_free(g, b);
    float *c = ddp_group_alloc(g, (size_t)63 << 20); /* freed blocks merge back */
    assert_non_null(c);
    ddp_group_free(g, c);
    ddp_group_destroy(g);

    /* Under a file-size limit of 64 KiB (SIGXFSZ ignored, so that a refusal is an error
     * rather than the end of this test). */
    struct rlimit old, small = {.rlim_cur = 64 << 10, .rlim_max = 0};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small.rlim_max = old.rlim_max;
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    g = one_rank_group(&err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, oldsig);
    if (!g)
        fail_msg("one-rank shm group under ulimit -f 64: %s", err.msg);
    ddp_group_destroy(g);
}

/* A buffer not aligned to its elements is refused with the reason, and the group stays usable
 * (the kernels stored floats at malloc()+1: undefined behaviour, UBSan's "misaligned address"). */
static void misaligned_buffers(void **state)
{
    (void)state;
    ddp_error err = {0};
    ddp_group *g = one_rank_group(&err);
    if (!g)
        fail_msg("one-rank shm group: %s", err.msg);
    double store[9] = {0};
    char *raw = (char *)store;
    float *odd = (float *)(void *)(raw + 1), *ok = (float *)(void *)(raw + 4);
    assert_int_equal(ddp_allreduce(g, odd, odd, 4, DDP_FLOAT32, DDP_SUM), DDP_ERR_INVALID);
    assert_non_null(strstr(ddp_group_last_error(g),
                           "allreduce: a buffer is not aligned to its float32 elements (4 bytes"));
    assert_int_equal(ddp_broadcast(g, raw + 2, 3, DDP_FLOAT64, 0), DDP_ERR_INVALID);
    assert_int_equal(ddp_allreduce(g, ok, ok, 4, DDP_FLOAT32, DDP_SUM), DDP_OK);
    assert_int_equal(ddp_allreduce(g, raw + 1, raw + 1, 4, DDP_UINT8, DDP_SUM), DDP_OK);
    assert_int_equal(ddp_group_error(g), DDP_OK);
    ddp_group_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(null_group),         cmocka_unit_test(inconsistent_world),
        cmocka_unit_test(misaligned_buffers), cmocka_unit_test(run_id_with_slash),
        cmocka_unit_test(placement),          cmocka_unit_test(auto_choice),
        cmocka_unit_test(named_choice),       cmocka_unit_test(mpi_choice),
        cmocka_unit_test(gpu_layouts),        cmocka_unit_test(gpu_auto),
        cmocka_unit_test(gpu_binding),        cmocka_unit_test(one_rank_cheap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
