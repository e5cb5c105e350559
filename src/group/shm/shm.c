/*
 * shm.c — the shared-memory backend: collectives among ranks on one host.
 *
 * One POSIX shared-memory segment per group, mapped by every member:
 *   header   magic, member count, pids, the abort flag
 *   slots    per member: its barrier counter and sleeper count, each on its own cache line, and
 *            the buffer descriptor it posts for the current step (on another line)
 *   staging  per member, two halves of CHUNK bytes: where ordinary (private) buffers are copied
 *   arena    per member, arena_bytes: ddp_group_alloc() memory, reduced in place (zero copy)
 * Local member 0 creates it; once every member has mapped it, member 0 unlinks the name, so a
 * crash at any later point cannot leave it in /dev/shm (the kernel frees it with the last map).
 * A group of one member shares nothing: the same layout without staging, in private memory
 * (no file in /dev/shm; pages only as its arena is written), so that a world of one costs nothing.
 *
 * Algorithms (per chunk of at most CHUNK bytes; S = chunk size, W = members):
 *   small allreduce (S ≤ SMALL): stage, one barrier, every member reduces all W inputs itself;
 *   large allreduce: stage, barrier, member r reduces slice r of all inputs once (one pass,
 *     ddp__reduce_many), barrier, every member copies the other slices from their owners —
 *     reduce-scatter + allgather through memory, about 3·W·S bytes moved against the 2·W·S that
 *     any allreduce must move. In one of four variants (shm_int.h: whole slices or blocks of
 *     L2/4; copies by memcpy, ordinary or streaming stores), one per size band, chosen at
 *     creation by member 0 — forced, cached for this machine, probed (probe.c) or from
 *     the rules (choice.c) — and published through the header;
 *   broadcast / allgather / reduce_scatter: stage, barrier, copy or reduce what is needed;
 *     allgather and reduce_scatter on arena buffers read the peers' send in place instead.
 * Every member posts whether its buffers are in the arena before the first barrier, and all
 * check after it that they agree (the two protocols differ).
 * Staging alternates halves from chunk to chunk (a counter that runs across operations). A
 * member reaches the barrier of chunk k+1 only after it has finished reading chunk k, so writing
 * a half two chunks later is safe without a closing barrier. Buffers in the arena are read in
 * place by the peers; then a closing barrier keeps the caller from reusing them too early.
 *
 * Distance: a line a peer has read stays in its cache, so the owner's next write to it (the next
 * step's gradients or parameters) first waits for that copy to be invalidated. Between cores that
 * share a last-level cache this is cheap; across chiplets (AMD CCDs) or sockets each such line
 * costs a round trip over the fabric, about 300 ns, and a step that rewrites a megabyte runs
 * about twice as slow (bench/RESULTS.md). So every PROBE_EVERY barriers the members measure a
 * cache-line round trip to each peer (pairs of a round-robin tournament, the fastest of 4 batches
 * of 8: W−1 rounds of 3–15 µs), on whatever thread runs the collective, so that every member
 * probes at the same barriers; and a member evicts (CLFLUSHOPT) what it has read from a peer
 * farther than FAR_NS: the owner then writes to lines no other cache holds. Near peers are left
 * alone: for them the flush costs more than it saves. A performance hint only: nothing depends on
 * it for correctness.
 *
 * Waiting: spin briefly, then sleep on a futex (shared, so it works across processes) in slices
 * of at most 50 ms, checking the deadline, the abort flag and whether a peer died (pidfd). With
 * more ranks than cores, spinning only steals the peer's core, so the spin is short then.
 * Then, with more ranks than cores, the waiter yields its CPU a few times before it sleeps: the
 * peer it waits for is often queued there, and runs at once, without a futex wake-up (3 ranks on
 * 2 cores: a 4 KiB allreduce 8× faster, training unchanged on an idle host, 10% slower beside a
 * CPU hog; RESULTS.md).
 * With a core each, the scheduler may still put two ranks on one CPU (a wake-up pulls the woken
 * rank to the waker's CPU; on a host busy with other work nothing pulls them apart again): each
 * long spin then holds the CPU the awaited peer is queued for, and a job runs many times slower
 * (seen: 10–50× beside CPU hogs, in some runs). So each member posts the CPU it arrives on, a
 * long spin looks where the awaited peer last arrived, and after SHARED_WAITS such waits in a
 * row the waiter moves itself to another CPU it may run on (its affinity mask without this CPU,
 * then the mask as it was: a one-off migration, not a pinning). Yielding there instead keeps the
 * two together, on an idle host too, where spinning makes the scheduler part them (measured: a
 * 256 KiB allreduce 4× slower; RESULTS.md, "How the shm backend waits").
 * AVG's division is done in the reducing pass (fuses_avg), on each member's slice.
 * Not here: ordering, poisoning and async (the core, group.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "group/group_int.h"
#include "group/shm/segment_int.h"
#include "group/shm/shm_int.h"
#include "kernels/kernels.h"
#include "util/util.h"

#define SHM_MAGIC 0x4d485344u    /* "DSHM" */
#define CHUNK ((size_t)1 << 20)  /* bytes per staging half */
#define SMALL ((size_t)32 << 10) /* at most this many bytes: single-pass allreduce */
#define ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define PROBE_EVERY 512 /* barriers between distance probes (the host may move us meanwhile) */
#define PROBE_TRIPS 8   /* round trips per batch; the probe keeps the fastest of PROBE_BATCHES */
#define PROBE_BATCHES 4
#define FAR_NS 200 /* a round trip slower than this leaves the last-level cache */

/* ---- futex and waiting ------------------------------------------------------------------- */

static long futex(atomic_uint *addr, int op, unsigned val, const struct timespec *ts)
{
    return syscall(SYS_futex, (unsigned *)addr, op, val, ts, NULL, 0);
}

static bool reached(unsigned have, unsigned want)
{
    return (int)(have - want) >= 0; /* wraps after 2^31 barriers */
}

static char *slot_base(shm_be *b)
{
    return b->base + ALIGN_UP(sizeof(shm_header), 4096);
}

