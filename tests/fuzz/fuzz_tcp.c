/*
 * fuzz_tcp.c — the tcp backend's set-up (src/group/tcp/setup.c) with strangers on a rank's
 * listening port: a port scanner, another program, a rank of another job, or someone who guesses
 * the port and sends anything at all.
 *
 * Each input runs the real thing: an in-process store, member 0 of a two-member tcp backend
 * (ddp__tcp_create) in a thread, and, once member 0 has published its address, up to four
 * strangers that connect to it and send their bytes; then member 1, which connects last, so
 * member 0 reads the strangers first. Input layout:
 *   byte 0: bits 0–3: stranger i first sends a hello's 28 fixed bytes and the job's token, so
 *           the fuzzer reaches the checks after the token (clear bits: strangers without it);
 *           that hello names member 1 of 2 on the data channel, or with bit 4 member 0, with
 *           bit 5 the control channel, with bit 6 a world of 3, with bit 7 channel 2 (none);
 *           the stranger's own bytes follow
 *           where the prefix belongs;
 *   the rest: each stranger's bytes, strangers separated by the 4 bytes "\n--\n".
 * A stranger resets its connection after its bytes, so member 0 never waits for a hello that
 * will not come. Besides not crashing, leaking or reading out of bounds: both members must be
 * set up, well within the deadline (every stranger is refused and set-up goes on). An input
 * whose stranger would be accepted — the token and a correct hello, prefix included: an
 * impostor of member 1 rather than a stranger — is skipped.
 * Every connection ends with a reset (the members' too, set by the harness before destroy), and
 * the store and its clients live for the whole run, so thousands of inputs leave no TIME_WAIT
 * sockets behind to run the loopback out of ports.
 */
#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ddp/store.h"
#include "group/group_int.h"
#include "group/tcp/tcp_int.h"

#define TOKEN "fuzz-token"
#define PREFIX "fz"
#define SETUP_MS 8000
#define MAX_STRANGERS 4

static const char sep[] = "\n--\n";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fail(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_tcp: %s%s%s\n", what, msg ? ": " : "", msg ? msg : "");
    abort();
}

static void quiet(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

typedef struct member {
    int me;
    ddp_store *store;
    pthread_t th;
    void *be;
    const ddp__backend_ops *ops;
    ddp_status st;
    ddp_error err;
    int64_t took_ms;
} member;

static void *run_member(void *arg)
{
    member *mb = arg;
    static const int ranks[2] = {0, 1};
    ddp__members m = {.me = mb->me,
                      .n = 2,
                      .ranks = ranks,
                      .prefix = PREFIX,
                      .run_id = "fuzz",
                      .token = TOKEN,
                      .master_addr = "127.0.0.1",
                      .local_addr = "127.0.0.1"};
    int64_t start = now_ms();
    mb->st = ddp__tcp_create(&m, mb->store, SETUP_MS, &mb->be, &mb->ops, &mb->err);
    mb->took_ms = now_ms() - start;
    return NULL;
}

/* A store client, kept for the whole run. */
static ddp_store *client(int port)
{
    ddp_store_opts so = DDP_STORE_OPTS_INIT;
    so.host = "127.0.0.1";
    so.port = port;
    so.token = TOKEN;
    so.timeout_ms = SETUP_MS;
    ddp_store *s = NULL;
    ddp_error err = {0};
    if (ddp_store_connect(&so, &s, &err) != DDP_OK)
        fail("cannot reach the store", err.msg);
    return s;
}

/* Ends a member's connections with resets (no TIME_WAIT), then destroys it. */
static void destroy(member *mb)
{
    tcp_be *be = mb->be;
    struct linger lg = {1, 0};
    int fds[4] = {be->out_fd, be->in_fd, be->ctl_out_fd, be->ctl_in_fd};
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0)
            setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    mb->ops->destroy(be);
}

/* A hello's fixed part (tcp_int.h) with the job's token: member 1 (else 0) of n 2 (else 3), on
 * the data channel (else control); the prefix is left to the stranger's own bytes. */
static size_t hello(unsigned char *out, uint32_t who, uint32_t n, uint32_t ch)
{
    uint32_t f[7] = {0x48504444u, 1, who, n, ch, sizeof TOKEN - 1, sizeof PREFIX - 1};
    for (int i = 0; i < 7; i++)
        for (int b = 0; b < 4; b++)
            out[4 * i + b] = (unsigned char)(f[i] >> (8 * b));
    memcpy(out + 28, TOKEN, sizeof TOKEN - 1);
    return 28 + sizeof TOKEN - 1;
}

/* Connects, sends, and resets the connection: member 0 still reads every byte sent (Linux keeps
 * them readable before the reset), then sees the connection gone, at once, never waiting for a
 * hello that will not come; and a reset leaves no TIME_WAIT (a half-close would, on the
 * stranger's port, thousands of them a minute). */
