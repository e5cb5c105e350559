/*
 * test_store_strangers.c — the store under a crowd, while a job uses it: what test_store.c
 * checks one stranger at a time (garbage, huge lengths, a truncated message, a wrong token, a
 * connection over the limit), here at scale and at the same time as real work.
 *   - hundreds of silent connections: the job's barriers go on at full speed, and every
 *     stranger is closed when handshake_ms runs out;
 *   - a flood of wrong tokens and garbage during the job's barriers: all refused, none stalls;
 *   - a slow HELLO trickled one byte at a time: trickling does not extend handshake_ms;
 *   - an authenticated client stopping half-way through a request: no one waits for it, and
 *     the rest of its request, sent slowly later, is served;
 *   - a client that pipelines requests and never reads the replies: the server stops reading
 *     it, queues nothing without bound, and serves everyone else.
 * The job is four threads of ddp_store clients doing rounds of set, barrier and get; a round
 * takes about a millisecond, so the bounds below (seconds) only fail on a real stall. Threads
 * record what they saw; the main thread asserts after the join.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "ddp/ddp.h"
#include "store/store_int.h"
#include "store_wire.h"

#define TOKEN "the-job-token"
#define RANKS 4
#define SLACK_MS 1500 /* sanitizer builds on a busy machine are slow */

static void quiet_log(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

typedef struct fx {
    ddp_store_server *srv;
    int port;
} fx;

static int start(void **state, int handshake_ms)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    ddp_store_server_opts o = DDP_STORE_SERVER_OPTS_INIT;
    o.host = "127.0.0.1";
    o.token = TOKEN;
    o.handshake_ms = handshake_ms;
    o.log = quiet_log;
    ddp_error err = {0};
    if (ddp_store_server_start(&o, &f->srv, &err) != DDP_OK) {
        print_error("cannot start the store: %s\n", err.msg);
        free(f);
        return -1;
    }
    f->port = ddp_store_server_port(f->srv);
    *state = f;
    return 0;
}

static int setup_1s(void **state)
{
    return start(state, 1000);
}

static int setup_300ms(void **state)
{
    return start(state, 300);
}

static int teardown(void **state)
{
    fx *f = *state;
    ddp_store_server_stop(f->srv);
    free(f);
    return 0;
}

/* ---- raw sockets (frames and the connection: store_wire.h) -------------------------------- */

/* Reads until the server closes fd or ms pass. Returns true if closed; *first: the first reply's
 * code byte, or -1. */
