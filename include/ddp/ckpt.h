/*
 * ddp/ckpt.h — checkpoints as safetensors files: written atomically, read back with strict
 * validation.
 *
 * File format (safetensors, https://github.com/huggingface/safetensors):
 *   u64 N (little-endian) | N bytes of UTF-8 JSON header | data buffer
 *   header = {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, …,
 *             "__metadata__": {"key": "value", …}}
 * Offsets are relative to the data buffer; the tensors are packed, non-overlapping and cover the
 * whole buffer. Values are stored little-endian (this library supports little-endian hosts only).
 *
 * ddp_ckpt_save() pads the header with spaces so the data buffer starts at a multiple of 8 and
 * stores the tensors by decreasing element size, so every tensor of a file it wrote is naturally
 * aligned in a mapping. Files from other writers may not be: copy with memcpy when in doubt.
 *
 * A trainer's whole state — a model's parameters and buffers, the optimizer's state, where the
 * data stand, the configuration — is one such file (ddp_ckpt_save_train below): the weights
 * under their own names and shapes, so PyTorch loads them by name; the rest as tensors named
 * "optim.<param>.<state>" and string metadata.
 */
#ifndef DDP_CKPT_H
#define DDP_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/model.h"
#include "ddp/status.h"
#include "ddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_CKPT_MAX_DIMS 8

/* A tensor view. Plain data: for ddp_ckpt_save() everything is borrowed from the caller for the
 * call; from a reader, name and data are owned by the ddp_ckpt and valid until ddp_ckpt_close().
 * ndim 0 is a scalar (one element); a dimension of 0 makes an empty tensor (data may then be
 * NULL on save, and must not be dereferenced on read). */
typedef struct ddp_ckpt_tensor {
    const char *name;                 /* UTF-8, unique in a file, not "__metadata__" */
    ddp_dtype dtype;                  /* stored as safetensors "F32" "F64" "BF16" "F16" "I32"
                                         "I64" "U8" */
    int ndim;                         /* 0 … DDP_CKPT_MAX_DIMS */
    int64_t shape[DDP_CKPT_MAX_DIMS]; /* each ≥ 0; entries past ndim are ignored / zero */
    const void *data;                 /* row-major, little-endian, prod(shape) elements */
} ddp_ckpt_tensor;

/* Writes n tensors and nmeta metadata pairs (meta_keys[i] → meta_vals[i], UTF-8 strings; may be
 * NULL when nmeta is 0) to path, atomically: the file is written as "<path>.tmp.<host>.<pid>" in
 * the same directory, fsync'ed, renamed over path, and the directory is fsync'ed. On any failure
 * the temporary file is removed and a file already at path is left as it was. Borrows everything
 * for the call. Errors: DDP_ERR_INVALID (a bad tensor or key: the message names it), DDP_ERR_NOMEM,
 * DDP_ERR_SYSTEM (with the call, the file and errno — disk full, file-size limit, …).
 * Not safe for two concurrent saves to the same path from one process. */
ddp_status ddp_ckpt_save(const char *path, const ddp_ckpt_tensor *t, size_t n,
                         const char *const *meta_keys, const char *const *meta_vals, size_t nmeta,
                         ddp_error *err);

/* The same save in steps, for data that is not all in memory at once (a sharded optimizer's
 * state gathered piece by piece: ddptrain's checkpoints with shard_optimizer). open checks
 * everything and writes the header and every tensor whose data is given; a tensor whose data is
 * NULL (and whose size is not 0) is written later with put, in any order and in pieces — each
 * byte once. commit checks that nothing is missing, computes the data's CRC, and ends as
 * ddp_ckpt_save does (fsync, rename over path, fsync of the directory); it frees w whatever
 * happens. abort (or a failed commit) removes the temporary file and leaves path as it was.
 * The file is byte for byte the one ddp_ckpt_save writes from the same tensors. Errors as
 * ddp_ckpt_save's; put: DDP_ERR_INVALID for bytes outside the tensor, of a tensor whose data
 * was given, or put before, DDP_ERR_SYSTEM for the write (w stays usable: abort it). */
typedef struct ddp_ckpt_writer ddp_ckpt_writer;
ddp_status ddp_ckpt_writer_open(const char *path, const ddp_ckpt_tensor *t, size_t n,
                                const char *const *meta_keys, const char *const *meta_vals,
                                size_t nmeta, ddp_ckpt_writer **out, ddp_error *err);
ddp_status ddp_ckpt_writer_put(ddp_ckpt_writer *w, size_t i, uint64_t offset, const void *data,
                               size_t bytes, ddp_error *err);
ddp_status ddp_ckpt_writer_commit(ddp_ckpt_writer *w, ddp_error *err);
void ddp_ckpt_writer_abort(ddp_ckpt_writer *w); /* NULL is a no-op */

/* ---- reading ----------------------------------------------------------------------------------
 */

