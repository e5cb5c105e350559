/*
 * test_backends.c — the backend registry (src/group/backends.c): where the ranks run as the core
 * sees it, what auto picks for each placement, and the errors for a name that is unknown or
 * cannot run the group. Nothing here creates a backend: usable() looks only at the placement.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "group/group_int.h"

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

    assert_null(pick("nccl", one, 2, &err));
    assert_int_equal(err.status, DDP_ERR_INVALID);
#ifdef DDP_HAVE_MPI
    assert_string_equal(err.msg,
                        "unknown backend 'nccl': use auto, shm, shm+mpi, shm+tcp, mpi or tcp");
    /* Under ddprun (the store) the MPI backends say what they need. */
    assert_null(pick("mpi", one, 2, &err));
    assert_non_null(strstr(err.msg, "backend 'mpi' needs processes started by an MPI launcher"));
    assert_null(pick("shm+mpi", two_by_two, 4, &err));
    assert_non_null(strstr(err.msg, "backend 'shm+mpi' needs processes started by an MPI"));
#else
    assert_string_equal(err.msg, "unknown backend 'nccl': use auto, shm, shm+tcp or tcp");
#endif
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(placement),
        cmocka_unit_test(auto_choice),
        cmocka_unit_test(named_choice),
        cmocka_unit_test(mpi_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