static bool peer_dead(shm_be *b, int j)
{
    if (b->pidfds[j] < 0)
        return kill(b->hdr->pids[j], 0) != 0 && errno == ESRCH;
    struct pollfd p = {.fd = b->pidfds[j], .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* Spin rounds (a pause each) before a wait sleeps: when every member has a core to itself
 * (20000 pauses: a quarter to a few milliseconds, by CPU), and otherwise. */
#define SPIN_LONG 20000
#define SPIN_BRIEF 64
/* With more ranks than cores: the sched_yield() polls after the brief spin, before sleeping. */
#define BRIEF_YIELDS 8
/* Every so many rounds a long spin looks where the peer it waits for last arrived (~3 µs). */
#define SPIN_LOOK_EVERY 256
/* Long spins in a row that found the awaited peer on the waiter's CPU before it moves. */
#define SHARED_WAITS 4

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Writes the global ranks of the members that have not reached epoch e ("2, 5") into list; returns
 * how many there are. */
static int missing_ranks(shm_be *b, unsigned e, char *list, size_t cap)
{
    int missing = 0;
    list[0] = '\0';
    for (int j = 0; j < b->n; j++) {
        if (j == b->me || reached(atomic_load(&b->slots[j].arrive), e))
            continue;
        size_t l = strlen(list);
        if (missing++ < 8)
            ddp__fmt(list + l, cap - l, "%s%d", l ? ", " : "", b->ranks[j]);
    }
    return missing;
}

static void shm_abort(void *be, const char *why);

/* Fills b->fail for a failed wait of collective c at barrier epoch e. */
static ddp_status wait_failed(shm_be *b, const ddp__coll *c, unsigned e, ddp_status st,
                              const char *why, bool peer)
{
    char list[200];
    int missing = missing_ranks(b, e, list, sizeof list);
    char what[160];
    ddp__coll_what(c, what, sizeof what);
    b->failed = true;
    b->fail.status = st;
    b->fail.peer = peer;
    if (st == DDP_ERR_TIMEOUT)
        ddp__fmt(b->fail.msg, sizeof b->fail.msg,
                 "%s timed out in shm: rank%s %s%s did not arrive%s; a rank may be hung or "
                 "stopped, or ranks called different collectives (set DDP_DEBUG=1 to check)",
                 what, missing == 1 ? "" : "s", list, missing > 8 ? ", …" : "", why);
    else
        ddp__fmt(b->fail.msg, sizeof b->fail.msg, "%s failed in shm: %s", what, why);
    /* A timeout ends the group for the peers too (as tcp's notice does): a rank that arrives
     * late must not find every peer there and take the data of ranks that gave up. */
    if (st == DDP_ERR_TIMEOUT)
        shm_abort(b, b->fail.msg);
    return st;
}

/* A "still waiting" line for collective c at barrier epoch e, naming the ranks not yet there. */
static void report_stall(shm_be *b, const ddp__coll *c, unsigned e, int64_t now)
{
    char list[200], who[300];
    int missing = missing_ranks(b, e, list, sizeof list);
    ddp__fmt(who, sizeof who, "rank%s %s%s %s not arrived", missing == 1 ? "" : "s", list,
             missing > 8 ? ", …" : "", missing == 1 ? "has" : "have");
    ddp__stall_report(c, now, "shm", who);
}

/* Moves the calling thread off CPU cpu, if its affinity allows another: sets the mask without
 * cpu (the kernel migrates the thread now), then puts the mask back. */
static void move_off(int cpu)
{
    cpu_set_t was, off;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof was, &was) != 0 ||
        !CPU_ISSET(cpu, &was) || CPU_COUNT(&was) < 2)
        return;
    off = was;
    CPU_CLR(cpu, &off);
    if (sched_setaffinity(0, sizeof off, &off) == 0)
        (void)sched_setaffinity(0, sizeof was, &was);
}

/* Spins until member j reaches epoch e: true if it did. The progress thread (background) spins
 * only briefly and never yields: nobody waits on it, and its caller's thread may need the core.
 * A brief spin then yields a few times; a long one watches for a peer queued on this CPU
 * (Waiting, above). */
static bool spin_for(shm_be *b, int j, unsigned e, bool background)
{
    atomic_uint *a = &b->slots[j].arrive;
    if (background || b->spin == SPIN_BRIEF) {
        for (int i = 0; i < SPIN_BRIEF; i++) {
            cpu_relax();
            if (reached(atomic_load_explicit(a, memory_order_acquire), e))
                return true;
        }
        for (int i = 0; !background && i < BRIEF_YIELDS; i++) {
            sched_yield();
            if (reached(atomic_load_explicit(a, memory_order_acquire), e))
                return true;
        }
        return false;
    }
    bool shared = false, moved = false, got = false;
    for (int i = 1; i <= b->spin; i++) {
        cpu_relax();
        if (reached(atomic_load_explicit(a, memory_order_acquire), e)) {
            got = true;
            break;
        }
        if (i % SPIN_LOOK_EVERY || shared)
            continue;
        int cpu = sched_getcpu();
        if (atomic_load_explicit(&b->slots[j].cpu, memory_order_relaxed) != cpu)
            continue;
        shared = true;
        if (b->shared_waits + 1 >= SHARED_WAITS) {
            moved = true;
            move_off(cpu);
        }
    }
    b->shared_waits = shared && !moved ? b->shared_waits + 1 : 0;
    return got;
}

/* Waits until every member has reached barrier epoch e. */
static ddp_status wait_all(shm_be *b, const ddp__coll *c, unsigned e)
{
    for (int j = 0; j < b->n; j++) {
        if (j == b->me)
            continue;
        atomic_uint *a = &b->slots[j].arrive;
        if (reached(atomic_load_explicit(a, memory_order_acquire), e))
            continue;
        if (spin_for(b, j, e, c->background))
            continue;
        int64_t next_check = 0;
        for (;;) {
            unsigned v = atomic_load(a);
            if (reached(v, e))
                break;
            int64_t now = ddp__now_ms();
            if (now >= next_check) {
                /* A peer that arrived, then left, died or aborted in a later collective between
                 * the load of v above and these checks did arrive: look at its word again
                 * before failing (the arrival is stored before any of those). */
                char why[400];
                ddp_status fst = DDP_OK;
                bool peer = true;
                int ab = atomic_load(&b->hdr->abort_by);
                if (ab) {
                    ddp__fmt(why, sizeof why, "rank %d aborted the group: %s", b->ranks[ab - 1],
                             b->hdr->abort_msg);
                    fst = DDP_ERR_CLOSED;
                    peer = ab - 1 != b->me;
                } else if (atomic_load(&b->slots[j].left)) {
                    /* before peer_dead: a rank that left, then exited (a program that returned
                     * early, cleaning up) did not die */
                    ddp__fmt(why, sizeof why,
                             "rank %d left the group (ddp_group_destroy) before arriving: it "
                             "called fewer collectives than this rank",
                             b->ranks[j]);
                    fst = DDP_ERR_CLOSED;
                } else if (peer_dead(b, j)) {
                    ddp__fmt(why, sizeof why, "rank %d (pid %d) exited or died before arriving",
                             b->ranks[j], (int)b->hdr->pids[j]);
                    fst = DDP_ERR_NETWORK;
                }
                if (fst != DDP_OK) {
                    if (reached(atomic_load_explicit(a, memory_order_acquire), e))
                        break;
                    return wait_failed(b, c, e, fst, why, peer);
                }
                if (now >= c->deadline_ms)
                    return wait_failed(b, c, e, DDP_ERR_TIMEOUT, "", false);
                if (ddp__stall_due(c, now))
                    report_stall(b, c, e, now);
                next_check = now + 20;
            }
            atomic_fetch_add(&b->slots[j].sleepers, 1);
            v = atomic_load(a);
            if (!reached(v, e)) {
                struct timespec ts = {0, 20 * 1000000L};
                futex(a, FUTEX_WAIT, v, &ts);
            }
            atomic_fetch_sub(&b->slots[j].sleepers, 1);
        }
    }
    /* An abort is final even when every peer had arrived: a rank that timed out here arrived
     * before it gave up and aborted, and a late rank found it there and returned DDP_OK. But
     * not for a barrier the aborting rank had passed (it aborted in a later collective): that
     * one is complete everywhere, and this rank fails at the next, where the others did. */
    int ab = atomic_load_explicit(&b->hdr->abort_by, memory_order_acquire);
    if (ab && (int32_t)(e - atomic_load(&b->hdr->abort_epoch)) >= 0) {
        char why[400];
        ddp__fmt(why, sizeof why, "rank %d aborted the group: %s", b->ranks[ab - 1],
                 b->hdr->abort_msg);
        return wait_failed(b, c, e, DDP_ERR_CLOSED, why, ab - 1 != b->me);
    }
    return DDP_OK;
}

