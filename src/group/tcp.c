/*
 * tcp.c — the tcp backend: collectives among members on different hosts, over persistent TCP
 * connections set up through the rendezvous store.
 *
 * Where it fits: the core (group.c) orders collectives, sets their deadlines, poisons the group
 * and scales AVG; this file only moves and reduces bytes among its members (all ranks, or one
 * rank per host under the hierarchical backend). Each member listens on an ephemeral port of the
 * interface that routes toward the store's host, publishes "addr:port" under <prefix>/addr/<me>,
 * and opens two connections to the next member of a ring, (me+1)%n: a data connection, on which
 * it only sends, and a control connection, which carries nothing until something fails. Every
 * collective runs over the ring, pipelined:
 *   allreduce       ring reduce-scatter then ring allgather, 2(n−1) steps of count/n elements;
 *   reduce_scatter  the reduce-scatter half, shifted so member i ends with block i;
 *   allgather       the allgather half;
 *   broadcast       a chain from the root that forwards bytes as soon as they arrive;
 *   barrier         a ring allgather of one byte per member (n−1 hops).
 * A step sends the block the previous step produced, as far as that block is finished (received
 * bytes at once, reduced bytes per TCP_CHUNK), so sending to next and receiving from prev overlap
 * within and across steps. Both directions progress in one poll() loop over non-blocking sockets
 * and received bytes are always drained, so no message size can deadlock it. bfloat16 and
 * float16 reductions run on a float32 copy that is rounded once at the end.
 *
 * Failures end the group. The member that fails first (a timeout, a peer's EOF, abort(),
 * collectives that differ) sends one notice with its message to both neighbours — backward on
 * the reverse direction of the data connection from prev, forward on the control connection —
 * and shuts its sockets; whoever receives a notice fails with that message and passes it on.
 * So every member reports the first cause ("rank 3 aborted the group: …", "… timed out …: no data
 * from rank 5") at once, rather than "my neighbour closed its connection" or its own deadline
 * much later. A member that sees EOF first waits up to NOTICE_GRACE_MS for the notice that
 * explains it; without one, the peer probably died.
 *
 * Wire format (little-endian). Set-up, connector → acceptor, the "hello":
 *   u32 magic "DDPH", u32 version 1, u32 member index, u32 n, u32 channel (0 data, 1 control),
 *   u32 token length, u32 prefix length, token bytes, prefix bytes;
 * acceptor → connector: u32 magic "DDPR", u32 code (0 accepted, 1 malformed, 2 wrong token,
 * 3 another group, 4 not the expected member); a refused connection is then closed.
 * Each collective opens every data stream it uses with a 32-byte header (magic "DDPC", kind,
 * dtype, op, root, seq, count; see encode_header), then the raw bytes of each step: no framing,
 * both sides know the schedule. A header unlike the receiver's own is reported as collectives
 * that differ across ranks, instead of reading one collective's bytes as another's.
 * A notice: u32 magic "DDPN", u32 −status, u32 length, that many bytes of message.
 *
 * What it deliberately does not do: ordering, debug checks and AVG (the core does those); tree or
 * recursive-doubling algorithms for small messages (latency is 2(n−1) hops, fine for the few
 * hosts tcp connects); encryption (the token keeps strangers out, it does not hide data);
 * reconnection (a lost connection fails the backend for good).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "group/group_int.h"
#include "util/net.h"
#include "util/util.h"

/* Reduction granularity: bytes received into the staging buffer before they are reduced and
 * become sendable. 256 KiB stays in L2 for the reduce and keeps the pipeline fine-grained. */
#define TCP_CHUNK ((size_t)256 << 10)

#define HELLO_MAGIC 0x48504444u  /* "DDPH" */
#define REPLY_MAGIC 0x52504444u  /* "DDPR" */
#define HDR_MAGIC 0x43504444u    /* "DDPC" */
#define NOTICE_MAGIC 0x4e504444u /* "DDPN" */
#define HELLO_VERSION 1u
#define HELLO_FIXED 28
#define HDR_BYTES 32
#define NOTICE_FIXED 12
#define NOTICE_MAX 480
#define MAX_TOKEN 1024
#define HELLO_MS 2000        /* how long an accepted connection may take to show its hello */
#define NOTICE_GRACE_MS 500  /* how long a member that saw EOF waits for the notice saying why */
#define TIMEOUT_GRACE_MS 500 /* how long a timed-out member waits for its predecessor's notice */
#define SEND_IOV 8

enum { CH_DATA, CH_CTL };
enum { REPLY_OK, REPLY_MALFORMED, REPLY_TOKEN, REPLY_GROUP, REPLY_MEMBER };
enum { NOTICE_NONE, NOTICE_GOT, NOTICE_EOF, NOTICE_BAD };
enum { BOX_NEXT, BOX_PREV }; /* where notices arrive from */
enum seg_kind { SEG_HDR, SEG_COPY, SEG_REDUCE };

