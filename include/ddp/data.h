/*
 * ddp/data.h — datasets and the prefetching loader.
 *
 * Datasets are memory-mapped files with random access by sample index:
 *   IDX  MNIST / Fashion-MNIST images + labels (gzip or plain). A gzip file is decompressed
 *        once per host into a cache directory: the first process takes a lock and writes it
 *        (temporary file, then rename), the others wait for it — "prepare data on the main
 *        process only", without the caller having to arrange it. The wait lasts at most the
 *        job's deadline (DDP_TIMEOUT), 10 min without one: then DDP_ERR_TIMEOUT naming the lock.
 *   tokens  nanoGPT's headerless uint16 train.bin / val.bin, or llm.c's shards (256 × int32
 *        header: magic 20240520, version 1, token count; then uint16 tokens). Sample i is the
 *        window tokens[i·T … i·T+T] → x = first T, y = the T after (shifted by one).
 * A malformed, truncated or mismatched file is a clear error naming the file and the problem.
 * A file that shrinks after it was opened (truncated, or rewritten in place, while a job reads
 * it) cannot be checked that way: a read past its new end raises SIGBUS, and
 * ddp_data_mapping_at (below) tells a signal handler which file that was. Write a new file under
 * another name and rename it over the old one instead (the mapping keeps the old contents).
 *
 * The loader turns a rank's sampler indices into batches with background worker threads and a
 * ring of prefetched batches (or, with no workers, on the caller's thread); a batch's contents
 * depend only on its indices, so they are the same whatever the thread count. Its position (epoch,
 * batch) can be saved and restored.
 */
#ifndef DDP_DATA_H
#define DDP_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ddp/sampler.h"
#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_dataset ddp_dataset;

/* Opens an IDX image file (idx3, uint8) and its label file (idx1, uint8), gzip or plain.
 * cache_dir holds decompressed copies (NULL or "": /tmp/ddp-data-cache; a launched program
 * passes its world's data_cache setting, DDP_DATA_CACHE).
 * Samples: x = pixels / 255 as float32 (rows × cols), y = the label. */
ddp_status ddp_dataset_open_idx(const char *images, const char *labels, const char *cache_dir,
                                ddp_dataset **out, ddp_error *err);

/* Opens a token file; seq_len T ≥ 1. Samples: x = T tokens, y = the next T (int32 each). */
ddp_status ddp_dataset_open_tokens(const char *path, size_t seq_len, ddp_dataset **out,
                                   ddp_error *err);

void ddp_dataset_close(ddp_dataset *ds); /* NULL is a no-op */

size_t ddp_dataset_len(const ddp_dataset *ds);
/* Elements per sample: of x (float32 for IDX, int32 for tokens) and of y (int32). */
size_t ddp_dataset_x_elems(const ddp_dataset *ds);
size_t ddp_dataset_y_elems(const ddp_dataset *ds);
bool ddp_dataset_x_is_float(const ddp_dataset *ds);
/* Number of classes for IDX (max label + 1), vocabulary bound for tokens (max token + 1). */
int ddp_dataset_classes(const ddp_dataset *ds);

/* Writes sample i into x (x_elems) and y (y_elems). Thread-safe (read-only). */
ddp_status ddp_dataset_get(const ddp_dataset *ds, size_t i, void *x, int32_t *y);
/* Samples idx[0..n) into consecutive rows of x and y, reading ahead of the random accesses.
 * An index outside the dataset is DDP_ERR_INVALID, with its position in *bad (may be NULL). */
ddp_status ddp_dataset_get_many(const ddp_dataset *ds, const uint64_t *idx, size_t n, void *x,
                                int32_t *y, size_t *bad);

/* Tokens in a token dataset (0 for IDX). */
size_t ddp_dataset_num_tokens(const ddp_dataset *ds);

/* Windows at arbitrary token offsets: for k < n, x[k] = tokens[starts[k] … +T], y[k] = the T
 * after (shifted by one), as int32 rows of T. Every start must be ≤ num_tokens − T − 1.
 * Thread-safe (read-only). */
ddp_status ddp_dataset_get_windows(const ddp_dataset *ds, const uint64_t *starts, size_t n,
                                   int32_t *x, int32_t *y, ddp_error *err);

