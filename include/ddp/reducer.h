/*
 * ddp/reducer.h — the DDP engine: gradients averaged over ranks, overlapped with backward.
 *
 * The C counterpart of wrapping a model in DistributedDataParallel:
 *
 *   ddp_param params[] = {{"fc1.weight", n1, DDP_FLOAT32, w1, DDP_DEVICE_CPU}, …}; // in order
 *   ddp_reducer_create(group, params, np, NULL, 0, NULL, &red, &err); // checks + broadcast
 *   float *g1 = ddp_reducer_grad(red, 0);            // gradient of params[0]: write here
 *   for each step:
 *       ddp_reducer_zero_grad(red);
 *       forward …; backward from the last layer down, and as a layer's gradients are done:
 *           ddp_reducer_mark_ready(red, i);          // may start that bucket's allreduce
 *       ddp_reducer_finish(red);                     // gradients are now the mean over ranks
 *       optimizer step (identical everywhere)
 *
 * Buckets: gradients are laid out in reverse registration order (the last layer's are ready
 * first) in buckets of at most bucket_cap bytes (the first one first_bucket bytes), in memory the
 * group reduces in place (the shared segment for shm): gradients are views into the buckets, so
 * DDP costs no extra copy and no extra gradient-sized memory. A bucket's allreduce starts, on the
 * group's progress thread, once all its gradients are marked ready and every earlier bucket has
 * started — so buckets are reduced in the same order on every rank — while backward continues.
 * Parameters of different dtypes go to different buckets. When the host has no core to spare
 * (ranks ≥ cores) buckets are instead reduced on the caller's thread as they complete
 * (opts.overlap), which measured faster there.
 *
 * Rebuilt buckets (opts.rebuild_buckets, default on; torch's _rebuild_buckets): reverse
 * registration is a guess. The first synced step records the order of mark_ready (parameters
 * never marked follow, in bucket order); at the start of the second synced step (its first
 * mark_ready, or finish when nothing is marked: no bucket is in flight) the buckets are cut again
 * along rank 0's order, gathered to every rank so that ranks that marked in other orders agree.
 * Once. Gradients do NOT move: every pointer from ddp_reducer_grad stays valid. A new bucket
 * whose parameters lie side by side in one old bucket is reduced there in place; any other has a
 * staging buffer, filled at launch and copied back after the reduction (2 × its bytes a step,
 * like torch's gradient_as_bucket_view=False). Skipped (the layout stays) where buckets are
 * reduced inline on any rank (nothing to gain there), with shard_optimizer (shards and optimizer
 * state are keyed by the layout) and on a GPU group. ddp_reducer_bucket_of says where a
 * parameter went.
 *
 * Sharded optimizer step (ZeRO stage 1; torch's ZeroRedundancyOptimizer, fused with DDP):
 * with opts.shard_optimizer each bucket is reduce-scattered instead of all-reduced, so after
 * finish() a rank holds the mean gradient only for its shard, 1/world of every bucket;
 * ddp_reducer_shard() says which elements of each parameter that is. The rank steps those
 * elements alone, and ddp_reducer_gather_params() copies every rank's updated shard to every
 * rank. The parameters then live in the reducer (shared memory under shm, laid out like the
 * buckets, so the gather moves each value once): from creation on, read and update parameter i
 * at ddp_reducer_param(r, i), not at params[i].data. Each rank does 1/world of the optimizer's work
 * and keeps 1/world of its state up to date; ddp_reducer_gather_state() completes state arrays
 * (e.g. before saving a checkpoint). On shm the results are bit for bit those of the unsharded
 * step (the same sums in the same order); over tcp with 3 or more ranks the ring groups the sums
 * differently, so the last bits may differ. One loop serves both modes:
 *
 *   ddp_reducer_finish(red);
 *   for each parameter i: ddp_reducer_shard(red, i, &lo, &hi); step elements [lo, hi)
 *   ddp_reducer_gather_params(red);                  // a no-op when not sharded
 *
 * After a sharded finish() the buckets hold the mean only in this rank's shard (the rest is this
 * rank's own gradient): call ddp_reducer_zero_grad() before the next backward. mark_ready and
 * finish refuse otherwise, as they do when a sharded step was not gathered.
 *
 * Sharded gradients (ZeRO stage 2; DeepSpeed's stage 2, torch FSDP's SHARD_GRAD_OP): with
 * opts.shard_gradients (and shard_optimizer; CPU groups only, for now) no rank keeps the whole
 * gradient. Each rank keeps its shard of each bucket, where the reduced mean accumulates, and
 * backward writes whole gradients into a bounded pool of bucket buffers (opts.grad_pool bytes;
 * default the largest bucket + 2 × the second largest): ddp_reducer_grad_acquire(r, i, &g) just
 * before parameter i's gradient is first written gives room in a pool buffer for its bucket
 * (zeroed); after the bucket's reduce_scatter its block is added into the shard and the buffer
 * goes back. A full pool waits for the oldest bucket in flight (the group's deadline); a pool
 * that cannot hold what is being filled at once fails acquire saying so. finish() leaves the mean
 * in the shard: ddp_reducer_shard_grad(r, i) is element lo of it (the optimizer steps it,
 * ddp_optim_step_range_grad); grad_norm and unscale read it; zero_grad clears it. ddp_model.h's
 * ddp_model_backward_pooled calls acquire for the model. Accumulation: with set_sync(false)
 * each micro-step still reduce-scatters and adds its mean into the shard (A reductions for A
 * micro-steps: the memory's price; the sum of means equals the mean of sums up to rounding); a
 * no_sync micro-step that marked everything ends by itself, one that did not needs finish. At
 * accumulation 1 on shm the results are ZeRO-1's bit for bit. Not with compress_bf16 or join. A
 * rank saves 4 bytes × N(W−1)/W of gradient, minus the pool (bench/zero_memory.sh).
 *
 * Accumulation: gradients accumulate (+=) like torch's; ddp_reducer_zero_grad() clears them.
 * With ddp_reducer_set_sync(red, false) (torch's no_sync) mark_ready and finish do not
 * communicate; the next synced step reduces the accumulated sum.
 *
 * Uneven inputs (torch's model.join(), the Join context manager): ranks may run out of data at
 * different steps. With ddp_reducer_set_join() on every rank, each synced step starts with one
 * small allreduce counting the ranks still training; a rank out of data calls
 * ddp_reducer_join() in a loop, which takes part in each of the others' synced steps with zero
 * gradients and leaves their mean in its own, so it can step its optimizer with them and stay
 * identical to the others, until every rank has joined:
 *
 *   ddp_reducer_set_join(red, NULL, true);           // every rank, before the loop
 *   while (next_batch(…)) { zero_grad; forward; backward + mark_ready; finish; step; }
 *   bool others;
 *   while (ddp_reducer_join(red, &others) == DDP_OK && others)
 *       step;                                         // the others' mean: the same update
 *
 * Collective calls (every rank makes them, in the same order, or the others fail in them, naming
 * this rank, at once if it left the group, else at the group's deadline): create, finish and
 * mark_ready (through the buckets they launch; not in a no_sync micro-step), gather_params,
 * gather_state*, grad_norm (when sharded), sync_buffers, set_join, join. Local: destroy,
 * zero_grad, set_sync, grad, param, shard, stats, the queries and last_error.
 *
 * Errors: every call that can fail returns a ddp_status and leaves a one-line message in
 * ddp_reducer_last_error (creation: in its ddp_error). A failure of the group (a dead or late
 * rank, a timeout, an abort) poisons it: every later collective returns that error again; destroy
 * the reducer, then the group.
 *
 * Threads: one thread at a time, like its group.
 */
