/*
 * testworker — the program the integration tests launch under ddprun. One mode per behaviour:
 *
 *   env DIR [ARGS...]      write DIR/env.RANK: the contract variables, one per line, and argv
 *   fail RANK CODE [DIR]   rank RANK exits CODE 0.5 s after every rank has recorded its pids
 *                          (writes to stderr first, and the wall-clock time in ms to
 *                          DIR/failed.RANK); the rest sleep; everyone records pids (its own and
 *                          a grandchild's) in DIR
 *   selfkill RANK [DIR]    rank RANK sends itself SIGKILL likewise; the rest sleep
 *   peer-fail CAUSE SEC [DIR]  once every rank has recorded its pids, rank SEC exits
 *                          DDP_EXIT_PEER_FAILED (as a rank told of a peer's failure does;
 *                          DIR/failed.SEC: the time, as for fail); rank
 *                          CAUSE fails once SEC's exit has been reaped (by ddprun), with exit
 *                          code 5 and its own message (CAUSE -1: nobody does); the rest sleep.
 *                          Without DIR, sleeps instead (0.3 s and 1.1 s)
 *   sleep DIR              record pids, start a grandchild, sleep 60 s
 *   stubborn DIR           like sleep, but ignores SIGTERM (tests the SIGKILL after the grace)
 *   restart N DIR          rank 0 fails while DDP_RESTART_COUNT < N, once every rank has
 *                          appended its line to DIR/attempts
 *   rendezvous             join the store (ddp_store_open_world), barrier, check every rank's key
 *   elastic DIR W          make a group, allreduce a 1 from every rank, append "restart= rank=
 *                          world= group= groups= sum=" (DDP_RESTART_COUNT, RANK, WORLD_SIZE,
 *                          GROUP_RANK, GROUP_WORLD_SIZE, the allreduce) to DIR/elastic.log and
 *                          its pids to DIR/{pid,child}.e<pid>; exit 0 after 0.3 s when
 *                          WORLD_SIZE is W, else sleep 30 s (an elastic re-form stops it)
 *   world DIR              write DIR/world.RANK: the world as ddp_world_from_env() reads it
 *                          (launcher, rank, sizes, store address), or DIR/world.err.PID and exit 1
 *   hold-port PORT SECS    listen on 127.0.0.1:PORT for SECS seconds (a port in use)
 *   free-port              print a port that was free a moment ago
 *   store-set HOST PORT KEY VALUE  connect to the store at HOST:PORT (token DDP_STORE_TOKEN)
 *                          and set KEY (a stranger holding the token, e.g. a fake node)
 *
 * A first argument --local_rank=N or --local-rank=N (ddprun --pass_local_rank, as
 * torch.distributed.launch gave it) is taken off before the mode and written by `env` as
 * LOCAL_RANK_ARG=--local_rank=N.
 *
 * Pid files: DIR/pid.RANK (the worker) and DIR/child.RANK (a grandchild in its process group),
 * so a test can check that nothing survives.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <netinet/in.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ddp/ddp.h"

static int rank(void)
{
    const char *r = getenv("RANK");
    return r ? atoi(r) : 0;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void write_file(const char *dir, const char *name, long value)
{
    if (!dir)
        return;
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "%ld\n", value);
    fclose(f);
    rename(tmp, path); /* the test sees the whole file or none */
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int world_size(void)
{
    const char *w = getenv("WORLD_SIZE");
    return w ? atoi(w) : 1;
}

/* Waits (at most 60 s: the test's own timeout is the real bound) until ready(arg) holds.
 * Ordering in these tests comes from waiting for what must have happened, never from a sleep
 * that is long enough on an idle machine: under TSan with four tests on two cores a worker can
 * take seconds to start. */
static bool wait_until(bool (*ready)(const void *), const void *arg)
{
    int64_t end = wall_ms() + 60000;
    while (!ready(arg)) {
        if (wall_ms() > end)
            return false;
        sleep_s(0.01);
    }
    return true;
}

/* Every rank's DIR/pid.RANK exists (a rank writes child.RANK before pid.RANK). */
static bool all_pids_recorded(const void *arg)
{
    const char *dir = arg;
    char path[4200];
    for (int r = 0; r < world_size(); r++) {
        snprintf(path, sizeof path, "%s/pid.%d", dir, r);
        if (access(path, F_OK) != 0)
            return false;
    }
    return true;
}