static void stranger(int port, const unsigned char *pre, size_t pn, const uint8_t *p, size_t n)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        fail("a stranger cannot make a socket", strerror(errno));
    /* A signal (libFuzzer's timer) may interrupt the connect: it goes on in the background, so
     * wait for it rather than give up (CI saw "Interrupted system call" here once). */
    int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    while (rc != 0 && (errno == EINTR || errno == EALREADY || errno == EINPROGRESS)) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        poll(&pf, 1, 100);
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
        if (rc != 0 && errno == EISCONN)
            rc = 0;
    }
    if (rc != 0)
        fail("a stranger cannot connect to member 0", strerror(errno));
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    /* Loopback buffers hold far more than an input: these sends do not wait for member 0. */
    if (pn)
        (void)send(fd, pre, pn, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n)
        (void)send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    close(fd);
}

/* Whether some stranger would be taken for member 1: its own bytes hold the token, or its hello
 * given by the flags is member 1's of the right size and its bytes start with the prefix. */
static bool impostor(uint8_t flags, const uint8_t *data, size_t size)
{
    if (memmem(data, size, TOKEN, sizeof TOKEN - 1))
        return true;
    bool right = !(flags & 16) && !(flags & 64) && !(flags & 128);
    const uint8_t *p = data, *end = data + size;
    for (int i = 0; i < MAX_STRANGERS; i++) {
        if (right && (flags & (1u << i)) && (size_t)(end - p) >= sizeof PREFIX - 1 &&
            memcmp(p, PREFIX, sizeof PREFIX - 1) == 0)
            return true;
        const uint8_t *q = (i < MAX_STRANGERS - 1 && end - p >= (ptrdiff_t)sizeof sep - 1)
                               ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1)
                               : NULL;
        if (!q)
            break;
        p = q + sizeof sep - 1;
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    uint8_t flags = data[0];
    data++;
    size--;
    if (impostor(flags, data, size))
        return 0;

    /* One store and three clients for the whole run (members 0 and 1, and the strangers'
     * look-up): a store per input would leave thousands of client ports in TIME_WAIT. Each input
     * removes the addresses it published. */
    static ddp_store_server *srv;
    static ddp_store *s0, *s1, *s;
    if (!srv) {
        ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
        so.host = "127.0.0.1";
        so.token = TOKEN;
        so.log = quiet;
        ddp_error err = {0};
        if (ddp_store_server_start(&so, &srv, &err) != DDP_OK)
            fail("cannot start the store", err.msg);
        int port = ddp_store_server_port(srv);
        s0 = client(port);
        s1 = client(port);
        s = client(port);
    }

    member m0 = {.me = 0, .store = s0}, m1 = {.me = 1, .store = s1};
    if (pthread_create(&m0.th, NULL, run_member, &m0) != 0)
        fail("cannot start a thread", NULL);

    /* Member 0's address, once published: "127.0.0.1:PORT". */
    void *v = NULL;
    size_t vn = 0;
    ddp_store_set_timeout(s, SETUP_MS);
    if (ddp_store_get(s, PREFIX "/addr/0", &v, &vn) != DDP_OK)
        fail("member 0 did not publish its address", ddp_store_last_error(s));
    const char *colon = strrchr(v, ':');
    int mport = colon ? atoi(colon + 1) : 0;
    free(v);
    if (mport <= 0)
        fail("member 0 published a malformed address", NULL);

    /* The strangers. One with the token whose hello is correct, prefix included, would be
     * accepted in member 1's place: that is an impostor member, not a stranger, and member 1
     * would then wait out the deadline (a member that fails in set-up is not told apart from
     * a slow one): such inputs are skipped, below, before anything starts. */
    int nf = 0;
    const uint8_t *p = data, *end = data + size;
    while (nf < MAX_STRANGERS) {
        const uint8_t *q = (nf < MAX_STRANGERS - 1 && end - p >= (ptrdiff_t)sizeof sep - 1)
                               ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1)
                               : NULL;
        size_t n = (size_t)((q ? q : end) - p);
        unsigned char pre[64];
        size_t pn = 0;
        if (flags & (1u << nf))
            pn = hello(pre, flags & 16 ? 0 : 1, flags & 64 ? 3 : 2,
                       flags & 128  ? 2
                       : flags & 32 ? 1
                                    : 0);
        stranger(mport, pre, pn, p, n);
        nf++;
        if (!q)
            break;
        p = q + sizeof sep - 1;
    }
    if (pthread_create(&m1.th, NULL, run_member, &m1) != 0)
        fail("cannot start a thread", NULL);
    pthread_join(m0.th, NULL);
    pthread_join(m1.th, NULL);

    member *mb[2] = {&m0, &m1};
    for (int i = 0; i < 2; i++) {
        if (mb[i]->took_ms > SETUP_MS + 2000)
            fail("set-up outlived its deadline", mb[i]->err.msg);
        if (mb[i]->st != DDP_OK)
            fail("a stranger stopped set-up", mb[i]->err.msg);
        destroy(mb[i]);
    }
    (void)ddp_store_delete(s, PREFIX "/addr/0", NULL);
    (void)ddp_store_delete(s, PREFIX "/addr/1", NULL);
    return 0;
}