#ifndef DDP_REDUCER_H
#define DDP_REDUCER_H

#include <stdbool.h>
#include <stddef.h>

#include "ddp/group.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A parameter or buffer: plain data. ddp_reducer_create copies the descriptors (names too), so
 * the array may be a local one that goes out of scope; data, the values, stays the caller's and
 * is borrowed for the reducer's whole life (with shard_optimizer the parameters move into the
 * reducer: ddp_reducer_param). device is last and DDP_DEVICE_CPU is 0, so an initialiser that
 * leaves it out means host memory (GCC's -Wextra warns about a positional one that does: name
 * it, as below). */
typedef struct ddp_param {
    const char *name;  /* unique among parameters and buffers (a repeat is DDP_ERR_INVALID);
                          checked against every rank's */
    size_t count;      /* elements */
    ddp_dtype dtype;   /* float32, float64, bfloat16 or float16 (buffers: any dtype) */
    void *data;        /* values, (count,): broadcast from rank 0 at creation; may be NULL
                          when count is 0 (an empty parameter or buffer) */
    ddp_device device; /* where data lives: DDP_DEVICE_CPU (0) for a CPU group; DDP_DEVICE_CUDA
                          for a GPU group (then the buckets are device memory too, and the
                          host never touches them: docs/ddp.md) */
} ddp_param;

