/*
 * reducer_int.h — inside the reducer (include/ddp/reducer.h): the handle, its buckets, and the
 * functions its files share. Private to src/ddp.
 *
 * Layout: parameters are taken in reverse registration order and packed into buckets (a new
 * bucket when the cap is reached or the dtype changes). Each bucket is one allocation from the
 * group's arena (shared memory under shm, so the allreduce reads and writes it in place), or
 * ordinary memory when the arena is full. A parameter's gradient is a view at its offset.
 * Launch order: bucket k starts only after buckets 0..k−1 have started, whatever order the
 * model marks gradients in, so every rank issues the same sequence of collectives.
 * Rebuild (ddp__reducer_rebuild()): once, at the start of the second synced step, the buckets are
 * cut again along the first synced step's ready order (rank 0's); the old buckets' memory stays
 * the gradients' home (r->home) and new buckets either view a range of it or stage a copy.
 * Compression: a float32 bucket can travel as bfloat16 (one rounding, sums in float32 inside
 * the backend); the conversion is done on the caller's thread at launch and after the wait.
 * Sharding (ZeRO-1): a bucket is padded to W equal blocks of whole cache lines and reduced with
 * an in-place reduce_scatter, so rank r receives the mean of block r only. The parameters then
 * live in a twin of the bucket (same layout, also in the arena), so that after the optimizer has
 * stepped block r, one in-place allgather completes them with no copy in or out. Optimizer state
 * stays in the caller's arrays: gather_state copies block r of them into the gradient bucket,
 * allgathers it and copies the rest out, which spends the gradients until zero_grad.
 * Sharded gradients (ZeRO-2, pool.c): the buckets have no memory of their own; a bucket takes a
 * slot of one pool at its first acquire or its launch and gives it back once its block has landed
 * in its persistent shard (sgrad); r->grad[] is unused (NULL).
 * Device memory (a GPU group: nccl or cuda-staged): the parameters are device memory, and so are
 * the buckets (ddp_group_alloc on every rank, no host fallback). The host never touches them: the
 * zeroing, the bf16 conversions and the sums of squares go through the group's device operations
 * (group/devops.h) on the group's stream, so they keep their order with the model's kernels and
 * the collectives; copies through ddp_group_memcpy after the stream's work is done. The reducer's
 * own small collectives on host data (the checks across ranks, allocation flags, the norm's sum)
 * are staged through a scratch buffer in device memory, as a GPU group takes nothing else.
 *
 * Where the code lives:
 *   reducer.c  the handle's life and the step: create, mark_ready, launch, finish, zero_grad
 *   checks.c   what is checked before a reducer exists: the arguments, then across ranks the
 *              parameters, buffers and options
 *   buckets.c  the layout: cutting parameters into buckets, their memory, the gradients' views
 *   device.c   buckets in device memory: the group's stream, device failures, allocation
 *   rebuild.c  the one rebuild along the first synced step's ready order, and its staging copies
 *   shard.c    the sharded optimizer step: which elements a rank holds, gathering them back
 *   grads.c    reading and scaling the reduced gradients: grad_norm and unscale
 *   join.c     uneven inputs (torch's join): the count of ranks still training at each synced
 *              step, and the joined rank's shadow steps
 *   pool.c     sharded gradients (ZeRO-2): the pool of bucket buffers, acquire, the shards
 */
#ifndef DDP_REDUCER_INT_H
#define DDP_REDUCER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/reducer.h"
#include "group/devops.h"
#include "util/util.h"

typedef struct ddp__bucket {
    ddp_dtype dtype;
    size_t count;  /* elements */
    size_t padded; /* elements allocated: count, or W blocks of `block` when sharding */
    size_t block;  /* sharding: elements per rank */
    void *mem;     /* (padded,) gradients */
    bool arena;    /* mem came from ddp_group_alloc */
    void *pmem;    /* sharding: (padded,) the parameters' values, else NULL */
    bool pmem_arena;
    uint16_t *wire; /* (padded,) bf16 copy when compressing, else NULL */
    bool wire_arena;
    bool owns_mem;      /* mem is this bucket's allocation (else a view into a home region) */
    bool staged;        /* rebuilt: mem is a staging copy; gradients are gathered into it at
                           launch and scattered back to their home after the reduction */
    size_t first, last; /* params covered, as indices into order[] */
    int pending;        /* params not yet marked ready this step */
    bool launched;
    bool inline_done; /* reduced on the caller's thread this step */
    ddp_work *work;
    /* Sharded gradients (ZeRO-2, pool.c): mem is a pool buffer while has_buf (the bucket is being
     * filled, or in flight when work is set), else NULL; sgrad holds this rank's block of the
     * mean, accumulated over the step's reductions (sfresh: nothing landed since zero_grad). */
    bool has_buf;
    size_t slot;  /* while has_buf: the pool slot it holds */
    uint64_t seq; /* launch counter when it went in flight: the oldest is waited for first */
    void *sgrad;  /* (block,) private memory */
    bool sfresh;
} ddp__bucket;

