/*
 * fuzz_store_client.c — the store client's reply handling, driven through a real socket: what a
 * stranger (another service on MASTER_ADDR:MASTER_PORT, a port scanner's echo, an old or broken
 * store) can answer to a rank or a ddprun node that connects to it.
 *
 * Each input runs a fake server on a loopback port, in a thread, and a real client against it:
 *   bytes 0–7: the client's calls after ddp_store_connect, one per byte (low 4 bits: set, get,
 *              add, compare_set, check, wait, delete, num_keys, barrier; 0xff ends the list);
 *   the rest:  what the server answers on each of up to four connections the client opens,
 *              separated by the 4 bytes "\n--\n" (the client backs off between reconnections,
 *              so more would make inputs slow, not more interesting).
 * The server writes a connection's bytes whatever the client sent (replies need not wait for
 * requests), then stops sending; a connection beyond the last is answered with a token refusal,
 * so a client that reconnects gets a definite answer instead of retrying until its deadline.
 * Besides not crashing, leaking or reading out of bounds: every call must end well within its
 * deadline (the server never stalls, it only stops sending), every error must leave a message,
 * and nothing may be allocated for a reply that the connection cannot hold (libFuzzer's malloc
 * limit turns a 2 GiB buffer for a stranger's 4-byte length into a crash).
 * The listener lives for the whole run: the server's half-close leaves its side of each
 * connection in TIME_WAIT, all on that one port, which costs no other port.
 */
#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ddp/store.h"

#define TOKEN "fuzz-token"
#define CALL_MS 2000
#define MAX_OPS 8
#define MAX_CONNS 4 /* the last takes the rest of the input */

static const char sep[] = "\n--\n";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fail(const char *what)
{
    fprintf(stderr, "fuzz_store_client: %s\n", what);
    abort();
}

typedef struct fake {
    int lfd;
    const uint8_t *data; /* the connections' bytes, separated by sep */
    size_t len;
    int stop_fd[2]; /* a byte on stop_fd[1] ends the server */
} fake;

/* A token refusal (store_int.h): length 1 + 4 + n, code 1, blob message. */
static const unsigned char refusal[] = {10, 0, 0, 0, 1, 5, 0, 0, 0, 'n', 'o', 't', 'y', 'o'};

/* Writes n bytes to fd, giving up when the client has gone or stopped reading for long. */
static void put(int fd, const void *p, size_t n)
{
    const char *b = p;
    int64_t deadline = now_ms() + 3 * CALL_MS;
    while (n > 0) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return;
        int rc = poll(&pf, 1, (int)left);
        if (rc < 0 && errno == EINTR) /* libFuzzer's timer signal: not the client's doing */
            continue;
        if (rc <= 0)
            return;
        ssize_t k = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (k <= 0)
            return;
        b += k;
        n -= (size_t)k;
    }
}

/* Serves connections until told to stop: each gets its piece of the input, then the server
 * stops sending and drops what the client sends until the client closes. */
static void *serve(void *arg)
{
    fake *f = arg;
    const uint8_t *p = f->data, *end = f->data + f->len;
    bool pieces_left = true;
    int served = 0;
    for (;;) {
        struct pollfd pf[2] = {{.fd = f->lfd, .events = POLLIN},
                               {.fd = f->stop_fd[0], .events = POLLIN}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            fail("poll failed");
        }
        if (pf[1].revents)
            return NULL;
        int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        struct linger lg = {1, 0}; /* close() resets: no TIME_WAIT */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        if (pieces_left) {
            const uint8_t *s = ++served < MAX_CONNS && end - p >= (ptrdiff_t)sizeof sep - 1
                                   ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1)
                                   : NULL;
            put(fd, p, (size_t)((s ? s : end) - p));
            if (s)
                p = s + sizeof sep - 1;
            else
                pieces_left = false;
        } else {
            put(fd, refusal, sizeof refusal);
        }
        shutdown(fd, SHUT_WR);
        /* Drop what the client sends until it closes (or the input ends). */
        for (;;) {
            struct pollfd q[2] = {{.fd = fd, .events = POLLIN},
                                  {.fd = f->stop_fd[0], .events = POLLIN}};
            if (poll(q, 2, -1) < 0 && errno != EINTR)
                fail("poll failed");
            if (q[1].revents) {
                close(fd);
                return NULL;
            }
            char buf[4096];
            ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
                break;
        }
        close(fd);
    }
}

