/*
 * test_world.c — the environment as the library reads it: a world of one without RANK,
 * torchrun's and ddprun's variables, clear errors for inconsistent environments, the DDP_*
 * settings, and the list of variables ddprun sets.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <sys/socket.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "util/hostlist.h"

int openblas_get_num_threads(void); /* OpenBLAS's, which libddp links */

static const char *const vars[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "DDP_RUN_ID",
    "TORCHELASTIC_RUN_ID",
    "DDP_STORE_TOKEN",
    "DDP_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT",
    "DDP_MAX_RESTARTS",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "DDP_AGENT_STORE",
    "DDP_STORE_PORT",
    "DDP_BACKEND",
    "DDP_TIMEOUT",
    "DDP_DEBUG",
    "DDP_HOST_ID",
    "DDP_HOST_CORES",
    "DDP_SHM_FLUSH",
    "DDP_OVERLAP",
    "DDP_MPI_MODE",
    "DDP_LOCAL_ADDR",
    "DDP_DATA_CACHE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_NODELIST",
    "SLURMD_NODENAME",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "DDP_SHM_ALGO",
    "DDP_CACHE_DIR",
    "XDG_CACHE_HOME", /* the cache directory's defaults */
    "HOME",
    NULL,
};

static int clear_env(void **state)
{
    (void)state;
    for (int i = 0; vars[i]; i++)
        unsetenv(vars[i]);
    return 0;
}

static void world_of_one(void **state)
{
    (void)state;
    ddp_world w;
    ddp_error err = {0};
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_OK);
    assert_false(w.launched);
    assert_int_equal(w.rank, 0);
    assert_int_equal(w.world_size, 1);
    assert_int_equal(w.local_rank, 0);
    assert_int_equal(w.local_world_size, 1);
    assert_int_equal(w.node_rank, 0);
    assert_int_equal(w.master_port, 29500);
    assert_string_equal(w.master_addr, "127.0.0.1");
    assert_string_equal(w.run_id, "none");
    assert_false(w.agent_store);
    assert_int_equal(w.launcher, DDP_LAUNCHER_NONE);
    assert_false(w.master_known);
    /* No setting is set: every module takes its default. */
    ddp_settings none;
    memset(&none, 0, sizeof none);
    assert_memory_equal(&w.settings, &none, sizeof none);
}

static void full_contract(void **state)
{
    (void)state;
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("GROUP_RANK", "1", 1);
    setenv("MASTER_ADDR", "10.1.2.3", 1);
    setenv("MASTER_PORT", "1234", 1);
    setenv("DDP_RUN_ID", "job7", 1);
    setenv("DDP_STORE_TOKEN", "secret", 1);
    setenv("DDP_RESTART_COUNT", "2", 1);
    setenv("DDP_MAX_RESTARTS", "3", 1);
    setenv("DDP_AGENT_STORE", "1", 1);
    ddp_world w;
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_true(w.launched);
    assert_true(w.agent_store);
    assert_int_equal(w.rank, 5);
    assert_int_equal(w.world_size, 8);
    assert_int_equal(w.local_rank, 1);
    assert_int_equal(w.local_world_size, 4);
    assert_int_equal(w.node_rank, 1);
    assert_string_equal(w.master_addr, "10.1.2.3");
    assert_int_equal(w.master_port, 1234);
    assert_string_equal(w.run_id, "job7");
    assert_string_equal(w.store_token, "secret");
    assert_int_equal(w.restart_count, 2);
    assert_int_equal(w.max_restarts, 3);
}

/* ddprun's store on DDP_STORE_PORT; MASTER_PORT is then a port left to a program's own store
 * (PyTorch's), which ddpc does not use. Read only with DDP_AGENT_STORE=1, and checked. */
static void store_port_beside_master_port(void **state)
{
    (void)state;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("DDP_RUN_ID", "job7", 1);
    setenv("MASTER_PORT", "1234", 1);
    setenv("DDP_STORE_PORT", "4321", 1);
    ddp_world w;
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_false(w.agent_store);
    assert_int_equal(w.master_port, 1234); /* no agent store: a stale DDP_STORE_PORT is ignored */
    setenv("DDP_AGENT_STORE", "1", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_true(w.agent_store);
    assert_int_equal(w.master_port, 4321);
    unsetenv("DDP_STORE_PORT"); /* an older launcher: MASTER_PORT is the store's */
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.master_port, 1234);
    setenv("DDP_STORE_PORT", "70000", 1);
    ddp_error err = {0};
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_STORE_PORT='70000'"));
}

static void torchrun_names(void **state)
{
    (void)state;
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "tr", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    setenv("TORCHELASTIC_MAX_RESTARTS", "4", 1);
    ddp_world w;
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.run_id, "tr");
    assert_int_equal(w.restart_count, 1);
    assert_int_equal(w.max_restarts, 4);
    /* Without LOCAL_*, a by-hand start is one node holding every rank; rank 0 hosts the store. */
    assert_int_equal(w.local_world_size, 2);
    assert_false(w.agent_store);
}

static void expect_invalid(const char *needle);

/* torchrun's static rendezvous (TORCHELASTIC_USE_AGENT_STORE=True) holds MASTER_PORT with its
 * own TCPStore: ddpc's store goes on the next port. Not under ddprun, nor with False. */