static bool wait_closed(int fd, int ms, int *first)
{
    unsigned char buf[4096];
    size_t got = 0;
    if (first)
        *first = -1;
    int64_t deadline = now_ms() + ms;
    for (;;) {
        int64_t left = deadline - now_ms(); /* ≤ 0: still look once at what has arrived */
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int rc = poll(&pf, 1, left > 0 ? (int)left : 0);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return false;
        ssize_t k = recv(fd, buf, sizeof buf, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return true;
        if (first && got < 5 && got + (size_t)k >= 5)
            *first = buf[4 - got];
        got += (size_t)k;
    }
}

/* Receives one reply frame within ms; returns its code, or -1. */
static int raw_reply(int fd, int ms)
{
    unsigned char b[64];
    size_t got = 0, want = 4;
    int64_t deadline = now_ms() + ms;
    while (got < want) {
        int64_t left = deadline - now_ms();
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            return -1;
        ssize_t k = recv(fd, b + got, want - got, 0);
        if (k <= 0)
            return -1;
        got += (size_t)k;
        if (got == 4 && want == 4) {
            want = 4 + ddp__le32(b);
            if (want > sizeof b)
                return -1;
        }
    }
    return b[4];
}

/* ---- the job: RANKS threads doing rounds of set, barrier, get ------------------------------ */

typedef struct job {
    int port, rank, rounds;
    const char *tag;               /* keys are unique per job */
    ddp_status st;                 /* first failure, or DDP_OK */
    char msg[DDP_ERRMSG_MAX + 16]; /* its message */
    int64_t slowest_ms;            /* the longest round */
} job;

static void *job_main(void *arg)
{
    job *j = arg;
    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.host = "127.0.0.1";
    o.port = j->port;
    o.token = TOKEN;
    o.timeout_ms = 20000;
    ddp_store *s = NULL;
    ddp_error err = {0};
    j->st = ddp_store_connect(&o, &s, &err);
    if (j->st != DDP_OK) {
        snprintf(j->msg, sizeof j->msg, "connect: %s", err.msg);
        return NULL;
    }
    for (int r = 0; r < j->rounds && j->st == DDP_OK; r++) {
        int64_t t0 = now_ms();
        char key[64], bar[64], val[32];
        snprintf(key, sizeof key, "%s/%d/%d", j->tag, r, j->rank);
        snprintf(val, sizeof val, "%d:%d", r, j->rank);
        snprintf(bar, sizeof bar, "%s/bar/%d", j->tag, r);
        j->st = ddp_store_set(s, key, val, strlen(val));
        if (j->st == DDP_OK)
            j->st = ddp_store_barrier(s, bar, RANKS);
        for (int q = 0; q < RANKS && j->st == DDP_OK; q++) {
            void *v = NULL;
            size_t n = 0;
            snprintf(key, sizeof key, "%s/%d/%d", j->tag, r, q);
            snprintf(val, sizeof val, "%d:%d", r, q);
            j->st = ddp_store_get(s, key, &v, &n);
            if (j->st == DDP_OK && (n != strlen(val) || memcmp(v, val, n) != 0))
                j->st = DDP_ERR_PROTOCOL;
            free(v);
        }
        if (now_ms() - t0 > j->slowest_ms)
            j->slowest_ms = now_ms() - t0;
    }
    if (j->st != DDP_OK)
        snprintf(j->msg, sizeof j->msg, "%s", ddp_store_last_error(s));
    ddp_store_close(s);
    return NULL;
}

typedef struct jobset {
    pthread_t t[RANKS];
    job j[RANKS];
    int64_t started;
} jobset;

static void job_start(jobset *js, int port, const char *tag, int rounds)
{
    memset(js, 0, sizeof *js);
    js->started = now_ms();
    for (int r = 0; r < RANKS; r++) {
        js->j[r] = (job){.port = port, .rank = r, .rounds = rounds, .tag = tag};
        assert_int_equal(pthread_create(&js->t[r], NULL, job_main, &js->j[r]), 0);
    }
}

/* Joins the job; it must have succeeded, no round slower than max_round_ms. */
static void job_check(jobset *js, const char *what, int64_t max_round_ms)
{
    for (int r = 0; r < RANKS; r++)
        pthread_join(js->t[r], NULL);
    int64_t slowest = 0;
    for (int r = 0; r < RANKS; r++) {
        if (js->j[r].st != DDP_OK)
            fail_msg("%s: rank %d failed (%s): %s", what, r, ddp_status_str(js->j[r].st),
                     js->j[r].msg);
        if (js->j[r].slowest_ms > slowest)
            slowest = js->j[r].slowest_ms;
    }
    print_message("    %s: %d rounds in %lld ms, slowest %lld ms\n", what, js->j[0].rounds,
                  (long long)(now_ms() - js->started), (long long)slowest);
    if (slowest > max_round_ms)
        fail_msg("%s: a round of the job took %lld ms", what, (long long)slowest);
}

/* ---- the tests ------------------------------------------------------------------------------ */

#define CROWD 300

static void hundreds_of_silent_connections(void **state)
{
    fx *f = *state; /* handshake_ms = 1000 */
    static int fds[CROWD];
    int64_t t0 = now_ms();
    for (int i = 0; i < CROWD; i++)
        fds[i] = raw_connect(f->port);
    jobset js;
    job_start(&js, f->port, "silent", 200);
    job_check(&js, "the job among 300 silent connections", SLACK_MS);

    /* Every stranger is closed once handshake_ms has passed, not before. */
    int closed_early = 0;
    for (int i = 0; i < CROWD; i++) {
        int64_t left = t0 + 1000 + SLACK_MS - now_ms();
        if (!wait_closed(fds[i], left > 0 ? (int)left : 0, NULL))
            fail_msg("silent connection %d was still open %lld ms after it connected", i,
                     (long long)(now_ms() - t0));
        if (now_ms() - t0 < 900)
            closed_early++;
        close(fds[i]);
    }
    assert_int_equal(closed_early, 0);
    assert_int_equal(ddp_store_server_refused(f->srv), CROWD);

    /* And the store is as good as new. */
    job_start(&js, f->port, "after", 20);
    job_check(&js, "the job afterwards", SLACK_MS);
}

typedef struct flood {
    int port, n;
    int auth_refusals, protocol_refusals, not_closed;
} flood;

static void *flood_main(void *arg)
{
    flood *fl = arg;
    for (int i = 0; i < fl->n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fl->port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            continue;
        }
        frame w;
        if (i % 4 == 3) {
            /* Exactly one small frame that is not a HELLO (no bytes left unread, so the
             * server's close is a FIN and its reply cannot be lost to a reset). */
            static const char junk[] = "\x05\x00\x00\x00hello";
            raw_send(fd, junk, sizeof junk - 1);
        } else {
            char tok[32];
            snprintf(tok, sizeof tok, "guess-%d", i);
            const char *t = i % 4 == 2 ? "" : tok; /* an empty token is wrong too */
            hello_frame(&w, DDP__STORE_MAGIC, DDP__STORE_VERSION, t);
            raw_send(fd, w.b, w.len);
        }
        int code;
        if (!wait_closed(fd, 5000, &code))
            fl->not_closed++;
        else if (code == DDP__R_AUTH)
            fl->auth_refusals++;
        else if (code == DDP__R_PROTOCOL)
            fl->protocol_refusals++;
        close(fd);
    }
    return NULL;
}