/* How a complete bucket is reduced. */
typedef enum ddp_reducer_overlap {
    DDP_OVERLAP_AUTO,   /* ASYNC with more than one rank and ddp_group_core_to_spare(), else
                           INLINE */
    DDP_OVERLAP_ASYNC,  /* on the group's progress thread, while backward goes on */
    DDP_OVERLAP_INLINE, /* on the caller's thread at mark_ready: with no idle core a progress
                           thread only competes with backward (measured: bench/RESULTS.md) */
} ddp_reducer_overlap;

/* Start from DDP_REDUCER_OPTS_INIT (or pass NULL for the defaults): a struct zeroed by hand
 * ({0}, memset) has broadcast_params and rebuild_buckets false, so ranks whose parameters start
 * different stay different, silently. */
typedef struct ddp_reducer_opts {
    size_t bucket_cap;           /* bytes, default 25 MiB (0: 25 MiB); a parameter larger
                                    than the cap gets a bucket of its own */
    size_t first_bucket;         /* bytes of the first bucket, default 1 MiB (0: bucket_cap) */
    bool compress_bf16;          /* send float32 gradients as bfloat16 (reduced in float32) */
    bool broadcast_params;       /* broadcast values from rank 0 at creation (default true) */
    ddp_reducer_overlap overlap; /* default AUTO, which the group's world setting overlap
                                    (DDP_OVERLAP=async|inline) turns into ASYNC or INLINE; a
                                    value outside the enum is DDP_ERR_INVALID */
    bool shard_optimizer;        /* ZeRO-1: reduce-scatter, step your shard, gather (above) */
    bool rebuild_buckets;        /* default true: cut the buckets again, once, along the first
                                    synced step's ready order (rank 0's); above. Ignored with
                                    shard_optimizer and on a GPU group */
    bool shard_gradients;        /* ZeRO-2 (above): needs shard_optimizer; CPU groups only, not
                                    with compress_bf16 nor join */
    size_t grad_pool;            /* shard_gradients: bytes of the gradient pool backward writes
                                    into (0: the largest bucket + 2 × the second largest): a
                                    slot of the largest bucket's size, then as many of the
                                    second largest's as fit (rounded down); at least the
                                    largest bucket (else DDP_ERR_INVALID) */
} ddp_reducer_opts;

#define DDP_REDUCER_OPTS_INIT                                                                      \
    {                                                                                              \
        (size_t)25 << 20, (size_t)1 << 20, false, true, DDP_OVERLAP_AUTO, false, true, false, 0    \
    }

typedef struct ddp_reducer ddp_reducer;