static void torchrun_agent_store(void **state)
{
    (void)state;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "tr", 1);
    setenv("MASTER_PORT", "29500", 1);
    ddp_world w;
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.master_port, 29500);
    assert_false(w.beside_torch_store);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.launcher, DDP_LAUNCHER_TORCHRUN);
    assert_int_equal(w.master_port, 29501);
    assert_true(w.beside_torch_store);
    assert_false(w.agent_store);
    setenv("MASTER_PORT", "65535", 1);
    expect_invalid("give torchrun a lower --master_port");
    /* ddprun sets False, but a True inherited beside ddprun's contract changes nothing. */
    setenv("MASTER_PORT", "29500", 1);
    setenv("DDP_RUN_ID", "job", 1);
    setenv("DDP_AGENT_STORE", "1", 1);
    setenv("DDP_STORE_PORT", "29600", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.master_port, 29600);
    assert_false(w.beside_torch_store);
}

static void expect_invalid(const char *needle)
{
    ddp_world w;
    memset(&w, 0x5a, sizeof w);
    ddp_world before = w;
    ddp_error err = {0};
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_int_equal(err.status, DDP_ERR_INVALID);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' does not mention '%s'", err.msg, needle);
    assert_memory_equal(&w, &before, sizeof w); /* *out untouched on failure */
}

static void rank_without_world_size(void **state)
{
    (void)state;
    setenv("RANK", "0", 1);
    expect_invalid("WORLD_SIZE");
}

static void rank_not_below_world(void **state)
{
    (void)state;
    setenv("RANK", "4", 1);
    setenv("WORLD_SIZE", "4", 1);
    expect_invalid("RANK=4");
}

static void junk_values(void **state)
{
    (void)state;
    setenv("RANK", "1x", 1);
    setenv("WORLD_SIZE", "4", 1);
    expect_invalid("RANK='1x'");
    setenv("RANK", "1", 1);
    setenv("MASTER_PORT", "70000", 1);
    expect_invalid("MASTER_PORT");
    setenv("MASTER_PORT", "29500", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    expect_invalid("LOCAL_RANK=3");
}

/* MASTER_ADDR with a port (a torchrun endpoint pasted in) is refused at once, naming it; before,
 * rank 0 failed to resolve it and the other ranks retried it for their whole connect timeout. */
static void master_addr_forms(void **state)
{
    (void)state;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    const char *with_port[] = {"127.0.0.1:29500", "node01:29500", "[::1]:29500", "localhost:"};
    for (size_t i = 0; i < sizeof with_port / sizeof *with_port; i++) {
        setenv("MASTER_ADDR", with_port[i], 1);
        expect_invalid("holds a port: put the host alone in MASTER_ADDR and the port in "
                       "MASTER_PORT");
    }
    const char *bad[] = {"[::1", "::1]", "[]", "[::1]x", "node01 ", "node 01"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("MASTER_ADDR", bad[i], 1);
        expect_invalid("MASTER_ADDR='");
    }
    const char *good[][2] = {{"::1", "::1"},
                             {"[::1]", "::1"},
                             {"[fe80::1%lo]", "fe80::1%lo"},
                             {"node01.cluster", "node01.cluster"},
                             {"10.0.0.1", "10.0.0.1"}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        setenv("MASTER_ADDR", good[i][0], 1);
        ddp_world w;
        ddp_error err = {0};
        assert_int_equal(ddp_world_from_env(&w, &err), DDP_OK);
        assert_string_equal(w.master_addr, good[i][1]);
        assert_true(w.master_known);
    }
}

static void settings(void **state)
{
    (void)state;
    setenv("DDP_BACKEND", "tcp", 1);
    setenv("DDP_TIMEOUT", "3", 1);
    setenv("DDP_DEBUG", "1", 1);
    setenv("DDP_HOST_ID", "hostB", 1);
    setenv("DDP_HOST_CORES", "12", 1);
    setenv("DDP_SHM_FLUSH", "never", 1);
    setenv("DDP_OVERLAP", "async", 1);
    setenv("DDP_DATA_CACHE", "/tmp/cache dir", 1);
    setenv("DDP_SHM_ALGO", "pipelined", 1);
    setenv("DDP_CACHE_DIR", "/tmp/ddpc cache", 1);
    setenv("DDP_MPI_MODE", "nonblocking", 1);
    setenv("DDP_LOCAL_ADDR", "10.1.2.3", 1);
    ddp_world w;
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_false(w.launched); /* settings do not need a launcher */
    assert_string_equal(w.settings.backend, "tcp");
    assert_int_equal(w.settings.timeout_ms, 3000);
    assert_int_equal(w.settings.debug, 1);
    assert_string_equal(w.settings.host_id, "hostB");
    assert_int_equal(w.settings.host_cores, 12);
    assert_string_equal(w.settings.shm_flush, "never");
    assert_string_equal(w.settings.overlap, "async");
    assert_string_equal(w.settings.data_cache, "/tmp/cache dir");
    assert_string_equal(w.settings.shm_algo, "pipelined");
    assert_string_equal(w.settings.cache_dir, "/tmp/ddpc cache");
    assert_string_equal(w.settings.mpi_mode, "nonblocking");
    assert_string_equal(w.settings.local_addr, "10.1.2.3");
    /* The cache directory: DDP_CACHE_DIR ("off": none), else XDG's cache home, else ~/.cache. */
    setenv("DDP_CACHE_DIR", "off", 1);
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.settings.cache_dir, "");
    unsetenv("DDP_CACHE_DIR");
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.settings.cache_dir, "/x/cache/ddpc");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.settings.cache_dir, "/home/u/.cache/ddpc");
    unsetenv("HOME");
    /* Values are copied as given: the module that uses one checks it. */
    setenv("DDP_SHM_FLUSH", "sometimes", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.settings.shm_flush, "sometimes");
    unsetenv("DDP_SHM_FLUSH");
    /* Except DDP_OVERLAP, whose user (the reducer) took a typo for auto, silently: refused
     * when the world is read (2026-11-26); auto, async and inline are taken. */
    ddp_error err = {0};
    setenv("DDP_OVERLAP", "asynch", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_OVERLAP must be auto, async or inline, not 'asynch'"));
    static const char *const ok[] = {"auto", "async", "inline", ""};
    for (int i = 0; i < 4; i++) {
        setenv("DDP_OVERLAP", ok[i], 1);
        assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
        assert_string_equal(w.settings.overlap, ok[i]);
    }
    unsetenv("DDP_OVERLAP");
}