/* ---- distance -------------------------------------------------------------------------------- */

/* Spins until *a holds token t; false after about a millisecond (a peer descheduled or gone: the
 * probe gives up, the next barrier handles the rest). */
static bool await_token(atomic_uint *a, unsigned t)
{
    for (int64_t i = 0, until = 0;; i++) {
        if (atomic_load_explicit(a, memory_order_acquire) == t)
            return true;
        cpu_relax();
        if ((i & 1023) == 1023) {
            int64_t now = ddp__now_ns();
            if (!until)
                until = now + 1000000;
            else if (now > until)
                return false;
        }
    }
}

/* Measures the cache-line round trip to every peer and sets far[]. Runs right after a barrier
 * (every member is here), in W−1 rounds (W rounds for odd W, one member resting in each): in
 * round r members i and j with i + j ≡ 2r (mod W'−1) meet, and member W'−1 meets r, W' being W
 * rounded up to even. The lower of a pair serves, the higher answers. */
static void probe_distance(shm_be *b)
{
    int W = b->n, n = W + (W & 1), me = b->me;
    unsigned base = b->probes++ * (unsigned)n * (PROBE_BATCHES * PROBE_TRIPS + 1);
    atomic_uint *mine = &b->slots[me].ping;
    for (int r = 0; r < n - 1; r++) {
        int j = me == n - 1 ? r : me == r ? n - 1 : ((2 * r - me) % (n - 1) + (n - 1)) % (n - 1);
        if (j >= W)
            continue; /* my rest round */
        atomic_uint *theirs = &b->slots[j].ping;
        unsigned tok = base + (unsigned)r * (PROBE_BATCHES * PROBE_TRIPS + 1);
        int64_t best = INT64_MAX;
        bool ok = true;
        for (int k = 0; k < PROBE_BATCHES && ok; k++) {
            int64_t t0 = ddp__now_ns();
            for (int i = 0; i < PROBE_TRIPS && ok; i++) {
                tok++;
                if (me < j) {
                    atomic_store_explicit(mine, tok, memory_order_release);
                    ok = await_token(theirs, tok);
                } else {
                    ok = await_token(theirs, tok);
                    atomic_store_explicit(mine, tok, memory_order_release);
                }
            }
            int64_t dt = (ddp__now_ns() - t0) / PROBE_TRIPS;
            if (ok && dt < best)
                best = dt;
        }
        if (ok)
            b->far[j] = best > FAR_NS;
    }
}

/* ---- collectives that differ ------------------------------------------------------------- */

static uint64_t desc_misc(const ddp__coll *c)
{
    return (uint64_t)c->kind | (uint64_t)c->dtype << 8 | (uint64_t)c->op << 16 |
           (uint64_t)(uint32_t)(c->root + 1) << 24;
}

/* 32 bits of (count, misc): equal for equal collectives, unequal for almost all others. */
static uint32_t desc_hash(uint64_t count, uint64_t misc)
{
    uint64_t x = count * 0x9e3779b97f4a7c15ull ^ misc;
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return (uint32_t)x;
}

/* Posts what c is, for the opening barrier (the next one): the details first, then the key. */
static void post_desc(shm_be *b, const ddp__coll *c)
{
    shm_slot *s = &b->slots[b->me];
    b->desc_epoch = b->epoch + 1;
    uint64_t misc = desc_misc(c);
    atomic_store_explicit(&s->desc_count, c->count, memory_order_relaxed);
    atomic_store_explicit(&s->desc_misc, misc, memory_order_relaxed);
    atomic_store_explicit(&s->desc_key, (uint64_t)b->desc_epoch << 32 | desc_hash(c->count, misc),
                          memory_order_release);
}

/* "allgather #18 (float32 × 10)", "broadcast #3 (int64 × 1, root 1)", "barrier #4". */
static void describe(char *buf, size_t cap, uint64_t seq, uint64_t count, uint64_t misc,
                     const int *ranks)
{
    unsigned kind = misc & 0xff, dtype = (misc >> 8) & 0xff, op = (misc >> 16) & 0xff;
    int root = (int)(uint32_t)(misc >> 24) - 1;
    const char *k = ddp__kind_name((ddp__kind)kind);
    const char *t = dtype < DDP_DTYPE_COUNT ? ddp_dtype_name((ddp_dtype)dtype) : "?";
    if (kind == DDP__BARRIER)
        ddp__fmt(buf, cap, "barrier #%llu", (unsigned long long)seq);
    else if (kind == DDP__BROADCAST)
        ddp__fmt(buf, cap, "broadcast #%llu (%s × %llu, root rank %d)", (unsigned long long)seq, t,
                 (unsigned long long)count, root >= 0 ? ranks[root] : root);
    else if (kind == DDP__ALLREDUCE || kind == DDP__REDUCE_SCATTER)
        ddp__fmt(buf, cap, "%s #%llu (%s × %llu, %s)", k, (unsigned long long)seq, t,
                 (unsigned long long)count, op < DDP_OP_COUNT ? ddp_op_name((ddp_op)op) : "?");
    else
        ddp__fmt(buf, cap, "%s #%llu (%s × %llu)", k, (unsigned long long)seq, t,
                 (unsigned long long)count);
}

/* After the opening barrier at epoch e: every peer whose key is for it runs what I run. A peer
 * whose key is later already passed this barrier after the same check against mine. */