/* nanoGPT's random training windows, reproducibly: starts[k] (in [0, ntokens − seq_len − 1],
 * uniform) for samples first … first+n−1 of step `step` depends only on (seed, step, first + k).
 * Give each rank first = rank × B (or its micro-batch's global offset): N ranks × B then draw
 * exactly the windows one rank × N·B would, and a resumed run the same as an unbroken one. */
void ddp_lm_window_starts(uint64_t seed, uint64_t step, uint64_t first, size_t n, size_t ntokens,
                          size_t seq_len, uint64_t *starts);

/* ---- text to tokens ------------------------------------------------------------------------- */

/* Byte-level tokenisation (vocabulary 256): every byte of the text is one token, written as
 * nanoGPT's headerless uint16 files. Inputs are files, or folders whose regular files (not
 * symbolic links) named without a '.' or ending in ".txt" are read in name order. The text is
 * cut into documents — whole files, or, with doc_sep, the pieces ending in a line that is exactly
 * doc_sep (fortune's "%") — and document k goes to the validation file when
 * k % val_every == val_every − 1, else to the training file; bytes are kept exactly, separator
 * lines included. */
typedef struct ddp_text_opts {
    const char *doc_sep; /* a line that ends a document; NULL or "": each file is one document;
                            a line break in it is DDP_ERR_INVALID */
    unsigned val_every;  /* every val_every-th document is validation; 0: no validation file */
} ddp_text_opts;
#define DDP_TEXT_OPTS_INIT                                                                         \
    {                                                                                              \
        NULL, 10                                                                                   \
    }

typedef struct ddp_text_stats {
    uint64_t documents, train_tokens, val_tokens;
} ddp_text_stats;

/* Writes train_out and (unless val_every is 0 or val_out NULL) val_out, each atomically
 * (temporary file, fsync, rename; the validation file first). stats may be NULL. An input that
 * cannot be read, a folder with no text, or a split left empty is a clear error. */
ddp_status ddp_tokens_from_text(const char *const *inputs, size_t n, const ddp_text_opts *opts,
                                const char *train_out, const char *val_out, ddp_text_stats *stats,
                                ddp_error *err);

/* The same into a per-host cache, once: the files are named after a hash of the inputs' paths,
 * sizes, modification times and opts, and made by the first process to ask while the others
 * wait (the lock IDX decompression uses). cache_dir NULL: /tmp/ddp-data-cache. Writes the two
 * paths (cap bytes each; val_path "" when val_every is 0). */
ddp_status ddp_tokens_prepare_text(const char *const *inputs, size_t n, const ddp_text_opts *opts,
                                   const char *cache_dir, char *train_path, char *val_path,
                                   size_t cap, ddp_error *err);

/* ---- writing a file atomically -------------------------------------------------------------- */

/* Writes a file's whole contents to f (borrowed for the call; tmp_path names it, for messages)
 * and returns DDP_OK, or a status with a one-line message in err (which may be NULL). */
typedef ddp_status (*ddp_file_fill_fn)(void *ctx, FILE *f, const char *tmp_path, ddp_error *err);

/* Writes path atomically, the way the derived data files above are written: fill writes the
 * contents into a temporary file beside path ("<path>.tmp.<pid>"), which is flushed, fsynced and
 * renamed over path, and then path's folder is fsynced, so that the rename survives a crash. On
 * any failure before the rename (fill's status, a write, the fsync, the rename) the temporary
 * file is removed and path is left as it was: a reader, or a crash, sees the old file or the new
 * one, never part of either. A failed fsync of the folder is reported (DDP_ERR_SYSTEM, "… was
 * renamed into place but …") with the new file in place. When path exists, the new file keeps
 * its permission bits (a chmod survives a rewrite; not its owner). Temporary files of path that
 * a killed writer left ("<path>.tmp.<pid>" with nothing but the pid's digits after, whose process
 * is gone: kill(pid, 0) says ESRCH) are removed first; a pid is only known on this host and in
 * this pid namespace, so a folder shared with another host's or container's writers of the same
 * path may lose their temporary file (their rename then fails: their path is left as it was).
 * Not for two writers of one path in one process (the temporary name is per process). */