static void settings_numbers(void **state)
{
    (void)state;
    ddp_world w;
    /* Empty counts as not set; yes/no words for DDP_DEBUG. */
    setenv("DDP_TIMEOUT", "", 1);
    setenv("DDP_DEBUG", "yes", 1);
    setenv("DDP_HOST_CORES", "", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.settings.timeout_ms, 0);
    assert_int_equal(w.settings.debug, 1);
    assert_int_equal(w.settings.host_cores, 0);
    setenv("DDP_DEBUG", "off", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.settings.debug, 0);
    /* A malformed number is an error naming the variable, not a silent default. */
    ddp_error err = {0};
    setenv("DDP_TIMEOUT", "30m", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "environment variable DDP_TIMEOUT='30m' is not a whole "
                                    "number from 0 to 2147483 (seconds)"));
    setenv("DDP_TIMEOUT", "3", 1);
    setenv("DDP_HOST_CORES", "0", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_HOST_CORES='0'"));
    unsetenv("DDP_HOST_CORES");
    setenv("DDP_DEBUG", "maybe", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_DEBUG='maybe' is not 1/0, yes/no"));
    setenv("DDP_DEBUG", "0", 1);
    setenv("DDP_STALL_REPORT", "soon", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_STALL_REPORT='soon'"));
    setenv("DDP_STALL_REPORT", "OFF", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.settings.stall_report_ms, -1);
    unsetenv("DDP_STALL_REPORT");
    /* A timeout past what milliseconds in an int hold is refused, naming the range (it was cut
     * to it silently); the largest is taken. */
    setenv("DDP_TIMEOUT", "99999999", 1);
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "DDP_TIMEOUT='99999999' is not a whole number from 0 to "
                                    "2147483 (seconds)"));
    setenv("DDP_TIMEOUT", "2147483", 1);
    setenv("DDP_DEBUG", "7", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.settings.timeout_ms, 2147483000);
    assert_int_equal(w.settings.debug, 1);
}

static void settings_too_long(void **state)
{
    (void)state;
    char big[300];
    memset(big, 'h', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    setenv("DDP_HOST_ID", big, 1);
    expect_invalid("DDP_HOST_ID");
}

static void contract_names(void **state)
{
    (void)state;
    static const char *const names[] = {DDP_ENV_CONTRACT, NULL};
    int n = 0;
    bool rank = false, cores = false;
    for (int i = 0; names[i]; i++, n++) {
        for (int j = 0; j < i; j++)
            assert_string_not_equal(names[i], names[j]);
        rank = rank || !strcmp(names[i], "RANK");
        cores = cores || !strcmp(names[i], "DDP_HOST_CORES");
    }
    assert_true(n >= 17 && rank && cores);
    assert_true(ddp_own_cores() >= 1);
}

static void status_strings(void **state)
{
    (void)state;
    for (int s = 0; s >= -11; s--)
        assert_non_null(ddp_status_str((ddp_status)s));
    assert_string_equal(ddp_status_str(DDP_ERR_TIMEOUT), "timeout");
    assert_string_equal(ddp_status_str((ddp_status)-999), "unknown status");
}

/* ---- launchers ---------------------------------------------------------------------------- */

static ddp_world world_ok(void)
{
    ddp_world w;
    ddp_error err = {0};
    if (ddp_world_from_env(&w, &err) != DDP_OK)
        fail_msg("ddp_world_from_env failed: %s", err.msg);
    return w;
}

static void expect_invalid2(const char *a, const char *b)
{
    ddp_world w;
    ddp_error err = {0};
    assert_int_equal(ddp_world_from_env(&w, &err), DDP_ERR_INVALID);
    if (!strstr(err.msg, a) || !strstr(err.msg, b))
        fail_msg("message '%s' does not mention both '%s' and '%s'", err.msg, a, b);
}

static void set_ompi(const char *rank, const char *size, const char *lrank, const char *lsize)
{
    setenv("OMPI_COMM_WORLD_RANK", rank, 1);
    setenv("OMPI_COMM_WORLD_SIZE", size, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", lrank, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", lsize, 1);
}

/* An srun step's task: rank `rank` of the step, on node `node`. */
static void set_slurm_step(const char *rank, const char *ntasks, const char *localid,
                           const char *node)
{
    setenv("SLURM_JOB_ID", "12345", 1);
    setenv("SLURM_STEP_ID", "2", 1);
    setenv("SLURM_PROCID", rank, 1);
    setenv("SLURM_NTASKS", ntasks, 1);
    setenv("SLURM_STEP_NUM_TASKS", ntasks, 1);
    setenv("SLURM_LOCALID", localid, 1);
    setenv("SLURM_NODEID", node, 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x3),1", 1);
    setenv("SLURM_STEP_NODELIST", "node[01-03,07]", 1);
    setenv("SLURM_JOB_NODELIST", "node[01-03,07]", 1);
}

static void launcher_names(void **state)
{
    (void)state;
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_NONE), "none");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_ENV), "env");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_DDPRUN), "ddprun");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_TORCHRUN), "torchrun");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_OMPI), "mpirun");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_PMIX), "pmix");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_PMI), "pmi");
    assert_string_equal(ddp_launcher_name(DDP_LAUNCHER_SLURM), "srun");
    assert_string_equal(ddp_launcher_name((ddp_launcher)99), "unknown");
}