/* One contiguous piece of a send or receive stream. Streams are consumed in order. */
typedef struct seg {
    const char *src; /* send: bytes to send; recv SEG_REDUCE: the local operand */
    char *dst;       /* recv: where bytes land (SEG_COPY, SEG_HDR) or the reduced result */
    size_t len;      /* bytes */
    int dep;         /* send: the recv segment whose finished bytes gate this one; −1 none */
    int origin;      /* recv: the member whose arrival starts this data (for messages) */
    int kind;        /* recv: enum seg_kind */
} seg;

/* A notice arriving on one socket, possibly in pieces. */
typedef struct inbox {
    int fd;
    bool closed; /* EOF or an error seen; err is its errno (0 for EOF) */
    bool held;   /* a downstream timeout notice, set aside (see check_notices) */
    int err;
    size_t fill;
    unsigned char buf[NOTICE_FIXED + NOTICE_MAX];
} inbox;

typedef struct tcp_be {
    int me, n;
    int *ranks;     /* (n,) global ranks, a copy */
    int out_fd;     /* data to next; its reverse brings next's notices. −1 when n == 1 */
    int in_fd;      /* data from prev; its reverse takes our notices to prev */
    int ctl_out_fd; /* control to next: our notices */
    int ctl_in_fd;  /* control from prev: prev's notices */
    int wake_fd;    /* eventfd, readable once abort() ran */
    inbox box[2];   /* [BOX_NEXT] on out_fd, [BOX_PREV] on ctl_in_fd */

    atomic_bool abort_claimed; /* the first abort() writes why */
    atomic_bool aborted;       /* set after why is written, so run() may read why */
    atomic_bool told;          /* our notice has been sent (at most once) */
    char why[320];

    ddp_status fail_st; /* DDP_OK while healthy; written only by run() */
    char fail_msg[DDP_ERRMSG_MAX];

    seg *sends, *recvs;   /* (2n,) each: the current collective's schedule */
    unsigned char *stage; /* (TCP_CHUNK,) received bytes waiting to be reduced */
    unsigned char *bar;   /* (n,) the barrier's payload */
    void *f32;            /* bf16/fp16 reductions: the float32 working copy, reused */
    size_t f32_cap;       /* bytes */
    void *rs;             /* reduce_scatter: partial blocks, (n × count) elements, reused */
    size_t rs_cap;        /* bytes */
    unsigned char hdr_out[HDR_BYTES], hdr_in[HDR_BYTES];
} tcp_be;

/* The progress of one collective through its schedule. */
typedef struct xfer {
    tcp_be *be;
    const ddp__coll *c;
    int ns, nr;
    int si;          /* current send segment */
    size_t soff;     /* bytes of it sent */
    int ri;          /* current recv segment */
    size_t roff;     /* bytes of it finished (received, and reduced for SEG_REDUCE) */
    size_t fill;     /* SEG_REDUCE: bytes staged of the chunk that starts at roff */
    ddp_dtype wtype; /* dtype of SEG_REDUCE data (float32 for bf16/fp16) */
    size_t wsize;
    ddp_op op;
    int64_t start_ms;
} xfer;

/* ---- small helpers -------------------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int mod(int a, int n)
{
    int r = a % n;
    return r < 0 ? r + n : r;
}

static int next_of(const tcp_be *be)
{
    return (be->me + 1) % be->n;
}

static int prev_of(const tcp_be *be)
{
    return mod(be->me - 1, be->n);
}

static bool is_reduction(ddp__kind k)
{
    return k == DDP__ALLREDUCE || k == DDP__REDUCE_SCATTER;
}

static bool is_half(ddp_dtype t)
{
    return t == DDP_BFLOAT16 || t == DDP_FLOAT16;
}

/* Statuses travel as their negation, a small positive number. */
static uint32_t status_wire(ddp_status st)
{
    return (uint32_t)(-(int32_t)st);
}

static ddp_status status_from_wire(uint32_t v)
{
    return (ddp_status)(-(int32_t)v);
}

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

/* Grows *buf to at least need bytes; the old contents are not kept. */
static bool reserve(void **buf, size_t *cap, size_t need)
{
    if (*cap >= need)
        return true;
    void *p = malloc(need);
    if (!p)
        return false;
    free(*buf);
    *buf = p;
    *cap = need;
    return true;
}

/* "allreduce #17" */
static void coll_name(const ddp__coll *c, char *buf, size_t cap)
{
    ddp__fmt(buf, cap, "%s #%llu", ddp__kind_name(c->kind), (unsigned long long)c->seq);
}

/* ---- failure and notices -------------------------------------------------------------------- */

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

static void record(const tcp_be *be, ddp__fail *f)
{
    if (f) {
        f->status = be->fail_st;
        ddp__fmt(f->msg, sizeof f->msg, "%s", be->fail_msg);
    }
}

/* Records the backend's first failure (later runs repeat it), copies it into f, and ends the
 * group for the peers too (see the top of the file). */