static void wrong_token_flood_during_the_job(void **state)
{
    fx *f = *state;
    flood fl[2] = {{f->port, 200, 0, 0, 0}, {f->port, 200, 0, 0, 0}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, flood_main, &fl[i]), 0);
    jobset js;
    job_start(&js, f->port, "flood", 200);
    job_check(&js, "the job under a flood of 400 strangers", SLACK_MS);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(fl[i].not_closed, 0);
        assert_int_equal(fl[i].auth_refusals, 150);
        assert_int_equal(fl[i].protocol_refusals, 50);
    }
    assert_int_equal(ddp_store_server_refused(f->srv), 400);
}

static void slow_hello_is_not_a_handshake(void **state)
{
    fx *f = *state; /* handshake_ms = 300 */
    frame w;
    hello_frame(&w, DDP__STORE_MAGIC, DDP__STORE_VERSION, TOKEN);
    int fd = raw_connect(f->port);
    int64_t t0 = now_ms();
    bool closed = false;
    /* A correct HELLO, one byte every 40 ms: it would take about a second. */
    for (size_t i = 0; i < w.len && !closed; i++) {
        if (!raw_send(fd, w.b + i, 1))
            break;
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        closed = poll(&pf, 1, 40) > 0;
    }
    closed = wait_closed(fd, 300 + SLACK_MS, NULL);
    int64_t took = now_ms() - t0;
    close(fd);
    assert_true(closed);
    print_message("    a trickled HELLO was closed after %lld ms\n", (long long)took);
    if (took < 250 || took > 300 + SLACK_MS)
        fail_msg("a HELLO trickled over a second was closed after %lld ms, handshake_ms is 300",
                 (long long)took);
    assert_int_equal(ddp_store_server_refused(f->srv), 1);
}

