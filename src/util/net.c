/*
 * net.c — TCP sockets with deadlines, for the store (and later the tcp backend).
 * IPv4 and IPv6 through getaddrinfo(); no TLS (the store's token keeps strangers out, it does not
 * hide traffic — DESIGN.md's failure model asks for the first, not the second).
 */
#define _GNU_SOURCE
#include "util/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/util.h"

int ddp__set_nonblock_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    int fdfl = fcntl(fd, F_GETFD);
    if (fdfl < 0 || fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC) < 0)
        return -1;
    return 0;
}

static ddp_status resolve(const char *host, int port, bool passive, struct addrinfo **res,
                          ddp_error *err)
{
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const char *h = (host && *host) ? host : NULL;
    if (!h && passive)
        hints.ai_family = AF_INET; /* all interfaces: 0.0.0.0 */
    int rc = getaddrinfo(h, portstr, &hints, res);
    if (rc != 0)
        return ddp__err(err, DDP_ERR_NETWORK, "cannot resolve host '%s': %s; check the address",
                        h ? h : "*", gai_strerror(rc));
    return DDP_OK;
}

ddp_status ddp__tcp_listen(const char *host, int port, int backlog, int *fd_out, int *bound_port,
                           ddp_error *err)
{
    if (port < 0 || port > 65535)
        return ddp__err(err, DDP_ERR_INVALID, "port %d is out of range 0-65535", port);
    struct addrinfo *res;
    ddp_status st = resolve(host, port, true, &res, err);
    if (st != DDP_OK)
        return st;
    const char *shown = (host && *host) ? host : "0.0.0.0";
    int saved = 0;
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        /* SO_REUSEADDR lets a restarted job reuse a port in TIME_WAIT; Linux still refuses a port
         * with a live listener, so "address in use" keeps meaning what it says. */
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        saved = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (saved == EADDRINUSE)
            return ddp__err(err, DDP_ERR_ADDR_IN_USE,
                            "cannot listen on '%s:%d': address already in use (errno %d); another "
                            "job or program holds this port: choose another port (ddprun "
                            "--master_port N), or use ddprun --standalone to take a free one",
                            shown, port, saved);
        return ddp__err(err, DDP_ERR_SYSTEM, "cannot listen on '%s:%d': %s (errno %d)", shown, port,
                        strerror(saved), saved);
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        int e = errno;
        close(fd);
        return ddp__err(err, DDP_ERR_SYSTEM, "getsockname on '%s:%d' failed: %s", shown, port,
                        strerror(e));
    }
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return DDP_OK;
}

/* Waits for events on fd until deadline; 1 ready, 0 timed out, -1 error (errno). */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, ddp__ms_left(deadline_ms));
        if (rc > 0)
            return 1;
        if (rc == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

ddp_status ddp__tcp_connect(const char *host, int port, int64_t deadline_ms, int *fd_out,
                            ddp_error *err)
{
    struct addrinfo *res;
    ddp_status st = resolve(host, port, false, &res, err);
    if (st != DDP_OK)
        return st;
    int saved = ECONNREFUSED;
    bool timed_out = false;
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int rc;
        do
            rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        while (rc < 0 && errno == EINTR);
        if (rc < 0 && errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            if (w == 0) {
                timed_out = true;
                saved = ETIMEDOUT;
            } else {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (w < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
                    soerr = errno;
                rc = soerr == 0 ? 0 : -1;
                saved = soerr;
            }
        } else if (rc < 0) {
            saved = errno;
        }
        if (rc == 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            break;
        }
        close(fd);
        fd = -1;
        if (timed_out)
            break;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (timed_out)
            return ddp__err(err, DDP_ERR_TIMEOUT, "connecting to '%s:%d' timed out", host, port);
        ddp_status nst = ddp__err(err, DDP_ERR_NETWORK, "cannot connect to '%s:%d': %s", host, port,
                                  strerror(saved));
        errno = saved; /* for a caller that tells a refusal (nothing listens) from the rest */
        return nst;
    }
    *fd_out = fd;
    return DDP_OK;
}

ddp_status ddp__send_all(int fd, const void *buf, size_t n, int64_t deadline_ms, ddp_error *err)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline_ms);
            if (w == 0)
                return ddp__err(err, DDP_ERR_TIMEOUT, "send timed out");
            if (w < 0)
                return ddp__err(err, DDP_ERR_SYSTEM, "poll failed: %s", strerror(errno));
            continue;
        }
        return ddp__err(err, DDP_ERR_NETWORK, "connection lost while sending: %s", strerror(errno));
    }
    return DDP_OK;
}

