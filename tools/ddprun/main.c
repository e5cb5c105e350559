/*
 * ddprun — the launcher: torchrun's interface, for any program. See `ddprun --help` and
 * docs/ddprun.md. This file wires the pieces: arguments, thread defaults, the reaper, the
 * signal descriptor, and the agent that runs the job.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "ddp/ddp.h"
#include "ddprun.h"

/* torchrun sets OMP_NUM_THREADS=1 whenever nproc > 1, a known cause of slow CPU training. We
 * give each worker its share of the cores instead, so ranks × threads = cores. A user's own
 * OMP_NUM_THREADS also stands for OpenBLAS, which falls back to it when OPENBLAS_NUM_THREADS is
 * unset: without ddprun `OMP_NUM_THREADS=4 ./train` runs OpenBLAS on 4 threads, and so must
 * ddprun's workers (not on the cores / workers default). */
static void default_threads(int nproc)
{
    int cores = ddp_own_cores();
    int per = cores / nproc > 0 ? cores / nproc : 1;
    char v[16];
    snprintf(v, sizeof v, "%d", per);
    const char *names[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp && *omp && !getenv("OPENBLAS_NUM_THREADS"))
        setenv("OPENBLAS_NUM_THREADS", omp, 1);
    char set[64] = "";
    for (int i = 0; i < 2; i++) {
        if (getenv(names[i]))
            continue;
        setenv(names[i], v, 1);
        size_t l = strlen(set);
        snprintf(set + l, sizeof set - l, "%s%s", l ? " and " : "", names[i]);
    }
    if (set[0] && nproc > 1)
        ddprun_say("%s unset: %d thread%s per worker (%d core%s / %d workers)", set, per,
                   per == 1 ? "" : "s", cores, cores == 1 ? "" : "s", nproc);
    /* Under mpirun (which binds each task to a core by default when it starts at most 2) or srun,
     * ddprun inherits the binding, and so do all its workers: they would share a core while the
     * rest of the machine idles, silently. (Only under those: a container's cpuset is meant.) */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    bool task = getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
                getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID");
    if (task && nproc > cores && online > cores)
        ddprun_say("warning: this ddprun may use only %d of the machine's %ld cores (its CPU "
                   "affinity, as mpirun's or srun's binding of tasks sets it), so its %d workers "
                   "share %s; start it unbound (mpirun --bind-to none, srun --cpu-bind=none) or "
                   "with more cores per task (srun --cpus-per-task)",
                   cores, online, nproc, cores == 1 ? "it" : "them");
}

/* One ddprun per task of an outer launcher (mpirun -np 2, srun -N 2) with --nnodes 1: each task
 * runs a job of its own, the jobs never meet, and they write the same out_dir when they share
 * one. torchrun says nothing (`srun torchrun --standalone …` on two nodes is a known way to
 * train twice); a warning rather than a refusal, since separate jobs can be meant. */