static void half_a_request_stalls_no_one(void **state)
{
    fx *f = *state;
    frame w;
    hello_frame(&w, DDP__STORE_MAGIC, DDP__STORE_VERSION, TOKEN);
    int fd = raw_connect(f->port);
    assert_true(raw_send(fd, w.b, w.len));
    assert_int_equal(raw_reply(fd, 2000), DDP__R_OK);

    /* A SET of a 1000-byte value under "slow": its first 20 bytes, then nothing for a while. */
    frame_begin(&w, DDP__OP_SET);
    put_blob(&w, "slow", 4);
    char val[1000];
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (char)('a' + i % 26);
    put_blob(&w, val, sizeof val);
    frame_end(&w);
    assert_true(raw_send(fd, w.b, 20));
    jobset js;
    job_start(&js, f->port, "half", 100);
    job_check(&js, "the job beside half a request", SLACK_MS);

    /* The rest, 100 bytes every 10 ms (a slow link): then it is served like any request. */
    for (size_t off = 20; off < w.len; off += 100) {
        size_t n = w.len - off < 100 ? w.len - off : 100;
        assert_true(raw_send(fd, w.b + off, n));
        sleep_ms(10);
    }
    assert_int_equal(raw_reply(fd, 2000), DDP__R_OK);
    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.host = "127.0.0.1";
    o.port = f->port;
    o.token = TOKEN;
    o.timeout_ms = 5000;
    ddp_store *s = NULL;
    assert_int_equal(ddp_store_connect(&o, &s, NULL), DDP_OK);
    void *v = NULL;
    size_t n = 0;
    assert_int_equal(ddp_store_get(s, "slow", &v, &n), DDP_OK);
    assert_int_equal(n, sizeof val);
    assert_memory_equal(v, val, n);
    free(v);

    /* Half a request, then the client goes: the half is dropped, nothing is stored. */
    frame_begin(&w, DDP__OP_SET);
    put_blob(&w, "never", 5);
    put_blob(&w, val, sizeof val);
    frame_end(&w);
    assert_true(raw_send(fd, w.b, 500));
    close(fd);
    int64_t deadline = now_ms() + 2000;
    while (ddp_store_server_refused(f->srv) < 1 && now_ms() < deadline)
        sleep_ms(5);
    assert_int_equal(ddp_store_server_refused(f->srv), 1); /* logged as a truncated message */
    bool have = true;
    const char *keys[] = {"never"};
    assert_int_equal(ddp_store_check(s, keys, 1, &have), DDP_OK);
    assert_false(have);
    ddp_store_close(s);
}

static void a_client_that_never_reads(void **state)
{
    fx *f = *state;
    /* Small buffers on our side, so the server's replies back up quickly. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    frame w;
    hello_frame(&w, DDP__STORE_MAGIC, DDP__STORE_VERSION, TOKEN);
    assert_true(raw_send(fd, w.b, w.len));
    assert_int_equal(raw_reply(fd, 2000), DDP__R_OK);

    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.host = "127.0.0.1";
    o.port = f->port;
    o.token = TOKEN;
    o.timeout_ms = 5000;
    ddp_store *s = NULL;
    assert_int_equal(ddp_store_connect(&o, &s, NULL), DDP_OK);
    char val[1000];
    memset(val, 'v', sizeof val);
    assert_int_equal(ddp_store_set(s, "big", val, sizeof val), DDP_OK);

    /* GETs of the 1000-byte value, pipelined and never read, until the connection stops taking
     * them: the server has stopped reading it, rather than queueing replies without bound. */
    frame_begin(&w, DDP__OP_GET);
    put_blob(&w, "big", 3);
    frame_end(&w);
    static unsigned char batch[1000 * 12];
    assert_int_equal(w.len, 12);
    for (size_t i = 0; i < sizeof batch; i += 12)
        memcpy(batch + i, w.b, 12);
    size_t sent = 0, off = 0;
    for (;;) {
        ssize_t k = send(fd, batch + off, sizeof batch - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            sent += (size_t)k;
            off = (off + (size_t)k) % sizeof batch;
            if (sent > (64u << 20))
                fail_msg("the server took 64 MB of requests whose replies nobody read");
            continue;
        }
        assert_true(k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, 300) == 0)
            break; /* not writable for 300 ms: the server has stopped reading us */
    }
    print_message("    %zu GETs (%zu MB of replies) went out before the server stopped reading\n",
                  sent / 12, sent / 12 * 1009 >> 20);

    jobset js;
    job_start(&js, f->port, "noread", 100);
    job_check(&js, "the job beside a client that never reads", SLACK_MS);
    close(fd);
    ddp_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(hundreds_of_silent_connections, setup_1s, teardown),
        cmocka_unit_test_setup_teardown(wrong_token_flood_during_the_job, setup_1s, teardown),
        cmocka_unit_test_setup_teardown(slow_hello_is_not_a_handshake, setup_300ms, teardown),
        cmocka_unit_test_setup_teardown(half_a_request_stalls_no_one, setup_1s, teardown),
        cmocka_unit_test_setup_teardown(a_client_that_never_reads, setup_1s, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
