/*
 * net.h — TCP sockets with deadlines. Every socket these return is non-blocking and close-on-exec;
 * reads and writes loop over short transfers and EINTR, and wait with poll() until a deadline
 * (absolute, in ddp__now_ms() milliseconds), so no caller can block forever.
 */
#ifndef DDP_NET_H
#define DDP_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"

/* Listens on host:port (host NULL or "" = all interfaces; port 0 = a free one). Writes the socket
 * to *fd and the bound port to *bound_port. A taken port is DDP_ERR_ADDR_IN_USE. */
ddp_status ddp__tcp_listen(const char *host, int port, int backlog, int *fd, int *bound_port,
                           ddp_error *err);

/* One connection attempt to host:port, waiting until deadline_ms. DDP_ERR_NETWORK when refused
 * or unreachable (the caller may retry), DDP_ERR_TIMEOUT when the deadline passes. */
ddp_status ddp__tcp_connect(const char *host, int port, int64_t deadline_ms, int *fd,
                            ddp_error *err);

/* Sends / receives exactly n bytes before deadline_ms. A closed peer is DDP_ERR_NETWORK. */
ddp_status ddp__send_all(int fd, const void *buf, size_t n, int64_t deadline_ms, ddp_error *err);
ddp_status ddp__recv_all(int fd, void *buf, size_t n, int64_t deadline_ms, ddp_error *err);

/* Waits until deadline_ms for a connection on the listening socket lfd and accepts it: *fd is
 * non-blocking, close-on-exec, with TCP_NODELAY. DDP_ERR_TIMEOUT when the deadline passes. */
ddp_status ddp__tcp_accept(int lfd, int64_t deadline_ms, int *fd, ddp_error *err);

/* Writes to buf (cap bytes; INET6_ADDRSTRLEN is enough) the numeric address of this host's
 * interface that routes toward host, found with a UDP socket connect()ed to it (no packet is
 * sent). A loopback host (127.0.0.0/8, ::1, "localhost") gives "127.0.0.1". */
ddp_status ddp__local_addr_toward(const char *host, char *buf, size_t cap, ddp_error *err);

/* TCP keepalive from a timeout T (ms), so that a connection to a peer whose host vanished
 * without a FIN or RST (power lost, cable pulled, a VM gone) fails on its own instead of staying
 * open: probes start after T/8 of silence, go every T/24, and 3 unanswered ones end it — T/4 in
 * all, at least 4 s, at most 60 s (T/8 at most 30 s, T/24 at most 10 s). A live peer's kernel
 * answers probes, so a slow or stopped process is never taken for a lost one; keepalive probes
 * only a connection with nothing unacknowledged. ddp__keepalive_bound: that bound in seconds, and
 * the idle time and interval (either out pointer may be NULL). ddp__tcp_keepalive: sets
 * SO_KEEPALIVE and TCP_KEEPIDLE/INTVL/CNT on fd, best effort (a kernel without them still has the
 * caller's deadlines); returns the bound. Users: the tcp backend (group timeout), the store's
 * client (its call timeout) and server (DDP_STORE_DEFAULT_TIMEOUT_MS). */
int ddp__keepalive_bound(int timeout_ms, int *idle_s, int *intvl_s);
int ddp__tcp_keepalive(int fd, int timeout_ms);

/* Makes fd non-blocking and close-on-exec; false on failure (errno set). */
int ddp__set_nonblock_cloexec(int fd);

/* "addr:port" of the socket's peer, or "?" */
void ddp__peer_name(int fd, char *buf, size_t cap);

#endif /* DDP_NET_H */
