/*
 * world.c — the one place the library reads the environment (include/ddp/world.h): the
 * launcher's contract, and the DDP_* settings that the group, its backends, the reducer and the
 * datasets otherwise take from their options. Accepts ddprun's names and torchrun's, Open MPI's,
 * PMI's, PMIx's and Slurm's, so a program runs unchanged under any of them; which launcher set
 * the world is recorded, and two launchers that disagree are an error rather than two silent
 * worlds (docs/launchers.md has the order of precedence). Settings are copied as given: the module
 * that uses one checks its value (and says what it accepts), as it does for the same value passed
 * in its options.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ddp/world.h"
#include "util/hostlist.h"
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

/* MASTER_ADDR holds a host alone. A "host:port" (a torchrun --rdzv_endpoint pasted in) was
 * looked up as a host name: rank 0 failed at once, the others retried it for their whole connect
 * timeout and then named '127.0.0.1:29500:29500'. So one colon, or a bracketed address with a
 * port, is an error naming the variable; "[::1]" is taken as ::1, as in torchrun's endpoints;
 * blanks (a line pasted with its space) are an error rather than a host name that cannot be. */
static ddp_status master_addr_env(const char *v, char *dst, size_t cap, ddp_error *err)
{
    const char *colon = strchr(v, ':'), *close = strchr(v, ']');
    bool bracketed = v[0] == '[' && close && close > v + 1;
    if ((bracketed && close[1] == ':') || (!bracketed && colon && !strchr(colon + 1, ':')))
        return ddp__err(err, DDP_ERR_INVALID,
                        "MASTER_ADDR='%s' holds a port: put the host alone in MASTER_ADDR and "
                        "the port in MASTER_PORT (an IPv6 address bare or in brackets, e.g. ::1)",
                        v);
    if ((v[0] == '[' && (!bracketed || close[1])) || (v[0] != '[' && close))
        return ddp__err(err, DDP_ERR_INVALID,
                        "MASTER_ADDR='%s' is not a host name or address; write an IPv6 address "
                        "bare or in brackets alone, e.g. ::1 or [::1]",
                        v);
    for (const char *c = v; *c; c++)
        if (isspace((unsigned char)*c))
            return ddp__err(err, DDP_ERR_INVALID,
                            "MASTER_ADDR='%s' holds a blank; give the host name or address "
                            "alone",
                            v);
    if (!bracketed)
        return env_str("MASTER_ADDR", v, dst, cap, err);
    size_t n = (size_t)(close - v - 1);
    if (n >= cap)
        return ddp__err(err, DDP_ERR_INVALID,
                        "environment variable MASTER_ADDR is longer than %zu bytes", cap - 1);
    memcpy(dst, v + 1, n);
    dst[n] = '\0';
    return DDP_OK;
}

/* A number setting in [lo, hi] (what: its unit, for the message): 0 (not set) when absent or
 * empty; a malformed one is an error naming it, not a silent default (DDP_TIMEOUT=30m was
 * the 30-minute default). */
static ddp_status setting_int(const char *name, long long lo, long long hi, const char *what,
                              int *out, ddp_error *err)
{
    const char *v = getenv(name);
    long long x;
    *out = 0;
    if (!v || !*v)
        return DDP_OK;
    if (!ddp__parse_int(v, lo, hi, &x))
        return ddp__err(err, DDP_ERR_INVALID,
                        "environment variable %s='%s' is not a whole number from %lld to %lld "
                        "(%s); correct it or unset it",
                        name, v, lo, hi, what);
    *out = (int)x;
    return DDP_OK;
}

/* A yes/no setting: 1, yes, true, on / 0, no, false, off, or empty (no). */
static ddp_status setting_bool(const char *name, int *out, ddp_error *err)
{
    static const char *const yes[] = {"1", "yes", "true", "on"}, *const no[] = {"", "0", "no",
                                                                                "false", "off"};
    const char *v = getenv(name);
    *out = 0;
    if (!v)
        return DDP_OK;
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (!strcasecmp(v, yes[i])) {
            *out = 1;
            return DDP_OK;
        }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (!strcasecmp(v, no[i]))
            return DDP_OK;
    long long x; /* any other whole number: nonzero is yes, as before */
    if (ddp__parse_int(v, 0, INT_MAX, &x)) {
        *out = x != 0;
        return DDP_OK;
    }
    return ddp__err(err, DDP_ERR_INVALID,
                    "environment variable %s='%s' is not 1/0, yes/no, true/false or on/off; "
                    "correct it or unset it",
                    name, v);
}

