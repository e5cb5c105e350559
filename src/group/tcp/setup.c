/*
 * setup.c — the tcp backend's set-up (tcp_int.h): each member listens, publishes its address in
 * the store, connects to next and accepts prev, on two channels each (data and control), with a
 * hello that shows the job's token and the group's key prefix; then create() hands the four
 * sockets to the ring (ring.c). Also destroy, the operations table and the registry entry.
 * Connecting and sending a hello never wait for the peer to accept, so no member waits on another
 * in a circle; strangers on the port are refused and counted, and named if set-up times out.
 * Not here: anything after set-up (ring.c, fail.c); reconnecting (a lost connection ends the
 * backend for good).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "group/tcp/tcp_int.h"
#include "util/net.h"
#include "util/util.h"

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd); /* Linux frees the descriptor even when close() reports EINTR */
        *fd = -1;
    }
}

/* Compares without leaking how many leading bytes matched (for tokens). */
static bool same_bytes(const void *a, size_t alen, const void *b, size_t blen)
{
    if (alen != blen)
        return false;
    const unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < alen; i++)
        d |= (unsigned char)(x[i] ^ y[i]);
    return d == 0;
}

/* ---- set-up ---------------------------------------------------------------------------------- */

/* Splits "host:port" or "[v6]:port"; false when malformed. */
static bool parse_addr(const char *s, char *host, size_t cap, int *port)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return false;
    const char *h = s;
    size_t hl = (size_t)(colon - s);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return false;
        h++;
        hl -= 2;
    }
    long long p;
    if (hl + 1 > cap || !ddp__parse_int(colon + 1, 1, 65535, &p))
        return false;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return true;
}

static const char *reply_reason(uint32_t code)
{
    switch (code) {
    case REPLY_MALFORMED: return "malformed hello";
    case REPLY_TOKEN: return "wrong token";
    case REPLY_GROUP: return "a connection for another group or world size";
    case REPLY_MEMBER: return "not the member and channel expected";
    default: return "unknown refusal";
    }
}

/* An accepted connection whose hello is still arriving. */
typedef struct pending {
    int fd;
    int64_t by; /* when it must have shown its whole hello */
    unsigned char fixed[HELLO_FIXED];
    char *body;       /* token and prefix, once the fixed part is in */
    size_t got, need; /* bytes of fixed part + body received, and expected (0: not known yet) */
} pending;

/* The connections being read at once: a silent one holds up no one but itself. When all are
 * taken and another connection waits, the oldest gives way once it has had MIN_PENDING_MS to show
 * its hello (a real member sends it at once): before 2026-11-25, 64 silent connections held the
 * next ones, the member's among them, for HELLO_MS at a time. */
#define MAX_PENDING 64
#define MIN_PENDING_MS 100

/* Checks a whole hello; returns a REPLY_ code and, when accepted, the channel. */
static uint32_t check_hello(const tcp_be *be, const ddp__members *m, const pending *q,
                            const int *have, int *channel)
{
    uint32_t tlen = get32(q->fixed + 20), plen = get32(q->fixed + 24), ch = get32(q->fixed + 16);
    const char *body = q->body;
    if (!same_bytes(body, tlen, m->token, strlen(m->token)))
        return REPLY_TOKEN;
    if (get32(q->fixed + 12) != (uint32_t)be->n ||
        !same_bytes(body + tlen, plen, m->prefix, strlen(m->prefix)))
        return REPLY_GROUP;
    if (get32(q->fixed + 8) != (uint32_t)prev_of(be) || ch > CH_CTL || have[ch] >= 0)
        return REPLY_MEMBER;
    *channel = (int)ch;
    return REPLY_OK;
}

/* Reads what has arrived on q (non-blocking); returns REPLY_OK with *done set once the whole
 * hello is in, or the REPLY_ code that refuses it (the peer closed, or a malformed fixed part). */
