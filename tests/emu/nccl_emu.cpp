/*
 * tests/emu/nccl_emu.cpp — NCCL under the emulated GPU module (include/nccl.h), so that
 * src/group/nccl/nccl.c, unchanged, runs on the CPU: one rank per process, on one host.
 *  - ncclGetUniqueId names a /dev/shm segment (random); the first rank of ncclCommInitRank*
 *    creates it, each writes its process id and device (PCI bus id) into its slot. Non-blocking
 *    (config.blocking = 0): ncclInProgress, and ncclCommGetAsyncError says ncclInProgress until
 *    every rank has arrived; then the name is unlinked (every rank has it mapped) and two ranks
 *    on one device fail with ncclInvalidUsage ("Duplicate GPU detected"), as NCCL's init does.
 *  - a collective is queued on its stream (gpu_rt_emu.cpp's emu_rt_enqueue_poll) and runs when
 *    something waits for it, as the other emulated work: in chunks of the rank's 1 MiB area of
 *    the segment, each rank writing its part, a barrier, each computing its output from every
 *    rank's part in rank order 0, 1, 2 … (so every rank's result is the same, bit for bit, run
 *    after run), a barrier. While a peer is missing it is not ready (cudaEventQuery says
 *    cudaErrorNotReady), as a kernel that spins: it completes, with no result, once the
 *    communicator is aborted or destroyed. A peer whose process died, or that aborted or
 *    destroyed its communicator, sets the asynchronous error ncclRemoteError (the collective
 *    stays unfinished, as NCCL's does, until the abort that error calls for). A collective that
 *    waits more than DDP_EMU_NCCL_HANG_S seconds (120) ends the process with a message: nothing
 *    hangs for ever.
 *  - reductions: sum, prod, min, max on each type; avg as NCCL does it: each input times 1/n,
 *    then the sum (floating point), the sum divided by n (integers); 16-bit floats rounded after
 *    every step. The fp8 types: ncclInvalidArgument.
 *  - buffers must be device memory (cudaMalloc'd): else ncclInvalidArgument, naming the buffer.
 *  - ncclCommAbort/Destroy unlink the segment's name too (a rank that left before the others
 *    arrived), so no test leaves one behind; the mapping goes with the last collective using it.
 *  - DDP_EMU_NCCL_INPROGRESS=1: on a non-blocking communicator a collective returns
 *    ncclInProgress and ncclCommGetAsyncError says so twice more (NCCL may, in a group); so
 *    does ncclCommFinalize (once) always.
 *  - DDP_EMU_NCCL_QUIET=1: a peer's death, abort or destroy is never reported (no
 *    ncclRemoteError: the collective waits until this rank's abort), as NCCL's transports
 *    within a node (NVLink, P2P, shared memory) behave.
 *  - the tests' faults: DDP_EMU_NCCL_STALL=R:N: rank R's Nth collective never runs, as a hung
 *    kernel, until the communicator is aborted; DDP_EMU_NCCL_FAIL=init: init fails
 *    (ncclSystemError). DDP_EMU_NCCL_TAG: a word in the segment's name, /ddpc-nccl-emu-TAG-…,
 *    so that a test can look for what it left behind.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <functional>
#include <linux/futex.h>
#include <memory>
#include <mutex>
#include <signal.h>
#include <string>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EMU_API extern "C" __attribute__((visibility("default")))

namespace
{

const uint64_t ID_MAGIC = 0x6e63636c656d7531ull;  /* the unique id's */
const uint64_t SEG_MAGIC = 0x6e63636c73656731ull; /* the segment's */
const size_t AREA = 1 << 20;                      /* each rank's data area */

struct Id {
    uint64_t magic;
    char name[64];
};
static_assert(sizeof(Id) <= NCCL_UNIQUE_ID_BYTES);

/* In the segment: the header, then a slot per rank, then an area per rank. */
struct Header {
    uint64_t magic;
    int32_t nranks; /* set by the first to arrive */
    uint32_t bell;  /* bumped (and woken) at every arrival: the futex waiters sleep on */
};
struct Slot {
    int32_t pid;  /* 0 until the rank arrived */
    int32_t left; /* 1: destroyed or aborted its communicator */
    int32_t device, busid;
    uint64_t step; /* barriers passed */
    char pad[40];
};

int64_t now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

