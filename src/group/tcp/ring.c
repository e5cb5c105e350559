/*
 * ring.c — the tcp backend's collectives (tcp_int.h): each laid out as a schedule of send and
 * receive segments over the ring, then driven to completion by one poll() loop.
 *
 *   allreduce       small (n − 1 times the bytes ≤ TCP_SMALL_MAX): a ring allgather of whole
 *                   inputs, n − 1 steps, then every member reduces the n inputs in member order
 *                   (one pass, so all members hold the same bits); large: ring reduce-scatter
 *                   then ring allgather, 2(n−1) steps of count/n elements;
 *   reduce_scatter  the reduce-scatter half, shifted so member i ends with block i;
 *   allgather       the allgather half;
 *   broadcast       a chain from the root that forwards bytes as soon as they arrive;
 *   barrier         a ring allgather of one byte per member (n−1 hops).
 * A step sends the block the previous step produced, as far as that block is finished (received
 * bytes at once, reduced bytes per TCP_CHUNK), so sending to next and receiving from prev overlap
 * within and across steps. Both directions progress in one poll() loop over non-blocking sockets
 * and received bytes are always drained, so no message size can deadlock it. bfloat16 and
 * float16 reductions run on a float32 copy that is rounded once at the end.
 * Not here: what a failure does and says (fail.c: this file only detects it and hands over), and
 * the connections themselves (setup.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "group/tcp/tcp_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

static bool is_half(ddp_dtype t)
{
    return t == DDP_BFLOAT16 || t == DDP_FLOAT16;
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

/* ---- the collective header ------------------------------------------------------------------- */

/* Layout: 0 magic, 4 kind, 5 dtype, 6 op, 7 algorithm (1: small allreduce), 8 root, 12 seq,
 * 20 count, 28 zero. Fields a kind does not use are zero, so two members running the same
 * collective send equal bytes. */
static void encode_header(unsigned char *h, const ddp__coll *c, bool small)
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
    h[7] = small ? 1 : 0;
    if (c->kind == DDP__BROADCAST)
        put32(h + 8, (uint32_t)c->root);
    put64(h + 12, c->seq);
}

/* ---- the progress engine --------------------------------------------------------------------- */

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
            return ddp__tcp_fail_conn(x, f, next_of(be), errno);
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
            return ddp__tcp_fail_conn(x, f, prev_of(be), errno);
        }
        if (got == 0)
            return ddp__tcp_fail_conn(x, f, prev_of(be), 0);
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
                ddp_status st = ddp__tcp_check_header(x, f);
                if (st != DDP_OK)
                    return st;
            }
        }
    }
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
            return ddp__tcp_fail_aborted(be, x->c, f);
        int left = ddp__ms_left(x->c->deadline_ms);
        if (left == 0)
            return ddp__tcp_fail_timeout(x, f);
        if (progress)
            continue;
        int64_t now = ddp__now_ms();
        if (ddp__stall_due(x->c, now)) {
            char why[320];
            ddp__tcp_describe_wait(x, why, sizeof why);
            ddp__stall_report(x->c, now, "tcp", why);
        }
        left = ddp__ms_left(ddp__stall_wake(x->c, x->c->deadline_ms));
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
            return ddp__tcp_fail(be, f, DDP_ERR_SYSTEM, "poll failed during tcp %s: %s",
                                 ddp__kind_name(x->c->kind), strerror(errno));
        }
        if (atomic_load(&be->aborted))
            return ddp__tcp_fail_aborted(be, x->c, f);
        short bad = POLLIN | POLLHUP | POLLERR;
        if ((p[1].revents & bad) || (p[2].revents & bad)) {
            st = ddp__tcp_check_notices(x, f, x->si < x->ns);
            if (st != DDP_OK)
                return st;
        }
    }
}

/* ---- schedules ------------------------------------------------------------------------------- */

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
    encode_header(be->hdr_out, x->c, x->small);
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

/* Small allreduce: a ring allgather of whole inputs of B bytes. Member me sends its own input
 * from in; the others' land in gather, slot j holding member j's (slot me unused); step t sends
 * what step t−1 received and receives the input of member me−t−1. */