/* Where gradients live after a rebuild: the creation-time buckets' memory, kept so that every
 * pointer ddp_reducer_grad() returned stays valid (the reducer's contract). */
typedef struct ddp__home_mem {
    void *mem;
    bool arena;
    size_t bytes;
} ddp__home_mem;

/* Bucket rebuilding (torch's _rebuild_buckets): record the first synced step's ready order,
 * rebuild at the start of the next synced step, then never again. */
enum { DDP__REBUILD_RECORD, DDP__REBUILD_PENDING, DDP__REBUILD_DONE };

struct ddp_reducer {
    ddp_group *g;            /* NULL once the group was destroyed first (ddp__reducer_gone) */
    ddp__group_dep dep;      /* registered with g: its destroy releases what r holds of it */
    const ddp_param *params; /* r's copy of the caller's list (names too; data is the caller's) */
    size_t nparams;
    const ddp_param *buffers; /* the same */
    size_t nbuffers;
    ddp_reducer_opts o;
    size_t *order;     /* params in bucket order (reverse registration; after a rebuild the
                          ready order of the first synced step, rank 0's) */
    size_t *bucket_of; /* param i → bucket */
    size_t *off;       /* param i → its first element in its bucket */
    void **grad;       /* param i → its gradient view */
    void **pdata;      /* param i → its values */
    bool *ready;       /* param i marked this step */
    ddp__bucket *b;
    size_t nb;
    int rebuild;  /* DDP__REBUILD_*: where this reducer is in its one rebuild */
    size_t *seen; /* (nparams,) the first synced step's mark_ready order */
    size_t nseen;
    bool record_marked;  /* that step marked something here (not a rank that had joined) */
    ddp__home_mem *home; /* after a rebuild: the gradients' memory (the old buckets'), else NULL */
    size_t nhome;
    size_t next_launch; /* first bucket not launched */
    bool async;         /* buckets go to the progress thread (else inline, blocking) */
    bool step_open;     /* some gradient was marked ready since the last finish */
    bool sync;
    bool shard;  /* sharded optimizer step, and more than one rank */
    bool sgrads; /* sharded gradients (ZeRO-2: shard_gradients, and more than one rank) */
    char *pool;  /* sgrads: the pool the buckets' buffers are cut from (pool_bytes) */
    bool pool_arena;
    size_t pool_bytes;
    size_t nslots;     /* the pool's slots: slot 0 of the largest bucket's size, the others of
                          the second largest's, one after the other */
    size_t *slot_off;  /* (nb,) where each slot starts in the pool */
    size_t *slot_size; /* (nb,) its bytes */
    bool *slot_busy;   /* (nb,) held by a bucket */
    uint64_t launches; /* sgrads: buckets launched so far (ddp__bucket.seq) */
    bool micro_closed; /* sgrads: a no_sync micro-step closed itself when its last bucket
                          launched; finish waits for what is in flight without a new step */
    bool consumed;     /* sharded: finish() left the mean in my shard only; zero_grad before the
                          next backward */
    bool awaiting;     /* sharded: finish() reduced, gather_params() has not run yet */
    int W, me;
    double step_start;
    const ddp__devops *dev; /* a GPU group's device operations (buckets in device memory); else
                               NULL */
    ddp_status dev_st;      /* a device operation failed where nothing could return it
                               (zero_grad): later calls return it */
    ddp_reducer_stats stats;
    /* Uneven inputs (join.c). */
    bool join_on; /* ddp_reducer_set_join: each synced step counts the ranks training */
    ddp_join_opts jo;
    bool joined;         /* this rank is out of inputs (ddp_reducer_join) */
    bool join_all;       /* this step's count was 0: every rank has joined, nothing to reduce */
    int join_div;        /* > 0: this step sums, then divides by the ranks training (not W) */
    int64_t join_steps;  /* synced steps of this epoch: since set_join, the last step every
                            rank joined, or the last throw_on_early_termination */
    ddp_status join_err; /* the count failed the step (throw_on_early_termination): mark_ready and
                            finish return it without communicating until the step ends (finish
                            or zero_grad); its message stays in err */
    ddp_status step_err; /* a reduction started at mark_ready failed: the step's later
                            mark_ready return it without communicating, and its finish
                            ends the step with it (then clears it) */
    char step_msg[DDP_ERRMSG_MAX]; /* step_err's message, given again with it */
    char err[DDP_ERRMSG_MAX];
};