template <typename T> T ld(const T *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T> void st(T *p, T v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

std::mutex global_m;
std::string global_last; /* ncclGetLastError(NULL) */

void set_global_last(const char *msg)
{
    std::lock_guard<std::mutex> l(global_m);
    global_last = msg;
}

struct State {
    std::string name;
    int n = 0, me = 0, device = 0;
    char *map = nullptr;
    size_t map_bytes = 0;
    std::atomic<bool> gone{false}; /* aborted or destroyed: collectives end with no result */
    std::atomic<bool> ready{false};
    std::atomic<int> pending{0}; /* collectives queued, not finished */
    bool blocking = true;
    bool issue_in_progress = false; /* DDP_EMU_NCCL_INPROGRESS=1 */
    bool quiet = false;             /* DDP_EMU_NCCL_QUIET=1: a dead peer is never reported */
    std::atomic<int> polls_left{0}; /* ncclInProgress answers still due (issue, finalize) */
    std::mutex mu;
    ncclResult_t err = ncclSuccess; /* the asynchronous error, under mu */
    char last[512] = "";            /* its message, under mu */
    uint64_t step = 0;              /* this rank's barriers (the stream's runner only) */
    uint64_t issued = 0;
    long stall_at = 0; /* DDP_EMU_NCCL_STALL for this rank: the collective that hangs */
    int64_t hang_ms = 120000;

    Header *hdr()
    {
        return (Header *)map;
    }
    Slot *slot(int r)
    {
        return (Slot *)(map + 64) + r;
    }
    char *area(int r)
    {
        return map + 64 + (size_t)n * sizeof(Slot) + (size_t)r * AREA;
    }
    ~State()
    {
        if (map)
            munmap(map, map_bytes);
    }
    /* The asynchronous error (the first one stays) and its message. */
    void fail(ncclResult_t r, const char *msg)
    {
        {
            std::lock_guard<std::mutex> l(mu);
            if (err == ncclSuccess || err == ncclInProgress) {
                err = r;
                snprintf(last, sizeof last, "%s", msg);
            }
        }
        set_global_last(msg);
    }
    ncclResult_t error()
    {
        std::lock_guard<std::mutex> l(mu);
        return err;
    }
    void ring()
    {
        __atomic_add_fetch(&hdr()->bell, 1u, __ATOMIC_ACQ_REL);
        syscall(SYS_futex, &hdr()->bell, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
    /* Sleeps until the bell rings or us_max passes. */
    void wait_bell(uint32_t seen, long us_max)
    {
        struct timespec ts = {0, us_max * 1000};
        syscall(SYS_futex, &hdr()->bell, FUTEX_WAIT, seen, &ts, nullptr, 0);
    }
    /* Whether every peer that arrived is still there; else why not, into why. */
    bool peers_alive(char *why, size_t cap)
    {
        if (quiet) /* NVLink, P2P and shared memory: the collective spins, nothing is reported */
            return true;
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            Slot *s = slot(q);
            int pid = ld(&s->pid);
            if (ld(&s->left)) {
                snprintf(why, cap,
                         "emulated NCCL: rank %d destroyed or aborted its communicator while "
                         "rank %d waited for it",
                         q, me);
                return false;
            }
            if (pid > 0 && !process_alive(pid)) {
                snprintf(why, cap,
                         "emulated NCCL: rank %d (process %d) died while rank %d waited for it", q,
                         pid, me);
                return false;
            }
        }
        return true;
    }
    /* Ends the process when a wait for the peers has lasted past hang_ms with no abort. */
    void check_hang(int64_t since)
    {
        if (since && now_ms() - since > hang_ms) {
            fprintf(stderr,
                    "nccl emulation: rank %d waited %lld s for its peers with no abort; ending "
                    "the process (DDP_EMU_NCCL_HANG_S)\n",
                    me, (long long)(hang_ms / 1000));
            abort();
        }
    }
    static bool process_alive(int pid)
    {
        if (kill(pid, 0) != 0 && errno == ESRCH)
            return false;
        char path[64], buf[256];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            return errno != ENOENT;
        ssize_t k = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (k <= 0)
            return true;
        buf[k] = '\0';
        const char *p = strrchr(buf, ')'); /* "pid (comm) S …" */
        return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
    }
    bool all_reached(uint64_t target)
    {
        for (int q = 0; q < n; q++)
            if (ld(&slot(q)->step) < target)
                return false;
        return true;
    }
    void leave()
    {
        gone = true;
        if (map)
            st(&slot(me)->left, 1);
        if (map)
            ring();
        shm_unlink(name.c_str()); /* ENOENT: already unlinked, at init */
    }
};

} // namespace

struct ncclComm {
    std::shared_ptr<State> s;
};

/* ---- element types and reductions */
namespace
{

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0; /* fp8 and bad values */
    }
}

float bf16_to_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t f_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (std::isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1); /* to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

template <typename T> T red(ncclRedOp_t op, T a, T b)
{
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return (T)(a + b); /* sum, avg */
    }
}