static void sched_small_allreduce(xfer *x, const char *in, char *gather, size_t B)
{
    int me = x->be->me, n = x->be->n;
    sched_begin(x, true, true);
    for (int t = 0; t < n - 1; t++) {
        int sb = mod(me - t, n), rb = mod(me - t - 1, n);
        add_send(x, t == 0 ? in : gather + (size_t)sb * B, B, t == 0 ? -1 : t);
        add_recv(x, SEG_COPY, gather + (size_t)rb * B, NULL, B, rb);
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

/* ---- run ------------------------------------------------------------------------------------- */

static ddp_status fail_invalid(tcp_be *be, const ddp__coll *c, ddp__fail *f, const char *why)
{
    return ddp__tcp_fail(be, f, DDP_ERR_INVALID, "tcp %s #%llu: %s", ddp__kind_name(c->kind),
                         (unsigned long long)c->seq, why);
}

/* Checks what the core hands over; a bad collective here is a bug in the caller. */
static ddp_status check_coll(tcp_be *be, const ddp__coll *c, ddp__fail *f)
{
    if ((unsigned)c->kind >= DDP__KIND_COUNT)
        return ddp__tcp_fail(be, f, DDP_ERR_INVALID, "tcp backend: unknown collective kind %d",
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
    if (c->kind == DDP__BARRIER || c->count == 0 || !c->send)
        return;
    if (c->send != c->recv)
        memmove(c->recv, c->send, c->count * ddp_dtype_size(c->dtype));
    if (is_reduction(c->kind)) /* AVG (fused) of one member: its input over the divisor */
        ddp__scale_avg(c->recv, c->count, c->dtype, c->avg_div);
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
            return ddp__tcp_fail(be, f, DDP_ERR_NOMEM,
                                 "tcp %s: out of memory for a float32 copy of %zu elements",
                                 ddp__kind_name(c->kind), elems);
        ddp__to_f32(be->f32, c->send, elems, c->dtype);
    }
    char *w = be->f32;
    switch (c->kind) {
    case DDP__ALLREDUCE:
        if (x->small) {
            if (!reserve((void **)&be->gather, &be->gather_cap, n * count * esz + 1))
                return ddp__tcp_fail(be, f, DDP_ERR_NOMEM,
                                     "tcp allreduce: out of memory for %zu bytes of inputs",
                                     n * count * esz);
            sched_small_allreduce(x, c->send, (char *)be->gather, count * esz);
        } else if (half)
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
            return ddp__tcp_fail(be, f, DDP_ERR_NOMEM,
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

ddp_status ddp__tcp_run(void *bev, const ddp__coll *c, ddp__fail *f)
{
    tcp_be *be = bev;
    if (!be || !c) {
        if (f) {
            f->status = DDP_ERR_INVALID;
            f->peer = false;
            ddp__fmt(f->msg, sizeof f->msg, "tcp backend: run() without a backend or collective");
        }
        return DDP_ERR_INVALID;
    }
    if (be->fail_st != DDP_OK) {
        ddp__tcp_record(be, f); /* the first failure, again */
        return be->fail_st;
    }
    if (atomic_load(&be->aborted))
        return ddp__tcp_fail_aborted(be, c, f);
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
    size_t esz = c->kind == DDP__BARRIER ? 1 : ddp_dtype_size(c->dtype);
    /* The same choice on every member: it depends only on the collective (the header carries
     * it, so a member built with another threshold is reported, not misread). */
    x.small = c->kind == DDP__ALLREDUCE && c->count > 0 &&
              c->count * esz <= be->small_max / (size_t)(be->n - 1);
    bool half = is_reduction(c->kind) && is_half(c->dtype) && !x.small;
    x.wtype = half ? DDP_FLOAT32 : c->dtype;
    x.wsize = half ? sizeof(float) : c->kind == DDP__BARRIER ? 1 : ddp_dtype_size(c->dtype);
    /* A peer may have failed while this member was away: its notice is waiting. */
    st = ddp__tcp_check_notices(&x, f, true);
    if (st == DDP_OK)
        st = plan(&x, f, half);
    if (st == DDP_OK)
        st = xfer_run(&x, f);
    if (st != DDP_OK)
        return st;
    size_t me = (size_t)be->me;
    if (x.small) {
        /* Every member reduces the same inputs in the same order in one pass, so all hold the
         * same bits; bfloat16/float16 are summed in float32 and rounded once by the kernel. The
         * output may alias this member's own input (in place). */
        for (size_t j = 0; j < (size_t)be->n; j++)
            be->srcs[j] = j == me ? c->send : be->gather + j * c->count * esz;
        if (be->n == 2 && me == 1 && c->send == c->recv) {
            /* The kernel reduces two inputs in place as dst op other, which would be input 1
             * op input 0 here: the same number, but a NaN keeps the payload of its left
             * operand. So member 1 reduces from a copy, in the order member 0 uses. */
            memcpy(be->gather + me * c->count * esz, c->send, c->count * esz);
            be->srcs[me] = be->gather + me * c->count * esz;
        }
        ddp__reduce_many_avg(c->recv, be->srcs, be->n, c->count, c->dtype, c->op, c->avg_div);
    } else if (half) {
        /* AVG (fused): the float32 sum divided before its one rounding */
        float *sum = (float *)be->f32 + (c->kind == DDP__ALLREDUCE ? 0 : me * c->count);
        if (c->avg_div > 1)
            ddp__scale_avg(sum, c->count, DDP_FLOAT32, c->avg_div);
        ddp__from_f32(c->recv, sum, c->count, c->dtype);
    } else if (is_reduction(c->kind)) {
        ddp__scale_avg(c->recv, c->count, c->dtype, c->avg_div); /* (≤ 1: nothing) */
    }
    return DDP_OK;
}