/* Per-step statistics, for the step that the last finish() completed. */
typedef struct ddp_reducer_stats {
    int buckets;            /* allreduces issued */
    double comm_seconds;    /* time the allreduces ran, summed */
    double wait_seconds;    /* time finish() waited: communication not hidden behind backward */
    double hidden_fraction; /* 1 − wait / comm, clamped to [0, 1]; 1 = fully overlapped */
    double first_launch;    /* when the first bucket started, seconds after the step's zero_grad */
    int joined;             /* ranks that had run out of inputs (ddp_reducer_join) at this step */
} ddp_reducer_stats;

/* Creates the reducer over params (and buffers, e.g. normalization statistics, which are only
 * broadcast). Checks that every rank registered the same names, counts and dtypes in the same
 * order, and passed the same options (all but overlap), and fails naming the first difference;
 * then broadcasts values from rank 0. Gradients start at zero. *out written only on DDP_OK.
 * Every rank must call it. Borrows g, and the memory the params' and buffers' data point to,
 * for the reducer's life (the lists themselves are copied): destroy the reducer before its
 * group. (A group destroyed first takes the reducer's buckets, its gradients, with it: every
 * later call on the reducer fails with DDP_ERR_CLOSED saying so, grad and param return NULL,
 * and ddp_reducer_destroy is still needed, and safe.) */
ddp_status ddp_reducer_create(ddp_group *g, const ddp_param *params, size_t nparams,
                              const ddp_param *buffers, size_t nbuffers,
                              const ddp_reducer_opts *opts, ddp_reducer **out, ddp_error *err);
/* Waits for unfinished buckets and frees r. Local (not a collective). NULL is a no-op. */
void ddp_reducer_destroy(ddp_reducer *r);

/* The gradient of parameter i, (count,) in its dtype: a view into bucket memory, owned by r.
 * With shard_gradients (and more than one rank): where it is while its bucket holds a pool
 * buffer in this step, else NULL; backward takes it from ddp_reducer_grad_acquire. */
void *ddp_reducer_grad(ddp_reducer *r, size_t i);

/* Backward is about to write parameter i's gradient (+=): *grad receives where, (count,) in its
 * dtype. Without shard_gradients it is ddp_reducer_grad(r, i), kept across steps (accumulation).
 * With it: space in a pool buffer for i's bucket, zeroed when the bucket took the buffer (the
 * same place again for a second acquire of i in the step), valid until i is marked ready; when
 * the pool is full it first waits for the oldest bucket in flight (the group's deadline) and adds
 * its reduced shard into the persistent one. DDP_ERR_INVALID when the pool cannot hold the
 * bucket beside the buckets still being filled (raise grad_pool), or i already marked this step;
 * the group's error when it failed. Collective where it waits (as mark_ready). */
ddp_status ddp_reducer_grad_acquire(ddp_reducer *r, size_t i, void **grad);

/* Element lo (ddp_reducer_shard's) of parameter i's mean gradient after finish(): what the
 * optimizer steps, hi − lo elements. Unsharded or ZeRO-1: inside ddp_reducer_grad(r, i); with
 * shard_gradients: in this rank's persistent gradient shard. Owned by r; NULL for a bad i. */
void *ddp_reducer_shard_grad(ddp_reducer *r, size_t i);
/* Whether gradients are sharded (shard_gradients with more than one rank). */
bool ddp_reducer_grads_sharded(const ddp_reducer *r);
/* Bytes of the gradient pool (0 unless gradients are sharded) and of this rank's gradient shard,
 * for logs. */
size_t ddp_reducer_grad_pool_bytes(const ddp_reducer *r);

/* Where parameter i's values live: params[i].data, or with shard_optimizer (and more than one
 * rank) the reducer's copy, which the caller must use from creation on; owned by r. */
void *ddp_reducer_param(ddp_reducer *r, size_t i);

/* Zeroes every gradient and starts a new step's statistics. */
void ddp_reducer_zero_grad(ddp_reducer *r);

/* Communicate on this step (true, the default) or accumulate locally (false: no_sync). */
void ddp_reducer_set_sync(ddp_reducer *r, bool sync);