static uint32_t read_hello(pending *q, bool *done)
{
    *done = false;
    for (;;) {
        size_t want = q->got < HELLO_FIXED ? HELLO_FIXED - q->got : q->need - q->got;
        if (want == 0) {
            *done = true;
            return REPLY_OK;
        }
        char *dst =
            q->got < HELLO_FIXED ? (char *)q->fixed + q->got : q->body + (q->got - HELLO_FIXED);
        ssize_t k = recv(q->fd, dst, want, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return REPLY_OK; /* more later */
        if (k <= 0)
            return REPLY_MALFORMED; /* closed or reset before its hello was whole */
        q->got += (size_t)k;
        if (q->got == HELLO_FIXED) {
            uint32_t tlen = get32(q->fixed + 20), plen = get32(q->fixed + 24);
            if (get32(q->fixed) != HELLO_MAGIC || get32(q->fixed + 4) != HELLO_VERSION ||
                tlen > MAX_TOKEN || plen > DDP_STORE_MAX_KEY)
                return REPLY_MALFORMED;
            q->need = HELLO_FIXED + (size_t)tlen + plen;
            if (!(q->body = malloc((size_t)tlen + plen + 1)))
                return REPLY_MALFORMED;
        }
    }
}

static ddp_status send_reply(int fd, uint32_t code, int64_t deadline, ddp_error *e)
{
    unsigned char r[8];
    put32(r, REPLY_MAGIC);
    put32(r + 4, code);
    return ddp__send_all(fd, r, sizeof r, deadline, e);
}

/* Refuses a connection with code (best effort, never waits) and closes it; keeps who it was and
 * why for the timeout message. */
static void refuse(pending *q, uint32_t code, int *refused, char *last, size_t cap)
{
    char peer[96];
    ddp__peer_name(q->fd, peer, sizeof peer);
    (void)send_reply(q->fd, code, ddp__now_ms(), NULL);
    close(q->fd);
    free(q->body);
    (*refused)++;
    ddp__fmt(last, cap, "from '%s': %s", peer, reply_reason(code));
}

/* How often a set-up wait on sockets looks for another rank's failure in the store. */
#define ABORT_LOOK_MS 250

/* Accepts connections until prev has shown a valid hello on both channels; strangers are
 * refused and counted, and the last refusal is kept for the timeout message. Hellos are read
 * from up to MAX_PENDING connections at once, each given HELLO_MS, so connections that stay
 * silent (a scanner waiting for a banner, a stranger holding the port) delay no one. */
static ddp_status accept_prev(tcp_be *be, const ddp__members *m, ddp_store *store, int lfd,
                              const char *me_addr, int64_t deadline, int timeout_ms, ddp_error *err)
{
    int64_t next_look = ddp__now_ms() + ABORT_LOOK_MS;
    int p = prev_of(be), refused = 0, np = 0;
    int have[2] = {-1, -1};
    pending q[MAX_PENDING];
    char last[160] = "";
    ddp_status st = DDP_OK;
    while (have[CH_DATA] < 0 || have[CH_CTL] < 0) {
        int64_t now = ddp__now_ms(), wake = deadline;
        for (int i = 0; i < np; i++) /* hellos overdue: refused */
            if (q[i].by <= now) {
                refuse(&q[i], REPLY_MALFORMED, &refused, last, sizeof last);
                q[i--] = q[--np];
            } else if (q[i].by < wake) {
                wake = q[i].by;
            }
        /* another rank's set-up failure, said in the store (group.c): at once, not at the
         * deadline (rank 2 waited out its whole time for rank 1, which had failed) */
        if (store && now >= next_look) {
            next_look = now + ABORT_LOOK_MS;
            ddp_store_set_timeout(store, ABORT_LOOK_MS);
            if (ddp_store_check_abort(store) == DDP_ERR_CLOSED) {
                st = ddp__err(err, DDP_ERR_CLOSED, "%s", ddp_store_last_error(store));
                goto out_close;
            }
        }
        if (store && next_look < wake)
            wake = next_look;
        if (now >= deadline) {
            char dur[32], extra[240] = "";
            ddp__fmt_duration(dur, sizeof dur, timeout_ms);
            if (refused)
                ddp__fmt(extra, sizeof extra, " (refused %d other connection%s, the last %s)",
                         refused, refused == 1 ? "" : "s", last);
            st = ddp__err(err, DDP_ERR_TIMEOUT,
                          "tcp set-up timed out after %s: rank %d (member %d) did not connect to "
                          "this rank at '%s'%s; check that it runs and can reach this host "
                          "(firewall, the interface picked toward MASTER_ADDR)",
                          dur, be->ranks[p], p, me_addr, extra);
            goto out_close;
        }
        /* All slots taken: the oldest may give way to a waiting connection once it has had
         * MIN_PENDING_MS; until then the listener is not polled (it would wake us at once). */
        int oldest = -1;
        bool take = np < MAX_PENDING;
        if (!take) {
            oldest = 0;
            for (int i = 1; i < np; i++)
                if (q[i].by < q[oldest].by)
                    oldest = i;
            int64_t may_go = q[oldest].by - HELLO_MS + MIN_PENDING_MS;
            take = may_go <= now;
            if (!take && may_go < wake)
                wake = may_go;
        }
        struct pollfd pf[MAX_PENDING + 1];
        for (int i = 0; i < np; i++)
            pf[i] = (struct pollfd){.fd = q[i].fd, .events = POLLIN};
        pf[np] = (struct pollfd){.fd = take ? lfd : -1, .events = POLLIN};
        int64_t left = wake - now;
        int rc = poll(pf, (nfds_t)np + 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (rc < 0 && errno != EINTR) {
            st = ddp__err(err, DDP_ERR_SYSTEM,
                          "tcp set-up: waiting for rank %d (member %d): poll "
                          "failed: %s",
                          be->ranks[p], p, strerror(errno));
            goto out_close;
        }
        if (rc <= 0)
            continue;
        /* Hellos first, from the last so that removing one keeps the others' pollfds. */
        int polled = np;
        for (int i = polled - 1; i >= 0; i--) {
            if (!pf[i].revents)
                continue;
            bool done;
            uint32_t code = read_hello(&q[i], &done);
            int ch = 0;
            if (code == REPLY_OK && !done)
                continue;
            if (code == REPLY_OK)
                code = check_hello(be, m, &q[i], have, &ch);
            if (code != REPLY_OK) {
                refuse(&q[i], code, &refused, last, sizeof last);
                q[i] = q[--np];
                continue;
            }
            ddp_error e;
            free(q[i].body);
            int fd = q[i].fd;
            q[i] = q[--np];
            if (send_reply(fd, REPLY_OK, deadline, &e) != DDP_OK) {
                close(fd);
                st = ddp__err(err, DDP_ERR_NETWORK,
                              "tcp set-up: rank %d (member %d) connected, then its connection "
                              "failed: %s",
                              be->ranks[p], p, e.msg);
                goto out_close;
            }
            have[ch] = fd;
        }
        if (pf[polled].revents) {
            if (np == MAX_PENDING) { /* still full after the hellos above: the oldest goes */
                int o = 0;
                for (int i = 1; i < np; i++)
                    if (q[i].by < q[o].by)
                        o = i;
                refuse(&q[o], REPLY_MALFORMED, &refused, last, sizeof last);
                q[o] = q[--np];
            }
            int fd;
            ddp_error e;
            st = ddp__tcp_accept(lfd, ddp__now_ms(), &fd, &e);
            if (st == DDP_ERR_TIMEOUT) { /* nothing after all (a reset before we took it) */
                st = DDP_OK;
                continue;
            }
            if (st != DDP_OK) {
                ddp__err(err, st, "tcp set-up: waiting for rank %d (member %d): %s", be->ranks[p],
                         p, e.msg);
                goto out_close;
            }
            q[np++] = (pending){.fd = fd, .by = ddp__now_ms() + HELLO_MS};
        }
    }
    for (int i = 0; i < np; i++) /* set-up is done: those still showing a hello are not needed */
        refuse(&q[i], REPLY_MALFORMED, &refused, last, sizeof last);
    be->in_fd = have[CH_DATA];
    be->ctl_in_fd = have[CH_CTL];
    return DDP_OK;

out_close:
    for (int i = 0; i < np; i++) {
        close(q[i].fd);
        free(q[i].body);
    }
    close_fd(&have[CH_DATA]);
    close_fd(&have[CH_CTL]);
    return st;
}

/* One connection to next on a channel, with the hello sent; the reply is read later. */
static ddp_status open_channel(tcp_be *be, const ddp__members *m, ddp_store *store,
                               const char *host, int port, int ch, int64_t deadline, int *fd_out,
                               ddp_error *e)
{
    /* The listener is up before its address is published, so refusals are rare (a full backlog,
     * or a peer whose set-up failed and closed it: it says so in the store, looked at between
     * tries); retry them until the deadline. */
    int fd = -1;
    ddp_status st;
    int64_t next_look = ddp__now_ms() + ABORT_LOOK_MS;
    for (;;) {
        st = ddp__tcp_connect(host, port, deadline, &fd, e);
        if (st != DDP_ERR_NETWORK || ddp__ms_left(deadline) == 0)
            break;
        if (store && ddp__now_ms() >= next_look) {
            next_look = ddp__now_ms() + ABORT_LOOK_MS;
            ddp_store_set_timeout(store, ABORT_LOOK_MS);
            if (ddp_store_check_abort(store) == DDP_ERR_CLOSED)
                return ddp__err(e, DDP_ERR_CLOSED, "%s", ddp_store_last_error(store));
        }
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (st != DDP_OK)
        return st;
    size_t tl = strlen(m->token), pl = strlen(m->prefix);
    unsigned char *hello = malloc(HELLO_FIXED + tl + pl);
    if (!hello) {
        close(fd);
        return ddp__err(e, DDP_ERR_NOMEM, "out of memory");
    }
    put32(hello, HELLO_MAGIC);
    put32(hello + 4, HELLO_VERSION);
    put32(hello + 8, (uint32_t)be->me);
    put32(hello + 12, (uint32_t)be->n);
    put32(hello + 16, (uint32_t)ch);
    put32(hello + 20, (uint32_t)tl);
    put32(hello + 24, (uint32_t)pl);
    memcpy(hello + HELLO_FIXED, m->token, tl);
    memcpy(hello + HELLO_FIXED + tl, m->prefix, pl);
    st = ddp__send_all(fd, hello, HELLO_FIXED + tl + pl, deadline, e);
    free(hello);
    if (st != DDP_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return DDP_OK;
}

/* Reads next's address from the store and opens both channels to it. */
static ddp_status connect_next(tcp_be *be, const ddp__members *m, ddp_store *store,
                               int64_t deadline, int timeout_ms, char *addr, size_t cap,
                               ddp_error *err)
{
    int nx = next_of(be);
    char key[DDP_STORE_MAX_KEY + 1];
    ddp__fmt(key, sizeof key, "%s/addr/%d", m->prefix, nx);
    int left = ddp__ms_left(deadline);
    ddp_store_set_timeout(store, left > 0 ? left : 1);
    void *val = NULL;
    size_t len = 0;
    ddp_status st = ddp_store_get(store, key, &val, &len);
    if (st == DDP_ERR_CLOSED) /* another rank failed and said so (group.c's set-up key) */
        return ddp__err(err, st, "%s", ddp_store_last_error(store));
    if (st != DDP_OK) {
        char dur[32];
        ddp__fmt_duration(dur, sizeof dur, timeout_ms);
        return ddp__err(err, st,
                        "tcp set-up: rank %d (member %d) did not publish its address under '%s' "
                        "within %s: it has not started, or failed before joining (%s); check that "
                        "every rank runs with the same world size and backend",
                        be->ranks[nx], nx, key, dur, ddp_store_last_error(store));
    }
    char host[256];
    int port = 0;
    bool ok = len < 300 && !memchr(val, '\0', len) && parse_addr(val, host, sizeof host, &port);
    ddp__fmt(addr, cap, "%.*s", (int)(len < 300 ? len : 300), (const char *)val);
    free(val);
    if (!ok)
        return ddp__err(err, DDP_ERR_PROTOCOL,
                        "tcp set-up: rank %d (member %d) published a malformed address '%s' under "
                        "'%s'; is another job using the same store and run id?",
                        be->ranks[nx], nx, addr, key);
    ddp_error e;
    st = open_channel(be, m, store, host, port, CH_DATA, deadline, &be->out_fd, &e);
    if (st == DDP_OK)
        st = open_channel(be, m, store, host, port, CH_CTL, deadline, &be->ctl_out_fd, &e);
    if (st == DDP_ERR_CLOSED) /* another rank's set-up failure, in its words */
        return ddp__err(err, st, "%s", e.msg);
    if (st != DDP_OK)
        return ddp__err(err, st,
                        "tcp set-up: cannot connect to rank %d (member %d) at '%s': %s; check that "
                        "this host can reach it (firewall, the interface it picked toward "
                        "MASTER_ADDR)",
                        be->ranks[nx], nx, addr, e.msg);
    return DDP_OK;
}

/* next's answer to one of our hellos. */
static ddp_status read_reply(tcp_be *be, int fd, const char *addr, int64_t deadline, ddp_error *err)
{
    int nx = next_of(be);
    unsigned char r[8];
    ddp_error e;
    ddp_status st = ddp__recv_all(fd, r, sizeof r, deadline, &e);
    if (st != DDP_OK)
        return ddp__err(err, st,
                        "tcp set-up: no answer from rank %d (member %d) at '%s' to this rank's "
                        "connection: %s",
                        be->ranks[nx], nx, addr, e.msg);
    if (get32(r) == REPLY_MAGIC && get32(r + 4) == REPLY_OK)
        return DDP_OK;
    uint32_t code = get32(r) == REPLY_MAGIC ? get32(r + 4) : REPLY_MALFORMED;
    return ddp__err(err, code == REPLY_TOKEN ? DDP_ERR_AUTH : DDP_ERR_PROTOCOL,
                    "tcp set-up: rank %d (member %d) at '%s' refused this rank's connection (%s); "
                    "every rank must use the job's DDP_STORE_TOKEN and the same world size",
                    be->ranks[nx], nx, addr, reply_reason(code));
}

/* The numeric address listener lfd is bound to (DDP_LOCAL_ADDR may be a name), into host; the
 * wildcard (0.0.0.0, ::), which the others would take for their own host, is refused. */
static ddp_status bound_addr(int lfd, char *host, size_t cap, int rank, ddp_error *err)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(lfd, (struct sockaddr *)&ss, &sl) != 0)
        return ddp__err(err, DDP_ERR_SYSTEM, "tcp set-up: getsockname: %s", strerror(errno));
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)&ss;
    const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)&ss;
    bool any = ss.ss_family == AF_INET ? v4->sin_addr.s_addr == htonl(INADDR_ANY)
                                       : IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr);
    if (any)
        return ddp__err(err, DDP_ERR_INVALID,
                        "tcp set-up: rank %d: DDP_LOCAL_ADDR '%s' (ddprun --local_addr) is the "
                        "wildcard address, which the other ranks cannot connect to; give one of "
                        "this host's own addresses",
                        rank, host);
    const void *a =
        ss.ss_family == AF_INET ? (const void *)&v4->sin_addr : (const void *)&v6->sin6_addr;
    char num[INET6_ADDRSTRLEN];
    if (!inet_ntop(ss.ss_family, a, num, sizeof num))
        return ddp__err(err, DDP_ERR_SYSTEM, "tcp set-up: inet_ntop: %s", strerror(errno));
    ddp__fmt(host, cap, "%s", num);
    return DDP_OK;
}

