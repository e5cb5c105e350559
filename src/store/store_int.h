/*
 * store_int.h — the store's wire protocol, private to src/store.
 *
 * Every message is a frame: u32 length (little-endian, bytes that follow), then a body.
 * Request body: u8 op, then fields. Reply body: u8 code (0 = ok), then fields; an error reply's
 * only field is a one-line message. Fields: blob = u32 length + bytes; i64 = 8 bytes LE; u8.
 *   HELLO    u32 magic, u32 version, blob token        -> i64 max value | auth error (closed)
 *   SET      blob key, blob value                      -> ok
 *   GET      blob key                                  -> blob value   (parks until key exists)
 *   ADD      blob key, i64 delta                       -> i64 new value
 *   CAS      blob key, blob expected, blob desired     -> blob current, u8 exists
 *   CHECK    u32 n, n × blob key                       -> u8 all exist
 *   WAIT     u32 n, n × blob key                       -> ok           (parks until all exist)
 *   DELETE   blob key                                  -> u8 existed
 *   NUM_KEYS                                           -> i64 count
 *   ON_CLOSE blob key, blob value [, u8 if_absent]     -> ok  (when this connection closes
 *            before the server stops, the server sets key = value — only if key is absent
 *            then, with if_absent 1; an empty key cancels)
 *   ABORT_ON blob key                                  -> ok  (from now on a GET or WAIT on
 *            this connection that would wait, or waits, ends with an ABORTED reply carrying
 *            key's value once key exists: a failure another client announced; empty clears)
 * The first request on a connection must be HELLO. One request is served at a time per
 * connection; the client waits for each reply, so a parked GET holds only its own connection.
 */
#ifndef DDP_STORE_INT_H
#define DDP_STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ddp/status.h"

#define DDP__STORE_MAGIC 0x53504444u /* "DDPS" */
#define DDP__STORE_VERSION 1u
/* Room for a frame's fields beyond its largest value (key, op, lengths). */
#define DDP__STORE_FRAME_SLACK (2 * DDP_STORE_MAX_KEY + 64)
/* A WAIT/CHECK may name at most this many keys. */
#define DDP__STORE_MAX_KEYS 65536

enum ddp__store_op {
    DDP__OP_HELLO = 1,
    DDP__OP_SET,
    DDP__OP_GET,
    DDP__OP_ADD,
    DDP__OP_CAS,
    DDP__OP_CHECK,
    DDP__OP_WAIT,
    DDP__OP_DELETE,
    DDP__OP_NUM_KEYS,
    DDP__OP_ON_CLOSE,
    DDP__OP_ABORT_ON,
};

enum ddp__store_code {
    DDP__R_OK = 0,
    DDP__R_AUTH = 1,      /* wrong token: the server closes the connection */
    DDP__R_INVALID = 2,   /* a bad key or a non-integer counter */
    DDP__R_TOO_LARGE = 3, /* over a size limit */
    DDP__R_PROTOCOL = 4,  /* malformed: the server closes the connection */
    DDP__R_ABORTED = 5,   /* a GET/WAIT ended by the connection's ABORT_ON key: its value */
};

/* A growable byte buffer for building frames. */
typedef struct ddp__buf {
    char *p;
    size_t len, cap;
    bool failed; /* an allocation failed; the contents are incomplete */
} ddp__buf;

void ddp__buf_reset(ddp__buf *b);
void ddp__buf_free(ddp__buf *b);
void ddp__buf_put(ddp__buf *b, const void *data, size_t n);
void ddp__buf_u8(ddp__buf *b, uint8_t v);
void ddp__buf_u32(ddp__buf *b, uint32_t v);
void ddp__buf_i64(ddp__buf *b, int64_t v);
void ddp__buf_blob(ddp__buf *b, const void *data, size_t n);
/* Starts a frame (reserves the length) / finishes it (writes the length). */
void ddp__buf_frame_begin(ddp__buf *b);
void ddp__buf_frame_end(ddp__buf *b);

/* A cursor over a received body; every read checks bounds and returns false when short. */
typedef struct ddp__rd {
    const char *p;
    size_t left;
} ddp__rd;

bool ddp__rd_u8(ddp__rd *r, uint8_t *v);
bool ddp__rd_u32(ddp__rd *r, uint32_t *v);
bool ddp__rd_i64(ddp__rd *r, int64_t *v);
/* Points *data into the body (no copy). */
bool ddp__rd_blob(ddp__rd *r, const char **data, size_t *n);

uint32_t ddp__le32(const void *p);

/* Authenticated client connections the server has open now (any thread may ask). */
struct ddp_store_server;
int ddp__store_server_clients(const struct ddp_store_server *srv);

/* When (ddp__now_ms) a client of the server last connected, sent bytes or hung up. */
int64_t ddp__store_server_active_ms(const struct ddp_store_server *srv);

/* How long a hosting handle's close waits for the other clients to leave: while any is open, at
 * most LINGER (and the handle's timeout), and no longer once they have all been silent for QUIET
 * (a host that vanished never hangs up; live ranks reading final keys are not silent). */
#define DDP__STORE_CLOSE_LINGER_MS 30000
#define DDP__STORE_CLOSE_QUIET_MS 2000

#endif /* DDP_STORE_INT_H */