static ddp_status check_desc(shm_be *b, const ddp__coll *c, unsigned e)
{
    uint64_t my_count = c->count, my_misc = desc_misc(c);
    uint64_t mine = (uint64_t)e << 32 | desc_hash(my_count, my_misc);
    for (int j = 0; j < b->n; j++) {
        if (j == b->me)
            continue;
        shm_slot *s = &b->slots[j];
        uint64_t key = atomic_load_explicit(&s->desc_key, memory_order_acquire);
        if (key == mine || key >> 32 != e)
            continue;
        /* They differ: the details for the message (posted before the key; still theirs if the
         * key is unchanged, and it is: that peer fails here too rather than moving on). */
        uint64_t count = atomic_load_explicit(&s->desc_count, memory_order_relaxed);
        uint64_t misc = atomic_load_explicit(&s->desc_misc, memory_order_relaxed);
        char theirs[160], my[160];
        describe(theirs, sizeof theirs, c->seq, count, misc, b->ranks);
        describe(my, sizeof my, c->seq, my_count, my_misc, b->ranks);
        b->failed = true;
        b->fail.status = DDP_ERR_INVALID;
        b->fail.peer = false;
        ddp__fmt(b->fail.msg, sizeof b->fail.msg,
                 "collectives differ across ranks: rank %d runs %s while rank %d runs %s; every "
                 "rank must call the same collectives in the same order with the same count, "
                 "dtype, op and root (DDP_DEBUG=1 checks this before each call)",
                 b->ranks[j], theirs, b->ranks[b->me], my);
        return DDP_ERR_INVALID;
    }
    return DDP_OK;
}

/* A barrier among all members. Stores before it are visible to every member after it. The
 * opening barrier of a collective (post_desc) also checks that every member runs the same. */
