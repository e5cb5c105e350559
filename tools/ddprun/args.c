/*
 * args.c — ddprun's command line: torchrun's flags (FACTS.md), so scripts and habits carry over.
 * `--name=value` and `--name value`, dashes or underscores in names (`--nproc-per-node`). The
 * first argument that is not a flag is the program; it and everything after it pass untouched.
 * Python scripts run as torchrun runs them: a PROGRAM ending in .py (and --run_path's) through
 * `python3 -u`, --module/-m NAME as `python3 -u -m NAME`, --no_python runs PROGRAM itself.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sched.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ddp/ddp.h"
#include "ddprun.h"

static const char usage[] =
    "usage: ddprun [flags] PROGRAM [ARGS...]\n"
    "\n"
    "Starts PROGRAM once per worker with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,\n"
    "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) plus DDP_RUN_ID, DDP_STORE_TOKEN,\n"
    "DDP_RESTART_COUNT and DDP_MAX_RESTARTS, hosts the rendezvous store on node 0 (the workers\n"
    "find it on DDP_STORE_PORT; MASTER_PORT is a free port of node 0 left to a program's own\n"
    "store, as PyTorch's init_process_group makes on rank 0), and stops every worker as soon as\n"
    "one fails. ARGS are passed to PROGRAM untouched. Flags accept --a_b and\n"
    "--a-b, and '--flag value' or '--flag=value'.\n"
    "\n"
    "Workers\n"
    "  --nproc_per_node N|auto|cpu|gpu  workers on this node (default 1); cpu = cores available,\n"
    "                           gpu = GPUs visible, auto = gpu if any, else cpu\n"
    "  --role NAME              role name shown in summaries (default 'default')\n"
    "  --bind_to none|auto|core pin each worker to its own block of cores (the cores available\n"
    "                           divided by the workers), as mpirun does: auto pins when there\n"
    "                           are at least as many cores as workers, core insists (default\n"
    "                           none, as torchrun)\n"
    "  --isolate_gpus           each worker sees only its own GPU: CUDA_VISIBLE_DEVICES is set to\n"
    "                           the LOCAL_RANK-th visible GPU (wrapping when workers outnumber\n"
    "                           GPUs). Without it, as torchrun, every worker sees every GPU and\n"
    "                           libddp's GPU groups take GPU LOCAL_RANK (modulo the GPUs visible)\n"
    "\n"
    "Nodes and rendezvous\n"
    "  --nnodes N|MIN:MAX       number of nodes (default 1); MIN:MAX (with --rdzv_backend c10d)\n"
    "                           is torchrun's elastic range: the job starts with MAX nodes, or\n"
    "                           with MIN or more once none has come for last_call_timeout; a\n"
    "                           node that comes later, or one that dies, re-forms the group\n"
    "  --node_rank K            this node's index, 0..nnodes-1 (default 0); ranks are contiguous\n"
    "                           per node, nodes in node_rank order\n"
    "  --master_addr HOST       address of node 0, where the store runs (default 127.0.0.1)\n"
    "  --master_port PORT       port of the store (default 29500)\n"
    "  --rdzv_endpoint HOST:PORT  the same two in one flag; port 0: a free port (one node)\n"
    "  --standalone             one node, store on a free loopback port: no port conflicts\n"
    "  --run_id ID              job id, shown to workers as DDP_RUN_ID (default: random)\n"
    "  --rdzv_timeout S         seconds for all nodes to meet (default 300)\n"
    "  --rdzv_backend static|c10d  c10d without --node_rank: ddprun numbers the nodes (the one\n"
    "                           that can listen on the endpoint is node 0, hosting the store)\n"
    "  --rdzv_conf K=V,...      torchrun's: join_timeout=S is --rdzv_timeout; is_host=1|0 says\n"
    "                           whether this node hosts under c10d numbering;\n"
    "                           last_call_timeout=S (default 30) serves an elastic range; its\n"
    "                           other keys are accepted without effect\n"
    "  --local_addr ADDR        this node's address for the workers' data connections (tcp),\n"
    "                           e.g. a faster network's; default: the interface that routes\n"
    "                           toward the store\n"
    "  (without --master_addr / --master_port, MASTER_ADDR / MASTER_PORT from the environment\n"
    "  are used, as torchrun does; --standalone ignores them)\n"
    "\n"
    "Failures\n"
    "  --max_restarts N         restart the whole group up to N times after a failure (default 0)\n"
    "  --monitor_interval S     seconds between health checks across nodes (default 0.1)\n"
    "  --grace_period S         seconds between SIGTERM and SIGKILL when stopping workers\n"
    "                           (default 10)\n"
    "  --agent_timeout S        seconds without a heartbeat before another node's ddprun counts\n"
    "                           as dead (default 30)\n"
    "  --signals_to_handle L    torchrun's; accepted: ddprun always stops the job on SIGINT,\n"
    "                           SIGTERM, SIGHUP, SIGQUIT and passes SIGUSR1/SIGUSR2 on to the\n"
    "                           workers, the job going on\n"
    "  --start_method M         torchrun's (spawn, fork or forkserver); accepted without\n"
    "                           effect: workers are always fork+exec'd programs\n"
    "  --event_log_handler H    torchrun's; accepted without effect (ddprun's events are its\n"
    "                           own lines); --logs_specs, --numa_binding and\n"
    "                           --virtual_local_rank are refused, naming what to use instead\n"
    "\n"
    "Output\n"
    "  --log_dir DIR            also write each worker's output to\n"
    "                           DIR/RUN_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log\n"
    "                           (DIR/RUN_ID/node_N/attempt_K/... with --nnodes above 1;\n"
    "                           RUN_ID-2, -3... when an earlier run's folder is there)\n"
    "  -r, --redirects V        send streams to the log files only: 0 none, 1 stdout, 2 stderr,\n"
    "                           3 both; or per local rank, '0:1,1:2'\n"
    "  -t, --tee V              send streams to the log files and the console (same values)\n"
    "  --no_prefix              do not prefix console lines with '[rankN]: '\n"
    "  --log_line_prefix_template T  torchrun's: prefix every console line with T, where\n"
    "                           ${role_name}, ${rank} and ${local_rank} are the worker's (also\n"
    "                           with one worker), e.g. '[${role_name}${local_rank}]:'\n"
    "  --local_ranks_filter L   show only these local ranks on the console, e.g. '0' or '0,2'\n"
    "                           (the log files keep every rank; a failed rank's last lines are\n"
    "                           in the failure summary either way)\n"
    "\n"
    "Python programs (as torchrun)\n"
    "  PROGRAM.py               runs as 'python3 -u PROGRAM.py' (PYTHON_EXEC, else python3\n"
    "                           from PATH)\n"
    "  -m, --module NAME        runs 'python3 -u -m NAME'\n"
    "  --run_path               PROGRAM is a Python script whatever its name\n"
    "  --no_python              run PROGRAM itself, even a .py (its #! line decides)\n"
    "\n"
    "torch.distributed.launch\n"
    "  --use_env                accepted and changes nothing: LOCAL_RANK is always set\n"
    "                           (with --pass_local_rank: a usage error)\n"
    "  --pass_local_rank STYLE  also give each worker its local rank as the first argument after\n"
    "                           the program (the script):\n"
    "                           underscore: --local_rank=N (torch.distributed.launch before\n"
    "                           PyTorch 2.0); dash: --local-rank=N (2.0 and later)\n"
    "\n"
    "  -h, --help               this help;  --version  ddpc's version\n"
    "\n"
    "Environment: when OMP_NUM_THREADS / OPENBLAS_NUM_THREADS are unset, each worker gets the "
    "cores\n"
    "available divided by the workers on this node. Across nodes, set DDP_STORE_TOKEN to the same\n"
    "secret on every node so that the store refuses strangers (one node makes its own).\n"
    "A flag left out is read from PET_<FLAG> (PET_NPROC_PER_NODE=4, PET_STANDALONE=1), as\n"
    "torchrun does.\n"
    "Exit status: 0 when every worker exits 0; 1 when a worker failed; 128+N after signal N; 2 "
    "for\n"
    "a usage error.\n";

/* While env_flags applies a PET_<FLAG> value: the variable and the flag, so that bad() names
 * where a refused value came from in the refusal's own line (a second line after "see
 * 'ddprun --help'" said it until 2026-11-25, and a PET_RDZV_ID was refused as "--run_id").
 * File-scope state, against the house rule, because the parser runs once, on one thread, before
 * anything else, and threading it through every apply_value message would hide the messages. */