ddp_status ddp__recv_all(int fd, void *buf, size_t n, int64_t deadline_ms, ddp_error *err)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return ddp__err(err, DDP_ERR_NETWORK, "connection closed by the peer");
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(fd, POLLIN, deadline_ms);
            if (w == 0)
                return ddp__err(err, DDP_ERR_TIMEOUT, "receive timed out");
            if (w < 0)
                return ddp__err(err, DDP_ERR_SYSTEM, "poll failed: %s", strerror(errno));
            continue;
        }
        return ddp__err(err, DDP_ERR_NETWORK, "connection lost while receiving: %s",
                        strerror(errno));
    }
    return DDP_OK;
}

void ddp__peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        }
    }
    ddp__fmt(buf, cap, "%s:%d", host, port);
}

ddp_status ddp__tcp_accept(int lfd, int64_t deadline_ms, int *fd_out, ddp_error *err)
{
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            int one = 1;
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fd_out = fd;
            return DDP_OK;
        }
        /* A connection that was reset before we took it is not an error of the listener. */
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return ddp__err(err, DDP_ERR_SYSTEM, "accept failed: %s (errno %d)", strerror(errno),
                            errno);
        int w = wait_fd(lfd, POLLIN, deadline_ms);
        if (w == 0)
            return ddp__err(err, DDP_ERR_TIMEOUT, "no connection arrived before the deadline");
        if (w < 0)
            return ddp__err(err, DDP_ERR_SYSTEM, "poll failed: %s", strerror(errno));
    }
}

int ddp__keepalive_bound(int timeout_ms, int *idle_s, int *intvl_s)
{
    int t = timeout_ms / 1000;
    int idle = t / 8 < 1 ? 1 : t / 8 > 30 ? 30 : t / 8;
    int intvl = t / 24 < 1 ? 1 : t / 24 > 10 ? 10 : t / 24;
    if (idle_s)
        *idle_s = idle;
    if (intvl_s)
        *intvl_s = intvl;
    return idle + 3 * intvl;
}

int ddp__tcp_keepalive(int fd, int timeout_ms)
{
    int idle, intvl, cnt = 3, one = 1;
    int bound = ddp__keepalive_bound(timeout_ms, &idle, &intvl);
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    return bound;
}

static bool is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
            return true;
        /* ::ffff:127.x.y.z */
        return IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127;
    }
    return false;
}

ddp_status ddp__local_addr_toward(const char *host, char *buf, size_t cap, ddp_error *err)
{
    if (!host || !*host) {
        ddp__fmt(buf, cap, "127.0.0.1");
        return DDP_OK;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    struct addrinfo *res;
    /* Port 9 (discard) only gives connect() a destination; nothing is ever sent. */
    int rc = getaddrinfo(host, "9", &hints, &res);
    if (rc != 0)
        return ddp__err(err, DDP_ERR_NETWORK,
                        "cannot resolve '%s' to pick the local interface toward it: %s; check "
                        "MASTER_ADDR",
                        host, gai_strerror(rc));
    int saved = 0;
    ddp_status st = DDP_ERR_NETWORK;
    for (struct addrinfo *ai = res; ai && st != DDP_OK; ai = ai->ai_next) {
        if (is_loopback(ai->ai_addr)) {
            ddp__fmt(buf, cap, "127.0.0.1");
            st = DDP_OK;
            break;
        }
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
            const void *a = ss.ss_family == AF_INET6
                                ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;
            if (inet_ntop(ss.ss_family, a, buf, (socklen_t)cap))
                st = DDP_OK;
            else
                saved = errno;
        } else {
            saved = errno;
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (st != DDP_OK)
        return ddp__err(err, DDP_ERR_NETWORK,
                        "no local interface routes toward '%s': %s; check MASTER_ADDR and this "
                        "host's network configuration",
                        host, strerror(saved));
    return DDP_OK;
}