static ddp_status fail(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
    DDP_PRINTF(4, 5);

static ddp_status fail(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
{
    if (be->fail_st == DDP_OK) {
        va_list ap;
        va_start(ap, fmt);
        ddp__vfmt(be->fail_msg, sizeof be->fail_msg, fmt, ap);
        va_end(ap);
        be->fail_st = st;
        char text[DDP_ERRMSG_MAX + 32];
        ddp__fmt(text, sizeof text, "%s (reported by rank %d)", be->fail_msg, be->ranks[be->me]);
        tell_peers(be, st, text);
    }
    record(be, f);
    return be->fail_st;
}

static ddp_status fail_aborted(tcp_be *be, const ddp__coll *c, ddp__fail *f)
{
    char what[64];
    coll_name(c, what, sizeof what);
    return fail(be, f, DDP_ERR_CLOSED, "%s was aborted on rank %d: %s", what, be->ranks[be->me],
                be->why);
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
        tell_peers(be, be->fail_st, be->fail_msg);
    }
    record(be, f);
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
static ddp_status fail_conn(xfer *x, ddp__fail *f, int peer, int e)
{
    tcp_be *be = x->be;
    if (atomic_load(&be->aborted))
        return fail_aborted(be, x->c, f);
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
        return fail(be, f, DDP_ERR_NETWORK,
                    "rank %d closed its connection during %s: it probably died", be->ranks[peer],
                    what);
    return fail(be, f, DDP_ERR_NETWORK, "connection with rank %d failed during %s: %s",
                be->ranks[peer], what, strerror(e));
}

/* Handles whatever the notice inboxes hold. A notice fails this member at once. EOF from next
 * matters only while this collective still has bytes to send it: a neighbour that finished the
 * last collective and left is no failure. EOF on the control connection from prev never matters
 * by itself: the data connection shows whether prev's data stopped early. */
static ddp_status check_notices(xfer *x, ddp__fail *f, bool sending)
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
                return fail_aborted(be, x->c, f);
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
                return fail_conn(x, f, peer, e);
            break;
        case NOTICE_BAD:
            return fail(be, f, DDP_ERR_PROTOCOL,
                        "rank %d sent bytes that are not a notice on a connection that carries "
                        "only notices toward this rank (during %s #%llu)",
                        be->ranks[peer], ddp__kind_name(x->c->kind), (unsigned long long)x->c->seq);
        default: break;
        }
    }
    return DDP_OK;
}

/* ---- the collective header ------------------------------------------------------------------ */

/* Layout: 0 magic, 4 kind, 5 dtype, 6 op, 7 zero, 8 root, 12 seq, 20 count, 28 zero. Fields a
 * kind does not use are zero, so two members running the same collective send equal bytes. */
static void encode_header(unsigned char *h, const ddp__coll *c)
{
    memset(h, 0, HDR_BYTES);
    put32(h, HDR_MAGIC);
    h[4] = (unsigned char)c->kind;
    if (c->kind != DDP__BARRIER) {
        h[5] = (unsigned char)c->dtype;
        put64(h + 20, (uint64_t)c->count);
    }
    if (is_reduction(c->kind))
        h[6] = (unsigned char)c->op;
    if (c->kind == DDP__BROADCAST)
        put32(h + 8, (uint32_t)c->root);
    put64(h + 12, c->seq);
}

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

static ddp_status check_header(xfer *x, ddp__fail *f)
{
    tcp_be *be = x->be;
    if (memcmp(be->hdr_in, be->hdr_out, HDR_BYTES) == 0)
        return DDP_OK;
    int p = prev_of(be);
    char what[64];
    coll_name(x->c, what, sizeof what);
    if (get32(be->hdr_in) != HDR_MAGIC)
        return fail(be, f, DDP_ERR_PROTOCOL,
                    "rank %d sent bytes that are not a collective header at the start of %s: the "
                    "tcp streams are out of step (a collective with another count on some rank?)",
                    be->ranks[p], what);
    char theirs[160], mine[160];
    describe_header(be->hdr_in, theirs, sizeof theirs);
    describe_header(be->hdr_out, mine, sizeof mine);
    return fail(be, f, DDP_ERR_INVALID,
                "collectives differ across ranks: rank %d runs %s while rank %d runs %s; every "
                "rank must call the same collectives in the same order with the same count, "
                "dtype, op and root (DDP_DEBUG=1 checks this before each call)",
                be->ranks[p], theirs, be->ranks[be->me], mine);
}

/* ---- the progress engine -------------------------------------------------------------------- */

/* Finished bytes of recv segment j. */
static size_t recv_done(const xfer *x, int j)
{
    if (j < x->ri)
        return x->be->recvs[j].len;
    return j == x->ri ? x->roff : 0;
}

/* Bytes of send segment j that may be sent. */
static size_t send_ready(const xfer *x, int j)
{
    const seg *s = &x->be->sends[j];
    if (s->dep < 0)
        return s->len;
    size_t d = recv_done(x, s->dep);
    return d < s->len ? d : s->len;
}

/* Moves the send position n bytes on, past finished and empty segments. */
static void send_advance(xfer *x, size_t n)
{
    while (x->si < x->ns) {
        size_t rem = x->be->sends[x->si].len - x->soff;
        if (rem > n) {
            x->soff += n;
            return;
        }
        n -= rem;
        x->si++;
        x->soff = 0;
    }
}

/* Sends what the schedule allows until the socket is full. Sets *progress when bytes moved and
 * *want_out when the socket, not the schedule, stopped us. */