static struct {
    const char *var, *flag;
} value_from;

static int bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad(const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (value_from.var) /* the command line's help does not help: the environment holds it */
        fprintf(stderr,
                "ddprun: %s; that value came from %s in the environment, which torchrun reads "
                "for --%s: correct or unset %s\n",
                msg, value_from.var, value_from.flag, value_from.var);
    else
        fprintf(stderr, "ddprun: %s\nddprun: see 'ddprun --help'\n", msg);
    return -1;
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || errno || *end || !(v >= 0) || v > 2e6)
        return false;
    *out = v;
    return true;
}

/* The GPUs this process may use, as CUDA names them: CUDA_VISIBLE_DEVICES's entries when it is
 * set (indices or UUIDs, up to the first invalid one, as CUDA reads it), else the indices of the
 * /dev/nvidiaN devices, 0..n-1. Fills ids (up to max, DDPRUN_GPU_ID bytes each); returns how many.
 * Setting CUDA_VISIBLE_DEVICES is also how tests give ddprun a GPU count on a machine without
 * GPUs: the launcher reads only the variable, it does not ask the driver. */
static int gpus_visible(char (*ids)[DDPRUN_GPU_ID], int max)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (v) {
        for (const char *p = v; *p;) {
            while (*p == ',' || *p == ' ')
                p++;
            if (!*p || *p == '-') /* "-1" hides all devices */
                break;
            size_t len = strcspn(p, ", ");
            if (ids && n < max)
                snprintf(ids[n], DDPRUN_GPU_ID, "%.*s", (int)len, p);
            n++;
            p += len;
        }
        return n < max || !ids ? n : max;
    }
    DIR *d = opendir("/dev");
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *s = e->d_name;
        if (strncmp(s, "nvidia", 6) == 0 && s[6] >= '0' && s[6] <= '9' &&
            strspn(s + 6, "0123456789") == strlen(s + 6))
            n++;
    }
    closedir(d);
    if (n > max && ids)
        n = max;
    for (int i = 0; ids && i < n; i++)
        snprintf(ids[i], DDPRUN_GPU_ID, "%d", i);
    return n;
}

static int parse_nproc(const char *v, int *out)
{
    long n;
    if (strcmp(v, "cpu") == 0) {
        *out = ddp_own_cores();
    } else if (strcmp(v, "gpu") == 0) {
        *out = gpus_visible(NULL, 0);
        if (*out == 0)
            return bad("--nproc_per_node=gpu: no GPU is visible (no /dev/nvidiaN, or "
                       "CUDA_VISIBLE_DEVICES hides them); use a number or 'cpu'");
    } else if (strcmp(v, "auto") == 0) {
        int g = gpus_visible(NULL, 0);
        *out = g > 0 ? g : ddp_own_cores();
    } else if (parse_long(v, 1, DDPRUN_MAX_NPROC, &n)) {
        *out = (int)n;
    } else {
        return bad("--nproc_per_node '%s' is not a number from 1 to %d, auto, cpu or gpu", v,
                   DDPRUN_MAX_NPROC);
    }
    if (*out > DDPRUN_MAX_NPROC)
        *out = DDPRUN_MAX_NPROC;
    return 0;
}