/* The process in DIR/pid.SEC no longer exists: it ended and its parent (ddprun) reaped it, which
 * is when ddprun learns how it ended. */
typedef struct {
    const char *dir;
    int rank;
} rank_ref;

static bool rank_reaped(const void *arg)
{
    const rank_ref *r = arg;
    char path[4200];
    snprintf(path, sizeof path, "%s/pid.%d", r->dir, r->rank);
    FILE *f = fopen(path, "r");
    long pid = 0;
    if (!f)
        return false;
    int n = fscanf(f, "%ld", &pid);
    fclose(f);
    return n == 1 && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Records our pid and a grandchild's (which sleeps in our process group). */
static void record_pids(const char *dir)
{
    pid_t c = fork();
    if (c == 0) {
        sleep_s(60);
        _exit(0);
    }
    write_file(dir, "child", (long)c);
    write_file(dir, "pid", (long)getpid());
}

static const char *local_rank_arg = "<none>"; /* --local_rank=N given before the mode */

static int mode_env(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    static const char *const names[] = {
        DDP_ENV_CONTRACT, "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "CUDA_VISIBLE_DEVICES", NULL,
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/env.%d", argv[2], rank());
    FILE *f = fopen(path, "w");
    if (!f)
        return 3;
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        fprintf(f, "%s=%s\n", names[i], v ? v : "<unset>");
    }
    for (int i = 3; i < argc; i++)
        fprintf(f, "ARG%d=%s\n", i - 3, argv[i]);
    fprintf(f, "LOCAL_RANK_ARG=%s\n", local_rank_arg);
    cpu_set_t set; /* the cores this worker may run on, "0,1" */
    fprintf(f, "CPUS=");
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0, k = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set))
                fprintf(f, "%s%d", k++ ? "," : "", c);
    fprintf(f, "\n");
    fclose(f);
    printf("env written by rank %d\n", rank());
    return 0;
}

static int mode_fail(int argc, char **argv, bool selfkill)
{
    int target = argc > 2 ? atoi(argv[2]) : 0;
    int code = !selfkill && argc > 3 ? atoi(argv[3]) : 1;
    const char *dir = selfkill ? (argc > 3 ? argv[3] : NULL) : (argc > 4 ? argv[4] : NULL);
    record_pids(dir);
    if (rank() == target) {
        if (dir && !wait_until(all_pids_recorded, dir))
            fprintf(stderr, "testworker rank %d: not every rank recorded its pid\n", rank());
        sleep_s(0.5);
        fprintf(stderr, "testworker rank %d: failing on purpose\n", rank());
        write_file(dir, "failed", (long)wall_ms());
        if (selfkill)
            raise(SIGKILL);
        return code;
    }
    sleep_s(60);
    return 0;
}

/* The failure a rank learns of from its peer (ddptrain's "rank 0 could not save the checkpoint"),
 * before the peer itself has exited: SEC ends first, with the secondary code. */
static int mode_peer_fail(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int cause = atoi(argv[2]), sec = atoi(argv[3]);
    const char *dir = argc > 4 ? argv[4] : NULL;
    record_pids(dir);
    if (rank() == sec) {
        if (!dir)
            sleep_s(0.3);
        else if (!wait_until(all_pids_recorded, dir))
            fprintf(stderr, "testworker rank %d: not every rank recorded its pid\n", rank());
        fprintf(stderr, "testworker rank %d: rank %d failed, stopping with it\n", rank(), cause);
        write_file(dir, "failed", (long)wall_ms());
        return DDP_EXIT_PEER_FAILED;
    }
    if (rank() == cause) {
        rank_ref r = {dir, sec};
        if (!dir)
            sleep_s(1.1);
        else if (!wait_until(rank_reaped, &r))
            fprintf(stderr, "testworker rank %d: rank %d did not end\n", rank(), sec);
        fprintf(stderr, "testworker rank %d: No space left on device (the real failure)\n", rank());
        return 5;
    }
    sleep_s(60);
    return 0;
}

static int mode_sleep(const char *dir, bool stubborn)
{
    if (stubborn)
        signal(SIGTERM, SIG_IGN);
    record_pids(dir);
    printf("rank %d sleeping\n", rank());
    fflush(stdout);
    sleep_s(60);
    return 0;
}

