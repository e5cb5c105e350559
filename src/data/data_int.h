/*
 * data_int.h — private to src/data: preparing a derived file once per host.
 */
#ifndef DDP_DATA_INT_H
#define DDP_DATA_INT_H

#include <stdio.h>

#include "ddp/data.h"
#include "ddp/sampler.h"
#include "ddp/status.h"

/* Writes the derived file's whole contents to f; returns a status (and a message in err). The
 * public ddp_file_fill_fn: a derived file is written with ddp_file_write_atomic. */
typedef ddp_file_fill_fn ddp__prep_fn;

/* Makes sure `out` exists, preparing it at most once per host: under an exclusive flock on
 * "<out>.lock" the first process calls fn on a temporary file beside out, fsyncs it and renames
 * it into place; the others wait on the lock and then find the finished file — at most the job's
 * deadline (DDP_TIMEOUT, read when a wait begins; a malformed one is its error), 10 min without
 * one, then DDP_ERR_TIMEOUT naming the lock. A failed fn leaves no file behind. `what` names the
 * job in messages ("decompress 'x.gz'"). */
ddp_status ddp__prepare_once(const char *out, const char *what, ddp__prep_fn fn, void *ctx,
                             ddp_error *err);

/* The dataset size a sampler was made for: its indices are below it. */
uint64_t ddp__sampler_dataset_size(const ddp_sampler *s);
/* The epoch of the sampler's current indices (its last set_epoch). */
uint64_t ddp__sampler_epoch(const ddp_sampler *s);

/* A loader over a dataset and a sampler: each keeps a list of the loaders over it, and its
 * close/destroy calls release(ctx, what) for each one first (what: "dataset" or "sampler"), so
 * a loader destroyed after its inputs stops its workers before they read freed memory. The node
 * belongs to the loader (no allocation). Not thread-safe: the caller's thread, as those calls. */
typedef struct ddp__data_dep {
    void (*release)(void *ctx, const char *what);
    void *ctx;
    struct ddp__data_dep *next;
} ddp__data_dep;
void ddp__dataset_add_dep(ddp_dataset *d, ddp__data_dep *n);
void ddp__dataset_remove_dep(ddp_dataset *d, ddp__data_dep *n);
void ddp__sampler_add_dep(ddp_sampler *s, ddp__data_dep *n);
void ddp__sampler_remove_dep(ddp_sampler *s, ddp__data_dep *n);
/* The list's head given, n added / removed; and every node released, the list emptied. */
void ddp__data_dep_add(ddp__data_dep **head, ddp__data_dep *n);
void ddp__data_dep_remove(ddp__data_dep **head, ddp__data_dep *n);
void ddp__data_dep_release_all(ddp__data_dep **head, const char *what);

#endif /* DDP_DATA_INT_H */