/* Listens, publishes the address, connects to next, accepts prev, then reads next's answers.
 * Connecting and sending a hello never wait for the peer to accept, so no member waits on
 * another in a circle. */
static ddp_status connect_ring(tcp_be *be, const ddp__members *m, ddp_store *store, int timeout_ms,
                               ddp_error *err)
{
    int64_t deadline = ddp__now_ms() + timeout_ms;
    char host[256];
    ddp_status st = DDP_OK;
    if (m->local_addr && *m->local_addr)
        ddp__fmt(host, sizeof host, "%s", m->local_addr);
    else
        st = ddp__local_addr_toward(m->master_addr, host, sizeof host, err);
    if (st != DDP_OK)
        return st;
    int lfd = -1, port = 0;
    st = ddp__tcp_listen(host, 0, 64, &lfd, &port, err);
    if (st != DDP_OK) {
        if (m->local_addr && *m->local_addr && err) {
            char why[DDP_ERRMSG_MAX];
            ddp__fmt(why, sizeof why, "%s", err->msg);
            ddp__err(err, st,
                     "tcp set-up: rank %d cannot listen on DDP_LOCAL_ADDR '%s' (ddprun "
                     "--local_addr): %s; give an address of this host, or unset it to use the "
                     "interface toward MASTER_ADDR",
                     be->ranks[be->me], host, why);
        }
        return st;
    }
    if (m->local_addr && *m->local_addr &&
        (st = bound_addr(lfd, host, sizeof host, be->ranks[be->me], err)) != DDP_OK)
        goto out_close_listener;
    char me_addr[300], key[DDP_STORE_MAX_KEY + 1], next_addr[320];
    ddp__fmt(me_addr, sizeof me_addr, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    ddp__fmt(key, sizeof key, "%s/addr/%d", m->prefix, be->me);
    ddp_store_set_timeout(store, timeout_ms);
    st = ddp_store_set(store, key, me_addr, strlen(me_addr));
    if (st != DDP_OK) {
        ddp__err(err, st, "tcp set-up: rank %d cannot publish its address under '%s': %s",
                 be->ranks[be->me], key, ddp_store_last_error(store));
        goto out_close_listener;
    }
    st = connect_next(be, m, store, deadline, timeout_ms, next_addr, sizeof next_addr, err);
    if (st == DDP_OK)
        st = accept_prev(be, m, store, lfd, me_addr, deadline, timeout_ms, err);
    if (st == DDP_OK)
        st = read_reply(be, be->out_fd, next_addr, deadline, err);
    if (st == DDP_OK)
        st = read_reply(be, be->ctl_out_fd, next_addr, deadline, err);
out_close_listener:
    close(lfd); /* set-up is over either way: no one else may connect */
    return st;
}

/* ---- keepalive ------------------------------------------------------------------------------- */

/* TCP keepalive on every connection (ddp__tcp_keepalive, util/net.h), so a peer whose host
 * vanishes without a FIN or RST fails the connection within ka_bound_s (see the top of
 * tcp_int.h) instead of the collective's deadline, and while no collective runs the next one
 * fails at once. From the set-up timeout T (the group timeout, at most 5 min): T/4 in all, at
 * least 4 s, at most 60 s. A slow or stopped rank is never mistaken for a lost one: that is the
 * deadline's job. Keepalive probes only a connection with nothing unacknowledged, so a member
 * still sending to a vanished peer does not notice itself; the member after the vanished one
 * does (it only receives from it) and its notice ends the group on every member. No
 * TCP_USER_TIMEOUT: it would also end a connection whose receiver is stopped (SIGSTOP, a
 * debugger) with a full window, long before the deadline. */
static void set_keepalive(tcp_be *be, int timeout_ms)
{
    be->ka_bound_s = ddp__keepalive_bound(timeout_ms, NULL, NULL);
    int fds[4] = {be->out_fd, be->in_fd, be->ctl_out_fd, be->ctl_in_fd};
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0)
            (void)ddp__tcp_keepalive(fds[i], timeout_ms);
}