typedef struct {
    const char *path;
    int attempt;
} attempt_ref;

/* DIR/attempts holds a line for this attempt from every rank. */
static bool attempt_recorded(const void *arg)
{
    const attempt_ref *a = arg;
    FILE *f = fopen(a->path, "r");
    if (!f)
        return false;
    char line[256], want[32];
    snprintf(want, sizeof want, "attempt=%d ", a->attempt);
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strncmp(line, want, strlen(want)) == 0;
    fclose(f);
    return n >= world_size();
}

static int mode_restart(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int n = atoi(argv[2]);
    const char *rc = getenv("DDP_RESTART_COUNT");
    int attempt = rc ? atoi(rc) : -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/attempts", argv[3]);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "attempt=%d rank=%d world=%s\n", attempt, rank(), getenv("WORLD_SIZE"));
        fclose(f);
    }
    if (rank() == 0 && attempt < n) {
        /* every rank has recorded this attempt before the group is stopped */
        attempt_ref ar = {path, attempt};
        if (!wait_until(attempt_recorded, &ar))
            fprintf(stderr, "testworker: not every rank recorded attempt %d\n", attempt);
        fprintf(stderr, "testworker: failing attempt %d\n", attempt);
        return 1;
    }
    if (rank() != 0)
        sleep_s(attempt < n ? 30 : 0.2); /* others get stopped when rank 0 fails */
    return 0;
}

static int mode_elastic(const char *dir, int want)
{
    char path[4096];
    pid_t c = fork();
    if (c == 0) {
        sleep_s(60);
        _exit(0);
    }
    const char *names[2] = {"pid", "child"};
    long pids[2] = {(long)getpid(), (long)c};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s.e%d", dir, names[i], (int)getpid());
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%ld\n", pids[i]);
            fclose(f);
        }
    }
    const char *ws = getenv("WORLD_SIZE");
    ddp_error err = {0};
    ddp_group *g = NULL;
    float one = 1;
    if (ddp_group_init(NULL, &g, &err) != DDP_OK) {
        fprintf(stderr, "elastic: %s\n", err.msg);
        kill(c, SIGKILL);
        return 1;
    }
    if (ddp_allreduce(g, &one, &one, 1, DDP_FLOAT32, DDP_SUM) != DDP_OK) {
        fprintf(stderr, "elastic: %s\n", ddp_group_last_error(g));
        ddp_group_destroy(g);
        kill(c, SIGKILL);
        return 1;
    }
    snprintf(path, sizeof path, "%s/elastic.log", dir);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "restart=%s rank=%d world=%s group=%s groups=%s sum=%g\n",
                getenv("DDP_RESTART_COUNT"), rank(), ws, getenv("GROUP_RANK"),
                getenv("GROUP_WORLD_SIZE"), (double)one);
        fclose(f);
    }
    printf("rank %d of world %s\n", rank(), ws);
    fflush(stdout);
    sleep_s(ws && atoi(ws) == want ? 0.3 : 30);
    ddp_group_destroy(g);
    kill(c, SIGKILL);
    return 0;
}

static int mode_world(const char *dir)
{
    ddp_error err = {0};
    ddp_world w;
    char path[4096];
    if (ddp_world_from_env(&w, &err) != DDP_OK) {
        snprintf(path, sizeof path, "%s/world.err.%d", dir, (int)getpid());
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%s\n", err.msg);
            fclose(f);
        }
        fprintf(stderr, "world: %s\n", err.msg);
        return 1;
    }
    snprintf(path, sizeof path, "%s/world.%d", dir, w.rank);
    FILE *f = fopen(path, "w");
    if (!f)
        return 1;
    fprintf(f,
            "launcher=%s\nrank=%d\nworld_size=%d\nlocal_rank=%d\nlocal_world_size=%d\n"
            "node_rank=%d\nmaster_addr=%s\nmaster_port=%d\nmaster_known=%d\n",
            ddp_launcher_name(w.launcher), w.rank, w.world_size, w.local_rank, w.local_world_size,
            w.node_rank, w.master_addr, w.master_port, (int)w.master_known);
    return fclose(f) == 0 ? 0 : 1;
}