static void env_launchers(void **state)
{
    (void)state;
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_ENV);
    assert_false(w.master_known); /* by hand: the old default 127.0.0.1:29500 still applies */
    setenv("MASTER_PORT", "29600", 1);
    assert_true(world_ok().master_known);
    setenv("TORCHELASTIC_RUN_ID", "t", 1);
    assert_int_equal(world_ok().launcher, DDP_LAUNCHER_TORCHRUN);
    setenv("DDP_RUN_ID", "d", 1);
    assert_int_equal(world_ok().launcher, DDP_LAUNCHER_DDPRUN);
}

static void ompi_world(void **state)
{
    (void)state;
    set_ompi("3", "4", "1", "2");
    setenv("PMIX_RANK", "3", 1); /* Open MPI 4 sets it too, with the same rank */
    ddp_world w = world_ok();
    assert_true(w.launched);
    assert_int_equal(w.launcher, DDP_LAUNCHER_OMPI);
    assert_int_equal(w.rank, 3);
    assert_int_equal(w.world_size, 4);
    assert_int_equal(w.local_rank, 1);
    assert_int_equal(w.local_world_size, 2);
    assert_int_equal(w.node_rank, 0);
    assert_false(w.master_known);
    assert_false(w.agent_store);
    setenv("DDP_AGENT_STORE", "1", 1); /* stale, from some outer ddprun: not mpirun's */
    assert_false(world_ok().agent_store);
    unsetenv("DDP_AGENT_STORE");
    /* Without a store address and without MPI, nothing can bring this world up: say so. */
    ddp_store *s = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_store_open_world(&w, 1000, &s, &err), DDP_ERR_INVALID);
    assert_null(s);
    if (!strstr(err.msg, "rank 3 of 4 started by mpirun") || !strstr(err.msg, "MASTER_ADDR") ||
        !strstr(err.msg, "--backend mpi"))
        fail_msg("unhelpful message: %s", err.msg);
    /* With one, rank 0 hosts it as for a by-hand start. */
    setenv("MASTER_ADDR", "10.0.0.9", 1);
    w = world_ok();
    assert_true(w.master_known);
    assert_string_equal(w.master_addr, "10.0.0.9");
    assert_int_equal(w.master_port, 29500);
    /* An exported RANK that agrees is fine. */
    setenv("RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    assert_int_equal(world_ok().launcher, DDP_LAUNCHER_OMPI);
}

static void ompi_world_of_one(void **state)
{
    (void)state;
    /* mpirun -np 1: a private store, as a plain run (no port 29500 to collide on). */
    set_ompi("0", "1", "0", "1");
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_OMPI);
    ddp_store *s = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_store_open_world(&w, 5000, &s, &err), DDP_OK);
    assert_int_equal(ddp_store_set(s, "k", "v", 1), DDP_OK);
    ddp_store_close(s);
}

static void conflicts(void **state)
{
    (void)state;
    set_ompi("1", "2", "1", "2");
    setenv("RANK", "0", 1);
    expect_invalid2("RANK=0", "OMPI_COMM_WORLD_RANK=1");
    unsetenv("RANK");
    setenv("WORLD_SIZE", "4", 1);
    expect_invalid2("WORLD_SIZE=4", "OMPI_COMM_WORLD_SIZE=2");
    unsetenv("WORLD_SIZE");
    setenv("LOCAL_RANK", "0", 1);
    expect_invalid2("LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_RANK=1");
    unsetenv("LOCAL_RANK");
    setenv("PMIX_RANK", "0", 1);
    expect_invalid2("PMIX_RANK=0", "OMPI_COMM_WORLD_RANK=1");
    clear_env(NULL);
    set_slurm_step("1", "4", "1", "0");
    setenv("WORLD_SIZE", "2", 1);
    expect_invalid2("WORLD_SIZE=2", "SLURM_STEP_NUM_TASKS=4");
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "1", 1);
    assert_int_equal(world_ok().launcher, DDP_LAUNCHER_SLURM); /* sbatch's exports agree */
    setenv("GROUP_RANK", "1", 1);
    expect_invalid2("GROUP_RANK=1", "SLURM_NODEID=0");
}

