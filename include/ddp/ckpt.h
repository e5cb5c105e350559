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
 * The trainer keeps its own state (step, epoch, sampler position, RNG states, config) as string
 * metadata — JSON text where it is structured.
 */
#ifndef DDP_CKPT_H
#define DDP_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_ckpt_dtype {
    DDP_CKPT_F32 = 0, /* "F32"  float */
    DDP_CKPT_F64,     /* "F64"  double */
    DDP_CKPT_BF16,    /* "BF16" bfloat16 (the high half of a float32) */
    DDP_CKPT_F16,     /* "F16"  IEEE half */
    DDP_CKPT_I32,     /* "I32"  int32_t */
    DDP_CKPT_I64,     /* "I64"  int64_t */
    DDP_CKPT_U8,      /* "U8"   uint8_t */
} ddp_ckpt_dtype;

#define DDP_CKPT_MAX_DIMS 8

/* A tensor view. Plain data: for ddp_ckpt_save() everything is borrowed from the caller for the
 * call; from a reader, name and data are owned by the ddp_ckpt and valid until ddp_ckpt_close().
 * ndim 0 is a scalar (one element); a dimension of 0 makes an empty tensor (data may then be
 * NULL on save, and must not be dereferenced on read). */
typedef struct ddp_ckpt_tensor {
    const char *name; /* UTF-8, unique in a file, not "__metadata__" */
    ddp_ckpt_dtype dtype;
    int ndim;                         /* 0 … DDP_CKPT_MAX_DIMS */
    int64_t shape[DDP_CKPT_MAX_DIMS]; /* each ≥ 0; entries past ndim are ignored / zero */
    const void *data;                 /* row-major, little-endian, prod(shape) elements */
} ddp_ckpt_tensor;

/* Bytes per element (0 for an unknown value) and the format's name ("F32"; "?" if unknown). */
size_t ddp_ckpt_dtype_size(ddp_ckpt_dtype t);
const char *ddp_ckpt_dtype_name(ddp_ckpt_dtype t);

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

/* ---- reading ----------------------------------------------------------------------------------
 */

typedef struct ddp_ckpt ddp_ckpt; /* an open, validated checkpoint (memory-mapped) */

/* Opens and validates a whole file: header length, JSON, dtypes, shapes against offsets, offsets
 * packed and covering the data exactly, metadata string → string. *out is set only on DDP_OK.
 * Errors: DDP_ERR_NOT_FOUND (no such file), DDP_ERR_SYSTEM, DDP_ERR_NOMEM, DDP_ERR_INVALID (a
 * malformed or truncated file; the message names the file and the problem). Never crashes on
 * any file content. The file must not be truncated in place while open (checkpoints written by
 * ddp_ckpt_save are replaced by rename, which is safe). */
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

/* Removes the temporary files that saves killed mid-way left in dir: those named
 * "<prefix><step>.safetensors.tmp.<host>.<pid>" by ddp_ckpt_save on THIS host whose process no
 * longer exists. Another host's temporary files (a shared filesystem), a live writer's, and
 * anything else are left alone. *removed (may be NULL) receives the count. A missing dir is not
 * an error. */
ddp_status ddp_ckpt_clean_stale(const char *dir, const char *prefix, size_t *removed,
                                ddp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* DDP_CKPT_H */