/* Parameter i's gradient is complete for this step. Marking one twice in a step is an error.
 * When the bucket it completes fails to reduce (a dead group, a timeout), the step is spent: every
 * later mark_ready returns that same failure and message, without communicating, until finish,
 * which ends the step with it. */
ddp_status ddp_reducer_mark_ready(ddp_reducer *r, size_t i);

/* Launches whatever was not marked ready, waits for every bucket, and leaves the mean over ranks
 * in every gradient. Errors (a dead rank, a timeout) come from the group, with its message. */
ddp_status ddp_reducer_finish(ddp_reducer *r);

/* The elements [*lo, *hi) of parameter i whose mean gradient this rank holds after finish(),
 * and which it steps: all of them ([0, count)) unless sharded; possibly none (lo == hi). */
void ddp_reducer_shard(const ddp_reducer *r, size_t i, size_t *lo, size_t *hi);
/* Whether finish() reduce-scatters (shard_optimizer with more than one rank). */
bool ddp_reducer_sharded(const ddp_reducer *r);
/* Sharded: every rank's shard of the parameters to every rank (call after the optimizer step;
 * every rank must call it). Not sharded: returns DDP_OK at once. Not during a step (between the
 * first mark_ready and finish): sharded, a rank that calls it (or a gather_state*) mid-step
 * gets DDP_ERR_INVALID and aborts the group (ddp_group_abort), so that the others, in the
 * gather's collectives, fail at once naming it ("rank R aborted the group: … a step is under way
 * on rank R …") rather than wait for their deadline; the group is then spent: destroy it. */
ddp_status ddp_reducer_gather_params(ddp_reducer *r);
/* The same for arrays shaped like the parameters (arrays[i]: params[i].count elements of its
 * dtype), e.g. optimizer state before a checkpoint; through a scratch buffer, so the gradients
 * are untouched. Not during a step (between the first mark_ready and finish; as above: not
 * sharded, the call fails on this rank alone, where no rank communicates). */
ddp_status ddp_reducer_gather_state(ddp_reducer *r, void *const *arrays);
/* ZeRO-1's memory split (ddp_optim_keep, ddp/optim.h: each rank keeps the state of its shard
 * only): every rank's shard to rank root, which gets whole arrays — torch's
 * ZeroRedundancyOptimizer.consolidate_state_dict(to=root), e.g. before root saves a checkpoint.
 * shards[i] holds this rank's shard of array i (the elements ddp_reducer_shard gives, the first
 * at shards[i][0]; all of it when not sharded); whole[i] (root only: the others may pass NULL)
 * receives params[i].count elements. Every rank must call it with the same root; not during a
 * step. Through one bucket-sized scratch buffer per rank; the gradients are untouched. */
ddp_status ddp_reducer_gather_state_to(ddp_reducer *r, int root, const void *const *shards,
                                       void *const *whole);
/* The same without whole arrays on the root: each piece goes to sink(ctx, i, first, data,
 * count) there — elements [first, first + count) of array i, in host memory valid for the call,
 * in no particular order, each element once — e.g. straight into a checkpoint file
 * (ddp_ckpt_open_train, ddp_ckpt_writer_put), so that no rank ever holds the whole state. A
 * sink's failure is returned (after the collectives ran to the end with the other ranks, which
 * do not learn of it) and no later piece is given: a caller that gathers several arrays (one
 * call each) must still make every later call on the root, or the others wait in it — keep the
 * failure in ctx, return DDP_OK, and tell the others after the last (ddptrain's save_shards,
 * examples/train_mlp.c). Only root's sink is called (the others may pass NULL; NULL on the root
 * is refused on every rank). On a GPU group the sink gets host memory too (a bounce buffer of
 * one chunk; unsharded, the root's own device arrays in pieces of at most 4 MiB). */
typedef ddp_status (*ddp_state_sink)(void *ctx, size_t i, size_t first, const void *data,
                                     size_t count);
ddp_status ddp_reducer_gather_state_sink(ddp_reducer *r, int root, const void *const *shards,
                                         ddp_state_sink sink, void *ctx);
