/*
 * test_world.c — the environment as the library reads it: a world of one without RANK,
 * torchrun's and ddprun's variables, clear errors for inconsistent environments, the DDP_*
 * settings, and the list of variables ddprun sets.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ddp/ddp.h"

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
    "DDP_AGENT_STORE",
    "DDP_BACKEND",
    "DDP_TIMEOUT",
    "DDP_DEBUG",
    "DDP_HOST_ID",
    "DDP_HOST_CORES",
    "DDP_SHM_FLUSH",
    "DDP_OVERLAP",
    "DDP_DATA_CACHE",
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
    /* Values are copied as given: the module that uses one checks it. */
    setenv("DDP_SHM_FLUSH", "sometimes", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_string_equal(w.settings.shm_flush, "sometimes");
}

static void settings_numbers(void **state)
{
    (void)state;
    ddp_world w;
    /* Malformed numbers count as not set, as they always have. */
    setenv("DDP_TIMEOUT", "soon", 1);
    setenv("DDP_DEBUG", "yes", 1);
    setenv("DDP_HOST_CORES", "0", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_int_equal(w.settings.timeout_ms, 0);
    assert_int_equal(w.settings.debug, 0);
    assert_int_equal(w.settings.host_cores, 0);
    /* A huge timeout is capped rather than overflowing. */
    setenv("DDP_TIMEOUT", "99999999", 1);
    setenv("DDP_DEBUG", "7", 1);
    assert_int_equal(ddp_world_from_env(&w, NULL), DDP_OK);
    assert_true(w.settings.timeout_ms > 24 * 3600 * 1000);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(world_of_one, clear_env),
        cmocka_unit_test_setup(full_contract, clear_env),
        cmocka_unit_test_setup(torchrun_names, clear_env),
        cmocka_unit_test_setup(rank_without_world_size, clear_env),
        cmocka_unit_test_setup(rank_not_below_world, clear_env),
        cmocka_unit_test_setup(junk_values, clear_env),
        cmocka_unit_test_setup(settings, clear_env),
        cmocka_unit_test_setup(settings_numbers, clear_env),
        cmocka_unit_test_setup(settings_too_long, clear_env),
        cmocka_unit_test(contract_names),
        cmocka_unit_test(status_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
