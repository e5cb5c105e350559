/*
 * proto.c — encoding and bounds-checked decoding of store frames (see store_int.h).
 * Little-endian on the wire regardless of host order.
 */
#include <stdlib.h>
#include <string.h>

#include "ddp/store.h"
#include "store/store_int.h"

void ddp__buf_reset(ddp__buf *b)
{
    b->len = 0;
    b->failed = false;
}

void ddp__buf_free(ddp__buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

void ddp__buf_put(ddp__buf *b, const void *data, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
}

void ddp__buf_u8(ddp__buf *b, uint8_t v)
{
    ddp__buf_put(b, &v, 1);
}

void ddp__buf_u32(ddp__buf *b, uint32_t v)
{
    unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    ddp__buf_put(b, x, 4);
}

void ddp__buf_i64(ddp__buf *b, int64_t v)
{
    uint64_t u = (uint64_t)v;
    unsigned char x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (unsigned char)(u >> (8 * i));
    ddp__buf_put(b, x, 8);
}

void ddp__buf_blob(ddp__buf *b, const void *data, size_t n)
{
    ddp__buf_u32(b, (uint32_t)n);
    ddp__buf_put(b, data, n);
}

void ddp__buf_frame_begin(ddp__buf *b)
{
    ddp__buf_reset(b);
    ddp__buf_u32(b, 0);
}

void ddp__buf_frame_end(ddp__buf *b)
{
    if (b->failed)
        return;
    uint32_t n = (uint32_t)(b->len - 4);
    unsigned char x[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 24)};
    memcpy(b->p, x, 4);
}

uint32_t ddp__le32(const void *p)
{
    const unsigned char *x = p;
    return (uint32_t)x[0] | (uint32_t)x[1] << 8 | (uint32_t)x[2] << 16 | (uint32_t)x[3] << 24;
}

bool ddp__rd_u8(ddp__rd *r, uint8_t *v)
{
    if (r->left < 1)
        return false;
    *v = (uint8_t)r->p[0];
    r->p++;
    r->left--;
    return true;
}

bool ddp__rd_u32(ddp__rd *r, uint32_t *v)
{
    if (r->left < 4)
        return false;
    *v = ddp__le32(r->p);
    r->p += 4;
    r->left -= 4;
    return true;
}

bool ddp__rd_i64(ddp__rd *r, int64_t *v)
{
    if (r->left < 8)
        return false;
    const unsigned char *x = (const unsigned char *)r->p;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u |= (uint64_t)x[i] << (8 * i);
    *v = (int64_t)u;
    r->p += 8;
    r->left -= 8;
    return true;
}

bool ddp__rd_blob(ddp__rd *r, const char **data, size_t *n)
{
    uint32_t len;
    if (!ddp__rd_u32(r, &len) || r->left < len)
        return false;
    *data = r->p;
    *n = len;
    r->p += len;
    r->left -= len;
    return true;
}