/* Whether a bucket of dtype t travels as bfloat16 (opts.compress_bf16 on a float32 bucket). */
static inline bool ddp__reducer_wants_wire(const ddp_reducer *r, ddp_dtype t)
{
    return r->o.compress_bf16 && t == DDP_FLOAT32;
}

/* --- reducer.c --- */

/* A collective on small host arrays (the reducer's own checks and flags): allgather when gather,
 * else allreduce with op; on a GPU group through its device scratch (group/devops.h). A failure
 * leaves its message in r->err. */
ddp_status ddp__reducer_ctl(ddp_reducer *r, bool gather, const void *send, void *recv, size_t count,
                            ddp_dtype t, ddp_op op);
/* DDP_ERR_CLOSED, with the message the group's destroy left in r->err, when the group was
 * destroyed before the reducer; else DDP_OK. Every call that would reach the group checks it. */
ddp_status ddp__reducer_gone(const ddp_reducer *r);
/* Puts a context (formatted from fmt) before the message in r->err, as "context: message", and
 * returns st. */
ddp_status ddp__reducer_errctx(ddp_reducer *r, ddp_status st, const char *fmt, ...)
    DDP_PRINTF(3, 4);

/* --- checks.c --- */

/* The arguments of ddp_reducer_create on this rank (g and the lists present; dev: the group's
 * device operations, NULL for a CPU group): every parameter and buffer named, with data and a
 * dtype it can take, names unique, memory where the group's collectives take it; opts.overlap a
 * value of its enum. */
ddp_status ddp__reducer_check_args(ddp_group *g, const ddp__devops *dev, const ddp_param *params,
                                   size_t nparams, const ddp_param *buffers, size_t nbuffers,
                                   const ddp_reducer_opts *opts, ddp_error *err);
/* That every rank registered the same parameters and buffers and chose the same options (r->o,
 * the defaults resolved); names the first difference. Every rank must call it. */
ddp_status ddp__reducer_check_ranks(ddp_reducer *r, ddp_error *err);
/* This rank refused its own arguments to ddp_reducer_create: takes part in the first check of
 * check_ranks (the parameter counts) with a mark that makes every other rank fail there, naming
 * this rank, so that the group's collectives stay matched. */
void ddp__reducer_refuse_on_peers(ddp_group *g);

/* --- buckets.c --- */

/* Cuts order[] (parameter indices) into buckets b[] (zeroed, nparams of them): a new bucket when
 * the cap is reached (first_bucket for the first) or the dtype changes; bucket_of[] filled.
 * Returns the number of buckets. */
size_t ddp__reducer_partition(const ddp_reducer *r, const size_t *order, ddp__bucket *b,
                              size_t *bucket_of);
/* One buffer of a bucket: from the arena when every rank got arena memory for it, else from
 * malloc on every rank (shm runs a different protocol for each, so the ranks must agree). */
void *ddp__reducer_buffer(ddp_reducer *r, size_t bytes, bool *arena);
/* A zeroed buffer of bytes from malloc (64-byte aligned), or NULL. */
void *ddp__reducer_private_buffer(size_t bytes);
/* One buffer after the ranks' allocation flags (everywhere: every rank has it in the arena): an
 * arena buffer that a peer lacks is given back, and a missing one taken from malloc. Returns
 * whether *p holds memory. */
bool ddp__reducer_settle(ddp_reducer *r, void **p, bool *arena, bool everywhere, size_t bytes);
/* Frees p, from the arena or from malloc. */
void ddp__reducer_release(ddp_reducer *r, void *p, bool arena);
/* Frees what bucket b holds: its work, its memory if it owns it, its wire and parameter copies. */
void ddp__reducer_free_bucket(ddp_reducer *r, ddp__bucket *b);
/* Creation's layout: buckets in reverse registration order, their memory (agreed with the other
 * ranks), each parameter's gradient view and, sharded, its values' place. Every rank must call
 * it. */