ddp_status ddp_file_write_atomic(const char *path, ddp_file_fill_fn fill, void *ctx,
                                 ddp_error *err);

/* ---- the loader ----------------------------------------------------------------------------- */

typedef struct ddp_loader ddp_loader;

typedef struct ddp_batch ddp_batch;

/* A per-batch transform (augmentation, normalisation, …) run where the batch is filled: on a
 * worker thread, so that it overlaps the training step as torch's DataLoader transforms do in
 * its workers, or inside ddp_loader_next with threads = 0. batch's n, x, y, epoch and index are
 * set, and indices holds the batch's n dataset indices (keys for ddp_augment_images); it may
 * rewrite the contents of x and y in place, nothing else. With threads > 1 it runs on several
 * batches at once: it must be thread-safe (ctx is shared). It returns DDP_OK, or a status and a
 * one-line reason in msg (DDP_ERRMSG_MAX bytes): that batch then fails — next() returns the
 * status when it reaches it, with the reason in ddp_loader_last_error, and again on every call
 * until set_epoch or restore; the batches before it are handed out as usual. */
typedef ddp_status (*ddp_batch_transform)(void *ctx, const ddp_batch *batch,
                                          const uint64_t *indices, char *msg);

typedef struct ddp_loader_opts {
    size_t batch_size; /* per rank; one whose batch would not fit in size_t bytes is
                          DDP_ERR_INVALID */
    int threads;       /* worker threads; 0: batches are filled inside next(), on the caller's
                        * thread (PyTorch's num_workers=0), best when no core is spare */
    int depth;         /* batches prefetched ahead, ≥ 2 (0: 2: double buffering); a negative
                        * threads, a depth of 1 or below 0 are DDP_ERR_INVALID */
    bool drop_last;    /* drop a last partial batch of an epoch */
    ddp_batch_transform transform; /* NULL: none (above) */
    void *transform_ctx;           /* its first argument, borrowed for the loader's life */
    double timeout_s; /* torch DataLoader's timeout: with threads ≥ 1, the longest next() waits
                       * for a batch (a worker stuck reading or in the transform) before it
                       * returns DDP_ERR_TIMEOUT naming the batch; 0: no limit (torch's default).
                       * Negative, NaN, or positive with threads 0 is DDP_ERR_INVALID. */
} ddp_loader_opts;

#define DDP_LOADER_OPTS_INIT                                                                       \
    {                                                                                              \
        32, 1, 2, true, NULL, NULL, 0                                                              \
    }

/* One batch: (n, x_elems) x and (n, y_elems) y, owned by the loader, valid until the next call
 * to ddp_loader_next (or set_epoch, restore, destroy). */
struct ddp_batch {
    size_t n; /* samples in this batch; 0 at the end of the epoch */
    void *x;  /* float32 or int32, see ddp_dataset_x_is_float */
    int32_t *y;
    uint64_t epoch, index; /* which batch of which epoch this is */
};

/* Borrows ds and sampler for the loader's life: destroy the loader first. (Closing ds or
 * destroying sampler first stops the loader's workers before they read freed memory; its calls
 * then fail with DDP_ERR_CLOSED saying so, and ddp_loader_destroy is still needed, and safe.)
 * Starts at epoch 0 (calls set_epoch). A sampler made for more samples than ds has is
 * DDP_ERR_INVALID here, not at the first bad index. */
ddp_status ddp_loader_create(ddp_dataset *ds, ddp_sampler *sampler, const ddp_loader_opts *opts,
                             ddp_loader **out, ddp_error *err);
void ddp_loader_destroy(ddp_loader *l); /* joins the threads; NULL is a no-op */
/* The worker threads running: opts.threads, or fewer when the system refused some (RLIMIT_NPROC,
 * a container's pids limit) — the loader then works with those, or fills batches inside next()
 * as with threads 0 when none started; not an error. 0 for NULL. */
int ddp_loader_threads(const ddp_loader *l);

/* Starts epoch e from its first batch (sets the sampler's epoch). Setting the sampler's epoch
 * instead, as a PyTorch loop does (ddp_sampler_set_epoch; train_sampler.set_epoch(epoch)), works
 * too: the next call to next() starts that epoch from its first batch (the workers read their
 * own copy of the indices, so the sampler may change at any time). */