static ddp_status send_some(xfer *x, ddp__fail *f, bool *progress, bool *want_out)
{
    tcp_be *be = x->be;
    *want_out = false;
    for (;;) {
        send_advance(x, 0);
        if (x->si >= x->ns)
            return DDP_OK;
        struct iovec iov[SEND_IOV];
        int k = 0;
        size_t total = 0;
        for (int j = x->si; j < x->ns && k < SEND_IOV; j++) {
            size_t from = j == x->si ? x->soff : 0;
            size_t ready = send_ready(x, j);
            if (ready > from) {
                iov[k].iov_base = (void *)(be->sends[j].src + from);
                iov[k].iov_len = ready - from;
                total += ready - from;
                k++;
            }
            if (ready < be->sends[j].len)
                break; /* what follows this segment may not go before it */
        }
        if (k == 0)
            return DDP_OK; /* waiting for data to arrive */
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)k;
        ssize_t got = sendmsg(be->out_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                *want_out = true;
                return DDP_OK;
            }
            return fail_conn(x, f, next_of(be), errno);
        }
        *progress = true;
        send_advance(x, (size_t)got);
        if ((size_t)got < total) {
            *want_out = true; /* a short write: the socket buffer is full */
            return DDP_OK;
        }
    }
}

/* Moves past finished and empty recv segments. */
static void recv_skip(xfer *x)
{
    while (x->ri < x->nr && x->roff == x->be->recvs[x->ri].len) {
        x->ri++;
        x->roff = 0;
        x->fill = 0;
    }
}

/* Receives until the socket is empty or the stream is complete. */
static ddp_status recv_some(xfer *x, ddp__fail *f, bool *progress)
{
    tcp_be *be = x->be;
    for (;;) {
        recv_skip(x);
        if (x->ri >= x->nr)
            return DDP_OK;
        seg *r = &be->recvs[x->ri];
        char *to;
        size_t want, chunk = 0;
        if (r->kind == SEG_REDUCE) {
            chunk = r->len - x->roff < TCP_CHUNK ? r->len - x->roff : TCP_CHUNK;
            to = (char *)be->stage + x->fill;
            want = chunk - x->fill;
        } else {
            to = r->dst + x->roff;
            want = r->len - x->roff;
        }
        ssize_t got = recv(be->in_fd, to, want, MSG_DONTWAIT);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return DDP_OK;
            return fail_conn(x, f, prev_of(be), errno);
        }
        if (got == 0)
            return fail_conn(x, f, prev_of(be), 0);
        *progress = true;
        if (r->kind == SEG_REDUCE) {
            x->fill += (size_t)got;
            if (x->fill == chunk) {
                ddp__reduce2(r->dst + x->roff, r->src + x->roff, be->stage, chunk / x->wsize,
                             x->wtype, x->op);
                x->roff += chunk;
                x->fill = 0;
            }
        } else {
            x->roff += (size_t)got;
            if (r->kind == SEG_HDR && x->roff == r->len) {
                ddp_status st = check_header(x, f);
                if (st != DDP_OK)
                    return st;
            }
        }
    }
}

/* Why the collective is not done yet: which rank the streams wait for. */
static void describe_wait(const xfer *x, char *buf, size_t cap)
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
         * earlier steps' data proves that those members started. */
        ddp__fmt(buf, cap,
                 "no data from rank %d (member %d), which has not started %s or is stuck (its "
                 "data reaches this rank through rank %d, which has started it)",
                 be->ranks[r->origin], r->origin, what, be->ranks[p]);
    } else {
        ddp__fmt(buf, cap, "no data from rank %d (member %d)", be->ranks[p], p);
    }
}

static ddp_status fail_timeout(xfer *x, ddp__fail *f)
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
    describe_wait(x, why, sizeof why);
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
    return fail(be, f, DDP_ERR_TIMEOUT, "%s timed out after %s over tcp: %s", what, dur, why);
}

/* Runs the schedule in be->sends/recvs to completion, failure or the deadline. */
static ddp_status xfer_run(xfer *x, ddp__fail *f)
{
    tcp_be *be = x->be;
    for (;;) {
        bool progress = false, want_out = false;
        ddp_status st = send_some(x, f, &progress, &want_out);
        if (st == DDP_OK)
            st = recv_some(x, f, &progress);
        if (st != DDP_OK)
            return st;
        send_advance(x, 0);
        recv_skip(x);
        if (x->si >= x->ns && x->ri >= x->nr)
            return DDP_OK;
        if (atomic_load(&be->aborted))
            return fail_aborted(be, x->c, f);
        int left = ddp__ms_left(x->c->deadline_ms);
        if (left == 0)
            return fail_timeout(x, f);
        if (progress)
            continue;
        /* The notice sockets are polled too, so a failed or dead neighbour is noticed even while
         * we wait on the other one. A negative fd is ignored: once we only send, a closed prev
         * must not wake us in a loop. */
        struct pollfd p[4] = {
            {.fd = x->ri < x->nr ? be->in_fd : -1, .events = POLLIN},
            {.fd = (be->box[BOX_NEXT].closed || be->box[BOX_NEXT].held) && !want_out ? -1
                                                                                     : be->out_fd,
             .events = (short)((be->box[BOX_NEXT].held ? 0 : POLLIN) | (want_out ? POLLOUT : 0))},
            {.fd = be->box[BOX_PREV].closed ? -1 : be->ctl_in_fd, .events = POLLIN},
            {.fd = be->wake_fd, .events = POLLIN},
        };
        int rc = poll(p, 4, left);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            return fail(be, f, DDP_ERR_SYSTEM, "poll failed during tcp %s: %s",
                        ddp__kind_name(x->c->kind), strerror(errno));
        }
        if (atomic_load(&be->aborted))
            return fail_aborted(be, x->c, f);
        short bad = POLLIN | POLLHUP | POLLERR;
        if ((p[1].revents & bad) || (p[2].revents & bad)) {
            st = check_notices(x, f, x->si < x->ns);
            if (st != DDP_OK)
                return st;
        }
    }
}