typedef struct ddp_ckpt ddp_ckpt; /* an open, validated checkpoint (memory-mapped) */

/* Opens and validates a whole file: header length, JSON, dtypes, shapes against offsets, offsets
 * packed and covering the data exactly, metadata string → string. *out is set only on DDP_OK.
 * Errors: DDP_ERR_NOT_FOUND (no such file), DDP_ERR_SYSTEM, DDP_ERR_NOMEM, DDP_ERR_INVALID (a
 * malformed or truncated file; the message names the file and the problem). Never crashes on
 * any file content. The file must not be truncated in place while open (checkpoints written by
 * ddp_ckpt_save are replaced by rename, which is safe): a read past its new end raises SIGBUS,
 * and ddp_data_mapping_at (ddp/data.h) then names the file, as DDP_MAPPING_CHECKPOINT. */
ddp_status ddp_ckpt_open(const char *path, ddp_ckpt **out, ddp_error *err);

void ddp_ckpt_close(ddp_ckpt *c); /* NULL is a no-op */

/* The handle is read-only after open: the functions below are safe from several threads. */

/* Number of tensors, and the i-th (i < count; in header order) — NULL when i is out of range. */
size_t ddp_ckpt_count(const ddp_ckpt *c);
const ddp_ckpt_tensor *ddp_ckpt_tensor_at(const ddp_ckpt *c, size_t i);

/* The tensor called name, or NULL. Linear in the number of tensors. */
const ddp_ckpt_tensor *ddp_ckpt_find(const ddp_ckpt *c, const char *name);

/* Metadata: the value of key (owned by c), or NULL; and the i-th pair for listing
 * (false when i is out of range). */
const char *ddp_ckpt_meta(const ddp_ckpt *c, const char *key);
size_t ddp_ckpt_meta_count(const ddp_ckpt *c);
bool ddp_ckpt_meta_at(const ddp_ckpt *c, size_t i, const char **key, const char **val);

/* Checks the data against the CRC-32 ddp_ckpt_save stores in the metadata ("ddp.data_crc32",
 * 8 hex digits; a key of ddpc's own, refused in a caller's metadata and not listed by
 * ddp_ckpt_meta/ddp_ckpt_meta_at): DDP_ERR_INVALID naming the
 * file when a byte changed after the save. A file without it (saved before 2026-11-25, or by
 * another program) passes. Reads the whole data section (zlib's crc32, several GB/s);
 * ddp_ckpt_load_train calls it. */
ddp_status ddp_ckpt_verify(const ddp_ckpt *c, ddp_error *err);

/* ---- checkpoint directories -------------------------------------------------------------------
 */

/* Finds the checkpoint with the highest step among files in dir named "<prefix><step>.safetensors"
 * (step: decimal digits; temporary "*.tmp.*" files and anything else are ignored) and writes
 * "<dir>/<name>" into out (cap bytes). Errors: DDP_ERR_NOT_FOUND (none, or no such dir),
 * DDP_ERR_TOO_LARGE (cap too small), DDP_ERR_SYSTEM. */
ddp_status ddp_ckpt_latest(const char *dir, const char *prefix, char *out, size_t cap,
                           ddp_error *err);

/* Deletes all but the keep_last_k (≥ 1) highest-step checkpoints named as above in dir.
 * A file that disappears meanwhile is not an error. Temporary files are left alone. */
ddp_status ddp_ckpt_prune(const char *dir, const char *prefix, size_t keep_last_k, ddp_error *err);

/* As ddp_ckpt_prune, among the checkpoints whose step is at most max_step: one with a higher
 * step (another run's, left in dir) is neither counted nor deleted, so the checkpoint a trainer
 * has just written at max_step is always among those kept. */
ddp_status ddp_ckpt_prune_upto(const char *dir, const char *prefix, size_t keep_last_k,
                               uint64_t max_step, ddp_error *err);

/* Removes the temporary files that saves killed mid-way left in dir: those named
 * "<prefix><step>.safetensors.tmp.<host>.<pid>" by ddp_ckpt_save on THIS host whose process no
 * longer exists. Another host's temporary files (a shared filesystem), a live writer's, and
 * anything else are left alone. *removed (may be NULL) receives the count. A missing dir is not
 * an error. */
ddp_status ddp_ckpt_clean_stale(const char *dir, const char *prefix, size_t *removed,
                                ddp_error *err);

/* ---- trainer state ---------------------------------------------------------------------------
 */

/* The "format" metadata of a trainer-state file. */
#define DDP_CKPT_TRAIN_FORMAT "ddptrain-1"
#define DDP_CKPT_MAX_OPTIM_STATES 4

/* Where a run stands: the metadata "step", "epoch", "next_batch", "world_size", and with fp16
 * loss scaling "optim_step", "loss_scale", "loss_scale_growth". */