ddp_status ddp_loader_set_epoch(ddp_loader *l, uint64_t epoch);
/* The next batch of the epoch (n == 0 once the epoch is over). Waits for the workers, at most
 * opts.timeout_s when set: then DDP_ERR_TIMEOUT, with ddp_loader_last_error naming the batch; the
 * loader stays usable (a later call waits again for the same batch), but a worker stuck in the
 * caller's transform cannot be interrupted: set_epoch, restore and destroy wait for it to
 * return. So a trainer that gets the timeout should report it and end (abort its group). */
ddp_status ddp_loader_next(ddp_loader *l, ddp_batch *out);
size_t ddp_loader_batches_per_epoch(const ddp_loader *l);

/* Position: the epoch, and the index of the next batch next() will return. */
typedef struct ddp_loader_state {
    uint64_t epoch;
    uint64_t next_batch;
} ddp_loader_state;
void ddp_loader_save(const ddp_loader *l, ddp_loader_state *out);
/* A next_batch past the epoch's batches is DDP_ERR_INVALID and leaves the position unchanged. */
ddp_status ddp_loader_restore(ddp_loader *l, const ddp_loader_state *st);
const char *ddp_loader_last_error(const ddp_loader *l);

/* ---- the library's file mappings, for a fault handler --------------------------------------- */

/* What a read-only file mapping of the library holds. */
typedef enum ddp_mapping_kind {
    DDP_MAPPING_DATA = 1,   /* a dataset's file (ddp_dataset_open_idx / _tokens; for a gzip
                               file, its decompressed copy in the data cache) */
    DDP_MAPPING_CHECKPOINT, /* a checkpoint (ddp_ckpt_open) */
} ddp_mapping_kind;

/* The mapping an address lies in (ddp_data_mapping_at). */
typedef struct ddp_mapping_info {
    const char *path;      /* the file as it was opened (a relative path stays relative); owned
                              by the library, valid until the mapping is unmapped (the dataset or
                              checkpoint closed) */
    size_t offset;         /* the address's byte offset in the mapping, which is its offset in
                              the file */
    size_t length;         /* the mapping's length: the file's size when it was opened */
    ddp_mapping_kind kind; /* what the file is */
} ddp_mapping_info;

/* Mappings recorded at once; one made while this many are live is not recorded (it reads as
 * usual; ddp_data_mapping_at does not find it). */
#define DDP_DATA_MAPPINGS_MAX 64

/* Whether addr lies in one of the library's read-only file mappings (datasets, checkpoints); if
 * so, writes which into *out and returns true. Meant for a SIGBUS handler given siginfo's si_addr:
 * a mapped file that shrinks while it is read (truncated, or rewritten in place by another
 * process) raises SIGBUS at the first read past its new end, and this names the file, e.g. in a
 * message before the program dies of the signal.
 * Async-signal-safe: it reads a fixed table published with lock-free atomics, takes no lock and
 * allocates nothing. Thread-safe, and safe while other threads open and close datasets. */
bool ddp_data_mapping_at(const void *addr, ddp_mapping_info *out);

/* ---- augmentation --------------------------------------------------------------------------- */

/* Random image augmentation for training: a horizontal flip with probability 1/2, and a shift
 * by up to `shift` pixels in each direction with zeros filling in (torchvision's
 * RandomHorizontalFlip and RandomCrop(size, padding=shift)). */
typedef struct ddp_augment {
    bool hflip;
    int shift; /* 0 ≤ shift < image side */
    uint64_t seed;
} ddp_augment;

/* Augments n images (ch, h, w) of float32 in place. Sample k's draw depends only on (seed,
 * epoch, keys[k]) — pass its dataset index — so every rank draws differently for its own
 * samples, and the same sample gets the same augmentation whatever the world size, the rank,
 * or whether the run was resumed: no generator state to save. */
ddp_status ddp_augment_images(const ddp_augment *a, float *x, size_t n, int ch, int h, int w,
                              const uint64_t *keys, uint64_t epoch, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_DATA_H */