static void nested_launchers(void **state)
{
    (void)state;
    /* mpirun inside an sbatch allocation: SLURM_* describe mpirun's daemons, OMPI_* the rank. */
    set_slurm_step("1", "2", "0", "1");
    set_ompi("5", "8", "1", "4");
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_OMPI);
    assert_int_equal(w.rank, 5);
    assert_int_equal(w.world_size, 8);
    assert_false(w.master_known); /* the Slurm node list is not rank 0's host under mpirun */
    /* ddprun (or torchrun) under srun or mpirun: the agent's contract is the worker's world. */
    setenv("RANK", "6", 1);
    setenv("WORLD_SIZE", "16", 1);
    setenv("DDP_RUN_ID", "job", 1);
    w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_DDPRUN);
    assert_int_equal(w.rank, 6);
    assert_int_equal(w.world_size, 16);
    unsetenv("DDP_RUN_ID");
    setenv("TORCHELASTIC_RUN_ID", "job", 1);
    assert_int_equal(world_ok().launcher, DDP_LAUNCHER_TORCHRUN);
}

static void pmix_and_pmi(void **state)
{
    (void)state;
    setenv("PMIX_RANK", "1", 1);
    expect_invalid2("PMIX_RANK=1", "WORLD_SIZE");
    setenv("WORLD_SIZE", "3", 1);
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_PMIX);
    assert_int_equal(w.rank, 1);
    assert_int_equal(w.world_size, 3);
    /* srun --mpi=pmix: the same rank in both, Slurm's fuller set wins. */
    unsetenv("WORLD_SIZE");
    set_slurm_step("1", "7", "1", "0");
    w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_SLURM);
    assert_int_equal(w.world_size, 7);
    assert_int_equal(w.local_world_size, 2);
    clear_env(NULL);
    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    setenv("MPI_LOCALRANKID", "0", 1);
    setenv("MPI_LOCALNRANKS", "2", 1);
    w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_PMI);
    assert_int_equal(w.rank, 2);
    assert_int_equal(w.world_size, 4);
    assert_int_equal(w.local_rank, 0);
    assert_int_equal(w.local_world_size, 2);
    setenv("PMI_SIZE", "1x", 1);
    expect_invalid("PMI_SIZE='1x'");
    setenv("PMI_SIZE", "2", 1);
    expect_invalid("PMI_RANK=2 is not below PMI_SIZE=2");
}

static void slurm_step(void **state)
{
    (void)state;
    set_slurm_step("6", "7", "0", "3");
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_SLURM);
    assert_int_equal(w.rank, 6);
    assert_int_equal(w.world_size, 7);
    assert_int_equal(w.local_rank, 0);
    assert_int_equal(w.local_world_size, 1); /* node 3 of "2(x3),1" */
    assert_int_equal(w.node_rank, 3);
    assert_true(w.master_known);
    assert_string_equal(w.master_addr, "node01");
    assert_int_equal(w.master_port, DDP_SLURM_PORT_BASE + (12345 % 900) * 10 + 2);
    set_slurm_step("3", "7", "1", "1");
    w = world_ok();
    assert_int_equal(w.local_world_size, 2);
    /* The user's MASTER_ADDR / MASTER_PORT win over the node list and the derived port. */
    setenv("MASTER_ADDR", "10.1.1.1", 1);
    w = world_ok();
    assert_string_equal(w.master_addr, "10.1.1.1");
    assert_int_equal(w.master_port, DDP_SLURM_PORT_BASE + (12345 % 900) * 10 + 2);
    setenv("MASTER_PORT", "4242", 1);
    assert_int_equal(world_ok().master_port, 4242);
    unsetenv("MASTER_ADDR");
    assert_string_equal(world_ok().master_addr, "node01");
    /* Without the step's own variables, the job's (older Slurm, or SLURM_STEPID). */
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_STEP_NUM_TASKS");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("MASTER_PORT");
    setenv("SLURM_STEPID", "0", 1);
    setenv("SLURM_JOB_NODELIST", "gpu-a[3-4]-x", 1);
    setenv("SLURM_TASKS_PER_NODE", "4,3", 1);
    w = world_ok();
    assert_int_equal(w.world_size, 7);
    assert_int_equal(w.local_world_size, 3);
    assert_string_equal(w.master_addr, "gpu-a3-x");
    assert_int_equal(w.master_port, DDP_SLURM_PORT_BASE + (12345 % 900) * 10);
    /* --ntasks-per-node alone. */
    unsetenv("SLURM_TASKS_PER_NODE");
    setenv("SLURM_NTASKS_PER_NODE", "4", 1);
    assert_int_equal(world_ok().local_world_size, 4);
}

