/*
 * tb_int.h — the encoders behind ddp/tb.h, internal (for tests/unit/test_tb.c): protobuf
 * varints, the Event messages, and TFRecord framing.
 */
#ifndef DDP_TB_INT_H
#define DDP_TB_INT_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of a record around its data: u64 length, u32 masked CRC of it, …, u32 masked CRC. */
#define DDP__TB_FRAME_BYTES 16

/* Writes v as a protobuf base-128 varint into out (at most 10 bytes) and returns its length.
 * An int64 field is encoded as its two's complement uint64: -1 takes 10 bytes. */
size_t ddp__tb_varint(unsigned char *out, uint64_t v);

/* Encodes an Event {wall_time, file_version} (the first record of a file) into out (cap bytes).
 * Returns the encoded size; nothing is written past cap, so call with cap 0 to learn the size. */
size_t ddp__tb_event_version(unsigned char *out, size_t cap, double wall_time, const char *version);

/* Encodes an Event {wall_time, step, session_log {status: START}}: TensorBoard forgets what
 * earlier files hold for steps ≥ step. Returns the encoded size, as above. */
size_t ddp__tb_event_session_start(unsigned char *out, size_t cap, double wall_time, int64_t step);

/* Encodes an Event {wall_time, step, summary {value {tag, simple_value}}}; tag is tag_len bytes.
 * Returns the encoded size, as above. */
size_t ddp__tb_event_scalar(unsigned char *out, size_t cap, double wall_time, int64_t step,
                            const char *tag, size_t tag_len, float value);

/* Frames n bytes of data as one TFRecord into out (n + DDP__TB_FRAME_BYTES bytes). */
void ddp__tb_frame(unsigned char *out, const void *data, size_t n);

#endif /* DDP_TB_INT_H */
