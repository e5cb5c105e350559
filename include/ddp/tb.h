/*
 * ddp/tb.h — TensorBoard event files: scalars (loss, learning rate, throughput, …) that
 * `tensorboard --logdir DIR` plots, written without TensorFlow, protobuf or Python.
 *
 * A writer creates one file in its directory, named as TensorFlow and PyTorch name theirs,
 *   events.out.tfevents.<unix time, 10 digits>.<hostname>.<pid>.<n><suffix>
 * (n: the first number that makes the name new, so two writers of one process into one
 * directory never share a file), and appends records to it:
 *   - the file is a sequence of TFRecords: u64 length (little-endian), u32 masked CRC-32C of
 *     those 8 bytes, the data, u32 masked CRC-32C of the data (mask: ((crc >> 15) |
 *     (crc << 17)) + 0xa282ead8);
 *   - each record's data is a tensorflow.Event protobuf. The first holds wall_time and
 *     file_version "brain.Event:2" (then, for a resumed run, a SessionLog START: see
 *     purge_step); each scalar is an Event {wall_time, step, summary {value {tag,
 *     simple_value}}}, which TensorBoard shows under Scalars with its tag as the chart's name
 *     ("train/loss": chart "loss" in section "train").
 * Records are buffered in memory and written whole, so a reader never sees half a record of a
 * live run, and a failed write (a full disk, a file-size limit) is cut back to the last whole
 * record: the file stays readable up to there.
 *
 * What a trainer logs (rank 0 only, into out_dir/tb/): train/loss, train/lr, and per log
 * interval train/samples_per_s or train/tokens_per_s, train/mfu, train/grad_norm (before
 * clipping), train/loss_scale (fp16); at each evaluation val/loss and val/accuracy; the step is
 * the optimizer step, the same as in metrics.jsonl.
 *
 * Threads: a writer is used from one thread at a time.
 */
#ifndef DDP_TB_H
#define DDP_TB_H

#include <stdint.h>

#include "ddp/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_tb ddp_tb;

#define DDP_TB_MAX_TAG 1024 /* bytes in a tag */

typedef struct ddp_tb_opts {
    const char *suffix; /* appended to the file name, as SummaryWriter's filename_suffix; NULL
                         * or "": none. No '/'. */
    int flush_ms;       /* a record waits in memory at most this long before it is written
                         * (checked on the next call); 0 writes every record at once */
    int64_t purge_step; /* -1: a new run. ≥ 0: a resumed run's first step (a checkpoint's step
                         * + 1): the file starts with a SessionLog START at purge_step, and
                         * TensorBoard drops what earlier files of the directory hold for steps
                         * ≥ purge_step (logged after the checkpoint by the run that died), as
                         * torch's SummaryWriter(purge_step=) does */
} ddp_tb_opts;

#define DDP_TB_OPTS_INIT                                                                           \
    {                                                                                              \
        NULL, 10000, -1                                                                            \
    }

/* Creates dir (and its missing parents, as mkdir -p) and a new event file in it, and writes
 * the file_version record. opts may be NULL (the defaults). *out written only on DDP_OK; err
 * may be NULL. Errors: DDP_ERR_INVALID (bad options), DDP_ERR_SYSTEM (a directory or the file
 * cannot be created or written: the message names it and the reason), DDP_ERR_NOMEM. */
ddp_status ddp_tb_open(const char *dir, const ddp_tb_opts *opts, ddp_tb **out, ddp_error *err);

/* Records value under tag at step. wall_time: seconds since the Unix epoch (TensorBoard's
 * "relative" and "wall" axes); ≤ 0 means now. The value is stored as float32, TensorBoard's
 * simple_value: NaN and infinities are kept. The tag is borrowed for the call: 1 to
 * DDP_TB_MAX_TAG bytes of UTF-8 (DDP_ERR_INVALID otherwise, nothing recorded). A write that
 * fails (the record was buffered, then flushed) returns DDP_ERR_SYSTEM: the records in the
 * buffer are dropped and counted in the message, the file is cut back to its last whole record,
 * and later calls try again. */
ddp_status ddp_tb_scalar(ddp_tb *tb, const char *tag, int64_t step, double value, double wall_time);

/* Writes the buffered records to the file (no fsync). Errors as for ddp_tb_scalar. */
ddp_status ddp_tb_flush(ddp_tb *tb);

/* Flushes and closes the file and frees tb. NULL is a no-op. To learn whether the last records
 * reached the file, call ddp_tb_flush first. */
void ddp_tb_close(ddp_tb *tb);

/* The event file's path, owned by tb. */
const char *ddp_tb_path(const ddp_tb *tb);

/* The message of the last failed call on tb, one line; "" if none. Owned by tb. */
const char *ddp_tb_last_error(const ddp_tb *tb);

#ifdef __cplusplus
}
#endif
#endif /* DDP_TB_H */
