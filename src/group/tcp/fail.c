/*
 * fail.c — how the tcp backend fails (tcp_int.h): the first failure is kept and every later run
 * repeats it; notices carry it to the neighbours; abort(); and the messages that explain a
 * timeout or collectives that differ.
 *
 * The member that fails first (a timeout, a peer's EOF, abort(), collectives that differ) sends
 * one notice with its message to both neighbours — backward on the reverse direction of the data
 * connection from prev, forward on the control connection — and shuts its sockets; whoever
 * receives a notice fails with that message and passes it on. So every member reports the first
 * cause ("rank 3 aborted the group: …", "… timed out …: no data from rank 5") at once, rather
 * than "my neighbour closed its connection" or its own deadline much later. A member that sees
 * EOF first waits up to NOTICE_GRACE_MS for the notice that explains it; without one, the peer
 * probably died.
 * Not here: moving data (ring.c) and connecting (setup.c); nothing is ever retried.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "group/tcp/tcp_int.h"
#include "util/util.h"

/* Statuses travel as their negation, a small positive number. */
static uint32_t status_wire(ddp_status st)
{
    return (uint32_t)(-(int32_t)st);
}

static ddp_status status_from_wire(uint32_t v)
{
    return (ddp_status)(-(int32_t)v);
}

/* "allreduce #17" */
static void coll_name(const ddp__coll *c, char *buf, size_t cap)
{
    ddp__fmt(buf, cap, "%s #%llu", ddp__kind_name(c->kind), (unsigned long long)c->seq);
}

/* ---- failure and notices --------------------------------------------------------------------- */

static void send_notice(int fd, const unsigned char *buf, size_t len)
{
    if (fd < 0)
        return;
    /* Nothing else is ever written in this direction, so the notice fits the socket buffer and
     * never blocks; if it fails, that peer is gone and the others learn from EOF. */
    ssize_t k;
    do
        k = send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
}

/* Sends this member's one notice to both neighbours, keeping the connections open. Any thread;
 * only the first call sends. */
static void send_own_notice(tcp_be *be, ddp_status st, const char *text)
{
    if (be->n > 1 && !atomic_exchange(&be->told, true)) {
        unsigned char buf[NOTICE_FIXED + NOTICE_MAX];
        size_t len = strlen(text);
        if (len > NOTICE_MAX)
            len = NOTICE_MAX;
        put32(buf, NOTICE_MAGIC);
        put32(buf + 4, status_wire(st));
        put32(buf + 8, (uint32_t)len);
        memcpy(buf + NOTICE_FIXED, text, len);
        send_notice(be->in_fd, buf, NOTICE_FIXED + len);
        send_notice(be->ctl_out_fd, buf, NOTICE_FIXED + len);
    }
}

/* Sends the notice (if not yet sent) and shuts every connection, so the peers see EOF at once. */
static void tell_peers(tcp_be *be, ddp_status st, const char *text)
{
    send_own_notice(be, st, text);
    int fds[4] = {be->out_fd, be->in_fd, be->ctl_out_fd, be->ctl_in_fd};
    for (int i = 0; i < 4; i++)
        if (fds[i] >= 0)
            (void)shutdown(fds[i], SHUT_RDWR);
}

void ddp__tcp_record(const tcp_be *be, ddp__fail *f)
{
    if (f) {
        f->status = be->fail_st;
        f->peer = be->fail_peer;
        ddp__fmt(f->msg, sizeof f->msg, "%s", be->fail_msg);
    }
}

static ddp_status vfail(tcp_be *be, ddp__fail *f, ddp_status st, bool peer, const char *fmt,
                        va_list ap) DDP_PRINTF(5, 0);
static ddp_status vfail(tcp_be *be, ddp__fail *f, ddp_status st, bool peer, const char *fmt,
                        va_list ap)
{
    if (be->fail_st == DDP_OK) {
        ddp__vfmt(be->fail_msg, sizeof be->fail_msg, fmt, ap);
        be->fail_st = st;
        be->fail_peer = peer;
        char text[DDP_ERRMSG_MAX + 32];
        ddp__fmt(text, sizeof text, "%s (reported by rank %d)", be->fail_msg, be->ranks[be->me]);
        tell_peers(be, st, text);
    }
    ddp__tcp_record(be, f);
    return be->fail_st;
}

