/*
 * fuzz_store.c — the store server's frame handling and request decoding, driven through real
 * sockets: what a stranger or a broken client on the store port can send.
 *
 * The decoder has no entry point apart from the server (serve_frame() works on a connection's
 * buffer and the table), so each input starts a real in-process server on a loopback port and
 * plays the bytes to it over up to four connections at once:
 *   byte 0: bit i set = connection i first shows a correct HELLO (so the fuzzer reaches the
 *           requests without having to guess the token; clear bits test strangers);
 *   the rest: the bytes each connection sends, connections separated by the 4 bytes "\n--\n".
 * Connections are opened together (a GET parked on one can be released by a SET on another)
 * and each sends its bytes in turn while every reply is read and dropped, until the server has
 * been quiet for a moment. Besides not crashing, the store must not stall the job: a witness
 * client, connected before the others, must still get answers, and once the others reset their
 * connections the server must let go of every one of them (parked ones too).
 * Every connection ends with a reset rather than a FIN, so thousands of inputs a second leave
 * no TIME_WAIT sockets to use up the loopback's ports. The server's limits are small (1 KiB
 * values, 8 KiB in all) so they are reached.
 */
#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ddp/store.h"
#include "store/store_int.h"

#define TOKEN "fuzz-token"
#define MAX_CONNS 4
#define STALL_MS 10000

static const char sep[] = "\n--\n";