typedef struct ddp_ckpt_train_pos {
    uint64_t step;       /* training steps taken */
    uint64_t epoch;      /* the training data's epoch */
    uint64_t next_batch; /* its next batch, counted in the saving run's per-rank batches */
    uint64_t world_size; /* ranks of the saving run (to convert next_batch to another world) */
    /* fp16 loss scaling (ddp/amp.h; saved when loss_scale > 0, else read back as: optim_step =
     * step, loss_scale 0): the optimizer steps actually taken (a step skipped for an inf is not:
     * AdamW's bias correction counts these, as torch's does), and the scaler's state. */
    uint64_t optim_step;
    float loss_scale;
    int32_t loss_scale_growth;
} ddp_ckpt_train_pos;

/* What a trainer-state file holds, as views into the caller's memory (plain data, borrowed for
 * the call). Any model's parameter list fits (ddp_model_params / ddp_model_buffers), with any
 * optimizer's state (ddp_optim_num_states / _state_name / _state). */
typedef struct ddp_ckpt_train_state {
    const ddp_model_param *params; /* (n_params,) saved as F32 "<name>" of the param's shape */
    size_t n_params;
    const ddp_model_param *buffers; /* (n_buffers,) saved as 1-D F32 "<name>" */
    size_t n_buffers;
    int n_optim; /* optimizer state arrays per parameter, 0 … DDP_CKPT_MAX_OPTIM_STATES */
    const char *optim_names[DDP_CKPT_MAX_OPTIM_STATES]; /* e.g. "exp_avg" */
    float *const *optim[DDP_CKPT_MAX_OPTIM_STATES];     /* optim[s][i]: (params[i].count,),
                                                           saved 1-D as "optim.<name>.<state>" */
    ddp_ckpt_train_pos pos;                             /* saved as metadata */
    double loss;        /* saved as metadata "loss" (for people; not read back) */
    const char *config; /* saved as metadata "config" (the run's YAML; NULL: "") */
    /* More metadata, the program's own, saved as given beside the keys above (ddptrain keeps
     * its progress line's loss window there); read back with ddp_ckpt_open + ddp_ckpt_meta.
     * n_extra 0: none (extra_keys/extra_vals may be NULL). A key the format uses is refused. */
    const char *const *extra_keys;
    const char *const *extra_vals;
    size_t n_extra;
} ddp_ckpt_train_state;

/* Writes s to path with ddp_ckpt_save (atomically): per parameter its values then its optimizer
 * state, then the buffers; metadata "format" (DDP_CKPT_TRAIN_FORMAT), "step", "epoch",
 * "next_batch", "world_size", "loss", "config" (and the fp16 scaler's), then s's extra keys.
 * Only rank 0 should call it (every rank holds the same state under DDP; complete sharded
 * optimizer state first, ddp_reducer_gather_state). Errors: those of ddp_ckpt_save;
 * DDP_ERR_INVALID for n_optim out of range, pos.world_size 0, an extra key that is NULL, empty
 * or one of the format's, or an array of s that is NULL where its count is not 0 (params,
 * buffers, optim_names[k], optim[k], extra_keys, extra_vals). */
ddp_status ddp_ckpt_save_train(const char *path, const ddp_ckpt_train_state *s, ddp_error *err);
/* The same in steps (ddp_ckpt_writer above), for optimizer state that is not whole in memory
 * (ZeRO-1's memory split: ddp_reducer_gather_state_sink): an optim[k] that is NULL is left for
 * ddp_ckpt_writer_put — tensor ddp_ckpt_train_tensor(s, i, k) holds parameter i's state k,
 * params[i].count floats — and ddp_ckpt_writer_commit ends the save. The file is the one
 * ddp_ckpt_save_train writes from the same values. */
ddp_status ddp_ckpt_open_train(const char *path, const ddp_ckpt_train_state *s,
                               ddp_ckpt_writer **out, ddp_error *err);
size_t ddp_ckpt_train_tensor(const ddp_ckpt_train_state *s, size_t i, int k);

/* Reads a file written by ddp_ckpt_save_train into the memory s points at: every parameter's and
 * buffer's data, and every optimizer state array named in s (pos, loss and config in s are
 * ignored), then the position into *pos. Every tensor of s must be in the file as F32 with as
 * many elements (shapes are not compared, so a file from an older writer with flat shapes
 * loads); tensors in the file that s does not name are ignored. Errors (message in err, naming
 * the file and the tensor or key): DDP_ERR_INVALID (not a trainer-state file, a tensor missing
 * or of another size — saved with another model or optimizer —, bad metadata: a number that is
 * not plain digits, a world_size of 0 or one whose product with next_batch passes 2^64, a loss
 * scale that is not finite as a float; an array of s NULL where its count is not 0), and those of
 * ddp_ckpt_open. On error the arrays may be partly overwritten; *pos is written only on DDP_OK
 * (pos may be NULL: the position is then not wanted). */
ddp_status ddp_ckpt_load_train(const char *path, const ddp_ckpt_train_state *s,
                               ddp_ckpt_train_pos *pos, ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_CKPT_H */
