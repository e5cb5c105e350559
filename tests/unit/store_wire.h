/*
 * store_wire.h — what test_store.c and test_store_strangers.c share (store_wire.c): a clock,
 * store frames built by hand from the wire format in store_int.h (not with the library's
 * encoder, so an encoder bug cannot hide a decoder bug), and raw loopback sockets.
 * Include after <cmocka.h>: put() and raw_connect() fail the running test on a bug (a frame over
 * its buffer, a refused connect); raw_send() never does, so threads may call it.
 */
#ifndef STORE_WIRE_H
#define STORE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in milliseconds. */
int64_t now_ms(void);

/* Sleeps ms milliseconds, resuming after signals. */
void sleep_ms(int ms);

typedef struct frame {
    unsigned char b[4096];
    size_t len;
} frame;

/* Appends raw bytes, a little-endian u32, a byte, or a u32 length then the bytes. */
void put(frame *w, const void *p, size_t n);
void put_u32(frame *w, uint32_t v);
void put_u8(frame *w, uint8_t v);
void put_blob(frame *w, const void *p, size_t n);

/* Starts a frame: a length to fill in by frame_end(), then the op. */
void frame_begin(frame *w, uint8_t op);
void frame_end(frame *w);

/* A whole HELLO frame: magic, version, token. */
void hello_frame(frame *w, uint32_t magic, uint32_t version, const char *token);

/* A blocking TCP connection to 127.0.0.1:port; the caller closes it. */
int raw_connect(int port);

/* Sends everything; false if the peer is gone (which a refused stranger may find). */
bool raw_send(int fd, const void *p, size_t n);

#endif