static void quiet(void *ctx, const char *line)
{
    (void)ctx;
    (void)line;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void stalled(const char *what)
{
    fprintf(stderr, "fuzz_store: the store stalled: %s\n", what);
    abort();
}

/* A correct HELLO frame (store_int.h): u32 length, op 1, u32 magic, u32 version, blob token. */
static size_t hello(unsigned char *out)
{
    static const unsigned char head[] = {1, 'D', 'D', 'P', 'S', 1, 0, 0, 0};
    uint32_t tl = sizeof TOKEN - 1, len = (uint32_t)sizeof head + 4 + tl;
    size_t n = 0;
    for (int i = 0; i < 4; i++)
        out[n++] = (unsigned char)(len >> (8 * i));
    memcpy(out + n, head, sizeof head);
    n += sizeof head;
    for (int i = 0; i < 4; i++)
        out[n++] = (unsigned char)(tl >> (8 * i));
    memcpy(out + n, TOKEN, tl);
    return n + tl;
}

typedef struct peer {
    int fd;
    const uint8_t *data; /* what it sends after its optional HELLO */
    size_t len, off;
    unsigned char hello[64];
    size_t hlen, hoff;
    bool closed;
} peer;

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        stalled("no socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS)
        stalled("connect refused");
    struct linger lg = {1, 0}; /* close() resets: no TIME_WAIT */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    return fd;
}

/* Sends what p may send now; false when the connection is gone. */
static bool send_some(peer *p)
{
    while (p->hoff < p->hlen || p->off < p->len) {
        bool h = p->hoff < p->hlen;
        const unsigned char *b = h ? p->hello + p->hoff : p->data + p->off;
        size_t n = h ? p->hlen - p->hoff : p->len - p->off;
        ssize_t k = send(p->fd, b, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (k <= 0)
            return false; /* the server closed it: a refusal, which is fine */
        *(h ? &p->hoff : &p->off) += (size_t)k;
    }
    return true;
}

/* Reads and drops what arrived; false when the server closed the connection. */
static bool drain(peer *p)
{
    char buf[65536];
    for (;;) {
        ssize_t k = recv(p->fd, buf, sizeof buf, 0);
        if (k > 0)
            continue;
        if (k < 0 && errno == EINTR)
            continue;
        return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
}

/* Sends a whole frame on the blocking-by-poll witness and waits for one whole reply. */
static void witness_call(int fd, const unsigned char *req, size_t n, const char *what)
{
    int64_t deadline = now_ms() + STALL_MS;
    size_t sent = 0, got = 0, want = 4;
    unsigned char rep[64];
    while (got < want) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            stalled(what);
        struct pollfd pf = {.fd = fd, .events = (short)(sent < n ? POLLOUT : POLLIN)};
        if (poll(&pf, 1, (int)left) < 0 && errno != EINTR)
            abort();
        ssize_t k;
        if (sent < n) {
            k = send(fd, req + sent, n - sent, MSG_NOSIGNAL);
            if (k > 0)
                sent += (size_t)k;
        } else {
            k = recv(fd, rep + got, (want < sizeof rep ? want : sizeof rep) - got, 0);
            if (k > 0)
                got += (size_t)k;
            if (got == 4 && want == 4) {
                uint32_t len = (uint32_t)rep[0] | (uint32_t)rep[1] << 8 | (uint32_t)rep[2] << 16 |
                               (uint32_t)rep[3] << 24;
                if (len < 1 || len > sizeof rep - 4)
                    stalled("the witness got a malformed reply");
                want = 4 + len;
            }
        }
        if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
            stalled("the witness's connection was dropped");
    }
    if (rep[4] != 0)
        stalled("the witness's request was refused");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    data++;
    size--;

    ddp_store_server_opts so = DDP_STORE_SERVER_OPTS_INIT;
    so.host = "127.0.0.1";
    so.token = TOKEN;
    so.max_value = 1024;
    so.max_total = 8192;
    so.max_connections = 16;
    so.log = quiet;
    ddp_store_server *srv = NULL;
    ddp_error err = {0};
    if (ddp_store_server_start(&so, &srv, &err) != DDP_OK) {
        fprintf(stderr, "fuzz_store: %s\n", err.msg);
        abort();
    }
    int port = ddp_store_server_port(srv);

    /* The witness: a well-behaved client of the same job, there before the others. */
    unsigned char req[64];
    int wfd = connect_to(port);
    witness_call(wfd, req, hello(req), "the witness's HELLO got no answer");

    peer peers[MAX_CONNS];
    int np = 0;
    const uint8_t *p = data, *end = data + size;
    while (np < MAX_CONNS) {
        const uint8_t *s = (np < MAX_CONNS - 1 && end - p >= (ptrdiff_t)sizeof sep - 1)
                               ? memmem(p, (size_t)(end - p), sep, sizeof sep - 1)
                               : NULL;
        peer *q = &peers[np++];
        memset(q, 0, sizeof *q);
        q->data = p;
        q->len = (size_t)((s ? s : end) - p);
        if (flags & (1u << (np - 1)))
            q->hlen = hello(q->hello);
        q->fd = connect_to(port);
        if (!s)
            break;
        p = s + sizeof sep - 1;
    }

    /* Send in connection order while reading every reply, then wait for 1 ms of quiet. */
    int64_t deadline = now_ms() + STALL_MS;
    int sending = 0, open = np;
    while (open > 0) {
        while (sending < np &&
               (peers[sending].closed || (peers[sending].hoff == peers[sending].hlen &&
                                          peers[sending].off == peers[sending].len)))
            sending++;
        struct pollfd pf[MAX_CONNS];
        for (int i = 0; i < np; i++)
            pf[i] = (struct pollfd){.fd = peers[i].closed ? -1 : peers[i].fd,
                                    .events = (short)(POLLIN | (i == sending ? POLLOUT : 0))};
        int64_t left = deadline - now_ms();
        if (left <= 0)
            stalled("it stopped reading a connection's requests");
        int rc = poll(pf, (nfds_t)np, sending < np ? (int)left : 1);
        if (rc < 0 && errno != EINTR)
            abort();
        if (rc == 0 && sending >= np)
            break; /* all sent, and the server has gone quiet */
        for (int i = 0; rc > 0 && i < np; i++) {
            peer *q = &peers[i];
            if (q->closed || !pf[i].revents)
                continue;
            bool ok = true;
            if (pf[i].revents & POLLOUT)
                ok = send_some(q);
            if (ok && (pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                ok = drain(q);
            if (!ok)
                q->closed = true, open--;
        }
    }

    /* The job goes on: the witness is served. */
    static const unsigned char num_keys[] = {1, 0, 0, 0, 9};
    witness_call(wfd, num_keys, sizeof num_keys, "the witness got no answer");

    /* Reset the others: the server must let go of all of them, parked requests included. */
    for (int i = 0; i < np; i++)
        close(peers[i].fd);
    deadline = now_ms() + STALL_MS;
    while (ddp__store_server_clients(srv) > 1) {
        if (now_ms() > deadline)
            stalled("it kept connections whose clients were gone");
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
    close(wfd);
    ddp_store_server_stop(srv);
    return 0;
}