ddp_status ddp__shm_barrier(shm_be *b, const ddp__coll *c)
{
    unsigned e = ++b->epoch;
    atomic_uint *mine = &b->slots[b->me].arrive;
    atomic_store_explicit(&b->slots[b->me].cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store(mine, e); /* seq_cst: pairs with the sleepers' increment-then-check */
    if (atomic_load(&b->slots[b->me].sleepers))
        futex(mine, FUTEX_WAKE, INT_MAX, NULL);
    ddp_status st = wait_all(b, c, e);
    if (st == DDP_OK)
        atomic_store_explicit(&b->passed, e, memory_order_relaxed);
    if (st == DDP_OK && e == b->desc_epoch)
        st = check_desc(b, c, e);
    if (st == DDP_OK && b->can_flush && e % PROBE_EVERY == 1) /* the same barriers everywhere */
        probe_distance(b);
    return st;
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static bool have_clflushopt(void)
{
    unsigned a, bx, cx, d;
    return __get_cpuid_count(7, 0, &a, &bx, &cx, &d) && (bx & (1u << 23));
}
__attribute__((target("clflushopt"))) static void flush_lines(const void *p, size_t bytes)
{
    const char *q = (const char *)((uintptr_t)p & ~(uintptr_t)(CACHELINE - 1));
    for (const char *end = (const char *)p + bytes; q < end; q += CACHELINE)
        __builtin_ia32_clflushopt(q);
}
#else
static bool have_clflushopt(void)
{
    return false;
}
static void flush_lines(const void *p, size_t bytes)
{
    (void)p, (void)bytes;
}
#endif

/* I have finished reading bytes at p, which member j wrote and will write again: if j is far,
 * evict them so that its next write does not wait for my copy to be invalidated. */
static void done_reading(shm_be *b, int j, const void *p, size_t bytes)
{
    if (j != b->me && b->far[j])
        flush_lines(p, bytes);
}

/* done_reading for the same range of every member's buffer, srcs[j] being member j's. */
static void done_reading_all(shm_be *b, const void *const *srcs, size_t bytes)
{
    for (int j = 0; j < b->n; j++)
        done_reading(b, j, srcs[j], bytes);
}

/* ---- buffers ------------------------------------------------------------------------------ */

static bool in_segment(const shm_be *b, const void *p, size_t bytes)
{
    const char *q = p;
    return q >= b->base && q + bytes <= b->base + b->size && bytes > 0;
}

static char *staging(shm_be *b, int member, uint64_t chunk)
{
    return b->base + b->hdr->staging_off + (size_t)member * 2 * CHUNK + (chunk & 1) * CHUNK;
}

static char *at(shm_be *b, uint64_t off)
{
    return b->base + off;
}

/* Elements of a chunk that member r owns: [lo, hi). Slices are whole cache lines when large. */
static void slice(size_t n, int W, int r, size_t esz, size_t *lo, size_t *hi)
{
    size_t per = (n + (size_t)W - 1) / (size_t)W;
    size_t line = CACHELINE / esz;
    if (line > 0 && per > line)
        per = ALIGN_UP(per, line);
    *lo = per * (size_t)r < n ? per * (size_t)r : n;
    *hi = per * (size_t)(r + 1) < n ? per * (size_t)(r + 1) : n;
}

/* ---- collectives -------------------------------------------------------------------------- */

/* Posts where my buffers are (zero copy) or that I use staging, passes the opening barrier, and
 * checks that every member chose the same way: a member whose buffers are in the arena and one
 * whose are not would run different protocols, so both fail here instead of hanging. */
static ddp_status open_coll(shm_be *b, const ddp__coll *c, bool zc)
{
    shm_slot *s = &b->slots[b->me];
    unsigned e = b->epoch + 1; /* the barrier below */
    atomic_store_explicit(&s->posted, (uint64_t)e << 1 | zc, memory_order_relaxed);
    if (zc) {
        s->src_off = (uint64_t)((const char *)c->send - b->base);
        s->dst_off = (uint64_t)((char *)c->recv - b->base);
    }
    ddp_status st = ddp__shm_barrier(b, c);
    if (st)
        return st;
    for (int j = 0; j < b->n; j++) {
        /* A peer that has already posted for a later collective agreed with me (it moves on
         * only after this check), so only a post from this barrier can disagree. */
        uint64_t v = atomic_load_explicit(&b->slots[j].posted, memory_order_relaxed);
        if (j != b->me && (unsigned)(v >> 1) == e && (bool)(v & 1) != zc) {
            char why[200];
            ddp__fmt(why, sizeof why,
                     "rank %d passed ddp_group_alloc() memory and rank %d did not: pass such "
                     "buffers on every rank or on none",
                     b->ranks[zc ? b->me : j], b->ranks[zc ? j : b->me]);
            b->failed = true;
            b->fail.status = DDP_ERR_INVALID;
            ddp__fmt(b->fail.msg, sizeof b->fail.msg, "%s #%llu failed in shm: %s",
                     ddp__kind_name(c->kind), (unsigned long long)c->seq, why);
            return DDP_ERR_INVALID;
        }
    }
    return DDP_OK;
}

static ddp__shm_variant variant_for(const shm_be *b, size_t bytes)
{
    if (b->forced >= 0)
        return (ddp__shm_variant)b->forced;
    return (ddp__shm_variant)b->choice.band[ddp__shm_band_of(bytes)];
}

/* A copy of the result into place, with the stores variant v asks for (shm_int.h). */
static void copy_result(ddp__shm_variant v, void *dst, const void *src, size_t bytes)
{
    switch (v) {
    case DDP__SHM_CACHED:
    case DDP__SHM_PIPELINED: ddp__copy_cached(dst, src, bytes); break;
    case DDP__SHM_STREAM: ddp__copy_stream(dst, src, bytes); break;
    default: memcpy(dst, src, bytes); break;
    }
}

/* Elements per step of variant v for a message of count elements: the whole message, or the
 * pipelined variant's block (at least one cache line per member). */
static size_t step_elems(const shm_be *b, ddp__shm_variant v, size_t count, size_t esz)
{
    if (v != DDP__SHM_PIPELINED)
        return count;
    size_t per = b->choice.block / esz;
    size_t least = (size_t)b->n * CACHELINE / esz;
    return per < least ? least : per;
}

ddp_status ddp__shm_run_allreduce(shm_be *b, const ddp__coll *c)
{
    size_t esz = ddp_dtype_size(c->dtype);
    size_t total = c->count * esz;
    int W = b->n;
    const void *srcs[MAX_MEMBERS];
    ddp__shm_variant v = variant_for(b, total);
    /* Zero copy when both buffers are in the arena: peers read them in place. Per step (the
     * whole message, or one block when pipelined): member r reduces slice r of the step from
     * every input into its recv, a barrier, then copies the other slices from their owners'
     * recv. Writing my recv's other slices cannot disturb a peer: it read them as inputs before
     * that barrier. The next step touches other elements, so one barrier per step suffices. */
    bool zc = in_segment(b, c->send, total) && in_segment(b, c->recv, total);
    if (zc) {
        ddp_status st = open_coll(b, c, true);
        if (st)
            return st;
        size_t step = step_elems(b, v, c->count, esz);
        for (size_t base = 0; base < c->count; base += step) {
            size_t n = c->count - base < step ? c->count - base : step;
            size_t lo, hi;
            slice(n, W, b->me, esz, &lo, &hi);
            lo += base, hi += base;
            for (int j = 0; j < W; j++)
                srcs[j] = at(b, b->slots[j].src_off) + lo * esz;
            if (hi > lo) {
                /* My slice's result goes into my recv; my own input is srcs[me]. */
                ddp__reduce_many_avg((char *)c->recv + lo * esz, srcs, W, hi - lo, c->dtype, c->op,
                                     c->avg_div);
                done_reading_all(b, srcs, (hi - lo) * esz);
            }
            if ((st = ddp__shm_barrier(b, c)))
                return st;
            for (int j = 0; j < W; j++) {
                if (j == b->me)
                    continue;
                slice(n, W, j, esz, &lo, &hi);
                lo += base, hi += base;
                if (hi > lo) {
                    const char *src = at(b, b->slots[j].dst_off) + lo * esz;
                    copy_result(v, (char *)c->recv + lo * esz, src, (hi - lo) * esz);
                    done_reading(b, j, src, (hi - lo) * esz);
                }
            }
        }
        return ddp__shm_barrier(b,
                                c); /* peers read my recv in place: keep it until they are done */
    }

    size_t per_chunk = CHUNK / esz, step = step_elems(b, v, c->count, esz);
    if (step < per_chunk)
        per_chunk = step;
    for (size_t done = 0; done < c->count || (c->count == 0 && done == 0);) {
        size_t n = c->count - done < per_chunk ? c->count - done : per_chunk;
        uint64_t k = b->chunks++;
        const char *in = (const char *)c->send + done * esz;
        char *out = (char *)c->recv + done * esz;
        char *mine = staging(b, b->me, k);
        memcpy(mine, in, n * esz);
        ddp_status st = done == 0 ? open_coll(b, c, false) : ddp__shm_barrier(b, c);
        if (st)
            return st;
        if (n * esz <= SMALL) {
            /* Every input from staging (so in place works), in rank order on every rank: the
             * same float sums everywhere, whatever W. */
            for (int j = 0; j < W; j++)
                srcs[j] = staging(b, j, k);
            ddp__reduce_many_avg(out, srcs, W, n, c->dtype, c->op, c->avg_div);
            done_reading_all(b, srcs, n * esz);
        } else {
            size_t lo, hi;
            slice(n, W, b->me, esz, &lo, &hi);
            for (int j = 0; j < W; j++)
                srcs[j] = staging(b, j, k) + lo * esz;
            if (hi > lo) {
                /* Result into my staging slice (peers copy it from there) and into my output. */
                ddp__reduce_many_avg(mine + lo * esz, srcs, W, hi - lo, c->dtype, c->op,
                                     c->avg_div);
                copy_result(v, out + lo * esz, mine + lo * esz, (hi - lo) * esz);
                done_reading_all(b, srcs, (hi - lo) * esz);
            }
            if ((st = ddp__shm_barrier(b, c)))
                return st;
            for (int j = 0; j < W; j++) {
                if (j == b->me)
                    continue;
                slice(n, W, j, esz, &lo, &hi);
                if (hi > lo) {
                    copy_result(v, out + lo * esz, staging(b, j, k) + lo * esz, (hi - lo) * esz);
                    done_reading(b, j, staging(b, j, k) + lo * esz, (hi - lo) * esz);
                }
            }
        }
        done += n;
        if (c->count == 0)
            break;
    }
    return DDP_OK;
}

static ddp_status run_broadcast(shm_be *b, const ddp__coll *c)
{
    size_t esz = ddp_dtype_size(c->dtype);
    size_t per_chunk = CHUNK / esz;
    bool root = b->me == c->root;
    for (size_t done = 0; done < c->count;) {
        size_t n = c->count - done < per_chunk ? c->count - done : per_chunk;
        uint64_t k = b->chunks++;
        char *buf = (char *)c->recv + done * esz;
        if (root)
            memcpy(staging(b, b->me, k), buf, n * esz);
        ddp_status st = ddp__shm_barrier(b, c);
        if (st)
            return st;
        if (!root) {
            memcpy(buf, staging(b, c->root, k), n * esz);
            done_reading(b, c->root, staging(b, c->root, k), n * esz);
        }
        done += n;
    }
    return c->count == 0 ? open_coll(b, c, false) : DDP_OK;
}

static ddp_status run_allgather(shm_be *b, const ddp__coll *c)
{
    size_t esz = ddp_dtype_size(c->dtype);
    size_t per_chunk = CHUNK / esz;
    int W = b->n;
    size_t bytes = c->count * esz;
    if (in_segment(b, c->send, bytes) && in_segment(b, c->recv, bytes * (size_t)W)) {
        /* Zero copy: every member copies the others' blocks straight from their send. */
        ddp_status st = open_coll(b, c, true);
        if (st)
            return st;
        for (int j = 0; j < W; j++) {
            char *dst = (char *)c->recv + (size_t)j * bytes;
            const char *src = j == b->me ? c->send : at(b, b->slots[j].src_off);
            if (dst != src)
                memmove(dst, src, bytes);
            done_reading(b, j, src, bytes);
        }
        return ddp__shm_barrier(b, c); /* peers read my send in place */
    }
    for (size_t done = 0; done < c->count;) {
        size_t n = c->count - done < per_chunk ? c->count - done : per_chunk;
        uint64_t k = b->chunks++;
        memcpy(staging(b, b->me, k), (const char *)c->send + done * esz, n * esz);
        ddp_status st = done == 0 ? open_coll(b, c, false) : ddp__shm_barrier(b, c);
        if (st)
            return st;
        for (int j = 0; j < W; j++) {
            char *dst = (char *)c->recv + ((size_t)j * c->count + done) * esz;
            const char *src = staging(b, j, k);
            if (dst != src)
                memmove(dst, src, n * esz);
            done_reading(b, j, src, n * esz);
        }
        done += n;
    }
    return c->count == 0 ? open_coll(b, c, false) : DDP_OK;
}

static ddp_status run_reduce_scatter(shm_be *b, const ddp__coll *c)
{
    size_t esz = ddp_dtype_size(c->dtype);
    int W = b->n;
    /* Stage every rank's whole input in chunks of my part: each chunk holds, for every
     * destination member j, the same element range of j's block, so member j reduces its
     * range from all stagings at once. */
    size_t per_chunk = CHUNK / esz / (size_t)W;
    if (per_chunk == 0)
        per_chunk = 1;
    const void *srcs[MAX_MEMBERS];
    size_t bytes = c->count * esz;
    if (in_segment(b, c->send, bytes * (size_t)W) && in_segment(b, c->recv, bytes)) {
        /* Zero copy: member r reduces block r of every member's send in place, into its recv
         * (which may be that block of its own send: in place). */
        ddp_status st = open_coll(b, c, true);
        if (st)
            return st;
        for (int j = 0; j < W; j++)
            srcs[j] = at(b, b->slots[j].src_off) + (size_t)b->me * bytes;
        ddp__reduce_many_avg(c->recv, srcs, W, c->count, c->dtype, c->op, c->avg_div);
        done_reading_all(b, srcs, bytes);
        return ddp__shm_barrier(b, c); /* peers read my send in place */
    }
    for (size_t done = 0; done < c->count;) {
        size_t n = c->count - done < per_chunk ? c->count - done : per_chunk;
        uint64_t k = b->chunks++;
        char *mine = staging(b, b->me, k);
        for (int j = 0; j < W; j++)
            memcpy(mine + (size_t)j * n * esz,
                   (const char *)c->send + ((size_t)j * c->count + done) * esz, n * esz);
        ddp_status st = done == 0 ? open_coll(b, c, false) : ddp__shm_barrier(b, c);
        if (st)
            return st;
        for (int j = 0; j < W; j++)
            srcs[j] = staging(b, j, k) + (size_t)b->me * n * esz;
        ddp__reduce_many_avg((char *)c->recv + done * esz, srcs, W, n, c->dtype, c->op, c->avg_div);
        done_reading_all(b, srcs, n * esz);
        done += n;
    }
    return c->count == 0 ? open_coll(b, c, false) : DDP_OK;
}

static ddp_status shm_run(void *be, const ddp__coll *c, ddp__fail *f)
{
    shm_be *b = be;
    if (b->failed) {
        *f = b->fail;
        return f->status;
    }
    ddp_status st = DDP_OK;
    if (b->n == 1) {
        size_t esz = ddp_dtype_size(c->dtype);
        if (c->kind != DDP__BARRIER && c->kind != DDP__BROADCAST && c->send != c->recv && c->count)
            memmove(c->recv, c->send, c->count * esz);
        return DDP_OK;
    }
    post_desc(b, c); /* every collective's first barrier checks that all run the same */
    switch (c->kind) {
    case DDP__ALLREDUCE: st = ddp__shm_run_allreduce(b, c); break;
    case DDP__BROADCAST: st = run_broadcast(b, c); break;
    case DDP__ALLGATHER: st = run_allgather(b, c); break;
    case DDP__REDUCE_SCATTER: st = run_reduce_scatter(b, c); break;
    case DDP__BARRIER: st = ddp__shm_barrier(b, c); break;
    default: st = DDP_ERR_INVALID; break;
    }
    if (st != DDP_OK) {
        if (!b->failed) {
            b->failed = true;
            b->fail.status = st;
            ddp__fmt(b->fail.msg, sizeof b->fail.msg, "shm: unknown collective");
        }
        *f = b->fail;
    }
    return st;
}

/* ---- choosing the allreduce's variant ----------------------------------------------------- */

static const char *shm_algorithm(void *be, size_t bytes)
{
    shm_be *b = be;
    if (b->n == 1)
        return "copy";
    /* (Private buffers of at most SMALL bytes take the one-pass path whatever the variant.) */
    return ddp__shm_variant_name(variant_for(b, bytes));
}

/* ---- the arena ---------------------------------------------------------------------------- */

static void *shm_alloc(void *be, size_t bytes)
{
    shm_be *b = be;
    size_t want = ALIGN_UP(bytes ? bytes : 1, CACHELINE);
    for (size_t i = 0; i < b->nblks; i++) {
        struct blk *k = &b->blks[i];
        if (k->used || k->len < want)
            continue;
        size_t arena_start = b->hdr->arena_off + (size_t)b->me * b->hdr->arena_bytes;
        /* Reserve the pages now, so a full /dev/shm is a NULL here rather than a SIGBUS later
         * (a group of one has no file: its arena is private memory). */
        if (b->fd >= 0 && posix_fallocate(b->fd, (off_t)(arena_start + k->off), (off_t)want) != 0)
            return NULL;
        if (k->len > want) {
            if (b->nblks == b->cap_blks) {
                size_t cap = b->cap_blks * 2;
                struct blk *p = realloc(b->blks, cap * sizeof *p);
                if (!p)
                    return NULL;
                b->blks = p;
                b->cap_blks = cap;
                k = &b->blks[i];
            }
            memmove(&b->blks[i + 2], &b->blks[i + 1], (b->nblks - i - 1) * sizeof *b->blks);
            b->blks[i + 1] = (struct blk){k->off + want, k->len - want, false};
            b->nblks++;
            k->len = want;
        }
        k->used = true;
        return b->base + arena_start + k->off;
    }
    return NULL;
}

static void shm_free(void *be, void *p)
{
    shm_be *b = be;
    size_t arena_start = b->hdr->arena_off + (size_t)b->me * b->hdr->arena_bytes;
    size_t off = (size_t)((char *)p - b->base) - arena_start;
    for (size_t i = 0; i < b->nblks; i++) {
        if (b->blks[i].off != off || !b->blks[i].used)
            continue;
        b->blks[i].used = false;
        /* Merge with free neighbours. */
        if (i + 1 < b->nblks && !b->blks[i + 1].used) {
            b->blks[i].len += b->blks[i + 1].len;
            memmove(&b->blks[i + 1], &b->blks[i + 2], (b->nblks - i - 2) * sizeof *b->blks);
            b->nblks--;
        }
        if (i > 0 && !b->blks[i - 1].used) {
            b->blks[i - 1].len += b->blks[i].len;
            memmove(&b->blks[i], &b->blks[i + 1], (b->nblks - i - 1) * sizeof *b->blks);
            b->nblks--;
        }
        return;
    }
}

/* ---- life cycle ----------------------------------------------------------------------------- */

static void shm_abort(void *be, const char *why)
{
    shm_be *b = be;
    int expected = 0;
    if (atomic_compare_exchange_strong(&b->hdr->abort_claim, &expected, 1)) {
        ddp__fmt(b->hdr->abort_msg, sizeof b->hdr->abort_msg, "%s", why ? why : "");
        atomic_store(&b->hdr->abort_epoch, atomic_load(&b->passed) + 1);
        atomic_store(&b->hdr->abort_by, b->me + 1);
    }
    for (int j = 0; j < b->n; j++)
        futex(&b->slots[j].arrive, FUTEX_WAKE, INT_MAX, NULL);
}

static void shm_destroy(void *be)
{
    shm_be *b = be;
    if (!b)
        return;
    if (b->slots && b->n > 1) { /* peers still waiting for me fail now, not at their deadline */
        atomic_store(&b->slots[b->me].left, 1);
        futex(&b->slots[b->me].arrive, FUTEX_WAKE, INT_MAX, NULL);
    }
    if (b->pidfds)
        for (int j = 0; j < b->n; j++)
            if (b->pidfds[j] >= 0)
                close(b->pidfds[j]);
    if (b->base)
        munmap(b->base, b->size);
    if (b->fd >= 0)
        close(b->fd);
    free(b->pidfds);
    free(b->ranks);
    free(b->far);
    free(b->blks);
    free(b);
}

static const ddp__backend_ops shm_ops = {
    .name = "shm",
    .run = shm_run,
    .alloc = shm_alloc,
    .free = shm_free,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .algorithm = shm_algorithm,
    .fuses_avg = true,
};

static ddp_status shm_create(const ddp__setup *s, void **out, const ddp__backend_ops **ops,
                             ddp_error *err)
{
    const ddp__members *m = &s->m;
    size_t arena_bytes = s->arena_bytes;
    if (m->n < 1 || m->n > MAX_MEMBERS)
        return ddp__err(err, DDP_ERR_INVALID, "shm backend: %d ranks on one host; at most %d", m->n,
                        MAX_MEMBERS);
    shm_be *b = calloc(1, sizeof *b);
    if (!b)
        return ddp__err(err, DDP_ERR_NOMEM, "out of memory creating the shm backend");
    b->fd = -1;
    b->me = m->me;
    b->n = m->n;
    b->ncores = s->host_cores > 0 ? s->host_cores : 1;
    b->spin = b->n <= b->ncores ? SPIN_LONG : SPIN_BRIEF;
    b->far = calloc((size_t)m->n, sizeof *b->far);
    b->forced = -1;
    if (!ddp__shm_algo_mode_valid(s->shm_algo)) {
        shm_destroy(b);
        return ddp__err(err, DDP_ERR_INVALID,
                        "DDP_SHM_ALGO must be auto, probe, rules, libc, cached, stream or "
                        "pipelined, not '%.40s'",
                        s->shm_algo);
    }
    const char *flush = s->shm_flush;
    if (flush && *flush && strcmp(flush, "auto") && strcmp(flush, "always") &&
        strcmp(flush, "never")) {
        shm_destroy(b);
        return ddp__err(err, DDP_ERR_INVALID,
                        "DDP_SHM_FLUSH must be auto, always or never, not '%.40s'", flush);
    }
    /* Probing needs every member on its own core: with more ranks than cores a round trip
     * measures the scheduler. */
    bool always = flush && !strcmp(flush, "always"), never = flush && !strcmp(flush, "never");
    bool can = have_clflushopt(); /* without it, nothing to do: every peer stays near */
    b->can_flush = can && !always && !never && b->n > 1 && b->n <= b->ncores;
    for (int j = 0; b->far && j < b->n; j++)
        b->far[j] = can && always && j != b->me;
    b->ranks = malloc(sizeof(int) * (size_t)m->n);
    b->pidfds = malloc(sizeof(int) * (size_t)m->n);
    b->cap_blks = 16;
    b->blks = calloc(b->cap_blks, sizeof *b->blks);
    ddp_status st = DDP_ERR_NOMEM;
    if (!b->ranks || !b->pidfds || !b->blks || !b->far) {
        ddp__err(err, st, "out of memory creating the shm backend");
        goto out_free;
    }
    memcpy(b->ranks, m->ranks, sizeof(int) * (size_t)m->n);
    for (int j = 0; j < b->n; j++)
        b->pidfds[j] = -1;
    arena_bytes = ALIGN_UP(arena_bytes, 4096);
    ddp__shm_machine mach;
    ddp__shm_machine_read(b->n, &mach);
    size_t hdr = ALIGN_UP(sizeof(shm_header), 4096);
    size_t slots = ALIGN_UP(sizeof(shm_slot) * (size_t)m->n, 4096);
    /* One member never stages (its collectives are copies): no staging halves. */
    size_t stage = b->n > 1 ? 2 * CHUNK * (size_t)m->n : 0;
    b->size = hdr + slots + stage + arena_bytes * (size_t)m->n;
    b->blks[0] = (struct blk){0, arena_bytes, false};
    b->nblks = arena_bytes ? 1 : 0;

    if (b->n == 1) {
        /* A group of one shares nothing: its "segment" is private memory of this process, not a
         * file in /dev/shm, so neither /dev/shm's size nor the file-size limit (ulimit -f)
         * binds it, and pages are taken only as the arena's buffers are written. */
        b->base = mmap(NULL, b->size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b->base == MAP_FAILED) {
            b->base = NULL;
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot map %zu MiB for the shm backend: %s",
                          b->size >> 20, strerror(errno));
            goto out_free;
        }
    } else if (b->me == 0) {
        char tag[9];
        if ((st = ddp__random_hex(tag, 4, err)))
            goto out_free;
        ddp__fmt(b->name, sizeof b->name, "/ddp-%.40s-%d-%s", m->run_id, (int)getpid(), tag);
        for (char *c = b->name + 1; *c; c++) /* a run id with '/' (torchrun's is free text) */
            if (*c == '/')
                *c = '_';
        b->fd = shm_open(b->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (b->fd < 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot create shared memory '%s': %s", b->name,
                          strerror(errno));
            goto out_free;
        }
        if (ftruncate(b->fd, (off_t)b->size) != 0) {
            int e = errno; /* EFBIG: a file-size limit (ulimit -f) binds /dev/shm's files too */
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot size shared memory '%s' to %zu MiB: %s; %s",
                          b->name, b->size >> 20, strerror(e),
                          e == EFBIG ? "the file-size limit (ulimit -f) is below it: raise it, or "
                                       "use the tcp backend"
                                     : "/dev/shm may be too small: lower arena_bytes or grow "
                                       "/dev/shm");
            goto out_unlink;
        }
        /* Control and staging pages now, so running out of /dev/shm is an error, not SIGBUS. */
        int rc = posix_fallocate(b->fd, 0, (off_t)(hdr + slots + stage));
        if (rc != 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM,
                          "cannot reserve %zu MiB of shared memory: %s; /dev/shm is too small",
                          (hdr + slots + stage) >> 20, strerror(rc));
            goto out_unlink;
        }
    }
    if (b->me == 0) {
        if (b->n > 1) {
            b->base = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
            if (b->base == MAP_FAILED) {
                b->base = NULL;
                st = ddp__err(err, DDP_ERR_SYSTEM, "cannot map shared memory: %s", strerror(errno));
                goto out_unlink;
            }
        }
        b->hdr = (shm_header *)b->base;
        b->hdr->magic = SHM_MAGIC;
        b->hdr->n = (uint32_t)b->n;
        b->hdr->staging_off = hdr + slots;
        b->hdr->arena_off = hdr + slots + stage;
        b->hdr->arena_bytes = arena_bytes;
        b->hdr->total = b->size;
        ddp__shm_algo_prepare(b, s, &mach);
        if (b->n > 1 && (st = ddp__setup_bcast(s, "shm_name", b->name, sizeof b->name, err)))
            goto out_unlink;
    } else {
        if ((st = ddp__setup_bcast(s, "shm_name", b->name, sizeof b->name, err)))
            goto out_free;
        b->name[sizeof b->name - 1] = '\0';
        b->fd = shm_open(b->name, O_RDWR | O_CLOEXEC, 0600);
        if (b->fd < 0) {
            st = ddp__err(err, DDP_ERR_SYSTEM,
                          "cannot open shared memory '%s' made by rank %d: %s; are all ranks of "
                          "this host in the same container / IPC namespace?",
                          b->name, m->ranks[0], strerror(errno));
            goto out_free;
        }
        struct stat sb;
        if (fstat(b->fd, &sb) != 0 || (size_t)sb.st_size != b->size) {
            st = ddp__err(err, DDP_ERR_INVALID,
                          "shared memory '%s' has %lld bytes, expected %zu: ranks disagree on "
                          "arena_bytes or the world",
                          b->name, (long long)sb.st_size, b->size);
            goto out_free;
        }
        b->base = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
        if (b->base == MAP_FAILED) {
            b->base = NULL;
            st = ddp__err(err, DDP_ERR_SYSTEM, "cannot map shared memory: %s", strerror(errno));
            goto out_free;
        }
        b->hdr = (shm_header *)b->base;
        if (b->hdr->magic != SHM_MAGIC || b->hdr->n != (uint32_t)b->n) {
            st = ddp__err(err, DDP_ERR_INVALID, "shared memory '%s' is not this group's", b->name);
            goto out_free;
        }
    }
    b->slots = (shm_slot *)slot_base(b);
    b->hdr->pids[b->me] = (int32_t)getpid();
    b->slots[b->me].will_probe = b->can_flush;
    /* The variant probe, if member 0 asked for it, runs in a buffer of each member's arena:
     * reserved now, so that a full /dev/shm only skips the probe (everywhere: each member posts
     * whether it has its buffer, and all read every post after the barrier). */
    int top = b->hdr->algo_probe ? ddp__shm_probe_top_band(b->hdr->arena_bytes) : -1;
    float *probe_buf = top >= 0 ? shm_alloc(b, ddp__shm_band_size(top)) : NULL;
    b->slots[b->me].algo_ready = probe_buf != NULL;

    /* Everyone has mapped it (and written its pid) once this barrier passes. */
    if ((st = ddp__setup_barrier(s, "shm_attached", err)))
        goto out_unlink;
    if (b->me == 0 && b->name[0])
        shm_unlink(b->name); /* from now on a crash leaves nothing in /dev/shm */
    /* Probes run only if every member takes part (each decided from its own environment and
     * cores), so that all of them probe at the same barriers. */
    for (int j = 0; j < b->n; j++)
        b->can_flush = b->can_flush && b->slots[j].will_probe;
    for (int j = 0; j < b->n; j++)
        if (j != b->me)
            b->pidfds[j] = (int)syscall(SYS_pidfd_open, b->hdr->pids[j], 0);
    bool probe = top >= 0;
    for (int j = 0; j < b->n; j++)
        probe = probe && b->slots[j].algo_ready;
    /* Member 0's starting choice, for everyone: the probe's pipelined trials need its block. */
    memcpy(b->choice.band, b->hdr->algo_band, sizeof b->choice.band);
    b->choice.block = b->hdr->algo_block;
    if (probe) {
        ddp__shm_probe timings;
        st = ddp__shm_probe_variants(b, &mach, probe_buf, top, s->timeout_ms, &timings);
        if (st) {
            ddp__err(err, st, "%s (while timing the allreduce's variants)", b->fail.msg);
            goto out_free;
        }
        /* Saved only when every band up to 16 MiB was timed twice or more: a group with a small
         * arena or a loaded machine decides for itself but does not speak for the next one. */
        if (b->me == 0 && ddp__shm_probe_top_band(ALGO_PROBE_MAX) == top &&
            timings.reps[top] >= 2) {
            char ckey[512];
            ddp__shm_cache_key(&mach, ckey, sizeof ckey);
            (void)ddp__shm_cache_save(s->cache_dir, ckey, &b->choice);
        }
    }
    if (probe_buf) {
        /* Give the pages back to /dev/shm: the arena reserves its pages as they are allocated. */
        (void)fallocate(b->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)((char *)probe_buf - b->base),
                        (off_t)ALIGN_UP(ddp__shm_band_size(top), 4096));
        shm_free(b, probe_buf);
    }
    *out = b;
    *ops = &shm_ops;
    return DDP_OK;

out_unlink:
    if (b->me == 0 && b->name[0])
        shm_unlink(b->name);
out_free:
    shm_destroy(b);
    return st;
}

static bool shm_usable(const ddp__setup *s, char *why, size_t cap)
{
    if (s->nhosts <= 1)
        return true;
    ddp__fmt(why, cap,
             "needs every rank on one host, but ranks run on '%s' and others; use backend 'auto' "
             "or 'tcp'",
             s->hosts[0]);
    return false;
}

const ddp__backend ddp__shm_backend = {
    .name = "shm",
    .usable = shm_usable,
    .create = shm_create,
    .boot = DDP__BOOT_ANY, /* set-up through ddp__setup_bcast/barrier: the store or MPI */
};