static ddp_status setting_str(const char *name, char *dst, size_t cap, ddp_error *err)
{
    const char *v = getenv(name);
    return v ? env_str(name, v, dst, cap, err) : DDP_OK;
}

/* DDP_CACHE_DIR, else $XDG_CACHE_HOME/ddpc, else $HOME/.cache/ddpc (the XDG default); "off" or
 * no home: "" (nothing is cached). */
static ddp_status cache_dir_from_env(char *dst, size_t cap, ddp_error *err)
{
    const char *v = getenv("DDP_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home;
    if (v)
        return env_str("DDP_CACHE_DIR", strcmp(v, "off") ? v : "", dst, cap, err);
    if (xdg && *xdg && strlen(xdg) + sizeof "/ddpc" <= cap) {
        snprintf(dst, cap, "%s/ddpc", xdg);
        return DDP_OK;
    }
    home = getenv("HOME");
    if (home && *home && strlen(home) + sizeof "/.cache/ddpc" <= cap)
        snprintf(dst, cap, "%s/.cache/ddpc", home);
    return DDP_OK;
}

ddp_status ddp__settings_from_env(ddp_settings *s, ddp_error *err)
{
    ddp_status st;
    if ((st = setting_str("DDP_BACKEND", s->backend, sizeof s->backend, err)) ||
        (st = setting_str("DDP_HOST_ID", s->host_id, sizeof s->host_id, err)) ||
        (st = setting_str("DDP_SHM_FLUSH", s->shm_flush, sizeof s->shm_flush, err)) ||
        (st = setting_str("DDP_SHM_ALGO", s->shm_algo, sizeof s->shm_algo, err)) ||
        (st = cache_dir_from_env(s->cache_dir, sizeof s->cache_dir, err)) ||
        (st = setting_str("DDP_OVERLAP", s->overlap, sizeof s->overlap, err)) ||
        (st = setting_str("DDP_DATA_CACHE", s->data_cache, sizeof s->data_cache, err)) ||
        (st = setting_str("DDP_GPU_MODULE", s->gpu_module, sizeof s->gpu_module, err)) ||
        (st = setting_str("DDP_MPI_MODE", s->mpi_mode, sizeof s->mpi_mode, err)) ||
        (st = setting_str("DDP_LOCAL_ADDR", s->local_addr, sizeof s->local_addr, err)))
        return st;
    /* Checked here, where every rank reads it before any group forms (a typo meant auto,
     * silently, until 2026-11-26; DDP_SHM_FLUSH and DDP_SHM_ALGO are refused by the backend). */
    if (*s->overlap && strcmp(s->overlap, "auto") && strcmp(s->overlap, "async") &&
        strcmp(s->overlap, "inline"))
        return ddp__err(err, DDP_ERR_INVALID,
                        "DDP_OVERLAP must be auto, async or inline, not '%.40s'; unset it to let "
                        "the reducer choose",
                        s->overlap);
    int secs, stall = 0;
    /* at most INT_MAX ms (24.8 days), said in the range (a larger one was cut to it silently) */
    if ((st = setting_int("DDP_TIMEOUT", 0, INT_MAX / 1000, "seconds", &secs, err)) ||
        (st = setting_bool("DDP_DEBUG", &s->debug, err)) ||
        (st = setting_int("DDP_HOST_CORES", 1, 1 << 20, "cores", &s->host_cores, err)) ||
        (st = setting_int("DDP_TEST_FAKE_GPUS", 1, 64, "GPUs", &s->fake_gpus, err)))
        return st;
    s->timeout_ms = secs * 1000;
    const char *sr = getenv("DDP_STALL_REPORT");
    if (sr && (strcmp(sr, "0") == 0 || strcasecmp(sr, "off") == 0))
        s->stall_report_ms = -1;
    else if ((st = setting_int("DDP_STALL_REPORT", 1, INT_MAX / 1000, "seconds, or 0 or off",
                               &stall, err)))
        return st;
    else
        s->stall_report_ms = stall * 1000;
    return DDP_OK;
}

/* ---- who started us ------------------------------------------------------------------------ */

/* One fact about this process as one launcher states it; var is NULL when it does not. */
typedef struct fact {
    int v;
    const char *var;
} fact;

/* The world as one launcher's variables describe it. */
typedef struct view {
    ddp_launcher l;
    fact rank, size, local_rank, local_size, node;
} view;

static ddp_status get_fact(const char *name, long long lo, fact *f, ddp_error *err)
{
    if (!getenv(name))
        return DDP_OK;
    ddp_status st = env_int(name, lo, INT_MAX, &f->v, err);
    if (st == DDP_OK)
        f->var = name;
    return st;
}

static const char *first_set(const char *a, const char *b, const char *c)
{
    return getenv(a) ? a : getenv(b) ? b : c;
}

/* ddprun's and torchrun's names (also a by-hand start's). */
static ddp_status read_env(view *v, ddp_error *err)
{
    ddp_status st;
    if ((st = get_fact("RANK", 0, &v->rank, err)) ||
        (st = get_fact("WORLD_SIZE", 1, &v->size, err)) ||
        (st = get_fact("LOCAL_RANK", 0, &v->local_rank, err)) ||
        (st = get_fact("LOCAL_WORLD_SIZE", 1, &v->local_size, err)) ||
        (st = get_fact("GROUP_RANK", 0, &v->node, err)))
        return st;
    return DDP_OK;
}

static ddp_status read_ompi(view *v, ddp_error *err)
{
    ddp_status st;
    v->l = DDP_LAUNCHER_OMPI;
    if ((st = get_fact("OMPI_COMM_WORLD_RANK", 0, &v->rank, err)) ||
        (st = get_fact("OMPI_COMM_WORLD_SIZE", 1, &v->size, err)) ||
        (st = get_fact("OMPI_COMM_WORLD_LOCAL_RANK", 0, &v->local_rank, err)) ||
        (st = get_fact("OMPI_COMM_WORLD_LOCAL_SIZE", 1, &v->local_size, err)))
        return st;
    return DDP_OK;
}

/* PMIx puts only the rank in the environment; the size comes from another variable. */
static ddp_status read_pmix(view *v, ddp_error *err)
{
    v->l = DDP_LAUNCHER_PMIX;
    return get_fact("PMIX_RANK", 0, &v->rank, err);
}

/* PMI-1/2 launchers; MPICH's Hydra adds the local rank and size under MPI_LOCAL*. */
static ddp_status read_pmi(view *v, ddp_error *err)
{
    ddp_status st;
    v->l = DDP_LAUNCHER_PMI;
    if ((st = get_fact("PMI_RANK", 0, &v->rank, err)) ||
        (st = get_fact("PMI_SIZE", 1, &v->size, err)) ||
        (st = get_fact("MPI_LOCALRANKID", 0, &v->local_rank, err)) ||
        (st = get_fact("MPI_LOCALNRANKS", 1, &v->local_size, err)))
        return st;
    return DDP_OK;
}

/* srun: a job step's task. A batch script (sbatch, salloc) also has SLURM_PROCID=0 and the
 * allocation's SLURM_NTASKS, but no step id: it is one process, not rank 0 of a world, so only a
 * step counts. The step's variables are preferred to the job's (a step may use fewer tasks). */
static ddp_status read_slurm(view *v, ddp_error *err)
{
    ddp_status st;
    v->l = DDP_LAUNCHER_SLURM;
    if (!getenv("SLURM_STEP_ID") && !getenv("SLURM_STEPID"))
        return DDP_OK;
    if ((st = get_fact("SLURM_PROCID", 0, &v->rank, err)) ||
        (st = get_fact(first_set("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"), 1,
                       &v->size, err)) ||
        (st = get_fact("SLURM_LOCALID", 0, &v->local_rank, err)) ||
        (st = get_fact("SLURM_NODEID", 0, &v->node, err)))
        return st;
    const char *per = first_set("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", NULL);
    if (per) {
        int n;
        ddp_error e = {0};
        if ((st = ddp__slurm_tasks_on_node(getenv(per), v->node.var ? v->node.v : 0, &n, &e)))
            return ddp__err(err, st, "%s: %s", per, e.msg);
        v->local_size = (fact){n, per};
    } else if ((st = get_fact("SLURM_NTASKS_PER_NODE", 1, &v->local_size, err))) {
        return st;
    }
    return DDP_OK;
}

/* A fact both views state must agree; b fills in what a lacks. */
static ddp_status merge_fact(fact *a, const fact *b, ddp_launcher la, ddp_error *err)
{
    if (!b->var)
        return DDP_OK;
    if (!a->var) {
        *a = *b;
        return DDP_OK;
    }
    if (a->v == b->v)
        return DDP_OK;
    return ddp__err(err, DDP_ERR_INVALID,
                    "%s=%d but %s=%d: two launchers describe this process differently (this one "
                    "was started by %s); unset the stale variables (an exported RANK, WORLD_SIZE, "
                    "LOCAL_RANK or LOCAL_WORLD_SIZE) or make them agree (docs/launchers.md)",
                    b->var, b->v, a->var, a->v, ddp_launcher_name(la));
}

/* Picks the launcher that started this process (docs/launchers.md) and checks the others. */
static ddp_status find_launcher(view *out, ddp_error *err)
{
    ddp_status st;
    view env = {.l = DDP_LAUNCHER_ENV};
    if ((st = read_env(&env, err)))
        return st;
    /* An agent (ddprun, torchrun, ddp_spawn) is the innermost launcher: variables of an srun or
     * mpirun that started the agent describe the agent, not its workers, and are not read. */
    const char *agent = getenv("DDP_RUN_ID");
    if (env.rank.var && (agent || getenv("TORCHELASTIC_RUN_ID"))) {
        env.l = agent ? DDP_LAUNCHER_DDPRUN : DDP_LAUNCHER_TORCHRUN;
        *out = env;
        return DDP_OK;
    }
    view ompi = {0}, pmix = {0}, pmi = {0}, slurm = {0};
    if ((st = read_ompi(&ompi, err)) || (st = read_pmix(&pmix, err)) ||
        (st = read_pmi(&pmi, err)) || (st = read_slurm(&slurm, err)))
        return st;
    /* The innermost MPI-style launcher: an mpirun inside a Slurm allocation inherits SLURM_*
     * variables that describe its daemons, so Slurm comes last; srun with a PMI or PMIx plugin
     * sets both, and then the two agree on the rank and Slurm's fuller set is used. */
    view *in = NULL;
    if (ompi.rank.var) {
        in = &ompi;
        if ((st = merge_fact(&in->rank, &pmix.rank, in->l, err)))
            return st;
    } else if (pmix.rank.var) {
        in = slurm.rank.var && slurm.rank.v == pmix.rank.v ? &slurm : &pmix;
    } else if (pmi.rank.var) {
        bool same = slurm.rank.var && slurm.rank.v == pmi.rank.v &&
                    (!pmi.size.var || (slurm.size.var && slurm.size.v == pmi.size.v));
        in = same ? &slurm : &pmi;
    } else if (slurm.rank.var) {
        in = &slurm;
    }
    if (!in) {
        env.l = env.rank.var ? DDP_LAUNCHER_ENV : DDP_LAUNCHER_NONE;
        *out = env;
        return DDP_OK;
    }
    /* A RANK/WORLD_SIZE/LOCAL_* given too (an sbatch script's exports) must say the same. */
    if ((st = merge_fact(&in->rank, &env.rank, in->l, err)) ||
        (st = merge_fact(&in->size, &env.size, in->l, err)) ||
        (st = merge_fact(&in->local_rank, &env.local_rank, in->l, err)) ||
        (st = merge_fact(&in->local_size, &env.local_size, in->l, err)) ||
        (st = merge_fact(&in->node, &env.node, in->l, err)))
        return st;
    if (!in->size.var)
        return ddp__err(err, DDP_ERR_INVALID,
                        "%s=%d is set but no variable gives the world's size (%s does not put it "
                        "in the environment); export WORLD_SIZE, or start through mpirun or srun",
                        in->rank.var, in->rank.v, ddp_launcher_name(in->l));
    *out = *in;
    return DDP_OK;
}

/* Under srun without MASTER_ADDR / MASTER_PORT: rank 0 runs on the first host of the step's node
 * list, and the port is derived from the job and step ids (docs/launchers.md), the same on every
 * rank without any exchange. */
static ddp_status slurm_master(ddp_world *w, bool addr_set, bool port_set, ddp_error *err)
{
    const char *lv = first_set("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST");
    const char *list = lv ? getenv(lv) : NULL;
    if (!addr_set) {
        if (!list)
            return DDP_OK; /* master_known stays false: the group says what to do */
        char **hosts;
        int n;
        ddp_error e = {0};
        ddp_status st = ddp__hostlist_expand(list, &hosts, &n, &e);
        if (st)
            return ddp__err(err, st, "%s: %s", lv, e.msg);
        /* Rank 0 runs on the list's first host under srun's block and cyclic distributions;
         * under -m arbitrary (or a hand-made SLURM_HOSTFILE) it may not, and then it hosted the
         * store on its own node while every rank waited out its timeout at the first host. Rank
         * 0 knows its node (SLURMD_NODENAME) and says so at once. */
        const char *me = getenv("SLURMD_NODENAME");
        if (w->rank == 0 && me && *me && strcmp(me, hosts[0]) != 0) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "rank 0 runs on '%s', not on '%s', the first host of %s, where the "
                          "other ranks look for the store (srun -m arbitrary or a host file?); "
                          "export MASTER_ADDR=%s (and MASTER_PORT) for every rank, or use "
                          "srun's block or cyclic distribution",
                          me, hosts[0], lv, me);
            ddp__hostlist_free(hosts, n);
            return st;
        }
        st = env_str(lv, hosts[0], w->master_addr, sizeof w->master_addr, err);
        ddp__hostlist_free(hosts, n);
        if (st)
            return st;
    }
    if (!port_set) {
        long long job = 0, step = 0;
        const char *sv = first_set("SLURM_STEP_ID", "SLURM_STEPID", NULL);
        const char *jv = first_set("SLURM_JOB_ID", "SLURM_JOBID", NULL);
        (void)ddp__parse_int(jv ? getenv(jv) : NULL, 0, LLONG_MAX, &job);
        (void)ddp__parse_int(sv ? getenv(sv) : NULL, 0, LLONG_MAX, &step);
        w->master_port = DDP_SLURM_PORT_BASE + (int)(job % 900) * 10 + (int)(step % 10);
    }
    w->master_known = true;
    return DDP_OK;
}