/* ---- schedules ------------------------------------------------------------------------------ */

static int add_send(xfer *x, const void *src, size_t len, int dep)
{
    seg *s = &x->be->sends[x->ns];
    memset(s, 0, sizeof *s);
    s->src = src;
    s->len = len;
    s->dep = dep;
    return x->ns++;
}

static int add_recv(xfer *x, int kind, void *dst, const void *src, size_t len, int origin)
{
    seg *r = &x->be->recvs[x->nr];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->dst = dst;
    r->src = src;
    r->len = len;
    r->dep = -1;
    r->origin = origin;
    return x->nr++;
}

/* Every stream starts with the collective's header (segment 0). */
static void sched_begin(xfer *x, bool sends, bool recvs)
{
    tcp_be *be = x->be;
    x->ns = x->nr = 0;
    encode_header(be->hdr_out, x->c);
    if (sends)
        add_send(x, be->hdr_out, HDR_BYTES, -1);
    if (recvs)
        add_recv(x, SEG_HDR, be->hdr_in, NULL, HDR_BYTES, prev_of(be));
}

/* Block b of N elements split as evenly as possible into n blocks, in bytes. */
static size_t block_off(size_t N, int n, int b, size_t esz)
{
    size_t base = N / (size_t)n, rem = N % (size_t)n, ub = (size_t)b;
    return (ub * base + (ub < rem ? ub : rem)) * esz;
}

static size_t block_len(size_t N, int n, int b, size_t esz)
{
    return (N / (size_t)n + ((size_t)b < N % (size_t)n ? 1 : 0)) * esz;
}

/* Ring allreduce of N elements of esz bytes: in (N,) read, out (N,) written; in == out is in
 * place. Step t < n−1 (reduce-scatter) sends block me−t and reduces block me−t−1 into out; step
 * t ≥ n−1 (allgather, a = t−n+1) sends block me+1−a and receives block me−a. Each step sends
 * what the step before received, so send segment t+1 depends on recv segment t. Block me is
 * sent from in at step 0 and overwritten only at step n−1, whose data cannot arrive before the
 * bytes of step 0 have left (they are part of its sum). */
static void sched_allreduce(xfer *x, const char *in, char *out, size_t N, size_t esz)
{
    int me = x->be->me, n = x->be->n;
    sched_begin(x, true, true);
    for (int t = 0; t < 2 * (n - 1); t++) {
        bool rs = t < n - 1;
        int a = t - (n - 1);
        int sb = rs ? mod(me - t, n) : mod(me + 1 - a, n);
        int rb = rs ? mod(me - t - 1, n) : mod(me - a, n);
        add_send(x, (t == 0 ? in : out) + block_off(N, n, sb, esz), block_len(N, n, sb, esz),
                 t == 0 ? -1 : t);
        add_recv(x, rs ? SEG_REDUCE : SEG_COPY, out + block_off(N, n, rb, esz),
                 in + block_off(N, n, rb, esz), block_len(N, n, rb, esz),
                 rs ? mod(me - 1 - t, n) : prev_of(x->be));
    }
}

/* Ring reduce-scatter: in (n × B bytes) read, work (n × B) holds partial blocks, out (B) gets
 * block me. Shifted by one against allreduce so member me finishes block me; block me is never
 * sent by me, so out may alias in + me × B. */
static void sched_reduce_scatter(xfer *x, const char *in, char *work, char *out, size_t B)
{
    int me = x->be->me, n = x->be->n;
    sched_begin(x, true, true);
    for (int t = 0; t < n - 1; t++) {
        int sb = mod(me - t - 1, n), rb = mod(me - t - 2, n);
        add_send(x, (t == 0 ? in : work) + (size_t)sb * B, B, t == 0 ? -1 : t);
        add_recv(x, SEG_REDUCE, t == n - 2 ? out : work + (size_t)rb * B, in + (size_t)rb * B, B,
                 mod(me - 1 - t, n));
    }
}

/* Ring allgather in place: buf (n × B bytes) holds block me; step t sends block me−t and
 * receives block me−t−1, which started at member me−t−1. */