static void warn_outer_tasks(const ddprun_opts *o)
{
    const char *who = NULL, *var = NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE"))
        who = "mpirun", var = "OMPI_COMM_WORLD_SIZE";
    else if (getenv("PMI_SIZE"))
        who = "a PMI launcher", var = "PMI_SIZE";
    else if (getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID"))
        who = "srun",
        var = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    const char *v = var ? getenv(var) : NULL;
    char *end = NULL;
    long tasks = v ? strtol(v, &end, 10) : 0;
    if (o->nnodes != 1 || !v || end == v || *end || tasks < 2)
        return;
    ddprun_say("warning: this ddprun is one of %ld tasks started by %s (%s=%ld) but runs a job of "
               "one node (--nnodes 1): each task runs a job of its own, %ld in all, that never "
               "meet and write the same out_dir if they share one; for one job across them give "
               "every ddprun --nnodes %ld --rdzv_backend c10d --rdzv_endpoint HOST:PORT (or "
               "--node_rank), or start one ddprun",
               tasks, who, var, tasks, tasks, tasks);
}

int main(int argc, char **argv)
{
    ddprun_opts *o = calloc(1, sizeof *o);
    if (!o) {
        fputs("ddprun: out of memory\n", stderr);
        return 1;
    }
    int rc = ddprun_parse_args(argc, argv, o);
    if (rc != 0) {
        free(o);
        return rc > 0 ? 0 : 2;
    }
    char path[4096];
    int why = 0;
    /* A Python script (python[] set): the interpreter must be found and the script readable,
     * before any worker starts, rather than every worker's python3 saying so. */
    if (o->npython && !ddprun_find_program(o->python[0], path, sizeof path, &why)) {
        bool named = getenv("PYTHON_EXEC") && *getenv("PYTHON_EXEC");
        ddprun_say("cannot run '%s' for %s '%s' (as torchrun, ddprun runs Python programs with an "
                   "interpreter): %s; %s, or name one: 'ddprun [flags] /path/to/python3 %s%s'",
                   o->python[0], o->npython == 3 ? "the module" : "the script", o->argv[0],
                   strerror(why),
                   named ? "PYTHON_EXEC names it: correct or unset PYTHON_EXEC" : "install python3",
                   o->npython == 3 ? "-m " : "", o->argv[0]);
        free(o);
        return 1;
    }
    if (o->npython == 2 && access(o->argv[0], R_OK) != 0) {
        ddprun_say("cannot open the script '%s': %s", o->argv[0], strerror(errno));
        free(o);
        return 1;
    }
    if (!o->npython && !ddprun_find_program(o->argv[0], path, sizeof path, &why)) {
        const char *prog = o->argv[0];
        bool slash = strchr(prog, '/') != NULL;
        char hint[600] = "";
        if (!slash && access(prog, F_OK) == 0)
            snprintf(hint, sizeof hint,
                     "; '%s' is in the current directory, which is not searched: give './%s'", prog,
                     prog);
        else if (!slash)
            snprintf(hint, sizeof hint, " (searched PATH; give a path like ./prog)");
        ddprun_say("cannot run '%s': %s%s", prog, strerror(why), hint);
        free(o);
        return 1;
    }
    if (o->bind == BIND_CORE && o->nproc > ddp_own_cores()) {
        ddprun_say("--bind_to core: %d workers but %d cores available; use --bind_to auto or none",
                   o->nproc, ddp_own_cores());
        free(o);
        return 2;
    }
    /* A stack limit this low (ulimit -s 32) ended ddprun by SIGSEGV while it built a worker's
     * environment (until 2026-11-26), and the workers inherit it: ddptrain needs about 80 KiB,
     * ddprun's threads get the limit as their stack size. Said now, with the value to raise it
     * to, rather than a crash; 256 KiB leaves both a margin of 2 to 3. */
    const unsigned long long min_stack_kib = 256;
    struct rlimit sl;
    if (getrlimit(RLIMIT_STACK, &sl) == 0 && sl.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)sl.rlim_cur < min_stack_kib * 1024) {
        ddprun_say("the stack size limit (ulimit -s: %llu KiB) is too low: ddprun and its workers "
                   "need at least %llu KiB; raise it (ulimit -s 8192, the usual default)",
                   (unsigned long long)sl.rlim_cur / 1024, min_stack_kib);
        free(o);
        return 1;
    }
    default_threads(o->nproc);
    warn_outer_tasks(o);
    signal(SIGPIPE, SIG_IGN); /* a closed console or reaper must not kill the launcher */
    /* A parent may have left SIGCHLD ignored: then the kernel would reap our workers itself and
     * we would wait for them forever. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    /* Two pipes (and two log files) per worker: take the whole fd allowance we are given. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* Too few for the store, the agent and the workers' pipes: said now. Under `ulimit -n 8` the
     * store could not accept ddprun's own connection and the rendezvous waited its whole timeout
     * (300 s), then blamed node 0 (found 2026-11-26); 20 is the least 2 workers ran with. */
    const unsigned long long need_fds = 4 + 8ull * (unsigned long long)o->nproc;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)rl.rlim_cur < need_fds) {
        ddprun_say("the open-files limit (ulimit -n: %llu) is too low for %d worker%s: ddprun "
                   "needs about %llu (8 a worker and 4); raise it (ulimit -n 1024)",
                   (unsigned long long)rl.rlim_cur, o->nproc, o->nproc == 1 ? "" : "s", need_fds);
        free(o);
        return 1;
    }
    if (o->want_files && !o->log_dir[0]) {
        /* --redirects/--tee without --log_dir: a fresh directory, as torchrun does. */
        const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(o->log_dir, sizeof o->log_dir, "%s/ddprun_XXXXXX", tmp);
        if (!mkdtemp(o->log_dir)) {
            ddprun_say("cannot create a log directory in '%s': %s; give --log_dir", tmp,
                       strerror(errno));
            free(o);
            return 1;
        }
    }

    /* The reaper first: before any thread, socket or worker exists. */
    int reaper_fd = ddprun_reaper_start(argc, argv);
    if (reaper_fd < 0) {
        free(o);
        return 1;
    }
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    /* Ctrl-Z and fg: the workers live in their own process groups, out of the terminal's reach,
     * so ddprun stops and continues them itself (agent.c) */
    sigaddset(&mask, SIGTSTP);
    sigaddset(&mask, SIGCONT);
    sigaddset(&mask, SIGQUIT); /* stops the job as SIGTERM does (torchrun handles it too) */
    /* Under nohup SIGHUP is ignored on purpose: then it stays ignored, for workers too. So are
     * SIGUSR1/SIGUSR2 when ignored at start; otherwise ddprun passes them on to every worker and
     * the job goes on (Slurm's --signal=USR1@T warning before a time limit reaches the program,
     * rather than killing ddprun and with it the workers). */
    const int keep_ignored[] = {SIGHUP, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof keep_ignored / sizeof keep_ignored[0]; i++) {
        struct sigaction sa;
        if (sigaction(keep_ignored[i], NULL, &sa) != 0 || sa.sa_handler != SIG_IGN)
            sigaddset(&mask, keep_ignored[i]);
    }
    if (sigprocmask(SIG_BLOCK, &mask, NULL) != 0) {
        ddprun_say("sigprocmask failed: %s", strerror(errno));
        ddprun_reaper_finish(reaper_fd);
        free(o);
        return 1;
    }
    int sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd < 0) {
        ddprun_say("signalfd failed: %s", strerror(errno));
        ddprun_reaper_finish(reaper_fd);
        free(o);
        return 1;
    }
    int code = ddprun_agent_run(o, sigfd, reaper_fd);
    ddprun_reaper_finish(reaper_fd);
    close(sigfd);
    free(o);
    return code; /* what the console could not take yet is written at exit (output.c) */
}