/* out[i] = in_0[i] ∘ in_1[i] ∘ … in rank order, in[q] = base(q) + i. T: the arithmetic type;
 * E: the stored one (16-bit floats: float arithmetic, rounded back after every step). */
template <typename E, typename T, typename Ld, typename St>
void reduce_as(void *out, const void *const *in, int n, size_t cnt, ncclRedOp_t op, bool is_float,
               Ld load, St store)
{
    const T scale = load(store((T)(1.0 / n))); /* NCCL's: 1/n in the element type */
    for (size_t i = 0; i < cnt; i++) {
        T acc = 0;
        for (int q = 0; q < n; q++) {
            T x = load(((const E *)in[q])[i]);
            if (op == ncclAvg && is_float)
                x = load(store((T)(x * scale)));
            acc = q == 0 ? x : load(store(red<T>(op, acc, x)));
        }
        if (op == ncclAvg && !is_float)
            acc = (T)(acc / (T)n);
        ((E *)out)[i] = store(acc);
    }
}
template <typename E>
void reduce_native(void *out, const void *const *in, int n, size_t cnt, ncclRedOp_t op,
                   bool is_float)
{
    reduce_as<E, E>(
        out, in, n, cnt, op, is_float, [](E x) { return x; }, [](E x) { return x; });
}

void reduce(ncclDataType_t t, void *out, const void *const *in, int n, size_t cnt, ncclRedOp_t op)
{
    switch (t) {
    case ncclInt8: reduce_native<int8_t>(out, in, n, cnt, op, false); break;
    case ncclUint8: reduce_native<uint8_t>(out, in, n, cnt, op, false); break;
    case ncclInt32: reduce_native<int32_t>(out, in, n, cnt, op, false); break;
    case ncclUint32: reduce_native<uint32_t>(out, in, n, cnt, op, false); break;
    case ncclInt64: reduce_native<int64_t>(out, in, n, cnt, op, false); break;
    case ncclUint64: reduce_native<uint64_t>(out, in, n, cnt, op, false); break;
    case ncclFloat32: reduce_native<float>(out, in, n, cnt, op, true); break;
    case ncclFloat64: reduce_native<double>(out, in, n, cnt, op, true); break;
    case ncclFloat16:
        reduce_as<_Float16, float>(
            out, in, n, cnt, op, true, [](_Float16 x) { return (float)x; },
            [](float x) { return (_Float16)x; });
        break;
    case ncclBfloat16:
        reduce_as<uint16_t, float>(out, in, n, cnt, op, true, bf16_to_f, f_to_bf16);
        break;
    default: break;
    }
}

enum Kind { ALLREDUCE, BROADCAST, ALLGATHER, REDUCE_SCATTER };

struct Coll {
    Kind kind;
    const char *send;
    char *recv;
    size_t count, esize;
    ncclDataType_t dt;
    ncclRedOp_t op;
    int root;
    size_t chunk; /* elements per chunk */
    size_t pos = 0, len = 0;
    int phase = 0;
    uint64_t target = 0;
    bool stalled = false;
    int64_t waiting_since = 0;
    int64_t next_look = 0; /* at the peers' processes: every 10 ms while waiting */
};

