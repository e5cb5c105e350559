/*
 * util.h — helpers every module may use: error formatting, monotonic time, integer parsing,
 * random tokens. Names are ddp__ (internal, not part of the public API).
 */
#ifndef DDP_UTIL_H
#define DDP_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>

#include "ddp/status.h"

/* Formats a message into buf (cap bytes, always NUL-terminated, truncated if needed). */
void ddp__vfmt(char *buf, size_t cap, const char *fmt, va_list ap) DDP_PRINTF(3, 0);
void ddp__fmt(char *buf, size_t cap, const char *fmt, ...) DDP_PRINTF(3, 4);

/* The library's name for ddp_error_set() (ddp/status.h): one implementation, the short name
 * kept so that its 200-odd callers read as before. */
#define ddp__err ddp_error_set

/* Formats a message into a handle's message buffer (the one its *_last_error() returns) and
 * returns st, so that `return ddp__errmsg(h->err, DDP_ERR_INVALID, "...")` records and fails in
 * one statement. */
ddp_status ddp__errmsg(char msg[static DDP_ERRMSG_MAX], ddp_status st, const char *fmt, ...)
    DDP_PRINTF(3, 4);

/* Reads the DDP_* settings (ddp/world.h's ddp_settings) from the environment into *s, which the
 * caller zeroes first: what ddp_world_from_env fills world.settings with, for library code that
 * has no world (the GPU module's loader, kernels/gpu.c). world.c: the one reader of the
 * environment. */
struct ddp_settings;
ddp_status ddp__settings_from_env(struct ddp_settings *s, ddp_error *err);

/* Milliseconds / nanoseconds on CLOCK_MONOTONIC. */
int64_t ddp__now_ms(void);
int64_t ddp__now_ns(void);

/* Milliseconds left until deadline_ms (≥ 0; INT32_MAX-capped), for poll(). */
int ddp__ms_left(int64_t deadline_ms);

/* Parses a whole decimal integer in [lo, hi]; false on any junk, overflow or range error. */
bool ddp__parse_int(const char *s, long long lo, long long hi, long long *out);

/* Fills buf with n random bytes from the kernel (getrandom). */
ddp_status ddp__random_bytes(void *buf, size_t n, ddp_error *err);

/* Writes 2*n lowercase hex digits of n random bytes and a NUL into out (2*n+1 bytes). */
ddp_status ddp__random_hex(char *out, size_t n, ddp_error *err);

/* fsyncs the directory holding path, so that a rename into it survives a crash (the checkpoint
 * writer's and ddp_file_write_atomic's last step). A file system that cannot fsync a directory
 * (EINVAL) is accepted: there is nothing more to do there. what names the file in the message
 * ("checkpoint", "file"): "<what> '<path>' was renamed into place but …". */
ddp_status ddp__fsync_parent(const char *path, const char *what, ddp_error *err);

/* Human-readable duration: "250 ms", "30 s", "5 min". */
void ddp__fmt_duration(char *buf, size_t cap, int64_t ms);

#endif /* DDP_UTIL_H */