/* The L2 norm of the whole mean gradient, after finish() (sharded: over every rank's shard, one
 * small allreduce; every rank must call it). For clipping: torch's clip_grad_norm_. On a group
 * that has failed (ddp_group_error), its error, with the group's message: the gradients left
 * are not the mean. The same for unscale below. */
ddp_status ddp_reducer_grad_norm(ddp_reducer *r, double *norm);

/* fp16 loss scaling (ddp/amp.h; torch's GradScaler.unscale_), after finish(): multiplies this
 * rank's mean gradient (its shard when sharded) by inv_scale — the reciprocal of the loss scale,
 * formed as (float)(1.0 / scale) — and sets *found_inf to whether any of it was inf or NaN
 * before. On a GPU group on the device. Local: make the verdict every rank's with
 * ddp_grad_scaler_sync before acting on it. float32 parameters only (DDP_ERR_INVALID
 * otherwise). */
ddp_status ddp_reducer_unscale(ddp_reducer *r, float inv_scale, bool *found_inf);

/* Uneven inputs (torch's DistributedDataParallel.join; above). */
typedef struct ddp_join_opts {
    bool divide_by_initial_world_size; /* default true: the mean divides by the world size, the
                                          joined ranks adding zeros (torch's default); false:
                                          by the ranks still training (CPU groups only) */
    bool throw_on_early_termination;   /* fail every rank, naming who ran out, at the first
                                          synced step after one rank ran out of inputs, rather
                                          than go on without it (that step's later mark_ready
                                          and finish return the same; then every rank trains
                                          again, as after every rank joined) */
} ddp_join_opts;
#define DDP_JOIN_OPTS_INIT                                                                         \
    {                                                                                              \
        true, false                                                                                \
    }

/* Turns uneven-input support on (opts; NULL: the defaults) or off (disable). Every rank must
 * call it at the same point, between steps: the options are compared across ranks and a
 * difference fails on every rank naming it. While on, each synced step's first mark_ready (or
 * its finish) costs one allreduce of one integer. A no_sync micro-step costs nothing. */
ddp_status ddp_reducer_set_join(ddp_reducer *r, const ddp_join_opts *opts, bool enable);
/* This rank is out of inputs: takes part in one synced step of the ranks still training, with
 * zero gradients, and leaves the mean of theirs in its own (divided as opts say; sharded: in
 * its shard, so step it and call ddp_reducer_gather_params as they do). *others: whether any
 * rank was still training; false means every rank has joined, nothing was reduced (the
 * gradients are zero), and the reducer is ready for the next epoch, every rank training again.
 * Between steps only; with throw_on_early_termination, fails as the others do. Collectives of
 * your own in the loop (a loss allreduce, evaluation) are not matched on the joined rank: the
 * ranks' collectives would differ (DDP_DEBUG=1 names it); keep them after the loop. */
ddp_status ddp_reducer_join(ddp_reducer *r, bool *others);

/* Broadcasts the registered buffers from rank 0 again (e.g. before evaluation). */
ddp_status ddp_reducer_sync_buffers(ddp_reducer *r);

void ddp_reducer_stats_get(const ddp_reducer *r, ddp_reducer_stats *out);
/* Buckets and their parameters, for logs: "bucket 0: 1048576 B, 3 params (fc3.bias …)". */
size_t ddp_reducer_num_buckets(const ddp_reducer *r);
/* The bucket of parameter i (SIZE_MAX if there is none). Buckets start in index order, so this
 * is also its place in the launch order. Changes once, when the buckets are rebuilt. */
size_t ddp_reducer_bucket_of(const ddp_reducer *r, size_t i);
/* Whether the buckets were rebuilt along the first synced step's ready order (opts.rebuild_buckets;
 * true from the first mark_ready or finish of the second synced step on). */
bool ddp_reducer_rebuilt(const ddp_reducer *r);
const char *ddp_reducer_last_error(const ddp_reducer *r);

#ifdef __cplusplus
}
#endif
#endif /* DDP_REDUCER_H */