/* One try at the collective: false while it waits for a peer (run again later). */
bool step_coll(State &s, Coll &c)
{
    if (s.gone)
        return true; /* aborted: the kernel exits, the buffers hold no result */
    if (c.stalled || s.error() != ncclSuccess) { /* hung, or a peer is gone: until the abort */
        if (!c.waiting_since)
            c.waiting_since = now_ms();
        s.check_hang(c.waiting_since);
        return false;
    }
    const int n = s.n, me = s.me;
    const int64_t until = now_ms() + 2;
    for (;;) {
        if (c.phase == 0) { /* this rank's part of [pos, pos + len) */
            if (c.pos >= c.count)
                return true;
            c.len = c.count - c.pos < c.chunk ? c.count - c.pos : c.chunk;
            const size_t e = c.esize, at = c.pos * e, bytes = c.len * e;
            char *mine = s.area(me);
            if (c.kind == REDUCE_SCATTER) {
                for (int b = 0; b < n; b++)
                    memcpy(mine + (size_t)b * bytes, c.send + (size_t)b * c.count * e + at, bytes);
            } else if (c.kind != BROADCAST || me == c.root) {
                memcpy(mine, c.send + at, bytes);
            }
            c.target = ++s.step;
            st(&s.slot(me)->step, s.step);
            s.ring();
            c.phase = 1;
        }
        uint32_t bell = ld(&s.hdr()->bell);
        if (s.all_reached(c.target)) {
            c.waiting_since = 0;
            if (c.phase == 1) { /* every part there: this rank's output, in rank order */
                const size_t e = c.esize, at = c.pos * e, bytes = c.len * e;
                const void *parts[64];
                for (int q = 0; q < n; q++)
                    parts[q] = s.area(q) + (c.kind == REDUCE_SCATTER ? (size_t)me * bytes : 0);
                switch (c.kind) {
                case ALLREDUCE: reduce(c.dt, c.recv + at, parts, n, c.len, c.op); break;
                case BROADCAST: memcpy(c.recv + at, s.area(c.root), bytes); break;
                case ALLGATHER:
                    for (int q = 0; q < n; q++)
                        memcpy(c.recv + (size_t)q * c.count * e + at, s.area(q), bytes);
                    break;
                case REDUCE_SCATTER: reduce(c.dt, c.recv + at, parts, n, c.len, c.op); break;
                }
                c.target = ++s.step; /* done reading the areas: they may be written again */
                st(&s.slot(me)->step, s.step);
                s.ring();
                c.phase = 2;
            } else {
                c.pos += c.len;
                c.phase = 0;
            }
            continue;
        }
        /* A peer missing: dead or gone (looked at again after the steps, which a peer that
         * finished and left had published first), or late. */
        const int64_t t = now_ms();
        char why[256];
        if (t >= c.next_look && !s.peers_alive(why, sizeof why)) {
            if (s.all_reached(c.target))
                continue; /* it had arrived after all */
            s.fail(ncclRemoteError, why);
            return false;
        }
        if (t >= c.next_look)
            c.next_look = t + 10;
        if (!c.waiting_since)
            c.waiting_since = t;
        s.check_hang(c.waiting_since);
        if (t >= until)
            return false;
        s.wait_bell(bell, 200);
    }
}

ncclResult_t bad(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t bad(ncclResult_t r, const char *fmt, ...)
{
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    set_global_last(b);
    return r;
}

ncclResult_t enqueue(Kind kind, const void *send, void *recv, size_t count, ncclDataType_t dt,
                     ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
                     const char *call)
{
    if (!comm)
        return bad(ncclInvalidArgument, "%s: comm is NULL", call);
    State &s = *comm->s;
    if (!s.ready)
        return bad(ncclInvalidUsage, "%s: the communicator is not initialized yet", call);
    size_t e = type_size(dt);
    if (!e)
        return bad(ncclInvalidArgument, "%s: invalid or unsupported datatype %d", call, (int)dt);
    if ((kind == ALLREDUCE || kind == REDUCE_SCATTER) && (op < ncclSum || op > ncclAvg))
        return bad(ncclInvalidArgument, "%s: invalid reduction operation %d", call, (int)op);
    if (kind == BROADCAST && (root < 0 || root >= s.n))
        return bad(ncclInvalidArgument, "%s: invalid root %d (nranks %d)", call, root, s.n);
    if (count == 0)
        return ncclSuccess;
    const size_t in = count * e * (kind == REDUCE_SCATTER ? (size_t)s.n : 1);
    const size_t out = count * e * (kind == ALLGATHER ? (size_t)s.n : 1);
    const bool reads = kind != BROADCAST || s.me == root;
    if (reads && !emu_rt_is_device(send, in))
        return bad(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not device memory", call,
                   send, in);
    if (!emu_rt_is_device(recv, out))
        return bad(ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not device memory", call,
                   recv, out);
    auto c = std::make_shared<Coll>();
    c->kind = kind;
    c->send = (const char *)send;
    c->recv = (char *)recv;
    c->count = count;
    c->esize = e;
    c->dt = dt;
    c->op = op;
    c->root = root;
    c->chunk = AREA / e / (kind == REDUCE_SCATTER ? (size_t)s.n : 1);
    c->stalled = ++s.issued == (uint64_t)s.stall_at;
    ncclResult_t r_issue = ncclSuccess;
    std::shared_ptr<State> sp = comm->s;
    sp->pending++;
    if (s.issue_in_progress && !s.blocking) { /* as NCCL may: settled by polling */
        s.polls_left = 2;
        r_issue = ncclInProgress;
    }
    emu_rt_enqueue_poll(stream, [sp, c] {
        if (!step_coll(*sp, *c))
            return false;
        sp->pending--;
        return true;
    });
    return r_issue;
}

/* Init's progress: everyone arrived (then the duplicate-device check), someone died, or not yet. */
ncclResult_t init_progress(State &s)
{
    if (s.ready)
        return ncclSuccess;
    for (int q = 0; q < s.n; q++)
        if (!ld(&s.slot(q)->pid)) {
            char why[256];
            if (!s.peers_alive(why, sizeof why)) {
                s.fail(ncclRemoteError, why);
                return ncclRemoteError;
            }
            return ncclInProgress;
        }
    shm_unlink(s.name.c_str()); /* every rank has it mapped: the name is no longer needed */
    for (int a = 0; a < s.n; a++)
        for (int b = a + 1; b < s.n; b++)
            if (s.slot(a)->busid == s.slot(b)->busid) {
                char why[128];
                snprintf(why, sizeof why,
                         "Duplicate GPU detected : rank %d and rank %d both on CUDA device %x", a,
                         b, (unsigned)s.slot(a)->busid);
                s.fail(ncclInvalidUsage, why);
                return ncclInvalidUsage;
            }
    s.ready = true;
    return ncclSuccess;
}

} // namespace