static void slurm_errors(void **state)
{
    (void)state;
    set_slurm_step("0", "2", "0", "0");
    setenv("SLURM_STEP_NODELIST", "node[01-", 1);
    expect_invalid2("SLURM_STEP_NODELIST", "never closed");
    setenv("SLURM_STEP_NODELIST", "node1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x", 1);
    expect_invalid2("SLURM_STEP_TASKS_PER_NODE", "2(x");
    setenv("SLURM_STEP_TASKS_PER_NODE", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    expect_invalid2("SLURM_STEP_TASKS_PER_NODE", "node 1");
    setenv("SLURM_STEP_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_LOCALID", "2", 1);
    expect_invalid("SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE=2");
    /* srun -m arbitrary put rank 0 on the list's second host: said at once by rank 0 (it
     * waited out the store's timeout, with every other rank) */
    set_slurm_step("0", "2", "0", "1");
    setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
    setenv("SLURM_STEP_NODELIST", "node[01-02]", 1);
    setenv("SLURMD_NODENAME", "node02", 1);
    expect_invalid("rank 0 runs on 'node02', not on 'node01', the first host of "
                   "SLURM_STEP_NODELIST");
    setenv("SLURMD_NODENAME", "node01", 1);
    assert_string_equal(world_ok().master_addr, "node01");
    set_slurm_step("1", "2", "0", "0"); /* rank 1 on the first host: nothing to say */
    setenv("SLURM_STEP_TASKS_PER_NODE", "1(x2)", 1);
    setenv("SLURM_STEP_NODELIST", "node[01-02]", 1);
    assert_string_equal(world_ok().master_addr, "node01");
}

/* WORLD_SIZE of several without RANK: refused (it was a silent world of one in every process);
 * WORLD_SIZE=1 alone is a world of one. */
static void world_size_without_rank(void **state)
{
    (void)state;
    setenv("WORLD_SIZE", "2", 1);
    expect_invalid("WORLD_SIZE=2 is set but RANK is not");
    setenv("WORLD_SIZE", "two", 1);
    expect_invalid("WORLD_SIZE='two'");
    setenv("WORLD_SIZE", "1", 1);
    assert_int_equal(ddp_world_from_env(NULL, NULL), DDP_ERR_INVALID); /* it crashed */
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_NONE);
    assert_int_equal(w.world_size, 1);
}

static void slurm_batch_script(void **state)
{
    (void)state;
    /* sbatch's script (no srun): SLURM_PROCID=0 and the allocation's SLURM_NTASKS, no step. */
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_JOB_NODELIST", "n[1-2]", 1);
    ddp_world w = world_ok();
    assert_int_equal(w.launcher, DDP_LAUNCHER_NONE);
    assert_int_equal(w.world_size, 1);
    /* A rank above 0 without a step is no batch script but a step's variables passed on in
     * part: refused rather than a silent world of one. */
    setenv("SLURM_PROCID", "1", 1);
    expect_invalid("SLURM_PROCID=1 is set but neither SLURM_STEP_ID nor SLURM_STEPID");
    setenv("SLURM_PROCID", "junk", 1); /* not Slurm's: left alone, as before */
    assert_int_equal(world_ok().world_size, 1);
}

/* srun with a node list naming this host and a derived port: rank 0 hosts the store there. */
static void slurm_store(void **state)
{
    (void)state;
    set_slurm_step("0", "1", "0", "0");
    setenv("SLURM_STEP_TASKS_PER_NODE", "1", 1);
    setenv("SLURM_STEP_NODELIST", "localhost", 1);
    char job[32];
    snprintf(job, sizeof job, "%d", 100 + (int)(getpid() % 700)); /* parallel runs differ */
    setenv("SLURM_JOB_ID", job, 1);
    ddp_world w = world_ok();
    assert_true(w.master_known);
    assert_string_equal(w.master_addr, "localhost");
    ddp_store *s = NULL;
    ddp_error err = {0};
    ddp_status st = ddp_store_open_world(&w, 5000, &s, &err);
    if (st == DDP_ERR_ADDR_IN_USE)
        skip(); /* another job on this machine holds the derived port */
    if (st != DDP_OK)
        fail_msg("store under srun: %s", err.msg);
    assert_int_equal(ddp_store_set(s, "k", "v", 1), DDP_OK);
    ddp_store_close(s);
}

/* The derived port taken (another job's step on the node): srun's advice, not ddprun's flags. */
static void slurm_store_port_taken(void **state)
{
    (void)state;
    set_slurm_step("0", "2", "0", "0");
    setenv("SLURM_STEP_TASKS_PER_NODE", "2", 1);
    setenv("SLURM_STEP_NODELIST", "localhost", 1);
    char job[32];
    snprintf(job, sizeof job, "%d", 100 + (int)((getpid() + 350) % 700));
    setenv("SLURM_JOB_ID", job, 1);
    ddp_world w = world_ok();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w.master_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_true(fd >= 0);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1) != 0) {
        close(fd);
        skip(); /* someone else holds it: the case itself, but not of this test's making */
    }
    ddp_store *s = NULL;
    ddp_error err = {0};
    ddp_status st = ddp_store_open_world(&w, 5000, &s, &err);
    close(fd);
    assert_int_equal(st, DDP_ERR_ADDR_IN_USE);
    assert_null(s);
    if (!strstr(err.msg, "export MASTER_PORT=<a free port> for every task"))
        fail_msg("unhelpful message: %s", err.msg);
}