const char *ddp_launcher_name(ddp_launcher l)
{
    switch (l) {
    case DDP_LAUNCHER_NONE: return "none";
    case DDP_LAUNCHER_ENV: return "env";
    case DDP_LAUNCHER_DDPRUN: return "ddprun";
    case DDP_LAUNCHER_TORCHRUN: return "torchrun";
    case DDP_LAUNCHER_OMPI: return "mpirun";
    case DDP_LAUNCHER_PMIX: return "pmix";
    case DDP_LAUNCHER_PMI: return "pmi";
    case DDP_LAUNCHER_SLURM: return "srun";
    }
    return "unknown";
}

ddp_status ddp_world_from_env(ddp_world *out, ddp_error *err)
{
    if (!out)
        return ddp__err(err, DDP_ERR_INVALID, "ddp_world_from_env: out is NULL");
    ddp_world w;
    memset(&w, 0, sizeof w);
    w.world_size = 1;
    w.local_world_size = 1;
    w.master_port = DDP_DEFAULT_MASTER_PORT;
    strcpy(w.master_addr, DDP_DEFAULT_MASTER_ADDR);
    strcpy(w.run_id, "none");
    ddp_status st;

    view in = {0};
    if ((st = find_launcher(&in, err)))
        return st;
    w.launcher = in.l;
    w.launched = in.l != DDP_LAUNCHER_NONE;
    if (w.launched) {
        if (!in.size.var)
            return ddp__err(err, DDP_ERR_INVALID,
                            "RANK is set but WORLD_SIZE is not; set both (or start the program "
                            "through ddprun)");
        w.rank = in.rank.v;
        w.world_size = in.size.v;
        if (w.rank >= w.world_size)
            return ddp__err(err, DDP_ERR_INVALID, "%s=%d is not below %s=%d", in.rank.var, w.rank,
                            in.size.var, w.world_size);
        /* Without the local facts, a start is taken as one node holding every rank. */
        w.local_rank = in.local_rank.var ? in.local_rank.v : w.rank;
        w.local_rank_known = in.local_rank.var != NULL;
        w.local_world_size = in.local_size.var ? in.local_size.v : w.world_size;
        w.node_rank = in.node.var ? in.node.v : 0;
        const char *lr = in.local_rank.var ? in.local_rank.var : "LOCAL_RANK";
        const char *ls = in.local_size.var ? in.local_size.var : "LOCAL_WORLD_SIZE";
        if (w.local_rank >= w.local_world_size)
            return ddp__err(err, DDP_ERR_INVALID, "%s=%d is not below %s=%d", lr, w.local_rank, ls,
                            w.local_world_size);
        if (w.local_world_size > w.world_size)
            return ddp__err(err, DDP_ERR_INVALID, "%s=%d exceeds %s=%d", ls, w.local_world_size,
                            in.size.var, w.world_size);
        if ((st = env_int("MASTER_PORT", 1, 65535, &w.master_port, err)))
            return st;
    } else {
        /* WORLD_SIZE of several with no rank: each process would run alone, silently, as a
         * world of one (torch's env:// refuses it too). */
        int size = 1;
        if ((st = env_int("WORLD_SIZE", 1, INT_MAX, &size, err)))
            return st;
        if (size > 1)
            return ddp__err(err, DDP_ERR_INVALID,
                            "WORLD_SIZE=%d is set but RANK is not: each process would run alone "
                            "as a world of one; set RANK too (or start the program through "
                            "ddprun), or unset WORLD_SIZE",
                            size);
        /* The same for Slurm's rank without a step: a batch script has SLURM_PROCID=0, a task
         * above 0 exists only in a step, so this is an environment passed on in part (a
         * container given some variables); it ran alone, silently, before 2026-11-24. */
        long long procid = 0;
        const char *pv = getenv("SLURM_PROCID");
        if (pv && ddp__parse_int(pv, 0, INT_MAX, &procid) && procid > 0)
            return ddp__err(err, DDP_ERR_INVALID,
                            "SLURM_PROCID=%lld is set but neither SLURM_STEP_ID nor SLURM_STEPID: "
                            "a rank above 0 exists only in an srun step, and without one this "
                            "process would run alone as a world of one; pass the step's "
                            "variables on too (or start it with srun), or unset SLURM_PROCID",
                            procid);
    }
    const char *v;
    bool addr_set = (v = getenv("MASTER_ADDR")) && *v;
    if (addr_set && (st = master_addr_env(v, w.master_addr, sizeof w.master_addr, err)))
        return st;
    bool port_set = getenv("MASTER_PORT") != NULL;
    w.master_known = w.launched && (addr_set || port_set);
    if (w.launcher == DDP_LAUNCHER_SLURM && (st = slurm_master(&w, addr_set, port_set, err)))
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
    /* Only ddprun's contract can say that ddprun hosts the store: under mpirun or srun a
     * DDP_AGENT_STORE inherited from elsewhere would send rank 0 looking for a store nobody runs.
     */
    bool rank_based = w.launcher == DDP_LAUNCHER_ENV || w.launcher == DDP_LAUNCHER_DDPRUN ||
                      w.launcher == DDP_LAUNCHER_TORCHRUN;
    w.agent_store = rank_based && (v = getenv("DDP_AGENT_STORE")) && strcmp(v, "1") == 0;
    /* ddprun's store is on DDP_STORE_PORT; MASTER_PORT is then a free port it leaves to programs
     * that host a store of their own (PyTorch's rank 0 binds MASTER_PORT). */
    if (w.agent_store && (st = env_int("DDP_STORE_PORT", 1, 65535, &w.master_port, err)))
        return st;
    /* torchrun's static rendezvous (its default: no --rdzv_backend) serves PyTorch's TCPStore
     * from the agent on MASTER_PORT itself and says so with TORCHELASTIC_USE_AGENT_STORE=True
     * (PyTorch's workers connect to it rather than host one). ddpc does not speak that
     * protocol, so rank 0 hosts ddpc's store on the next port; before 2026-11-24 it tried
     * MASTER_PORT, found it taken and every ddpc program failed under plain `torchrun`. */
    if (w.launcher == DDP_LAUNCHER_TORCHRUN && (v = getenv("TORCHELASTIC_USE_AGENT_STORE")) &&
        (strcasecmp(v, "true") == 0 || strcmp(v, "1") == 0)) {
        if (w.master_port >= 65535)
            return ddp__err(err, DDP_ERR_INVALID,
                            "MASTER_PORT=%d is torchrun's own store (TORCHELASTIC_USE_AGENT_STORE="
                            "%s), and ddpc's store goes on the next port, which does not exist; "
                            "give torchrun a lower --master_port",
                            w.master_port, v);
        w.master_port++;
        w.beside_torch_store = true;
    }
    if ((st = ddp__settings_from_env(&w.settings, err)))
        return st;
    *out = w;
    return DDP_OK;
}
