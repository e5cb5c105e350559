/*
 * store_wire.c — the frames, sockets and clock of store_wire.h, linked into test_store and
 * test_store_strangers. It writes the wire format out by hand on purpose; it knows nothing of a
 * reply beyond what the tests themselves read.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "store/store_int.h"
#include "store_wire.h"

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void put(frame *w, const void *p, size_t n)
{
    assert_true(w->len + n <= sizeof w->b);
    memcpy(w->b + w->len, p, n);
    w->len += n;
}

void put_u32(frame *w, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    put(w, x, 4);
}

void put_u8(frame *w, uint8_t v)
{
    put(w, &v, 1);
}

void put_blob(frame *w, const void *p, size_t n)
{
    put_u32(w, (uint32_t)n);
    put(w, p, n);
}

void frame_begin(frame *w, uint8_t op)
{
    w->len = 0;
    put_u32(w, 0);
    put_u8(w, op);
}

void frame_end(frame *w)
{
    uint32_t n = (uint32_t)(w->len - 4);
    unsigned char x[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 24)};
    memcpy(w->b, x, 4);
}

void hello_frame(frame *w, uint32_t magic, uint32_t version, const char *token)
{
    frame_begin(w, DDP__OP_HELLO);
    put_u32(w, magic);
    put_u32(w, version);
    put_blob(w, token, strlen(token));
    frame_end(w);
}

int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc;
    do
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    while (rc < 0 && errno == EINTR);
    if (rc != 0)
        fail_msg("connect to 127.0.0.1:%d: %s", port, strerror(errno));
    return fd;
}

bool raw_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}