static void tcp_destroy(void *bev)
{
    tcp_be *be = bev;
    if (!be)
        return;
    close_fd(&be->out_fd);
    close_fd(&be->in_fd);
    close_fd(&be->ctl_out_fd);
    close_fd(&be->ctl_in_fd);
    close_fd(&be->wake_fd);
    free(be->ranks);
    free(be->sends);
    free(be->recvs);
    free(be->stage);
    free(be->bar);
    free(be->f32);
    free(be->rs);
    free(be->gather);
    free((void *)be->srcs);
    free(be);
}

static const ddp__backend_ops tcp_ops = {
    .name = "tcp",
    .run = ddp__tcp_run,
    .fuses_avg = true, /* (bfloat16/float16 divided before their one rounding: ring.c) */
    .alloc = NULL,
    .free = NULL,
    .abort = ddp__tcp_abort,
    .destroy = tcp_destroy,
};

ddp_status ddp__tcp_create(const ddp__members *m, ddp_store *store, int timeout_ms, void **be_out,
                           const ddp__backend_ops **ops_out, ddp_error *err)
{
    if (!m || !be_out || !ops_out || m->n < 1 || m->me < 0 || m->me >= m->n || !m->ranks ||
        !m->prefix || (m->n > 1 && !store))
        return ddp__err(err, DDP_ERR_INVALID,
                        "tcp backend: invalid members (member %d of %d) or no store",
                        m ? m->me : -1, m ? m->n : -1);
    if (strlen(m->prefix) > DDP_STORE_MAX_KEY - 32)
        return ddp__err(err, DDP_ERR_INVALID, "tcp backend: the store-key prefix is too long");
    if (m->token && strlen(m->token) > MAX_TOKEN)
        return ddp__err(err, DDP_ERR_INVALID, "tcp backend: the token is longer than %d bytes",
                        MAX_TOKEN);
    if (timeout_ms <= 0)
        timeout_ms = DDP_STORE_DEFAULT_TIMEOUT_MS;
    ddp__members mm = *m;
    if (!mm.token)
        mm.token = "";

    ddp_status st = DDP_ERR_NOMEM;
    tcp_be *be = calloc(1, sizeof *be);
    if (!be)
        return ddp__err(err, DDP_ERR_NOMEM, "tcp backend: out of memory");
    be->me = m->me;
    be->n = m->n;
    be->out_fd = be->in_fd = be->ctl_out_fd = be->ctl_in_fd = be->wake_fd = -1;
    atomic_init(&be->abort_claimed, false);
    atomic_init(&be->aborted, false);
    atomic_init(&be->told, false);
    be->ranks = malloc(sizeof(int) * (size_t)m->n);
    be->sends = calloc(2 * (size_t)m->n, sizeof(seg));
    be->recvs = calloc(2 * (size_t)m->n, sizeof(seg));
    be->bar = calloc((size_t)m->n, 1);
    be->srcs = calloc((size_t)m->n, sizeof *be->srcs);
    be->small_max = TCP_SMALL_MAX;
    be->stage = m->n > 1 ? malloc(TCP_CHUNK) : NULL;
    if (!be->ranks || !be->sends || !be->recvs || !be->bar || !be->srcs ||
        (m->n > 1 && !be->stage)) {
        ddp__err(err, DDP_ERR_NOMEM, "tcp backend: out of memory");
        goto out_destroy;
    }
    memcpy(be->ranks, m->ranks, sizeof(int) * (size_t)m->n);
    be->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (be->wake_fd < 0) {
        st = ddp__err(err, DDP_ERR_SYSTEM, "tcp backend: eventfd failed: %s", strerror(errno));
        goto out_destroy;
    }
    if (m->n > 1) {
        st = connect_ring(be, &mm, store, timeout_ms, err);
        if (st != DDP_OK)
            goto out_destroy;
        set_keepalive(be, timeout_ms);
    }
    be->box[BOX_NEXT].fd = be->out_fd;
    be->box[BOX_PREV].fd = be->ctl_in_fd;
    *be_out = be;
    *ops_out = &tcp_ops;
    return DDP_OK;

out_destroy:
    tcp_destroy(be);
    return st;
}

static bool tcp_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (!s->store) { /* set up through MPI (mpirun): there is no store to meet through */
        ddp__fmt(why, cap,
                 "needs the rendezvous store, and this job was set up through MPI (mpirun); use "
                 "backend 'auto' or 'mpi', or start the job with ddprun");
        return false;
    }
    return true; /* any placement: every member can reach the others over the network */
}

static ddp_status tcp_create_entry(const ddp__setup *s, void **be, const ddp__backend_ops **ops,
                                   ddp_error *err)
{
    return ddp__tcp_create(&s->m, s->store, s->timeout_ms, be, ops, err);
}

const ddp__backend ddp__tcp_backend = {
    .name = "tcp",
    .usable = tcp_usable,
    .create = tcp_create_entry,
    .boot = DDP__BOOT_STORE,
};