/* One call of the client; every error must come with a message. */
static void one_call(ddp_store *s, unsigned op)
{
    static const char *const keys[] = {"a", "b/c"};
    void *v = NULL;
    size_t n = 0;
    int64_t i = 0;
    bool b = false;
    ddp_status st;
    int64_t start = now_ms();
    switch (op % 9) {
    case 0: st = ddp_store_set(s, "a", "value", 5); break;
    case 1:
        st = ddp_store_get(s, "a", &v, &n);
        if (st == DDP_OK && (!v || ((char *)v)[n] != '\0'))
            fail("get returned no value or an unterminated one");
        break;
    case 2: st = ddp_store_add(s, "n", 1, &i); break;
    case 3:
        st = ddp_store_compare_set(s, "a", "value", 5, "other", 5, &v, &n);
        if (st == DDP_OK && (!v || ((char *)v)[n] != '\0'))
            fail("compare_set returned no value or an unterminated one");
        break;
    case 4: st = ddp_store_check(s, keys, 2, &b); break;
    case 5: st = ddp_store_wait(s, keys, 2); break;
    case 6: st = ddp_store_delete(s, "a", &b); break;
    case 7: st = ddp_store_num_keys(s, &i); break;
    default: st = ddp_store_barrier(s, "fuzz", 2); break;
    }
    free(v);
    if (now_ms() - start > 2 * CALL_MS + 1000)
        fail("a call outlived its deadline");
    if (st != DDP_OK && !*ddp_store_last_error(s))
        fail("a failed call left no message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < MAX_OPS)
        return 0;
    /* One listener for the whole run: a new port per input would leave thousands of ports in
     * TIME_WAIT (the fake server half-closes first) and run the loopback out of them. */
    static int lfd = -1, port;
    if (lfd < 0) {
        struct sockaddr_in a = {.sin_family = AF_INET};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof a;
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 16) != 0 ||
            getsockname(lfd, (struct sockaddr *)&a, &al) != 0)
            fail("cannot listen on loopback");
        port = ntohs(a.sin_port);
    }
    fake f = {.lfd = lfd, .data = data + MAX_OPS, .len = size - MAX_OPS};
    if (pipe2(f.stop_fd, O_CLOEXEC) != 0)
        fail("no pipe");
    pthread_t th;
    if (pthread_create(&th, NULL, serve, &f) != 0)
        fail("cannot start the fake server");

    ddp_store_opts o = DDP_STORE_OPTS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.token = TOKEN;
    o.timeout_ms = CALL_MS;
    o.connect_timeout_ms = CALL_MS;
    ddp_store *s = NULL;
    ddp_error err = {0};
    int64_t start = now_ms();
    ddp_status st = ddp_store_connect(&o, &s, &err);
    if (now_ms() - start > 2 * CALL_MS + 1000)
        fail("connect outlived its deadline");
    if (st != DDP_OK && !*err.msg)
        fail("a failed connect left no message");
    for (int k = 0; st == DDP_OK && k < MAX_OPS && data[k] != 0xff; k++)
        one_call(s, data[k] & 15u);
    ddp_store_close(s);

    if (write(f.stop_fd[1], "x", 1) != 1)
        fail("cannot stop the fake server");
    pthread_join(th, NULL);
    close(f.stop_fd[0]);
    close(f.stop_fd[1]);
    return 0;
}