/* A step of 2 with no node list (a stripped environment): srun's advice, not mpirun's -x. */
static void slurm_store_without_list(void **state)
{
    (void)state;
    set_slurm_step("1", "2", "0", "0");
    setenv("SLURM_STEP_TASKS_PER_NODE", "2", 1);
    unsetenv("SLURM_STEP_NODELIST");
    unsetenv("SLURM_JOB_NODELIST");
    ddp_world w = world_ok();
    assert_false(w.master_known);
    ddp_store *s = NULL;
    ddp_error err = {0};
    assert_int_equal(ddp_store_open_world(&w, 5000, &s, &err), DDP_ERR_INVALID);
    assert_null(s);
    assert_non_null(strstr(err.msg, "rank 1 of 2 started by srun"));
    assert_non_null(strstr(err.msg, "no SLURM_STEP_NODELIST"));
    assert_null(strstr(err.msg, "mpirun -x"));
}

/* ---- Slurm's notations -------------------------------------------------------------------- */

static void expect_hosts(const char *list, const char *want)
{
    char **h = NULL;
    int n = 0;
    ddp_error err = {0};
    if (ddp__hostlist_expand(list, &h, &n, &err) != DDP_OK)
        fail_msg("'%s' failed: %s", list, err.msg);
    char got[4096] = "";
    for (int i = 0; i < n; i++) {
        if (i)
            strcat(got, " ");
        strcat(got, h[i]);
    }
    ddp__hostlist_free(h, n);
    if (strcmp(got, want) != 0)
        fail_msg("'%s' gave '%s', want '%s'", list, got, want);
}

static void expect_bad_list(const char *list, const char *needle)
{
    char **h = (char **)0x1;
    int n = -7;
    ddp_error err = {0};
    assert_int_equal(ddp__hostlist_expand(list, &h, &n, &err), DDP_ERR_INVALID);
    assert_ptr_equal(h, (char **)0x1);
    assert_int_equal(n, -7);
    if (!strstr(err.msg, needle) || !strstr(err.msg, list))
        fail_msg("'%s': message '%s' lacks '%s'", list, err.msg, needle);
}

static void hostlist_expand(void **state)
{
    (void)state;
    expect_hosts("plain", "plain");
    expect_hosts("node[01-03,07],gpu-a[1-2]-x, plain",
                 "node01 node02 node03 node07 gpu-a1-x gpu-a2-x plain");
    expect_hosts("n[8-10]", "n8 n9 n10");
    expect_hosts("n[08-10]", "n08 n09 n10");
    expect_hosts("n[098-101]", "n098 n099 n100 n101");
    expect_hosts("n[9-10,007]", "n9 n10 n007");
    expect_hosts("n[5]", "n5");
    expect_hosts("[1-2]", "1 2");
    expect_hosts("r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2");
    expect_hosts("a,b c\tdd", "a b c dd");
    expect_hosts("  a ,  b  ", "a b");
    expect_hosts("h-1.example.org,h[2-3].example.org",
                 "h-1.example.org h2.example.org h3.example.org");
    expect_hosts("n[0-1],n[0-1]", "n0 n1 n0 n1"); /* duplicates kept, as written */

    expect_bad_list("", "names no host");
    expect_bad_list("  ", "names no host");
    expect_bad_list("node[01-", "never closed");
    expect_bad_list("node[1]]", "without its '['");
    expect_bad_list("node]1", "without its '['");
    expect_bad_list("node[[1]]", "'[' inside brackets");
    expect_bad_list("node[]", "empty element");
    expect_bad_list("node[1,,2]", "empty element");
    expect_bad_list("node[1,]", "empty element");
    expect_bad_list("node[3-1]", "end is below its start");
    expect_bad_list("node[1-]", "without an end");
    expect_bad_list("node[a-b]", "non-digit");
    expect_bad_list("node[1-2x]", "non-digit");
    expect_hosts("a,,b", "a b"); /* empty items are skipped, as scontrol does */
    expect_hosts(",a,", "a");
    expect_bad_list(",", "names no host");
    expect_bad_list("n[0-9999999]", "more than 1000000 hosts");
    expect_bad_list("a[0-999]b[0-999]c[0-9]", "more than 1000000 hosts");
    expect_bad_list("n[1234567890123456789]", "too long");
    char longname[300];
    memset(longname, 'x', 299);
    longname[299] = '\0';
    char **h;
    int n;
    ddp_error err = {0};
    assert_int_equal(ddp__hostlist_expand(longname, &h, &n, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "longer than 255"));
}

/* Where Slurm's own tools are installed, the parser agrees with `scontrol show hostnames`. */
static void hostlist_matches_scontrol(void **state)
{
    (void)state;
    if (system("command -v scontrol >/dev/null 2>&1") != 0)
        skip();
    /* (Slurm 22.05 refuses text after a bracket, "gpu-a[1-2]-x", which the parser accepts.) */
    const char *lists[] = {"node[01-03,07],plain", "n[8-10]",     "n[098-101]",
                           "r[1-2]n[1-2]",         "n[9-10,007]", "a b,,c",
                           "n[0-1],n[0-1]",        "n[8-010]",    "[1-2]",
                           "x[001-003]y[7,9]",     "vm,n[01-02]"};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "scontrol show hostnames '%s' 2>/dev/null", lists[i]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        char want[4096] = "", line[256];
        while (fgets(line, sizeof line, p)) {
            line[strcspn(line, "\n")] = '\0';
            if (*want)
                strcat(want, " ");
            strcat(want, line);
        }
        if (pclose(p) != 0 || !*want)
            skip(); /* scontrol without a slurm.conf it can read */
        expect_hosts(lists[i], want);
    }
}