ddp_status ddp__reducer_lay_out(ddp_reducer *r, ddp_error *err);

/* --- device.c --- */

/* The group's stream and the deadline of a device wait starting now (deadline_ms may be NULL). */
void *ddp__reducer_dev_stream(const ddp_reducer *r, int64_t *deadline_ms);
/* A device operation's failure: recorded in r->err as "what on the GPU: msg", and kept
 * (r->dev_st). */
ddp_status ddp__reducer_dev_fail(ddp_reducer *r, ddp_status st, const char *what, const char *msg);
/* The host waits until the work queued on the group's stream is done (before copies that the
 * stream's kernels may still be writing, e.g. the optimizer's). A no-op on the CPU. */
ddp_status ddp__reducer_dev_quiesce(ddp_reducer *r, const char *what);
/* The end of allocating the buckets for a GPU group, given every rank's allocation flags (MIN
 * over ranks; freed here): every buffer wanted must be device memory on every rank, else creation
 * fails on all of them; the gradients and the sharded parameters' copy start at zero. */
ddp_status ddp__reducer_dev_buckets(ddp_reducer *r, int32_t *flags, ddp_error *err);

/* --- rebuild.c --- */

/* A staged bucket's gradients from their homes into its staging copy (to_stage), or the
 * reduced mean back (CPU only: staging is not used on a GPU group). */
void ddp__reducer_stage(ddp_reducer *r, ddp__bucket *b, bool to_stage);
/* The end of the recorded step (ok: it succeeded): the record is completed and the rebuild made
 * pending; a failed step cancels it. A no-op unless recording. */
void ddp__reducer_record_end(ddp_reducer *r, bool ok);
/* The pending rebuild, at the start of the second synced step; every rank must call it. Not
 * rebuilding (memory short somewhere, inline somewhere) is DDP_OK; a failure leaves its message
 * in r->err. */
ddp_status ddp__reducer_rebuild(ddp_reducer *r);

/* ddp_reducer_finish without its refusal on a joined rank: join's shadow step (reducer.c). */
ddp_status ddp__reducer_finish_step(ddp_reducer *r);

/* --- join.c --- */

/* A synced step opens with uneven inputs on: counts the ranks still training (one allreduce) and
 * sets r->join_all, r->join_div and the step's stats.joined; with throw_on_early_termination and
 * a rank out of inputs, fails naming it (every rank fails the same way). A no-op when off. */
ddp_status ddp__reducer_join_count(ddp_reducer *r);
/* After a step that summed (r->join_div > 0): this rank's mean divided by the ranks that
 * trained (device buckets: on the GPU, with the host's rounding, waited for). */
ddp_status ddp__reducer_join_divide(ddp_reducer *r);

/* --- pool.c (sharded gradients, ZeRO-2) --- */

/* Bytes of bucket b's pool buffer (whole cache lines). */
size_t ddp__reducer_pool_need(const ddp__bucket *b);
/* The pool's size after the layout (opts.grad_pool or the default); DDP_ERR_INVALID in err when
 * a bucket cannot fit. */
ddp_status ddp__reducer_pool_size(ddp_reducer *r, ddp_error *err);
/* Bucket b gets a zeroed pool buffer (waiting, if need be, for the oldest bucket in flight to
 * land); its earlier instance still in flight lands first. A failure leaves its message in
 * r->err. */
ddp_status ddp__reducer_pool_take(ddp_reducer *r, ddp__bucket *b);
/* Bucket b's reduction is done (ok) or failed: its block lands in its shard (ok), and its
 * buffer goes back to the pool. */
void ddp__reducer_pool_land(ddp_reducer *r, ddp__bucket *b, bool ok);
/* Waits for bucket b in flight (its work), then lands it. */
ddp_status ddp__reducer_wait_bucket(ddp_reducer *r, ddp__bucket *b);
ddp_status ddp__reducer_pool_settle(ddp_reducer *r, ddp__bucket *b);
/* zero_grad: in-flight buckets waited for and dropped, buffers back, shards zeroed. */
void ddp__reducer_pool_zero(ddp_reducer *r);

/* --- shard.c --- */

/* The elements [*lo, *hi) of bucket b that hold this rank's mean after finish: all of them unless
 * sharded, else this rank's block clipped to the bucket's count. Returns whether there are any
 * (*hi > *lo). */
bool ddp__reducer_my_range(const ddp_reducer *r, const ddp__bucket *b, size_t *lo, size_t *hi);

#endif /* DDP_REDUCER_INT_H */