/* torchrun's --redirects/--tee: "3" for every local rank, or "0:1,1:2" per local rank. */
static int parse_std(const char *flag, const char *v, int *per_rank)
{
    long x;
    if (parse_long(v, 0, 3, &x)) {
        for (int i = 0; i < DDPRUN_MAX_NPROC; i++)
            per_rank[i] = (int)x;
        return 0;
    }
    char buf[8192];
    if (strlen(v) >= sizeof buf)
        return bad("--%s: the per-rank list is longer than %zu characters", flag, sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        long r;
        if (!colon)
            return bad("--%s '%s': expected 0-3, or LOCAL_RANK:VALUE pairs like '0:1,1:2'", flag,
                       v);
        *colon = '\0';
        if (!parse_long(item, 0, DDPRUN_MAX_NPROC - 1, &r) || !parse_long(colon + 1, 0, 3, &x))
            return bad("--%s '%s': expected 0-3, or LOCAL_RANK:VALUE pairs like '0:1,1:2'", flag,
                       v);
        per_rank[r] = (int)x;
    }
    return 0;
}

/* torchrun's --local_ranks_filter: "0" or "0,2"; "" is no filter, as there. Checked against
 * --nproc_per_node at the end. */
static int parse_filter(const char *v, ddprun_opts *o)
{
    char buf[8192];
    if (strlen(v) >= sizeof buf)
        return bad("--local_ranks_filter: longer than %zu characters", sizeof buf - 1);
    memset(o->shown, 0, sizeof o->shown);
    o->ranks_filter = *v != '\0';
    if (!o->ranks_filter)
        return 0;
    snprintf(buf, sizeof buf, "%s", v);
    /* every item between commas, empty ones included: "0,,1" and "," are refused */
    for (char *item = buf, *next; item; item = next) {
        next = strchr(item, ',');
        if (next)
            *next++ = '\0';
        long r;
        if (!parse_long(item, 0, DDPRUN_MAX_NPROC - 1, &r))
            return bad("--local_ranks_filter '%s': '%s' is not a local rank; expected local "
                       "ranks separated by commas, e.g. '0' or '0,2'",
                       v, item);
        o->shown[r] = true;
    }
    return 0;
}

/* 0.0.0.0 or :: */
static bool wildcard(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    return sa->sa_family == AF_INET6 &&
           IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

/* --local_addr must be this host's: binding a socket to it says so before anything starts. */
static int check_local_addr(const char *v)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int rc = getaddrinfo(v, "0", &hints, &res);
    if (rc != 0)
        return bad("--local_addr '%s': %s", v, gai_strerror(rc));
    int why = 0;
    bool ok = false;
    for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            why = errno;
            continue;
        }
        ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        if (!ok)
            why = errno;
        close(fd);
        if (ok && wildcard(ai->ai_addr)) {
            freeaddrinfo(res);
            return bad("--local_addr '%s' is the wildcard address, which the other ranks cannot "
                       "connect to; give one of this host's own addresses (ip -brief address)",
                       v);
        }
    }
    freeaddrinfo(res);
    if (!ok)
        return bad("--local_addr '%s' is not an address of this host (%s); give one of its own "
                   "interfaces' addresses (ip -brief address)",
                   v, strerror(why));
    return 0;
}

static int lookup(const char *const *table, const char *name)
{
    for (int i = 0; table[i]; i++)
        if (strcmp(table[i], name) == 0)
            return i;
    return -1;
}

/* s without its leading and trailing blanks (in place) */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* torchrun's --rdzv_conf KEY=VALUE,...: join_timeout (and timeout) are --rdzv_timeout; the keys
 * of torchrun's elastic rendezvous that ddprun has no use for are accepted with one line saying
 * so; anything else is a usage error. */
static int parse_rdzv_conf(const char *v, ddprun_opts *o)
{
    static const char *const unused[] = {"read_timeout",
                                         "last_call_timeout",
                                         "close_timeout",
                                         "keep_alive_interval",
                                         "keep_alive_max_attempt",
                                         "heartbeat",
                                         "store_type",
                                         "use_libuv",
                                         NULL};
    char buf[4096];
    char *ignored = o->rdzv_ignored;
    if (strlen(v) >= sizeof buf)
        return bad("--rdzv_conf: longer than %zu characters", sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", v);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq)
            *eq++ = '\0';
        item = trim(item);
        if (!eq || !*item || !*(eq = trim(eq)))
            return bad("--rdzv_conf '%s': expected KEY=VALUE pairs separated by commas, e.g. "
                       "'join_timeout=900'",
                       v);
        double d;
        if (!strcmp(item, "last_call_timeout")) {
            /* used by an elastic range (--nnodes MIN:MAX); said to be without effect otherwise */
            o->last_call_timeout = parse_seconds(eq, &d) ? d : -1; /* -1: refused if used */
        }
        if (!strcmp(item, "join_timeout") || !strcmp(item, "timeout")) {
            if (!parse_seconds(eq, &d))
                return bad("--rdzv_conf %s='%s' is not a number of seconds", item, eq);
            o->rdzv_timeout = d;
        } else if (!strcmp(item, "is_host")) {
            /* torchrun's: whether this node hosts the c10d store (else it matches the endpoint's
             * host with its own names); here it matters where ddprun numbers the nodes */
            if (!strcasecmp(eq, "1") || !strcasecmp(eq, "true") || !strcasecmp(eq, "yes"))
                o->is_host = 1;
            else if (!strcasecmp(eq, "0") || !strcasecmp(eq, "false") || !strcasecmp(eq, "no"))
                o->is_host = 0;
            else
                return bad("--rdzv_conf is_host='%s': use 1 or 0 (true or false)", eq);
        } else if (lookup(unused, item) >= 0) {
            size_t n = strlen(ignored);
            snprintf(ignored + n, sizeof o->rdzv_ignored - n, "%s%s", n ? ", " : "", item);
        } else {
            return bad("--rdzv_conf key '%s' is unknown; ddprun takes join_timeout (its "
                       "--rdzv_timeout) and accepts torchrun's other keys without effect",
                       item);
        }
    }
    return 0;
}

/* The note on --rdzv_conf's keys without effect, once every flag is read: an elastic range uses
 * last_call_timeout. */
