/*
 * group_int.h — inside the process group: one collective described as data, and the table of
 * operations every backend (shm, tcp, and later nccl, mpi) implements. Private to src/group.
 *
 * The core (group.c) owns ordering, deadlines, poisoning, the debug check and the progress
 * thread; a backend only moves and reduces bytes among its members, and reports which members
 * failed to arrive. A backend works on a *member list* rather than the whole world, so the
 * hierarchical backend can run shm among the ranks of a host and tcp among hosts.
 */
#ifndef DDP_GROUP_INT_H
#define DDP_GROUP_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/group.h"

typedef enum ddp__kind {
    DDP__ALLREDUCE,
    DDP__BROADCAST,
    DDP__ALLGATHER,
    DDP__REDUCE_SCATTER,
    DDP__BARRIER,
    DDP__KIND_COUNT
} ddp__kind;

const char *ddp__kind_name(ddp__kind k);

/* One collective. Buffers follow the public API's meaning (send == recv for in place). */
typedef struct ddp__coll {
    ddp__kind kind;
    const void *send;
    void *recv;
    size_t count; /* elements: per rank for allgather/reduce_scatter, total otherwise */
    ddp_dtype dtype;
    ddp_op op;
    int root;            /* member index, broadcast only */
    uint64_t seq;        /* 1, 2, … per group, the same on every member */
    bool background;     /* run by the progress thread: nobody waits on it right now, so a
                            backend should not spin (it would steal the caller's core) */
    int64_t deadline_ms; /* absolute, ddp__now_ms() clock */
    int avg_div;         /* > 1: divide results by this while reducing (AVG, fused); set by the
                            core only for backends whose fuses_avg is true */
} ddp__coll;

/* What a backend needs to know about its members. */
typedef struct ddp__members {
    int me;                  /* my index in ranks[] */
    int n;                   /* number of members */
    const int *ranks;        /* global ranks, by member index */
    const char *prefix;      /* unique store-key prefix for this backend instance */
    const char *run_id;      /* the job's id, for naming shared memory */
    const char *token;       /* the job's store token: data connections must show it too */
    const char *master_addr; /* the store's host: tcp picks the local interface toward it */
} ddp__members;

/* Failure report of a backend: status, message, and which members did not arrive. */
typedef struct ddp__fail {
    ddp_status status;
    char msg[DDP_ERRMSG_MAX];
} ddp__fail;

typedef struct ddp__backend_ops {
    const char *name;
    /* Runs one collective among the members; blocks until done, failed, or c->deadline_ms. On
     * failure fills *f (message names what failed and, if known, the missing global ranks). */
    ddp_status (*run)(void *be, const ddp__coll *c, ddp__fail *f);
    /* Memory the backend handles without copies; NULL when it has none (may be NULL). */
    void *(*alloc)(void *be, size_t bytes);
    void (*free)(void *be, void *p);
    /* Thread-safe: make current and later run() calls fail fast here and on the peers; why
     * (one line, e.g. the error that made this rank give up) is shown to the peers. */
    void (*abort)(void *be, const char *why);
    void (*destroy)(void *be);
    bool fuses_avg; /* run() honours c->avg_div: no second pass over the result for AVG */
} ddp__backend_ops;

/* Backend constructors. store is borrowed for the call (set-up only). timeout_ms bounds set-up. */
ddp_status ddp__shm_create(const ddp__members *m, ddp_store *store, size_t arena_bytes,
                           int timeout_ms, void **be, const ddp__backend_ops **ops, ddp_error *err);
ddp_status ddp__tcp_create(const ddp__members *m, ddp_store *store, int timeout_ms, void **be,
                           const ddp__backend_ops **ops, ddp_error *err);
/* shm within hosts, tcp among hosts; hosts[r] is rank r's host id. Falls back to tcp for all
 * ranks (and says so in name) when hosts are uneven or ranks interleave. */
ddp_status ddp__hier_create(const ddp__members *m, const char *const *hosts, ddp_store *store,
                            size_t arena, int timeout_ms, void **be, const ddp__backend_ops **ops,
                            char *name, size_t namecap, ddp_error *err);

/* ---- reduction kernels (reduce.c) ----------------------------------------------------------- */

/* dst[i] = dst[i] op src[i] for i < n, in the dtype's arithmetic (bf16/fp16 through float32). */
void ddp__reduce_into(void *dst, const void *src, size_t n, ddp_dtype t, ddp_op op);
/* ddp__reduce_many, then each result divided by divisor when divisor > 1 (AVG, run as SUM): in
 * the same pass for two float32/float64 inputs, with the same roundings as the two passes. */
void ddp__reduce_many_avg(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t,
                          ddp_op op, int divisor);
/* dst[i] = a[i] op b[i]. */
void ddp__reduce2(void *dst, const void *a, const void *b, size_t n, ddp_dtype t, ddp_op op);
/* dst[i] = op over k inputs srcs[j][i] (k ≥ 1); dst may alias srcs[0]. One pass over memory. */
void ddp__reduce_many(void *dst, const void *const *srcs, int k, size_t n, ddp_dtype t, ddp_op op);
/* For DDP_AVG: buf[i] /= divisor (after a SUM). */
void ddp__scale_avg(void *buf, size_t n, ddp_dtype t, int divisor);

/* bf16/fp16 <-> float32 conversions (round to nearest even). */
float ddp__bf16_to_f32(uint16_t h);
uint16_t ddp__f32_to_bf16(float f);
float ddp__f16_to_f32(uint16_t h);
uint16_t ddp__f32_to_f16(float f);

#endif /* DDP_GROUP_INT_H */