/* Records the backend's first failure (later runs repeat it), copies it into f, and ends the
 * group for the peers too (see the top of the file). */
ddp_status ddp__tcp_fail(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddp_status r = vfail(be, f, st, false, fmt, ap);
    va_end(ap);
    return r;
}

/* The same for a failure whose cause is another member (it died, its host went away). */
static ddp_status fail_peer(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
    DDP_PRINTF(4, 5);
static ddp_status fail_peer(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddp_status r = vfail(be, f, st, true, fmt, ap);
    va_end(ap);
    return r;
}

ddp_status ddp__tcp_fail_aborted(tcp_be *be, const ddp__coll *c, ddp__fail *f)
{
    char what[64];
    coll_name(c, what, sizeof what);
    return ddp__tcp_fail(be, f, DDP_ERR_CLOSED, "%s was aborted on rank %d: %s", what,
                         be->ranks[be->me], be->why);
}

/* Reads what waits in a notice inbox (a partial notice resumes on the next call). NOTICE_EOF
 * sets *e to the errno, 0 for a plain EOF. */
static int read_notice(inbox *b, int *e)
{
    if (b->closed) {
        *e = b->err;
        return NOTICE_EOF;
    }
    for (;;) {
        size_t need = NOTICE_FIXED;
        if (b->fill >= NOTICE_FIXED) {
            uint32_t st = get32(b->buf + 4), len = get32(b->buf + 8);
            if (get32(b->buf) != NOTICE_MAGIC || len > NOTICE_MAX || st == 0 ||
                st > status_wire(DDP_ERR_CLOSED))
                return NOTICE_BAD;
            need += len;
            if (b->fill == need)
                return NOTICE_GOT;
        }
        ssize_t k = recv(b->fd, b->buf + b->fill, need - b->fill, MSG_DONTWAIT);
        if (k > 0) {
            b->fill += (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return NOTICE_NONE;
        *e = k == 0 ? 0 : errno;
        b->closed = true;
        b->err = *e;
        return NOTICE_EOF;
    }
}

/* Fails with the notice in b, and passes it on unchanged. */
static ddp_status fail_notice(tcp_be *be, const inbox *b, ddp__fail *f)
{
    if (be->fail_st == DDP_OK) {
        int len = (int)get32(b->buf + 8);
        ddp__fmt(be->fail_msg, sizeof be->fail_msg, "%.*s", len,
                 (const char *)b->buf + NOTICE_FIXED);
        be->fail_st = status_from_wire(get32(b->buf + 4));
        be->fail_peer = true;
        tell_peers(be, be->fail_st, be->fail_msg);
    }
    ddp__tcp_record(be, f);
    return be->fail_st;
}

/* prev's data stopped: if a failure made it stop, the notice is on its way (from prev on the
 * control connection, or round the ring from next), so wait a moment for it; a notice says what
 * happened, where EOF alone can only guess. Returns the inbox that has one, or NULL. */
static inbox *await_notice_for(tcp_be *be, int grace_ms, bool prev_only)
{
    int64_t until = ddp__now_ms() + grace_ms;
    bool open[2] = {!be->box[0].closed, !be->box[1].closed};
    if (prev_only)
        open[BOX_NEXT] = false;
    for (;;) {
        struct pollfd p[3];
        int np = 0;
        for (int i = 0; i < 2; i++) {
            if (!open[i])
                continue;
            int e = 0;
            int r = be->box[i].held ? NOTICE_GOT : read_notice(&be->box[i], &e);
            if (r == NOTICE_GOT)
                return &be->box[i];
            if (r != NOTICE_NONE)
                open[i] = false; /* closed or garbage: nothing will come this way */
            else
                p[np++] = (struct pollfd){.fd = be->box[i].fd, .events = POLLIN};
        }
        int left = ddp__ms_left(until);
        if (np == 0 || left == 0 || atomic_load(&be->aborted))
            return NULL;
        p[np++] = (struct pollfd){.fd = be->wake_fd, .events = POLLIN};
        if (poll(p, (nfds_t)np, left) < 0 && errno != EINTR)
            return NULL;
    }
}

/* A connection to member `peer` failed (EOF when e == 0). */
ddp_status ddp__tcp_fail_conn(xfer *x, ddp__fail *f, int peer, int e)
{
    tcp_be *be = x->be;
    if (atomic_load(&be->aborted))
        return ddp__tcp_fail_aborted(be, x->c, f);
    if (be->fail_st == DDP_OK) {
        /* Whichever neighbour's connection broke, a failure elsewhere may be the cause, and its
         * notice is on the way (a neighbour that failed first sends its notice before it shuts
         * its sockets, so it usually waits in our buffer already). */
        inbox *b = await_notice_for(be, NOTICE_GRACE_MS, false);
        if (b)
            return fail_notice(be, b, f);
    }
    char what[64];
    coll_name(x->c, what, sizeof what);
    if (e == 0 || e == ECONNRESET || e == EPIPE)
        return fail_peer(be, f, DDP_ERR_NETWORK,
                         "rank %d closed its connection during %s: it died, or left the group "
                         "without it (it called fewer collectives than this rank, or other ones: "
                         "DDP_DEBUG=1 checks)",
                         be->ranks[peer], what);
    /* A host that vanished shows as ETIMEDOUT, or, when the kernel's neighbour resolution gave
     * up first while it retransmitted, as the "unreachable" it recorded: the same failure. */
    if (e == ETIMEDOUT || e == EHOSTUNREACH || e == EHOSTDOWN)
        return fail_peer(be, f, DDP_ERR_NETWORK,
                         "rank %d stopped answering on the network (no reply to TCP keepalive "
                         "within %d s) before %s finished: its host may be down or cut "
                         "off (%s); check that host and the network between",
                         be->ranks[peer], be->ka_bound_s, what, strerror(e));
    if (e == ENETUNREACH) /* this host lost its route (an interface down, a route removed) */
        return ddp__tcp_fail(be, f, DDP_ERR_NETWORK,
                             "connection with rank %d failed during %s: this host has no route "
                             "to its network any more (%s); check this host's interfaces and "
                             "routes",
                             be->ranks[peer], what, strerror(e));
    return ddp__tcp_fail(be, f, DDP_ERR_NETWORK, "connection with rank %d failed during %s: %s",
                         be->ranks[peer], what, strerror(e));
}

/* Handles whatever the notice inboxes hold. A notice fails this member at once. EOF from next
 * matters only while this collective still has bytes to send it: a neighbour that finished the
 * last collective and left is no failure. EOF on the control connection from prev never matters
 * by itself: the data connection shows whether prev's data stopped early. */
ddp_status ddp__tcp_check_notices(xfer *x, ddp__fail *f, bool sending)
{
    tcp_be *be = x->be;
    for (int i = 0; i < 2; i++) {
        int e = 0, peer = i == BOX_NEXT ? next_of(be) : prev_of(be);
        if (be->box[i].held)
            continue;
        switch (read_notice(&be->box[i], &e)) {
        case NOTICE_GOT:
            /* our own abort's notice, passed back by a neighbour, must not hide the abort */
            if (atomic_load(&be->aborted))
                return ddp__tcp_fail_aborted(be, x->c, f);
            /* A timeout reported by our successor only says that it waited on us, while we
             * wait on our predecessor: our own deadline will name the rank that is stuck, so
             * set it aside and keep waiting (fail_conn and our own timeout still see it). */
            if (i == BOX_NEXT && status_from_wire(get32(be->box[i].buf + 4)) == DDP_ERR_TIMEOUT) {
                be->box[i].held = true;
                break;
            }
            return fail_notice(be, &be->box[i], f);
        case NOTICE_EOF:
            if (i == BOX_NEXT && sending)
                return ddp__tcp_fail_conn(x, f, peer, e);
            break;
        case NOTICE_BAD:
            return ddp__tcp_fail(
                be, f, DDP_ERR_PROTOCOL,
                "rank %d sent bytes that are not a notice on a connection that carries "
                "only notices toward this rank (during %s #%llu)",
                be->ranks[peer], ddp__kind_name(x->c->kind), (unsigned long long)x->c->seq);
        default: break;
        }
    }
    return DDP_OK;
}

/* ---- collectives that differ ----------------------------------------------------------------- */

/* "allgather #18 (float32 × 10)", for a mismatch message. */
static void describe_header(const unsigned char *h, char *buf, size_t cap)
{
    unsigned kind = h[4], dtype = h[5], op = h[6];
    unsigned long long seq = (unsigned long long)get64(h + 12);
    unsigned long long count = (unsigned long long)get64(h + 20);
    if (kind >= DDP__KIND_COUNT || dtype >= DDP_DTYPE_COUNT || op >= DDP_OP_COUNT)
        ddp__fmt(buf, cap, "an unknown collective (kind %u) #%llu", kind, seq);
    else if (kind == DDP__BARRIER)
        ddp__fmt(buf, cap, "barrier #%llu", seq);
    else if (kind == DDP__BROADCAST)
        ddp__fmt(buf, cap, "broadcast #%llu (%s × %llu, root member %u)", seq,
                 ddp_dtype_name((ddp_dtype)dtype), count, (unsigned)get32(h + 8));
    else if (is_reduction((ddp__kind)kind))
        ddp__fmt(buf, cap, "%s #%llu (%s × %llu, %s)", ddp__kind_name((ddp__kind)kind), seq,
                 ddp_dtype_name((ddp_dtype)dtype), count, ddp_op_name((ddp_op)op));
    else
        ddp__fmt(buf, cap, "%s #%llu (%s × %llu)", ddp__kind_name((ddp__kind)kind), seq,
                 ddp_dtype_name((ddp_dtype)dtype), count);
}

ddp_status ddp__tcp_check_header(xfer *x, ddp__fail *f)
{
    tcp_be *be = x->be;
    if (memcmp(be->hdr_in, be->hdr_out, HDR_BYTES) == 0)
        return DDP_OK;
    int p = prev_of(be);
    char what[64];
    coll_name(x->c, what, sizeof what);
    if (get32(be->hdr_in) != HDR_MAGIC)
        return ddp__tcp_fail(
            be, f, DDP_ERR_PROTOCOL,
            "rank %d sent bytes that are not a collective header at the start of %s: the "
            "tcp streams are out of step (a collective with another count on some rank?)",
            be->ranks[p], what);
    if (memcmp(be->hdr_in, be->hdr_out, 7) == 0 && memcmp(be->hdr_in + 8, be->hdr_out + 8, 24) == 0)
        return ddp__tcp_fail(be, f, DDP_ERR_INVALID,
                             "rank %d runs %s with the %s allreduce while rank %d uses the %s one: "
                             "the ranks were built with different tcp thresholds; use one build "
                             "of ddpc on every host",
                             be->ranks[p], what, be->hdr_in[7] ? "small-message" : "ring",
                             be->ranks[be->me], be->hdr_out[7] ? "small-message" : "ring");
    char theirs[160], mine[160], why[200] = "";
    describe_header(be->hdr_in, theirs, sizeof theirs);
    describe_header(be->hdr_out, mine, sizeof mine);
    /* A broadcast whose ranks named different roots: a root only sends, so none of them saw it
     * then; its data is found here, at the next collective (DDP_DEBUG=1 finds it at the call) */
    if (be->hdr_in[4] == DDP__BROADCAST && get64(be->hdr_in + 12) < get64(be->hdr_out + 12))
        ddp__fmt(why, sizeof why,
                 " (that broadcast's data was never received here: the ranks most likely "
                 "passed different roots to it)");
    return ddp__tcp_fail(
        be, f, DDP_ERR_INVALID,
        "collectives differ across ranks: rank %d runs %s while rank %d runs %s%s; every "
        "rank must call the same collectives in the same order with the same count, "
        "dtype, op and root (DDP_DEBUG=1 checks this before each call)",
        be->ranks[p], theirs, be->ranks[be->me], mine, why);
}

/* ---- timeouts -------------------------------------------------------------------------------- */

/* Why the collective is not done yet: which rank the streams wait for. */
void ddp__tcp_describe_wait(const xfer *x, char *buf, size_t cap)
{
    const tcp_be *be = x->be;
    int p = prev_of(be);
    char what[64];
    coll_name(x->c, what, sizeof what);
    if (x->ri >= x->nr) {
        int nx = next_of(be);
        ddp__fmt(buf, cap, "rank %d (member %d) stopped receiving from this rank", be->ranks[nx],
                 nx);
        return;
    }
    const seg *r = &be->recvs[x->ri];
    if (r->kind == SEG_HDR) {
        ddp__fmt(buf, cap, "no data from rank %d (member %d): it has not started %s", be->ranks[p],
                 p, what);
    } else if (x->c->kind == DDP__BROADCAST && r->origin != p) {
        ddp__fmt(buf, cap,
                 "no data from the root, rank %d (member %d): it, or a rank between it and rank "
                 "%d (which has started %s), has not started it or is stuck",
                 be->ranks[r->origin], r->origin, be->ranks[p], what);
    } else if (r->origin != p && x->roff == 0 && x->fill == 0) {
        /* This step's data starts at `origin` and is relayed by the members in between; the
         * earlier steps' data proves that those members started, not that they are not stuck
         * since: a relay stopped mid-collective (SIGSTOP, a debugger) looks the same from here
         * as an origin that never started. Both are named (before 2026-11-25 only the origin
         * was, and a chaos run SIGSTOPping the relay blamed its healthy neighbour). */
        ddp__fmt(buf, cap,
                 "no data from rank %d (member %d), relayed by rank %d (member %d): rank %d has "
                 "not started %s, or it or a rank relaying its data is stuck (rank %d has "
                 "started it and may have stopped since)",
                 be->ranks[r->origin], r->origin, be->ranks[p], p, be->ranks[r->origin], what,
                 be->ranks[p]);
    } else {
        ddp__fmt(buf, cap, "no data from rank %d (member %d)", be->ranks[p], p);
    }
}

ddp_status ddp__tcp_fail_timeout(xfer *x, ddp__fail *f)
{
    const ddp__coll *c = x->c;
    char what[160], dur[32], why[320];
    if (c->kind == DDP__BARRIER)
        coll_name(c, what, sizeof what);
    else
        ddp__fmt(what, sizeof what, "%s #%llu (%s × %zu)", ddp__kind_name(c->kind),
                 (unsigned long long)c->seq, ddp_dtype_name(c->dtype), c->count);
    /* The core set the deadline a moment before run() started: show 30 min, not 29.9 min. */
    int64_t waited = c->deadline_ms - x->start_ms;
    if (waited >= 950)
        waited = (waited + 50) / 100 * 100;
    ddp__fmt_duration(dur, sizeof dur, waited > 0 ? waited : 0);
    ddp__tcp_describe_wait(x, why, sizeof why);
    tcp_be *be = x->be;
    if (be->fail_st == DDP_OK && !atomic_load(&be->aborted)) {
        /* In a ring everyone behind a stuck rank times out at about the same moment, and only
         * the stuck rank's successor can name it. So each sends its own diagnosis at once, and
         * takes its predecessor's instead if one arrives: upstream is better informed. */
        char text[DDP_ERRMSG_MAX + 32];
        ddp__fmt(text, sizeof text, "%s timed out after %s over tcp: %s (reported by rank %d)",
                 what, dur, why, be->ranks[be->me]);
        send_own_notice(be, DDP_ERR_TIMEOUT, text);
        inbox *b = await_notice_for(be, TIMEOUT_GRACE_MS, true);
        if (b)
            return fail_notice(be, b, f);
    }
    return ddp__tcp_fail(be, f, DDP_ERR_TIMEOUT, "%s timed out after %s over tcp: %s", what, dur,
                         why);
}

/* ---- abort ----------------------------------------------------------------------------------- */

void ddp__tcp_abort(void *bev, const char *why)
{
    tcp_be *be = bev;
    if (!be)
        return;
    if (!atomic_exchange(&be->abort_claimed, true)) {
        ddp__fmt(be->why, sizeof be->why, "%s", why && *why ? why : "no reason given");
        atomic_store(&be->aborted, true);
        char text[sizeof be->why + 64];
        ddp__fmt(text, sizeof text, "rank %d aborted the group: %s", be->ranks[be->me], be->why);
        tell_peers(be, DDP_ERR_CLOSED, text);
    }
    uint64_t one = 1;
    ssize_t k;
    do
        k = write(be->wake_fd, &one, sizeof one);
    while (k < 0 && errno == EINTR);
    /* EAGAIN would mean the counter is already huge, so readable anyway; nothing else fails on a
     * valid eventfd. */
}
