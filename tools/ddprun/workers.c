/*
 * workers.c — starting and signalling workers.
 *
 * Each worker is fork+exec'd into its own process group (so a stop reaches whatever it started)
 * with PR_SET_PDEATHSIG = SIGKILL (so it dies with ddprun even when ddprun is SIGKILLed; the
 * reaper process covers the rest of its group). ddprun has a store thread, so between fork and
 * exec the child only makes async-signal-safe calls: the environment and the program's path are
 * prepared before fork. An exec failure is reported back through a close-on-exec pipe, so
 * "no such program" is a clear message rather than a mysterious exit code 127.
 * Pinning (--bind_to auto|core): with no more workers than cores, each worker gets its own block
 * of the cores ddprun may use. Off by default: on our 2-vCPU test machine it did not help (see
 * docs/ddprun.md).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/ddp.h"
#include "ddprun.h"

extern char **environ;

/* Variables ddprun sets for every worker (build_env adds each); inherited copies are dropped. */
static const char *const contract[] = {DDP_ENV_CONTRACT, NULL};

static bool in_contract(const char *kv)
{
    for (int i = 0; contract[i]; i++) {
        size_t n = strlen(contract[i]);
        if (strncmp(kv, contract[i], n) == 0 && kv[n] == '=')
            return true;
    }
    return false;
}

/* Builds the worker's environment: ours plus everything inherited that we do not set.
 * Returns a NULL-terminated array (caller frees with free_env) or NULL on no memory. */
static char **build_env(const ddprun_opts *o, const ddprun_world *wd, const ddprun_worker *w)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 32, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!in_contract(environ[i]) &&
            !(o->isolate_gpus && !strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21)) &&
            !(o->local_addr[0] && !strncmp(environ[i], "DDP_LOCAL_ADDR=", 15)))
            env[k++] = strdup(environ[i]);
    struct {
        const char *name;
        char value[1600]; /* TORCHELASTIC_ERROR_FILE: a path under --log_dir */
    } add[32];
    int na = 0;
