/*
 * world.c — the one place the library reads the environment (include/ddp/world.h): the
 * launcher's contract, and the DDP_* settings that the group, its backends, the reducer and the
 * datasets otherwise take from their options. Accepts ddprun's names and torchrun's, so a program
 * runs unchanged under either; MPI and Slurm variables come with the MPI backend (DESIGN.md
 * roadmap), not here. Settings are copied as given: the module that uses one checks its value
 * (and says what it accepts), as it does for the same value passed in its options.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ddp/world.h"
#include "util/util.h"

/* Reads an integer variable; absent leaves *out unchanged and returns DDP_OK. */
static ddp_status env_int(const char *name, long long lo, long long hi, int *out, ddp_error *err)
{
    const char *v = getenv(name);
    if (!v)
        return DDP_OK;
    long long x;
    if (!ddp__parse_int(v, lo, hi, &x))
        return ddp__err(err, DDP_ERR_INVALID,
                        "environment variable %s='%s' is not an integer in %lld..%lld; unset it or "
                        "start the program through ddprun",
                        name, v, lo, hi);
    *out = (int)x;
    return DDP_OK;
}

/* Reads the first of two variable names that is set. */
static const char *env_either(const char *a, const char *b)
{
    const char *v = getenv(a);
    return v ? v : getenv(b);
}

static ddp_status env_str(const char *name, const char *value, char *dst, size_t cap,
                          ddp_error *err)
{
    if (strlen(value) >= cap)
        return ddp__err(err, DDP_ERR_INVALID, "environment variable %s is longer than %zu bytes",
                        name, cap - 1);
    memcpy(dst, value, strlen(value) + 1);
    return DDP_OK;
}

/* A number setting in [lo, hi]: 0 (not set) when absent or malformed, as these were always read. */
static int setting_int(const char *name, long long lo, long long hi)
{
    long long x;
    return ddp__parse_int(getenv(name), lo, hi, &x) ? (int)x : 0;
}

static ddp_status setting_str(const char *name, char *dst, size_t cap, ddp_error *err)
{
    const char *v = getenv(name);
    return v ? env_str(name, v, dst, cap, err) : DDP_OK;
}

static ddp_status settings_from_env(ddp_settings *s, ddp_error *err)
{
    ddp_status st;
    if ((st = setting_str("DDP_BACKEND", s->backend, sizeof s->backend, err)) ||
        (st = setting_str("DDP_HOST_ID", s->host_id, sizeof s->host_id, err)) ||
        (st = setting_str("DDP_SHM_FLUSH", s->shm_flush, sizeof s->shm_flush, err)) ||
        (st = setting_str("DDP_OVERLAP", s->overlap, sizeof s->overlap, err)) ||
        (st = setting_str("DDP_DATA_CACHE", s->data_cache, sizeof s->data_cache, err)))
        return st;
    int secs = setting_int("DDP_TIMEOUT", 0, INT_MAX);
    s->timeout_ms = (secs < INT_MAX / 1000 ? secs : INT_MAX / 1000) * 1000; /* 24 days at most */
    s->debug = setting_int("DDP_DEBUG", 0, INT_MAX) != 0;
    s->host_cores = setting_int("DDP_HOST_CORES", 1, 1 << 20);
    const char *sr = getenv("DDP_STALL_REPORT");
    if (sr && (strcmp(sr, "0") == 0 || strcmp(sr, "off") == 0))
        s->stall_report_ms = -1;
    else
        s->stall_report_ms = setting_int("DDP_STALL_REPORT", 1, INT_MAX / 1000) * 1000;
    return DDP_OK;
}

ddp_status ddp_world_from_env(ddp_world *out, ddp_error *err)
{
    ddp_world w;
    memset(&w, 0, sizeof w);
    w.world_size = 1;
    w.local_world_size = 1;
    w.master_port = DDP_DEFAULT_MASTER_PORT;
    strcpy(w.master_addr, DDP_DEFAULT_MASTER_ADDR);
    strcpy(w.run_id, "none");
    ddp_status st;

    const char *rank = getenv("RANK");
    w.launched = rank != NULL;
    if (w.launched) {
        if (!getenv("WORLD_SIZE"))
            return ddp__err(err, DDP_ERR_INVALID,
                            "RANK is set but WORLD_SIZE is not; set both (or start the program "
                            "through ddprun)");
        if ((st = env_int("WORLD_SIZE", 1, INT_MAX, &w.world_size, err)) ||
            (st = env_int("RANK", 0, INT_MAX, &w.rank, err)))
            return st;
        if (w.rank >= w.world_size)
            return ddp__err(err, DDP_ERR_INVALID, "RANK=%d is not below WORLD_SIZE=%d", w.rank,
                            w.world_size);
        /* Without LOCAL_* a by-hand start is taken as one node holding every rank. */
        w.local_rank = w.rank;
        w.local_world_size = w.world_size;
        if ((st = env_int("LOCAL_RANK", 0, INT_MAX, &w.local_rank, err)) ||
            (st = env_int("LOCAL_WORLD_SIZE", 1, INT_MAX, &w.local_world_size, err)) ||
            (st = env_int("GROUP_RANK", 0, INT_MAX, &w.node_rank, err)) ||
            (st = env_int("MASTER_PORT", 1, 65535, &w.master_port, err)))
            return st;
        if (w.local_rank >= w.local_world_size)
            return ddp__err(err, DDP_ERR_INVALID, "LOCAL_RANK=%d is not below LOCAL_WORLD_SIZE=%d",
                            w.local_rank, w.local_world_size);
        if (w.local_world_size > w.world_size)
            return ddp__err(err, DDP_ERR_INVALID, "LOCAL_WORLD_SIZE=%d exceeds WORLD_SIZE=%d",
                            w.local_world_size, w.world_size);
    }
    const char *v;
    if ((v = getenv("MASTER_ADDR")) && *v &&
        (st = env_str("MASTER_ADDR", v, w.master_addr, sizeof w.master_addr, err)))
        return st;
    if ((v = env_either("DDP_RUN_ID", "TORCHELASTIC_RUN_ID")) && *v &&
        (st = env_str("DDP_RUN_ID", v, w.run_id, sizeof w.run_id, err)))
        return st;
    if ((v = getenv("DDP_STORE_TOKEN")) &&
        (st = env_str("DDP_STORE_TOKEN", v, w.store_token, sizeof w.store_token, err)))
        return st;
    const char *rc =
        getenv("DDP_RESTART_COUNT") ? "DDP_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT";
    const char *mr = getenv("DDP_MAX_RESTARTS") ? "DDP_MAX_RESTARTS" : "TORCHELASTIC_MAX_RESTARTS";
    if ((st = env_int(rc, 0, INT_MAX, &w.restart_count, err)) ||
        (st = env_int(mr, 0, INT_MAX, &w.max_restarts, err)))
        return st;
    w.agent_store = w.launched && (v = getenv("DDP_AGENT_STORE")) && strcmp(v, "1") == 0;
    if ((st = settings_from_env(&w.settings, err)))
        return st;
    *out = w;
    return DDP_OK;
}