static void tasks_per_node(void **state)
{
    (void)state;
    const char *spec = "2(x3),1,4(x2)";
    int want[] = {2, 2, 2, 1, 4, 4};
    for (int node = 0; node < 6; node++) {
        int got = -1;
        assert_int_equal(ddp__slurm_tasks_on_node(spec, node, &got, NULL), DDP_OK);
        assert_int_equal(got, want[node]);
    }
    int got = -1;
    ddp_error err = {0};
    assert_int_equal(ddp__slurm_tasks_on_node(spec, 6, &got, &err), DDP_ERR_INVALID);
    assert_non_null(strstr(err.msg, "lists 6 nodes"));
    assert_int_equal(got, -1);
    assert_int_equal(ddp__slurm_tasks_on_node("16", 0, &got, NULL), DDP_OK);
    assert_int_equal(got, 16);
    const char *bad_specs[] = {"",     "x",    "2(x)", "2(3)",  "2(x3",  "2(x3),",
                               "2,,1", "2 ,1", "-1",   "2(x0)", "1,junk"};
    for (size_t i = 0; i < sizeof bad_specs / sizeof *bad_specs; i++) {
        memset(&err, 0, sizeof err);
        if (ddp__slurm_tasks_on_node(bad_specs[i], 0, &got, &err) != DDP_ERR_INVALID)
            fail_msg("tasks per node '%s' was accepted", bad_specs[i]);
        assert_non_null(strstr(err.msg, "malformed"));
    }
}

/* Launchers that set no thread count (mpirun, srun, by hand): each rank gets its share of the
 * host's cores, in OpenBLAS and in OMP_NUM_THREADS; set variables and a lone rank are left alone
 * (a rank per core under mpirun ran 2 OpenBLAS threads each on 2 cores). */
static void default_threads(void **state)
{
    (void)state;
    unsetenv("OMP_NUM_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    ddp_world w = {0};
    w.world_size = 4;
    w.local_world_size = 1;
    assert_int_equal(ddp_world_default_threads(&w), 0); /* one rank here: all cores are its */
    assert_null(getenv("OMP_NUM_THREADS"));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int own = ddp_own_cores();
    w.local_world_size = 2;
    int want = (int)(online / 2) < own ? (int)(online / 2) : own;
    if (want < 1)
        want = 1;
    assert_int_equal(ddp_world_default_threads(&w), want);
    char v[16];
    snprintf(v, sizeof v, "%d", want);
    assert_string_equal(getenv("OMP_NUM_THREADS"), v);
    assert_int_equal(openblas_get_num_threads(), want);
    /* set (here by the call above, as by ddprun or the user): left alone */
    w.local_world_size = 64;
    assert_int_equal(ddp_world_default_threads(&w), 0);
    unsetenv("OMP_NUM_THREADS");
    setenv("OPENBLAS_NUM_THREADS", "3", 1);
    assert_int_equal(ddp_world_default_threads(&w), 0);
    unsetenv("OPENBLAS_NUM_THREADS");
    assert_int_equal(ddp_world_default_threads(&w), 1); /* more ranks than cores: 1 each */
    unsetenv("OMP_NUM_THREADS");
    assert_int_equal(ddp_world_default_threads(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(world_of_one, clear_env),
        cmocka_unit_test_setup(full_contract, clear_env),
        cmocka_unit_test_setup(store_port_beside_master_port, clear_env),
        cmocka_unit_test_setup(torchrun_names, clear_env),
        cmocka_unit_test_setup(torchrun_agent_store, clear_env),
        cmocka_unit_test_setup(rank_without_world_size, clear_env),
        cmocka_unit_test_setup(world_size_without_rank, clear_env),
        cmocka_unit_test_setup(rank_not_below_world, clear_env),
        cmocka_unit_test_setup(junk_values, clear_env),
        cmocka_unit_test_setup(master_addr_forms, clear_env),
        cmocka_unit_test_setup(settings, clear_env),
        cmocka_unit_test_setup(settings_numbers, clear_env),
        cmocka_unit_test_setup(settings_too_long, clear_env),
        cmocka_unit_test(launcher_names),
        cmocka_unit_test_setup(env_launchers, clear_env),
        cmocka_unit_test_setup(ompi_world, clear_env),
        cmocka_unit_test_setup(ompi_world_of_one, clear_env),
        cmocka_unit_test_setup(conflicts, clear_env),
        cmocka_unit_test_setup(nested_launchers, clear_env),
        cmocka_unit_test_setup(pmix_and_pmi, clear_env),
        cmocka_unit_test_setup(slurm_step, clear_env),
        cmocka_unit_test_setup(slurm_errors, clear_env),
        cmocka_unit_test_setup(slurm_batch_script, clear_env),
        cmocka_unit_test_setup(slurm_store, clear_env),
        cmocka_unit_test_setup(slurm_store_without_list, clear_env),
        cmocka_unit_test_setup(slurm_store_port_taken, clear_env),
        cmocka_unit_test(hostlist_expand),
        cmocka_unit_test(hostlist_matches_scontrol),
        cmocka_unit_test(tasks_per_node),
        cmocka_unit_test(contract_names),
        cmocka_unit_test(status_strings),
        cmocka_unit_test(default_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
