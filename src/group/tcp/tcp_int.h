/*
 * tcp_int.h — inside the tcp backend: collectives among members on different hosts, over
 * persistent TCP connections set up through the rendezvous store. Private to src/group/tcp.
 *
 * Where it fits: the core (group.c) orders collectives, sets their deadlines, poisons the group
 * and scales AVG; the tcp backend only moves and reduces bytes among its members (all ranks, or
 * one rank per host under the hierarchical backend). Each member listens on an ephemeral port of
 * the interface that routes toward the store's host, publishes "addr:port" under
 * <prefix>/addr/<me>, and opens two connections to the next member of a ring, (me+1)%n: a data
 * connection, on which it only sends, and a control connection, which carries nothing until
 * something fails. Every collective runs over the ring (ring.c): large allreduces pipelined as
 * reduce-scatter + allgather, small ones (TCP_SMALL_MAX) as one allgather of whole inputs that
 * every member then reduces in member order. The first failure ends the backend, and a notice
 * tells the neighbours why (fail.c). Connections carry TCP keepalive set from the group timeout
 * (setup.c), so a host that vanishes without a FIN or RST is noticed even between collectives.
 *
 * The three files, each including only this header:
 *   setup.c  listening, the handshake with prev and next, create and destroy;
 *   ring.c   the schedules of the collectives and the poll() loop that moves their bytes;
 *   fail.c   the first failure, notices to and from the neighbours, abort, and the messages that
 *            explain a timeout or collectives that differ.
 *
 * Wire format (little-endian). Set-up, connector → acceptor, the "hello":
 *   u32 magic "DDPH", u32 version 1, u32 member index, u32 n, u32 channel (0 data, 1 control),
 *   u32 token length, u32 prefix length, token bytes, prefix bytes;
 * acceptor → connector: u32 magic "DDPR", u32 code (0 accepted, 1 malformed, 2 wrong token,
 * 3 another group, 4 not the expected member); a refused connection is then closed.
 * Each collective opens every data stream it uses with a 32-byte header (magic "DDPC", kind,
 * dtype, op, algorithm, root, seq, count; see encode_header in ring.c), then the raw bytes of
 * each step: no
 * framing, both sides know the schedule. A header unlike the receiver's own is reported as
 * collectives that differ across ranks, instead of reading one collective's bytes as another's.
 * A notice: u32 magic "DDPN", u32 −status, u32 length, that many bytes of message.
 *
 * What the backend deliberately does not do: ordering, debug checks and AVG (the core does
 * those); recursive doubling (log2 n hops, but connections to log2 n partners: the small
 * allreduce's n − 1 hops are as few for n ≤ 3 and one more at 4, the few hosts tcp connects);
 * encryption (the token keeps strangers out, it does not hide
 * data); reconnection (a lost connection fails the backend for good).
 */
#ifndef DDP_GROUP_TCP_INT_H
#define DDP_GROUP_TCP_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "group/group_int.h"
#include "util/util.h"

/* Reduction granularity: bytes received into the staging buffer before they are reduced and
 * become sendable. 256 KiB stays in L2 for the reduce and keeps the pipeline fine-grained. */
#define TCP_CHUNK ((size_t)256 << 10)

/* The small-message allreduce (ring.c) is used when (n − 1) × bytes ≤ this: every member sends
 * its whole input round the ring (n − 1 hops instead of the ring's 2(n − 1)) and reduces all n
 * inputs itself, in member order. Measured on loopback and between two network namespaces
 * (docs/group.md); every member computes the same choice from the collective alone. */
#define TCP_SMALL_MAX ((size_t)64 << 10)

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
    bool fail_peer; /* the failure is another member's (ddp__fail.peer); written only by run() */

    seg *sends, *recvs;    /* (2n,) each: the current collective's schedule */
    unsigned char *stage;  /* (TCP_CHUNK,) received bytes waiting to be reduced */
    unsigned char *bar;    /* (n,) the barrier's payload */
    void *f32;             /* bf16/fp16 reductions: the float32 working copy, reused */
    size_t f32_cap;        /* bytes */
    void *rs;              /* reduce_scatter: partial blocks, (n × count) elements, reused */
    size_t rs_cap;         /* bytes */
    unsigned char *gather; /* small allreduce: the other members' inputs, (n × bytes), reused */
    size_t gather_cap;     /* bytes */
    const void **srcs;     /* (n,) small allreduce: the inputs in member order */
    size_t small_max;      /* TCP_SMALL_MAX; tests lower it to run the ring on small counts */
    int ka_bound_s;        /* keepalive: a silent peer's connection fails within this (setup.c) */
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
    bool small; /* allreduce by the small-message algorithm */
    int64_t start_ms;
} xfer;

/* ---- small helpers --------------------------------------------------------------------------- */

static inline void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t get32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static inline uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline int mod(int a, int n)
{
    int r = a % n;
    return r < 0 ? r + n : r;
}

static inline int next_of(const tcp_be *be)
{
    return (be->me + 1) % be->n;
}

static inline int prev_of(const tcp_be *be)
{
    return mod(be->me - 1, be->n);
}

static inline bool is_reduction(ddp__kind k)
{
    return k == DDP__ALLREDUCE || k == DDP__REDUCE_SCATTER;
}

/* ---- across the three files ------------------------------------------------------------------ */

/* fail.c. Records the backend's first failure (later runs repeat it), copies it into f (may be
 * NULL), and ends the group for the peers too: one notice to each neighbour, then every socket
 * shut. Returns the first failure's status. */
ddp_status ddp__tcp_fail(tcp_be *be, ddp__fail *f, ddp_status st, const char *fmt, ...)
    DDP_PRINTF(4, 5);
/* Copies the recorded failure into f (may be NULL). */
void ddp__tcp_record(const tcp_be *be, ddp__fail *f);
/* Fails c because abort() ran on this member. */
ddp_status ddp__tcp_fail_aborted(tcp_be *be, const ddp__coll *c, ddp__fail *f);
/* A connection to member peer failed (EOF when e == 0): fails with the notice that explains it if
 * one arrives within a grace period, else with the connection's error. */
ddp_status ddp__tcp_fail_conn(xfer *x, ddp__fail *f, int peer, int e);
/* Handles whatever the notice inboxes hold (sending: this collective still has bytes for next). */
ddp_status ddp__tcp_check_notices(xfer *x, ddp__fail *f, bool sending);
/* The header prev sent for this collective against ours: a difference fails, naming both. */
ddp_status ddp__tcp_check_header(xfer *x, ddp__fail *f);
/* What this member is waiting for in x, for a timeout or a "still waiting" report: "no data
 * from rank 2 (member 2): it has not started allreduce #7", naming the stuck rank when the
 * ring's schedule can tell. */
void ddp__tcp_describe_wait(const xfer *x, char *buf, size_t cap);
/* The deadline passed: fails naming the rank the streams wait for (or a better-informed
 * predecessor's diagnosis, if it arrives within a grace period). */
ddp_status ddp__tcp_fail_timeout(xfer *x, ddp__fail *f);
/* ddp__backend_ops.abort. */
void ddp__tcp_abort(void *be, const char *why);

/* ring.c: ddp__backend_ops.run. */
ddp_status ddp__tcp_run(void *be, const ddp__coll *c, ddp__fail *f);

#endif /* DDP_GROUP_TCP_INT_H */