static void sched_allgather(xfer *x, char *buf, size_t B)
{
    int me = x->be->me, n = x->be->n;
    sched_begin(x, true, true);
    for (int t = 0; t < n - 1; t++) {
        int sb = mod(me - t, n), rb = mod(me - t - 1, n);
        add_send(x, buf + (size_t)sb * B, B, t == 0 ? -1 : t);
        add_recv(x, SEG_COPY, buf + (size_t)rb * B, NULL, B, rb);
    }
}

/* A chain from the root along the ring: every member but the root receives, every member but the
 * one before the root forwards each byte as soon as it has it. */
static void sched_broadcast(xfer *x, char *buf, size_t bytes, int root)
{
    int pos = mod(x->be->me - root, x->be->n);
    bool recvs = pos != 0, sends = pos != x->be->n - 1;
    sched_begin(x, sends, recvs);
    int r = recvs ? add_recv(x, SEG_COPY, buf, NULL, bytes, root) : -1;
    if (sends)
        add_send(x, buf, bytes, r);
}

/* ---- run ------------------------------------------------------------------------------------ */

static void to_f32(float *dst, const void *src, size_t n, ddp_dtype t)
{
    const uint16_t *s = src;
    if (t == DDP_BFLOAT16)
        for (size_t i = 0; i < n; i++)
            dst[i] = ddp__bf16_to_f32(s[i]);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = ddp__f16_to_f32(s[i]);
}

static void from_f32(void *dst, const float *src, size_t n, ddp_dtype t)
{
    uint16_t *d = dst;
    if (t == DDP_BFLOAT16)
        for (size_t i = 0; i < n; i++)
            d[i] = ddp__f32_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++)
            d[i] = ddp__f32_to_f16(src[i]);
}

static ddp_status fail_invalid(tcp_be *be, const ddp__coll *c, ddp__fail *f, const char *why)
{
    return fail(be, f, DDP_ERR_INVALID, "tcp %s #%llu: %s", ddp__kind_name(c->kind),
                (unsigned long long)c->seq, why);
}

/* Checks what the core hands over; a bad collective here is a bug in the caller. */
static ddp_status check_coll(tcp_be *be, const ddp__coll *c, ddp__fail *f)
{
    if ((unsigned)c->kind >= DDP__KIND_COUNT)
        return fail(be, f, DDP_ERR_INVALID, "tcp backend: unknown collective kind %d",
                    (int)c->kind);
    if (c->kind == DDP__BARRIER)
        return DDP_OK;
    if ((unsigned)c->dtype >= DDP_DTYPE_COUNT)
        return fail_invalid(be, c, f, "unknown dtype");
    if (is_reduction(c->kind) && c->op != DDP_SUM && c->op != DDP_MIN && c->op != DDP_MAX &&
        c->op != DDP_PROD)
        return fail_invalid(be, c, f,
                            "op must be sum, min, max or prod (the core turns avg into a sum "
                            "and scales it)");
    if (c->kind == DDP__BROADCAST && (c->root < 0 || c->root >= be->n))
        return fail_invalid(be, c, f, "broadcast root is not a member index");
    /* n × count × 8 bytes (and the float32 copy of a half-precision send) must fit in size_t */
    if (c->count > SIZE_MAX / 8 / (size_t)be->n)
        return fail_invalid(be, c, f, "count is too large");
    if (c->count > 0 && (!c->recv || (c->kind != DDP__BROADCAST && !c->send)))
        return fail_invalid(be, c, f, "a buffer is NULL");
    return DDP_OK;
}

/* A world of one member: copy send to recv where they differ. */
static void run_alone(const ddp__coll *c)
{
    if (c->kind == DDP__BARRIER || c->count == 0 || !c->send || c->send == c->recv)
        return;
    memmove(c->recv, c->send, c->count * ddp_dtype_size(c->dtype));
}

/* Lays out the collective's schedule; converts bf16/fp16 input to float32 first. */
static ddp_status plan(xfer *x, ddp__fail *f, bool half)
{
    tcp_be *be = x->be;
    const ddp__coll *c = x->c;
    size_t n = (size_t)be->n, me = (size_t)be->me, count = c->count;
    size_t esz = c->kind == DDP__BARRIER ? 1 : ddp_dtype_size(c->dtype);
    if (half) {
        size_t elems = c->kind == DDP__ALLREDUCE ? count : n * count;
        if (!reserve(&be->f32, &be->f32_cap, elems * sizeof(float) + 1))
            return fail(be, f, DDP_ERR_NOMEM,
                        "tcp %s: out of memory for a float32 copy of %zu elements",
                        ddp__kind_name(c->kind), elems);
        to_f32(be->f32, c->send, elems, c->dtype);
    }
    char *w = be->f32;
    switch (c->kind) {
    case DDP__ALLREDUCE:
        if (half)
            sched_allreduce(x, w, w, count, sizeof(float));
        else
            sched_allreduce(x, c->send, c->recv, count, esz);
        break;
    case DDP__REDUCE_SCATTER:
        if (half) {
            sched_reduce_scatter(x, w, w, w + me * count * sizeof(float), count * sizeof(float));
            break;
        }
        if (!reserve(&be->rs, &be->rs_cap, n * count * esz + 1))
            return fail(be, f, DDP_ERR_NOMEM,
                        "tcp reduce_scatter: out of memory for %zu bytes of partial sums",
                        n * count * esz);
        sched_reduce_scatter(x, c->send, be->rs, c->recv, count * esz);
        break;
    case DDP__ALLGATHER: {
        char *mine = (char *)c->recv + me * count * esz;
        if (count > 0 && (const void *)mine != c->send)
            memmove(mine, c->send, count * esz);
        sched_allgather(x, c->recv, count * esz);
        break;
    }
    case DDP__BROADCAST:
        /* The buffer is recv; a root whose send differs broadcasts a copy of send. */
        if (be->me == c->root && count > 0 && c->send && c->send != c->recv)
            memmove(c->recv, c->send, count * esz);
        sched_broadcast(x, c->recv, count * esz, c->root);
        break;
    case DDP__BARRIER:
        memset(be->bar, 0, n);
        be->bar[me] = 1;
        sched_allgather(x, (char *)be->bar, 1);
        break;
    default: break;
    }
    return DDP_OK;
}