#define ADD(NAME, ...)                                                                             \
    do {                                                                                           \
        add[na].name = NAME;                                                                       \
        snprintf(add[na].value, sizeof add[na].value, __VA_ARGS__);                                \
        na++;                                                                                      \
    } while (0)
    ADD("RANK", "%d", w->rank);
    ADD("LOCAL_RANK", "%d", w->local_rank);
    ADD("WORLD_SIZE", "%d", wd->world_size);
    ADD("LOCAL_WORLD_SIZE", "%d", o->nproc);
    ADD("GROUP_RANK", "%d", wd->group_rank);
    ADD("GROUP_WORLD_SIZE", "%d", wd->nnodes);
    ADD("ROLE_RANK", "%d", w->rank);
    ADD("ROLE_WORLD_SIZE", "%d", wd->world_size);
    ADD("ROLE_NAME", "%s", o->role);
    ADD("MASTER_ADDR", "%s", o->master_addr);
    /* MASTER_PORT is left free for a store of the program's own (PyTorch's rank 0 binds it, as
     * under torchrun's c10d rendezvous); ddpc's ranks find ddprun's store on DDP_STORE_PORT. */
    ADD("MASTER_PORT", "%d", wd->free_port);
    ADD("DDP_STORE_PORT", "%d", wd->store_port);
    ADD("DDP_RUN_ID", "%s", o->run_id);
    ADD("DDP_STORE_TOKEN", "%s", wd->token);
    ADD("DDP_RESTART_COUNT", "%d", wd->restarts);
    ADD("DDP_MAX_RESTARTS", "%d", o->max_restarts);
    ADD("DDP_AGENT_STORE", "1");
    ADD("DDP_HOST_CORES", "%d", ddp_own_cores()); /* ddprun's own: before any pinning */
    ADD("TORCHELASTIC_RUN_ID", "%s", o->run_id);
    ADD("TORCHELASTIC_RESTART_COUNT", "%d", wd->restarts);
    ADD("TORCHELASTIC_MAX_RESTARTS", "%d", o->max_restarts);
    ADD("TORCHELASTIC_USE_AGENT_STORE", "False"); /* rank 0 hosts torch's store on MASTER_PORT */
    /* Its own, as torchrun gives each worker (an inherited one is dropped: the parent's file is
     * ddprun's to write, agent_pass_error_file). None when ddprun could not make a folder. */
    if (w->error_file[0])
        ADD("TORCHELASTIC_ERROR_FILE", "%s", w->error_file);
    /* As torchrun: PyTorch's NCCL groups abort a failed or timed-out collective rather than
     * hang in it, unless the user said otherwise (an inherited value passes through). */
    if (!getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        ADD("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    if (o->isolate_gpus && o->ngpus > 0) /* the LOCAL_RANK-th visible GPU, and only it */
        ADD("CUDA_VISIBLE_DEVICES", "%s", o->gpu_ids[w->local_rank % o->ngpus]);
    if (o->local_addr[0]) /* --local_addr; else an inherited DDP_LOCAL_ADDR passes through */
        ADD("DDP_LOCAL_ADDR", "%s", o->local_addr);
#undef ADD
    for (int i = 0; i < na; i++) {
        size_t len = strlen(add[i].name) + strlen(add[i].value) + 2;
        char *kv = malloc(len);
        if (kv)
            snprintf(kv, len, "%s=%s", add[i].name, add[i].value);
        env[k++] = kv;
    }
    env[k] = NULL;
    for (size_t i = 0; i < k; i++) {
        if (!env[i]) { /* an allocation failed */
            for (size_t j = 0; j < k; j++)
                free(env[j]);
            free(env);
            return NULL;
        }
    }
    return env;
}

static void free_env(char **env)
{
    if (!env)
        return;
    for (size_t i = 0; env[i]; i++)
        free(env[i]);
    free(env);
}

bool ddprun_find_program(const char *prog, char *buf, size_t cap, int *why)
{
    if (strchr(prog, '/')) {
        snprintf(buf, cap, "%s", prog);
        if (access(buf, X_OK) == 0)
            return true;
        *why = errno;
        return false;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    *why = ENOENT;
    for (const char *p = path; *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        snprintf(buf, cap, "%.*s%s%s", (int)n, p, n ? "/" : "./", prog);
        struct stat st;
        if (stat(buf, &st) == 0 && S_ISREG(st.st_mode)) {
            if (access(buf, X_OK) == 0)
                return true;
            *why = EACCES;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return false;
}

bool ddprun_worker_cpus(const ddprun_opts *o, int local_rank, cpu_set_t *out)
{
    cpu_set_t mine;
    if (o->bind == BIND_NONE || sched_getaffinity(0, sizeof mine, &mine) != 0)
        return false;
    int n = CPU_COUNT(&mine);
    if (o->nproc > n) /* BIND_CORE with too many workers is refused in main */
        return false;
    int per = n / o->nproc, first = local_rank * per, k = 0;
    CPU_ZERO(out);
    for (int c = 0; c < CPU_SETSIZE && k < first + per; c++) {
        if (!CPU_ISSET(c, &mine))
            continue;
        if (k >= first)
            CPU_SET(c, out);
        k++;
    }
    return true;
}

int ddprun_spawn(const ddprun_opts *o, const ddprun_world *wd, ddprun_worker *w, bool pipe_out,
                 int reaper_fd)
{
    char path[4096];
    int why = 0;
    const char *prog = o->npython ? o->python[0] : o->argv[0];
    if (!ddprun_find_program(prog, path, sizeof path, &why)) {
        ddprun_say("cannot run '%s': %s%s", prog, strerror(why),
                   strchr(prog, '/') ? "" : " (searched PATH; give a path like ./prog)");
        return -1;
    }
    char **env = build_env(o, wd, w);
    /* The interpreter's words (python3 -u [-m]), the program, then --pass_local_rank's argument
     * (torch.distributed.launch's, right after the script), then the program's arguments. */
    char lr_arg[64];
    int n = 0;
    while (o->argv[n])
        n++;
    char **args = calloc((size_t)(o->npython + n + 2), sizeof *args);
    if (args) {
        int k = 0;
        for (int i = 0; i < o->npython; i++)
            args[k++] = (char *)o->python[i];
        args[k++] = o->argv[0];
        if (o->pass_local_rank) {
            snprintf(lr_arg, sizeof lr_arg, "--local%srank=%d",
                     o->pass_local_rank == PASS_LOCAL_RANK_DASH ? "-" : "_", w->local_rank);
            args[k++] = lr_arg;
        }
        memcpy(args + k, o->argv + 1, sizeof *args * (size_t)n); /* with the NULL */
    }
    if (!env || !args) {
        ddprun_say("out of memory preparing the environment of rank %d", w->rank);
        if (env)
            free_env(env);
        free(args);
        return -1;
    }
    int outp[2] = {-1, -1}, errp[2] = {-1, -1}, execp[2] = {-1, -1}, inp[2] = {-1, -1};
    int rc = -1;
    if (pipe2(execp, O_CLOEXEC) != 0 || (o->interactive && pipe2(inp, O_CLOEXEC) != 0) ||
        (pipe_out && (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0))) {
        int e = errno;
        ddprun_say("cannot create pipes for rank %d: %s%s", w->rank, strerror(e),
                   e == EMFILE || e == ENFILE
                       ? "; raise the open-files limit (ulimit -n: about 8 a worker)"
                       : "");
        goto out_close;
    }
    /* Several workers: none of them owns our input. One worker keeps a file or pipe on stdin;
     * a terminal it reads through ddprun (o->interactive: a pipe ddprun fills from the terminal
     * while in the foreground), as it runs in its own process group, which is not the
     * terminal's foreground group: reading the terminal itself would stop it (SIGTTIN). */
    int devnull = -1;
    if (!o->interactive && (pipe_out || isatty(STDIN_FILENO)))
        devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    cpu_set_t cpus;
    bool pin = ddprun_worker_cpus(o, w->local_rank, &cpus);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        ddprun_say("cannot fork rank %d: %s", w->rank, strerror(errno));
        if (devnull >= 0)
            close(devnull);
        goto out_close;
    }
    if (pid == 0) {
        /* Child: async-signal-safe calls only. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127); /* ddprun died before we got here */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        /* ddprun forwards SIGINT and SIGTERM, so workers must act on them even when ddprun was
         * started with them ignored (a background job of a script inherits SIGINT ignored).
         * SIGHUP keeps its inherited disposition: under nohup it stays ignored. */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGQUIT, SIG_DFL);
        if (pin)
            sched_setaffinity(0, sizeof cpus, &cpus);
        if (devnull >= 0)
            dup2(devnull, STDIN_FILENO);
        if (inp[0] >= 0)
            dup2(inp[0], STDIN_FILENO);
        if (pipe_out) {
            dup2(outp[1], STDOUT_FILENO);
            dup2(errp[1], STDERR_FILENO);
        }
        execve(path, args, env);
        int e = errno;
        ssize_t k = write(execp[1], &e, sizeof e);
        (void)k;
        _exit(127);
    }
    setpgid(pid, pid); /* also here, so the group exists before we might signal it */
    if (reaper_fd >= 0)
        ddprun_reaper_track(reaper_fd, pid, o->run_id);
    if (devnull >= 0)
        close(devnull);
    close(execp[1]);
    execp[1] = -1;
    int child_errno = 0;
    ssize_t k;
    do
        k = read(execp[0], &child_errno, sizeof child_errno);
    while (k < 0 && errno == EINTR);
    w->pid = pid;
    w->running = true;
    if (k == (ssize_t)sizeof child_errno) {
        ddprun_say("cannot run '%s' (rank %d): %s", path, w->rank, strerror(child_errno));
        goto out_close; /* the caller reaps it like any failed worker */
    }
    if (inp[1] >= 0) { /* non-blocking: a worker that reads nothing must not stall ddprun */
        w->in_fd = inp[1];
        inp[1] = -1;
        fcntl(w->in_fd, F_SETFL, fcntl(w->in_fd, F_GETFL) | O_NONBLOCK);
    }
    if (pipe_out) {
        w->out.fd = outp[0];
        w->err.fd = errp[0];
        outp[0] = errp[0] = -1;
    }
    rc = 0;

out_close:
    for (int i = 0; i < 2; i++) {
        if (outp[i] >= 0)
            close(outp[i]);
        if (errp[i] >= 0)
            close(errp[i]);
        if (execp[i] >= 0)
            close(execp[i]);
        if (inp[i] >= 0)
            close(inp[i]);
    }
    free_env(env);
    free(args);
    return rc;
}

void ddprun_signal_worker(const ddprun_worker *w, int sig)
{
    if (w->pid > 0)
        kill(-w->pid, sig);
}

void ddprun_describe_status(int status, char *buf, size_t cap)
{
    if (WIFEXITED(status)) {
        snprintf(buf, cap, "exit code %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, cap, "signal %d (SIG%s)%s", sig, abbrev ? abbrev : "?",
                 WCOREDUMP(status) ? ", core dumped" : "");
    } else {
        snprintf(buf, cap, "status 0x%x", status);
    }
}