static int mode_rendezvous(void)
{
    ddp_error err = {0};
    ddp_world w;
    if (ddp_world_from_env(&w, &err) != DDP_OK) {
        fprintf(stderr, "rendezvous: %s\n", err.msg);
        return 1;
    }
    ddp_store *s;
    if (ddp_store_open_world(&w, 30000, &s, &err) != DDP_OK) {
        fprintf(stderr, "rendezvous: %s\n", err.msg);
        return 1;
    }
    int rc = 1;
    char key[64], val[64];
    snprintf(key, sizeof key, "rdzv/%d", w.rank);
    snprintf(val, sizeof val, "%d", w.rank * 7);
    if (ddp_store_set(s, key, val, strlen(val)) || ddp_store_barrier(s, "all", w.world_size))
        goto out;
    for (int r = 0; r < w.world_size; r++) {
        void *v;
        snprintf(key, sizeof key, "rdzv/%d", r);
        if (ddp_store_get(s, key, &v, NULL))
            goto out;
        int got = atoi(v);
        free(v);
        if (got != r * 7) {
            fprintf(stderr, "rendezvous: rank %d read %d for rank %d\n", w.rank, got, r);
            goto out;
        }
    }
    if (ddp_store_barrier(s, "end", w.world_size))
        goto out;
    printf("rendezvous ok: rank %d of %d\n", w.rank, w.world_size);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "rendezvous: rank %d: %s\n", w.rank, ddp_store_last_error(s));
    ddp_store_close(s);
    return rc;
}

static int listen_on(int port, int *bound)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 4) != 0)
        return -1;
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    *bound = ntohs(a.sin_port);
    return fd;
}

int main(int argc, char **argv)
{
    if (argc > 1 &&
        (!strncmp(argv[1], "--local_rank=", 13) || !strncmp(argv[1], "--local-rank=", 13))) {
        local_rank_arg = argv[1];
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: testworker MODE ...\n");
        return 2;
    }
    const char *m = argv[1];
    if (!strcmp(m, "env"))
        return mode_env(argc, argv);
    if (!strcmp(m, "fail"))
        return mode_fail(argc, argv, false);
    if (!strcmp(m, "selfkill"))
        return mode_fail(argc, argv, true);
    if (!strcmp(m, "peer-fail"))
        return mode_peer_fail(argc, argv);
    if (!strcmp(m, "sleep") && argc > 2)
        return mode_sleep(argv[2], false);
    if (!strcmp(m, "stubborn") && argc > 2)
        return mode_sleep(argv[2], true);
    if (!strcmp(m, "restart"))
        return mode_restart(argc, argv);
    if (!strcmp(m, "rendezvous"))
        return mode_rendezvous();
    if (!strcmp(m, "elastic") && argc > 3)
        return mode_elastic(argv[2], atoi(argv[3]));
    if (!strcmp(m, "world") && argc > 2)
        return mode_world(argv[2]);
    if (!strcmp(m, "hold-port") && argc > 3) {
        int bound;
        int fd = listen_on(atoi(argv[2]), &bound);
        if (fd < 0) {
            perror("hold-port");
            return 1;
        }
        printf("holding %d\n", bound);
        fflush(stdout);
        sleep_s(atof(argv[3]));
        close(fd);
        return 0;
    }
    if (!strcmp(m, "free-port")) {
        int bound;
        int fd = listen_on(0, &bound);
        if (fd < 0)
            return 1;
        close(fd);
        printf("%d\n", bound);
        return 0;
    }
    if (!strcmp(m, "store-set") && argc > 5) {
        ddp_store_opts so = DDP_STORE_OPTS_INIT;
        so.host = argv[2];
        so.port = atoi(argv[3]);
        so.token = getenv("DDP_STORE_TOKEN");
        so.timeout_ms = 10000;
        ddp_store *s;
        ddp_error err = {0};
        if (ddp_store_connect(&so, &s, &err) != DDP_OK) {
            fprintf(stderr, "store-set: %s\n", err.msg);
            return 1;
        }
        int rc = ddp_store_set(s, argv[4], argv[5], strlen(argv[5])) == DDP_OK ? 0 : 1;
        if (rc)
            fprintf(stderr, "store-set: %s\n", ddp_store_last_error(s));
        ddp_store_close(s);
        return rc;
    }
    fprintf(stderr, "testworker: unknown mode '%s'\n", m);
    return 2;
}