static ddp_status tcp_run(void *bev, const ddp__coll *c, ddp__fail *f)
{
    tcp_be *be = bev;
    if (!be || !c) {
        if (f) {
            f->status = DDP_ERR_INVALID;
            ddp__fmt(f->msg, sizeof f->msg, "tcp backend: run() without a backend or collective");
        }
        return DDP_ERR_INVALID;
    }
    if (be->fail_st != DDP_OK) {
        record(be, f); /* the first failure, again */
        return be->fail_st;
    }
    if (atomic_load(&be->aborted))
        return fail_aborted(be, c, f);
    ddp_status st = check_coll(be, c, f);
    if (st != DDP_OK)
        return st;
    if (be->n == 1) {
        run_alone(c);
        return DDP_OK;
    }

    xfer x;
    memset(&x, 0, sizeof x);
    x.be = be;
    x.c = c;
    x.start_ms = ddp__now_ms();
    x.op = c->op;
    bool half = is_reduction(c->kind) && is_half(c->dtype);
    x.wtype = half ? DDP_FLOAT32 : c->dtype;
    x.wsize = half ? sizeof(float) : c->kind == DDP__BARRIER ? 1 : ddp_dtype_size(c->dtype);
    /* A peer may have failed while this member was away: its notice is waiting. */
    st = check_notices(&x, f, true);
    if (st == DDP_OK)
        st = plan(&x, f, half);
    if (st == DDP_OK)
        st = xfer_run(&x, f);
    if (st != DDP_OK)
        return st;
    size_t me = (size_t)be->me;
    if (half && c->kind == DDP__ALLREDUCE)
        from_f32(c->recv, be->f32, c->count, c->dtype);
    else if (half)
        from_f32(c->recv, (const float *)be->f32 + me * c->count, c->count, c->dtype);
    return DDP_OK;
}

static void tcp_abort(void *bev, const char *why)
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
    free(be);
}