static void say_rdzv_ignored(const ddprun_opts *o)
{
    char list[sizeof o->rdzv_ignored] = "", copy[sizeof o->rdzv_ignored];
    snprintf(copy, sizeof copy, "%s", o->rdzv_ignored);
    char *save = NULL;
    for (char *k = strtok_r(copy, ", ", &save); k; k = strtok_r(NULL, ", ", &save)) {
        if (o->elastic && !strcmp(k, "last_call_timeout"))
            continue;
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", k);
    }
    if (*list)
        fprintf(stderr,
                "ddprun: --rdzv_conf %s: torchrun's elastic rendezvous settings, without effect "
                "on ddprun's %s rendezvous (see --agent_timeout, --monitor_interval)\n",
                list, o->elastic ? "elastic" : "fixed");
}

static int copy_str(const char *flag, const char *v, char *dst, size_t cap)
{
    if (strlen(v) >= cap)
        return bad("--%s: value longer than %zu characters", flag, cap - 1);
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

/* --master_addr or MASTER_ADDR (what names it in a message): a host alone. An IPv6 address may
 * come in brackets, as in --rdzv_endpoint ([::1] is ::1: before 2026-11-25 '[::1]' was looked up
 * as a host name and failed); a port belongs in --master_port, so "host:port" and "[::1]:port"
 * are usage errors rather than a name that cannot resolve. */
static int copy_addr(const char *what, const char *v, char *dst, size_t cap)
{
    const char *colon = strchr(v, ':'), *close = strchr(v, ']');
    bool bracketed = v[0] == '[' && close && close > v + 1;
    if ((bracketed && close[1] == ':') || (!bracketed && colon && !strchr(colon + 1, ':')))
        return bad("%s '%s' holds a port: give the host alone and the port with --master_port "
                   "(or both as --rdzv_endpoint HOST:PORT)",
                   what, v);
    if ((v[0] == '[' && (!bracketed || close[1])) || (v[0] != '[' && close) || !*v)
        return bad("%s '%s' is not a host name or address; write an IPv6 address bare or in "
                   "brackets, e.g. ::1 or [::1]",
                   what, v);
    size_t n = bracketed ? (size_t)(close - v - 1) : strlen(v);
    if (n >= cap)
        return bad("%s: value longer than %zu characters", what, cap - 1);
    memcpy(dst, bracketed ? v + 1 : v, n);
    dst[n] = '\0';
    return 0;
}

/* Flags that take a value; index into the switch below. */
static const char *const valued[] = {
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "max_restarts",
    "monitor_interval",
    "redirects",
    "tee",
    "log_dir",
    "run_id",
    "rdzv_id",
    "role",
    "rdzv_endpoint",
    "rdzv_timeout",
    "grace_period",
    "agent_timeout",
    "rdzv_backend",
    "start_method",
    "bind_to",
    "pass_local_rank",
    "local_ranks_filter",
    "local_addr",
    "rdzv_conf",
    "signals_to_handle",
    "log_line_prefix_template",
    "event_log_handler",
    "logs_specs",
    "numa_binding",
    NULL,
};
static const char *const switches[] = {
    "standalone", "no_prefix", "help",         "version",  "no_python",
    "module",     "use_env",   "isolate_gpus", "run_path", "virtual_local_rank",
    NULL};

/* An unknown flag: the usage error, with the closest known flag when one is near. Returns -1. */
static int unknown_flag(const char *given, const char *name, const char *const *valued_flags,
                        const char *const *switch_flags)
{
    const char *best = NULL;
    size_t best_d = 99;
    const char *const *tables[] = {valued_flags, switch_flags};
    for (int t = 0; t < 2; t++)
        for (int i = 0; tables[t][i]; i++) {
            size_t d = ddp_config_edit_distance(name, tables[t][i]);
            /* a prefix (--nproc for --nproc_per_node) counts as near too */
            if (strncmp(tables[t][i], name, strlen(name)) == 0 && strlen(name) >= 4)
                d = d < 2 ? d : 2;
            if (d < best_d) {
                best_d = d;
                best = tables[t][i];
            }
        }
    if (best && best_d <= 1 + strlen(name) / 4)
        return bad("unknown flag '%s'; did you mean '--%s'?", given, best);
    return bad("unknown flag '%s'", given);
}

static int apply_value(ddprun_opts *o, const char *name, const char *v, bool *port_set)
{
    long x;
    double d;
    if (strcmp(name, "nproc_per_node") == 0)
        return parse_nproc(v, &o->nproc);
    if (strcmp(name, "nnodes") == 0) {
        const char *colon = strchr(v, ':');
        long lo = 0;
        if (colon) { /* torchrun's MIN:MAX; N:N is N */
            char buf[32];
            snprintf(buf, sizeof buf, "%.*s", (int)(colon - v), v);
            if (!parse_long(buf, 1, 65536, &lo) || !parse_long(colon + 1, 1, 65536, &x))
                return bad("--nnodes '%s': expected N or MIN:MAX, numbers from 1 to 65536", v);
            if (lo > x)
                return bad("--nnodes '%s': MIN is above MAX", v);
            o->nnodes = (int)x;
            o->min_nodes = (int)lo;
            o->elastic = lo < x;
            return 0;
        }
        if (!parse_long(v, 1, 65536, &x))
            return bad("--nnodes '%s' is not a number from 1 to 65536", v);
        o->nnodes = o->min_nodes = (int)x;
        o->elastic = false;
        return 0;
    }
    if (strcmp(name, "node_rank") == 0) {
        if (!parse_long(v, 0, 65535, &x))
            return bad("--node_rank '%s' is not a number from 0 to 65535", v);
        o->node_rank = (int)x;
        o->node_rank_given = true;
        return 0;
    }
    if (strcmp(name, "master_addr") == 0)
        return copy_addr("--master_addr", v, o->master_addr, sizeof o->master_addr);
    if (strcmp(name, "master_port") == 0) {
        if (!parse_long(v, 1, 65535, &x))
            return bad("--master_port '%s' is not a port number (1-65535)", v);
        o->master_port = (int)x;
        *port_set = true;
        return 0;
    }
    if (strcmp(name, "rdzv_endpoint") == 0) {
        /* HOST, HOST:PORT, an IPv6 address in brackets ([::1] or [::1]:29500, torchrun's
         * form), or a bare IPv6 address (two colons or more: no port) */
        char host[256];
        const char *colon;
        /* '' is torchrun's default (no endpoint given); an empty host before a port made the
         * store listen on every interface and gave the workers an empty MASTER_ADDR (torchrun
         * refuses it) */
        if (!*v)
            return 0;
        if (v[0] == ':' && !strchr(v + 1, ':')) /* (::1 is a bare IPv6 address) */
            return bad("--rdzv_endpoint '%s': no host before the port; give HOST:PORT, e.g. "
                       "localhost:29500 (or the node 0 host's name or address)",
                       v);
        if (v[0] == '[') {
            const char *close = strchr(v, ']');
            if (!close || close == v + 1 || (close[1] && close[1] != ':'))
                return bad("--rdzv_endpoint '%s': an IPv6 address goes in brackets, "
                           "e.g. '[::1]:29500'",
                           v);
            snprintf(host, sizeof host, "%.*s", (int)(close - v - 1), v + 1);
            if (copy_str(name, host, o->master_addr, sizeof o->master_addr) != 0)
                return -1;
            if (!close[1])
                return 0;
            colon = close + 1;
        } else {
            colon = strrchr(v, ':');
            if (!colon || strchr(v, ':') != colon)
                return copy_str(name, v, o->master_addr, sizeof o->master_addr);
            snprintf(host, sizeof host, "%.*s", (int)(colon - v), v);
            if (copy_str(name, host, o->master_addr, sizeof o->master_addr) != 0)
                return -1;
        }
        /* Port 0 is torchrun's own spelling of "a free port" (its --standalone is
         * --rdzv_endpoint localhost:0, and its docs give that form for single-node jobs);
         * checked against --nnodes once every flag is read. */
        if (!parse_long(colon + 1, 0, 65535, &x))
            return bad("--rdzv_endpoint '%s': '%s' is not a port number (1-65535, or 0 for a "
                       "free port on one node)",
                       v, colon + 1);
        o->master_port = (int)x;
        *port_set = true;
        return 0;
    }
    if (strcmp(name, "max_restarts") == 0) {
        if (!parse_long(v, 0, 1000000, &x))
            return bad("--max_restarts '%s' is not a number ≥ 0", v);
        o->max_restarts = (int)x;
        return 0;
    }
    if (strcmp(name, "redirects") == 0 || strcmp(name, "tee") == 0) {
        o->want_files = true;
        return parse_std(name, v, name[0] == 'r' ? o->redirects : o->tee);
    }
    if (strcmp(name, "log_dir") == 0) {
        if (!*v)
            return bad("--log_dir is empty");
        o->want_files = true;
        return copy_str(name, v, o->log_dir, sizeof o->log_dir - 200);
    }
    if (strcmp(name, "run_id") == 0 || strcmp(name, "rdzv_id") == 0) {
        if (!*v || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
                       strlen(v))
            return bad("--%s '%s': use letters, digits, '_', '.' and '-' (it names ddprun's log "
                       "folder and shared-memory segments)",
                       name, v);
        if (strcmp(v, ".") == 0 || strcmp(v, "..") == 0) /* would name log_dir or its parent */
            return bad("--%s '%s' names a folder outside --log_dir's run folders; give a "
                       "name such as 'job1'",
                       name, v);
        o->run_id_set = true;
        return copy_str(name, v, o->run_id, sizeof o->run_id);
    }
    if (strcmp(name, "role") == 0)
        return copy_str(name, v, o->role, sizeof o->role);
    if (strcmp(name, "rdzv_backend") == 0) {
        if (strcmp(v, "static") && strcmp(v, "c10d") && strcmp(v, "ddp"))
            return bad("--rdzv_backend '%s': ddprun has one rendezvous (its own store); "
                       "'static' and 'c10d' are accepted (c10d numbers the nodes when "
                       "--node_rank is not given)",
                       v);
        o->rdzv_c10d = strcmp(v, "static") != 0;
        return 0;
    }
    if (strcmp(name, "bind_to") == 0) {
        if (!strcmp(v, "auto"))
            o->bind = BIND_AUTO;
        else if (!strcmp(v, "core"))
            o->bind = BIND_CORE;
        else if (!strcmp(v, "none"))
            o->bind = BIND_NONE;
        else
            return bad("--bind_to '%s': use auto, core or none", v);
        return 0;
    }
    if (strcmp(name, "pass_local_rank") == 0) {
        if (!strcmp(v, "underscore") || !strcmp(v, "--local_rank"))
            o->pass_local_rank = PASS_LOCAL_RANK_UNDERSCORE;
        else if (!strcmp(v, "dash") || !strcmp(v, "--local-rank"))
            o->pass_local_rank = PASS_LOCAL_RANK_DASH;
        else if (!strcmp(v, "none"))
            o->pass_local_rank = PASS_LOCAL_RANK_NONE;
        else
            return bad("--pass_local_rank '%s': use underscore (--local_rank=N, "
                       "torch.distributed.launch before PyTorch 2.0), dash (--local-rank=N, 2.0 "
                       "and later) or none",
                       v);
        return 0;
    }
    if (strcmp(name, "rdzv_conf") == 0)
        return parse_rdzv_conf(v, o);
    if (strcmp(name, "signals_to_handle") == 0) {
        /* torchrun's (2.5+) list of signals it handles; ddprun handles all of these always */
        static const char *const known[] = {"SIGINT",  "SIGTERM", "SIGHUP", "SIGQUIT",
                                            "SIGUSR1", "SIGUSR2", NULL};
        char buf[512];
        if (strlen(v) >= sizeof buf)
            return bad("--signals_to_handle: longer than %zu characters", sizeof buf - 1);
        snprintf(buf, sizeof buf, "%s", v);
        char *save = NULL;
        for (char *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
            s = trim(s);
            char full[64];
            snprintf(full, sizeof full, "%s%s", strncasecmp(s, "SIG", 3) ? "SIG" : "", s);
            for (char *p = full; *p; p++)
                *p = (char)toupper((unsigned char)*p);
            if (lookup(known, full) < 0)
                return bad("--signals_to_handle: '%s' is not one ddprun handles; it always "
                           "handles SIGINT, SIGTERM, SIGHUP and SIGQUIT (the job stops) and "
                           "SIGUSR1 and SIGUSR2 (passed on to the workers, the job goes on)",
                           s);
        }
        return 0;
    }
    if (strcmp(name, "local_ranks_filter") == 0)
        return parse_filter(v, o);
    /* torchrun's newer flags: its event log handler (null or console) only logs its own
     * events, so any is accepted without effect; the others have no ddprun counterpart. */
    if (strcmp(name, "event_log_handler") == 0)
        return 0;
    if (strcmp(name, "logs_specs") == 0)
        return bad("--logs_specs '%s': ddprun has no log-layout plugins (torchrun's are Python "
                   "entry points); its layout is --log_dir DIR/RUN_ID/attempt_K/LOCAL_RANK/",
                   v);
    if (strcmp(name, "numa_binding") == 0)
        return bad("--numa_binding '%s' is not supported; --bind_to core pins each worker to "
                   "its own block of cores (the cores available divided by the workers)",
                   v);
    if (strcmp(name, "log_line_prefix_template") == 0) {
        /* Python's string.Template, as torchrun expands it: only its three names. */
        for (const char *p = strchr(v, '$'); p; p = strchr(p + 1, '$')) {
            if (p[1] == '$') { /* "$$" is a dollar sign */
                p++;
                continue;
            }
            size_t n = 0;
            if (!ddprun_template_name(p, &n))
                return bad("--log_line_prefix_template '%s': '%.20s' is not one of ${role_name}, "
                           "${rank}, ${local_rank} (write $$ for a dollar sign)",
                           v, p);
        }
        return copy_str(name, v, o->prefix_template, sizeof o->prefix_template);
    }
    if (strcmp(name, "local_addr") == 0) {
        if (!*v)
            return bad("--local_addr is empty");
        return copy_str(name, v, o->local_addr, sizeof o->local_addr);
    }
    if (strcmp(name, "start_method") == 0) {
        /* Workers are always fork+exec: there is no interpreter to spawn. A value torchrun
         * would refuse is refused too, rather than taken silently. */
        if (strcmp(v, "spawn") && strcmp(v, "fork") && strcmp(v, "forkserver"))
            return bad("--start_method '%s': torchrun's values are spawn, fork and forkserver "
                       "(ddprun accepts them without effect: its workers are fork+exec'd "
                       "programs)",
                       v);
        return 0;
    }
    double *dst = strcmp(name, "monitor_interval") == 0 ? &o->monitor_interval
                  : strcmp(name, "rdzv_timeout") == 0   ? &o->rdzv_timeout
                  : strcmp(name, "grace_period") == 0   ? &o->grace_period
                                                        : &o->agent_timeout;
    if (!parse_seconds(v, &d))
        return bad("--%s '%s' is not a number of seconds", name, v);
    *dst = d;
    return 0;
}

/* The switches that say how to run a Python program (see ddprun_parse_args). */
typedef struct python_flags {
    bool no_python, module, run_path;
} python_flags;

static void set_switch(ddprun_opts *o, const char *name, python_flags *py)
{
    if (strcmp(name, "no_python") == 0)
        py->no_python = true;
    else if (strcmp(name, "module") == 0)
        py->module = true;
    else if (strcmp(name, "run_path") == 0)
        py->run_path = true; /* torchrun runs it in its own interpreter; ours is python3 */
    else if (strcmp(name, "standalone") == 0)
        o->standalone = true;
    else if (strcmp(name, "use_env") == 0)
        o->use_env = true;
    else if (strcmp(name, "isolate_gpus") == 0)
        o->isolate_gpus = true;
    else if (strcmp(name, "no_prefix") == 0)
        o->no_prefix = true;
    else if (strcmp(name, "virtual_local_rank") == 0)
        o->virtual_local_rank = true; /* refused once every flag is read */
}

/* PET_<NAME> for a flag name */
static void pet_name(const char *name, char *var, size_t cap)
{
    snprintf(var, cap, "PET_");
    size_t j = strlen(var);
    for (size_t i = 0; name[i] && j + 1 < cap; i++)
        var[j++] = (char)toupper((unsigned char)name[i]);
    var[j] = '\0';
}

/* Whether PET_<name> is to be left alone: the command line set the same thing under this name
 * or another (--rdzv_endpoint is --master_addr and --master_port in one; --rdzv_id is --run_id;
 * a PET_RDZV_ENDPOINT wins over PET_MASTER_ADDR/PORT, as torchrun's endpoint does), or
 * --standalone picks it (the store's address, the rendezvous, one node: torchrun ignores them
 * then too). */
static bool pet_covered(const char *name, const ddprun_opts *o, const bool *seen_valued)
{
#define SEEN(N) seen_valued[lookup(valued, N)]
    bool ep = !strcmp(name, "rdzv_endpoint"), addr = !strcmp(name, "master_addr"),
         port = !strcmp(name, "master_port");
    if (o->standalone &&
        (ep || addr || port || !strcmp(name, "nnodes") || !strcmp(name, "node_rank") ||
         !strcmp(name, "rdzv_backend") || !strcmp(name, "rdzv_id")))
        return true;
    if (ep)
        return SEEN("master_addr") || SEEN("master_port");
    if (addr || port) {
        char var[80];
        pet_name("rdzv_endpoint", var, sizeof var);
        return SEEN("rdzv_endpoint") || (getenv(var) && *getenv(var));
    }
    if (!strcmp(name, "rdzv_id"))
        return SEEN("run_id");
    if (!strcmp(name, "run_id"))
        return SEEN("rdzv_id");
    return false;
#undef SEEN
}

/* torchrun reads every flag the command line leaves out from PET_<FLAG> (PET_NPROC_PER_NODE=4,
 * PET_STANDALONE=1), which is how Kubernetes' PyTorchJob configures it: so does ddprun, a flag
 * on the command line winning. The ones taken are named in one line. The switches first, so
 * that a PET_STANDALONE=1 is known when the store's address is considered. */
static int env_flags(ddprun_opts *o, const bool *seen_valued, const bool *seen_switch,
                     python_flags *py, bool *port_set, bool *addr_flag)
{
    char taken[512] = "";
    for (int t = 1; t >= 0; t--) {
        const char *const *table = t == 0 ? valued : switches;
        for (int k = 0; table[k]; k++) {
            const char *name = table[k];
            if ((t == 0 ? seen_valued : seen_switch)[k] || !strcmp(name, "help") ||
                !strcmp(name, "version") || (t == 0 && pet_covered(name, o, seen_valued)))
                continue;
            /* a rendezvous given on the command line wins over a PET_STANDALONE=1 */
            if (t == 1 && !strcmp(name, "standalone")) {
                static const char *const rdzv[] = {"nnodes",      "node_rank",     "master_addr",
                                                   "master_port", "rdzv_endpoint", "rdzv_backend",
                                                   NULL};
                bool given = false;
                for (int r = 0; rdzv[r]; r++)
                    given = given || seen_valued[lookup(valued, rdzv[r])];
                if (given)
                    continue;
            }
            char var[80];
            pet_name(name, var, sizeof var);
            const char *v = getenv(var);
            if (!v || (!*v && t == 1))
                continue;
            if (t == 1) { /* torchrun's check_env: an integer, nonzero = on */
                long on;
                if (!parse_long(v, LONG_MIN, LONG_MAX, &on))
                    return bad("%s='%s' in the environment: use 1 or 0 (torchrun's --%s)", var, v,
                               name);
                if (on)
                    set_switch(o, name, py);
            } else {
                value_from.var = var;
                value_from.flag = name;
                int rc = apply_value(o, name, v, port_set);
                value_from.var = value_from.flag = NULL;
                if (rc != 0)
                    return -1;
                *addr_flag =
                    *addr_flag || !strcmp(name, "master_addr") || !strcmp(name, "rdzv_endpoint");
            }
            size_t l = strlen(taken);
            if (l + strlen(var) + 4 < sizeof taken)
                snprintf(taken + l, sizeof taken - l, "%s%s", l ? ", " : "", var);
        }
    }
    if (*taken)
        fprintf(stderr, "ddprun: flags from the environment, as torchrun takes them: %s\n", taken);
    return 0;
}

int ddprun_parse_args(int argc, char **argv, ddprun_opts *o)
{
    python_flags py = {false, false, false};
    bool seen_valued[sizeof valued / sizeof valued[0]] = {false};
    bool seen_switch[sizeof switches / sizeof switches[0]] = {false};
    memset(o, 0, sizeof *o);
    o->nproc = 1;
    o->nnodes = o->min_nodes = 1;
    o->last_call_timeout = 30; /* torch's c10d rendezvous default */
    snprintf(o->master_addr, sizeof o->master_addr, "%s", DDP_DEFAULT_MASTER_ADDR);
    o->master_port = DDP_DEFAULT_MASTER_PORT;
    o->monitor_interval = 0.1;
    o->grace_period = 10;
    o->rdzv_timeout = 300;
    o->agent_timeout = 30;
    o->bind = BIND_NONE;
    o->is_host = -1;
    snprintf(o->role, sizeof o->role, "default");
    bool port_set = false;
    bool addr_flag = false;
    long port_env;

    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 1;
        }
        /* torchrun's one-letter flags: -m (--module), -r (--redirects), -t (--tee). */
        if (strcmp(a, "-m") == 0)
            a = "--module";
        else if (strcmp(a, "-r") == 0)
            a = "--redirects";
        else if (strcmp(a, "-t") == 0)
            a = "--tee";
        else if ((!strncmp(a, "-r", 2) || !strncmp(a, "-t", 2)) && a[2] >= '0' &&
                 a[2] <= '9') { /* -r3, -t0:1,1:2 */
            const char *v = a + 2;
            const char *nm = a[1] == 'r' ? "redirects" : "tee";
            seen_valued[lookup(valued, nm)] = true;
            if (apply_value(o, nm, v, &port_set) != 0)
                return -1;
            continue;
        }
        if (a[0] == '-' && a[1] != '-' && a[1]) /* not a program: a flag with one dash */
            return bad("unknown flag '%s' (ddprun's flags start with '--', e.g. '-%s'; the "
                       "one-letter ones are -h, -m, -r and -t)",
                       a, a);
        if (a[0] != '-' || a[1] != '-')
            break; /* the program */
        char name[64];
        const char *eq = strchr(a, '=');
        size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (n == 0 || n >= sizeof name)
            return bad("unknown flag '%s'", a);
        memcpy(name, a + 2, n);
        name[n] = '\0';
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        if (lookup(switches, name) >= 0) {
            if (eq)
                return bad("flag '--%s' takes no value", name);
            if (strcmp(name, "help") == 0) {
                fputs(usage, stdout);
                return 1;
            }
            if (strcmp(name, "version") == 0) {
                printf("ddprun (ddpc) %s\n", DDP_VERSION_STRING);
                return 1;
            }
            seen_switch[lookup(switches, name)] = true;
            set_switch(o, name, &py);
            continue;
        }
        if (lookup(valued, name) < 0)
            return unknown_flag(a, name, valued, switches);
        seen_valued[lookup(valued, name)] = true;
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v)
            return bad("flag '--%s' needs a value", name);
        if (apply_value(o, name, v, &port_set) != 0)
            return -1;
        addr_flag = addr_flag || !strcmp(name, "master_addr") || !strcmp(name, "rdzv_endpoint");
    }
    if (i >= argc)
        return bad("no program to run: 'ddprun [flags] PROGRAM [ARGS...]'");
    o->argv = argv + i;
    if (env_flags(o, seen_valued, seen_switch, &py, &port_set, &addr_flag) != 0)
        return -1;
    bool no_python = py.no_python, module = py.module, run_path = py.run_path;
    /* As torchrun: a Python script runs through the interpreter, unbuffered (-u), unless
     * --no_python; -m runs a module. torchrun's interpreter is its own; ours is PATH's python3
     * (an active virtual environment's), or give one: 'ddprun --no_python /path/python3 x.py'. */
    if ((module || run_path) && no_python)
        return bad("--%s and --no_python together: --%s runs PROGRAM with python3, --no_python "
                   "runs PROGRAM itself; choose one",
                   module ? "module" : "run_path", module ? "module" : "run_path");
    if (module && run_path)
        return bad("--module and --run_path together: a module name or a script's path; choose "
                   "one");
    size_t plen = strlen(o->argv[0]);
    if (module || run_path || (!no_python && plen > 3 && !strcmp(o->argv[0] + plen - 3, ".py"))) {
        const char *exec = getenv("PYTHON_EXEC"); /* torchrun's override of its interpreter */
        o->python[o->npython++] = exec && *exec ? exec : "python3";
        o->python[o->npython++] = "-u";
        if (module)
            o->python[o->npython++] = "-m";
    }
    if (o->use_env && o->pass_local_rank != PASS_LOCAL_RANK_NONE)
        return bad("--use_env says the program reads LOCAL_RANK from its environment, "
                   "--pass_local_rank gives it as an argument: choose one");

    /* As torchrun: MASTER_ADDR / MASTER_PORT from our own environment when the flags are absent
     * (flag > environment > default); --standalone picks its own and ignores them. */
    const char *ev;
    if (!o->standalone && !addr_flag && (ev = getenv("MASTER_ADDR")) && *ev) {
        if (copy_addr("MASTER_ADDR in the environment", ev, o->master_addr,
                      sizeof o->master_addr) != 0)
            return -1;
    }
    if (!o->standalone && !port_set && (ev = getenv("MASTER_PORT")) && *ev) {
        if (!parse_long(ev, 1, 65535, &port_env))
            return bad("MASTER_PORT='%s' in the environment is not a port number (1-65535); "
                       "unset it or pass --master_port",
                       ev);
        o->master_port = (int)port_env;
    }
    if (o->virtual_local_rank)
        return bad("--virtual_local_rank is not supported: libddp finds a worker's peers on its "
                   "host by LOCAL_RANK, which it would set to 0 in every worker; --isolate_gpus "
                   "gives each worker only its own GPU (CUDA_VISIBLE_DEVICES), LOCAL_RANK kept");
    if (o->no_prefix && o->prefix_template[0])
        return bad("--no_prefix and --log_line_prefix_template: choose one");
    if (o->isolate_gpus) {
        o->ngpus = gpus_visible(o->gpu_ids, DDPRUN_MAX_GPUS);
        if (o->ngpus == 0)
            return bad("--isolate_gpus: no GPU is visible (no /dev/nvidiaN, or "
                       "CUDA_VISIBLE_DEVICES hides them); drop the flag to run on CPUs");
    }

    if (o->standalone) {
        if (o->nnodes != 1) {
            if (o->min_nodes != o->nnodes) /* an elastic range: say it as given */
                return bad("--standalone runs one node; it cannot be combined with --nnodes "
                           "%d:%d (an elastic range needs --rdzv_backend c10d and "
                           "--rdzv_endpoint instead)",
                           o->min_nodes, o->nnodes);
            return bad("--standalone runs one node; it cannot be combined with --nnodes %d",
                       o->nnodes);
        }
        if (port_set && o->master_port != 0) /* localhost:0 asks for what --standalone does */
            return bad("--standalone picks a free port itself; drop --master_port / "
                       "--rdzv_endpoint");
        snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");
        o->master_port = 0;
    }
    if (o->master_port == 0 && !o->standalone) {
        if (o->nnodes != 1)
            return bad("--rdzv_endpoint '%s%s%s:0': port 0 (a free port) works only with one "
                       "node, since the other nodes could not know it; give node 0's port, the "
                       "same on every node",
                       strchr(o->master_addr, ':') ? "[" : "", o->master_addr,
                       strchr(o->master_addr, ':') ? "]" : "");
        /* One node: as torchrun, a free port on the host given (the workers are told which). */
    }
    for (int r = o->nproc; o->ranks_filter && r < DDPRUN_MAX_NPROC; r++)
        if (o->shown[r])
            return bad("--local_ranks_filter names local rank %d, but this node runs %d "
                       "worker%s (local ranks 0-%d)",
                       r, o->nproc, o->nproc == 1 ? "" : "s", o->nproc - 1);
    if (o->local_addr[0] && check_local_addr(o->local_addr) != 0)
        return -1;
    if (o->elastic) {
        /* torchrun's static rendezvous has no range (it waits for MAX nodes, world_size =
         * max_nodes); its c10d one numbers the nodes itself, whatever --node_rank says. */
        if (!o->rdzv_c10d)
            return bad("--nnodes %d:%d: an elastic range needs --rdzv_backend c10d (and "
                       "--rdzv_endpoint HOST:PORT, the node that hosts the store); torchrun's "
                       "static rendezvous has none and waits for all %d nodes: for that, give "
                       "--nnodes %d",
                       o->min_nodes, o->nnodes, o->nnodes, o->nnodes);
        if (o->node_rank_given)
            fprintf(stderr,
                    "ddprun: --node_rank %d is ignored with an elastic --nnodes %d:%d: "
                    "the c10d rendezvous numbers the nodes, as torchrun's does\n",
                    o->node_rank, o->min_nodes, o->nnodes);
        o->node_rank = 0;
        o->node_rank_given = false;
        if (o->last_call_timeout < 0)
            return bad("--rdzv_conf last_call_timeout is not a number of seconds");
    }
    say_rdzv_ignored(o);
    /* torchrun's c10d rendezvous numbers the nodes that come without --node_rank */
    o->number_nodes = o->rdzv_c10d && !o->node_rank_given && o->nnodes > 1;
    if (o->node_rank >= o->nnodes)
        return bad("--node_rank %d is not below --nnodes %d", o->node_rank, o->nnodes);
    if (o->monitor_interval < 0.001)
        o->monitor_interval = 0.001;
    if (o->rdzv_timeout < 0.1)
        return bad("--rdzv_timeout must be at least 0.1 s");
    if (o->nnodes > 1 && o->agent_timeout < 3 * o->monitor_interval)
        return bad("--agent_timeout %.3g s must be at least 3 × --monitor_interval (%.3g s): "
                   "heartbeats advance once per interval",
                   o->agent_timeout, o->monitor_interval);
    return 0;
}