EMU_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return bad(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uid)
{
    if (!uid)
        return bad(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    uint64_t r[2] = {0, 0};
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return bad(ncclSystemError, "ncclGetUniqueId: getrandom: %s", strerror(errno));
    Id id = {};
    id.magic = ID_MAGIC;
    const char *tag = getenv("DDP_EMU_NCCL_TAG");
    snprintf(id.name, sizeof id.name, "/ddpc-nccl-emu-%.16s-%d-%016llx",
             tag && *tag && !strchr(tag, '/') ? tag : "x", (int)getpid(), (unsigned long long)r[0]);
    memset(uid, 0, sizeof *uid);
    memcpy(uid->internal, &id, sizeof id);
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    if (!comm || !async)
        return bad(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    State &s = *comm->s;
    ncclResult_t e = s.error();
    if (e == ncclSuccess && !s.ready)
        e = init_progress(s);
    if (e == ncclSuccess && s.polls_left > 0 && s.polls_left-- > 0)
        e = ncclInProgress;
    *async = e;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId uid,
                                            int rank, ncclConfig_t *config)
{
    if (!comm)
        return bad(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = nullptr;
    Id id;
    memcpy(&id, uid.internal, sizeof id);
    if (id.magic != ID_MAGIC || !memchr(id.name, 0, sizeof id.name))
        return bad(ncclInvalidArgument, "ncclCommInitRankConfig: not an ncclUniqueId");
    if (nranks < 1 || nranks > 64 || rank < 0 || rank >= nranks)
        return bad(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d ranks", rank,
                   nranks);
    if (config && (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t)))
        return bad(ncclInvalidArgument,
                   "ncclCommInitRankConfig: config not set from NCCL_CONFIG_INITIALIZER");
    const char *f = getenv("DDP_EMU_NCCL_FAIL");
    if (f && !strcmp(f, "init"))
        return bad(ncclSystemError, "emulated NCCL: init refused (DDP_EMU_NCCL_FAIL=init)");
    const bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking;
    int dev = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        return bad(ncclUnhandledCudaError, "ncclCommInitRankConfig: no current device");
    auto s = std::make_shared<State>();
    s->name = id.name;
    s->n = nranks;
    s->me = rank;
    s->device = dev;
    s->blocking = blocking;
    const char *ip = getenv("DDP_EMU_NCCL_INPROGRESS");
    s->issue_in_progress = ip && !strcmp(ip, "1");
    const char *q = getenv("DDP_EMU_NCCL_QUIET");
    s->quiet = q && !strcmp(q, "1");
    const char *h = getenv("DDP_EMU_NCCL_HANG_S");
    if (h && atoi(h) > 0)
        s->hang_ms = (int64_t)atoi(h) * 1000;
    const char *stall = getenv("DDP_EMU_NCCL_STALL");
    int sr = -1;
    long sn = 0;
    if (stall && sscanf(stall, "%d:%ld", &sr, &sn) == 2 && sr == rank)
        s->stall_at = sn;
    s->map_bytes = 64 + (size_t)nranks * (sizeof(Slot) + AREA);
    int fd = shm_open(id.name, O_CREAT | O_RDWR, 0600);
    if (fd < 0)
        return bad(ncclSystemError, "ncclCommInitRankConfig: shm_open %s: %s", id.name,
                   strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 ||
        ((size_t)sb.st_size < s->map_bytes && ftruncate(fd, (off_t)s->map_bytes) != 0)) {
        int e = errno;
        close(fd);
        shm_unlink(id.name);
        return bad(ncclSystemError, "ncclCommInitRankConfig: sizing %s: %s", id.name, strerror(e));
    }
    void *m = mmap(nullptr, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(id.name);
        return bad(ncclSystemError, "ncclCommInitRankConfig: mmap %s: %s", id.name,
                   strerror(errno));
    }
    s->map = (char *)m;
    Header *hd = s->hdr();
    int32_t zero = 0;
    __atomic_compare_exchange_n(&hd->nranks, &zero, nranks, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    if (ld(&hd->nranks) != nranks) {
        int other = ld(&hd->nranks);
        shm_unlink(id.name);
        return bad(ncclInvalidUsage, "ncclCommInitRankConfig: rank %d says %d ranks, another %d",
                   rank, nranks, other);
    }
    st(&hd->magic, SEG_MAGIC);
    Slot *me = s->slot(rank);
    int32_t none = 0;
    me->device = dev;
    me->busid = prop.pciBusID;
    if (!__atomic_compare_exchange_n(&me->pid, &none, (int32_t)getpid(), false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        return bad(ncclInvalidUsage, "ncclCommInitRankConfig: rank %d joined twice (process %d)",
                   rank, (int)none);
    }
    s->ring();
    *comm = new ncclComm{s};
    if (!blocking)
        return ncclInProgress;
    const int64_t since = now_ms();
    for (long us = 20;; us = us < 1000 ? us * 2 : us) { /* blocking: until every rank is there */
        ncclResult_t r = init_progress(*s);
        if (r == ncclInProgress)
            r = s->error() == ncclSuccess ? ncclInProgress : s->error();
        if (r != ncclInProgress)
            return r;
        s->check_hang(since);
        usleep((useconds_t)us);
    }
}

EMU_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, uid, rank, nullptr);
}

EMU_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return bad(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    /* Nothing to flush once every collective this rank issued has finished (nccl.c waits for
     * each); non-blocking, it says ncclInProgress first, as NCCL's does */
    if (comm->s->blocking)
        return comm->s->pending ? ncclInternalError : ncclSuccess;
    comm->s->polls_left = 1;
    return ncclInProgress;
}

EMU_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    comm->s->leave();
    delete comm;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    comm->s->leave(); /* a collective in flight ends at its next try (its stream holds the state) */
    delete comm;
    return ncclSuccess;
}

EMU_API const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

EMU_API const char *ncclGetLastError(ncclComm_t comm)
{
    static thread_local char buf[512];
    if (comm) {
        std::lock_guard<std::mutex> l(comm->s->mu);
        if (comm->s->last[0]) {
            snprintf(buf, sizeof buf, "%s", comm->s->last);
            return buf;
        }
    }
    std::lock_guard<std::mutex> l(global_m);
    snprintf(buf, sizeof buf, "%s", global_last.c_str());
    return buf;
}

EMU_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return bad(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->s->n;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return bad(ncclInvalidArgument, "ncclCommCuDevice: NULL argument");
    *device = comm->s->device;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return bad(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->s->me;
    return ncclSuccess;
}

EMU_API ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(ALLREDUCE, send, recv, count, dt, op, 0, comm, stream, "ncclAllReduce");
}

EMU_API ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                   int root, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(BROADCAST, send, recv, count, dt, ncclSum, root, comm, stream, "ncclBroadcast");
}

EMU_API ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                   ncclComm_t comm, cudaStream_t stream)
{
    return enqueue(ALLGATHER, send, recv, count, dt, ncclSum, 0, comm, stream, "ncclAllGather");
}

EMU_API ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count,
                                       ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream)
{
    return enqueue(REDUCE_SCATTER, send, recv, count, dt, op, 0, comm, stream, "ncclReduceScatter");
}

EMU_API ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

EMU_API ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}