static const ddp__backend_ops tcp_ops = {
    .name = "tcp",
    .run = tcp_run,
    .alloc = NULL,
    .free = NULL,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

/* ---- set-up --------------------------------------------------------------------------------- */

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

/* Reads and checks the hello on an accepted connection; returns a REPLY_ code and, when
 * accepted, the channel. */
static uint32_t read_hello(const tcp_be *be, const ddp__members *m, int fd, int64_t deadline,
                           const int *have, int *channel)
{
    unsigned char fixed[HELLO_FIXED];
    if (ddp__recv_all(fd, fixed, sizeof fixed, deadline, NULL) != DDP_OK)
        return REPLY_MALFORMED;
    uint32_t tlen = get32(fixed + 20), plen = get32(fixed + 24), ch = get32(fixed + 16);
    if (get32(fixed) != HELLO_MAGIC || get32(fixed + 4) != HELLO_VERSION || tlen > MAX_TOKEN ||
        plen > DDP_STORE_MAX_KEY)
        return REPLY_MALFORMED;
    char *body = malloc((size_t)tlen + plen + 1);
    if (!body)
        return REPLY_MALFORMED;
    uint32_t code = REPLY_OK;
    if (ddp__recv_all(fd, body, (size_t)tlen + plen, deadline, NULL) != DDP_OK)
        code = REPLY_MALFORMED;
    else if (!same_bytes(body, tlen, m->token, strlen(m->token)))
        code = REPLY_TOKEN;
    else if (get32(fixed + 12) != (uint32_t)be->n ||
             !same_bytes(body + tlen, plen, m->prefix, strlen(m->prefix)))
        code = REPLY_GROUP;
    else if (get32(fixed + 8) != (uint32_t)prev_of(be) || ch > CH_CTL || have[ch] >= 0)
        code = REPLY_MEMBER;
    free(body);
    *channel = (int)ch;
    return code;
}

static ddp_status send_reply(int fd, uint32_t code, int64_t deadline, ddp_error *e)
{
    unsigned char r[8];
    put32(r, REPLY_MAGIC);
    put32(r + 4, code);
    return ddp__send_all(fd, r, sizeof r, deadline, e);
}

/* Accepts connections until prev has shown a valid hello on both channels; strangers are
 * refused and counted, and the last refusal is kept for the timeout message. */
static ddp_status accept_prev(tcp_be *be, const ddp__members *m, int lfd, const char *me_addr,
                              int64_t deadline, int timeout_ms, ddp_error *err)
{
    int p = prev_of(be), refused = 0;
    int have[2] = {-1, -1};
    char last[160] = "";
    ddp_status st = DDP_OK;
    while (have[CH_DATA] < 0 || have[CH_CTL] < 0) {
        int fd;
        ddp_error e;
        st = ddp__tcp_accept(lfd, deadline, &fd, &e);
        if (st == DDP_ERR_TIMEOUT) {
            char dur[32], extra[240] = "";
            ddp__fmt_duration(dur, sizeof dur, timeout_ms);
            if (refused)
                ddp__fmt(extra, sizeof extra, " (refused %d other connection%s, the last %s)",
                         refused, refused == 1 ? "" : "s", last);
            ddp__err(err, DDP_ERR_TIMEOUT,
                     "tcp set-up timed out after %s: rank %d (member %d) did not connect to this "
                     "rank at '%s'%s; check that it runs and can reach this host (firewall, the "
                     "interface picked toward MASTER_ADDR)",
                     dur, be->ranks[p], p, me_addr, extra);
            goto out_close;
        }
        if (st != DDP_OK) {
            ddp__err(err, st, "tcp set-up: waiting for rank %d (member %d): %s", be->ranks[p], p,
                     e.msg);
            goto out_close;
        }
        int64_t hello_by = ddp__now_ms() + HELLO_MS;
        int ch = 0;
        uint32_t code = read_hello(be, m, fd, hello_by < deadline ? hello_by : deadline, have, &ch);
        if (code == REPLY_OK) {
            st = send_reply(fd, REPLY_OK, deadline, &e);
            if (st != DDP_OK) {
                close(fd);
                ddp__err(err, DDP_ERR_NETWORK,
                         "tcp set-up: rank %d (member %d) connected, then its connection failed: "
                         "%s",
                         be->ranks[p], p, e.msg);
                goto out_close;
            }
            have[ch] = fd;
            continue;
        }
        char peer[96];
        ddp__peer_name(fd, peer, sizeof peer);
        (void)send_reply(fd, code, ddp__now_ms(), NULL); /* best effort, never waits */
        close(fd);
        refused++;
        ddp__fmt(last, sizeof last, "from '%s': %s", peer, reply_reason(code));
    }
    be->in_fd = have[CH_DATA];
    be->ctl_in_fd = have[CH_CTL];
    return DDP_OK;

out_close:
    close_fd(&have[CH_DATA]);
    close_fd(&have[CH_CTL]);
    return st;
}

/* One connection to next on a channel, with the hello sent; the reply is read later. */
static ddp_status open_channel(tcp_be *be, const ddp__members *m, const char *host, int port,
                               int ch, int64_t deadline, int *fd_out, ddp_error *e)
{
    /* The listener is up before its address is published, so refusals are rare (a full backlog);
     * retry them until the deadline. */
    int fd = -1;
    ddp_status st;
    for (;;) {
        st = ddp__tcp_connect(host, port, deadline, &fd, e);
        if (st != DDP_ERR_NETWORK || ddp__ms_left(deadline) == 0)
            break;
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
    st = open_channel(be, m, host, port, CH_DATA, deadline, &be->out_fd, &e);
    if (st == DDP_OK)
        st = open_channel(be, m, host, port, CH_CTL, deadline, &be->ctl_out_fd, &e);
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

/* Listens, publishes the address, connects to next, accepts prev, then reads next's answers.
 * Connecting and sending a hello never wait for the peer to accept, so no member waits on
 * another in a circle. */
static ddp_status connect_ring(tcp_be *be, const ddp__members *m, ddp_store *store, int timeout_ms,
                               ddp_error *err)
{
    int64_t deadline = ddp__now_ms() + timeout_ms;
    char host[64];
    ddp_status st = ddp__local_addr_toward(m->master_addr, host, sizeof host, err);
    if (st != DDP_OK)
        return st;
    int lfd = -1, port = 0;
    st = ddp__tcp_listen(host, 0, 64, &lfd, &port, err);
    if (st != DDP_OK)
        return st;
    char me_addr[96], key[DDP_STORE_MAX_KEY + 1], next_addr[320];
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
        st = accept_prev(be, m, lfd, me_addr, deadline, timeout_ms, err);
    if (st == DDP_OK)
        st = read_reply(be, be->out_fd, next_addr, deadline, err);
    if (st == DDP_OK)
        st = read_reply(be, be->ctl_out_fd, next_addr, deadline, err);
out_close_listener:
    close(lfd); /* set-up is over either way: no one else may connect */
    return st;
}

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
    be->stage = m->n > 1 ? malloc(TCP_CHUNK) : NULL;
    if (!be->ranks || !be->sends || !be->recvs || !be->bar || (m->n > 1 && !be->stage)) {
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
